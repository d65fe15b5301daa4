/*
 * epoll.c - the epoll host model: one process, one thread, one event loop (host/loop.c) that
 * accepts, reads, writes and times out every connection.
 *
 * What it demonstrates: the sans-I/O engine driven purely by readiness. Nothing blocks on a
 * client: a session waiting for input costs a registered fd and its fixed memory, a client
 * that does not read its replies only loses its own EPOLLIN, deadlines are a heap over
 * conn_expiry(), and the two steps that would block (the fsync and rename of a stored message,
 * the crypt(3) of an AUTH attempt) run in the loop's small job pool while only that session's
 * verdict waits. A TLS handshake's public-key operation is CPU time of the loop.
 *
 * When to pick it: the default, and the baseline of the other models. It uses one core for
 * the protocol (plus the job threads for the disk); to use more cores pick prefork (processes:
 * a crash takes one worker's sessions only) or reuseport (threads: one process to watch).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/log.h"
#include "host/loop.h"
#include "host/models.h"
#include "host/net.h"

int epoll_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask)
{
    struct census *census = census_new(1, ctx->opt.max_clients, ctx->opt.max_clients_per_ip, 0);
    struct loop *l;
    char err[256];
    int lfd, rc;

    if (census == NULL) {
        host_log("error out of memory");
        return 1;
    }
    lfd = net_listen((const struct sockaddr *)&ctx->opt.listen_addr, ctx->opt.listen_addr_len,
                     0, err, sizeof err);
    if (lfd < 0 || (l = loop_new(ctx, lfd, 0, census, 0, ctx->opt.job_threads, err,
                                 sizeof err)) == NULL) {
        host_log("error %s", err);
        if (lfd >= 0)
            (void)close(lfd);
        census_free(census);
        return 1;
    }
    host_announce_listener(lfd);
    rc = loop_run(l, wait_mask);
    loop_free(l);
    census_free(census);
    return rc;
}
