/*
 * smtpe.h - the one installed header of smtpe, an embeddable sans-I/O SMTP engine.
 *
 * The server engine is a state machine: the host feeds it the octets it read from the client
 * (smtpe_server_recv), pulls events (smtpe_server_next_event), gives a verdict for each event
 * that needs one (smtpe_server_reply / smtpe_server_accept), and sends the reply octets the
 * engine produced (smtpe_server_send_buf / smtpe_server_send_ack). The client engine
 * (smtpe_client_*, from 0.3.0; "Client engine" below) is the mirror image for sending. The
 * engine never reads a socket or a clock and allocates memory only when a session is created.
 *
 * Implements RFC 5321 (SMTP) with RFC 1870 (SIZE), RFC 6152 (8BITMIME), RFC 2920 (PIPELINING),
 * RFC 2034/3463/5248 (enhanced status codes), RFC 6531 (SMTPUTF8), RFC 3207 (STARTTLS),
 * RFC 4954 (AUTH, with SASL PLAIN RFC 4616 and LOGIN decoded), RFC 3030 (CHUNKING, BINARYMIME),
 * RFC 3461 (DSN), RFC 2033 (LMTP), RFC 8689 (REQUIRETLS), RFC 6710 (MT-PRIORITY),
 * RFC 2852 (DELIVERBY), the HAProxy PROXY protocol v1/v2 and Postfix's XCLIENT and XFORWARD.
 *
 * Language. C11 is required (the header uses anonymous unions; the engine uses max_align_t
 * and _Alignof); the header also compiles as C++11 and later. It needs nothing but the
 * standard headers <stddef.h> and <stdint.h>: no POSIX type, no define.
 *
 * Threads. The engine has no global mutable state and starts no thread. A session
 * (smtpe_server, smtpe_client) is used by one thread at a time; it may move between threads (a
 * thread pool, a work-stealing loop) as long as the host orders the calls (a mutex, or handing
 * the session over through a queue, gives that order). A config (smtpe_server_config,
 * smtpe_client_config) is only read by the engine: once set up it may be shared by any number
 * of sessions on any threads. Functions without a session (smtpe_strerror, smtpe_version,
 * smtpe_server_config_init, smtpe_server_memory_size, smtpe_event_needs_reply,
 * smtpe_proxy_tlv_next, smtpe_client_config_init, smtpe_client_memory_size, and
 * smtpe_content_scan* on the caller's own smtpe_content_info) may be called from any thread at
 * any time.
 *
 * Versions and ABI. SMTPE_VERSION_* below say which release this header belongs to;
 * smtpe_version() says which library the program runs with. The shared library's ABI is
 * versioned by its soname (libsmtpe.so.1 for ABI 1, from release 0.2.0 on): a program built
 * against any release of ABI 1 keeps working with every later release of ABI 1, which only
 * adds functions and adds fields at the end of the versioned structs:
 *   - The structs the caller allocates and the library fills or reads (smtpe_server_config,
 *     smtpe_event, smtpe_server_stats) are versioned, as ngtcp2 does it: each has a
 *     SMTPE_*_VERSION number, and every function that takes one has a _versioned form with
 *     the version as a parameter; the plain name is a macro that passes the version of this
 *     header, so callers write smtpe_server_new(...) as usual. The library reads and writes
 *     only the fields that version has (a later library fills the fields it added with their
 *     defaults, and never writes past the caller's struct) and refuses a version it does not
 *     know with SMTPE_ERR_INVALID_ARGUMENT. Bindings that call through an FFI call the
 *     _versioned functions with the version their struct layout matches.
 *   - The other structs (smtpe_span, smtpe_allocator, smtpe_param, smtpe_path,
 *     smtpe_proxy_info) are frozen: they never change; new data goes into new fields of the
 *     versioned ones.
 *   - Event types, flags and error codes are only added; an event type a later release adds
 *     is only ever given to a session whose config asks for the feature it belongs to, which
 *     an older program cannot do.
 * The shared library exports exactly the functions declared with SMTPE_API here (a linker
 * version script, nodes SMTPE_0.2 and SMTPE_0.3); the engine's internal functions are hidden
 * in every build (static in the amalgamated smtpe.c). A copy of smtpe compiled into a shared
 * object of the embedder's (a plug-in, a language binding) keeps its API out of that object's
 * exports too when built with SMTPE_API hidden (below) or -fvisibility=hidden, so two copies
 * in one process never bind to each other's functions.
 */
#ifndef SMTPE_H
#define SMTPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The mark on every public function. The shared library's build defines SMTPE_SHARED_BUILD;
 * an embedder may define SMTPE_API itself (-DSMTPE_API=...) before including this header,
 * e.g. to __attribute__((visibility("hidden"))) to keep a vendored copy out of its own
 * shared object's exports, or to "static inline" when it compiles the amalgamated smtpe.c
 * into the one file that uses it (inline: no warning for the functions it does not call). */
#ifndef SMTPE_API
#if defined(SMTPE_SHARED_BUILD) && defined(__GNUC__)
#define SMTPE_API __attribute__((visibility("default")))
#else
#define SMTPE_API
#endif
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions. SMTPE_VERSION_NUM is (major << 16) | (minor << 8) | patch.
 * ------------------------------------------------------------------------------------------- */
#define SMTPE_VERSION_MAJOR 0
#define SMTPE_VERSION_MINOR 4
#define SMTPE_VERSION_PATCH 0
#define SMTPE_VERSION_NUM 0x000400
#define SMTPE_VERSION_STRING "0.4.0"

/* The library's SMTPE_VERSION_NUM (the release the program runs with, which may be later
 * than the header it was built with). */
SMTPE_API uint32_t smtpe_version(void);
/* The library's SMTPE_VERSION_STRING, a static string that lives forever. */
SMTPE_API const char *smtpe_version_string(void);

/* A signed octet count or negative error, as returned by smtpe_server_recv (ptrdiff_t, so that
 * no POSIX ssize_t is needed). */
typedef ptrdiff_t smtpe_ssize;

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

/* Not an error: a verdict taken for a RCPT that its MAIL's refusal voided (concurrent
 * verdicts: see smtpe_server_reply_id). The client had 503 5.5.1; the verdict changed nothing. */
#define SMTPE_VOIDED 1

/* Returns a static, human-readable description of an SMTPE_ERR_* code or SMTPE_VOIDED
 * ("unknown error" for anything else). The string lives forever. */
SMTPE_API const char *smtpe_strerror(int err);

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
 * read-only among any number of sessions on any threads. A session copies the config when it
 * is created, so the struct itself may go away or change afterwards (for the next sessions);
 * the strings it points to (hostname, greeting_text, ehlo_extra, auth_mechanisms) must outlive
 * every session created from it.
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
     * 452 4.5.3. At least 1; under LMTP at most 100000 (each takes room for its own reply).
     * Default 100. */
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
    /* Size of the reply (output) buffer in octets. The engine reads a command only while room
     * for the longest reply it may owe stays free (R + 600 octets, about 3.1 KiB: see
     * smtpe_server_memory_size), so about reply_buffer_size - 3.1 KiB of pipelined replies can
     * wait unsent before it stops consuming input until the host sends them; at the smallest
     * values none can (each reply must go out before the next command is read). Range
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
    /* Concurrent verdicts: how many commands of a pipelined batch (RFC 2920) the engine may
     * hold at once, events handed out and verdicts owed, 1..1024. Default 1: one verdict at a
     * time, each event waits for the previous verdict. Above 1, the RCPT commands that follow
     * a MAIL are handed out while the MAIL and earlier RCPTs still wait for their verdicts;
     * the host answers them in any order (smtpe_server_reply_id) and the replies still leave
     * in command order. The rules, and what it costs in memory, are given at
     * smtpe_server_reply_id. */
    unsigned max_pending_verdicts;
} smtpe_server_config;

/* The layout of smtpe_server_config in this header (see "Versions and ABI" above). */
#define SMTPE_SERVER_CONFIG_V1 1
#define SMTPE_SERVER_CONFIG_VERSION SMTPE_SERVER_CONFIG_V1

/* Fills cfg, laid out as config_version says, with the defaults documented above. Does
 * nothing if cfg is NULL or the version is unknown. */
SMTPE_API void smtpe_server_config_init_versioned(int config_version, smtpe_server_config *cfg);
#define smtpe_server_config_init(cfg)                                                           \
    smtpe_server_config_init_versioned(SMTPE_SERVER_CONFIG_VERSION, (cfg))

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

/* The event kinds' fields, named so that the header is also valid C++ (an anonymous union may
 * hold no type definitions there). A later version of smtpe_event may append fields to them
 * (the event's layout version covers that). */
/* The fields of ev.helo (see smtpe_event). */
typedef struct smtpe_event_helo {
    smtpe_span domain; /* the argument as sent; engine line buffer, valid until verdict */
    int esmtp;         /* 1 for EHLO and LHLO, 0 for HELO */
    int lmtp;          /* 1 for LHLO (RFC 2033 §4.1) */
} smtpe_event_helo;

/* The fields of ev.mail (see smtpe_event). */
typedef struct smtpe_event_mail {
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
} smtpe_event_mail;

/* The fields of ev.rcpt (see smtpe_event). */
typedef struct smtpe_event_rcpt {
    smtpe_path forward_path;
    unsigned notify;         /* SMTPE_NOTIFY_* (RFC 3461 §4.1); 0 when not given */
    smtpe_span orcpt_type;   /* ORCPT= addr-type ("rfc822", RFC 3461 §4.2) */
    smtpe_span orcpt;        /* ORCPT= address, decoded; empty when not given */
    int has_orcpt;
    size_t param_count;
    smtpe_param params[SMTPE_MAX_PARAMS];
} smtpe_event_rcpt;

/* The fields of ev.data_end (see smtpe_event). */
typedef struct smtpe_event_data_end {
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
} smtpe_event_data_end;

/* The fields of ev.bdat (see smtpe_event). */
typedef struct smtpe_event_bdat {
    uint64_t size; /* the chunk's octet count as the command gave it */
    int last;      /* the command had LAST */
    int first;     /* the first chunk of the transaction */
} smtpe_event_bdat;

/* The fields of ev.auth (see smtpe_event). */
typedef struct smtpe_event_auth {
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
} smtpe_event_auth;

/* The fields of ev.xclient (see smtpe_event). */
typedef struct smtpe_event_xclient {
    size_t count;
    smtpe_param attrs[SMTPE_MAX_PARAMS];
} smtpe_event_xclient;

/* The fields of ev.command (see smtpe_event). */
typedef struct smtpe_event_command {
    smtpe_span verb;
    smtpe_span argument;
} smtpe_event_command;

typedef struct smtpe_event {
    smtpe_event_type type;
    /* 1 when this event ended a mail transaction the host had accepted (MAIL 2xx) before the
     * end of its content: the host drops what it keeps for it (a temporary file, the
     * recipients). The event type says why: RSET, HELO (HELO, EHLO or LHLO reset it), QUIT,
     * TIMEOUT, ERROR_LIMIT. A transaction that ends otherwise is seen by the host already:
     * DATA_END (whatever its status), its own 4xx/5xx to CHUNK_END, its own
     * smtpe_server_close, the client's disconnection. 0 otherwise. */
    int abandoned;
    /* The event's number in the session, increasing in the order events are taken (0 for
     * DATA_CHUNK; a number may be skipped: that of an event dropped before it was taken). The
     * verdict calls with an id (smtpe_server_reply_id, smtpe_server_accept_id) name the event
     * by it. */
    uint64_t id;
    union {
        smtpe_event_helo helo;
        /* MAIL. Parameters are checked and typed; the xtext values (ENVID, AUTH) are decoded in
         * place, so their spans, like the matching params[].value, hold the decoded octets
         * (never CR, LF, NUL or another control octet: those are refused with 501 5.5.4). */
        smtpe_event_mail mail;
        /* RCPT. ORCPT's xtext is decoded in place like MAIL's ENVID. */
        smtpe_event_rcpt rcpt;
        /* DATA_CHUNK: content octets. They point into the octets passed to the smtpe_server_recv
         * call that produced the event or into static engine memory; valid until the next
         * smtpe_server_recv call. Chunk boundaries depend on how input was split; the
         * concatenation of the chunks does not. */
        smtpe_span chunk;
        smtpe_event_data_end data_end;
        /* BDAT and CHUNK_END (RFC 3030 §2). */
        smtpe_event_bdat bdat;
        /* AUTH (RFC 4954 §4). Decoded octets in engine memory, valid until the verdict; the
         * engine wipes them after it. */
        smtpe_event_auth auth;
        smtpe_proxy_info proxy;
        /* XCLIENT, XFORWARD: attribute=value pairs (NAME, ADDR, PORT, PROTO, HELO, LOGIN,
         * DESTADDR, DESTPORT; XFORWARD: IDENT, SOURCE), xtext-decoded in place; values such as
         * "[UNAVAILABLE]" are passed as sent. Valid until the verdict. */
        smtpe_event_xclient xclient;
        /* VRFY, EXPN, UNKNOWN: verb and the argument text after one space (may be empty).
         * Engine line buffer, valid until the verdict. */
        smtpe_event_command command;
    };
} smtpe_event;

/* The layout of smtpe_event in this header (see "Versions and ABI" above). */
#define SMTPE_EVENT_V1 1
#define SMTPE_EVENT_VERSION SMTPE_EVENT_V1

/* Walks the TLVs of a PROXY v2 header: takes the next one from *tlvs into *type and *value
 * (a span into the same octets) and advances *tlvs past it. Returns 1, or 0 at the end (or if
 * the rest is malformed, which the engine has already ruled out for ev.proxy.tlvs). */
SMTPE_API int smtpe_proxy_tlv_next(smtpe_span *tlvs, uint8_t *type, smtpe_span *value);

/* Returns 1 if an event of this kind waits for smtpe_server_reply or smtpe_server_accept. */
SMTPE_API int smtpe_event_needs_reply(const smtpe_event *ev);

/* ---------------------------------------------------------------------------------------------
 * Server session
 * ------------------------------------------------------------------------------------------- */
typedef struct smtpe_server smtpe_server;

/* Octets of memory one session needs for cfg: a fixed size, never growing. With
 * N = max_pending_verdicts it is
 *   S + N * (B + 40) + O + L
 * where S is the session struct (about 1.5 KiB with its copy of the config, rounded to
 * max_align_t; it holds the LOGIN user name); B is one command line buffer of
 * max_line_length - 2 octets (at least 512 when N > 1: a verdict given out of order waits
 * there) and 40 octets the bookkeeping of one held command; O = max(reply_buffer_size,
 * R + 600) + (N - 1) * B is the reply ring, in which 600 octets are kept for a final 421/221
 * line and R = max(2560, E) is the room one reply may need, with E the EHLO reply's bound:
 * 1100 (a first line of up to 400 octets and the built-in extensions) + strlen(auth_mechanisms)
 * + sum(6 + strlen(ehlo_extra[i])); and L = 512 * max_recipients under LMTP (one reply line
 * per recipient), else 0. With the defaults (on LP64): 6214 octets (57414 with lmtp; 111552
 * with max_pending_verdicts 100). Returns 0 if cfg is invalid or its version unknown. */
SMTPE_API size_t smtpe_server_memory_size_versioned(int config_version,
                                                    const smtpe_server_config *cfg);
#define smtpe_server_memory_size(cfg)                                                           \
    smtpe_server_memory_size_versioned(SMTPE_SERVER_CONFIG_VERSION, (cfg))

/* Creates a session with one allocation of smtpe_server_memory_size(cfg) octets through alloc
 * (NULL: malloc) and queues the 220 greeting (RFC 5321 §3.1, §4.2). The session copies cfg
 * (laid out as config_version says); the strings it points to must outlive the session.
 * now_ms is the host's monotonic clock in milliseconds; it starts the command timeout.
 * Returns 0, SMTPE_ERR_INVALID_ARGUMENT (also for an unknown config_version),
 * SMTPE_ERR_CONFIG or SMTPE_ERR_NOMEM. */
SMTPE_API int smtpe_server_new_versioned(smtpe_server **out, int config_version,
                                         const smtpe_server_config *cfg,
                                         const smtpe_allocator *alloc, uint64_t now_ms);
#define smtpe_server_new(out, cfg, alloc, now_ms)                                               \
    smtpe_server_new_versioned((out), SMTPE_SERVER_CONFIG_VERSION, (cfg), (alloc), (now_ms))

/* Like smtpe_server_new, but in caller memory mem of len octets, aligned for any type
 * (max_align_t), which must stay valid until the session is no longer used; smtpe_server_free
 * must not be called. Returns 0, SMTPE_ERR_INVALID_ARGUMENT (also for misaligned mem or an
 * unknown config_version), SMTPE_ERR_CONFIG or SMTPE_ERR_BUFFER_TOO_SMALL. */
SMTPE_API int smtpe_server_init_versioned(smtpe_server **out, void *mem, size_t len,
                                          int config_version, const smtpe_server_config *cfg,
                                          uint64_t now_ms);
#define smtpe_server_init(out, mem, len, cfg, now_ms)                                           \
    smtpe_server_init_versioned((out), (mem), (len), SMTPE_SERVER_CONFIG_VERSION, (cfg),       \
                                (now_ms))

/* Frees a session made by smtpe_server_new. NULL is allowed. */
SMTPE_API void smtpe_server_free(smtpe_server *s);

/* Feeds len octets read from the client. The engine consumes octets until it has an event for
 * the host to take, waits for a verdict, has too little reply room left for another reply, or
 * wants to close; the host keeps the rest and feeds it again after taking the event, giving the
 * verdict or sending output. now_ms is the monotonic clock in ms; a completed command line, or
 * content octets during DATA, restart the timeouts from it (so a client that drips a command
 * one octet at a time still has command_timeout_ms for the whole line).
 * Returns the number of octets consumed (0..len), or SMTPE_ERR_INVALID_ARGUMENT. It may return
 * 0 and still have made progress (queued a reply or an event: under NORMALISE a line ended by
 * a bare CR is known only when the next octet arrives, which is not consumed). It never
 * returns 0 without progress while smtpe_server_want() says SMTPE_WANT_READ and len > 0, so a
 * host that, after every recv, takes the events, sends the output and feeds again while
 * want() says SMTPE_WANT_READ and octets are left can neither spin nor stall.
 * RFC 5321 §2.3.8 (lines), §4.1.1 (commands), §4.5.2 (transparency), RFC 2920 (pipelining). */
SMTPE_API smtpe_ssize smtpe_server_recv(smtpe_server *s, const uint8_t *buf, size_t len,
                                        uint64_t now_ms);

/* Takes the next event, if any, into *ev (laid out as event_version says; the library writes
 * only that layout's octets). Returns 1 if an event was taken, 0 if none (or if s or ev is
 * NULL or the version unknown). Spans in the event have the lifetimes given in smtpe_event.
 * An event that needs a verdict can be answered only once it has been taken. */
SMTPE_API int smtpe_server_next_event_versioned(smtpe_server *s, int event_version,
                                                smtpe_event *ev);
#define smtpe_server_next_event(s, ev)                                                          \
    smtpe_server_next_event_versioned((s), SMTPE_EVENT_VERSION, (ev))

/* Gives the verdict for the oldest event taken with next_event that still waits for one: a
 * reply with reply code code (200..599), enhanced status code enhanced ("5.1.1"; NULL: derived
 * from the code class as "x.0.0"; only sent when ENHANCEDSTATUSCODES is on) and text
 * (NUL-terminated; NULL: a default text; '\n' separates the lines of a multi-line reply; no
 * other control characters but HT; at most 32 lines, each at most 400 octets, all at most
 * 2048). The reply goes out in order after earlier replies. Meaning:
 * HELO 2xx opens the session (and resets any transaction); MAIL 2xx starts a transaction; RCPT
 * 2xx adds a recipient; DATA takes 354 (content follows) or 4xx/5xx; DATA_END any code ends the
 * transaction (under LMTP after ev.data_end.replies calls, one per recipient, each a single
 * line of at most 512 octets); CHUNK_END 4xx/5xx ends it; STARTTLS takes 220 (TLS follows) or
 * 4xx/5xx; AUTH 2xx authenticates; PROXY and XCLIENT take 220 (text replaces greeting_text in
 * the greeting) or, for PROXY, 421/5xx which closes; 3xx is allowed only for DATA (354) and
 * UNKNOWN. A 421 from the host closes the session after it is sent.
 * Returns 0, SMTPE_VOIDED (only with concurrent verdicts: the oldest owed was a voided RCPT's,
 * see smtpe_server_reply_id), SMTPE_ERR_STATE (no taken event waits for a verdict: none was
 * given out, it is still to be taken with next_event, or the session is closing),
 * SMTPE_ERR_INVALID_ARGUMENT (bad code for the event, bad characters) or
 * SMTPE_ERR_REPLY_TOO_LONG. RFC 5321 §4.2, RFC 3463. */
SMTPE_API int smtpe_server_reply(smtpe_server *s, unsigned code, const char *enhanced,
                                 const char *text);

/* Gives the default positive verdict for the oldest taken event that waits for one: EHLO 250
 * with the extensions, HELO 250, MAIL 250 2.1.0, RCPT 250 2.1.5, DATA 354, DATA_END 250 2.0.0,
 * VRFY/EXPN 252 2.5.0, UNKNOWN 500 5.5.1, STARTTLS 220 2.0.0, AUTH 235 2.7.0, CHUNK_END
 * 250 2.0.0 "<n> octets received", PROXY and XCLIENT the greeting, XFORWARD 250 2.0.0.
 * Returns 0, SMTPE_VOIDED (as smtpe_server_reply) or SMTPE_ERR_STATE. */
SMTPE_API int smtpe_server_accept(smtpe_server *s);

/* smtpe_server_reply and smtpe_server_accept for the event whose ev.id is id, which need not
 * be the oldest: with cfg.max_pending_verdicts = N > 1 several events of a pipelined batch
 * (RFC 2920) may wait at once, and the host answers them in any order. With N = 1 the only
 * event that can wait is the oldest, and these are the same as the calls without an id.
 * The rules of concurrent verdicts:
 *  - While a MAIL and the RCPTs after it wait for their verdicts, the engine goes on reading
 *    the client's pipelined commands: each RCPT is handed out at once (SMTPE_EV_RCPT with its
 *    own id), up to N commands held in all. Any other command (DATA, BDAT, RSET, QUIT, NOOP,
 *    a second MAIL, ...) is read but not executed until the replies of all earlier commands
 *    are known (every earlier verdict given; a voided RCPT's, below, does not count: its reply
 *    is known), and nothing after it is read meanwhile; it is then executed exactly as
 *    without pipelining (DATA sees the recipients the verdicts accepted). Events other than
 *    MAIL and RCPT always wait alone, as with N = 1.
 *  - Each reply goes out only after the replies of all earlier commands (RFC 2920 §3.1), so the
 *    client reads them in command order whatever the order of the verdicts. A reply the engine
 *    gives itself (501 for a malformed RCPT, 452 4.5.3, ...) waits its turn too, and
 *    max_errors counts replies in that order.
 *  - A RCPT handed out before its MAIL's verdict belongs to that MAIL. If the MAIL is refused,
 *    each such RCPT is answered 503 5.5.1 "Need MAIL command" at once, whatever the host says
 *    of it, as the client would be answered without pipelining: a verdict given to it already
 *    (held for its turn) is void too, so a host that refuses a MAIL drops the recipients it
 *    counted for it; a verdict still owed changes nothing when it comes and returns
 *    SMTPE_VOIDED.
 *  - A RCPT that would pass max_recipients were the waiting RCPTs all accepted waits like
 *    the other commands, and gets its 452 4.5.3 (RFC 5321 §4.5.3.1.10) only if they are.
 *  - So the client gets exactly the replies it would get were the same verdicts given one at a
 *    time: concurrent verdicts change when replies leave, never what they say (but for the
 *    bound on reply length below).
 *  - The spans of each event stay valid until that event's own verdict (the engine keeps one
 *    line buffer per held command), or, for a verdict the session drops (below), until the
 *    session is freed: a closing session reads nothing more.
 *  - A reply to MAIL or RCPT may take at most B octets (smtpe_server_memory_size; CRLFs
 *    included, so one line of 512 octets always fits); a longer one gets
 *    SMTPE_ERR_REPLY_TOO_LONG.
 *  - smtpe_server_close, QUIT, a timeout and the error limit drop every verdict still owed;
 *    calls for them then return SMTPE_ERR_STATE (smtpe_server_want then says
 *    SMTPE_WANT_CLOSE: a host cancels its lookups then).
 *  - The calls without an id answer the oldest owed verdict, so a host that answers in command
 *    order may use them; one whose lookups finish in any order uses these.
 * Returns what smtpe_server_reply / smtpe_server_accept return, and SMTPE_VOIDED (1) for a
 * voided RCPT; SMTPE_ERR_STATE also when no taken event with that id waits. RFC 2920 §3.1. */
SMTPE_API int smtpe_server_reply_id(smtpe_server *s, uint64_t id, unsigned code,
                                    const char *enhanced, const char *text);
SMTPE_API int smtpe_server_accept_id(smtpe_server *s, uint64_t id);

/* STARTTLS (RFC 3207 §4.2) and implicit TLS (RFC 8314). After accepting SMTPE_EV_STARTTLS the
 * session wants SMTPE_WANT_TLS (with SMTPE_WANT_READ): the host sends the queued 220, feeds
 * any octets it has already read (the engine consumes and discards them: they arrived before
 * TLS and may be an injection, CVE-2011-0411; their count is in stats.discarded_octets),
 * reads nothing more in clear (the next octets are the TLS handshake's), runs the TLS
 * handshake itself (the engine keeps no timer meanwhile), and calls this function once TLS is
 * up. The session then starts afresh: no HELO, no transaction, no AUTH; STARTTLS is no longer
 * offered. Called before the session has sent any octet or read any command (after the PROXY
 * verdict, if proxy_protocol is on, since the PROXY header comes before the TLS handshake), it
 * marks the session as running under TLS from the start (port 465). now_ms restarts the
 * command timeout. Returns 0, SMTPE_ERR_INVALID_ARGUMENT or SMTPE_ERR_STATE (no handshake was
 * asked for and the session is under way, TLS is already up, or the 220 is not yet all
 * acknowledged). */
SMTPE_API int smtpe_server_tls_started(smtpe_server *s, uint64_t now_ms);

/* For an SMTPE_EV_AUTH of a passed-through mechanism (mechanism_id SMTPE_SASL_OTHER): queues
 * the challenge "334 <base64 of data>" (data may be empty) instead of a verdict; the client's
 * next line comes back as another SMTPE_EV_AUTH with step + 1 ("*" cancels: the engine answers
 * 501 5.0.0 and the exchange ends without an event). len is at most 1536 octets.
 * Returns 0, SMTPE_ERR_STATE (no such event waits), SMTPE_ERR_INVALID_ARGUMENT or
 * SMTPE_ERR_REPLY_TOO_LONG. RFC 4954 §4. */
SMTPE_API int smtpe_server_auth_challenge(smtpe_server *s, const uint8_t *data, size_t len);

/* Marks the peer as trusted (1) or not (0, the default) for XCLIENT and XFORWARD: only a
 * trusted peer sees them in the EHLO reply and may use them; others get 550 5.7.0. The mark
 * survives XCLIENT. Returns 0 or SMTPE_ERR_INVALID_ARGUMENT. */
SMTPE_API int smtpe_server_set_trusted(smtpe_server *s, int trusted);

/* Queues a final reply (code 421 or 221 or 5xx; NULL enhanced/text as in smtpe_server_reply)
 * and makes the session want to close once output is sent; it consumes no more input. If no
 * octet of output has been handed out by smtpe_server_send_buf yet, the reply replaces the
 * greeting (e.g. 421 4.7.0 at connect when the host is full, 554 for a refused client). Every
 * verdict still owed is dropped, and an event not yet taken with it. The session always keeps
 * 600 octets for this reply (a line of 400 octets of text always fits); a longer text that
 * finds no room behind unsent replies is replaced by the default text of the code, and the
 * session closes all the same.
 * Returns 0, SMTPE_ERR_STATE (already closing), SMTPE_ERR_INVALID_ARGUMENT (bad code, bad
 * characters) or SMTPE_ERR_REPLY_TOO_LONG (text over the limits of smtpe_server_reply); on an
 * error nothing is done. */
SMTPE_API int smtpe_server_close(smtpe_server *s, unsigned code, const char *enhanced,
                                 const char *text);

/* Output: a pointer to queued reply octets and their count in *len (NULL and 0: nothing to
 * send). Stable output: those octets keep their address and content until they are
 * acknowledged with smtpe_server_send_ack, whatever other calls (recv, verdicts, next_event,
 * expiry, close) come in between, so a host may give them to an asynchronous write (libuv,
 * io_uring) and acknowledge when it completes; new replies queue behind them. The output
 * lives in the session's fixed reply ring, so it may be split into two runs: once the octets
 * given are all acknowledged, the next call gives the rest (a host sends until *len is 0).
 * Called again before acknowledging, it gives the same address with a length at least as
 * large (the run may have grown). */
SMTPE_API const uint8_t *smtpe_server_send_buf(smtpe_server *s, size_t *len);

/* Marks the first n octets of smtpe_server_send_buf's output as sent. n MUST NOT exceed the
 * length it gave. Returns 0 or SMTPE_ERR_INVALID_ARGUMENT. */
SMTPE_API int smtpe_server_send_ack(smtpe_server *s, size_t n);

/* What the session wants now, a bitmask. The bits tell the whole truth: a host that takes
 * events while SMTPE_WANT_EVENT is set, sends while SMTPE_WANT_WRITE is set and feeds octets
 * it holds while SMTPE_WANT_READ is set, and otherwise waits (for the socket, its timer or
 * its own verdicts), never misses work. */
#define SMTPE_WANT_READ (1u << 0)  /* smtpe_server_recv would consume octets now: feed what you
                                      hold; read the socket for more unless SMTPE_WANT_TLS */
#define SMTPE_WANT_WRITE (1u << 1) /* output is queued (smtpe_server_send_buf gives octets) */
#define SMTPE_WANT_CLOSE (1u << 2) /* the session is over: close once output is sent */
#define SMTPE_WANT_VERDICT (1u << 3) /* a taken event waits for the host's verdict */
#define SMTPE_WANT_EVENT (1u << 4)   /* an event waits to be taken with next_event */
#define SMTPE_WANT_TLS (1u << 5)     /* STARTTLS accepted: send the output, feed what was
                                        already read (SMTPE_WANT_READ is set with it: those
                                        octets are consumed and discarded), read nothing more
                                        in clear, run the handshake, then call
                                        smtpe_server_tls_started */
SMTPE_API unsigned smtpe_server_want(const smtpe_server *s);

/* The monotonic time in ms at which smtpe_server_handle_expiry must be called, or UINT64_MAX
 * for never: there is no timer while an event waits to be taken or a verdict is owed (time
 * the host spends deciding never counts against the client), while a STARTTLS handshake is
 * pending, or once the session is closing (a host bounds how long it waits for a client to
 * read the final reply). now_ms is the host's monotonic clock: when a verdict was given since
 * the engine last saw the clock, the timeout restarts from now_ms, so a host calls this
 * whenever it arms its timer (after each round of calls) and needs no other step. */
SMTPE_API uint64_t smtpe_server_expiry(smtpe_server *s, uint64_t now_ms);

/* Tells the engine the time is now_ms. If a timeout has expired it queues 421 4.4.2, makes
 * SMTPE_EV_TIMEOUT the next event and wants to close. Returns 1 if it expired, 0 if not.
 * RFC 5321 §4.5.3.2. */
SMTPE_API int smtpe_server_handle_expiry(smtpe_server *s, uint64_t now_ms);

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

/* The layout of smtpe_server_stats in this header (see "Versions and ABI" above). */
#define SMTPE_SERVER_STATS_V1 1
#define SMTPE_SERVER_STATS_VERSION SMTPE_SERVER_STATS_V1

/* Fills *st (laid out as stats_version says) with the session's counters. Does nothing if s
 * or st is NULL or the version is unknown. */
SMTPE_API void smtpe_server_get_stats_versioned(const smtpe_server *s, int stats_version,
                                                smtpe_server_stats *st);
#define smtpe_server_get_stats(s, st)                                                           \
    smtpe_server_get_stats_versioned((s), SMTPE_SERVER_STATS_VERSION, (st))

/* ---------------------------------------------------------------------------------------------
 * Client engine (from release 0.3.0)
 *
 * The mirror image of the server engine: the host connects, feeds the octets it read from the
 * server (smtpe_client_recv), pulls events (smtpe_client_next_event), submits transactions
 * (smtpe_client_submit) and streams their content (smtpe_client_content), and sends what the
 * engine queued (smtpe_client_send_buf / smtpe_client_send_ack). The engine never reads a
 * socket, a clock or a TLS library, and allocates memory only when the session is created.
 *
 * Its promises, whatever the server sends: a reply is matched only to a command that was sent
 * (a reply with no command outstanding is a protocol error); nothing it sends can end DATA
 * early or read as a command (every line-start dot doubled, no bare CR or LF on the wire);
 * octets received after a STARTTLS 220 and before the handshake never count; no credential
 * octet leaves in clear unless the host allows it; each recipient gets exactly one outcome.
 *
 * RFC 5321 (SMTP) with RFC 2920 (PIPELINING), RFC 1870 (SIZE), RFC 6152 (8BITMIME), RFC 3030
 * (CHUNKING, BINARYMIME), RFC 6531 (SMTPUTF8), RFC 3207 (STARTTLS), RFC 4954 (AUTH: PLAIN
 * RFC 4616, LOGIN, XOAUTH2, OAUTHBEARER RFC 7628, others through the host), RFC 2034 / 3463
 * (enhanced status codes), RFC 3461 (DSN), RFC 8689 (REQUIRETLS), RFC 6710 (MT-PRIORITY),
 * RFC 2852 (DELIVERBY), RFC 2033 (LMTP), the PROXY protocol, Postfix's XCLIENT and XFORWARD.
 * ------------------------------------------------------------------------------------------- */

/* When to use TLS (RFC 3207, RFC 8314). */
typedef enum smtpe_tls_policy {
    SMTPE_TLS_NONE = 0,          /* never STARTTLS */
    SMTPE_TLS_OPPORTUNISTIC = 1, /* STARTTLS when offered; in clear if not offered or refused */
    SMTPE_TLS_REQUIRED = 2,      /* STARTTLS, or the session ends (recipients temporary) before
                                    any AUTH, MAIL or credential octet */
    SMTPE_TLS_IMPLICIT = 3       /* TLS from connect (port 465): the host runs the handshake
                                    first and calls smtpe_client_tls_started before feeding */
} smtpe_tls_policy;

/* SASL mechanisms the client engine runs itself (also ev.auth.mechanism_id's values above). */
#define SMTPE_SASL_XOAUTH2 3     /* Google's and Microsoft's XOAUTH2 */
#define SMTPE_SASL_OAUTHBEARER 4 /* RFC 7628 */

typedef struct smtpe_client_config {
    /* The EHLO/LHLO (or HELO) argument: a domain or an address-literal ("[192.0.2.1]"),
     * NUL-terminated, at most 255 octets, ASCII (an internationalised name as its A-label:
     * the EHLO goes before the server says whether it has SMTPUTF8), checked like a mailbox's
     * domain. Default "localhost". */
    const char *helo_name;
    /* Speak LMTP (RFC 2033): LHLO, no HELO fallback, and after the content one reply per
     * accepted recipient. Default 0. */
    int lmtp;
    /* STARTTLS policy. Default SMTPE_TLS_NONE (a host that has TLS says so). */
    smtpe_tls_policy tls;
    /* AUTH (RFC 4954). auth_mechanism: NULL for no AUTH (the default), "" for the best the
     * server offers that the credentials allow (OAUTHBEARER, XOAUTH2 with a token; PLAIN,
     * LOGIN with a password), or a mechanism name, which the server must offer; a name other
     * than PLAIN, LOGIN, XOAUTH2, OAUTHBEARER is run step by step through the host
     * (SMTPE_CEV_AUTH_STEP). There is no fallback to another mechanism after a failure: a
     * refused AUTH ends the session (SMTPE_CLOSE_AUTH_FAILED) with the recipients temporary,
     * carrying the server's code (credentials can be fixed; the mail is deferred, not
     * bounced). All strings NUL-terminated, at most 255 octets (tokens 8192), no control
     * octet (else SMTPE_ERR_INVALID_ARGUMENT at creation). */
    const char *auth_mechanism;
    const char *auth_authzid;  /* PLAIN's authorization identity; NULL or "" for none */
    const char *auth_user;     /* authentication identity (PLAIN, LOGIN, XOAUTH2, OAUTHBEARER) */
    const char *auth_password; /* PLAIN, LOGIN */
    const char *auth_token;    /* XOAUTH2, OAUTHBEARER: the OAuth 2.0 bearer token */
    /* Allow AUTH without TLS. Default 0: with AUTH wanted and TLS not up, the session ends
     * before any credential octet (recipients temporary). */
    int auth_plaintext_ok;
    /* Use BDAT (RFC 3030) when the server offers CHUNKING. Default 1. chunk_size is the most
     * wire octets one BDAT carries (the engine sends smaller chunks when the host's pieces
     * or the output buffer room are smaller; at least 4, as one content octet may need 4
     * wire octets): 1..output_buffer_size - 64. Default 0: as large as the output buffer
     * allows. */
    int chunking;
    size_t chunk_size;
    /* Bare CR and bare LF in submitted content (not BODY=BINARYMIME): SMTPE_LINE_ENDING_NORMALISE
     * (the default) sends each as CRLF; SMTPE_LINE_ENDING_REFUSE refuses the message (see
     * smtpe_client_txn.content). KEEP is not allowed: no bare CR or LF ever reaches the wire. */
    smtpe_line_ending_policy line_ending;
    /* Send a PROXY protocol header (version proxy->version, 1 or 2) before anything else: it
     * is queued when the session is created (so proxy and its TLVs need live only until
     * then). A host using SMTPE_TLS_IMPLICIT sends it before its handshake. NULL (the
     * default): none. */
    const smtpe_proxy_info *proxy;
    /* XCLIENT attributes (Postfix XCLIENT_README: NAME, ADDR, PORT, PROTO, HELO, LOGIN,
     * DESTADDR, DESTPORT), sent after the EHLO (and TLS, before AUTH) when the server offers
     * XCLIENT; only attributes it lists are sent, xtext-encoded, in lines of at most 512
     * octets; a new EHLO follows its 220. Values must outlive the session. Default none. */
    const smtpe_param *xclient;
    size_t xclient_count;
    /* Longest reply line in octets, CRLF included (RFC 5321 §4.5.3.1.5 says 512; real servers
     * send longer): a longer one is a protocol error. Range 512..65536. Default 2048. */
    size_t max_reply_line;
    /* Most octets of one reply, all lines: a longer (or endless) reply is a protocol error.
     * Range max_reply_line..1048576. Default 65536. */
    size_t max_reply_size;
    /* Size of the output buffer in octets; content is encoded into it as the host gives it
     * (back-pressure: smtpe_client_content consumes only what fits). Range 4096..16777216.
     * Default 16384. */
    size_t output_buffer_size;
    /* Use PIPELINING (RFC 2920) when the server offers it. Default 1; 0 sends one command per
     * reply whatever the server offers. */
    int pipelining;
    /* PIPELINING (RFC 2920): most command octets sent and not yet answered; the engine waits
     * for replies before queueing more, so that a server that answers each command as it
     * reads cannot fill both directions at once. Range 512..1048576. Default 4096. */
    size_t max_unanswered;
    /* Most recipients of one transaction. Range 1..100000. Default 1000. */
    unsigned max_recipients;
    /* Timeouts in ms (RFC 5321 §4.5.3.2); 0 means none. greeting, MAIL, RCPT and any other
     * command 5 min each; DATA (its 354) 2 min; data block: the host's content and the sending
     * of the output must make progress within 3 min; the reply to the end of the content
     * 10 min. A timeout ends the session (recipients temporary, or unknown after the end of
     * the content was sent). */
    uint64_t greeting_timeout_ms;
    uint64_t command_timeout_ms; /* MAIL, RCPT, EHLO, STARTTLS, AUTH, RSET, QUIT, ... */
    uint64_t data_timeout_ms;
    uint64_t data_block_timeout_ms;
    uint64_t data_end_timeout_ms;
} smtpe_client_config;

/* The layout of smtpe_client_config in this header (see "Versions and ABI" above). */
#define SMTPE_CLIENT_CONFIG_V1 1
#define SMTPE_CLIENT_CONFIG_VERSION SMTPE_CLIENT_CONFIG_V1

/* Fills cfg (laid out as config_version says) with the defaults documented above. Does
 * nothing if cfg is NULL or the version is unknown. */
SMTPE_API void smtpe_client_config_init_versioned(int config_version, smtpe_client_config *cfg);
#define smtpe_client_config_init(cfg)                                                           \
    smtpe_client_config_init_versioned(SMTPE_CLIENT_CONFIG_VERSION, (cfg))

/* What is known of the content before it is sent (smtpe_content_scan), a bitmask. */
#define SMTPE_CONTENT_8BIT (1u << 0)      /* an octet above 127 */
#define SMTPE_CONTENT_NUL (1u << 1)       /* a NUL octet */
#define SMTPE_CONTENT_BARE_CR (1u << 2)   /* a CR not followed by LF */
#define SMTPE_CONTENT_BARE_LF (1u << 3)   /* an LF not preceded by CR */
#define SMTPE_CONTENT_LONG_LINE (1u << 4) /* a line over 998 octets (RFC 5322 §2.1.1) */

/* A scan of content that the host makes before submitting (the engine scans again as the
 * content streams: see smtpe_client_txn.content). Fields are read-only results but for
 * state, which is the scanner's. Frozen struct. */
typedef struct smtpe_content_info {
    uint64_t size;      /* octets as submitted */
    uint64_t wire_size; /* octets on the wire under NORMALISE before dot-stuffing, with the
                           final CRLF added if missing: the SIZE= value (RFC 1870 §3) */
    unsigned flags;     /* SMTPE_CONTENT_* */
    uint32_t line_len;  /* scanner state */
    int state;
} smtpe_content_info;

/* Starts a scan. A NULL info is ignored (by all three). */
SMTPE_API void smtpe_content_scan_init(smtpe_content_info *info);
/* Scans the next n octets of the content (any split gives the same result). Lines are those of
 * the wire under NORMALISE: a bare CR or bare LF ends one too. */
SMTPE_API void smtpe_content_scan(smtpe_content_info *info, const uint8_t *p, size_t n);
/* Ends the scan (a trailing CR is bare; the missing final CRLF is counted in wire_size). */
SMTPE_API void smtpe_content_scan_end(smtpe_content_info *info);

/* One forward-path of a transaction. Strings NUL-terminated, no control octet. */
typedef struct smtpe_client_rcpt {
    const char *forward_path; /* the mailbox without angle brackets ("user@example.com"), or
                                 "postmaster"; non-ASCII UTF-8 needs SMTPUTF8 (RFC 6531) */
    unsigned notify;          /* SMTPE_NOTIFY_* for NOTIFY= (RFC 3461 §4.1), 0 for none */
    const char *orcpt;        /* ORCPT= as "type;address" ("rfc822;a+b@example.com"), the
                                 address decoded: the engine xtext-encodes it (RFC 3461 §4.2);
                                 NULL for none */
} smtpe_client_rcpt;

/* A mail transaction (RFC 5321 §3.3). The struct, its recipients and every string they point
 * to must stay valid and unchanged until the transaction's SMTPE_CEV_TRANSACTION_DONE event is
 * taken (the engine reads them as it sends). */
typedef struct smtpe_client_txn {
    const char *reverse_path;        /* mailbox without brackets; "" for the null path <> */
    const smtpe_client_rcpt *rcpts;  /* forward-paths, in order, 1..max_recipients */
    size_t rcpt_count;
    /* The content as the host's scan found it (smtpe_content_scan); has_content_info 0 when
     * the host did not scan (then the engine learns the content only as it streams: a
     * property that needs refusing is found mid-content and ends the session as
     * smtpe_client_abort_content does, but with the recipients permanent, code 0). With it,
     * the refusals are made before MAIL (outcome permanent, local): 8-bit content unless
     * body is 8BITMIME or BINARYMIME (and offered; with BODY unspecified, 8-bit content is
     * sent as 8BITMIME when offered); NUL, or a bare CR or LF under REFUSE, unless
     * BINARYMIME; a line over 998 octets when the content would go by DATA (BDAT carries
     * long lines); wire_size over the server's SIZE (sent as SIZE= when SIZE is offered). */
    int has_content_info;
    smtpe_content_info content;
    smtpe_body_type body;            /* BODY= (RFC 6152, RFC 3030); UNSPECIFIED sends none */
    int smtputf8;                    /* SMTPUTF8 (RFC 6531); set by the engine when an address
                                        is not ASCII; refused locally if not offered */
    smtpe_dsn_ret ret;               /* RET= (RFC 3461 §4.3) */
    const char *envid;               /* ENVID= decoded, xtext-encoded by the engine; NULL none */
    int requiretls;                  /* REQUIRETLS (RFC 8689): refused locally without TLS or
                                        without the extension */
    int has_mt_priority;             /* MT-PRIORITY=mt_priority, -9..9 (RFC 6710) */
    int mt_priority;
    int64_t by_time;                 /* BY=by_time;by_mode (RFC 2852) when by_mode is 'R' or */
    char by_mode;                    /* 'N'; 0 for none */
    const smtpe_param *xforward;     /* XFORWARD attributes sent before MAIL when offered */
    size_t xforward_count;
} smtpe_client_txn;

/* The layout of smtpe_client_txn and smtpe_client_rcpt in this header. */
#define SMTPE_CLIENT_TXN_V1 1
#define SMTPE_CLIENT_TXN_VERSION SMTPE_CLIENT_TXN_V1

/* A recipient's outcome (ev.outcome.outcome). */
#define SMTPE_OUTCOME_DELIVERED 1 /* the server took responsibility (2xx) */
#define SMTPE_OUTCOME_PERMANENT 2 /* 5xx, or refused locally */
#define SMTPE_OUTCOME_TEMPORARY 3 /* 4xx, a lost connection, a timeout before the end of the
                                     content, a local transient failure */
#define SMTPE_OUTCOME_UNKNOWN 4   /* the end of the content was sent but no verdict came: the
                                     server may have delivered (RFC 5321 §4.5.3.2.6; a host
                                     avoids sending the message twice) */

/* Why the session ended (ev.closed.reason). */
#define SMTPE_CLOSE_QUIT 0            /* QUIT answered (or the server closed after it): clean */
#define SMTPE_CLOSE_SERVER_421 1      /* the server said 421 (or 554 at the greeting) */
#define SMTPE_CLOSE_PROTOCOL_ERROR 2  /* a reply that breaks the protocol (ev.closed.text) */
#define SMTPE_CLOSE_LOST 3            /* the connection was lost (smtpe_client_lost) */
#define SMTPE_CLOSE_TIMEOUT 4         /* a timeout expired */
#define SMTPE_CLOSE_TLS_REQUIRED 5    /* TLS required but not offered or refused */
#define SMTPE_CLOSE_AUTH_FAILED 6     /* AUTH wanted but impossible or refused */
#define SMTPE_CLOSE_ABORTED 7         /* the host aborted content (or it had to be refused
                                         mid-stream), or called smtpe_client_close */
#define SMTPE_CLOSE_REFUSED 8         /* the greeting or EHLO/HELO was refused */

typedef enum smtpe_client_event_type {
    SMTPE_CEV_NONE = 0,
    /* The session is ready for mail (greeting, EHLO, STARTTLS and AUTH done): ev.ready. */
    SMTPE_CEV_READY,
    /* STARTTLS was answered 220: the host sends the queued output (none is), feeds any octets
     * it has already read beyond the 220 (SMTPE_WANT_READ stays set: each one is a protocol
     * error, the response injection of CVE-2021-22947, and the session ends), reads nothing
     * more in clear, runs the TLS handshake, then calls smtpe_client_tls_started (or
     * smtpe_client_lost if it failed). */
    SMTPE_CEV_STARTTLS,
    /* A step of a host-run SASL mechanism (ev.auth_step): answer with
     * smtpe_client_auth_response. */
    SMTPE_CEV_AUTH_STEP,
    /* The content of the current transaction may be given now (smtpe_client_content); then
     * SMTPE_WANT_CONTENT says when more fits. Once per transaction. */
    SMTPE_CEV_CONTENT,
    /* One recipient's outcome, final (ev.outcome). Exactly one per recipient. */
    SMTPE_CEV_OUTCOME,
    /* The transaction is over, every recipient has had its outcome (ev.done); its struct may
     * be freed; another may be submitted. */
    SMTPE_CEV_TRANSACTION_DONE,
    /* The session is over (ev.closed): close the connection once the output is sent. */
    SMTPE_CEV_CLOSED
} smtpe_client_event_type;

/* The server's capabilities from the EHLO reply's lines 2..n (RFC 5321 §4.1.1.1), keywords
 * compared without regard to case; after STARTTLS or XCLIENT only the new EHLO's count.
 * Spans point into session memory, valid until the next EHLO (or the session is freed). */
typedef struct smtpe_client_caps {
    unsigned extensions;  /* SMTPE_EXT_* of the server config's bitmask, as offered */
    int esmtp;            /* 0 after a HELO fallback: no extension at all */
    uint64_t size_limit;  /* SIZE's value; 0 when SIZE has none or is 0 (no fixed limit) */
    int64_t deliverby_min; /* DELIVERBY's minimum seconds, 0 when none given */
    smtpe_span auth;      /* the AUTH line's mechanisms ("PLAIN LOGIN"), empty when none */
    smtpe_span xclient;   /* the XCLIENT line's attribute names, empty when none */
    smtpe_span xforward;  /* the XFORWARD line's attribute names, empty when none */
    int tls;              /* TLS is up */
    int authenticated;    /* AUTH succeeded */
} smtpe_client_caps;

typedef struct smtpe_client_outcome {
    size_t index;         /* the recipient's index in smtpe_client_txn.rcpts */
    int outcome;          /* SMTPE_OUTCOME_* */
    unsigned code;        /* the reply code, 0 when decided locally or the connection ended */
    smtpe_span enhanced;  /* the enhanced status code ("5.1.1") when the server gave one that
                             fits the code's class (RFC 3463), else empty; for local outcomes
                             the engine's own */
    smtpe_span text;      /* the reply's text (its last line, after the enhanced code), or a
                             description of the local reason */
    int local;            /* decided by the client without a reply (refused before MAIL,
                             connection lost, timeout, protocol error) */
    int before_mail;      /* refused locally before MAIL was sent */
} smtpe_client_outcome;

/* The fields of ev.auth_step: step 0 asks for the initial response (RFC 4954 §4; the host may
 * give none); step 1, 2, ... carry the server's 334 challenge, base64-decoded (session memory,
 * valid until the response). */
typedef struct smtpe_client_auth_step {
    unsigned step;
    smtpe_span challenge;
} smtpe_client_auth_step;

/* The fields of ev.done: the transaction, the counts of its outcomes, and whether the
 * connection may carry another transaction (0 once the session is ending). */
typedef struct smtpe_client_done {
    const smtpe_client_txn *txn;
    size_t delivered, permanent, temporary, unknown;
    int reusable;
} smtpe_client_done;

/* The fields of ev.closed: SMTPE_CLOSE_*, with the server's reply code and text (last line)
 * when a reply caused it (421, a refused greeting) or a description of the protocol error
 * (code 0). The span is valid until the next call on the session. */
typedef struct smtpe_client_closed {
    int reason;
    unsigned code;
    smtpe_span text;
} smtpe_client_closed;

typedef struct smtpe_client_event {
    smtpe_client_event_type type;
    union {
        smtpe_client_caps ready;
        smtpe_client_auth_step auth_step;
        /* OUTCOME. Spans in session memory or static, valid until the next call on the
         * session. */
        smtpe_client_outcome outcome;
        smtpe_client_done done;
        smtpe_client_closed closed;
    };
} smtpe_client_event;

/* The layout of smtpe_client_event in this header. */
#define SMTPE_CLIENT_EVENT_V1 1
#define SMTPE_CLIENT_EVENT_VERSION SMTPE_CLIENT_EVENT_V1

typedef struct smtpe_client smtpe_client;

/* Octets of memory one client session needs for cfg, a fixed size: S + max_reply_line +
 * output_buffer_size (rounded up to max_align_t) + 12 * (max_unanswered / 6 + 8) +
 * 2 * ceil(max_recipients / 8), rounded up to max_align_t, with S the session struct (about
 * 4 KiB with its copy of the config, the capability lines, the event queue and the spans of
 * smtpe_client_content_ref): the reply line buffer, the output ring, the queue of commands
 * awaiting replies and two bits per recipient. With the defaults (on LP64): 30800
 * octets. Returns 0 if cfg is invalid or its version unknown. */
SMTPE_API size_t smtpe_client_memory_size_versioned(int config_version,
                                                    const smtpe_client_config *cfg);
#define smtpe_client_memory_size(cfg)                                                           \
    smtpe_client_memory_size_versioned(SMTPE_CLIENT_CONFIG_VERSION, (cfg))

/* Creates a client session with one allocation (NULL alloc: malloc) for a connection the host
 * has just opened (for SMTPE_TLS_IMPLICIT: whose handshake the host runs before feeding). The
 * config is copied; its strings must outlive the session. Queues the PROXY header if one is
 * configured; then waits for the greeting (greeting_timeout_ms from now_ms).
 * Returns 0, SMTPE_ERR_INVALID_ARGUMENT (a NULL, an unknown version, a bad string: CR, LF,
 * NUL or a malformed helo_name), SMTPE_ERR_CONFIG (a limit out of range, or credentials too
 * long for the output buffer) or SMTPE_ERR_NOMEM. */
SMTPE_API int smtpe_client_new_versioned(smtpe_client **out, int config_version,
                                         const smtpe_client_config *cfg,
                                         const smtpe_allocator *alloc, uint64_t now_ms);
#define smtpe_client_new(out, cfg, alloc, now_ms)                                               \
    smtpe_client_new_versioned((out), SMTPE_CLIENT_CONFIG_VERSION, (cfg), (alloc), (now_ms))

/* Like smtpe_client_new in caller memory (aligned for max_align_t, at least
 * smtpe_client_memory_size octets); smtpe_client_free must not be called. Returns what
 * smtpe_client_new does, SMTPE_ERR_BUFFER_TOO_SMALL for too little memory. */
SMTPE_API int smtpe_client_init_versioned(smtpe_client **out, void *mem, size_t len,
                                          int config_version, const smtpe_client_config *cfg,
                                          uint64_t now_ms);
#define smtpe_client_init(out, mem, len, cfg, now_ms)                                           \
    smtpe_client_init_versioned((out), (mem), (len), SMTPE_CLIENT_CONFIG_VERSION, (cfg),       \
                                (now_ms))

/* Frees a session made by smtpe_client_new. NULL is allowed. */
SMTPE_API void smtpe_client_free(smtpe_client *c);

/* Submits a transaction, at any time before QUIT (even before the greeting); one at a time:
 * the next only after this one's TRANSACTION_DONE. Every string is checked now (the paths by
 * RFC 5321 §4.1.2's grammar, no CR, LF or NUL anywhere, each command line within the limits),
 * so a bad one is an error before any octet exists. Returns 0, SMTPE_ERR_INVALID_ARGUMENT
 * (with nothing queued) or SMTPE_ERR_STATE (a transaction is under way, QUIT was asked for,
 * or the session is over). RFC 5321 §3.3, §4.1.1.2-3. */
SMTPE_API int smtpe_client_submit_versioned(smtpe_client *c, int txn_version,
                                            const smtpe_client_txn *txn);
#define smtpe_client_submit(c, txn)                                                             \
    smtpe_client_submit_versioned((c), SMTPE_CLIENT_TXN_VERSION, (txn))

/* Gives the next n octets of the current transaction's content (after SMTPE_CEV_CONTENT);
 * last = 1 with the final piece (n may be 0; an empty final piece given while a BDAT chunk's
 * reply is owed is kept and goes after it). The engine encodes what fits in its output
 * buffer (dot-stuffing RFC 5321 §4.5.2, line ends as cfg.line_ending says, BDAT framing
 * RFC 3030) and returns the octets it consumed; the host gives the rest again once
 * SMTPE_WANT_CONTENT is set. The final CRLF is added only if the content lacks one (not for
 * BINARYMIME). last counts only when all n octets were consumed.
 * Returns the octets consumed, or SMTPE_ERR_STATE (no content is wanted now) or
 * SMTPE_ERR_INVALID_ARGUMENT. */
SMTPE_API smtpe_ssize smtpe_client_content(smtpe_client *c, const uint8_t *p, size_t n,
                                           int last);

/* As smtpe_client_content, but under DATA the engine may point into p[0..n) instead of
 * copying it (from 0.4.0): the octets that go out as they are (text between line-start dots,
 * a doubled dot being its octet given twice) become spans of p in the output, and only the
 * rest (line ends it normalises, the end of data, and everything once EXT_MAX, 32, spans are
 * in use) is copied into the output ring. So the host keeps p[0..n) valid and unchanged
 * until smtpe_client_content_held returns 0: its spans all acknowledged, or dropped
 * (smtpe_client_lost drops them all; any other end of the session keeps those already handed
 * out until they are acknowledged), or the session freed. A write the host still has in
 * flight reads its own pieces whatever the engine holds: the host keeps those until the
 * write completes, as for any output. Under BDAT it copies, as smtpe_client_content does.
 * Same returns. */
SMTPE_API smtpe_ssize smtpe_client_content_ref(smtpe_client *c, const uint8_t *p, size_t n,
                                               int last);

/* Octets of content given by smtpe_client_content_ref that the output still points to (not
 * yet acknowledged, nor dropped): 0 when the host may free or reuse them (once its own writes
 * in flight have completed). 0 for NULL. */
SMTPE_API size_t smtpe_client_content_held(const smtpe_client *c);

/* The content's source failed: the engine never sends the end of the content (neither the
 * final dot nor a BDAT LAST), every recipient not yet decided becomes temporary (local),
 * and the session ends (SMTPE_CLOSE_ABORTED): the host drops the connection. Returns 0 or
 * SMTPE_ERR_STATE (no content under way). */
SMTPE_API int smtpe_client_abort_content(smtpe_client *c);

/* Answers SMTPE_CEV_AUTH_STEP: data[0..len) is the response (the engine base64-encodes it);
 * data NULL at step 0 means no initial response, and at a later step cancels the exchange
 * ("*", RFC 4954 §4). While a step waits, smtpe_client_want says SMTPE_WANT_VERDICT. An
 * initial response that would make the AUTH line longer than 512 octets is not put on it
 * (RFC 4954 §4): the AUTH goes alone and step 1 (the server's, usually empty, challenge) asks
 * for it again. Returns 0, SMTPE_ERR_STATE (no step waits) or SMTPE_ERR_INVALID_ARGUMENT (over
 * 8192 octets, or over what the output buffer holds: its base64 must fit in
 * output_buffer_size - 50 octets). */
SMTPE_API int smtpe_client_auth_response(smtpe_client *c, const uint8_t *data, size_t len);

/* After SMTPE_CEV_STARTTLS (or, for SMTPE_TLS_IMPLICIT, before the first smtpe_client_recv):
 * TLS is up. The session starts over with EHLO (RFC 3207 §4.2). Returns 0 or SMTPE_ERR_STATE. */
SMTPE_API int smtpe_client_tls_started(smtpe_client *c, uint64_t now_ms);

/* Asks for QUIT once the current transaction (if any) is done; the session then ends with
 * SMTPE_CEV_CLOSED after the 221. Returns 0 or SMTPE_ERR_STATE (already ending). */
SMTPE_API int smtpe_client_quit(smtpe_client *c);

/* The connection is gone (EOF, a reset, a failed TLS handshake). Every recipient not yet
 * decided becomes temporary, or unknown if the end of its content was sent (acknowledged by
 * smtpe_client_send_ack); then SMTPE_CEV_CLOSED (SMTPE_CLOSE_LOST, or SMTPE_CLOSE_QUIT after
 * QUIT was sent). Output not yet acknowledged is dropped: smtpe_client_send_buf gives nothing
 * more, so an end of content reported temporary never reaches a server that closed its side
 * but still reads. Returns 0 or SMTPE_ERR_STATE (already over). */
SMTPE_API int smtpe_client_lost(smtpe_client *c);

/* Feeds n octets read from the server. Returns the octets consumed (the engine stops while
 * an event waits to be taken, so the host feeds the rest after taking it), or
 * SMTPE_ERR_INVALID_ARGUMENT, or SMTPE_ERR_STATE (SMTPE_TLS_IMPLICIT before
 * smtpe_client_tls_started). A host feeds everything it has read before it sends the output
 * queued meanwhile: a reply that came before a command was written then reaches the engine
 * first, and is judged unsolicited rather than taken for that command's reply. A reply that
 * breaks the protocol ends the session (SMTPE_CLOSE_PROTOCOL_ERROR): malformed (code not
 * 2-5/0-5/0-9 or not followed by SP, "-" or CRLF; lines that disagree on the code; a line
 * over max_reply_line; a reply over max_reply_size; a bare CR or LF), unsolicited (no
 * command outstanding, or its command not yet handed to the host, when the reply's first
 * octet arrived: a reply begun before the end of the content went out answers nothing of
 * it, however late its CRLF), a 3xx to anything
 * but DATA or AUTH, octets after a STARTTLS 220 (RFC 3207 §4.2; CVE-2021-22947). RFC 5321
 * §4.2, §4.3.2; RFC 2920 §3.1. */
SMTPE_API smtpe_ssize smtpe_client_recv(smtpe_client *c, const uint8_t *buf, size_t n,
                                        uint64_t now_ms);

/* Takes the next event into *ev (laid out as event_version says). Returns 1 or 0 (none). */
SMTPE_API int smtpe_client_next_event_versioned(smtpe_client *c, int event_version,
                                                smtpe_client_event *ev);
#define smtpe_client_next_event(c, ev)                                                          \
    smtpe_client_next_event_versioned((c), SMTPE_CLIENT_EVENT_VERSION, (ev))

/* Output, as smtpe_server_send_buf / smtpe_server_send_ack: stable until acknowledged, in
 * pieces (the output ring's runs, and the spans of smtpe_client_content_ref between them);
 * smtpe_client_send_buf gives the next one (len 0: none). */
SMTPE_API const uint8_t *smtpe_client_send_buf(smtpe_client *c, size_t *len);
/* The output not yet acknowledged as up to max pieces into iov[0..max), in order, for one
 * writev(2) or sendmsg(2) (from 0.4.0). Returns the pieces given (0 for none, or for c NULL
 * or iov NULL with max > 0). What it gives counts as handed out, as by smtpe_client_send_buf. */
SMTPE_API size_t smtpe_client_send_iov(smtpe_client *c, smtpe_span *iov, size_t max);
/* n octets written: at most those handed out by smtpe_client_send_buf / smtpe_client_send_iov
 * and not yet acknowledged (else SMTPE_ERR_INVALID_ARGUMENT). Returns 0. */
SMTPE_API int smtpe_client_send_ack(smtpe_client *c, size_t n);

/* What the client session wants, a bitmask of SMTPE_WANT_READ, _WRITE, _CLOSE, _EVENT, _TLS
 * (run the handshake now) and: */
#define SMTPE_WANT_CONTENT (1u << 6) /* smtpe_client_content would consume octets now */
SMTPE_API unsigned smtpe_client_want(const smtpe_client *c);

/* As smtpe_server_expiry / smtpe_server_handle_expiry: the deadline (UINT64_MAX for none; no
 * timer while an event waits to be taken or the host owes an answer), and its expiry (1 if it
 * expired: the session ends with SMTPE_CLOSE_TIMEOUT). RFC 5321 §4.5.3.2. */
SMTPE_API uint64_t smtpe_client_expiry(smtpe_client *c, uint64_t now_ms);
SMTPE_API int smtpe_client_handle_expiry(smtpe_client *c, uint64_t now_ms);

/* The capabilities as last parsed (all zero before the EHLO reply). Valid until the next
 * call on the session. */
SMTPE_API const smtpe_client_caps *smtpe_client_get_caps(const smtpe_client *c);

#ifdef __cplusplus
}
#endif
#endif /* SMTPE_H */
