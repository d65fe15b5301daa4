/*
 * net.c - socket addresses and listeners (see net.h).
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define NET_BACKLOG 65535 /* the kernel caps it at net.core.somaxconn (4096 on Debian 12) */

static int parse_port(const char *s, unsigned *port)
{
    unsigned long v = 0;

    if (*s == '\0' || strlen(s) > 5)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    if (v > 65535)
        return -1;
    *port = (unsigned)v;
    return 0;
}

/* Splits "host:port" / "[host]:port" into host[0..cap) and *port. */
static int split_hostport(const char *text, char *host, size_t cap, unsigned *port)
{
    const char *end, *colon;
    size_t n;

    if (text[0] == '[') {
        end = strchr(text, ']');
        if (end == NULL || end[1] != ':')
            return -1;
        colon = end + 1;
        text++;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL || memchr(text, ':', (size_t)(colon - text)) != NULL)
            return -1; /* no port, or an IPv6 address without brackets */
        end = colon;
    }
    n = (size_t)(end - text);
    if (n == 0 || n >= cap)
        return -1;
    memcpy(host, text, n);
    host[n] = '\0';
    return parse_port(colon + 1, port);
}

/* "unix:/path" into a sockaddr_un. */
static int parse_unix(const char *path, struct sockaddr_storage *ss, socklen_t *len, char *err,
                      size_t errlen)
{
    struct sockaddr_un *un = (struct sockaddr_un *)ss;
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof un->sun_path) {
        snprintf(err, errlen, "bad --listen unix socket path '%s' (1-%zu characters)", path,
                 sizeof un->sun_path - 1);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    un->sun_family = AF_UNIX;
    memcpy(un->sun_path, path, n + 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return 0;
}

int net_parse_listen(const char *text, struct sockaddr_storage *ss, socklen_t *len, char *err,
                     size_t errlen)
{
    char host[256];
    unsigned port;
    struct addrinfo hints, *res = NULL;
    int rc;

    if (strncmp(text, NET_UNIX_PREFIX, strlen(NET_UNIX_PREFIX)) == 0)
        return parse_unix(text + strlen(NET_UNIX_PREFIX), ss, len, err, errlen);
    if (split_hostport(text, host, sizeof host, &port) < 0) {
        snprintf(err, errlen, "bad --listen '%s' (want ADDR:PORT or [ADDR6]:PORT)", text);
        return -1;
    }
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || res == NULL || res->ai_addrlen > sizeof *ss) {
        snprintf(err, errlen, "bad --listen address '%s': %s", host,
                 rc ? gai_strerror(rc) : "no address");
        if (res)
            freeaddrinfo(res);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = (socklen_t)res->ai_addrlen;
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    return 0;
}

/* Removes a unix socket file left by an earlier run, refusing to touch anything else: a file
 * that is not a socket, or a socket some process still accepts on. */
static int remove_stale_socket(const struct sockaddr *sa, socklen_t len, char *err,
                               size_t errlen)
{
    const char *path = net_unix_path(sa);
    struct stat st;
    int fd, rc;

    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "listen on unix:%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "listen on unix:%s: the file exists and is not a socket", path);
        return -1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    do
        rc = connect(fd, sa, len);
    while (rc < 0 && errno == EINTR);
    (void)close(fd);
    if (rc == 0) {
        snprintf(err, errlen, "listen on unix:%s: another server is listening there", path);
        return -1;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
        snprintf(err, errlen, "listen on unix:%s: removing the stale socket: %s", path,
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* bind + chmod 0666 + listen for a unix socket. */
static int listen_unix(int fd, const struct sockaddr *sa, socklen_t len, char *err,
                       size_t errlen)
{
    const char *path = net_unix_path(sa);

    if (remove_stale_socket(sa, len, err, errlen) < 0)
        return -1;
    if (bind(fd, sa, len) < 0 || chmod(path, 0666) < 0 || listen(fd, NET_BACKLOG) < 0) {
        snprintf(err, errlen, "listen on unix:%s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int net_listen(const struct sockaddr *sa, socklen_t len, int reuseport, char *err,
               size_t errlen)
{
    int one = 1;
    char where[NET_HOSTPORT_MAX];
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (sa->sa_family == AF_UNIX) {
        if (listen_unix(fd, sa, len, err, errlen) < 0) {
            (void)close(fd);
            return -1;
        }
        return fd;
    }
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0)) {
        snprintf(err, errlen, "setsockopt: %s", strerror(errno));
        (void)close(fd);
        return -1;
    }
    if (bind(fd, sa, len) < 0 || listen(fd, NET_BACKLOG) < 0) {
        snprintf(err, errlen, "listen on %s: %s", net_hostport(sa, where), strerror(errno));
        (void)close(fd);
        return -1;
    }
    return fd;
}

void net_ip_text(const struct sockaddr *sa, char ip[NET_IP_MAX], unsigned *port, int *v6)
{
    *v6 = 0;
    *port = 0;
    strcpy(ip, sa->sa_family == AF_UNIX ? "unix" : "unknown");
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        (void)inet_ntop(AF_INET, &in->sin_addr, ip, NET_IP_MAX);
        *port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        *port = ntohs(in6->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            (void)inet_ntop(AF_INET, in6->sin6_addr.s6_addr + 12, ip, NET_IP_MAX);
        } else {
            (void)inet_ntop(AF_INET6, &in6->sin6_addr, ip, NET_IP_MAX);
            *v6 = 1;
        }
    }
}

char *net_hostport(const struct sockaddr *sa, char out[NET_HOSTPORT_MAX])
{
    char ip[NET_IP_MAX];
    unsigned port;
    int v6;

    if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) {
        net_ip_text(sa, out, &port, &v6); /* "unix" or "unknown", without a port */
        return out;
    }
    net_ip_text(sa, ip, &port, &v6);
    snprintf(out, NET_HOSTPORT_MAX, v6 ? "[%s]:%u" : "%s:%u", ip, port);
    return out;
}

const char *net_unix_path(const struct sockaddr *sa)
{
    return sa->sa_family == AF_UNIX ? ((const struct sockaddr_un *)sa)->sun_path : NULL;
}

void net_accepted(int fd, const struct sockaddr *peer)
{
    int one = 1;
    if (peer->sa_family == AF_INET || peer->sa_family == AF_INET6)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int net_parse_cidr(const char *text, struct net_cidr *out)
{
    char buf[NET_IP_MAX];
    const char *slash = strchr(text, '/');
    size_t n = slash ? (size_t)(slash - text) : strlen(text);
    unsigned max, prefix;

    if (n >= 2 && text[0] == '[' && text[n - 1] == ']') { /* [v6] or [v6]/len */
        text++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, text, n);
    buf[n] = '\0';
    memset(out, 0, sizeof *out);
    if (inet_pton(AF_INET, buf, out->addr) == 1)
        out->family = AF_INET;
    else if (inet_pton(AF_INET6, buf, out->addr) == 1)
        out->family = AF_INET6;
    else
        return -1;
    max = out->family == AF_INET ? 32 : 128;
    prefix = max;
    if (slash != NULL) {
        const char *p = slash + 1;
        if (*p == '\0' || strlen(p) > 3)
            return -1;
        prefix = 0;
        for (; *p; p++) {
            if (*p < '0' || *p > '9')
                return -1;
            prefix = prefix * 10 + (unsigned)(*p - '0');
        }
        if (prefix > max)
            return -1;
    }
    out->prefix = prefix;
    return 0;
}

/* Whether the first bits of a and b are equal. */
static int prefix_equal(const uint8_t *a, const uint8_t *b, unsigned bits)
{
    unsigned whole = bits / 8, rest = bits % 8;

    if (memcmp(a, b, whole) != 0)
        return 0;
    if (rest == 0)
        return 1;
    return ((a[whole] ^ b[whole]) & (uint8_t)(0xFF00u >> rest)) == 0;
}

int net_cidr_match(const struct net_cidr *ranges, size_t n, int family, const uint8_t *addr)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};

    if (family == AF_INET6 && memcmp(addr, v4mapped, sizeof v4mapped) == 0) {
        family = AF_INET;
        addr += 12;
    }
    for (size_t i = 0; i < n; i++)
        if (ranges[i].family == family && prefix_equal(ranges[i].addr, addr, ranges[i].prefix))
            return 1;
    return 0;
}

int net_cidr_match_sa(const struct net_cidr *ranges, size_t n, const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return net_cidr_match(ranges, n, AF_INET,
                              (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr);
    if (sa->sa_family == AF_INET6)
        return net_cidr_match(ranges, n, AF_INET6,
                              ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr);
    return 0;
}

int net_parse_target(const char *text, struct net_target *t, char *err, size_t errlen)
{
    struct sockaddr_un un;
    size_t n;

    memset(t, 0, sizeof *t);
    if (strncmp(text, NET_UNIX_PREFIX, strlen(NET_UNIX_PREFIX)) == 0) {
        text += strlen(NET_UNIX_PREFIX);
        n = strlen(text);
        if (n == 0 || n >= sizeof un.sun_path) {
            snprintf(err, errlen, "bad unix socket path '%s' (1-%zu characters)", text,
                     sizeof un.sun_path - 1);
            return -1;
        }
        memcpy(t->host, text, n + 1);
        t->is_unix = 1;
        return 0;
    }
    if (split_hostport(text, t->host, sizeof t->host, &t->port) < 0 || t->port == 0) {
        snprintf(err, errlen, "bad server '%s' (want HOST:PORT, [IPV6]:PORT or unix:PATH, "
                              "PORT 1-65535)", text);
        return -1;
    }
    return 0;
}

/* CLOCK_MONOTONIC in milliseconds. */
static uint64_t net_now_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits until the non-blocking connect on fd is done or the deadline (ms, UINT64_MAX: none)
 * passes. Returns 0, or -1 with errno set (ETIMEDOUT at the deadline). */
static int connect_wait(int fd, uint64_t deadline)
{
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int soerr = 0, rc, wait;
    socklen_t sl = sizeof soerr;

    for (;;) {
        wait = -1;
        if (deadline != UINT64_MAX) {
            uint64_t now = net_now_ms();
            if (now >= deadline) {
                errno = ETIMEDOUT;
                return -1;
            }
            wait = deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
        }
        rc = poll(&pfd, 1, wait);
        if (rc > 0)
            break;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
        return -1;
    if (soerr != 0) {
        errno = soerr;
        return -1;
    }
    return 0;
}

/* A unix socket connected to path: a blocking connect (a non-blocking one fails with EAGAIN
 * when the listener's backlog is full) bounded by SO_SNDTIMEO, then made non-blocking. */
static int connect_unix(const char *path, uint64_t timeout_ms, char *err, size_t errlen)
{
    struct sockaddr_un un;
    struct timeval tv = {0, 0};
    int fd, rc;

    memset(&un, 0, sizeof un);
    un.sun_family = AF_UNIX;
    memcpy(un.sun_path, path, strlen(path) + 1); /* net_parse_target checked the length */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    if (timeout_ms > 0) {
        tv.tv_sec = (time_t)(timeout_ms / 1000u);
        tv.tv_usec = (suseconds_t)(timeout_ms % 1000u * 1000u);
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    do
        rc = connect(fd, (const struct sockaddr *)&un, sizeof un);
    while (rc < 0 && errno == EINTR);
    if (rc < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
        snprintf(err, errlen, "connect to " NET_UNIX_PREFIX "%s: %s", path,
                 errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno));
        (void)close(fd);
        return -1;
    }
    return fd;
}

/* One TCP connect to ai within the deadline. Returns the descriptor or -1 with errno set. */
static int connect_tcp_one(const struct addrinfo *ai, uint64_t deadline)
{
    int one = 1, fd, rc, saved;

    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && (errno == EINPROGRESS || errno == EINTR))
        rc = connect_wait(fd, deadline);
    if (rc < 0) {
        saved = errno;
        (void)close(fd);
        errno = saved;
        return -1;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int net_connect(const struct net_target *t, uint64_t timeout_ms, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char service[8], where[NET_HOSTPORT_MAX], ip[NET_IP_MAX];
    uint64_t deadline = timeout_ms > 0 ? net_now_ms() + timeout_ms : UINT64_MAX;
    int rc, fd = -1;

    if (t->is_unix)
        return connect_unix(t->host, timeout_ms, err, errlen);
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(service, sizeof service, "%u", t->port);
    rc = getaddrinfo(t->host, service, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(err, errlen, "resolve %s: %s", t->host,
                 rc == EAI_SYSTEM ? strerror(errno) : rc ? gai_strerror(rc) : "no address");
        if (res)
            freeaddrinfo(res);
        return -1;
    }
    for (const struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = connect_tcp_one(ai, deadline);
        if (fd < 0) {
            const char *why = errno == ETIMEDOUT ? "timed out" : strerror(errno);
            unsigned port;
            int v6;

            net_ip_text(ai->ai_addr, ip, &port, &v6);
            if (strcmp(ip, t->host) == 0) /* numeric: the address says nothing more */
                snprintf(err, errlen, v6 ? "connect to [%s]:%u: %s" : "connect to %s:%u: %s",
                         t->host, t->port, why);
            else
                snprintf(err, errlen, "connect to %s:%u (%s): %s", t->host, t->port,
                         net_hostport(ai->ai_addr, where), why);
        }
    }
    freeaddrinfo(res);
    return fd;
}
