/*
 * smtpe-null-responder: the floor of the peer benchmark (tests/bench/run.sh), what the kernel
 * alone costs for the traffic of an SMTP session: accept, read, write, close.
 *
 * It is NOT an SMTP server. It parses no command and checks nothing; it answers each
 * CRLF-terminated line it reads with the next reply of a fixed script, so that smtpe-loadgen (and
 * any client sending banner/EHLO/MAIL/RCPT.../DATA/content/QUIT, pipelined or not) runs through:
 *   on connect                          220 null ESMTP
 *   a line starting with 'Q' or 'q'    221 bye, then close
 *   the first line                      250-null / 250 PIPELINING
 *   the 4-octet line "DATA" (any case)  354 go; then the content is scanned only for CRLF.CRLF,
 *                                       which gets 250 ok
 *   any other line                      250 ok
 * Several lines in one read are answered in order, with one write.
 *
 * One thread, one level-triggered epoll loop, non-blocking sockets, a listen backlog of 65535
 * (the kernel caps it at net.core.somaxconn), RLIMIT_NOFILE raised to its hard limit. Prints
 * "listening on 127.0.0.1:PORT" on stderr once bound; exits 0 on SIGTERM or SIGINT.
 *
 *   smtpe-null-responder --listen 127.0.0.1:0
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_SIZE 16384
/* Each line of at least 2 octets gets at most 8 octets of reply, the first line at most 26. */
#define OUT_SIZE (4 * READ_SIZE + 64)

static const char REPLY_BANNER[] = "220 null ESMTP\r\n",
                  REPLY_EHLO[] = "250-null\r\n250 PIPELINING\r\n", REPLY_OK[] = "250 ok\r\n",
                  REPLY_DATA[] = "354 go\r\n", REPLY_BYE[] = "221 bye\r\n";

struct conn {
    int fd;
    unsigned char in_data;   /* between 354 and CRLF.CRLF */
    unsigned char match;     /* octets of "\r\n.\r\n" matched, in the content */
    unsigned char seen_line; /* a line was answered: the EHLO reply is given */
    unsigned char closing;   /* 221 queued: close once it is written */
    unsigned char line_len;  /* octets of the current line so far, capped at 6 */
    char head[4];            /* its first octets */
    char last;               /* its last octet */
    char *pend;              /* output the socket did not take yet, or NULL */
    size_t pend_len, pend_off;
};

static char inbuf[READ_SIZE], outbuf[OUT_SIZE];
static int ep;
static struct conn listen_tag, signal_tag; /* epoll data of the listener and of the signalfd */

static void die(const char *what)
{
    fprintf(stderr, "smtpe-null-responder: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void conn_close(struct conn *c)
{
    close(c->fd); /* also leaves the epoll set */
    free(c->pend);
    free(c);
}

/* Appends the replies to the octets in[0..n) to out; returns their length. */
static size_t respond(struct conn *c, const char *in, size_t n, char *out)
{
    static const char end[] = "\r\n.\r\n";
    size_t o = 0;

#define PUT(r)                             \
    do {                                   \
        memcpy(out + o, r, sizeof r - 1);  \
        o += sizeof r - 1;                 \
    } while (0)
    for (size_t i = 0; i < n && !c->closing; i++) {
        char ch = in[i];
        if (c->in_data) { /* only CRLF.CRLF ends it; on a mismatch a CR may start it again */
            if (ch != end[c->match])
                c->match = ch == '\r';
            else if (++c->match == 5) {
                c->in_data = 0;
                PUT(REPLY_OK);
            }
            continue;
        }
        if (ch != '\n' || c->last != '\r') {
            if (c->line_len < 4)
                c->head[c->line_len] = ch;
            if (c->line_len < 6)
                c->line_len++;
            c->last = ch;
            continue;
        }
        /* a whole line; line_len counts its CR */
        if (c->line_len == 5 && strncasecmp(c->head, "DATA", 4) == 0) {
            c->in_data = 1;
            c->match = 2; /* the CRLF just read starts CRLF.CRLF */
            PUT(REPLY_DATA);
        } else if (c->head[0] == 'Q' || c->head[0] == 'q') {
            c->closing = 1;
            PUT(REPLY_BYE);
        } else if (!c->seen_line)
            PUT(REPLY_EHLO);
        else
            PUT(REPLY_OK);
        c->seen_line = 1, c->line_len = 0, c->last = 0;
    }
#undef PUT
    return o;
}

/* Sends out[0..n) (and what was pending before); keeps what the socket does not take and waits
 * for EPOLLOUT instead of EPOLLIN until it is gone. Returns -1 when the connection was closed. */
static int send_out(struct conn *c, const char *out, size_t n)
{
    if (c->pend) { /* only called with n == 0 then */
        out = c->pend + c->pend_off;
        n = c->pend_len - c->pend_off;
    }
    while (n > 0) {
        ssize_t w = send(c->fd, out, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN) {
            conn_close(c);
            return -1;
        }
        if (w < 0)
            break;
        out += w, n -= (size_t)w;
    }
    if (n == 0) {
        if (c->pend) {
            free(c->pend);
            c->pend = NULL;
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
        if (c->closing) {
            conn_close(c);
            return -1;
        }
        return 0;
    }
    if (!c->pend) {
        char *p = malloc(n);
        if (!p) {
            conn_close(c);
            return -1;
        }
        memcpy(p, out, n);
        c->pend = p, c->pend_len = n, c->pend_off = 0;
        struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    } else {
        c->pend_off = c->pend_len - n;
    }
    return 0;
}

static void accept_all(int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            static int told;
            if ((errno == EMFILE || errno == ENFILE) && !told++)
                fprintf(stderr, "smtpe-null-responder: accept: %s\n", strerror(errno));
            return; /* EAGAIN, or out of descriptors: the listener stays readable */
        }
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            conn_close(c);
            continue;
        }
        send_out(c, REPLY_BANNER, sizeof REPLY_BANNER - 1);
    }
}

static void on_event(struct conn *c, unsigned events)
{
    if (c->pend) { /* waiting for EPOLLOUT: read nothing until the output is gone */
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            send_out(c, NULL, 0);
        return;
    }
    ssize_t r = read(c->fd, inbuf, sizeof inbuf);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r <= 0) { /* the client went away */
        conn_close(c);
        return;
    }
    send_out(c, outbuf, respond(c, inbuf, (size_t)r, outbuf));
}

int main(int argc, char **argv)
{
    const char *listen_arg = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
            listen_arg = argv[++i];
        else {
            fprintf(stderr, "usage: smtpe-null-responder --listen IPV4:PORT\n");
            return 2;
        }
    }
    if (!listen_arg)
        listen_arg = "127.0.0.1:2525";

    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[INET_ADDRSTRLEN];
    const char *colon = strrchr(listen_arg, ':');
    char *endp;
    long port = colon ? strtol(colon + 1, &endp, 10) : -1;
    if (!colon || (size_t)(colon - listen_arg) >= sizeof host || colon[1] == '\0' || *endp
        || port < 0 || port > 65535) {
        fprintf(stderr, "smtpe-null-responder: bad --listen %s (want IPV4:PORT)\n", listen_arg);
        return 2;
    }
    memcpy(host, listen_arg, (size_t)(colon - listen_arg));
    host[colon - listen_arg] = '\0';
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "smtpe-null-responder: bad address %s\n", host);
        return 2;
    }
    sa.sin_port = htons((unsigned short)port);

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    if (sigprocmask(SIG_BLOCK, &sigs, NULL) < 0)
        die("sigprocmask");
    int sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0)
        die("signalfd");

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (lfd < 0)
        die("socket");
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0)
        die("bind");
    if (listen(lfd, 65535) < 0)
        die("listen");
    socklen_t salen = sizeof sa;
    if (getsockname(lfd, (struct sockaddr *)&sa, &salen) < 0)
        die("getsockname");
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);

    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0)
        die("epoll_ctl");
    ev.data.ptr = &signal_tag;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev) < 0)
        die("epoll_ctl");

    fprintf(stderr, "listening on %s:%u\n", host, (unsigned)ntohs(sa.sin_port));

    static struct epoll_event evs[1024];
    for (;;) {
        int n = epoll_wait(ep, evs, 1024, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c == &signal_tag)
                return 0; /* SIGTERM or SIGINT */
            if (c == &listen_tag)
                accept_all(lfd);
            else
                on_event(c, evs[i].events);
        }
    }
}
