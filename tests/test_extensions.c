/*
 * test_extensions.c - unit tests of the public API added for the ESMTP extensions
 * (include/smtpe.h): smtpe_server_tls_started (RFC 3207 §4.2, RFC 8314 implicit TLS),
 * smtpe_server_auth_challenge (RFC 4954 §4), smtpe_server_set_trusted (XCLIENT/XFORWARD), the
 * wiping of SASL credentials, the config checks and memory formula of the new fields, LMTP's
 * per-recipient verdicts (RFC 2033 §4.2), the PROXY verdicts and BDAT chunk ends that need no
 * further input (RFC 3030 §2). The replies themselves are checked by the transcripts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "smtpe.h"

/* A session in caller memory, so that tests can look at all of it. */
typedef struct xs {
    smtpe_server_config cfg;
    smtpe_server *s;
    max_align_t mem[65536 / sizeof(max_align_t)];
    char out[16384]; /* output taken so far, NUL-terminated */
    size_t out_len;
} xs;

static xs *xs_new(void (*tweak)(smtpe_server_config *))
{
    xs *x = calloc(1, sizeof *x);
    assert_non_null(x);
    smtpe_server_config_init(&x->cfg);
    x->cfg.hostname = "mx.example";
    if (tweak)
        tweak(&x->cfg);
    assert_true(smtpe_server_memory_size(&x->cfg) <= sizeof x->mem);
    assert_int_equal(smtpe_server_init(&x->s, x->mem, sizeof x->mem, &x->cfg, 0), 0);
    return x;
}

/* Takes all queued output into x->out. */
static void xs_drain(xs *x)
{
    size_t n;
    const uint8_t *p = smtpe_server_send_buf(x->s, &n);
    assert_true(x->out_len + n < sizeof x->out);
    memcpy(x->out + x->out_len, p, n);
    x->out_len += n;
    x->out[x->out_len] = 0;
    assert_int_equal(smtpe_server_send_ack(x->s, n), 0);
}

/* Sends all queued output without keeping it. */
static void xs_discard(xs *x)
{
    size_t n;
    smtpe_server_send_buf(x->s, &n);
    assert_int_equal(smtpe_server_send_ack(x->s, n), 0);
}

/* Feeds text until it is consumed, accepting every verdict, and returns the output it caused
 * (valid until the next call). Events other than those needing a verdict are dropped. */
static const char *xs_talk(xs *x, const char *text)
{
    size_t len = strlen(text), off = 0, start;
    smtpe_event ev;
    start = x->out_len; /* output queued before the call counts too */
    for (int spins = 0; spins < 100000; spins++) {
        ssize_t r = smtpe_server_recv(x->s, (const uint8_t *)text + off, len - off, 0);
        assert_true(r >= 0);
        off += (size_t)r;
        while (smtpe_server_next_event(x->s, &ev))
            if (smtpe_event_needs_reply(&ev))
                assert_int_equal(smtpe_server_accept(x->s), 0);
        xs_drain(x);
        if (off == len || (smtpe_server_want(x->s) & (SMTPE_WANT_CLOSE | SMTPE_WANT_TLS |
                                                       SMTPE_WANT_VERDICT)))
            break;
    }
    return x->out + start;
}

/* Feeds text and returns the next event (which must come). */
static smtpe_event xs_event(xs *x, const char *text)
{
    smtpe_event ev;
    ssize_t r = smtpe_server_recv(x->s, (const uint8_t *)text, strlen(text), 0);
    assert_true(r >= 0);
    assert_int_equal(smtpe_server_next_event(x->s, &ev), 1);
    return ev;
}

static int contains(const void *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp((const char *)hay + i, needle, k) == 0)
            return 1;
    return 0;
}

/* ---- STARTTLS ------------------------------------------------------------------------------ */

static void with_starttls(smtpe_server_config *c)
{
    c->extensions |= SMTPE_EXT_STARTTLS | SMTPE_EXT_REQUIRETLS;
}

static void test_tls_started_states(void **state)
{
    (void)state;
    xs *x = xs_new(with_starttls);
    smtpe_server_stats st;
    smtpe_event ev;
    assert_int_equal(smtpe_server_tls_started(NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_string_equal(xs_talk(x, "EHLO c\r\n"),
                        "220 mx.example ESMTP smtpe\r\n250-mx.example\r\n250-PIPELINING\r\n"
                        "250-SIZE 10485760\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n"
                        "250-ENHANCEDSTATUSCODES\r\n250 STARTTLS\r\n");
    /* the session is under way and no handshake was asked for */
    assert_int_equal(smtpe_server_tls_started(x->s, 0), SMTPE_ERR_STATE);
    ev = xs_event(x, "STARTTLS\r\nMAIL FROM:<a@example.org>\r\n");
    assert_int_equal(ev.type, SMTPE_EV_STARTTLS);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    /* the whole truth: what was read before the handshake is to be fed (and is discarded) */
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_TLS);
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_READ);
    assert_int_equal(smtpe_server_expiry(x->s, 0), UINT64_MAX);
    /* the 220 is not sent yet: TLS cannot be up */
    assert_int_equal(smtpe_server_tls_started(x->s, 5), SMTPE_ERR_STATE);
    xs_drain(x);
    assert_true(contains(x->out, x->out_len, "220 2.0.0 Ready to start TLS\r\n"));
    /* what was read before the handshake is consumed and discarded, whatever it is */
    assert_int_equal(smtpe_server_recv(x->s, (const uint8_t *)"MAIL FROM:<a@example.org>\r\n",
                                       27, 0), 27);
    assert_int_equal(smtpe_server_next_event(x->s, &ev), 0);
    assert_int_equal(smtpe_server_tls_started(x->s, 10), 0);
    smtpe_server_get_stats(x->s, &st);
    assert_int_equal(st.discarded_octets, 27);
    assert_int_equal(st.tls, 1);
    assert_int_equal(smtpe_server_tls_started(x->s, 10), SMTPE_ERR_STATE);
    /* a fresh session: no greeting, HELO needed, no STARTTLS offered, REQUIRETLS offered */
    assert_string_equal(xs_talk(x, "MAIL FROM:<a@example.org>\r\n"),
                        "503 5.5.1 Send HELO or EHLO first\r\n");
    {
        const char *ehlo = xs_talk(x, "EHLO c\r\n");
        assert_true(contains(ehlo, strlen(ehlo), "250 REQUIRETLS\r\n"));
        assert_false(contains(ehlo, strlen(ehlo), "STARTTLS"));
    }
    assert_string_equal(xs_talk(x, "STARTTLS\r\n"), "503 5.5.1 TLS already active\r\n");
    free(x);
}

static void test_tls_implicit(void **state)
{
    (void)state;
    xs *x = xs_new(with_starttls);
    smtpe_server_stats st;
    assert_int_equal(smtpe_server_tls_started(x->s, 0), 0); /* port 465: TLS before anything */
    smtpe_server_get_stats(x->s, &st);
    assert_int_equal(st.tls, 1);
    assert_false(contains(xs_talk(x, "EHLO c\r\n"), 400, "STARTTLS"));
    free(x);
}

static void test_tls_refused_stays_plain(void **state)
{
    (void)state;
    xs *x = xs_new(with_starttls);
    smtpe_event ev;
    xs_talk(x, "EHLO c\r\n");
    ev = xs_event(x, "STARTTLS\r\n");
    assert_int_equal(ev.type, SMTPE_EV_STARTTLS);
    assert_int_equal(smtpe_server_reply(x->s, 250, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(x->s, 454, "4.7.0", "TLS not available"), 0);
    assert_false(smtpe_server_want(x->s) & SMTPE_WANT_TLS);
    assert_string_equal(xs_talk(x, "NOOP\r\n"), "454 4.7.0 TLS not available\r\n250 2.0.0 Ok\r\n");
    free(x);
}

/* ---- AUTH ---------------------------------------------------------------------------------- */

static void with_auth(smtpe_server_config *c)
{
    c->auth_mechanisms = "PLAIN LOGIN X-TOKEN";
    c->auth_without_tls = 1;
}

/* AUTH, and an error limit (the session copies its config when it is created). */
static void with_auth_two_errors(smtpe_server_config *c)
{
    with_auth(c);
    c->max_errors = 2;
}

static void with_auth_one_error(smtpe_server_config *c)
{
    with_auth(c);
    c->max_errors = 1;
}

static void test_auth_challenge(void **state)
{
    (void)state;
    xs *x = xs_new(with_auth);
    uint8_t big[1537];
    smtpe_event ev;
    memset(big, 'z', sizeof big);
    xs_talk(x, "EHLO c\r\n");
    assert_int_equal(smtpe_server_auth_challenge(x->s, big, 1), SMTPE_ERR_STATE);
    ev = xs_event(x, "AUTH X-TOKEN\r\n");
    assert_int_equal(ev.type, SMTPE_EV_AUTH);
    assert_int_equal(ev.auth.mechanism_id, SMTPE_SASL_OTHER);
    assert_int_equal(ev.auth.has_response, 0);
    assert_int_equal(ev.auth.step, 0);
    assert_int_equal(smtpe_server_auth_challenge(x->s, NULL, 3), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_auth_challenge(x->s, big, 1537), SMTPE_ERR_REPLY_TOO_LONG);
    assert_int_equal(smtpe_server_reply(x->s, 334, NULL, "abc"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_auth_challenge(x->s, big, 1536), 0);
    xs_drain(x);
    assert_int_equal(x->out_len - (size_t)(strstr(x->out, "334 ") - x->out), 4 + 2048 + 2);
    ev = xs_event(x, "eHl6\r\n"); /* "xyz" */
    assert_int_equal(ev.type, SMTPE_EV_AUTH);
    assert_int_equal(ev.auth.step, 1);
    assert_int_equal(ev.auth.has_response, 1);
    assert_int_equal(ev.auth.response.len, 3);
    assert_memory_equal(ev.auth.response.ptr, "xyz", 3);
    assert_int_equal(smtpe_server_auth_challenge(x->s, NULL, 0), 0);
    xs_drain(x);
    assert_true(contains(x->out, x->out_len, "334 \r\n"));
    ev = xs_event(x, "\r\n"); /* an empty response */
    assert_int_equal(ev.auth.step, 2);
    assert_int_equal(ev.auth.response.len, 0);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    assert_true(contains(xs_talk(x, ""), 200, "235 2.7.0 Authentication successful\r\n"));
    free(x);
}

static void test_auth_credentials_wiped(void **state)
{
    (void)state;
    static const char *const sessions[] = {
        "AUTH PLAIN AGFsaWNlAHNlY3JldC1wYXNzd29yZA==\r\n",       /* \0alice\0secret-password */
        "AUTH LOGIN YWxpY2U=\r\nc2VjcmV0LXBhc3N3b3Jk\r\n",        /* alice / secret-password */
        "AUTH PLAIN\r\nAGFsaWNlAHNlY3JldC1wYXNzd29yZA==\r\n",
    };
    for (size_t i = 0; i < 3; i++) {
        xs *x = xs_new(with_auth);
        smtpe_event ev;
        size_t len = strlen(sessions[i]), off = 0;
        xs_talk(x, "EHLO c\r\n");
        for (;;) {
            ssize_t r = smtpe_server_recv(x->s, (const uint8_t *)sessions[i] + off, len - off, 0);
            off += (size_t)r;
            xs_drain(x);
            if (smtpe_server_next_event(x->s, &ev))
                break;
            assert_true(r > 0);
        }
        assert_int_equal(ev.type, SMTPE_EV_AUTH);
        assert_int_equal(ev.auth.password.len, 15);
        assert_memory_equal(ev.auth.password.ptr, "secret-password", 15);
        assert_memory_equal(ev.auth.authcid.ptr, "alice", 5);
        assert_true(contains(x->mem, sizeof x->mem, "secret-password"));
        assert_int_equal(smtpe_server_reply(x->s, 535, "5.7.8", "Authentication credentials invalid"), 0);
        /* neither the password nor the user name stays in session memory */
        assert_false(contains(x->mem, sizeof x->mem, "secret-password"));
        assert_false(contains(x->mem, sizeof x->mem, "alice"));
        free(x);
    }
}

static void test_auth_failures_count_as_errors(void **state)
{
    (void)state;
    xs *x = xs_new(with_auth_two_errors);
    smtpe_event ev;
    xs_talk(x, "EHLO c\r\n");
    for (int i = 0; i < 3; i++) {
        ev = xs_event(x, "AUTH PLAIN AGEAYg==\r\n");
        assert_int_equal(ev.type, SMTPE_EV_AUTH);
        assert_int_equal(smtpe_server_reply(x->s, 535, "5.7.8", "Authentication credentials invalid"), 0);
    }
    xs_drain(x);
    assert_true(contains(x->out, x->out_len, "421 4.7.0 mx.example Too many errors\r\n"));
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_CLOSE);
    free(x);
}

/* ---- config and memory ----------------------------------------------------------------------- */

static void test_config_auth_mechanisms(void **state)
{
    (void)state;
    static const char *const bad[] = {"", " PLAIN", "PLAIN ", "PLAIN  LOGIN", "plain",
                                      "ABCDEFGHIJKLMNOPQRSTU", "PLA\tIN"};
    smtpe_server_config c;
    smtpe_server *s = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        smtpe_server_config_init(&c);
        c.auth_mechanisms = bad[i];
        assert_int_equal(smtpe_server_memory_size(&c), 0);
        assert_int_equal(smtpe_server_new(&s, &c, NULL, 0), SMTPE_ERR_CONFIG);
    }
    smtpe_server_config_init(&c);
    c.auth_mechanisms = "PLAIN LOGIN SCRAM-SHA-256 X_Y ABCDEFGHIJKLMNOPQRST";
    assert_true(smtpe_server_memory_size(&c) > 0);
}

static void test_memory_formula(void **state)
{
    (void)state;
    smtpe_server_config c;
    size_t base, lmtp;
    smtpe_server_config_init(&c);
    base = smtpe_server_memory_size(&c);
    assert_true(base > 510 + 4096 && base < 510 + 4096 + 2048);
    c.lmtp = 1;
    lmtp = smtpe_server_memory_size(&c);
    assert_int_equal(lmtp - base, 512 * c.max_recipients);
    c.max_recipients = 1000;
    assert_int_equal(smtpe_server_memory_size(&c) - base, 512 * 1000);
}

/* ---- LMTP ------------------------------------------------------------------------------------ */

static void with_lmtp(smtpe_server_config *c)
{
    c->lmtp = 1;
}

static void test_lmtp_verdicts(void **state)
{
    (void)state;
    xs *x = xs_new(with_lmtp);
    smtpe_event ev;
    xs_talk(x, "LHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.org>\r\n"
               "RCPT TO:<c@example.org>\r\nRCPT TO:<d@example.org>\r\nDATA\r\n");
    ev = xs_event(x, ".\r\n");
    assert_int_equal(ev.type, SMTPE_EV_DATA_END);
    assert_int_equal(ev.data_end.replies, 3);
    assert_int_equal(smtpe_server_reply(x->s, 250, "2.1.5", "b ok"), 0);
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_VERDICT);
    assert_int_equal(smtpe_server_reply(x->s, 452, "4.2.2", "c over\nquota"),
                     SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(x->s, 452, "4.2.2", "c over quota"), 0);
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_VERDICT);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    assert_false(smtpe_server_want(x->s) & SMTPE_WANT_VERDICT);
    assert_int_equal(smtpe_server_accept(x->s), SMTPE_ERR_STATE);
    assert_true(contains(xs_talk(x, "NOOP\r\n"), 400, "250 2.1.5 b ok\r\n452 4.2.2 c over quota\r\n"
                                                      "250 2.0.0 Ok\r\n250 2.0.0 Ok\r\n"));
    free(x);
}

static void test_lmtp_many_recipients_fit(void **state)
{
    (void)state;
    xs *x = xs_new(with_lmtp);
    char rcpt[64];
    smtpe_event ev;
    char text[400];
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = 0;
    xs_talk(x, "LHLO c\r\nMAIL FROM:<a@example.org>\r\n");
    for (unsigned i = 0; i < x->cfg.max_recipients; i++) {
        snprintf(rcpt, sizeof rcpt, "RCPT TO:<r%u@example.org>\r\n", i);
        xs_talk(x, rcpt);
    }
    xs_talk(x, "DATA\r\n");
    ev = xs_event(x, ".\r\n");
    assert_int_equal(ev.type, SMTPE_EV_DATA_END);
    assert_int_equal(ev.data_end.replies, x->cfg.max_recipients);
    /* every recipient's longest one-line reply fits without the host sending anything */
    for (unsigned i = 0; i < x->cfg.max_recipients; i++)
        assert_int_equal(smtpe_server_reply(x->s, 250, "2.0.0", text), 0);
    free(x);
}

/* ---- PROXY, XCLIENT ------------------------------------------------------------------------ */

static void with_proxy(smtpe_server_config *c)
{
    c->proxy_protocol = 1;
}

static void test_proxy_verdicts(void **state)
{
    (void)state;
    xs *x = xs_new(with_proxy);
    smtpe_event ev;
    size_t n;
    smtpe_server_send_buf(x->s, &n);
    assert_int_equal(n, 0); /* no greeting before the header */
    ev = xs_event(x, "PROXY TCP6 2001:db8::1 2001:db8::2 40000 25\r\n");
    assert_int_equal(ev.type, SMTPE_EV_PROXY);
    assert_int_equal(ev.proxy.family, SMTPE_PROXY_AF_INET6);
    assert_int_equal(ev.proxy.src_port, 40000);
    assert_int_equal(ev.proxy.src_addr[0], 0x20);
    assert_int_equal(ev.proxy.src_addr[15], 1);
    assert_int_equal(smtpe_server_reply(x->s, 250, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(x->s, 220, NULL, "Welcome"), 0);
    xs_drain(x);
    assert_string_equal(x->out, "220 mx.example Welcome\r\n");
    free(x);

    x = xs_new(with_proxy);
    ev = xs_event(x, "PROXY TCP4 192.0.2.1 192.0.2.2 1 2\r\n");
    assert_int_equal(smtpe_server_reply(x->s, 554, "5.7.1", "Blocked"), 0);
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_CLOSE);
    xs_drain(x);
    assert_string_equal(x->out, "554 5.7.1 Blocked\r\n");
    free(x);

    x = xs_new(with_proxy);
    ev = xs_event(x, "EHLO c\r\n");
    assert_int_equal(ev.type, SMTPE_EV_PROXY_INVALID);
    assert_false(smtpe_event_needs_reply(&ev));
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_CLOSE);
    smtpe_server_send_buf(x->s, &n);
    assert_int_equal(n, 0);
    free(x);
}

static void with_xclient(smtpe_server_config *c)
{
    c->extensions |= SMTPE_EXT_XCLIENT | SMTPE_EXT_XFORWARD;
}

static void test_trusted(void **state)
{
    (void)state;
    xs *x = xs_new(with_xclient);
    smtpe_event ev;
    assert_int_equal(smtpe_server_set_trusted(NULL, 1), SMTPE_ERR_INVALID_ARGUMENT);
    assert_false(contains(xs_talk(x, "EHLO c\r\n"), 400, "XCLIENT"));
    assert_string_equal(xs_talk(x, "XCLIENT ADDR=192.0.2.9\r\n"),
                        "550 5.7.0 Insufficient authorization\r\n");
    assert_int_equal(smtpe_server_set_trusted(x->s, 1), 0);
    assert_true(contains(xs_talk(x, "EHLO c\r\n"), 600, "XFORWARD NAME ADDR"));
    ev = xs_event(x, "XCLIENT ADDR=192.0.2.9 NAME=mail+2Eexample.org\r\n");
    assert_int_equal(ev.type, SMTPE_EV_XCLIENT);
    assert_int_equal(ev.xclient.count, 2);
    assert_int_equal(ev.xclient.attrs[1].value.len, 16);
    assert_memory_equal(ev.xclient.attrs[1].value.ptr, "mail.example.org", 16);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    /* a new greeting, and the session starts over (the trust stays) */
    assert_string_equal(xs_talk(x, "MAIL FROM:<a@example.org>\r\n"),
                        "220 mx.example ESMTP smtpe\r\n503 5.5.1 Send HELO or EHLO first\r\n");
    assert_true(contains(xs_talk(x, "EHLO c\r\n"), 600, "XCLIENT NAME"));
    free(x);
}

/* ---- BDAT ------------------------------------------------------------------------------------ */

static void with_chunking(smtpe_server_config *c)
{
    c->extensions |= SMTPE_EXT_CHUNKING;
}

static void test_bdat_end_without_more_input(void **state)
{
    (void)state;
    xs *x = xs_new(with_chunking);
    const char *in = "BDAT 5 LAST\r\nhello";
    smtpe_event ev;
    size_t off = 0, len = strlen(in);
    int saw_end = 0;
    xs_talk(x, "EHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.org>\r\n");
    /* K16: the chunk's last octet is the last octet the client sends; the end of data must
     * come out of the events of that same feed */
    while (off < len) {
        ssize_t r = smtpe_server_recv(x->s, (const uint8_t *)in + off, len - off, 0);
        off += (size_t)r;
        while (smtpe_server_next_event(x->s, &ev)) {
            if (ev.type == SMTPE_EV_DATA_END) {
                saw_end = 1;
                assert_int_equal(ev.data_end.chunked, 1);
                assert_int_equal(ev.data_end.size, 5);
                assert_int_equal(smtpe_server_reply(x->s, 250, "2.0.0", "Ok: queued as X"), 0);
            }
        }
    }
    assert_true(saw_end);
    xs_drain(x);
    assert_true(contains(x->out, x->out_len, "250 2.1.5 Ok\r\n250 2.0.0 Ok: queued as X\r\n"));
    free(x);
}


static void test_auth_wiped_when_refusal_closes(void **state)
{
    (void)state;
    xs *x = xs_new(with_auth_one_error);
    smtpe_event ev;
    xs_talk(x, "EHLO c\r\nAUTH X\r\n"); /* 504: the first error */
    ev = xs_event(x, "AUTH PLAIN AGFsaWNlAHNlY3JldC1wYXNzd29yZA==\r\n");
    assert_int_equal(ev.type, SMTPE_EV_AUTH);
    /* the 535 is the error past the limit: the session closes with 421 */
    assert_int_equal(smtpe_server_reply(x->s, 535, "5.7.8", "Authentication credentials invalid"), 0);
    assert_true(smtpe_server_want(x->s) & SMTPE_WANT_CLOSE);
    assert_false(contains(x->mem, sizeof x->mem, "secret-password"));
    assert_false(contains(x->mem, sizeof x->mem, "alice"));
    free(x);
}

static void test_auth_wiped_on_timeout(void **state)
{
    (void)state;
    xs *x = xs_new(with_auth);
    xs_talk(x, "EHLO c\r\nAUTH LOGIN\r\nYWxpY2UtdGhlLXVzZXI=\r\n"); /* alice-the-user */
    assert_true(contains(x->mem, sizeof x->mem, "alice-the-user"));
    assert_int_equal(smtpe_server_handle_expiry(x->s, 0), 0); /* restart the timer at 0 */
    assert_int_equal(smtpe_server_handle_expiry(x->s, 300000), 1);
    assert_false(contains(x->mem, sizeof x->mem, "alice-the-user"));
    free(x);
}

static void with_lmtp_small(smtpe_server_config *c)
{
    c->lmtp = 1;
    c->reply_buffer_size = 2048;
}

/* A host that sends nothing while 100 recipients get long replies: the engine must not read the
 * end of the content until there is room for 100 more reply lines, so that every per-recipient
 * verdict fits once the host sends what is queued. */
static void test_lmtp_room_kept_for_verdicts(void **state)
{
    (void)state;
    xs *x = xs_new(with_lmtp_small);
    char text[401], line[64];
    smtpe_event ev;
    const char *dot = ".\r\n";
    size_t got = 0;
    memset(text, 'y', 400);
    text[400] = 0;
    assert_int_equal(smtpe_server_recv(x->s, (const uint8_t *)"LHLO c\r\n", 8, 0), 8);
    assert_int_equal(smtpe_server_next_event(x->s, &ev), 1);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    xs_discard(x);
    assert_int_equal(smtpe_server_recv(x->s, (const uint8_t *)"MAIL FROM:<a@b.example>\r\n", 25, 0), 25);
    assert_int_equal(smtpe_server_next_event(x->s, &ev), 1);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    for (unsigned i = 0; i < 100; i++) {
        int n = snprintf(line, sizeof line, "RCPT TO:<r%u@b.example>\r\n", i);
        size_t off = 0;
        while (off < (size_t)n) {
            ssize_t r = smtpe_server_recv(x->s, (const uint8_t *)line + off, (size_t)n - off, 0);
            off += (size_t)r;
            if (smtpe_server_next_event(x->s, &ev)) {
                assert_int_equal(smtpe_server_reply(x->s, 250, "2.1.5", text), 0);
            } else if (r == 0) {
                xs_discard(x); /* the engine waits for the host to send */
            }
        }
    }
    assert_int_equal(smtpe_server_recv(x->s, (const uint8_t *)"DATA\r\n", 6, 0), 6);
    assert_int_equal(smtpe_server_next_event(x->s, &ev), 1);
    assert_int_equal(smtpe_server_accept(x->s), 0);
    /* unsent replies fill the buffer: the end of the content waits for room */
    while (got < 3) {
        ssize_t r = smtpe_server_recv(x->s, (const uint8_t *)dot + got, 3 - got, 0);
        assert_true(r >= 0);
        got += (size_t)r;
        if (smtpe_server_next_event(x->s, &ev))
            break;
        if (r == 0) {
            assert_false(smtpe_server_want(x->s) & SMTPE_WANT_READ);
            xs_discard(x);
        }
    }
    assert_int_equal(ev.type, SMTPE_EV_DATA_END);
    assert_int_equal(ev.data_end.replies, 100);
    for (unsigned i = 0; i < 100; i++)
        assert_int_equal(smtpe_server_reply(x->s, 250, "2.0.0", text), 0);
    free(x);
}

static void test_xclient_long_greeting(void **state)
{
    (void)state;
    xs *x = xs_new(with_xclient);
    char text[900];
    smtpe_event ev;
    memset(text, 'g', sizeof text - 1);
    text[sizeof text - 1] = 0;
    text[300] = text[600] = '\n';
    smtpe_server_set_trusted(x->s, 1);
    xs_talk(x, "EHLO c\r\n");
    xs_drain(x);
    ev = xs_event(x, "XCLIENT ADDR=192.0.2.9\r\n");
    assert_int_equal(ev.type, SMTPE_EV_XCLIENT);
    assert_int_equal(smtpe_server_reply(x->s, 220, NULL, text), 0);
    {
        size_t before = x->out_len;
        xs_drain(x);
        /* three lines, none cut: "220-mx.example " + 300, "220-" + 299, "220 " + 298 */
        assert_int_equal(x->out_len - before, 15 + 300 + 2 + 4 + 299 + 2 + 4 + 298 + 2);
    }
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls_started_states),
        cmocka_unit_test(test_tls_implicit),
        cmocka_unit_test(test_tls_refused_stays_plain),
        cmocka_unit_test(test_auth_challenge),
        cmocka_unit_test(test_auth_credentials_wiped),
        cmocka_unit_test(test_auth_failures_count_as_errors),
        cmocka_unit_test(test_auth_wiped_when_refusal_closes),
        cmocka_unit_test(test_auth_wiped_on_timeout),
        cmocka_unit_test(test_lmtp_room_kept_for_verdicts),
        cmocka_unit_test(test_xclient_long_greeting),
        cmocka_unit_test(test_config_auth_mechanisms),
        cmocka_unit_test(test_memory_formula),
        cmocka_unit_test(test_lmtp_verdicts),
        cmocka_unit_test(test_lmtp_many_recipients_fit),
        cmocka_unit_test(test_proxy_verdicts),
        cmocka_unit_test(test_trusted),
        cmocka_unit_test(test_bdat_end_without_more_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
