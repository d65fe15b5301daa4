/*
 * conn.h - the connection pump: moves octets between a non-blocking socket and one engine
 * session, hands the engine's events to session.c, and tells the host model what to wait for.
 *
 * It knows nothing of epoll or threads. A model calls conn_on_readable / conn_on_writable /
 * conn_on_timer / conn_on_job when the socket, the clock or the job pool says so, and each
 * returns CONN_READ | CONN_WRITE (what to wait for next; 0: neither, only the timer or the
 * job), or CONN_CLOSE (call conn_free). conn_expiry says when to call conn_on_timer.
 *
 * The blocking steps of a verdict (fsync and rename at the end of a message, crypt(3) for
 * AUTH) go to the job pool given to conn_new; the job's owner is the conn, and when the pool
 * gives the job back the model calls conn_on_job. Without a pool they run in the calling
 * thread.
 *
 * --reply-delay-ms holds queued replies that long before the first octet goes out (a timer:
 * conn_expiry), without blocking anything else. --greet-delay-ms holds the greeting the same
 * way (after the PROXY header, if one is expected); a client that sends anything before the
 * greeting went out gets 554 5.5.0 in its place and is disconnected (a pregreet test: spam
 * software that does not wait for the server to speak, RFC 5321 §3.1).
 *
 * Memory per connection: one page-aligned slot of whole pages holding the struct (about 910
 * octets with the session) and the engine's smtpe_server_memory_size() octets, of which an idle
 * session touches the first 4 KiB page; the HELO name and the paths of the transaction, heap
 * strings of their own length; a 16 KiB input buffer only once the engine has
 * left input unconsumed (a client pipelining faster than it reads replies; kept from then on),
 * otherwise input is read into the model's scratch buffer; plus a 64 KiB write buffer while a
 * message is being stored, OpenSSL's state once STARTTLS has run (its record buffers are
 * released while the session is idle), a job (about 1.3 KiB) from the first message stored or
 * AUTH, under LMTP the transaction's accepted recipients (at most max_recipients names,
 * kept for the per-recipient replies), and the log's lists from the first RCPT and the first
 * message accepted (1 KiB of recipients, 8 queue ids: SESSION_LOG_*).
 *
 * Under STARTTLS the pump runs the handshake itself (bounded by the command timeout) and then
 * reads and writes through TLS; the model only sees CONN_READ / CONN_WRITE as before.
 */
#ifndef SMTPE_HOST_CONN_H
#define SMTPE_HOST_CONN_H

#include <stdint.h>
#include <sys/socket.h>

#include "census.h"
#include "host.h"
#include "jobs.h"

#define CONN_INPUT_BUF 16384 /* octets of one read; the size of a model's scratch buffer */

#define CONN_READ (1u << 0)  /* wait until the socket is readable */
#define CONN_WRITE (1u << 1) /* wait until the socket is writable */
#define CONN_CLOSE (1u << 2) /* the connection is over: call conn_free */

struct conn;

/* Makes a connection for the accepted non-blocking socket fd (which it then owns) and queues the
 * greeting. Blocking steps go to pool (NULL: run in the caller's thread). scratch is a buffer of
 * CONN_INPUT_BUF octets the model lends to every conn_on_* call (one per thread: it is free
 * again when the call returns). seat is the session's place in the census (census_enter'ed;
 * NULL: not counted): the connection takes it over and leaves it when it is freed, or at once
 * if conn_new fails. Returns NULL if memory runs out (fd is then still the caller's). */
struct conn *conn_new(const struct host_ctx *ctx, struct job_pool *pool, uint8_t *scratch,
                      int fd, const struct sockaddr *peer, const struct census_seat *seat,
                      uint64_t now_ms);

/* The model's pointer for c (e.g. its wrapper), NULL until set. */
void conn_set_user(struct conn *c, void *user);
void *conn_user(const struct conn *c);

/* Sends what is queued (the greeting at first). Returns CONN_* bits. */
unsigned conn_start(struct conn *c, uint64_t now_ms);

/* The socket is readable (or has hung up): read once, run the engine, send replies.
 * Returns CONN_* bits. */
unsigned conn_on_readable(struct conn *c, uint64_t now_ms);

/* The socket is writable: send replies, then let the engine take input it had to leave.
 * Returns CONN_* bits. */
unsigned conn_on_writable(struct conn *c, uint64_t now_ms);

/* The job c submitted is back from the pool (job->owner was c): gives the verdict that waited
 * and goes on. Returns CONN_* bits. */
unsigned conn_on_job(struct conn *c, uint64_t now_ms);

/* Whether c waits for a message's commit (the 250 or 451 follows when the job is back). */
int conn_storing(const struct conn *c);

/* The time conn_expiry gave has come (calling it early is harmless). Returns CONN_* bits. */
unsigned conn_on_timer(struct conn *c, uint64_t now_ms);

/* The monotonic time in ms at which conn_on_timer is due, UINT64_MAX for never. */
uint64_t conn_expiry(const struct conn *c);

/* Server shutdown: discards any unfinished message, queues 421 4.3.2 and sends it if the socket
 * takes it at once. Call conn_free next. */
void conn_shutdown(struct conn *c, uint64_t now_ms);

/* Logs the disconnect line, closes the socket and frees c. A job of c still in the pool is
 * disowned (owner NULL) and cancelled: whoever takes it back calls its release. */
void conn_free(struct conn *c);

/* The socket of c. */
int conn_fd(const struct conn *c);

/* Refuses the accepted socket fd because the server is full (why: CENSUS_FULL), the client's
 * address has --max-clients-per-ip sessions (CENSUS_ADDRESS_FULL), memory ran out
 * (CONN_REJECT_NOMEM) or the peer is not a --proxy-from balancer (CONN_REJECT_PROXY): sends
 * 421 4.7.0 "<hostname> Too many connections[ from your address]", 421 4.3.2 or 554 5.7.1 in
 * place of the greeting if the socket takes it at once, and closes fd (at once: no lingering
 * close, which would cost the server as much as the session refused). Logs a "reject" line, at
 * most one a second per process with the count of those not logged, so a flood of refused
 * connections cannot flood the log. */
#define CONN_REJECT_NOMEM (-1) /* conn_reject's why: out of memory, 421 4.3.2 */
#define CONN_REJECT_PROXY (-2) /* conn_reject's why: not a --proxy-from balancer, 554 5.7.1 */

/* Whether the accepted peer may have a session. With --proxy-protocol and --proxy-from, a peer
 * that is not one of those balancers is refused at once (it could only send a header that is
 * refused, or hold a place in --max-clients until the command timeout). Otherwise the session
 * is counted into slot of census: under the peer's address, or, with --proxy-protocol, under
 * no address until the header names the client. Returns CENSUS_OK with *seat filled (give it
 * to conn_new), or the why for conn_reject: CENSUS_FULL, CENSUS_ADDRESS_FULL,
 * CONN_REJECT_PROXY. */
int conn_admit(const struct host_ctx *ctx, struct census *census, unsigned slot,
               const struct sockaddr *peer, struct census_seat *seat);
void conn_reject(const struct host_ctx *ctx, int fd, const struct sockaddr *peer, int why,
                 uint64_t now_ms);

#endif
