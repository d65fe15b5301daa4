/*
 * smtpe.h - the one installed header of smtpe, an embeddable sans-I/O SMTP engine.
 *
 * The server engine is a state machine: the host feeds it the octets it read from the client
 * (smtpe_server_recv), pulls events (smtpe_server_next_event), gives a verdict for each event
 * that needs one (smtpe_server_reply / smtpe_server_accept), and sends the reply octets the
 * engine produced (smtpe_server_send_buf / smtpe_server_send_ack). The engine never reads a
 * socket or a clock and allocates memory only when a session is created.
 *
 * Implements RFC 5321 (SMTP) with RFC 1870 (SIZE), RFC 6152 (8BITMIME), RFC 2920 (PIPELINING),
 * RFC 2034/3463/5248 (enhanced status codes), RFC 6531 (SMTPUTF8), RFC 3207 (STARTTLS),
 * RFC 4954 (AUTH, with SASL PLAIN RFC 4616 and LOGIN decoded), RFC 3030 (CHUNKING, BINARYMIME),
 * RFC 3461 (DSN), RFC 2033 (LMTP), RFC 8689 (REQUIRETLS), RFC 6710 (MT-PRIORITY),
 * RFC 2852 (DELIVERBY), the HAProxy PROXY protocol v1/v2 and Postfix's XCLIENT and XFORWARD.
 */
#ifndef SMTPE_H
#define SMTPE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SMTPE_BUILDING) && defined(__GNUC__)
#define SMTPE_EXTERN __attribute__((visibility("default")))
#else
#define SMTPE_EXTERN
#endif

/* ---------------------------------------------------------------------------------------------
 * Errors. Every function that can fail returns a negative SMTPE_ERR_* code. Codes at or below
 * SMTPE_ERR_FATAL mean the session can no longer be used and must be freed.
 * ------------------------------------------------------------------------------------------- */
#define SMTPE_ERR_INVALID_ARGUMENT (-501) /* a NULL pointer, an out-of-range value */
#define SMTPE_ERR_STATE (-502)            /* the call does not fit the session's state */
#define SMTPE_ERR_REPLY_TOO_LONG (-503)   /* a host reply does not fit the reply limits */
#define SMTPE_ERR_BUFFER_TOO_SMALL (-504) /* caller-supplied memory is too small */
#define SMTPE_ERR_FATAL (-900)            /* codes <= this are fatal */
#define SMTPE_ERR_NOMEM (-901)            /* the allocator returned NULL */
#define SMTPE_ERR_CONFIG (-902)           /* the config is inconsistent (limits out of range) */

/* Returns a static, human-readable description of an SMTPE_ERR_* code ("unknown error" for
 * anything else). The string lives forever. */
SMTPE_EXTERN const char *smtpe_strerror(int err);

/* A run of octets. ptr is not NUL-terminated; its lifetime is given where the span is returned. */
typedef struct smtpe_span {
    const uint8_t *ptr;
    size_t len;
} smtpe_span;

/* Host memory hook. alloc returns size octets aligned for any type, or NULL; free releases what
 * alloc returned. ud is passed through. A NULL hook (or NULL functions) means malloc/free. */
typedef struct smtpe_allocator {
    void *(*alloc)(size_t size, void *ud);
    void (*free)(void *ptr, void *ud);
    void *ud;
} smtpe_allocator;

/* ---------------------------------------------------------------------------------------------
 * Configuration. Initialise with smtpe_server_config_init(), change fields, then share it
 * read-only among any number of sessions on any threads. It must outlive every session created
 * from it (sessions keep a pointer to it and to the strings it points to).
 * ------------------------------------------------------------------------------------------- */

/* Extensions advertised in the EHLO reply (RFC 5321 §4.1.1.1), a bitmask. */
#define SMTPE_EXT_PIPELINING (1u << 0)          /* RFC 2920 */
#define SMTPE_EXT_SIZE (1u << 1)                /* RFC 1870, with max_message_size */
#define SMTPE_EXT_8BITMIME (1u << 2)            /* RFC 6152: BODY=7BIT|8BITMIME on MAIL */
#define SMTPE_EXT_SMTPUTF8 (1u << 3)            /* RFC 6531: SMTPUTF8 on MAIL, UTF-8 mailboxes */
#define SMTPE_EXT_ENHANCEDSTATUSCODES (1u << 4) /* RFC 2034: enhanced status codes in replies */
#define SMTPE_EXT_STARTTLS (1u << 5)   /* RFC 3207; offered until TLS is up */
#define SMTPE_EXT_CHUNKING (1u << 6)   /* RFC 3030: BDAT */
#define SMTPE_EXT_BINARYMIME (1u << 7) /* RFC 3030: BODY=BINARYMIME (only with CHUNKING) */
#define SMTPE_EXT_DSN (1u << 8)        /* RFC 3461: RET, ENVID on MAIL; NOTIFY, ORCPT on RCPT */
#define SMTPE_EXT_REQUIRETLS (1u << 9) /* RFC 8689: REQUIRETLS on MAIL; offered only under TLS */
#define SMTPE_EXT_MT_PRIORITY (1u << 10) /* RFC 6710: MT-PRIORITY=-9..9 on MAIL */
#define SMTPE_EXT_DELIVERBY (1u << 11)   /* RFC 2852: BY=<seconds>;R|N[T] on MAIL */
#define SMTPE_EXT_XCLIENT (1u << 12)  /* Postfix XCLIENT; offered and allowed to trusted peers */
#define SMTPE_EXT_XFORWARD (1u << 13) /* Postfix XFORWARD; offered and allowed to trusted peers */
/* The default set. The others are off until the host switches them on. */
#define SMTPE_EXT_DEFAULT                                                                       \
    (SMTPE_EXT_PIPELINING | SMTPE_EXT_SIZE | SMTPE_EXT_8BITMIME | SMTPE_EXT_SMTPUTF8 |           \
     SMTPE_EXT_ENHANCEDSTATUSCODES)

/* What to do with a bare LF, a bare CR (one not part of CRLF) or a NUL octet, in command lines
 * and in message content alike (RFC 5321 §2.3.8, §4.1.1.4). Whatever the policy, only the five
 * octets CR LF . CR LF end DATA (SMTP smuggling). */
typedef enum smtpe_line_ending_policy {
    /* Default. A command line holding one is answered 500 5.5.2 and not executed (the line still
     * ends only at CRLF). Message content holding one is read to its end and then refused with
     * 550 5.6.0; the DATA_END event says why and no further DATA_CHUNK events are given. By
     * BDAT the message ends (refused) with the chunk that holds one, like a chunk that crosses
     * max_message_size; later chunks of it are swallowed and answered 503. */
    SMTPE_LINE_ENDING_REFUSE = 0,
    /* In command lines a bare LF or bare CR ends the line as CRLF would; NUL is removed. In
     * message content a bare LF or bare CR is delivered as CRLF and a NUL is removed; such a
     * line break never starts a line for dot-stuffing or end-of-data purposes. DATA_END carries
     * SMTPE_DATA_NORMALISED. */
    SMTPE_LINE_ENDING_NORMALISE = 1,
    /* The octets are kept verbatim (in command lines they then fail the syntax checks). */
    SMTPE_LINE_ENDING_KEEP = 2
} smtpe_line_ending_policy;

typedef struct smtpe_server_config {
    /* The server's name in the greeting, the EHLO reply and the 221/421 replies. NUL-terminated,
     * at most 255 octets. Default "localhost". */
    const char *hostname;
    /* Text after "220 <hostname> " in the greeting. Default "ESMTP smtpe". */
    const char *greeting_text;
    /* SMTPE_EXT_* bitmask. Default SMTPE_EXT_DEFAULT. */
    unsigned extensions;
    /* Further EHLO keyword lines the host advertises ("AUTH PLAIN", ...), each NUL-terminated,
     * without CRLF, at most 120 octets. Default none. */
    const char *const *ehlo_extra;
    size_t ehlo_extra_count;
    /* Largest message content in octets (after dot-unstuffing), advertised as SIZE and enforced
     * at MAIL (SIZE=, 552 5.3.4) and while content streams (read to the end, then 552 5.3.4).
     * 0 means no limit. Default 10485760 (10 MiB). */
    uint64_t max_message_size;
    /* Longest command line in octets, CRLF included (RFC 5321 §4.5.3.1.4: at least 512).
     * A longer line is skipped to its CRLF and answered 500 5.5.2. Range 512..65536. Default 512. */
    size_t max_line_length;
    /* Most recipients accepted per transaction (RFC 5321 §4.5.3.1.8: at least 100); then
     * 452 4.5.3. Default 100. */
    unsigned max_recipients;
    /* Protocol errors (500-504 and 555 replies, and 535 authentication failures, so that the
     * limit also bounds password guessing) allowed per session; the next one is answered
     * 421 4.7.0 and the session closes. 0 means no limit. Default 20. */
    unsigned max_errors;
    /* Time in ms the server waits for the next command line (RFC 5321 §4.5.3.2.7: at least
     * 5 minutes) and for the next content octets during DATA (§4.5.3.2.5/6); then 421 4.4.2 and
     * close. 0 means no timeout. Defaults 300000 and 180000. */
    uint64_t command_timeout_ms;
    uint64_t data_timeout_ms;
    /* Bare LF / bare CR / NUL policy. Default SMTPE_LINE_ENDING_REFUSE. */
    smtpe_line_ending_policy line_ending;
    /* Accept MAIL FROM:/RCPT TO: paths without angle brackets. Off (0) by default. */
    int lax_angle_brackets;
    /* Size of the reply (output) buffer in octets. It bounds how many pipelined replies can be
     * queued before the engine stops consuming input until the host sends them. Range
     * 2048..1048576. Default 4096. */
    size_t reply_buffer_size;
    /* SASL mechanisms offered by AUTH (RFC 4954), space-separated, e.g. "PLAIN LOGIN XOAUTH2";
     * each 1..20 of A-Z 0-9 - _ (RFC 4422 §3.1). NULL (the default) means no AUTH. PLAIN
     * (RFC 4616) and LOGIN are decoded by the engine; any other name is passed through, the
     * host supplying each challenge (smtpe_server_auth_challenge). SASL responses are command
     * lines, so max_line_length bounds them: hosts offering mechanisms with long tokens
     * (XOAUTH2, GSSAPI) raise it (RFC 4954 §4 allows 12288 octets). */
    const char *auth_mechanisms;
    /* Offer and allow AUTH before TLS is up. Off by default: without TLS, AUTH is not offered
     * and answered 538 5.7.11 (RFC 4954 §6). */
    int auth_without_tls;
    /* MAIL before TLS is up is answered 530 5.7.0 (RFC 3207 §4). Off by default. */
    int require_tls;
    /* Speak LMTP (RFC 2033): LHLO instead of HELO/EHLO (which get 500 5.5.1), and after the
     * content one verdict per accepted recipient. Off by default. */
    int lmtp;
    /* Expect a PROXY protocol header (v1 or v2, HAProxy's spec) before anything else; the
     * greeting waits for the host's verdict on SMTPE_EV_PROXY. A v2 header may carry at most
     * max_line_length - 18 octets of addresses and TLVs. Off by default. */
    int proxy_protocol;
} smtpe_server_config;

/* Fills cfg with the defaults documented above. */
SMTPE_EXTERN void smtpe_server_config_init(smtpe_server_config *cfg);

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */
typedef enum smtpe_event_type {
    SMTPE_EV_NONE = 0,
    SMTPE_EV_HELO,       /* HELO or EHLO (ev.helo). Needs a verdict. */
    SMTPE_EV_MAIL,       /* MAIL FROM: (ev.mail). Needs a verdict; 2xx starts the transaction. */
    SMTPE_EV_RCPT,       /* RCPT TO: (ev.rcpt). Needs a verdict; 2xx adds the recipient. */
    SMTPE_EV_DATA,       /* DATA with at least one recipient. Needs a verdict; 354 starts it. */
    SMTPE_EV_DATA_CHUNK, /* Message content (ev.chunk), dot-unstuffed. No verdict. */
    SMTPE_EV_DATA_END,   /* End of the content (ev.data_end). Needs a verdict if status is OK. */
    SMTPE_EV_RSET,       /* RSET; the engine already answered 250 2.0.0. No verdict. */
    SMTPE_EV_VRFY,       /* VRFY (ev.command). Needs a verdict; default 252 2.5.0. */
    SMTPE_EV_EXPN,       /* EXPN (ev.command). Needs a verdict; default 252 2.5.0. */
    SMTPE_EV_UNKNOWN,    /* A verb the engine does not know (ev.command). Needs a verdict;
                            default 500 5.5.1. */
    SMTPE_EV_QUIT,       /* QUIT; the engine answered 221 2.0.0 and wants to close. No verdict. */
    SMTPE_EV_TIMEOUT,    /* A timeout expired; the engine queued 421 4.4.2 (nothing while it
                            still waits for a PROXY header) and wants to close. Any unfinished
                            message is abandoned. No verdict. */
    SMTPE_EV_ERROR_LIMIT, /* max_errors exceeded; 421 4.7.0 queued, wants close. No verdict. */
    SMTPE_EV_STARTTLS,    /* STARTTLS (RFC 3207). Needs a verdict: accept (220 2.0.0, then
                             SMTPE_WANT_TLS: the host runs the handshake and calls
                             smtpe_server_tls_started) or 4xx/5xx (e.g. 454 4.7.0). */
    SMTPE_EV_AUTH,        /* One step of an AUTH exchange (ev.auth, RFC 4954). Needs a verdict:
                             2xx (235 2.7.0 by accept) authenticates, 4xx/5xx (535 5.7.8, 454,
                             534) fails; for a passed-through mechanism the host may instead
                             call smtpe_server_auth_challenge. */
    SMTPE_EV_BDAT,        /* A BDAT chunk begins (ev.bdat, RFC 3030); DATA_CHUNK events follow.
                             No verdict. */
    SMTPE_EV_CHUNK_END,   /* A BDAT chunk without LAST has been read (ev.bdat). Needs a verdict:
                             2xx (250 2.0.0 by accept), or 4xx/5xx which ends the transaction. */
    SMTPE_EV_PROXY,       /* A valid PROXY header (ev.proxy). Needs a verdict: accept (or 220
                             with a greeting text) queues the greeting; 421 or 5xx closes as
                             smtpe_server_close does. */
    SMTPE_EV_PROXY_INVALID, /* A malformed or oversized PROXY header: the session wants to
                               close, nothing is sent. No verdict. */
    SMTPE_EV_XCLIENT,     /* XCLIENT from a trusted peer (ev.xclient). Needs a verdict: accept
                             (or 220) queues a new greeting and resets the session as after
                             connect (HELO, transaction and AUTH forgotten; TLS kept);
                             4xx/5xx refuses. */
    SMTPE_EV_XFORWARD     /* XFORWARD from a trusted peer (ev.xclient). Needs a verdict: accept
                             (250 2.0.0) or 4xx/5xx. The attributes describe the transaction
                             that follows. */
} smtpe_event_type;

/* Flags of a path (smtpe_path.flags). */
#define SMTPE_PATH_NULL (1u << 0)         /* the null reverse-path <> */
#define SMTPE_PATH_POSTMASTER (1u << 1)   /* <postmaster> without a domain (any case) */
#define SMTPE_PATH_QUOTED (1u << 2)       /* the local-part is a quoted-string */
#define SMTPE_PATH_ADDR_LITERAL (1u << 3) /* the domain is an address-literal [...] */
#define SMTPE_PATH_SOURCE_ROUTE (1u << 4) /* an obsolete source route was given and dropped */
#define SMTPE_PATH_UTF8 (1u << 5)         /* the mailbox holds non-ASCII UTF-8 (RFC 6531) */

/* A reverse-path or forward-path (RFC 5321 §4.1.2). The spans point into the engine's command
 * line buffer: valid until the verdict for the event is given. */
typedef struct smtpe_path {
    smtpe_span mailbox;    /* local-part "@" domain as sent (quotes kept); empty for <> */
    smtpe_span local_part; /* as sent, quotes kept; "postmaster" for <postmaster> */
    smtpe_span domain;     /* domain or address-literal with brackets; empty for <>/postmaster */
    unsigned flags;        /* SMTPE_PATH_* */
} smtpe_path;

/* One esmtp-param keyword[=value] as sent (RFC 5321 §4.1.2). value is empty without "=". */
typedef struct smtpe_param {
    smtpe_span keyword;
    smtpe_span value;
} smtpe_param;

#define SMTPE_MAX_PARAMS 16 /* more parameters on one command: 501 5.5.4 */

typedef enum smtpe_body_type {
    SMTPE_BODY_UNSPECIFIED = 0,
    SMTPE_BODY_7BIT,      /* BODY=7BIT */
    SMTPE_BODY_8BITMIME,  /* BODY=8BITMIME (RFC 6152) */
    SMTPE_BODY_BINARYMIME /* BODY=BINARYMIME (RFC 3030): content only by BDAT, taken verbatim */
} smtpe_body_type;

/* RET= on MAIL (RFC 3461 §4.3). */
typedef enum smtpe_dsn_ret {
    SMTPE_RET_UNSPECIFIED = 0,
    SMTPE_RET_FULL,
    SMTPE_RET_HDRS
} smtpe_dsn_ret;

/* NOTIFY= on RCPT (RFC 3461 §4.1), a bitmask; NEVER is never combined with the others. */
#define SMTPE_NOTIFY_NEVER (1u << 0)
#define SMTPE_NOTIFY_SUCCESS (1u << 1)
#define SMTPE_NOTIFY_FAILURE (1u << 2)
#define SMTPE_NOTIFY_DELAY (1u << 3)

/* SASL mechanisms the engine decodes (ev.auth.mechanism_id). */
#define SMTPE_SASL_OTHER 0 /* passed through to the host */
#define SMTPE_SASL_PLAIN 1 /* RFC 4616 */
#define SMTPE_SASL_LOGIN 2 /* the de facto LOGIN mechanism (draft-murchison-sasl-login) */

/* PROXY header fields (ev.proxy). */
#define SMTPE_PROXY_AF_UNSPEC 0
#define SMTPE_PROXY_AF_INET 1
#define SMTPE_PROXY_AF_INET6 2
#define SMTPE_PROXY_AF_UNIX 3
#define SMTPE_PROXY_TRANSPORT_UNSPEC 0
#define SMTPE_PROXY_TRANSPORT_STREAM 1
#define SMTPE_PROXY_TRANSPORT_DGRAM 2

/* ev.data_end.status: why the content ended. Only SMTPE_DATA_OK needs a verdict; for the others
 * the engine has already queued its reply, and the host must discard what it stored. */
#define SMTPE_DATA_OK 0
#define SMTPE_DATA_TOO_BIG 1         /* over max_message_size: 552 5.3.4 queued */
#define SMTPE_DATA_BAD_LINE_ENDING 2 /* bare CR/LF/NUL under REFUSE: 550 5.6.0 queued */
/* ev.data_end.flags */
#define SMTPE_DATA_NORMALISED (1u << 0) /* a bare CR/LF or NUL was normalised */
#define SMTPE_DATA_HAS_8BIT (1u << 1)   /* an octet above 127 was seen */

/* A PROXY header (HAProxy's proxy-protocol.txt, v1 and v2). For LOCAL (v2), UNKNOWN (v1) and
 * AF_UNSPEC, local is 1 and the connection's own addresses are the real ones; AF_UNIX addresses
 * are not decoded (family says UNIX, the address fields stay zero). */
typedef struct smtpe_proxy_info {
    int version;          /* 1 or 2 */
    int local;
    int family;           /* SMTPE_PROXY_AF_* */
    int transport;        /* SMTPE_PROXY_TRANSPORT_* */
    uint8_t src_addr[16]; /* network order; 4 octets for AF_INET, 16 for AF_INET6 */
    uint8_t dst_addr[16];
    uint16_t src_port;    /* host order */
    uint16_t dst_port;
    smtpe_span tlvs;      /* v2 TLVs as sent, well formed (walk them with smtpe_proxy_tlv_next);
                             engine memory, valid until the verdict; empty for v1 */
} smtpe_proxy_info;

typedef struct smtpe_event {
    smtpe_event_type type;
    union {
        struct {
            smtpe_span domain; /* the argument as sent; engine line buffer, valid until verdict */
            int esmtp;         /* 1 for EHLO and LHLO, 0 for HELO */
            int lmtp;          /* 1 for LHLO (RFC 2033 §4.1) */
        } helo;
        /* MAIL. Parameters are checked and typed; the xtext values (ENVID, AUTH) are decoded in
         * place, so their spans, like the matching params[].value, hold the decoded octets
         * (never CR, LF, NUL or another control octet: those are refused with 501 5.5.4). */
        struct {
            smtpe_path reverse_path;
            uint64_t size;        /* SIZE= value (RFC 1870) when has_size */
            int has_size;
            smtpe_body_type body; /* BODY= (RFC 6152, RFC 3030) */
            int smtputf8;         /* SMTPUTF8 given (RFC 6531) */
            smtpe_dsn_ret ret;    /* RET= (RFC 3461 §4.3) */
            smtpe_span envid;     /* ENVID= decoded (RFC 3461 §4.4); empty when not given */
            int has_envid;
            smtpe_span auth;      /* AUTH= decoded (RFC 4954 §5): a mailbox, empty for <> */
            int has_auth;
            int requiretls;       /* REQUIRETLS given (RFC 8689 §4.1; accepted only under TLS) */
            int mt_priority;      /* MT-PRIORITY= -9..9 (RFC 6710) when has_mt_priority */
            int has_mt_priority;
            int64_t by_time;      /* BY= seconds (RFC 2852 §4); zero or negative only with N */
            char by_mode;         /* 'R' (return) or 'N' (notify); 0 when BY= is absent */
            int by_trace;         /* the T (trace) flag of BY= */
            size_t param_count;
            smtpe_param params[SMTPE_MAX_PARAMS]; /* every parameter, in order */
        } mail;
        /* RCPT. ORCPT's xtext is decoded in place like MAIL's ENVID. */
        struct {
            smtpe_path forward_path;
            unsigned notify;         /* SMTPE_NOTIFY_* (RFC 3461 §4.1); 0 when not given */
            smtpe_span orcpt_type;   /* ORCPT= addr-type ("rfc822", RFC 3461 §4.2) */
            smtpe_span orcpt;        /* ORCPT= address, decoded; empty when not given */
            int has_orcpt;
            size_t param_count;
            smtpe_param params[SMTPE_MAX_PARAMS];
        } rcpt;
        /* DATA_CHUNK: content octets. They point into the octets passed to the smtpe_server_recv
         * call that produced the event or into static engine memory; valid until the next
         * smtpe_server_recv call. Chunk boundaries depend on how input was split; the
         * concatenation of the chunks does not. */
        smtpe_span chunk;
        struct {
            uint64_t size; /* content octets after unstuffing, counted to the end even
                              when status stopped the chunks (so it may exceed the limit) */
            int status;    /* SMTPE_DATA_* */
            unsigned flags;
            int chunked;   /* the content came by BDAT (RFC 3030), not DATA */
            unsigned replies; /* verdicts the event takes: 1, or under LMTP one per accepted
                                 recipient, in recipient order (RFC 2033 §4.2), a 421 among
                                 them ending the series and the session; with a status other
                                 than OK the engine gave them all already (one only when a
                                 BDAT chunk without LAST ended the message) */
        } data_end;
        /* BDAT and CHUNK_END (RFC 3030 §2). */
        struct {
            uint64_t size; /* the chunk's octet count as the command gave it */
            int last;      /* the command had LAST */
            int first;     /* the first chunk of the transaction */
        } bdat;
        /* AUTH (RFC 4954 §4). Decoded octets in engine memory, valid until the verdict; the
         * engine wipes them after it. */
        struct {
            smtpe_span mechanism; /* as sent (any case) */
            int mechanism_id;     /* SMTPE_SASL_* */
            /* PLAIN and LOGIN: the whole credentials (LOGIN has no authzid). */
            smtpe_span authzid, authcid, password;
            /* Other mechanisms: the client's response for this step, base64-decoded.
             * has_response is 0 for an AUTH command without an initial response ("=" is an
             * empty one, RFC 4954 §4). step is 0 for the AUTH command, then 1, 2, ... for the
             * responses to the host's challenges. */
            smtpe_span response;
            int has_response;
            unsigned step;
        } auth;
        smtpe_proxy_info proxy;
        /* XCLIENT, XFORWARD: attribute=value pairs (NAME, ADDR, PORT, PROTO, HELO, LOGIN,
         * DESTADDR, DESTPORT; XFORWARD: IDENT, SOURCE), xtext-decoded in place; values such as
         * "[UNAVAILABLE]" are passed as sent. Valid until the verdict. */
        struct {
            size_t count;
            smtpe_param attrs[SMTPE_MAX_PARAMS];
        } xclient;
        /* VRFY, EXPN, UNKNOWN: verb and the argument text after one space (may be empty).
         * Engine line buffer, valid until the verdict. */
        struct {
            smtpe_span verb;
            smtpe_span argument;
        } command;
    };
} smtpe_event;

/* Walks the TLVs of a PROXY v2 header: takes the next one from *tlvs into *type and *value
 * (a span into the same octets) and advances *tlvs past it. Returns 1, or 0 at the end (or if
 * the rest is malformed, which the engine has already ruled out for ev.proxy.tlvs). */
SMTPE_EXTERN int smtpe_proxy_tlv_next(smtpe_span *tlvs, uint8_t *type, smtpe_span *value);

/* Returns 1 if an event of this kind waits for smtpe_server_reply or smtpe_server_accept. */
SMTPE_EXTERN int smtpe_event_needs_reply(const smtpe_event *ev);

/* ---------------------------------------------------------------------------------------------
 * Server session
 * ------------------------------------------------------------------------------------------- */
typedef struct smtpe_server smtpe_server;

/* Octets of memory one session needs for cfg: a fixed size, never growing. It is
 *   S + (max_line_length - 2) + max(reply_buffer_size, R + 600) + L
 * where S is the session struct (about 1.3 KiB, rounded to max_align_t; it holds the LOGIN
 * user name), 600 octets are kept for a final 421/221 line, R = max(2560, E) is the room one
 * reply may need, with E the EHLO reply's bound: 1100 (a first line of up to 400 octets and
 * the built-in extensions) + strlen(auth_mechanisms) + sum(6 + strlen(ehlo_extra[i])), and
 * L = 512 * max_recipients under LMTP (one reply line per recipient), else 0.
 * With the defaults: 5950 octets (57150 with lmtp). Returns 0 if cfg is invalid. */
SMTPE_EXTERN size_t smtpe_server_memory_size(const smtpe_server_config *cfg);

/* Creates a session with one allocation of smtpe_server_memory_size(cfg) octets through alloc
 * (NULL: malloc) and queues the 220 greeting (RFC 5321 §3.1, §4.2). now_ms is the host's
 * monotonic clock in milliseconds; it starts the command timeout. cfg must outlive the session.
 * Returns 0, SMTPE_ERR_INVALID_ARGUMENT, SMTPE_ERR_CONFIG or SMTPE_ERR_NOMEM. */
SMTPE_EXTERN int smtpe_server_new(smtpe_server **out, const smtpe_server_config *cfg,
                                  const smtpe_allocator *alloc, uint64_t now_ms);

/* Like smtpe_server_new, but in caller memory mem of len octets, aligned for any type
 * (max_align_t), which must stay valid until the session is no longer used; smtpe_server_free
 * must not be called. Returns 0, SMTPE_ERR_INVALID_ARGUMENT (also for misaligned mem),
 * SMTPE_ERR_CONFIG or SMTPE_ERR_BUFFER_TOO_SMALL. */
SMTPE_EXTERN int smtpe_server_init(smtpe_server **out, void *mem, size_t len,
                                   const smtpe_server_config *cfg, uint64_t now_ms);

/* Frees a session made by smtpe_server_new. NULL is allowed. */
SMTPE_EXTERN void smtpe_server_free(smtpe_server *s);

/* Feeds len octets read from the client. The engine consumes octets until it has an event for
 * the host to take, waits for a verdict, has too little reply buffer left for another reply, or
 * wants to close; the host keeps the rest and feeds it again after taking the event, giving the
 * verdict or sending output. now_ms is the monotonic clock in ms; a completed command line, or
 * content octets during DATA, restart the timeouts from it (so a client that drips a command
 * one octet at a time still has command_timeout_ms for the whole line).
 * Returns the number of octets consumed (0..len), or SMTPE_ERR_INVALID_ARGUMENT. It may return 0
 * and still have made progress (queued a reply or an event: under NORMALISE a line ended by a
 * bare CR is known only when the next octet arrives, which is not consumed); a host loops while
 * octets are consumed, events come or output is queued, as smtpe_server_want() tells.
 * RFC 5321 §2.3.8 (lines), §4.1.1 (commands), §4.5.2 (transparency), RFC 2920 (pipelining). */
SMTPE_EXTERN ssize_t smtpe_server_recv(smtpe_server *s, const uint8_t *buf, size_t len,
                                       uint64_t now_ms);

/* Takes the pending event, if any, into *ev. Returns 1 if an event was taken, 0 if none.
 * Spans in the event have the lifetimes given in smtpe_event. */
SMTPE_EXTERN int smtpe_server_next_event(smtpe_server *s, smtpe_event *ev);

/* Gives the verdict for the event that needs one: a reply with reply code code (200..599),
 * enhanced status code enhanced ("5.1.1"; NULL: derived from the code class as "x.0.0"; only
 * sent when ENHANCEDSTATUSCODES is on) and text (NUL-terminated; NULL: a default text; '\n'
 * separates the lines of a multi-line reply; no other control characters but HT; at most 32
 * lines, each at most 400 octets, all at most 2048). The reply goes out in order after earlier
 * replies. Meaning:
 * HELO 2xx opens the session (and resets any transaction); MAIL 2xx starts a transaction; RCPT
 * 2xx adds a recipient; DATA takes 354 (content follows) or 4xx/5xx; DATA_END any code ends the
 * transaction (under LMTP after ev.data_end.replies calls, one per recipient, each a single
 * line of at most 512 octets); CHUNK_END 4xx/5xx ends it; STARTTLS takes 220 (TLS follows) or
 * 4xx/5xx; AUTH 2xx authenticates; PROXY and XCLIENT take 220 (text replaces greeting_text in
 * the greeting) or, for PROXY, 421/5xx which closes; 3xx is allowed only for DATA (354) and
 * UNKNOWN. A 421 from the host closes the session after it is sent.
 * Returns 0, SMTPE_ERR_STATE (no event waits), SMTPE_ERR_INVALID_ARGUMENT (bad code for the
 * event, bad characters) or SMTPE_ERR_REPLY_TOO_LONG. RFC 5321 §4.2, RFC 3463. */
SMTPE_EXTERN int smtpe_server_reply(smtpe_server *s, unsigned code, const char *enhanced,
                                    const char *text);

/* Gives the default positive verdict for the waiting event: EHLO 250 with the extensions,
 * HELO 250, MAIL 250 2.1.0, RCPT 250 2.1.5, DATA 354, DATA_END 250 2.0.0, VRFY/EXPN 252 2.5.0,
 * UNKNOWN 500 5.5.1, STARTTLS 220 2.0.0, AUTH 235 2.7.0, CHUNK_END 250 2.0.0 "<n> octets
 * received", PROXY and XCLIENT the greeting, XFORWARD 250 2.0.0. Returns 0 or SMTPE_ERR_STATE. */
SMTPE_EXTERN int smtpe_server_accept(smtpe_server *s);

/* STARTTLS (RFC 3207 §4.2) and implicit TLS (RFC 8314). After accepting SMTPE_EV_STARTTLS the
 * session wants SMTPE_WANT_TLS: the host sends the queued 220, feeds any octets it has already
 * read (the engine consumes and discards them: they arrived before TLS and may be an injection,
 * CVE-2011-0411; their count is in stats.discarded_octets), runs the TLS handshake itself
 * (the engine keeps no timer meanwhile), and calls this function once TLS is up. The session
 * then starts afresh: no HELO, no transaction, no AUTH; STARTTLS is no longer offered. Called
 * before the session has sent any octet or read any command (after the PROXY verdict, if
 * proxy_protocol is on, since the PROXY header comes before the TLS handshake), it marks the
 * session as running under TLS from the start (port 465). now_ms restarts the command timeout.
 * Returns 0, SMTPE_ERR_INVALID_ARGUMENT or SMTPE_ERR_STATE (no handshake was asked for and the
 * session is under way, or TLS is already up). */
SMTPE_EXTERN int smtpe_server_tls_started(smtpe_server *s, uint64_t now_ms);

/* For an SMTPE_EV_AUTH of a passed-through mechanism (mechanism_id SMTPE_SASL_OTHER): queues
 * the challenge "334 <base64 of data>" (data may be empty) instead of a verdict; the client's
 * next line comes back as another SMTPE_EV_AUTH with step + 1 ("*" cancels: the engine answers
 * 501 5.0.0 and the exchange ends without an event). len is at most 1536 octets.
 * Returns 0, SMTPE_ERR_STATE (no such event waits), SMTPE_ERR_INVALID_ARGUMENT or
 * SMTPE_ERR_REPLY_TOO_LONG. RFC 4954 §4. */
SMTPE_EXTERN int smtpe_server_auth_challenge(smtpe_server *s, const uint8_t *data, size_t len);

/* Marks the peer as trusted (1) or not (0, the default) for XCLIENT and XFORWARD: only a
 * trusted peer sees them in the EHLO reply and may use them; others get 550 5.7.0. The mark
 * survives XCLIENT. Returns 0 or SMTPE_ERR_INVALID_ARGUMENT. */
SMTPE_EXTERN int smtpe_server_set_trusted(smtpe_server *s, int trusted);

/* Queues a final reply (code 421 or 221 or 5xx; NULL enhanced/text as in smtpe_server_reply)
 * and makes the session want to close once output is sent; it consumes no more input. If no
 * octet has been sent yet, the reply replaces the greeting (e.g. 421 4.7.0 at connect when the
 * host is full, 554 for a refused client). A pending verdict is dropped.
 * Returns 0, SMTPE_ERR_STATE (already closing) or SMTPE_ERR_INVALID_ARGUMENT. */
SMTPE_EXTERN int smtpe_server_close(smtpe_server *s, unsigned code, const char *enhanced,
                                    const char *text);

/* Output: a pointer to the queued reply octets and their count in *len (0: nothing to send).
 * Valid until the next call of any smtpe_server_* function on s other than send_buf. */
SMTPE_EXTERN const uint8_t *smtpe_server_send_buf(smtpe_server *s, size_t *len);

/* Marks n octets of smtpe_server_send_buf's output as sent. n MUST NOT exceed that length.
 * Returns 0 or SMTPE_ERR_INVALID_ARGUMENT. */
SMTPE_EXTERN int smtpe_server_send_ack(smtpe_server *s, size_t n);

/* What the session wants now, a bitmask. */
#define SMTPE_WANT_READ (1u << 0)  /* it would consume input */
#define SMTPE_WANT_WRITE (1u << 1) /* output is queued */
#define SMTPE_WANT_CLOSE (1u << 2) /* the session is over: close once output is sent */
#define SMTPE_WANT_VERDICT (1u << 3) /* an event waits for the host's verdict */
#define SMTPE_WANT_EVENT (1u << 4)   /* an event waits to be taken with next_event */
#define SMTPE_WANT_TLS (1u << 5)     /* STARTTLS accepted: send the output, feed what was
                                        already read, run the handshake, then call
                                        smtpe_server_tls_started */
SMTPE_EXTERN unsigned smtpe_server_want(const smtpe_server *s);

/* The monotonic time in ms at which smtpe_server_handle_expiry must be called, or UINT64_MAX
 * for never (no timer while an event or a verdict is pending, or once the session is closing:
 * a host bounds how long it waits for a client to read the final reply). After a verdict it
 * returns 0 ("now") until the next smtpe_server_recv that consumes octets or
 * smtpe_server_handle_expiry call, which restarts the timeout from the time it is given, so time
 * the host spent deciding never counts against the client. */
SMTPE_EXTERN uint64_t smtpe_server_expiry(const smtpe_server *s);

/* Tells the engine the time is now_ms. If a timeout has expired it queues 421 4.4.2, makes
 * SMTPE_EV_TIMEOUT the pending event and wants to close. Returns 1 if it expired, 0 if not.
 * RFC 5321 §4.5.3.2. */
SMTPE_EXTERN int smtpe_server_handle_expiry(smtpe_server *s, uint64_t now_ms);

/* Session counters for logging. */
typedef struct smtpe_server_stats {
    uint64_t octets_in;      /* octets consumed */
    uint64_t octets_out;     /* octets acknowledged as sent */
    unsigned commands;       /* command lines processed */
    unsigned errors;         /* protocol errors counted against max_errors */
    unsigned transactions;   /* messages whose content ended with SMTPE_DATA_OK */
    unsigned recipients;     /* recipients accepted, all transactions */
    uint64_t discarded_octets; /* octets that followed STARTTLS before TLS was up, discarded */
    int tls;                 /* TLS is up (smtpe_server_tls_started) */
    int authenticated;       /* AUTH succeeded in this session (since the last TLS/XCLIENT) */
} smtpe_server_stats;
SMTPE_EXTERN void smtpe_server_get_stats(const smtpe_server *s, smtpe_server_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* SMTPE_H */
