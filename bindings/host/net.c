/*
 * net.c - socket addresses and listeners (see net.h).
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NET_BACKLOG 1024

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

int net_parse_listen(const char *text, struct sockaddr_storage *ss, socklen_t *len, char *err,
                     size_t errlen)
{
    char host[256];
    unsigned port;
    struct addrinfo hints, *res = NULL;
    int rc;

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
    strcpy(ip, "unknown");
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

    net_ip_text(sa, ip, &port, &v6);
    snprintf(out, NET_HOSTPORT_MAX, v6 ? "[%s]:%u" : "%s:%u", ip, port);
    return out;
}
