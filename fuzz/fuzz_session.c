/*
 * fuzz_session.c - libFuzzer target over a whole server session, driven through the public API
 * exactly as a host drives it (smtpe_server_recv / next_event / reply / accept / reply_id /
 * accept_id / close / auth_challenge / tls_started / set_trusted / send_buf / send_ack / expiry /
 * handle_expiry).
 *
 * Input layout (all multi-octet numbers little-endian; a short input is padded with zeros):
 *
 *   [0]      line-ending policy (value % 3: REFUSE, NORMALISE, KEEP)
 *   [1]      bit 0 lax angle brackets, bit 1 ehlo_extra lines, bit 2 long (255-octet) hostname,
 *            bit 3 custom greeting text, bits 4-5 timeouts (defaults, none, 1000/1000, 1000/none),
 *            bit 6 trusted peer (smtpe_server_set_trusted(s, 1) after creation), bit 7 implicit
 *            TLS (smtpe_server_tls_started right after creation; with proxy_protocol right after
 *            the PROXY verdict, since the header comes before the handshake)
 *   [2]      max_message_size: <32 default (10 MiB), <64 none (0), else (v-64)*8+1 octets
 *   [3]      max_recipients: <128 1+v%4, <192 100, else v
 *   [4]      max_errors: <128 v%6 (0: no limit), else default (20)
 *   [5]      extensions, SMTPE_EXT_* bits 0-7 (PIPELINING SIZE 8BITMIME SMTPUTF8
 *            ENHANCEDSTATUSCODES STARTTLS CHUNKING BINARYMIME)
 *   [6]      reply_buffer_size: one of 2048, 2100, 3000, 4096, 65536 (v % 5)
 *   [7]      max_line_length: one of 512, 513, 600, 1000, 4096 (v % 5)
 *   [8..9]   D: number of decision octets at the end of the input (clipped to what is there)
 *   [10..13] seed of the generator that takes over when the decision octets run out (mixed by
 *            splitmix64, so nearby seeds give unrelated decisions)
 *   [14]     bits 0-1 start time: 0, 1000, 2^40 or 2^62 ms; bit 2 auth_without_tls, bit 3
 *            require_tls, bit 4 lmtp, bit 5 proxy_protocol, bits 6-7 max_pending_verdicts:
 *            1 (the default), 2, 8 or 100
 *   [15]     bits 0-5 SMTPE_EXT_* bits 8-13 (DSN REQUIRETLS MT-PRIORITY DELIVERBY XCLIENT
 *            XFORWARD); bits 6-7 auth_mechanisms: NULL, "PLAIN LOGIN", "PLAIN LOGIN XOAUTH2",
 *            "X-TOKEN LOGIN CRAM-MD5 PLAIN"
 *   [16..len-D)  the client octets
 *   [len-D..len) decision octets, read in order (FuzzedDataProvider style): split points, host
 *                verdicts (accept, a reply with a code from a list for the event type, a host
 *                close, a SASL challenge of fuzz-chosen octets, or a verdict deferred for a
 *                few feeds; with or without the event's id), which owed verdict to look at
 *                next, the octets that follow an accepted STARTTLS before TLS is up, clock
 *                advances with handle_expiry calls, how long each write of output stays in
 *                flight and how much of it is acknowledged.
 *
 * A seed corpus file is therefore 16 header octets followed by a plain SMTP client transcript.
 * Zero in every bit that was reserved before (bits 5-7 of [5], bits 6-7 of [1], bits 2-7 of
 * [14], all of [15]) is the configuration the target had before STARTTLS, AUTH, BDAT, LMTP,
 * PROXY, XCLIENT and concurrent verdicts existed, so old seeds keep their meaning.
 *
 * Each input runs the session twice:
 *   run 1 ("split"): client octets arrive in fuzz-chosen pieces; output is written
 *     asynchronously: the host hands send_buf's (p, len) to a write that stays in flight for a
 *     fuzz-chosen number of further engine calls (recv, next_event, verdicts, close, expiry,
 *     handle_expiry, tls_started), after each of which p must still hold the same octets and
 *     send_buf must give the same p with a length >= len; then the write completes with a
 *     fuzz-chosen part of it (0..len), which is acknowledged (so reply-buffer backpressure
 *     happens; a decision octet 255 stalls the peer: nothing is sent for the next 1..256
 *     chances, unless the host has nothing else to do). After a partial acknowledgement
 *     send_buf must give the rest at p + n; only once a run is all acknowledged may it give a
 *     second run (the ring's other part) elsewhere. Verdicts may be deferred; with
 *     max_pending_verdicts N > 1 the host keeps the verdicts it owes (id, type, a copy of the
 *     event's spans) in a list and gives them in a fuzz-chosen order at fuzz-chosen moments
 *     (smtpe_server_reply_id / accept_id, or the calls without an id when the verdict is the
 *     oldest owed), interleaved with further recv calls, so MAIL and the RCPTs after it are
 *     handed out before any verdict; a host close waits until its command's verdict is the
 *     oldest owed. The session is made by smtpe_server_new with a counting allocator.
 *   run 2 ("whole"): all client octets are available at once, output is always sent in full at
 *     once, every verdict is given as soon as its event is taken (one at a time, in order),
 *     with the same N; the session lives in caller memory (smtpe_server_init).
 * smtpe.h promises that concurrent verdicts change when replies leave, never what they say (but
 * for the bound on MAIL/RCPT reply length, the same for both runs as N is): so both runs must
 * put the same octets on the wire.
 *
 * Keying the host decisions. The decisions (verdict, reply code/text, challenge, deferral,
 * clock advance, pre-TLS octets) are drawn by run 1 and replayed by run 2, keyed by what both
 * runs share: the client octets consumed when the event was taken (the end of its command line
 * in the stream, or of the content or chunk the event ends: the engine consumes nothing while an
 * event waits, and a command line it parked is the last it read), the event type, and for the
 * verdicts of one LMTP DATA_END the verdict's number. QUIT, TIMEOUT, ERROR_LIMIT and
 * PROXY_INVALID come once per session and are keyed by their type alone (after a close inside a
 * batch run 1 has read further than run 2). Never by the split, the order of verdicts or the
 * index of the event: run 1 can take RCPT events run 2 never sees, a RCPT handed out before its
 * MAIL's verdict when the MAIL is then refused ("voided": the engine answers it 503 5.5.1 itself
 * and its verdict, still owed, changes nothing and returns SMTPE_VOIDED; run 2 executes that
 * line after the refusal and answers 503 without an event), and a RCPT handed out after the
 * command the session then closes at (a 421, a host close, the error limit reached by an
 * earlier reply: "dropped"; run 2 never reads that line).
 *
 * The clock. It only moves right after an event has been handled (a verdict event: after its
 * last verdict), in both runs, so the timeouts see the same history; with N > 1 not after MAIL
 * and RCPT (their verdicts come in another order and at other moments in run 1, and no timer
 * runs while one is owed anyway), and before time moves run 1 gives the verdicts it still owes
 * for voided RCPTs (an owed verdict stops the timer; run 2 owes none). Between two clock steps
 * every recv, verdict and timer restart happens at the same time in both runs.
 *
 * STARTTLS: when a verdict leaves the session wanting SMTPE_WANT_TLS, the host model is "the
 * next K octets of the client stream were sent before the handshake": K comes from the decision
 * of the STARTTLS event, so it is the same in both runs whatever the host had already read. The
 * host feeds exactly those K octets (in pieces in the split run), which the engine must consume
 * whole and discard, sends all output, calls smtpe_server_tls_started and goes on with the rest
 * of the stream as the decrypted client.
 *
 * Oracles (abort on violation):
 *   (a) split invariance: both runs put the same octets on the wire (in acknowledgement order,
 *       whatever the write delays, partial acknowledgements and order of verdicts: so every
 *       reply answers the command it is in the position of) and give the same event log: per
 *       event taken, in that order, its fields (DATA_CHUNK contents coalesced, whatever the DATA
 *       or BDAT chunk boundaries; ids, which count events never taken, left out), ev.abandoned,
 *       the return codes of its verdicts and the expiry checks after it, less, in run 1, the
 *       voided and dropped RCPTs (above); the same statistics (discarded_octets, tls,
 *       authenticated too) and octets consumed (after a close inside a batch: what run 2 read
 *       and executed, up to the command the session closed at);
 *   (b) output: every reply line matches ^[2-5][0-9][0-9][ -], ends in CRLF, has no other
 *       control octet, is at most 512 octets (a "334 " SASL challenge at most 4 + 2048 + 2,
 *       base64 of up to 1536 octets), and a "ddd-" line is followed by one of the same code; a
 *       line whose text starts with an enhanced status code (d.d.d then SP or CRLF) has a valid
 *       one (RFC 3463 §2) whose class is the reply code's first digit, and the lines of one
 *       reply all carry the same one or none; the output ends with a complete reply; queued
 *       output never changes before it is sent;
 *   (b') stable output: octets handed out by send_buf keep their address and content until
 *       acknowledged, whatever calls come in between; send_buf gives them again (same address,
 *       length at least as large, new replies queued behind them), after a partial
 *       acknowledgement the rest at the next address, and nothing else while a run is not all
 *       acknowledged; send_ack refuses more than send_buf gave;
 *   (c) DATA content (fz_check_dot_content in fuzz_util.h), against the octets the engine
 *       consumed between the DATA line and the DATA_END event: in every policy the first
 *       CRLF.CRLF (counting the DATA line's CRLF) is exactly where the content ended (SMTP
 *       smuggling); with U those octets less the final ".\r\n" dot-unstuffed by a reference
 *       (first '.' of each CRLF-started line deleted), the concatenated chunks are U (REFUSE,
 *       KEEP) or U normalised (NORMALISE) for status OK, a prefix of it otherwise, exactly
 *       max_message_size octets for TOO_BIG; BAD_LINE_ENDING / NORMALISED iff U holds a bare
 *       CR, bare LF or NUL; and, as its own oracle, the dot-stuffing round trip: content that
 *       ended OK without normalisation, from octets the client stuffed correctly, re-stuffed
 *       plus ".\r\n" is exactly the octets consumed up to the end of CRLF.CRLF (unstuffing is
 *       not one-to-one on a line like ".x" that was not stuffed, and under NORMALISE a '.' after
 *       a bare line break comes to a line start, so neither gets the round trip);
 *       DATA_END.size is the octets delivered (at least those when the status is not OK);
 *       HAS_8BIT says whether one was above 127; DATA never comes after BODY=BINARYMIME;
 *   (c') BDAT content: the raw chunk octets are the SIZE octets right after each BDAT line (the
 *       engine consumes exactly them: CHUNK_END and a chunked DATA_END come with the consumed
 *       offset at the chunk's end). For the message the chunks are one text: under KEEP or
 *       BODY=BINARYMIME the content is the raw octets, under NORMALISE the reference normaliser
 *       applied to them (NORMALISED iff one was bare), under REFUSE the raw octets up to the
 *       first bare CR/LF/NUL (status BAD_LINE_ENDING iff there is one). Status OK: content equal,
 *       size = content; otherwise the content is a prefix, exactly max_message_size long for
 *       TOO_BIG. BAD_LINE_ENDING is reported at the LAST chunk (spec: refused content is read
 *       to its end). Every BDAT gets exactly one reply: the CHUNK_END verdict, the DATA_END
 *       verdicts (one per recipient under LMTP, after LAST only), or the engine's refusal, which
 *       for a chunk without LAST is one reply even under LMTP (RFC 3030 §2, RFC 2033 §4.2);
 *   (d) memory: smtpe_server_new makes exactly one allocation of smtpe_server_memory_size(cfg)
 *       octets, none afterwards, and smtpe_server_free releases that one; memory_size(cfg) is
 *       smtpe.h's formula S + N * (B + 40) + O + L (formula_without_s below) with the same S (the
 *       session struct, rounded to max_align_t) for every config, and on LP64 the figures
 *       smtpe.h gives for the defaults (6214, 57414 with lmtp, 111552 with
 *       max_pending_verdicts 100);
 *   (e) smtpe_server_recv returns 0..len; next_event returns 0 or 1 and agrees with
 *       SMTPE_WANT_EVENT; send_buf agrees with SMTPE_WANT_WRITE; recv consumes only with
 *       SMTPE_WANT_READ, and with it consumes or makes an event, and consumes nothing while a
 *       verdict other than MAIL/RCPT (with N = 1: any) is owed; a session at rest wants to read
 *       (having consumed everything) or to close; expiry(now) is UINT64_MAX while an event waits
 *       or a verdict is owed, and handle_expiry agrees with expiry(now), which restarts the
 *       timeout from now after a verdict (the host calls it after every event, as it arms its
 *       timer); accept succeeds whenever a verdict is due; every verdict call that succeeds
 *       queues exactly one reply (a failed one queues nothing; under concurrent verdicts see
 *       (n)); a 421 verdict makes the session close once its reply goes out; event spans
 *       lie in session memory (paths, arguments, credentials, TLVs, attributes) or in the octets
 *       just fed (chunks; or a static CR/LF/CRLF); events come only when the configuration and
 *       the session's state allow them (STARTTLS offered, AUTH offered and not yet done, XCLIENT
 *       to a trusted peer, BDAT with CHUNKING in a transaction with a recipient, MAIL after an
 *       accepted HELO and, with require_tls, under TLS);
 *   (f) STARTTLS: after the verdict that accepts it, every octet fed before tls_started is
 *       consumed at once and produces no event and no reply; stats.discarded_octets counts them;
 *       tls_started fails while the 220 is unsent and succeeds once it is; a second call fails;
 *   (g) AUTH: the decoded credentials (authzid, authcid, password, response) lie in session
 *       memory and are all zero right after the host's verdict, challenge or close;
 *       auth_challenge is refused for PLAIN, LOGIN and every other event, accepted for other
 *       mechanisms (up to 1536 octets), and the next step of the exchange comes as step + 1;
 *   (h) LMTP: a DATA_END with status OK takes exactly ev.data_end.replies verdicts (one per
 *       accepted recipient; 1 without LMTP), each chosen separately and each queueing one reply;
 *       SMTPE_WANT_VERDICT stays set until the last;
 *   (i) PROXY_INVALID: nothing has been queued or sent and the session wants only to close;
 *       PROXY: the TLVs walk exactly;
 *   (j) want()/expiry(): SMTPE_WANT_TLS comes with SMTPE_WANT_READ (the octets read before the
 *       handshake are fed and discarded), never with EVENT or CLOSE, and no verdict but a voided
 *       RCPT's is owed meanwhile; expiry(now) is UINT64_MAX;
 *   (k) room: a verdict refused with SMTPE_ERR_REPLY_TOO_LONG is refused again once the host
 *       has sent everything queued (too long is a property of the reply, never of unsent
 *       output: the engine takes input only while it keeps room for the reply it will owe,
 *       under LMTP one line per recipient); a MAIL/RCPT reply is refused as too long exactly
 *       when its text breaks smtpe_server_reply's limits or, with N > 1, its formatted octets
 *       exceed the line buffer bound B = max(max_line_length - 2, 512), whichever its turn (not
 *       for a voided RCPT, whose verdict has no reply), and queues nothing;
 *   (l) verbatim (a close text over 600 octets may give way to the code's default text, which
 *       smtpe.h allows when it cannot fit behind unsent replies): the reply a successful
 *       smtpe_server_reply / smtpe_server_close queues is
 *       exactly the host's text as smtpe.h describes it (one line per text line, "ddd-" /
 *       "ddd ", the enhanced code, given or "x.0.0", before each line's text when
 *       ENHANCEDSTATUSCODES is on and the code is not 3xx; PROXY/XCLIENT 220: the greeting
 *       "<hostname> <text>"), nothing cut; an error reply past max_errors becomes 421 and
 *       closes instead. HELO/EHLO 2xx replies are not compared. (Checked when the reply goes out
 *       with its verdict; a held one is checked by run 2, which gives it at once.)
 *   (m) verdict bookkeeping: smtpe_server_reply_id / accept_id for an id no taken event owes a
 *       verdict for (0, one not yet given, the event waiting to be taken, one answered already)
 *       and the calls without an id while the host owes nothing return SMTPE_ERR_STATE and queue
 *       nothing; once the session starts closing every verdict still owed does;
 *       SMTPE_WANT_VERDICT is set exactly while the host owes a verdict for a taken event; the
 *       spans of each owed event hold what they held at next_event until its own verdict (a
 *       voided RCPT's too), or, for a verdict dropped by the close, until the session is freed;
 *       a verdict returns SMTPE_VOIDED exactly when it is a voided RCPT's (and its arguments
 *       are valid); ev.id increases from event to event (0 for DATA_CHUNK);
 *       ev.abandoned is 1 exactly when RSET, HELO, QUIT, TIMEOUT or ERROR_LIMIT ends a
 *       transaction whose MAIL got a 2xx verdict and whose content has not ended since, 0 on
 *       every other event;
 *   (n) concurrent verdicts (N > 1): while a MAIL or RCPT verdict is owed only RCPTs are handed
 *       out, never one that could pass max_recipients were those waiting accepted, and no command
 *       read is answered before them; a verdict for a command that is not the oldest owed queues
 *       nothing (it waits its turn); the verdict for the oldest releases exactly the replies of
 *       the commands from it up to the next one still waiting (a refused MAIL: of all commands
 *       after it, 503 for its RCPTs), plus the reply of a command the engine then executes; a
 *       voided RCPT's verdict queues nothing and adds no recipient; commands held (events owed,
 *       engine replies waiting their turn, voided RCPTs owed) never exceed N.
 *   Reply counts are taken from what send_buf shows: after a partial acknowledgement replies may
 *   go to the ring's second run, unseen until the first is all acknowledged, so counts are then
 *   upper-bounded only (run 1 acknowledges the whole run before a batch starts, so that a batch's
 *   replies are counted from an exact start); run 2 always counts exactly.
 *
 * Reproduce a crash: fuzz/out/fuzz_session CRASHFILE (it prints what was violated; with
 * FUZZ_TRACE=1 in the environment it also prints every call and event of both runs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "smtpe.h"

#define HDR 16

/* FUZZ_TRACE=1 in the environment prints what each run does, to read a reproducer. */
static int trace = -1;
#define TRACE(...)                                                                              \
    do {                                                                                        \
        if (trace > 0)                                                                          \
            fprintf(stderr, __VA_ARGS__);                                                       \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* The decision provider: octets from the input, then a xorshift generator seeded from it.     */

typedef struct prov {
    const uint8_t *p;
    size_t n;
    size_t i;
    uint64_t x;
} prov;

static unsigned prov_u8(prov *d)
{
    if (d->i < d->n)
        return d->p[d->i++];
    d->x ^= d->x << 13;
    d->x ^= d->x >> 7;
    d->x ^= d->x << 17;
    return (unsigned)(d->x >> 29) & 0xff;
}

/* ------------------------------------------------------------------------------------------ */
/* Host decisions, keyed by the index of the non-chunk event (index 0: session start).         */

enum { K_NONE, K_ACCEPT, K_REPLY, K_CLOSE, K_CHALLENGE };

#define CHAL_MAX 16       /* challenge octets a decision holds */
#define CHAL_BIG 1536     /* the longest challenge smtpe_server_auth_challenge takes */

typedef struct decision {
    int kind;
    unsigned code;
    const char *enhanced;
    const char *text;
    unsigned defer;   /* feeds to hold the verdict back (split run only) */
    int use_id;       /* smtpe_server_reply_id / accept_id rather than reply / accept (the
                         forms with an id are always used for an event that is not the oldest
                         one owed) */
    uint64_t advance; /* ms the clock moves on after the event */
    size_t junk;      /* STARTTLS: client octets sent before the TLS handshake */
    size_t chal_len;  /* K_CHALLENGE: octets (CHAL_BIG and CHAL_BIG + 1 from chal_big) */
    uint8_t chal[CHAL_MAX];
} decision;

static const unsigned helo_codes[] = {250, 421, 450, 451, 501, 504, 550, 554};
static const unsigned mail_codes[] = {250, 251, 421, 450, 451, 452, 503, 550, 551, 552, 553, 555};
static const unsigned rcpt_codes[] = {250, 251, 252, 421, 450, 451, 452, 550, 551, 552, 553};
static const unsigned data_codes[] = {354, 421, 451, 452, 503, 550, 554};
static const unsigned end_codes[] = {250, 421, 450, 451, 452, 550, 552, 554};
static const unsigned vrfy_codes[] = {250, 251, 252, 421, 502, 550, 551, 553};
static const unsigned unknown_codes[] = {500, 502, 504, 250, 421};
static const unsigned starttls_codes[] = {220, 454, 454, 220, 421, 501, 554};
static const unsigned auth_codes[] = {235, 535, 535, 454, 534, 421, 538, 250};
static const unsigned chunk_codes[] = {250, 452, 554, 451, 552, 421};
static const unsigned proxy_codes[] = {220, 421, 554, 550, 220, 250};
static const unsigned xclient_codes[] = {220, 550, 421, 501, 250, 220};
static const unsigned xforward_codes[] = {250, 421, 550, 501};
static const unsigned odd_codes[] = {0, 199, 200, 299, 300, 354, 599, 600, 999};
static const unsigned close_codes[] = {421, 421, 221, 554, 550, 500, 250};

static char text_400[401];     /* one line of 400 octets: the most a line may hold */
static char text_401[402];     /* one octet too many */
static char text_lines[1200];  /* 100 short lines */
static char text_many[2200];   /* 700 one-octet lines: more text than a small buffer holds */
static char text_total[2100];  /* 2049 octets of text in 6 lines: over the total */
static uint8_t chal_big[CHAL_BIG + 1];
static char text_3x300[900];   /* lines of 300, 299, 298 octets: a greeting (hostname SP text)
                                  longer than one 512-octet buffer */

static const char *texts[] = {
    NULL, text_3x300, "Ok", "", "first line\nsecond line", "a\n\nb", text_400, text_401,
    "tab\there", "trailing newline\n", "\n", "caf\xc3\xa9 na\xc3\xafve", "cr\rin text",
    text_lines, text_many, text_total,
};

static void texts_init(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    memset(text_400, 'x', 400);
    memset(text_401, 'y', 401);
    size_t o = 0;
    for (int i = 0; i < 100; i++)
        o += (size_t)snprintf(text_lines + o, sizeof text_lines - o, "%sline %d", i ? "\n" : "",
                              i);
    o = 0;
    for (int i = 0; i < 700; i++) {
        if (i)
            text_many[o++] = '\n';
        text_many[o++] = 'm';
    }
    memset(text_3x300, 'g', sizeof text_3x300 - 1);
    text_3x300[300] = text_3x300[600] = '\n';
    memset(text_total, 't', 2054);
    for (int i = 1; i <= 5; i++)
        text_total[i * 342] = '\n';
    for (size_t i = 0; i < sizeof chal_big; i++)
        chal_big[i] = (uint8_t)(i * 7 + 3);
}

static const char *enhanced_for(prov *pv, unsigned code)
{
    static const char *match[] = {"2.0.0", "2.1.5", "4.3.0", "4.7.1", "5.1.1", "5.7.1"};
    unsigned v = prov_u8(pv) % 8;
    unsigned cls = code / 100;
    switch (v) {
    case 0: case 1: case 2: return NULL;
    case 3: case 4:
        if (cls == 2) return match[v - 3];
        if (cls == 4) return match[v - 1];
        if (cls == 5) return match[v + 1];
        return "3.0.0";
    case 5: return "5.7.1";
    case 6: return "2.999.999";
    default: return (prov_u8(pv) & 1) ? "5.1" : "5.1000.1";
    }
}

#define PICK(arr, v) ((arr)[(v) % (sizeof(arr) / sizeof((arr)[0]))])

static unsigned code_for(prov *pv, smtpe_event_type t)
{
    unsigned v = prov_u8(pv);
    if (v >= 248)
        return PICK(odd_codes, v);
    switch (t) {
    case SMTPE_EV_HELO: return PICK(helo_codes, v);
    case SMTPE_EV_MAIL: return PICK(mail_codes, v);
    case SMTPE_EV_RCPT: return PICK(rcpt_codes, v);
    case SMTPE_EV_DATA: return PICK(data_codes, v);
    case SMTPE_EV_DATA_END: return PICK(end_codes, v);
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: return PICK(vrfy_codes, v);
    case SMTPE_EV_STARTTLS: return PICK(starttls_codes, v);
    case SMTPE_EV_AUTH: return PICK(auth_codes, v);
    case SMTPE_EV_CHUNK_END: return PICK(chunk_codes, v);
    case SMTPE_EV_PROXY: return PICK(proxy_codes, v);
    case SMTPE_EV_XCLIENT: return PICK(xclient_codes, v);
    case SMTPE_EV_XFORWARD: return PICK(xforward_codes, v);
    default: return PICK(unknown_codes, v);
    }
}

static uint64_t advance_for(prov *pv, const smtpe_server_config *cfg)
{
    uint64_t cmd = cfg->command_timeout_ms ? cfg->command_timeout_ms : 1000000000u;
    uint64_t dat = cfg->data_timeout_ms ? cfg->data_timeout_ms : 1000000000u;
    unsigned v = prov_u8(pv);
    if (v < 224)
        return 0;
    if (v < 238)
        return 1 + prov_u8(pv) * 4u;
    if (v < 244)
        return cmd - 1;
    if (v < 248)
        return cmd;
    if (v < 251)
        return dat - 1;
    if (v < 254)
        return dat;
    return 1000000000u;
}

static decision draw_decision(prov *pv, smtpe_event_type t, int needs_reply,
                              const smtpe_server_config *cfg)
{
    decision d;
    memset(&d, 0, sizeof d);
    d.kind = K_NONE;
    if (needs_reply) {
        unsigned b = prov_u8(pv);
        d.defer = (b & 3) == 3 ? 1 + (b >> 2) % 4 : 0;
        d.use_id = b >> 7;
        if (cfg->max_pending_verdicts > 1 && (t == SMTPE_EV_MAIL || t == SMTPE_EV_RCPT)) {
            /* concurrent verdicts: hold MAIL and RCPT verdicts back longer, so that the RCPTs
             * that follow are handed out meanwhile and the verdicts come in any order */
            switch (b & 3) {
            case 0: d.defer = 0; break;
            case 1: d.defer = 1 + (b >> 2) % 4; break;
            case 2: d.defer = 1 + (b >> 2) % 24; break;
            default: d.defer = 8 + (b >> 2) % 64; break;
            }
            d.use_id = prov_u8(pv) & 1;
        }
        unsigned v = prov_u8(pv);
        int auth = t == SMTPE_EV_AUTH; /* accepted less often, so that exchanges go on */
        if (auth && v >= 64 && v < 128) {
            /* a SASL challenge: for PLAIN and LOGIN it is refused and the host accepts */
            d.kind = K_CHALLENGE;
            unsigned l = prov_u8(pv);
            if (l >= 252) {
                d.chal_len = CHAL_BIG + (l & 1);
            } else {
                d.chal_len = l % (CHAL_MAX + 1);
                for (size_t i = 0; i < d.chal_len; i++)
                    d.chal[i] = (uint8_t)prov_u8(pv);
            }
        } else if (v < (auth ? 64u : 170u)) {
            d.kind = K_ACCEPT;
        } else if (v < 250) {
            d.kind = K_REPLY;
            d.code = code_for(pv, t);
            d.enhanced = enhanced_for(pv, d.code);
            d.text = PICK(texts, prov_u8(pv));
        } else {
            d.kind = K_CLOSE;
            d.code = PICK(close_codes, prov_u8(pv));
            d.enhanced = enhanced_for(pv, d.code);
            d.text = PICK(texts, prov_u8(pv) % 6);
        }
    }
    if (t == SMTPE_EV_STARTTLS) {
        unsigned v = prov_u8(pv);
        d.junk = v < 128 ? 0 : v < 200 ? 1 + v % 8 : v < 250 ? 1 + prov_u8(pv) * 2u : SIZE_MAX;
    }
    d.advance = advance_for(pv, cfg);
    return d;
}

/* ------------------------------------------------------------------------------------------ */
/* A counting allocator: oracle (d).                                                            */

typedef struct acount {
    size_t allocs, frees, size;
    void *ptr;
    int fail;
} acount;

static void *count_alloc(size_t n, void *ud)
{
    acount *a = ud;
    a->allocs++;
    if (a->fail)
        return NULL;
    a->size = n;
    a->ptr = malloc(n);
    return a->ptr;
}

static void count_free(void *p, void *ud)
{
    acount *a = ud;
    a->frees++;
    FUZZ_CHECK(p == a->ptr, "smtpe_server_free released a block it did not allocate");
    free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* One input: the config, the client octets, the recorded decisions.                           */

/* What the host decisions are keyed by: the client octets consumed when the event was taken
 * (the end of its command line in the stream, or of the content or chunk it ends), the event
 * type, and for the verdicts of one LMTP DATA_END the verdict's number. Both runs reach the same
 * keys whatever the split and the order of verdicts (see the top of this file). */
typedef struct dkey {
    uint64_t at;
    unsigned type;
    unsigned sub;
} dkey;

typedef struct fcase {
    smtpe_server_config cfg;
    int trusted;      /* smtpe_server_set_trusted(s, 1) after creation */
    int implicit_tls; /* smtpe_server_tls_started at the start */
    const uint8_t *client;
    size_t client_len;
    uint64_t t0;
    prov pv;
    decision *dec; /* drawn by run 1, replayed by run 2 */
    dkey *keys;
    size_t ndec, capdec;
    size_t *slot; /* open addressing over keys: index + 1, 0 empty */
    size_t nslot;
} fcase;

/* One entry of the event log: an event taken (record 0: the session's start), with everything
 * that belongs to it (its fields, its verdicts' results, the expiry checks after it, the content
 * chunks that follow it). The log compared between the runs is the records in the order the
 * events were taken, less the excluded ones (split run: the RCPTs that run 2 never sees). */
typedef struct rec {
    fz_buf b;
    smtpe_event_type type;
    uint64_t at;      /* consumed when taken */
    uint64_t cmd;     /* stats.commands when taken: the command line's number */
    uint64_t mail_id; /* RCPT taken while its MAIL waited for its verdict: that MAIL's id */
    int in_batch;     /* a MAIL or RCPT of the current run of concurrent verdicts */
    int excluded;     /* voided by its MAIL's refusal, or dropped by a close before its turn */
} rec;

#define MAX_SPANS 40

/* A taken event whose verdict the host still owes. */
typedef struct owed {
    uint64_t id;
    smtpe_event_type type;
    size_t rec;
    uint64_t at, cmd, mail_id;
    unsigned sub;           /* LMTP DATA_END: verdicts given so far */
    unsigned verdicts_left; /* DATA_END: verdicts still owed */
    unsigned defer;         /* split run: chances to let pass before this verdict */
    int voided;             /* a RCPT whose MAIL was refused: answered 503 by the engine */
    int saw_421;
    int mail_binary;        /* MAIL with BODY=BINARYMIME */
    unsigned pending_ok;    /* MAIL: its RCPTs given a 2xx verdict while it waits */
    int auth_other;         /* AUTH of a passed-through mechanism */
    unsigned auth_step;
    smtpe_span secrets[4];  /* AUTH: the decoded credentials */
    size_t nsecrets;
    smtpe_span sp[MAX_SPANS]; /* the event's spans, and a copy of what they held when taken */
    size_t nsp;
    fz_buf copy;
} owed;

/* One run of the session over the case. */
typedef struct run {
    fcase *c;
    int split;
    smtpe_server *s;
    unsigned npend; /* cfg.max_pending_verdicts */
    const uint8_t *mem; /* the session's memory block */
    size_t memsize;
    const uint8_t *whole; /* whole run: one heap copy of all client octets */
    uint8_t *feed;        /* split run: heap copy of exactly the octets of the last recv */
    size_t feed_len;
    size_t avail;         /* client octets the host has read so far */
    size_t consumed;      /* client octets the engine consumed */
    uint64_t now;
    fz_buf out;     /* every octet sent (acknowledged), in order */
    fz_buf log;     /* the event log, assembled from the records at the end */
    rec *recs;
    size_t nrec, caprec;
    size_t cur;     /* the record of the last event taken */
    fz_buf msg;     /* content of the current message (chunks since the DATA/first BDAT event) */
    size_t logged;  /* octets of msg already in the log */
    size_t acked;
    size_t nevents; /* non-chunk events taken */
    uint64_t last_id, answered_id;
    size_t data_start; /* consumed offset at the DATA event */

    /* the verdicts owed, oldest first */
    owed *ow;
    size_t nowed, capowed, nvoided;
    owed *dropped; /* the verdicts owed when the session started closing */
    size_t ndropped;
    unsigned most_owed; /* the most owed at once (trace) */

    /* concurrent verdicts: a batch is the time during which MAIL / RCPT verdicts are owed; its
     * command lines are numbered from c0 (stats.commands when its first event was taken) and its
     * replies counted from B0 (final reply lines queued before that) */
    int batch_on;
    uint64_t c0;
    size_t B0, batch_first;
    /* a close during a batch: what run 2, which never read past the command it closed at,
     * has consumed and executed */
    int cut;
    uint64_t cut_commands, cut_consumed;
    int closed_seen;

    /* every octet queued, as send_buf showed it, and the final ("ddd ") reply lines in it */
    fz_buf queued;
    size_t qscan, finals;
    size_t mark;      /* finals before the call that took the previous event, or after a verdict */
    int mark_exact;   /* every reply queued then was seen */

    /* output in flight: handed to an asynchronous write, not yet acknowledged */
    int fl_on;
    const uint8_t *fl_p;
    size_t fl_len, fl_latest; /* as handed out; the longest send_buf gave since */
    fz_buf fl_copy;           /* the octets when handed out */
    unsigned fl_delay;        /* engine calls until the write completes */
    const uint8_t *fl_next;   /* after a partial acknowledgement: where the rest must be */
    int maybe_b;              /* a run was partly acknowledged since one was all acknowledged:
                                 replies may be queued in the second run, which send_buf does
                                 not show yet (counts of queued replies are lower bounds) */

    /* STARTTLS */
    int tls_pending;  /* the session wants TLS; the host has not called tls_started yet */
    size_t junk_left; /* pre-TLS client octets still to feed */
    size_t discarded; /* octets fed while TLS was pending */
    unsigned tls_tries;
    unsigned stall;   /* split run: partial sends still to send nothing (a stalled peer) */

    /* the host's model of the session (what the verdicts it gave mean) */
    int proxy_seen;             /* the PROXY event came */
    int helo_ok, tls_up, authenticated, in_txn, txn_binary, bdat_seen, bdat_first, bdat_last;
    unsigned txn_rcpts;
    long chal_step;             /* step of the AUTH answered by a challenge, -1 if none */
    fz_buf bdat_raw;            /* the octets of this message's accepted BDAT chunks */
    size_t bdat_at;             /* consumed offset where the current chunk's octets start */
    uint64_t bdat_size;
} run;

static const char *rname(const run *r)
{
    return r->split ? "split" : "whole";
}

static uint64_t key_hash(dkey k)
{
    uint64_t h = (k.at + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k.type << 40 | k.sub);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

static int key_eq(dkey a, dkey b)
{
    return a.at == b.at && a.type == b.type && a.sub == b.sub;
}

/* The index + 1 of the decision for key k, 0 if none. */
static size_t dec_find(const fcase *c, dkey k)
{
    if (!c->nslot)
        return 0;
    for (size_t i = key_hash(k) & (c->nslot - 1);; i = (i + 1) & (c->nslot - 1)) {
        size_t v = c->slot[i];
        if (v == 0)
            return 0;
        if (key_eq(c->keys[v - 1], k))
            return v;
    }
}

static void dec_slot(fcase *c, size_t idx)
{
    size_t i = key_hash(c->keys[idx]) & (c->nslot - 1);
    while (c->slot[i])
        i = (i + 1) & (c->nslot - 1);
    c->slot[i] = idx + 1;
}

/* The host's decision for the event (or LMTP verdict) with key k: drawn the first time run 1
 * meets the key, looked up by run 2 (which falls back to accept for a key run 1 never met: the
 * runs then differ, which oracle (a) reports). */
static const decision *decision_at(run *r, dkey k, smtpe_event_type t, int needs_reply)
{
    fcase *c = r->c;
    static const decision none = {.kind = K_ACCEPT};
    size_t v = dec_find(c, k);
    if (v)
        return &c->dec[v - 1];
    if (!r->split)
        return &none;
    if (c->ndec == c->capdec) {
        c->capdec = c->capdec ? 2 * c->capdec : 32;
        c->dec = realloc(c->dec, c->capdec * sizeof *c->dec);
        c->keys = realloc(c->keys, c->capdec * sizeof *c->keys);
        if (!c->dec || !c->keys)
            abort();
    }
    if (2 * (c->ndec + 1) > c->nslot) {
        free(c->slot);
        c->nslot = c->nslot ? 2 * c->nslot : 64;
        c->slot = calloc(c->nslot, sizeof *c->slot);
        if (!c->slot)
            abort();
        for (size_t i = 0; i < c->ndec; i++)
            dec_slot(c, i);
    }
    c->keys[c->ndec] = k;
    c->dec[c->ndec] = draw_decision(&c->pv, t, needs_reply, &c->cfg);
    dec_slot(c, c->ndec);
    return &c->dec[c->ndec++];
}

static dkey key_of(uint64_t at, smtpe_event_type t, unsigned sub)
{
    dkey k = {at, (unsigned)t, sub};
    return k;
}

/* A new log record for an event; it becomes the current one. */
static size_t rec_new(run *r, smtpe_event_type t, uint64_t cmd)
{
    if (r->nrec == r->caprec) {
        r->caprec = r->caprec ? 2 * r->caprec : 64;
        r->recs = realloc(r->recs, r->caprec * sizeof *r->recs);
        if (!r->recs)
            abort();
    }
    rec *e = &r->recs[r->nrec];
    memset(e, 0, sizeof *e);
    e->type = t;
    e->at = r->consumed;
    e->cmd = cmd;
    r->cur = r->nrec;
    return r->nrec++;
}

/* The log the current record stands for. */
static fz_buf *lg(run *r)
{
    return &r->recs[r->cur].b;
}

/* Records the octets send_buf shows that were not seen before and counts the final reply lines
 * among them; checks that queued octets do not change before they are sent. */
static void sync_out(run *r)
{
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(r->s, &len);
    size_t total = r->acked + len;
    FUZZ_CHECK(total >= r->queued.len, "queued output vanished before it was sent");
    size_t old = r->queued.len - r->acked;
    FUZZ_CHECK(old == 0 || memcmp(p, r->queued.p + r->acked, old) == 0,
               "queued output changed before it was sent");
    if (total > r->queued.len)
        fz_put(&r->queued, p + old, total - r->queued.len);
    while (r->qscan < r->queued.len) {
        size_t j = r->qscan;
        while (j + 1 < r->queued.len && !(r->queued.p[j] == '\r' && r->queued.p[j + 1] == '\n'))
            j++;
        if (j + 1 >= r->queued.len)
            break;
        if (j - r->qscan >= 4 && r->queued.p[r->qscan + 3] == ' ')
            r->finals++;
        r->qscan = j + 2;
    }
}

/* Output in flight (split run): after every engine call the octets the host handed to its
 * write are still there, unchanged, and send_buf still gives them first (the same address, a
 * length at least as large: later replies queue behind them). The write completes after a
 * fuzz-chosen number of such calls. */
static void after_call(run *r)
{
    if (!r->fl_on)
        return;
    FUZZ_CHECK(memcmp(r->fl_p, r->fl_copy.p, r->fl_len) == 0,
               "output handed out by send_buf changed before it was acknowledged (stable output)");
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(r->s, &len);
    FUZZ_CHECK(p == r->fl_p && len >= r->fl_latest,
               "send_buf called again before the acknowledgement gave another address or fewer "
               "octets (stable output)");
    r->fl_latest = len;
    if (r->fl_delay > 0)
        r->fl_delay--;
}

/* The index of the oldest owed verdict that is not a voided RCPT's, or nowed. */
static size_t first_live(const run *r)
{
    size_t i = 0;
    while (i < r->nowed && r->ow[i].voided)
        i++;
    return i;
}

/* 1 if the host owes a verdict (not a voided RCPT's) for an event other than MAIL and RCPT, or
 * with max_pending_verdicts 1 any verdict: the engine reads nothing and hands out no event. */
static int owes_alone(const run *r)
{
    for (size_t i = 0; i < r->nowed; i++)
        if (!r->ow[i].voided && (r->npend == 1 || (r->ow[i].type != SMTPE_EV_MAIL &&
                                                   r->ow[i].type != SMTPE_EV_RCPT)))
            return 1;
    return 0;
}

static void sync_out(run *r);

static void check_want(run *r)
{
    sync_out(r);
    unsigned w = smtpe_server_want(r->s);
    size_t len = 99;
    (void)smtpe_server_send_buf(r->s, &len);
    FUZZ_CHECK(!!(w & SMTPE_WANT_WRITE) == (len > 0), "SMTPE_WANT_WRITE disagrees with send_buf");
    /* only taken events owe verdicts (an event not yet taken cannot be answered) */
    if (!!(w & SMTPE_WANT_VERDICT) != (r->nowed > 0)) {
        fprintf(stderr, "want %#x, verdicts owed %zu (%zu for voided RCPTs)\n", w, r->nowed,
                r->nvoided);
        FUZZ_CHECK(0, "SMTPE_WANT_VERDICT disagrees with the verdicts the host owes for taken "
                      "events");
    }
    FUZZ_CHECK(!!(w & SMTPE_WANT_TLS) == r->tls_pending,
               "SMTPE_WANT_TLS disagrees with the STARTTLS verdict (or tls_started)");
    if (w & SMTPE_WANT_TLS) {
        /* (VERDICT: as everywhere, exactly while a verdict is owed, which during the handshake
         * can only be a voided RCPT's, given before STARTTLS was executed) */
        FUZZ_CHECK(!(w & (SMTPE_WANT_EVENT | SMTPE_WANT_CLOSE)),
                   "SMTPE_WANT_TLS together with EVENT or CLOSE (oracle j)");
        FUZZ_CHECK(r->nowed == r->nvoided,
                   "a verdict other than a voided RCPT's owed while the TLS handshake runs");
        FUZZ_CHECK(w & SMTPE_WANT_READ,
                   "SMTPE_WANT_TLS without READ: octets read before the handshake must be fed "
                   "(oracle j)");
        FUZZ_CHECK(smtpe_server_expiry(r->s, r->now) == UINT64_MAX,
                   "expiry() is not UINT64_MAX while the TLS handshake runs (oracle j)");
    }
    /* no timer while an event waits or a verdict is owed (so this call changes nothing) */
    if (r->nowed > 0 || (w & SMTPE_WANT_EVENT))
        FUZZ_CHECK(smtpe_server_expiry(r->s, r->now) == UINT64_MAX,
                   "expiry() is not UINT64_MAX while an event waits or a verdict is owed");
    if (r->batch_on && !(w & SMTPE_WANT_CLOSE) && !r->maybe_b) {
        /* commands of the batch executed and not yet answered on the output: the events owed
         * (one maybe not yet taken) and the engine's own replies waiting their turn */
        smtpe_server_stats st;
        smtpe_server_get_stats(r->s, &st);
        uint64_t lines = st.commands - r->c0 + 1, answered = r->finals - r->B0;
        FUZZ_CHECK(answered <= lines, "more replies than commands in a pipelined batch");
        uint64_t waiting = lines - answered, live = r->nowed - r->nvoided;
        FUZZ_CHECK(waiting >= live, "a verdict owed for a command whose reply has gone out");
        if (waiting + r->nvoided > r->npend) {
            fprintf(stderr, "commands held: %llu waiting for their replies, %zu voided RCPTs "
                            "owed; max_pending_verdicts %u\n",
                    (unsigned long long)waiting, r->nvoided, r->npend);
            FUZZ_CHECK(0, "more commands held than max_pending_verdicts");
        }
    }
}

/* Tells the engine the time, as a host does whenever it arms its timer (oracle (e)):
 * smtpe_server_expiry(now) restarts the timeout from now when a verdict was given since the
 * engine last saw the clock; handle_expiry expires only at or after the deadline expiry() gave,
 * and when it does not, the deadline is later than now. The result goes to record rec. */
static void expiry_check(run *r, size_t ri)
{
    uint64_t e = smtpe_server_expiry(r->s, r->now);
    int x = smtpe_server_handle_expiry(r->s, r->now);
    after_call(r);
    FUZZ_CHECK(x == 0 || x == 1, "handle_expiry returned neither 0 nor 1");
    if (x) {
        FUZZ_CHECK(e != UINT64_MAX && r->now >= e, "handle_expiry expired before the deadline");
        unsigned w = smtpe_server_want(r->s);
        FUZZ_CHECK((w & SMTPE_WANT_EVENT) && (w & SMTPE_WANT_CLOSE),
                   "after a timeout the session must have an event and want to close");
        FUZZ_CHECK(r->nowed == 0, "a timeout expired while a verdict was owed");
        r->closed_seen = 1;
    } else {
        uint64_t e2 = smtpe_server_expiry(r->s, r->now);
        FUZZ_CHECK(e2 > r->now, "handle_expiry did not expire although expiry() is due");
    }
    TRACE("[%s] now=%llu expiry=%llu handle_expiry=%d\n", rname(r), (unsigned long long)r->now,
          (unsigned long long)e, x);
    fz_put_u8(&r->recs[ri].b, 'X');
    fz_put_u8(&r->recs[ri].b, (unsigned)x);
}

static void answer(run *r, size_t i);
static void complete_run(run *r);

/* After an event has been handled (a verdict event: after its verdict) the host looks at the
 * clock, then time passes. Under concurrent verdicts the split run first gives the verdicts it
 * still owes for voided RCPTs, which run 2 never saw: a verdict owed stops the timer, so time
 * may pass only once the host owes what run 2 owes (nothing but the event in hand). */
static void after_event(run *r, const decision *d, size_t ri)
{
    if (r->split && d->advance) {
        size_t i = 0;
        while (i < r->nowed) {
            if (r->ow[i].voided) {
                answer(r, i);
                i = 0;
                continue;
            }
            FUZZ_CHECK(r->ow[i].rec == ri,
                       "a verdict owed for another command while an event other than MAIL or "
                       "RCPT was handled (smtpe.h: those wait until every earlier verdict)");
            i++;
        }
    }
    expiry_check(r, ri);
    if (d->advance) {
        r->now += d->advance;
        expiry_check(r, ri);
    }
}

static void flush_chunks(run *r)
{
    if (r->msg.len > r->logged) {
        smtpe_span s = {r->msg.p + r->logged, r->msg.len - r->logged};
        fz_put_u8(lg(r), 'C');
        fz_put_span(lg(r), s);
        r->logged = r->msg.len;
    }
}

static void log_path(run *r, const smtpe_path *pa)
{
    fz_check_path(pa, r->mem, r->memsize);
    fz_put_span(lg(r), pa->mailbox);
    fz_put_span(lg(r), pa->local_part);
    fz_put_span(lg(r), pa->domain);
    fz_put_u64(lg(r), pa->flags);
}

static void log_params(run *r, const smtpe_param *p, size_t n)
{
    FUZZ_CHECK(n <= SMTPE_MAX_PARAMS, "more parameters than SMTPE_MAX_PARAMS");
    fz_put_u64(lg(r), n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(fz_within(p[i].keyword, r->mem, r->memsize) &&
                       fz_within(p[i].value, r->mem, r->memsize),
                   "parameter span outside session memory");
        FUZZ_CHECK(p[i].keyword.len > 0, "empty parameter keyword");
        fz_put_span(lg(r), p[i].keyword);
        fz_put_span(lg(r), p[i].value);
    }
}

/* A span the engine decoded in place (xtext, base64): in session memory. */
static void log_mem_span(run *r, smtpe_span s, const char *what)
{
    if (!fz_within(s, r->mem, r->memsize)) {
        fprintf(stderr, "span: %s\n", what);
        FUZZ_CHECK(0, "event span outside session memory");
    }
    fz_put_span(lg(r), s);
}

static int no_control(smtpe_span s)
{
    for (size_t i = 0; i < s.len; i++)
        if (s.ptr[i] < 0x20 || s.ptr[i] == 0x7f)
            return 0;
    return 1;
}

/* The transaction the host knows of is over (engine: reset_transaction). */
static void model_reset_txn(run *r)
{
    r->in_txn = 0;
    r->txn_binary = 0;
    r->txn_rcpts = 0;
    r->bdat_seen = 0;
    r->bdat_last = 0;
}

static void check_content(run *r, const smtpe_event *ev)
{
    const fcase *c = r->c;
    const uint8_t *region = c->client + r->data_start;
    size_t n = r->consumed - r->data_start;
    const uint8_t *m = r->msg.p;
    size_t mlen = r->msg.len;

    if (ev->data_end.status == SMTPE_DATA_OK)
        FUZZ_CHECK(ev->data_end.size == mlen, "DATA_END size is not the octets delivered");
    else
        FUZZ_CHECK(ev->data_end.size >= mlen, "DATA_END size below the octets delivered");
    /* the DATA line's own line break counts only if it was a CRLF (under NORMALISE a bare
     * one ends the line but starts none) */
    int at_line_start = r->data_start >= 2 && c->client[r->data_start - 2] == '\r' &&
                        c->client[r->data_start - 1] == '\n';
    FUZZ_CHECK(fz_end_of_data_from(region, n, at_line_start) == (long)n,
               "content did not end exactly at the first CRLF.CRLF (smuggling oracle)");
    /* the content against the octets consumed for it, and the dot-stuffing round trip */
    fz_check_dot_content(region, n, at_line_start, c->cfg.line_ending, m, mlen,
                         ev->data_end.status, ev->data_end.flags, c->cfg.max_message_size);
    if (ev->data_end.status != SMTPE_DATA_OK)
        return;
    if (c->cfg.max_message_size)
        FUZZ_CHECK(mlen <= c->cfg.max_message_size, "content over max_message_size ended OK");
    FUZZ_CHECK(!!(ev->data_end.flags & SMTPE_DATA_HAS_8BIT) == fz_has_8bit(m, mlen),
               "HAS_8BIT flag disagrees with the content");
    if (c->cfg.line_ending == SMTPE_LINE_ENDING_KEEP)
        FUZZ_CHECK(!(ev->data_end.flags & SMTPE_DATA_NORMALISED), "NORMALISED under KEEP");
}

/* Oracle (c'): a message that came by BDAT against the raw octets of its chunks. */
static void check_bdat_content(run *r, const smtpe_event *ev)
{
    const fcase *c = r->c;
    const uint8_t *raw = r->bdat_raw.p;
    size_t n = r->bdat_raw.len;
    const uint8_t *m = r->msg.p;
    size_t mlen = r->msg.len;
    int status = ev->data_end.status;
    unsigned flags = ev->data_end.flags;
    uint64_t max = c->cfg.max_message_size;
    int complete = r->bdat_last; /* the message's end: after LAST; else refused early */
    smtpe_line_ending_policy pol = r->txn_binary ? SMTPE_LINE_ENDING_KEEP : c->cfg.line_ending;
    size_t fb = fz_first_bare(raw, n), nb = fz_count_bare(raw, n);
    uint64_t expsize;
    int expstatus;
    fz_buf exp = {0};

    FUZZ_CHECK(r->consumed == r->bdat_at + r->bdat_size,
               "BDAT: the content did not end exactly at the end of the chunk's octets");
    if (pol == SMTPE_LINE_ENDING_KEEP) {
        fz_put(&exp, raw, n);
        expsize = n;
        expstatus = max && expsize > max ? SMTPE_DATA_TOO_BIG : SMTPE_DATA_OK;
    } else if (pol == SMTPE_LINE_ENDING_NORMALISE) {
        fz_normalise(&exp, raw, n);
        expsize = exp.len;
        expstatus = max && expsize > max ? SMTPE_DATA_TOO_BIG : SMTPE_DATA_OK;
    } else {
        fz_put(&exp, raw, fb);
        expsize = n - nb;
        expstatus = max && fb > max ? SMTPE_DATA_TOO_BIG
                    : nb            ? SMTPE_DATA_BAD_LINE_ENDING
                                    : SMTPE_DATA_OK;
    }
    if (pol != SMTPE_LINE_ENDING_NORMALISE)
        FUZZ_CHECK(!(flags & SMTPE_DATA_NORMALISED),
                   "BDAT: NORMALISED under KEEP, REFUSE or BODY=BINARYMIME");
    FUZZ_CHECK(mlen <= exp.len && fz_eq(m, mlen, exp.p, mlen),
               "BDAT: the content is not a prefix of the chunk octets under the policy "
               "(KEEP/BINARYMIME: verbatim; NORMALISE: reference normaliser; REFUSE: up to the "
               "first bare CR/LF/NUL)");
    if (max)
        FUZZ_CHECK(mlen <= max, "BDAT: more content than max_message_size handed out");
    if (status == SMTPE_DATA_TOO_BIG)
        FUZZ_CHECK(max && mlen == max, "BDAT: TOO_BIG but the content handed out is not exactly "
                                       "max_message_size octets");
    FUZZ_CHECK(ev->data_end.size >= mlen, "BDAT: DATA_END size below the octets delivered");
    if (status == SMTPE_DATA_BAD_LINE_ENDING) /* at the end of the chunk that held one */
        FUZZ_CHECK(nb > 0, "BDAT: content refused without a bare CR/LF/NUL in the chunks read");
    if (!complete) {
        FUZZ_CHECK(status != SMTPE_DATA_OK, "BDAT: DATA_END OK without LAST");
        fz_free(&exp);
        return;
    }
    FUZZ_CHECK(status == expstatus, "BDAT: DATA_END status is not what the chunk octets give");
    FUZZ_CHECK(ev->data_end.size == expsize,
               "BDAT: DATA_END size is not the content the chunk octets give under the policy");
    if (pol == SMTPE_LINE_ENDING_NORMALISE)
        FUZZ_CHECK(!!(flags & SMTPE_DATA_NORMALISED) == (nb > 0),
                   "BDAT: NORMALISED disagrees with a bare CR/LF/NUL in the chunk octets");
    FUZZ_CHECK(!!(flags & SMTPE_DATA_HAS_8BIT) == fz_has_8bit(raw, n),
               "BDAT: HAS_8BIT disagrees with the chunk octets");
    if (status == SMTPE_DATA_OK)
        FUZZ_CHECK(fz_eq(m, mlen, exp.p, exp.len),
                   "BDAT: the content of an accepted message is not the chunk octets under the "
                   "policy");
    fz_free(&exp);
}

static int expected_needs_reply(const smtpe_event *ev)
{
    switch (ev->type) {
    case SMTPE_EV_HELO: case SMTPE_EV_MAIL: case SMTPE_EV_RCPT: case SMTPE_EV_DATA:
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: case SMTPE_EV_UNKNOWN: case SMTPE_EV_STARTTLS:
    case SMTPE_EV_AUTH: case SMTPE_EV_CHUNK_END: case SMTPE_EV_PROXY: case SMTPE_EV_XCLIENT:
    case SMTPE_EV_XFORWARD:
        return 1;
    case SMTPE_EV_DATA_END:
        return ev->data_end.status == SMTPE_DATA_OK;
    default:
        return 0;
    }
}

static void take_chunk(run *r, const smtpe_event *ev)
{
    smtpe_span ch = ev->chunk;
    FUZZ_CHECK(ch.len > 0, "empty DATA_CHUNK");
    const uint8_t *fed = r->split ? r->feed : r->whole;
    size_t fed_len = r->split ? r->feed_len : r->c->client_len;
    if (!fz_within(ch, fed, fed_len))
        FUZZ_CHECK(fz_static_break(ch) &&
                       (r->c->cfg.line_ending != SMTPE_LINE_ENDING_REFUSE || ch.ptr[0] == '\r'),
                   "DATA_CHUNK span neither in the fed octets nor a static line break");
    TRACE("[%s] chunk %zu octets\n", r->split ? "split" : "whole", ch.len);
    fz_put(&r->msg, ch.ptr, ch.len);
}

/* 1 if the mechanism m (any case) is one of the configured names. */
static int mech_listed(const char *list, smtpe_span m)
{
    while (list && *list) {
        size_t n = strcspn(list, " ");
        if (n == m.len) {
            size_t i = 0;
            while (i < n && (m.ptr[i] == (uint8_t)list[i] ||
                             (m.ptr[i] >= 'a' && m.ptr[i] <= 'z' &&
                              m.ptr[i] - 32 == (uint8_t)list[i])))
                i++;
            if (i == n)
                return 1;
        }
        list += n;
        while (*list == ' ')
            list++;
    }
    return 0;
}

static void take_auth(run *r, const smtpe_event *ev, owed *e)
{
    const smtpe_server_config *cfg = &r->c->cfg;
    FUZZ_CHECK(cfg->auth_mechanisms && (r->tls_up || cfg->auth_without_tls),
               "AUTH event although AUTH is not offered (no mechanisms, or no TLS)");
    FUZZ_CHECK(r->helo_ok && !r->authenticated && !r->in_txn,
               "AUTH event before HELO, after a successful AUTH or inside a transaction");
    FUZZ_CHECK(mech_listed(cfg->auth_mechanisms, ev->auth.mechanism),
               "AUTH event for a mechanism that is not configured");
    int id = fz_span_eq_ci(ev->auth.mechanism, "PLAIN")   ? SMTPE_SASL_PLAIN
             : fz_span_eq_ci(ev->auth.mechanism, "LOGIN") ? SMTPE_SASL_LOGIN
                                                          : SMTPE_SASL_OTHER;
    FUZZ_CHECK(ev->auth.mechanism_id == id, "AUTH mechanism_id does not match the mechanism");
    log_mem_span(r, ev->auth.mechanism, "auth.mechanism");
    fz_put_u64(lg(r), (uint64_t)ev->auth.mechanism_id);
    log_mem_span(r, ev->auth.authzid, "auth.authzid");
    log_mem_span(r, ev->auth.authcid, "auth.authcid");
    log_mem_span(r, ev->auth.password, "auth.password");
    log_mem_span(r, ev->auth.response, "auth.response");
    fz_put_u64(lg(r), (uint64_t)ev->auth.has_response);
    fz_put_u64(lg(r), ev->auth.step);
    if (id == SMTPE_SASL_PLAIN) {
        FUZZ_CHECK(ev->auth.authcid.len > 0 && ev->auth.password.len > 0,
                   "PLAIN credentials with an empty authcid or password (RFC 4616 §2)");
        FUZZ_CHECK(!memchr(ev->auth.authzid.ptr ? (const void *)ev->auth.authzid.ptr : "", 0,
                           ev->auth.authzid.len) &&
                       !memchr(ev->auth.authcid.ptr, 0, ev->auth.authcid.len) &&
                       !memchr(ev->auth.password.ptr, 0, ev->auth.password.len),
                   "PLAIN credentials holding a NUL");
    }
    if (id == SMTPE_SASL_LOGIN)
        FUZZ_CHECK(ev->auth.authcid.len > 0 && ev->auth.authcid.len <= 255 &&
                       ev->auth.authzid.len == 0,
                   "LOGIN credentials with an empty or over-long user name, or an authzid");
    if (id != SMTPE_SASL_OTHER)
        FUZZ_CHECK(ev->auth.step == 0 && ev->auth.response.len == 0,
                   "PLAIN/LOGIN event with a step or a response");
    else
        FUZZ_CHECK(ev->auth.authzid.len == 0 && ev->auth.authcid.len == 0 &&
                       ev->auth.password.len == 0,
                   "passed-through mechanism with PLAIN/LOGIN credentials");
    FUZZ_CHECK(ev->auth.step == 0 || (long)ev->auth.step == r->chal_step + 1,
               "AUTH step is neither 0 nor the challenged step + 1");
    if (ev->auth.response.len > 0)
        FUZZ_CHECK(ev->auth.has_response, "AUTH response without has_response");
    e->auth_other = id == SMTPE_SASL_OTHER;
    e->auth_step = ev->auth.step;
    e->nsecrets = 0;
    const smtpe_span sp[4] = {ev->auth.authzid, ev->auth.authcid, ev->auth.password,
                              ev->auth.response};
    for (int i = 0; i < 4; i++)
        if (sp[i].len > 0)
            e->secrets[e->nsecrets++] = sp[i];
}

static void take_proxy(run *r, const smtpe_event *ev)
{
    const smtpe_proxy_info *pi = &ev->proxy;
    FUZZ_CHECK(pi->version == 1 || pi->version == 2, "PROXY version neither 1 nor 2");
    FUZZ_CHECK(pi->family >= SMTPE_PROXY_AF_UNSPEC && pi->family <= SMTPE_PROXY_AF_UNIX,
               "PROXY family out of range");
    FUZZ_CHECK(pi->transport >= SMTPE_PROXY_TRANSPORT_UNSPEC &&
                   pi->transport <= SMTPE_PROXY_TRANSPORT_DGRAM,
               "PROXY transport out of range");
    if (pi->version == 1)
        FUZZ_CHECK(pi->tlvs.len == 0, "PROXY v1 with TLVs");
    fz_put_u64(lg(r), (uint64_t)pi->version);
    fz_put_u64(lg(r), (uint64_t)pi->local);
    fz_put_u64(lg(r), (uint64_t)pi->family);
    fz_put_u64(lg(r), (uint64_t)pi->transport);
    fz_put(lg(r), pi->src_addr, 16);
    fz_put(lg(r), pi->dst_addr, 16);
    fz_put_u64(lg(r), pi->src_port);
    fz_put_u64(lg(r), pi->dst_port);
    log_mem_span(r, pi->tlvs, "proxy.tlvs");
    smtpe_span walk = pi->tlvs, value;
    uint8_t type;
    size_t guard = 0;
    while (smtpe_proxy_tlv_next(&walk, &type, &value)) {
        FUZZ_CHECK(++guard <= pi->tlvs.len, "PROXY TLV walk does not end");
        FUZZ_CHECK(fz_within(value, pi->tlvs.ptr, pi->tlvs.len), "PROXY TLV value outside tlvs");
    }
    FUZZ_CHECK(walk.len == 0, "PROXY TLVs of the event do not walk to their end");
}

static void add_span(owed *e, smtpe_span s)
{
    if (s.len == 0 || e->nsp == MAX_SPANS)
        return;
    e->sp[e->nsp++] = s;
    fz_put(&e->copy, s.ptr, s.len);
}

static void add_path(owed *e, const smtpe_path *pa)
{
    add_span(e, pa->mailbox);
    add_span(e, pa->local_part);
    add_span(e, pa->domain);
}

static void add_params(owed *e, const smtpe_param *p, size_t n)
{
    for (size_t i = 0; i < n && i < SMTPE_MAX_PARAMS; i++) {
        add_span(e, p[i].keyword);
        add_span(e, p[i].value);
    }
}

/* The spans of an event that needs a verdict, valid until that verdict: copied now, compared
 * right before the verdict. */
static void collect_spans(owed *e, const smtpe_event *ev)
{
    switch (ev->type) {
    case SMTPE_EV_HELO:
        add_span(e, ev->helo.domain);
        break;
    case SMTPE_EV_MAIL:
        add_path(e, &ev->mail.reverse_path);
        add_span(e, ev->mail.envid);
        add_span(e, ev->mail.auth);
        add_params(e, ev->mail.params, ev->mail.param_count);
        break;
    case SMTPE_EV_RCPT:
        add_path(e, &ev->rcpt.forward_path);
        add_span(e, ev->rcpt.orcpt_type);
        add_span(e, ev->rcpt.orcpt);
        add_params(e, ev->rcpt.params, ev->rcpt.param_count);
        break;
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: case SMTPE_EV_UNKNOWN:
        add_span(e, ev->command.verb);
        add_span(e, ev->command.argument);
        break;
    case SMTPE_EV_AUTH:
        add_span(e, ev->auth.mechanism);
        add_span(e, ev->auth.authzid);
        add_span(e, ev->auth.authcid);
        add_span(e, ev->auth.password);
        add_span(e, ev->auth.response);
        break;
    case SMTPE_EV_PROXY:
        add_span(e, ev->proxy.tlvs);
        break;
    case SMTPE_EV_XCLIENT: case SMTPE_EV_XFORWARD:
        add_params(e, ev->xclient.attrs, ev->xclient.count);
        break;
    default:
        break;
    }
}

static void check_spans(const owed *e)
{
    size_t o = 0;
    for (size_t i = 0; i < e->nsp; i++) {
        if (memcmp(e->sp[i].ptr, e->copy.p + o, e->sp[i].len) != 0) {
            fprintf(stderr, "event %d id %llu: span %zu changed\n", (int)e->type,
                    (unsigned long long)e->id, i);
            FUZZ_CHECK(0, "an event's span changed before its verdict (smtpe.h: spans stay "
                          "valid until the event's own verdict)");
        }
        o += e->sp[i].len;
    }
}

static void take_event(run *r, const smtpe_event *ev, size_t pre)
{
    const fcase *c = r->c;
    const smtpe_server_config *cfg = &c->cfg;
    FUZZ_CHECK(ev->type > SMTPE_EV_NONE && ev->type <= SMTPE_EV_XFORWARD, "bad event type");
    int nr = smtpe_event_needs_reply(ev);
    FUZZ_CHECK(nr == expected_needs_reply(ev), "smtpe_event_needs_reply disagrees with smtpe.h");
    if (ev->type == SMTPE_EV_DATA_CHUNK) {
        FUZZ_CHECK(ev->id == 0 && ev->abandoned == 0, "DATA_CHUNK with an id or abandoned");
        take_chunk(r, ev);
        r->mark = pre;
        r->mark_exact = !r->maybe_b;
        return;
    }
    FUZZ_CHECK(ev->id > r->last_id, "ev.id does not increase from event to event");
    r->last_id = ev->id;
    /* ev.abandoned: the event ends a transaction the host accepted (MAIL 2xx) before the end of
     * its content */
    int ends = ev->type == SMTPE_EV_RSET || ev->type == SMTPE_EV_HELO ||
               ev->type == SMTPE_EV_QUIT || ev->type == SMTPE_EV_TIMEOUT ||
               ev->type == SMTPE_EV_ERROR_LIMIT;
    if (ev->abandoned != (ends && r->in_txn)) {
        fprintf(stderr, "event %d abandoned=%d, host's transaction open=%d\n", (int)ev->type,
                ev->abandoned, r->in_txn);
        FUZZ_CHECK(0, "ev.abandoned is not 1 exactly when RSET/HELO/QUIT/TIMEOUT/ERROR_LIMIT "
                      "ends a transaction whose MAIL was accepted");
    }
    smtpe_server_stats st;
    smtpe_server_get_stats(r->s, &st);
    /* while MAIL / RCPT verdicts are owed only RCPTs are handed out; while another verdict is
     * owed nothing is (voided RCPTs' verdicts aside) */
    size_t live = first_live(r);
    if (live < r->nowed)
        FUZZ_CHECK(ev->type == SMTPE_EV_RCPT,
                   "an event other than RCPT was handed out while a MAIL or RCPT verdict was owed "
                   "(smtpe.h: other commands wait until every earlier verdict is given)");
    flush_chunks(r);
    size_t rid = rec_new(r, ev->type, st.commands);
    TRACE("[%s] event %d id=%llu (#%zu) consumed=%zu\n", rname(r), (int)ev->type,
          (unsigned long long)ev->id, r->nevents + 1, r->consumed);
    fz_put_u8(lg(r), 'E');
    fz_put_u8(lg(r), (unsigned)ev->type);
    fz_put_u8(lg(r), (unsigned)ev->abandoned);
    owed e;
    memset(&e, 0, sizeof e);
    if (ev->type != SMTPE_EV_AUTH)
        r->chal_step = -1;
    if (ev->type == SMTPE_EV_PROXY || ev->type == SMTPE_EV_PROXY_INVALID)
        FUZZ_CHECK(cfg->proxy_protocol && r->nevents == 0,
                   "PROXY event without proxy_protocol or not as the first event");
    else if (cfg->proxy_protocol && ev->type != SMTPE_EV_TIMEOUT)
        FUZZ_CHECK(r->proxy_seen, "an event before the PROXY header was read");
    if (ev->type == SMTPE_EV_PROXY)
        r->proxy_seen = 1;
    switch (ev->type) {
    case SMTPE_EV_HELO:
        FUZZ_CHECK(fz_within(ev->helo.domain, r->mem, r->memsize), "HELO span outside memory");
        fz_put_span(lg(r), ev->helo.domain);
        fz_put_u8(lg(r), (unsigned)ev->helo.esmtp);
        FUZZ_CHECK(ev->helo.lmtp == !!cfg->lmtp, "HELO event: lmtp flag disagrees with the config "
                                                 "(LMTP: only LHLO; SMTP: never LHLO)");
        if (ev->helo.lmtp)
            FUZZ_CHECK(ev->helo.esmtp, "LHLO without esmtp");
        model_reset_txn(r);
        break;
    case SMTPE_EV_MAIL:
        FUZZ_CHECK(r->helo_ok && !r->in_txn, "MAIL event before HELO or inside a transaction");
        FUZZ_CHECK(!cfg->require_tls || r->tls_up, "MAIL event before TLS under require_tls");
        log_path(r, &ev->mail.reverse_path);
        fz_put_u64(lg(r), ev->mail.size);
        fz_put_u64(lg(r), (uint64_t)ev->mail.has_size);
        fz_put_u64(lg(r), (uint64_t)ev->mail.body);
        fz_put_u64(lg(r), (uint64_t)ev->mail.smtputf8);
        fz_put_u64(lg(r), (uint64_t)ev->mail.ret);
        fz_put_u64(lg(r), (uint64_t)ev->mail.has_envid);
        log_mem_span(r, ev->mail.envid, "mail.envid");
        fz_put_u64(lg(r), (uint64_t)ev->mail.has_auth);
        log_mem_span(r, ev->mail.auth, "mail.auth");
        fz_put_u64(lg(r), (uint64_t)ev->mail.requiretls);
        fz_put_u64(lg(r), (uint64_t)(int64_t)ev->mail.mt_priority);
        fz_put_u64(lg(r), (uint64_t)ev->mail.has_mt_priority);
        fz_put_u64(lg(r), (uint64_t)ev->mail.by_time);
        fz_put_u64(lg(r), (uint64_t)(uint8_t)ev->mail.by_mode);
        fz_put_u64(lg(r), (uint64_t)ev->mail.by_trace);
        log_params(r, ev->mail.params, ev->mail.param_count);
        FUZZ_CHECK(no_control(ev->mail.envid) && no_control(ev->mail.auth),
                   "MAIL ENVID/AUTH decoded to a control octet");
        FUZZ_CHECK(!ev->mail.has_mt_priority ||
                       (ev->mail.mt_priority >= -9 && ev->mail.mt_priority <= 9),
                   "MT-PRIORITY out of -9..9");
        FUZZ_CHECK(ev->mail.by_mode == 0 || ev->mail.by_mode == 'R' || ev->mail.by_mode == 'N',
                   "BY mode neither R nor N");
        FUZZ_CHECK(ev->mail.by_mode != 'R' || ev->mail.by_time > 0,
                   "BY=<time>;R with a time that is not positive (RFC 2852 §4)");
        FUZZ_CHECK(!ev->mail.requiretls || r->tls_up, "REQUIRETLS accepted without TLS");
        if (ev->mail.has_size && cfg->max_message_size)
            FUZZ_CHECK(ev->mail.size <= cfg->max_message_size,
                       "MAIL with SIZE over max_message_size reached the host");
        e.mail_binary = ev->mail.body == SMTPE_BODY_BINARYMIME;
        if (e.mail_binary)
            FUZZ_CHECK((cfg->extensions & SMTPE_EXT_BINARYMIME) &&
                           (cfg->extensions & SMTPE_EXT_CHUNKING),
                       "BODY=BINARYMIME accepted without BINARYMIME and CHUNKING");
        break;
    case SMTPE_EV_RCPT: {
        /* a RCPT after a MAIL still waiting for its verdict belongs to that MAIL */
        size_t m = live;
        while (m < r->nowed && r->ow[m].type != SMTPE_EV_MAIL)
            m++;
        if (m < r->nowed) {
            FUZZ_CHECK(!r->ow[m].voided && !r->in_txn, "harness: a MAIL owed in a transaction");
            e.mail_id = r->ow[m].id;
        }
        FUZZ_CHECK(r->in_txn || e.mail_id, "RCPT event outside a transaction");
        /* recipients accepted and RCPTs waiting for their verdicts count against
         * max_recipients: a RCPT that could pass it waits instead of being handed out */
        unsigned counted = e.mail_id ? r->ow[m].pending_ok : r->txn_rcpts;
        for (size_t i = live; i < r->nowed; i++)
            if (!r->ow[i].voided && r->ow[i].type == SMTPE_EV_RCPT)
                counted++;
        FUZZ_CHECK(counted < cfg->max_recipients,
                   "a RCPT was handed out although the recipients accepted and those waiting for "
                   "their verdicts reach max_recipients");
        log_path(r, &ev->rcpt.forward_path);
        fz_put_u64(lg(r), ev->rcpt.notify);
        log_mem_span(r, ev->rcpt.orcpt_type, "rcpt.orcpt_type");
        log_mem_span(r, ev->rcpt.orcpt, "rcpt.orcpt");
        fz_put_u64(lg(r), (uint64_t)ev->rcpt.has_orcpt);
        log_params(r, ev->rcpt.params, ev->rcpt.param_count);
        FUZZ_CHECK(!(ev->rcpt.notify & SMTPE_NOTIFY_NEVER) ||
                       ev->rcpt.notify == SMTPE_NOTIFY_NEVER,
                   "NOTIFY=NEVER combined with another value");
        FUZZ_CHECK(no_control(ev->rcpt.orcpt), "ORCPT decoded to a control octet");
        break;
    }
    case SMTPE_EV_DATA:
        FUZZ_CHECK(r->in_txn && r->txn_rcpts > 0, "DATA event without a recipient");
        FUZZ_CHECK(!r->bdat_seen && !r->txn_binary,
                   "DATA event after BDAT or with BODY=BINARYMIME (RFC 3030)");
        r->data_start = r->consumed;
        r->msg.len = 0;
        r->logged = 0;
        break;
    case SMTPE_EV_DATA_END: {
        fz_put_u64(lg(r), ev->data_end.size);
        fz_put_u64(lg(r), (uint64_t)ev->data_end.status);
        fz_put_u64(lg(r), ev->data_end.flags);
        fz_put_u64(lg(r), (uint64_t)ev->data_end.chunked);
        fz_put_u64(lg(r), ev->data_end.replies);
        FUZZ_CHECK(ev->data_end.chunked == r->bdat_seen,
                   "DATA_END chunked disagrees with how the content came");
        if (ev->data_end.chunked)
            check_bdat_content(r, ev);
        else
            check_content(r, ev);
        unsigned per_rcpt = cfg->lmtp ? r->txn_rcpts : 1;
        if (ev->data_end.status == SMTPE_DATA_OK) {
            FUZZ_CHECK(ev->data_end.replies == per_rcpt,
                       "DATA_END replies is not one per accepted recipient (LMTP) or 1 (oracle h)");
            e.verdicts_left = ev->data_end.replies;
        } else {
            /* the engine answered refused content itself: once, or under LMTP once per
             * recipient after the end of the content; a BDAT without LAST gets one reply */
            unsigned expect = ev->data_end.chunked && !r->bdat_last ? 1 : per_rcpt;
            sync_out(r);
            size_t got = r->finals - r->mark;
            TRACE("[%s] refused content: %zu replies, replies=%u, expected %u\n",
                  r->split ? "split" : "whole", got, ev->data_end.replies, expect);
            /* (exact when every reply queued was seen at the mark and is seen now; replies in
             * the ring's second run, unseen, make a count low) */
            int ok = r->mark_exact && !r->maybe_b ? got == expect
                     : r->mark_exact              ? got <= expect
                     : !r->maybe_b                ? got >= expect
                                                  : 1;
            FUZZ_CHECK(ok, "refused content answered with a number of replies other than one per "
                           "command (a BDAT without LAST takes one reply, RFC 3030 §2; per "
                           "recipient only after DATA's end or BDAT LAST, RFC 2033 §4.2)");
            FUZZ_CHECK(ev->data_end.replies == expect,
                       "DATA_END replies is not the number of replies the engine gave");
            model_reset_txn(r);
        }
        break;
    }
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: case SMTPE_EV_UNKNOWN:
        FUZZ_CHECK(fz_within(ev->command.verb, r->mem, r->memsize) &&
                       fz_within(ev->command.argument, r->mem, r->memsize),
                   "command span outside session memory");
        fz_put_span(lg(r), ev->command.verb);
        fz_put_span(lg(r), ev->command.argument);
        break;
    case SMTPE_EV_RSET: case SMTPE_EV_QUIT: case SMTPE_EV_TIMEOUT: case SMTPE_EV_ERROR_LIMIT:
        model_reset_txn(r);
        break;
    case SMTPE_EV_STARTTLS:
        FUZZ_CHECK((cfg->extensions & SMTPE_EXT_STARTTLS) && !r->tls_up && !r->in_txn,
                   "STARTTLS event without the extension, under TLS or inside a transaction");
        break;
    case SMTPE_EV_AUTH:
        take_auth(r, ev, &e);
        break;
    case SMTPE_EV_BDAT:
        fz_put_u64(lg(r), ev->bdat.size);
        fz_put_u64(lg(r), (uint64_t)ev->bdat.last);
        fz_put_u64(lg(r), (uint64_t)ev->bdat.first);
        FUZZ_CHECK(cfg->extensions & SMTPE_EXT_CHUNKING, "BDAT event without CHUNKING");
        FUZZ_CHECK(r->in_txn && r->txn_rcpts > 0,
                   "BDAT event outside a transaction with a recipient");
        FUZZ_CHECK(ev->bdat.first == !r->bdat_seen,
                   "BDAT first flag disagrees with the transaction's chunks");
        if (!r->bdat_seen) {
            r->bdat_raw.len = 0;
            r->msg.len = 0;
            r->logged = 0;
        }
        r->bdat_seen = 1;
        r->bdat_first = ev->bdat.first;
        r->bdat_last = ev->bdat.last;
        r->bdat_at = r->consumed;
        r->bdat_size = ev->bdat.size;
        {
            size_t rest = c->client_len - r->consumed;
            fz_put(&r->bdat_raw, c->client + r->consumed,
                   ev->bdat.size < rest ? (size_t)ev->bdat.size : rest);
        }
        break;
    case SMTPE_EV_CHUNK_END:
        fz_put_u64(lg(r), ev->bdat.size);
        FUZZ_CHECK(r->bdat_seen && !r->bdat_last && ev->bdat.size == r->bdat_size &&
                       !ev->bdat.last && ev->bdat.first == r->bdat_first,
                   "CHUNK_END does not match the BDAT without LAST it ends");
        FUZZ_CHECK(r->consumed == r->bdat_at + r->bdat_size,
                   "CHUNK_END: the engine did not consume exactly the chunk's octets");
        break;
    case SMTPE_EV_PROXY:
        take_proxy(r, ev);
        break;
    case SMTPE_EV_PROXY_INVALID: {
        sync_out(r);
        FUZZ_CHECK(r->queued.len == 0, "PROXY_INVALID after a reply was queued (oracle i)");
        FUZZ_CHECK(smtpe_server_want(r->s) == SMTPE_WANT_CLOSE,
                   "after PROXY_INVALID the session must want to close and nothing else");
        break;
    }
    case SMTPE_EV_XCLIENT: case SMTPE_EV_XFORWARD: {
        unsigned bit = ev->type == SMTPE_EV_XCLIENT ? SMTPE_EXT_XCLIENT : SMTPE_EXT_XFORWARD;
        FUZZ_CHECK((cfg->extensions & bit) && c->trusted && !r->in_txn,
                   "XCLIENT/XFORWARD event without the extension, to an untrusted peer or in a "
                   "transaction");
        FUZZ_CHECK(ev->xclient.count >= 1 && ev->xclient.count <= SMTPE_MAX_PARAMS,
                   "XCLIENT/XFORWARD attribute count out of 1..16");
        fz_put_u64(lg(r), ev->xclient.count);
        for (size_t i = 0; i < ev->xclient.count; i++) {
            const smtpe_param *a = &ev->xclient.attrs[i];
            log_mem_span(r, a->keyword, "xclient keyword");
            log_mem_span(r, a->value, "xclient value");
            FUZZ_CHECK(a->keyword.len > 0 && a->value.len > 0 && no_control(a->value),
                       "XCLIENT/XFORWARD attribute empty or decoded to a control octet");
        }
        break;
    }
    default:
        break;
    }
    r->mark = pre;
    r->mark_exact = !r->maybe_b;
    r->nevents++;
    /* the events that end the session come once each: keyed by their type alone (after a
     * close inside a batch run 1 has consumed more than run 2) */
    int once = ev->type == SMTPE_EV_QUIT || ev->type == SMTPE_EV_TIMEOUT ||
               ev->type == SMTPE_EV_ERROR_LIMIT || ev->type == SMTPE_EV_PROXY_INVALID;
    const decision dd = *decision_at(r, key_of(once ? UINT64_MAX : r->consumed, ev->type, 0),
                                     ev->type, nr);
    const decision *d = &dd;
    if (!nr) {
        after_event(r, d, rid);
        return;
    }
    /* the host owes a verdict: it keeps what it needs to check it */
    e.id = ev->id;
    e.type = ev->type;
    e.rec = rid;
    e.at = r->consumed;
    e.cmd = st.commands;
    e.defer = r->split ? d->defer : 0;
    r->recs[rid].mail_id = e.mail_id;
    collect_spans(&e, ev);
    if (r->npend > 1 && (ev->type == SMTPE_EV_MAIL || ev->type == SMTPE_EV_RCPT)) {
        if (!r->batch_on) {
            /* the replies of the batch are counted from here: the split run makes everything
             * queued before visible first (it acknowledges the run partly sent) */
            if (r->maybe_b)
                complete_run(r);
            sync_out(r);
            r->batch_on = 1;
            r->c0 = st.commands;
            r->B0 = r->finals;
            r->batch_first = rid;
        }
        r->recs[rid].in_batch = 1;
    }
    if (r->nowed == r->capowed) {
        r->capowed = r->capowed ? 2 * r->capowed : 8;
        r->ow = realloc(r->ow, r->capowed * sizeof *r->ow);
        if (!r->ow)
            abort();
    }
    r->ow[r->nowed++] = e;
    if (r->nowed > r->most_owed)
        r->most_owed = (unsigned)r->nowed;
}

static int send_output(run *r, int all);

static unsigned default_code(smtpe_event_type t)
{
    switch (t) {
    case SMTPE_EV_DATA: return 354;
    case SMTPE_EV_STARTTLS: case SMTPE_EV_PROXY: case SMTPE_EV_XCLIENT: return 220;
    case SMTPE_EV_AUTH: return 235;
    case SMTPE_EV_VRFY: case SMTPE_EV_EXPN: return 252;
    case SMTPE_EV_UNKNOWN: return 500;
    default: return 250;
    }
}

/* The session is under TLS: it starts afresh (RFC 3207 §4.2). */
static void model_tls_up(run *r)
{
    r->tls_up = 1;
    r->helo_ok = 0;
    r->authenticated = 0;
    model_reset_txn(r);
}

/* Makes the call the decision d asks for (reply, close or challenge). Returns its result. */
/* Makes the call the decision d asks for (reply, close or challenge) for the owed event e:
 * with its id unless the decision says otherwise and e is the oldest verdict owed (the calls
 * without an id answer that one). Returns its result. */
static int verdict_call(run *r, const owed *e, const decision *d, int kind, int by_id)
{
    if (kind == K_REPLY)
        return by_id ? smtpe_server_reply_id(r->s, e->id, d->code, d->enhanced, d->text)
                     : smtpe_server_reply(r->s, d->code, d->enhanced, d->text);
    if (kind == K_CLOSE)
        return smtpe_server_close(r->s, d->code, d->enhanced, d->text);
    if (kind == K_CHALLENGE)
        return smtpe_server_auth_challenge(r->s, d->chal_len > CHAL_MAX ? chal_big : d->chal,
                                           d->chal_len);
    return 0;
}

/* Oracle (l): the reply a successful smtpe_server_reply / smtpe_server_close queued (at
 * queued[q0..)) is exactly the host's reply as smtpe.h describes it: one line per '\n'-separated
 * line of the text (a NULL text: the default, not checked), "ddd-" on all but the last,
 * "ddd " on the last, each line's text preceded by the enhanced status code and a space (none
 * before an empty line) when ENHANCEDSTATUSCODES is on and the code is not 3xx (the host's, or
 * "x.0.0" from the code's class when it gave none), nothing cut. PROXY and XCLIENT 220 are the
 * greeting, "<hostname> <text>" without an enhanced code; HELO/EHLO 2xx (the EHLO keywords
 * follow) are not checked. Further replies (an error-limit 421) may follow. */
/* The reply smtpe.h describes for code, enhanced code e (NULL: none) and text[0..len), into exp. */
static void expected_reply(fz_buf *exp, unsigned code, const char *e, const uint8_t *text,
                           size_t len)
{
    char cc[4];
    snprintf(cc, sizeof cc, "%03u", code);
    size_t a = 0;
    for (;;) {
        size_t b = a;
        while (b < len && text[b] != '\n')
            b++;
        fz_put(exp, cc, 3);
        fz_put_u8(exp, b == len ? ' ' : '-');
        if (e) {
            fz_put(exp, e, strlen(e));
            if (b > a)
                fz_put_u8(exp, ' ');
        }
        if (b > a)
            fz_put(exp, text + a, b - a);
        fz_put(exp, "\r\n", 2);
        if (b == len)
            break;
        a = b + 1;
    }
}

static void check_verbatim(run *r, const decision *d, smtpe_event_type t, size_t q0)
{
    const smtpe_server_config *cfg = &r->c->cfg;
    if (!d->text || (t == SMTPE_EV_HELO && d->code / 100 == 2))
        return;
    int greeting = (t == SMTPE_EV_PROXY || t == SMTPE_EV_XCLIENT) && d->code == 220 &&
                   d->kind == K_REPLY;
    char enh[6] = {(char)('0' + d->code / 100 % 10), '.', '0', '.', '0', 0};
    const char *e = d->enhanced ? d->enhanced : enh;
    if (!(cfg->extensions & SMTPE_EXT_ENHANCEDSTATUSCODES) || d->code / 100 == 3 || greeting ||
        (t == SMTPE_EV_HELO && d->kind == K_REPLY))
        e = NULL;
    fz_buf text = {0}, exp = {0};
    if (greeting) {
        fz_put(&text, cfg->hostname, strlen(cfg->hostname));
        fz_put_u8(&text, ' ');
    }
    fz_put(&text, d->text, strlen(d->text));
    expected_reply(&exp, d->code, e, text.p, text.len);
    size_t got = r->queued.len - q0;
    /* the error past max_errors becomes 421 4.7.0 and closes (smtpe.h SMTPE_EV_ERROR_LIMIT; the
     * errors: 500-504, 555 and 535) */
    unsigned k = d->code;
    int error = (k >= 500 && k <= 504) || k == 555 || k == 535;
    if (error && d->kind == K_REPLY && cfg->max_errors && got >= 4 &&
        memcmp(r->queued.p + q0, "421 ", 4) == 0) {
        FUZZ_CHECK(smtpe_server_want(r->s) & SMTPE_WANT_CLOSE,
                   "an error reply became 421 but the session does not close");
        fz_free(&text);
        fz_free(&exp);
        return;
    }
    if (d->kind == K_CLOSE && exp.len > 600 &&
        !(got >= exp.len && memcmp(r->queued.p + q0, exp.p, exp.len) == 0)) {
        /* smtpe.h: a close text the 600 octets kept for the final reply cannot hold, behind
         * unsent replies, gives way to the code's default text */
        const char *dt = d->code < 300 ? "Ok" : d->code < 400 ? "Continue"
                         : d->code < 500 ? "Try again later" : "Rejected";
        fz_free(&exp);
        expected_reply(&exp, d->code, e, (const uint8_t *)dt, strlen(dt));
    }
    if (!(got >= exp.len && memcmp(r->queued.p + q0, exp.p, exp.len) == 0)) {
        fprintf(stderr, "--- expected reply:\n%.*s--- queued:\n%.*s\n", (int)exp.len,
                (const char *)exp.p, (int)got, (const char *)r->queued.p + q0);
        FUZZ_CHECK(0, "the reply queued is not the host's reply text verbatim (oracle l)");
    }
    fz_free(&text);
    fz_free(&exp);
}

/* The octets of the reply smtpe_server_reply(code, enhanced, text) formats for a MAIL or RCPT
 * (smtpe.h: enhanced NULL gives "x.0.0", text NULL a default text; the enhanced code only with
 * ENHANCEDSTATUSCODES and not for 3xx). */
static size_t reply_octets(const smtpe_server_config *cfg, unsigned code, const char *enhanced,
                           const char *text)
{
    static const char *dflt[] = {"Ok", "Continue", "Try again later", "Rejected"};
    char enh[6] = {(char)('0' + code / 100 % 10), '.', '0', '.', '0', 0};
    const char *e = enhanced ? enhanced : enh;
    if (!(cfg->extensions & SMTPE_EXT_ENHANCEDSTATUSCODES) || code / 100 == 3)
        e = NULL;
    if (!text)
        text = dflt[code < 300 ? 0 : code < 400 ? 1 : code < 500 ? 2 : 3];
    size_t n = 0, a = 0, len = strlen(text);
    for (;;) {
        size_t b = a;
        while (b < len && text[b] != '\n')
            b++;
        n += 4 + (e ? strlen(e) + (b > a) : 0) + (b - a) + 2;
        if (b == len)
            return n;
        a = b + 1;
    }
}

/* 1 if the host's text breaks the limits of smtpe_server_reply (at most 32 lines of at most
 * 400 octets, 2048 in all): SMTPE_ERR_REPLY_TOO_LONG whatever else. */
static int text_over_limits(const char *text)
{
    if (!text)
        return 0;
    size_t len = strlen(text), lines = 1, line = 0;
    int over = len > 2048;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\n') {
            line = 0;
            over |= ++lines > 32;
        } else {
            over |= ++line > 400;
        }
    }
    return over;
}

/* The end of the k-th command line after offset at in p[0..n), lines framed as the engine frames
 * them under the policy: at CRLF, and under NORMALISE also at a bare LF or a bare CR (known to
 * be bare once the next octet is there). k = 0: at itself. */
static uint64_t line_end_after(const uint8_t *p, size_t n, size_t at, uint64_t k,
                               smtpe_line_ending_policy pol)
{
    size_t i = at;
    int norm = pol == SMTPE_LINE_ENDING_NORMALISE;
    while (k > 0 && i < n) {
        if (p[i] == '\r' && i + 1 < n && (p[i + 1] == '\n' || norm)) {
            i += p[i + 1] == '\n' ? 2 : 1;
            k--;
        } else if (p[i] == '\n' && norm) {
            i++;
            k--;
        } else {
            i++;
        }
    }
    return i;
}

/* A close during a batch of concurrent verdicts came with the reply of one of its command
 * lines: the F-th reply of the batch, which is the last reply of the session (nothing is queued
 * once it closes), so F is known once everything is sent. Run 2, giving the verdicts one at a
 * time, stopped at that line (F - 1 from the batch's first): the RCPTs of later lines, which run
 * 1 took, never happened for it (dropped), and it consumed and executed only up to that line. */
static void settle_cut(run *r)
{
    if (!r->cut)
        return;
    uint64_t F = r->finals - r->B0;
    FUZZ_CHECK(F >= 1, "a batch of concurrent verdicts closed without a final reply");
    uint64_t cut = F - 1;
    for (size_t j = r->batch_first; j < r->nrec; j++) {
        rec *x = &r->recs[j];
        if (!x->in_batch || x->cmd - r->c0 <= cut)
            continue;
        FUZZ_CHECK(x->type == SMTPE_EV_RCPT,
                   "an event other than RCPT was handed out after the command the session "
                   "closed at");
        TRACE("[%s] RCPT of command %llu dropped by the close at command %llu\n", rname(r),
              (unsigned long long)x->cmd, (unsigned long long)(r->c0 + cut));
        x->excluded = 1;
    }
    r->cut_commands = r->c0 + cut;
    r->cut_consumed = line_end_after(r->c->client, r->consumed, r->recs[r->batch_first].at, cut,
                                     r->c->cfg.line_ending);
    FUZZ_CHECK(r->cut_consumed <= r->consumed,
               "the command a batch closed at lies beyond the octets consumed");
}

/* The session started closing (smtpe.h: QUIT, a timeout, the error limit, a 421, a host close
 * drop every verdict still owed). Every owed verdict is now refused with SMTPE_ERR_STATE, queuing
 * nothing; a batch under way is settled once everything is sent (settle_cut). */
static void on_close(run *r)
{
    r->closed_seen = 1;
    sync_out(r);
    if (r->batch_on) {
        r->cut = 1;
        r->batch_on = 0;
    }
    size_t q0 = r->queued.len;
    for (size_t i = 0; i < r->nowed; i++) {
        owed *e = &r->ow[i];
        FUZZ_CHECK(smtpe_server_reply_id(r->s, e->id, 250, NULL, NULL) == SMTPE_ERR_STATE &&
                       smtpe_server_accept_id(r->s, e->id) == SMTPE_ERR_STATE,
                   "a verdict owed before the session started closing was accepted (smtpe.h: "
                   "closing drops every verdict still owed)");
    }
    /* smtpe.h: the spans of a dropped verdict's event stay valid until the session is freed
     * (finish checks them) */
    r->dropped = r->ow;
    r->ndropped = r->nowed;
    r->ow = NULL;
    r->capowed = 0;
    FUZZ_CHECK(smtpe_server_accept(r->s) == SMTPE_ERR_STATE,
               "a verdict was accepted once the session is closing");
    sync_out(r);
    FUZZ_CHECK(r->queued.len == q0, "a verdict refused once closing queued output");
    r->nowed = r->nvoided = 0;
}

static void check_close(run *r)
{
    if (!r->closed_seen && (smtpe_server_want(r->s) & SMTPE_WANT_CLOSE))
        on_close(r);
}

/* Ids that are owed by no taken event (0, the next ones, one answered already) are refused with
 * SMTPE_ERR_STATE and queue nothing; so are the calls without an id when the host owes
 * nothing (an event that waits to be taken cannot be answered yet). */
static void probe_not_owed(run *r)
{
    sync_out(r);
    size_t q0 = r->queued.len;
    uint64_t ids[4] = {0, r->last_id + 1, r->last_id + 1000, r->answered_id};
    for (int k = 0; k < 4; k++) {
        int owed_now = 0;
        for (size_t i = 0; i < r->nowed; i++)
            owed_now |= r->ow[i].id == ids[k];
        if (owed_now || (k == 3 && ids[k] == 0))
            continue;
        FUZZ_CHECK(smtpe_server_reply_id(r->s, ids[k], 250, NULL, NULL) == SMTPE_ERR_STATE,
                   "smtpe_server_reply_id accepted an id no taken event owes a verdict for");
        FUZZ_CHECK(smtpe_server_accept_id(r->s, ids[k]) == SMTPE_ERR_STATE,
                   "smtpe_server_accept_id accepted an id no taken event owes a verdict for");
    }
    if (r->nowed == 0) {
        FUZZ_CHECK(smtpe_server_reply(r->s, 250, NULL, NULL) == SMTPE_ERR_STATE,
                   "smtpe_server_reply accepted while no taken event waits for a verdict");
        FUZZ_CHECK(smtpe_server_accept(r->s) == SMTPE_ERR_STATE,
                   "smtpe_server_accept accepted while no taken event waits for a verdict");
    }
    sync_out(r);
    FUZZ_CHECK(r->queued.len == q0, "a refused verdict call queued output");
    after_call(r);
}

/* Gives the verdict (one of them, for an LMTP DATA_END) the host owes for r->ow[i]. Under
 * concurrent verdicts the reply goes out once the replies before it have (a verdict for a
 * command that is not the oldest owed is held); a voided RCPT's verdict changes nothing. */
static void answer(run *r, size_t i)
{
    const fcase *c = r->c;
    owed *e = &r->ow[i];
    smtpe_event_type t = e->type;
    const decision dd = *decision_at(r, key_of(e->at, t, e->sub), t, 1);
    const decision *d = &dd;
    int kind = d->kind;
    int voided = e->voided;
    int oldest = i == 0, oldest_live = i == first_live(r);
    int batch = r->npend > 1 && (t == SMTPE_EV_MAIL || t == SMTPE_EV_RCPT);
    int by_id = d->use_id || !oldest;
    size_t rid = e->rec;
    int rc = 0;
    unsigned code = 0; /* the code of the reply the verdict gave; 0: a challenge */
    int closed = 0, challenged = 0;

    if (voided && kind == K_CLOSE) /* a close belongs to a command run 2 sees too */
        kind = K_ACCEPT;
    FUZZ_CHECK(kind != K_CLOSE || oldest_live, "harness: a close for a command not the oldest");
    check_spans(e);
    FUZZ_CHECK(smtpe_server_tls_started(r->s, r->now) == SMTPE_ERR_STATE,
               "tls_started accepted while a verdict was due");
    int other_auth = 0;
    for (size_t j = 0; j < r->nowed; j++)
        other_auth |= r->ow[j].type == SMTPE_EV_AUTH && r->ow[j].auth_other;
    if (!other_auth)
        FUZZ_CHECK(smtpe_server_auth_challenge(r->s, (const uint8_t *)"x", 1) == SMTPE_ERR_STATE,
                   "auth_challenge accepted for an event that is not a passed-through AUTH");
    /* (A close replaces the greeting only while none of it has been handed out by send_buf;
     * both runs look at send_buf from the start, so a close here always follows the greeting,
     * also while the greeting is still in flight in run 1: it must not move it.) */
    smtpe_server_stats st0, st1;
    smtpe_server_get_stats(r->s, &st0);
    sync_out(r);
    size_t f0 = r->finals, q0 = r->queued.len;
    int event_waiting = !!(smtpe_server_want(r->s) & SMTPE_WANT_EVENT);
    rc = verdict_call(r, e, d, kind, by_id);
    after_call(r);
    if (rc == SMTPE_ERR_REPLY_TOO_LONG) {
        /* oracle (k): too long is a property of the reply, not of the output the host has not
         * sent yet (the engine takes input only while it has room for a reply, and under LMTP
         * for one line per recipient): once everything queued is sent, the same call still
         * fails (the whole run has sent everything already, so both runs do the same) */
        while (send_output(r, 1))
            ;
        sync_out(r);
        f0 = r->finals;
        q0 = r->queued.len;
        FUZZ_CHECK(verdict_call(r, e, d, kind, by_id) == SMTPE_ERR_REPLY_TOO_LONG,
                   "a verdict refused as too long fitted once the queued output was sent: the "
                   "engine took input without keeping room for its reply (oracle k)");
        after_call(r);
    }
    if (kind == K_REPLY && (t == SMTPE_EV_MAIL || t == SMTPE_EV_RCPT) &&
        rc != SMTPE_ERR_INVALID_ARGUMENT) {
        /* the reply's bounds: the text's limits always; under concurrent verdicts a MAIL or
         * RCPT reply must also fit one line buffer, B = max(max_line_length - 2, 512) octets
         * (smtpe.h, smtpe_server_reply_id), whichever the verdict's turn (so that run 2, with
         * the same max_pending_verdicts, sees the same refusal); a voided RCPT's verdict
         * changes nothing and has no reply to bound */
        size_t b = c->cfg.max_line_length - 2 < 512 ? 512 : c->cfg.max_line_length - 2;
        int over = text_over_limits(d->text) ||
                   (batch && !voided && reply_octets(&c->cfg, d->code, d->enhanced, d->text) > b);
        if ((rc == SMTPE_ERR_REPLY_TOO_LONG) != over) {
            fprintf(stderr, "reply of %zu octets, bound %zu, text over the limits %d: rc %d\n",
                    reply_octets(&c->cfg, d->code, d->enhanced, d->text), b,
                    text_over_limits(d->text), rc);
            FUZZ_CHECK(0, "a MAIL/RCPT verdict refused as too long or accepted against the "
                          "bounds of smtpe.h (text limits; under concurrent verdicts one line "
                          "buffer)");
        }
    }
    if (kind == K_REPLY)
        code = d->code;
    else if (kind == K_CLOSE) {
        code = d->code;
        closed = rc == 0;
    } else if (kind == K_CHALLENGE) {
        if (t != SMTPE_EV_AUTH || !e->auth_other)
            FUZZ_CHECK(rc == SMTPE_ERR_STATE, "auth_challenge accepted for PLAIN or LOGIN");
        else if (d->chal_len > CHAL_BIG)
            FUZZ_CHECK(rc == SMTPE_ERR_REPLY_TOO_LONG, "auth_challenge took more than 1536 octets");
        else
            FUZZ_CHECK(rc == 0, "auth_challenge refused a challenge of at most 1536 octets");
        challenged = rc == 0;
    }
    FUZZ_CHECK(rc == 0 || rc == SMTPE_VOIDED || rc == SMTPE_ERR_INVALID_ARGUMENT ||
                   rc == SMTPE_ERR_REPLY_TOO_LONG || (kind == K_CHALLENGE && rc == SMTPE_ERR_STATE),
               "reply/close returned an error other than INVALID_ARGUMENT/REPLY_TOO_LONG");
    /* smtpe.h: the verdict of a voided RCPT returns SMTPE_VOIDED (its arguments are checked
     * first), no other verdict does */
    if (kind == K_REPLY) /* (accept: below) */
        FUZZ_CHECK(voided ? rc == SMTPE_VOIDED || rc < 0 : rc != SMTPE_VOIDED,
                   "a verdict returned SMTPE_VOIDED for a RCPT not voided, or another result for "
                   "a voided one (smtpe.h: a RCPT its MAIL's refusal voided)");
    else if (kind == K_CLOSE)
        FUZZ_CHECK(rc != SMTPE_VOIDED, "smtpe_server_close returned SMTPE_VOIDED");
    /* the reply is queued now unless it waits for an earlier one (or was voided); it is seen
     * unless it went to the ring's second run (maybe_b) */
    int now_out = !voided && (!batch || oldest_live);
    sync_out(r);
    if (rc == 0 && (kind == K_REPLY || kind == K_CLOSE) && now_out && r->finals > f0)
        check_verbatim(r, d, t, q0);
    TRACE("[%s] verdict for %d id=%llu%s%s: kind=%d code=%u enh=%s -> %d\n", rname(r), (int)t,
          (unsigned long long)e->id, voided ? " (voided)" : "", by_id ? " by id" : "", kind,
          d->code, d->enhanced ? d->enhanced : "-", rc);
    fz_put_u8(&r->recs[rid].b, 'V');
    fz_put_u64(&r->recs[rid].b, (uint64_t)(int64_t)rc);
    sync_out(r);
    if (rc < 0)
        FUZZ_CHECK(r->queued.len == q0, "a verdict call that failed queued output");
    if (kind == K_ACCEPT || rc < 0) {
        rc = by_id ? smtpe_server_accept_id(r->s, e->id) : smtpe_server_accept(r->s);
        after_call(r);
        FUZZ_CHECK(rc == (voided ? SMTPE_VOIDED : 0),
                   "smtpe_server_accept failed while a verdict was due (a voided RCPT's: "
                   "SMTPE_VOIDED)");
        code = default_code(t);
        sync_out(r);
    }
    smtpe_server_get_stats(r->s, &st1);
    unsigned w = smtpe_server_want(r->s);
    int closing = !!(w & SMTPE_WANT_CLOSE);
    int ok = !closed && code / 100 == 2;
    size_t got = r->finals - f0;
    /* counts of replies are exact unless replies may sit unseen in the ring's second run;
     * then what is seen is a prefix: at most the count */
    int exact = !r->maybe_b;
    if (voided) {
        FUZZ_CHECK(r->queued.len == q0 && st1.recipients == st0.recipients,
                   "the verdict for a voided RCPT queued output or added a recipient (smtpe.h: "
                   "it changes nothing)");
    } else if (!batch || closed) {
        FUZZ_CHECK(exact ? got == 1 : got <= 1, "a verdict did not queue exactly one reply");
    } else if (!oldest_live) {
        FUZZ_CHECK(r->queued.len == q0 && st1.commands == st0.commands,
                   "a verdict given before an earlier command's did not wait for its turn "
                   "(RFC 2920 §3.1: replies in command order)");
    } else {
        /* in order: the replies of this command and of the commands after it up to the next
         * one still waiting for its verdict (or a RCPT not yet taken) go out now; a refused
         * MAIL answers all the RCPTs after it (503); a command the engine executes once
         * nothing is owed may add its own reply */
        uint64_t rel = e->cmd - r->c0, lines = st0.commands - r->c0 + 1, stop = lines;
        if (!(t == SMTPE_EV_MAIL && !ok)) {
            for (size_t j = 0; j < r->nowed; j++)
                if (j != i && !r->ow[j].voided && r->ow[j].cmd > e->cmd &&
                    r->ow[j].cmd - r->c0 < stop)
                    stop = r->ow[j].cmd - r->c0;
            if (event_waiting && lines - 1 < stop)
                stop = lines - 1;
        }
        uint64_t expect = stop - rel, resumed = st1.commands - st0.commands;
        FUZZ_CHECK(resumed <= 1, "a verdict executed more than one waiting command");
        if (got > expect + resumed || (exact && closing && got < 1) ||
            (exact && !closing && got != expect && !(resumed && got == expect + 1))) {
            fprintf(stderr, "verdict for command %llu of the batch: %zu replies out, expected "
                            "%llu (+%llu executed after it), closing %d\n",
                    (unsigned long long)rel, got, (unsigned long long)expect,
                    (unsigned long long)resumed, closing);
            FUZZ_CHECK(0, "the replies released by a verdict are not those of its command and "
                          "the answered ones after it, in command order (RFC 2920 §3.1)");
        }
    }

    /* oracle (g): the credentials are gone once the host has answered */
    for (size_t k = 0; k < e->nsecrets; k++)
        for (size_t j = 0; j < e->secrets[k].len; j++)
            FUZZ_CHECK(e->secrets[k].ptr[j] == 0,
                       "AUTH credentials still in session memory after the host's answer "
                       "(smtpe.h: the engine wipes them after the verdict)");
    e->nsecrets = 0;
    r->chal_step = challenged ? (long)e->auth_step : t == SMTPE_EV_AUTH ? -1 : r->chal_step;
    if (code == 421)
        e->saw_421 = 1;

    /* the host's model: what the verdict means */
    if (voided) {
        /* nothing */
    } else if (t == SMTPE_EV_MAIL) {
        if (ok) { /* the transaction starts, even if a later reply closes the session */
            model_reset_txn(r);
            r->in_txn = 1;
            r->txn_binary = e->mail_binary;
            r->txn_rcpts = e->pending_ok;
        } else if (!closed) {
            /* smtpe.h: the RCPTs handed out before the MAIL's verdict belong to it; refused, it
             * voids them: each is answered 503 5.5.1 by the engine and its verdict, still owed,
             * changes nothing; run 2 executes their lines after the refusal and sees no event */
            for (size_t j = r->batch_first; j < r->nrec; j++)
                if (r->recs[j].mail_id == e->id && r->recs[j].type == SMTPE_EV_RCPT) {
                    r->recs[j].excluded = 1;
                    TRACE("[%s] RCPT record %zu voided\n", rname(r), j);
                }
            for (size_t j = 0; j < r->nowed; j++)
                if (r->ow[j].mail_id == e->id && !r->ow[j].voided) {
                    r->ow[j].voided = 1;
                    r->nvoided++;
                }
        }
    } else if (t == SMTPE_EV_RCPT) {
        if (ok) {
            size_t m = 0;
            while (m < r->nowed && !(e->mail_id && r->ow[m].id == e->mail_id))
                m++;
            if (m < r->nowed)
                r->ow[m].pending_ok++;
            else
                r->txn_rcpts++;
        }
    } else if (!closing) {
        switch (t) {
        case SMTPE_EV_HELO:
            if (ok)
                r->helo_ok = 1;
            break;
        case SMTPE_EV_CHUNK_END:
            if (!ok)
                model_reset_txn(r);
            break;
        case SMTPE_EV_AUTH:
            if (ok)
                r->authenticated = 1;
            break;
        case SMTPE_EV_XCLIENT:
            if (code == 220) {
                r->helo_ok = 0;
                r->authenticated = 0;
                model_reset_txn(r);
            }
            break;
        default:
            break;
        }
    }
    if (t == SMTPE_EV_DATA_END) {
        /* oracle (h): one verdict per recipient under LMTP */
        e->verdicts_left = closing ? 0 : e->verdicts_left - 1;
        /* (closing drops every verdict still owed, voided RCPTs' too) */
        FUZZ_CHECK(!!(w & SMTPE_WANT_VERDICT) ==
                       (!closing && (e->verdicts_left > 0 || r->nowed > 1)),
                   "SMTPE_WANT_VERDICT after a DATA_END verdict disagrees with the verdicts "
                   "still owed (ev.data_end.replies)");
        if (e->verdicts_left > 0) {
            e->sub++;
            e->defer = r->split ? decision_at(r, key_of(e->at, t, e->sub), t, 1)->defer : 0;
            r->mark = r->finals;
            r->mark_exact = !r->maybe_b;
            after_event(r, d, rid);
            return;
        }
        if (!closing)
            model_reset_txn(r);
    }
    /* the verdict is given: the entry leaves the list, its id is owed no more */
    uint64_t id = e->id;
    int saw_421 = e->saw_421;
    fz_free(&e->copy);
    if (voided)
        r->nvoided--;
    memmove(&r->ow[i], &r->ow[i + 1], (r->nowed - i - 1) * sizeof *r->ow);
    r->nowed--;
    e = NULL;
    if (!closing) {
        r->answered_id = id;
        FUZZ_CHECK(smtpe_server_reply_id(r->s, id, 250, NULL, NULL) == SMTPE_ERR_STATE &&
                       smtpe_server_accept_id(r->s, id) == SMTPE_ERR_STATE,
                   "a second verdict for the same event was accepted");
        if (r->nowed == 0)
            FUZZ_CHECK(smtpe_server_accept(r->s) == SMTPE_ERR_STATE,
                       "a verdict was accepted while no taken event waits for one");
        sync_out(r);
        FUZZ_CHECK(r->finals == f0 + got, "a refused second verdict queued output");
    }
    if (saw_421 && now_out)
        FUZZ_CHECK(closing, "a 421 verdict did not make the session close "
                            "(smtpe_server_reply: a 421 closes the session)");
    check_close(r);
    if (r->batch_on && first_live(r) == r->nowed)
        r->batch_on = 0; /* every reply of the batch is out */
    if (w & SMTPE_WANT_TLS) {
        FUZZ_CHECK(t == SMTPE_EV_STARTTLS && code == 220,
                   "SMTPE_WANT_TLS after a verdict other than STARTTLS 220");
        size_t rest = c->client_len - r->consumed;
        r->tls_pending = 1;
        r->junk_left = d->junk < rest ? d->junk : rest;
        r->tls_tries = 0;
        TRACE("[%s] TLS wanted; %zu pre-TLS octets follow\n", rname(r), r->junk_left);
    }
    if (t == SMTPE_EV_PROXY && c->implicit_tls && !closing) {
        /* implicit TLS behind a proxy: the handshake follows the PROXY header */
        int trc = smtpe_server_tls_started(r->s, r->now);
        after_call(r);
        FUZZ_CHECK(trc == 0, "tls_started (implicit TLS) failed right after the PROXY verdict");
        fz_put_u8(&r->recs[rid].b, 'I');
        model_tls_up(r);
    }
    r->mark = r->finals;
    r->mark_exact = !r->maybe_b;
    if (!batch) /* concurrent verdicts: no clock step between MAIL/RCPT (see the top) */
        after_event(r, d, rid);
}

/* Split run: the host looks at one of the verdicts it owes (fuzz-chosen: the oldest, the
 * newest or any) and gives it unless it is still deferred. A close waits until its command is
 * the oldest (a close is immediate: given earlier it would cut replies run 2 sends). Returns 1
 * if it did anything. */
static int verdict_step(run *r)
{
    if (r->nowed == 0)
        return 0;
    size_t i = 0;
    if (r->nowed > 1) {
        unsigned v = prov_u8(&r->c->pv);
        i = v < 64 ? 0 : v < 128 ? r->nowed - 1 : v % r->nowed;
    }
    owed *e = &r->ow[i];
    if (e->defer > 0) {
        e->defer--;
        return 1;
    }
    const decision *d = decision_at(r, key_of(e->at, e->type, e->sub), e->type, 1);
    if (d->kind == K_CLOSE && !e->voided && i != first_live(r))
        return 0;
    answer(r, i);
    return 1;
}

/* Sends (part of) the queued output. The host hands send_buf's octets (p, len) to a write and
 * keeps them in flight; in the split run the write completes after a fuzz-chosen number of
 * engine calls (after_call checks them meanwhile) with a fuzz-chosen part of them, or the peer
 * stalls; in the whole run, and with all set, at once and in full. Returns 1 if octets were
 * acknowledged. */
static int send_output(run *r, int all)
{
    sync_out(r);
    if (!r->fl_on) {
        size_t len = 0;
        const uint8_t *p = smtpe_server_send_buf(r->s, &len);
        if (len == 0) {
            FUZZ_CHECK(!r->fl_next, "after a partial acknowledgement send_buf gave nothing");
            r->maybe_b = 0; /* nothing queued at all */
            return 0;
        }
        FUZZ_CHECK(p != NULL, "send_buf returned NULL with a length");
        if (r->fl_next)
            FUZZ_CHECK(p == r->fl_next, "after a partial acknowledgement send_buf does not give "
                                        "the octets right after the acknowledged ones");
        r->fl_on = 1;
        r->fl_p = p;
        r->fl_len = r->fl_latest = len;
        r->fl_delay = 0;
        r->fl_copy.len = 0;
        fz_put(&r->fl_copy, p, len);
    }
    size_t len = r->fl_len, n = len;
    if (!all) {
        if (r->fl_delay > 0)
            return 0; /* the write has not completed yet */
        if (r->stall > 0) {
            r->stall--; /* the peer reads nothing for a while (its window is full) */
            return 0;
        }
        unsigned v = prov_u8(&r->c->pv);
        if (v == 255) { /* a stall: this and the next 1..256 partial sends send nothing */
            r->stall = 1 + prov_u8(&r->c->pv);
            return 0;
        }
        switch (v & 7) {
        case 0: case 1: /* the write goes on for a few more engine calls */
            r->fl_delay = (v >> 3) % 16;
            return 0;
        case 2: n = 1; break;
        case 3: n = len > 1 ? len - 1 : len; break;
        case 4: {
            size_t cur = 0;
            (void)smtpe_server_send_buf(r->s, &cur);
            FUZZ_CHECK(smtpe_server_send_ack(r->s, cur + 1) == SMTPE_ERR_INVALID_ARGUMENT,
                       "send_ack accepted more than send_buf gave");
            n = (v >> 3) % (len + 1);
            break;
        }
        default: n = (v >> 3) % (len + 1); break;
        }
    }
    FUZZ_CHECK(memcmp(r->fl_p, r->fl_copy.p, len) == 0,
               "output handed out by send_buf changed before it was acknowledged (stable output)");
    size_t cur = 0;
    const uint8_t *p = smtpe_server_send_buf(r->s, &cur);
    FUZZ_CHECK(p == r->fl_p && cur >= len, "send_buf gave other octets before the acknowledgement");
    fz_put(&r->out, r->fl_p, n);
    if (n)
        TRACE("[%s] sent %zu: %.*s%s", rname(r), n, (int)n, (const char *)r->fl_p,
              r->fl_p[n - 1] == '\n' ? "" : "\n");
    FUZZ_CHECK(smtpe_server_send_ack(r->s, n) == 0, "send_ack of a valid count failed");
    r->acked += n;
    r->fl_on = 0;
    if (n == cur) {
        /* the run is all acknowledged: the next may start anywhere (the ring's second run) and
         * holds everything queued */
        r->fl_next = NULL;
        r->maybe_b = 0;
    } else {
        /* the rest keeps its address; replies queued from now on may go to a second run that
         * send_buf gives only once this one is all acknowledged */
        r->fl_next = r->fl_p + n;
        if (n)
            r->maybe_b = 1;
    }
    return n > 0;
}

/* Split run: acknowledges the whole run send_buf gives, so that everything queued is visible
 * (counted exactly) from now on. */
static void complete_run(run *r)
{
    sync_out(r);
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(r->s, &len);
    if (len == 0) {
        r->maybe_b = 0;
        return;
    }
    FUZZ_CHECK(!r->fl_on || (p == r->fl_p && len >= r->fl_len),
               "send_buf gave other octets before the acknowledgement");
    if (r->fl_on)
        FUZZ_CHECK(memcmp(r->fl_p, r->fl_copy.p, r->fl_len) == 0,
                   "output handed out by send_buf changed before it was acknowledged");
    fz_put(&r->out, p, len);
    FUZZ_CHECK(smtpe_server_send_ack(r->s, len) == 0, "send_ack of a valid count failed");
    r->acked += len;
    r->fl_on = 0;
    r->fl_next = NULL;
    r->maybe_b = 0;
    sync_out(r);
}

/* The octets p[0..len) for a recv: the split run copies them to a heap block of exactly len
 * octets (so ASan sees any read past them). */
static const uint8_t *fed_octets(run *r, size_t len)
{
    if (!r->split)
        return r->whole + r->consumed;
    free(r->feed);
    r->feed = malloc(len ? len : 1);
    if (!r->feed)
        abort();
    memcpy(r->feed, r->c->client + r->consumed, len);
    r->feed_len = len;
    return r->feed;
}

/* Feeds the octets the host holds. Returns 1 if the engine consumed any or has an event. */
static int feed_input(run *r)
{
    size_t len = r->avail - r->consumed;
    if (len == 0)
        return 0;
    const uint8_t *p = fed_octets(r, len);
    unsigned w = smtpe_server_want(r->s);
    sync_out(r);
    size_t out_before = r->queued.len;
    smtpe_server_stats st0, st1;
    smtpe_server_get_stats(r->s, &st0);
    smtpe_ssize n = smtpe_server_recv(r->s, p, len, r->now);
    after_call(r);
    sync_out(r);
    smtpe_server_get_stats(r->s, &st1);
    /* a reply may have gone to the ring's second run, unseen: a command line done tells */
    int replied = r->queued.len > out_before || (r->maybe_b && st1.commands > st0.commands);
    TRACE("[%s] recv(%zu) = %td want=%#x\n", rname(r), len, n, smtpe_server_want(r->s));
    FUZZ_CHECK(n >= 0, "smtpe_server_recv returned an error for valid arguments");
    FUZZ_CHECK((size_t)n <= len, "smtpe_server_recv consumed more than len");
    if (owes_alone(r))
        FUZZ_CHECK(n == 0, "smtpe_server_recv consumed input while a verdict was due");
    if (!(w & SMTPE_WANT_READ))
        FUZZ_CHECK(n == 0, "smtpe_server_recv consumed input without SMTPE_WANT_READ");
    else
        FUZZ_CHECK(n > 0 || (smtpe_server_want(r->s) & SMTPE_WANT_EVENT) || replied,
                   "SMTPE_WANT_READ was set but recv neither consumed, made an event nor replied");
    if (r->batch_on && !owes_alone(r))
        FUZZ_CHECK(r->queued.len == out_before,
                   "a command read while MAIL/RCPT verdicts were owed was answered before them "
                   "(RFC 2920 §3.1: replies in command order)");
    r->consumed += (size_t)n;
    check_close(r);
    /* an event or a reply may come without an octet consumed: a held-back line break handed
     * out, or (NORMALISE) a line that an earlier bare CR ended answered */
    return n > 0 || (smtpe_server_want(r->s) & SMTPE_WANT_EVENT) || replied;
}

/* The host's piece size when the split run reads more client octets. */
static size_t piece(run *r)
{
    unsigned v = prov_u8(&r->c->pv);
    size_t rest = r->c->client_len - r->avail, n;
    if (v < 96)
        n = 1 + v % 4;
    else if (v < 176)
        n = 1 + v % 24;
    else if (v < 232)
        n = 1 + (size_t)prov_u8(&r->c->pv) * 2;
    else
        n = rest;
    n = n < rest ? n : rest;
    TRACE("[split] host reads %zu more octets (%zu of %zu)\n", n, r->avail + n, r->c->client_len);
    return n;
}

/* Oracle (f): n octets that arrived after the STARTTLS 220 and before the handshake. */
static void feed_junk(run *r, size_t n)
{
    const uint8_t *p = fed_octets(r, n);
    unsigned w0 = smtpe_server_want(r->s);
    size_t out0, out1;
    (void)smtpe_server_send_buf(r->s, &out0);
    smtpe_ssize got = smtpe_server_recv(r->s, p, n, r->now);
    after_call(r);
    (void)smtpe_server_send_buf(r->s, &out1);
    TRACE("[%s] pre-TLS recv(%zu) = %td\n", rname(r), n, got);
    FUZZ_CHECK(got == (smtpe_ssize)n, "octets fed before tls_started were not all consumed (f)");
    FUZZ_CHECK(out1 == out0, "octets fed before tls_started produced a reply (f)");
    FUZZ_CHECK(smtpe_server_want(r->s) == w0,
               "octets fed before tls_started changed what the session wants (f)");
    smtpe_event ev;
    FUZZ_CHECK(smtpe_server_next_event(r->s, &ev) == 0,
               "octets fed before tls_started produced an event (f)");
    after_call(r);
    r->consumed += n;
    r->discarded += n;
    r->junk_left -= n;
}

/* One step of the host between an accepted STARTTLS and smtpe_server_tls_started: feed the
 * pre-TLS octets, send the 220, then start TLS. */
static void tls_step(run *r)
{
    const fcase *c = r->c;
    if (r->junk_left > 0) {
        size_t have = r->avail - r->consumed;
        if (have == 0) {
            r->avail += r->split ? piece(r) : c->client_len - r->avail;
            return;
        }
        size_t n = have < r->junk_left ? have : r->junk_left;
        if (r->split) {
            unsigned v = prov_u8(&r->c->pv);
            if (v & 1)
                n = 1 + (v >> 1) % n;
        }
        feed_junk(r, n);
        return;
    }
    size_t len = 0;
    (void)smtpe_server_send_buf(r->s, &len);
    if (len > 0) {
        FUZZ_CHECK(smtpe_server_tls_started(r->s, r->now) == SMTPE_ERR_STATE,
                   "tls_started accepted before the STARTTLS 220 was sent");
        after_call(r);
        send_output(r, !r->split || ++r->tls_tries > 8);
        return;
    }
    int rc = smtpe_server_tls_started(r->s, r->now);
    after_call(r);
    TRACE("[%s] tls_started = %d\n", rname(r), rc);
    FUZZ_CHECK(rc == 0, "tls_started failed after the STARTTLS 220 was sent");
    FUZZ_CHECK(smtpe_server_tls_started(r->s, r->now) == SMTPE_ERR_STATE,
               "tls_started accepted a second time");
    r->tls_pending = 0;
    fz_put_u8(lg(r), 'T');
    model_tls_up(r);
    unsigned w = smtpe_server_want(r->s);
    FUZZ_CHECK((w & SMTPE_WANT_READ) && !(w & (SMTPE_WANT_TLS | SMTPE_WANT_CLOSE)),
               "after tls_started the session does not want to read");
    expiry_check(r, r->cur);
}

/* What the host does right after creating the session. */
static void session_begin(run *r)
{
    const fcase *c = r->c;
    r->chal_step = -1;
    if (c->trusted)
        FUZZ_CHECK(smtpe_server_set_trusted(r->s, 1) == 0, "set_trusted failed");
    if (c->implicit_tls && !c->cfg.proxy_protocol) {
        FUZZ_CHECK(smtpe_server_tls_started(r->s, r->now) == 0,
                   "tls_started (implicit TLS) failed right after creation");
        FUZZ_CHECK(smtpe_server_tls_started(r->s, r->now) == SMTPE_ERR_STATE,
                   "tls_started accepted a second time");
        model_tls_up(r);
    }
}

static void drive(run *r)
{
    const fcase *c = r->c;
    size_t limit = 64 * (c->client_len + 64) + 10000;
    r->avail = r->split ? 0 : c->client_len;
    (void)rec_new(r, SMTPE_EV_NONE, 0); /* record 0: the session's start */
    session_begin(r);
    const decision d0 = *decision_at(r, key_of(0, SMTPE_EV_NONE, 0), SMTPE_EV_NONE, 0);
    after_event(r, &d0, 0);
    for (size_t iter = 0;; iter++) {
        FUZZ_CHECK(iter < limit + 200 * r->most_owed, "the session does not come to rest");
        if (r->tls_pending) {
            check_want(r);
            tls_step(r);
            continue;
        }
        int progress = 0;
        {
            unsigned w = smtpe_server_want(r->s);
            smtpe_event ev;
            memset(&ev, 0xA5, sizeof ev);
            sync_out(r);
            size_t pre = r->finals;
            int alone = owes_alone(r);
            int got = smtpe_server_next_event(r->s, &ev);
            after_call(r);
            FUZZ_CHECK(got == 0 || got == 1, "next_event returned neither 0 nor 1");
            FUZZ_CHECK(!!(w & SMTPE_WANT_EVENT) == got,
                       "SMTPE_WANT_EVENT disagrees with next_event");
            if (alone)
                FUZZ_CHECK(!got, "an event came out while a verdict was due");
            if (got) {
                take_event(r, &ev, pre);
                progress = 1;
            }
            check_close(r);
        }
        check_want(r);
        if (r->tls_pending)
            continue;
        if (r->nowed > 0) {
            if (!r->split) {
                /* run 2: every verdict at once, in order */
                while (r->nowed > 0 && !r->tls_pending)
                    answer(r, 0);
                progress = 1;
            } else {
                progress |= verdict_step(r);
            }
            check_want(r);
            if (r->tls_pending)
                continue;
        }
        if (r->split)
            probe_not_owed(r);
        progress |= send_output(r, !r->split);
        if (r->split && r->avail < c->client_len && (prov_u8(&r->c->pv) & 3) == 0)
            r->avail += piece(r);
        if (!(smtpe_server_want(r->s) & SMTPE_WANT_EVENT))
            progress |= feed_input(r);
        if (progress)
            continue;
        if (r->nowed > 0) /* nothing else to do: the oldest verdict owed is due */
            answer(r, 0);
        else if (r->avail < c->client_len)
            r->avail += r->split ? piece(r) : c->client_len - r->avail;
        else if (!send_output(r, 1))
            break;
    }
    flush_chunks(r);
}

/* 1 if p[0..n) is base64 text (RFC 4648 §4 alphabet and padding). */
static int is_base64(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= 'a' && p[i] <= 'z') ||
              (p[i] >= '0' && p[i] <= '9') || p[i] == '+' || p[i] == '/' || p[i] == '='))
            return 0;
    return n % 4 == 0;
}

/* The length of the enhanced status code (RFC 3463 §2, RFC 2034 §4) that starts the text
 * p[0..n) of a reply line: digit "." digits "." digits, then SP or the end of the line; 0 if the
 * text does not start with one. The parts' lengths and the class are checked by the caller. */
static size_t enhanced_at(const uint8_t *p, size_t n)
{
    size_t i = 0;
    for (int part = 0; part < 3; part++) {
        size_t d = i;
        while (i < n && p[i] >= '0' && p[i] <= '9')
            i++;
        if (i == d || (part == 0 && i - d != 1))
            return 0;
        if (part < 2) {
            if (i >= n || p[i] != '.')
                return 0;
            i++;
        }
    }
    return i == n || p[i] == ' ' ? i : 0;
}

/* 1 if e[0..n) (as enhanced_at found it) is a valid enhanced status code for a reply whose code
 * starts with the digit first: class 2, 4 or 5 equal to it, subject and detail 1..3 digits. */
static int enhanced_fits(const uint8_t *e, size_t n, uint8_t first)
{
    if (e[0] != first || (first != '2' && first != '4' && first != '5'))
        return 0;
    size_t i = 2, d = 0;
    while (e[i] != '.') {
        i++;
        d++;
    }
    return d >= 1 && d <= 3 && n - i - 1 >= 1 && n - i - 1 <= 3;
}

/* Oracle (b) over everything the session sent. */
static void check_output(const uint8_t *p, size_t n)
{
    size_t i = 0;
    unsigned open = 0; /* code of an unfinished multi-line reply */
    const uint8_t *open_enh = NULL; /* its enhanced status code (NULL: none) */
    size_t open_enh_len = 0;
    while (i < n) {
        size_t j = i;
        while (j + 1 < n && !(p[j] == '\r' && p[j + 1] == '\n'))
            j++;
        FUZZ_CHECK(j + 1 < n, "output ends in a line without CRLF");
        size_t len = j + 2 - i;
        FUZZ_CHECK(len >= 6, "reply line too short for ^[2-5][0-9][0-9][ -]");
        FUZZ_CHECK(p[i] >= '2' && p[i] <= '5' && p[i + 1] >= '0' && p[i + 1] <= '9' &&
                       p[i + 2] >= '0' && p[i + 2] <= '9' && (p[i + 3] == ' ' || p[i + 3] == '-'),
                   "reply line does not match ^[2-5][0-9][0-9][ -]");
        if (memcmp(p + i, "334 ", 4) == 0) {
            /* a SASL challenge (RFC 4954 §4): base64 of up to 1536 octets */
            FUZZ_CHECK(len <= 4 + 2048 + 2, "334 challenge longer than base64 of 1536 octets");
            FUZZ_CHECK(is_base64(p + i + 4, len - 6), "334 challenge text is not base64");
        } else {
            FUZZ_CHECK(len <= 512, "reply line longer than 512 octets");
        }
        for (size_t x = i; x < j; x++)
            FUZZ_CHECK((p[x] >= 0x20 && p[x] != 0x7f) || p[x] == '\t',
                       "control octet inside a reply line (RFC 5321 4.2: HT allowed)");
        unsigned code = (unsigned)(p[i] - '0') * 100 + (unsigned)(p[i + 1] - '0') * 10 +
                        (unsigned)(p[i + 2] - '0');
        size_t el = enhanced_at(p + i + 4, j - (i + 4));
        if (el)
            FUZZ_CHECK(enhanced_fits(p + i + 4, el, p[i]),
                       "enhanced status code invalid or of another class than the reply code "
                       "(RFC 3463 §2: its class is the reply code's first digit)");
        if (open) {
            FUZZ_CHECK(code == open, "multi-line reply changes its code");
            FUZZ_CHECK(fz_eq(open_enh, open_enh_len, el ? p + i + 4 : NULL, el),
                       "multi-line reply changes its enhanced status code (or has it on some "
                       "lines only)");
        } else { /* the first line of a reply: the others repeat its code and enhanced code */
            open_enh = el ? p + i + 4 : NULL;
            open_enh_len = el;
        }
        open = p[i + 3] == '-' ? code : 0;
        i = j + 2;
    }
    FUZZ_CHECK(open == 0, "output ends inside a multi-line reply");
}

static void finish(run *r)
{
    smtpe_server_stats st;
    smtpe_server_get_stats(r->s, &st);
    for (size_t i = 0; i < r->ndropped; i++)
        check_spans(&r->dropped[i]);
    FUZZ_CHECK(r->nowed == 0, "harness: verdicts still owed at the end");
    FUZZ_CHECK(st.octets_in == r->consumed, "stats octets_in is not the octets consumed");
    FUZZ_CHECK(st.octets_out == r->acked, "stats octets_out is not the octets acknowledged");
    FUZZ_CHECK(st.discarded_octets == r->discarded,
               "stats discarded_octets is not the octets fed while TLS was pending (f)");
    FUZZ_CHECK(!!st.tls == r->tls_up, "stats tls disagrees with tls_started");
    FUZZ_CHECK(!!st.authenticated == r->authenticated,
               "stats authenticated disagrees with the AUTH verdicts");
    unsigned w = smtpe_server_want(r->s);
    FUZZ_CHECK(w & (SMTPE_WANT_READ | SMTPE_WANT_CLOSE),
               "the session at rest wants neither to read nor to close (a host would hang)");
    if (!(w & SMTPE_WANT_CLOSE))
        FUZZ_CHECK(r->consumed == r->c->client_len, "input left over in an open session");
    sync_out(r);
    FUZZ_CHECK(fz_eq(r->queued.p, r->queued.len, r->out.p, r->out.len),
               "the octets sent are not the octets queued");
    check_output(r->out.p, r->out.len);

    /* a close inside a batch: what run 2 consumed and executed (run 2 itself gets its own
     * figures back) */
    settle_cut(r);
    uint64_t commands = r->cut ? r->cut_commands : st.commands;
    uint64_t consumed = r->cut ? r->cut_consumed : r->consumed;
    if (!r->split && r->cut)
        FUZZ_CHECK(commands == st.commands && consumed == r->consumed,
                   "harness: run 2 closed inside a batch at another command than its last");

    /* the log: the records of the events both runs see, in the order they were taken */
    size_t excluded = 0;
    for (size_t i = 0; i < r->nrec; i++) {
        if (r->recs[i].excluded) {
            excluded++;
            continue;
        }
        fz_put(&r->log, r->recs[i].b.p, r->recs[i].b.len);
    }
    if (!r->split)
        FUZZ_CHECK(excluded == 0, "harness: run 2 voided or dropped an event");
    TRACE("[%s] %zu events, %zu excluded, at most %u verdicts owed at once%s\n", rname(r),
          r->nrec - 1, excluded, r->most_owed, r->cut ? ", closed inside a batch" : "");
    fz_put_u8(&r->log, 'S');
    fz_put_u64(&r->log, consumed); /* octets_in, checked above */
    fz_put_u64(&r->log, st.octets_out);
    fz_put_u64(&r->log, commands);
    fz_put_u64(&r->log, st.errors);
    fz_put_u64(&r->log, st.transactions);
    fz_put_u64(&r->log, st.recipients);
    fz_put_u64(&r->log, st.discarded_octets);
    fz_put_u64(&r->log, (uint64_t)st.tls);
    fz_put_u64(&r->log, (uint64_t)st.authenticated);
    fz_put_u64(&r->log, w);
}

static void run_free(run *r)
{
    fz_free(&r->out);
    fz_free(&r->log);
    fz_free(&r->msg);
    fz_free(&r->queued);
    fz_free(&r->bdat_raw);
    fz_free(&r->fl_copy);
    for (size_t i = 0; i < r->nrec; i++)
        fz_free(&r->recs[i].b);
    free(r->recs);
    for (size_t i = 0; i < r->nowed; i++)
        fz_free(&r->ow[i].copy);
    free(r->ow);
    for (size_t i = 0; i < r->ndropped; i++)
        fz_free(&r->dropped[i].copy);
    free(r->dropped);
    free(r->feed);
}

/* ------------------------------------------------------------------------------------------ */

static void make_config(fcase *c, const uint8_t *h)
{
    static const char *extra[] = {"AUTH PLAIN LOGIN", "DSN",
                                  "X-EXTRA-KEYWORD-WITH-A-LONG-ARGUMENT "
                                  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                  "aaaaaaaaaaaaaaa"};
    static const char *mechs[] = {NULL, "PLAIN LOGIN", "PLAIN LOGIN XOAUTH2",
                                  "X-TOKEN LOGIN CRAM-MD5 PLAIN"};
    static char longhost[256];
    static const size_t rbuf[] = {2048, 2100, 3000, 4096, 65536};
    static const size_t lmax[] = {512, 513, 600, 1000, 4096};
    static const uint64_t t0[] = {0, 1000, (uint64_t)1 << 40, (uint64_t)1 << 62};
    static const unsigned npv[] = {1, 2, 8, 100};
    if (!longhost[0]) {
        memset(longhost, 'h', 255);
        for (int i = 63; i < 255; i += 64)
            longhost[i] = '.';
    }
    smtpe_server_config *cfg = &c->cfg;
    smtpe_server_config_init(cfg);
    cfg->hostname = "mx.example";
    cfg->line_ending = (smtpe_line_ending_policy)(h[0] % 3);
    cfg->lax_angle_brackets = h[1] & 1;
    if (h[1] & 2) {
        cfg->ehlo_extra = extra;
        cfg->ehlo_extra_count = 3;
    }
    if (h[1] & 4)
        cfg->hostname = longhost;
    if (h[1] & 8)
        cfg->greeting_text = "Service ready \xe2\x9c\x93";
    switch ((h[1] >> 4) & 3) {
    case 1: cfg->command_timeout_ms = 0; cfg->data_timeout_ms = 0; break;
    case 2: cfg->command_timeout_ms = 1000; cfg->data_timeout_ms = 1000; break;
    case 3: cfg->command_timeout_ms = 1000; cfg->data_timeout_ms = 0; break;
    default: break;
    }
    c->trusted = (h[1] >> 6) & 1;
    c->implicit_tls = (h[1] >> 7) & 1;
    if (h[2] >= 64)
        cfg->max_message_size = (uint64_t)(h[2] - 64) * 8 + 1;
    else if (h[2] >= 32)
        cfg->max_message_size = 0;
    if (h[3] < 128)
        cfg->max_recipients = 1 + h[3] % 4;
    else if (h[3] >= 192)
        cfg->max_recipients = h[3];
    if (h[4] < 128)
        cfg->max_errors = h[4] % 6;
    cfg->extensions = h[5] | (unsigned)(h[15] & 0x3f) << 8;
    cfg->auth_mechanisms = mechs[h[15] >> 6];
    cfg->reply_buffer_size = rbuf[h[6] % 5];
    cfg->max_line_length = lmax[h[7] % 5];
    c->t0 = t0[h[14] & 3];
    cfg->auth_without_tls = (h[14] >> 2) & 1;
    cfg->require_tls = (h[14] >> 3) & 1;
    cfg->lmtp = (h[14] >> 4) & 1;
    cfg->proxy_protocol = (h[14] >> 5) & 1;
    cfg->max_pending_verdicts = npv[h[14] >> 6];
}

/* smtpe.h's formula of smtpe_server_memory_size(cfg) without S, the session struct:
 *   N * (B + 40) + O + L
 * N = max_pending_verdicts, B = max_line_length - 2 (at least 512 when N > 1),
 * O = max(reply_buffer_size, R + 600) + (N - 1) * B, R = max(2560, E),
 * E = 1100 + strlen(auth_mechanisms) + sum(6 + strlen(ehlo_extra[i])),
 * L = 512 * max_recipients under LMTP, else 0. In octets. */
static size_t formula_without_s(const smtpe_server_config *cfg)
{
    size_t n = cfg->max_pending_verdicts;
    size_t b = cfg->max_line_length - 2;
    if (n > 1 && b < 512)
        b = 512;
    size_t e = 1100 + (cfg->auth_mechanisms ? strlen(cfg->auth_mechanisms) : 0);
    for (size_t i = 0; i < cfg->ehlo_extra_count; i++)
        e += 6 + strlen(cfg->ehlo_extra[i]);
    size_t room = e > 2560 ? e : 2560;
    size_t out = cfg->reply_buffer_size > room + 600 ? cfg->reply_buffer_size : room + 600;
    out += (n - 1) * b;
    if (cfg->lmtp)
        out += (size_t)512 * cfg->max_recipients;
    return n * (b + 40) + out;
}

/* Oracle (d), the formula: memory_size(cfg) - formula_without_s(cfg) is the same S for every
 * valid config, a multiple of max_align_t's size, and (LP64) the one the figures of smtpe.h
 * give: "With the defaults (on LP64): 6214 octets (57414 with lmtp; 111552 with
 * max_pending_verdicts 100)". */
static void check_memory_formula(const smtpe_server_config *cfg, size_t memsize)
{
    static size_t s_default;
    if (!s_default) {
        smtpe_server_config d;
        smtpe_server_config_init(&d);
        size_t m = smtpe_server_memory_size(&d);
        FUZZ_CHECK(m > formula_without_s(&d), "memory_size of the defaults below the formula");
        s_default = m - formula_without_s(&d);
        FUZZ_CHECK(s_default % sizeof(max_align_t) == 0,
                   "memory formula: S is not rounded to max_align_t");
        if (sizeof(void *) == 8) {
            FUZZ_CHECK(m == 6214, "memory_size of the defaults is not smtpe.h's 6214 octets");
            d.lmtp = 1;
            FUZZ_CHECK(smtpe_server_memory_size(&d) == 57414,
                       "memory_size of the defaults with lmtp is not smtpe.h's 57414 octets");
            d.lmtp = 0;
            d.max_pending_verdicts = 100;
            FUZZ_CHECK(smtpe_server_memory_size(&d) == 111552,
                       "memory_size with 100 pending verdicts is not smtpe.h's 111552 octets");
        }
    }
    if (memsize != s_default + formula_without_s(cfg)) {
        fprintf(stderr, "memory_size %zu, formula %zu + S %zu\n", memsize, formula_without_s(cfg),
                s_default);
        FUZZ_CHECK(0, "smtpe_server_memory_size is not the formula documented in smtpe.h");
    }
}

/* The creation paths and their errors; oracle (d) for the allocator-less ones. */
static void check_creation(const smtpe_server_config *cfg, size_t size)
{
    acount a;
    memset(&a, 0, sizeof a);
    a.fail = 1;
    smtpe_allocator al = {count_alloc, count_free, &a};
    smtpe_server *s = NULL;
    FUZZ_CHECK(smtpe_server_new(&s, cfg, &al, 0) == SMTPE_ERR_NOMEM,
               "smtpe_server_new did not report a failed allocation as NOMEM");
    FUZZ_CHECK(a.allocs == 1 && a.frees == 0, "a failed creation allocated more than once");
    uint8_t *mem = malloc(size);
    if (!mem)
        abort();
    FUZZ_CHECK(smtpe_server_init(&s, mem, size - 1, cfg, 0) == SMTPE_ERR_BUFFER_TOO_SMALL,
               "smtpe_server_init accepted memory one octet too small");
    free(mem);
}

/* Where two event logs part (to read a finding): the first record that differs. */
static void log_diff(const run *a, const run *b)
{
    size_t i = 0, j = 0;
    for (;;) {
        while (i < a->nrec && a->recs[i].excluded)
            i++;
        while (j < b->nrec && b->recs[j].excluded)
            j++;
        if (i == a->nrec || j == b->nrec) {
            fprintf(stderr, "event logs: %s ends first (record %zu of %zu / %zu of %zu); "
                            "else the final statistics differ\n",
                    i == a->nrec ? "split" : "whole", i, a->nrec, j, b->nrec);
            return;
        }
        const rec *x = &a->recs[i], *y = &b->recs[j];
        if (!fz_eq(x->b.p, x->b.len, y->b.p, y->b.len)) {
            fprintf(stderr, "event logs differ at split record %zu (event %d at %llu, command "
                            "%llu) / whole record %zu (event %d at %llu, command %llu)\n",
                    i, (int)x->type, (unsigned long long)x->at, (unsigned long long)x->cmd, j,
                    (int)y->type, (unsigned long long)y->at, (unsigned long long)y->cmd);
            size_t k = 0;
            while (k < x->b.len && k < y->b.len && x->b.p[k] == y->b.p[k])
                k++;
            fprintf(stderr, "  from octet %zu of %zu / %zu: split", k, x->b.len, y->b.len);
            for (size_t m = k; m < x->b.len && m < k + 24; m++)
                fprintf(stderr, " %02x", x->b.p[m]);
            fprintf(stderr, "\n  whole");
            for (size_t m = k; m < y->b.len && m < k + 24; m++)
                fprintf(stderr, " %02x", y->b.p[m]);
            fprintf(stderr, "\n");
            return;
        }
        i++;
        j++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t h[HDR];
    memset(h, 0, sizeof h);
    memcpy(h, data, size < HDR ? size : HDR);
    size_t body = size > HDR ? size - HDR : 0;
    size_t dlen = (size_t)h[8] | (size_t)h[9] << 8;
    if (dlen > body)
        dlen = body;

    texts_init();
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    fcase c;
    memset(&c, 0, sizeof c);
    make_config(&c, h);
    c.client = data + HDR;
    c.client_len = body - dlen;
    c.pv.p = data + HDR + c.client_len;
    c.pv.n = dlen;
    /* splitmix64 of the seed, so that nearby seeds give unrelated decisions */
    uint64_t x = 0x9E3779B97F4A7C15ull * (1 + ((uint64_t)h[10] | (uint64_t)h[11] << 8 |
                                               (uint64_t)h[12] << 16 | (uint64_t)h[13] << 24));
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    c.pv.x = (x ^ (x >> 31)) | 1;

    size_t memsize = smtpe_server_memory_size(&c.cfg);
    if (memsize == 0) {
        smtpe_server *s = NULL;
        FUZZ_CHECK(smtpe_server_new(&s, &c.cfg, NULL, 0) == SMTPE_ERR_CONFIG,
                   "memory_size said invalid config but smtpe_server_new did not");
        return 0;
    }
    check_memory_formula(&c.cfg, memsize);
    check_creation(&c.cfg, memsize);

    /* run 1: split, smtpe_server_new with the counting allocator */
    acount a;
    memset(&a, 0, sizeof a);
    smtpe_allocator al = {count_alloc, count_free, &a};
    run r1;
    memset(&r1, 0, sizeof r1);
    r1.c = &c;
    r1.split = 1;
    r1.npend = c.cfg.max_pending_verdicts;
    r1.now = c.t0;
    FUZZ_CHECK(smtpe_server_new(&r1.s, &c.cfg, &al, c.t0) == 0, "smtpe_server_new failed");
    FUZZ_CHECK(a.allocs == 1 && a.size == memsize,
               "creation did not make exactly one allocation of smtpe_server_memory_size");
    r1.mem = a.ptr;
    r1.memsize = memsize;
    drive(&r1);
    finish(&r1);
    FUZZ_CHECK(a.allocs == 1 && a.frees == 0, "the session allocated or freed after creation");
    smtpe_server_free(r1.s);
    FUZZ_CHECK(a.frees == 1, "smtpe_server_free did not release the session's block");

    /* run 2: whole, smtpe_server_init in caller memory */
    run r2;
    memset(&r2, 0, sizeof r2);
    r2.c = &c;
    r2.split = 0;
    r2.npend = c.cfg.max_pending_verdicts;
    r2.now = c.t0;
    uint8_t *mem = malloc(memsize);
    uint8_t *whole = malloc(c.client_len ? c.client_len : 1);
    if (!mem || !whole)
        abort();
    memcpy(whole, c.client, c.client_len);
    r2.whole = whole;
    FUZZ_CHECK(smtpe_server_init(&r2.s, mem, memsize, &c.cfg, c.t0) == 0,
               "smtpe_server_init failed with memory_size octets");
    r2.mem = mem;
    r2.memsize = memsize;
    drive(&r2);
    finish(&r2);

    /* oracle (a) */
    if (!fz_eq(r1.out.p, r1.out.len, r2.out.p, r2.out.len)) {
        fprintf(stderr, "--- output, split run (%zu octets):\n%.*s\n--- output, whole run "
                        "(%zu octets):\n%.*s\n",
                r1.out.len, (int)r1.out.len, (const char *)r1.out.p, r2.out.len,
                (int)r2.out.len, (const char *)r2.out.p);
        FUZZ_CHECK(0, "split invariance: the output octets differ between split and whole");
    }
    if (!fz_eq(r1.log.p, r1.log.len, r2.log.p, r2.log.len)) {
        log_diff(&r1, &r2);
        FUZZ_CHECK(0, "split invariance: the event log differs between split and whole");
    }

    run_free(&r1);
    run_free(&r2);
    free(mem);
    free(whole);
    free(c.dec);
    free(c.keys);
    free(c.slot);
    return 0;
}
