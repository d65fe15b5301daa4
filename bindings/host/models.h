/*
 * models.h - the host models smtpe-server can run (--model). Each takes the shared context and
 * the signal mask to wait with (see signals.h), serves until SIGTERM/SIGINT, drains, and returns
 * the process exit status. main.c picks one by name.
 */
#ifndef SMTPE_HOST_MODELS_H
#define SMTPE_HOST_MODELS_H

#include <signal.h>

#include "host.h"

struct host_model {
    const char *name;
    const char *summary; /* one line for --help and errors */
    int (*run)(const struct host_ctx *ctx, const sigset_t *wait_mask);
};

/* bindings/epoll/epoll.c: one process, one thread, one epoll loop. */
int epoll_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask);

/* bindings/prefork/prefork.c: a supervisor and --workers forked processes, each an epoll loop
 * on the shared listener. */
int prefork_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask);

/* bindings/reuseport/reuseport.c: --workers threads, each an epoll loop with its own
 * SO_REUSEPORT listener. */
int reuseport_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask);

/* bindings/threads/threads.c: one blocking thread per connection. */
int threads_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask);

/* Logs "listening on ADDR:PORT" for the bound listener fd (the line tools wait for). */
void host_announce_listener(int fd);

#endif
