/*
 * test_reply.c - unit tests of engine/reply.c: reply formatting (RFC 5321 §4.2 multi-line
 * replies, §4.5.3.1.5 512-octet reply lines), enhanced status codes (RFC 2034, RFC 3463 §2),
 * host reply text checks, and the client's strict reply parser (smtpe__reply_feed and its
 * helpers), each parser case fed whole, one octet at a time and in pseudo-random splits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
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

/* ---- the strict reply parser (client side), RFC 5321 §4.2, §4.5.3.1.5 ---------------------- */

static const char *rp_name(int r)
{
    switch (r) {
    case SMTPE__RP_MORE: return "MORE";
    case SMTPE__RP_LINE: return "LINE";
    case SMTPE__RP_DONE: return "DONE";
    case SMTPE__RP_SYNTAX: return "SYNTAX";
    case SMTPE__RP_MISMATCH: return "MISMATCH";
    case SMTPE__RP_LONG_LINE: return "LONG_LINE";
    case SMTPE__RP_TOO_BIG: return "TOO_BIG";
    case SMTPE__RP_BARE: return "BARE";
    default: return "?";
    }
}

/* Feeds in[0..n) to a parser of cap and max_total in pieces chosen by sp (each copied to a heap
 * block of exactly its size, so that ASan sees a read past it; buf is exactly cap octets) and
 * logs every result: "LINE@OFF[line] ", "DONE@OFF[line] " (OFF: octets consumed so far, line
 * escaped), and at the end "MORE/LEN" (octets of the unfinished line, after one more call with
 * no input) or the error "NAME@OFF". After each DONE, restart says whether the driver calls
 * smtpe__reply_parser_start (else the next feed must start the reply itself). Checks on the way:
 * *used within the piece, MORE only with the piece consumed, len <= cap, code, lines and total
 * agree with the lines handed out, and an error sticks. */
static void rp_log(hs_buf *log, size_t cap, size_t max_total, const uint8_t *in, size_t n,
                   hs_splitter *sp, int restart)
{
    uint8_t *buf = cap ? malloc(cap) : NULL;
    smtpe__reply_parser p = {.buf = buf, .cap = cap, .max_total = max_total};
    smtpe__reply_parser_start(&p);
    size_t off = 0, total = 0;
    unsigned lines = 0;
    int r = SMTPE__RP_MORE;
    while (off < n && r >= 0) {
        size_t k = hs_splitter_next(sp, n - off), at = 0;
        uint8_t *piece = malloc(k);
        assert_non_null(piece);
        memcpy(piece, in + off, k);
        while (at < k) {
            size_t used = SIZE_MAX;
            r = smtpe__reply_feed(&p, piece + at, k - at, &used);
            assert_true(used <= k - at);
            at += used;
            assert_true(p.len <= cap);
            if (r < 0) {
                hs_buf_addf(log, "%s@%zu", rp_name(r), off + at);
                assert_true(used > 0);
                assert_int_equal(smtpe__reply_feed(&p, piece, k, &used), r); /* it sticks */
                assert_int_equal(used, 0);
                break;
            }
            if (r == SMTPE__RP_MORE) {
                assert_int_equal(at, k);
                continue;
            }
            assert_true(r == SMTPE__RP_LINE || r == SMTPE__RP_DONE);
            assert_true(p.len >= 3);
            hs_buf_addf(log, "%s@%zu[", rp_name(r), off + at);
            hs_escape(log, p.buf, p.len);
            hs_buf_adds(log, "] ");
            assert_int_equal(p.code, (p.buf[0] - '0') * 100 + (p.buf[1] - '0') * 10 +
                                         (p.buf[2] - '0'));
            assert_int_equal(p.lines, ++lines);
            total += p.len + 2;
            assert_int_equal(p.total, total);
            if (r == SMTPE__RP_DONE) {
                lines = 0;
                total = 0;
                if (restart)
                    smtpe__reply_parser_start(&p);
            }
        }
        free(piece);
        off += k;
    }
    if (r >= 0) {
        size_t used = SIZE_MAX;
        assert_int_equal(smtpe__reply_feed(&p, NULL, 0, &used), SMTPE__RP_MORE);
        assert_int_equal(used, 0);
        hs_buf_addf(log, "MORE/%zu", p.len);
    }
    free(buf);
}

/* Parses in[0..n) whole, one octet at a time and in 8 pseudo-random splits, restarting after
 * DONE by call and by the next feed, and fails unless every log is want. */
static void expect_parse_n(size_t cap, size_t max_total, const void *in, size_t n,
                           const char *want)
{
    for (int mode = HS_WHOLE; mode <= HS_RANDOM; mode++) {
        for (uint64_t seed = 1; seed <= (mode == HS_RANDOM ? 8u : 1u); seed++) {
            hs_splitter sp;
            hs_splitter_init(&sp, mode, seed);
            hs_buf log = {0}, esc = {0};
            rp_log(&log, cap, max_total, in, n, &sp, (int)(seed % 2));
            if (strcmp(hs_buf_cstr(&log), want) != 0) {
                hs_escape(&esc, in, n < 200 ? n : 200);
                fail_msg("cap %zu max_total %zu, \"%s\" fed %s (seed %u):\n  got:      %s\n"
                         "  expected: %s",
                         cap, max_total, hs_buf_cstr(&esc), hs_mode_name(mode), (unsigned)seed,
                         hs_buf_cstr(&log), want);
            }
            hs_buf_free(&log);
            hs_buf_free(&esc);
        }
    }
}

/* A string literal (NULs included) under the limits of RFC 5321 §4.5.3.1.5 and a large total. */
#define EXPECT_PARSE(lit, want) expect_parse_n(510, 65536, lit, sizeof(lit) - 1, want)
#define EXPECT_PARSE_AT(cap, total, lit, want)                                                 \
    expect_parse_n(cap, total, lit, sizeof(lit) - 1, want)

static void test_parse_single_line(void **state)
{
    (void)state;
    EXPECT_PARSE("250 OK\r\n", "DONE@8[250 OK] MORE/0");
    EXPECT_PARSE("220 mx.example ESMTP ready\r\n", "DONE@28[220 mx.example ESMTP ready] MORE/0");
    /* a code-only line is a complete last line; "ddd " with no text is accepted too */
    EXPECT_PARSE("250\r\n", "DONE@5[250] MORE/0");
    EXPECT_PARSE("250 \r\n", "DONE@6[250 ] MORE/0");
    EXPECT_PARSE("354 Go ahead\r\n", "DONE@14[354 Go ahead] MORE/0");
    /* unfinished lines: MORE with what is in the buffer (never the CR) */
    EXPECT_PARSE("", "MORE/0");
    EXPECT_PARSE("2", "MORE/1");
    EXPECT_PARSE("250", "MORE/3");
    EXPECT_PARSE("250 OK", "MORE/6");
    EXPECT_PARSE("250 OK\r", "MORE/6");
    EXPECT_PARSE("250\r", "MORE/3");
}

static void test_parse_multi_line(void **state)
{
    (void)state;
    EXPECT_PARSE("250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250 8BITMIME\r\n",
                 "LINE@16[250-mx.example] LINE@32[250-PIPELINING] LINE@51[250-SIZE 10485760] "
                 "DONE@65[250 8BITMIME] MORE/0");
    /* "ddd-" with no text, and a code-only last line */
    EXPECT_PARSE("250-\r\n250-x\r\n250\r\n", "LINE@6[250-] LINE@13[250-x] DONE@18[250] MORE/0");
    /* several replies in one input, each with its own code */
    EXPECT_PARSE("250 a\r\n550-b\r\n550 c\r\n221 bye\r\n",
                 "DONE@7[250 a] LINE@14[550-b] DONE@21[550 c] DONE@30[221 bye] MORE/0");
    /* the next reply's first octets are not consumed with the DONE */
    EXPECT_PARSE("250 a\r\n55", "DONE@7[250 a] MORE/2");
    EXPECT_PARSE("250-a\r\n250", "LINE@7[250-a] MORE/3");
}

static void test_parse_codes(void **state)
{
    (void)state;
    /* first digit 2-5, second 0-5, third 0-9 (RFC 5321 §4.2): the first bad one is SYNTAX */
    EXPECT_PARSE("200 a\r\n", "DONE@7[200 a] MORE/0");
    EXPECT_PARSE("559 a\r\n", "DONE@7[559 a] MORE/0");
    EXPECT_PARSE("599 a\r\n", "SYNTAX@2");
    EXPECT_PARSE("209\r\n", "DONE@5[209] MORE/0");
    EXPECT_PARSE("100 a\r\n", "SYNTAX@1");
    EXPECT_PARSE("199 a\r\n", "SYNTAX@1");
    EXPECT_PARSE("600 a\r\n", "SYNTAX@1");
    EXPECT_PARSE("000 a\r\n", "SYNTAX@1");
    EXPECT_PARSE("900 a\r\n", "SYNTAX@1");
    EXPECT_PARSE("260 a\r\n", "SYNTAX@2");
    EXPECT_PARSE("290 a\r\n", "SYNTAX@2");
    EXPECT_PARSE("560 a\r\n", "SYNTAX@2");
    EXPECT_PARSE("2x0 a\r\n", "SYNTAX@2");
    EXPECT_PARSE("25x a\r\n", "SYNTAX@3");
    EXPECT_PARSE("25: a\r\n", "SYNTAX@3");
    EXPECT_PARSE("25/ a\r\n", "SYNTAX@3");
    EXPECT_PARSE("a50 a\r\n", "SYNTAX@1");
    EXPECT_PARSE(" 250 a\r\n", "SYNTAX@1");
    EXPECT_PARSE("-250 a\r\n", "SYNTAX@1");
    /* after the digits: only SP, '-' or CRLF */
    EXPECT_PARSE("2500 a\r\n", "SYNTAX@4");
    EXPECT_PARSE("250x\r\n", "SYNTAX@4");
    EXPECT_PARSE("250\tOK\r\n", "SYNTAX@4");
    EXPECT_PARSE("250_OK\r\n", "SYNTAX@4");
    EXPECT_PARSE("250-a\r\n250x\r\n", "LINE@7[250-a] SYNTAX@11");
    /* a line shorter than the code */
    EXPECT_PARSE("25\r\n", "SYNTAX@3");
    EXPECT_PARSE("2\r\n", "SYNTAX@2");
    EXPECT_PARSE("\r\n", "SYNTAX@1");
    EXPECT_PARSE("250-a\r\n\r\n", "LINE@7[250-a] SYNTAX@8");
    EXPECT_PARSE("250 a\r\n\r\n", "DONE@7[250 a] SYNTAX@8");
}

/* RFC 5321 §4.2: "the same reply code" on every line of a multiline reply. */
static void test_parse_mismatch(void **state)
{
    (void)state;
    EXPECT_PARSE("250-a\r\n251 b\r\n", "LINE@7[250-a] MISMATCH@10");
    EXPECT_PARSE("250-a\r\n240 b\r\n", "LINE@7[250-a] MISMATCH@9");
    EXPECT_PARSE("250-a\r\n550 b\r\n", "LINE@7[250-a] MISMATCH@8");
    EXPECT_PARSE("250-a\r\n250-b\r\n450 c\r\n", "LINE@7[250-a] LINE@14[250-b] MISMATCH@15");
    /* a digit out of range is SYNTAX even where it also differs */
    EXPECT_PARSE("250-a\r\n260 b\r\n", "LINE@7[250-a] SYNTAX@9");
    EXPECT_PARSE("250-a\r\n150 b\r\n", "LINE@7[250-a] SYNTAX@8");
    /* a new reply may have another code */
    EXPECT_PARSE("250 a\r\n251 b\r\n", "DONE@7[250 a] DONE@14[251 b] MORE/0");
}

/* Only CRLF ends a line (RFC 5321 §2.3.8); anything else with CR or LF is BARE. */
static void test_parse_bare(void **state)
{
    (void)state;
    EXPECT_PARSE("250 a\nb", "BARE@6");
    EXPECT_PARSE("250 a\n", "BARE@6");
    EXPECT_PARSE("250 a\rb\r\n", "BARE@7");
    EXPECT_PARSE("250 a\r\r\n", "BARE@7");
    EXPECT_PARSE("250 a\r \r\n", "BARE@7");
    EXPECT_PARSE("250\n", "BARE@4");
    EXPECT_PARSE("250-\n", "BARE@5");
    EXPECT_PARSE("\n", "BARE@1");
    EXPECT_PARSE("25\n", "BARE@3");
    EXPECT_PARSE("250-a\r\n250 b\n", "LINE@7[250-a] BARE@13");
    EXPECT_PARSE("250 a\r\n\n", "DONE@7[250 a] BARE@8");
    EXPECT_PARSE("250 a\n\r\n", "BARE@6");
}

/* A NUL anywhere is SYNTAX; every other octet may be text (HT, controls, 8-bit, SMTPUTF8). */
static void test_parse_octets(void **state)
{
    (void)state;
    EXPECT_PARSE("250 a\0b\r\n", "SYNTAX@6");
    EXPECT_PARSE("\0", "SYNTAX@1");
    EXPECT_PARSE("25\0", "SYNTAX@3");
    EXPECT_PARSE("250\0", "SYNTAX@4");
    EXPECT_PARSE("250 \0", "SYNTAX@5");
    EXPECT_PARSE("250-a\r\n250-\0\r\n", "LINE@7[250-a] SYNTAX@12");
    EXPECT_PARSE("250 a\r\0\n", "BARE@7"); /* after a CR, anything but LF is BARE first */
    EXPECT_PARSE("250 a\tb\r\n", "DONE@9[250 a\\tb] MORE/0");
    EXPECT_PARSE("250 \xc3\xa9t\xc3\xa9\r\n", "DONE@11[250 \\xc3\\xa9t\\xc3\\xa9] MORE/0");
    EXPECT_PARSE("250 \x01\x1b\x7f\xff\r\n", "DONE@10[250 \\x01\\x1b\\x7f\\xff] MORE/0");
    EXPECT_PARSE("250  - \r\n", "DONE@9[250  - ] MORE/0");
}

/* Builds "250-" ... lines: code, sep, then tlen octets of fill, then CRLF if crlf. */
static void add_line(hs_buf *b, const char *code, char sep, size_t tlen, int crlf)
{
    hs_buf_adds(b, code);
    hs_buf_add(b, &sep, 1);
    for (size_t i = 0; i < tlen; i++)
        hs_buf_add(b, "x", 1);
    if (crlf)
        hs_buf_adds(b, "\r\n");
}

/* cap: the longest line without CRLF; the cap+1-th octet is LONG_LINE at once, CRLF or not. */
static void test_parse_line_cap(void **state)
{
    (void)state;
    static const size_t caps[] = {5, 6, 510, 2046};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        size_t cap = caps[c];
        hs_buf in = {0}, want = {0};
        /* exactly cap: fits, as the last line and as another */
        add_line(&in, "250", '-', cap - 4, 1);
        add_line(&in, "250", ' ', cap - 4, 1);
        hs_buf_addf(&want, "LINE@%zu[250-", cap + 2);
        for (size_t i = 0; i < cap - 4; i++)
            hs_buf_add(&want, "x", 1);
        hs_buf_addf(&want, "] DONE@%zu[250 ", 2 * (cap + 2));
        for (size_t i = 0; i < cap - 4; i++)
            hs_buf_add(&want, "x", 1);
        hs_buf_adds(&want, "] MORE/0");
        expect_parse_n(cap, 65536, in.p, in.len, hs_buf_cstr(&want));

        /* cap + 1 on the first line, on the second, and an endless line */
        hs_buf_reset(&in);
        hs_buf_reset(&want);
        add_line(&in, "250", ' ', cap - 3, 1);
        hs_buf_addf(&want, "LONG_LINE@%zu", cap + 1);
        expect_parse_n(cap, 65536, in.p, in.len, hs_buf_cstr(&want));
        hs_buf_reset(&in);
        add_line(&in, "250", '-', 1, 1);
        add_line(&in, "250", ' ', cap - 3, 1);
        hs_buf_reset(&want);
        hs_buf_addf(&want, "LINE@7[250-x] LONG_LINE@%zu", 7 + cap + 1);
        expect_parse_n(cap, 65536, in.p, in.len, hs_buf_cstr(&want));
        hs_buf_reset(&in);
        add_line(&in, "250", '-', 3 * cap, 0);
        hs_buf_reset(&want);
        hs_buf_addf(&want, "LONG_LINE@%zu", cap + 1);
        expect_parse_n(cap, 65536, in.p, in.len, hs_buf_cstr(&want));
        hs_buf_free(&in);
        hs_buf_free(&want);
    }
    /* a code-only line needs only 3 */
    EXPECT_PARSE_AT(3, 100, "250\r\n", "DONE@5[250] MORE/0");
    EXPECT_PARSE_AT(3, 100, "250 \r\n", "LONG_LINE@4");
    EXPECT_PARSE_AT(3, 100, "250-", "LONG_LINE@4");
    EXPECT_PARSE_AT(2, 100, "250\r\n", "LONG_LINE@3");
    /* cap 0 (buf NULL): the first good octet is too long; a bad one is reported as such */
    EXPECT_PARSE_AT(0, 100, "250\r\n", "LONG_LINE@1");
    EXPECT_PARSE_AT(0, 100, "x", "SYNTAX@1");
    EXPECT_PARSE_AT(0, 100, "\n", "BARE@1");
    /* the octet at cap+1 is judged first: a NUL or bad digit there is SYNTAX, a CR fits */
    EXPECT_PARSE_AT(5, 100, "250 ab\r\n", "LONG_LINE@6");
    EXPECT_PARSE_AT(5, 100, "250 a\0", "SYNTAX@6");
    EXPECT_PARSE_AT(5, 100, "250 a\n", "BARE@6");
    EXPECT_PARSE_AT(5, 100, "250 a\r\n", "DONE@7[250 a] MORE/0");
    EXPECT_PARSE_AT(4, 100, "250 \r\n", "DONE@6[250 ] MORE/0");
    EXPECT_PARSE_AT(4, 100, "2500", "SYNTAX@4");
}

/* max_total: all octets of one reply, CRLFs included; the octet that passes it is TOO_BIG. */
static void test_parse_total(void **state)
{
    (void)state;
    /* "250-a\r\n250 b\r\n" is 14 octets */
    EXPECT_PARSE_AT(10, 14, "250-a\r\n250 b\r\n", "LINE@7[250-a] DONE@14[250 b] MORE/0");
    EXPECT_PARSE_AT(10, 13, "250-a\r\n250 b\r\n", "LINE@7[250-a] TOO_BIG@14");
    EXPECT_PARSE_AT(10, 12, "250-a\r\n250 b\r\n", "LINE@7[250-a] TOO_BIG@13");
    EXPECT_PARSE_AT(10, 11, "250-a\r\n250 b\r\n", "LINE@7[250-a] TOO_BIG@12");
    EXPECT_PARSE_AT(10, 7, "250-a\r\n250 b\r\n", "LINE@7[250-a] TOO_BIG@8");
    EXPECT_PARSE_AT(10, 6, "250-a\r\n250 b\r\n", "TOO_BIG@7");
    EXPECT_PARSE_AT(10, 0, "250 b\r\n", "TOO_BIG@1");
    /* each reply has its own total */
    EXPECT_PARSE_AT(10, 7, "250 a\r\n250 b\r\n250 c\r\n",
                    "DONE@7[250 a] DONE@14[250 b] DONE@21[250 c] MORE/0");
    /* an invalid octet is reported as such even where it also passes max_total */
    EXPECT_PARSE_AT(10, 5, "250 a\n", "BARE@6");
    EXPECT_PARSE_AT(10, 5, "250 a\0", "SYNTAX@6");
    EXPECT_PARSE_AT(10, 5, "250 ab", "TOO_BIG@6");
    /* a CR that reaches max_total exactly is taken; what follows it is judged as usual */
    EXPECT_PARSE_AT(10, 6, "250 a\rb", "BARE@7");
    EXPECT_PARSE_AT(10, 6, "250 a\r\n", "TOO_BIG@7");
    EXPECT_PARSE_AT(10, 6, "250 a\r", "MORE/5");
    EXPECT_PARSE_AT(10, 5, "250 a\r", "TOO_BIG@6");
    /* LONG_LINE before TOO_BIG at the same octet */
    EXPECT_PARSE_AT(5, 5, "250 ab", "LONG_LINE@6");

    /* a hostile endless reply of short lines ends at max_total + 1 */
    hs_buf in = {0}, want = {0};
    for (int i = 0; i < 200; i++)
        hs_buf_adds(&in, "250-\r\n");
    for (int i = 0; i < 16; i++)
        hs_buf_addf(&want, "LINE@%d[250-] ", 6 * (i + 1));
    hs_buf_addf(&want, "TOO_BIG@%d", 101);
    expect_parse_n(510, 100, in.p, in.len, hs_buf_cstr(&want));
    /* many lines exactly max_total in all */
    hs_buf_reset(&in);
    hs_buf_reset(&want);
    for (int i = 0; i < 99; i++) {
        hs_buf_adds(&in, "250-\r\n");
        hs_buf_addf(&want, "LINE@%d[250-] ", 6 * (i + 1));
    }
    hs_buf_adds(&in, "250 \r\n");
    hs_buf_adds(&want, "DONE@600[250 ] MORE/0");
    expect_parse_n(510, 600, in.p, in.len, hs_buf_cstr(&want));
    /* one octet less: the last LF passes it */
    want.len -= strlen("DONE@600[250 ] MORE/0");
    hs_buf_adds(&want, "TOO_BIG@600");
    expect_parse_n(510, 599, in.p, in.len, hs_buf_cstr(&want));
    hs_buf_free(&in);
    hs_buf_free(&want);
}

/* LINE and DONE consume through the LF and no further; an error sticks; DONE then a feed
 * without smtpe__reply_parser_start begins the next reply. */
static void test_parse_stops_at_line_end(void **state)
{
    (void)state;
    uint8_t buf[64];
    smtpe__reply_parser p = {.buf = buf, .cap = sizeof buf, .max_total = 1000};
    smtpe__reply_parser_start(&p);
    static const char in[] = "250-a\r\n250 b\r\n220 x\r\n\n";
    const uint8_t *u = (const uint8_t *)in;
    size_t n = sizeof in - 1, used;
    assert_int_equal(smtpe__reply_feed(&p, u, n, &used), SMTPE__RP_LINE);
    assert_int_equal(used, 7);
    assert_int_equal(p.code, 250);
    assert_int_equal(p.lines, 1);
    assert_int_equal(smtpe__reply_feed(&p, u + 7, n - 7, &used), SMTPE__RP_DONE);
    assert_int_equal(used, 7);
    assert_int_equal(p.lines, 2);
    assert_int_equal(p.total, 14);
    assert_int_equal(p.len, 5);
    assert_memory_equal(p.buf, "250 b", 5);
    /* no start: the feed starts the next reply itself */
    assert_int_equal(smtpe__reply_feed(&p, u + 14, n - 14, &used), SMTPE__RP_DONE);
    assert_int_equal(used, 7);
    assert_int_equal(p.code, 220);
    assert_int_equal(p.lines, 1);
    assert_int_equal(p.total, 7);
    smtpe__reply_parser_start(&p);
    assert_int_equal(p.code, 0);
    assert_int_equal(p.len, 0);
    assert_int_equal(smtpe__reply_feed(&p, u + 21, n - 21, &used), SMTPE__RP_BARE);
    assert_int_equal(used, 1);
    /* an error sticks until the parser is restarted */
    assert_int_equal(smtpe__reply_feed(&p, u, n, &used), SMTPE__RP_BARE);
    assert_int_equal(used, 0);
    smtpe__reply_parser_start(&p);
    assert_int_equal(smtpe__reply_feed(&p, u, n, &used), SMTPE__RP_LINE);
    assert_int_equal(used, 7);
    /* code is known as soon as the first line's three digits are */
    smtpe__reply_parser_start(&p);
    assert_int_equal(smtpe__reply_feed(&p, (const uint8_t *)"45", 2, &used), SMTPE__RP_MORE);
    assert_int_equal(p.code, 0);
    assert_int_equal(smtpe__reply_feed(&p, (const uint8_t *)"1", 1, &used), SMTPE__RP_MORE);
    assert_int_equal(p.code, 451);
    /* empty input */
    assert_int_equal(smtpe__reply_feed(&p, NULL, 0, &used), SMTPE__RP_MORE);
    assert_int_equal(used, 0);
}

/* Split invariance: several replies, and inputs drawn from an alphabet of the octets that
 * matter, fed one octet at a time and in pseudo-random splits give the log of the whole
 * buffer (computed here, not written down). */
static void check_split_invariant(size_t cap, size_t max_total, const uint8_t *in, size_t n,
                                  uint64_t seeds)
{
    hs_splitter sp;
    hs_buf whole = {0};
    hs_splitter_init(&sp, HS_WHOLE, 1);
    rp_log(&whole, cap, max_total, in, n, &sp, 1);
    for (uint64_t seed = 0; seed <= seeds; seed++) {
        hs_buf log = {0};
        hs_splitter_init(&sp, seed == 0 ? HS_BYTEWISE : HS_RANDOM, seed * 7919);
        rp_log(&log, cap, max_total, in, n, &sp, (int)(seed % 2));
        if (strcmp(hs_buf_cstr(&log), hs_buf_cstr(&whole)) != 0)
            fail_msg("split %s (seed %u) differs:\n  whole: %s\n  split: %s",
                     seed == 0 ? "bytewise" : "random", (unsigned)seed, hs_buf_cstr(&whole),
                     hs_buf_cstr(&log));
        hs_buf_free(&log);
    }
    hs_buf_free(&whole);
}

/* xorshift64 */
static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Appends a reply line that is well formed most of the time ("250-text" CRLF, or "250 text"
 * CRLF or "250" CRLF when last) and otherwise has one hazard: another or a bad code, a bad
 * separator, a NUL, CR or LF in the text, a bare line end, or no line end. */
static void add_random_line(hs_buf *b, uint64_t *x, int last)
{
    static const char *codes[] = {"250", "250", "250", "550", "260", "199", "25", "2x0"};
    static const char hazards[] = {'\0', '\r', '\n', '6', '-', ' ', '\t', '\xff'};
    uint64_t r = rnd(x);
    int hazard = r % 16 == 0;
    hs_buf_adds(b, codes[hazard ? (r >> 8) % 8 : 0]);
    if (!(last && (r >> 12) % 4 == 0))
        hs_buf_adds(b, hazard && (r >> 14) % 3 == 0 ? "x" : last ? " " : "-");
    size_t tlen = (size_t)((r >> 20) % 40);
    for (size_t i = 0; i < tlen; i++) {
        char c = (char)('a' + (r >> (i % 40)) % 26);
        if (hazard && (r >> 24) % 40 == i)
            c = hazards[(r >> 30) % sizeof hazards];
        hs_buf_add(b, &c, 1);
    }
    switch (hazard ? (r >> 40) % 5 : 0) {
    case 1: hs_buf_adds(b, "\n"); break;
    case 2: hs_buf_adds(b, "\r"); break;
    case 3: break;
    default: hs_buf_adds(b, "\r\n"); break;
    }
}

static void test_parse_split_invariance(void **state)
{
    (void)state;
    static const char replies[] =
        "220-mx.example ESMTP\r\n220 ready\r\n"
        "250-mx.example Hello\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250-8BITMIME\r\n"
        "250-ENHANCEDSTATUSCODES\r\n250 SMTPUTF8\r\n"
        "250 2.1.0 Ok\r\n550-5.1.1 No such\r\n550 5.1.1 user\r\n354\r\n"
        "250 2.0.0 Ok: queued as 1234\r\n221 2.0.0 Bye\r\n";
    const uint8_t *u = (const uint8_t *)replies;
    size_t n = sizeof replies - 1;
    hs_buf whole = {0};
    hs_splitter sp;
    hs_splitter_init(&sp, HS_WHOLE, 1);
    rp_log(&whole, 510, 4096, u, n, &sp, 1);
    /* the log is what it should be: 14 lines, 7 replies, nothing left over */
    const char *w = hs_buf_cstr(&whole);
    int lines = 0, dones = 0;
    for (const char *q = w; (q = strstr(q, "@")) != NULL; q++)
        lines++;
    for (const char *q = w; (q = strstr(q, "DONE@")) != NULL; q++)
        dones++;
    assert_int_equal(lines, 14);
    assert_int_equal(dones, 7);
    assert_non_null(strstr(w, "DONE@242[221 2.0.0 Bye] MORE/0"));
    hs_buf_free(&whole);
    check_split_invariant(510, 4096, u, n, 200);
    /* the same replies against small limits: errors at the same octet whatever the split */
    check_split_invariant(20, 4096, u, n, 50);
    check_split_invariant(510, 60, u, n, 50);

    /* random replies: mostly well-formed lines, now and then a hazard where it decides */
    uint64_t x = 0x2545f4914f6cdd1dull;
    hs_buf in = {0};
    for (int round = 0; round < 3000; round++) {
        hs_buf_reset(&in);
        size_t cap = rnd(&x) % 8 == 0 ? rnd(&x) % 8 : 30 + rnd(&x) % 50;
        size_t max_total = rnd(&x) % 800;
        for (int k = 0, nl = 1 + (int)(rnd(&x) % 12); k < nl; k++)
            add_random_line(&in, &x, k + 1 == nl || rnd(&x) % 5 == 0);
        check_split_invariant(cap, max_total, in.p, in.len, 3);
    }
    hs_buf_free(&in);
}

static void test_reply_text(void **state)
{
    (void)state;
    uint8_t buf[32];
    smtpe__reply_parser p = {.buf = buf, .cap = sizeof buf, .max_total = 1000};
    size_t used;
    static const struct {
        const char *in;
        const char *text;
    } cases[] = {
        {"250 OK\r\n", "OK"}, {"250-PIPELINING\r\n", "PIPELINING"}, {"250\r\n", ""},
        {"250 \r\n", ""},     {"250-\r\n", ""},                     {"250  two\r\n", " two"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        smtpe__reply_parser_start(&p);
        int r = smtpe__reply_feed(&p, (const uint8_t *)cases[i].in, strlen(cases[i].in), &used);
        assert_true(r == SMTPE__RP_LINE || r == SMTPE__RP_DONE);
        smtpe_span t = smtpe__reply_text(&p);
        assert_int_equal(t.len, strlen(cases[i].text));
        if (t.len) {
            assert_ptr_equal(t.ptr, buf + 4);
            assert_memory_equal(t.ptr, cases[i].text, t.len);
        }
    }
    /* before a line is complete, or on a short one, the text is empty */
    smtpe__reply_parser_start(&p);
    assert_int_equal(smtpe__reply_text(&p).len, 0);
    assert_int_equal(smtpe__reply_feed(&p, (const uint8_t *)"25", 2, &used), SMTPE__RP_MORE);
    assert_int_equal(smtpe__reply_text(&p).len, 0);
    smtpe__reply_parser q = {.buf = NULL, .cap = 0, .max_total = 0};
    smtpe__reply_parser_start(&q);
    assert_int_equal(smtpe__reply_text(&q).len, 0);
}

/* Splits text[0..strlen) held in a heap block of exactly that size (ASan sees a read past it). */
static int split(const char *text, unsigned code, char *enh, char *rest)
{
    size_t n = strlen(text);
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    memcpy(copy, text, n);
    smtpe_span t = {copy, n}, e, r;
    int ok = smtpe__enhanced_split(t, code, &e, &r);
    assert_true(e.ptr == copy);
    assert_true(r.ptr >= copy && r.ptr + r.len == copy + n);
    if (!ok) {
        assert_int_equal(e.len, 0);
        assert_true(r.ptr == copy && r.len == n);
    } else {
        assert_true(e.len >= 5 && e.len <= 9);
        assert_true(r.ptr == copy + e.len + (e.len < n));
    }
    memcpy(enh, e.ptr, e.len);
    enh[e.len] = 0;
    memcpy(rest, r.ptr, r.len);
    rest[r.len] = 0;
    free(copy);
    return ok;
}

static void test_enhanced_split(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        unsigned code;
        int ok;
        const char *enh, *rest;
    } cases[] = {
        {"2.1.0 Ok", 250, 1, "2.1.0", "Ok"},
        {"2.1.0", 250, 1, "2.1.0", ""},
        {"2.1.0 ", 250, 1, "2.1.0", ""},
        {"2.1.0  two", 250, 1, "2.1.0", " two"},
        {"5.1.1 No such user", 550, 1, "5.1.1", "No such user"},
        {"4.7.0 Try later", 421, 1, "4.7.0", "Try later"},
        {"2.123.456 x", 250, 1, "2.123.456", "x"},
        {"2.123.456", 250, 1, "2.123.456", ""},
        {"5.1.1 x", 250, 0, "", "5.1.1 x"},   /* class differs from the code's */
        {"2.0.0 x", 550, 0, "", "2.0.0 x"},
        {"3.0.0 go", 354, 0, "", "3.0.0 go"}, /* no class 3 */
        {"2.1234.5 x", 250, 0, "", "2.1234.5 x"},
        {"2.1.1234", 250, 0, "", "2.1.1234"},
        {"2.1.0x", 250, 0, "", "2.1.0x"},
        {"2.1.0.0 x", 250, 0, "", "2.1.0.0 x"},
        {"2.1 x", 250, 0, "", "2.1 x"},
        {" 2.1.0 x", 250, 0, "", " 2.1.0 x"},
        {"2.1.0\tx", 250, 0, "", "2.1.0\tx"},
        {"Ok", 250, 0, "", "Ok"},
        {"", 250, 0, "", ""},
        {"mx.example ESMTP", 220, 0, "", "mx.example ESMTP"},
        {"2.1.0123456789", 250, 0, "", "2.1.0123456789"},
    };
    char enh[64], rest[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ok = split(cases[i].text, cases[i].code, enh, rest);
        if (ok != cases[i].ok || strcmp(enh, cases[i].enh) != 0 ||
            strcmp(rest, cases[i].rest) != 0)
            fail_msg("enhanced_split(\"%s\", %u) = %d \"%s\" \"%s\", expected %d \"%s\" \"%s\"",
                     cases[i].text, cases[i].code, ok, enh, rest, cases[i].ok, cases[i].enh,
                     cases[i].rest);
    }
    /* the span ends where its len says, whatever follows it in memory */
    static const uint8_t mem[] = "2.1.0x x";
    smtpe_span t = {mem, 5}, e, r;
    assert_int_equal(smtpe__enhanced_split(t, 250, &e, &r), 1);
    assert_int_equal(e.len, 5);
    assert_int_equal(r.len, 0);
    t.len = 6;
    assert_int_equal(smtpe__enhanced_split(t, 250, &e, &r), 0);
    /* a NUL inside the span is not the end of a code */
    static const uint8_t nul[] = "2.1.0\0 x";
    t.ptr = nul;
    t.len = 8;
    assert_int_equal(smtpe__enhanced_split(t, 250, &e, &r), 0);
    assert_int_equal(r.len, 8);
    t.ptr = NULL;
    t.len = 0;
    assert_int_equal(smtpe__enhanced_split(t, 250, &e, &r), 0);
    assert_int_equal(e.len, 0);
    assert_int_equal(r.len, 0);
}

static void test_reply_error_text(void **state)
{
    (void)state;
    static const int errs[] = {SMTPE__RP_SYNTAX, SMTPE__RP_MISMATCH, SMTPE__RP_LONG_LINE,
                               SMTPE__RP_TOO_BIG, SMTPE__RP_BARE};
    const char *unknown = smtpe__reply_error_text(-99);
    assert_non_null(unknown);
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        const char *t = smtpe__reply_error_text(errs[i]);
        assert_non_null(t);
        assert_true(strlen(t) > 0);
        assert_string_not_equal(t, unknown);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(t, smtpe__reply_error_text(errs[j]));
    }
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
        cmocka_unit_test(test_parse_single_line),
        cmocka_unit_test(test_parse_multi_line),
        cmocka_unit_test(test_parse_codes),
        cmocka_unit_test(test_parse_mismatch),
        cmocka_unit_test(test_parse_bare),
        cmocka_unit_test(test_parse_octets),
        cmocka_unit_test(test_parse_line_cap),
        cmocka_unit_test(test_parse_total),
        cmocka_unit_test(test_parse_stops_at_line_end),
        cmocka_unit_test(test_parse_split_invariance),
        cmocka_unit_test(test_reply_text),
        cmocka_unit_test(test_enhanced_split),
        cmocka_unit_test(test_reply_error_text),
    };
    return cmocka_run_group_tests_name("reply", tests, NULL, NULL);
}
