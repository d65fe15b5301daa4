/*
 * session.c - host verdicts for one SMTP session (see session.h).
 *
 * Every verdict is given at once: this host has nothing to wait for except its own disk. The
 * policy is small: any HELO/EHLO and MAIL; RCPT only for the --domain list (and always for
 * <postmaster>, RFC 5321 §4.5.1); DATA once the Maildir file is open; end of data only once the
 * file is durable in new/. The file holds Return-Path, a Received header (RFC 5321 §4.4) and the
 * content exactly as the engine gave it.
 */
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"

#define TRACE_MAX (3 * SESSION_NAME_MAX + 2 * HOST_NAME_MAX_LEN + 256)

void session_init(struct session *ss, const struct host_ctx *ctx, const struct sockaddr *peer)
{
    unsigned port;

    memset(ss, 0, sizeof *ss);
    ss->ctx = ctx;
    net_ip_text(peer, ss->peer_ip, &port, &ss->peer_v6);
    (void)net_hostport(peer, ss->peer);
}

void session_set_end(struct session *ss, const char *reason)
{
    if (ss->end == NULL)
        ss->end = reason;
}

void session_abort(struct session *ss)
{
    maildir_msg_abort(ss->msg);
    ss->msg = NULL;
}

/* Copies a span as a C string, control octets (which no valid name or path holds) replaced by
 * '?' so that nothing can break a header line. Returns -1 if it does not fit. */
static int copy_name(char dst[SESSION_NAME_MAX + 1], smtpe_span sp)
{
    if (sp.len > SESSION_NAME_MAX)
        return -1;
    for (size_t i = 0; i < sp.len; i++) {
        uint8_t c = sp.ptr[i];
        dst[i] = (char)(c < 0x20 || c == 0x7f ? '?' : c);
    }
    dst[sp.len] = '\0';
    return 0;
}

/* The mailbox of a path as the event gave it; "postmaster" style paths carry no domain. */
static smtpe_span path_mailbox(const smtpe_path *p)
{
    return p->mailbox.len > 0 ? p->mailbox : p->local_part;
}

static int ascii_ieq(const char *a, smtpe_span b)
{
    if (strlen(a) != b.len)
        return 0;
    for (size_t i = 0; i < b.len; i++) {
        unsigned char x = (unsigned char)a[i], y = b.ptr[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y - 'A' + 'a');
        if (x != y)
            return 0;
    }
    return 1;
}

static int domain_accepted(const struct host_options *o, const smtpe_path *p)
{
    if (o->domain_count == 0 || (p->flags & SMTPE_PATH_POSTMASTER))
        return 1;
    for (size_t i = 0; i < o->domain_count; i++)
        if (ascii_ieq(o->domains[i], p->domain))
            return 1;
    return 0;
}

/* "Mon, 30 Nov 2026 05:00:00 +0000" (RFC 5322 §3.3), in UTC, independent of the locale. */
static void rfc5322_date(time_t t, char *out, size_t cap)
{
    static const char wday[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char mon[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct tm tm;

    if (gmtime_r(&t, &tm) == NULL) {
        snprintf(out, cap, "Thu, 1 Jan 1970 00:00:00 +0000");
        return;
    }
    snprintf(out, cap, "%s, %d %s %d %02d:%02d:%02d +0000", wday[tm.tm_wday % 7], tm.tm_mday,
             mon[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* Return-Path and Received (RFC 5321 §4.4; protocol names of RFC 3848 and RFC 6531 §3.7.3). */
static int write_trace(struct session *ss, time_t now)
{
    const char *hostname = ss->ctx->opt.hostname;
    /* RFC 6531 §3.7.3 registers "UTF8SMTP" for ESMTP with SMTPUTF8 (which needs EHLO). */
    const char *proto = ss->smtputf8 ? "UTF8SMTP" : ss->esmtp ? "ESMTP" : "SMTP";
    char date[64], buf[TRACE_MAX];
    int n;

    rfc5322_date(now, date, sizeof date);
    n = snprintf(buf, sizeof buf,
                 "Return-Path: <%s>\r\n"
                 "Received: from %s (%s%s%s)\r\n"
                 "\tby %s (smtpe) with %s id %s%s%s%s; %s\r\n",
                 ss->mail, ss->helo[0] ? ss->helo : "unknown",
                 ss->peer_v6 ? "[IPv6:" : "[", ss->peer_ip, "]", hostname, proto, ss->queue_id,
                 ss->nrcpt == 1 ? "\r\n\tfor <" : "", ss->nrcpt == 1 ? ss->rcpt : "",
                 ss->nrcpt == 1 ? ">" : "", date);
    if (n < 0 || (size_t)n >= sizeof buf)
        return -1;
    return maildir_msg_write(ss->msg, buf, (size_t)n);
}

static void log_message(const struct session *ss, uint64_t size, const char *status,
                        unsigned flags)
{
    char from[3 * SESSION_NAME_MAX + 1];

    host_log("message id=%s from=<%s> nrcpt=%u size=%llu status=%s%s", ss->queue_id,
             host_log_token(from, sizeof from, ss->mail, strlen(ss->mail)), ss->nrcpt,
             (unsigned long long)size, status,
             (flags & SMTPE_DATA_NORMALISED) ? " normalised" : "");
}

static int on_helo(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    if (copy_name(ss->helo, ev->helo.domain) < 0)
        return smtpe_server_reply(s, 501, "5.5.4", "Hostname too long");
    ss->esmtp = ev->helo.esmtp;
    ss->nrcpt = 0;
    return smtpe_server_accept(s);
}

static int on_mail(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    if (copy_name(ss->mail, ev->mail.reverse_path.mailbox) < 0)
        return smtpe_server_reply(s, 501, "5.1.7", "Path too long");
    ss->smtputf8 = ev->mail.smtputf8;
    ss->nrcpt = 0;
    ss->rcpt[0] = '\0';
    ss->mails++;
    return smtpe_server_accept(s);
}

static int on_rcpt(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    const smtpe_path *p = &ev->rcpt.forward_path;
    char tmp[SESSION_NAME_MAX + 1];

    if (!domain_accepted(&ss->ctx->opt, p))
        return smtpe_server_reply(s, 550, "5.7.1", "Relay access denied");
    if (copy_name(tmp, path_mailbox(p)) < 0)
        return smtpe_server_reply(s, 501, "5.1.3", "Path too long");
    if (ss->nrcpt == 0)
        memcpy(ss->rcpt, tmp, sizeof tmp);
    ss->nrcpt++;
    ss->rcpts++;
    return smtpe_server_accept(s);
}

static int on_data(struct session *ss, smtpe_server *s)
{
    time_t now = time(NULL);

    maildir_queue_id(ss->queue_id);
    if (!ss->ctx->opt.sink) {
        ss->msg = maildir_msg_begin(&ss->ctx->maildir, ss->queue_id, now);
        if (ss->msg == NULL || write_trace(ss, now) < 0) {
            host_log("error id=%s maildir: %s", ss->queue_id, strerror(errno));
            session_abort(ss);
            log_message(ss, 0, "io-error", 0);
            return smtpe_server_reply(s, 451, "4.3.0",
                                      "Requested action aborted: local error in processing");
        }
    }
    ss->datas++;
    return smtpe_server_accept(s);
}

static void on_chunk(struct session *ss, smtpe_span chunk)
{
    if (ss->msg != NULL)
        (void)maildir_msg_write(ss->msg, chunk.ptr, chunk.len); /* error seen at commit */
}

static int on_data_end(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    char text[64];
    int status = ev->data_end.status;

    if (status != SMTPE_DATA_OK) { /* the engine has already replied */
        session_abort(ss);
        log_message(ss, ev->data_end.size,
                    status == SMTPE_DATA_TOO_BIG ? "too-big" : "bad-line-ending",
                    ev->data_end.flags);
        return 0;
    }
    if (ss->msg != NULL) {
        struct maildir_msg *m = ss->msg;
        ss->msg = NULL;
        if (maildir_msg_commit(m) < 0) {
            host_log("error id=%s maildir: %s", ss->queue_id, strerror(errno));
            log_message(ss, ev->data_end.size, "io-error", ev->data_end.flags);
            return smtpe_server_reply(s, 451, "4.3.0",
                                      "Requested action aborted: local error in processing");
        }
    }
    ss->delivered++;
    log_message(ss, ev->data_end.size, "queued", ev->data_end.flags);
    snprintf(text, sizeof text, "Ok: queued as %s", ss->queue_id);
    return smtpe_server_reply(s, 250, "2.0.0", text);
}

int session_on_event(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    switch (ev->type) {
    case SMTPE_EV_HELO:
        return on_helo(ss, s, ev);
    case SMTPE_EV_MAIL:
        return on_mail(ss, s, ev);
    case SMTPE_EV_RCPT:
        return on_rcpt(ss, s, ev);
    case SMTPE_EV_DATA:
        return on_data(ss, s);
    case SMTPE_EV_DATA_CHUNK:
        on_chunk(ss, ev->chunk);
        return 0;
    case SMTPE_EV_DATA_END:
        return on_data_end(ss, s, ev);
    case SMTPE_EV_RSET:
        ss->nrcpt = 0;
        return 0;
    case SMTPE_EV_QUIT:
        session_set_end(ss, "quit");
        return 0;
    case SMTPE_EV_TIMEOUT:
        session_set_end(ss, "timeout");
        session_abort(ss);
        return 0;
    case SMTPE_EV_ERROR_LIMIT:
        session_set_end(ss, "error-limit");
        session_abort(ss);
        return 0;
    case SMTPE_EV_VRFY:
    case SMTPE_EV_EXPN:
    case SMTPE_EV_UNKNOWN:
    case SMTPE_EV_NONE:
        break;
    }
    return smtpe_event_needs_reply(ev) ? smtpe_server_accept(s) : 0;
}
