/*
 * test_client_review.c - a hostile review of the client engine (engine/client.c) against its
 * contract (include/smtpe.h, "Client engine"), the client requirements and the conformance
 * cases (client-cases.md): replies matched to the wrong command, recipients with zero or two
 * outcomes, content encoding across pieces and the output ring, unknown versus temporary,
 * timeouts, want flags, memory at its formula, API misuse and bad strings.
 *
 * Tests marked "BUG:" show a fault found in review that is still open; they are skipped
 * unless the environment has SMTPE_REVIEW_BUGS=1 (so the suite stays green while the fault is
 * open), and then fail until it is fixed. Tests marked "FIXED:" showed a fault that has been
 * fixed since (the commit is named); they run always and guard against its return. Every
 * other test guards a property that must hold.
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
#define CAPS                                                                                   \
    "250-mx.example\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SIZE 10485760\r\n"                \
    "250 ENHANCEDSTATUSCODES\r\n"
#define EHLO "EHLO client.example\r\n"

static const char *const ONE[] = {"bob@example.org"};
static const char *const TWO[] = {"a@example.org", "b@example.org"};
static const char *const THREE[] = {"a@example.org", "b@example.org", "c@example.org"};
static const uint8_t MSG[] = "Subject: t\r\n\r\nhello\r\n";

#define OUT(h, s) assert_string_equal(ch_take_out(h), s)
#define LOG(h, s) assert_string_equal(ch_take_log(h), s)

/* A known bug's test runs only with SMTPE_REVIEW_BUGS=1. */
__attribute__((unused)) static int bugs_enabled(void)
{
    const char *e = getenv("SMTPE_REVIEW_BUGS");
    return e && strcmp(e, "1") == 0;
}
#define KNOWN_BUG()                                                                             \
    do {                                                                                        \
        if (!bugs_enabled())                                                                    \
            skip();                                                                             \
    } while (0)

typedef void scenario(ch *h);

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

/* Counts the occurrences of needle in hay. */
static size_t count_of(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

#define SP(s) {(const uint8_t *)(s), sizeof(s) - 1}

/* ==== setup: XCLIENT, AUTH, STARTTLS ================================================== */

/* FIXED (e97559e), found in review as a bug:
 * XCLIENT offered, but none of the configured attributes is in the server's list, with
 * AUTH wanted: queue_xclient() calls setup_next() (which sets next = NEXT_AUTH) and returns 1,
 * and setup_send() then overwrites next with NEXT_NONE. Nothing is ever sent again: no AUTH,
 * no READY, no timer (smtpe_client_expiry says UINT64_MAX) - a stall forever. Expected: the
 * XCLIENT step is skipped (smtpe.h: "only attributes it lists are sent") and AUTH follows. */
static void sc_xclient_unlisted_then_auth(ch *h)
{
    static const smtpe_param attrs[] = {{SP("NAME"), SP("host.example")}};
    h->cfg.xclient = attrs;
    h->cfg.xclient_count = 1;
    h->cfg.auth_mechanism = "PLAIN";
    h->cfg.auth_user = "u";
    h->cfg.auth_password = "p";
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_server(h, GREET);
    OUT(h, EHLO);
    ch_server(h, "250-mx.example\r\n250-XCLIENT ADDR PORT\r\n250 AUTH PLAIN\r\n");
    /* base64("\0u\0p") */
    OUT(h, "AUTH PLAIN AHUAcA==\r\n");
}

static void test_fixed_xclient_unlisted_stalls_auth(void **st)
{
    (void)st;
    run3(sc_xclient_unlisted_then_auth);
}

/* The same without AUTH reaches READY (setup_next already queued it). */
static void sc_xclient_unlisted_ready(ch *h)
{
    static const smtpe_param attrs[] = {{SP("NAME"), SP("host.example")}};
    h->cfg.xclient = attrs;
    h->cfg.xclient_count = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250 XCLIENT ADDR PORT\r\n");
    OUT(h, EHLO);
    assert_non_null(strstr(ch_take_log(h), "READY"));
}

static void test_xclient_unlisted_ready(void **st)
{
    (void)st;
    run3(sc_xclient_unlisted_ready);
}

/* XCLIENT: only listed attributes, xtext-encoded, then EHLO again; the new EHLO's caps. */
static void sc_xclient(ch *h)
{
    static const smtpe_param attrs[] = {{SP("NAME"), SP("a+b=c")}, {SP("HELO"), SP("x")},
                                        {SP("ADDR"), SP("192.0.2.1")}};
    h->cfg.xclient = attrs;
    h->cfg.xclient_count = 3;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250-XCLIENT NAME ADDR\r\n250 SIZE 100\r\n");
    OUT(h, EHLO "XCLIENT NAME=a+2Bb+3Dc ADDR=192.0.2.1\r\n");
    LOG(h, "");
    ch_server(h, "220 mx.example ESMTP\r\n");
    OUT(h, EHLO);
    ch_server(h, "250-mx.example\r\n250 PIPELINING\r\n");
    LOG(h, "READY ext=0x1 size=0 auth= tls=0 auth_ok=0\n");
}

static void test_xclient_listed_only(void **st)
{
    (void)st;
    run3(sc_xclient);
}

/* Q01 with the forged octets in a later recv call, before the handshake: still an error,
 * and nothing more is sent. */
static void sc_starttls_inject_later(ch *h)
{
    h->cfg.tls = SMTPE_TLS_OPPORTUNISTIC;
    h->manual_tls = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, "250-mx.example\r\n250 STARTTLS\r\n");
    OUT(h, EHLO "STARTTLS\r\n");
    ch_server(h, "220 2.0.0 Ready\r\n");
    LOG(h, "STARTTLS\n");
    assert_true(smtpe_client_want(h->c) & SMTPE_WANT_TLS);
    ch_server(h, "250 AUTH PLAIN\r\n");
    assert_non_null(strstr(ch_take_log(h), "CLOSED protocol-error"));
    assert_int_equal(smtpe_client_tls_started(h->c, 0), SMTPE_ERR_STATE);
    ch_pump(h);
    OUT(h, "");
}

static void test_starttls_inject_later_call(void **st)
{
    (void)st;
    run3(sc_starttls_inject_later);
}

/* ==== replies matched to commands ===================================================== */

/* FIXED (e97559e), found in review as a bug:
 * RFC 5321 §3.8 lets a server send 421 at any time. A 421 that arrives while the
 * client's commands are queued but not yet handed out by send_buf (the host has not written
 * yet: a server idle timeout racing a submit) is reported as a protocol error ("a reply to
 * a command not yet sent", code 0) instead of SMTPE_CLOSE_SERVER_421 with the 421 on the
 * recipients (it is, when nothing at all is queued: sc_unsolicited_421 in test_client). */
static void test_fixed_421_before_commands_handed(void **st)
{
    (void)st;
    ch h;
    smtpe_client_event ev;
    ch_init(&h);
    open_ok(&h);
    ch_server(&h, GREET);
    ch_server(&h, CAPS);
    ch_take_out(&h);
    ch_take_log(&h);
    h.txn.reverse_path = "a@example.com";
    h.rcpts[0].forward_path = "bob@example.org";
    h.txn.rcpts = h.rcpts;
    h.txn.rcpt_count = 1;
    assert_int_equal(smtpe_client_submit(h.c, &h.txn), 0);
    /* MAIL/RCPT/DATA queued, not handed; the server's 421 comes in */
    assert_int_equal(smtpe_client_recv(h.c, (const uint8_t *)"421 4.4.2 idle\r\n", 16, 0), 16);
    assert_int_equal(smtpe_client_next_event(h.c, &ev), 1);
    assert_int_equal(ev.type, SMTPE_CEV_OUTCOME);
    assert_int_equal(ev.outcome.outcome, SMTPE_OUTCOME_TEMPORARY);
    assert_int_equal(ev.outcome.code, 421);
    while (smtpe_client_next_event(h.c, &ev) == 1 && ev.type != SMTPE_CEV_CLOSED)
        ;
    assert_int_equal(ev.type, SMTPE_CEV_CLOSED);
    assert_int_equal(ev.closed.reason, SMTPE_CLOSE_SERVER_421);
    ch_free(&h);
}

/* ==== a simulated server and a host that follows the want flags ======================== */

/* A growable octet buffer. */
typedef struct obuf {
    uint8_t *p;
    size_t len, cap;
} obuf;

static void ob_put(obuf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = realloc(b->p, cap);
        assert_non_null(b->p);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void ob_str(obuf *b, const char *s)
{
    ob_put(b, s, strlen(s));
}

static void ob_free(obuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void ob_drop(obuf *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    if (b->p)
        b->p[b->len] = 0;
}

#define SIM_MAX_RCPT 200

/* The server: replies per command from the script below (NULL: a default; the script is for
 * the first MAIL's transaction only), parses what the client sends like a strict receiver
 * (DATA unstuffing, BDAT counts) and records it. */
typedef struct sim_server {
    const char *greeting;           /* default GREET */
    const char *ehlo;               /* reply to EHLO/LHLO, default CAPS */
    const char *mail;               /* default "250 ok" */
    const char *rcpt[SIM_MAX_RCPT]; /* default "250 ok" */
    const char *data;               /* default 354, or 554 with no recipient accepted */
    const char *bdat;               /* reply to a BDAT without LAST, default "250 ok" */
    const char *end[SIM_MAX_RCPT];  /* reply to the end of content (LMTP: i-th accepted) */
    int lmtp;
    /* state */
    int mode; /* 0 commands, 1 DATA content, 2 BDAT chunk, 3 after QUIT, 4 after a 421 */
    uint64_t bdat_left;
    int bdat_last;
    size_t rcpt_i, accepted, transactions, mail_no;
    size_t acc_idx[SIM_MAX_RCPT]; /* the accepted recipients' indices (r<i>@example.org) */
    int delivered[SIM_MAX_RCPT];  /* the server took responsibility for r<i> */
    int mail_ok;                  /* its reply to MAIL was 2xx (else it delivers nothing) */
    int lockstep;                 /* a command while a reply is unread is a violation, as are
                                     RCPT after a refused MAIL and DATA/BDAT after every RCPT
                                     was refused, when all the replies were read */
    int bdat_refused;             /* it refused a BDAT of this transaction */
    const char *starttls, *auth, *xclient; /* replies (default 220, 235, 220) */
    int tls;                      /* its STARTTLS 220 went out: TLS is up from there */
    int want_ehlo;                /* after STARTTLS or XCLIENT: EHLO must come first */
    int no_clear_auth;            /* AUTH before TLS is a violation (and MAIL, no_clear_mail) */
    int no_clear_mail;
    int said_421;                 /* it said 421: it has closed, whatever mode says later */
    obuf line, msg, to_client, commands;
    int violations; /* bare CR/LF, a lone dot outside DATA, octets after QUIT */
    char why[200];
} sim_server;

static void srv_violation(sim_server *s, const char *why)
{
    if (!s->violations++)
        snprintf(s->why, sizeof s->why, "%s", why);
}

static void srv_reply(sim_server *s, const char *r, const char *dflt)
{
    if (s->mode == 4 || s->said_421)
        return; /* it said 421: closed */
    ob_str(&s->to_client, r ? r : dflt);
    ob_str(&s->commands, "  S: ");
    ob_str(&s->commands, r ? r : dflt);
    if (!strncmp(r ? r : dflt, "421", 3)) {
        s->mode = 4; /* RFC 5321 §3.8: it closes the channel, reads nothing more */
        s->said_421 = 1;
    }
}

static void srv_end(sim_server *s)
{
    size_t n = s->lmtp ? s->accepted : 1;
    if (n == 0)
        n = 1;
    for (size_t i = 0; i < n; i++) {
        const char *r = s->mail_no == 1 && i < SIM_MAX_RCPT ? s->end[i] : NULL;
        if (s->said_421)
            break; /* closed: it delivers nothing more */
        srv_reply(s, r, "250 2.0.0 queued\r\n");
        if ((!r || r[0] == '2') && s->mail_ok)
            for (size_t k = s->lmtp ? i : 0; k < (s->lmtp ? i + 1 : s->accepted); k++)
                if (k < s->accepted && k < SIM_MAX_RCPT && s->acc_idx[k] < SIM_MAX_RCPT)
                    s->delivered[s->acc_idx[k]] = 1;
    }
    s->transactions++;
    s->accepted = s->rcpt_i = 0;
}

static void srv_command(sim_server *s, const char *l)
{
    ob_str(&s->commands, l);
    ob_str(&s->commands, "\n");
    if (s->lockstep && s->to_client.len > 0)
        srv_violation(s, "a command before the previous reply was read");
    if (s->lockstep && !strncmp(l, "RCPT", 4) && !s->mail_ok)
        srv_violation(s, "RCPT after a refused MAIL");
    if (s->lockstep && (!strcmp(l, "DATA") || !strncmp(l, "BDAT", 4)) && s->accepted == 0 &&
        s->rcpt_i > 0)
        srv_violation(s, "DATA or BDAT after every RCPT was refused");
    if (!strncmp(l, "BDAT", 4) && s->bdat_refused)
        srv_violation(s, "BDAT after a refused BDAT (RFC 3030 §2)");
    if (s->want_ehlo && strncmp(l, "EHLO ", 5) && strncmp(l, "LHLO ", 5) && strcmp(l, "QUIT"))
        srv_violation(s, "not EHLO first after STARTTLS or XCLIENT (RFC 3207 §4.2)");
    s->want_ehlo = 0;
    if (!s->tls && s->no_clear_auth && !strncmp(l, "AUTH", 4))
        srv_violation(s, "AUTH in clear");
    if (!s->tls && s->no_clear_mail && !strncmp(l, "MAIL", 4))
        srv_violation(s, "MAIL in clear with TLS required");
    if (!strncmp(l, "EHLO ", 5) || !strncmp(l, "LHLO ", 5)) {
        srv_reply(s, s->ehlo, CAPS);
    } else if (!strncmp(l, "HELO ", 5)) {
        srv_reply(s, NULL, "250 mx.example\r\n");
    } else if (!strncmp(l, "MAIL FROM:", 10)) {
        s->rcpt_i = s->accepted = 0;
        s->bdat_refused = 0;
        s->mail_no++;
        {
            const char *r = s->mail_no == 1 ? s->mail : NULL;
            srv_reply(s, r, "250 2.1.0 ok\r\n");
            s->mail_ok = !r || r[0] == '2';
        }
    } else if (!strncmp(l, "RCPT TO:", 8)) {
        const char *r = s->rcpt_i < SIM_MAX_RCPT && s->mail_no == 1 ? s->rcpt[s->rcpt_i] : NULL;
        s->rcpt_i++;
        if (!r || r[0] == '2') {
            if (s->accepted < SIM_MAX_RCPT)
                s->acc_idx[s->accepted] = strtoul(l + 10, NULL, 10);
            s->accepted++;
        }
        srv_reply(s, r, "250 2.1.5 ok\r\n");
    } else if (!strcmp(l, "DATA")) {
        const char *r = s->data && s->mail_no == 1 ? s->data
                        : s->accepted                ? "354 go\r\n"
                                                     : "554 5.5.1 none\r\n";
        srv_reply(s, r, NULL);
        if (!strncmp(r, "354", 3))
            s->mode = 1;
    } else if (!strncmp(l, "BDAT ", 5)) {
        char *e;
        s->bdat_left = strtoull(l + 5, &e, 10);
        s->bdat_last = !strcmp(e, " LAST");
        if (*e && !s->bdat_last)
            srv_violation(s, "bad BDAT line");
        s->mode = 2;
    } else if (!strcmp(l, "STARTTLS")) {
        const char *r = s->starttls ? s->starttls : "220 2.0.0 go ahead\r\n";
        srv_reply(s, r, NULL);
        if (!strncmp(r, "220", 3))
            s->tls = s->want_ehlo = 1;
    } else if (!strncmp(l, "AUTH ", 5)) {
        srv_reply(s, s->auth, "235 2.7.0 ok\r\n");
    } else if (!strncmp(l, "XCLIENT ", 8)) {
        const char *r = s->xclient ? s->xclient : "220 mx.example ESMTP\r\n";
        srv_reply(s, r, NULL);
        if (!strncmp(r, "220", 3))
            s->want_ehlo = 1;
    } else if (!strncmp(l, "XFORWARD ", 9)) {
        srv_reply(s, NULL, "250 2.0.0 ok\r\n");
    } else if (!strcmp(l, "RSET")) {
        s->rcpt_i = s->accepted = 0;
        srv_reply(s, NULL, "250 2.0.0 ok\r\n");
    } else if (!strcmp(l, "QUIT")) {
        srv_reply(s, NULL, "221 2.0.0 bye\r\n");
        s->mode = 3;
    } else if (!strcmp(l, ".")) {
        srv_violation(s, "a lone dot outside DATA");
    } else {
        srv_reply(s, NULL, "500 5.5.2 what\r\n");
    }
}

static void srv_bdat_done(sim_server *s)
{
    s->mode = 0;
    if (s->bdat_last)
        srv_end(s);
    else {
        const char *r = s->mail_no == 1 ? s->bdat : NULL;
        srv_reply(s, r, "250 2.0.0 chunk ok\r\n");
        if (r && r[0] != '2')
            s->bdat_refused = 1;
    }
}

/* Feeds octets the client sent. */
static void srv_input(sim_server *s, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (s->mode == 4)
            return;
        if (s->mode == 3) {
            srv_violation(s, "octets after QUIT");
            continue;
        }
        if (s->mode == 2) {
            size_t k = n - i < s->bdat_left ? n - i : (size_t)s->bdat_left;
            ob_put(&s->msg, p + i, k);
            s->bdat_left -= k;
            i += k - 1;
            if (s->bdat_left == 0)
                srv_bdat_done(s);
            continue;
        }
        ob_put(&s->line, &c, 1);
        if (c == '\n' && (s->line.len < 2 || s->line.p[s->line.len - 2] != '\r'))
            srv_violation(s, "bare LF");
        if (s->line.len >= 2 && s->line.p[s->line.len - 2] == '\r' && c != '\n')
            srv_violation(s, "bare CR");
        if (c != '\n')
            continue;
        if (s->line.len >= 2)
            s->line.p[s->line.len - 2] = 0;
        if (s->mode == 1) {
            const char *l = (const char *)s->line.p;
            if (!strcmp(l, ".")) {
                s->mode = 0;
                srv_end(s);
            } else {
                if (l[0] == '.')
                    l++;
                ob_str(&s->msg, l);
                ob_str(&s->msg, "\r\n");
            }
        } else {
            srv_command(s, (const char *)s->line.p);
            if (s->mode == 2 && s->bdat_left == 0)
                srv_bdat_done(s);
        }
        s->line.len = 0;
    }
}

/* The content as the wire must carry it (NORMALISE): bare CR and bare LF as CRLF, a final
 * CRLF when missing (not for empty content). */
static void normalise(const uint8_t *p, size_t n, obuf *out)
{
    out->len = 0;
    ob_put(out, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\r') {
            ob_put(out, "\r\n", 2);
            if (i + 1 < n && p[i + 1] == '\n')
                i++;
        } else if (p[i] == '\n') {
            ob_put(out, "\r\n", 2);
        } else {
            ob_put(out, &p[i], 1);
        }
    }
    if (out->len > 0 && (out->len < 2 || memcmp(out->p + out->len - 2, "\r\n", 2) != 0))
        ob_put(out, "\r\n", 2);
}

static uint32_t rnd(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* The host: follows smtpe_client_want() only. */
typedef struct sim {
    smtpe_client *c;
    smtpe_client_config cfg;
    void *mem; /* the session's memory (exactly smtpe_client_memory_size) */
    sim_server srv;
    smtpe_client_txn txn;
    smtpe_client_rcpt rcpts[SIM_MAX_RCPT];
    char names[SIM_MAX_RCPT][24];
    const uint8_t *content;
    size_t content_len, content_at;
    size_t piece_max; /* most content octets per call (0: all) */
    size_t write_max; /* most octets written per send (0: all) */
    size_t feed_max;  /* most server octets per recv (0: all) */
    uint32_t seed;
    uint64_t now;
    int outcomes[SIM_MAX_RCPT]; /* outcome per recipient (0: none yet) */
    int n_outcomes[SIM_MAX_RCPT];
    unsigned last_code[SIM_MAX_RCPT];
    size_t done, closed, content_events, ready;
    smtpe_client_done last_done;
    smtpe_client_closed last_closed;
    /* stable output: octets handed and not acknowledged */
    const uint8_t *held_ptr;
    obuf held;
    int content_error;
    int quit_after; /* ask for QUIT after this many transactions (0: never) */
    int gone;       /* the connection is lost: nothing more is written */
    int tls_due;    /* STARTTLS taken: feed what was read, then the "handshake" */
    int check_delivered; /* at each DONE: delivered only if the server took it, and what it
                            took is delivered or unknown */
    int lies;       /* the server sent an extra reply: no matching can be right */
    size_t submit_first; /* submit a first transaction of this many recipients at READY */
    int quit_asked;      /* smtpe_client_quit returned 0 */
    size_t submits;      /* transactions submitted (each owes one DONE) */
    int no_flush;   /* once CLOSED, write nothing more (else: send what is queued, as the
                       contract says, then close) */
    int more_txns;  /* transactions to submit after the first's DONE */
    size_t n_rcpt;  /* their recipients */
    int submit_due;
} sim;

static const char *g_case = "-"; /* the case running, for failure messages */

static void sim_init(sim *m, uint32_t seed)
{
    memset(m, 0, sizeof *m);
    smtpe_client_config_init(&m->cfg);
    m->cfg.helo_name = "client.example";
    m->seed = seed ? seed : 1;
}

static void sim_open(sim *m)
{
    size_t size = smtpe_client_memory_size(&m->cfg);
    assert_true(size > 0);
    m->mem = malloc(size); /* exactly the formula: ASan sees any octet past it */
    assert_non_null(m->mem);
    assert_int_equal(smtpe_client_init(&m->c, m->mem, size, &m->cfg, m->now), 0);
}

static void sim_free(sim *m)
{
    free(m->mem);
    ob_free(&m->held);
    ob_free(&m->srv.line);
    ob_free(&m->srv.msg);
    ob_free(&m->srv.to_client);
    ob_free(&m->srv.commands);
}

/* Submits a transaction of n recipients r0@example.org ... */
static int sim_submit(sim *m, size_t n)
{
    assert_true(n <= SIM_MAX_RCPT);
    memset(m->rcpts, 0, sizeof m->rcpts);
    for (size_t i = 0; i < n; i++) {
        snprintf(m->names[i], sizeof m->names[i], "r%zu@example.org", i);
        m->rcpts[i].forward_path = m->names[i];
    }
    memset(m->outcomes, 0, sizeof m->outcomes);
    memset(m->n_outcomes, 0, sizeof m->n_outcomes);
    m->txn.reverse_path = "a@example.com";
    m->txn.rcpts = m->rcpts;
    m->txn.rcpt_count = n;
    m->content_at = 0;
    int rc = smtpe_client_submit(m->c, &m->txn);
    if (rc == 0)
        m->submits++;
    return rc;
}

static void sim_check_held(sim *m)
{
    if (m->held.len > 0 && memcmp(m->held_ptr, m->held.p, m->held.len) != 0)
        fail_msg("stable output broken: octets handed by send_buf changed before their ack");
}

static int sim_events(sim *m)
{
    smtpe_client_event ev;
    int any = 0;
    while (smtpe_client_next_event(m->c, &ev) == 1) {
        any = 1;
        switch (ev.type) {
        case SMTPE_CEV_READY:
            m->ready++;
            if (m->submit_first) {
                int rc = sim_submit(m, m->submit_first);
                /* refused only after QUIT was asked for or the session ended (smtpe.h) */
                int over = m->quit_asked || (smtpe_client_want(m->c) & SMTPE_WANT_CLOSE);
                if (rc != (over ? SMTPE_ERR_STATE : 0)) {
                    fputs((const char *)m->srv.commands.p, stderr);
                    fail_msg("%s: submit at READY: %d", g_case, rc);
                }
                m->submit_first = 0;
            }
            break;
        case SMTPE_CEV_CONTENT: m->content_events++; break;
        case SMTPE_CEV_OUTCOME: {
            char note[200];
            snprintf(note, sizeof note, "  E: outcome %zu %d %u %.*s\n", ev.outcome.index,
                     ev.outcome.outcome, ev.outcome.code, (int)ev.outcome.text.len,
                     (const char *)ev.outcome.text.ptr);
            ob_str(&m->srv.commands, note);
        }
            assert_true(ev.outcome.index < m->txn.rcpt_count);
            m->n_outcomes[ev.outcome.index]++;
            m->outcomes[ev.outcome.index] = ev.outcome.outcome;
            m->last_code[ev.outcome.index] = ev.outcome.code;
            break;
        case SMTPE_CEV_TRANSACTION_DONE: {
            for (size_t i = 0; i < m->txn.rcpt_count; i++)
                if (m->n_outcomes[i] != 1)
                    fail_msg("%s: recipient %zu has %d outcomes at TRANSACTION_DONE", g_case,
                             i, m->n_outcomes[i]);
            assert_int_equal(ev.done.delivered + ev.done.permanent + ev.done.temporary +
                                 ev.done.unknown,
                             m->txn.rcpt_count);
            for (size_t i = 0; m->check_delivered && !m->lies && i < m->txn.rcpt_count; i++) {
                int o = m->outcomes[i];
                if (o == SMTPE_OUTCOME_DELIVERED && !m->srv.delivered[i]) {
                    fputs((const char *)m->srv.commands.p, stderr);
                    fail_msg("%s: recipient %zu reported delivered, the server did not take it",
                             g_case, i);
                }
                if (m->srv.delivered[i] && o != SMTPE_OUTCOME_DELIVERED &&
                    o != SMTPE_OUTCOME_UNKNOWN) {
                    fputs((const char *)m->srv.commands.p, stderr);
                    fail_msg("%s: recipient %zu delivered by the server, reported %d", g_case,
                             i, o);
                }
            }
            memset(m->srv.delivered, 0, sizeof m->srv.delivered);
            m->last_done = ev.done;
            m->done++;
            if (m->more_txns > 0 && ev.done.reusable) {
                m->more_txns--;
                m->submit_due = 1;
            }
            break;
        }
        case SMTPE_CEV_CLOSED:
            m->closed++;
            m->last_closed = ev.closed;
            break;
        case SMTPE_CEV_STARTTLS: m->tls_due = 1; break;
        default: break;
        }
    }
    return any;
}

static int sim_write(sim *m)
{
    size_t len, k;
    const uint8_t *p;
    sim_check_held(m);
    if (m->gone || (m->no_flush && m->closed))
        return 0;
    p = smtpe_client_send_buf(m->c, &len);
    if (len == 0)
        return 0;
    if (m->held.len > 0 && p != m->held_ptr)
        fail_msg("send_buf moved octets it had handed out");
    k = len;
    if (m->write_max) {
        k = 1 + rnd(&m->seed) % m->write_max;
        if (k > len)
            k = len;
    }
    srv_input(&m->srv, p, k);
    assert_int_equal(smtpe_client_send_ack(m->c, k), 0);
    m->held.len = 0;
    m->held_ptr = p + k;
    ob_put(&m->held, p + k, len - k);
    return 1;
}

static int sim_content(sim *m)
{
    int any = 0;
    while (smtpe_client_want(m->c) & SMTPE_WANT_CONTENT) {
        size_t left = m->content_len - m->content_at, n = left;
        smtpe_ssize r;
        if (m->piece_max && n > 0) {
            n = 1 + rnd(&m->seed) % m->piece_max;
            if (n > left)
                n = left;
        }
        r = smtpe_client_content(m->c, m->content + m->content_at, n, n == left);
        if (r < 0) {
            m->content_error = (int)r;
            return any;
        }
        m->content_at += (size_t)r;
        if (r == 0 && n > 0 && !(smtpe_client_want(m->c) & SMTPE_WANT_CLOSE)) {
            fputs((const char *)m->srv.commands.p, stderr);
            fail_msg("%s: WANT_CONTENT set but smtpe_client_content consumed nothing of %zu "
                     "(last %d)", g_case, n, n == left);
        }
        any = 1;
        sim_check_held(m);
        if ((size_t)r == n && n == left)
            break;
    }
    return any;
}

static int sim_read(sim *m)
{
    sim_server *s = &m->srv;
    size_t n;
    smtpe_ssize r;
    if (s->to_client.len == 0 || !(smtpe_client_want(m->c) & SMTPE_WANT_READ))
        return 0;
    n = s->to_client.len;
    if (m->feed_max) {
        n = 1 + rnd(&m->seed) % m->feed_max;
        if (n > s->to_client.len)
            n = s->to_client.len;
    }
    r = smtpe_client_recv(m->c, s->to_client.p, n, m->now);
    assert_true(r >= 0);
    ob_drop(&s->to_client, (size_t)r);
    return r > 0;
}

/* One round of the host; returns whether anything happened. */
static int sim_round(sim *m)
{
    int any = 0;
    sim_check_held(m);
    any |= sim_events(m);
    if (m->tls_due) { /* smtpe.h: feed what was already read, then run the handshake */
        while (m->srv.to_client.len > 0 && sim_read(m))
            sim_events(m);
        m->tls_due = 0;
        if (!m->closed && !m->srv.tls) { /* the server did not say 220: the handshake fails */
            smtpe_client_lost(m->c);
            m->gone = 1;
        } else if (!m->closed) {
            assert_int_equal(smtpe_client_tls_started(m->c, m->now), 0);
        }
        any = 1;
    }
    if (m->submit_due) {
        m->submit_due = 0;
        if (sim_submit(m, m->n_rcpt) != 0 && !m->quit_asked &&
            !(smtpe_client_want(m->c) & SMTPE_WANT_CLOSE))
            fail_msg("%s: a next transaction refused on a reusable session", g_case);
        any = 1;
    }
    if (smtpe_client_want(m->c) & SMTPE_WANT_WRITE)
        any |= sim_write(m);
    any |= sim_content(m);
    any |= sim_read(m);
    if (m->quit_after && m->done >= (size_t)m->quit_after && !m->closed) {
        smtpe_client_quit(m->c);
        m->quit_after = 0;
        any = 1;
    }
    (void)smtpe_client_expiry(m->c, m->now);
    return any;
}

/* Fails on a stall: the host following want() can do nothing, yet want() asks for it. */
static void sim_check_idle(sim *m)
{
    unsigned w = smtpe_client_want(m->c);
    if (w & (SMTPE_WANT_EVENT | SMTPE_WANT_WRITE | SMTPE_WANT_CONTENT))
        fail_msg("want() says %#x but the host can do nothing with it", w);
    if (w & SMTPE_WANT_READ && m->srv.to_client.len > 0)
        fail_msg("want() says READ, octets wait, but recv consumed none");
}

/* Plays the greeting, then runs until nothing more happens. */
static void sim_run(sim *m)
{
    int rounds = 0;
    if (m->srv.greeting || m->srv.mail_no == 0)
        if (!m->ready && m->srv.to_client.len == 0 && m->srv.commands.len == 0)
            srv_reply(&m->srv, m->srv.greeting, GREET);
    while (sim_round(m))
        assert_true(++rounds < 4000000);
    sim_check_idle(m);
}

/* ==== content encoding ================================================================= */

/* Content built to hit every encoder rule at piece ends: line-start dots, bare CR and LF,
 * CR LF split, "\r.\r\n", "\n.\r\n", dots after bare line ends, a CR at the very end. */
static size_t tricky_content(uint8_t *out, size_t cap, uint32_t seed)
{
    static const char *const parts[] = {".", "..", "\r\n", "\r", "\n", "\r\n.\r\n", "\n.\r\n",
                                        "\r.\r\n", "x", "abc", ". ", "\r\r\n", "\n\r",
                                        ".\r", ".\n", "\r\n..", "MAIL FROM:<x@y>\r\n"};
    size_t n = 0;
    while (n + 20 < cap) {
        const char *p = parts[rnd(&seed) % (sizeof parts / sizeof *parts)];
        memcpy(out + n, p, strlen(p));
        n += strlen(p);
    }
    return n;
}

/* Delivers content through the simulated server under the given splits and checks that the
 * server decoded exactly the normalised content, with one outcome each. */
static void check_delivery(const uint8_t *content, size_t len, int bdat, size_t piece_max,
                           size_t write_max, size_t feed_max, size_t out_size, uint32_t seed)
{
    sim m;
    obuf want = {0};
    sim_init(&m, seed);
    if (out_size)
        m.cfg.output_buffer_size = out_size;
    if (bdat)
        m.srv.ehlo = "250-mx.example\r\n250-PIPELINING\r\n250-CHUNKING\r\n250 8BITMIME\r\n";
    m.content = content;
    m.content_len = len;
    m.piece_max = piece_max;
    m.write_max = write_max;
    m.feed_max = feed_max;
    sim_open(&m);
    assert_int_equal(sim_submit(&m, 2), 0);
    sim_run(&m);
    ob_put(&m.srv.msg, "", 0);
    normalise(content, len, &want);
    if (m.srv.violations)
        fail_msg("server saw: %s (bdat %d piece %zu write %zu)", m.srv.why, bdat, piece_max,
                 write_max);
    if (m.srv.msg.len != want.len || memcmp(m.srv.msg.p, want.p, want.len) != 0)
        fail_msg("content differs on the wire (bdat %d piece %zu write %zu len %zu: got %zu, "
                 "want %zu)",
                 bdat, piece_max, write_max, len, m.srv.msg.len, want.len);
    assert_int_equal(m.done, 1);
    assert_int_equal(m.outcomes[0], SMTPE_OUTCOME_DELIVERED);
    assert_int_equal(m.outcomes[1], SMTPE_OUTCOME_DELIVERED);
    assert_int_equal(m.content_error, 0);
    ob_free(&want);
    sim_free(&m);
}

static void test_content_every_piece_size(void **st)
{
    (void)st;
    static uint8_t buf[600];
    for (uint32_t seed = 1; seed <= 6; seed++) {
        size_t n = tricky_content(buf, sizeof buf, seed * 7919);
        for (int bdat = 0; bdat <= 1; bdat++)
            for (size_t piece = 1; piece <= 24; piece++)
                check_delivery(buf, n, bdat, piece, piece % 5 ? 0 : 7, piece % 3 ? 0 : 5, 0,
                               seed + (uint32_t)piece);
    }
}

/* Short contents, given whole and octet by octet: empty, a lone CR, a lone dot... */
static void test_content_small_cases(void **st)
{
    (void)st;
    static const char *const cases[] = {"", "\r", "\n", ".", "..", ".\r", ".\n", "\r\n", "\r\r",
                                        "\n\n", "a\r", "a", "\r\n.", "\r\n.\r\n", ".\r\n.",
                                        "\r.", "\n.", "x\r\n\r"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int bdat = 0; bdat <= 1; bdat++)
            for (size_t piece = 0; piece <= 1; piece++)
                check_delivery((const uint8_t *)cases[i], strlen(cases[i]), bdat, piece, 0, 0,
                               0, 3);
}

/* Large content through the smallest ring, written back in random small pieces (the ring
 * wraps many times): stable output, exact decoding, BDAT counts. */
static void test_content_ring_wraps(void **st)
{
    (void)st;
    size_t cap = 70000;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    size_t n = tricky_content(buf, cap, 99);
    for (int bdat = 0; bdat <= 1; bdat++) {
        check_delivery(buf, n, bdat, 5000, 977, 0, 4096, 5);
        check_delivery(buf, n, bdat, 0, 4095, 0, 4096, 6);
        check_delivery(buf, n, bdat, 4096, 1, 0, 4096, 7);
        check_delivery(buf, n, bdat, 3, 4096, 0, 4096, 8);
    }
    free(buf);
}

/* Content sizes around the output ring's size (4096): the content exactly fills it. */
static void test_content_fills_ring(void **st)
{
    (void)st;
    static uint8_t buf[8300];
    for (size_t n = 4080; n <= 4110; n++) {
        memset(buf, 'y', n);
        for (size_t i = 60; i + 1 < n; i += 77) {
            buf[i] = '\r';
            buf[i + 1] = '\n';
        }
        for (int bdat = 0; bdat <= 1; bdat++) {
            check_delivery(buf, n, bdat, 0, 0, 0, 4096, 1);
            check_delivery(buf, n, bdat, 0, 4096, 0, 4096, 2);
        }
    }
    for (size_t i = 0; i + 2 < sizeof buf; i += 3) { /* ".\r\n" lines: every dot doubled */
        buf[i] = '.';
        buf[i + 1] = '\r';
        buf[i + 2] = '\n';
    }
    for (int bdat = 0; bdat <= 1; bdat++)
        check_delivery(buf, sizeof buf / 3 * 3, bdat, 0, 0, 0, 4096, 3);
}

/* ==== pipelined groups: a failure in every position ==================================== */

/* One scripted failure; what each of three recipients must end with. */
typedef struct fail_case {
    const char *name;
    int lmtp, bdat;
    const char *mail, *rcpt[3], *data, *bdat_reply, *end[3];
    int outcome[3];
    unsigned code[3];
    int closed; /* the session must end */
} fail_case;

#define D SMTPE_OUTCOME_DELIVERED
#define P SMTPE_OUTCOME_PERMANENT
#define T SMTPE_OUTCOME_TEMPORARY

static const fail_case fail_cases[] = {
    {"MAIL 550", 0, 0, "550 5.1.0 no\r\n", {0}, 0, 0, {0}, {P, P, P}, {550, 550, 550}, 0},
    {"MAIL 451", 0, 0, "451 4.3.0 later\r\n", {0}, 0, 0, {0}, {T, T, T}, {451, 451, 451}, 0},
    {"MAIL 421", 0, 0, "421 4.3.2 bye\r\n", {0}, 0, 0, {0}, {T, T, T}, {421, 421, 421}, 1},
    {"MAIL 550, RCPTs 250, DATA 354 (hostile)", 0, 0, "550 no\r\n", {0}, "354 go\r\n", 0, {0},
     {P, P, P}, {550, 550, 550}, 0},
    {"RCPT 0 550", 0, 0, 0, {"550 5.1.1 no\r\n"}, 0, 0, {0}, {P, D, D}, {550, 250, 250}, 0},
    {"RCPT 1 452", 0, 0, 0, {0, "452 4.2.2 full\r\n"}, 0, 0, {0}, {D, T, D}, {250, 452, 250}, 0},
    {"RCPT 2 550", 0, 0, 0, {0, 0, "550 no\r\n"}, 0, 0, {0}, {D, D, P}, {250, 250, 550}, 0},
    {"RCPT 1 421", 0, 0, 0, {0, "421 4.3.2 bye\r\n"}, 0, 0, {0}, {T, T, T}, {421, 421, 421}, 1},
    {"all RCPT 550, DATA 554", 0, 0, 0, {"550 a\r\n", "550 b\r\n", "550 c\r\n"}, 0, 0, {0},
     {P, P, P}, {550, 550, 550}, 0},
    {"all RCPT 550, DATA 354", 0, 0, 0, {"550 a\r\n", "550 b\r\n", "550 c\r\n"}, "354 go\r\n",
     0, {0}, {P, P, P}, {550, 550, 550}, 0},
    {"RCPT 0 550, DATA 554", 0, 0, 0, {"550 a\r\n"}, "554 5.5.1 no\r\n", 0, {0}, {P, P, P},
     {550, 554, 554}, 0},
    {"DATA 451", 0, 0, 0, {0}, "451 4.3.0 later\r\n", 0, {0}, {T, T, T}, {451, 451, 451}, 0},
    {"DATA 421", 0, 0, 0, {0}, "421 4.3.2 bye\r\n", 0, {0}, {T, T, T}, {421, 421, 421}, 1},
    {"end 554", 0, 0, 0, {0}, 0, 0, {"554 5.6.0 bad\r\n"}, {P, P, P}, {554, 554, 554}, 0},
    {"end 421", 0, 0, 0, {0}, 0, 0, {"421 4.3.2 bye\r\n"}, {T, T, T}, {421, 421, 421}, 1},
    {"RCPT 1 550, end 451", 0, 0, 0, {0, "550 no\r\n"}, 0, 0, {"451 later\r\n"}, {T, P, T},
     {451, 550, 451}, 0},
    /* BDAT */
    {"BDAT: MAIL 550", 0, 1, "550 no\r\n", {0}, 0, 0, {0}, {P, P, P}, {550, 550, 550}, 0},
    {"BDAT: RCPT 1 550", 0, 1, 0, {0, "550 no\r\n"}, 0, 0, {0}, {D, P, D}, {250, 550, 250}, 0},
    {"BDAT: all RCPT 550", 0, 1, 0, {"550 a\r\n", "550 b\r\n", "550 c\r\n"}, 0,
     "554 5.5.1 no valid recipients\r\n", {"554 5.5.1 no valid recipients\r\n"}, {P, P, P},
     {550, 550, 550}, 0},
    {"BDAT: chunk 552", 0, 1, 0, {0}, 0, "552 5.3.4 too big\r\n", {0}, {P, P, P},
     {552, 552, 552}, 0},
    {"BDAT: chunk 421", 0, 1, 0, {0}, 0, "421 4.3.2 bye\r\n", {0}, {T, T, T}, {421, 421, 421}, 1},
    {"BDAT: LAST 451", 0, 1, 0, {0}, 0, 0, {"451 later\r\n"}, {T, T, T}, {451, 451, 451}, 0},
    /* LMTP: one reply per accepted recipient after the content */
    {"LMTP: RCPT 1 550", 1, 0, 0, {0, "550 no\r\n"}, 0, 0, {"250 a\r\n", "452 c\r\n"}, {D, P, T},
     {250, 550, 452}, 0},
    {"LMTP: mixed", 1, 0, 0, {0}, 0, 0, {"550 a\r\n", "250 b\r\n", "451 c\r\n"}, {P, D, T},
     {550, 250, 451}, 0},
    {"LMTP BDAT: RCPT 0 550", 1, 1, 0, {"550 no\r\n"}, 0, 0, {"250 b\r\n", "550 c\r\n"},
     {P, D, P}, {550, 250, 550}, 0},
};

/* Runs one case: the first transaction (three recipients) with the scripted failure, then,
 * when the session is to go on, a second one that must be delivered in sync, and QUIT. */
static void run_fail_case(const fail_case *fc, size_t feed_max, size_t write_max, int big)
{
    sim m;
    static uint8_t content[30000];
    int first[3];
    unsigned first_code[3];
    int rounds = 0;
    sim_init(&m, 77);
    g_case = fc->name;
    memset(content, 'z', sizeof content);
    for (size_t i = 70; i + 1 < sizeof content; i += 72) {
        content[i] = '\r';
        content[i + 1] = '\n';
    }
    m.content = content;
    m.content_len = big ? sizeof content : 100;
    m.cfg.lmtp = fc->lmtp;
    m.srv.lmtp = fc->lmtp;
    m.srv.ehlo = fc->bdat ? "250-mx.example\r\n250-PIPELINING\r\n250-CHUNKING\r\n"
                            "250 ENHANCEDSTATUSCODES\r\n"
                          : "250-mx.example\r\n250-PIPELINING\r\n250 ENHANCEDSTATUSCODES\r\n";
    if (fc->bdat)
        m.cfg.chunk_size = 40; /* several chunks */
    m.srv.mail = fc->mail;
    m.srv.data = fc->data;
    m.srv.bdat = fc->bdat_reply;
    for (int i = 0; i < 3; i++) {
        m.srv.rcpt[i] = fc->rcpt[i];
        m.srv.end[i] = fc->end[i];
    }
    m.feed_max = feed_max;
    m.write_max = write_max;
    sim_open(&m);
    assert_int_equal(sim_submit(&m, 3), 0);
    srv_reply(&m.srv, NULL, GREET);
    while (m.done == 0) {
        if (!sim_round(&m))
            fail_msg("%s: stalled before the first transaction's DONE", fc->name);
        assert_true(++rounds < 1000000);
    }
    for (int i = 0; i < 3; i++) {
        first[i] = m.outcomes[i];
        first_code[i] = m.last_code[i];
        if (first[i] != fc->outcome[i] || first_code[i] != fc->code[i])
            fail_msg("%s: recipient %d: outcome %d code %u, want %d code %u", fc->name, i,
                     first[i], first_code[i], fc->outcome[i], fc->code[i]);
    }
    if (m.srv.violations)
        fail_msg("%s: server saw %s", fc->name, m.srv.why);
    sim_events(&m);
    if (fc->closed) {
        assert_int_equal(m.closed, 1);
        assert_int_equal(m.last_done.reusable, 0);
        sim_free(&m);
        return;
    }
    assert_int_equal(m.last_done.reusable, 1);
    assert_int_equal(sim_submit(&m, 1), 0);
    m.quit_after = 2;
    sim_run(&m);
    if (m.done != 2 || m.outcomes[0] != D || m.n_outcomes[0] != 1)
        fail_msg("%s: the next transaction: done %zu outcome %d code %u (server: %s)", fc->name,
                 m.done, m.outcomes[0], m.last_code[0], m.srv.violations ? m.srv.why : "-");
    if (m.srv.violations)
        fail_msg("%s: server saw %s", fc->name, m.srv.why);
    assert_int_equal(m.closed, 1);
    assert_int_equal(m.last_closed.reason, SMTPE_CLOSE_QUIT);
    sim_free(&m);
}

static void test_pipeline_failure_every_position(void **st)
{
    (void)st;
    for (size_t i = 0; i < sizeof fail_cases / sizeof *fail_cases; i++) {
        run_fail_case(&fail_cases[i], 0, 0, 0);
        run_fail_case(&fail_cases[i], 1, 0, 0);
        run_fail_case(&fail_cases[i], 7, 3, 1);
    }
}

/* ==== several transactions on one connection ============================================ */

/* FIXED (55b30bb), found in review as a bug:
 * txn_clear() does not reset end_replied, so after one delivered message the next
 * transaction on the same connection is declared done (TRANSACTION_DONE with 0/0/0/0, no
 * OUTCOME at all) as soon as its DATA gets 354: its content is never sent, and the server's
 * reply to the next command desynchronises the session ("a reply with no command
 * outstanding"). Expected: each transaction's recipients get exactly one outcome each
 * (smtpe.h: SMTPE_CEV_OUTCOME "Exactly one per recipient"; DONE "every recipient has had
 * its outcome"), and the content goes (smtpe-send --messages N relies on it). */
static void sc_two_messages(ch *h)
{
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, CAPS);
    ch_take_out(h);
    ch_take_log(h);
    for (int round = 0; round < 3; round++) {
        h->content_at = 0;
        assert_int_equal(ch_submit(h, "a@example.com", ONE, 1), 0);
        OUT(h, "MAIL FROM:<a@example.com>\r\nRCPT TO:<bob@example.org>\r\nDATA\r\n");
        ch_server(h, "250 ok\r\n250 ok\r\n354 go\r\n");
        OUT(h, "Subject: t\r\n\r\nhello\r\n.\r\n");
        LOG(h, "CONTENT\n");
        ch_server(h, "250 2.0.0 queued\r\n");
        LOG(h, "OUTCOME 0 delivered 250 2.0.0 queued\nDONE 1/0/0/0 reusable\n");
    }
}

static void test_fixed_second_transaction_done_without_outcomes(void **st)
{
    (void)st;
    run3(sc_two_messages);
}

/* The same through BDAT and under LMTP. */
static void test_fixed_second_transaction_bdat_lmtp(void **st)
{
    (void)st;
    for (int lmtp = 0; lmtp <= 1; lmtp++)
        for (int bdat = 0; bdat <= 1; bdat++) {
            sim m;
            static const uint8_t msg[] = "x\r\n";
            sim_init(&m, 3);
            g_case = "two transactions";
            m.cfg.lmtp = m.srv.lmtp = lmtp;
            if (bdat)
                m.srv.ehlo = "250-mx.example\r\n250-PIPELINING\r\n250 CHUNKING\r\n";
            m.content = msg;
            m.content_len = 3;
            m.more_txns = 2;
            m.n_rcpt = 2;
            m.quit_after = 3;
            sim_open(&m);
            assert_int_equal(sim_submit(&m, 2), 0);
            sim_run(&m);
            assert_int_equal(m.done, 3);
            assert_int_equal(m.srv.transactions, 3);
            assert_int_equal(m.last_closed.reason, SMTPE_CLOSE_QUIT);
            sim_free(&m);
        }
}

/* ==== a raw host: every call made by the test ========================================== */

typedef struct raw {
    smtpe_client *c;
    smtpe_client_config cfg;
    smtpe_client_txn txn;
    smtpe_client_rcpt rcpts[8];
    obuf log, out;
    int outcomes[8], n_outcomes[8];
    unsigned codes[8];
    int closed_reason, done;
} raw;

static void raw_init(raw *r)
{
    memset(r, 0, sizeof *r);
    smtpe_client_config_init(&r->cfg);
    r->cfg.helo_name = "client.example";
    r->closed_reason = -1;
}

static void raw_events(raw *r)
{
    smtpe_client_event ev;
    char line[300];
    while (smtpe_client_next_event(r->c, &ev) == 1) {
        switch (ev.type) {
        case SMTPE_CEV_OUTCOME:
            assert_true(ev.outcome.index < 8);
            r->outcomes[ev.outcome.index] = ev.outcome.outcome;
            r->n_outcomes[ev.outcome.index]++;
            r->codes[ev.outcome.index] = ev.outcome.code;
            snprintf(line, sizeof line, "OUTCOME %zu %d %u\n", ev.outcome.index,
                     ev.outcome.outcome, ev.outcome.code);
            break;
        case SMTPE_CEV_TRANSACTION_DONE:
            r->done++;
            snprintf(line, sizeof line, "DONE %zu/%zu/%zu/%zu\n", ev.done.delivered,
                     ev.done.permanent, ev.done.temporary, ev.done.unknown);
            break;
        case SMTPE_CEV_CLOSED:
            r->closed_reason = ev.closed.reason;
            snprintf(line, sizeof line, "CLOSED %d %u\n", ev.closed.reason, ev.closed.code);
            break;
        default: snprintf(line, sizeof line, "EV %d\n", (int)ev.type); break;
        }
        ob_str(&r->log, line);
    }
}

/* Feeds all of s, taking events whenever the engine stops. */
static void raw_feed(raw *r, const char *s)
{
    size_t n = strlen(s), off = 0;
    int stuck = 0;
    while (off < n && stuck < 3) {
        smtpe_ssize k = smtpe_client_recv(r->c, (const uint8_t *)s + off, n - off, 0);
        assert_true(k >= 0);
        off += (size_t)k;
        stuck = k == 0 ? stuck + 1 : 0;
        raw_events(r);
    }
}

/* Writes (and acknowledges) queued output, at most max octets of it. */
static size_t raw_write(raw *r, size_t max)
{
    size_t len, total = 0;
    const uint8_t *p;
    while (total < max && (p = smtpe_client_send_buf(r->c, &len)) && len > 0) {
        if (len > max - total)
            len = max - total;
        ob_put(&r->out, p, len);
        assert_int_equal(smtpe_client_send_ack(r->c, len), 0);
        total += len;
    }
    return total;
}

/* Greeting and EHLO with caps, then a submitted transaction of n recipients, its commands
 * written; log and output cleared. */
static void raw_ready(raw *r, const char *caps, size_t n)
{
    static const char *const names[8] = {"a@example.org", "b@example.org", "c@example.org",
                                         "d@example.org", "e@example.org", "f@example.org",
                                         "g@example.org", "h@example.org"};
    assert_int_equal(smtpe_client_new(&r->c, &r->cfg, NULL, 0), 0);
    raw_feed(r, GREET);
    raw_write(r, SIZE_MAX);
    raw_feed(r, caps);
    raw_events(r);
    r->txn.reverse_path = "s@example.com";
    for (size_t i = 0; i < n; i++)
        r->rcpts[i].forward_path = names[i];
    r->txn.rcpts = r->rcpts;
    r->txn.rcpt_count = n;
    assert_int_equal(smtpe_client_submit(r->c, &r->txn), 0);
    raw_events(r);
    raw_write(r, SIZE_MAX);
    r->log.len = 0;
    r->out.len = 0;
}

static void raw_free(raw *r)
{
    smtpe_client_free(r->c);
    ob_free(&r->log);
    ob_free(&r->out);
}

static const char *raw_log(raw *r)
{
    ob_put(&r->log, "", 0);
    return (const char *)r->log.p;
}

/* ==== unknown versus temporary ========================================================= */

/* After the session closed with the recipients temporary, the host sends what is still
 * queued (smtpe.h: CLOSED, "close the connection once the output is sent"): that must not
 * complete the content (no final dot, no BDAT LAST), or the server may deliver a message the
 * host will send again. Returns 1 if the rest holds the end of the content. */
static int rest_completes_content(raw *r)
{
    size_t len;
    const uint8_t *p;
    obuf rest = {0};
    int bad;
    while ((p = smtpe_client_send_buf(r->c, &len)) && len > 0) {
        ob_put(&rest, p, len);
        smtpe_client_send_ack(r->c, len);
    }
    ob_put(&rest, "", 0);
    bad = strstr((const char *)rest.p, "\r\n.\r\n") != NULL ||
          strncmp((const char *)rest.p, ".\r\n", 3) == 0 ||
          strstr((const char *)rest.p, " LAST\r\n") != NULL;
    ob_free(&rest);
    return bad;
}

/* The outcome after a close before the end of the content was acknowledged: temporary if
 * the end can no longer reach the server, else unknown. */
static void check_temporary_or_unknown(raw *r, size_t i)
{
    assert_int_equal(r->n_outcomes[i], 1);
    if (r->outcomes[i] == SMTPE_OUTCOME_UNKNOWN)
        return;
    assert_int_equal(r->outcomes[i], SMTPE_OUTCOME_TEMPORARY);
    if (rest_completes_content(r))
        fail_msg("recipient %zu reported temporary, the end of the content still queued", i);
}

/* The final dot acknowledged by the host, then the connection lost: unknown (RFC 5321
 * §4.5.3.2.6); not yet acknowledged, or only in part: temporary. */
static void test_lost_after_dot_acked_is_unknown(void **st)
{
    (void)st;
    for (size_t unacked = 0; unacked <= 4; unacked++) {
        raw r;
        size_t len;
        raw_init(&r);
        raw_ready(&r, CAPS, 2);
        raw_feed(&r, "250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n");
        assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"hi\r\n", 4, 1), 4);
        smtpe_client_send_buf(r.c, &len);
        assert_int_equal(len, 7); /* "hi\r\n.\r\n" */
        raw_write(&r, len - unacked);
        assert_int_equal(smtpe_client_lost(r.c), 0);
        raw_events(&r);
        int want = unacked == 0 ? SMTPE_OUTCOME_UNKNOWN : SMTPE_OUTCOME_TEMPORARY;
        assert_int_equal(r.outcomes[0], want);
        assert_int_equal(r.outcomes[1], want);
        assert_int_equal(r.n_outcomes[0], 1);
        assert_int_equal(r.n_outcomes[1], 1);
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_LOST);
        /* FIXED (found by a hostile-server trial): what was not written is dropped, so a
         * server that half-closed but still reads never gets the end of data of a message
         * reported temporary (the host would send it, and the caller retry: a duplicate) */
        assert_true(smtpe_client_send_buf(r.c, &len) != NULL);
        assert_int_equal(len, 0);
        assert_false(smtpe_client_want(r.c) & SMTPE_WANT_WRITE);
        raw_free(&r);
    }
}

/* BDAT: MAIL, RCPT and BDAT LAST in one pipelined group, all acknowledged, then lost before
 * any reply: the server may have delivered (unknown). */
static void test_lost_after_bdat_last_is_unknown(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    raw_ready(&r, "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n", 1);
    assert_true(smtpe_client_want(r.c) & SMTPE_WANT_CONTENT); /* with the group */
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"hi", 2, 1), 2);
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p, "BDAT 4 LAST\r\nhi\r\n");
    assert_int_equal(smtpe_client_lost(r.c), 0);
    raw_events(&r);
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_UNKNOWN);
    raw_free(&r);
}

/* A malformed reply to the final dot: the server may have delivered (unknown); a timeout
 * before the dot was written: temporary. */
static void test_protocol_error_after_dot_is_unknown(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    raw_ready(&r, CAPS, 1);
    raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"hi\r\n", 4, 1), 4);
    raw_write(&r, SIZE_MAX);
    raw_feed(&r, "25O ok\r\n");
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_UNKNOWN);
    assert_int_equal(r.closed_reason, SMTPE_CLOSE_PROTOCOL_ERROR);
    raw_free(&r);

    raw_init(&r);
    raw_ready(&r, CAPS, 1);
    raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"hi\r\n", 4, 1), 4);
    uint64_t d = smtpe_client_expiry(r.c, 1000); /* nothing written */
    assert_true(d != UINT64_MAX);
    assert_int_equal(smtpe_client_handle_expiry(r.c, d), 1);
    raw_events(&r);
    check_temporary_or_unknown(&r, 0);
    assert_int_equal(r.closed_reason, SMTPE_CLOSE_TIMEOUT);
    raw_free(&r);
}

/* LMTP: one reply of two came, then the connection is lost: the other accepted recipient is
 * unknown, the refused one keeps its refusal, nobody gets two outcomes. */
static void test_lmtp_lost_mid_series(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    r.cfg.lmtp = 1;
    raw_ready(&r, "250-lmtp\r\n250 PIPELINING\r\n", 3);
    raw_feed(&r, "250 ok\r\n250 ok\r\n550 no\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
    raw_write(&r, SIZE_MAX);
    raw_feed(&r, "250 first\r\n");
    assert_string_equal(raw_log(&r), "OUTCOME 1 2 550\nEV 4\nOUTCOME 0 1 250\n");
    assert_int_equal(smtpe_client_lost(r.c), 0);
    raw_events(&r);
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_DELIVERED);
    assert_int_equal(r.outcomes[1], SMTPE_OUTCOME_PERMANENT);
    assert_int_equal(r.outcomes[2], SMTPE_OUTCOME_UNKNOWN);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r.n_outcomes[i], 1);
    raw_free(&r);
}

/* Lost, timeout or abort at every point of a pipelined transaction before the end of the
 * content: one outcome each, never unknown, never delivered. */
static void test_end_at_every_point(void **st)
{
    (void)st;
    static const char *const replies[] = {"250 ok\r\n", "250 ok\r\n", "550 no\r\n", "354 go\r\n"};
    for (int how = 0; how < 3; how++)
        for (size_t stage = 0; stage <= 5; stage++) {
            raw r;
            raw_init(&r);
            raw_ready(&r, CAPS, 2);
            for (size_t i = 0; i < stage && i < 4; i++)
                raw_feed(&r, replies[i]);
            if (stage >= 5) {
                assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"abc", 3, 0), 3);
                raw_write(&r, SIZE_MAX);
            }
            if (how == 0) {
                assert_int_equal(smtpe_client_lost(r.c), 0);
            } else if (how == 1) {
                uint64_t d = smtpe_client_expiry(r.c, 0);
                assert_true(d != UINT64_MAX);
                assert_int_equal(smtpe_client_handle_expiry(r.c, d), 1);
            } else {
                int rc = smtpe_client_abort_content(r.c);
                if (stage < 4) {
                    assert_int_equal(rc, SMTPE_ERR_STATE);
                    smtpe_client_lost(r.c);
                } else {
                    assert_int_equal(rc, 0);
                }
            }
            raw_events(&r);
            for (int i = 0; i < 2; i++) {
                assert_int_equal(r.n_outcomes[i], 1);
                assert_true(r.outcomes[i] != SMTPE_OUTCOME_UNKNOWN);
                assert_true(r.outcomes[i] != SMTPE_OUTCOME_DELIVERED);
            }
            if (stage >= 3)
                assert_int_equal(r.outcomes[1], SMTPE_OUTCOME_PERMANENT);
            assert_int_equal(r.done, 1);
            raw_free(&r);
        }
}

/* ==== timeouts ======================================================================== */

static void distinct_timeouts(smtpe_client_config *cfg)
{
    cfg->greeting_timeout_ms = 1000;
    cfg->command_timeout_ms = 2000;
    cfg->data_timeout_ms = 3000;
    cfg->data_block_timeout_ms = 4000;
    cfg->data_end_timeout_ms = 5000;
}

/* Feeds s at time now without taking events; all of it must be consumed. */
static void feed_at(smtpe_client *c, const char *s, uint64_t now)
{
    assert_int_equal(smtpe_client_recv(c, (const uint8_t *)s, strlen(s), now),
                     (smtpe_ssize)strlen(s));
}

static void take_all(smtpe_client *c)
{
    smtpe_client_event ev;
    while (smtpe_client_next_event(c, &ev) == 1)
        ;
}

static void write_all(smtpe_client *c)
{
    size_t len;
    while (smtpe_client_send_buf(c, &len) && len > 0)
        smtpe_client_send_ack(c, len);
}

/* Each stage's timeout (RFC 5321 §4.5.3.2), restarted by each reply, not by a reply's
 * first octets; none while an event waits or when nothing is outstanding. */
static void test_timeout_per_stage(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    distinct_timeouts(&r.cfg);
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 100), 0);
    assert_int_equal(smtpe_client_expiry(r.c, 100), 1100); /* greeting */
    feed_at(r.c, GREET, 500);
    write_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 500), 2500); /* EHLO */
    feed_at(r.c, CAPS, 600);
    assert_int_equal(smtpe_client_expiry(r.c, 600), UINT64_MAX); /* READY waits */
    take_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 700), UINT64_MAX); /* idle */
    r.rcpts[0].forward_path = "b@example.org";
    r.txn.reverse_path = "a@example.com";
    r.txn.rcpts = r.rcpts;
    r.txn.rcpt_count = 1;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), 0);
    write_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 800), 2800); /* MAIL */
    feed_at(r.c, "250 ok\r\n", 900);
    assert_int_equal(smtpe_client_expiry(r.c, 900), 2900); /* RCPT */
    feed_at(r.c, "250 ok\r\n", 1000);
    assert_int_equal(smtpe_client_expiry(r.c, 1000), 4000); /* DATA's 354 */
    feed_at(r.c, "354 go\r\n", 1100);
    assert_int_equal(smtpe_client_expiry(r.c, 1100), UINT64_MAX); /* CONTENT waits */
    take_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 1200), 5200); /* the host's content */
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
    write_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 1300), 6300); /* the end of the content */
    feed_at(r.c, "25", 2000); /* a reply trickling in does not restart it */
    assert_int_equal(smtpe_client_expiry(r.c, 2000), 6300);
    assert_int_equal(smtpe_client_handle_expiry(r.c, 6299), 0);
    assert_int_equal(smtpe_client_handle_expiry(r.c, 6300), 1);
    take_all(r.c);
    assert_true(smtpe_client_want(r.c) & SMTPE_WANT_CLOSE);
    assert_int_equal(smtpe_client_expiry(r.c, 7000), UINT64_MAX);
    smtpe_client_free(r.c);
}

/* No timer while the host owes an AUTH_STEP response or runs the TLS handshake; the command
 * timeout again after each. */
static void test_timeout_host_owes(void **st)
{
    (void)st;
    raw r;
    smtpe_client_event ev;
    raw_init(&r);
    distinct_timeouts(&r.cfg);
    r.cfg.tls = SMTPE_TLS_OPPORTUNISTIC;
    r.cfg.auth_mechanism = "CRAM-MD5";
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
    feed_at(r.c, GREET, 0);
    write_all(r.c);
    feed_at(r.c, "250-mx\r\n250-AUTH CRAM-MD5\r\n250 STARTTLS\r\n", 10);
    write_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 10), 2010);
    feed_at(r.c, "220 go\r\n", 20);
    assert_int_equal(smtpe_client_expiry(r.c, 20), UINT64_MAX);
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 1);
    assert_int_equal(ev.type, SMTPE_CEV_STARTTLS);
    assert_int_equal(smtpe_client_expiry(r.c, 30), UINT64_MAX); /* the handshake */
    assert_int_equal(smtpe_client_tls_started(r.c, 40), 0);
    write_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 40), 2040); /* EHLO */
    feed_at(r.c, "250-mx\r\n250 AUTH CRAM-MD5\r\n", 50);
    write_all(r.c);
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 1);
    assert_int_equal(ev.type, SMTPE_CEV_AUTH_STEP);
    assert_int_equal(smtpe_client_expiry(r.c, 60), UINT64_MAX); /* the host owes */
    assert_int_equal(smtpe_client_auth_response(r.c, NULL, 0), 0);
    write_all(r.c);
    assert_int_equal(smtpe_client_expiry(r.c, 70), 2070);
    smtpe_client_free(r.c);
}

/* ==== strings with CR, LF, NUL or control octets: refused before any octet exists ====== */

static const char *const bad_octets[] = {"\r", "\n", "\r\n", "\x01", "\x7f", "\t", "\x1b"};

/* Each config string with each bad octet: smtpe_client_new refuses it (INVALID_ARGUMENT),
 * and smtpe_client_memory_size says 0. */
static void test_bad_config_strings(void **st)
{
    (void)st;
    static char s[8][64];
    for (size_t b = 0; b < sizeof bad_octets / sizeof *bad_octets; b++) {
        for (int field = 0; field < 7; field++) {
            smtpe_client_config cfg;
            smtpe_client *c = NULL;
            smtpe_param attr = {SP("NAME"), {NULL, 0}};
            smtpe_client_config_init(&cfg);
            cfg.auth_mechanism = "PLAIN";
            cfg.auth_user = "user";
            cfg.auth_password = "pass";
            cfg.auth_plaintext_ok = 1;
            snprintf(s[field], sizeof s[field], "ab%scd", bad_octets[b]);
            switch (field) {
            case 0: snprintf(s[field], sizeof s[field], "mx%s.example", bad_octets[b]);
                    cfg.helo_name = s[field]; break;
            case 1: cfg.auth_user = s[field]; break;
            case 2: cfg.auth_password = s[field]; break;
            case 3: cfg.auth_authzid = s[field]; break;
            case 4: cfg.auth_token = s[field]; cfg.auth_mechanism = "XOAUTH2"; break;
            case 5: snprintf(s[field], sizeof s[field], "X%sY", bad_octets[b]);
                    cfg.auth_mechanism = s[field]; break;
            case 6:
                attr.value.ptr = (const uint8_t *)s[field];
                attr.value.len = strlen(s[field]);
                cfg.xclient = &attr;
                cfg.xclient_count = 1;
                break;
            }
            if (smtpe_client_new(&c, &cfg, NULL, 0) != SMTPE_ERR_INVALID_ARGUMENT)
                fail_msg("field %d with octet %#x accepted", field,
                         (unsigned)(uint8_t)bad_octets[b][0]);
            assert_null(c);
            assert_int_equal(smtpe_client_memory_size(&cfg), 0);
        }
    }
    /* a NUL inside an XCLIENT value (a span) and in its keyword */
    {
        smtpe_client_config cfg;
        smtpe_client *c = NULL;
        smtpe_param attr = {SP("NAME"), {(const uint8_t *)"a\0b", 3}};
        smtpe_param key = {{(const uint8_t *)"NA\0ME", 5}, SP("x")};
        smtpe_param eq = {SP("NAME=x"), SP("x")};
        smtpe_client_config_init(&cfg);
        cfg.xclient = &attr;
        cfg.xclient_count = 1;
        assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
        cfg.xclient = &key;
        assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
        cfg.xclient = &eq;
        assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    }
}

/* FIXED (e97559e), found in review as a bug:
 * smtpe.h says the AUTH strings are "at most 255 octets" (and a SASL mechanism name is
 * at most 20 characters, RFC 4422 §3.1), but clean_string(t, max) lets through strings of
 * exactly max octets: a 256-octet auth_user/password/authzid and a 21-character
 * auth_mechanism are accepted (and the token limit is 8193, not 8192). */
static void test_fixed_auth_string_limits_off_by_one(void **st)
{
    (void)st;
    static char big[300], mech[40];
    smtpe_client_config cfg;
    smtpe_client *c = NULL;
    memset(big, 'u', 256);
    big[256] = 0;
    smtpe_client_config_init(&cfg);
    cfg.auth_mechanism = "PLAIN";
    cfg.auth_user = big;
    cfg.auth_password = "p";
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    big[255] = 0; /* 255: fine */
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), 0);
    smtpe_client_free(c);
    memset(mech, 'M', 21);
    mech[21] = 0;
    cfg.auth_mechanism = mech;
    cfg.auth_user = "u";
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
}

/* Every string of a transaction with each bad octet: SMTPE_ERR_INVALID_ARGUMENT, nothing
 * queued (even when the session is ready), the session still usable. */
static void test_bad_transaction_strings(void **st)
{
    (void)st;
    for (size_t b = 0; b < sizeof bad_octets / sizeof *bad_octets; b++) {
        for (int field = 0; field < 6; field++) {
            raw r;
            static char s[64];
            smtpe_param xf = {SP("NAME"), SP("x")};
            size_t len;
            raw_init(&r);
            assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
            raw_feed(&r, GREET);
            raw_write(&r, SIZE_MAX);
            raw_feed(&r, "250-mx\r\n250-PIPELINING\r\n250-DSN\r\n250 XFORWARD NAME ADDR\r\n");
            r.txn.reverse_path = "s@example.com";
            r.rcpts[0].forward_path = "b@example.org";
            r.txn.rcpts = r.rcpts;
            r.txn.rcpt_count = 1;
            switch (field) {
            case 0: snprintf(s, sizeof s, "s%s@example.com", bad_octets[b]);
                    r.txn.reverse_path = s; break;
            case 1: snprintf(s, sizeof s, "b@example.org%sRSET", bad_octets[b]);
                    r.rcpts[0].forward_path = s; break;
            case 2: snprintf(s, sizeof s, "rfc822;b%s@example.org", bad_octets[b]);
                    r.rcpts[0].orcpt = s; break;
            case 3: snprintf(s, sizeof s, "id%s1", bad_octets[b]); r.txn.envid = s; break;
            case 4:
                snprintf(s, sizeof s, "x%sy", bad_octets[b]);
                xf.value.ptr = (const uint8_t *)s;
                xf.value.len = strlen(s);
                r.txn.xforward = &xf;
                r.txn.xforward_count = 1;
                break;
            case 5: snprintf(s, sizeof s, "rfc%s822;b@example.org", bad_octets[b]);
                    r.rcpts[0].orcpt = s; break;
            }
            if (smtpe_client_submit(r.c, &r.txn) != SMTPE_ERR_INVALID_ARGUMENT)
                fail_msg("transaction field %d with octet %#x accepted", field,
                         (unsigned)(uint8_t)bad_octets[b][0]);
            smtpe_client_send_buf(r.c, &len);
            assert_int_equal(len, 0);
            raw_events(&r);
            assert_int_equal(r.n_outcomes[0], 0);
            /* still usable */
            memset(&r.txn, 0, sizeof r.txn);
            memset(r.rcpts, 0, sizeof r.rcpts);
            r.txn.reverse_path = "s@example.com";
            r.rcpts[0].forward_path = "b@example.org";
            r.txn.rcpts = r.rcpts;
            r.txn.rcpt_count = 1;
            assert_int_equal(smtpe_client_submit(r.c, &r.txn), 0);
            raw_free(&r);
        }
    }
}

/* Paths that would smuggle a parameter or a second command, and other malformed paths. */
static void test_bad_paths(void **st)
{
    (void)st;
    static const char *const bad[] = {"a@b> SIZE=1 <x@y", "a@b>", "<a@b", "a b@example.org",
                                      "a@", "@example.org", "a@b..c", "@r.example:a@b.example",
                                      "a@[1.2.3]", "a@b\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        raw r;
        raw_init(&r);
        assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
        r.txn.reverse_path = bad[i];
        r.rcpts[0].forward_path = "b@example.org";
        r.txn.rcpts = r.rcpts;
        r.txn.rcpt_count = 1;
        if (smtpe_client_submit(r.c, &r.txn) != SMTPE_ERR_INVALID_ARGUMENT)
            fail_msg("reverse-path \"%s\" accepted", bad[i]);
        r.txn.reverse_path = "s@example.com";
        r.rcpts[0].forward_path = bad[i];
        if (smtpe_client_submit(r.c, &r.txn) != SMTPE_ERR_INVALID_ARGUMENT)
            fail_msg("forward-path \"%s\" accepted", bad[i]);
        raw_free(&r);
    }
}

/* ==== API misuse: the documented error, never a crash ================================= */

static void test_null_session(void **st)
{
    (void)st;
    smtpe_client_event ev;
    size_t len = 99;
    assert_int_equal(smtpe_client_submit(NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_content(NULL, NULL, 0, 1), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_abort_content(NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_auth_response(NULL, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_tls_started(NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_quit(NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_lost(NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_recv(NULL, NULL, 0, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_next_event(NULL, &ev), 0);
    assert_null(smtpe_client_send_buf(NULL, &len));
    assert_int_equal(len, 0);
    assert_int_equal(smtpe_client_send_ack(NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_want(NULL), 0);
    assert_int_equal(smtpe_client_expiry(NULL, 0), UINT64_MAX);
    assert_int_equal(smtpe_client_handle_expiry(NULL, 0), 0);
    assert_null(smtpe_client_get_caps(NULL));
    smtpe_client_free(NULL);
    assert_int_equal(smtpe_client_new(NULL, NULL, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_memory_size(NULL), 0);
}

/* Each call in each state where it does not fit: SMTPE_ERR_STATE, and the session goes on
 * (its output unchanged). */
static void check_misuse(smtpe_client *c, int content_ok, int auth_ok, int tls_ok)
{
    size_t before, after;
    smtpe_client_send_buf(c, &before);
    if (!content_ok) {
        assert_int_equal(smtpe_client_content(c, (const uint8_t *)"x", 1, 1), SMTPE_ERR_STATE);
        assert_int_equal(smtpe_client_content(c, NULL, 0, 1), SMTPE_ERR_STATE);
        assert_int_equal(smtpe_client_abort_content(c), SMTPE_ERR_STATE);
    }
    if (!auth_ok) {
        assert_int_equal(smtpe_client_auth_response(c, (const uint8_t *)"x", 1), SMTPE_ERR_STATE);
        assert_int_equal(smtpe_client_auth_response(c, NULL, 0), SMTPE_ERR_STATE);
    }
    if (!tls_ok)
        assert_int_equal(smtpe_client_tls_started(c, 0), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_client_send_ack(c, before + 1), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_recv(c, NULL, 1, 0), SMTPE_ERR_INVALID_ARGUMENT);
    smtpe_client_send_buf(c, &after);
    assert_int_equal(before, after);
}

static void test_calls_in_wrong_states(void **st)
{
    (void)st;
    raw r;
    smtpe_client_event ev;
    raw_init(&r);
    r.cfg.tls = SMTPE_TLS_OPPORTUNISTIC;
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
    check_misuse(r.c, 0, 0, 0); /* before the greeting */
    feed_at(r.c, GREET, 0);
    check_misuse(r.c, 0, 0, 0); /* EHLO queued */
    write_all(r.c);
    feed_at(r.c, "250-mx\r\n250-PIPELINING\r\n250 STARTTLS\r\n", 0);
    write_all(r.c);
    check_misuse(r.c, 0, 0, 0); /* STARTTLS sent */
    feed_at(r.c, "220 go\r\n", 0);
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 1);
    check_misuse(r.c, 0, 0, 1); /* the handshake */
    assert_int_equal(smtpe_client_tls_started(r.c, 0), 0);
    assert_int_equal(smtpe_client_tls_started(r.c, 0), SMTPE_ERR_STATE);
    write_all(r.c);
    feed_at(r.c, "250-mx\r\n250 PIPELINING\r\n", 0);
    take_all(r.c);
    check_misuse(r.c, 0, 0, 0); /* ready */
    r.rcpts[0].forward_path = "b@example.org";
    r.txn.reverse_path = "a@example.com";
    r.txn.rcpts = r.rcpts;
    r.txn.rcpt_count = 1;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), 0);
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_STATE); /* one at a time */
    check_misuse(r.c, 0, 0, 0); /* MAIL RCPT DATA queued */
    write_all(r.c);
    feed_at(r.c, "250 ok\r\n", 0);
    feed_at(r.c, "250 ok\r\n", 0);
    feed_at(r.c, "354 go\r\n", 0);
    take_all(r.c);
    check_misuse(r.c, 1, 0, 0); /* content wanted */
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
    check_misuse(r.c, 0, 0, 0); /* the end queued */
    write_all(r.c);
    feed_at(r.c, "250 ok\r\n", 0);
    take_all(r.c);
    assert_int_equal(smtpe_client_quit(r.c), 0);
    assert_int_equal(smtpe_client_quit(r.c), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_STATE);
    check_misuse(r.c, 0, 0, 0); /* QUIT queued */
    write_all(r.c);
    feed_at(r.c, "221 bye\r\n", 0);
    take_all(r.c);
    assert_true(smtpe_client_want(r.c) & SMTPE_WANT_CLOSE);
    check_misuse(r.c, 0, 0, 0); /* closed */
    assert_int_equal(smtpe_client_lost(r.c), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_client_quit(r.c), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_client_recv(r.c, (const uint8_t *)"250 x\r\n", 7, 0), 7); /* dropped */
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 0);
    smtpe_client_free(r.c);
}

/* Bad transaction shapes: no recipient, too many, NULL arrays, out-of-range enums. */
static void test_bad_transaction_shapes(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    r.cfg.max_recipients = 2;
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
    r.rcpts[0].forward_path = r.rcpts[1].forward_path = r.rcpts[2].forward_path = "b@example.org";
    r.txn.reverse_path = "a@example.com";
    r.txn.rcpts = r.rcpts;
    r.txn.rcpt_count = 3;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.rcpt_count = 0;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.rcpt_count = 1;
    r.txn.rcpts = NULL;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.rcpts = r.rcpts;
    r.txn.reverse_path = NULL;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.reverse_path = "a@example.com";
    r.txn.body = (smtpe_body_type)7;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.body = SMTPE_BODY_UNSPECIFIED;
    r.txn.has_mt_priority = 1;
    r.txn.mt_priority = 10;
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.has_mt_priority = 0;
    r.txn.by_mode = 'X';
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.by_mode = 0;
    r.rcpts[0].notify = SMTPE_NOTIFY_NEVER | SMTPE_NOTIFY_SUCCESS; /* RFC 3461 §4.1 */
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.rcpts[0].notify = 0;
    r.txn.xforward_count = 1; /* NULL array */
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    r.txn.xforward_count = 0;
    assert_int_equal(smtpe_client_submit_versioned(r.c, 99, &r.txn), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), 0);
    smtpe_client_free(r.c);
}

/* ==== limits at their boundaries ====================================================== */

/* max_reply_line 512: a 512-octet line (CRLF included, RFC 5321 §4.5.3.1.5) is taken, a
 * 513-octet one is a protocol error; max_reply_size likewise for a whole reply. */
static void test_reply_line_limits(void **st)
{
    (void)st;
    for (size_t len = 511; len <= 513; len++) {
        raw r;
        static char line[600];
        raw_init(&r);
        r.cfg.max_reply_line = 512;
        r.cfg.max_reply_size = 1024;
        assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
        memset(line, 'x', len);
        memcpy(line, "220 ", 4);
        memcpy(line + len - 2, "\r\n", 3);
        raw_feed(&r, line);
        if (len <= 512)
            assert_int_equal(r.closed_reason, -1);
        else
            assert_int_equal(r.closed_reason, SMTPE_CLOSE_PROTOCOL_ERROR);
        raw_free(&r);
    }
    for (size_t total = 1023; total <= 1025; total++) {
        raw r;
        static char reply[1100];
        raw_init(&r);
        r.cfg.max_reply_line = 512;
        r.cfg.max_reply_size = 1024;
        assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
        /* "220-" lines of 500 octets, then a last "220 " line: total octets */
        memset(reply, 'x', total);
        memcpy(reply, "220-", 4);
        memcpy(reply + 498, "\r\n220-", 6);
        memcpy(reply + 998, "\r\n220 ", 6);
        memcpy(reply + total - 2, "\r\n", 3);
        raw_feed(&r, reply);
        if (r.closed_reason != (total <= 1024 ? -1 : SMTPE_CLOSE_PROTOCOL_ERROR))
            fail_msg("a reply of %zu octets: closed %d", total, r.closed_reason);
        raw_free(&r);
    }
}

/* max_unanswered 512 (RFC 2920 §3.1 deadlock avoidance): with 60 recipients the client never
 * has more than 512 command octets unanswered, except one command alone. */
static void test_max_unanswered_512(void **st)
{
    (void)st;
    smtpe_client_config cfg;
    smtpe_client *c;
    smtpe_client_txn txn;
    static smtpe_client_rcpt rcpts[60];
    static char names[60][40];
    size_t outstanding = 0, lines_out = 0, replies = 0, len;
    size_t line_len[200], head = 0, count = 0;
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "client.example";
    cfg.max_unanswered = 512;
    cfg.output_buffer_size = 4096;
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), 0);
    feed_at(c, GREET, 0);
    write_all(c);
    feed_at(c, CAPS, 0);
    take_all(c);
    memset(&txn, 0, sizeof txn);
    for (int i = 0; i < 60; i++) {
        snprintf(names[i], sizeof names[i], "recipient-number-%02d@example.org", i);
        rcpts[i].forward_path = names[i];
        rcpts[i].notify = 0;
        rcpts[i].orcpt = NULL;
    }
    txn.reverse_path = "a@example.com";
    txn.rcpts = rcpts;
    txn.rcpt_count = 60;
    assert_int_equal(smtpe_client_submit(c, &txn), 0);
    while (replies < 62) { /* MAIL, 60 RCPT, DATA */
        const uint8_t *p = smtpe_client_send_buf(c, &len);
        /* split what was sent into command lines */
        for (size_t i = 0; i < len; i++) {
            static size_t cur;
            cur++;
            if (p[i] == '\n') {
                line_len[(head + count++) % 200] = cur;
                outstanding += cur;
                cur = 0;
                lines_out++;
            }
        }
        smtpe_client_send_ack(c, len);
        if (count > 1 && outstanding > 512)
            fail_msg("%zu command octets unanswered (%zu commands)", outstanding, count);
        assert_true(count > 0);
        outstanding -= line_len[head];
        head = (head + 1) % 200;
        count--;
        feed_at(c, "250 ok\r\n", 0);
        replies++;
        take_all(c);
    }
    assert_int_equal(lines_out, 62);
    smtpe_client_free(c);
}

/* max_recipients at 1 and at 100000 (SMTP and LMTP): every recipient exactly one outcome,
 * memory exactly the formula. */
static void big_transaction(int lmtp, unsigned n)
{
    smtpe_client_config cfg;
    smtpe_client *c;
    smtpe_client_txn txn;
    smtpe_client_rcpt *rcpts = calloc(n, sizeof *rcpts);
    unsigned char *seen = calloc(n, 1);
    char (*names)[24] = calloc(n, sizeof *names);
    sim_server s;
    smtpe_client_event ev;
    size_t done = 0, outcomes = 0, rounds = 0;
    assert_non_null(rcpts);
    assert_non_null(seen);
    assert_non_null(names);
    memset(&s, 0, sizeof s);
    s.lmtp = lmtp;
    s.ehlo = "250-mx\r\n250 PIPELINING\r\n";
    for (unsigned i = 0; i < n && i < SIM_MAX_RCPT; i += 3)
        s.rcpt[i] = "550 5.1.1 no\r\n";
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "client.example";
    cfg.lmtp = lmtp;
    cfg.max_recipients = n;
    size_t size = smtpe_client_memory_size(&cfg);
    void *mem = malloc(size);
    assert_int_equal(smtpe_client_init(&c, mem, size - 1, &cfg, 0), SMTPE_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(smtpe_client_init(&c, mem, size, &cfg, 0), 0);
    for (unsigned i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "r%u@example.org", i);
        rcpts[i].forward_path = names[i];
    }
    memset(&txn, 0, sizeof txn);
    txn.reverse_path = "a@example.com";
    txn.rcpts = rcpts;
    txn.rcpt_count = n;
    assert_int_equal(smtpe_client_submit(c, &txn), 0);
    srv_reply(&s, NULL, GREET);
    while (!done) {
        size_t len;
        const uint8_t *p;
        int any = 0;
        assert_true(++rounds < 50000000);
        while (smtpe_client_next_event(c, &ev) == 1) {
            any = 1;
            if (ev.type == SMTPE_CEV_OUTCOME) {
                assert_true(ev.outcome.index < n);
                assert_int_equal(seen[ev.outcome.index]++, 0);
                outcomes++;
            } else if (ev.type == SMTPE_CEV_TRANSACTION_DONE) {
                done = 1;
            } else if (ev.type == SMTPE_CEV_CLOSED) {
                fail_msg("closed: %.*s", (int)ev.closed.text.len, ev.closed.text.ptr);
            }
        }
        if ((p = smtpe_client_send_buf(c, &len)) && len > 0) {
            srv_input(&s, p, len);
            smtpe_client_send_ack(c, len);
            any = 1;
        }
        if (smtpe_client_want(c) & SMTPE_WANT_CONTENT) {
            assert_int_equal(smtpe_client_content(c, (const uint8_t *)"x\r\n", 3, 1), 3);
            any = 1;
        }
        if (s.to_client.len && (smtpe_client_want(c) & SMTPE_WANT_READ)) {
            smtpe_ssize r = smtpe_client_recv(c, s.to_client.p, s.to_client.len, 0);
            assert_true(r >= 0);
            ob_drop(&s.to_client, (size_t)r);
            any = any || r > 0;
        }
        if (!any && !done)
            fail_msg("stalled after %zu outcomes of %u", outcomes, n);
    }
    assert_int_equal(outcomes, n);
    assert_int_equal(s.violations, 0);
    free(mem);
    free(rcpts);
    free(seen);
    free(names);
    ob_free(&s.line);
    ob_free(&s.msg);
    ob_free(&s.to_client);
    ob_free(&s.commands);
}

static void test_max_recipients_boundaries(void **st)
{
    (void)st;
    big_transaction(0, 1);
    big_transaction(1, 1);
    big_transaction(0, 100000);
    big_transaction(1, 100000);
}

/* Memory follows its formula (smtpe.h): S + max_reply_line + output_buffer_size +
 * 12 * (max_unanswered / 6 + 8) + 2 * ceil(max_recipients / 8), rounded to max_align_t,
 * with one S for every config. */
static void test_memory_formula(void **st)
{
    (void)st;
    static const size_t lines[] = {512, 2048, 65536}, outs[] = {4096, 16384, 16777216},
                        unans[] = {512, 4096, 1048576};
    static const unsigned rcpts[] = {1, 1000, 100000};
    long s_first = -1;
    for (int i = 0; i < 81; i++) {
        smtpe_client_config cfg;
        smtpe_client_config_init(&cfg);
        cfg.max_reply_line = lines[i % 3];
        cfg.max_reply_size = 1048576;
        cfg.output_buffer_size = outs[i / 3 % 3];
        cfg.max_unanswered = unans[i / 9 % 3];
        cfg.max_recipients = rcpts[i / 27 % 3];
        size_t size = smtpe_client_memory_size(&cfg);
        size_t parts = cfg.max_reply_line + cfg.output_buffer_size +
                       12 * (cfg.max_unanswered / 6 + 8) + 2 * ((cfg.max_recipients + 7) / 8);
        assert_true(size > parts);
        long s = (long)(size - parts);
        if (s_first < 0)
            s_first = s;
        /* the rounding of the parts may move S by less than 3 alignment units */
        if (labs(s - s_first) >= 3 * (long)_Alignof(max_align_t))
            fail_msg("S is %ld for config %d, %ld for the first", s, i, s_first);
        assert_int_equal(size % _Alignof(max_align_t), 0);
    }
}

/* ==== AUTH exchanges against hostile servers ========================================== */

/* A 334 where none fits, a 3xx that is not 334, bad base64, an extra prompt: each a
 * protocol error, no credential octet after it. */
static const char *auth_case_mech, *auth_case_caps, *auth_case_script[4];
static const char *auth_case_want_log;

static void sc_auth_case(ch *h)
{
    h->cfg.auth_mechanism = auth_case_mech;
    h->cfg.auth_user = "user";
    h->cfg.auth_password = "pass";
    h->cfg.auth_token = "tok";
    h->cfg.auth_plaintext_ok = 1;
    h->auth_steps[0] = "first";
    h->auth_steps[1] = "second";
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, auth_case_caps);
    ch_take_out(h);
    for (int i = 0; i < 4 && auth_case_script[i]; i++)
        ch_server(h, auth_case_script[i]);
    const char *log = ch_take_log(h);
    if (!strstr(log, auth_case_want_log))
        fail_msg("%s: log \"%s\" lacks \"%s\"", auth_case_mech, log, auth_case_want_log);
}

static void test_auth_hostile(void **st)
{
    (void)st;
    static const struct {
        const char *mech, *caps, *script[4], *want;
    } cases[] = {
        /* PLAIN with its initial response answered 334: nothing more to send */
        {"PLAIN", "250 AUTH PLAIN\r\n", {"334 \r\n"}, "CLOSED protocol-error"},
        /* LOGIN: a third prompt */
        {"LOGIN", "250 AUTH LOGIN\r\n", {"334 VXNlcm5hbWU6\r\n", "334 UGFzc3dvcmQ6\r\n",
                                          "334 more\r\n"}, "CLOSED protocol-error"},
        /* 354 to AUTH */
        {"PLAIN", "250 AUTH PLAIN\r\n", {"354 go\r\n"}, "CLOSED protocol-error"},
        /* XOAUTH2: the error exchange twice */
        {"XOAUTH2", "250 AUTH XOAUTH2\r\n", {"334 eyJ9\r\n", "334 eyJ9\r\n"},
         "CLOSED protocol-error"},
        /* a host mechanism's challenge that is not base64 */
        {"X-HOST", "250 AUTH X-HOST\r\n", {"334 !!!!\r\n"}, "CLOSED protocol-error"},
        /* refused: auth-failed, recipients none (no transaction) */
        {"LOGIN", "250 AUTH LOGIN\r\n", {"334 VXNlcm5hbWU6\r\n", "535 5.7.8 no\r\n"},
         "CLOSED auth-failed 535"},
        /* 421 in the middle */
        {"LOGIN", "250 AUTH LOGIN\r\n", {"334 VXNlcm5hbWU6\r\n", "421 4.3.2 bye\r\n"},
         "CLOSED 421 421"},
        /* the configured mechanism not offered: no AUTH at all */
        {"LOGIN", "250 AUTH PLAIN\r\n", {NULL}, "CLOSED auth-failed"},
        /* a host mechanism over several steps, then success */
        {"X-HOST", "250 AUTH X-HOST\r\n", {"334 YQ==\r\n", "235 ok\r\n"}, "auth_ok=1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        static char caps[200];
        snprintf(caps, sizeof caps, "250-mx.example\r\n%s", cases[i].caps);
        auth_case_mech = cases[i].mech;
        auth_case_caps = caps;
        memcpy(auth_case_script, cases[i].script, sizeof auth_case_script);
        auth_case_want_log = cases[i].want;
        run3(sc_auth_case);
    }
}

/* FIXED (e97559e), found in review as a bug:
 * an EHLO AUTH line is kept to 256 octets, cut at a word (keep_line, CAP_LINE_MAX), so
 * a server that lists many mechanisms before the one configured (RFC 4954 §3 puts no limit
 * on the list; the line is within max_reply_line) is told "the server offers no usable AUTH
 * mechanism" and the session ends with SMTPE_CLOSE_AUTH_FAILED although it offers it.
 * Expected: AUTH PLAIN is sent (smtpe.h: "a mechanism name, which the server must offer"). */
static void sc_long_auth_line(ch *h)
{
    static char caps[600];
    char *p = caps;
    p += sprintf(p, "250-mx.example\r\n250 AUTH");
    for (int i = 0; i < 30; i++)
        p += sprintf(p, " X-VENDOR-MECH-%02d", i);
    sprintf(p, " PLAIN\r\n");
    h->cfg.auth_mechanism = "PLAIN";
    h->cfg.auth_user = "u";
    h->cfg.auth_password = "p";
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_server(h, GREET);
    ch_take_out(h);
    ch_server(h, caps);
    OUT(h, "AUTH PLAIN AHUAcA==\r\n");
}

static void test_fixed_long_auth_line_truncated(void **st)
{
    (void)st;
    run3(sc_long_auth_line);
}

/* ==== LMTP reply counts ================================================================ */

/* More replies after the content than accepted recipients: the extra one is unsolicited (a
 * protocol error), never taken for a later command; fewer: the client waits, then the
 * timeout leaves the rest unknown. */
static void sc_lmtp_extra(ch *h)
{
    h->cfg.lmtp = 1;
    open_ok(h);
    ch_server(h, "220 lmtp\r\n");
    ch_server(h, "250-lmtp\r\n250 PIPELINING\r\n");
    ch_take_log(h);
    assert_int_equal(ch_submit(h, "a@example.com", TWO, 2), 0);
    ch_take_out(h);
    ch_server(h, "250 ok\r\n250 ok\r\n550 no\r\n354 go\r\n");
    ch_take_out(h);
    ch_server(h, "250 a\r\n250 extra\r\n");
    const char *log = ch_take_log(h);
    assert_non_null(strstr(log, "OUTCOME 0 delivered 250 - a\n"));
    assert_non_null(strstr(log, "DONE 1/1/0/0 reusable\n"));
    assert_non_null(strstr(log, "CLOSED protocol-error"));
    assert_int_equal(count_of(log, "OUTCOME"), 2);
}

static void sc_lmtp_fewer(ch *h)
{
    h->cfg.lmtp = 1;
    open_ok(h);
    ch_server(h, "220 lmtp\r\n");
    ch_server(h, "250-lmtp\r\n250 PIPELINING\r\n");
    ch_take_log(h);
    assert_int_equal(ch_submit(h, "a@example.com", THREE, 3), 0);
    ch_server(h, "250 ok\r\n250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n");
    ch_take_out(h);
    ch_server(h, "250 a\r\n");
    ch_take_log(h);
    ch_time(h, 600000);
    LOG(h, "EXPIRED\nOUTCOME 1 unknown 000 - timed out waiting for the server [local]\n"
           "OUTCOME 2 unknown 000 - timed out waiting for the server [local]\n"
           "DONE 1/0/0/2\nCLOSED timeout 000 timed out waiting for the server\n");
}

static void test_lmtp_reply_counts(void **st)
{
    (void)st;
    run3(sc_lmtp_extra);
    run3(sc_lmtp_fewer);
}

/* LMTP: a 354 after every RCPT was refused (how many replies the lone dot gets is not
 * defined): the session ends; each recipient keeps its one refusal. */
static void sc_lmtp_lone_dot(ch *h)
{
    h->cfg.lmtp = 1;
    open_ok(h);
    ch_server(h, "220 lmtp\r\n");
    ch_server(h, "250-lmtp\r\n250 PIPELINING\r\n");
    ch_take_log(h);
    assert_int_equal(ch_submit(h, "a@example.com", TWO, 2), 0);
    ch_take_out(h);
    ch_server(h, "250 ok\r\n550 a\r\n550 b\r\n354 go\r\n");
    const char *log = ch_take_log(h);
    assert_int_equal(count_of(log, "OUTCOME 0 permanent 550"), 1);
    assert_int_equal(count_of(log, "OUTCOME 1 permanent 550"), 1);
    assert_int_equal(count_of(log, "OUTCOME"), 2);
    assert_non_null(strstr(log, "CLOSED protocol-error"));
}

static void test_lmtp_lone_dot(void **st)
{
    (void)st;
    run3(sc_lmtp_lone_dot);
}

/* ==== replies during the content, replies before their command ======================== */

/* A 421 while the content streams ends the session, recipients temporary with the 421; any
 * other reply then is a protocol error (temporary, code 0); nothing more is sent, and never
 * the final dot. */
static void test_reply_mid_content(void **st)
{
    (void)st;
    static const struct {
        const char *reply;
        int reason;
        unsigned code;
    } cases[] = {{"421 4.3.2 bye\r\n", SMTPE_CLOSE_SERVER_421, 421},
                 {"250 2.0.0 early\r\n", SMTPE_CLOSE_PROTOCOL_ERROR, 0},
                 {"554 5.0.0 stop\r\n", SMTPE_CLOSE_PROTOCOL_ERROR, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        raw r;
        size_t len;
        raw_init(&r);
        raw_ready(&r, CAPS, 1);
        raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
        assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"line\r\n", 6, 0), 6);
        raw_write(&r, SIZE_MAX);
        r.out.len = 0;
        raw_feed(&r, cases[i].reply);
        assert_int_equal(r.closed_reason, cases[i].reason);
        assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_TEMPORARY);
        assert_int_equal(r.codes[0], cases[i].code);
        assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1),
                         SMTPE_ERR_STATE);
        raw_write(&r, SIZE_MAX);
        smtpe_client_send_buf(r.c, &len);
        assert_int_equal(len, 0);
        ob_put(&r.out, "", 0);
        assert_null(strstr((const char *)r.out.p, ".\r\n"));
        raw_free(&r);
    }
}

/* The server answers the final dot before the host has even been handed it: the reply
 * cannot be to it (a protocol error), and the recipients are temporary, not delivered. */
static void test_reply_before_dot_handed(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    raw_ready(&r, CAPS, 1);
    raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
    raw_feed(&r, "250 2.0.0 queued\r\n");
    assert_int_equal(r.closed_reason, SMTPE_CLOSE_PROTOCOL_ERROR);
    check_temporary_or_unknown(&r, 0);
    raw_free(&r);
}

/* ---- a reply is judged by its first octet ----------------------------------------------
 * FIXED (found by the gem's hostile review, bindings/ruby/test/test_hostile.rb): a reply was
 * judged by its last octet, so "250 2.0.0 queued" before the dot was handed out and its CRLF
 * after the dot was written was the verdict on the dot, the recipient delivered. A server
 * cannot be answering octets it has not read: a reply whose first octet came before its
 * command was handed to the host answers nothing the client sent. */

#define BDAT_CAPS "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n"

/* Feeds s to the session piece octets per call (0: whole), taking events between calls. */
static void raw_feed_split(raw *r, const char *s, size_t piece)
{
    size_t n = strlen(s), off = 0;
    while (off < n) {
        size_t k = piece && piece < n - off ? piece : n - off;
        smtpe_ssize got = smtpe_client_recv(r->c, (const uint8_t *)s + off, k, 0);
        assert_true(got > 0);
        off += (size_t)got;
        raw_events(r);
    }
}

/* A transaction of n recipients up to where the end of the content is the next thing to
 * send: DATA's 354 came (or, under BDAT, the replies to MAIL and RCPT). */
static void raw_to_content(raw *r, int bdat, size_t n)
{
    raw_ready(r, bdat ? BDAT_CAPS : r->cfg.lmtp ? "250-lmtp\r\n250 PIPELINING\r\n" : CAPS, n);
    for (size_t i = 0; i <= n; i++) /* the MAIL's 250 and each RCPT's */
        raw_feed(r, "250 ok\r\n");
    if (!bdat)
        raw_feed(r, "354 go\r\n");
}

/* The end of the content in what the host wrote. */
static int raw_out_has_end(raw *r, int bdat)
{
    ob_put(&r->out, "", 0); /* a NUL after the octets, not counted */
    return strstr((const char *)r->out.p, bdat ? " LAST\r\n" : "\r\n.\r\n") != NULL;
}

/* DATA and BDAT LAST; the content given before the reply's first octet (queued, not handed)
 * or only after it; the early part fed whole, in threes, octet by octet: the reply is "a
 * reply with no command outstanding", and the recipient, whose end of content then went out
 * with no reply to it, unknown, never delivered. */
static void test_reply_begun_before_end_handed(void **st)
{
    (void)st;
    static const size_t pieces[] = {0, 3, 1};
    for (int v = 0; v < 12; v++) {
        int bdat = v & 1, given = v >> 1 & 1;
        size_t piece = pieces[v >> 2];
        raw r;
        raw_init(&r);
        raw_to_content(&r, bdat, 1);
        if (given)
            assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
        raw_feed_split(&r, "250 2.0.0 queued", piece);
        if (!given)
            assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
        assert_int_equal(r.closed_reason, -1);
        r.out.len = 0;
        raw_write(&r, SIZE_MAX); /* handed out and written... */
        assert_true(raw_out_has_end(&r, bdat));
        raw_feed(&r, "\r\n"); /* ...before the reply's CRLF */
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_PROTOCOL_ERROR);
        assert_int_equal(r.n_outcomes[0], 1);
        assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_UNKNOWN);
        assert_int_equal(r.codes[0], 0);
        raw_free(&r);
    }
}

/* A multi-line reply is judged by its first line's first octet: later lines that come after
 * the end was written do not make it the verdict on the end. */
static void test_multiline_reply_begun_before_end_handed(void **st)
{
    (void)st;
    for (int bdat = 0; bdat <= 1; bdat++) {
        raw r;
        raw_init(&r);
        raw_to_content(&r, bdat, 1);
        assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
        raw_feed(&r, "250-2.0.0 queued\r\n250-2.0.0 as");
        assert_int_equal(r.closed_reason, -1);
        raw_write(&r, SIZE_MAX);
        raw_feed(&r, " 1234\r\n250 2.0.0 ok\r\n");
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_PROTOCOL_ERROR);
        assert_int_equal(r.n_outcomes[0], 1);
        assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_UNKNOWN);
        raw_free(&r);
    }
}

/* A 421 begun after the end was handed out but before it was all written is not the verdict
 * on it (the server has not read it all): the session's 421, the recipient unknown (the end
 * was written after all); begun before the end was handed out: the same. Begun once it was
 * written: the verdict, temporary with the 421. */
static void test_421_begun_before_end_written(void **st)
{
    (void)st;
    for (int v = 0; v < 6; v++) {
        int bdat = v & 1, stage = v >> 1; /* 0: not handed, 1: handed, 2: written */
        raw r;
        size_t len;
        raw_init(&r);
        raw_to_content(&r, bdat, 1);
        assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
        if (stage == 1)
            assert_non_null(smtpe_client_send_buf(r.c, &len));
        if (stage == 2)
            raw_write(&r, SIZE_MAX);
        raw_feed(&r, "421 4.3.2 going");
        raw_write(&r, SIZE_MAX);
        assert_true(raw_out_has_end(&r, bdat));
        raw_feed(&r, " down\r\n");
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_SERVER_421);
        assert_int_equal(r.n_outcomes[0], 1);
        if (stage == 2) {
            assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_TEMPORARY);
            assert_int_equal(r.codes[0], 421);
        } else {
            assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_UNKNOWN);
        }
        raw_free(&r);
    }
}

/* A reply whose first octet comes after the end was handed out is its verdict however it is
 * split: octet by octet, the host calling send_buf between the octets (nothing to hand);
 * a multi-line reply; LMTP's series, one reply per accepted recipient. */
static void test_reply_begun_after_end_handed_split(void **st)
{
    (void)st;
    static const char *const replies[] = {"250 2.0.0 queued\r\n",
                                          "250-2.0.0 queued\r\n250-as 1234\r\n250 2.0.0 ok\r\n",
                                          "250 2.1.5 a\r\n250 2.1.5 b\r\n"};
    for (int v = 0; v < 6; v++) {
        int bdat = v & 1, which = v >> 1, lmtp = which == 2;
        const char *s = replies[which];
        size_t n = lmtp ? 2 : 1, len;
        raw r;
        raw_init(&r);
        r.cfg.lmtp = lmtp;
        raw_to_content(&r, bdat, n);
        assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
        raw_write(&r, SIZE_MAX);
        assert_true(raw_out_has_end(&r, bdat));
        for (size_t i = 0; s[i]; i++) {
            assert_int_equal(smtpe_client_recv(r.c, (const uint8_t *)s + i, 1, 0), 1);
            raw_events(&r);
            smtpe_client_send_buf(r.c, &len);
            assert_int_equal(len, 0);
        }
        assert_int_equal(r.closed_reason, -1);
        assert_int_equal(r.done, 1);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(r.n_outcomes[i], 1);
            assert_int_equal(r.outcomes[i], SMTPE_OUTCOME_DELIVERED);
        }
        raw_free(&r);
    }
}

/* The same through the scripted host, in its three splits: the host has no content yet when
 * the 354's read also holds the start of a 250; it gives it (the dot is written at once), and
 * the 250's CRLF comes after. */
static int begun_bdat;

static void sc_reply_begun_before_end(ch *h)
{
    h->content_limited = 1; /* nothing yet */
    open_ok(h);
    ch_server(h, GREET);
    ch_server(h, begun_bdat ? BDAT_CAPS : CAPS);
    ch_submit(h, "s@example.com", ONE, 1);
    ch_take_out(h);
    ch_take_log(h);
    ch_server(h, begun_bdat ? "250 ok\r\n250 ok\r\n250 2.0.0 queued"
                            : "250 ok\r\n250 ok\r\n354 go\r\n250 2.0.0 queued");
    LOG(h, begun_bdat ? "" : "CONTENT\n");
    h->content_limited = 0;
    ch_pump(h);
    OUT(h, begun_bdat ? "BDAT 21 LAST\r\nSubject: t\r\n\r\nhello\r\n"
                      : "Subject: t\r\n\r\nhello\r\n.\r\n");
    ch_server(h, "\r\n");
    LOG(h, "OUTCOME 0 unknown 000 - a reply with no command outstanding [local]\n"
           "DONE 0/0/0/1\nCLOSED protocol-error 000 a reply with no command outstanding\n");
    OUT(h, "");
}

static void test_reply_begun_before_end_scripted(void **st)
{
    (void)st;
    for (begun_bdat = 0; begun_bdat <= 1; begun_bdat++)
        run3(sc_reply_begun_before_end);
}

/* A forged reply in the same read as the greeting, before EHLO could be sent: unsolicited. */
static void sc_greeting_and_forged_ehlo(ch *h)
{
    h->cfg.auth_mechanism = "";
    h->cfg.auth_user = "u";
    h->cfg.auth_password = "p";
    h->cfg.auth_plaintext_ok = 1;
    open_ok(h);
    ch_server(h, GREET "250-mx\r\n250 AUTH PLAIN\r\n");
    const char *log = ch_take_log(h);
    if (h->split == CH_WHOLE) { /* split reads look like a real EHLO reply */
        assert_non_null(strstr(log, "CLOSED protocol-error"));
        assert_null(strstr(ch_take_out(h), "AUTH"));
    }
}

static void test_greeting_and_forged_ehlo(void **st)
{
    (void)st;
    run3(sc_greeting_and_forged_ehlo);
}

/* ==== a hostile server at random ======================================================= */

/* The server's replies are drawn at random (mostly sane, often refusals, sometimes 421,
 * garbage, a 3xx where none fits, an extra or a multi-line reply), the host splits
 * everything at random and now and then loses the connection, lets a timer expire, aborts the
 * content or asks for QUIT. Whatever happens: no recipient gets zero or two outcomes, no bare
 * CR or LF reaches the wire, nothing follows QUIT, a recipient reported delivered was
 * delivered by the server, the host never stalls. */
typedef struct chaos {
    sim m;
    uint32_t seed;
    int extra; /* a reply was followed by an extra one: the client cannot match them */
} chaos;

static int chaos_extra;

static const char *chaos_pick(uint32_t *seed, const char *good)
{
    static const char *const bad[] = {"421 4.3.2 bye\r\n", "450 4.2.0 later\r\n",
                                      "550 5.0.0 no\r\n", "503 5.5.1 sequence\r\n",
                                      "354 go\r\n", "334 eA==\r\n", "250-a\r\n250 b\r\n",
                                      "25x garbage\r\n", "250 ok\r\n250 extra\r\n",
                                      "251 forwarded\r\n", "552 5.3.4 big\r\n"};
    uint32_t r = rnd(seed) % 100;
    const char *b;
    if (r < 60)
        return good;
    b = bad[rnd(seed) % (sizeof bad / sizeof *bad)];
    if (strstr(b, "extra"))
        chaos_extra = 1;
    return b;
}

static void chaos_session(uint32_t seed, int lmtp, int bdat, size_t n_rcpt)
{
    static chaos x;
    static uint8_t content[3000];
    static char ehlo[400];
    static const smtpe_param xclient[] = {{SP("NAME"), SP("a+b")}, {SP("ADDR"), SP("1.2.3.4")}};
    static const smtpe_param xforward[] = {{SP("NAME"), SP("c=d")}};
    sim *m = &x.m;
    int rounds = 0, starttls, auth, xcl, pipe;
    memset(&x, 0, sizeof x);
    x.seed = seed;
    chaos_extra = 0;
    sim_init(m, seed);
    g_case = "chaos";
    size_t len = tricky_content(content, 100 + rnd(&x.seed) % 2800, seed);
    m->content = content;
    m->content_len = len;
    m->piece_max = 1 + rnd(&x.seed) % 300;
    m->write_max = rnd(&x.seed) % 2 ? 0 : 1 + rnd(&x.seed) % 100;
    m->feed_max = rnd(&x.seed) % 2 ? 0 : 1 + rnd(&x.seed) % 20;
    m->cfg.lmtp = m->srv.lmtp = lmtp;
    m->cfg.output_buffer_size = 4096;
    m->cfg.max_unanswered = 512;
    /* the setup: STARTTLS, XCLIENT, AUTH, each maybe */
    starttls = rnd(&x.seed) % 3 == 0;
    xcl = rnd(&x.seed) % 4 == 0;
    auth = rnd(&x.seed) % 3 == 0;
    pipe = rnd(&x.seed) % 4 != 0;
    snprintf(ehlo, sizeof ehlo, "250-mx.example\r\n%s%s%s%s%s250 ENHANCEDSTATUSCODES\r\n",
             pipe ? "250-PIPELINING\r\n" : "", bdat ? "250-CHUNKING\r\n" : "",
             starttls ? "250-STARTTLS\r\n" : "", auth ? "250-AUTH LOGIN PLAIN\r\n" : "",
             xcl ? "250-XCLIENT NAME ADDR\r\n250-XFORWARD NAME\r\n" : "");
    m->srv.ehlo = ehlo;
    m->srv.lockstep = !pipe;
    if (starttls) {
        m->cfg.tls = rnd(&x.seed) % 2 ? SMTPE_TLS_REQUIRED : SMTPE_TLS_OPPORTUNISTIC;
        m->srv.starttls = chaos_pick(&x.seed, "220 2.0.0 go\r\n");
        m->srv.no_clear_mail = m->cfg.tls == SMTPE_TLS_REQUIRED;
    }
    if (auth) {
        m->cfg.auth_mechanism = "PLAIN";
        m->cfg.auth_user = "user";
        m->cfg.auth_password = "pass";
        m->cfg.auth_plaintext_ok = !starttls;
        m->srv.no_clear_auth = starttls;
        m->srv.auth = chaos_pick(&x.seed, "235 2.7.0 ok\r\n");
    }
    if (xcl) {
        m->cfg.xclient = xclient;
        m->cfg.xclient_count = 2;
        m->srv.xclient = chaos_pick(&x.seed, "220 mx.example ESMTP\r\n");
        m->txn.xforward = xforward;
        m->txn.xforward_count = 1;
    }
    m->srv.mail = chaos_pick(&x.seed, "250 ok\r\n");
    for (size_t i = 0; i < n_rcpt; i++) {
        m->srv.rcpt[i] = chaos_pick(&x.seed, "250 ok\r\n");
        m->srv.end[i] = chaos_pick(&x.seed, "250 2.0.0 queued\r\n");
    }
    m->srv.data = rnd(&x.seed) % 2 ? NULL : chaos_pick(&x.seed, "354 go\r\n");
    m->srv.bdat = chaos_pick(&x.seed, "250 ok\r\n");
    if (bdat)
        m->cfg.chunk_size = 1 + rnd(&x.seed) % 2000;
    m->more_txns = (int)(rnd(&x.seed) % 3);
    m->n_rcpt = 1 + rnd(&x.seed) % 3;
    m->check_delivered = 1;
    sim_open(m);
    if (rnd(&x.seed) % 2) /* submitted before the greeting, or after READY */
        assert_int_equal(sim_submit(m, n_rcpt), 0);
    else
        m->submit_first = n_rcpt;
    srv_reply(&m->srv, NULL, GREET);
    for (;;) {
        int any;
        uint32_t act = rnd(&x.seed) % 1000;
        char note[80];
        assert_true(++rounds < 2000000);
        m->lies = chaos_extra;
        note[0] = 0;
        if (act == 0 && !m->closed) {
            snprintf(note, sizeof note, "  H: lost %d\n", smtpe_client_lost(m->c));
            m->gone = 1;
        } else if (act == 1) {
            snprintf(note, sizeof note, "  H: expiry %d\n",
                     smtpe_client_handle_expiry(m->c, m->now + 100000000));
        } else if (act == 2) {
            snprintf(note, sizeof note, "  H: abort %d\n", smtpe_client_abort_content(m->c));
        } else if (act == 3) {
            int rc = smtpe_client_quit(m->c);
            snprintf(note, sizeof note, "  H: quit %d\n", rc);
            if (rc == 0)
                m->quit_asked = 1;
        }
        ob_str(&m->srv.commands, note);
        any = sim_round(m);
        if (m->closed && !any)
            break;
        if (!any) {
            sim_check_idle(m);
            if (m->srv.to_client.len == 0) {
                /* the server has nothing more to say: a timeout ends it, or the host
                 * closes an idle session */
                uint64_t d = smtpe_client_expiry(m->c, m->now);
                if (d == UINT64_MAX) {
                    smtpe_client_lost(m->c);
                    m->gone = 1;
                } else {
                    smtpe_client_handle_expiry(m->c, d);
                }
            }
        }
    }
    sim_events(m);
    if (m->srv.violations && chaos_extra && strncmp(m->srv.why, "bare", 4) != 0)
        m->srv.violations = 0; /* an extra reply shifts every later one: the server's lie */
    if (m->srv.violations) {
        fputs((const char *)m->srv.commands.p, stderr);
        fail_msg("seed %u: server saw %s", seed, m->srv.why);
    }
    if (m->done != m->submits) {
        fputs((const char *)m->srv.commands.p, stderr);
        fail_msg("seed %u: %zu transactions submitted, %zu done", seed, m->submits, m->done);
    }
    sim_free(m);
}

static void test_chaos(void **st)
{
    (void)st;
    const char *e = getenv("SMTPE_REVIEW_CHAOS"); /* more sessions, for a longer hunt */
    uint32_t n = e ? (uint32_t)strtoul(e, NULL, 10) : 3000;
    for (uint32_t seed = 1; seed <= n; seed++)
        chaos_session(seed * 2654435761u, seed % 3 == 0, seed % 2 == 0, 1 + seed % 5);
}

/* FIXED (e97559e), found in review as a bug:
 * the session closes (a protocol error, a timeout) while the end of the content - the
 * final ".\r\n" or BDAT LAST - is queued but not yet sent, and reports the recipients
 * TEMPORARY (fail_open_txn: acked < end_at), yet it keeps that end queued: send_buf still
 * hands it out and want() says WRITE, and smtpe.h tells the host "close the connection once
 * the output is sent". A host that does so completes the message on the wire; the server
 * delivers it, and the host, told "temporary", sends it again: a duplicate (RFC 5321
 * §4.5.3.2.6 is exactly about that). Expected: once the outcome is temporary, no octet that
 * completes the content is ever handed out (or the outcome is unknown). */
static void check_no_end_after_temporary(int bdat, int how)
{
    raw r;
    size_t len;
    const uint8_t *p;
    raw_init(&r);
    raw_ready(&r, bdat ? "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n" : CAPS, 1);
    if (!bdat)
        raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"hello\r\n", 7, 1), 7);
    /* the end is queued, the host has not written it yet */
    if (how == 0) {
        uint64_t d = smtpe_client_expiry(r.c, 0);
        assert_int_equal(smtpe_client_handle_expiry(r.c, d), 1);
    } else {
        raw_feed(&r, bdat ? "250 ok\r\n250 ok\r\n25" : "2x\r\n"); /* then a broken reply */
        if (bdat)
            raw_feed(&r, "0x\r\n");
    }
    raw_events(&r);
    assert_true(r.closed_reason == SMTPE_CLOSE_TIMEOUT ||
                r.closed_reason == SMTPE_CLOSE_PROTOCOL_ERROR);
    assert_int_equal(r.n_outcomes[0], 1);
    if (r.outcomes[0] == SMTPE_OUTCOME_UNKNOWN)
        return; /* a consistent choice too */
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_TEMPORARY);
    /* what the host sends before closing, as told */
    r.out.len = 0;
    while ((p = smtpe_client_send_buf(r.c, &len)) && len > 0) {
        ob_put(&r.out, p, len);
        smtpe_client_send_ack(r.c, len);
    }
    ob_put(&r.out, "", 0);
    if (bdat ? strstr((const char *)r.out.p, "LAST") != NULL
             : strstr((const char *)r.out.p, "\r\n.\r\n") != NULL)
        fail_msg("reported temporary, but the end of the content is still handed out: \"%s\"",
                 (const char *)r.out.p);
    raw_free(&r);
}

static void test_fixed_closed_with_end_of_data_queued(void **st)
{
    (void)st;
    for (int bdat = 0; bdat <= 1; bdat++)
        for (int how = 0; how <= 1; how++)
            check_no_end_after_temporary(bdat, how);
}

/* FIXED (e97559e), found in review as a bug:
 * LMTP (RFC 2033 §4.2) answers the end of the content with one reply per accepted
 * recipient. When one of them is a 421, the session ends (right), but every recipient whose
 * reply was never read is reported TEMPORARY with code 421 (fail_open_txn: a code given
 * means temporary) although the whole message was sent and the server may deliver to them:
 * they are UNKNOWN (RFC 5321 §4.5.3.2.6; smtpe.h SMTPE_OUTCOME_UNKNOWN: "the end of the
 * content was sent but no verdict came"). A host retrying them duplicates the message. */
static void test_fixed_lmtp_421_in_series_not_unknown(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    r.cfg.lmtp = 1;
    raw_ready(&r, "250-lmtp\r\n250 PIPELINING\r\n", 3);
    raw_feed(&r, "250 ok\r\n250 ok\r\n250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1), 3);
    raw_write(&r, SIZE_MAX);
    raw_feed(&r, "250 2.0.0 a delivered\r\n421 4.3.2 shutting down\r\n");
    raw_events(&r);
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_DELIVERED);
    assert_int_equal(r.outcomes[1], SMTPE_OUTCOME_TEMPORARY); /* its own reply: 421 */
    assert_int_equal(r.codes[1], 421);
    assert_int_equal(r.outcomes[2], SMTPE_OUTCOME_UNKNOWN); /* no reply read for it */
    raw_free(&r);
}

/* ==== STARTTLS, implicit TLS ============================================================ */

/* Q01 with a host that does what smtpe.h asks after SMTPE_CEV_STARTTLS: it feeds what it
 * already read beyond the 220 (SMTPE_WANT_READ stays set), then would run the handshake.
 * The forged EHLO reply in the same read is a protocol error in every split; no EHLO, AUTH
 * or credential octet goes out after it. */
static void test_starttls_injection_correct_host(void **st)
{
    (void)st;
    static const char inject[] = "220 2.0.0 Ready\r\n250-mx.example\r\n250 AUTH PLAIN\r\n";
    for (size_t split = 1; split <= sizeof inject - 1; split++) {
        raw r;
        size_t off = 0, len;
        int tls_event = 0;
        smtpe_client_event ev;
        raw_init(&r);
        r.cfg.tls = SMTPE_TLS_REQUIRED;
        r.cfg.auth_mechanism = "PLAIN";
        r.cfg.auth_user = "u";
        r.cfg.auth_password = "p";
        assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
        raw_feed(&r, GREET);
        raw_write(&r, SIZE_MAX);
        raw_feed(&r, "250-mx.example\r\n250 STARTTLS\r\n");
        raw_write(&r, SIZE_MAX);
        r.out.len = 0;
        /* the host read the whole inject[] at once and feeds it in pieces of split */
        while (off < sizeof inject - 1) {
            size_t n = sizeof inject - 1 - off < split ? sizeof inject - 1 - off : split;
            smtpe_ssize k = smtpe_client_recv(r.c, (const uint8_t *)inject + off, n, 0);
            assert_true(k >= 0);
            off += (size_t)k;
            while (smtpe_client_next_event(r.c, &ev) == 1) {
                if (ev.type == SMTPE_CEV_STARTTLS)
                    tls_event = 1;
                if (ev.type == SMTPE_CEV_CLOSED)
                    r.closed_reason = ev.closed.reason;
            }
            if (r.closed_reason >= 0)
                break;
            assert_true(smtpe_client_want(r.c) & SMTPE_WANT_READ); /* feed the rest first */
        }
        assert_int_equal(tls_event, 1);
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_PROTOCOL_ERROR);
        assert_int_equal(smtpe_client_tls_started(r.c, 0), SMTPE_ERR_STATE);
        raw_write(&r, SIZE_MAX);
        smtpe_client_send_buf(r.c, &len);
        assert_int_equal(len, 0);
        ob_put(&r.out, "", 0);
        assert_string_equal((const char *)r.out.p, "");
        raw_free(&r);
    }
}

/* Implicit TLS (RFC 8314): nothing is fed or sent before the handshake; then the greeting;
 * a PROXY header is queued first of all. */
static void test_implicit_tls(void **st)
{
    (void)st;
    raw r;
    size_t len;
    smtpe_proxy_info proxy;
    memset(&proxy, 0, sizeof proxy);
    proxy.version = 1;
    proxy.family = SMTPE_PROXY_AF_INET;
    proxy.transport = SMTPE_PROXY_TRANSPORT_STREAM;
    memcpy(proxy.src_addr, "\xc0\x00\x02\x01", 4);
    memcpy(proxy.dst_addr, "\xc0\x00\x02\x02", 4);
    proxy.src_port = 1234;
    proxy.dst_port = 465;
    raw_init(&r);
    r.cfg.tls = SMTPE_TLS_IMPLICIT;
    r.cfg.proxy = &proxy;
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
    assert_true(smtpe_client_want(r.c) & SMTPE_WANT_TLS);
    assert_true(smtpe_client_recv(r.c, (const uint8_t *)GREET, strlen(GREET), 0) < 0);
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p,
                        "PROXY TCP4 192.0.2.1 192.0.2.2 1234 465\r\n");
    assert_int_equal(smtpe_client_tls_started(r.c, 0), 0);
    assert_int_equal(smtpe_client_tls_started(r.c, 0), SMTPE_ERR_STATE);
    smtpe_client_send_buf(r.c, &len);
    assert_int_equal(len, 0); /* the server speaks first */
    raw_feed(&r, GREET);
    r.out.len = 0;
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p, EHLO);
    raw_feed(&r, "250 mx.example\r\n");
    assert_true(smtpe_client_get_caps(r.c)->tls);
    raw_free(&r);
}

/* ==== no pipelining: one command per reply, nothing the state does not allow ============ */

/* With PIPELINING not offered, or cfg.pipelining 0, the client sends a command only when
 * every earlier one is answered (RFC 5321 §4.3.2 lock-step; RFC 2920 only when offered), and
 * never DATA (or BDAT) once every RCPT was refused, nor RCPT after a refused MAIL. */
static void test_lockstep_every_failure(void **st)
{
    (void)st;
    for (int variant = 0; variant < 2; variant++)
        for (size_t i = 0; i < sizeof fail_cases / sizeof *fail_cases; i++) {
            const fail_case *fc = &fail_cases[i];
            sim m;
            static uint8_t content[300];
            memset(content, 'w', sizeof content);
            content[150] = '\r';
            content[151] = '\n';
            sim_init(&m, 5 + (uint32_t)i);
            g_case = fc->name;
            m.content = content;
            m.content_len = sizeof content;
            m.cfg.lmtp = m.srv.lmtp = fc->lmtp;
            m.cfg.pipelining = variant == 0 ? 0 : 1;
            m.srv.lockstep = 1;
            m.srv.ehlo = variant == 0 ? (fc->bdat ? "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n"
                                                  : "250-mx\r\n250 PIPELINING\r\n")
                                      : (fc->bdat ? "250-mx\r\n250 CHUNKING\r\n" : "250 mx\r\n");
            if (fc->bdat)
                m.cfg.chunk_size = 100;
            m.srv.mail = fc->mail;
            m.srv.data = fc->data;
            m.srv.bdat = fc->bdat_reply;
            for (int k = 0; k < 3; k++) {
                m.srv.rcpt[k] = fc->rcpt[k];
                m.srv.end[k] = fc->end[k];
            }
            m.feed_max = 3;
            sim_open(&m);
            assert_int_equal(sim_submit(&m, 3), 0);
            sim_run(&m);
            if (m.srv.violations)
                fail_msg("%s (variant %d): server saw %s\n%s", fc->name, variant, m.srv.why,
                         m.srv.commands.p);
            assert_int_equal(m.done, 1);
            for (int k = 0; k < 3; k++) {
                /* without pipelining, the DATA's refusal after a refused RCPT is never asked */
                if (m.outcomes[k] != fc->outcome[k] &&
                    !(fc->data && fc->rcpt[0] && m.outcomes[k] == P))
                    fail_msg("%s (variant %d): recipient %d outcome %d, want %d", fc->name,
                             variant, k, m.outcomes[k], fc->outcome[k]);
            }
            sim_free(&m);
        }
}

/* FIXED (b40b1cf), found in review as a bug:
 * a RSET refused (anything but 2xx or 421) ends the session with the recipients
 * TEMPORARY, passed explicitly (quit_and_close(..., SMTPE_OUTCOME_TEMPORARY)), which
 * overrides the unknown rule of fail_open_txn. Under PIPELINING with CHUNKING the whole
 * next message goes in the group behind that RSET (RSET, MAIL, RCPT, BDAT n LAST: RFC 3030
 * §4.2 lets the first BDAT go with it), so by the time the refusal is read the host has sent
 * the complete message; the server may well have taken it after refusing only the RSET.
 * Expected: UNKNOWN once the end of the content was handed (RFC 5321 §4.5.3.2.6; smtpe.h
 * SMTPE_OUTCOME_UNKNOWN), as for every other end of the session. */
static void test_fixed_rset_refused_after_bdat_last_sent(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    raw_ready(&r, "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n", 1);
    /* the first transaction fails at MAIL: RSET comes before the next */
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"one\r\n", 5, 1), 5);
    raw_write(&r, SIZE_MAX);
    raw_feed(&r, "451 4.3.0 later\r\n503 5.5.1 no MAIL\r\n503 5.5.1 no MAIL\r\n");
    raw_events(&r);
    assert_int_equal(r.done, 1);
    memset(r.n_outcomes, 0, sizeof r.n_outcomes);
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), 0);
    raw_events(&r);
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"two\r\n", 5, 1), 5);
    r.out.len = 0;
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p, "RSET\r\nMAIL FROM:<s@example.com>\r\n"
                                               "RCPT TO:<a@example.org>\r\nBDAT 5 LAST\r\ntwo\r\n");
    raw_feed(&r, "502 5.5.2 RSET not implemented\r\n");
    raw_events(&r);
    assert_int_equal(r.n_outcomes[0], 1);
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_UNKNOWN);
    raw_free(&r);
}

/* ==== content by reference (smtpe_client_content_ref, smtpe_client_send_iov) ============= */

/* One DATA transaction's wire from the 354 on: the content given in pieces of piece octets
 * (0: whole), by reference or copied, written through send_buf (ack 0: whole pieces, else at
 * most ack octets a call) or send_iov. Checks that held content stays put and that held is 0
 * at the end; *max_held gets the most content held at once, *from_host the octets written
 * that the engine pointed to in the content itself. */
static void ref_wire(const uint8_t *msg, size_t len, size_t piece, int by_ref, int iov,
                     size_t ack, obuf *wire, size_t *max_held, size_t *from_host)
{
    raw r;
    size_t gave = 0;
    int gave_last = 0;
    uint8_t *copy = malloc(len + 1); /* the host's buffer: freed only once nothing is held */
    assert_non_null(copy);
    memcpy(copy, msg, len);
    raw_init(&r);
    raw_ready(&r, CAPS, 1);
    raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    *max_held = *from_host = 0;
    for (int rounds = 0; rounds < 100000; rounds++) {
        int progress = 0;
        if (!gave_last && (smtpe_client_want(r.c) & SMTPE_WANT_CONTENT)) {
            size_t n = piece && piece < len - gave ? piece : len - gave;
            int last = gave + n == len;
            smtpe_ssize k = by_ref ? smtpe_client_content_ref(r.c, copy + gave, n, last)
                                   : smtpe_client_content(r.c, copy + gave, n, last);
            assert_true(k >= 0);
            gave += (size_t)k;
            gave_last = last && (size_t)k == n;
            progress |= k > 0 || gave_last;
        }
        if (smtpe_client_content_held(r.c) > *max_held)
            *max_held = smtpe_client_content_held(r.c);
        if (!by_ref)
            assert_int_equal(smtpe_client_content_held(r.c), 0);
        /* everything queued is written before more content is given, in either mode (what
         * a refusal leaves on the wire is what had been handed out by then) */
        while (iov) {
            smtpe_span v[8];
            size_t nv = smtpe_client_send_iov(r.c, v, 8), total = 0;
            for (size_t i = 0; i < nv; i++) {
                assert_true(v[i].len > 0);
                ob_put(wire, v[i].ptr, v[i].len);
                total += v[i].len;
                if (v[i].ptr >= copy && v[i].ptr < copy + len)
                    *from_host += v[i].len;
            }
            if (total == 0)
                break;
            assert_int_equal(smtpe_client_send_ack(r.c, total + 1), SMTPE_ERR_INVALID_ARGUMENT);
            assert_int_equal(smtpe_client_send_ack(r.c, total), 0);
            progress = 1;
        }
        while (!iov) {
            size_t l;
            const uint8_t *o = smtpe_client_send_buf(r.c, &l);
            if (l == 0)
                break;
            size_t k = ack && ack < l ? ack : l;
            ob_put(wire, o, k);
            if (o >= copy && o < copy + len)
                *from_host += k;
            assert_int_equal(smtpe_client_send_ack(r.c, k), 0);
            progress = 1;
        }
        raw_events(&r);
        if (!progress)
            break;
    }
    assert_int_equal(smtpe_client_content_held(r.c), 0);
    memset(copy, 'X', len); /* nothing may point here any more */
    raw_free(&r);
    free(copy);
}

static void test_content_ref_same_wire(void **st)
{
    (void)st;
    static uint8_t body[5000];
#define REF_CASE(name, lit) {name, (const uint8_t *)lit, sizeof lit - 1}
    const struct {
        const char *name;
        const uint8_t *p;
        size_t len;
    } cases[] = {
        REF_CASE("dots", ".a\r\n..b\r\nc\r\n.\r\n.\r\nd"),
        REF_CASE("bare", "a\nb\rc\r\r\n.x\n.\r"),
        REF_CASE("crlf-end", "line one\r\nline two\r\n"),
        REF_CASE("empty", ""),
        REF_CASE("one-dot", "."),
        REF_CASE("nul-refused", "text\r\n.dot\r\nmore text\r\nab\0cd\r\n.x\r\n"),
        REF_CASE("end-like", "a\r\n.\r\n\r\n.\r\n.."),
        {"body", body, sizeof body},
    };
#undef REF_CASE
    for (size_t i = 0, line = 0; i < sizeof body;) { /* 76-octet lines, every 7th a dot */
        size_t l = 76;
        for (size_t k = 0; k < l && i < sizeof body; k++)
            body[i++] = (uint8_t)(k == 0 && line % 7 == 3 ? '.' : 'a' + (line + k) % 26);
        if (i < sizeof body)
            body[i++] = '\r';
        if (i < sizeof body)
            body[i++] = '\n';
        line++;
    }
    static const size_t pieces[] = {0, 1, 2, 3, 7, 77, 1000};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (size_t pi = 0; pi < sizeof pieces / sizeof *pieces; pi++) {
            obuf want = {0};
            size_t held, host;
            ref_wire(cases[ci].p, cases[ci].len, pieces[pi], 0, 0, 0, &want, &held, &host);
            assert_int_equal(host, 0);
            for (int mode = 0; mode < 3; mode++) {
                obuf got = {0};
                ref_wire(cases[ci].p, cases[ci].len, pieces[pi], 1, mode == 1,
                         mode == 2 ? 5 : 0, &got, &held, &host);
                if (got.len != want.len || (want.len && memcmp(got.p, want.p, want.len) != 0))
                    fail_msg("content_ref %s piece %zu mode %d: the wire differs (%zu/%zu)",
                             cases[ci].name, pieces[pi], mode, got.len, want.len);
                if (cases[ci].p == body && pieces[pi] == 0) {
                    /* all but the ring's few octets (the final CRLF, the end of data) went
                     * out of the host's own buffer, doubled dots included */
                    assert_true(host >= sizeof body - 4);
                    assert_true(held >= 1000);
                }
                ob_free(&got);
            }
            ob_free(&want);
        }
}

/* What a session still holds of the host's content is dropped when it ends: lost with spans
 * queued (nothing more to send, held 0), and a 421 with spans half handed out (the handed
 * part stays until acknowledged). */
static void test_content_ref_dropped_at_close(void **st)
{
    (void)st;
    static const uint8_t msg[] = "a line\r\n.dot\r\nanother\r\n";
    raw r;
    size_t len;
    raw_init(&r);
    raw_ready(&r, CAPS, 1);
    raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content_ref(r.c, msg, sizeof msg - 1, 1), sizeof msg - 1);
    assert_true(smtpe_client_content_held(r.c) > 0);
    assert_int_equal(smtpe_client_lost(r.c), 0);
    raw_events(&r);
    assert_int_equal(smtpe_client_content_held(r.c), 0);
    smtpe_client_send_buf(r.c, &len);
    assert_int_equal(len, 0);
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_TEMPORARY);
    raw_free(&r);

    raw_init(&r);
    raw_ready(&r, CAPS, 1);
    raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
    assert_int_equal(smtpe_client_content_ref(r.c, msg, sizeof msg - 1, 1), sizeof msg - 1);
    const uint8_t *o = smtpe_client_send_buf(r.c, &len); /* the first span, handed out */
    assert_true(o >= msg && o < msg + sizeof msg);
    assert_true(len >= 3);
    assert_int_equal(smtpe_client_send_ack(r.c, 2), 0);
    raw_feed(&r, "421 4.3.2 bye\r\n");
    assert_int_equal(r.closed_reason, SMTPE_CLOSE_SERVER_421);
    assert_int_equal(smtpe_client_content_held(r.c), len - 2); /* the rest of what was handed */
    o = smtpe_client_send_buf(r.c, &len);
    assert_int_equal(smtpe_client_content_held(r.c), len);
    assert_int_equal(smtpe_client_send_ack(r.c, len), 0);
    assert_int_equal(smtpe_client_content_held(r.c), 0);
    smtpe_client_send_buf(r.c, &len);
    assert_int_equal(len, 0);
    raw_free(&r);
}

/* FIXED (found by a hostile-server trial): the same with DATA. RSET refused while MAIL, RCPT
 * and DATA are pipelined behind it: the server may still answer the DATA 354, so a QUIT
 * would be read as a line of content; the session ends with no QUIT. */
static void test_fixed_rset_refused_no_quit_behind_pipelined_data(void **st)
{
    (void)st;
    raw r;
    size_t len;
    raw_init(&r);
    raw_ready(&r, "250-mx\r\n250 PIPELINING\r\n", 1);
    raw_write(&r, SIZE_MAX);
    raw_feed(&r, "451 4.3.0 later\r\n503 5.5.1 no MAIL\r\n503 5.5.1 no MAIL\r\n");
    raw_events(&r);
    assert_int_equal(r.done, 1);
    memset(r.n_outcomes, 0, sizeof r.n_outcomes);
    assert_int_equal(smtpe_client_submit(r.c, &r.txn), 0);
    raw_events(&r);
    r.out.len = 0;
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p, "RSET\r\nMAIL FROM:<s@example.com>\r\n"
                                               "RCPT TO:<a@example.org>\r\nDATA\r\n");
    raw_feed(&r, "500 5.5.1 RSET?\r\n");
    raw_events(&r);
    assert_int_equal(r.n_outcomes[0], 1);
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_TEMPORARY);
    smtpe_client_send_buf(r.c, &len);
    assert_int_equal(len, 0); /* no QUIT */
    raw_free(&r);
}

/* FIXED (found by a hostile trial of content by reference): a 421 while the final dot is
 * handed out but only partly written is not the server's verdict on it (the server has not
 * read it): the session's 421, the recipients unknown (the rest of the dot, handed out, may
 * still go), never temporary with the end of data still to be written. With the dot all
 * written, the 421 is the verdict: temporary. Copied and by reference, send_buf and send_iov. */
static void test_fixed_421_with_dot_partly_written(void **st)
{
    (void)st;
    static const uint8_t msg[] = "hello\r\n";
    for (int v = 0; v < 6; v++) {
        int by_ref = v & 1, iov = v >> 1 == 1, all = v >> 1 == 2;
        raw r;
        size_t len, total = 0;
        raw_init(&r);
        raw_ready(&r, CAPS, 1);
        raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
        smtpe_ssize k = by_ref ? smtpe_client_content_ref(r.c, msg, sizeof msg - 1, 1)
                               : smtpe_client_content(r.c, msg, sizeof msg - 1, 1);
        assert_int_equal(k, sizeof msg - 1);
        if (iov || all) {
            smtpe_span p[8];
            size_t n = smtpe_client_send_iov(r.c, p, 8);
            for (size_t i = 0; i < n; i++)
                total += p[i].len;
        } else {
            smtpe_client_send_buf(r.c, &len);
            total = len;
            while (by_ref && len > 0) { /* hand out every piece, writing none */
                smtpe_span p[8];
                size_t n = smtpe_client_send_iov(r.c, p, 8);
                total = 0;
                for (size_t i = 0; i < n; i++)
                    total += p[i].len;
                len = 0;
            }
        }
        assert_int_equal(total, 10); /* "hello\r\n.\r\n", all handed out */
        assert_int_equal(smtpe_client_send_ack(r.c, all ? 10 : 3), 0);
        raw_feed(&r, "421 4.3.2 going down\r\n");
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_SERVER_421);
        assert_int_equal(r.n_outcomes[0], 1);
        assert_int_equal(r.outcomes[0], all ? SMTPE_OUTCOME_TEMPORARY : SMTPE_OUTCOME_UNKNOWN);
        raw_free(&r);
    }
}

/* An empty final piece given under BDAT while a chunk's reply is owed is kept (as under DATA)
 * and its BDAT 0 LAST goes after that reply; WANT_CONTENT is not set again. */
static void test_bdat_empty_last_while_reply_owed(void **st)
{
    (void)st;
    raw r;
    raw_init(&r);
    r.cfg.chunk_size = 4096;
    raw_ready(&r, "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n", 1);
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"abc\r\n", 5, 0), 5);
    raw_write(&r, SIZE_MAX);
    assert_false(smtpe_client_want(r.c) & SMTPE_WANT_CONTENT); /* the chunk's reply is owed */
    assert_int_equal(smtpe_client_content(r.c, (const uint8_t *)"", 0, 1), 0);
    raw_feed(&r, "250 ok\r\n250 ok\r\n250 2.0.0 chunk\r\n");
    assert_false(smtpe_client_want(r.c) & SMTPE_WANT_CONTENT);
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p,
                        "BDAT 5\r\nabc\r\nBDAT 0 LAST\r\n");
    raw_feed(&r, "250 2.0.0 queued\r\n");
    assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_DELIVERED);
    raw_free(&r);
}

/* A helo_name with an octet above 127 is refused: EHLO is ASCII (an A-label instead). */
static void test_helo_name_ascii_only(void **st)
{
    (void)st;
    smtpe_client_config cfg;
    smtpe_client *c = NULL;
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "b\xc3\xbc" "cher.example";
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    cfg.helo_name = "xn--bcher-kva.example";
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), 0);
    smtpe_client_free(c);
}

/* FIXED (b40b1cf), found in review as a bug:
 * the 421 rule of e97559e (RFC 5321 §3.8: a 421 may come at any time, even before the
 * host wrote the command it would answer) leaves out the end of the content: a 421 that
 * arrives while the final dot (or BDAT LAST) is queued but not yet handed out is reported as
 * SMTPE_CLOSE_PROTOCOL_ERROR ("a reply to a command not yet sent", code 0 on the recipients)
 * instead of SMTPE_CLOSE_SERVER_421 with the 421. (The outcome, temporary, is right.) */
static void test_fixed_421_before_dot_handed(void **st)
{
    (void)st;
    for (int bdat = 0; bdat <= 1; bdat++) {
        raw r;
        raw_init(&r);
        raw_ready(&r, bdat ? "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n" : CAPS, 1);
        if (!bdat) {
            raw_feed(&r, "250 ok\r\n250 ok\r\n354 go\r\n");
        } else { /* a first chunk, answered, then the LAST one stays queued */
            static uint8_t big[5000];
            memset(big, 'b', sizeof big);
            r.cfg.chunk_size = 0;
            assert_true(smtpe_client_content(r.c, big, sizeof big, 0) > 0);
            raw_write(&r, SIZE_MAX);
            raw_feed(&r, "250 ok\r\n250 ok\r\n250 chunk ok\r\n");
        }
        assert_true(smtpe_client_content(r.c, (const uint8_t *)"x\r\n", 3, 1) == 3);
        raw_feed(&r, "421 4.3.2 shutting down\r\n");
        raw_events(&r);
        assert_int_equal(r.outcomes[0], SMTPE_OUTCOME_TEMPORARY);
        assert_int_equal(r.closed_reason, SMTPE_CLOSE_SERVER_421);
        assert_int_equal(r.codes[0], 421);
        raw_free(&r);
    }
}

/* FIXED (b40b1cf), found in review as a bug:
 * cfg.chunk_size may be 1..output_buffer_size - 64 (smtpe.h), but content_bdat caps the
 * chunk's wire octets at chunk_size, and one content octet can need up to 4 wire octets
 * (a line break is 2; a bare CR settled by a bare LF is 4). With chunk_size 1 a line break
 * never fits: smtpe_client_content consumes nothing while SMTPE_WANT_CONTENT stays set, so a
 * host that follows want() spins for ever (chunk_size 2 and 3 likewise for bare line ends).
 * Expected: every allowed chunk_size delivers the content (smtpe.h: the engine "sends smaller
 * chunks" when it must - or the range starts at 4). */
static void test_fixed_small_chunk_size_stalls(void **st)
{
    (void)st;
    static const char *const contents[] = {"a\r\nb\r\n", "\r\n", "x\n\ny", "\r\r\n\n.\r"};
    for (size_t cs = 1; cs <= 4; cs++)
        for (size_t i = 0; i < sizeof contents / sizeof *contents; i++) {
            sim m;
            obuf want = {0};
            sim_init(&m, 9);
            g_case = "small chunk_size";
            m.cfg.chunk_size = cs;
            m.srv.ehlo = "250-mx.example\r\n250-PIPELINING\r\n250 CHUNKING\r\n";
            m.content = (const uint8_t *)contents[i];
            m.content_len = strlen(contents[i]);
            sim_open(&m);
            assert_int_equal(sim_submit(&m, 1), 0);
            sim_run(&m); /* fails on WANT_CONTENT with nothing consumed */
            normalise(m.content, m.content_len, &want);
            ob_put(&m.srv.msg, "", 0);
            assert_int_equal(m.done, 1);
            assert_int_equal(m.outcomes[0], SMTPE_OUTCOME_DELIVERED);
            assert_string_equal((const char *)m.srv.msg.p, (const char *)want.p);
            ob_free(&want);
            sim_free(&m);
        }
}

/* ==== what the MAIL line says about the content ======================================== */

/* SIZE= (RFC 1870 §3) is the content's size on the wire under NORMALISE before
 * dot-stuffing, final CRLF included: exactly what the server decodes, for any content and
 * any split of the host's scan. */
static void test_size_param_exact(void **st)
{
    (void)st;
    static uint8_t buf[2000];
    for (uint32_t seed = 1; seed <= 200; seed++) {
        sim m;
        size_t n = tricky_content(buf, 30 + seed * 9 % 1900, seed);
        uint32_t r = seed;
        sim_init(&m, seed);
        g_case = "SIZE=";
        m.srv.ehlo = seed % 2 ? "250-mx\r\n250-PIPELINING\r\n250 SIZE 1000000\r\n"
                              : "250-mx\r\n250-PIPELINING\r\n250-CHUNKING\r\n250 SIZE\r\n";
        m.content = buf;
        m.content_len = n;
        m.piece_max = 1 + seed % 50;
        smtpe_content_scan_init(&m.txn.content);
        for (size_t at = 0; at < n;) {
            size_t k = 1 + rnd(&r) % 40;
            if (k > n - at)
                k = n - at;
            smtpe_content_scan(&m.txn.content, buf + at, k);
            at += k;
        }
        smtpe_content_scan_end(&m.txn.content);
        m.txn.has_content_info = 1;
        sim_open(&m);
        assert_int_equal(sim_submit(&m, 1), 0);
        sim_run(&m);
        assert_int_equal(m.outcomes[0], SMTPE_OUTCOME_DELIVERED);
        const char *sz = strstr((const char *)m.srv.commands.p, " SIZE=");
        assert_non_null(sz);
        if (strtoull(sz + 6, NULL, 10) != m.srv.msg.len)
            fail_msg("SIZE=%llu but %zu octets of content on the wire (seed %u)",
                     strtoull(sz + 6, NULL, 10), m.srv.msg.len, seed);
        assert_int_equal(m.txn.content.size, n);
        sim_free(&m);
    }
}

/* BODY=BINARYMIME (RFC 3030 §3): the content goes verbatim by BDAT, bare CR, bare LF and NUL
 * included, no final CRLF added, BDAT counts exact. */
static void test_binarymime_verbatim(void **st)
{
    (void)st;
    static const uint8_t bin[] = "\x00\r\n\r\n.\r\n\rx\ny\x80\xff\r";
    for (size_t piece = 1; piece <= 5; piece++) {
        sim m;
        sim_init(&m, 11);
        g_case = "BINARYMIME";
        m.srv.ehlo = "250-mx\r\n250-PIPELINING\r\n250-CHUNKING\r\n250 BINARYMIME\r\n";
        m.content = bin;
        m.content_len = sizeof bin - 1;
        m.piece_max = piece;
        m.txn.body = SMTPE_BODY_BINARYMIME;
        sim_open(&m);
        assert_int_equal(sim_submit(&m, 1), 0);
        sim_run(&m);
        assert_int_equal(m.outcomes[0], SMTPE_OUTCOME_DELIVERED);
        assert_non_null(strstr((const char *)m.srv.commands.p, "MAIL FROM:<a@example.com> "
                                                               "BODY=BINARYMIME\n"));
        assert_int_equal(m.srv.msg.len, sizeof bin - 1);
        assert_memory_equal(m.srv.msg.p, bin, sizeof bin - 1);
        sim_free(&m);
    }
}

/* Content the host did not scan, with a NUL (or 8-bit octets without BODY=8BITMIME): found
 * mid-stream, the session ends with the recipients permanent and the content cut short (no
 * final dot, no BDAT LAST) - whatever the split. */
static void test_unscanned_content_refused_midstream(void **st)
{
    (void)st;
    static const uint8_t nul[] = "line one\r\nline\0two\r\nend\r\n";
    static const uint8_t eight[] = "line one\r\ncaf\xc3\xa9\r\nend\r\n";
    for (int which = 0; which < 2; which++)
        for (int bdat = 0; bdat <= 1; bdat++)
            for (size_t piece = 1; piece <= 8; piece++) {
                sim m;
                sim_init(&m, 13);
                g_case = "refused mid-stream";
                m.srv.ehlo = bdat ? "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n" : CAPS;
                m.content = which ? eight : nul;
                m.content_len = (which ? sizeof eight : sizeof nul) - 1;
                m.piece_max = piece;
                sim_open(&m);
                assert_int_equal(sim_submit(&m, 2), 0);
                sim_run(&m);
                assert_int_equal(m.done, 1);
                assert_int_equal(m.outcomes[0], SMTPE_OUTCOME_PERMANENT);
                assert_int_equal(m.outcomes[1], SMTPE_OUTCOME_PERMANENT);
                assert_int_equal(m.last_closed.reason, SMTPE_CLOSE_ABORTED);
                assert_int_equal(m.srv.transactions, 0); /* never completed on the wire */
                assert_int_equal(m.srv.violations, 0);
                sim_free(&m);
            }
}

/* ==== split invariance of whole sessions =============================================== */

/* Plays the server's writes w[0..] into a new session. The host reads each write whole and
 * feeds it in pieces of `piece` octets (0: random 1..17; SIZE_MAX: whole), taking events
 * whenever the engine stops and giving the content at once; only once the whole write is fed
 * does it send the output (so the split is all that differs between runs: DESIGN.md
 * property 3), and after STARTTLS it runs its handshake then. Returns client octets and
 * events in one log. */
static void play_events(smtpe_client *c, obuf *log, int *tls_due)
{
    static const uint8_t content[] = "Subject: x\r\n\r\n.dot\r\nbody";
    smtpe_client_event ev;
    while (smtpe_client_next_event(c, &ev) == 1) {
        char line[200];
        snprintf(line, sizeof line, "[ev %d", (int)ev.type);
        ob_str(log, line);
        if (ev.type == SMTPE_CEV_OUTCOME)
            snprintf(line, sizeof line, " %zu %d %u %.*s]", ev.outcome.index,
                     ev.outcome.outcome, ev.outcome.code, (int)ev.outcome.text.len,
                     (const char *)ev.outcome.text.ptr);
        else if (ev.type == SMTPE_CEV_CLOSED)
            snprintf(line, sizeof line, " %d %u %.*s]", ev.closed.reason, ev.closed.code,
                     (int)ev.closed.text.len, (const char *)ev.closed.text.ptr);
        else if (ev.type == SMTPE_CEV_READY)
            snprintf(line, sizeof line, " %#x %.*s]", ev.ready.extensions,
                     (int)ev.ready.auth.len, (const char *)ev.ready.auth.ptr);
        else
            snprintf(line, sizeof line, "]");
        ob_str(log, line);
        if (ev.type == SMTPE_CEV_STARTTLS)
            *tls_due = 1;
        if (ev.type == SMTPE_CEV_CONTENT)
            assert_int_equal(smtpe_client_content(c, content, sizeof content - 1, 1),
                             (smtpe_ssize)(sizeof content - 1));
    }
}

static void play_write(smtpe_client *c, obuf *log)
{
    size_t len;
    const uint8_t *p;
    while ((p = smtpe_client_send_buf(c, &len)) && len > 0) {
        ob_put(log, p, len);
        smtpe_client_send_ack(c, len);
    }
}

static void play(const smtpe_client_config *cfg, const char *const *w, size_t piece,
                 uint32_t seed, obuf *log)
{
    smtpe_client *c;
    smtpe_client_txn txn;
    smtpe_client_rcpt rcpts[3];
    int tls_due = 0;
    memset(&txn, 0, sizeof txn);
    memset(rcpts, 0, sizeof rcpts);
    rcpts[0].forward_path = "a@example.org";
    rcpts[1].forward_path = "b@example.org";
    rcpts[2].forward_path = "c@example.org";
    txn.reverse_path = "s@example.com";
    txn.rcpts = rcpts;
    txn.rcpt_count = 3;
    log->len = 0;
    assert_int_equal(smtpe_client_new(&c, cfg, NULL, 0), 0);
    assert_int_equal(smtpe_client_submit(c, &txn), 0);
    play_write(c, log);
    for (size_t i = 0; w[i]; i++) {
        size_t n = strlen(w[i]), off = 0;
        int stuck = 0;
        while (off < n && stuck < 3) {
            size_t k = piece ? piece : 1 + rnd(&seed) % 17;
            smtpe_ssize r;
            if (k > n - off)
                k = n - off;
            r = smtpe_client_recv(c, (const uint8_t *)w[i] + off, k, 0);
            assert_true(r >= 0);
            off += (size_t)r;
            stuck = r == 0 ? stuck + 1 : 0;
            play_events(c, log, &tls_due);
        }
        play_events(c, log, &tls_due);
        play_write(c, log);
        if (tls_due && !(smtpe_client_want(c) & SMTPE_WANT_CLOSE)) {
            assert_int_equal(smtpe_client_tls_started(c, 0), 0);
            ob_str(log, "<TLS>");
            play_write(c, log);
        }
        tls_due = 0;
    }
    smtpe_client_free(c);
}

static void check_split_invariance(const smtpe_client_config *cfg, const char *const *w)
{
    obuf whole = {0}, other = {0};
    play(cfg, w, SIZE_MAX, 1, &whole);
    for (size_t piece = 0; piece <= 9; piece++)
        for (uint32_t seed = 1; seed <= (piece ? 1u : 20u); seed++) {
            play(cfg, w, piece, seed, &other);
            if (other.len != whole.len || memcmp(other.p, whole.p, whole.len) != 0)
                fail_msg("split %zu seed %u differs:\n--- whole:\n%s\n--- split:\n%s", piece,
                         seed, (const char *)whole.p, (const char *)other.p);
        }
    ob_free(&whole);
    ob_free(&other);
}

static void test_split_invariance(void **st)
{
    (void)st;
    static char longcaps[3000];
    smtpe_client_config cfg;
    /* EHLO lines near the 2048-octet line limit, a reply near max_reply_size */
    {
        char *p = longcaps;
        p += sprintf(p, "250-mx.example\r\n250-PIPELINING\r\n250-X-");
        memset(p, 'k', 2048 - 2 - 6);
        p += 2048 - 2 - 6;
        p += sprintf(p, "\r\n250 AUTH PLAIN\r\n");
    }
    const char *const s1[] = {GREET, longcaps, "235 2.7.0 ok\r\n",
                              "250 ok\r\n250 ok\r\n550 5.1.1 no\r\n251 ok\r\n354 go\r\n",
                              "250 2.0.0 queued\r\n", NULL};
    /* a reply in the same read as the AUTH success, before MAIL could be sent */
    const char *const s1b[] = {GREET, longcaps, "235 2.7.0 ok\r\n250 early\r\n", NULL};
    const char *const s2[] = {"220-mx\r\n220-second line\r\n220 third\r\n", CAPS,
                              "250 ok\r\n550 a\r\n550 b\r\n550 c\r\n354 go\r\n",
                              "554 5.5.1 no valid recipients\r\n", NULL};
    /* STARTTLS with a forged EHLO reply in the same write (Q01) */
    const char *const s3[] = {GREET, "250-mx\r\n250 STARTTLS\r\n",
                              "220 go\r\n250-mx\r\n250 AUTH PLAIN\r\n", NULL};
    const char *const s4[] = {GREET, "250-mx\r\n250 STARTTLS\r\n", "220 go\r\n",
                              "250-mx\r\n250 PIPELINING\r\n", "250 ok\r\n250 ok\r\n", NULL};
    /* LMTP series in one write, with garbage after it */
    const char *const s5[] = {"220 lmtp\r\n", "250-lmtp\r\n250 PIPELINING\r\n",
                              "250 ok\r\n250 ok\r\n550 no\r\n250 ok\r\n354 go\r\n",
                              "250 a\r\n452 c\r\nXYZ\r\n", NULL};
    /* a line over the limit, a mismatched code, a bare LF */
    const char *const s6[] = {GREET, CAPS, "250-ok\r\n251 no\r\n", NULL};
    const char *const s7[] = {GREET, "250-mx\r\n250 SIZE 10\n", NULL};
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "client.example";
    cfg.auth_mechanism = "PLAIN";
    cfg.auth_user = "u";
    cfg.auth_password = "p";
    cfg.auth_plaintext_ok = 1;
    check_split_invariance(&cfg, s1);
    check_split_invariance(&cfg, s1b);
    cfg.auth_mechanism = NULL;
    check_split_invariance(&cfg, s2);
    cfg.tls = SMTPE_TLS_OPPORTUNISTIC;
    check_split_invariance(&cfg, s3);
    check_split_invariance(&cfg, s4);
    cfg.tls = SMTPE_TLS_NONE;
    check_split_invariance(&cfg, s6);
    check_split_invariance(&cfg, s7);
    cfg.lmtp = 1;
    check_split_invariance(&cfg, s5);
}

/* ==== command lines at their limits ===================================================== */

/* XCLIENT attributes that need several lines: each line at most 512 octets (CRLF included),
 * every listed attribute sent once, xtext-encoded, EHLO after each 220. */
static void test_xclient_several_lines(void **st)
{
    (void)st;
    static char vals[8][220];
    static const char *const names[] = {"NAME", "ADDR", "PORT", "PROTO", "HELO", "LOGIN",
                                        "DESTADDR", "DESTPORT"};
    smtpe_param attrs[8];
    raw r;
    size_t sent[8] = {0}, lines = 0;
    raw_init(&r);
    for (int i = 0; i < 8; i++) {
        memset(vals[i], 'a' + i, 200);
        vals[i][0] = '+'; /* xtext: 3 octets */
        vals[i][200] = 0;
        attrs[i].keyword.ptr = (const uint8_t *)names[i];
        attrs[i].keyword.len = strlen(names[i]);
        attrs[i].value.ptr = (const uint8_t *)vals[i];
        attrs[i].value.len = 200;
    }
    r.cfg.xclient = attrs;
    r.cfg.xclient_count = 8;
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
    raw_feed(&r, GREET);
    raw_write(&r, SIZE_MAX);
    static const char caps[] = "250-mx\r\n250 XCLIENT NAME ADDR PORT PROTO HELO LOGIN DESTADDR "
                               "DESTPORT\r\n";
    raw_feed(&r, caps);
    for (int round = 0; round < 12; round++) {
        r.out.len = 0;
        raw_write(&r, SIZE_MAX);
        ob_put(&r.out, "", 0);
        const char *o = (const char *)r.out.p;
        if (strncmp(o, "XCLIENT ", 8) != 0)
            break;
        assert_true(strlen(o) <= 512);
        assert_non_null(strstr(o, "\r\n"));
        assert_int_equal(strstr(o, "\r\n")[2], 0); /* one line */
        lines++;
        for (int i = 0; i < 8; i++) {
            char key[20];
            snprintf(key, sizeof key, " %s=+2B", names[i]);
            sent[i] += count_of(o, key);
        }
        raw_feed(&r, "220 mx ESMTP\r\n");
        r.out.len = 0;
        raw_write(&r, SIZE_MAX);
        ob_put(&r.out, "", 0);
        assert_string_equal((const char *)r.out.p, EHLO);
        raw_feed(&r, caps);
    }
    assert_true(lines >= 4);
    for (int i = 0; i < 8; i++)
        assert_int_equal(sent[i], 1);
    assert_non_null(strstr(raw_log(&r), "EV 1")); /* READY at last */
    raw_free(&r);
}

/* RFC 4954 §4: the initial response goes on the AUTH line exactly when the line stays within
 * 512 octets; one octet more and it follows the 334. */
static void test_auth_initial_response_boundary(void **st)
{
    (void)st;
    /* "AUTH PLAIN " + base64(authzid \0 user \0 password) + CRLF: 11 + 4 * ceil(n / 3) + 2 */
    for (size_t n = 370; n <= 376; n++) {
        raw r;
        static char pass[256], authzid[201];
        raw_init(&r);
        /* n = len(authzid) + 1 + len(user) + 1 + len(password): 200 + 1 + 1 + 1 + n - 203 */
        memset(authzid, 'z', 200);
        memset(pass, 'p', sizeof pass);
        pass[n - 203] = 0;
        r.cfg.auth_mechanism = "PLAIN";
        r.cfg.auth_authzid = authzid;
        r.cfg.auth_user = "u";
        r.cfg.auth_password = pass;
        r.cfg.auth_plaintext_ok = 1;
        assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
        raw_feed(&r, GREET);
        raw_write(&r, SIZE_MAX);
        r.out.len = 0;
        raw_feed(&r, "250-mx\r\n250 AUTH PLAIN\r\n");
        raw_write(&r, SIZE_MAX);
        ob_put(&r.out, "", 0);
        size_t line = 11 + 4 * ((n + 2) / 3) + 2;
        if (line <= 512) {
            assert_int_equal(r.out.len, line);
            assert_memory_equal(r.out.p, "AUTH PLAIN ", 11);
        } else {
            assert_string_equal((const char *)r.out.p, "AUTH PLAIN\r\n");
            r.out.len = 0;
            raw_feed(&r, "334 \r\n");
            raw_write(&r, SIZE_MAX);
            assert_int_equal(r.out.len, 4 * ((n + 2) / 3) + 2);
        }
        raw_free(&r);
    }
}

/* A host-run mechanism's initial response too long for the AUTH line: the AUTH goes without
 * it, and the host gives it at step 1 after the server's empty 334. */
static void test_host_mechanism_long_initial_response(void **st)
{
    (void)st;
    raw r;
    smtpe_client_event ev;
    static uint8_t resp[600];
    memset(resp, 'r', sizeof resp);
    raw_init(&r);
    r.cfg.auth_mechanism = "X-LONG";
    r.cfg.auth_plaintext_ok = 1;
    assert_int_equal(smtpe_client_new(&r.c, &r.cfg, NULL, 0), 0);
    feed_at(r.c, GREET, 0);
    write_all(r.c);
    feed_at(r.c, "250-mx\r\n250 AUTH X-LONG\r\n", 0);
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 1);
    assert_int_equal(ev.type, SMTPE_CEV_AUTH_STEP);
    assert_int_equal(ev.auth_step.step, 0);
    assert_int_equal(smtpe_client_auth_response(r.c, resp, sizeof resp), 0);
    raw_write(&r, SIZE_MAX);
    ob_put(&r.out, "", 0);
    assert_string_equal((const char *)r.out.p, "AUTH X-LONG\r\n");
    feed_at(r.c, "334 \r\n", 0);
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 1);
    assert_int_equal(ev.type, SMTPE_CEV_AUTH_STEP);
    assert_int_equal(ev.auth_step.step, 1);
    assert_int_equal(ev.auth_step.challenge.len, 0);
    assert_int_equal(smtpe_client_auth_response(r.c, resp, sizeof resp), 0);
    r.out.len = 0;
    raw_write(&r, SIZE_MAX);
    assert_int_equal(r.out.len, 800 + 2);
    feed_at(r.c, "235 ok\r\n", 0);
    assert_int_equal(smtpe_client_next_event(r.c, &ev), 1);
    assert_int_equal(ev.type, SMTPE_CEV_READY);
    assert_true(ev.ready.authenticated);
    /* a response with no step owed */
    assert_int_equal(smtpe_client_auth_response(r.c, resp, 1), SMTPE_ERR_STATE);
    raw_free(&r);
}
/* ==== replies in one read with what the replies before them made possible ============ */

/* A host that feeds everything it has read before it sends (smtpe.h, smtpe_client_recv):
 * s goes in pieces of piece octets (0: one call), the events are taken whenever the engine
 * stops, an AUTH_STEP is answered at once, and nothing is written. Each event is one line of
 * log: its type, and for CLOSED the reason and text. */
static void feed_one_read(smtpe_client *c, const char *s, size_t piece, obuf *log)
{
    size_t n = strlen(s), off = 0;
    int stuck = 0;
    while (off < n && stuck < 3) {
        size_t k = piece && piece < n - off ? piece : n - off;
        smtpe_ssize r = smtpe_client_recv(c, (const uint8_t *)s + off, k, 0);
        smtpe_client_event ev;
        char line[300];
        assert_true(r >= 0);
        off += (size_t)r;
        stuck = r == 0 ? stuck + 1 : 0;
        while (smtpe_client_next_event(c, &ev) == 1) {
            if (ev.type == SMTPE_CEV_CLOSED) {
                snprintf(line, sizeof line, "CLOSED %d %.*s\n", ev.closed.reason,
                         (int)ev.closed.text.len, (const char *)ev.closed.text.ptr);
            } else if (ev.type == SMTPE_CEV_AUTH_STEP) {
                snprintf(line, sizeof line, "AUTH_STEP %u\n", ev.auth_step.step);
                assert_int_equal(smtpe_client_auth_response(c, (const uint8_t *)"tok", 3), 0);
            } else {
                snprintf(line, sizeof line, "EV %d\n", (int)ev.type);
            }
            ob_str(log, line);
        }
    }
    assert_int_equal(off, n);
}

/* cfg's session through reads[] (the output written after each), the last read in every
 * split (whole, one octet at a time, and pieces of every size): its events must be want in
 * each, the same as when the host's reads had ended at any of its octets. */
static void last_read_every_split(const smtpe_client_config *cfg, const char *const *reads,
                                  const char *want)
{
    size_t last = 0;
    while (reads[last + 1])
        last++;
    for (size_t piece = 0; piece <= strlen(reads[last]); piece++) {
        smtpe_client *c;
        obuf log = {0};
        assert_int_equal(smtpe_client_new(&c, cfg, NULL, 0), 0);
        for (size_t i = 0; i < last; i++) {
            feed_one_read(c, reads[i], 0, &log);
            write_all(c);
        }
        log.len = 0;
        ob_put(&log, "", 0);
        feed_one_read(c, reads[last], piece, &log);
        if (strcmp((const char *)log.p, want) != 0)
            fail_msg("pieces of %zu octets: events\n%s, expected\n%s", piece,
                     (const char *)log.p, want);
        smtpe_client_free(c);
        ob_free(&log);
    }
}

/* FIXED (found by fuzz_client's split-invariance oracle): a 334 in the same read as the EHLO
 * reply that leads to AUTH by a host-run mechanism. When the read ended after the EHLO reply,
 * AUTH_STEP 0 came and the 334 was judged against the AUTH line the host then gave (queued,
 * not handed out: unsolicited); in one read the 334 was judged before the AUTH step was
 * prepared, and the session closed without AUTH_STEP. Each reply's consequences (advance)
 * now come before the next reply is judged. */
static void test_fixed_auth_step_before_next_reply_of_read(void **st)
{
    (void)st;
    smtpe_client_config cfg;
    const char *const reads[] = {GREET, "250-mx\r\n250 AUTH X-TOKEN\r\n334 go ahead\r\n", NULL};
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "client.example";
    cfg.auth_mechanism = "X-TOKEN";
    cfg.auth_plaintext_ok = 1;
    last_read_every_split(&cfg, reads,
                          "AUTH_STEP 0\nCLOSED 2 a reply with no command outstanding\n");
}

/* FIXED (found by fuzz_client): the EHLO reply after XCLIENT lists none of the attributes
 * still to send and no AUTH mechanism, and a stray reply follows in the same read. The
 * XCLIENT step finds nothing left, and AUTH cannot go: the session ends for that
 * (AUTH_FAILED, with QUIT) before the stray reply is judged, in every split; in one read it
 * was judged first (a protocol error), so the close depended on where reads ended. */
static void test_fixed_setup_close_before_next_reply_of_read(void **st)
{
    (void)st;
    static char v[3][201];
    static smtpe_param attrs[3];
    static const char *const names[3] = {"NAME", "ADDR", "HELO"};
    smtpe_client_config cfg;
    const char *const reads[] = {GREET, "250-mx\r\n250-XCLIENT NAME ADDR HELO\r\n250 AUTH PLAIN\r\n",
                                 "220 ok\r\n", "250-mx\r\n250 XCLIENT NAME\r\n250 stray\r\n",
                                 NULL};
    for (int i = 0; i < 3; i++) { /* two attributes fill the first line, HELO needs a second */
        memset(v[i], 'a' + i, 200);
        attrs[i].keyword.ptr = (const uint8_t *)names[i];
        attrs[i].keyword.len = 4;
        attrs[i].value.ptr = (const uint8_t *)v[i];
        attrs[i].value.len = 200;
    }
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "client.example";
    cfg.xclient = attrs;
    cfg.xclient_count = 3;
    cfg.auth_mechanism = "PLAIN";
    cfg.auth_user = "u";
    cfg.auth_password = "p";
    cfg.auth_plaintext_ok = 1;
    last_read_every_split(&cfg, reads,
                          "CLOSED 6 the server offers no usable AUTH mechanism\n");
}

/* ==== BDAT and max_unanswered ======================================================== */

/* FIXED (review): the first BDAT goes with the pipelined MAIL / RCPT group, and its command
 * line was not held to max_unanswered as DATA's is (RFC 2920 §3.1): a group of 505 octets
 * under a cap of 512 got "BDAT 21 LAST" (14 octets) behind it, 519 octets unanswered. The
 * chunk now waits until its line fits (the longest a BDAT line of the session can be, 17
 * octets here), and want() says CONTENT exactly then. */
static void test_fixed_bdat_line_held_to_max_unanswered(void **st)
{
    (void)st;
    static char names[6][80];
    static smtpe_client_rcpt rcpts[6];
    smtpe_client_config cfg;
    smtpe_client_txn txn;
    smtpe_client *c;
    const uint8_t *o;
    size_t len, group = 0, lines = 0;
    char bdat[32];
    smtpe_client_config_init(&cfg);
    cfg.helo_name = "client.example";
    cfg.max_unanswered = 512;
    assert_int_equal(smtpe_client_new(&c, &cfg, NULL, 0), 0);
    feed_at(c, GREET, 0);
    write_all(c);
    feed_at(c, "250-mx\r\n250-PIPELINING\r\n250 CHUNKING\r\n", 0);
    take_all(c);
    /* MAIL FROM:<s@example.com> is 27 octets, each RCPT TO:<...> 12 + its path: the paths
     * of 68, 68, 68, 68, 67 and 67 octets make a group of 505 */
    for (int i = 0; i < 6; i++) {
        size_t local = (i < 4 ? 68 : 67) - strlen("@example.org");
        memset(names[i], 'a' + i, local);
        strcpy(names[i] + local, "@example.org");
        rcpts[i].forward_path = names[i];
    }
    memset(&txn, 0, sizeof txn);
    txn.reverse_path = "s@example.com";
    txn.rcpts = rcpts;
    txn.rcpt_count = 6;
    assert_int_equal(smtpe_client_submit(c, &txn), 0);
    take_all(c); /* CONTENT */
    while ((o = smtpe_client_send_buf(c, &len)) && len > 0) {
        for (size_t i = 0; i < len; i++)
            lines += o[i] == '\n';
        group += len;
        smtpe_client_send_ack(c, len);
    }
    assert_int_equal(lines, 7);
    assert_int_equal(group, 505);
    /* 505 + 17 > 512: the chunk waits, whatever the host tries */
    assert_false(smtpe_client_want(c) & SMTPE_WANT_CONTENT);
    assert_int_equal(smtpe_client_content(c, MSG, sizeof MSG - 1, 1), 0);
    assert_int_equal(smtpe_client_send_buf(c, &len) ? len : 0, 0);
    /* the MAIL's reply: 478 + 17 <= 512, so it goes */
    feed_at(c, "250 ok\r\n", 0);
    take_all(c);
    assert_true(smtpe_client_want(c) & SMTPE_WANT_CONTENT);
    assert_int_equal(smtpe_client_content(c, MSG, sizeof MSG - 1, 1), sizeof MSG - 1);
    o = smtpe_client_send_buf(c, &len);
    snprintf(bdat, sizeof bdat, "BDAT %zu LAST\r\n", sizeof MSG - 1);
    assert_int_equal(len, strlen(bdat) + sizeof MSG - 1);
    assert_memory_equal(o, bdat, strlen(bdat));
    assert_true(478 + strlen(bdat) <= 512);
    smtpe_client_free(c);
}

/* ==== main ============================================================================ */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_xclient_unlisted_stalls_auth),
        cmocka_unit_test(test_xclient_unlisted_ready),
        cmocka_unit_test(test_xclient_listed_only),
        cmocka_unit_test(test_starttls_inject_later_call),
        cmocka_unit_test(test_fixed_421_before_commands_handed),
        cmocka_unit_test(test_content_every_piece_size),
        cmocka_unit_test(test_content_small_cases),
        cmocka_unit_test(test_content_ring_wraps),
        cmocka_unit_test(test_content_fills_ring),
        cmocka_unit_test(test_pipeline_failure_every_position),
        cmocka_unit_test(test_fixed_second_transaction_done_without_outcomes),
        cmocka_unit_test(test_fixed_second_transaction_bdat_lmtp),
        cmocka_unit_test(test_lost_after_dot_acked_is_unknown),
        cmocka_unit_test(test_fixed_rset_refused_no_quit_behind_pipelined_data),
        cmocka_unit_test(test_content_ref_same_wire),
        cmocka_unit_test(test_content_ref_dropped_at_close),
        cmocka_unit_test(test_helo_name_ascii_only),
        cmocka_unit_test(test_fixed_421_with_dot_partly_written),
        cmocka_unit_test(test_bdat_empty_last_while_reply_owed),
        cmocka_unit_test(test_lost_after_bdat_last_is_unknown),
        cmocka_unit_test(test_protocol_error_after_dot_is_unknown),
        cmocka_unit_test(test_lmtp_lost_mid_series),
        cmocka_unit_test(test_end_at_every_point),
        cmocka_unit_test(test_timeout_per_stage),
        cmocka_unit_test(test_timeout_host_owes),
        cmocka_unit_test(test_bad_config_strings),
        cmocka_unit_test(test_fixed_auth_string_limits_off_by_one),
        cmocka_unit_test(test_bad_transaction_strings),
        cmocka_unit_test(test_bad_paths),
        cmocka_unit_test(test_null_session),
        cmocka_unit_test(test_calls_in_wrong_states),
        cmocka_unit_test(test_bad_transaction_shapes),
        cmocka_unit_test(test_reply_line_limits),
        cmocka_unit_test(test_max_unanswered_512),
        cmocka_unit_test(test_max_recipients_boundaries),
        cmocka_unit_test(test_memory_formula),
        cmocka_unit_test(test_auth_hostile),
        cmocka_unit_test(test_fixed_long_auth_line_truncated),
        cmocka_unit_test(test_lmtp_reply_counts),
        cmocka_unit_test(test_lmtp_lone_dot),
        cmocka_unit_test(test_reply_mid_content),
        cmocka_unit_test(test_reply_before_dot_handed),
        cmocka_unit_test(test_reply_begun_before_end_handed),
        cmocka_unit_test(test_multiline_reply_begun_before_end_handed),
        cmocka_unit_test(test_421_begun_before_end_written),
        cmocka_unit_test(test_reply_begun_after_end_handed_split),
        cmocka_unit_test(test_reply_begun_before_end_scripted),
        cmocka_unit_test(test_greeting_and_forged_ehlo),
        cmocka_unit_test(test_chaos),
        cmocka_unit_test(test_fixed_closed_with_end_of_data_queued),
        cmocka_unit_test(test_fixed_lmtp_421_in_series_not_unknown),
        cmocka_unit_test(test_starttls_injection_correct_host),
        cmocka_unit_test(test_implicit_tls),
        cmocka_unit_test(test_lockstep_every_failure),
        cmocka_unit_test(test_fixed_rset_refused_after_bdat_last_sent),
        cmocka_unit_test(test_fixed_421_before_dot_handed),
        cmocka_unit_test(test_fixed_small_chunk_size_stalls),
        cmocka_unit_test(test_size_param_exact),
        cmocka_unit_test(test_binarymime_verbatim),
        cmocka_unit_test(test_unscanned_content_refused_midstream),
        cmocka_unit_test(test_split_invariance),
        cmocka_unit_test(test_xclient_several_lines),
        cmocka_unit_test(test_auth_initial_response_boundary),
        cmocka_unit_test(test_host_mechanism_long_initial_response),
        cmocka_unit_test(test_fixed_auth_step_before_next_reply_of_read),
        cmocka_unit_test(test_fixed_setup_close_before_next_reply_of_read),
        cmocka_unit_test(test_fixed_bdat_line_held_to_max_unanswered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
