/*
 * test_data.c - unit tests of engine/data.c: end of DATA content only at CR LF . CR LF (RFC 5321
 * §4.1.1.4, SMTP smuggling), dot-unstuffing (§4.5.2), the bare CR / bare LF / NUL policy, the size
 * limit (RFC 1870), and split invariance: every split of the input gives the same content, the
 * same end position, status and flags.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data.h"
#include "harness.h"

#define NO_END ((size_t)-1)

typedef struct dres {
    hs_buf content;
    size_t end_pos; /* input octets consumed up to and including the end; NO_END if none */
    int status;
    unsigned flags;
    uint64_t size;
    char why[200];  /* misbehaviour of the module, if any */
} dres;

static void dres_free(dres *r) { hs_buf_free(&r->content); }

/* Feeds in[0..n) in pieces: cut positions cuts[0..ncuts) (ascending), or, if sp is given,
 * lengths from the splitter. Every piece is an exactly sized heap copy freed after use, so the
 * module cannot keep pointers into earlier input. */
static void run_data(smtpe_line_ending_policy pol, uint64_t max, const uint8_t *in, size_t n,
                     const size_t *cuts, size_t ncuts, hs_splitter *sp, dres *r)
{
    memset(r, 0, sizeof *r);
    r->end_pos = NO_END;
    smtpe__data d;
    memset(&d, 0xa5, sizeof d);
    smtpe__data_start(&d, pol, max, 1);
    size_t base = 0, ci = 0;
    while (base < n && r->end_pos == NO_END && !r->why[0]) {
        size_t len;
        if (sp)
            len = hs_splitter_next(sp, n - base);
        else
            len = (ci < ncuts ? cuts[ci++] : n) - base;
        if (len == 0)
            continue;
        uint8_t *piece = malloc(len);
        assert_non_null(piece);
        memcpy(piece, in + base, len);
        size_t off = 0;
        int rounds = 0;
        while (off < len) {
            smtpe_span chunk = {NULL, 0};
            int end = 0;
            size_t used = smtpe__data_feed(&d, piece + off, len - off, &chunk, &end);
            if (used > len - off) {
                snprintf(r->why, sizeof r->why, "consumed %zu of %zu octets", used, len - off);
                break;
            }
            if (chunk.len) {
                if (!chunk.ptr) {
                    snprintf(r->why, sizeof r->why, "chunk with NULL pointer");
                    break;
                }
                hs_buf_add(&r->content, chunk.ptr, chunk.len);
            }
            off += used;
            if (end) {
                r->end_pos = base + off;
                break;
            }
            if (used == 0 && chunk.len == 0) {
                snprintf(r->why, sizeof r->why, "no progress at offset %zu", base + off);
                break;
            }
            if (++rounds > 10000000) {
                snprintf(r->why, sizeof r->why, "endless loop");
                break;
            }
        }
        free(piece);
        base += off;
        if (off < len && r->end_pos == NO_END && !r->why[0])
            snprintf(r->why, sizeof r->why, "stopped consuming at %zu", base);
    }
    r->status = d.status;
    r->flags = d.flags;
    r->size = d.size;
}

static void print_esc(const char *what, const uint8_t *p, size_t n)
{
    hs_buf b = {0};
    hs_escape(&b, p, n);
    fprintf(stderr, "%s\"%s\"\n", what, hs_buf_cstr(&b));
    hs_buf_free(&b);
}

static int same_result(const dres *a, const dres *b)
{
    return a->end_pos == b->end_pos && a->status == b->status && a->flags == b->flags &&
           a->content.len == b->content.len &&
           (a->content.len == 0 || memcmp(a->content.p, b->content.p, a->content.len) == 0) &&
           (a->status != SMTPE_DATA_OK || a->size == b->size);
}

static void describe(const char *label, const dres *r)
{
    fprintf(stderr, "  %s: end %zd status %d flags 0x%x size %llu%s%s\n", label,
            r->end_pos == NO_END ? (ssize_t)-1 : (ssize_t)r->end_pos, r->status, r->flags,
            (unsigned long long)r->size, r->why[0] ? " problem: " : "", r->why);
    print_esc("    content ", r->content.p, r->content.len);
}

/* Runs in[0..n) whole, bytewise, at every 2-split, at every 3-split (short inputs) and with
 * pseudo-random splits; every run must agree with the whole run. Returns the whole run. */
static int check_splits(smtpe_line_ending_policy pol, uint64_t max, const uint8_t *in, size_t n,
                        dres *whole)
{
    run_data(pol, max, in, n, NULL, 0, NULL, whole);
    if (whole->why[0]) {
        describe("whole", whole);
        return 0;
    }
    dres r;
    int ok = 1;
    hs_splitter sp;
    hs_splitter_init(&sp, HS_BYTEWISE, 0);
    run_data(pol, max, in, n, NULL, 0, &sp, &r);
    if (r.why[0] || !same_result(whole, &r)) {
        describe("whole", whole);
        describe("bytewise", &r);
        ok = 0;
    }
    dres_free(&r);
    /* every 2-split; for long inputs about 300 of them */
    size_t step = n > 2000 ? n / 300 : 1;
    for (size_t i = 1; ok && i < n; i += step) {
        size_t cuts[1] = {i};
        run_data(pol, max, in, n, cuts, 1, NULL, &r);
        if (r.why[0] || !same_result(whole, &r)) {
            describe("whole", whole);
            fprintf(stderr, "  split at %zu:\n", i);
            describe("split", &r);
            ok = 0;
        }
        dres_free(&r);
    }
    if (n <= 48) {
        for (size_t i = 1; ok && i < n; i++)
            for (size_t j = i + 1; ok && j < n; j++) {
                size_t cuts[2] = {i, j};
                run_data(pol, max, in, n, cuts, 2, NULL, &r);
                if (r.why[0] || !same_result(whole, &r)) {
                    describe("whole", whole);
                    fprintf(stderr, "  split at %zu and %zu:\n", i, j);
                    describe("split", &r);
                    ok = 0;
                }
                dres_free(&r);
            }
    }
    for (uint64_t seed = 1; ok && seed <= 20; seed++) {
        hs_splitter_init(&sp, HS_RANDOM, seed * 7919);
        run_data(pol, max, in, n, NULL, 0, &sp, &r);
        if (r.why[0] || !same_result(whole, &r)) {
            describe("whole", whole);
            fprintf(stderr, "  random split, seed %llu:\n", (unsigned long long)seed);
            describe("random", &r);
            ok = 0;
        }
        dres_free(&r);
    }
    return ok;
}

enum { R = 1, N = 2, K = 4, ALL = 7 };

typedef struct data_case {
    const char *in;
    size_t len;            /* 0: strlen */
    int policies;          /* R|N|K: under which policies this expectation holds */
    uint64_t max;
    size_t end;            /* expected end position; 0: the whole input */
    const char *content;   /* expected content; NULL: not checked (see prefix) */
    size_t content_len;    /* 0: strlen(content) */
    int status;
    unsigned flags;        /* expected flags (status OK only) */
    const char *prefix_of; /* TOO_BIG: the content handed out is a prefix of this;
                            * BAD_LINE_ENDING: the input before the first bad octet; the content
                            * handed out is a prefix of it (the bad octet is not content) */
} data_case;

static const char *pol_name(smtpe_line_ending_policy p)
{
    return p == SMTPE_LINE_ENDING_REFUSE ? "refuse" : p == SMTPE_LINE_ENDING_NORMALISE ? "normalise" : "keep";
}

static void run_data_cases(const data_case *cases, size_t count)
{
    static const smtpe_line_ending_policy pols[3] = {
        SMTPE_LINE_ENDING_REFUSE, SMTPE_LINE_ENDING_NORMALISE, SMTPE_LINE_ENDING_KEEP};
    size_t failures = 0;
    for (size_t i = 0; i < count; i++) {
        const data_case *c = &cases[i];
        size_t n = c->len ? c->len : strlen(c->in);
        for (int pi = 0; pi < 3; pi++) {
            if (!(c->policies & (1 << pi)))
                continue;
            dres w;
            int ok = check_splits(pols[pi], c->max, (const uint8_t *)c->in, n, &w);
            size_t want_end = c->end ? c->end : n;
            if (ok && w.end_pos != want_end) {
                ok = 0;
                fprintf(stderr, "  end at %zd, expected %zu\n",
                        w.end_pos == NO_END ? (ssize_t)-1 : (ssize_t)w.end_pos, want_end);
            }
            if (ok && w.status != c->status) {
                ok = 0;
                fprintf(stderr, "  status %d, expected %d\n", w.status, c->status);
            }
            if (ok && c->status == SMTPE_DATA_OK) {
                if (w.flags != c->flags) {
                    ok = 0;
                    fprintf(stderr, "  flags 0x%x, expected 0x%x\n", w.flags, c->flags);
                }
                if (w.size != w.content.len) {
                    ok = 0;
                    fprintf(stderr, "  size %llu, but %zu octets handed out\n",
                            (unsigned long long)w.size, w.content.len);
                }
            }
            if (ok && c->status == SMTPE_DATA_BAD_LINE_ENDING &&
                (w.flags & SMTPE_DATA_NORMALISED)) {
                ok = 0;
                fprintf(stderr, "  NORMALISED set under refuse\n");
            }
            if (ok && c->content) {
                size_t cl = c->content_len ? c->content_len : strlen(c->content);
                if (w.content.len != cl || !hs_memeq(w.content.p, c->content, cl)) {
                    ok = 0;
                    print_esc("  content  ", w.content.p, w.content.len);
                    print_esc("  expected ", (const uint8_t *)c->content, cl);
                }
            }
            if (ok && c->prefix_of && c->status == SMTPE_DATA_TOO_BIG) {
                size_t pl = strlen(c->prefix_of);
                if (w.content.len > pl || !hs_memeq(w.content.p, c->prefix_of, w.content.len)) {
                    ok = 0;
                    print_esc("  content  ", w.content.p, w.content.len);
                    print_esc("  not a prefix of ", (const uint8_t *)c->prefix_of, pl);
                }
            }
            if (ok && c->prefix_of && c->status == SMTPE_DATA_BAD_LINE_ENDING) {
                /* prefix_of is the input before the first bad octet: what was handed out is a
                 * prefix of it; the bad octet itself is never content (smtpe.h: no further
                 * DATA_CHUNK once the content holds one) */
                size_t pl = strlen(c->prefix_of);
                if (w.content.len > pl || !hs_memeq(w.content.p, c->in, w.content.len)) {
                    ok = 0;
                    print_esc("  content  ", w.content.p, w.content.len);
                    print_esc("  not a prefix of ", (const uint8_t *)c->in, pl);
                }
            }
            if (ok && c->max && w.content.len > c->max) {
                ok = 0;
                fprintf(stderr, "  %zu octets handed out, more than the limit %llu\n",
                        w.content.len, (unsigned long long)c->max);
            }
            if (!ok) {
                print_esc("  input ", (const uint8_t *)c->in, n);
                fprintf(stderr, "  ^ case %zu failed under %s (max %llu)\n", i, pol_name(pols[pi]),
                        (unsigned long long)c->max);
                failures++;
            }
            dres_free(&w);
        }
    }
    if (failures)
        fail_msg("%zu data case(s) failed (details above)", failures);
}

#define RUN(cases) run_data_cases(cases, sizeof cases / sizeof cases[0])
#define OKC(in, pols, content, flags) {in, 0, pols, 0, 0, content, 0, SMTPE_DATA_OK, flags, NULL}

/* Clean input (CRLF only): the same under every policy. */
static void test_end_and_unstuffing(void **state)
{
    (void)state;
    static const data_case cases[] = {
        OKC(".\r\n", ALL, "", 0),                       /* the DATA line's CRLF counts */
        OKC("Hello\r\n.\r\n", ALL, "Hello\r\n", 0),
        OKC("Hello\r\nWorld\r\n.\r\n", ALL, "Hello\r\nWorld\r\n", 0),
        OKC("..\r\n.\r\n", ALL, ".\r\n", 0),
        OKC("...\r\n.\r\n", ALL, "..\r\n", 0),
        OKC("..foo\r\n.\r\n", ALL, ".foo\r\n", 0),
        OKC(".a\r\n.\r\n", ALL, "a\r\n", 0),             /* §4.5.2: the first period is deleted */
        OKC(". \r\n.\r\n", ALL, " \r\n", 0),
        OKC("a.b\r\n.\r\n", ALL, "a.b\r\n", 0),
        OKC("a.\r\n.\r\n", ALL, "a.\r\n", 0),
        OKC("a\r\n..\r\n.\r\n", ALL, "a\r\n.\r\n", 0),
        OKC("a\r\n.x\r\n.\r\n", ALL, "a\r\nx\r\n", 0),
        OKC("\r\n.\r\n", ALL, "\r\n", 0),
        OKC("\r\n\r\n.\r\n", ALL, "\r\n\r\n", 0),
        OKC("a\r\n\r\n.\r\n", ALL, "a\r\n\r\n", 0),
        OKC("a\r\n. \r\n.\r\n", ALL, "a\r\n \r\n", 0),
        OKC("..\r\n..\r\n.\r\n", ALL, ".\r\n.\r\n", 0),
        OKC("\xc3\xa9t\xc3\xa9\r\n.\r\n", ALL, "\xc3\xa9t\xc3\xa9\r\n", SMTPE_DATA_HAS_8BIT),
        OKC("\x80\r\n.\r\n", ALL, "\x80\r\n", SMTPE_DATA_HAS_8BIT),
        OKC(".\x80\r\n.\r\n", ALL, "\x80\r\n", SMTPE_DATA_HAS_8BIT),
        OKC("a\r\n.\x80" "b\r\n.\r\n", ALL, "a\r\n\x80" "b\r\n", SMTPE_DATA_HAS_8BIT),
        OKC(".\x7f\r\n.\r\n", ALL, "\x7f\r\n", 0),
        OKC("\x7f\x01\x1b\r\n.\r\n", ALL, "\x7f\x01\x1b\r\n", 0),
        /* the end is found exactly; what follows is not consumed */
        {"a\r\n.\r\nMAIL FROM:<x@example.org>\r\n", 0, ALL, 0, 6, "a\r\n", 0, SMTPE_DATA_OK, 0,
         NULL},
        {".\r\n.\r\n", 0, ALL, 0, 3, "", 0, SMTPE_DATA_OK, 0, NULL},
        {"..\r\n.\r\n..\r\n.\r\n", 0, ALL, 0, 7, ".\r\n", 0, SMTPE_DATA_OK, 0, NULL},
        /* neither "\r\n.\r" nor ".\r\n" without a line start ends anything */
        OKC("a\r\n.\rb\r\n.\r\n", K, NULL, 0),
        OKC("x.\r\n.\r\n", ALL, "x.\r\n", 0),
        OKC("a\r\n\r\n\r\n..\r\n\r\n.\r\n", ALL, "a\r\n\r\n\r\n.\r\n\r\n", 0),
    };
    RUN(cases);
}

/* Bare LF, bare CR and NUL: REFUSE reads to the end and reports; NORMALISE writes CRLF (a
 * normalised line break never starts a line) and drops NUL; KEEP keeps them. No sequence but
 * CRLF.CRLF ends the content (SMTP smuggling, K01-K03). */
static void test_bare_line_endings(void **state)
{
    (void)state;
#define BADR(in, prefix) {in, 0, R, 0, 0, NULL, 0, SMTPE_DATA_BAD_LINE_ENDING, 0, prefix}
    static const data_case cases[] = {
        /* K01 */
        BADR("hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
             "forged\r\n.\r\n", "hi"),
        OKC("hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
            "forged\r\n.\r\n", N,
            "hi\r\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
            "forged\r\n", SMTPE_DATA_NORMALISED),
        OKC("hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
            "forged\r\n.\r\n", K,
            "hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
            "forged\r\n", 0),
        /* K02 */
        BADR("line1\nline2\n.\n\r\n.\r\n", "line1"),
        OKC("line1\nline2\n.\n\r\n.\r\n", N, "line1\r\nline2\r\n.\r\n\r\n", SMTPE_DATA_NORMALISED),
        OKC("line1\nline2\n.\n\r\n.\r\n", K, "line1\nline2\n.\n\r\n", 0),
        /* K03 */
        BADR("Hello\nWorld\r\n.\r\n", "Hello"),
        OKC("Hello\nWorld\r\n.\r\n", N, "Hello\r\nWorld\r\n", SMTPE_DATA_NORMALISED),
        OKC("Hello\nWorld\r\n.\r\n", K, "Hello\nWorld\r\n", 0),
        /* bare CR */
        BADR("a\rb\r\n.\r\n", "a"),
        OKC("a\rb\r\n.\r\n", N, "a\r\nb\r\n", SMTPE_DATA_NORMALISED),
        OKC("a\rb\r\n.\r\n", K, "a\rb\r\n", 0),
        BADR("a\r\r\n.\r\n", "a"),
        OKC("a\r\r\n.\r\n", N, "a\r\n\r\n", SMTPE_DATA_NORMALISED),
        OKC("a\r\r\n.\r\n", K, "a\r\r\n", 0),
        BADR("hi\r.\r\nX\r\n.\r\n", "hi"),
        OKC("hi\r.\r\nX\r\n.\r\n", N, "hi\r\n.\r\nX\r\n", SMTPE_DATA_NORMALISED),
        OKC("hi\r.\r\nX\r\n.\r\n", K, "hi\r.\r\nX\r\n", 0),
        /* a bare LF right at the start: the "." after it does not start a line */
        BADR("\n.\r\n\r\n.\r\n", ""),
        OKC("\n.\r\n\r\n.\r\n", N, "\r\n.\r\n\r\n", SMTPE_DATA_NORMALISED),
        OKC("\n.\r\n\r\n.\r\n", K, "\n.\r\n\r\n", 0),
        /* LF before the real CRLF.CRLF */
        BADR("a\n\r\n.\r\n", "a"),
        OKC("a\n\r\n.\r\n", N, "a\r\n\r\n", SMTPE_DATA_NORMALISED),
        OKC("a\n\r\n.\r\n", K, "a\n\r\n", 0),
        /* NUL */
        {"a\0b\r\n.\r\n", 8, R, 0, 0, NULL, 0, SMTPE_DATA_BAD_LINE_ENDING, 0, "a\0"},
        {"a\0b\r\n.\r\n", 8, N, 0, 0, "ab\r\n", 0, SMTPE_DATA_OK, SMTPE_DATA_NORMALISED, NULL},
        {"a\0b\r\n.\r\n", 8, K, 0, 0, "a\0b\r\n", 5, SMTPE_DATA_OK, 0, NULL},
        /* the bad octet late in the content: the chunks before it are a prefix of the input */
        BADR("first line\r\nsecond line\r\nthird\nline\r\n.\r\n", "first line\r\nsecond line\r\nthird"),
        /* normalised with 8-bit content */
        OKC("\xc3\xa9\n\r\n.\r\n", N, "\xc3\xa9\r\n\r\n", SMTPE_DATA_NORMALISED | SMTPE_DATA_HAS_8BIT),
    };
    RUN(cases);
#undef BADR
}

/* Inputs that would end the content if a bare LF / CR were taken for CRLF, or if NUL were dropped
 * before looking for the end: under every policy the only end is the real CRLF.CRLF. */
static void test_no_false_end(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t len;
    } inputs[] = {
        {"a\n.\nb\r\n.\r\n", 0},
        {"a\r.\rb\r\n.\r\n", 0},
        {"a\n.\r\nb\r\n.\r\n", 0},
        {"a\r\n.\nb\r\n.\r\n", 0},
        {"a\r\n.\rb\r\n.\r\n", 0},
        {"a\r\n.\n\r\n.\r\n", 0},
        {"a\r.\n\r\n.\r\n", 0},
        {"a\n\n.\n\n\r\n.\r\n", 0},
        {"a\r\n\0.\r\nb\r\n.\r\n", 13},
        {"a\r\n.\0\r\nb\r\n.\r\n", 13},
        {"a\r\0\n.\r\nb\r\n.\r\n", 13},
        {"a\r\n.\r\0\nb\r\n.\r\n", 13},
        {"a\0\r\n.\r\n", 7}, /* here the CRLF.CRLF is real */
        {"\n.\n\r\n.\r\n", 0},
        {"\r.\r\n\r\n.\r\n", 0},
        {"a\r\n..\n.\r\n\r\n.\r\n", 0},
    };
    static const smtpe_line_ending_policy pols[3] = {
        SMTPE_LINE_ENDING_REFUSE, SMTPE_LINE_ENDING_NORMALISE, SMTPE_LINE_ENDING_KEEP};
    size_t failures = 0;
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        const char *in = inputs[i].in;
        size_t n = inputs[i].len ? inputs[i].len : strlen(in);
        for (int pi = 0; pi < 3; pi++) {
            dres w;
            int ok = check_splits(pols[pi], 0, (const uint8_t *)in, n, &w);
            if (ok && w.end_pos != n) {
                ok = 0;
                fprintf(stderr, "  end at %zd, expected %zu (the only CRLF.CRLF)\n",
                        w.end_pos == NO_END ? (ssize_t)-1 : (ssize_t)w.end_pos, n);
            }
            int want_status = pols[pi] == SMTPE_LINE_ENDING_REFUSE ? SMTPE_DATA_BAD_LINE_ENDING
                                                                    : SMTPE_DATA_OK;
            if (ok && w.status != want_status) {
                ok = 0;
                fprintf(stderr, "  status %d, expected %d\n", w.status, want_status);
            }
            if (ok && pols[pi] == SMTPE_LINE_ENDING_NORMALISE &&
                !(w.flags & SMTPE_DATA_NORMALISED)) {
                ok = 0;
                fprintf(stderr, "  NORMALISED not set\n");
            }
            if (ok && pols[pi] == SMTPE_LINE_ENDING_NORMALISE) {
                /* normalised content holds no bare CR, bare LF or NUL */
                const uint8_t *p = w.content.p;
                for (size_t k = 0; ok && k < w.content.len; k++) {
                    if (p[k] == 0 || (p[k] == '\r' && (k + 1 >= w.content.len || p[k + 1] != '\n')) ||
                        (p[k] == '\n' && (k == 0 || p[k - 1] != '\r'))) {
                        ok = 0;
                        print_esc("  normalised content holds a bare octet: ", p, w.content.len);
                    }
                }
            }
            if (!ok) {
                print_esc("  input ", (const uint8_t *)in, n);
                fprintf(stderr, "  ^ input %zu failed under %s\n", i, pol_name(pols[pi]));
                failures++;
            }
            dres_free(&w);
        }
    }
    if (failures)
        fail_msg("%zu false-end case(s) failed", failures);
}

/* max_message_size: content over the limit gives SMTPE_DATA_TOO_BIG, no more chunks, and the end
 * is still found. The limit counts content octets after unstuffing (and normalising). */
static void test_size_limit(void **state)
{
    (void)state;
#define SZ(in, pols, max, status, content, prefix) {in, 0, pols, max, 0, content, 0, status, 0, \
    prefix}
    static const data_case cases[] = {
        SZ("12345\r\n.\r\n", ALL, 7, SMTPE_DATA_OK, "12345\r\n", NULL),
        SZ("12345\r\n.\r\n", ALL, 6, SMTPE_DATA_TOO_BIG, NULL, "12345\r\n"),
        SZ("12345\r\n.\r\n", ALL, 1, SMTPE_DATA_TOO_BIG, NULL, "12345\r\n"),
        SZ("..23\r\n.\r\n", ALL, 5, SMTPE_DATA_OK, ".23\r\n", NULL),
        SZ("..23\r\n.\r\n", ALL, 4, SMTPE_DATA_TOO_BIG, NULL, ".23\r\n"),
        SZ(".\r\n", ALL, 1, SMTPE_DATA_OK, "", NULL),
        {"a\nb\r\n.\r\n", 0, N, 6, 0, "a\r\nb\r\n", 0, SMTPE_DATA_OK, SMTPE_DATA_NORMALISED, NULL},
        {"a\nb\r\n.\r\n", 0, N, 5, 0, NULL, 0, SMTPE_DATA_TOO_BIG, 0, NULL},
        {"a\r\nb\r\n.\r\nNOOP\r\n", 0, ALL, 3, 9, NULL, 0, SMTPE_DATA_TOO_BIG, 0,
         "a\r\nb\r\n"},
    };
    RUN(cases);
#undef SZ
    /* 5000 octets against 2000 (K13): read to the end, not more than the limit handed out */
    hs_buf in = {0};
    for (int i = 0; i < 50; i++) {
        char line[101];
        memset(line, 'a' + i % 26, 98);
        memcpy(line + 98, "\r\n", 3);
        hs_buf_adds(&in, line);
    }
    assert_int_equal(in.len, 5000);
    hs_buf_adds(&in, ".\r\nNOOP\r\n");
    dres w;
    assert_true(check_splits(SMTPE_LINE_ENDING_REFUSE, 2000, in.p, in.len, &w));
    assert_int_equal(w.status, SMTPE_DATA_TOO_BIG);
    assert_int_equal(w.end_pos, 5003);
    assert_true(w.content.len <= 2000);
    assert_memory_equal(w.content.p, in.p, w.content.len);
    dres_free(&w);
    /* the same under 5000 exactly and 0 (no limit) */
    assert_true(check_splits(SMTPE_LINE_ENDING_REFUSE, 5000, in.p, in.len, &w));
    assert_int_equal(w.status, SMTPE_DATA_OK);
    assert_int_equal(w.content.len, 5000);
    assert_int_equal(w.size, 5000);
    dres_free(&w);
    assert_true(check_splits(SMTPE_LINE_ENDING_REFUSE, 4999, in.p, in.len, &w));
    assert_int_equal(w.status, SMTPE_DATA_TOO_BIG);
    assert_int_equal(w.end_pos, 5003);
    dres_free(&w);
    assert_true(check_splits(SMTPE_LINE_ENDING_KEEP, 0, in.p, in.len, &w));
    assert_int_equal(w.status, SMTPE_DATA_OK);
    assert_int_equal(w.content.len, 5000);
    dres_free(&w);
    hs_buf_free(&in);
}

/* Both a too-big and a bad line ending: either status, but the end is still found and nothing
 * past the first problem is handed out. */
static void test_too_big_and_bare(void **state)
{
    (void)state;
    const char *in = "0123456789\r\nab\ncd\r\n.\r\n";
    size_t n = strlen(in);
    dres w;
    assert_true(check_splits(SMTPE_LINE_ENDING_REFUSE, 4, (const uint8_t *)in, n, &w));
    assert_int_equal(w.end_pos, n);
    assert_int_not_equal(w.status, SMTPE_DATA_OK);
    assert_true(w.content.len <= 4);
    dres_free(&w);
}

/* An independent reference for clean (CRLF-only) input: lines up to the line ".", each with a
 * leading period removed. */
static size_t reference_unstuff(const uint8_t *in, size_t n, hs_buf *out)
{
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j + 1 < n && !(in[j] == '\r' && in[j + 1] == '\n'))
            j++;
        if (j + 1 >= n)
            return NO_END;
        /* line in[i..j), CRLF at j */
        if (j - i == 1 && in[i] == '.')
            return j + 2;
        size_t s = (j > i && in[i] == '.') ? i + 1 : i;
        hs_buf_add(out, in + s, j - s);
        hs_buf_adds(out, "\r\n");
        i = j + 2;
    }
}

static void test_random_clean_content(void **state)
{
    (void)state;
    uint64_t rng = 42;
    for (int round = 0; round < 30; round++) {
        hs_buf in = {0}, ref = {0};
        size_t lines = 1 + (size_t)(round * 37 % 200);
        for (size_t l = 0; l < lines; l++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            unsigned kind = (unsigned)(rng >> 60);
            size_t len = (size_t)(rng >> 40) % 90;
            if (kind < 3)
                hs_buf_adds(&in, ".");
            if (kind == 3)
                hs_buf_adds(&in, "..");
            for (size_t k = 0; k < len; k++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                static const char alphabet[] = "abc. \t\x80\xc3.";
                char ch = alphabet[(rng >> 33) % (sizeof alphabet - 1)];
                hs_buf_add(&in, &ch, 1);
            }
            if (kind == 4 && len == 0)
                hs_buf_adds(&in, "x");
            hs_buf_adds(&in, "\r\n");
        }
        /* a lone "." line in the middle would end early; the reference knows */
        hs_buf_adds(&in, ".\r\nQUIT\r\n");
        size_t want_end = reference_unstuff(in.p, in.len, &ref);
        assert_true(want_end != NO_END);
        dres w;
        int ok = check_splits(SMTPE_LINE_ENDING_REFUSE, 0, in.p, in.len, &w);
        if (ok && (w.end_pos != want_end || w.content.len != ref.len ||
                   !hs_memeq(w.content.p, ref.p, ref.len) || w.status != SMTPE_DATA_OK)) {
            describe("engine", &w);
            print_esc("  reference ", ref.p, ref.len);
            ok = 0;
        }
        dres_free(&w);
        hs_buf_free(&in);
        hs_buf_free(&ref);
        if (!ok)
            fail_msg("random clean content, round %d", round);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_end_and_unstuffing),
        cmocka_unit_test(test_bare_line_endings),
        cmocka_unit_test(test_no_false_end),
        cmocka_unit_test(test_size_limit),
        cmocka_unit_test(test_too_big_and_bare),
        cmocka_unit_test(test_random_clean_content),
    };
    return cmocka_run_group_tests_name("data", tests, NULL, NULL);
}
