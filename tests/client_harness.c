/* client_harness.c - see client_harness.h. */
#include "client_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void buf_put(ch_buf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p)
            abort();
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void logf_(ch *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static void logf_(ch *h, const char *fmt, ...)
{
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    buf_put(&h->log, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static const char *outcome_name(int o);
static const char *reason_name(int r);

/* The span s C-escaped as hs_escape does (transcript style: each event stays one line). */
static void log_span(ch *h, smtpe_span s)
{
    for (size_t i = 0; i < s.len; i++) {
        uint8_t c = s.ptr[i];
        switch (c) {
        case '\r': logf_(h, "\\r"); break;
        case '\n': logf_(h, "\\n"); break;
        case '\t': logf_(h, "\\t"); break;
        case '\\': logf_(h, "\\\\"); break;
        case '"': logf_(h, "\\\""); break;
        default:
            if (c < 0x20 || c > 0x7e)
                logf_(h, "\\x%02x", c);
            else
                logf_(h, "%c", c);
        }
    }
}

/* READY in transcript style (see ch.transcript). */
static void log_ready_names(ch *h, const smtpe_client_caps *k)
{
    static const char *const names[] = {"PIPELINING", "SIZE", "8BITMIME", "SMTPUTF8",
                                        "ENHANCEDSTATUSCODES", "STARTTLS", "CHUNKING",
                                        "BINARYMIME", "DSN", "REQUIRETLS", "MT-PRIORITY",
                                        "DELIVERBY", "XCLIENT", "XFORWARD"};
    int first = 1;
    logf_(h, "READY ext=");
    for (unsigned b = 0; b < sizeof names / sizeof *names; b++) {
        if (!(k->extensions & (1u << b)))
            continue;
        logf_(h, "%s%s", first ? "" : ",", names[b]);
        first = 0;
    }
    if (k->extensions >> (sizeof names / sizeof *names))
        logf_(h, "%s%#x", first ? "" : ",", k->extensions >> (sizeof names / sizeof *names));
    else if (first)
        logf_(h, "none");
    logf_(h, " size=%llu auth=", (unsigned long long)k->size_limit);
    log_span(h, k->auth);
    logf_(h, " tls=%d auth_ok=%d", k->tls, k->authenticated);
    if (k->deliverby_min)
        logf_(h, " deliverby=%lld", (long long)k->deliverby_min);
    if (k->xclient.len) {
        logf_(h, " xclient=");
        log_span(h, k->xclient);
    }
    if (k->xforward.len) {
        logf_(h, " xforward=");
        log_span(h, k->xforward);
    }
    logf_(h, "%s\n", k->esmtp ? "" : " helo");
}

/* OUTCOME, AUTH_STEP and CLOSED in transcript style: the fields of log_event, spans escaped. */
static void log_escaped(ch *h, const smtpe_client_event *ev)
{
    switch (ev->type) {
    case SMTPE_CEV_AUTH_STEP:
        logf_(h, "AUTH_STEP %u ", ev->auth_step.step);
        log_span(h, ev->auth_step.challenge);
        break;
    case SMTPE_CEV_OUTCOME:
        logf_(h, "OUTCOME %zu %s %03u ", ev->outcome.index, outcome_name(ev->outcome.outcome),
              ev->outcome.code);
        if (ev->outcome.enhanced.len)
            log_span(h, ev->outcome.enhanced);
        else
            logf_(h, "-");
        logf_(h, " ");
        log_span(h, ev->outcome.text);
        logf_(h, "%s%s", ev->outcome.local ? " [local]" : "",
              ev->outcome.before_mail ? " [before-mail]" : "");
        break;
    default: /* CLOSED */
        logf_(h, "CLOSED %s %03u ", reason_name(ev->closed.reason), ev->closed.code);
        log_span(h, ev->closed.text);
        h->closed = 1;
        break;
    }
    logf_(h, "\n");
}

void ch_init(ch *h)
{
    memset(h, 0, sizeof *h);
    smtpe_client_config_init(&h->cfg);
    h->cfg.helo_name = "client.example";
    h->seed = 12345;
}

int ch_open(ch *h)
{
    return smtpe_client_new(&h->c, &h->cfg, NULL, h->now);
}

void ch_free(ch *h)
{
    smtpe_client_free(h->c);
    free(h->out.p);
    free(h->log.p);
    free(h->taken.p);
    h->c = NULL;
    memset(&h->out, 0, sizeof h->out);
    memset(&h->log, 0, sizeof h->log);
    memset(&h->taken, 0, sizeof h->taken);
}

int ch_submit(ch *h, const char *from, const char *const *to, size_t n)
{
    h->txn.reverse_path = from;
    for (size_t i = 0; i < n && i < 64; i++) {
        memset(&h->rcpts[i], 0, sizeof h->rcpts[i]);
        h->rcpts[i].forward_path = to[i];
    }
    h->txn.rcpts = h->rcpts;
    h->txn.rcpt_count = n;
    int r = smtpe_client_submit(h->c, &h->txn);
    ch_pump(h);
    return r;
}

static const char *outcome_name(int o)
{
    static const char *const names[] = {"?", "delivered", "permanent", "temporary", "unknown"};
    return o >= 1 && o <= 4 ? names[o] : "?";
}

static const char *reason_name(int r)
{
    static const char *const names[] = {"quit",   "421",          "protocol-error",
                                        "lost",   "timeout",      "tls-required",
                                        "auth-failed", "aborted", "refused"};
    return r >= 0 && r <= 8 ? names[r] : "?";
}

static void log_event(ch *h, const smtpe_client_event *ev)
{
    if (h->transcript && ev->type == SMTPE_CEV_READY) {
        log_ready_names(h, &ev->ready);
        return;
    }
    if (h->transcript && (ev->type == SMTPE_CEV_AUTH_STEP || ev->type == SMTPE_CEV_OUTCOME ||
                          ev->type == SMTPE_CEV_CLOSED)) {
        log_escaped(h, ev);
        return;
    }
    switch (ev->type) {
    case SMTPE_CEV_READY:
        logf_(h, "READY ext=%#x size=%llu auth=%.*s tls=%d auth_ok=%d\n",
              ev->ready.extensions, (unsigned long long)ev->ready.size_limit,
              (int)ev->ready.auth.len, (const char *)ev->ready.auth.ptr, ev->ready.tls,
              ev->ready.authenticated);
        break;
    case SMTPE_CEV_STARTTLS: logf_(h, "STARTTLS\n"); break;
    case SMTPE_CEV_AUTH_STEP:
        logf_(h, "AUTH_STEP %u %.*s\n", ev->auth_step.step, (int)ev->auth_step.challenge.len,
              (const char *)ev->auth_step.challenge.ptr);
        break;
    case SMTPE_CEV_CONTENT: logf_(h, "CONTENT\n"); break;
    case SMTPE_CEV_OUTCOME:
        logf_(h, "OUTCOME %zu %s %03u %.*s %.*s%s%s\n", ev->outcome.index,
              outcome_name(ev->outcome.outcome), ev->outcome.code,
              ev->outcome.enhanced.len ? (int)ev->outcome.enhanced.len : 1,
              ev->outcome.enhanced.len ? (const char *)ev->outcome.enhanced.ptr : "-",
              (int)ev->outcome.text.len, (const char *)ev->outcome.text.ptr,
              ev->outcome.local ? " [local]" : "", ev->outcome.before_mail ? " [before-mail]" : "");
        break;
    case SMTPE_CEV_TRANSACTION_DONE:
        logf_(h, "DONE %zu/%zu/%zu/%zu%s\n", ev->done.delivered, ev->done.permanent,
              ev->done.temporary, ev->done.unknown, ev->done.reusable ? " reusable" : "");
        break;
    case SMTPE_CEV_CLOSED:
        logf_(h, "CLOSED %s %03u %.*s\n", reason_name(ev->closed.reason), ev->closed.code,
              (int)ev->closed.text.len, (const char *)ev->closed.text.ptr);
        h->closed = 1;
        break;
    default: logf_(h, "EVENT %d\n", (int)ev->type); break;
    }
}

static int give_content(ch *h)
{
    int progress = 0;
    while (smtpe_client_want(h->c) & SMTPE_WANT_CONTENT) {
        size_t have = h->content_limited && h->content_limit < h->content_len
                          ? h->content_limit : h->content_len;
        size_t left = have > h->content_at ? have - h->content_at : 0;
        size_t n = h->piece && h->piece < left ? h->piece : left;
        int last = n == left && have == h->content_len;
        if (n == 0 && !last)
            return progress; /* the host has nothing more yet */
        smtpe_ssize r = smtpe_client_content(h->c, h->content + h->content_at, n, last);
        if (r < 0) {
            logf_(h, "CONTENT-ERROR %d\n", (int)r);
            return progress;
        }
        h->content_at += (size_t)r;
        if (r == 0 && !(last && n == 0))
            return progress;
        progress = 1;
        if (last && (size_t)r == n)
            return progress; /* the final piece is in */
    }
    return progress;
}

void ch_pump(ch *h)
{
    int progress = 1;
    while (progress) {
        smtpe_client_event ev;
        size_t len;
        const uint8_t *o;
        progress = 0;
        while (smtpe_client_next_event(h->c, &ev) == 1) {
            progress = 1;
            log_event(h, &ev);
            if (ev.type == SMTPE_CEV_STARTTLS && !h->manual_tls) {
                /* the handshake comes once what was read is fed (ch_server_n): an octet
                 * after the 220 then reaches the engine first, as smtpe.h asks */
                h->tls_due = 1;
            } else if (ev.type == SMTPE_CEV_AUTH_STEP) {
                unsigned i = ev.auth_step.step;
                const char *r = i < 8 ? h->auth_steps[i] : NULL;
                size_t n = !r ? 0 : h->auth_step_lens ? h->auth_step_len[i] : strlen(r);
                int e = smtpe_client_auth_response(h->c, (const uint8_t *)r, n);
                if (e < 0 && h->transcript)
                    logf_(h, "AUTH-RESPONSE-ERROR %d\n", e);
            } else if (ev.type == SMTPE_CEV_CONTENT && h->abort_content) {
                logf_(h, "ABORT %d\n", smtpe_client_abort_content(h->c));
            }
        }
        while (!h->write_blocked && (o = smtpe_client_send_buf(h->c, &len)) && len > 0) {
            if (h->write_chunk && len > h->write_chunk)
                len = h->write_chunk;
            buf_put(&h->out, o, len);
            smtpe_client_send_ack(h->c, len);
            progress = 1;
            if (h->write_chunk)
                break; /* a slow socket: one short write per round */
        }
        if (!h->abort_content && give_content(h))
            progress = 1;
    }
    (void)smtpe_client_expiry(h->c, h->now); /* a host arms its timer after each round */
}

static uint32_t next_rand(uint32_t *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

void ch_server_n(ch *h, const uint8_t *p, size_t n)
{
    size_t off = 0;
    int stuck = 0;
    while (off < n && stuck < 4) {
        size_t chunk = n - off;
        if (h->split == CH_OCTET)
            chunk = 1;
        else if (h->split == CH_RANDOM)
            chunk = 1 + next_rand(&h->seed) % (chunk < 17 ? chunk : 17);
        smtpe_ssize r = smtpe_client_recv(h->c, p + off, chunk, h->now);
        if (r < 0) {
            logf_(h, "RECV-ERROR %d\n", (int)r);
            return;
        }
        off += (size_t)r;
        stuck = r == 0 ? stuck + 1 : 0;
        ch_pump(h);
    }
    if (off < n)
        logf_(h, "UNREAD %zu\n", n - off);
    if (h->tls_due) { /* all read is fed: send what is queued, the handshake, say so */
        size_t len;
        const uint8_t *o;
        h->tls_due = 0;
        if (smtpe_client_want(h->c) & SMTPE_WANT_TLS) {
            while ((o = smtpe_client_send_buf(h->c, &len)) && len > 0) {
                buf_put(&h->out, o, len);
                smtpe_client_send_ack(h->c, len);
            }
            buf_put(&h->out, "<TLS>", 5);
            smtpe_client_tls_started(h->c, h->now);
            ch_pump(h);
        }
    }
}

void ch_server(ch *h, const char *octets)
{
    ch_server_n(h, (const uint8_t *)octets, strlen(octets));
}

/* Moves b's text into h->taken and empties b. */
static const char *take(ch *h, ch_buf *b)
{
    h->taken.len = 0;
    buf_put(&h->taken, b->p ? b->p : "", b->len);
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
    return h->taken.p;
}

const char *ch_take_out(ch *h)
{
    return take(h, &h->out);
}

const char *ch_take_out_len(ch *h, size_t *len)
{
    *len = h->out.len;
    return take(h, &h->out);
}

const char *ch_take_log(ch *h)
{
    return take(h, &h->log);
}

void ch_time(ch *h, uint64_t t)
{
    h->now = t;
    if (smtpe_client_handle_expiry(h->c, t))
        logf_(h, "EXPIRED\n");
    ch_pump(h);
}
