/*
 * conn.h - the connection pump: moves octets between a non-blocking socket and one engine
 * session, hands the engine's events to session.c, and tells the host model what to wait for.
 *
 * It knows nothing of epoll or threads. A model calls conn_on_readable / conn_on_writable /
 * conn_on_timer when the socket or the clock says so, and each returns CONN_READ | CONN_WRITE
 * (what to wait for next), or CONN_CLOSE (call conn_free). conn_expiry says when to call
 * conn_on_timer. Memory per connection is fixed: the struct, a 16 KiB input buffer and the
 * engine's smtpe_server_memory_size() octets, plus a 64 KiB write buffer while a message is
 * being stored, OpenSSL's state once STARTTLS has run (its record buffers are released while
 * the session is idle), and under LMTP the transaction's accepted recipients (at most
 * max_recipients names, kept for the per-recipient replies).
 *
 * Under STARTTLS the pump runs the handshake itself (bounded by the command timeout) and then
 * reads and writes through TLS; the model only sees CONN_READ / CONN_WRITE as before.
 */
#ifndef SMTPE_HOST_CONN_H
#define SMTPE_HOST_CONN_H

#include <stdint.h>
#include <sys/socket.h>

#include "host.h"

#define CONN_READ (1u << 0)  /* wait until the socket is readable */
#define CONN_WRITE (1u << 1) /* wait until the socket is writable */
#define CONN_CLOSE (1u << 2) /* the connection is over: call conn_free */

struct conn;

/* Makes a connection for the accepted non-blocking socket fd (which it then owns) and queues the
 * greeting. Returns NULL if memory runs out (fd is then still the caller's). */
struct conn *conn_new(const struct host_ctx *ctx, int fd, const struct sockaddr *peer,
                      uint64_t now_ms);

/* Sends what is queued (the greeting at first). Returns CONN_* bits. */
unsigned conn_start(struct conn *c, uint64_t now_ms);

/* The socket is readable (or has hung up): read once, run the engine, send replies.
 * Returns CONN_* bits. */
unsigned conn_on_readable(struct conn *c, uint64_t now_ms);

/* The socket is writable: send replies, then let the engine take input it had to leave.
 * Returns CONN_* bits. */
unsigned conn_on_writable(struct conn *c, uint64_t now_ms);

/* The time conn_expiry gave has come (calling it early is harmless). Returns CONN_* bits. */
unsigned conn_on_timer(struct conn *c, uint64_t now_ms);

/* The monotonic time in ms at which conn_on_timer is due, UINT64_MAX for never. */
uint64_t conn_expiry(const struct conn *c);

/* Server shutdown: discards any unfinished message, queues 421 4.3.2 and sends it if the socket
 * takes it at once. Call conn_free next. */
void conn_shutdown(struct conn *c, uint64_t now_ms);

/* Logs the disconnect line, closes the socket and frees c. */
void conn_free(struct conn *c);

/* The socket of c. */
int conn_fd(const struct conn *c);

/* Refuses the accepted socket fd because the server is full: sends 421 4.7.0 "<hostname> Too
 * many connections" in place of the greeting if the socket takes it at once, logs, and closes
 * fd. */
void conn_reject(const struct host_ctx *ctx, int fd, const struct sockaddr *peer,
                 uint64_t now_ms);

#endif
