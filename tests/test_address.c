/*
 * test_address.c - unit tests of engine/address.c: the RFC 5321 §4.1.2 Path / Mailbox parser,
 * address literals (§4.1.3), length limits (§4.5.3.1) and UTF-8 mailboxes (RFC 6531, RFC 3629).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "address.h"

#define ANY_USED ((size_t)-1)

typedef struct path_case {
    const char *in;
    size_t len;         /* 0: strlen(in) */
    unsigned opts;
    int result;
    const char *local;  /* expected local-part (OK only); NULL: not checked */
    const char *domain; /* expected domain (OK only); NULL: not checked */
    unsigned flags;     /* expected flags (OK only) */
    size_t used;        /* expected octets used (OK only); ANY_USED: the whole input */
} path_case;

#define ALLOW_NULL SMTPE__PATH_ALLOW_NULL
#define ALLOW_PM SMTPE__PATH_ALLOW_POSTMASTER
#define LAX SMTPE__PATH_LAX_BRACKETS
#define RCPT_OPTS ALLOW_PM
#define MAIL_OPTS ALLOW_NULL

#define OK_(in, opts, local, domain, flags) {in, 0, opts, SMTPE__PATH_OK, local, domain, flags, ANY_USED}
#define BAD(in, opts, result) {in, 0, opts, result, NULL, NULL, 0, 0}

static const char *result_name(int r)
{
    switch (r) {
    case SMTPE__PATH_OK: return "OK";
    case SMTPE__PATH_NO_BRACKETS: return "NO_BRACKETS";
    case SMTPE__PATH_SYNTAX: return "SYNTAX";
    case SMTPE__PATH_TOO_LONG: return "TOO_LONG";
    default: return "?";
    }
}

static void print_bytes(const char *what, const uint8_t *p, size_t n)
{
    fprintf(stderr, "%s\"", what);
    for (size_t i = 0; i < n; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '"')
            fputc(p[i], stderr);
        else
            fprintf(stderr, "\\x%02x", p[i]);
    }
    fprintf(stderr, "\"\n");
}

static int span_is(smtpe_span sp, const char *s)
{
    size_t n = strlen(s);
    return sp.len == n && (n == 0 || memcmp(sp.ptr, s, n) == 0);
}

static int span_is_ci(smtpe_span sp, const char *s)
{
    size_t n = strlen(s);
    if (sp.len != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t a = sp.ptr[i], b = (uint8_t)s[i];
        if (a >= 'A' && a <= 'Z')
            a = (uint8_t)(a + 32);
        if (b >= 'A' && b <= 'Z')
            b = (uint8_t)(b + 32);
        if (a != b)
            return 0;
    }
    return 1;
}

static int span_inside(smtpe_span sp, const uint8_t *p, size_t n)
{
    if (sp.len == 0)
        return 1;
    return sp.ptr >= p && sp.ptr + sp.len <= p + n;
}

/* Runs one case; returns 1 if it holds, else prints why and returns 0. */
static int run_case(const path_case *c)
{
    size_t n = c->len ? c->len : strlen(c->in);
    /* An exactly sized heap copy, so that reading past the end shows up under ASan. */
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    memcpy(p, c->in, n);
    smtpe_path path;
    memset(&path, 0x5a, sizeof path);
    size_t used = (size_t)-2;
    int r = smtpe__parse_path(p, n, c->opts, &path, &used);
    int ok = 1;
    if (r != c->result) {
        ok = 0;
        fprintf(stderr, "  result %s, expected %s\n", result_name(r), result_name(c->result));
    } else if (r == SMTPE__PATH_OK) {
        size_t want_used = c->used == ANY_USED ? n : c->used;
        if (used != want_used) {
            ok = 0;
            fprintf(stderr, "  used %zu, expected %zu\n", used, want_used);
        }
        if (path.flags != c->flags) {
            ok = 0;
            fprintf(stderr, "  flags 0x%x, expected 0x%x\n", path.flags, c->flags);
        }
        if (!span_inside(path.mailbox, p, n) || !span_inside(path.local_part, p, n) ||
            !span_inside(path.domain, p, n)) {
            ok = 0;
            fprintf(stderr, "  a span points outside the input\n");
        } else {
            if (c->local) {
                int m = (c->flags & SMTPE_PATH_POSTMASTER) ? span_is_ci(path.local_part, c->local)
                                                           : span_is(path.local_part, c->local);
                if (!m) {
                    ok = 0;
                    print_bytes("  local_part ", path.local_part.ptr, path.local_part.len);
                    fprintf(stderr, "  expected   \"%s\"\n", c->local);
                }
            }
            if (c->domain && !span_is(path.domain, c->domain)) {
                ok = 0;
                print_bytes("  domain ", path.domain.ptr, path.domain.len);
                fprintf(stderr, "  expected \"%s\"\n", c->domain);
            }
            if (path.domain.len) {
                /* mailbox = local-part "@" domain, as sent */
                size_t ml = path.local_part.len + 1 + path.domain.len;
                if (path.mailbox.len != ml ||
                    (path.local_part.len &&
                     memcmp(path.mailbox.ptr, path.local_part.ptr, path.local_part.len) != 0) ||
                    path.mailbox.ptr[path.local_part.len] != '@' ||
                    memcmp(path.mailbox.ptr + path.local_part.len + 1, path.domain.ptr,
                           path.domain.len) != 0) {
                    ok = 0;
                    print_bytes("  mailbox is not local@domain: ", path.mailbox.ptr,
                                path.mailbox.len);
                }
            }
            if ((c->flags & SMTPE_PATH_NULL) &&
                (path.mailbox.len || path.local_part.len || path.domain.len)) {
                ok = 0;
                fprintf(stderr, "  <> has non-empty spans\n");
            }
        }
    }
    if (!ok)
        print_bytes("  input: ", p, n);
    free(p);
    return ok;
}

static void run_cases(const path_case *cases, size_t count)
{
    size_t failures = 0;
    for (size_t i = 0; i < count; i++) {
        if (!run_case(&cases[i])) {
            fprintf(stderr, "  ^ case %zu failed\n", i);
            failures++;
        }
    }
    if (failures)
        fail_msg("%zu of %zu path cases failed (details above)", failures, count);
}

#define RUN(cases) run_cases(cases, sizeof cases / sizeof cases[0])

/* ---- RFC 5321 §4.1.2: dot-string local parts and domains --------------------------------- */
static void test_dot_string(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<a@example.org>", 0, "a", "example.org", 0),
        OK_("<A.B-c_d@EXAMPLE.org>", 0, "A.B-c_d", "EXAMPLE.org", 0),
        OK_("<!#$%&'*+-/=?^_`{|}~@example.org>", 0, "!#$%&'*+-/=?^_`{|}~", "example.org", 0),
        OK_("<a.b.c@x.org>", 0, "a.b.c", "x.org", 0),
        OK_("<0@1.example>", 0, "0", "1.example", 0),
        BAD("<.a@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a.@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a..b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a(b)@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a,b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a\"b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a\\b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a[b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a:b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a;b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a\x7f@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a\tb@x.org>", 0, SMTPE__PATH_SYNTAX),
        {"<a\0b@x.org>", 11, 0, SMTPE__PATH_SYNTAX, NULL, NULL, 0, 0},
        BAD("<;sleep 66;>", ALLOW_NULL, SMTPE__PATH_SYNTAX),       /* OpenSMTPD CVE-2020-7247 */
        BAD("<;sleep 66;>", ALLOW_PM, SMTPE__PATH_SYNTAX),
        BAD("<a>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@b@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("< a@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x.org >", 0, SMTPE__PATH_SYNTAX),
        BAD("<a @x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@example.org", 0, SMTPE__PATH_SYNTAX),
        BAD("<", 0, SMTPE__PATH_SYNTAX),
        BAD("<<a@x.org>>", 0, SMTPE__PATH_SYNTAX),
    };
    RUN(cases);
}

static void test_domain(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<a@x>", 0, "a", "x", 0),
        OK_("<a@123.example>", 0, "a", "123.example", 0),
        OK_("<a@a-b.c-d.org>", 0, "a", "a-b.c-d.org", 0),
        OK_("<a@a--b.org>", 0, "a", "a--b.org", 0),
        BAD("<a@-x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x-.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x..org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@.x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x.org.>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x_y.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x y.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x.org;>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x!.org>", 0, SMTPE__PATH_SYNTAX),
    };
    RUN(cases);
}

/* Path with what follows it: the caller gets the octets used, '>' included. */
static void test_used(void **state)
{
    (void)state;
    static const path_case cases[] = {
        {"<a@b.org> SIZE=1", 0, 0, SMTPE__PATH_OK, "a", "b.org", 0, 9},
        {"<a@b.org>x", 0, 0, SMTPE__PATH_OK, "a", "b.org", 0, 9},
        {"<> BODY=8BITMIME", 0, ALLOW_NULL, SMTPE__PATH_OK, "", "", SMTPE_PATH_NULL, 2},
        {"<postmaster> NOTIFY=NEVER", 0, ALLOW_PM, SMTPE__PATH_OK, "postmaster", "",
         SMTPE_PATH_POSTMASTER, 12},
        {"<\"a> b\"@x.org> X=1", 0, 0, SMTPE__PATH_OK, "\"a> b\"", "x.org", SMTPE_PATH_QUOTED,
         14},
        {"<a@[1.2.3.4]> X", 0, 0, SMTPE__PATH_OK, "a", "[1.2.3.4]", SMTPE_PATH_ADDR_LITERAL, 13},
    };
    RUN(cases);
}

/* Quoted-string local parts reach the host byte-exact, quotes included (K11). */
static void test_quoted(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<\"Pat Rosa\"@example.org>", 0, "\"Pat Rosa\"", "example.org", SMTPE_PATH_QUOTED),
        OK_("<\"odd user\"@example.com>", 0, "\"odd user\"", "example.com", SMTPE_PATH_QUOTED),
        OK_("<\"a\\\"b\\\\c\"@x.org>", 0, "\"a\\\"b\\\\c\"", "x.org", SMTPE_PATH_QUOTED),
        OK_("<\"a@b\"@x.org>", 0, "\"a@b\"", "x.org", SMTPE_PATH_QUOTED),
        OK_("<\"a.>,<(:;)[]\"@x.org>", 0, "\"a.>,<(:;)[]\"", "x.org", SMTPE_PATH_QUOTED),
        OK_("<\"a..b.\"@x.org>", 0, "\"a..b.\"", "x.org", SMTPE_PATH_QUOTED),
        OK_("<\"\\ \"@x.org>", 0, "\"\\ \"", "x.org", SMTPE_PATH_QUOTED),
        OK_("<\"\"@x.org>", 0, "\"\"", "x.org", SMTPE_PATH_QUOTED), /* *QcontentSMTP */
        BAD("<\"abc@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"abc\"x@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<x\"abc\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"a\x01b\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"a\tb\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"a\\\x01\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"a\\\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"a\x7f\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"a\"@>", 0, SMTPE__PATH_SYNTAX),
        {"<\"a\0b\"@x.org>", 13, 0, SMTPE__PATH_SYNTAX, NULL, NULL, 0, 0},
    };
    RUN(cases);
}

/* RFC 5321 §4.1.3 address literals, through the path parser. */
static void test_address_literal(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<test@[192.0.2.123]>", 0, "test", "[192.0.2.123]", SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[0.0.0.0]>", 0, "a", "[0.0.0.0]", SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[255.255.255.255]>", 0, "a", "[255.255.255.255]", SMTPE_PATH_ADDR_LITERAL),
        OK_("<root@[IPv6:2001:db8::25]>", 0, "root", "[IPv6:2001:db8::25]",
            SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:1:2:3:4:5:6:7:8]>", 0, "a", NULL, SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:::]>", 0, "a", "[IPv6:::]", SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:::1]>", 0, "a", NULL, SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:1::]>", 0, "a", NULL, SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:1:2:3::4:5:6]>", 0, "a", NULL, SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:1:2:3:4:5:6:192.0.2.1]>", 0, "a", NULL, SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:::ffff:192.0.2.1]>", 0, "a", NULL, SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[IPv6:ABCD:ef01::1]>", 0, "a", "[IPv6:ABCD:ef01::1]", SMTPE_PATH_ADDR_LITERAL),
        /* ABNF literal text is case-insensitive (RFC 5234 §2.3): "IPv6:" matches "ipv6:" */
        OK_("<a@[ipv6:::1]>", 0, "a", "[ipv6:::1]", SMTPE_PATH_ADDR_LITERAL),
        /* General-address-literal = Standardized-tag ":" 1*dcontent */
        OK_("<a@[x-tag:abc]>", 0, "a", "[x-tag:abc]", SMTPE_PATH_ADDR_LITERAL),
        OK_("<a@[tag:a:b/c]>", 0, "a", "[tag:a:b/c]", SMTPE_PATH_ADDR_LITERAL),
        OK_("<\"q\"@[1.2.3.4]>", 0, "\"q\"", "[1.2.3.4]",
            SMTPE_PATH_ADDR_LITERAL | SMTPE_PATH_QUOTED),
        BAD("<x@[300.1.1.1]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<x@[IPv6:zz::1]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[256.0.0.0]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[1.2.3]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[1.2.3.4.5]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[1..2.3]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[1.2.3.4 ]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[ 1.2.3.4]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[abc]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[1.2.3.4>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[1.2.3.4]x>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@x.[1.2.3.4]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:1:2:3:4:5:6:7:8:9]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:1:2:3:4:5:6:7]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:1:2:3:4:5:6::7]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:1::2::3]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:12345::1]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[IPv6:1.2.3.4]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[tag:]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[tag:a[b]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[tag:a\\b]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[tag:a b]>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@[:abc]>", 0, SMTPE__PATH_SYNTAX),
    };
    RUN(cases);
}

static void test_is_ipv4(void **state)
{
    (void)state;
    static const char *yes[] = {"0.0.0.0", "255.255.255.255", "192.0.2.123", "1.2.3.4",
                                "10.0.0.255"};
    static const char *no[] = {"256.1.1.1", "300.1.1.1", "1.2.3",     "1.2.3.4.5", "1..2.3",
                               "",          "1.2.3.4 ",  "a.b.c.d",   "1.2.3.-4",  "1.2.3.4.",
                               ".1.2.3.4",  "1234.1.1.1", "1.2.3.256", "1.2.3.999", "1.2.3.4x",
                               "1,2,3,4"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!smtpe__is_ipv4((const uint8_t *)yes[i], strlen(yes[i])))
            fail_msg("smtpe__is_ipv4(\"%s\") = 0, expected 1", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (smtpe__is_ipv4((const uint8_t *)no[i], strlen(no[i])))
            fail_msg("smtpe__is_ipv4(\"%s\") = 1, expected 0", no[i]);
    /* the length bounds the scan: "1.2.3.4" inside "1.2.3.45" */
    assert_int_equal(smtpe__is_ipv4((const uint8_t *)"1.2.3.45", 7), 1);
    assert_int_equal(smtpe__is_ipv4((const uint8_t *)"1.2.3.45", 6), 0);
}

/* RFC 5321 §4.1.3: IPv6-full (8 groups), IPv6-comp (at most 6 groups besides "::"),
 * IPv6v4-full (6 groups + IPv4), IPv6v4-comp (at most 4 groups besides "::" + IPv4). */
static void test_is_ipv6(void **state)
{
    (void)state;
    static const char *yes[] = {
        "::",
        "::1",
        "1::",
        "2001:db8::25",
        "1:2:3:4:5:6:7:8",
        "ffff:FFFF:0:00:000:0000:abcd:1",
        "1:2:3::4:5:6",
        "::1:2:3:4:5:6",
        "1:2:3:4:5:6::",
        "1:2:3:4:5:6:1.2.3.4",
        "::ffff:1.2.3.4",
        "::1.2.3.4",
        "1:2:3:4::1.2.3.4",
        "1:2::3:4:1.2.3.4",
        "::1:2:3:4:1.2.3.4",
        "ffff:FFFF::abcd",
    };
    static const char *no[] = {
        "zz::1",
        "1:2:3:4:5:6:7:8:9",
        "1:2:3:4:5:6:7",
        "1:2:3:4:5:6::7",       /* 7 groups besides "::" */
        "::1:2:3:4:5:6:7",
        "1:2:3:4:5:6:7::",
        "1::2::3",
        ":1:2:3:4:5:6:7",
        "1:2:3:4:5:6:7:",
        "12345::1",
        "1:2:3:4:5:1.2.3.4",    /* IPv6v4-full needs 6 groups */
        "1:2:3:4:5:6:7:1.2.3.4",
        "1:2:3::4:5:1.2.3.4",   /* 5 groups besides "::" with IPv4 */
        "1:2:3:4:5::1.2.3.4",
        "::1:2:3:4:5:1.2.3.4",
        "::ffff:300.1.2.3",
        "::ffff:1.2.3",
        "",
        ":",
        ":::",
        "1:::2",
        "::g",
        "1.2.3.4",
        "1:2:3:4:5:6:7:8 ",
        "::1.2.3.4:1",
        "g::",
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!smtpe__is_ipv6((const uint8_t *)yes[i], strlen(yes[i])))
            fail_msg("smtpe__is_ipv6(\"%s\") = 0, expected 1", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (smtpe__is_ipv6((const uint8_t *)no[i], strlen(no[i])))
            fail_msg("smtpe__is_ipv6(\"%s\") = 1, expected 0", no[i]);
}

/* Obsolete source routes (RFC 5321 §4.1.2 A-d-l, Appendix C): accepted and dropped. */
static void test_source_route(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<@a.example,@b.example:u@c.example>", 0, "u", "c.example", SMTPE_PATH_SOURCE_ROUTE),
        OK_("<@a.example:u@c.example>", 0, "u", "c.example", SMTPE_PATH_SOURCE_ROUTE),
        OK_("<@relay.example:\"q r\"@[1.2.3.4]>", 0, "\"q r\"", "[1.2.3.4]",
            SMTPE_PATH_SOURCE_ROUTE | SMTPE_PATH_QUOTED | SMTPE_PATH_ADDR_LITERAL),
        OK_("<@a.example:u@c.example>", ALLOW_PM, "u", "c.example", SMTPE_PATH_SOURCE_ROUTE),
        BAD("<@:u@c.example>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@a.example,b.example:u@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@a.example u@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@a.example:>", ALLOW_NULL, SMTPE__PATH_SYNTAX),
        BAD("<@a.example,@:u@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@a.example,:u@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@-a.example:u@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@a.example;u@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<@a.example:u>", 0, SMTPE__PATH_SYNTAX),
    };
    RUN(cases);
}

/* <> only with ALLOW_NULL; <postmaster> (any case, no domain) only with ALLOW_POSTMASTER. */
static void test_null_and_postmaster(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<>", ALLOW_NULL, "", "", SMTPE_PATH_NULL),
        OK_("<>", ALLOW_NULL | ALLOW_PM, "", "", SMTPE_PATH_NULL),
        BAD("<>", 0, SMTPE__PATH_SYNTAX),
        BAD("<>", ALLOW_PM, SMTPE__PATH_SYNTAX),
        BAD("< >", ALLOW_NULL, SMTPE__PATH_SYNTAX),
        OK_("<postmaster>", ALLOW_PM, "postmaster", "", SMTPE_PATH_POSTMASTER),
        OK_("<PostMaster>", ALLOW_PM, "postmaster", "", SMTPE_PATH_POSTMASTER),
        OK_("<POSTMASTER>", ALLOW_PM, "postmaster", "", SMTPE_PATH_POSTMASTER),
        BAD("<postmaster>", 0, SMTPE__PATH_SYNTAX),
        BAD("<postmaster>", ALLOW_NULL, SMTPE__PATH_SYNTAX),
        BAD("<PostMaster>", 0, SMTPE__PATH_SYNTAX),
        BAD("<postmasters>", ALLOW_PM, SMTPE__PATH_SYNTAX),
        BAD("<postmaste>", ALLOW_PM, SMTPE__PATH_SYNTAX),
        BAD("<\"postmaster\">", ALLOW_PM, SMTPE__PATH_SYNTAX),
        /* with a domain it is an ordinary mailbox */
        OK_("<postmaster@example.org>", ALLOW_PM, "postmaster", "example.org", 0),
        OK_("<postmaster@example.org>", 0, "postmaster", "example.org", 0),
    };
    RUN(cases);
}

/* Missing angle brackets: NO_BRACKETS (aiosmtpd #563/#564), unless lax. */
static void test_brackets(void **state)
{
    (void)state;
    static const path_case cases[] = {
        BAD("alice@example.com", 0, SMTPE__PATH_NO_BRACKETS),
        BAD("alice@example.com", ALLOW_NULL, SMTPE__PATH_NO_BRACKETS),
        BAD("Postmaster", ALLOW_PM, SMTPE__PATH_NO_BRACKETS),
        BAD(" <a@b.org>", 0, SMTPE__PATH_NO_BRACKETS),
        BAD("a@b.org>", 0, SMTPE__PATH_NO_BRACKETS),
        OK_("alice@example.com", LAX, "alice", "example.com", 0),
        {"alice@example.com SIZE=10", 0, LAX, SMTPE__PATH_OK, "alice", "example.com", 0, 17},
        OK_("<alice@example.com>", LAX, "alice", "example.com", 0),
        OK_("\"a b\"@example.com", LAX, "\"a b\"", "example.com", SMTPE_PATH_QUOTED),
        BAD("alice@", LAX, SMTPE__PATH_SYNTAX),
        BAD("al ice@example.com", LAX, SMTPE__PATH_SYNTAX),
        BAD("<alice@example.com", LAX, SMTPE__PATH_SYNTAX),
    };
    RUN(cases);
}

/* RFC 6531 UTF-8 mailboxes: well-formed UTF-8 sets SMTPE_PATH_UTF8; anything malformed is a
 * syntax error (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
static void test_utf8_paths(void **state)
{
    (void)state;
    static const path_case cases[] = {
        OK_("<\xce\xb4\xce\xbf\xce\xba\xce\xb9\xce\xbc\xce\xae@\xcf\x80\xce\xb1\xcf\x81\xce\xac"
            "\xce\xb4\xce\xb5\xce\xb9\xce\xb3\xce\xbc\xce\xb1.\xce\xb4\xce\xbf\xce\xba\xce\xb9"
            "\xce\xbc\xce\xae>",
            0, NULL, NULL, SMTPE_PATH_UTF8),
        OK_("<\xc3\xbc@x.org>", 0, "\xc3\xbc", "x.org", SMTPE_PATH_UTF8),
        OK_("<a@b\xc3\xbc" "cher.example>", 0, "a", "b\xc3\xbc" "cher.example", SMTPE_PATH_UTF8),
        OK_("<\xe2\x82\xac.\xf0\x9f\x98\x80@x.org>", 0, "\xe2\x82\xac.\xf0\x9f\x98\x80", "x.org",
            SMTPE_PATH_UTF8),
        OK_("<\"\xc3\xa9 x\"@x.org>", 0, "\"\xc3\xa9 x\"", "x.org",
            SMTPE_PATH_UTF8 | SMTPE_PATH_QUOTED),
        OK_("<a@x.org>", 0, "a", "x.org", 0),
        BAD("<\xc0\xaf@x.org>", 0, SMTPE__PATH_SYNTAX),         /* overlong '/' */
        BAD("<\xc1\xbf@x.org>", 0, SMTPE__PATH_SYNTAX),         /* overlong */
        BAD("<\xe0\x80\xaf@x.org>", 0, SMTPE__PATH_SYNTAX),     /* overlong, 3 octets */
        BAD("<\xf0\x80\x80\xaf@x.org>", 0, SMTPE__PATH_SYNTAX), /* overlong, 4 octets */
        BAD("<\xed\xa0\x80@x.org>", 0, SMTPE__PATH_SYNTAX),     /* surrogate U+D800 */
        BAD("<\xed\xbf\xbf@x.org>", 0, SMTPE__PATH_SYNTAX),     /* surrogate U+DFFF */
        BAD("<\xc3@x.org>", 0, SMTPE__PATH_SYNTAX),             /* truncated */
        BAD("<a\xe2\x82@x.org>", 0, SMTPE__PATH_SYNTAX),        /* truncated */
        BAD("<\xf4\x90\x80\x80@x.org>", 0, SMTPE__PATH_SYNTAX), /* above U+10FFFF */
        BAD("<\xf5\x80\x80\x80@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\xff@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\xfe@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\x80@x.org>", 0, SMTPE__PATH_SYNTAX),             /* lone continuation */
        BAD("<a@b\xc3.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<a@\xe0\x80\x80.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\"\xc0\xaf\"@x.org>", 0, SMTPE__PATH_SYNTAX),
        BAD("<\xc3>", ALLOW_PM, SMTPE__PATH_SYNTAX),
    };
    RUN(cases);
}

static void test_utf8_seq(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
        size_t want;
    } cases[] = {
        {"\xc3\xa9", 2, 2},
        {"\xc3\xa9" "A", 3, 2},
        {"\xc2\x80", 2, 2},             /* U+0080 */
        {"\xdf\xbf", 2, 2},             /* U+07FF */
        {"\xe0\xa0\x80", 3, 3},         /* U+0800 */
        {"\xe2\x82\xac", 3, 3},
        {"\xed\x9f\xbf", 3, 3},         /* U+D7FF */
        {"\xee\x80\x80", 3, 3},         /* U+E000 */
        {"\xef\xbf\xbf", 3, 3},         /* U+FFFF */
        {"\xf0\x90\x80\x80", 4, 4},     /* U+10000 */
        {"\xf0\x9f\x98\x80", 4, 4},
        {"\xf4\x8f\xbf\xbf", 4, 4},     /* U+10FFFF */
        {"\xc0\x80", 2, 0},
        {"\xc1\xbf", 2, 0},
        {"\xe0\x80\x80", 3, 0},
        {"\xe0\x9f\xbf", 3, 0},         /* U+07FF in three octets */
        {"\xed\xa0\x80", 3, 0},
        {"\xed\xbf\xbf", 3, 0},
        {"\xf0\x8f\xbf\xbf", 4, 0},     /* U+FFFF in four octets */
        {"\xf4\x90\x80\x80", 4, 0},
        {"\xf5\x80\x80\x80", 4, 0},
        {"\xf8\x88\x80\x80\x80", 5, 0},
        {"\xff", 1, 0},
        {"\x80", 1, 0},
        {"\xbf\xbf", 2, 0},
        {"\xc3", 1, 0},
        {"\xe2\x82", 2, 0},
        {"\xf0\x9f\x98", 3, 0},
        {"\xc3\x41", 2, 0},
        {"\xe2\x41\xac", 3, 0},
        {"\xe2\x82\xc3", 3, 0},
        {"\xf0\x9f\x98\x41", 4, 0},
        {"\xe2\x82\xac", 2, 0},         /* n cuts the sequence */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *p = malloc(cases[i].n);
        assert_non_null(p);
        memcpy(p, cases[i].s, cases[i].n);
        size_t got = smtpe__utf8_seq(p, cases[i].n);
        free(p);
        if (got != cases[i].want)
            fail_msg("smtpe__utf8_seq case %zu: got %zu, expected %zu", i, got, cases[i].want);
    }
}

/* RFC 5321 §4.5.3.1.1-3: local-part 64, domain 255, path 256 octets (brackets included). */
static void test_length_limits(void **state)
{
    (void)state;
    char local64[65], local65[66], dom189[190], dom190[191], dom256[257], dom255[256];
    memset(local64, 'a', 64);
    local64[64] = 0;
    memset(local65, 'a', 65);
    local65[65] = 0;
    /* labels of at most 63 octets */
    snprintf(dom189, sizeof dom189, "%.63s.%.63s.%.61s",
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
             "ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
             "ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
    assert_int_equal(strlen(dom189), 189);
    /* one octet more, still in labels of at most 63 octets (RFC 1035 §2.3.4) */
    snprintf(dom190, sizeof dom190, "%.63s.%.63s.%.62s",
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
             "ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
             "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd");
    assert_int_equal(strlen(dom190), 190);
    snprintf(dom255, sizeof dom255, "%.63s.%.63s.%.63s.%.63s",
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
             "ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
             "ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
             "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee");
    assert_int_equal(strlen(dom255), 255);
    snprintf(dom256, sizeof dom256, "f.%.62s.%.63s.%.63s.%.63s",
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
             "ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
             "ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
             "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee");
    assert_int_equal(strlen(dom256), 256);

    char in[600];
    path_case c;

    /* a label of 63 octets is fine, 64 is not (RFC 1035 §2.3.4) */
    smtpe_path label_path;
    size_t label_used;
    snprintf(in, sizeof in, "<a@%.63s.org>", dom255);
    assert_int_equal(smtpe__parse_path((const uint8_t *)in, strlen(in), 0, &label_path,
                                       &label_used),
                     SMTPE__PATH_OK);
    assert_int_equal(label_path.domain.len, 67);
    snprintf(in, sizeof in, "<a@x%.63s.org>", dom255);
    c = (path_case)BAD(in, 0, SMTPE__PATH_SYNTAX);
    assert_true(run_case(&c));

    /* local-part of exactly 64: fine */
    snprintf(in, sizeof in, "<%s@x.org>", local64);
    c = (path_case)OK_(in, 0, local64, "x.org", 0);
    assert_true(run_case(&c));
    /* 65: too long */
    snprintf(in, sizeof in, "<%s@x.org>", local65);
    c = (path_case)BAD(in, 0, SMTPE__PATH_TOO_LONG);
    assert_true(run_case(&c));
    /* a quoted local part of 70 octets: too long */
    snprintf(in, sizeof in, "<\"%.34s %.33s\"@x.org>", local64, local64);
    c = (path_case)BAD(in, 0, SMTPE__PATH_TOO_LONG);
    assert_true(run_case(&c));
    /* path of exactly 256 octets: "<" 64 "@" 189 ">" */
    snprintf(in, sizeof in, "<%s@%s>", local64, dom189);
    assert_int_equal(strlen(in), 256);
    c = (path_case)OK_(in, 0, local64, dom189, 0);
    assert_true(run_case(&c));
    /* 257 */
    snprintf(in, sizeof in, "<%s@%s>", local64, dom190);
    assert_int_equal(strlen(in), 257);
    c = (path_case)BAD(in, 0, SMTPE__PATH_TOO_LONG);
    assert_true(run_case(&c));
    /* a 255-octet domain cannot fit a 256-octet path; a 256-octet one is over any limit */
    snprintf(in, sizeof in, "<a@%s>", dom255);
    c = (path_case)BAD(in, 0, SMTPE__PATH_TOO_LONG);
    assert_true(run_case(&c));
    snprintf(in, sizeof in, "<a@%s>", dom256);
    c = (path_case)BAD(in, 0, SMTPE__PATH_TOO_LONG);
    assert_true(run_case(&c));
    /* too long also with a source route and for RCPT options */
    snprintf(in, sizeof in, "<@relay.example:%s@x.org>", local65);
    c = (path_case)BAD(in, ALLOW_PM, SMTPE__PATH_TOO_LONG);
    assert_true(run_case(&c));
    /* 256 octets of UTF-8 in the local part: too long, not a syntax error */
    {
        char u[300] = "<";
        for (int i = 0; i < 40; i++)
            strcat(u, "\xc3\xa9");
        strcat(u, "@x.org>");
        c = (path_case)BAD(u, 0, SMTPE__PATH_TOO_LONG);
        assert_true(run_case(&c));
    }
}

/* Every prefix of a valid path is incomplete (never OK) and never read past its end. */
/* Every ASCII octet inside a local part and inside a domain label, against RFC 5322 §3.2.3
 * atext (ALPHA, DIGIT, "!#$%&'*+-/=?^_`{|}~") and RFC 5321 Let-dig / "-" (a hyphen is valid
 * inside a label, as here): the octet classes of address.c, all 128 of them. */
static void test_every_ascii_octet(void **state)
{
    (void)state;
    static const char specials[] = "!#$%&'*+-/=?^_`{|}~";
    for (unsigned c = 0; c < 128; c++) {
        uint8_t in[32];
        smtpe_path path;
        size_t used;
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        int atext = alnum || (c != 0 && strchr(specials, (int)c) != NULL);
        int n = snprintf((char *)in, sizeof in, "<aXb@example.org>");
        in[2] = (uint8_t)c;
        int r = smtpe__parse_path(in, (size_t)n, 0, &path, &used);
        /* the whole path, or it stopped early (a '>' in the middle ends a valid one) */
        int ok = r == SMTPE__PATH_OK && used == (size_t)n;
        if (ok != (atext || c == '.')) /* "a.b" is a Dot-string */
            fail_msg("local part with 0x%02x: %d, %zu octets", c, r, used);
        n = snprintf((char *)in, sizeof in, "<ab@exXmple.org>");
        in[6] = (uint8_t)c;
        r = smtpe__parse_path(in, (size_t)n, 0, &path, &used);
        ok = r == SMTPE__PATH_OK && used == (size_t)n;
        if (ok != (alnum || c == '-' || c == '.')) /* "ex.mple.org" is a Domain */
            fail_msg("domain label with 0x%02x: %d, %zu octets", c, r, used);
    }
}

static void test_prefixes(void **state)
{
    (void)state;
    static const char *inputs[] = {"<a@example.org>", "<\"Pat Rosa\"@example.org>",
                                   "<root@[IPv6:2001:db8::25]>", "<@a.example,@b.example:u@c.example>",
                                   "<\xc3\xbc@x.org>"};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        size_t n = strlen(inputs[i]);
        for (size_t k = 0; k < n; k++) {
            uint8_t *p = malloc(k ? k : 1);
            assert_non_null(p);
            memcpy(p, inputs[i], k);
            smtpe_path path;
            size_t used = 0;
            int r = smtpe__parse_path(p, k, ALLOW_NULL | ALLOW_PM, &path, &used);
            free(p);
            if (r == SMTPE__PATH_OK)
                fail_msg("prefix of %zu octets of \"%s\" parsed as a whole path", k, inputs[i]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_string),
        cmocka_unit_test(test_domain),
        cmocka_unit_test(test_used),
        cmocka_unit_test(test_quoted),
        cmocka_unit_test(test_address_literal),
        cmocka_unit_test(test_is_ipv4),
        cmocka_unit_test(test_is_ipv6),
        cmocka_unit_test(test_source_route),
        cmocka_unit_test(test_null_and_postmaster),
        cmocka_unit_test(test_brackets),
        cmocka_unit_test(test_utf8_paths),
        cmocka_unit_test(test_utf8_seq),
        cmocka_unit_test(test_length_limits),
        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_every_ascii_octet),
    };
    return cmocka_run_group_tests_name("address", tests, NULL, NULL);
}
