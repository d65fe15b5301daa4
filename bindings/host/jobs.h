/*
 * jobs.h - a small pool of threads for the blocking steps of a session (the fsync and rename
 * that make a message durable, the crypt(3) of an AUTH attempt), so that an event loop never
 * waits on a disk or a password hash.
 *
 * A loop owns one pool. It submits a job to one of the pool's queues; a thread of that queue
 * runs job->run; the finished job is queued back and the pool's eventfd (job_pool_fd) becomes
 * readable; the loop then takes the finished jobs with job_pool_done and finishes each on its
 * own thread. job->run must touch
 * only the job (never the connection or the engine session, which belong to the loop). Jobs
 * run in no particular order across threads.
 */
#ifndef SMTPE_HOST_JOBS_H
#define SMTPE_HOST_JOBS_H

#include <stdatomic.h>
#include <stddef.h>

/* The queues of a pool, each with threads of its own, so that one kind of work never waits
 * behind another: storing messages (fsync and rename, milliseconds) never queues behind AUTH
 * checks (crypt(3), deliberately slow, and started by clients who have not authenticated). */
enum { JOB_QUEUE_STORE, JOB_QUEUE_AUTH, JOB_QUEUES };

struct job {
    void (*run)(struct job *j);     /* on a pool thread */
    /* On a pool thread instead of run, when the owner gave up (job_cancel) before the job
     * started: the quick cleanup (remove a file, wipe a password). */
    void (*cancel)(struct job *j);
    /* On the loop's thread, for a job that comes back with no owner (it gave up): logs what must
     * be logged and frees the job. */
    void (*release)(struct job *j);
    void *owner;                    /* the loop's: who waits for it (NULL: nobody any more) */
    unsigned queue;                 /* JOB_QUEUE_* */
    atomic_int cancelled;           /* set by job_cancel */
    struct job *next;               /* the pool's */
};

struct job_pool;

/* Starts a pool with threads[q] threads (at least 1) for each queue q. Returns it, or NULL with a
 * message in err. */
struct job_pool *job_pool_new(const unsigned threads[JOB_QUEUES], char *err, size_t errlen);

/* Queues j on its queue (which must stay valid until job_pool_done returns it). Never blocks. */
void job_submit(struct job_pool *p, struct job *j);

/* The owner gives up on j (call from the loop's thread, with owner set to NULL): if no thread
 * has started it, its cancel runs instead of its run. It still comes back through
 * job_pool_done. */
void job_cancel(struct job *j);

/* A descriptor that is readable while finished jobs wait to be taken (an eventfd). */
int job_pool_fd(const struct job_pool *p);

/* Takes every finished job, linked by ->next (NULL if none), and clears the fd's readiness. */
struct job *job_pool_done(struct job_pool *p);

/* Jobs submitted and not yet taken back by job_pool_done. */
size_t job_pool_busy(const struct job_pool *p);

/* Lets the queued jobs run (or be cancelled), stops and joins the threads, and frees the pool.
 * Finished jobs not taken are dropped (not freed: the owner's business). NULL is allowed. */
void job_pool_free(struct job_pool *p);

#endif
