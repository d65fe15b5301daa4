/* data.c - message content. Server side: DATA end-of-data detection and dot-unstuffing, BDAT
 * line-ending policy. Client side (at the end of the file): the content scanner and encoder.
 * RFC 5321 §4.1.1.4 (the end is CRLF "." CRLF), §4.5.2 (transparency), §2.3.8 (bare CR/LF).
 *
 * The server's scanner keeps its position within a line in d->state and hands content out as spans of
 * the input, so a message is never copied. A dot at the start of a line is held back (it is
 * either dropped or part of the terminator), which is why a span ends there. A bare LF or CR
 * never starts a line, so no sequence but CR LF . CR LF can end the content. */
#include "data.h"

#include <string.h>

/* SMTPE__VECTOR: the content encoder's scan may take sixteen octets at a time with SSE2 (the
 * x86-64 baseline, so no run-time check is needed). -DSMTPE_SCALAR (CMake option
 * SMTPE_SCALAR) keeps the portable scalar code only. */
#if defined(__SSE2__) && defined(__GNUC__) && !defined(SMTPE_SCALAR)
#define SMTPE__VECTOR 1
#include <emmintrin.h>
#else
#define SMTPE__VECTOR 0
#endif
/* SMTPE__AVX2: on x86-64, also an AVX2 scan (thirty-two octets a block), compiled for AVX2
 * alone (a target attribute) and chosen per message where the CPU and the OS have it
 * (__builtin_cpu_supports reads what the compiler's runtime found at start-up: no state of
 * the engine's own). */
#if SMTPE__VECTOR && defined(__x86_64__) &&                                                    \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 5))
#define SMTPE__AVX2 1
#include <immintrin.h>
#else
#define SMTPE__AVX2 0
#endif

enum {
    DS_BOL = 0, /* at the start of a line */
    DS_DOT,     /* "." at the start of a line, held back */
    DS_DOTCR,   /* "." CR at the start of a line, held back */
    DS_MID,     /* inside a line */
    DS_CR,      /* inside a line, after a CR (already handed out) */
    DS_CR_HELD  /* inside a line, after a CR held back (REFUSE: it may be a bare CR) */
};

static const uint8_t crlf[2] = {'\r', '\n'};

void smtpe__data_start(smtpe__data *d, smtpe_line_ending_policy policy, uint64_t max_size,
                       int at_line_start)
{
    d->state = at_line_start ? DS_BOL : DS_MID;
    d->policy = policy;
    d->max_size = max_size;
    d->size = 0;
    d->status = SMTPE_DATA_OK;
    d->flags = at_line_start ? 0 : SMTPE_DATA_NORMALISED;
}

/* Counts len content octets and returns how many of them may be handed out: all while the
 * content is acceptable, none once it is not, and exactly up to max_size where it crosses the
 * limit, so that what is handed out never depends on how the input was split. */
static size_t account(smtpe__data *d, size_t len)
{
    size_t ok = len;
    if (d->status != SMTPE_DATA_OK) {
        ok = 0;
    } else if (d->max_size && d->size + len > d->max_size) {
        ok = (size_t)(d->max_size - d->size);
        d->status = SMTPE_DATA_TOO_BIG;
    }
    d->size += len;
    return ok;
}

static void refuse(smtpe__data *d)
{
    if (d->status == SMTPE_DATA_OK)
        d->status = SMTPE_DATA_BAD_LINE_ENDING;
}

/* Result of looking at one octet. */
enum {
    ACT_CONTENT,       /* c is content */
    ACT_SKIP,          /* c is consumed and is not content */
    ACT_AGAIN,         /* c is not consumed; look at it again in the new state */
    ACT_CONST_CONSUME, /* hand out *cs instead of c */
    ACT_CONST_KEEP,    /* hand out *cs, then look at c again */
    ACT_END            /* c ends the content */
};

/* Decides what the octet c means in the current state and moves the state on. For the CONST
 * actions, *cs and *cn say which static octets to hand out instead of (CONSUME) or before (KEEP) c. */
static int step(smtpe__data *d, uint8_t c, const uint8_t **cs, size_t *cn)
{
    int keep = d->policy == SMTPE_LINE_ENDING_KEEP;
    int norm = d->policy == SMTPE_LINE_ENDING_NORMALISE;
    switch (d->state) {
    case DS_BOL:
        if (c == '.') {
            d->state = DS_DOT;
            return ACT_SKIP;
        }
        break;
    case DS_DOT:
        if (c == '\r') {
            d->state = DS_DOTCR;
            return ACT_SKIP;
        }
        d->state = DS_MID; /* the stuffed dot is dropped; c is content */
        break;
    case DS_DOTCR:
        if (c == '\n') {
            d->state = DS_BOL;
            return ACT_END;
        }
        /* ".", bare CR, c: the dot is dropped, the bare CR is handled, c is seen again */
        d->state = DS_MID;
        if (!keep && !norm) {
            refuse(d);
            return ACT_AGAIN;
        }
        d->flags |= norm ? SMTPE_DATA_NORMALISED : 0;
        *cs = crlf;
        *cn = norm ? 2 : 1;
        return ACT_CONST_KEEP;
    case DS_CR:
        if (c == '\n') {
            d->state = DS_BOL;
            return ACT_CONTENT;
        }
        d->state = DS_MID;
        if (norm) { /* the CR went out already: add its LF, then see c again */
            d->flags |= SMTPE_DATA_NORMALISED;
            *cs = crlf + 1;
            *cn = 1;
            return ACT_CONST_KEEP;
        }
        if (!keep)
            refuse(d);
        break;
    case DS_CR_HELD:
        d->state = DS_MID;
        if (c == '\n') {
            d->state = DS_BOL;
            *cs = crlf;
            *cn = 2;
            return ACT_CONST_CONSUME;
        }
        refuse(d); /* the held CR was bare: it is never handed out */
        return ACT_AGAIN;
    default:
        break;
    }
    /* inside a line */
    if (c == '\r') {
        /* Under REFUSE a CR is handed out only once its LF is seen, so that refused content
         * never includes the offending octet. */
        d->state = keep || norm ? DS_CR : DS_CR_HELD;
        return keep || norm ? ACT_CONTENT : ACT_SKIP;
    }
    d->state = DS_MID;
    if (c == '\n' || c == 0) {
        if (keep)
            return ACT_CONTENT;
        if (!norm) {
            refuse(d);
            return ACT_SKIP;
        }
        d->flags |= SMTPE_DATA_NORMALISED;
        if (c == 0)
            return ACT_SKIP;
        *cs = crlf;
        *cn = 2;
        return ACT_CONST_CONSUME;
    }
    if (c >= 0x80)
        d->flags |= SMTPE_DATA_HAS_8BIT;
    return ACT_CONTENT;
}

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

/* Sets the high bit of octets of v that are zero: nonzero exactly when one is, and the lowest
 * set bit is exact (borrows only run upwards, so higher bits may be spurious). */
static uint64_t zero_octets(uint64_t v)
{
    return (v - ONES) & ~v & HIGHS;
}

#if defined(__GNUC__)
#define HOT_INLINE inline __attribute__((always_inline))
#else
#define HOT_INLINE inline
#endif

/* The one notion of a plain octet, for the server's scanners and the client's content scanner
 * and encoder alike: one that is neither CR nor LF (which make line breaks, RFC 5321 §2.3.8)
 * nor NUL, nor, when stop8 is set, above 127. stop_octets flags (high bit) the octets of v, a
 * word of eight octets in memory order, that are not plain; it is nonzero exactly when one is
 * not, and its lowest set bit is exact. */
static HOT_INLINE int plain_octet(uint8_t c, int stop8)
{
    return c != '\r' && c != '\n' && c != 0 && !(stop8 && c >= 0x80);
}

static HOT_INLINE uint64_t stop_octets(uint64_t v, int stop8)
{
    /* first one test for "an octet below 0x0E" (CR, LF and NUL are such octets; the test is
     * exact about whether there is one, as no octet at or above 0x0E borrows): a word of
     * ordinary text passes with it alone, and only a word that has one pays for the exact
     * three */
    uint64_t m = (v - ONES * 0x0E) & ~v & HIGHS;
    if (m)
        m = zero_octets(v) | zero_octets(v ^ (ONES * '\r')) | zero_octets(v ^ (ONES * '\n'));
    return stop8 ? m | (v & HIGHS) : m;
}

/* The length of the run at p[0..n) of plain octets, eight at a time where it can; the octets
 * are ORed into *high (for SMTPE_DATA_HAS_8BIT, SMTPE_CONTENT_8BIT). stop8 is a constant at
 * every call, so each inlined copy keeps only its own test.
 * Inlined into every scanner: as a call it costs DATA about 7% (measured). */
static HOT_INLINE size_t plain_run(const uint8_t *p, size_t n, uint64_t *high, int stop8)
{
    uint64_t h = 0; /* a local, not *high: octet stores through p could alias it */
    size_t j = 0;
    while (n - j >= 8) {
        uint64_t v, m;
        memcpy(&v, p + j, 8);
        m = stop_octets(v, stop8);
        if (m) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            /* the lowest flagged octet is exact: skip the plain octets before it */
            unsigned k = (unsigned)__builtin_ctzll(m) / 8;
            if (k > 0)
                h |= v & ((1ull << (8 * k)) - 1);
            j += k;
#endif
            break;
        }
        h |= v;
        j += 8;
    }
    while (j < n && plain_octet(p[j], stop8))
        h |= p[j++];
    *high |= h;
    return j;
}

/* The fast path: the length of the run at p[0..n) that is content whatever the policy, i.e.
 * octets other than CR, LF and NUL, and CR LF pairs not followed by a dot. The caller has
 * checked that p[0] does not start a held-back dot. Moves the state past the run. Eight octets
 * at a time where it can. */
static size_t content_run(smtpe__data *d, const uint8_t *p, size_t n)
{
    size_t j = 0;
    uint64_t high = 0;
    int bol = 0;
    for (;;) {
        size_t start = j;
        j += plain_run(p + j, n - j, &high, 0);
        if (j > start)
            bol = 0;
        if (n - j < 3 || p[j] != '\r' || p[j + 1] != '\n' || p[j + 2] == '.')
            break;
        j += 2; /* a line break whose next line does not start with a dot */
        bol = 1;
    }
    if (j > 0)
        d->state = bol ? DS_BOL : DS_MID;
    if (high & HIGHS)
        d->flags |= SMTPE_DATA_HAS_8BIT;
    return j;
}

size_t smtpe__data_feed(smtpe__data *d, const uint8_t *p, size_t n, smtpe_span *chunk, int *end)
{
    size_t i = 0, run = 0; /* p[i - run .. i) is content not yet handed out */
    *end = 0;
    chunk->ptr = p;
    chunk->len = 0;
    while (i < n) {
        size_t j = i, ok;
        if (d->state == DS_MID || (d->state == DS_BOL && p[i] != '.'))
            j = i + content_run(d, p + i, n - i);
        if (j == i) {
            int saved = d->state;
            const uint8_t *cs = NULL;
            size_t cn = 0;
            int act = step(d, p[i], &cs, &cn);
            if (act == ACT_CONTENT) {
                j = i + 1;
            } else if (run > 0) { /* hand out the content so far; see p[i] again next call */
                d->state = saved;
                break;
            } else if (act == ACT_END) {
                *end = 1;
                return i + 1;
            } else {
                i += act == ACT_SKIP || act == ACT_CONST_CONSUME;
                if (act == ACT_SKIP || act == ACT_AGAIN)
                    continue;
                ok = account(d, cn); /* a normalised line break */
                if (ok > 0) {
                    chunk->ptr = cs;
                    chunk->len = ok;
                    return i;
                }
                continue;
            }
        }
        /* p[i..j) is content */
        ok = account(d, j - i);
        run += ok;
        if (ok < j - i) { /* the content stopped being acceptable inside p[i..j) */
            chunk->ptr = p + i + ok - run;
            chunk->len = run;
            return j;
        }
        i = j;
    }
    chunk->ptr = p + i - run;
    chunk->len = run;
    return i;
}

/* ------------------------------------------------------------------------------------------
 * BDAT (RFC 3030). States used: DS_MID, DS_CR (NORMALISE: a CR went out, its LF may follow) and
 * DS_CR_HELD (REFUSE: a CR held back until its LF arrives).
 * ---------------------------------------------------------------------------------------- */

void smtpe__bdat_start(smtpe__data *d, smtpe_line_ending_policy policy, uint64_t max_size,
                       int binary)
{
    d->state = DS_MID;
    d->policy = binary ? SMTPE_LINE_ENDING_KEEP : policy;
    d->max_size = max_size;
    d->size = 0;
    d->status = SMTPE_DATA_OK;
    d->flags = 0;
}

static void out_span(smtpe_span *chunk, const uint8_t *p, size_t ok)
{
    chunk->ptr = p;
    chunk->len = ok;
}

size_t smtpe__bdat_feed(smtpe__data *d, const uint8_t *p, size_t n, smtpe_span *chunk)
{
    int norm = d->policy == SMTPE_LINE_ENDING_NORMALISE;
    uint64_t high = 0;
    size_t i = 0;
    out_span(chunk, p, 0);
    if (n == 0)
        return 0;
    if (d->policy == SMTPE_LINE_ENDING_KEEP) {
        uint8_t any = 0; /* one octet wide, so that the compiler vectorises the loop */
        for (; i < n; i++)
            any |= p[i];
        if (any & 0x80)
            d->flags |= SMTPE_DATA_HAS_8BIT;
        out_span(chunk, p, account(d, n));
        return n;
    }
    if (d->state == DS_CR_HELD) { /* REFUSE: the CR that ended the previous input */
        d->state = DS_MID;
        if (p[0] == '\n') {
            out_span(chunk, crlf, account(d, 2));
            return 1;
        }
        refuse(d); /* it was bare; p[0] is looked at below */
    } else if (d->state == DS_CR) { /* NORMALISE: the CR went out already */
        d->state = DS_MID;
        if (p[0] != '\n') {
            d->flags |= SMTPE_DATA_NORMALISED;
            out_span(chunk, crlf + 1, account(d, 1));
            return 0; /* p[0] is looked at again in the next call */
        }
        i = 1; /* its LF is content */
    }
    for (;;) { /* plain octets and CR LF pairs */
        i += plain_run(p + i, n - i, &high, 0);
        if (n - i < 2 || p[i] != '\r' || p[i + 1] != '\n')
            break;
        i += 2;
    }
    if (high & HIGHS)
        d->flags |= SMTPE_DATA_HAS_8BIT;
    if (i > 0) {
        out_span(chunk, p, account(d, i));
        return i;
    }
    /* p[0] is a CR at the end of the input, a bare CR, a bare LF or a NUL */
    if (p[0] == '\r' && n == 1) {
        if (norm) {
            d->state = DS_CR;
            out_span(chunk, p, account(d, 1));
        } else {
            d->state = DS_CR_HELD;
        }
        return 1;
    }
    if (!norm) {
        refuse(d);
        return 1;
    }
    d->flags |= SMTPE_DATA_NORMALISED;
    if (p[0] != 0)
        out_span(chunk, crlf, account(d, 2));
    return 1;
}

void smtpe__bdat_end(smtpe__data *d, smtpe_span *chunk)
{
    out_span(chunk, crlf, 0);
    if (d->state == DS_CR_HELD) {
        refuse(d);
    } else if (d->state == DS_CR) {
        d->flags |= SMTPE_DATA_NORMALISED;
        out_span(chunk, crlf + 1, account(d, 1));
    }
    d->state = DS_MID;
}

/* ------------------------------------------------------------------------------------------
 * Client side: the content scanner (smtpe_content_scan) and the content encoder
 * (smtpe__stuff_*). RFC 5321 §2.3.8 (lines), §4.5.2 (transparency), §4.5.3.1.6 (line length);
 * RFC 5322 §2.1.1; RFC 1870 §3 (SIZE); RFC 3030 (BDAT, BINARYMIME).
 *
 * Both follow the same line rules, written once here:
 *   - a CR followed by an LF is a line break (CRLF);
 *   - a CR followed by anything else, or ending the content, is a bare CR; an LF not preceded
 *     by a CR is a bare LF; on the wire each is a line break, written CRLF (NORMALISE), or the
 *     content is refused; so a CR is a line break whatever follows it, and only the octet after
 *     it (or the end) says which kind, which is why a CR is held until then;
 *   - a line's length counts its octets other than its line break (no doubled dot either:
 *     that is wire framing, §4.5.3.1.6); a line over 998 octets is a long line;
 *   - NUL and octets above 127 are text like any other octet, only noticed (or refused).
 * ---------------------------------------------------------------------------------------- */

#define LINE_TEXT_MAX 998 /* octets of a line, its CRLF excluded (RFC 5322 §2.1.1) */

/* The length of a line of len octets after k more: counted up to LINE_TEXT_MAX + 1 only, as
 * all that matters is whether the line went over (so a 4 GiB line cannot wrap it). */
static uint32_t line_grow(uint32_t len, size_t k)
{
    return k > LINE_TEXT_MAX + 1 - (size_t)len ? LINE_TEXT_MAX + 1 : len + (uint32_t)k;
}

/* The SMTPE_CONTENT_* flags the plain octet c shows as the next octet of a line of len
 * octets: NUL, 8BIT, and LONG_LINE when it is the line's 999th octet or later. */
static unsigned text_flags(uint8_t c, uint32_t len)
{
    unsigned f = len >= LINE_TEXT_MAX ? SMTPE_CONTENT_LONG_LINE : 0;
    if (c == 0)
        f |= SMTPE_CONTENT_NUL;
    if (c >= 0x80)
        f |= SMTPE_CONTENT_8BIT;
    return f;
}

/* What the octet c is by the line rules, cr_held saying whether the octet before it was a CR
 * (whose kind c decides). The held CR was bare exactly when the answer is not OCT_CRLF. */
enum {
    OCT_TEXT,   /* anything but CR and LF */
    OCT_CR,     /* a CR: a line break whose kind the next octet (or the end) decides */
    OCT_CRLF,   /* the LF of a CRLF */
    OCT_BARE_LF /* an LF after anything but a CR */
};

static int octet_kind(int cr_held, uint8_t c)
{
    if (c == '\n')
        return cr_held ? OCT_CRLF : OCT_BARE_LF;
    return c == '\r' ? OCT_CR : OCT_TEXT;
}

/* smtpe_content_info.state: bits */
#define SCAN_CR 1    /* the last octet was a CR, its kind not yet known */
#define SCAN_BREAK 2 /* the content so far ends with a line break */

void smtpe_content_scan_init(smtpe_content_info *info)
{
    if (info)
        memset(info, 0, sizeof *info);
}

/* The scan of p[0..n) into *info, for smtpe_content_scan and the encoder's BINARY mode. A CR
 * counts its 2 wire octets when it comes (bare or not, it is a CRLF on the wire under
 * NORMALISE); the LF of a CRLF then counts none. */
static void scan_octets(smtpe_content_info *info, const uint8_t *p, size_t n)
{
    uint64_t wire = info->wire_size, high = 0;
    unsigned flags = info->flags;
    uint32_t len = info->line_len;
    int state = info->state;
    size_t i = 0;
    while (i < n) {
        if (!(state & SCAN_CR)) {
            size_t k = plain_run(p + i, n - i, &high, 0);
            if (k > 0) {
                len = line_grow(len, k);
                if (len > LINE_TEXT_MAX)
                    flags |= SMTPE_CONTENT_LONG_LINE;
                wire += k;
                i += k;
                state = 0;
                continue;
            }
        }
        uint8_t c = p[i++];
        int kind = octet_kind(state & SCAN_CR, c);
        if ((state & SCAN_CR) && kind != OCT_CRLF)
            flags |= SMTPE_CONTENT_BARE_CR; /* its CRLF was counted with it */
        if (kind == OCT_TEXT) {
            flags |= text_flags(c, len);
            len = line_grow(len, 1);
            wire++;
            state = 0;
        } else if (kind == OCT_CRLF) {
            state = SCAN_BREAK;
        } else {
            flags |= kind == OCT_BARE_LF ? SMTPE_CONTENT_BARE_LF : 0;
            wire += 2;
            len = 0;
            state = kind == OCT_CR ? SCAN_CR : SCAN_BREAK;
        }
    }
    if (high & HIGHS)
        flags |= SMTPE_CONTENT_8BIT;
    info->size += n;
    info->wire_size = wire;
    info->flags = flags;
    info->line_len = len;
    info->state = state;
}

void smtpe_content_scan(smtpe_content_info *info, const uint8_t *p, size_t n)
{
    if (info && (p || n == 0))
        scan_octets(info, p, n);
}

void smtpe_content_scan_end(smtpe_content_info *info)
{
    if (!info)
        return;
    if (info->state & SCAN_CR) {
        info->flags |= SMTPE_CONTENT_BARE_CR;
        info->state = SCAN_BREAK;
    }
    if (info->size > 0 && !(info->state & SCAN_BREAK)) {
        info->wire_size += 2; /* the final CRLF the encoder adds */
        info->state = SCAN_BREAK;
    }
}

void smtpe__stuff_start(smtpe__stuffer *st, int mode, smtpe_line_ending_policy policy,
                        unsigned refuse_mask)
{
    memset(st, 0, sizeof *st);
    st->mode = mode;
    st->policy = policy;
    if (mode == SMTPE__STUFF_BINARY)
        refuse_mask = 0;
    else if (policy == SMTPE_LINE_ENDING_REFUSE)
        refuse_mask |= SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF;
    st->refuse_mask = refuse_mask;
    st->at_line_start = 1;
    st->vector = SMTPE__VECTOR;
#if SMTPE__AVX2
    if (__builtin_cpu_supports("avx2"))
        st->vector = 2;
#endif
}

/* Stops the encoding at an octet that shows the flags f, some of them refused (the lowest of
 * those is reported). */
static void stuff_refuse(smtpe__stuffer *st, unsigned f)
{
    unsigned r = f & st->refuse_mask;
    st->seen |= f;
    st->refused = r & (~r + 1u);
}

/* A line break is written: the next octet starts a line. */
static void stuff_break(smtpe__stuffer *st, uint8_t *out)
{
    out[0] = '\r';
    out[1] = '\n';
    st->line_len = 0;
    st->at_line_start = 1;
    st->ended_crlf = 1;
}

/* BINARY: p[0..n) verbatim, as much as fits; seen kept by the scanner's rules (pending_cr then
 * means the last octet was a CR, already written). */
static size_t stuff_binary(smtpe__stuffer *st, const uint8_t *p, size_t n, uint8_t *out,
                           size_t cap, size_t *written)
{
    size_t k = n < cap ? n : cap;
    if (k > 0) {
        smtpe_content_info info;
        memcpy(out, p, k);
        info.size = 0;
        info.wire_size = 0;
        info.flags = st->seen;
        info.line_len = st->line_len;
        info.state = (st->pending_cr ? SCAN_CR : 0) | (st->ended_crlf ? SCAN_BREAK : 0);
        scan_octets(&info, p, k);
        st->seen = info.flags;
        st->line_len = info.line_len;
        st->pending_cr = !!(info.state & SCAN_CR);
        st->ended_crlf = !!(info.state & SCAN_BREAK);
        st->in_octets += k;
        st->out_octets += k;
    }
    *written = k;
    return k;
}

/* The octet after a held CR, when it is not an LF: the CR was bare. Writes its CRLF into
 * out[0..room) and returns 2, or returns 0 (refused, or no room: nothing changed). */
static size_t stuff_bare_cr(smtpe__stuffer *st, uint8_t *out, size_t room)
{
    if (st->refuse_mask & SMTPE_CONTENT_BARE_CR) {
        stuff_refuse(st, SMTPE_CONTENT_BARE_CR);
        return 0;
    }
    if (room < 2)
        return 0;
    st->seen |= SMTPE_CONTENT_BARE_CR;
    st->pending_cr = 0;
    stuff_break(st, out);
    return 2;
}

/* One octet c (no CR held) that the fast path did not take, p[0..n) being c and what follows
 * it in this piece. Writes its output into out[0..room); *used gets the octets consumed (2 for
 * a CRLF taken whole, 1 otherwise). Returns the octets written, or -1 when c is refused or
 * its output does not fit (*used 0, nothing changed but st->refused and st->seen). */
static int stuff_octet(smtpe__stuffer *st, const uint8_t *p, size_t n, uint8_t *out,
                       size_t room, size_t *used)
{
    uint8_t c = p[0];
    *used = 0;
    switch (octet_kind(0, c)) {
    case OCT_CR:
        if (n >= 2 && p[1] == '\n' && room >= 2) { /* CR then LF in one go */
            stuff_break(st, out);
            *used = 2;
            return 2;
        }
        st->pending_cr = 1; /* held, written by whatever settles it */
        *used = 1;
        return 0;
    case OCT_BARE_LF:
        if (st->refuse_mask & SMTPE_CONTENT_BARE_LF) {
            stuff_refuse(st, SMTPE_CONTENT_BARE_LF);
            return -1;
        }
        if (room < 2)
            return -1;
        st->seen |= SMTPE_CONTENT_BARE_LF;
        stuff_break(st, out);
        *used = 1;
        return 2;
    default: {
        unsigned f = text_flags(c, st->line_len);
        int dot = st->mode == SMTPE__STUFF_DATA && st->at_line_start && c == '.';
        if (f & st->refuse_mask) {
            stuff_refuse(st, f);
            return -1;
        }
        if (room < (size_t)(1 + dot))
            return -1;
        st->seen |= f;
        out[0] = '.'; /* §4.5.2: a line-start dot is doubled (overwritten when not a dot) */
        out[dot] = c;
        st->line_len = line_grow(st->line_len, 1);
        st->at_line_start = 0;
        st->ended_crlf = 0;
        *used = 1;
        return 1 + dot;
    }
    }
}

#if SMTPE__VECTOR
/* Flags (an octet of all ones) the octets of v below 0x0E, with stop8 also those above 127
 * (their high bit): CR, LF and NUL are below 0x0E, so ordinary text passes this one test. */
static HOT_INLINE __m128i low16(__m128i v, int stop8)
{
    __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x0D)), v);
    return stop8 ? _mm_or_si128(low, v) : low;
}

/* The exact mask (bit i for octet i) of the octets of v that are not plain (plain_octet). */
static HOT_INLINE unsigned stop16(__m128i v, int stop8)
{
    __m128i s = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\r')),
                                          _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'))),
                             _mm_cmpeq_epi8(v, _mm_setzero_si128()));
    unsigned m = (unsigned)_mm_movemask_epi8(s);
    return stop8 ? m | (unsigned)_mm_movemask_epi8(v) : m;
}

/* What the vector scans do at an octet p[at] (at < lim) that is not plain, the line having
 * started at p[line_at] with before octets ahead of it: 0 stop there (the scalar loop
 * decides), 1 pass it as a CRLF ending a line of at most LINE_TEXT_MAX octets, 2 the same and
 * the line-start dot after it under dots (the stretch ends after the dot, doubled by the
 * caller). A CRLF at the end of p[0..lim) is left to the scalar loop (a dot may follow). */
static HOT_INLINE int vec_break(const uint8_t *p, size_t at, size_t lim, int dots,
                                size_t line_at, uint32_t before)
{
    if (p[at] != '\r' || lim - at < 3 || p[at + 1] != '\n' ||
        before + (at - line_at) > LINE_TEXT_MAX)
        return 0;
    return dots && p[at + 2] == '.' ? 2 : 1;
}

/* Both vector scans' walk of a block p[i..i+32) holding octets that are not plain (m: bit k
 * for p[i + k]): each CRLF vec_break passes moves *line_at and *before past it. Returns 32
 * when all of the block went (*next: i + 32, or past a CRLF whose LF is the next block's first
 * octet), else the offset k of the octet the stretch stops at, or (*dot set) of the CR of the
 * CRLF whose line-start dot ends it. */
static HOT_INLINE unsigned vec_block(const uint8_t *p, size_t i, size_t lim, unsigned m,
                                     int dots, size_t *line_at, uint32_t *before, int *dot,
                                     size_t *next)
{
    *next = i + 32;
    while (m) {
        unsigned k = (unsigned)__builtin_ctz(m);
        size_t at = i + k;
        int b = vec_break(p, at, lim, dots, *line_at, *before);
        if (b == 0)
            return k;
        *line_at = at + 2; /* a CRLF */
        *before = 0;
        if (b == 2) {
            *dot = 1;
            return k;
        }
        if (k == 31) { /* its LF starts the next block: go on after it */
            *next = at + 2;
            break;
        }
        m &= m - 1; /* the CR */
        m &= m - 1; /* and its LF */
    }
    return 32;
}

/* The vector part of stuff_scan: from p[i], thirty-two octets at a time while at least that
 * many are left before lim, passes what stuff_scan's scalar loop would (plain octets, CRLFs
 * that end lines of at most LINE_TEXT_MAX octets, and under dots a line-start dot after one,
 * which ends the stretch: *dot set), and returns where it stopped; the scalar loop takes the
 * rest (from an octet it left undecided, or the last octets). Moves *line_at and *before past
 * each CRLF; *high gets a high bit when an octet passed is above 127. A block with no octet
 * below 0x0E (nor above 127 with stop8) costs one test. */
static HOT_INLINE size_t stuff_vec(const uint8_t *p, size_t i, size_t lim, int stop8, int dots,
                                   size_t *line_at_out, uint32_t *before_out, uint64_t *high,
                                   int *dot)
{
    __m128i acc = _mm_setzero_si128();
    unsigned h = 0;
    /* the line state in locals, written back at the end: stores through the pointers could
     * alias p (octets), so the compiler would store and reload them at every CRLF */
    size_t la = *line_at_out, *line_at = &la;
    uint32_t bf = *before_out, *before = &bf;
    while (lim - i >= 32) {
        __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
        __m128i v1 = _mm_loadu_si128((const __m128i *)(const void *)(p + i + 16));
        size_t next = i + 32;
        if (_mm_movemask_epi8(_mm_or_si128(low16(v0, stop8), low16(v1, stop8)))) {
            unsigned m = stop16(v0, stop8) | stop16(v1, stop8) << 16;
            unsigned k = vec_block(p, i, lim, m, dots, line_at, before, dot, &next);
            if (k < 32) {
                unsigned hi = (unsigned)_mm_movemask_epi8(v0) |
                              (unsigned)_mm_movemask_epi8(v1) << 16;
                h |= hi & ((1u << k) - 1u);
                *high |= (h | (unsigned)_mm_movemask_epi8(acc)) ? 0x80u : 0u;
                *line_at_out = la;
                *before_out = bf;
                return i + k + (*dot ? 3 : 0);
            }
        }
        acc = _mm_or_si128(acc, _mm_or_si128(v0, v1));
        i = next;
    }
    *high |= (h | (unsigned)_mm_movemask_epi8(acc)) ? 0x80u : 0u;
    *line_at_out = la;
    *before_out = bf;
    return i;
}
#endif

#if SMTPE__AVX2
/* stuff_vec with AVX2: the same stretch, one block of thirty-two octets per test. */
__attribute__((target("avx2"))) static size_t stuff_vec_avx2(const uint8_t *p, size_t i,
                                                             size_t lim, int stop8, int dots,
                                                             size_t *line_at_out,
                                                             uint32_t *before_out,
                                                             uint64_t *high, int *dot)
{
    const __m256i c0d = _mm256_set1_epi8(0x0D), cr = _mm256_set1_epi8('\r');
    const __m256i lf = _mm256_set1_epi8('\n'), zero = _mm256_setzero_si256();
    __m256i acc = zero;
    unsigned h = 0;
    size_t la = *line_at_out, *line_at = &la; /* in locals, as in stuff_vec */
    uint32_t bf = *before_out, *before = &bf;
    while (lim - i >= 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
        __m256i low = _mm256_cmpeq_epi8(_mm256_min_epu8(v, c0d), v);
        size_t next = i + 32;
        if (stop8)
            low = _mm256_or_si256(low, v);
        if (_mm256_movemask_epi8(low)) {
            __m256i sp = _mm256_or_si256(
                _mm256_or_si256(_mm256_cmpeq_epi8(v, cr), _mm256_cmpeq_epi8(v, lf)),
                _mm256_cmpeq_epi8(v, zero));
            unsigned m = (unsigned)_mm256_movemask_epi8(sp), k;
            if (stop8)
                m |= (unsigned)_mm256_movemask_epi8(v);
            k = vec_block(p, i, lim, m, dots, line_at, before, dot, &next);
            if (k < 32) {
                h |= (unsigned)_mm256_movemask_epi8(v) & ((1u << k) - 1u);
                *high |= (h | (unsigned)_mm256_movemask_epi8(acc)) ? 0x80u : 0u;
                *line_at_out = la;
                *before_out = bf;
                return i + k + (*dot ? 3 : 0);
            }
        }
        acc = _mm256_or_si256(acc, v);
        i = next;
    }
    *high |= (h | (unsigned)_mm256_movemask_epi8(acc)) ? 0x80u : 0u;
    *line_at_out = la;
    *before_out = bf;
    return i;
}
#endif

/* The verbatim stretch of p[0..lim) for stuff_run, moving the line state past it: plain
 * octets and CRLFs, and under DATA a CRLF followed by a line-start dot too, which ends the
 * stretch with the dot (*dot set: the caller writes one more "." after it). */
static HOT_INLINE size_t stuff_scan(smtpe__stuffer *st, const uint8_t *p, size_t lim,
                                    uint64_t *high, int stop8, int *dot)
{
    uint64_t h = 0;
    size_t i = 0, line_at = 0;               /* the current line starts at p[line_at] */
    uint32_t before = st->line_len;          /* its octets before p[line_at] (first line) */
    int long_lines = (st->refuse_mask & SMTPE_CONTENT_LONG_LINE) != 0;
    int dots = st->mode == SMTPE__STUFF_DATA;
    for (;;) {
        size_t len;
#if SMTPE__VECTOR
        if (st->vector) {
            int vdot = 0;
#if SMTPE__AVX2
            if (st->vector == 2)
                i = stuff_vec_avx2(p, i, lim, stop8, dots, &line_at, &before, &h, &vdot);
            else
#endif
                i = stuff_vec(p, i, lim, stop8, dots, &line_at, &before, &h, &vdot);
            if (vdot) { /* it ended with a line-start dot */
                st->line_len = 1;
                *dot = 1;
                break;
            }
        }
#endif
        i += plain_run(p + i, lim - i, &h, stop8);
        len = (size_t)before + (i - line_at);
        if (len > LINE_TEXT_MAX) {
            if (long_lines) { /* stop before the line's 999th octet, which is refused */
                size_t k;
                i = line_at + (LINE_TEXT_MAX - before);
                st->line_len = LINE_TEXT_MAX;
                for (h = 0, k = 0; k < i; k++) /* only the octets that go out count */
                    h |= p[k];
                break;
            }
            st->seen |= SMTPE_CONTENT_LONG_LINE;
        }
        /* a CRLF inside the stretch (not at its end, where a dot may follow) */
        if (lim - i >= 3 && p[i] == '\r' && p[i + 1] == '\n') {
            if (dots && p[i + 2] == '.') { /* and its line's dot, which is doubled */
                i += 3;
                line_at = i - 1;
                st->line_len = 1;
                *dot = 1;
                break;
            }
            i += 2;
            line_at = i;
            before = 0;
            continue;
        }
        st->line_len = line_grow(before, i - line_at);
        break;
    }
    *high |= h;
    st->at_line_start = i > 0 ? i == line_at : st->at_line_start;
    return i;
}

/* The fast path: the longest stretch of p[0..n) that goes out verbatim but for doubled
 * dots, written to out[0..room) with one memcpy per line-start dot: runs of plain octets (not
 * above 127 either when 8BIT is refused; no line longer than 998 when LONG_LINE is refused),
 * the CRLFs between them and under DATA the dots that start lines after them, up to a bare CR
 * or LF, a NUL, a refused octet or a line break at the end of p, which the caller encodes one
 * at a time. Returns the octets consumed; *w gets those written. The caller has checked that
 * no CR is held and that p[0] is not a line-start dot under DATA. */
/* One stretch of p[0..lim) by stuff_scan, with the 8BIT refusal choosing its stop8 (so each
 * inlined copy keeps its own test); an empty one leaves the line state as it was. */
static size_t stuff_stretch(smtpe__stuffer *st, const uint8_t *p, size_t lim, uint64_t *high,
                            int *dot)
{
    uint32_t line_len = st->line_len;
    int at_start = st->at_line_start;
    size_t i = (st->refuse_mask & SMTPE_CONTENT_8BIT) ? stuff_scan(st, p, lim, high, 1, dot)
                                                      : stuff_scan(st, p, lim, high, 0, dot);
    if (i == 0) {
        st->line_len = line_len;
        st->at_line_start = at_start;
    }
    return i;
}

/* After stretches that passed octets: what they showed (high: their octets ORed). */
static void stuff_stretched(smtpe__stuffer *st, uint64_t high)
{
    if (high & HIGHS)
        st->seen |= SMTPE_CONTENT_8BIT;
    st->ended_crlf = st->at_line_start;
}

static size_t stuff_run(smtpe__stuffer *st, const uint8_t *p, size_t n, uint8_t *out,
                        size_t room, size_t *w)
{
    uint64_t high = 0;
    size_t in = 0, o = 0;
    int data = st->mode == SMTPE__STUFF_DATA;
    for (;;) {
        /* under DATA one octet of room is kept for a doubled dot */
        size_t r = room - o, lim = n - in, i;
        int dot = 0;
        if (data)
            r = r > 0 ? r - 1 : 0;
        if (r < lim)
            lim = r;
        i = stuff_stretch(st, p + in, lim, &high, &dot);
        if (i == 0)
            break;
        memcpy(out + o, p + in, i);
        in += i;
        o += i;
        if (!dot)
            break;
        out[o++] = '.'; /* §4.5.2: a line-start dot is doubled */
    }
    *w = o;
    if (in > 0)
        stuff_stretched(st, high);
    return in;
}

size_t smtpe__stuff_span(smtpe__stuffer *st, const uint8_t *p, size_t n, int *dot)
{
    uint64_t high = 0;
    size_t i;
    *dot = 0;
    if (st->refused || st->mode != SMTPE__STUFF_DATA || st->pending_cr || n == 0 ||
        (st->at_line_start && p[0] == '.'))
        return 0;
    if ((i = stuff_stretch(st, p, n, &high, dot)) == 0)
        return 0;
    stuff_stretched(st, high);
    st->in_octets += i;
    st->out_octets += i + (size_t)*dot;
    return i;
}

size_t smtpe__stuff_encode(smtpe__stuffer *st, const uint8_t *p, size_t n, uint8_t *out,
                           size_t cap, size_t *written)
{
    size_t i = 0, o = 0;
    *written = 0;
    if (st->refused || n == 0)
        return 0;
    if (st->mode == SMTPE__STUFF_BINARY)
        return stuff_binary(st, p, n, out, cap, written);
    while (i < n) {
        size_t used, k;
        int w;
        if (st->pending_cr) { /* p[i] settles the held CR */
            if (p[i] == '\n') {
                if (cap - o < 2)
                    break;
                st->pending_cr = 0;
                stuff_break(st, out + o);
                o += 2;
                i++;
                continue;
            }
            k = stuff_bare_cr(st, out + o, cap - o);
            if (k == 0)
                break;
            o += k; /* and p[i] is encoded as the first octet of a line */
        }
        if (!(st->at_line_start && st->mode == SMTPE__STUFF_DATA && p[i] == '.')) {
            size_t kw;
            k = stuff_run(st, p + i, n - i, out + o, cap - o, &kw);
            if (k > 0) {
                i += k;
                o += kw;
                continue;
            }
        }
        w = stuff_octet(st, p + i, n - i, out + o, cap - o, &used);
        if (w < 0)
            break;
        i += used;
        o += (size_t)w;
    }
    st->in_octets += i;
    st->out_octets += o;
    *written = o;
    return i;
}

size_t smtpe__stuff_finish(smtpe__stuffer *st, uint8_t *out)
{
    size_t o = 0;
    if (st->refused)
        return 0;
    if (st->mode == SMTPE__STUFF_BINARY) {
        if (st->pending_cr) /* by the scanner's rules; it went out verbatim */
            st->seen |= SMTPE_CONTENT_BARE_CR;
        st->pending_cr = 0;
        return 0;
    }
    if (st->pending_cr) { /* the content ends with a CR: it was bare */
        if (stuff_bare_cr(st, out, SMTPE__STUFF_FINISH_MAX) == 0)
            return 0; /* refused */
        o = 2;
    }
    if (st->in_octets > 0 && !st->ended_crlf) {
        stuff_break(st, out + o); /* RFC 5321 §4.1.1.4: the content ends with CRLF */
        o += 2;
    }
    if (st->mode == SMTPE__STUFF_DATA) {
        memcpy(out + o, ".\r\n", 3); /* the end of data, after the last line's CRLF */
        o += 3;
    }
    st->out_octets += o;
    return o;
}
