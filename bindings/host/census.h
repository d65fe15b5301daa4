/*
 * census.h - who is connected, for --max-clients and --max-clients-per-ip.
 *
 * A census counts the sessions of a group of slots that share the limits: one slot per event
 * loop (reuseport: threads of one process; prefork: worker processes, the census then lives in
 * MAP_SHARED memory), or one slot for the threads model. Each slot counts its sessions and,
 * when a per-address limit is set, its sessions per client address in a table of its own, so
 * that the prefork supervisor can forget everything a dead worker held (census_clear_slot).
 *
 * A client address is counted as a 64-bit key (census_key): an IPv4 address (also an
 * IPv4-mapped IPv6 one) whole, an IPv6 address by its /64 prefix, since one host is normally
 * given a whole /64 and takes any address in it. Unix-socket peers are not counted per address
 * (key 0).
 *
 * Every change and every admission decision is made under one mutex (process-shared and robust
 * for prefork: a worker killed while holding it does not wedge the others), so the limits are
 * exact across loops, threads and processes: the (max_clients + 1)th concurrent session is
 * refused, never admitted by a race.
 *
 * Memory: one mapping of about 100 + 4 * nslots octets, plus, with a per-address limit, nslots
 * tables of 16 * census_table_size(max_clients) octets (the smallest power of two of at least
 * 2 * max_clients entries: 32 KiB per slot for the default of 1000 clients).
 */
#ifndef SMTPE_HOST_CENSUS_H
#define SMTPE_HOST_CENSUS_H

#include <stdint.h>
#include <sys/socket.h>

#define CENSUS_OK 0            /* admitted and counted */
#define CENSUS_FULL 1          /* max_clients sessions are open */
#define CENSUS_ADDRESS_FULL 2  /* max_per_address sessions are open from that address */

struct census;

/* A census of nslots slots for at most max_clients sessions (1..1000000) and at most
 * max_per_address sessions per client address (0: no per-address limit). shared: in memory
 * that processes forked afterwards share. Returns it, or NULL with errno set. */
struct census *census_new(unsigned nslots, unsigned max_clients, unsigned max_per_address,
                          int shared);
void census_free(struct census *c);

/* The key of a client address (see the header comment); 0 for a peer not counted per address
 * (unix socket, unknown family). */
uint64_t census_key(const struct sockaddr *sa);

/* The same from a raw address: family AF_INET (4 octets at addr) or AF_INET6 (16 octets). */
uint64_t census_key_raw(int family, const void *addr);

/* Admits one session into slot from the client key: CENSUS_OK (counted: call census_leave
 * once it ends), CENSUS_FULL or CENSUS_ADDRESS_FULL (not counted). */
int census_enter(struct census *c, unsigned slot, uint64_t key);

/* A session admitted with key leaves slot. */
void census_leave(struct census *c, unsigned slot, uint64_t key);

/* The session admitted with key turns out to come from new_key (a PROXY header names the real
 * client): CENSUS_OK (it now counts under new_key) or CENSUS_ADDRESS_FULL (new_key already has
 * max_per_address sessions; it still counts under key). */
int census_move(struct census *c, unsigned slot, uint64_t key, uint64_t new_key);

/* Forgets every session of slot (prefork: its worker died, and its sessions with it). */
void census_clear_slot(struct census *c, unsigned slot);

/* Sessions open across all slots (read without the lock: for logs). */
unsigned census_total(const struct census *c);

/* What a seat in a census is: kept by the session it counts. */
struct census_seat {
    struct census *census; /* NULL: not counted */
    unsigned slot;
    uint64_t key;
};

#endif
