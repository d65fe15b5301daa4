/* proxy.c - the PROXY protocol header (HAProxy's proxy-protocol.txt): the incremental reader
 * that gathers a header and never consumes past it, the v1 (§2.1, text) and v2 (§2.2, binary)
 * parsers, IPv4 / IPv6 text to binary (RFC 4291 §2.2), the emitter (the parsers' inverse, IPv6
 * in RFC 5952 text) and the public TLV walker (§2.2.7). */
#include "proxy.h"

#include "command.h" /* smtpe__hex_digit */

#include <string.h>

/* §2.1: "PROXY" and one space begin every v1 header. */
static const uint8_t v1_prefix[6] = {'P', 'R', 'O', 'X', 'Y', ' '};
#define V1_PREFIX_LEN sizeof v1_prefix

/* §2.2: the 12-octet signature that begins every v2 header. */
static const uint8_t v2_sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                   0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};
#define V2_SIG_LEN sizeof v2_sig

/* §2.2 address block lengths: two IPv4 addresses and two ports, two IPv6 addresses and two
 * ports, two 108-octet AF_UNIX paths. */
#define V2_ADDR_INET 12
#define V2_ADDR_INET6 36
#define V2_ADDR_UNIX 216

#define V2_CMD_LOCAL 0x0
#define V2_CMD_PROXY 0x1

static uint16_t be16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static int is_decimal(int c)
{
    return c >= '0' && c <= '9';
}

/* ---------------------------------------------------------------------------------------------
 * v2 fixed part
 * ------------------------------------------------------------------------------------------- */

/* Checks the 16 fixed octets of a v2 header (signature, ver_cmd, fam, len; §2.2). Returns the
 * address block length the command and family need (0 for LOCAL and for AF_UNSPEC), or -1 if
 * the version is not 2, the command is neither LOCAL nor PROXY, the fam octet is not one of
 * the defined values, or len is shorter than the address block. */
static int v2_fixed_check(const uint8_t *h)
{
    if (memcmp(h, v2_sig, V2_SIG_LEN) != 0)
        return -1;
    unsigned ver = h[12] >> 4, cmd = h[12] & 0x0f, family = h[13] >> 4, transport = h[13] & 0x0f;
    if (ver != 2 || (cmd != V2_CMD_LOCAL && cmd != V2_CMD_PROXY))
        return -1;
    if (cmd == V2_CMD_LOCAL) /* the block "including the family" is ignored (§2.2) */
        return 0;
    if (family > SMTPE_PROXY_AF_UNIX || transport > SMTPE_PROXY_TRANSPORT_DGRAM)
        return -1;
    static const int need[4] = {0, V2_ADDR_INET, V2_ADDR_INET6, V2_ADDR_UNIX};
    int addr_len = need[family];
    if (be16(h + 14) < addr_len)
        return -1;
    return addr_len;
}

/* ---------------------------------------------------------------------------------------------
 * Incremental reader
 * ------------------------------------------------------------------------------------------- */

void smtpe__proxy_start(smtpe__proxy *st)
{
    st->len = 0;
    st->need = 0;
}

/* One octet c just stored at buf[st->len - 1] of a v1 header. Returns SMTPE__PROXY_*. */
static int v1_step(const smtpe__proxy *st, const uint8_t *buf, uint8_t c)
{
    size_t i = st->len - 1; /* the index of c */
    if (i < V1_PREFIX_LEN)
        return c == v1_prefix[i] ? SMTPE__PROXY_MORE : SMTPE__PROXY_INVALID;
    if (buf[i - 1] == '\r')
        return c == '\n' ? SMTPE__PROXY_DONE : SMTPE__PROXY_INVALID; /* a bare CR */
    if (c == '\n')
        return SMTPE__PROXY_INVALID; /* a bare LF: only CRLF ends the header */
    /* Octet 106 must be the CR of a CRLF that ends at octet 107. */
    if (st->len == SMTPE__PROXY_V1_MAX - 1 && c != '\r')
        return SMTPE__PROXY_INVALID;
    return SMTPE__PROXY_MORE;
}

/* One octet c just stored at buf[st->len - 1] of a v2 header (buf holds at least the 16 fixed
 * octets' room). Returns SMTPE__PROXY_*; sets st->need once the length is known. */
static int v2_step(smtpe__proxy *st, const uint8_t *buf, uint8_t c, size_t cap)
{
    size_t i = st->len - 1;
    if (i < V2_SIG_LEN)
        return c == v2_sig[i] ? SMTPE__PROXY_MORE : SMTPE__PROXY_INVALID;
    if (i == 12 && ((c >> 4) != 2 || (c & 0x0f) > V2_CMD_PROXY))
        return SMTPE__PROXY_INVALID;
    if (i == 13 && (buf[12] & 0x0f) != V2_CMD_LOCAL &&
        ((c >> 4) > SMTPE_PROXY_AF_UNIX || (c & 0x0f) > SMTPE_PROXY_TRANSPORT_DGRAM))
        return SMTPE__PROXY_INVALID; /* LOCAL ignores the family (§2.2) */
    if (i < SMTPE__PROXY_V2_FIXED - 1)
        return SMTPE__PROXY_MORE;
    if (st->need == 0) { /* the last fixed octet: the length is known */
        size_t total = SMTPE__PROXY_V2_FIXED + be16(buf + 14);
        if (total > cap || v2_fixed_check(buf) < 0)
            return SMTPE__PROXY_INVALID;
        st->need = total;
    }
    return st->len == st->need ? SMTPE__PROXY_DONE : SMTPE__PROXY_MORE;
}

int smtpe__proxy_feed(smtpe__proxy *st, uint8_t *buf, size_t cap, const uint8_t *p, size_t n,
                      size_t *used)
{
    size_t k = 0;
    int r = SMTPE__PROXY_MORE;
    /* A header already complete stays complete and takes nothing more. */
    if (st->need != 0 && st->len == st->need)
        r = SMTPE__PROXY_DONE;
    else if (st->need == 0 && st->len >= 2 && buf[0] == 'P' && buf[st->len - 2] == '\r' &&
             buf[st->len - 1] == '\n')
        r = SMTPE__PROXY_DONE;
    while (r == SMTPE__PROXY_MORE && k < n) {
        uint8_t c = p[k++];
        if (st->len >= cap) {
            r = SMTPE__PROXY_INVALID; /* unreachable with cap >= 108: kept for safety */
            break;
        }
        buf[st->len++] = c;
        if (buf[0] == 'P')
            r = v1_step(st, buf, c);
        else if (buf[0] == v2_sig[0])
            r = v2_step(st, buf, c, cap);
        else
            r = SMTPE__PROXY_INVALID;
    }
    *used = k;
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Addresses in text form
 * ------------------------------------------------------------------------------------------- */

/* Parses a dotted-quad IPv4 address p[0..n) into out[4]: four decimal octet values 0..255 of
 * 1..3 digits, no leading zeros ("0" is fine, "00" and "01" are not), single dots. Returns 0,
 * or -1. */
static int parse_ipv4(const uint8_t *p, size_t n, uint8_t out[4])
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part > 0) {
            if (i >= n || p[i] != '.')
                return -1;
            i++;
        }
        size_t start = i;
        unsigned v = 0;
        while (i < n && is_decimal(p[i]) && i - start < 3)
            v = v * 10 + (unsigned)(p[i++] - '0');
        size_t digits = i - start;
        if (digits == 0 || v > 255 || (digits > 1 && p[start] == '0'))
            return -1;
        out[part] = (uint8_t)v;
    }
    return i == n ? 0 : -1;
}

/* Parses the hex groups of p[0..n) separated by single ':' into groups[*count..], at most max of
 * them; the last piece may instead be a dotted quad (two groups) when v4_ok. n == 0 is no group.
 * Returns 0, or -1 if a group is empty or longer than 4 hex digits, or there are too many. */
static int parse_groups(const uint8_t *p, size_t n, uint16_t *groups, int max, int *count,
                        int v4_ok)
{
    size_t i = 0;
    *count = 0;
    if (n == 0)
        return 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != ':')
            j++;
        /* the piece p[i..j) */
        if (v4_ok && j == n && memchr(p + i, '.', j - i) != NULL) {
            uint8_t a[4];
            if (*count + 2 > max || parse_ipv4(p + i, j - i, a) != 0)
                return -1;
            groups[(*count)++] = (uint16_t)(a[0] << 8 | a[1]);
            groups[(*count)++] = (uint16_t)(a[2] << 8 | a[3]);
            return 0;
        }
        if (j == i || j - i > 4 || *count >= max)
            return -1;
        unsigned v = 0;
        for (size_t k = i; k < j; k++) {
            int h = smtpe__hex_digit(p[k]);
            if (h < 0)
                return -1;
            v = v << 4 | (unsigned)h;
        }
        groups[(*count)++] = (uint16_t)v;
        if (j == n)
            return 0;
        i = j + 1; /* past the ':'; a trailing ':' leaves an empty piece, which fails above */
    }
}

/* Parses an IPv6 address in the text forms of RFC 4291 §2.2 into out[16]: eight groups of 1..4
 * hex digits (either case), or fewer with one "::" standing for one or more zero groups, the
 * last 32 bits optionally as a dotted quad. No zone index, no brackets. Returns 0, or -1. */
static int parse_ipv6(const uint8_t *p, size_t n, uint8_t out[16])
{
    uint16_t head[8], tail[8];
    int nh = 0, nt = 0;
    size_t dc = n; /* where "::" is, if anywhere */
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == ':' && p[i + 1] == ':') {
            dc = i;
            break;
        }
    if (dc == n) {
        if (parse_groups(p, n, head, 8, &nh, 1) != 0 || nh != 8)
            return -1;
    } else {
        const uint8_t *rest = p + dc + 2;
        size_t rest_n = n - dc - 2;
        /* the part after "::" holds no other "::" and does not start with ':' (":::") */
        if (rest_n > 0 && rest[0] == ':')
            return -1;
        if (parse_groups(p, dc, head, 7, &nh, 0) != 0)
            return -1;
        if (parse_groups(rest, rest_n, tail, 7, &nt, 1) != 0)
            return -1;
        if (nh + nt > 7) /* "::" stands for at least one group */
            return -1;
    }
    memset(out, 0, 16);
    for (int g = 0; g < nh; g++) {
        out[2 * g] = (uint8_t)(head[g] >> 8);
        out[2 * g + 1] = (uint8_t)head[g];
    }
    for (int g = 0; g < nt; g++) {
        int at = 8 - nt + g;
        out[2 * at] = (uint8_t)(tail[g] >> 8);
        out[2 * at + 1] = (uint8_t)tail[g];
    }
    return 0;
}

/* Parses a port p[0..n): 0..65535 in decimal, no leading zeros. Returns 0, or -1. */
static int parse_port(const uint8_t *p, size_t n, uint16_t *port)
{
    if (n == 0 || n > 5 || (n > 1 && p[0] == '0'))
        return -1;
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_decimal(p[i]))
            return -1;
        v = v * 10 + (uint32_t)(p[i] - '0');
    }
    if (v > 65535)
        return -1;
    *port = (uint16_t)v;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Parsers
 * ------------------------------------------------------------------------------------------- */

/* v1 (§2.1): buf[0..len) is "PROXY " ... CRLF. Fields are separated by exactly one space. */
static int parse_v1(const uint8_t *buf, size_t len, smtpe_proxy_info *out)
{
    if (len < V1_PREFIX_LEN + 2 || len > SMTPE__PROXY_V1_MAX ||
        memcmp(buf, v1_prefix, V1_PREFIX_LEN) != 0 || buf[len - 2] != '\r' || buf[len - 1] != '\n')
        return -1;
    const uint8_t *p = buf + V1_PREFIX_LEN;
    size_t n = len - V1_PREFIX_LEN - 2; /* the fields, without the CRLF */
    /* The header ends at the first CRLF; no CR or LF may come before it. */
    if (memchr(p, '\r', n) != NULL || memchr(p, '\n', n) != NULL)
        return -1;
    out->version = 1;
    if (n >= 7 && memcmp(p, "UNKNOWN", 7) == 0) {
        out->local = 1; /* "the receiver must ignore anything presented before the CRLF" */
        return 0;
    }
    /* "TCP4" / "TCP6", then four fields */
    smtpe_span f[5];
    size_t nf = 0, i = 0;
    while (nf < 5) {
        size_t j = i;
        while (j < n && p[j] != ' ')
            j++;
        f[nf].ptr = p + i;
        f[nf].len = j - i;
        nf++;
        if (j == n)
            break;
        i = j + 1;
    }
    if (nf != 5 || f[4].ptr + f[4].len != p + n)
        return -1; /* too few fields, or a space after the fifth */
    int r;
    if (f[0].len == 4 && memcmp(f[0].ptr, "TCP4", 4) == 0) {
        out->family = SMTPE_PROXY_AF_INET;
        r = parse_ipv4(f[1].ptr, f[1].len, out->src_addr) |
            parse_ipv4(f[2].ptr, f[2].len, out->dst_addr);
    } else if (f[0].len == 4 && memcmp(f[0].ptr, "TCP6", 4) == 0) {
        out->family = SMTPE_PROXY_AF_INET6;
        r = parse_ipv6(f[1].ptr, f[1].len, out->src_addr) |
            parse_ipv6(f[2].ptr, f[2].len, out->dst_addr);
    } else {
        return -1;
    }
    if (r != 0 || parse_port(f[3].ptr, f[3].len, &out->src_port) != 0 ||
        parse_port(f[4].ptr, f[4].len, &out->dst_port) != 0)
        return -1;
    out->transport = SMTPE_PROXY_TRANSPORT_STREAM;
    return 0;
}

/* 1 if t[0..n) is a sequence of whole TLVs (§2.2.7): type (1), length (2, network order),
 * value (length octets), with nothing left over. */
static int tlvs_valid(const uint8_t *t, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (n - i < 3 || n - i - 3 < be16(t + i + 1))
            return 0;
        i += 3 + (size_t)be16(t + i + 1);
    }
    return 1;
}

/* v2 (§2.2): buf[0..len) is the 16 fixed octets, then exactly len (from the header) octets of
 * address block and TLVs. */
static int parse_v2(const uint8_t *buf, size_t len, smtpe_proxy_info *out)
{
    if (len < SMTPE__PROXY_V2_FIXED)
        return -1;
    int addr_len = v2_fixed_check(buf);
    if (addr_len < 0 || len != SMTPE__PROXY_V2_FIXED + (size_t)be16(buf + 14))
        return -1;
    out->version = 2;
    if ((buf[12] & 0x0f) == V2_CMD_LOCAL) {
        out->local = 1; /* the block, its family included, is discarded (§2.2) */
        return 0;
    }
    const uint8_t *a = buf + SMTPE__PROXY_V2_FIXED;
    const uint8_t *t = a + addr_len;
    size_t tn = len - SMTPE__PROXY_V2_FIXED - (size_t)addr_len;
    if (!tlvs_valid(t, tn)) {
        if ((buf[13] >> 4) != SMTPE_PROXY_AF_UNSPEC)
            return -1;
        tn = 0; /* AF_UNSPEC: "the receiver should ignore address information" (§2.2) */
    }
    out->family = buf[13] >> 4;
    out->transport = buf[13] & 0x0f;
    out->local = out->family == SMTPE_PROXY_AF_UNSPEC;
    if (out->family == SMTPE_PROXY_AF_INET) {
        memcpy(out->src_addr, a, 4);
        memcpy(out->dst_addr, a + 4, 4);
        out->src_port = be16(a + 8);
        out->dst_port = be16(a + 10);
    } else if (out->family == SMTPE_PROXY_AF_INET6) {
        memcpy(out->src_addr, a, 16);
        memcpy(out->dst_addr, a + 16, 16);
        out->src_port = be16(a + 32);
        out->dst_port = be16(a + 34);
    }
    out->tlvs.ptr = t;
    out->tlvs.len = tn;
    return 0;
}

int smtpe__proxy_parse(const uint8_t *buf, size_t len, smtpe_proxy_info *out)
{
    smtpe_proxy_info info;
    memset(&info, 0, sizeof info);
    int r = -1;
    if (len > 0 && buf[0] == 'P')
        r = parse_v1(buf, len, &info);
    else if (len > 0 && buf[0] == v2_sig[0])
        r = parse_v2(buf, len, &info);
    if (r == 0)
        *out = info;
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Emitter
 * ------------------------------------------------------------------------------------------- */

static void put_be16(uint8_t *t, unsigned v)
{
    t[0] = (uint8_t)(v >> 8);
    t[1] = (uint8_t)v;
}

/* Writes v in decimal without leading zeros ("0" for 0) at t. Returns the digits (1..10). */
static size_t put_dec(uint8_t *t, unsigned v)
{
    uint8_t d[10];
    size_t k = 0;
    do {
        d[k++] = (uint8_t)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < k; i++)
        t[i] = d[k - 1 - i];
    return k;
}

/* Writes the dotted quad of a[4] at t (the form parse_ipv4 reads). Returns 7..15. */
static size_t put_ipv4(uint8_t *t, const uint8_t a[4])
{
    size_t n = 0;
    for (int i = 0; i < 4; i++) {
        if (i > 0)
            t[n++] = '.';
        n += put_dec(t + n, a[i]);
    }
    return n;
}

/* Writes a[16] at t in the canonical text form of RFC 5952 §4: lower-case hex groups without
 * leading zeros (§4.1, §4.3), the longest run of two or more zero groups as "::" (§4.2.1,
 * §4.2.2), the first of equally long runs (§4.2.3). No dotted-quad tail. Returns 2..39. */
static size_t put_ipv6(uint8_t *t, const uint8_t a[16])
{
    static const char hex[16] = "0123456789abcdef";
    unsigned g[8];
    int run_at = -1, run_len = 1; /* a single zero group is not compressed */
    for (int i = 0; i < 8; i++)
        g[i] = (unsigned)(a[2 * i] << 8 | a[2 * i + 1]);
    for (int i = 0; i < 8;) {
        int k = i;
        while (k < 8 && g[k] == 0)
            k++;
        if (k - i > run_len)
            run_at = i, run_len = k - i;
        i = k > i ? k : i + 1;
    }
    size_t n = 0;
    for (int i = 0; i < 8; i++) {
        if (i == run_at) {
            t[n++] = ':';
            t[n++] = ':';
            i += run_len - 1;
            continue;
        }
        if (i > 0 && i != run_at + run_len)
            t[n++] = ':';
        int shift = 12;
        while (shift > 0 && (g[i] >> shift) == 0)
            shift -= 4;
        for (; shift >= 0; shift -= 4)
            t[n++] = (uint8_t)hex[(g[i] >> shift) & 0x0f];
    }
    return n;
}

/* v1 (§2.1): "PROXY TCP4|TCP6 src dst sport dport\r\n" for a TCP (or unspecified transport)
 * connection over IPv4 / IPv6, else "PROXY UNKNOWN\r\n" (local, AF_UNSPEC, AF_UNIX, UDP: the
 * "other, unsupported or unknown protocols" of §2.1). v1 has no TLVs: info with TLVs is
 * invalid. Returns the length (15..104), or 0. */
static size_t emit_v1(const smtpe_proxy_info *info, uint8_t *out, size_t cap)
{
    uint8_t t[SMTPE__PROXY_V1_MAX];
    size_t n = V1_PREFIX_LEN;
    int inet = info->family == SMTPE_PROXY_AF_INET, inet6 = info->family == SMTPE_PROXY_AF_INET6;
    if (info->tlvs.len != 0)
        return 0;
    memcpy(t, v1_prefix, V1_PREFIX_LEN);
    if (info->local || (!inet && !inet6) || info->transport == SMTPE_PROXY_TRANSPORT_DGRAM) {
        memcpy(t + n, "UNKNOWN", 7);
        n += 7;
    } else {
        memcpy(t + n, inet ? "TCP4 " : "TCP6 ", 5);
        n += 5;
        n += inet ? put_ipv4(t + n, info->src_addr) : put_ipv6(t + n, info->src_addr);
        t[n++] = ' ';
        n += inet ? put_ipv4(t + n, info->dst_addr) : put_ipv6(t + n, info->dst_addr);
        t[n++] = ' ';
        n += put_dec(t + n, info->src_port);
        t[n++] = ' ';
        n += put_dec(t + n, info->dst_port);
    }
    t[n++] = '\r';
    t[n++] = '\n';
    if (n > cap)
        return 0;
    memcpy(out, t, n);
    return n;
}

/* v2 (§2.2): the signature, ver_cmd, fam, len, the address block and info->tlvs. A local info
 * is sent as LOCAL with fam 0x00 and nothing after it; one with a transport or TLVs as PROXY
 * with AF_UNSPEC (and that transport), so that they reach the receiver (which discards all
 * that follows LOCAL), and so is a non-local AF_UNSPEC info; smtpe__proxy_parse reads all of
 * these back as local. AF_UNIX paths are not in
 * info: two empty paths (216 zero octets) are sent. Returns the length, or 0 if the TLVs are
 * not well formed (§2.2.7), len would pass 65535, or it does not fit. */
static size_t emit_v2(const smtpe_proxy_info *info, uint8_t *out, size_t cap)
{
    static const size_t need[4] = {0, V2_ADDR_INET, V2_ADDR_INET6, V2_ADDR_UNIX};
    int family = info->local ? SMTPE_PROXY_AF_UNSPEC : info->family;
    int local_cmd = info->local && info->transport == SMTPE_PROXY_TRANSPORT_UNSPEC &&
                    info->tlvs.len == 0;
    size_t addr_len = need[family], tn = info->tlvs.len;
    if (tn > 65535 - addr_len || (tn > 0 && (info->tlvs.ptr == NULL ||
                                             !tlvs_valid(info->tlvs.ptr, tn))))
        return 0;
    if (cap < SMTPE__PROXY_V2_FIXED || cap - SMTPE__PROXY_V2_FIXED < addr_len + tn)
        return 0;
    memcpy(out, v2_sig, V2_SIG_LEN);
    out[12] = (uint8_t)(0x20 | (local_cmd ? V2_CMD_LOCAL : V2_CMD_PROXY));
    out[13] = local_cmd ? 0x00 : (uint8_t)(family << 4 | info->transport);
    put_be16(out + 14, (unsigned)(addr_len + tn));
    uint8_t *a = out + SMTPE__PROXY_V2_FIXED;
    if (family == SMTPE_PROXY_AF_INET || family == SMTPE_PROXY_AF_INET6) {
        size_t k = family == SMTPE_PROXY_AF_INET ? 4 : 16;
        memcpy(a, info->src_addr, k);
        memcpy(a + k, info->dst_addr, k);
        put_be16(a + 2 * k, info->src_port);
        put_be16(a + 2 * k + 2, info->dst_port);
    } else if (family == SMTPE_PROXY_AF_UNIX) {
        memset(a, 0, V2_ADDR_UNIX);
    }
    if (tn > 0)
        memcpy(a + addr_len, info->tlvs.ptr, tn);
    return SMTPE__PROXY_V2_FIXED + addr_len + tn;
}

size_t smtpe__proxy_emit(const smtpe_proxy_info *info, uint8_t *out, size_t cap)
{
    if (info == NULL || out == NULL || info->family < SMTPE_PROXY_AF_UNSPEC ||
        info->family > SMTPE_PROXY_AF_UNIX || info->transport < SMTPE_PROXY_TRANSPORT_UNSPEC ||
        info->transport > SMTPE_PROXY_TRANSPORT_DGRAM)
        return 0;
    if (info->version == 1)
        return emit_v1(info, out, cap);
    if (info->version == 2)
        return emit_v2(info, out, cap);
    return 0;
}

/* §2.2.7: type (1), length (2, network order), value. */
int smtpe_proxy_tlv_next(smtpe_span *tlvs, uint8_t *type, smtpe_span *value)
{
    if (tlvs == NULL || type == NULL || value == NULL || tlvs->len < 3 || tlvs->ptr == NULL)
        return 0;
    size_t vlen = be16(tlvs->ptr + 1);
    if (tlvs->len - 3 < vlen)
        return 0;
    *type = tlvs->ptr[0];
    value->ptr = tlvs->ptr + 3;
    value->len = vlen;
    tlvs->ptr += 3 + vlen;
    tlvs->len -= 3 + vlen;
    return 1;
}
