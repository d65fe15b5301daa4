/*
 * session.h - the host's side of one SMTP session: the verdict for each engine event (recipient
 * domain policy, Maildir delivery or --sink), the trace headers, the per-message log line and the
 * counters of the disconnect line. It never touches the socket; conn.c feeds it the events.
 */
#ifndef SMTPE_HOST_SESSION_H
#define SMTPE_HOST_SESSION_H

#include <stdint.h>
#include <sys/socket.h>

#include "host.h"
#include "maildir.h"
#include "net.h"
#include "smtpe.h"

#define SESSION_NAME_MAX 512 /* longest HELO argument or path kept (a command line is 512) */

struct session {
    const struct host_ctx *ctx;
    char peer_ip[NET_IP_MAX];
    int peer_v6;
    char peer[NET_HOSTPORT_MAX];     /* "ip:port" for the log */
    char helo[SESSION_NAME_MAX + 1]; /* HELO/EHLO argument, "" before the first */
    int esmtp;                       /* the last greeting was EHLO */
    char mail[SESSION_NAME_MAX + 1]; /* reverse-path mailbox of the transaction ("" for <>) */
    int smtputf8;                    /* the MAIL had SMTPUTF8 */
    char rcpt[SESSION_NAME_MAX + 1]; /* first accepted forward-path mailbox */
    unsigned nrcpt;                  /* recipients accepted in this transaction */
    char queue_id[MAILDIR_QUEUE_ID_LEN + 1];
    struct maildir_msg *msg;         /* message being written, NULL if none (or --sink) */
    unsigned mails, rcpts, datas, delivered; /* whole-session counters for the log */
    const char *end;                 /* why the session ended; NULL until known */
};

/* Prepares ss for a connection from peer. */
void session_init(struct session *ss, const struct host_ctx *ctx, const struct sockaddr *peer);

/* Handles one event taken from s, giving its verdict if it needs one.
 * Returns 0, or a negative SMTPE_ERR_* if the engine refused a verdict (the session is then
 * unusable). */
int session_on_event(struct session *ss, smtpe_server *s, const smtpe_event *ev);

/* Records why the session ended; the first reason given wins. */
void session_set_end(struct session *ss, const char *reason);

/* Discards the message being written, if any. */
void session_abort(struct session *ss);

#endif
