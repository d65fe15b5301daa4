/*
 * prefork.c - the prefork host model: a supervisor process opens the listener and forks
 * --workers processes, each running its own event loop (host/loop.c) and accepting on the
 * shared listener (EPOLLEXCLUSIVE, so a new connection wakes one worker, not all). The
 * supervisor serves no client: it replaces a worker that dies, and at SIGTERM/SIGINT tells the
 * workers (SIGUSR1; they ignore SIGTERM and SIGINT themselves) and waits for them to drain. A
 * worker whose supervisor dies drains and exits too. SIGHUP (with --recipients) goes the same
 * way: the supervisor rereads the file (the table a worker it forks later starts with) and
 * tells the workers (SIGUSR2; they ignore SIGHUP itself), and each worker rereads it in its
 * own loop.
 *
 * What it demonstrates: the classic Unix server shape (Apache prefork, Postfix's master,
 * Unicorn), here with an event loop in each process, the study's winning "prefork + Fibers".
 * Workers share nothing but the listener and the session count for --max-clients (one
 * counter per worker in MAP_SHARED memory, zeroed by the supervisor when a worker dies).
 *
 * When to pick it: several cores, and isolation: a crash (or a leak) takes one worker's
 * sessions and the supervisor starts another. Costs a process per worker and, unlike
 * reuseport, one accept queue that the workers take turns on.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host/log.h"
#include "host/loop.h"
#include "host/models.h"
#include "host/net.h"
#include "host/signals.h"

#define PF_RESPAWN_MIN_MS 1000 /* a worker that dies sooner is restarted after this long */
#define PF_POLL_MS 100
#define PF_STOP_SIGNAL SIGUSR1 /* the supervisor's stop request to a worker */
#define PF_RELOAD_SIGNAL SIGUSR2 /* the supervisor's reload request (SIGHUP) to a worker */

struct pf_worker {
    pid_t pid;        /* 0: not running */
    uint64_t started; /* host_now_ms at fork */
    uint64_t due;     /* when to (re)start it; 0: not due */
};

static void pf_on_child(int sig)
{
    (void)sig; /* only interrupts the wait */
}

/* The worker process: an event loop on the shared listener. Does not return. */
static void pf_worker_main(const struct host_ctx *ctx, int lfd, struct census *census,
                           unsigned slot, const sigset_t *supervisor_wait_mask, pid_t supervisor)
{
    sigset_t wait_mask = *supervisor_wait_mask;
    struct sigaction sa;
    struct loop *l;
    char err[256];
    int rc;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    (void)sigaction(SIGCHLD, &sa, NULL);
    /* Only the supervisor's word counts, as SIGUSR1 (PF_STOP_SIGNAL): a SIGTERM or ^C sent to
     * the whole process group (systemd's KillMode=control-group, a terminal) reaches the workers
     * too, and counted beside the supervisor's relay it would count twice and skip the drain.
     * If the supervisor dies, the kernel sends the same signal (PR_SET_PDEATHSIG), so no worker
     * is left serving on its own. */
    sa.sa_handler = SIG_IGN;
    (void)sigaction(SIGINT, &sa, NULL);
    (void)sigaction(SIGTERM, &sa, NULL);
    /* A SIGHUP to the group likewise: the supervisor relays it as PF_RELOAD_SIGNAL. */
    if (ctx->recipients != NULL)
        (void)sigaction(SIGHUP, &sa, NULL);
    if (host_signals_stop_on(PF_STOP_SIGNAL, &wait_mask) < 0 ||
        (ctx->recipients != NULL &&
         host_signals_reload_on(PF_RELOAD_SIGNAL, &wait_mask) < 0) ||
        prctl(PR_SET_PDEATHSIG, PF_STOP_SIGNAL) < 0) {
        host_log("error worker %u: signals: %s", slot, strerror(errno));
        _exit(1);
    }
    if (getppid() != supervisor) /* it died before prctl */
        (void)raise(PF_STOP_SIGNAL);
    census_clear_slot(census, slot);
    l = loop_new(ctx, lfd, 1, census, slot, ctx->opt.job_threads, err, sizeof err);
    if (l == NULL) {
        host_log("error worker %u: %s", slot, err);
        _exit(1);
    }
    rc = loop_run(l, &wait_mask);
    loop_free(l);
    _exit(rc);
}

static int pf_spawn(const struct host_ctx *ctx, int lfd, struct census *census,
                    struct pf_worker *w, unsigned slot, const sigset_t *wait_mask)
{
    pid_t supervisor = getpid(), pid = fork();

    if (pid < 0) {
        host_log("error fork: %s", strerror(errno));
        w->due = host_now_ms() + PF_RESPAWN_MIN_MS;
        return -1;
    }
    if (pid == 0)
        pf_worker_main(ctx, lfd, census, slot, wait_mask, supervisor);
    w->pid = pid;
    w->started = host_now_ms();
    w->due = 0;
    host_log("worker %u pid=%ld started", slot, (long)pid);
    return 0;
}

/* Reaps dead workers; while serving, schedules their replacement. Returns how many run. */
static unsigned pf_reap(struct pf_worker *w, unsigned n, struct census *census,
                        int serving, int *failed)
{
    unsigned running = 0;
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (unsigned i = 0; i < n; i++) {
            uint64_t now = host_now_ms();
            if (w[i].pid != pid)
                continue;
            w[i].pid = 0;
            census_clear_slot(census, i); /* its sessions died with it */
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !serving)
                break;
            if (WIFSIGNALED(status))
                host_log("error worker %u pid=%ld killed by signal %d", i, (long)pid,
                         WTERMSIG(status));
            else
                host_log("error worker %u pid=%ld exited with status %d", i, (long)pid,
                         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            if (!serving) {
                *failed = 1;
                break;
            }
            w[i].due = now - w[i].started < PF_RESPAWN_MIN_MS ? now + PF_RESPAWN_MIN_MS : now;
            break;
        }
    }
    for (unsigned i = 0; i < n; i++)
        running += w[i].pid != 0;
    return running;
}

static void pf_signal_all(const struct pf_worker *w, unsigned n, int sig)
{
    for (unsigned i = 0; i < n; i++)
        if (w[i].pid != 0)
            (void)kill(w[i].pid, sig);
}

int prefork_model_run(const struct host_ctx *ctx, const sigset_t *wait_mask)
{
    unsigned n = ctx->opt.workers, i;
    struct census *census = census_new(n, ctx->opt.max_clients, ctx->opt.max_clients_per_ip, 1);
    struct pf_worker *w = calloc(n, sizeof *w);
    struct sigaction sa;
    sigset_t chld, wait_chld;
    char err[256];
    int lfd = -1, failed = 0, told = 0;
    unsigned reloads = host_reload_requests();

    if (census == NULL || w == NULL) {
        host_log("error out of memory");
        failed = 1;
        goto out;
    }
    /* SIGCHLD: blocked like the stop signals, taken only while waiting. PF_STOP_SIGNAL too. */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = pf_on_child;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NOCLDSTOP;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    /* Blocked before any fork, so that a worker inherits it blocked: a stop request that comes
     * before the worker has installed its handler waits for it instead of killing it. */
    sigaddset(&chld, PF_STOP_SIGNAL);
    sigaddset(&chld, PF_RELOAD_SIGNAL);
    if (sigaction(SIGCHLD, &sa, NULL) < 0 || sigprocmask(SIG_BLOCK, &chld, NULL) < 0) {
        host_log("error sigaction: %s", strerror(errno));
        failed = 1;
        goto out;
    }
    wait_chld = *wait_mask;
    sigdelset(&wait_chld, SIGCHLD);
    sigaddset(&wait_chld, PF_STOP_SIGNAL); /* the workers', never the supervisor's */
    sigaddset(&wait_chld, PF_RELOAD_SIGNAL);
    lfd = net_listen((const struct sockaddr *)&ctx->opt.listen_addr, ctx->opt.listen_addr_len,
                     0, err, sizeof err);
    if (lfd < 0) {
        host_log("error %s", err);
        failed = 1;
        goto out;
    }
    host_announce_listener(lfd);
    for (i = 0; i < n; i++)
        w[i].due = 1; /* now */
    for (;;) {
        int stops = host_stop_requests();
        uint64_t now = host_now_ms();
        struct timespec ts = {.tv_sec = 0, .tv_nsec = PF_POLL_MS * 1000000L};
        unsigned running;
        if (stops > told) {
            if (told == 0) {
                /* No worker accepts from now on, even one that has not seen the signal yet:
                 * the socket is shared, and shut down it stops listening in every process. */
                (void)shutdown(lfd, SHUT_RDWR);
                host_log("shutdown workers=%u drain-seconds=%u", n, ctx->opt.drain_seconds);
                (void)close(lfd);
                lfd = -1;
            }
            pf_signal_all(w, n, PF_STOP_SIGNAL); /* the second one ends their drain */
            told = stops;
        }
        if (host_reload_requests() != reloads) {
            host_reload_check(ctx, &reloads);
            pf_signal_all(w, n, PF_RELOAD_SIGNAL); /* each worker rereads for itself */
        }
        running = pf_reap(w, n, census, told == 0, &failed);
        if (told == 0) {
            for (i = 0; i < n; i++)
                if (w[i].pid == 0 && w[i].due != 0 && w[i].due <= now)
                    running += pf_spawn(ctx, lfd, census, &w[i], i, wait_mask) == 0;
        } else if (running == 0) {
            break;
        }
        /* A signal (stop or SIGCHLD) ends the wait early; the timeout covers respawns. */
        (void)pselect(0, NULL, NULL, NULL, &ts, &wait_chld);
    }
out:
    if (lfd >= 0)
        (void)close(lfd);
    free(w);
    census_free(census);
    return failed;
}
