/*
 * net.h - socket addresses and listeners for smtpe-server: parsing --listen, opening a
 * non-blocking listener, formatting peer addresses for logs and trace headers.
 */
#ifndef SMTPE_HOST_NET_H
#define SMTPE_HOST_NET_H

#include <stddef.h>
#include <sys/socket.h>

#define NET_IP_MAX 64        /* an IP address as text, NUL included */
#define NET_HOSTPORT_MAX 80  /* "[ip6]:port", NUL included */

/* Parses "ADDR:PORT" or "[ADDR6]:PORT" (ADDR numeric or a name resolved once; PORT 0..65535,
 * 0: any free port) into *ss and *len. Returns 0, or -1 with a message in err. */
int net_parse_listen(const char *text, struct sockaddr_storage *ss, socklen_t *len, char *err,
                     size_t errlen);

/* Opens a non-blocking, close-on-exec TCP listener bound to sa (SO_REUSEADDR; SO_REUSEPORT too
 * if reuseport). Returns the descriptor, or -1 with a message in err. */
int net_listen(const struct sockaddr *sa, socklen_t len, int reuseport, char *err,
               size_t errlen);

/* Writes the IP address of sa as text into ip (an IPv4-mapped IPv6 address as plain IPv4) and
 * its port into *port. *v6 is set to 1 for a true IPv6 address. */
void net_ip_text(const struct sockaddr *sa, char ip[NET_IP_MAX], unsigned *port, int *v6);

/* "ip:port" or "[ip6]:port" into out. Returns out. */
char *net_hostport(const struct sockaddr *sa, char out[NET_HOSTPORT_MAX]);

#endif
