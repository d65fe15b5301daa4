/*
 * smtpe-loadgen: an SMTP load generator (issue 4, "Load generator").
 *
 * One epoll loop (edge-triggered, no threads) holds up to --concurrency client sessions at once
 * and runs --sessions of them in all, each of the shape of the Ruby study: read the 220 banner,
 * EHLO, MAIL FROM, RCPT TO (x --rcpts), DATA, a message of --body-size octets (CRLF lines, some
 * starting with '.', dot-stuffed on the wire, ended by CRLF.CRLF), QUIT. Every reply is checked
 * (multi-line replies parsed; a wrong code, a malformed reply, a closed connection or passing
 * --timeout-ms is a failed session). With --pipelining, MAIL, RCPT... and DATA go in one write
 * when the EHLO reply advertises PIPELINING. --sources N binds each connection to one of
 * 127.0.0.1 .. 127.0.0.N, round-robin, so that 10 000 connections to a loopback target fit the
 * ephemeral ports. --max-opening (default 256) caps the sessions connecting or awaiting the
 * banner at once, so a burst of connects does not overflow the server's accept queue (with SYN
 * cookies such a connection looks established to the client, which then waits for a banner
 * forever, SMTP being server-speaks-first).
 *
 * While it runs it prints a progress line on stderr once a second (not with --quiet); at the end
 * one JSON line on stdout:
 *   {"sessions":N,"failed":F,"seconds":S,"sessions_per_s":R,"p50_ms":..,"p95_ms":..,
 *    "p99_ms":..,"client_cpu_s":C,"peak_concurrency":P}
 * sessions counts every session run (successful or not), sessions_per_s counts the successful
 * ones only, the percentiles are over successful sessions (latency: from connect() to the QUIT
 * reply), client_cpu_s is user + system CPU of this process (getrusage), peak_concurrency the
 * most sessions open at once (below --concurrency when sessions end faster than they open).
 * Exit status: 0 when no session failed, 1 when some did (or --max-seconds stopped the run
 * before every session ran), 2 on a usage or setup error.
 *
 *   smtpe-loadgen --connect 127.0.0.1:2525 --sessions 20000 --concurrency 1000 --sources 4
 *
 * Durability options (issue 5, tests/integration/test_durability.py):
 *
 * Sequence numbers. Session i (0-based, in the order sessions are started) has the sequence
 * number seq = --seq-base + i (default base 0), so that successive runs against one Maildir can
 * use disjoint ranges.
 *
 * --ack-log FILE (created or truncated, mode 0644): one line per session that reached the
 * end-of-data reply or lost its connection while waiting for it (after its DATA got 354):
 *   "<seq> <queue-id>\n"   the end-of-data reply was 250; queue-id is the token after
 *                          "queued as " in that reply's last line, or "-" when there is none;
 *   "<seq> FAIL <code>\n"  the end-of-data reply had another code (e.g. "7 FAIL 451");
 *   "<seq> FAIL noreply\n" the session ended (closed, reset, timeout, --max-seconds) while the
 *                          message was being sent or its end-of-data reply was awaited: the
 *                          server may or may not have stored it.
 * Each line goes out in one write(2) on an O_APPEND descriptor as soon as the reply is read
 * (or the session fails), before any further command is sent: no buffering in this process.
 * A session that fails before its 354 gets no line.
 *
 * --unique: every session sends its own message, a function of its seq N and --body-size B
 * only, so that a checker regenerates the exact content octets (before dot-stuffing):
 *   rng: splitmix64 with state S = N (a 64-bit unsigned integer, arithmetic modulo 2^64):
 *        S += 0x9E3779B97F4A7C15; z = S; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 *        z = (z ^ (z >> 27)) * 0x94D049BB133111EB; next = z ^ (z >> 31).
 *   tag    = next & 0xFFFFFFFF, written as 8 lowercase hex digits;
 *   r      = next; want = 49152 + (r >> 32) % 131072 when r % 10 == 0 (one message in ten,
 *            48 KiB .. 176 KiB, across the server's 64 KiB write buffer), else
 *            B / 2 + (r >> 32) % (B + 1) (B/2 .. 3B/2, so B is the mean of the small ones);
 *   header = "From: <loadgen@example.org>\r\nTo: <user1@example.com>\r\n"
 *            "Subject: smtpe-loadgen N\r\nMessage-ID: <N.TAG@loadgen>\r\n\r\n"
 *            (N in decimal);
 *   then, for line index i = 0, 1, 2, ... while the content so far is shorter than want
 *   octets: v = next; L = v % 77; the line is the L octets ALPHA[(N + i) % 36 + k] for
 *   k = 0..L-1, where ALPHA is "abcdefghijklmnopqrstuvwxyz0123456789" repeated (index mod 36),
 *   except that its first octet becomes '.' when L > 0 and (v >> 8) % 5 == 0; then CRLF.
 * So the content ends with CRLF, may pass want by up to 78 octets, holds empty lines, lines
 * of one '.', and lines starting with '.' (dot-stuffed on the wire). Without --unique every
 * session sends the same message (below, build_messages).
 *
 * --max-seconds S: after S seconds no new session starts and every open one fails
 * ("max-seconds"); the JSON line then counts only the sessions that ran. With the server gone
 * (killed), sessions fail fast (connection refused or reset) and the run still ends by itself;
 * this is a bound for the case where something hangs.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#define INBUF_SIZE 4096
#define MAX_FAIL_REPORTS 10

enum step { ST_CONNECT, ST_BANNER, ST_EHLO, ST_MAIL, ST_RCPT, ST_DATA, ST_DOT, ST_QUIT };

static const char *const step_name[] = {"connect", "banner", "EHLO reply", "MAIL reply",
                                        "RCPT reply", "DATA reply", "end-of-data reply",
                                        "QUIT reply"};

struct session {
    int fd;                /* -1 when the slot is free */
    enum step step;        /* the reply awaited (or ST_CONNECT) */
    int rcpt_done;         /* RCPT replies received */
    int pipelined;         /* MAIL..DATA were sent in one write */
    int ehlo_pipelining;   /* the EHLO reply advertised PIPELINING */
    int reply_code;        /* code of the first line of the reply being read, 0 between replies */
    uint64_t start_ns;
    long seq;              /* --seq-base + index of the session */
    int dot_logged;        /* the --ack-log line of this session is written */
    char *own;             /* --unique: this session's wire message (freed at finish), or NULL */
    const char *out;       /* pending output (shared or own) */
    size_t out_len, out_off;
    size_t in_len;
    struct session *prev, *next; /* active list, oldest (first deadline) first */
    char in[INBUF_SIZE];
};

struct config {
    const char *connect;
    long sessions, concurrency, body_size, rcpts, sources, timeout_ms, max_opening;
    int pipelining, quiet;
    const char *ack_log; /* --ack-log FILE, or NULL */
    int unique;          /* --unique */
    long seq_base;       /* --seq-base */
    long max_seconds;    /* --max-seconds, 0 for no cap */
};

static struct config cfg = {NULL, 1000, 100, 4096, 1, 0, 30000, 256, 0, 0, NULL, 0, 0, 0};
static int ack_fd = -1; /* --ack-log, O_APPEND */
static struct sockaddr_storage target;
static socklen_t target_len;
static int ep = -1;

static char *cmd_ehlo, *cmd_mail, *cmd_data, *cmd_quit, *cmd_pipeline;
static char **cmd_rcpt;
static size_t len_ehlo, len_mail, len_data, len_quit, len_pipeline, *len_rcpt;
static char *wire_body; /* dot-stuffed message + ".\r\n" */
static size_t wire_body_len;

static struct session *slots;
static struct session **free_list;
static long free_count;
static struct session *active_head, *active_tail;
static long active, peak_active, opening, started, done_ok, done_failed, fail_reports;
static uint32_t *latency_us;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *fmt, ...)
{
    va_list ap;
    fputs("smtpe-loadgen: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory");
    return p;
}

static char *xstrdup_len(const char *s, size_t *len)
{
    *len = strlen(s);
    char *p = xmalloc(*len + 1);
    memcpy(p, s, *len + 1);
    return p;
}

static void usage(FILE *f)
{
    fputs("usage: smtpe-loadgen --connect HOST:PORT [options]\n"
          "  --connect HOST:PORT   server to load ([IPV6]:PORT for IPv6)\n"
          "  --sessions N          sessions to run in all (default 1000)\n"
          "  --concurrency C       sessions open at once (default 100)\n"
          "  --body-size N         message octets, before dot-stuffing (default 4096)\n"
          "  --rcpts N             recipients per message (default 1)\n"
          "  --pipelining          send MAIL, RCPT... and DATA in one write when offered\n"
          "  --sources N           bind connections to 127.0.0.1..127.0.0.N round-robin\n"
          "                        (loopback targets only; N <= 254)\n"
          "  --timeout-ms N        time a session may take (default 30000)\n"
          "  --max-opening N       sessions connecting or awaiting the banner at once\n"
          "                        (default 256; see below)\n"
          "  --quiet               no progress line, no failure reasons on stderr\n"
          "  --ack-log FILE        one line per end-of-data reply: SEQ QUEUE-ID, SEQ FAIL CODE,\n"
          "                        or SEQ FAIL noreply (written at once, unbuffered)\n"
          "  --unique              a different message per session, a function of its SEQ\n"
          "                        (some over 64 KiB; see the header comment of loadgen.c)\n"
          "  --seq-base N          SEQ of the first session (default 0); session i has N + i\n"
          "  --max-seconds S       stop after S seconds: open sessions fail, no new one starts\n"
          "  --help                show this text\n"
          "Prints one JSON line on stdout at the end; exit 0 if no session failed.\n"
          "--max-opening keeps the server's accept queue from overflowing: with SYN cookies\n"
          "a connection dropped from a full queue looks established to the client, which,\n"
          "the server speaking first in SMTP, then waits for a banner that never comes.\n",
          f);
}

static long parse_long(const char *opt, const char *v, long min, long max)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < min || n > max)
        die("%s: bad value '%s' (%ld..%ld)", opt, v, min, max);
    return n;
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--pipelining")) {
            cfg.pipelining = 1;
        } else if (!strcmp(a, "--quiet")) {
            cfg.quiet = 1;
        } else if (!strcmp(a, "--unique")) {
            cfg.unique = 1;
        } else if (!v) {
            usage(stderr);
            die("%s: unknown option or missing value", a);
        } else if (!strcmp(a, "--connect")) {
            cfg.connect = v, i++;
        } else if (!strcmp(a, "--sessions")) {
            cfg.sessions = parse_long(a, v, 1, 1000000000L), i++;
        } else if (!strcmp(a, "--concurrency")) {
            cfg.concurrency = parse_long(a, v, 1, 10000000L), i++;
        } else if (!strcmp(a, "--body-size")) {
            cfg.body_size = parse_long(a, v, 0, 1L << 30), i++;
        } else if (!strcmp(a, "--rcpts")) {
            cfg.rcpts = parse_long(a, v, 1, 100000L), i++;
        } else if (!strcmp(a, "--sources")) {
            cfg.sources = parse_long(a, v, 0, 254), i++;
        } else if (!strcmp(a, "--max-opening")) {
            cfg.max_opening = parse_long(a, v, 1, 10000000L), i++;
        } else if (!strcmp(a, "--timeout-ms")) {
            cfg.timeout_ms = parse_long(a, v, 1, 86400000L), i++;
        } else if (!strcmp(a, "--ack-log")) {
            cfg.ack_log = v, i++;
        } else if (!strcmp(a, "--seq-base")) {
            cfg.seq_base = parse_long(a, v, 0, LONG_MAX - 1000000000L), i++;
        } else if (!strcmp(a, "--max-seconds")) {
            cfg.max_seconds = parse_long(a, v, 1, 86400L * 365), i++;
        } else {
            usage(stderr);
            die("unknown option %s", a);
        }
    }
    if (!cfg.connect) {
        usage(stderr);
        die("--connect HOST:PORT is required");
    }
    if (cfg.concurrency > cfg.sessions)
        cfg.concurrency = cfg.sessions;
}

static void resolve_target(void)
{
    char host[256];
    const char *colon = strrchr(cfg.connect, ':');
    if (!colon || colon == cfg.connect || !colon[1])
        die("--connect: expected HOST:PORT, got '%s'", cfg.connect);
    size_t hl = (size_t)(colon - cfg.connect);
    const char *h = cfg.connect;
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']')
        h++, hl -= 2;
    if (hl >= sizeof host)
        die("--connect: host too long");
    memcpy(host, h, hl);
    host[hl] = '\0';

    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc)
        die("--connect %s: %s", cfg.connect, gai_strerror(rc));
    memcpy(&target, res->ai_addr, res->ai_addrlen);
    target_len = res->ai_addrlen;
    freeaddrinfo(res);

    if (cfg.sources > 0) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)&target;
        if (target.ss_family != AF_INET || (ntohl(sin->sin_addr.s_addr) >> 24) != 127)
            die("--sources needs a 127.0.0.0/8 target, not %s", cfg.connect);
    }
}

static void raise_nofile(void)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)cfg.concurrency + 32;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        die("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
            die("--concurrency %ld needs %lu open files, the hard limit is %lu "
                "(raise it: ulimit -Hn, or run as root)",
                cfg.concurrency, (unsigned long)need, (unsigned long)rl.rlim_max);
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl))
            die("setrlimit(RLIMIT_NOFILE, %lu): %s", (unsigned long)need, strerror(errno));
    }
}

/* The wire form of msg[0..n) (CRLF lines): dot-stuffed (RFC 5321 §4.5.2) and followed by
 * ".\r\n", in a new heap block of *wire_len octets (+1). */
static char *stuff(const char *msg, size_t n, size_t *wire_len)
{
    size_t dots = 0;
    for (size_t i = 0; i < n; i++)
        if (msg[i] == '.' && (i == 0 || msg[i - 1] == '\n'))
            dots++;
    *wire_len = n + dots + 3;
    char *wire = xmalloc(*wire_len + 1);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (msg[i] == '.' && (i == 0 || msg[i - 1] == '\n'))
            wire[w++] = '.';
        wire[w++] = msg[i];
    }
    memcpy(wire + w, ".\r\n", 3);
    return wire;
}

/* splitmix64: the generator of --unique (the header comment gives it in full). */
static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* --unique: the wire form (stuffed, with ".\r\n") of the message of sequence number seq, as
 * the header comment defines it, in a new heap block of *wire_len octets. */
static char *unique_message(long seq, size_t *wire_len)
{
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t st = (uint64_t)seq;
    uint64_t b = (uint64_t)cfg.body_size;
    unsigned tag = (unsigned)(splitmix64(&st) & 0xFFFFFFFFu);
    uint64_t r = splitmix64(&st);
    size_t want = (size_t)(r % 10 == 0 ? 49152 + (r >> 32) % 131072
                                       : b / 2 + (r >> 32) % (b + 1));
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr,
                      "From: <loadgen@example.org>\r\nTo: <user1@example.com>\r\n"
                      "Subject: smtpe-loadgen %ld\r\nMessage-ID: <%ld.%08x@loadgen>\r\n\r\n",
                      seq, seq, tag);
    size_t cap = (size_t)hl + want + 80; /* a line passes want by at most 78 octets */
    char *msg = xmalloc(cap);
    size_t p = (size_t)hl;
    memcpy(msg, hdr, p);
    for (uint64_t i = 0; p < want; i++) {
        uint64_t v = splitmix64(&st);
        size_t l = (size_t)(v % 77);
        size_t off = (size_t)(((uint64_t)seq + i) % 36);
        for (size_t k = 0; k < l; k++)
            msg[p + k] = alpha[(off + k) % 36];
        if (l > 0 && (v >> 8) % 5 == 0)
            msg[p] = '.';
        p += l;
        msg[p++] = '\r';
        msg[p++] = '\n';
    }
    char *wire = stuff(msg, p, wire_len);
    free(msg);
    return wire;
}

/* The message: a few header lines (when it fits), then lines of up to 76 octets, every 7th one
 * starting with '.'; exactly body_size octets ending with CRLF (a size of 1 gives one CRLF). */
static void build_messages(void)
{
    size_t n = (size_t)cfg.body_size;
    if (n == 1)
        n = 2;
    char *msg = xmalloc(n + 1);
    size_t p = 0;
    static const char hdr[] = "From: <loadgen@example.org>\r\nTo: <user1@example.com>\r\n"
                               "Subject: smtpe-loadgen\r\n\r\n";
    if (n >= sizeof hdr - 1 + 2) {
        memcpy(msg, hdr, sizeof hdr - 1);
        p = sizeof hdr - 1;
    }
    unsigned line = 0;
    while (p < n) {
        size_t left = n - p; /* >= 2 */
        size_t l = left - 2 > 76 ? 76 : left - 2;
        if (left - 2 > 76 && left - 2 - 76 < 2)
            l = 74; /* never leave a lone octet for the last line */
        for (size_t k = 0; k < l; k++)
            msg[p + k] = (char)('a' + (line + k) % 26);
        if (l > 0 && line % 7 == 3)
            msg[p] = '.';
        p += l;
        msg[p++] = '\r';
        msg[p++] = '\n';
        line++;
    }
    wire_body = stuff(msg, n, &wire_body_len);
    free(msg);

    cmd_ehlo = xstrdup_len("EHLO loadgen.example.org\r\n", &len_ehlo);
    cmd_mail = xstrdup_len("MAIL FROM:<loadgen@example.org>\r\n", &len_mail);
    cmd_data = xstrdup_len("DATA\r\n", &len_data);
    cmd_quit = xstrdup_len("QUIT\r\n", &len_quit);
    cmd_rcpt = xmalloc(sizeof *cmd_rcpt * (size_t)cfg.rcpts);
    len_rcpt = xmalloc(sizeof *len_rcpt * (size_t)cfg.rcpts);
    size_t total = len_mail + len_data;
    for (long i = 0; i < cfg.rcpts; i++) {
        char b[64];
        snprintf(b, sizeof b, "RCPT TO:<user%ld@example.com>\r\n", i + 1);
        cmd_rcpt[i] = xstrdup_len(b, &len_rcpt[i]);
        total += len_rcpt[i];
    }
    cmd_pipeline = xmalloc(total + 1);
    size_t q = 0;
    memcpy(cmd_pipeline + q, cmd_mail, len_mail), q += len_mail;
    for (long i = 0; i < cfg.rcpts; i++)
        memcpy(cmd_pipeline + q, cmd_rcpt[i], len_rcpt[i]), q += len_rcpt[i];
    memcpy(cmd_pipeline + q, cmd_data, len_data), q += len_data;
    len_pipeline = q;
}

/* ---------------------------------------------------------------------------------------------- */

/* Appends "<seq> <what>\n" to --ack-log in one write (nothing when there is no log). */
static void ack_line(struct session *s, const char *what, size_t what_len)
{
    char line[192];
    if (ack_fd < 0 || s->dot_logged)
        return;
    s->dot_logged = 1;
    int n = snprintf(line, sizeof line, "%ld %.*s\n", s->seq, (int)what_len, what);
    if (n < 0 || (size_t)n >= sizeof line)
        die("--ack-log: line too long");
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t w = write(ack_fd, line + off, (size_t)n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("--ack-log %s: %s", cfg.ack_log, strerror(errno));
        off += (size_t)w;
    }
}

/* The end-of-data reply's last line l[0..len) with its code: logs "<seq> QUEUE-ID" for a 250
 * ("-" when the text names none), else "<seq> FAIL <code>". */
static void ack_reply(struct session *s, int code, const char *l, size_t len)
{
    static const char mark[] = "queued as ";
    const size_t ml = sizeof mark - 1;
    char b[16];
    if (code != 250) {
        int n = snprintf(b, sizeof b, "FAIL %d", code);
        ack_line(s, b, (size_t)n);
        return;
    }
    for (size_t i = 0; i + ml < len; i++) {
        if (strncasecmp(l + i, mark, ml) != 0)
            continue;
        size_t st = i + ml, e = st;
        while (e < len && e - st < 128 && l[e] > ' ' && l[e] < 0x7f)
            e++;
        if (e > st) {
            ack_line(s, l + st, e - st);
            return;
        }
        break;
    }
    ack_line(s, "-", 1);
}

static void list_remove(struct session *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        active_head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        active_tail = s->prev;
    s->prev = s->next = NULL;
}

static void finish(struct session *s, int ok, const char *why, const char *detail)
{
    uint64_t t = now_ns();
    if (s->step <= ST_BANNER)
        opening--;
    if (ok) {
        uint64_t us = (t - s->start_ns) / 1000;
        latency_us[done_ok++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    } else {
        done_failed++;
        if (!cfg.quiet && fail_reports++ < MAX_FAIL_REPORTS)
            fprintf(stderr, "smtpe-loadgen: session failed awaiting %s: %s%s%s\n", step_name[s->step],
                    why, detail ? ": " : "", detail ? detail : "");
    }
    if (!ok && s->step == ST_DOT)
        ack_line(s, "FAIL noreply", 12);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    free(s->own);
    s->own = NULL;
    list_remove(s);
    active--;
    free_list[free_count++] = s;
}

/* Writes what is pending; 0 when done or waiting for EPOLLOUT, -1 after failing the session. */
static int flush(struct session *s)
{
    while (s->out_off < s->out_len) {
        ssize_t n = send(s->fd, s->out + s->out_off, s->out_len - s->out_off, MSG_NOSIGNAL);
        if (n >= 0) {
            s->out_off += (size_t)n;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return 0;
        } else {
            finish(s, 0, "send", strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int queue_out(struct session *s, const char *p, size_t len)
{
    if (s->out_off < s->out_len) {
        finish(s, 0, "reply before our command was written", NULL);
        return -1;
    }
    s->out = p;
    s->out_len = len;
    s->out_off = 0;
    return flush(s);
}

static void start_session(void)
{
    struct session *s = free_list[--free_count];
    long idx = started++;
    memset(s, 0, offsetof(struct session, in));
    s->fd = -1;
    s->seq = cfg.seq_base + idx;
    s->step = ST_CONNECT;
    s->start_ns = now_ns();
    s->prev = active_tail;
    if (active_tail)
        active_tail->next = s;
    else
        active_head = s;
    active_tail = s;
    if (++active > peak_active)
        peak_active = active;
    opening++;

    int fd = socket(target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        finish(s, 0, "socket", strerror(errno));
        return;
    }
    s->fd = fd;
    if (cfg.sources > 0) {
        int one = 1;
        struct sockaddr_in src;
        memset(&src, 0, sizeof src);
        src.sin_family = AF_INET;
        src.sin_addr.s_addr = htonl(0x7f000001u + (uint32_t)(idx % cfg.sources));
        (void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&src, sizeof src)) {
            finish(s, 0, "bind", strerror(errno));
            return;
        }
    }
    if (connect(fd, (struct sockaddr *)&target, target_len) == 0) {
        s->step = ST_BANNER;
    } else if (errno != EINPROGRESS) {
        finish(s, 0, "connect", strerror(errno));
        return;
    }
    struct epoll_event ev;
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = s;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev))
        finish(s, 0, "epoll_ctl", strerror(errno));
}

static int expected_code(enum step st)
{
    switch (st) {
    case ST_BANNER: return 220;
    case ST_DATA: return 354;
    case ST_QUIT: return 221;
    default: return 250;
    }
}

/* Handles one complete reply (its final line's code); -1 when the session ended. */
static int on_reply(struct session *s, int code)
{
    if (code != expected_code(s->step)) {
        char b[32];
        snprintf(b, sizeof b, "got %d, expected %d", code, expected_code(s->step));
        finish(s, 0, "unexpected reply", b);
        return -1;
    }
    switch (s->step) {
    case ST_BANNER:
        opening--;
        s->step = ST_EHLO;
        return queue_out(s, cmd_ehlo, len_ehlo);
    case ST_EHLO:
        s->step = ST_MAIL;
        if (cfg.pipelining && s->ehlo_pipelining) {
            s->pipelined = 1;
            return queue_out(s, cmd_pipeline, len_pipeline);
        }
        return queue_out(s, cmd_mail, len_mail);
    case ST_MAIL:
        s->step = ST_RCPT;
        return s->pipelined ? 0 : queue_out(s, cmd_rcpt[0], len_rcpt[0]);
    case ST_RCPT:
        if (++s->rcpt_done < cfg.rcpts)
            return s->pipelined ? 0 : queue_out(s, cmd_rcpt[s->rcpt_done], len_rcpt[s->rcpt_done]);
        s->step = ST_DATA;
        return s->pipelined ? 0 : queue_out(s, cmd_data, len_data);
    case ST_DATA:
        s->step = ST_DOT;
        if (cfg.unique) {
            size_t wl;
            s->own = unique_message(s->seq, &wl);
            return queue_out(s, s->own, wl);
        }
        return queue_out(s, wire_body, wire_body_len);
    case ST_DOT:
        s->step = ST_QUIT;
        return queue_out(s, cmd_quit, len_quit);
    case ST_QUIT:
        finish(s, 1, NULL, NULL);
        return -1;
    default:
        finish(s, 0, "reply in a bad state", NULL);
        return -1;
    }
}

/* One reply line (without CRLF); -1 when the session ended. */
static int on_line(struct session *s, const char *l, size_t len)
{
    if (len < 3 || l[0] < '2' || l[0] > '5' || l[1] < '0' || l[1] > '9' || l[2] < '0' ||
        l[2] > '9' || (len > 3 && l[3] != ' ' && l[3] != '-')) {
        finish(s, 0, "malformed reply line", NULL);
        return -1;
    }
    int code = (l[0] - '0') * 100 + (l[1] - '0') * 10 + (l[2] - '0');
    if (s->reply_code && code != s->reply_code) {
        finish(s, 0, "multi-line reply changes its code", NULL);
        return -1;
    }
    s->reply_code = code;
    if (s->step == ST_EHLO && len >= 14 && !strncasecmp(l + 4, "PIPELINING", 10) &&
        (len == 14 || l[14] == ' '))
        s->ehlo_pipelining = 1;
    if (len > 3 && l[3] == '-')
        return 0;
    s->reply_code = 0;
    if (s->step == ST_DOT)
        ack_reply(s, code, l, len);
    return on_reply(s, code);
}

static void on_readable(struct session *s)
{
    for (;;) {
        size_t room = sizeof s->in - s->in_len;
        ssize_t n = recv(s->fd, s->in + s->in_len, room, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                finish(s, 0, "recv", strerror(errno));
            return;
        }
        if (n == 0) {
            finish(s, 0, "connection closed by the server", NULL);
            return;
        }
        size_t end = s->in_len + (size_t)n, pos = 0;
        for (size_t i = s->in_len ? s->in_len : 1; i < end; i++) {
            if (s->in[i] != '\n' || s->in[i - 1] != '\r')
                continue;
            if (on_line(s, s->in + pos, i - 1 - pos) < 0)
                return;
            pos = i + 1;
        }
        if (pos < end)
            memmove(s->in, s->in + pos, end - pos);
        s->in_len = end - pos;
        if (s->in_len == sizeof s->in) {
            finish(s, 0, "reply line too long", NULL);
            return;
        }
        if ((size_t)n < room)
            return; /* drained: edge-triggered epoll reports new data */
    }
}

static void on_event(struct session *s, uint32_t events)
{
    if (s->fd < 0)
        return; /* ended earlier in this batch */
    if (s->step == ST_CONNECT) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) || err) {
            finish(s, 0, "connect", strerror(err ? err : errno));
            return;
        }
        s->step = ST_BANNER;
    }
    if (events & EPOLLERR) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        finish(s, 0, "socket error", strerror(err));
        return;
    }
    if ((events & EPOLLOUT) && s->out_off < s->out_len && flush(s) < 0)
        return;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))
        on_readable(s);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static double pct_ms(double p)
{
    if (done_ok == 0)
        return 0.0;
    long i = (long)(p * (double)done_ok + 0.999999) - 1; /* nearest rank */
    if (i < 0)
        i = 0;
    if (i >= done_ok)
        i = done_ok - 1;
    return latency_us[i] / 1000.0;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    resolve_target();
    raise_nofile();
    build_messages();
    if (cfg.ack_log) {
        ack_fd = open(cfg.ack_log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        if (ack_fd < 0)
            die("--ack-log %s: %s", cfg.ack_log, strerror(errno));
    }

    slots = xmalloc(sizeof *slots * (size_t)cfg.concurrency);
    free_list = xmalloc(sizeof *free_list * (size_t)cfg.concurrency);
    for (long i = cfg.concurrency - 1; i >= 0; i--) {
        slots[i].fd = -1;
        free_list[free_count++] = &slots[i];
    }
    latency_us = xmalloc(sizeof *latency_us * (size_t)cfg.sessions);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1: %s", strerror(errno));

    const uint64_t timeout_ns = (uint64_t)cfg.timeout_ms * 1000000u;
    const uint64_t t0 = now_ns();
    const uint64_t stop_at = cfg.max_seconds ? t0 + (uint64_t)cfg.max_seconds * 1000000000u : 0;
    int stopped = 0; /* --max-seconds passed */
    uint64_t next_progress = t0 + 1000000000u;
    long last_done = 0;
    struct epoll_event evs[512];

    while (done_ok + done_failed < cfg.sessions) {
        if (stop_at && now_ns() >= stop_at) {
            stopped = 1;
            while (active_head)
                finish(active_head, 0, "max-seconds", NULL);
            break;
        }
        while (active < cfg.concurrency && started < cfg.sessions && opening < cfg.max_opening)
            start_session();

        uint64_t t = now_ns();
        uint64_t wake = next_progress;
        if (stop_at && stop_at < wake)
            wake = stop_at;
        if (active_head && active_head->start_ns + timeout_ns < wake)
            wake = active_head->start_ns + timeout_ns;
        int wait_ms = wake > t ? (int)((wake - t + 999999) / 1000000) : 0;
        int n = active ? epoll_wait(ep, evs, (int)(sizeof evs / sizeof evs[0]), wait_ms) : 0;
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++)
            on_event(evs[i].data.ptr, evs[i].events);

        t = now_ns();
        while (active_head && active_head->start_ns + timeout_ns <= t)
            finish(active_head, 0, "timeout", NULL);
        if (t >= next_progress) {
            long d = done_ok + done_failed;
            if (!cfg.quiet)
                fprintf(stderr, "smtpe-loadgen: %.0fs done %ld failed %ld active %ld rate %ld/s\n",
                        (double)(t - t0) / 1e9, d, done_failed, active, d - last_done);
            last_done = d;
            next_progress += 1000000000u;
            if (next_progress <= t)
                next_progress = t + 1000000000u;
        }
    }

    double secs = (double)(now_ns() - t0) / 1e9;
    qsort(latency_us, (size_t)done_ok, sizeof *latency_us, cmp_u32);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                 (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    printf("{\"sessions\":%ld,\"failed\":%ld,\"seconds\":%.3f,\"sessions_per_s\":%.1f,"
           "\"p50_ms\":%.3f,\"p95_ms\":%.3f,\"p99_ms\":%.3f,\"client_cpu_s\":%.3f,"
           "\"peak_concurrency\":%ld}\n",
           done_ok + done_failed, done_failed, secs, secs > 0 ? (double)done_ok / secs : 0.0,
           pct_ms(0.50), pct_ms(0.95), pct_ms(0.99), cpu, peak_active);
    fflush(stdout);
    if (stopped && !cfg.quiet)
        fprintf(stderr, "smtpe-loadgen: --max-seconds %ld passed: %ld of %ld sessions ran\n",
                cfg.max_seconds, done_ok + done_failed, cfg.sessions);
    if (ack_fd >= 0 && close(ack_fd) < 0)
        die("--ack-log %s: %s", cfg.ack_log, strerror(errno));
    return done_failed || stopped ? 1 : 0;
}
