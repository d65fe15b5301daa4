/* client.c - the SMTP / LMTP client session state machine.
 *
 * RFC 5321 §3 (transactions), §4.1 (commands), §4.2 (replies), §4.3.2 (sequencing), §4.5.2
 * (transparency), §4.5.3.2 (timeouts); RFC 2920 (PIPELINING), RFC 1870 (SIZE), RFC 6152
 * (8BITMIME), RFC 3030 (CHUNKING, BINARYMIME), RFC 6531 (SMTPUTF8), RFC 3207 (STARTTLS),
 * RFC 4954 (AUTH), RFC 7628 (OAUTHBEARER), RFC 2034 / RFC 3463 (enhanced status codes),
 * RFC 3461 (DSN), RFC 8689 (REQUIRETLS), RFC 6710 (MT-PRIORITY), RFC 2852 (DELIVERBY),
 * RFC 2033 (LMTP), the PROXY protocol, Postfix's XCLIENT and XFORWARD.
 *
 * Shape. Every command the engine queues goes into a queue of commands awaiting their reply
 * (sent[]), so each reply is matched to the oldest one (RFC 2920 §3.1); a reply with none
 * outstanding is a protocol error, never matched to a later command. Replies are parsed one
 * line at a time (reply.c) into the session's line buffer. Events go into a small queue; an
 * outcome "run" there stands for the outcomes of a range of recipients (all those a MAIL
 * refusal or the end of the content decides) and yields one event per recipient as the host
 * takes them. The engine parses no further reply while an event waits to be taken, so the
 * spans an event holds (into the line buffer) stay valid until the host's next call.
 * Content is encoded (data.c) straight into the output ring, whose octets never move once
 * queued (stable output), so the engine never holds more of a message than that ring. */
#include "address.h"
#include "command.h"
#include "data.h"
#include "proxy.h"
#include "reply.h"
#include "sasl.h"

#include <stdlib.h>
#include <string.h>

#define LINE_MAX_CMD 512     /* RFC 5321 §4.5.3.1.4: command line, CRLF included */
#define RCPT_LINE_MAX 1012   /* + 500 for NOTIFY and ORCPT (RFC 3461 §5) */
#define MAIL_LINE_MAX 1012   /* + DSN's 100 and the other MAIL parameters, generously */
#define TOKEN_MAX 8192       /* an OAuth bearer token */
#define AUTH_DATA_MAX 8192   /* a host's SASL response */
#define CAP_LINE_MAX 256     /* the AUTH / XCLIENT / XFORWARD keyword lines kept */
#define EVQ_MAX 8            /* queued events: a step queues at most 5 (two runs, DONE,
                                CLOSED and one more), and recv stops at any */
#define ENVID_MAX 100        /* RFC 3461 §4.4 */
#define BDAT_HEAD 32         /* room for "BDAT <20 digits> LAST\r\n" */
#define EXT_MAX 32           /* spans of the host's content in the output at once
                                (smtpe_client_content_ref; beyond them content is copied) */

/* What a queued command is, for matching its reply. */
enum {
    K_GREETING, /* not a command: the greeting is awaited like a reply */
    K_EHLO,     /* EHLO or LHLO */
    K_HELO,
    K_STARTTLS,
    K_XCLIENT,
    K_AUTH,     /* the AUTH command and each response line after a 334 */
    K_RSET,
    K_XFORWARD,
    K_MAIL,
    K_RCPT,     /* arg: the recipient's index */
    K_DATA,
    K_DOT,      /* the end of the content; LMTP: one reply per accepted recipient */
    K_DOT_VOID, /* a lone "." after a 354 no recipient needed */
    K_BDAT,     /* a chunk without LAST */
    K_BDAT_LAST,
    K_QUIT
};

typedef struct sent_cmd {
    uint32_t end; /* c->written (mod 2^32) once its octets were queued: a reply counts only
                     once the host has been handed all of them (c->handed) */
    uint32_t arg;
    uint16_t len; /* octets counted against max_unanswered */
    uint8_t kind;
} sent_cmd;

/* Connection phases. */
enum {
    PH_IMPLICIT, /* waiting for the host's TLS handshake before anything (port 465) */
    PH_SETUP,    /* greeting, EHLO/HELO, STARTTLS, XCLIENT, AUTH */
    PH_TLS_WAIT, /* STARTTLS answered 220: the host runs the handshake */
    PH_READY,    /* ready for transactions */
    PH_QUIT,     /* QUIT sent, waiting for 221 */
    PH_CLOSED
};

/* The next setup command to queue (when output room allows). */
enum { NEXT_NONE, NEXT_EHLO, NEXT_HELO, NEXT_STARTTLS, NEXT_XCLIENT, NEXT_AUTH };

/* Where an AUTH exchange stands. */
enum { SA_IDLE, SA_CMD, SA_LOGIN_USER, SA_LOGIN_PASS, SA_CREDS, SA_ERROR,
       SA_OTHER };

/* Content transfer. */
enum { CT_NONE, CT_WANTED, CT_FINISHING, CT_DONE };

/* Entries of the event queue. */
enum { Q_EVENT, Q_RUN, Q_DONE };

/* An outcome run: the recipients [at, end) that match (all undecided ones, or only accepted
 * undecided ones) get this outcome, one event each. */
typedef struct outcome_run {
    size_t at, end;
    int accepted_only;
    int outcome;   /* SMTPE_OUTCOME_*; 0: from the code's class */
    unsigned code;
    smtpe_span enhanced, text;
    int local, before_mail;
} outcome_run;

typedef struct qent {
    int kind; /* Q_* */
    smtpe_client_event ev; /* Q_EVENT */
    outcome_run r;                 /* Q_RUN */
} qent;

/* The fields a reply or a send touches come first, the config's copy and the cold parts after
 * them, and the reply line buffer right after the struct (client_layout_of): a host with many
 * sessions finds each one's hot state in fewer cache lines. */
struct smtpe_client {

    /* memory after the struct */
    uint8_t *out;
    size_t out_cap;
    sent_cmd *sent;
    size_t sent_cap, sent_head, sent_count;
    uint8_t *accepted, *decided; /* bitmaps, max_recipients bits each */

    smtpe__reply_parser rp;
    uint8_t *line; /* the reply line buffer (rp.buf) */

    /* The output: the octets of the ring, run A [a_off, a_end) then run B [0, b_end) once
     * wrapped, and between them spans of the host's own content (smtpe_client_content_ref):
     * ext[ext_head + i] (i < ext_count, a ring of EXT_MAX) goes out after the ring octet
     * numbered ring_before - 1 (ring octets are numbered in the order queued, ring_written of
     * them so far, ring_acked acknowledged); ext_off octets of the first are acknowledged,
     * ext_held octets of them all are not. */
    size_t a_off, a_end, b_end;
    uint64_t written, acked; /* octets queued and acknowledged, in all (ring and spans) */
    uint64_t handed;         /* octets handed to the host by send_buf/send_iov, in all */
    uint32_t reply_handed, reply_acked; /* handed and acked (mod 2^32, as sent_cmd.end)
                                           when the reply being parsed had its first octet
                                           taken: what it can be answering */
    uint64_t ring_written, ring_acked;
    size_t ext_head, ext_count, ext_off, ext_held; /* the spans: ext[] below */
    smtpe_span reply_enh;    /* the enhanced status code of the reply being handled */
    size_t unanswered;       /* command octets awaiting replies */

    int phase, next;
    int tls, authenticated, xclient_done, tried_starttls;
    smtpe_client_caps caps;
    int stage_enhanced; /* parse enhanced status codes (ENHANCEDSTATUSCODES offered) */
    unsigned auth_offered; /* bit 1 << SMTPE_SASL_* for the engine-run mechanisms offered */
    int auth_cfg_offered;  /* cfg.auth_mechanism is in the AUTH line (however long it is) */

    /* AUTH */
    int auth_mech, auth_state;
    unsigned auth_step;
    int auth_owed;       /* the host owes an AUTH_STEP response */
    size_t auth_chal;    /* where the decoded challenge starts in line[] */
    size_t auth_chal_len;
    int auth_step_ready; /* an AUTH_STEP event is due once the output is out */

    /* XCLIENT: the next attribute to send */
    size_t xclient_at;

    /* the transaction */
    const smtpe_client_txn *txn;
    int tx_active;   /* MAIL (or a local refusal) started */
    int tx_pending;  /* submitted, not started */
    int tx_failed;   /* no content will go: remaining replies of the group are consumed */
    int tx_utf8;     /* SMTPUTF8 needed (a non-ASCII address) */
    int tx_bdat;     /* content by BDAT */
    int tx_body;     /* the BODY= sent (SMTPE_BODY_*) */
    unsigned tx_outstanding; /* commands of the transaction awaiting replies */
    int end_replied; /* the reply (LMTP: every reply) to the end of the content came */
    int lone_dot;    /* a lone "." is owed to a 354 no recipient needed */
    int rset_sent;
    int need_rset;
    size_t xforward_at;
    int mail_sent, mail_ok;
    size_t rcpt_sent, rcpt_replied, n_accepted;
    int data_sent;
    int content;         /* CT_* */
    int content_event;   /* CONTENT given */
    int bdat_out;        /* a BDAT awaits its reply */
    int end_queued;      /* the final dot / LAST chunk is queued */
    uint64_t end_at;     /* c->written once it was */
    unsigned end_replies; /* LMTP: replies still owed to the end of the content */
    size_t lmtp_cursor;  /* LMTP: the next accepted recipient a reply decides */
    smtpe__stuffer st;
    size_t counts[5];    /* outcomes given, by SMTPE_OUTCOME_* */

    int quit_wanted;

    /* events */
    size_t q_head, q_count;

    /* time */
    int restart;
    uint64_t deadline;
    uint64_t timeout_now; /* the timeout that deadline was armed for */

    smtpe_client_config cfg;
    smtpe_allocator alloc;
    int owned;

    /* Not cleared at creation (written before they are read): the event queue's entries, the
     * spans of referenced content and the capability lines kept from the EHLO reply. */
    qent q[EVQ_MAX];
    struct {
        const uint8_t *ptr;
        size_t len;
        uint64_t ring_before;
    } ext[EXT_MAX];
    uint8_t auth_line[CAP_LINE_MAX], xclient_line[CAP_LINE_MAX], xforward_line[CAP_LINE_MAX];
};

static void advance(smtpe_client *c);
static void setup_next(smtpe_client *c);

/* ------------------------------------------------------------------------------------------
 * Configuration and memory
 * ---------------------------------------------------------------------------------------- */

static const size_t client_config_sizes[] = {0, sizeof(smtpe_client_config)};
static const size_t client_event_sizes[] = {0, sizeof(smtpe_client_event)};
static const size_t client_txn_sizes[] = {0, sizeof(smtpe_client_txn)};
#define LAYOUT_SIZE(sizes, v)                                                                   \
    ((v) >= 1 && (size_t)(v) < sizeof sizes / sizeof *sizes ? sizes[v] : 0)

static void client_config_defaults(smtpe_client_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->helo_name = "localhost";
    cfg->tls = SMTPE_TLS_NONE;
    cfg->chunking = 1;
    cfg->pipelining = 1;
    cfg->line_ending = SMTPE_LINE_ENDING_NORMALISE;
    cfg->max_reply_line = 2048;
    cfg->max_reply_size = 65536;
    cfg->output_buffer_size = 16384;
    cfg->max_unanswered = 4096;
    cfg->max_recipients = 1000;
    cfg->greeting_timeout_ms = 300000;
    cfg->command_timeout_ms = 300000;
    cfg->data_timeout_ms = 120000;
    cfg->data_block_timeout_ms = 180000;
    cfg->data_end_timeout_ms = 600000;
}

void smtpe_client_config_init_versioned(int config_version, smtpe_client_config *cfg)
{
    smtpe_client_config d;
    size_t size = LAYOUT_SIZE(client_config_sizes, config_version);
    if (!cfg || size == 0)
        return;
    client_config_defaults(&d);
    memcpy(cfg, &d, size);
}

static int client_config_latest(int config_version, const smtpe_client_config *cfg,
                         smtpe_client_config *out)
{
    size_t size = LAYOUT_SIZE(client_config_sizes, config_version);
    if (size == 0)
        return 0;
    client_config_defaults(out);
    memcpy(out, cfg, size);
    return 1;
}

/* 1 if t is at most max octets (before its NUL) and holds no control octet. */
static int clean_string(const char *t, size_t max)
{
    size_t n = 0;
    for (; t[n]; n++)
        if ((unsigned char)t[n] < 0x20 || t[n] == 0x7f || n >= max)
            return 0;
    return 1;
}

/* 1 if name is a domain or address-literal as a mailbox's domain (RFC 5321 §4.1.2). */
static int helo_name_valid(const char *name)
{
    uint8_t buf[SMTPE__MAX_DOMAIN + 8];
    size_t n = strlen(name), used = 0;
    smtpe_path p;
    int r;
    if (n == 0 || n > SMTPE__MAX_DOMAIN)
        return 0;
    for (size_t i = 0; i < n; i++) /* ASCII: EHLO comes before the server's SMTPUTF8, and
                                      RFC 5321's Domain is ASCII (a U-label goes as its
                                      A-label, RFC 5890) */
        if ((uint8_t)name[i] >= 0x80)
            return 0;
    memcpy(buf, "<a@", 3);
    memcpy(buf + 3, name, n);
    buf[3 + n] = '>';
    /* as a mailbox's domain; the path may pass 256 octets (TOO_LONG comes only after the
     * grammar was met): a domain of up to 255 octets is a valid EHLO argument */
    r = smtpe__parse_path(buf, n + 4, 0, &p, &used);
    return (r == SMTPE__PATH_OK || r == SMTPE__PATH_TOO_LONG) && used == n + 4 &&
           p.domain.len == n;
}

/* 1 if s is an esmtp-keyword / xtext attribute name: ALPHA / DIGIT / "-", 1..32 octets. */
static int keyword_valid(smtpe_span s)
{
    if (s.len == 0 || s.len > 32)
        return 0;
    for (size_t i = 0; i < s.len; i++) {
        uint8_t ch = s.ptr[i];
        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
              ch == '-'))
            return 0;
    }
    return 1;
}

static int params_valid(const smtpe_param *p, size_t count)
{
    if (count > 0 && !p)
        return 0;
    for (size_t i = 0; i < count; i++) {
        if (!p[i].keyword.ptr || !keyword_valid(p[i].keyword) ||
            (p[i].value.len > 0 && !p[i].value.ptr) || p[i].value.len > 255)
            return 0;
        for (size_t j = 0; j < p[i].value.len; j++)
            if (p[i].value.ptr[j] < 0x20 || p[i].value.ptr[j] == 0x7f)
                return 0;
    }
    return 1;
}

static size_t plain_len(const smtpe_client_config *cfg)
{
    size_t z = cfg->auth_authzid ? strlen(cfg->auth_authzid) : 0;
    return z + 1 + strlen(cfg->auth_user) + 1 + strlen(cfg->auth_password);
}

/* The octets of the SASL message an engine-run mechanism sends (before base64). */
static size_t oauth_len(const smtpe_client_config *cfg, int mech);

/* The host-supplied strings of c: 1 if each is well-formed (else SMTPE_ERR_INVALID_ARGUMENT). */
static int config_strings_valid(const smtpe_client_config *c)
{
    if (!c->helo_name || !helo_name_valid(c->helo_name))
        return 0;
    if (!params_valid(c->xclient, c->xclient_count))
        return 0;
    if (c->auth_mechanism) {
        if (!clean_string(c->auth_mechanism, 20)) /* RFC 4422 §3.1 */
            return 0;
        if (c->auth_user && !clean_string(c->auth_user, 255))
            return 0;
        if (c->auth_authzid && !clean_string(c->auth_authzid, 255))
            return 0;
        if (c->auth_password && !clean_string(c->auth_password, 255))
            return 0;
        if (c->auth_token && !clean_string(c->auth_token, TOKEN_MAX))
            return 0;
    }
    return 1;
}

/* The limits and choices of c (else SMTPE_ERR_CONFIG); the strings are valid. */
static int client_config_valid(const smtpe_client_config *c)
{
    if ((unsigned)c->tls > SMTPE_TLS_IMPLICIT)
        return 0;
    if (c->line_ending != SMTPE_LINE_ENDING_NORMALISE && c->line_ending != SMTPE_LINE_ENDING_REFUSE)
        return 0;
    if (c->max_reply_line < 512 || c->max_reply_line > 65536 ||
        c->max_reply_size < c->max_reply_line || c->max_reply_size > 1048576)
        return 0;
    if (c->output_buffer_size < 4096 || c->output_buffer_size > 16777216)
        return 0;
    if (c->chunk_size > c->output_buffer_size - 64)
        return 0;
    if (c->max_unanswered < 512 || c->max_unanswered > 1048576)
        return 0;
    if (c->max_recipients < 1 || c->max_recipients > 100000)
        return 0;
    if (c->auth_mechanism) {
        /* every engine-run SASL line must fit the output buffer whole */
        if (c->auth_user && c->auth_password &&
            SMTPE__BASE64_LEN(plain_len(c)) + 64 > c->output_buffer_size)
            return 0;
        if (c->auth_user && c->auth_token &&
            SMTPE__BASE64_LEN(oauth_len(c, SMTPE_SASL_OAUTHBEARER)) + 64 > c->output_buffer_size)
            return 0;
    }
    if (c->proxy && c->proxy->version != 1 && c->proxy->version != 2)
        return 0;
    return 1;
}

typedef struct client_layout {
    size_t sent, bits, line, out, total, sent_cap, bits_len;
} client_layout;

#define ALIGN_UP(n)                                                                             \
    (((n) + _Alignof(max_align_t) - 1) / _Alignof(max_align_t) * _Alignof(max_align_t))

/* The layout for c, whose strings the caller has checked (config_strings_valid). */
static int client_layout_of(const smtpe_client_config *c, client_layout *l)
{
    if (!client_config_valid(c))
        return 0;
    l->sent_cap = c->max_unanswered / 6 + 8;
    l->bits_len = ((size_t)c->max_recipients + 7) / 8;
    l->line = ALIGN_UP(sizeof(smtpe_client)); /* next to the struct: touched by every reply */
    l->out = l->line + c->max_reply_line;
    l->sent = ALIGN_UP(l->out + c->output_buffer_size);
    l->bits = l->sent + l->sent_cap * sizeof(sent_cmd);
    l->total = ALIGN_UP(l->bits + 2 * l->bits_len);
    return 1;
}

size_t smtpe_client_memory_size_versioned(int config_version, const smtpe_client_config *cfg)
{
    smtpe_client_config c;
    client_layout l;
    if (!cfg || !client_config_latest(config_version, cfg, &c) || !config_strings_valid(&c))
        return 0;
    return client_layout_of(&c, &l) ? l.total : 0;
}

/* ------------------------------------------------------------------------------------------
 * Output ring (stable: queued octets never move until acknowledged)
 * ---------------------------------------------------------------------------------------- */

/* The contiguous room where the next output goes, and whether it starts run B. */
static uint8_t *out_where(smtpe_client *c, size_t *room, int *to_b)
{
    *to_b = 0;
    if (c->b_end > 0) {
        *room = c->a_off - c->b_end;
        return c->out + c->b_end;
    }
    if (c->a_off == c->a_end) { /* nothing unsent: start over at the beginning */
        c->a_off = c->a_end = 0;
    }
    size_t tail = c->out_cap - c->a_end;
    if (tail >= c->a_off || c->a_end == 0) {
        *room = tail;
        return c->out + c->a_end;
    }
    *to_b = 1;
    *room = c->a_off;
    return c->out;
}

static void out_put_done(smtpe_client *c, int to_b, size_t n)
{
    if (to_b || c->b_end > 0)
        c->b_end += n;
    else
        c->a_end += n;
    c->written += n;
    c->ring_written += n;
}

/* Queues p[0..n) of the host's content by reference, after everything queued so far. The
 * caller has checked that a slot is free. */
static void ext_push(smtpe_client *c, const uint8_t *p, size_t n)
{
    size_t i;
    if (c->ext_count == 0) {
        c->ext_head = 0; /* the same few entries (cache lines) for every message */
        c->ext_off = 0;
    }
    i = (c->ext_head + c->ext_count++) % EXT_MAX;
    c->ext[i].ptr = p;
    c->ext[i].len = n;
    c->ext[i].ring_before = c->ring_written;
    c->ext_held += n;
    c->written += n;
}

/* The output not yet acknowledged, in order, as up to max spans into iov (the ring's octets
 * and the host's spans between them). Returns the spans given; *total their octets. */
static size_t out_spans(const smtpe_client *c, smtpe_span *iov, size_t max, size_t *total)
{
    size_t n = 0, e = 0, skip = c->ext_off, run = c->a_end - c->a_off, b = c->b_end;
    const uint8_t *rp = c->out + c->a_off;
    uint64_t rpos = c->ring_acked;
    *total = 0;
    while (n < max) {
        size_t k, lim = SIZE_MAX;
        if (e < c->ext_count) {
            size_t x = (c->ext_head + e) % EXT_MAX;
            if (c->ext[x].ring_before == rpos) { /* a span of the host's comes first */
                iov[n].ptr = c->ext[x].ptr + skip;
                iov[n].len = c->ext[x].len - skip;
                *total += iov[n++].len;
                skip = 0;
                e++;
                continue;
            }
            lim = (size_t)(c->ext[x].ring_before - rpos);
        }
        if (run == 0) { /* run A is listed: run B, if any, follows */
            if (b == 0)
                break;
            rp = c->out;
            run = b;
            b = 0;
        }
        k = run < lim ? run : lim;
        iov[n].ptr = rp;
        iov[n].len = k;
        *total += iov[n++].len;
        rp += k;
        run -= k;
        rpos += k;
    }
    return n;
}

/* Acknowledges n octets of the output (the caller has checked n <= handed - acked). */
static void out_ack(smtpe_client *c, size_t n)
{
    c->acked += n;
    while (n > 0) {
        size_t k;
        if (c->ext_count > 0 && c->ext[c->ext_head].ring_before == c->ring_acked) {
            size_t left = c->ext[c->ext_head].len - c->ext_off;
            k = n < left ? n : left;
            c->ext_off += k;
            c->ext_held -= k;
            if (c->ext_off == c->ext[c->ext_head].len) {
                c->ext_head = (c->ext_head + 1) % EXT_MAX;
                c->ext_count--;
                c->ext_off = 0;
            }
        } else {
            size_t lim = c->a_end - c->a_off;
            if (c->ext_count > 0 && c->ext[c->ext_head].ring_before - c->ring_acked < lim)
                lim = (size_t)(c->ext[c->ext_head].ring_before - c->ring_acked);
            k = n < lim ? n : lim;
            c->a_off += k;
            c->ring_acked += k;
            if (c->a_off == c->a_end) {
                c->a_off = 0;
                c->a_end = c->b_end;
                c->b_end = 0;
            }
        }
        n -= k;
    }
}

/* Contiguous room for at least need octets, or NULL. */
static uint8_t *out_reserve(smtpe_client *c, size_t need, size_t *room, int *to_b)
{
    uint8_t *p = out_where(c, room, to_b);
    if (*room >= need)
        return p;
    if (!*to_b && c->b_end == 0 && c->a_off > 0 && c->a_off >= need) { /* try run B instead */
        *to_b = 1;
        *room = c->a_off;
        return c->out;
    }
    return NULL;
}

static size_t out_unsent(const smtpe_client *c)
{
    return c->a_end - c->a_off + c->b_end + c->ext_held;
}

/* ------------------------------------------------------------------------------------------
 * Events
 * ---------------------------------------------------------------------------------------- */

static qent *ev_push(smtpe_client *c, int kind)
{
    qent *e;
    if (c->q_count == EVQ_MAX) /* cannot happen: at most two runs, DONE and CLOSED per step */
        return NULL;
    if (c->q_count == 0)
        c->q_head = 0; /* the same few entries (cache lines) for every step */
    e = &c->q[(c->q_head + c->q_count++) % EVQ_MAX];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    return e;
}

static void q_event(smtpe_client *c, smtpe_client_event_type type)
{
    qent *e = ev_push(c, Q_EVENT);
    if (e)
        e->ev.type = type;
}

static smtpe_span span_of(const char *s)
{
    smtpe_span sp = {(const uint8_t *)s, s ? strlen(s) : 0};
    return sp;
}

/* Queues outcomes for the recipients [at, end) not yet decided (accepted_only: and accepted). */
static outcome_run *q_run(smtpe_client *c, size_t at, size_t end, int accepted_only, int outcome,
                  unsigned code, smtpe_span enhanced, smtpe_span text, int local)
{
    qent *e;
    if (at >= end || !(e = ev_push(c, Q_RUN)))
        return NULL;
    e->r.at = at;
    e->r.end = end;
    e->r.accepted_only = accepted_only;
    e->r.outcome = outcome;
    e->r.code = code;
    e->r.enhanced = enhanced;
    e->r.text = text;
    e->r.local = local;
    return &e->r;
}

static int bit_get(const uint8_t *b, size_t i)
{
    return (b[i / 8] >> (i % 8)) & 1;
}

static void bit_set(uint8_t *b, size_t i)
{
    b[i / 8] = (uint8_t)(b[i / 8] | (1u << (i % 8)));
}

static int outcome_of_code(unsigned code)
{
    if (code / 100 == 2)
        return SMTPE_OUTCOME_DELIVERED;
    if (code / 100 == 5)
        return SMTPE_OUTCOME_PERMANENT;
    return SMTPE_OUTCOME_TEMPORARY;
}

/* The next outcome of run r into *ev; 0 when the run is exhausted. */
static int run_next(smtpe_client *c, outcome_run *r, smtpe_client_event *ev)
{
    for (; r->at < r->end; r->at++) {
        size_t i = r->at;
        if (bit_get(c->decided, i) || (r->accepted_only && !bit_get(c->accepted, i)))
            continue;
        bit_set(c->decided, i);
        r->at++;
        memset(ev, 0, sizeof *ev);
        ev->type = SMTPE_CEV_OUTCOME;
        ev->outcome.index = i;
        ev->outcome.outcome = r->outcome ? r->outcome : outcome_of_code(r->code);
        ev->outcome.code = r->code;
        ev->outcome.enhanced = r->enhanced;
        ev->outcome.text = r->text;
        ev->outcome.local = r->local;
        ev->outcome.before_mail = r->before_mail;
        c->counts[ev->outcome.outcome]++;
        return 1;
    }
    return 0;
}

/* Queues TRANSACTION_DONE; reusable: whether the connection may carry another transaction,
 * fixed now (so the event does not depend on what is parsed before the host takes it). */
static void q_done(smtpe_client *c, int reusable)
{
    qent *e = ev_push(c, Q_DONE);
    if (e)
        e->ev.done.reusable = reusable;
}

/* ------------------------------------------------------------------------------------------
 * The end of the session
 * ---------------------------------------------------------------------------------------- */

static void txn_clear(smtpe_client *c)
{
    c->txn = NULL;
    c->tx_active = c->tx_pending = c->tx_failed = c->tx_utf8 = c->tx_bdat = 0;
    c->mail_sent = c->mail_ok = 0;
    c->rcpt_sent = c->rcpt_replied = c->n_accepted = 0;
    c->data_sent = c->content = c->content_event = c->bdat_out = c->end_queued = 0;
    c->end_at = 0;
    c->end_replies = 0;
    c->end_replied = c->lone_dot = c->rset_sent = 0;
    c->tx_outstanding = 0;
    c->tx_body = SMTPE_BODY_UNSPECIFIED;
    c->lmtp_cursor = 0;
    c->xforward_at = 0;
    memset(c->counts, 0, sizeof c->counts);
}

/* Decides every recipient still open: unknown if the end of its content went out (RFC 5321
 * §4.5.3.2.6), else temporary; code and text from the reply that ended it, if one did. Queues
 * TRANSACTION_DONE (not reusable). */
static void fail_open_txn(smtpe_client *c, unsigned code, smtpe_span text, int local,
                          int outcome, uint64_t sent)
{
    smtpe_span none = {NULL, 0};
    if (!c->txn || (!c->tx_active && !c->tx_pending))
        return;
    if (c->end_queued && sent >= c->end_at) {
        /* the end of the content went out and no reply to it decided these recipients:
         * whatever ended the session, the server may have taken the message */
        outcome = SMTPE_OUTCOME_UNKNOWN;
        if (code)
            text = span_of("no reply to the end of the content");
        code = 0;
        local = 1;
    } else if (outcome)
        ;
    else if (code / 100 == 5)
        outcome = SMTPE_OUTCOME_PERMANENT;
    else
        outcome = SMTPE_OUTCOME_TEMPORARY;
    q_run(c, 0, c->txn->rcpt_count, 0, outcome, code, code ? c->reply_enh : none, text, local);
    q_done(c, 0);
    c->tx_active = c->tx_pending = 0;
    c->content = CT_NONE;
}

/* Drops the output the host has not been handed yet (the octets it has stay stable). */
static void out_drop_unhanded(smtpe_client *c)
{
    size_t keep = (size_t)(c->handed - c->acked), e = 0, ring_keep = 0, skip = c->ext_off;
    size_t ring_unsent = c->a_end - c->a_off + c->b_end, a = c->a_end - c->a_off;
    uint64_t rpos = c->ring_acked;
    c->ext_held = 0;
    while (keep > 0) { /* the handed prefix, through the ring and the spans as out_spans */
        size_t k, lim = ring_unsent - ring_keep;
        if (e < c->ext_count) {
            size_t x = (c->ext_head + e) % EXT_MAX;
            if (c->ext[x].ring_before == rpos) {
                size_t left = c->ext[x].len - skip;
                k = keep < left ? keep : left;
                c->ext[x].len = skip + k; /* cut after what was handed */
                c->ext_held += k;
                keep -= k;
                skip = 0;
                e++;
                continue;
            }
            if (c->ext[x].ring_before - rpos < lim)
                lim = (size_t)(c->ext[x].ring_before - rpos);
        }
        k = keep < lim ? keep : lim;
        if (k == 0)
            break; /* cannot happen: handed never passes what was queued */
        ring_keep += k;
        rpos += k;
        keep -= k;
    }
    c->ext_count = e;
    if (ring_keep <= a) {
        c->a_end = c->a_off + ring_keep;
        c->b_end = 0;
    } else {
        c->b_end = ring_keep - a;
    }
    c->ring_written = c->ring_acked + ring_keep;
    c->written = c->handed;
}

/* The connection is gone (or as good as: the server closed its side, and may still read):
 * nothing more goes, so the host is given nothing more to send, and what was written decides
 * (an end of content not yet written must not be written after its recipients were reported
 * temporary: a half-closed server would still read it). */
static void out_drop_unacked(smtpe_client *c)
{
    c->a_end = c->a_off;
    c->b_end = 0;
    c->ext_count = c->ext_off = c->ext_held = 0;
    c->ring_written = c->ring_acked;
    c->written = c->handed = c->acked;
}

static void close_session(smtpe_client *c, int reason, unsigned code, smtpe_span text,
                          int outcome)
{
    qent *e;
    if (c->phase == PH_CLOSED)
        return;
    /* an end of the content the host has not been handed never goes: a recipient reported
     * temporary must not be delivered by what the host sends before it closes */
    int gone = reason == SMTPE_CLOSE_LOST || reason == SMTPE_CLOSE_QUIT;
    /* nothing the host has not been handed goes any more (the commands of a session given
     * up, an end of content: a recipient reported temporary must not be delivered by what
     * the host still sends); quit_and_close queues its QUIT after this */
    if (!gone)
        out_drop_unhanded(c);
    /* the end of the content went out if the host wrote it (the connection is gone) or may
     * still write it (it was handed out) */
    fail_open_txn(c, code, text, code == 0, outcome, gone ? c->acked : c->handed);
    c->phase = PH_CLOSED;
    c->content = CT_NONE;
    e = ev_push(c, Q_EVENT);
    if (e) {
        e->ev.type = SMTPE_CEV_CLOSED;
        e->ev.closed.reason = reason;
        e->ev.closed.code = code;
        e->ev.closed.text = text;
    }
}

static void protocol_error(smtpe_client *c, const char *why)
{
    close_session(c, SMTPE_CLOSE_PROTOCOL_ERROR, 0, span_of(why), 0);
}

/* 1 if a DATA the host was handed awaits its reply: the server may yet answer it 354 and
 * read whatever follows as content. */
static int data_outstanding(const smtpe_client *c)
{
    for (size_t k = 0; k < c->sent_count; k++) {
        const sent_cmd *e = &c->sent[(c->sent_head + k) % c->sent_cap];
        if (e->kind == K_DATA && (int32_t)(e->end - (uint32_t)c->handed) <= 0)
            return 1;
    }
    return 0;
}

/* Ends the session after a refusal that leaves the connection in sync: QUIT is queued (and
 * not waited for) unless content is under way or may be (a pipelined DATA unanswered: a QUIT
 * after it could be read as a line of content). */
static void quit_and_close(smtpe_client *c, int reason, unsigned code, smtpe_span text,
                           int outcome)
{
    size_t room;
    int to_b;
    uint8_t *p;
    int in_content = c->content != CT_NONE || c->end_queued || data_outstanding(c);
    if (c->phase == PH_CLOSED)
        return;
    close_session(c, reason, code, text, outcome);
    if (!in_content && (p = out_reserve(c, 6, &room, &to_b))) {
        memcpy(p, "QUIT\r\n", 6);
        out_put_done(c, to_b, 6);
    }
}

/* ------------------------------------------------------------------------------------------
 * Commands
 * ---------------------------------------------------------------------------------------- */

/* A small writer into a caller buffer. */
typedef struct wr {
    uint8_t *p;
    size_t len, cap;
    int over;
} wr;

static void w_put(wr *w, const void *s, size_t n)
{
    if (w->over || n > w->cap - w->len) {
        w->over = 1;
        return;
    }
    memcpy(w->p + w->len, s, n);
    w->len += n;
}

static void w_str(wr *w, const char *s)
{
    w_put(w, s, strlen(s));
}

static void w_u64(wr *w, uint64_t v)
{
    char d[24];
    size_t i = sizeof d;
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    w_put(w, d + i, sizeof d - i);
}

static void w_xtext(wr *w, const uint8_t *s, size_t n)
{
    size_t k;
    if (w->over)
        return;
    k = smtpe__xtext_encode(s, n, w->p + w->len, w->cap - w->len);
    if (k == SIZE_MAX)
        w->over = 1;
    else
        w->len += k;
}

static int sent_push(smtpe_client *c, int kind, uint32_t arg, size_t len)
{
    sent_cmd *e;
    if (c->sent_count == c->sent_cap)
        return 0;
    e = &c->sent[(c->sent_head + c->sent_count++) % c->sent_cap];
    e->kind = (uint8_t)kind;
    e->arg = arg;
    e->end = (uint32_t)c->written;
    e->len = (uint16_t)(len > 65535 ? 65535 : len);
    c->unanswered += e->len;
    c->restart = 1;
    return 1;
}

/* Whether a command of len octets may be queued now: the queue has a slot, output room, and
 * the pipelining cap allows it (one command is always allowed when none is outstanding). */
static int can_queue(smtpe_client *c, size_t len)
{
    size_t room;
    int to_b;
    if (c->sent_count == c->sent_cap)
        return 0;
    if (c->sent_count > 0 && c->unanswered + len > c->cfg.max_unanswered)
        return 0;
    return out_reserve(c, len, &room, &to_b) != NULL;
}

/* Queues the command line line[0..len) (CRLF included). Returns 1, or 0 if it does not fit
 * now (nothing queued). */
static int queue_line(smtpe_client *c, int kind, uint32_t arg, const uint8_t *line, size_t len)
{
    size_t room;
    int to_b;
    uint8_t *p;
    if (!can_queue(c, len) || !(p = out_reserve(c, len, &room, &to_b)))
        return 0;
    memcpy(p, line, len);
    out_put_done(c, to_b, len);
    return sent_push(c, kind, arg, len);
}

static int queue_text(smtpe_client *c, int kind, const char *text)
{
    return queue_line(c, kind, 0, (const uint8_t *)text, strlen(text));
}

/* ---- MAIL and RCPT lines ---- */

/* The MAIL line for t as sent to a server offering ext (SMTPE_EXT_*), with body the BODY=
 * value to send and utf8 whether SMTPUTF8 goes. Parameters of extensions the server lacks are
 * left out (the refusals before MAIL have ruled out those that may not be). */
static void build_mail(const smtpe_client_txn *t, unsigned ext, int body, int utf8, wr *w)
{
    w_str(w, "MAIL FROM:<");
    w_str(w, t->reverse_path);
    w_str(w, ">");
    int dsn = (ext & SMTPE_EXT_DSN) != 0;
    if (t->has_content_info && (ext & SMTPE_EXT_SIZE)) {
        w_str(w, " SIZE=");
        w_u64(w, t->content.wire_size);
    }
    if (body == SMTPE_BODY_7BIT && (ext & SMTPE_EXT_8BITMIME))
        w_str(w, " BODY=7BIT");
    else if (body == SMTPE_BODY_8BITMIME)
        w_str(w, " BODY=8BITMIME");
    else if (body == SMTPE_BODY_BINARYMIME)
        w_str(w, " BODY=BINARYMIME");
    if (utf8)
        w_str(w, " SMTPUTF8");
    if (dsn && t->ret == SMTPE_RET_FULL)
        w_str(w, " RET=FULL");
    else if (dsn && t->ret == SMTPE_RET_HDRS)
        w_str(w, " RET=HDRS");
    if (dsn && t->envid) {
        w_str(w, " ENVID=");
        w_xtext(w, (const uint8_t *)t->envid, strlen(t->envid));
    }
    if (t->requiretls)
        w_str(w, " REQUIRETLS");
    if (t->has_mt_priority && (ext & SMTPE_EXT_MT_PRIORITY)) {
        w_str(w, " MT-PRIORITY=");
        if (t->mt_priority < 0)
            w_str(w, "-");
        w_u64(w, (uint64_t)(t->mt_priority < 0 ? -t->mt_priority : t->mt_priority));
    }
    if (t->by_mode && (ext & SMTPE_EXT_DELIVERBY)) {
        w_str(w, " BY=");
        if (t->by_time < 0)
            w_str(w, "-");
        w_u64(w, t->by_time < 0 ? (uint64_t)0 - (uint64_t)t->by_time : (uint64_t)t->by_time);
        w_put(w, ";", 1);
        w_put(w, &t->by_mode, 1);
    }
    w_str(w, "\r\n");
}

/* The RCPT line for r; dsn: the server offers DSN (else NOTIFY and ORCPT are left out,
 * RFC 3461 §5.2). */
static void build_rcpt(const smtpe_client_rcpt *r, int dsn, wr *w)
{
    static const char *const names[] = {"NEVER", "SUCCESS", "FAILURE", "DELAY"};
    w_str(w, "RCPT TO:<");
    w_str(w, r->forward_path);
    w_str(w, ">");
    if (dsn && r->notify) {
        int first = 1;
        w_str(w, " NOTIFY=");
        for (unsigned b = 0; b < 4; b++) {
            if (!(r->notify & (1u << b)))
                continue;
            if (!first)
                w_put(w, ",", 1);
            w_str(w, names[b]);
            first = 0;
        }
    }
    if (dsn && r->orcpt) {
        const char *semi = strchr(r->orcpt, ';');
        w_str(w, " ORCPT=");
        w_put(w, r->orcpt, (size_t)(semi - r->orcpt) + 1);
        w_xtext(w, (const uint8_t *)semi + 1, strlen(semi + 1));
    }
    w_str(w, "\r\n");
}

/* ---- checks of submitted transactions ---- */

/* Parses mailbox as a path; sets *utf8. Returns 1 if valid. */
static int path_valid(const char *mailbox, unsigned opts, int *utf8)
{
    uint8_t buf[SMTPE__MAX_PATH + 8];
    size_t n = strlen(mailbox), used;
    smtpe_path p;
    if (n == 0)
        return (opts & SMTPE__PATH_ALLOW_NULL) != 0;
    if (n > SMTPE__MAX_PATH)
        return 0;
    buf[0] = '<';
    memcpy(buf + 1, mailbox, n);
    buf[n + 1] = '>';
    if (smtpe__parse_path(buf, n + 2, opts, &p, &used) != SMTPE__PATH_OK || used != n + 2)
        return 0;
    if (p.flags & SMTPE_PATH_SOURCE_ROUTE)
        return 0;
    if (p.flags & SMTPE_PATH_UTF8)
        *utf8 = 1;
    return 1;
}

static int orcpt_valid(const char *o)
{
    const char *semi;
    smtpe_span type;
    if (!clean_string(o, 600) || !(semi = strchr(o, ';')) || semi[1] == '\0')
        return 0;
    type.ptr = (const uint8_t *)o;
    type.len = (size_t)(semi - o);
    return keyword_valid(type);
}

static int notify_valid(unsigned n)
{
    if (n & ~(unsigned)(SMTPE_NOTIFY_NEVER | SMTPE_NOTIFY_SUCCESS | SMTPE_NOTIFY_FAILURE |
                        SMTPE_NOTIFY_DELAY))
        return 0;
    return !(n & SMTPE_NOTIFY_NEVER) || n == SMTPE_NOTIFY_NEVER;
}

static int txn_valid(smtpe_client *c, const smtpe_client_txn *t, int *utf8)
{
    uint8_t line[RCPT_LINE_MAX + 1];
    wr w = {line, 0, MAIL_LINE_MAX, 0};
    if (!t->reverse_path || !clean_string(t->reverse_path, SMTPE__MAX_PATH + 1) ||
        !path_valid(t->reverse_path, SMTPE__PATH_ALLOW_NULL, utf8))
        return 0;
    if (t->rcpt_count < 1 || t->rcpt_count > c->cfg.max_recipients || !t->rcpts)
        return 0;
    if ((unsigned)t->body > SMTPE_BODY_BINARYMIME || (unsigned)t->ret > SMTPE_RET_HDRS)
        return 0;
    if (t->envid) {
        if (!clean_string(t->envid, 256) ||
            smtpe__xtext_encode((const uint8_t *)t->envid, strlen(t->envid), NULL, 0) > ENVID_MAX)
            return 0;
    }
    if (t->has_mt_priority && (t->mt_priority < -9 || t->mt_priority > 9))
        return 0;
    if (t->by_mode && !((t->by_mode == 'R' && t->by_time > 0) || t->by_mode == 'N'))
        return 0;
    if (t->by_mode && (t->by_time > 999999999 || t->by_time < -999999999))
        return 0;
    if (!params_valid(t->xforward, t->xforward_count))
        return 0;
    for (size_t i = 0; i < t->rcpt_count; i++) {
        const smtpe_client_rcpt *r = &t->rcpts[i];
        wr rw = {line, 0, RCPT_LINE_MAX, 0};
        if (!r->forward_path || !clean_string(r->forward_path, SMTPE__MAX_PATH + 1) ||
            !path_valid(r->forward_path, SMTPE__PATH_ALLOW_POSTMASTER, utf8) ||
            !notify_valid(r->notify) || (r->orcpt && !orcpt_valid(r->orcpt)))
            return 0;
        build_rcpt(r, 1, &rw);
        if (rw.over)
            return 0;
    }
    /* the MAIL line with every parameter it may carry fits */
    build_mail(t, ~0u, SMTPE_BODY_BINARYMIME, 1, &w);
    return !w.over;
}

int smtpe_client_submit_versioned(smtpe_client *c, int txn_version, const smtpe_client_txn *txn)
{
    int utf8 = 0;
    if (!c || !txn || LAYOUT_SIZE(client_txn_sizes, txn_version) == 0)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (c->phase == PH_CLOSED || c->phase == PH_QUIT || c->quit_wanted || c->txn)
        return SMTPE_ERR_STATE;
    if (!txn_valid(c, txn, &utf8))
        return SMTPE_ERR_INVALID_ARGUMENT;
    txn_clear(c);
    c->txn = txn;
    c->tx_pending = 1;
    c->tx_utf8 = utf8;
    advance(c);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Setup: greeting, EHLO, STARTTLS, XCLIENT, AUTH
 * ---------------------------------------------------------------------------------------- */

static int auth_wanted(const smtpe_client *c)
{
    return c->cfg.auth_mechanism != NULL && !c->authenticated;
}

/* 1 if the space-separated list (the span of a capability line) holds the word name (a
 * non-empty span), without regard to case. */
static int list_has(smtpe_span list, smtpe_span name)
{
    size_t i = 0;
    while (i < list.len) {
        size_t j = i;
        while (j < list.len && list.ptr[j] != ' ')
            j++;
        if (j - i == name.len && smtpe__same_ci(list.ptr + i, name.ptr, name.len))
            return 1;
        i = j + 1;
    }
    return 0;
}

static int mech_id(const char *name)
{
    static const char *const names[] = {"", "PLAIN", "LOGIN", "XOAUTH2", "OAUTHBEARER"};
    for (int i = 1; i <= 4; i++)
        if (strlen(name) == strlen(names[i]) &&
            smtpe__has_prefix_ci((const uint8_t *)name, strlen(name), names[i]))
            return i;
    return SMTPE_SASL_OTHER;
}

static const char *mech_name(int id)
{
    static const char *const names[] = {"", "PLAIN", "LOGIN", "XOAUTH2", "OAUTHBEARER"};
    return names[id];
}

/* Chooses the mechanism: the configured one if offered, or the best offered that the
 * credentials allow. Returns 0 and sets c->auth_mech, or -1. */
static int auth_choose(smtpe_client *c)
{
    const smtpe_client_config *k = &c->cfg;
    if (k->auth_mechanism[0]) {
        c->auth_mech = mech_id(k->auth_mechanism);
        if (!c->auth_cfg_offered)
            return -1;
        if ((c->auth_mech == SMTPE_SASL_PLAIN || c->auth_mech == SMTPE_SASL_LOGIN) &&
            (!k->auth_user || !k->auth_password))
            return -1;
        if ((c->auth_mech == SMTPE_SASL_XOAUTH2 || c->auth_mech == SMTPE_SASL_OAUTHBEARER) &&
            (!k->auth_user || !k->auth_token))
            return -1;
        return 0;
    }
    static const int order[] = {SMTPE_SASL_OAUTHBEARER, SMTPE_SASL_XOAUTH2, SMTPE_SASL_PLAIN,
                                SMTPE_SASL_LOGIN};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        int m = order[i];
        int creds = m >= SMTPE_SASL_XOAUTH2 ? k->auth_user && k->auth_token
                                            : k->auth_user && k->auth_password;
        if (creds && (c->auth_offered & (1u << m))) {
            c->auth_mech = m;
            return 0;
        }
    }
    return -1;
}

static size_t oauth_len(const smtpe_client_config *cfg, int mech)
{
    size_t u = strlen(cfg->auth_user), t = strlen(cfg->auth_token), n;
    if (mech == SMTPE_SASL_XOAUTH2) /* user=U ^A auth=Bearer T ^A ^A */
        return 5 + u + 1 + 12 + t + 2;
    n = 0; /* n,a=U, ^A auth=Bearer T ^A ^A, "," and "=" in U escaped as =2C / =3D */
    for (size_t i = 0; i < u; i++)
        n += cfg->auth_user[i] == ',' || cfg->auth_user[i] == '=' ? 3 : 1;
    return 4 + n + 1 + 1 + 12 + t + 2;
}

/* Writes the SASL message of an engine-run mechanism into out (room for its length). */
static size_t sasl_message(const smtpe_client *c, uint8_t *out)
{
    const smtpe_client_config *k = &c->cfg;
    wr w = {out, 0, SIZE_MAX, 0};
    if (c->auth_mech == SMTPE_SASL_PLAIN) {
        if (k->auth_authzid)
            w_str(&w, k->auth_authzid);
        w_put(&w, "", 1);
        w_str(&w, k->auth_user);
        w_put(&w, "", 1);
        w_str(&w, k->auth_password);
    } else if (c->auth_mech == SMTPE_SASL_XOAUTH2) {
        w_str(&w, "user=");
        w_str(&w, k->auth_user);
        w_str(&w, "\001auth=Bearer ");
        w_str(&w, k->auth_token);
        w_str(&w, "\001\001");
    } else { /* OAUTHBEARER, RFC 7628 §3.1: gs2-header "n,a=" saslname "," */
        w_str(&w, "n,a=");
        for (const char *u = k->auth_user; *u; u++)
            w_str(&w, *u == ',' ? "=2C" : *u == '=' ? "=3D" : (char[2]){*u, 0});
        w_str(&w, ",\001auth=Bearer ");
        w_str(&w, k->auth_token);
        w_str(&w, "\001\001");
    }
    return w.len;
}

static size_t sasl_message_len(const smtpe_client *c)
{
    if (c->auth_mech == SMTPE_SASL_PLAIN)
        return plain_len(&c->cfg);
    return oauth_len(&c->cfg, c->auth_mech);
}

/* Queues "<prefix><base64 of data[0..n)>\r\n" as an AUTH line. data NULL: base64 of the
 * engine-run mechanism's message, which is written at the end of the line's room and encoded
 * in place from the front: group g's 4 output octets end before group g + 1's input starts,
 * since the base64 text is a third longer than its input (and the CRLF comes last), so no
 * input octet is overwritten before it is read and every octet of the message is overwritten.
 * Returns 1, or 0 if it does not fit now. */
static int queue_b64_line(smtpe_client *c, const char *prefix, const uint8_t *data, size_t n)
{
    size_t plen = strlen(prefix), room;
    size_t mlen = data ? n : sasl_message_len(c);
    size_t len = plen + SMTPE__BASE64_LEN(mlen) + 2, at = plen;
    int to_b;
    uint8_t *p;
    if (!can_queue(c, len) || !(p = out_reserve(c, len, &room, &to_b)))
        return 0;
    memcpy(p, prefix, plen);
    if (data) {
        smtpe__base64_encode(data, n, p + plen);
    } else {
        uint8_t *msg = p + len - mlen, tmp[3];
        sasl_message(c, msg);
        for (size_t done = 0; done < mlen; done += 3) {
            size_t k = mlen - done < 3 ? mlen - done : 3;
            memcpy(tmp, msg + done, k);
            at += smtpe__base64_encode(tmp, k, p + at);
        }
        memset(tmp, 0, sizeof tmp);
    }
    memcpy(p + len - 2, "\r\n", 2);
    out_put_done(c, to_b, len);
    return sent_push(c, K_AUTH, 0, len);
}

/* What comes after EHLO (or after STARTTLS fell through): STARTTLS, XCLIENT, AUTH or ready. */
static void setup_next(smtpe_client *c)
{
    smtpe_span none = {NULL, 0};
    int want_tls = c->cfg.tls == SMTPE_TLS_OPPORTUNISTIC || c->cfg.tls == SMTPE_TLS_REQUIRED;
    if (!c->tls && want_tls && !c->tried_starttls) {
        if (c->caps.extensions & SMTPE_EXT_STARTTLS) {
            c->next = NEXT_STARTTLS;
            return;
        }
        if (c->cfg.tls == SMTPE_TLS_REQUIRED) {
            quit_and_close(c, SMTPE_CLOSE_TLS_REQUIRED, 0,
                           span_of("TLS is required and the server does not offer STARTTLS"),
                           SMTPE_OUTCOME_TEMPORARY);
            return;
        }
    }
    if (!c->tls && c->cfg.tls == SMTPE_TLS_REQUIRED) {
        quit_and_close(c, SMTPE_CLOSE_TLS_REQUIRED, 0, span_of("TLS is required"),
                       SMTPE_OUTCOME_TEMPORARY);
        return;
    }
    if (c->cfg.xclient_count > 0 && !c->xclient_done && c->caps.xclient.len > 0) {
        c->next = NEXT_XCLIENT;
        return;
    }
    if (auth_wanted(c)) {
        if (!c->tls && !c->cfg.auth_plaintext_ok) {
            quit_and_close(c, SMTPE_CLOSE_AUTH_FAILED, 0,
                           span_of("AUTH without TLS is not allowed"), SMTPE_OUTCOME_TEMPORARY);
            return;
        }
        if (auth_choose(c) < 0) {
            quit_and_close(c, SMTPE_CLOSE_AUTH_FAILED, 0,
                           span_of("the server offers no usable AUTH mechanism"),
                           SMTPE_OUTCOME_TEMPORARY);
            return;
        }
        c->next = NEXT_AUTH;
        return;
    }
    (void)none;
    c->phase = PH_READY;
    {
        qent *e = ev_push(c, Q_EVENT);
        if (e) {
            e->ev.type = SMTPE_CEV_READY;
            e->ev.ready = c->caps;
        }
    }
}

/* Keeps the value of a capability line (mechanism or attribute names) in buf: at most
 * CAP_LINE_MAX octets, cut at a word boundary, without control octets. */
static smtpe_span keep_line(uint8_t *buf, smtpe_span v)
{
    smtpe_span out = {buf, 0};
    size_t n = v.len;
    if (n > CAP_LINE_MAX) {
        n = CAP_LINE_MAX;
        while (n > 0 && v.ptr[n] != ' ')
            n--;
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = v.ptr[i] < 0x20 || v.ptr[i] == 0x7f ? ' ' : v.ptr[i];
    out.len = n;
    return out;
}

/* Notes which mechanisms the AUTH line's list v offers (RFC 4954 §3). */
static void auth_note_offered(smtpe_client *c, smtpe_span v)
{
    size_t i = 0;
    while (i < v.len) {
        size_t j = i;
        char name[24];
        while (j < v.len && v.ptr[j] != ' ')
            j++;
        if (j - i > 0 && j - i < sizeof name) {
            memcpy(name, v.ptr + i, j - i);
            name[j - i] = '\0';
            if (mech_id(name) != SMTPE_SASL_OTHER)
                c->auth_offered |= 1u << mech_id(name);
            if (c->cfg.auth_mechanism && c->cfg.auth_mechanism[0] &&
                strlen(c->cfg.auth_mechanism) == j - i &&
                smtpe__has_prefix_ci(v.ptr + i, j - i, c->cfg.auth_mechanism))
                c->auth_cfg_offered = 1;
        }
        i = j + 1;
    }
}

/* One EHLO keyword line (RFC 5321 §4.1.1.1: ehlo-keyword [SP ehlo-param ...]). */
static void ehlo_keyword(smtpe_client *c, smtpe_span t)
{
    static const struct {
        const char *name;
        size_t len;
        unsigned bit;
    } known[] = {{"PIPELINING", 10, SMTPE_EXT_PIPELINING}, {"SIZE", 4, SMTPE_EXT_SIZE},
                 {"8BITMIME", 8, SMTPE_EXT_8BITMIME}, {"SMTPUTF8", 8, SMTPE_EXT_SMTPUTF8},
                 {"ENHANCEDSTATUSCODES", 19, SMTPE_EXT_ENHANCEDSTATUSCODES},
                 {"STARTTLS", 8, SMTPE_EXT_STARTTLS}, {"CHUNKING", 8, SMTPE_EXT_CHUNKING},
                 {"BINARYMIME", 10, SMTPE_EXT_BINARYMIME}, {"DSN", 3, SMTPE_EXT_DSN},
                 {"REQUIRETLS", 10, SMTPE_EXT_REQUIRETLS},
                 {"MT-PRIORITY", 11, SMTPE_EXT_MT_PRIORITY},
                 {"DELIVERBY", 9, SMTPE_EXT_DELIVERBY}, {"XCLIENT", 7, SMTPE_EXT_XCLIENT},
                 {"XFORWARD", 8, SMTPE_EXT_XFORWARD}};
    size_t k = 0;
    smtpe_span v;
    while (k < t.len && t.ptr[k] != ' ' && t.ptr[k] != '=')
        k++;
    v.ptr = t.ptr + k;
    v.len = t.len - k;
    while (v.len > 0 && (v.ptr[0] == ' ' || v.ptr[0] == '=')) {
        v.ptr++;
        v.len--;
    }
    if (k == 4 && smtpe__same_ci(t.ptr, (const uint8_t *)"AUTH", 4)) {
        if (c->caps.auth.len == 0 || (t.len > 4 && t.ptr[4] == ' ')) /* AUTH beats AUTH= */
            c->caps.auth = keep_line(c->auth_line, v);
        auth_note_offered(c, v); /* from the whole line: the kept copy may be cut */
        return;
    }
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        size_t n = known[i].len;
        /* the length and the first octet (a letter in either case, or a digit) first: most
         * entries differ there, so the whole compare runs about once a line */
        if (k != n || (t.ptr[0] | 0x20) != (known[i].name[0] | 0x20) ||
            !smtpe__same_ci(t.ptr, (const uint8_t *)known[i].name, n))
            continue;
        c->caps.extensions |= known[i].bit;
        if (known[i].bit == SMTPE_EXT_SIZE) {
            smtpe_span d = v;
            uint64_t limit = 0;
            while (d.len > 0 && d.ptr[d.len - 1] == ' ')
                d.len--;
            if (d.len > 0 && smtpe__parse_u64(d, &limit) == 0)
                c->caps.size_limit = limit;
        } else if (known[i].bit == SMTPE_EXT_DELIVERBY) {
            uint64_t min = 0;
            if (v.len > 0 && smtpe__parse_u64(v, &min) == 0 && min < 1000000000)
                c->caps.deliverby_min = (int64_t)min;
        } else if (known[i].bit == SMTPE_EXT_XCLIENT) {
            c->caps.xclient = keep_line(c->xclient_line, v);
        } else if (known[i].bit == SMTPE_EXT_XFORWARD) {
            c->caps.xforward = keep_line(c->xforward_line, v);
        }
        return;
    }
}

static void caps_reset(smtpe_client *c)
{
    memset(&c->caps, 0, sizeof c->caps);
    c->caps.tls = c->tls;
    c->caps.authenticated = c->authenticated;
    c->stage_enhanced = 0;
    c->auth_offered = 0;
    c->auth_cfg_offered = 0;
}

static int queue_xclient(smtpe_client *c);
static int queue_auth(smtpe_client *c);

/* Queues the pending setup command if it fits. */
static void setup_send(smtpe_client *c)
{
    char line[SMTPE__MAX_DOMAIN + 16];
    int ok = 0, step = c->next;
    c->next = NEXT_NONE; /* a step may set the next one itself (XCLIENT with nothing to send) */
    switch (step) {
    case NEXT_EHLO:
    case NEXT_HELO: {
        wr w = {(uint8_t *)line, 0, sizeof line, 0};
        w_str(&w, step == NEXT_HELO ? "HELO " : c->cfg.lmtp ? "LHLO " : "EHLO ");
        w_str(&w, c->cfg.helo_name);
        w_str(&w, "\r\n");
        ok = queue_line(c, step == NEXT_HELO ? K_HELO : K_EHLO, 0, (uint8_t *)line, w.len);
        break;
    }
    case NEXT_STARTTLS:
        ok = queue_text(c, K_STARTTLS, "STARTTLS\r\n");
        if (ok)
            c->tried_starttls = 1;
        break;
    case NEXT_XCLIENT:
        ok = queue_xclient(c);
        break;
    case NEXT_AUTH:
        ok = queue_auth(c);
        break;
    default:
        return;
    }
    if (!ok)
        c->next = step; /* no room yet: again after the next send_ack */
}

/* ---- XCLIENT (Postfix XCLIENT_README) ---- */

/* Writes "<verb> NAME=xtext ..." CRLF into line[0..LINE_MAX_CMD) with the attributes from
 * attrs[*at] on that the server's list names (xtext, RFC 3461 §4), as many as fit in one line
 * of 512 octets (one that cannot fit even alone is left out); moves *at past them. Returns the
 * line's length, or 0 when no attribute (more) is to be sent. Postfix XCLIENT_README,
 * XFORWARD_README. */
static size_t attr_line(const char *verb, const smtpe_param *attrs, size_t count,
                        smtpe_span listed, size_t *at, uint8_t *line)
{
    wr w = {line, 0, LINE_MAX_CMD - 2, 0};
    size_t i = *at, n = 0;
    w_str(&w, verb);
    for (; i < count; i++) {
        const smtpe_param *a = &attrs[i];
        size_t mark = w.len;
        if (!list_has(listed, a->keyword))
            continue;
        w_put(&w, " ", 1);
        w_put(&w, a->keyword.ptr, a->keyword.len);
        w_put(&w, "=", 1);
        w_xtext(&w, a->value.ptr, a->value.len);
        if (w.over) {
            w.over = 0;
            w.len = mark;
            if (n == 0)
                continue;
            break;
        }
        n++;
    }
    *at = i;
    if (n == 0)
        return 0;
    w.cap = LINE_MAX_CMD;
    w_str(&w, "\r\n");
    return w.len;
}

/* Queues one XCLIENT line. Returns 1 when queued (or nothing is left to send: xclient_done,
 * and the next setup step follows), 0 if it must wait for output room. */
static int queue_xclient(smtpe_client *c)
{
    uint8_t line[LINE_MAX_CMD];
    size_t at = c->xclient_at;
    size_t len = attr_line("XCLIENT", c->cfg.xclient, c->cfg.xclient_count, c->caps.xclient,
                           &at, line);
    if (len == 0) { /* nothing (more) the server takes */
        c->xclient_done = 1;
        c->xclient_at = c->cfg.xclient_count;
        setup_next(c);
        return 1;
    }
    if (!queue_line(c, K_XCLIENT, 0, line, len))
        return 0;
    c->xclient_at = at;
    if (at >= c->cfg.xclient_count)
        c->xclient_done = 1;
    return 1;
}

/* ---- AUTH (RFC 4954) ---- */

/* The AUTH command: with the initial response when the line stays within 512 octets
 * (RFC 4954 §4), else without it (the response follows the server's 334). */
static int queue_auth(smtpe_client *c)
{
    char prefix[48];
    size_t plen;
    wr w = {(uint8_t *)prefix, 0, sizeof prefix, 0};
    if (c->auth_mech == SMTPE_SASL_OTHER) { /* the host gives the initial response first */
        c->auth_state = SA_OTHER;
        c->auth_step = 0;
        c->auth_step_ready = 1;
        c->auth_chal = c->auth_chal_len = 0;
        return 1;
    }
    w_str(&w, "AUTH ");
    w_str(&w, mech_name(c->auth_mech));
    if (c->auth_mech == SMTPE_SASL_LOGIN) {
        w_str(&w, "\r\n");
        if (!queue_line(c, K_AUTH, 0, (uint8_t *)prefix, w.len))
            return 0;
        c->auth_state = SA_LOGIN_USER;
        return 1;
    }
    w_str(&w, " ");
    plen = w.len;
    if (plen + SMTPE__BASE64_LEN(sasl_message_len(c)) + 2 <= LINE_MAX_CMD) {
        prefix[plen] = '\0';
        if (!queue_b64_line(c, prefix, NULL, 0))
            return 0;
        c->auth_state = SA_CREDS;
        return 1;
    }
    memcpy(prefix + plen - 1, "\r\n", 2);
    if (!queue_line(c, K_AUTH, 0, (uint8_t *)prefix, plen + 1))
        return 0;
    c->auth_state = SA_CMD;
    return 1;
}

static void auth_failed(smtpe_client *c, unsigned code, smtpe_span text)
{
    /* a refused login defers the mail (the credentials may be fixed), it does not bounce it */
    quit_and_close(c, SMTPE_CLOSE_AUTH_FAILED, code, text, SMTPE_OUTCOME_TEMPORARY);
}

/* A 334 to an AUTH line. */
static void auth_challenge(smtpe_client *c, smtpe_span text)
{
    const smtpe_client_config *k = &c->cfg;
    int ok = 1;
    switch (c->auth_state) {
    case SA_CMD: /* the credentials after an AUTH without initial response */
        ok = queue_b64_line(c, "", NULL, 0);
        c->auth_state = SA_CREDS;
        break;
    case SA_LOGIN_USER: /* the prompt's text is ignored (it is often not "Username:") */
        ok = queue_b64_line(c, "", (const uint8_t *)k->auth_user, strlen(k->auth_user));
        c->auth_state = SA_LOGIN_PASS;
        break;
    case SA_LOGIN_PASS:
        ok = queue_b64_line(c, "", (const uint8_t *)k->auth_password, strlen(k->auth_password));
        c->auth_state = SA_CREDS;
        break;
    case SA_CREDS: /* XOAUTH2 / OAUTHBEARER: an error challenge (RFC 7628 §3.2.3) */
        if (c->auth_mech == SMTPE_SASL_XOAUTH2)
            ok = queue_text(c, K_AUTH, "\r\n");
        else if (c->auth_mech == SMTPE_SASL_OAUTHBEARER)
            ok = queue_text(c, K_AUTH, "AQ==\r\n");
        else {
            protocol_error(c, "a 334 after the credentials were sent");
            return;
        }
        c->auth_state = SA_ERROR;
        break;
    case SA_OTHER: { /* the challenge goes to the host, decoded in place */
        uint8_t *m = c->line + (text.ptr - c->line);
        size_t n = smtpe__base64_decode(m, text.len, m);
        if (n == SMTPE__BASE64_BAD) {
            protocol_error(c, "a 334 challenge that is not base64");
            return;
        }
        c->auth_chal = (size_t)(m - c->line); /* the challenge: line[chal .. chal + n) */
        c->auth_chal_len = n;
        c->auth_step++;
        c->auth_step_ready = 1;
        return;
    }
    default:
        protocol_error(c, "a 334 the AUTH exchange cannot take");
        return;
    }
    if (!ok) /* never: the ring is empty during AUTH and the lines were sized at creation */
        protocol_error(c, "no output room for the AUTH response");
}

int smtpe_client_auth_response(smtpe_client *c, const uint8_t *data, size_t len)
{
    char prefix[48];
    wr w = {(uint8_t *)prefix, 0, sizeof prefix, 0};
    int ok;
    if (!c)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (!c->auth_owed || c->phase == PH_CLOSED)
        return SMTPE_ERR_STATE;
    if ((!data && len) || len > AUTH_DATA_MAX ||
        SMTPE__BASE64_LEN(len) + sizeof prefix + 2 > c->out_cap)
        return SMTPE_ERR_INVALID_ARGUMENT;
    c->auth_owed = 0;
    c->restart = 1;
    if (c->auth_step == 0) {
        w_str(&w, "AUTH ");
        w_str(&w, c->cfg.auth_mechanism);
        if (!data) {
            w_str(&w, "\r\n");
            ok = queue_line(c, K_AUTH, 0, (uint8_t *)prefix, w.len);
        } else if (len == 0) {
            w_str(&w, " =\r\n");
            ok = queue_line(c, K_AUTH, 0, (uint8_t *)prefix, w.len);
        } else if (w.len + 1 + SMTPE__BASE64_LEN(len) + 2 > LINE_MAX_CMD) {
            /* RFC 4954 §4: not on the AUTH line; the host gives it again at step 1 */
            w_str(&w, "\r\n");
            ok = queue_line(c, K_AUTH, 0, (uint8_t *)prefix, w.len);
        } else {
            w_str(&w, " ");
            prefix[w.len] = '\0';
            ok = queue_b64_line(c, prefix, data, len);
        }
    } else if (!data) {
        ok = queue_text(c, K_AUTH, "*\r\n"); /* cancels (RFC 4954 §4) */
    } else {
        ok = queue_b64_line(c, "", data, len);
    }
    if (!ok)
        protocol_error(c, "no output room for the AUTH response");
    advance(c);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Transactions
 * ---------------------------------------------------------------------------------------- */

typedef struct refusal {
    const char *enhanced, *text;
} refusal;

/* The refusal before MAIL that the transaction needs with these capabilities, or NULL.
 * Sets c->tx_body and c->tx_bdat for a transaction that may go. */
static const refusal *txn_refusal(smtpe_client *c)
{
    static const refusal
        r_tls = {"5.7.30", "REQUIRETLS needs TLS and a server offering REQUIRETLS"},
        r_utf8 = {"5.6.7", "non-ASCII address and the server does not offer SMTPUTF8"},
        r_binary = {"5.6.3", "binary content and the server does not offer BINARYMIME"},
        r_8bit = {"5.6.3", "8-bit content and the server does not offer 8BITMIME"},
        r_7bit = {"5.6.3", "8-bit content in a message declared BODY=7BIT"},
        r_nobdat = {"5.6.3", "binary content needs BDAT, which the client does not use"},
        r_nul = {"5.6.0", "NUL octet in the content"},
        r_bare = {"5.6.0", "bare CR or LF in the content"},
        r_long = {"5.6.0", "content line over 998 octets"},
        r_size = {"5.3.4", "message larger than the server's SIZE limit"},
        r_by = {"5.5.4", "BY=...;R and the server does not offer DELIVERBY"};
    const smtpe_client_txn *t = c->txn;
    unsigned ext = c->caps.extensions;
    unsigned flags = t->has_content_info ? t->content.flags : 0;
    int body = t->body;
    if (t->requiretls && (!c->tls || !(ext & SMTPE_EXT_REQUIRETLS)))
        return &r_tls;
    if ((t->smtputf8 || c->tx_utf8) && !(ext & SMTPE_EXT_SMTPUTF8))
        return &r_utf8;
    if (body == SMTPE_BODY_BINARYMIME && !c->cfg.chunking)
        return &r_nobdat;
    if (body == SMTPE_BODY_BINARYMIME &&
        !((ext & SMTPE_EXT_CHUNKING) && (ext & SMTPE_EXT_BINARYMIME)))
        return &r_binary;
    if (body == SMTPE_BODY_UNSPECIFIED && (flags & SMTPE_CONTENT_8BIT))
        body = SMTPE_BODY_8BITMIME;
    if (body == SMTPE_BODY_7BIT && (flags & SMTPE_CONTENT_8BIT))
        return &r_7bit;
    if ((body == SMTPE_BODY_8BITMIME || (flags & SMTPE_CONTENT_8BIT)) &&
        body != SMTPE_BODY_BINARYMIME && !(ext & SMTPE_EXT_8BITMIME))
        return &r_8bit;
    c->tx_body = body;
    c->tx_bdat = c->cfg.chunking && (ext & SMTPE_EXT_CHUNKING);
    if (body != SMTPE_BODY_BINARYMIME) {
        if (flags & SMTPE_CONTENT_NUL)
            return &r_nul;
        if (c->cfg.line_ending == SMTPE_LINE_ENDING_REFUSE &&
            (flags & (SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF)))
            return &r_bare;
        if (!c->tx_bdat && (flags & SMTPE_CONTENT_LONG_LINE))
            return &r_long;
    }
    if (t->has_content_info && (ext & SMTPE_EXT_SIZE) && c->caps.size_limit > 0 &&
        t->content.wire_size > c->caps.size_limit)
        return &r_size;
    if (t->by_mode == 'R' && !(ext & SMTPE_EXT_DELIVERBY))
        return &r_by;
    return NULL;
}

/* What the content encoder must stop at for this transaction. */
static unsigned refuse_mask(const smtpe_client *c)
{
    unsigned m = SMTPE_CONTENT_NUL;
    if (c->tx_body != SMTPE_BODY_8BITMIME && c->tx_body != SMTPE_BODY_BINARYMIME)
        m |= SMTPE_CONTENT_8BIT;
    if (!c->tx_bdat)
        m |= SMTPE_CONTENT_LONG_LINE;
    if (c->cfg.line_ending == SMTPE_LINE_ENDING_REFUSE)
        m |= SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF;
    return m;
}

static void txn_start(smtpe_client *c)
{
    const refusal *r = txn_refusal(c);
    c->tx_pending = 0;
    if (r) {
        outcome_run *q = q_run(c, 0, c->txn->rcpt_count, 0, SMTPE_OUTCOME_PERMANENT, 0,
                       span_of(r->enhanced), span_of(r->text), 1);
        if (q)
            q->before_mail = 1;
        q_done(c, 1);
        return;
    }
    c->tx_active = 1;
    c->rset_sent = !c->need_rset;
    smtpe__stuff_start(&c->st,
                       c->tx_body == SMTPE_BODY_BINARYMIME ? SMTPE__STUFF_BINARY
                       : c->tx_bdat                       ? SMTPE__STUFF_BDAT
                                                          : SMTPE__STUFF_DATA,
                       c->cfg.line_ending, refuse_mask(c));
}

static int pipelining(const smtpe_client *c)
{
    return c->cfg.pipelining && (c->caps.extensions & SMTPE_EXT_PIPELINING) != 0;
}

static int tx_queue(smtpe_client *c, int kind, uint32_t arg, const uint8_t *line, size_t len)
{
    if (!queue_line(c, kind, arg, line, len))
        return 0;
    c->tx_outstanding++;
    return 1;
}

/* One XFORWARD line with the next advertised attributes. */
static int queue_xforward(smtpe_client *c)
{
    const smtpe_client_txn *t = c->txn;
    uint8_t line[LINE_MAX_CMD];
    size_t at = c->xforward_at;
    size_t len = attr_line("XFORWARD", t->xforward, t->xforward_count, c->caps.xforward, &at,
                           line);
    if (len == 0) {
        c->xforward_at = t->xforward_count;
        return 1;
    }
    if (!tx_queue(c, K_XFORWARD, 0, line, len))
        return 0;
    c->xforward_at = at;
    return 1;
}

/* Starts the content: the CONTENT event, once. */
static void content_begin(smtpe_client *c)
{
    c->content = CT_WANTED;
    if (!c->content_event) {
        c->content_event = 1;
        q_event(c, SMTPE_CEV_CONTENT);
    }
}

/* Queues what the transaction may send now (RFC 2920: the whole group when PIPELINING is
 * offered, else one command per reply). */
static void txn_send(smtpe_client *c)
{
    const smtpe_client_txn *t = c->txn;
    int pipe = pipelining(c);
    uint8_t line[RCPT_LINE_MAX];
    if (!pipe && c->sent_count > 0)
        return;
    if (!c->rset_sent) {
        if (!tx_queue(c, K_RSET, 0, (const uint8_t *)"RSET\r\n", 6))
            return;
        c->rset_sent = 1;
        if (!pipe)
            return;
    }
    while (c->xforward_at < t->xforward_count && (c->caps.extensions & SMTPE_EXT_XFORWARD)) {
        if (!queue_xforward(c) || (!pipe && c->sent_count > 0))
            return;
    }
    if (!c->mail_sent) {
        wr w = {line, 0, sizeof line, 0};
        build_mail(t, c->caps.extensions, c->tx_body, t->smtputf8 || c->tx_utf8, &w);
        if (w.over || !tx_queue(c, K_MAIL, 0, line, w.len))
            return;
        c->mail_sent = 1;
        if (!pipe)
            return;
    }
    if (c->tx_failed || (!pipe && !c->mail_ok))
        return;
    while (c->rcpt_sent < t->rcpt_count) {
        wr w = {line, 0, sizeof line, 0};
        if (!pipe && c->sent_count > 0)
            return;
        build_rcpt(&t->rcpts[c->rcpt_sent], (c->caps.extensions & SMTPE_EXT_DSN) != 0, &w);
        if (w.over || !tx_queue(c, K_RCPT, (uint32_t)c->rcpt_sent, line, w.len))
            return;
        c->rcpt_sent++;
    }
    if (c->data_sent || c->content_event)
        return;
    if (!pipe && (c->rcpt_replied < t->rcpt_count || c->n_accepted == 0))
        return;
    if (c->tx_bdat) {
        content_begin(c); /* the first BDAT goes with the group */
        return;
    }
    if (tx_queue(c, K_DATA, 0, (const uint8_t *)"DATA\r\n", 6))
        c->data_sent = 1;
}

/* The transaction is over when every command of it is answered and nothing more will go. */
static void txn_check_done(smtpe_client *c)
{
    if (!c->tx_active || c->tx_outstanding > 0 || c->lone_dot)
        return;
    if (!c->tx_failed && !c->end_replied)
        return;
    c->tx_active = 0;
    c->content = CT_NONE;
    q_done(c, 1);
}

/* The transaction failed before its content ended: no content (more) goes; RSET comes before
 * the next MAIL. */
static void txn_fail(smtpe_client *c)
{
    c->tx_failed = 1;
    c->need_rset = 1;
    if (c->content == CT_WANTED || c->content == CT_FINISHING)
        c->content = CT_NONE;
}

/* ------------------------------------------------------------------------------------------
 * Content (RFC 5321 §4.5.2, RFC 3030)
 * ---------------------------------------------------------------------------------------- */

static const char *refused_text(unsigned flag)
{
    switch (flag) {
    case SMTPE_CONTENT_NUL: return "NUL octet in the content";
    case SMTPE_CONTENT_8BIT: return "8-bit octet in content not declared 8BITMIME";
    case SMTPE_CONTENT_LONG_LINE: return "content line over 998 octets";
    default: return "bare CR or LF in the content";
    }
}

/* The encoder stopped at content that must be refused: the message is dropped mid-content, so
 * the connection goes too (nothing else can end the DATA without delivering it). */
static void content_refused(smtpe_client *c)
{
    smtpe_span text = span_of(refused_text(c->st.refused));
    c->end_queued = 0;
    close_session(c, SMTPE_CLOSE_ABORTED, 0, text, SMTPE_OUTCOME_PERMANENT);
}

/* The largest contiguous output room now (without changing the ring). */
static size_t out_max_room(const smtpe_client *c)
{
    if (c->b_end > 0)
        return c->a_off - c->b_end;
    if (c->a_off == c->a_end)
        return c->out_cap;
    size_t tail = c->out_cap - c->a_end;
    return tail > c->a_off ? tail : c->a_off;
}

static void end_queued(smtpe_client *c, int kind, size_t len)
{
    sent_push(c, kind, 0, len);
    c->tx_outstanding++;
    c->end_queued = 1;
    c->end_at = c->written;
    c->content = CT_DONE;
}

/* DATA: the final line break if missing and ".\r\n". Returns 1 once queued. */
static int data_finish(smtpe_client *c)
{
    size_t room, w;
    int to_b;
    uint8_t *p = out_reserve(c, SMTPE__STUFF_FINISH_MAX, &room, &to_b);
    if (!p || c->sent_count == c->sent_cap)
        return 0;
    w = smtpe__stuff_finish(&c->st, p);
    if (c->st.refused) {
        content_refused(c);
        return 1;
    }
    out_put_done(c, to_b, w);
    end_queued(c, K_DOT, 3);
    return 1;
}

static smtpe_ssize content_data(smtpe_client *c, const uint8_t *p, size_t n, int last)
{
    size_t used = 0;
    while (used < n) {
        size_t room, w, k;
        int to_b;
        uint8_t *q = out_reserve(c, 4, &room, &to_b); /* one octet may yield 4 */
        if (!q)
            break;
        k = smtpe__stuff_encode(&c->st, p + used, n - used, q, room, &w);
        out_put_done(c, to_b, w);
        used += k;
        if (c->st.refused) {
            content_refused(c);
            return (smtpe_ssize)used;
        }
        if (k == 0)
            break;
    }
    if (used > 0)
        c->restart = 1;
    if (last && used == n) {
        c->content = CT_FINISHING;
        data_finish(c);
    }
    return (smtpe_ssize)used;
}

/* The longest command line a BDAT chunk of this session can have: "BDAT ", the digits of
 * output_buffer_size (no chunk is larger), " LAST\r\n". */
static size_t bdat_line_max(const smtpe_client *c)
{
    size_t n = 5 + 7, v = c->out_cap;
    do {
        n++;
        v /= 10;
    } while (v);
    return n;
}

/* Whether the next BDAT chunk's command may be queued now: the previous chunk was answered,
 * the command queue has a slot, and its line fits under max_unanswered with the commands
 * outstanding (the first chunk goes with the MAIL / RCPT group, RFC 3030 §2, held to the
 * same cap as the DATA of a group, RFC 2920 §3.1; one command is always allowed when none is
 * outstanding). Its exact length is known only once the chunk is encoded, so the longest
 * line it can have is counted. */
static int bdat_may_queue(const smtpe_client *c)
{
    return !c->bdat_out && c->sent_count < c->sent_cap &&
           (c->sent_count == 0 || c->unanswered + bdat_line_max(c) <= c->cfg.max_unanswered);
}

/* BDAT: one chunk per call of at most chunk_size octets, the next only after the previous
 * chunk's reply (so no BDAT follows a refused one, RFC 3030 §2). The chunk is encoded into the
 * output after room for its command line, whose count is then known exactly; the command line
 * is written in front of it and the octets moved up against it. */
static smtpe_ssize content_bdat(smtpe_client *c, const uint8_t *p, size_t n, int last)
{
    size_t room, w = 0, k, cap, hl;
    int to_b, is_last;
    uint8_t *q, head[BDAT_HEAD];
    wr hw = {head, 0, sizeof head, 0};
    if (!bdat_may_queue(c)) {
        if (last && n == 0) /* the end, given while a chunk's reply is owed: kept, as DATA's */
            c->content = CT_FINISHING;
        return 0;
    }
    q = out_reserve(c, BDAT_HEAD + SMTPE__STUFF_FINISH_MAX + 4, &room, &to_b);
    if (!q)
        return 0;
    cap = room - BDAT_HEAD - SMTPE__STUFF_FINISH_MAX;
    if (c->cfg.chunk_size && cap > c->cfg.chunk_size)
        cap = c->cfg.chunk_size < 4 ? 4 : c->cfg.chunk_size; /* one octet may yield 4 */
    k = smtpe__stuff_encode(&c->st, p, n, q + BDAT_HEAD, cap, &w);
    if (c->st.refused) {
        content_refused(c);
        return (smtpe_ssize)k;
    }
    is_last = last && k == n;
    if (is_last) {
        w += smtpe__stuff_finish(&c->st, q + BDAT_HEAD + w);
        if (c->st.refused) {
            content_refused(c);
            return (smtpe_ssize)k;
        }
    }
    if (k > 0 || is_last)
        c->restart = 1;
    if (w == 0 && !is_last)
        return (smtpe_ssize)k; /* only a held CR so far */
    w_str(&hw, "BDAT ");
    w_u64(&hw, w);
    w_str(&hw, is_last ? " LAST\r\n" : "\r\n");
    hl = hw.len;
    memmove(q + hl, q + BDAT_HEAD, w);
    memcpy(q, head, hl);
    out_put_done(c, to_b, hl + w);
    c->bdat_out = 1;
    if (is_last) {
        end_queued(c, K_BDAT_LAST, hl);
    } else {
        sent_push(c, K_BDAT, 0, hl);
        c->tx_outstanding++;
    }
    return (smtpe_ssize)k;
}

/* DATA by reference: each stretch smtpe__stuff_span finds goes out as a span of p (a doubled
 * dot is the next span starting at that dot again); what it leaves (a held CR, a line end
 * normalised, a line-start dot at the start of a piece, a refused octet, the last CRLF) is
 * encoded into the ring an octet at a time, and once the spans are all in use the rest is
 * copied as smtpe_client_content copies it. */
static smtpe_ssize content_data_ref(smtpe_client *c, const uint8_t *p, size_t n, int last)
{
    size_t used = 0;
    int dot = 0; /* the last span ended with a line-start dot not yet doubled */
    while (used < n && c->ext_count + 2 <= EXT_MAX) { /* one kept for an owed dot */
        size_t room, w, k;
        int to_b, d;
        uint8_t *q;
        k = smtpe__stuff_span(&c->st, p + used, n - used, &d);
        if (k > 0) {
            ext_push(c, p + used - dot, k + (size_t)dot);
            used += k;
            dot = d;
            continue;
        }
        if (dot) {
            ext_push(c, p + used - 1, 1);
            dot = 0;
        }
        if (!(q = out_reserve(c, 4, &room, &to_b))) /* one octet may yield 4 */
            break;
        k = smtpe__stuff_encode(&c->st, p + used, 1, q, room, &w);
        out_put_done(c, to_b, w);
        used += k;
        if (c->st.refused) {
            content_refused(c);
            return (smtpe_ssize)used;
        }
        if (k == 0)
            break;
    }
    if (dot)
        ext_push(c, p + used - 1, 1);
    if (used > 0)
        c->restart = 1;
    if (used < n) /* the spans are all in use (or the ring is full): copy */
        return (smtpe_ssize)used + content_data(c, p + used, n - used, last);
    if (last) {
        c->content = CT_FINISHING;
        data_finish(c);
    }
    return (smtpe_ssize)used;
}

/* smtpe_client_content and smtpe_client_content_ref: by_ref chooses the DATA path (BDAT
 * copies either way). */
static smtpe_ssize content_given(smtpe_client *c, const uint8_t *p, size_t n, int last,
                                 int by_ref)
{
    smtpe_ssize r;
    if (!c || (!p && n))
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (c->phase == PH_CLOSED || c->content != CT_WANTED)
        return SMTPE_ERR_STATE;
    if (c->tx_bdat)
        r = content_bdat(c, p, n, last);
    else
        r = by_ref ? content_data_ref(c, p, n, last) : content_data(c, p, n, last);
    advance(c);
    return r;
}

smtpe_ssize smtpe_client_content_ref(smtpe_client *c, const uint8_t *p, size_t n, int last)
{
    return content_given(c, p, n, last, 1);
}

smtpe_ssize smtpe_client_content(smtpe_client *c, const uint8_t *p, size_t n, int last)
{
    return content_given(c, p, n, last, 0);
}

int smtpe_client_abort_content(smtpe_client *c)
{
    if (!c)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (c->phase == PH_CLOSED || !c->tx_active || !c->content_event || c->end_queued)
        return SMTPE_ERR_STATE;
    close_session(c, SMTPE_CLOSE_ABORTED, 0, span_of("the message content could not be read"),
                  SMTPE_OUTCOME_TEMPORARY);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Replies
 * ---------------------------------------------------------------------------------------- */

static sent_cmd sent_pop(smtpe_client *c)
{
    sent_cmd e = c->sent[c->sent_head];
    c->sent_head = (c->sent_head + 1) % c->sent_cap;
    c->sent_count--;
    c->unanswered -= e.len;
    return e;
}

static void on_greeting(smtpe_client *c, unsigned code, smtpe_span text)
{
    if (code == 220) {
        c->next = NEXT_EHLO;
    } else if (code / 100 == 2) {
        protocol_error(c, "a greeting that is not 220");
    } else { /* 554 (RFC 5321 §3.1) or another refusal: QUIT without EHLO */
        quit_and_close(c, SMTPE_CLOSE_REFUSED, code, text, 0);
    }
}

static void on_ehlo(smtpe_client *c, int kind, unsigned code, smtpe_span text)
{
    if (code / 100 == 2) {
        if (kind == K_HELO)
            caps_reset(c);
        c->caps.esmtp = kind == K_EHLO;
        c->stage_enhanced = (c->caps.extensions & SMTPE_EXT_ENHANCEDSTATUSCODES) != 0;
        setup_next(c);
    } else if (kind == K_EHLO && !c->cfg.lmtp && (code == 500 || code == 502)) {
        c->next = NEXT_HELO; /* RFC 5321 §3.2: only when EHLO is not recognised */
    } else {
        quit_and_close(c, SMTPE_CLOSE_REFUSED, code, text, 0);
    }
}

static void on_starttls(smtpe_client *c, unsigned code, smtpe_span text)
{
    if (code / 100 == 2 && code != 220) {
        protocol_error(c, "a 2xx reply to STARTTLS that is not 220"); /* RFC 3207 §4 */
        return;
    }
    if (code == 220) {
        /* the host feeds what it has read beyond the 220 before its handshake: any octet is
         * then a protocol error (response injection, CVE-2021-22947), whatever the split */
        c->phase = PH_TLS_WAIT;
        q_event(c, SMTPE_CEV_STARTTLS);
    } else if (c->cfg.tls == SMTPE_TLS_REQUIRED) {
        quit_and_close(c, SMTPE_CLOSE_TLS_REQUIRED, code, text, SMTPE_OUTCOME_TEMPORARY);
    } else {
        setup_next(c); /* opportunistic: on in clear */
    }
}

static void on_mail(smtpe_client *c, unsigned code, smtpe_span enh, smtpe_span text)
{
    if (code / 100 == 2) {
        c->mail_ok = 1;
        return;
    }
    q_run(c, 0, c->txn->rcpt_count, 0, 0, code, enh, text, 0);
    txn_fail(c);
}

static void on_rcpt(smtpe_client *c, size_t i, unsigned code, smtpe_span enh, smtpe_span text)
{
    c->rcpt_replied++;
    if (!c->mail_ok)
        return; /* decided by the MAIL's refusal */
    if (code / 100 == 2) {
        bit_set(c->accepted, i);
        c->n_accepted++;
    } else {
        q_run(c, i, i + 1, 0, 0, code, enh, text, 0);
    }
    if (c->rcpt_replied == c->txn->rcpt_count && c->n_accepted == 0)
        txn_fail(c);
}

static void on_data(smtpe_client *c, unsigned code, smtpe_span enh, smtpe_span text)
{
    if (code == 354) {
        if (c->tx_failed || c->n_accepted == 0) {
            c->lone_dot = 1; /* RFC 2920 §3.1: end the DATA with nothing in it */
            return;
        }
        content_begin(c);
        smtpe__stuff_start(&c->st, SMTPE__STUFF_DATA, c->cfg.line_ending, refuse_mask(c));
        return;
    }
    if (code / 100 == 2) {
        protocol_error(c, "a 2xx reply to DATA");
        return;
    }
    if (!c->tx_failed)
        q_run(c, 0, c->txn->rcpt_count, 1, 0, code, enh, text, 0);
    txn_fail(c);
}

/* A reply to the end of the content (the final dot or BDAT LAST). Returns 1 when the series
 * of replies (LMTP: one per accepted recipient, RFC 2033 §4.2) is complete. */
static int on_end(smtpe_client *c, unsigned code, smtpe_span enh, smtpe_span text)
{
    const smtpe_client_txn *t = c->txn;
    if (c->end_replies == 0)
        c->end_replies = c->cfg.lmtp && c->n_accepted > 0 ? (unsigned)c->n_accepted : 1;
    if (c->tx_failed) {
        /* the LAST of a transaction whose recipients all failed */
    } else if (!c->cfg.lmtp) {
        q_run(c, 0, t->rcpt_count, 1, 0, code, enh, text, 0);
    } else {
        while (c->lmtp_cursor < t->rcpt_count && !bit_get(c->accepted, c->lmtp_cursor))
            c->lmtp_cursor++;
        q_run(c, c->lmtp_cursor, c->lmtp_cursor + 1, 1, 0, code, enh, text, 0);
        c->lmtp_cursor++;
    }
    if (--c->end_replies > 0)
        return 0;
    c->end_replied = 1;
    c->need_rset = c->tx_failed;
    return 1;
}

static void on_bdat(smtpe_client *c, unsigned code, smtpe_span enh, smtpe_span text)
{
    c->bdat_out = 0;
    if (code / 100 == 2 || c->tx_failed)
        return;
    q_run(c, 0, c->txn->rcpt_count, 1, 0, code, enh, text, 0);
    txn_fail(c); /* RFC 3030 §2: no further BDAT for this message */
}

static void on_auth(smtpe_client *c, unsigned code, smtpe_span text)
{
    if (code == 334) {
        auth_challenge(c, text);
    } else if (code / 100 == 2) {
        c->authenticated = c->caps.authenticated = 1;
        c->auth_state = SA_IDLE;
        setup_next(c);
    } else {
        auth_failed(c, code, text);
    }
}

/* The transaction's commands: matched in order. */
static void on_txn_reply(smtpe_client *c, sent_cmd cmd, unsigned code, smtpe_span enh,
                         smtpe_span text)
{
    switch (cmd.kind) {
    case K_RSET:
        if (code / 100 == 2)
            c->need_rset = 0;
        else
            quit_and_close(c, SMTPE_CLOSE_REFUSED, code, text, SMTPE_OUTCOME_TEMPORARY);
        break;
    case K_XFORWARD: /* a refused XFORWARD only loses the attributes */
        break;
    case K_MAIL:
        on_mail(c, code, enh, text);
        break;
    case K_RCPT:
        on_rcpt(c, cmd.arg, code, enh, text);
        break;
    case K_DATA:
        on_data(c, code, enh, text);
        break;
    case K_DOT_VOID:
        c->need_rset = 0;
        break;
    case K_BDAT:
        on_bdat(c, code, enh, text);
        break;
    default:
        break;
    }
}

/* A complete reply. */
static void on_reply(smtpe_client *c)
{
    unsigned code = c->rp.code;
    smtpe_span text = smtpe__reply_text(&c->rp), enh = {NULL, 0}, rest = text;
    sent_cmd cmd;
    int kind;
    if (c->stage_enhanced && code / 100 != 3)
        smtpe__enhanced_split(text, code, &enh, &rest);
    c->reply_enh = enh;
    if (c->sent_count == 0) { /* RFC 5321 §3.8: a 421 may come at any time */
        if (code == 421)
            close_session(c, SMTPE_CLOSE_SERVER_421, code, rest, 0);
        else
            protocol_error(c, "a reply with no command outstanding");
        return;
    }
    kind = c->sent[c->sent_head].kind;
    /* judged as at the reply's first octet, not its last: a server cannot be answering
     * octets it had not been sent when it began the reply (a "250" before the dot, its CRLF
     * after the host wrote the dot, is no verdict on the dot) */
    int handed = (int32_t)(c->sent[c->sent_head].end - c->reply_handed) <= 0;
    /* a 421 is the verdict on the end of the content only once the host wrote all of it (a
     * server that has not read it cannot be answering it): before that it is the session's
     * 421, and the end, handed out and so perhaps still written, leaves the recipients
     * unknown (found by a hostile-server trial: temporary, then the rest of the dot went) */
    int written = (int32_t)(c->sent[c->sent_head].end - c->reply_acked) <= 0;
    if (code == 421 && (!handed || (kind != K_QUIT && kind != K_DOT && kind != K_BDAT_LAST) ||
                        (kind != K_QUIT && !written))) {
        close_session(c, SMTPE_CLOSE_SERVER_421, code, rest, 0); /* RFC 5321 §3.8: any time */
        return;
    }
    if (!handed) { /* not all of it was handed to the host: the server cannot have read it */
        /* the same words as with nothing queued: whether the host had queued the next
         * command yet depends on how the input was split */
        protocol_error(c, "a reply with no command outstanding");
        return;
    }
    if (code / 100 == 3 && !(kind == K_DATA && code == 354) && !(kind == K_AUTH && code == 334)) {
        protocol_error(c, "a 3xx reply to a command that takes none");
        return;
    }
    c->restart = 1;
    if (kind == K_DOT || kind == K_BDAT_LAST) {
        if (kind == K_BDAT_LAST)
            c->bdat_out = 0;
        if (code == 421) { /* this recipient's reply; no reply will come for the others */
            if (!c->cfg.lmtp && !c->tx_failed) { /* the server's own verdict on them */
                q_run(c, 0, c->txn->rcpt_count, 1, 0, code, enh, rest, 0);
            } else if (c->cfg.lmtp && !c->tx_failed) {
                on_end(c, code, enh, rest);
                smtpe_span none = {NULL, 0};
                q_run(c, 0, c->txn->rcpt_count, 1, SMTPE_OUTCOME_UNKNOWN, 0, none,
                      span_of("no reply after a 421 among the LMTP replies"), 1);
            }
            close_session(c, SMTPE_CLOSE_SERVER_421, code, rest, 0);
            return;
        }
        if (!on_end(c, code, enh, rest))
            return; /* LMTP: more replies to come for this command */
        sent_pop(c);
        c->tx_outstanding--;
        txn_check_done(c);
        return;
    }
    cmd = sent_pop(c);
    switch (kind) {
    case K_GREETING: on_greeting(c, code, rest); break;
    case K_EHLO:
    case K_HELO: on_ehlo(c, kind, code, rest); break;
    case K_STARTTLS: on_starttls(c, code, rest); break;
    case K_XCLIENT:
        if (code / 100 == 2)
            c->next = NEXT_EHLO; /* XCLIENT resets the session: EHLO again */
        else
            quit_and_close(c, SMTPE_CLOSE_REFUSED, code, rest, SMTPE_OUTCOME_TEMPORARY);
        break;
    case K_AUTH: on_auth(c, code, rest); break;
    case K_QUIT: close_session(c, SMTPE_CLOSE_QUIT, code, rest, 0); break;
    default:
        c->tx_outstanding--;
        on_txn_reply(c, cmd, code, enh, rest);
        txn_check_done(c);
        break;
    }
}

/* A line of a reply that is not its last: EHLO keywords (lines 2..n of a 250). */
static void on_line(smtpe_client *c)
{
    int kind = c->sent_count > 0 ? c->sent[c->sent_head].kind : -1;
    if (kind != K_EHLO)
        return;
    if (c->rp.lines == 1)
        caps_reset(c);
    else if (c->rp.code / 100 == 2)
        ehlo_keyword(c, smtpe__reply_text(&c->rp));
}

/* Asks for the cache lines a reply touches (the struct up to the first event entries, the
 * line buffer's start, the oldest command) at once: a host with many sessions comes back to
 * this one after the others have pushed it out of the cache, and the loads the reply then
 * makes, one depending on the other, would each wait for memory in turn. A hint only. */
static void warm(const smtpe_client *c)
{
#if defined(__GNUC__) || defined(__clang__)
    const char *p = (const char *)c;
    for (size_t o = 0; o < offsetof(smtpe_client, q) + 2 * sizeof(qent); o += 64)
        __builtin_prefetch(p + o);
    __builtin_prefetch(c->line);
    __builtin_prefetch(c->line + 64);
    __builtin_prefetch(c->sent + c->sent_head);
#else
    (void)c;
#endif
}

smtpe_ssize smtpe_client_recv(smtpe_client *c, const uint8_t *buf, size_t n, uint64_t now_ms)
{
    size_t off = 0;
    (void)now_ms;
    if (!c || (!buf && n))
        return SMTPE_ERR_INVALID_ARGUMENT;
    warm(c);
    if (c->phase == PH_IMPLICIT)
        return SMTPE_ERR_STATE;
    while (off < n) {
        size_t used = 0;
        int r;
        if (c->phase == PH_CLOSED) { /* the session is over: what follows is dropped */
            off = n;
            break;
        }
        if (c->q_count > 0)
            break; /* the events' spans may point into the line buffer */
        if (c->phase == PH_TLS_WAIT) {
            protocol_error(c, "octets after the STARTTLS reply, before the TLS handshake");
            continue;
        }
        if (c->auth_owed || c->auth_step_ready) {
            protocol_error(c, "a reply while the AUTH response is being prepared");
            continue;
        }
        if (c->rp.total == 0) { /* this call takes the first octet of a new reply */
            /* what the reply may answer is what was handed out (and written) before it
             * began; host calls until its last octet change nothing of that. rp.total counts
             * every octet of the reply, so a later line does not take this again */
            c->reply_handed = (uint32_t)c->handed;
            c->reply_acked = (uint32_t)c->acked;
        }
        r = smtpe__reply_feed(&c->rp, buf + off, n - off, &used);
        off += used;
        if (r == SMTPE__RP_MORE)
            break;
        if (r < 0) {
            protocol_error(c, smtpe__reply_error_text(r));
            continue;
        }
        if (r == SMTPE__RP_LINE) {
            on_line(c);
            continue;
        }
        on_line(c); /* the last line of an EHLO reply is a keyword line too */
        on_reply(c);
        smtpe__reply_parser_start(&c->rp);
        /* what this reply made possible is queued (and its events raised) before the next
         * reply is judged, as when the read had ended here: the verdict on the rest of the
         * octets must not depend on where the host's reads were split (split invariance) */
        advance(c);
    }
    advance(c);
    return (smtpe_ssize)off;
}

/* ------------------------------------------------------------------------------------------
 * Driving
 * ---------------------------------------------------------------------------------------- */

/* Queues whatever the session may send now. Called at the end of every call. */
static void advance(smtpe_client *c)
{
    if (c->phase == PH_CLOSED)
        return;
    for (int k = 0; k < 4 && c->next != NEXT_NONE && c->phase != PH_CLOSED; k++) {
        int before = c->next;
        setup_send(c); /* a step may lead straight to the next (XCLIENT with nothing to send) */
        if (c->next == before)
            break; /* no room yet */
    }
    if (c->phase == PH_CLOSED)
        return;
    if (c->auth_step_ready && out_unsent(c) == 0 && c->q_count == 0) {
        qent *e = ev_push(c, Q_EVENT);
        e->ev.type = SMTPE_CEV_AUTH_STEP;
        e->ev.auth_step.step = c->auth_step;
        e->ev.auth_step.challenge.ptr = c->line + c->auth_chal;
        e->ev.auth_step.challenge.len = c->auth_step ? c->auth_chal_len : 0;
        c->auth_step_ready = 0;
        c->auth_owed = 1;
    }
    if (c->phase != PH_READY)
        return;
    if (c->tx_pending)
        txn_start(c);
    if (c->tx_active) {
        if (c->lone_dot && c->cfg.lmtp) { /* how many replies a lone dot gets is undefined */
            c->lone_dot = 0;
            close_session(c, SMTPE_CLOSE_PROTOCOL_ERROR, 0,
                          span_of("354 after every recipient was refused (LMTP)"), 0);
            return;
        }
        if (c->lone_dot && queue_line(c, K_DOT_VOID, 0, (const uint8_t *)".\r\n", 3)) {
            c->lone_dot = 0;
            c->tx_outstanding++;
        }
        if (c->content == CT_FINISHING && !c->tx_bdat)
            data_finish(c);
        else if (c->content == CT_FINISHING && bdat_may_queue(c))
            content_bdat(c, (const uint8_t *)"", 0, 1); /* the end the host gave */
        txn_send(c);
    }
    if (c->quit_wanted && !c->tx_active && !c->tx_pending && c->sent_count == 0 &&
        queue_text(c, K_QUIT, "QUIT\r\n"))
        c->phase = PH_QUIT;
}

int smtpe_client_next_event_versioned(smtpe_client *c, int event_version,
                                      smtpe_client_event *ev)
{
    size_t size = LAYOUT_SIZE(client_event_sizes, event_version);
    smtpe_client_event out;
    if (!c || !ev || size == 0)
        return 0;
    while (c->q_count > 0) {
        qent *e = &c->q[c->q_head];
        int got = 1;
        if (e->kind == Q_RUN) {
            got = run_next(c, &e->r, &out);
            if (!got) {
                c->q_head = (c->q_head + 1) % EVQ_MAX;
                c->q_count--;
                continue;
            }
        } else {
            if (e->kind == Q_DONE) {
                memset(&out, 0, sizeof out);
                out.type = SMTPE_CEV_TRANSACTION_DONE;
                out.done.txn = c->txn;
                out.done.delivered = c->counts[SMTPE_OUTCOME_DELIVERED];
                out.done.permanent = c->counts[SMTPE_OUTCOME_PERMANENT];
                out.done.temporary = c->counts[SMTPE_OUTCOME_TEMPORARY];
                out.done.unknown = c->counts[SMTPE_OUTCOME_UNKNOWN];
                out.done.reusable = e->ev.done.reusable;
                txn_clear(c);
                memset(c->accepted, 0, (c->cfg.max_recipients + 7) / 8);
                memset(c->decided, 0, (c->cfg.max_recipients + 7) / 8);
            } else {
                out = e->ev;
            }
            c->q_head = (c->q_head + 1) % EVQ_MAX;
            c->q_count--;
        }
        memcpy(ev, &out, size);
        c->restart = 1;
        advance(c);
        return got;
    }
    return 0;
}

const uint8_t *smtpe_client_send_buf(smtpe_client *c, size_t *len)
{
    if (!c || !len) {
        if (len)
            *len = 0;
        return NULL;
    }
    smtpe_span first;
    size_t total;
    if (out_spans(c, &first, 1, &total) == 0) {
        *len = 0;
        return c->out + c->a_off;
    }
    *len = first.len;
    if (c->acked + *len > c->handed)
        c->handed = c->acked + *len;
    return first.ptr;
}

size_t smtpe_client_send_iov(smtpe_client *c, smtpe_span *iov, size_t max)
{
    size_t n, total;
    if (!c || (!iov && max))
        return 0;
    n = out_spans(c, iov, max, &total);
    if (c->acked + total > c->handed)
        c->handed = c->acked + total;
    return n;
}

size_t smtpe_client_content_held(const smtpe_client *c)
{
    return c ? c->ext_held : 0;
}

int smtpe_client_send_ack(smtpe_client *c, size_t n)
{
    if (!c || n > c->handed - c->acked)
        return SMTPE_ERR_INVALID_ARGUMENT;
    out_ack(c, n);
    if (n > 0)
        c->restart = 1;
    advance(c);
    return 0;
}

static int content_room(const smtpe_client *c)
{
    size_t room = out_max_room(c);
    if (c->content != CT_WANTED)
        return 0;
    if (c->tx_bdat)
        return bdat_may_queue(c) && room >= BDAT_HEAD + SMTPE__STUFF_FINISH_MAX + 4;
    return room >= 4;
}

unsigned smtpe_client_want(const smtpe_client *c)
{
    unsigned w = 0;
    if (!c)
        return 0;
    if (out_unsent(c) > 0)
        w |= SMTPE_WANT_WRITE;
    if (c->q_count > 0)
        w |= SMTPE_WANT_EVENT;
    if (c->phase == PH_CLOSED)
        return w | SMTPE_WANT_CLOSE;
    if (c->phase == PH_IMPLICIT)
        return w | SMTPE_WANT_TLS;
    if (c->phase == PH_TLS_WAIT) /* feed what was already read (an injection), then handshake */
        return w | SMTPE_WANT_TLS | SMTPE_WANT_READ;
    if (c->auth_owed)
        w |= SMTPE_WANT_VERDICT;
    if (c->q_count == 0)
        w |= SMTPE_WANT_READ;
    if (c->q_count == 0 && content_room(c))
        w |= SMTPE_WANT_CONTENT;
    return w;
}

/* The timeout that applies now, in ms; 0 for none. RFC 5321 §4.5.3.2. */
static uint64_t timeout_now(const smtpe_client *c)
{
    const smtpe_client_config *k = &c->cfg;
    if (c->phase == PH_CLOSED || c->phase == PH_TLS_WAIT || c->phase == PH_IMPLICIT ||
        c->q_count > 0 || c->auth_owed || c->auth_step_ready)
        return 0;
    if (c->sent_count > 0 && (int32_t)(c->sent[c->sent_head].end - (uint32_t)c->handed) > 0) {
        /* the oldest command is not all handed to the host yet: the wait is on the sending */
        int in_content = c->content != CT_NONE || c->end_queued;
        return in_content ? k->data_block_timeout_ms : k->command_timeout_ms;
    }
    if (c->sent_count > 0) {
        switch (c->sent[c->sent_head].kind) {
        case K_GREETING: return k->greeting_timeout_ms;
        case K_DATA: return k->data_timeout_ms;
        case K_DOT:
        case K_BDAT_LAST: return k->data_end_timeout_ms;
        case K_BDAT: return k->data_block_timeout_ms;
        default: return k->command_timeout_ms;
        }
    }
    if (c->content == CT_WANTED || c->content == CT_FINISHING)
        return k->data_block_timeout_ms;
    if (out_unsent(c) > 0)
        return k->command_timeout_ms;
    return 0;
}

uint64_t smtpe_client_expiry(smtpe_client *c, uint64_t now_ms)
{
    uint64_t t;
    if (!c)
        return UINT64_MAX;
    t = timeout_now(c);
    if (t == 0) {
        c->restart = 1;
        return UINT64_MAX;
    }
    if (c->restart || t != c->timeout_now) {
        c->deadline = now_ms > UINT64_MAX - t ? UINT64_MAX : now_ms + t;
        c->timeout_now = t;
        c->restart = 0;
    }
    return c->deadline;
}

int smtpe_client_handle_expiry(smtpe_client *c, uint64_t now_ms)
{
    uint64_t d;
    if (!c)
        return 0;
    d = smtpe_client_expiry(c, now_ms);
    if (d == UINT64_MAX || now_ms < d)
        return 0;
    close_session(c, SMTPE_CLOSE_TIMEOUT, 0, span_of("timed out waiting for the server"), 0);
    return 1;
}

int smtpe_client_tls_started(smtpe_client *c, uint64_t now_ms)
{
    (void)now_ms;
    if (!c)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (c->phase != PH_TLS_WAIT && c->phase != PH_IMPLICIT)
        return SMTPE_ERR_STATE;
    c->tls = 1;
    caps_reset(c);
    smtpe__reply_parser_start(&c->rp);
    c->restart = 1;
    if (c->phase == PH_IMPLICIT) {
        c->phase = PH_SETUP;
        sent_push(c, K_GREETING, 0, 0);
    } else {
        c->phase = PH_SETUP;
        c->next = NEXT_EHLO; /* RFC 3207 §4.2: start over */
    }
    advance(c);
    return 0;
}

int smtpe_client_quit(smtpe_client *c)
{
    if (!c)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (c->phase == PH_CLOSED || c->phase == PH_QUIT || c->quit_wanted)
        return SMTPE_ERR_STATE;
    c->quit_wanted = 1;
    advance(c);
    return 0;
}

int smtpe_client_lost(smtpe_client *c)
{
    if (!c)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (c->phase == PH_CLOSED)
        return SMTPE_ERR_STATE;
    out_drop_unacked(c); /* what was written decides; nothing more goes */
    if (c->phase == PH_QUIT)
        close_session(c, SMTPE_CLOSE_QUIT, 0, span_of("closed after QUIT"), 0);
    else
        close_session(c, SMTPE_CLOSE_LOST, 0, span_of("connection lost"), 0);
    return 0;
}

const smtpe_client_caps *smtpe_client_get_caps(const smtpe_client *c)
{
    return c ? &c->caps : NULL;
}

/* ------------------------------------------------------------------------------------------
 * Creation
 * ---------------------------------------------------------------------------------------- */

static void *client_alloc(size_t size, void *ud)
{
    (void)ud;
    return malloc(size);
}

static void client_free_mem(void *p, void *ud)
{
    (void)ud;
    free(p);
}

static int client_setup(smtpe_client *c, const smtpe_client_config *cfg, const client_layout *l)
{
    uint8_t *base = (uint8_t *)c;
    memset(c, 0, offsetof(smtpe_client, q)); /* the rest is written before it is read */
    c->cfg = *cfg;
    c->sent = (sent_cmd *)(void *)(base + l->sent);
    c->sent_cap = l->sent_cap;
    c->accepted = base + l->bits;
    c->decided = base + l->bits + l->bits_len;
    memset(c->accepted, 0, 2 * l->bits_len);
    c->line = base + l->line;
    c->rp.buf = c->line;
    c->rp.cap = cfg->max_reply_line - 2;
    c->rp.max_total = cfg->max_reply_size;
    smtpe__reply_parser_start(&c->rp);
    c->out = base + l->out;
    c->out_cap = cfg->output_buffer_size;
    c->restart = 1;
    if (cfg->proxy) { /* before anything else, in clear */
        size_t n = smtpe__proxy_emit(cfg->proxy, c->out, c->out_cap);
        if (n == 0)
            return 0;
        out_put_done(c, 0, n);
    }
    if (cfg->tls == SMTPE_TLS_IMPLICIT) {
        c->phase = PH_IMPLICIT;
    } else {
        c->phase = PH_SETUP;
        sent_push(c, K_GREETING, 0, 0);
    }
    return 1;
}

int smtpe_client_init_versioned(smtpe_client **out, void *mem, size_t len, int config_version,
                                const smtpe_client_config *cfg, uint64_t now_ms)
{
    smtpe_client_config k;
    client_layout l;
    (void)now_ms;
    if (!out || !mem || !cfg || !client_config_latest(config_version, cfg, &k) ||
        !config_strings_valid(&k))
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (!client_layout_of(&k, &l))
        return SMTPE_ERR_CONFIG;
    if ((uintptr_t)mem % _Alignof(max_align_t) != 0)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (len < l.total)
        return SMTPE_ERR_BUFFER_TOO_SMALL;
    if (!client_setup(mem, &k, &l))
        return SMTPE_ERR_CONFIG;
    *out = mem;
    return 0;
}

int smtpe_client_new_versioned(smtpe_client **out, int config_version,
                               const smtpe_client_config *cfg, const smtpe_allocator *alloc,
                               uint64_t now_ms)
{
    smtpe_client_config k;
    client_layout l;
    smtpe_allocator a = {client_alloc, client_free_mem, NULL};
    smtpe_client *c;
    (void)now_ms;
    if (!out || !cfg)
        return SMTPE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!client_config_latest(config_version, cfg, &k) || !config_strings_valid(&k))
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (alloc && alloc->alloc && alloc->free)
        a = *alloc;
    if (!client_layout_of(&k, &l))
        return SMTPE_ERR_CONFIG;
    c = a.alloc(l.total, a.ud);
    if (!c)
        return SMTPE_ERR_NOMEM;
    if (!client_setup(c, &k, &l)) {
        a.free(c, a.ud);
        return SMTPE_ERR_CONFIG;
    }
    c->alloc = a;
    c->owned = 1;
    *out = c;
    return 0;
}

void smtpe_client_free(smtpe_client *c)
{
    if (c && c->owned)
        c->alloc.free(c, c->alloc.ud);
}

/* This file's macros end here (the amalgamated smtpe.c puts the sources in one file). */
#undef LINE_MAX_CMD
#undef RCPT_LINE_MAX
#undef MAIL_LINE_MAX
#undef TOKEN_MAX
#undef AUTH_DATA_MAX
#undef CAP_LINE_MAX
#undef EVQ_MAX
#undef ENVID_MAX
#undef BDAT_HEAD
#undef LAYOUT_SIZE
#undef ALIGN_UP
