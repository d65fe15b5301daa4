/*
 * client_harness.h - a scripted host for the client engine, shared by test_client and the
 * client transcript runner: it plays the server's octets into a session (whole, one octet at
 * a time, or in pseudo-random splits), takes every event into a readable log, writes the
 * content it was given when the engine wants it, answers STARTTLS at once (no real TLS) and
 * AUTH steps from a script, and collects everything the client sent.
 */
#ifndef SMTPE_CLIENT_HARNESS_H
#define SMTPE_CLIENT_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "smtpe.h"

/* How server octets are split when fed. */
#define CH_WHOLE 0  /* each ch_server() text in one call */
#define CH_OCTET 1  /* one octet per call */
#define CH_RANDOM 2 /* pseudo-random splits from seed */

typedef struct ch_buf {
    char *p;
    size_t len, cap;
} ch_buf;

typedef struct ch {
    smtpe_client *c;
    smtpe_client_config cfg;
    smtpe_client_txn txn;
    smtpe_client_rcpt rcpts[64];
    const uint8_t *content; /* what the host gives on CONTENT */
    size_t content_len, content_at;
    size_t piece;           /* content piece size (0: all at once) */
    int abort_content;      /* abort instead of giving content */
    const char *auth_steps[8]; /* responses for AUTH_STEP 0, 1, ... (NULL: none / cancel) */
    int split;              /* CH_* */
    uint32_t seed;
    uint64_t now;
    ch_buf out;  /* client octets not yet checked */
    ch_buf log;  /* event lines not yet checked */
    ch_buf taken; /* what ch_take_* returned last */
    int closed;  /* CLOSED taken */
    int manual_tls; /* do not answer STARTTLS by itself */
    int tls_due;    /* STARTTLS taken: the handshake once what was read is fed */
    /* Added for the client transcript runner (tests/test_client_transcripts.c); all default
     * to 0, which keeps the behaviour above. */
    /* transcript: the log in transcript style. READY is "READY ext=NAME,... size=N auth=MECHS
     * tls=0|1 auth_ok=0|1" with the extension names in SMTPE_EXT_* bit order ("none" for
     * none), then " deliverby=N", " xclient=NAMES", " xforward=NAMES" when present and
     * " helo" after a HELO fallback; every span (reply text, enhanced code, challenge,
     * mechanisms) is C-escaped as hs_escape does, so each event is one line; a failed
     * smtpe_client_auth_response is logged ("AUTH-RESPONSE-ERROR n"). */
    int transcript;
    int write_blocked;  /* the host takes no output (a socket that does not drain) */
    size_t write_chunk; /* 0, or the host writes at most this many octets per round */
    int content_limited; /* the host has only content[0..content_limit) so far: it gives */
    size_t content_limit; /* no more, and not the last piece, until these change */
    int auth_step_lens; /* auth_steps[i] has auth_step_len[i] octets (NUL allowed), not strlen */
    size_t auth_step_len[8];
} ch;

/* Sets up cfg defaults (helo "client.example") and an empty transaction. */
void ch_init(ch *h);
/* Creates the session from h->cfg (after the test changed it). Returns smtpe_client_new's. */
int ch_open(ch *h);
void ch_free(ch *h);
/* Submits h->txn with n recipients named in to[] (NULL-terminated list also fine). */
int ch_submit(ch *h, const char *from, const char *const *to, size_t n);
/* Feeds server octets (a C string, "\r\n" as written), then pumps. */
void ch_server(ch *h, const char *octets);
void ch_server_n(ch *h, const uint8_t *octets, size_t n);
/* Takes events, writes output and content, until nothing changes. */
void ch_pump(ch *h);
/* Takes (and clears) what the client sent / the event log; the pointers live until the next
 * call on h. */
const char *ch_take_out(ch *h);
const char *ch_take_log(ch *h);
/* Advances the clock to t and lets the engine see it. */
void ch_time(ch *h, uint64_t t);
/* Like ch_take_out, with the length (the output may hold NUL octets). */
const char *ch_take_out_len(ch *h, size_t *len);

#endif
