/* data.h - message content (private to the engine). Server side: end-of-data detection and
 * dot-unstuffing, RFC 5321 §4.1.1.4 and §4.5.2 (only CR LF . CR LF ends the content, whatever
 * the policy), and BDAT (RFC 3030). Client side: the content encoder (dot-stuffing, line ends).
 * The public content scanner (smtpe_content_scan, smtpe.h) is in data.c too. */
#ifndef SMTPE_DATA_H
#define SMTPE_DATA_H
#include "smtpe.h"

typedef struct smtpe__data {
    int state;                       /* SMTPE__DS_* */
    smtpe_line_ending_policy policy;
    uint64_t max_size;               /* 0: no limit */
    uint64_t size;                   /* content octets so far */
    int status;                      /* SMTPE_DATA_* */
    unsigned flags;                  /* SMTPE_DATA_NORMALISED | SMTPE_DATA_HAS_8BIT */
} smtpe__data;

/* Starts a message. at_line_start: the DATA line ended in CRLF, which then counts as the line
 * break before the content (RFC 5321 §4.1.1.4); 0 if it ended at a normalised bare CR or LF,
 * which starts no line (so "DATA\n.\r\n" is not an empty message). */
void smtpe__data_start(smtpe__data *d, smtpe_line_ending_policy policy, uint64_t max_size,
                       int at_line_start);

/* Scans p[0..n). Returns octets consumed, and stops early as soon as it has content to hand
 * out: *chunk then holds it (into p, or static memory for a normalised line break). *end is set
 * to 1 when the final CRLF.CRLF has been consumed. After status leaves SMTPE_DATA_OK no more
 * content is handed out, but the scan goes on to the end of data. */
size_t smtpe__data_feed(smtpe__data *d, const uint8_t *p, size_t n, smtpe_span *chunk, int *end);

/* BDAT (RFC 3030 §2): the content arrives in chunks whose lengths the commands give, so there
 * is no dot handling and no end marker. The line-ending policy still applies to the stream of
 * chunks as one text (a CR ending one chunk and an LF starting the next are one CRLF), except
 * for BODY=BINARYMIME (binary != 0), whose octets are taken verbatim. */
void smtpe__bdat_start(smtpe__data *d, smtpe_line_ending_policy policy, uint64_t max_size,
                       int binary);

/* Scans p[0..n), all of which belongs to the current chunk (the caller limits n to the octets
 * the chunk has left). Returns the octets consumed and sets *chunk to the content to hand out
 * (into p or static memory; may be empty). It returns 0 only after handing out the LF that a
 * normalised bare CR lacked, having moved on so that the next call consumes. */
size_t smtpe__bdat_feed(smtpe__data *d, const uint8_t *p, size_t n, smtpe_span *chunk);

/* The last chunk has ended: settles a CR its last octet left undecided (NORMALISE hands out
 * the LF it lacked through *chunk; REFUSE refuses it). *chunk may be empty. */
void smtpe__bdat_end(smtpe__data *d, smtpe_span *chunk);

/* ---- Content encoding (client side). RFC 5321 §4.5.2 (transparency), §2.3.8 (lines),
 * RFC 3030 (BDAT, BINARYMIME). ----
 * The encoder turns submitted content into wire octets: under DATA every line-start dot is
 * doubled (a line starts at the start of the content and after every line break written);
 * outside BINARYMIME each bare CR and bare LF becomes CRLF (NORMALISE) or stops the encoding
 * (REFUSE), so that no CR or LF ever reaches the wire except as CRLF; a CR is consumed and
 * held until the next octet (or the end) decides it: with an LF it is a CRLF, else a bare CR
 * (so CR CR LF is a bare CR, then a CRLF). Conditions in refuse_mask (SMTPE_CONTENT_*) stop
 * the encoding at the octet that shows them. The line rules (what is a bare CR, a bare LF, a
 * line over 998 octets) are those of smtpe_content_scan, which shares them. */
typedef struct smtpe__stuffer {
    int mode;             /* SMTPE__STUFF_* */
    smtpe_line_ending_policy policy;
    unsigned refuse_mask; /* SMTPE_CONTENT_* that stop the encoding */
    unsigned seen;        /* SMTPE_CONTENT_* found so far, refused or not (8BIT also when not
                             refused; the refused octet's flags too) */
    unsigned refused;     /* the SMTPE_CONTENT_* flag that stopped it, 0 while going */
    uint64_t in_octets;   /* content octets consumed */
    uint64_t out_octets;  /* wire octets written (dots and CRLFs included) */
    uint32_t line_len;    /* octets of the current line so far (for LONG_LINE), its line break
                             and doubled dot excluded; counted up to 999 only */
    int at_line_start;    /* the next octet starts a line */
    int pending_cr;       /* a CR was consumed and not yet written (BINARY: the last octet was
                             a CR, written; for seen) */
    int ended_crlf;       /* the content so far ends with a line break */
    int vector;           /* the scan: 0 scalar, 1 SSE2, 2 AVX2 (set by smtpe__stuff_start
                             to the best the build and the CPU have; a test may lower it to
                             compare with the scalar reference: all give the same octets) */
} smtpe__stuffer;

#define SMTPE__STUFF_DATA 0   /* DATA: dot-stuffing and line-end policy */
#define SMTPE__STUFF_BDAT 1   /* BDAT, text: line-end policy, no dots */
#define SMTPE__STUFF_BINARY 2 /* BDAT with BODY=BINARYMIME: verbatim */

/* Starts the encoding of one message's content. policy SMTPE_LINE_ENDING_REFUSE adds
 * SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF to refuse_mask; any other policy normalises
 * (KEEP too: nothing bare ever reaches the wire), unless refuse_mask itself holds one of
 * them. Under SMTPE__STUFF_BINARY policy and refuse_mask are ignored (nothing is refused or
 * changed; seen is still kept). */
void smtpe__stuff_start(smtpe__stuffer *st, int mode, smtpe_line_ending_policy policy,
                        unsigned refuse_mask);

/* Encodes octets of p[0..n) into out[0..cap) and returns the input octets consumed; *written
 * gets the output octets (never more than cap). Octet by octet, each in turn:
 *   - the octet after a held CR first settles it: an LF makes it a CRLF (2 octets, the LF
 *     consumed); anything else makes it a bare CR, whose CRLF (2 octets) is written, or which
 *     is refused (st->refused = SMTPE_CONTENT_BARE_CR; the CR was consumed, the octet after
 *     it is not); then that octet is encoded as below, at the start of a line;
 *   - a CR is consumed and held, writing nothing (so even with cap 0);
 *   - a bare LF gives CRLF (2) or is refused; a line-start "." under DATA gives ".." (2);
 *     any other octet itself (1), unless refused (refuse_mask: NUL, 8BIT, LONG_LINE for the
 *     999th octet of a line; st->refused gets the lowest flag the octet shows).
 * It stops before an octet whose output does not fit, and at a refused octet (not
 * consumed). So written > 0 with 0 consumed happens only when a held CR turned out bare and
 * the octet after it does not fit; with cap >= 4 an unrefused call with n > 0 consumes. Once
 * refused, nothing more is consumed or written. Concatenating the outputs of any split of the
 * same content, and of any caps, gives the same octets, and the same refusal at the same
 * total of consumed octets. BINARY: as much of p as fits, verbatim. */
size_t smtpe__stuff_encode(smtpe__stuffer *st, const uint8_t *p, size_t n, uint8_t *out,
                           size_t cap, size_t *written);

/* The encoder's fast path without the copy, under SMTPE__STUFF_DATA: the length of the
 * longest stretch at the start of p[0..n) that goes out as its own octets (plain text, CRLFs,
 * up to and including a line-start dot after one, which then needs doubling: *dot set), with
 * the state moved past it exactly as smtpe__stuff_encode would have (in_octets by the
 * length, out_octets by the length and the doubled dot). The wire is the stretch, then (with
 * *dot) one more "." before what follows. 0 when it cannot start (held CR, a line-start dot
 * at p[0], a stop: smtpe__stuff_encode takes it), or in another mode. */
size_t smtpe__stuff_span(smtpe__stuffer *st, const uint8_t *p, size_t n, int *dot);

/* The content has ended (call once): writes a held CR's line break (NORMALISE; under REFUSE a
 * held CR is bare: st->refused = SMTPE_CONTENT_BARE_CR and nothing is written), then the final
 * CRLF if the content is not empty and does not end with a line break (not for BINARY; an
 * empty content gets none), then under DATA the end of data ".\r\n" (so empty content gives
 * just ".\r\n": the DATA command's CRLF ends the line before it; "abc" gives
 * "abc\r\n.\r\n"). After a refusal it writes nothing. out has at least
 * SMTPE__STUFF_FINISH_MAX octets. Returns the octets written (at most 5). */
#define SMTPE__STUFF_FINISH_MAX 7
size_t smtpe__stuff_finish(smtpe__stuffer *st, uint8_t *out);

/* The public smtpe_content_scan* functions live in data.c too, on the same line rules. */

#endif
