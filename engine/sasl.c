/* sasl.c - base64 (RFC 4648 §4, strict: RFC 4648 §3.3 no foreign characters, §3.5 canonical
 * padding) as AUTH uses it (RFC 4954 §4), and the SASL PLAIN message (RFC 4616 §2). */
#include "sasl.h"

#include <string.h>

/* RFC 4648 §4 Table 1. */
static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The 6-bit value of each octet of the alphabet; BAD for everything else, '=' included. */
#define BAD 0xff
#define R4(a) a, a, a, a
#define R16(a) R4(a), R4(a), R4(a), R4(a)
static const uint8_t value[256] = {
    R16(BAD), R16(BAD),                                                  /* 0x00-0x1f */
    R4(BAD), R4(BAD), BAD, BAD, BAD, 62, BAD, BAD, BAD, 63,              /* '+' '/' */
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, BAD, BAD, BAD, BAD, BAD, BAD, /* '0'-'9' */
    BAD, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,               /* 'A'-'O' */
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, BAD, BAD, BAD, BAD, BAD, /* 'P'-'Z' */
    BAD, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,     /* 'a'-'o' */
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, BAD, BAD, BAD, BAD, BAD, /* 'p'-'z' */
    R16(BAD), R16(BAD), R16(BAD), R16(BAD),                              /* 0x80-0xff */
    R16(BAD), R16(BAD), R16(BAD), R16(BAD),
};

/* Checks the base64 text p[0..n) (n a multiple of 4, n > 0) without writing anything. Returns
 * the number of '=' at its end (0, 1 or 2), or -1 if it is not canonical base64. */
static int check_text(const uint8_t *p, size_t n)
{
    int pad = 0;
    if (p[n - 1] == '=')
        pad = p[n - 2] == '=' ? 2 : 1;
    for (size_t i = 0; i < n - (size_t)pad; i++)
        if (value[p[i]] == BAD)
            return -1; /* a foreign octet, or '=' before the last one or two (§3.3) */
    /* §3.5: the bits under the padding are zero. xx== carries 8 bits, xxx= carries 16. */
    if (pad == 2 && (value[p[n - 3]] & 0x0f) != 0)
        return -1;
    if (pad == 1 && (value[p[n - 2]] & 0x03) != 0)
        return -1;
    return pad;
}

/* The whole text is checked before anything is written: on failure out is untouched. */
size_t smtpe__base64_decode(const uint8_t *p, size_t n, uint8_t *out)
{
    if (n == 0)
        return 0;
    if (n % 4 != 0)
        return SMTPE__BASE64_BAD;
    int pad = check_text(p, n);
    if (pad < 0)
        return SMTPE__BASE64_BAD;

    /* Quantum k reads p[4k..4k+4) into v before it writes out[3k..3k+3), and 3k+3 <= 4k+4, so
     * out == p never overwrites an octet that is still to be read. */
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = (uint32_t)value[p[i]] << 18 | (uint32_t)value[p[i + 1]] << 12;
        int last = i + 4 == n;
        if (last && pad == 2) {
            out[o++] = (uint8_t)(v >> 16);
            break;
        }
        v |= (uint32_t)value[p[i + 2]] << 6;
        if (last && pad == 1) {
            out[o++] = (uint8_t)(v >> 16);
            out[o++] = (uint8_t)(v >> 8);
            break;
        }
        v |= value[p[i + 3]];
        out[o++] = (uint8_t)(v >> 16);
        out[o++] = (uint8_t)(v >> 8);
        out[o++] = (uint8_t)v;
    }
    return o;
}

size_t smtpe__base64_encode(const uint8_t *p, size_t n, uint8_t *out)
{
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = (uint8_t)alphabet[v >> 18];
        out[o++] = (uint8_t)alphabet[(v >> 12) & 63];
        out[o++] = (uint8_t)alphabet[(v >> 6) & 63];
        out[o++] = (uint8_t)alphabet[v & 63];
    }
    if (n - i == 1) { /* §4 case (2): two characters and "==" */
        uint32_t v = (uint32_t)p[i] << 16;
        out[o++] = (uint8_t)alphabet[v >> 18];
        out[o++] = (uint8_t)alphabet[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) { /* §4 case (3): three characters and "=" */
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        out[o++] = (uint8_t)alphabet[v >> 18];
        out[o++] = (uint8_t)alphabet[(v >> 12) & 63];
        out[o++] = (uint8_t)alphabet[(v >> 6) & 63];
        out[o++] = '=';
    }
    return o;
}

/* RFC 4616 §2: authzid, authcid and passwd are at most this long here (the RFC requires
 * servers to accept at least 255 octets for each). */
#define PLAIN_PART_MAX 255

int smtpe__sasl_plain(const uint8_t *p, size_t n, smtpe_span *authzid, smtpe_span *authcid,
                      smtpe_span *password)
{
    /* message = [authzid] UTF8NUL authcid UTF8NUL passwd: exactly two NULs. */
    const uint8_t *nul1 = n ? memchr(p, 0, n) : NULL;
    if (!nul1)
        return -1;
    size_t a = (size_t)(nul1 - p); /* authzid is p[0..a) */
    const uint8_t *nul2 = memchr(nul1 + 1, 0, n - a - 1);
    if (!nul2)
        return -1;
    size_t c = (size_t)(nul2 - p); /* authcid is p[a+1..c), passwd p[c+1..n) */
    if (memchr(nul2 + 1, 0, n - c - 1) != NULL)
        return -1; /* a NUL inside passwd */
    size_t zlen = a, clen = c - a - 1, plen = n - c - 1;
    if (clen == 0 || plen == 0)
        return -1; /* authcid = 1*SAFE, passwd = 1*SAFE */
    if (zlen > PLAIN_PART_MAX || clen > PLAIN_PART_MAX || plen > PLAIN_PART_MAX)
        return -1;
    authzid->ptr = p;
    authzid->len = zlen;
    authcid->ptr = p + a + 1;
    authcid->len = clen;
    password->ptr = p + c + 1;
    password->len = plen;
    return 0;
}
