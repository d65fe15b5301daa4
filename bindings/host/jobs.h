/*
 * jobs.h - a small pool of threads for the blocking steps of a session (the fsync and rename
 * that make a message durable, the crypt(3) of an AUTH attempt), so that an event loop never
 * waits on a disk or a password hash.
 *
 * A loop owns one pool. It submits a job; a pool thread runs job->run; the finished job is
 * queued back and the pool's eventfd (job_pool_fd) becomes readable; the loop then takes the
 * finished jobs with job_pool_done and finishes each on its own thread. job->run must touch
 * only the job (never the connection or the engine session, which belong to the loop). Jobs
 * run in no particular order across threads.
 */
#ifndef SMTPE_HOST_JOBS_H
#define SMTPE_HOST_JOBS_H

#include <stddef.h>

struct job {
    void (*run)(struct job *j); /* on a pool thread */
    void *owner;                /* the loop's: who waits for it (NULL: nobody any more) */
    struct job *next;           /* the pool's */
};

struct job_pool;

/* Starts a pool of threads (at least 1). Returns it, or NULL with a message in err. */
struct job_pool *job_pool_new(unsigned threads, char *err, size_t errlen);

/* Queues j (which must stay valid until job_pool_done returns it). Never blocks. */
void job_submit(struct job_pool *p, struct job *j);

/* A descriptor that is readable while finished jobs wait to be taken (an eventfd). */
int job_pool_fd(const struct job_pool *p);

/* Takes every finished job, linked by ->next (NULL if none), and clears the fd's readiness. */
struct job *job_pool_done(struct job_pool *p);

/* Jobs submitted and not yet taken back by job_pool_done. */
size_t job_pool_busy(const struct job_pool *p);

/* Lets the queued jobs run, stops and joins the threads, and frees the pool. Finished jobs not
 * taken are dropped (not freed: the owner's business). NULL is allowed. */
void job_pool_free(struct job_pool *p);

#endif
