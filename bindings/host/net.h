/*
 * net.h - socket addresses and listeners for smtpe-server: parsing --listen (TCP or a unix
 * socket), opening a non-blocking listener, formatting peer addresses for logs and trace
 * headers, and address ranges (CIDR) for --xclient-from. For the clients (smtpe-send):
 * parsing a server address and connecting to it, with name resolution and a time limit.
 */
#ifndef SMTPE_HOST_NET_H
#define SMTPE_HOST_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define NET_IP_MAX 64        /* an IP address as text, NUL included */
#define NET_HOSTPORT_MAX 80  /* "[ip6]:port", NUL included */
#define NET_UNIX_PREFIX "unix:" /* --listen unix:/path */

/* Parses "ADDR:PORT" or "[ADDR6]:PORT" (ADDR numeric or a name resolved once; PORT 0..65535,
 * 0: any free port), or "unix:/path" (a unix stream socket), into *ss and *len. Returns 0, or
 * -1 with a message in err. */
int net_parse_listen(const char *text, struct sockaddr_storage *ss, socklen_t *len, char *err,
                     size_t errlen);

/* Opens a non-blocking, close-on-exec listener bound to sa. TCP: SO_REUSEADDR, and SO_REUSEPORT
 * too if reuseport. Unix socket: a stale socket file (one nobody accepts on) is removed first,
 * any other file there is an error, and the new socket is made mode 0666 so that any local
 * user (an MTA) may connect. Returns the descriptor, or -1 with a message in err. */
int net_listen(const struct sockaddr *sa, socklen_t len, int reuseport, char *err,
               size_t errlen);

/* Writes the IP address of sa as text into ip (an IPv4-mapped IPv6 address as plain IPv4) and
 * its port into *port. *v6 is set to 1 for a true IPv6 address. A unix socket gives "unix",
 * anything else "unknown" (port 0). */
void net_ip_text(const struct sockaddr *sa, char ip[NET_IP_MAX], unsigned *port, int *v6);

/* "ip:port" or "[ip6]:port" (or "unix") into out. Returns out. */
char *net_hostport(const struct sockaddr *sa, char out[NET_HOSTPORT_MAX]);

/* The path of a unix socket address, NULL for other families. */
const char *net_unix_path(const struct sockaddr *sa);

/* An address range: family AF_INET or AF_INET6, the network address and the prefix length. */
struct net_cidr {
    int family;
    uint8_t addr[16]; /* 4 octets for AF_INET */
    unsigned prefix;
};

/* Parses "ADDR/LEN" or a bare address (LEN 32 for IPv4, 128 for IPv6; an IPv6 address may be
 * written in brackets). Host bits after the prefix are ignored. Returns 0, or -1. */
int net_parse_cidr(const char *text, struct net_cidr *out);

/* Whether the address (family AF_INET with 4 octets or AF_INET6 with 16, network order) lies in
 * one of the n ranges. An IPv4-mapped IPv6 address matches as its IPv4 address. */
int net_cidr_match(const struct net_cidr *ranges, size_t n, int family, const uint8_t *addr);

/* net_cidr_match for a socket address (never true for a unix socket). */
int net_cidr_match_sa(const struct net_cidr *ranges, size_t n, const struct sockaddr *sa);

/* A server to connect to, as parsed by net_parse_target. */
struct net_target {
    char host[256]; /* the name or numeric address, without brackets; for unix: the path */
    unsigned port;  /* 1..65535; 0 for a unix socket */
    int is_unix;
};

/* Parses "HOST:PORT" (HOST a name or an IPv4 address), "[IPV6]:PORT" or "unix:PATH" into *t
 * without resolving anything. Returns 0, or -1 with a message in err. */
int net_parse_target(const char *text, struct net_target *t, char *err, size_t errlen);

/* Connects a stream socket to t: a unix socket, or each address that HOST resolves to
 * (getaddrinfo, in its order) until one accepts, within timeout_ms milliseconds in all (0: no
 * limit but the kernel's). TCP sockets get TCP_NODELAY. Returns the connected descriptor,
 * non-blocking and close-on-exec, or -1 with a message in err ("connect to HOST:PORT
 * (ADDRESS): <reason>", the last address's reason when several failed). */
int net_connect(const struct net_target *t, uint64_t timeout_ms, char *err, size_t errlen);

/* Readies an accepted connection: TCP_NODELAY on a TCP socket, so that the last reply of a
 * pipelined batch (written on its own after its verdict) is not held back by Nagle's
 * algorithm until the client's delayed ACK, about 40 ms. */
void net_accepted(int fd, const struct sockaddr *peer);

#endif
