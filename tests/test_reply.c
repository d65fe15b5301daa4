/*
 * test_reply.c - unit tests of engine/reply.c: reply formatting (RFC 5321 §4.2 multi-line
 * replies, §4.5.3.1.5 512-octet reply lines), enhanced status codes (RFC 2034, RFC 3463 §2) and
 * host reply text checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reply.h"

/* Formats into a buffer of exactly cap octets followed by guard octets. */
static size_t fmt(char *dst, size_t cap, unsigned code, const char *enh, const char *text)
{
    uint8_t *buf = malloc(cap + 16);
    assert_non_null(buf);
    memset(buf, 0xee, cap + 16);
    size_t n = smtpe__reply_format(buf, cap, code, enh, text, strlen(text));
    assert_true(n <= cap);
    for (size_t i = cap; i < cap + 16; i++)
        if (buf[i] != 0xee)
            fail_msg("smtpe__reply_format wrote past cap");
    memcpy(dst, buf, n);
    dst[n] = 0;
    free(buf);
    return n;
}

static void expect_format(unsigned code, const char *enh, const char *text, const char *want)
{
    char out[8192];
    size_t n = fmt(out, 4096, code, enh, text);
    if (n != strlen(want) || strcmp(out, want) != 0)
        fail_msg("smtpe__reply_format(%u, %s, \"%s\") gave \"%s\", expected \"%s\"", code,
                 enh ? enh : "NULL", text, out, want);
}

static void test_single_line(void **state)
{
    (void)state;
    expect_format(250, "2.1.0", "Ok", "250 2.1.0 Ok\r\n");
    expect_format(250, NULL, "Ok", "250 Ok\r\n");
    expect_format(550, "5.1.1", "No such user", "550 5.1.1 No such user\r\n");
    expect_format(354, NULL, "End data with <CR><LF>.<CR><LF>",
                  "354 End data with <CR><LF>.<CR><LF>\r\n");
    expect_format(221, "2.0.0", "Bye", "221 2.0.0 Bye\r\n");
    expect_format(421, "4.4.2", "mx.example Timeout exceeded",
                  "421 4.4.2 mx.example Timeout exceeded\r\n");
}

/* "code-" on every line but the last, the enhanced code on each line (RFC 2034 §4). */
static void test_multi_line(void **state)
{
    (void)state;
    expect_format(550, "5.1.1", "a\nb", "550-5.1.1 a\r\n550 5.1.1 b\r\n");
    expect_format(550, NULL, "a\nb", "550-a\r\n550 b\r\n");
    expect_format(250, NULL, "mx.example\nPIPELINING\nSIZE 10485760\n8BITMIME",
                  "250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250 8BITMIME\r\n");
    expect_format(452, "4.5.3", "one\ntwo\nthree",
                  "452-4.5.3 one\r\n452-4.5.3 two\r\n452 4.5.3 three\r\n");
}

/* The output must fit cap exactly; one octet less gives 0. */
static void test_cap(void **state)
{
    (void)state;
    char out[64];
    const char *want = "550-5.1.1 a\r\n550 5.1.1 b\r\n";
    size_t n = strlen(want);
    assert_int_equal(fmt(out, n, 550, "5.1.1", "a\nb"), n);
    assert_string_equal(out, want);
    assert_int_equal(fmt(out, n - 1, 550, "5.1.1", "a\nb"), 0);
    assert_int_equal(fmt(out, 13, 250, "2.1.0", "Ok"), 0);
    assert_int_equal(fmt(out, 14, 250, "2.1.0", "Ok"), 14);
    assert_int_equal(fmt(out, 0, 250, "2.1.0", "Ok"), 0);
    assert_int_equal(fmt(out, 3, 250, NULL, "Ok"), 0);
}

/* RFC 5321 §4.5.3.1.5: a reply line is at most 512 octets, code and CRLF included. */
static void test_line_limit(void **state)
{
    (void)state;
    static char text[1200], out[4096];
    /* "250 " + 506 + CRLF = 512 */
    memset(text, 'x', 506);
    text[506] = 0;
    assert_int_equal(fmt(out, 4096, 250, NULL, text), 512);
    text[506] = 'x';
    text[507] = 0;
    assert_int_equal(fmt(out, 4096, 250, NULL, text), 0);
    /* "250 2.1.0 " + 500 + CRLF = 512 */
    memset(text, 'y', 500);
    text[500] = 0;
    assert_int_equal(fmt(out, 4096, 250, "2.1.0", text), 512);
    text[500] = 'y';
    text[501] = 0;
    assert_int_equal(fmt(out, 4096, 250, "2.1.0", text), 0);
    /* one long line among short ones fails the whole reply */
    memset(text, 'z', 600);
    memcpy(text, "a\n", 2);
    memcpy(text + 590, "\nb", 2);
    text[600] = 0;
    assert_int_equal(fmt(out, 4096, 550, "5.0.0", text), 0);
    /* many lines each within the limit are fine */
    text[0] = 0;
    for (int i = 0; i < 5; i++) {
        if (i)
            strcat(text, "\n");
        size_t l = strlen(text);
        memset(text + l, 'w', 200);
        text[l + 200] = 0;
    }
    size_t n = fmt(out, 4096, 550, "5.7.1", text);
    assert_int_equal(n, 5 * (4 + 6 + 200 + 2));
}

static void test_enhanced_valid(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        unsigned code;
        int want;
    } cases[] = {
        {"2.1.0", 250, 1},   {"2.0.0", 221, 1},     {"5.1.1", 550, 1},   {"4.7.0", 421, 1},
        {"4.4.2", 421, 1},   {"2.123.456", 250, 1}, {"5.5.4", 501, 1},   {"2.0.0", 299, 1},
        {"5.1.1", 250, 0},   {"2.1.0", 550, 0},     {"4.0.0", 550, 0},   {"5.0.0", 451, 0},
        {"3.0.0", 354, 0},   {"1.0.0", 100, 0},     {"6.0.0", 600, 0},   {"2.1000.0", 250, 0},
        {"2.1.1000", 250, 0}, {"2.1.0.0", 250, 0},  {"2..0", 250, 0},    {"2.1.", 250, 0},
        {".1.0", 250, 0},    {"2.1", 250, 0},       {"2", 250, 0},       {"", 250, 0},
        {"x.1.1", 250, 0},   {"2.x.1", 250, 0},     {"2.1.0 ", 250, 0},  {" 2.1.0", 250, 0},
        {"22.1.0", 250, 0},  {"2.-1.0", 250, 0},    {"2.1.0\n", 250, 0}, {"2,1,0", 250, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (smtpe__enhanced_valid(cases[i].s, cases[i].code) != cases[i].want)
            fail_msg("smtpe__enhanced_valid(\"%s\", %u) != %d", cases[i].s, cases[i].code,
                     cases[i].want);
}

static int text_valid(const char *s) { return smtpe__reply_text_check(s, strlen(s)) == 0; }

static void test_reply_text_valid(void **state)
{
    (void)state;
    assert_int_equal(text_valid("Ok"), 1);
    assert_int_equal(text_valid("No such user here"), 1);
    assert_int_equal(text_valid("first\nsecond"), 1);
    assert_int_equal(text_valid("<a@example.org>... Recipient ok; [x] {y} ~!"), 1);
    assert_int_equal(text_valid("a\rb"), 0);
    assert_int_equal(text_valid("a\r\nb"), 0);
    assert_int_equal(text_valid("a\tb"), 1); /* RFC 5321 §4.2 textstring allows HT */
    assert_int_equal(text_valid("a\x01" "b"), 0);
    assert_int_equal(text_valid("a\x1b" "b"), 0);
    assert_int_equal(text_valid("a\x7f" "b"), 0);
    assert_int_equal(smtpe__reply_text_check("a\0b", 3) == 0, 0);

    /* at most 32 lines */
    static char lines[80];
    memset(lines, '\n', 31);
    lines[31] = 0;
    assert_int_equal(text_valid(lines), 1);
    lines[31] = '\n';
    lines[32] = 0;
    assert_int_equal(text_valid(lines), 0);
    assert_int_equal(smtpe__reply_text_check(lines, 32), 2);
    assert_int_equal(smtpe__reply_text_check("a\x01", 2), 1);

    /* each line at most 400 octets */
    static char t[4000];
    memset(t, 'x', 400);
    t[400] = 0;
    assert_int_equal(text_valid(t), 1);
    t[400] = 'x';
    t[401] = 0;
    assert_int_equal(text_valid(t), 0);
    /* 401 octets in the second line */
    memset(t, 'x', 402);
    t[0] = 'a';
    t[1] = '\n';
    t[403] = 0;
    t[402] = 'x';
    assert_int_equal(strlen(t), 403);
    assert_int_equal(text_valid(t), 0);

    /* all text at most 2048: 5 lines of 400 + 4 '\n' + 44 = 2048 in all */
    t[0] = 0;
    for (int i = 0; i < 5; i++) {
        size_t l = strlen(t);
        memset(t + l, 'y', 400);
        t[l + 400] = '\n';
        t[l + 401] = 0;
    }
    size_t l = strlen(t);
    memset(t + l, 'z', 2048 - l);
    t[2048] = 0;
    assert_int_equal(strlen(t), 2048);
    assert_int_equal(text_valid(t), 1);
    /* lines alone adding up to 2049 (2054 with the '\n's) */
    t[0] = 0;
    for (int i = 0; i < 5; i++) {
        size_t k = strlen(t);
        memset(t + k, 'y', 400);
        t[k + 400] = '\n';
        t[k + 401] = 0;
    }
    l = strlen(t);
    memset(t + l, 'z', 49);
    t[l + 49] = 0;
    assert_int_equal(text_valid(t), 0);
    /* far too long */
    memset(t, 'q', 3000);
    for (int i = 100; i < 3000; i += 100)
        t[i] = '\n';
    t[3000] = 0;
    assert_int_equal(text_valid(t), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_line),
        cmocka_unit_test(test_multi_line),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_line_limit),
        cmocka_unit_test(test_enhanced_valid),
        cmocka_unit_test(test_reply_text_valid),
    };
    return cmocka_run_group_tests_name("reply", tests, NULL, NULL);
}
