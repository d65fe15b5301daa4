/*
 * session.h - the host's side of one SMTP or LMTP session: the verdict for each engine event
 * (recipient domain policy and known recipients, AUTH against the user file, Maildir delivery or --sink), the
 * client as this host sees it (the socket peer, or what PROXY, XCLIENT and XFORWARD said), the
 * trace headers, the per-message log line and the counters of the disconnect line. It never
 * touches the socket; conn.c feeds it the events and tells it when TLS is up.
 */
#ifndef SMTPE_HOST_SESSION_H
#define SMTPE_HOST_SESSION_H

#include <stdint.h>
#include <sys/socket.h>

#include "auth.h"
#include "census.h"
#include "host.h"
#include "jobs.h"
#include "log.h"
#include "maildir.h"
#include "net.h"
#include "smtpe.h"

#define SESSION_NAME_MAX 512 /* longest HELO argument or path kept (a command line is 512) */
#define SESSION_LOG_RCPTS_MAX 1024 /* octets of the message line's rcpts= list */
#define SESSION_LOG_IDS 8          /* queue ids named by the disconnect line's ids= */

/* session_on_event: the verdict waits for a job (fsync and rename, or crypt(3)) that now runs
 * in the session's job pool; session_job_done gives it once the job is back. */
#define SESSION_WAIT 1

struct session_job;

/* What XFORWARD said about the client of the next transaction (Postfix XFORWARD_README);
 * empty strings for what it did not say or called [UNAVAILABLE]. */
struct session_xforward {
    int set;
    char name[HOST_NAME_MAX_LEN + 1];
    char addr[NET_IP_MAX];
    int addr_v6;
    char helo[SESSION_NAME_MAX + 1];
    char proto[16];
};

struct session {
    const struct host_ctx *ctx;
    char sid[HOST_LOG_SID_LEN + 1];  /* the session id, on every log line of the session */
    /* Where the blocking steps run: a pool of the loop's (the verdict then waits), or NULL to
     * run them on the caller's thread (the threads model, where blocking is the point). */
    struct job_pool *pool;
    struct session_job *job;         /* reused for each blocking step; NULL until the first */
    int job_pending;                 /* job is in the pool; a verdict waits for it */
    /* The client: the socket peer, replaced by PROXY's source or XCLIENT's ADDR/PORT. */
    char peer_ip[NET_IP_MAX];        /* "" when unknown (XCLIENT ADDR=[UNAVAILABLE]) */
    int peer_v6;
    int peer_unix;                   /* a unix socket peer: no address */
    unsigned peer_port;
    char *peer_name;                 /* XCLIENT NAME (reverse DNS); NULL if none */
    char peer[NET_HOSTPORT_MAX];     /* "ip:port", "[ip6]:port", "unix" for the log */
    /* The hops that spoke for the client, comma-separated: the balancer that sent PROXY, the
     * proxy that sent XCLIENT; "" if none. */
    char via[2 * NET_HOSTPORT_MAX];
    int xclient_seen;                /* an XCLIENT was accepted */
    /* Names are heap strings of their own length (a session holds thousands of others'
     * worth of memory otherwise); NULL reads as "". */
    char *helo;                      /* HELO/EHLO/LHLO argument; NULL before the first */
    int esmtp;                       /* the last greeting was EHLO or LHLO */
    char *mail;                      /* reverse-path mailbox of the transaction ("" for <>) */
    int smtputf8;                    /* the MAIL had SMTPUTF8 */
    char *rcpt;                      /* first accepted forward-path mailbox */
    unsigned nrcpt;                  /* recipients accepted in this transaction */
    /* LMTP: every accepted recipient mailbox of the transaction, NUL-terminated one after the
     * other, for the per-recipient replies. Grows as recipients come, up to max_recipients
     * names; kept for the session, freed by session_free. */
    char *rcpts_buf;
    size_t rcpts_len, rcpts_cap;
    /* The distinct mailboxes of the transaction (one without a --maildir template), decided
     * at RCPT; and for each accepted recipient, in order, the index of its mailbox. Both grow
     * as recipients come, are emptied by each transaction, lent to the commit job, and freed
     * by session_free. */
    struct maildir_box *boxes;
    size_t nbox, box_cap;
    unsigned *rcpt_box;
    size_t rcpt_box_cap;
    int binarymime;                  /* the MAIL had BODY=BINARYMIME: content stored as sent */
    char queue_id[MAILDIR_QUEUE_ID_LEN + 1];
    struct maildir_msg *msg;         /* message being written, NULL if none (or --sink) */
    int store_failed;                /* the message could not be opened or written */
    int proxy_vouched;               /* the connection came from a --proxy-from balancer */
    int tls;                         /* TLS is up */
    char tls_version[32];            /* "TLSv1.3" */
    char tls_cipher[64];             /* "TLS_AES_256_GCM_SHA384" */
    int tls_bits, tls_alg_bits;
    char *auth_user;                 /* user authenticated by AUTH; NULL if none */
    char *xclient_login;             /* XCLIENT LOGIN: the user the proxy authenticated */
    unsigned auth_failures;
    struct session_xforward *xf;     /* XFORWARD of this transaction; NULL if none */
    unsigned mails, rcpts, datas, delivered; /* whole-session counters for the log */
    const char *end;                 /* why the session ended; NULL until known */
    /* The log's lists (host_log_list_add), heap, allocated at their first entry and kept for
     * the session: the accepted forward-paths of the transaction for its message line (at
     * most SESSION_LOG_RCPTS_MAX octets, rcpts_more the ones left out), and the queue ids of
     * the session's accepted messages for the disconnect line (SESSION_LOG_IDS at most,
     * ids_more the others). */
    char *log_rcpts, *log_ids;
    size_t log_rcpts_len, log_ids_len;
    unsigned log_rcpts_more, log_ids_more;
    /* Its place in the census (--max-clients, --max-clients-per-ip), set by conn_new and left
     * by session_free; a PROXY header moves it to the real client's address. */
    struct census_seat seat;
    uint64_t socket_key;             /* census_key of the socket peer */
};

/* Prepares ss for a connection from peer; blocking steps go to pool (NULL: run inline). */
void session_init(struct session *ss, const struct host_ctx *ctx, struct job_pool *pool,
                  const struct sockaddr *peer);

/* Once the engine session s exists: marks it trusted for XCLIENT/XFORWARD when the peer is in
 * --xclient-from. Returns 0 or a negative SMTPE_ERR_*. */
int session_start(struct session *ss, smtpe_server *s, const struct sockaddr *peer);

/* Handles one event taken from s, giving its verdict if it needs one. Returns 0, SESSION_WAIT
 * (the verdict comes from session_job_done; the job's owner is set to owner), or a negative
 * SMTPE_ERR_* if the engine refused a verdict (the session is then unusable). */
int session_on_event(struct session *ss, smtpe_server *s, const smtpe_event *ev, void *owner);

/* Whether a message's commit is in the pool (its verdict waits for the disk). */
int session_storing(const struct session *ss);

/* The job session_on_event submitted is back from the pool: gives the verdict that waited.
 * Returns 0 or a negative SMTPE_ERR_*. */
int session_job_done(struct session *ss, smtpe_server *s);

/* TLS is up (the engine has restarted the session): records the protocol and cipher for the
 * Received header and the log, and forgets HELO, AUTH and XFORWARD as the engine did. */
void session_tls_up(struct session *ss, const char *version, const char *cipher, int bits,
                    int alg_bits);

/* The HELO/EHLO/LHLO argument, "" before the first. */
const char *session_helo(const struct session *ss);

/* The user the client authenticated as (by AUTH, else XCLIENT LOGIN), "" if none. */
const char *session_auth_name(const struct session *ss);

/* Records why the session ended; the first reason given wins. */
void session_set_end(struct session *ss, const char *reason);

/* Whether the session ended with QUIT. */
int session_quit(const struct session *ss);

/* Discards the message being written, if any. */
void session_abort(struct session *ss);

/* Discards the message and frees what the session holds (not ss itself). A job still in the
 * pool is disowned (owner NULL) and cancelled (if it has not started, a message is dropped
 * unstored, a password left unchecked); the loop calls its release when it comes back. */
void session_free(struct session *ss);

#endif
