/*
 * fuzz_reply_parse.c - libFuzzer target for the client's strict reply parser
 * (smtpe__reply_feed, smtpe__reply_text, smtpe__enhanced_split in engine/reply.c; RFC 5321
 * §4.2, §4.5.3.1.5, RFC 2034 §4).
 *
 * Input: [0..1] cap, the longest line without CRLF ([0] | ([1] & 3) << 8: 0..1023), [2..3]
 * max_total ([2] | ([3] & 15) << 8: 0..4095), [4..5] the seed of the split, [6] flags (bit 0:
 * after DONE the driver does not call smtpe__reply_parser_start, so the next feed must start
 * the reply itself; bits 1-2: the code for smtpe__enhanced_split of the raw octets, 250, 450,
 * 550 or 354), then the octets the server sent.
 *
 * Oracles:
 *   - the results of feeding the octets whole, one octet at a time, and in pieces drawn from
 *     the seed (each piece in a heap block of exactly its size, buf exactly cap octets, so ASan
 *     sees any access out of bounds) all equal those of a whole-buffer reference written here
 *     line by line (ref_parse): the same results at the same offsets, the same line in buf at
 *     each LINE/DONE, the same code, lines and total, the same unfinished line at the end;
 *   - no LINE/DONE line is longer than cap, and *used never passes the piece;
 *   - an error sticks (a second call returns it and consumes nothing);
 *   - smtpe__enhanced_split of each line's text, and of the first octets of the input as they
 *     are (NULs, CRs and all), agrees with a reference of RFC 3463 §2 and RFC 2034 §4 (class
 *     2/4/5 equal to the code's first digit, 1..3 digit subject and detail, then SP or the
 *     end), reading only the text's own heap block.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "reply.h"

/* One result: code r at offset end (octets consumed from the start); for LINE/DONE the line
 * is in[line..line + len) and code/lines/total are the parser's after it; for a final MORE,
 * len is the unfinished line's length. */
typedef struct rp_ev {
    int r;
    size_t end, line, len;
    unsigned code, lines;
    size_t total;
} rp_ev;

typedef struct rp_log {
    rp_ev ev[2000]; /* one a line (5 octets or more) of at most 8000, and the last */
    size_t n;
} rp_log;

static void log_add(rp_log *log, rp_ev e)
{
    FUZZ_CHECK(log->n < sizeof log->ev / sizeof log->ev[0], "more results than lines");
    log->ev[log->n++] = e;
}

/* ---- the reference: whole buffer, one line at a time -----------------------------------
 * For the line starting at s: its content runs to the first CR, LF or NUL (e). Within the
 * content, the first failing position decides, SYNTAX/MISMATCH (positions 0..3) before
 * LONG_LINE (position cap) before TOO_BIG (the position where the reply passes max_total) when
 * they fall on the same octet. Then the octet at e: NUL is SYNTAX, LF is BARE, CR with fewer
 * than 3 octets is SYNTAX, CR that passes max_total is TOO_BIG; then the octet after the CR:
 * not LF is BARE, LF passing max_total is TOO_BIG, else the line is complete. */
static int header_octet(size_t k, uint8_t c, int first, unsigned code)
{
    static const uint8_t lo[3] = {'2', '0', '0'}, hi[3] = {'5', '5', '9'};
    if (k == 3)
        return c == '-' || c == ' ' ? 0 : SMTPE__RP_SYNTAX;
    if (c < lo[k] || c > hi[k])
        return SMTPE__RP_SYNTAX;
    char want[4];
    snprintf(want, sizeof want, "%03u", code % 1000);
    return !first && c != (uint8_t)want[k] ? SMTPE__RP_MISMATCH : 0;
}

static void ref_parse(rp_log *log, const uint8_t *in, size_t n, size_t cap, size_t max_total)
{
    size_t s = 0, total = 0;
    unsigned lines = 0, code = 0;
    for (;;) {
        size_t e = s;
        while (e < n && in[e] != '\r' && in[e] != '\n' && in[e] != 0)
            e++;
        size_t len = e - s, err_at = SIZE_MAX;
        int err = 0;
        for (size_t k = 0; k < len && k < 4; k++) {
            err = header_octet(k, in[s + k], lines == 0, code);
            if (err) {
                err_at = k;
                break;
            }
        }
        if (len > cap && cap < err_at) {
            err_at = cap;
            err = SMTPE__RP_LONG_LINE;
        }
        size_t room = max_total - total; /* total never passes max_total */
        if (len > room && room < err_at) {
            err_at = room;
            err = SMTPE__RP_TOO_BIG;
        }
        if (err) {
            log_add(log, (rp_ev){.r = err, .end = s + err_at + 1});
            return;
        }
        if (len >= 3 && lines == 0)
            code = (unsigned)(in[s] - '0') * 100 + (unsigned)(in[s + 1] - '0') * 10 +
                   (unsigned)(in[s + 2] - '0');
        if (e < n) {
            if (in[e] == 0 || (in[e] == '\r' && len < 3))
                err = SMTPE__RP_SYNTAX;
            else if (in[e] == '\n')
                err = SMTPE__RP_BARE;
            else if (len + 1 > room)
                err = SMTPE__RP_TOO_BIG;
        }
        if (err) {
            log_add(log, (rp_ev){.r = err, .end = e + 1});
            return;
        }
        if (e == n || e + 1 == n) { /* the line, or its CR, waits for more */
            log_add(log, (rp_ev){.r = SMTPE__RP_MORE, .end = n, .len = len});
            return;
        }
        if (in[e + 1] != '\n' || len + 2 > room) {
            log_add(log, (rp_ev){.r = in[e + 1] != '\n' ? SMTPE__RP_BARE : SMTPE__RP_TOO_BIG,
                                 .end = e + 2});
            return;
        }
        int done = len == 3 || in[s + 3] == ' ';
        total += len + 2;
        lines++;
        log_add(log, (rp_ev){.r = done ? SMTPE__RP_DONE : SMTPE__RP_LINE, .end = e + 2,
                             .line = s, .len = len, .code = code, .lines = lines,
                             .total = total});
        if (done) {
            total = 0;
            lines = 0;
            code = 0;
        }
        s = e + 2;
    }
}

/* ---- enhanced status codes -------------------------------------------------------------- */

/* RFC 3463 §2 at the start of t[0..n), followed by SP or the end: its length, or 0. */
static size_t ref_enhanced(const uint8_t *t, size_t n, unsigned code)
{
    if (n < 2 || t[0] != (uint8_t)('0' + code / 100) ||
        (t[0] != '2' && t[0] != '4' && t[0] != '5') || t[1] != '.')
        return 0;
    size_t i = 2;
    for (int part = 0; part < 2; part++) {
        size_t d = 0;
        while (i < n && t[i] >= '0' && t[i] <= '9') {
            i++;
            d++;
        }
        if (d < 1 || d > 3)
            return 0;
        if (part == 0) {
            if (i >= n || t[i] != '.')
                return 0;
            i++;
        }
    }
    return i == n || t[i] == ' ' ? i : 0;
}

static void check_enhanced(smtpe_span text, unsigned code)
{
    uint8_t *copy = malloc(text.len ? text.len : 1);
    if (!copy)
        abort();
    if (text.len)
        memcpy(copy, text.ptr, text.len);
    smtpe_span t = {copy, text.len}, enh, rest;
    int ok = smtpe__enhanced_split(t, code, &enh, &rest);
    size_t want = ref_enhanced(copy, text.len, code);
    FUZZ_CHECK(ok == (want > 0), "enhanced_split disagrees with RFC 3463 §2 / RFC 2034 §4");
    FUZZ_CHECK(enh.ptr == copy && enh.len == want, "enhanced_split: wrong enhanced span");
    size_t skip = want + (want > 0 && want < text.len);
    FUZZ_CHECK(rest.ptr == copy + skip && rest.len == text.len - skip,
               "enhanced_split: wrong rest span");
    free(copy);
}

/* ---- the parser under a split ---------------------------------------------------------- */

static uint64_t split_rng(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* mode 0: whole; 1: one octet at a time; 2: pieces from the seed. */
static size_t next_piece(int mode, uint64_t *seed, size_t left)
{
    if (mode == 0 || left <= 1)
        return left;
    if (mode == 1)
        return 1;
    uint64_t r = split_rng(seed);
    size_t k = r % 4 == 0 ? 1 + (size_t)(r >> 8) % 600 : 1 + (size_t)(r >> 8) % 9;
    return k < left ? k : left;
}

static void run_parser(rp_log *log, const uint8_t *in, size_t n, size_t cap, size_t max_total,
                       int mode, uint64_t seed, int restart)
{
    uint8_t *buf = cap ? malloc(cap) : NULL;
    if (cap && !buf)
        abort();
    smtpe__reply_parser p = {.buf = buf, .cap = cap, .max_total = max_total};
    smtpe__reply_parser_start(&p);
    size_t off = 0;
    int r = SMTPE__RP_MORE;
    while (off < n && r >= 0) {
        size_t k = next_piece(mode, &seed, n - off), at = 0;
        uint8_t *piece = malloc(k);
        if (!piece)
            abort();
        memcpy(piece, in + off, k);
        while (at < k && r >= 0) {
            size_t used = SIZE_MAX;
            r = smtpe__reply_feed(&p, piece + at, k - at, &used);
            FUZZ_CHECK(used <= k - at, "feed consumed more than it was given");
            at += used;
            FUZZ_CHECK(p.len <= cap, "line length over cap");
            if (r == SMTPE__RP_MORE) {
                FUZZ_CHECK(at == k, "MORE without consuming all input");
                continue;
            }
            if (r < 0) {
                size_t again = SIZE_MAX;
                FUZZ_CHECK(smtpe__reply_feed(&p, piece, k, &again) == r && again == 0,
                           "an error did not stick");
                log_add(log, (rp_ev){.r = r, .end = off + at});
                break;
            }
            FUZZ_CHECK(r == SMTPE__RP_LINE || r == SMTPE__RP_DONE, "unknown feed result");
            FUZZ_CHECK(used > 0 && p.len >= 3, "a line handed out without its code");
            size_t start = off + at - p.len - 2;
            FUZZ_CHECK(memcmp(p.buf, in + start, p.len) == 0,
                       "buf is not the line just consumed");
            log_add(log, (rp_ev){.r = r, .end = off + at, .line = start, .len = p.len,
                                 .code = p.code, .lines = p.lines, .total = p.total});
            check_enhanced(smtpe__reply_text(&p), p.code);
            if (r == SMTPE__RP_DONE && restart)
                smtpe__reply_parser_start(&p);
        }
        free(piece);
        off += k;
    }
    if (r >= 0) {
        size_t used = SIZE_MAX;
        FUZZ_CHECK(smtpe__reply_feed(&p, NULL, 0, &used) == SMTPE__RP_MORE && used == 0,
                   "an empty feed did not return MORE");
        log_add(log, (rp_ev){.r = SMTPE__RP_MORE, .end = n, .len = p.len});
    }
    free(buf);
}

static void compare(const rp_log *got, const rp_log *want, const char *how)
{
    if (got->n != want->n)
        fprintf(stderr, "%s: %zu results, the reference %zu\n", how, got->n, want->n);
    FUZZ_CHECK(got->n == want->n, "a different number of results than the reference");
    for (size_t i = 0; i < got->n; i++) {
        const rp_ev *g = &got->ev[i], *w = &want->ev[i];
        if (g->r != w->r || g->end != w->end)
            fprintf(stderr, "%s: result %zu is %d at %zu, the reference %d at %zu\n", how, i,
                    g->r, g->end, w->r, w->end);
        FUZZ_CHECK(g->r == w->r && g->end == w->end, "result or offset differs from reference");
        FUZZ_CHECK(g->line == w->line && g->len == w->len, "line differs from the reference");
        FUZZ_CHECK(g->code == w->code && g->lines == w->lines && g->total == w->total,
                   "code, lines or total differs from the reference");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static rp_log want, got;
    if (size < 7)
        return 0;
    size_t cap = (size_t)data[0] | (size_t)(data[1] & 3) << 8;
    size_t max_total = (size_t)data[2] | (size_t)(data[3] & 15) << 8;
    uint64_t seed = (uint64_t)data[4] | (uint64_t)data[5] << 8;
    int restart = !(data[6] & 1);
    const uint8_t *in = data + 7;
    size_t n = size - 7;
    if (n > 8000)
        n = 8000;

    static const unsigned codes[4] = {250, 450, 550, 354};
    check_enhanced((smtpe_span){in, n < 12 ? n : 12}, codes[(data[6] >> 1) & 3]);

    want.n = 0;
    ref_parse(&want, in, n, cap, max_total);
    for (size_t i = 0; i < want.n; i++)
        FUZZ_CHECK(want.ev[i].r < 0 || want.ev[i].len <= cap, "reference: a line over cap");
    static const char *how[] = {"whole", "one octet at a time", "split"};
    for (int mode = 0; mode < 3; mode++) {
        got.n = 0;
        run_parser(&got, in, n, cap, max_total, mode, seed, restart);
        compare(&got, &want, how[mode]);
    }
    return 0;
}
