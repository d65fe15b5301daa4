/*
 * test_server.c - unit tests of the public server API (include/smtpe.h, engine/server.c):
 * greeting, deferred verdicts and RFC 2920 reply order, backpressure, fixed memory (caller memory,
 * custom allocators, no allocation after creation), timeouts, the error limit, smtpe_server_close,
 * argument checks of smtpe_server_reply, and split invariance of whole sessions (embedded inputs
 * and the input of every transcript in tests/transcripts).
 */
#include <dirent.h>
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

#ifndef SMTPE_TRANSCRIPT_DIR
#define SMTPE_TRANSCRIPT_DIR "tests/transcripts"
#endif

static const char *transcript_dir = SMTPE_TRANSCRIPT_DIR;

#define GREETING "220 mx.example ESMTP smtpe\r\n"
#define EHLO_REPLY                                                                             \
    "250-mx.example\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250-8BITMIME\r\n"                \
    "250-SMTPUTF8\r\n250 ENHANCEDSTATUSCODES\r\n"

/* ---- a step-by-step session on the raw API ------------------------------------------------ */
typedef struct ts {
    smtpe_server *s;
    smtpe_server_config cfg;
    hs_alloc alloc;
    smtpe_allocator hook;
    hs_buf out;     /* output taken and not yet checked */
    uint64_t now;
} ts;

static void ts_config(smtpe_server_config *cfg)
{
    smtpe_server_config_init(cfg);
    cfg->hostname = "mx.example";
}

static void ts_open_cfg(ts *t, uint64_t now)
{
    hs_alloc_init(&t->alloc);
    t->hook = hs_alloc_hook(&t->alloc);
    memset(&t->out, 0, sizeof t->out);
    t->now = now;
    assert_int_equal(smtpe_server_new(&t->s, &t->cfg, &t->hook, now), 0);
    assert_non_null(t->s);
    assert_int_equal(t->alloc.allocs, 1);
}

static void ts_open(ts *t)
{
    memset(t, 0, sizeof *t);
    ts_config(&t->cfg);
    ts_open_cfg(t, 0);
}

static void ts_close(ts *t)
{
    smtpe_server_free(t->s);
    assert_int_equal(t->alloc.allocs, 1);
    assert_int_equal(t->alloc.frees, 1);
    assert_ptr_equal(t->alloc.last_freed, t->alloc.last);
    hs_buf_free(&t->out);
}

/* Takes all output (send_buf + send_ack) into t->out. */
static void ts_take(ts *t)
{
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(t->s, &len);
    if (len) {
        assert_non_null(p);
        assert_true(len <= t->cfg.reply_buffer_size);
        hs_buf_add(&t->out, p, len);
        assert_int_equal(smtpe_server_send_ack(t->s, len), 0);
    }
    len = 1;
    smtpe_server_send_buf(t->s, &len);
    assert_int_equal(len, 0);
}

/* Compares the output taken since the last check with want. */
static void ts_expect(ts *t, const char *want)
{
    hs_buf msg = {0};
    ts_take(t);
    if (hs_output_differs(&t->out, want, &msg))
        fail_msg("%s", hs_buf_cstr(&msg));
    hs_buf_reset(&t->out);
}

static ssize_t ts_recv(ts *t, const char *s)
{
    return smtpe_server_recv(t->s, (const uint8_t *)s, strlen(s), t->now);
}

/* Feeds s, accepting every event that needs a verdict, until all of it is consumed. */
static void ts_feed_accept(ts *t, const char *s)
{
    size_t n = strlen(s), off = 0;
    for (int guard = 0; off < n; guard++) {
        assert_true(guard < 100000);
        ssize_t r = smtpe_server_recv(t->s, (const uint8_t *)s + off, n - off, t->now);
        assert_true(r >= 0);
        off += (size_t)r;
        smtpe_event ev;
        int events = 0;
        while (smtpe_server_next_event(t->s, &ev) == 1) {
            events++;
            if (smtpe_event_needs_reply(&ev))
                assert_int_equal(smtpe_server_accept(t->s), 0);
        }
        if (r == 0 && events == 0) {
            size_t len = 0;
            smtpe_server_send_buf(t->s, &len);
            assert_true(len > 0); /* otherwise stuck */
            ts_take(t);
        }
    }
}

static int span_is(smtpe_span sp, const char *s)
{
    size_t n = strlen(s);
    return sp.len == n && (n == 0 || memcmp(sp.ptr, s, n) == 0);
}

/* ---- configuration ----------------------------------------------------------------------- */

static void test_config_defaults(void **state)
{
    (void)state;
    smtpe_server_config c;
    memset(&c, 0x5a, sizeof c);
    smtpe_server_config_init(&c);
    assert_non_null(c.hostname);
    assert_string_equal(c.hostname, "localhost");
    assert_non_null(c.greeting_text);
    assert_string_equal(c.greeting_text, "ESMTP smtpe");
    assert_int_equal(c.extensions, SMTPE_EXT_DEFAULT);
    assert_int_equal(c.ehlo_extra_count, 0);
    assert_int_equal(c.max_message_size, 10485760);
    assert_int_equal(c.max_line_length, 512);
    assert_int_equal(c.max_recipients, 100);
    assert_int_equal(c.max_errors, 20);
    assert_int_equal(c.command_timeout_ms, 300000);
    assert_int_equal(c.data_timeout_ms, 180000);
    assert_int_equal(c.line_ending, SMTPE_LINE_ENDING_REFUSE);
    assert_int_equal(c.lax_angle_brackets, 0);
    assert_int_equal(c.reply_buffer_size, 4096);

    /* the default config makes a working session greeting as "localhost" */
    smtpe_server *s = NULL;
    assert_int_equal(smtpe_server_new(&s, &c, NULL, 0), 0);
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(s, &len);
    assert_int_equal(len, strlen("220 localhost ESMTP smtpe\r\n"));
    assert_memory_equal(p, "220 localhost ESMTP smtpe\r\n", len);
    smtpe_server_free(s);
}

static void test_memory_size(void **state)
{
    (void)state;
    smtpe_server_config c;
    ts_config(&c);
    size_t base = smtpe_server_memory_size(&c);
    assert_true(base >= c.max_line_length + c.reply_buffer_size);
    c.reply_buffer_size = 8192;
    assert_true(smtpe_server_memory_size(&c) >= base + 4096);
    c.reply_buffer_size = 4096;
    c.max_line_length = 1512;
    assert_true(smtpe_server_memory_size(&c) >= base + 1000);
    /* does not depend on limits that need no memory */
    ts_config(&c);
    c.max_message_size = 0;
    c.max_recipients = 5;
    c.max_errors = 0;
    c.command_timeout_ms = 0;
    assert_int_equal(smtpe_server_memory_size(&c), base);
}

static void test_config_errors(void **state)
{
    (void)state;
    static char longname[300], longextra[200];
    memset(longname, 'h', 256);
    longname[256] = 0;
    memset(longextra, 'X', 121);
    longextra[121] = 0;
    static const char *extra_ptr[1] = {longextra};
    for (int i = 0; i < 11; i++) {
        smtpe_server_config c;
        ts_config(&c);
        switch (i) {
        case 0: c.max_line_length = 511; break;
        case 1: c.max_line_length = 65537; break;
        case 2: c.reply_buffer_size = 2047; break;
        case 3: c.reply_buffer_size = 1048577; break;
        case 4: c.hostname = longname; break;
        case 5: c.ehlo_extra = extra_ptr; c.ehlo_extra_count = 1; break;
        case 6: c.max_line_length = 0; break;
        case 7: c.ehlo_extra = NULL; c.ehlo_extra_count = 1; break; /* inconsistent */
        case 8: c.max_pending_verdicts = 0; break;
        case 9: c.max_pending_verdicts = 1025; break;
        case 10: c.lmtp = 1; c.max_recipients = 100001; break; /* its reply room */
        }
        if (smtpe_server_memory_size(&c) != 0)
            fail_msg("invalid config %d: smtpe_server_memory_size is not 0", i);
        smtpe_server *s = NULL;
        hs_alloc a;
        hs_alloc_init(&a);
        smtpe_allocator hook = hs_alloc_hook(&a);
        int rc = smtpe_server_new(&s, &c, &hook, 0);
        if (rc != SMTPE_ERR_CONFIG)
            fail_msg("invalid config %d: smtpe_server_new returned %d, expected %d", i, rc,
                     SMTPE_ERR_CONFIG);
        assert_int_equal(a.allocs, 0);
        static uint8_t mem[4 << 20];
        rc = smtpe_server_init(&s, mem, sizeof mem, &c, 0);
        if (rc != SMTPE_ERR_CONFIG)
            fail_msg("invalid config %d: smtpe_server_init returned %d", i, rc);
    }
    /* the range ends are valid */
    for (int i = 0; i < 5; i++) {
        smtpe_server_config c;
        ts_config(&c);
        switch (i) {
        case 0: c.max_line_length = 512; break;
        case 1: c.max_line_length = 65536; break;
        case 2: c.reply_buffer_size = 2048; break;
        case 3: c.reply_buffer_size = 1048576; break;
        case 4: memset(longname, 'h', 255); longname[255] = 0; c.hostname = longname; break;
        }
        smtpe_server *s = NULL;
        assert_true(smtpe_server_memory_size(&c) > 0);
        assert_int_equal(smtpe_server_new(&s, &c, NULL, 0), 0);
        smtpe_server_free(s);
    }
}

static void test_argument_errors(void **state)
{
    (void)state;
    smtpe_server_config c;
    ts_config(&c);
    smtpe_server *s = NULL;
    assert_int_equal(smtpe_server_new(NULL, &c, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_new(&s, NULL, NULL, 0), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_init(&s, NULL, 100000, &c, 0), SMTPE_ERR_INVALID_ARGUMENT);
    smtpe_server_free(NULL);
    /* strerror */
    static const int codes[] = {SMTPE_ERR_INVALID_ARGUMENT, SMTPE_ERR_STATE,
                                SMTPE_ERR_REPLY_TOO_LONG,   SMTPE_ERR_BUFFER_TOO_SMALL,
                                SMTPE_ERR_NOMEM,            SMTPE_ERR_CONFIG};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *m = smtpe_strerror(codes[i]);
        assert_non_null(m);
        assert_true(strlen(m) > 0);
        assert_string_not_equal(m, "unknown error");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(m, smtpe_strerror(codes[j]));
    }
    assert_string_equal(smtpe_strerror(12345), "unknown error");
    assert_string_equal(smtpe_strerror(-1), "unknown error");
    assert_true(SMTPE_ERR_NOMEM <= SMTPE_ERR_FATAL && SMTPE_ERR_CONFIG <= SMTPE_ERR_FATAL);
    assert_true(SMTPE_ERR_STATE > SMTPE_ERR_FATAL);
}

static void test_needs_reply(void **state)
{
    (void)state;
    static const struct {
        smtpe_event_type type;
        int want;
    } table[] = {{SMTPE_EV_NONE, 0},   {SMTPE_EV_HELO, 1},       {SMTPE_EV_MAIL, 1},
                 {SMTPE_EV_RCPT, 1},   {SMTPE_EV_DATA, 1},       {SMTPE_EV_DATA_CHUNK, 0},
                 {SMTPE_EV_RSET, 0},   {SMTPE_EV_VRFY, 1},       {SMTPE_EV_EXPN, 1},
                 {SMTPE_EV_UNKNOWN, 1}, {SMTPE_EV_QUIT, 0},      {SMTPE_EV_TIMEOUT, 0},
                 {SMTPE_EV_ERROR_LIMIT, 0}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        smtpe_event ev;
        memset(&ev, 0, sizeof ev);
        ev.type = table[i].type;
        if (smtpe_event_needs_reply(&ev) != table[i].want)
            fail_msg("smtpe_event_needs_reply(type %d) != %d", (int)table[i].type,
                     table[i].want);
    }
    smtpe_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = SMTPE_EV_DATA_END;
    ev.data_end.status = SMTPE_DATA_OK;
    assert_int_equal(smtpe_event_needs_reply(&ev), 1);
    ev.data_end.status = SMTPE_DATA_TOO_BIG;
    assert_int_equal(smtpe_event_needs_reply(&ev), 0);
    ev.data_end.status = SMTPE_DATA_BAD_LINE_ENDING;
    assert_int_equal(smtpe_event_needs_reply(&ev), 0);
}

/* ---- greeting and output ----------------------------------------------------------------- */

static void test_greeting(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    unsigned want = smtpe_server_want(t.s);
    assert_true(want & SMTPE_WANT_WRITE);
    assert_false(want & SMTPE_WANT_CLOSE);
    assert_false(want & SMTPE_WANT_VERDICT);
    assert_false(want & SMTPE_WANT_EVENT);
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 0);

    /* partial acknowledgements */
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(t.s, &len);
    assert_int_equal(len, strlen(GREETING));
    assert_memory_equal(p, GREETING, len);
    assert_int_equal(smtpe_server_send_ack(t.s, len + 1), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_send_ack(t.s, 0), 0);
    assert_int_equal(smtpe_server_send_ack(t.s, 4), 0);
    p = smtpe_server_send_buf(t.s, &len);
    assert_int_equal(len, strlen(GREETING) - 4);
    assert_memory_equal(p, &GREETING[4], len);
    assert_int_equal(smtpe_server_send_ack(t.s, len), 0);
    smtpe_server_send_buf(t.s, &len);
    assert_int_equal(len, 0);
    want = smtpe_server_want(t.s);
    assert_false(want & SMTPE_WANT_WRITE);
    assert_true(want & SMTPE_WANT_READ);
    assert_int_equal(smtpe_server_send_ack(t.s, 1), SMTPE_ERR_INVALID_ARGUMENT);
    ts_close(&t);

    /* greeting text and hostname from the config */
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.hostname = "smtp.example.net";
    t.cfg.greeting_text = "Service ready";
    ts_open_cfg(&t, 0);
    ts_expect(&t, "220 smtp.example.net Service ready\r\n");
    ts_close(&t);
}

/* ---- memory ------------------------------------------------------------------------------ */

static const char *session_plain =
    "EHLO client.example\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\n"
    "RCPT TO:<v@example.com>\r\nDATA\r\nSubject: hi\r\n\r\n..dot\r\nbody\r\n.\r\nNOOP\r\nQUIT\r\n";

static const char *session_plain_out =
    GREETING EHLO_REPLY "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n250 2.1.5 Ok\r\n"
    "354 End data with <CR><LF>.<CR><LF>\r\n250 2.0.0 Ok\r\n250 2.0.0 Ok\r\n221 2.0.0 Bye\r\n";

static void test_allocator(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    assert_int_equal(t.alloc.allocs, 1);
    assert_int_equal(t.alloc.bytes, smtpe_server_memory_size(&t.cfg));
    ts_feed_accept(&t, session_plain);
    ts_expect(&t, session_plain_out);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(t.alloc.allocs, 1);
    assert_int_equal(t.alloc.frees, 0);
    ts_close(&t); /* checks one free of the one block */

    /* an allocator that fails */
    smtpe_server_config c;
    ts_config(&c);
    hs_alloc a;
    hs_alloc_init(&a);
    a.fail_from = 1;
    smtpe_allocator hook = hs_alloc_hook(&a);
    smtpe_server *s = NULL;
    assert_int_equal(smtpe_server_new(&s, &c, &hook, 0), SMTPE_ERR_NOMEM);
    assert_int_equal(a.attempts, 1);
    assert_int_equal(a.frees, 0);

    /* a hook without functions means malloc/free */
    smtpe_allocator empty = {NULL, NULL, NULL};
    s = NULL;
    assert_int_equal(smtpe_server_new(&s, &c, &empty, 0), 0);
    assert_non_null(s);
    smtpe_server_free(s);

    /* many sessions from one config, each one allocation */
    ts many[8];
    for (int i = 0; i < 8; i++) {
        memset(&many[i], 0, sizeof many[i]);
        ts_config(&many[i].cfg);
        ts_open_cfg(&many[i], (uint64_t)i);
    }
    for (int i = 0; i < 8; i++) {
        ts_feed_accept(&many[i], session_plain);
        ts_expect(&many[i], session_plain_out);
    }
    for (int i = 0; i < 8; i++)
        ts_close(&many[i]);
}

/* Feeds everything, accepting every verdict, on a session made anywhere. */
static void run_accept_all(smtpe_server *s, const uint8_t *in, size_t n, hs_buf *out)
{
    size_t off = 0;
    for (int guard = 0; guard < 100000; guard++) {
        smtpe_event ev;
        while (smtpe_server_next_event(s, &ev) == 1)
            if (smtpe_event_needs_reply(&ev))
                assert_int_equal(smtpe_server_accept(s), 0);
        size_t len = 0;
        const uint8_t *p = smtpe_server_send_buf(s, &len);
        if (len) {
            hs_buf_add(out, p, len);
            assert_int_equal(smtpe_server_send_ack(s, len), 0);
        }
        if (off == n)
            break;
        ssize_t r = smtpe_server_recv(s, in + off, n - off, 0);
        assert_true(r >= 0);
        off += (size_t)r;
        if (r == 0 && (smtpe_server_want(s) & SMTPE_WANT_CLOSE))
            break;
    }
}

static void test_init_caller_memory(void **state)
{
    (void)state;
    smtpe_server_config c;
    ts_config(&c);
    size_t need = smtpe_server_memory_size(&c);
    assert_true(need > 0);
    uint8_t *mem = malloc(need + 256);
    assert_non_null(mem);
    memset(mem, 0xa5, need + 256);
    smtpe_server *s = NULL;
    assert_int_equal(smtpe_server_init(&s, mem, need - 1, &c, 0), SMTPE_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(smtpe_server_init(&s, mem, 0, &c, 0), SMTPE_ERR_BUFFER_TOO_SMALL);
    memset(mem, 0xa5, need + 256);
    assert_int_equal(smtpe_server_init(&s, mem, need, &c, 0), 0);
    assert_non_null(s);
    hs_buf out = {0};
    run_accept_all(s, (const uint8_t *)session_plain, strlen(session_plain), &out);
    assert_int_equal(out.len, strlen(session_plain_out));
    assert_memory_equal(out.p, session_plain_out, out.len);
    for (size_t i = need; i < need + 256; i++)
        if (mem[i] != 0xa5)
            fail_msg("the session wrote past its %zu octets (at %zu)", need, i);
    hs_buf_free(&out);
    /* more memory than needed is fine too */
    memset(mem, 0x00, need + 256);
    assert_int_equal(smtpe_server_init(&s, mem, need + 256, &c, 0), 0);
    run_accept_all(s, (const uint8_t *)session_plain, strlen(session_plain), &out);
    assert_int_equal(out.len, strlen(session_plain_out));
    assert_memory_equal(out.p, session_plain_out, out.len);
    hs_buf_free(&out);
    free(mem);
}

/* ---- deferred verdicts and RFC 2920 order ------------------------------------------------- */

static void test_deferred_verdicts(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    ts_expect(&t, GREETING);
    const char *in = "EHLO c.example\r\nMAIL FROM:<a@example.org>\r\nNOOP\r\n"
                     "RCPT TO:<b@example.com>\r\nRCPT TO:<c@example.com>\r\n";
    size_t n = strlen(in), off = 0;
    ssize_t r = smtpe_server_recv(t.s, (const uint8_t *)in, n, t.now);
    assert_int_equal(r, strlen("EHLO c.example\r\n"));
    off += (size_t)r;
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_EVENT);
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_HELO);
    assert_int_equal(ev.helo.esmtp, 1);
    assert_true(span_is(ev.helo.domain, "c.example"));
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_READ);

    /* while the verdict is pending: nothing consumed, no event, no output, no timer */
    for (int i = 0; i < 5; i++) {
        t.now += 3600000; /* hours pass */
        assert_int_equal(smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now), 0);
        assert_int_equal(smtpe_server_recv(t.s, (const uint8_t *)in + off, 1, t.now), 0);
        assert_int_equal(smtpe_server_next_event(t.s, &ev), 0);
        assert_int_equal(smtpe_server_expiry(t.s, t.now), UINT64_MAX);
        assert_int_equal(smtpe_server_handle_expiry(t.s, t.now), 0);
        ts_expect(&t, "");
    }
    /* the domain span stays valid until the verdict */
    assert_true(span_is(ev.helo.domain, "c.example"));
    assert_int_equal(smtpe_server_accept(t.s), 0);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    ts_expect(&t, EHLO_REPLY);

    r = smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now);
    assert_int_equal(r, strlen("MAIL FROM:<a@example.org>\r\n"));
    off += (size_t)r;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_MAIL);
    assert_true(span_is(ev.mail.reverse_path.mailbox, "a@example.org"));
    assert_int_equal(smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now), 0);
    t.now += 86400000;
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.1.0", "Sender ok"), 0);

    /* NOOP is answered by the engine, then RCPT waits */
    r = smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now);
    assert_int_equal(r, strlen("NOOP\r\nRCPT TO:<b@example.com>\r\n"));
    off += (size_t)r;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_RCPT);
    assert_true(span_is(ev.rcpt.forward_path.mailbox, "b@example.com"));
    ts_expect(&t, "250 2.1.0 Sender ok\r\n250 2.0.0 Ok\r\n");
    assert_int_equal(smtpe_server_reply(t.s, 550, "5.1.1", "No such user"), 0);
    r = smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now);
    assert_int_equal((size_t)r, n - off);
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_RCPT);
    assert_true(span_is(ev.rcpt.forward_path.mailbox, "c@example.com"));
    assert_int_equal(smtpe_server_accept(t.s), 0);
    ts_expect(&t, "550 5.1.1 No such user\r\n250 2.1.5 Ok\r\n");
    /* the timer runs again */
    assert_true(smtpe_server_expiry(t.s, t.now) != UINT64_MAX);
    ts_close(&t);
}

/* The whole pipelined group in one buffer; verdicts given only after the host has tried to feed
 * the rest several times; the replies come out in command order (RFC 2920 §3.1). */
static void test_pipelined_order(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    const char *in = "EHLO c.example\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<bad@example.com>\r\n"
                     "VRFY someone\r\nRCPT TO:<c@example.com>\r\nNOOP\r\nFOO bar\r\nDATA\r\n"
                     "hello\r\n.\r\nRSET\r\nHELP\r\nQUIT\r\n";
    size_t n = strlen(in), off = 0;
    int events = 0;
    smtpe_event_type types[32];
    for (int guard = 0; off < n && guard < 1000; guard++) {
        ssize_t r = smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now);
        assert_true(r >= 0);
        off += (size_t)r;
        smtpe_event ev;
        while (smtpe_server_next_event(t.s, &ev) == 1) {
            assert_true(events < 32);
            types[events++] = ev.type;
            if (!smtpe_event_needs_reply(&ev))
                continue;
            /* the host tries to feed more before deciding */
            for (int k = 0; k < 3; k++)
                assert_int_equal(
                    smtpe_server_recv(t.s, (const uint8_t *)in + off, n - off, t.now), 0);
            if (ev.type == SMTPE_EV_RCPT && span_is(ev.rcpt.forward_path.local_part, "bad"))
                assert_int_equal(smtpe_server_reply(t.s, 550, "5.1.1", "No such user"), 0);
            else
                assert_int_equal(smtpe_server_accept(t.s), 0);
        }
    }
    assert_int_equal(off, n);
    ts_expect(&t, GREETING EHLO_REPLY "250 2.1.0 Ok\r\n550 5.1.1 No such user\r\n"
                  "252 2.5.0 Cannot VRFY user, but will accept message and attempt delivery\r\n"
                  "250 2.1.5 Ok\r\n250 2.0.0 Ok\r\n500 5.5.1 Command unrecognized\r\n"
                  "354 End data with <CR><LF>.<CR><LF>\r\n250 2.0.0 Ok\r\n250 2.0.0 Ok\r\n"
                  "214 2.0.0 Commands: EHLO HELO MAIL RCPT DATA RSET NOOP QUIT VRFY EXPN HELP\r\n"
                  "221 2.0.0 Bye\r\n");
    static const smtpe_event_type want[] = {
        SMTPE_EV_HELO, SMTPE_EV_MAIL,       SMTPE_EV_RCPT,     SMTPE_EV_VRFY,
        SMTPE_EV_RCPT, SMTPE_EV_UNKNOWN,    SMTPE_EV_DATA,     SMTPE_EV_DATA_CHUNK,
        SMTPE_EV_DATA_END, SMTPE_EV_RSET,   SMTPE_EV_QUIT};
    /* DATA_CHUNK may come in several pieces: compare with chunks coalesced */
    smtpe_event_type got[32];
    int ng = 0;
    for (int i = 0; i < events; i++)
        if (!(ng > 0 && types[i] == SMTPE_EV_DATA_CHUNK && got[ng - 1] == SMTPE_EV_DATA_CHUNK))
            got[ng++] = types[i];
    assert_int_equal(ng, sizeof want / sizeof want[0]);
    for (int i = 0; i < ng; i++)
        assert_int_equal(got[i], want[i]);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    ts_close(&t);
}

/* ---- backpressure ------------------------------------------------------------------------ */

static void test_backpressure(void **state)
{
    (void)state;
    ts t;
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.reply_buffer_size = 2048;
    ts_open_cfg(&t, 0);
    const size_t count = 5000;
    hs_buf in = {0};
    for (size_t i = 0; i < count; i++)
        hs_buf_adds(&in, "NOOP\r\n");
    /* the host never takes output */
    size_t off = 0;
    int zeros = 0;
    for (int guard = 0; guard < 100000 && zeros < 10; guard++) {
        ssize_t r = smtpe_server_recv(t.s, in.p + off, in.len - off, t.now);
        assert_true(r >= 0);
        if (r == 0)
            zeros++;
        off += (size_t)r;
    }
    assert_true(off < in.len);
    assert_int_equal(off % 6, 0);
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(t.s, &len);
    assert_true(len <= 2048);
    /* everything consumed has been answered: greeting + one 250 per NOOP */
    size_t answered = (len - strlen(GREETING)) / strlen("250 2.0.0 Ok\r\n");
    assert_int_equal(len, strlen(GREETING) + answered * strlen("250 2.0.0 Ok\r\n"));
    assert_int_equal(answered, off / 6);
    assert_memory_equal(p, GREETING, strlen(GREETING));
    unsigned want = smtpe_server_want(t.s);
    assert_true(want & SMTPE_WANT_WRITE);
    assert_false(want & SMTPE_WANT_READ);
    assert_int_equal(t.alloc.allocs, 1);

    /* the host sends a little at a time; all input is eventually answered */
    hs_buf all = {0};
    hs_buf_add(&all, p, 7);
    assert_int_equal(smtpe_server_send_ack(t.s, 7), 0);
    for (int guard = 0; guard < 1000000 && off < in.len; guard++) {
        ssize_t r = smtpe_server_recv(t.s, in.p + off, in.len - off, t.now);
        assert_true(r >= 0);
        off += (size_t)r;
        p = smtpe_server_send_buf(t.s, &len);
        size_t k = len < 100 ? len : 100;
        hs_buf_add(&all, p, k);
        assert_int_equal(smtpe_server_send_ack(t.s, k), 0);
    }
    p = smtpe_server_send_buf(t.s, &len);
    hs_buf_add(&all, p, len);
    assert_int_equal(smtpe_server_send_ack(t.s, len), 0);
    assert_int_equal(off, in.len);
    assert_int_equal(all.len, strlen(GREETING) + count * strlen("250 2.0.0 Ok\r\n"));
    assert_int_equal(t.alloc.allocs, 1);
    hs_buf_free(&in);
    hs_buf_free(&all);
    ts_close(&t);
}

/* ---- timeouts ---------------------------------------------------------------------------- */

static void test_command_timeout(void **state)
{
    (void)state;
    ts t;
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    ts_open_cfg(&t, 1000);
    ts_expect(&t, GREETING);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), 301000);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 300999), 0);
    ts_expect(&t, "");
    /* a partial line does not restart the timer (a client dripping one octet at a time
     * still gets command_timeout_ms for the whole line); a complete line does */
    t.now = 2000;
    assert_int_equal(ts_recv(&t, "NOO"), 3);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), 301000);
    t.now = 3000;
    assert_int_equal(ts_recv(&t, "P\r\n"), 3);
    ts_expect(&t, "250 2.0.0 Ok\r\n");
    assert_int_equal(smtpe_server_expiry(t.s, t.now), 303000);
    t.now = 4000;
    assert_int_equal(ts_recv(&t, "NOO"), 3);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), 303000);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 302999), 0);
    ts_expect(&t, "");
    assert_int_equal(smtpe_server_handle_expiry(t.s, 303000), 1);
    ts_expect(&t, "421 4.4.2 mx.example Timeout exceeded\r\n");
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_TIMEOUT);
    assert_false(smtpe_event_needs_reply(&ev));
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 0);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), UINT64_MAX);
    assert_int_equal(ts_recv(&t, "P\r\n"), 0);
    ts_expect(&t, "");
    ts_close(&t);

    /* a late handle_expiry still expires */
    ts_open(&t);
    ts_expect(&t, GREETING);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 999999999), 1);
    ts_expect(&t, "421 4.4.2 mx.example Timeout exceeded\r\n");
    ts_close(&t);

    /* 0: no timeout */
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.command_timeout_ms = 0;
    ts_open_cfg(&t, 0);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), UINT64_MAX);
    assert_int_equal(smtpe_server_handle_expiry(t.s, UINT64_MAX - 1), 0);
    ts_expect(&t, GREETING);
    ts_close(&t);

    /* no enhanced codes */
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.extensions &= ~SMTPE_EXT_ENHANCEDSTATUSCODES;
    t.cfg.command_timeout_ms = 600000;
    ts_open_cfg(&t, 5);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), 600005);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 600005), 1);
    ts_expect(&t, GREETING "421 mx.example Timeout exceeded\r\n");
    ts_close(&t);
}

/* A verdict that comes later than the command timeout must not time the session out: the
 * server awaits the next command only once its reply is out (RFC 5321 §4.5.3.2.7). The host
 * learns the deadline from smtpe_server_expiry, which restarts the timer from the clock it is
 * given after a verdict (no handle_expiry "now" step, no deadline in the past); the session
 * still times out one command timeout later. */
static void test_timer_after_late_verdict(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    ts_expect(&t, GREETING);
    assert_int_equal(ts_recv(&t, "EHLO c.example\r\n"), 16);
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), UINT64_MAX);
    const uint64_t T = 400000; /* the verdict comes after more than the 300000 ms timeout */
    assert_int_equal(smtpe_server_accept(t.s), 0);
    ts_expect(&t, EHLO_REPLY);
    assert_int_equal(smtpe_server_expiry(t.s, T), T + 300000);
    assert_int_equal(smtpe_server_expiry(t.s, T + 5), T + 300000); /* restarted once */
    assert_int_equal(smtpe_server_handle_expiry(t.s, T + 299999), 0);
    ts_expect(&t, "");
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(smtpe_server_handle_expiry(t.s, T + 300000), 1);
    ts_expect(&t, "421 4.4.2 mx.example Timeout exceeded\r\n");
    ts_close(&t);

    /* a host that calls handle_expiry first gets the same restart */
    ts_open(&t);
    ts_expect(&t, GREETING);
    assert_int_equal(ts_recv(&t, "NOOP\r\nVRFY u\r\n"), 14);
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    assert_int_equal(smtpe_server_handle_expiry(t.s, T), 0);
    assert_int_equal(smtpe_server_expiry(t.s, T + 7), T + 300000);
    ts_close(&t);
}

static void test_data_timeout(void **state)
{
    (void)state;
    ts t;
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.data_timeout_ms = 180000;
    t.cfg.command_timeout_ms = 300000;
    ts_open_cfg(&t, 0);
    ts_feed_accept(&t, "EHLO c.example\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\n"
                       "DATA\r\n");
    ts_expect(&t, GREETING EHLO_REPLY "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n"
                  "354 End data with <CR><LF>.<CR><LF>\r\n");
    t.now = 5000;
    const char *part = "Subject: x\r\n\r\npartial";
    size_t off = 0;
    hs_buf content = {0};
    while (off < strlen(part)) {
        ssize_t r = smtpe_server_recv(t.s, (const uint8_t *)part + off, strlen(part) - off, t.now);
        assert_true(r >= 0);
        off += (size_t)r;
        smtpe_event ev;
        while (smtpe_server_next_event(t.s, &ev) == 1) {
            assert_int_equal(ev.type, SMTPE_EV_DATA_CHUNK);
            hs_buf_add(&content, ev.chunk.ptr, ev.chunk.len);
        }
    }
    assert_int_equal(smtpe_server_expiry(t.s, t.now), 185000);
    assert_int_equal(smtpe_server_handle_expiry(t.s, 184999), 0);
    ts_expect(&t, "");
    assert_int_equal(smtpe_server_handle_expiry(t.s, 185000), 1);
    ts_expect(&t, "421 4.4.2 mx.example Timeout exceeded\r\n");
    smtpe_event ev;
    int saw_timeout = 0;
    while (smtpe_server_next_event(t.s, &ev) == 1) {
        if (ev.type == SMTPE_EV_DATA_CHUNK) {
            hs_buf_add(&content, ev.chunk.ptr, ev.chunk.len);
            continue;
        }
        assert_int_equal(ev.type, SMTPE_EV_TIMEOUT);
        saw_timeout = 1;
    }
    assert_true(saw_timeout);
    /* what was handed out is a prefix of the content */
    assert_true(content.len <= strlen(part));
    assert_memory_equal(content.p, part, content.len);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    hs_buf_free(&content);
    ts_close(&t);
}

/* ---- error limit ------------------------------------------------------------------------- */

static void test_error_limit(void **state)
{
    (void)state;
    ts t;
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.max_errors = 2;
    ts_open_cfg(&t, 0);
    ts_feed_accept(&t, "MAIL FROM:<a@example.org>\r\nFOO\r\n");
    ts_expect(&t, GREETING "503 5.5.1 Send HELO or EHLO first\r\n500 5.5.1 Command unrecognized\r\n");
    smtpe_server_stats st;
    smtpe_server_get_stats(t.s, &st);
    assert_int_equal(st.errors, 2);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    ssize_t r = ts_recv(&t, "HELO\r\nNOOP\r\n");
    assert_int_equal(r, 6);
    ts_expect(&t, "421 4.7.0 mx.example Too many errors\r\n");
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_ERROR_LIMIT);
    assert_false(smtpe_event_needs_reply(&ev));
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(ts_recv(&t, "NOOP\r\n"), 0);
    ts_close(&t);

    /* 0: no limit */
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.max_errors = 0;
    ts_open_cfg(&t, 0);
    ts_take(&t);
    hs_buf_reset(&t.out);
    for (int i = 0; i < 200; i++)
        ts_feed_accept(&t, "RCPT\r\n");
    ts_take(&t);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    for (size_t i = 0; i + 4 <= t.out.len; i++)
        if (memcmp(t.out.p + i, "421 ", 4) == 0)
            fail_msg("a 421 reply without an error limit");
    hs_buf_reset(&t.out);
    ts_close(&t);
}

/* ---- smtpe_server_close ------------------------------------------------------------------ */

static void test_close(void **state)
{
    (void)state;
    ts t;
    /* before anything is sent the reply replaces the greeting */
    ts_open(&t);
    assert_int_equal(smtpe_server_close(t.s, 421, "4.7.0", "Too busy, try later"), 0);
    ts_expect(&t, "421 4.7.0 Too busy, try later\r\n");
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(smtpe_server_close(t.s, 421, NULL, NULL), SMTPE_ERR_STATE);
    assert_int_equal(ts_recv(&t, "EHLO x\r\n"), 0);
    ts_expect(&t, "");
    ts_close(&t);

    /* NULL enhanced code and text: defaults */
    ts_open(&t);
    assert_int_equal(smtpe_server_close(t.s, 554, NULL, NULL), 0);
    ts_expect(&t, "554 5.0.0 Rejected\r\n");
    ts_close(&t);
    ts_open(&t);
    assert_int_equal(smtpe_server_close(t.s, 421, NULL, NULL), 0);
    ts_expect(&t, "421 4.0.0 Try again later\r\n");
    ts_close(&t);

    /* part of the greeting sent: it is completed, then the reply */
    ts_open(&t);
    size_t len;
    smtpe_server_send_buf(t.s, &len);
    assert_int_equal(smtpe_server_send_ack(t.s, 5), 0);
    assert_int_equal(smtpe_server_close(t.s, 421, "4.3.2", "Shutting down"), 0);
    ts_expect(&t, &(GREETING "421 4.3.2 Shutting down\r\n")[5]);
    ts_close(&t);

    /* bad codes */
    ts_open(&t);
    assert_int_equal(smtpe_server_close(t.s, 250, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_close(t.s, 450, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_close(t.s, 600, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_close(t.s, 421, "5.0.0", NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_close(t.s, 421, NULL, "a\r\nb"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    ts_expect(&t, GREETING);
    /* during a pending verdict: the verdict is dropped */
    assert_int_equal(ts_recv(&t, "EHLO x\r\n"), 8);
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(smtpe_server_close(t.s, 421, "4.3.2", "Shutting down"), 0);
    assert_int_equal(smtpe_server_accept(t.s), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), SMTPE_ERR_STATE);
    ts_expect(&t, "421 4.3.2 Shutting down\r\n");
    assert_false(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(smtpe_server_expiry(t.s, t.now), UINT64_MAX);
    ts_close(&t);

    /* a 221 close */
    ts_open(&t);
    ts_expect(&t, GREETING);
    assert_int_equal(smtpe_server_close(t.s, 221, "2.0.0", "Closing"), 0);
    ts_expect(&t, "221 2.0.0 Closing\r\n");
    ts_close(&t);
}

/* ---- smtpe_server_reply argument checks --------------------------------------------------- */

static void take_event(ts *t, const char *line, smtpe_event_type type)
{
    ssize_t r = ts_recv(t, line);
    assert_int_equal(r, strlen(line));
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t->s, &ev), 1);
    assert_int_equal(ev.type, type);
}

static void test_reply_arguments(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    ts_expect(&t, GREETING);
    /* no event waits */
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_accept(t.s), SMTPE_ERR_STATE);

    take_event(&t, "EHLO client.example\r\n", SMTPE_EV_HELO);
    static char longline[500], toolong[3000];
    memset(longline, 'x', 401);
    longline[401] = 0;
    memset(toolong, 'y', 2100);
    for (int i = 300; i < 2100; i += 300)
        toolong[i] = '\n';
    toolong[2100] = 0;
    assert_int_equal(smtpe_server_reply(t.s, 199, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 600, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 0, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 1000, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, "5.1.1", "x"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 550, "2.0.0", "x"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.1", "x"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, "", "x"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, "a\rb"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, "a\r\nb"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, "a\x01" "b"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, longline), SMTPE_ERR_REPLY_TOO_LONG);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, toolong), SMTPE_ERR_REPLY_TOO_LONG);
    /* failed calls changed nothing: the event still waits */
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_VERDICT);
    ts_expect(&t, "");
    assert_int_equal(smtpe_server_accept(t.s), 0);
    ts_expect(&t, EHLO_REPLY);
    assert_int_equal(smtpe_server_accept(t.s), SMTPE_ERR_STATE);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), SMTPE_ERR_STATE);

    take_event(&t, "MAIL FROM:<a@example.org>\r\n", SMTPE_EV_MAIL);
    assert_int_equal(smtpe_server_reply(t.s, 354, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), 0);
    ts_expect(&t, "250 2.0.0 Ok\r\n");

    take_event(&t, "RCPT TO:<u@example.com>\r\n", SMTPE_EV_RCPT);
    assert_int_equal(smtpe_server_reply(t.s, 354, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 251, NULL, "User not local; will forward"), 0);
    ts_expect(&t, "251 2.0.0 User not local; will forward\r\n");

    take_event(&t, "DATA\r\n", SMTPE_EV_DATA);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.0.0", "Ok"), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    ts_expect(&t, "354 End data with <CR><LF>.<CR><LF>\r\n");

    /* DATA_END: chunks, then the end, which needs a verdict */
    const char *body = "hi\r\n.\r\n";
    size_t off = 0;
    smtpe_event ev;
    int got_end = 0;
    for (int guard = 0; !got_end; guard++) {
        assert_true(guard < 100);
        ssize_t r = smtpe_server_recv(t.s, (const uint8_t *)body + off, strlen(body) - off, 0);
        assert_true(r >= 0);
        off += (size_t)r;
        while (smtpe_server_next_event(t.s, &ev) == 1) {
            if (ev.type == SMTPE_EV_DATA_END) {
                got_end = 1;
                break;
            }
            assert_int_equal(ev.type, SMTPE_EV_DATA_CHUNK);
        }
        assert_true(off <= strlen(body));
    }
    assert_int_equal(ev.data_end.status, SMTPE_DATA_OK);
    assert_int_equal(ev.data_end.size, 4);
    assert_int_equal(smtpe_server_reply(t.s, 354, NULL, NULL), SMTPE_ERR_INVALID_ARGUMENT);
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.0.0", "Ok: queued as 12345"), 0);
    ts_expect(&t, "250 2.0.0 Ok: queued as 12345\r\n");

    /* defaults for NULL enhanced and text, by class; multi-line text */
    take_event(&t, "VRFY a\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 550, NULL, NULL), 0);
    take_event(&t, "VRFY b\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 450, NULL, NULL), 0);
    take_event(&t, "VRFY c\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 250, NULL, NULL), 0);
    take_event(&t, "VRFY c2\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 500, NULL, NULL), 0);
    take_event(&t, "VRFY c3\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 499, NULL, NULL), 0);
    take_event(&t, "VRFY c4\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 299, NULL, NULL), 0);
    take_event(&t, "VRFY d\r\n", SMTPE_EV_VRFY);
    assert_int_equal(smtpe_server_reply(t.s, 553, "5.1.3", "first\nsecond\nthird"), 0);
    take_event(&t, "EXPN e\r\n", SMTPE_EV_EXPN);
    assert_int_equal(smtpe_server_reply(t.s, 250, "2.1.5", "Fred <fred@example.com>\n"
                                                              "Pat <pat@example.com>"), 0);
    ts_expect(&t, "550 5.0.0 Rejected\r\n450 4.0.0 Try again later\r\n250 2.0.0 Ok\r\n"
                  "500 5.0.0 Rejected\r\n499 4.0.0 Try again later\r\n299 2.0.0 Ok\r\n"
                  "553-5.1.3 first\r\n553-5.1.3 second\r\n553 5.1.3 third\r\n"
                  "250-2.1.5 Fred <fred@example.com>\r\n250 2.1.5 Pat <pat@example.com>\r\n");
    /* a 421 verdict closes the session once sent */
    take_event(&t, "FOO\r\n", SMTPE_EV_UNKNOWN);
    assert_int_equal(smtpe_server_reply(t.s, 421, "4.3.0", "Going away"), 0);
    ts_expect(&t, "421 4.3.0 Going away\r\n");
    assert_true(smtpe_server_want(t.s) & SMTPE_WANT_CLOSE);
    assert_int_equal(ts_recv(&t, "NOOP\r\n"), 0);
    ts_close(&t);

    /* without ENHANCEDSTATUSCODES the enhanced code is not sent */
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.extensions &= ~SMTPE_EXT_ENHANCEDSTATUSCODES;
    ts_open_cfg(&t, 0);
    ts_expect(&t, GREETING);
    take_event(&t, "HELO client.example\r\n", SMTPE_EV_HELO);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    take_event(&t, "MAIL FROM:<a@example.org>\r\n", SMTPE_EV_MAIL);
    assert_int_equal(smtpe_server_reply(t.s, 550, "5.7.1", "Not you\nNever"), 0);
    take_event(&t, "MAIL FROM:<a@example.org>\r\n", SMTPE_EV_MAIL);
    assert_int_equal(smtpe_server_reply(t.s, 451, NULL, NULL), 0);
    ts_expect(&t, "250 mx.example\r\n550-Not you\r\n550 Never\r\n451 Try again later\r\n");
    ts_close(&t);
}

/* ---- want flags, QUIT, stats --------------------------------------------------------------- */

static void test_want_and_quit(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    ts_expect(&t, GREETING);
    unsigned w = smtpe_server_want(t.s);
    assert_true(w & SMTPE_WANT_READ);
    assert_false(w & (SMTPE_WANT_WRITE | SMTPE_WANT_CLOSE | SMTPE_WANT_EVENT | SMTPE_WANT_VERDICT));
    assert_int_equal(ts_recv(&t, "HELO x\r\n"), 8);
    w = smtpe_server_want(t.s);
    assert_true(w & SMTPE_WANT_EVENT);
    assert_false(w & SMTPE_WANT_READ);
    smtpe_event ev;
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.helo.esmtp, 0);
    w = smtpe_server_want(t.s);
    assert_true(w & SMTPE_WANT_VERDICT);
    assert_false(w & SMTPE_WANT_EVENT);
    assert_false(w & SMTPE_WANT_READ);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    w = smtpe_server_want(t.s);
    assert_true(w & SMTPE_WANT_WRITE);
    assert_true(w & SMTPE_WANT_READ);
    ts_expect(&t, "250 mx.example\r\n");

    /* QUIT: 221, close, nothing after it is read */
    assert_int_equal(ts_recv(&t, "QUIT\r\nNOOP\r\n"), 6);
    ts_expect(&t, "221 2.0.0 Bye\r\n");
    assert_int_equal(smtpe_server_next_event(t.s, &ev), 1);
    assert_int_equal(ev.type, SMTPE_EV_QUIT);
    assert_false(smtpe_event_needs_reply(&ev));
    w = smtpe_server_want(t.s);
    assert_true(w & SMTPE_WANT_CLOSE);
    assert_false(w & SMTPE_WANT_READ);
    assert_int_equal(ts_recv(&t, "NOOP\r\n"), 0);
    ts_expect(&t, "");
    assert_int_equal(smtpe_server_expiry(t.s, t.now), UINT64_MAX);
    ts_close(&t);

    /* QUIT with output not yet sent: CLOSE and WRITE together */
    ts_open(&t);
    assert_int_equal(ts_recv(&t, "QUIT\r\n"), 6);
    w = smtpe_server_want(t.s);
    assert_true(w & SMTPE_WANT_CLOSE);
    assert_true(w & SMTPE_WANT_WRITE);
    ts_expect(&t, GREETING "221 2.0.0 Bye\r\n");
    ts_close(&t);
}

static void test_stats(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    ts_feed_accept(&t, session_plain);
    ts_take(&t);
    smtpe_server_stats st;
    memset(&st, 0x5a, sizeof st);
    smtpe_server_get_stats(t.s, &st);
    assert_int_equal(st.octets_in, strlen(session_plain));
    assert_int_equal(st.octets_out, strlen(session_plain_out));
    assert_int_equal(st.transactions, 1);
    assert_int_equal(st.recipients, 2);
    assert_int_equal(st.errors, 0);
    hs_buf_reset(&t.out);
    ts_close(&t);

    ts_open(&t);
    ts_feed_accept(&t, "EHLO x\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
                       "x\nb\r\n.\r\nMAIL\r\nRCPT TO:<v@example.com>\r\n");
    ts_expect(&t, GREETING EHLO_REPLY "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n"
                  "354 End data with <CR><LF>.<CR><LF>\r\n"
                  "550 5.6.0 Bare CR, LF or NUL in message content\r\n"
                  "501 5.5.2 Syntax: MAIL FROM:<address>\r\n503 5.5.1 Need MAIL command\r\n");
    smtpe_server_get_stats(t.s, &st);
    assert_int_equal(st.transactions, 0);
    assert_int_equal(st.recipients, 1);
    assert_int_equal(st.errors, 2);
    ts_close(&t);
}

/* ---- no allocation and fixed memory under huge input -------------------------------------- */

static void test_huge_line(void **state)
{
    (void)state;
    ts t;
    ts_open(&t);
    ts_expect(&t, GREETING);
    static uint8_t piece[65536];
    memset(piece, 'A', sizeof piece);
    size_t total = 0;
    while (total < 10u * 1024 * 1024) {
        ssize_t r = smtpe_server_recv(t.s, piece, sizeof piece, t.now);
        assert_int_equal(r, sizeof piece);
        total += sizeof piece;
        smtpe_event ev;
        assert_int_equal(smtpe_server_next_event(t.s, &ev), 0);
    }
    ts_expect(&t, "");
    assert_int_equal(t.alloc.allocs, 1);
    assert_int_equal(t.alloc.attempts, 1);
    ts_feed_accept(&t, "\r\nNOOP\r\n");
    ts_expect(&t, "500 5.5.2 Line too long\r\n250 2.0.0 Ok\r\n");
    ts_feed_accept(&t, "EHLO x\r\nMAIL FROM:<a@example.org>\r\n");
    ts_expect(&t, EHLO_REPLY "250 2.1.0 Ok\r\n");
    assert_int_equal(t.alloc.allocs, 1);
    ts_close(&t);
}

static void test_huge_body(void **state)
{
    (void)state;
    ts t;
    memset(&t, 0, sizeof t);
    ts_config(&t.cfg);
    t.cfg.max_message_size = 0;
    ts_open_cfg(&t, 0);
    ts_feed_accept(&t, "EHLO x\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n");
    ts_expect(&t, GREETING "250-mx.example\r\n250-PIPELINING\r\n250-SIZE\r\n250-8BITMIME\r\n"
                  "250-SMTPUTF8\r\n250 ENHANCEDSTATUSCODES\r\n250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n"
                  "354 End data with <CR><LF>.<CR><LF>\r\n");
    /* 655 lines of 100 octets; every 50th starts with ".." (unstuffed to ".") */
    static uint8_t piece[65500];
    size_t dots = 0;
    for (size_t i = 0; i < 655; i++) {
        uint8_t *l = piece + i * 100;
        memset(l, 'a' + (int)(i % 26), 98);
        if (i % 50 == 0) {
            l[0] = l[1] = '.';
            dots++;
        }
        l[98] = '\r';
        l[99] = '\n';
    }
    const size_t pieces = 800; /* 52.4 MB */
    uint64_t chunked = 0;
    for (size_t k = 0; k < pieces; k++) {
        size_t off = 0;
        while (off < sizeof piece) {
            ssize_t r = smtpe_server_recv(t.s, piece + off, sizeof piece - off, t.now);
            assert_true(r >= 0);
            off += (size_t)r;
            smtpe_event ev;
            int events = 0;
            while (smtpe_server_next_event(t.s, &ev) == 1) {
                events++;
                assert_int_equal(ev.type, SMTPE_EV_DATA_CHUNK);
                chunked += ev.chunk.len;
            }
            assert_true(r > 0 || events > 0);
        }
    }
    const char *end = ".\r\n";
    size_t off = 0;
    smtpe_event ev;
    int ended = 0;
    for (int guard = 0; !ended; guard++) {
        assert_true(guard < 100);
        ssize_t r = smtpe_server_recv(t.s, (const uint8_t *)end + off, 3 - off, t.now);
        assert_true(r >= 0);
        off += (size_t)r;
        while (smtpe_server_next_event(t.s, &ev) == 1) {
            if (ev.type == SMTPE_EV_DATA_CHUNK) {
                chunked += ev.chunk.len;
                continue;
            }
            assert_int_equal(ev.type, SMTPE_EV_DATA_END);
            ended = 1;
            break;
        }
        assert_true(off <= 3);
    }
    uint64_t want = (uint64_t)pieces * (sizeof piece - dots);
    assert_int_equal(chunked, want);
    assert_int_equal(ev.data_end.status, SMTPE_DATA_OK);
    assert_int_equal(ev.data_end.size, want);
    assert_int_equal(smtpe_server_accept(t.s), 0);
    ts_expect(&t, "250 2.0.0 Ok\r\n");
    assert_int_equal(t.alloc.allocs, 1);
    assert_int_equal(t.alloc.attempts, 1);
    ts_close(&t);
}

/* ---- the allocator hook under failure (issue 5) ------------------------------------------- */

/* The configs whose memory differs most: defaults, every extension with long EHLO lines and
 * SASL mechanisms, LMTP with many recipients, PROXY, the largest reply buffer and line. */
enum { FA_DEFAULT, FA_ALL_EXTENSIONS, FA_LMTP, FA_PROXY, FA_BIG_BUFFERS, FA_CONFIGS };

static const char *const fa_extra[] = {"X-ONE", "X-TWO PARAMETER"};

static void fa_config(smtpe_server_config *c, int which)
{
    ts_config(c);
    switch (which) {
    case FA_ALL_EXTENSIONS:
        c->extensions = SMTPE_EXT_DEFAULT | SMTPE_EXT_STARTTLS | SMTPE_EXT_CHUNKING |
                        SMTPE_EXT_BINARYMIME | SMTPE_EXT_DSN | SMTPE_EXT_REQUIRETLS |
                        SMTPE_EXT_MT_PRIORITY | SMTPE_EXT_DELIVERBY | SMTPE_EXT_XCLIENT |
                        SMTPE_EXT_XFORWARD;
        c->auth_mechanisms = "PLAIN LOGIN X-TOKEN";
        c->ehlo_extra = fa_extra;
        c->ehlo_extra_count = 2;
        c->max_line_length = 12288;
        c->proxy_protocol = 1;
        break;
    case FA_LMTP:
        c->lmtp = 1;
        c->max_recipients = 1000;
        c->extensions |= SMTPE_EXT_CHUNKING;
        break;
    case FA_PROXY:
        c->proxy_protocol = 1;
        break;
    case FA_BIG_BUFFERS:
        c->reply_buffer_size = 1048576;
        c->max_line_length = 65536;
        break;
    }
}

static void test_allocator_failure(void **state)
{
    (void)state;
    for (int which = 0; which < FA_CONFIGS; which++) {
        smtpe_server_config c;
        fa_config(&c, which);
        size_t need = smtpe_server_memory_size(&c);
        assert_true(need > 0);

        /* failing: SMTPE_ERR_NOMEM, *out NULL, one request of the session's size, no free */
        hs_alloc r;
        hs_alloc_init(&r);
        r.fail_from = 1;
        smtpe_allocator hook = hs_alloc_hook(&r);
        smtpe_server *s = (smtpe_server *)&r; /* anything but NULL: must be overwritten */
        assert_int_equal(smtpe_server_new(&s, &c, &hook, 0), SMTPE_ERR_NOMEM);
        assert_null(s);
        assert_int_equal(r.attempts, 1);
        assert_int_equal(r.requested, need);
        assert_int_equal(r.frees, 0);
        smtpe_server_free(s); /* NULL: nothing to free, the hook is never called */
        assert_int_equal(r.frees, 0);
        /* and again: a failure leaves nothing behind that a retry would trip on */
        assert_int_equal(smtpe_server_new(&s, &c, &hook, 0), SMTPE_ERR_NOMEM);
        assert_null(s);
        assert_int_equal(r.attempts, 2);

        /* succeeding: exactly one request of smtpe_server_memory_size(cfg) octets, freed once
         * by smtpe_server_free with the very pointer the hook gave */
        hs_alloc_init(&r);
        assert_int_equal(smtpe_server_new(&s, &c, &hook, 0), 0);
        assert_non_null(s);
        assert_int_equal(r.attempts, 1);
        assert_int_equal(r.requested, need);
        assert_int_equal(r.frees, 0);
        size_t len = 0;
        (void)smtpe_server_send_buf(s, &len);
        if (which == FA_ALL_EXTENSIONS || which == FA_PROXY)
            assert_int_equal(len, 0); /* the greeting waits for the PROXY header */
        else
            assert_true(len > 0);
        smtpe_server_free(s);
        assert_int_equal(r.attempts, 1);
        assert_int_equal(r.frees, 1);
        assert_ptr_equal(r.last_freed, r.last);
    }

    /* a hook missing either function means malloc/free: the other one is never called */
    smtpe_server_config c;
    ts_config(&c);
    hs_alloc r;
    hs_alloc_init(&r);
    smtpe_allocator only_alloc = hs_alloc_hook(&r), only_free = hs_alloc_hook(&r);
    only_alloc.free = NULL;
    only_free.alloc = NULL;
    smtpe_server *s = NULL;
    assert_int_equal(smtpe_server_new(&s, &c, &only_alloc, 0), 0);
    smtpe_server_free(s);
    assert_int_equal(smtpe_server_new(&s, &c, &only_free, 0), 0);
    smtpe_server_free(s);
    assert_int_equal(r.attempts, 0);
    assert_int_equal(r.frees, 0);
}

/* The verdicts of the whole-extension session: AUTH X-TOKEN gets one challenge and then 535,
 * AUTH LOGIN 535, AUTH PLAIN 235; under LMTP every recipient's verdict is 250; every other
 * event the default. */
static int fa_verdict(hs_sess *s, const smtpe_event *ev, void *ud)
{
    (void)ud;
    if (ev->type == SMTPE_EV_AUTH && ev->auth.mechanism_id == SMTPE_SASL_OTHER &&
        ev->auth.step == 0)
        return smtpe_server_auth_challenge(s->srv, (const uint8_t *)"nonce", 5) == 0 ? 0 : -1;
    if (ev->type == SMTPE_EV_AUTH && ev->auth.mechanism_id != SMTPE_SASL_PLAIN)
        return smtpe_server_reply(s->srv, 535, "5.7.8", NULL) == 0 ? 0 : -1;
    unsigned n = ev->type == SMTPE_EV_DATA_END ? ev->data_end.replies : 1;
    for (unsigned i = 0; i < (n ? n : 1); i++)
        if (smtpe_server_accept(s->srv) != 0)
            return -1;
    return 0;
}

/* The codes of the final lines of the replies in out[0..n), space-separated. */
static void reply_codes(const uint8_t *p, size_t n, hs_buf *codes)
{
    size_t i = 0;
    while (i + 4 <= n) {
        size_t e = i;
        while (e + 1 < n && !(p[e] == '\r' && p[e + 1] == '\n'))
            e++;
        if (p[i + 3] == ' ')
            hs_buf_addf(codes, "%s%.3s", codes->len ? " " : "", (const char *)p + i);
        i = e + 2;
    }
}

/* A session that uses every extension (PROXY, XCLIENT, STARTTLS, AUTH in three mechanisms,
 * XFORWARD, every MAIL and RCPT parameter, DATA, BDAT with BINARYMIME, VRFY, EXPN, errors), and
 * an LMTP session with many recipients, fed whole, bytewise and in random splits: the engine
 * makes its one allocation at creation and not one more, and frees it once. */
static void test_allocator_whole_session(void **state)
{
    (void)state;
    static const char before_tls[] =
        "PROXY TCP4 192.0.2.7 198.51.100.1 40000 25\r\n"
        "EHLO client.example\r\n"
        "XCLIENT NAME=client.example ADDR=192.0.2.8 HELO=client.example\r\n"
        "EHLO client.example\r\n"
        "STARTTLS\r\n";
    static const char after_tls[] =
        "EHLO client.example\r\n"
        "AUTH X-TOKEN dG9rZW4=\r\n"
        "Zm9v\r\n"
        "AUTH LOGIN\r\n"
        "YWxpY2U=\r\n"
        "d3Jvbmc=\r\n"
        "AUTH PLAIN AGFsaWNlAHNlY3JldA==\r\n"
        "XFORWARD NAME=relay.example ADDR=192.0.2.9 PROTO=ESMTP HELO=relay.example\r\n"
        "MAIL FROM:<a@example.org> SIZE=100 BODY=8BITMIME SMTPUTF8 RET=HDRS ENVID=abc+2Bdef "
        "AUTH=<a@example.org> REQUIRETLS MT-PRIORITY=3 BY=120;R\r\n"
        "RCPT TO:<u@example.com> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;u+40example.com\r\n"
        "RCPT TO:<postmaster>\r\n"
        "DATA\r\n"
        "Subject: all\r\n\r\n..stuffed\r\nbody\r\n.\r\n"
        "MAIL FROM:<> BODY=BINARYMIME\r\n"
        "RCPT TO:<u@example.com>\r\n"
        "BDAT 5\r\nhelloBDAT 7 LAST\r\n\r\nbye\r\n"
        "VRFY u\r\nEXPN list\r\nNOOP\r\nRSET\r\nFOO bar\r\nMAIL FROM:bad\r\n"
        "QUIT\r\n";
    static const char *const want_codes =
        "220 250 220 250 220 250 334 535 334 334 535 235 250 250 250 250 354 250 250 250 250 "
        "250 252 252 250 250 500 501 221";

    for (int mode = HS_WHOLE; mode <= HS_RANDOM; mode++) {
        smtpe_server_config c;
        fa_config(&c, FA_ALL_EXTENSIONS);
        hs_sess s;
        assert_int_equal(hs_sess_open(&s, &c, 0), 0);
        assert_int_equal(smtpe_server_set_trusted(s.srv, 1), 0);
        s.verdict = fa_verdict;
        hs_splitter sp;
        hs_splitter_init(&sp, mode, 5);
        hs_sess_feed(&s, (const uint8_t *)before_tls, strlen(before_tls), &sp);
        hs_sess_drain(&s);
        hs_sess_tls(&s, 0);
        hs_sess_feed(&s, (const uint8_t *)after_tls, strlen(after_tls), &sp);
        hs_sess_drain(&s);
        if (s.failed)
            fail_msg("%s: %s", hs_mode_name(mode), hs_buf_cstr(&s.err));
        hs_buf codes = {0};
        reply_codes(s.out.p, s.out.len, &codes);
        if (strcmp(hs_buf_cstr(&codes), want_codes) != 0)
            fail_msg("%s: reply codes\n  got:      %s\n  expected: %s", hs_mode_name(mode),
                     hs_buf_cstr(&codes), want_codes);
        hs_buf_free(&codes);
        assert_true(smtpe_server_want(s.srv) & SMTPE_WANT_CLOSE);
        assert_int_equal(s.alloc.attempts, 1);
        assert_int_equal(s.alloc.allocs, 1);
        assert_int_equal(s.alloc.bytes, smtpe_server_memory_size(&c));
        assert_int_equal(s.alloc.frees, 0);
        assert_int_equal(hs_sess_close(&s), 0); /* one free, of that block */
        assert_int_equal(s.alloc.frees, 1);
        assert_int_equal(s.alloc.attempts, 1);
    }

    /* LMTP: 300 recipients, one reply each after the content */
    hs_buf in = {0}, want = {0};
    hs_buf_adds(&in, "LHLO client.example\r\nMAIL FROM:<a@example.org>\r\n");
    hs_buf_adds(&want, "220 250 250");
    for (int i = 0; i < 300; i++) {
        hs_buf_addf(&in, "RCPT TO:<user%03d@example.com>\r\n", i);
        hs_buf_adds(&want, " 250");
    }
    hs_buf_adds(&in, "DATA\r\nSubject: many\r\n\r\nbody\r\n.\r\nBDAT 3 LAST\r\nabcQUIT\r\n");
    hs_buf_adds(&want, " 354");
    for (int i = 0; i < 300; i++)
        hs_buf_adds(&want, " 250");
    hs_buf_adds(&want, " 503 221"); /* BDAT after the transaction ended: no recipients */
    /* (not through hs_sess: under LMTP the queued replies may exceed reply_buffer_size, by
     * the 512 octets per recipient smtpe_server_memory_size adds for them) */
    for (int mode = HS_WHOLE; mode <= HS_RANDOM; mode++) {
        smtpe_server_config c;
        fa_config(&c, FA_LMTP);
        hs_alloc r;
        hs_alloc_init(&r);
        smtpe_allocator hook = hs_alloc_hook(&r);
        smtpe_server *s = NULL;
        assert_int_equal(smtpe_server_new(&s, &c, &hook, 0), 0);
        hs_splitter sp;
        hs_splitter_init(&sp, mode, 9);
        hs_buf out = {0};
        size_t off = 0;
        for (int guard = 0;; guard++) {
            assert_true(guard < 1000000);
            smtpe_event ev;
            while (smtpe_server_next_event(s, &ev) == 1) {
                unsigned n = ev.type == SMTPE_EV_DATA_END ? ev.data_end.replies : 1;
                if (smtpe_event_needs_reply(&ev))
                    for (unsigned i = 0; i < (n ? n : 1); i++)
                        assert_int_equal(smtpe_server_accept(s), 0);
            }
            size_t len = 0;
            const uint8_t *p = smtpe_server_send_buf(s, &len);
            if (len) {
                hs_buf_add(&out, p, len);
                assert_int_equal(smtpe_server_send_ack(s, len), 0);
            }
            if (off == in.len || (smtpe_server_want(s) & SMTPE_WANT_CLOSE))
                break;
            ssize_t got = smtpe_server_recv(s, in.p + off, hs_splitter_next(&sp, in.len - off), 0);
            assert_true(got >= 0);
            off += (size_t)got;
            assert_int_equal(r.attempts, 1);
        }
        hs_buf codes = {0};
        reply_codes(out.p, out.len, &codes);
        if (strcmp(hs_buf_cstr(&codes), hs_buf_cstr(&want)) != 0)
            fail_msg("lmtp %s: reply codes\n  got:      %s\n  expected: %s",
                     hs_mode_name(mode), hs_buf_cstr(&codes), hs_buf_cstr(&want));
        hs_buf_free(&codes);
        hs_buf_free(&out);
        assert_true(smtpe_server_want(s) & SMTPE_WANT_CLOSE);
        assert_int_equal(r.attempts, 1);
        assert_int_equal(r.requested, smtpe_server_memory_size(&c));
        smtpe_server_free(s);
        assert_int_equal(r.attempts, 1);
        assert_int_equal(r.frees, 1);
        assert_ptr_equal(r.last_freed, r.last);
    }
    hs_buf_free(&in);
    hs_buf_free(&want);
}

/* ---- split invariance -------------------------------------------------------------------- */

typedef struct run_result {
    hs_buf out;
    hs_log log;
    int failed;
    hs_buf err;
} run_result;

/* Feeds in[a..b) in the pieces sp chooses, or (sp NULL) in at most two pieces split at *cut.
 * Returns 0 if it was all consumed. */
static int feed_range(hs_sess *s, const uint8_t *in, size_t a, size_t b, hs_splitter *sp,
                      const size_t *cut)
{
    static const uint8_t none[1];
    if (!in) /* a transcript without client octets */
        in = none;
    if (sp)
        return hs_sess_feed(s, in + a, b - a, sp) == b - a ? 0 : -1;
    hs_splitter whole;
    hs_splitter_init(&whole, HS_WHOLE, 0);
    size_t mid = *cut > a && *cut < b ? *cut : a;
    if (hs_sess_feed(s, in + a, mid - a, &whole) != mid - a)
        return -1;
    return hs_sess_feed(s, in + mid, b - mid, &whole) == b - mid ? 0 : -1;
}

/* Replays in[0..n) as a host that accepts every event, under plan (NULL: an untrusted plain
 * connection): the TLS handshake of each plan->tls_at offset finishes there when the session
 * asks for one. */
static void run_session(const smtpe_server_config *cfg, const uint8_t *in, size_t n,
                        hs_splitter *sp, const size_t *cut, const hs_plan *plan,
                        run_result *res)
{
    memset(res, 0, sizeof *res);
    hs_sess s;
    int rc = hs_sess_open_plan(&s, cfg, plan);
    if (rc != 0) {
        res->failed = 1;
        hs_buf_addf(&res->err, "smtpe_server_new: %d", rc);
        return;
    }
    size_t from = 0;
    size_t ntls = plan ? plan->ntls : 0;
    for (size_t k = 0; k <= ntls && !s.failed; k++) {
        size_t to = k < ntls ? plan->tls_at[k] : n;
        if (feed_range(&s, in, from, to, sp, cut) < 0)
            break; /* the session is over */
        from = to;
        if (k < ntls) {
            hs_sess_drain(&s);
            if (smtpe_server_want(s.srv) & SMTPE_WANT_TLS)
                hs_sess_tls(&s, 0);
        }
    }
    hs_sess_drain(&s);
    hs_sess_flush_content(&s);
    res->failed = s.failed;
    if (s.failed)
        hs_buf_add(&res->err, s.err.p, s.err.len);
    hs_buf_add(&res->out, s.out.p, s.out.len);
    for (size_t i = 0; i < s.log.n; i++)
        hs_log_add(&res->log, s.log.items[i].p, s.log.items[i].len);
    if (hs_sess_close(&s) < 0) {
        res->failed = 1;
        hs_buf_adds(&res->err, "free did not release the one allocation");
    }
}

static void run_result_free(run_result *r)
{
    hs_buf_free(&r->out);
    hs_log_free(&r->log);
    hs_buf_free(&r->err);
}

static void print_diff(const run_result *a, const run_result *b)
{
    hs_buf x = {0}, y = {0};
    hs_escape(&x, a->out.p, a->out.len);
    hs_escape(&y, b->out.p, b->out.len);
    fprintf(stderr, "    whole output: \"%s\"\n    this output:  \"%s\"\n", hs_buf_cstr(&x),
            hs_buf_cstr(&y));
    size_t n = a->log.n > b->log.n ? a->log.n : b->log.n;
    for (size_t i = 0; i < n; i++) {
        hs_buf_reset(&x);
        hs_buf_reset(&y);
        if (i < a->log.n)
            hs_escape(&x, a->log.items[i].p, a->log.items[i].len);
        if (i < b->log.n)
            hs_escape(&y, b->log.items[i].p, b->log.items[i].len);
        if (x.len != y.len || !hs_memeq(x.p, y.p, x.len)) {
            fprintf(stderr, "    first different event #%zu\n      whole: %s\n      this:  %s\n",
                    i, hs_buf_cstr(&x), hs_buf_cstr(&y));
            break;
        }
    }
    hs_buf_free(&x);
    hs_buf_free(&y);
}

/* Returns the number of failing splits (details on stderr). */
static int check_invariance(const char *name, const smtpe_server_config *cfg, const uint8_t *in,
                            size_t n, const hs_plan *plan)
{
    run_result whole, r;
    hs_splitter sp;
    hs_splitter_init(&sp, HS_WHOLE, 0);
    run_session(cfg, in, n, &sp, NULL, plan, &whole);
    if (whole.failed) {
        fprintf(stderr, "  %s [whole]: %s\n", name, hs_buf_cstr(&whole.err));
        run_result_free(&whole);
        return 1;
    }
    int failures = 0;
    /* bytewise, 12 pseudo-random splits, then every 2-split (about 400 for long inputs) */
    size_t step = n > 1200 ? n / 400 : 1;
    size_t runs = 1 + 12 + (n ? (n - 1) / step + 1 : 0);
    for (size_t k = 0; k < runs && failures < 3; k++) {
        char label[64];
        size_t cut = 0;
        if (k == 0) {
            hs_splitter_init(&sp, HS_BYTEWISE, 0);
            snprintf(label, sizeof label, "bytewise");
            run_session(cfg, in, n, &sp, NULL, plan, &r);
        } else if (k <= 12) {
            uint64_t seed = hs_hash(name) ^ (k * 0x9e3779b97f4a7c15ull);
            hs_splitter_init(&sp, HS_RANDOM, seed);
            snprintf(label, sizeof label, "random seed %llu", (unsigned long long)seed);
            run_session(cfg, in, n, &sp, NULL, plan, &r);
        } else {
            cut = 1 + (k - 13) * step;
            if (cut >= n)
                continue;
            snprintf(label, sizeof label, "split at %zu", cut);
            run_session(cfg, in, n, NULL, &cut, plan, &r);
        }
        int same = !r.failed && r.out.len == whole.out.len &&
                   hs_memeq(r.out.p, whole.out.p, r.out.len) && hs_log_equal(&r.log, &whole.log);
        if (!same) {
            failures++;
            fprintf(stderr, "  %s [%s]: %s\n", name, label,
                    r.failed ? hs_buf_cstr(&r.err) : "output or events differ from the whole run");
            if (!r.failed)
                print_diff(&whole, &r);
        }
        run_result_free(&r);
    }
    run_result_free(&whole);
    return failures;
}

#define LIT(x) x, sizeof(x) - 1

typedef struct embedded_session {
    const char *name;
    const char *in;
    size_t len; /* 0: strlen */
    smtpe_line_ending_policy policy;
    uint64_t max_size;
} embedded_session;

static void test_split_invariance_embedded(void **state)
{
    (void)state;
    static const embedded_session sessions[] = {
        {"plain", NULL, 0, SMTPE_LINE_ENDING_REFUSE, 10485760},
        {"smuggling-refuse",
         LIT("EHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
         "hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\nforged\r\n"
         ".\r\nNOOP\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_REFUSE, 10485760},
        {"smuggling-normalise",
         LIT("EHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
         "hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\nforged\r\n"
         ".\r\nNOOP\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_NORMALISE, 10485760},
        {"smuggling-keep",
         LIT("EHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
         "hi\n.\r\nMAIL FROM:<x@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\nforged\r\n"
         ".\r\nNOOP\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_KEEP, 10485760},
        {"bare-in-commands-normalise",
         LIT("EHLO c\nMAIL FROM:<a@example.org>\rRCPT TO:<u@example.com>\r\rNO\0OP\r\n\nDATA\r\n"
         "a\rb\0c\r\n..\r\n.\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_NORMALISE, 10485760},
        {"bare-in-commands-refuse",
         LIT("EHLO c\nMAIL FROM:<a@example.org>\r\nNO\0OP\r\nNOOP\r\r\nRSET\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_REFUSE, 10485760},
        {"too-long-lines",
         LIT("EHLO c\r\nNOOP xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "\r\nNOOP\r\nMAIL FROM:<a@example.org>\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_REFUSE, 10485760},
        {"size-limit",
         LIT("EHLO c\r\nMAIL FROM:<a@example.org> SIZE=40\r\nMAIL FROM:<a@example.org>\r\n"
         "RCPT TO:<u@example.com>\r\nDATA\r\n0123456789\r\n0123456789\r\n0123456789\r\n"
         "..0123456789\r\n.\r\nNOOP\r\nMAIL FROM:<b@example.org> SIZE=30\r\nRCPT TO:<u@example.com>\r\n"
         "DATA\r\nshort\r\n.\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_REFUSE, 30},
        {"errors-and-junk",
         LIT("\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\nFOO\r\nHELO\r\nEHLO c\r\nRCPT TO:<a@b.org>\r\n"
         "MAIL FROM:a@b.org\r\nMAIL FROM:<a@b.org> X=1\r\nMAIL FROM:<a@b.org> SIZE=x\r\n"
         "MAIL FROM:<\xc3\xa9@b.org>\r\nMAIL FROM:<\xc3\xa9@b.org> SMTPUTF8\r\nRCPT TO:<postmaster>\r\n"
         "RCPT TO:<x@[300.1.1.1]>\r\nDATA x\r\nVRFY\r\nEXPN\r\n\r\nQUIT now\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_REFUSE, 10485760},
        {"pipelined-two-messages",
         LIT("EHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\none\r\n.\r\n"
         "MAIL FROM:<>\r\nRCPT TO:<v@example.com>\r\nDATA\r\n.\r\nRSET\r\nQUIT\r\n"),
         SMTPE_LINE_ENDING_REFUSE, 10485760},
        {"crlf-boundaries",
         LIT("EHLO c\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\nDATA\r\n"
         "\r\n\r\n.\r\r\n.\n\r\n..\r\n...\r\n.\r\n"),
         SMTPE_LINE_ENDING_KEEP, 10485760},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof sessions / sizeof sessions[0]; i++) {
        smtpe_server_config cfg;
        ts_config(&cfg);
        cfg.line_ending = sessions[i].policy;
        cfg.max_message_size = sessions[i].max_size;
        const char *in = sessions[i].in ? sessions[i].in : session_plain;
        size_t n = sessions[i].len ? sessions[i].len : strlen(in);
        failures += check_invariance(sessions[i].name, &cfg, (const uint8_t *)in, n, NULL);
    }
    if (failures)
        fail_msg("%d split(s) changed output or events (details above)", failures);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The client octets of every transcript, under its configuration (and its peer trust and TLS
 * handshake points), accepting every verdict. */
static void test_split_invariance_transcripts(void **state)
{
    (void)state;
    DIR *d = opendir(transcript_dir);
    if (!d)
        fail_msg("cannot open transcript directory %s", transcript_dir);
    char **names = NULL;
    size_t count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".txt") != 0)
            continue;
        names = realloc(names, (count + 1) * sizeof *names);
        assert_non_null(names);
        names[count] = malloc(strlen(transcript_dir) + l + 2);
        assert_non_null(names[count]);
        sprintf(names[count], "%s/%s", transcript_dir, e->d_name);
        count++;
    }
    closedir(d);
    qsort(names, count, sizeof *names, cmp_names);
    assert_true(count > 0);
    int failures = 0;
    for (size_t i = 0; i < count; i++) {
        hs_script sc;
        hs_buf err = {0}, in = {0};
        if (hs_script_load(&sc, names[i], &err) < 0) {
            fprintf(stderr, "  %s\n", hs_buf_cstr(&err));
            failures++;
        } else {
            hs_plan plan;
            hs_script_input(&sc, &in);
            hs_script_plan(&sc, &plan);
            failures += check_invariance(sc.name, &sc.cfg, in.p, in.len, &plan);
            hs_plan_free(&plan);
        }
        hs_script_free(&sc);
        hs_buf_free(&err);
        hs_buf_free(&in);
        free(names[i]);
    }
    free(names);
    if (failures)
        fail_msg("%d split(s) of transcript inputs changed output or events", failures);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        transcript_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_memory_size),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_argument_errors),
        cmocka_unit_test(test_needs_reply),
        cmocka_unit_test(test_greeting),
        cmocka_unit_test(test_allocator),
        cmocka_unit_test(test_init_caller_memory),
        cmocka_unit_test(test_deferred_verdicts),
        cmocka_unit_test(test_pipelined_order),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_command_timeout),
        cmocka_unit_test(test_timer_after_late_verdict),
        cmocka_unit_test(test_data_timeout),
        cmocka_unit_test(test_error_limit),
        cmocka_unit_test(test_close),
        cmocka_unit_test(test_reply_arguments),
        cmocka_unit_test(test_want_and_quit),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_huge_line),
        cmocka_unit_test(test_huge_body),
        cmocka_unit_test(test_allocator_failure),
        cmocka_unit_test(test_allocator_whole_session),
        cmocka_unit_test(test_split_invariance_embedded),
        cmocka_unit_test(test_split_invariance_transcripts),
    };
    return cmocka_run_group_tests_name("server", tests, NULL, NULL);
}
