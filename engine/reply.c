/* reply.c - reply formatting: reply codes, enhanced status codes, multi-line replies.
 * RFC 5321 §4.2 (reply format), RFC 2034 §3 and RFC 3463 §2 (enhanced status codes). */
#include "reply.h"

#include <string.h>

/* Copies n octets to out[at..] (nothing with out NULL: the caller measures). */
static size_t put(uint8_t *out, size_t cap, size_t at, const void *src, size_t n)
{
    if (at > cap || n > cap - at)
        return SIZE_MAX;
    if (out)
        memcpy(out + at, src, n);
    return at + n;
}

size_t smtpe__reply_line(uint8_t *out, size_t cap, size_t at, unsigned code, int last,
                        const char *enhanced, const char *text, size_t len)
{
    char sep = last ? ' ' : '-';
    char head[4] = {(char)('0' + code / 100), (char)('0' + code / 10 % 10),
                    (char)('0' + code % 10), sep};
    size_t start = at;
    at = put(out, cap, at, head, 4);
    if (enhanced && at != SIZE_MAX) {
        at = put(out, cap, at, enhanced, strlen(enhanced));
        if (at != SIZE_MAX && len > 0)
            at = put(out, cap, at, " ", 1);
    }
    if (at != SIZE_MAX)
        at = put(out, cap, at, text, len);
    if (at != SIZE_MAX)
        at = put(out, cap, at, "\r\n", 2);
    if (at == SIZE_MAX || at - start > SMTPE__REPLY_LINE_MAX)
        return SIZE_MAX;
    return at;
}

size_t smtpe__reply_format(uint8_t *out, size_t cap, unsigned code, const char *enhanced,
                           const char *text, size_t text_len)
{
    size_t at = 0, line = 0;
    if (code < 100 || code > 599)
        return 0;
    for (;;) {
        const char *nl = memchr(text + line, '\n', text_len - line);
        size_t end = nl ? (size_t)(nl - text) : text_len;
        at = smtpe__reply_line(out, cap, at, code, !nl, enhanced, text + line, end - line);
        if (at == SIZE_MAX)
            return 0;
        if (!nl)
            return at;
        line = end + 1;
    }
}

static int digits(const char **p, int max)
{
    int n = 0;
    while (**p >= '0' && **p <= '9') {
        (*p)++;
        if (++n > max)
            return 0;
    }
    return n > 0;
}

int smtpe__enhanced_valid(const char *s, unsigned code)
{
    if (!s || s[0] != (char)('0' + code / 100) || (s[0] != '2' && s[0] != '4' && s[0] != '5'))
        return 0;
    if (s[1] != '.')
        return 0;
    s += 2;
    if (!digits(&s, 3) || *s++ != '.' || !digits(&s, 3))
        return 0;
    return *s == '\0';
}

int smtpe__reply_text_check(const char *text, size_t len)
{
    size_t line = 0, lines = 1;
    int too_long = len > SMTPE__REPLY_TOTAL_MAX;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            line = 0;
            if (++lines > SMTPE__REPLY_LINES_MAX)
                too_long = 1;
            continue;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 1;
        if (++line > SMTPE__REPLY_TEXT_MAX)
            too_long = 1;
    }
    return too_long ? 2 : 0;
}
