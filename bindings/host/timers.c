/*
 * timers.c - the deadline heap of an event loop (see timers.h).
 */
#include "timers.h"

#include <stdlib.h>

void timer_heap_init(struct timer_heap *h)
{
    h->v = NULL;
    h->n = h->cap = 0;
}

void timer_init(struct timer *t)
{
    t->when = TIMER_NONE;
    t->pos = 0;
}

void timer_heap_free(struct timer_heap *h)
{
    free(h->v);
    timer_heap_init(h);
}

static void place(struct timer_heap *h, size_t i, struct timer *t)
{
    h->v[i] = t;
    t->pos = i;
}

static void sift_up(struct timer_heap *h, size_t i)
{
    struct timer *t = h->v[i];

    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->v[parent]->when <= t->when)
            break;
        place(h, i, h->v[parent]);
        i = parent;
    }
    place(h, i, t);
}

static void sift_down(struct timer_heap *h, size_t i)
{
    struct timer *t = h->v[i];

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1]->when < h->v[c]->when)
            c++;
        if (t->when <= h->v[c]->when)
            break;
        place(h, i, h->v[c]);
        i = c;
    }
    place(h, i, t);
}

static void remove_at(struct timer_heap *h, size_t i)
{
    struct timer *last = h->v[--h->n];

    if (i == h->n)
        return;
    place(h, i, last);
    sift_up(h, i);
    sift_down(h, last->pos);
}

int timer_heap_reserve(struct timer_heap *h, size_t n)
{
    size_t cap = h->cap ? h->cap : 64;
    struct timer **v;

    if (n <= h->cap)
        return 0;
    while (cap < n)
        cap *= 2;
    if ((v = realloc(h->v, cap * sizeof *v)) == NULL)
        return -1;
    h->v = v;
    h->cap = cap;
    return 0;
}

int timer_set(struct timer_heap *h, struct timer *t, uint64_t when)
{
    uint64_t old = t->when;

    if (old == when)
        return 0;
    if (old == TIMER_NONE) { /* not in the heap yet */
        if (h->n == h->cap) {
            size_t cap = h->cap ? 2 * h->cap : 64;
            struct timer **v = realloc(h->v, cap * sizeof *v);
            if (v == NULL)
                return -1;
            h->v = v;
            h->cap = cap;
        }
        t->when = when;
        place(h, h->n++, t);
        sift_up(h, t->pos);
        return 0;
    }
    if (when == TIMER_NONE) {
        remove_at(h, t->pos);
        t->when = TIMER_NONE;
        return 0;
    }
    t->when = when;
    if (when < old)
        sift_up(h, t->pos);
    else
        sift_down(h, t->pos);
    return 0;
}

struct timer *timer_first(const struct timer_heap *h)
{
    return h->n ? h->v[0] : NULL;
}
