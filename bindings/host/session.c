/*
 * session.c - host verdicts for one SMTP or LMTP session (see session.h).
 *
 * Every verdict is given at once except two that wait for blocking work: the fsync and rename
 * that make a message durable, and the crypt(3) of an AUTH attempt. Those run as a job in the
 * loop's pool (jobs.h) and their verdict follows when the job is back (session_job_done); in
 * the threads model (no pool) they run on the session's own thread. The policy is small: any
 * HELO/EHLO/LHLO and MAIL; RCPT only for the --domain list (550 5.7.1 otherwise), then only for
 * the --recipients table (550 5.1.1 otherwise; recipients.h), and always for <postmaster>
 * (RFC 5321 §4.5.1); DATA (or the first BDAT chunk) once the
 * Maildir file is open; end of data only once the file is durable in new/ (under LMTP, one
 * reply per accepted recipient, RFC 2033 §4.2); AUTH PLAIN/LOGIN against the --auth-users
 * file; STARTTLS when a certificate is configured; PROXY, XCLIENT and XFORWARD always (the
 * engine only lets trusted peers and configured sessions reach them). The file holds
 * Return-Path, a Received header (RFC 5321 §4.4, protocol names of RFC 3848) and the content
 * as the engine gave it, with LF line ends unless --maildir-crlf or BODY=BINARYMIME. With a
 * --maildir template each recipient's mailbox is decided at RCPT (refused if no path can be
 * made), recipients of one mailbox share its copy, and each copy starts with its own
 * Delivered-To line (RFC 9228) unless --no-delivered-to.
 */
#include "session.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "log.h"
#include "recipients.h"

#define TRACE_MAX (4 * SESSION_NAME_MAX + 3 * HOST_NAME_MAX_LEN + 512)
#define LMTP_TEXT_MAILBOX_MAX 300 /* longer mailboxes are left out of a per-recipient reply */
#define LOCAL_ERROR_TEXT "Requested action aborted: local error in processing"

/* Sets the log form of the client from peer_ip/peer_port/peer_unix. */
static void set_peer_text(struct session *ss)
{
    if (ss->peer_unix)
        snprintf(ss->peer, sizeof ss->peer, "unix");
    else if (ss->peer_ip[0] == '\0')
        snprintf(ss->peer, sizeof ss->peer, "unknown");
    else
        snprintf(ss->peer, sizeof ss->peer, ss->peer_v6 ? "[%s]:%u" : "%s:%u", ss->peer_ip,
                 ss->peer_port);
}

/* The blocking step of a verdict, run in the pool (or inline) on copies of what it needs. */
struct session_job {
    struct job base; /* first: an orphaned job is freed as the block it is */
    enum { JOB_COMMIT, JOB_AUTH } kind;
    int ok;          /* the result (JOB_COMMIT: every mailbox stored) */
    int err;         /* JOB_COMMIT: errno of a failed commit */
    struct maildir_msg *msg; /* JOB_COMMIT: committed (or removed) and freed by the run */
    /* JOB_COMMIT: the session's mailboxes and recipient map, lent for the commit (msg points
     * into boxes) and given back by session_job_done; freed by job_release */
    struct maildir_box *boxes;
    size_t nbox;
    unsigned *rcpt_box;
    const struct auth_db *db; /* JOB_AUTH: the check, on copies wiped by the run */
    size_t user_len, password_len;
    uint8_t user[AUTH_USER_MAX + 1];
    uint8_t password[AUTH_PASSWORD_MAX + 1];
    /* what the verdict (or, with the client gone, the log) needs afterwards */
    char queue_id[MAILDIR_QUEUE_ID_LEN + 1];
    char sid[HOST_LOG_SID_LEN + 1];
    uint64_t size;
    unsigned flags, replies;
    int authz_ok;
    const char *mechanism;
};

static void job_run(struct job *j)
{
    struct session_job *sj = (struct session_job *)j;

    if (sj->kind == JOB_COMMIT) {
        sj->ok = maildir_msg_commit(sj->msg) == 0;
        sj->err = sj->ok ? 0 : errno;
        sj->msg = NULL;
        return;
    }
    sj->ok = auth_db_check(sj->db, sj->user, sj->user_len, sj->password, sj->password_len);
    explicit_bzero(sj->password, sizeof sj->password);
    sj->password_len = 0;
}

/* The client left before the job started: nothing is stored, nothing is checked. */
static void job_cancelled(struct job *j)
{
    struct session_job *sj = (struct session_job *)j;

    if (sj->kind == JOB_COMMIT) {
        maildir_msg_abort(sj->msg); /* never acknowledged: the client will send it again */
        sj->msg = NULL;
        sj->ok = 0;
        sj->err = ECANCELED;
    }
    explicit_bzero(sj->password, sizeof sj->password);
    sj->password_len = 0;
}

/* A job whose session has ended comes back: the message line, since the session cannot write
 * it (a message stored whose 250 never reached the client is logged as such). */
static void job_release(struct job *j)
{
    struct session_job *sj = (struct session_job *)j;

    if (sj->kind == JOB_COMMIT) {
        maildir_boxes_clear(sj->boxes, sj->nbox);
        free(sj->boxes);
        free(sj->rcpt_box);
    }
    if (sj->kind == JOB_COMMIT)
        host_log("message sid=%s id=%s size=%llu status=%s client=gone", sj->sid, sj->queue_id,
                 (unsigned long long)sj->size,
                 sj->ok ? "queued-unacknowledged" : sj->err == ECANCELED ? "dropped" : "io-error");
    free(sj);
}

/* The session's job for a new blocking step. NULL if memory runs out. */
static struct session_job *job_get(struct session *ss)
{
    if (ss->job == NULL && (ss->job = malloc(sizeof *ss->job)) == NULL)
        return NULL;
    memset(&ss->job->base, 0, sizeof ss->job->base);
    ss->job->base.run = job_run;
    ss->job->base.cancel = job_cancelled;
    ss->job->base.release = job_release;
    ss->job->boxes = NULL;
    ss->job->nbox = 0;
    ss->job->rcpt_box = NULL;
    return ss->job;
}

/* Runs the job: in the pool (returns SESSION_WAIT) or here and now (returns 0, the result in
 * the job). */
static int job_start(struct session *ss, void *owner)
{
    if (ss->pool == NULL) {
        job_run(&ss->job->base);
        return 0;
    }
    ss->job->base.owner = owner;
    ss->job_pending = 1;
    job_submit(ss->pool, &ss->job->base);
    return SESSION_WAIT;
}

void session_init(struct session *ss, const struct host_ctx *ctx, struct job_pool *pool,
                  const struct sockaddr *peer)
{
    memset(ss, 0, sizeof *ss);
    ss->ctx = ctx;
    ss->pool = pool;
    host_log_session_id(ss->sid);
    net_ip_text(peer, ss->peer_ip, &ss->peer_port, &ss->peer_v6);
    ss->peer_unix = peer->sa_family == AF_UNIX;
    if (peer->sa_family != AF_INET && peer->sa_family != AF_INET6 && !ss->peer_unix)
        ss->peer_ip[0] = '\0';
    set_peer_text(ss);
}

int session_start(struct session *ss, smtpe_server *s, const struct sockaddr *peer)
{
    const struct host_options *o = &ss->ctx->opt;

    ss->socket_key = census_key(peer);
    ss->proxy_vouched =
        o->proxy_from_count > 0 && net_cidr_match_sa(o->proxy_from, o->proxy_from_count, peer);
    if (o->xclient_count > 0 && net_cidr_match_sa(o->xclient_from, o->xclient_count, peer))
        return smtpe_server_set_trusted(s, 1);
    return 0;
}

/* A name as a C string: NULL reads as "". */
static const char *str(const char *p)
{
    return p ? p : "";
}

/* Replaces *dst by a heap copy of src ("" frees it). Returns 0, or -1 without memory (*dst is
 * then unchanged). */
static int set_str(char **dst, const char *src)
{
    size_t n = strlen(src);
    char *p;

    if (n == 0) {
        free(*dst);
        *dst = NULL;
        return 0;
    }
    if ((p = realloc(*dst, n + 1)) == NULL)
        return -1;
    memcpy(p, src, n + 1);
    *dst = p;
    return 0;
}

static void clear_str(char **dst)
{
    free(*dst);
    *dst = NULL;
}

const char *session_helo(const struct session *ss)
{
    return str(ss->helo);
}

const char *session_auth_name(const struct session *ss)
{
    return ss->auth_user ? ss->auth_user : str(ss->xclient_login);
}

void session_set_end(struct session *ss, const char *reason)
{
    if (ss->end == NULL)
        ss->end = reason;
}

int session_quit(const struct session *ss)
{
    return ss->end != NULL && strcmp(ss->end, "quit") == 0;
}

void session_abort(struct session *ss)
{
    maildir_msg_abort(ss->msg);
    ss->msg = NULL;
}

void session_free(struct session *ss)
{
    if (ss->job != NULL && ss->job_pending) {
        ss->job->base.owner = NULL; /* the loop releases it when it comes back */
        job_cancel(&ss->job->base);
    } else
        free(ss->job);
    ss->job = NULL;
    ss->job_pending = 0;
    session_abort(ss);
    maildir_boxes_clear(ss->boxes, ss->nbox);
    free(ss->boxes);
    ss->boxes = NULL;
    ss->nbox = ss->box_cap = 0;
    free(ss->rcpt_box);
    ss->rcpt_box = NULL;
    ss->rcpt_box_cap = 0;
    free(ss->rcpts_buf);
    ss->rcpts_buf = NULL;
    ss->rcpts_len = ss->rcpts_cap = 0;
    free(ss->log_rcpts);
    free(ss->log_ids);
    ss->log_rcpts = ss->log_ids = NULL;
    clear_str(&ss->peer_name);
    clear_str(&ss->helo);
    clear_str(&ss->mail);
    clear_str(&ss->rcpt);
    clear_str(&ss->auth_user);
    clear_str(&ss->xclient_login);
    free(ss->xf);
    ss->xf = NULL;
    if (ss->seat.census != NULL)
        census_leave(ss->seat.census, ss->seat.slot, ss->seat.key);
    ss->seat.census = NULL;
}

/* The transaction is over (end of data, RSET, a new greeting, ...): forget its recipients, its
 * XFORWARD attributes and any unfinished message. */
static void end_transaction(struct session *ss)
{
    session_abort(ss); /* before the mailboxes: the message points into them */
    maildir_boxes_clear(ss->boxes, ss->nbox);
    ss->nbox = 0;
    ss->store_failed = 0;
    ss->nrcpt = 0;
    clear_str(&ss->rcpt);
    ss->rcpts_len = 0;
    ss->log_rcpts_len = 0;
    ss->log_rcpts_more = 0;
    free(ss->xf);
    ss->xf = NULL;
}

void session_tls_up(struct session *ss, const char *version, const char *cipher, int bits,
                    int alg_bits)
{
    ss->tls = 1;
    snprintf(ss->tls_version, sizeof ss->tls_version, "%s", version);
    snprintf(ss->tls_cipher, sizeof ss->tls_cipher, "%s", cipher);
    ss->tls_bits = bits;
    ss->tls_alg_bits = alg_bits;
    clear_str(&ss->helo);
    ss->esmtp = 0;
    clear_str(&ss->auth_user);
    clear_str(&ss->xclient_login); /* the engine forgets authentication at STARTTLS too */
    end_transaction(ss);
}

/* Copies a span as a C string of at most max octets, control octets (which no valid name or
 * path holds) replaced by '?' so that nothing can break a header line. Returns -1 if it does
 * not fit. */
static int copy_text(char *dst, size_t max, smtpe_span sp)
{
    if (sp.len > max)
        return -1;
    for (size_t i = 0; i < sp.len; i++) {
        uint8_t c = sp.ptr[i];
        dst[i] = (char)(c < 0x20 || c == 0x7f ? '?' : c);
    }
    dst[sp.len] = '\0';
    return 0;
}

static int copy_name(char dst[SESSION_NAME_MAX + 1], smtpe_span sp)
{
    return copy_text(dst, SESSION_NAME_MAX, sp);
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

/* The WITH protocol name (RFC 3848, RFC 6531 §3.7.3, RFC 2033): ESMTP, LMTP or UTF8SMTP/UTF8LMTP
 * (SMTPUTF8 on MAIL) followed by S under TLS and A once authenticated; HELO gives plain SMTP,
 * for which no such suffixes are registered. XFORWARD's PROTO, when given, replaces the base. */
static void protocol_name(const struct session *ss, char *out, size_t cap)
{
    const char *base = ss->ctx->cfg.lmtp ? (ss->smtputf8 ? "UTF8LMTP" : "LMTP")
                       : ss->smtputf8    ? "UTF8SMTP"
                       : ss->esmtp       ? "ESMTP"
                                         : "SMTP";
    int plain = !ss->ctx->cfg.lmtp && !ss->smtputf8 && !ss->esmtp;

    if (ss->xf != NULL && ss->xf->proto[0] != '\0') {
        snprintf(out, cap, "%s", ss->xf->proto);
        return;
    }
    snprintf(out, cap, "%s%s%s", base, !plain && ss->tls ? "S" : "",
             !plain && session_auth_name(ss)[0] ? "A" : "");
}

/* A client-supplied name (HELO argument, XCLIENT/XFORWARD NAME or HELO) as it may appear in the
 * Received header: the octets of a domain or address literal (letters, digits, . - _ : [ ])
 * are kept and every other one becomes '?', so that no name can add a comment, a "by" clause
 * or anything else that would forge the trace (RFC 5321 §4.4 Extended-Domain). */
static const char *trace_name(const char *in, char *out, size_t cap)
{
    size_t i = 0;
    for (; in[i] != '\0' && i + 1 < cap; i++) {
        unsigned char ch = (unsigned char)in[i];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '.' || ch == '-' || ch == '_' || ch == ':' || ch == '[' || ch == ']';
        out[i] = ok ? (char)ch : '?';
    }
    out[i] = '\0';
    return out;
}

/* "(name [ip])", "([ip])", "(name)", "(unix socket)" or "(unknown)": the TCP-info of the
 * Received header's from clause (RFC 5321 §4.4), for the forwarded client when XFORWARD
 * named one. */
static void tcp_info(const struct session *ss, char *out, size_t cap)
{
    char clean[HOST_NAME_MAX_LEN + 1];
    const struct session_xforward *xf = ss->xf;
    const char *name = trace_name(xf ? xf->name : str(ss->peer_name), clean, sizeof clean);
    const char *ip = xf ? xf->addr : ss->peer_ip;
    int v6 = xf ? xf->addr_v6 : ss->peer_v6;

    if (xf == NULL && ss->peer_unix)
        snprintf(out, cap, "(unix socket)");
    else if (ip[0] != '\0')
        snprintf(out, cap, "(%s%s[%s%s])", name, name[0] ? " " : "", v6 ? "IPv6:" : "", ip);
    else
        snprintf(out, cap, "(%s)", name[0] ? name : "unknown");
}

/* Return-Path and Received (RFC 5321 §4.4). Under TLS a comment names the protocol and cipher
 * as Postfix and Exim do. */
static int write_trace(struct session *ss, time_t now)
{
    const char *hostname = ss->ctx->opt.hostname;
    char clean[SESSION_NAME_MAX + 1];
    const char *helo = trace_name(ss->xf && ss->xf->helo[0] ? ss->xf->helo : str(ss->helo),
                                  clean, sizeof clean);
    char date[64], proto[32], info[HOST_NAME_MAX_LEN + NET_IP_MAX + 16], tls[160];
    char buf[TRACE_MAX];
    int n;

    rfc5322_date(now, date, sizeof date);
    protocol_name(ss, proto, sizeof proto);
    tcp_info(ss, info, sizeof info);
    tls[0] = '\0';
    if (ss->tls)
        snprintf(tls, sizeof tls, "\r\n\t(using %s with cipher %s (%d/%d bits))",
                 ss->tls_version, ss->tls_cipher, ss->tls_bits, ss->tls_alg_bits);
    n = snprintf(buf, sizeof buf,
                 "Return-Path: <%s>\r\n"
                 "Received: from %s %s%s\r\n"
                 "\tby %s (smtpe) with %s id %s%s%s%s; %s\r\n",
                 str(ss->mail), helo[0] ? helo : "unknown", info, tls, hostname, proto,
                 ss->queue_id, ss->nrcpt == 1 ? "\r\n\tfor <" : "",
                 ss->nrcpt == 1 ? str(ss->rcpt) : "", ss->nrcpt == 1 ? ">" : "", date);
    if (n < 0 || (size_t)n >= sizeof buf)
        return -1;
    return maildir_msg_write(ss->msg, buf, (size_t)n);
}

/* Adds item to one of the session's log lists (*list: heap of cap octets, allocated at the
 * first item); an item that does not fit, or finds no memory, is counted in *more. */
static void log_list_add(char **list, size_t cap, size_t *len, unsigned *more, const char *item)
{
    if (*list == NULL && (*list = malloc(cap)) != NULL)
        *len = 0;
    if (*list == NULL || host_log_list_add(*list, cap, len, item, strlen(item)) < 0)
        (*more)++;
}

/* An accepted forward-path, for the message line. */
static void log_rcpt(struct session *ss, const char *mailbox)
{
    log_list_add(&ss->log_rcpts, SESSION_LOG_RCPTS_MAX, &ss->log_rcpts_len, &ss->log_rcpts_more,
                 mailbox);
}

/* The message line: "message sid= id= peer= from=<> nrcpt= rcpts=a,b [rcpts_more=N] size=
 * status=[ normalised]"; a queued message's id goes to the disconnect line's list. */
static void log_message(struct session *ss, uint64_t size, const char *status, unsigned flags)
{
    char from[3 * SESSION_NAME_MAX + 1], more[32] = "";

    if (ss->log_rcpts_more > 0)
        snprintf(more, sizeof more, " rcpts_more=%u", ss->log_rcpts_more);
    host_log("message sid=%s id=%s peer=%s from=<%s> nrcpt=%u rcpts=%s%s size=%llu status=%s%s",
             ss->sid, ss->queue_id, ss->peer,
             host_log_token(from, sizeof from, str(ss->mail), strlen(str(ss->mail))), ss->nrcpt,
             ss->log_rcpts_len > 0 ? ss->log_rcpts : "-", more, (unsigned long long)size,
             status, (flags & SMTPE_DATA_NORMALISED) ? " normalised" : "");
    if (strcmp(status, "queued") != 0)
        return;
    log_list_add(&ss->log_ids, SESSION_LOG_IDS * (MAILDIR_QUEUE_ID_LEN + 1), &ss->log_ids_len,
                 &ss->log_ids_more, ss->queue_id);
}

static int on_helo(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    char tmp[SESSION_NAME_MAX + 1];

    end_transaction(ss); /* a greeting resets any transaction (RFC 5321 §4.1.4) */
    if (copy_name(tmp, ev->helo.domain) < 0)
        return smtpe_server_reply(s, 501, "5.5.4", "Hostname too long");
    if (set_str(&ss->helo, tmp) < 0)
        return smtpe_server_reply(s, 451, "4.3.0", LOCAL_ERROR_TEXT);
    ss->esmtp = ev->helo.esmtp;
    return smtpe_server_accept(s);
}

static int on_mail(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    struct session_xforward *xf = ss->xf; /* XFORWARD comes before MAIL and is for this one */
    char tmp[SESSION_NAME_MAX + 1];

    if (copy_name(tmp, ev->mail.reverse_path.mailbox) < 0)
        return smtpe_server_reply(s, 501, "5.1.7", "Path too long");
    if (set_str(&ss->mail, tmp) < 0)
        return smtpe_server_reply(s, 451, "4.3.0", LOCAL_ERROR_TEXT);
    ss->xf = NULL;
    end_transaction(ss);
    ss->xf = xf;
    ss->smtputf8 = ev->mail.smtputf8;
    ss->binarymime = ev->mail.body == SMTPE_BODY_BINARYMIME;
    ss->mails++;
    return smtpe_server_accept(s);
}

/* LMTP: appends a recipient mailbox to the transaction's list. Returns 0, or -1 without
 * memory. */
static int remember_rcpt(struct session *ss, const char *mailbox)
{
    size_t need = strlen(mailbox) + 1;

    if (ss->rcpts_len + need > ss->rcpts_cap) {
        size_t bound = (size_t)ss->ctx->cfg.max_recipients * (SESSION_NAME_MAX + 1);
        size_t cap = ss->rcpts_cap ? ss->rcpts_cap * 2 : 1024;
        char *p;
        while (cap < ss->rcpts_len + need)
            cap *= 2;
        if (cap > bound)
            cap = bound;
        if (cap < ss->rcpts_len + need)
            return -1; /* more than max_recipients: the engine never lets that happen */
        p = realloc(ss->rcpts_buf, cap);
        if (p == NULL)
            return -1;
        ss->rcpts_buf = p;
        ss->rcpts_cap = cap;
    }
    memcpy(ss->rcpts_buf + ss->rcpts_len, mailbox, need);
    ss->rcpts_len += need;
    return 0;
}

/* A recipient the --recipients table does not know: 550 5.1.1 (RFC 3463 §3.2, bad destination
 * mailbox address), naming the mailbox when it is printable ASCII and short (the engine has
 * checked its syntax; a UTF-8 one is left out of the reply text). */
static int refuse_unknown(smtpe_server *s, const smtpe_path *p)
{
    char text[LMTP_TEXT_MAILBOX_MAX + 64];
    smtpe_span m = path_mailbox(p);
    int ascii = m.len <= LMTP_TEXT_MAILBOX_MAX;

    for (size_t i = 0; i < m.len && ascii; i++)
        ascii = m.ptr[i] > ' ' && m.ptr[i] < 0x7f;
    if (ascii)
        snprintf(text, sizeof text, "<%.*s>: Recipient address rejected: User unknown",
                 (int)m.len, (const char *)m.ptr);
    else
        snprintf(text, sizeof text, "Recipient address rejected: User unknown");
    return smtpe_server_reply(s, 550, "5.1.1", text);
}

/* ASCII letters lower-cased, control octets as '?', into dst at *len (cap octets, NUL kept
 * after). Returns -1 if it does not fit. */
static int append_lower(char *dst, size_t cap, size_t *len, const uint8_t *p, size_t n)
{
    if (*len + n >= cap)
        return -1;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        dst[(*len)++] = (char)(c < 0x20 || c == 0x7f ? '?'
                               : c >= 'A' && c <= 'Z' ? c - 'A' + 'a'
                                                      : c);
    }
    dst[*len] = '\0';
    return 0;
}

/* The local-part without its quoting: a quoted-string's quotes and the backslashes of its
 * quoted-pairs dropped (RFC 5321 §4.1.2), so that "joe"@d and joe@d are one mailbox. Into out
 * (at least n octets). Returns the length. */
static size_t unquote_local(uint8_t *out, const smtpe_path *p)
{
    const uint8_t *s = p->local_part.ptr;
    size_t n = p->local_part.len, o = 0;

    if (!(p->flags & SMTPE_PATH_QUOTED) || n < 2 || s[0] != '"' || s[n - 1] != '"') {
        if (n > 0)
            memcpy(out, s, n);
        return n;
    }
    for (size_t i = 1; i + 1 < n; i++) {
        if (s[i] == '\\' && i + 2 < n)
            i++;
        out[o++] = s[i];
    }
    return o;
}

/* Adds a mailbox to the transaction's list unless one of the same path is there. Takes path
 * and address (heap) in every case. Returns its index, or -2 without memory. */
static long add_box(struct session *ss, char *path, char *address)
{
    for (size_t i = 0; i < ss->nbox; i++)
        if ((path == NULL && ss->boxes[i].path == NULL) ||
            (path != NULL && ss->boxes[i].path != NULL && strcmp(path, ss->boxes[i].path) == 0)) {
            free(path);
            free(address);
            return (long)i;
        }
    if (ss->nbox == ss->box_cap) {
        size_t cap = ss->box_cap ? 2 * ss->box_cap : 4;
        struct maildir_box *b = realloc(ss->boxes, cap * sizeof *b);
        if (b == NULL) {
            free(path);
            free(address);
            return -2;
        }
        ss->boxes = b;
        ss->box_cap = cap;
    }
    memset(&ss->boxes[ss->nbox], 0, sizeof ss->boxes[0]);
    ss->boxes[ss->nbox].md = path == NULL ? &ss->ctx->maildir : NULL;
    ss->boxes[ss->nbox].path = path;
    ss->boxes[ss->nbox].address = address;
    ss->boxes[ss->nbox].tmp_fd = ss->boxes[ss->nbox].new_fd = -1;
    return (long)ss->nbox++;
}

/* The mailbox of a recipient: the --maildir template's path for its local-part and domain
 * (<postmaster>: the --hostname), and the Delivered-To address (local-part as sent and domain,
 * lower-cased); without a template the one Maildir. Returns its index in the list, -1 if no
 * path can be made for it (refused: nothing is accepted that cannot be stored), -2 without
 * memory. */
static long rcpt_mailbox(struct session *ss, const smtpe_path *p)
{
    const struct host_options *o = &ss->ctx->opt;
    int pm = (p->flags & SMTPE_PATH_POSTMASTER) && p->domain.len == 0;
    const uint8_t *dom = pm ? (const uint8_t *)o->hostname : p->domain.ptr;
    size_t dom_len = pm ? strlen(o->hostname) : p->domain.len, local_len, alen = 0;
    uint8_t local[SESSION_NAME_MAX];
    char path[PATH_MAX], addr[MAILDIR_ADDRESS_MAX];
    char *hp, *ha = NULL;

    if (!o->maildir_template)
        return add_box(ss, NULL, NULL);
    if (p->local_part.len > sizeof local)
        return -1;
    local_len = unquote_local(local, p);
    if (maildir_expand(path, sizeof path, o->maildir, local, local_len, dom, dom_len) < 0)
        return -1;
    if (!o->no_delivered_to &&
        (append_lower(addr, sizeof addr, &alen, p->local_part.ptr, p->local_part.len) < 0 ||
         append_lower(addr, sizeof addr, &alen, (const uint8_t *)"@", 1) < 0 ||
         append_lower(addr, sizeof addr, &alen, dom, dom_len) < 0))
        return -1;
    if ((hp = strdup(path)) == NULL || (!o->no_delivered_to && (ha = strdup(addr)) == NULL)) {
        free(hp);
        return -2;
    }
    return add_box(ss, hp, ha);
}

/* Records that the next accepted recipient goes to mailbox index. Returns 0, or -1 without
 * memory. */
static int map_rcpt(struct session *ss, unsigned index)
{
    if (ss->nrcpt == ss->rcpt_box_cap) {
        size_t cap = ss->rcpt_box_cap ? 2 * ss->rcpt_box_cap : 8;
        unsigned *m = realloc(ss->rcpt_box, cap * sizeof *m);
        if (m == NULL)
            return -1;
        ss->rcpt_box = m;
        ss->rcpt_box_cap = cap;
    }
    ss->rcpt_box[ss->nrcpt] = index;
    return 0;
}

static int on_rcpt(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    const smtpe_path *p = &ev->rcpt.forward_path;
    char tmp[SESSION_NAME_MAX + 1];
    size_t nbox = ss->nbox;
    long box = 0;

    if (!domain_accepted(&ss->ctx->opt, p))
        return smtpe_server_reply(s, 550, "5.7.1", "Relay access denied");
    if (ss->ctx->recipients != NULL && !recipients_source_known(ss->ctx->recipients, p))
        return refuse_unknown(s, p);
    if (copy_name(tmp, path_mailbox(p)) < 0)
        return smtpe_server_reply(s, 501, "5.1.3", "Path too long");
    if (ss->msg != NULL) /* the content has begun (BDAT): no more mailboxes */
        return smtpe_server_reply(s, 503, "5.5.1", "Bad sequence of commands");
    if (!ss->ctx->opt.sink && (box = rcpt_mailbox(ss, p)) == -1)
        return smtpe_server_reply(s, 553, "5.1.3", "Mailbox name not allowed");
    /* the list last: a recipient refused for lack of memory must not be in it (LMTP replies
     * name them in order), nor its mailbox */
    if (box < 0 || map_rcpt(ss, (unsigned)box) < 0 ||
        (ss->nrcpt == 0 && set_str(&ss->rcpt, tmp) < 0))
        goto no_memory;
    if (ss->ctx->cfg.lmtp && remember_rcpt(ss, tmp) < 0) {
        host_log("error sid=%s peer=%s rcpt: out of memory", ss->sid, ss->peer);
        goto no_memory;
    }
    log_rcpt(ss, tmp);
    ss->nrcpt++;
    ss->rcpts++;
    return smtpe_server_accept(s);
no_memory:
    if (ss->nbox > nbox) { /* a mailbox of this recipient only: forget it */
        maildir_boxes_clear(&ss->boxes[nbox], ss->nbox - nbox);
        ss->nbox = nbox;
    }
    return smtpe_server_reply(s, 452, "4.3.1", "Insufficient system storage");
}

/* How the message is stored: LF line ends unless --maildir-crlf or BODY=BINARYMIME (stored
 * octet for octet); hard links with a template and --no-delivered-to; all or nothing under
 * SMTP (one reply for all recipients). */
static unsigned store_flags(const struct session *ss)
{
    const struct host_options *o = &ss->ctx->opt;

    return (o->maildir_crlf || ss->binarymime ? 0 : MAILDIR_LF) |
           (o->maildir_template && o->no_delivered_to ? MAILDIR_LINK : 0) |
           (ss->ctx->cfg.lmtp ? 0 : MAILDIR_ALL);
}

/* Opens the Maildir file for a new message and writes the trace headers (DATA, or the first
 * BDAT chunk). Returns 0, or -1 (logged; the message is then refused). */
static int begin_message(struct session *ss)
{
    time_t now = time(NULL);

    session_abort(ss);
    ss->store_failed = 0;
    maildir_queue_id(ss->queue_id);
    ss->datas++;
    if (ss->ctx->opt.sink)
        return 0;
    ss->msg = maildir_msg_begin(ss->boxes, ss->nbox, ss->ctx->maildir.host_part, ss->queue_id,
                                now, store_flags(ss));
    if (ss->msg == NULL || write_trace(ss, now) < 0) {
        host_log("error sid=%s id=%s maildir: %s", ss->sid, ss->queue_id, strerror(errno));
        session_abort(ss);
        ss->store_failed = 1;
        return -1;
    }
    return 0;
}

static int on_data(struct session *ss, smtpe_server *s)
{
    if (begin_message(ss) < 0) {
        log_message(ss, 0, "io-error", 0);
        end_transaction(ss);
        return smtpe_server_reply(s, 451, "4.3.0", LOCAL_ERROR_TEXT);
    }
    return smtpe_server_accept(s);
}

/* A BDAT chunk begins; the first one of a transaction opens the message as DATA does. No
 * verdict: a failure is reported at the chunk's end. */
static void on_bdat(struct session *ss, const smtpe_event *ev)
{
    if (ev->bdat.first)
        (void)begin_message(ss);
}

static void on_chunk(struct session *ss, smtpe_span chunk)
{
    if (ss->msg != NULL && maildir_msg_write(ss->msg, chunk.ptr, chunk.len) < 0)
        ss->store_failed = 1; /* errno is reported again at commit */
}

/* The end of a BDAT chunk without LAST: refuse at once if the message cannot be stored (a 4xx
 * ends the transaction), else 250. */
static int on_chunk_end(struct session *ss, smtpe_server *s)
{
    if (!ss->store_failed)
        return smtpe_server_accept(s);
    if (ss->msg != NULL)
        host_log("error sid=%s id=%s maildir: write failed", ss->sid, ss->queue_id);
    log_message(ss, 0, "io-error", 0);
    end_transaction(ss);
    return smtpe_server_reply(s, 451, "4.3.0", LOCAL_ERROR_TEXT);
}

/* The next recipient of the LMTP list at *pos, NULL after the last. */
static const char *next_rcpt(const struct session *ss, size_t *pos)
{
    const char *r;

    if (*pos >= ss->rcpts_len)
        return NULL;
    r = ss->rcpts_buf + *pos;
    *pos += strlen(r) + 1;
    return r;
}

/* The result of a message for recipient i: 0, or an errno. boxes is NULL when no commit ran
 * (the message failed before it: err for all). */
static int rcpt_result(const struct session_job *sj, unsigned i, int err)
{
    if (sj == NULL || sj->boxes == NULL || sj->rcpt_box == NULL || sj->rcpt_box[i] >= sj->nbox)
        return err;
    return sj->boxes[sj->rcpt_box[i]].error;
}

/* The reply to a recipient whose mailbox failed with e: 452 when storage ran out (RFC 3463
 * 4.3.1, 4.2.2 for a quota), else 451 4.3.0. */
static int fail_reply(smtpe_server *s, int e, const char *line)
{
    if (e == ENOSPC)
        return smtpe_server_reply(s, 452, "4.3.1", line ? line : "Insufficient system storage");
    if (e == EDQUOT)
        return smtpe_server_reply(s, 452, "4.2.2", line ? line : "Mailbox full");
    return smtpe_server_reply(s, 451, "4.3.0", line ? line : LOCAL_ERROR_TEXT);
}

/* The verdicts for a message: one (SMTP: ok means every mailbox stored, or --sink), or under
 * LMTP one per recipient, each its own mailbox's result ("<mailbox> text", RFC 2033 §4.2). sj
 * is the commit that ran, NULL if none; err the failure when none ran. */
static int data_verdicts(struct session *ss, smtpe_server *s, unsigned replies, int ok,
                         const struct session_job *sj, int err)
{
    char text[64], line[LMTP_TEXT_MAILBOX_MAX + 128];
    size_t pos = 0;
    int rc = 0;

    snprintf(text, sizeof text, "Ok: queued as %s", ss->queue_id);
    if (!ss->ctx->cfg.lmtp || replies == 0)
        return ok ? smtpe_server_reply(s, 250, "2.0.0", text)
                  : smtpe_server_reply(s, 451, "4.3.0", LOCAL_ERROR_TEXT);
    for (unsigned i = 0; i < replies && rc == 0; i++) {
        const char *mbox = next_rcpt(ss, &pos);
        int e = ok ? 0 : rcpt_result(sj, i, err ? err : EIO);
        const char *t = e == 0 ? text
                        : e == ENOSPC ? "Insufficient system storage"
                        : e == EDQUOT ? "Mailbox full"
                                      : LOCAL_ERROR_TEXT;
        if (mbox != NULL && strlen(mbox) <= LMTP_TEXT_MAILBOX_MAX)
            snprintf(line, sizeof line, "<%s> %s", mbox, t);
        else
            snprintf(line, sizeof line, "%s", t);
        rc = e == 0 ? smtpe_server_reply(s, 250, "2.0.0", line) : fail_reply(s, e, line);
    }
    return rc;
}

/* The verdict on a message once its fate is known: ok (stored everywhere, or --sink), some
 * (LMTP: stored in some mailboxes), or not. */
static int finish_message(struct session *ss, smtpe_server *s, uint64_t size, unsigned flags,
                          unsigned replies, int ok, int some, const struct session_job *sj,
                          int err)
{
    int rc;

    if (ok || some)
        ss->delivered++;
    log_message(ss, size, ok ? "queued" : some ? "partly-queued" : "io-error", flags);
    rc = data_verdicts(ss, s, replies, ok, sj, err);
    end_transaction(ss);
    return rc;
}

/* A commit is back: report each failed mailbox, the verdicts, then give the mailboxes back. */
static int finish_commit(struct session *ss, smtpe_server *s, struct session_job *sj)
{
    int some = 0, rc;

    for (size_t i = 0; i < sj->nbox; i++) {
        const struct maildir_box *b = &sj->boxes[i];
        char where[3 * 256 + 1];
        if (b->error == 0) {
            some = 1;
            continue;
        }
        if (b->path != NULL)
            host_log("error sid=%s id=%s maildir %s: %s", ss->sid, ss->queue_id,
                     host_log_token(where, sizeof where, b->path, strlen(b->path)),
                     strerror(b->error));
        else
            host_log("error sid=%s id=%s maildir: %s", ss->sid, ss->queue_id, strerror(b->error));
    }
    if (sj->nbox == 0 && !sj->ok)
        host_log("error sid=%s id=%s maildir: %s", ss->sid, ss->queue_id, strerror(sj->err));
    rc = finish_message(ss, s, sj->size, sj->flags, sj->replies, sj->ok, some, sj, sj->err);
    maildir_boxes_clear(sj->boxes, sj->nbox);
    free(sj->boxes);
    free(sj->rcpt_box);
    sj->boxes = NULL;
    sj->nbox = 0;
    sj->rcpt_box = NULL;
    return rc;
}

static int on_data_end(struct session *ss, smtpe_server *s, const smtpe_event *ev, void *owner)
{
    int status = ev->data_end.status;
    struct session_job *sj;

    if (status != SMTPE_DATA_OK) { /* the engine has already replied */
        log_message(ss, ev->data_end.size,
                    status == SMTPE_DATA_TOO_BIG ? "too-big" : "bad-line-ending",
                    ev->data_end.flags);
        end_transaction(ss);
        return 0;
    }
    if (ss->store_failed || ss->msg == NULL) /* failed, or --sink */
        return finish_message(ss, s, ev->data_end.size, ev->data_end.flags,
                              ev->data_end.replies, !ss->store_failed, 0, NULL, EIO);
    if ((sj = job_get(ss)) == NULL) {
        host_log("error sid=%s id=%s maildir: out of memory", ss->sid, ss->queue_id);
        return finish_message(ss, s, ev->data_end.size, ev->data_end.flags,
                              ev->data_end.replies, 0, 0, NULL, ENOMEM);
    }
    sj->kind = JOB_COMMIT;
    sj->base.queue = JOB_QUEUE_STORE;
    memcpy(sj->queue_id, ss->queue_id, sizeof sj->queue_id);
    memcpy(sj->sid, ss->sid, sizeof sj->sid);
    sj->msg = ss->msg;
    ss->msg = NULL;
    /* the mailboxes go with the message (it points into them) until the job is back */
    sj->boxes = ss->boxes;
    sj->nbox = ss->nbox;
    sj->rcpt_box = ss->rcpt_box;
    ss->boxes = NULL;
    ss->nbox = ss->box_cap = 0;
    ss->rcpt_box = NULL;
    ss->rcpt_box_cap = 0;
    sj->size = ev->data_end.size;
    sj->flags = ev->data_end.flags;
    sj->replies = ev->data_end.replies;
    if (job_start(ss, owner) == SESSION_WAIT)
        return SESSION_WAIT;
    return finish_commit(ss, s, sj);
}

static int on_starttls(struct session *ss, smtpe_server *s)
{
    if (ss->ctx->tls == NULL) /* the engine offers STARTTLS only with a context: not reached */
        return smtpe_server_reply(s, 454, "4.7.0", "TLS not available");
    return smtpe_server_accept(s);
}

static int span_eq(smtpe_span a, smtpe_span b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* An AUTH check is back: 535 or 235. The password is never logged. */
static int finish_auth(struct session *ss, smtpe_server *s, struct session_job *sj)
{
    char user[3 * AUTH_USER_MAX + 1];
    size_t len = sj->user_len < AUTH_USER_MAX ? sj->user_len : AUTH_USER_MAX;

    host_log_token(user, sizeof user, sj->user, len);
    if (sj->ok < 0) { /* no memory for crypt(3): no answer either way, so not counted */
        host_log("error sid=%s peer=%s auth user=%s mechanism=%s: out of memory", ss->sid,
                 ss->peer, user, sj->mechanism);
        return smtpe_server_reply(s, 454, "4.7.0", "Temporary authentication failure");
    }
    if (!sj->ok || !sj->authz_ok) {
        ss->auth_failures++;
        host_log("auth-failed sid=%s peer=%s user=%s mechanism=%s", ss->sid, ss->peer, user,
                 sj->mechanism);
        return smtpe_server_reply(s, 535, "5.7.8", "Authentication credentials invalid");
    }
    {
        char name[AUTH_USER_MAX + 1];
        (void)copy_text(name, AUTH_USER_MAX, (smtpe_span){sj->user, len});
        if (set_str(&ss->auth_user, name) < 0 || ss->auth_user == NULL) {
            ss->auth_failures++; /* no memory to remember who: a temporary failure */
            return smtpe_server_reply(s, 454, "4.7.0", "Temporary authentication failure");
        }
    }
    host_log("auth sid=%s peer=%s auth=%s mechanism=%s", ss->sid, ss->peer, user,
             sj->mechanism);
    return smtpe_server_accept(s);
}

/* AUTH PLAIN or LOGIN: the credentials against the user file. crypt(3) runs whatever the
 * user name, on copies in the job (wiped by it); the engine wipes its own at the verdict. */
static int on_auth(struct session *ss, smtpe_server *s, const smtpe_event *ev, void *owner)
{
    struct session_job *sj;
    size_t ulen = ev->auth.authcid.len, plen = ev->auth.password.len;

    if (ss->ctx->auth == NULL || (ev->auth.mechanism_id != SMTPE_SASL_PLAIN &&
                                  ev->auth.mechanism_id != SMTPE_SASL_LOGIN))
        return smtpe_server_reply(s, 504, "5.5.4", "Unrecognized authentication type");
    if ((sj = job_get(ss)) == NULL)
        return smtpe_server_reply(s, 454, "4.7.0", "Temporary authentication failure");
    sj->kind = JOB_AUTH;
    sj->base.queue = JOB_QUEUE_AUTH;
    sj->db = ss->ctx->auth;
    sj->mechanism = ev->auth.mechanism_id == SMTPE_SASL_PLAIN ? "PLAIN" : "LOGIN";
    /* Acting as another user (an authorization identity other than the authentication one,
     * RFC 4616 §2) is not supported: refused like bad credentials, after the same work. */
    sj->authz_ok = ev->auth.authzid.len == 0 || span_eq(ev->auth.authzid, ev->auth.authcid);
    /* Longer than the buffers: kept one octet too long, which never matches. */
    sj->user_len = ulen <= AUTH_USER_MAX ? ulen : AUTH_USER_MAX + 1;
    sj->password_len = plen <= AUTH_PASSWORD_MAX ? plen : AUTH_PASSWORD_MAX + 1;
    if (ulen > 0)
        memcpy(sj->user, ev->auth.authcid.ptr, sj->user_len);
    if (plen > 0)
        memcpy(sj->password, ev->auth.password.ptr, sj->password_len);
    if (job_start(ss, owner) == SESSION_WAIT)
        return SESSION_WAIT;
    return finish_auth(ss, s, sj);
}

int session_storing(const struct session *ss)
{
    return ss->job_pending && ss->job->kind == JOB_COMMIT;
}

int session_job_done(struct session *ss, smtpe_server *s)
{
    struct session_job *sj = ss->job;

    ss->job_pending = 0;
    return sj->kind == JOB_COMMIT ? finish_commit(ss, s, sj) : finish_auth(ss, s, sj);
}

/* Adds the current client to the via chain: the hops that spoke for the real client (the
 * balancer that sent PROXY, the proxy that sent XCLIENT). */
static void add_via(struct session *ss)
{
    size_t n = strlen(ss->via);

    if (n + 1 + strlen(ss->peer) < sizeof ss->via)
        snprintf(ss->via + n, sizeof ss->via - n, "%s%s", n ? "," : "", ss->peer);
}

/* Makes the address (network order) the client's. */
static void set_client(struct session *ss, int family, const uint8_t *addr, unsigned port)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};

    ss->peer_unix = 0;
    ss->peer_port = port;
    if (family == AF_INET6 && memcmp(addr, v4mapped, sizeof v4mapped) == 0) {
        family = AF_INET;
        addr += 12;
    }
    if (inet_ntop(family, addr, ss->peer_ip, sizeof ss->peer_ip) == NULL)
        ss->peer_ip[0] = '\0';
    ss->peer_v6 = family == AF_INET6;
    set_peer_text(ss);
}

/* A PROXY header: its source becomes the client (LOCAL, UNKNOWN and unix sources keep the
 * connection's own peer). With --proxy-from only those balancers may send one; and only a
 * header from such a vouched balancer can earn its source XCLIENT trust, since anyone who
 * reaches the port can write a header naming any address. */
static int on_proxy(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    const smtpe_proxy_info *p = &ev->proxy;
    const struct host_options *o = &ss->ctx->opt;
    int family = p->family == SMTPE_PROXY_AF_INET ? AF_INET : AF_INET6;
    int inet = !p->local && (p->family == SMTPE_PROXY_AF_INET ||
                             p->family == SMTPE_PROXY_AF_INET6);
    int rc;

    if (o->proxy_from_count > 0 && !ss->proxy_vouched) {
        session_set_end(ss, "proxy-not-allowed");
        return smtpe_server_reply(s, 554, "5.7.1", "Not a trusted proxy");
    }
    if (inet) {
        add_via(ss);
        set_client(ss, family, p->src_addr, p->src_port);
    }
    if (ss->seat.census != NULL) {
        /* --max-clients-per-ip counts the real client; LOCAL (the balancer's own health
         * check), UNKNOWN and unix sources count under the balancer's address */
        uint64_t key = inet ? census_key_raw(family, p->src_addr) : ss->socket_key;
        if (census_move(ss->seat.census, ss->seat.slot, ss->seat.key, key) != CENSUS_OK) {
            host_log_reject(host_now_ms(), ss->sid, ss->peer,
                            "too-many-connections-from-address");
            session_set_end(ss, "too-many-connections");
            return smtpe_server_reply(s, 421, "4.7.0", ss->ctx->address_busy_text);
        }
        ss->seat.key = key;
    }
    if (inet)
        host_log("proxy sid=%s peer=%s via=%s", ss->sid, ss->peer, ss->via);
    else /* the balancer's own connection (LOCAL) or a source it does not name */
        host_log("proxy sid=%s source=%s", ss->sid, p->local ? "local" : "unknown");
    if (inet && o->xclient_count > 0 &&
        (rc = smtpe_server_set_trusted(
             s, ss->proxy_vouched && net_cidr_match(o->xclient_from, o->xclient_count, family,
                                                    p->src_addr))) < 0)
        return rc;
    return smtpe_server_accept(s);
}

/* "[UNAVAILABLE]" and "[TEMPUNAVAIL]": the proxy does not know the value. */
static int unknown_value(smtpe_span v)
{
    return ascii_ieq("[UNAVAILABLE]", v) || ascii_ieq("[TEMPUNAVAIL]", v);
}

/* An ADDR value: IPv4, IPv6 or "IPV6:" + IPv6 (Postfix's form). Returns 0 with the family and
 * the network-order address in addr[16], or -1. */
static int parse_addr(smtpe_span v, int *family, uint8_t addr[16])
{
    char buf[NET_IP_MAX];
    const char *p = buf;

    if (v.len == 0 || v.len >= sizeof buf || memchr(v.ptr, '\0', v.len) != NULL)
        return -1;
    memcpy(buf, v.ptr, v.len);
    buf[v.len] = '\0';
    if (strncasecmp(buf, "IPV6:", 5) == 0)
        p += 5;
    if (p == buf && inet_pton(AF_INET, p, addr) == 1) {
        *family = AF_INET;
        return 0;
    }
    if (inet_pton(AF_INET6, p, addr) == 1) {
        *family = AF_INET6;
        return 0;
    }
    return -1;
}

/* A PORT value: 0..65535. */
static int parse_port(smtpe_span v, unsigned *port)
{
    unsigned n = 0;

    if (v.len == 0 || v.len > 5)
        return -1;
    for (size_t i = 0; i < v.len; i++) {
        if (v.ptr[i] < '0' || v.ptr[i] > '9')
            return -1;
        n = n * 10 + (unsigned)(v.ptr[i] - '0');
    }
    if (n > 65535)
        return -1;
    *port = n;
    return 0;
}

/* A host name: printable ASCII without space, at most 255 octets. */
static int copy_hostname(char dst[HOST_NAME_MAX_LEN + 1], smtpe_span v)
{
    for (size_t i = 0; i < v.len; i++)
        if (v.ptr[i] <= ' ' || v.ptr[i] >= 0x7f)
            return -1;
    return copy_text(dst, HOST_NAME_MAX_LEN, v);
}

/* XCLIENT attributes, checked before any is applied. */
struct xclient_values {
    int has_addr, addr_family, has_port, has_name, has_helo, has_login, has_proto;
    uint8_t addr[16];
    unsigned port;
    char name[HOST_NAME_MAX_LEN + 1];
    char helo[SESSION_NAME_MAX + 1];
    char login[AUTH_USER_MAX + 1];
    int esmtp;
};

/* Parses one XCLIENT attribute into x. Returns 0, or -1 for a bad value. */
static int xclient_attr(struct xclient_values *x, const smtpe_param *a)
{
    smtpe_span k = a->keyword, v = a->value;
    int unknown = unknown_value(v);

    if (ascii_ieq("ADDR", k)) {
        x->has_addr = 1;
        x->addr_family = 0; /* 0: unknown */
        return unknown ? 0 : parse_addr(v, &x->addr_family, x->addr);
    }
    if (ascii_ieq("PORT", k)) {
        x->has_port = 1;
        x->port = 0;
        return unknown ? 0 : parse_port(v, &x->port);
    }
    if (ascii_ieq("NAME", k)) {
        x->has_name = 1;
        x->name[0] = '\0';
        return unknown ? 0 : copy_hostname(x->name, v);
    }
    if (ascii_ieq("HELO", k)) {
        x->has_helo = 1;
        x->helo[0] = '\0';
        return unknown ? 0 : copy_name(x->helo, v);
    }
    if (ascii_ieq("LOGIN", k)) {
        x->has_login = 1;
        x->login[0] = '\0';
        return unknown ? 0 : copy_text(x->login, AUTH_USER_MAX, v);
    }
    if (ascii_ieq("PROTO", k)) {
        x->has_proto = 1;
        x->esmtp = ascii_ieq("ESMTP", v);
        return unknown || x->esmtp || ascii_ieq("SMTP", v) ? 0 : -1;
    }
    return 0; /* DESTADDR, DESTPORT: the server's side, nothing to record */
}

/* The xclient line: "xclient sid= peer= via= [name=] [helo=] [login=]", the names as tokens. */
static void log_xclient(const struct session *ss)
{
    char name[3 * HOST_NAME_MAX_LEN + 8], helo[3 * SESSION_NAME_MAX + 8];
    char login[3 * AUTH_USER_MAX + 8];

    name[0] = helo[0] = login[0] = '\0';
    if (ss->peer_name != NULL) {
        memcpy(name, " name=", 7);
        host_log_token(name + 6, sizeof name - 6, ss->peer_name, strlen(ss->peer_name));
    }
    if (ss->helo != NULL) {
        memcpy(helo, " helo=", 7);
        host_log_token(helo + 6, sizeof helo - 6, ss->helo, strlen(ss->helo));
    }
    if (ss->xclient_login != NULL) {
        memcpy(login, " login=", 8);
        host_log_token(login + 7, sizeof login - 7, ss->xclient_login,
                       strlen(ss->xclient_login));
    }
    host_log("xclient sid=%s peer=%s via=%s%s%s%s", ss->sid, ss->peer,
             ss->via[0] ? ss->via : "-", name, helo, login);
}

/* XCLIENT: the attributes replace what this host knows of the client, and the engine restarts
 * the session (a new greeting; HELO and AUTH forgotten). */
static int on_xclient(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    struct xclient_values x;

    memset(&x, 0, sizeof x);
    for (size_t i = 0; i < ev->xclient.count; i++)
        if (xclient_attr(&x, &ev->xclient.attrs[i]) < 0)
            return smtpe_server_reply(s, 501, "5.5.4", "Bad XCLIENT attribute");
    end_transaction(ss);
    clear_str(&ss->helo);
    ss->esmtp = 0;
    clear_str(&ss->auth_user);
    if (!ss->xclient_seen) /* later XCLIENTs come from the same proxy */
        add_via(ss);
    ss->xclient_seen = 1;
    if (x.has_addr) {
        if (x.addr_family != 0) {
            set_client(ss, x.addr_family, x.addr, 0);
        } else {
            ss->peer_ip[0] = '\0';
            ss->peer_unix = 0;
        }
    }
    if (x.has_port)
        ss->peer_port = x.port;
    if ((x.has_name && set_str(&ss->peer_name, x.name) < 0) ||
        (x.has_helo && set_str(&ss->helo, x.helo) < 0) ||
        (x.has_login && set_str(&ss->xclient_login, x.login) < 0))
        return smtpe_server_close(s, 421, "4.3.0", LOCAL_ERROR_TEXT); /* half applied */
    if (x.has_proto)
        ss->esmtp = x.esmtp;
    set_peer_text(ss);
    log_xclient(ss);
    return smtpe_server_accept(s);
}

/* A protocol name (ESMTP, SMTP, ...): letters and digits, shorter than cap. */
static int copy_proto(char *dst, size_t cap, smtpe_span v)
{
    if (v.len == 0 || v.len >= cap)
        return -1;
    for (size_t i = 0; i < v.len; i++) {
        uint8_t c = v.ptr[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
            return -1;
    }
    return copy_text(dst, cap - 1, v);
}

/* XFORWARD: the client of the next transaction as the forwarding MTA saw it, for the Received
 * header. Attributes add up over several commands. */
static int on_xforward(struct session *ss, smtpe_server *s, const smtpe_event *ev)
{
    struct session_xforward xf;

    if (ss->xf != NULL)
        xf = *ss->xf;
    else
        memset(&xf, 0, sizeof xf);
    for (size_t i = 0; i < ev->xclient.count; i++) {
        const smtpe_param *a = &ev->xclient.attrs[i];
        smtpe_span k = a->keyword, v = a->value;
        int unknown = unknown_value(v), bad = 0;
        if (ascii_ieq("ADDR", k)) {
            uint8_t addr[16];
            int family;
            xf.addr[0] = '\0';
            if (!unknown && !(bad = parse_addr(v, &family, addr) < 0)) {
                xf.addr_v6 = family == AF_INET6;
                (void)inet_ntop(family, addr, xf.addr, sizeof xf.addr);
            }
        } else if (ascii_ieq("NAME", k)) {
            xf.name[0] = '\0';
            bad = !unknown && copy_hostname(xf.name, v) < 0;
        } else if (ascii_ieq("HELO", k)) {
            xf.helo[0] = '\0';
            bad = !unknown && copy_name(xf.helo, v) < 0;
        } else if (ascii_ieq("PROTO", k)) {
            xf.proto[0] = '\0';
            bad = !unknown && copy_proto(xf.proto, sizeof xf.proto, v) < 0;
        } /* PORT, IDENT, SOURCE: not used in the trace */
        if (bad)
            return smtpe_server_reply(s, 501, "5.5.4", "Bad XFORWARD attribute");
    }
    xf.set = 1;
    if (ss->xf == NULL && (ss->xf = malloc(sizeof *ss->xf)) == NULL)
        return smtpe_server_reply(s, 451, "4.3.0", LOCAL_ERROR_TEXT);
    *ss->xf = xf;
    return smtpe_server_accept(s);
}

int session_on_event(struct session *ss, smtpe_server *s, const smtpe_event *ev, void *owner)
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
    case SMTPE_EV_BDAT:
        on_bdat(ss, ev);
        return 0;
    case SMTPE_EV_DATA_CHUNK:
        on_chunk(ss, ev->chunk);
        return 0;
    case SMTPE_EV_CHUNK_END:
        return on_chunk_end(ss, s);
    case SMTPE_EV_DATA_END:
        return on_data_end(ss, s, ev, owner);
    case SMTPE_EV_RSET:
        end_transaction(ss);
        return 0;
    case SMTPE_EV_STARTTLS:
        return on_starttls(ss, s);
    case SMTPE_EV_AUTH:
        return on_auth(ss, s, ev, owner);
    case SMTPE_EV_PROXY:
        return on_proxy(ss, s, ev);
    case SMTPE_EV_PROXY_INVALID:
        host_log("error sid=%s peer=%s proxy header invalid", ss->sid, ss->peer);
        session_set_end(ss, "proxy-invalid");
        return 0;
    case SMTPE_EV_XCLIENT:
        return on_xclient(ss, s, ev);
    case SMTPE_EV_XFORWARD:
        return on_xforward(ss, s, ev);
    case SMTPE_EV_QUIT:
        session_set_end(ss, "quit");
        return 0;
    case SMTPE_EV_TIMEOUT:
        session_set_end(ss, "timeout");
        end_transaction(ss);
        return 0;
    case SMTPE_EV_ERROR_LIMIT:
        session_set_end(ss, "error-limit");
        end_transaction(ss);
        return 0;
    case SMTPE_EV_VRFY:
    case SMTPE_EV_EXPN:
    case SMTPE_EV_UNKNOWN:
    case SMTPE_EV_NONE:
        break;
    }
    return smtpe_event_needs_reply(ev) ? smtpe_server_accept(s) : 0;
}
