/*
 * main.c - smtpe-server's entry point: parses the command line, builds the shared host context
 * (engine config, Maildir, canned replies), sets up signals, and runs the host model chosen with
 * --model.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "host.h"
#include "log.h"
#include "models.h"
#include "net.h"
#include "signals.h"

static const struct host_model models[] = {
    {"epoll", "one process, one thread, one epoll event loop", epoll_model_run},
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

/* The engine config from the options. Returns 0, or -1 if the engine refuses it. */
static int build_config(struct host_ctx *ctx)
{
    const struct host_options *o = &ctx->opt;
    smtpe_server_config *cfg = &ctx->cfg;

    smtpe_server_config_init(cfg);
    cfg->hostname = o->hostname;
    cfg->max_message_size = o->max_message_size;
    cfg->max_recipients = o->max_recipients;
    cfg->line_ending = o->line_ending;
    if (o->has_command_timeout)
        cfg->command_timeout_ms = o->command_timeout_ms;
    if (o->has_data_timeout)
        cfg->data_timeout_ms = o->data_timeout_ms;
    ctx->session_mem = smtpe_server_memory_size(cfg);
    snprintf(ctx->busy_text, sizeof ctx->busy_text, "%s Too many connections", o->hostname);
    snprintf(ctx->shutdown_text, sizeof ctx->shutdown_text, "%s Service shutting down",
             o->hostname);
    return ctx->session_mem == 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    static struct host_ctx ctx;
    const struct host_model *model;
    sigset_t wait_mask;
    char err[512];
    int rc = cli_parse(argc, argv, &ctx.opt);

    if (rc != CLI_RUN)
        return rc == CLI_HELP ? 0 : 2;
    if ((model = find_model(ctx.opt.model)) == NULL)
        return 2;
    if (build_config(&ctx) < 0) {
        fprintf(stderr, "smtpe-server: the engine refuses these limits\n");
        return 2;
    }
    if (host_signals_init(&wait_mask) < 0) {
        fprintf(stderr, "smtpe-server: signals: %s\n", strerror(errno));
        return 1;
    }
    ctx.maildir.root_fd = ctx.maildir.tmp_fd = ctx.maildir.new_fd = -1;
    if (!ctx.opt.sink &&
        maildir_open(&ctx.maildir, ctx.opt.maildir, ctx.opt.hostname, err, sizeof err) < 0) {
        fprintf(stderr, "smtpe-server: %s\n", err);
        return 1;
    }
    host_log("start model=%s hostname=%s %s%s", model->name, ctx.opt.hostname,
             ctx.opt.sink ? "sink" : "maildir=",
             ctx.opt.sink ? "" : host_log_token(err, sizeof err, ctx.opt.maildir,
                                                strlen(ctx.opt.maildir)));
    rc = model->run(&ctx, &wait_mask);
    maildir_close(&ctx.maildir);
    host_log("stop status=%d", rc);
    return rc;
}
