/*
 * test_proxy.c - unit tests of engine/proxy.c: the PROXY protocol header reader and parser
 * (HAProxy's proxy-protocol.txt §2.1 v1, §2.2 v2, §2.2.7 TLVs), smtpe_proxy_tlv_next, and the
 * emitter smtpe__proxy_emit (exact octets, IPv6 in RFC 5952 text, cap boundaries, refused
 * infos, and every emitted header read and parsed back to its info).
 *
 * Every header is fed whole, one octet at a time and in chunks of 2, 3 and 7 octets, each time
 * followed by the client's first command: the results, the octets consumed and the gathered
 * header must be the same, and the reader must stop exactly at the header's end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proxy.h"

#define CAP 512                       /* the reader's buffer in most tests */
#define AFTER "EHLO client.example\r\n" /* what the client sends after the header */

static const uint8_t sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};

static void print_bytes(const char *what, const uint8_t *p, size_t n)
{
    fprintf(stderr, "%s\"", what);
    for (size_t i = 0; i < n; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '"')
            fputc(p[i], stderr);
        else
            fprintf(stderr, "\\x%02x", p[i]);
    }
    fprintf(stderr, "\"\n");
}

/* The outcome of feeding an input: the result, the octets consumed over all calls, and the
 * header gathered. */
typedef struct outcome {
    int result;
    size_t used;
    size_t len;
    uint8_t buf[CAP];
} outcome;

/* Feeds in[0..n) in chunks of step octets (0: all at once) into a reader with a cap-octet
 * buffer, until the reader says DONE or INVALID or the input runs out. */
static void feed(const uint8_t *in, size_t n, size_t step, size_t cap, outcome *o)
{
    smtpe__proxy st;
    smtpe__proxy_start(&st);
    memset(o, 0, sizeof *o);
    o->result = SMTPE__PROXY_MORE;
    size_t at = 0;
    do {
        size_t k = step == 0 || n - at < step ? n - at : step, used = (size_t)-1;
        int r = smtpe__proxy_feed(&st, o->buf, cap, in + at, k, &used);
        assert_true(r == SMTPE__PROXY_MORE || r == SMTPE__PROXY_DONE ||
                    r == SMTPE__PROXY_INVALID);
        assert_true(used <= k);
        if (r == SMTPE__PROXY_MORE)
            assert_int_equal(used, k); /* MORE consumes everything */
        at += used;
        o->result = r;
    } while (o->result == SMTPE__PROXY_MORE && at < n);
    o->used = at;
    o->len = st.len;
    if (o->result == SMTPE__PROXY_DONE) {
        assert_int_equal(st.len, at); /* the header is what was consumed */
        assert_memory_equal(o->buf, in, at);
        /* a complete header takes nothing more */
        size_t used = (size_t)-1;
        assert_int_equal(smtpe__proxy_feed(&st, o->buf, cap, (const uint8_t *)"x", 1, &used),
                         SMTPE__PROXY_DONE);
        assert_int_equal(used, 0);
    }
}

/* Feeds in[0..n) whole and in every split; all must agree. Returns the whole outcome. */
static void feed_all_ways(const uint8_t *in, size_t n, size_t cap, outcome *whole)
{
    static const size_t steps[] = {1, 2, 3, 7};
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    feed(in, n, 0, cap, whole);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        feed(in, n, steps[i], cap, o);
        if (o->result != whole->result || o->used != whole->used) {
            print_bytes("input: ", in, n);
            fail_msg("split %zu: result %d used %zu, whole: result %d used %zu", steps[i],
                     o->result, o->used, whole->result, whole->used);
        }
        if (o->result == SMTPE__PROXY_DONE) {
            assert_int_equal(o->len, whole->len);
            assert_memory_equal(o->buf, whole->buf, o->len);
        }
    }
    free(o);
}

/* The fields of a and b are the same (the TLVs as octets, wherever they are). */
static void assert_info_equal(const smtpe_proxy_info *a, const smtpe_proxy_info *b)
{
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->local, b->local);
    assert_int_equal(a->family, b->family);
    assert_int_equal(a->transport, b->transport);
    assert_memory_equal(a->src_addr, b->src_addr, 16);
    assert_memory_equal(a->dst_addr, b->dst_addr, 16);
    assert_int_equal(a->src_port, b->src_port);
    assert_int_equal(a->dst_port, b->dst_port);
    assert_int_equal(a->tlvs.len, b->tlvs.len);
    if (a->tlvs.len)
        assert_memory_equal(a->tlvs.ptr, b->tlvs.ptr, a->tlvs.len);
}

/* Feeds header[0..n) followed by AFTER: DONE exactly at the header's end, and a successful
 * parse into *info (whose TLVs point into header). */
static void expect_ok(const uint8_t *header, size_t n, smtpe_proxy_info *info)
{
    uint8_t in[1024];
    assert_true(n + sizeof AFTER - 1 <= sizeof in);
    memcpy(in, header, n);
    memcpy(in + n, AFTER, sizeof AFTER - 1);
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    feed_all_ways(in, n + sizeof AFTER - 1, CAP, o);
    if (o->result != SMTPE__PROXY_DONE || o->used != n) {
        print_bytes("header: ", header, n);
        fail_msg("result %d used %zu, want DONE at %zu", o->result, o->used, n);
    }
    memset(info, 0x5a, sizeof *info);
    if (smtpe__proxy_parse(o->buf, o->len, info) != 0) {
        print_bytes("header: ", header, n);
        fail_msg("a valid header did not parse");
    }
    if (info->tlvs.len)
        assert_true(info->tlvs.ptr >= o->buf && info->tlvs.ptr + info->tlvs.len <= o->buf + o->len);
    /* the parse of the caller's copy is the same, with the TLVs in that copy */
    smtpe_proxy_info again;
    assert_int_equal(smtpe__proxy_parse(header, n, &again), 0);
    if (again.tlvs.len)
        assert_ptr_equal(again.tlvs.ptr, header + (info->tlvs.ptr - o->buf));
    assert_info_equal(&again, info);
    *info = again; /* its TLVs point into the caller's header, which outlives o */
    free(o);
}

/* Feeds in[0..n) (nothing added): the reader says INVALID after exactly used octets. */
static void expect_invalid_at(const uint8_t *in, size_t n, size_t cap, size_t used)
{
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    feed_all_ways(in, n, cap, o);
    if (o->result != SMTPE__PROXY_INVALID || o->used != used) {
        print_bytes("input: ", in, n);
        fail_msg("result %d used %zu, want INVALID at %zu", o->result, o->used, used);
    }
    free(o);
}

/* Feeds header[0..n) followed by AFTER: either the reader rejects it, or it gathers a header
 * that does not parse. */
static void expect_bad(const uint8_t *header, size_t n)
{
    uint8_t in[1024];
    memcpy(in, header, n);
    memcpy(in + n, AFTER, sizeof AFTER - 1);
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    feed_all_ways(in, n + sizeof AFTER - 1, CAP, o);
    smtpe_proxy_info info;
    if (o->result == SMTPE__PROXY_DONE && smtpe__proxy_parse(o->buf, o->len, &info) == 0) {
        print_bytes("header: ", header, n);
        fail_msg("a malformed header was accepted");
    }
    assert_int_not_equal(o->result, SMTPE__PROXY_MORE);
    free(o);
}

#define S(s) (const uint8_t *)(s), sizeof(s) - 1

/* ---------------------------------------------------------------------------------------------
 * v1
 * ------------------------------------------------------------------------------------------- */

static void test_v1_tcp4(void **state)
{
    (void)state;
    smtpe_proxy_info info;
    expect_ok(S("PROXY TCP4 192.0.2.1 198.51.100.22 56324 25\r\n"), &info);
    assert_int_equal(info.version, 1);
    assert_int_equal(info.local, 0);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_STREAM);
    assert_memory_equal(info.src_addr, "\xc0\x00\x02\x01", 4);
    assert_memory_equal(info.dst_addr, "\xc6\x33\x64\x16", 4);
    assert_int_equal(info.src_port, 56324);
    assert_int_equal(info.dst_port, 25);
    assert_int_equal(info.tlvs.len, 0);

    expect_ok(S("PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n"), &info);
    assert_memory_equal(info.src_addr, "\0\0\0\0", 4);
    assert_memory_equal(info.dst_addr, "\xff\xff\xff\xff", 4);
    assert_int_equal(info.src_port, 0);
    assert_int_equal(info.dst_port, 65535);

    expect_ok(S("PROXY TCP4 10.20.30.40 100.0.9.199 1 10\r\n"), &info);
    assert_memory_equal(info.src_addr, "\x0a\x14\x1e\x28", 4);
    assert_memory_equal(info.dst_addr, "\x64\x00\x09\xc7", 4);
}

static void test_v1_tcp6(void **state)
{
    (void)state;
    smtpe_proxy_info info;
    static const uint8_t loop[16] = {[15] = 1}, zero[16] = {0};
    static const uint8_t mapped[16] = {[10] = 0xff, 0xff, 1, 2, 3, 4};
    static const uint8_t full[16] = {0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01, 0x00, 0x02,
                                     0x00, 0x03, 0x00, 0x04, 0x00, 0x05, 0xab, 0xcd};
    static const uint8_t mid[16] = {0x20, 0x01, 0x0d, 0xb8, [14] = 0x00, 0x25};
    static const uint8_t tail7[16] = {0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 0};
    static const uint8_t head7[16] = {0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7};
    static const uint8_t v4full[16] = {0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 192, 0, 2, 33};

    expect_ok(S("PROXY TCP6 ::1 :: 1025 587\r\n"), &info);
    assert_int_equal(info.version, 1);
    assert_int_equal(info.local, 0);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET6);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_STREAM);
    assert_memory_equal(info.src_addr, loop, 16);
    assert_memory_equal(info.dst_addr, zero, 16);
    assert_int_equal(info.src_port, 1025);
    assert_int_equal(info.dst_port, 587);

    expect_ok(S("PROXY TCP6 ::ffff:1.2.3.4 2001:db8:1:2:3:4:5:abcd 1 2\r\n"), &info);
    assert_memory_equal(info.src_addr, mapped, 16);
    assert_memory_equal(info.dst_addr, full, 16);

    expect_ok(S("PROXY TCP6 2001:DB8::25 2001:0db8:0001:0002:0003:0004:0005:ABCD 1 2\r\n"),
              &info);
    assert_memory_equal(info.src_addr, mid, 16);
    assert_memory_equal(info.dst_addr, full, 16);

    expect_ok(S("PROXY TCP6 1:2:3:4:5:6:7:: ::1:2:3:4:5:6:7 1 2\r\n"), &info);
    assert_memory_equal(info.src_addr, tail7, 16);
    assert_memory_equal(info.dst_addr, head7, 16);

    expect_ok(S("PROXY TCP6 1:2:3:4:5:6:192.0.2.33 ::ffff:1.2.3.4 1 2\r\n"), &info);
    assert_memory_equal(info.src_addr, v4full, 16);
    assert_memory_equal(info.dst_addr, mapped, 16);

    expect_ok(S("PROXY TCP6 1::192.0.2.33 2001:db8:0:0:0:0:0:25 1 2\r\n"), &info);
    static const uint8_t one_v4[16] = {0, 1, [12] = 192, 0, 2, 33};
    assert_memory_equal(info.src_addr, one_v4, 16);
    assert_memory_equal(info.dst_addr, mid, 16);

    /* the longest TCP6 form (104 octets) */
    expect_ok(S("PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"),
              &info);
    assert_int_equal(info.src_addr[0], 0xff);
    assert_int_equal(info.dst_addr[15], 0xff);
}

static void test_v1_unknown(void **state)
{
    (void)state;
    smtpe_proxy_info info;
    static const char *ok[] = {
        "PROXY UNKNOWN\r\n",
        "PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n",
        "PROXY UNKNOWN anything at all, even  double  spaces\r\n",
        "PROXY UNKNOWNx\r\n",
        /* the longest v1 header of all: 107 octets (§2.1) */
        ("PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
         "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"),
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        expect_ok((const uint8_t *)ok[i], strlen(ok[i]), &info);
        assert_int_equal(info.version, 1);
        assert_int_equal(info.local, 1);
        assert_int_equal(info.family, SMTPE_PROXY_AF_UNSPEC);
        assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_UNSPEC);
        assert_int_equal(info.src_port, 0);
        assert_int_equal(info.tlvs.len, 0);
    }
    assert_int_equal(strlen(ok[4]), SMTPE__PROXY_V1_MAX);
}

static void test_v1_malformed(void **state)
{
    (void)state;
    static const char *bad[] = {
        "PROXY TCP4  192.0.2.1 192.0.2.2 1 2\r\n", /* double spaces */
        "PROXY TCP4 192.0.2.1  192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2  1 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1  2\r\n",
        "PROXY  TCP4 192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 2 \r\n", /* trailing space */
        " PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY\tTCP4 192.0.2.1 192.0.2.2 1 2\r\n", /* a tab */
        "PROXY TCP4\t192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 65536\r\n", /* ports */
        "PROXY TCP4 192.0.2.1 192.0.2.2 99999 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 100000 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 01 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 00\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 -2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 +2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 0x2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 \r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1\r\n", /* too few fields */
        "PROXY TCP4 192.0.2.1 192.0.2.2\r\n",
        "PROXY TCP4\r\n",
        "PROXY \r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 2 3\r\n", /* too many */
        "PROXY TCP4 192.0.2.01 192.0.2.2 1 2\r\n", /* IPv4 */
        "PROXY TCP4 192.0.2.1 010.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.00 1 2\r\n",
        "PROXY TCP4 192.0.2.256 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1000 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1.5 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0..1 192.0.2.2 1 2\r\n",
        "PROXY TCP4 .192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1. 192.0.2.2 1 2\r\n",
        "PROXY TCP4 3221225985 192.0.2.2 1 2\r\n",
        "PROXY TCP4 ::1 192.0.2.2 1 2\r\n", /* IPv6 under TCP4 */
        "PROXY TCP6 192.0.2.1 ::1 1 2\r\n", /* IPv4 under TCP6 */
        "PROXY TCP6 ::1 ::1::2 1 2\r\n", /* two "::" */
        "PROXY TCP6 1::2::3 ::1 1 2\r\n",
        "PROXY TCP6 ::::1 ::1 1 2\r\n",
        "PROXY TCP6 1:::2 ::1 1 2\r\n",
        "PROXY TCP6 12345::1 ::1 1 2\r\n", /* five hex digits */
        "PROXY TCP6 ::00001 ::1 1 2\r\n",
        "PROXY TCP6 1:2:3:4:5:6:7:8:9 ::1 1 2\r\n", /* nine groups */
        "PROXY TCP6 1:2:3:4:5:6:7 ::1 1 2\r\n", /* seven groups, no "::" */
        "PROXY TCP6 1:2:3:4:5:6:7:8:: ::1 1 2\r\n", /* "::" for no group */
        "PROXY TCP6 ::1:2:3:4:5:6:7:8 ::1 1 2\r\n",
        "PROXY TCP6 1:2:3:4::5:6:7:8 ::1 1 2\r\n",
        "PROXY TCP6 :1:2:3:4:5:6:7 ::1 1 2\r\n", /* a lone leading ':' */
        "PROXY TCP6 1:2:3:4:5:6:7: ::1 1 2\r\n", /* a lone trailing ':' */
        "PROXY TCP6 : ::1 1 2\r\n",
        "PROXY TCP6 :::: ::1 1 2\r\n",
        "PROXY TCP6 g::1 ::1 1 2\r\n",
        "PROXY TCP6 ::1%eth0 ::1 1 2\r\n", /* a zone index */
        "PROXY TCP6 [::1] ::1 1 2\r\n",
        "PROXY TCP6 ::1.2.3.4:5 ::1 1 2\r\n", /* IPv4 not at the end */
        "PROXY TCP6 1.2.3.4:: ::1 1 2\r\n",
        "PROXY TCP6 1:2:3:4:5:6:7:1.2.3.4 ::1 1 2\r\n", /* 7 groups + IPv4 */
        "PROXY TCP6 1:2:3:4:5:6:7::1.2.3.4 ::1 1 2\r\n",
        "PROXY TCP6 ::ffff:1.2.3.04 ::1 1 2\r\n",
        "PROXY TCP6 ::ffff:1.2.3 ::1 1 2\r\n",
        "PROXY TCP6 ::ffff:256.2.3.4 ::1 1 2\r\n",
        "PROXY TCP6  ::1 1 2\r\n",
        "PROXY TCP5 192.0.2.1 192.0.2.2 1 2\r\n", /* the protocol */
        "PROXY tcp4 192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY UDP4 192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY unknown\r\n",
        "PROXY UNKNOW\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\r\n", /* CR and LF */
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 2\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1\n 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1\r 2\r\n",
        "PROXY UNKNOWN\n",
        "PROXY UNKNOWN\rx\r\n",
        "proxy TCP4 192.0.2.1 192.0.2.2 1 2\r\n", /* the prefix */
        "Proxy TCP4 192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY\r\n",
        "PROXYTCP4 192.0.2.1 192.0.2.2 1 2\r\n",
        "PROXY TCP4 192.0.2.1 192.0.2.2 1 2EHLO x\r\n", /* CRLF missing */
        /* 108 octets */
        ("PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
         "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 655355\r\n"),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad((const uint8_t *)bad[i], strlen(bad[i]));
    uint8_t nul[] = "PROXY TCP4 192.0.2.1\0" "192.0.2.2 1 2\r\n";
    expect_bad(nul, sizeof nul - 1);
}

/* The reader decides as soon as an octet rules a header out. */
static void test_v1_early_decisions(void **state)
{
    (void)state;
    expect_invalid_at(S("EHLO client.example\r\n"), CAP, 1);
    expect_invalid_at(S("GET / HTTP/1.1\r\n"), CAP, 1);
    expect_invalid_at(S("proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), CAP, 1);
    expect_invalid_at(S("PROXx TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), CAP, 5);
    expect_invalid_at(S("PROXY\r\n"), CAP, 6);
    expect_invalid_at(S("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"), CAP, 31);
    expect_invalid_at(S("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rx\r\n"), CAP, 32);
    expect_invalid_at(S("PROXY UNKNOWN\r\r\n"), CAP, 15);
    /* no CRLF within 107 octets: decided at octet 106, which must be the CR */
    uint8_t long_line[200];
    memcpy(long_line, "PROXY UNKNOWN ", 14);
    memset(long_line + 14, 'a', sizeof long_line - 14);
    expect_invalid_at(long_line, sizeof long_line, CAP, 106);
    long_line[105] = '\r';
    expect_invalid_at(long_line, sizeof long_line, CAP, 107);
    long_line[106] = '\n';
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    feed_all_ways(long_line, sizeof long_line, CAP, o);
    assert_int_equal(o->result, SMTPE__PROXY_DONE);
    assert_int_equal(o->used, 107);
    /* the smallest buffer the reader accepts holds the longest v1 header */
    feed_all_ways(long_line, sizeof long_line, 108, o);
    assert_int_equal(o->result, SMTPE__PROXY_DONE);
    free(o);
}

/* A header cut short: the reader wants more and has consumed everything. */
static void test_v1_incomplete(void **state)
{
    (void)state;
    static const char h[] = "PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\n";
    for (size_t k = 0; k < sizeof h - 1; k++) {
        outcome *o = malloc(sizeof *o);
        assert_non_null(o);
        feed_all_ways((const uint8_t *)h, k, CAP, o);
        assert_int_equal(o->result, SMTPE__PROXY_MORE);
        assert_int_equal(o->used, k);
        free(o);
    }
}

/* ---------------------------------------------------------------------------------------------
 * v2
 * ------------------------------------------------------------------------------------------- */

/* Builds a v2 header into out: the signature, ver_cmd, fam, the length of body, and body.
 * Returns its length. */
static size_t v2(uint8_t *out, uint8_t ver_cmd, uint8_t fam, const void *body, size_t body_len)
{
    memcpy(out, sig, 12);
    out[12] = ver_cmd;
    out[13] = fam;
    out[14] = (uint8_t)(body_len >> 8);
    out[15] = (uint8_t)body_len;
    if (body_len)
        memcpy(out + 16, body, body_len);
    return 16 + body_len;
}

/* An IPv4 address block: 192.0.2.1:56324 -> 198.51.100.22:25. */
static const uint8_t inet_block[12] = {192, 0, 2, 1, 198, 51, 100, 22, 0xdc, 0x04, 0, 25};

/* TLVs: ALPN "smtp", AUTHORITY "mx.example", NOOP (empty), SSL with a version sub-TLV. */
static const uint8_t some_tlvs[] = {
    0x01, 0x00, 0x04, 's', 'm', 't', 'p',
    0x02, 0x00, 0x0a, 'm', 'x', '.', 'e', 'x', 'a', 'm', 'p', 'l', 'e',
    0x04, 0x00, 0x00,
    0x20, 0x00, 0x0b, 0x01, 0x00, 0x00, 0x00, 0x00, 0x21, 0x00, 0x03, 'T', 'L', 'S',
};

/* Walks info->tlvs and checks they are some_tlvs. */
static void check_some_tlvs(const smtpe_proxy_info *info)
{
    smtpe_span t = info->tlvs, v;
    uint8_t type;
    assert_int_equal(t.len, sizeof some_tlvs);
    assert_memory_equal(t.ptr, some_tlvs, sizeof some_tlvs);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(type, 0x01);
    assert_int_equal(v.len, 4);
    assert_memory_equal(v.ptr, "smtp", 4);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(type, 0x02);
    assert_int_equal(v.len, 10);
    assert_memory_equal(v.ptr, "mx.example", 10);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(type, 0x04);
    assert_int_equal(v.len, 0);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(type, 0x20);
    assert_int_equal(v.len, 11);
    /* the SSL TLV's sub-TLVs after client (1) and verify (4) are TLVs too (§2.2.7.1) */
    smtpe_span sub = {v.ptr + 5, v.len - 5};
    assert_int_equal(smtpe_proxy_tlv_next(&sub, &type, &v), 1);
    assert_int_equal(type, 0x21);
    assert_memory_equal(v.ptr, "TLS", 3);
    assert_int_equal(smtpe_proxy_tlv_next(&sub, &type, &v), 0);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 0);
    assert_int_equal(t.len, 0);
}

static void test_v2_inet(void **state)
{
    (void)state;
    uint8_t h[600], body[300];
    smtpe_proxy_info info;
    size_t n = v2(h, 0x21, 0x11, inet_block, sizeof inet_block);
    expect_ok(h, n, &info);
    assert_int_equal(info.version, 2);
    assert_int_equal(info.local, 0);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_STREAM);
    assert_memory_equal(info.src_addr, "\xc0\x00\x02\x01", 4);
    assert_memory_equal(info.dst_addr, "\xc6\x33\x64\x16", 4);
    static const uint8_t zero[12] = {0};
    assert_memory_equal(info.src_addr + 4, zero, 12);
    assert_int_equal(info.src_port, 56324);
    assert_int_equal(info.dst_port, 25);
    assert_int_equal(info.tlvs.len, 0);

    memcpy(body, inet_block, 12);
    memcpy(body + 12, some_tlvs, sizeof some_tlvs);
    n = v2(h, 0x21, 0x11, body, 12 + sizeof some_tlvs);
    expect_ok(h, n, &info);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET);
    assert_int_equal(info.dst_port, 25);
    check_some_tlvs(&info);

    /* DGRAM (UDP over IPv4) */
    n = v2(h, 0x21, 0x12, inet_block, sizeof inet_block);
    expect_ok(h, n, &info);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_DGRAM);
    assert_int_equal(info.src_port, 56324);

    /* transport UNSPEC with a known family */
    n = v2(h, 0x21, 0x10, inet_block, sizeof inet_block);
    expect_ok(h, n, &info);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_UNSPEC);
}

static void test_v2_inet6(void **state)
{
    (void)state;
    uint8_t h[600], body[300];
    smtpe_proxy_info info;
    for (int i = 0; i < 16; i++) {
        body[i] = (uint8_t)(0x20 + i);
        body[16 + i] = (uint8_t)(0xf0 - i);
    }
    body[32] = 0x01, body[33] = 0x00, body[34] = 0x02, body[35] = 0x4b;
    size_t n = v2(h, 0x21, 0x21, body, 36);
    expect_ok(h, n, &info);
    assert_int_equal(info.version, 2);
    assert_int_equal(info.local, 0);
    assert_int_equal(info.family, SMTPE_PROXY_AF_INET6);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_STREAM);
    assert_memory_equal(info.src_addr, body, 16);
    assert_memory_equal(info.dst_addr, body + 16, 16);
    assert_int_equal(info.src_port, 256);
    assert_int_equal(info.dst_port, 587);
    assert_int_equal(info.tlvs.len, 0);

    memcpy(body + 36, some_tlvs, sizeof some_tlvs);
    n = v2(h, 0x21, 0x21, body, 36 + sizeof some_tlvs);
    expect_ok(h, n, &info);
    assert_int_equal(info.dst_port, 587);
    check_some_tlvs(&info);

    n = v2(h, 0x21, 0x22, body, 36);
    expect_ok(h, n, &info);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_DGRAM);
}

static void test_v2_unix(void **state)
{
    (void)state;
    uint8_t h[600], body[300];
    smtpe_proxy_info info;
    static const uint8_t zero[16] = {0};
    memset(body, 0, 216);
    memcpy(body, "/run/client.sock", 16);
    memcpy(body + 108, "/run/smtpe.sock", 15);
    size_t n = v2(h, 0x21, 0x31, body, 216);
    expect_ok(h, n, &info);
    assert_int_equal(info.version, 2);
    assert_int_equal(info.local, 0);
    assert_int_equal(info.family, SMTPE_PROXY_AF_UNIX);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_STREAM);
    assert_memory_equal(info.src_addr, zero, 16); /* AF_UNIX addresses are not decoded */
    assert_memory_equal(info.dst_addr, zero, 16);
    assert_int_equal(info.src_port, 0);
    assert_int_equal(info.tlvs.len, 0);

    memcpy(body + 216, some_tlvs, sizeof some_tlvs);
    n = v2(h, 0x21, 0x32, body, 216 + sizeof some_tlvs);
    expect_ok(h, n, &info);
    assert_int_equal(info.family, SMTPE_PROXY_AF_UNIX);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_DGRAM);
    check_some_tlvs(&info);
}

/* LOCAL: the address block is discarded whatever the family says (§2.2). */
static void test_v2_local(void **state)
{
    (void)state;
    uint8_t h[600], body[300];
    smtpe_proxy_info info;
    static const uint8_t zero[16] = {0};
    struct {
        uint8_t fam;
        const void *body;
        size_t len;
    } cases[] = {
        {0x00, NULL, 0},
        {0x11, inet_block, sizeof inet_block},
        {0x11, NULL, 0},              /* shorter than the family needs: ignored */
        {0x21, inet_block, 5},
        {0x31, some_tlvs, 3},
        {0x00, some_tlvs, sizeof some_tlvs},
        {0x00, "\x01\x00\x09xy", 5},  /* not even TLVs: ignored */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = v2(h, 0x20, cases[i].fam, cases[i].body, cases[i].len);
        expect_ok(h, n, &info);
        assert_int_equal(info.version, 2);
        assert_int_equal(info.local, 1);
        assert_int_equal(info.family, SMTPE_PROXY_AF_UNSPEC);
        assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_UNSPEC);
        assert_memory_equal(info.src_addr, zero, 16);
        assert_int_equal(info.src_port, 0);
        assert_int_equal(info.tlvs.len, 0);
    }
    (void)body;
}

/* PROXY with AF_UNSPEC: local, no address block, and whatever follows is TLVs. */
static void test_v2_unspec(void **state)
{
    (void)state;
    uint8_t h[600];
    smtpe_proxy_info info;
    size_t n = v2(h, 0x21, 0x00, NULL, 0);
    expect_ok(h, n, &info);
    assert_int_equal(info.version, 2);
    assert_int_equal(info.local, 1);
    assert_int_equal(info.family, SMTPE_PROXY_AF_UNSPEC);
    assert_int_equal(info.tlvs.len, 0);

    n = v2(h, 0x21, 0x01, some_tlvs, sizeof some_tlvs);
    expect_ok(h, n, &info);
    assert_int_equal(info.local, 1);
    assert_int_equal(info.transport, SMTPE_PROXY_TRANSPORT_STREAM);
    check_some_tlvs(&info);

    n = v2(h, 0x21, 0x00, inet_block, sizeof inet_block); /* not TLVs: ignored (§2.2) */
    expect_ok(h, n, &info);
    assert_int_equal(info.local, 1);
    assert_int_equal(info.tlvs.len, 0);
}

static void test_v2_bad_fixed(void **state)
{
    (void)state;
    uint8_t h[600];
    /* the signature, wrong at each octet */
    for (size_t i = 0; i < 12; i++) {
        size_t n = v2(h, 0x21, 0x11, inet_block, sizeof inet_block);
        h[i] ^= 0x20;
        expect_invalid_at(h, n, CAP, i + 1);
    }
    /* the version and the command: decided at octet 13 */
    static const uint8_t ver_cmd[] = {0x11, 0x01, 0x31, 0xf1, 0x22, 0x2f, 0x23, 0x10, 0x00};
    for (size_t i = 0; i < sizeof ver_cmd; i++) {
        size_t n = v2(h, ver_cmd[i], 0x11, inet_block, sizeof inet_block);
        expect_invalid_at(h, n, CAP, 13);
        assert_int_equal(smtpe__proxy_parse(h, n, &(smtpe_proxy_info){0}), -1);
    }
    /* the family and transport: octet 14; under LOCAL the block "including the family" is
     * ignored (§2.2), so any fam octet is fine there */
    static const uint8_t fam[] = {0x41, 0x13, 0x03, 0xf1, 0x1f, 0x51, 0x33};
    for (size_t i = 0; i < sizeof fam; i++) {
        smtpe_proxy_info info;
        size_t n = v2(h, 0x21, fam[i], inet_block, sizeof inet_block);
        expect_invalid_at(h, n, CAP, 14);
        assert_int_equal(smtpe__proxy_parse(h, n, &(smtpe_proxy_info){0}), -1);
        n = v2(h, 0x20, fam[i], inet_block, sizeof inet_block);
        expect_ok(h, n, &info);
        assert_int_equal(info.local, 1);
    }
    /* an address block shorter than the family needs: octet 16 */
    static const struct {
        uint8_t fam;
        size_t len;
    } short_block[] = {{0x11, 0}, {0x11, 11}, {0x21, 12}, {0x21, 35}, {0x31, 215}, {0x12, 8}};
    uint8_t body[300] = {0};
    for (size_t i = 0; i < sizeof short_block / sizeof short_block[0]; i++) {
        size_t n = v2(h, 0x21, short_block[i].fam, body, short_block[i].len);
        expect_invalid_at(h, n, CAP, 16);
        assert_int_equal(smtpe__proxy_parse(h, n, &(smtpe_proxy_info){0}), -1);
    }
}

/* A length that does not fit in the reader's buffer: INVALID at octet 16. */
static void test_v2_over_cap(void **state)
{
    (void)state;
    static uint8_t h[16 + 65535];
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    smtpe_proxy_info info;
    memset(h, 0, sizeof h);
    /* with the smallest buffer (108 octets): 92 octets after the fixed part fit, 93 do not */
    v2(h, 0x21, 0x11, inet_block, sizeof inet_block);
    h[14] = 0, h[15] = 92;
    h[28] = 0x04, h[29] = 0x00, h[30] = 77; /* one NOOP TLV over the rest */
    feed_all_ways(h, sizeof h, 108, o);
    assert_int_equal(o->result, SMTPE__PROXY_DONE);
    assert_int_equal(o->used, 108);
    assert_int_equal(smtpe__proxy_parse(o->buf, o->len, &info), 0);
    assert_int_equal(info.tlvs.len, 80);
    h[15] = 93;
    expect_invalid_at(h, sizeof h, 108, 16);

    h[14] = 0xff, h[15] = 0xff; /* 65535 octets announced */
    expect_invalid_at(h, sizeof h, CAP, 16);
    h[14] = 0x01, h[15] = 0xf1; /* 16 + 497 = 513 > CAP */
    expect_invalid_at(h, sizeof h, CAP, 16);
    h[15] = 0xf0; /* 16 + 496 = 512: fits */
    h[28] = 0x04, h[29] = 0x01, h[30] = 0xe1; /* one NOOP TLV over the rest (481) */
    feed_all_ways(h, sizeof h, CAP, o);
    assert_int_equal(o->result, SMTPE__PROXY_DONE);
    assert_int_equal(o->used, 512);
    assert_int_equal(smtpe__proxy_parse(o->buf, o->len, &info), 0);
    assert_int_equal(info.tlvs.len, 484);
    free(o);
}

/* TLVs that do not exactly cover the rest: the header is gathered but does not parse. */
static void test_v2_bad_tlvs(void **state)
{
    (void)state;
    uint8_t h[600], body[300];
    static const struct {
        const char *t;
        size_t len;
    } bad[] = {
        {"\x01", 1},                   /* shorter than a TLV's type and length */
        {"\x01\x00", 2},
        {"\x01\x00\x01", 3},           /* the value is missing */
        {"\x01\x00\x05xyzw", 7},       /* one octet short */
        {"\x01\x01\x00xyzw", 7},       /* 256 announced */
        {"\x04\x00\x00\x01", 4},       /* a whole TLV, then a stray octet */
        {"\x04\x00\x00\x01\x00\x02x", 7},
        {"\x02\xff\xff", 3},
    };
    memcpy(body, inet_block, 12);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(body + 12, bad[i].t, bad[i].len);
        size_t n = v2(h, 0x21, 0x11, body, 12 + bad[i].len);
        expect_bad(h, n);
        outcome *o = malloc(sizeof *o);
        assert_non_null(o);
        feed_all_ways(h, n, CAP, o);
        assert_int_equal(o->result, SMTPE__PROXY_DONE);
        assert_int_equal(o->used, n);
        free(o);
        /* the same under INET6; under AF_UNSPEC the rest is ignored (§2.2) */
        uint8_t body6[300] = {0};
        smtpe_proxy_info info;
        memcpy(body6 + 36, bad[i].t, bad[i].len);
        expect_bad(h, v2(h, 0x21, 0x21, body6, 36 + bad[i].len));
        expect_ok(h, v2(h, 0x21, 0x01, bad[i].t, bad[i].len), &info);
        assert_int_equal(info.local, 1);
        assert_int_equal(info.tlvs.len, 0);
    }
}

/* A v2 header cut short: the reader wants more. */
static void test_v2_incomplete(void **state)
{
    (void)state;
    uint8_t h[600], body[300];
    memcpy(body, inet_block, 12);
    memcpy(body + 12, some_tlvs, sizeof some_tlvs);
    size_t n = v2(h, 0x21, 0x11, body, 12 + sizeof some_tlvs);
    outcome *o = malloc(sizeof *o);
    assert_non_null(o);
    for (size_t k = 0; k < n; k++) {
        feed_all_ways(h, k, CAP, o);
        assert_int_equal(o->result, SMTPE__PROXY_MORE);
        assert_int_equal(o->used, k);
    }
    free(o);
}

/* smtpe__proxy_parse on buffers the reader would not have produced. */
static void test_parse_direct(void **state)
{
    (void)state;
    uint8_t h[600] = {0};
    smtpe_proxy_info info;
    smtpe_proxy_info before;
    memset(&info, 0x77, sizeof info);
    memcpy(&before, &info, sizeof info);
    assert_int_equal(smtpe__proxy_parse(h, 0, &info), -1);
    assert_int_equal(smtpe__proxy_parse(S("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nX"), &info), -1);
    assert_int_equal(smtpe__proxy_parse(S("PROXY TCP4 1.2.3.4 5.6.7.8 1 2"), &info), -1);
    assert_int_equal(smtpe__proxy_parse(S("PROXY UNKNOWN\r\n\r\n"), &info), -1);
    assert_int_equal(smtpe__proxy_parse(S("X"), &info), -1);
    size_t n = v2(h, 0x21, 0x11, inet_block, sizeof inet_block);
    assert_int_equal(smtpe__proxy_parse(h, n - 1, &info), -1); /* shorter than len says */
    h[n] = 0;
    assert_int_equal(smtpe__proxy_parse(h, n + 1, &info), -1); /* longer */
    assert_int_equal(smtpe__proxy_parse(h, 15, &info), -1);
    h[7] = 'q'; /* the signature */
    assert_int_equal(smtpe__proxy_parse(h, n, &info), -1);
    /* a failed parse leaves *out alone */
    assert_memory_equal(&info, &before, sizeof info);
}

/* ---------------------------------------------------------------------------------------------
 * smtpe_proxy_tlv_next
 * ------------------------------------------------------------------------------------------- */

static void test_tlv_next(void **state)
{
    (void)state;
    uint8_t type = 0x99;
    smtpe_span v = {NULL, 0};
    smtpe_span t = {NULL, 0};
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 0);

    static const uint8_t two[] = {0xe0, 0x00, 0x02, 'h', 'i', 0x05, 0x00, 0x00};
    t = (smtpe_span){two, sizeof two};
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(type, 0xe0);
    assert_ptr_equal(v.ptr, two + 3);
    assert_int_equal(v.len, 2);
    assert_ptr_equal(t.ptr, two + 5);
    assert_int_equal(t.len, 3);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(type, 0x05);
    assert_int_equal(v.len, 0);
    assert_ptr_equal(v.ptr, two + 8);
    assert_int_equal(t.len, 0);
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 0);

    /* malformed rests: 0, and the span stays where it was */
    static const uint8_t trunc[] = {0x01, 0x00, 0x03, 'a', 'b'};
    for (size_t k = 0; k <= sizeof trunc; k++) {
        t = (smtpe_span){trunc, k};
        type = 0x99;
        assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 0);
        assert_ptr_equal(t.ptr, trunc);
        assert_int_equal(t.len, k);
        assert_int_equal(type, 0x99);
    }
    /* a big value: the length is big-endian */
    static uint8_t big[3 + 0x1234];
    big[0] = 0x30, big[1] = 0x12, big[2] = 0x34;
    t = (smtpe_span){big, sizeof big};
    assert_int_equal(smtpe_proxy_tlv_next(&t, &type, &v), 1);
    assert_int_equal(v.len, 0x1234);
    assert_int_equal(t.len, 0);
    assert_int_equal(smtpe_proxy_tlv_next(NULL, &type, &v), 0);
}

/* ---------------------------------------------------------------------------------------------
 * smtpe__proxy_emit
 * ------------------------------------------------------------------------------------------- */

/* An info with the given fields (addresses and TLVs empty). */
static smtpe_proxy_info mk(int version, int local, int family, int transport)
{
    smtpe_proxy_info i;
    memset(&i, 0, sizeof i);
    i.version = version;
    i.local = local;
    i.family = family;
    i.transport = transport;
    return i;
}

/* Emits in into out (room for max octets) and checks the cap boundaries: the header fits in
 * exactly its length, not in one less (nothing written then), and no call writes past cap.
 * Returns the length (0 when in is refused, which every cap must agree on). */
static size_t emit(const smtpe_proxy_info *in, uint8_t *out, size_t max)
{
    static uint8_t tmp[16 + 65535 + 8];
    assert_true(max < sizeof tmp);
    size_t n = smtpe__proxy_emit(in, tmp, max);
    if (n == 0) {
        assert_int_equal(smtpe__proxy_emit(in, tmp, sizeof tmp - 1), 0);
        return 0;
    }
    assert_true(n <= max);
    memset(tmp, 0xee, n + 1);
    assert_int_equal(smtpe__proxy_emit(in, tmp, n - 1), 0);
    for (size_t i = n - 1; i <= n; i++)
        assert_int_equal(tmp[i], 0xee); /* the refused call wrote nothing at or past cap */
    assert_int_equal(smtpe__proxy_emit(in, tmp, n), n);
    assert_int_equal(tmp[n], 0xee);
    assert_int_equal(smtpe__proxy_emit(in, out, max), n);
    assert_memory_equal(out, tmp, n);
    assert_int_equal(smtpe__proxy_emit(in, NULL, n), 0);
    return n;
}

/* Emits in, checks the octets are want[0..want_len), and that they are read and parsed back to
 * expect (in itself when expect is NULL). */
static void emit_exact(const smtpe_proxy_info *in, const void *want, size_t want_len,
                       const smtpe_proxy_info *expect)
{
    uint8_t out[1024];
    size_t n = emit(in, out, sizeof out);
    if (n != want_len || memcmp(out, want, n) != 0) {
        print_bytes("emitted: ", out, n);
        print_bytes("wanted:  ", want, want_len);
        fail_msg("smtpe__proxy_emit wrote other octets");
    }
    smtpe_proxy_info back;
    expect_ok(out, n, &back);
    assert_info_equal(&back, expect ? expect : in);
}

#define EMIT_V1(in, lit, expect) emit_exact(in, lit, sizeof(lit) - 1, expect)

static void set_inet(smtpe_proxy_info *i, const char *src, const char *dst, uint16_t sp,
                     uint16_t dp)
{
    memcpy(i->src_addr, src, 4);
    memcpy(i->dst_addr, dst, 4);
    i->src_port = sp;
    i->dst_port = dp;
}

/* Groups g[8] as 16 octets in network order. */
static void set_groups(uint8_t a[16], const unsigned g[8])
{
    for (int i = 0; i < 8; i++) {
        a[2 * i] = (uint8_t)(g[i] >> 8);
        a[2 * i + 1] = (uint8_t)g[i];
    }
}

static void test_emit_v1_tcp4(void **state)
{
    (void)state;
    smtpe_proxy_info in = mk(1, 0, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_STREAM);
    set_inet(&in, "\xc0\x00\x02\x01", "\xc6\x33\x64\x16", 56324, 25);
    EMIT_V1(&in, "PROXY TCP4 192.0.2.1 198.51.100.22 56324 25\r\n", NULL);
    set_inet(&in, "\0\0\0\0", "\xff\xff\xff\xff", 0, 65535);
    EMIT_V1(&in, "PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n", NULL);
    set_inet(&in, "\x0a\x14\x1e\x28", "\x64\x00\x09\xc7", 1, 10);
    EMIT_V1(&in, "PROXY TCP4 10.20.30.40 100.0.9.199 1 10\r\n", NULL);
    /* an unspecified transport is taken as TCP; what comes back says STREAM */
    smtpe_proxy_info unspec = in, want = in;
    unspec.transport = SMTPE_PROXY_TRANSPORT_UNSPEC;
    EMIT_V1(&unspec, "PROXY TCP4 10.20.30.40 100.0.9.199 1 10\r\n", &want);
}

static void test_emit_v1_tcp6(void **state)
{
    (void)state;
    /* RFC 5952 §4: the canonical text form */
    static const struct {
        unsigned src[8], dst[8];
        const char *want;
    } cases[] = {
        {{0x2001, 0xdb8, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 0, 0, 0},
         "PROXY TCP6 2001:db8::1 :: 1 2\r\n"},
        {{0, 0, 0, 0, 0, 0, 0, 1}, {1, 0, 0, 0, 0, 0, 0, 0}, "PROXY TCP6 ::1 1:: 1 2\r\n"},
        /* leading zeros go (§4.1), hex is lower case (§4.3) */
        {{0x2001, 0x0db8, 0, 0, 0, 0xff00, 0x42, 0x8329},
         {0xABCD, 0xEF01, 0x2345, 0x6789, 0xabcd, 0xef01, 0x2345, 0x6789},
         "PROXY TCP6 2001:db8::ff00:42:8329 abcd:ef01:2345:6789:abcd:ef01:2345:6789 1 2\r\n"},
        /* one zero group is not "::" (§4.2.2); the longest run is (§4.2.1) */
        {{0x2001, 0xdb8, 0, 1, 1, 1, 1, 1}, {0x2001, 0, 0, 1, 0, 0, 0, 1},
         "PROXY TCP6 2001:db8:0:1:1:1:1:1 2001:0:0:1::1 1 2\r\n"},
        /* equally long runs: the first (§4.2.3) */
        {{0x2001, 0xdb8, 0, 0, 1, 0, 0, 1}, {1, 0, 0, 2, 0, 0, 0, 3},
         "PROXY TCP6 2001:db8::1:0:0:1 1:0:0:2::3 1 2\r\n"},
        {{0, 0, 1, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 0, 0, 0, 0},
         "PROXY TCP6 0:0:1:: 0:0:0:1:: 1 2\r\n"},
        {{1, 0, 2, 0, 3, 0, 4, 0}, {0, 1, 0, 2, 0, 3, 0, 4},
         "PROXY TCP6 1:0:2:0:3:0:4:0 0:1:0:2:0:3:0:4 1 2\r\n"},
        /* IPv4-mapped: hex groups, not a dotted quad */
        {{0, 0, 0, 0, 0, 0xffff, 0x0102, 0x0304}, {0x64, 0xff9b, 0, 0, 0, 0, 0xc000, 0x0221},
         "PROXY TCP6 ::ffff:102:304 64:ff9b::c000:221 1 2\r\n"},
    };
    smtpe_proxy_info in = mk(1, 0, SMTPE_PROXY_AF_INET6, SMTPE_PROXY_TRANSPORT_STREAM);
    in.src_port = 1;
    in.dst_port = 2;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set_groups(in.src_addr, cases[i].src);
        set_groups(in.dst_addr, cases[i].dst);
        emit_exact(&in, cases[i].want, strlen(cases[i].want), NULL);
    }
    /* the longest TCP6 header: 104 octets */
    memset(in.src_addr, 0xff, 16);
    memset(in.dst_addr, 0xff, 16);
    in.src_port = in.dst_port = 65535;
    EMIT_V1(&in,
            "PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n",
            NULL);
    uint8_t out[200];
    assert_int_equal(smtpe__proxy_emit(&in, out, sizeof out), 104);
}

/* "PROXY UNKNOWN\r\n" for whatever v1 cannot say (§2.1); it parses back as local. */
static void test_emit_v1_unknown(void **state)
{
    (void)state;
    smtpe_proxy_info want = mk(1, 1, SMTPE_PROXY_AF_UNSPEC, SMTPE_PROXY_TRANSPORT_UNSPEC);
    smtpe_proxy_info ins[] = {
        mk(1, 1, SMTPE_PROXY_AF_UNSPEC, SMTPE_PROXY_TRANSPORT_UNSPEC), /* what UNKNOWN parses to */
        mk(1, 1, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_STREAM),   /* local wins */
        mk(1, 1, SMTPE_PROXY_AF_INET6, SMTPE_PROXY_TRANSPORT_STREAM),
        mk(1, 0, SMTPE_PROXY_AF_UNSPEC, SMTPE_PROXY_TRANSPORT_STREAM),
        mk(1, 0, SMTPE_PROXY_AF_UNIX, SMTPE_PROXY_TRANSPORT_STREAM),
        mk(1, 0, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_DGRAM), /* UDP: no v1 form */
        mk(1, 0, SMTPE_PROXY_AF_INET6, SMTPE_PROXY_TRANSPORT_DGRAM),
    };
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
        set_inet(&ins[i], "\1\2\3\4", "\5\6\7\10", 9, 10);
        EMIT_V1(&ins[i], "PROXY UNKNOWN\r\n", &want);
    }
}

/* Every v1 header the parser accepts in the tests above comes back from its info. */
static void test_emit_v1_round_trip(void **state)
{
    (void)state;
    static const char *headers[] = {
        "PROXY TCP4 192.0.2.1 198.51.100.22 56324 25\r\n",
        "PROXY TCP6 ::ffff:1.2.3.4 2001:db8:1:2:3:4:5:abcd 1 2\r\n",
        "PROXY TCP6 2001:DB8::25 2001:0db8:0001:0002:0003:0004:0005:ABCD 1 2\r\n",
        "PROXY TCP6 1:2:3:4:5:6:7:: ::1:2:3:4:5:6:7 1 2\r\n",
        "PROXY TCP6 1:2:3:4:5:6:192.0.2.33 ::ffff:1.2.3.4 1 2\r\n",
        "PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n",
    };
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
        smtpe_proxy_info info, back;
        uint8_t out[200];
        expect_ok((const uint8_t *)headers[i], strlen(headers[i]), &info);
        size_t n = emit(&info, out, sizeof out);
        assert_true(n > 0);
        expect_ok(out, n, &back);
        assert_info_equal(&back, &info);
    }
}

static void test_emit_v2(void **state)
{
    (void)state;
    uint8_t want[600], body[300];
    size_t n;
    /* INET, TCP: exact octets, without and with TLVs */
    smtpe_proxy_info in = mk(2, 0, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_STREAM);
    set_inet(&in, "\xc0\x00\x02\x01", "\xc6\x33\x64\x16", 56324, 25);
    static const uint8_t inet_header[28] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51,
                                            0x55, 0x49, 0x54, 0x0a, 0x21, 0x11, 0x00, 0x0c,
                                            192, 0, 2, 1, 198, 51, 100, 22, 0xdc, 0x04, 0, 25};
    emit_exact(&in, inet_header, sizeof inet_header, NULL);
    in.tlvs = (smtpe_span){some_tlvs, sizeof some_tlvs};
    memcpy(body, inet_block, 12);
    memcpy(body + 12, some_tlvs, sizeof some_tlvs);
    n = v2(want, 0x21, 0x11, body, 12 + sizeof some_tlvs);
    emit_exact(&in, want, n, NULL);
    /* INET, UDP */
    in.transport = SMTPE_PROXY_TRANSPORT_DGRAM;
    in.tlvs = (smtpe_span){NULL, 0};
    n = v2(want, 0x21, 0x12, inet_block, 12);
    emit_exact(&in, want, n, NULL);

    /* INET6, with and without TLVs */
    in = mk(2, 0, SMTPE_PROXY_AF_INET6, SMTPE_PROXY_TRANSPORT_STREAM);
    for (int i = 0; i < 16; i++) {
        in.src_addr[i] = body[i] = (uint8_t)(0x20 + i);
        in.dst_addr[i] = body[16 + i] = (uint8_t)(0xf0 - i);
    }
    in.src_port = 256, in.dst_port = 587;
    body[32] = 0x01, body[33] = 0x00, body[34] = 0x02, body[35] = 0x4b;
    emit_exact(&in, want, v2(want, 0x21, 0x21, body, 36), NULL);
    memcpy(body + 36, some_tlvs, sizeof some_tlvs);
    in.tlvs = (smtpe_span){some_tlvs, sizeof some_tlvs};
    emit_exact(&in, want, v2(want, 0x21, 0x21, body, 36 + sizeof some_tlvs), NULL);

    /* AF_UNIX: two empty paths (info holds none), and the TLVs */
    in = mk(2, 0, SMTPE_PROXY_AF_UNIX, SMTPE_PROXY_TRANSPORT_DGRAM);
    memset(body, 0, 216);
    emit_exact(&in, want, v2(want, 0x21, 0x32, body, 216), NULL);
    in.tlvs = (smtpe_span){some_tlvs, sizeof some_tlvs};
    memcpy(body + 216, some_tlvs, sizeof some_tlvs);
    emit_exact(&in, want, v2(want, 0x21, 0x32, body, 216 + sizeof some_tlvs), NULL);
    /* the address fields play no part for AF_UNIX */
    smtpe_proxy_info with_addr = in;
    memset(with_addr.src_addr, 0x11, 16);
    with_addr.dst_port = 25;
    emit_exact(&with_addr, want, v2(want, 0x21, 0x32, body, 216 + sizeof some_tlvs), &in);
}

/* Local infos: LOCAL when there is nothing else to say, PROXY with AF_UNSPEC when a transport
 * or TLVs must reach the receiver. */
static void test_emit_v2_local(void **state)
{
    (void)state;
    uint8_t want[600];
    smtpe_proxy_info want_local = mk(2, 1, SMTPE_PROXY_AF_UNSPEC, SMTPE_PROXY_TRANSPORT_UNSPEC);
    static const uint8_t local_header[16] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51,
                                             0x55, 0x49, 0x54, 0x0a, 0x20, 0x00, 0x00, 0x00};
    smtpe_proxy_info in = want_local;
    emit_exact(&in, local_header, sizeof local_header, NULL);
    /* local wins over a family and its addresses */
    in = mk(2, 1, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_UNSPEC);
    set_inet(&in, "\1\2\3\4", "\5\6\7\10", 9, 10);
    emit_exact(&in, local_header, sizeof local_header, &want_local);
    /* what PROXY + AF_UNSPEC parses to: transport and TLVs survive */
    in = mk(2, 1, SMTPE_PROXY_AF_UNSPEC, SMTPE_PROXY_TRANSPORT_STREAM);
    emit_exact(&in, want, v2(want, 0x21, 0x01, NULL, 0), NULL);
    in.tlvs = (smtpe_span){some_tlvs, sizeof some_tlvs};
    emit_exact(&in, want, v2(want, 0x21, 0x01, some_tlvs, sizeof some_tlvs), NULL);
    in.transport = SMTPE_PROXY_TRANSPORT_UNSPEC;
    emit_exact(&in, want, v2(want, 0x21, 0x00, some_tlvs, sizeof some_tlvs), NULL);
    /* AF_UNSPEC without local is sent the same way and comes back local */
    smtpe_proxy_info back = in;
    in.local = 0;
    emit_exact(&in, want, v2(want, 0x21, 0x00, some_tlvs, sizeof some_tlvs), &back);
    /* any non-zero local is local */
    in = want_local;
    in.local = 7;
    emit_exact(&in, local_header, sizeof local_header, &want_local);
}

/* The largest v2 header: len 65535. */
static void test_emit_v2_max(void **state)
{
    (void)state;
    static uint8_t tlvs[65535 + 1], out[16 + 65535 + 1];
    smtpe_proxy_info in = mk(2, 1, SMTPE_PROXY_AF_UNSPEC, SMTPE_PROXY_TRANSPORT_STREAM), back;
    tlvs[0] = 0x04, tlvs[1] = 0xff, tlvs[2] = 0xfc; /* one NOOP TLV of 65532 octets */
    in.tlvs = (smtpe_span){tlvs, 65535};
    size_t n = emit(&in, out, sizeof out);
    assert_int_equal(n, 16 + 65535);
    assert_int_equal(out[14], 0xff);
    assert_int_equal(out[15], 0xff);
    assert_int_equal(smtpe__proxy_parse(out, n, &back), 0);
    assert_int_equal(back.tlvs.len, 65535);
    assert_ptr_equal(back.tlvs.ptr, out + 16);
    /* under INET the address block takes 12 of the 65535 */
    in = mk(2, 0, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_STREAM);
    tlvs[1] = 0xff, tlvs[2] = 0xf0;
    in.tlvs = (smtpe_span){tlvs, 65523};
    assert_int_equal(emit(&in, out, sizeof out), 16 + 65535);
    assert_int_equal(smtpe__proxy_parse(out, 16 + 65535, &back), 0);
    tlvs[2] = 0xf1; /* one octet more: len would be 65536 */
    in.tlvs = (smtpe_span){tlvs, 65524};
    assert_int_equal(emit(&in, out, sizeof out), 0);
    in.family = SMTPE_PROXY_AF_UNIX; /* 216 + 65320 = 65536 */
    tlvs[1] = 0xff, tlvs[2] = 0x25;
    in.tlvs = (smtpe_span){tlvs, 65320};
    assert_int_equal(emit(&in, out, sizeof out), 0);
    tlvs[2] = 0x24;
    in.tlvs = (smtpe_span){tlvs, 65319};
    assert_int_equal(emit(&in, out, sizeof out), 16 + 65535);
}

/* Infos that are refused whatever the room. */
static void test_emit_invalid(void **state)
{
    (void)state;
    uint8_t out[1024];
    static const uint8_t bad_tlvs[][7] = {
        {0x01}, {0x01, 0x00}, {0x01, 0x00, 0x01}, {0x01, 0x00, 0x05, 'x', 'y', 'z', 'w'},
        {0x04, 0x00, 0x00, 0x01},
    };
    static const size_t bad_len[] = {1, 2, 3, 7, 4};
    smtpe_proxy_info ok = mk(2, 0, SMTPE_PROXY_AF_INET, SMTPE_PROXY_TRANSPORT_STREAM), in;
    assert_int_equal(smtpe__proxy_emit(NULL, out, sizeof out), 0);
    assert_int_equal(smtpe__proxy_emit(&ok, NULL, sizeof out), 0);
    assert_int_equal(smtpe__proxy_emit(&ok, out, 0), 0);
    for (int v = 1; v <= 2; v++) {
        static const int versions[] = {0, 3, -1, 0x7fffffff};
        in = ok, in.version = v;
        assert_true(emit(&in, out, sizeof out) > 0); /* the base case is fine */
        for (size_t i = 0; i < 4; i++) {
            in = ok, in.version = versions[i];
            assert_int_equal(emit(&in, out, sizeof out), 0);
        }
        static const int families[] = {-1, 4, 15, 0x10};
        for (size_t i = 0; i < 4; i++) {
            in = ok, in.version = v, in.family = families[i];
            assert_int_equal(emit(&in, out, sizeof out), 0);
            in.local = 1; /* refused even where the family plays no part */
            assert_int_equal(emit(&in, out, sizeof out), 0);
        }
        static const int transports[] = {-1, 3, 15};
        for (size_t i = 0; i < 3; i++) {
            in = ok, in.version = v, in.transport = transports[i];
            assert_int_equal(emit(&in, out, sizeof out), 0);
        }
    }
    /* v1 has no TLVs */
    in = ok, in.version = 1, in.tlvs = (smtpe_span){some_tlvs, sizeof some_tlvs};
    assert_int_equal(emit(&in, out, sizeof out), 0);
    in.local = 1;
    assert_int_equal(emit(&in, out, sizeof out), 0);
    /* v2 TLVs that are not well formed (§2.2.7), under every family and local */
    for (size_t i = 0; i < sizeof bad_len / sizeof bad_len[0]; i++) {
        for (int f = SMTPE_PROXY_AF_UNSPEC; f <= SMTPE_PROXY_AF_UNIX; f++) {
            in = ok, in.family = f, in.tlvs = (smtpe_span){bad_tlvs[i], bad_len[i]};
            assert_int_equal(emit(&in, out, sizeof out), 0);
            in.local = 1;
            assert_int_equal(emit(&in, out, sizeof out), 0);
        }
    }
    /* a length without octets */
    in = ok, in.tlvs = (smtpe_span){NULL, 3};
    assert_int_equal(emit(&in, out, sizeof out), 0);
    /* an empty span may have any pointer */
    in = ok, in.tlvs = (smtpe_span){NULL, 0};
    assert_int_equal(emit(&in, out, sizeof out), 28);
    /* a failed emit writes nothing */
    memset(out, 0xee, sizeof out);
    in = ok, in.tlvs = (smtpe_span){bad_tlvs[3], bad_len[3]};
    assert_int_equal(smtpe__proxy_emit(&in, out, sizeof out), 0);
    in = ok, in.version = 1;
    assert_int_equal(smtpe__proxy_emit(&in, out, 10), 0);
    for (size_t i = 0; i < sizeof out; i++)
        assert_int_equal(out[i], 0xee);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_tcp4),
        cmocka_unit_test(test_v1_tcp6),
        cmocka_unit_test(test_v1_unknown),
        cmocka_unit_test(test_v1_malformed),
        cmocka_unit_test(test_v1_early_decisions),
        cmocka_unit_test(test_v1_incomplete),
        cmocka_unit_test(test_v2_inet),
        cmocka_unit_test(test_v2_inet6),
        cmocka_unit_test(test_v2_unix),
        cmocka_unit_test(test_v2_local),
        cmocka_unit_test(test_v2_unspec),
        cmocka_unit_test(test_v2_bad_fixed),
        cmocka_unit_test(test_v2_over_cap),
        cmocka_unit_test(test_v2_bad_tlvs),
        cmocka_unit_test(test_v2_incomplete),
        cmocka_unit_test(test_parse_direct),
        cmocka_unit_test(test_tlv_next),
        cmocka_unit_test(test_emit_v1_tcp4),
        cmocka_unit_test(test_emit_v1_tcp6),
        cmocka_unit_test(test_emit_v1_unknown),
        cmocka_unit_test(test_emit_v1_round_trip),
        cmocka_unit_test(test_emit_v2),
        cmocka_unit_test(test_emit_v2_local),
        cmocka_unit_test(test_emit_v2_max),
        cmocka_unit_test(test_emit_invalid),
    };
    return cmocka_run_group_tests_name("proxy", tests, NULL, NULL);
}
