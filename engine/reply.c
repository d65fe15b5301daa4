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

/* ---- The strict reply parser (client side). RFC 5321 §4.2, §4.5.3.1.5. ----------------------
 * One octet at a time (rp_octet), so that every split of the input decides the same way; each
 * octet is checked before it changes the parser, in the order the header gives. */

/* p->state: a line being read, its CR seen, a line handed out (LINE), the reply handed out
 * (DONE); a negative state is the error the parser stopped at. */
enum { RP_IN_LINE = 0, RP_CR = 1, RP_LINE_OUT = 2, RP_REPLY_OUT = 3 };

void smtpe__reply_parser_start(smtpe__reply_parser *p)
{
    p->len = 0;
    p->total = 0;
    p->code = 0;
    p->lines = 0;
    p->state = RP_IN_LINE;
}

/* The digit of code at position at (0: hundreds, 1: tens, 2: units), as an octet. */
static uint8_t code_digit(unsigned code, size_t at)
{
    unsigned d = at == 0 ? code / 100 : at == 1 ? code / 10 % 10 : code % 10;
    return (uint8_t)('0' + d);
}

/* Checks octet c (not the LF of a CRLF) at p->len of the current line without changing p:
 * SMTPE__RP_MORE if it may be taken, else the error. */
static int rp_check(const smtpe__reply_parser *p, uint8_t c)
{
    static const uint8_t lo[3] = {'2', '0', '0'}, hi[3] = {'5', '5', '9'};
    if (c == '\n')
        return SMTPE__RP_BARE;
    if (c == '\r')
        return p->len < 3 ? SMTPE__RP_SYNTAX : SMTPE__RP_MORE;
    if (c == 0)
        return SMTPE__RP_SYNTAX;
    if (p->len < 3) {
        if (c < lo[p->len] || c > hi[p->len])
            return SMTPE__RP_SYNTAX;
        if (p->lines > 0 && c != code_digit(p->code, p->len))
            return SMTPE__RP_MISMATCH;
    } else if (p->len == 3 && c != '-' && c != ' ') {
        return SMTPE__RP_SYNTAX;
    }
    return p->len >= p->cap ? SMTPE__RP_LONG_LINE : SMTPE__RP_MORE;
}

/* Takes one octet: SMTPE__RP_MORE, LINE or DONE at the LF of a CRLF, or an error (p unchanged
 * but for the state the caller sets). */
static int rp_octet(smtpe__reply_parser *p, uint8_t c)
{
    int r = SMTPE__RP_MORE;
    if (p->state == RP_CR) {
        if (c != '\n')
            return SMTPE__RP_BARE;
        /* a CR is taken only at p->len >= 3, so buf[3] exists when len > 3 */
        r = (p->len == 3 || p->buf[3] == ' ') ? SMTPE__RP_DONE : SMTPE__RP_LINE;
    } else {
        r = rp_check(p, c);
        if (r != SMTPE__RP_MORE)
            return r;
    }
    if (p->total >= p->max_total)
        return SMTPE__RP_TOO_BIG;
    p->total++;
    if (r != SMTPE__RP_MORE) {
        p->lines++;
        p->state = r == SMTPE__RP_DONE ? RP_REPLY_OUT : RP_LINE_OUT;
    } else if (c == '\r') {
        p->state = RP_CR;
    } else {
        p->buf[p->len++] = c;
        if (p->len == 3 && p->lines == 0)
            p->code = (unsigned)(p->buf[0] - '0') * 100 + (unsigned)(p->buf[1] - '0') * 10 +
                      (unsigned)(p->buf[2] - '0');
    }
    return r;
}

/* 1 if the four octets at in start a line as rp_octet would take them one by one with no
 * other effect: three digits in range (the first line's code on a later line), then "-" or
 * SP, within cap and max_total. */
static int prefix_ok(const smtpe__reply_parser *p, const uint8_t *in)
{
    if (p->cap < 4 || p->max_total - p->total < 4)
        return 0;
    if (in[0] < '2' || in[0] > '5' || in[1] < '0' || in[1] > '5' || in[2] < '0' || in[2] > '9')
        return 0;
    if (in[3] != '-' && in[3] != ' ')
        return 0;
    /* a later line: buf[0..3) still holds the line before's code, which was the first's (a
     * CR is taken only at len >= 3, and a line whose code differs is an error) */
    return p->lines == 0 || (in[0] == p->buf[0] && in[1] == p->buf[1] && in[2] == p->buf[2]);
}

/* The length of the run at in[0..n) that rp_octet would take as text, octet by octet, with
 * no other effect: no CR, LF or NUL, and within the line's cap and the reply's max_total. */
static size_t text_run(const smtpe__reply_parser *p, const uint8_t *in, size_t n)
{
    size_t lim = n, k = 0;
    if (p->cap - p->len < lim)
        lim = p->cap - p->len;
    if (p->max_total - p->total < lim)
        lim = p->max_total - p->total;
    while (lim - k >= 8) { /* a word at a time while no octet is below 0x0E */
        uint64_t v, m;
        memcpy(&v, in + k, 8);
        m = (v - 0x0E0E0E0E0E0E0E0Eull) & ~v & 0x8080808080808080ull;
        if (m) {
            /* the lowest flag is exact (a borrow moves only upwards), so the octets before
             * the first one below 0x0E go at once; on a little-endian machine the word's low
             * byte is its first octet in memory (elsewhere the run stops at the word) */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            k += (size_t)__builtin_ctzll(m) / 8;
#endif
            break;
        }
        k += 8;
    }
    while (k < lim && in[k] != '\r' && in[k] != '\n' && in[k] != 0)
        k++;
    return k;
}

int smtpe__reply_feed(smtpe__reply_parser *p, const uint8_t *in, size_t n, size_t *used)
{
    *used = 0;
    if (p->state < 0)
        return p->state;
    if (p->state == RP_LINE_OUT) {
        p->len = 0;
        p->state = RP_IN_LINE;
    } else if (p->state == RP_REPLY_OUT) {
        smtpe__reply_parser_start(p);
    }
    for (size_t i = 0; i < n; i++) {
        int r;
        if (p->state == RP_IN_LINE && p->len == 0 && n - i >= 4 && prefix_ok(p, in + i)) {
            /* "ddd-" or "ddd " that rp_octet would take octet by octet, taken at once */
            memcpy(p->buf, in + i, 4);
            p->len = 4;
            p->total += 4;
            if (p->lines == 0)
                p->code = (unsigned)(in[i] - '0') * 100 + (unsigned)(in[i + 1] - '0') * 10 +
                          (unsigned)(in[i + 2] - '0');
            i += 4;
            if (i == n)
                break;
        }
        if (p->state == RP_IN_LINE && p->len >= 4) {
            /* the text of a line: the octets rp_octet would take one by one (neither CR, LF
             * nor NUL, within cap and max_total) are taken as a run */
            size_t k = text_run(p, in + i, n - i);
            memcpy(p->buf + p->len, in + i, k);
            p->len += k;
            p->total += k;
            i += k;
            if (i == n)
                break;
            if (n - i >= 2 && in[i] == '\r' && in[i + 1] == '\n' &&
                p->max_total - p->total >= 2) {
                /* the line's CRLF, as rp_octet would take it in two steps (len >= 4 here) */
                p->total += 2;
                p->lines++;
                r = p->buf[3] == ' ' ? SMTPE__RP_DONE : SMTPE__RP_LINE;
                p->state = r == SMTPE__RP_DONE ? RP_REPLY_OUT : RP_LINE_OUT;
                *used = i + 2;
                return r;
            }
        }
        r = rp_octet(p, in[i]);
        if (r == SMTPE__RP_MORE)
            continue;
        *used = i + 1;
        if (r < 0)
            p->state = r;
        return r;
    }
    *used = n;
    return SMTPE__RP_MORE;
}

smtpe_span smtpe__reply_text(const smtpe__reply_parser *p)
{
    smtpe_span s = {p->buf, 0};
    if (p->len > 4) {
        s.ptr = p->buf + 4;
        s.len = p->len - 4;
    }
    return s;
}

/* Longest enhanced status code: "c.sss.ddd" (RFC 3463 §2). */
#define ENHANCED_MAX 9

int smtpe__enhanced_split(smtpe_span text, unsigned code, smtpe_span *enhanced,
                          smtpe_span *rest)
{
    char copy[ENHANCED_MAX + 1];
    size_t k = 0;
    while (k < text.len && k <= ENHANCED_MAX && text.ptr[k] != ' ')
        k++;
    enhanced->ptr = text.ptr;
    enhanced->len = 0;
    *rest = text;
    /* the code ends at a SP or the end within ENHANCED_MAX octets and holds no NUL (which
     * would end the C string smtpe__enhanced_valid reads before the span does) */
    if (k == 0 || k > ENHANCED_MAX || memchr(text.ptr, 0, k))
        return 0;
    memcpy(copy, text.ptr, k);
    copy[k] = 0;
    if (!smtpe__enhanced_valid(copy, code))
        return 0;
    enhanced->len = k;
    rest->ptr = text.ptr + (k < text.len ? k + 1 : k);
    rest->len = k < text.len ? text.len - k - 1 : 0;
    return 1;
}

const char *smtpe__reply_error_text(int rp)
{
    switch (rp) {
    case SMTPE__RP_MORE:
    case SMTPE__RP_LINE:
    case SMTPE__RP_DONE:
        return "no error";
    case SMTPE__RP_SYNTAX:
        return "malformed reply line (a code not 2-5, 0-5, 0-9, not followed by SP, '-' or "
               "CRLF, or a NUL)";
    case SMTPE__RP_MISMATCH:
        return "reply lines with different codes";
    case SMTPE__RP_LONG_LINE:
        return "reply line too long";
    case SMTPE__RP_TOO_BIG:
        return "reply too long";
    case SMTPE__RP_BARE:
        return "bare CR or bare LF in a reply";
    default:
        return "unknown reply parser result";
    }
}
