/*
 * conn.c - the connection pump between a non-blocking socket and an engine session (see conn.h).
 *
 * Input: one read into a fixed buffer, then smtpe_server_recv / smtpe_server_next_event until the
 * engine neither consumes nor produces; unconsumed octets (pipelined commands behind a reply the
 * socket would not take yet) stay in the buffer, and reading stops while it is full. Output:
 * smtpe_server_send_buf / send(MSG_NOSIGNAL) / smtpe_server_send_ack, waiting for writability on
 * a partial write. Timers: the engine's expiry, plus the host's own limit on how long a client
 * that does not read may keep replies queued (the engine has no timer once it wants to close).
 */
#include "conn.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "net.h"
#include "session.h"

#define CONN_INPUT_BUF 16384
#define CONN_LINGER_MS 10000u       /* closing or client gone: time left to send the last reply */
#define CONN_SEND_TIMEOUT_MS 300000u /* replies queued and not read, when no command timeout */

struct conn {
    const struct host_ctx *ctx;
    int fd;
    int eof;              /* the client closed its side */
    smtpe_server *s;
    uint64_t start_ms;
    uint64_t out_since;   /* when the output now queued started waiting; 0: none queued */
    uint64_t bytes_in, bytes_out;
    size_t in_off, in_len; /* unconsumed input is in[in_off..in_len) */
    struct session ss;
    uint8_t in[CONN_INPUT_BUF];
    max_align_t engine[];  /* smtpe_server_init memory */
};

struct conn *conn_new(const struct host_ctx *ctx, int fd, const struct sockaddr *peer,
                      uint64_t now_ms)
{
    struct conn *c = malloc(sizeof *c + ctx->session_mem);
    int rc;

    if (c == NULL)
        return NULL;
    c->ctx = ctx;
    c->fd = fd;
    c->eof = 0;
    c->start_ms = now_ms;
    c->out_since = 0;
    c->bytes_in = c->bytes_out = 0;
    c->in_off = c->in_len = 0;
    session_init(&c->ss, ctx, peer);
    rc = smtpe_server_init(&c->s, c->engine, ctx->session_mem, &ctx->cfg, now_ms);
    if (rc < 0) {
        host_log("error peer=%s engine: %s", c->ss.peer, smtpe_strerror(rc));
        free(c);
        return NULL;
    }
    return c;
}

int conn_fd(const struct conn *c)
{
    return c->fd;
}

static unsigned fail(struct conn *c, const char *end)
{
    session_set_end(&c->ss, end);
    session_abort(&c->ss);
    return CONN_CLOSE;
}

static size_t pending_output(struct conn *c)
{
    size_t len;

    (void)smtpe_server_send_buf(c->s, &len);
    return len;
}

/* Sends queued output until done or the socket is full. Returns octets sent, or -1. */
static ssize_t flush(struct conn *c, uint64_t now_ms)
{
    size_t total = 0, len;

    for (;;) {
        const uint8_t *out = smtpe_server_send_buf(c->s, &len);
        ssize_t w;
        if (len == 0)
            break;
        w = send(c->fd, out, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w < 0)
            return -1;
        if (w == 0)
            break; /* not for a stream socket; never spin on it */
        (void)smtpe_server_send_ack(c->s, (size_t)w);
        total += (size_t)w;
        c->bytes_out += (uint64_t)w;
    }
    if (len == 0)
        c->out_since = 0;
    else if (total > 0 || c->out_since == 0)
        c->out_since = now_ms;
    return (ssize_t)total;
}

/* Feeds the buffered input to the engine and handles its events until it neither consumes
 * octets nor gives events. Returns 0 or a negative SMTPE_ERR_*. */
static int pump(struct conn *c, uint64_t now_ms)
{
    smtpe_event ev;

    for (;;) {
        ssize_t n = 0;
        int took = 0, rc;
        if (c->in_off < c->in_len) {
            n = smtpe_server_recv(c->s, c->in + c->in_off, c->in_len - c->in_off, now_ms);
            if (n < 0)
                return (int)n;
            c->in_off += (size_t)n;
        }
        while ((rc = smtpe_server_next_event(c->s, &ev)) == 1) {
            took = 1;
            rc = session_on_event(&c->ss, c->s, &ev);
            if (rc < 0)
                return rc;
        }
        if (rc < 0)
            return rc;
        if (n == 0 && !took)
            break;
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    return 0;
}

/* What to wait for now. */
static unsigned interest(struct conn *c)
{
    unsigned want = smtpe_server_want(c->s);
    int out = pending_output(c) > 0;

    if ((want & SMTPE_WANT_CLOSE) || c->eof) {
        if (out)
            return CONN_WRITE;
        return fail(c, "eof"); /* quit, timeout, ... were recorded already */
    }
    if (c->in_len - c->in_off < sizeof c->in)
        return CONN_READ | (out ? CONN_WRITE : 0u);
    if (out)
        return CONN_WRITE;
    /* A full buffer the engine will not take, and nothing to send: cannot happen while every
     * verdict is given at once, but never wait for nothing. */
    host_log("error peer=%s input stalled", c->ss.peer);
    return fail(c, "io-error");
}

/* Runs the engine and sends output until neither makes progress. */
static unsigned progress(struct conn *c, uint64_t now_ms)
{
    for (;;) {
        int rc = pump(c, now_ms);
        ssize_t sent;
        if (rc < 0) {
            host_log("error peer=%s engine: %s", c->ss.peer, smtpe_strerror(rc));
            return fail(c, "io-error");
        }
        /* After a verdict the engine asks for handle_expiry at once (expiry 0) to restart its
         * timer from the host's clock; doing it here spares the model a timer sweep. A real
         * timeout that is due fires too, and its event is taken by the next pump. */
        if (smtpe_server_expiry(c->s) <= now_ms &&
            smtpe_server_handle_expiry(c->s, now_ms) == 1)
            continue;
        sent = flush(c, now_ms);
        if (sent < 0)
            return fail(c, "io-error");
        if (sent == 0)
            return interest(c);
    }
}

unsigned conn_start(struct conn *c, uint64_t now_ms)
{
    return progress(c, now_ms);
}

/* One read into the free end of the input buffer. Returns 0, or -1 on a socket error. */
static int read_some(struct conn *c)
{
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->eof || c->in_len == sizeof c->in)
        return 0;
    for (;;) {
        ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, 0);
        if (r > 0) {
            c->in_len += (size_t)r;
            c->bytes_in += (uint64_t)r;
            return 0;
        }
        if (r == 0) {
            c->eof = 1;
            return 0;
        }
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}

unsigned conn_on_readable(struct conn *c, uint64_t now_ms)
{
    if (read_some(c) < 0)
        return fail(c, "io-error");
    return progress(c, now_ms);
}

unsigned conn_on_writable(struct conn *c, uint64_t now_ms)
{
    return progress(c, now_ms);
}

/* The host's deadline for queued output the client does not read. */
static uint64_t output_deadline(const struct conn *c)
{
    uint64_t limit = c->ctx->cfg.command_timeout_ms ? c->ctx->cfg.command_timeout_ms
                                                    : CONN_SEND_TIMEOUT_MS;

    if (c->out_since == 0)
        return UINT64_MAX;
    if (c->eof || (smtpe_server_want(c->s) & SMTPE_WANT_CLOSE))
        limit = CONN_LINGER_MS;
    return c->out_since + limit;
}

uint64_t conn_expiry(const struct conn *c)
{
    uint64_t e = smtpe_server_expiry(c->s), o = output_deadline(c);

    return e < o ? e : o;
}

unsigned conn_on_timer(struct conn *c, uint64_t now_ms)
{
    if (output_deadline(c) <= now_ms)
        return fail(c, "timeout");
    if (smtpe_server_expiry(c->s) <= now_ms)
        (void)smtpe_server_handle_expiry(c->s, now_ms);
    return progress(c, now_ms);
}

void conn_shutdown(struct conn *c, uint64_t now_ms)
{
    session_set_end(&c->ss, "shutdown");
    session_abort(&c->ss);
    (void)smtpe_server_close(c->s, 421, "4.3.2", c->ctx->shutdown_text);
    (void)flush(c, now_ms);
}

void conn_free(struct conn *c)
{
    smtpe_server_stats st;
    const struct session *ss = &c->ss;
    char helo[3 * 64 + 1];

    session_abort(&c->ss);
    smtpe_server_get_stats(c->s, &st);
    host_log("disconnect peer=%s helo=%s mail=%u rcpt=%u data=%u delivered=%u errors=%u "
             "in=%llu out=%llu ms=%llu end=%s",
             ss->peer, ss->helo[0] ? host_log_token(helo, sizeof helo, ss->helo,
                                                    strlen(ss->helo))
                                   : "-",
             ss->mails, ss->rcpts, ss->datas, ss->delivered, st.errors,
             (unsigned long long)c->bytes_in, (unsigned long long)c->bytes_out,
             (unsigned long long)(host_now_ms() - c->start_ms), ss->end ? ss->end : "eof");
    if (close(c->fd) < 0 && errno != EINTR)
        host_log("error peer=%s close: %s", ss->peer, strerror(errno));
    free(c);
}

void conn_reject(const struct host_ctx *ctx, int fd, const struct sockaddr *peer,
                 uint64_t now_ms)
{
    smtpe_server *s;
    char where[NET_HOSTPORT_MAX];
    size_t len;

    if (smtpe_server_new(&s, &ctx->cfg, NULL, now_ms) == 0) {
        if (smtpe_server_close(s, 421, "4.7.0", ctx->busy_text) == 0) {
            const uint8_t *out = smtpe_server_send_buf(s, &len);
            ssize_t w;
            do
                w = send(fd, out, len, MSG_NOSIGNAL);
            while (w < 0 && errno == EINTR);
        }
        smtpe_server_free(s);
    }
    host_log("reject peer=%s reason=too-many-connections", net_hostport(peer, where));
    (void)close(fd);
}
