/*
 * fuzz_bdat.c - libFuzzer target for BDAT content (engine/data.c: smtpe__bdat_start,
 * smtpe__bdat_feed, smtpe__bdat_end; RFC 3030 §2, §3 and the line-ending policies of smtpe.h).
 *
 * Input layout:
 *   [0]      line-ending policy (value % 3: REFUSE, NORMALISE, KEEP)
 *   [1]      bit 0: BODY=BINARYMIME (the octets are taken verbatim whatever the policy)
 *   [2]      max_size: <64 none (0), else (v-64)*2+1 octets (1..383)
 *   [3]      N: number of chunk-length octets (v % 17)
 *   [4]      S: number of split octets (v % 17)
 *   [5..5+N)        the lengths of the first N chunks (0..255 each; a BDAT 0 chunk is valid)
 *   [5+N..5+N+S)    split steps: piece sizes 1 + v % 16, used in turn
 *   [5+N+S..)       the content octets: cut into the N chunks in order (a chunk the content does
 *                   not fill is shorter or empty); whatever is left over is one more chunk
 *
 * The message is scanned four times, each call getting an exact-size heap copy of its octets
 * (so ASan sees any read past them), a call never crossing a chunk's end (the caller limits n
 * to what the chunk has left, as server.c does), smtpe__bdat_end after the last chunk:
 *   1. each chunk offered whole (the call repeated until the chunk is consumed);
 *   2. one octet per call;
 *   3. pieces whose sizes cycle through the split steps (and, at each chunk's start, a call
 *      with no octets, which must change nothing);
 *   4. the concatenation of all chunks as one chunk.
 *
 * Oracles:
 *   - every call consumes at most n octets; a chunk it hands out lies within the octets it
 *     consumed or is a static line break ("\r\n", its "\r" cut at the size limit, or under
 *     NORMALISE the "\n" a bare CR lacked); under KEEP/BINARYMIME it is never static; a call
 *     consumes nothing only when it hands out NORMALISE's "\n" (or would, past the size
 *     limit), and the next call consumes;
 *     once the status has left SMTPE_DATA_OK nothing more is handed out; the size never
 *     shrinks;
 *   - split invariance: all four give the same concatenated content, size, status and flags
 *     (within and across chunks: a CR ending one chunk and an LF starting the next are one
 *     CRLF, as the chunks are one text);
 *   - reference (raw = the concatenation of the chunks):
 *       KEEP or BINARYMIME: content = raw up to max_size; status TOO_BIG iff raw is longer;
 *         size = |raw|; never NORMALISED;
 *       NORMALISE: content = the reference normaliser applied to raw (bare CR or bare LF ->
 *         CRLF, NUL removed, CRLF kept, a CR ending the last chunk -> CRLF) up to max_size;
 *         size = its length; TOO_BIG iff that is over max_size; NORMALISED iff raw holds a bare
 *         CR, bare LF or NUL;
 *       REFUSE: content = raw up to its first bare CR/LF/NUL, at most max_size octets; status
 *         TOO_BIG iff the octets before the first bare one are over max_size, else
 *         BAD_LINE_ENDING iff there is a bare one; size = |raw| less the bare octets (they are
 *         not content); never NORMALISED;
 *     the content never holds more than max_size octets, exactly max_size when TOO_BIG;
 *   - HAS_8BIT iff raw holds an octet above 127 (smtpe.h: "an octet above 127 was seen", so it
 *     counts octets past the limit or after a refusal too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "fuzz_util.h"

#define MAXCHUNKS 18

typedef struct msg {
    smtpe_line_ending_policy policy;
    int binary;
    uint64_t max;
    const uint8_t *chunk[MAXCHUNKS];
    size_t len[MAXCHUNKS];
    size_t nchunks;
    const uint8_t *steps;
    size_t nsteps;
} msg;

typedef struct result {
    fz_buf content;
    smtpe__data d;
} result;

/* 1 if the span is a static line break the engine may hand out under the policy. */
static int static_ok(smtpe_span ch, smtpe_line_ending_policy pol)
{
    if (pol == SMTPE_LINE_ENDING_KEEP)
        return 0;
    if (ch.len == 2)
        return ch.ptr[0] == '\r' && ch.ptr[1] == '\n';
    if (ch.len == 1 && ch.ptr[0] == '\r')
        return 1; /* a CRLF cut at the size limit */
    return ch.len == 1 && ch.ptr[0] == '\n' && pol == SMTPE_LINE_ENDING_NORMALISE;
}

/* One call of smtpe__bdat_feed on a heap copy of p[0..n). Returns the octets consumed. */
static size_t feed(result *res, smtpe_line_ending_policy pol, const uint8_t *p, size_t n,
                   int *zero_before)
{
    uint8_t *q = malloc(n ? n : 1);
    if (!q)
        abort();
    memcpy(q, p, n);
    smtpe_span ch = {NULL, 12345};
    int status_before = res->d.status;
    uint64_t size_before = res->d.size;
    size_t used = smtpe__bdat_feed(&res->d, q, n, &ch);
    FUZZ_CHECK(used <= n, "bdat_feed consumed more than it was given");
    FUZZ_CHECK(res->d.size >= size_before, "bdat_feed made the size shrink");
    if (ch.len > 0) {
        FUZZ_CHECK(status_before == SMTPE_DATA_OK,
                   "bdat_feed handed out content after the status left SMTPE_DATA_OK");
        FUZZ_CHECK(fz_within(ch, q, used) || static_ok(ch, pol),
                   "bdat_feed chunk neither within the octets it consumed nor a static line "
                   "break allowed under the policy");
        fz_put(&res->content, ch.ptr, ch.len);
    }
    if (used == 0 && n > 0) {
        /* the LF a normalised bare CR lacked (not handed out once the content is refused) */
        FUZZ_CHECK(pol == SMTPE_LINE_ENDING_NORMALISE &&
                       ((ch.len == 1 && ch.ptr[0] == '\n') ||
                        (ch.len == 0 && res->d.status != SMTPE_DATA_OK)),
                   "bdat_feed consumed nothing without handing out NORMALISE's lacking LF");
        FUZZ_CHECK(!*zero_before, "bdat_feed consumed nothing twice in a row (no progress)");
    }
    *zero_before = used == 0 && n > 0;
    free(q);
    return used;
}

/* mode 0: each chunk whole; 1: one octet at a time; 2: split steps; 3: one chunk. */
static void scan(const msg *m, int mode, const uint8_t *all, size_t total, result *res)
{
    smtpe_line_ending_policy pol = m->binary ? SMTPE_LINE_ENDING_KEEP : m->policy;
    smtpe__bdat_start(&res->d, m->policy, m->max, m->binary);
    size_t si = 0;
    int zero = 0;
    size_t nchunks = mode == 3 ? 1 : m->nchunks;
    for (size_t c = 0; c < nchunks; c++) {
        const uint8_t *p = mode == 3 ? all : m->chunk[c];
        size_t n = mode == 3 ? total : m->len[c];
        if (mode == 2) {
            smtpe__data before = res->d;
            smtpe_span ch = {NULL, 99};
            FUZZ_CHECK(smtpe__bdat_feed(&res->d, p, 0, &ch) == 0 && ch.len == 0,
                       "bdat_feed with no octets consumed or handed out something");
            FUZZ_CHECK(memcmp(&before, &res->d, sizeof before) == 0,
                       "bdat_feed with no octets changed the state");
        }
        size_t off = 0, iter = 0;
        while (off < n) {
            FUZZ_CHECK(++iter <= 2 * n + 4, "bdat_feed makes no progress");
            size_t k = n - off;
            if (mode == 1)
                k = 1;
            else if (mode == 2 && m->nsteps) {
                size_t st = 1 + m->steps[si++ % m->nsteps] % 16;
                k = k < st ? k : st;
            }
            off += feed(res, pol, p + off, k, &zero);
        }
    }
    smtpe_span tail = {NULL, 12345};
    int status_before = res->d.status;
    smtpe__bdat_end(&res->d, &tail);
    if (tail.len > 0) {
        FUZZ_CHECK(status_before == SMTPE_DATA_OK, "bdat_end handed out content after a refusal");
        FUZZ_CHECK(pol == SMTPE_LINE_ENDING_NORMALISE && tail.len == 1 && tail.ptr[0] == '\n',
                   "bdat_end handed out something other than NORMALISE's lacking LF");
        fz_put(&res->content, tail.ptr, tail.len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5)
        return 0;
    msg m;
    memset(&m, 0, sizeof m);
    m.policy = (smtpe_line_ending_policy)(data[0] % 3);
    m.binary = data[1] & 1;
    m.max = data[2] < 64 ? 0 : (uint64_t)(data[2] - 64) * 2 + 1;
    size_t nl = data[3] % 17, ns = data[4] % 17;
    size_t at = 5;
    if (size < at + nl + ns)
        return 0;
    const uint8_t *lens = data + at;
    at += nl;
    m.steps = data + at;
    m.nsteps = ns;
    at += ns;
    const uint8_t *content = data + at;
    size_t total = size - at, off = 0;
    for (size_t i = 0; i < nl; i++) {
        size_t l = lens[i] < total - off ? lens[i] : total - off;
        m.chunk[m.nchunks] = content + off;
        m.len[m.nchunks++] = l;
        off += l;
    }
    if (off < total || m.nchunks == 0) {
        m.chunk[m.nchunks] = content + off;
        m.len[m.nchunks++] = total - off;
    }

    result res[4];
    memset(res, 0, sizeof res);
    for (int mode = 0; mode < 4; mode++)
        scan(&m, mode, content, total, &res[mode]);

    for (int mode = 1; mode < 4; mode++) {
        FUZZ_CHECK(fz_eq(res[0].content.p, res[0].content.len, res[mode].content.p,
                         res[mode].content.len),
                   "split invariance: the content differs between chunkings/splits");
        FUZZ_CHECK(res[0].d.size == res[mode].d.size && res[0].d.status == res[mode].d.status &&
                       res[0].d.flags == res[mode].d.flags,
                   "split invariance: size, status or flags differ between chunkings/splits");
    }

    /* the reference */
    const result *r = &res[0];
    smtpe_line_ending_policy pol = m.binary ? SMTPE_LINE_ENDING_KEEP : m.policy;
    size_t fb = fz_first_bare(content, total), nb = fz_count_bare(content, total);
    fz_buf exp = {0};
    uint64_t expsize;
    int expstatus;
    if (pol == SMTPE_LINE_ENDING_KEEP) {
        fz_put(&exp, content, total);
        expsize = total;
        expstatus = m.max && expsize > m.max ? SMTPE_DATA_TOO_BIG : SMTPE_DATA_OK;
    } else if (pol == SMTPE_LINE_ENDING_NORMALISE) {
        fz_normalise(&exp, content, total);
        expsize = exp.len;
        expstatus = m.max && expsize > m.max ? SMTPE_DATA_TOO_BIG : SMTPE_DATA_OK;
    } else {
        fz_put(&exp, content, fb);
        expsize = total - nb;
        expstatus = m.max && fb > m.max ? SMTPE_DATA_TOO_BIG
                    : nb                ? SMTPE_DATA_BAD_LINE_ENDING
                                        : SMTPE_DATA_OK;
    }
    size_t explen = m.max && exp.len > m.max ? (size_t)m.max : exp.len;
    const fz_buf *got = &r->content;
    if (m.max)
        FUZZ_CHECK(got->len <= m.max, "more content handed out than max_size");
    FUZZ_CHECK(r->d.status == expstatus, "status is not what the reference gives");
    FUZZ_CHECK(r->d.size == expsize, "size is not the content the reference gives (all of it, "
                                     "past the limit too)");
    if (r->d.status == SMTPE_DATA_TOO_BIG)
        FUZZ_CHECK(got->len == m.max, "TOO_BIG but the content is not exactly max_size octets");
    if (pol == SMTPE_LINE_ENDING_REFUSE) {
        size_t upto = m.max && fb > m.max ? (size_t)m.max : fb;
        FUZZ_CHECK(fz_eq(got->p, got->len, content, upto),
                   "REFUSE: the content is not the octets before the first bare CR/LF/NUL");
    } else {
        FUZZ_CHECK(fz_eq(got->p, got->len, exp.p, explen),
                   pol == SMTPE_LINE_ENDING_KEEP
                       ? "KEEP/BINARYMIME: the content is not the chunk octets verbatim"
                       : "NORMALISE: the content is not the reference normaliser's output");
    }
    FUZZ_CHECK(!!(r->d.flags & SMTPE_DATA_NORMALISED) ==
                   (pol == SMTPE_LINE_ENDING_NORMALISE && nb > 0),
               "NORMALISED flag disagrees with a bare CR/LF/NUL under NORMALISE");
    FUZZ_CHECK(!!(r->d.flags & SMTPE_DATA_HAS_8BIT) == fz_has_8bit(content, total),
               "HAS_8BIT disagrees with an octet above 127 in the chunk octets");
    FUZZ_CHECK((r->d.flags & ~(unsigned)(SMTPE_DATA_NORMALISED | SMTPE_DATA_HAS_8BIT)) == 0,
               "unknown flag bits");

    fz_free(&exp);
    for (int mode = 0; mode < 4; mode++)
        fz_free(&res[mode].content);
    return 0;
}
