/*
 * tls.c - STARTTLS over OpenSSL, server and client side (see tls.h).
 *
 * The context: TLS 1.2 minimum, no renegotiation (a client could otherwise make the server
 * spend handshakes at will), no server-side session cache (it would grow with the number of
 * clients; TLS 1.3 tickets are stateless and stay on), a missing close_notify taken as a normal
 * end of stream (most SMTP clients close after QUIT without one). Each SSL writes partially and
 * accepts a moved write buffer, because the engine's output buffer may grow or move between
 * two attempts; buffers are released while idle, so an idle TLS session costs little.
 *
 * The client context: TLS 1.2 minimum, no renegotiation, the server's chain checked against
 * the given CA file or the system's store (SSL_VERIFY_PEER) and its name against the expected
 * one (X509_VERIFY_PARAM: DNS names without partial wildcards, or an IP address), a missing
 * close_notify taken as the end of stream too (servers close after 221 without one).
 *
 * Every OpenSSL call on a connection starts with an empty error queue, so that the reason
 * reported for a failure is that call's and not an older one's.
 */
#include "tls.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SMTPE_HAVE_OPENSSL

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

struct tls_server {
    SSL_CTX *ctx;
};

struct tls_client {
    SSL_CTX *ctx;
};

struct tls_conn {
    SSL *ssl;
    int dead;         /* a fatal error happened: no close_notify may be sent */
    int client;       /* the client side: its certificate check may explain a failure */
    const char *peer; /* "client" or "server", for "connection closed by the <peer>" */
    char error[TLS_ERROR_MAX];
};

int tls_available(void)
{
    return 1;
}

/* The oldest queued OpenSSL error as text into out, "" if there is none. Empties the queue. */
static void openssl_reason(char *out, size_t len)
{
    unsigned long e = ERR_get_error();
    const char *r;

    out[0] = '\0';
    if (e == 0)
        return;
    r = ERR_reason_error_string(e);
    if (r != NULL)
        snprintf(out, len, "%s", r);
    else
        ERR_error_string_n(e, out, len);
    ERR_clear_error();
}

static int ctx_fail(SSL_CTX *ctx, char *err, size_t errlen, const char *what, const char *file)
{
    char reason[TLS_ERROR_MAX];

    openssl_reason(reason, sizeof reason);
    snprintf(err, errlen, "%s%s%s: %s", what, file ? " " : "", file ? file : "",
             reason[0] ? reason : "unknown error");
    SSL_CTX_free(ctx);
    return -1;
}

struct tls_server *tls_server_new(const char *cert_file, const char *key_file, char *err,
                                  size_t errlen)
{
    struct tls_server *ts;
    SSL_CTX *ctx;
    uint64_t options = SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE;

#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
    options |= SSL_OP_IGNORE_UNEXPECTED_EOF;
#endif
    ERR_clear_error();
    ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        (void)ctx_fail(NULL, err, errlen, "TLS context", NULL);
        return NULL;
    }
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS minimum version", NULL);
        return NULL;
    }
    SSL_CTX_set_options(ctx, options);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS certificate", cert_file);
        return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS key", key_file);
        return NULL;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS key does not match the certificate", key_file);
        return NULL;
    }
    ts = malloc(sizeof *ts);
    if (ts == NULL) {
        snprintf(err, errlen, "TLS context: out of memory");
        SSL_CTX_free(ctx);
        return NULL;
    }
    ts->ctx = ctx;
    return ts;
}

void tls_server_free(struct tls_server *ts)
{
    if (ts == NULL)
        return;
    SSL_CTX_free(ts->ctx);
    free(ts);
}

struct tls_conn *tls_conn_new(const struct tls_server *ts, int fd)
{
    struct tls_conn *tc = malloc(sizeof *tc);

    if (tc == NULL)
        return NULL;
    ERR_clear_error();
    tc->ssl = SSL_new(ts->ctx);
    if (tc->ssl == NULL || SSL_set_fd(tc->ssl, fd) != 1) {
        SSL_free(tc->ssl);
        free(tc);
        ERR_clear_error();
        return NULL;
    }
    SSL_set_accept_state(tc->ssl);
    tc->dead = 0;
    tc->client = 0;
    tc->peer = "client";
    tc->error[0] = '\0';
    return tc;
}

void tls_conn_free(struct tls_conn *tc)
{
    if (tc == NULL)
        return;
    ERR_clear_error();
    if (!tc->dead && SSL_is_init_finished(tc->ssl))
        (void)SSL_shutdown(tc->ssl); /* one try: a client gone or not reading gets none */
    ERR_clear_error();
    SSL_free(tc->ssl);
    free(tc);
}

struct tls_client *tls_client_new(const char *ca_file, int insecure, char *err, size_t errlen)
{
    struct tls_client *tcl;
    SSL_CTX *ctx;
    uint64_t options = SSL_OP_NO_RENEGOTIATION;

#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
    options |= SSL_OP_IGNORE_UNEXPECTED_EOF;
#endif
    ERR_clear_error();
    ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        (void)ctx_fail(NULL, err, errlen, "TLS context", NULL);
        return NULL;
    }
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS minimum version", NULL);
        return NULL;
    }
    SSL_CTX_set_options(ctx, options);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_verify(ctx, insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    if (!insecure && ca_file != NULL &&
        SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS CA file", ca_file);
        return NULL;
    }
    if (!insecure && ca_file == NULL && SSL_CTX_set_default_verify_paths(ctx) != 1) {
        (void)ctx_fail(ctx, err, errlen, "TLS system CA store", NULL);
        return NULL;
    }
    tcl = malloc(sizeof *tcl);
    if (tcl == NULL) {
        snprintf(err, errlen, "TLS context: out of memory");
        SSL_CTX_free(ctx);
        return NULL;
    }
    tcl->ctx = ctx;
    return tcl;
}

void tls_client_free(struct tls_client *tcl)
{
    if (tcl == NULL)
        return;
    SSL_CTX_free(tcl->ctx);
    free(tcl);
}

/* 1 if name is a numeric IPv4 or IPv6 address. */
static int is_ip_address(const char *name)
{
    unsigned char buf[16];

    return inet_pton(AF_INET, name, buf) == 1 || inet_pton(AF_INET6, name, buf) == 1;
}

/* Sets the name the certificate must carry (when verify) and the SNI (a DNS name only).
 * Returns 0, or -1 with a message in err. */
static int client_set_name(struct tls_conn *tc, const char *servername, int verify, char *err,
                           size_t errlen)
{
    X509_VERIFY_PARAM *param = SSL_get0_param(tc->ssl);
    char reason[TLS_ERROR_MAX];
    int ok;

    if (servername == NULL || servername[0] == '\0') {
        if (!verify)
            return 0;
        snprintf(err, errlen, "no server name to check the certificate against");
        return -1;
    }
    if (is_ip_address(servername)) {
        ok = !verify || X509_VERIFY_PARAM_set1_ip_asc(param, servername) == 1;
    } else {
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        ok = SSL_set_tlsext_host_name(tc->ssl, servername) == 1 &&
             (!verify || SSL_set1_host(tc->ssl, servername) == 1);
    }
    if (ok)
        return 0;
    openssl_reason(reason, sizeof reason);
    snprintf(err, errlen, "TLS server name '%s': %s", servername,
             reason[0] ? reason : "not usable");
    return -1;
}

struct tls_conn *tls_client_conn_new(const struct tls_client *tcl, int fd, const char *servername,
                                     char *err, size_t errlen)
{
    struct tls_conn *tc = malloc(sizeof *tc);
    int verify = SSL_CTX_get_verify_mode(tcl->ctx) != SSL_VERIFY_NONE;

    if (tc == NULL) {
        snprintf(err, errlen, "TLS: out of memory");
        return NULL;
    }
    ERR_clear_error();
    tc->ssl = SSL_new(tcl->ctx);
    if (tc->ssl == NULL || SSL_set_fd(tc->ssl, fd) != 1) {
        snprintf(err, errlen, "TLS: out of memory");
        SSL_free(tc->ssl);
        free(tc);
        ERR_clear_error();
        return NULL;
    }
    if (client_set_name(tc, servername, verify, err, errlen) < 0) {
        SSL_free(tc->ssl);
        free(tc);
        ERR_clear_error();
        return NULL;
    }
    SSL_set_connect_state(tc->ssl);
    tc->dead = 0;
    tc->client = 1;
    tc->peer = "server";
    tc->error[0] = '\0';
    return tc;
}

/* Maps the result r of an SSL call to a TLS_* code (r <= 0), recording the error. */
static int map_error(struct tls_conn *tc, int r)
{
    int e = SSL_get_error(tc->ssl, r), saved = errno;

    switch (e) {
    case SSL_ERROR_WANT_READ:
        return TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        return TLS_CLOSED;
    case SSL_ERROR_SYSCALL:
        tc->dead = 1;
        if (ERR_peek_error() != 0)
            openssl_reason(tc->error, sizeof tc->error);
        else if (saved != 0)
            snprintf(tc->error, sizeof tc->error, "%s", strerror(saved));
        else
            snprintf(tc->error, sizeof tc->error, "connection closed by the %s", tc->peer);
        return TLS_FAILED;
    default:
        tc->dead = 1;
        openssl_reason(tc->error, sizeof tc->error);
        if (tc->error[0] == '\0')
            snprintf(tc->error, sizeof tc->error, "TLS error %d", e);
        return TLS_FAILED;
    }
}

/* A failed client handshake whose certificate check failed: the check's reason after
 * OpenSSL's ("certificate verify failed: self-signed certificate"). */
static void add_verify_reason(struct tls_conn *tc)
{
    long v = SSL_get_verify_result(tc->ssl);
    size_t n = strlen(tc->error);

    if (v == X509_V_OK)
        return;
    snprintf(tc->error + n, sizeof tc->error - n, "%s%s", n ? ": " : "",
             X509_verify_cert_error_string(v));
}

int tls_handshake(struct tls_conn *tc)
{
    int r;

    ERR_clear_error();
    errno = 0;
    r = SSL_do_handshake(tc->ssl);
    if (r == 1)
        return 0;
    r = map_error(tc, r);
    if (r == TLS_CLOSED) { /* a close_notify in the middle of the handshake */
        snprintf(tc->error, sizeof tc->error, "connection closed by the %s", tc->peer);
        return TLS_FAILED;
    }
    if (r == TLS_FAILED && tc->client)
        add_verify_reason(tc);
    return r;
}

ssize_t tls_read(struct tls_conn *tc, void *buf, size_t len)
{
    size_t got = 0;
    int r;

    ERR_clear_error();
    errno = 0;
    r = SSL_read_ex(tc->ssl, buf, len, &got);
    if (r == 1)
        return (ssize_t)got;
    return map_error(tc, r);
}

ssize_t tls_write(struct tls_conn *tc, const void *buf, size_t len)
{
    size_t put = 0;
    int r;

    ERR_clear_error();
    errno = 0;
    r = SSL_write_ex(tc->ssl, buf, len, &put);
    if (r == 1)
        return (ssize_t)put;
    r = map_error(tc, r);
    if (r == TLS_CLOSED) {
        tc->dead = 1;
        snprintf(tc->error, sizeof tc->error, "connection closed by the %s", tc->peer);
        return TLS_FAILED;
    }
    return r;
}

int tls_pending(const struct tls_conn *tc)
{
    return SSL_has_pending(tc->ssl);
}

const char *tls_conn_error(const struct tls_conn *tc)
{
    return tc->error;
}

void tls_conn_info(const struct tls_conn *tc, char *version, size_t version_len, char *cipher,
                   size_t cipher_len, int *bits, int *alg_bits)
{
    const SSL_CIPHER *c = SSL_get_current_cipher(tc->ssl);

    snprintf(version, version_len, "%s", SSL_get_version(tc->ssl));
    snprintf(cipher, cipher_len, "%s", c ? SSL_CIPHER_get_name(c) : "unknown");
    *alg_bits = 0;
    *bits = c ? SSL_CIPHER_get_bits(c, alg_bits) : 0;
}

#else /* !SMTPE_HAVE_OPENSSL: nothing is ever called but tls_available, tls_server_new and
        * tls_client_new */

struct tls_server {
    int unused;
};

struct tls_conn {
    int unused;
};

int tls_available(void)
{
    return 0;
}

struct tls_server *tls_server_new(const char *cert_file, const char *key_file, char *err,
                                  size_t errlen)
{
    (void)cert_file;
    (void)key_file;
    snprintf(err, errlen, "%s", TLS_UNAVAILABLE_TEXT);
    return NULL;
}

void tls_server_free(struct tls_server *ts)
{
    (void)ts;
}

struct tls_conn *tls_conn_new(const struct tls_server *ts, int fd)
{
    (void)ts;
    (void)fd;
    return NULL;
}

void tls_conn_free(struct tls_conn *tc)
{
    (void)tc;
}

struct tls_client {
    int unused;
};

struct tls_client *tls_client_new(const char *ca_file, int insecure, char *err, size_t errlen)
{
    (void)ca_file;
    (void)insecure;
    snprintf(err, errlen, "%s", TLS_CLIENT_UNAVAILABLE_TEXT);
    return NULL;
}

void tls_client_free(struct tls_client *tcl)
{
    (void)tcl;
}

struct tls_conn *tls_client_conn_new(const struct tls_client *tcl, int fd, const char *servername,
                                     char *err, size_t errlen)
{
    (void)tcl;
    (void)fd;
    (void)servername;
    snprintf(err, errlen, "%s", TLS_CLIENT_UNAVAILABLE_TEXT);
    return NULL;
}

int tls_handshake(struct tls_conn *tc)
{
    (void)tc;
    return TLS_FAILED;
}

ssize_t tls_read(struct tls_conn *tc, void *buf, size_t len)
{
    (void)tc;
    (void)buf;
    (void)len;
    return TLS_FAILED;
}

ssize_t tls_write(struct tls_conn *tc, const void *buf, size_t len)
{
    (void)tc;
    (void)buf;
    (void)len;
    return TLS_FAILED;
}

int tls_pending(const struct tls_conn *tc)
{
    (void)tc;
    return 0;
}

const char *tls_conn_error(const struct tls_conn *tc)
{
    (void)tc;
    return TLS_UNAVAILABLE_TEXT;
}

void tls_conn_info(const struct tls_conn *tc, char *version, size_t version_len, char *cipher,
                   size_t cipher_len, int *bits, int *alg_bits)
{
    (void)tc;
    snprintf(version, version_len, "none");
    snprintf(cipher, cipher_len, "none");
    *bits = *alg_bits = 0;
}

#endif
