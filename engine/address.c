/* address.c - RFC 5321 §4.1.2 Path and Mailbox parser, §4.1.3 address literals, with the
 * RFC 6531 §3.3 extensions for UTF-8 mailboxes. Results are spans into the caller's octets. */
#include "address.h"

#include "command.h"

#include <string.h>

typedef struct cursor {
    const uint8_t *p;
    size_t n, i;
    int utf8; /* a non-ASCII octet was seen */
} cursor;

static int peek(const cursor *c)
{
    return c->i < c->n ? c->p[c->i] : -1;
}

static int is_alpha(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int is_hex(int c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

size_t smtpe__utf8_seq(const uint8_t *p, size_t n)
{
    uint8_t c = p[0];
    size_t len;
    uint32_t cp, min;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, cp = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, cp = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* Consumes one UTF-8 sequence if the cursor is at a non-ASCII octet. Returns 1 if it did. */
static int take_utf8(cursor *c)
{
    size_t k;
    if (peek(c) < 0x80)
        return 0;
    k = smtpe__utf8_seq(c->p + c->i, c->n - c->i);
    if (!k)
        return 0;
    c->i += k;
    c->utf8 = 1;
    return 1;
}

/* The classes of the ASCII octets: atext of RFC 5322 §3.2.3 (ALPHA, DIGIT and
 * "!#$%&'*+-/=?^_`{|}~") and Let-dig of RFC 5321 §4.1.2 (ALPHA, DIGIT). Read-only. */
#define C_ATEXT 1u
#define C_LETDIG 2u
static const uint8_t ascii_class[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* controls */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 0, 1, /* SP ! " # $ % & ' ( ) * + , - . / */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 1, 0, 1, /* 0-9 : ; < = > ? */
    0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, /* @ A-O */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 1, 1, /* P-Z [ \ ] ^ _ */
    1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, /* ` a-o */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 0, /* p-z { | } ~ DEL */
};

/* The end of the run of p[i..n) whose octets are ASCII of class cls. */
static size_t class_run(const uint8_t *p, size_t i, size_t n, unsigned cls)
{
    while (i < n && p[i] < 0x80 && (ascii_class[p[i]] & cls))
        i++;
    return i;
}

/* Dot-string = Atom *("." Atom) */
static int dot_string(cursor *c)
{
    for (;;) {
        size_t start = c->i;
        for (;;) {
            c->i = class_run(c->p, c->i, c->n, C_ATEXT);
            if (!take_utf8(c))
                break;
        }
        if (c->i == start)
            return 0;
        if (peek(c) != '.')
            return 1;
        c->i++;
    }
}

/* Quoted-string = DQUOTE *QcontentSMTP DQUOTE */
static int quoted_string(cursor *c)
{
    c->i++; /* DQUOTE */
    for (;;) {
        int ch = peek(c);
        if (ch == '"') {
            c->i++;
            return 1;
        }
        if (ch == '\\') {
            c->i++;
            ch = peek(c);
            if (ch < 32 || ch > 126)
                return 0;
            c->i++;
        } else if (ch >= 32 && ch <= 126) {
            c->i++;
        } else if (!take_utf8(c)) {
            return 0;
        }
    }
}

/* sub-domain = Let-dig [Ldh-str]; U-labels (RFC 6531) as UTF-8. */
static int sub_domain(cursor *c)
{
    size_t start = c->i;
    int last = 0, ulabel = 0;
    for (;;) {
        int ch;
        size_t e = class_run(c->p, c->i, c->n, C_LETDIG);
        if (e > c->i) {
            c->i = e;
            last = 'a';
        }
        ch = peek(c);
        if (ch == '-' && c->i > start) {
            c->i++;
            last = ch;
        } else if (take_utf8(c)) {
            last = 0x80;
            ulabel = 1;
        } else {
            break;
        }
    }
    /* RFC 1035 §2.3.4: 63 octets a label (a U-label's limit is its A-label's, not checked) */
    return c->i > start && last != '-' && (ulabel || c->i - start <= 63);
}

/* Domain = sub-domain *("." sub-domain) */
static int domain(cursor *c)
{
    for (;;) {
        if (!sub_domain(c))
            return 0;
        if (peek(c) != '.')
            return 1;
        c->i++;
    }
}

int smtpe__is_ipv4(const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        unsigned v = 0, digits = 0;
        if (part > 0) {
            if (i >= n || p[i] != '.')
                return 0;
            i++;
        }
        while (i < n && is_digit(p[i]) && digits < 3)
            v = v * 10 + (p[i++] - '0'), digits++;
        if (digits == 0 || v > 255)
            return 0;
    }
    return i == n;
}

/* IPv6-addr = IPv6-full / IPv6-comp / IPv6v4-full / IPv6v4-comp (RFC 5321 §4.1.3). */
int smtpe__is_ipv6(const uint8_t *p, size_t n)
{
    size_t i = 0;
    int groups = 0, compressed = 0;
    if (n >= 2 && p[0] == ':' && p[1] == ':') {
        compressed = 1;
        i = 2;
        if (i == n)
            return 1;
    } else if (n >= 1 && p[0] == ':') {
        return 0;
    }
    for (;;) {
        size_t start = i;
        while (i < n && is_hex(p[i]) && i - start < 4)
            i++;
        if (i < n && (p[i] == '.' || is_hex(p[i]))) {
            /* a trailing IPv4 address takes the room of two groups */
            if (!smtpe__is_ipv4(p + start, n - start))
                return 0;
            groups += 2;
            return compressed ? groups <= 6 : groups == 8;
        }
        if (i == start)
            return 0;
        groups++;
        if (i == n)
            return compressed ? groups <= 6 : groups == 8;
        if (p[i] != ':')
            return 0;
        i++;
        if (i < n && p[i] == ':') {
            if (compressed)
                return 0;
            compressed = 1;
            i++;
            if (i == n)
                return groups <= 6;
        } else if (i == n) {
            return 0;
        }
    }
}

/* address-literal = "[" ( IPv4-address-literal / IPv6-address-literal /
 *                         General-address-literal ) "]" */
static int address_literal(cursor *c)
{
    const uint8_t *s;
    size_t len, tag;
    const uint8_t *close = memchr(c->p + c->i, ']', c->n - c->i);
    if (!close)
        return 0;
    s = c->p + c->i + 1;
    len = (size_t)(close - s);
    c->i = (size_t)(close - c->p) + 1;
    if (len > 0 && is_digit(s[0]))
        return smtpe__is_ipv4(s, len);
    if (smtpe__has_prefix_ci(s, len, "IPv6:"))
        return smtpe__is_ipv6(s + 5, len - 5);
    /* General-address-literal = Standardized-tag ":" 1*dcontent */
    for (tag = 0; tag < len && (is_alpha(s[tag]) || is_digit(s[tag]) || s[tag] == '-'); tag++)
        ;
    if (tag == 0 || s[tag - 1] == '-' || s[0] == '-' || tag + 1 >= len || s[tag] != ':')
        return 0;
    for (size_t i = tag + 1; i < len; i++)
        if (s[i] < 33 || s[i] > 126 || (s[i] >= 91 && s[i] <= 93))
            return 0;
    return 1;
}

/* A-d-l = At-domain *( "," At-domain ) ":" ; At-domain = "@" Domain */
static int source_route(cursor *c)
{
    for (;;) {
        c->i++; /* "@" */
        if (!domain(c))
            return 0;
        if (peek(c) == ':') {
            c->i++;
            return 1;
        }
        if (peek(c) != ',')
            return 0;
        c->i++;
        if (peek(c) != '@')
            return 0;
    }
}

/* Mailbox = Local-part "@" ( Domain / address-literal ), or postmaster alone. */
static int mailbox(cursor *c, unsigned opts, smtpe_path *out)
{
    size_t lp = c->i;
    if (peek(c) == '"') {
        if (!quoted_string(c))
            return SMTPE__PATH_SYNTAX;
        out->flags |= SMTPE_PATH_QUOTED;
    } else if (!dot_string(c)) {
        return SMTPE__PATH_SYNTAX;
    }
    out->local_part = (smtpe_span){c->p + lp, c->i - lp};
    if ((opts & SMTPE__PATH_ALLOW_POSTMASTER) && !(out->flags & SMTPE_PATH_QUOTED) &&
        out->local_part.len == 10 && smtpe__has_prefix_ci(c->p + lp, 10, "postmaster") &&
        peek(c) != '@') {
        out->flags |= SMTPE_PATH_POSTMASTER;
        out->mailbox = out->local_part;
        return SMTPE__PATH_OK;
    }
    if (peek(c) != '@')
        return SMTPE__PATH_SYNTAX;
    c->i++;
    size_t d = c->i;
    if (peek(c) == '[') {
        if (!address_literal(c))
            return SMTPE__PATH_SYNTAX;
        out->flags |= SMTPE_PATH_ADDR_LITERAL;
    } else if (!domain(c)) {
        return SMTPE__PATH_SYNTAX;
    }
    out->domain = (smtpe_span){c->p + d, c->i - d};
    out->mailbox = (smtpe_span){c->p + lp, c->i - lp};
    if (out->local_part.len > SMTPE__MAX_LOCAL_PART || out->domain.len > SMTPE__MAX_DOMAIN)
        return SMTPE__PATH_TOO_LONG;
    return SMTPE__PATH_OK;
}

static int lax_mailbox(cursor *c, unsigned opts, smtpe_path *out, size_t *used)
{
    int r = mailbox(c, opts, out);
    if (r == SMTPE__PATH_OK && peek(c) != -1 && peek(c) != ' ')
        r = SMTPE__PATH_SYNTAX;
    if (r == SMTPE__PATH_OK && c->i > SMTPE__MAX_PATH - 2)
        r = SMTPE__PATH_TOO_LONG;
    if (c->utf8)
        out->flags |= SMTPE_PATH_UTF8;
    *used = c->i;
    return r;
}

int smtpe__parse_path(const uint8_t *p, size_t n, unsigned opts, smtpe_path *out, size_t *used)
{
    cursor c = {p, n, 0, 0};
    int r;
    memset(out, 0, sizeof *out);
    out->mailbox.ptr = out->local_part.ptr = out->domain.ptr = p;
    *used = 0;
    if (peek(&c) != '<') {
        if ((opts & SMTPE__PATH_LAX_BRACKETS) && peek(&c) > ' ')
            return lax_mailbox(&c, opts, out, used);
        return SMTPE__PATH_NO_BRACKETS;
    }
    c.i++;
    if (peek(&c) == '>') {
        if (!(opts & SMTPE__PATH_ALLOW_NULL))
            return SMTPE__PATH_SYNTAX;
        out->flags |= SMTPE_PATH_NULL;
        *used = 2;
        return SMTPE__PATH_OK;
    }
    if (peek(&c) == '@') {
        if (!source_route(&c))
            return SMTPE__PATH_SYNTAX;
        out->flags |= SMTPE_PATH_SOURCE_ROUTE;
    }
    r = mailbox(&c, opts, out);
    if (r == SMTPE__PATH_SYNTAX)
        return r;
    if (peek(&c) != '>')
        return SMTPE__PATH_SYNTAX;
    c.i++;
    if (r == SMTPE__PATH_OK && c.i > SMTPE__MAX_PATH)
        r = SMTPE__PATH_TOO_LONG;
    if (c.utf8)
        out->flags |= SMTPE_PATH_UTF8;
    *used = c.i;
    return r;
}

/* This file's macros end here (the amalgamated smtpe.c puts the sources in one file). */
#undef C_ATEXT
#undef C_LETDIG
