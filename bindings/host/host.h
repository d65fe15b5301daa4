/*
 * host.h - what every host model of smtpe-server shares: the options from the command line and
 * the read-only context built from them (engine config, Maildir, canned reply texts).
 *
 * One host_ctx is built by main.c before the model starts; after that it is only read, so the
 * models that run several threads may share it without locks.
 */
#ifndef SMTPE_HOST_H
#define SMTPE_HOST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "smtpe.h"
#include "maildir.h"
#include "net.h"

struct tls_server;
struct auth_db;
struct recipients_source;

#define HOST_NAME_MAX_LEN 255 /* RFC 5321 §4.5.3.1.2, and the engine's hostname limit */

/* The command line, parsed (see cli.c for the meaning and defaults of each switch). */
struct host_options {
    const char *listen;        /* ADDR:PORT, [ADDR6]:PORT or unix:/path as given */
    struct sockaddr_storage listen_addr;
    socklen_t listen_addr_len;
    const char *maildir;       /* Maildir root, or a template with {domain} and {local} */
    int maildir_template;      /* maildir holds {domain} or {local}: one Maildir per mailbox */
    int maildir_crlf;          /* store the wire's CRLF line ends (default: LF) */
    int no_delivered_to;       /* no Delivered-To line; template copies are hard links */
    int sink;                  /* discard content, still answer 250 */
    char hostname[HOST_NAME_MAX_LEN + 1];
    uint64_t max_message_size; /* octets; 0 = no limit */
    unsigned max_recipients;
    unsigned max_clients;      /* concurrent sessions */
    unsigned max_clients_per_ip; /* concurrent sessions per client address; 0: no limit */
    unsigned max_errors;       /* protocol errors per session (engine max_errors) */
    uint64_t greet_delay_ms;   /* hold the greeting; a client talking first gets 554 5.5.0 */
    const char **domains;      /* accepted recipient domains; NULL/0: any */
    size_t domain_count;
    const char *recipients;    /* known-recipients file (recipients.h); NULL: any recipient */
    const char *model;         /* host model name: epoll, prefork, reuseport, threads */
    unsigned workers;          /* prefork, reuseport: event loops (default: online cores) */
    unsigned job_threads;      /* event models: job pool threads per loop (jobs.h) */
    uint64_t reply_delay_ms;   /* hold each reply this long before sending; 0: none */
    smtpe_line_ending_policy line_ending;
    uint64_t command_timeout_ms; /* valid when has_command_timeout */
    int has_command_timeout;
    uint64_t data_timeout_ms;    /* valid when has_data_timeout */
    int has_data_timeout;
    unsigned drain_seconds;    /* grace period for sessions at SIGTERM/SIGINT */
    const char *tls_cert;      /* PEM certificate chain for STARTTLS; NULL: no STARTTLS */
    const char *tls_key;       /* PEM private key, given with tls_cert */
    int require_tls;           /* MAIL only after STARTTLS */
    const char *auth_users;    /* user:hash file; NULL: no AUTH */
    int auth_plaintext_ok;     /* offer AUTH before TLS */
    int lmtp;                  /* speak LMTP */
    int proxy_protocol;        /* a PROXY header starts every connection */
    struct net_cidr *xclient_from; /* peers trusted with XCLIENT/XFORWARD; 0: none */
    size_t xclient_count;
    struct net_cidr *proxy_from; /* peers that may send the PROXY header; 0: any */
    size_t proxy_from_count;
    unsigned ext_off;          /* SMTPE_EXT_* switched off by --no-... */
    int lax_angle_brackets;    /* MAIL FROM:/RCPT TO: paths without <> accepted */
    int log_format;            /* HOST_LOG_TEXT or HOST_LOG_JSON (log.h) */
    int log_no_time;           /* log lines without their timestamp */
};

/* Read-only state shared by all connections of all models. */
struct host_ctx {
    struct host_options opt;
    smtpe_server_config cfg;   /* engine config; cfg.hostname points into opt.hostname */
    size_t session_mem;        /* smtpe_server_memory_size(&cfg) */
    struct maildir maildir;    /* unused with --sink; with a template only host_part is set */
    struct tls_server *tls;    /* STARTTLS context; NULL without --tls-cert */
    struct auth_db *auth;      /* AUTH users; NULL without --auth-users */
    /* The known recipients; NULL without --recipients. The one thing of the context that
     * changes after start: its table is replaced at SIGHUP (host_reload_check), lock-free. */
    struct recipients_source *recipients;
    char busy_text[HOST_NAME_MAX_LEN + 64];     /* "<hostname> Too many connections" */
    /* "<hostname> Too many connections from your address" */
    char address_busy_text[HOST_NAME_MAX_LEN + 64];
    char shutdown_text[HOST_NAME_MAX_LEN + 64]; /* "<hostname> Service shutting down" */
};

/* The monotonic clock in milliseconds (CLOCK_MONOTONIC): the engine's time base. */
uint64_t host_now_ms(void);

/* If a reload request (SIGHUP, signals.h) has come since *seen (a host_reload_requests()
 * value; updated): rereads what SIGHUP rereads (--recipients) and logs the outcome ("recipients
 * file=... mailboxes=N catch-alls=N", or an "error" line; a bad file keeps the old table). For
 * the one thread of a process that takes signals (main.c, loop.c, the models). */
void host_reload_check(const struct host_ctx *ctx, unsigned *seen);

#endif
