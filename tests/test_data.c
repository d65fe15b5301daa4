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

/* ==========================================================================================
 * Client side: the content encoder (smtpe__stuff_*) and the content scanner
 * (smtpe_content_scan). RFC 5321 §4.5.2 (a line-start "." doubled), §2.3.8 (no bare CR or LF
 * on the wire), §4.1.1.4 (CRLF "." CRLF ends DATA), RFC 1870 (SIZE), RFC 3030 (BDAT,
 * BINARYMIME). Every result is compared with an independent reference encoder below, which
 * looks ahead in the whole content where the engine holds a CR, and is checked over every
 * split and every output cap.
 * ======================================================================================== */

#define C8 SMTPE_CONTENT_8BIT
#define CNUL SMTPE_CONTENT_NUL
#define CCR SMTPE_CONTENT_BARE_CR
#define CLF SMTPE_CONTENT_BARE_LF
#define CLONG SMTPE_CONTENT_LONG_LINE
#define SD SMTPE__STUFF_DATA
#define SB SMTPE__STUFF_BDAT
#define SY SMTPE__STUFF_BINARY
#define PR SMTPE_LINE_ENDING_REFUSE
#define PN SMTPE_LINE_ENDING_NORMALISE

typedef struct sres {
    hs_buf out;        /* wire octets, smtpe__stuff_finish's included (unless refused) */
    uint64_t consumed; /* content octets consumed */
    unsigned seen, refused;
    char why[200];     /* misbehaviour of the module, if any */
} sres;

static void sres_free(sres *r) { hs_buf_free(&r->out); }

/* The reference encoder: whole content, looking ahead for a CR's LF. A refused bare CR is
 * consumed (the engine held it), the octet after it is not; any other refused octet is not
 * consumed. */
static void ref_stuff(int mode, smtpe_line_ending_policy pol, unsigned mask, const uint8_t *in,
                      size_t n, sres *r)
{
    memset(r, 0, sizeof *r);
    int bol = 1, ended = 0;
    size_t len = 0, i = 0;
    if (mode == SY)
        mask = 0;
    else if (pol == PR)
        mask |= CCR | CLF;
    while (i < n) {
        uint8_t c = in[i];
        if (c == '\r' && i + 1 < n && in[i + 1] == '\n') {
            if (mode == SY)
                hs_buf_add(&r->out, "\r\n", 2);
            else
                hs_buf_adds(&r->out, "\r\n");
            i += 2;
            bol = ended = 1;
            len = 0;
            continue;
        }
        if (c == '\r' || c == '\n') {
            unsigned f = c == '\r' ? CCR : CLF;
            r->seen |= f;
            if (mask & f) {
                r->refused = f;
                r->consumed = c == '\r' ? i + 1 : i;
                return;
            }
            if (mode == SY)
                hs_buf_add(&r->out, &c, 1);
            else
                hs_buf_adds(&r->out, "\r\n");
            i++;
            bol = ended = 1;
            len = 0;
            continue;
        }
        unsigned f = (c == 0 ? CNUL : 0) | (c >= 0x80 ? C8 : 0) | (len >= 998 ? CLONG : 0);
        r->seen |= f;
        if (f & mask) {
            unsigned m = f & mask;
            r->refused = m & (~m + 1u);
            r->consumed = i;
            return;
        }
        if (mode == SD && bol && c == '.')
            hs_buf_adds(&r->out, ".");
        hs_buf_add(&r->out, &c, 1);
        bol = ended = 0;
        len++;
        i++;
    }
    r->consumed = n;
    if (mode != SY && n > 0 && !ended)
        hs_buf_adds(&r->out, "\r\n");
    if (mode == SD)
        hs_buf_adds(&r->out, ".\r\n");
}

/* Runs the engine over in[0..n) in pieces (cut positions cuts[0..ncuts), or lengths from sp),
 * each an exactly sized heap copy; the output caps cycle through caps[0..ncaps) (none: 4096).
 * Every output buffer has canaries after its cap. */
static void run_stuff(int mode, smtpe_line_ending_policy pol, unsigned mask, const uint8_t *in,
                      size_t n, const size_t *cuts, size_t ncuts, hs_splitter *sp,
                      const size_t *caps, size_t ncaps, sres *r)
{
    memset(r, 0, sizeof *r);
    smtpe__stuffer st;
    memset(&st, 0xa5, sizeof st);
    smtpe__stuff_start(&st, mode, pol, mask);
    size_t base = 0, ci = 0, capi = 0;
    while (base < n && !st.refused && !r->why[0]) {
        size_t len = sp ? hs_splitter_next(sp, n - base) : (ci < ncuts ? cuts[ci++] : n) - base;
        if (len == 0)
            continue;
        uint8_t *piece = malloc(len);
        assert_non_null(piece);
        memcpy(piece, in + base, len);
        size_t off = 0, stalls = 0;
        while (off < len && !st.refused) {
            size_t cap = ncaps ? caps[capi++ % ncaps] : 4096, w = 12345;
            uint8_t *buf = malloc(cap + 8);
            assert_non_null(buf);
            memset(buf, 0xa5, cap + 8);
            size_t used = smtpe__stuff_encode(&st, piece + off, len - off, buf, cap, &w);
            int canary = 1;
            for (size_t k = cap; k < cap + 8; k++)
                canary &= buf[k] == 0xa5;
            if (used > len - off || w > cap || !canary)
                snprintf(r->why, sizeof r->why, "consumed %zu of %zu, wrote %zu into %zu%s", used,
                         len - off, w, cap, canary ? "" : ", past the cap");
            else if (used == 0 && cap >= 4 && !st.refused)
                snprintf(r->why, sizeof r->why, "cap %zu: nothing consumed at %zu", cap,
                         base + off);
            else if (used == 0 && w == 0 && !st.refused && ++stalls > ncaps)
                snprintf(r->why, sizeof r->why, "no progress at %zu", base + off);
            if (used || w)
                stalls = 0;
            if (!r->why[0])
                hs_buf_add(&r->out, buf, w);
            free(buf);
            if (r->why[0])
                break;
            off += used;
        }
        free(piece);
        base += off;
    }
    if (!st.refused && !r->why[0]) {
        uint8_t fin[SMTPE__STUFF_FINISH_MAX + 8];
        memset(fin, 0xa5, sizeof fin);
        size_t f = smtpe__stuff_finish(&st, fin);
        int canary = 1;
        for (size_t k = SMTPE__STUFF_FINISH_MAX; k < sizeof fin; k++)
            canary &= fin[k] == 0xa5;
        if (f > 5 || !canary)
            snprintf(r->why, sizeof r->why, "finish wrote %zu octets", f);
        else
            hs_buf_add(&r->out, fin, f);
    }
    if (!r->why[0] && st.in_octets != base)
        snprintf(r->why, sizeof r->why, "in_octets %llu, consumed %zu",
                 (unsigned long long)st.in_octets, base);
    if (!r->why[0] && st.out_octets != r->out.len)
        snprintf(r->why, sizeof r->why, "out_octets %llu, wrote %zu",
                 (unsigned long long)st.out_octets, r->out.len);
    r->consumed = base;
    r->seen = st.seen;
    r->refused = st.refused;
}

static int same_sres(const sres *a, const sres *b)
{
    return !a->why[0] && !b->why[0] && a->consumed == b->consumed && a->seen == b->seen &&
           a->refused == b->refused && a->out.len == b->out.len &&
           hs_memeq(a->out.p, b->out.p, a->out.len);
}

static void describe_sres(const char *label, const sres *r)
{
    fprintf(stderr, "  %s: consumed %llu seen 0x%x refused 0x%x%s%s\n", label,
            (unsigned long long)r->consumed, r->seen, r->refused, r->why[0] ? " problem: " : "",
            r->why);
    print_esc("    wire ", r->out.p, r->out.len);
}

/* The engine over in[0..n) whole must equal the reference, and so must every other way of
 * feeding it: one octet at a time, every 2-split, every 3-split (short inputs), random splits,
 * and output caps cycling through small values. *whole gets the whole run. */
static int check_stuff(int mode, smtpe_line_ending_policy pol, unsigned mask, const uint8_t *in,
                       size_t n, sres *whole)
{
    static const size_t cap_sets[][4] = {{0, 1, 2, 3}, {1, 2}, {2}, {3}, {4}, {5}, {3, 0}};
    static const size_t cap_lens[] = {4, 2, 1, 1, 1, 1, 2};
    sres ref, r;
    hs_splitter sp;
    int ok = 1;
    ref_stuff(mode, pol, mask, in, n, &ref);
    run_stuff(mode, pol, mask, in, n, NULL, 0, NULL, NULL, 0, whole);
    if (!same_sres(&ref, whole)) {
        describe_sres("reference", &ref);
        describe_sres("whole", whole);
        ok = 0;
    }
    sres_free(&ref);
    hs_splitter_init(&sp, HS_BYTEWISE, 0);
    run_stuff(mode, pol, mask, in, n, NULL, 0, &sp, NULL, 0, &r);
    if (ok && !same_sres(whole, &r)) {
        describe_sres("whole", whole);
        describe_sres("bytewise", &r);
        ok = 0;
    }
    sres_free(&r);
    size_t step = n > 2000 ? n / 300 : 1;
    for (size_t i = 1; ok && i < n; i += step) {
        size_t cuts[1] = {i};
        run_stuff(mode, pol, mask, in, n, cuts, 1, NULL, NULL, 0, &r);
        if (!same_sres(whole, &r)) {
            describe_sres("whole", whole);
            fprintf(stderr, "  split at %zu:\n", i);
            describe_sres("split", &r);
            ok = 0;
        }
        sres_free(&r);
    }
    for (size_t i = 1; ok && n <= 24 && i < n; i++)
        for (size_t j = i + 1; ok && j < n; j++) {
            size_t cuts[2] = {i, j};
            run_stuff(mode, pol, mask, in, n, cuts, 2, NULL, NULL, 0, &r);
            if (!same_sres(whole, &r)) {
                describe_sres("whole", whole);
                fprintf(stderr, "  split at %zu and %zu:\n", i, j);
                describe_sres("split", &r);
                ok = 0;
            }
            sres_free(&r);
        }
    for (size_t c = 0; ok && c < sizeof cap_lens / sizeof cap_lens[0]; c++)
        for (int bytewise = 0; ok && bytewise < 2; bytewise++) {
            hs_splitter_init(&sp, HS_BYTEWISE, 0);
            run_stuff(mode, pol, mask, in, n, NULL, 0, bytewise ? &sp : NULL, cap_sets[c],
                      cap_lens[c], &r);
            if (!same_sres(whole, &r)) {
                describe_sres("whole", whole);
                fprintf(stderr, "  caps set %zu%s:\n", c, bytewise ? ", bytewise" : "");
                describe_sres("capped", &r);
                ok = 0;
            }
            sres_free(&r);
        }
    for (uint64_t seed = 1; ok && seed <= 10; seed++) {
        size_t caps[7];
        for (size_t k = 0; k < 7; k++)
            caps[k] = (size_t)((seed * 31 + k * 17) % 9) * (k == 6 ? 500 : 1);
        caps[(size_t)seed % 7] = 2; /* progress */
        hs_splitter_init(&sp, HS_RANDOM, seed * 104729);
        run_stuff(mode, pol, mask, in, n, NULL, 0, &sp, caps, 7, &r);
        if (!same_sres(whole, &r)) {
            describe_sres("whole", whole);
            fprintf(stderr, "  random split and caps, seed %llu:\n", (unsigned long long)seed);
            describe_sres("random", &r);
            ok = 0;
        }
        sres_free(&r);
    }
    return ok;
}

static const char *stuff_mode_name(int mode)
{
    return mode == SD ? "DATA" : mode == SB ? "BDAT" : "BINARY";
}

typedef struct stuff_case {
    const char *in;
    size_t len;   /* 0: strlen */
    int mode;
    smtpe_line_ending_policy pol;
    unsigned mask;
    const char *wire; /* the expected wire octets, finish included unless refused */
    size_t wire_len;  /* 0: strlen */
    unsigned refused;
    long consumed;    /* -1: all of in */
    unsigned seen;
} stuff_case;

static void run_stuff_cases(const stuff_case *cases, size_t count)
{
    size_t failures = 0;
    for (size_t i = 0; i < count; i++) {
        const stuff_case *c = &cases[i];
        size_t n = c->len ? c->len : strlen(c->in);
        size_t wl = c->wire_len ? c->wire_len : strlen(c->wire);
        sres w;
        int ok = check_stuff(c->mode, c->pol, c->mask, (const uint8_t *)c->in, n, &w);
        if (ok && (w.out.len != wl || !hs_memeq(w.out.p, c->wire, wl))) {
            print_esc("  wire     ", w.out.p, w.out.len);
            print_esc("  expected ", (const uint8_t *)c->wire, wl);
            ok = 0;
        }
        if (ok && w.refused != c->refused) {
            fprintf(stderr, "  refused 0x%x, expected 0x%x\n", w.refused, c->refused);
            ok = 0;
        }
        if (ok && w.consumed != (c->consumed < 0 ? n : (size_t)c->consumed)) {
            fprintf(stderr, "  consumed %llu, expected %ld\n", (unsigned long long)w.consumed,
                    c->consumed);
            ok = 0;
        }
        if (ok && w.seen != c->seen) {
            fprintf(stderr, "  seen 0x%x, expected 0x%x\n", w.seen, c->seen);
            ok = 0;
        }
        if (!ok) {
            print_esc("  input ", (const uint8_t *)c->in, n);
            fprintf(stderr, "  ^ stuff case %zu failed (%s, policy %d, mask 0x%x)\n", i,
                    stuff_mode_name(c->mode), (int)c->pol, c->mask);
            failures++;
        }
        sres_free(&w);
    }
    if (failures)
        fail_msg("%zu stuff case(s) failed (details above)", failures);
}

#define SOK(in, mode, pol, mask, wire, seen) {in, 0, mode, pol, mask, wire, 0, 0, -1, seen}
#define SREF(in, mode, pol, mask, wire, refused, consumed, seen)                                \
    {in, 0, mode, pol, mask, wire, 0, refused, consumed, seen}

/* DATA: dot-stuffing, the final CRLF and ".\r\n", bare CR and LF normalised or refused. */
static void test_stuff_data(void **state)
{
    (void)state;
    static const stuff_case cases[] = {
        SOK("", SD, PN, 0, ".\r\n", 0), /* the DATA command's CRLF ends the line before */
        SOK("", SD, PR, 0, ".\r\n", 0),
        SOK("abc", SD, PN, 0, "abc\r\n.\r\n", 0),
        SOK("abc\r\n", SD, PR, 0, "abc\r\n.\r\n", 0),
        SOK("abc\r\ndef", SD, PR, 0, "abc\r\ndef\r\n.\r\n", 0),
        SOK(".", SD, PN, 0, "..\r\n.\r\n", 0),
        SOK(".\r\n", SD, PR, 0, "..\r\n.\r\n", 0),
        SOK("..x", SD, PR, 0, "...x\r\n.\r\n", 0),
        SOK("a.b\r\n.c\r\n..\r\n", SD, PR, 0, "a.b\r\n..c\r\n...\r\n.\r\n", 0),
        SOK("x\r\n.\r\ny", SD, PR, 0, "x\r\n..\r\ny\r\n.\r\n", 0),
        SOK("\r\n", SD, PR, 0, "\r\n.\r\n", 0),
        SOK("\r\n\r\n.", SD, PR, 0, "\r\n\r\n..\r\n.\r\n", 0),
        SOK("a\nb", SD, PN, 0, "a\r\nb\r\n.\r\n", CLF),
        SOK("a\rb", SD, PN, 0, "a\r\nb\r\n.\r\n", CCR),
        SOK("a\r\r\nb", SD, PN, 0, "a\r\n\r\nb\r\n.\r\n", CCR), /* bare CR, then CRLF */
        SOK("a\r", SD, PN, 0, "a\r\n.\r\n", CCR),
        SOK("\r", SD, PN, 0, "\r\n.\r\n", CCR),
        SOK("\n", SD, PN, 0, "\r\n.\r\n", CLF),
        SOK("\n\r", SD, PN, 0, "\r\n\r\n.\r\n", CCR | CLF),
        SOK("\r\r", SD, PN, 0, "\r\n\r\n.\r\n", CCR),
        SOK("\n\n", SD, PN, 0, "\r\n\r\n.\r\n", CLF),
        SOK("\n\r\n", SD, PN, 0, "\r\n\r\n.\r\n", CLF),
        /* SMTP smuggling: a dot after a normalised line break is at a line start on the wire */
        SOK("a\n.\r\nMAIL FROM:<x>\r\n", SD, PN, 0, "a\r\n..\r\nMAIL FROM:<x>\r\n.\r\n", CLF),
        SOK("a\r.\r\n", SD, PN, 0, "a\r\n..\r\n.\r\n", CCR),
        SOK("a\r\n.\n", SD, PN, 0, "a\r\n..\r\n.\r\n", CLF),
        SOK("\n.\n", SD, PN, 0, "\r\n..\r\n.\r\n", CLF),
        SOK("\r.\r", SD, PN, 0, "\r\n..\r\n.\r\n", CCR),
        SOK("a\r\r.", SD, PN, 0, "a\r\n\r\n..\r\n.\r\n", CCR),
        /* NUL and 8-bit octets pass unless refused; seen either way */
        {"a\0b", 3, SD, PN, 0, "a\0b\r\n.\r\n", 8, 0, -1, CNUL},
        SOK("\xc3\xa9t\xc3\xa9", SD, PR, 0, "\xc3\xa9t\xc3\xa9\r\n.\r\n", C8),
        SOK(".\x80", SD, PR, 0, "..\x80\r\n.\r\n", C8),
        /* REFUSE: the first bare CR or LF stops it; a bare CR's refusal comes at the octet after
         * it (the CR consumed, that octet not) or at the end */
        SREF("a\nb", SD, PR, 0, "a", CLF, 1, CLF),
        SREF("a\rb", SD, PR, 0, "a", CCR, 2, CCR),
        SREF("a\r", SD, PR, 0, "a", CCR, 2, CCR),
        SREF("a\r\r\n", SD, PR, 0, "a", CCR, 2, CCR),
        SREF("ab\r\ncd\r\n.\nx", SD, PR, 0, "ab\r\ncd\r\n..", CLF, 9, CLF),
        SREF("a\n.\r\nMAIL FROM:<x>\r\n", SD, PR, 0, "a", CLF, 1, CLF),
        SREF("a\r.\r\n", SD, PR, 0, "a", CCR, 2, CCR),
        SREF("\n.\n", SD, PR, 0, "", CLF, 0, CLF),
        /* refuse_mask with NORMALISE */
        {"ab\0c", 4, SD, PN, CNUL, "ab", 0, CNUL, 2, CNUL},
        SREF("ab\xc3\xa9", SD, PN, C8, "ab", C8, 2, C8),
        SREF("abcdefghijklmnopq\x80", SD, PN, C8, "abcdefghijklmnopq", C8, 17, C8),
        SREF("a\r\xc3", SD, PN, C8, "a\r\n", C8, 2, CCR | C8), /* the bare CR's CRLF first */
        SREF("a\r\n.\xc3", SD, PN, C8 | CNUL, "a\r\n..", C8, 4, C8),
        SOK("\r.", SD, PN, C8 | CNUL | CLONG, "\r\n..\r\n.\r\n", CCR),
        SREF("a\nb", SD, PN, CLF, "a", CLF, 1, CLF),  /* bare LF refused, bare CR not */
        SOK("a\rb", SD, PN, CLF, "a\r\nb\r\n.\r\n", CCR),
        SREF("a\rb", SD, PN, CCR, "a", CCR, 2, CCR),
    };
    run_stuff_cases(cases, sizeof cases / sizeof cases[0]);
}

/* BDAT: no dots, no end marker, the same line rules; BINARY: verbatim, nothing refused. */
static void test_stuff_bdat_binary(void **state)
{
    (void)state;
    static const stuff_case cases[] = {
        SOK("", SB, PN, 0, "", 0),
        SOK("abc", SB, PN, 0, "abc\r\n", 0),
        SOK(".\r\n", SB, PR, 0, ".\r\n", 0),
        SOK("..x\r\n.", SB, PR, 0, "..x\r\n.\r\n", 0),
        SOK("a\nb\r", SB, PN, 0, "a\r\nb\r\n", CCR | CLF),
        SOK("\r\r\n\n", SB, PN, 0, "\r\n\r\n\r\n", CCR | CLF),
        SREF("a\nb", SB, PR, 0, "a", CLF, 1, CLF),
        SREF("ab\r", SB, PR, 0, "ab", CCR, 3, CCR),
        {"a\0", 2, SB, PN, 0, "a\0\r\n", 4, 0, -1, CNUL},
        SOK("", SY, PN, 0, "", 0),
        SOK("a\nb\r", SY, PN, 0, "a\nb\r", CCR | CLF),
        SOK(".\r\n.\r\n", SY, PR, 0, ".\r\n.\r\n", 0),
        {"a\0\x80.\r", 5, SY, PR, CNUL | C8 | CLONG | CCR | CLF, "a\0\x80.\r", 5, 0, -1,
         CNUL | C8 | CCR},
        SOK("\r\n\r", SY, PN, 0, "\r\n\r", CCR),
    };
    run_stuff_cases(cases, sizeof cases / sizeof cases[0]);
}

/* Lines over 998 octets (RFC 5322 §2.1.1), CRLF excluded and the doubled dot not counted; a
 * bare CR or LF ends a line as CRLF does. */
static void test_stuff_long_lines(void **state)
{
    (void)state;
    static const struct {
        const char *head;   /* before the run */
        size_t run;         /* this many 'a' */
        const char *tail;   /* after it */
        int mode;
        smtpe_line_ending_policy pol;
        unsigned mask;
        unsigned refused;
        long consumed;      /* -1: all */
        unsigned seen;
    } cases[] = {
        {"", 998, "\r\n", SD, PR, CLONG, 0, -1, 0},
        {"", 998, "", SD, PR, CLONG, 0, -1, 0},
        {"", 999, "", SD, PR, CLONG, CLONG, 998, CLONG},
        {"", 999, "\r\n", SB, PN, CLONG, CLONG, 998, CLONG},
        {".", 997, "\r\n", SD, PR, CLONG, 0, -1, 0}, /* 999 on the wire with its dot */
        {".", 998, "\r\n", SD, PR, CLONG, CLONG, 998, CLONG},
        {"x\r\n", 998, "\r\n", SD, PR, CLONG, 0, -1, 0},
        {"x\r\n", 999, "\r\n", SD, PR, CLONG, CLONG, 1001, CLONG},
        {"\n", 998, "\nb", SD, PN, CLONG, 0, -1, CLF},
        {"b\r", 998, "\r", SD, PN, CLONG, 0, -1, CCR},
        {"", 2000, "", SD, PR, 0, 0, -1, CLONG},
        {"", 5000, "\r\n", SB, PN, 0, 0, -1, CLONG},
        {"", 998, "\x80", SD, PN, CLONG | C8, C8, 998, CLONG | C8}, /* lowest flag reported */
        {"", 998, "\x80", SD, PN, CLONG, CLONG, 998, CLONG | C8},
        {"", 998, "\r\n\x80", SD, PN, CLONG | C8, C8, 1000, C8},
        {"", 1500, "\r\n", SY, PR, CLONG, 0, -1, CLONG},
    };
    size_t failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hs_buf in = {0};
        hs_buf_adds(&in, cases[i].head);
        for (size_t k = 0; k < cases[i].run; k++)
            hs_buf_adds(&in, "a");
        hs_buf_adds(&in, cases[i].tail);
        sres w;
        int ok = check_stuff(cases[i].mode, cases[i].pol, cases[i].mask, in.p, in.len, &w);
        size_t want = cases[i].consumed < 0 ? in.len : (size_t)cases[i].consumed;
        if (ok && (w.refused != cases[i].refused || w.consumed != want ||
                   w.seen != cases[i].seen)) {
            describe_sres("engine", &w);
            fprintf(stderr, "  expected consumed %zu seen 0x%x refused 0x%x\n", want,
                    cases[i].seen, cases[i].refused);
            ok = 0;
        }
        if (!ok) {
            fprintf(stderr, "  ^ long line case %zu failed\n", i);
            failures++;
        }
        sres_free(&w);
        hs_buf_free(&in);
    }
    if (failures)
        fail_msg("%zu long line case(s) failed", failures);
}

/* One call of smtpe__stuff_encode with cap octets of room: it must consume want_used octets
 * and write exactly want_out (reported at the caller's line). */
static void encode_expect_at(int line, smtpe__stuffer *st, const char *in, size_t n, size_t cap,
                             size_t want_used, const char *want_out, size_t want_len)
{
    uint8_t buf[16];
    size_t w = 99;
    memset(buf, 0xa5, sizeof buf);
    size_t used = smtpe__stuff_encode(st, (const uint8_t *)in, n, buf, cap, &w);
    if (used != want_used || w != want_len || !hs_memeq(buf, want_out, w) || buf[cap] != 0xa5) {
        print_esc("  input ", (const uint8_t *)in, n);
        print_esc("  wrote ", buf, w <= cap ? w : cap);
        fail_msg("line %d: cap %zu: consumed %zu, wrote %zu; expected %zu, %zu", line, cap, used,
                 w, want_used, want_len);
    }
}
#define encode_expect(st, in, n, cap, used, out)                                                \
    encode_expect_at(__LINE__, st, in, n, cap, used, out, sizeof(out) - 1)

/* The output cap exactly at the boundaries: an octet is taken only when its whole output fits;
 * a CR is taken with no room at all (it writes nothing until the next octet settles it). */
static void test_stuff_caps(void **state)
{
    (void)state;
    smtpe__stuffer st;
    uint8_t fin[SMTPE__STUFF_FINISH_MAX];

    smtpe__stuff_start(&st, SD, PN, 0);
    encode_expect(&st, "ab", 2, 0, 0, "");
    encode_expect(&st, "ab", 2, 1, 1, "a");
    encode_expect(&st, "b", 1, 3, 1, "b");
    assert_int_equal(smtpe__stuff_finish(&st, fin), 5);
    assert_memory_equal(fin, "\r\n.\r\n", 5);

    smtpe__stuff_start(&st, SD, PR, 0);
    encode_expect(&st, ".a", 2, 1, 0, "");    /* ".." does not fit */
    encode_expect(&st, ".a", 2, 2, 1, "..");
    encode_expect(&st, "a\r\n", 3, 1, 2, "a"); /* the CR held with no room left */
    encode_expect(&st, "\n", 1, 1, 0, "");
    encode_expect(&st, "\n", 1, 2, 1, "\r\n");
    encode_expect(&st, ".\r\n", 3, 3, 2, ".."); /* the CR held, its LF's CRLF does not fit */
    encode_expect(&st, "\n", 1, 2, 1, "\r\n");
    assert_int_equal(st.in_octets, 7); /* ".", "a", CR, LF, ".", CR, LF */
    assert_int_equal(st.out_octets, 9);
    assert_int_equal(st.seen, 0);
    assert_int_equal(smtpe__stuff_finish(&st, fin), 3);
    assert_memory_equal(fin, ".\r\n", 3);

    smtpe__stuff_start(&st, SD, PN, 0);
    encode_expect(&st, "\r\n", 2, 0, 1, "");  /* CR held: no room needed */
    encode_expect(&st, "\n", 1, 1, 0, "");
    encode_expect(&st, "\n", 1, 2, 1, "\r\n");
    encode_expect(&st, "\r\n", 2, 2, 2, "\r\n"); /* a CRLF whole */
    encode_expect(&st, "\r.", 2, 3, 1, "\r\n");   /* the bare CR settled, ".." does not fit */
    encode_expect(&st, ".", 1, 1, 0, "");
    encode_expect(&st, ".", 1, 2, 1, "..");
    encode_expect(&st, "\r.", 2, 4, 2, "\r\n.."); /* 4: the most one octet needs */
    encode_expect(&st, "\n", 1, 1, 0, "");
    encode_expect(&st, "\nx", 2, 3, 2, "\r\nx");
    encode_expect(&st, "\r", 1, 0, 1, "");
    assert_int_equal(smtpe__stuff_finish(&st, fin), 5); /* the held CR's CRLF, then ".\r\n" */
    assert_memory_equal(fin, "\r\n.\r\n", 5);
    assert_int_equal(st.seen, CCR | CLF);

    /* a refusal needs no room: it comes when the encoder reaches the octet */
    smtpe__stuff_start(&st, SB, PN, CNUL);
    encode_expect(&st, "a\0", 2, 0, 0, "");
    assert_int_equal(st.refused, 0);
    encode_expect(&st, "a\0", 2, 1, 1, "a");
    assert_int_equal(st.refused, CNUL);
    encode_expect(&st, "b", 1, 8, 0, ""); /* refused: nothing more */
    assert_int_equal(smtpe__stuff_finish(&st, fin), 0);

    smtpe__stuff_start(&st, SD, PR, 0);
    encode_expect(&st, "a\r", 2, 1, 2, "a");
    encode_expect(&st, "b", 1, 0, 0, ""); /* the bare CR refused at the octet after it */
    assert_int_equal(st.refused, CCR);
    assert_int_equal(st.in_octets, 2);

    smtpe__stuff_start(&st, SD, PR, 0);
    encode_expect(&st, "a\r", 2, 8, 2, "a");
    assert_int_equal(smtpe__stuff_finish(&st, fin), 0); /* bare at the end: refused */
    assert_int_equal(st.refused, CCR);

    smtpe__stuff_start(&st, SY, PR, CNUL);
    encode_expect(&st, "ab\r\0ef", 6, 3, 3, "ab\r");
    encode_expect(&st, "\0ef", 3, 0, 0, "");
    encode_expect(&st, "\0ef", 3, 8, 3, "\0ef");
    assert_int_equal(smtpe__stuff_finish(&st, fin), 0);
    assert_int_equal(st.seen, CCR | CNUL);
    assert_int_equal(st.refused, 0);
}

/* Wire octets of a DATA encoding that hold no bare CR or LF and no end of data (CRLF "." CRLF,
 * or "." CRLF at the start) before the final ".\r\n". Returns NULL or what is wrong. */
static const char *wire_fault(const uint8_t *w, size_t n, int data, int complete)
{
    for (size_t i = 0; i < n; i++) {
        if (w[i] == '\r' && (i + 1 >= n || w[i + 1] != '\n'))
            return "a bare CR on the wire";
        if (w[i] == '\n' && (i == 0 || w[i - 1] != '\r'))
            return "a bare LF on the wire";
    }
    if (!data)
        return NULL;
    for (size_t i = 0; i + 3 <= n; i++)
        if ((i == 0 || (i >= 2 && w[i - 2] == '\r' && w[i - 1] == '\n')) &&
            memcmp(w + i, ".\r\n", 3) == 0 &&
            !(complete && i + 3 == n))
            return "the end of data before the final .CRLF (SMTP smuggling)";
    if (complete && (n < 3 || memcmp(w + n - 3, ".\r\n", 3) != 0 ||
                     (n > 3 && (n < 5 || w[n - 5] != '\r' || w[n - 4] != '\n'))))
        return "DATA not ended by CRLF .CRLF";
    return NULL;
}

static const char *const smuggling_inputs[] = {
    "a\n.\r\nMAIL FROM:<x>\r\n",
    "a\r.\r\n",
    "a\r\n.\n",
    "\n.\n",
    "hello\r\n.\r\nMAIL FROM:<evil@example.org>\r\nRCPT TO:<v@example.com>\r\nDATA\r\nx\r\n",
    ".\r\n",
    ".\r\nQUIT\r\n",
    "a\r\n.\r",
    "a\r\n.",
    "a\n.\n",
    "a\r\r\n.\r\r\n",
    "a\n\r.\r\n",
    "\r\n.\r\n",
    "\r.\n",
    "a\r\n.\r\r\n",
    "\n\n.\r\n.\n.\r",
};

/* No input puts an end of data, a bare CR or a bare LF on the wire, whatever the policy and
 * refuse_mask; under REFUSE what was written before the refusal holds none either. */
static void test_stuff_smuggling(void **state)
{
    (void)state;
    static const unsigned masks[] = {0, CNUL, C8 | CNUL | CLONG};
    size_t failures = 0;
    for (size_t i = 0; i < sizeof smuggling_inputs / sizeof smuggling_inputs[0]; i++) {
        const char *in = smuggling_inputs[i];
        size_t n = strlen(in);
        for (int mode = SD; mode <= SB; mode++)
            for (int pol = 0; pol < 2; pol++)
                for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
                    smtpe_line_ending_policy pl = pol ? PN : PR;
                    sres w;
                    int ok = check_stuff(mode, pl, masks[m], (const uint8_t *)in, n, &w);
                    const char *fault = wire_fault(w.out.p, w.out.len, mode == SD, !w.refused);
                    if (ok && fault) {
                        print_esc("  wire ", w.out.p, w.out.len);
                        fprintf(stderr, "  %s\n", fault);
                        ok = 0;
                    }
                    if (ok && pl == PN && (masks[m] & CNUL) == 0 && w.refused) {
                        fprintf(stderr, "  refused 0x%x under NORMALISE\n", w.refused);
                        ok = 0;
                    }
                    if (!ok) {
                        print_esc("  input ", (const uint8_t *)in, n);
                        fprintf(stderr, "  ^ smuggling input %zu failed (%s, policy %d, mask 0x%x)\n",
                                i, stuff_mode_name(mode), (int)pl, masks[m]);
                        failures++;
                    }
                    sres_free(&w);
                }
    }
    if (failures)
        fail_msg("%zu smuggling run(s) failed", failures);
}

/* The server decodes the client's DATA encoding back: smtpe__data_feed (REFUSE, or KEEP when
 * the content holds a NUL, which REFUSE refuses) ends exactly at the end of the wire octets,
 * status OK, and its content is the submitted content normalised (the reference BDAT encoding:
 * bare CR and LF as CRLF, the final CRLF where it lacked one). */
static int round_trip(const uint8_t *in, size_t n, hs_buf *why)
{
    sres w, norm;
    int ok = check_stuff(SD, PN, 0, in, n, &w);
    ref_stuff(SB, PN, 0, in, n, &norm);
    smtpe__data d;
    int has_nul = memchr(in, 0, n) != NULL;
    smtpe__data_start(&d, has_nul ? SMTPE_LINE_ENDING_KEEP : SMTPE_LINE_ENDING_REFUSE, 0, 1);
    hs_buf got = {0};
    size_t off = 0;
    int end = 0;
    while (ok && off < w.out.len && !end) {
        smtpe_span chunk = {NULL, 0};
        size_t used = smtpe__data_feed(&d, w.out.p + off, w.out.len - off, &chunk, &end);
        hs_buf_add(&got, chunk.ptr, chunk.len);
        off += used;
        if (used == 0 && chunk.len == 0 && !end) {
            hs_buf_adds(why, "the server's scanner made no progress");
            ok = 0;
        }
    }
    if (ok && (!end || off != w.out.len)) {
        hs_buf_addf(why, "the server ended at %zu of %zu (end %d)", off, w.out.len, end);
        ok = 0;
    }
    if (ok && d.status != SMTPE_DATA_OK) {
        hs_buf_addf(why, "the server's status %d", d.status);
        ok = 0;
    }
    if (ok && (got.len != norm.out.len || !hs_memeq(got.p, norm.out.p, got.len))) {
        hs_buf_adds(why, "the server's content is not the normalised content: ");
        hs_escape(why, got.p, got.len);
        hs_buf_adds(why, " against ");
        hs_escape(why, norm.out.p, norm.out.len);
        ok = 0;
    }
    if (ok && (d.flags & SMTPE_DATA_NORMALISED)) {
        hs_buf_adds(why, "the server had to normalise");
        ok = 0;
    }
    if (!ok && !why->len)
        hs_buf_adds(why, "the encoding disagrees (above)");
    hs_buf_free(&got);
    sres_free(&w);
    sres_free(&norm);
    return ok;
}

static void test_stuff_round_trip(void **state)
{
    (void)state;
    hs_buf why = {0};
    for (size_t i = 0; i < sizeof smuggling_inputs / sizeof smuggling_inputs[0]; i++) {
        const char *in = smuggling_inputs[i];
        if (!round_trip((const uint8_t *)in, strlen(in), &why)) {
            print_esc("  input ", (const uint8_t *)in, strlen(in));
            fail_msg("round trip of smuggling input %zu: %s", i, hs_buf_cstr(&why));
        }
    }
    static const char alphabet[] = "ab.\r\n.\r\n \x80\0";
    uint64_t rng = 7;
    for (int round = 0; round < 300; round++) {
        uint8_t in[64];
        size_t n = (size_t)round % 40;
        for (size_t k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            in[k] = (uint8_t)alphabet[(rng >> 33) % (sizeof alphabet - 1)];
        }
        if (!round_trip(in, n, &why)) {
            print_esc("  input ", in, n);
            fail_msg("round trip, round %d: %s", round, hs_buf_cstr(&why));
        }
    }
    hs_buf_free(&why);
}

/* The scanner: the same size, wire_size and flags over any split; wire_size is the reference
 * BDAT encoding's length under NORMALISE (CRLF line ends, the final CRLF, no dots: RFC 1870
 * §3) and flags its seen; and the encoder agrees: its DATA output less the doubled dots and
 * ".\r\n" is wire_size octets, its seen the scanner's flags. */
static void scan_split(const uint8_t *in, size_t n, const size_t *cuts, size_t ncuts,
                       smtpe_content_info *info)
{
    memset(info, 0x5a, sizeof *info);
    smtpe_content_scan_init(info);
    size_t base = 0;
    for (size_t c = 0; c <= ncuts; c++) {
        size_t to = c < ncuts ? cuts[c] : n;
        uint8_t *piece = malloc(to - base + 1);
        assert_non_null(piece);
        memcpy(piece, in + base, to - base);
        smtpe_content_scan(info, piece, to - base);
        free(piece);
        base = to;
    }
    smtpe_content_scan_end(info);
}

static int scan_check(const uint8_t *in, size_t n)
{
    smtpe_content_info whole, part;
    sres norm, data;
    int ok = 1;
    scan_split(in, n, NULL, 0, &whole);
    ref_stuff(SB, PN, 0, in, n, &norm);
    if (whole.size != n || whole.wire_size != norm.out.len || whole.flags != norm.seen) {
        fprintf(stderr, "  scan: size %llu wire_size %llu flags 0x%x; expected %zu %zu 0x%x\n",
                (unsigned long long)whole.size, (unsigned long long)whole.wire_size,
                whole.flags, n, norm.out.len, norm.seen);
        ok = 0;
    }
    for (size_t i = 0; ok && i <= n; i++) {
        size_t cuts[1] = {i};
        scan_split(in, n, cuts, 1, &part);
        if (part.size != whole.size || part.wire_size != whole.wire_size ||
            part.flags != whole.flags) {
            fprintf(stderr, "  scan split at %zu differs\n", i);
            ok = 0;
        }
    }
    if (ok && n <= 300) {
        size_t cuts[300];
        for (size_t i = 0; i + 1 < n; i++)
            cuts[i] = i + 1;
        scan_split(in, n, cuts, n ? n - 1 : 0, &part);
        if (part.size != whole.size || part.wire_size != whole.wire_size ||
            part.flags != whole.flags) {
            fprintf(stderr, "  scan one octet at a time differs\n");
            ok = 0;
        }
    }
    /* the encoder agrees: DATA output = wire_size + doubled dots + ".\r\n" */
    ok = check_stuff(SD, PN, 0, in, n, &data) && ok;
    size_t dots = 0;
    for (size_t i = 0; i < norm.out.len; i++)
        dots += norm.out.p[i] == '.' && (i == 0 || norm.out.p[i - 1] == '\n');
    if (ok && (data.out.len != whole.wire_size + dots + 3 || data.seen != whole.flags)) {
        fprintf(stderr, "  encoder: %zu octets (%zu dots), seen 0x%x; scanner wire_size %llu "
                "flags 0x%x\n", data.out.len, dots, data.seen,
                (unsigned long long)whole.wire_size, whole.flags);
        ok = 0;
    }
    sres_free(&norm);
    sres_free(&data);
    if (!ok)
        print_esc("  input ", in, n);
    return ok;
}

static void test_content_scan(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t len;
        uint64_t wire_size;
        unsigned flags;
    } cases[] = {
        {"", 0, 0, 0},
        {"abc", 0, 5, 0},
        {"abc\r\n", 0, 5, 0},
        {"a\nb", 0, 6, CLF},
        {"a\rb", 0, 6, CCR},
        {"\r", 0, 2, CCR},
        {"\r\r\n", 0, 4, CCR},
        {"\n\r", 0, 4, CCR | CLF},
        {".\r\n..\r\n", 0, 7, 0}, /* no dot-stuffing in SIZE */
        {"a\0b", 3, 5, CNUL},
        {"\xc3\xa9\r\n", 0, 4, C8},
        {"abcdefgh\x80", 0, 11, C8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = cases[i].len ? cases[i].len : strlen(cases[i].in);
        smtpe_content_info info;
        scan_split((const uint8_t *)cases[i].in, n, NULL, 0, &info);
        if (info.size != n || info.wire_size != cases[i].wire_size ||
            info.flags != cases[i].flags ||
            !scan_check((const uint8_t *)cases[i].in, n))
            fail_msg("scan case %zu: size %llu wire_size %llu flags 0x%x", i,
                     (unsigned long long)info.size, (unsigned long long)info.wire_size,
                     info.flags);
    }
    /* long lines: 998 octets are fine, 999 are not; a bare LF ends a line */
    hs_buf in = {0};
    for (int k = 0; k < 998; k++)
        hs_buf_adds(&in, "x");
    smtpe_content_info info;
    scan_split(in.p, in.len, NULL, 0, &info);
    assert_int_equal(info.flags, 0);
    assert_int_equal(info.wire_size, 1000);
    hs_buf_adds(&in, "\n");
    for (int k = 0; k < 998; k++)
        hs_buf_adds(&in, "y");
    scan_split(in.p, in.len, NULL, 0, &info);
    assert_int_equal(info.flags, CLF);
    assert_true(scan_check(in.p, in.len));
    hs_buf_adds(&in, "y");
    scan_split(in.p, in.len, NULL, 0, &info);
    assert_int_equal(info.flags, CLF | CLONG);
    assert_true(scan_check(in.p, in.len));
    hs_buf_free(&in);
    /* NULL is ignored */
    smtpe_content_scan_init(NULL);
    smtpe_content_scan(NULL, (const uint8_t *)"a", 1);
    smtpe_content_scan_end(NULL);
    smtpe_content_scan_init(&info);
    smtpe_content_scan(&info, NULL, 0);
    smtpe_content_scan_end(&info);
    assert_int_equal(info.size, 0);
    assert_int_equal(info.wire_size, 0);
    /* random content */
    static const char alphabet[] = "a.\r\n \x80\0b";
    uint64_t rng = 99;
    for (int round = 0; round < 200; round++) {
        uint8_t buf[80];
        size_t n = (size_t)round % 60;
        for (size_t k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            buf[k] = (uint8_t)alphabet[(rng >> 33) % (sizeof alphabet - 1)];
        }
        if (!scan_check(buf, n))
            fail_msg("scan, random round %d", round);
    }
}

/* Clean text is encoded in long runs: a 1 MB message of 76-octet lines comes out as the
 * reference says, in pieces of any size. */
static void test_stuff_bulk(void **state)
{
    (void)state;
    hs_buf in = {0};
    uint64_t rng = 3;
    while (in.len < 1000000) {
        char line[80];
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = (size_t)(rng >> 40) % 77;
        for (size_t k = 0; k < len; k++)
            line[k] = (char)('a' + (k * 7 + (rng >> 20)) % 26);
        if (len && (rng >> 60) == 0)
            line[0] = '.';
        hs_buf_add(&in, line, len);
        hs_buf_adds(&in, "\r\n");
    }
    sres ref, w;
    ref_stuff(SD, PR, CNUL | C8 | CLONG, in.p, in.len, &ref);
    hs_splitter sp;
    hs_splitter_init(&sp, HS_RANDOM, 5);
    static const size_t caps[] = {4096, 1, 65536, 3, 100};
    run_stuff(SD, PR, CNUL | C8 | CLONG, in.p, in.len, NULL, 0, &sp, caps, 5, &w);
    if (!same_sres(&ref, &w)) {
        describe_sres("engine", &w);
        fail_msg("bulk clean text differs from the reference");
    }
    sres_free(&ref);
    sres_free(&w);
    hs_buf_free(&in);
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
        cmocka_unit_test(test_stuff_data),
        cmocka_unit_test(test_stuff_bdat_binary),
        cmocka_unit_test(test_stuff_long_lines),
        cmocka_unit_test(test_stuff_caps),
        cmocka_unit_test(test_stuff_smuggling),
        cmocka_unit_test(test_stuff_round_trip),
        cmocka_unit_test(test_content_scan),
        cmocka_unit_test(test_stuff_bulk),
    };
    return cmocka_run_group_tests_name("data", tests, NULL, NULL);
}
