/*
 * harness.h - helpers shared by the smtpe tests (not part of the engine).
 *
 * Growable byte buffers, C-style escapes, a counting allocator, an event formatter, a session
 * driver that feeds input whole, one octet at a time or in pseudo-random splits, and the runner
 * of the transcript files in tests/transcripts (format: tests/transcripts/README.md).
 */
#ifndef SMTPE_TEST_HARNESS_H
#define SMTPE_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "smtpe.h"

/* memcmp that accepts NULL pointers when n is 0. */
static inline int hs_memeq(const void *a, const void *b, size_t n)
{
    return n == 0 || memcmp(a, b, n) == 0;
}

/* ---- growable buffers -------------------------------------------------------------------- */
typedef struct hs_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
} hs_buf;

void hs_buf_add(hs_buf *b, const void *p, size_t n);
void hs_buf_adds(hs_buf *b, const char *s);
void hs_buf_addf(hs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hs_buf_reset(hs_buf *b);
void hs_buf_free(hs_buf *b);
/* NUL-terminates the contents (the NUL is not counted in len) and returns them. */
const char *hs_buf_cstr(hs_buf *b);

/* Whether the octets in got differ from the string want; if so msg gets "output mismatch"
 * with both, escaped (for a test's failure message). */
int hs_output_differs(const hs_buf *got, const char *want, hs_buf *msg);

/* Appends p[0..n) with C escapes: \r \n \t \\ \" and \xHH for other octets outside 0x20..0x7e. */
void hs_escape(hs_buf *out, const uint8_t *p, size_t n);
/* Appends the octets that s[0..n) denotes: \r \n \t \0 \\ \" \' \* and \xHH (two hex digits).
 * Returns 0, or -1 for a malformed escape. */
int hs_unescape(hs_buf *out, const char *s, size_t n);

/* ---- counting allocator ------------------------------------------------------------------ */
typedef struct hs_alloc {
    size_t allocs;     /* successful alloc calls */
    size_t attempts;   /* all alloc calls */
    size_t frees;      /* free calls */
    size_t bytes;      /* octets of the last successful allocation */
    size_t requested;  /* octets asked for by the last call, successful or not */
    size_t fail_from;  /* the attempt number (1-based) from which alloc returns NULL; 0: never */
    void *last;        /* pointer of the last successful allocation */
    void *last_freed;
} hs_alloc;

void hs_alloc_init(hs_alloc *a);
smtpe_allocator hs_alloc_hook(hs_alloc *a);

/* ---- event log --------------------------------------------------------------------------- */
typedef struct hs_log {
    hs_buf *items;
    size_t n;
    size_t cap;
} hs_log;

void hs_log_add(hs_log *log, const uint8_t *p, size_t n);
void hs_log_free(hs_log *log);
/* 1 if both logs hold the same entries. */
int hs_log_equal(const hs_log *a, const hs_log *b);

/* Formats an event (not DATA_CHUNK) as the raw octets of a transcript "E:" line. Returns 0, or
 * -1 with a reason in err when the event is inconsistent (e.g. a path's mailbox span is not
 * local-part "@" domain). */
int hs_format_event(hs_buf *out, const smtpe_event *ev, hs_buf *err);

/* ---- input splitting --------------------------------------------------------------------- */
enum { HS_WHOLE = 0, HS_BYTEWISE = 1, HS_RANDOM = 2 };
typedef struct hs_splitter {
    int mode;
    uint64_t state;
} hs_splitter;

void hs_splitter_init(hs_splitter *sp, int mode, uint64_t seed);
/* Length of the next piece to feed, 1..remaining (remaining > 0). */
size_t hs_splitter_next(hs_splitter *sp, size_t remaining);
const char *hs_mode_name(int mode);
uint64_t hs_hash(const char *s);

/* ---- session driver ---------------------------------------------------------------------- */
typedef struct hs_sess hs_sess;
/* Gives the verdict for ev (which needs one), or holds it to give later (concurrent verdicts:
 * it then counts it in s->holding until that verdict). Returns 0, or -1 with a reason in
 * s->err. */
typedef int (*hs_verdict_fn)(hs_sess *s, const smtpe_event *ev, void *ud);

struct hs_sess {
    smtpe_server *srv;
    const smtpe_server_config *cfg;
    hs_alloc alloc;
    smtpe_allocator hook;
    uint64_t now;
    hs_buf out;        /* every output octet taken so far */
    hs_log log;        /* every event so far, DATA_CHUNKs coalesced into CONTENT entries */
    hs_buf content;    /* DATA_CHUNK octets since the last other event */
    int in_content;
    hs_verdict_fn verdict; /* NULL: smtpe_server_accept (as many times as the event takes) */
    void *verdict_ud;
    size_t holding;    /* events the verdict callback holds without a verdict yet */
    int failed;
    hs_buf err;        /* the first failure */
    uint64_t consumed; /* octets smtpe_server_recv consumed so far */
    /* The last STARTTLS event (hs_sess_tls checks the window between it and the handshake). */
    int tls_mark;              /* a STARTTLS event was seen since the last handshake */
    size_t tls_mark_log;       /* log entries up to and including the STARTTLS event */
    size_t tls_mark_out;       /* output octets taken before its verdict */
    uint64_t tls_mark_consumed;
    uint64_t tls_mark_discarded; /* stats.discarded_octets at the event */
};

/* Creates the session (through the counting allocator) at time now. Returns 0 or the engine's
 * error code. */
int hs_sess_open(hs_sess *s, const smtpe_server_config *cfg, uint64_t now);
/* Frees the session and the driver's buffers. Returns 0, or -1 if smtpe_server_free did not
 * free the one allocation exactly once. */
int hs_sess_close(hs_sess *s);
/* Takes every pending event (giving verdicts) and all output. Returns how many events and output
 * octets there were. */
size_t hs_sess_drain(hs_sess *s);
/* Feeds p[0..n) in pieces chosen by sp, draining in between, until it is all consumed or the
 * session consumes nothing more: it wants to close, or it waits for verdicts the host holds
 * (s->holding > 0 and SMTPE_WANT_VERDICT without SMTPE_WANT_READ: concurrent verdicts, the
 * engine reads no further until they are given; feed the rest again after giving them). Returns the octets consumed; on
 * an engine misbehaviour (stuck, a recv that consumes nothing while want() says
 * SMTPE_WANT_READ, a negative return) sets s->failed. */
size_t hs_sess_feed(hs_sess *s, const uint8_t *p, size_t n, hs_splitter *sp);
/* The host's TLS handshake has finished: checks that the session wants SMTPE_WANT_TLS, that
 * since the STARTTLS event no further event came, the only output is one 220 reply, and every
 * octet consumed since was discarded (stats.discarded_octets), then calls
 * smtpe_server_tls_started. With implicit set (before anything was fed or taken: TLS from the
 * start) it only calls smtpe_server_tls_started. Returns 0, or -1 with s->failed set. */
int hs_sess_tls(hs_sess *s, int implicit);
/* Records pending content as a CONTENT entry. */
void hs_sess_flush_content(hs_sess *s);
void hs_sess_fail(hs_sess *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- transcripts ------------------------------------------------------------------------- */
enum {
    HS_L_CLIENT,  /* C: */
    HS_L_RAW,     /* B: */
    HS_L_SERVER,  /* S: */
    HS_L_SILENT,  /* SILENT */
    HS_L_EVENT,   /* E: */
    HS_L_HOST,    /* H: */
    HS_L_CLOSE,   /* CLOSE: */
    HS_L_TIME,    /* TIME +ms */
    HS_L_CLOSED,  /* CLOSED */
    HS_L_OPEN,    /* OPEN */
    HS_L_TLS,     /* TLS */
    HS_L_DISCARDED, /* DISCARDED n */
    HS_L_HOLD,    /* HOLD n: the next n events that need a verdict are held */
    HS_L_VERDICT, /* V: k [!ERR] verdict: the verdict for the k-th held event */
    HS_L_NOEVENT, /* NOEVENT: no event was taken beyond those matched by E: lines */
    HS_L_UNREAD   /* UNREAD n: n client octets were fed but not consumed */
};

typedef struct hs_line {
    int kind;
    int lineno;
    char *text;  /* after the keyword and one space, escapes not yet resolved */
} hs_line;

typedef struct hs_script {
    char *path;
    const char *name;       /* basename of path */
    smtpe_server_config cfg;
    char *hostname;
    char *greeting_text;
    char **extra;
    const char **extra_ptrs;
    size_t extra_n;
    char *auth_mechanisms;
    int trusted;            /* @trusted: smtpe_server_set_trusted(1) after creation */
    hs_line *lines;
    size_t n;
    int has_events;
} hs_script;

/* How a host replays a script's client octets outside the runner (test_server): the peer's
 * trust, TLS from the start, and the input offsets at which TLS lines finish a handshake. */
typedef struct hs_plan {
    int trusted;
    int implicit_tls; /* the first action is TLS */
    size_t *tls_at;   /* ascending offsets into hs_script_input's octets */
    size_t ntls;
} hs_plan;

/* Loads a transcript file. Returns 0, or -1 with the reason in err. */
int hs_script_load(hs_script *sc, const char *path, hs_buf *err);
void hs_script_free(hs_script *sc);
/* All client octets of the script (C: and B: lines) in order. */
void hs_script_input(const hs_script *sc, hs_buf *out);

/* Fills plan for sc (free it with hs_plan_free). */
void hs_script_plan(const hs_script *sc, hs_plan *plan);
void hs_plan_free(hs_plan *plan);
/* Opens a session as the plan says (trusted, implicit TLS) at time 0. Returns 0 or the engine's
 * error code (s->failed is set when the plan could not be applied). */
int hs_sess_open_plan(hs_sess *s, const smtpe_server_config *cfg, const hs_plan *plan);

/* Runs the script feeding input in the given mode. Returns 0 if every expectation held, else -1
 * with a report in err. out and log receive the session's whole output and event log. */
int hs_script_run(const hs_script *sc, int mode, uint64_t seed, hs_buf *out, hs_log *log,
                  hs_buf *err);

#endif
