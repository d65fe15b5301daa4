/*
 * fuzz_reply.c - libFuzzer target for reply formatting (engine/reply.c, RFC 5321 §4.2,
 * RFC 2034, RFC 3463).
 *
 * Input: [0..1] reply code (little-endian, % 700), [2] enhanced status code choice (none, a
 * fixed one, or taken from the input up to the first NUL), [3..4] output capacity, then the
 * text (up to 2100 octets; with [2] choosing "from input", the enhanced code comes first and
 * ends at a NUL).
 *
 * Oracles:
 *   - smtpe__enhanced_valid agrees with a reference of RFC 3463 §2 (class 2/4/5 equal to the
 *     code's first digit, subject and detail 1..3 digits);
 *   - a text smtpe__reply_text_check accepts has no control octet but HT and '\n', lines of at most
 *     400 octets and at most 2048 octets in all;
 *   - smtpe__reply_format never writes past cap (ASan) and returns 0..cap; for a valid code,
 *     enhanced code and text its output is one line per text line, each "ddd-" but the last
 *     "ddd ", each ending in CRLF, at most 512 octets, carrying the enhanced code and the text
 *     line verbatim.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "reply.h"

static int ref_enhanced(const char *s, unsigned code)
{
    if (!((s[0] == '2' || s[0] == '4' || s[0] == '5') && (unsigned)(s[0] - '0') == code / 100))
        return 0;
    if (s[1] != '.')
        return 0;
    size_t i = 2;
    for (int part = 0; part < 2; part++) {
        size_t d = 0;
        while (s[i] >= '0' && s[i] <= '9') {
            i++;
            d++;
        }
        if (d < 1 || d > 3)
            return 0;
        if (part == 0) {
            if (s[i] != '.')
                return 0;
            i++;
        }
    }
    return s[i] == '\0';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *fixed[] = {"2.0.0", "4.7.1", "5.1.1", "5.123.456", "2.1.5"};
    if (size < 5)
        return 0;
    unsigned code = ((unsigned)data[0] | (unsigned)data[1] << 8) % 700;
    unsigned ech = data[2];
    size_t cap = (size_t)data[3] | (size_t)(data[4] & 0x3f) << 8; /* 0..16383 */
    const uint8_t *p = data + 5;
    size_t n = size - 5;

    char enh_buf[32];
    const char *enh = NULL;
    if (ech % 4 == 1) {
        enh = fixed[(ech / 4) % 5];
    } else if (ech % 4 == 2) {
        size_t i = 0;
        while (i < n && i < sizeof enh_buf - 1 && p[i] != 0) {
            enh_buf[i] = (char)p[i];
            i++;
        }
        enh_buf[i] = 0;
        enh = enh_buf;
        p += i < n ? i + 1 : i;
        n -= i < n ? i + 1 : i;
    }
    if (n > 2100)
        n = 2100;
    /* the text, NUL-terminated, in exactly n + 1 octets */
    char *text = malloc(n + 1);
    if (!text)
        abort();
    memcpy(text, p, n);
    text[n] = 0;
    size_t tlen = strlen(text);

    int ev = enh ? smtpe__enhanced_valid(enh, code) : 1;
    if (enh)
        FUZZ_CHECK(ev == ref_enhanced(enh, code), "enhanced_valid disagrees with RFC 3463");
    int tv = smtpe__reply_text_check(text, tlen) == 0;
    if (tv) {
        size_t line = 0;
        for (size_t i = 0; i < tlen; i++) {
            unsigned char ch = (unsigned char)text[i];
            FUZZ_CHECK((ch >= 0x20 && ch != 0x7f) || ch == '\n' || ch == '\t',
                       "a control octet in valid text");
            line = ch == '\n' ? 0 : line + 1;
            FUZZ_CHECK(line <= SMTPE__REPLY_TEXT_MAX, "valid text with a line over 400 octets");
        }
        FUZZ_CHECK(tlen <= SMTPE__REPLY_TOTAL_MAX, "valid text over 2048 octets");
    }

    uint8_t *out = malloc(cap ? cap : 1);
    if (!out)
        abort();
    size_t w = smtpe__reply_format(out, cap, code, enh, text, tlen);
    FUZZ_CHECK(w <= cap, "reply_format wrote more than cap");
    if (w > 0 && tv && ev && code >= 200 && code <= 599) {
        char cc[4];
        snprintf(cc, sizeof cc, "%03u", code);
        size_t o = 0, t = 0;
        for (;;) {
            size_t te = t;
            while (te < tlen && text[te] != '\n')
                te++;
            int last = te == tlen;
            size_t j = o;
            while (j + 1 < w && !(out[j] == '\r' && out[j + 1] == '\n'))
                j++;
            FUZZ_CHECK(j + 1 < w, "reply line without CRLF");
            FUZZ_CHECK(j + 2 - o <= SMTPE__REPLY_LINE_MAX, "reply line over 512 octets");
            FUZZ_CHECK(j - o >= 4 && memcmp(out + o, cc, 3) == 0, "reply line without its code");
            FUZZ_CHECK(out[o + 3] == (last ? ' ' : '-'), "wrong separator after the code");
            size_t x = o + 4;
            if (enh) {
                size_t el = strlen(enh);
                /* "code enhanced text", or "code enhanced" for an empty text line */
                FUZZ_CHECK(j - x >= el && memcmp(out + x, enh, el) == 0, "no enhanced status code");
                x += el;
                if (te > t) {
                    FUZZ_CHECK(x < j && out[x] == ' ', "no SP after the enhanced status code");
                    x++;
                }
            }
            FUZZ_CHECK(j - x == te - t && memcmp(out + x, text + t, te - t) == 0,
                       "reply line text is not the text line");
            o = j + 2;
            if (last)
                break;
            t = te + 1;
        }
        FUZZ_CHECK(o == w, "octets after the last reply line");
    }
    free(out);
    free(text);
    return 0;
}
