/*
 * fuzz_stuff.c - libFuzzer target for the client's content encoder (smtpe__stuff_*, engine/data.c:
 * dot-stuffing RFC 5321 §4.5.2, no bare CR or LF on the wire §2.3.8, BDAT and BINARYMIME
 * RFC 3030) and the public content scanner (smtpe_content_scan, RFC 1870 SIZE).
 *
 * Input: [0] bits 0-1 mode (% 3: SMTPE__STUFF_DATA, _BDAT, _BINARY), bit 2 policy (0 REFUSE,
 * 1 NORMALISE), bits 3-7 refuse_mask (SMTPE_CONTENT_* bits 0-4); [1] % 33 = k, the number of
 * control octets that follow; then k control octets; then the content. Control octet 2i gives
 * the length of the i-th piece (1 + v % 24, cycling), 2i+1 the output cap of the i-th call
 * (v < 160: v % 8, octets around the boundaries; else (v - 160) * 40; cycling; after a call
 * that neither consumed nor wrote, at least 4).
 *
 * The content is encoded seven times: whole into one large buffer, one octet at a time with
 * cap 2, and in the pieces and caps the control octets give, with the scan
 * smtpe__stuff_start chose (AVX2 where the CPU has it); whole and in the pieces again with the
 * scalar scan and with the SSE2 one (each where the build has a better one). Oracles:
 *   - each call consumes at most what it was given and writes at most cap octets (canaries
 *     after the cap); with cap >= 4 an unrefused call consumes; the stuffer's in_octets and
 *     out_octets are what the calls returned; smtpe__stuff_finish writes at most 5;
 *   - the runs give the same wire octets, consumed count, seen and refused (split and
 *     cap invariance), every scan gives what the others do, and they are what
 *     a reference encoder (below: it looks ahead in the whole content where the engine
 *     holds a CR) gives;
 *   - BINARY: the wire is the content, nothing refused;
 *   - otherwise the wire holds no bare CR or LF and, under DATA, no end of data (CRLF "."
 *     CRLF, or "." CRLF first) but the final one (SMTP smuggling), also when refused;
 *   - when nothing was refused: BDAT gives exactly the content normalised (bare CR and LF as
 *     CRLF, NUL kept, the final CRLF added if missing); DATA decoded by the server
 *     (smtpe__data_start/smtpe__data_feed, REFUSE; KEEP too) ends exactly at the end of the
 *     wire with status OK (REFUSE: BAD_LINE_ENDING iff the content holds a NUL) and gives
 *     exactly the content normalised, unnormalised by the server; the scanner over the
 *     content (whole, and in the pieces) gives size = the content length, flags = seen, and
 *     wire_size = the wire octets less the doubled dots and the final ".\r\n";
 *   - when refused: refused is one flag, in refuse_mask and in seen.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "fuzz_util.h"

#define CAP_BIG ((size_t)1 << 20)

typedef struct run {
    fz_buf out;
    uint64_t consumed;
    unsigned seen, refused;
} run;

typedef struct plan {
    const uint8_t *ctl; /* control octets (may be none) */
    size_t nctl;
    int bytewise;       /* one octet at a time, cap 2 */
    int variant;        /* -1: the scan smtpe__stuff_start chose (the best the build and the CPU
                           have); else st.vector lowered to it (0 scalar, 1 SSE2) when lower */
} plan;

static size_t piece_len(const plan *pl, size_t i)
{
    if (pl->bytewise)
        return 1;
    if (pl->nctl < 2)
        return (size_t)-1; /* whole */
    return 1 + pl->ctl[(2 * i) % (pl->nctl & ~(size_t)1)] % 24;
}

static size_t out_cap(const plan *pl, size_t i)
{
    if (pl->bytewise)
        return 2;
    if (pl->nctl < 2)
        return CAP_BIG;
    uint8_t v = pl->ctl[(2 * i + 1) % (pl->nctl & ~(size_t)1)];
    return v < 160 ? v % 8u : (size_t)(v - 160) * 40;
}

static void encode(int mode, smtpe_line_ending_policy pol, unsigned mask, const uint8_t *p,
                   size_t n, const plan *pl, run *r)
{
    static uint8_t buf[CAP_BIG + 8];
    smtpe__stuffer st;
    memset(&st, 0xa5, sizeof st);
    smtpe__stuff_start(&st, mode, pol, mask);
    if (pl->variant >= 0 && pl->variant < st.vector)
        st.vector = pl->variant;
    size_t off = 0, piece = 0, call = 0, stalls = 0;
    uint64_t out_total = 0;
    while (off < n && !st.refused) {
        size_t len = piece_len(pl, piece++);
        if (len > n - off)
            len = n - off;
        /* exactly the piece, on the heap, so that ASan sees a read past it */
        uint8_t *q = malloc(len);
        if (!q)
            abort();
        memcpy(q, p + off, len);
        size_t done = 0;
        while (done < len && !st.refused) {
            size_t cap = out_cap(pl, call++), w = 12345;
            if (stalls && cap < 4) /* the caps may all be too small: then give room */
                cap = 4;
            memset(buf + cap, 0x5a, 8);
            size_t used = smtpe__stuff_encode(&st, q + done, len - done, buf, cap, &w);
            FUZZ_CHECK(used <= len - done, "stuff_encode consumed more than it was given");
            FUZZ_CHECK(w <= cap, "stuff_encode wrote more than cap");
            for (size_t k = cap; k < cap + 8; k++)
                FUZZ_CHECK(buf[k] == 0x5a, "stuff_encode wrote past cap");
            FUZZ_CHECK(used > 0 || cap < 4 || st.refused,
                       "stuff_encode with cap >= 4 consumed nothing and refused nothing");
            stalls = used || w ? 0 : stalls + 1;
            FUZZ_CHECK(stalls < 2, "stuff_encode makes no progress");
            fz_put(&r->out, buf, w);
            out_total += w;
            done += used;
        }
        free(q);
        off += done;
    }
    FUZZ_CHECK(st.in_octets == off, "in_octets is not the octets consumed");
    if (!st.refused) {
        uint8_t fin[SMTPE__STUFF_FINISH_MAX];
        size_t f = smtpe__stuff_finish(&st, fin);
        FUZZ_CHECK(f <= 5, "stuff_finish wrote more than 5 octets");
        fz_put(&r->out, fin, f);
        out_total += f;
    }
    FUZZ_CHECK(st.out_octets == out_total, "out_octets is not the octets written");
    r->consumed = off;
    r->seen = st.seen;
    r->refused = st.refused;
}

/* The reference encoder (whole content, looking ahead). */
static void reference(int mode, smtpe_line_ending_policy pol, unsigned mask, const uint8_t *p,
                      size_t n, run *r)
{
    int bol = 1, ended = 0;
    size_t len = 0, i = 0;
    if (mode == SMTPE__STUFF_BINARY) {
        fz_put(&r->out, p, n);
        mask = 0;
    } else if (pol == SMTPE_LINE_ENDING_REFUSE) {
        mask |= SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF;
    }
    for (; i < n; i++) {
        uint8_t c = p[i];
        unsigned f = 0;
        if (c == '\r' && i + 1 < n && p[i + 1] == '\n') {
            i++;
        } else if (c == '\r' || c == '\n') {
            f = c == '\r' ? SMTPE_CONTENT_BARE_CR : SMTPE_CONTENT_BARE_LF;
        } else {
            f = (c == 0 ? SMTPE_CONTENT_NUL : 0) | (c >= 0x80 ? SMTPE_CONTENT_8BIT : 0) |
                (len >= 998 ? SMTPE_CONTENT_LONG_LINE : 0);
        }
        r->seen |= f;
        if (f & mask) {
            unsigned m = f & mask;
            r->refused = m & (~m + 1u);
            r->consumed = c == '\r' ? i + 1 : i; /* a bare CR: at the octet after it */
            return;
        }
        if (c == '\r' || c == '\n') { /* a line break (BINARY: for LONG_LINE only) */
            if (mode != SMTPE__STUFF_BINARY)
                fz_put(&r->out, "\r\n", 2);
            bol = ended = 1;
            len = 0;
            continue;
        }
        if (mode == SMTPE__STUFF_DATA && bol && c == '.')
            fz_put_u8(&r->out, '.');
        if (mode != SMTPE__STUFF_BINARY)
            fz_put_u8(&r->out, c);
        bol = ended = 0;
        len++;
    }
    r->consumed = n;
    if (mode != SMTPE__STUFF_BINARY && n > 0 && !ended)
        fz_put(&r->out, "\r\n", 2);
    if (mode == SMTPE__STUFF_DATA)
        fz_put(&r->out, ".\r\n", 3);
}

static void same_run(const run *a, const run *b, const char *what)
{
    if (!fz_eq(a->out.p, a->out.len, b->out.p, b->out.len) || a->consumed != b->consumed ||
        a->seen != b->seen || a->refused != b->refused)
        fprintf(stderr, "%s: wire %zu/%zu consumed %llu/%llu seen 0x%x/0x%x refused 0x%x/0x%x\n",
                what, a->out.len, b->out.len, (unsigned long long)a->consumed,
                (unsigned long long)b->consumed, a->seen, b->seen, a->refused, b->refused);
    FUZZ_CHECK(fz_eq(a->out.p, a->out.len, b->out.p, b->out.len), "wire octets differ");
    FUZZ_CHECK(a->consumed == b->consumed, "consumed octets differ");
    FUZZ_CHECK(a->seen == b->seen, "seen differs");
    FUZZ_CHECK(a->refused == b->refused, "refused differs");
}

/* No bare CR or LF; under DATA no end of data before the final one. */
static void check_wire(const uint8_t *w, size_t n, int data, int complete)
{
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(w[i] != '\r' || (i + 1 < n && w[i + 1] == '\n'), "a bare CR on the wire");
        FUZZ_CHECK(w[i] != '\n' || (i > 0 && w[i - 1] == '\r'), "a bare LF on the wire");
    }
    if (!data)
        return;
    long end = fz_end_of_data(w, n);
    if (complete)
        FUZZ_CHECK(end == (long)n, "DATA wire: the end of data is not exactly the final .CRLF "
                                   "(SMTP smuggling)");
    else
        FUZZ_CHECK(end < 0, "refused DATA wire holds an end of data");
}

/* The server's DATA decoding of the wire under pol: content, status, end. */
static void server_decode(const uint8_t *w, size_t n, smtpe_line_ending_policy pol, fz_buf *c,
                          smtpe__data *d)
{
    size_t off = 0;
    int end = 0;
    smtpe__data_start(d, pol, 0, 1);
    while (off < n && !end) {
        smtpe_span chunk = {NULL, 0};
        size_t used = smtpe__data_feed(d, w + off, n - off, &chunk, &end);
        FUZZ_CHECK(used > 0 || chunk.len > 0 || end, "data_feed made no progress");
        fz_put(c, chunk.ptr, chunk.len);
        off += used;
    }
    FUZZ_CHECK(end && off == n, "the server did not end exactly at the end of the wire");
}

static void scan(const uint8_t *p, size_t n, const plan *pl, smtpe_content_info *info)
{
    smtpe_content_scan_init(info);
    for (size_t off = 0, i = 0; off < n; i++) {
        size_t len = piece_len(pl, i);
        if (len > n - off)
            len = n - off;
        smtpe_content_scan(info, p + off, len);
        off += len;
    }
    smtpe_content_scan_end(info);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int mode = (data[0] & 3) % 3;
    smtpe_line_ending_policy pol =
        (data[0] & 4) ? SMTPE_LINE_ENDING_NORMALISE : SMTPE_LINE_ENDING_REFUSE;
    unsigned mask = (unsigned)data[0] >> 3;
    size_t nctl = data[1] % 33u;
    if (nctl > size - 2)
        nctl = size - 2;
    const uint8_t *ctl = data + 2, *p = data + 2 + nctl;
    size_t n = size - 2 - nctl;

    plan whole = {NULL, 0, 0, -1}, bytewise = {NULL, 0, 1, -1}, pieces = {ctl, nctl, 0, -1};
    plan whole0 = {NULL, 0, 0, 0}, pieces0 = {ctl, nctl, 0, 0};
    plan whole1 = {NULL, 0, 0, 1}, pieces1 = {ctl, nctl, 0, 1};
    run w = {{0}, 0, 0, 0}, b = {{0}, 0, 0, 0}, s = {{0}, 0, 0, 0}, ref = {{0}, 0, 0, 0};
    run w0 = {{0}, 0, 0, 0}, s0 = {{0}, 0, 0, 0}, w1 = {{0}, 0, 0, 0}, s1 = {{0}, 0, 0, 0};
    encode(mode, pol, mask, p, n, &whole, &w);
    encode(mode, pol, mask, p, n, &bytewise, &b);
    encode(mode, pol, mask, p, n, &pieces, &s);
    encode(mode, pol, mask, p, n, &whole0, &w0);
    encode(mode, pol, mask, p, n, &pieces0, &s0);
    encode(mode, pol, mask, p, n, &whole1, &w1);
    encode(mode, pol, mask, p, n, &pieces1, &s1);
    reference(mode, pol, mask, p, n, &ref);

    if (w.refused) {
        FUZZ_CHECK((w.refused & (w.refused - 1)) == 0, "refused is not one flag");
        unsigned eff = mask | (pol == SMTPE_LINE_ENDING_REFUSE
                                   ? SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF : 0);
        FUZZ_CHECK(w.refused & eff & w.seen, "refused a flag not refused or not seen");
        FUZZ_CHECK(mode != SMTPE__STUFF_BINARY, "BINARY refused something");
    }
    if (mode == SMTPE__STUFF_BINARY) {
        FUZZ_CHECK(fz_eq(w.out.p, w.out.len, p, n), "BINARY: the wire is not the content");
    } else {
        check_wire(w.out.p, w.out.len, mode == SMTPE__STUFF_DATA, !w.refused);
    }
    same_run(&ref, &w, "reference vs whole");
    same_run(&w, &b, "whole vs byte-at-a-time");
    same_run(&w, &s, "whole vs pieces");
    same_run(&w, &w0, "whole: chosen vs scalar scan");
    same_run(&s, &s0, "pieces: chosen vs scalar scan");
    same_run(&w, &w1, "whole: chosen vs SSE2 scan");
    same_run(&s, &s1, "pieces: chosen vs SSE2 scan");
    if (!w.refused) {
        /* the content normalised: bare CR and LF as CRLF, NUL kept, the final CRLF */
        run nr = {{0}, 0, 0, 0};
        reference(SMTPE__STUFF_BDAT, SMTPE_LINE_ENDING_NORMALISE, 0, p, n, &nr);
        size_t dots = 0;
        for (size_t i = 0; i < nr.out.len; i++)
            dots += nr.out.p[i] == '.' && (i == 0 || nr.out.p[i - 1] == '\n');
        if (mode == SMTPE__STUFF_BDAT)
            FUZZ_CHECK(fz_eq(w.out.p, w.out.len, nr.out.p, nr.out.len),
                       "BDAT: the wire is not the content normalised");
        if (mode == SMTPE__STUFF_DATA) {
            fz_buf c1 = {0}, c2 = {0};
            smtpe__data d1, d2;
            server_decode(w.out.p, w.out.len, SMTPE_LINE_ENDING_REFUSE, &c1, &d1);
            server_decode(w.out.p, w.out.len, SMTPE_LINE_ENDING_KEEP, &c2, &d2);
            int nul = nr.out.len && memchr(nr.out.p, 0, nr.out.len) != NULL;
            FUZZ_CHECK(d1.status == (nul ? SMTPE_DATA_BAD_LINE_ENDING : SMTPE_DATA_OK),
                       "round trip: the server (REFUSE) refused the wire, or took a NUL");
            if (!nul)
                FUZZ_CHECK(fz_eq(c1.p, c1.len, nr.out.p, nr.out.len),
                           "round trip: the server's content is not the content normalised");
            FUZZ_CHECK(d2.status == SMTPE_DATA_OK && !(d2.flags & SMTPE_DATA_NORMALISED) &&
                           fz_eq(c2.p, c2.len, nr.out.p, nr.out.len),
                       "round trip (KEEP): the server's content is not the content normalised");
            FUZZ_CHECK(w.out.len == nr.out.len + dots + 3,
                       "DATA wire is not the normalised content + doubled dots + .CRLF");
            fz_free(&c1);
            fz_free(&c2);
        }
        smtpe_content_info i1, i2;
        scan(p, n, &whole, &i1);
        scan(p, n, &pieces, &i2);
        FUZZ_CHECK(i1.size == i2.size && i1.wire_size == i2.wire_size && i1.flags == i2.flags,
                   "scanner: split invariance");
        FUZZ_CHECK(i1.size == n, "scanner: size is not the content length");
        FUZZ_CHECK(i1.flags == w.seen, "scanner: flags are not the encoder's seen");
        FUZZ_CHECK(i1.wire_size == nr.out.len, "scanner: wire_size is not the normalised length");
        if (mode == SMTPE__STUFF_DATA)
            FUZZ_CHECK(i1.wire_size == w.out.len - dots - 3,
                       "scanner: wire_size is not the DATA wire less dots and .CRLF");
        if (mode == SMTPE__STUFF_BDAT)
            FUZZ_CHECK(i1.wire_size == w.out.len, "scanner: wire_size is not the BDAT wire");
        fz_free(&nr.out);
    }
    fz_free(&w.out);
    fz_free(&b.out);
    fz_free(&s.out);
    fz_free(&w0.out);
    fz_free(&s0.out);
    fz_free(&w1.out);
    fz_free(&s1.out);
    fz_free(&ref.out);
    return 0;
}
