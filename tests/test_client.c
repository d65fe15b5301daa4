/*
 * test_client.c - unit tests of the client engine (engine/client.c) against scripted servers:
 * the cases of ../shared/conformance/client-cases.md (Q01-Q14) and the rules of the API
 * (include/smtpe.h, "Client engine"). Every scenario runs three times, the server's octets fed
 * whole, one octet at a time and in pseudo-random splits, and must give the same client octets
 * and the same events each time (split invariance).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_harness.h"
#include "smtpe.h"

#define GREET "220 mx.example ESMTP\r\n"
/* CAPS of client-cases.md */
#define CAPS                                                                                   \
    "250-mx.example\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SIZE 10485760\r\n"                \
    "250 ENHANCEDSTATUSCODES\r\n"
#define CAPS_NOPIPE "250-mx.example\r\n250-8BITMIME\r\n250 ENHANCEDSTATUSCODES\r\n"
#define EHLO "EHLO client.example\r\n"

static const char *const ONE[] = {"bob@example.org"};
static const char *const THREE[] = {"a@example.org", "b@example.org", "c@example.org"};

static const uint8_t MSG[] = "Subject: t\r\n\r\nhello\r\n";

#define OUT(h, s) assert_string_equal(ch_take_out(h), s)
#define LOG(h, s) assert_string_equal(ch_take_log(h), s)

typedef void scenario(ch *h);

/* Runs sc under each split mode. */
static void run3(scenario *sc)
{
    for (int split = CH_WHOLE; split <= CH_RANDOM; split++) {
        ch h;
        ch_init(&h);
        h.split = split;
        h.content = MSG;
        h.content_len = sizeof MSG - 1;
        sc(&h);
        ch_free(&h);
    }
}

static void open_ok(ch *h)
{
    assert_int_equal(ch_open(h), 0);
    ch_pump(h);
}

/* ---- a plain session ------------------------------------------------------------------- */

static void sc_pipelined(ch *h)
{
    open_ok(h);
    assert_int_equal(ch_submit(h, "alice@example.com", ONE, 1), 0);
    OUT(h, "");
    ch_server(h, GREET);
    OUT(h, EHLO);
    ch_server(h, CAPS);
    LOG(h, "READY ext=0x17 size=10485760 auth= tls=0 auth_ok=0\n");
    /* RFC 2920: MAIL, RCPT and DATA in one group */
    OUT(h, "MAIL FROM:<alice@example.com>\r\nRCPT TO:<bob@example.org>\r\nDATA\r\n");
    ch_server(h, "250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n");
    LOG(h, "CONTENT\n");
    OUT(h, "Subject: t\r\n\r\nhello\r\n.\r\n");
    ch_server(h, "250 2.0.0 queued as X\r\n");
    LOG(h, "OUTCOME 0 delivered 250 2.0.0 queued as X\nDONE 1/0/0/0 reusable\n");
    assert_int_equal(smtpe_client_quit(h->c), 0);
    ch_pump(h);
    OUT(h, "QUIT\r\n");
    ch_server(h, "221 2.0.0 bye\r\n");
    LOG(h, "CLOSED quit 221 bye\n");
    assert_true(smtpe_client_want(h->c) & SMTPE_WANT_CLOSE);
}

static void test_pipelined(void **st)
{
    (void)st;
    run3(sc_pipelined);
}

static void sc_no_pipelining(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    OUT(h, EHLO);
    ch_server(h, CAPS_NOPIPE);
    ch_take_log(h);
    assert_int_equal(ch_submit(h, "", THREE, 3), 0);
    OUT(h, "MAIL FROM:<>\r\n"); /* one command per reply */
    ch_server(h, "250 ok\r\n");
    OUT(h, "RCPT TO:<a@example.org>\r\n");
    ch_server(h, "550 5.1.1 no such user\r\n");
    LOG(h, "OUTCOME 0 permanent 550 5.1.1 no such user\n");
    OUT(h, "RCPT TO:<b@example.org>\r\n");
    ch_server(h, "250 ok\r\n");
    OUT(h, "RCPT TO:<c@example.org>\r\n");
    ch_server(h, "451 4.3.0 try later\r\n");
    LOG(h, "OUTCOME 2 temporary 451 4.3.0 try later\n");
    OUT(h, "DATA\r\n");
    ch_server(h, "354 go\r\n");
    OUT(h, "Subject: t\r\n\r\nhello\r\n.\r\n");
    ch_server(h, "250 ok\r\n");
    LOG(h, "CONTENT\nOUTCOME 1 delivered 250 - ok\nDONE 1/1/1/0 reusable\n");
}

static void test_no_pipelining(void **st)
{
    (void)st;
    run3(sc_no_pipelining);
}

/* ---- Q04, Q05: pipelined group with refusals ----------------------------------------------- */

static void sc_q04(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_take_out(h);
    ch_take_log(h);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_take_out(h);
    ch_server(h, "250 ok\r\n550 5.1.1 unknown\r\n503 5.5.1 no valid recipients\r\n");
    LOG(h, "OUTCOME 0 permanent 550 5.1.1 unknown\nDONE 0/1/0/0 reusable\n");
    OUT(h, ""); /* no content */
    ch_submit(h, "a@example.com", ONE, 1);
    OUT(h, "RSET\r\nMAIL FROM:<a@example.com>\r\nRCPT TO:<bob@example.org>\r\nDATA\r\n");
    ch_server(h, "250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n");
    OUT(h, "Subject: t\r\n\r\nhello\r\n.\r\n");
}

static void test_q04_refused_rcpt_then_503(void **st)
{
    (void)st;
    run3(sc_q04);
}

static void sc_q05(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_take_out(h);
    ch_take_log(h);
    ch_submit(h, "a@example.com", THREE, 3);
    ch_take_out(h);
    ch_server(h, "250 ok\r\n550 no\r\n551 no\r\n552 no\r\n354 go ahead\r\n");
    OUT(h, ".\r\n"); /* a lone dot and nothing else */
    ch_server(h, "554 5.5.1 no valid recipients\r\n");
    LOG(h, "OUTCOME 0 permanent 550 - no\nOUTCOME 1 permanent 551 - no\n"
           "OUTCOME 2 permanent 552 - no\nDONE 0/3/0/0 reusable\n");
    OUT(h, "");
}

static void test_q05_lone_dot(void **st)
{
    (void)st;
    run3(sc_q05);
}

/* ---- Q06: 421 at every stage ------------------------------------------------------------- */

static int q06_stage;

static void sc_q06(ch *h)
{
    const char *const script[] = {GREET, CAPS, "250 ok\r\n", "250 ok\r\n", "354 go\r\n"};
    open_ok(h);
    ch_submit(h, "a@example.com", ONE, 1);
    for (int i = 0; i < q06_stage; i++)
        ch_server(h, script[i]);
    ch_take_out(h);
    ch_take_log(h);
    ch_server(h, "421 4.3.2 shutting down\r\n");
    if (q06_stage <= 1) /* enhanced codes are parsed once EHLO said ENHANCEDSTATUSCODES */
        LOG(h, "OUTCOME 0 temporary 421 - 4.3.2 shutting down\nDONE 0/0/1/0\n"
               "CLOSED 421 421 4.3.2 shutting down\n");
    else
        LOG(h, "OUTCOME 0 temporary 421 4.3.2 shutting down\nDONE 0/0/1/0\n"
               "CLOSED 421 421 shutting down\n");
    OUT(h, ""); /* no HELO fallback, no QUIT */
    assert_true(smtpe_client_want(h->c) & SMTPE_WANT_CLOSE);
}

static void test_q06_421_every_stage(void **st)
{
    (void)st;
    for (q06_stage = 0; q06_stage <= 5; q06_stage++)
        run3(sc_q06);
}

/* ---- Q07: LMTP, one reply per accepted recipient ------------------------------------------ */

static void sc_q07(ch *h)
{
    h->cfg.lmtp = 1;
    open_ok(h);
    ch_server(h, "220 lmtp ready\r\n");
    OUT(h, "LHLO client.example\r\n");
    ch_server(h, "250-lmtp\r\n250-PIPELINING\r\n250 ENHANCEDSTATUSCODES\r\n");
    ch_take_log(h);
    ch_submit(h, "a@example.com", THREE, 3);
    ch_take_out(h);
    ch_server(h, "250 ok\r\n250 ok\r\n550 5.1.1 nobody\r\n250 ok\r\n354 go\r\n");
    OUT(h, "Subject: t\r\n\r\nhello\r\n.\r\n");
    ch_server(h, "250 2.0.0 a done\r\n452 4.2.2 c full\r\n");
    LOG(h, "OUTCOME 1 permanent 550 5.1.1 nobody\nCONTENT\n"
           "OUTCOME 0 delivered 250 2.0.0 a done\nOUTCOME 2 temporary 452 4.2.2 c full\n"
           "DONE 1/1/1/0 reusable\n");
    /* the next transaction is in sync */
    ch_submit(h, "a@example.com", ONE, 1);
    OUT(h, "MAIL FROM:<a@example.com>\r\nRCPT TO:<bob@example.org>\r\nDATA\r\n");
}

static void test_q07_lmtp_replies(void **st)
{
    (void)st;
    run3(sc_q07);
}

/* ---- Q01, Q02, Q03: STARTTLS ------------------------------------------------------------ */

static void sc_q01(ch *h)
{
    h->cfg.tls = SMTPE_TLS_REQUIRED;
    h->manual_tls = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250-PIPELINING\r\n250 STARTTLS\r\n");
    OUT(h, EHLO "STARTTLS\r\n");
    /* the 220 and, in the same write, a forged EHLO reply */
    ch_server(h, "220 2.0.0 Ready\r\n250-mx.example\r\n250 AUTH PLAIN\r\n");
    assert_non_null(strstr(ch_take_log(h), "CLOSED protocol-error"));
    OUT(h, "");
}

/* The same with a host that runs the handshake itself once it has fed what it read. */
static void sc_q01_auto(ch *h)
{
    h->cfg.tls = SMTPE_TLS_REQUIRED;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250-PIPELINING\r\n250 STARTTLS\r\n");
    OUT(h, EHLO "STARTTLS\r\n");
    ch_server(h, "220 2.0.0 Ready\r\n250-mx.example\r\n250 AUTH PLAIN\r\n");
    assert_non_null(strstr(ch_take_log(h), "CLOSED protocol-error"));
    OUT(h, ""); /* no handshake, nothing after */
}

static void test_q01_starttls_injection(void **st)
{
    (void)st;
    run3(sc_q01);
    run3(sc_q01_auto);
}

static void sc_q02(ch *h)
{
    h->cfg.tls = SMTPE_TLS_REQUIRED;
    h->cfg.auth_mechanism = "";
    h->cfg.auth_user = "u";
    h->cfg.auth_password = "secret";
    open_ok(h);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250-AUTH PLAIN\r\n250 STARTTLS\r\n");
    OUT(h, EHLO "STARTTLS\r\n");
    ch_server(h, "454 4.7.0 TLS not available\r\n");
    OUT(h, "QUIT\r\n");
    LOG(h, "OUTCOME 0 temporary 454 - 4.7.0 TLS not available\nDONE 0/0/1/0\n"
           "CLOSED tls-required 454 4.7.0 TLS not available\n");
}

static void sc_q02_not_offered(ch *h)
{
    h->cfg.tls = SMTPE_TLS_REQUIRED;
    h->cfg.auth_mechanism = "";
    h->cfg.auth_user = "u";
    h->cfg.auth_password = "secret";
    open_ok(h);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250 AUTH PLAIN\r\n");
    OUT(h, EHLO "QUIT\r\n");
    assert_non_null(strstr(ch_take_log(h), "OUTCOME 0 temporary 000"));
}

static void test_q02_tls_required(void **st)
{
    (void)st;
    run3(sc_q02);
    run3(sc_q02_not_offered);
}

static void sc_q03(ch *h)
{
    h->cfg.tls = SMTPE_TLS_OPPORTUNISTIC;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250-SIZE 100\r\n250 STARTTLS\r\n");
    OUT(h, EHLO "STARTTLS\r\n");
    ch_server(h, "220 go ahead\r\n");
    OUT(h, "<TLS>" EHLO); /* EHLO first after the handshake */
    ch_server(h, "250-mx.example\r\n250 SIZE 5000\r\n");
    LOG(h, "STARTTLS\nREADY ext=0x2 size=5000 auth= tls=1 auth_ok=0\n");
}

static void test_q03_caps_after_tls(void **st)
{
    (void)st;
    run3(sc_q03);
}

/* ---- Q08, Q09: AUTH ---------------------------------------------------------------------- */

static void sc_q08(ch *h)
{
    h->cfg.auth_mechanism = "LOGIN";
    h->cfg.auth_user = "user";
    h->cfg.auth_password = "pass";
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250 AUTH LOGIN PLAIN\r\n");
    OUT(h, EHLO "AUTH LOGIN\r\n");
    ch_server(h, "334 dXNlcm5hbWU6AA==\r\n"); /* "username:\0", not "Username:" */
    OUT(h, "dXNlcg==\r\n");
    ch_server(h, "334\r\n"); /* an empty prompt */
    OUT(h, "cGFzcw==\r\n");
    ch_server(h, "235 2.7.0 ok\r\n");
    LOG(h, "READY ext=0 size=0 auth=LOGIN PLAIN tls=0 auth_ok=1\n");
}

static void test_q08_login_prompts(void **st)
{
    (void)st;
    run3(sc_q08);
}

static char long_authzid[201], long_password[201];

static void sc_q09(ch *h)
{
    h->cfg.auth_mechanism = "PLAIN";
    h->cfg.auth_user = "user";
    h->cfg.auth_authzid = long_authzid;
    h->cfg.auth_password = long_password;
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250 AUTH PLAIN\r\n");
    /* base64 of 406 octets is 544: the AUTH line would pass 512 */
    const char *out = ch_take_out(h);
    assert_non_null(strstr(out, "AUTH PLAIN\r\n"));
    assert_null(strstr(out, "AUTH PLAIN "));
    ch_server(h, "334 \r\n");
    out = ch_take_out(h);
    assert_int_equal(strlen(out), 544 + 2);
    ch_server(h, "535 5.7.8 bad\r\n");
    assert_non_null(strstr(ch_take_log(h), "CLOSED auth-failed 535 5.7.8 bad"));
    (void)0;
    OUT(h, "QUIT\r\n"); /* no fallback to another mechanism */
}

static void test_q09_initial_response_too_long(void **st)
{
    (void)st;
    memset(long_authzid, 'z', 200);
    memset(long_password, 'p', 200);
    run3(sc_q09);
}

static void sc_plaintext_auth_refused(ch *h)
{
    h->cfg.auth_mechanism = "";
    h->cfg.auth_user = "user";
    h->cfg.auth_password = "pass";
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250 AUTH PLAIN LOGIN\r\n");
    OUT(h, EHLO "QUIT\r\n"); /* no credential octet in clear */
    assert_non_null(strstr(ch_take_log(h), "CLOSED auth-failed"));
}

static void sc_auth_refused(ch *h)
{
    h->cfg.auth_mechanism = "PLAIN";
    h->cfg.auth_user = "u";
    h->cfg.auth_password = "p";
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250-ENHANCEDSTATUSCODES\r\n250 AUTH PLAIN\r\n");
    OUT(h, EHLO "AUTH PLAIN AHUAcA==\r\n");
    ch_server(h, "535 5.7.8 Authentication credentials invalid\r\n");
    /* deferred, not bounced: the credentials may be fixed */
    LOG(h, "OUTCOME 0 temporary 535 5.7.8 Authentication credentials invalid\nDONE 0/0/1/0\n"
           "CLOSED auth-failed 535 Authentication credentials invalid\n");
    OUT(h, "QUIT\r\n");
}

static void test_auth_needs_tls(void **st)
{
    (void)st;
    run3(sc_plaintext_auth_refused);
    run3(sc_auth_refused);
}

static void sc_xoauth2(ch *h)
{
    h->cfg.auth_mechanism = "";
    h->cfg.auth_user = "u@example.com";
    h->cfg.auth_token = "tok";
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250 AUTH PLAIN XOAUTH2\r\n");
    /* base64("user=u@example.com\1auth=Bearer tok\1\1") */
    OUT(h, EHLO "AUTH XOAUTH2 dXNlcj11QGV4YW1wbGUuY29tAWF1dGg9QmVhcmVyIHRvawEB\r\n");
    ch_server(h, "334 eyJzdGF0dXMiOiI0MDEifQ==\r\n");
    OUT(h, "\r\n"); /* the error challenge is answered with an empty line */
    ch_server(h, "535 5.7.8 bad token\r\n");
    OUT(h, "QUIT\r\n");
}

static void test_xoauth2_error(void **st)
{
    (void)st;
    run3(sc_xoauth2);
}

static void sc_host_mechanism(ch *h)
{
    h->cfg.auth_mechanism = "CRAM-MD5";
    h->cfg.auth_plaintext_ok = 1;
    h->auth_steps[0] = NULL;             /* no initial response */
    h->auth_steps[1] = "user 0123abcd"; /* the answer to the challenge */
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250 AUTH CRAM-MD5 PLAIN\r\n");
    OUT(h, EHLO "AUTH CRAM-MD5\r\n");
    LOG(h, "AUTH_STEP 0 \n");
    ch_server(h, "334 PDEyMzQ1QGV4YW1wbGU+\r\n"); /* "<12345@example>" */
    LOG(h, "AUTH_STEP 1 <12345@example>\n");
    OUT(h, "dXNlciAwMTIzYWJjZA==\r\n");
    ch_server(h, "235 2.7.0 ok\r\n");
    LOG(h, "READY ext=0 size=0 auth=CRAM-MD5 PLAIN tls=0 auth_ok=1\n");
}

static void test_host_mechanism(void **st)
{
    (void)st;
    run3(sc_host_mechanism);
}

/* ---- Q10, Q11, Q12, Q13, Q14 ---------------------------------------------------------------- */

static const uint8_t SMUGGLE[] = "a\n.\r\nMAIL FROM:<x@evil>\r\nb\r.\r\nc\r\n.\r\n.d";

static void sc_q10(ch *h)
{
    h->content = SMUGGLE;
    h->content_len = sizeof SMUGGLE - 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_take_out(h);
    ch_server(h, "250 ok\r\n250 ok\r\n354 go\r\n");
    OUT(h, "a\r\n..\r\nMAIL FROM:<x@evil>\r\nb\r\n..\r\nc\r\n..\r\n..d\r\n.\r\n");
}

static void test_q10_smuggling(void **st)
{
    (void)st;
    run3(sc_q10);
}

static void test_q11_bad_arguments(void **st)
{
    (void)st;
    ch h;
    const char *const bad_to[] = {"bob@example.org\r\nRSET"};
    const char *const ok_to[] = {"bob@example.org"};
    ch_init(&h);
    h.cfg.helo_name = "client.example\r\nMAIL FROM:<x>";
    assert_int_equal(ch_open(&h), SMTPE_ERR_INVALID_ARGUMENT);
    h.cfg.helo_name = "client.example";
    h.cfg.auth_mechanism = "PLAIN";
    h.cfg.auth_user = "u\nx";
    h.cfg.auth_password = "p";
    assert_int_equal(ch_open(&h), SMTPE_ERR_INVALID_ARGUMENT);
    {
        static char name[257];
        memset(name, 'a', 256);
        for (int i = 63; i < 256; i += 64)
            name[i] = '.'; /* labels of 63 */
        name[255] = '\0'; /* 255 octets: the longest domain (RFC 5321 §4.5.3.1.2) */
        h.cfg.helo_name = name;
        h.cfg.auth_mechanism = NULL;
        assert_int_equal(ch_open(&h), 0);
        ch_free(&h);
        name[255] = 'a';   /* 256 */
        assert_int_equal(ch_open(&h), SMTPE_ERR_INVALID_ARGUMENT);
        h.cfg.helo_name = "client.example";
        h.cfg.auth_mechanism = "PLAIN";
    }
    h.cfg.auth_user = "u";
    h.cfg.output_buffer_size = 100; /* a limit out of range */
    assert_int_equal(ch_open(&h), SMTPE_ERR_CONFIG);
    h.cfg.output_buffer_size = 16384;
    h.cfg.auth_mechanism = NULL;
    assert_int_equal(ch_open(&h), 0);
    assert_int_equal(ch_submit(&h, "a@example.com", bad_to, 1), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(ch_submit(&h, "a@example.com\r\n", ok_to, 1), SMTPE_ERR_INVALID_ARGUMENT);
    h.txn.envid = "x\ry";
    assert_int_equal(ch_submit(&h, "a@example.com", ok_to, 1), SMTPE_ERR_INVALID_ARGUMENT);
    h.txn.envid = NULL;
    assert_string_equal(ch_take_out(&h), ""); /* no octet exists */
    assert_int_equal(ch_submit(&h, "a@example.com", ok_to, 1), 0);
    ch_free(&h);
}

static void sc_q12(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250-PIPELINING\r\n250 DSN\r\n");
    h->txn.envid = "id+1=2";
    h->txn.ret = SMTPE_RET_HDRS;
    h->txn.reverse_path = "a@example.com";
    h->rcpts[0].forward_path = "a+b=c@example.com";
    h->rcpts[0].notify = SMTPE_NOTIFY_SUCCESS | SMTPE_NOTIFY_FAILURE;
    h->rcpts[0].orcpt = "rfc822;a+b=c@example.com";
    h->txn.rcpts = h->rcpts;
    h->txn.rcpt_count = 1;
    ch_take_out(h);
    assert_int_equal(smtpe_client_submit(h->c, &h->txn), 0);
    ch_pump(h);
    OUT(h, "MAIL FROM:<a@example.com> RET=HDRS ENVID=id+2B1+3D2\r\n"
           "RCPT TO:<a+b=c@example.com> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;a+2Bb+3Dc@example.com\r\n"
           "DATA\r\n");
}

static void test_q12_xtext(void **st)
{
    (void)st;
    run3(sc_q12);
}

static void sc_q13(ch *h)
{
    static uint8_t big[40000];
    memset(big, 'x', sizeof big);
    for (size_t i = 70; i < sizeof big; i += 72) {
        big[i] = '\r';
        big[i + 1] = '\n';
    }
    h->content = big;
    h->content_len = sizeof big;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250-PIPELINING\r\n250-CHUNKING\r\n250 ENHANCEDSTATUSCODES\r\n");
    ch_take_log(h);
    ch_take_out(h);
    ch_submit(h, "a@example.com", ONE, 1);
    const char *out = ch_take_out(h);
    /* MAIL, RCPT and the first BDAT in one group; nothing more before its reply */
    assert_memory_equal(out, "MAIL FROM:<a@example.com>\r\nRCPT TO:<bob@example.org>\r\nBDAT ",
                        strlen("MAIL FROM:<a@example.com>\r\nRCPT TO:<bob@example.org>\r\nBDAT "));
    assert_null(strstr(strstr(out, "BDAT ") + 1, "BDAT "));
    ch_server(h, "250 ok\r\n250 ok\r\n552 5.3.4 too big\r\n");
    LOG(h, "CONTENT\nOUTCOME 0 permanent 552 5.3.4 too big\nDONE 0/1/0/0 reusable\n");
    OUT(h, ""); /* no further BDAT, no LAST */
    ch_submit(h, "a@example.com", ONE, 1);
    out = ch_take_out(h);
    assert_memory_equal(out, "RSET\r\nMAIL FROM:", 16);
}

static void test_q13_bdat_refused(void **st)
{
    (void)st;
    run3(sc_q13);
}

static void sc_q14(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_submit(h, "a@example.com", THREE, 3);
    ch_server(h, "250 ok\r\n250 ok\r\n550 no\r\n250 ok\r\n354 go\r\n");
    ch_take_out(h);
    ch_take_log(h);
    ch_time(h, 599999);
    LOG(h, "");
    ch_time(h, 600000);
    LOG(h, "EXPIRED\nOUTCOME 0 unknown 000 - timed out waiting for the server [local]\n"
           "OUTCOME 2 unknown 000 - timed out waiting for the server [local]\n"
           "DONE 0/1/0/2\nCLOSED timeout 000 timed out waiting for the server\n");
}

static void test_q14_no_reply_to_dot(void **st)
{
    (void)st;
    run3(sc_q14);
}

/* ---- replies that break the protocol ------------------------------------------------------ */

static const char *bad_reply;

static void sc_bad_reply(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_take_out(h);
    ch_take_log(h);
    ch_server(h, bad_reply);
    const char *log = ch_take_log(h);
    if (!strstr(log, "OUTCOME 0 temporary 000"))
        fprintf(stderr, "case %s: %s\n", bad_reply, log);
    assert_non_null(strstr(log, "OUTCOME 0 temporary 000"));
    assert_non_null(strstr(log, "CLOSED protocol-error"));
    OUT(h, "");
}

/* A reply when nothing is outstanding, and a 421 then (RFC 5321 §3.8). */
static void sc_unsolicited(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_take_log(h);
    ch_server(h, "250 surprise\r\n");
    LOG(h, "CLOSED protocol-error 000 a reply with no command outstanding\n");
}

static void sc_unsolicited_421(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_take_log(h);
    ch_server(h, "421 4.4.2 idle too long\r\n");
    LOG(h, "CLOSED 421 421 idle too long\n");
}

static void test_protocol_errors(void **st)
{
    (void)st;
    static const char *const cases[] = {
        "250-ok\r\n251 ok\r\n",              /* lines disagree on the code */
        "150 ok\r\n",                        /* 1xx */
        "2500 ok\r\n",                       /* four digits */
        "250 ok\n",                          /* bare LF */
        "250 ok\r\n354 go\r\n354 again\r\n", /* 354 to a RCPT */
        "334 what\r\n",                      /* 334 to MAIL */
        "250 ok\r\n250 ok\r\n250 data?\r\n", /* 2xx to DATA */
        NULL, /* a line over max_reply_line (made below) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        static char long_line[3000];
        memset(long_line, 'x', sizeof long_line - 3);
        memcpy(long_line, "250 ", 4);
        memcpy(long_line + sizeof long_line - 3, "\r\n", 3);
        bad_reply = cases[i] ? cases[i] : long_line;
        run3(sc_bad_reply);
    }
    run3(sc_unsolicited);
    run3(sc_unsolicited_421);
}

static void sc_helo_fallback(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    OUT(h, EHLO);
    ch_server(h, "502 5.5.2 what\r\n");
    OUT(h, "HELO client.example\r\n");
    ch_server(h, "250 hi\r\n");
    LOG(h, "READY ext=0 size=0 auth= tls=0 auth_ok=0\n");
}

static void sc_greeting_554(ch *h)
{
    open_ok(h);
    ch_submit(h, "a@example.com", ONE, 1);
    ch_server(h, "554 5.7.1 go away\r\n");
    OUT(h, "QUIT\r\n"); /* no EHLO */
    LOG(h, "OUTCOME 0 permanent 554 - 5.7.1 go away\nDONE 0/1/0/0\n"
           "CLOSED refused 554 5.7.1 go away\n");
}

static void test_greeting_and_helo(void **st)
{
    (void)st;
    run3(sc_helo_fallback);
    run3(sc_greeting_554);
}

static void sc_local_refusals(ch *h)
{
    static const uint8_t eight[] = "Subject: caf\xc3\xa9\r\n\r\nx\r\n";
    const char *const utf8_to[] = {"jos\xc3\xa9@example.org"};
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx\r\n250-PIPELINING\r\n250 SIZE 10\r\n");
    ch_take_out(h);
    ch_take_log(h);
    smtpe_content_scan_init(&h->txn.content);
    smtpe_content_scan(&h->txn.content, eight, sizeof eight - 1);
    smtpe_content_scan_end(&h->txn.content);
    h->txn.has_content_info = 1;
    ch_submit(h, "a@example.com", ONE, 1);
    LOG(h, "OUTCOME 0 permanent 000 5.6.3 8-bit content and the server does not offer 8BITMIME "
           "[local] [before-mail]\nDONE 0/1/0/0 reusable\n");
    h->txn.has_content_info = 0;
    ch_submit(h, "a@example.com", utf8_to, 1);
    LOG(h, "OUTCOME 0 permanent 000 5.6.7 non-ASCII address and the server does not offer "
           "SMTPUTF8 [local] [before-mail]\nDONE 0/1/0/0 reusable\n");
    OUT(h, "");
}

static void test_local_refusals(void **st)
{
    (void)st;
    run3(sc_local_refusals);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_no_pipelining),
        cmocka_unit_test(test_q04_refused_rcpt_then_503),
        cmocka_unit_test(test_q05_lone_dot),
        cmocka_unit_test(test_q06_421_every_stage),
        cmocka_unit_test(test_q07_lmtp_replies),
        cmocka_unit_test(test_q01_starttls_injection),
        cmocka_unit_test(test_q02_tls_required),
        cmocka_unit_test(test_q03_caps_after_tls),
        cmocka_unit_test(test_q08_login_prompts),
        cmocka_unit_test(test_q09_initial_response_too_long),
        cmocka_unit_test(test_auth_needs_tls),
        cmocka_unit_test(test_xoauth2_error),
        cmocka_unit_test(test_host_mechanism),
        cmocka_unit_test(test_q10_smuggling),
        cmocka_unit_test(test_q11_bad_arguments),
        cmocka_unit_test(test_q12_xtext),
        cmocka_unit_test(test_q13_bdat_refused),
        cmocka_unit_test(test_q14_no_reply_to_dot),
        cmocka_unit_test(test_protocol_errors),
        cmocka_unit_test(test_greeting_and_helo),
        cmocka_unit_test(test_local_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
