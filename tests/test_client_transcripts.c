/*
 * test_client_transcripts.c - runs every .txt file in tests/transcripts/client (format:
 * tests/transcripts/README.md, "Client mode") through the client engine three times: the
 * server's octets fed whole, one octet at a time, and in pseudo-random pieces (a fixed seed per
 * file). Each run must meet every expectation of the file, and the octet and random runs must
 * give exactly the client octets, the events and the points at which they appeared of the whole
 * run. A file marked "@known_bug" must fail (it states the correct behaviour of an engine bug):
 * it is reported, not counted. Usage:
 * test_client_transcripts [dir]   (default: SMTPE_CLIENT_TRANSCRIPT_DIR)
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "client_harness.h"
#include "harness.h"

#ifndef SMTPE_CLIENT_TRANSCRIPT_DIR
#define SMTPE_CLIENT_TRANSCRIPT_DIR "tests/transcripts/client"
#endif

#define DEFAULT_CONTENT "Subject: test\r\n\r\nHello\r\n"
#define WILD '\001' /* a pattern's "*" (canonical text never holds a control octet) */

/* ---- scripts ----------------------------------------------------------------------------- */

enum {
    L_SET,      /* @name value */
    L_S,        /* S> text: the server sends text CRLF */
    L_SB,       /* SB> text: the server sends exactly text */
    L_C,        /* C< text: the client sent text CRLF next */
    L_CB,       /* CB< text: the client sent exactly text next */
    L_CN,       /* CN< n text: the client sent text n times next */
    L_SILENT,   /* the client sent nothing more */
    L_E,        /* E: pattern: the next event */
    L_NOEVENT,  /* no event beyond those matched */
    L_SUBMIT,   /* SUBMIT [!ERR] */
    L_QUIT,     /* QUIT [!ERR] */
    L_LOST,     /* LOST [!ERR] */
    L_ABORT,    /* ABORT [!ERR] */
    L_TLS,      /* TLS [!ERR] */
    L_TIME,     /* TIME +ms */
    L_DEADLINE, /* DEADLINE ms | +ms | none */
    L_WANT,     /* WANT [!]FLAG ... */
    L_CLOSED,   /* WANT CLOSE */
    L_OPEN,     /* WANT !CLOSE */
    L_RESUME,   /* CONTENT_RESUME [n] */
    L_WBLOCK,   /* WRITE_BLOCK */
    L_WRESUME,  /* WRITE_RESUME */
    L_NEW       /* NEW [!ERR] */
};

static const struct {
    const char *word;
    int kind;
    int arg; /* 0: nothing after the word; 1: text after one space; 2: optional text */
} directives[] = {
    {"S>", L_S, 1},          {"SB>", L_SB, 1},         {"C<", L_C, 2},
    {"CB<", L_CB, 1},        {"CN<", L_CN, 1},         {"SILENT", L_SILENT, 0},
    {"E:", L_E, 1},          {"NOEVENT", L_NOEVENT, 0}, {"SUBMIT", L_SUBMIT, 2},
    {"QUIT", L_QUIT, 2},     {"LOST", L_LOST, 2},      {"ABORT", L_ABORT, 2},
    {"TLS", L_TLS, 2},       {"TIME", L_TIME, 1},      {"DEADLINE", L_DEADLINE, 1},
    {"WANT", L_WANT, 1},     {"CLOSED", L_CLOSED, 0},  {"OPEN", L_OPEN, 0},
    {"CONTENT_RESUME", L_RESUME, 2}, {"WRITE_BLOCK", L_WBLOCK, 0},
    {"WRITE_RESUME", L_WRESUME, 0},  {"NEW", L_NEW, 2},
};

typedef struct cline {
    int kind;
    int lineno;
    char *text; /* after the word and one space ("" when none); for L_SET "name value" */
} cline;

typedef struct cscript {
    char *path;
    const char *name;
    cline *lines;
    size_t n;
    char *known_bug; /* @known_bug's description, or NULL */
} cscript;

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p)
        abort();
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* Parses one line into *l. Returns 0, 1 for a line to skip, or -1 with err set. */
static int parse_line(const char *path, char *s, int lineno, cline *l, hs_buf *err)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    if (n == 0 || s[0] == '#')
        return 1;
    if (s[n - 1] == ' ' || s[n - 1] == '\t') { /* editors strip them: write \x20 */
        hs_buf_addf(err, "%s:%d: a space or tab at the end of the line (write \\x20)", path,
                    lineno);
        return -1;
    }
    l->lineno = lineno;
    if (s[0] == '@') {
        l->kind = L_SET;
        l->text = dupn(s + 1, n - 1);
        return 0;
    }
    for (size_t i = 0; i < sizeof directives / sizeof *directives; i++) {
        size_t w = strlen(directives[i].word);
        if (strncmp(s, directives[i].word, w) != 0 || (s[w] != '\0' && s[w] != ' '))
            continue;
        if (directives[i].arg == 0 && s[w] != '\0')
            break;
        if (directives[i].arg == 1 && s[w] != ' ')
            break;
        l->kind = directives[i].kind;
        l->text = dupn(s[w] ? s + w + 1 : "", s[w] ? n - w - 1 : 0);
        return 0;
    }
    hs_buf_addf(err, "%s:%d: not a directive: %s", path, lineno, s);
    return -1;
}

static void script_free(cscript *sc)
{
    for (size_t i = 0; i < sc->n; i++)
        free(sc->lines[i].text);
    free(sc->lines);
    free(sc->path);
    free(sc->known_bug);
    memset(sc, 0, sizeof *sc);
}

static int script_load(cscript *sc, const char *path, hs_buf *err)
{
    char buf[8192];
    int lineno = 0;
    size_t cap = 0;
    FILE *f = fopen(path, "r");
    memset(sc, 0, sizeof *sc);
    sc->path = dupn(path, strlen(path));
    sc->name = strrchr(sc->path, '/') ? strrchr(sc->path, '/') + 1 : sc->path;
    if (!f) {
        hs_buf_addf(err, "%s: cannot open", path);
        return -1;
    }
    while (fgets(buf, sizeof buf, f)) {
        cline l;
        int r;
        lineno++;
        if (!strchr(buf, '\n') && !feof(f)) {
            hs_buf_addf(err, "%s:%d: line too long", path, lineno);
            fclose(f);
            return -1;
        }
        r = parse_line(path, buf, lineno, &l, err);
        if (r < 0) {
            fclose(f);
            return -1;
        }
        if (r > 0)
            continue;
        if (l.kind == L_SET && strncmp(l.text, "known_bug ", 10) == 0) {
            free(sc->known_bug);
            sc->known_bug = dupn(l.text + 10, strlen(l.text + 10));
            free(l.text);
            continue;
        }
        if (sc->n == cap) {
            cap = cap ? cap * 2 : 64;
            sc->lines = realloc(sc->lines, cap * sizeof *sc->lines);
            if (!sc->lines)
                abort();
        }
        sc->lines[sc->n++] = l;
    }
    fclose(f);
    return 0;
}

/* ---- a run ------------------------------------------------------------------------------- */

/* A transaction as the script describes it; the submitted ones are kept until the run ends
 * (the engine needs them until TRANSACTION_DONE). */
typedef struct ctxn {
    smtpe_client_txn txn;
    smtpe_client_rcpt *rcpts;
    size_t nrcpt, cap;
    smtpe_param *xforward;
    size_t nxforward;
    hs_buf content;
    int content_given; /* an @content line replaced the default */
    int scan;          /* the host scans the content (has_content_info) */
    size_t piece;
    int abort;
    int stall;
    size_t stall_at;
    int has_from;
} ctxn;

/* Everything one run produced: compared across the three runs. */
typedef struct cresult {
    hs_buf out;   /* every octet the client sent */
    hs_log log;   /* every event line */
    hs_buf trace; /* "line: out-octets events" after each action */
} cresult;

typedef struct crun {
    const cscript *sc;
    int mode;
    ch h;
    int cfg_dirty;       /* a config setting since the session was made */
    int made;            /* a session was made (or NEW tried) */
    void **pool;         /* what the config and transactions point to */
    size_t npool;
    smtpe_param *xclient;
    size_t nxclient;
    smtpe_proxy_info proxy;
    ctxn draft;
    ctxn **done;         /* submitted transactions */
    size_t ndone;
    hs_buf pending;      /* server octets not yet fed */
    size_t out_at, ev_at; /* what the expectations matched so far */
    cresult *res;
    hs_buf err;
    int script_error;    /* the failure is the script's, not the engine's */
} crun;

/* Keeps p (malloc'd) until the run ends. */
static void *pool_keep(crun *r, void *p)
{
    r->pool = realloc(r->pool, (r->npool + 1) * sizeof *r->pool);
    if (!r->pool)
        abort();
    return r->pool[r->npool++] = p;
}

/* A NUL-terminated copy of p[0..n) that lives until the run ends. */
static char *pool_add(crun *r, const uint8_t *p, size_t n)
{
    return pool_keep(r, dupn((const char *)p, n));
}

static int tfail(crun *r, int lineno, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int tfail(crun *r, int lineno, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->err.len == 0)
        hs_buf_addf(&r->err, "%s:%d [%s]: %s\n", r->sc->path, lineno, hs_mode_name(r->mode),
                    msg);
    return -1;
}

static int script_fail(crun *r, int lineno, const char *what, const char *text)
{
    r->script_error = 1;
    return tfail(r, lineno, "bad script: %s: %s", what, text);
}

/* Unescapes text (C escapes) into a fresh buffer; -1 on a malformed escape. */
static int unescape(crun *r, int lineno, const char *text, hs_buf *out)
{
    hs_buf_reset(out);
    if (hs_unescape(out, text, strlen(text)) < 0)
        return script_fail(r, lineno, "malformed escape", text);
    return 0;
}

/* Takes what the harness gathered: client octets into res->out, event lines into res->log. */
static void collect(crun *r)
{
    size_t n;
    const char *p = ch_take_out_len(&r->h, &n);
    const char *log;
    hs_buf_add(&r->res->out, p, n);
    log = ch_take_log(&r->h);
    while (*log) {
        const char *nl = strchr(log, '\n');
        size_t k = nl ? (size_t)(nl - log) : strlen(log);
        hs_log_add(&r->res->log, (const uint8_t *)log, k);
        log += k + (nl != NULL);
    }
}

/* Feeds the server octets written so far (one write, split as the mode says). */
static void feed(crun *r)
{
    if (r->pending.len == 0 || !r->h.c)
        return;
    ch_server_n(&r->h, r->pending.p, r->pending.len);
    hs_buf_reset(&r->pending);
    collect(r);
}

/* ---- settings ---- */

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    if (!*s || *s == '-')
        return -1;
    *v = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

static int set_number(crun *r, const cline *l, const char *v, uint64_t *out)
{
    if (parse_u64(v, out) < 0)
        return script_fail(r, l->lineno, "not a number", v);
    return 0;
}

/* A string setting (C escapes); NULL into *out for "none" when allow_none. */
static int set_string(crun *r, const cline *l, const char *v, int allow_none, const char **out)
{
    hs_buf b = {0};
    if (allow_none && strcmp(v, "none") == 0) {
        *out = NULL;
        return 0;
    }
    if (unescape(r, l->lineno, v, &b) < 0) {
        hs_buf_free(&b);
        return -1;
    }
    *out = pool_add(r, b.p, b.len);
    hs_buf_free(&b);
    return 0;
}

/* "NAME=value" (value C-escaped) into *p. */
static int set_param(crun *r, const cline *l, const char *v, smtpe_param *p)
{
    const char *eq = strchr(v, '=');
    hs_buf b = {0};
    if (!eq || eq == v)
        return script_fail(r, l->lineno, "not NAME=value", v);
    p->keyword.ptr = (const uint8_t *)pool_add(r, (const uint8_t *)v, (size_t)(eq - v));
    p->keyword.len = (size_t)(eq - v);
    if (unescape(r, l->lineno, eq + 1, &b) < 0) {
        hs_buf_free(&b);
        return -1;
    }
    p->value.ptr = (const uint8_t *)pool_add(r, b.p, b.len);
    p->value.len = b.len;
    hs_buf_free(&b);
    return 0;
}

/* "a.b.c.d:port" into addr (4 octets) and port. */
static int parse_inet(const char *s, uint8_t *addr, uint16_t *port)
{
    unsigned a, b, c, d, p;
    char tail;
    if (sscanf(s, "%u.%u.%u.%u:%u%c", &a, &b, &c, &d, &p, &tail) != 5 || a > 255 || b > 255 ||
        c > 255 || d > 255 || p > 65535)
        return -1;
    addr[0] = (uint8_t)a;
    addr[1] = (uint8_t)b;
    addr[2] = (uint8_t)c;
    addr[3] = (uint8_t)d;
    *port = (uint16_t)p;
    return 0;
}

/* @proxy v1|v2 inet SRC DST | @proxy v1|v2 local | @proxy none */
static int set_proxy(crun *r, const cline *l, const char *v)
{
    char ver[8], fam[8], src[64], dst[64];
    int n = sscanf(v, "%7s %7s %63s %63s", ver, fam, src, dst);
    smtpe_proxy_info *p = &r->proxy;
    if (strcmp(v, "none") == 0) {
        r->h.cfg.proxy = NULL;
        return 0;
    }
    memset(p, 0, sizeof *p);
    if (n < 2 || (strcmp(ver, "v1") != 0 && strcmp(ver, "v2") != 0))
        return script_fail(r, l->lineno, "proxy", v);
    p->version = ver[1] - '0';
    if (n == 2 && strcmp(fam, "local") == 0) {
        p->local = 1;
    } else if (n == 4 && strcmp(fam, "inet") == 0 && parse_inet(src, p->src_addr, &p->src_port) == 0 &&
               parse_inet(dst, p->dst_addr, &p->dst_port) == 0) {
        p->family = SMTPE_PROXY_AF_INET;
        p->transport = SMTPE_PROXY_TRANSPORT_STREAM;
    } else {
        return script_fail(r, l->lineno, "proxy", v);
    }
    r->h.cfg.proxy = p;
    return 0;
}

static int word_is(const char *v, const char *const *words, int n, int *out)
{
    for (int i = 0; i < n; i++)
        if (strcmp(v, words[i]) == 0) {
            *out = i;
            return 1;
        }
    return 0;
}

/* Client config settings. Returns 0, -1 (failed), or 1 (not a config setting). */
static int set_config(crun *r, const cline *l, const char *name, const char *v)
{
    smtpe_client_config *k = &r->h.cfg;
    static const struct {
        const char *name;
        size_t off;
        int is_size; /* size_t (1), uint64_t (2), int (0) or unsigned (3) */
    } nums[] = {
        {"lmtp", offsetof(smtpe_client_config, lmtp), 0},
        {"auth_plaintext_ok", offsetof(smtpe_client_config, auth_plaintext_ok), 0},
        {"chunking", offsetof(smtpe_client_config, chunking), 0},
        {"pipelining", offsetof(smtpe_client_config, pipelining), 0},
        {"chunk_size", offsetof(smtpe_client_config, chunk_size), 1},
        {"max_reply_line", offsetof(smtpe_client_config, max_reply_line), 1},
        {"max_reply_size", offsetof(smtpe_client_config, max_reply_size), 1},
        {"output_buffer_size", offsetof(smtpe_client_config, output_buffer_size), 1},
        {"max_unanswered", offsetof(smtpe_client_config, max_unanswered), 1},
        {"max_recipients", offsetof(smtpe_client_config, max_recipients), 3},
        {"greeting_timeout", offsetof(smtpe_client_config, greeting_timeout_ms), 2},
        {"command_timeout", offsetof(smtpe_client_config, command_timeout_ms), 2},
        {"data_timeout", offsetof(smtpe_client_config, data_timeout_ms), 2},
        {"data_block_timeout", offsetof(smtpe_client_config, data_block_timeout_ms), 2},
        {"data_end_timeout", offsetof(smtpe_client_config, data_end_timeout_ms), 2},
    };
    static const char *const tls_words[] = {"none", "opportunistic", "required", "implicit"};
    int w;
    uint64_t u = 0;
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        char *f = (char *)k + nums[i].off;
        if (strcmp(name, nums[i].name) != 0)
            continue;
        if (set_number(r, l, v, &u) < 0)
            return -1;
        if (nums[i].is_size == 1)
            *(size_t *)(void *)f = (size_t)u;
        else if (nums[i].is_size == 2)
            *(uint64_t *)(void *)f = u;
        else if (nums[i].is_size == 3)
            *(unsigned *)(void *)f = (unsigned)u;
        else
            *(int *)(void *)f = (int)u;
        return 0;
    }
    if (strcmp(name, "helo") == 0)
        return set_string(r, l, v, 0, &k->helo_name);
    if (strcmp(name, "tls") == 0) {
        if (!word_is(v, tls_words, 4, &w))
            return script_fail(r, l->lineno, "tls", v);
        k->tls = (smtpe_tls_policy)w;
        return 0;
    }
    if (strcmp(name, "line_ending") == 0) {
        if (strcmp(v, "refuse") == 0)
            k->line_ending = SMTPE_LINE_ENDING_REFUSE;
        else if (strcmp(v, "normalise") == 0 || strcmp(v, "normalize") == 0)
            k->line_ending = SMTPE_LINE_ENDING_NORMALISE;
        else if (strcmp(v, "keep") == 0)
            k->line_ending = SMTPE_LINE_ENDING_KEEP;
        else
            return script_fail(r, l->lineno, "line_ending", v);
        return 0;
    }
    if (strcmp(name, "auth_mechanism") == 0) {
        if (strcmp(v, "best") == 0) {
            k->auth_mechanism = "";
            return 0;
        }
        return set_string(r, l, v, 1, &k->auth_mechanism);
    }
    if (strcmp(name, "auth_user") == 0)
        return set_string(r, l, v, 1, &k->auth_user);
    if (strcmp(name, "auth_password") == 0)
        return set_string(r, l, v, 1, &k->auth_password);
    if (strcmp(name, "auth_authzid") == 0)
        return set_string(r, l, v, 1, &k->auth_authzid);
    if (strcmp(name, "auth_token") == 0)
        return set_string(r, l, v, 1, &k->auth_token);
    if (strcmp(name, "xclient") == 0) {
        if (strcmp(v, "none") == 0) {
            r->nxclient = 0;
        } else { /* a new array: the live session's config may still point to the old one */
            smtpe_param *a = calloc(r->nxclient + 1, sizeof *a);
            if (!a)
                abort();
            if (r->nxclient)
                memcpy(a, r->xclient, r->nxclient * sizeof *a);
            pool_keep(r, a);
            if (set_param(r, l, v, &a[r->nxclient]) < 0)
                return -1;
            r->xclient = a;
            r->nxclient++;
        }
        k->xclient = r->nxclient ? r->xclient : NULL;
        k->xclient_count = r->nxclient;
        return 0;
    }
    if (strcmp(name, "proxy") == 0)
        return set_proxy(r, l, v);
    return 1;
}

static void draft_reset(ctxn *t)
{
    free(t->rcpts);
    free(t->xforward);
    hs_buf_free(&t->content);
    memset(t, 0, sizeof *t);
    hs_buf_adds(&t->content, DEFAULT_CONTENT);
}

/* @to PATH [NOTIFY=a,b] [ORCPT=type;addr]: the options are the trailing words. */
static int set_to(crun *r, const cline *l, const char *v)
{
    ctxn *t = &r->draft;
    smtpe_client_rcpt rc = {0};
    char *s = pool_add(r, (const uint8_t *)v, strlen(v));
    for (;;) {
        char *sp = strrchr(s, ' ');
        const char *word = sp ? sp + 1 : NULL;
        if (word && strncmp(word, "NOTIFY=", 7) == 0) {
            static const char *const names[] = {"NEVER", "SUCCESS", "FAILURE", "DELAY"};
            for (char *tok = strtok((char *)word + 7, ","); tok; tok = strtok(NULL, ",")) {
                int w;
                if (!word_is(tok, names, 4, &w))
                    return script_fail(r, l->lineno, "NOTIFY", tok);
                rc.notify |= 1u << w;
            }
        } else if (word && strncmp(word, "ORCPT=", 6) == 0) {
            if (set_string(r, l, word + 6, 0, &rc.orcpt) < 0)
                return -1;
        } else {
            break;
        }
        *sp = '\0';
    }
    if (set_string(r, l, s, 0, &rc.forward_path) < 0)
        return -1;
    if (t->nrcpt == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 8;
        t->rcpts = realloc(t->rcpts, t->cap * sizeof *t->rcpts);
        if (!t->rcpts)
            abort();
    }
    t->rcpts[t->nrcpt++] = rc;
    return 0;
}

/* "..." with C escapes inside, appended to out. */
static int quoted(crun *r, const cline *l, const char *v, hs_buf *out)
{
    size_t n = strlen(v);
    if (n < 2 || v[0] != '"' || v[n - 1] != '"')
        return script_fail(r, l->lineno, "expected a \"quoted\" text", v);
    if (hs_unescape(out, v + 1, n - 2) < 0)
        return script_fail(r, l->lineno, "malformed escape", v);
    return 0;
}

static int set_content(crun *r, const cline *l, const char *name, const char *v)
{
    ctxn *t = &r->draft;
    uint64_t u = 0;
    hs_buf one = {0};
    int rc = 0;
    if (!t->content_given) {
        hs_buf_reset(&t->content);
        t->content_given = 1;
    }
    if (strcmp(name, "content") == 0)
        return quoted(r, l, v, &t->content);
    /* content_repeat N "text" */
    char *sp = strchr(v, ' ');
    if (!sp)
        return script_fail(r, l->lineno, "content_repeat N \"text\"", v);
    char *num = dupn(v, (size_t)(sp - v));
    if (parse_u64(num, &u) < 0 || quoted(r, l, sp + 1, &one) < 0)
        rc = script_fail(r, l->lineno, "content_repeat N \"text\"", v);
    for (uint64_t i = 0; rc == 0 && i < u; i++)
        hs_buf_add(&t->content, one.p, one.len);
    free(num);
    hs_buf_free(&one);
    return rc;
}

/* Transaction settings. Returns 0, -1, or 1 (not one). */
static int set_txn(crun *r, const cline *l, const char *name, const char *v)
{
    ctxn *t = &r->draft;
    uint64_t u = 0;
    int w;
    static const char *const ret_words[] = {"", "full", "hdrs"};
    static const char *const body_words[] = {"", "7bit", "8bitmime", "binarymime"};
    if (strcmp(name, "from") == 0) {
        draft_reset(t);
        t->has_from = 1;
        return set_string(r, l, strcmp(v, "<>") == 0 ? "" : v, 0, &t->txn.reverse_path);
    }
    if (!t->has_from &&
        (strcmp(name, "to") == 0 || strncmp(name, "content", 7) == 0 ||
         strcmp(name, "envid") == 0 || strcmp(name, "ret") == 0 || strcmp(name, "body") == 0 ||
         strcmp(name, "smtputf8") == 0 || strcmp(name, "requiretls") == 0 ||
         strcmp(name, "mt_priority") == 0 || strcmp(name, "by") == 0 ||
         strcmp(name, "xforward") == 0))
        return script_fail(r, l->lineno, "a transaction setting before @from", name);
    if (strcmp(name, "to") == 0)
        return set_to(r, l, v);
    if (strcmp(name, "envid") == 0)
        return set_string(r, l, v, 0, &t->txn.envid);
    if (strcmp(name, "ret") == 0 || strcmp(name, "body") == 0) {
        int is_ret = name[0] == 'r';
        if (!word_is(v, is_ret ? ret_words : body_words, is_ret ? 3 : 4, &w) || w == 0)
            return script_fail(r, l->lineno, name, v);
        if (is_ret)
            t->txn.ret = (smtpe_dsn_ret)w;
        else
            t->txn.body = (smtpe_body_type)w;
        return 0;
    }
    if (strcmp(name, "mt_priority") == 0) {
        t->txn.has_mt_priority = 1;
        t->txn.mt_priority = atoi(v);
        return 0;
    }
    if (strcmp(name, "by") == 0) {
        const char *semi = strchr(v, ';');
        if (!semi || (semi[1] != 'R' && semi[1] != 'N') || semi[2])
            return script_fail(r, l->lineno, "by SECONDS;R|N", v);
        t->txn.by_time = strtoll(v, NULL, 10);
        t->txn.by_mode = semi[1];
        return 0;
    }
    if (strcmp(name, "xforward") == 0) {
        t->xforward = realloc(t->xforward, (t->nxforward + 1) * sizeof *t->xforward);
        if (!t->xforward)
            abort();
        return set_param(r, l, v, &t->xforward[t->nxforward++]);
    }
    if (strcmp(name, "content") == 0 || strcmp(name, "content_repeat") == 0)
        return set_content(r, l, name, v);
    static const struct {
        const char *name;
        int kind; /* 0: int field of txn; 1: piece; 2: abort; 3: stall; 4: scan */
        size_t off;
    } flags[] = {
        {"smtputf8", 0, offsetof(smtpe_client_txn, smtputf8)},
        {"requiretls", 0, offsetof(smtpe_client_txn, requiretls)},
        {"content_piece", 1, 0}, {"content_abort", 2, 0}, {"content_stall", 3, 0},
        {"content_scan", 4, 0},
    };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        if (strcmp(name, flags[i].name) != 0)
            continue;
        if (set_number(r, l, v, &u) < 0)
            return -1;
        switch (flags[i].kind) {
        case 0: *(int *)(void *)((char *)&t->txn + flags[i].off) = (int)u; break;
        case 1: t->piece = (size_t)u; break;
        case 2: t->abort = (int)u; break;
        case 3: t->stall = 1; t->stall_at = (size_t)u; break;
        default: t->scan = (int)u; break;
        }
        return 0;
    }
    return 1;
}

/* Host behaviour: @auth_step N "response" | none, @write_chunk N. Returns 0, -1, or 1 (not
 * one). */
static int set_host(crun *r, const cline *l, const char *name, const char *v)
{
    uint64_t step = 0;
    char num[24];
    const char *sp = strchr(v, ' ');
    hs_buf b = {0};
    if (strcmp(name, "write_chunk") == 0) {
        if (parse_u64(v, &step) < 0)
            return script_fail(r, l->lineno, "write_chunk N", v);
        r->h.write_chunk = (size_t)step;
        return 0;
    }
    if (strcmp(name, "auth_step") != 0)
        return 1;
    if (!sp || (size_t)(sp - v) >= sizeof num)
        return script_fail(r, l->lineno, "auth_step N \"response\" | none", v);
    memcpy(num, v, (size_t)(sp - v));
    num[sp - v] = '\0';
    if (parse_u64(num, &step) < 0 || step >= 8)
        return script_fail(r, l->lineno, "auth_step N (0..7)", v);
    r->h.auth_step_lens = 1;
    if (strcmp(sp + 1, "none") == 0) {
        r->h.auth_steps[step] = NULL;
        return 0;
    }
    if (quoted(r, l, sp + 1, &b) < 0) {
        hs_buf_free(&b);
        return -1;
    }
    r->h.auth_steps[step] = pool_add(r, b.p, b.len);
    r->h.auth_step_len[step] = b.len;
    hs_buf_free(&b);
    return 0;
}

static int do_setting(crun *r, const cline *l)
{
    char name[64];
    const char *sp = strchr(l->text, ' ');
    size_t n = sp ? (size_t)(sp - l->text) : strlen(l->text);
    const char *v = sp ? sp + 1 : "";
    int rc;
    if (n >= sizeof name)
        return script_fail(r, l->lineno, "unknown setting", l->text);
    memcpy(name, l->text, n);
    name[n] = '\0';
    rc = set_config(r, l, name, v);
    if (rc == 0)
        r->cfg_dirty = 1;
    if (rc <= 0)
        return rc;
    rc = set_txn(r, l, name, v);
    if (rc <= 0)
        return rc;
    rc = set_host(r, l, name, v);
    if (rc <= 0)
        return rc;
    return script_fail(r, l->lineno, "unknown setting", l->text);
}

/* ---- sessions ---- */

static int error_code(const char *name, int *code)
{
    static const struct {
        const char *name;
        int code;
    } errs[] = {{"INVALID", SMTPE_ERR_INVALID_ARGUMENT}, {"STATE", SMTPE_ERR_STATE},
                {"CONFIG", SMTPE_ERR_CONFIG}, {"NOMEM", SMTPE_ERR_NOMEM},
                {"BUFFER_TOO_SMALL", SMTPE_ERR_BUFFER_TOO_SMALL}};
    if (!*name) {
        *code = 0;
        return 0;
    }
    for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
        if (name[0] == '!' && strcmp(name + 1, errs[i].name) == 0) {
            *code = errs[i].code;
            return 0;
        }
    return -1;
}

/* Checks the result of an API call against the line's "!ERR" (none: 0). */
static int check_result(crun *r, const cline *l, const char *call, int got)
{
    int want;
    if (error_code(l->text, &want) < 0)
        return script_fail(r, l->lineno, "expected nothing or !INVALID, !STATE, !CONFIG...",
                           l->text);
    if (got != want)
        return tfail(r, l->lineno, "%s returned %d (%s), expected %d (%s)", call, got,
                    got ? smtpe_strerror(got) : "ok", want, want ? smtpe_strerror(want) : "ok");
    return 0;
}

/* The end of a session: every client octet and every event was matched. */
static int session_end(crun *r, int lineno)
{
    feed(r);
    collect(r);
    if (r->out_at < r->res->out.len) {
        hs_buf e = {0};
        hs_escape(&e, r->res->out.p + r->out_at, r->res->out.len - r->out_at);
        tfail(r, lineno, "the client sent octets no C< line matched: \"%.1500s\"", hs_buf_cstr(&e));
        hs_buf_free(&e);
        return -1;
    }
    if (r->ev_at < r->res->log.n) {
        hs_buf *ev = &r->res->log.items[r->ev_at];
        return tfail(r, lineno, "event not matched by an E: line: %.*s", (int)ev->len,
                    (const char *)ev->p);
    }
    smtpe_client_free(r->h.c);
    r->h.c = NULL;
    r->h.closed = 0;
    return 0;
}

static int session_new(crun *r, const cline *l)
{
    int rc;
    if (r->h.c && session_end(r, l->lineno) < 0)
        return -1;
    r->h.now = 0;
    r->h.write_blocked = 0;
    r->h.content_limited = 0;
    r->cfg_dirty = 0;
    r->made = 1;
    rc = ch_open(&r->h);
    if (rc != 0)
        r->h.c = NULL;
    if (check_result(r, l, "smtpe_client_new", rc) < 0)
        return -1;
    if (r->h.c)
        ch_pump(&r->h);
    collect(r);
    return 0;
}

/* ---- actions ---- */

static int do_submit(crun *r, const cline *l)
{
    ctxn *t = &r->draft, *s;
    int rc;
    if (!t->has_from)
        return script_fail(r, l->lineno, "SUBMIT without @from", l->text);
    s = calloc(1, sizeof *s);
    if (!s)
        abort();
    *s = *t;
    s->rcpts = t->nrcpt ? malloc(t->nrcpt * sizeof *t->rcpts) : NULL;
    s->xforward = t->nxforward ? malloc(t->nxforward * sizeof *t->xforward) : NULL;
    memset(&s->content, 0, sizeof s->content);
    hs_buf_add(&s->content, t->content.p, t->content.len);
    if (t->nrcpt)
        memcpy(s->rcpts, t->rcpts, t->nrcpt * sizeof *t->rcpts);
    if (t->nxforward)
        memcpy(s->xforward, t->xforward, t->nxforward * sizeof *t->xforward);
    s->txn.rcpts = s->rcpts;
    s->txn.rcpt_count = s->nrcpt;
    s->txn.xforward = s->xforward;
    s->txn.xforward_count = s->nxforward;
    if (s->scan) {
        smtpe_content_scan_init(&s->txn.content);
        smtpe_content_scan(&s->txn.content, s->content.p, s->content.len);
        smtpe_content_scan_end(&s->txn.content);
        s->txn.has_content_info = 1;
    }
    r->done = realloc(r->done, (r->ndone + 1) * sizeof *r->done);
    if (!r->done)
        abort();
    r->done[r->ndone++] = s;
    rc = smtpe_client_submit(r->h.c, &s->txn);
    if (rc == 0) { /* the host's content for this transaction */
        r->h.content = s->content.p;
        r->h.content_len = s->content.len;
        r->h.content_at = 0;
        r->h.piece = s->piece;
        r->h.abort_content = s->abort;
        r->h.content_limited = s->stall;
        r->h.content_limit = s->stall_at;
    }
    if (check_result(r, l, "smtpe_client_submit", rc) < 0)
        return -1;
    ch_pump(&r->h);
    return 0;
}

/* C<, CB<, CN<: the next client octets are exactly these. */
static int expect_out(crun *r, const cline *l)
{
    hs_buf want = {0}, one = {0}, e1 = {0}, e2 = {0};
    const char *text = l->text;
    uint64_t times = 1;
    size_t avail = r->res->out.len - r->out_at;
    int rc = 0;
    if (l->kind == L_CN) {
        const char *sp = strchr(text, ' ');
        char *num = sp ? dupn(text, (size_t)(sp - text)) : NULL;
        if (!num || parse_u64(num, &times) < 0 || quoted(r, l, sp + 1, &one) < 0)
            rc = script_fail(r, l->lineno, "CN< N \"text\"", text);
        free(num);
    } else if (unescape(r, l->lineno, text, &one) == 0) {
        if (l->kind == L_C)
            hs_buf_add(&one, "\r\n", 2);
    } else {
        rc = -1;
    }
    for (uint64_t i = 0; rc == 0 && i < times; i++)
        hs_buf_add(&want, one.p, one.len);
    if (rc == 0 && (avail < want.len || !hs_memeq(r->res->out.p + r->out_at, want.p, want.len))) {
        size_t show = avail < want.len + 40 ? avail : want.len + 40;
        hs_escape(&e1, want.p, want.len);
        hs_escape(&e2, r->res->out.p + r->out_at, show);
        rc = tfail(r, l->lineno, "expected the client to send \"%.1500s\", it sent \"%.1500s\"%s",
                  hs_buf_cstr(&e1), hs_buf_cstr(&e2), show < avail ? "..." : "");
    }
    if (rc == 0)
        r->out_at += want.len;
    hs_buf_free(&want);
    hs_buf_free(&one);
    hs_buf_free(&e1);
    hs_buf_free(&e2);
    return rc;
}

/* The pattern of an E: line in canonical form: literal runs unescaped and re-escaped as the
 * log escapes them, each unescaped "*" as WILD. */
static int pattern_canon(crun *r, const cline *l, hs_buf *out)
{
    const char *s = l->text;
    size_t i = 0, start = 0, n = strlen(s);
    hs_buf raw = {0};
    for (;; i++) {
        if (i < n && s[i] == '\\' && i + 1 < n) {
            i++;
            continue;
        }
        if (i < n && s[i] != '*')
            continue;
        hs_buf_reset(&raw);
        if (hs_unescape(&raw, s + start, i - start) < 0) {
            hs_buf_free(&raw);
            return script_fail(r, l->lineno, "malformed escape", s);
        }
        hs_escape(out, raw.p, raw.len);
        if (i >= n)
            break;
        hs_buf_add(out, "\001", 1);
        start = i + 1;
    }
    hs_buf_free(&raw);
    return 0;
}

/* Glob match of p (WILD matches any run of octets) against s. */
static int glob(const uint8_t *p, size_t pn, const uint8_t *s, size_t sn)
{
    size_t pi = 0, si = 0, star = SIZE_MAX, mark = 0;
    while (si < sn) {
        if (pi < pn && p[pi] == WILD) {
            star = pi++;
            mark = si;
        } else if (pi < pn && p[pi] == s[si]) {
            pi++;
            si++;
        } else if (star != SIZE_MAX) {
            pi = star + 1;
            si = ++mark;
        } else {
            return 0;
        }
    }
    while (pi < pn && p[pi] == WILD)
        pi++;
    return pi == pn;
}

static int expect_event(crun *r, const cline *l)
{
    hs_buf pat = {0};
    int rc = pattern_canon(r, l, &pat);
    if (rc == 0 && r->ev_at >= r->res->log.n) {
        rc = tfail(r, l->lineno, "expected the event \"%s\", there is none", l->text);
    } else if (rc == 0) {
        hs_buf *ev = &r->res->log.items[r->ev_at];
        if (!glob(pat.p, pat.len, ev->p, ev->len))
            rc = tfail(r, l->lineno, "expected the event \"%s\", got \"%.*s\"", l->text,
                      (int)ev->len, (const char *)ev->p);
        else
            r->ev_at++;
    }
    hs_buf_free(&pat);
    return rc;
}

static int expect_want(crun *r, const cline *l, const char *spec)
{
    static const struct {
        const char *name;
        unsigned bit;
    } bits[] = {{"READ", SMTPE_WANT_READ},   {"WRITE", SMTPE_WANT_WRITE},
                {"CLOSE", SMTPE_WANT_CLOSE}, {"VERDICT", SMTPE_WANT_VERDICT},
                {"EVENT", SMTPE_WANT_EVENT}, {"TLS", SMTPE_WANT_TLS},
                {"CONTENT", SMTPE_WANT_CONTENT}};
    unsigned w = smtpe_client_want(r->h.c);
    char *copy = dupn(spec, strlen(spec)), *save = NULL;
    int rc = 0;
    for (char *tok = strtok_r(copy, " ", &save); tok && rc == 0; tok = strtok_r(NULL, " ", &save)) {
        int neg = tok[0] == '!';
        size_t i;
        for (i = 0; i < sizeof bits / sizeof *bits; i++)
            if (strcmp(tok + neg, bits[i].name) == 0)
                break;
        if (i == sizeof bits / sizeof *bits)
            rc = script_fail(r, l->lineno, "WANT flag", tok);
        else if (((w & bits[i].bit) != 0) == neg)
            rc = tfail(r, l->lineno, "smtpe_client_want() is %#x: %s %s", w,
                      neg ? "has" : "lacks", bits[i].name);
    }
    free(copy);
    return rc;
}

static int do_time(crun *r, const cline *l)
{
    uint64_t ms;
    if (l->text[0] != '+' || parse_u64(l->text + 1, &ms) < 0)
        return script_fail(r, l->lineno, "TIME +ms", l->text);
    ch_time(&r->h, r->h.now + ms);
    return 0;
}

static int expect_deadline(crun *r, const cline *l)
{
    uint64_t want, got = smtpe_client_expiry(r->h.c, r->h.now);
    if (strcmp(l->text, "none") == 0)
        want = UINT64_MAX;
    else if (l->text[0] == '+' && parse_u64(l->text + 1, &want) == 0)
        want += r->h.now;
    else if (parse_u64(l->text, &want) < 0)
        return script_fail(r, l->lineno, "DEADLINE ms | +ms | none", l->text);
    if (got != want) {
        if (got == UINT64_MAX)
            return tfail(r, l->lineno, "no deadline, expected %llu (now %llu)",
                        (unsigned long long)want, (unsigned long long)r->h.now);
        return tfail(r, l->lineno, "deadline %llu, expected %s (now %llu)",
                    (unsigned long long)got, l->text, (unsigned long long)r->h.now);
    }
    return 0;
}

static int do_tls(crun *r, const cline *l)
{
    int rc;
    if (!l->text[0] && !(smtpe_client_want(r->h.c) & SMTPE_WANT_TLS))
        return tfail(r, l->lineno, "TLS, but the session does not want the handshake (want %#x)",
                    smtpe_client_want(r->h.c));
    rc = smtpe_client_tls_started(r->h.c, r->h.now);
    if (check_result(r, l, "smtpe_client_tls_started", rc) < 0)
        return -1;
    ch_pump(&r->h);
    return 0;
}

static int do_resume(crun *r, const cline *l)
{
    uint64_t n;
    if (!l->text[0]) {
        r->h.content_limited = 0;
    } else if (parse_u64(l->text, &n) == 0) {
        r->h.content_limited = 1;
        r->h.content_limit = (size_t)n;
    } else {
        return script_fail(r, l->lineno, "CONTENT_RESUME [n]", l->text);
    }
    ch_pump(&r->h);
    return 0;
}

/* A host call: QUIT, LOST, ABORT. */
static int do_call(crun *r, const cline *l)
{
    int rc;
    const char *name;
    if (l->kind == L_QUIT) {
        rc = smtpe_client_quit(r->h.c);
        name = "smtpe_client_quit";
    } else if (l->kind == L_LOST) {
        rc = smtpe_client_lost(r->h.c);
        name = "smtpe_client_lost";
    } else {
        rc = smtpe_client_abort_content(r->h.c);
        name = "smtpe_client_abort_content";
    }
    if (check_result(r, l, name, rc) < 0)
        return -1;
    ch_pump(&r->h);
    return 0;
}

static int do_action(crun *r, const cline *l)
{
    switch (l->kind) {
    case L_C:
    case L_CB:
    case L_CN: return expect_out(r, l);
    case L_SILENT:
        if (r->out_at < r->res->out.len) {
            hs_buf e = {0};
            hs_escape(&e, r->res->out.p + r->out_at, r->res->out.len - r->out_at);
            tfail(r, l->lineno, "SILENT, but the client sent \"%.1500s\"", hs_buf_cstr(&e));
            hs_buf_free(&e);
            return -1;
        }
        return 0;
    case L_E: return expect_event(r, l);
    case L_NOEVENT:
        if (r->ev_at < r->res->log.n)
            return tfail(r, l->lineno, "NOEVENT, but there is \"%.*s\"",
                        (int)r->res->log.items[r->ev_at].len,
                        (const char *)r->res->log.items[r->ev_at].p);
        return 0;
    case L_SUBMIT: return do_submit(r, l);
    case L_QUIT:
    case L_LOST:
    case L_ABORT: return do_call(r, l);
    case L_TLS: return do_tls(r, l);
    case L_TIME: return do_time(r, l);
    case L_DEADLINE: return expect_deadline(r, l);
    case L_WANT: return expect_want(r, l, l->text);
    case L_CLOSED: return expect_want(r, l, "CLOSE");
    case L_OPEN: return expect_want(r, l, "!CLOSE");
    case L_RESUME: return do_resume(r, l);
    case L_WBLOCK:
    case L_WRESUME:
        r->h.write_blocked = l->kind == L_WBLOCK;
        ch_pump(&r->h);
        return 0;
    default: return script_fail(r, l->lineno, "unexpected line", l->text);
    }
}

static int do_line(crun *r, const cline *l)
{
    hs_buf b = {0};
    if (l->kind == L_SET)
        return do_setting(r, l);
    if (l->kind == L_S || l->kind == L_SB) {
        if (unescape(r, l->lineno, l->text, &b) < 0) {
            hs_buf_free(&b);
            return -1;
        }
        hs_buf_add(&r->pending, b.p, b.len);
        if (l->kind == L_S)
            hs_buf_add(&r->pending, "\r\n", 2);
        hs_buf_free(&b);
        return 0;
    }
    if (l->kind == L_NEW)
        return session_new(r, l);
    if (!r->made) { /* the first action makes the session */
        cline implicit = {L_NEW, l->lineno, (char *)""};
        if (session_new(r, &implicit) < 0)
            return -1;
    }
    if (r->cfg_dirty)
        return script_fail(r, l->lineno, "config settings after the session was made need NEW",
                           l->text);
    if (!r->h.c)
        return tfail(r, l->lineno, "no session (NEW failed)");
    /* "TLS" before anything was fed is implicit TLS: nothing to feed first either way */
    feed(r);
    if (do_action(r, l) < 0)
        return -1;
    collect(r);
    return 0;
}

static void run_free(crun *r)
{
    smtpe_client_free(r->h.c);
    r->h.c = NULL;
    ch_free(&r->h);
    for (size_t i = 0; i < r->ndone; i++) {
        hs_buf_free(&r->done[i]->content);
        free(r->done[i]->rcpts);
        free(r->done[i]->xforward);
        free(r->done[i]);
    }
    free(r->done);
    for (size_t i = 0; i < r->npool; i++)
        free(r->pool[i]);
    free(r->pool);
    free(r->draft.rcpts);
    free(r->draft.xforward);
    hs_buf_free(&r->draft.content);
    hs_buf_free(&r->pending);
}

/* Runs sc once in mode. Returns 0, 1 (an expectation failed: the reason in err) or 2 (the
 * script is wrong). */
static int run_script(const cscript *sc, int mode, cresult *res, hs_buf *err)
{
    crun r;
    int rc = 0;
    memset(&r, 0, sizeof r);
    r.sc = sc;
    r.mode = mode;
    r.res = res;
    ch_init(&r.h);
    r.h.transcript = 1;
    r.h.manual_tls = 1;
    r.h.split = mode == HS_WHOLE ? CH_WHOLE : mode == HS_BYTEWISE ? CH_OCTET : CH_RANDOM;
    r.h.seed = (uint32_t)hs_hash(sc->name);
    draft_reset(&r.draft);
    for (size_t i = 0; i < sc->n && rc == 0; i++) {
        rc = do_line(&r, &sc->lines[i]);
        if (rc == 0 && sc->lines[i].kind != L_SET && sc->lines[i].kind != L_S &&
            sc->lines[i].kind != L_SB)
            hs_buf_addf(&res->trace, "%d: %zu %zu\n", sc->lines[i].lineno, res->out.len,
                        res->log.n);
    }
    if (rc == 0 && !r.made)
        rc = script_fail(&r, sc->n ? sc->lines[sc->n - 1].lineno : 0, "no action", sc->name);
    if (rc == 0 && r.h.c)
        rc = session_end(&r, sc->n ? sc->lines[sc->n - 1].lineno + 1 : 0);
    hs_buf_add(err, r.err.p, r.err.len);
    hs_buf_free(&r.err);
    run_free(&r);
    return rc == 0 ? 0 : r.script_error ? 2 : 1;
}

/* ---- the tests --------------------------------------------------------------------------- */

typedef struct tfile {
    cscript sc;
    int loaded;
    hs_buf load_err;
} tfile;

static void print_result(const char *label, cresult *res)
{
    hs_buf b = {0};
    hs_escape(&b, res->out.p, res->out.len);
    fprintf(stderr, "  %s client octets: \"%s\"\n  %s events:\n", label, hs_buf_cstr(&b), label);
    for (size_t i = 0; i < res->log.n; i++)
        fprintf(stderr, "    E: %.*s\n", (int)res->log.items[i].len,
                (const char *)res->log.items[i].p);
    hs_buf_free(&b);
}

static void result_free(cresult *res)
{
    hs_buf_free(&res->out);
    hs_log_free(&res->log);
    hs_buf_free(&res->trace);
}

/* Runs the three modes; returns 0, 1 (failed, the report in msg) or 2 (script error). */
static int run_three(tfile *f, hs_buf *msg, int verbose)
{
    static const int modes[3] = {HS_WHOLE, HS_BYTEWISE, HS_RANDOM};
    cresult res[3];
    int worst = 0;
    memset(res, 0, sizeof res);
    for (int m = 0; m < 3; m++) {
        int rc = run_script(&f->sc, modes[m], &res[m], msg);
        if (rc != 0 && verbose)
            print_result(hs_mode_name(modes[m]), &res[m]);
        if (rc > worst)
            worst = rc;
    }
    for (int m = 1; m < 3 && worst == 0; m++) {
        int same = res[m].out.len == res[0].out.len &&
                   hs_memeq(res[m].out.p, res[0].out.p, res[0].out.len) &&
                   hs_log_equal(&res[m].log, &res[0].log) &&
                   res[m].trace.len == res[0].trace.len &&
                   hs_memeq(res[m].trace.p, res[0].trace.p, res[0].trace.len);
        if (!same) {
            hs_buf_addf(msg, "%s: fed %s, the client octets, events or the points where they "
                        "came differ from the whole run\n", f->sc.path, hs_mode_name(modes[m]));
            if (verbose) {
                print_result("whole", &res[0]);
                print_result(hs_mode_name(modes[m]), &res[m]);
                fprintf(stderr, "  whole trace:\n%s  %s trace:\n%s", hs_buf_cstr(&res[0].trace),
                        hs_mode_name(modes[m]), hs_buf_cstr(&res[m].trace));
            }
            worst = 1;
        }
    }
    for (int m = 0; m < 3; m++)
        result_free(&res[m]);
    return worst;
}

static void run_file(void **state)
{
    tfile *f = *state;
    hs_buf msg = {0};
    int rc;
    if (!f->loaded)
        fail_msg("%s", hs_buf_cstr(&f->load_err));
    rc = run_three(f, &msg, !f->sc.known_bug);
    if (f->sc.known_bug && rc == 1) {
        fprintf(stderr, "KNOWN BUG %s: %s\n  it fails as expected: %s", f->sc.name,
                f->sc.known_bug, hs_buf_cstr(&msg));
        hs_buf_free(&msg);
        return;
    }
    if (f->sc.known_bug && rc == 0) {
        hs_buf_free(&msg);
        fail_msg("%s is marked @known_bug (%s) but passes: remove the mark", f->sc.path,
                 f->sc.known_bug);
    }
    if (rc != 0) {
        fprintf(stderr, "%s", hs_buf_cstr(&msg));
        hs_buf_free(&msg);
        fail_msg("client transcript %s failed (see above)", f->sc.path);
    }
    hs_buf_free(&msg);
}

static char **g_names;
static size_t g_count;

/* Every case of shared/conformance/client-cases.md has a transcript. */
static void required_cases_present(void **state)
{
    (void)state;
    for (int q = 1; q <= 14; q++) {
        char prefix[8];
        int found = 0;
        snprintf(prefix, sizeof prefix, "q%02d-", q);
        for (size_t k = 0; k < g_count && !found; k++)
            found = strncmp(g_names[k], prefix, strlen(prefix)) == 0;
        if (!found)
            fail_msg("no client transcript %s*.txt", prefix);
    }
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : SMTPE_CLIENT_TRANSCRIPT_DIR;
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d) {
        fprintf(stderr, "test_client_transcripts: cannot open %s\n", dir);
        return 1;
    }
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".txt") != 0 || e->d_name[0] == '.')
            continue;
        g_names = realloc(g_names, (g_count + 1) * sizeof *g_names);
        g_names[g_count++] = dupn(e->d_name, l);
    }
    closedir(d);
    if (g_count == 0) {
        fprintf(stderr, "test_client_transcripts: no *.txt files in %s\n", dir);
        return 1;
    }
    qsort(g_names, g_count, sizeof *g_names, cmp_names);
    tfile *files = calloc(g_count, sizeof *files);
    struct CMUnitTest *tests = calloc(g_count + 1, sizeof *tests);
    if (!files || !tests)
        return 1;
    tests[0].name = "required client conformance transcripts present";
    tests[0].test_func = required_cases_present;
    for (size_t i = 0; i < g_count; i++) {
        char *path = malloc(strlen(dir) + strlen(g_names[i]) + 2);
        sprintf(path, "%s/%s", dir, g_names[i]);
        files[i].loaded = script_load(&files[i].sc, path, &files[i].load_err) == 0;
        free(path);
        tests[i + 1].name = files[i].sc.name;
        tests[i + 1].test_func = run_file;
        tests[i + 1].initial_state = &files[i];
    }
    int failed = _cmocka_run_group_tests("client_transcripts", tests, g_count + 1, NULL, NULL);
    size_t known = 0;
    for (size_t i = 0; i < g_count; i++)
        known += files[i].sc.known_bug != NULL;
    if (known) {
        fprintf(stderr, "known bugs (files marked @known_bug, expected to fail): %zu\n", known);
        for (size_t i = 0; i < g_count; i++)
            if (files[i].sc.known_bug)
                fprintf(stderr, "  %s: %s\n", files[i].sc.name, files[i].sc.known_bug);
    }
    for (size_t i = 0; i < g_count; i++) {
        script_free(&files[i].sc);
        hs_buf_free(&files[i].load_err);
        free(g_names[i]);
    }
    free(g_names);
    free(files);
    free(tests);
    return failed;
}
