/* data.h - DATA content: end-of-data detection and dot-unstuffing (private to the engine).
 * RFC 5321 §4.1.1.4 and §4.5.2. Only CR LF . CR LF ends the content, whatever the policy. */
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
 * doubled; outside BINARYMIME each bare CR and bare LF becomes CRLF (NORMALISE) or stops the
 * encoding (REFUSE), so that no CR or LF ever reaches the wire except as CRLF; a CR at the end
 * of a piece is held until the next octet decides it. Conditions in refuse_mask
 * (SMTPE_CONTENT_*) stop the encoding at the octet that shows them. */
typedef struct smtpe__stuffer {
    int mode;             /* SMTPE__STUFF_* */
    smtpe_line_ending_policy policy;
    unsigned refuse_mask; /* SMTPE_CONTENT_* that stop the encoding */
    unsigned seen;        /* SMTPE_CONTENT_* found so far (8BIT also when not refused) */
    unsigned refused;     /* the SMTPE_CONTENT_* flag that stopped it, 0 while going */
    uint64_t in_octets;   /* content octets consumed */
    uint64_t out_octets;  /* wire octets written (dots and CRLFs included) */
    uint32_t line_len;    /* octets of the current line so far (for LONG_LINE) */
    int at_line_start;    /* the next octet starts a line */
    int pending_cr;       /* a CR was consumed and not yet written */
    int ended_crlf;       /* the content so far ends with a line break */
} smtpe__stuffer;

#define SMTPE__STUFF_DATA 0   /* DATA: dot-stuffing and line-end policy */
#define SMTPE__STUFF_BDAT 1   /* BDAT, text: line-end policy, no dots */
#define SMTPE__STUFF_BINARY 2 /* BDAT with BODY=BINARYMIME: verbatim */

/* Starts the encoding of one message's content. Under SMTPE__STUFF_BINARY policy and
 * refuse_mask are ignored (nothing is refused or changed). */
void smtpe__stuff_start(smtpe__stuffer *st, int mode, smtpe_line_ending_policy policy,
                        unsigned refuse_mask);

/* Encodes octets of p[0..n) into out[0..cap) and returns the input octets consumed; *written
 * gets the output octets. It stops when the next octet's output would not fit (an octet
 * yields at most 3: a held CR's CRLF and a doubled dot) or at a refused octet (st->refused set;
 * that octet is not consumed). Concatenating the outputs of any split of the same content
 * gives the same octets. */
size_t smtpe__stuff_encode(smtpe__stuffer *st, const uint8_t *p, size_t n, uint8_t *out,
                           size_t cap, size_t *written);

/* The content has ended: writes a held CR's line break (NORMALISE; under REFUSE a held CR is
 * bare: st->refused = SMTPE_CONTENT_BARE_CR and nothing is written), then the final CRLF if
 * the content is not empty and does not end with a line break (not for BINARY; an empty
 * content gets none), then under DATA the end of data ".\r\n". out has at least
 * SMTPE__STUFF_FINISH_MAX octets. Returns the octets written. */
#define SMTPE__STUFF_FINISH_MAX 7
size_t smtpe__stuff_finish(smtpe__stuffer *st, uint8_t *out);

/* The public smtpe_content_scan* functions live in data.c too, on the same line rules. */

#endif
