/*
 * test_host_loop.c - unit tests of the host glue the event models share: the deadline heap
 * (bindings/host/timers.c) against a brute-force reference under random operations, and the
 * job pool (bindings/host/jobs.c): every job runs once on a pool thread, comes back through
 * the eventfd, and the pool drains at free.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>

#include "jobs.h"
#include "timers.h"

#define N_TIMERS 257

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The heap's first entry is always the earliest finite deadline, whatever the sequence of
 * inserts, moves earlier and later, and removals. */
static void test_timer_heap_random(void **state)
{
    struct timer_heap h;
    struct timer t[N_TIMERS];
    (void)state;

    timer_heap_init(&h);
    for (size_t i = 0; i < N_TIMERS; i++)
        timer_init(&t[i]);
    for (int step = 0; step < 200000; step++) {
        size_t i = rnd() % N_TIMERS, in = 0;
        uint64_t when = rnd() % 5 == 0 ? TIMER_NONE : rnd() % 1000, min = TIMER_NONE;
        struct timer *first;
        assert_int_equal(timer_set(&h, &t[i], when), 0);
        assert_int_equal(t[i].when, when);
        for (size_t k = 0; k < N_TIMERS; k++) {
            if (t[k].when != TIMER_NONE) {
                in++;
                assert_ptr_equal(h.v[t[k].pos], &t[k]);
            }
            if (t[k].when < min)
                min = t[k].when;
        }
        assert_int_equal(h.n, in);
        first = timer_first(&h);
        if (min == TIMER_NONE)
            assert_null(first);
        else
            assert_int_equal(first->when, min);
    }
    for (size_t i = 0; i < N_TIMERS; i++)
        assert_int_equal(timer_set(&h, &t[i], TIMER_NONE), 0);
    assert_null(timer_first(&h));
    timer_heap_free(&h);
}

struct counted_job {
    struct job base;
    pthread_t ran_on;
    int runs;
};

static void count_run(struct job *j)
{
    struct counted_job *c = (struct counted_job *)j;
    c->ran_on = pthread_self();
    c->runs++;
}

/* 1000 jobs through 3 threads: each runs once, off the submitting thread, and each comes back
 * exactly once through job_pool_done, woken by the eventfd. */
static void test_job_pool_round_trip(void **state)
{
    enum { N = 1000 };
    struct counted_job *jobs = calloc(N, sizeof *jobs);
    char err[128];
    struct job_pool *p = job_pool_new(3, err, sizeof err);
    size_t back = 0;
    (void)state;

    assert_non_null(jobs);
    assert_non_null(p);
    for (size_t i = 0; i < N; i++) {
        jobs[i].base.run = count_run;
        jobs[i].base.owner = &jobs[i];
        job_submit(p, &jobs[i].base);
    }
    while (back < N) {
        struct pollfd pfd = {.fd = job_pool_fd(p), .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 10000), 1); /* a safety bound, not a speed check */
        for (struct job *j = job_pool_done(p); j != NULL; j = j->next) {
            struct counted_job *c = j->owner;
            assert_int_equal(c->runs, 1);
            assert_false(pthread_equal(c->ran_on, pthread_self()));
            c->runs = 2; /* taken back: a second return would fail the check above */
            back++;
        }
    }
    assert_int_equal(job_pool_busy(p), 0);
    job_pool_free(p);
    free(jobs);
}

/* Freeing a pool lets the queued jobs run first. */
static void test_job_pool_free_drains(void **state)
{
    enum { N = 200 };
    struct counted_job jobs[N] = {0};
    char err[128];
    struct job_pool *p = job_pool_new(2, err, sizeof err);
    (void)state;

    assert_non_null(p);
    for (size_t i = 0; i < N; i++) {
        jobs[i].base.run = count_run;
        job_submit(p, &jobs[i].base);
    }
    job_pool_free(p);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(jobs[i].runs, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timer_heap_random),
        cmocka_unit_test(test_job_pool_round_trip),
        cmocka_unit_test(test_job_pool_free_drains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
