/*
 * cli.c - parses the command line of smtpe-server into struct host_options (see cli.h).
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"
#include "net.h"
#include "tls.h"

#define DEFAULT_LISTEN "127.0.0.1:2525"
#define DEFAULT_MAILDIR "./var/maildir"

enum {
    OPT_LISTEN = 256,
    OPT_MAILDIR,
    OPT_SINK,
    OPT_MAILDIR_CRLF,
    OPT_NO_DELIVERED_TO,
    OPT_HOSTNAME,
    OPT_MAX_MESSAGE_SIZE,
    OPT_MAX_RECIPIENTS,
    OPT_MAX_CLIENTS,
    OPT_MAX_CLIENTS_PER_IP,
    OPT_MAX_ERRORS,
    OPT_GREET_DELAY,
    OPT_DOMAIN,
    OPT_MODEL,
    OPT_LINE_ENDING,
    OPT_COMMAND_TIMEOUT,
    OPT_DATA_TIMEOUT,
    OPT_DRAIN,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_REQUIRE_TLS,
    OPT_AUTH_USERS,
    OPT_AUTH_PLAINTEXT_OK,
    OPT_LMTP,
    OPT_PROXY_PROTOCOL,
    OPT_XCLIENT_FROM,
    OPT_PROXY_FROM,
    OPT_NO_CHUNKING,
    OPT_NO_BINARYMIME,
    OPT_NO_DSN,
    OPT_NO_REQUIRETLS,
    OPT_NO_MT_PRIORITY,
    OPT_NO_DELIVERBY,
    OPT_WORKERS,
    OPT_REPLY_DELAY,
    OPT_JOB_THREADS,
    OPT_RECIPIENTS,
    OPT_LAX_ANGLE_BRACKETS,
    OPT_LOG_FORMAT,
    OPT_LOG_NO_TIME,
    OPT_HELP
};

static const struct option long_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"maildir", required_argument, NULL, OPT_MAILDIR},
    {"sink", no_argument, NULL, OPT_SINK},
    {"maildir-crlf", no_argument, NULL, OPT_MAILDIR_CRLF},
    {"no-delivered-to", no_argument, NULL, OPT_NO_DELIVERED_TO},
    {"hostname", required_argument, NULL, OPT_HOSTNAME},
    {"max-message-size", required_argument, NULL, OPT_MAX_MESSAGE_SIZE},
    {"max-recipients", required_argument, NULL, OPT_MAX_RECIPIENTS},
    {"max-clients", required_argument, NULL, OPT_MAX_CLIENTS},
    {"max-clients-per-ip", required_argument, NULL, OPT_MAX_CLIENTS_PER_IP},
    {"max-errors", required_argument, NULL, OPT_MAX_ERRORS},
    {"greet-delay-ms", required_argument, NULL, OPT_GREET_DELAY},
    {"domain", required_argument, NULL, OPT_DOMAIN},
    {"model", required_argument, NULL, OPT_MODEL},
    {"line-ending", required_argument, NULL, OPT_LINE_ENDING},
    {"command-timeout-ms", required_argument, NULL, OPT_COMMAND_TIMEOUT},
    {"data-timeout-ms", required_argument, NULL, OPT_DATA_TIMEOUT},
    {"drain-seconds", required_argument, NULL, OPT_DRAIN},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"require-tls", no_argument, NULL, OPT_REQUIRE_TLS},
    {"auth-users", required_argument, NULL, OPT_AUTH_USERS},
    {"auth-plaintext-ok", no_argument, NULL, OPT_AUTH_PLAINTEXT_OK},
    {"lmtp", no_argument, NULL, OPT_LMTP},
    {"proxy-protocol", no_argument, NULL, OPT_PROXY_PROTOCOL},
    {"xclient-from", required_argument, NULL, OPT_XCLIENT_FROM},
    {"proxy-from", required_argument, NULL, OPT_PROXY_FROM},
    {"no-chunking", no_argument, NULL, OPT_NO_CHUNKING},
    {"no-binarymime", no_argument, NULL, OPT_NO_BINARYMIME},
    {"no-dsn", no_argument, NULL, OPT_NO_DSN},
    {"no-requiretls", no_argument, NULL, OPT_NO_REQUIRETLS},
    {"no-mt-priority", no_argument, NULL, OPT_NO_MT_PRIORITY},
    {"no-deliverby", no_argument, NULL, OPT_NO_DELIVERBY},
    {"workers", required_argument, NULL, OPT_WORKERS},
    {"reply-delay-ms", required_argument, NULL, OPT_REPLY_DELAY},
    {"job-threads", required_argument, NULL, OPT_JOB_THREADS},
    {"recipients", required_argument, NULL, OPT_RECIPIENTS},
    {"lax-angle-brackets", no_argument, NULL, OPT_LAX_ANGLE_BRACKETS},
    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
    {"log-no-time", no_argument, NULL, OPT_LOG_NO_TIME},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

void cli_usage(FILE *f)
{
    fputs("usage: smtpe-server [options]\n"
          "A receive-only SMTP server delivering to a Maildir.\n"
          "\n"
          "  --listen ADDR:PORT         address to listen on; [ADDR6]:PORT for IPv6; port 0\n"
          "                             picks a free one (default " DEFAULT_LISTEN ");\n"
          "                             unix:/PATH for a unix socket (mode 0666; a stale\n"
          "                             socket file is replaced)\n"
          "  --maildir DIR              Maildir to deliver to, created with tmp/ new/ cur/\n"
          "                             (default " DEFAULT_MAILDIR "); or a template\n"
          "                             with {domain} and {local}, as in\n"
          "                             /var/mail/{domain}/{local}: one Maildir per mailbox\n"
          "                             (values lower-cased; '/' '%' ':', controls and a\n"
          "                             leading '.' as %XX; <postmaster> in the --hostname\n"
          "                             domain), each its own copy, starting with\n"
          "                             Delivered-To:, the Maildir made at its first\n"
          "                             delivery; a recipient with no such path: 553 5.1.3\n"
          "  --maildir-crlf             store CRLF line ends as on the wire (default: LF, the\n"
          "                             Maildir convention; BODY=BINARYMIME is always stored\n"
          "                             octet for octet)\n"
          "  --no-delivered-to          no Delivered-To: line; with a template the copies are\n"
          "                             hard links of one file\n"
          "  --sink                     discard message content, still answer 250 with a queue id\n"
          "  --hostname NAME            name in the greeting and Received: (default: gethostname)\n"
          "  --max-message-size BYTES   largest message, 0 for no limit (default 10485760)\n"
          "  --max-recipients N         recipients per message (default 100)\n"
          "  --max-clients N            concurrent sessions; more get 421 4.7.0 (default 1000)\n"
          "  --max-clients-per-ip N     concurrent sessions from one IPv4 address or IPv6 /64\n"
          "                             (the PROXY header's source with --proxy-protocol);\n"
          "                             more get 421 4.7.0 (default 0: no limit)\n"
          "  --max-errors N             protocol errors (unknown commands, bad syntax, failed\n"
          "                             AUTH) per session; the next gets 421 4.7.0 and the\n"
          "                             session ends (default 20; 0: no limit)\n"
          "  --greet-delay-ms N         hold the greeting N ms; a client that talks before it\n"
          "                             gets 554 5.5.0 and is disconnected (default 0: off)\n"
          "  --domain D                 accept recipients in domain D only (repeatable; default\n"
          "                             any); others get 550 5.7.1; <postmaster> is always\n"
          "                             accepted\n"
          "  --recipients FILE          accept only the recipients FILE names, one a line:\n"
          "                             local@domain, or @domain for all of a domain ('#'\n"
          "                             starts a comment; case-insensitive); others get\n"
          "                             550 5.1.1 at RCPT (after --domain's check).\n"
          "                             <postmaster> and postmaster@ each domain of FILE are\n"
          "                             always accepted. SIGHUP rereads FILE (a bad file\n"
          "                             keeps the old list and logs an error); a bad or\n"
          "                             missing FILE at start: exit 2\n"
          "  --model NAME               host model (default epoll):\n"
          "                               epoll      one thread, one event loop\n"
          "                               prefork    --workers processes, each an event\n"
          "                                          loop on the one shared listener\n"
          "                               reuseport  --workers threads, each an event loop\n"
          "                                          with its own SO_REUSEPORT listener\n"
          "                               threads    one blocking thread per connection\n"
          "  --workers N                prefork and reuseport: event loops (default: cores)\n"
          "  --job-threads N            event models: threads per loop for fsync and\n"
          "                             crypt(3), so the loop never waits (default 4)\n"
          "  --reply-delay-ms N         hold each reply N ms before sending it (benchmarks:\n"
          "                             a slow server), other sessions go on (default 0)\n"
          "  --line-ending POLICY       bare CR/LF/NUL: refuse, normalise or keep (default refuse)\n"
          "  --command-timeout-ms N     wait for a command line, 0 for none (default 300000)\n"
          "  --data-timeout-ms N        wait for message content, 0 for none (default 180000)\n"
          "  --drain-seconds N          on SIGTERM/SIGINT, time sessions get to finish before\n"
          "                             421 4.3.2 (default 10)\n"
          "  --tls-cert FILE            PEM certificate chain (leaf first): offer STARTTLS\n"
          "  --tls-key FILE             PEM private key of --tls-cert (both or neither)\n"
          "  --require-tls              MAIL only after STARTTLS (530 5.7.0 before)\n"
          "  --auth-users FILE          offer AUTH PLAIN LOGIN (after STARTTLS) for the\n"
          "                             user:hash lines of FILE (crypt(3) hashes, e.g.\n"
          "                             'openssl passwd -6'; '#' starts a comment)\n"
          "  --auth-plaintext-ok        offer AUTH without TLS too (tests only: passwords\n"
          "                             travel in clear)\n"
          "  --lmtp                     speak LMTP (RFC 2033): LHLO, one reply per recipient\n"
          "  --proxy-protocol           every connection starts with a PROXY v1/v2 header;\n"
          "                             its source address is the client in logs and Received:\n"
          "  --proxy-from CIDR          only balancers in CIDR may send the PROXY header\n"
          "                             (repeatable); others get 554 5.7.1. Without it any\n"
          "                             peer may, and a PROXY source never earns XCLIENT trust\n"
          "  --xclient-from CIDR        clients in CIDR (ADDR/LEN or an address; repeatable)\n"
          "                             may use XCLIENT and XFORWARD\n"
          "  --no-chunking              do not offer CHUNKING (BDAT), nor BINARYMIME\n"
          "  --no-binarymime            do not offer BINARYMIME\n"
          "  --no-dsn                   do not offer DSN (RET, ENVID, NOTIFY, ORCPT)\n"
          "  --no-requiretls            do not offer REQUIRETLS (offered only under TLS)\n"
          "  --no-mt-priority           do not offer MT-PRIORITY\n"
          "  --no-deliverby             do not offer DELIVERBY\n"
          "  --lax-angle-brackets       accept MAIL FROM:/RCPT TO: paths without angle\n"
          "                             brackets (MAIL FROM:user@example.com); refused with\n"
          "                             501 by default (RFC 5321 4.1.2)\n"
          "  --log-format FORMAT        the log on stderr: text (default), one line of\n"
          "                             key=value pairs per record, or json, one JSON object\n"
          "                             per line with the same keys (see below)\n"
          "  --log-no-time              no timestamp on log lines (journald adds its own)\n"
          "  --help                     show this text\n"
          "\n"
          "When ready it prints \"listening on ADDR:PORT\" on stderr. The log on stderr has\n"
          "one line per record, written whole in one write: an RFC 3339 UTC timestamp (not\n"
          "with --log-no-time), smtpe[PID]:, the event and key=value pairs. All lines of a\n"
          "session share its sid=; the message line names peer= and rcpts=, the\n"
          "disconnect line the queue ids= of the session's accepted messages:\n"
          "  2026-12-02T17:20:05.123Z smtpe[1234]: connect sid=5f0c2a9be4d1 peer=192.0.2.7:41000\n"
          "With --log-format json, one object per line with the same keys after \"time\",\n"
          "\"pid\" and \"event\"; numbers as numbers, rcpts and ids as arrays (one line):\n"
          "  {\"time\":\"2026-12-02T17:20:05.123Z\",\"pid\":1234,\"event\":\"connect\",\n"
          "   \"sid\":\"5f0c2a9be4d1\",\"peer\":\"192.0.2.7:41000\"}\n"
          "Client names and addresses are %XX-escaped in text (octets outside printable\n"
          "ASCII, space, %, and comma in lists); JSON keeps valid UTF-8 as it is.\n",
          f);
}

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "smtpe-server: %s%s%s\nTry 'smtpe-server --help'.\n", msg,
            arg ? ": " : "", arg ? arg : "");
    return CLI_USAGE;
}

/* A feature this build lacks: the message alone (--help would not help). */
static int unavailable(const char *msg)
{
    fprintf(stderr, "smtpe-server: %s\n", msg);
    return CLI_USAGE;
}

static int apply_new(struct host_options *o, int opt, const char *arg);

/* A decimal number in [min, max], nothing else. */
static int parse_number(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;

    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        unsigned d;
        if (*s < '0' || *s > '9')
            return -1;
        d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A bounded number switch (--NAME): arg in [min, max] into *out, or the usage error
 * "bad --NAME (MIN-MAX)". Returns CLI_RUN or CLI_USAGE. */
static int set_number(const char *name, const char *arg, uint64_t min, uint64_t max,
                      uint64_t *out)
{
    char msg[80];

    if (parse_number(arg, min, max, out) == 0)
        return CLI_RUN;
    snprintf(msg, sizeof msg, "bad --%s (%" PRIu64 "-%" PRIu64 ")", name, min, max);
    return usage_error(msg, arg);
}

/* The same into an unsigned (max fits). */
static int set_count(const char *name, const char *arg, uint64_t min, uint64_t max,
                     unsigned *out)
{
    uint64_t v;
    int rc = set_number(name, arg, min, max, &v);

    if (rc == CLI_RUN)
        *out = (unsigned)v;
    return rc;
}

/* A hostname for the greeting: 1..255 printable ASCII octets, no space. */
static int valid_hostname(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > HOST_NAME_MAX_LEN)
        return 0;
    for (; *s; s++)
        if (*s <= ' ' || *s >= 0x7f)
            return 0;
    return 1;
}

static void set_defaults(struct host_options *o)
{
    memset(o, 0, sizeof *o);
    o->listen = DEFAULT_LISTEN;
    o->maildir = DEFAULT_MAILDIR;
    o->max_message_size = 10485760;
    o->max_recipients = 100;
    o->max_clients = 1000;
    o->max_errors = 20;
    o->model = "epoll";
    o->line_ending = SMTPE_LINE_ENDING_REFUSE;
    o->drain_seconds = 10;
    o->job_threads = 4;
    {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o->workers = n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
    }
    if (gethostname(o->hostname, sizeof o->hostname) < 0 ||
        o->hostname[sizeof o->hostname - 1] != '\0' || !valid_hostname(o->hostname))
        strcpy(o->hostname, "localhost");
}

static int parse_line_ending(const char *s, smtpe_line_ending_policy *p)
{
    if (strcmp(s, "refuse") == 0)
        *p = SMTPE_LINE_ENDING_REFUSE;
    else if (strcmp(s, "normalise") == 0 || strcmp(s, "normalize") == 0)
        *p = SMTPE_LINE_ENDING_NORMALISE;
    else if (strcmp(s, "keep") == 0)
        *p = SMTPE_LINE_ENDING_KEEP;
    else
        return -1;
    return 0;
}

/* One switch with its argument. Returns CLI_RUN or CLI_USAGE. */
static int apply(struct host_options *o, int opt, const char *arg)
{
    uint64_t v;

    switch (opt) {
    case OPT_LISTEN: o->listen = arg; return CLI_RUN;
    case OPT_MAILDIR:
        if (*arg == '\0')
            return usage_error("--maildir needs a directory", NULL);
        o->maildir = arg;
        return CLI_RUN;
    case OPT_SINK: o->sink = 1; return CLI_RUN;
    case OPT_MAILDIR_CRLF: o->maildir_crlf = 1; return CLI_RUN;
    case OPT_NO_DELIVERED_TO: o->no_delivered_to = 1; return CLI_RUN;
    case OPT_HOSTNAME:
        if (!valid_hostname(arg))
            return usage_error("bad --hostname (1-255 printable characters, no space)", arg);
        strcpy(o->hostname, arg);
        return CLI_RUN;
    case OPT_MAX_MESSAGE_SIZE:
        if (parse_number(arg, 0, UINT64_MAX, &o->max_message_size) < 0)
            return usage_error("bad --max-message-size", arg);
        return CLI_RUN;
    case OPT_MAX_RECIPIENTS:
        return set_count("max-recipients", arg, 1, 1000000, &o->max_recipients);
    case OPT_MAX_CLIENTS:
        return set_count("max-clients", arg, 1, 1000000, &o->max_clients);
    case OPT_MAX_CLIENTS_PER_IP:
        return set_count("max-clients-per-ip", arg, 0, 1000000, &o->max_clients_per_ip);
    case OPT_MAX_ERRORS:
        return set_count("max-errors", arg, 0, 1000000, &o->max_errors);
    case OPT_GREET_DELAY:
        return set_number("greet-delay-ms", arg, 0, 600000, &o->greet_delay_ms);
    case OPT_DOMAIN:
        if (*arg == '\0')
            return usage_error("--domain needs a domain", NULL);
        o->domains[o->domain_count++] = arg;
        return CLI_RUN;
    case OPT_MODEL: o->model = arg; return CLI_RUN; /* main.c checks it against its table */
    case OPT_WORKERS:
        return set_count("workers", arg, 1, 256, &o->workers);
    case OPT_JOB_THREADS:
        return set_count("job-threads", arg, 1, 256, &o->job_threads);
    case OPT_REPLY_DELAY:
        return set_number("reply-delay-ms", arg, 0, 600000, &o->reply_delay_ms);
    case OPT_LINE_ENDING:
        if (parse_line_ending(arg, &o->line_ending) < 0)
            return usage_error("bad --line-ending (refuse, normalise or keep)", arg);
        return CLI_RUN;
    case OPT_COMMAND_TIMEOUT:
    case OPT_DATA_TIMEOUT:
        if (parse_number(arg, 0, UINT64_MAX / 4, &v) < 0)
            return usage_error("bad timeout", arg);
        if (opt == OPT_COMMAND_TIMEOUT) {
            o->command_timeout_ms = v;
            o->has_command_timeout = 1;
        } else {
            o->data_timeout_ms = v;
            o->has_data_timeout = 1;
        }
        return CLI_RUN;
    case OPT_DRAIN:
        return set_count("drain-seconds", arg, 0, 86400, &o->drain_seconds);
    default:
        return apply_new(o, opt, arg);
    }
}

/* The switches of STARTTLS, AUTH, LMTP, PROXY, XCLIENT and the extensions. */
static int apply_new(struct host_options *o, int opt, const char *arg)
{
    switch (opt) {
    case OPT_TLS_CERT:
    case OPT_TLS_KEY:
        if (*arg == '\0')
            return usage_error(opt == OPT_TLS_CERT ? "--tls-cert needs a file"
                                                   : "--tls-key needs a file",
                               NULL);
        *(opt == OPT_TLS_CERT ? &o->tls_cert : &o->tls_key) = arg;
        return CLI_RUN;
    case OPT_REQUIRE_TLS: o->require_tls = 1; return CLI_RUN;
    case OPT_AUTH_USERS:
        if (*arg == '\0')
            return usage_error("--auth-users needs a file", NULL);
        o->auth_users = arg;
        return CLI_RUN;
    case OPT_AUTH_PLAINTEXT_OK: o->auth_plaintext_ok = 1; return CLI_RUN;
    case OPT_LMTP: o->lmtp = 1; return CLI_RUN;
    case OPT_RECIPIENTS:
        if (*arg == '\0')
            return usage_error("--recipients needs a file", NULL);
        o->recipients = arg;
        return CLI_RUN;
    case OPT_PROXY_PROTOCOL: o->proxy_protocol = 1; return CLI_RUN;
    case OPT_XCLIENT_FROM:
        if (net_parse_cidr(arg, &o->xclient_from[o->xclient_count]) < 0)
            return usage_error("bad --xclient-from (ADDR/LEN or ADDR, IPv4 or IPv6)", arg);
        o->xclient_count++;
        return CLI_RUN;
    case OPT_PROXY_FROM:
        if (net_parse_cidr(arg, &o->proxy_from[o->proxy_from_count]) < 0)
            return usage_error("bad --proxy-from (ADDR/LEN or ADDR, IPv4 or IPv6)", arg);
        o->proxy_from_count++;
        return CLI_RUN;
    case OPT_NO_CHUNKING: o->ext_off |= SMTPE_EXT_CHUNKING | SMTPE_EXT_BINARYMIME; return CLI_RUN;
    case OPT_NO_BINARYMIME: o->ext_off |= SMTPE_EXT_BINARYMIME; return CLI_RUN;
    case OPT_NO_DSN: o->ext_off |= SMTPE_EXT_DSN; return CLI_RUN;
    case OPT_NO_REQUIRETLS: o->ext_off |= SMTPE_EXT_REQUIRETLS; return CLI_RUN;
    case OPT_NO_MT_PRIORITY: o->ext_off |= SMTPE_EXT_MT_PRIORITY; return CLI_RUN;
    case OPT_NO_DELIVERBY: o->ext_off |= SMTPE_EXT_DELIVERBY; return CLI_RUN;
    case OPT_LAX_ANGLE_BRACKETS: o->lax_angle_brackets = 1; return CLI_RUN;
    case OPT_LOG_NO_TIME: o->log_no_time = 1; return CLI_RUN;
    case OPT_LOG_FORMAT:
        if (strcmp(arg, "text") == 0)
            o->log_format = HOST_LOG_TEXT;
        else if (strcmp(arg, "json") == 0)
            o->log_format = HOST_LOG_JSON;
        else
            return usage_error("bad --log-format (text or json)", arg);
        return CLI_RUN;
    default:
        return usage_error("unknown option", NULL);
    }
}

/* Switches that need each other, or a library this build lacks. */
static int check_combinations(const struct host_options *o)
{
    if ((o->tls_cert != NULL) != (o->tls_key != NULL))
        return usage_error("--tls-cert and --tls-key go together", NULL);
    if ((o->tls_cert != NULL || o->require_tls) && !tls_available())
        return unavailable(TLS_UNAVAILABLE_TEXT);
    if (o->require_tls && o->tls_cert == NULL)
        return usage_error("--require-tls needs STARTTLS (--tls-cert and --tls-key)", NULL);
    if (o->proxy_from_count > 0 && !o->proxy_protocol)
        return usage_error("--proxy-from needs --proxy-protocol", NULL);
    if (strcmp(o->model, "reuseport") == 0 &&
        ((const struct sockaddr *)&o->listen_addr)->sa_family == AF_UNIX)
        return usage_error("--model reuseport needs a TCP --listen (SO_REUSEPORT)", NULL);
    if (o->auth_users != NULL && !auth_available())
        return unavailable(AUTH_UNAVAILABLE_TEXT);
    if (o->auth_users != NULL && o->tls_cert == NULL && !o->auth_plaintext_ok)
        return usage_error("--auth-users needs STARTTLS (--tls-cert and --tls-key) or "
                           "--auth-plaintext-ok",
                           NULL);
    return CLI_RUN;
}

int cli_parse(int argc, char **argv, struct host_options *o)
{
    static const char *none[1];
    static struct net_cidr no_cidr[1];
    char err[256];
    int opt, rc;

    set_defaults(o);
    o->domains = argc > 0 ? calloc((size_t)argc, sizeof *o->domains) : NULL;
    if (o->domains == NULL)
        o->domains = none; /* argc == 0, or no memory for a list nobody will fill */
    o->xclient_from = argc > 0 ? calloc((size_t)argc, sizeof *o->xclient_from) : NULL;
    if (o->xclient_from == NULL)
        o->xclient_from = no_cidr;
    o->proxy_from = argc > 0 ? calloc((size_t)argc, sizeof *o->proxy_from) : NULL;
    if (o->proxy_from == NULL)
        o->proxy_from = no_cidr;
    opterr = 1; /* getopt names the unknown switch itself */
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        if (opt == OPT_HELP) {
            cli_usage(stdout);
            return CLI_HELP;
        }
        if (opt == '?' || opt == ':') { /* getopt has said what is wrong */
            fputs("Try 'smtpe-server --help'.\n", stderr);
            return CLI_USAGE;
        }
        if ((opt == OPT_DOMAIN && o->domains == none) ||
            (opt == OPT_XCLIENT_FROM && o->xclient_from == no_cidr) ||
            (opt == OPT_PROXY_FROM && o->proxy_from == no_cidr))
            return usage_error("out of memory", NULL);
        rc = apply(o, opt, optarg);
        if (rc != CLI_RUN)
            return rc;
    }
    if (optind < argc)
        return usage_error("unexpected argument", argv[optind]);
    if (net_parse_listen(o->listen, &o->listen_addr, &o->listen_addr_len, err, sizeof err) < 0)
        return usage_error(err, NULL);
    o->maildir_template = maildir_is_template(o->maildir);
    return check_combinations(o);
}
