/*
 * signals.h - process signals of smtpe-server: SIGPIPE ignored (sends use MSG_NOSIGNAL as
 * well), SIGTERM and SIGINT counted as stop requests, and with --recipients SIGHUP counted as a
 * reload request (reread the file). These signals stay blocked except while a model waits
 * (epoll_pwait, ppoll, pselect), so a request never slips in between the check and the wait.
 */
#ifndef SMTPE_HOST_SIGNALS_H
#define SMTPE_HOST_SIGNALS_H

#include <signal.h>

/* Installs the handlers and blocks SIGTERM/SIGINT; *wait_mask gets the mask to wait with.
 * Call before any thread is started. Returns 0, or -1 with errno set. */
int host_signals_init(sigset_t *wait_mask);

/* Makes sig a stop request too (a prefork worker's SIGUSR1 from its supervisor): installs the
 * handler, blocks sig, and takes it out of *wait_mask. Returns 0, or -1 with errno set. */
int host_signals_stop_on(int sig, sigset_t *wait_mask);

/* How many stop requests (SIGTERM/SIGINT) have arrived. */
int host_stop_requests(void);

/* Makes sig a reload request (SIGHUP; a prefork worker's SIGUSR2 from its supervisor): installs
 * the handler, blocks sig, and takes it out of *wait_mask. Call before any thread is started.
 * Returns 0, or -1 with errno set. */
int host_signals_reload_on(int sig, sigset_t *wait_mask);

/* A count of the reload requests so far, modulo 2^16: a change since the last look means at
 * least one more came (several between two looks ask for one reread). */
unsigned host_reload_requests(void);

#endif
