/* command.c - command-line framing, verbs, ESMTP parameters and xtext in both directions.
 * RFC 5321 §2.3.8 (lines end in CRLF), §4.1.1 (verbs), §4.1.2 (esmtp-param); RFC 3461 §4
 * (xtext). */
#include "command.h"

#include <string.h>

void smtpe__line_reset(smtpe__line *l)
{
    l->len = 0;
    l->flags = 0;
}

static void line_append(smtpe__line *l, uint8_t c)
{
    if (l->len < l->cap)
        l->buf[l->len++] = c;
    else
        l->flags |= SMTPE__LINE_TOO_LONG;
}

/* A bare CR, bare LF or NUL under the session's policy. Returns 1 if it ends the line. */
static int line_oddity(smtpe__line *l, uint8_t c, smtpe_line_ending_policy policy)
{
    switch (policy) {
    case SMTPE_LINE_ENDING_NORMALISE:
        return c != 0; /* bare CR/LF end the line; NUL is dropped */
    case SMTPE_LINE_ENDING_KEEP:
        line_append(l, c);
        return 0;
    default:
        l->flags |= SMTPE__LINE_BARE;
        return 0;
    }
}

size_t smtpe__line_feed(smtpe__line *l, const uint8_t *p, size_t n,
                        smtpe_line_ending_policy policy)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (l->flags & SMTPE__LINE_CR) {
            l->flags &= ~SMTPE__LINE_CR;
            if (c == '\n') {
                l->flags |= SMTPE__LINE_DONE;
                return i + 1;
            }
            if (line_oddity(l, '\r', policy)) {
                l->flags |= SMTPE__LINE_DONE | SMTPE__LINE_BARE_END;
                return i; /* c starts the next line */
            }
            continue; /* c is looked at again, without the CR */
        }
        i++;
        if (c == '\r') {
            l->flags |= SMTPE__LINE_CR;
        } else if (c == '\n' || c == 0) {
            if (line_oddity(l, c, policy)) {
                l->flags |= SMTPE__LINE_DONE | SMTPE__LINE_BARE_END;
                return i;
            }
        } else if (l->len < l->cap) {
            /* Fast path: copy the run of ordinary octets at once. */
            size_t run = 1;
            while (i - 1 + run < n && run < l->cap - l->len) {
                uint8_t d = p[i - 1 + run];
                if (d == '\r' || d == '\n' || d == 0)
                    break;
                run++;
            }
            memcpy(l->buf + l->len, p + i - 1, run);
            l->len += run;
            i += run - 1;
        } else {
            l->flags |= SMTPE__LINE_TOO_LONG;
        }
    }
    return i;
}

static uint8_t lower(uint8_t c)
{
    return (c >= 'A' && c <= 'Z') ? (uint8_t)(c + 32) : c;
}

int smtpe__same_ci(const uint8_t *a, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t x = a[i], y = b[i];
        /* equal octets need no folding; others match only as the two cases of a letter */
        if (x != y && ((x ^ y) != 0x20 || lower(x) != lower(y)))
            return 0;
    }
    return 1;
}

int smtpe__has_prefix_ci(const uint8_t *p, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    return n >= k && smtpe__same_ci(p, (const uint8_t *)prefix, k);
}

static const struct {
    const char *name;
    smtpe__verb verb;
} verbs[] = {
    {"HELO", SMTPE__VERB_HELO}, {"EHLO", SMTPE__VERB_EHLO}, {"MAIL", SMTPE__VERB_MAIL},
    {"RCPT", SMTPE__VERB_RCPT}, {"DATA", SMTPE__VERB_DATA}, {"RSET", SMTPE__VERB_RSET},
    {"NOOP", SMTPE__VERB_NOOP}, {"QUIT", SMTPE__VERB_QUIT}, {"VRFY", SMTPE__VERB_VRFY},
    {"EXPN", SMTPE__VERB_EXPN}, {"HELP", SMTPE__VERB_HELP},
    {"STARTTLS", SMTPE__VERB_STARTTLS}, {"AUTH", SMTPE__VERB_AUTH},
    {"BDAT", SMTPE__VERB_BDAT}, {"LHLO", SMTPE__VERB_LHLO},
    {"XCLIENT", SMTPE__VERB_XCLIENT}, {"XFORWARD", SMTPE__VERB_XFORWARD},
};

smtpe__verb smtpe__command_split(const uint8_t *line, size_t n, smtpe_span *verb,
                                 smtpe_span *argument)
{
    size_t v = 0, a;
    while (v < n && line[v] != ' ')
        v++;
    a = v;
    while (a < n && line[a] == ' ')
        a++;
    verb->ptr = line;
    verb->len = v;
    argument->ptr = line + a;
    argument->len = n - a;
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (strlen(verbs[i].name) == v && smtpe__has_prefix_ci(line, v, verbs[i].name))
            return verbs[i].verb;
    return SMTPE__VERB_UNKNOWN;
}

static int is_alnum(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

/* esmtp-value = 1*(%d33-60 / %d62-126), plus UTF-8 octets (RFC 6531 §3.3). */
static int is_value_octet(uint8_t c)
{
    return (c >= 33 && c <= 126 && c != '=') || c >= 0x80;
}

int smtpe__parse_params(const uint8_t *p, size_t n, smtpe_param *out, size_t max, size_t *count)
{
    size_t i = 0;
    *count = 0;
    for (;;) {
        size_t k, v;
        while (i < n && p[i] == ' ')
            i++;
        if (i == n)
            return SMTPE__PARAMS_OK;
        k = i;
        if (!is_alnum(p[i]))
            return SMTPE__PARAMS_SYNTAX;
        while (i < n && (is_alnum(p[i]) || p[i] == '-'))
            i++;
        v = i;
        if (i < n && p[i] == '=') {
            v = ++i;
            while (i < n && is_value_octet(p[i]))
                i++;
            if (i == v)
                return SMTPE__PARAMS_SYNTAX;
        }
        if (i < n && p[i] != ' ')
            return SMTPE__PARAMS_SYNTAX;
        if (*count == max)
            return SMTPE__PARAMS_TOO_MANY;
        out[*count].keyword = (smtpe_span){p + k, (v > k && p[v - 1] == '=') ? v - 1 - k : v - k};
        out[*count].value = (smtpe_span){p + v, i - v};
        (*count)++;
    }
}

int smtpe__parse_u64(smtpe_span s, uint64_t *v)
{
    uint64_t r = 0;
    if (s.len == 0 || s.len > 20)
        return -1;
    for (size_t i = 0; i < s.len; i++) {
        uint8_t c = s.ptr[i];
        if (c < '0' || c > '9' || r > (UINT64_MAX - (c - '0')) / 10)
            return -1;
        r = r * 10 + (c - '0');
    }
    *v = r;
    return 0;
}

int smtpe__hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int smtpe__xtext_decode(uint8_t *p, size_t n, size_t *out_len)
{
    size_t o = 0;
    int control = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (c == '+') {
            int hi, lo;
            if (n - i < 3)
                return SMTPE__XTEXT_SYNTAX;
            hi = smtpe__hex_digit(p[i + 1]);
            lo = smtpe__hex_digit(p[i + 2]);
            if (hi < 0 || lo < 0)
                return SMTPE__XTEXT_SYNTAX;
            c = (uint8_t)(hi << 4 | lo);
            i += 2;
            if (c < 0x20 || c == 0x7f)
                control = 1;
        } else if (c == '=' || c < 33 || c == 0x7f) {
            return SMTPE__XTEXT_SYNTAX;
        }
        p[o++] = c;
    }
    *out_len = o;
    return control ? SMTPE__XTEXT_CONTROL : SMTPE__XTEXT_OK;
}

/* xchar (RFC 3461 §4): "!".."~" but "+" and "=", which stand for themselves. */
static int is_xchar(uint8_t c)
{
    return c >= '!' && c <= '~' && c != '+' && c != '=';
}

/* On SIZE_MAX, out[0..cap) holds the part that fitted (whole xchars and "+HH" triples). */
size_t smtpe__xtext_encode(const uint8_t *p, size_t n, uint8_t *out, size_t cap)
{
    static const char hex[16] = "0123456789ABCDEF";
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        size_t k = is_xchar(c) ? 1 : 3;
        if (o > SIZE_MAX - 1 - k)
            return SIZE_MAX; /* the length itself would not fit in a size_t */
        if (out != NULL) {
            if (k > cap - o) /* o <= cap holds: every octet written so far fitted */
                return SIZE_MAX;
            if (k == 1) {
                out[o] = c;
            } else {
                out[o] = '+';
                out[o + 1] = (uint8_t)hex[c >> 4];
                out[o + 2] = (uint8_t)hex[c & 0x0f];
            }
        }
        o += k;
    }
    return o;
}
