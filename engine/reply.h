/* reply.h - reply formatting (private to the engine). RFC 5321 §4.2, RFC 2034, RFC 3463. */
#ifndef SMTPE_REPLY_H
#define SMTPE_REPLY_H
#include "smtpe.h"

#define SMTPE__REPLY_LINE_MAX 512  /* RFC 5321 §4.5.3.1.5, code and CRLF included */
#define SMTPE__REPLY_TEXT_MAX 400  /* text of one host reply line */
#define SMTPE__REPLY_TOTAL_MAX 2048 /* all text of one host reply */
#define SMTPE__REPLY_LINES_MAX 32   /* lines of one host reply */

/* Writes a reply of code (200..599) into out[0..cap): one line per '\n'-separated line of text
 * (text[0..text_len)), "code-" on all but the last, "code " on the last; each line's text
 * preceded by "enhanced " when enhanced is not NULL. Returns the octets written, or 0 if they do
 * not fit in cap or a line would exceed SMTPE__REPLY_LINE_MAX. With out NULL nothing is written
 * and the length is measured (cap SIZE_MAX: no limit). */
size_t smtpe__reply_format(uint8_t *out, size_t cap, unsigned code, const char *enhanced,
                           const char *text, size_t text_len);

/* Writes one reply line "code-" (or "code " when last) [enhanced " "] text CRLF at out[at..cap)
 * (with out NULL: measures it). Returns the new end offset, or SIZE_MAX if it does not fit or
 * the line would be longer than SMTPE__REPLY_LINE_MAX. */
size_t smtpe__reply_line(uint8_t *out, size_t cap, size_t at, unsigned code, int last,
                        const char *enhanced, const char *text, size_t len);

/* 1 if s is an enhanced status code "class.subject.detail" (RFC 3463 §2: class 2, 4 or 5,
 * subject 1-3 digits, detail 1-3 digits) whose class is code's first digit. */
int smtpe__enhanced_valid(const char *s, unsigned code);

/* Whether text is acceptable host reply text: no control octets but HT and '\n' (RFC 5321 §4.2
 * textstring), each line at most SMTPE__REPLY_TEXT_MAX octets, at most SMTPE__REPLY_LINES_MAX
 * lines, all at most SMTPE__REPLY_TOTAL_MAX. Returns 0 acceptable, 1 a control octet, 2 a line
 * or the whole too long. */
int smtpe__reply_text_check(const char *text, size_t len);

/* ---- The strict reply parser (client side). RFC 5321 §4.2, §4.5.3.1.5. ----
 * A reply is one or more lines "ddd-text" CRLF and a last "ddd text" CRLF or "ddd" CRLF: the
 * code's digits are 2-5, 0-5, 0-9; every line of a reply carries the same code; only CRLF ends
 * a line (a bare CR or bare LF is an error); a line holds no NUL; any other octet (HT, 8-bit)
 * may be text. The parser takes one line at a time into a caller buffer, so the caller looks
 * at each line as it completes (EHLO keywords) and the last line stays in the buffer (the text
 * of an outcome). */
typedef struct smtpe__reply_parser {
    uint8_t *buf;     /* cap octets, owned by the caller (NULL when cap is 0) */
    size_t cap;       /* longest line without CRLF, code included (max_reply_line - 2) */
    size_t len;       /* octets of the current line in buf (CRLF not kept) */
    size_t total;     /* octets of the current reply so far, CRLFs included */
    size_t max_total; /* longest reply in octets, all lines and their CRLFs */
    unsigned code;    /* the reply's code, once its first line's three digits are in; 0 before */
    unsigned lines;   /* lines of the current reply completed */
    int state;        /* private */
} smtpe__reply_parser;

/* Results of smtpe__reply_feed. */
#define SMTPE__RP_MORE 0         /* all input consumed; the line is not complete */
#define SMTPE__RP_LINE 1         /* a line that is not the last is in buf[0..len) */
#define SMTPE__RP_DONE 2         /* the last line is in buf[0..len): the reply is complete */
#define SMTPE__RP_SYNTAX (-1)    /* not "ddd", "ddd-" or "ddd " (or a 1xx, 6xx...), or a NUL */
#define SMTPE__RP_MISMATCH (-2)  /* a line's code differs from the first line's */
#define SMTPE__RP_LONG_LINE (-3) /* a line longer than cap */
#define SMTPE__RP_TOO_BIG (-4)   /* the reply passed max_total octets */
#define SMTPE__RP_BARE (-5)      /* a bare CR or bare LF */

/* Readies p for a new reply. buf/cap/max_total stay. */
void smtpe__reply_parser_start(smtpe__reply_parser *p);

/* Consumes octets of in[0..n) until a line completes or an error is found, or the input runs
 * out; sets *used and returns SMTPE__RP_*. LINE and DONE consume exactly through the line's
 * LF, never further (what follows is the next line, the next reply, or octets the caller must
 * judge). After LINE the next call empties buf and begins the next line of the same reply;
 * after DONE the caller calls smtpe__reply_parser_start before the next reply (a call without
 * it starts the next reply all the same). Split invariant: any split of the same octets gives
 * the same results, *used adding up to the same offsets, and the same buf at each LINE/DONE.
 *
 * Each octet is decided as it arrives, in this order: after a CR anything but LF is BARE; a
 * LF not after a CR is BARE; a CR before the three digits is SYNTAX ("25" CRLF); a NUL, a
 * digit out of range, or an octet after the digits other than SP, '-' or CR is SYNTAX; a digit
 * that differs from the first line's is MISMATCH (on the first differing digit); the cap+1-th
 * octet of a line (CR and LF do not count) is LONG_LINE; the octet that would make total pass
 * max_total (CR and LF count) is TOO_BIG. So an endless line ends at cap+1 octets and a reply
 * of endless short lines at max_total + 1.
 *
 * An error sticks: p must not be fed again until restarted, and a call returns the same error
 * with *used 0. *used counts the octet that caused an error. n may be 0 (then MORE). Never
 * reads in[] past n nor writes buf past cap. */
int smtpe__reply_feed(smtpe__reply_parser *p, const uint8_t *in, size_t n, size_t *used);

/* The text of the line in p->buf (after "ddd-" or "ddd "; empty for "ddd"): a span into
 * p->buf, valid until the next smtpe__reply_feed or smtpe__reply_parser_start. */
smtpe_span smtpe__reply_text(const smtpe__reply_parser *p);

/* Splits an enhanced status code off the start of text (RFC 2034 §4: "class.subject.detail"
 * followed by SP or the end of the text): if it is one (smtpe__enhanced_valid's syntax) and its
 * class is code's first digit, sets *enhanced to it and *rest to the text after it and the SP
 * (one SP; a second is part of rest), and returns 1; else *enhanced is empty (text.ptr, 0),
 * *rest is text, and it returns 0. Reads only text.ptr[0..text.len); the spans point into it. */
int smtpe__enhanced_split(smtpe_span text, unsigned code, smtpe_span *enhanced,
                          smtpe_span *rest);

/* A static description of a SMTPE__RP_* error ("malformed reply line", ...). */
const char *smtpe__reply_error_text(int rp);

#endif
