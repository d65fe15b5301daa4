/*
 * fuzz_util.h - small helpers shared by the libFuzzer targets in fuzz/: an oracle check that
 * aborts with a message, a growable byte buffer, span checks, and the reference computations
 * the oracles compare the engine against (dot-stuffing, end-of-data search).
 *
 * Everything is static inline so that each target is one translation unit plus the engine.
 */
#ifndef SMTPE_FUZZ_UTIL_H
#define SMTPE_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "smtpe.h"

/* Aborts (so libFuzzer keeps the input as a crash) when an oracle does not hold. */
#define FUZZ_CHECK(cond, msg)                                                                   \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "\n*** oracle violated at %s:%d: %s\n    condition: %s\n",        \
                    __FILE__, __LINE__, (msg), #cond);                                          \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

/* A growable byte buffer. */
typedef struct fz_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
} fz_buf;

static inline void fz_put(fz_buf *b, const void *p, size_t n)
{
    if (n == 0)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q)
            abort();
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static inline void fz_put_u8(fz_buf *b, unsigned v)
{
    uint8_t c = (uint8_t)v;
    fz_put(b, &c, 1);
}

static inline void fz_put_u64(fz_buf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    fz_put(b, x, 8);
}

/* A span as length + octets, so that two logs compare equal only if the spans do. */
static inline void fz_put_span(fz_buf *b, smtpe_span s)
{
    fz_put_u64(b, s.len);
    if (s.len)
        fz_put(b, s.ptr, s.len);
}

static inline void fz_free(fz_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* 1 if a[0..an) and b[0..bn) hold the same octets (either may be NULL when empty). */
static inline int fz_eq(const void *a, size_t an, const void *b, size_t bn)
{
    return an == bn && (an == 0 || memcmp(a, b, an) == 0);
}

/* 1 if the span lies within base[0..n) (an empty span is always accepted). */
static inline int fz_within(smtpe_span s, const void *base, size_t n)
{
    if (s.len == 0)
        return 1;
    uintptr_t a = (uintptr_t)s.ptr, lo = (uintptr_t)base;
    return s.ptr != NULL && a >= lo && a - lo <= n && s.len <= n - (a - lo);
}

/* Dot-unstuffing (RFC 5321 §4.5.2) as the reference: the first '.' of every line is deleted
 * (a line that is just "." ends the data and must not be passed), where only CRLF ends a line
 * and the content starts at the start of a line. */
static inline void fz_unstuff_from(fz_buf *out, const uint8_t *p, size_t n, int at_line_start)
{
    int bol = at_line_start;
    for (size_t i = 0; i < n; i++) {
        if (!(bol && p[i] == '.'))
            fz_put_u8(out, p[i]);
        bol = (p[i] == '\n' && i > 0 && p[i - 1] == '\r');
    }
}

static inline void fz_unstuff(fz_buf *out, const uint8_t *p, size_t n)
{
    fz_unstuff_from(out, p, n, 1);
}

/* Dot-stuffing (RFC 5321 §4.5.2), what a client does: a '.' is added before every line that
 * starts with '.', where a line starts at p[0] and after every CRLF (a bare CR or LF starts
 * none, as in the engine). */
static inline void fz_restuff(fz_buf *out, const uint8_t *p, size_t n)
{
    int bol = 1;
    for (size_t i = 0; i < n; i++) {
        if (bol && p[i] == '.')
            fz_put_u8(out, '.');
        fz_put_u8(out, p[i]);
        bol = (p[i] == '\n' && i > 0 && p[i - 1] == '\r');
    }
}

/* 1 if p[0..n) is content a client stuffed correctly: every line (as fz_restuff counts them)
 * that starts with '.' starts with "..". Exactly then fz_restuff(fz_unstuff(p)) == p. */
static inline int fz_stuffed(const uint8_t *p, size_t n)
{
    int bol = 1;
    for (size_t i = 0; i < n; i++) {
        if (bol && p[i] == '.' && !(i + 1 < n && p[i + 1] == '.'))
            return 0;
        if (bol && p[i] == '.')
            i++; /* the stuffed dot and the dot it protects */
        bol = (p[i] == '\n' && i > 0 && p[i - 1] == '\r');
    }
    return 1;
}

/* The end of data: the offset just past the first CR LF . CR LF in p[0..n). at_line_start: p is
 * preceded by the CRLF that ended the DATA line (so ".\r\n" at p[0] ends it too). Returns the
 * offset in p, or -1 if p holds no end of data. */
static inline long fz_end_of_data_from(const uint8_t *p, size_t n, int at_line_start)
{
    for (size_t i = 0; i + 3 <= n; i++) {
        if (p[i] != '.' || p[i + 1] != '\r' || p[i + 2] != '\n')
            continue;
        if ((i == 0 && at_line_start) || (i >= 2 && p[i - 2] == '\r' && p[i - 1] == '\n'))
            return (long)(i + 3);
    }
    return -1;
}

/* The same, for content right after a DATA line that ended in CRLF. */
static inline long fz_end_of_data(const uint8_t *p, size_t n)
{
    return fz_end_of_data_from(p, n, 1);
}

/* 1 if a chunk that is not in the fed octets is what the engine may hand out from static
 * memory: a line break it made (CRLF, or the CR or LF of one) under NORMALISE, or a held-back CR
 * under KEEP. */
static inline int fz_static_break(smtpe_span s)
{
    if (s.len == 0 || s.len > 2)
        return 0;
    if (s.len == 2)
        return s.ptr[0] == '\r' && s.ptr[1] == '\n';
    return s.ptr[0] == '\r' || s.ptr[0] == '\n';
}

/* 1 if p[0..n) holds an octet above 127. */
static inline int fz_has_8bit(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] & 0x80)
            return 1;
    return 0;
}

/* ASCII case-insensitive equality of a span and a NUL-terminated string. */
static inline int fz_span_eq_ci(smtpe_span s, const char *z)
{
    size_t n = strlen(z);
    if (s.len != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned a = s.ptr[i], b = (unsigned char)z[i];
        if (a >= 'a' && a <= 'z')
            a -= 32;
        if (b >= 'a' && b <= 'z')
            b -= 32;
        if (a != b)
            return 0;
    }
    return 1;
}

/* Checks the shape of a path the engine returned (smtpe__parse_path or a MAIL/RCPT event):
 * every span inside base[0..n); for a mailbox that is neither <> nor <postmaster>, mailbox is
 * exactly local-part "@" domain, both non-empty and within the RFC 5321 §4.5.3.1 limits. */
static inline void fz_check_path(const smtpe_path *pa, const void *base, size_t n)
{
    FUZZ_CHECK(fz_within(pa->mailbox, base, n), "path: mailbox span outside its buffer");
    FUZZ_CHECK(fz_within(pa->local_part, base, n), "path: local-part span outside its buffer");
    FUZZ_CHECK(fz_within(pa->domain, base, n), "path: domain span outside its buffer");
    if (pa->flags & SMTPE_PATH_NULL) {
        FUZZ_CHECK(pa->mailbox.len == 0 && pa->local_part.len == 0 && pa->domain.len == 0,
                   "path: <> with a non-empty span");
        FUZZ_CHECK(!(pa->flags & SMTPE_PATH_POSTMASTER), "path: both <> and <postmaster>");
        return;
    }
    if (pa->flags & SMTPE_PATH_POSTMASTER) {
        FUZZ_CHECK(pa->domain.len == 0, "path: <postmaster> with a domain");
        FUZZ_CHECK(fz_span_eq_ci(pa->local_part, "postmaster"),
                   "path: <postmaster> local-part is not postmaster");
        return;
    }
    const smtpe_span m = pa->mailbox, l = pa->local_part, d = pa->domain;
    FUZZ_CHECK(l.len >= 1 && d.len >= 1, "path: empty local-part or domain");
    FUZZ_CHECK(l.len <= 64, "path: local-part longer than 64 octets");
    FUZZ_CHECK(d.len <= 255, "path: domain longer than 255 octets");
    FUZZ_CHECK(m.ptr == l.ptr, "path: mailbox does not start with the local-part");
    FUZZ_CHECK(m.len == l.len + 1 + d.len, "path: mailbox is not local-part @ domain");
    FUZZ_CHECK(l.ptr[l.len] == '@', "path: no '@' between local-part and domain");
    FUZZ_CHECK(d.ptr == l.ptr + l.len + 1, "path: domain does not follow the '@'");
    FUZZ_CHECK(!!(pa->flags & SMTPE_PATH_QUOTED) == (l.ptr[0] == '"'),
               "path: QUOTED flag does not match the local-part");
    FUZZ_CHECK(!!(pa->flags & SMTPE_PATH_ADDR_LITERAL) == (d.ptr[0] == '['),
               "path: ADDR_LITERAL flag does not match the domain");
    if (fz_has_8bit(m.ptr, m.len))
        FUZZ_CHECK(pa->flags & SMTPE_PATH_UTF8, "path: non-ASCII mailbox without the UTF8 flag");
    if (d.ptr[0] != '[') {
        /* RFC 1035 §2.3.4: an ASCII label is 1..63 octets (a U-label's limit is that of its
         * A-label, which the engine does not compute) */
        size_t a = 0;
        while (a <= d.len) {
            size_t b = a;
            while (b < d.len && d.ptr[b] != '.')
                b++;
            FUZZ_CHECK(b > a, "path: empty domain label");
            if (!fz_has_8bit(d.ptr + a, b - a))
                FUZZ_CHECK(b - a <= 63, "path: domain label longer than 63 octets (RFC 1035)");
            a = b + 1;
        }
    }
}

/* BDAT content (RFC 3030 §2) under the line-ending policies, as the reference the oracles compare
 * the engine against. The chunks of a message are one text: p[0..n) is their concatenation.
 * A bare CR is a CR not followed by LF (so a CR that ends the text is bare), a bare LF one not
 * preceded by CR. */
static inline int fz_bare_at(const uint8_t *p, size_t n, size_t i)
{
    if (p[i] == 0)
        return 1;
    if (p[i] == '\r')
        return i + 1 >= n || p[i + 1] != '\n';
    if (p[i] == '\n')
        return i == 0 || p[i - 1] != '\r';
    return 0;
}

/* The offset of the first bare CR, bare LF or NUL in p[0..n), or n if there is none. */
static inline size_t fz_first_bare(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fz_bare_at(p, n, i))
            return i;
    return n;
}

/* How many bare CR, bare LF and NUL octets p[0..n) holds. */
static inline size_t fz_count_bare(const uint8_t *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += (size_t)fz_bare_at(p, n, i);
    return c;
}

/* SMTPE_LINE_ENDING_NORMALISE applied to p[0..n): a bare CR or bare LF becomes CRLF, a NUL is
 * removed, CRLF and every other octet are kept. */
static inline void fz_normalise(fz_buf *out, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == 0)
            continue;
        if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') {
            fz_put(out, "\r\n", 2);
            i++;
        } else if (p[i] == '\r' || p[i] == '\n') {
            fz_put(out, "\r\n", 2);
        } else {
            fz_put_u8(out, p[i]);
        }
    }
}

/* The oracles on the content of one message sent by DATA (RFC 5321 §4.1.1.4, §4.5.2), shared
 * by fuzz_data and fuzz_session.
 *
 *   raw[0..n)      the octets the engine consumed from the start of the content to the end of
 *                  the first CRLF.CRLF, so n >= 3 and raw ends in ".\r\n" (the CRLF before it
 *                  is the last line's, or the DATA line's for empty content);
 *   at_line_start  the DATA line ended in CRLF (else, under NORMALISE, in a bare CR or LF,
 *                  which starts no line);
 *   pol            the line-ending policy; c[0..clen) the content handed out; status and flags
 *                  those of the end of the message; max the size limit in octets (0: none).
 *
 * With U the reference unstuffing (fz_unstuff_from) of raw less its final ".\r\n" and N the
 * reference normaliser (fz_normalise), the reference content is U under REFUSE and KEEP and
 * N(U) under NORMALISE (a bare CR/LF starts no line, so a '.' after one is content, and it is
 * normalised after unstuffing). Checked:
 *   - the content is a prefix of the reference; equal to it when the status is OK; exactly max
 *     octets long when the status is TOO_BIG;
 *   - REFUSE: BAD_LINE_ENDING iff U holds a bare CR, bare LF or NUL (unless TOO_BIG came first),
 *     and then the content is exactly U up to that octet (never the octet itself);
 *     NORMALISE with status OK: NORMALISED iff U holds one or the DATA line ended bare;
 *   - dot-stuffing round trip: for content that ended OK without normalisation (always so
 *     under KEEP, and under REFUSE), after a DATA line that ended in CRLF, and that the client
 *     stuffed correctly (fz_stuffed: every line starting with '.' starts with ".."), the
 *     content re-stuffed plus ".\r\n" is exactly raw. For content that was not stuffed
 *     correctly (a line ".x"), unstuffing is not one-to-one, so only the first oracle holds.
 *     Under NORMALISE with NORMALISED set it does not hold either: a '.' after a bare line break
 *     was not stuffed (it was at no line start) but is at a line start in the normalised
 *     content, where re-stuffing doubles it; what holds there is content = N(U). */
static inline void fz_check_dot_content(const uint8_t *raw, size_t n, int at_line_start,
                                        smtpe_line_ending_policy pol, const uint8_t *c,
                                        size_t clen, int status, unsigned flags, uint64_t max)
{
    FUZZ_CHECK(n >= 3 && raw[n - 3] == '.' && raw[n - 2] == '\r' && raw[n - 1] == '\n',
               "DATA content: the consumed octets do not end in .CRLF");
    fz_buf u = {0}, ref = {0};
    fz_unstuff_from(&u, raw, n - 3, at_line_start);
    size_t bare = fz_count_bare(u.p, u.len);
    if (pol == SMTPE_LINE_ENDING_NORMALISE)
        fz_normalise(&ref, u.p, u.len);
    else
        fz_put(&ref, u.p, u.len);
    FUZZ_CHECK(clen <= ref.len && fz_eq(c, clen, ref.p, clen),
               "DATA content is not a prefix of the consumed octets dot-unstuffed (and, under "
               "NORMALISE, normalised)");
    if (status == SMTPE_DATA_OK)
        FUZZ_CHECK(fz_eq(c, clen, ref.p, ref.len),
                   "DATA content that ended OK is not the consumed octets dot-unstuffed (and, "
                   "under NORMALISE, normalised)");
    if (status == SMTPE_DATA_TOO_BIG)
        FUZZ_CHECK(max && clen == max,
                   "DATA content TOO_BIG but not exactly max_message_size octets handed out");
    if (pol == SMTPE_LINE_ENDING_REFUSE && status != SMTPE_DATA_TOO_BIG)
        FUZZ_CHECK((status == SMTPE_DATA_BAD_LINE_ENDING) == (bare > 0),
                   "REFUSE: BAD_LINE_ENDING disagrees with a bare CR/LF/NUL in the content");
    if (pol == SMTPE_LINE_ENDING_REFUSE && status == SMTPE_DATA_BAD_LINE_ENDING)
        FUZZ_CHECK(clen == fz_first_bare(u.p, u.len),
                   "REFUSE: refused content is not everything before the first bare CR/LF/NUL "
                   "(the offending octet itself must never be handed out)");
    if (pol == SMTPE_LINE_ENDING_NORMALISE && status == SMTPE_DATA_OK)
        FUZZ_CHECK(!!(flags & SMTPE_DATA_NORMALISED) == (bare > 0 || !at_line_start),
                   "NORMALISE: NORMALISED disagrees with a bare CR/LF/NUL in the content");
    if (status == SMTPE_DATA_OK && !(flags & SMTPE_DATA_NORMALISED) && at_line_start &&
        fz_stuffed(raw, n - 3)) {
        fz_buf st = {0};
        fz_restuff(&st, c, clen);
        fz_put(&st, ".\r\n", 3);
        FUZZ_CHECK(fz_eq(st.p, st.len, raw, n),
                   "dot-stuffing round trip: the content re-stuffed plus .CRLF is not the "
                   "octets consumed up to the end of CRLF.CRLF");
        fz_free(&st);
    }
    fz_free(&u);
    fz_free(&ref);
}

#endif
