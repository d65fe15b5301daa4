/* command.h - command-line framing, verbs and ESMTP parameters (private to the engine). */
#ifndef SMTPE_COMMAND_H
#define SMTPE_COMMAND_H
#include "smtpe.h"

/* A command line being assembled in engine memory. Only CRLF ends a line (RFC 5321 §2.3.8),
 * except that under SMTPE_LINE_ENDING_NORMALISE a bare LF or bare CR ends it too. */
typedef struct smtpe__line {
    uint8_t *buf;   /* cap octets, owned by the session */
    size_t cap;     /* longest line without CRLF: max_line_length - 2 */
    size_t len;     /* octets in buf */
    unsigned flags; /* SMTPE__LINE_* */
} smtpe__line;

#define SMTPE__LINE_TOO_LONG (1u << 0) /* octets past cap were dropped */
#define SMTPE__LINE_BARE (1u << 1)     /* a bare CR, bare LF or NUL was seen (REFUSE policy) */
#define SMTPE__LINE_CR (1u << 2)       /* the last octet seen was CR (not in buf) */
#define SMTPE__LINE_DONE (1u << 3)     /* a whole line is in buf */
#define SMTPE__LINE_BARE_END (1u << 4) /* it ended at a bare CR or LF (NORMALISE) */

/* Clears the line for the next command. */
void smtpe__line_reset(smtpe__line *l);

/* Consumes octets of p[0..n) into l until a line ends (SMTPE__LINE_DONE set in l->flags) or the
 * input runs out. Returns the octets consumed. */
size_t smtpe__line_feed(smtpe__line *l, const uint8_t *p, size_t n,
                        smtpe_line_ending_policy policy);

/* Command verbs of RFC 5321 §4.1.1. */
typedef enum smtpe__verb {
    SMTPE__VERB_UNKNOWN = 0,
    SMTPE__VERB_HELO,
    SMTPE__VERB_EHLO,
    SMTPE__VERB_MAIL,
    SMTPE__VERB_RCPT,
    SMTPE__VERB_DATA,
    SMTPE__VERB_RSET,
    SMTPE__VERB_NOOP,
    SMTPE__VERB_QUIT,
    SMTPE__VERB_VRFY,
    SMTPE__VERB_EXPN,
    SMTPE__VERB_HELP,
    SMTPE__VERB_STARTTLS, /* RFC 3207 */
    SMTPE__VERB_AUTH,     /* RFC 4954 */
    SMTPE__VERB_BDAT,     /* RFC 3030 */
    SMTPE__VERB_LHLO,     /* RFC 2033 */
    SMTPE__VERB_XCLIENT,  /* Postfix XCLIENT_README */
    SMTPE__VERB_XFORWARD  /* Postfix XFORWARD_README */
} smtpe__verb;

/* Splits a line into its verb (up to the first SP, compared without regard to case) and the
 * argument after the SP(s) that follow it. Returns the verb. */
smtpe__verb smtpe__command_split(const uint8_t *line, size_t n, smtpe_span *verb,
                                 smtpe_span *argument);

/* 1 if a[0..n) and b[0..n) are the same octets but for the case of ASCII letters. */
int smtpe__same_ci(const uint8_t *a, const uint8_t *b, size_t n);

/* 1 if p[0..n) starts with the ASCII prefix (compared without regard to case). */
int smtpe__has_prefix_ci(const uint8_t *p, size_t n, const char *prefix);

/* Results of smtpe__parse_params. */
#define SMTPE__PARAMS_OK 0
#define SMTPE__PARAMS_SYNTAX 1   /* malformed keyword or value */
#define SMTPE__PARAMS_TOO_MANY 2 /* more than max */

/* Parses esmtp-params (RFC 5321 §4.1.2: SP-separated keyword[=value]) in p[0..n); p starts at
 * the first keyword (leading SPs are skipped, trailing ones ignored). Fills out[0..*count), spans
 * into p. Values may hold non-ASCII octets (RFC 6531 §3.3); the caller checks them. */
int smtpe__parse_params(const uint8_t *p, size_t n, smtpe_param *out, size_t max, size_t *count);

/* Results of smtpe__xtext_decode. */
#define SMTPE__XTEXT_OK 0
#define SMTPE__XTEXT_SYNTAX 1  /* an octet that is not xchar, or "+" without two hex digits */
#define SMTPE__XTEXT_CONTROL 2 /* it decodes to a control octet (CR, LF, NUL, ... or DEL) */

/* Decodes xtext (RFC 3461 §4: xchar is "!".."~" but "+" and "="; "+" HEX HEX is that octet;
 * lower-case hex digits are tolerated) in place: p[0..n) becomes p[0..*out_len). Octets above
 * 127 are kept as they are (RFC 6531 allows UTF-8 in parameter values; the caller checks). */
int smtpe__xtext_decode(uint8_t *p, size_t n, size_t *out_len);

/* Parses an unsigned decimal of 1..20 digits without overflow. Returns 0 and *v, or -1. */
int smtpe__parse_u64(smtpe_span s, uint64_t *v);

/* The value 0..15 of a hex digit (either case), or -1. */
int smtpe__hex_digit(int c);

/* Encodes p[0..n) as xtext (RFC 3461 §4: octets "!".."~" but "+" and "=" as they are, every
 * other octet as "+" and two upper-case hex digits) into out[0..cap). Returns the length, or
 * SIZE_MAX if it does not fit. With out NULL it only measures (cap ignored). */
size_t smtpe__xtext_encode(const uint8_t *p, size_t n, uint8_t *out, size_t cap);

#endif
