/*
 * smtpe-send.c - the SMTP/LMTP client program on the client engine: one message (FILE or
 * standard input) to the --to recipients over one session, every recipient's outcome on
 * standard output. Its command line and output are a contract (smtpe-send --help, README).
 *
 * Shape: the whole message is read into memory and scanned first (smtpe_content_scan), so the
 * engine can refuse what it cannot send before MAIL. Then one connection (net_connect; for
 * --tls implicit the TLS handshake at once, RFC 8314) and one non-blocking poll() loop: octets
 * read go to smtpe_client_recv (a line a call, so that a reply ending the session can be
 * quoted as received), events are taken, the content is given while the engine wants
 * it (SMTPE_WANT_CONTENT), its output is written (send_buf / send_ack), its timer comes from
 * smtpe_client_expiry on the monotonic clock, and an EOF or a read or write error is
 * smtpe_client_lost. STARTTLS (RFC 3207): on SMTPE_CEV_STARTTLS the output is flushed, any
 * octet the server sent after its 220 ends the session, the handshake runs and
 * smtpe_client_tls_started follows; from then on every octet goes through TLS.
 *
 * --messages N submits the same transaction again after each SMTPE_CEV_TRANSACTION_DONE. A
 * transaction's outcomes may come in any order (LMTP, local refusals): they are kept and
 * printed in recipient order at its TRANSACTION_DONE. Transactions the session never reached
 * (it ended first) are printed too, each recipient temporary with code 000, so that the
 * output always has one line per recipient per transaction.
 *
 * Exit status (sysexits.h values): 0 every line delivered; 64 usage error (a bad or missing
 * option, a CR, LF or NUL in an argument, a password file or the environment's password, an
 * unreadable FILE, an address the engine refuses); 65 every recipient of every transaction
 * refused locally before MAIL (ev.outcome.before_mail: content the server cannot take, e.g.
 * a bare LF under --line-ending refuse, or 8-bit content it does not offer 8BITMIME for);
 * otherwise 75 if any line is temporary or unknown, 69 if any is permanent (the lines refused
 * locally count as permanent then), 0 if all were delivered.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <sys/socket.h>

#include "smtpe.h"
#include "net.h"
#include "tls.h"

#define EXIT_USAGE 64       /* EX_USAGE */
#define EXIT_LOCAL 65       /* EX_DATAERR: refused locally before MAIL */
#define EXIT_PERMANENT 69   /* EX_UNAVAILABLE */
#define EXIT_TEMPORARY 75   /* EX_TEMPFAIL */

#define DEFAULT_SERVER "127.0.0.1:25"
#define DEFAULT_WAIT_MS 300000u   /* connect and TLS handshake: RFC 5321's 5 minutes */
#define CLOSE_LINGER_MS 10000u    /* after the session is over: to send what is left */
#define IN_CAP 16384              /* octets read from the server at a time */
#define SECRET_MAX 65536          /* longest password or token file */
#define MAX_MESSAGES 1000000ul
#define MAX_RECIPIENTS 100000u    /* the engine's range */
#define TEXT_MAX 1024             /* reply text kept per recipient (longer is cut) */

#define BODY_AUTO (-1)

static const char usage_text[] =
    "usage: smtpe-send [OPTIONS] --from ADDRESS --to ADDRESS [--to ADDRESS]... [FILE]\n"
    "Sends one message from FILE (or standard input, also for '-') over one SMTP or LMTP\n"
    "session and reports every recipient.\n"
    "\n"
    "  --server HOST:PORT        server: HOST:PORT, [IPV6]:PORT or unix:PATH\n"
    "                            (default " DEFAULT_SERVER ")\n"
    "  --lmtp                    speak LMTP (RFC 2033)\n"
    "  --helo NAME               EHLO/LHLO name (default: this host's name)\n"
    "  --from ADDRESS            reverse-path; \"\" or \"<>\" is the null reverse-path\n"
    "  --to ADDRESS              forward-path, repeatable, in order; ADDRESS may be\n"
    "                            written in angle brackets: <user@example.com>\n"
    "  --tls MODE                none | opportunistic (default: STARTTLS when offered) |\n"
    "                            required (STARTTLS or nothing is sent) | implicit (TLS\n"
    "                            from connect, RFC 8314); the certificate is checked in\n"
    "                            every mode unless --tls-insecure\n"
    "  --tls-ca FILE             trust the PEM CA certificates of FILE (default: the\n"
    "                            system's CA store)\n"
    "  --tls-insecure            do not check the server's certificate\n"
    "  --tls-servername NAME     name to send (SNI) and check (default: HOST of --server;\n"
    "                            needed for a unix: socket)\n"
    "  --auth-user USER          AUTH as USER; the password from $SMTPE_PASSWORD or\n"
    "                            --auth-password-file (which wins)\n"
    "  --auth-password-file FILE the password: FILE's content less one final newline\n"
    "  --auth-token-file FILE    the OAuth 2.0 token (XOAUTH2, OAUTHBEARER), likewise\n"
    "  --auth-mechanism NAME     PLAIN | LOGIN | XOAUTH2 | OAUTHBEARER (default: the\n"
    "                            best the server offers that the credentials allow)\n"
    "  --auth-plaintext-ok       allow AUTH without TLS (otherwise the session ends\n"
    "                            before any credential octet)\n"
    "  --chunking auto|never     BDAT when offered (default auto)\n"
    "  --body auto|7bit|8bitmime|binarymime\n"
    "                            BODY= (default auto: 7bit unless the message has 8-bit\n"
    "                            octets, then 8bitmime)\n"
    "  --smtputf8                SMTPUTF8 (automatic when an address is not ASCII)\n"
    "  --ret full|hdrs           DSN RET=\n"
    "  --envid ID                DSN ENVID=\n"
    "  --notify LIST             DSN NOTIFY= for every recipient: NEVER, or a comma list\n"
    "                            of SUCCESS, FAILURE, DELAY\n"
    "  --orcpt TYPE;ADDRESS      DSN ORCPT= for every recipient (e.g. rfc822;a@b.example)\n"
    "  --requiretls              REQUIRETLS (RFC 8689)\n"
    "  --mt-priority N           MT-PRIORITY=N, -9..9 (RFC 6710)\n"
    "  --deliver-by SECONDS;R|N  BY= (RFC 2852)\n"
    "  --line-ending normalise|refuse\n"
    "                            bare CR / LF in the message: sent as CRLF (default) or\n"
    "                            the message refused before MAIL\n"
    "  --messages N              the same message in N transactions over the one\n"
    "                            connection (default 1)\n"
    "  --timeout-ms N            one cap in ms on every wait: connect, TLS handshake,\n"
    "                            greeting, each reply, the content (default: RFC 5321's)\n"
    "  --help                    show this text\n"
    "\n"
    "Standard output, one line per recipient per transaction, in recipient order:\n"
    "  N RECIPIENT OUTCOME CODE ENHANCED TEXT\n"
    "N counts transactions from 1; OUTCOME is delivered, permanent, temporary or unknown\n"
    "(the end of the content was sent but no reply came: it may have been delivered);\n"
    "CODE is the reply code, 000 when decided locally or the connection was lost;\n"
    "ENHANCED the enhanced status code or -; TEXT the reply's last line (control\n"
    "characters shown as ?). Diagnostics go to standard error.\n"
    "\n"
    "Exit status: 0 all delivered; 75 any temporary or unknown; 69 otherwise (some\n"
    "permanent, none temporary); 64 usage error (a CR, LF or NUL in an argument too);\n"
    "65 every recipient refused locally before MAIL.\n";

/* The command line, parsed. Strings point into argv, the environment or the heap. */
struct send_options {
    const char *server;
    struct net_target target;
    int lmtp;
    const char *helo;          /* NULL: this host's name */
    /* The paths as the engine takes them (path_argument: without one enclosing pair of angle
     * brackets; then heap copies) and as given (argv, for the messages). */
    const char *from;          /* NULL until --from */
    const char *from_arg;
    const char **to, **to_arg;
    size_t to_count;
    smtpe_tls_policy tls;
    const char *tls_ca;
    int tls_insecure;
    const char *tls_servername;
    const char *auth_user;
    const char *auth_mechanism; /* upper case, or NULL */
    const char *auth_password_file;
    const char *auth_token_file;
    char *auth_password;       /* the file's (heap) or $SMTPE_PASSWORD's */
    char *auth_token;          /* heap */
    int auth_plaintext_ok;
    int chunking;
    int body;                  /* BODY_AUTO or smtpe_body_type */
    int smtputf8;
    smtpe_dsn_ret ret;
    const char *envid;
    unsigned notify;
    const char *orcpt;
    int requiretls;
    int has_mt_priority;
    int mt_priority;
    int64_t by_time;
    char by_mode;              /* 0, 'R' or 'N' */
    smtpe_line_ending_policy line_ending;
    unsigned long messages;
    uint64_t timeout_ms;       /* 0: the defaults */
    const char *file;          /* NULL or "-": standard input */
};

/* One recipient's outcome in the current transaction. */
struct rcpt_result {
    int set;
    int outcome;               /* SMTPE_OUTCOME_* */
    unsigned code;
    int before_mail;
    char enhanced[16];
    char text[TEXT_MAX];
};

/* Counts over every line printed. */
struct tally {
    size_t lines, delivered, permanent, temporary, unknown, before_mail;
};

/* One session: the connection, the engine and what it has reported. */
struct send_run {
    const struct send_options *o;
    smtpe_client_config cfg;
    smtpe_client_txn txn;
    const char *servername;    /* the name the certificate is checked against */
    struct tls_client *tls_ctx; /* NULL without TLS */
    smtpe_client *c;
    int fd;
    struct tls_conn *tls;      /* non-NULL once a handshake started */
    uint8_t in[IN_CAP];        /* read and not yet consumed by the engine: in[in_off..+in_len) */
    size_t in_off, in_len;
    /* The server's lines as fed, for the diagnostic of a reply that ends the session (its
     * event gives the code and the text after the enhanced code): the line being fed
     * (line[0..line_len), longer ones cut) and the last complete one, CRLF off. */
    uint8_t line[TEXT_MAX];
    size_t line_len;
    char last_line[TEXT_MAX];
    short read_on, write_on;   /* what poll() waits for to read / to write (TLS may swap) */
    int eof;                   /* nothing more can be read (EOF, error, failed handshake) */
    int write_dead;            /* nothing more may be written */
    int lost_called, closed;
    int starttls_pending;      /* SMTPE_CEV_STARTTLS taken, handshake not yet run */
    int content_active, content_fresh;
    size_t content_pos;
    uint64_t closed_at;
    unsigned long txn_no;      /* transactions submitted (the current one's N) */
    unsigned long txn_printed; /* transactions whose lines are out */
    struct rcpt_result *res;   /* to_count entries: the current transaction's */
    struct tally tally;
    char io_error[640];        /* why the connection was lost, for the diagnostic */
    char end_text[640];        /* TEXT of lines the session never decided */
};

static uint64_t now_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "smtpe-send: <message>" on stderr. */
static void diag(const char *fmt, ...)
{
    va_list ap;

    fputs("smtpe-send: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---------------------------------------------------------------------------------------------
 * The command line
 * ------------------------------------------------------------------------------------------- */

enum {
    OPT_SERVER = 256,
    OPT_LMTP,
    OPT_HELO,
    OPT_FROM,
    OPT_TO,
    OPT_TLS,
    OPT_TLS_CA,
    OPT_TLS_INSECURE,
    OPT_TLS_SERVERNAME,
    OPT_AUTH_USER,
    OPT_AUTH_PASSWORD_FILE,
    OPT_AUTH_TOKEN_FILE,
    OPT_AUTH_MECHANISM,
    OPT_AUTH_PLAINTEXT_OK,
    OPT_CHUNKING,
    OPT_BODY,
    OPT_SMTPUTF8,
    OPT_RET,
    OPT_ENVID,
    OPT_NOTIFY,
    OPT_ORCPT,
    OPT_REQUIRETLS,
    OPT_MT_PRIORITY,
    OPT_DELIVER_BY,
    OPT_LINE_ENDING,
    OPT_MESSAGES,
    OPT_TIMEOUT,
    OPT_HELP
};

static const struct option long_options[] = {
    {"server", required_argument, NULL, OPT_SERVER},
    {"lmtp", no_argument, NULL, OPT_LMTP},
    {"helo", required_argument, NULL, OPT_HELO},
    {"from", required_argument, NULL, OPT_FROM},
    {"to", required_argument, NULL, OPT_TO},
    {"tls", required_argument, NULL, OPT_TLS},
    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
    {"tls-insecure", no_argument, NULL, OPT_TLS_INSECURE},
    {"tls-servername", required_argument, NULL, OPT_TLS_SERVERNAME},
    {"auth-user", required_argument, NULL, OPT_AUTH_USER},
    {"auth-password-file", required_argument, NULL, OPT_AUTH_PASSWORD_FILE},
    {"auth-token-file", required_argument, NULL, OPT_AUTH_TOKEN_FILE},
    {"auth-mechanism", required_argument, NULL, OPT_AUTH_MECHANISM},
    {"auth-plaintext-ok", no_argument, NULL, OPT_AUTH_PLAINTEXT_OK},
    {"chunking", required_argument, NULL, OPT_CHUNKING},
    {"body", required_argument, NULL, OPT_BODY},
    {"smtputf8", no_argument, NULL, OPT_SMTPUTF8},
    {"ret", required_argument, NULL, OPT_RET},
    {"envid", required_argument, NULL, OPT_ENVID},
    {"notify", required_argument, NULL, OPT_NOTIFY},
    {"orcpt", required_argument, NULL, OPT_ORCPT},
    {"requiretls", no_argument, NULL, OPT_REQUIRETLS},
    {"mt-priority", required_argument, NULL, OPT_MT_PRIORITY},
    {"deliver-by", required_argument, NULL, OPT_DELIVER_BY},
    {"line-ending", required_argument, NULL, OPT_LINE_ENDING},
    {"messages", required_argument, NULL, OPT_MESSAGES},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* A word out of a fixed list, compared without regard to case: its index, or -1. */
static int pick(const char *s, const char *const *words, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(s, words[i]) == 0)
            return (int)i;
    return -1;
}

/* A decimal integer in [min, max], the whole string. Returns 0, or -1. */
static int parse_int(const char *s, long long min, long long max, long long *out)
{
    char *end;
    long long v;

    if (*s == '\0' || isspace((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* NOTIFY=: "NEVER" or a comma list of SUCCESS, FAILURE, DELAY (RFC 3461 §4.1). */
static int parse_notify(const char *s, unsigned *out)
{
    static const char *const words[] = {"NEVER", "SUCCESS", "FAILURE", "DELAY"};
    static const unsigned bits[] = {SMTPE_NOTIFY_NEVER, SMTPE_NOTIFY_SUCCESS,
                                    SMTPE_NOTIFY_FAILURE, SMTPE_NOTIFY_DELAY};
    char word[16];
    unsigned v = 0;

    for (;;) {
        size_t n = strcspn(s, ",");
        int i;

        if (n == 0 || n >= sizeof word)
            return -1;
        memcpy(word, s, n);
        word[n] = '\0';
        i = pick(word, words, 4);
        if (i < 0 || (v & bits[i]))
            return -1;
        v |= bits[i];
        if (s[n] == '\0')
            break;
        s += n + 1;
    }
    if ((v & SMTPE_NOTIFY_NEVER) && v != SMTPE_NOTIFY_NEVER)
        return -1; /* NEVER stands alone */
    *out = v;
    return 0;
}

/* BY=: "SECONDS;R" or "SECONDS;N" (RFC 2852 §4; R needs a positive time). */
static int parse_deliver_by(const char *s, int64_t *by_time, char *by_mode)
{
    const char *semi = strchr(s, ';');
    char num[24];
    long long v;
    size_t n;

    if (semi == NULL || (n = (size_t)(semi - s)) == 0 || n >= sizeof num)
        return -1;
    memcpy(num, s, n);
    num[n] = '\0';
    if (parse_int(num, -999999999, 999999999, &v) < 0)
        return -1;
    if (strcasecmp(semi + 1, "R") == 0 && v > 0)
        *by_mode = 'R';
    else if (strcasecmp(semi + 1, "N") == 0)
        *by_mode = 'N';
    else
        return -1;
    *by_time = v;
    return 0;
}

/* Usage error: the message on stderr with a pointer to --help. Returns EXIT_USAGE. */
static int usage_error(const char *fmt, const char *arg)
{
    fputs("smtpe-send: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nTry 'smtpe-send --help'.\n", stderr);
    return EXIT_USAGE;
}

/* A --from or --to argument as the engine takes it: one enclosing pair of angle brackets,
 * the way a path is written in MAIL and RCPT (RFC 5321 §4.1.2: "<a@example.org>", and "<>"
 * for the null reverse-path), is taken off; anything else is left for the engine to judge.
 * Returns a itself, or a heap copy without the brackets, or NULL (out of memory). */
static const char *path_argument(const char *a)
{
    size_t n = strlen(a);

    if (n < 2 || a[0] != '<' || a[n - 1] != '>')
        return a;
    return strndup(a + 1, n - 2);
}

/* Frees what path_argument made of arg (nothing if it returned arg). */
static void free_path(const char *path, const char *arg)
{
    if (path != arg)
        free((char *)path);
}

/* The option c with its argument a into *o. Returns 0, or EXIT_USAGE (message printed). */
static int parse_value(struct send_options *o, int c, const char *a)
{
    static const char *const tls_words[] = {"none", "opportunistic", "required", "implicit"};
    static const char *const body_words[] = {"auto", "7bit", "8bitmime", "binarymime"};
    static const int body_values[] = {BODY_AUTO, SMTPE_BODY_7BIT, SMTPE_BODY_8BITMIME,
                                      SMTPE_BODY_BINARYMIME};
    static const char *const mech_words[] = {"PLAIN", "LOGIN", "XOAUTH2", "OAUTHBEARER"};
    static const char *const auto_never[] = {"auto", "never"};
    static const char *const ret_words[] = {"full", "hdrs"};
    static const char *const le_words[] = {"normalise", "refuse", "normalize"};
    long long v;
    int i;

    switch (c) {
    case OPT_TLS:
        if ((i = pick(a, tls_words, 4)) < 0)
            return usage_error("bad --tls '%s' (none, opportunistic, required, implicit)", a);
        o->tls = (smtpe_tls_policy)i; /* the words are in the enum's order */
        return 0;
    case OPT_AUTH_MECHANISM:
        if ((i = pick(a, mech_words, 4)) < 0)
            return usage_error("bad --auth-mechanism '%s' (PLAIN, LOGIN, XOAUTH2, OAUTHBEARER)",
                               a);
        o->auth_mechanism = mech_words[i];
        return 0;
    case OPT_CHUNKING:
        if ((i = pick(a, auto_never, 2)) < 0)
            return usage_error("bad --chunking '%s' (auto, never)", a);
        o->chunking = i == 0;
        return 0;
    case OPT_BODY:
        if ((i = pick(a, body_words, 4)) < 0)
            return usage_error("bad --body '%s' (auto, 7bit, 8bitmime, binarymime)", a);
        o->body = body_values[i];
        return 0;
    case OPT_RET:
        if ((i = pick(a, ret_words, 2)) < 0)
            return usage_error("bad --ret '%s' (full, hdrs)", a);
        o->ret = i == 0 ? SMTPE_RET_FULL : SMTPE_RET_HDRS;
        return 0;
    case OPT_NOTIFY:
        if (parse_notify(a, &o->notify) < 0)
            return usage_error("bad --notify '%s' (NEVER, or a comma list of SUCCESS, "
                               "FAILURE, DELAY)", a);
        return 0;
    case OPT_ORCPT:
        if (strchr(a, ';') == NULL || a[0] == ';')
            return usage_error("bad --orcpt '%s' (TYPE;ADDRESS, e.g. rfc822;a@b.example)", a);
        o->orcpt = a;
        return 0;
    case OPT_MT_PRIORITY:
        if (parse_int(a, -9, 9, &v) < 0)
            return usage_error("bad --mt-priority '%s' (-9..9)", a);
        o->has_mt_priority = 1;
        o->mt_priority = (int)v;
        return 0;
    case OPT_DELIVER_BY:
        if (parse_deliver_by(a, &o->by_time, &o->by_mode) < 0)
            return usage_error("bad --deliver-by '%s' (SECONDS;R with SECONDS > 0, or "
                               "SECONDS;N)", a);
        return 0;
    case OPT_LINE_ENDING:
        if ((i = pick(a, le_words, 3)) < 0)
            return usage_error("bad --line-ending '%s' (normalise, refuse)", a);
        o->line_ending = i == 1 ? SMTPE_LINE_ENDING_REFUSE : SMTPE_LINE_ENDING_NORMALISE;
        return 0;
    case OPT_MESSAGES:
        if (parse_int(a, 1, (long long)MAX_MESSAGES, &v) < 0)
            return usage_error("bad --messages '%s' (1..1000000)", a);
        o->messages = (unsigned long)v;
        return 0;
    case OPT_TIMEOUT:
        if (parse_int(a, 1, 1000000000000LL, &v) < 0)
            return usage_error("bad --timeout-ms '%s' (a number of milliseconds, at least 1)",
                               a);
        o->timeout_ms = (uint64_t)v;
        return 0;
    default:
        return usage_error("internal: unhandled option%s", "");
    }
}

/* The options without a value to check, and the strings; others go to parse_value. */
static int parse_option(struct send_options *o, int c, const char *a)
{
    switch (c) {
    case OPT_SERVER:
        o->server = a;
        return 0;
    case OPT_LMTP:
        o->lmtp = 1;
        return 0;
    case OPT_HELO:
        o->helo = a;
        return 0;
    case OPT_FROM: /* the last one counts */
        free_path(o->from, o->from_arg);
        o->from_arg = a;
        if ((o->from = path_argument(a)) == NULL)
            return usage_error("out of memory%s", "");
        return 0;
    case OPT_TO:
        o->to_arg[o->to_count] = a;
        if ((o->to[o->to_count] = path_argument(a)) == NULL)
            return usage_error("out of memory%s", "");
        o->to_count++;
        return 0;
    case OPT_TLS_CA:
        o->tls_ca = a;
        return 0;
    case OPT_TLS_INSECURE:
        o->tls_insecure = 1;
        return 0;
    case OPT_TLS_SERVERNAME:
        o->tls_servername = a;
        return 0;
    case OPT_AUTH_USER:
        o->auth_user = a;
        return 0;
    case OPT_AUTH_PASSWORD_FILE:
        o->auth_password_file = a;
        return 0;
    case OPT_AUTH_TOKEN_FILE:
        o->auth_token_file = a;
        return 0;
    case OPT_AUTH_PLAINTEXT_OK:
        o->auth_plaintext_ok = 1;
        return 0;
    case OPT_SMTPUTF8: o->smtputf8 = 1; return 0;
    case OPT_ENVID:
        o->envid = a;
        return 0;
    case OPT_REQUIRETLS:
        o->requiretls = 1;
        return 0;
    default: return parse_value(o, c, a);
    }
}

/* A CR, LF (or, were it possible, NUL) in any argument is a usage error: nothing from the
 * command line may break a command line on the wire or this program's output. */
static int check_arguments(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strpbrk(argv[i], "\r\n") != NULL) {
            fprintf(stderr, "smtpe-send: argument %d contains a CR or LF: '", i);
            for (const char *p = argv[i]; *p; p++)
                fputc(*p == '\r' || *p == '\n' ? '?' : *p, stderr);
            fputs("'\n", stderr);
            return EXIT_USAGE;
        }
    }
    return 0;
}

#define PARSE_RUN 0
#define PARSE_HELP 1

/* Parses argv into *o (o->to, o->to_arg and the paths allocated here: free_options). Returns
 * PARSE_RUN, PARSE_HELP or EXIT_USAGE. */
static int parse_args(int argc, char **argv, struct send_options *o)
{
    char err[256];
    int c, rc;

    memset(o, 0, sizeof *o);
    o->server = DEFAULT_SERVER;
    o->tls = SMTPE_TLS_OPPORTUNISTIC;
    o->chunking = 1;
    o->body = BODY_AUTO;
    o->line_ending = SMTPE_LINE_ENDING_NORMALISE;
    o->messages = 1;
    o->to = calloc((size_t)argc, sizeof *o->to);
    o->to_arg = calloc((size_t)argc, sizeof *o->to_arg);
    if (o->to == NULL || o->to_arg == NULL)
        return usage_error("out of memory%s", "");
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        if (c == OPT_HELP)
            return PARSE_HELP;
        if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1];
            return usage_error(optopt ? "option '%s' needs a value" : "unknown option '%s'",
                               bad);
        }
        if ((rc = parse_option(o, c, optarg)) != 0)
            return rc;
    }
    if (optind < argc)
        o->file = argv[optind++];
    if (optind < argc)
        return usage_error("more than one FILE ('%s')", argv[optind]);
    if (o->from == NULL)
        return usage_error("--from is required (\"\" or \"<>\" for the null reverse-path)%s",
                           "");
    if (o->to_count == 0)
        return usage_error("at least one --to is required%s", "");
    if (o->to_count > MAX_RECIPIENTS)
        return usage_error("more than 100000 --to%s", "");
    if (net_parse_target(o->server, &o->target, err, sizeof err) < 0)
        return usage_error("--server: %s", err);
    return PARSE_RUN;
}

/* ---------------------------------------------------------------------------------------------
 * Files: the message, passwords and tokens
 * ------------------------------------------------------------------------------------------- */

/* Reads all of f into a heap buffer (*out, *len; NUL-terminated for the secrets' sake), at
 * most max octets (0: no limit). Returns 0, or -1 with errno set (EFBIG over max). */
static int read_all(FILE *f, size_t max, uint8_t **out, size_t *len)
{
    size_t cap = 65536, n = 0, got;
    uint8_t *buf = malloc(cap + 1), *bigger;

    if (buf == NULL)
        return -1;
    for (;;) {
        if (n == cap) {
            if (cap > SIZE_MAX / 2 - 1 || (bigger = realloc(buf, cap * 2 + 1)) == NULL) {
                free(buf);
                errno = ENOMEM;
                return -1;
            }
            buf = bigger;
            cap *= 2;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (max > 0 && n > max) {
            free(buf);
            errno = EFBIG;
            return -1;
        }
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        errno = EIO;
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* A password or token file: its content less one final newline ("\n" or "\r\n"), which must
 * then hold no CR, LF or NUL. Returns 0 with *out on the heap, or EXIT_USAGE. */
static int read_secret(const char *option, const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    size_t n;

    if (f == NULL || read_all(f, SECRET_MAX, &buf, &n) < 0) {
        diag("%s %s: %s", option, path, strerror(errno));
        if (f)
            fclose(f);
        return EXIT_USAGE;
    }
    fclose(f);
    if (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    if (n > 0 && buf[n - 1] == '\r')
        buf[--n] = '\0';
    if (memchr(buf, '\0', n) || memchr(buf, '\r', n) || memchr(buf, '\n', n)) {
        diag("%s %s: a CR, LF or NUL inside (only one final newline is allowed)", option, path);
        free(buf);
        return EXIT_USAGE;
    }
    *out = (char *)buf;
    return 0;
}

/* The AUTH options together: a user with a password or token that fits the mechanism.
 * Returns 0 or EXIT_USAGE. */
static int load_credentials(struct send_options *o)
{
    const char *env = getenv("SMTPE_PASSWORD");
    const char *m = o->auth_mechanism;
    int rc;

    if (o->auth_user == NULL) {
        if (m || o->auth_password_file || o->auth_token_file)
            return usage_error("--auth-mechanism, --auth-password-file and --auth-token-file "
                               "need --auth-user%s", "");
        return 0;
    }
    if (o->auth_password_file &&
        (rc = read_secret("--auth-password-file", o->auth_password_file, &o->auth_password)))
        return rc;
    if (o->auth_password == NULL && env != NULL) {
        if (strpbrk(env, "\r\n") != NULL)
            return usage_error("$SMTPE_PASSWORD contains a CR or LF%s", "");
        if ((o->auth_password = strdup(env)) == NULL)
            return usage_error("out of memory%s", "");
    }
    if (o->auth_token_file &&
        (rc = read_secret("--auth-token-file", o->auth_token_file, &o->auth_token)))
        return rc;
    if (m && (!strcmp(m, "PLAIN") || !strcmp(m, "LOGIN")) && o->auth_password == NULL)
        return usage_error("--auth-mechanism %s needs a password ($SMTPE_PASSWORD or "
                           "--auth-password-file)", m);
    if (m && (!strcmp(m, "XOAUTH2") || !strcmp(m, "OAUTHBEARER")) && o->auth_token == NULL)
        return usage_error("--auth-mechanism %s needs --auth-token-file", m);
    if (o->auth_password == NULL && o->auth_token == NULL)
        return usage_error("--auth-user needs a password ($SMTPE_PASSWORD or "
                           "--auth-password-file) or --auth-token-file%s", "");
    return 0;
}

/* The message from FILE (NULL or "-": standard input) into *msg, *len. Returns 0 or
 * EXIT_USAGE. */
static int read_message(const char *file, uint8_t **msg, size_t *len)
{
    int use_stdin = file == NULL || strcmp(file, "-") == 0;
    FILE *f = use_stdin ? stdin : fopen(file, "rb");

    if (f == NULL || read_all(f, 0, msg, len) < 0) {
        diag("%s: %s", use_stdin ? "standard input" : file, strerror(errno));
        if (f && !use_stdin)
            fclose(f);
        return EXIT_USAGE;
    }
    if (!use_stdin)
        fclose(f);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The engine's config and transaction
 * ------------------------------------------------------------------------------------------- */

/* This host's name for EHLO (gethostname), "localhost" when there is none. */
static const char *default_helo(void)
{
    static char name[256];

    if (gethostname(name, sizeof name - 1) < 0 || name[0] == '\0')
        return "localhost";
    name[sizeof name - 1] = '\0';
    return name;
}

static void build_config(const struct send_options *o, smtpe_client_config *cfg)
{
    smtpe_client_config_init(cfg);
    cfg->helo_name = o->helo ? o->helo : default_helo();
    cfg->lmtp = o->lmtp;
    cfg->tls = o->tls;
    if (o->auth_user != NULL) {
        cfg->auth_mechanism = o->auth_mechanism ? o->auth_mechanism : "";
        cfg->auth_user = o->auth_user;
        cfg->auth_password = o->auth_password;
        cfg->auth_token = o->auth_token;
    }
    cfg->auth_plaintext_ok = o->auth_plaintext_ok;
    cfg->chunking = o->chunking;
    cfg->line_ending = o->line_ending;
    if (o->to_count > cfg->max_recipients)
        cfg->max_recipients = (unsigned)o->to_count;
    if (o->timeout_ms > 0) {
        cfg->greeting_timeout_ms = o->timeout_ms;
        cfg->command_timeout_ms = o->timeout_ms;
        cfg->data_timeout_ms = o->timeout_ms;
        cfg->data_block_timeout_ms = o->timeout_ms;
        cfg->data_end_timeout_ms = o->timeout_ms;
    }
}

/* The transaction: paths, parameters and the scan of msg[0..len). rcpts has o->to_count
 * entries, filled here. */
static void build_txn(const struct send_options *o, const uint8_t *msg, size_t len,
                      smtpe_client_rcpt *rcpts, smtpe_client_txn *t)
{
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < o->to_count; i++) {
        rcpts[i].forward_path = o->to[i];
        rcpts[i].notify = o->notify;
        rcpts[i].orcpt = o->orcpt;
    }
    t->reverse_path = o->from;
    t->rcpts = rcpts;
    t->rcpt_count = o->to_count;
    smtpe_content_scan_init(&t->content);
    smtpe_content_scan(&t->content, msg, len);
    smtpe_content_scan_end(&t->content);
    t->has_content_info = 1;
    if (o->body == BODY_AUTO)
        t->body = (t->content.flags & SMTPE_CONTENT_8BIT) ? SMTPE_BODY_8BITMIME : SMTPE_BODY_7BIT;
    else
        t->body = (smtpe_body_type)o->body;
    t->smtputf8 = o->smtputf8;
    t->ret = o->ret;
    t->envid = o->envid;
    t->requiretls = o->requiretls;
    t->has_mt_priority = o->has_mt_priority;
    t->mt_priority = o->mt_priority;
    t->by_time = o->by_time;
    t->by_mode = o->by_mode;
}

/* smtpe_client_new of cfg, freed at once: the engine's checks of the config. Returns new's
 * result. */
static int try_new(const smtpe_client_config *cfg)
{
    smtpe_client *c;
    int rc = smtpe_client_new(&c, cfg, NULL, now_ms());

    if (rc == 0)
        smtpe_client_free(c);
    return rc;
}

/* smtpe_client_submit of t on a fresh session of cfg that is freed again: the engine's
 * checks of every string, before any connection. Returns submit's result (or new's). */
static int try_submit(const smtpe_client_config *cfg, const smtpe_client_txn *t)
{
    smtpe_client *c;
    int rc = smtpe_client_new(&c, cfg, NULL, now_ms());

    if (rc < 0)
        return rc;
    rc = smtpe_client_submit(c, t);
    smtpe_client_free(c);
    return rc;
}

/* The transaction was refused: finds the argument to blame by submitting its parts alone.
 * Returns EXIT_USAGE. */
static int blame_txn(const struct send_options *o, const smtpe_client_config *cfg, int rc)
{
    smtpe_client_rcpt r = {.forward_path = "postmaster"};
    smtpe_client_txn one = {.reverse_path = o->from, .rcpts = &r, .rcpt_count = 1};

    if (try_submit(cfg, &one) < 0)
        return usage_error("bad --from '%s': not a reverse-path the engine can send",
                           o->from_arg);
    one.reverse_path = "";
    for (size_t i = 0; i < o->to_count; i++) {
        r.forward_path = o->to[i];
        if (try_submit(cfg, &one) < 0)
            return usage_error("bad --to '%s': not a forward-path the engine can send",
                               o->to_arg[i]);
    }
    r.forward_path = "postmaster";
    r.notify = o->notify;
    r.orcpt = o->orcpt;
    if (try_submit(cfg, &one) < 0)
        return usage_error("bad --orcpt '%s' (or --notify) for the engine",
                           o->orcpt ? o->orcpt : "");
    r.notify = 0;
    r.orcpt = NULL;
    one.envid = o->envid;
    if (o->envid && try_submit(cfg, &one) < 0)
        return usage_error("bad --envid '%s' for the engine", o->envid);
    diag("the engine refused the transaction: %s", smtpe_strerror(rc));
    return usage_error("check --ret, --mt-priority, --deliver-by, --body, --smtputf8 and the "
                       "number of --to%s", "");
}

/* Checks the config and the transaction with the engine before connecting; a default EHLO
 * name the engine refuses (gethostname gave no domain) becomes "localhost". Returns 0 or
 * EXIT_USAGE. */
static int validate(const struct send_options *o, smtpe_client_config *cfg,
                    const smtpe_client_txn *t)
{
    smtpe_client *c;
    int rc = smtpe_client_new(&c, cfg, NULL, now_ms());

    /* The limits are the defaults, so either error means a string of ours (smtpe.h says
     * INVALID_ARGUMENT for a malformed helo_name; today's client.c says CONFIG). */
    if ((rc == SMTPE_ERR_INVALID_ARGUMENT || rc == SMTPE_ERR_CONFIG) && o->helo == NULL) {
        cfg->helo_name = "localhost";
        rc = smtpe_client_new(&c, cfg, NULL, now_ms());
    }
    if (rc == SMTPE_ERR_INVALID_ARGUMENT || rc == SMTPE_ERR_CONFIG) {
        smtpe_client_config plain = *cfg;

        plain.auth_mechanism = plain.auth_user = plain.auth_password = plain.auth_token = NULL;
        if (try_new(&plain) < 0)
            return usage_error("bad --helo '%s': not a domain or address-literal",
                               cfg->helo_name);
        return usage_error("bad --auth-user, password or token: the engine refuses it "
                           "(a control character, or too long)%s", "");
    }
    if (rc < 0) {
        diag("cannot start a session: %s", smtpe_strerror(rc));
        return EXIT_TEMPORARY;
    }
    rc = smtpe_client_submit(c, t);
    smtpe_client_free(c);
    if (rc < 0)
        return blame_txn(o, cfg, rc);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Outcomes and the output lines
 * ------------------------------------------------------------------------------------------- */

/* span into out[0..cap) as one line: control characters (and DEL) become '?'. */
static void copy_line(char *out, size_t cap, smtpe_span span)
{
    size_t n = span.len < cap - 1 ? span.len : cap - 1;

    for (size_t i = 0; i < n; i++) {
        uint8_t b = span.ptr[i];
        out[i] = b < 0x20 || b == 0x7f ? '?' : (char)b;
    }
    out[n] = '\0';
}

static void record_outcome(struct send_run *r, const smtpe_client_outcome *oc)
{
    struct rcpt_result *res;

    if (oc->index >= r->o->to_count || r->res[oc->index].set) {
        diag("internal: an outcome for recipient %zu %s", oc->index,
             oc->index >= r->o->to_count ? "that does not exist" : "twice; the first counts");
        return;
    }
    res = &r->res[oc->index];
    res->set = 1;
    res->outcome = oc->outcome;
    res->code = oc->code;
    res->before_mail = oc->before_mail;
    copy_line(res->enhanced, sizeof res->enhanced, oc->enhanced);
    copy_line(res->text, sizeof res->text, oc->text);
    if (oc->local && r->lost_called && r->io_error[0] != '\0') { /* say how it was lost */
        size_t n = strlen(res->text);
        smtpe_span why = {(const uint8_t *)r->io_error, strlen(r->io_error)};

        if (n + 2 < sizeof res->text) {
            memcpy(res->text + n, n ? ": " : "", n ? 2 : 0);
            n += n ? 2 : 0;
            copy_line(res->text + n, sizeof res->text - n, why);
        }
    }
}

static const char *outcome_word(int outcome)
{
    switch (outcome) {
    case SMTPE_OUTCOME_DELIVERED:
        return "delivered";
    case SMTPE_OUTCOME_PERMANENT:
        return "permanent";
    case SMTPE_OUTCOME_UNKNOWN:
        return "unknown";
    default:
        return "temporary";
    }
}

/* Prints a forward-path as the RECIPIENT field: one word, so that the line splits on spaces
 * whatever the address (a quoted local part may hold spaces: '"x delivered 250"@example.com'
 * must not read as an outcome); SP, "\\" and octets outside 0x21..0x7E but UTF-8's (above
 * 127) are written \xHH. */
static void print_recipient(const char *a)
{
    for (const unsigned char *p = (const unsigned char *)a; *p; p++) {
        if (*p == ' ' || *p == '\\' || *p < 0x21 || *p == 0x7F)
            printf("\\x%02X", *p);
        else
            putchar(*p);
    }
}

/* Prints transaction n's lines, in recipient order, and counts them. The current transaction
 * (n == r->txn_no) has its recorded outcomes; a recipient without one, and every recipient of a
 * transaction never submitted, is temporary 000 with r->end_text. */
static void print_txn(struct send_run *r, unsigned long n)
{
    static const struct rcpt_result none = {.outcome = SMTPE_OUTCOME_TEMPORARY};

    for (size_t i = 0; i < r->o->to_count; i++) {
        const struct rcpt_result *res = n == r->txn_no && r->res[i].set ? &r->res[i] : &none;
        const char *text = res == &none ? r->end_text : res->text;

        printf("%lu ", n);
        print_recipient(r->o->to[i]);
        printf(" %s %03u %s %s\n", outcome_word(res->outcome), res->code % 1000u,
               res->enhanced[0] ? res->enhanced : "-", text);
        r->tally.lines++;
        r->tally.delivered += res->outcome == SMTPE_OUTCOME_DELIVERED;
        r->tally.permanent += res->outcome == SMTPE_OUTCOME_PERMANENT;
        r->tally.temporary += res->outcome == SMTPE_OUTCOME_TEMPORARY;
        r->tally.unknown += res->outcome == SMTPE_OUTCOME_UNKNOWN;
        r->tally.before_mail += res->before_mail;
    }
    fflush(stdout);
    if (n == r->txn_no)
        memset(r->res, 0, r->o->to_count * sizeof *r->res);
    r->txn_printed = n;
}

/* The exit status from every line printed (see the top of this file). */
static int exit_status(const struct tally *t)
{
    if (t->lines > 0 && t->before_mail == t->lines)
        return EXIT_LOCAL;
    if (t->temporary > 0 || t->unknown > 0)
        return EXIT_TEMPORARY;
    if (t->permanent > 0)
        return EXIT_PERMANENT;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The connection: plain or TLS, non-blocking
 * ------------------------------------------------------------------------------------------- */

/* The connection is gone or unusable: nothing more is read or written; the engine hears of it
 * (smtpe_client_lost) once the octets already read are fed. why goes into the diagnostic. */
static void lose(struct send_run *r, const char *why)
{
    if (r->io_error[0] == '\0')
        snprintf(r->io_error, sizeof r->io_error, "%s", why);
    r->eof = 1;
    r->write_dead = 1;
}

/* One read into r->in (which is empty): sets in_len, or eof, or what poll() waits for. */
static void link_read(struct send_run *r)
{
    ssize_t n;

    if (r->tls != NULL) {
        n = tls_read(r->tls, r->in, sizeof r->in);
        if (n == TLS_WANT_READ || n == TLS_WANT_WRITE) {
            r->read_on = n == TLS_WANT_READ ? POLLIN : POLLOUT;
            return;
        }
        if (n == TLS_CLOSED) { /* the server ended its side: nothing more goes either */
            r->eof = r->write_dead = 1;
            return;
        }
        if (n < 0) {
            char why[TLS_ERROR_MAX + 16];
            snprintf(why, sizeof why, "TLS: %s", tls_conn_error(r->tls));
            lose(r, why);
            return;
        }
    } else {
        do
            n = recv(r->fd, r->in, sizeof r->in, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            r->read_on = POLLIN;
            return;
        }
        if (n <= 0) {
            if (n < 0)
                lose(r, strerror(errno));
            /* EOF: the server closed its side (it may still read): nothing more is written,
             * so an end of data the engine reports temporary (smtpe_client_lost) never goes */
            r->eof = r->write_dead = 1;
            return;
        }
    }
    r->read_on = POLLIN;
    r->in_off = 0;
    r->in_len = (size_t)n;
}

/* Writes up to len octets. Returns the count (> 0), 0 when the socket takes none now (what
 * poll() waits for is set), or -1 after lose(). */
static ssize_t link_write(struct send_run *r, const uint8_t *p, size_t len)
{
    ssize_t w;

    if (r->tls != NULL) {
        w = tls_write(r->tls, p, len);
        if (w == TLS_WANT_READ || w == TLS_WANT_WRITE) {
            r->write_on = w == TLS_WANT_READ ? POLLIN : POLLOUT;
            return 0;
        }
        if (w < 0) {
            char why[TLS_ERROR_MAX + 16];
            snprintf(why, sizeof why, "TLS: %s", tls_conn_error(r->tls));
            lose(r, why);
            return -1;
        }
    } else {
        do
            w = send(r->fd, p, len, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            r->write_on = POLLOUT;
            return 0;
        }
        if (w < 0) {
            lose(r, strerror(errno));
            return -1;
        }
    }
    r->write_on = POLLOUT;
    return w;
}

/* Sends what the engine queued as far as the socket takes it. Returns 1 if any octet went. */
static int flush_output(struct send_run *r)
{
    int sent = 0;

    while (!r->write_dead) {
        size_t len;
        const uint8_t *p = smtpe_client_send_buf(r->c, &len);
        ssize_t w;

        if (p == NULL || len == 0)
            break;
        w = link_write(r, p, len);
        if (w <= 0)
            break;
        (void)smtpe_client_send_ack(r->c, (size_t)w);
        sent = 1;
    }
    return sent;
}

static int output_pending(struct send_run *r)
{
    size_t len = 0;

    (void)smtpe_client_send_buf(r->c, &len);
    return len > 0;
}

/* Runs the client side of a TLS handshake on r->fd to the end or wait_ms (0: no limit).
 * Returns 0, or -1 with a message in err. */
static int run_handshake(struct send_run *r, uint64_t wait_ms, char *err, size_t errlen)
{
    uint64_t deadline = wait_ms ? now_ms() + wait_ms : UINT64_MAX;
    struct pollfd pfd = {.fd = r->fd};
    int rc;

    r->tls = tls_client_conn_new(r->tls_ctx, r->fd, r->servername, err, errlen);
    if (r->tls == NULL)
        return -1;
    while ((rc = tls_handshake(r->tls)) != 0) {
        uint64_t now = now_ms();

        if (rc == TLS_FAILED) {
            snprintf(err, errlen, "%s", tls_conn_error(r->tls));
            return -1;
        }
        if (now >= deadline) {
            snprintf(err, errlen, "timed out");
            return -1;
        }
        pfd.events = rc == TLS_WANT_READ ? POLLIN : POLLOUT;
        if (poll(&pfd, 1, deadline == UINT64_MAX ? -1
                          : deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now)) < 0 &&
            errno != EINTR) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The session
 * ------------------------------------------------------------------------------------------- */

/* The engine returned an error it should not have: said, and the session is dropped. */
static void fail(struct send_run *r, const char *what, long long rc)
{
    diag("internal: %s: %s", what, smtpe_strerror((int)rc));
    lose(r, "internal error");
}

/* Submits the next transaction (the same one again); QUIT is asked for with the last. */
static void submit_next(struct send_run *r)
{
    int rc = smtpe_client_submit(r->c, &r->txn);

    if (rc < 0) {
        diag("transaction %lu not submitted: %s", r->txn_no + 1, smtpe_strerror(rc));
        (void)smtpe_client_quit(r->c);
        return;
    }
    r->txn_no++;
    if (r->txn_no == r->o->messages)
        (void)smtpe_client_quit(r->c);
}

static const char *close_reason(int reason)
{
    switch (reason) {
    case SMTPE_CLOSE_QUIT:
        return "QUIT";
    case SMTPE_CLOSE_SERVER_421:
        return "the server closed the session";
    case SMTPE_CLOSE_PROTOCOL_ERROR:
        return "protocol error";
    case SMTPE_CLOSE_LOST:
        return "connection lost";
    case SMTPE_CLOSE_TIMEOUT:
        return "timed out";
    case SMTPE_CLOSE_TLS_REQUIRED:
        return "TLS required but not available";
    case SMTPE_CLOSE_AUTH_FAILED:
        return "authentication failed";
    case SMTPE_CLOSE_ABORTED:
        return "aborted";
    case SMTPE_CLOSE_REFUSED:
        return "the server refused the session";
    default:
        return "ended";
    }
}

/* Whether line is a reply line with code: "421", "421 ...", "421-..." (RFC 5321 §4.2). */
static int reply_line_is(const char *line, unsigned code)
{
    char digits[4];

    snprintf(digits, sizeof digits, "%03u", code % 1000u);
    return strncmp(line, digits, 3) == 0 && (line[3] == '\0' || line[3] == ' ' || line[3] == '-');
}

/* SMTPE_CEV_CLOSED: the diagnostic (none after a clean QUIT), and the text of the lines the
 * session will never decide. */
static void on_closed(struct send_run *r, const smtpe_client_closed *cl)
{
    const char *why = close_reason(cl->reason);
    char text[TEXT_MAX];

    r->closed = 1;
    r->closed_at = now_ms();
    copy_line(text, sizeof text, cl->text);
    snprintf(r->end_text, sizeof r->end_text, "not attempted: the session ended (%s)", why);
    if (cl->reason == SMTPE_CLOSE_QUIT)
        return;
    if (cl->reason == SMTPE_CLOSE_LOST)
        diag("session ended: connection lost: %s",
             r->io_error[0] ? r->io_error : "the server closed the connection");
    else if (cl->code != 0 && reply_line_is(r->last_line, cl->code))
        diag("session ended: %s: %s", why, r->last_line); /* code, enhanced code, text */
    else if (cl->code != 0)
        diag("session ended: %s: %03u %s", why, cl->code % 1000u, text);
    else if (text[0] != '\0')
        diag("session ended: %s: %s", why, text);
    else
        diag("session ended: %s", why);
}

static void on_event(struct send_run *r, const smtpe_client_event *ev)
{
    switch (ev->type) {
    case SMTPE_CEV_STARTTLS:
        r->starttls_pending = 1;
        break;
    case SMTPE_CEV_AUTH_STEP: /* only for mechanisms the host runs, which we never name */
        if (smtpe_client_auth_response(r->c, NULL, 0) < 0)
            fail(r, "smtpe_client_auth_response", SMTPE_ERR_STATE);
        break;
    case SMTPE_CEV_CONTENT:
        r->content_active = 1;
        r->content_fresh = 1;
        r->content_pos = 0;
        break;
    case SMTPE_CEV_OUTCOME:
        record_outcome(r, &ev->outcome);
        break;
    case SMTPE_CEV_TRANSACTION_DONE:
        print_txn(r, r->txn_no);
        r->content_active = 0;
        if (r->txn_no < r->o->messages && ev->done.reusable)
            submit_next(r);
        else if (r->txn_no < r->o->messages)
            (void)smtpe_client_quit(r->c); /* ending anyway; the rest are not attempted */
        break;
    case SMTPE_CEV_CLOSED:
        on_closed(r, &ev->closed);
        break;
    default: /* READY and later additions: nothing to do */
        break;
    }
}

/* Gives the engine as much of the content as it takes now (last = 1: the message is all in
 * memory). Returns 1 on progress. */
static int give_content(struct send_run *r, const uint8_t *msg, size_t len)
{
    size_t left = len - r->content_pos;
    smtpe_ssize n = smtpe_client_content(r->c, msg + r->content_pos, left, 1);

    r->content_fresh = 0;
    if (n < 0) {
        fail(r, "smtpe_client_content", n);
        r->content_active = 0;
        return 1;
    }
    r->content_pos += (size_t)n;
    if ((size_t)n == left) { /* all given, last with it */
        r->content_active = 0;
        return 1;
    }
    return n > 0;
}

/* Notes the octets p[0..n) the engine consumed: r->last_line becomes each line as it ends. */
static void note_lines(struct send_run *r, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            smtpe_span l = {r->line, r->line_len};

            if (l.len > 0 && r->line[l.len - 1] == '\r')
                l.len--;
            copy_line(r->last_line, sizeof r->last_line, l);
            r->line_len = 0;
        } else if (r->line_len < sizeof r->line) {
            r->line[r->line_len++] = p[i];
        }
    }
}

/* Feeds what was read, at most one line a call: a reply that ends the session is then the
 * last line fed when its SMTPE_CEV_CLOSED is taken (the engine drops what follows it in the
 * same call), and on_closed shows it as received. Returns 1 on progress. */
static int feed(struct send_run *r)
{
    const uint8_t *p = r->in + r->in_off;
    const uint8_t *lf = memchr(p, '\n', r->in_len);
    size_t len = lf != NULL ? (size_t)(lf - p) + 1 : r->in_len;
    smtpe_ssize n = smtpe_client_recv(r->c, p, len, now_ms());

    if (n < 0) {
        fail(r, "smtpe_client_recv", n);
        r->in_len = 0;
        return 1;
    }
    note_lines(r, p, (size_t)n);
    r->in_off += (size_t)n;
    r->in_len -= (size_t)n;
    return n > 0;
}

/* Everything that can be done without waiting: events taken, input fed, content given,
 * output sent; once all that was read is fed after an EOF, smtpe_client_lost. */
static void step(struct send_run *r, const uint8_t *msg, size_t len)
{
    smtpe_client_event ev;
    int progress;

    do {
        int fed = 0;
        progress = 0;
        while (smtpe_client_next_event(r->c, &ev) == 1) {
            on_event(r, &ev);
            progress = 1;
        }
        if (r->in_len > 0 && !r->closed)
            progress |= fed = feed(r);
        /* (not once the engine has ended the session: its CLOSED may wait, untaken, behind
         * input fed after the CONTENT event) */
        if (r->content_active && !r->closed && !(smtpe_client_want(r->c) & SMTPE_WANT_CLOSE) &&
            (r->content_fresh || (smtpe_client_want(r->c) & SMTPE_WANT_CONTENT)))
            progress |= give_content(r, msg, len);
        /* output goes only once everything already read is fed: a reply that arrived before
         * a command was written must reach the engine before that command does (it is then
         * unsolicited, never the reply to a command queued after it came) */
        if (r->in_len == 0 || r->closed || !fed)
            progress |= flush_output(r);
        if (!progress && r->eof && !r->lost_called && !r->closed) {
            r->lost_called = 1;
            if (smtpe_client_lost(r->c) < 0)
                r->closed = 1; /* already over */
            progress = 1;
        }
    } while (progress);
}

/* SMTPE_CEV_STARTTLS with the output sent: the handshake, then smtpe_client_tls_started. An
 * octet already read after the 220 would be plaintext injected before TLS (RFC 3207 §4.2): it
 * ends the session (the engine has not taken it, or it would have said so). */
static void start_tls(struct send_run *r)
{
    uint64_t wait = r->o->timeout_ms ? r->o->timeout_ms : DEFAULT_WAIT_MS;
    char err[TLS_ERROR_MAX + 64], why[sizeof err + 320];
    int rc;

    r->starttls_pending = 0;
    if (r->in_len > 0) {
        lose(r, "the server sent octets after its STARTTLS 220 (RFC 3207 4.2)");
        r->in_len = 0;
        return;
    }
    if (run_handshake(r, wait, err, sizeof err) < 0) {
        snprintf(why, sizeof why, "TLS handshake with %s failed: %s%s",
                 r->servername ? r->servername : r->o->server, err,
                 r->servername ? "" : " (give --tls-servername, or --tls-insecure)");
        lose(r, why);
        return;
    }
    r->read_on = POLLIN;
    r->write_on = POLLOUT;
    if ((rc = smtpe_client_tls_started(r->c, now_ms())) < 0)
        fail(r, "smtpe_client_tls_started", rc);
}

/* How long poll() may wait: until the engine's timer or, once the session is over, the end
 * of the linger for the last output. *deadline gets the instant (UINT64_MAX: none). */
static int poll_wait(struct send_run *r, uint64_t now, uint64_t *deadline)
{
    *deadline = r->closed ? r->closed_at + CLOSE_LINGER_MS : smtpe_client_expiry(r->c, now);
    if (*deadline == UINT64_MAX)
        return -1;
    if (*deadline <= now)
        return 0;
    return *deadline - now > INT_MAX ? INT_MAX : (int)(*deadline - now);
}

/* The I/O loop, until the session is over and its output sent (or cannot be). */
static void run_loop(struct send_run *r, const uint8_t *msg, size_t len)
{
    for (;;) {
        struct pollfd pfd = {.fd = r->fd};
        uint64_t now, deadline;
        int reading, wait, rc;

        step(r, msg, len);
        if (r->closed && (r->write_dead || !output_pending(r)))
            return;
        if (r->starttls_pending && !r->closed && !output_pending(r)) {
            start_tls(r);
            continue;
        }
        reading = !r->closed && !r->eof && !r->starttls_pending && r->in_len == 0;
        if (reading && r->tls != NULL && tls_pending(r->tls)) {
            link_read(r);
            continue;
        }
        if (reading)
            pfd.events |= r->read_on;
        if (!r->write_dead && output_pending(r))
            pfd.events |= r->write_on;
        now = now_ms();
        wait = poll_wait(r, now, &deadline);
        if (pfd.events == 0 && wait < 0) { /* nothing can happen any more */
            if (r->lost_called || r->closed)
                return;
            lose(r, "internal: the engine waits for nothing");
            continue;
        }
        rc = poll(&pfd, 1, wait);
        if (rc < 0 && errno != EINTR) {
            lose(r, strerror(errno));
            continue;
        }
        now = now_ms();
        if (deadline != UINT64_MAX && now >= deadline) {
            if (r->closed)
                return; /* the linger is over */
            (void)smtpe_client_handle_expiry(r->c, now);
        }
        if (rc > 0 && reading && (pfd.revents & (r->read_on | POLLHUP | POLLERR)))
            link_read(r);
    }
}

/* Connects (and for --tls implicit runs the handshake), starts the engine's session, submits
 * the first transaction and runs the loop. A failure before the session leaves every line to
 * be printed as temporary with the reason (r->end_text). */
static void run(struct send_run *r, const uint8_t *msg, size_t len)
{
    const struct send_options *o = r->o;
    uint64_t wait = o->timeout_ms ? o->timeout_ms : DEFAULT_WAIT_MS;
    char err[TLS_ERROR_MAX + 320];
    int rc;

    r->fd = net_connect(&o->target, wait, err, sizeof err);
    if (r->fd < 0) {
        diag("%s", err);
        snprintf(r->end_text, sizeof r->end_text, "%s", err);
        return;
    }
    if (o->tls == SMTPE_TLS_IMPLICIT && run_handshake(r, wait, err, sizeof err) < 0) {
        const char *hint = r->servername ? "" : " (give --tls-servername, or --tls-insecure)";

        diag("TLS handshake with %s failed: %s%s", r->servername ? r->servername : o->server,
             err, hint);
        snprintf(r->end_text, sizeof r->end_text, "TLS handshake failed: %s%s", err, hint);
        return;
    }
    rc = smtpe_client_new(&r->c, &r->cfg, NULL, now_ms());
    if (rc == 0 && o->tls == SMTPE_TLS_IMPLICIT)
        rc = smtpe_client_tls_started(r->c, now_ms());
    if (rc < 0) {
        diag("cannot start a session: %s", smtpe_strerror(rc));
        snprintf(r->end_text, sizeof r->end_text, "cannot start a session: %s",
                 smtpe_strerror(rc));
        return;
    }
    submit_next(r);
    run_loop(r, msg, len);
}

/* The TLS client context when TLS may be used. Without OpenSSL opportunistic TLS becomes none
 * and required or implicit TLS is a usage error. Returns 0 or EXIT_USAGE. */
static int setup_tls(struct send_options *o, struct send_run *r)
{
    char err[TLS_ERROR_MAX + 320];

    if (o->tls == SMTPE_TLS_NONE)
        return 0;
    if (!tls_available() && o->tls == SMTPE_TLS_OPPORTUNISTIC) {
        o->tls = SMTPE_TLS_NONE;
        return 0;
    }
    r->tls_ctx = tls_client_new(o->tls_ca, o->tls_insecure, err, sizeof err);
    if (r->tls_ctx == NULL)
        return usage_error("%s", err);
    r->servername = o->tls_servername ? o->tls_servername
                    : o->target.is_unix ? NULL
                                        : o->target.host;
    return 0;
}

/* Frees what parse_args allocated for the paths. */
static void free_options(struct send_options *o)
{
    free_path(o->from, o->from_arg);
    for (size_t i = 0; o->to != NULL && i < o->to_count; i++)
        free_path(o->to[i], o->to_arg[i]);
    free(o->to);
    free(o->to_arg);
}

int main(int argc, char **argv)
{
    struct send_options o;
    struct send_run *r = NULL;
    smtpe_client_rcpt *rcpts = NULL;
    uint8_t *msg = NULL;
    size_t len = 0;
    int rc;

    (void)signal(SIGPIPE, SIG_IGN); /* TLS writes through write(2): a closed peer is EPIPE */
    if ((rc = check_arguments(argc, argv)) != 0)
        return rc;
    rc = parse_args(argc, argv, &o);
    if (rc == PARSE_HELP) {
        fputs(usage_text, stdout);
        rc = fflush(stdout) == 0 ? 0 : EXIT_TEMPORARY;
        goto out;
    }
    if (rc != PARSE_RUN || (rc = load_credentials(&o)) != 0 ||
        (rc = read_message(o.file, &msg, &len)) != 0)
        goto out;
    r = calloc(1, sizeof *r);
    rcpts = calloc(o.to_count, sizeof *rcpts);
    if (r == NULL || rcpts == NULL || (r->res = calloc(o.to_count, sizeof *r->res)) == NULL) {
        diag("out of memory");
        rc = EXIT_TEMPORARY;
        goto out;
    }
    r->o = &o;
    r->fd = -1;
    r->read_on = POLLIN;
    r->write_on = POLLOUT;
    snprintf(r->end_text, sizeof r->end_text, "not attempted");
    if ((rc = setup_tls(&o, r)) != 0)
        goto out;
    build_config(&o, &r->cfg);
    build_txn(&o, msg, len, rcpts, &r->txn);
    if ((rc = validate(&o, &r->cfg, &r->txn)) != 0)
        goto out;
    run(r, msg, len);
    while (r->txn_printed < o.messages)
        print_txn(r, r->txn_printed + 1);
    if (fflush(stdout) != 0 || ferror(stdout)) /* the status still says what happened */
        diag("standard output: %s", strerror(errno));
    rc = exit_status(&r->tally);
out:
    if (r != NULL) {
        tls_conn_free(r->tls);
        tls_client_free(r->tls_ctx);
        if (r->fd >= 0)
            (void)close(r->fd);
        smtpe_client_free(r->c);
        free(r->res);
    }
    free(r);
    free(rcpts);
    free(msg);
    free_options(&o);
    free(o.auth_password);
    free(o.auth_token);
    return rc;
}
