/*
 * smtpe-loadgen: an SMTP load generator (issue 4, "Load generator") on the client engine.
 *
 * One epoll loop (edge-triggered, no threads) holds up to --concurrency client sessions at once
 * and runs --sessions of them in all, each of the shape of the Ruby study: read the 220 banner,
 * EHLO, MAIL FROM, RCPT TO (x --rcpts), DATA, a message of --body-size octets (CRLF lines, some
 * starting with '.'), QUIT. Every session is one smtpe_client (include/smtpe.h, "Client
 * engine") in a slab of this process's memory (smtpe_client_init, smtpe_client_memory_size
 * octets per slot): the transaction is submitted as soon as the socket exists, before the
 * greeting; the engine sequences the commands, parses and checks every reply, and dot-stuffs
 * the message, which goes to it as content; QUIT is asked for after TRANSACTION_DONE. A
 * session succeeds when every recipient's outcome is "delivered" and the session ends with
 * CLOSED reason QUIT after the 221; anything else (a refused recipient, a malformed or
 * unsolicited reply, a closed connection, passing --timeout-ms) is a failed session. With
 * --pipelining the engine pipelines MAIL, RCPT... and DATA in one write when the EHLO reply
 * advertises PIPELINING (cfg.pipelining); without it, one command per reply. Content goes by
 * DATA (cfg.chunking 0), as in the study, by reference (smtpe_client_content_ref: the engine's
 * output points into the message, which it does not copy) and each write is one sendmsg(2) of
 * the pieces smtpe_client_send_iov gives (send(2) when there is one), as in a hand-written
 * client; the output ring holds a
 * whole message too where it must copy (larger messages go in pieces, with MSG_MORE on a
 * TCP_NODELAY socket: see build_client, flush). --timeout-ms is this
 * tool's own deadline for a whole session (the engine's per-command timeouts are off: its
 * smtpe_client_expiry is never armed). --sources N binds each connection to
 * one of 127.0.0.1 .. 127.0.0.N, round-robin, so that 10 000 connections to a loopback target
 * fit the ephemeral ports. --max-opening (default 256) caps the sessions connecting or
 * awaiting the banner at once (a session stops "opening" when the engine, having read the
 * greeting, queues its EHLO), so a burst of connects does not overflow the server's accept
 * queue (with SYN cookies such a connection looks established to the client, which then waits
 * for a banner forever, SMTP being server-speaks-first).
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
 * A session that fails before its 354 gets no line. (With the engine: the 354 is its
 * SMTPE_CEV_CONTENT event; the end-of-data reply is the first recipient outcome after it that
 * the server decided, code and text being that reply's last line; an outcome the engine
 * decided itself, e.g. after a malformed reply, counts as no reply.)
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
#include <netinet/tcp.h>
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
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#include "smtpe.h"

#define INBUF_SIZE 4096 /* octets read from a socket at once (one buffer for all sessions) */
#define MAX_FAIL_REPORTS 10
#define WHY_SIZE 128 /* the first undelivered outcome, for the failure report */

/* What the session waits for, as the engine's events show it (for the failure report, the
 * --max-opening count and the --ack-log rule). */
enum step { ST_CONNECT, ST_BANNER, ST_EHLO, ST_TXN, ST_DOT, ST_QUIT };

static const char *const step_name[] = {"connect",    "banner", "EHLO reply",
                                        "MAIL, RCPT or DATA reply", "end-of-data reply",
                                        "QUIT reply"};

struct session {
    int fd;                /* -1 when the slot is free */
    enum step step;        /* ST_BANNER: connected, no EHLO queued yet; ST_EHLO: the EHLO is
                              queued, no READY yet; ST_TXN: READY; ST_DOT: the DATA got its 354
                              (SMTPE_CEV_CONTENT); ST_QUIT: TRANSACTION_DONE, QUIT asked for */
    smtpe_client *client;  /* in mem; valid from start_session to finish */
    void *mem;             /* this slot's smtpe_client_memory_size octets, max_align_t aligned */
    uint64_t start_ns;
    long seq;              /* --seq-base + index of the session */
    int dot_logged;        /* the --ack-log line of this session is written */
    int blocked;           /* the last send(2) said EAGAIN: EPOLLOUT resumes the output */
    int content_pending;   /* SMTPE_CEV_CONTENT taken, the last piece not yet consumed */
    char *own;             /* --unique: this session's message (freed at finish), or NULL */
    const uint8_t *content; /* the message (shared or own), content_len octets */
    size_t content_len, content_off;
    size_t delivered;      /* recipients delivered */
    char why[WHY_SIZE];    /* the first recipient not delivered ("" while none) */
    struct session *prev, *next; /* active list, oldest (first deadline) first */
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

static smtpe_client_config ccfg;  /* every session's engine config (build_client) */
static size_t client_mem_size;    /* smtpe_client_memory_size(&ccfg), rounded to max_align_t */
#define RING_MAX ((size_t)64 * 1024) /* the largest output ring (octets per session) */
static size_t ring_size;          /* the engine's output ring (build_client) */
static int ring_pieces;           /* a message may not fit it: it leaves in pieces (flush) */
static smtpe_client_txn txn;      /* the one transaction every session submits (read-only) */
static smtpe_client_rcpt *rcpts;  /* its --rcpts forward-paths, user1..userN@example.com */
static char *body;                /* without --unique: the message every session sends */
static size_t body_len;
static uint8_t inbuf[INBUF_SIZE]; /* recv(2) target; fed to the engine at once */
static uint64_t loop_ms;          /* monotonic ms at the latest epoll_wait return */

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

/* splitmix64: the generator of --unique (the header comment gives it in full). */
static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* --unique: the content (before dot-stuffing, which the engine does) of the message of
 * sequence number seq, as the header comment defines it, in a new heap block of *len octets. */
static char *unique_message(long seq, size_t *len)
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
    *len = p;
    return msg;
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
    body = msg;
    body_len = n;
}

/* The engine config of every session (sized for the job: one transaction of --rcpts
 * recipients, replies of smtpe-server's size, an output ring that holds the dot-stuffed message
 * when it can) and the one transaction. */
static void build_client(void)
{
    /* the message on the wire: at most one doubled dot per line of at least 3 octets (a line
     * "." CRLF), the end of data, and room for a pipelined group of commands beside it */
    size_t longest = cfg.unique ? (size_t)131072 + 49152 + (size_t)cfg.body_size * 3 / 2 + 256
                                : body_len;
    size_t wire = longest + longest / 3 + 1024;
    ring_size = wire < 4096 ? 4096 : wire < RING_MAX ? wire : RING_MAX;
    ring_pieces = wire > ring_size;
    smtpe_client_config_init(&ccfg);
    ccfg.helo_name = "loadgen.example.org";
    ccfg.chunking = 0; /* DATA, as in the Ruby study */
    ccfg.pipelining = cfg.pipelining;
    ccfg.output_buffer_size = ring_size;
    if (ccfg.chunk_size > ring_size - 64) /* unused (DATA), but valid */
        ccfg.chunk_size = ring_size - 64;
    ccfg.max_reply_line = 1024;
    ccfg.max_reply_size = 8192;
    ccfg.max_unanswered = 4096;
    ccfg.max_recipients = (unsigned)cfg.rcpts;
    /* --timeout-ms is this tool's deadline for the whole session: no engine timer */
    ccfg.greeting_timeout_ms = ccfg.command_timeout_ms = ccfg.data_timeout_ms = 0;
    ccfg.data_block_timeout_ms = ccfg.data_end_timeout_ms = 0;
    size_t n = smtpe_client_memory_size(&ccfg);
    if (n == 0)
        die("the client engine refuses the session config");
    const size_t al = _Alignof(max_align_t);
    client_mem_size = (n + al - 1) / al * al;

    rcpts = xmalloc(sizeof *rcpts * (size_t)cfg.rcpts);
    memset(rcpts, 0, sizeof *rcpts * (size_t)cfg.rcpts);
    for (long i = 0; i < cfg.rcpts; i++) {
        char b[64];
        int l = snprintf(b, sizeof b, "user%ld@example.com", i + 1);
        char *f = xmalloc((size_t)l + 1);
        memcpy(f, b, (size_t)l + 1);
        rcpts[i].forward_path = f;
    }
    memset(&txn, 0, sizeof txn);
    txn.reverse_path = "loadgen@example.org";
    txn.rcpts = rcpts;
    txn.rcpt_count = (size_t)cfg.rcpts;
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
            fprintf(stderr, "smtpe-loadgen: session failed awaiting %s: %s%s%s\n",
                    step_name[s->step], why, detail ? ": " : "", detail ? detail : "");
    }
    if (!ok && s->step == ST_DOT)
        ack_line(s, "FAIL noreply", 12);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->client = NULL; /* its slab is simply reused by the next session of the slot */
    free(s->own);
    s->own = NULL;
    list_remove(s);
    active--;
    free_list[free_count++] = s;
}

/* Sends what the engine queued: 1 when all of it is out, 0 when send(2) said EAGAIN (EPOLLOUT
 * resumes), -1 after failing the session. Each write follows a reply, which acknowledged
 * everything sent before, so Nagle's algorithm never holds one back. A message larger than
 * the output ring (ring_pieces: --unique, or --body-size over about 48 KiB) leaves in several
 * send(2) calls where one write of it would do: there each piece after the first would wait
 * for the server's delayed ACK (40 ms on Linux) of the one before, so such sockets have
 * TCP_NODELAY, and the pieces go with MSG_MORE while content is still to come, so that a
 * message leaves in as few segments as if written at once, the piece with the final dot
 * pushing them out. */
static int flush(struct session *s)
{
    for (;;) {
        smtpe_span sp[16];
        size_t k = smtpe_client_send_iov(s->client, sp, 16);
        if (k == 0)
            return 1;
        if (s->step == ST_BANNER) { /* the greeting is read: the EHLO is queued */
            s->step = ST_EHLO;
            opening--;
        }
        ssize_t n;
        int flags = MSG_NOSIGNAL | (s->content_pending ? MSG_MORE : 0);
        if (k == 1) { /* send(2): the kernel need not copy in a msghdr and an iovec */
            n = send(s->fd, sp[0].ptr, sp[0].len, flags);
        } else {
            struct iovec iov[16];
            struct msghdr mh;
            for (size_t i = 0; i < k; i++) {
                iov[i].iov_base = (void *)(uintptr_t)sp[i].ptr; /* sendmsg only reads it */
                iov[i].iov_len = sp[i].len;
            }
            memset(&mh, 0, sizeof mh);
            mh.msg_iov = iov;
            mh.msg_iovlen = k;
            n = sendmsg(s->fd, &mh, flags);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                s->blocked = 1;
                return 0;
            }
            finish(s, 0, "send", strerror(errno));
            return -1;
        }
        smtpe_client_send_ack(s->client, (size_t)n);
    }
}

/* One recipient's outcome: counted, or kept for the failure report. The first one the server
 * decided after the 354 is the end-of-data reply (--ack-log). */
static void on_outcome(struct session *s, const smtpe_client_outcome *o)
{
    if (s->step == ST_DOT && !o->local)
        ack_reply(s, (int)o->code, (const char *)o->text.ptr, o->text.len);
    if (o->outcome == SMTPE_OUTCOME_DELIVERED) {
        s->delivered++;
        return;
    }
    if (s->why[0])
        return; /* the first one is reported */
    int tl = (int)(o->text.len < 80 ? o->text.len : 80);
    if (o->local)
        snprintf(s->why, sizeof s->why, "recipient %zu: %.*s (the client's verdict)",
                 o->index + 1, tl, (const char *)o->text.ptr);
    else
        snprintf(s->why, sizeof s->why, "recipient %zu: %03u %.*s", o->index + 1, o->code, tl,
                 (const char *)o->text.ptr);
}

static const char *close_reason(int r)
{
    static const char *const names[] = {"QUIT",         "421 from the server", "protocol error",
                                        "connection lost", "timeout",        "TLS required",
                                        "AUTH failed",  "aborted",             "refused"};
    return r >= 0 && r <= 8 ? names[r] : "unknown reason";
}

static int on_closed(struct session *s, const smtpe_client_closed *c)
{
    if (c->reason == SMTPE_CLOSE_QUIT && s->step == ST_QUIT) {
        finish(s, 1, NULL, NULL);
        return -1;
    }
    char b[WHY_SIZE + 96];
    if (s->why[0])
        snprintf(b, sizeof b, "%s", s->why);
    else
        snprintf(b, sizeof b, "%s%s%03u %.*s", close_reason(c->reason), c->code ? ": " : " ",
                 c->code, (int)(c->text.len < 80 ? c->text.len : 80),
                 (const char *)c->text.ptr);
    finish(s, 0, "session closed", b);
    return -1;
}

/* Takes the engine's events; -1 when the session ended. */
static int take_events(struct session *s)
{
    smtpe_client_event ev;
    while (smtpe_client_next_event(s->client, &ev) == 1) {
        switch (ev.type) {
        case SMTPE_CEV_READY:
            if (s->step <= ST_BANNER)
                opening--;
            s->step = ST_TXN;
            break;
        case SMTPE_CEV_CONTENT:
            s->step = ST_DOT;
            if (cfg.unique) {
                s->own = unique_message(s->seq, &s->content_len);
                s->content = (const uint8_t *)s->own;
            } else {
                s->content = (const uint8_t *)body;
                s->content_len = body_len;
            }
            s->content_off = 0;
            s->content_pending = 1;
            break;
        case SMTPE_CEV_OUTCOME:
            on_outcome(s, &ev.outcome);
            break;
        case SMTPE_CEV_TRANSACTION_DONE:
            if (s->delivered != txn.rcpt_count) {
                finish(s, 0, "not delivered", s->why[0] ? s->why : NULL);
                return -1;
            }
            s->step = ST_QUIT;
            if (smtpe_client_quit(s->client) < 0) {
                finish(s, 0, "smtpe_client_quit", "refused");
                return -1;
            }
            break;
        case SMTPE_CEV_CLOSED:
            return on_closed(s, &ev.closed);
        default: {
            char b[32];
            snprintf(b, sizeof b, "type %d", (int)ev.type);
            finish(s, 0, "unexpected engine event", b);
            return -1;
        }
        }
    }
    return 0;
}

/* Runs the session until it waits for the network: events, output, content (as much as the
 * engine's output ring and the socket take). -1 when the session ended. */
static int service(struct session *s)
{
    for (;;) {
        if (take_events(s) < 0)
            return -1;
        int f = flush(s);
        if (f < 0)
            return -1;
        if (f == 0 || !s->content_pending)
            return 0;
        size_t left = s->content_len - s->content_off;
        /* by reference: the engine's output points into the message (which outlives the
         * session), so its octets are not copied into the output ring */
        smtpe_ssize r = smtpe_client_content_ref(s->client, s->content + s->content_off, left, 1);
        if (r < 0) {
            finish(s, 0, "smtpe_client_content", smtpe_strerror((int)r));
            return -1;
        }
        s->content_off += (size_t)r;
        if ((size_t)r == left) {
            s->content_pending = 0; /* the last piece is in: the engine queued the final dot */
        } else if (r == 0) {
            size_t len;
            (void)smtpe_client_send_buf(s->client, &len);
            if (len == 0) { /* nothing to send and no content taken: it would never move */
                finish(s, 0, "smtpe_client_content", "took nothing with the output empty");
                return -1;
            }
        }
    }
}

static void start_session(void)
{
    struct session *s = free_list[--free_count];
    long idx = started++;
    void *mem = s->mem;
    memset(s, 0, sizeof *s);
    s->mem = mem;
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

    int rc = smtpe_client_init(&s->client, s->mem, client_mem_size, &ccfg, loop_ms);
    if (rc == 0)
        rc = smtpe_client_submit(s->client, &txn); /* before the greeting */
    if (rc < 0)
        die("client engine: %s", smtpe_strerror(rc)); /* the same for every session: setup */

    int fd = socket(target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        finish(s, 0, "socket", strerror(errno));
        return;
    }
    s->fd = fd;
    int one = 1;
    if (ring_pieces) /* see flush */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (cfg.sources > 0) {
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

/* Reads what the server sent and feeds it to the engine until the socket is drained. */
static void on_readable(struct session *s)
{
    for (;;) {
        ssize_t n = recv(s->fd, inbuf, sizeof inbuf, 0);
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
        int stalls = 0;
        for (size_t off = 0; off < (size_t)n;) {
            smtpe_ssize r = smtpe_client_recv(s->client, inbuf + off, (size_t)n - off, loop_ms);
            if (r < 0) {
                finish(s, 0, "smtpe_client_recv", smtpe_strerror((int)r));
                return;
            }
            off += (size_t)r;
            if (service(s) < 0)
                return;
            stalls = r == 0 ? stalls + 1 : 0;
            if (stalls > 1) { /* the events were taken, so it cannot wait for that */
                finish(s, 0, "smtpe_client_recv", "consumes nothing");
                return;
            }
        }
        if ((size_t)n < sizeof inbuf)
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
        /* what the server sent before the error is read first: a reply already received
         * (a 221 followed by a reset) still counts */
        on_readable(s);
        if (s->fd < 0)
            return;
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        finish(s, 0, "socket error", strerror(err));
        return;
    }
    if ((events & EPOLLOUT) && s->blocked) {
        s->blocked = 0;
        if (service(s) < 0)
            return;
    }
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
    build_client();
    if (cfg.ack_log) {
        ack_fd = open(cfg.ack_log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        if (ack_fd < 0)
            die("--ack-log %s: %s", cfg.ack_log, strerror(errno));
    }

    slots = xmalloc(sizeof *slots * (size_t)cfg.concurrency);
    free_list = xmalloc(sizeof *free_list * (size_t)cfg.concurrency);
    if ((size_t)cfg.concurrency > SIZE_MAX / client_mem_size)
        die("out of memory");
    uint8_t *slab = aligned_alloc(_Alignof(max_align_t), client_mem_size * (size_t)cfg.concurrency);
    if (!slab)
        die("out of memory (%zu octets of client sessions)",
            client_mem_size * (size_t)cfg.concurrency);
    for (long i = cfg.concurrency - 1; i >= 0; i--) {
        slots[i].fd = -1;
        slots[i].mem = slab + client_mem_size * (size_t)i;
        free_list[free_count++] = &slots[i];
    }
    latency_us = xmalloc(sizeof *latency_us * (size_t)cfg.sessions);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1: %s", strerror(errno));

    const uint64_t timeout_ns = (uint64_t)cfg.timeout_ms * 1000000u;
    const uint64_t t0 = now_ns();
    loop_ms = t0 / 1000000u;
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
        loop_ms = now_ns() / 1000000u;
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
