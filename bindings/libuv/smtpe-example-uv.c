/*
 * smtpe-example-uv.c - a complete small SMTP server on libuv: how to drive the smtpe engine from
 * an event loop that is not ours. Read it top to bottom; the engine's contract is in smtpe.h.
 * (bindings/libevent/smtpe-example-event.c is the same server on libevent.)
 *
 * The engine is sans-I/O: it takes the octets we read and gives events, verdict calls and reply
 * octets; the socket, the clock, the timers and the files are ours. What this file shows:
 *   - one session and one read buffer per connection (struct conn); octets the engine leaves
 *     (pipelined commands behind a verdict) stay in the buffer for the next round (pump);
 *   - concurrent verdicts: each RCPT's verdict comes from an asynchronous lookup (a uv_timer
 *     standing in for DNS or a database, --rcpt-lookup-ms), so the 50 RCPTs of a pipelined
 *     batch are looked up in parallel, while the replies still leave in command order;
 *   - output without copying: the engine's reply octets go to uv_write where they are, and are
 *     acknowledged when the write completes (stable output, smtpe_server_send_buf);
 *   - the engine's timeouts on a uv_timer (smtpe_server_expiry, smtpe_server_handle_expiry);
 *   - one file per accepted message in DIR: written as DIR/tmp/NAME, then fsync'd and renamed
 *     to DIR/NAME, and only then the 250. The file holds exactly the message content as the
 *     client sent it (dot-unstuffed, CRLF line ends): no Return-Path or Received header, and no
 *     envelope, which a real MTA would keep beside it;
 *   - closing: on the engine's word (QUIT, timeouts) once the last reply is out, on the
 *     client's EOF at once, and on SIGINT/SIGTERM with 421 to every client.
 *
 * Usage: smtpe-example-uv --listen ADDR:PORT --dir DIR [--domain D] [--rcpt-lookup-ms N]
 *                         [--command-timeout-ms N] [--data-timeout-ms N]
 *   --listen 127.0.0.1:2525 or [::1]:2525; port 0 picks one. "listening on ADDR:PORT" (the real
 *   port) goes to stderr once the server is ready, then one line per message stored.
 *   --domain D: RCPT to any other domain gets 550 5.7.1 (without it every domain is ours).
 *   --rcpt-lookup-ms N: each RCPT's verdict comes N ms later (default 0: at once).
 *   --command-timeout-ms, --data-timeout-ms: the engine's timeouts (default 300000, 180000).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "smtpe.h"

#define IN_BUF 65536          /* one connection's read buffer */
#define LINGER_MS 10000       /* closing: how long the client has to read our last reply */
#define SHUTDOWN_GRACE_MS 2000 /* SIGTERM: how long clients have to read the 421 */
#define PATH_BUF 4096

/* ---------------------------------------------------------------------------------------------
 * Options and the engine's config (one config, read-only, shared by every session)
 * ------------------------------------------------------------------------------------------- */
static struct {
    const char *listen, *dir, *domain;
    uint64_t rcpt_lookup_ms, command_timeout_ms, data_timeout_ms;
} opt = {"127.0.0.1:2525", NULL, NULL, 0, 300000, 180000};

static smtpe_server_config cfg;
static char hostname[256]; /* cfg.hostname points here: it must outlive every session */

static void usage(FILE *f)
{
    fprintf(f, "usage: smtpe-example-uv --listen ADDR:PORT --dir DIR [--domain D]\n"
               "         [--rcpt-lookup-ms N] [--command-timeout-ms N] [--data-timeout-ms N]\n");
}

static int parse_number(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv)
{
    for (int i = 1; i < argc; i += 2) {
        const char *name = argv[i], *value = argv[i + 1]; /* argv[argc] is NULL */
        int rc = 0;
        if (value == NULL)
            return -1;
        if (strcmp(name, "--listen") == 0)
            opt.listen = value;
        else if (strcmp(name, "--dir") == 0)
            opt.dir = value;
        else if (strcmp(name, "--domain") == 0)
            opt.domain = value;
        else if (strcmp(name, "--rcpt-lookup-ms") == 0)
            rc = parse_number(value, &opt.rcpt_lookup_ms);
        else if (strcmp(name, "--command-timeout-ms") == 0)
            rc = parse_number(value, &opt.command_timeout_ms);
        else if (strcmp(name, "--data-timeout-ms") == 0)
            rc = parse_number(value, &opt.data_timeout_ms);
        else
            rc = -1;
        if (rc < 0)
            return -1;
    }
    return opt.dir == NULL ? -1 : 0;
}

/* The engine's config. Returns 0, or -1 if the engine finds it invalid. */
static int engine_config(void)
{
    smtpe_server_config_init(&cfg); /* the defaults: PIPELINING, SIZE, 8BITMIME, ... */
    if (gethostname(hostname, sizeof hostname - 1) != 0 || hostname[0] == '\0')
        strcpy(hostname, "localhost");
    cfg.hostname = hostname;
    cfg.max_message_size = 32u << 20;
    cfg.command_timeout_ms = opt.command_timeout_ms;
    cfg.data_timeout_ms = opt.data_timeout_ms;
    /* Concurrent verdicts. A pipelining client (RFC 2920) sends MAIL and its RCPTs in one
     * batch; with room for 100 held commands the engine hands out MAIL and up to 99 RCPTs at
     * once, so their lookups run side by side and the batch costs one lookup's time, not 100.
     * Each held command costs a line buffer: about 110 KiB per session in all. */
    cfg.max_pending_verdicts = 100;
    return smtpe_server_memory_size(&cfg) > 0 ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------
 * Messages: DIR/tmp/NAME while the content arrives, DIR/NAME once it is complete and durable
 * ------------------------------------------------------------------------------------------- */
struct message {
    int fd;           /* the temporary file; -1: none */
    int failed;       /* the errno of a failed write (the end then gets 451); 0: none */
    unsigned rcpts;   /* recipients accepted in this transaction */
    char name[80];    /* <seconds>.<pid>.<counter>.eml, unique in DIR */
};

static void message_path(char *out, const struct message *m, int tmp)
{
    snprintf(out, PATH_BUF, "%s/%s%s", opt.dir, tmp ? "tmp/" : "", m->name);
}

/* Creates DIR/tmp/NAME. Returns 0, or -1 (errno set). */
static int message_open(struct message *m)
{
    static unsigned counter;
    char path[PATH_BUF];

    snprintf(m->name, sizeof m->name, "%lld.%ld.%u.eml", (long long)time(NULL), (long)getpid(),
             ++counter);
    message_path(path, m, 1);
    m->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    m->failed = 0;
    return m->fd < 0 ? -1 : 0;
}

/* Appends one DATA_CHUNK. A blocking write to a local file on the loop's thread is acceptable in
 * an example (the page cache takes it at once); a production host hands it to a thread pool
 * (uv_fs_write) and feeds the engine nothing until it completes, since the chunk points into
 * the read buffer, which the next smtpe_server_recv may overwrite. */
static void message_write(struct message *m, smtpe_span chunk)
{
    const uint8_t *p = chunk.ptr;
    size_t left = chunk.len;

    while (left > 0 && m->fd >= 0 && !m->failed) {
        ssize_t w = write(m->fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            m->failed = errno;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
}

/* Removes an unfinished message (transaction abandoned, refused, client gone). */
static void message_discard(struct message *m)
{
    char path[PATH_BUF];

    if (m->fd < 0)
        return;
    close(m->fd);
    m->fd = -1;
    message_path(path, m, 1);
    unlink(path);
}

/* The content is complete: fsync, close, rename into DIR, fsync DIR. Returns 0 once the message
 * is durable under its final name, -1 (the temporary file removed) if anything failed. */
static int message_commit(struct message *m)
{
    char tmp[PATH_BUF], final[PATH_BUF];
    int fd = m->fd, dir = -1, err = m->failed;

    message_path(tmp, m, 1);
    message_path(final, m, 0);
    m->fd = -1;
    if (err == 0 && fsync(fd) < 0)
        err = errno;
    if (close(fd) < 0 && err == 0)
        err = errno;
    if (err == 0 && rename(tmp, final) < 0)
        err = errno;
    /* The rename itself is durable only once the directory is. */
    if (err == 0 && ((dir = open(opt.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
                     fsync(dir) < 0))
        err = errno;
    if (dir >= 0)
        close(dir);
    if (err != 0) {
        fprintf(stderr, "error: storing %s: %s\n", final, strerror(err));
        unlink(tmp);
        unlink(final); /* the client is told 451 and sends it again */
    }
    return err == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------
 * Connections
 * ------------------------------------------------------------------------------------------- */
static uv_loop_t *loop;
static uv_tcp_t listener;
static uv_signal_t sigint_watch, sigterm_watch;
static uv_timer_t grace_timer;
static int stopping; /* SIGINT/SIGTERM seen */

struct lookup;

struct conn {
    uv_tcp_t tcp;          /* the client's socket */
    uv_timer_t timer;      /* the engine's timeout; once closing, the linger bound */
    uv_write_t write_req;  /* the one write in flight */
    size_t writing;        /* its length; 0: no write in flight */
    int reading;           /* uv_read_start is on */
    int closed;            /* conn_close was called: the handles are closing */
    int handles;           /* handles not yet closed; the memory goes when both are */
    uint64_t close_by;     /* closing: when we stop waiting for the client to read */
    smtpe_server *s;
    struct message msg;
    struct lookup *lookups; /* RCPT verdicts on their way */
    struct conn *prev, *next; /* every connection, for SIGTERM */
    size_t in_off, in_len;  /* the octets read and not yet consumed: in[in_off..in_len) */
    uint8_t in[IN_BUF];
};

static struct conn *conns;

static void pump(struct conn *c);
static void conn_close(struct conn *c);

/* ---------------------------------------------------------------------------------------------
 * RCPT lookups: each an asynchronous operation with its own completion
 * ------------------------------------------------------------------------------------------- */
struct lookup {
    uv_timer_t timer;      /* stands in for the resolver: fires after --rcpt-lookup-ms */
    struct conn *c;
    uint64_t id;           /* the RCPT event's id: the verdict names the event by it */
    smtpe_path path;       /* its forward-path: engine memory, valid until the verdict */
    struct lookup *prev, *next;
};

static int domain_is_ours(const smtpe_path *p)
{
    if (opt.domain == NULL || (p->flags & SMTPE_PATH_POSTMASTER)) /* RFC 5321 §4.5.1 */
        return 1;
    return p->domain.len == strlen(opt.domain) &&
           strncasecmp((const char *)p->domain.ptr, opt.domain, p->domain.len) == 0;
}

/* The verdict for one RCPT, whenever it comes: the engine sends it in its turn. */
static int rcpt_verdict(struct conn *c, uint64_t id, const smtpe_path *p)
{
    int rc;

    if (!domain_is_ours(p))
        return smtpe_server_reply_id(c->s, id, 550, "5.7.1", "Relaying denied");
    /* SMTPE_VOIDED instead of 0: we had refused this RCPT's MAIL, and the engine answered the
     * RCPT 503 already; it is no recipient. (We accept every MAIL, so it does not happen here.) */
    rc = smtpe_server_accept_id(c->s, id);
    if (rc == 0)
        c->msg.rcpts++;
    return rc;
}

static void lookup_unlink(struct lookup *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else
        l->c->lookups = l->next;
    if (l->next)
        l->next->prev = l->prev;
}

static void on_lookup_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_lookup_done(uv_timer_t *t)
{
    struct lookup *l = t->data;
    struct conn *c = l->c;
    int rc = rcpt_verdict(c, l->id, &l->path);

    lookup_unlink(l);
    uv_close((uv_handle_t *)&l->timer, on_lookup_closed);
    if (rc < 0) {
        fprintf(stderr, "error: RCPT verdict: %s\n", smtpe_strerror(rc));
        conn_close(c);
        return;
    }
    pump(c); /* the reply may go out now, and the commands held behind it be read */
}

/* SMTPE_EV_RCPT: starts the lookup. With --rcpt-lookup-ms 0 the answer is at hand and given at
 * once: a host whose decision needs no wait makes no detour through the loop. */
static int lookup_start(struct conn *c, const smtpe_event *ev)
{
    struct lookup *l;

    if (opt.rcpt_lookup_ms == 0)
        return rcpt_verdict(c, ev->id, &ev->rcpt.forward_path);
    if ((l = calloc(1, sizeof *l)) == NULL)
        return smtpe_server_reply_id(c->s, ev->id, 451, "4.3.0", "Out of memory");
    l->c = c;
    l->id = ev->id;
    /* The spans stay valid until this event's verdict (the engine keeps one line buffer per
     * held command), so the lookup may read them when it completes. Verdicts are dropped only
     * when the session closes, and then pump cancels the lookups first. */
    l->path = ev->rcpt.forward_path;
    l->next = c->lookups;
    if (l->next)
        l->next->prev = l;
    c->lookups = l;
    uv_timer_init(loop, &l->timer);
    l->timer.data = l;
    uv_timer_start(&l->timer, on_lookup_done, opt.rcpt_lookup_ms, 0);
    return 0;
}

/* Cancels every lookup of c: their callbacks never run, so they never touch a freed session. */
static void lookups_cancel(struct conn *c)
{
    while (c->lookups != NULL) {
        struct lookup *l = c->lookups;
        lookup_unlink(l);
        uv_close((uv_handle_t *)&l->timer, on_lookup_closed); /* stops it; frees it later */
    }
}

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */
static int on_data_end(struct conn *c, const smtpe_event *ev)
{
    char text[160];

    if (ev->data_end.status != SMTPE_DATA_OK) { /* too big, bad line end: the engine replied */
        message_discard(&c->msg);
        return 0;
    }
    if (message_commit(&c->msg) < 0)
        return smtpe_server_reply_id(c->s, ev->id, 451, "4.3.0", "Cannot store the message");
    fprintf(stderr, "message file=%s/%s size=%llu rcpts=%u\n", opt.dir, c->msg.name,
            (unsigned long long)ev->data_end.size, c->msg.rcpts);
    snprintf(text, sizeof text, "Ok: queued as %s", c->msg.name);
    return smtpe_server_reply_id(c->s, ev->id, 250, "2.0.0", text); /* durable: now the 250 */
}

/* One event. Every event that needs a verdict gets it here, at once, except RCPT, whose verdict
 * comes when its lookup completes. With concurrent verdicts several events may wait at once,
 * so every verdict names its event (the _id calls). Returns 0 or a negative SMTPE_ERR_*. */
static int on_event(struct conn *c, const smtpe_event *ev)
{
    /* RSET, HELO, QUIT, TIMEOUT or ERROR_LIMIT ended a transaction we accepted. Our file exists
     * only during DATA, which only a TIMEOUT interrupts (then the connection closes, which
     * discards it too); a host offering BDAT (CHUNKING) would have one between chunks. */
    if (ev->abandoned)
        message_discard(&c->msg);
    switch (ev->type) {
    case SMTPE_EV_MAIL:
        c->msg.rcpts = 0;
        return smtpe_server_accept_id(c->s, ev->id);
    case SMTPE_EV_RCPT:
        return lookup_start(c, ev);
    case SMTPE_EV_DATA:
        if (message_open(&c->msg) < 0) {
            fprintf(stderr, "error: creating %s/tmp/%s: %s\n", opt.dir, c->msg.name,
                    strerror(errno));
            return smtpe_server_reply_id(c->s, ev->id, 451, "4.3.0", "Cannot store the message");
        }
        return smtpe_server_accept_id(c->s, ev->id); /* 354 */
    case SMTPE_EV_DATA_CHUNK:
        /* Points into c->in, valid until the next smtpe_server_recv: stored before it. */
        message_write(&c->msg, ev->chunk);
        return 0;
    case SMTPE_EV_DATA_END:
        return on_data_end(c, ev);
    default: /* HELO/EHLO, VRFY, ...: the engine's default verdict; RSET, QUIT, ...: none */
        return smtpe_event_needs_reply(ev) ? smtpe_server_accept_id(c->s, ev->id) : 0;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The pump: after every read, write completion, verdict and timer
 * ------------------------------------------------------------------------------------------- */
static void on_written(uv_write_t *req, int status);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void on_timer(uv_timer_t *t);

/* Starts a write of the engine's output unless one is in flight. Returns 0 or a libuv error. */
static int write_start(struct conn *c)
{
    size_t len;
    const uint8_t *out;
    uv_buf_t buf;
    int rc;

    if (c->writing > 0) /* one write at a time; its completion comes back here */
        return 0;
    out = smtpe_server_send_buf(c->s, &len);
    if (len == 0)
        return 0;
    /* Stable output: these octets keep their address and content until acknowledged, whatever
     * we call meanwhile, so uv_write takes them where they are: no copy. (uv_buf_t's base is
     * not const; uv_write only reads it.) */
    buf = uv_buf_init((char *)out, (unsigned)len);
    rc = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &buf, 1, on_written);
    if (rc == 0)
        c->writing = len;
    return rc;
}

static void on_written(uv_write_t *req, int status)
{
    struct conn *c = req->data;
    size_t n = c->writing;

    c->writing = 0;
    if (c->closed) /* cancelled by conn_close (UV_ECANCELED): the session is not ours now */
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    /* uv_write writes everything or fails: all n octets are out. Acknowledging frees reply room
     * (the engine may read more input now) and may bring the ring's second run: pump. */
    smtpe_server_send_ack(c->s, n);
    pump(c);
}

/* Reading from the socket: on while the buffer has room, unless the session is closing or it
 * waits for our verdicts and reads no more (then more input would only pile up unread). When
 * the engine wants input again (SMTPE_WANT_READ), it is on again. */
static void update_reading(struct conn *c)
{
    unsigned want = smtpe_server_want(c->s);
    int on = c->in_len < sizeof c->in && !(want & SMTPE_WANT_CLOSE) &&
             ((want & SMTPE_WANT_READ) || !(want & SMTPE_WANT_VERDICT));

    if (on && !c->reading)
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    else if (!on && c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = on;
}

/* The connection's timer to the engine's next deadline, on the loop's clock (uv_now). Once the
 * session is closing the engine keeps no timer (the host bounds how long a client may take to
 * read the last reply): LINGER_MS then. */
static void arm_timer(struct conn *c)
{
    uint64_t now = uv_now(loop), due;

    if (smtpe_server_want(c->s) & SMTPE_WANT_CLOSE) {
        if (c->close_by == 0)
            c->close_by = now + LINGER_MS;
        due = c->close_by;
    } else {
        due = smtpe_server_expiry(c->s, now); /* UINT64_MAX: none (e.g. verdicts owed) */
    }
    if (due == UINT64_MAX)
        uv_timer_stop(&c->timer);
    else
        uv_timer_start(&c->timer, on_timer, due > now ? due - now : 0, 0);
}

static void on_timer(uv_timer_t *t)
{
    struct conn *c = t->data;

    if (c->close_by != 0) { /* the client did not read our last reply in time */
        conn_close(c);
        return;
    }
    /* Due: 421 4.4.2 queued and SMTPE_EV_TIMEOUT next. Not due (the deadline moved): nothing. */
    smtpe_server_handle_expiry(c->s, uv_now(loop));
    pump(c);
}

/* Feeds the octets held while the engine takes them, and takes and answers every event, until
 * neither gives anything more. Returns 0 or a negative SMTPE_ERR_*. */
static int run_engine(struct conn *c)
{
    smtpe_event ev;
    int progress;

    do {
        progress = 0;
        if (c->in_off < c->in_len && (smtpe_server_want(c->s) & SMTPE_WANT_READ)) {
            smtpe_ssize n = smtpe_server_recv(c->s, c->in + c->in_off, c->in_len - c->in_off,
                                              uv_now(loop));
            if (n < 0)
                return (int)n;
            c->in_off += (size_t)n;
            progress = n > 0;
        }
        while (smtpe_server_next_event(c->s, &ev) == 1) {
            int rc = on_event(c, &ev);
            if (rc < 0)
                return rc;
            progress = 1;
        }
    } while (progress);
    /* What the engine left (pipelined commands) moves to the front of the buffer. The chunks
     * of this round point into it, but they are written out already. */
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
    return 0;
}

/* Runs the engine until it has nothing more to do now, starts the write of its output; then
 * closes, or sets reading and the timer. Called after every read, write completion, verdict and
 * timer. c may be gone when this returns: callers touch it no more. */
static void pump(struct conn *c)
{
    unsigned want;
    int rc = run_engine(c);

    if (rc < 0) {
        fprintf(stderr, "error: engine: %s\n", smtpe_strerror(rc));
        conn_close(c);
        return;
    }
    if (write_start(c) < 0) {
        conn_close(c);
        return;
    }
    want = smtpe_server_want(c->s);
    if (want & SMTPE_WANT_CLOSE) {
        lookups_cancel(c); /* their verdicts were dropped with the session */
        if (!(want & SMTPE_WANT_WRITE)) { /* the last reply is acknowledged: done */
            conn_close(c);
            return;
        }
    }
    update_reading(c);
    arm_timer(c);
}

/* ---------------------------------------------------------------------------------------------
 * Reading, accepting, closing
 * ------------------------------------------------------------------------------------------- */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;

    (void)suggested;
    /* The free end of the connection's one buffer (update_reading keeps it non-empty while
     * reading is on). */
    *buf = uv_buf_init((char *)c->in + c->in_len, (unsigned)(sizeof c->in - c->in_len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = stream->data;

    (void)buf;
    if (nread < 0) { /* UV_EOF or an error: the client is gone, and so is what it sent */
        conn_close(c);
        return;
    }
    c->in_len += (size_t)nread; /* 0: nothing this time */
    pump(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;

    if (--c->handles > 0)
        return;
    /* Both handles are closed, so no write can still be reading the engine's output. */
    smtpe_server_free(c->s);
    if (stopping && conns == NULL && !uv_is_closing((uv_handle_t *)&grace_timer))
        uv_close((uv_handle_t *)&grace_timer, NULL); /* the last one: the loop may end */
    free(c);
}

/* Drops the connection: its lookups, an unfinished message, the socket, the session. */
static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    lookups_cancel(c);
    message_discard(&c->msg);
    if (c->prev)
        c->prev->next = c->next;
    else
        conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed); /* a write in flight is cancelled */
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* Out of memory for a connection: it must still be accepted (libuv watches the listener no more
 * until it is), here, and closed at once; one at a time, the next once this one is closed. */
static uv_tcp_t refused;
static int refused_busy, refused_waiting;

static void on_connection(uv_stream_t *server, int status);

static void on_refused_closed(uv_handle_t *h)
{
    (void)h;
    refused_busy = 0;
    if (refused_waiting && !stopping) {
        refused_waiting = 0;
        on_connection((uv_stream_t *)&listener, 0);
    }
}

static void refuse(uv_stream_t *server)
{
    if (refused_busy) {
        refused_waiting = 1;
        return;
    }
    refused_busy = 1;
    uv_tcp_init(loop, &refused);
    uv_accept(server, (uv_stream_t *)&refused);
    uv_close((uv_handle_t *)&refused, on_refused_closed);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct conn *c;
    int rc;

    if (status < 0)
        return;
    if ((c = calloc(1, sizeof *c)) == NULL) {
        refuse(server);
        return;
    }
    uv_tcp_init(loop, &c->tcp);
    uv_timer_init(loop, &c->timer);
    c->tcp.data = c->timer.data = c->write_req.data = c;
    c->handles = 2;
    c->msg.fd = -1;
    if ((c->next = conns) != NULL)
        conns->prev = c;
    conns = c;
    if ((rc = uv_accept(server, (uv_stream_t *)&c->tcp)) < 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* replies are short and each write waits for the last one */
    rc = smtpe_server_new(&c->s, &cfg, NULL, uv_now(loop)); /* queues the 220 greeting */
    if (rc < 0) {
        fprintf(stderr, "error: new session: %s\n", smtpe_strerror(rc));
        conn_close(c);
        return;
    }
    pump(c); /* sends the greeting, starts reading and the command timeout */
}

/* ---------------------------------------------------------------------------------------------
 * SIGINT, SIGTERM: no new connections, 421 to every client, exit once they are gone
 * ------------------------------------------------------------------------------------------- */
static void on_grace_over(uv_timer_t *t)
{
    (void)t;
    while (conns != NULL)
        conn_close(conns);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    struct conn *c, *next;

    (void)sig;
    (void)signum;
    if (stopping)
        return;
    stopping = 1;
    uv_close((uv_handle_t *)&listener, NULL);
    uv_close((uv_handle_t *)&sigint_watch, NULL);
    uv_close((uv_handle_t *)&sigterm_watch, NULL);
    if (conns == NULL) {
        uv_close((uv_handle_t *)&grace_timer, NULL);
        return;
    }
    uv_timer_start(&grace_timer, on_grace_over, SHUTDOWN_GRACE_MS, 0);
    for (c = conns; c != NULL; c = next) {
        next = c->next;
        lookups_cancel(c);
        message_discard(&c->msg); /* the client never saw its 250 */
        (void)smtpe_server_close(c->s, 421, "4.3.2", "Service shutting down");
        pump(c); /* sends the 421 and closes once it is out */
    }
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */
/* Parses --listen: A.B.C.D:PORT or [IPV6]:PORT. Returns 0 or UV_EINVAL. */
static int parse_listen(const char *spec, struct sockaddr_storage *ss)
{
    char host[64];
    const char *colon = strrchr(spec, ':');
    int v6 = spec[0] == '[';
    uint64_t port;
    size_t hlen;

    if (colon == NULL || parse_number(colon + 1, &port) < 0 || port > 65535)
        return UV_EINVAL;
    hlen = (size_t)(colon - spec);
    if (v6 && (hlen < 2 || colon[-1] != ']'))
        return UV_EINVAL;
    if (v6) {
        spec++;
        hlen -= 2;
    }
    if (hlen >= sizeof host)
        return UV_EINVAL;
    memcpy(host, spec, hlen);
    host[hlen] = '\0';
    return v6 ? uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss)
              : uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss);
}

/* Binds and listens on --listen, then prints where. Returns 0 or a libuv error. */
static int listen_on(const char *spec)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    int len = sizeof ss, rc;
    char name[64];

    if ((rc = parse_listen(spec, &ss)) < 0 || (rc = uv_tcp_init(loop, &listener)) < 0)
        return rc;
    if ((rc = uv_tcp_bind(&listener, (struct sockaddr *)&ss, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&listener, 128, on_connection)) < 0 ||
        (rc = uv_tcp_getsockname(&listener, (struct sockaddr *)&ss, &len)) < 0)
        return rc;
    if (ss.ss_family == AF_INET6)
        uv_ip6_name(sin6, name, sizeof name);
    else
        uv_ip4_name(sin, name, sizeof name);
    fprintf(stderr, "listening on %s%s%s:%d\n", ss.ss_family == AF_INET6 ? "[" : "", name,
            ss.ss_family == AF_INET6 ? "]" : "",
            ntohs(ss.ss_family == AF_INET6 ? sin6->sin6_port : sin->sin_port));
    return 0;
}

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) == 0 || errno == EEXIST)
        return 0;
    fprintf(stderr, "smtpe-example-uv: mkdir %s: %s\n", path, strerror(errno));
    return -1;
}

int main(int argc, char **argv)
{
    char tmp[PATH_BUF];
    int rc;

    if (parse_options(argc, argv) < 0) {
        usage(stderr);
        return 2;
    }
    if (engine_config() < 0) {
        fprintf(stderr, "smtpe-example-uv: invalid engine config\n");
        return 1;
    }
    snprintf(tmp, sizeof tmp, "%s/tmp", opt.dir);
    if (make_dir(opt.dir) < 0 || make_dir(tmp) < 0)
        return 1;
    signal(SIGPIPE, SIG_IGN); /* a write to a closed connection is an error, not death */
    loop = uv_default_loop();
    if ((rc = listen_on(opt.listen)) < 0) {
        fprintf(stderr, "smtpe-example-uv: --listen %s: %s\n", opt.listen, uv_strerror(rc));
        return 1;
    }
    uv_signal_init(loop, &sigint_watch);
    uv_signal_init(loop, &sigterm_watch);
    uv_signal_start(&sigint_watch, on_signal, SIGINT);
    uv_signal_start(&sigterm_watch, on_signal, SIGTERM);
    uv_timer_init(loop, &grace_timer);

    uv_run(loop, UV_RUN_DEFAULT); /* until SIGINT/SIGTERM and the last connection is gone */

    uv_walk(loop, close_handle, NULL); /* nothing should be left; close it if it is */
    uv_run(loop, UV_RUN_DEFAULT);
    return uv_loop_close(loop) == 0 ? 0 : 1;
}
