/*
 * jobs.c - the blocking-work pool of an event loop (see jobs.h): per queue a mutex-protected
 * FIFO and its own threads, one finished list back to the loop, an eventfd to wake it.
 */
#include "jobs.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define JOB_STACK_SIZE (256u * 1024u) /* crypt(3) (yescrypt, scrypt) needs more than fsync */

struct job_queue {
    pthread_cond_t work;
    struct job *head, *tail; /* submitted, not yet started */
};

struct worker_arg {
    struct job_pool *pool;
    unsigned queue;
};

struct job_pool {
    pthread_mutex_t lock;
    struct job_queue q[JOB_QUEUES];
    struct job *done; /* finished, not yet taken (LIFO; order does not matter) */
    size_t busy;      /* submitted - taken; only the loop thread touches it */
    int stopping;
    int efd;
    unsigned nthreads;
    pthread_t *threads;
    struct worker_arg *args;
};

static void *worker(void *arg)
{
    struct worker_arg *wa = arg;
    struct job_pool *p = wa->pool;
    struct job_queue *q = &p->q[wa->queue];

    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct job *j;
        while (q->head == NULL && !p->stopping)
            pthread_cond_wait(&q->work, &p->lock);
        if (q->head == NULL)
            break; /* stopping, and nothing left to run */
        j = q->head;
        q->head = j->next;
        if (q->head == NULL)
            q->tail = NULL;
        pthread_mutex_unlock(&p->lock);

        if (atomic_load(&j->cancelled))
            j->cancel(j);
        else
            j->run(j);

        pthread_mutex_lock(&p->lock);
        j->next = p->done;
        p->done = j;
        if (j->next == NULL) { /* the list was empty: wake the loop */
            uint64_t one = 1;
            ssize_t w;
            do
                w = write(p->efd, &one, sizeof one);
            while (w < 0 && errno == EINTR);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

struct job_pool *job_pool_new(const unsigned threads[JOB_QUEUES], char *err, size_t errlen)
{
    struct job_pool *p;
    pthread_attr_t attr;
    unsigned total = 0;

    for (unsigned q = 0; q < JOB_QUEUES; q++)
        total += threads[q] ? threads[q] : 1;
    p = calloc(1, sizeof *p);
    if (p == NULL || (p->threads = calloc(total, sizeof *p->threads)) == NULL ||
        (p->args = calloc(total, sizeof *p->args)) == NULL) {
        if (p != NULL)
            free(p->threads);
        free(p);
        snprintf(err, errlen, "job pool: out of memory");
        return NULL;
    }
    p->efd = -1;
    pthread_mutex_init(&p->lock, NULL);
    for (unsigned q = 0; q < JOB_QUEUES; q++)
        pthread_cond_init(&p->q[q].work, NULL);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        snprintf(err, errlen, "job pool: eventfd: %s", strerror(errno));
        job_pool_free(p);
        return NULL;
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, JOB_STACK_SIZE);
    for (unsigned q = 0; q < JOB_QUEUES; q++) {
        for (unsigned i = 0; i < (threads[q] ? threads[q] : 1); i++) {
            struct worker_arg *wa = &p->args[p->nthreads];
            int rc;
            wa->pool = p;
            wa->queue = q;
            rc = pthread_create(&p->threads[p->nthreads], &attr, worker, wa);
            if (rc != 0) {
                snprintf(err, errlen, "job pool: pthread_create: %s", strerror(rc));
                pthread_attr_destroy(&attr);
                job_pool_free(p);
                return NULL;
            }
            p->nthreads++;
        }
    }
    pthread_attr_destroy(&attr);
    return p;
}

void job_submit(struct job_pool *p, struct job *j)
{
    struct job_queue *q = &p->q[j->queue < JOB_QUEUES ? j->queue : 0];

    j->next = NULL;
    atomic_store(&j->cancelled, 0);
    pthread_mutex_lock(&p->lock);
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    p->busy++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&p->lock);
}

void job_cancel(struct job *j)
{
    atomic_store(&j->cancelled, 1);
}

int job_pool_fd(const struct job_pool *p)
{
    return p->efd;
}

struct job *job_pool_done(struct job_pool *p)
{
    struct job *list, *j;
    uint64_t n;

    pthread_mutex_lock(&p->lock);
    list = p->done;
    p->done = NULL;
    for (j = list; j != NULL; j = j->next)
        p->busy--;
    /* Cleared under the lock: a worker finishing now finds the list empty and writes again. */
    while (read(p->efd, &n, sizeof n) < 0 && errno == EINTR)
        ;
    pthread_mutex_unlock(&p->lock);
    return list;
}

size_t job_pool_busy(const struct job_pool *p)
{
    return p->busy;
}

void job_pool_free(struct job_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    for (unsigned q = 0; q < JOB_QUEUES; q++)
        pthread_cond_broadcast(&p->q[q].work);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    if (p->efd >= 0)
        (void)close(p->efd);
    for (unsigned q = 0; q < JOB_QUEUES; q++)
        pthread_cond_destroy(&p->q[q].work);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p->args);
    free(p);
}
