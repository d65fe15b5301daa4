/*
 * fuzz_session.c - libFuzzer target over a whole server session, driven through the public API
 * exactly as a host drives it (smtpe_server_recv / next_event / reply / accept / close /
 * send_buf / send_ack / expiry / handle_expiry).
 *
 * Input layout (all multi-octet numbers little-endian; a short input is padded with zeros):
 *
 *   [0]      line-ending policy (value % 3: REFUSE, NORMALISE, KEEP)
 *   [1]      bit 0 lax angle brackets, bit 1 ehlo_extra lines, bit 2 long (255-octet) hostname,
 *            bit 3 custom greeting text, bits 4-5 timeouts (defaults, none, 1000/1000, 1000/none)
 *   [2]      max_message_size: <32 default (10 MiB), <64 none (0), else (v-64)*8+1 octets
 *   [3]      max_recipients: <128 1+v%4, <192 100, else v
 *   [4]      max_errors: <128 v%6 (0: no limit), else default (20)
 *   [5]      extensions bitmask (& 0x1f, SMTPE_EXT_*)
 *   [6]      reply_buffer_size: one of 2048, 2100, 3000, 4096, 65536 (v % 5)
 *   [7]      max_line_length: one of 512, 513, 600, 1000, 4096 (v % 5)
 *   [8..9]   D: number of decision octets at the end of the input (clipped to what is there)
 *   [10..13] seed of the generator that takes over when the decision octets run out
 *   [14]     start time: 0, 1000 or 2^40 ms (v % 3)
 *   [15]     reserved
 *   [16..len-D)  the client octets
 *   [len-D..len) decision octets, read in order (FuzzedDataProvider style): split points, host
 *                verdicts (accept, a reply with a code from a list for the event type, a host
 *                close, or a verdict deferred for a few feeds), clock advances with
 *                handle_expiry calls, and partial acknowledgements of output.
 *
 * A seed corpus file is therefore 16 header octets followed by a plain SMTP client transcript.
 *
 * Each input runs the session twice:
 *   run 1 ("split"): client octets arrive in fuzz-chosen pieces, output is acknowledged in
 *     fuzz-chosen parts (so reply-buffer backpressure happens), verdicts may be deferred; the
 *     session is made by smtpe_server_new with a counting allocator.
 *   run 2 ("whole"): all client octets are available at once, output is always sent in full,
 *     no deferral; the session lives in caller memory (smtpe_server_init).
 * The host decisions (verdict, reply code/text, clock advance) are keyed by the index of the
 * event in the sequence of non-chunk events, never by the split, and are recorded in run 1 and
 * replayed in run 2. The clock only moves right after an event has been handled, so the
 * timeouts see the same history in both runs.
 *
 * Oracles (abort on violation):
 *   (a) split invariance: both runs give the same output octets and the same event log (the
 *       DATA_CHUNK contents coalesced), the same return codes, statistics and octets consumed;
 *   (b) output: every reply line matches ^[2-5][0-9][0-9][ -], ends in CRLF, has no other
 *       control octet, is at most 512 octets, and a "ddd-" line is followed by one of the
 *       same code; the output ends with a complete reply;
 *   (c) content: for a message that ended SMTPE_DATA_OK without normalisation (always so under
 *       KEEP), the concatenated chunks are exactly the octets the engine consumed between the
 *       DATA line and the DATA_END event, less the final ".\r\n", dot-unstuffed by a reference
 *       (first '.' of each CRLF-ended line deleted). For a client that stuffed correctly this
 *       is "the chunks re-stuffed plus .CRLF are the octets consumed"; it is checked this way
 *       round because unstuffing is not one-to-one on a line like ".x" that was not stuffed.
 *       In every policy the first
 *       CRLF.CRLF (counting the DATA line's CRLF) is exactly where the content ended;
 *       DATA_END.size is the octets delivered (at least those when the status is not OK);
 *       HAS_8BIT says whether one was above 127;
 *   (d) memory: smtpe_server_new makes exactly one allocation of smtpe_server_memory_size(cfg)
 *       octets, none afterwards, and smtpe_server_free releases that one;
 *   (e) smtpe_server_recv returns 0..len; next_event returns 0 or 1 and agrees with
 *       SMTPE_WANT_EVENT; send_buf agrees with SMTPE_WANT_WRITE; recv consumes only with
 *       SMTPE_WANT_READ, and with it consumes or makes an event; a session at rest wants to read
 *       (having consumed everything) or to close; handle_expiry agrees with
 *       expiry(); accept succeeds whenever a verdict is due; event spans lie in session memory
 *       (paths, arguments) or in the octets just fed (chunks; or a static CR/LF/CRLF).
 *
 * Reproduce a crash: fuzz/out/fuzz_session CRASHFILE (it prints what was violated; with
 * FUZZ_TRACE=1 in the environment it also prints every call and event of both runs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "smtpe.h"

#define HDR 16

/* FUZZ_TRACE=1 in the environment prints what each run does, to read a reproducer. */
static int trace = -1;
#define TRACE(...)                                                                              \
    do {                                                                                        \
        if (trace > 0)                                                                          \
            fprintf(stderr, __VA_ARGS__);                                                       \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* The decision provider: octets from the input, then a xorshift generator seeded from it.     */

typedef struct prov {
    const uint8_t *p;
    size_t n;
    size_t i;
    uint64_t x;
} prov;

static unsigned prov_u8(prov *d)
{
    if (d->i < d->n)
        return d->p[d->i++];
    d->x ^= d->x << 13;
    d->x ^= d->x >> 7;
    d->x ^= d->x << 17;
    return (unsigned)(d->x >> 29) & 0xff;
}

/* ------------------------------------------------------------------------------------------ */
/* Host decisions, keyed by the index of the non-chunk event (index 0: session start).         */

enum { K_NONE, K_ACCEPT, K_REPLY, K_CLOSE };

typedef struct decision {
    int kind;
    unsigned code;
    const char *enhanced;
    const char *text;
    unsigned defer;   /* feeds to hold the verdict back (split run only) */
    uint64_t advance; /* ms the clock moves on after the event */
} decision;

static const unsigned helo_codes[] = {250, 421, 450, 451, 501, 504, 550, 554};
static const unsigned mail_codes[] = {250, 251, 421, 450, 451, 452, 503, 550, 551, 552, 553, 555};
static const unsigned rcpt_codes[] = {250, 251, 252, 421, 450, 451, 452, 550, 551, 552, 553};
static const unsigned data_codes[] = {354, 421, 451, 452, 503, 550, 554};
static const unsigned end_codes[] = {250, 421, 450, 451, 452, 550, 552, 554};
static const unsigned vrfy_codes[] = {250, 251, 252, 421, 502, 550, 551, 553};
static const unsigned unknown_codes[] = {500, 502, 504, 250, 421};
static const unsigned odd_codes[] = {0, 199, 200, 299, 300, 354, 599, 600, 999};
static const unsigned close_codes[] = {421, 421, 221, 554, 550, 500, 250};

static char text_400[401];     /* one line of 400 octets: the most a line may hold */
static char text_401[402];     /* one octet too many */
static char text_lines[1200];  /* 100 short lines */
static char text_many[2200];   /* 700 one-octet lines: more text than a small buffer holds */
static char text_total[2100];  /* 2049 octets of text in 6 lines: over the total */

static const char *texts[] = {
    NULL, NULL, "Ok", "", "first line\nsecond line", "a\n\nb", text_400, text_401,
    "tab\there", "trailing newline\n", "\n", "caf\xc3\xa9 na\xc3\xafve", "cr\rin text",
    text_lines, text_many, text_total,
};

static void texts_init(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    memset(text_400, 'x', 400);
    memset(text_401, 'y', 401);
    size_t o = 0;
    for (int i = 0; i < 100; i++)
        o += (size_t)snprintf(text_lines + o, sizeof text_lines - o, "%sline %d", i ? "\n" : "",
                              i);
    o = 0;
    for (int i = 0; i < 700; i++) {
        if (i)
            text_many[o++] = '\n';
        text_many[o++] = 'm';
    }
    memset(text_total, 't', 2054);
    for (int i = 1; i <= 5; i++)
        text_total[i * 342] = '\n';
}

static const char *enhanced_for(prov *pv, unsigned code)
{
    static const char *match[] = {"2.0.0", "2.1.5", "4.3.0", "4.7.1", "5.1.1", "5.7.1"};
    unsigned v = prov_u8(pv) % 8;
    unsigned cls = code / 100;
    switch (v) {
    case 0: case 1: case 2: return NULL;
    case 3: case 4:
        if (cls == 2) return match[v - 3];
        if (cls == 4) return match[v - 1];
        if (cls == 5) return match[v + 1];
        return "3.0.0";
    case 5: return "5.7.1";
    case 6: return "2.999.999";
    default: return (prov_u8(pv) & 1) ? "5.1" : "5.1000.1";
    }
}

#define PICK(arr, v) ((arr)[(v) % (sizeof(arr) / sizeof((arr)[0]))])

static unsigned code_for(prov *pv, smtpe_event_type t)
{
    unsigned v = prov_u8(pv);
    if (v >= 248)
        return PICK(odd_codes, v);
    switch (t) {
    case SMTPE_EV_HELO: return PICK(helo_codes, v);
    case SMTPE_EV_MAIL: return PICK(mail_codes, v);
    case SMTPE_EV_RCPT: return PICK(rcpt_codes, v);
    case SMTPE_EV_DATA: return PICK(data_codes, v);
    case SMTPE_EV_DATA_END: return PICK(end_codes, v);
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: return PICK(vrfy_codes, v);
    default: return PICK(unknown_codes, v);
    }
}

static uint64_t advance_for(prov *pv, const smtpe_server_config *cfg)
{
    uint64_t cmd = cfg->command_timeout_ms ? cfg->command_timeout_ms : 1000000000u;
    uint64_t dat = cfg->data_timeout_ms ? cfg->data_timeout_ms : 1000000000u;
    unsigned v = prov_u8(pv);
    if (v < 224)
        return 0;
    if (v < 238)
        return 1 + prov_u8(pv) * 4u;
    if (v < 244)
        return cmd - 1;
    if (v < 248)
        return cmd;
    if (v < 251)
        return dat - 1;
    if (v < 254)
        return dat;
    return 1000000000u;
}

static decision draw_decision(prov *pv, smtpe_event_type t, int needs_reply,
                              const smtpe_server_config *cfg)
{
    decision d;
    memset(&d, 0, sizeof d);
    d.kind = K_NONE;
    if (needs_reply) {
        unsigned b = prov_u8(pv);
        d.defer = (b & 3) == 3 ? 1 + (b >> 2) % 4 : 0;
        unsigned v = prov_u8(pv);
        if (v < 170) {
            d.kind = K_ACCEPT;
        } else if (v < 250) {
            d.kind = K_REPLY;
            d.code = code_for(pv, t);
            d.enhanced = enhanced_for(pv, d.code);
            d.text = PICK(texts, prov_u8(pv));
        } else {
            d.kind = K_CLOSE;
            d.code = PICK(close_codes, prov_u8(pv));
            d.enhanced = enhanced_for(pv, d.code);
            d.text = PICK(texts, prov_u8(pv) % 6);
        }
    }
    d.advance = advance_for(pv, cfg);
    return d;
}

/* ------------------------------------------------------------------------------------------ */
/* A counting allocator: oracle (d).                                                            */

typedef struct acount {
    size_t allocs, frees, size;
    void *ptr;
    int fail;
} acount;

static void *count_alloc(size_t n, void *ud)
{
    acount *a = ud;
    a->allocs++;
    if (a->fail)
        return NULL;
    a->size = n;
    a->ptr = malloc(n);
    return a->ptr;
}

static void count_free(void *p, void *ud)
{
    acount *a = ud;
    a->frees++;
    FUZZ_CHECK(p == a->ptr, "smtpe_server_free released a block it did not allocate");
    free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* One input: the config, the client octets, the recorded decisions.                           */

typedef struct fcase {
    smtpe_server_config cfg;
    const uint8_t *client;
    size_t client_len;
    uint64_t t0;
    prov pv;
    decision *dec;
    size_t ndec, capdec;
} fcase;

/* One run of the session over the case. */
typedef struct run {
    fcase *c;
    int split;
    smtpe_server *s;
    const uint8_t *mem; /* the session's memory block */
    size_t memsize;
    const uint8_t *whole; /* whole run: one heap copy of all client octets */
    uint8_t *feed;        /* split run: heap copy of exactly the octets of the last recv */
    size_t feed_len;
    size_t avail;         /* client octets the host has read so far */
    size_t consumed;      /* client octets the engine consumed */
    uint64_t now;
    fz_buf out;     /* every octet sent */
    fz_buf log;     /* the event log */
    fz_buf msg;     /* content of the current message (chunks since the DATA event) */
    size_t logged;  /* octets of msg already in the log */
    size_t acked;
    size_t k;       /* decisions used */
    int verdict_pending;
    unsigned defer_left;
    size_t data_start; /* consumed offset at the DATA event */
} run;

static const decision *decision_at(run *r, size_t k, smtpe_event_type t, int needs_reply)
{
    fcase *c = r->c;
    static const decision none = {K_ACCEPT, 0, NULL, NULL, 0, 0};
    if (!r->split)
        return k < c->ndec ? &c->dec[k] : &none;
    if (k == c->ndec) {
        if (c->ndec == c->capdec) {
            c->capdec = c->capdec ? 2 * c->capdec : 32;
            c->dec = realloc(c->dec, c->capdec * sizeof *c->dec);
            if (!c->dec)
                abort();
        }
        c->dec[c->ndec++] = draw_decision(&c->pv, t, needs_reply, &c->cfg);
    }
    return &c->dec[k];
}

static void check_want(run *r)
{
    unsigned w = smtpe_server_want(r->s);
    size_t len = 99;
    (void)smtpe_server_send_buf(r->s, &len);
    FUZZ_CHECK(!!(w & SMTPE_WANT_WRITE) == (len > 0), "SMTPE_WANT_WRITE disagrees with send_buf");
    FUZZ_CHECK(!!(w & SMTPE_WANT_VERDICT) == r->verdict_pending,
               "SMTPE_WANT_VERDICT disagrees with the event that waits for a verdict");
}

/* Tells the engine the time, as a host does whenever expiry() is due (oracle (e)): it expires
 * only at or after the deadline expiry() gave, and when it does not, the deadline is later than
 * now (the engine may restart the timer from this clock after a verdict). */
static void expiry_check(run *r)
{
    uint64_t e = smtpe_server_expiry(r->s);
    int x = smtpe_server_handle_expiry(r->s, r->now);
    FUZZ_CHECK(x == 0 || x == 1, "handle_expiry returned neither 0 nor 1");
    if (x) {
        FUZZ_CHECK(e != UINT64_MAX && r->now >= e, "handle_expiry expired before the deadline");
        unsigned w = smtpe_server_want(r->s);
        FUZZ_CHECK((w & SMTPE_WANT_EVENT) && (w & SMTPE_WANT_CLOSE),
                   "after a timeout the session must have an event and want to close");
    } else {
        uint64_t e2 = smtpe_server_expiry(r->s);
        FUZZ_CHECK(e2 > r->now, "handle_expiry did not expire although expiry() is due");
    }
    TRACE("[%s] now=%llu expiry=%llu handle_expiry=%d\n", r->split ? "split" : "whole",
          (unsigned long long)r->now, (unsigned long long)e, x);
    fz_put_u8(&r->log, 'X');
    fz_put_u8(&r->log, (unsigned)x);
}

/* After event k has been handled the host looks at the clock, then time passes. */
static void after_event(run *r, const decision *d)
{
    expiry_check(r);
    if (d->advance) {
        r->now += d->advance;
        expiry_check(r);
    }
}

static void flush_chunks(run *r)
{
    if (r->msg.len > r->logged) {
        smtpe_span s = {r->msg.p + r->logged, r->msg.len - r->logged};
        fz_put_u8(&r->log, 'C');
        fz_put_span(&r->log, s);
        r->logged = r->msg.len;
    }
}

static void log_path(run *r, const smtpe_path *pa)
{
    fz_check_path(pa, r->mem, r->memsize);
    fz_put_span(&r->log, pa->mailbox);
    fz_put_span(&r->log, pa->local_part);
    fz_put_span(&r->log, pa->domain);
    fz_put_u64(&r->log, pa->flags);
}

static void log_params(run *r, const smtpe_param *p, size_t n)
{
    FUZZ_CHECK(n <= SMTPE_MAX_PARAMS, "more parameters than SMTPE_MAX_PARAMS");
    fz_put_u64(&r->log, n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(fz_within(p[i].keyword, r->mem, r->memsize) &&
                       fz_within(p[i].value, r->mem, r->memsize),
                   "parameter span outside session memory");
        FUZZ_CHECK(p[i].keyword.len > 0, "empty parameter keyword");
        fz_put_span(&r->log, p[i].keyword);
        fz_put_span(&r->log, p[i].value);
    }
}

static void check_content(run *r, const smtpe_event *ev)
{
    const fcase *c = r->c;
    const uint8_t *region = c->client + r->data_start;
    size_t n = r->consumed - r->data_start;
    const uint8_t *m = r->msg.p;
    size_t mlen = r->msg.len;

    if (ev->data_end.status == SMTPE_DATA_OK)
        FUZZ_CHECK(ev->data_end.size == mlen, "DATA_END size is not the octets delivered");
    else
        FUZZ_CHECK(ev->data_end.size >= mlen, "DATA_END size below the octets delivered");
    /* the DATA line's own line break counts only if it was a CRLF (under NORMALISE a bare
     * one ends the line but starts none) */
    int at_line_start = r->data_start >= 2 && c->client[r->data_start - 2] == '\r' &&
                        c->client[r->data_start - 1] == '\n';
    FUZZ_CHECK(fz_end_of_data_from(region, n, at_line_start) == (long)n,
               "content did not end exactly at the first CRLF.CRLF (smuggling oracle)");
    if (ev->data_end.status != SMTPE_DATA_OK)
        return;
    if (c->cfg.max_message_size)
        FUZZ_CHECK(mlen <= c->cfg.max_message_size, "content over max_message_size ended OK");
    FUZZ_CHECK(!!(ev->data_end.flags & SMTPE_DATA_HAS_8BIT) == fz_has_8bit(m, mlen),
               "HAS_8BIT flag disagrees with the content");
    if (c->cfg.line_ending == SMTPE_LINE_ENDING_KEEP)
        FUZZ_CHECK(!(ev->data_end.flags & SMTPE_DATA_NORMALISED), "NORMALISED under KEEP");
    if (ev->data_end.flags & SMTPE_DATA_NORMALISED)
        return;
    fz_buf ref = {0};
    fz_unstuff(&ref, region, n - 3);
    FUZZ_CHECK(fz_eq(ref.p, ref.len, m, mlen),
               "content is not the octets consumed for it dot-unstuffed (less the final .CRLF)");
    fz_free(&ref);
}

static int expected_needs_reply(const smtpe_event *ev)
{
    switch (ev->type) {
    case SMTPE_EV_HELO: case SMTPE_EV_MAIL: case SMTPE_EV_RCPT: case SMTPE_EV_DATA:
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: case SMTPE_EV_UNKNOWN:
        return 1;
    case SMTPE_EV_DATA_END:
        return ev->data_end.status == SMTPE_DATA_OK;
    default:
        return 0;
    }
}

static void take_chunk(run *r, const smtpe_event *ev)
{
    smtpe_span ch = ev->chunk;
    FUZZ_CHECK(ch.len > 0, "empty DATA_CHUNK");
    const uint8_t *fed = r->split ? r->feed : r->whole;
    size_t fed_len = r->split ? r->feed_len : r->c->client_len;
    if (!fz_within(ch, fed, fed_len))
        FUZZ_CHECK(fz_static_break(ch) &&
                       (r->c->cfg.line_ending != SMTPE_LINE_ENDING_REFUSE || ch.ptr[0] == '\r'),
                   "DATA_CHUNK span neither in the fed octets nor a static line break");
    TRACE("[%s] chunk %zu octets\n", r->split ? "split" : "whole", ch.len);
    fz_put(&r->msg, ch.ptr, ch.len);
}

static void take_event(run *r, const smtpe_event *ev)
{
    FUZZ_CHECK(ev->type > SMTPE_EV_NONE && ev->type <= SMTPE_EV_ERROR_LIMIT, "bad event type");
    int nr = smtpe_event_needs_reply(ev);
    FUZZ_CHECK(nr == expected_needs_reply(ev), "smtpe_event_needs_reply disagrees with smtpe.h");
    if (ev->type == SMTPE_EV_DATA_CHUNK) {
        take_chunk(r, ev);
        return;
    }
    flush_chunks(r);
    TRACE("[%s] event %d (k=%zu) consumed=%zu\n", r->split ? "split" : "whole", (int)ev->type,
          r->k + 1, r->consumed);
    fz_put_u8(&r->log, 'E');
    fz_put_u8(&r->log, (unsigned)ev->type);
    switch (ev->type) {
    case SMTPE_EV_HELO:
        FUZZ_CHECK(fz_within(ev->helo.domain, r->mem, r->memsize), "HELO span outside memory");
        fz_put_span(&r->log, ev->helo.domain);
        fz_put_u8(&r->log, (unsigned)ev->helo.esmtp);
        break;
    case SMTPE_EV_MAIL:
        log_path(r, &ev->mail.reverse_path);
        fz_put_u64(&r->log, ev->mail.size);
        fz_put_u64(&r->log, (uint64_t)ev->mail.has_size);
        fz_put_u64(&r->log, (uint64_t)ev->mail.body);
        fz_put_u64(&r->log, (uint64_t)ev->mail.smtputf8);
        log_params(r, ev->mail.params, ev->mail.param_count);
        if (ev->mail.has_size && r->c->cfg.max_message_size)
            FUZZ_CHECK(ev->mail.size <= r->c->cfg.max_message_size,
                       "MAIL with SIZE over max_message_size reached the host");
        break;
    case SMTPE_EV_RCPT:
        log_path(r, &ev->rcpt.forward_path);
        log_params(r, ev->rcpt.params, ev->rcpt.param_count);
        break;
    case SMTPE_EV_DATA:
        r->data_start = r->consumed;
        r->msg.len = 0;
        r->logged = 0;
        break;
    case SMTPE_EV_DATA_END:
        fz_put_u64(&r->log, ev->data_end.size);
        fz_put_u64(&r->log, (uint64_t)ev->data_end.status);
        fz_put_u64(&r->log, ev->data_end.flags);
        check_content(r, ev);
        break;
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: case SMTPE_EV_UNKNOWN:
        FUZZ_CHECK(fz_within(ev->command.verb, r->mem, r->memsize) &&
                       fz_within(ev->command.argument, r->mem, r->memsize),
                   "command span outside session memory");
        fz_put_span(&r->log, ev->command.verb);
        fz_put_span(&r->log, ev->command.argument);
        break;
    default:
        break;
    }
    r->k++;
    const decision *d = decision_at(r, r->k, ev->type, nr);
    if (nr) {
        r->verdict_pending = 1;
        r->defer_left = r->split ? d->defer : 0;
    } else {
        after_event(r, d);
    }
}

static int send_output(run *r, int all);

static void give_verdict(run *r)
{
    const decision *d = decision_at(r, r->k, SMTPE_EV_NONE, 1);
    int rc = 0;
    if (d->kind == K_REPLY)
        rc = smtpe_server_reply(r->s, d->code, d->enhanced, d->text);
    else if (d->kind == K_CLOSE) {
        /* A close before any octet was sent replaces the greeting: that depends on the
         * host's writes, not on the input, so both runs have sent the greeting by now. */
        if (r->acked == 0)
            send_output(r, 1);
        rc = smtpe_server_close(r->s, d->code, d->enhanced, d->text);
    }
    FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_INVALID_ARGUMENT || rc == SMTPE_ERR_REPLY_TOO_LONG,
               "reply/close returned an error other than INVALID_ARGUMENT/REPLY_TOO_LONG");
    TRACE("[%s] verdict kind=%d code=%u enh=%s -> %d\n", r->split ? "split" : "whole", d->kind,
          d->code, d->enhanced ? d->enhanced : "-", rc);
    fz_put_u8(&r->log, 'V');
    fz_put_u64(&r->log, (uint64_t)(int64_t)rc);
    if (d->kind == K_ACCEPT || rc < 0) {
        rc = smtpe_server_accept(r->s);
        FUZZ_CHECK(rc == 0, "smtpe_server_accept failed while a verdict was due");
    }
    r->verdict_pending = 0;
    FUZZ_CHECK(smtpe_server_accept(r->s) == SMTPE_ERR_STATE,
               "a second verdict for the same event was accepted");
    after_event(r, d);
}

/* Sends (part of) the queued output. Returns 1 if octets were acknowledged. */
static int send_output(run *r, int all)
{
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(r->s, &len);
    if (len == 0)
        return 0;
    FUZZ_CHECK(p != NULL, "send_buf returned NULL with a length");
    size_t n = len;
    if (!all) {
        unsigned v = prov_u8(&r->c->pv);
        switch (v & 7) {
        case 0: case 1: n = 0; break;
        case 2: n = 1; break;
        case 3: n = len > 1 ? len - 1 : len; break;
        case 4:
            FUZZ_CHECK(smtpe_server_send_ack(r->s, len + 1) == SMTPE_ERR_INVALID_ARGUMENT,
                       "send_ack accepted more than send_buf gave");
            n = (v >> 3) % (len + 1);
            break;
        default: n = (v >> 3) % (len + 1); break;
        }
    }
    fz_put(&r->out, p, n);
    FUZZ_CHECK(smtpe_server_send_ack(r->s, n) == 0, "send_ack of a valid count failed");
    r->acked += n;
    return n > 0;
}

/* Feeds the octets the host holds. Returns 1 if the engine consumed any or has an event. */
static int feed_input(run *r)
{
    size_t len = r->avail - r->consumed;
    if (len == 0)
        return 0;
    const uint8_t *p;
    if (r->split) {
        free(r->feed);
        r->feed = malloc(len);
        if (!r->feed)
            abort();
        memcpy(r->feed, r->c->client + r->consumed, len);
        r->feed_len = len;
        p = r->feed;
    } else {
        p = r->whole + r->consumed;
    }
    unsigned w = smtpe_server_want(r->s);
    size_t out_before;
    (void)smtpe_server_send_buf(r->s, &out_before);
    ssize_t n = smtpe_server_recv(r->s, p, len, r->now);
    size_t out_after;
    (void)smtpe_server_send_buf(r->s, &out_after);
    TRACE("[%s] recv(%zu) = %zd want=%#x\n", r->split ? "split" : "whole", len, n,
          smtpe_server_want(r->s));
    FUZZ_CHECK(n >= 0, "smtpe_server_recv returned an error for valid arguments");
    FUZZ_CHECK((size_t)n <= len, "smtpe_server_recv consumed more than len");
    if (r->verdict_pending)
        FUZZ_CHECK(n == 0, "smtpe_server_recv consumed input while a verdict was due");
    if (!(w & SMTPE_WANT_READ))
        FUZZ_CHECK(n == 0, "smtpe_server_recv consumed input without SMTPE_WANT_READ");
    else
        FUZZ_CHECK(n > 0 || (smtpe_server_want(r->s) & SMTPE_WANT_EVENT) ||
                       out_after > out_before,
                   "SMTPE_WANT_READ was set but recv neither consumed, made an event nor replied");
    r->consumed += (size_t)n;
    /* an event or a reply may come without an octet consumed: a held-back line break handed
     * out, or (NORMALISE) a line that an earlier bare CR ended answered */
    return n > 0 || (smtpe_server_want(r->s) & SMTPE_WANT_EVENT) || out_after > out_before;
}

/* The host's piece size when the split run reads more client octets. */
static size_t piece(run *r)
{
    unsigned v = prov_u8(&r->c->pv);
    size_t rest = r->c->client_len - r->avail, n;
    if (v < 96)
        n = 1 + v % 4;
    else if (v < 176)
        n = 1 + v % 24;
    else if (v < 232)
        n = 1 + (size_t)prov_u8(&r->c->pv) * 2;
    else
        n = rest;
    n = n < rest ? n : rest;
    TRACE("[split] host reads %zu more octets (%zu of %zu)\n", n, r->avail + n, r->c->client_len);
    return n;
}

static void drive(run *r)
{
    const fcase *c = r->c;
    size_t limit = 64 * (c->client_len + 64) + 10000;
    r->avail = r->split ? 0 : c->client_len;
    const decision *d0 = decision_at(r, 0, SMTPE_EV_NONE, 0);
    after_event(r, d0);
    for (size_t iter = 0;; iter++) {
        FUZZ_CHECK(iter < limit, "the session does not come to rest");
        int progress = 0;
        if (r->verdict_pending) {
            smtpe_event ev;
            FUZZ_CHECK(smtpe_server_next_event(r->s, &ev) == 0,
                       "an event came out while a verdict was due");
            check_want(r);
            if (r->defer_left > 0)
                r->defer_left--;
            else
                give_verdict(r);
            progress = 1;
        } else {
            unsigned w = smtpe_server_want(r->s);
            smtpe_event ev;
            memset(&ev, 0xA5, sizeof ev);
            int got = smtpe_server_next_event(r->s, &ev);
            FUZZ_CHECK(got == 0 || got == 1, "next_event returned neither 0 nor 1");
            FUZZ_CHECK(!!(w & SMTPE_WANT_EVENT) == got, "SMTPE_WANT_EVENT disagrees with next_event");
            if (got) {
                take_event(r, &ev);
                progress = 1;
            }
        }
        check_want(r);
        progress |= send_output(r, !r->split);
        if (r->split && r->avail < c->client_len && (prov_u8(&r->c->pv) & 3) == 0)
            r->avail += piece(r);
        if (!(smtpe_server_want(r->s) & SMTPE_WANT_EVENT))
            progress |= feed_input(r);
        if (progress)
            continue;
        if (r->avail < c->client_len)
            r->avail += r->split ? piece(r) : c->client_len - r->avail;
        else if (!send_output(r, 1))
            break;
    }
    flush_chunks(r);
}

/* Oracle (b) over everything the session sent. */
static void check_output(const uint8_t *p, size_t n)
{
    size_t i = 0;
    unsigned open = 0; /* code of an unfinished multi-line reply */
    while (i < n) {
        size_t j = i;
        while (j + 1 < n && !(p[j] == '\r' && p[j + 1] == '\n'))
            j++;
        FUZZ_CHECK(j + 1 < n, "output ends in a line without CRLF");
        size_t len = j + 2 - i;
        FUZZ_CHECK(len <= 512, "reply line longer than 512 octets");
        FUZZ_CHECK(len >= 6, "reply line too short for ^[2-5][0-9][0-9][ -]");
        FUZZ_CHECK(p[i] >= '2' && p[i] <= '5' && p[i + 1] >= '0' && p[i + 1] <= '9' &&
                       p[i + 2] >= '0' && p[i + 2] <= '9' && (p[i + 3] == ' ' || p[i + 3] == '-'),
                   "reply line does not match ^[2-5][0-9][0-9][ -]");
        for (size_t x = i; x < j; x++)
            FUZZ_CHECK((p[x] >= 0x20 && p[x] != 0x7f) || p[x] == '\t',
                       "control octet inside a reply line (RFC 5321 4.2: HT allowed)");
        unsigned code = (unsigned)(p[i] - '0') * 100 + (unsigned)(p[i + 1] - '0') * 10 +
                        (unsigned)(p[i + 2] - '0');
        if (open)
            FUZZ_CHECK(code == open, "multi-line reply changes its code");
        open = p[i + 3] == '-' ? code : 0;
        i = j + 2;
    }
    FUZZ_CHECK(open == 0, "output ends inside a multi-line reply");
}

static void finish(run *r)
{
    smtpe_server_stats st;
    smtpe_server_get_stats(r->s, &st);
    FUZZ_CHECK(st.octets_in == r->consumed, "stats octets_in is not the octets consumed");
    FUZZ_CHECK(st.octets_out == r->acked, "stats octets_out is not the octets acknowledged");
    fz_put_u8(&r->log, 'S');
    fz_put_u64(&r->log, st.octets_in);
    fz_put_u64(&r->log, st.octets_out);
    fz_put_u64(&r->log, st.commands);
    fz_put_u64(&r->log, st.errors);
    fz_put_u64(&r->log, st.transactions);
    fz_put_u64(&r->log, st.recipients);
    fz_put_u64(&r->log, r->consumed);
    unsigned w = smtpe_server_want(r->s);
    fz_put_u64(&r->log, w);
    FUZZ_CHECK(w & (SMTPE_WANT_READ | SMTPE_WANT_CLOSE),
               "the session at rest wants neither to read nor to close (a host would hang)");
    if (!(w & SMTPE_WANT_CLOSE))
        FUZZ_CHECK(r->consumed == r->c->client_len, "input left over in an open session");
    check_output(r->out.p, r->out.len);
}

static void run_free(run *r)
{
    fz_free(&r->out);
    fz_free(&r->log);
    fz_free(&r->msg);
    free(r->feed);
}

/* ------------------------------------------------------------------------------------------ */

static void make_config(fcase *c, const uint8_t *h)
{
    static const char *extra[] = {"AUTH PLAIN LOGIN", "DSN",
                                  "X-EXTRA-KEYWORD-WITH-A-LONG-ARGUMENT "
                                  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                  "aaaaaaaaaaaaaaa"};
    static char longhost[256];
    static const size_t rbuf[] = {2048, 2100, 3000, 4096, 65536};
    static const size_t lmax[] = {512, 513, 600, 1000, 4096};
    static const uint64_t t0[] = {0, 1000, (uint64_t)1 << 40};
    if (!longhost[0]) {
        memset(longhost, 'h', 255);
        for (int i = 63; i < 255; i += 64)
            longhost[i] = '.';
    }
    smtpe_server_config *cfg = &c->cfg;
    smtpe_server_config_init(cfg);
    cfg->hostname = "mx.example";
    cfg->line_ending = (smtpe_line_ending_policy)(h[0] % 3);
    cfg->lax_angle_brackets = h[1] & 1;
    if (h[1] & 2) {
        cfg->ehlo_extra = extra;
        cfg->ehlo_extra_count = 3;
    }
    if (h[1] & 4)
        cfg->hostname = longhost;
    if (h[1] & 8)
        cfg->greeting_text = "Service ready \xe2\x9c\x93";
    switch ((h[1] >> 4) & 3) {
    case 1: cfg->command_timeout_ms = 0; cfg->data_timeout_ms = 0; break;
    case 2: cfg->command_timeout_ms = 1000; cfg->data_timeout_ms = 1000; break;
    case 3: cfg->command_timeout_ms = 1000; cfg->data_timeout_ms = 0; break;
    default: break;
    }
    if (h[2] >= 64)
        cfg->max_message_size = (uint64_t)(h[2] - 64) * 8 + 1;
    else if (h[2] >= 32)
        cfg->max_message_size = 0;
    if (h[3] < 128)
        cfg->max_recipients = 1 + h[3] % 4;
    else if (h[3] >= 192)
        cfg->max_recipients = h[3];
    if (h[4] < 128)
        cfg->max_errors = h[4] % 6;
    cfg->extensions = h[5] & 0x1f;
    cfg->reply_buffer_size = rbuf[h[6] % 5];
    cfg->max_line_length = lmax[h[7] % 5];
    c->t0 = t0[h[14] % 3];
}

/* The creation paths and their errors; oracle (d) for the allocator-less ones. */
static void check_creation(const smtpe_server_config *cfg, size_t size)
{
    acount a;
    memset(&a, 0, sizeof a);
    a.fail = 1;
    smtpe_allocator al = {count_alloc, count_free, &a};
    smtpe_server *s = NULL;
    FUZZ_CHECK(smtpe_server_new(&s, cfg, &al, 0) == SMTPE_ERR_NOMEM,
               "smtpe_server_new did not report a failed allocation as NOMEM");
    FUZZ_CHECK(a.allocs == 1 && a.frees == 0, "a failed creation allocated more than once");
    uint8_t *mem = malloc(size);
    if (!mem)
        abort();
    FUZZ_CHECK(smtpe_server_init(&s, mem, size - 1, cfg, 0) == SMTPE_ERR_BUFFER_TOO_SMALL,
               "smtpe_server_init accepted memory one octet too small");
    free(mem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t h[HDR];
    memset(h, 0, sizeof h);
    memcpy(h, data, size < HDR ? size : HDR);
    size_t body = size > HDR ? size - HDR : 0;
    size_t dlen = (size_t)h[8] | (size_t)h[9] << 8;
    if (dlen > body)
        dlen = body;

    texts_init();
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    fcase c;
    memset(&c, 0, sizeof c);
    make_config(&c, h);
    c.client = data + HDR;
    c.client_len = body - dlen;
    c.pv.p = data + HDR + c.client_len;
    c.pv.n = dlen;
    c.pv.x = 0x9E3779B97F4A7C15ull ^ ((uint64_t)h[10] | (uint64_t)h[11] << 8 |
                                      (uint64_t)h[12] << 16 | (uint64_t)h[13] << 24);

    size_t memsize = smtpe_server_memory_size(&c.cfg);
    if (memsize == 0) {
        smtpe_server *s = NULL;
        FUZZ_CHECK(smtpe_server_new(&s, &c.cfg, NULL, 0) == SMTPE_ERR_CONFIG,
                   "memory_size said invalid config but smtpe_server_new did not");
        return 0;
    }
    check_creation(&c.cfg, memsize);

    /* run 1: split, smtpe_server_new with the counting allocator */
    acount a;
    memset(&a, 0, sizeof a);
    smtpe_allocator al = {count_alloc, count_free, &a};
    run r1;
    memset(&r1, 0, sizeof r1);
    r1.c = &c;
    r1.split = 1;
    r1.now = c.t0;
    FUZZ_CHECK(smtpe_server_new(&r1.s, &c.cfg, &al, c.t0) == 0, "smtpe_server_new failed");
    FUZZ_CHECK(a.allocs == 1 && a.size == memsize,
               "creation did not make exactly one allocation of smtpe_server_memory_size");
    r1.mem = a.ptr;
    r1.memsize = memsize;
    drive(&r1);
    finish(&r1);
    FUZZ_CHECK(a.allocs == 1 && a.frees == 0, "the session allocated or freed after creation");
    smtpe_server_free(r1.s);
    FUZZ_CHECK(a.frees == 1, "smtpe_server_free did not release the session's block");

    /* run 2: whole, smtpe_server_init in caller memory */
    run r2;
    memset(&r2, 0, sizeof r2);
    r2.c = &c;
    r2.split = 0;
    r2.now = c.t0;
    uint8_t *mem = malloc(memsize);
    uint8_t *whole = malloc(c.client_len ? c.client_len : 1);
    if (!mem || !whole)
        abort();
    memcpy(whole, c.client, c.client_len);
    r2.whole = whole;
    FUZZ_CHECK(smtpe_server_init(&r2.s, mem, memsize, &c.cfg, c.t0) == 0,
               "smtpe_server_init failed with memory_size octets");
    r2.mem = mem;
    r2.memsize = memsize;
    drive(&r2);
    finish(&r2);

    /* oracle (a) */
    if (!fz_eq(r1.out.p, r1.out.len, r2.out.p, r2.out.len)) {
        fprintf(stderr, "--- output, split run (%zu octets):\n%.*s\n--- output, whole run "
                        "(%zu octets):\n%.*s\n",
                r1.out.len, (int)r1.out.len, (const char *)r1.out.p, r2.out.len,
                (int)r2.out.len, (const char *)r2.out.p);
        FUZZ_CHECK(0, "split invariance: the output octets differ between split and whole");
    }
    FUZZ_CHECK(fz_eq(r1.log.p, r1.log.len, r2.log.p, r2.log.len),
               "split invariance: the event log differs between split and whole");

    run_free(&r1);
    run_free(&r2);
    free(mem);
    free(whole);
    free(c.dec);
    return 0;
}
