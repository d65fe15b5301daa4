/*
 * loop.c - the shared epoll event loop (see loop.h).
 *
 * Nothing blocks on a client: a session waiting for input costs a registered fd and its fixed
 * memory; a client that does not read its replies only loses its own EPOLLIN; deadlines sit in a
 * heap keyed by conn_expiry(); the fsync of a message and the crypt(3) of an AUTH attempt run in
 * the loop's job pool while the session's verdict waits (its socket is taken out of the epoll
 * set if it has nothing else to wait for). What remains on the loop's thread is CPU work: the
 * engine, the writes of message content into the page cache, TLS.
 */
#include "loop.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "jobs.h"
#include "log.h"
#include "net.h"
#include "signals.h"
#include "timers.h"

#define LOOP_MAX_EVENTS 256
#define LOOP_ACCEPT_PAUSE_MS 100 /* pause after EMFILE & co., so the loop does not spin */
#define LOOP_PAUSE_LOG_MS 10000  /* at most one accept-pause log line per 10 s */

/* One connection as the loop sees it. */
struct lconn {
    struct conn *conn; /* NULL once closed */
    unsigned polled;   /* CONN_READ|CONN_WRITE registered; 0: not in the epoll set */
    struct timer timer;
    struct lconn *prev, *next; /* the open connections; once closed, the graveyard */
};

struct loop {
    const struct host_ctx *ctx;
    int epfd;
    int lfd;                 /* listener, -1 once closed */
    int exclusive;
    int lfd_polled;          /* lfd is registered (not paused) */
    int wake_fd;             /* eventfd written by loop_stop */
    atomic_int stop_level;   /* set by loop_stop */
    struct census *census;
    unsigned slot;
    struct job_pool *pool;
    struct timer_heap timers;
    uint64_t accept_resume;  /* when to re-register a paused listener; UINT64_MAX: not paused */
    struct host_log_limit pause_log; /* accept pauses: a line per LOOP_PAUSE_LOG_MS */
    struct lconn *conns;
    size_t nconns;
    /* Closed connections whose struct may still be named by an event of the batch being
     * handled (a job's return closed it, the same batch also holds its socket's event): freed
     * once the batch is done. */
    struct lconn *graveyard;
    int draining;
    uint64_t drain_deadline;
    unsigned reloads_seen;   /* host_reload_requests() last looked at (wait_mask loops) */
    uint8_t scratch[CONN_INPUT_BUF]; /* lent to every conn_on_* call */
};

/* epoll data.ptr of the descriptors that are not connections */
static char mark_listener, mark_jobs, mark_wake;

static uint32_t lp_events(unsigned bits)
{
    return ((bits & CONN_READ) ? EPOLLIN : 0u) | ((bits & CONN_WRITE) ? EPOLLOUT : 0u);
}

static void lp_close(struct loop *l, struct lconn *lc)
{
    if (lc->prev)
        lc->prev->next = lc->next;
    else
        l->conns = lc->next;
    if (lc->next)
        lc->next->prev = lc->prev;
    (void)timer_set(&l->timers, &lc->timer, TIMER_NONE);
    conn_free(lc->conn); /* closing the fd removes it from the epoll set */
    lc->conn = NULL;
    lc->next = l->graveyard;
    l->graveyard = lc;
    l->nconns--; /* conn_free left the census */
}

/* Acts on what a conn_on_* call returned: close, or re-arm epoll and the deadline. Returns 1
 * if lc is closed (and freed). */
static int lp_after(struct loop *l, struct lconn *lc, unsigned bits)
{
    struct epoll_event ev;
    int op;

    if (bits & CONN_CLOSE) {
        lp_close(l, lc);
        return 1;
    }
    bits &= CONN_READ | CONN_WRITE;
    if (bits != lc->polled) {
        memset(&ev, 0, sizeof ev);
        ev.events = lp_events(bits);
        ev.data.ptr = lc;
        op = lc->polled == 0 ? EPOLL_CTL_ADD : bits == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
        if (epoll_ctl(l->epfd, op, conn_fd(lc->conn), &ev) < 0) {
            host_log("error epoll_ctl: %s", strerror(errno));
            lp_close(l, lc);
            return 1;
        }
        lc->polled = bits;
    }
    if (timer_set(&l->timers, &lc->timer, conn_expiry(lc->conn)) < 0) {
        host_log("error timers: out of memory");
        lp_close(l, lc);
        return 1;
    }
    return 0;
}

/* A session admitted into the census with seat. */
static void lp_add(struct loop *l, int fd, const struct sockaddr *peer,
                   const struct census_seat *seat, uint64_t now)
{
    struct lconn *lc = NULL;

    if (timer_heap_reserve(&l->timers, l->nconns + 1) < 0 ||
        (lc = malloc(sizeof *lc)) == NULL) {
        census_leave(seat->census, seat->slot, seat->key);
        host_log("error accept: out of memory");
        conn_reject(l->ctx, fd, peer, CONN_REJECT_NOMEM, now);
        return;
    }
    if ((lc->conn = conn_new(l->ctx, l->pool, l->scratch, fd, peer, seat, now)) == NULL) {
        host_log("error accept: out of memory");
        free(lc);
        conn_reject(l->ctx, fd, peer, CONN_REJECT_NOMEM, now);
        return;
    }
    conn_set_user(lc->conn, lc);
    lc->polled = 0;
    timer_init(&lc->timer);
    lc->prev = NULL;
    lc->next = l->conns;
    if (l->conns)
        l->conns->prev = lc;
    l->conns = lc;
    l->nconns++;
    lp_after(l, lc, conn_start(lc->conn, now));
}

static void lp_listener_poll(struct loop *l, int on)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | (l->exclusive && on ? EPOLLEXCLUSIVE : 0u);
    ev.data.ptr = &mark_listener;
    if (epoll_ctl(l->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, l->lfd, &ev) < 0)
        host_log("error epoll_ctl listener: %s", strerror(errno));
    else
        l->lfd_polled = on;
}

static void lp_close_listener(struct loop *l)
{
    if (l->lfd >= 0)
        (void)close(l->lfd); /* also leaves the epoll set */
    l->lfd = -1;
    l->lfd_polled = 0;
    l->accept_resume = UINT64_MAX;
}

/* Out of descriptors or memory: stop accepting for a moment instead of spinning on the
 * level-triggered listener. The pending connections wait in the backlog. */
static void lp_accept_pause(struct loop *l, int err, uint64_t now)
{
    unsigned quiet;

    if (host_log_limited(&l->pause_log, now, LOOP_PAUSE_LOG_MS, &quiet))
        host_log("error accept: %s; accepting paused for %d ms (%u times since last report)",
                 strerror(err), LOOP_ACCEPT_PAUSE_MS, quiet + 1);
    lp_listener_poll(l, 0);
    l->accept_resume = now + LOOP_ACCEPT_PAUSE_MS;
}

static void lp_accept(struct loop *l, uint64_t now)
{
    for (int i = 0; i < LOOP_ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(l->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINVAL) { /* shut down by the model: the server is stopping */
                lp_close_listener(l);
                return;
            }
            lp_accept_pause(l, errno, now);
            return;
        }
        struct census_seat seat;
        int rc;
        net_accepted(fd, (struct sockaddr *)&ss);
        now = host_now_ms(); /* a session's timeouts count from its own accept */
        rc = conn_admit(l->ctx, l->census, l->slot, (struct sockaddr *)&ss, &seat);
        if (rc != CENSUS_OK)
            conn_reject(l->ctx, fd, (struct sockaddr *)&ss, rc, now);
        else
            lp_add(l, fd, (struct sockaddr *)&ss, &seat, now);
    }
}

static void lp_bury(struct loop *l)
{
    while (l->graveyard != NULL) {
        struct lconn *lc = l->graveyard;
        l->graveyard = lc->next;
        free(lc);
    }
}

static void lp_dispatch(struct loop *l, struct lconn *lc, uint32_t events)
{
    uint64_t now = host_now_ms();
    unsigned bits = 0;

    if (lc->conn == NULL) /* closed earlier in this batch */
        return;
    /* On EPOLLERR/EPOLLHUP both handlers run: the failing send or recv ends the session. */
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
        bits = conn_on_writable(lc->conn, now);
    if (!(bits & CONN_CLOSE) && (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        bits = conn_on_readable(lc->conn, now);
    lp_after(l, lc, bits);
}

/* Finished jobs: each goes back to its connection, or is released if that is gone. */
static void lp_jobs(struct loop *l)
{
    struct job *j = job_pool_done(l->pool), *next;

    for (; j != NULL; j = next) {
        next = j->next;
        if (j->owner == NULL) {
            j->release(j);
        } else {
            struct conn *c = j->owner;
            lp_after(l, conn_user(c), conn_on_job(c, host_now_ms()));
        }
    }
}

/* Runs conn_on_timer for the connections that are due. Each is visited at most once per call,
 * so a deadline that stays in the past cannot keep the loop here. */
static void lp_timers(struct loop *l, uint64_t now)
{
    size_t budget = l->timers.n;
    struct timer *t;

    while (budget-- > 0 && (t = timer_first(&l->timers)) != NULL && t->when <= now) {
        struct lconn *lc = (struct lconn *)((char *)t - offsetof(struct lconn, timer));
        if (!lp_after(l, lc, conn_on_timer(lc->conn, now)) && lc->timer.when <= now)
            (void)timer_set(&l->timers, &lc->timer, now + 1); /* next round, not now */
    }
}

/* epoll_wait timeout in ms for the next deadline, the drain deadline or accept resumption. */
static int lp_timeout(const struct loop *l, uint64_t now)
{
    const struct timer *first = timer_first(&l->timers);
    uint64_t t = first ? first->when : UINT64_MAX;

    if (l->accept_resume < t)
        t = l->accept_resume;
    if (l->draining && l->drain_deadline < t)
        t = l->drain_deadline;
    if (t == UINT64_MAX)
        return -1;
    if (t <= now)
        return 0;
    return t - now > INT_MAX ? INT_MAX : (int)(t - now);
}

static void lp_begin_drain(struct loop *l, uint64_t now)
{
    host_log("shutdown sessions=%zu drain-seconds=%u", l->nconns, l->ctx->opt.drain_seconds);
    lp_close_listener(l);
    l->draining = 1;
    l->drain_deadline = now + (uint64_t)l->ctx->opt.drain_seconds * 1000u;
}

/* The drain time is over: 421 4.3.2 to every session left, except those whose message is being
 * made durable: they wait for it (lp_wait_jobs), so that a stored message is never answered
 * 421 (the client would send it again). */
static void lp_close_all(struct loop *l, uint64_t now)
{
    struct lconn *lc, *next;

    for (lc = l->conns; lc != NULL; lc = next) {
        next = lc->next;
        if (conn_storing(lc->conn))
            continue;
        conn_shutdown(lc->conn, now);
        lp_close(l, lc);
    }
}

/* Waits for every job still in the pool: a session whose message was being stored gets its
 * verdict, then 421 4.3.2, and is closed; a job whose session is gone is released. */
static void lp_wait_jobs(struct loop *l)
{
    while (job_pool_busy(l->pool) > 0) {
        struct pollfd p = {.fd = job_pool_fd(l->pool), .events = POLLIN};
        struct job *j, *next;
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            break;
        for (j = job_pool_done(l->pool); j != NULL; j = next) {
            next = j->next;
            if (j->owner == NULL) {
                j->release(j);
            } else {
                struct conn *c = j->owner;
                struct lconn *lc = conn_user(c);
                uint64_t now = host_now_ms();
                if (!(conn_on_job(c, now) & CONN_CLOSE))
                    conn_shutdown(c, now);
                lp_close(l, lc);
            }
        }
    }
    lp_close_all(l, host_now_ms()); /* none should be left; never leave one open */
}

/* Deadlines, paused accepts and the stop state, between two epoll waits. Returns 1 when the
 * loop should end. */
static int lp_housekeeping(struct loop *l, const sigset_t *wait_mask)
{
    uint64_t now = host_now_ms();
    int stops = wait_mask ? host_stop_requests() : atomic_load(&l->stop_level);

    if (wait_mask != NULL) /* this loop takes its process' signals: SIGHUP rereads here */
        host_reload_check(l->ctx, &l->reloads_seen);
    lp_timers(l, now);
    if (l->lfd >= 0 && !l->lfd_polled && l->accept_resume <= now) {
        l->accept_resume = UINT64_MAX;
        lp_listener_poll(l, 1);
    }
    if (stops > 0 && !l->draining)
        lp_begin_drain(l, now);
    if (stops > 1) /* a second request: no more waiting */
        l->drain_deadline = now;
    if (l->draining && (l->nconns == 0 || now >= l->drain_deadline)) {
        lp_close_all(l, now);
        lp_wait_jobs(l);
        return 1;
    }
    return 0;
}

static int lp_run(struct loop *l, const sigset_t *wait_mask)
{
    struct epoll_event evs[LOOP_MAX_EVENTS];

    while (!lp_housekeeping(l, wait_mask)) {
        int n;
        lp_bury(l);
        host_log_flush(); /* the lines of this round, before waiting */
        n = epoll_pwait(l->epfd, evs, LOOP_MAX_EVENTS, lp_timeout(l, host_now_ms()),
                            wait_mask);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            host_log("error epoll_wait: %s", strerror(errno));
            lp_close_all(l, host_now_ms());
            lp_wait_jobs(l);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &mark_listener) {
                if (l->lfd >= 0)
                    lp_accept(l, host_now_ms());
            } else if (p == &mark_jobs) {
                lp_jobs(l);
            } else if (p == &mark_wake) {
                uint64_t v;
                while (read(l->wake_fd, &v, sizeof v) < 0 && errno == EINTR)
                    ;
            } else {
                lp_dispatch(l, p, evs[i].events);
            }
        }
    }
    return 0;
}

int loop_run(struct loop *l, const sigset_t *wait_mask)
{
    int rc;

    (void)host_log_batch();
    rc = lp_run(l, wait_mask);
    host_log_unbatch();
    return rc;
}

void loop_stop(struct loop *l, int level)
{
    uint64_t one = 1;

    if (atomic_load(&l->stop_level) < level)
        atomic_store(&l->stop_level, level);
    while (write(l->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

static int lp_watch(struct loop *l, int fd, void *mark)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = mark;
    return epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev);
}

struct loop *loop_new(const struct host_ctx *ctx, int lfd, int exclusive,
                      struct census *census, unsigned slot, unsigned job_threads,
                      char *err, size_t errlen)
{
    struct loop *l = calloc(1, sizeof *l);
    unsigned threads[JOB_QUEUES];

    if (l == NULL) {
        snprintf(err, errlen, "loop: out of memory");
        return NULL;
    }
    l->ctx = ctx;
    l->lfd = lfd;
    l->exclusive = exclusive;
    l->census = census;
    l->slot = slot;
    l->accept_resume = UINT64_MAX;
    l->wake_fd = -1;
    l->reloads_seen = host_reload_requests();
    atomic_init(&l->stop_level, 0);
    timer_heap_init(&l->timers);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
        free(l);
        return NULL;
    }
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wake_fd < 0 || lp_watch(l, l->wake_fd, &mark_wake) < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        loop_free(l);
        return NULL;
    }
    threads[JOB_QUEUE_STORE] = job_threads;
    threads[JOB_QUEUE_AUTH] = (job_threads + 1) / 2;
    if ((l->pool = job_pool_new(threads, err, errlen)) == NULL) {
        loop_free(l);
        return NULL;
    }
    if (lp_watch(l, job_pool_fd(l->pool), &mark_jobs) < 0) {
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        loop_free(l);
        return NULL;
    }
    lp_listener_poll(l, 1);
    if (!l->lfd_polled) {
        snprintf(err, errlen, "epoll_ctl listener: %s", strerror(errno));
        l->lfd = -1; /* still the caller's */
        loop_free(l);
        return NULL;
    }
    return l;
}

void loop_free(struct loop *l)
{
    if (l == NULL)
        return;
    job_pool_free(l->pool);
    lp_bury(l);
    lp_close_listener(l);
    if (l->wake_fd >= 0)
        (void)close(l->wake_fd);
    (void)close(l->epfd);
    timer_heap_free(&l->timers);
    free(l);
}
