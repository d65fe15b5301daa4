/*
 * smtpe-example-event.c - a complete small SMTP server on libevent: how to drive the smtpe engine
 * from an event loop that is not ours. Read it top to bottom; the engine's contract is in
 * smtpe.h. (bindings/libuv/smtpe-example-uv.c is the same server on libuv.)
 *
 * The engine is sans-I/O: it takes the octets we read and gives events, verdict calls and reply
 * octets; the socket, the clock, the timers and the files are ours. What this file shows:
 *   - one session and one read buffer per connection (struct conn); octets the engine leaves
 *     (pipelined commands behind a verdict) stay in the buffer for the next round (pump);
 *   - concurrent verdicts: each RCPT's verdict comes from an asynchronous lookup (an evtimer
 *     standing in for DNS or a database, --rcpt-lookup-ms), so the 50 RCPTs of a pipelined
 *     batch are looked up in parallel, while the replies still leave in command order;
 *   - output without copying: send(2) straight from the engine's reply octets, acknowledging
 *     what the socket took; the rest waits for EV_WRITE (stable output, smtpe_server_send_buf).
 *     No bufferevent: it would copy the octets into its evbuffer (see flush);
 *   - the engine's timeouts on an evtimer (smtpe_server_expiry, smtpe_server_handle_expiry);
 *   - one file per accepted message in DIR: written as DIR/tmp/NAME, then fsync'd and renamed
 *     to DIR/NAME, and only then the 250. The file holds exactly the message content as the
 *     client sent it (dot-unstuffed, CRLF line ends): no Return-Path or Received header, and no
 *     envelope, which a real MTA would keep beside it;
 *   - closing: on the engine's word (QUIT, timeouts) once the last reply is out, on the
 *     client's EOF at once, and on SIGINT/SIGTERM with 421 to every client.
 *
 * Usage: smtpe-example-event --listen ADDR:PORT --dir DIR [--domain D] [--rcpt-lookup-ms N]
 *                            [--command-timeout-ms N] [--data-timeout-ms N]
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

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
    fprintf(f, "usage: smtpe-example-event --listen ADDR:PORT --dir DIR [--domain D]\n"
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
 * an example (the page cache takes it at once); a production host hands it to a thread pool and
 * feeds the engine nothing until it completes, since the chunk points into the read buffer,
 * which the next smtpe_server_recv may overwrite. */
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
static struct event_base *base;
static struct evconnlistener *listener;
static struct event *sigint_watch, *sigterm_watch, *grace_timer;
static int stopping; /* SIGINT/SIGTERM seen */

struct lookup;

struct conn {
    evutil_socket_t fd;     /* the client's socket, non-blocking */
    struct event *readable; /* EV_READ, added while we read */
    struct event *writable; /* EV_WRITE, added while output waits for room in the socket */
    struct event *timer;    /* the engine's timeout; once closing, the linger bound */
    int reading;            /* readable is added */
    uint64_t close_by;      /* closing: when we stop waiting for the client to read */
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

/* The engine's clock: monotonic milliseconds. (event_base_gettimeofday_cached is wall-clock
 * time, which may jump; libevent runs its own timers on a monotonic clock.) */
static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static struct timeval ms_timeval(uint64_t ms)
{
    struct timeval tv;

    tv.tv_sec = (time_t)(ms / 1000u);
    tv.tv_usec = (suseconds_t)(ms % 1000u * 1000u);
    return tv;
}

/* ---------------------------------------------------------------------------------------------
 * RCPT lookups: each an asynchronous operation with its own completion
 * ------------------------------------------------------------------------------------------- */
struct lookup {
    struct event *timer;   /* stands in for the resolver: fires after --rcpt-lookup-ms */
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

/* Unlinks l from its connection and frees it; its timer never fires after this. */
static void lookup_free(struct lookup *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else
        l->c->lookups = l->next;
    if (l->next)
        l->next->prev = l->prev;
    event_free(l->timer);
    free(l);
}

static void on_lookup_done(evutil_socket_t fd, short what, void *arg)
{
    struct lookup *l = arg;
    struct conn *c = l->c;
    int rc = rcpt_verdict(c, l->id, &l->path);

    (void)fd;
    (void)what;
    lookup_free(l);
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
    struct timeval tv = ms_timeval(opt.rcpt_lookup_ms);
    struct lookup *l;

    if (opt.rcpt_lookup_ms == 0)
        return rcpt_verdict(c, ev->id, &ev->rcpt.forward_path);
    l = calloc(1, sizeof *l);
    if (l == NULL || (l->timer = evtimer_new(base, on_lookup_done, l)) == NULL) {
        free(l);
        return smtpe_server_reply_id(c->s, ev->id, 451, "4.3.0", "Out of memory");
    }
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
    evtimer_add(l->timer, &tv);
    return 0;
}

/* Cancels every lookup of c: their callbacks never run, so they never touch a freed session. */
static void lookups_cancel(struct conn *c)
{
    while (c->lookups != NULL)
        lookup_free(c->lookups);
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
 * The pump: after every read, writability, verdict and timer
 * ------------------------------------------------------------------------------------------- */
/* Sends the engine's output with send(2) straight from where the engine keeps it: no copy.
 * A bufferevent would copy it into its evbuffer; evbuffer_add_reference would avoid that, but
 * it reports only when a whole reference is drained, while the engine wants to know each partial
 * write (its reply room is freed as the octets go). A plain EV_WRITE event is simpler and exact.
 * Returns the octets sent (0: none, the socket is full or nothing is queued), or -1. */
static ssize_t flush(struct conn *c)
{
    ssize_t total = 0;
    size_t len;

    for (;;) {
        const uint8_t *out = smtpe_server_send_buf(c->s, &len);
        ssize_t w;
        if (len == 0)
            break;
        w = send(c->fd, out, len, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break; /* EV_WRITE brings us back */
        if (w < 0)
            return -1;
        /* A partial write acknowledges what went; the rest stays where it is (stable output),
         * and the next send_buf gives it, or the ring's second run once this one is out. */
        smtpe_server_send_ack(c->s, (size_t)w);
        total += w;
    }
    if (len > 0)
        event_add(c->writable, NULL);
    else
        event_del(c->writable);
    return total;
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
        event_add(c->readable, NULL);
    else if (!on && c->reading)
        event_del(c->readable);
    c->reading = on;
}

/* The connection's timer to the engine's next deadline. Once the session is closing the engine
 * keeps no timer (the host bounds how long a client may take to read the last reply):
 * LINGER_MS then. */
static void arm_timer(struct conn *c)
{
    uint64_t now = now_ms(), due;
    struct timeval tv;

    if (smtpe_server_want(c->s) & SMTPE_WANT_CLOSE) {
        if (c->close_by == 0)
            c->close_by = now + LINGER_MS;
        due = c->close_by;
    } else {
        due = smtpe_server_expiry(c->s, now); /* UINT64_MAX: none (e.g. verdicts owed) */
    }
    if (due == UINT64_MAX) {
        evtimer_del(c->timer);
        return;
    }
    tv = ms_timeval(due > now ? due - now : 0);
    evtimer_add(c->timer, &tv);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    (void)fd;
    (void)what;
    if (c->close_by != 0) { /* the client did not read our last reply in time */
        conn_close(c);
        return;
    }
    /* Due: 421 4.4.2 queued and SMTPE_EV_TIMEOUT next. Not due (the deadline moved): nothing. */
    smtpe_server_handle_expiry(c->s, now_ms());
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
                                              now_ms());
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

/* Runs the engine until it has nothing more to do now and sends its output, again while sending
 * frees reply room (the engine may then read on); then closes, or sets reading and the timer.
 * Called after every read, writability, verdict and timer. c may be gone when this returns:
 * callers touch it no more. */
static void pump(struct conn *c)
{
    unsigned want;
    ssize_t sent;

    do {
        int rc = run_engine(c);
        if (rc < 0) {
            fprintf(stderr, "error: engine: %s\n", smtpe_strerror(rc));
            conn_close(c);
            return;
        }
        sent = flush(c); /* the replies of the round, in one send if the socket takes them */
    } while (sent > 0);
    if (sent < 0) {
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
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    /* Into the free end of the connection's one buffer (update_reading keeps it non-empty while
     * reading is on). */
    ssize_t r = recv(fd, c->in + c->in_len, sizeof c->in - c->in_len, 0);

    (void)what;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (r <= 0) { /* EOF or an error: the client is gone, and so is what it sent */
        conn_close(c);
        return;
    }
    c->in_len += (size_t)r;
    pump(c);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    pump(arg); /* flush sends what waited, and what the engine can do now follows */
}

/* Drops the connection: its lookups, an unfinished message, the events, the socket, the
 * session. Nothing of it is used after this (libevent runs no callback of a freed event). */
static void conn_close(struct conn *c)
{
    lookups_cancel(c);
    message_discard(&c->msg);
    if (c->prev)
        c->prev->next = c->next;
    else
        conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->readable)
        event_free(c->readable);
    if (c->writable)
        event_free(c->writable);
    if (c->timer)
        event_free(c->timer);
    evutil_closesocket(c->fd);
    smtpe_server_free(c->s);
    free(c);
    if (stopping && conns == NULL)
        evtimer_del(grace_timer); /* the last one: the loop may end */
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *peer,
                      int peer_len, void *arg)
{
    struct conn *c = calloc(1, sizeof *c);
    int one = 1, rc = SMTPE_ERR_NOMEM;

    (void)l;
    (void)peer;
    (void)peer_len;
    (void)arg;
    if (c == NULL) {
        evutil_closesocket(fd);
        return;
    }
    c->fd = fd; /* non-blocking: evconnlistener makes it so */
    c->msg.fd = -1;
    if ((c->next = conns) != NULL)
        conns->prev = c;
    conns = c;
    c->readable = event_new(base, fd, EV_READ | EV_PERSIST, on_readable, c);
    c->writable = event_new(base, fd, EV_WRITE | EV_PERSIST, on_writable, c);
    c->timer = evtimer_new(base, on_timer, c);
    if (c->readable && c->writable && c->timer)
        rc = smtpe_server_new(&c->s, &cfg, NULL, now_ms()); /* queues the 220 greeting */
    if (rc < 0) {
        fprintf(stderr, "error: new session: %s\n", smtpe_strerror(rc));
        conn_close(c);
        return;
    }
    /* replies are short and one may follow another before the client's ACK: no Nagle delay */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pump(c); /* sends the greeting, starts reading and the command timeout */
}

/* ---------------------------------------------------------------------------------------------
 * SIGINT, SIGTERM: no new connections, 421 to every client, exit once they are gone
 * ------------------------------------------------------------------------------------------- */
static void on_grace_over(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    while (conns != NULL)
        conn_close(conns);
}

static void on_signal(evutil_socket_t signum, short what, void *arg)
{
    struct timeval grace = ms_timeval(SHUTDOWN_GRACE_MS);
    struct conn *c, *next;

    (void)signum;
    (void)what;
    (void)arg;
    if (stopping)
        return;
    stopping = 1;
    evconnlistener_free(listener);
    listener = NULL;
    event_del(sigint_watch);
    event_del(sigterm_watch);
    if (conns == NULL)
        return; /* nothing is left to wait for: event_base_dispatch returns */
    evtimer_add(grace_timer, &grace);
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
/* Parses --listen: A.B.C.D:PORT or [IPV6]:PORT. (evutil_parse_sockaddr_port would, but it
 * refuses port 0.) Returns 0, or -1 if spec is not one of these. */
static int parse_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[64];
    const char *colon = strrchr(spec, ':');
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
    int v6 = spec[0] == '[';
    uint64_t port;
    size_t hlen;

    if (colon == NULL || parse_number(colon + 1, &port) < 0 || port > 65535)
        return -1;
    hlen = (size_t)(colon - spec);
    if (v6 && (hlen < 2 || colon[-1] != ']'))
        return -1;
    if (v6) {
        spec++;
        hlen -= 2;
    }
    if (hlen >= sizeof host)
        return -1;
    memcpy(host, spec, hlen);
    host[hlen] = '\0';
    memset(ss, 0, sizeof *ss);
    if (v6) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        *len = sizeof *sin6;
        return evutil_inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1 ? 0 : -1;
    }
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)port);
    *len = sizeof *sin;
    return evutil_inet_pton(AF_INET, host, &sin->sin_addr) == 1 ? 0 : -1;
}

/* Binds and listens on --listen, then prints where. Returns 0 or -1 (errno set). */
static int listen_on(const char *spec)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    socklen_t len;
    char name[64];

    if (parse_listen(spec, &ss, &len) < 0) {
        errno = EINVAL;
        return -1;
    }
    listener = evconnlistener_new_bind(base, on_accept, NULL,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
                                           LEV_OPT_REUSEABLE,
                                       128, (struct sockaddr *)&ss, (int)len);
    len = sizeof ss;
    if (listener == NULL ||
        getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&ss, &len) < 0)
        return -1;
    if (ss.ss_family == AF_INET6)
        evutil_inet_ntop(AF_INET6, &sin6->sin6_addr, name, sizeof name);
    else
        evutil_inet_ntop(AF_INET, &sin->sin_addr, name, sizeof name);
    fprintf(stderr, "listening on %s%s%s:%d\n", ss.ss_family == AF_INET6 ? "[" : "", name,
            ss.ss_family == AF_INET6 ? "]" : "",
            ntohs(ss.ss_family == AF_INET6 ? sin6->sin6_port : sin->sin_port));
    return 0;
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) == 0 || errno == EEXIST)
        return 0;
    fprintf(stderr, "smtpe-example-event: mkdir %s: %s\n", path, strerror(errno));
    return -1;
}

int main(int argc, char **argv)
{
    char tmp[PATH_BUF];

    if (parse_options(argc, argv) < 0) {
        usage(stderr);
        return 2;
    }
    if (engine_config() < 0) {
        fprintf(stderr, "smtpe-example-event: invalid engine config\n");
        return 1;
    }
    snprintf(tmp, sizeof tmp, "%s/tmp", opt.dir);
    if (make_dir(opt.dir) < 0 || make_dir(tmp) < 0)
        return 1;
    signal(SIGPIPE, SIG_IGN); /* a write to a closed connection is an error, not death */
    if ((base = event_base_new()) == NULL) {
        fprintf(stderr, "smtpe-example-event: event_base_new failed\n");
        return 1;
    }
    if (listen_on(opt.listen) < 0) {
        fprintf(stderr, "smtpe-example-event: --listen %s: %s\n", opt.listen, strerror(errno));
        return 1;
    }
    sigint_watch = evsignal_new(base, SIGINT, on_signal, NULL);
    sigterm_watch = evsignal_new(base, SIGTERM, on_signal, NULL);
    grace_timer = evtimer_new(base, on_grace_over, NULL);
    if (sigint_watch == NULL || sigterm_watch == NULL || grace_timer == NULL ||
        event_add(sigint_watch, NULL) < 0 || event_add(sigterm_watch, NULL) < 0) {
        fprintf(stderr, "smtpe-example-event: cannot watch signals\n");
        return 1;
    }

    event_base_dispatch(base); /* until SIGINT/SIGTERM and the last connection is gone */

    event_free(sigint_watch);
    event_free(sigterm_watch);
    event_free(grace_timer);
    event_base_free(base);
    libevent_global_shutdown();
    return 0;
}
