/*
 * test_host_loop.c - unit tests of the host glue the event models share: the deadline heap
 * (bindings/host/timers.c) against a brute-force reference under random operations, and the
 * job pool (bindings/host/jobs.c): every job runs once on a thread of its queue, comes back
 * through the eventfd, a job cancelled before it starts gets its cancel instead of its run, one
 * queue does not wait behind the other, and the pool drains at free.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include "census.h"
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
    int runs, cancels;
};

static void count_run(struct job *j)
{
    struct counted_job *c = (struct counted_job *)j;
    c->ran_on = pthread_self();
    c->runs++;
}

static void count_cancel(struct job *j)
{
    ((struct counted_job *)j)->cancels++;
}

static const unsigned two_queues[JOB_QUEUES] = {3, 2};

/* 1000 jobs through 3 threads: each runs once, off the submitting thread, and each comes back
 * exactly once through job_pool_done, woken by the eventfd. */
static void test_job_pool_round_trip(void **state)
{
    enum { N = 1000 };
    struct counted_job *jobs = calloc(N, sizeof *jobs);
    char err[128];
    struct job_pool *p = job_pool_new(two_queues, err, sizeof err);
    size_t back = 0;
    (void)state;

    assert_non_null(jobs);
    assert_non_null(p);
    for (size_t i = 0; i < N; i++) {
        jobs[i].base.run = count_run;
        jobs[i].base.cancel = count_cancel;
        jobs[i].base.owner = &jobs[i];
        jobs[i].base.queue = i % JOB_QUEUES;
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
    struct job_pool *p = job_pool_new(two_queues, err, sizeof err);
    (void)state;

    assert_non_null(p);
    for (size_t i = 0; i < N; i++) {
        jobs[i].base.run = count_run;
        jobs[i].base.cancel = count_cancel;
        job_submit(p, &jobs[i].base);
    }
    job_pool_free(p);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(jobs[i].runs, 1);
}

/* A job that blocks its queue's only thread until released. */
struct gate_job {
    struct job base;
    pthread_mutex_t m;
    pthread_cond_t c;
    int open;
};

static void gate_run(struct job *j)
{
    struct gate_job *g = (struct gate_job *)j;
    pthread_mutex_lock(&g->m);
    while (!g->open)
        pthread_cond_wait(&g->c, &g->m);
    pthread_mutex_unlock(&g->m);
}

/* The AUTH queue's thread is stuck; a store job still runs and comes back, and a job cancelled
 * while it waited behind the stuck one gets its cancel, not its run. */
static void test_job_pool_queues_and_cancel(void **state)
{
    static const unsigned one_each[JOB_QUEUES] = {1, 1};
    char err[128];
    struct job_pool *p = job_pool_new(one_each, err, sizeof err);
    struct gate_job gate;
    struct counted_job store = {0}, waiting = {0};
    struct pollfd pfd;
    struct job *j;
    size_t back = 0;
    (void)state;

    assert_non_null(p);
    memset(&gate, 0, sizeof gate);
    pthread_mutex_init(&gate.m, NULL);
    pthread_cond_init(&gate.c, NULL);
    gate.base.run = gate_run;
    gate.base.queue = JOB_QUEUE_AUTH;
    job_submit(p, &gate.base);
    waiting.base.run = count_run;
    waiting.base.cancel = count_cancel;
    waiting.base.queue = JOB_QUEUE_AUTH;
    job_submit(p, &waiting.base);
    job_cancel(&waiting.base);
    store.base.run = count_run;
    store.base.cancel = count_cancel;
    store.base.queue = JOB_QUEUE_STORE;
    job_submit(p, &store.base);
    pfd = (struct pollfd){.fd = job_pool_fd(p), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 10000), 1);
    j = job_pool_done(p);
    assert_ptr_equal(j, &store.base); /* the stuck AUTH queue did not hold it */
    assert_null(j->next);
    assert_int_equal(store.runs, 1);
    pthread_mutex_lock(&gate.m);
    gate.open = 1;
    pthread_cond_signal(&gate.c);
    pthread_mutex_unlock(&gate.m);
    while (back < 2) {
        pfd = (struct pollfd){.fd = job_pool_fd(p), .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 10000), 1);
        for (j = job_pool_done(p); j != NULL; j = j->next)
            back++;
    }
    assert_int_equal(waiting.runs, 0);
    assert_int_equal(waiting.cancels, 1);
    job_pool_free(p);
    pthread_cond_destroy(&gate.c);
    pthread_mutex_destroy(&gate.m);
}

/* The census against a brute-force reference: random sessions entering, leaving, moving to
 * another address (PROXY) and whole slots cleared, over few addresses (so the per-address limit
 * is hit often) and many (so the tables fill and entries are deleted out of probe chains). */
#define CENSUS_SLOTS 3
#define CENSUS_MAX 40
struct ref_session {
    unsigned slot;
    uint64_t key;
};

static void census_random_run(unsigned max_per_address, unsigned nkeys, uint32_t seed)
{
    struct census *c = census_new(CENSUS_SLOTS, CENSUS_MAX, max_per_address, 0);
    struct ref_session open[CENSUS_MAX];
    unsigned nopen = 0;
    uint32_t x = seed;

    assert_non_null(c);
    for (int op = 0; op < 100000; op++) {
        unsigned r;
        x = x * 1103515245u + 12345u;
        r = x >> 8;
        if (r % 8 < 4) { /* enter */
            unsigned slot = (r >> 3) % CENSUS_SLOTS, same = 0, expect;
            uint64_t key = 1 + (r >> 5) % nkeys;
            for (unsigned i = 0; i < nopen; i++)
                same += open[i].key == key;
            expect = nopen >= CENSUS_MAX                              ? CENSUS_FULL
                     : max_per_address && same >= max_per_address ? CENSUS_ADDRESS_FULL
                                                                  : CENSUS_OK;
            assert_int_equal(census_enter(c, slot, key), expect);
            if (expect == CENSUS_OK)
                open[nopen++] = (struct ref_session){slot, key};
        } else if (r % 8 < 6 && nopen > 0) { /* leave */
            unsigned i = (r >> 3) % nopen;
            census_leave(c, open[i].slot, open[i].key);
            open[i] = open[--nopen];
        } else if (r % 8 == 6 && nopen > 0) { /* a PROXY header names another client */
            unsigned i = (r >> 3) % nopen, same = 0, expect;
            uint64_t key = 1 + (r >> 12) % nkeys;
            for (unsigned j = 0; j < nopen; j++)
                same += open[j].key == key && j != i;
            expect = key == open[i].key || !max_per_address || same < max_per_address
                         ? CENSUS_OK
                         : CENSUS_ADDRESS_FULL;
            assert_int_equal(census_move(c, open[i].slot, open[i].key, key), expect);
            if (expect == CENSUS_OK)
                open[i].key = key;
        } else if (r % 64 == 7) { /* a prefork worker died */
            unsigned slot = (r >> 6) % CENSUS_SLOTS;
            census_clear_slot(c, slot);
            for (unsigned i = 0; i < nopen;)
                if (open[i].slot == slot)
                    open[i] = open[--nopen];
                else
                    i++;
        }
        assert_int_equal(census_total(c), nopen);
    }
    while (nopen > 0) {
        nopen--;
        census_leave(c, open[nopen].slot, open[nopen].key);
    }
    /* Empty again: every address may have max_per_address sessions at once. */
    for (unsigned k = 1; k <= 4; k++)
        for (unsigned i = 0; i < (max_per_address ? max_per_address : 1); i++)
            assert_int_equal(census_enter(c, k % CENSUS_SLOTS, k), CENSUS_OK);
    census_free(c);
}

static void test_census_random(void **state)
{
    (void)state;
    census_random_run(0, 5, 1);       /* --max-clients only */
    census_random_run(3, 4, 2);       /* few addresses: the per-address limit bites */
    census_random_run(2, 1000, 3);    /* many addresses: table churn */
    census_random_run(1, 60, 4);
}

static void test_census_keys(void **state)
{
    struct sockaddr_in a4 = {.sin_family = AF_INET};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6}, b6 = {.sin6_family = AF_INET6};
    struct sockaddr un = {.sa_family = AF_UNIX};

    (void)state;
    assert_int_equal(inet_pton(AF_INET, "192.0.2.7", &a4.sin_addr), 1);
    assert_int_equal(inet_pton(AF_INET6, "::ffff:192.0.2.7", &a6.sin6_addr), 1);
    assert_true(census_key((struct sockaddr *)&a4) != 0);
    /* IPv4-mapped IPv6 is the IPv4 address */
    assert_true(census_key((struct sockaddr *)&a4) == census_key((struct sockaddr *)&a6));
    /* one IPv6 /64 is one client; the next /64 another */
    assert_int_equal(inet_pton(AF_INET6, "2001:db8:1:2::1", &a6.sin6_addr), 1);
    assert_int_equal(inet_pton(AF_INET6, "2001:db8:1:2:ffff:1:2:3", &b6.sin6_addr), 1);
    assert_true(census_key((struct sockaddr *)&a6) == census_key((struct sockaddr *)&b6));
    assert_int_equal(inet_pton(AF_INET6, "2001:db8:1:3::1", &b6.sin6_addr), 1);
    assert_true(census_key((struct sockaddr *)&a6) != census_key((struct sockaddr *)&b6));
    /* no IPv6 key is an IPv4 key */
    assert_int_equal(inet_pton(AF_INET6, "::1", &b6.sin6_addr), 1);
    assert_true(census_key((struct sockaddr *)&b6) > 0xffffffffull + 1);
    assert_int_equal(census_key(&un), 0);
}

/* prefork: the census in MAP_SHARED memory counts sessions entered by other processes, and a
 * process killed while it holds the lock does not wedge the others (robust mutex). */
static void test_census_shared(void **state)
{
    struct census *c = census_new(2, 10, 2, 1);
    pid_t pid;
    int status;

    (void)state;
    assert_non_null(c);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int ok = census_enter(c, 1, 42) == CENSUS_OK && census_enter(c, 1, 42) == CENSUS_OK;
        _exit(ok ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(census_total(c), 2);
    assert_int_equal(census_enter(c, 0, 42), CENSUS_ADDRESS_FULL);
    census_clear_slot(c, 1); /* the worker died */
    assert_int_equal(census_enter(c, 0, 42), CENSUS_OK);
    assert_int_equal(census_total(c), 1);
    census_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timer_heap_random),
        cmocka_unit_test(test_job_pool_round_trip),
        cmocka_unit_test(test_job_pool_free_drains),
        cmocka_unit_test(test_job_pool_queues_and_cancel),
        cmocka_unit_test(test_census_random),
        cmocka_unit_test(test_census_keys),
        cmocka_unit_test(test_census_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
