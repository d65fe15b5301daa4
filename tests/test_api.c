/*
 * test_api.c - unit tests of the conventions of the server API from 0.2 on (include/smtpe.h):
 * versions, versioned structs (only the caller's layout is read or written), the config copied
 * at creation, stable output (octets handed out by send_buf never move before their ack, also
 * when the ring wraps), concurrent verdicts (max_pending_verdicts > 1, RFC 2920 §3.1: events
 * handed out ahead of verdicts, replies in command order, the hard cases), verdicts only for
 * taken events, the abandoned-transaction flag and the want flags.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "smtpe.h"

#define GREETING "220 mx.example ESMTP smtpe\r\n"
#define EHLO_REPLY                                                                             \
    "250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250-8BITMIME\r\n"                \
    "250-SMTPUTF8\r\n250 ENHANCEDSTATUSCODES\r\n"

/* ---- a session on the raw API ------------------------------------------------------------ */
typedef struct as {
    smtpe_server *s;
    smtpe_server_config cfg;
    hs_buf out;    /* output taken and not yet checked */
    hs_buf in;     /* client octets; in.p[in_off..] not yet consumed */
    size_t in_off;
    uint64_t now;
} as;

static void as_open(as *t, unsigned pending)
{
    memset(t, 0, sizeof *t);
    smtpe_server_config_init(&t->cfg);
    t->cfg.hostname = "mx.example";
    t->cfg.max_pending_verdicts = pending;
    assert_int_equal(smtpe_server_new(&t->s, &t->cfg, NULL, 0), 0);
}

/* Makes the session again with t->cfg as the test changed it (a session copies its config when
 * it is created). */
static void as_reopen(as *t)
{
    smtpe_server_free(t->s);
    assert_int_equal(smtpe_server_new(&t->s, &t->cfg, NULL, 0), 0);
}

static void as_close(as *t)
{
    smtpe_server_free(t->s);
    hs_buf_free(&t->out);
    hs_buf_free(&t->in);
}

/* Takes all output (every run) into t->out. */
static void as_take(as *t)
{
    size_t len;
    const uint8_t *p;
    while ((p = smtpe_server_send_buf(t->s, &len)), len > 0) {
        hs_buf_add(&t->out, p, len);
        assert_int_equal(smtpe_server_send_ack(t->s, len), 0);
    }
}

static void as_expect(as *t, const char *want)
{
    hs_buf msg = {0};
    as_take(t);
    if (hs_output_differs(&t->out, want, &msg))
        fail_msg("%s", hs_buf_cstr(&msg));
    hs_buf_reset(&t->out);
}

/* Appends client octets. */
static void as_send(as *t, const char *s)
{
    hs_buf_adds(&t->in, s);
}

/* Feeds what the engine takes of the client octets held; returns the octets consumed. The
 * consumed octets stay in place until the next feed (content spans point into them). */
static size_t as_feed(as *t)
{
    memmove(t->in.p, t->in.p + t->in_off, t->in.len - t->in_off);
    t->in.len -= t->in_off;
    t->in_off = 0;
    smtpe_ssize r = smtpe_server_recv(t->s, t->in.p, t->in.len, t->now);
    assert_true(r >= 0);
    t->in_off = (size_t)r;
    return (size_t)r;
}

/* Client octets not yet consumed. */
static size_t as_left(const as *t)
{
    return t->in.len - t->in_off;
}

/* Feeds and takes the next event, which must be of type. */
static smtpe_event as_event(as *t, smtpe_event_type type)
{
    smtpe_event ev;
    (void)as_feed(t);
    assert_int_equal(smtpe_server_next_event(t->s, &ev), 1);
    assert_int_equal(ev.type, type);
    return ev;
}

/* Feeds; no event comes. */
static void as_no_event(as *t)
{
    smtpe_event ev;
    (void)as_feed(t);
    assert_int_equal(smtpe_server_next_event(t->s, &ev), 0);
}

static int span_is(smtpe_span sp, const char *s)
{
    size_t n = strlen(s);
    return sp.len == n && (n == 0 || memcmp(sp.ptr, s, n) == 0);
}

/* EHLO accepted, greeting and EHLO reply checked. */
static void as_ehlo(as *t)
{
    as_send(t, "EHLO c.example\r\n");
    (void)as_event(t, SMTPE_EV_HELO);
    assert_int_equal(smtpe_server_accept(t->s), 0);
    as_expect(t, GREETING EHLO_REPLY);
}

/* ---- versions ---------------------------------------------------------------------------- */

static void test_version(void **state)
{
    (void)state;
    char want[32];
    assert_int_equal(smtpe_version(), SMTPE_VERSION_NUM);
    assert_int_equal(SMTPE_VERSION_NUM, (SMTPE_VERSION_MAJOR << 16) | (SMTPE_VERSION_MINOR << 8) |
                                            SMTPE_VERSION_PATCH);
    snprintf(want, sizeof want, "%d.%d.%d", SMTPE_VERSION_MAJOR, SMTPE_VERSION_MINOR,
             SMTPE_VERSION_PATCH);
    assert_string_equal(smtpe_version_string(), want);
    assert_string_equal(SMTPE_VERSION_STRING, want);
#ifdef SMTPE_EXPECTED_VERSION_STRING /* CMakeLists.txt's project version */
    assert_string_equal(smtpe_version_string(), SMTPE_EXPECTED_VERSION_STRING);
    assert_int_equal(smtpe_version(), SMTPE_EXPECTED_VERSION_NUM);
#endif
}

/* ---- versioned structs ------------------------------------------------------------------- */

/* A struct of n octets followed by guard octets that must stay untouched. */
#define GUARD 64
typedef struct guarded {
    max_align_t align;
    uint8_t b[2048 + GUARD];
} guarded;

static void guard_fill(guarded *g)
{
    memset(g->b, 0xa5, sizeof g->b);
}

static int guard_intact(const guarded *g, size_t from)
{
    for (size_t i = from; i < from + GUARD; i++)
        if (g->b[i] != 0xa5)
            return 0;
    return 1;
}

static void test_versioned_structs(void **state)
{
    (void)state;
    static guarded g;
    smtpe_server_config *cfg = (smtpe_server_config *)(void *)g.b;
    smtpe_server *s;
    smtpe_event *ev;
    smtpe_server_stats *st;

    /* config_init writes exactly the caller's layout, and nothing for a version it lacks */
    guard_fill(&g);
    smtpe_server_config_init_versioned(SMTPE_SERVER_CONFIG_V1, cfg);
    assert_true(guard_intact(&g, sizeof *cfg));
    assert_int_equal(cfg->max_pending_verdicts, 1);
    guard_fill(&g);
    smtpe_server_config_init_versioned(0, cfg);
    smtpe_server_config_init_versioned(SMTPE_SERVER_CONFIG_VERSION + 1, cfg);
    assert_true(guard_intact(&g, 0));

    /* an unknown layout is refused, never read */
    smtpe_server_config c;
    smtpe_server_config_init(&c);
    assert_int_equal(smtpe_server_memory_size_versioned(SMTPE_SERVER_CONFIG_VERSION + 1, &c), 0);
    assert_int_equal(smtpe_server_new_versioned(&s, SMTPE_SERVER_CONFIG_VERSION + 1, &c, NULL, 0),
                     SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_new_versioned(&s, 0, &c, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    static max_align_t mem[8192 / sizeof(max_align_t)];
    assert_int_equal(smtpe_server_init_versioned(&s, mem, sizeof mem,
                                                 SMTPE_SERVER_CONFIG_VERSION + 1, &c, 0),
                     SMTPE_ERR_INVALID_ARGUMENT);

    /* next_event writes exactly the caller's layout */
    assert_int_equal(smtpe_server_new(&s, &c, NULL, 0), 0);
    const char *in = "EHLO c.example\r\n";
    assert_int_equal(smtpe_server_recv(s, (const uint8_t *)in, strlen(in), 0), (smtpe_ssize)16);
    ev = (smtpe_event *)(void *)g.b;
    guard_fill(&g);
    assert_int_equal(smtpe_server_next_event_versioned(s, SMTPE_EVENT_VERSION + 1, ev), 0);
    assert_int_equal(smtpe_server_next_event_versioned(s, 0, ev), 0);
    assert_true(guard_intact(&g, 0));
    assert_int_equal(smtpe_server_next_event_versioned(s, SMTPE_EVENT_V1, ev), 1);
    assert_int_equal(ev->type, SMTPE_EV_HELO);
    assert_int_equal(ev->id, 1);
    assert_true(guard_intact(&g, sizeof *ev));

    /* stats likewise */
    st = (smtpe_server_stats *)(void *)g.b;
    guard_fill(&g);
    smtpe_server_get_stats_versioned(s, SMTPE_SERVER_STATS_VERSION + 1, st);
    assert_true(guard_intact(&g, 0));
    smtpe_server_get_stats_versioned(s, SMTPE_SERVER_STATS_V1, st);
    assert_int_equal(st->octets_in, 16);
    assert_int_equal(st->commands, 1);
    assert_true(guard_intact(&g, sizeof *st));
    smtpe_server_free(s);
}

/* The session keeps its own copy of the config: changing (or freeing) the struct afterwards
 * changes nothing for it. */
static void test_config_copied(void **state)
{
    (void)state;
    smtpe_server_config *c = malloc(sizeof *c);
    smtpe_server *s;
    smtpe_event ev;
    size_t len;
    assert_non_null(c);
    smtpe_server_config_init(c);
    c->hostname = "first.example";
    c->max_errors = 1;
    assert_int_equal(smtpe_server_new(&s, c, NULL, 0), 0);
    c->hostname = "second.example";
    c->max_errors = 100;
    c->extensions = 0;
    memset(c, 0xff, sizeof *c);
    free(c);
    const char *in = "FOO\r\nBAR\r\n";
    assert_true(smtpe_server_recv(s, (const uint8_t *)in, 5, 0) == 5);
    assert_int_equal(smtpe_server_next_event(s, &ev), 1);
    assert_int_equal(smtpe_server_accept(s), 0); /* 500: the first error */
    assert_true(smtpe_server_recv(s, (const uint8_t *)in + 5, 5, 0) == 5);
    assert_int_equal(smtpe_server_next_event(s, &ev), 1);
    assert_int_equal(smtpe_server_accept(s), 0); /* 500: past max_errors 1 */
    const uint8_t *p = smtpe_server_send_buf(s, &len);
    const char *want = "220 first.example ESMTP smtpe\r\n500 5.5.1 Command unrecognized\r\n"
                       "421 4.7.0 first.example Too many errors\r\n";
    assert_int_equal(len, strlen(want));
    assert_memory_equal(p, want, len);
    smtpe_server_free(s);
}

/* ---- stable output ----------------------------------------------------------------------- */

/* The pointer send_buf gives keeps its octets through pipelined verdicts, further input, other
 * events and timer calls, until acknowledged; new replies queue behind it. */
static void test_stable_output_held_across_verdicts(void **state)
{
    (void)state;
    as t;
    as_open(&t, 1);
    size_t len, len2;
    const uint8_t *p = smtpe_server_send_buf(t.s, &len);
    uint8_t copy[64];
    assert_int_equal(len, strlen(GREETING));
    memcpy(copy, p, len);
    /* the greeting is in flight; the whole session goes on behind it */
    as_send(&t, "EHLO c.example\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.com>\r\n"
                "RCPT TO:<c@example.com>\r\nNOOP\r\n");
    (void)as_event(&t, SMTPE_EV_HELO);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    (void)as_event(&t, SMTPE_EV_MAIL);
    (void)smtpe_server_expiry(t.s, 5);
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.1.0", "Sender ok"), 0);
    (void)as_event(&t, SMTPE_EV_RCPT);
    assert_int_equal(smtpe_server_reply(t.s, 550, "5.1.1", "No such user"), 0);
    (void)as_event(&t, SMTPE_EV_RCPT);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    (void)as_feed(&t);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 10), 0);
    assert_memory_equal(p, copy, strlen(GREETING));
    /* the same run, grown: same address */
    assert_ptr_equal(smtpe_server_send_buf(t.s, &len2), p);
    assert_true(len2 > len);
    assert_memory_equal(p, copy, strlen(GREETING));
    /* acknowledge part of it: the rest stays where it was */
    assert_int_equal(smtpe_server_send_ack(t.s, 10), 0);
    assert_ptr_equal(smtpe_server_send_buf(t.s, &len2), p + 10);
    as_expect(&t, &GREETING EHLO_REPLY "250 2.1.0 Sender ok\r\n550 5.1.1 No such user\r\n"
                  "250 2.1.5 Ok\r\n250 2.0.0 Ok\r\n"[10]);
    as_close(&t);
    as_open(&t, 1);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.com>\r\nNOOP\r\n");
    (void)as_event(&t, SMTPE_EV_MAIL);
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.1.0", "Sender ok"), 0);
    (void)as_event(&t, SMTPE_EV_RCPT);
    assert_int_equal(smtpe_server_reply(t.s, 550, "5.1.1", "No such user"), 0);
    as_no_event(&t);
    as_expect(&t, "250 2.1.0 Sender ok\r\n550 5.1.1 No such user\r\n250 2.0.0 Ok\r\n");
    as_close(&t);
}

/* Random acknowledgements, each delayed over a random number of engine calls, against the same
 * session acknowledged at once: the same octets reach the wire, and every run handed out keeps
 * its content until its ack, also when the ring wraps into a second run. */
static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void stable_session(uint64_t seed, int delay, hs_buf *wire)
{
    as t;
    uint64_t x = seed, y = seed ^ 0x5bd1e995; /* x: the commands; y: when and what to ack */
    as_open(&t, 1);
    const uint8_t *flight = NULL; /* a run handed out and not acknowledged */
    size_t flight_len = 0;
    uint8_t copy[8192];
    int runs = 0;
    for (int round = 0; round < 400; round++) {
        unsigned k = (unsigned)(rnd(&x) % 8);
        const char *cmd = k < 4 ? "NOOP\r\n" : k < 6 ? "VRFY someone-with-a-long-name\r\n"
                                   : k == 6      ? "HELP\r\n"
                                                 : "RSET\r\n";
        as_send(&t, cmd);
        for (int guard = 0; as_left(&t) > 0 && guard < 100; guard++) {
            smtpe_event ev;
            (void)as_feed(&t);
            while (smtpe_server_next_event(t.s, &ev) == 1)
                if (smtpe_event_needs_reply(&ev))
                    assert_int_equal(smtpe_server_accept(t.s), 0);
            if (flight) /* still in place, still the same */
                assert_memory_equal(flight, copy, flight_len);
            if (!flight || !delay || rnd(&y) % 3 == 0) {
                if (flight) {
                    size_t n = rnd(&y) % (flight_len + 1);
                    if (!delay)
                        n = flight_len;
                    hs_buf_add(wire, flight, n);
                    assert_int_equal(smtpe_server_send_ack(t.s, n), 0);
                    flight = NULL;
                }
                size_t len;
                const uint8_t *p = smtpe_server_send_buf(t.s, &len);
                if (len > 0) {
                    assert_true(len <= sizeof copy);
                    flight = p;
                    flight_len = len;
                    memcpy(copy, p, len);
                    runs++;
                }
            }
        }
    }
    for (int guard = 0;; guard++) { /* drain: everything acknowledged, all input fed */
        assert_true(guard < 100000);
        if (flight) {
            hs_buf_add(wire, flight, flight_len);
            assert_int_equal(smtpe_server_send_ack(t.s, flight_len), 0);
        }
        size_t len;
        smtpe_event ev;
        (void)as_feed(&t);
        while (smtpe_server_next_event(t.s, &ev) == 1)
            if (smtpe_event_needs_reply(&ev))
                assert_int_equal(smtpe_server_accept(t.s), 0);
        flight = smtpe_server_send_buf(t.s, &len);
        flight_len = len;
        if (len == 0 && as_left(&t) == 0)
            break;
    }
    assert_true(runs > 0);
    as_close(&t);
}

static void test_stable_output_random_acks(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        hs_buf now = {0}, later = {0};
        stable_session(seed * 0x9e3779b97f4a7c15ull, 0, &now);
        stable_session(seed * 0x9e3779b97f4a7c15ull, 1, &later);
        assert_int_equal(now.len, later.len);
        assert_memory_equal(now.p, later.p, now.len);
        hs_buf_free(&now);
        hs_buf_free(&later);
    }
}

/* The ring's second run: output acknowledged in part leaves room at the start, the next replies
 * go there, and send_buf gives them only after the first run is all acknowledged. */
static void test_stable_output_two_runs(void **state)
{
    (void)state;
    as t;
    as_open(&t, 1);
    t.cfg.reply_buffer_size = 8192;
    as_reopen(&t);
    as_ehlo(&t);
    /* fill half the ring with NOOP replies, nothing acknowledged */
    hs_buf expect = {0};
    size_t len;
    for (int i = 0; i < 320; i++) {
        as_send(&t, "NOOP\r\n");
        hs_buf_adds(&expect, "250 2.0.0 Ok\r\n");
    }
    while (as_left(&t) > 0 && as_feed(&t) > 0)
        ;
    const uint8_t *a = smtpe_server_send_buf(t.s, &len);
    size_t first = len;
    assert_true(first > 4000);
    /* acknowledge most of it: the start of the ring is free, its end is nearly full */
    assert_int_equal(smtpe_server_send_ack(t.s, first - 14), 0);
    const uint8_t *rest = smtpe_server_send_buf(t.s, &len);
    assert_ptr_equal(rest, a + first - 14);
    uint8_t tail[14];
    memcpy(tail, rest, 14);
    for (int i = 0; i < 300; i++) {
        as_send(&t, "NOOP\r\n");
        hs_buf_adds(&expect, "250 2.0.0 Ok\r\n");
    }
    while (as_left(&t) > 0 && as_feed(&t) > 0)
        assert_memory_equal(rest, tail, 14); /* the octets in flight never move */
    assert_memory_equal(rest, tail, 14);
    /* collect: the wire carries every reply once, in order */
    hs_buf wire = {0};
    hs_buf_add(&wire, a, first - 14);
    int runs = 0;
    for (;;) {
        const uint8_t *p = smtpe_server_send_buf(t.s, &len);
        if (len == 0) {
            if (as_left(&t) == 0)
                break;
            (void)as_feed(&t);
            continue;
        }
        runs++;
        hs_buf_add(&wire, p, len);
        assert_int_equal(smtpe_server_send_ack(t.s, len), 0);
        (void)as_feed(&t);
    }
    assert_true(runs >= 2); /* the ring wrapped */
    assert_int_equal(wire.len, expect.len);
    assert_memory_equal(wire.p, expect.p, expect.len);
    hs_buf_free(&wire);
    hs_buf_free(&expect);
    as_close(&t);
}

/* smtpe_server_close replaces the greeting only while no octet of it was handed out. */
static void test_close_after_handing_out(void **state)
{
    (void)state;
    as t;
    size_t len;
    as_open(&t, 1);
    assert_int_equal(smtpe_server_close(t.s, 421, "4.7.0", "Busy"), 0);
    as_expect(&t, "421 4.7.0 Busy\r\n");
    as_close(&t);
    as_open(&t, 1);
    const uint8_t *p = smtpe_server_send_buf(t.s, &len);
    assert_int_equal(smtpe_server_close(t.s, 421, "4.7.0", "Busy"), 0);
    assert_memory_equal(p, GREETING, strlen(GREETING)); /* the write in flight stays valid */
    as_expect(&t, GREETING "421 4.7.0 Busy\r\n");
    as_close(&t);
}

/* smtpe_server_close always closes: a text that the room kept for the final reply cannot hold
 * behind unsent replies gives way to the code's default text. */
static void test_close_always_closes(void **state)
{
    (void)state;
    as t;
    char text[2100];
    as_open(&t, 1);
    t.cfg.reply_buffer_size = 2048; /* the smallest ring: R + 600 */
    as_reopen(&t);
    as_take(&t);
    hs_buf_reset(&t.out);
    as_send(&t, "VRFY someone\r\n");
    (void)as_event(&t, SMTPE_EV_VRFY);
    for (int i = 0; i < 4; i++) { /* a long reply that stays unsent: 5 lines of 400 octets */
        memset(text + i * 401, 'v', 400);
        text[i * 401 + 400] = '\n';
    }
    memset(text + 4 * 401, 'v', 400);
    text[5 * 401 - 1] = 0;
    assert_int_equal(smtpe_server_reply(t.s, 252, "2.5.0", text), 0);
    for (int i = 0; i < 3; i++) { /* four lines of 340 octets: more than 600 with the codes */
        memset(text + i * 341, 'a' + i, 340);
        text[i * 341 + 340] = '\n';
    }
    memset(text + 3 * 341, 'd', 340);
    text[4 * 341 - 1] = 0;
    assert_int_equal(smtpe_server_close(t.s, 421, "4.3.2", text), 0);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    as_take(&t);
    assert_true(t.out.len > 20);
    assert_memory_equal(t.out.p + t.out.len - strlen("421 4.3.2 Try again later\r\n"),
                        "421 4.3.2 Try again later\r\n", strlen("421 4.3.2 Try again later\r\n"));
    as_close(&t);
    /* with room, the text goes out as given; text over the limits is refused, nothing done */
    as_open(&t, 1);
    memset(text, 'x', 401);
    text[401] = 0;
    assert_int_equal(smtpe_server_close(t.s, 421, "4.3.2", text), SMTPE_ERR_REPLY_TOO_LONG);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    text[400] = 0;
    assert_int_equal(smtpe_server_close(t.s, 421, "4.3.2", text), 0);
    as_take(&t);
    assert_int_equal(t.out.len, strlen("421 4.3.2 \r\n") + 400);
    as_close(&t);
}

/* ---- verdicts only for taken events ------------------------------------------------------ */

static void test_verdict_needs_taken_event(void **state)
{
    (void)state;
    as t;
    smtpe_event ev;
    as_open(&t, 1);
    as_send(&t, "EHLO c.example\r\n");
    (void)as_feed(&t);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_EVENT);
    assert_int_equal(smtpe_server_accept(t.s), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_reply_id(t.s, 1, 250, NULL, NULL), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1); /* the event was not swallowed */
    assert_int_equal(ev.type, SMTPE_EV_HELO);
    assert_int_equal(smtpe_server_reply_id(t.s, ev.id + 1, 250, NULL, NULL), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_reply_id(t.s, 0, 250, NULL, NULL), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_accept_id(t.s, ev.id), 0);
    assert_int_equal(smtpe_server_accept_id(t.s, ev.id), SMTPE_ERR_STATE); /* once */
    as_expect(&t, GREETING EHLO_REPLY);
    /* AUTH challenges too */
    as_close(&t);
}

/* ---- concurrent verdicts ----------------------------------------------------------------- */

/* MAIL and five RCPTs are all handed out before any verdict; DATA waits. Verdicts in reverse
 * order: nothing goes out until the MAIL's, then everything in command order. */
static void test_concurrent_reverse_order(void **state)
{
    (void)state;
    as t;
    smtpe_event ev[6];
    as_open(&t, 8);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<r0@example.com>\r\n"
                "RCPT TO:<r1@example.com>\r\nRCPT TO:<r2@example.com>\r\n"
                "RCPT TO:<r3@example.com>\r\nRCPT TO:<r4@example.com>\r\nDATA\r\nSubject: x\r\n");
    ev[0] = as_event(&t, SMTPE_EV_MAIL);
    for (int i = 1; i < 6; i++) {
        char want[32];
        ev[i] = as_event(&t, SMTPE_EV_RCPT);
        snprintf(want, sizeof want, "r%d@example.com", i - 1);
        assert_true(span_is(ev[i].rcpt.forward_path.mailbox, want));
        assert_true(ev[i].id > ev[i - 1].id);
    }
    as_no_event(&t); /* DATA waits for every verdict */
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_READ);
    assert_int_equal(smtpe_server_expiry(t.s, 0), UINT64_MAX);
    /* every span stays valid until its own verdict */
    for (int i = 5; i >= 1; i--) {
        char want[32];
        snprintf(want, sizeof want, "r%d@example.com", i - 1);
        assert_true(span_is(ev[i].rcpt.forward_path.mailbox, want));
        if (i == 3)
            assert_int_equal(smtpe_server_reply_id(t.s, ev[i].id, 550, "5.1.1", "No such user"), 0);
        else
            assert_int_equal(smtpe_server_accept_id(t.s, ev[i].id), 0);
        as_expect(&t, ""); /* the MAIL's reply is owed first */
    }
    assert_true(span_is(ev[0].mail.reverse_path.mailbox, "a@example.org"));
    assert_int_equal(smtpe_server_accept_id(t.s, ev[0].id), 0);
    as_expect(&t, "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n550 5.1.1 No such user\r\n"
                  "250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n");
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    (void)as_event(&t, SMTPE_EV_DATA);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    as_expect(&t, "354 End data with <CR><LF>.<CR><LF>\r\n");
    as_send(&t, "\r\nbody\r\n.\r\n");
    hs_buf content = {0};
    smtpe_event e;
    do {
        (void)as_feed(&t);
        assert_int_equal(smtpe_server_next_event(t.s, &e), 1);
        if (e.type == SMTPE_EV_DATA_CHUNK)
            hs_buf_add(&content, e.chunk.ptr, e.chunk.len);
    } while (e.type == SMTPE_EV_DATA_CHUNK);
    assert_int_equal(e.type, SMTPE_EV_DATA_END);
    assert_int_equal(e.data_end.status, SMTPE_DATA_OK);
    assert_int_equal(content.len, strlen("Subject: x\r\n\r\nbody\r\n"));
    assert_memory_equal(content.p, "Subject: x\r\n\r\nbody\r\n", content.len);
    hs_buf_free(&content);
    as_close(&t);
}

/* Verdicts in a scrambled order with the head in the middle: replies leave exactly as far as
 * the command order allows after each verdict. */
static void test_concurrent_partial_release(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r[3];
    as_open(&t, 4);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n"
                "RCPT TO:<y@example.com>\r\n"
                "RCPT TO:<z@example.com>\r\nRSET\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    for (int i = 0; i < 3; i++)
        r[i] = as_event(&t, SMTPE_EV_RCPT);
    as_no_event(&t);
    assert_int_equal(smtpe_server_accept_id(t.s, r[1].id), 0);
    as_expect(&t, "");
    assert_int_equal(smtpe_server_reply_id(t.s, m.id, 250, "2.1.0", "Sender ok"), 0);
    as_expect(&t, "250 2.1.0 Sender ok\r\n"); /* r[0] is owed before r[1] */
    assert_int_equal(smtpe_server_reply_id(t.s, r[0].id, 450, "4.2.1", "Try later"), 0);
    as_expect(&t, "450 4.2.1 Try later\r\n250 2.1.5 Ok\r\n");
    /* four held, no line buffer free: RSET is still the host's; then it runs, abandoning the
     * transaction */
    assert_int_equal(as_left(&t), strlen("RSET\r\n"));
    assert_int_equal(smtpe_server_accept_id(t.s, r[2].id), 0);
    as_expect(&t, "250 2.1.5 Ok\r\n");
    smtpe_event e = as_event(&t, SMTPE_EV_RSET);
    assert_int_equal(e.abandoned, 1);
    as_expect(&t, "250 2.0.0 Ok\r\n");
    as_close(&t);
}

/* The MAIL is refused after its RCPTs were handed out: each gets 503 5.5.1 at once, whatever its
 * verdict; those verdicts are still owed, return SMTPE_VOIDED and change nothing; DATA, whose
 * turn has come, gets 503 too without waiting for them. */
static void test_concurrent_mail_refused(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r[3];
    as_open(&t, 8);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<spam@example.org>\r\nRCPT TO:<x@example.com>\r\n"
                "RCPT TO:<y@example.com>\r\nRCPT TO:<bad address>\r\nDATA\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    r[0] = as_event(&t, SMTPE_EV_RCPT);
    r[1] = as_event(&t, SMTPE_EV_RCPT);
    as_no_event(&t); /* the malformed RCPT: the engine's 501 waits its turn; DATA waits */
    assert_int_equal(smtpe_server_accept_id(t.s, r[0].id), 0); /* held: 250 */
    assert_int_equal(smtpe_server_reply_id(t.s, m.id, 550, "5.7.1", "Go away"), 0);
    as_expect(&t, "550 5.7.1 Go away\r\n503 5.5.1 Need MAIL command\r\n"
                  "503 5.5.1 Need MAIL command\r\n503 5.5.1 Need MAIL command\r\n"
                  "503 5.5.1 Need MAIL command\r\n"); /* the last: DATA, no transaction */
    /* r[1]'s verdict is still owed, its spans still valid */
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    assert_true(span_is(r[1].rcpt.forward_path.mailbox, "y@example.com"));
    as_no_event(&t);
    assert_int_equal(smtpe_server_accept_id(t.s, r[1].id), SMTPE_VOIDED);
    assert_int_equal(smtpe_server_accept_id(t.s, r[1].id), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_accept_id(t.s, r[0].id), SMTPE_ERR_STATE);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    as_expect(&t, "");
    smtpe_server_stats st;
    smtpe_server_get_stats(t.s, &st);
    assert_int_equal(st.recipients, 0);
    as_close(&t);

    /* a RCPT not yet taken when its MAIL is refused is never handed out */
    as_open(&t, 8);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<spam@example.org>\r\nRCPT TO:<x@example.com>\r\nNOOP\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    (void)as_feed(&t); /* the RCPT event is ready, not taken */
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_EVENT);
    assert_int_equal(smtpe_server_reply_id(t.s, m.id, 550, "5.7.1", "Go away"), 0);
    assert_false(smtpe_server_want(t.s) & (SMTPE_WANT_EVENT | SMTPE_WANT_VERDICT));
    as_no_event(&t);
    as_expect(&t, "550 5.7.1 Go away\r\n503 5.5.1 Need MAIL command\r\n250 2.0.0 Ok\r\n");
    as_close(&t);
}

/* A RCPT that could pass max_recipients waits for the verdicts of those before it: if one of
 * them is refused it is handed out, else it gets 452 4.5.3 (as without pipelining). */
static void test_concurrent_recipient_limit(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r[3];
    for (int refuse = 0; refuse < 2; refuse++) {
        as_open(&t, 8);
        t.cfg.max_recipients = 2;
        as_reopen(&t);
        as_ehlo(&t);
        as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n"
                    "RCPT TO:<y@example.com>\r\nRCPT TO:<z@example.com>\r\nNOOP\r\n");
        m = as_event(&t, SMTPE_EV_MAIL);
        r[0] = as_event(&t, SMTPE_EV_RCPT);
        r[1] = as_event(&t, SMTPE_EV_RCPT);
        as_no_event(&t); /* the third RCPT waits */
        assert_int_equal(as_left(&t), strlen("NOOP\r\n"));
        if (refuse)
            assert_int_equal(smtpe_server_reply_id(t.s, r[0].id, 550, "5.1.1", "No such user"),
                             0);
        else
            assert_int_equal(smtpe_server_accept_id(t.s, r[0].id), 0);
        assert_int_equal(smtpe_server_accept_id(t.s, r[1].id), 0);
        assert_int_equal(smtpe_server_accept_id(t.s, m.id), 0);
        if (refuse) {
            as_expect(&t, "250 2.1.0 Ok\r\n550 5.1.1 No such user\r\n250 2.1.5 Ok\r\n");
            r[2] = as_event(&t, SMTPE_EV_RCPT);
            assert_true(span_is(r[2].rcpt.forward_path.mailbox, "z@example.com"));
            assert_int_equal(smtpe_server_accept_id(t.s, r[2].id), 0);
            as_no_event(&t);
            as_expect(&t, "250 2.1.5 Ok\r\n250 2.0.0 Ok\r\n");
        } else {
            as_no_event(&t);
            as_expect(&t, "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n"
                          "452 4.5.3 Too many recipients\r\n250 2.0.0 Ok\r\n");
        }
        as_close(&t);
    }
}

/* At most max_pending_verdicts commands are held: the engine reads no further until the oldest
 * reply goes out. */
static void test_concurrent_limit(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r[3];
    as_open(&t, 3);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n"
                "RCPT TO:<y@example.com>\r\n"
                "RCPT TO:<z@example.com>\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    r[0] = as_event(&t, SMTPE_EV_RCPT);
    r[1] = as_event(&t, SMTPE_EV_RCPT);
    as_no_event(&t); /* three held: the third RCPT stays in the host's buffer */
    assert_int_equal(as_left(&t), strlen("RCPT TO:<z@example.com>\r\n"));
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_READ);
    assert_int_equal(smtpe_server_accept_id(t.s, r[1].id), 0); /* held: frees nothing */
    as_no_event(&t);
    assert_int_equal(smtpe_server_accept_id(t.s, m.id), 0);
    as_expect(&t, "250 2.1.0 Ok\r\n");
    r[2] = as_event(&t, SMTPE_EV_RCPT);
    assert_int_equal(smtpe_server_accept_id(t.s, r[2].id), 0);
    assert_int_equal(smtpe_server_accept_id(t.s, r[0].id), 0);
    as_expect(&t, "250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n");
    as_close(&t);

    /* with the default of 1 a RCPT waits for the MAIL's verdict */
    as_open(&t, 1);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    as_no_event(&t);
    assert_int_equal(smtpe_server_accept_id(t.s, m.id), 0);
    (void)as_event(&t, SMTPE_EV_RCPT);
    as_close(&t);
}

/* A verdict given out of order is held in its command's line buffer: it may take one reply
 * line of 512 octets, not a long multi-line reply; the spans stay valid after the refusal. */
static void test_concurrent_held_reply_bound(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r;
    char text[1200];
    as_open(&t, 4);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    r = as_event(&t, SMTPE_EV_RCPT);
    memset(text, 'a', 400);
    text[400] = '\n';
    memset(text + 401, 'b', 400);
    text[801] = 0;
    assert_int_equal(smtpe_server_reply_id(t.s, r.id, 550, "5.1.1", text),
                     SMTPE_ERR_REPLY_TOO_LONG);
    assert_true(span_is(r.rcpt.forward_path.mailbox, "x@example.com"));
    memset(text, 'c', 400);
    text[400] = 0; /* one line: "550 5.1.1 " + 400 + CRLF = 412 octets, fits */
    assert_int_equal(smtpe_server_reply_id(t.s, r.id, 550, "5.1.1", text), 0);
    /* the head's reply has the same bound under concurrent verdicts */
    memset(text, 'd', 400);
    text[400] = '\n';
    memset(text + 401, 'e', 400);
    text[801] = 0;
    assert_int_equal(smtpe_server_reply_id(t.s, m.id, 250, "2.1.0", text),
                     SMTPE_ERR_REPLY_TOO_LONG);
    assert_int_equal(smtpe_server_accept_id(t.s, m.id), 0);
    as_take(&t);
    assert_int_equal(t.out.len, strlen("250 2.1.0 Ok\r\n") + 412);
    as_close(&t);
}

/* Errors count in reply order: the limit trips on the reply that is the (max_errors+1)th in
 * command order, not on the first verdict that comes. */
static void test_concurrent_error_order(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r;
    as_open(&t, 8);
    t.cfg.max_errors = 1;
    as_reopen(&t);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\nRCPT TO:x\r\n"
                "RCPT TO:y\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    r = as_event(&t, SMTPE_EV_RCPT);
    as_no_event(&t); /* two malformed RCPTs: their 501s wait */
    assert_int_equal(smtpe_server_accept_id(t.s, r.id), 0);
    assert_int_equal(smtpe_server_accept_id(t.s, m.id), 0);
    as_expect(&t, "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n501 5.5.2 Syntax: RCPT TO:<address>\r\n"
                  "421 4.7.0 mx.example Too many errors\r\n");
    smtpe_event e = as_event(&t, SMTPE_EV_ERROR_LIMIT);
    assert_int_equal(e.abandoned, 1);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    as_close(&t);
}

/* smtpe_server_close drops every verdict owed. */
static void test_concurrent_close(void **state)
{
    (void)state;
    as t;
    smtpe_event m, r;
    as_open(&t, 8);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n");
    m = as_event(&t, SMTPE_EV_MAIL);
    r = as_event(&t, SMTPE_EV_RCPT);
    assert_int_equal(smtpe_server_accept_id(t.s, r.id), 0);
    assert_int_equal(smtpe_server_close(t.s, 421, "4.3.2", "Shutting down"), 0);
    assert_int_equal(smtpe_server_accept_id(t.s, m.id), SMTPE_ERR_STATE);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    as_expect(&t, "421 4.3.2 Shutting down\r\n");
    as_close(&t);
}

/* The verdict calls without an id answer the oldest owed event, so a host that answers in
 * order needs no ids even with concurrent verdicts. */
static void test_concurrent_without_ids(void **state)
{
    (void)state;
    as t;
    as_open(&t, 8);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\n"
                "RCPT TO:<y@example.com>\r\n"
                "QUIT\r\n");
    (void)as_event(&t, SMTPE_EV_MAIL);
    (void)as_event(&t, SMTPE_EV_RCPT);
    (void)as_event(&t, SMTPE_EV_RCPT);
    as_no_event(&t); /* QUIT waits */
    assert_int_equal(smtpe_server_accept(t.s), 0);
    assert_int_equal(smtpe_server_reply(t.s, 550, NULL, NULL), 0);
    as_expect(&t, "250 2.1.0 Ok\r\n550 5.0.0 Rejected\r\n");
    assert_int_equal(smtpe_server_accept(t.s), 0);
    as_expect(&t, "250 2.1.5 Ok\r\n221 2.0.0 Bye\r\n");
    smtpe_event e = as_event(&t, SMTPE_EV_QUIT);
    assert_int_equal(e.abandoned, 1);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    as_close(&t);
}

/* ---- abandoned transactions -------------------------------------------------------------- */

static void test_abandoned(void **state)
{
    (void)state;
    as t;
    smtpe_event e;
    static const char *const enders[] = {"RSET\r\n", "EHLO again\r\n", "QUIT\r\n"};
    static const smtpe_event_type types[] = {SMTPE_EV_RSET, SMTPE_EV_HELO, SMTPE_EV_QUIT};
    for (int i = 0; i < 3; i++) {
        as_open(&t, 1);
        as_ehlo(&t);
        /* no transaction: nothing abandoned */
        as_send(&t, enders[i]);
        e = as_event(&t, types[i]);
        assert_int_equal(e.abandoned, 0);
        as_close(&t);

        as_open(&t, 1);
        as_ehlo(&t);
        as_send(&t, "MAIL FROM:<a@example.org>\r\n");
        (void)as_event(&t, SMTPE_EV_MAIL);
        assert_int_equal(smtpe_server_accept(t.s), 0);
        as_send(&t, enders[i]);
        e = as_event(&t, types[i]);
        assert_int_equal(e.abandoned, 1);
        as_close(&t);
    }
    /* a refused MAIL opens nothing */
    as_open(&t, 1);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRSET\r\n");
    (void)as_event(&t, SMTPE_EV_MAIL);
    assert_int_equal(smtpe_server_reply(t.s, 550, NULL, NULL), 0);
    e = as_event(&t, SMTPE_EV_RSET);
    assert_int_equal(e.abandoned, 0);
    as_close(&t);
    /* a timeout in the middle of the content */
    as_open(&t, 1);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\nDATA\r\n");
    for (int i = 0; i < 3; i++) {
        smtpe_event ev;
        (void)as_feed(&t);
        assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
        assert_int_equal(smtpe_server_accept(t.s), 0);
    }
    as_send(&t, "Subject: x\r\n");
    (void)as_event(&t, SMTPE_EV_DATA_CHUNK);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 10000000), 1);
    e = as_event(&t, SMTPE_EV_TIMEOUT);
    assert_int_equal(e.abandoned, 1);
    as_close(&t);
    /* after the end of the content nothing is open */
    as_open(&t, 1);
    as_ehlo(&t);
    as_send(&t, "MAIL FROM:<a@example.org>\r\nRCPT TO:<x@example.com>\r\nDATA\r\n.\r\nRSET\r\n");
    for (int i = 0; i < 4; i++) {
        smtpe_event ev;
        (void)as_feed(&t);
        assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
        assert_int_equal(smtpe_server_accept(t.s), 0);
    }
    e = as_event(&t, SMTPE_EV_RSET);
    assert_int_equal(e.abandoned, 0);
    as_close(&t);
}

/* ---- want flags -------------------------------------------------------------------------- */

static void test_want_truth(void **state)
{
    (void)state;
    as t;
    smtpe_event e;
    /* under NORMALISE a line ended by a bare CR is known at the next octet, not consumed:
     * recv returns 0 and want() says an event waits */
    as_open(&t, 1);
    t.cfg.line_ending = SMTPE_LINE_ENDING_NORMALISE;
    t.cfg.extensions |= SMTPE_EXT_STARTTLS;
    as_reopen(&t);
    as_take(&t); /* the greeting */
    hs_buf_reset(&t.out);
    as_send(&t, "VRFY x\r");
    assert_int_equal(as_feed(&t), 7);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_EVENT);
    as_send(&t, "N");
    assert_int_equal(as_feed(&t), 0);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_EVENT);
    e = as_event(&t, SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_WRITE);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_READ);
    as_send(&t, "OOP\r\nEHLO c\r\nSTARTTLS\r\nMAIL FROM:<a@b>\r\n");
    (void)as_feed(&t);
    e = as_event(&t, SMTPE_EV_HELO);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    e = as_event(&t, SMTPE_EV_STARTTLS);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    /* STARTTLS accepted with octets read: READ says feed them (they are discarded) */
    assert_int_equal(smtpe_server_want(t.s) & (SMTPE_WANT_TLS | SMTPE_WANT_READ),
                     SMTPE_WANT_TLS | SMTPE_WANT_READ);
    assert_int_equal(as_feed(&t), strlen("MAIL FROM:<a@b>\r\n"));
    as_take(&t);
    assert_int_equal(smtpe_server_tls_started(t.s, 0), 0);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_TLS);
    (void)e;
    as_close(&t);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_versioned_structs),
        cmocka_unit_test(test_config_copied),
        cmocka_unit_test(test_stable_output_held_across_verdicts),
        cmocka_unit_test(test_stable_output_random_acks),
        cmocka_unit_test(test_stable_output_two_runs),
        cmocka_unit_test(test_close_after_handing_out),
        cmocka_unit_test(test_close_always_closes),
        cmocka_unit_test(test_verdict_needs_taken_event),
        cmocka_unit_test(test_concurrent_reverse_order),
        cmocka_unit_test(test_concurrent_partial_release),
        cmocka_unit_test(test_concurrent_mail_refused),
        cmocka_unit_test(test_concurrent_recipient_limit),
        cmocka_unit_test(test_concurrent_limit),
        cmocka_unit_test(test_concurrent_held_reply_bound),
        cmocka_unit_test(test_concurrent_error_order),
        cmocka_unit_test(test_concurrent_close),
        cmocka_unit_test(test_concurrent_without_ids),
        cmocka_unit_test(test_abandoned),
        cmocka_unit_test(test_want_truth),
    };
    return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
