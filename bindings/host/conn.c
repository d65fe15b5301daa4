/*
 * conn.c - the connection pump between a non-blocking socket and an engine session (see conn.h).
 *
 * Input: one read into a fixed buffer, then smtpe_server_recv / smtpe_server_next_event until the
 * engine neither consumes nor produces; unconsumed octets (pipelined commands behind a reply the
 * socket would not take yet) stay in the buffer, and reading stops while it is full. Output:
 * smtpe_server_send_buf / send(MSG_NOSIGNAL) / smtpe_server_send_ack, waiting for writability on
 * a partial write. Timers: the engine's expiry, plus the host's own limit on how long a client
 * that does not read may keep replies queued (the engine has no timer once it wants to close).
 *
 * STARTTLS (RFC 3207): once the engine wants TLS, the 220 is sent in clear, the octets already
 * read are fed to the engine (which discards them: nothing sent before the handshake may count
 * as a command, CVE-2011-0411), no more is read in clear, and the handshake runs as readiness
 * allows, bounded by the command timeout. After it, every read and write goes through TLS. A
 * TLS read may need the socket writable and a TLS write may need it readable; the pump then
 * waits for that instead (never for the other, which would spin), and plaintext TLS has
 * already decrypted (tls_pending) is read as soon as the input buffer has room, since the
 * socket will not signal it.
 */
#include "conn.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "net.h"
#include "session.h"
#include "tls.h"

#define CONN_PAGE 4096u /* the allocation unit of a connection */
#define CONN_LINGER_MS 10000u       /* closing or client gone: time left to send the last reply */
#define CONN_SEND_TIMEOUT_MS 300000u /* replies queued and not read, when no command timeout */
#define CONN_LINGER_READ_MS 2000u   /* lingering close: input discarded this long at most */

enum conn_tls { CONN_TLS_NONE, CONN_TLS_HANDSHAKE, CONN_TLS_UP };

/* --greet-delay-ms: where the greeting is. */
enum conn_greeting {
    GREETING_SENT,        /* out (or no delay): input is the engine's */
    GREETING_HELD,        /* queued and held until hold_until: input now is a pregreet */
    GREETING_AFTER_PROXY  /* --proxy-protocol: the hold starts once the header is taken */
};

#define IO_AGAIN (-1) /* sock_recv / sock_send: the socket is not ready */
#define IO_ERROR (-2) /* the connection failed (logged) */

struct conn {
    const struct host_ctx *ctx;
    int fd;
    int eof;              /* the client closed its side */
    smtpe_server *s;
    struct tls_conn *tls; /* NULL until STARTTLS */
    enum conn_tls tls_state;
    uint64_t handshake_deadline;
    unsigned read_needs;  /* CONN_WRITE: the last TLS read waits for writability, else 0 */
    unsigned write_needs; /* CONN_READ: the last TLS write waits for readability, else 0 */
    uint64_t start_ms;
    uint64_t out_since;   /* when the output now queued started waiting; 0: none queued */
    uint64_t engine_due;  /* smtpe_server_expiry at the end of the last conn_on_* call */
    uint64_t hold_until;  /* --reply-delay-ms: queued output goes out at this time; 0: none */
    int held;             /* output is queued and held until hold_until */
    enum conn_greeting greeting;
    uint64_t bytes_in, bytes_out;
    void *user;           /* the model's */
    /* Input: the loop's scratch buffer while a call runs; octets the engine leaves (pipelined
     * commands behind replies the client does not read) move to own, allocated on first need
     * and kept. Between calls, unconsumed input is always in own. */
    uint8_t *scratch;
    uint8_t *own;
    int nomem;             /* no memory for own: input dropped, 421 after the pending verdict */
    uint64_t linger_until; /* closing: input is discarded until EOF or then; 0: not closing */
    uint8_t *in;           /* scratch or own */
    size_t in_off, in_len; /* unconsumed input is in[in_off..in_len) */
    struct session ss;
    max_align_t engine[];  /* smtpe_server_init memory */
};

/* Connection memory: whole pages, page-aligned, carved from mmap'd runs and kept on a free
 * list (one per process, behind a mutex: the threads model allocates from many threads). The
 * struct and the engine's hot head come first; the end of the engine's reply buffer (the room
 * it keeps for the longest reply a host may give, used only by long or many pipelined replies)
 * then fills the last page alone, so an ordinary session never touches that page and it costs
 * no resident memory: 4 KiB per idle session instead of 6. All slots have the size of the
 * first request (every connection of a process has the same engine config). */
#define SLOT_RUN (2u << 20) /* octets mapped at a time */

#if defined(__SANITIZE_ADDRESS__)
#define SLOT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOT_SANITIZED 1
#endif
#endif

#ifdef SLOT_SANITIZED
/* Under AddressSanitizer: plain malloc, so that it sees every use after free. */
static void *slot_get(size_t size)
{
    return malloc(size);
}

static void slot_put(void *p)
{
    free(p);
}
#else
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static void *slot_free_list; /* each free slot starts with the pointer to the next */
static size_t slot_size;     /* 0 until the first request */
static uint8_t *slot_run;    /* the unused rest of the last mapped run */
static size_t slot_run_left;

static void *slot_get(size_t size)
{
    void *p = NULL;

    pthread_mutex_lock(&slot_lock);
    if (slot_size == 0)
        slot_size = (size + CONN_PAGE - 1) / CONN_PAGE * CONN_PAGE;
    if (size <= slot_size) {
        if (slot_free_list != NULL) {
            p = slot_free_list;
            slot_free_list = *(void **)p;
        } else {
            if (slot_run_left < slot_size) {
                size_t len = slot_size > SLOT_RUN ? slot_size : SLOT_RUN / slot_size * slot_size;
                void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                               -1, 0);
                if (m != MAP_FAILED) {
                    slot_run = m;
                    slot_run_left = len;
                }
            }
            if (slot_run_left >= slot_size) {
                p = slot_run;
                slot_run += slot_size;
                slot_run_left -= slot_size;
            }
        }
    }
    pthread_mutex_unlock(&slot_lock);
    return p;
}

static void slot_put(void *p)
{
    pthread_mutex_lock(&slot_lock);
    *(void **)p = slot_free_list;
    slot_free_list = p;
    pthread_mutex_unlock(&slot_lock);
}
#endif

struct conn *conn_new(const struct host_ctx *ctx, struct job_pool *pool, uint8_t *scratch,
                      int fd, const struct sockaddr *peer, const struct census_seat *seat,
                      uint64_t now_ms)
{
    struct conn *c = slot_get(sizeof *c + ctx->session_mem);
    int rc;

    if (c == NULL) {
        if (seat != NULL && seat->census != NULL)
            census_leave(seat->census, seat->slot, seat->key);
        return NULL;
    }
    c->ctx = ctx;
    c->fd = fd;
    c->eof = 0;
    c->tls = NULL;
    c->tls_state = CONN_TLS_NONE;
    c->handshake_deadline = UINT64_MAX;
    c->read_needs = c->write_needs = 0;
    c->start_ms = now_ms;
    c->out_since = 0;
    c->engine_due = UINT64_MAX;
    c->hold_until = 0;
    c->held = 0;
    c->bytes_in = c->bytes_out = 0;
    c->user = NULL;
    c->scratch = c->in = scratch;
    c->own = NULL;
    c->nomem = 0;
    c->linger_until = 0;
    c->in_off = c->in_len = 0;
    session_init(&c->ss, ctx, pool, peer);
    if (seat != NULL)
        c->ss.seat = *seat; /* session_free leaves it */
    c->greeting = ctx->opt.greet_delay_ms == 0 ? GREETING_SENT
                  : ctx->opt.proxy_protocol    ? GREETING_AFTER_PROXY
                                               : GREETING_HELD;
    if (c->greeting == GREETING_HELD)
        c->hold_until = now_ms + ctx->opt.greet_delay_ms;
    /* The command timeout starts when the greeting goes out: the engine is told the session
     * starts then (nothing reaches it before: talking first ends the session). */
    rc = smtpe_server_init(&c->s, c->engine, ctx->session_mem, &ctx->cfg,
                           c->greeting == GREETING_HELD ? c->hold_until : now_ms);
    if (rc == 0)
        rc = session_start(&c->ss, c->s, peer);
    if (rc < 0) {
        host_log("error sid=%s peer=%s engine: %s", c->ss.sid, c->ss.peer, smtpe_strerror(rc));
        session_free(&c->ss);
        slot_put(c);
        return NULL;
    }
    /* with --proxy-protocol the socket peer is a balancer: the client comes with the header
     * (the "proxy" line) */
    host_log("connect sid=%s %s=%s", c->ss.sid, ctx->opt.proxy_protocol ? "via" : "peer",
             c->ss.peer);
    return c;
}

int conn_fd(const struct conn *c)
{
    return c->fd;
}

void conn_set_user(struct conn *c, void *user)
{
    c->user = user;
}

void *conn_user(const struct conn *c)
{
    return c->user;
}

static unsigned fail(struct conn *c, const char *end)
{
    session_set_end(&c->ss, end);
    session_abort(&c->ss);
    return CONN_CLOSE;
}

/* Whether output is queued (asked without handing it out: see flush). */
static int pending_output(const struct conn *c)
{
    return (smtpe_server_want(c->s) & SMTPE_WANT_WRITE) != 0;
}

/* One write, in clear or through TLS. Returns the octets written (> 0), IO_AGAIN or IO_ERROR. */
static ssize_t sock_send(struct conn *c, const uint8_t *p, size_t len)
{
    ssize_t w;

    if (c->tls_state == CONN_TLS_UP) {
        w = tls_write(c->tls, p, len);
        c->write_needs = w == TLS_WANT_READ ? CONN_READ : 0u;
        if (w > 0)
            return w;
        if (w == TLS_WANT_READ || w == TLS_WANT_WRITE)
            return IO_AGAIN;
        host_log("error sid=%s peer=%s tls: %s", c->ss.sid, c->ss.peer, tls_conn_error(c->tls));
        return IO_ERROR;
    }
    for (;;) {
        w = send(c->fd, p, len, MSG_NOSIGNAL);
        if (w > 0)
            return w;
        if (w < 0 && errno == EINTR)
            continue;
        if (w == 0 || errno == EAGAIN || errno == EWOULDBLOCK)
            return IO_AGAIN; /* 0: not for a stream socket; never spin on it */
        return IO_ERROR;
    }
}

/* Sends queued output until done, the socket is full or (--reply-delay-ms) the output is
 * held. Returns octets sent, or -1. */
static ssize_t flush(struct conn *c, uint64_t now_ms)
{
    size_t total = 0, len;
    uint64_t delay = c->ctx->opt.reply_delay_ms;

    c->held = 0;
    for (;;) {
        const uint8_t *out;
        ssize_t w;
        if (!(smtpe_server_want(c->s) & SMTPE_WANT_WRITE)) {
            len = 0;
            break;
        }
        /* held output is not handed out yet: a pregreet 554 may still replace the greeting */
        if (delay > 0 || c->greeting == GREETING_HELD) {
            if (c->hold_until == 0)
                c->hold_until = now_ms + delay;
            if (now_ms < c->hold_until) {
                c->held = 1;
                len = 1;
                break;
            }
        }
        out = smtpe_server_send_buf(c->s, &len);
        w = sock_send(c, out, len);
        if (w == IO_AGAIN)
            break;
        if (w < 0)
            return -1;
        (void)smtpe_server_send_ack(c->s, (size_t)w);
        c->greeting = GREETING_SENT;
        total += (size_t)w;
        c->bytes_out += (uint64_t)w;
    }
    if (len == 0) {
        c->out_since = 0;
        c->hold_until = 0;
    } else if (total > 0 || c->out_since == 0)
        c->out_since = now_ms;
    return (ssize_t)total;
}

/* The client spoke while the greeting was held: 554 5.5.0 in its place, and close. */
static void pregreet(struct conn *c, uint64_t now_ms)
{
    host_log("pregreet sid=%s peer=%s octets=%zu ms=%llu", c->ss.sid, c->ss.peer,
             c->in_len - c->in_off,
             (unsigned long long)(now_ms - c->start_ms));
    session_set_end(&c->ss, "pregreet");
    (void)smtpe_server_close(c->s, 554, "5.5.0", "Protocol error: talked before the greeting");
    c->in_off = c->in_len = 0; /* never the engine's */
    c->greeting = GREETING_SENT;
    c->hold_until = 1; /* no --reply-delay-ms either */
}

/* Feeds the buffered input to the engine and handles its events until it neither consumes
 * octets nor gives events. Returns 0 or a negative SMTPE_ERR_*. */
static int pump(struct conn *c, uint64_t now_ms)
{
    smtpe_event ev;

    for (;;) {
        ssize_t n = 0;
        int took = 0, rc;
        if (c->greeting == GREETING_AFTER_PROXY && pending_output(c)) {
            if (smtpe_server_want(c->s) & SMTPE_WANT_CLOSE) { /* refused: no greeting */
                c->greeting = GREETING_SENT;
            } else {
                c->greeting = GREETING_HELD;
                c->hold_until = now_ms + c->ctx->opt.greet_delay_ms;
                /* After the PROXY verdict the engine restarts its timer from the next time it
                 * is given: the greeting's. */
                (void)smtpe_server_handle_expiry(c->s, c->hold_until);
            }
        }
        if (c->greeting == GREETING_HELD && c->in_off < c->in_len) {
            pregreet(c, now_ms);
            break;
        }
        if (c->in_off < c->in_len) {
            n = smtpe_server_recv(c->s, c->in + c->in_off, c->in_len - c->in_off, now_ms);
            if (n < 0)
                return (int)n;
            c->in_off += (size_t)n;
        }
        while ((rc = smtpe_server_next_event(c->s, &ev)) == 1) {
            took = 1;
            if (ev.type == SMTPE_EV_STARTTLS && c->ctx->tls != NULL && c->tls == NULL &&
                (c->tls = tls_conn_new(c->ctx->tls, c->fd)) == NULL) {
                host_log("error sid=%s peer=%s starttls: out of memory", c->ss.sid, c->ss.peer);
                rc = smtpe_server_reply(c->s, 454, "4.7.0",
                                        "TLS not available due to temporary reason");
                if (rc < 0)
                    return rc;
                continue;
            }
            rc = session_on_event(&c->ss, c->s, &ev, c);
            if (rc < 0)
                return rc;
            if (rc == SESSION_WAIT) /* the verdict comes with conn_on_job */
                break;
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

/* The socket readiness that lets reading (input) and writing (output) go on: under TLS a read
 * may wait for writability and a write for readability. */
static unsigned readiness(const struct conn *c, int input, int output)
{
    unsigned bits = 0;

    if (input)
        bits |= c->read_needs ? c->read_needs : CONN_READ;
    if (output)
        bits |= c->write_needs ? c->write_needs : CONN_WRITE;
    return bits;
}

/* What to wait for now; 0 for nothing but the timer (held output) or the job. */
static unsigned interest(struct conn *c)
{
    unsigned want = smtpe_server_want(c->s);
    int pending = pending_output(c), out = pending && !c->held;

    if (c->eof && c->greeting == GREETING_HELD) /* gone before the greeting */
        return fail(c, "eof");
    if ((want & SMTPE_WANT_CLOSE) || (c->eof && !c->ss.job_pending)) {
        if (pending)
            return readiness(c, 0, out);
        if (!c->eof && c->tls_state == CONN_TLS_NONE && !session_quit(&c->ss)) {
            /* Lingering close: a session ended by us (421 after a timeout, the error limit, out
             * of memory, a PROXY header over --max-clients-per-ip) may have a client still
             * sending; closing with its octets unread makes
             * the kernel reset the connection, which can destroy the last reply before the
             * client reads it. So: FIN, then discard input until the client's EOF or
             * CONN_LINGER_READ_MS. After QUIT nothing may follow (RFC 5321 §4.1.1.10): close. */
            if (c->linger_until == 0) {
                (void)shutdown(c->fd, SHUT_WR);
                c->linger_until = host_now_ms() + CONN_LINGER_READ_MS;
            }
            return CONN_READ;
        }
        return fail(c, "eof"); /* quit, timeout, ... were recorded already */
    }
    if (c->tls_state == CONN_TLS_NONE && (want & SMTPE_WANT_TLS))
        return out ? CONN_WRITE : 0; /* the 220 first; nothing more is read in clear */
    if (!c->eof && c->in_len - c->in_off < CONN_INPUT_BUF)
        return readiness(c, 1, out);
    if (pending || c->ss.job_pending)
        return readiness(c, 0, out);
    /* A full buffer the engine will not take, and nothing to send: cannot happen while every
     * verdict is given at once, but never wait for nothing. */
    host_log("error sid=%s peer=%s input stalled", c->ss.sid, c->ss.peer);
    return fail(c, "io-error");
}

static int read_some(struct conn *c);

/* The engine has accepted STARTTLS and its 220 is out: discard what the client sent after the
 * command (the engine has consumed it), and start the handshake. Returns 0, or -1 (logged). */
static int begin_tls(struct conn *c, uint64_t now_ms)
{
    uint64_t limit = c->ctx->cfg.command_timeout_ms ? c->ctx->cfg.command_timeout_ms
                                                    : CONN_SEND_TIMEOUT_MS;
    smtpe_server_stats st;

    if (c->in_off < c->in_len) { /* the engine always takes them; never hand them to TLS */
        host_log("error sid=%s peer=%s starttls: %zu octets left unread, dropped", c->ss.sid,
                 c->ss.peer, c->in_len - c->in_off);
        c->in_off = c->in_len = 0;
    }
    smtpe_server_get_stats(c->s, &st);
    if (st.discarded_octets > 0)
        host_log("warning sid=%s peer=%s starttls_discarded=%llu (sent after STARTTLS, before "
                 "TLS)",
                 c->ss.sid, c->ss.peer, (unsigned long long)st.discarded_octets);
    if (c->eof)
        return -1;
    if (c->tls == NULL) /* made at the STARTTLS event */
        c->tls = tls_conn_new(c->ctx->tls, c->fd);
    if (c->tls == NULL) {
        host_log("error sid=%s peer=%s tls handshake failed: out of memory", c->ss.sid, c->ss.peer);
        return -1;
    }
    c->tls_state = CONN_TLS_HANDSHAKE;
    c->handshake_deadline = now_ms + limit;
    return 0;
}

/* Runs the handshake as far as the socket allows. Returns 0 once TLS is up (the engine told),
 * or what to wait for (CONN_READ, CONN_WRITE, CONN_CLOSE). */
static unsigned handshake(struct conn *c, uint64_t now_ms)
{
    char version[32], cipher[64];
    int bits, alg_bits, rc = tls_handshake(c->tls);

    if (rc == TLS_WANT_READ)
        return CONN_READ;
    if (rc == TLS_WANT_WRITE)
        return CONN_WRITE;
    if (rc != 0) {
        host_log("error sid=%s peer=%s tls handshake failed: %s", c->ss.sid, c->ss.peer,
                 tls_conn_error(c->tls));
        return fail(c, "tls-error");
    }
    c->tls_state = CONN_TLS_UP;
    c->handshake_deadline = UINT64_MAX;
    tls_conn_info(c->tls, version, sizeof version, cipher, sizeof cipher, &bits, &alg_bits);
    session_tls_up(&c->ss, version, cipher, bits, alg_bits);
    rc = smtpe_server_tls_started(c->s, now_ms);
    if (rc < 0) {
        host_log("error sid=%s peer=%s engine: %s", c->ss.sid, c->ss.peer, smtpe_strerror(rc));
        return fail(c, "io-error");
    }
    return 0;
}

/* Whether the pump should take plaintext TLS holds: the socket will not signal it. */
static int tls_input_waiting(const struct conn *c)
{
    return c->tls_state == CONN_TLS_UP && !c->eof && c->in_len - c->in_off < CONN_INPUT_BUF &&
           tls_pending(c->tls);
}

/* Runs the engine and sends output until neither makes progress. */
static unsigned progress(struct conn *c, uint64_t now_ms)
{
    for (;;) {
        int rc;
        ssize_t sent;
        if (c->tls_state == CONN_TLS_HANDSHAKE) {
            unsigned bits = handshake(c, now_ms);
            if (bits != 0)
                return bits;
        }
        rc = pump(c, now_ms);
        if (rc < 0) {
            host_log("error sid=%s peer=%s engine: %s", c->ss.sid, c->ss.peer, smtpe_strerror(rc));
            return fail(c, "io-error");
        }
        /* A timeout that is due fires here (its event is taken by the next pump); after a
         * verdict this restarts the engine's timer from now. */
        if (smtpe_server_handle_expiry(c->s, now_ms) == 1)
            continue;
        sent = flush(c, now_ms);
        if (sent < 0)
            return fail(c, "io-error");
        if (sent > 0)
            continue;
        if (c->tls_state == CONN_TLS_NONE && (smtpe_server_want(c->s) & SMTPE_WANT_TLS) &&
            !pending_output(c)) {
            if (begin_tls(c, now_ms) < 0)
                return fail(c, c->eof ? "eof" : "tls-error");
            continue;
        }
        if (tls_input_waiting(c)) {
            size_t before = c->in_len - c->in_off;
            if (read_some(c) < 0)
                return fail(c, "io-error");
            if (c->in_len - c->in_off > before || c->eof)
                continue;
        }
        return interest(c);
    }
}

/* The end of every conn_on_* call: input the engine left moves from the loop's scratch
 * buffer to the connection's own. Returns bits, or CONN_CLOSE if memory runs out. */
static unsigned progress(struct conn *c, uint64_t now_ms);

/* Out of memory for input: 421 4.3.0, then the connection closes. Returns CONN_* bits. */
static unsigned nomem_close(struct conn *c, uint64_t now_ms)
{
    c->nomem = 0;
    session_set_end(&c->ss, "out-of-memory");
    session_abort(&c->ss);
    (void)smtpe_server_close(c->s, 421, "4.3.0", "Out of memory, closing the connection");
    c->engine_due = UINT64_MAX; /* closing: the engine keeps no timer */
    return progress(c, now_ms);
}

static unsigned done(struct conn *c, unsigned bits, uint64_t now_ms)
{
    size_t left = c->in_len - c->in_off;

    if (!(bits & CONN_CLOSE)) /* conn_expiry's: the engine's timer from this call's clock */
        c->engine_due = smtpe_server_expiry(c->s, now_ms);

    if ((bits & CONN_CLOSE) || c->in != c->scratch)
        return bits;
    if (left > 0) {
        if (c->own == NULL && (c->own = malloc(CONN_INPUT_BUF)) == NULL) {
            /* the pipelined commands are dropped: 421 once the verdict that waits is out */
            host_log("error sid=%s peer=%s input: out of memory, %zu octets dropped",
                     c->ss.sid, c->ss.peer, left);
            c->in_off = c->in_len = 0;
            c->nomem = 1;
            if (!c->ss.job_pending)
                return nomem_close(c, now_ms);
            return bits;
        }
        memcpy(c->own, c->in + c->in_off, left);
        c->in = c->own;
    }
    c->in_off = 0;
    c->in_len = left;
    return bits;
}

unsigned conn_start(struct conn *c, uint64_t now_ms)
{
    return done(c, progress(c, now_ms), now_ms);
}

/* One read, in clear or through TLS. Returns the octets read (> 0), 0 at the end of the
 * stream, IO_AGAIN or IO_ERROR. */
static ssize_t sock_recv(struct conn *c, uint8_t *p, size_t len)
{
    ssize_t r;

    if (c->tls_state == CONN_TLS_UP) {
        r = tls_read(c->tls, p, len);
        c->read_needs = r == TLS_WANT_WRITE ? CONN_WRITE : 0u;
        if (r > 0)
            return r;
        if (r == TLS_WANT_READ || r == TLS_WANT_WRITE)
            return IO_AGAIN;
        if (r == TLS_CLOSED)
            return 0;
        host_log("error sid=%s peer=%s tls: %s", c->ss.sid, c->ss.peer, tls_conn_error(c->tls));
        return IO_ERROR;
    }
    for (;;) {
        r = recv(c->fd, p, len, 0);
        if (r >= 0)
            return r;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? IO_AGAIN : IO_ERROR;
    }
}

/* One read into the free end of the input buffer. Nothing is read while a STARTTLS handshake
 * is due or running (those octets are TLS's). Returns 0, or -1 on a socket error. */
static int read_some(struct conn *c)
{
    ssize_t r;

    if (c->in_off == c->in_len) { /* nothing waits: read into own if there is one */
        c->in_off = c->in_len = 0;
        c->in = c->own ? c->own : c->scratch;
    } else if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->eof || c->in_len == CONN_INPUT_BUF || c->tls_state == CONN_TLS_HANDSHAKE ||
        (c->tls_state == CONN_TLS_NONE && (smtpe_server_want(c->s) & SMTPE_WANT_TLS)))
        return 0;
    r = sock_recv(c, c->in + c->in_len, CONN_INPUT_BUF - c->in_len);
    if (r > 0) {
        c->in_len += (size_t)r;
        c->bytes_in += (uint64_t)r;
    } else if (r == 0) {
        c->eof = 1;
    }
    return r == IO_ERROR ? -1 : 0;
}

/* Whether the stream's first octets, not yet given to the engine, are a TLS handshake record
 * (RFC 8446 section 5.1: content type 22, legacy version major 3): a client that expected
 * implicit TLS (RFC 8314), e.g. curl smtps:// on port 25. No SMTP command starts with 0x16.
 * Before the greeting is out, pregreet's rule applies instead. */
static int tls_hello_on_plaintext(const struct conn *c)
{
    return c->tls_state == CONN_TLS_NONE && c->greeting == GREETING_SENT && c->in_off == 0 &&
           c->in_len > 0 && c->bytes_in == (uint64_t)c->in_len && c->in[0] == 0x16 &&
           (c->in_len < 2 || c->in[1] == 0x03);
}

/* A ClientHello has no line end the engine could answer soon (the client waits for a
 * ServerHello, the engine for CRLF): the 500 a bad command gets, at once, and close. */
static void tls_hello_refuse(struct conn *c)
{
    session_set_end(&c->ss, "tls-on-plaintext");
    (void)smtpe_server_close(c->s, 500, "5.5.1",
                             "Command unrecognized: a TLS handshake on a port without TLS");
    c->in_off = c->in_len = 0; /* never the engine's */
    c->hold_until = 1;         /* no --reply-delay-ms for the last word */
}

unsigned conn_on_readable(struct conn *c, uint64_t now_ms)
{
    if (c->linger_until != 0) { /* discard until the client closes (a bounded share) */
        for (int i = 0; i < 16; i++) {
            ssize_t r = recv(c->fd, c->scratch, CONN_INPUT_BUF, 0);
            if (r > 0 || (r < 0 && errno == EINTR))
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return CONN_READ;
            return fail(c, "eof");
        }
        return CONN_READ;
    }
    if (read_some(c) < 0)
        return fail(c, "io-error");
    if (tls_hello_on_plaintext(c))
        tls_hello_refuse(c);
    return done(c, progress(c, now_ms), now_ms);
}

unsigned conn_on_writable(struct conn *c, uint64_t now_ms)
{
    if (c->read_needs == CONN_WRITE && read_some(c) < 0) /* a TLS read waited for this */
        return fail(c, "io-error");
    return done(c, progress(c, now_ms), now_ms);
}

int conn_storing(const struct conn *c)
{
    return session_storing(&c->ss);
}

unsigned conn_on_job(struct conn *c, uint64_t now_ms)
{
    int rc = session_job_done(&c->ss, c->s);

    if (rc < 0) {
        host_log("error sid=%s peer=%s engine: %s", c->ss.sid, c->ss.peer, smtpe_strerror(rc));
        return fail(c, "io-error");
    }
    if (c->nomem)
        return nomem_close(c, now_ms);
    return done(c, progress(c, now_ms), now_ms);
}

/* The host's deadline for queued output the client does not read. */
static uint64_t output_deadline(const struct conn *c)
{
    uint64_t limit = c->ctx->cfg.command_timeout_ms ? c->ctx->cfg.command_timeout_ms
                                                    : CONN_SEND_TIMEOUT_MS;

    if (c->out_since == 0 || c->held) /* held by us (--greet/reply-delay-ms): not the client's */
        return UINT64_MAX;
    if (c->eof || (smtpe_server_want(c->s) & SMTPE_WANT_CLOSE))
        limit = CONN_LINGER_MS;
    return c->out_since + limit;
}

uint64_t conn_expiry(const struct conn *c)
{
    uint64_t e = c->engine_due, o = output_deadline(c);

    if (e > o)
        e = o;
    if (c->held && c->hold_until < e)
        e = c->hold_until;
    if (c->linger_until != 0 && c->linger_until < e)
        e = c->linger_until;
    return e < c->handshake_deadline ? e : c->handshake_deadline;
}

unsigned conn_on_timer(struct conn *c, uint64_t now_ms)
{
    if (c->linger_until != 0)
        return c->linger_until <= now_ms ? fail(c, "eof") : CONN_READ;
    if (c->handshake_deadline <= now_ms) {
        host_log("error sid=%s peer=%s tls handshake failed: timeout", c->ss.sid, c->ss.peer);
        return fail(c, "timeout");
    }
    if (output_deadline(c) <= now_ms)
        return fail(c, "timeout");
    (void)smtpe_server_handle_expiry(c->s, now_ms);
    return done(c, progress(c, now_ms), now_ms);
}

void conn_shutdown(struct conn *c, uint64_t now_ms)
{
    session_set_end(&c->ss, "shutdown");
    session_abort(&c->ss);
    (void)smtpe_server_close(c->s, 421, "4.3.2", c->ctx->shutdown_text);
    c->hold_until = 1; /* no --reply-delay-ms for the last word */
    if (c->tls_state != CONN_TLS_HANDSHAKE) /* no clear text in the middle of a handshake */
        (void)flush(c, now_ms);
}

/* The optional fields of the disconnect line: " via=... tls=... auth=... auth_failed=N
 * starttls_discarded=N ids=ID,ID ids_more=N", each only when it applies. */
static void disconnect_extras(const struct conn *c, const smtpe_server_stats *st, char *out,
                              size_t cap)
{
    const struct session *ss = &c->ss;
    char user[3 * AUTH_USER_MAX + 1];
    size_t n = 0;

    out[0] = '\0';
    if (ss->via[0] && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " via=%s", ss->via);
    if (ss->tls && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " tls=%s/%s", ss->tls_version, ss->tls_cipher);
    if (session_auth_name(ss)[0] && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " auth=%s",
                              host_log_token(user, sizeof user, session_auth_name(ss),
                                             strlen(session_auth_name(ss))));
    if (ss->auth_failures && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " auth_failed=%u", ss->auth_failures);
    if (st->discarded_octets && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " starttls_discarded=%llu",
                              (unsigned long long)st->discarded_octets);
    if (ss->log_ids_len > 0 && n < cap)
        n += (size_t)snprintf(out + n, cap - n, " ids=%s", ss->log_ids);
    if (ss->log_ids_more > 0 && n < cap)
        (void)snprintf(out + n, cap - n, " ids_more=%u", ss->log_ids_more);
}

void conn_free(struct conn *c)
{
    smtpe_server_stats st;
    const struct session *ss = &c->ss;
    char helo[3 * 64 + 1];
    char extras[3 * AUTH_USER_MAX + 2 * NET_HOSTPORT_MAX + 256 +
                SESSION_LOG_IDS * (MAILDIR_QUEUE_ID_LEN + 1)];

    smtpe_server_get_stats(c->s, &st);
    disconnect_extras(c, &st, extras, sizeof extras);
    if (session_helo(ss)[0])
        host_log_token(helo, sizeof helo, session_helo(ss), strlen(session_helo(ss)));
    else
        snprintf(helo, sizeof helo, "-");
    /* The socket closed and the seat given back before the line goes out: a connection logged
     * as gone no longer counts against --max-clients (under --model threads the next accept
     * could otherwise still find it seated). */
    tls_conn_free(c->tls); /* a close_notify if the socket takes it at once */
    c->tls = NULL;
    if (close(c->fd) < 0 && errno != EINTR)
        host_log("error sid=%s peer=%s close: %s", ss->sid, ss->peer, strerror(errno));
    if (c->ss.seat.census != NULL)
        census_leave(c->ss.seat.census, c->ss.seat.slot, c->ss.seat.key);
    c->ss.seat.census = NULL;
    host_log("disconnect sid=%s peer=%s helo=%s mail=%u rcpt=%u data=%u delivered=%u errors=%u "
             "in=%llu out=%llu ms=%llu end=%s%s",
             ss->sid, ss->peer, helo,
             ss->mails, ss->rcpts, ss->datas, ss->delivered, st.errors,
             (unsigned long long)c->bytes_in, (unsigned long long)c->bytes_out,
             (unsigned long long)(host_now_ms() - c->start_ms), ss->end ? ss->end : "eof",
             extras);
    session_free(&c->ss);
    free(c->own);
    slot_put(c);
}

int conn_admit(const struct host_ctx *ctx, struct census *census, unsigned slot,
               const struct sockaddr *peer, struct census_seat *seat)
{
    const struct host_options *o = &ctx->opt;

    seat->census = census;
    seat->slot = slot;
    seat->key = census_key(peer);
    if (o->proxy_protocol) {
        if (o->proxy_from_count > 0 && !net_cidr_match_sa(o->proxy_from, o->proxy_from_count, peer))
            return CONN_REJECT_PROXY;
        seat->key = 0; /* a balancer: the client is known from the header */
    }
    return census_enter(census, slot, seat->key);
}

void conn_reject(const struct host_ctx *ctx, int fd, const struct sockaddr *peer, int why,
                 uint64_t now_ms)
{
    smtpe_server *s;
    char where[NET_HOSTPORT_MAX], nomem[HOST_NAME_MAX_LEN + 64], line[HOST_NAME_MAX_LEN + 128];
    unsigned code = why == CONN_REJECT_PROXY ? 554 : 421;
    const char *enh = why == CONN_REJECT_NOMEM   ? "4.3.2"
                      : why == CONN_REJECT_PROXY ? "5.7.1"
                                                 : "4.7.0",
               *text = why == CENSUS_ADDRESS_FULL ? ctx->address_busy_text
                       : why == CONN_REJECT_NOMEM ? nomem
                       : why == CONN_REJECT_PROXY ? "Not a trusted proxy"
                                                  : ctx->busy_text;
    const uint8_t *out = NULL;
    size_t len = 0;
    ssize_t w;

    if (why == CONN_REJECT_NOMEM)
        snprintf(nomem, sizeof nomem, "%s Out of memory, try again later", ctx->opt.hostname);
    s = NULL;
    if (smtpe_server_new(&s, &ctx->cfg, NULL, now_ms) == 0 &&
        smtpe_server_close(s, code, enh, text) == 0)
        out = smtpe_server_send_buf(s, &len);
    if (out == NULL) { /* no memory for an engine: the line without it */
        int n = snprintf(line, sizeof line, "%u %s %s\r\n", code, enh, text);
        out = (const uint8_t *)line;
        len = n > 0 && (size_t)n < sizeof line ? (size_t)n : 0;
    }
    do
        w = send(fd, out, len, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    smtpe_server_free(s);
    host_log_reject(now_ms, NULL, net_hostport(peer, where),
                    why == CENSUS_ADDRESS_FULL ? "too-many-connections-from-address"
                    : why == CONN_REJECT_NOMEM ? "out-of-memory"
                    : why == CONN_REJECT_PROXY ? "not-a-trusted-proxy"
                                               : "too-many-connections");
    (void)close(fd);
}
