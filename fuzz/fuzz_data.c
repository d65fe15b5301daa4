/*
 * fuzz_data.c - libFuzzer target for DATA content: end-of-data detection and dot-unstuffing
 * (engine/data.c, RFC 5321 §4.1.1.4, §4.5.2).
 *
 * Input: [0] bits 0-6 line-ending policy (% 3), bit 7 "stuff"; [1] max_size (<64: none, else
 * (v-64)*4+1); then the body. Without "stuff" the body is the octets that follow the DATA line
 * as a client sends them. With "stuff" it is the message a client means to send: the target
 * ends it with CRLF (unless it is empty or ends so), dot-stuffs it as a client does (a '.'
 * before every line that starts with '.') and appends ".\r\n"; those are the octets scanned.
 *
 * The content is scanned three times: whole, one octet at a time, and in pieces whose sizes
 * cycle through the input's first octets. Oracles:
 *   - smtpe__data_feed never consumes more than it was given and always makes progress;
 *     a chunk lies within the octets it consumed (or is a static CR, LF or CRLF; under REFUSE
 *     only a CRLF whose CR was held back, or its CR cut at the size limit); no chunk follows a
 *     status other than SMTPE_DATA_OK;
 *   - all three give the same end offset and, when the end was reached, the same concatenated
 *     content, status, flags and size (before it, the contents so far are prefixes);
 *   - the end is exactly just past the first CR LF . CR LF (the DATA line's CRLF counting as
 *     the first line break), under every policy (SMTP smuggling);
 *   - content (fz_check_dot_content in fuzz_util.h): with U the reference unstuffing (first '.'
 *     of each CRLF-started line deleted) of the octets before the final ".\r\n", the content is
 *     U (REFUSE, KEEP) or U normalised (NORMALISE) when the status is OK, a prefix of it
 *     otherwise, exactly max_size octets for TOO_BIG; BAD_LINE_ENDING (REFUSE) and NORMALISED
 *     (NORMALISE) iff U holds a bare CR, bare LF or NUL;
 *   - dot-stuffing round trip: content that ended OK without normalisation (always under KEEP
 *     and REFUSE), from octets a client stuffed correctly, re-stuffed plus ".\r\n" is exactly
 *     the octets consumed up to the end of CRLF.CRLF. With "stuff" the octets are stuffed
 *     correctly by construction, so the round trip is checked for every such message, and
 *     also: the end is exactly the end of the octets, and the content is the message (REFUSE,
 *     KEEP; REFUSE refuses it iff it holds a bare CR/LF/NUL) or the message normalised
 *     (NORMALISE). Before the end (the input ran out) the content is a prefix of the octets
 *     consumed dot-unstuffed;
 *   - at the end, size is the content delivered; HAS_8BIT says whether an octet above 127 was
 *     delivered.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "fuzz_util.h"

static uint8_t *pieces[17]; /* pieces[n]: a heap block of exactly n octets, n = 1..16 */

typedef struct result {
    fz_buf content;
    long end;  /* end offset, -1 if the input ran out first */
    size_t consumed;
    smtpe__data d;
} result;

/* step 0: whole; otherwise piece sizes from steps[] in turn. */
static void scan(const uint8_t *p, size_t n, smtpe_line_ending_policy pol, uint64_t max,
                 const uint8_t *steps, size_t nsteps, result *res)
{
    smtpe__data *d = &res->d;
    smtpe__data_start(d, pol, max, 1);
    size_t off = 0, iter = 0, si = 0;
    res->end = -1;
    while (off < n) {
        FUZZ_CHECK(++iter < 4 * n + 64, "data_feed makes no progress");
        size_t avail = n - off;
        if (nsteps) {
            size_t st = 1 + steps[si++ % nsteps] % 16;
            if (avail > st)
                avail = st;
        }
        /* exactly the octets given, so that ASan sees any read past them: the whole scan
         * reads the fuzzer's own buffer up to its end, a piece is copied to a heap block of
         * its size */
        const uint8_t *q = p + off;
        if (nsteps) {
            memcpy(pieces[avail], p + off, avail);
            q = pieces[avail];
        }
        smtpe_span chunk = {NULL, 0};
        int end = 0;
        int before = d->status;
        size_t r = smtpe__data_feed(d, q, avail, &chunk, &end);
        FUZZ_CHECK(r <= avail, "data_feed consumed more than it was given");
        FUZZ_CHECK(r > 0 || chunk.len > 0 || end, "data_feed made no progress");
        if (chunk.len) {
            FUZZ_CHECK(before == SMTPE_DATA_OK, "content handed out after the status left OK");
            if (!fz_within(chunk, q, r))
                FUZZ_CHECK(fz_static_break(chunk) &&
                               (pol != SMTPE_LINE_ENDING_REFUSE || chunk.ptr[0] == '\r'),
                           "chunk outside the consumed octets and not a static line break");
            fz_put(&res->content, chunk.ptr, chunk.len);
        }
        off += r;
        if (end) {
            res->end = (long)off;
            break;
        }
    }
    res->consumed = off;
}

/* Two scans of the same octets must agree. Before the end (the input ran out) only the
 * content delivered so far is compared, as a prefix: how much of an unfinished line has been
 * handed out may depend on the split. */
static void compare(const result *a, const result *b, const char *what)
{
    FUZZ_CHECK(a->end == b->end, "split invariance: end offsets differ");
    if (a->end < 0) {
        size_t m = a->content.len < b->content.len ? a->content.len : b->content.len;
        FUZZ_CHECK(fz_eq(a->content.p, m, b->content.p, m),
                   "split invariance: contents so far differ");
        return;
    }
    if (a->d.status != b->d.status || a->d.flags != b->d.flags ||
        !fz_eq(a->content.p, a->content.len, b->content.p, b->content.len) ||
        a->d.size != b->d.size)
        fprintf(stderr, "%s: end %ld status %d/%d flags %u/%u content %zu/%zu size %llu/%llu\n",
                what, a->end, a->d.status, b->d.status, a->d.flags, b->d.flags,
                a->content.len, b->content.len, (unsigned long long)a->d.size,
                (unsigned long long)b->d.size);
    FUZZ_CHECK(a->d.status == b->d.status, "split invariance: statuses differ");
    FUZZ_CHECK(a->d.flags == b->d.flags, "split invariance: flags differ");
    FUZZ_CHECK(fz_eq(a->content.p, a->content.len, b->content.p, b->content.len),
               "split invariance: contents differ");
    FUZZ_CHECK(a->d.size == b->d.size, "split invariance: sizes differ");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The "stuff" input: body[0..n) as a client sends it after DATA, in an exact-size heap block
 * (*len octets; the caller frees it). */
static uint8_t *stuff_message(const uint8_t *body, size_t n, size_t *len)
{
    fz_buf st = {0};
    fz_restuff(&st, body, n);
    if (n > 0 && !(n >= 2 && body[n - 2] == '\r' && body[n - 1] == '\n'))
        fz_put(&st, "\r\n", 2);
    fz_put(&st, ".\r\n", 3);
    uint8_t *q = malloc(st.len);
    if (!q)
        abort();
    memcpy(q, st.p, st.len);
    *len = st.len;
    fz_free(&st);
    return q;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    smtpe_line_ending_policy pol = (smtpe_line_ending_policy)((data[0] & 0x7f) % 3);
    int stuff = data[0] >> 7;
    uint64_t max = data[1] < 64 ? 0 : (uint64_t)(data[1] - 64) * 4 + 1;
    const uint8_t *p = data + 2;
    size_t n = size - 2;
    uint8_t *stuffed = NULL;
    if (stuff) {
        stuffed = stuff_message(data + 2, size - 2, &n);
        p = stuffed;
    }
    static const uint8_t one[1] = {0};
    if (!pieces[1])
        for (size_t i = 1; i <= 16; i++)
            if (!(pieces[i] = malloc(i)))
                abort();

    result w, b, s;
    memset(&w, 0, sizeof w);
    memset(&b, 0, sizeof b);
    memset(&s, 0, sizeof s);
    scan(p, n, pol, max, NULL, 0, &w);
    scan(p, n, pol, max, one, 1, &b);
    scan(p, n, pol, max, p, n < 64 ? n : 64, &s);
    compare(&w, &b, "whole vs byte-at-a-time");
    compare(&w, &s, "whole vs pieces");

    const uint8_t *c = w.content.p;
    size_t clen = w.content.len;
    FUZZ_CHECK(w.end == fz_end_of_data(p, n),
               "the end of data is not just past the first CRLF.CRLF (smuggling oracle)");
    if (w.end >= 0 && w.d.status == SMTPE_DATA_OK)
        FUZZ_CHECK(w.d.size == clen, "size is not the content delivered");
    if (w.d.status == SMTPE_DATA_OK) {
        if (max)
            FUZZ_CHECK(clen <= max, "content over max_size with status OK");
        if (w.end >= 0)
            FUZZ_CHECK(!!(w.d.flags & SMTPE_DATA_HAS_8BIT) == fz_has_8bit(c, clen),
                       "HAS_8BIT disagrees with the content");
        if (pol == SMTPE_LINE_ENDING_KEEP)
            FUZZ_CHECK(!(w.d.flags & SMTPE_DATA_NORMALISED), "NORMALISED under KEEP");
    }
    if (w.end >= 0) {
        fz_check_dot_content(p, (size_t)w.end, 1, pol, c, clen, w.d.status, w.d.flags, max);
    } else if (w.d.status == SMTPE_DATA_OK) {
        fz_buf u = {0}, ref = {0};
        fz_unstuff(&u, p, w.consumed);
        if (pol == SMTPE_LINE_ENDING_NORMALISE)
            fz_normalise(&ref, u.p, u.len);
        else
            fz_put(&ref, u.p, u.len);
        FUZZ_CHECK(clen <= ref.len && fz_eq(ref.p, clen, c, clen),
                   "content is not a prefix of the consumed octets dot-unstuffed (and, under "
                   "NORMALISE, normalised)");
        fz_free(&u);
        fz_free(&ref);
    }
    if (stuff) {
        /* the message as the client meant it, ended by CRLF */
        const uint8_t *m = data + 2;
        size_t mn = size - 2;
        fz_buf msg = {0}, exp = {0};
        fz_put(&msg, m, mn);
        if (mn > 0 && !(mn >= 2 && m[mn - 2] == '\r' && m[mn - 1] == '\n'))
            fz_put(&msg, "\r\n", 2);
        FUZZ_CHECK(fz_stuffed(p, n - 3), "reference: fz_restuff gave octets fz_stuffed refuses");
        FUZZ_CHECK(w.end == (long)n,
                   "a correctly stuffed message did not end exactly at its final CRLF.CRLF");
        if (pol == SMTPE_LINE_ENDING_NORMALISE)
            fz_normalise(&exp, msg.p, msg.len);
        else
            fz_put(&exp, msg.p, msg.len);
        if (w.d.status == SMTPE_DATA_OK)
            FUZZ_CHECK(fz_eq(c, clen, exp.p, exp.len),
                       "a correctly stuffed message did not come out as the message");
        if (pol == SMTPE_LINE_ENDING_KEEP || pol == SMTPE_LINE_ENDING_NORMALISE)
            FUZZ_CHECK(w.d.status == (max && exp.len > max ? SMTPE_DATA_TOO_BIG : SMTPE_DATA_OK),
                       "KEEP/NORMALISE: a stuffed message was refused other than for its size");
        else if (w.d.status != SMTPE_DATA_TOO_BIG)
            FUZZ_CHECK((w.d.status == SMTPE_DATA_BAD_LINE_ENDING) ==
                           (fz_count_bare(msg.p, msg.len) > 0),
                       "REFUSE: a stuffed message refused iff it holds a bare CR/LF/NUL");
        fz_free(&msg);
        fz_free(&exp);
    }
    free(stuffed);
    fz_free(&w.content);
    fz_free(&b.content);
    fz_free(&s.content);
    return 0;
}
