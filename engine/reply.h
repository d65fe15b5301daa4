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

#endif
