/*
 * cli.c - parses the command line of smtpe-server into struct host_options (see cli.h).
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net.h"

#define DEFAULT_LISTEN "127.0.0.1:2525"
#define DEFAULT_MAILDIR "./var/maildir"

enum {
    OPT_LISTEN = 256,
    OPT_MAILDIR,
    OPT_SINK,
    OPT_HOSTNAME,
    OPT_MAX_MESSAGE_SIZE,
    OPT_MAX_RECIPIENTS,
    OPT_MAX_CLIENTS,
    OPT_DOMAIN,
    OPT_MODEL,
    OPT_LINE_ENDING,
    OPT_COMMAND_TIMEOUT,
    OPT_DATA_TIMEOUT,
    OPT_DRAIN,
    OPT_HELP
};

static const struct option long_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"maildir", required_argument, NULL, OPT_MAILDIR},
    {"sink", no_argument, NULL, OPT_SINK},
    {"hostname", required_argument, NULL, OPT_HOSTNAME},
    {"max-message-size", required_argument, NULL, OPT_MAX_MESSAGE_SIZE},
    {"max-recipients", required_argument, NULL, OPT_MAX_RECIPIENTS},
    {"max-clients", required_argument, NULL, OPT_MAX_CLIENTS},
    {"domain", required_argument, NULL, OPT_DOMAIN},
    {"model", required_argument, NULL, OPT_MODEL},
    {"line-ending", required_argument, NULL, OPT_LINE_ENDING},
    {"command-timeout-ms", required_argument, NULL, OPT_COMMAND_TIMEOUT},
    {"data-timeout-ms", required_argument, NULL, OPT_DATA_TIMEOUT},
    {"drain-seconds", required_argument, NULL, OPT_DRAIN},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

void cli_usage(FILE *f)
{
    fputs("usage: smtpe-server [options]\n"
          "A receive-only SMTP server delivering to a Maildir.\n"
          "\n"
          "  --listen ADDR:PORT         address to listen on; [ADDR6]:PORT for IPv6; port 0\n"
          "                             picks a free one (default " DEFAULT_LISTEN ")\n"
          "  --maildir DIR              Maildir to deliver to, created with tmp/ new/ cur/\n"
          "                             (default " DEFAULT_MAILDIR ")\n"
          "  --sink                     discard message content, still answer 250 with a queue id\n"
          "  --hostname NAME            name in the greeting and Received: (default: gethostname)\n"
          "  --max-message-size BYTES   largest message, 0 for no limit (default 10485760)\n"
          "  --max-recipients N         recipients per message (default 100)\n"
          "  --max-clients N            concurrent sessions; more get 421 4.7.0 (default 1000)\n"
          "  --domain D                 accept recipients in domain D only (repeatable; default\n"
          "                             any); <postmaster> is always accepted\n"
          "  --model NAME               host model: epoll (default epoll)\n"
          "  --line-ending POLICY       bare CR/LF/NUL: refuse, normalise or keep (default refuse)\n"
          "  --command-timeout-ms N     wait for a command line, 0 for none (default 300000)\n"
          "  --data-timeout-ms N        wait for message content, 0 for none (default 180000)\n"
          "  --drain-seconds N          on SIGTERM/SIGINT, time sessions get to finish before\n"
          "                             421 4.3.2 (default 10)\n"
          "  --help                     show this text\n"
          "\n"
          "When ready it prints \"listening on ADDR:PORT\" on stderr; the log is key=value lines\n"
          "on stderr.\n",
          f);
}

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "smtpe-server: %s%s%s\nTry 'smtpe-server --help'.\n", msg,
            arg ? ": " : "", arg ? arg : "");
    return CLI_USAGE;
}

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
    o->model = "epoll";
    o->line_ending = SMTPE_LINE_ENDING_REFUSE;
    o->drain_seconds = 10;
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
    case OPT_MAX_CLIENTS:
        if (parse_number(arg, 1, 1000000, &v) < 0)
            return usage_error(opt == OPT_MAX_CLIENTS ? "bad --max-clients (1-1000000)"
                                                      : "bad --max-recipients (1-1000000)",
                               arg);
        *(opt == OPT_MAX_CLIENTS ? &o->max_clients : &o->max_recipients) = (unsigned)v;
        return CLI_RUN;
    case OPT_DOMAIN:
        if (*arg == '\0')
            return usage_error("--domain needs a domain", NULL);
        o->domains[o->domain_count++] = arg;
        return CLI_RUN;
    case OPT_MODEL: o->model = arg; return CLI_RUN;
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
        if (parse_number(arg, 0, 86400, &v) < 0)
            return usage_error("bad --drain-seconds (0-86400)", arg);
        o->drain_seconds = (unsigned)v;
        return CLI_RUN;
    default:
        return usage_error("unknown option", NULL);
    }
}

int cli_parse(int argc, char **argv, struct host_options *o)
{
    static const char *none[1];
    char err[256];
    int opt, rc;

    set_defaults(o);
    o->domains = argc > 0 ? calloc((size_t)argc, sizeof *o->domains) : NULL;
    if (o->domains == NULL)
        o->domains = none; /* argc == 0, or no memory for a list nobody will fill */
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
        if (opt == OPT_DOMAIN && o->domains == none)
            return usage_error("out of memory", NULL);
        rc = apply(o, opt, optarg);
        if (rc != CLI_RUN)
            return rc;
    }
    if (optind < argc)
        return usage_error("unexpected argument", argv[optind]);
    if (net_parse_listen(o->listen, &o->listen_addr, &o->listen_addr_len, err, sizeof err) < 0)
        return usage_error(err, NULL);
    return CLI_RUN;
}
