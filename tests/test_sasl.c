/*
 * test_sasl.c - unit tests of engine/sasl.c: base64 decoding and encoding (RFC 4648 §4, the
 * §10 test vectors, §3.3 foreign characters, §3.5 canonical padding) and the SASL PLAIN message
 * (RFC 4616 §2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sasl.h"

#define BAD SMTPE__BASE64_BAD

/* RFC 4648 §10. */
static const struct {
    const char *plain, *b64;
} rfc4648_vectors[] = {
    {"", ""},
    {"f", "Zg=="},
    {"fo", "Zm8="},
    {"foo", "Zm9v"},
    {"foob", "Zm9vYg=="},
    {"fooba", "Zm9vYmE="},
    {"foobar", "Zm9vYmFy"},
};
#define N_VECTORS (sizeof rfc4648_vectors / sizeof rfc4648_vectors[0])

/* Decodes the NUL-terminated text s out of place. Returns the decoded length or BAD. */
static size_t decode_str(const char *s, uint8_t *out)
{
    return smtpe__base64_decode((const uint8_t *)s, strlen(s), out);
}

static void test_decode_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_VECTORS; i++) {
        uint8_t out[16];
        size_t n = decode_str(rfc4648_vectors[i].b64, out);
        assert_int_equal(n, strlen(rfc4648_vectors[i].plain));
        assert_memory_equal(out, rfc4648_vectors[i].plain, n);
    }
}

static void test_encode_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_VECTORS; i++) {
        const char *plain = rfc4648_vectors[i].plain;
        uint8_t out[16];
        size_t n = smtpe__base64_encode((const uint8_t *)plain, strlen(plain), out);
        assert_int_equal(n, SMTPE__BASE64_LEN(strlen(plain)));
        assert_int_equal(n, strlen(rfc4648_vectors[i].b64));
        assert_memory_equal(out, rfc4648_vectors[i].b64, n);
    }
}

/* Every octet value, and the whole alphabet in both directions. */
static void test_alphabet(void **state)
{
    (void)state;
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (unsigned v = 0; v < 64; v++) {
        /* "xA==" where x has the value v: the decoded octet is v << 2 */
        char text[5] = {alphabet[v], 'A', '=', '=', 0};
        uint8_t out[4];
        assert_int_equal(decode_str(text, out), 1);
        assert_int_equal(out[0], v << 2);
    }
    for (unsigned c = 0; c < 256; c++) {
        uint8_t text[4] = {(uint8_t)c, 'A', 'A', 'A'}, out[3];
        size_t n = smtpe__base64_decode(text, 4, out);
        if (c != 0 && strchr(alphabet, (int)c) != NULL)
            assert_int_equal(n, 3);
        else
            assert_int_equal(n, BAD);
    }
    uint8_t all[256], text[SMTPE__BASE64_LEN(256)], back[256];
    for (unsigned i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    size_t tn = smtpe__base64_encode(all, 256, text);
    assert_int_equal(tn, sizeof text);
    assert_int_equal(smtpe__base64_decode(text, tn, back), 256);
    assert_memory_equal(back, all, 256);
}

static void test_decode_invalid(void **state)
{
    (void)state;
    static const char *bad[] = {
        "Z",          /* lengths that are not whole quanta */
        "Zg",
        "Zg=",
        "Zm9",
        "Zm9vY",
        "Zm9vYg=",
        "Zm9vYg===",
        "=",          /* padding in the wrong place or the wrong amount */
        "====",
        "Z===",
        "==Zg",
        "Z=g=",
        "Zg=a",
        "Zg==Zm8=",   /* padding before the end */
        "Zm8=Zm8=",
        "Zm=v",
        "Zm9v====",
        "Zm 9v",      /* foreign characters (RFC 4648 §3.3) */
        "Zm9v\r\n",
        "Zm9v\r\nZm9v",
        " Zm9v",
        "Zm9-",       /* the base64url alphabet (§5) is not base64 */
        "Zm9_",
        "Zm9v.AAA",
        "Zh==",       /* nonzero bits under the padding (§3.5) */
        "Zm9=",
        "Zm/=",
        "Zm+=",
        "Z/==",
        "ZB==",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t out[16];
        if (decode_str(bad[i], out) != BAD)
            fail_msg("\"%s\" decoded", bad[i]);
    }
    /* a NUL or octets above 127 */
    static const uint8_t nul[4] = {'Z', 'm', 0, 'v'}, high[4] = {'Z', 'm', 0xc3, 0xa9};
    uint8_t out[4];
    assert_int_equal(smtpe__base64_decode(nul, 4, out), BAD);
    assert_int_equal(smtpe__base64_decode(high, 4, out), BAD);
    /* the canonical neighbours of the nonzero-pad cases do decode */
    assert_int_equal(decode_str("Zg==", out), 1);
    assert_int_equal(decode_str("Zm8=", out), 2);
    assert_int_equal(decode_str("ZA==", out), 1);
}

/* A failed decode leaves the output untouched (the text is checked before anything is
 * written), so an in-place decode of a bad response does not scramble it. */
static void test_decode_invalid_writes_nothing(void **state)
{
    (void)state;
    uint8_t buf[] = "Zm9vYmFyZh==";
    assert_int_equal(smtpe__base64_decode(buf, 12, buf), BAD);
    assert_memory_equal(buf, "Zm9vYmFyZh==", 12);
}

static void test_decode_in_place(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_VECTORS; i++) {
        char buf[16];
        size_t len = strlen(rfc4648_vectors[i].b64);
        memcpy(buf, rfc4648_vectors[i].b64, len);
        size_t n = smtpe__base64_decode((const uint8_t *)buf, len, (uint8_t *)buf);
        assert_int_equal(n, strlen(rfc4648_vectors[i].plain));
        assert_memory_equal(buf, rfc4648_vectors[i].plain, n);
    }
    /* a longer text with every octet value */
    uint8_t all[300], text[SMTPE__BASE64_LEN(300)];
    for (size_t i = 0; i < sizeof all; i++)
        all[i] = (uint8_t)(i * 7 + 3);
    size_t tn = smtpe__base64_encode(all, sizeof all, text);
    assert_int_equal(smtpe__base64_decode(text, tn, text), sizeof all);
    assert_memory_equal(text, all, sizeof all);
}

/* encode then decode gives the octets back, for every length 0..64 and a pattern with every
 * octet value; the text is canonical and the decoder takes it back out of place and in place. */
static void test_round_trip(void **state)
{
    (void)state;
    uint8_t src[64], text[SMTPE__BASE64_LEN(64)], back[64];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(0xff - i * 37);
    for (size_t n = 0; n <= sizeof src; n++) {
        size_t tn = smtpe__base64_encode(src, n, text);
        assert_int_equal(tn, SMTPE__BASE64_LEN(n));
        assert_int_equal(tn % 4, 0);
        assert_int_equal(smtpe__base64_decode(text, tn, back), n);
        assert_memory_equal(back, src, n);
        assert_int_equal(smtpe__base64_decode(text, tn, text), n);
        assert_memory_equal(text, src, n);
    }
}

/* ---------------------------------------------------------------------------------------------
 * PLAIN
 * ------------------------------------------------------------------------------------------- */

typedef struct plain_case {
    const char *msg;
    size_t len; /* octets of msg (it holds NULs) */
    int result;
    const char *authzid, *authcid, *password; /* expected on success */
} plain_case;

#define M(s) s, sizeof(s) - 1
#define OK(s, z, c, p) {M(s), 0, z, c, p}
#define NO(s) {M(s), -1, NULL, NULL, NULL}

static void span_is(smtpe_span sp, const uint8_t *base, size_t n, const char *want)
{
    assert_int_equal(sp.len, strlen(want));
    assert_memory_equal(sp.ptr, want, sp.len);
    assert_true(sp.ptr >= base && sp.ptr + sp.len <= base + n);
}

static void test_plain(void **state)
{
    (void)state;
    static const plain_case cases[] = {
        OK("\0tim\0tanstaaftanstaaf", "", "tim", "tanstaaftanstaaf"), /* RFC 4616 §4 */
        OK("Ursel\0Kurt\0xipj3plmq", "Ursel", "Kurt", "xipj3plmq"),   /* RFC 4616 §4 */
        OK("\0u\0p", "", "u", "p"),
        OK("admin\0user\0pass word", "admin", "user", "pass word"),
        OK("\0\xc3\xbc\0\xe2\x82\xac", "", "\xc3\xbc", "\xe2\x82\xac"),
        NO(""),
        NO("\0"),
        NO("\0\0"),          /* empty authcid and password */
        NO("\0user\0"),      /* empty password */
        NO("\0\0pass"),      /* empty authcid */
        NO("z\0\0pass"),
        NO("z\0user\0"),
        NO("userpass"),      /* no NUL */
        NO("user\0pass"),    /* one NUL */
        NO("\0user\0pa\0ss"), /* a NUL in the password */
        NO("\0user\0pass\0"),
        NO("a\0b\0c\0d"),
        NO("\0\0\0"),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const plain_case *c = &cases[i];
        const uint8_t *p = (const uint8_t *)c->msg;
        smtpe_span z = {NULL, 99}, a = {NULL, 99}, pw = {NULL, 99};
        int r = smtpe__sasl_plain(p, c->len, &z, &a, &pw);
        if (r != c->result)
            fail_msg("case %zu: result %d, want %d", i, r, c->result);
        if (r != 0)
            continue;
        span_is(z, p, c->len, c->authzid);
        span_is(a, p, c->len, c->authcid);
        span_is(pw, p, c->len, c->password);
        /* the spans are where the message has them: authzid NUL authcid NUL password */
        assert_ptr_equal(z.ptr, p);
        assert_ptr_equal(a.ptr, p + z.len + 1);
        assert_ptr_equal(pw.ptr, a.ptr + a.len + 1);
        assert_int_equal(z.len + a.len + pw.len + 2, c->len);
    }
}

/* Each part may be 255 octets long, not 256 (RFC 4616 §2). */
static void test_plain_lengths(void **state)
{
    (void)state;
    uint8_t msg[3 * 256 + 2];
    smtpe_span z, a, p;
    for (int part = 0; part < 3; part++) {
        for (size_t long_len = 255; long_len <= 256; long_len++) {
            size_t len[3] = {3, 4, 5};
            len[part] = long_len;
            size_t n = 0;
            for (int k = 0; k < 3; k++) {
                if (k)
                    msg[n++] = 0;
                memset(msg + n, 'a' + k, len[k]);
                n += len[k];
            }
            int r = smtpe__sasl_plain(msg, n, &z, &a, &p);
            assert_int_equal(r, long_len == 255 ? 0 : -1);
            if (r == 0) {
                assert_int_equal(z.len, len[0]);
                assert_int_equal(a.len, len[1]);
                assert_int_equal(p.len, len[2]);
            }
        }
    }
    /* all three at 255 */
    memset(msg, 'x', sizeof msg);
    msg[255] = 0;
    msg[511] = 0;
    assert_int_equal(smtpe__sasl_plain(msg, 767, &z, &a, &p), 0);
    assert_int_equal(z.len + a.len + p.len, 765);
}

/* PLAIN as it arrives in AUTH: base64, decoded in place, then split (RFC 4954 §4). */
static void test_plain_from_base64(void **state)
{
    (void)state;
    uint8_t buf[] = "AHRlc3QAdGVzdHBhc3M="; /* "\0test\0testpass" */
    size_t n = smtpe__base64_decode(buf, strlen((char *)buf), buf);
    assert_int_equal(n, 14);
    smtpe_span z, a, p;
    assert_int_equal(smtpe__sasl_plain(buf, n, &z, &a, &p), 0);
    span_is(z, buf, n, "");
    span_is(a, buf, n, "test");
    span_is(p, buf, n, "testpass");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_vectors),
        cmocka_unit_test(test_encode_vectors),
        cmocka_unit_test(test_alphabet),
        cmocka_unit_test(test_decode_invalid),
        cmocka_unit_test(test_decode_invalid_writes_nothing),
        cmocka_unit_test(test_decode_in_place),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_plain_lengths),
        cmocka_unit_test(test_plain_from_base64),
    };
    return cmocka_run_group_tests_name("sasl", tests, NULL, NULL);
}
