/*
 * fuzz_command.c - libFuzzer target for command-line framing, verb splitting and ESMTP
 * parameters (engine/command.c).
 *
 * Input: [0] line-ending policy (% 3), [1] line buffer capacity (one of 510, 998, 4..35),
 * [2] most parameters (16 or 1..4), then the octets a client sends.
 *
 * The stream is framed into lines twice, fed whole and fed one octet at a time. Oracles:
 *   - smtpe__line_feed never consumes more than it was given, and always makes progress;
 *   - both feedings give the same lines (content, TOO_LONG / BARE flags, end offsets);
 *   - under KEEP, and under REFUSE for a line without BARE, a line is exactly the octets before
 *     the first CRLF (cut to cap octets, with TOO_LONG, when longer);
 *   - for each line, smtpe__command_split's verb and argument lie in the line, the verb is the
 *     octets up to the first SP and the verb code matches it (case-insensitively);
 *   - smtpe__parse_params's spans lie in its input, keywords are non-empty and hold no SP or
 *     '=', values hold no SP, at most max are returned; smtpe__parse_u64 agrees with a reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "fuzz_util.h"

typedef struct line_rec {
    fz_buf all; /* per line: end offset, flags, length, octets */
    size_t lines;
} line_rec;

/* indexed by smtpe__verb */
static const char *verb_names[] = {NULL,   "HELO", "EHLO", "MAIL", "RCPT", "DATA",     "RSET",
                                   "NOOP", "QUIT", "VRFY", "EXPN", "HELP", "STARTTLS", "AUTH",
                                   "BDAT", "LHLO", "XCLIENT", "XFORWARD"};
#define LAST_VERB SMTPE__VERB_XFORWARD
_Static_assert(sizeof verb_names / sizeof verb_names[0] == LAST_VERB + 1, "one name per verb");

/* Reference: an unsigned decimal of 1..20 digits that fits in 64 bits. */
static int ref_u64(smtpe_span s, uint64_t *v)
{
    if (s.len < 1 || s.len > 20)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < s.len; i++) {
        if (s.ptr[i] < '0' || s.ptr[i] > '9')
            return -1;
        unsigned d = (unsigned)(s.ptr[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

static void check_params(const uint8_t *p, size_t n, size_t max)
{
    smtpe_param out[SMTPE_MAX_PARAMS + 1];
    size_t count = (size_t)-1;
    memset(out, 0xA5, sizeof out);
    int r = smtpe__parse_params(p, n, out, max, &count);
    FUZZ_CHECK(r == SMTPE__PARAMS_OK || r == SMTPE__PARAMS_SYNTAX || r == SMTPE__PARAMS_TOO_MANY,
               "parse_params: unknown result");
    if (r != SMTPE__PARAMS_OK)
        return;
    FUZZ_CHECK(count <= max, "parse_params returned more than max");
    for (size_t i = 0; i < count; i++) {
        smtpe_span k = out[i].keyword, v = out[i].value;
        FUZZ_CHECK(fz_within(k, p, n) && fz_within(v, p, n), "parameter span outside the input");
        FUZZ_CHECK(k.len > 0, "empty parameter keyword");
        for (size_t j = 0; j < k.len; j++)
            FUZZ_CHECK(k.ptr[j] != ' ' && k.ptr[j] != '=', "SP or '=' in a keyword");
        for (size_t j = 0; j < v.len; j++)
            FUZZ_CHECK(v.ptr[j] != ' ', "SP in a parameter value");
        if (i > 0)
            FUZZ_CHECK(k.ptr > out[i - 1].keyword.ptr, "parameters out of order");
        uint64_t a = 0, b = 0;
        int ra = smtpe__parse_u64(v, &a), rb = ref_u64(v, &b);
        FUZZ_CHECK(ra == rb && (ra != 0 || a == b), "parse_u64 disagrees with the reference");
    }
}

static void check_line(const uint8_t *line, size_t n, size_t max)
{
    smtpe_span verb, arg;
    memset(&verb, 0xA5, sizeof verb);
    memset(&arg, 0xA5, sizeof arg);
    smtpe__verb v = smtpe__command_split(line, n, &verb, &arg);
    FUZZ_CHECK(v >= SMTPE__VERB_UNKNOWN && v <= LAST_VERB, "command_split: bad verb");
    FUZZ_CHECK(fz_within(verb, line, n) && fz_within(arg, line, n), "verb/argument outside line");
    size_t sp = 0;
    while (sp < n && line[sp] != ' ')
        sp++;
    FUZZ_CHECK(verb.len == sp && (sp == 0 || verb.ptr == line),
               "the verb is not the octets up to the first SP");
    if (arg.len)
        FUZZ_CHECK(arg.ptr >= line + sp, "argument overlaps the verb");
    for (int i = 1; i <= LAST_VERB; i++)
        if (fz_span_eq_ci(verb, verb_names[i]))
            FUZZ_CHECK((int)v == i, "verb code does not match the verb");
    if (v != SMTPE__VERB_UNKNOWN)
        FUZZ_CHECK(fz_span_eq_ci(verb, verb_names[v]), "verb code for another verb");
    FUZZ_CHECK(smtpe__has_prefix_ci(line, n, "") == 1, "every line starts with the empty prefix");
    if (arg.len) {
        int pf = smtpe__has_prefix_ci(arg.ptr, arg.len, "FROM:");
        smtpe_span a5 = {arg.ptr, arg.len < 5 ? arg.len : 5};
        FUZZ_CHECK(pf == (arg.len >= 5 && fz_span_eq_ci(a5, "FROM:")), "has_prefix_ci is wrong");
        check_params(arg.ptr, arg.len, max);
        /* the parameters after a path */
        size_t i = 0;
        while (i < arg.len && arg.ptr[i] != ' ')
            i++;
        if (i < arg.len)
            check_params(arg.ptr + i, arg.len - i, max);
    }
}

/* Frames stream[0..n); step 0 means whole. */
static void frame(const uint8_t *p, size_t n, size_t cap, smtpe_line_ending_policy pol,
                  size_t step, size_t max, line_rec *rec, int check)
{
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf)
        abort();
    smtpe__line l;
    l.buf = buf;
    l.cap = cap;
    smtpe__line_reset(&l);
    size_t off = 0, start = 0, iter = 0;
    while (off < n || (l.flags & SMTPE__LINE_DONE)) {
        FUZZ_CHECK(++iter < 4 * n + 64, "line_feed makes no progress");
        if (l.flags & SMTPE__LINE_DONE) {
            FUZZ_CHECK(l.len <= cap, "line longer than cap");
            unsigned fl = l.flags & (SMTPE__LINE_TOO_LONG | SMTPE__LINE_BARE);
            fz_put_u64(&rec->all, off);
            fz_put_u64(&rec->all, fl);
            fz_put_span(&rec->all, (smtpe_span){l.buf, l.len});
            rec->lines++;
            if (check) {
                if (pol == SMTPE_LINE_ENDING_KEEP ||
                    (pol == SMTPE_LINE_ENDING_REFUSE && !(fl & SMTPE__LINE_BARE))) {
                    long e = -1;
                    for (size_t i = start; i + 1 < n; i++)
                        if (p[i] == '\r' && p[i + 1] == '\n') {
                            e = (long)i;
                            break;
                        }
                    FUZZ_CHECK(e >= 0 && off == (size_t)e + 2, "line did not end at its first CRLF");
                    size_t raw = (size_t)e - start;
                    FUZZ_CHECK(!!(fl & SMTPE__LINE_TOO_LONG) == (raw > cap), "TOO_LONG is wrong");
                    size_t want = raw > cap ? cap : raw;
                    FUZZ_CHECK(l.len == want && memcmp(l.buf, p + start, want) == 0,
                               "line content is not the octets before the CRLF");
                }
                check_line(l.buf, l.len, max);
            }
            smtpe__line_reset(&l);
            start = off;
            continue;
        }
        size_t avail = n - off;
        if (step && avail > step)
            avail = step;
        size_t r = smtpe__line_feed(&l, p + off, avail, pol);
        FUZZ_CHECK(r <= avail, "line_feed consumed more than it was given");
        FUZZ_CHECK(r > 0 || (l.flags & SMTPE__LINE_DONE), "line_feed made no progress");
        off += r;
    }
    fz_put_u64(&rec->all, l.len);
    fz_put_u64(&rec->all, l.flags & (SMTPE__LINE_TOO_LONG | SMTPE__LINE_BARE));
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    smtpe_line_ending_policy pol = (smtpe_line_ending_policy)(data[0] % 3);
    size_t cap = data[1] < 128 ? 510 : data[1] < 160 ? 998 : 4 + data[1] % 32;
    size_t max = data[2] < 128 ? SMTPE_MAX_PARAMS : 1 + data[2] % 4;
    const uint8_t *p = data + 3;
    size_t n = size - 3;

    line_rec whole = {{0}, 0}, bytes = {{0}, 0};
    frame(p, n, cap, pol, 0, max, &whole, 1);
    frame(p, n, cap, pol, 1, max, &bytes, 0);
    FUZZ_CHECK(whole.lines == bytes.lines, "whole and byte-at-a-time give different line counts");
    FUZZ_CHECK(whole.all.len == bytes.all.len &&
                   memcmp(whole.all.p, bytes.all.p, whole.all.len) == 0,
               "whole and byte-at-a-time give different lines");
    fz_free(&whole.all);
    fz_free(&bytes.all);
    return 0;
}
