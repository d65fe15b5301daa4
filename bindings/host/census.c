/*
 * census.c - sessions per slot and per client address (see census.h).
 *
 * Layout of the one allocation: struct census (the mutex, the limits, the per-slot session
 * counts), then nslots open-addressing tables of census_entry, each `cap` entries (a power of
 * two), linear probing, deletion by backward shift so that no tombstones accumulate. A slot's
 * table holds at most as many keys as the slot has sessions, at most max_clients, and cap is at
 * least twice that, so a probe always ends at an empty entry.
 */
#include "census.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct census_entry {
    uint64_t key; /* 0: empty */
    uint32_t n;   /* sessions of this slot from key */
    uint32_t pad;
};

struct census {
    pthread_mutex_t lock;
    unsigned max_clients;
    unsigned max_per_address;
    unsigned nslots;
    unsigned cap;       /* entries per slot table; 0 without a per-address limit */
    int shared;
    size_t size;        /* octets of the allocation */
    struct census_entry *tables;
    atomic_uint active[]; /* sessions per slot */
};

static unsigned table_size(unsigned max_clients)
{
    unsigned cap = 16;

    while (cap < 2u * max_clients)
        cap <<= 1;
    return cap;
}

struct census *census_new(unsigned nslots, unsigned max_clients, unsigned max_per_address,
                          int shared)
{
    size_t head = offsetof(struct census, active) + nslots * sizeof(atomic_uint);
    unsigned cap = max_per_address ? table_size(max_clients) : 0;
    size_t size, off;
    pthread_mutexattr_t ma;
    struct census *c;
    int e;

    if (nslots == 0 || max_clients == 0 || max_clients > 1000000) {
        errno = EINVAL;
        return NULL;
    }
    off = (head + 15) & ~(size_t)15;
    size = off + (size_t)nslots * cap * sizeof(struct census_entry);
    if (shared) {
        c = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (c == MAP_FAILED)
            return NULL;
    } else if ((c = calloc(1, size)) == NULL) {
        return NULL;
    }
    c->max_clients = max_clients;
    c->max_per_address = max_per_address;
    c->nslots = nslots;
    c->cap = cap;
    c->shared = shared;
    c->size = size;
    c->tables = (struct census_entry *)(void *)((char *)c + off);
    for (unsigned i = 0; i < nslots; i++)
        atomic_init(&c->active[i], 0);
    if ((e = pthread_mutexattr_init(&ma)) == 0) {
        if (shared && (e = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED)) == 0)
            e = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
        if (e == 0)
            e = pthread_mutex_init(&c->lock, &ma);
        (void)pthread_mutexattr_destroy(&ma);
    }
    if (e != 0) {
        if (shared)
            (void)munmap(c, size);
        else
            free(c);
        errno = e;
        return NULL;
    }
    return c;
}

void census_free(struct census *c)
{
    if (c == NULL)
        return;
    (void)pthread_mutex_destroy(&c->lock);
    if (c->shared)
        (void)munmap(c, c->size);
    else
        free(c);
}

static void lock(struct census *c)
{
    /* EOWNERDEAD: a worker died holding the lock. What it held is forgotten by the supervisor
     * (census_clear_slot); the other slots' counts are whole, since a worker only writes its
     * own slot. */
    if (pthread_mutex_lock(&c->lock) == EOWNERDEAD)
        (void)pthread_mutex_consistent(&c->lock);
}

static void unlock(struct census *c)
{
    (void)pthread_mutex_unlock(&c->lock);
}

uint64_t census_key_raw(int family, const void *addr)
{
    const uint8_t *a = addr;
    uint64_t k = 0;

    if (family == AF_INET)
        return ((uint64_t)a[0] << 24 | (uint64_t)a[1] << 16 | (uint64_t)a[2] << 8 | a[3]) + 1;
    if (family != AF_INET6)
        return 0;
    {
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, mapped, sizeof mapped) == 0)
            return census_key_raw(AF_INET, a + 12);
    }
    for (int i = 0; i < 8; i++)
        k = k << 8 | a[i];
    /* The IPv4 keys are 1 .. 2^32; ::/64 (::1 and the deprecated compatible addresses) and the
     * few prefixes below 2^32 + 1, none of them routable, share the key of ff00::/64 (multicast,
     * never a source). */
    return k <= (1ull << 32) ? UINT64_MAX : k;
}

uint64_t census_key(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return census_key_raw(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr);
    if (sa->sa_family == AF_INET6)
        return census_key_raw(AF_INET6,
                              &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr);
    return 0;
}

static struct census_entry *table(struct census *c, unsigned slot)
{
    return c->tables + (size_t)slot * c->cap;
}

static unsigned home(const struct census *c, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (unsigned)key & (c->cap - 1);
}

/* The entry of key in slot's table, or the empty entry where it would go. */
static struct census_entry *find(struct census *c, unsigned slot, uint64_t key)
{
    struct census_entry *t = table(c, slot);
    unsigned i = home(c, key);

    for (unsigned probes = 0; probes < c->cap; probes++, i = (i + 1) & (c->cap - 1))
        if (t[i].key == key || t[i].key == 0)
            return &t[i];
    return NULL; /* cannot happen: a table is never more than half full */
}

static unsigned address_count(struct census *c, uint64_t key)
{
    unsigned n = 0;

    for (unsigned s = 0; s < c->nslots; s++) {
        struct census_entry *e = find(c, s, key);
        if (e != NULL && e->key == key)
            n += e->n;
    }
    return n;
}

/* Removes one session of key from slot's table (backward-shift deletion). */
static void address_remove(struct census *c, unsigned slot, uint64_t key)
{
    struct census_entry *t = table(c, slot), *e = find(c, slot, key);
    unsigned i, j, mask = c->cap - 1;

    if (e == NULL || e->key != key)
        return;
    if (--e->n > 0)
        return;
    i = (unsigned)(e - t);
    for (j = (i + 1) & mask; t[j].key != 0; j = (j + 1) & mask) {
        unsigned h = home(c, t[j].key);
        /* t[j] may move into the hole at i unless its home lies cyclically in (i, j]. */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            t[i] = t[j];
            i = j;
        }
    }
    t[i].key = 0;
    t[i].n = 0;
}

static int address_add(struct census *c, unsigned slot, uint64_t key)
{
    struct census_entry *e = find(c, slot, key);

    if (e == NULL)
        return -1;
    e->key = key;
    e->n++;
    return 0;
}

static int counted(const struct census *c, uint64_t key)
{
    return c->cap > 0 && key != 0;
}

int census_enter(struct census *c, unsigned slot, uint64_t key)
{
    int rc = CENSUS_OK;

    lock(c);
    if (census_total(c) >= c->max_clients) /* exact: every change is made under the lock */
        rc = CENSUS_FULL;
    else if (counted(c, key) && (address_count(c, key) >= c->max_per_address ||
                                 address_add(c, slot, key) < 0))
        rc = CENSUS_ADDRESS_FULL;
    if (rc == CENSUS_OK)
        atomic_fetch_add_explicit(&c->active[slot], 1, memory_order_relaxed);
    unlock(c);
    return rc;
}

void census_leave(struct census *c, unsigned slot, uint64_t key)
{
    lock(c);
    if (counted(c, key))
        address_remove(c, slot, key);
    if (atomic_load_explicit(&c->active[slot], memory_order_relaxed) > 0)
        atomic_fetch_sub_explicit(&c->active[slot], 1, memory_order_relaxed);
    unlock(c);
}

int census_move(struct census *c, unsigned slot, uint64_t key, uint64_t new_key)
{
    int rc = CENSUS_OK;

    if (!counted(c, new_key) || new_key == key)
        return CENSUS_OK;
    lock(c);
    if (address_count(c, new_key) >= c->max_per_address || address_add(c, slot, new_key) < 0)
        rc = CENSUS_ADDRESS_FULL;
    else if (counted(c, key))
        address_remove(c, slot, key);
    unlock(c);
    return rc;
}

void census_clear_slot(struct census *c, unsigned slot)
{
    lock(c);
    if (c->cap > 0)
        memset(table(c, slot), 0, (size_t)c->cap * sizeof(struct census_entry));
    atomic_store_explicit(&c->active[slot], 0, memory_order_relaxed);
    unlock(c);
}

unsigned census_total(const struct census *c)
{
    unsigned n = 0;

    for (unsigned i = 0; i < c->nslots; i++)
        n += atomic_load_explicit(&c->active[i], memory_order_relaxed);
    return n;
}
