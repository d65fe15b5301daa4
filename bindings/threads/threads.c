/*
 * threads.c - the threads host model: the main thread accepts, and each connection gets a
 * thread of its own (128 KiB stack) that waits on that one socket with poll(2) and runs the
 * connection pump (host/conn.c) as the socket and the session's deadline say. The blocking
 * steps (the fsync of a stored message, crypt(3) for AUTH) simply run on the session's thread:
 * blocking is what a thread is for.
 *
 * What it demonstrates: the engine does not care who drives it; the same pump that an event
 * loop calls on readiness runs here in a plain loop per connection, and the code reads top to
 * bottom. It is the study's "thread per connection".
 *
 * When to pick it: moderate concurrency (hundreds to a few thousand sessions), or a host whose
 * verdicts must call blocking code (a database, an LDAP lookup) without a job pool. Each
 * session costs a thread (its stack pages and a kernel task) and a context switch per wakeup,
 * so at tens of thousands of sessions the event models use far less memory and CPU.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host/census.h"
#include "host/conn.h"
#include "host/log.h"
#include "host/models.h"
#include "host/net.h"
#include "host/signals.h"

#define TH_STACK_SIZE (128u * 1024u)
#define TH_ACCEPT_PAUSE_MS 100 /* after EMFILE & co. */
#define TH_POLL_MS 100         /* while draining, how often the main thread looks */
#define TH_ERROR_LOG_MS 10000  /* at most one line per 10 s per kind of accept error */

/* What every connection thread shares with the main thread. */
struct th_shared {
    const struct host_ctx *ctx;
    atomic_uint active;             /* connection threads running */
    struct census *census;          /* --max-clients, --max-clients-per-ip: one slot */
    atomic_uint_least64_t deadline; /* the drain deadline; UINT64_MAX before a stop */
    int drain_fd;                   /* readable from the first stop request on */
    int now_fd;                     /* readable from the second (drain no longer) */
    /* Connection threads that have ended, for the main thread to join (a thread is joined,
     * not detached, so that the process never exits while one is still tearing down). */
    pthread_mutex_t done_lock;
    struct th_conn *done;
    int reap_fd;                    /* readable when done was empty and got a thread */
};

static struct host_log_limit th_create_errors, th_accept_errors; /* main thread only */

struct th_conn {
    struct th_shared *sh;
    pthread_t thread;
    struct th_conn *next;           /* on sh->done */
    int fd;
    struct sockaddr_storage peer;
    struct census_seat seat;
};

static short th_events(unsigned bits)
{
    return (short)(((bits & CONN_READ) ? POLLIN : 0) | ((bits & CONN_WRITE) ? POLLOUT : 0));
}

/* One connection, start to end. */
static void th_serve(struct th_shared *sh, int fd, const struct sockaddr *peer,
                     const struct census_seat *seat)
{
    uint8_t scratch[CONN_INPUT_BUF];
    uint64_t now = host_now_ms();
    struct conn *c = conn_new(sh->ctx, NULL, scratch, fd, peer, seat, now);
    struct pollfd p[3];
    unsigned bits;
    int watch_drain = 1, watch_now = 1;

    if (c == NULL) {
        host_log("error accept: out of memory");
        conn_reject(sh->ctx, fd, peer, CONN_REJECT_NOMEM, now);
        return;
    }
    bits = conn_start(c, now);
    while (!(bits & CONN_CLOSE)) {
        uint64_t due = conn_expiry(c), deadline = atomic_load(&sh->deadline);
        int timeout, nfds = 1;
        short ev;
        now = host_now_ms();
        if (deadline <= now) { /* the drain is over */
            conn_shutdown(c, now);
            break;
        }
        if (deadline < due)
            due = deadline;
        timeout = due == UINT64_MAX ? -1 : due <= now ? 0
                : due - now > INT_MAX ? INT_MAX : (int)(due - now);
        p[0] = (struct pollfd){.fd = fd, .events = th_events(bits)};
        if (watch_drain)
            p[nfds++] = (struct pollfd){.fd = sh->drain_fd, .events = POLLIN};
        if (watch_now)
            p[nfds++] = (struct pollfd){.fd = sh->now_fd, .events = POLLIN};
        if (poll(p, (nfds_t)nfds, timeout) < 0) {
            if (errno == EINTR)
                continue;
            host_log("error poll: %s", strerror(errno));
            conn_shutdown(c, host_now_ms());
            break;
        }
        now = host_now_ms();
        /* A stop fd stays readable: once seen, the new deadline is all that matters. */
        for (int i = 1; i < nfds; i++) {
            if (p[i].revents & POLLIN) {
                if (p[i].fd == sh->drain_fd)
                    watch_drain = 0;
                else
                    watch_now = 0;
            }
        }
        ev = p[0].revents;
        if (ev & (POLLOUT | POLLERR | POLLHUP))
            bits = conn_on_writable(c, now);
        if (!(bits & CONN_CLOSE) && (ev & (POLLIN | POLLERR | POLLHUP)))
            bits = conn_on_readable(c, now);
        if (!(bits & CONN_CLOSE) && !(ev & (POLLIN | POLLOUT | POLLERR | POLLHUP)))
            bits = conn_on_timer(c, now); /* a deadline, or a stop fd; harmless if not due */
    }
    conn_free(c);
}

static void th_signal(int fd)
{
    uint64_t one = 1;

    while (write(fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

static void *th_main(void *arg)
{
    struct th_conn *tc = arg;
    struct th_shared *sh = tc->sh;

    int was_empty;

    th_serve(sh, tc->fd, (struct sockaddr *)&tc->peer, &tc->seat);
    pthread_mutex_lock(&sh->done_lock);
    was_empty = sh->done == NULL;
    tc->next = sh->done;
    sh->done = tc;
    pthread_mutex_unlock(&sh->done_lock);
    if (was_empty)
        th_signal(sh->reap_fd);
    atomic_fetch_sub(&sh->active, 1); /* after the push: active 0 means all are on done */
    return NULL;
}

/* Joins and frees the connection threads that have ended. */
static void th_reap(struct th_shared *sh)
{
    struct th_conn *tc;
    uint64_t v;

    (void)read(sh->reap_fd, &v, sizeof v); /* non-blocking */
    pthread_mutex_lock(&sh->done_lock);
    tc = sh->done;
    sh->done = NULL;
    pthread_mutex_unlock(&sh->done_lock);
    while (tc != NULL) {
        struct th_conn *next = tc->next;
        (void)pthread_join(tc->thread, NULL);
        free(tc);
        tc = next;
    }
}

static void th_start(struct th_shared *sh, const pthread_attr_t *attr, int fd,
                     const struct sockaddr_storage *peer)
{
    struct census_seat seat;
    struct th_conn *tc;
    int e;

    if ((e = conn_admit(sh->ctx, sh->census, 0, (const struct sockaddr *)peer, &seat)) !=
        CENSUS_OK) {
        conn_reject(sh->ctx, fd, (const struct sockaddr *)peer, e, host_now_ms());
        return;
    }
    if ((tc = malloc(sizeof *tc)) == NULL) {
        census_leave(sh->census, 0, seat.key);
        host_log("error accept: out of memory");
        conn_reject(sh->ctx, fd, (const struct sockaddr *)peer, CONN_REJECT_NOMEM,
                    host_now_ms());
        return;
    }
    tc->sh = sh;
    tc->fd = fd;
    tc->peer = *peer;
    tc->seat = seat;
    atomic_fetch_add(&sh->active, 1);
    e = pthread_create(&tc->thread, attr, th_main, tc);
    if (e != 0) {
        unsigned quiet;
        atomic_fetch_sub(&sh->active, 1);
        census_leave(sh->census, 0, seat.key);
        if (host_log_limited(&th_create_errors, host_now_ms(), TH_ERROR_LOG_MS, &quiet))
            host_log("error pthread_create: %s; connection refused (%u more since the last "
                     "report)", strerror(e), quiet);
        conn_reject(sh->ctx, fd, (const struct sockaddr *)peer, CENSUS_FULL, host_now_ms());
        free(tc);
    }
}

/* Accepts what is waiting. Returns 0, or -1 after EMFILE & co. (pause accepting). */
static int th_accept(struct th_shared *sh, const pthread_attr_t *attr, int lfd)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            unsigned quiet;
            if (host_log_limited(&th_accept_errors, host_now_ms(), TH_ERROR_LOG_MS,
                                 &quiet))
                host_log("error accept: %s; accepting paused for %d ms (%u times since the "
                         "last report)", strerror(errno), TH_ACCEPT_PAUSE_MS, quiet + 1);
            return -1;
        }
        net_accepted(fd, (struct sockaddr *)&ss);
        th_start(sh, attr, fd, &ss);
    }
}

int threads_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask)
{
    struct th_shared sh;
    pthread_attr_t attr;
    char err[256];
    int lfd, told = 0;
    unsigned reloads = host_reload_requests();
    uint64_t resume = 0;

    memset(&sh, 0, sizeof sh);
    sh.ctx = ctx;
    atomic_init(&sh.active, 0);
    atomic_init(&sh.deadline, UINT64_MAX);
    sh.drain_fd = eventfd(0, EFD_CLOEXEC);
    sh.now_fd = eventfd(0, EFD_CLOEXEC);
    sh.reap_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&sh.done_lock, NULL);
    sh.census = census_new(1, ctx->opt.max_clients, ctx->opt.max_clients_per_ip, 0);
    lfd = sh.census == NULL ? -1 : net_listen((const struct sockaddr *)&ctx->opt.listen_addr, ctx->opt.listen_addr_len,
                     0, err, sizeof err);
    if (sh.drain_fd < 0 || sh.now_fd < 0 || sh.reap_fd < 0 || lfd < 0) {
        host_log("error %s", lfd < 0 && sh.census != NULL ? err : strerror(errno));
        census_free(sh.census);
        if (lfd >= 0)
            (void)close(lfd);
        if (sh.drain_fd >= 0)
            (void)close(sh.drain_fd);
        if (sh.now_fd >= 0)
            (void)close(sh.now_fd);
        if (sh.reap_fd >= 0)
            (void)close(sh.reap_fd);
        pthread_mutex_destroy(&sh.done_lock);
        return 1;
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, TH_STACK_SIZE);
    host_announce_listener(lfd);
    /* The connection threads inherit the blocked SIGTERM/SIGINT (and SIGHUP): only this thread
     * takes them, in ppoll. */
    for (;;) {
        int stops = host_stop_requests();
        uint64_t now = host_now_ms();
        struct pollfd p[2] = {{.fd = sh.reap_fd, .events = POLLIN},
                              {.fd = lfd, .events = POLLIN}};
        struct timespec ts = {.tv_sec = 0, .tv_nsec = TH_POLL_MS * 1000000L};
        int n;
        host_reload_check(ctx, &reloads); /* SIGHUP: the sessions' next RCPT sees it */
        if (stops > told) {
            if (told == 0) {
                host_log("shutdown sessions=%u drain-seconds=%u", atomic_load(&sh.active),
                         ctx->opt.drain_seconds);
                (void)close(lfd);
                lfd = -1;
                atomic_store(&sh.deadline, now + (uint64_t)ctx->opt.drain_seconds * 1000u);
                th_signal(sh.drain_fd);
            }
            if (stops > 1) {
                atomic_store(&sh.deadline, now);
                th_signal(sh.now_fd);
            }
            told = stops;
        }
        th_reap(&sh);
        if (lfd < 0) {
            if (atomic_load(&sh.active) == 0)
                break;
            (void)ppoll(p, 1, &ts, wait_mask);
            continue;
        }
        if (resume > now) {
            ts.tv_nsec = (long)(resume - now) * 1000000L;
            n = ppoll(p, 1, &ts, wait_mask);
            continue;
        }
        n = ppoll(p, 2, NULL, wait_mask);
        if (n > 0 && (p[1].revents & POLLIN) && th_accept(&sh, &attr, lfd) < 0)
            resume = host_now_ms() + TH_ACCEPT_PAUSE_MS;
    }
    th_reap(&sh); /* every thread is on the list: active is 0 */
    pthread_mutex_destroy(&sh.done_lock);
    (void)close(sh.reap_fd);
    pthread_attr_destroy(&attr);
    census_free(sh.census); /* every thread has left it: active counts down after conn_free */
    (void)close(sh.drain_fd);
    (void)close(sh.now_fd);
    return 0;
}
