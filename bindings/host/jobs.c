/*
 * jobs.c - the blocking-work pool of an event loop (see jobs.h): a mutex-protected FIFO to the
 * threads, a finished list back to the loop, an eventfd to wake it.
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

struct job_pool {
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct job *head, *tail;  /* submitted, not yet started */
    struct job *done;         /* finished, not yet taken (LIFO; order does not matter) */
    size_t busy;              /* submitted - taken; only the loop thread touches it */
    int stopping;
    int efd;
    unsigned nthreads;
    pthread_t threads[];
};

static void *worker(void *arg)
{
    struct job_pool *p = arg;

    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct job *j;
        while (p->head == NULL && !p->stopping)
            pthread_cond_wait(&p->work, &p->lock);
        if (p->head == NULL)
            break; /* stopping, and nothing left to run */
        j = p->head;
        p->head = j->next;
        if (p->head == NULL)
            p->tail = NULL;
        pthread_mutex_unlock(&p->lock);

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

struct job_pool *job_pool_new(unsigned threads, char *err, size_t errlen)
{
    struct job_pool *p;
    pthread_attr_t attr;
    int rc;

    if (threads == 0)
        threads = 1;
    p = calloc(1, sizeof *p + threads * sizeof(pthread_t));
    if (p == NULL) {
        snprintf(err, errlen, "job pool: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        snprintf(err, errlen, "job pool: eventfd: %s", strerror(errno));
        free(p);
        return NULL;
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, JOB_STACK_SIZE);
    for (; p->nthreads < threads; p->nthreads++) {
        rc = pthread_create(&p->threads[p->nthreads], &attr, worker, p);
        if (rc != 0) {
            snprintf(err, errlen, "job pool: pthread_create: %s", strerror(rc));
            pthread_attr_destroy(&attr);
            job_pool_free(p);
            return NULL;
        }
    }
    pthread_attr_destroy(&attr);
    return p;
}

void job_submit(struct job_pool *p, struct job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    p->busy++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
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
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    (void)close(p->efd);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
