/*
 * signals.c - SIGPIPE and SIGXFSZ ignored, SIGTERM/SIGINT counted, SIGHUP counted when asked
 * (see signals.h).
 */
#include "signals.h"

#include <string.h>

static volatile sig_atomic_t stop_requests;
static volatile sig_atomic_t reload_requests; /* 0..0xFFFF, wrapping */

static void on_stop(int sig)
{
    (void)sig;
    if (stop_requests < 1000)
        stop_requests++;
}

int host_signals_init(sigset_t *wait_mask)
{
    struct sigaction sa;
    sigset_t block;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGXFSZ, &sa, NULL) < 0 || /* a file-size limit: write() fails with EFBIG */
        sigaction(SIGPIPE, &sa, NULL) < 0)
        return -1;
    sa.sa_handler = on_stop;
    if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
        return -1;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    if (sigprocmask(SIG_BLOCK, &block, wait_mask) < 0)
        return -1;
    sigdelset(wait_mask, SIGTERM);
    sigdelset(wait_mask, SIGINT);
    return 0;
}

/* Sets handler for sig, blocks sig, and lets wait_mask (the mask a loop waits with) take it.
 * Returns 0, or -1 with errno set. */
static int catch_while_waiting(int sig, void (*handler)(int), sigset_t *wait_mask)
{
    struct sigaction sa;
    sigset_t block;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigemptyset(&block);
    sigaddset(&block, sig);
    if (sigaction(sig, &sa, NULL) < 0 || sigprocmask(SIG_BLOCK, &block, NULL) < 0)
        return -1;
    sigdelset(wait_mask, sig);
    return 0;
}

int host_signals_stop_on(int sig, sigset_t *wait_mask)
{
    return catch_while_waiting(sig, on_stop, wait_mask);
}

int host_stop_requests(void)
{
    return stop_requests;
}

static void on_reload(int sig)
{
    (void)sig;
    reload_requests = (reload_requests + 1) & 0xFFFF;
}

int host_signals_reload_on(int sig, sigset_t *wait_mask)
{
    return catch_while_waiting(sig, on_reload, wait_mask);
}

unsigned host_reload_requests(void)
{
    return (unsigned)reload_requests;
}
