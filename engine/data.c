/* data.c - DATA content: end-of-data detection and dot-unstuffing.
 * RFC 5321 §4.1.1.4 (the end is CRLF "." CRLF), §4.5.2 (transparency), §2.3.8 (bare CR/LF).
 *
 * The scanner keeps its position within a line in d->state and hands content out as spans of
 * the input, so a message is never copied. A dot at the start of a line is held back (it is
 * either dropped or part of the terminator), which is why a span ends there. A bare LF or CR
 * never starts a line, so no sequence but CR LF . CR LF can end the content. */
#include "data.h"

#include <string.h>

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

/* The length of the run at p[0..n) of octets other than CR, LF and NUL, eight at a time where
 * it can; the octets are ORed into *high (for SMTPE_DATA_HAS_8BIT). */
#if defined(__GNUC__)
#define HOT_INLINE inline __attribute__((always_inline))
#else
#define HOT_INLINE inline
#endif

/* Inlined into both scanners: as a call it costs DATA about 7% (measured). */
static HOT_INLINE size_t plain_run(const uint8_t *p, size_t n, uint64_t *high)
{
    uint64_t h = 0; /* a local, not *high: octet stores through p could alias it */
    size_t j = 0;
    while (n - j >= 8) {
        uint64_t v, m;
        memcpy(&v, p + j, 8);
        m = zero_octets(v) | zero_octets(v ^ (ONES * '\r')) | zero_octets(v ^ (ONES * '\n'));
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
    while (j < n && p[j] != '\r' && p[j] != '\n' && p[j] != 0)
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
        j += plain_run(p + j, n - j, &high);
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
        i += plain_run(p + i, n - i, &high);
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
