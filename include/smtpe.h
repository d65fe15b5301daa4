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
 * RFC 2034/3463/5248 (enhanced status codes) and RFC 6531 (SMTPUTF8).
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
#define SMTPE_EXT_DEFAULT                                                                       \
    (SMTPE_EXT_PIPELINING | SMTPE_EXT_SIZE | SMTPE_EXT_8BITMIME | SMTPE_EXT_SMTPUTF8 |           \
     SMTPE_EXT_ENHANCEDSTATUSCODES)

/* What to do with a bare LF, a bare CR (one not part of CRLF) or a NUL octet, in command lines
 * and in message content alike (RFC 5321 §2.3.8, §4.1.1.4). Whatever the policy, only the five
 * octets CR LF . CR LF end DATA (SMTP smuggling). */
typedef enum smtpe_line_ending_policy {
    /* Default. A command line holding one is answered 500 5.5.2 and not executed (the line still
     * ends only at CRLF). Message content holding one is read to its end and then refused with
     * 550 5.6.0; the DATA_END event says why and no further DATA_CHUNK events are given. */
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
    /* Protocol errors (500/501/502/503/504/555 replies) allowed per session; the next one is
     * answered 421 4.7.0 and the session closes. 0 means no limit. Default 20. */
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
    SMTPE_EV_TIMEOUT,    /* A timeout expired; the engine queued 421 4.4.2 and wants to close.
                            Any unfinished message is abandoned. No verdict. */
    SMTPE_EV_ERROR_LIMIT /* max_errors exceeded; 421 4.7.0 queued, wants close. No verdict. */
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
    SMTPE_BODY_7BIT,    /* BODY=7BIT */
    SMTPE_BODY_8BITMIME /* BODY=8BITMIME (RFC 6152) */
} smtpe_body_type;

/* ev.data_end.status: why the content ended. Only SMTPE_DATA_OK needs a verdict; for the others
 * the engine has already queued its reply, and the host must discard what it stored. */
#define SMTPE_DATA_OK 0
#define SMTPE_DATA_TOO_BIG 1         /* over max_message_size: 552 5.3.4 queued */
#define SMTPE_DATA_BAD_LINE_ENDING 2 /* bare CR/LF/NUL under REFUSE: 550 5.6.0 queued */
/* ev.data_end.flags */
#define SMTPE_DATA_NORMALISED (1u << 0) /* a bare CR/LF or NUL was normalised */
#define SMTPE_DATA_HAS_8BIT (1u << 1)   /* an octet above 127 was seen */

typedef struct smtpe_event {
    smtpe_event_type type;
    union {
        struct {
            smtpe_span domain; /* the argument as sent; engine line buffer, valid until verdict */
            int esmtp;         /* 1 for EHLO, 0 for HELO */
        } helo;
        struct {
            smtpe_path reverse_path;
            uint64_t size;        /* SIZE= value (RFC 1870) when has_size */
            int has_size;
            smtpe_body_type body; /* BODY= (RFC 6152) */
            int smtputf8;         /* SMTPUTF8 given (RFC 6531) */
            size_t param_count;
            smtpe_param params[SMTPE_MAX_PARAMS]; /* every parameter as sent, in order */
        } mail;
        struct {
            smtpe_path forward_path;
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
        } data_end;
        /* VRFY, EXPN, UNKNOWN: verb and the argument text after one space (may be empty).
         * Engine line buffer, valid until the verdict. */
        struct {
            smtpe_span verb;
            smtpe_span argument;
        } command;
    };
} smtpe_event;

/* Returns 1 if an event of this kind waits for smtpe_server_reply or smtpe_server_accept. */
SMTPE_EXTERN int smtpe_event_needs_reply(const smtpe_event *ev);

/* ---------------------------------------------------------------------------------------------
 * Server session
 * ------------------------------------------------------------------------------------------- */
typedef struct smtpe_server smtpe_server;

/* Octets of memory one session needs for cfg: a fixed size, never growing. It is
 *   S + (max_line_length - 2) + max(reply_buffer_size, R + 600)
 * where S is the session struct (under 1 KiB, rounded to max_align_t), 600 octets are kept for a
 * final 421/221 line, and R = max(2560, the EHLO reply's bound 646 (a first line of up to 400
 * octets and the built-in extensions) + sum(6 + strlen(ehlo_extra[i]))) is the room one reply
 * may need. With the defaults: about
 * 1 KiB + 510 + 4096 octets. Returns 0 if cfg is invalid. */
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
 * lines, each at most 400 octets, all at most 2048). The reply goes out in order after earlier replies. Meaning:
 * HELO 2xx opens the session (and resets any transaction); MAIL 2xx starts a transaction; RCPT
 * 2xx adds a recipient; DATA takes 354 (content follows) or 4xx/5xx; DATA_END any code ends the
 * transaction. A 421 from the host closes the session after it is sent.
 * Returns 0, SMTPE_ERR_STATE (no event waits), SMTPE_ERR_INVALID_ARGUMENT (bad code for the
 * event, bad characters) or SMTPE_ERR_REPLY_TOO_LONG. RFC 5321 §4.2, RFC 3463. */
SMTPE_EXTERN int smtpe_server_reply(smtpe_server *s, unsigned code, const char *enhanced,
                                    const char *text);

/* Gives the default positive verdict for the waiting event: EHLO 250 with the extensions,
 * HELO 250, MAIL 250 2.1.0, RCPT 250 2.1.5, DATA 354, DATA_END 250 2.0.0, VRFY/EXPN 252 2.5.0,
 * UNKNOWN 500 5.5.1. Returns 0 or SMTPE_ERR_STATE. */
SMTPE_EXTERN int smtpe_server_accept(smtpe_server *s);

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
} smtpe_server_stats;
SMTPE_EXTERN void smtpe_server_get_stats(const smtpe_server *s, smtpe_server_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* SMTPE_H */
