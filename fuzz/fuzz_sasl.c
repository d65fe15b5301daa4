/*
 * fuzz_sasl.c - libFuzzer target for engine/sasl.c: base64 (RFC 4648 §4) and the SASL PLAIN
 * message (RFC 4616 §2).
 *
 * The whole input is used three ways: as octets to encode, as base64 text to decode, and as a
 * PLAIN message (raw, and again after a successful decode).
 *
 * Oracles (abort on violation):
 *   - encode gives SMTPE__BASE64_LEN(n) octets of the alphabet with canonical padding, and
 *     decode(encode(x)) == x, out of place and in place;
 *   - decode of arbitrary text agrees with a reference validator (whole quanta, alphabet, '='
 *     only as the last one or two, zero bits under the padding), and when it succeeds the
 *     result re-encodes to exactly the text (so only canonical base64 is accepted);
 *   - decoding in place gives the same result and octets as decoding out of place, and a
 *     failed decode writes nothing;
 *   - PLAIN agrees with a reference (exactly two NULs, authcid and passwd non-empty, each part
 *     at most 255 octets); on success the spans lie within the input, in order, and
 *     authzid NUL authcid NUL passwd re-joins to exactly the input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sasl.h"

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The 6-bit value of c, or -1: by search, unlike the engine's table. */
static int ref_value(uint8_t c)
{
    if (c == 0)
        return -1;
    const char *at = strchr(b64_alphabet, c);
    return at ? (int)(at - b64_alphabet) : -1;
}

/* RFC 4648 §4 with §3.3 and §3.5: 1 if p[0..n) is canonical padded base64. */
static int ref_valid(const uint8_t *p, size_t n)
{
    if (n % 4 != 0)
        return 0;
    size_t pad = 0;
    while (pad < n && pad < 3 && p[n - 1 - pad] == '=')
        pad++;
    if (pad > 2)
        return 0;
    for (size_t i = 0; i < n - pad; i++)
        if (ref_value(p[i]) < 0)
            return 0;
    if (pad == 2 && (ref_value(p[n - 3]) % 16) != 0)
        return 0;
    if (pad == 1 && (ref_value(p[n - 2]) % 4) != 0)
        return 0;
    return 1;
}

static void check_encode(const uint8_t *data, size_t size)
{
    size_t tlen = SMTPE__BASE64_LEN(size);
    uint8_t *text = malloc(tlen + 1), *back = malloc(size + 1);
    if (!text || !back)
        abort();
    size_t r = smtpe__base64_encode(data, size, text);
    FUZZ_CHECK(r == tlen, "encode: not SMTPE__BASE64_LEN(n) octets");
    FUZZ_CHECK(ref_valid(text, tlen), "encode: the text is not canonical base64");
    size_t d = smtpe__base64_decode(text, tlen, back);
    FUZZ_CHECK(d == size && fz_eq(back, d, data, size), "decode(encode(x)) != x");
    d = smtpe__base64_decode(text, tlen, text);
    FUZZ_CHECK(d == size && fz_eq(text, d, data, size), "in-place decode(encode(x)) != x");
    free(text);
    free(back);
}

/* Checks the PLAIN split of p[0..n) against the reference and the re-join. */
static void check_plain(const uint8_t *p, size_t n)
{
    smtpe_span z, c, w;
    int r = smtpe__sasl_plain(p, n, &z, &c, &w);
    FUZZ_CHECK(r == 0 || r == -1, "sasl_plain: neither 0 nor -1");

    size_t nuls = 0, at[2] = {0, 0};
    for (size_t i = 0; i < n; i++)
        if (p[i] == 0 && nuls++ < 2)
            at[nuls - 1] = i;
    int want = nuls == 2 && at[0] <= 255 && at[1] - at[0] - 1 >= 1 &&
               at[1] - at[0] - 1 <= 255 && n - at[1] - 1 >= 1 && n - at[1] - 1 <= 255;
    FUZZ_CHECK(r == (want ? 0 : -1), "sasl_plain disagrees with the RFC 4616 reference");
    if (r != 0)
        return;
    FUZZ_CHECK(fz_within(z, p, n) && fz_within(c, p, n) && fz_within(w, p, n),
               "sasl_plain: a span outside the message");
    FUZZ_CHECK(c.len > 0 && w.len > 0, "sasl_plain: empty authcid or passwd");
    FUZZ_CHECK(z.len + 1 + c.len + 1 + w.len == n, "sasl_plain: parts do not add up");
    FUZZ_CHECK(z.len == 0 || z.ptr == p, "sasl_plain: authzid not at the start");
    FUZZ_CHECK(c.ptr == p + z.len + 1 && w.ptr == p + z.len + 1 + c.len + 1,
               "sasl_plain: spans not where the NULs put them");
    FUZZ_CHECK(p[z.len] == 0 && p[z.len + 1 + c.len] == 0, "sasl_plain: no NUL between parts");
    fz_buf j = {0};
    fz_put(&j, z.ptr, z.len);
    fz_put_u8(&j, 0);
    fz_put(&j, c.ptr, c.len);
    fz_put_u8(&j, 0);
    fz_put(&j, w.ptr, w.len);
    FUZZ_CHECK(fz_eq(j.p, j.len, p, n), "sasl_plain: the parts do not re-join to the message");
    FUZZ_CHECK(!memchr(z.ptr ? z.ptr : p, 0, z.len) && !memchr(c.ptr, 0, c.len) &&
                   !memchr(w.ptr, 0, w.len),
               "sasl_plain: a NUL inside a part");
    fz_free(&j);
}

static void check_decode(const uint8_t *data, size_t size)
{
    uint8_t *out = malloc(size + 1), *inplace = malloc(size + 1);
    if (!out || !inplace)
        abort();
    size_t d = smtpe__base64_decode(data, size, out);
    int valid = ref_valid(data, size);
    FUZZ_CHECK((d != SMTPE__BASE64_BAD) == valid, "decode disagrees with the reference");
    if (size)
        memcpy(inplace, data, size);
    size_t d2 = smtpe__base64_decode(inplace, size, inplace);
    FUZZ_CHECK(d2 == d, "in-place decode gives another result");
    if (d == SMTPE__BASE64_BAD) {
        FUZZ_CHECK(fz_eq(inplace, size, data, size), "a failed in-place decode wrote octets");
        free(out);
        free(inplace);
        return;
    }
    FUZZ_CHECK(d <= size / 4 * 3 && d + 2 >= size / 4 * 3, "decode: wrong length");
    FUZZ_CHECK(fz_eq(out, d, inplace, d2), "in-place decode gives other octets");
    uint8_t *text = malloc(SMTPE__BASE64_LEN(d) + 1);
    if (!text)
        abort();
    size_t t = smtpe__base64_encode(out, d, text);
    FUZZ_CHECK(fz_eq(text, t, data, size), "decoded text does not re-encode to itself");
    check_plain(out, d);
    free(text);
    free(out);
    free(inplace);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_encode(data, size);
    check_decode(data, size);
    check_plain(data, size);
    return 0;
}
