/*
 * epoll.c - the epoll host model: one process, one thread, one level-triggered epoll loop that
 * accepts, reads, writes and times out every connection.
 *
 * What it demonstrates: the sans-I/O engine driven purely by readiness. Nothing blocks on a
 * client: a session waiting for input costs a registered fd and its fixed memory, a client that
 * does not read its replies only loses its own EPOLLIN, and timers are a lazily kept minimum
 * over conn_expiry() (re-swept when it comes due). The blocking steps are the Maildir fsync at
 * the end of a message, which holds up the loop for the length of the fsync, and with
 * --auth-users the crypt(3) of each AUTH attempt (a few milliseconds by design, more with a
 * costly hash); a TLS handshake's public-key operation is CPU time of the loop too.
 *
 * When to pick it: the default, and the baseline for the other models. It uses one core; with
 * many concurrent senders on a disk with slow fsync, or to use more cores, pick a model with
 * several loops or threads.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host/conn.h"
#include "host/log.h"
#include "host/models.h"
#include "host/net.h"
#include "host/signals.h"

#define EP_MAX_EVENTS 128
#define EP_ACCEPT_BATCH 64      /* accepts per wakeup, so a flood cannot starve the sessions */
#define EP_ACCEPT_PAUSE_MS 100  /* pause after EMFILE & co., so the loop does not spin */
#define EP_SWEEP_MIN_MS 10      /* least time between two timer sweeps */
#define EP_PAUSE_LOG_MS 10000   /* at most one accept-pause log line per 10 s */

/* One connection as the loop sees it. */
struct ep_conn {
    struct conn *conn;
    unsigned polled; /* CONN_READ|CONN_WRITE registered with epoll */
    struct ep_conn *prev, *next;
};

struct ep_loop {
    const struct host_ctx *ctx;
    int epfd;
    int lfd;                 /* listener, -1 once closed */
    int lfd_polled;          /* lfd is registered (not paused) */
    uint64_t accept_resume;  /* when to re-register a paused listener; UINT64_MAX: not paused */
    uint64_t pause_logged;   /* when a pause was last logged, 0: never */
    unsigned pauses;         /* pauses since then */
    struct ep_conn *conns;
    size_t nconns;
    uint64_t next_timer;     /* no conn_expiry is earlier than this */
    uint64_t last_sweep;
    int draining;
    uint64_t drain_deadline;
};

static uint32_t ep_events(unsigned bits)
{
    return ((bits & CONN_READ) ? EPOLLIN : 0u) | ((bits & CONN_WRITE) ? EPOLLOUT : 0u);
}

static void ep_close(struct ep_loop *l, struct ep_conn *ec)
{
    if (ec->prev)
        ec->prev->next = ec->next;
    else
        l->conns = ec->next;
    if (ec->next)
        ec->next->prev = ec->prev;
    conn_free(ec->conn); /* closing the fd removes it from the epoll set */
    free(ec);
    l->nconns--;
}

/* Acts on what a conn_on_* call returned: close, or re-arm epoll and the timer. */
static void ep_after(struct ep_loop *l, struct ep_conn *ec, unsigned bits)
{
    struct epoll_event ev;
    uint64_t e;

    if (bits & CONN_CLOSE) {
        ep_close(l, ec);
        return;
    }
    bits &= CONN_READ | CONN_WRITE;
    if (bits != ec->polled) {
        memset(&ev, 0, sizeof ev);
        ev.events = ep_events(bits);
        ev.data.ptr = ec;
        if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, conn_fd(ec->conn), &ev) < 0) {
            host_log("error epoll_ctl: %s", strerror(errno));
            ep_close(l, ec);
            return;
        }
        ec->polled = bits;
    }
    e = conn_expiry(ec->conn);
    if (e < l->next_timer)
        l->next_timer = e;
}

static void ep_add(struct ep_loop *l, int fd, const struct sockaddr *peer, uint64_t now)
{
    struct ep_conn *ec = malloc(sizeof *ec);
    struct epoll_event ev;

    if (ec == NULL || (ec->conn = conn_new(l->ctx, fd, peer, now)) == NULL) {
        host_log("error accept: out of memory");
        free(ec);
        (void)close(fd);
        return;
    }
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = ec;
    ec->polled = CONN_READ;
    ec->prev = NULL;
    ec->next = l->conns;
    if (l->conns)
        l->conns->prev = ec;
    l->conns = ec;
    l->nconns++;
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        host_log("error epoll_ctl: %s", strerror(errno));
        ep_close(l, ec);
        return;
    }
    ep_after(l, ec, conn_start(ec->conn, now));
}

static void ep_listener_poll(struct ep_loop *l, int on)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.ptr = NULL; /* NULL marks the listener */
    if (epoll_ctl(l->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, l->lfd, &ev) < 0)
        host_log("error epoll_ctl listener: %s", strerror(errno));
    else
        l->lfd_polled = on;
}

/* Out of descriptors or memory: stop accepting for a moment instead of spinning on the
 * level-triggered listener. The pending connections wait in the backlog. */
static void ep_accept_pause(struct ep_loop *l, int err, uint64_t now)
{
    if (l->pause_logged == 0 || now - l->pause_logged >= EP_PAUSE_LOG_MS) {
        host_log("error accept: %s; accepting paused for %d ms (%u times since last report)",
                 strerror(err), EP_ACCEPT_PAUSE_MS, l->pauses + 1);
        l->pause_logged = now;
        l->pauses = 0;
    } else {
        l->pauses++;
    }
    ep_listener_poll(l, 0);
    l->accept_resume = now + EP_ACCEPT_PAUSE_MS;
}

static void ep_accept(struct ep_loop *l, uint64_t now)
{
    for (int i = 0; i < EP_ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(l->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            ep_accept_pause(l, errno, now);
            return;
        }
        if (l->nconns >= l->ctx->opt.max_clients)
            conn_reject(l->ctx, fd, (struct sockaddr *)&ss, now);
        else
            ep_add(l, fd, (struct sockaddr *)&ss, now);
    }
}

static void ep_dispatch(struct ep_loop *l, struct ep_conn *ec, uint32_t events)
{
    uint64_t now = host_now_ms(); /* fresh: an fsync may have taken a while */
    unsigned bits = 0;

    /* On EPOLLERR/EPOLLHUP both handlers run: the failing send or recv ends the session. */
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
        bits = conn_on_writable(ec->conn, now);
    if (!(bits & CONN_CLOSE) && (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        bits = conn_on_readable(ec->conn, now);
    ep_after(l, ec, bits);
}

/* Runs conn_on_timer for every connection that is due, and recomputes the earliest expiry. */
static void ep_sweep(struct ep_loop *l, uint64_t now)
{
    struct ep_conn *ec = l->conns, *next;

    l->next_timer = UINT64_MAX;
    l->last_sweep = now;
    for (; ec != NULL; ec = next) {
        uint64_t e = conn_expiry(ec->conn);
        next = ec->next;
        if (e <= now)
            ep_after(l, ec, conn_on_timer(ec->conn, now));
        else if (e < l->next_timer)
            l->next_timer = e;
    }
}

/* epoll_wait timeout in ms for the next timer, drain deadline or accept resumption. */
static int ep_timeout(const struct ep_loop *l, uint64_t now)
{
    uint64_t t = l->next_timer;

    if (t != UINT64_MAX && t < l->last_sweep + EP_SWEEP_MIN_MS)
        t = l->last_sweep + EP_SWEEP_MIN_MS;
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

static void ep_begin_drain(struct ep_loop *l, uint64_t now)
{
    host_log("shutdown sessions=%zu drain-seconds=%u", l->nconns, l->ctx->opt.drain_seconds);
    if (l->lfd >= 0)
        (void)close(l->lfd); /* also leaves the epoll set */
    l->lfd = -1;
    l->lfd_polled = 0;
    l->accept_resume = UINT64_MAX;
    l->draining = 1;
    l->drain_deadline = now + (uint64_t)l->ctx->opt.drain_seconds * 1000u;
}

/* The drain time is over: 421 4.3.2 to every session left. */
static void ep_close_all(struct ep_loop *l, uint64_t now)
{
    while (l->conns != NULL) {
        conn_shutdown(l->conns->conn, now);
        ep_close(l, l->conns);
    }
}

/* Timers, paused accepts and the shutdown state, between two epoll waits. Returns 1 when the
 * loop should end. */
static int ep_housekeeping(struct ep_loop *l)
{
    uint64_t now = host_now_ms();
    int stops = host_stop_requests();

    if (l->next_timer <= now && now >= l->last_sweep + EP_SWEEP_MIN_MS)
        ep_sweep(l, now);
    if (l->lfd >= 0 && !l->lfd_polled && l->accept_resume <= now) {
        l->accept_resume = UINT64_MAX;
        ep_listener_poll(l, 1);
    }
    if (stops > 0 && !l->draining)
        ep_begin_drain(l, now);
    if (stops > 1) /* a second signal: no more waiting */
        l->drain_deadline = now;
    if (l->draining && (l->nconns == 0 || now >= l->drain_deadline)) {
        ep_close_all(l, now);
        return 1;
    }
    return 0;
}

static int ep_loop_run(struct ep_loop *l, const sigset_t *wait_mask)
{
    struct epoll_event evs[EP_MAX_EVENTS];

    while (!ep_housekeeping(l)) {
        int n = epoll_pwait(l->epfd, evs, EP_MAX_EVENTS, ep_timeout(l, host_now_ms()),
                            wait_mask);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            host_log("error epoll_wait: %s", strerror(errno));
            ep_close_all(l, host_now_ms());
            return 1;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                if (l->lfd >= 0)
                    ep_accept(l, host_now_ms());
            } else {
                ep_dispatch(l, evs[i].data.ptr, evs[i].events);
            }
        }
    }
    return 0;
}

int epoll_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask)
{
    struct ep_loop l;
    char err[256];
    int rc;

    memset(&l, 0, sizeof l);
    l.ctx = ctx;
    l.accept_resume = UINT64_MAX;
    l.next_timer = UINT64_MAX;
    l.lfd = net_listen((const struct sockaddr *)&ctx->opt.listen_addr,
                       ctx->opt.listen_addr_len, 0, err, sizeof err);
    if (l.lfd < 0) {
        host_log("error %s", err);
        return 1;
    }
    l.epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l.epfd < 0) {
        host_log("error epoll_create1: %s", strerror(errno));
        (void)close(l.lfd);
        return 1;
    }
    ep_listener_poll(&l, 1);
    if (!l.lfd_polled) {
        (void)close(l.lfd);
        (void)close(l.epfd);
        return 1;
    }
    host_announce_listener(l.lfd);
    rc = ep_loop_run(&l, wait_mask);
    if (l.lfd >= 0)
        (void)close(l.lfd);
    (void)close(l.epfd);
    return rc;
}
