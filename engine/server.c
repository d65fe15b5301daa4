/* server.c - the SMTP server session state machine.
 *
 * RFC 5321 §3 (transactions), §4.1 (commands), §4.2 (replies), §4.3.2 (sequencing),
 * §4.5.3 (limits and timeouts); RFC 1870 (SIZE), RFC 6152 (8BITMIME), RFC 2920 (PIPELINING),
 * RFC 2034 / RFC 3463 (enhanced status codes), RFC 6531 (SMTPUTF8), RFC 3207 (STARTTLS),
 * RFC 4954 (AUTH), RFC 3030 (CHUNKING, BINARYMIME), RFC 3461 (DSN), RFC 2033 (LMTP),
 * RFC 8689 (REQUIRETLS), RFC 6710 (MT-PRIORITY), RFC 2852 (DELIVERBY), the PROXY protocol and
 * Postfix's XCLIENT / XFORWARD.
 *
 * One event at a time: the engine stops consuming input as soon as it has an event for the
 * host to take, and while a verdict is owed (with max_pending_verdicts above 1: while one is
 * owed for anything but the MAIL and RCPTs of a pipelined batch), so every span it hands out
 * stays valid as documented and the host never re-enters the engine from a callback.
 *
 * Replies leave in command order (RFC 2920 §3.1) through the queue of commands whose reply is
 * owed (held[]): the oldest one's reply goes to the output at once; a later one's reply (a
 * verdict given out of order, or the engine's own answer to a pipelined RCPT) waits in that
 * command's line buffer until every earlier reply has gone out. The output is a ring whose
 * octets never move once queued (stable output: the host may write them asynchronously). */
#include "address.h"
#include "command.h"
#include "data.h"
#include "proxy.h"
#include "reply.h"
#include "sasl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLOSE_RESERVE 600 /* room always kept for one final 421 / 221 line */
#define HOST_TEXT_MAX 320 /* hostname (<= 255) plus a short phrase */

enum {
    MODE_COMMAND,   /* command lines (or SASL responses while auth is not AUTH_NONE) */
    MODE_DATA,      /* DATA content up to CRLF.CRLF */
    MODE_BDAT,      /* the octets of an accepted BDAT chunk */
    MODE_BDAT_SKIP, /* the octets of a refused BDAT chunk, swallowed before its reply */
    MODE_TLS_WAIT,  /* STARTTLS accepted: input is discarded until TLS is up */
    MODE_PROXY      /* reading the PROXY header */
};
/* Where an AUTH exchange stands. */
enum { AUTH_NONE, AUTH_PLAIN_WAIT, AUTH_LOGIN_USER, AUTH_LOGIN_PASS, AUTH_OTHER, AUTH_OTHER_WAIT };
#define AUTH_USER_MAX 255  /* LOGIN user name kept between its two lines */
#define AUTH_MECH_MAX 20   /* RFC 4422 §3.1 */
#define LMTP_REPLY_ROOM 512 /* octets reserved per recipient for LMTP's per-recipient replies */
#define LMTP_RCPT_MAX 100000 /* max_recipients under LMTP (51 MB of reply room) */
#define PENDING_MAX 1024    /* max_pending_verdicts */
enum { HELO_NONE, HELO_SMTP, HELO_ESMTP };

/* A command whose reply is owed, in the queue of replies in command order. */
typedef struct held {
    uint64_t id;           /* its event's id; 0 for a reply the engine gave itself */
    smtpe_event_type type; /* the event waiting for its verdict; SMTPE_EV_NONE: reply held */
    unsigned code;         /* the held reply's code */
    uint16_t len;          /* the held reply's octets, at the start of its line buffer */
    uint16_t buf;          /* its line buffer */
    uint8_t kind;          /* what the command was: KIND_* */
    uint8_t smtputf8;      /* MAIL: its transaction's SMTPUTF8 and BODY=BINARYMIME */
    uint8_t binarymime;
} held;
enum { KIND_OTHER, KIND_MAIL, KIND_RCPT };

/* What a line buffer holds. */
enum {
    BUF_FREE,   /* nothing: the next command line may go there */
    BUF_EVENT,  /* the line of an event whose verdict is owed (its spans point there) */
    BUF_HELD,   /* a reply waiting for its turn */
    BUF_VOID,   /* the line of a RCPT voided by its MAIL's refusal, whose verdict is owed */
    BUF_PARKED  /* a command line read but not executed until the queue is empty */
};
typedef struct linebuf {
    uint64_t id; /* BUF_EVENT, BUF_VOID: the event's id */
    int use;     /* BUF_* */
} linebuf;

struct smtpe_server {
    const smtpe_server_config *cfg;
    smtpe_allocator alloc;
    int owned;                   /* allocated by smtpe_server_new */
    int helo;                    /* HELO_* */
    int mode;                    /* MODE_* */
    int closing;                 /* a final reply is queued; no more input */
    int in_transaction;          /* MAIL accepted */
    int smtputf8;                /* the transaction's MAIL carried SMTPUTF8 */
    int binarymime;              /* the transaction's MAIL carried BODY=BINARYMIME */
    int bdat_started;            /* the transaction has had a BDAT chunk */
    unsigned rcpts;              /* recipients accepted in this transaction */
    int tls;                     /* TLS is up */
    int trusted;                 /* XCLIENT / XFORWARD allowed */
    int authenticated;
    int auth;                    /* AUTH_* */
    int auth_mech_id;            /* SMTPE_SASL_* of the exchange */
    unsigned auth_step;
    size_t auth_mech_len, auth_user_len;
    uint8_t auth_mech[AUTH_MECH_MAX];
    uint8_t auth_user[AUTH_USER_MAX];
    uint64_t bdat_left;          /* octets of the current chunk still to come */
    uint64_t bdat_size;          /* the current chunk's size */
    int bdat_last;               /* the current chunk has LAST */
    int bdat_first;              /* the current chunk is the transaction's first */
    int bdat_ending;             /* the chunk is complete; its end is due once the host has
                                    taken the last DATA_CHUNK */
    unsigned skip_code;          /* the reply owed for a swallowed chunk */
    const char *skip_enhanced, *skip_text;
    unsigned lmtp_left;          /* LMTP: DATA_END verdicts still owed */
    smtpe__proxy proxy;
    int event_ready;             /* ev holds an event not yet taken */
    int abandon;                 /* the next event ends an open transaction (ev.abandoned) */
    int timer_restart;           /* a verdict came: restart the timer at the next clock */
    int parked;                  /* line holds a command to execute once the queue is empty */
    uint64_t events;             /* ids given so far */
    smtpe_event ev;
    smtpe__line line;            /* the command line being read, in bufs[cur] */
    smtpe__data data;
    /* Commands whose reply is owed, oldest first: held[(q_head + i) % npend], i < q_len. */
    held *held;
    unsigned npend, q_head, q_len;
    unsigned q_rcpts;            /* RCPTs in the queue that may yet be accepted */
    unsigned owed;               /* verdicts owed for events taken (voided RCPTs' included) */
    unsigned owed_void;          /* of those, for voided RCPTs (BUF_VOID buffers) */
    /* Line buffers, npend of buf_size octets; the command line being read is in cur. */
    linebuf *lbuf;
    uint8_t *bufs;
    size_t buf_size;
    unsigned cur;
    unsigned nfree;              /* BUF_FREE line buffers */
    /* Output ring of out_cap octets: run A out[a_off..a_end) goes out first, then run B
     * out[0..b_end) (b_end > 0 only once a reply did not fit after A). send_buf hands out A;
     * when A is all acknowledged, B becomes A. Queued octets never move. */
    uint8_t *out;
    size_t out_cap, a_off, a_end, b_end;
    int out_lent;                /* send_buf has handed out octets */
    size_t reserve;              /* room a command's reply may need */
    uint64_t last_activity;      /* ms */
    smtpe_server_stats stats;
    smtpe_server_config cfg_copy; /* cfg points here */
};

/* ------------------------------------------------------------------------------------------
 * Configuration and memory
 * ---------------------------------------------------------------------------------------- */

/* The size of each layout of the versioned structs, by version (smtpe.h, "Versions and ABI").
 * When a version adds fields, the entries before it become offsetof(<struct>, <its first new
 * field>). LAYOUT_SIZE gives a version's size, 0 for a version this library does not know. */
static const size_t config_sizes[] = {0, sizeof(smtpe_server_config)};
static const size_t event_sizes[] = {0, sizeof(smtpe_event)};
static const size_t stats_sizes[] = {0, sizeof(smtpe_server_stats)};
#define LAYOUT_SIZE(sizes, v)                                                                   \
    ((v) >= 1 && (size_t)(v) < sizeof sizes / sizeof *sizes ? sizes[v] : 0)

static void config_defaults(smtpe_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->hostname = "localhost";
    cfg->greeting_text = "ESMTP smtpe";
    cfg->extensions = SMTPE_EXT_DEFAULT;
    cfg->max_message_size = 10485760;
    cfg->max_line_length = 512;
    cfg->max_recipients = 100;
    cfg->max_errors = 20;
    cfg->command_timeout_ms = 300000;
    cfg->data_timeout_ms = 180000;
    cfg->line_ending = SMTPE_LINE_ENDING_REFUSE;
    cfg->reply_buffer_size = 4096;
    cfg->max_pending_verdicts = 1;
}

void smtpe_server_config_init_versioned(int config_version, smtpe_server_config *cfg)
{
    smtpe_server_config d;
    size_t size = LAYOUT_SIZE(config_sizes, config_version);
    if (!cfg || size == 0)
        return;
    config_defaults(&d);
    memcpy(cfg, &d, size);
}

/* The caller's config, laid out as config_version says, as the latest layout: the fields its
 * version lacks take their defaults. Returns 0 if the version is unknown. */
static int config_latest(int config_version, const smtpe_server_config *cfg,
                         smtpe_server_config *out)
{
    size_t size = LAYOUT_SIZE(config_sizes, config_version);
    if (size == 0)
        return 0;
    config_defaults(out);
    memcpy(out, cfg, size);
    return 1;
}

static int printable(const char *t, size_t max)
{
    size_t n = 0;
    for (; t[n]; n++)
        if ((unsigned char)t[n] < 0x20 || t[n] == 0x7f || n >= max)
            return 0;
    return 1;
}

static int is_mech_char(char ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
}

/* auth_mechanisms: names of 1..20 of A-Z 0-9 - _ separated by single spaces, 200 octets at
 * most (RFC 4422 §3.1). */
static int mechanisms_valid(const char *m)
{
    size_t run = 0, n = 0;
    for (; m[n]; n++) {
        if (m[n] == ' ') {
            if (run == 0)
                return 0;
            run = 0;
        } else if (!is_mech_char(m[n]) || ++run > AUTH_MECH_MAX) {
            return 0;
        }
    }
    return run > 0 && n <= 200;
}

static int config_valid(const smtpe_server_config *c)
{
    if (!c->hostname || !c->hostname[0] || !printable(c->hostname, 255) || !c->greeting_text ||
        !printable(c->greeting_text, 200))
        return 0;
    if (c->auth_mechanisms && !mechanisms_valid(c->auth_mechanisms))
        return 0;
    if (c->max_line_length < 512 || c->max_line_length > 65536 || c->max_recipients == 0 ||
        (c->lmtp && c->max_recipients > LMTP_RCPT_MAX) ||
        c->reply_buffer_size < 2048 || c->reply_buffer_size > 1048576 ||
        (unsigned)c->line_ending > SMTPE_LINE_ENDING_KEEP || c->ehlo_extra_count > 64 ||
        (c->ehlo_extra_count && !c->ehlo_extra) || c->max_pending_verdicts == 0 ||
        c->max_pending_verdicts > PENDING_MAX)
        return 0;
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        if (!c->ehlo_extra[i] || !c->ehlo_extra[i][0] || !printable(c->ehlo_extra[i], 120))
            return 0;
    return 1;
}

/* Upper bound of the EHLO reply in octets. */
static size_t ehlo_size(const smtpe_server_config *c)
{
    /* the first line (host text up to 400 octets) and the built-in keyword lines */
    size_t n = 1100 + (c->auth_mechanisms ? strlen(c->auth_mechanisms) : 0);
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        n += 6 + strlen(c->ehlo_extra[i]);
    return n;
}

/* Where the parts of a session go in its one allocation: the struct, the queue, the line
 * buffers' bookkeeping, the line buffers, the output ring (smtpe_server_memory_size). */
typedef struct layout {
    size_t head, held, lbuf, line_cap, buf_size, bufs, out_cap, reserve, total;
} layout;

static int layout_of(const smtpe_server_config *c, layout *l)
{
    const size_t align = sizeof(max_align_t);
    size_t n;
    if (!c || !config_valid(c))
        return 0;
    n = c->max_pending_verdicts;
    l->head = (sizeof(struct smtpe_server) + align - 1) / align * align;
    l->held = l->head;
    l->lbuf = l->held + n * sizeof(held);
    l->bufs = l->lbuf + n * sizeof(linebuf);
    l->line_cap = c->max_line_length - 2;
    /* a held verdict's reply waits in its command's line buffer: one reply line fits */
    l->buf_size = n > 1 && l->line_cap < SMTPE__REPLY_LINE_MAX ? SMTPE__REPLY_LINE_MAX
                                                              : l->line_cap;
    l->reserve = ehlo_size(c);
    if (l->reserve < SMTPE__REPLY_TOTAL_MAX + 512)
        l->reserve = SMTPE__REPLY_TOTAL_MAX + 512;
    l->out_cap = c->reply_buffer_size;
    if (l->out_cap < l->reserve + CLOSE_RESERVE)
        l->out_cap = l->reserve + CLOSE_RESERVE;
    l->out_cap += (n - 1) * l->buf_size; /* the replies of the other held commands */
    if (c->lmtp) /* room for one reply per recipient after the content (RFC 2033 §4.2) */
        l->out_cap += (size_t)c->max_recipients * LMTP_REPLY_ROOM;
    l->total = l->bufs + n * l->buf_size + l->out_cap;
    return 1;
}

size_t smtpe_server_memory_size_versioned(int config_version, const smtpe_server_config *cfg)
{
    smtpe_server_config c;
    layout l;
    if (!cfg || !config_latest(config_version, cfg, &c))
        return 0;
    return layout_of(&c, &l) ? l.total : 0;
}

/* ------------------------------------------------------------------------------------------
 * Output
 * ---------------------------------------------------------------------------------------- */

/* The two places the next output may go, with their room: after run A (or, once it exists,
 * after run B, which then takes every write until A is sent), and at the start of the ring as
 * run B (the second place, 0 octets when there is none). Unless final, CLOSE_RESERVE octets are
 * kept free where a later write can go, so that a final 421/221 always fits: after the write,
 * or before A. */
typedef struct out_room {
    size_t at, room, room_b;
} out_room;

static inline out_room out_rooms(const smtpe_server *s, int final)
{
    size_t keep = final ? 0 : CLOSE_RESERVE;
    out_room r = {s->a_end, s->out_cap - s->a_end, 0};
    if (s->b_end > 0) {
        r.at = s->b_end;
        r.room = s->a_off - s->b_end > keep ? s->a_off - s->b_end - keep : 0;
        return r;
    }
    if (keep > s->a_off) /* the reserve cannot stay before A: it stays after the write */
        r.room = r.room > keep ? r.room - keep : 0;
    if (s->a_end > 0 && s->a_off > keep)
        r.room_b = s->a_off - keep;
    return r;
}

/* Records n octets written at the first place (b 0) or the second (b 1) of out_rooms. */
static void out_commit(smtpe_server *s, int b, size_t n)
{
    if (b)
        s->b_end = n;
    else if (s->b_end > 0)
        s->b_end += n;
    else
        s->a_end += n;
}

/* Whether n octets of output fit now. */
static int out_fits(const smtpe_server *s, size_t n, int final)
{
    out_room r = out_rooms(s, final);
    return n <= r.room || (n > 0 && n <= r.room_b);
}

/* Takes n octets of output room. Returns where they go, or NULL if they do not fit: the caller
 * then writes exactly n octets there. */
static uint8_t *out_take(smtpe_server *s, size_t n, int final)
{
    out_room r = out_rooms(s, final);
    if (n <= r.room) {
        out_commit(s, 0, n);
        return s->out + r.at;
    }
    if (n > 0 && n <= r.room_b) {
        out_commit(s, 1, n);
        return s->out;
    }
    return NULL;
}

/* Formats output with fmt (which writes into buf[0..cap) and returns the octets written, or 0
 * if they do not fit) at the first place of out_rooms, else at the second (a failed try only
 * wrote into free room). Returns 0 or SMTPE_ERR_REPLY_TOO_LONG. */
typedef size_t (*out_format)(uint8_t *buf, size_t cap, const void *arg);

static inline int out_put(smtpe_server *s, int final, out_format fmt, const void *arg)
{
    out_room r = out_rooms(s, final);
    size_t n = r.room ? fmt(s->out + r.at, r.room, arg) : 0;
    if (n == 0 && r.room_b > 0 && (n = fmt(s->out, r.room_b, arg)) > 0) {
        out_commit(s, 1, n);
        return 0;
    }
    if (n == 0)
        return SMTPE_ERR_REPLY_TOO_LONG;
    out_commit(s, 0, n);
    return 0;
}

static size_t out_pending(const smtpe_server *s)
{
    return s->a_end - s->a_off + s->b_end;
}

static const char *enhanced_for(const smtpe_server *s, unsigned code, const char *enhanced)
{
    if (!(s->cfg->extensions & SMTPE_EXT_ENHANCEDSTATUSCODES) || code / 100 == 3)
        return NULL;
    return enhanced;
}

/* A reply for out_put: smtpe__reply_format's arguments. */
typedef struct reply_args {
    unsigned code;
    const char *enhanced, *text;
    size_t len;
} reply_args;

static size_t format_reply(uint8_t *buf, size_t cap, const void *arg)
{
    const reply_args *a = arg;
    return smtpe__reply_format(buf, cap, a->code, a->enhanced, a->text, a->len);
}

/* Queues a reply; final replies may use the close reserve. Returns 0 or
 * SMTPE_ERR_REPLY_TOO_LONG. */
static int out_reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text,
                     size_t len, int final)
{
    reply_args a = {code, enhanced_for(s, code, enhanced), text, len};
    return out_put(s, final, format_reply, &a);
}

/* "<hostname> <phrase>" into buf (HOST_TEXT_MAX octets). Returns its length. */
static size_t host_text(const smtpe_server *s, char *buf, const char *phrase)
{
    int n = snprintf(buf, HOST_TEXT_MAX, "%s %s", s->cfg->hostname, phrase);
    return n < 0 ? 0 : (size_t)n >= HOST_TEXT_MAX ? HOST_TEXT_MAX - 1 : (size_t)n;
}

/* ------------------------------------------------------------------------------------------
 * The queue of owed replies (RFC 2920 §3.1) and the line buffers
 * ---------------------------------------------------------------------------------------- */

static held *q_at(const smtpe_server *s, unsigned i)
{
    unsigned at = s->q_head + i; /* both below npend: no division on this path */
    return &s->held[at < s->npend ? at : at - s->npend];
}

/* Whether a queued command counts against max_recipients: a RCPT waiting for its verdict or
 * accepted by a verdict held for its turn. */
static int q_counted(const held *q)
{
    return q->kind == KIND_RCPT && (q->type != SMTPE_EV_NONE || q->code / 100 == 2);
}

static held *q_push(smtpe_server *s, unsigned kind)
{
    held *h = q_at(s, s->q_len);
    memset(h, 0, sizeof *h);
    h->buf = (uint16_t)s->cur;
    h->kind = (uint8_t)kind;
    s->q_len++;
    return h;
}

static void q_pop(smtpe_server *s)
{
    s->q_rcpts -= (unsigned)q_counted(q_at(s, 0));
    s->q_head = s->q_head + 1 < s->npend ? s->q_head + 1 : 0;
    s->q_len--;
}

static uint8_t *buf_at(const smtpe_server *s, unsigned i)
{
    return s->bufs + (size_t)i * s->buf_size;
}

static void buf_set(smtpe_server *s, unsigned i, int use, uint64_t id)
{
    s->nfree += (unsigned)(use == BUF_FREE) - (unsigned)(s->lbuf[i].use == BUF_FREE);
    s->lbuf[i].use = use;
    s->lbuf[i].id = id;
}

/* The event's kind, for the queue. */
static unsigned kind_of(smtpe_event_type type)
{
    return type == SMTPE_EV_MAIL ? KIND_MAIL : type == SMTPE_EV_RCPT ? KIND_RCPT : KIND_OTHER;
}

/* Makes ev the event to take; one that needs a verdict joins the queue, its spans in the
 * current line buffer. */
static void raise_event(smtpe_server *s, smtpe_event_type type)
{
    s->ev.type = type;
    s->event_ready = 1;
    if (type == SMTPE_EV_DATA_CHUNK)
        return; /* the hot path: no id, no verdict */
    s->ev.id = ++s->events;
    s->ev.abandoned = s->abandon;
    s->abandon = 0;
    if (smtpe_event_needs_reply(&s->ev)) {
        held *q = q_push(s, kind_of(type));
        q->id = s->ev.id;
        q->type = type;
        s->q_rcpts += (unsigned)q_counted(q);
        buf_set(s, s->cur, BUF_EVENT, s->ev.id);
    }
}

static void auth_end(smtpe_server *s);

/* Forgets every verdict still owed (the session is closing): calls for them get
 * SMTPE_ERR_STATE, and an event not taken yet is dropped. */
static void drop_owed(smtpe_server *s)
{
    for (unsigned i = 0; i < s->npend; i++)
        buf_set(s, i, BUF_FREE, 0);
    s->q_len = 0;
    s->q_rcpts = 0;
    s->owed = s->owed_void = 0;
    s->parked = 0;
    s->event_ready = 0;
}

/* Queues the final reply "code enhanced <hostname> phrase" and starts closing. */
static void close_with(smtpe_server *s, unsigned code, const char *enhanced, const char *phrase)
{
    char buf[HOST_TEXT_MAX];
    (void)out_reply(s, code, enhanced, buf, host_text(s, buf, phrase), 1);
    s->closing = 1;
    drop_owed(s);
    if (s->auth != AUTH_NONE)
        auth_end(s); /* a closing session keeps no credentials */
}

static int is_error_code(unsigned code)
{
    return (code >= 500 && code <= 504) || code == 555 || code == 535;
}

/* Ends the transaction if one is open (MAIL accepted). Returns whether one was. */
static int end_transaction(smtpe_server *s);

/* Counts a reply of code against max_errors (RFC 5321 §4.2.2 500-504, RFC 1869 555, RFC 4954
 * 535) as it takes its place in the output: past the limit the session closes with 421 4.7.0
 * instead. Returns 1 if it closed. */
static int error_limit(smtpe_server *s, unsigned code)
{
    if (!is_error_code(code) || ++s->stats.errors <= s->cfg->max_errors || !s->cfg->max_errors)
        return 0;
    s->abandon = end_transaction(s);
    close_with(s, 421, "4.7.0", "Too many errors");
    raise_event(s, SMTPE_EV_ERROR_LIMIT);
    return 1;
}

/* Queues a reply in the output now, counting errors. */
static int emit(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    if (error_limit(s, code))
        return 0;
    return out_reply(s, code, enhanced, text, strlen(text), 0);
}

/* The engine's own reply to a pipelined RCPT read while earlier replies are owed: it waits in
 * the line's buffer (whose octets are no longer needed) for its turn. */
static size_t held_format(smtpe_server *s, unsigned b, int write, unsigned code,
                          const char *enhanced, const char *text);

static int hold_reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    size_t n = held_format(s, s->cur, 1, code, enhanced, text);
    held *q;
    if (n == 0)
        return SMTPE_ERR_REPLY_TOO_LONG;
    q = q_push(s, KIND_RCPT);
    q->code = code;
    q->len = (uint16_t)n;
    buf_set(s, s->cur, BUF_HELD, 0);
    return 0;
}

/* The engine's reply to the command line being handled: out now, or in its turn. */
static int reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    return s->q_len > 0 ? hold_reply(s, code, enhanced, text) : emit(s, code, enhanced, text);
}

/* Whether there is reply room to consume more input: one reply's worth and one held command's
 * for each reply still owed, and under LMTP, while content streams, one line per recipient for
 * the replies its end will take (RFC 2033 §4.2). */
static int input_room_ok(const smtpe_server *s)
{
    size_t need = s->reserve + (size_t)s->q_len * s->buf_size;
    if (s->cfg->lmtp && (s->mode == MODE_DATA || s->mode == MODE_BDAT))
        need += (size_t)s->rcpts * LMTP_REPLY_ROOM;
    return out_fits(s, need, 0);
}

/* Whether the owed replies are those of a pipelined transaction's MAIL and RCPTs, behind which
 * further command lines may be read (concurrent verdicts). A command is only queued behind
 * others while this holds, so any other kind is alone: looking at the oldest is enough. */
static int batch_open(const smtpe_server *s)
{
    return s->npend > 1 && s->auth == AUTH_NONE && s->mode == MODE_COMMAND &&
           (s->q_len == 0 || q_at(s, 0)->kind != KIND_OTHER);
}

/* Whether a line buffer is there for the next command line. */
static int line_buffer_ready(const smtpe_server *s)
{
    return !(s->line.flags & SMTPE__LINE_DONE) || s->nfree > 0;
}

/* Starts the next command line in a free line buffer (line_buffer_ready said there is one). */
static void line_start(smtpe_server *s)
{
    if (s->lbuf[s->cur].use != BUF_FREE) { /* the last line's buffer is held: take another */
        unsigned i = s->cur;
        while (s->lbuf[i].use != BUF_FREE)
            i = i + 1 < s->npend ? i + 1 : 0;
        s->cur = i;
        s->line.buf = buf_at(s, i);
    }
    smtpe__line_reset(&s->line);
}

/* Whether smtpe_server_recv would consume input now (TLS_WAIT aside). */
static int reading(const smtpe_server *s)
{
    if (s->closing || s->event_ready || s->parked || !input_room_ok(s))
        return 0;
    if (s->q_len > 0 && !batch_open(s))
        return 0;
    return s->mode != MODE_COMMAND || line_buffer_ready(s);
}

/* ------------------------------------------------------------------------------------------
 * Session life
 * ---------------------------------------------------------------------------------------- */

static void *default_alloc(size_t size, void *ud)
{
    (void)ud;
    return malloc(size);
}

static void default_free(void *p, void *ud)
{
    (void)ud;
    free(p);
}

/* The greeting: 220 <hostname> <text>, no enhanced code (RFC 5321 §4.2, §3.1). */
static int greeting(smtpe_server *s, const char *text)
{
    char buf[256 + 1 + SMTPE__REPLY_TOTAL_MAX + 1]; /* hostname, SP, host text, NUL */
    int n = snprintf(buf, sizeof buf, "%s %s", s->cfg->hostname, text);
    if (n < 0 || (size_t)n >= sizeof buf)
        return SMTPE_ERR_REPLY_TOO_LONG;
    return out_reply(s, 220, NULL, buf, (size_t)n, 0);
}

static void session_setup(smtpe_server *s, const smtpe_server_config *cfg, const layout *l,
                          uint64_t now_ms)
{
    uint8_t *base = (uint8_t *)s;
    memset(s, 0, sizeof *s);
    s->cfg_copy = *cfg;
    s->cfg = &s->cfg_copy;
    s->npend = cfg->max_pending_verdicts;
    s->held = (held *)(void *)(base + l->held);
    s->lbuf = (linebuf *)(void *)(base + l->lbuf);
    s->bufs = base + l->bufs;
    s->buf_size = l->buf_size;
    for (unsigned i = 0; i < s->npend; i++)
        s->lbuf[i] = (linebuf){0, BUF_FREE};
    s->nfree = s->npend;
    s->line.buf = s->bufs;
    s->line.cap = l->line_cap;
    s->out = s->bufs + (size_t)s->npend * l->buf_size;
    s->out_cap = l->out_cap;
    s->reserve = l->reserve;
    s->last_activity = now_ms;
    if (cfg->proxy_protocol) { /* the greeting waits for the PROXY header and the verdict */
        s->mode = MODE_PROXY;
        smtpe__proxy_start(&s->proxy);
        return;
    }
    (void)greeting(s, cfg->greeting_text);
}

int smtpe_server_init_versioned(smtpe_server **out, void *mem, size_t len, int config_version,
                                const smtpe_server_config *cfg, uint64_t now_ms)
{
    smtpe_server_config c;
    layout l;
    if (!out || !mem || !cfg || !config_latest(config_version, cfg, &c))
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (!layout_of(&c, &l))
        return SMTPE_ERR_CONFIG;
    if ((uintptr_t)mem % _Alignof(max_align_t) != 0)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (len < l.total)
        return SMTPE_ERR_BUFFER_TOO_SMALL;
    session_setup(mem, &c, &l, now_ms);
    *out = mem;
    return 0;
}

int smtpe_server_new_versioned(smtpe_server **out, int config_version,
                               const smtpe_server_config *cfg, const smtpe_allocator *alloc,
                               uint64_t now_ms)
{
    smtpe_server_config c;
    layout l;
    smtpe_allocator a = {default_alloc, default_free, NULL};
    smtpe_server *s;
    if (!out || !cfg)
        return SMTPE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!config_latest(config_version, cfg, &c))
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (alloc && alloc->alloc && alloc->free)
        a = *alloc;
    if (!layout_of(&c, &l))
        return SMTPE_ERR_CONFIG;
    s = a.alloc(l.total, a.ud);
    if (!s)
        return SMTPE_ERR_NOMEM;
    session_setup(s, &c, &l, now_ms);
    s->alloc = a;
    s->owned = 1;
    *out = s;
    return 0;
}

void smtpe_server_free(smtpe_server *s)
{
    if (s && s->owned)
        s->alloc.free(s, s->alloc.ud);
}

static void reset_transaction(smtpe_server *s)
{
    s->in_transaction = 0;
    s->smtputf8 = 0;
    s->binarymime = 0;
    s->bdat_started = 0;
    s->rcpts = 0;
}

static int end_transaction(smtpe_server *s)
{
    int open = s->in_transaction;
    reset_transaction(s);
    return open;
}

/* Forgets the SASL exchange and wipes the credentials it decoded (RFC 4954 §4 responses live
 * in the line buffer; the LOGIN user name in auth_user). */
static void auth_end(smtpe_server *s)
{
    volatile uint8_t *p = s->line.buf;
    for (size_t i = 0; i < s->line.len; i++)
        p[i] = 0;
    p = s->auth_user;
    for (size_t i = 0; i < sizeof s->auth_user; i++)
        p[i] = 0;
    s->auth = AUTH_NONE;
    s->auth_user_len = 0;
}


/* ------------------------------------------------------------------------------------------
 * Commands (RFC 5321 §4.1.1)
 * ---------------------------------------------------------------------------------------- */

static int has_control(smtpe_span a)
{
    for (size_t i = 0; i < a.len; i++)
        if (a.ptr[i] < 0x20 || a.ptr[i] == 0x7f)
            return 1;
    return 0;
}

static smtpe_span trim_right(smtpe_span a)
{
    while (a.len > 0 && a.ptr[a.len - 1] == ' ')
        a.len--;
    return a;
}

/* §4.1.1.1: EHLO / HELO, and RFC 2033 §4.1 LHLO. Each resets the transaction. */
static void cmd_helo(smtpe_server *s, smtpe_span arg, smtpe__verb v)
{
    int esmtp = v != SMTPE__VERB_HELO;
    arg = trim_right(arg);
    if (s->cfg->lmtp && v != SMTPE__VERB_LHLO) {
        reply(s, 500, "5.5.1", "Use LHLO");
        return;
    }
    if (arg.len == 0 || has_control(arg)) {
        reply(s, 501, "5.5.4",
              v == SMTPE__VERB_LHLO ? "Syntax: LHLO hostname"
              : esmtp               ? "Syntax: EHLO hostname"
                                    : "Syntax: HELO hostname");
        return;
    }
    s->abandon = end_transaction(s);
    s->ev.helo.domain = arg;
    s->ev.helo.esmtp = esmtp;
    s->ev.helo.lmtp = v == SMTPE__VERB_LHLO;
    raise_event(s, SMTPE_EV_HELO);
}

/* Replies for a path that failed to parse; sender selects MAIL's enhanced codes. */
static void path_error(smtpe_server *s, int r, int sender)
{
    const char *enh = sender ? "5.1.7" : "5.1.3";
    if (r == SMTPE__PATH_NO_BRACKETS)
        reply(s, 501, "5.5.2",
              sender ? "Syntax: MAIL FROM:<address>" : "Syntax: RCPT TO:<address>");
    else if (r == SMTPE__PATH_TOO_LONG)
        reply(s, 501, enh, "Path too long");
    else
        reply(s, 501, enh, sender ? "Bad sender address syntax" : "Bad recipient address syntax");
}

/* Parses "FROM:" / "TO:" path [SP params] in arg. Returns 0, or -1 after replying. */
static int parse_path_params(smtpe_server *s, smtpe_span arg, int sender, smtpe_path *path,
                             smtpe_param *params, size_t *count)
{
    const char *prefix = sender ? "FROM:" : "TO:";
    unsigned opts = sender ? SMTPE__PATH_ALLOW_NULL : SMTPE__PATH_ALLOW_POSTMASTER;
    size_t at = strlen(prefix), used;
    int r;
    if (!smtpe__has_prefix_ci(arg.ptr, arg.len, prefix)) {
        path_error(s, SMTPE__PATH_NO_BRACKETS, sender);
        return -1;
    }
    while (at < arg.len && arg.ptr[at] == ' ') /* "FROM: <a@b>" is common; tolerate it */
        at++;
    if (s->cfg->lax_angle_brackets)
        opts |= SMTPE__PATH_LAX_BRACKETS;
    r = smtpe__parse_path(arg.ptr + at, arg.len - at, opts, path, &used);
    if (r == SMTPE__PATH_OK && at + used < arg.len && arg.ptr[at + used] != ' ')
        r = SMTPE__PATH_SYNTAX;
    if (r != SMTPE__PATH_OK) {
        path_error(s, r, sender);
        return -1;
    }
    at += used;
    r = smtpe__parse_params(arg.ptr + at, arg.len - at, params, SMTPE_MAX_PARAMS, count);
    if (r != SMTPE__PARAMS_OK) {
        reply(s, 501, "5.5.4",
              r == SMTPE__PARAMS_TOO_MANY ? "Too many parameters" : "Malformed parameter");
        return -1;
    }
    return 0;
}

static int span_is(smtpe_span a, const char *word)
{
    return a.len == strlen(word) && smtpe__has_prefix_ci(a.ptr, a.len, word);
}

static int has_8bit(smtpe_span a)
{
    for (size_t i = 0; i < a.len; i++)
        if (a.ptr[i] >= 0x80)
            return 1;
    return 0;
}

/* The writable octets of the command line being handled that p, a span's pointer into it,
 * names (spans are const for the host; the engine decodes in place). */
static uint8_t *in_line(smtpe_server *s, const uint8_t *p)
{
    return s->line.buf + (p - s->line.buf);
}

/* Decodes the xtext value of a parameter in place (RFC 3461 §4), updating the span. Returns 0,
 * or -1 if it is malformed or decodes to a control octet (CR, LF, NUL: Exim CVE-2020-28021). */
static int xtext_value(smtpe_server *s, smtpe_span *v)
{
    size_t n;
    if (smtpe__xtext_decode(in_line(s, v->ptr), v->len, &n) != SMTPE__XTEXT_OK)
        return -1;
    v->len = n;
    return 0;
}

/* 1 if s is an optional sign and 1..max digits; the value goes to *v. */
static int parse_signed(smtpe_span a, size_t max, int64_t *v)
{
    int neg = 0;
    uint64_t u;
    if (a.len > 0 && (a.ptr[0] == '-' || a.ptr[0] == '+')) {
        neg = a.ptr[0] == '-';
        a.ptr++, a.len--;
    }
    if (a.len == 0 || a.len > max || smtpe__parse_u64(a, &u) != 0)
        return 0;
    *v = neg ? -(int64_t)u : (int64_t)u;
    return 1;
}

/* BY=<by-time>;<by-mode>[T] (RFC 2852 §4: by-time up to 9 digits, mode R or N). */
static int parse_by(smtpe_server *s, smtpe_span v)
{
    size_t semi = 0;
    int64_t t;
    while (semi < v.len && v.ptr[semi] != ';')
        semi++;
    if (semi == v.len || !parse_signed((smtpe_span){v.ptr, semi}, 9, &t))
        return 0;
    v.ptr += semi + 1, v.len -= semi + 1;
    if (v.len < 1 || v.len > 2 || (v.ptr[0] != 'R' && v.ptr[0] != 'r' && v.ptr[0] != 'N' &&
                                   v.ptr[0] != 'n'))
        return 0;
    if (v.len == 2 && v.ptr[1] != 'T' && v.ptr[1] != 't')
        return 0;
    if ((v.ptr[0] == 'R' || v.ptr[0] == 'r') && t <= 0)
        return 0; /* "a negative or zero value is not allowed with a by-mode of R" */
    s->ev.mail.by_time = t;
    s->ev.mail.by_mode = (v.ptr[0] == 'R' || v.ptr[0] == 'r') ? 'R' : 'N';
    s->ev.mail.by_trace = v.len == 2;
    return 1;
}

static int auth_offered(const smtpe_server *s)
{
    return s->cfg->auth_mechanisms && (s->tls || s->cfg->auth_without_tls);
}

/* The extensions configured, less those the session's state rules out (TLS, trust). */
static unsigned offered_ext(const smtpe_server *s)
{
    unsigned ext = s->cfg->extensions;
    if (!s->tls)
        ext &= ~SMTPE_EXT_REQUIRETLS;
    if (s->tls)
        ext &= ~SMTPE_EXT_STARTTLS;
    if (!(ext & SMTPE_EXT_CHUNKING))
        ext &= ~SMTPE_EXT_BINARYMIME;
    if (!s->trusted)
        ext &= ~(SMTPE_EXT_XCLIENT | SMTPE_EXT_XFORWARD);
    return ext;
}

/* The extensions in force: what offered_ext() gives, once EHLO (or LHLO) was accepted. */
static unsigned session_ext(const smtpe_server *s)
{
    return s->helo == HELO_ESMTP ? offered_ext(s) : 0;
}

/* Interprets one MAIL parameter (RFC 1870 SIZE, RFC 6152 / RFC 3030 BODY, RFC 6531 SMTPUTF8,
 * RFC 4954 §5 AUTH, RFC 3461 RET / ENVID, RFC 8689 REQUIRETLS, RFC 6710 MT-PRIORITY,
 * RFC 2852 BY). Returns its bit (for duplicates), 0 if not offered, or -1 if malformed. */
static int mail_param(smtpe_server *s, unsigned ext, smtpe_param *pm)
{
    smtpe_span k = pm->keyword, v = pm->value;
    int64_t n;
    if (span_is(k, "SIZE") && (ext & SMTPE_EXT_SIZE)) {
        s->ev.mail.has_size = 1;
        return smtpe__parse_u64(v, &s->ev.mail.size) == 0 ? 1 << 0 : -1;
    }
    if (span_is(k, "BODY") && (ext & SMTPE_EXT_8BITMIME)) {
        if (span_is(v, "7BIT"))
            s->ev.mail.body = SMTPE_BODY_7BIT;
        else if (span_is(v, "8BITMIME"))
            s->ev.mail.body = SMTPE_BODY_8BITMIME;
        else if (span_is(v, "BINARYMIME") && (ext & SMTPE_EXT_BINARYMIME))
            s->ev.mail.body = SMTPE_BODY_BINARYMIME;
        else
            return -1;
        return 1 << 1;
    }
    if (span_is(k, "SMTPUTF8") && (ext & SMTPE_EXT_SMTPUTF8)) {
        s->ev.mail.smtputf8 = 1;
        return v.len == 0 ? 1 << 2 : -1;
    }
    if (span_is(k, "AUTH") && auth_offered(s) && s->helo == HELO_ESMTP) {
        s->ev.mail.has_auth = 1;
        if (span_is(v, "<>")) {
            s->ev.mail.auth = (smtpe_span){v.ptr, 0}; /* params[] keeps "<>" */
            return 1 << 3;
        }
        if (v.len == 0 || xtext_value(s, &v) != 0)
            return -1;
        s->ev.mail.auth = pm->value = v;
        return 1 << 3;
    }
    if (span_is(k, "RET") && (ext & SMTPE_EXT_DSN)) {
        if (span_is(v, "FULL"))
            s->ev.mail.ret = SMTPE_RET_FULL;
        else if (span_is(v, "HDRS"))
            s->ev.mail.ret = SMTPE_RET_HDRS;
        else
            return -1;
        return 1 << 4;
    }
    if (span_is(k, "ENVID") && (ext & SMTPE_EXT_DSN)) {
        if (v.len == 0 || xtext_value(s, &v) != 0 || v.len > 100 || has_8bit(v))
            return -1; /* RFC 3461 §4.4: at most 100 printable US-ASCII characters */
        s->ev.mail.has_envid = 1;
        s->ev.mail.envid = pm->value = v;
        return 1 << 5;
    }
    if (span_is(k, "REQUIRETLS") && (ext & SMTPE_EXT_REQUIRETLS)) {
        s->ev.mail.requiretls = 1;
        return v.len == 0 ? 1 << 6 : -1;
    }
    if (span_is(k, "MT-PRIORITY") && (ext & SMTPE_EXT_MT_PRIORITY)) {
        if (!parse_signed(v, 1, &n)) /* RFC 6710 §3: -9..9 */
            return -1;
        s->ev.mail.has_mt_priority = 1;
        s->ev.mail.mt_priority = (int)n;
        return 1 << 7;
    }
    if (span_is(k, "BY") && (ext & SMTPE_EXT_DELIVERBY))
        return parse_by(s, v) ? 1 << 8 : -1;
    return 0;
}

/* Replies for a parameter result: 0 not offered (555), -1 malformed, or a duplicate. Returns
 * -1 after replying, or 0 if the parameter is fine. */
static int param_verdict(smtpe_server *s, int bit, unsigned *seen)
{
    if (bit == 0) {
        reply(s, 555, "5.5.4", "Unsupported parameter"); /* RFC 5321 §4.1.1.11 */
        return -1;
    }
    if (bit < 0) {
        reply(s, 501, "5.5.4", "Malformed parameter");
        return -1;
    }
    if (*seen & (unsigned)bit) {
        reply(s, 501, "5.5.4", "Duplicate parameter");
        return -1;
    }
    *seen |= (unsigned)bit;
    return 0;
}

/* Values with octets above 127 are allowed only with SMTPUTF8 (RFC 6531 §3.3). */
static int check_8bit_values(smtpe_server *s, const smtpe_param *params, size_t count, int utf8)
{
    for (size_t i = 0; i < count; i++) {
        if (!utf8 && has_8bit(params[i].value)) {
            reply(s, 501, "5.5.4", "Malformed parameter");
            return -1;
        }
    }
    return 0;
}

/* Interprets MAIL parameters left to right. Returns 0, or -1 after replying. */
static int mail_params(smtpe_server *s)
{
    unsigned ext = session_ext(s), seen = 0;
    for (size_t i = 0; i < s->ev.mail.param_count; i++)
        if (param_verdict(s, mail_param(s, ext, &s->ev.mail.params[i]), &seen) != 0)
            return -1;
    return check_8bit_values(s, s->ev.mail.params, s->ev.mail.param_count,
                             s->ev.mail.smtputf8);
}

/* NOTIFY=NEVER or a comma list of SUCCESS, FAILURE, DELAY, each at most once (RFC 3461 §4.1). */
static int parse_notify(smtpe_span v, unsigned *out)
{
    unsigned bits = 0;
    size_t at = 0;
    while (at <= v.len) {
        size_t end = at;
        unsigned b;
        smtpe_span w;
        while (end < v.len && v.ptr[end] != ',')
            end++;
        w = (smtpe_span){v.ptr + at, end - at};
        b = span_is(w, "NEVER")     ? SMTPE_NOTIFY_NEVER
            : span_is(w, "SUCCESS") ? SMTPE_NOTIFY_SUCCESS
            : span_is(w, "FAILURE") ? SMTPE_NOTIFY_FAILURE
            : span_is(w, "DELAY")   ? SMTPE_NOTIFY_DELAY
                                    : 0;
        if (b == 0 || (bits & b))
            return -1;
        bits |= b;
        at = end + 1;
    }
    if ((bits & SMTPE_NOTIFY_NEVER) && bits != SMTPE_NOTIFY_NEVER)
        return -1;
    *out = bits;
    return 0;
}

/* ORCPT=addr-type;xtext (RFC 3461 §4.2; at most 500 characters). */
static int parse_orcpt(smtpe_server *s, smtpe_param *pm)
{
    smtpe_span v = pm->value;
    size_t semi = 0;
    while (semi < v.len && v.ptr[semi] != ';')
        semi++;
    if (semi == 0 || semi == v.len || v.len > 500)
        return -1;
    for (size_t i = 0; i < semi; i++)
        if (!((v.ptr[i] >= 'A' && v.ptr[i] <= 'Z') || (v.ptr[i] >= 'a' && v.ptr[i] <= 'z') ||
              (v.ptr[i] >= '0' && v.ptr[i] <= '9') || v.ptr[i] == '-'))
            return -1;
    s->ev.rcpt.orcpt_type = (smtpe_span){v.ptr, semi};
    v.ptr += semi + 1, v.len -= semi + 1;
    if (v.len == 0 || xtext_value(s, &v) != 0)
        return -1;
    s->ev.rcpt.orcpt = v;
    s->ev.rcpt.has_orcpt = 1;
    pm->value.len = semi + 1 + v.len; /* "type;" and the decoded address, contiguous */
    return 0;
}

/* The MAIL still waiting for its verdict that the RCPTs being read belong to, or NULL. Such a
 * MAIL is the oldest owed reply (a MAIL is only executed when none is owed). */
static const held *mail_waiting(const smtpe_server *s)
{
    return s->q_len > 0 && q_at(s, 0)->kind == KIND_MAIL ? q_at(s, 0) : NULL;
}

/* Whether the transaction the RCPT being read belongs to has SMTPUTF8 (RFC 6531 §3.3). */
static int txn_smtputf8(const smtpe_server *s)
{
    const held *mail = mail_waiting(s);
    return mail ? mail->smtputf8 : s->smtputf8;
}

/* Recipients accepted, and those still waiting for their verdicts counted as accepted. */
static unsigned rcpts_counted(const smtpe_server *s)
{
    return s->rcpts + s->q_rcpts;
}

/* §4.1.1.3: RCPT TO:<forward-path> [SP rcpt-parameters] */
/* Interprets RCPT parameters (RFC 3461 NOTIFY, ORCPT). Returns 0, or -1 after replying. */
static int rcpt_params(smtpe_server *s)
{
    unsigned ext = session_ext(s), seen = 0;
    for (size_t i = 0; i < s->ev.rcpt.param_count; i++) {
        smtpe_param *pm = &s->ev.rcpt.params[i];
        int bit = 0;
        if (span_is(pm->keyword, "NOTIFY") && (ext & SMTPE_EXT_DSN))
            bit = parse_notify(pm->value, &s->ev.rcpt.notify) == 0 ? 1 : -1;
        else if (span_is(pm->keyword, "ORCPT") && (ext & SMTPE_EXT_DSN))
            bit = parse_orcpt(s, pm) == 0 ? 2 : -1;
        if (param_verdict(s, bit, &seen) != 0)
            return -1;
    }
    return check_8bit_values(s, s->ev.rcpt.params, s->ev.rcpt.param_count, txn_smtputf8(s));
}

/* §4.1.1.2: MAIL FROM:<reverse-path> [SP mail-parameters] */
static void cmd_mail(smtpe_server *s, smtpe_span arg)
{
    if (s->helo == HELO_NONE) {
        reply(s, 503, "5.5.1", "Send HELO or EHLO first");
        return;
    }
    if (s->in_transaction) {
        reply(s, 503, "5.5.1", "Nested MAIL command");
        return;
    }
    if (s->cfg->require_tls && !s->tls) {
        reply(s, 530, "5.7.0", "Must issue a STARTTLS command first"); /* RFC 3207 §4 */
        return;
    }
    memset(&s->ev.mail, 0, sizeof s->ev.mail);
    if (parse_path_params(s, arg, 1, &s->ev.mail.reverse_path, s->ev.mail.params,
                          &s->ev.mail.param_count) != 0 ||
        mail_params(s) != 0)
        return;
    if ((s->ev.mail.reverse_path.flags & SMTPE_PATH_UTF8) && !s->ev.mail.smtputf8) {
        reply(s, 553, "5.6.7", "Non-ASCII address requires SMTPUTF8"); /* RFC 6531 §3.7.4 */
        return;
    }
    if (s->ev.mail.has_size && s->cfg->max_message_size &&
        s->ev.mail.size > s->cfg->max_message_size) {
        reply(s, 552, "5.3.4", "Message size exceeds fixed limit"); /* RFC 1870 §6.1 */
        return;
    }
    raise_event(s, SMTPE_EV_MAIL);
    /* what the transaction will be, should the verdict start it (the event may be long gone) */
    q_at(s, s->q_len - 1)->smtputf8 = (uint8_t)s->ev.mail.smtputf8;
    q_at(s, s->q_len - 1)->binarymime = s->ev.mail.body == SMTPE_BODY_BINARYMIME;
}

static void cmd_rcpt(smtpe_server *s, smtpe_span arg)
{
    const held *mail = mail_waiting(s);
    if (!s->in_transaction && !mail) {
        reply(s, 503, "5.5.1", "Need MAIL command");
        return;
    }
    memset(&s->ev.rcpt, 0, sizeof s->ev.rcpt);
    if (parse_path_params(s, arg, 0, &s->ev.rcpt.forward_path, s->ev.rcpt.params,
                          &s->ev.rcpt.param_count) != 0)
        return;
    if (rcpt_params(s) != 0)
        return;
    if ((s->ev.rcpt.forward_path.flags & SMTPE_PATH_UTF8) && !txn_smtputf8(s)) {
        reply(s, 553, "5.6.7", "Non-ASCII address requires SMTPUTF8");
        return;
    }
    if (s->rcpts >= s->cfg->max_recipients) { /* (none waits: see dispatch_line) */
        reply(s, 452, "4.5.3", "Too many recipients"); /* RFC 5321 §4.5.3.1.10 */
        return;
    }
    raise_event(s, SMTPE_EV_RCPT);
}

/* §4.1.1.4: DATA */
static void cmd_data(smtpe_server *s)
{
    if (!s->in_transaction)
        reply(s, 503, "5.5.1", "Need MAIL command");
    else if (s->rcpts == 0)
        reply(s, 554, "5.5.1", "No valid recipients");
    else if (s->bdat_started) /* RFC 3030 §2: no mixing in one transaction */
        reply(s, 503, "5.5.1", "DATA not allowed after BDAT");
    else if (s->binarymime) /* RFC 3030 §3 */
        reply(s, 503, "5.5.1", "Use BDAT with BODY=BINARYMIME");
    else
        raise_event(s, SMTPE_EV_DATA);
}

static void not_implemented(smtpe_server *s)
{
    reply(s, 502, "5.5.1", "Command not implemented");
}

/* RFC 3207 §4: STARTTLS */
static void cmd_starttls(smtpe_server *s, smtpe_span arg)
{
    if (!(s->cfg->extensions & SMTPE_EXT_STARTTLS))
        not_implemented(s);
    else if (trim_right(arg).len > 0)
        reply(s, 501, "5.5.4", "Syntax: STARTTLS");
    else if (s->tls)
        reply(s, 503, "5.5.1", "TLS already active");
    else if (s->in_transaction)
        reply(s, 503, "5.5.1", "Not permitted during a mail transaction");
    else
        raise_event(s, SMTPE_EV_STARTTLS);
}

/* A 334 continuation (RFC 4954 §4): text is base64 or empty; no enhanced code on 3xx. */
static void auth_continue(smtpe_server *s, const char *text, int next)
{
    (void)out_reply(s, 334, NULL, text, strlen(text), 0);
    s->auth = next;
}

/* Decodes a SASL response in place: "=" and (after a 334) an empty line are empty (RFC 4954
 * §4). Returns 0 and the decoded span, or -1 after replying 501. */
static int auth_decode(smtpe_server *s, smtpe_span in, smtpe_span *out)
{
    size_t n;
    if (in.len == 1 && in.ptr[0] == '=') {
        *out = (smtpe_span){in.ptr, 0};
        return 0;
    }
    n = smtpe__base64_decode(in.ptr, in.len, in_line(s, in.ptr));
    if (n == SMTPE__BASE64_BAD) {
        reply(s, 501, "5.5.2", "Invalid base64 data");
        auth_end(s);
        return -1;
    }
    *out = (smtpe_span){in.ptr, n};
    return 0;
}

static void auth_event(smtpe_server *s)
{
    s->ev.auth.mechanism = (smtpe_span){s->auth_mech, s->auth_mech_len};
    s->ev.auth.mechanism_id = s->auth_mech_id;
    raise_event(s, SMTPE_EV_AUTH);
}

/* A decoded PLAIN message (RFC 4616 §2): the credentials go to the host. */
static void auth_plain(smtpe_server *s, smtpe_span m)
{
    memset(&s->ev.auth, 0, sizeof s->ev.auth);
    if (smtpe__sasl_plain(m.ptr, m.len, &s->ev.auth.authzid, &s->ev.auth.authcid,
                          &s->ev.auth.password) != 0) {
        reply(s, 501, "5.5.2", "Invalid PLAIN credentials");
        auth_end(s);
        return;
    }
    s->auth = AUTH_OTHER; /* waiting for the verdict */
    auth_event(s);
}

/* The LOGIN user name: kept until the password line comes. */
static void auth_login_user(smtpe_server *s, smtpe_span u)
{
    if (u.len == 0 || u.len > AUTH_USER_MAX) {
        reply(s, 501, "5.5.2", "Invalid LOGIN credentials");
        auth_end(s);
        return;
    }
    memcpy(s->auth_user, u.ptr, u.len);
    s->auth_user_len = u.len;
    auth_continue(s, "UGFzc3dvcmQ6", AUTH_LOGIN_PASS); /* "Password:" */
}

static void auth_login_password(smtpe_server *s, smtpe_span pw)
{
    memset(&s->ev.auth, 0, sizeof s->ev.auth);
    s->ev.auth.authcid = (smtpe_span){s->auth_user, s->auth_user_len};
    s->ev.auth.password = pw;
    s->auth = AUTH_OTHER;
    auth_event(s);
}

static void auth_other(smtpe_server *s, smtpe_span response, int has_response)
{
    memset(&s->ev.auth, 0, sizeof s->ev.auth);
    s->ev.auth.response = response;
    s->ev.auth.has_response = has_response;
    s->ev.auth.step = s->auth_step;
    s->auth = AUTH_OTHER;
    auth_event(s);
}

/* Finds the mechanism m (any case) in auth_mechanisms. */
static int mechanism_offered(const smtpe_server *s, smtpe_span m)
{
    const char *p = s->cfg->auth_mechanisms;
    while (*p) {
        size_t n = strcspn(p, " "), i = 0;
        while (i < n && i < m.len && (m.ptr[i] == (uint8_t)p[i] ||
                                      (m.ptr[i] >= 'a' && m.ptr[i] <= 'z' &&
                                       m.ptr[i] - 'a' + 'A' == (uint8_t)p[i])))
            i++;
        if (i == n && n == m.len)
            return 1;
        p += n;
        while (*p == ' ')
            p++;
    }
    return 0;
}

/* RFC 4954 §4: AUTH mechanism [initial-response] */
static void cmd_auth(smtpe_server *s, smtpe_span arg)
{
    smtpe_span mech, initial = {NULL, 0};
    size_t i = 0;
    int has_initial;
    if (!s->cfg->auth_mechanisms) {
        not_implemented(s);
        return;
    }
    if (!s->tls && !s->cfg->auth_without_tls) {
        reply(s, 538, "5.7.11", "Encryption required for requested authentication mechanism");
        return;
    }
    if (s->helo == HELO_NONE) {
        reply(s, 503, "5.5.1", "Send HELO or EHLO first");
        return;
    }
    if (s->authenticated) {
        reply(s, 503, "5.5.1", "Already authenticated");
        return;
    }
    if (s->in_transaction) {
        reply(s, 503, "5.5.1", "Not permitted during a mail transaction");
        return;
    }
    arg = trim_right(arg);
    while (i < arg.len && arg.ptr[i] != ' ')
        i++;
    mech = (smtpe_span){arg.ptr, i};
    while (i < arg.len && arg.ptr[i] == ' ')
        i++;
    has_initial = i < arg.len;
    if (has_initial)
        initial = (smtpe_span){arg.ptr + i, arg.len - i};
    if (mech.len == 0 || memchr(initial.ptr ? initial.ptr : arg.ptr, ' ', initial.len)) {
        reply(s, 501, "5.5.4", "Syntax: AUTH mechanism [initial-response]");
        return;
    }
    if (mech.len > AUTH_MECH_MAX || !mechanism_offered(s, mech)) {
        reply(s, 504, "5.5.4", "Unrecognized authentication type");
        return;
    }
    memcpy(s->auth_mech, mech.ptr, mech.len);
    s->auth_mech_len = mech.len;
    s->auth_mech_id = span_is(mech, "PLAIN")   ? SMTPE_SASL_PLAIN
                      : span_is(mech, "LOGIN") ? SMTPE_SASL_LOGIN
                                               : SMTPE_SASL_OTHER;
    s->auth_step = 0;
    s->auth = AUTH_OTHER; /* an exchange has begun: auth_end() wipes from here on */
    if (has_initial && auth_decode(s, initial, &initial) != 0)
        return;
    if (s->auth_mech_id == SMTPE_SASL_PLAIN) {
        if (has_initial)
            auth_plain(s, initial);
        else
            auth_continue(s, "", AUTH_PLAIN_WAIT);
    } else if (s->auth_mech_id == SMTPE_SASL_LOGIN) {
        if (has_initial)
            auth_login_user(s, initial);
        else
            auth_continue(s, "VXNlcm5hbWU6", AUTH_LOGIN_USER); /* "Username:" */
    } else {
        auth_other(s, initial, has_initial);
    }
}

/* A line of an AUTH exchange after a 334 (RFC 4954 §4). */
static void auth_line(smtpe_server *s)
{
    smtpe_span in = {s->line.buf, s->line.len}, out;
    if (s->line.flags & SMTPE__LINE_TOO_LONG) {
        reply(s, 500, "5.5.6", "Authentication Exchange line is too long");
        auth_end(s);
        return;
    }
    if ((s->line.flags & SMTPE__LINE_BARE) || (in.len == 1 && in.ptr[0] == '*')) {
        if (s->line.flags & SMTPE__LINE_BARE)
            reply(s, 500, "5.5.2", "Bare CR, LF or NUL in command line");
        else
            reply(s, 501, "5.0.0", "Authentication cancelled");
        auth_end(s);
        return;
    }
    if (auth_decode(s, in, &out) != 0)
        return;
    switch (s->auth) {
    case AUTH_PLAIN_WAIT:
        auth_plain(s, out);
        break;
    case AUTH_LOGIN_USER:
        auth_login_user(s, out);
        break;
    case AUTH_LOGIN_PASS:
        auth_login_password(s, out);
        break;
    default: /* AUTH_OTHER_WAIT */
        s->auth_step++;
        auth_other(s, out, 1);
        break;
    }
}

/* RFC 3030 §2: BDAT chunk-size [SP "LAST"]. Once the syntax is right the chunk is always
 * swallowed whole, whatever the reply, so that its octets are never read as commands. */
static void cmd_bdat(smtpe_server *s, smtpe_span arg)
{
    size_t i = 0;
    uint64_t size;
    int last = 0;
    arg = trim_right(arg);
    while (i < arg.len && arg.ptr[i] != ' ')
        i++;
    if (smtpe__parse_u64((smtpe_span){arg.ptr, i}, &size) != 0) {
        reply(s, 501, "5.5.4", "Syntax: BDAT size [LAST]");
        return;
    }
    while (i < arg.len && arg.ptr[i] == ' ')
        i++;
    if (i < arg.len) {
        if (!span_is((smtpe_span){arg.ptr + i, arg.len - i}, "LAST")) {
            reply(s, 501, "5.5.4", "Syntax: BDAT size [LAST]");
            return;
        }
        last = 1;
    }
    s->bdat_left = size;
    s->skip_code = 0;
    if (!(session_ext(s) & SMTPE_EXT_CHUNKING))
        s->skip_code = 502, s->skip_enhanced = "5.5.1", s->skip_text = "Command not implemented";
    else if (!s->in_transaction)
        s->skip_code = 503, s->skip_enhanced = "5.5.1", s->skip_text = "Need MAIL command";
    else if (s->rcpts == 0)
        s->skip_code = 554, s->skip_enhanced = "5.5.1", s->skip_text = "No valid recipients";
    if (s->skip_code) {
        s->mode = MODE_BDAT_SKIP;
        return;
    }
    s->ev.bdat.size = size;
    s->ev.bdat.last = last;
    s->ev.bdat.first = !s->bdat_started;
    if (!s->bdat_started)
        smtpe__bdat_start(&s->data, s->cfg->line_ending, s->cfg->max_message_size,
                          s->binarymime);
    s->bdat_first = !s->bdat_started;
    s->bdat_started = 1;
    s->bdat_size = size;
    s->bdat_last = last;
    s->bdat_ending = 0;
    s->mode = MODE_BDAT;
    raise_event(s, SMTPE_EV_BDAT);
}

/* Postfix XCLIENT / XFORWARD: attribute=value ... (values xtext). */
static void cmd_xclient(smtpe_server *s, smtpe_span arg, int xforward)
{
    static const char *const xclient_names[] = {"NAME", "ADDR",  "PORT",     "PROTO",
                                                "HELO", "LOGIN", "DESTADDR", "DESTPORT"};
    static const char *const xforward_names[] = {"NAME", "ADDR",  "PORT",  "PROTO",
                                                 "HELO", "IDENT", "SOURCE"};
    const char *const *names = xforward ? xforward_names : xclient_names;
    size_t nnames = xforward ? 7 : 8;
    unsigned bit = xforward ? SMTPE_EXT_XFORWARD : SMTPE_EXT_XCLIENT;
    const char *bad = xforward ? "Bad XFORWARD attribute" : "Bad XCLIENT attribute";
    if (!(s->cfg->extensions & bit)) {
        not_implemented(s);
        return;
    }
    if (!s->trusted) {
        reply(s, 550, "5.7.0", "Insufficient authorization");
        return;
    }
    if (s->in_transaction) {
        reply(s, 503, "5.5.1", "Not permitted during a mail transaction");
        return;
    }
    memset(&s->ev.xclient, 0, sizeof s->ev.xclient);
    if (smtpe__parse_params(arg.ptr, arg.len, s->ev.xclient.attrs, SMTPE_MAX_PARAMS,
                            &s->ev.xclient.count) != SMTPE__PARAMS_OK ||
        s->ev.xclient.count == 0) {
        reply(s, 501, "5.5.4", bad);
        return;
    }
    for (size_t i = 0; i < s->ev.xclient.count; i++) {
        smtpe_param *a = &s->ev.xclient.attrs[i];
        size_t k = 0;
        while (k < nnames && !span_is(a->keyword, names[k]))
            k++;
        if (k == nnames || a->value.len == 0 || xtext_value(s, &a->value) != 0) {
            reply(s, 501, "5.5.4", bad);
            return;
        }
    }
    raise_event(s, xforward ? SMTPE_EV_XFORWARD : SMTPE_EV_XCLIENT);
}

static void cmd_with_argument(smtpe_server *s, smtpe_event_type type, smtpe_span verb,
                              smtpe_span arg, const char *syntax)
{
    arg = trim_right(arg);
    if (syntax && arg.len == 0) {
        reply(s, 501, "5.5.4", syntax);
        return;
    }
    s->ev.command.verb = verb;
    s->ev.command.argument = arg;
    raise_event(s, type);
}

/* Commands that take no argument: DATA, RSET, QUIT. */
static void cmd_plain(smtpe_server *s, smtpe__verb v, smtpe_span arg)
{
    if (trim_right(arg).len > 0) {
        reply(s, 501, "5.5.4", "No parameters allowed");
        return;
    }
    if (v == SMTPE__VERB_DATA) {
        cmd_data(s);
    } else if (v == SMTPE__VERB_RSET) { /* §4.1.1.5 */
        s->abandon = end_transaction(s);
        reply(s, 250, "2.0.0", "Ok");
        raise_event(s, SMTPE_EV_RSET);
    } else { /* §4.1.1.10 QUIT */
        (void)out_reply(s, 221, "2.0.0", "Bye", 3, 1);
        s->closing = 1;
        s->abandon = end_transaction(s);
        raise_event(s, SMTPE_EV_QUIT);
    }
}

static void handle_line(smtpe_server *s)
{
    smtpe_span verb, arg;
    smtpe__verb v;
    s->stats.commands++;
    if (s->auth != AUTH_NONE) { /* a SASL response, not a command */
        auth_line(s);
        return;
    }
    if (s->line.flags & SMTPE__LINE_TOO_LONG) { /* §4.5.3.1.4 */
        reply(s, 500, "5.5.2", "Line too long");
        return;
    }
    if (s->line.flags & SMTPE__LINE_BARE) { /* §2.3.8 */
        reply(s, 500, "5.5.2", "Bare CR, LF or NUL in command line");
        return;
    }
    v = smtpe__command_split(s->line.buf, s->line.len, &verb, &arg);
    switch (v) {
    case SMTPE__VERB_LHLO: /* a verb of its own outside LMTP */
        if (s->cfg->lmtp)
            cmd_helo(s, arg, v);
        else
            cmd_with_argument(s, SMTPE_EV_UNKNOWN, verb, arg, NULL);
        break;
    case SMTPE__VERB_HELO:
    case SMTPE__VERB_EHLO:
        cmd_helo(s, arg, v);
        break;
    case SMTPE__VERB_STARTTLS:
        cmd_starttls(s, arg);
        break;
    case SMTPE__VERB_AUTH:
        cmd_auth(s, arg);
        break;
    case SMTPE__VERB_BDAT:
        cmd_bdat(s, arg);
        break;
    case SMTPE__VERB_XCLIENT:
    case SMTPE__VERB_XFORWARD:
        cmd_xclient(s, arg, v == SMTPE__VERB_XFORWARD);
        break;
    case SMTPE__VERB_MAIL:
        cmd_mail(s, arg);
        break;
    case SMTPE__VERB_RCPT:
        cmd_rcpt(s, arg);
        break;
    case SMTPE__VERB_DATA:
    case SMTPE__VERB_RSET:
    case SMTPE__VERB_QUIT:
        cmd_plain(s, v, arg);
        break;
    case SMTPE__VERB_NOOP: /* §4.1.1.9 */
        reply(s, 250, "2.0.0", "Ok");
        break;
    case SMTPE__VERB_HELP: /* §4.1.1.8 */
        reply(s, 214, "2.0.0", "Commands: EHLO HELO MAIL RCPT DATA RSET NOOP QUIT VRFY EXPN HELP");
        break;
    case SMTPE__VERB_VRFY: /* §3.5, §4.1.1.6 */
        cmd_with_argument(s, SMTPE_EV_VRFY, verb, arg, "Syntax: VRFY address");
        break;
    case SMTPE__VERB_EXPN: /* §3.5, §4.1.1.7 */
        cmd_with_argument(s, SMTPE_EV_EXPN, verb, arg, "Syntax: EXPN list");
        break;
    default:
        cmd_with_argument(s, SMTPE_EV_UNKNOWN, verb, arg, NULL);
        break;
    }
}

/* The end of the content: hand the host DATA_END; refused content is answered here, once per
 * recipient under LMTP (RFC 2033 §4.2). */
static void data_end(smtpe_server *s, int chunked)
{
    /* LMTP answers the end of the content per recipient; a BDAT chunk without LAST that
     * ends the message (refused content) still gets one reply, like any chunk (RFC 3030 §2) */
    unsigned replies = s->cfg->lmtp && (!chunked || s->bdat_last) ? s->rcpts : 1;
    s->mode = MODE_COMMAND;
    memset(&s->ev.data_end, 0, sizeof s->ev.data_end);
    s->ev.data_end.size = s->data.size;
    s->ev.data_end.status = s->data.status;
    s->ev.data_end.flags = s->data.flags;
    s->ev.data_end.chunked = chunked;
    s->ev.data_end.replies = replies;
    raise_event(s, SMTPE_EV_DATA_END);
    s->lmtp_left = replies;
    if (s->data.status == SMTPE_DATA_OK)
        return;
    for (unsigned i = 0; i < replies && !s->closing; i++) {
        if (s->data.status == SMTPE_DATA_TOO_BIG)
            reply(s, 552, "5.3.4", "Message size exceeds fixed limit"); /* RFC 1870 §6.3 */
        else
            reply(s, 550, "5.6.0", "Bare CR, LF or NUL in message content");
    }
    s->lmtp_left = 0;
    reset_transaction(s);
}

/* The current BDAT chunk has been read (RFC 3030 §2): its verdict is due, or for the last
 * chunk (or content already refused) the end of the message. Called when no event is pending. */
static void bdat_chunk_end(smtpe_server *s)
{
    smtpe_span tail;
    if (s->bdat_ending) { /* the tail below has been taken */
        s->bdat_ending = 0;
        data_end(s, 1);
        return;
    }
    if (s->bdat_last) {
        smtpe__bdat_end(&s->data, &tail);
        if (tail.len > 0) { /* a normalised LF goes out first; the end follows it */
            s->ev.chunk = tail;
            raise_event(s, SMTPE_EV_DATA_CHUNK);
            s->bdat_ending = 1;
            return;
        }
        data_end(s, 1);
        return;
    }
    if (s->data.status != SMTPE_DATA_OK) {
        data_end(s, 1);
        return;
    }
    s->mode = MODE_COMMAND;
    s->ev.bdat.size = s->bdat_size;
    s->ev.bdat.last = 0;
    s->ev.bdat.first = s->bdat_first;
    raise_event(s, SMTPE_EV_CHUNK_END);
}

/* Octets of a BDAT chunk. */
static size_t recv_bdat(smtpe_server *s, const uint8_t *buf, size_t len)
{
    smtpe_span chunk;
    size_t n = len < s->bdat_left ? len : (size_t)s->bdat_left, used;
    if (s->mode == MODE_BDAT_SKIP) {
        s->bdat_left -= n;
        if (s->bdat_left == 0) {
            s->mode = MODE_COMMAND;
            reply(s, s->skip_code, s->skip_enhanced, s->skip_text);
        }
        return n;
    }
    if (s->bdat_left == 0) {
        bdat_chunk_end(s);
        return 0;
    }
    used = smtpe__bdat_feed(&s->data, buf, n, &chunk);
    s->bdat_left -= used;
    if (chunk.len > 0) {
        s->ev.chunk = chunk;
        raise_event(s, SMTPE_EV_DATA_CHUNK);
    } else if (s->bdat_left == 0) {
        bdat_chunk_end(s);
    }
    return used;
}

static size_t recv_data(smtpe_server *s, const uint8_t *buf, size_t len)
{
    int end;
    smtpe_span chunk;
    size_t n = smtpe__data_feed(&s->data, buf, len, &chunk, &end);
    if (chunk.len > 0) {
        s->ev.chunk = chunk;
        raise_event(s, SMTPE_EV_DATA_CHUNK);
    } else if (end) {
        data_end(s, 0);
    }
    return n;
}

/* The PROXY header, before anything else. */
static size_t recv_proxy(smtpe_server *s, const uint8_t *buf, size_t len)
{
    size_t used = 0;
    int r = smtpe__proxy_feed(&s->proxy, s->line.buf, s->line.cap, buf, len, &used);
    if (r == SMTPE__PROXY_DONE &&
        smtpe__proxy_parse(s->line.buf, s->proxy.len, &s->ev.proxy) == 0) {
        s->mode = MODE_COMMAND;
        s->line.len = 0;
        s->line.flags = 0;
        raise_event(s, SMTPE_EV_PROXY);
    } else if (r != SMTPE__PROXY_MORE) {
        s->closing = 1; /* nothing is sent: the peer is not speaking the PROXY protocol */
        raise_event(s, SMTPE_EV_PROXY_INVALID);
    }
    return used;
}

/* Executes the command line that is in s->line. */
static void run_line(smtpe_server *s)
{
    handle_line(s);
    if (s->mode == MODE_BDAT_SKIP && s->bdat_left == 0) /* BDAT 0 refused */
        recv_bdat(s, NULL, 0);
}

/* A whole command line has been read. With replies owed (a pipelined MAIL and its RCPTs
 * waiting for verdicts) a well-formed RCPT is executed at once, unless it could pass
 * max_recipients were the waiting RCPTs accepted; any other line waits, unexecuted, until the
 * queue is empty (resume), and nothing more is read until then. So the replies are exactly
 * those of the same verdicts given one at a time (RFC 2920 §3.1). */
static void dispatch_line(smtpe_server *s)
{
    smtpe_span verb, arg;
    if (s->q_len > 0 && ((s->line.flags & (SMTPE__LINE_TOO_LONG | SMTPE__LINE_BARE)) ||
                         smtpe__command_split(s->line.buf, s->line.len, &verb, &arg) !=
                             SMTPE__VERB_RCPT ||
                         rcpts_counted(s) >= s->cfg->max_recipients)) {
        s->parked = 1;
        buf_set(s, s->cur, BUF_PARKED, 0);
        return;
    }
    run_line(s);
}

/* Executes the line dispatch_line parked once no reply is owed and no event waits. */
static void resume(smtpe_server *s)
{
    if (!s->parked || s->q_len > 0 || s->event_ready || s->closing)
        return;
    s->parked = 0;
    buf_set(s, s->cur, BUF_FREE, 0);
    run_line(s);
}

smtpe_ssize smtpe_server_recv(smtpe_server *s, const uint8_t *buf, size_t len, uint64_t now_ms)
{
    size_t used = 0;
    int progress = 0; /* a command line completed or content arrived */
    if (!s || (!buf && len > 0))
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (s->mode == MODE_TLS_WAIT && !s->closing) { /* RFC 3207 §4.2: never executed */
        s->stats.discarded_octets += len;
        s->stats.octets_in += len;
        return (smtpe_ssize)len;
    }
    while (used < len && reading(s)) {
        if (s->mode == MODE_DATA) {
            used += recv_data(s, buf + used, len - used);
            progress = 1;
            continue;
        }
        if (s->mode == MODE_BDAT || s->mode == MODE_BDAT_SKIP) {
            used += recv_bdat(s, buf + used, len - used);
            progress = 1;
            continue;
        }
        if (s->mode == MODE_PROXY) {
            used += recv_proxy(s, buf + used, len - used);
            continue;
        }
        if (s->line.flags & SMTPE__LINE_DONE)
            line_start(s);
        used += smtpe__line_feed(&s->line, buf + used, len - used, s->cfg->line_ending);
        if (s->line.flags & SMTPE__LINE_DONE) {
            dispatch_line(s);
            progress = 1;
        }
    }
    if (progress) { /* RFC 5321 §4.5.3.2.7: the wait is for the next whole command */
        s->last_activity = now_ms;
        s->timer_restart = 0;
    }
    s->stats.octets_in += used;
    return (smtpe_ssize)used;
}

int smtpe_server_next_event_versioned(smtpe_server *s, int event_version, smtpe_event *ev)
{
    size_t size = LAYOUT_SIZE(event_sizes, event_version);
    if (!s || !ev || !s->event_ready || size == 0)
        return 0;
    if (s->ev.type == SMTPE_EV_DATA_CHUNK) { /* the hot path: copy only what it uses */
        ev->type = SMTPE_EV_DATA_CHUNK;
        ev->abandoned = 0;
        ev->id = 0;
        ev->chunk = s->ev.chunk;
    } else {
        memcpy(ev, &s->ev, size);
        if (smtpe_event_needs_reply(&s->ev))
            s->owed++;
    }
    s->event_ready = 0;
    /* A BDAT chunk whose octets are all in: its end comes next, without waiting for input. */
    if (s->mode == MODE_BDAT && s->bdat_left == 0 &&
        (ev->type == SMTPE_EV_DATA_CHUNK || ev->type == SMTPE_EV_BDAT))
        bdat_chunk_end(s);
    resume(s);
    return 1;
}

int smtpe_event_needs_reply(const smtpe_event *ev)
{
    switch (ev ? ev->type : SMTPE_EV_NONE) {
    case SMTPE_EV_HELO:
    case SMTPE_EV_MAIL:
    case SMTPE_EV_RCPT:
    case SMTPE_EV_DATA:
    case SMTPE_EV_VRFY:
    case SMTPE_EV_EXPN:
    case SMTPE_EV_UNKNOWN:
    case SMTPE_EV_STARTTLS:
    case SMTPE_EV_AUTH:
    case SMTPE_EV_CHUNK_END:
    case SMTPE_EV_PROXY:
    case SMTPE_EV_XCLIENT:
    case SMTPE_EV_XFORWARD:
        return 1;
    case SMTPE_EV_DATA_END:
        return ev->data_end.status == SMTPE_DATA_OK;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------------------------
 * Verdicts
 * ---------------------------------------------------------------------------------------- */

/* The lines of a multi-line reply without enhanced codes, for out_put. */
typedef struct ehlo_lines {
    unsigned code;
    const char *const *lines;
    size_t n;
} ehlo_lines;

static size_t format_ehlo(uint8_t *buf, size_t cap, const void *arg)
{
    const ehlo_lines *e = arg;
    size_t at = 0;
    for (size_t i = 0; i < e->n && at != SIZE_MAX; i++)
        at = smtpe__reply_line(buf, cap, at, e->code, i + 1 == e->n, NULL, e->lines[i],
                               strlen(e->lines[i]));
    return at == SIZE_MAX ? 0 : at;
}

/* The EHLO reply (RFC 5321 §4.1.1.1): the first line, then one line per extension. */
static int ehlo_reply(smtpe_server *s, unsigned code, const char *first)
{
    const smtpe_server_config *c = s->cfg;
    unsigned ext = offered_ext(s);
    char size[40], auth[8 + 200];
    const char *lines[16 + 64];
    size_t n = 0;
    lines[n++] = first;
    if (c->extensions & SMTPE_EXT_PIPELINING)
        lines[n++] = "PIPELINING";
    if (c->extensions & SMTPE_EXT_SIZE) {
        if (c->max_message_size)
            snprintf(size, sizeof size, "SIZE %llu", (unsigned long long)c->max_message_size);
        else
            snprintf(size, sizeof size, "SIZE");
        lines[n++] = size;
    }
    if (c->extensions & SMTPE_EXT_8BITMIME)
        lines[n++] = "8BITMIME";
    if (c->extensions & SMTPE_EXT_SMTPUTF8)
        lines[n++] = "SMTPUTF8";
    if (c->extensions & SMTPE_EXT_ENHANCEDSTATUSCODES)
        lines[n++] = "ENHANCEDSTATUSCODES";
    if (ext & SMTPE_EXT_STARTTLS)
        lines[n++] = "STARTTLS";
    if (auth_offered(s)) {
        snprintf(auth, sizeof auth, "AUTH %s", c->auth_mechanisms);
        lines[n++] = auth;
    }
    if (ext & SMTPE_EXT_CHUNKING)
        lines[n++] = "CHUNKING";
    if (ext & SMTPE_EXT_BINARYMIME)
        lines[n++] = "BINARYMIME";
    if (ext & SMTPE_EXT_DSN)
        lines[n++] = "DSN";
    if (ext & SMTPE_EXT_REQUIRETLS)
        lines[n++] = "REQUIRETLS";
    if (ext & SMTPE_EXT_MT_PRIORITY)
        lines[n++] = "MT-PRIORITY";
    if (ext & SMTPE_EXT_DELIVERBY)
        lines[n++] = "DELIVERBY";
    if (ext & SMTPE_EXT_XCLIENT)
        lines[n++] = "XCLIENT NAME ADDR PORT PROTO HELO LOGIN DESTADDR DESTPORT";
    if (ext & SMTPE_EXT_XFORWARD)
        lines[n++] = "XFORWARD NAME ADDR PORT PROTO HELO IDENT SOURCE";
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        lines[n++] = c->ehlo_extra[i];
    ehlo_lines e = {code, lines, n};
    return out_put(s, 0, format_ehlo, &e);
}

/* "<class>.0.0" for a reply code (RFC 3463 §3.1). buf has 6 octets. */
static const char *default_enhanced(char *buf, unsigned code)
{
    buf[0] = (char)('0' + code / 100 % 10);
    memcpy(buf + 1, ".0.0", 5);
    return buf;
}

static const char *default_text(unsigned code)
{
    return code < 300 ? "Ok" : code < 400 ? "Continue" : code < 500 ? "Try again later" : "Rejected";
}

/* Checks a host's enhanced status code and text. Returns 0 or an SMTPE_ERR_*. */
static int check_reply_args(unsigned code, const char *enhanced, const char *text)
{
    int t = text ? smtpe__reply_text_check(text, strlen(text)) : 0;
    if (enhanced && !smtpe__enhanced_valid(enhanced, code))
        return SMTPE_ERR_INVALID_ARGUMENT;
    return t == 1 ? SMTPE_ERR_INVALID_ARGUMENT : t == 2 ? SMTPE_ERR_REPLY_TOO_LONG : 0;
}

static int code_fits(smtpe_event_type type, unsigned code)
{
    unsigned cls = code / 100;
    if (code < 200 || code > 599)
        return 0;
    switch (type) {
    case SMTPE_EV_DATA:
        return code == 354 || cls >= 4;
    case SMTPE_EV_STARTTLS:
    case SMTPE_EV_XCLIENT:
        return code == 220 || cls >= 4;
    case SMTPE_EV_PROXY:
        return code == 220 || code == 421 || cls == 5;
    case SMTPE_EV_UNKNOWN:
        return 1;
    default:
        return cls != 3;
    }
}

/* What a verdict means for the session (see smtpe_server_reply); q is the command's queue
 * entry (it holds what a MAIL's transaction will be). */
static void apply_verdict(smtpe_server *s, smtpe_event_type type, unsigned code, const held *q)
{
    int ok = code / 100 == 2;
    switch (type) {
    case SMTPE_EV_HELO:
        if (ok)
            s->helo = s->ev.helo.esmtp ? HELO_ESMTP : HELO_SMTP;
        break;
    case SMTPE_EV_MAIL:
        if (ok) {
            s->in_transaction = 1;
            s->smtputf8 = q->smtputf8;
            s->binarymime = q->binarymime;
            s->rcpts = 0;
        }
        break;
    case SMTPE_EV_RCPT:
        if (ok) {
            s->rcpts++;
            s->stats.recipients++;
        }
        break;
    case SMTPE_EV_DATA:
        if (code == 354) {
            s->mode = MODE_DATA;
            smtpe__data_start(&s->data, s->cfg->line_ending, s->cfg->max_message_size,
                              !(s->line.flags & SMTPE__LINE_BARE_END));
        }
        break;
    case SMTPE_EV_DATA_END:
        s->stats.transactions++;
        reset_transaction(s);
        break;
    case SMTPE_EV_CHUNK_END:
        if (!ok) /* RFC 3030 §2: a failed chunk fails the transaction */
            reset_transaction(s);
        break;
    case SMTPE_EV_STARTTLS:
        if (code == 220)
            s->mode = MODE_TLS_WAIT;
        break;
    case SMTPE_EV_AUTH:
        if (ok)
            s->authenticated = 1;
        auth_end(s);
        break;
    case SMTPE_EV_XCLIENT:
        if (code == 220) { /* as after connect (Postfix XCLIENT_README) */
            s->helo = HELO_NONE;
            s->authenticated = 0;
            reset_transaction(s);
        }
        break;
    default:
        break;
    }
    if (code == 421) {
        s->closing = 1;
        drop_owed(s);
    }
}

static void release_held(smtpe_server *s);
static void void_batch(smtpe_server *s);

/* The verdict for the oldest owed reply's event (q_at(s, 0)), whose reply goes out now. */
static int verdict(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    held q = *q_at(s, 0);
    smtpe_event_type type = q.type;
    char enh[8];
    int r;
    if ((type == SMTPE_EV_PROXY || type == SMTPE_EV_XCLIENT) && code == 220) {
        r = greeting(s, text ? text : s->cfg->greeting_text);
    } else if (type == SMTPE_EV_PROXY) { /* refused: like smtpe_server_close */
        return smtpe_server_close(s, code, enhanced, text);
    } else if (type == SMTPE_EV_HELO && code / 100 == 2) {
        const char *first = text ? text : s->cfg->hostname;
        r = s->ev.helo.esmtp ? ehlo_reply(s, code, first)
                             : out_reply(s, code, NULL, first, strlen(first), 0);
    } else {
        if (!enhanced)
            enhanced = default_enhanced(enh, code);
        if (!text)
            text = default_text(code);
        if (type == SMTPE_EV_HELO)
            enhanced = NULL;
        r = emit(s, code, enhanced, text);
    }
    if (r != 0)
        return r;
    if (type == SMTPE_EV_AUTH)
        auth_end(s); /* wipe now, even when the reply closed the session (error limit) */
    s->timer_restart = 1;
    if (s->closing && code != 421) /* the error limit: the 421 went out instead */
        return 0;
    if (type == SMTPE_EV_DATA_END && s->lmtp_left > 1 && code != 421) {
        s->lmtp_left--; /* LMTP: the next recipient's verdict is still owed */
        return 0;
    }
    s->lmtp_left = 0;
    q_pop(s);
    buf_set(s, q.buf, BUF_FREE, 0);
    s->owed--;
    apply_verdict(s, type, code, &q);
    if (type == SMTPE_EV_MAIL && code / 100 != 2)
        void_batch(s);
    release_held(s);
    resume(s);
    return 0;
}

/* Formats a reply into a held command's line buffer b (with write 0: measures it). Returns
 * its length, or 0 if it does not fit there (concurrent verdicts: a reply to MAIL or RCPT
 * takes at most buf_size octets). */
static size_t held_format(smtpe_server *s, unsigned b, int write, unsigned code,
                          const char *enhanced, const char *text)
{
    char enh[8];
    size_t len, n;
    if (!enhanced)
        enhanced = default_enhanced(enh, code);
    if (!text)
        text = default_text(code);
    enhanced = enhanced_for(s, code, enhanced);
    len = strlen(text);
    n = smtpe__reply_format(NULL, SIZE_MAX, code, enhanced, text, len);
    if (n == 0 || n > s->buf_size || !write)
        return n > s->buf_size ? 0 : n;
    return smtpe__reply_format(buf_at(s, b), n, code, enhanced, text, len);
}

/* A verdict given before an earlier reply: it waits in the command's line buffer (the event's
 * spans die with the verdict) until release_held sends it in its turn. */
static int hold_verdict(smtpe_server *s, held *q, unsigned code, const char *enhanced,
                        const char *text)
{
    size_t n = held_format(s, q->buf, 1, code, enhanced, text);
    if (n == 0)
        return SMTPE_ERR_REPLY_TOO_LONG;
    s->q_rcpts -= (unsigned)q_counted(q);
    q->type = SMTPE_EV_NONE;
    q->code = code;
    q->len = (uint16_t)n;
    s->q_rcpts += (unsigned)q_counted(q);
    buf_set(s, q->buf, BUF_HELD, 0);
    s->owed--;
    s->timer_restart = 1;
    return 0;
}

/* Sends the held replies that are now the oldest owed, in order (RFC 2920 §3.1), with what
 * their verdicts mean. */
static void release_held(smtpe_server *s)
{
    while (!s->closing && s->q_len > 0 && q_at(s, 0)->type == SMTPE_EV_NONE) {
        held q = *q_at(s, 0);
        uint8_t *p;
        if (error_limit(s, q.code))
            return;
        if ((p = out_take(s, q.len, 0)) == NULL)
            return; /* not for want of room: input_room_ok kept it for every owed reply */
        memcpy(p, buf_at(s, q.buf), q.len);
        q_pop(s);
        buf_set(s, q.buf, BUF_FREE, 0);
        if (q.kind == KIND_RCPT)
            apply_verdict(s, SMTPE_EV_RCPT, q.code, &q);
    }
}

/* The MAIL that the owed RCPTs belong to was refused (RFC 2920 §3.1): each is answered
 * 503 5.5.1, as without pipelining, whatever its verdict. A RCPT whose event the host has not
 * taken yet is forgotten; one whose verdict is still owed keeps its line buffer (the spans the
 * host holds) until that verdict, which then changes nothing. */
static void void_batch(smtpe_server *s)
{
    while (!s->closing && s->q_len > 0) {
        held q = *q_at(s, 0);
        q_pop(s);
        if (q.type == SMTPE_EV_NONE || (s->event_ready && s->ev.id == q.id)) {
            if (q.type != SMTPE_EV_NONE)
                s->event_ready = 0; /* never taken: it never happened */
            buf_set(s, q.buf, BUF_FREE, 0);
        } else {
            buf_set(s, q.buf, BUF_VOID, q.id);
            s->owed_void++;
        }
        (void)emit(s, 503, "5.5.1", "Need MAIL command");
    }
}

/* The owed verdict of the taken event id (0: the oldest owed): its queue entry in *q, or for a
 * voided RCPT its line buffer in *vb with *q NULL. Returns the event's type, or SMTPE_EV_NONE if
 * no such verdict is owed. */
static smtpe_event_type find_owed(smtpe_server *s, uint64_t id, held **q, unsigned *vb)
{
    *q = NULL;
    if (s->closing)
        return SMTPE_EV_NONE;
    if (s->owed_void > 0) { /* voided RCPTs come before every command in the queue */
        unsigned best = s->npend;
        for (unsigned i = 0; i < s->npend; i++)
            if (s->lbuf[i].use == BUF_VOID &&
                (id != 0 ? s->lbuf[i].id == id
                         : best == s->npend || s->lbuf[i].id < s->lbuf[best].id))
                best = i;
        if (best < s->npend) {
            *vb = best;
            return SMTPE_EV_RCPT;
        }
    }
    for (unsigned i = 0; i < s->q_len; i++) {
        held *h = q_at(s, i);
        if (h->type == SMTPE_EV_NONE || (id != 0 && h->id != id))
            continue;
        if (s->event_ready && s->ev.id == h->id)
            return SMTPE_EV_NONE; /* not taken yet */
        *q = h;
        return h->type;
    }
    return SMTPE_EV_NONE;
}

/* Checks a verdict's arguments for an event of type. Returns 0 or an SMTPE_ERR_*. */
static int verdict_args(const smtpe_server *s, smtpe_event_type type, unsigned code,
                        const char *enhanced, const char *text)
{
    int r = code_fits(type, code) ? check_reply_args(code, enhanced, text)
                                  : SMTPE_ERR_INVALID_ARGUMENT;
    if (r == 0 && type == SMTPE_EV_HELO && text && strchr(text, '\n'))
        r = SMTPE_ERR_INVALID_ARGUMENT; /* the first line of the EHLO reply is one line */
    if (r == 0 && type == SMTPE_EV_DATA_END && s->cfg->lmtp && text && strchr(text, '\n'))
        r = SMTPE_ERR_INVALID_ARGUMENT; /* LMTP: one line per recipient (its room is kept) */
    return r;
}

/* Gives the verdict for the owed event id (0: the oldest); the arguments are checked unless
 * they are the engine's own defaults (host 0). */
static int give_verdict(smtpe_server *s, uint64_t id, int host, unsigned code,
                        const char *enhanced, const char *text)
{
    held *q;
    unsigned vb = 0;
    smtpe_event_type type = find_owed(s, id, &q, &vb);
    int r;
    if (type == SMTPE_EV_NONE)
        return SMTPE_ERR_STATE;
    r = host ? verdict_args(s, type, code, enhanced, text) : 0;
    if (r != 0)
        return r;
    if (!q) { /* a voided RCPT: answered 503 already */
        buf_set(s, vb, BUF_FREE, 0);
        s->owed_void--;
        s->owed--;
        s->timer_restart = 1;
        resume(s);
        return SMTPE_VOIDED;
    }
    if (q != q_at(s, 0))
        return hold_verdict(s, q, code, enhanced, text);
    if (s->npend > 1 && q->kind != KIND_OTHER &&
        held_format(s, q->buf, 0, code, enhanced, text) == 0) /* the bound held replies have */
        return SMTPE_ERR_REPLY_TOO_LONG;
    return verdict(s, code, enhanced, text);
}

/* The default positive verdict for the owed event id (0: the oldest). */
static int give_accept(smtpe_server *s, uint64_t id)
{
    char text[48];
    held *q;
    unsigned vb = 0;
    switch (find_owed(s, id, &q, &vb)) {
    case SMTPE_EV_STARTTLS:
        return give_verdict(s, id, 0, 220, "2.0.0", "Ready to start TLS");
    case SMTPE_EV_AUTH:
        return give_verdict(s, id, 0, 235, "2.7.0", "Authentication successful");
    case SMTPE_EV_CHUNK_END:
        snprintf(text, sizeof text, "%llu octets received", (unsigned long long)s->bdat_size);
        return give_verdict(s, id, 0, 250, "2.0.0", text);
    case SMTPE_EV_PROXY:
    case SMTPE_EV_XCLIENT:
        return give_verdict(s, id, 0, 220, NULL, NULL);
    case SMTPE_EV_XFORWARD:
        return give_verdict(s, id, 0, 250, "2.0.0", "Ok");
    case SMTPE_EV_HELO:
        return give_verdict(s, id, 0, 250, NULL, NULL);
    case SMTPE_EV_MAIL:
        return give_verdict(s, id, 0, 250, "2.1.0", "Ok");
    case SMTPE_EV_RCPT:
        return give_verdict(s, id, 0, 250, "2.1.5", "Ok");
    case SMTPE_EV_DATA:
        return give_verdict(s, id, 0, 354, NULL, "End data with <CR><LF>.<CR><LF>");
    case SMTPE_EV_DATA_END:
        return give_verdict(s, id, 0, 250, "2.0.0", "Ok");
    case SMTPE_EV_VRFY:
        return give_verdict(s, id, 0, 252, "2.5.0",
                            "Cannot VRFY user, but will accept message and attempt delivery");
    case SMTPE_EV_EXPN:
        return give_verdict(s, id, 0, 252, "2.5.0", "Cannot EXPN list");
    case SMTPE_EV_UNKNOWN:
        return give_verdict(s, id, 0, 500, "5.5.1", "Command unrecognized");
    default:
        return SMTPE_ERR_STATE;
    }
}

int smtpe_server_reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    return s ? give_verdict(s, 0, 1, code, enhanced, text) : SMTPE_ERR_INVALID_ARGUMENT;
}

int smtpe_server_accept(smtpe_server *s)
{
    return s ? give_accept(s, 0) : SMTPE_ERR_INVALID_ARGUMENT;
}

int smtpe_server_reply_id(smtpe_server *s, uint64_t id, unsigned code, const char *enhanced,
                          const char *text)
{
    if (!s || id == 0)
        return s ? SMTPE_ERR_STATE : SMTPE_ERR_INVALID_ARGUMENT;
    return give_verdict(s, id, 1, code, enhanced, text);
}

int smtpe_server_accept_id(smtpe_server *s, uint64_t id)
{
    if (!s || id == 0)
        return s ? SMTPE_ERR_STATE : SMTPE_ERR_INVALID_ARGUMENT;
    return give_accept(s, id);
}

int smtpe_server_close(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    char enh[8];
    int r;
    if (!s || (code != 221 && code != 421 && (code < 500 || code > 599)))
        return SMTPE_ERR_INVALID_ARGUMENT;
    r = check_reply_args(code, enhanced, text);
    if (r != 0)
        return r;
    if (s->closing)
        return SMTPE_ERR_STATE;
    if (!s->out_lent) /* nothing handed out yet: the reply replaces the greeting */
        s->a_off = s->a_end = s->b_end = 0;
    if (!enhanced)
        enhanced = default_enhanced(enh, code);
    if (!text)
        text = default_text(code);
    if (out_reply(s, code, enhanced, text, strlen(text), 1) != 0) /* no room for the text */
        (void)out_reply(s, code, enhanced, default_text(code), strlen(default_text(code)), 1);
    drop_owed(s);
    s->closing = 1;
    if (s->auth != AUTH_NONE)
        auth_end(s); /* wipe credentials a dropped AUTH verdict left */
    return 0;
}

int smtpe_server_tls_started(smtpe_server *s, uint64_t now_ms)
{
    if (!s)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (s->tls || s->closing)
        return SMTPE_ERR_STATE;
    if (s->mode == MODE_TLS_WAIT) {
        if (out_pending(s) > 0)
            return SMTPE_ERR_STATE; /* the 220 must go out in the clear first */
        /* RFC 3207 §4.2: discard all knowledge from the client; no new greeting */
        s->helo = HELO_NONE;
        s->authenticated = 0;
        reset_transaction(s);
        smtpe__line_reset(&s->line);
        s->mode = MODE_COMMAND;
    } else if (s->stats.commands > 0 || s->stats.octets_out > 0 || s->mode != MODE_COMMAND ||
               s->event_ready || s->q_len > 0) {
        return SMTPE_ERR_STATE; /* implicit TLS only before the session has begun */
    }
    s->tls = 1;
    s->last_activity = now_ms;
    s->timer_restart = 0;
    return 0;
}

int smtpe_server_auth_challenge(smtpe_server *s, const uint8_t *data, size_t len)
{
    size_t need;
    held *q;
    uint8_t *p;
    if (!s || (!data && len > 0))
        return SMTPE_ERR_INVALID_ARGUMENT;
    /* the AUTH event is the oldest queued (alone); a voided RCPT's verdict may still be owed */
    if (s->closing || s->q_len == 0 || (q = q_at(s, 0))->type != SMTPE_EV_AUTH ||
        (s->event_ready && s->ev.id == q->id) || s->auth_mech_id != SMTPE_SASL_OTHER)
        return SMTPE_ERR_STATE;
    if (len > 1536)
        return SMTPE_ERR_REPLY_TOO_LONG;
    need = 4 + SMTPE__BASE64_LEN(len) + 2;
    if ((p = out_take(s, need, 0)) == NULL)
        return SMTPE_ERR_REPLY_TOO_LONG;
    memcpy(p, "334 ", 4);
    smtpe__base64_encode(data, len, p + 4);
    memcpy(p + need - 2, "\r\n", 2);
    buf_set(s, q->buf, BUF_FREE, 0);
    q_pop(s);
    s->owed--;
    s->timer_restart = 1;
    auth_end(s); /* wipes the response just handled */
    s->auth = AUTH_OTHER_WAIT;
    return 0;
}

int smtpe_server_set_trusted(smtpe_server *s, int trusted)
{
    if (!s)
        return SMTPE_ERR_INVALID_ARGUMENT;
    s->trusted = trusted != 0;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Output, wants, time
 * ---------------------------------------------------------------------------------------- */

const uint8_t *smtpe_server_send_buf(smtpe_server *s, size_t *len)
{
    if (!s || !len) {
        if (len)
            *len = 0;
        return NULL;
    }
    *len = s->a_end - s->a_off; /* run A; run B follows once A is acknowledged */
    if (*len > 0)
        s->out_lent = 1;
    return s->out + s->a_off;
}

int smtpe_server_send_ack(smtpe_server *s, size_t n)
{
    if (!s || n > s->a_end - s->a_off)
        return SMTPE_ERR_INVALID_ARGUMENT;
    s->a_off += n;
    s->stats.octets_out += n;
    if (s->a_off == s->a_end) { /* run A is out: run B, if any, takes its place */
        s->a_off = 0;
        s->a_end = s->b_end;
        s->b_end = 0;
    }
    return 0;
}

unsigned smtpe_server_want(const smtpe_server *s)
{
    unsigned w = 0;
    if (!s)
        return 0;
    if (out_pending(s) > 0)
        w |= SMTPE_WANT_WRITE;
    if (s->event_ready)
        w |= SMTPE_WANT_EVENT;
    if (s->closing)
        return w | SMTPE_WANT_CLOSE;
    if (s->owed > 0) /* (under TLS_WAIT: a voided RCPT's) */
        w |= SMTPE_WANT_VERDICT;
    if (s->mode == MODE_TLS_WAIT) /* what was read before the handshake is consumed, dropped */
        return w | SMTPE_WANT_TLS | SMTPE_WANT_READ;
    if (reading(s))
        w |= SMTPE_WANT_READ;
    return w;
}

uint64_t smtpe_server_expiry(smtpe_server *s, uint64_t now_ms)
{
    uint64_t t;
    if (!s || s->closing || s->event_ready || s->q_len > 0 || s->owed > 0 || s->parked ||
        s->mode == MODE_TLS_WAIT)
        return UINT64_MAX;
    if (s->timer_restart) { /* a verdict came: the wait for the client starts now */
        s->timer_restart = 0;
        s->last_activity = now_ms;
    }
    t = s->mode == MODE_DATA || s->mode == MODE_BDAT || s->mode == MODE_BDAT_SKIP
            ? s->cfg->data_timeout_ms
            : s->cfg->command_timeout_ms;
    if (t == 0 || s->last_activity > UINT64_MAX - t)
        return UINT64_MAX;
    return s->last_activity + t;
}

int smtpe_server_handle_expiry(smtpe_server *s, uint64_t now_ms)
{
    uint64_t due = smtpe_server_expiry(s, now_ms);
    if (!s || due == UINT64_MAX || now_ms < due)
        return 0;
    if (s->mode == MODE_PROXY) /* no header yet: not an SMTP peer to answer, like PROXY_INVALID */
        s->closing = 1;
    else
        close_with(s, 421, "4.4.2", "Timeout exceeded"); /* RFC 5321 §4.5.3.2 */
    s->abandon = end_transaction(s);
    raise_event(s, SMTPE_EV_TIMEOUT);
    return 1;
}

void smtpe_server_get_stats_versioned(const smtpe_server *s, int stats_version,
                                      smtpe_server_stats *st)
{
    smtpe_server_stats v;
    size_t size = LAYOUT_SIZE(stats_sizes, stats_version);
    if (!s || !st || size == 0)
        return;
    v = s->stats;
    v.tls = s->tls;
    v.authenticated = s->authenticated;
    memcpy(st, &v, size);
}

uint32_t smtpe_version(void)
{
    return SMTPE_VERSION_NUM;
}

const char *smtpe_version_string(void)
{
    return SMTPE_VERSION_STRING;
}

const char *smtpe_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case SMTPE_VOIDED:
        return "verdict for a RCPT its MAIL's refusal voided (not an error)";
    case SMTPE_ERR_INVALID_ARGUMENT:
        return "invalid argument";
    case SMTPE_ERR_STATE:
        return "call does not fit the session state";
    case SMTPE_ERR_REPLY_TOO_LONG:
        return "reply too long";
    case SMTPE_ERR_BUFFER_TOO_SMALL:
        return "buffer too small";
    case SMTPE_ERR_NOMEM:
        return "out of memory";
    case SMTPE_ERR_CONFIG:
        return "invalid configuration";
    default:
        return "unknown error";
    }
}
