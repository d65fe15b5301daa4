/*
 * fuzz_client.c - libFuzzer target over a whole CLIENT session (engine/client.c), driven through
 * the public API as a host drives it (smtpe_client_init / new / submit / recv / next_event /
 * content / abort_content / auth_response / tls_started / quit / lost / send_buf / send_ack /
 * expiry / handle_expiry / want), against a scripted server whose replies come from a small
 * grammar driven by the input (so that deep states are reached), mixed with raw octets.
 *
 * Input layout (a short input is padded with zeros):
 *
 *   [0]  bit 0 lmtp; bits 1-2 tls (NONE, OPPORTUNISTIC, REQUIRED, IMPLICIT); bit 3 chunking;
 *        bit 4 pipelining off; bit 5 line_ending REFUSE (else NORMALISE); bit 6 a PROXY header;
 *        bit 7 auto-finish (when the program ends the server answers everything happily, the
 *        host quits and the server says 221, for up to 48 rounds)
 *   [1]  AUTH: bits 0-2 auth_mechanism (NULL, "", PLAIN, LOGIN, XOAUTH2, OAUTHBEARER, X-TOKEN,
 *        cram-md5: the last two run through the host); bits 3-4 credentials (user+password,
 *        user+token, all three, password only); bit 5 an authzid; bit 6 auth_plaintext_ok;
 *        bit 7 long credentials (200-octet authzid and password, 1000-octet token)
 *   [2]  bits 0-1 output_buffer_size (4096, 4160, 16384, 65536); bits 2-4 chunk_size (0, 1, 2,
 *        7, 100, 1000, output_buffer_size - 64, 0); bits 5-7 max_unanswered (512, 513, 600,
 *        1000, 4096, 65536, 1048576, 4096)
 *   [3]  bits 0-2 max_reply_line (512, 513, 600, 1024, 2048, 4096, 65536, 2048); bits 3-4
 *        max_reply_size (max_reply_line, twice it, 65536 or max_reply_line, 1048576); bits 5-7
 *        max_recipients (1, 2, 3, 5, 8, 100, 1000, 100000)
 *   [4]  bits 0-1 timeouts (defaults, none, 1000..5000 ms, mixed); bits 2-3 start time (0, 1000,
 *        2^40, 2^62 ms); bits 4-5 helo_name (client.example, [192.0.2.1], a 255-octet domain,
 *        localhost); bit 6 XCLIENT attributes; bit 7 run 2 feeds one octet at a time
 *   [5..6] seed of run 2's split points
 *   [7]  bit 0 the host calls tls_started only when the program says (else at the STARTTLS
 *        event); bit 1 the host answers AUTH_STEP only when the program says (else at once);
 *        bit 2 a PROXY v2 header (else v1); bits 3-4 events taken per pump between steps
 *        (all, 1, 2, all); bit 5 XCLIENT values of 150 octets (two lines)
 *   [8..] the program: one op octet (low nibble the op, high nibble its argument) and its
 *        operands, until the input ends:
 *     0 SERVER  the server answers the next arg (0: all) commands it has not answered, one
 *               choice octet each (bits 0-2 the code from the command's table, 0 the happy one;
 *               bit 3 an enhanced status code; bit 4 two lines; bit 5 a text chosen by one more
 *               octet; an EHLO 2xx takes three more octets: the keywords offered, their values);
 *               with arg bit 3 (arg 8..15) the octets are held for the next SERVER/RAW/EXTRA
 *               op, so that one read holds several pieces
 *     1 RAW     arg + one octet: that many octets from the input (arg 15: two length octets)
 *     2 EXTRA   a reply no command asked for (code from a list chosen by arg, one text octet)
 *     3 SUBMIT  a transaction: four octets (recipients and reverse-path; BODY, SMTPUTF8, RET,
 *               ENVID, REQUIRETLS, whether the host scans; MT-PRIORITY / BY, XFORWARD, content
 *               piece size; content kind and its parameter), one octet per recipient
 *               (forward-path, NOTIFY, ORCPT), then the content's own octets for kind 0 / 15
 *     4 PAUSE   arg 0 the host gives content again, else it holds it back
 *     5 ABORT   smtpe_client_abort_content
 *     6 LOST    smtpe_client_lost
 *     7 QUIT    smtpe_client_quit
 *     8 TLS     smtpe_client_tls_started (arg 1: smtpe_client_lost, a failed handshake)
 *     9 AUTH    smtpe_client_auth_response with the data arg chooses
 *    10 TIME    the clock advances (arg chooses how far) and handle_expiry
 *    11 BUDGET  arg < 8: octets the host writes per round (unlimited, 0, 1, 3, 7, 64, 300,
 *               4096); else one write of that many now
 *    12 BAD     a call that must fail in a documented way (arg chooses)
 *    13 AUTO    arg + 1 rounds of happy server replies
 *    14, 15     nothing
 *
 * Each input runs the session twice, the server's octets fed per read whole (run 1, in caller
 * memory: smtpe_client_init in a block of exactly smtpe_client_memory_size octets) and in
 * input-derived splits or one octet at a time (run 2: smtpe_client_new with a counting
 * allocator). Run 1 interprets the program and records what it did (every read's octets, every
 * host call); run 2 replays that record. The host in both: after each smtpe_client_recv that
 * stopped at an event, and after each read and each host op, it takes the events, reacts
 * (content, AUTH responses, the TLS handshake), writes the output (all of it, or a budget per
 * round) and arms its timer (smtpe_client_expiry); between the pieces of one read it does
 * nothing, and while octets of a read are still unfed it takes events and reacts but sends
 * nothing (smtpe.h: a host feeds everything it has read before it sends). After a STARTTLS event the host first feeds what is left of the read (those octets
 * came before the handshake, and the engine must then end the session, RFC 3207 §4.2), and runs
 * its handshake (smtpe_client_tls_started) only when nothing is left. Between reads the host
 * takes at most 1 or 2 events per round when the header says so, so that its calls (submit,
 * lost, quit, the clock...) also meet events it has not taken yet.
 *
 * Oracles (abort on violation):
 *  (1) split invariance: both runs put the same octets on the wire and give the same log (every
 *      event with its fields, every host call and its return code, the octets each
 *      smtpe_client_content call consumed, each write's length, the timer after each round,
 *      want() at rest);
 *  (2) content: the client's DATA section (after the 354) decoded by the server engine's own
 *      dot-unstuffing (smtpe__data_feed, REFUSE, so a bare CR/LF or NUL on the wire shows as
 *      BAD_LINE_ENDING) or its BDAT chunks (the octets each "BDAT n" line counts) equal the
 *      submitted content normalised (bare CR/LF as CRLF under NORMALISE; the final CRLF added
 *      when missing and the content is not empty; BODY=BINARYMIME verbatim) whenever the end
 *      of the content went out, and are a prefix of it otherwise; the end never goes for
 *      content the engine must refuse mid-stream, for an aborted message, or before the host
 *      gave its last piece; a recipient delivered means that end went out; the first CRLF.CRLF
 *      after the 354 is the content's end (no smuggling);
 *  (3) outcomes: one per recipient, index in range, never two; TRANSACTION_DONE after all of
 *      them with counts that match and the txn pointer submitted; CLOSED at most once and
 *      nothing after it; a reply-decided outcome carries the code of the reply a reference
 *      matcher (below) gave that recipient; once the end of the content went out (handed out;
 *      written, when the connection was lost) a recipient no reply decided is UNKNOWN, never
 *      TEMPORARY; others an end of the session decides are TEMPORARY (PERMANENT for content
 *      refused mid-stream); refusals before MAIL exactly when the reference says;
 *  (4) the command stream: a reference model parses the client's output into command lines and
 *      content (it knows where content is from the replies it matched itself) and matches the
 *      server's replies to the commands in order (RFC 2920 §3.1, LMTP RFC 2033 §4.2, 421 at any
 *      time); from that it requires: nothing but a PROXY header before the greeting; setup
 *      commands one at a time and in the order RFC 5321 / 3207 / 4954 and the config imply
 *      (EHLO/LHLO, HELO only after 500/502, STARTTLS once when offered and wanted, XCLIENT
 *      with only offered attributes, AUTH with the right mechanism, initial response and
 *      credential lines, never in clear without auth_plaintext_ok, nothing in clear but
 *      EHLO/HELO/STARTTLS/QUIT under tls=REQUIRED); MAIL only when setup is done; exact MAIL
 *      and RCPT lines (parameters as a set); without PIPELINING one command at a time, with it
 *      at most max_unanswered octets outstanding; nothing after DATA, after the end of the
 *      content or after STARTTLS until their replies; no BDAT after a refused one, at most one
 *      LAST; nothing after QUIT; nothing queued after CLOSED; the engine closes exactly when
 *      the reference says a reply ends the session, for the same reason; READY's capabilities
 *      are those the reference parsed from the EHLO reply. A line is judged when send_buf
 *      hands it out, against the replies consumed by then; as it may have been queued before
 *      some of them, the rule a later reply tightens (no RCPT, DATA or BDAT once the
 *      transaction failed) applies from the last time the host had been handed everything;
 *  (5) memory: smtpe_client_memory_size(cfg) is smtpe.h's formula S + max_reply_line +
 *      output_buffer_size (rounded to max_align_t) + 12 * (max_unanswered / 6 + 8) +
 *      2 * ceil(max_recipients / 8), rounded to max_align_t, S derived once from the defaults'
 *      documented 30800 octets (LP64;
 *      elsewhere from the defaults' own figure); run 1 lives in exactly that many octets,
 *      smtpe_client_init refuses one octet less, run 2's smtpe_client_new allocates exactly
 *      once that many octets and smtpe_client_free releases them;
 *  (6) every call returns a documented value (and the one a host can predict when it can: e.g.
 *      SMTPE_ERR_STATE for a second transaction, a second QUIT, calls after CLOSED); want()
 *      agrees with next_event, send_buf and content; handle_expiry agrees with the deadline
 *      the last expiry() gave; output handed out stays put until acknowledged;
 *      smtpe_content_scan agrees with a reference scan in any split.
 *
 * Reproduce: fuzz/out/fuzz_client CRASHFILE; FUZZ_TRACE=1 prints both runs' calls and logs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "smtpe.h"

#include "data.h"
#include "proxy.h"
#include "sasl.h"

#define HDR 8
#define MAXR 12     /* recipients one submitted transaction may have */
#define MAXT 12     /* transactions per session */
#define MAXA 4096   /* actions per session */
#define CONTENT_MAX (160 * 1024)

static int trace = -1;
#define TRACE(...)                                                                              \
    do {                                                                                        \
        if (trace > 0)                                                                          \
            fprintf(stderr, __VA_ARGS__);                                                       \
    } while (0)

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------------------------------------ */
/* Choices the input picks from.                                                               */

static const size_t obs_choices[] = {4096, 4160, 16384, 65536};
static const size_t mu_choices[] = {512, 513, 600, 1000, 4096, 65536, 1048576, 4096};
static const size_t mrl_choices[] = {512, 513, 600, 1024, 2048, 4096, 65536, 2048};
static const unsigned mr_choices[] = {1, 2, 3, 5, 8, 100, 1000, 100000};
static const uint64_t t0_choices[] = {0, 1000, (uint64_t)1 << 40, (uint64_t)1 << 62};
static const size_t piece_choices[] = {0, 1, 2, 3, 4, 5, 7, 8, 16, 64, 100, 511, 1000, 4093,
                                       4096, 65536};
static const size_t budget_choices[] = {SIZE_MAX, 0, 1, 3, 7, 64, 300, 4096};
static const uint64_t time_choices[] = {1,       999,     1000,    1999,   59999,
                                        119999,  120000,  179999,  180000, 299999,
                                        300000,  599999,  600000,  3600000, 1,
                                        (uint64_t)1 << 41};

static char long_domain[256];
static char long_authzid[201], long_password[201], long_token[1001];

static const char *const mech_choices[] = {NULL, "", "PLAIN", "LOGIN", "XOAUTH2", "OAUTHBEARER",
                                           "X-TOKEN", "cram-md5"};

/* Paths with whether the engine must accept them: 1 yes, 0 no, -1 either. */
typedef struct pchoice {
    const char *s;
    int as_reverse, as_forward;
} pchoice;

static char long_local[80], longer_local[80];
static pchoice path_choices[16] = {
    {"alice@example.com", 1, 1},
    {"", 1, 0},
    {"jos\xc3\xa9@example.com", 1, 1},
    {"\"a b\"@example.com", 1, 1},
    {"x@[192.0.2.1]", 1, 1},
    {"postmaster", 0, 1},
    {"Postmaster", 0, 1},
    {"bob@example.org", 1, 1},
    {long_local, 1, 1},
    {longer_local, 0, 0}, /* RFC 5321 §4.5.3.1.1: a local-part is at most 64 octets */
    {"a@example.com\r\nRSET", 0, 0},
    {"a b@example.com", 0, 0},
    {"@relay.example:a@example.com", 0, 0},
    {"a+b=c@example.com", 1, 1},
    {"c@example.org", 1, 1},
    {"user@", 0, 0},
};

static const unsigned notify_choices[] = {0, SMTPE_NOTIFY_SUCCESS | SMTPE_NOTIFY_FAILURE,
                                          SMTPE_NOTIFY_NEVER, SMTPE_NOTIFY_DELAY};
static const char *const orcpt_choices[] = {"rfc822;a+b=c@example.com", "rfc822;x\xc3\xa9@y.example"};

static const smtpe_param xclient_attrs[] = {
    {{(const uint8_t *)"NAME", 4}, {(const uint8_t *)"mail.example", 12}},
    {{(const uint8_t *)"ADDR", 4}, {(const uint8_t *)"192.0.2.7", 9}},
    {{(const uint8_t *)"PORT", 4}, {(const uint8_t *)"4321", 4}},
    {{(const uint8_t *)"LOGIN", 5}, {(const uint8_t *)"user name+x", 11}},
    {{(const uint8_t *)"HELO", 4}, {(const uint8_t *)"client.example", 14}},
};
static char xc_long[3][160]; /* values long enough that the attributes take two lines */
static smtpe_param xclient_long[] = {
    {{(const uint8_t *)"NAME", 4}, {(const uint8_t *)xc_long[0], 150}},
    {{(const uint8_t *)"ADDR", 4}, {(const uint8_t *)"192.0.2.9", 9}},
    {{(const uint8_t *)"LOGIN", 5}, {(const uint8_t *)xc_long[1], 150}},
    {{(const uint8_t *)"HELO", 4}, {(const uint8_t *)xc_long[2], 150}},
};
static const smtpe_param xforward_attrs[] = {
    {{(const uint8_t *)"NAME", 4}, {(const uint8_t *)"x.example", 9}},
    {{(const uint8_t *)"ADDR", 4}, {(const uint8_t *)"192.0.2.8", 9}},
    {{(const uint8_t *)"IDENT", 5}, {(const uint8_t *)"a=b", 3}},
};

/* AUTH responses the host gives (op AUTH, and the automatic answers). */
static uint8_t resp_big[8193];
typedef struct rchoice {
    const uint8_t *p;
    size_t n;
} rchoice;
static const rchoice resp_choices[] = {
    {(const uint8_t *)"tok", 3},
    {NULL, 0},
    {(const uint8_t *)"", 0},
    {(const uint8_t *)"user 0123456789abcdef0123456789abcdef", 37},
    {resp_big, 300},
    {resp_big, 400},
    {resp_big, 3000},
    {resp_big, 8192},
    {resp_big, 8193},
};

static void tables_init(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    /* a 255-octet domain: labels of 63 */
    memset(long_domain, 'a', 255);
    long_domain[63] = long_domain[127] = long_domain[191] = '.';
    long_domain[255] = 0;
    memset(long_authzid, 'z', 200);
    memset(long_password, 'p', 200);
    memset(long_token, 't', 1000);
    memset(long_local, 'l', 64);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 150; j++)
            xc_long[i][j] = (char)(j % 10 == 9 ? '+' : 'a' + (i + j) % 26);
    memcpy(long_local + 64, "@example.com", 13);
    memset(longer_local, 'm', 65);
    memcpy(longer_local + 65, "@example.com", 13);
    for (size_t i = 0; i < sizeof resp_big; i++)
        resp_big[i] = (uint8_t)(i * 7 + 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Reading the program.                                                                        */

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
} rd;

static int rd_more(const rd *r)
{
    return r->i < r->n;
}

static unsigned rd_u8(rd *r)
{
    return r->i < r->n ? r->p[r->i++] : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* References.                                                                                 */

/* The content as its reference scan sees it (RFC 5321 §2.3.8, RFC 5322 §2.1.1): flags, the
 * octets NORMALISE puts on the wire before dot-stuffing with the final CRLF (E), and its size. */
typedef struct cref {
    unsigned flags;
    fz_buf e;          /* expected text content: bare CR/LF as CRLF, final CRLF added */
    uint64_t wire_size;
} cref;

static void ref_scan(const uint8_t *p, size_t n, cref *r)
{
    size_t line = 0;
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (c == '\r' || c == '\n') {
            if (c == '\r' && !(i + 1 < n && p[i + 1] == '\n'))
                r->flags |= SMTPE_CONTENT_BARE_CR;
            if (c == '\n' && !(i > 0 && p[i - 1] == '\r'))
                r->flags |= SMTPE_CONTENT_BARE_LF;
            if (c == '\r' && i + 1 < n && p[i + 1] == '\n')
                i++;
            fz_put(&r->e, "\r\n", 2);
            line = 0;
            continue;
        }
        if (c == 0)
            r->flags |= SMTPE_CONTENT_NUL;
        if (c & 0x80)
            r->flags |= SMTPE_CONTENT_8BIT;
        if (++line > 998)
            r->flags |= SMTPE_CONTENT_LONG_LINE;
        fz_put_u8(&r->e, c);
    }
    if (r->e.len > 0 && !(r->e.len >= 2 && r->e.p[r->e.len - 2] == '\r' &&
                          r->e.p[r->e.len - 1] == '\n'))
        fz_put(&r->e, "\r\n", 2);
    r->wire_size = r->e.len;
}

/* xtext (RFC 3461 §4): "!".."~" but "+" and "=" as they are, others "+XX". */
static void ref_xtext(fz_buf *b, const uint8_t *p, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        if (p[i] >= '!' && p[i] <= '~' && p[i] != '+' && p[i] != '=') {
            fz_put_u8(b, p[i]);
        } else {
            char x[3] = {'+', hex[p[i] >> 4], hex[p[i] & 15]};
            fz_put(b, x, 3);
        }
    }
}

static void put_str(fz_buf *b, const char *s)
{
    fz_put(b, s, strlen(s));
}

static void put_b64(fz_buf *b, const uint8_t *p, size_t n)
{
    uint8_t *tmp = malloc(SMTPE__BASE64_LEN(n) + 1);
    if (!tmp)
        abort();
    size_t k = smtpe__base64_encode(p, n, tmp);
    fz_put(b, tmp, k);
    free(tmp);
}

static void put_fmt(fz_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_fmt(fz_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        fz_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static int has_8bit_str(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s & 0x80)
            return 1;
    return 0;
}

static int ci_eq(const uint8_t *a, size_t n, const char *b)
{
    if (strlen(b) != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned x = a[i], y = (unsigned char)b[i];
        if (x >= 'a' && x <= 'z')
            x -= 32;
        if (y >= 'a' && y <= 'z')
            y -= 32;
        if (x != y)
            return 0;
    }
    return 1;
}

/* 1 if the space-separated list[0..n) holds name, compared without regard to case. */
static int list_has(const uint8_t *list, size_t n, const uint8_t *name, size_t nlen)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && list[j] != ' ')
            j++;
        if (j - i == nlen) {
            size_t k = 0;
            for (; k < nlen; k++) {
                unsigned x = list[i + k], y = name[k];
                if (x >= 'a' && x <= 'z')
                    x -= 32;
                if (y >= 'a' && y <= 'z')
                    y -= 32;
                if (x != y)
                    break;
            }
            if (k == nlen)
                return 1;
        }
        i = j + 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The case: config, transactions and the record of what run 1 did.                           */

typedef struct ftxn {
    smtpe_client_txn t;
    smtpe_client_rcpt r[MAXR];
    uint8_t *content;
    size_t len;
    size_t piece;
    int by_ref; /* the content goes by smtpe_client_content_ref (the input stays put) */
    int valid; /* submit must return: 1 ok, 0 INVALID_ARGUMENT, -1 either */
    cref ref;
    int utf8;  /* an address is not ASCII */
} ftxn;

enum { A_STEP, A_SUBMIT, A_PAUSE, A_ABORT, A_LOST, A_QUIT, A_TLS, A_AUTH, A_TIME, A_BUDGET,
       A_WRITE, A_BAD, A_FINAL };

typedef struct action {
    int op;
    size_t a;
    uint8_t *p; /* A_STEP: the read's octets (owned) */
    size_t n;
} action;

typedef struct fcase {
    smtpe_client_config cfg;
    smtpe_proxy_info proxy;
    uint8_t proxy_hdr[600];
    size_t proxy_len;
    int auto_finish, octetwise, manual_tls, manual_auth, evlimit;
    uint64_t t0;
    uint32_t split_seed;
    ftxn tx[MAXT];
    size_t ntx;
    action act[MAXA];
    size_t nact;
} fcase;

/* ------------------------------------------------------------------------------------------ */
/* The reference model of the session (oracle 4).                                              */

enum { MK_GREETING, MK_EHLO, MK_HELO, MK_STARTTLS, MK_XCLIENT, MK_AUTH, MK_AUTH_RESP, MK_RSET,
       MK_XFORWARD, MK_MAIL, MK_RCPT, MK_DATA, MK_DOT, MK_DOT_VOID, MK_BDAT, MK_BDAT_LAST,
       MK_QUIT };
static const char *const mk_name[] = {"greeting", "EHLO", "HELO", "STARTTLS", "XCLIENT", "AUTH",
                                      "AUTH-response", "RSET", "XFORWARD", "MAIL", "RCPT", "DATA",
                                      "end of data", "lone dot", "BDAT", "BDAT LAST", "QUIT"};

typedef struct mcmd {
    int kind;
    size_t arg;        /* RCPT: the index */
    size_t len;        /* octets counted against max_unanswered */
    int wtx;           /* the wire transaction it belongs to */
    int srv;           /* replies the scripted server gave it */
    unsigned srv_code; /* the code of its last */
} mcmd;

/* Setup: what the engine must send next. */
enum { NX_NONE, NX_EHLO, NX_HELO, NX_STARTTLS, NX_XCLIENT, NX_AUTH, NX_READY };

/* AUTH exchange (engine-run mechanisms). */
enum { AU_IDLE, AU_CMD, AU_USER, AU_PASS, AU_CREDS, AU_ERROR, AU_OTHER };

/* Client wire modes. */
enum { MC_PROXY, MC_LINE, MC_DATA, MC_BDAT, MC_LONE };

typedef struct mrp { /* the strict reply parser (reply.h's rules) */
    uint8_t *line;
    size_t len, cap, total, max_total;
    unsigned code, lines;
    int cr, err;
} mrp;

/* The transaction on the wire (from its RSET, XFORWARD or MAIL to its last reply). */
typedef struct mtxn {
    int active;
    int ftx;       /* the case's transaction, or -1 */
    int mail_sent, mail_ok;
    int failed;    /* MAIL, every RCPT, DATA or a BDAT refused: no content (more) goes */
    int data_sent, lone_due, end_sent, end_replied;
    size_t rcpt_sent, rcpt_replied, n_acc;
    uint8_t acc[MAXR]; /* recipients accepted */
    unsigned end_left; /* replies still due to the end of the content (LMTP: one each) */
    size_t lmtp_cursor;  /* the next accepted recipient an LMTP reply decides */
    size_t outstanding;  /* its commands awaiting replies */
    int bdat;            /* content by BDAT (cfg.chunking and CHUNKING offered) */
    int bdat_out, lasts; /* a chunk awaits its reply; BDAT LAST lines seen */
    int rset_due, rset_sent; /* a RSET must open it (the last one failed); it went */
    /* failed as of the last moment the host had been handed everything queued: a command
     * handed out later was queued after the failure was known (one handed out earlier may
     * have been queued before the reply that failed it) */
    int failed_flushed;
    /* all its commands handed out were answered (the engine may still have one queued that the
     * host has not been handed: it is over once that is answered); ended_flushed: so it was
     * at the last moment the host had been handed everything */
    int ended, ended_flushed;
} mtxn;

typedef struct mdec { /* a recipient's outcome as the model decided it */
    int set;
    unsigned code;
    int outcome; /* 0: whatever the close gives */
    int closing; /* decided by the reply that ended the session */
} mdec;

/* What the reference knows of the session: the client's stream as handed out (send_buf) and
 * the server's as consumed (recv), matched in order. */
typedef struct model {
    /* the client's stream */
    int mode;             /* MC_*: what the next client octet is */
    fz_buf line;          /* the command line being collected */
    uint64_t wire;        /* client octets handed out so far */
    uint64_t bdat_left;   /* octets of the current chunk still to come */
    int bdat_is_last;
    size_t proxy_at;      /* octets of the PROXY header seen */

    /* commands handed out, in order; [head, nh) await replies */
    mcmd *h;
    size_t nh, hcap, head;
    size_t unanswered;    /* their octets, as the engine counts them against max_unanswered */

    /* the server's stream */
    mrp rp;
    size_t reply_nh;      /* nh when the reply being read had its first octet */
    uint64_t reply_acked; /* r->acked then */
    int closed;           /* the session is over (a reply ended it, or the host) */
    int close_reason;     /* SMTPE_CLOSE_* the reply calls for; -1 host-side */
    unsigned close_code;  /* the code of the reply that ended it, 0 for none */

    /* setup (RFC 5321 §3.1-3.2, RFC 3207, XCLIENT, RFC 4954) */
    int tls, tls_wait, tried_starttls, authenticated, xclient_done, quit_sent;
    unsigned xclient_sent; /* the configured XCLIENT attributes sent, by index */
    int next;             /* NX_*: the setup command the engine must send next */
    int ready;            /* setup done: transactions may go (READY) */
    int greeted;          /* the greeting was 220 */
    /* the last EHLO reply's capabilities, parsed as smtpe.h describes smtpe_client_caps */
    unsigned ext;
    uint64_t size_limit;
    int64_t deliverby_min;
    uint8_t auth[256], xclient[256], xforward[256];
    size_t auth_len, xclient_len, xforward_len;
    int esmtp;
    unsigned auth_offered; /* engine-run mechanisms named on any AUTH line, 1 << SMTPE_SASL_* */
    int auth_cfg_offered;  /* cfg.auth_mechanism named on one */
    /* AUTH */
    int auth_mech, auth_state;
    int auth_host;         /* the engine waits for the host's AUTH_STEP answer */
    unsigned auth_step;    /* the host-run exchange's step */
    fz_buf auth_expect;    /* the exact next AUTH line, when auth_expect_set */
    int auth_expect_set;
    fz_buf chal;           /* the last 334 challenge decoded (host-run) */
    int need_rset;         /* the last transaction failed: RSET opens the next */

    mtxn t;
    int wtx;              /* wire transactions begun */
    smtpe__data dd;       /* the server engine's DATA decoder, over the client's content */
} model;

/* Per run, per submitted transaction. */
typedef struct rtxn {
    int submitted, done, content_ev, before_mail, aborted;
    size_t gave;
    int gave_last;
    int decided[MAXR];
    mdec md[MAXR];
    size_t counts[5];
    int mail_on_wire, bdat;
    fz_buf wire;   /* content as it came out of the wire decoder / the BDAT chunks */
    int end_seen, dd_bad;
    uint64_t end_wire; /* wire offset just past the end of the content */
    int refuse_mid;    /* the engine must refuse it mid-stream (no scan given) */
} rtxn;

typedef struct acount {
    size_t allocs, frees, size;
    void *ptr;
} acount;

typedef struct run {
    fcase *fc;
    int split; /* 1: run 2 (splits), 0: run 1 (whole) */
    smtpe_client *c;
    uint8_t *mem;
    uint64_t now;
    fz_buf log;
    fz_buf out;
    uint64_t acked;
    const uint8_t *last_p;
    size_t last_len, last_ack;
    size_t budget;
    uint64_t deadline; /* what the last expiry() gave */
    size_t step_left;  /* octets of the current read not yet fed */
    uint32_t rng;

    int closed_ev, host_close; /* host_close: LOST / TIMEOUT / ABORTED asked */
    uint64_t closed_total;
    int tls_pending; /* a STARTTLS event taken, no reaction yet */
    int auth_owed;
    unsigned auth_step;
    int paused;
    int quit_asked;
    int cur;         /* the current transaction (submitted, DONE not taken), or -1 */
    int abort_ok, refused_mid; /* an abort was accepted; the engine refused content mid-stream */
    int lost_ok;               /* smtpe_client_lost was accepted */
    rtxn tx[MAXT];
    model m;
} run;

#define LOGF(r, ...)                                                                            \
    do {                                                                                        \
        size_t log_at_ = (r)->log.len;                                                          \
        put_fmt(&(r)->log, __VA_ARGS__);                                                        \
        if (trace > 0)                                                                          \
            fprintf(stderr, "  [%s] log: %.*s", (r)->split ? "split" : "whole",                \
                    (int)((r)->log.len - log_at_), (const char *)(r)->log.p + log_at_);         \
    } while (0)

static rtxn *cur_rtxn(run *r)
{
    return r->cur >= 0 ? &r->tx[r->cur] : NULL;
}

static void m_push(model *m, int kind, size_t arg, size_t len)
{
    if (m->nh == m->hcap) {
        m->hcap = m->hcap ? 2 * m->hcap : 64;
        m->h = realloc(m->h, m->hcap * sizeof *m->h);
        if (!m->h)
            abort();
    }
    mcmd *c = &m->h[m->nh++];
    TRACE("  model: client sent %s (%zu octets)\n", mk_name[kind], len);
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->arg = arg;
    c->len = len > 65535 ? 65535 : len;
    c->wtx = m->wtx;
    m->unanswered += c->len;
    if (kind != MK_GREETING && kind != MK_EHLO && kind != MK_HELO && kind != MK_STARTTLS &&
        kind != MK_XCLIENT && kind != MK_AUTH && kind != MK_AUTH_RESP && kind != MK_QUIT)
        m->t.outstanding++;
}

static size_t m_outstanding(const model *m)
{
    return m->nh - m->head;
}

static int is_setup_kind(int k)
{
    return k == MK_GREETING || k == MK_EHLO || k == MK_HELO || k == MK_STARTTLS ||
           k == MK_XCLIENT || k == MK_AUTH || k == MK_AUTH_RESP;
}

static int m_pipelining(const run *r)
{
    return r->fc->cfg.pipelining && (r->m.ext & SMTPE_EXT_PIPELINING);
}

static const smtpe_client_config *CFG(const run *r)
{
    return &r->fc->cfg;
}

static int auth_wanted(const run *r)
{
    return CFG(r)->auth_mechanism != NULL && !r->m.authenticated;
}

/* ---- the engine-run SASL messages (RFC 4616, XOAUTH2, RFC 7628) ---- */

static void sasl_message(const run *r, int mech, fz_buf *b)
{
    const smtpe_client_config *k = CFG(r);
    if (mech == SMTPE_SASL_PLAIN) {
        if (k->auth_authzid)
            put_str(b, k->auth_authzid);
        fz_put_u8(b, 0);
        put_str(b, k->auth_user);
        fz_put_u8(b, 0);
        put_str(b, k->auth_password);
    } else if (mech == SMTPE_SASL_XOAUTH2) {
        put_str(b, "user=");
        put_str(b, k->auth_user);
        put_str(b, "\001auth=Bearer ");
        put_str(b, k->auth_token);
        put_str(b, "\001\001");
    } else {
        put_str(b, "n,a=");
        for (const char *u = k->auth_user; *u; u++)
            put_str(b, *u == ',' ? "=2C" : *u == '=' ? "=3D" : (char[2]){*u, 0});
        put_str(b, ",\001auth=Bearer ");
        put_str(b, k->auth_token);
        put_str(b, "\001\001");
    }
}

static const char *mech_upper(int id)
{
    static const char *const n[] = {"", "PLAIN", "LOGIN", "XOAUTH2", "OAUTHBEARER"};
    return n[id];
}

static int mech_id_of(const char *s)
{
    for (int i = 1; i <= 4; i++)
        if (ci_eq((const uint8_t *)s, strlen(s), mech_upper(i)))
            return i;
    return SMTPE_SASL_OTHER;
}

/* The mechanism the engine must choose (RFC 4954 §4), or -1 when none is usable. */
static int m_choose_mech(const run *r)
{
    const smtpe_client_config *k = CFG(r);
    const model *m = &r->m;
    if (k->auth_mechanism[0]) {
        int id = mech_id_of(k->auth_mechanism);
        if (!m->auth_cfg_offered)
            return -1;
        if ((id == SMTPE_SASL_PLAIN || id == SMTPE_SASL_LOGIN) &&
            (!k->auth_user || !k->auth_password))
            return -1;
        if ((id == SMTPE_SASL_XOAUTH2 || id == SMTPE_SASL_OAUTHBEARER) &&
            (!k->auth_user || !k->auth_token))
            return -1;
        return id;
    }
    static const int order[] = {SMTPE_SASL_OAUTHBEARER, SMTPE_SASL_XOAUTH2, SMTPE_SASL_PLAIN,
                                SMTPE_SASL_LOGIN};
    for (size_t i = 0; i < NELEM(order); i++) {
        int id = order[i];
        int creds = id >= SMTPE_SASL_XOAUTH2 ? k->auth_user && k->auth_token
                                             : k->auth_user && k->auth_password;
        if (creds && (m->auth_offered & (1u << id)))
            return id;
    }
    return -1;
}

static void m_close(run *r, int reason, unsigned code);

/* The AUTH command line the engine must queue for an engine-run mechanism. */
static void m_auth_begin(run *r)
{
    model *m = &r->m;
    const smtpe_client_config *k = CFG(r);
    int id = m->auth_mech;
    m->auth_expect.len = 0;
    m->auth_expect_set = 1;
    if (id == SMTPE_SASL_OTHER) {
        m->auth_state = AU_OTHER;
        m->auth_step = 0;
        m->auth_host = 1; /* the host gives the initial response (AUTH_STEP 0) */
        m->auth_expect_set = 0;
        return;
    }
    (void)k;
    put_str(&m->auth_expect, "AUTH ");
    put_str(&m->auth_expect, mech_upper(id));
    if (id == SMTPE_SASL_LOGIN) {
        put_str(&m->auth_expect, "\r\n");
        m->auth_state = AU_USER;
        return;
    }
    fz_buf msg = {0};
    sasl_message(r, id, &msg);
    if (m->auth_expect.len + 1 + SMTPE__BASE64_LEN(msg.len) + 2 <= 512) {
        put_str(&m->auth_expect, " ");
        put_b64(&m->auth_expect, msg.p, msg.len);
        m->auth_state = AU_CREDS;
    } else {
        m->auth_state = AU_CMD;
    }
    put_str(&m->auth_expect, "\r\n");
    fz_free(&msg);
}

/* setup_next's rules (RFC 3207, XCLIENT_README, RFC 4954) as the model sees them. */
static void m_setup_next(run *r)
{
    model *m = &r->m;
    const smtpe_client_config *k = CFG(r);
    int want_tls = k->tls == SMTPE_TLS_OPPORTUNISTIC || k->tls == SMTPE_TLS_REQUIRED;
    if (!m->tls && want_tls && !m->tried_starttls) {
        if (m->ext & SMTPE_EXT_STARTTLS) {
            m->next = NX_STARTTLS;
            return;
        }
        if (k->tls == SMTPE_TLS_REQUIRED) {
            m_close(r, SMTPE_CLOSE_TLS_REQUIRED, 0);
            return;
        }
    }
    if (!m->tls && k->tls == SMTPE_TLS_REQUIRED) {
        m_close(r, SMTPE_CLOSE_TLS_REQUIRED, 0);
        return;
    }
    if (k->xclient_count > 0 && !m->xclient_done && m->xclient_len > 0) {
        int any = 0;
        for (size_t i = 0; i < k->xclient_count; i++)
            any |= !(m->xclient_sent & (1u << i)) &&
                   list_has(m->xclient, m->xclient_len, k->xclient[i].keyword.ptr,
                            k->xclient[i].keyword.len);
        if (any) {
            m->next = NX_XCLIENT;
            return;
        }
        m->xclient_done = 1;
    }
    if (auth_wanted(r)) {
        if (!m->tls && !k->auth_plaintext_ok) {
            m_close(r, SMTPE_CLOSE_AUTH_FAILED, 0);
            return;
        }
        int id = m_choose_mech(r);
        if (id < 0) {
            m_close(r, SMTPE_CLOSE_AUTH_FAILED, 0);
            return;
        }
        m->auth_mech = id;
        m->next = NX_AUTH;
        m_auth_begin(r);
        return;
    }
    m->next = NX_READY;
    m->ready = 1;
}

/* ---- capabilities (RFC 5321 §4.1.1.1) ---- */

static void m_caps_reset(model *m)
{
    m->ext = 0;
    m->size_limit = 0;
    m->deliverby_min = 0;
    m->auth_len = m->xclient_len = m->xforward_len = 0;
    m->esmtp = 0;
    m->auth_offered = 0;
    m->auth_cfg_offered = 0;
}

static size_t keep_line(uint8_t *buf, const uint8_t *v, size_t n)
{
    if (n > 256) {
        n = 256;
        while (n > 0 && v[n] != ' ')
            n--;
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = v[i] < 0x20 || v[i] == 0x7f ? ' ' : v[i];
    return n;
}

static int parse_u64(const uint8_t *p, size_t n, uint64_t *v)
{
    uint64_t x = 0;
    if (n == 0 || n > 20)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9' || x > (UINT64_MAX - (uint64_t)(p[i] - '0')) / 10)
            return -1;
        x = x * 10 + (uint64_t)(p[i] - '0');
    }
    *v = x;
    return 0;
}

static int mech_id_of(const char *s);

/* RFC 4954 §3: the mechanisms an AUTH line names, from the whole line. */
static void m_auth_offered(run *r, const uint8_t *v, size_t n)
{
    model *m = &r->m;
    const char *cfg = CFG(r)->auth_mechanism;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && v[j] != ' ')
            j++;
        if (j > i && j - i < 24) {
            char name[24];
            memcpy(name, v + i, j - i);
            name[j - i] = 0;
            if (mech_id_of(name) != SMTPE_SASL_OTHER)
                m->auth_offered |= 1u << mech_id_of(name);
            if (cfg && cfg[0] && ci_eq(v + i, j - i, cfg))
                m->auth_cfg_offered = 1;
        }
        i = j + 1;
    }
}

static void m_keyword(run *r, const uint8_t *t, size_t n)
{
    model *m = &r->m;
    static const struct {
        const char *name;
        unsigned bit;
    } known[] = {{"PIPELINING", SMTPE_EXT_PIPELINING}, {"SIZE", SMTPE_EXT_SIZE},
                 {"8BITMIME", SMTPE_EXT_8BITMIME}, {"SMTPUTF8", SMTPE_EXT_SMTPUTF8},
                 {"ENHANCEDSTATUSCODES", SMTPE_EXT_ENHANCEDSTATUSCODES},
                 {"STARTTLS", SMTPE_EXT_STARTTLS}, {"CHUNKING", SMTPE_EXT_CHUNKING},
                 {"BINARYMIME", SMTPE_EXT_BINARYMIME}, {"DSN", SMTPE_EXT_DSN},
                 {"REQUIRETLS", SMTPE_EXT_REQUIRETLS}, {"MT-PRIORITY", SMTPE_EXT_MT_PRIORITY},
                 {"DELIVERBY", SMTPE_EXT_DELIVERBY}, {"XCLIENT", SMTPE_EXT_XCLIENT},
                 {"XFORWARD", SMTPE_EXT_XFORWARD}};
    size_t k = 0;
    while (k < n && t[k] != ' ' && t[k] != '=')
        k++;
    const uint8_t *v = t + k;
    size_t vn = n - k;
    while (vn > 0 && (v[0] == ' ' || v[0] == '=')) {
        v++;
        vn--;
    }
    if (k == 4 && ci_eq(t, 4, "AUTH")) {
        if (m->auth_len == 0 || (n > 4 && t[4] == ' ')) /* "AUTH" beats the old "AUTH=" */
            m->auth_len = keep_line(m->auth, v, vn);
        m_auth_offered(r, v, vn);
        return;
    }
    for (size_t i = 0; i < NELEM(known); i++) {
        if (!ci_eq(t, k, known[i].name))
            continue;
        m->ext |= known[i].bit;
        if (known[i].bit == SMTPE_EXT_SIZE) {
            size_t dn = vn;
            uint64_t lim = 0;
            while (dn > 0 && v[dn - 1] == ' ')
                dn--;
            if (dn > 0 && parse_u64(v, dn, &lim) == 0)
                m->size_limit = lim;
        } else if (known[i].bit == SMTPE_EXT_DELIVERBY) {
            uint64_t min = 0;
            if (vn > 0 && parse_u64(v, vn, &min) == 0 && min < 1000000000)
                m->deliverby_min = (int64_t)min;
        } else if (known[i].bit == SMTPE_EXT_XCLIENT) {
            m->xclient_len = keep_line(m->xclient, v, vn);
        } else if (known[i].bit == SMTPE_EXT_XFORWARD) {
            m->xforward_len = keep_line(m->xforward, v, vn);
        }
        return;
    }
}

/* ---- outcomes the model decides ---- */

static int outcome_of_code(unsigned code)
{
    return code / 100 == 2 ? SMTPE_OUTCOME_DELIVERED
           : code / 100 == 5 ? SMTPE_OUTCOME_PERMANENT
                             : SMTPE_OUTCOME_TEMPORARY;
}

static void m_decide(run *r, size_t i, unsigned code, int outcome, int closing)
{
    mtxn *t = &r->m.t;
    if (t->ftx < 0 || i >= MAXR)
        return;
    mdec *d = &r->tx[t->ftx].md[i];
    if (d->set)
        return;
    d->set = 1;
    d->code = code;
    d->outcome = outcome;
    d->closing = closing;
}

static size_t ftx_rcpts(const run *r, int ftx)
{
    return ftx >= 0 ? r->fc->tx[ftx].t.rcpt_count : 0;
}

static void m_decide_all(run *r, int accepted_only, unsigned code, int outcome, int closing)
{
    mtxn *t = &r->m.t;
    size_t n = ftx_rcpts(r, t->ftx);
    for (size_t i = 0; i < n && i < MAXR; i++)
        if (!accepted_only || t->acc[i])
            m_decide(r, i, code, outcome, closing);
}

/* The session ends (reason SMTPE_CLOSE_*; code the reply's, 0 for none). */
static void m_close(run *r, int reason, unsigned code)
{
    model *m = &r->m;
    if (m->closed)
        return;
    m->closed = 1;
    m->close_reason = reason;
    m->close_code = code;
    TRACE("  [%s] model: session ends, reason %d code %u\n", r->split ? "split" : "whole",
          reason, code);
    if (code) {
        int outcome = 0;
        if (reason == SMTPE_CLOSE_SERVER_421 || reason == SMTPE_CLOSE_TLS_REQUIRED ||
            reason == SMTPE_CLOSE_AUTH_FAILED)
            outcome = SMTPE_OUTCOME_TEMPORARY;
        if (m->t.active || (r->cur >= 0 && !r->tx[r->cur].done))
            m_decide_all(r, 0, code, outcome, 1);
    }
}

/* The engine ended the session for a host-side reason (lost, timeout, abort, refused
 * content): the model stops reading replies; what it had decided stays. */
static void m_engine_closed(run *r, int reason)
{
    model *m = &r->m;
    if (m->closed)
        return;
    m->closed = 1;
    m->close_reason = reason;
    m->close_code = 0;
}

static void m_txn_fail(model *m)
{
    m->t.failed = 1;
    m->need_rset = 1;
}

static void m_txn_check_done(run *r)
{
    mtxn *t = &r->m.t;
    if (!t->active || t->outstanding > 0 || t->lone_due)
        return;
    if (!t->failed && !t->end_replied)
        return;
    t->active = 0;
    t->ended = 1;
}

/* ---- replies ---- */

static void m_end_reply(run *r, unsigned code)
{
    model *m = &r->m;
    mtxn *t = &m->t;
    const smtpe_client_config *k = CFG(r);
    if (t->end_left == 0)
        t->end_left = k->lmtp && t->n_acc > 0 ? (unsigned)t->n_acc : 1;
    if (t->failed) {
    } else if (!k->lmtp) {
        m_decide_all(r, 1, code, outcome_of_code(code), 0);
    } else {
        size_t n = ftx_rcpts(r, t->ftx);
        while (t->lmtp_cursor < n && !t->acc[t->lmtp_cursor])
            t->lmtp_cursor++;
        if (t->lmtp_cursor < n)
            m_decide(r, t->lmtp_cursor, code, outcome_of_code(code), 0);
        t->lmtp_cursor++;
    }
    if (--t->end_left > 0)
        return;
    m->unanswered -= m->h[m->head].len;
    m->head++;
    t->outstanding--;
    t->bdat_out = 0;
    t->end_replied = 1;
    m->need_rset = t->failed;
    m_txn_check_done(r);
}

static void m_txn_reply(run *r, const mcmd *c, unsigned code)
{
    model *m = &r->m;
    mtxn *t = &m->t;
    switch (c->kind) {
    case MK_RSET:
        if (code / 100 == 2)
            m->need_rset = 0;
        else
            m_close(r, SMTPE_CLOSE_REFUSED, code);
        break;
    case MK_MAIL:
        if (code / 100 == 2) {
            t->mail_ok = 1;
        } else {
            m_decide_all(r, 0, code, outcome_of_code(code), 0);
            m_txn_fail(m);
        }
        break;
    case MK_RCPT:
        t->rcpt_replied++;
        if (!t->mail_ok)
            break;
        if (code / 100 == 2) {
            if (c->arg < MAXR)
                t->acc[c->arg] = 1;
            t->n_acc++;
        } else {
            m_decide(r, c->arg, code, outcome_of_code(code), 0);
        }
        if (t->rcpt_replied == ftx_rcpts(r, t->ftx) && t->n_acc == 0)
            m_txn_fail(m);
        break;
    case MK_DATA:
        if (code == 354) {
            if (t->failed || t->n_acc == 0) {
                t->lone_due = 1;
                m->mode = MC_LONE;
                if (CFG(r)->lmtp) /* the engine gives up: LMTP's replies to it are unknown */
                    m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
                break;
            }
            m->mode = MC_DATA;
            smtpe__data_start(&m->dd, SMTPE_LINE_ENDING_REFUSE, 0, 1);
            break;
        }
        if (code / 100 == 2) {
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
            break;
        }
        if (!t->failed)
            m_decide_all(r, 1, code, outcome_of_code(code), 0);
        m_txn_fail(m);
        break;
    case MK_DOT_VOID:
        m->need_rset = 0;
        break;
    case MK_BDAT:
        t->bdat_out = 0;
        if (code / 100 == 2 || t->failed)
            break;
        m_decide_all(r, 1, code, outcome_of_code(code), 0);
        m_txn_fail(m);
        break;
    default:
        break;
    }
}

/* A 334 to an AUTH line (RFC 4954 §4): the line the exchange calls for next, or, for a
 * host-run mechanism, the challenge decoded for the host. */
static void m_auth_334(run *r)
{
    model *m = &r->m;
    const smtpe_client_config *k = CFG(r);
    fz_buf msg = {0};
    m->auth_expect.len = 0;
    m->auth_expect_set = 1;
    switch (m->auth_state) {
    case AU_CMD:
        sasl_message(r, m->auth_mech, &msg);
        put_b64(&m->auth_expect, msg.p, msg.len);
        fz_free(&msg);
        m->auth_state = AU_CREDS;
        break;
    case AU_USER: /* LOGIN: whatever the prompt says */
        put_b64(&m->auth_expect, (const uint8_t *)k->auth_user, strlen(k->auth_user));
        m->auth_state = AU_PASS;
        break;
    case AU_PASS:
        put_b64(&m->auth_expect, (const uint8_t *)k->auth_password, strlen(k->auth_password));
        m->auth_state = AU_CREDS;
        break;
    case AU_CREDS: /* an error challenge: XOAUTH2 answers empty, OAUTHBEARER ^A (RFC 7628) */
        if (m->auth_mech == SMTPE_SASL_OAUTHBEARER) {
            put_str(&m->auth_expect, "AQ==");
        } else if (m->auth_mech != SMTPE_SASL_XOAUTH2) {
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
            return;
        }
        m->auth_state = AU_ERROR;
        break;
    case AU_OTHER: {
        size_t tl = m->rp.len > 4 ? m->rp.len - 4 : 0; /* the text after "334 " */
        uint8_t *tmp = malloc(tl + 1);
        if (!tmp)
            abort();
        size_t dn = smtpe__base64_decode(m->rp.line + 4, tl, tmp);
        if (dn != SMTPE__BASE64_BAD) {
            m->chal.len = 0;
            fz_put(&m->chal, tmp, dn);
            m->auth_step++;
            m->auth_host = 1;
            m->auth_expect_set = 0;
        }
        free(tmp);
        if (dn == SMTPE__BASE64_BAD)
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
        return;
    }
    default:
        m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
        return;
    }
    put_str(&m->auth_expect, "\r\n");
}

static void m_auth_reply(run *r, unsigned code)
{
    model *m = &r->m;
    if (code == 334) {
        m_auth_334(r);
    } else if (code / 100 == 2) {
        m->authenticated = 1;
        m->auth_state = AU_IDLE;
        m->auth_expect_set = 0;
        m_setup_next(r);
    } else {
        m_close(r, SMTPE_CLOSE_AUTH_FAILED, code);
    }
}

static void m_reply(run *r)
{
    model *m = &r->m;
    unsigned code = m->rp.code;
    if (m->closed)
        return;
    TRACE("  [%s] model: reply %u (%zu outstanding)\n", r->split ? "split" : "whole", code,
          m_outstanding(m));
    if (m->reply_nh <= m->head) { /* nothing was handed out when the reply began */
        m_close(r, code == 421 ? SMTPE_CLOSE_SERVER_421 : SMTPE_CLOSE_PROTOCOL_ERROR,
                code == 421 ? code : 0);
        return;
    }
    mcmd c = m->h[m->head];
    if (code == 421 && c.kind != MK_QUIT && c.kind != MK_DOT && c.kind != MK_BDAT_LAST) {
        m_close(r, SMTPE_CLOSE_SERVER_421, code); /* RFC 5321 §3.8: at any time */
        return;
    }
    if (code == 421 && (c.kind == MK_DOT || c.kind == MK_BDAT_LAST) &&
        m->reply_acked < r->tx[m->t.ftx].end_wire) {
        /* the end not all written: not the verdict on it but the session's 421 (the end was
         * handed out, so what was not decided is unknown) */
        m_close(r, SMTPE_CLOSE_SERVER_421, code);
        return;
    }
    if (code / 100 == 3 && !(c.kind == MK_DATA && code == 354) &&
        !((c.kind == MK_AUTH || c.kind == MK_AUTH_RESP) && code == 334)) {
        m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
        return;
    }
    if (c.kind == MK_DOT || c.kind == MK_BDAT_LAST) {
        if (code == 421) {
            /* the server's own verdict on the end: without LMTP on every accepted recipient;
             * under LMTP on this one, and the accepted ones after it get none: unknown */
            mtxn *t = &m->t;
            if (!CFG(r)->lmtp && !t->failed) {
                m_decide_all(r, 1, code, SMTPE_OUTCOME_TEMPORARY, 0);
            } else if (CFG(r)->lmtp && !t->failed) {
                m_end_reply(r, code);
                m_decide_all(r, 1, 0, SMTPE_OUTCOME_UNKNOWN, 1);
            }
            m_close(r, SMTPE_CLOSE_SERVER_421, code);
            return;
        }
        m_end_reply(r, code);
        return;
    }
    m->unanswered -= c.len;
    m->head++;
    const smtpe_client_config *k = CFG(r);
    switch (c.kind) {
    case MK_GREETING:
        if (code == 220) {
            m->greeted = 1;
            m->next = NX_EHLO;
        } else if (code / 100 == 2) {
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
        } else {
            m_close(r, SMTPE_CLOSE_REFUSED, code);
        }
        break;
    case MK_EHLO:
    case MK_HELO:
        if (code / 100 == 2) {
            if (c.kind == MK_HELO)
                m_caps_reset(m);
            m->esmtp = c.kind == MK_EHLO;
            m_setup_next(r);
        } else if (c.kind == MK_EHLO && !k->lmtp && (code == 500 || code == 502)) {
            m->next = NX_HELO;
        } else {
            m_close(r, SMTPE_CLOSE_REFUSED, code);
        }
        break;
    case MK_STARTTLS:
        if (code / 100 == 2 && code != 220) { /* RFC 3207 §4: 220 or a refusal */
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
        } else if (code == 220) {
            /* RFC 3207 §4.2: octets after the 220 and before the handshake end the session,
             * whatever the split (the host feeds what it has read) */
            m->tls_wait = 1;
        } else if (k->tls == SMTPE_TLS_REQUIRED) {
            m_close(r, SMTPE_CLOSE_TLS_REQUIRED, code);
        } else {
            m_setup_next(r);
        }
        break;
    case MK_XCLIENT:
        if (code / 100 == 2)
            m->next = NX_EHLO;
        else
            m_close(r, SMTPE_CLOSE_REFUSED, code);
        break;
    case MK_AUTH:
    case MK_AUTH_RESP:
        m_auth_reply(r, code);
        break;
    case MK_QUIT:
        m_close(r, SMTPE_CLOSE_QUIT, code);
        break;
    default:
        m->t.outstanding--;
        m_txn_reply(r, &c, code);
        m_txn_check_done(r);
        break;
    }
}

/* A line of a reply completed (reply.h's order of checks is not needed: any error ends the
 * session at once): the EHLO keywords. */
static void m_line_done(run *r)
{
    model *m = &r->m;
    mrp *p = &m->rp;
    size_t tl = p->len > 4 ? p->len - 4 : 0;
    p->lines++;
    /* EHLO keyword lines: lines 2..n of the reply to EHLO/LHLO */
    if (m_outstanding(m) > 0 && m->h[m->head].kind == MK_EHLO) {
        if (p->lines == 1)
            m_caps_reset(m);
        else if (p->code / 100 == 2)
            m_keyword(r, p->line + 4, tl);
    }
}

/* Feeds one octet of the server's stream to the reply parser; returns 1 when a reply is
 * complete, -1 on an error, 0 otherwise. */
static int mrp_octet(mrp *p, uint8_t c)
{
    if (p->err)
        return -1;
    if (p->cr) {
        if (c != '\n')
            return p->err = -1;
        p->cr = 0;
        if (++p->total > p->max_total)
            return p->err = -1;
        return 2; /* line complete */
    }
    if (c == '\n' || c == 0)
        return p->err = -1;
    if (++p->total > p->max_total)
        return p->err = -1;
    if (c == '\r') {
        if (p->len < 3)
            return p->err = -1;
        p->cr = 1;
        return 0;
    }
    if (p->len < 3) {
        static const uint8_t lo[3] = {'2', '0', '0'}, hi[3] = {'5', '5', '9'};
        if (c < lo[p->len] || c > hi[p->len])
            return p->err = -1;
        if (p->lines > 0) {
            unsigned d = p->len == 0 ? p->code / 100 : p->len == 1 ? p->code / 10 % 10
                                                                   : p->code % 10;
            if (c != '0' + d)
                return p->err = -1;
        }
    } else if (p->len == 3) {
        if (c != ' ' && c != '-')
            return p->err = -1;
    }
    if (p->len >= p->cap)
        return p->err = -1;
    p->line[p->len++] = c;
    return 0;
}

static void mrp_start(mrp *p)
{
    p->len = p->total = 0;
    p->code = p->lines = 0;
    p->cr = p->err = 0;
}

/* The server's octets buf[0..used) were consumed by one smtpe_client_recv call. */
static void m_server(run *r, const uint8_t *buf, size_t used)
{
    model *m = &r->m;
    for (size_t i = 0; i < used; i++) {
        if (m->closed)
            return;
        if (m->tls_wait) { /* RFC 3207 §4.2: nothing may come before the handshake */
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
            return;
        }
        if (m->auth_host) { /* the engine waits for the host's AUTH response */
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
            return;
        }
        if (m->rp.total == 0) {
            m->reply_nh = m->nh;
            m->reply_acked = r->acked;
        }
        int k = mrp_octet(&m->rp, buf[i]);
        if (k < 0) {
            m_close(r, SMTPE_CLOSE_PROTOCOL_ERROR, 0);
            return;
        }
        if (k != 2)
            continue;
        mrp *p = &m->rp;
        if (p->lines == 0)
            p->code = (unsigned)(p->line[0] - '0') * 100 + (unsigned)(p->line[1] - '0') * 10 +
                      (unsigned)(p->line[2] - '0');
        int last = p->len == 3 || p->line[3] == ' ';
        m_line_done(r);
        if (!last) {
            p->len = 0;
            continue;
        }
        m_reply(r);
        mrp_start(p);
    }
}

/* ---- the client's stream ---- */

static void m_fail(run *r, const char *why, const uint8_t *l, size_t n)
    __attribute__((noreturn));
static void m_fail(run *r, const char *why, const uint8_t *l, size_t n)
{
    fprintf(stderr, "[%s run] client line at wire offset %llu: \"", r->split ? "split" : "whole",
            (unsigned long long)r->m.wire);
    for (size_t i = 0; i < n && i < 200; i++)
        fprintf(stderr, l[i] >= 32 && l[i] < 127 ? "%c" : "\\x%02x", l[i]);
    fprintf(stderr, "\"\n");
    FUZZ_CHECK(0, why);
    abort();
}

/* What the state forbids handing out now (NULL: a command may go, subject to its own rules). */
static const char *m_hold(const run *r)
{
    const model *m = &r->m;
    if (m->quit_sent)
        return "client octets after QUIT";
    if (m->tls_wait)
        return "client octets after the STARTTLS 220, before the TLS handshake";
    for (size_t i = m->head; i < m->nh; i++) {
        int k = m->h[i].kind;
        if (k == MK_GREETING)
            return "a command before the greeting's reply";
        if (k == MK_STARTTLS)
            return "a command after STARTTLS before its reply";
        if (k == MK_DATA)
            return "a command after DATA before its reply (RFC 2920 §3.1)";
        if (k == MK_DOT || k == MK_BDAT_LAST || k == MK_DOT_VOID)
            return "a command after the end of the content before its reply";
        if (k == MK_BDAT)
            return "a command after a BDAT chunk before its reply";
        if (is_setup_kind(k))
            return "a command while a setup command (EHLO/HELO/XCLIENT/AUTH) is outstanding";
    }
    if (m_outstanding(m) > 0 && !m_pipelining(r))
        return "a second command outstanding without PIPELINING";
    return NULL;
}

static void m_check_pipe_room(run *r, size_t len, const uint8_t *l)
{
    model *m = &r->m;
    if (m_outstanding(m) > 0 && m->unanswered + len > CFG(r)->max_unanswered)
        m_fail(r, "more than max_unanswered command octets outstanding (RFC 2920 §3.1 "
                  "deadlock guard)", l, len);
}

/* The MAIL line (RFC 5321 §4.1.1.2 with the extensions' parameters) as a set of words. */
static void expect_mail(run *r, const ftxn *f, fz_buf *e)
{
    const model *m = &r->m;
    const smtpe_client_txn *t = &f->t;
    int dsn = (m->ext & SMTPE_EXT_DSN) != 0;
    put_str(e, "MAIL FROM:<");
    put_str(e, t->reverse_path);
    put_str(e, ">");
    if (t->has_content_info && (m->ext & SMTPE_EXT_SIZE))
        put_fmt(e, " SIZE=%llu", (unsigned long long)f->ref.wire_size);
    int body = t->body;
    if (body == SMTPE_BODY_UNSPECIFIED && t->has_content_info &&
        (f->ref.flags & SMTPE_CONTENT_8BIT))
        body = SMTPE_BODY_8BITMIME;
    if (body == SMTPE_BODY_7BIT && (m->ext & SMTPE_EXT_8BITMIME))
        put_str(e, " BODY=7BIT");
    else if (body == SMTPE_BODY_8BITMIME)
        put_str(e, " BODY=8BITMIME");
    else if (body == SMTPE_BODY_BINARYMIME)
        put_str(e, " BODY=BINARYMIME");
    if (t->smtputf8 || f->utf8)
        put_str(e, " SMTPUTF8");
    if (dsn && t->ret == SMTPE_RET_FULL)
        put_str(e, " RET=FULL");
    else if (dsn && t->ret == SMTPE_RET_HDRS)
        put_str(e, " RET=HDRS");
    if (dsn && t->envid) {
        put_str(e, " ENVID=");
        ref_xtext(e, (const uint8_t *)t->envid, strlen(t->envid));
    }
    if (t->requiretls)
        put_str(e, " REQUIRETLS");
    if (t->has_mt_priority && (m->ext & SMTPE_EXT_MT_PRIORITY))
        put_fmt(e, " MT-PRIORITY=%d", t->mt_priority);
    if (t->by_mode && (m->ext & SMTPE_EXT_DELIVERBY))
        put_fmt(e, " BY=%lld;%c", (long long)t->by_time, t->by_mode);
    put_str(e, "\r\n");
}

static void expect_rcpt(run *r, const smtpe_client_rcpt *rc, fz_buf *e)
{
    static const char *const names[] = {"NEVER", "SUCCESS", "FAILURE", "DELAY"};
    int dsn = (r->m.ext & SMTPE_EXT_DSN) != 0;
    put_str(e, "RCPT TO:<");
    put_str(e, rc->forward_path);
    put_str(e, ">");
    if (dsn && rc->notify) {
        int first = 1;
        put_str(e, " NOTIFY=");
        for (unsigned b = 0; b < 4; b++)
            if (rc->notify & (1u << b)) {
                if (!first)
                    put_str(e, ",");
                put_str(e, names[b]);
                first = 0;
            }
    }
    if (dsn && rc->orcpt) {
        const char *semi = strchr(rc->orcpt, ';');
        put_str(e, " ORCPT=");
        fz_put(e, rc->orcpt, (size_t)(semi - rc->orcpt) + 1);
        ref_xtext(e, (const uint8_t *)semi + 1, strlen(semi + 1));
    }
    put_str(e, "\r\n");
}

/* Compares a command line with the expected one, its parameters as a set of words. */
static int same_words(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    size_t wa = 0, wb = 0;
    if (an < 2 || bn < 2)
        return 0;
    an -= 2;
    bn -= 2; /* the CRLFs */
    /* the first word (up to the first space after ">") must be equal */
    const uint8_t *ga = memchr(a, '>', an), *gb = memchr(b, '>', bn);
    if (!ga || !gb)
        return fz_eq(a, an, b, bn);
    size_t pa = (size_t)(ga - a) + 1, pb = (size_t)(gb - b) + 1;
    if (!fz_eq(a, pa, b, pb))
        return 0;
    for (size_t i = pa; i < an; i++)
        wa += a[i] == ' ';
    for (size_t i = pb; i < bn; i++)
        wb += b[i] == ' ';
    if (wa != wb)
        return 0;
    /* every word of a occurs in b (words are distinct keywords) */
    size_t i = pa;
    while (i < an) {
        size_t j = i + 1;
        while (j < an && a[j] != ' ')
            j++;
        int found = 0;
        size_t x = pb;
        while (x < bn) {
            size_t y = x + 1;
            while (y < bn && b[y] != ' ')
                y++;
            if (fz_eq(a + i, j - i, b + x, y - x))
                found = 1;
            x = y;
        }
        if (!found)
            return 0;
        i = j;
    }
    return 1;
}

/* 1 if the model expects the transaction refused before MAIL (the refusals smtpe.h lists for
 * smtpe_client_txn, and the engine's for BY=R without DELIVERBY). */
static int m_refused_before_mail(const run *r, const ftxn *f)
{
    const model *m = &r->m;
    const smtpe_client_txn *t = &f->t;
    unsigned ext = m->ext;
    unsigned flags = t->has_content_info ? t->content.flags : 0;
    int body = t->body;
    if (t->requiretls && (!m->tls || !(ext & SMTPE_EXT_REQUIRETLS)))
        return 1;
    if ((t->smtputf8 || f->utf8) && !(ext & SMTPE_EXT_SMTPUTF8))
        return 1;
    if (body == SMTPE_BODY_BINARYMIME &&
        !(CFG(r)->chunking && (ext & SMTPE_EXT_CHUNKING) && (ext & SMTPE_EXT_BINARYMIME)))
        return 1;
    if (body == SMTPE_BODY_UNSPECIFIED && (flags & SMTPE_CONTENT_8BIT))
        body = SMTPE_BODY_8BITMIME;
    if (body == SMTPE_BODY_7BIT && (flags & SMTPE_CONTENT_8BIT))
        return 1;
    if ((body == SMTPE_BODY_8BITMIME || (flags & SMTPE_CONTENT_8BIT)) &&
        body != SMTPE_BODY_BINARYMIME && !(ext & SMTPE_EXT_8BITMIME))
        return 1;
    int bdat = CFG(r)->chunking && (ext & SMTPE_EXT_CHUNKING);
    if (body != SMTPE_BODY_BINARYMIME) {
        if (flags & SMTPE_CONTENT_NUL)
            return 1;
        if (CFG(r)->line_ending == SMTPE_LINE_ENDING_REFUSE &&
            (flags & (SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF)))
            return 1;
        if (!bdat && (flags & SMTPE_CONTENT_LONG_LINE))
            return 1;
    }
    if (t->has_content_info && (ext & SMTPE_EXT_SIZE) && m->size_limit > 0 &&
        t->content.wire_size > m->size_limit)
        return 1;
    if (t->by_mode == 'R' && !(ext & SMTPE_EXT_DELIVERBY))
        return 1;
    return 0;
}

/* Whether the engine must refuse the content mid-stream (no scan given): what its encoder
 * stops at for this message. */
static int m_refuse_mid(const run *r, const ftxn *f, int bdat)
{
    const smtpe_client_txn *t = &f->t;
    int body = t->body;
    if (t->has_content_info || body == SMTPE_BODY_BINARYMIME)
        return 0;
    unsigned mask = SMTPE_CONTENT_NUL;
    if (body != SMTPE_BODY_8BITMIME)
        mask |= SMTPE_CONTENT_8BIT;
    if (!bdat)
        mask |= SMTPE_CONTENT_LONG_LINE;
    if (CFG(r)->line_ending == SMTPE_LINE_ENDING_REFUSE)
        mask |= SMTPE_CONTENT_BARE_CR | SMTPE_CONTENT_BARE_LF;
    return (f->ref.flags & mask) != 0;
}

/* A transaction's first line (RSET, XFORWARD or MAIL) starts the model's wire transaction. */
static void m_txn_begin(run *r, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    if (m->t.active)
        return;
    if (r->cur < 0)
        m_fail(r, "a transaction command with no transaction submitted", l, n);
    rtxn *rt = &r->tx[r->cur];
    if (rt->mail_on_wire || rt->done || rt->before_mail)
        m_fail(r, "a second transaction on the wire for one submitted", l, n);
    if (!m->ready)
        m_fail(r, "a transaction command before setup is done (EHLO/HELO reply, STARTTLS, "
                  "AUTH)", l, n);
    const ftxn *f = &r->fc->tx[r->cur];
    if (m_refused_before_mail(r, f))
        m_fail(r, "a transaction on the wire that must be refused before MAIL", l, n);
    memset(&m->t, 0, sizeof m->t);
    m->t.active = 1;
    m->t.ftx = r->cur;
    m->t.bdat = CFG(r)->chunking && (m->ext & SMTPE_EXT_CHUNKING);
    m->t.rset_due = m->need_rset;
    m->wtx++;
    rt->mail_on_wire = 1;
    rt->bdat = m->t.bdat;
    rt->refuse_mid = m_refuse_mid(r, f, m->t.bdat);
}

/* An XCLIENT line (Postfix XCLIENT_README): each attribute configured, offered, sent once over
 * all the lines, its value xtext-encoded; done when every offered one went. */
static void m_xclient_line(run *r, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    const smtpe_client_config *k = CFG(r);
    size_t i = 7, got = 0;
    while (i + 2 < n) {
        size_t j = i + 1, eq = i + 1, a = 0;
        while (j < n - 2 && l[j] != ' ')
            j++;
        while (eq < j && l[eq] != '=')
            eq++;
        if (eq == j || !list_has(m->xclient, m->xclient_len, l + i + 1, eq - i - 1))
            m_fail(r, "an XCLIENT attribute the server did not offer", l, n);
        while (a < k->xclient_count &&
               !(k->xclient[a].keyword.len == eq - i - 1 &&
                 memcmp(k->xclient[a].keyword.ptr, l + i + 1, eq - i - 1) == 0))
            a++;
        if (a == k->xclient_count || (m->xclient_sent & (1u << a)))
            m_fail(r, "an XCLIENT attribute not configured, or sent twice", l, n);
        fz_buf v = {0};
        ref_xtext(&v, k->xclient[a].value.ptr, k->xclient[a].value.len);
        if (!fz_eq(l + eq + 1, j - eq - 1, v.p, v.len))
            m_fail(r, "an XCLIENT value is not the configured one xtext-encoded", l, n);
        fz_free(&v);
        m->xclient_sent |= 1u << a;
        got++;
        i = j;
    }
    if (got == 0)
        m_fail(r, "an XCLIENT line without attributes", l, n);
    m->xclient_done = 1;
    for (size_t a = 0; a < k->xclient_count; a++)
        if (!(m->xclient_sent & (1u << a)) &&
            list_has(m->xclient, m->xclient_len, k->xclient[a].keyword.ptr,
                     k->xclient[a].keyword.len))
            m->xclient_done = 0;
}

static void m_setup_line(run *r, int kind, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    const smtpe_client_config *k = CFG(r);
    if (m_outstanding(m) > 0)
        m_fail(r, "a setup command while another command is outstanding", l, n);
    int want = kind == MK_EHLO ? NX_EHLO : kind == MK_HELO ? NX_HELO
               : kind == MK_STARTTLS ? NX_STARTTLS : kind == MK_XCLIENT ? NX_XCLIENT : NX_AUTH;
    if (m->next != want)
        m_fail(r, "a setup command other than the one the state calls for", l, n);
    m->next = NX_NONE;
    if (kind == MK_EHLO) {
        fz_buf e = {0};
        put_str(&e, k->lmtp ? "LHLO " : "EHLO ");
        put_str(&e, k->helo_name);
        put_str(&e, "\r\n");
        if (!fz_eq(l, n, e.p, e.len))
            m_fail(r, "EHLO/LHLO line is not EHLO (LHLO under LMTP) and the helo_name", l, n);
        fz_free(&e);
    } else if (kind == MK_HELO) {
        if (k->lmtp)
            m_fail(r, "HELO under LMTP (RFC 2033 has no fallback)", l, n);
        if (n != 5 + strlen(k->helo_name) + 2 || memcmp(l + 5, k->helo_name, n - 7))
            m_fail(r, "HELO line is not HELO and the helo_name", l, n);
    } else if (kind == MK_STARTTLS) {
        m->tried_starttls = 1;
    } else if (kind == MK_XCLIENT) {
        m_xclient_line(r, l, n);
    }
}

static void m_auth_line(run *r, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    int first = m->next == NX_AUTH;
    if (m->closed)
        return;
    if (m_outstanding(m) > 0)
        m_fail(r, "an AUTH line while another command is outstanding", l, n);
    if (!m->tls && !CFG(r)->auth_plaintext_ok)
        m_fail(r, "an AUTH line in clear without auth_plaintext_ok", l, n);
    if (!m->tls && CFG(r)->tls == SMTPE_TLS_REQUIRED)
        m_fail(r, "an AUTH line in clear under tls=REQUIRED", l, n);
    if (!m->auth_expect_set)
        m_fail(r, "an AUTH line the exchange does not call for", l, n);
    if (!fz_eq(l, n, m->auth_expect.p, m->auth_expect.len)) {
        fprintf(stderr, "expected AUTH line: \"%.*s\"\n", (int)m->auth_expect.len,
                (const char *)m->auth_expect.p);
        m_fail(r, "AUTH line differs from the mechanism's (RFC 4954 §4, RFC 4616, RFC 7628)", l,
               n);
    }
    m->auth_expect_set = 0;
    if (first)
        m->next = NX_NONE;
    m_push(m, first ? MK_AUTH : MK_AUTH_RESP, 0, n);
}

/* One complete client line (CRLF included) in command mode. */
/* "BDAT n[ LAST]" CRLF (RFC 3030 §2): 1 with the chunk size and LAST, 0 if malformed. */
static int bdat_line(const uint8_t *l, size_t n, uint64_t *sz, int *last)
{
    size_t i = 5;
    if (n < 8 || memcmp(l, "BDAT ", 5) != 0)
        return 0;
    while (i < n - 2 && l[i] >= '0' && l[i] <= '9')
        i++;
    if (parse_u64(l + 5, i - 5, sz) != 0 || (l[5] == '0' && i > 6))
        return 0;
    *last = fz_eq(l + i, n - i, " LAST\r\n", 7);
    return *last || fz_eq(l + i, n - i, "\r\n", 2);
}

/* The command a client line is, by its verb as the engine writes it; -1 for none. */
static int line_kind(const uint8_t *l, size_t n)
{
    static const struct {
        const char *s;
        int whole; /* the line is exactly s (else s starts it) */
        int kind;
    } verbs[] = {{"EHLO ", 0, MK_EHLO},        {"LHLO ", 0, MK_EHLO},
                 {"HELO ", 0, MK_HELO},        {"STARTTLS\r\n", 1, MK_STARTTLS},
                 {"XCLIENT ", 0, MK_XCLIENT},  {"AUTH ", 0, MK_AUTH},
                 {"RSET\r\n", 1, MK_RSET},     {"XFORWARD ", 0, MK_XFORWARD},
                 {"MAIL FROM:<", 0, MK_MAIL},  {"RCPT TO:<", 0, MK_RCPT},
                 {"DATA\r\n", 1, MK_DATA},     {"BDAT ", 0, MK_BDAT},
                 {"QUIT\r\n", 1, MK_QUIT}};
    for (size_t i = 0; i < NELEM(verbs); i++) {
        size_t vn = strlen(verbs[i].s);
        if (verbs[i].whole ? fz_eq(l, n, verbs[i].s, vn) : n >= vn && !memcmp(l, verbs[i].s, vn))
            return verbs[i].kind;
    }
    return -1;
}

/* BDAT n [LAST] and its chunk (RFC 3030 §2): one at a time, none after a refused one or after
 * LAST. */
static void m_bdat(run *r, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    mtxn *t = &m->t;
    const ftxn *f = &r->fc->tx[t->ftx];
    uint64_t sz = 0;
    int last = 0;
    if (!t->bdat || t->rcpt_sent < f->t.rcpt_count)
        m_fail(r, "BDAT without CHUNKING or before every RCPT", l, n);
    if (t->failed_flushed)
        m_fail(r, "BDAT after the transaction failed (RFC 3030 §2: no BDAT after a refused "
                  "one)", l, n);
    if (t->lasts)
        m_fail(r, "BDAT after BDAT LAST", l, n);
    if (t->bdat_out)
        m_fail(r, "BDAT while the previous chunk awaits its reply", l, n);
    if (!bdat_line(l, n, &sz, &last))
        m_fail(r, "BDAT line is not \"BDAT n [LAST]\"", l, n);
    m_check_pipe_room(r, n, l);
    t->bdat_out = 1;
    if (last) {
        t->lasts++;
        t->end_sent = 1;
    }
    m_push(m, last ? MK_BDAT_LAST : MK_BDAT, 0, n);
    m->bdat_left = sz;
    m->bdat_is_last = last;
    m->mode = sz > 0 ? MC_BDAT : MC_LINE;
    if (sz == 0 && last) {
        r->tx[t->ftx].end_seen = 1;
        r->tx[t->ftx].end_wire = m->wire;
    }
}

/* A transaction's command (RFC 5321 §3.3 with RFC 2920's pipelining, XFORWARD, BDAT). */
static void m_txn_line(run *r, int kind, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    if (!m->ready)
        m_fail(r, "a transaction command before setup is done", l, n);
    m_check_pipe_room(r, kind == MK_BDAT ? 0 : n, l);
    if (kind == MK_RSET || kind == MK_XFORWARD || kind == MK_MAIL)
        m_txn_begin(r, l, n);
    mtxn *t = &m->t;
    if (!t->active && t->ended && !t->ended_flushed && kind != MK_RSET && kind != MK_XFORWARD &&
        kind != MK_MAIL && r->cur == t->ftx) {
        /* queued before the replies that ended it were read, handed out after */
        t->active = 1;
        t->ended = 0;
    }
    if (!t->active)
        m_fail(r, "a transaction command outside a transaction", l, n);
    const ftxn *f = &r->fc->tx[t->ftx];
    fz_buf e = {0};
    switch (kind) {
    case MK_RSET:
        if (t->mail_sent || !t->rset_due || t->rset_sent)
            m_fail(r, "RSET where none is due (only before the MAIL after a failed "
                      "transaction)", l, n);
        t->rset_sent = 1;
        break;
    case MK_XFORWARD:
        if (t->mail_sent || !(m->ext & SMTPE_EXT_XFORWARD))
            m_fail(r, "XFORWARD after MAIL or not offered", l, n);
        if (t->rset_due && !t->rset_sent)
            m_fail(r, "XFORWARD before the RSET that is due", l, n);
        break;
    case MK_MAIL:
        if (t->mail_sent)
            m_fail(r, "a second MAIL in one transaction", l, n);
        if (t->rset_due && !t->rset_sent)
            m_fail(r, "MAIL without the RSET due after a failed transaction", l, n);
        expect_mail(r, f, &e);
        if (!same_words(l, n, e.p, e.len)) {
            fprintf(stderr, "expected: %.*s", (int)e.len, (const char *)e.p);
            m_fail(r, "MAIL line is not the transaction's reverse-path and parameters", l, n);
        }
        t->mail_sent = 1;
        break;
    case MK_RCPT:
        if (!t->mail_sent || t->rcpt_sent >= f->t.rcpt_count || t->failed_flushed)
            m_fail(r, "RCPT before MAIL, past the last recipient or after the transaction "
                      "failed", l, n);
        if (!m_pipelining(r) && !t->mail_ok)
            m_fail(r, "RCPT before MAIL's 2xx without PIPELINING", l, n);
        expect_rcpt(r, &f->t.rcpts[t->rcpt_sent], &e);
        if (!same_words(l, n, e.p, e.len)) {
            fprintf(stderr, "expected: %.*s", (int)e.len, (const char *)e.p);
            m_fail(r, "RCPT line is not the next forward-path and its parameters", l, n);
        }
        fz_free(&e);
        m_push(m, kind, t->rcpt_sent, n);
        t->rcpt_sent++;
        return;
    case MK_DATA:
        if (t->bdat || t->data_sent || t->rcpt_sent < f->t.rcpt_count || t->failed_flushed)
            m_fail(r, "DATA under CHUNKING, twice, before every RCPT, or after the "
                      "transaction failed", l, n);
        if (!m_pipelining(r) && t->n_acc == 0)
            m_fail(r, "DATA without PIPELINING before a recipient was accepted", l, n);
        t->data_sent = 1;
        break;
    default: /* BDAT */
        m_bdat(r, l, n);
        return;
    }
    fz_free(&e);
    m_push(m, kind, 0, n);
}

/* One complete client line (CRLF included) in command mode. */
static void m_line(run *r, const uint8_t *l, size_t n)
{
    model *m = &r->m;
    if (m->closed) {
        /* octets queued before the close may still come out: only the BDAT framing is
         * followed, so that the chunks are still content */
        uint64_t sz = 0;
        int last = 0;
        if (bdat_line(l, n, &sz, &last) && sz > 0) {
            m->bdat_left = sz;
            m->bdat_is_last = last;
            m->mode = MC_BDAT;
        }
        return;
    }
    for (size_t i = 0; i + 2 < n; i++)
        if (l[i] == '\r' || l[i] == '\n' || l[i] == 0)
            m_fail(r, "a bare CR, bare LF or NUL in a command line", l, n);
    if (m->mode == MC_LONE) {
        if (!fz_eq(l, n, ".\r\n", 3))
            m_fail(r, "after a 354 no recipient needs, something other than a lone dot", l, n);
        m->mode = MC_LINE;
        m->t.lone_due = 0;
        m_push(m, MK_DOT_VOID, 0, 3);
        return;
    }
    if (m->auth_expect_set || m->next == NX_AUTH || m->auth_host) {
        if (m->auth_host)
            m_fail(r, "an AUTH line before the host answered the AUTH_STEP", l, n);
        if (m->quit_sent || m->tls_wait)
            m_fail(r, "an AUTH line after QUIT or STARTTLS", l, n);
        if (n > 4 && memcmp(l, "QUIT", 4) == 0)
            m_fail(r, "QUIT in the middle of the AUTH exchange", l, n);
        m_auth_line(r, l, n);
        return;
    }
    int kind = line_kind(l, n);
    if (kind < 0)
        m_fail(r, "a client line that is no command the state allows", l, n);
    if (m->tls == 0 && CFG(r)->tls == SMTPE_TLS_REQUIRED && kind != MK_EHLO &&
        kind != MK_HELO && kind != MK_STARTTLS && kind != MK_QUIT)
        m_fail(r, "tls=REQUIRED: a command in clear other than EHLO/HELO/STARTTLS/QUIT", l, n);
    if (kind == MK_AUTH)
        m_fail(r, "an AUTH line the setup does not call for", l, n);
    const char *why = m_hold(r);
    if (why)
        m_fail(r, why, l, n);
    if (n > (kind == MK_MAIL || kind == MK_RCPT ? 1012u : 512u))
        m_fail(r, "a command line longer than its limit (RFC 5321 §4.5.3.1.4, RFC 3461 §5)",
               l, n);
    if (is_setup_kind(kind)) {
        m_setup_line(r, kind, l, n);
        m_push(m, kind, 0, n);
    } else if (kind == MK_QUIT) {
        if (m->t.active)
            m_fail(r, "QUIT inside a transaction", l, n);
        if (m_outstanding(m) > 0)
            m_fail(r, "QUIT with commands outstanding", l, n);
        if (!r->quit_asked)
            m_fail(r, "QUIT the host did not ask for", l, n);
        if (!m->ready)
            m_fail(r, "QUIT before setup is done (no refusal ended the session)", l, n);
        m->quit_sent = 1;
        m_push(m, kind, 0, n);
    } else {
        m_txn_line(r, kind, l, n);
    }
}

/* The end of a DATA section: the decoder saw CRLF.CRLF. */
static void m_data_end(run *r)
{
    model *m = &r->m;
    mtxn *t = &m->t;
    rtxn *rt = &r->tx[t->ftx];
    rt->end_seen = 1;
    rt->end_wire = m->wire;
    t->end_sent = 1;
    m->mode = MC_LINE;
    if (m->dd.status != SMTPE_DATA_OK)
        rt->dd_bad = 1;
    m_push(m, MK_DOT, 0, 3);
}

/* The client's octets p[0..n), as they were handed out (send_buf). */
static void m_client(run *r, const uint8_t *p, size_t n)
{
    model *m = &r->m;
    size_t i = 0;
    while (i < n) {
        if (m->mode == MC_PROXY) {
            if (m->proxy_at >= r->fc->proxy_len) {
                m->mode = MC_LINE;
                continue;
            }
            FUZZ_CHECK(p[i] == r->fc->proxy_hdr[m->proxy_at],
                       "the client's first octets are not the PROXY header");
            m->proxy_at++;
            m->wire++;
            i++;
            if (m->proxy_at == r->fc->proxy_len)
                m->mode = MC_LINE;
            continue;
        }
        if (m->mode == MC_DATA) {
            smtpe_span chunk = {NULL, 0};
            int end = 0;
            size_t k = smtpe__data_feed(&m->dd, p + i, n - i, &chunk, &end);
            rtxn *rt = &r->tx[m->t.ftx];
            if (chunk.len)
                fz_put(&rt->wire, chunk.ptr, chunk.len);
            if (m->dd.status != SMTPE_DATA_OK)
                rt->dd_bad = 1;
            i += k;
            m->wire += k;
            if (end)
                m_data_end(r);
            continue;
        }
        if (m->mode == MC_BDAT) {
            size_t k = n - i;
            if (k > m->bdat_left)
                k = (size_t)m->bdat_left;
            if (m->t.active || !m->closed) /* a transaction the model saw begin */
                fz_put(&r->tx[m->t.ftx].wire, p + i, k);
            i += k;
            m->wire += k;
            m->bdat_left -= k;
            if (m->bdat_left == 0) {
                m->mode = MC_LINE;
                if (m->bdat_is_last && (m->t.active || !m->closed)) {
                    r->tx[m->t.ftx].end_seen = 1;
                    r->tx[m->t.ftx].end_wire = m->wire;
                }
            }
            continue;
        }
        /* command lines (MC_LINE, MC_LONE) */
        if (!m->closed && m->line.len == 0) {
            /* the first octet of a line: check what the state lets through */
            if (m->tls_wait)
                m_fail(r, "client octets after the STARTTLS 220, before the TLS handshake", p + i,
                       n - i);
            if (m->mode == MC_LINE && m_outstanding(m) > 0) {
                int hk = m->h[m->nh - 1].kind;
                if (hk == MK_DATA || hk == MK_DOT || hk == MK_BDAT_LAST || hk == MK_STARTTLS ||
                    hk == MK_DOT_VOID || hk == MK_QUIT)
                    m_fail(r, hk == MK_DATA ? "client octets after DATA before its reply"
                              : hk == MK_STARTTLS
                                  ? "client octets after STARTTLS before its reply"
                              : hk == MK_QUIT ? "client octets after QUIT"
                                              : "client octets after the end of the content "
                                                "before its reply",
                           p + i, n - i);
            }
        }
        fz_put_u8(&m->line, p[i]);
        m->wire++;
        i++;
        size_t L = m->line.len;
        if (L >= 2 && m->line.p[L - 2] == '\r' && m->line.p[L - 1] == '\n') {
            m_line(r, m->line.p, L);
            m->line.len = 0;
        } else if (L > 16384 && !m->closed) {
            m_fail(r, "a client line over 16384 octets", m->line.p, 64);
        }
    }
}

/* TLS is up (the host called smtpe_client_tls_started and it returned 0). */
static void m_tls_up(run *r)
{
    model *m = &r->m;
    FUZZ_CHECK(m->line.len == 0 && m->mode == MC_LINE,
               "tls_started accepted in the middle of a client line");
    m->tls = 1;
    m->tls_wait = 0;
    m_caps_reset(m);
    mrp_start(&m->rp);
    if (CFG(r)->tls == SMTPE_TLS_IMPLICIT && !m->greeted && m->nh == 0) {
        m_push(m, MK_GREETING, 0, 0);
    } else {
        m->next = NX_EHLO;
        m->ready = 0;
    }
}

/* The host answered an AUTH_STEP (smtpe_client_auth_response returned 0). */
static void m_auth_answer(run *r, const uint8_t *data, size_t len)
{
    model *m = &r->m;
    const char *mech = CFG(r)->auth_mechanism;
    m->auth_host = 0;
    m->auth_expect.len = 0;
    m->auth_expect_set = 1;
    if (m->auth_step == 0) {
        put_str(&m->auth_expect, "AUTH ");
        put_str(&m->auth_expect, mech);
        if (!data) {
        } else if (len == 0) {
            put_str(&m->auth_expect, " =");
        } else if (5 + strlen(mech) + 1 + SMTPE__BASE64_LEN(len) + 2 <= 512) {
            put_str(&m->auth_expect, " ");
            put_b64(&m->auth_expect, data, len);
        }
    } else if (!data) {
        put_str(&m->auth_expect, "*");
    } else {
        put_b64(&m->auth_expect, data, len);
    }
    put_str(&m->auth_expect, "\r\n");
}

static void m_init(run *r)
{
    model *m = &r->m;
    memset(m, 0, sizeof *m);
    m->mode = r->fc->proxy_len ? MC_PROXY : MC_LINE;
    m->rp.cap = CFG(r)->max_reply_line - 2;
    m->rp.max_total = CFG(r)->max_reply_size;
    m->rp.line = malloc(m->rp.cap + 1);
    if (!m->rp.line)
        abort();
    m->t.ftx = -1;
    if (CFG(r)->tls != SMTPE_TLS_IMPLICIT)
        m_push(m, MK_GREETING, 0, 0);
}

static void m_free(model *m)
{
    free(m->h);
    free(m->rp.line);
    fz_free(&m->line);
    fz_free(&m->auth_expect);
    fz_free(&m->chal);
}

/* ------------------------------------------------------------------------------------------ */
/* The host (oracles 1, 3, 6).                                                                 */

static const char *rname(const run *r)
{
    return r->split ? "split" : "whole";
}

static void log_span(run *r, smtpe_span s)
{
    fz_put_u8(&r->log, '<');
    if (s.len)
        fz_put(&r->log, s.ptr, s.len);
    fz_put_u8(&r->log, '>');
}

static unsigned want(run *r)
{
    return smtpe_client_want(r->c);
}

/* send_buf: checks that what it hands out stays put (stable output), feeds the octets it
 * hands out for the first time to the model; returns the run's length. */
static const uint8_t *peek(run *r, size_t *lenp)
{
    size_t len = 0;
    const uint8_t *p = smtpe_client_send_buf(r->c, &len);
    size_t unacked = (size_t)(r->out.len - r->acked);
    FUZZ_CHECK(!!(want(r) & SMTPE_WANT_WRITE) == (len > 0),
               "want() WRITE disagrees with send_buf");
    if (r->lost_ok) { /* smtpe.h: after smtpe_client_lost nothing unacknowledged goes */
        FUZZ_CHECK(len == 0, "send_buf gives output after smtpe_client_lost");
        FUZZ_CHECK(smtpe_client_content_held(r->c) == 0, "content held after smtpe_client_lost");
        *lenp = 0;
        return p;
    }
    FUZZ_CHECK(len >= unacked, "send_buf gives fewer octets than it handed out unacknowledged");
    if (r->last_p && r->last_ack < r->last_len)
        FUZZ_CHECK(p == r->last_p + r->last_ack,
                   "stable output: after a partial acknowledgement send_buf does not give the "
                   "rest where it was");
    FUZZ_CHECK(unacked == 0 || fz_eq(p, unacked, r->out.p + r->acked, unacked),
               "stable output: octets handed out changed before they were acknowledged");
    if (len > unacked) {
        fz_put(&r->out, p + unacked, len - unacked);
        m_client(r, p + unacked, len - unacked);
    }
    *lenp = len;
    return p;
}

/* Writes what send_buf gives, up to limit octets (SIZE_MAX: all), and feeds the model. */
static int flush(run *r, size_t limit)
{
    int progress = 0;
    while (limit > 0) {
        size_t len = 0;
        const uint8_t *p = peek(r, &len);
        if (len == 0) {
            r->m.t.failed_flushed = r->m.t.failed; /* everything queued is handed out */
            r->m.t.ended_flushed = r->m.t.ended;
            break;
        }
        size_t k = len < limit ? len : limit;
        FUZZ_CHECK(smtpe_client_send_ack(r->c, len + 1) == SMTPE_ERR_INVALID_ARGUMENT,
                   "send_ack accepted more than send_buf gave");
        FUZZ_CHECK(smtpe_client_send_ack(r->c, k) == 0, "send_ack refused what send_buf gave");
        LOGF(r, "W %zu %zu\n", len, k);
        r->acked += k;
        r->last_p = p;
        r->last_len = len;
        r->last_ack = k;
        if (limit != SIZE_MAX)
            limit -= k;
        progress = 1;
        if (k < len)
            break;
        r->last_p = NULL;
    }
    return progress;
}

/* 1 if the model saw a reply (not the close) decide this recipient. */
static int d_set_by_reply(const rtxn *rt, const smtpe_client_outcome *o)
{
    const mdec *d = &rt->md[o->index];
    return d->set && !d->closing;
}

static void check_outcome(run *r, const smtpe_client_event *ev)
{
    rtxn *rt = cur_rtxn(r);
    const smtpe_client_outcome *o = &ev->outcome;
    FUZZ_CHECK(rt != NULL, "OUTCOME with no transaction submitted");
    const ftxn *f = &r->fc->tx[r->cur];
    FUZZ_CHECK(o->index < f->t.rcpt_count, "OUTCOME index out of range");
    FUZZ_CHECK(!rt->decided[o->index], "a recipient got two outcomes");
    FUZZ_CHECK(o->outcome >= SMTPE_OUTCOME_DELIVERED && o->outcome <= SMTPE_OUTCOME_UNKNOWN,
               "OUTCOME outcome out of range");
    FUZZ_CHECK(o->code == 0 || (o->code >= 200 && o->code <= 559), "OUTCOME code out of range");
    FUZZ_CHECK(o->local == (o->code == 0), "OUTCOME local is not exactly 'no reply code'");
    /* the end of the content was sent: written when the connection is gone (lost), handed
     * out otherwise (the host may still write it) */
    int end_sent = rt->end_seen && (!r->lost_ok || r->acked >= rt->end_wire);
    if (o->outcome == SMTPE_OUTCOME_UNKNOWN) {
        FUZZ_CHECK(o->code == 0, "UNKNOWN with a reply code");
        FUZZ_CHECK(end_sent, "UNKNOWN although the end of the content was not sent");
    }
    if (o->outcome == SMTPE_OUTCOME_TEMPORARY && !rt->aborted && !(d_set_by_reply(rt, o)))
        FUZZ_CHECK(!end_sent, "TEMPORARY although the end of the content was sent and no reply "
                              "to it decided: the server may have delivered (RFC 5321 "
                              "§4.5.3.2.6)");
    if (o->outcome == SMTPE_OUTCOME_DELIVERED) {
        FUZZ_CHECK(o->code / 100 == 2, "DELIVERED without a 2xx");
        FUZZ_CHECK(rt->end_seen, "DELIVERED although the end of the content never went out");
    }
    if (o->before_mail) {
        FUZZ_CHECK(o->local && o->outcome == SMTPE_OUTCOME_PERMANENT,
                   "before_mail outcome not local and permanent");
        FUZZ_CHECK(!rt->mail_on_wire, "before_mail outcome for a transaction whose MAIL went");
        FUZZ_CHECK(m_refused_before_mail(r, f),
                   "refused before MAIL although the reference sees no reason to");
        rt->before_mail = 1;
    }
    if (o->enhanced.len) {
        FUZZ_CHECK(o->enhanced.len <= 11 && o->enhanced.ptr[1] == '.',
                   "OUTCOME enhanced status code malformed");
        if (o->code)
            FUZZ_CHECK(o->enhanced.ptr[0] == '0' + o->code / 100,
                       "OUTCOME enhanced status code of another class than the code");
    }
    if (o->local && !o->before_mail && !(rt->md[o->index].set && !rt->md[o->index].closing) &&
        r->m.closed && o->outcome != SMTPE_OUTCOME_UNKNOWN) {
        /* decided by the end of the session: smtpe.h says how */
        if (r->refused_mid)
            FUZZ_CHECK(o->outcome == SMTPE_OUTCOME_PERMANENT,
                       "content refused mid-stream but a recipient not permanent");
        else
            FUZZ_CHECK(o->outcome == SMTPE_OUTCOME_TEMPORARY,
                       "a recipient the end of the session decided is neither temporary nor "
                       "unknown");
    }
    const mdec *d = &rt->md[o->index];
    if (d->set && !o->local) {
        if (o->code != d->code) {
            fprintf(stderr, "recipient %zu: engine code %u, reference %u\n", o->index, o->code,
                    d->code);
            FUZZ_CHECK(0, "OUTCOME code is not the reply the reference matched to the "
                          "recipient");
        }
        if (d->outcome)
            FUZZ_CHECK(o->outcome == d->outcome, "OUTCOME outcome is not the reply's class");
    } else if (!o->local) {
        FUZZ_CHECK(r->m.closed && o->code == r->m.close_code,
                   "an outcome with a reply code the reference gave the recipient no reply "
                   "for");
    } else if (!o->before_mail && d->set && !d->closing) {
        fprintf(stderr, "recipient %zu: reference code %u\n", o->index, d->code);
        FUZZ_CHECK(0, "a local outcome for a recipient a reply already decided");
    }
    rt->decided[o->index] = 1;
    rt->counts[o->outcome]++;
}

static void check_done(run *r, const smtpe_client_event *ev)
{
    rtxn *rt = cur_rtxn(r);
    FUZZ_CHECK(rt != NULL, "TRANSACTION_DONE with no transaction submitted");
    const ftxn *f = &r->fc->tx[r->cur];
    FUZZ_CHECK(ev->done.txn == &f->t, "TRANSACTION_DONE names another txn");
    for (size_t i = 0; i < f->t.rcpt_count; i++)
        FUZZ_CHECK(rt->decided[i], "TRANSACTION_DONE before every recipient had its outcome");
    FUZZ_CHECK(ev->done.delivered == rt->counts[1] && ev->done.permanent == rt->counts[2] &&
                   ev->done.temporary == rt->counts[3] && ev->done.unknown == rt->counts[4],
               "TRANSACTION_DONE counts differ from the outcomes given");
    FUZZ_CHECK(ev->done.delivered + ev->done.permanent + ev->done.temporary +
                       ev->done.unknown ==
                   f->t.rcpt_count,
               "TRANSACTION_DONE counts do not add up to the recipients");
    FUZZ_CHECK(ev->done.reusable || (want(r) & SMTPE_WANT_CLOSE),
               "TRANSACTION_DONE not reusable while the session goes on");
    if (!rt->mail_on_wire && !rt->before_mail && r->m.ready && !r->m.closed &&
        !(want(r) & SMTPE_WANT_CLOSE))
        FUZZ_CHECK(!m_refused_before_mail(r, f),
                   "a transaction the reference refuses before MAIL ended without that refusal");
    rt->done = 1;
    r->cur = -1;
}

static void react_tls(run *r);
static void answer_auth(run *r, const uint8_t *p, size_t n);

/* READY: logged; its capabilities are get_caps' and those the reference parsed. */
static void take_ready(run *r, const smtpe_client_caps *k)
{
    const model *m = &r->m;
    LOGF(r, "READY ext=%#x size=%llu by=%lld esmtp=%d tls=%d auth_ok=%d auth=", k->extensions,
         (unsigned long long)k->size_limit, (long long)k->deliverby_min, k->esmtp, k->tls,
         k->authenticated);
    log_span(r, k->auth);
    log_span(r, k->xclient);
    log_span(r, k->xforward);
    LOGF(r, "\n");
    const smtpe_client_caps *g = smtpe_client_get_caps(r->c);
    FUZZ_CHECK(g && g->extensions == k->extensions && g->size_limit == k->size_limit &&
                   g->tls == k->tls && g->authenticated == k->authenticated &&
                   fz_eq(g->auth.ptr, g->auth.len, k->auth.ptr, k->auth.len),
               "smtpe_client_get_caps differs from READY's capabilities");
    if (!m->closed) {
        FUZZ_CHECK(m->ready, "READY although the reference says setup is not done");
        FUZZ_CHECK(k->extensions == m->ext, "READY extensions differ from the EHLO reply's");
        FUZZ_CHECK(k->size_limit == m->size_limit, "READY size_limit differs from SIZE");
        FUZZ_CHECK(k->deliverby_min == m->deliverby_min, "READY deliverby_min differs");
        FUZZ_CHECK(fz_eq(k->auth.ptr, k->auth.len, m->auth, m->auth_len),
                   "READY auth differs from the EHLO AUTH line");
        FUZZ_CHECK(fz_eq(k->xclient.ptr, k->xclient.len, m->xclient, m->xclient_len),
                   "READY xclient differs from the EHLO XCLIENT line");
        FUZZ_CHECK(fz_eq(k->xforward.ptr, k->xforward.len, m->xforward, m->xforward_len),
                   "READY xforward differs from the EHLO XFORWARD line");
        FUZZ_CHECK(k->tls == m->tls && k->authenticated == m->authenticated &&
                       k->esmtp == m->esmtp,
                   "READY tls/authenticated/esmtp differ from the reference");
    }
}

static void take_event(run *r, const smtpe_client_event *ev)
{
    FUZZ_CHECK(!r->closed_ev, "an event after CLOSED");
    switch (ev->type) {
    case SMTPE_CEV_READY:
        take_ready(r, &ev->ready);
        break;
    case SMTPE_CEV_STARTTLS:
        /* octets of this read after the 220 (step_left) came before the handshake: the host
         * feeds them first (smtpe.h), and the session must then end */
        LOGF(r, "STARTTLS\n");
        FUZZ_CHECK(r->m.tls_wait || r->m.closed, "STARTTLS event the reference did not expect");
        r->tls_pending = 1;
        break;
    case SMTPE_CEV_AUTH_STEP:
        LOGF(r, "AUTH_STEP %u ", ev->auth_step.step);
        log_span(r, ev->auth_step.challenge);
        LOGF(r, "\n");
        FUZZ_CHECK(r->m.auth_host || r->m.closed, "AUTH_STEP the reference did not expect");
        if (!r->m.closed) {
            FUZZ_CHECK(ev->auth_step.step == r->m.auth_step, "AUTH_STEP step number differs");
            if (ev->auth_step.step > 0)
                FUZZ_CHECK(fz_eq(ev->auth_step.challenge.ptr, ev->auth_step.challenge.len,
                                 r->m.chal.p, r->m.chal.len),
                           "AUTH_STEP challenge is not the 334's text base64-decoded");
        }
        r->auth_owed = 1;
        r->auth_step = ev->auth_step.step;
        if (!r->fc->manual_auth) {
            const rchoice *c = &resp_choices[r->auth_step % 4];
            answer_auth(r, c->p, c->n);
        }
        break;
    case SMTPE_CEV_CONTENT: {
        LOGF(r, "CONTENT\n");
        rtxn *rt = cur_rtxn(r);
        FUZZ_CHECK(rt != NULL, "CONTENT with no transaction");
        FUZZ_CHECK(!rt->content_ev, "CONTENT twice for one transaction");
        rt->content_ev = 1;
        break;
    }
    case SMTPE_CEV_OUTCOME:
        LOGF(r, "OUTCOME %zu %d %u ", ev->outcome.index, ev->outcome.outcome, ev->outcome.code);
        log_span(r, ev->outcome.enhanced);
        log_span(r, ev->outcome.text);
        LOGF(r, " %d %d\n", ev->outcome.local, ev->outcome.before_mail);
        check_outcome(r, ev);
        break;
    case SMTPE_CEV_TRANSACTION_DONE:
        LOGF(r, "DONE %zu %zu %zu %zu %d\n", ev->done.delivered, ev->done.permanent,
             ev->done.temporary, ev->done.unknown, ev->done.reusable);
        check_done(r, ev);
        break;
    case SMTPE_CEV_CLOSED: {
        const smtpe_client_closed *k = &ev->closed;
        LOGF(r, "CLOSED %d %u ", k->reason, k->code);
        log_span(r, k->text);
        LOGF(r, "\n");
        FUZZ_CHECK(k->reason >= SMTPE_CLOSE_QUIT && k->reason <= SMTPE_CLOSE_REFUSED,
                   "CLOSED reason out of range");
        FUZZ_CHECK(want(r) & SMTPE_WANT_CLOSE, "CLOSED but want() lacks CLOSE");
        FUZZ_CHECK(r->cur < 0, "CLOSED while a transaction has not had its TRANSACTION_DONE");
        int hostly = k->reason == SMTPE_CLOSE_LOST || k->reason == SMTPE_CLOSE_TIMEOUT ||
                     k->reason == SMTPE_CLOSE_ABORTED ||
                     (k->reason == SMTPE_CLOSE_QUIT && k->code == 0);
        if (k->reason == SMTPE_CLOSE_ABORTED) {
            FUZZ_CHECK(r->abort_ok || r->refused_mid,
                       "CLOSED ABORTED with no abort and no content to refuse");
        } else if (hostly) {
            FUZZ_CHECK(r->host_close, "a host-side close (lost, timeout) the host did not cause");
        } else {
            if (!r->m.closed || r->m.close_reason != k->reason) {
                fprintf(stderr, "engine: reason %d code %u; reference: %s reason %d\n",
                        k->reason, k->code, r->m.closed ? "closed" : "open", r->m.close_reason);
                FUZZ_CHECK(0, "the engine closed for a reason the reference does not see");
            }
            if (k->code != r->m.close_code)
                FUZZ_CHECK(0, "CLOSED code is not the reply's that ended the session");
        }
        r->closed_ev = 1;
        m_engine_closed(r, k->reason);
        break;
    }
    default:
        FUZZ_CHECK(0, "an event of unknown type");
    }
}

static const char *rname(const run *r);

static void give_content(run *r, int *progress)
{
    rtxn *rt = cur_rtxn(r);
    if (!rt || !rt->content_ev || rt->gave_last || r->paused)
        return;
    const ftxn *f = &r->fc->tx[r->cur];
    while (!rt->gave_last && (want(r) & SMTPE_WANT_CONTENT)) {
        size_t left = f->len - rt->gave;
        size_t n = f->piece && f->piece < left ? f->piece : left;
        int last = n == left;
        smtpe_ssize k = f->by_ref ? smtpe_client_content_ref(r->c, f->content + rt->gave, n, last)
                                  : smtpe_client_content(r->c, f->content + rt->gave, n, last);
        if (trace > 0) {
            fprintf(stderr, "  [%s] content at %zu:", rname(r), rt->gave);
            for (size_t q = 0; q < n && q < 16; q++)
                fprintf(stderr, " %02x", f->content[rt->gave + q]);
            fprintf(stderr, "\n");
        }
        LOGF(r, "C %zu %d %lld\n", n, last, (long long)k);
        FUZZ_CHECK(k >= 0 || k == SMTPE_ERR_STATE, "smtpe_client_content: undocumented return");
        FUZZ_CHECK(k >= 0, "smtpe_client_content refused content while want() said CONTENT");
        FUZZ_CHECK((size_t)k <= n, "smtpe_client_content consumed more than given");
        rt->gave += (size_t)k;
        if ((want(r) & SMTPE_WANT_CLOSE) && !r->m.closed) {
            /* the encoder stopped at content it must refuse (no scan was given) */
            int bdat = CFG(r)->chunking && (r->m.ext & SMTPE_EXT_CHUNKING);
            FUZZ_CHECK(m_refuse_mid(r, f, bdat),
                       "the session ended in smtpe_client_content with nothing to refuse");
            r->refused_mid = 1;
            m_engine_closed(r, SMTPE_CLOSE_ABORTED);
            *progress = 1;
            break;
        }
        FUZZ_CHECK(n == 0 || k > 0, "want() said CONTENT but smtpe_client_content consumed "
                                    "nothing");
        if (last && (size_t)k == n) {
            rt->gave_last = 1;
            *progress = 1;
            break;
        }
        if (k == 0)
            break;
        *progress = 1;
    }
}

static void pump(run *r, int limit)
{
    int progress = 1, taken = 0;
    while (progress) {
        progress = 0;
        smtpe_client_event ev;
        while (limit == 0 || taken < limit) {
            unsigned w = want(r);
            memset(&ev, 0xa5, sizeof ev);
            int g = smtpe_client_next_event(r->c, &ev);
            FUZZ_CHECK(g == 0 || g == 1, "next_event returned neither 0 nor 1");
            if (!g) {
                FUZZ_CHECK(!(want(r) & SMTPE_WANT_EVENT),
                           "want() says EVENT but next_event gives none");
                break;
            }
            FUZZ_CHECK(w & SMTPE_WANT_EVENT, "next_event gave an event want() did not announce");
            take_event(r, &ev);
            taken++;
            progress = 1;
        }
        give_content(r, &progress);
        /* smtpe.h (smtpe_client_recv): a host feeds everything it has read before it sends the
         * output queued meanwhile */
        if (r->step_left == 0 && flush(r, r->budget))
            progress = 1;
        if (r->tls_pending && (want(r) & SMTPE_WANT_CLOSE))
            r->tls_pending = 0; /* the octets fed before the handshake ended the session */
        if (r->tls_pending && !r->fc->manual_tls && r->step_left == 0) {
            react_tls(r);
            progress = 1;
        }
    }
    uint64_t d = smtpe_client_expiry(r->c, r->now);
    unsigned w = want(r);
    if (w & SMTPE_WANT_EVENT)
        FUZZ_CHECK(d == UINT64_MAX, "a timer runs while an event waits to be taken");
    if (r->auth_owed && !(w & SMTPE_WANT_CLOSE))
        FUZZ_CHECK(d == UINT64_MAX, "a timer runs while the host owes an AUTH response");
    if (r->tls_pending && !(w & SMTPE_WANT_CLOSE))
        FUZZ_CHECK(d == UINT64_MAX, "a timer runs while the host runs the TLS handshake");
    if (!(w & (SMTPE_WANT_EVENT | SMTPE_WANT_CLOSE)))
        FUZZ_CHECK(!!(w & SMTPE_WANT_VERDICT) == r->auth_owed,
                   "SMTPE_WANT_VERDICT is not exactly 'an AUTH_STEP waits for its answer'");
    if ((w & SMTPE_WANT_CLOSE) && !r->m.closed && !r->host_close) {
        fprintf(stderr, "engine closed; reference still open\n");
        FUZZ_CHECK(0, "the engine ended the session where the reference sees no reason");
    }
    if (d != UINT64_MAX) { /* RFC 5321 §4.5.3.2: one of the configured timeouts from now, at most */
        const smtpe_client_config *k = CFG(r);
        uint64_t most = k->greeting_timeout_ms;
        uint64_t t[] = {k->command_timeout_ms, k->data_timeout_ms, k->data_block_timeout_ms,
                        k->data_end_timeout_ms};
        for (size_t i = 0; i < NELEM(t); i++)
            most = t[i] > most ? t[i] : most;
        FUZZ_CHECK(d > r->now && d - r->now <= most,
                   "expiry() is not within the longest configured timeout from now");
    }
    r->deadline = d;
    LOGF(r, "T %llu want %#x\n", (unsigned long long)d, w);
    if (r->m.closed)
        FUZZ_CHECK(w & SMTPE_WANT_CLOSE, "the reference ended the session but the engine goes on");
    if ((w & SMTPE_WANT_CLOSE) && !r->closed_ev)
        FUZZ_CHECK(w & SMTPE_WANT_EVENT, "the session is over but CLOSED is not queued");
    if (r->closed_ev) {
        if (r->closed_total == UINT64_MAX) {
            flush(r, SIZE_MAX);
            r->closed_total = r->out.len;
        }
        size_t len = 0;
        smtpe_client_send_buf(r->c, &len);
        FUZZ_CHECK(len == 0 && r->out.len == r->closed_total,
                   "client octets queued after CLOSED");
    }
}

static void react_tls(run *r)
{
    r->tls_pending = 0;
    flush(r, SIZE_MAX); /* the host sends what is queued before its handshake */
    int rc = smtpe_client_tls_started(r->c, r->now);
    LOGF(r, "tls_started %d\n", rc);
    FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE, "tls_started: undocumented return");
    if (rc == 0)
        m_tls_up(r);
}

static void answer_auth(run *r, const uint8_t *p, size_t n)
{
    int rc = smtpe_client_auth_response(r->c, p, n);
    LOGF(r, "auth_response %zu %d %d\n", n, p != NULL, rc);
    FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE || rc == SMTPE_ERR_INVALID_ARGUMENT,
               "auth_response: undocumented return");
    if (!r->auth_owed || r->closed_ev) {
        FUZZ_CHECK(rc == SMTPE_ERR_STATE, "auth_response accepted although no AUTH_STEP waits");
        return;
    }
    /* smtpe.h: over 8192 octets, or base64 over output_buffer_size - 50 octets */
    if (n > 8192 || SMTPE__BASE64_LEN(n) + 50 > CFG(r)->output_buffer_size)
        FUZZ_CHECK(rc == SMTPE_ERR_INVALID_ARGUMENT,
                   "auth_response took a response over smtpe.h's limits");
    else
        FUZZ_CHECK(rc == 0 || (rc == SMTPE_ERR_STATE && (want(r) & SMTPE_WANT_CLOSE)),
                   "auth_response refused a response within the limits");
    if (rc == 0) {
        r->auth_owed = 0;
        m_auth_answer(r, p, n);
    } else if (rc == SMTPE_ERR_INVALID_ARGUMENT) {
        /* too long: cancel instead */
        rc = smtpe_client_auth_response(r->c, NULL, 0);
        LOGF(r, "auth_response cancel %d\n", rc);
        FUZZ_CHECK(rc == 0, "auth_response refused to cancel");
        r->auth_owed = 0;
        m_auth_answer(r, NULL, 0);
    }
}

/* smtpe_client_recv over one read: whole (run 1) or in pieces (run 2). */
static size_t next_piece(run *r, size_t left)
{
    static const size_t sizes[] = {1, 1, 2, 3, 4, 5, 7, 9, 13, 17, 31, 64, 100, 513, 2049, 70000};
    if (r->fc->octetwise)
        return 1;
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 17;
    r->rng ^= r->rng << 5;
    size_t k = sizes[r->rng % NELEM(sizes)];
    return k < left ? k : left;
}

static void feed(run *r, const uint8_t *p, size_t n)
{
    size_t off = 0;
    int stuck = 0;
    while (off < n) {
        size_t piece = r->split ? next_piece(r, n - off) : n - off;
        while (piece > 0) {
            r->step_left = n - off;
            if (want(r) & SMTPE_WANT_CLOSE)
                m_engine_closed(r, -1);
            smtpe_ssize k = smtpe_client_recv(r->c, p + off, piece, r->now);
            FUZZ_CHECK(k >= 0, "smtpe_client_recv returned an error for a valid buffer");
            FUZZ_CHECK((size_t)k <= piece, "smtpe_client_recv consumed more than given");
            m_server(r, p + off, (size_t)k);
            off += (size_t)k;
            piece -= (size_t)k;
            r->step_left = n - off;
            if (want(r) & SMTPE_WANT_CLOSE) { /* the session is over: the rest is dropped */
                r->step_left = 0;
                pump(r, 0);
                return;
            }
            if (piece == 0 && !(want(r) & SMTPE_WANT_EVENT))
                break;
            if (k == 0) {
                FUZZ_CHECK(want(r) & SMTPE_WANT_EVENT,
                           "smtpe_client_recv consumed nothing with no event waiting");
                if (++stuck > 3)
                    FUZZ_CHECK(0, "smtpe_client_recv stuck although the host takes every event");
            } else {
                stuck = 0;
            }
            pump(r, 0);
        }
    }
    r->step_left = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Actions (both runs).                                                                        */

static void do_submit(run *r, size_t id)
{
    ftxn *f = &r->fc->tx[id];
    size_t before = 0, after = 0;
    peek(r, &before);
    int rc = smtpe_client_submit(r->c, &f->t);
    LOGF(r, "submit %zu %d\n", id, rc);
    FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE || rc == SMTPE_ERR_INVALID_ARGUMENT,
               "smtpe_client_submit: undocumented return");
    /* smtpe.h: STATE while a transaction is under way, after QUIT was asked, once over;
     * then INVALID_ARGUMENT for a bad transaction */
    if ((want(r) & SMTPE_WANT_CLOSE) || r->quit_asked || r->cur >= 0)
        FUZZ_CHECK(rc == SMTPE_ERR_STATE, "submit did not refuse with SMTPE_ERR_STATE (a "
                                          "transaction under way, QUIT asked, or closed)");
    else if (f->valid == 0)
        FUZZ_CHECK(rc == SMTPE_ERR_INVALID_ARGUMENT, "submit accepted an invalid transaction");
    else if (f->valid > 0)
        FUZZ_CHECK(rc == 0, "submit refused a valid transaction");
    else
        FUZZ_CHECK(rc != SMTPE_ERR_STATE, "submit refused with STATE while none applies");
    if (rc == 0) {
        r->cur = (int)id;
        r->tx[id].submitted = 1;
    } else {
        peek(r, &after);
        FUZZ_CHECK(after == before, "a refused submit queued output");
    }
}

static void do_bad(run *r, size_t which)
{
    int rc;
    size_t before = 0;
    peek(r, &before);
    switch (which % 8) {
    case 0:
        rc = (int)smtpe_client_recv(r->c, NULL, 1, r->now);
        FUZZ_CHECK(rc == SMTPE_ERR_INVALID_ARGUMENT, "recv(NULL, 1) not INVALID_ARGUMENT");
        break;
    case 1:
        rc = smtpe_client_submit(r->c, NULL);
        FUZZ_CHECK(rc == SMTPE_ERR_INVALID_ARGUMENT, "submit(NULL) not INVALID_ARGUMENT");
        break;
    case 2:
        rc = smtpe_client_submit_versioned(r->c, 99, &r->fc->tx[0].t);
        FUZZ_CHECK(rc == SMTPE_ERR_INVALID_ARGUMENT, "submit of an unknown version accepted");
        break;
    case 3: {
        smtpe_client_event ev;
        rc = smtpe_client_next_event_versioned(r->c, 99, &ev);
        FUZZ_CHECK(rc == 0, "next_event of an unknown version gave an event");
        break;
    }
    case 4:
        rc = (int)smtpe_client_content(r->c, NULL, 5, 0);
        FUZZ_CHECK(rc == SMTPE_ERR_INVALID_ARGUMENT || rc == SMTPE_ERR_STATE,
                   "content(NULL, 5) not refused");
        break;
    case 5: {
        rtxn *rt = cur_rtxn(r);
        rc = (int)smtpe_client_content(r->c, (const uint8_t *)"", 0, 0);
        FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE, "content(0 octets) undocumented return");
        if (!rt || rt->gave_last || (want(r) & SMTPE_WANT_CLOSE))
            FUZZ_CHECK(rc == SMTPE_ERR_STATE, "content accepted when none is wanted");
        break;
    }
    case 6:
        if (r->auth_owed)
            return;
        rc = smtpe_client_auth_response(r->c, (const uint8_t *)"x", 1);
        FUZZ_CHECK(rc == SMTPE_ERR_STATE, "auth_response accepted with no AUTH_STEP owed");
        break;
    default:
        rc = smtpe_client_auth_response(r->c, NULL, 3);
        FUZZ_CHECK(rc == SMTPE_ERR_STATE || rc == SMTPE_ERR_INVALID_ARGUMENT,
                   "auth_response(NULL, 3) accepted");
        break;
    }
    LOGF(r, "bad %zu %d\n", which % 8, rc);
    size_t after = 0;
    peek(r, &after);
    FUZZ_CHECK(after == before, "a refused call queued output");
}

static void exec_action(run *r, const action *a)
{
    int rc;
    switch (a->op) {
    case A_STEP:
        TRACE("  [%s] read of %zu octets: %.*s\n", rname(r), a->n, (int)(a->n < 300 ? a->n : 300),
              (const char *)a->p);
        feed(r, a->p, a->n);
        break;
    case A_SUBMIT:
        do_submit(r, a->a);
        break;
    case A_PAUSE:
        r->paused = (int)a->a;
        break;
    case A_ABORT: {
        rc = smtpe_client_abort_content(r->c);
        LOGF(r, "abort %d\n", rc);
        FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE, "abort_content: undocumented return");
        rtxn *rt = cur_rtxn(r);
        if (!rt || r->closed_ev || (!rt->content_ev && !(want(r) & SMTPE_WANT_EVENT)))
            FUZZ_CHECK(rc == SMTPE_ERR_STATE, "abort_content accepted with no content under way");
        if (rc == 0) {
            rt->aborted = 1;
            FUZZ_CHECK(!rt->end_seen, "abort_content accepted after the end of the content "
                                      "went out");
            r->host_close = r->abort_ok = 1;
            m_engine_closed(r, SMTPE_CLOSE_ABORTED);
        }
        break;
    }
    case A_LOST:
        rc = smtpe_client_lost(r->c);
        LOGF(r, "lost %d\n", rc);
        FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE, "lost: undocumented return");
        if (r->closed_ev)
            FUZZ_CHECK(rc == SMTPE_ERR_STATE, "lost accepted after CLOSED");
        if (rc == 0) {
            r->host_close = r->lost_ok = 1;
            m_engine_closed(r, SMTPE_CLOSE_LOST);
        }
        break;
    case A_QUIT:
        rc = smtpe_client_quit(r->c);
        LOGF(r, "quit %d\n", rc);
        FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE, "quit: undocumented return");
        if (r->quit_asked || r->closed_ev)
            FUZZ_CHECK(rc == SMTPE_ERR_STATE, "quit accepted twice or after CLOSED");
        if (rc == 0)
            r->quit_asked = 1;
        break;
    case A_TLS:
        if (a->a == 1 && r->tls_pending) { /* the handshake failed */
            r->tls_pending = 0;
            rc = smtpe_client_lost(r->c);
            LOGF(r, "handshake failed: lost %d\n", rc);
            FUZZ_CHECK(rc == 0 || rc == SMTPE_ERR_STATE, "lost: undocumented return");
            if (rc == 0) {
                r->host_close = r->lost_ok = 1;
                m_engine_closed(r, SMTPE_CLOSE_LOST);
            }
            break;
        }
        if (r->tls_pending) {
            react_tls(r);
            break;
        }
        rc = smtpe_client_tls_started(r->c, r->now);
        LOGF(r, "tls_started %d\n", rc);
        FUZZ_CHECK(rc == SMTPE_ERR_STATE, "tls_started accepted with no handshake due");
        break;
    case A_AUTH:
        answer_auth(r, resp_choices[a->a].p, resp_choices[a->a].n);
        break;
    case A_TIME: {
        uint64_t d = r->deadline;
        r->now += a->a;
        rc = smtpe_client_handle_expiry(r->c, r->now);
        LOGF(r, "time +%zu %d\n", a->a, rc);
        FUZZ_CHECK(rc == 0 || rc == 1, "handle_expiry returned neither 0 nor 1");
        FUZZ_CHECK(rc == (d != UINT64_MAX && r->now >= d),
                   "handle_expiry disagrees with the deadline expiry() gave");
        if (rc == 1) {
            r->host_close = 1;
            m_engine_closed(r, SMTPE_CLOSE_TIMEOUT);
        }
        break;
    }
    case A_BUDGET:
        r->budget = a->a;
        break;
    case A_WRITE:
        flush(r, a->a);
        break;
    case A_BAD:
        do_bad(r, a->a);
        break;
    case A_FINAL:
        r->budget = SIZE_MAX;
        r->paused = 0;
        break;
    default:
        break;
    }
    pump(r, a->op == A_STEP || a->op == A_FINAL ? r->fc->evlimit : 0);
}

/* ------------------------------------------------------------------------------------------ */
/* The scripted server (run 1): replies from a grammar, to the commands the model has seen.    */

static const unsigned codes_greeting[] = {220, 220, 554, 421, 250, 450, 521, 300};
static const unsigned codes_ehlo[] = {250, 250, 502, 500, 421, 550, 554, 220};
static const unsigned codes_helo[] = {250, 421, 550, 501, 250, 250, 502, 354};
static const unsigned codes_starttls[] = {220, 454, 220, 421, 501, 250, 554, 334};
static const unsigned codes_xclient[] = {220, 250, 550, 421, 501, 220, 220, 354};
static const unsigned codes_auth[] = {235, 334, 535, 454, 421, 334, 538, 250};
static const unsigned codes_authresp[] = {235, 334, 535, 421, 334, 501, 235, 354};
static const unsigned codes_rset[] = {250, 421, 500, 250, 250, 354, 250, 550};
static const unsigned codes_xforward[] = {250, 421, 550, 501, 250, 250, 250, 354};
static const unsigned codes_mail[] = {250, 451, 550, 421, 552, 553, 503, 354};
static const unsigned codes_rcpt[] = {250, 251, 550, 450, 452, 421, 553, 334};
static const unsigned codes_data[] = {354, 554, 451, 421, 503, 250, 550, 334};
static const unsigned codes_dot[] = {250, 451, 552, 554, 421, 550, 250, 354};
static const unsigned codes_dotvoid[] = {554, 250, 421, 503, 554, 554, 250, 354};
static const unsigned codes_bdat[] = {250, 552, 451, 421, 554, 250, 354, 500};
static const unsigned codes_quit[] = {221, 421, 250, 500, 221, 221, 221, 354};
static const unsigned codes_extra[] = {421, 250, 220, 354, 334, 550, 221, 451,
                                       235, 500, 252, 421, 554, 252, 250, 421};

static const unsigned *code_table(int kind)
{
    switch (kind) {
    case MK_GREETING: return codes_greeting;
    case MK_EHLO: return codes_ehlo;
    case MK_HELO: return codes_helo;
    case MK_STARTTLS: return codes_starttls;
    case MK_XCLIENT: return codes_xclient;
    case MK_AUTH: return codes_auth;
    case MK_AUTH_RESP: return codes_authresp;
    case MK_RSET: return codes_rset;
    case MK_XFORWARD: return codes_xforward;
    case MK_MAIL: return codes_mail;
    case MK_RCPT: return codes_rcpt;
    case MK_DATA: return codes_data;
    case MK_DOT:
    case MK_BDAT_LAST: return codes_dot;
    case MK_DOT_VOID: return codes_dotvoid;
    case MK_BDAT: return codes_bdat;
    default: return codes_quit;
    }
}

static char text_long[70000];
static char auth_long[400]; /* over the 256 octets the engine keeps, PLAIN past them */
static const char *reply_texts[16];
static size_t reply_text_len[16];

static void texts_init(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    memset(text_long, 'x', sizeof text_long - 1);
    size_t at = 0;
    for (int i = 0; at < 300; i++)
        at += (size_t)snprintf(auth_long + at, sizeof auth_long - at, "X-MECH-%02d ", i);
    snprintf(auth_long + at, sizeof auth_long - at, "PLAIN X-TOKEN");
    static const char *const fixed[] = {"", "ok", "go ahead", "\tTab and \xc3\xa9"};
    for (int i = 0; i < 4; i++) {
        reply_texts[i] = fixed[i];
        reply_text_len[i] = strlen(fixed[i]);
    }
    /* lengths around the line limits: a line is "ddd " + text + CRLF */
    static const size_t lens[] = {506, 507, 508, 509, 594, 595, 1018, 1019, 2042, 2043, 2044,
                                  65530};
    for (int i = 0; i < 12; i++) {
        reply_texts[4 + i] = text_long;
        reply_text_len[4 + i] = lens[i];
    }
}

static const char *const b64_chals[] = {
    "",
    "VXNlcm5hbWU6",
    "PDE4OTYuNjk3MTcwOTUyQHBvc3RvZmZpY2UucmVzdG9uLm1jaS5uZXQ+",
    "eyJzdGF0dXMiOiI0MDEifQ==",
    "!!notbase64",
    "dGVzdA",
    "UGFzc3dvcmQ6",
    "AA==",
};

static const char *auth_lists[] = {"PLAIN LOGIN", "LOGIN", "XOAUTH2 PLAIN",
                                   "OAUTHBEARER XOAUTH2 PLAIN LOGIN", "CRAM-MD5 X-TOKEN",
                                   "plain login x-token", "=PLAIN LOGIN", auth_long};
static const char *const xclient_lists[] = {"NAME ADDR PORT PROTO HELO LOGIN DESTADDR DESTPORT",
                                            "ADDR", "NAME HELO", "FOO"};

typedef struct gen {
    run *r;   /* run 1, whose model says what the client sent */
    fz_buf pend;
    size_t srv_next; /* the history entry the server answers next */
    rd *in;
} gen;

static void gen_line(fz_buf *o, unsigned code, int more, const char *enh, const char *t,
                     size_t tn)
{
    put_fmt(o, "%03u%c", code, more ? '-' : ' ');
    if (enh) {
        put_str(o, enh);
        if (tn)
            put_str(o, " ");
    }
    fz_put(o, t, tn);
    put_str(o, "\r\n");
}

static void gen_ehlo_ok(gen *g, unsigned code, unsigned m1, unsigned m2, unsigned m3)
{
    static const char *const kw[] = {"PIPELINING", NULL, "8BITMIME", "SMTPUTF8",
                                     "ENHANCEDSTATUSCODES", "STARTTLS", "CHUNKING", "BINARYMIME",
                                     "DSN", "REQUIRETLS", "MT-PRIORITY", "DELIVERBY 30", NULL,
                                     NULL, "XFORWARD NAME ADDR PROTO HELO IDENT", NULL};
    static const char *const sizes[] = {"SIZE", "SIZE 0", "SIZE 100  ", "SIZE 10485760"};
    fz_buf lines = {0};
    unsigned mask = m1 | m2 << 8;
    int lower = (mask >> 15) & 1;
    char tmp[512];
    for (int b = 0; b < 15; b++) {
        if (!(mask & (1u << b)))
            continue;
        const char *s = kw[b];
        if (b == 1)
            s = sizes[m3 & 3];
        if (b == 12) {
            snprintf(tmp, sizeof tmp, "AUTH%s%s", auth_lists[(m3 >> 2) & 7][0] == '=' ? "" : " ",
                     auth_lists[(m3 >> 2) & 7]);
            s = tmp;
        }
        if (b == 13) {
            snprintf(tmp, sizeof tmp, "XCLIENT %s", xclient_lists[(m3 >> 5) & 3]);
            s = tmp;
        }
        char w[512];
        snprintf(w, sizeof w, "%s", s);
        if (lower)
            for (char *c = w; *c; c++)
                if (*c >= 'A' && *c <= 'Z')
                    *c = (char)(*c + 32);
        fz_put(&lines, w, strlen(w));
        fz_put_u8(&lines, 0);
    }
    if (m3 & 0x80) { /* an unknown keyword, and XFORWARD offering fewer attributes */
        fz_put(&lines, "X-JUNK some=thing", 17);
        fz_put_u8(&lines, 0);
        fz_put(&lines, "XFORWARD ADDR", 13);
        fz_put_u8(&lines, 0);
    }
    size_t n = 0;
    for (size_t i = 0; i < lines.len; i++)
        n += lines.p[i] == 0;
    gen_line(&g->pend, code, n > 0, NULL, "mx.example", 10);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = (const char *)lines.p + at;
        size_t sl = strlen(s);
        gen_line(&g->pend, code, i + 1 < n, NULL, s, sl);
        at += sl + 1;
    }
    fz_free(&lines);
}

/* The keywords a happy server offers: everything the config could use. */
static void gen_ehlo_happy(gen *g)
{
    const model *m = &g->r->m;
    unsigned m1 = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;
    unsigned m2 = 0x01 | 0x08 | 0x10 | 0x20 | 0x40;
    if (!m->tls)
        m1 |= 0x20;
    else
        m2 |= 0x02; /* REQUIRETLS only under TLS */
    gen_ehlo_ok(g, 250, m1, m2, 3 | (3 << 2));
}

/* One reply to history entry c, from the choice octet ch (0: the happy reply). */
static void gen_reply(gen *g, mcmd *c, unsigned ch, int happy)
{
    const model *m = &g->r->m;
    unsigned code = code_table(c->kind)[ch & 7];
    char enh[32];
    const char *e = NULL;
    const char *t = "ok";
    size_t tn = 2;
    if (ch & 8) {
        snprintf(enh, sizeof enh, "%u.%u.%u", code / 100 == 3 ? 2 : code / 100, (ch >> 4) & 7,
                 ch >> 7);
        e = enh;
    }
    if (ch & 0x20) {
        unsigned k = rd_u8(g->in);
        t = reply_texts[k & 15];
        tn = reply_text_len[k & 15];
    }
    if (code == 334) {
        unsigned k = happy ? 1 : rd_u8(g->in);
        t = b64_chals[k & 7];
        tn = strlen(t);
        e = NULL;
    }
    if ((c->kind == MK_EHLO) && code / 100 == 2) {
        if (happy) {
            gen_ehlo_happy(g);
        } else {
            unsigned m1 = rd_u8(g->in), m2 = rd_u8(g->in), m3 = rd_u8(g->in);
            gen_ehlo_ok(g, code, m1, m2, m3);
        }
    } else {
        if (ch & 0x10)
            gen_line(&g->pend, code, 1, e, "first line", 10);
        gen_line(&g->pend, code, 0, e, t, tn);
    }
    (void)m;
    c->srv++;
    c->srv_code = code;
}

/* Replies the server still owes entry i: LMTP's end of data takes one per accepted
 * recipient (by the server's own replies). */
static int owed(gen *g, size_t i)
{
    const model *m = &g->r->m;
    mcmd *c = &m->h[i];
    if (c->kind != MK_DOT && c->kind != MK_BDAT_LAST)
        return c->srv == 0;
    if (!g->r->fc->cfg.lmtp)
        return c->srv == 0;
    /* accepted recipients of its transaction: the server's 2xx to MAIL and RCPTs */
    int mail_ok = 0;
    int acc = 0;
    for (size_t j = 0; j < i; j++) {
        const mcmd *x = &m->h[j];
        if (x->wtx != c->wtx)
            continue;
        if (x->kind == MK_MAIL)
            mail_ok = x->srv_code / 100 == 2;
        if (x->kind == MK_RCPT && mail_ok && x->srv_code / 100 == 2)
            acc++;
    }
    return c->srv < (acc > 0 ? acc : 1);
}

/* The next entry the server has not fully answered, or nh. */
static size_t gen_next(gen *g)
{
    const model *m = &g->r->m;
    while (g->srv_next < m->nh && !owed(g, g->srv_next))
        g->srv_next++;
    return g->srv_next;
}

static void record(fcase *fc, int op, size_t a, uint8_t *p, size_t n)
{
    if (fc->nact == MAXA) {
        free(p);
        return;
    }
    action *x = &fc->act[fc->nact++];
    x->op = op;
    x->a = a;
    x->p = p;
    x->n = n;
}

/* Records and runs one action in run 1. */
static void act1(gen *g, int op, size_t a, uint8_t *p, size_t n)
{
    fcase *fc = g->r->fc;
    if (fc->nact == MAXA) {
        free(p);
        return;
    }
    record(fc, op, a, p, n);
    exec_action(g->r, &fc->act[fc->nact - 1]);
}

static void deliver(gen *g)
{
    if (g->pend.len == 0)
        return;
    uint8_t *p = g->pend.p;
    size_t n = g->pend.len;
    g->pend.p = NULL;
    g->pend.len = g->pend.cap = 0;
    act1(g, A_STEP, 0, p, n);
}

/* Happy replies to everything outstanding; returns 1 if there was something to answer. */
static int gen_happy(gen *g)
{
    int any = 0;
    size_t i;
    while ((i = gen_next(g)) < g->r->m.nh) {
        mcmd *c = &g->r->m.h[i];
        gen_reply(g, c, 0, 1);
        any = 1;
    }
    if (any)
        deliver(g);
    return any;
}

/* ---- transactions from the input ---- */

static void gen_content(fcase *fc, ftxn *f, rd *in, unsigned kind, unsigned param)
{
    fz_buf b = {0};
    static const char smuggle[] = "a\n.\r\nMAIL FROM:<x@evil>\r\nb\r.\r\nc\r\n.\r\n.d";
    (void)fc;
    switch (kind) {
    case 0:
    case 15: {
        size_t n = rd_u8(in);
        if (kind == 15)
            n |= (size_t)rd_u8(in) << 8;
        for (size_t i = 0; i < n && rd_more(in); i++)
            fz_put_u8(&b, rd_u8(in));
        break;
    }
    case 1:
        break;
    case 2:
        put_str(&b, "Subject: t\r\n\r\nhello\r\n");
        break;
    case 3:
        fz_put(&b, smuggle, sizeof smuggle - 1);
        break;
    case 4:
        put_str(&b, ".\r\n..\r\n.x\r\nx\r\n.");
        break;
    case 5:
        put_str(&b, "a\rb\nc\r\n\r\r\n\n.\n.\r");
        break;
    case 6: {
        size_t n = 996 + (param & 7);
        for (size_t i = 0; i < n; i++)
            fz_put_u8(&b, 'x');
        put_str(&b, "\r\nshort\r\n");
        break;
    }
    case 7: {
        size_t k = param == 15 ? 100 : param + 1;
        for (size_t i = 0; b.len < k * 1024; i++)
            put_fmt(&b, "%sline %zu of a big message, with some text to fill it up\r\n",
                    i % 17 == 3 ? "." : "", i);
        break;
    }
    case 8:
        put_str(&b, "Subject: caf\xc3\xa9\r\n\r\n\xff\x80\r\n");
        break;
    case 9:
        fz_put(&b, "a\0b\r\n", 5);
        break;
    case 10:
        put_str(&b, "abc");
        break;
    case 11:
        put_str(&b, "abc\r");
        break;
    case 12: {
        uint32_t x = 0x9e3779b9u * (param + 1);
        for (size_t i = 0; i < 256 * (param + 1); i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            fz_put_u8(&b, (uint8_t)x);
        }
        break;
    }
    case 13:
        put_str(&b, "a\r\n.\r\nMAIL FROM:<x@y>\r\n\r\n.\r\n");
        break;
    default:
        put_str(&b, ".");
        break;
    }
    if (b.len > CONTENT_MAX)
        b.len = CONTENT_MAX;
    f->content = b.p ? b.p : malloc(1);
    f->len = b.len;
    ref_scan(f->content, f->len, &f->ref);
}

/* Scans the content with smtpe_content_scan in pieces and checks it against the reference. */
static void host_scan(ftxn *f, size_t piece)
{
    smtpe_content_info *ci = &f->t.content;
    smtpe_content_scan_init(ci);
    size_t at = 0;
    while (at < f->len) {
        size_t n = piece && piece < f->len - at ? piece : f->len - at;
        smtpe_content_scan(ci, f->content + at, n);
        at += n;
    }
    smtpe_content_scan_end(ci);
    if (ci->size != f->len || ci->flags != f->ref.flags || ci->wire_size != f->ref.wire_size) {
        fprintf(stderr, "scan: size %llu/%zu flags %#x/%#x wire %llu/%llu\n",
                (unsigned long long)ci->size, f->len, ci->flags, f->ref.flags,
                (unsigned long long)ci->wire_size, (unsigned long long)f->ref.wire_size);
        FUZZ_CHECK(0, "smtpe_content_scan disagrees with the reference scan");
    }
}

static void gen_submit(gen *g, unsigned arg)
{
    fcase *fc = g->r->fc;
    rd *in = g->in;
    if (fc->ntx == MAXT)
        return;
    ftxn *f = &fc->tx[fc->ntx];
    memset(f, 0, sizeof *f);
    unsigned b0 = rd_u8(in), b1 = rd_u8(in), b2 = rd_u8(in), b3 = rd_u8(in);
    size_t nr = 1 + (b0 & 7);
    const pchoice *rp = &path_choices[b0 >> 4];
    smtpe_client_txn *t = &f->t;
    int valid = rp->as_reverse;
    t->reverse_path = rp->s;
    f->utf8 = has_8bit_str(rp->s);
    t->body = (smtpe_body_type)(b1 & 3);
    t->smtputf8 = (b1 >> 2) & 1;
    t->ret = (smtpe_dsn_ret)(((b1 >> 3) & 3) % 3);
    if (b1 & 0x20)
        t->envid = (arg & 1) ? "++++++++++++++++++++++++++++++++++++" : "id+1=2";
    if (b1 & 0x20 && (arg & 1))
        valid = 0; /* 36 '+' encode to 108 > 100 octets of xtext */
    t->requiretls = (b1 >> 6) & 1;
    t->has_content_info = (b1 >> 7) & 1;
    switch (b2 & 7) {
    case 1: t->has_mt_priority = 1; t->mt_priority = -9; break;
    case 2: t->has_mt_priority = 1; t->mt_priority = 4; break;
    case 3: t->by_mode = 'R'; t->by_time = 100; break;
    case 4: t->by_mode = 'N'; t->by_time = -5; break;
    case 5: t->by_mode = 'R'; t->by_time = 0; valid = 0; break;
    case 6: t->has_mt_priority = 1; t->mt_priority = 10; valid = 0; break;
    default: break;
    }
    if (b2 & 8) {
        t->xforward = xforward_attrs;
        t->xforward_count = NELEM(xforward_attrs);
    }
    f->piece = piece_choices[b2 >> 4];
    f->by_ref = (arg >> 3) & 1;
    if ((b0 & 8) && (arg & 2)) { /* a count out of range */
        nr = (arg & 4) ? 0 : (size_t)fc->cfg.max_recipients + 1;
        valid = 0;
    }
    size_t build = nr < MAXR ? nr : MAXR;
    for (size_t i = 0; i < build; i++) {
        unsigned x = rd_u8(in);
        const pchoice *fp = &path_choices[x & 15];
        f->r[i].forward_path = fp->s;
        f->utf8 |= has_8bit_str(fp->s);
        if (fp->as_forward == 0)
            valid = 0;
        else if (fp->as_forward < 0 && valid > 0)
            valid = -1;
        f->r[i].notify = notify_choices[(x >> 4) & 3];
        if (x & 0x40)
            f->r[i].orcpt = orcpt_choices[(x >> 7) & 1];
    }
    if (valid > 0 && rp->as_reverse < 0)
        valid = -1;
    if (nr > build) {
        /* max_recipients + 1 over MAXR: point at a big static array */
        static smtpe_client_rcpt many[100001];
        for (size_t i = 0; i < nr && i < NELEM(many); i++)
            many[i].forward_path = "bob@example.org";
        t->rcpts = many;
    } else {
        t->rcpts = f->r;
    }
    t->rcpt_count = nr;
    if (nr > fc->cfg.max_recipients || nr == 0)
        valid = 0;
    f->valid = valid;
    gen_content(fc, f, in, b3 & 15, b3 >> 4);
    if (t->has_content_info)
        host_scan(f, piece_choices[(b3 >> 4) & 15]);
    else
        host_scan(f, 0); /* the oracle only; the txn does not carry it */
    if (!t->has_content_info)
        memset(&t->content, 0, sizeof t->content);
    act1(g, A_SUBMIT, fc->ntx++, NULL, 0);
}

/* ---- the program ---- */

static void gen_server(gen *g, unsigned arg)
{
    size_t count = arg & 7;
    size_t done = 0;
    size_t i;
    while ((count == 0 || done < count) && (i = gen_next(g)) < g->r->m.nh) {
        unsigned ch = rd_u8(g->in);
        gen_reply(g, &g->r->m.h[i], ch, 0);
        done++;
        if (g->r->m.h[i].kind == MK_DOT || g->r->m.h[i].kind == MK_BDAT_LAST)
            continue;
    }
    if (!(arg & 8))
        deliver(g);
}

static void gen_raw(gen *g, unsigned arg)
{
    size_t n = arg == 15 ? (size_t)rd_u8(g->in) | (size_t)rd_u8(g->in) << 8
                         : arg * 16 + rd_u8(g->in) % 16;
    for (size_t i = 0; i < n && rd_more(g->in); i++)
        fz_put_u8(&g->pend, rd_u8(g->in));
    if (!(arg & 8) || arg == 15)
        deliver(g);
}

static void gen_extra(gen *g, unsigned arg)
{
    unsigned code = codes_extra[arg & 15];
    unsigned k = rd_u8(g->in);
    gen_line(&g->pend, code, 0, NULL, reply_texts[k & 3], reply_text_len[k & 3]);
    if (!(k & 0x80))
        deliver(g);
}

/* Nothing left to answer or do for the session to go on: what a patient host does next. */
static int auto_round(gen *g)
{
    run *r = g->r;
    if (r->closed_ev)
        return 0;
    if (gen_happy(g))
        return 1;
    if (r->tls_pending) {
        act1(g, A_TLS, 0, NULL, 0);
        return 1;
    }
    if (r->auth_owed) {
        act1(g, A_AUTH, 0, NULL, 0);
        return 1;
    }
    if (r->paused || r->budget != SIZE_MAX) {
        act1(g, A_FINAL, 0, NULL, 0);
        return 1;
    }
    if (r->cur < 0 && !r->quit_asked) {
        act1(g, A_QUIT, 0, NULL, 0);
        return 1;
    }
    return 0;
}

static void program(gen *g)
{
    rd *in = g->in;
    while (rd_more(in) && !g->r->closed_ev && g->r->fc->nact < MAXA - 64) {
        unsigned op = rd_u8(in), arg = op >> 4;
        switch (op & 15) {
        case 0: gen_server(g, arg); break;
        case 1: gen_raw(g, arg); break;
        case 2: gen_extra(g, arg); break;
        case 3:
            deliver(g);
            gen_submit(g, arg);
            break;
        case 4: act1(g, A_PAUSE, arg != 0, NULL, 0); break;
        case 5: act1(g, A_ABORT, 0, NULL, 0); break;
        case 6: act1(g, A_LOST, 0, NULL, 0); break;
        case 7: act1(g, A_QUIT, 0, NULL, 0); break;
        case 8: act1(g, A_TLS, arg & 1, NULL, 0); break;
        case 9: act1(g, A_AUTH, arg % NELEM(resp_choices), NULL, 0); break;
        case 10: act1(g, A_TIME, (size_t)time_choices[arg], NULL, 0); break;
        case 11:
            if (arg < 8)
                act1(g, A_BUDGET, budget_choices[arg], NULL, 0);
            else
                act1(g, A_WRITE, (size_t)1 << (arg - 8), NULL, 0);
            break;
        case 12: act1(g, A_BAD, arg, NULL, 0); break;
        case 13:
            for (unsigned k = 0; k <= arg && auto_round(g); k++)
                ;
            break;
        default: break;
        }
    }
    deliver(g);
    if (g->r->fc->auto_finish)
        for (int k = 0; k < 48 && auto_round(g); k++)
            ;
    act1(g, A_FINAL, 0, NULL, 0);
    act1(g, A_LOST, 0, NULL, 0); /* run 2 gets it too, whatever run 1's session did */
}

/* ------------------------------------------------------------------------------------------ */
/* Configuration and memory (oracle 5).                                                        */

static void make_config(fcase *fc, const uint8_t *h)
{
    smtpe_client_config *k = &fc->cfg;
    smtpe_client_config_init(k);
    k->helo_name = "client.example";
    k->lmtp = h[0] & 1;
    k->tls = (smtpe_tls_policy)((h[0] >> 1) & 3);
    k->chunking = (h[0] >> 3) & 1;
    k->pipelining = !((h[0] >> 4) & 1);
    k->line_ending = (h[0] & 0x20) ? SMTPE_LINE_ENDING_REFUSE : SMTPE_LINE_ENDING_NORMALISE;
    fc->auto_finish = (h[0] >> 7) & 1;
    k->auth_mechanism = mech_choices[h[1] & 7];
    int creds = (h[1] >> 3) & 3, longc = (h[1] >> 7) & 1;
    const char *user = "user@example.com", *pass = longc ? long_password : "secret";
    const char *token = longc ? long_token : "tok=en,1";
    if (creds != 3)
        k->auth_user = user;
    if (creds == 0 || creds == 2 || creds == 3)
        k->auth_password = pass;
    if (creds == 1 || creds == 2)
        k->auth_token = token;
    if (h[1] & 0x20)
        k->auth_authzid = longc ? long_authzid : "admin";
    k->auth_plaintext_ok = (h[1] >> 6) & 1;
    k->output_buffer_size = obs_choices[h[2] & 3];
    static const size_t chunks[] = {0, 1, 2, 7, 100, 1000, 1, 0};
    k->chunk_size = chunks[(h[2] >> 2) & 7];
    if (((h[2] >> 2) & 7) == 6)
        k->chunk_size = k->output_buffer_size - 64;
    k->max_unanswered = mu_choices[h[2] >> 5];
    k->max_reply_line = mrl_choices[h[3] & 7];
    switch ((h[3] >> 3) & 3) {
    case 0: k->max_reply_size = k->max_reply_line; break;
    case 1: k->max_reply_size = 2 * k->max_reply_line; break;
    case 2: k->max_reply_size = k->max_reply_line > 65536 ? k->max_reply_line : 65536; break;
    default: k->max_reply_size = 1048576; break;
    }
    k->max_recipients = mr_choices[h[3] >> 5];
    switch (h[4] & 3) {
    case 1:
        k->greeting_timeout_ms = k->command_timeout_ms = k->data_timeout_ms = 0;
        k->data_block_timeout_ms = k->data_end_timeout_ms = 0;
        break;
    case 2:
        k->greeting_timeout_ms = 1000;
        k->command_timeout_ms = 2000;
        k->data_timeout_ms = 3000;
        k->data_block_timeout_ms = 4000;
        k->data_end_timeout_ms = 5000;
        break;
    case 3:
        k->command_timeout_ms = 0;
        k->data_block_timeout_ms = 1000;
        break;
    default: break;
    }
    fc->t0 = t0_choices[(h[4] >> 2) & 3];
    static const char *const helos[] = {"client.example", "[192.0.2.1]", NULL, "localhost"};
    k->helo_name = helos[(h[4] >> 4) & 3] ? helos[(h[4] >> 4) & 3] : long_domain;
    if (h[4] & 0x40) {
        k->xclient = (h[7] & 0x20) ? xclient_long : xclient_attrs;
        k->xclient_count = (h[7] & 0x20) ? NELEM(xclient_long) : NELEM(xclient_attrs);
    }
    fc->octetwise = (h[4] >> 7) & 1;
    fc->split_seed = ((uint32_t)h[5] | (uint32_t)h[6] << 8) * 2654435761u | 1;
    fc->manual_tls = h[7] & 1;
    fc->manual_auth = (h[7] >> 1) & 1;
    static const int evl[] = {0, 1, 2, 0};
    fc->evlimit = evl[(h[7] >> 3) & 3];
    if (h[0] & 0x40) {
        smtpe_proxy_info *p = &fc->proxy;
        memset(p, 0, sizeof *p);
        p->version = (h[7] & 4) ? 2 : 1;
        p->family = SMTPE_PROXY_AF_INET;
        p->transport = SMTPE_PROXY_TRANSPORT_STREAM;
        memcpy(p->src_addr, "\xc0\x00\x02\x01", 4);
        memcpy(p->dst_addr, "\xc0\x00\x02\x02", 4);
        p->src_port = 1234;
        p->dst_port = 25;
        k->proxy = p;
        fc->proxy_len = smtpe__proxy_emit(p, fc->proxy_hdr, sizeof fc->proxy_hdr);
        FUZZ_CHECK(fc->proxy_len > 0, "smtpe__proxy_emit failed for a valid header");
    }
}

/* smtpe.h: "With the defaults (on LP64): 30800 octets" (smtpe_client_memory_size). Built with
 * -DFZ_DEFAULTS_MEMORY=0 (fuzz/regress/verify.sh, against an older engine whose struct had
 * another size): the engine's own figure for the defaults, as off LP64. */
#ifndef FZ_DEFAULTS_MEMORY
#define FZ_DEFAULTS_MEMORY 30800
#endif

#define ALIGNED(n) (((n) + _Alignof(max_align_t) - 1) / _Alignof(max_align_t) * _Alignof(max_align_t))

/* The formula but S: max_reply_line + output_buffer_size (the line buffer and the output ring,
 * rounded up to max_align_t since 0.4.0, where the command queue after them starts aligned;
 * not by the engines before it, which verify.sh checks with FZ_DEFAULTS_MEMORY=0), then the
 * command queue and the bitmaps. */
static size_t formula_without_s(const smtpe_client_config *k)
{
    size_t buffers = k->max_reply_line + k->output_buffer_size;
    if (FZ_DEFAULTS_MEMORY != 0)
        buffers = ALIGNED(buffers);
    return buffers + 12 * (k->max_unanswered / 6 + 8) + 2 * (((size_t)k->max_recipients + 7) / 8);
}

/* Oracle (5): S from the defaults' documented figure, then the formula for cfg. */
static void check_memory(const smtpe_client_config *k, size_t memsize)
{
    static size_t S;
    if (!S) {
        smtpe_client_config d;
        smtpe_client_config_init(&d);
        size_t m = smtpe_client_memory_size(&d);
        size_t doc = sizeof(void *) == 8 && FZ_DEFAULTS_MEMORY != 0 ? FZ_DEFAULTS_MEMORY : m;
        if (sizeof(void *) == 8 && m != doc) {
            fprintf(stderr, "memory_size of the defaults %zu, smtpe.h says %d\n", m,
                    FZ_DEFAULTS_MEMORY);
            FUZZ_CHECK(0, "memory_size of the defaults is not smtpe.h's figure");
        }
        /* the S (a whole number of max_align_t) for which the rounded formula gives doc */
        for (size_t s = _Alignof(max_align_t); s < doc; s += _Alignof(max_align_t))
            if (ALIGNED(s + formula_without_s(&d)) == doc) {
                FUZZ_CHECK(!S, "memory formula: two struct sizes fit the defaults' figure");
                S = s;
            }
        FUZZ_CHECK(S, "memory formula: no struct size gives the defaults' figure");
    }
    size_t f = ALIGNED(S + formula_without_s(k));
    if (memsize != f) {
        fprintf(stderr, "memory_size %zu, formula %zu (S %zu, max_reply_line %zu, "
                        "output_buffer_size %zu, max_unanswered %zu, max_recipients %u)\n",
                memsize, f, S, k->max_reply_line, k->output_buffer_size, k->max_unanswered,
                k->max_recipients);
        FUZZ_CHECK(0, "smtpe_client_memory_size is not the formula documented in smtpe.h");
    }
}

static void *count_alloc(size_t n, void *ud)
{
    acount *a = ud;
    a->allocs++;
    a->size = n;
    a->ptr = malloc(n);
    return a->ptr;
}

static void count_free(void *p, void *ud)
{
    acount *a = ud;
    FUZZ_CHECK(p == a->ptr, "smtpe_client_free released a block it was not given");
    a->frees++;
    free(p);
}

static void *fail_alloc(size_t n, void *ud)
{
    (void)n;
    ((acount *)ud)->allocs++;
    return NULL;
}

static void check_creation(const smtpe_client_config *k, size_t memsize)
{
    static int once;
    smtpe_client *c = NULL;
    acount a;
    memset(&a, 0, sizeof a);
    smtpe_allocator fa = {fail_alloc, count_free, &a};
    FUZZ_CHECK(smtpe_client_new(&c, k, &fa, 0) == SMTPE_ERR_NOMEM && c == NULL,
               "smtpe_client_new did not report a failed allocation as NOMEM");
    FUZZ_CHECK(a.allocs == 1, "a failed creation allocated more than once");
    uint8_t *mem = malloc(memsize);
    if (!mem)
        abort();
    FUZZ_CHECK(smtpe_client_init(&c, mem, memsize - 1, k, 0) == SMTPE_ERR_BUFFER_TOO_SMALL,
               "smtpe_client_init accepted memory one octet too small");
    free(mem);
    if (once++)
        return;
    /* configs the header calls bad: a bad string, a limit out of range */
    smtpe_client_config b = *k;
    b.helo_name = "bad name";
    FUZZ_CHECK(smtpe_client_memory_size(&b) == 0, "memory_size of a bad helo_name not 0");
    FUZZ_CHECK(smtpe_client_new(&c, &b, NULL, 0) == SMTPE_ERR_INVALID_ARGUMENT,
               "smtpe_client_new: a malformed helo_name is not INVALID_ARGUMENT");
    b = *k;
    b.max_reply_line = 511;
    FUZZ_CHECK(smtpe_client_memory_size(&b) == 0, "memory_size of max_reply_line 511 not 0");
    FUZZ_CHECK(smtpe_client_new(&c, &b, NULL, 0) == SMTPE_ERR_CONFIG,
               "smtpe_client_new: a limit out of range is not SMTPE_ERR_CONFIG");
    FUZZ_CHECK(smtpe_client_memory_size_versioned(99, k) == 0,
               "memory_size of an unknown config version not 0");
}

/* ------------------------------------------------------------------------------------------ */
/* The runs.                                                                                   */

static void run_begin(run *r, fcase *fc, int split)
{
    memset(r, 0, sizeof *r);
    r->fc = fc;
    r->split = split;
    r->now = fc->t0;
    r->budget = SIZE_MAX;
    r->cur = -1;
    r->rng = fc->split_seed;
    r->closed_total = UINT64_MAX;
    r->deadline = UINT64_MAX;
    m_init(r);
}

static void run_start(run *r)
{
    if (CFG(r)->tls == SMTPE_TLS_IMPLICIT) {
        /* the PROXY header goes before the handshake, then TLS is up */
        flush(r, SIZE_MAX);
        int rc = smtpe_client_tls_started(r->c, r->now);
        LOGF(r, "tls_started %d\n", rc);
        FUZZ_CHECK(rc == 0, "tls_started refused for SMTPE_TLS_IMPLICIT before the greeting");
        m_tls_up(r);
    }
    pump(r, 0);
}

/* The end: every transaction had its DONE, the content on the wire is the content. */
static void run_finish(run *r)
{
    FUZZ_CHECK(r->closed_ev, "the session did not end with CLOSED after smtpe_client_lost");
    FUZZ_CHECK(smtpe_client_content_held(r->c) == 0,
               "content_held is not 0 once the session is lost (its spans must be dropped)");
    if ((r->m.mode == MC_LINE || r->m.mode == MC_LONE) && r->m.line.len > 0)
        m_fail(r, "the client's output ends inside a command line", r->m.line.p, r->m.line.len);
    for (size_t i = 0; i < r->fc->ntx; i++) {
        const rtxn *rt = &r->tx[i];
        const ftxn *f = &r->fc->tx[i];
        if (!rt->submitted)
            continue;
        FUZZ_CHECK(rt->done, "a transaction never had its TRANSACTION_DONE");
        if (!rt->mail_on_wire)
            continue;
        const uint8_t *e = f->t.body == SMTPE_BODY_BINARYMIME ? f->content : f->ref.e.p;
        size_t en = f->t.body == SMTPE_BODY_BINARYMIME ? f->len : f->ref.e.len;
        if (!rt->bdat)
            FUZZ_CHECK(!rt->dd_bad, "DATA content on the wire holds a bare CR, bare LF or NUL");
        if (rt->bdat && f->t.body != SMTPE_BODY_BINARYMIME)
            FUZZ_CHECK(fz_first_bare(rt->wire.p, rt->wire.len) == rt->wire.len,
                       "BDAT content on the wire holds a bare CR, bare LF or NUL");
        if (rt->end_seen) {
            FUZZ_CHECK(!rt->refuse_mid, "the end of content the engine had to refuse went out");
            FUZZ_CHECK(!rt->aborted, "the end of an aborted message went out");
            FUZZ_CHECK(rt->gave_last, "the end of the content went out before the host's last "
                                      "piece");
            if (!fz_eq(rt->wire.p, rt->wire.len, e, en)) {
                fprintf(stderr, "txn %zu: %zu octets on the wire, %zu submitted (normalised)\n",
                        i, rt->wire.len, en);
                FUZZ_CHECK(0, "the content on the wire is not the submitted content "
                              "(normalised)");
            }
        } else {
            FUZZ_CHECK(rt->wire.len <= en && fz_eq(rt->wire.p, rt->wire.len, e, rt->wire.len),
                       "the content on the wire so far is not a prefix of the submitted content");
        }
    }
}

static void run_free(run *r)
{
    fz_free(&r->log);
    fz_free(&r->out);
    for (size_t i = 0; i < MAXT; i++)
        fz_free(&r->tx[i].wire);
    m_free(&r->m);
}

static void log_diff(const run *a, const run *b)
{
    size_t k = 0;
    while (k < a->log.len && k < b->log.len && a->log.p[k] == b->log.p[k])
        k++;
    size_t s = k;
    while (s > 0 && a->log.p[s - 1] != '\n')
        s--;
    fprintf(stderr, "logs part at octet %zu:\n--- whole:\n%.*s\n--- split:\n%.*s\n", k,
            (int)((a->log.len - s) < 600 ? a->log.len - s : 600), (const char *)a->log.p + s,
            (int)((b->log.len - s) < 600 ? b->log.len - s : 600), (const char *)b->log.p + s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t h[HDR];
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    tables_init();
    texts_init();
    memset(h, 0, sizeof h);
    memcpy(h, data, size < HDR ? size : HDR);
    fcase *fc = calloc(1, sizeof *fc);
    if (!fc)
        abort();
    make_config(fc, h);
    size_t memsize = smtpe_client_memory_size(&fc->cfg);
    FUZZ_CHECK(memsize > 0, "smtpe_client_memory_size refused a config smtpe.h calls valid");
    check_memory(&fc->cfg, memsize);
    check_creation(&fc->cfg, memsize);

    /* run 1: whole reads, caller memory of exactly memory_size octets */
    run *r1 = calloc(1, sizeof *r1), *r2 = calloc(1, sizeof *r2);
    if (!r1 || !r2)
        abort();
    run_begin(r1, fc, 0);
    r1->mem = malloc(memsize);
    if (!r1->mem)
        abort();
    FUZZ_CHECK(smtpe_client_init(&r1->c, r1->mem, memsize, &fc->cfg, fc->t0) == 0,
               "smtpe_client_init failed with memory_size octets");
    TRACE("=== run 1 (whole)\n");
    run_start(r1);
    gen g;
    memset(&g, 0, sizeof g);
    rd in = {data + (size < HDR ? size : HDR), size > HDR ? size - HDR : 0, 0};
    g.r = r1;
    g.in = &in;
    program(&g);
    fz_free(&g.pend);
    run_finish(r1);

    /* run 2: the same record, reads in pieces, smtpe_client_new with a counting allocator */
    acount a;
    memset(&a, 0, sizeof a);
    smtpe_allocator al = {count_alloc, count_free, &a};
    run_begin(r2, fc, 1);
    FUZZ_CHECK(smtpe_client_new(&r2->c, &fc->cfg, &al, fc->t0) == 0, "smtpe_client_new failed");
    FUZZ_CHECK(a.allocs == 1 && a.size == memsize,
               "smtpe_client_new did not make exactly one allocation of memory_size octets");
    TRACE("=== run 2 (split)\n");
    run_start(r2);
    for (size_t i = 0; i < fc->nact; i++)
        exec_action(r2, &fc->act[i]);
    run_finish(r2);
    FUZZ_CHECK(a.allocs == 1 && a.frees == 0, "the session allocated or freed after creation");
    smtpe_client_free(r2->c);
    FUZZ_CHECK(a.frees == 1, "smtpe_client_free did not release the session's block");

    if (trace > 0)
        fprintf(stderr, "--- log whole:\n%.*s--- log split:\n%.*s", (int)r1->log.len,
                (const char *)r1->log.p, (int)r2->log.len, (const char *)r2->log.p);
    if (!fz_eq(r1->out.p, r1->out.len, r2->out.p, r2->out.len)) {
        fprintf(stderr, "--- client octets, whole (%zu):\n%.*s\n--- split (%zu):\n%.*s\n",
                r1->out.len, (int)(r1->out.len < 4000 ? r1->out.len : 4000),
                (const char *)r1->out.p, r2->out.len,
                (int)(r2->out.len < 4000 ? r2->out.len : 4000), (const char *)r2->out.p);
        FUZZ_CHECK(0, "split invariance: the client octets differ between whole and split reads");
    }
    if (!fz_eq(r1->log.p, r1->log.len, r2->log.p, r2->log.len)) {
        log_diff(r1, r2);
        FUZZ_CHECK(0, "split invariance: the event log differs between whole and split reads");
    }

    run_free(r1);
    run_free(r2);
    free(r1->mem);
    free(r1);
    free(r2);
    for (size_t i = 0; i < fc->nact; i++)
        free(fc->act[i].p);
    for (size_t i = 0; i < fc->ntx; i++) {
        free(fc->tx[i].content);
        fz_free(&fc->tx[i].ref.e);
    }
    free(fc);
    return 0;
}
