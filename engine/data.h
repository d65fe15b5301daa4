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

#endif
