/*
 * tls.h - STARTTLS for smtpe-server (RFC 3207) and for the clients (smtpe-send: STARTTLS and
 * implicit TLS, RFC 8314) over OpenSSL, behind a small interface that knows nothing of the
 * engine or of the host model.
 *
 * One tls_server (an SSL_CTX: certificate chain, key, TLS 1.2 minimum) is built at startup and
 * then only read, so every connection of every thread may share it. Each connection that runs
 * STARTTLS gets a tls_conn (an SSL) on its non-blocking socket. Every I/O call returns either
 * progress or TLS_WANT_READ / TLS_WANT_WRITE, meaning: wait until the socket is readable
 * (writable), then repeat the same call. Without OpenSSL at build time (SMTPE_HAVE_OPENSSL not
 * defined) tls_server_new fails with TLS_UNAVAILABLE_TEXT and nothing else is ever called.
 *
 * The client side is the same with a tls_client (an SSL_CTX that checks the server's
 * certificate against a CA store, TLS 1.2 minimum) and tls_client_conn_new; tls_handshake,
 * tls_read, tls_write, tls_pending, tls_conn_error and tls_conn_free serve both sides. Without
 * OpenSSL tls_client_new fails with TLS_CLIENT_UNAVAILABLE_TEXT.
 */
#ifndef SMTPE_HOST_TLS_H
#define SMTPE_HOST_TLS_H

#include <stddef.h>
#include <sys/types.h>

#define TLS_UNAVAILABLE_TEXT "STARTTLS unavailable: smtpe-server was built without OpenSSL"
#define TLS_CLIENT_UNAVAILABLE_TEXT "TLS unavailable: built without OpenSSL"

/* Results of tls_handshake, tls_read and tls_write (negative, so that a byte count is >= 0). */
#define TLS_WANT_READ (-1)  /* wait for readability, then call again */
#define TLS_WANT_WRITE (-2) /* wait for writability, then call again */
#define TLS_CLOSED (-3)     /* the peer closed the connection (tls_read only) */
#define TLS_FAILED (-4)     /* a TLS or socket error: tls_conn_error says which; close */

#define TLS_ERROR_MAX 160   /* longest error text, NUL included */

struct tls_server;
struct tls_client;
struct tls_conn;

/* 1 if this build has OpenSSL. */
int tls_available(void);

/* Builds the shared server context from a PEM certificate chain file (leaf first) and a PEM
 * private key file, and checks that they match. Returns it, or NULL with a message in err. */
struct tls_server *tls_server_new(const char *cert_file, const char *key_file, char *err,
                                  size_t errlen);

/* Frees what tls_server_new built. NULL is allowed. */
void tls_server_free(struct tls_server *ts);

/* Starts the server side of a handshake on the connected non-blocking socket fd (which stays
 * the caller's). Returns NULL if memory runs out. */
struct tls_conn *tls_conn_new(const struct tls_server *ts, int fd);

/* Sends a close_notify if the connection is up and the socket takes it at once, then frees
 * tc. NULL is allowed. The socket is not closed. */
void tls_conn_free(struct tls_conn *tc);

/* Runs the handshake as far as the socket allows. Returns 0 once it is complete, or
 * TLS_WANT_READ, TLS_WANT_WRITE or TLS_FAILED. */
int tls_handshake(struct tls_conn *tc);

/* Reads up to len octets of plaintext. Returns the count (> 0), or TLS_WANT_READ,
 * TLS_WANT_WRITE, TLS_CLOSED or TLS_FAILED. */
ssize_t tls_read(struct tls_conn *tc, void *buf, size_t len);

/* Writes up to len (> 0) octets of plaintext; may write fewer. Returns the count (> 0), or
 * TLS_WANT_READ, TLS_WANT_WRITE or TLS_FAILED. After a TLS_WANT_* the next call must pass
 * the same octets again at the start of buf (more may follow; buf may have moved). */
ssize_t tls_write(struct tls_conn *tc, const void *buf, size_t len);

/* 1 if the connection holds input that tls_read can return without the socket being
 * readable (decrypted octets left over, or a record already read). */
int tls_pending(const struct tls_conn *tc);

/* Why the last call failed ("tls handshake failed: <this>"): OpenSSL's reason, or the socket
 * error; on the client side a failed certificate check adds its reason ("certificate verify
 * failed: hostname mismatch"). "" if none. Valid until the next call on tc. */
const char *tls_conn_error(const struct tls_conn *tc);

/* Builds the shared client context: TLS 1.2 minimum, no renegotiation, and unless insecure the
 * server's certificate chain checked against the PEM CA certificates of ca_file (NULL: the
 * system's default store). Returns it, or NULL with a message in err. */
struct tls_client *tls_client_new(const char *ca_file, int insecure, char *err, size_t errlen);

/* Frees what tls_client_new built. NULL is allowed. */
void tls_client_free(struct tls_client *tcl);

/* Starts the client side of a handshake on the connected non-blocking socket fd (which stays
 * the caller's). servername (NUL-terminated): the name the certificate must carry (a DNS name,
 * or an IPv4 / IPv6 address matched against the certificate's IP addresses), also sent as SNI
 * when it is a DNS name (RFC 6066 §3 allows no address there); NULL or "" for none, which a
 * checking context refuses (there would be nothing to check the certificate against) and an
 * insecure one accepts. Returns NULL with a message in err. */
struct tls_conn *tls_client_conn_new(const struct tls_client *tcl, int fd, const char *servername,
                                     char *err, size_t errlen);

/* After the handshake: the protocol ("TLSv1.3"), the cipher ("TLS_AES_256_GCM_SHA384") and its
 * secret bits and algorithm bits, for the log and the Received header. */
void tls_conn_info(const struct tls_conn *tc, char *version, size_t version_len, char *cipher,
                   size_t cipher_len, int *bits, int *alg_bits);

#endif
