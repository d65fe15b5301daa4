/* server.c - the SMTP server session state machine.
 *
 * RFC 5321 §3 (transactions), §4.1 (commands), §4.2 (replies), §4.3.2 (sequencing),
 * §4.5.3 (limits and timeouts); RFC 1870 (SIZE), RFC 6152 (8BITMIME), RFC 2920 (PIPELINING),
 * RFC 2034 / RFC 3463 (enhanced status codes), RFC 6531 (SMTPUTF8).
 *
 * One event slot: the engine stops consuming input as soon as it has an event for the host,
 * and while a verdict is pending, so every span it hands out stays valid as documented and the
 * host never re-enters the engine from a callback. */
#include "address.h"
#include "command.h"
#include "data.h"
#include "reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLOSE_RESERVE 600 /* room always kept for one final 421 / 221 line */
#define HOST_TEXT_MAX 320 /* hostname (<= 255) plus a short phrase */

enum { MODE_COMMAND, MODE_DATA };
enum { HELO_NONE, HELO_SMTP, HELO_ESMTP };

struct smtpe_server {
    const smtpe_server_config *cfg;
    smtpe_allocator alloc;
    int owned;                   /* allocated by smtpe_server_new */
    int helo;                    /* HELO_* */
    int mode;                    /* MODE_* */
    int closing;                 /* a final reply is queued; no more input */
    int in_transaction;          /* MAIL accepted */
    int smtputf8;                /* the transaction's MAIL carried SMTPUTF8 */
    unsigned rcpts;              /* recipients accepted in this transaction */
    int event_ready;             /* ev holds an event not yet taken */
    smtpe_event_type verdict;    /* event awaiting the host's verdict, or SMTPE_EV_NONE */
    int timer_restart;           /* a verdict came: restart the timer at the next clock */
    smtpe_event ev;
    smtpe__line line;
    smtpe__data data;
    uint8_t *out;                /* reply octets out[out_off..out_len) */
    size_t out_cap, out_off, out_len;
    size_t reserve;              /* room a command's reply may need */
    uint64_t last_activity;      /* ms */
    smtpe_server_stats stats;
};

/* ------------------------------------------------------------------------------------------
 * Configuration and memory
 * ---------------------------------------------------------------------------------------- */

void smtpe_server_config_init(smtpe_server_config *cfg)
{
    if (!cfg)
        return;
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
}

static int printable(const char *t, size_t max)
{
    size_t n = 0;
    for (; t[n]; n++)
        if ((unsigned char)t[n] < 0x20 || t[n] == 0x7f || n >= max)
            return 0;
    return 1;
}

static int config_valid(const smtpe_server_config *c)
{
    if (!c->hostname || !c->hostname[0] || !printable(c->hostname, 255) || !c->greeting_text ||
        !printable(c->greeting_text, 200))
        return 0;
    if (c->max_line_length < 512 || c->max_line_length > 65536 || c->max_recipients == 0 ||
        c->reply_buffer_size < 2048 || c->reply_buffer_size > 1048576 ||
        (unsigned)c->line_ending > SMTPE_LINE_ENDING_KEEP || c->ehlo_extra_count > 64 ||
        (c->ehlo_extra_count && !c->ehlo_extra))
        return 0;
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        if (!c->ehlo_extra[i] || !c->ehlo_extra[i][0] || !printable(c->ehlo_extra[i], 120))
            return 0;
    return 1;
}

/* Upper bound of the EHLO reply in octets. */
static size_t ehlo_size(const smtpe_server_config *c)
{
    size_t n = 6 + SMTPE__REPLY_TEXT_MAX + 6 * 40; /* the first line: hostname or host text */
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        n += 6 + strlen(c->ehlo_extra[i]);
    return n;
}

typedef struct layout {
    size_t head, line_cap, out_cap, reserve, total;
} layout;

static int layout_of(const smtpe_server_config *c, layout *l)
{
    const size_t align = sizeof(max_align_t);
    if (!c || !config_valid(c))
        return 0;
    l->head = (sizeof(struct smtpe_server) + align - 1) / align * align;
    l->line_cap = c->max_line_length - 2;
    l->reserve = ehlo_size(c);
    if (l->reserve < SMTPE__REPLY_TOTAL_MAX + 512)
        l->reserve = SMTPE__REPLY_TOTAL_MAX + 512;
    l->out_cap = c->reply_buffer_size;
    if (l->out_cap < l->reserve + CLOSE_RESERVE)
        l->out_cap = l->reserve + CLOSE_RESERVE;
    l->total = l->head + l->line_cap + l->out_cap;
    return 1;
}

size_t smtpe_server_memory_size(const smtpe_server_config *cfg)
{
    layout l;
    return layout_of(cfg, &l) ? l.total : 0;
}

/* ------------------------------------------------------------------------------------------
 * Output
 * ---------------------------------------------------------------------------------------- */

/* Room for replies other than the final one. */
static size_t out_space(const smtpe_server *s)
{
    size_t used = s->out_len - s->out_off + CLOSE_RESERVE;
    return used >= s->out_cap ? 0 : s->out_cap - used;
}

static void out_compact(smtpe_server *s)
{
    if (s->out_off == 0)
        return;
    memmove(s->out, s->out + s->out_off, s->out_len - s->out_off);
    s->out_len -= s->out_off;
    s->out_off = 0;
}

static const char *enhanced_for(const smtpe_server *s, unsigned code, const char *enhanced)
{
    if (!(s->cfg->extensions & SMTPE_EXT_ENHANCEDSTATUSCODES) || code / 100 == 3)
        return NULL;
    return enhanced;
}

/* Queues a reply; final replies may use the close reserve. Returns 0 or
 * SMTPE_ERR_REPLY_TOO_LONG. */
static int out_reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text,
                     size_t len, int final)
{
    size_t cap, n;
    out_compact(s);
    cap = final ? s->out_cap : s->out_cap - CLOSE_RESERVE;
    if (s->out_len >= cap)
        return SMTPE_ERR_REPLY_TOO_LONG;
    n = smtpe__reply_format(s->out + s->out_len, cap - s->out_len, code,
                            enhanced_for(s, code, enhanced), text, len);
    if (n == 0)
        return SMTPE_ERR_REPLY_TOO_LONG;
    s->out_len += n;
    return 0;
}

/* "<hostname> <phrase>" into buf (HOST_TEXT_MAX octets). Returns its length. */
static size_t host_text(const smtpe_server *s, char *buf, const char *phrase)
{
    int n = snprintf(buf, HOST_TEXT_MAX, "%s %s", s->cfg->hostname, phrase);
    return n < 0 ? 0 : (size_t)n >= HOST_TEXT_MAX ? HOST_TEXT_MAX - 1 : (size_t)n;
}

static void raise_event(smtpe_server *s, smtpe_event_type type)
{
    s->ev.type = type;
    s->event_ready = 1;
    if (smtpe_event_needs_reply(&s->ev))
        s->verdict = type;
}

/* Queues the final reply "code enhanced <hostname> phrase" and starts closing. */
static void close_with(smtpe_server *s, unsigned code, const char *enhanced, const char *phrase)
{
    char buf[HOST_TEXT_MAX];
    (void)out_reply(s, code, enhanced, buf, host_text(s, buf, phrase), 1);
    s->closing = 1;
}

static int is_error_code(unsigned code)
{
    return (code >= 500 && code <= 504) || code == 555;
}

/* Queues a reply, counting protocol errors (RFC 5321 §4.2.2 500-504, RFC 1869 555) against
 * max_errors; past the limit the reply becomes 421 4.7.0 and the session closes. */
static int reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    if (is_error_code(code) && ++s->stats.errors > s->cfg->max_errors && s->cfg->max_errors) {
        close_with(s, 421, "4.7.0", "Too many errors");
        raise_event(s, SMTPE_EV_ERROR_LIMIT);
        return 0;
    }
    return out_reply(s, code, enhanced, text, strlen(text), 0);
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

static void session_setup(smtpe_server *s, const smtpe_server_config *cfg, const layout *l,
                          uint64_t now_ms)
{
    char buf[512];
    int n;
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    s->line.buf = (uint8_t *)s + l->head;
    s->line.cap = l->line_cap;
    s->out = s->line.buf + l->line_cap;
    s->out_cap = l->out_cap;
    s->reserve = l->reserve;
    s->last_activity = now_ms;
    n = snprintf(buf, sizeof buf, "%s %s", cfg->hostname, cfg->greeting_text);
    (void)out_reply(s, 220, NULL, buf, (size_t)n, 0); /* RFC 5321 §4.2: no enhanced code */
}

int smtpe_server_init(smtpe_server **out, void *mem, size_t len, const smtpe_server_config *cfg,
                      uint64_t now_ms)
{
    layout l;
    if (!out || !mem || !cfg)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (!layout_of(cfg, &l))
        return SMTPE_ERR_CONFIG;
    if ((uintptr_t)mem % _Alignof(max_align_t) != 0)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (len < l.total)
        return SMTPE_ERR_BUFFER_TOO_SMALL;
    session_setup(mem, cfg, &l, now_ms);
    *out = mem;
    return 0;
}

int smtpe_server_new(smtpe_server **out, const smtpe_server_config *cfg,
                     const smtpe_allocator *alloc, uint64_t now_ms)
{
    layout l;
    smtpe_allocator a = {default_alloc, default_free, NULL};
    smtpe_server *s;
    if (!out || !cfg)
        return SMTPE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (alloc && alloc->alloc && alloc->free)
        a = *alloc;
    if (!layout_of(cfg, &l))
        return SMTPE_ERR_CONFIG;
    s = a.alloc(l.total, a.ud);
    if (!s)
        return SMTPE_ERR_NOMEM;
    session_setup(s, cfg, &l, now_ms);
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
    s->rcpts = 0;
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

/* §4.1.1.1: EHLO / HELO. Either one resets the transaction. */
static void cmd_helo(smtpe_server *s, smtpe_span arg, int esmtp)
{
    arg = trim_right(arg);
    if (arg.len == 0 || has_control(arg)) {
        reply(s, 501, "5.5.4", esmtp ? "Syntax: EHLO hostname" : "Syntax: HELO hostname");
        return;
    }
    reset_transaction(s);
    s->ev.helo.domain = arg;
    s->ev.helo.esmtp = esmtp;
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

/* Interprets MAIL parameters left to right (RFC 1870 SIZE, RFC 6152 BODY, RFC 6531
 * SMTPUTF8). Returns 0, or -1 after replying. */
static int mail_params(smtpe_server *s)
{
    unsigned ext = s->helo == HELO_ESMTP ? s->cfg->extensions : 0;
    unsigned seen = 0;
    for (size_t i = 0; i < s->ev.mail.param_count; i++) {
        smtpe_span k = s->ev.mail.params[i].keyword, v = s->ev.mail.params[i].value;
        unsigned bit;
        int bad;
        if (span_is(k, "SIZE") && (ext & SMTPE_EXT_SIZE)) {
            bit = 1, bad = smtpe__parse_u64(v, &s->ev.mail.size) != 0;
            s->ev.mail.has_size = 1;
        } else if (span_is(k, "BODY") && (ext & SMTPE_EXT_8BITMIME)) {
            bit = 2, bad = 0;
            if (span_is(v, "7BIT"))
                s->ev.mail.body = SMTPE_BODY_7BIT;
            else if (span_is(v, "8BITMIME"))
                s->ev.mail.body = SMTPE_BODY_8BITMIME;
            else
                bad = 1;
        } else if (span_is(k, "SMTPUTF8") && (ext & SMTPE_EXT_SMTPUTF8)) {
            bit = 4, bad = v.len != 0;
            s->ev.mail.smtputf8 = 1;
        } else {
            reply(s, 555, "5.5.4", "Unsupported parameter");
            return -1;
        }
        if (seen & bit) {
            reply(s, 501, "5.5.4", "Duplicate parameter");
            return -1;
        }
        seen |= bit;
        if (bad) {
            reply(s, 501, "5.5.4", "Malformed parameter");
            return -1;
        }
    }
    for (size_t i = 0; i < s->ev.mail.param_count; i++) {
        if (!s->ev.mail.smtputf8 && has_8bit(s->ev.mail.params[i].value)) {
            reply(s, 501, "5.5.4", "Malformed parameter");
            return -1;
        }
    }
    return 0;
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
}

/* §4.1.1.3: RCPT TO:<forward-path> [SP rcpt-parameters] */
static void cmd_rcpt(smtpe_server *s, smtpe_span arg)
{
    if (!s->in_transaction) {
        reply(s, 503, "5.5.1", "Need MAIL command");
        return;
    }
    memset(&s->ev.rcpt, 0, sizeof s->ev.rcpt);
    if (parse_path_params(s, arg, 0, &s->ev.rcpt.forward_path, s->ev.rcpt.params,
                          &s->ev.rcpt.param_count) != 0)
        return;
    if (s->ev.rcpt.param_count > 0) {
        reply(s, 555, "5.5.4", "Unsupported parameter");
        return;
    }
    if ((s->ev.rcpt.forward_path.flags & SMTPE_PATH_UTF8) && !s->smtputf8) {
        reply(s, 553, "5.6.7", "Non-ASCII address requires SMTPUTF8");
        return;
    }
    if (s->rcpts >= s->cfg->max_recipients) {
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
    else
        raise_event(s, SMTPE_EV_DATA);
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
        reset_transaction(s);
        reply(s, 250, "2.0.0", "Ok");
        raise_event(s, SMTPE_EV_RSET);
    } else { /* §4.1.1.10 QUIT */
        (void)out_reply(s, 221, "2.0.0", "Bye", 3, 1);
        s->closing = 1;
        raise_event(s, SMTPE_EV_QUIT);
    }
}

static void handle_line(smtpe_server *s)
{
    smtpe_span verb, arg;
    smtpe__verb v;
    s->stats.commands++;
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
    case SMTPE__VERB_HELO:
    case SMTPE__VERB_EHLO:
        cmd_helo(s, arg, v == SMTPE__VERB_EHLO);
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

/* The end of the content: hand the host DATA_END; refused content is answered here. */
static void data_end(smtpe_server *s)
{
    s->mode = MODE_COMMAND;
    s->ev.data_end.size = s->data.size;
    s->ev.data_end.status = s->data.status;
    s->ev.data_end.flags = s->data.flags;
    raise_event(s, SMTPE_EV_DATA_END);
    if (s->data.status == SMTPE_DATA_TOO_BIG) {
        reply(s, 552, "5.3.4", "Message size exceeds fixed limit"); /* RFC 1870 §6.3 */
        reset_transaction(s);
    } else if (s->data.status == SMTPE_DATA_BAD_LINE_ENDING) {
        reply(s, 550, "5.6.0", "Bare CR, LF or NUL in message content");
        reset_transaction(s);
    }
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
        data_end(s);
    }
    return n;
}

ssize_t smtpe_server_recv(smtpe_server *s, const uint8_t *buf, size_t len, uint64_t now_ms)
{
    size_t used = 0;
    int progress = 0; /* a command line completed or content arrived */
    if (!s || (!buf && len > 0))
        return SMTPE_ERR_INVALID_ARGUMENT;
    while (used < len && !s->closing && !s->event_ready && s->verdict == SMTPE_EV_NONE &&
           out_space(s) >= s->reserve) {
        if (s->mode == MODE_DATA) {
            used += recv_data(s, buf + used, len - used);
            progress = 1;
            continue;
        }
        if (s->line.flags & SMTPE__LINE_DONE)
            smtpe__line_reset(&s->line);
        used += smtpe__line_feed(&s->line, buf + used, len - used, s->cfg->line_ending);
        if (s->line.flags & SMTPE__LINE_DONE) {
            handle_line(s);
            progress = 1;
        }
    }
    if (progress) { /* RFC 5321 §4.5.3.2.7: the wait is for the next whole command */
        s->last_activity = now_ms;
        s->timer_restart = 0;
    }
    s->stats.octets_in += used;
    return (ssize_t)used;
}

int smtpe_server_next_event(smtpe_server *s, smtpe_event *ev)
{
    if (!s || !ev || !s->event_ready)
        return 0;
    if (s->ev.type == SMTPE_EV_DATA_CHUNK) { /* the hot path: copy only what it uses */
        ev->type = SMTPE_EV_DATA_CHUNK;
        ev->chunk = s->ev.chunk;
    } else {
        *ev = s->ev;
    }
    s->event_ready = 0;
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

/* The EHLO reply (RFC 5321 §4.1.1.1): the first line, then one line per extension. */
static int ehlo_reply(smtpe_server *s, unsigned code, const char *first)
{
    const smtpe_server_config *c = s->cfg;
    char size[40];
    const char *lines[6 + 64];
    size_t n = 0, at;
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
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        lines[n++] = c->ehlo_extra[i];
    out_compact(s);
    at = s->out_len;
    for (size_t i = 0; i < n && at != SIZE_MAX; i++)
        at = smtpe__reply_line(s->out, s->out_cap - CLOSE_RESERVE, at, code, i + 1 == n, NULL,
                               lines[i], strlen(lines[i]));
    if (at == SIZE_MAX)
        return SMTPE_ERR_REPLY_TOO_LONG;
    s->out_len = at;
    return 0;
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
    if (type == SMTPE_EV_DATA)
        return code == 354 || cls >= 4;
    return type == SMTPE_EV_UNKNOWN || cls != 3;
}

/* What a verdict means for the session (see smtpe_server_reply). */
static void apply_verdict(smtpe_server *s, smtpe_event_type type, unsigned code)
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
            s->smtputf8 = s->ev.mail.smtputf8;
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
    default:
        break;
    }
    if (code == 421)
        s->closing = 1;
}

static int verdict(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    smtpe_event_type type = s->verdict;
    char enh[8];
    int r;
    if (type == SMTPE_EV_HELO && code / 100 == 2) {
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
        r = reply(s, code, enhanced, text);
    }
    if (r != 0)
        return r;
    s->verdict = SMTPE_EV_NONE;
    s->event_ready = s->ev.type == SMTPE_EV_ERROR_LIMIT; /* reply() may have raised it */
    s->timer_restart = 1;
    if (!s->closing || code == 421)
        apply_verdict(s, type, code);
    return 0;
}

int smtpe_server_reply(smtpe_server *s, unsigned code, const char *enhanced, const char *text)
{
    if (!s)
        return SMTPE_ERR_INVALID_ARGUMENT;
    if (s->verdict == SMTPE_EV_NONE)
        return SMTPE_ERR_STATE;
    int r = code_fits(s->verdict, code) ? check_reply_args(code, enhanced, text)
                                        : SMTPE_ERR_INVALID_ARGUMENT;
    if (r == 0 && s->verdict == SMTPE_EV_HELO && text && strchr(text, '\n'))
        r = SMTPE_ERR_INVALID_ARGUMENT; /* the first line of the EHLO reply is one line */
    return r ? r : verdict(s, code, enhanced, text);
}

int smtpe_server_accept(smtpe_server *s)
{
    if (!s)
        return SMTPE_ERR_INVALID_ARGUMENT;
    switch (s->verdict) {
    case SMTPE_EV_HELO:
        return verdict(s, 250, NULL, NULL);
    case SMTPE_EV_MAIL:
        return verdict(s, 250, "2.1.0", "Ok");
    case SMTPE_EV_RCPT:
        return verdict(s, 250, "2.1.5", "Ok");
    case SMTPE_EV_DATA:
        return verdict(s, 354, NULL, "End data with <CR><LF>.<CR><LF>");
    case SMTPE_EV_DATA_END:
        return verdict(s, 250, "2.0.0", "Ok");
    case SMTPE_EV_VRFY:
        return verdict(s, 252, "2.5.0",
                       "Cannot VRFY user, but will accept message and attempt delivery");
    case SMTPE_EV_EXPN:
        return verdict(s, 252, "2.5.0", "Cannot EXPN list");
    case SMTPE_EV_UNKNOWN:
        return verdict(s, 500, "5.5.1", "Command unrecognized");
    default:
        return SMTPE_ERR_STATE;
    }
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
    if (s->stats.octets_out == 0 && s->out_off == 0)
        s->out_len = 0; /* nothing sent yet: the reply replaces the greeting */
    if (!enhanced)
        enhanced = default_enhanced(enh, code);
    if (!text)
        text = default_text(code);
    r = out_reply(s, code, enhanced, text, strlen(text), 1);
    if (r != 0)
        return r;
    s->verdict = SMTPE_EV_NONE;
    s->event_ready = 0;
    s->closing = 1;
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
    *len = s->out_len - s->out_off;
    return s->out + s->out_off;
}

int smtpe_server_send_ack(smtpe_server *s, size_t n)
{
    if (!s || n > s->out_len - s->out_off)
        return SMTPE_ERR_INVALID_ARGUMENT;
    s->out_off += n;
    s->stats.octets_out += n;
    if (s->out_off == s->out_len)
        s->out_off = s->out_len = 0;
    return 0;
}

unsigned smtpe_server_want(const smtpe_server *s)
{
    unsigned w = 0;
    if (!s)
        return 0;
    if (s->out_len > s->out_off)
        w |= SMTPE_WANT_WRITE;
    if (s->event_ready)
        w |= SMTPE_WANT_EVENT;
    if (s->closing)
        return w | SMTPE_WANT_CLOSE;
    if (s->verdict != SMTPE_EV_NONE)
        w |= SMTPE_WANT_VERDICT;
    else if (!s->event_ready && out_space(s) >= s->reserve)
        w |= SMTPE_WANT_READ;
    return w;
}

uint64_t smtpe_server_expiry(const smtpe_server *s)
{
    uint64_t t;
    if (!s || s->closing || s->event_ready || s->verdict != SMTPE_EV_NONE)
        return UINT64_MAX;
    if (s->timer_restart)
        return 0; /* call handle_expiry now so that the timer restarts from the host's clock */
    t = s->mode == MODE_DATA ? s->cfg->data_timeout_ms : s->cfg->command_timeout_ms;
    if (t == 0 || s->last_activity > UINT64_MAX - t)
        return UINT64_MAX;
    return s->last_activity + t;
}

int smtpe_server_handle_expiry(smtpe_server *s, uint64_t now_ms)
{
    uint64_t due = smtpe_server_expiry(s);
    if (!s || due == UINT64_MAX)
        return 0;
    if (s->timer_restart) {
        s->timer_restart = 0;
        s->last_activity = now_ms;
        return 0;
    }
    if (now_ms < due)
        return 0;
    close_with(s, 421, "4.4.2", "Timeout exceeded"); /* RFC 5321 §4.5.3.2 */
    raise_event(s, SMTPE_EV_TIMEOUT);
    return 1;
}

void smtpe_server_get_stats(const smtpe_server *s, smtpe_server_stats *st)
{
    if (s && st)
        *st = s->stats;
}

const char *smtpe_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
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
