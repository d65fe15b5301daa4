/*
 * fuzz_proxy.c - libFuzzer target for engine/proxy.c: the PROXY protocol reader and parser
 * (HAProxy's proxy-protocol.txt §2.1 v1, §2.2 v2, §2.2.7 TLVs) and smtpe_proxy_tlv_next.
 *
 * Input: octet 0 seeds the pseudo-random split, octet 1 chooses the reader's buffer size
 * (108, 128, 256 or 600 octets); the rest is what the client sends (a header, then anything).
 * The same rest, when it has at least 40 octets, is also read as an info for the emitter: see
 * info_from_octets.
 *
 * Oracles (abort on violation):
 *   - the reader consumes all of its input when it says MORE and never more than it was given;
 *     fed whole, one octet at a time and in pseudo-random pieces, it gives the same result and
 *     consumes the same octets; on DONE the header is exactly the consumed octets (it never
 *     reads past the header's end);
 *   - a header that parses is re-serialised (v1 text in several address spellings, v2 binary,
 *     and an INET/INET6 v2 also as v1 text) and the copy is read and parsed to the same info;
 *   - smtpe__proxy_emit inverts the parser: the info of a header that parses is emitted (never
 *     refused), and the copy is read whole and parsed to an equal info (for v2 the TLVs as
 *     octets too); its octets are exactly the reference serialiser's, IPv6 in the RFC 5952
 *     canonical text (lower case, no leading zeros, the first longest run of 2+ zero groups as
 *     "::"), LOCAL only for a local info with neither transport nor TLVs (PROXY with AF_UNSPEC
 *     otherwise, so that they reach the receiver);
 *   - smtpe__proxy_emit of an arbitrary info made of the input (see info_from_octets): refused
 *     exactly when the info is invalid (version not 1/2, family or transport out of range, TLVs
 *     in v1, v2 TLVs not well formed or len over 65535), else the reference's octets, read and
 *     parsed back to the info as the receiver sees it (expected_back); every emit fits in
 *     exactly its length, is refused in one octet less and never writes at or past cap;
 *   - the info is well formed: version, family and transport in range, local exactly for
 *     LOCAL / UNKNOWN / AF_UNSPEC, no TLVs for v1, TLVs within the gathered header;
 *   - walking the TLVs with smtpe_proxy_tlv_next covers exactly the TLV span, each value
 *     within it; walking arbitrary octets never leaves them;
 *   - smtpe__proxy_parse of the raw client octets succeeds only if the reader, given the same
 *     octets, says DONE at exactly their end;
 *   - reference for v2 LOCAL (§2.2): the signature, 0x20 and a length within the input and the
 *     buffer are a header, read whole and parsed as local, whatever the family octet and the
 *     block hold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "proxy.h"

#define MAX_CAP 600

static const uint8_t v2_sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                   0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};

typedef struct feed_result {
    int result;
    size_t used;
    size_t len;
    uint8_t buf[MAX_CAP];
} feed_result;

static uint32_t xorshift(uint32_t *s)
{
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

/* Feeds p[0..n) in pieces: mode 0 whole, 1 one octet at a time, 2 pseudo-random 1..16. */
static void feed(const uint8_t *p, size_t n, size_t cap, int mode, uint32_t seed,
                 feed_result *o)
{
    smtpe__proxy st;
    smtpe__proxy_start(&st);
    o->result = SMTPE__PROXY_MORE;
    size_t at = 0;
    uint32_t s = seed * 2654435761u + 1;
    do {
        size_t k = n - at;
        if (mode == 1 && k > 1)
            k = 1;
        if (mode == 2) {
            size_t piece = 1 + xorshift(&s) % 16;
            if (k > piece)
                k = piece;
        }
        size_t used = (size_t)-1;
        int r = smtpe__proxy_feed(&st, o->buf, cap, p + at, k, &used);
        FUZZ_CHECK(r == SMTPE__PROXY_MORE || r == SMTPE__PROXY_DONE || r == SMTPE__PROXY_INVALID,
                   "feed: unknown result");
        FUZZ_CHECK(used <= k, "feed: consumed more than it was given");
        FUZZ_CHECK(r != SMTPE__PROXY_MORE || used == k, "feed: MORE without consuming all");
        FUZZ_CHECK(st.len <= cap, "feed: gathered more than cap");
        at += used;
        o->result = r;
    } while (o->result == SMTPE__PROXY_MORE && at < n);
    o->used = at;
    o->len = st.len;
    if (o->result == SMTPE__PROXY_DONE) {
        FUZZ_CHECK(st.len == at && fz_eq(o->buf, st.len, p, at),
                   "feed: the header is not the consumed octets");
        FUZZ_CHECK(at >= 8, "feed: a header shorter than any can be");
    }
}

/* Walks tlvs: the values lie within it, one after another, and cover it exactly when full. */
static void walk_tlvs(smtpe_span tlvs, int must_cover)
{
    smtpe_span t = tlvs, v;
    uint8_t type;
    size_t covered = 0;
    while (smtpe_proxy_tlv_next(&t, &type, &v)) {
        FUZZ_CHECK(fz_within(v, tlvs.ptr, tlvs.len), "tlv_next: a value outside the TLVs");
        FUZZ_CHECK(v.ptr == tlvs.ptr + covered + 3, "tlv_next: a value not after its header");
        FUZZ_CHECK(type == tlvs.ptr[covered], "tlv_next: wrong type");
        covered += 3 + v.len;
        FUZZ_CHECK(covered <= tlvs.len, "tlv_next: walked past the end");
        FUZZ_CHECK(t.ptr == tlvs.ptr + covered && t.len == tlvs.len - covered,
                   "tlv_next: the rest is not what follows the TLV");
    }
    FUZZ_CHECK(t.len == tlvs.len - covered, "tlv_next: the span moved on the last call");
    if (must_cover)
        FUZZ_CHECK(covered == tlvs.len, "tlv_next: the walk does not cover the TLVs");
    else if (t.len >= 3)
        FUZZ_CHECK((size_t)(t.ptr[1] << 8 | t.ptr[2]) > t.len - 3,
                   "tlv_next: stopped before a whole TLV");
}

static void check_info(const smtpe_proxy_info *in, const uint8_t *buf, size_t len)
{
    static const uint8_t zero[16] = {0};
    FUZZ_CHECK(in->version == 1 || in->version == 2, "info: version");
    FUZZ_CHECK(in->family >= SMTPE_PROXY_AF_UNSPEC && in->family <= SMTPE_PROXY_AF_UNIX,
               "info: family");
    FUZZ_CHECK(in->transport >= 0 && in->transport <= SMTPE_PROXY_TRANSPORT_DGRAM,
               "info: transport");
    FUZZ_CHECK(in->local == 0 || in->local == 1, "info: local");
    FUZZ_CHECK(fz_within(in->tlvs, buf, len), "info: TLVs outside the header");
    if (in->version == 1) {
        FUZZ_CHECK(in->tlvs.len == 0, "info: TLVs in a v1 header");
        FUZZ_CHECK(in->family != SMTPE_PROXY_AF_UNIX, "info: AF_UNIX from v1");
    }
    if (in->family == SMTPE_PROXY_AF_UNSPEC)
        FUZZ_CHECK(in->local, "info: AF_UNSPEC not local");
    else
        FUZZ_CHECK(!in->local, "info: local with a family");
    if (in->family != SMTPE_PROXY_AF_INET && in->family != SMTPE_PROXY_AF_INET6)
        FUZZ_CHECK(fz_eq(in->src_addr, 16, zero, 16) && fz_eq(in->dst_addr, 16, zero, 16) &&
                       in->src_port == 0 && in->dst_port == 0,
                   "info: addresses without an INET family");
    if (in->family == SMTPE_PROXY_AF_INET)
        FUZZ_CHECK(fz_eq(in->src_addr + 4, 12, zero, 12) && fz_eq(in->dst_addr + 4, 12, zero, 12),
                   "info: IPv4 addresses beyond 4 octets");
    walk_tlvs(in->tlvs, 1);
}

static int same_info(const smtpe_proxy_info *a, const smtpe_proxy_info *b)
{
    return a->version == b->version && a->local == b->local && a->family == b->family &&
           a->transport == b->transport && fz_eq(a->src_addr, 16, b->src_addr, 16) &&
           fz_eq(a->dst_addr, 16, b->dst_addr, 16) && a->src_port == b->src_port &&
           a->dst_port == b->dst_port && fz_eq(a->tlvs.ptr, a->tlvs.len, b->tlvs.ptr, b->tlvs.len);
}

/* ---------------------------------------------------------------------------------------------
 * Serialiser
 * ------------------------------------------------------------------------------------------- */

static void put_str(fz_buf *b, const char *s)
{
    fz_put(b, s, strlen(s));
}

static void put_dec(fz_buf *b, unsigned v)
{
    char t[12];
    snprintf(t, sizeof t, "%u", v);
    put_str(b, t);
}

static void put_ipv4(fz_buf *b, const uint8_t *a)
{
    char t[20];
    snprintf(t, sizeof t, "%u.%u.%u.%u", a[0], a[1], a[2], a[3]);
    put_str(b, t);
}

/* IPv6 text in one of several RFC 4291 §2.2 spellings:
 *   0 eight groups, shortest hex;  1 eight groups of four upper-case digits;
 *   2 the longest run of zero groups (even one) as "::";  3 six groups and a dotted quad;
 *   4 like 2, then the last 32 bits as a dotted quad when "::" does not cover them;
 *   5 RFC 5952 §4: like 2, but only a run of two or more groups (the first of the longest). */
static void put_ipv6(fz_buf *b, const uint8_t *a, int style)
{
    unsigned g[8];
    for (int i = 0; i < 8; i++)
        g[i] = (unsigned)(a[2 * i] << 8 | a[2 * i + 1]);
    int groups = style == 3 || style == 4 ? 6 : 8;
    int run_at = -1, run_len = style == 5 ? 1 : 0;
    if (style == 2 || style == 4 || style == 5) {
        for (int i = 0; i < groups; i++) {
            int k = 0;
            while (i + k < groups && g[i + k] == 0)
                k++;
            if (k > run_len)
                run_at = i, run_len = k;
        }
    }
    char t[8];
    for (int i = 0; i < groups; i++) {
        if (i == run_at) {
            put_str(b, "::");
            i += run_len - 1;
            continue;
        }
        if (i > 0 && i != run_at + run_len)
            put_str(b, ":");
        snprintf(t, sizeof t, style == 1 ? "%04X" : "%x", g[i]);
        put_str(b, t);
    }
    if (groups == 6) {
        if (run_at < 0 || run_at + run_len != 6)
            put_str(b, ":");
        put_ipv4(b, a + 12);
    }
}

/* "PROXY TCP4|TCP6 src dst sport dport\r\n" or "PROXY UNKNOWN\r\n". */
static void serialise_v1(fz_buf *b, const smtpe_proxy_info *in, int style)
{
    if (in->family == SMTPE_PROXY_AF_INET) {
        put_str(b, "PROXY TCP4 ");
        put_ipv4(b, in->src_addr);
        put_str(b, " ");
        put_ipv4(b, in->dst_addr);
    } else if (in->family == SMTPE_PROXY_AF_INET6) {
        put_str(b, "PROXY TCP6 ");
        put_ipv6(b, in->src_addr, style);
        put_str(b, " ");
        put_ipv6(b, in->dst_addr, style);
    } else {
        put_str(b, "PROXY UNKNOWN\r\n");
        return;
    }
    put_str(b, " ");
    put_dec(b, in->src_port);
    put_str(b, " ");
    put_dec(b, in->dst_port);
    put_str(b, "\r\n");
}

static void put_be16(fz_buf *b, unsigned v)
{
    fz_put_u8(b, v >> 8);
    fz_put_u8(b, v & 0xff);
}

/* The v2 binary form: LOCAL for a local header without family or TLVs, PROXY otherwise. */
static void serialise_v2(fz_buf *b, const smtpe_proxy_info *in)
{
    static const uint8_t unix_block[216] = {0};
    size_t addr_len = 0;
    if (in->family == SMTPE_PROXY_AF_INET)
        addr_len = 12;
    else if (in->family == SMTPE_PROXY_AF_INET6)
        addr_len = 36;
    else if (in->family == SMTPE_PROXY_AF_UNIX)
        addr_len = 216;
    int local_cmd = in->local && in->transport == 0 && in->tlvs.len == 0;
    fz_put(b, v2_sig, sizeof v2_sig);
    fz_put_u8(b, local_cmd ? 0x20 : 0x21);
    fz_put_u8(b, (unsigned)(in->family << 4 | in->transport));
    put_be16(b, (unsigned)(addr_len + in->tlvs.len));
    if (in->family == SMTPE_PROXY_AF_INET || in->family == SMTPE_PROXY_AF_INET6) {
        size_t a = addr_len == 12 ? 4 : 16;
        fz_put(b, in->src_addr, a);
        fz_put(b, in->dst_addr, a);
        put_be16(b, in->src_port);
        put_be16(b, in->dst_port);
    } else if (in->family == SMTPE_PROXY_AF_UNIX) {
        fz_put(b, unix_block, sizeof unix_block);
    }
    fz_put(b, in->tlvs.ptr, in->tlvs.len);
}

/* Reads and parses the serialised copy; it must give want. */
static void check_copy(const fz_buf *b, const smtpe_proxy_info *want, const char *what)
{
    static feed_result o;
    if (want->version == 1 && b->len > SMTPE__PROXY_V1_MAX)
        return; /* a dotted-quad tail can make an IPv6 address longer than the 39 octets §2.1
                   counts on; such a v1 header is over the limit and rightly refused */
    feed(b->p, b->len, MAX_CAP, 1, 0, &o);
    if (o.result != SMTPE__PROXY_DONE || o.used != b->len)
        fprintf(stderr, "%s: \"%.*s\" not read whole\n", what, (int)b->len, (const char *)b->p);
    FUZZ_CHECK(o.result == SMTPE__PROXY_DONE && o.used == b->len,
               "a re-serialised header is not read whole");
    smtpe_proxy_info again;
    int r = smtpe__proxy_parse(o.buf, o.len, &again);
    if (r != 0)
        fprintf(stderr, "%s: \"%.*s\" does not parse\n", what, (int)b->len, (const char *)b->p);
    FUZZ_CHECK(r == 0, "a re-serialised header does not parse");
    FUZZ_CHECK(same_info(&again, want), "a re-serialised header parses to other info");
}

static void round_trip(const smtpe_proxy_info *in)
{
    fz_buf b = {0};
    if (in->version == 1) {
        for (int style = 0; style <= (in->family == SMTPE_PROXY_AF_INET6 ? 4 : 0); style++) {
            b.len = 0;
            serialise_v1(&b, in, style);
            check_copy(&b, in, "v1");
        }
    } else {
        serialise_v2(&b, in);
        check_copy(&b, in, "v2");
        if ((in->family == SMTPE_PROXY_AF_INET || in->family == SMTPE_PROXY_AF_INET6) &&
            in->transport == SMTPE_PROXY_TRANSPORT_STREAM) {
            smtpe_proxy_info as_v1 = *in;
            as_v1.version = 1;
            as_v1.tlvs.ptr = NULL;
            as_v1.tlvs.len = 0;
            for (int style = 0; style <= (in->family == SMTPE_PROXY_AF_INET6 ? 4 : 0); style++) {
                b.len = 0;
                serialise_v1(&b, &as_v1, style);
                check_copy(&b, &as_v1, "v2 as v1");
            }
        }
    }
    fz_free(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Emitter
 * ------------------------------------------------------------------------------------------- */

#define EMIT_MAX (16 + 65535)

/* An info from p[0..n) (n >= 40): version p[0] % 4, local p[1] % 4 (0, or a non-zero value),
 * family p[2] % 6 - 1 and transport p[3] % 5 - 1 (one value out of range at each end), the
 * addresses p[4..36), ports p[36..40) big-endian, the TLVs the rest (none if p[3] & 0x80). */
static smtpe_proxy_info info_from_octets(const uint8_t *p, size_t n)
{
    smtpe_proxy_info in;
    memset(&in, 0, sizeof in);
    in.version = p[0] % 4;
    in.local = p[1] % 4;
    in.family = p[2] % 6 - 1;
    in.transport = p[3] % 5 - 1;
    memcpy(in.src_addr, p + 4, 16);
    memcpy(in.dst_addr, p + 20, 16);
    in.src_port = (uint16_t)(p[36] << 8 | p[37]);
    in.dst_port = (uint16_t)(p[38] << 8 | p[39]);
    if (!(p[3] & 0x80))
        in.tlvs = (smtpe_span){p + 40, n - 40};
    return in;
}

/* 1 if t is whole TLVs (§2.2.7), by smtpe_proxy_tlv_next. */
static int tlvs_whole(smtpe_span t)
{
    uint8_t type;
    smtpe_span v;
    while (smtpe_proxy_tlv_next(&t, &type, &v))
        ;
    return t.len == 0;
}

/* 1 if smtpe__proxy_emit must accept in (given room). */
static int emit_valid(const smtpe_proxy_info *in)
{
    static const size_t addr_len[4] = {0, 12, 36, 216};
    if ((in->version != 1 && in->version != 2) || in->family < 0 || in->family > 3 ||
        in->transport < 0 || in->transport > 2)
        return 0;
    if (in->version == 1)
        return in->tlvs.len == 0;
    size_t block = in->local ? 0 : addr_len[in->family];
    return tlvs_whole(in->tlvs) && block + in->tlvs.len <= 65535;
}

/* The info a receiver parses from what smtpe__proxy_emit sends for a valid in: v1 "UNKNOWN"
 * (local) unless TCP or an unspecified transport over IPv4/IPv6, and then STREAM; v2 local for
 * a local info or AF_UNSPEC, with the transport and TLVs kept; the address fields only as far
 * as the family has them (none for AF_UNIX). */
static smtpe_proxy_info expected_back(const smtpe_proxy_info *in)
{
    smtpe_proxy_info e;
    memset(&e, 0, sizeof e);
    e.version = in->version;
    int ip = in->family == SMTPE_PROXY_AF_INET || in->family == SMTPE_PROXY_AF_INET6;
    if (in->version == 1) {
        if (in->local || !ip || in->transport == SMTPE_PROXY_TRANSPORT_DGRAM) {
            e.local = 1;
            return e;
        }
        e.transport = SMTPE_PROXY_TRANSPORT_STREAM;
    } else {
        e.transport = in->transport;
        e.tlvs = in->tlvs;
        if (in->local || in->family == SMTPE_PROXY_AF_UNSPEC) {
            e.local = 1;
            return e;
        }
    }
    e.family = in->family;
    if (ip) {
        size_t k = in->family == SMTPE_PROXY_AF_INET ? 4 : 16;
        memcpy(e.src_addr, in->src_addr, k);
        memcpy(e.dst_addr, in->dst_addr, k);
        e.src_port = in->src_port;
        e.dst_port = in->dst_port;
    }
    return e;
}

/* Emits in: refused exactly when invalid; else the fit is exact (len fits, len - 1 does not,
 * nothing is written at or past cap), the octets are the reference serialiser's for want, and
 * they are read (when the reader's buffer can hold them) and parsed back to want. */
static void check_emit(const smtpe_proxy_info *in, const smtpe_proxy_info *want)
{
    static uint8_t out[EMIT_MAX + 1], again[EMIT_MAX + 1];
    static feed_result o;
    size_t n = smtpe__proxy_emit(in, out, sizeof out);
    FUZZ_CHECK((n != 0) == emit_valid(in), "emit: refused a valid info or accepted an invalid one");
    if (n == 0)
        return;
    FUZZ_CHECK(n <= EMIT_MAX && (in->version == 2 || n <= SMTPE__PROXY_V1_MAX),
               "emit: longer than a header can be");
    memset(again, 0xa5, n);
    FUZZ_CHECK(smtpe__proxy_emit(in, again, n - 1) == 0, "emit: fitted in one octet less");
    FUZZ_CHECK(again[n - 1] == 0xa5, "emit: wrote at or past cap");
    FUZZ_CHECK(smtpe__proxy_emit(in, again, n) == n && fz_eq(again, n, out, n),
               "emit: another result with exactly the room it needs");

    fz_buf ref = {0};
    if (want->version == 1) {
        serialise_v1(&ref, want, 5);
    } else {
        /* the command is LOCAL only for an info the caller marked local: a non-local AF_UNSPEC
         * one goes as PROXY, even without transport or TLVs */
        smtpe_proxy_info sent = *want;
        sent.local = in->local != 0;
        serialise_v2(&ref, &sent);
    }
    if (!fz_eq(out, n, ref.p, ref.len))
        fprintf(stderr, "emit: \"%.*s\"\nref:  \"%.*s\"\n", (int)n, (const char *)out,
                (int)ref.len, (const char *)ref.p);
    FUZZ_CHECK(fz_eq(out, n, ref.p, ref.len), "emit: other octets than the reference's");
    fz_free(&ref);

    if (n <= MAX_CAP) {
        feed(out, n, MAX_CAP, 2, (uint32_t)n, &o);
        FUZZ_CHECK(o.result == SMTPE__PROXY_DONE && o.used == n, "emit: not read whole");
    }
    smtpe_proxy_info back;
    FUZZ_CHECK(smtpe__proxy_parse(out, n, &back) == 0, "emit: the header does not parse");
    FUZZ_CHECK(same_info(&back, want), "emit: the header parses to other info");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t caps[4] = {108, 128, 256, MAX_CAP};
    static feed_result whole, piece;
    if (size < 2)
        return 0;
    uint32_t seed = data[0];
    size_t cap = caps[data[1] % 4];
    const uint8_t *p = data + 2;
    size_t n = size - 2;

    feed(p, n, cap, 0, seed, &whole);
    for (int mode = 1; mode <= 2; mode++) {
        feed(p, n, cap, mode, seed, &piece);
        FUZZ_CHECK(piece.result == whole.result && piece.used == whole.used,
                   "split feeding gives another result or consumes other octets");
    }
    if (whole.result == SMTPE__PROXY_MORE)
        FUZZ_CHECK(whole.used == n, "MORE without all input consumed");

    if (whole.result == SMTPE__PROXY_DONE) {
        smtpe_proxy_info info;
        if (smtpe__proxy_parse(whole.buf, whole.len, &info) == 0) {
            check_info(&info, whole.buf, whole.len);
            round_trip(&info);
            smtpe_proxy_info want = expected_back(&info);
            FUZZ_CHECK(same_info(&want, &info), "a parsed info is not what it would parse back to");
            check_emit(&info, &info);
        }
    }

    /* the parser on the raw octets: it accepts only what the reader reads whole */
    smtpe_proxy_info raw;
    if (n <= MAX_CAP && smtpe__proxy_parse(p, n, &raw) == 0) {
        check_info(&raw, p, n);
        feed(p, n, MAX_CAP, 0, seed, &piece);
        FUZZ_CHECK(piece.result == SMTPE__PROXY_DONE && piece.used == n,
                   "a parsed header is not what the reader reads");
    }

    /* reference for v2 LOCAL (§2.2): "the receiver must accept this connection as valid and
     * must use the real connection endpoints and discard the protocol block including the
     * family": the signature, version 2 / command LOCAL and a length that fits the buffer make
     * a header whatever the family octet and the block hold */
    if (n >= 16 && memcmp(p, v2_sig, sizeof v2_sig) == 0 && p[12] == 0x20) {
        size_t total = 16 + ((size_t)p[14] << 8 | p[15]);
        if (total <= n && total <= cap) {
            FUZZ_CHECK(whole.result == SMTPE__PROXY_DONE && whole.used == total,
                       "a v2 LOCAL header was not read whole (its family and block are ignored)");
            smtpe_proxy_info li;
            FUZZ_CHECK(smtpe__proxy_parse(whole.buf, whole.len, &li) == 0 && li.version == 2 &&
                           li.local,
                       "a v2 LOCAL header does not parse as local (§2.2)");
        }
    }

    /* the emitter on an info made of the input */
    if (n >= 40) {
        smtpe_proxy_info in = info_from_octets(p, n);
        smtpe_proxy_info want = emit_valid(&in) ? expected_back(&in) : in;
        check_emit(&in, &want);
    }

    /* TLV walking over arbitrary octets stays within them */
    smtpe_span any = {p, n};
    walk_tlvs(any, 0);
    return 0;
}
