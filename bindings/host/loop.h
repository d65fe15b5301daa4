/*
 * loop.h - the event loop the epoll, prefork and reuseport models share: one thread, one
 * level-triggered epoll set holding a listener, its connections, a deadline heap (timers.h)
 * and a job pool (jobs.h) for the steps that would block.
 *
 * It accepts on its listener (up to LOOP_ACCEPT_BATCH per wakeup), runs each connection through
 * conn.c as its socket, deadline or job says, answers 421 4.7.0 past the session limit, and at a
 * stop request closes its listener, gives sessions --drain-seconds to finish, then 421 4.3.2 to
 * the rest, waits for its jobs, and returns.
 *
 * A model whose loops share a listener stops them accepting at once with shutdown(2) on it
 * (accept then fails with EINVAL, and the loop closes its descriptor).
 *
 * Stop requests come one of two ways: as signals during the wait (wait_mask non-NULL: the
 * loop is its process's only signal-taking thread, and reads host_stop_requests()), or from
 * another thread through loop_stop (wait_mask NULL). A loop that takes signals also rereads
 * --recipients at a reload request (host_reload_check); otherwise the thread that takes them
 * does.
 */
#ifndef SMTPE_HOST_LOOP_H
#define SMTPE_HOST_LOOP_H

#include <signal.h>
#include <stdatomic.h>

#include "census.h"
#include "host.h"

#define LOOP_ACCEPT_BATCH 64 /* accepts per wakeup, so a flood cannot starve the sessions */

struct loop;

/* A loop on listener lfd (which the loop closes when it drains or ends). exclusive: lfd is
 * shared with loops of other processes (EPOLLEXCLUSIVE wakes one of them, not all). census and
 * slot: the group's census (census.h: --max-clients and --max-clients-per-ip) and this loop's
 * slot in it. job_threads: threads of the
 * loop's job pool. Returns the loop, or NULL with a message in err. */
struct loop *loop_new(const struct host_ctx *ctx, int lfd, int exclusive,
                      struct census *census, unsigned slot, unsigned job_threads,
                      char *err, size_t errlen);

/* Serves until a stop request has been handled. Returns 0, or 1 if epoll failed. */
int loop_run(struct loop *l, const sigset_t *wait_mask);

/* From any thread (not a signal handler): level 1 drains, 2 ends the drain now. */
void loop_stop(struct loop *l, int level);

/* Frees what loop_new made. */
void loop_free(struct loop *l);

#endif
