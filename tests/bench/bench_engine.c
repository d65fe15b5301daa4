/*
 * bench_engine.c - in-memory micro-benchmark of the smtpe server and client engines (no
 * sockets, no threads): each engine is driven through the public API exactly as a host drives
 * it (smtpe_server_recv / next_event / accept / send_buf / send_ack; smtpe_client_submit /
 * recv / next_event / content / send_buf / send_ack), the peer's octets coming from memory.
 *
 * It measures
 *   1. whole sessions per second - greeting, EHLO, MAIL, RCPT, DATA with a 4 KB body, QUIT,
 *      the client waiting for each reply as a real one does - once with each session in
 *      reused caller memory (smtpe_server_init) and once with smtpe_server_new/free;
 *   2. nanoseconds per command: NOOP (answered by the engine alone) and MAIL/RCPT/RSET
 *      (events with host verdicts), pipelined;
 *   3. DATA throughput in GB/s (10^9 octets of client input per second): a large body of
 *      realistic text lines, dot-stuffed, fed in 64 KiB reads, every chunk copied into a sink
 *      by the host, beside memcpy of the same octets in the same 64 KiB pieces into the same
 *      sink, and the ratio of the two;
 *   4. concurrent verdicts: one pipelined transaction of MAIL, 100 RCPTs and DATA (one write,
 *      as a pipelining client sends it), each RCPT's verdict coming from an asynchronous
 *      lookup that answers 20 ms after the host starts it, on a simulated clock: how long the
 *      transaction takes on that clock with max_pending_verdicts 1 (one lookup at a time)
 *      and 101 (all at once), and the engine's CPU time per such session for each;
 *   5. the client engine against canned server replies: whole client sessions per second
 *      (submitted before the greeting; greeting, EHLO offering PIPELINING, MAIL + RCPT + DATA
 *      in one write, a 4 KB message of 76-octet lines, its 250, QUIT, 221) in reused caller
 *      memory (smtpe_client_init), beside the server's session figure of the same run; and the
 *      content path (smtpe_client_content, the output acknowledged uncopied) in GB/s of
 *      content octets by DATA (dot-stuffing), BDAT (64 KiB chunks, each chunk's reply fed
 *      before the next) and DATA by reference (smtpe_client_content_ref: the output points
 *      into the message, the wire checked the same), for 4 KB messages, 1 MiB of 76-octet lines and 1 MiB of HTML in
 *      lines of 600-990 octets, each beside memcpy of the same octets in the same pieces.
 * Each figure is the best and the median of several runs (CLOCK_MONOTONIC). Every run checks
 * what the engine answered and delivered, and the program exits 1 if anything was wrong, so
 * `--quick` doubles as a smoke test (ctest bench_smoke).
 *
 * Run it from a Release build (cmake -DCMAKE_BUILD_TYPE=Release): see --help.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "smtpe.h"

#define MAX_RUNS 31

static int failures;

#define EXPECT(cond, ...)                                                                       \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            if (failures++ < 5) {                                                               \
                fprintf(stderr, "bench: check failed: ");                                      \
                fprintf(stderr, __VA_ARGS__);                                                   \
                fputc('\n', stderr);                                                            \
            }                                                                                   \
        }                                                                                       \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best (smallest) and median of n timings, in seconds. */
static void best_median(double *t, int n, double *best, double *median)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    *best = t[0];
    *median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* ------------------------------------------------------------------------------------------ */
/* The host side: what every host loop does with the engine.                                   */

/* Where the host puts what it "sends" and the content it "stores". */
typedef struct host {
    uint8_t sink[65536];
    size_t sink_at;
    uint64_t out_octets;  /* reply octets sent */
    uint64_t content;     /* content octets delivered in chunks */
    unsigned char last_code[4]; /* first three digits of the last complete reply line */
    int data_end_ok;      /* DATA_END events with status OK */
} host;

static void sink_copy(host *h, const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t room = sizeof h->sink - h->sink_at, k = n < room ? n : room;
        memcpy(h->sink + h->sink_at, p, k);
        h->sink_at = (h->sink_at + k) % sizeof h->sink;
        p += k;
        n -= k;
    }
}

/* Sends all queued output, remembering the code of the last reply line. */
static void host_send(smtpe_server *s, host *h)
{
    size_t len;
    const uint8_t *p;
    while ((p = smtpe_server_send_buf(s, &len)) != NULL && len > 0) {
        if (len >= 6) {
            size_t i = len - 2; /* the start of the last line: after the CRLF before it */
            while (i > 0 && !(p[i - 1] == '\n'))
                i--;
            memcpy(h->last_code, p + i, 3);
        }
        h->out_octets += len;
        smtpe_server_send_ack(s, len);
    }
}

/* Takes every event, accepting those that need a verdict and storing content. */
static void host_events(smtpe_server *s, host *h)
{
    smtpe_event ev;
    while (smtpe_server_next_event(s, &ev) == 1) {
        if (ev.type == SMTPE_EV_DATA_CHUNK) {
            sink_copy(h, ev.chunk.ptr, ev.chunk.len);
            h->content += ev.chunk.len;
            continue;
        }
        if (ev.type == SMTPE_EV_DATA_END && ev.data_end.status == SMTPE_DATA_OK)
            h->data_end_ok++;
        if (smtpe_event_needs_reply(&ev))
            smtpe_server_accept(s);
    }
}

/* Feeds p[0..n) as one read from the client: recv until it is all consumed, taking events
 * and sending output in between, as a host loop does. Returns 0, or -1 if the engine stops
 * consuming (it wants to close). */
static int host_feed(smtpe_server *s, host *h, const uint8_t *p, size_t n, uint64_t now)
{
    while (n > 0) {
        ssize_t r = smtpe_server_recv(s, p, n, now);
        if (r < 0)
            return -1;
        p += r;
        n -= (size_t)r;
        host_events(s, h);
        host_send(s, h);
        if (r == 0 && (smtpe_server_want(s) & SMTPE_WANT_CLOSE))
            return n ? -1 : 0;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* 1. whole sessions                                                                           */

static const char *cmd_ehlo = "EHLO client.example\r\n";
static const char *cmd_mail = "MAIL FROM:<sender@example.org> SIZE=4200\r\n";
static const char *cmd_rcpt = "RCPT TO:<recipient@example.com>\r\n";
static const char *cmd_data = "DATA\r\n";
static const char *cmd_quit = "QUIT\r\n";

static uint8_t body4k[8192];
static size_t body4k_len;     /* octets on the wire, the final ".\r\n" included */
static size_t body4k_content; /* content octets after unstuffing */

static void make_body4k(void)
{
    static const char *lines[] = {
        "From: Sender <sender@example.org>", "To: Recipient <recipient@example.com>",
        "Subject: benchmark message", "Date: Mon, 1 Jan 2024 00:00:00 +0000",
        "Message-ID: <bench.1@example.org>", "MIME-Version: 1.0",
        "Content-Type: text/plain; charset=utf-8", ""};
    size_t o = 0, content = 0;
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        o += (size_t)sprintf((char *)body4k + o, "%s\r\n", lines[i]);
    }
    content = o;
    for (int i = 0; o < 4096 - 80; i++) {
        int n = sprintf((char *)body4k + o, "%sLine %d of the body, with some ordinary words "
                                            "in it to look like text.\r\n",
                        i % 9 == 4 ? ".." : "", i);
        o += (size_t)n;
        content += (size_t)n - (i % 9 == 4 ? 1 : 0);
    }
    memcpy(body4k + o, ".\r\n", 3);
    body4k_len = o + 3;
    body4k_content = content;
}

static int code_is(const host *h, const char *code)
{
    return memcmp(h->last_code, code, 3) == 0;
}

/* One session, lockstep: the client sends each command once it has the previous reply. */
static void one_session(smtpe_server *s, host *h)
{
    host_send(s, h);
    EXPECT(code_is(h, "220"), "greeting");
    host_feed(s, h, (const uint8_t *)cmd_ehlo, strlen(cmd_ehlo), 0);
    EXPECT(code_is(h, "250"), "EHLO reply");
    host_feed(s, h, (const uint8_t *)cmd_mail, strlen(cmd_mail), 0);
    EXPECT(code_is(h, "250"), "MAIL reply");
    host_feed(s, h, (const uint8_t *)cmd_rcpt, strlen(cmd_rcpt), 0);
    EXPECT(code_is(h, "250"), "RCPT reply");
    host_feed(s, h, (const uint8_t *)cmd_data, strlen(cmd_data), 0);
    EXPECT(code_is(h, "354"), "DATA reply");
    uint64_t before = h->content;
    host_feed(s, h, body4k, body4k_len, 0);
    EXPECT(code_is(h, "250"), "end of data reply");
    EXPECT(h->content - before == body4k_content, "content delivered: %llu, want %zu",
           (unsigned long long)(h->content - before), body4k_content);
    host_feed(s, h, (const uint8_t *)cmd_quit, strlen(cmd_quit), 0);
    EXPECT(code_is(h, "221"), "QUIT reply");
    EXPECT(smtpe_server_want(s) & SMTPE_WANT_CLOSE, "wants close after QUIT");
}

static double bench_sessions(const smtpe_server_config *cfg, int use_new, long n, host *h)
{
    size_t size = smtpe_server_memory_size(cfg);
    void *mem = malloc(size);
    if (!mem)
        abort();
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        smtpe_server *s;
        int rc = use_new ? smtpe_server_new(&s, cfg, NULL, 0)
                         : smtpe_server_init(&s, mem, size, cfg, 0);
        if (rc != 0) {
            EXPECT(0, "session creation: %s", smtpe_strerror(rc));
            break;
        }
        one_session(s, h);
        if (use_new)
            smtpe_server_free(s);
    }
    double t = now_s() - t0;
    free(mem);
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* 2. commands                                                                                  */

/* A session after EHLO, ready for commands. */
static smtpe_server *open_session(const smtpe_server_config *cfg, void *mem, size_t size,
                                  host *h)
{
    smtpe_server *s;
    if (smtpe_server_init(&s, mem, size, cfg, 0) != 0)
        abort();
    host_send(s, h);
    host_feed(s, h, (const uint8_t *)cmd_ehlo, strlen(cmd_ehlo), 0);
    return s;
}

/* Feeds a pipelined batch of commands `reps` times; returns seconds. */
static double bench_commands(const smtpe_server_config *cfg, const char *batch, long reps,
                             host *h, const char *want_code)
{
    size_t size = smtpe_server_memory_size(cfg);
    void *mem = malloc(size);
    if (!mem)
        abort();
    smtpe_server *s = open_session(cfg, mem, size, h);
    size_t len = strlen(batch);
    double t0 = now_s();
    for (long i = 0; i < reps; i++)
        if (host_feed(s, h, (const uint8_t *)batch, len, 0) != 0)
            break;
    double t = now_s() - t0;
    EXPECT(code_is(h, want_code), "command batch reply %.3s, want %s", h->last_code, want_code);
    smtpe_server_stats st;
    smtpe_server_get_stats(s, &st);
    EXPECT(st.errors == 0, "protocol errors in the command batch: %u", st.errors);
    free(mem);
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* 3. DATA throughput                                                                           */

typedef struct bigbody {
    uint8_t *p;
    size_t len;     /* octets on the wire, ".\r\n" included */
    size_t content; /* after unstuffing */
} bigbody;

/* Text lines of 0..~110 octets from a small vocabulary, a few starting with '.', stuffed. */
static void make_bigbody(bigbody *b, size_t target)
{
    static const char *words[] = {"the", "message", "of", "server", "a", "to", "and", "mail",
                                  "delivery", "in", "report", "is", "for", "with", "example",
                                  "queue", "that", "on", "status", "recipient", "please",
                                  "regards", "=20", "data", "2024", "--", "Re:", "http://x.y/z"};
    const size_t nw = sizeof words / sizeof *words;
    b->p = malloc(target + 256);
    if (!b->p)
        abort();
    uint32_t x = 12345;
    size_t o = 0, content = 0;
    while (o < target) {
        x = x * 1103515245u + 12345u;
        unsigned kind = (x >> 16) % 40;
        size_t start = o;
        if (kind == 0) {
            /* empty line */
        } else {
            if (kind == 1) { /* a line starting with a dot, stuffed */
                b->p[o++] = '.';
                b->p[o++] = '.';
                content--; /* the stuffed dot is not content */
            }
            size_t want = 20 + (x >> 8) % 90;
            while (o - start < want) {
                x = x * 1103515245u + 12345u;
                const char *w = words[(x >> 16) % nw];
                size_t wl = strlen(w);
                memcpy(b->p + o, w, wl);
                o += wl;
                b->p[o++] = ' ';
            }
            o--; /* no trailing space */
        }
        b->p[o++] = '\r';
        b->p[o++] = '\n';
        content += o - start;
    }
    memcpy(b->p + o, ".\r\n", 3);
    b->len = o + 3;
    b->content = content;
}

/* Opens a session, sends the commands cmds[0..n) (which must end in a reply of ready_code), then
 * feeds the message b in read_size pieces and checks its content and the final 250. Returns the
 * seconds the message took. what names the measurement in failures. */
static double bench_message(const smtpe_server_config *cfg, const char *const *cmds, size_t n,
                            const char *ready_code, const bigbody *b, size_t read_size, host *h,
                            const char *what)
{
    size_t size = smtpe_server_memory_size(cfg);
    void *mem = malloc(size);
    if (!mem)
        abort();
    smtpe_server *s = open_session(cfg, mem, size, h);
    for (size_t i = 0; i < n; i++)
        host_feed(s, h, (const uint8_t *)cmds[i], strlen(cmds[i]), 0);
    EXPECT(code_is(h, ready_code), "%s: no %s before the message", what, ready_code);
    uint64_t before = h->content;
    int ends = h->data_end_ok;
    double t0 = now_s();
    for (size_t off = 0; off < b->len; off += read_size) {
        size_t k = b->len - off < read_size ? b->len - off : read_size;
        host_feed(s, h, b->p + off, k, 0);
    }
    double t = now_s() - t0;
    EXPECT(h->content - before == b->content, "%s: %llu content octets, want %zu", what,
           (unsigned long long)(h->content - before), b->content);
    EXPECT(h->data_end_ok == ends + 1 && code_is(h, "250"), "%s: no 250 after the end", what);
    free(mem);
    return t;
}

static double bench_data(const smtpe_server_config *cfg, const bigbody *b, size_t read_size,
                         host *h)
{
    const char *cmds[] = {cmd_mail, cmd_rcpt, cmd_data};
    return bench_message(cfg, cmds, 3, "354", b, read_size, h, "big body");
}

/* 4. BDAT throughput (RFC 3030): the same content as the DATA body, unstuffed, sent as
 * chunks of chunk octets each behind their "BDAT n" line, the last one with LAST. */
static void make_bdat_wire(bigbody *w, const bigbody *b, size_t chunk)
{
    size_t content = b->content, at = 0, o = 0;
    w->p = malloc(content + (content / chunk + 2) * 40);
    if (!w->p)
        abort();
    /* the content is the DATA body less its final ".\r\n", with stuffed dots removed */
    uint8_t *flat = malloc(content + 1);
    if (!flat)
        abort();
    size_t f = 0;
    int bol = 1;
    for (size_t i = 0; i < b->len - 3; i++) {
        if (bol && b->p[i] == '.') {
            bol = 0;
            continue;
        }
        flat[f++] = b->p[i];
        bol = b->p[i] == '\n';
    }
    if (f != content)
        abort();
    while (at < content) {
        size_t n = content - at < chunk ? content - at : chunk;
        o += (size_t)sprintf((char *)w->p + o, "BDAT %zu%s\r\n", n, at + n == content ? " LAST" : "");
        memcpy(w->p + o, flat + at, n);
        o += n;
        at += n;
    }
    free(flat);
    w->len = o;
    w->content = content;
}

static double bench_bdat(const smtpe_server_config *cfg, const char *mail, const bigbody *w,
                         size_t read_size, host *h)
{
    const char *cmds[] = {mail, cmd_rcpt};
    return bench_message(cfg, cmds, 2, "250", w, read_size, h, "BDAT");
}

static double bench_memcpy(const bigbody *b, size_t read_size, host *h)
{
    double t0 = now_s();
    for (size_t off = 0; off < b->len; off += read_size) {
        size_t n = b->len - off < read_size ? b->len - off : read_size;
        sink_copy(h, b->p + off, n);
    }
    return now_s() - t0;
}

/* ------------------------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------------------------ */
/* 4. concurrent verdicts                                                                       */

#define LOOKUP_RCPTS 100
static char lookup_batch[LOOKUP_RCPTS * 40 + 256];

/* One session: EHLO, then MAIL + LOOKUP_RCPTS RCPTs + DATA + a short message + QUIT in one write;
 * MAIL, DATA and DATA_END are accepted at once, each RCPT when its lookup answers lookup_ms
 * after the event is taken (a simulated clock that jumps to the next answer whenever the
 * engine has nothing else to do). Returns the simulated ms from the batch to the 221. */
static uint64_t lookup_session(const smtpe_server_config *cfg, void *mem, size_t size, host *h,
                               uint64_t lookup_ms)
{
    static struct {
        uint64_t id, due;
    } wait[LOOKUP_RCPTS + 1];
    size_t nwait = 0, rcpts = 0;
    uint64_t clock = 0;
    smtpe_server *s = open_session(cfg, mem, size, h);
    const uint8_t *p = (const uint8_t *)lookup_batch;
    size_t n = strlen(lookup_batch);
    for (int guard = 0; guard < 100000; guard++) {
        smtpe_ssize r = smtpe_server_recv(s, p, n, clock);
        smtpe_event ev;
        int events = 0;
        if (r < 0)
            break;
        p += r;
        n -= (size_t)r;
        while (smtpe_server_next_event(s, &ev) == 1) {
            events++;
            if (ev.type == SMTPE_EV_RCPT) {
                wait[nwait].id = ev.id;
                wait[nwait++].due = clock + lookup_ms;
                rcpts++;
            } else if (ev.type == SMTPE_EV_DATA_CHUNK) {
                sink_copy(h, ev.chunk.ptr, ev.chunk.len);
                h->content += ev.chunk.len;
            } else if (smtpe_event_needs_reply(&ev)) {
                if (ev.type == SMTPE_EV_DATA_END && ev.data_end.status == SMTPE_DATA_OK)
                    h->data_end_ok++;
                smtpe_server_accept_id(s, ev.id);
            }
        }
        host_send(s, h);
        if (smtpe_server_want(s) & SMTPE_WANT_CLOSE)
            break;
        if (r > 0 || events > 0)
            continue;
        if (nwait == 0)
            break; /* stuck: the checks below fail */
        /* nothing to do but wait for the next lookup: the clock jumps to it */
        clock = wait[0].due;
        size_t k = 0;
        for (size_t i = 0; i < nwait; i++) {
            if (wait[i].due <= clock)
                EXPECT(smtpe_server_accept_id(s, wait[i].id) == 0, "RCPT verdict refused");
            else
                wait[k++] = wait[i];
        }
        nwait = k;
    }
    EXPECT(rcpts == LOOKUP_RCPTS, "%zu RCPT events, want %d", rcpts, LOOKUP_RCPTS);
    EXPECT(code_is(h, "221"), "lookup session ended with %.3s, want 221", h->last_code);
    EXPECT(smtpe_server_want(s) & SMTPE_WANT_CLOSE, "lookup session did not end");
    return clock;
}

/* n such sessions; returns seconds of CPU (wall clock) and the simulated ms of one in *sim. */
static double bench_lookups(const smtpe_server_config *cfg, long n, uint64_t lookup_ms,
                            uint64_t *sim, host *h)
{
    size_t size = smtpe_server_memory_size(cfg);
    void *mem = malloc(size);
    int before = h->data_end_ok;
    if (!mem)
        abort();
    double t0 = now_s();
    for (long i = 0; i < n; i++)
        *sim = lookup_session(cfg, mem, size, h, lookup_ms);
    double t = now_s() - t0;
    EXPECT(h->data_end_ok - before == n, "lookup sessions stored %d messages, want %ld",
           h->data_end_ok - before, n);
    free(mem);
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* 5. the client engine, against canned server replies                                        */

/* What a client host does with the engine. The server's replies come from string constants;
 * what the engine sends is counted and acknowledged (a real host would write(2) it), and kept
 * in record only when record is not NULL (the checked session of each run). */
typedef struct chost {
    uint64_t out_octets;          /* octets the engine handed out */
    uint8_t *record;              /* NULL, or where the output is kept, record_cap octets */
    size_t record_len, record_cap;
    int ready, content_events, delivered, not_delivered, done, closed_quit, closed_other;
    int quit_after_done;          /* ask for QUIT at TRANSACTION_DONE */
} chost;

static void chost_send(smtpe_client *c, chost *h)
{
    size_t len;
    const uint8_t *p;
    while ((p = smtpe_client_send_buf(c, &len)) != NULL && len > 0) {
        if (h->record && h->record_len + len <= h->record_cap) {
            memcpy(h->record + h->record_len, p, len);
            h->record_len += len;
        }
        h->out_octets += len;
        smtpe_client_send_ack(c, len);
    }
}

static void chost_events(smtpe_client *c, chost *h)
{
    smtpe_client_event ev;
    while (smtpe_client_next_event(c, &ev) == 1) {
        switch (ev.type) {
        case SMTPE_CEV_READY: h->ready++; break;
        case SMTPE_CEV_CONTENT: h->content_events++; break;
        case SMTPE_CEV_OUTCOME:
            if (ev.outcome.outcome == SMTPE_OUTCOME_DELIVERED)
                h->delivered++;
            else
                h->not_delivered++;
            break;
        case SMTPE_CEV_TRANSACTION_DONE:
            h->done++;
            if (h->quit_after_done)
                EXPECT(smtpe_client_quit(c) == 0, "client: QUIT refused");
            break;
        case SMTPE_CEV_CLOSED:
            if (ev.closed.reason == SMTPE_CLOSE_QUIT)
                h->closed_quit++;
            else if (h->closed_other++ == 0)
                EXPECT(0, "client: session closed, reason %d: %.*s", ev.closed.reason,
                       (int)ev.closed.text.len, (const char *)ev.closed.text.ptr);
            break;
        default: EXPECT(0, "client: unexpected event %d", (int)ev.type); break;
        }
    }
}

/* Feeds the server's octets p[0..n) as one read, taking events and sending output in
 * between, as a client host loop does. */
static void chost_feed(smtpe_client *c, chost *h, const char *p, size_t n)
{
    int stalls = 0;
    while (n > 0) {
        smtpe_ssize r = smtpe_client_recv(c, (const uint8_t *)p, n, 0);
        if (r < 0) {
            EXPECT(0, "client: recv: %s", smtpe_strerror((int)r));
            return;
        }
        p += r;
        n -= (size_t)r;
        chost_events(c, h);
        chost_send(c, h);
        if (r == 0 && ++stalls > 1) {
            EXPECT(0, "client: recv consumes nothing");
            return;
        }
    }
}

static void chost_feed_str(smtpe_client *c, chost *h, const char *s)
{
    chost_feed(c, h, s, strlen(s));
}

/* Gives the whole content msg[0..len) in pieces of at most piece octets (the last with
 * last = 1), sending the output after each call. Under BDAT each chunk but the last needs its
 * reply before the next one goes (RFC 3030 §2): pre (the replies owed before it: MAIL's and
 * RCPT's when the first BDAT went with the pipelined group) then a 250 for the chunk are fed
 * after each call that sent one. Returns 1 if pre was fed. */
static int chost_content(smtpe_client *c, chost *h, const uint8_t *msg, size_t len,
                         size_t piece, int bdat, const char *pre, int by_ref)
{
    size_t off = 0;
    int pre_fed = 0, stalls = 0;
    for (;;) {
        size_t k = len - off < piece ? len - off : piece;
        uint64_t before = h->out_octets;
        smtpe_ssize r = by_ref ? smtpe_client_content_ref(c, msg + off, k, off + k == len)
                               : smtpe_client_content(c, msg + off, k, off + k == len);
        if (r < 0) {
            EXPECT(0, "client: content: %s", smtpe_strerror((int)r));
            return pre_fed;
        }
        off += (size_t)r;
        chost_send(c, h);
        if ((size_t)r == k && off == len)
            return pre_fed; /* the end of the content is queued and sent */
        if (bdat && h->out_octets > before) {
            if (!pre_fed && pre)
                chost_feed_str(c, h, pre);
            pre_fed = 1;
            chost_feed_str(c, h, "250 2.0.0 Chunk accepted\r\n");
        }
        if (r == 0 && ++stalls > 2) {
            EXPECT(0, "client: content consumes nothing (%zu of %zu given)", off, len);
            return pre_fed;
        }
        if (r > 0)
            stalls = 0;
    }
}

static const char *srv_greeting = "220 mx.example ESMTP\r\n";
static const char *srv_ehlo = "250-mx.example\r\n250-PIPELINING\r\n250-SIZE 33554432\r\n"
                              "250-8BITMIME\r\n250-ENHANCEDSTATUSCODES\r\n250-CHUNKING\r\n"
                              "250 SMTPUTF8\r\n";
static const char *srv_mail_rcpt = "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n";
static const char *srv_mail_rcpt_data = "250 2.1.0 Ok\r\n250 2.1.5 Ok\r\n"
                                        "354 End data with <CR><LF>.<CR><LF>\r\n";
static const char *srv_queued = "250 2.0.0 Ok: queued as 7A2F9C0B1\r\n";
static const char *srv_bye = "221 2.0.0 Bye\r\n";

static const smtpe_client_rcpt client_rcpt = {"recipient@example.com", 0, NULL};
static smtpe_client_txn client_txn; /* reverse-path sender@example.org, one recipient */

/* A message of exactly len octets (len >= 2): a few header lines, then lines of 76 octets,
 * every 7th starting with '.', the last one shorter, all ending in CRLF. *stuffed gets the
 * octets DATA puts on the wire for it, dot-stuffed, ".\r\n" included (RFC 5321 §4.5.2). */
typedef struct message {
    uint8_t *p, *stuffed;
    size_t len, stuffed_len;
} message;

/* DATA's wire form of msg[0..len) (which ends in CRLF): a '.' doubled at each line start,
 * then ".\r\n" (RFC 5321 §4.5.2); out has room for len + len / 2 + 3 octets. Returns its
 * length. */
static size_t stuff_ref(const uint8_t *msg, size_t len, uint8_t *out)
{
    size_t s = 0;
    for (size_t i = 0; i < len; i++) {
        if (msg[i] == '.' && (i == 0 || msg[i - 1] == '\n'))
            out[s++] = '.';
        out[s++] = msg[i];
    }
    memcpy(out + s, ".\r\n", 3);
    return s + 3;
}

/* Whether w[0..wl) is what the client must send for the content msg[0..len): DATA's stuffed
 * form, or (bdat) "BDAT n\r\n" chunks whose n octets are the content, the last "BDAT n
 * LAST\r\n" (RFC 3030 §2). */
static int content_wire_ok(int bdat, const uint8_t *w, size_t wl, const uint8_t *msg,
                           size_t len)
{
    if (!bdat) {
        uint8_t *ref = malloc(len + len / 2 + 3);
        if (!ref)
            abort();
        size_t rl = stuff_ref(msg, len, ref);
        int ok = rl == wl && memcmp(ref, w, wl) == 0;
        free(ref);
        return ok;
    }
    size_t at = 0, got = 0;
    for (;;) {
        char head[40];
        size_t h = 0;
        while (at + h < wl && h + 1 < sizeof head && w[at + h] != '\n') {
            head[h] = (char)w[at + h];
            h++;
        }
        head[h] = '\0';
        unsigned long long n;
        int used = 0;
        if (at + h >= wl || sscanf(head, "BDAT %llu%n", &n, &used) != 1)
            return 0;
        int last = !strcmp(head + used, " LAST\r");
        if (!last && strcmp(head + used, "\r"))
            return 0;
        at += h + 1;
        if (n > wl - at || n > len - got || memcmp(w + at, msg + got, (size_t)n))
            return 0;
        at += (size_t)n;
        got += (size_t)n;
        if (last)
            return at == wl && got == len;
    }
}

static void make_message(message *m, size_t len)
{
    static const char hdr[] = "From: <sender@example.org>\r\nTo: <recipient@example.com>\r\n"
                              "Subject: benchmark message\r\n\r\n";
    m->p = malloc(len);
    m->stuffed = malloc(len + len / 2 + 3);
    if (!m->p || !m->stuffed)
        abort();
    size_t o = 0;
    if (len >= sizeof hdr + 1) {
        memcpy(m->p, hdr, sizeof hdr - 1);
        o = sizeof hdr - 1;
    }
    for (unsigned line = 0; o < len; line++) {
        size_t left = len - o, l = left - 2 > 76 ? 76 : left - 2;
        if (left - 2 > 76 && left - 2 - 76 < 2)
            l = 74; /* no lone octet left for the last line */
        for (size_t k = 0; k < l; k++)
            m->p[o + k] = (uint8_t)('a' + (line + k) % 26);
        if (l > 0 && line % 7 == 3)
            m->p[o] = '.';
        o += l;
        m->p[o++] = '\r';
        m->p[o++] = '\n';
    }
    m->len = len;
    m->stuffed_len = stuff_ref(m->p, len, m->stuffed);
}

/* HTML of about len octets in long lines: each line one paragraph of 600..990 octets (under
 * RFC 5322's 998, so DATA may carry it), with tags, attributes, URLs and text, CRLF ends. */
static void make_html(message *m, size_t len)
{
    static const char *words[] = {
        "the", "newsletter", "of", "<b>this</b>", "week", "and", "offers", "for", "you",
        "<a href=\"https://example.com/p?id=42&amp;u=7\">read more</a>", "price", "&nbsp;",
        "delivery", "in", "2024.", "with", "<span style=\"color:#336699\">news</span>", "our",
        "team"};
    const size_t nw = sizeof words / sizeof *words;
    static const char open[] = "<p style=\"margin:0 0 12px 0;font-family:Arial,Helvetica,"
                               "sans-serif;font-size:14px;line-height:20px;color:#222222\">";
    m->p = malloc(len + 2048);
    if (!m->p)
        abort();
    m->stuffed = NULL;
    m->stuffed_len = 0;
    uint32_t x = 4242;
    size_t o = (size_t)sprintf((char *)m->p, "From: <sender@example.org>\r\nTo: "
                                             "<recipient@example.com>\r\nSubject: html\r\n"
                                             "MIME-Version: 1.0\r\nContent-Type: text/html; "
                                             "charset=utf-8\r\n\r\n<html><body>\r\n");
    while (o < len) {
        x = x * 1103515245u + 12345u;
        size_t want = 600 + (x >> 8) % 391, start = o;
        memcpy(m->p + o, open, sizeof open - 1);
        o += sizeof open - 1;
        while (o - start < want - 4 - 20) {
            x = x * 1103515245u + 12345u;
            const char *w = words[(x >> 16) % nw];
            size_t wl = strlen(w);
            if (o - start + wl + 1 > want - 4)
                break;
            memcpy(m->p + o, w, wl);
            o += wl;
            m->p[o++] = ' ';
        }
        memcpy(m->p + o - 1, "</p>\r\n", 6);
        o += 5;
    }
    memcpy(m->p + o, "</body></html>\r\n", 16);
    m->len = o + 16;
}

static void client_config(smtpe_client_config *cc, int chunking, size_t out_size)
{
    smtpe_client_config_init(cc);
    cc->helo_name = "client.example";
    cc->chunking = chunking;
    if (out_size)
        cc->output_buffer_size = out_size;
}

/* What the client sends in one session of bench_client_sessions, exactly. */
static size_t client_expected(const message *m, uint8_t *out, size_t cap)
{
    static const char cmds[] = "EHLO client.example\r\nMAIL FROM:<sender@example.org>\r\n"
                               "RCPT TO:<recipient@example.com>\r\nDATA\r\n";
    size_t n = sizeof cmds - 1;
    if (n + m->stuffed_len + 6 > cap)
        abort();
    memcpy(out, cmds, n);
    memcpy(out + n, m->stuffed, m->stuffed_len);
    n += m->stuffed_len;
    memcpy(out + n, "QUIT\r\n", 6);
    return n + 6;
}

/* One whole client session: submitted before the greeting; greeting, EHLO (PIPELINING
 * offered), MAIL + RCPT + DATA in one write answered by one read, the message as one piece,
 * its 250, QUIT, 221. */
static void client_session(const smtpe_client_config *cc, void *mem, size_t size,
                           const message *m, chost *h)
{
    smtpe_client *c;
    int rc = smtpe_client_init(&c, mem, size, cc, 0);
    if (rc != 0) {
        EXPECT(0, "client init: %s", smtpe_strerror(rc));
        return;
    }
    EXPECT(smtpe_client_submit(c, &client_txn) == 0, "client submit");
    int content = h->content_events, delivered = h->delivered, quit = h->closed_quit;
    h->quit_after_done = 1;
    chost_feed_str(c, h, srv_greeting);
    chost_feed_str(c, h, srv_ehlo);
    chost_feed_str(c, h, srv_mail_rcpt_data);
    EXPECT(h->content_events == content + 1, "client session: no CONTENT after the 354");
    chost_content(c, h, m->p, m->len, m->len, 0, NULL, 0);
    chost_feed_str(c, h, srv_queued);
    chost_feed_str(c, h, srv_bye);
    EXPECT(h->delivered == delivered + 1 && h->closed_quit == quit + 1,
           "client session: not delivered or not closed by QUIT");
}

static double bench_client_sessions(const smtpe_client_config *cc, long n, const message *m,
                                    chost *h)
{
    static uint8_t want[8192], got[8192];
    size_t want_len = client_expected(m, want, sizeof want);
    size_t size = smtpe_client_memory_size(cc);
    void *mem = malloc(size);
    if (!mem)
        abort();
    /* one session with its output kept and compared octet for octet */
    h->record = got;
    h->record_len = 0;
    h->record_cap = sizeof got;
    client_session(cc, mem, size, m, h);
    EXPECT(h->record_len == want_len && memcmp(got, want, want_len) == 0,
           "client session output differs (%zu octets, want %zu)", h->record_len, want_len);
    h->record = NULL;
    uint64_t before = h->out_octets;
    double t0 = now_s();
    for (long i = 0; i < n; i++)
        client_session(cc, mem, size, m, h);
    double t = now_s() - t0;
    EXPECT(h->out_octets - before == (uint64_t)n * want_len, "client sessions sent %llu octets, "
           "want %llu", (unsigned long long)(h->out_octets - before),
           (unsigned long long)n * want_len);
    free(mem);
    return t;
}

/* The cost of one now_s() call in seconds, subtracted once from each timed content phase (a
 * 4 KB message takes only about a µs): the mean over a batch of 200 calls, the smallest of 10
 * batches (a preemption only ever makes a batch slower). */
static double timer_cost(void)
{
    double best = 1.0;
    for (int b = 0; b < 10; b++) {
        double t0 = now_s();
        for (int i = 0; i < 200; i++)
            (void)now_s();
        double t = (now_s() - t0) / 201;
        if (t < best)
            best = t;
    }
    return best;
}

/* count transactions of the message msg[0..len) on one session (init, greeting, EHLO with
 * PIPELINING and CHUNKING), by DATA or (bdat) BDAT, the content given in pieces of at most
 * piece octets and the output acknowledged as it comes. Returns the seconds spent giving the
 * content and sending what it became (the BDAT chunk replies included), less the timer. One
 * more transaction before them, untimed, has its content octets checked on the wire. */
/* mode 0 DATA (smtpe_client_content), 1 BDAT, 2 DATA by reference (smtpe_client_content_ref:
 * the output points into msg where it can) */
static double bench_client_content(int mode, const uint8_t *msg, size_t len, size_t piece,
                                   long count, chost *h)
{
    int bdat = mode == 1;
    smtpe_client_config cc;
    client_config(&cc, bdat, 65536 + 1024);
    size_t size = smtpe_client_memory_size(&cc);
    void *mem = malloc(size);
    smtpe_client *c;
    if (!mem || smtpe_client_init(&c, mem, size, &cc, 0) != 0)
        abort();
    h->quit_after_done = 0;
    chost_feed_str(c, h, srv_greeting);
    chost_feed_str(c, h, srv_ehlo);
    EXPECT(h->ready > 0, "client content: not ready after the EHLO reply");
    double timer = timer_cost(), total = 0;
    int delivered = h->delivered, done = h->done;
    size_t record_cap = len + len / 2 + 65536;
    uint8_t *record = malloc(record_cap);
    if (!record)
        abort();
    for (long i = -1; i < count; i++) {
        int content = h->content_events;
        if (smtpe_client_submit(c, &client_txn) != 0) {
            EXPECT(0, "client content: submit refused (transaction %ld)", i);
            break;
        }
        chost_events(c, h);
        chost_send(c, h);
        if (!bdat)
            chost_feed_str(c, h, srv_mail_rcpt_data);
        EXPECT(h->content_events == content + 1, "client content: no CONTENT event");
        if (i < 0) {
            h->record = record;
            h->record_len = 0;
            h->record_cap = record_cap;
        }
        double t0 = now_s();
        int pre_fed = chost_content(c, h, msg, len, piece, bdat, srv_mail_rcpt, mode == 2);
        if (i >= 0)
            total += now_s() - t0 - timer;
        if (i < 0) {
            EXPECT(content_wire_ok(bdat, record, h->record_len, msg, len),
                   "client content (%s): wrong octets on the wire", bdat ? "BDAT" : "DATA");
            h->record = NULL;
        }
        if (bdat && !pre_fed)
            chost_feed_str(c, h, srv_mail_rcpt);
        chost_feed_str(c, h, srv_queued);
    }
    EXPECT(h->delivered - delivered == count + 1 && h->done - done == count + 1,
           "client content (%s): %d of %ld delivered", bdat ? "BDAT" : "DATA",
           h->delivered - delivered, count + 1);
    free(record);
    free(mem);
    return total;
}

/* memcpy of msg[0..len) count times in pieces of at most piece octets into the host's sink. */
static double bench_client_memcpy(const uint8_t *msg, size_t len, size_t piece, long count,
                                  host *h)
{
    double t0 = now_s();
    for (long i = 0; i < count; i++)
        for (size_t off = 0; off < len; off += piece)
            sink_copy(h, msg + off, len - off < piece ? len - off : piece);
    return now_s() - t0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: smtpe-bench-engine [--quick] [--runs N] [--sessions N] [--data-mib N]\n"
            "\n"
            "In-memory micro-benchmark of the smtpe server engine through its public API:\n"
            "sessions/s (banner, EHLO, MAIL, RCPT, DATA 4 KB, QUIT; smtpe_server_init in\n"
            "reused memory and smtpe_server_new/free), ns per command, DATA throughput\n"
            "in GB/s beside memcpy of the same octets, and a pipelined transaction of 100\n"
            "RCPTs with 20 ms lookups one at a time and concurrently. Then the client\n"
            "engine against canned replies: client sessions/s (smtpe_client_init in reused\n"
            "memory, PIPELINING, 4 KB message) and its content encoding in GB/s by DATA\n"
            "and BDAT (4 KB messages, 1 MiB of 76-octet lines, 1 MiB of long-line HTML)\n"
            "beside memcpy. Best and median of --runs runs.\n"
            "\n"
            "  --quick        tiny counts: a smoke test that the benchmark runs and checks\n"
            "  --runs N       repetitions of each measurement (default 5, at most %d)\n"
            "  --sessions N   sessions per run (default 100000), server and client\n"
            "  --data-mib N   size of the DATA body in MiB (default 64), fed in 64 KiB reads;\n"
            "                 also the client content per run: N MiB of 4 KB messages, N/4\n"
            "                 messages (at least 1) of each 1 MiB body\n"
            "\n"
            "Build it as Release for meaningful figures:\n"
            "  cmake -B build-release -DCMAKE_BUILD_TYPE=Release && \\\n"
            "  cmake --build build-release --target smtpe-bench-engine && \\\n"
            "  build-release/tests/bench/smtpe-bench-engine\n",
            MAX_RUNS);
}

int main(int argc, char **argv)
{
    int runs = 5;
    long sessions = 100000, cmd_reps = 20000, lookup_sessions = 5000;
    size_t data_mib = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            runs = 3;
            sessions = 200;
            cmd_reps = 50;
            data_mib = 1;
            lookup_sessions = 20;
        } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--sessions") && i + 1 < argc) {
            sessions = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--data-mib") && i + 1 < argc) {
            data_mib = (size_t)atol(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (runs < 1 || runs > MAX_RUNS || sessions < 1 || data_mib < 1 || data_mib > 4096) {
        usage(stderr);
        return 2;
    }

#if !defined(__OPTIMIZE__) || !defined(NDEBUG)
    printf("note: not an optimised Release build; configure with -DCMAKE_BUILD_TYPE=Release\n");
#endif
    smtpe_server_config cfg;
    smtpe_server_config_init(&cfg);
    cfg.hostname = "mx.example";
    smtpe_server_config data_cfg = cfg;
    data_cfg.max_message_size = 0; /* the big body has no limit */
    smtpe_server_config cmd_cfg = cfg;
    cmd_cfg.max_recipients = 1000000;

    static host h;
    make_body4k();
    bigbody big;
    make_bigbody(&big, data_mib << 20);
    const size_t read_size = 65536;

    double t_init[MAX_RUNS], t_new[MAX_RUNS], t_noop[MAX_RUNS], t_txn[MAX_RUNS];
    double t_data[MAX_RUNS], t_copy[MAX_RUNS], t_bdat[MAX_RUNS], t_bin[MAX_RUNS];
    smtpe_server_config bdat_cfg = data_cfg;
    bdat_cfg.extensions |= SMTPE_EXT_CHUNKING | SMTPE_EXT_BINARYMIME;
    bigbody wire;
    make_bdat_wire(&wire, &big, 1 << 20);
    static const char *mail_binary = "MAIL FROM:<sender@example.org> BODY=BINARYMIME\r\n";
    static char noop_batch[16 * 6 + 1], txn_batch[512];
    for (int i = 0; i < 16; i++)
        strcat(noop_batch, "NOOP\r\n");
    snprintf(txn_batch, sizeof txn_batch, "%s%s%s%sRSET\r\n", cmd_mail, cmd_rcpt, cmd_rcpt,
             cmd_rcpt);
    const int txn_cmds = 5;
    size_t at = (size_t)snprintf(lookup_batch, sizeof lookup_batch, "%s", cmd_mail);
    for (int i = 0; i < LOOKUP_RCPTS; i++)
        at += (size_t)snprintf(lookup_batch + at, sizeof lookup_batch - at,
                               "RCPT TO:<r%d@example.com>\r\n", i);
    snprintf(lookup_batch + at, sizeof lookup_batch - at,
             "DATA\r\nSubject: lookups\r\n\r\nHello.\r\n.\r\nQUIT\r\n");
    smtpe_server_config seq_cfg = cfg, conc_cfg = cfg;
    conc_cfg.max_pending_verdicts = LOOKUP_RCPTS + 1;
    const uint64_t lookup_ms = 20;
    double t_seq[MAX_RUNS], t_conc[MAX_RUNS];
    uint64_t sim_seq = 0, sim_conc = 0;

    /* 5. the client engine */
    static chost ch;
    smtpe_client_config ccfg;
    client_config(&ccfg, 0, 0);
    client_txn.reverse_path = "sender@example.org";
    client_txn.rcpts = &client_rcpt;
    client_txn.rcpt_count = 1;
    message msg4k, lines1m, html1m;
    make_message(&msg4k, 4096);
    make_message(&lines1m, 1 << 20);
    make_html(&html1m, 1 << 20);
    enum { CB_4K, CB_LINES, CB_HTML, CB_N };
    const struct {
        const message *m;
        size_t piece;
        long count;
        const char *name, *copy_name;
    } cbody[CB_N] = {
        {&msg4k, 4096, (long)(data_mib << 8), "4 KB messages (76-octet lines)",
         "memcpy of the same octets, 4 KB pieces"},
        {&lines1m, 65536, data_mib / 4 ? (long)(data_mib / 4) : 1,
         "1 MiB of 76-octet lines, 64 KiB pieces", "memcpy of the same octets, 64 KiB pieces"},
        {&html1m, 65536, data_mib / 4 ? (long)(data_mib / 4) : 1,
         "1 MiB of HTML, 600-990-octet lines", "memcpy of the same octets, 64 KiB pieces"},
    };
    double t_client[MAX_RUNS], t_cdata[CB_N][MAX_RUNS], t_cbdat[CB_N][MAX_RUNS];
    double t_cref[CB_N][MAX_RUNS];
    double t_ccopy[CB_N][MAX_RUNS];

    for (int r = 0; r < runs; r++) {
        t_init[r] = bench_sessions(&cfg, 0, sessions, &h);
        t_new[r] = bench_sessions(&cfg, 1, sessions, &h);
        t_noop[r] = bench_commands(&cmd_cfg, noop_batch, cmd_reps, &h, "250");
        t_txn[r] = bench_commands(&cmd_cfg, txn_batch, cmd_reps, &h, "250");
        t_data[r] = bench_data(&data_cfg, &big, read_size, &h);
        t_copy[r] = bench_memcpy(&big, read_size, &h);
        t_bdat[r] = bench_bdat(&bdat_cfg, cmd_mail, &wire, read_size, &h);
        t_bin[r] = bench_bdat(&bdat_cfg, mail_binary, &wire, read_size, &h);
        t_seq[r] = bench_lookups(&seq_cfg, lookup_sessions, lookup_ms, &sim_seq, &h);
        t_conc[r] = bench_lookups(&conc_cfg, lookup_sessions, lookup_ms, &sim_conc, &h);
        t_client[r] = bench_client_sessions(&ccfg, sessions, &msg4k, &ch);
        for (int k = 0; k < CB_N; k++) {
            const message *m = cbody[k].m;
            t_cdata[k][r] = bench_client_content(0, m->p, m->len, cbody[k].piece,
                                                 cbody[k].count, &ch);
            t_ccopy[k][r] = bench_client_memcpy(m->p, m->len, cbody[k].piece, cbody[k].count,
                                                &h);
            t_cbdat[k][r] = bench_client_content(1, m->p, m->len, cbody[k].piece,
                                                 cbody[k].count, &ch);
            t_cref[k][r] = bench_client_content(2, m->p, m->len, cbody[k].piece,
                                                cbody[k].count, &ch);
        }
    }

    double b, m, bc, mc;
    printf("smtpe engine micro-benchmark: %d runs, best / median\n\n", runs);
    printf("%-44s %14s %14s\n", "", "best", "median");
    best_median(t_init, runs, &b, &m);
    printf("%-44s %12.0f/s %12.0f/s   (%.0f ns/session, %.0f ns per step of 6)\n",
           "sessions, smtpe_server_init (reused memory)", sessions / b, sessions / m,
           b * 1e9 / sessions, b * 1e9 / sessions / 6);
    double sb, sm;
    best_median(t_init, runs, &sb, &sm); /* sorted already: the same best and median */
    best_median(t_new, runs, &b, &m);
    printf("%-44s %12.0f/s %12.0f/s   (%.0f ns/session)\n", "sessions, smtpe_server_new/free",
           sessions / b, sessions / m, b * 1e9 / sessions);
    best_median(t_client, runs, &b, &m);
    printf("%-44s %12.0f/s %12.0f/s   (%.2f µs/session)\n",
           "client sessions, smtpe_client_init (reused)", sessions / b, sessions / m,
           b * 1e6 / sessions);
    printf("%-44s %12.3f   %12.3f\n", "ratio client / server session time (init)", b / sb,
           m / sm);
    best_median(t_noop, runs, &b, &m);
    printf("%-44s %11.1f ns %11.1f ns\n", "command NOOP (engine alone), pipelined",
           b * 1e9 / (cmd_reps * 16.0), m * 1e9 / (cmd_reps * 16.0));
    best_median(t_txn, runs, &b, &m);
    printf("%-44s %11.1f ns %11.1f ns\n", "command MAIL/RCPT/RSET (host verdicts)",
           b * 1e9 / ((double)cmd_reps * txn_cmds), m * 1e9 / ((double)cmd_reps * txn_cmds));
    best_median(t_data, runs, &b, &m);
    best_median(t_copy, runs, &bc, &mc);
    printf("%-44s %9.2f GB/s %9.2f GB/s\n", "DATA content, 64 KiB reads, chunks copied",
           big.len / b / 1e9, big.len / m / 1e9);
    printf("%-44s %9.2f GB/s %9.2f GB/s\n", "memcpy of the same octets, 64 KiB pieces",
           big.len / bc / 1e9, big.len / mc / 1e9);
    printf("%-44s %12.3f   %12.3f\n", "ratio DATA speed / memcpy speed", bc / b, mc / m);
    best_median(t_bdat, runs, &b, &m);
    printf("%-44s %9.2f GB/s %9.2f GB/s\n", "BDAT 1 MiB chunks, line ends checked",
           wire.len / b / 1e9, wire.len / m / 1e9);
    best_median(t_bin, runs, &b, &m);
    printf("%-44s %9.2f GB/s %9.2f GB/s\n", "BDAT 1 MiB chunks, BODY=BINARYMIME",
           wire.len / b / 1e9, wire.len / m / 1e9);
    printf("\nclient content, smtpe_client_content, output acked uncopied (content octets):\n");
    for (int k = 0; k < CB_N; k++) {
        double octets = (double)cbody[k].m->len * (double)cbody[k].count, db, dm, bb, bm, rb, rm;
        char label[64];
        best_median(t_cdata[k], runs, &db, &dm);
        best_median(t_cbdat[k], runs, &bb, &bm);
        best_median(t_ccopy[k], runs, &bc, &mc);
        printf("  %s:\n", cbody[k].name);
        printf("%-44s %9.2f GB/s %9.2f GB/s\n", "    DATA (dot-stuffed)", octets / db / 1e9,
               octets / dm / 1e9);
        printf("%-44s %9.2f GB/s %9.2f GB/s\n", "    BDAT (one chunk per piece)",
               octets / bb / 1e9, octets / bm / 1e9);
        best_median(t_cref[k], runs, &rb, &rm);
        printf("%-44s %9.2f GB/s %9.2f GB/s\n", "    DATA by reference (content_ref)",
               octets / rb / 1e9, octets / rm / 1e9);
        snprintf(label, sizeof label, "    %s", cbody[k].copy_name);
        printf("%-44s %9.2f GB/s %9.2f GB/s\n", label, octets / bc / 1e9, octets / mc / 1e9);
        printf("%-44s %12.3f   %12.3f\n", "    ratio DATA speed / memcpy speed", bc / db,
               mc / dm);
        printf("%-44s %12.3f   %12.3f\n", "    ratio BDAT speed / memcpy speed", bc / bb,
               mc / bm);
        printf("%-44s %12.3f   %12.3f\n", "    ratio DATA by reference / memcpy speed",
               bc / rb, mc / rm);
    }
    printf("\npipelined MAIL + %d RCPTs + DATA, each RCPT verdict from a %llu ms lookup:\n",
           LOOKUP_RCPTS, (unsigned long long)lookup_ms);
    printf("%-44s %9llu ms\n", "  simulated time, max_pending_verdicts 1", (unsigned long long)sim_seq);
    printf("%-44s %9llu ms   (%.0fx faster)\n", "  simulated time, max_pending_verdicts 101",
           (unsigned long long)sim_conc, sim_conc ? (double)sim_seq / (double)sim_conc : 0.0);
    best_median(t_seq, runs, &b, &m);
    best_median(t_conc, runs, &bc, &mc);
    printf("%-44s %11.0f ns %11.0f ns\n", "  engine CPU per session, max_pending 1",
           b * 1e9 / lookup_sessions, m * 1e9 / lookup_sessions);
    printf("%-44s %11.0f ns %11.0f ns   (ratio %.2f)\n", "  engine CPU per session, max_pending 101",
           bc * 1e9 / lookup_sessions, mc * 1e9 / lookup_sessions, bc / b);
    printf("\nDATA body: %zu octets on the wire (%.1f MiB), %zu of content; GB/s are 10^9 wire\n"
           "octets per second. The 64 KiB sink stays in cache, so memcpy is a cache-hot bound.\n"
           "Session body: %zu octets.\n",
           big.len, big.len / 1048576.0, big.content, body4k_len);
    printf("Client: %.1f ns per clock read subtracted from each timed content phase; per run\n"
           "%ld 4 KB messages and %ld of each 1 MiB body; the client session sends %zu\n"
           "octets of content (%zu before stuffing). The client's output ring is 65 KiB for\n"
           "the content rows and 16 KiB (the default) for the sessions.\n",
           timer_cost() * 1e9, cbody[CB_4K].count, cbody[CB_LINES].count, msg4k.stuffed_len,
           msg4k.len);
    /* what the host did, so none of it can be optimised away */
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof h.sink; i += 64)
        sum += h.sink[i];
    printf("host: %llu reply octets sent, %llu content octets stored (checksum %u); "
           "client: %llu octets sent\n",
           (unsigned long long)h.out_octets, (unsigned long long)h.content, sum,
           (unsigned long long)ch.out_octets);
    free(big.p);
    free(msg4k.p);
    free(msg4k.stuffed);
    free(lines1m.p);
    free(lines1m.stuffed);
    free(html1m.p);
    free(wire.p);
    if (failures) {
        fprintf(stderr, "bench: %d checks failed\n", failures);
        return 1;
    }
    return 0;
}
