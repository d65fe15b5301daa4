/*
 * reuseport.c - the reuseport host model: --workers threads in one process, each running its
 * own event loop (host/loop.c) on its own listener bound with SO_REUSEPORT to the same
 * address; the kernel spreads new connections across the listeners by a hash of the peer's
 * address and port. The main thread only waits for SIGTERM/SIGINT and tells the loops, and
 * rereads --recipients at SIGHUP (the loops see the new table from their next RCPT).
 *
 * What it demonstrates: the engine needs no shared state, so N independent loops scale across
 * cores with no lock on the path of a session (the only thing shared is the session count for
 * --max-clients, one atomic counter per loop). It is the C counterpart of the study's Ractors,
 * each with its own event loop and listener.
 *
 * When to pick it: many cores and many short sessions, in one process that is simple to
 * supervise. The kernel's spread is by hash, not by load: a loop busy with a slow TLS handshake
 * still gets its share of new connections. A crash takes every session with it (prefork
 * limits that to one worker's). TCP only (SO_REUSEPORT); with --listen port 0 the first
 * listener picks the port and the others bind to it.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/log.h"
#include "host/loop.h"
#include "host/models.h"
#include "host/net.h"
#include "host/signals.h"

#define RP_POLL_MS 100 /* while draining, how often the main thread looks for finished loops */

struct rp_worker {
    struct loop *loop;
    pthread_t thread;
    int started;
    atomic_int finished;
    int rc;
};

static void *rp_main(void *arg)
{
    struct rp_worker *w = arg;

    w->rc = loop_run(w->loop, NULL); /* stop requests come from loop_stop */
    atomic_store(&w->finished, 1);
    return NULL;
}

/* Binds n listeners to one address; with port 0, the others take the first one's port. */
static int rp_listen(const struct host_ctx *ctx, int *fds, unsigned n, char *err, size_t errlen)
{
    struct sockaddr_storage addr = ctx->opt.listen_addr;
    socklen_t len = ctx->opt.listen_addr_len;

    for (unsigned i = 0; i < n; i++) {
        fds[i] = net_listen((struct sockaddr *)&addr, len, 1, err, errlen);
        if (fds[i] < 0) {
            while (i-- > 0)
                (void)close(fds[i]);
            return -1;
        }
        if (i == 0 && getsockname(fds[0], (struct sockaddr *)&addr, &len) < 0) {
            (void)close(fds[0]);
            return -1;
        }
    }
    return 0;
}

/* Waits for a signal or RP_POLL_MS. */
static void rp_wait(const sigset_t *wait_mask)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = RP_POLL_MS * 1000000L};

    (void)pselect(0, NULL, NULL, NULL, &ts, wait_mask);
}

int reuseport_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask)
{
    unsigned n = ctx->opt.workers, i;
    struct census *census = census_new(n, ctx->opt.max_clients, ctx->opt.max_clients_per_ip, 0);
    struct rp_worker *w = calloc(n, sizeof *w);
    int *fds = calloc(n, sizeof *fds);
    char err[256];
    int rc = 0, told = 0, stops;
    unsigned reloads = host_reload_requests();

    if (census == NULL || w == NULL || fds == NULL) {
        host_log("error out of memory");
        rc = 1;
        goto out;
    }
    if (rp_listen(ctx, fds, n, err, sizeof err) < 0) {
        host_log("error %s", err);
        rc = 1;
        goto out;
    }
    for (i = 0; i < n; i++) {
        w[i].loop = loop_new(ctx, fds[i], 0, census, i, ctx->opt.job_threads, err, sizeof err);
        if (w[i].loop == NULL) {
            host_log("error %s", err);
            for (unsigned k = i; k < n; k++)
                (void)close(fds[k]);
            rc = 1;
            goto stop;
        }
    }
    host_announce_listener(fds[0]);
    /* SIGTERM/SIGINT are blocked (signals.h): the threads inherit that, only this one takes
     * them, in rp_wait. */
    for (i = 0; i < n; i++) {
        int e = pthread_create(&w[i].thread, NULL, rp_main, &w[i]);
        if (e != 0) {
            host_log("error pthread_create: %s", strerror(e));
            rc = 1;
            goto stop;
        }
        w[i].started = 1;
    }
    for (;;) {
        unsigned running = 0;
        host_reload_check(ctx, &reloads);
        stops = host_stop_requests();
        if (stops > told) {
            if (told == 0) /* no loop accepts from now on, even one busy elsewhere */
                for (i = 0; i < n; i++)
                    (void)shutdown(fds[i], SHUT_RDWR);
            for (i = 0; i < n; i++)
                loop_stop(w[i].loop, stops > 1 ? 2 : 1);
            told = stops;
        }
        for (i = 0; i < n; i++)
            running += !atomic_load(&w[i].finished);
        if (running < n && told == 0) { /* a loop ended on its own (epoll failed): stop all */
            host_log("error a worker loop ended; stopping");
            rc = 1;
            break;
        }
        if (running == 0)
            break;
        rp_wait(wait_mask);
    }
stop:
    for (i = 0; i < n; i++)
        if (w[i].loop != NULL)
            loop_stop(w[i].loop, told > 1 ? 2 : 1);
    for (i = 0; i < n; i++) {
        if (w[i].started) {
            pthread_join(w[i].thread, NULL);
            if (w[i].rc != 0)
                rc = 1;
        }
        loop_free(w[i].loop);
    }
out:
    free(fds);
    free(w);
    census_free(census);
    return rc;
}
