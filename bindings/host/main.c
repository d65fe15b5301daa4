/*
 * main.c - smtpe-server's entry point: parses the command line, builds the shared host context
 * (engine config, Maildir, canned replies), sets up signals, and runs the host model chosen with
 * --model.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sys/resource.h>
#include <unistd.h>

#include "auth.h"
#include "cli.h"
#include "host.h"
#include "log.h"
#include "models.h"
#include "net.h"
#include "recipients.h"
#include "signals.h"
#include "tls.h"

static const struct host_model models[] = {
    {"epoll", "one process, one thread, one epoll event loop", epoll_model_run},
    {"prefork", "a supervisor and --workers processes, each an epoll loop", prefork_model_run},
    {"reuseport", "--workers threads, each an epoll loop and SO_REUSEPORT listener",
     reuseport_model_run},
    {"threads", "one blocking thread per connection", threads_model_run},
};

#define MODEL_COUNT (sizeof models / sizeof models[0])

uint64_t host_now_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
        return 0; /* cannot happen with CLOCK_MONOTONIC */
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void host_announce_listener(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char where[NET_HOSTPORT_MAX];

    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
        host_log("error getsockname: %s", strerror(errno));
        return;
    }
    if (ss.ss_family == AF_UNIX)
        host_log("listening on " NET_UNIX_PREFIX "%s", net_unix_path((struct sockaddr *)&ss));
    else
        host_log("listening on %s", net_hostport((struct sockaddr *)&ss, where));
}

static const struct host_model *find_model(const char *name)
{
    for (size_t i = 0; i < MODEL_COUNT; i++)
        if (strcmp(models[i].name, name) == 0)
            return &models[i];
    fprintf(stderr, "smtpe-server: unknown --model '%s'; available:\n", name);
    for (size_t i = 0; i < MODEL_COUNT; i++)
        fprintf(stderr, "  %-10s %s\n", models[i].name, models[i].summary);
    return NULL;
}

/* Extensions on unless switched off (STARTTLS, XCLIENT and XFORWARD only when configured). */
#define HOST_EXTENSIONS                                                                         \
    (SMTPE_EXT_DEFAULT | SMTPE_EXT_CHUNKING | SMTPE_EXT_BINARYMIME | SMTPE_EXT_DSN |           \
     SMTPE_EXT_REQUIRETLS | SMTPE_EXT_MT_PRIORITY | SMTPE_EXT_DELIVERBY)

/* The engine config from the options. Returns 0, or -1 if the engine refuses it. */
static int build_config(struct host_ctx *ctx)
{
    const struct host_options *o = &ctx->opt;
    smtpe_server_config *cfg = &ctx->cfg;

    smtpe_server_config_init(cfg);
    cfg->hostname = o->hostname;
    /* The smallest reply buffer the engine allows: this host's replies are short, and at
     * 10 000 sessions every kilobyte per session is 10 MB. */
    cfg->reply_buffer_size = 2048;
    cfg->extensions = HOST_EXTENSIONS & ~o->ext_off;
    if (o->tls_cert != NULL)
        cfg->extensions |= SMTPE_EXT_STARTTLS;
    if (o->xclient_count > 0)
        cfg->extensions |= SMTPE_EXT_XCLIENT | SMTPE_EXT_XFORWARD;
    cfg->require_tls = o->require_tls;
    if (o->auth_users != NULL) {
        cfg->auth_mechanisms = "PLAIN LOGIN";
        /* "AUTH PLAIN " + the base64 (1024) of the longest PLAIN message RFC 4616 §2 allows
         * (three 255-octet parts and two NULs) + CRLF; the default 512 would cut it */
        cfg->max_line_length = 1040;
    }
    cfg->auth_without_tls = o->auth_plaintext_ok;
    cfg->lmtp = o->lmtp;
    if (o->lmtp)
        cfg->greeting_text = "LMTP smtpe";
    cfg->proxy_protocol = o->proxy_protocol;
    cfg->max_message_size = o->max_message_size;
    cfg->max_recipients = o->max_recipients;
    cfg->max_errors = o->max_errors;
    cfg->line_ending = o->line_ending;
    cfg->lax_angle_brackets = o->lax_angle_brackets;
    if (o->has_command_timeout)
        cfg->command_timeout_ms = o->command_timeout_ms;
    if (o->has_data_timeout)
        cfg->data_timeout_ms = o->data_timeout_ms;
    ctx->session_mem = smtpe_server_memory_size(cfg);
    snprintf(ctx->busy_text, sizeof ctx->busy_text, "%s Too many connections", o->hostname);
    snprintf(ctx->address_busy_text, sizeof ctx->address_busy_text,
             "%s Too many connections from your address", o->hostname);
    snprintf(ctx->shutdown_text, sizeof ctx->shutdown_text, "%s Service shutting down",
             o->hostname);
    return ctx->session_mem == 0 ? -1 : 0;
}

/* The "start" log line: the model and what is switched on. */
static void log_start(const struct host_ctx *ctx, const struct host_model *model)
{
    const struct host_options *o = &ctx->opt;
    char dir[512], workers[32] = "";

    if (strcmp(model->name, "prefork") == 0 || strcmp(model->name, "reuseport") == 0)
        snprintf(workers, sizeof workers, " workers=%u", o->workers);
    host_log("start model=%s%s hostname=%s %s%s%s%s%s%s%s%s", model->name, workers,
             o->hostname,
             o->sink ? "sink" : "maildir=",
             o->sink ? "" : host_log_token(dir, sizeof dir, o->maildir, strlen(o->maildir)),
             o->lmtp ? " lmtp" : "", ctx->tls ? " starttls" : "",
             o->require_tls ? " require-tls" : "", ctx->auth ? " auth" : "",
             o->proxy_protocol ? " proxy-protocol" : "", o->xclient_count ? " xclient" : "");
}

/* The "recipients" log line: the table now in use (at start and after each good reload). */
static void log_recipients(const struct host_ctx *ctx, const char *what)
{
    const char *path = recipients_source_path(ctx->recipients);
    size_t mailboxes, catch_alls;
    char file[512];

    recipients_source_counts(ctx->recipients, &mailboxes, &catch_alls);
    host_log("recipients %s file=%s mailboxes=%zu catch-alls=%zu", what,
             host_log_token(file, sizeof file, path, strlen(path)), mailboxes, catch_alls);
}

void host_reload_check(const struct host_ctx *ctx, unsigned *seen)
{
    unsigned now = host_reload_requests();
    char err[512];

    if (now == *seen)
        return;
    *seen = now;
    if (ctx->recipients == NULL)
        return;
    if (recipients_source_reload(ctx->recipients, err, sizeof err) < 0)
        host_log("error recipients reload: %s; the previous table stays", err);
    else
        log_recipients(ctx, "reloaded");
}

/* Every session holds a socket, and a file while a message is stored: take as many descriptors
 * as the hard limit allows (the soft limit is often 1024). */
static void raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    static struct host_ctx ctx;
    const struct host_model *model;
    const char *unix_path;
    sigset_t wait_mask;
    char err[512];
    int rc = cli_parse(argc, argv, &ctx.opt);

    if (rc != CLI_RUN)
        return rc == CLI_HELP ? 0 : 2;
    host_log_setup(ctx.opt.log_format, !ctx.opt.log_no_time);
    if ((model = find_model(ctx.opt.model)) == NULL)
        return 2;
    if (build_config(&ctx) < 0) {
        fprintf(stderr, "smtpe-server: the engine refuses these limits\n");
        return 2;
    }
    if (ctx.opt.recipients != NULL &&
        (ctx.recipients = recipients_source_new(ctx.opt.recipients, err, sizeof err)) == NULL) {
        fprintf(stderr, "smtpe-server: --recipients %s\n", err);
        return 2; /* a usage error, like a bad switch: nothing has started */
    }
    if (host_signals_init(&wait_mask) < 0 ||
        (ctx.recipients != NULL && host_signals_reload_on(SIGHUP, &wait_mask) < 0)) {
        fprintf(stderr, "smtpe-server: signals: %s\n", strerror(errno));
        recipients_source_free(ctx.recipients);
        return 1;
    }
    if (ctx.opt.tls_cert != NULL &&
        (ctx.tls = tls_server_new(ctx.opt.tls_cert, ctx.opt.tls_key, err, sizeof err)) == NULL) {
        fprintf(stderr, "smtpe-server: %s\n", err);
        recipients_source_free(ctx.recipients);
        return 1;
    }
    if (ctx.opt.auth_users != NULL &&
        (ctx.auth = auth_db_load(ctx.opt.auth_users, err, sizeof err)) == NULL) {
        fprintf(stderr, "smtpe-server: --auth-users %s\n", err);
        tls_server_free(ctx.tls);
        recipients_source_free(ctx.recipients);
        return 1;
    }
    ctx.maildir.root_fd = ctx.maildir.tmp_fd = ctx.maildir.new_fd = -1;
    /* a template's mailboxes are made at their first delivery; only the file names' host
     * part is needed now */
    maildir_host_part(ctx.maildir.host_part, sizeof ctx.maildir.host_part, ctx.opt.hostname);
    if (!ctx.opt.sink && !ctx.opt.maildir_template &&
        maildir_open(&ctx.maildir, ctx.opt.maildir, ctx.opt.hostname, err, sizeof err) < 0) {
        fprintf(stderr, "smtpe-server: %s\n", err);
        auth_db_free(ctx.auth);
        tls_server_free(ctx.tls);
        recipients_source_free(ctx.recipients);
        return 1;
    }
    raise_fd_limit();
    log_start(&ctx, model);
    if (ctx.recipients != NULL)
        log_recipients(&ctx, "loaded");
    if (!ctx.opt.sink && !ctx.opt.maildir_template) {
        long n = maildir_sweep_tmp(&ctx.maildir, time(NULL), MAILDIR_TMP_MAX_AGE);
        if (n > 0)
            host_log("maildir tmp/: removed %ld files older than 36 hours (deliveries cut "
                     "short by a crash)", n);
    }
    rc = model->run(&ctx, &wait_mask);
    unix_path = net_unix_path((const struct sockaddr *)&ctx.opt.listen_addr);
    if (unix_path != NULL && rc == 0)
        (void)unlink(unix_path); /* ours: the listener was bound, else run fails */
    maildir_close(&ctx.maildir);
    auth_db_free(ctx.auth);
    tls_server_free(ctx.tls);
    recipients_source_free(ctx.recipients);
    host_log("stop status=%d", rc);
    return rc;
}
