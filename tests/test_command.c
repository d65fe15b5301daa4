/*
 * test_command.c - unit tests of engine/command.c: command-line framing (RFC 5321 §2.3.8: only
 * CRLF ends a line; bare CR / bare LF / NUL per policy), line length limits (§4.5.3.1.4), verbs
 * (§4.1.1, case-insensitive), ESMTP parameters (§4.1.2), decimal numbers (RFC 1870 SIZE) and
 * xtext encoding (RFC 3461 §4), with its round trip through smtpe__xtext_decode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "command.h"

#define CAP 16 /* max_line_length 18 */

typedef struct line_fixture {
    uint8_t mem[CAP + 64];
    smtpe__line l;
} line_fixture;

static void line_init(line_fixture *f, size_t cap)
{
    memset(f, 0, sizeof *f);
    /* guard octets after the buffer must stay untouched */
    memset(f->mem, 0xee, sizeof f->mem);
    f->l.buf = f->mem;
    f->l.cap = cap;
    smtpe__line_reset(&f->l);
    assert_int_equal(f->l.len, 0);
    assert_int_equal(f->l.flags & (SMTPE__LINE_DONE | SMTPE__LINE_TOO_LONG | SMTPE__LINE_BARE), 0);
}

static void check_guard(const line_fixture *f)
{
    for (size_t i = f->l.cap; i < sizeof f->mem; i++)
        if (f->mem[i] != 0xee)
            fail_msg("smtpe__line_feed wrote past cap (octet %zu)", i);
}

/* Feeds s (len n) in one call through an exactly sized heap copy; returns octets consumed. */
static size_t feed(line_fixture *f, const char *s, size_t n, smtpe_line_ending_policy pol)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    memcpy(p, s, n);
    size_t used = smtpe__line_feed(&f->l, p, n, pol);
    free(p);
    assert_true(used <= n);
    check_guard(f);
    return used;
}

#define FEED(f, lit, pol) feed(f, lit, sizeof(lit) - 1, pol)

static void assert_line(const line_fixture *f, const char *want, size_t n)
{
    if (!(f->l.flags & SMTPE__LINE_DONE))
        fail_msg("line not done");
    if (f->l.len != n || memcmp(f->l.buf, want, n) != 0) {
        fprintf(stderr, "line: \"%.*s\" (%zu octets), expected %zu octets\n", (int)f->l.len,
                (const char *)f->l.buf, f->l.len, n);
        fail_msg("line content mismatch");
    }
}

#define ASSERT_LINE(f, lit) assert_line(f, lit, sizeof(lit) - 1)

static const smtpe_line_ending_policy all_policies[] = {
    SMTPE_LINE_ENDING_REFUSE, SMTPE_LINE_ENDING_NORMALISE, SMTPE_LINE_ENDING_KEEP};

static void test_crlf_ends_line(void **state)
{
    (void)state;
    line_fixture f;
    for (size_t i = 0; i < 3; i++) {
        smtpe_line_ending_policy pol = all_policies[i];
        line_init(&f, CAP);
        assert_int_equal(FEED(&f, "NOOP\r\n", pol), 6);
        ASSERT_LINE(&f, "NOOP");
        assert_int_equal(f.l.flags & (SMTPE__LINE_BARE | SMTPE__LINE_TOO_LONG), 0);

        /* stops right after the first line */
        line_init(&f, CAP);
        assert_int_equal(FEED(&f, "NOOP\r\nRSET\r\n", pol), 6);
        ASSERT_LINE(&f, "NOOP");
        smtpe__line_reset(&f.l);
        assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
        assert_int_equal(FEED(&f, "RSET\r\n", pol), 6);
        ASSERT_LINE(&f, "RSET");

        /* empty line */
        line_init(&f, CAP);
        assert_int_equal(FEED(&f, "\r\n", pol), 2);
        ASSERT_LINE(&f, "");
    }
}

static void test_split_feeds(void **state)
{
    (void)state;
    line_fixture f;
    for (size_t i = 0; i < 3; i++) {
        smtpe_line_ending_policy pol = all_policies[i];
        line_init(&f, CAP);
        assert_int_equal(FEED(&f, "NO", pol), 2);
        assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
        assert_int_equal(FEED(&f, "OP\r", pol), 3);
        assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
        assert_int_equal(FEED(&f, "\nXY", pol), 1);
        ASSERT_LINE(&f, "NOOP");
        assert_int_equal(f.l.flags & (SMTPE__LINE_BARE | SMTPE__LINE_TOO_LONG), 0);

        /* one octet at a time */
        line_init(&f, CAP);
        const char *s = "MAIL FROM:<a@b>\r\n";
        size_t n = strlen(s);
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
            assert_int_equal(feed(&f, s + k, 1, pol), 1);
        }
        ASSERT_LINE(&f, "MAIL FROM:<a@b>");

        /* an empty feed consumes nothing */
        line_init(&f, CAP);
        assert_int_equal(feed(&f, "", 0, pol), 0);
        assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
    }
}

/* REFUSE: a bare LF, bare CR or NUL is flagged; the line still ends only at CRLF. */
static void test_refuse(void **state)
{
    (void)state;
    const smtpe_line_ending_policy P = SMTPE_LINE_ENDING_REFUSE;
    static const struct {
        const char *s;
        size_t n;
    } cases[] = {
        {"NO\nOP\r\n", 7},  {"NO\rOP\r\n", 7}, {"NO\0OP\r\n", 7},
        {"NOOP\r\r\n", 7},  {"\n\r\n", 3},     {"NOOP\n\n\r\n", 8},
        {"\r\r\n", 3},      {"\0\r\n", 3},
    };
    line_fixture f;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        line_init(&f, CAP);
        char buf[64];
        memcpy(buf, cases[i].s, cases[i].n);
        memcpy(buf + cases[i].n, "RSET\r\n", 6);
        size_t used = feed(&f, buf, cases[i].n + 6, P);
        if (used != cases[i].n)
            fail_msg("REFUSE case %zu: consumed %zu, expected %zu", i, used, cases[i].n);
        if (!(f.l.flags & SMTPE__LINE_DONE) || !(f.l.flags & SMTPE__LINE_BARE))
            fail_msg("REFUSE case %zu: flags 0x%x, expected DONE|BARE", i, f.l.flags);
        /* the same, one octet at a time */
        line_init(&f, CAP);
        size_t k = 0;
        while (!(f.l.flags & SMTPE__LINE_DONE) && k < cases[i].n + 6) {
            if (feed(&f, buf + k, 1, P) != 1)
                fail_msg("REFUSE case %zu bytewise: an octet was not consumed at %zu", i, k);
            k++;
        }
        if (k != cases[i].n || !(f.l.flags & SMTPE__LINE_BARE))
            fail_msg("REFUSE case %zu bytewise: consumed %zu, flags 0x%x", i, k, f.l.flags);
    }
    /* a bare CR at the end of one feed and LF at the start of the next is a CRLF */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\r", P), 5);
    assert_int_equal(FEED(&f, "\n", P), 1);
    ASSERT_LINE(&f, "NOOP");
    assert_int_equal(f.l.flags & SMTPE__LINE_BARE, 0);
    /* a CR at the end of one feed followed by another octet is bare */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\r", P), 5);
    assert_int_equal(FEED(&f, "X\r\n", P), 3);
    assert_true(f.l.flags & SMTPE__LINE_DONE);
    assert_true(f.l.flags & SMTPE__LINE_BARE);
}

/* NORMALISE: a bare LF ends the line; a bare CR ends it once the next octet shows that no LF
 * follows; NUL is removed. */
static void test_normalise(void **state)
{
    (void)state;
    const smtpe_line_ending_policy P = SMTPE_LINE_ENDING_NORMALISE;
    line_fixture f;

    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\nRSET\r\n", P), 5);
    ASSERT_LINE(&f, "NOOP");
    assert_int_equal(f.l.flags & SMTPE__LINE_BARE, 0);

    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "\nRSET\r\n", P), 1);
    ASSERT_LINE(&f, "");

    /* bare CR followed by another octet: the line ends at the CR, the octet is the next line's */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\rRSET\r\n", P), 5);
    ASSERT_LINE(&f, "NOOP");
    assert_int_equal(f.l.flags & SMTPE__LINE_BARE, 0);
    smtpe__line_reset(&f.l);
    assert_int_equal(FEED(&f, "RSET\r\n", P), 6);
    ASSERT_LINE(&f, "RSET");

    /* CR at the end of the input: not yet known */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\r", P), 5);
    assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
    assert_int_equal(FEED(&f, "RSET\r\n", P), 0);
    ASSERT_LINE(&f, "NOOP");
    smtpe__line_reset(&f.l);
    assert_int_equal(FEED(&f, "RSET\r\n", P), 6);
    ASSERT_LINE(&f, "RSET");

    /* ... and when an LF does follow, it was a CRLF */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\r", P), 5);
    assert_int_equal(FEED(&f, "\nRSET", P), 1);
    ASSERT_LINE(&f, "NOOP");

    /* CR CR LF: the first CR ends a line, the CRLF ends an empty one */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\r\r\n", P), 5);
    ASSERT_LINE(&f, "NOOP");
    smtpe__line_reset(&f.l);
    assert_int_equal(FEED(&f, "\r\n", P), 2);
    ASSERT_LINE(&f, "");

    /* NUL is removed */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NO\0OP\r\n", P), 7);
    ASSERT_LINE(&f, "NOOP");
    assert_int_equal(f.l.flags & SMTPE__LINE_BARE, 0);
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "\0\0\0\n", P), 4);
    ASSERT_LINE(&f, "");
}

/* KEEP: the octets stay in the line; only CRLF ends it. */
static void test_keep(void **state)
{
    (void)state;
    const smtpe_line_ending_policy P = SMTPE_LINE_ENDING_KEEP;
    line_fixture f;
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NO\nOP\r\nX", P), 7);
    ASSERT_LINE(&f, "NO\nOP");
    assert_int_equal(f.l.flags & SMTPE__LINE_BARE, 0);

    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NO\rOP\r\n", P), 7);
    ASSERT_LINE(&f, "NO\rOP");

    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NOOP\r\r\n", P), 7);
    ASSERT_LINE(&f, "NOOP\r");

    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "NO\0OP\r\n", P), 7);
    ASSERT_LINE(&f, "NO\0OP");

    /* a CR at the end of a feed, then another octet: kept */
    line_init(&f, CAP);
    assert_int_equal(FEED(&f, "A\r", P), 2);
    assert_int_equal(f.l.flags & SMTPE__LINE_DONE, 0);
    assert_int_equal(FEED(&f, "B\r", P), 2);
    assert_int_equal(FEED(&f, "\n", P), 1);
    ASSERT_LINE(&f, "A\rB");
}

/* A line longer than cap octets (CRLF excluded) is flagged; it still ends at its CRLF and the
 * buffer never overflows. */
static void test_too_long(void **state)
{
    (void)state;
    line_fixture f;
    char buf[400];
    for (size_t i = 0; i < 3; i++) {
        smtpe_line_ending_policy pol = all_policies[i];
        /* exactly cap octets: fine */
        line_init(&f, CAP);
        memset(buf, 'a', CAP);
        memcpy(buf + CAP, "\r\n", 2);
        assert_int_equal(feed(&f, buf, CAP + 2, pol), CAP + 2);
        assert_line(&f, buf, CAP);
        assert_int_equal(f.l.flags & SMTPE__LINE_TOO_LONG, 0);

        /* cap octets with the CR and LF in later feeds */
        line_init(&f, CAP);
        assert_int_equal(feed(&f, buf, CAP, pol), CAP);
        assert_int_equal(feed(&f, "\r", 1, pol), 1);
        assert_int_equal(feed(&f, "\nX", 2, pol), 1);
        assert_line(&f, buf, CAP);
        assert_int_equal(f.l.flags & SMTPE__LINE_TOO_LONG, 0);

        /* cap + 1 */
        line_init(&f, CAP);
        memset(buf, 'b', CAP + 1);
        memcpy(buf + CAP + 1, "\r\nNOOP\r\n", 8);
        assert_int_equal(feed(&f, buf, CAP + 9, pol), CAP + 3);
        assert_true(f.l.flags & SMTPE__LINE_DONE);
        assert_true(f.l.flags & SMTPE__LINE_TOO_LONG);
        assert_true(f.l.len <= CAP);

        /* 300 octets in pieces of 7 */
        line_init(&f, CAP);
        memset(buf, 'c', 300);
        memcpy(buf + 300, "\r\n", 2);
        size_t k = 0;
        while (!(f.l.flags & SMTPE__LINE_DONE) && k < 302) {
            size_t piece = 302 - k < 7 ? 302 - k : 7;
            size_t used = feed(&f, buf + k, piece, pol);
            assert_true(used > 0);
            k += used;
        }
        assert_int_equal(k, 302);
        assert_true(f.l.flags & SMTPE__LINE_TOO_LONG);
        assert_true(f.l.len <= CAP);

        /* after reset the next line is fine */
        smtpe__line_reset(&f.l);
        assert_int_equal(f.l.flags & SMTPE__LINE_TOO_LONG, 0);
        assert_int_equal(FEED(&f, "QUIT\r\n", pol), 6);
        ASSERT_LINE(&f, "QUIT");
    }
    /* NORMALISE: a too-long line ended by a bare LF */
    line_init(&f, CAP);
    memset(buf, 'd', CAP + 1);
    buf[CAP + 1] = '\n';
    assert_int_equal(feed(&f, buf, CAP + 2, SMTPE_LINE_ENDING_NORMALISE), CAP + 2);
    assert_true(f.l.flags & SMTPE__LINE_DONE);
    assert_true(f.l.flags & SMTPE__LINE_TOO_LONG);
    /* the RFC minimum: 510 octets of line (512 with CRLF) */
    {
        static uint8_t big[1024];
        smtpe__line l;
        l.buf = big;
        l.cap = 510;
        smtpe__line_reset(&l);
        char in[520];
        memset(in, 'x', 510);
        memcpy(in + 510, "\r\n", 2);
        assert_int_equal(smtpe__line_feed(&l, (const uint8_t *)in, 512, SMTPE_LINE_ENDING_REFUSE),
                         512);
        assert_true(l.flags & SMTPE__LINE_DONE);
        assert_int_equal(l.flags & SMTPE__LINE_TOO_LONG, 0);
        assert_int_equal(l.len, 510);
        smtpe__line_reset(&l);
        memset(in, 'x', 511);
        memcpy(in + 511, "\r\n", 2);
        assert_int_equal(smtpe__line_feed(&l, (const uint8_t *)in, 513, SMTPE_LINE_ENDING_REFUSE),
                         513);
        assert_true(l.flags & SMTPE__LINE_TOO_LONG);
    }
}

static int span_is(smtpe_span sp, const char *s)
{
    size_t n = strlen(s);
    return sp.len == n && (n == 0 || memcmp(sp.ptr, s, n) == 0);
}

static void test_command_split(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        smtpe__verb verb;
        const char *verb_text;
        const char *arg;
    } cases[] = {
        {"MAIL FROM:<a@b>", SMTPE__VERB_MAIL, "MAIL", "FROM:<a@b>"},
        {"mail from:<a@b>", SMTPE__VERB_MAIL, "mail", "from:<a@b>"},
        {"MaIl FROM:<a@b>", SMTPE__VERB_MAIL, "MaIl", "FROM:<a@b>"},
        {"HELO x", SMTPE__VERB_HELO, "HELO", "x"},
        {"helo  client.example", SMTPE__VERB_HELO, "helo", "client.example"},
        {"EHLO client.example", SMTPE__VERB_EHLO, "EHLO", "client.example"},
        {"ehlo client.example", SMTPE__VERB_EHLO, "ehlo", "client.example"},
        {"RCPT TO:<u@x>", SMTPE__VERB_RCPT, "RCPT", "TO:<u@x>"},
        {"rCpT TO:<u@x>", SMTPE__VERB_RCPT, "rCpT", "TO:<u@x>"},
        {"DATA", SMTPE__VERB_DATA, "DATA", ""},
        {"data", SMTPE__VERB_DATA, "data", ""},
        {"RSET", SMTPE__VERB_RSET, "RSET", ""},
        {"NOOP", SMTPE__VERB_NOOP, "NOOP", ""},
        {"noop anything at all", SMTPE__VERB_NOOP, "noop", "anything at all"},
        {"QUIT", SMTPE__VERB_QUIT, "QUIT", ""},
        {"Quit ", SMTPE__VERB_QUIT, "Quit", ""},
        {"VRFY postmaster", SMTPE__VERB_VRFY, "VRFY", "postmaster"},
        {"EXPN staff", SMTPE__VERB_EXPN, "EXPN", "staff"},
        {"HELP", SMTPE__VERB_HELP, "HELP", ""},
        {"help mail", SMTPE__VERB_HELP, "help", "mail"},
        {"FOO", SMTPE__VERB_UNKNOWN, "FOO", ""},
        {"FOO bar baz", SMTPE__VERB_UNKNOWN, "FOO", "bar baz"},
        {"MAILX FROM:<a@b>", SMTPE__VERB_UNKNOWN, "MAILX", "FROM:<a@b>"},
        {"MAI", SMTPE__VERB_UNKNOWN, "MAI", ""},
        {"HEL", SMTPE__VERB_UNKNOWN, "HEL", ""},
        {"DATAX", SMTPE__VERB_UNKNOWN, "DATAX", ""},
        {"STARTTLS", SMTPE__VERB_STARTTLS, "STARTTLS", ""},
        {"starttls", SMTPE__VERB_STARTTLS, "starttls", ""},
        {"STARTTLSX", SMTPE__VERB_UNKNOWN, "STARTTLSX", ""},
        {"BDAT 10 LAST", SMTPE__VERB_BDAT, "BDAT", "10 LAST"},
        {"XFORWARD NAME=a", SMTPE__VERB_XFORWARD, "XFORWARD", "NAME=a"},
        {"", SMTPE__VERB_UNKNOWN, "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].line);
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, cases[i].line, n);
        smtpe_span verb = {0}, arg = {0};
        smtpe__verb v = smtpe__command_split(p, n, &verb, &arg);
        int ok = v == cases[i].verb && span_is(verb, cases[i].verb_text) &&
                 span_is(arg, cases[i].arg);
        free(p);
        if (!ok)
            fail_msg("smtpe__command_split(\"%s\"): verb %d, expected %d / \"%s\" / \"%s\"",
                     cases[i].line, (int)v, (int)cases[i].verb, cases[i].verb_text, cases[i].arg);
    }
}

static void test_has_prefix_ci(void **state)
{
    (void)state;
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"FROM:<a>", 8, "FROM:"), 1);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"from:<a>", 8, "FROM:"), 1);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"FrOm:<a>", 8, "from:"), 1);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"FROM:", 5, "from:"), 1);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"FROM", 4, "from:"), 0);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"FROM:<a>", 3, "from:"), 0);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"TO:<a>", 6, "from:"), 0);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"FROM;<a>", 8, "from:"), 0);
    assert_int_equal(smtpe__has_prefix_ci((const uint8_t *)"anything", 8, ""), 1);
}

/* smtpe__same_ci against its definition for every pair of octets: equal once ASCII letters
 * are folded to lower case, and nothing else folded ('@' and '`', '[' and '{', 0xC1 and 0xE1
 * differ only in 0x20 too, and are not the same). */
static void test_same_ci_every_pair(void **state)
{
    (void)state;
    for (unsigned x = 0; x < 256; x++) {
        for (unsigned y = 0; y < 256; y++) {
            uint8_t a[2] = {'k', (uint8_t)x}, b[2] = {'K', (uint8_t)y};
            unsigned lx = x >= 'A' && x <= 'Z' ? x + 32 : x;
            unsigned ly = y >= 'A' && y <= 'Z' ? y + 32 : y;
            if (smtpe__same_ci(a, b, 2) != (lx == ly))
                fail_msg("same_ci(0x%02x, 0x%02x) wrong", x, y);
        }
    }
}

typedef struct param_case {
    const char *in;
    int result;
    size_t count;
    const char *kv[2 * 4]; /* expected keyword, value pairs (first 4) */
} param_case;

static void test_parse_params(void **state)
{
    (void)state;
    static const param_case cases[] = {
        {"SIZE=100", SMTPE__PARAMS_OK, 1, {"SIZE", "100"}},
        {"SIZE=100 BODY=8BITMIME", SMTPE__PARAMS_OK, 2, {"SIZE", "100", "BODY", "8BITMIME"}},
        {"SMTPUTF8", SMTPE__PARAMS_OK, 1, {"SMTPUTF8", ""}},
        {"  SIZE=1  ", SMTPE__PARAMS_OK, 1, {"SIZE", "1"}},
        {"", SMTPE__PARAMS_OK, 0, {NULL}},
        {"   ", SMTPE__PARAMS_OK, 0, {NULL}},
        {"X-FOO=bar SMTPUTF8 size=12", SMTPE__PARAMS_OK, 3,
         {"X-FOO", "bar", "SMTPUTF8", "", "size", "12"}},
        {"ORCPT=rfc822;b+0Ac@example.org", SMTPE__PARAMS_OK, 1,
         {"ORCPT", "rfc822;b+0Ac@example.org"}},
        {"A1=!\"#$%&'()*+,-./:;<>?@[\\]^_`{|}~", SMTPE__PARAMS_OK, 1,
         {"A1", "!\"#$%&'()*+,-./:;<>?@[\\]^_`{|}~"}},
        {"X=\xc3\xa9t\xc3\xa9", SMTPE__PARAMS_OK, 1, {"X", "\xc3\xa9t\xc3\xa9"}}, /* RFC 6531 */
        {"9=1", SMTPE__PARAMS_OK, 1, {"9", "1"}},
        {"-X=1", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"X_Y=1", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"X.Y=1", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"=1", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"SIZE=", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"A=b=c", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"A=b\x01", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"A=b\x7f", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"A=b\tB=c", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"A\x01=1", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"\xc3\xa9=1", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
        {"SIZE=1 =2", SMTPE__PARAMS_SYNTAX, 0, {NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const param_case *c = &cases[i];
        size_t n = strlen(c->in);
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, c->in, n);
        smtpe_param out[SMTPE_MAX_PARAMS];
        size_t count = 99;
        int r = smtpe__parse_params(p, n, out, SMTPE_MAX_PARAMS, &count);
        int ok = r == c->result;
        if (ok && r == SMTPE__PARAMS_OK) {
            ok = count == c->count;
            for (size_t k = 0; ok && k < count && k < 4; k++) {
                ok = span_is(out[k].keyword, c->kv[2 * k]) && span_is(out[k].value, c->kv[2 * k + 1]);
                ok = ok && (out[k].keyword.len == 0 ||
                            (out[k].keyword.ptr >= p && out[k].keyword.ptr < p + n));
            }
        }
        free(p);
        if (!ok)
            fail_msg("smtpe__parse_params(\"%s\"): result %d count %zu, expected %d count %zu",
                     c->in, r, count, c->result, c->count);
    }
}

static void test_parse_params_max(void **state)
{
    (void)state;
    char in[400] = "";
    smtpe_param out[SMTPE_MAX_PARAMS + 4];
    size_t count = 0;
    for (int i = 1; i <= 16; i++) {
        char t[16];
        snprintf(t, sizeof t, "%sA%d=%d", i > 1 ? " " : "", i, i);
        strcat(in, t);
    }
    /* exactly 16 */
    assert_int_equal(smtpe__parse_params((const uint8_t *)in, strlen(in), out, SMTPE_MAX_PARAMS,
                                         &count),
                     SMTPE__PARAMS_OK);
    assert_int_equal(count, 16);
    assert_true(span_is(out[15].keyword, "A16"));
    assert_true(span_is(out[15].value, "16"));
    /* 17 */
    strcat(in, " A17=17");
    assert_int_equal(smtpe__parse_params((const uint8_t *)in, strlen(in), out, SMTPE_MAX_PARAMS,
                                         &count),
                     SMTPE__PARAMS_TOO_MANY);
    /* a smaller max */
    assert_int_equal(smtpe__parse_params((const uint8_t *)"A=1 B=2 C=3", 11, out, 2, &count),
                     SMTPE__PARAMS_TOO_MANY);
    assert_int_equal(smtpe__parse_params((const uint8_t *)"A=1 B=2", 7, out, 2, &count),
                     SMTPE__PARAMS_OK);
    assert_int_equal(count, 2);
}

static void test_parse_u64(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int rc;
        uint64_t v;
    } cases[] = {
        {"0", 0, 0},
        {"7", 0, 7},
        {"007", 0, 7},
        {"999999", 0, 999999},
        {"10485760", 0, 10485760},
        {"4294967296", 0, 4294967296ull},
        {"18446744073709551615", 0, UINT64_MAX},        /* 20 digits, the largest */
        {"00000000000000000001", 0, 1},                 /* 20 digits */
        {"18446744073709551616", -1, 0},                /* 20 digits, overflows */
        {"99999999999999999999", -1, 0},
        {"20000000000000000000", -1, 0},
        {"000000000000000000001", -1, 0},               /* 21 digits */
        {"184467440737095516150", -1, 0},
        {"", -1, 0},
        {"12a", -1, 0},
        {"a12", -1, 0},
        {"+1", -1, 0},
        {"-1", -1, 0},
        {" 1", -1, 0},
        {"1 ", -1, 0},
        {"1.5", -1, 0},
        {"0x10", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].s);
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        memcpy(p, cases[i].s, n);
        smtpe_span sp = {p, n};
        uint64_t v = 12345;
        int rc = smtpe__parse_u64(sp, &v);
        free(p);
        if (rc != cases[i].rc || (rc == 0 && v != cases[i].v))
            fail_msg("smtpe__parse_u64(\"%s\") = %d, %llu; expected %d, %llu", cases[i].s, rc,
                     (unsigned long long)v, cases[i].rc, (unsigned long long)cases[i].v);
    }
    /* the span bounds the number */
    smtpe_span sp = {(const uint8_t *)"12345", 3};
    uint64_t v = 0;
    assert_int_equal(smtpe__parse_u64(sp, &v), 0);
    assert_int_equal(v, 123);
}

/* ---------------------------------------------------------------------------------------------
 * xtext (RFC 3461 §4)
 * ------------------------------------------------------------------------------------------- */

/* Encodes in[0..n) with cap; checks the result against want (NULL: must not fit), that the
 * measuring call agrees, and that nothing past cap is written. */
static void check_encode(const void *in, size_t n, size_t cap, const char *want)
{
    uint8_t out[1024];
    assert_true(cap + 1 <= sizeof out);
    memset(out, 0xee, sizeof out);
    size_t measured = smtpe__xtext_encode(in, n, NULL, 0);
    size_t r = smtpe__xtext_encode(in, n, out, cap);
    for (size_t i = cap; i < sizeof out; i++)
        if (out[i] != 0xee)
            fail_msg("smtpe__xtext_encode wrote past cap %zu (octet %zu)", cap, i);
    if (want == NULL) {
        if (r != SIZE_MAX)
            fail_msg("encoding %zu octets into %zu fitted (%zu)", n, cap, r);
        assert_true(measured > cap);
        return;
    }
    if (r != strlen(want) || memcmp(out, want, r) != 0)
        fail_msg("encoded \"%.*s\" (%zu), expected \"%s\"", (int)(r == SIZE_MAX ? 0 : r),
                 (const char *)out, r, want);
    assert_int_equal(measured, r);
}

#define ENCODE(lit, cap, want) check_encode(lit, sizeof(lit) - 1, cap, want)

static void test_xtext_encode(void **state)
{
    (void)state;
    /* values in the style of RFC 3461 §6: nothing to encode */
    ENCODE("QQ314159", 100, "QQ314159");
    ENCODE("rfc822;Dana@Ivory.EDU", 100, "rfc822;Dana@Ivory.EDU");
    /* "+" and "=" (xchar excludes them), SP, controls, DEL and octets above 127 */
    ENCODE("a+b=c", 100, "a+2Bb+3Dc");
    ENCODE("id+1=2", 100, "id+2B1+3D2");
    ENCODE("rfc822;Bob Smith@example.com", 100, "rfc822;Bob+20Smith@example.com");
    ENCODE("\r\n\0\x7f", 100, "+0D+0A+00+7F");
    ENCODE("\x80\xc3\xa9\xff", 100, "+80+C3+A9+FF");
    ENCODE("!~", 100, "!~"); /* the ends of the xchar range */
    ENCODE(" ", 100, "+20");
    ENCODE("++", 100, "+2B+2B");
    /* empty input: length 0, fits anywhere, even in no room */
    ENCODE("", 0, "");
    ENCODE("", 5, "");
    assert_int_equal(smtpe__xtext_encode(NULL, 0, NULL, 0), 0);
    /* cap boundaries: exactly the length fits, one less does not, at every kind of octet */
    ENCODE("a+b=c", 9, "a+2Bb+3Dc");
    ENCODE("a+b=c", 8, NULL);
    ENCODE("a+b=c", 0, NULL);
    ENCODE("a+b=c", 1, NULL);
    ENCODE("a+b=c", 2, NULL);  /* room for "a" and part of "+2B" */
    ENCODE("a+b=c", 3, NULL);
    ENCODE("a+b=c", 4, NULL);  /* "a+2B" fits, "b" does not */
    ENCODE("abc", 3, "abc");
    ENCODE("abc", 2, NULL);
    ENCODE("=", 3, "+3D");
    ENCODE("=", 2, NULL);
    /* a failed encoding leaves the part that fitted (whole units) */
    uint8_t out[8];
    memset(out, 0xee, sizeof out);
    assert_int_equal(smtpe__xtext_encode((const uint8_t *)"a+b", 3, out, 3), SIZE_MAX);
    assert_memory_equal(out, "a\xee\xee", 3);
    /* measuring ignores cap */
    assert_int_equal(smtpe__xtext_encode((const uint8_t *)"a+b=c", 5, NULL, 1), 9);
}

/* Every octet value alone, then all of them together: encode and decode give the octets back;
 * smtpe__xtext_decode refuses control octets (SMTPE__XTEXT_CONTROL), so for those the round
 * trip ends there. */
static void test_xtext_round_trip(void **state)
{
    (void)state;
    uint8_t in[256], enc[3 * 256], plain[256];
    size_t np = 0;
    for (int c = 0; c < 256; c++) {
        uint8_t o = (uint8_t)c;
        int is_xchar = c >= '!' && c <= '~' && c != '+' && c != '=';
        int control = c < 0x20 || c == 0x7f;
        size_t n = smtpe__xtext_encode(&o, 1, enc, sizeof enc);
        assert_int_equal(n, is_xchar ? 1 : 3);
        for (size_t i = 0; i < n; i++) /* the encoding is itself xchars and "+" */
            assert_true(enc[i] >= '!' && enc[i] <= '~' && enc[i] != '=');
        size_t len = 99;
        int r = smtpe__xtext_decode(enc, n, &len);
        if (control) {
            assert_int_equal(r, SMTPE__XTEXT_CONTROL);
        } else {
            assert_int_equal(r, SMTPE__XTEXT_OK);
            assert_int_equal(len, 1);
            assert_int_equal(enc[0], o);
            plain[np++] = o;
        }
        in[c] = o;
    }
    /* all 256 together: the encoding measures what it writes, and decodes as CONTROL */
    size_t n = smtpe__xtext_encode(in, 256, enc, sizeof enc);
    assert_int_equal(n, smtpe__xtext_encode(in, 256, NULL, 0));
    assert_int_equal(n, 94 - 2 + 3 * (256 - 94 + 2)); /* 92 xchars, 164 triples */
    size_t len;
    assert_int_equal(smtpe__xtext_decode(enc, n, &len), SMTPE__XTEXT_CONTROL);
    /* every octet but the controls, together: back exactly */
    assert_int_equal(np, 256 - 33);
    n = smtpe__xtext_encode(plain, np, enc, sizeof enc);
    assert_true(n != SIZE_MAX);
    assert_int_equal(smtpe__xtext_decode(enc, n, &len), SMTPE__XTEXT_OK);
    assert_int_equal(len, np);
    assert_memory_equal(enc, plain, np);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crlf_ends_line),
        cmocka_unit_test(test_split_feeds),
        cmocka_unit_test(test_refuse),
        cmocka_unit_test(test_normalise),
        cmocka_unit_test(test_keep),
        cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_command_split),
        cmocka_unit_test(test_has_prefix_ci),
        cmocka_unit_test(test_same_ci_every_pair),
        cmocka_unit_test(test_parse_params),
        cmocka_unit_test(test_parse_params_max),
        cmocka_unit_test(test_parse_u64),
        cmocka_unit_test(test_xtext_encode),
        cmocka_unit_test(test_xtext_round_trip),
    };
    return cmocka_run_group_tests_name("command", tests, NULL, NULL);
}
