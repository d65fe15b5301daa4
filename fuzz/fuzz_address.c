/*
 * fuzz_address.c - libFuzzer target for the RFC 5321 Path parser (engine/address.c).
 *
 * The input is the octets after "MAIL FROM:" / "RCPT TO:". Each input is parsed with all eight
 * combinations of SMTPE__PATH_ALLOW_NULL, _ALLOW_POSTMASTER and _LAX_BRACKETS.
 *
 * Oracles (abort on violation):
 *   - the result is one of the SMTPE__PATH_* codes; on OK, 0 < *used <= n; without LAX the path
 *     starts with '<' and *used ends just past a '>';
 *   - every span lies within the input; for a mailbox that is neither <> nor <postmaster>,
 *     mailbox is exactly local-part "@" domain, within the length limits, and the QUOTED,
 *     ADDR_LITERAL and UTF8 flags agree with the octets; NULL / POSTMASTER only when allowed;
 *   - parsing just the octets the path took gives the same result (what follows the path does
 *     not change it);
 *   - smtpe__utf8_seq and smtpe__is_ipv4 / smtpe__is_ipv6 agree with reference implementations
 *     of RFC 3629 and of the RFC 5321 §4.1.3 grammar.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "address.h"
#include "fuzz_util.h"

/* RFC 3629 §4: the length of the well-formed sequence at p, or 0. */
static size_t ref_utf8_seq(const uint8_t *p, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = p[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return len;
}

/* Snum 3("." Snum), Snum = 1*3DIGIT with a value 0..255. */
static int ref_ipv4(const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part) {
            if (i >= n || p[i] != '.')
                return 0;
            i++;
        }
        unsigned v = 0, d = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && d < 4) {
            v = v * 10 + (unsigned)(p[i] - '0');
            i++;
            d++;
        }
        if (d == 0 || d > 3 || v > 255)
            return 0;
    }
    return i == n;
}

static int is_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Counts the ':'-separated groups of p[0..n) (n > 0): hex groups of 1..4 digits, the last one
 * optionally an IPv4 literal when v4_ok. Returns the hex group count, or -1. */
static int ref_groups(const uint8_t *p, size_t n, int v4_ok, int *has_v4)
{
    int groups = 0;
    size_t i = 0;
    *has_v4 = 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != ':')
            j++;
        size_t k = i;
        while (k < j && is_hex(p[k]))
            k++;
        if (k == j) {
            if (j - i < 1 || j - i > 4)
                return -1;
            groups++;
        } else if (v4_ok && j == n && ref_ipv4(p + i, j - i)) {
            *has_v4 = 1;
        } else {
            return -1;
        }
        if (j == n)
            return groups;
        i = j + 1;
        if (i == n)
            return -1; /* a trailing ':' */
    }
}

/* RFC 5321 §4.1.3 IPv6-addr: IPv6-full / IPv6-comp / IPv6v4-full / IPv6v4-comp. */
static int ref_ipv6(const uint8_t *p, size_t n)
{
    size_t dc = n, count = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == ':' && p[i + 1] == ':') {
            if (count == 0)
                dc = i;
            count++;
        }
    if (count > 1)
        return 0;
    int v4l = 0, v4r = 0;
    if (count == 0) {
        if (n == 0)
            return 0;
        int g = ref_groups(p, n, 1, &v4r);
        return v4r ? g == 6 : g == 8;
    }
    int gl = 0, gr = 0;
    if (dc > 0 && (gl = ref_groups(p, dc, 0, &v4l)) < 0)
        return 0;
    if (dc + 2 < n && (gr = ref_groups(p + dc + 2, n - dc - 2, 1, &v4r)) < 0)
        return 0;
    return v4r ? gl + gr <= 4 : gl + gr <= 6;
}

static void check_path(const uint8_t *p, size_t n, unsigned opts)
{
    smtpe_path out;
    size_t used = (size_t)-1;
    memset(&out, 0xA5, sizeof out);
    int r = smtpe__parse_path(p, n, opts, &out, &used);
    FUZZ_CHECK(r >= SMTPE__PATH_OK && r <= SMTPE__PATH_TOO_LONG, "unknown result code");
    if (r != SMTPE__PATH_OK)
        return;
    FUZZ_CHECK(used > 0 && used <= n, "*used is 0 or beyond the input");
    if (!(opts & SMTPE__PATH_LAX_BRACKETS))
        FUZZ_CHECK(p[0] == '<' && p[used - 1] == '>', "a strict path without its brackets");
    if (out.flags & SMTPE_PATH_NULL)
        FUZZ_CHECK(opts & SMTPE__PATH_ALLOW_NULL, "<> accepted without ALLOW_NULL");
    if (out.flags & SMTPE_PATH_POSTMASTER)
        FUZZ_CHECK(opts & SMTPE__PATH_ALLOW_POSTMASTER, "<postmaster> without ALLOW_POSTMASTER");
    fz_check_path(&out, p, used);
    if (!(out.flags & (SMTPE_PATH_NULL | SMTPE_PATH_POSTMASTER)))
        FUZZ_CHECK(out.mailbox.len <= SMTPE__MAX_PATH, "mailbox longer than a path may be");

    /* the same octets without what follows the path */
    uint8_t *q = malloc(used);
    if (!q)
        abort();
    memcpy(q, p, used);
    smtpe_path out2;
    size_t used2 = 0;
    int r2 = smtpe__parse_path(q, used, opts, &out2, &used2);
    FUZZ_CHECK(r2 == SMTPE__PATH_OK && used2 == used,
               "parsing only the octets the path took gives another result");
    FUZZ_CHECK(out2.flags == out.flags, "flags change with what follows the path");
#define SAME_SPAN(a, b) ((a).len == (b).len && ((a).len == 0 || (a).ptr - p == (b).ptr - q))
    FUZZ_CHECK(SAME_SPAN(out.mailbox, out2.mailbox) && SAME_SPAN(out.local_part, out2.local_part) &&
                   SAME_SPAN(out.domain, out2.domain),
               "spans change with what follows the path");
    free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (unsigned opts = 0; opts < 8; opts++)
        check_path(data, size, opts);

    if (size > 0 && (data[0] & 0x80)) {
        size_t a = smtpe__utf8_seq(data, size), b = ref_utf8_seq(data, size);
        if (a != b)
            fprintf(stderr, "utf8_seq: engine %zu, RFC 3629 %zu\n", a, b);
        FUZZ_CHECK(a == b, "smtpe__utf8_seq disagrees with RFC 3629");
    }
    int e4 = smtpe__is_ipv4(data, size), r4 = ref_ipv4(data, size);
    FUZZ_CHECK(e4 == 0 || e4 == 1, "is_ipv4 returned neither 0 nor 1");
    FUZZ_CHECK(e4 == r4, "smtpe__is_ipv4 disagrees with RFC 5321 IPv4-address-literal");
    int e6 = smtpe__is_ipv6(data, size), r6 = ref_ipv6(data, size);
    FUZZ_CHECK(e6 == 0 || e6 == 1, "is_ipv6 returned neither 0 nor 1");
    if (e6 != r6)
        fprintf(stderr, "is_ipv6(\"%.*s\"): engine %d, RFC 5321 grammar %d\n", (int)size,
                (const char *)data, e6, r6);
    FUZZ_CHECK(e6 == r6, "smtpe__is_ipv6 disagrees with RFC 5321 IPv6-addr");
    return 0;
}
