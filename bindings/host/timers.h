/*
 * timers.h - a binary min-heap of deadlines for an event loop: one entry per connection (its
 * conn_expiry), so that finding the next deadline costs O(1) and moving one costs O(log n),
 * however many thousand connections wait.
 *
 * Entries live inside the caller's objects; the heap only holds pointers to them. An entry is
 * in the heap while its deadline is finite. One heap per loop; not thread-safe.
 */
#ifndef SMTPE_HOST_TIMERS_H
#define SMTPE_HOST_TIMERS_H

#include <stddef.h>
#include <stdint.h>

#define TIMER_NONE UINT64_MAX /* "no deadline": the entry is not in the heap */

struct timer {
    uint64_t when; /* monotonic ms (host_now_ms); TIMER_NONE when not in the heap */
    size_t pos;    /* index in the heap while in it */
};

struct timer_heap {
    struct timer **v;
    size_t n, cap;
};

/* An empty heap; timer_init makes an entry that is in none. */
void timer_heap_init(struct timer_heap *h);
void timer_init(struct timer *t);

/* Frees the heap's array (not the entries). */
void timer_heap_free(struct timer_heap *h);

/* Sets t's deadline to when (TIMER_NONE takes it out of the heap), moving it as needed.
 * Returns 0, or -1 if the heap cannot grow (t then keeps its old deadline). */
int timer_set(struct timer_heap *h, struct timer *t, uint64_t when);

/* Makes room for n timers in h, so that timer_set of up to n timers cannot fail. Returns 0, or
 * -1 without memory. */
int timer_heap_reserve(struct timer_heap *h, size_t n);

/* The entry with the earliest deadline, NULL if the heap is empty. */
struct timer *timer_first(const struct timer_heap *h);

#endif
