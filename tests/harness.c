/* harness.c - helpers shared by the smtpe tests. See harness.h. */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable buffers -------------------------------------------------------------------- */

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "harness: out of memory\n");
        abort();
    }
    return q;
}

static void buf_reserve(hs_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void hs_buf_add(hs_buf *b, const void *p, size_t n)
{
    buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

void hs_buf_adds(hs_buf *b, const char *s) { hs_buf_add(b, s, strlen(s)); }

void hs_buf_addf(hs_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    buf_reserve(b, (size_t)k + 1);
    va_start(ap, fmt);
    vsnprintf((char *)b->p + b->len, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)k;
}

void hs_buf_reset(hs_buf *b) { b->len = 0; }

void hs_buf_free(hs_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

const char *hs_buf_cstr(hs_buf *b)
{
    buf_reserve(b, 0);
    b->p[b->len] = 0;
    return (const char *)b->p;
}

/* ---- escapes ----------------------------------------------------------------------------- */

int hs_output_differs(const hs_buf *got, const char *want, hs_buf *msg)
{
    size_t n = strlen(want);
    hs_buf a = {0}, b = {0};
    if (got->len == n && hs_memeq(got->p, want, n))
        return 0;
    hs_escape(&a, got->p, got->len);
    hs_escape(&b, (const uint8_t *)want, n);
    hs_buf_addf(msg, "output mismatch\n  got:      \"%s\"\n  expected: \"%s\"", hs_buf_cstr(&a),
                hs_buf_cstr(&b));
    hs_buf_free(&a);
    hs_buf_free(&b);
    return 1;
}

void hs_escape(hs_buf *out, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        switch (c) {
        case '\r': hs_buf_adds(out, "\\r"); break;
        case '\n': hs_buf_adds(out, "\\n"); break;
        case '\t': hs_buf_adds(out, "\\t"); break;
        case '\\': hs_buf_adds(out, "\\\\"); break;
        case '"': hs_buf_adds(out, "\\\""); break;
        default:
            if (c < 0x20 || c > 0x7e)
                hs_buf_addf(out, "\\x%02x", c);
            else
                hs_buf_add(out, &c, 1);
        }
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int hs_unescape(hs_buf *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c != '\\') {
            hs_buf_add(out, &c, 1);
            continue;
        }
        if (++i >= n)
            return -1;
        switch (s[i]) {
        case 'r': c = '\r'; break;
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case '0': c = 0; break;
        case '\\': c = '\\'; break;
        case '"': c = '"'; break;
        case '\'': c = '\''; break;
        case '*': c = '*'; break;
        case 'x': {
            if (i + 2 >= n)
                return -1;
            int h = hexval(s[i + 1]), l = hexval(s[i + 2]);
            if (h < 0 || l < 0)
                return -1;
            c = (uint8_t)(h * 16 + l);
            i += 2;
            break;
        }
        default:
            return -1;
        }
        hs_buf_add(out, &c, 1);
    }
    return 0;
}

/* ---- counting allocator ------------------------------------------------------------------ */

static void *count_alloc(size_t size, void *ud)
{
    hs_alloc *a = ud;
    a->attempts++;
    a->requested = size;
    if (a->fail_from && a->attempts >= a->fail_from)
        return NULL;
    void *p = malloc(size ? size : 1);
    if (!p)
        return NULL;
    /* Fill with garbage so that a session relying on zeroed memory shows up. */
    memset(p, 0xa5, size);
    a->allocs++;
    a->bytes = size;
    a->last = p;
    return p;
}

static void count_free(void *p, void *ud)
{
    hs_alloc *a = ud;
    a->frees++;
    a->last_freed = p;
    free(p);
}

void hs_alloc_init(hs_alloc *a) { memset(a, 0, sizeof *a); }

smtpe_allocator hs_alloc_hook(hs_alloc *a)
{
    smtpe_allocator h = {count_alloc, count_free, a};
    return h;
}

/* ---- event log --------------------------------------------------------------------------- */

void hs_log_add(hs_log *log, const uint8_t *p, size_t n)
{
    if (log->n == log->cap) {
        log->cap = log->cap ? log->cap * 2 : 16;
        log->items = xrealloc(log->items, log->cap * sizeof *log->items);
    }
    hs_buf *b = &log->items[log->n++];
    memset(b, 0, sizeof *b);
    hs_buf_add(b, p, n);
}

void hs_log_free(hs_log *log)
{
    for (size_t i = 0; i < log->n; i++)
        hs_buf_free(&log->items[i]);
    free(log->items);
    memset(log, 0, sizeof *log);
}

int hs_log_equal(const hs_log *a, const hs_log *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++) {
        if (a->items[i].len != b->items[i].len)
            return 0;
        if (a->items[i].len && memcmp(a->items[i].p, b->items[i].p, a->items[i].len) != 0)
            return 0;
    }
    return 1;
}

static void add_span(hs_buf *out, smtpe_span sp)
{
    if (sp.len)
        hs_buf_add(out, sp.ptr, sp.len);
}

static int span_eq3(smtpe_span whole, smtpe_span a, const char *mid, smtpe_span b)
{
    size_t m = strlen(mid);
    if (whole.len != a.len + m + b.len)
        return 0;
    if (a.len && memcmp(whole.ptr, a.ptr, a.len) != 0)
        return 0;
    if (memcmp(whole.ptr + a.len, mid, m) != 0)
        return 0;
    if (b.len && memcmp(whole.ptr + a.len + m, b.ptr, b.len) != 0)
        return 0;
    return 1;
}

static int format_path(hs_buf *out, const smtpe_path *p, hs_buf *err)
{
    static const struct {
        unsigned flag;
        const char *name;
    } names[] = {{SMTPE_PATH_NULL, "null"},       {SMTPE_PATH_POSTMASTER, "postmaster"},
                 {SMTPE_PATH_QUOTED, "quoted"},   {SMTPE_PATH_ADDR_LITERAL, "literal"},
                 {SMTPE_PATH_SOURCE_ROUTE, "route"}, {SMTPE_PATH_UTF8, "utf8"}};
    hs_buf_adds(out, "<");
    if (p->flags & SMTPE_PATH_NULL) {
        if (p->mailbox.len || p->local_part.len || p->domain.len) {
            hs_buf_adds(err, "null path with non-empty spans");
            return -1;
        }
    } else if (p->domain.len == 0) {
        /* only <postmaster> has no domain */
        add_span(out, p->local_part);
    } else {
        if (!span_eq3(p->mailbox, p->local_part, "@", p->domain)) {
            hs_buf_adds(err, "path mailbox span is not local-part \"@\" domain: mailbox \"");
            hs_escape(err, p->mailbox.ptr, p->mailbox.len);
            hs_buf_adds(err, "\"");
            return -1;
        }
        add_span(out, p->mailbox);
    }
    hs_buf_adds(out, ">");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (p->flags & names[i].flag) {
            hs_buf_adds(out, " ");
            hs_buf_adds(out, names[i].name);
        }
    unsigned known = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        known |= names[i].flag;
    if (p->flags & ~known)
        hs_buf_addf(out, " flags=0x%x", p->flags & ~known);
    return 0;
}

static void format_params(hs_buf *out, const smtpe_param *params, size_t n)
{
    if (n == 0)
        return;
    hs_buf_adds(out, " [");
    for (size_t i = 0; i < n && i < SMTPE_MAX_PARAMS; i++) {
        if (i)
            hs_buf_adds(out, " ");
        add_span(out, params[i].keyword);
        if (params[i].value.len) {
            hs_buf_adds(out, "=");
            add_span(out, params[i].value);
        }
    }
    hs_buf_adds(out, "]");
}

static void format_quoted(hs_buf *out, smtpe_span sp)
{
    hs_buf_adds(out, "\"");
    add_span(out, sp);
    hs_buf_adds(out, "\"");
}

static int format_auth(hs_buf *out, const smtpe_event *ev, hs_buf *err)
{
    hs_buf_adds(out, "AUTH ");
    add_span(out, ev->auth.mechanism);
    switch (ev->auth.mechanism_id) {
    case SMTPE_SASL_PLAIN:
    case SMTPE_SASL_LOGIN:
        if (ev->auth.mechanism_id == SMTPE_SASL_PLAIN || ev->auth.authzid.len) {
            hs_buf_adds(out, " authzid=");
            format_quoted(out, ev->auth.authzid);
        }
        hs_buf_adds(out, " authcid=");
        format_quoted(out, ev->auth.authcid);
        hs_buf_adds(out, " password=");
        format_quoted(out, ev->auth.password);
        return 0;
    case SMTPE_SASL_OTHER:
        hs_buf_addf(out, " step=%u response=", ev->auth.step);
        if (ev->auth.has_response) {
            format_quoted(out, ev->auth.response);
        } else {
            if (ev->auth.response.len) {
                hs_buf_adds(err, "AUTH response span without has_response");
                return -1;
            }
            hs_buf_adds(out, "none");
        }
        return 0;
    default:
        hs_buf_addf(err, "AUTH with unknown mechanism_id %d", ev->auth.mechanism_id);
        return -1;
    }
}

static void format_addr(hs_buf *out, int family, const uint8_t *addr, uint16_t port)
{
    char text[INET6_ADDRSTRLEN];
    if (family == SMTPE_PROXY_AF_INET) {
        inet_ntop(AF_INET, addr, text, sizeof text);
        hs_buf_addf(out, "%s:%u", text, (unsigned)port);
    } else {
        inet_ntop(AF_INET6, addr, text, sizeof text);
        hs_buf_addf(out, "[%s]:%u", text, (unsigned)port);
    }
}

static int format_proxy(hs_buf *out, const smtpe_proxy_info *p, hs_buf *err)
{
    static const char *const families[] = {"unspec", "inet", "inet6", "unix"};
    if (p->version != 1 && p->version != 2) {
        hs_buf_addf(err, "PROXY version %d", p->version);
        return -1;
    }
    if (p->family < 0 || p->family > SMTPE_PROXY_AF_UNIX) {
        hs_buf_addf(err, "PROXY family %d", p->family);
        return -1;
    }
    hs_buf_addf(out, "PROXY v%d", p->version);
    if (p->local)
        hs_buf_adds(out, " local");
    if (p->family != SMTPE_PROXY_AF_UNSPEC) {
        hs_buf_addf(out, " %s", families[p->family]);
        if (p->transport == SMTPE_PROXY_TRANSPORT_DGRAM)
            hs_buf_adds(out, " dgram");
        else if (p->transport != SMTPE_PROXY_TRANSPORT_STREAM)
            hs_buf_addf(out, " transport=%d", p->transport);
        if (p->family != SMTPE_PROXY_AF_UNIX) {
            hs_buf_adds(out, " ");
            format_addr(out, p->family, p->src_addr, p->src_port);
            hs_buf_adds(out, " -> ");
            format_addr(out, p->family, p->dst_addr, p->dst_port);
        }
    }
    if (p->tlvs.len) {
        if (p->version == 1) {
            hs_buf_adds(err, "PROXY v1 with TLVs");
            return -1;
        }
        /* smtpe_proxy_tlv_next must walk exactly the octets given */
        smtpe_span walk = p->tlvs;
        uint8_t type;
        smtpe_span value;
        size_t covered = 0;
        while (smtpe_proxy_tlv_next(&walk, &type, &value))
            covered += 3 + value.len;
        if (covered != p->tlvs.len || walk.len != 0) {
            hs_buf_addf(err, "PROXY TLVs of %zu octets, but smtpe_proxy_tlv_next walks %zu",
                        p->tlvs.len, covered);
            return -1;
        }
        hs_buf_adds(out, " tlvs=");
        for (size_t i = 0; i < p->tlvs.len; i++)
            hs_buf_addf(out, "%02x", p->tlvs.ptr[i]);
    }
    return 0;
}

static int format_event_body(hs_buf *out, const smtpe_event *ev, hs_buf *err)
{
    switch (ev->type) {
    case SMTPE_EV_HELO:
        if (ev->helo.lmtp && !ev->helo.esmtp) {
            hs_buf_adds(err, "HELO event with lmtp set but esmtp not");
            return -1;
        }
        hs_buf_adds(out, ev->helo.lmtp ? "LHLO " : ev->helo.esmtp ? "EHLO " : "HELO ");
        add_span(out, ev->helo.domain);
        return 0;
    case SMTPE_EV_MAIL:
        hs_buf_adds(out, "MAIL ");
        if (format_path(out, &ev->mail.reverse_path, err) < 0)
            return -1;
        if (ev->mail.has_size)
            hs_buf_addf(out, " size=%llu", (unsigned long long)ev->mail.size);
        if (ev->mail.body == SMTPE_BODY_7BIT)
            hs_buf_adds(out, " body=7BIT");
        else if (ev->mail.body == SMTPE_BODY_8BITMIME)
            hs_buf_adds(out, " body=8BITMIME");
        else if (ev->mail.body == SMTPE_BODY_BINARYMIME)
            hs_buf_adds(out, " body=BINARYMIME");
        else if (ev->mail.body != SMTPE_BODY_UNSPECIFIED)
            hs_buf_addf(out, " body=%d", (int)ev->mail.body);
        if (ev->mail.smtputf8)
            hs_buf_adds(out, " smtputf8");
        if (ev->mail.ret == SMTPE_RET_FULL)
            hs_buf_adds(out, " ret=FULL");
        else if (ev->mail.ret == SMTPE_RET_HDRS)
            hs_buf_adds(out, " ret=HDRS");
        else if (ev->mail.ret != SMTPE_RET_UNSPECIFIED)
            hs_buf_addf(out, " ret=%d", (int)ev->mail.ret);
        if (ev->mail.has_envid) {
            hs_buf_adds(out, " envid=");
            format_quoted(out, ev->mail.envid);
        } else if (ev->mail.envid.len) {
            hs_buf_adds(err, "MAIL envid span without has_envid");
            return -1;
        }
        if (ev->mail.has_auth) {
            hs_buf_adds(out, " auth=");
            format_quoted(out, ev->mail.auth);
        } else if (ev->mail.auth.len) {
            hs_buf_adds(err, "MAIL auth span without has_auth");
            return -1;
        }
        if (ev->mail.requiretls)
            hs_buf_adds(out, " requiretls");
        if (ev->mail.has_mt_priority)
            hs_buf_addf(out, " mt_priority=%d", ev->mail.mt_priority);
        if (ev->mail.by_mode) {
            hs_buf_addf(out, " by=%lld;%c%s", (long long)ev->mail.by_time, ev->mail.by_mode,
                        ev->mail.by_trace ? "T" : "");
        } else if (ev->mail.by_trace || ev->mail.by_time) {
            hs_buf_adds(err, "MAIL BY= fields without by_mode");
            return -1;
        }
        if (ev->mail.param_count > SMTPE_MAX_PARAMS) {
            hs_buf_addf(err, "MAIL param_count %zu", ev->mail.param_count);
            return -1;
        }
        format_params(out, ev->mail.params, ev->mail.param_count);
        return 0;
    case SMTPE_EV_RCPT:
        hs_buf_adds(out, "RCPT ");
        if (format_path(out, &ev->rcpt.forward_path, err) < 0)
            return -1;
        if (ev->rcpt.notify) {
            static const struct {
                unsigned bit;
                const char *name;
            } nn[] = {{SMTPE_NOTIFY_NEVER, "never"},
                      {SMTPE_NOTIFY_SUCCESS, "success"},
                      {SMTPE_NOTIFY_FAILURE, "failure"},
                      {SMTPE_NOTIFY_DELAY, "delay"}};
            unsigned rest = ev->rcpt.notify;
            const char *sep = " notify=";
            for (size_t i = 0; i < sizeof nn / sizeof nn[0]; i++)
                if (rest & nn[i].bit) {
                    hs_buf_addf(out, "%s%s", sep, nn[i].name);
                    sep = ",";
                    rest &= ~nn[i].bit;
                }
            if (rest)
                hs_buf_addf(out, "%s0x%x", sep, rest);
        }
        if (ev->rcpt.has_orcpt) {
            hs_buf_adds(out, " orcpt=");
            add_span(out, ev->rcpt.orcpt_type);
            hs_buf_adds(out, ";");
            format_quoted(out, ev->rcpt.orcpt);
        } else if (ev->rcpt.orcpt.len || ev->rcpt.orcpt_type.len) {
            hs_buf_adds(err, "RCPT orcpt spans without has_orcpt");
            return -1;
        }
        if (ev->rcpt.param_count > SMTPE_MAX_PARAMS) {
            hs_buf_addf(err, "RCPT param_count %zu", ev->rcpt.param_count);
            return -1;
        }
        format_params(out, ev->rcpt.params, ev->rcpt.param_count);
        return 0;
    case SMTPE_EV_DATA: hs_buf_adds(out, "DATA"); return 0;
    case SMTPE_EV_DATA_END:
        hs_buf_adds(out, "DATA_END ");
        switch (ev->data_end.status) {
        case SMTPE_DATA_OK: hs_buf_adds(out, "ok"); break;
        case SMTPE_DATA_TOO_BIG: hs_buf_adds(out, "too_big"); break;
        case SMTPE_DATA_BAD_LINE_ENDING: hs_buf_adds(out, "bad_line_ending"); break;
        default: hs_buf_addf(out, "status=%d", ev->data_end.status);
        }
        hs_buf_addf(out, " size=%llu", (unsigned long long)ev->data_end.size);
        if (ev->data_end.flags & SMTPE_DATA_NORMALISED)
            hs_buf_adds(out, " normalised");
        if (ev->data_end.flags & SMTPE_DATA_HAS_8BIT)
            hs_buf_adds(out, " 8bit");
        if (ev->data_end.flags & ~(SMTPE_DATA_NORMALISED | SMTPE_DATA_HAS_8BIT))
            hs_buf_addf(out, " flags=0x%x",
                        ev->data_end.flags & ~(SMTPE_DATA_NORMALISED | SMTPE_DATA_HAS_8BIT));
        if (ev->data_end.chunked)
            hs_buf_adds(out, " chunked");
        if (ev->data_end.replies != 1)
            hs_buf_addf(out, " replies=%u", ev->data_end.replies);
        return 0;
    case SMTPE_EV_RSET: hs_buf_adds(out, "RSET"); return 0;
    case SMTPE_EV_QUIT: hs_buf_adds(out, "QUIT"); return 0;
    case SMTPE_EV_TIMEOUT: hs_buf_adds(out, "TIMEOUT"); return 0;
    case SMTPE_EV_ERROR_LIMIT: hs_buf_adds(out, "ERROR_LIMIT"); return 0;
    case SMTPE_EV_VRFY:
    case SMTPE_EV_EXPN:
        hs_buf_adds(out, ev->type == SMTPE_EV_VRFY ? "VRFY " : "EXPN ");
        format_quoted(out, ev->command.argument);
        return 0;
    case SMTPE_EV_UNKNOWN:
        hs_buf_adds(out, "UNKNOWN ");
        format_quoted(out, ev->command.verb);
        hs_buf_adds(out, " ");
        format_quoted(out, ev->command.argument);
        return 0;
    case SMTPE_EV_STARTTLS: hs_buf_adds(out, "STARTTLS"); return 0;
    case SMTPE_EV_AUTH: return format_auth(out, ev, err);
    case SMTPE_EV_BDAT:
        hs_buf_addf(out, "BDAT %llu", (unsigned long long)ev->bdat.size);
        if (ev->bdat.last)
            hs_buf_adds(out, " last");
        if (ev->bdat.first)
            hs_buf_adds(out, " first");
        return 0;
    case SMTPE_EV_CHUNK_END:
        /* the chunk's size; "last" would be an engine error (a LAST chunk ends in DATA_END) */
        hs_buf_addf(out, "CHUNK_END %llu", (unsigned long long)ev->bdat.size);
        if (ev->bdat.last)
            hs_buf_adds(out, " last");
        if (ev->bdat.first)
            hs_buf_adds(out, " first");
        return 0;
    case SMTPE_EV_PROXY: return format_proxy(out, &ev->proxy, err);
    case SMTPE_EV_PROXY_INVALID: hs_buf_adds(out, "PROXY_INVALID"); return 0;
    case SMTPE_EV_XCLIENT:
    case SMTPE_EV_XFORWARD:
        hs_buf_adds(out, ev->type == SMTPE_EV_XCLIENT ? "XCLIENT" : "XFORWARD");
        if (ev->xclient.count > SMTPE_MAX_PARAMS) {
            hs_buf_addf(err, "XCLIENT/XFORWARD count %zu", ev->xclient.count);
            return -1;
        }
        for (size_t i = 0; i < ev->xclient.count; i++) {
            hs_buf_adds(out, " ");
            add_span(out, ev->xclient.attrs[i].keyword);
            hs_buf_adds(out, "=");
            add_span(out, ev->xclient.attrs[i].value);
        }
        return 0;
    default:
        hs_buf_addf(err, "event of unknown type %d", (int)ev->type);
        return -1;
    }
}

int hs_format_event(hs_buf *out, const smtpe_event *ev, hs_buf *err)
{
    if (format_event_body(out, ev, err) < 0)
        return -1;
    if (ev->abandoned == 1)
        hs_buf_adds(out, " abandoned");
    else if (ev->abandoned != 0)
        hs_buf_addf(out, " abandoned=%d", ev->abandoned);
    return 0;
}

/* ---- splitting --------------------------------------------------------------------------- */

uint64_t hs_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ull;
    }
    return h;
}

void hs_splitter_init(hs_splitter *sp, int mode, uint64_t seed)
{
    sp->mode = mode;
    sp->state = seed ? seed : 0x9e3779b97f4a7c15ull;
}

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

size_t hs_splitter_next(hs_splitter *sp, size_t remaining)
{
    if (sp->mode == HS_WHOLE || remaining <= 1)
        return remaining;
    if (sp->mode == HS_BYTEWISE)
        return 1;
    uint64_t r = rng_next(&sp->state);
    size_t k;
    switch (r % 10) {
    case 0: case 1: case 2: case 3: case 4: k = 1 + (size_t)((r >> 8) % 8); break;
    case 5: case 6: case 7: k = 1 + (size_t)((r >> 8) % 80); break;
    case 8: k = 1 + (size_t)((r >> 8) % 2000); break;
    default: k = remaining; break;
    }
    return k < remaining ? k : remaining;
}

const char *hs_mode_name(int mode)
{
    switch (mode) {
    case HS_WHOLE: return "whole";
    case HS_BYTEWISE: return "bytewise";
    default: return "random";
    }
}

/* ---- session driver ---------------------------------------------------------------------- */

void hs_sess_fail(hs_sess *s, const char *fmt, ...)
{
    if (s->failed)
        return;
    s->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    char tmp[2048];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    hs_buf_adds(&s->err, tmp);
}

int hs_sess_open(hs_sess *s, const smtpe_server_config *cfg, uint64_t now)
{
    memset(s, 0, sizeof *s);
    s->cfg = cfg;
    hs_alloc_init(&s->alloc);
    s->hook = hs_alloc_hook(&s->alloc);
    s->now = now;
    return smtpe_server_new(&s->srv, cfg, &s->hook, now);
}

int hs_sess_close(hs_sess *s)
{
    int rc = 0;
    if (s->srv) {
        smtpe_server_free(s->srv);
        if (s->alloc.frees != 1 || s->alloc.last_freed != s->alloc.last)
            rc = -1;
    }
    s->srv = NULL;
    hs_buf_free(&s->out);
    hs_buf_free(&s->content);
    hs_log_free(&s->log);
    hs_buf_free(&s->err);
    return rc;
}

void hs_sess_flush_content(hs_sess *s)
{
    if (!s->in_content)
        return;
    hs_buf line = {0};
    hs_buf_adds(&line, "CONTENT \"");
    hs_buf_add(&line, s->content.p, s->content.len);
    hs_buf_adds(&line, "\"");
    hs_log_add(&s->log, line.p, line.len);
    hs_buf_free(&line);
    hs_buf_reset(&s->content);
    s->in_content = 0;
}

/* The size of the session's output ring as smtpe.h gives it (smtpe_server_memory_size): O + L
 * with O = max(reply_buffer_size, R + 600) + (N - 1) * B, R = max(2560, E), E the EHLO reply's
 * bound, B one command line buffer (max_line_length - 2, at least 512 when N > 1) and L the
 * LMTP room of 512 octets per recipient. No run of output can be longer. */
static size_t reply_ring_size(const smtpe_server_config *c)
{
    size_t n = c->max_pending_verdicts ? c->max_pending_verdicts : 1;
    size_t b = c->max_line_length - 2;
    if (n > 1 && b < 512)
        b = 512;
    size_t e = 1100 + (c->auth_mechanisms ? strlen(c->auth_mechanisms) : 0);
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        e += 6 + strlen(c->ehlo_extra[i]);
    size_t r = e > 2560 ? e : 2560;
    size_t o = c->reply_buffer_size > r + 600 ? c->reply_buffer_size : r + 600;
    o += (n - 1) * b;
    return o + (c->lmtp ? 512 * (size_t)c->max_recipients : 0);
}

/* Takes the queued output into s->out. Returns the octets taken, 0 when there were none or on
 * a failure (s->failed). */
static size_t take_output(hs_sess *s)
{
    size_t len = 0;
    const uint8_t *p = smtpe_server_send_buf(s->srv, &len);
    if (len == 0)
        return 0;
    if (!p) {
        hs_sess_fail(s, "smtpe_server_send_buf gave NULL with length %zu", len);
        return 0;
    }
    /* stable output: called again before the ack, the same address, at least as long */
    size_t len2 = 0;
    const uint8_t *p2 = smtpe_server_send_buf(s->srv, &len2);
    if (p2 != p || len2 < len) {
        hs_sess_fail(s, "smtpe_server_send_buf called twice gave %p/%zu, then %p/%zu",
                     (const void *)p, len, (const void *)p2, len2);
        return 0;
    }
    if (len > reply_ring_size(s->cfg))
        hs_sess_fail(s, "smtpe_server_send_buf gave %zu octets, more than the reply ring holds "
                        "(%zu, smtpe_server_memory_size in smtpe.h)", len, reply_ring_size(s->cfg));
    hs_buf_add(&s->out, p, len);
    int rc = smtpe_server_send_ack(s->srv, len);
    if (rc != 0) {
        hs_sess_fail(s, "smtpe_server_send_ack returned %d", rc);
        return 0;
    }
    return len;
}

static void handle_event(hs_sess *s, const smtpe_event *ev)
{
    if (ev->type == SMTPE_EV_DATA_CHUNK) {
        if (ev->chunk.len && !ev->chunk.ptr)
            hs_sess_fail(s, "DATA_CHUNK with NULL pointer and length %zu", ev->chunk.len);
        else
            hs_buf_add(&s->content, ev->chunk.ptr, ev->chunk.len);
        s->in_content = 1;
        return;
    }
    /* Every message gets one CONTENT entry, just before its DATA_END, even an empty one; the
     * BDAT and CHUNK_END events of a chunked message do not split it (where the engine hands
     * over an octet at a chunk boundary, e.g. a CR that may start a CRLF, is its own affair). */
    if (ev->type == SMTPE_EV_DATA_END)
        s->in_content = 1;
    if (ev->type != SMTPE_EV_BDAT && ev->type != SMTPE_EV_CHUNK_END)
        hs_sess_flush_content(s);
    hs_buf line = {0}, err = {0};
    if (hs_format_event(&line, ev, &err) < 0)
        hs_sess_fail(s, "bad event: %s", hs_buf_cstr(&err));
    hs_log_add(&s->log, line.p, line.len);
    hs_buf_free(&line);
    hs_buf_free(&err);
    if (ev->type == SMTPE_EV_STARTTLS) {
        /* Replies queued before this event belong to earlier commands (RFC 2920 order): take
         * them now, so that the output after the mark is this event's reply alone. */
        while (!s->failed && take_output(s) > 0) {
        }
        smtpe_server_stats st;
        smtpe_server_get_stats(s->srv, &st);
        s->tls_mark = 1;
        s->tls_mark_log = s->log.n;
        s->tls_mark_out = s->out.len;
        s->tls_mark_consumed = s->consumed;
        s->tls_mark_discarded = st.discarded_octets;
    }
    if (smtpe_event_needs_reply(ev)) {
        if (s->verdict) {
            if (s->verdict(s, ev, s->verdict_ud) < 0)
                hs_sess_fail(s, "verdict failed");
        } else {
            /* under LMTP the end of the content takes one verdict per recipient */
            unsigned n = ev->type == SMTPE_EV_DATA_END && ev->data_end.replies > 1
                             ? ev->data_end.replies
                             : 1;
            for (unsigned i = 0; i < n && !s->failed &&
                             (smtpe_server_want(s->srv) & SMTPE_WANT_VERDICT);
                 i++) {
                int rc = smtpe_server_accept(s->srv);
                if (rc != 0)
                    hs_sess_fail(s, "smtpe_server_accept returned %d (%s)", rc,
                                 smtpe_strerror(rc));
            }
        }
    }
}

/* 1 if p[0..n) is exactly one reply with the given code: "ccc-text" lines, then "ccc text". */
static int is_one_reply(const uint8_t *p, size_t n, unsigned code)
{
    char c[4];
    snprintf(c, sizeof c, "%03u", code);
    size_t i = 0;
    while (i < n) {
        size_t e = i;
        while (e + 1 < n && !(p[e] == '\r' && p[e + 1] == '\n'))
            e++;
        if (e + 1 >= n || e - i < 4 || memcmp(p + i, c, 3) != 0)
            return 0;
        if (p[i + 3] == ' ')
            return e + 2 == n;
        if (p[i + 3] != '-')
            return 0;
        i = e + 2;
    }
    return 0;
}

int hs_sess_tls(hs_sess *s, int implicit)
{
    if (s->failed)
        return -1;
    if (!implicit) {
        unsigned want = smtpe_server_want(s->srv);
        if (!(want & SMTPE_WANT_TLS)) {
            hs_sess_fail(s, "TLS, but the session does not want a TLS handshake (want=0x%x)",
                         want);
            return -1;
        }
        if (!s->tls_mark) {
            hs_sess_fail(s, "the session wants a TLS handshake without a STARTTLS event");
            return -1;
        }
        if (s->log.n != s->tls_mark_log) {
            hs_buf d = {0};
            hs_escape(&d, s->log.items[s->tls_mark_log].p, s->log.items[s->tls_mark_log].len);
            hs_sess_fail(s, "an event between the STARTTLS reply and the handshake: %s",
                         hs_buf_cstr(&d));
            hs_buf_free(&d);
            return -1;
        }
        if (!is_one_reply(s->out.p + s->tls_mark_out, s->out.len - s->tls_mark_out, 220)) {
            hs_buf d = {0};
            hs_escape(&d, s->out.p + s->tls_mark_out, s->out.len - s->tls_mark_out);
            hs_sess_fail(s, "between STARTTLS and the handshake the server sent \"%s\", not "
                            "exactly one 220 reply", hs_buf_cstr(&d));
            hs_buf_free(&d);
            return -1;
        }
        smtpe_server_stats st;
        smtpe_server_get_stats(s->srv, &st);
        uint64_t fed = s->consumed - s->tls_mark_consumed;
        uint64_t discarded = st.discarded_octets - s->tls_mark_discarded;
        if (fed != discarded) {
            hs_sess_fail(s, "%llu octets consumed between STARTTLS and the handshake, but "
                            "%llu discarded", (unsigned long long)fed,
                         (unsigned long long)discarded);
            return -1;
        }
    }
    int rc = smtpe_server_tls_started(s->srv, s->now);
    if (rc != 0) {
        hs_sess_fail(s, "smtpe_server_tls_started returned %d (%s)", rc, smtpe_strerror(rc));
        return -1;
    }
    smtpe_server_stats st;
    smtpe_server_get_stats(s->srv, &st);
    if (!st.tls) {
        hs_sess_fail(s, "stats.tls is 0 after smtpe_server_tls_started");
        return -1;
    }
    s->tls_mark = 0;
    return 0;
}

size_t hs_sess_drain(hs_sess *s)
{
    size_t happened = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        smtpe_event ev;
        memset(&ev, 0, sizeof ev);
        int got = smtpe_server_next_event(s->srv, &ev);
        if (got == 1) {
            happened++;
            handle_event(s, &ev);
            continue;
        }
        if (got != 0) {
            hs_sess_fail(s, "smtpe_server_next_event returned %d", got);
            break;
        }
        size_t len = take_output(s);
        if (s->failed)
            break;
        if (len == 0) {
            /* A well-behaved host calls handle_expiry whenever expiry() says it is due. */
            if (smtpe_server_expiry(s->srv, s->now) <= s->now) {
                int rc = smtpe_server_handle_expiry(s->srv, s->now);
                if (rc < 0 || rc > 1) {
                    hs_sess_fail(s, "smtpe_server_handle_expiry returned %d", rc);
                    break;
                }
                if (smtpe_server_expiry(s->srv, s->now) <= s->now && rc == 0) {
                    hs_sess_fail(s, "smtpe_server_expiry stays due after handle_expiry(%llu)",
                                 (unsigned long long)s->now);
                    break;
                }
                if (rc == 1) {
                    happened++;
                    continue;
                }
            }
            break;
        }
        happened += len;
    }
    return happened;
}

size_t hs_sess_feed(hs_sess *s, const uint8_t *p, size_t n, hs_splitter *sp)
{
    size_t off = 0;
    hs_sess_drain(s);
    while (off < n && !s->failed) {
        size_t k = hs_splitter_next(sp, n - off);
        ssize_t r = smtpe_server_recv(s->srv, p + off, k, s->now);
        if (r < 0) {
            hs_sess_fail(s, "smtpe_server_recv returned %zd (%s)", r, smtpe_strerror((int)r));
            break;
        }
        if ((size_t)r > k) {
            hs_sess_fail(s, "smtpe_server_recv consumed %zd of %zu octets", r, k);
            break;
        }
        off += (size_t)r;
        s->consumed += (uint64_t)r;
        size_t happened = hs_sess_drain(s);
        if (r == 0 && happened == 0) {
            unsigned want = smtpe_server_want(s->srv);
            if (want & SMTPE_WANT_READ) {
                /* smtpe.h: recv never returns 0 without progress while want() says READ */
                hs_sess_fail(s,
                             "smtpe_server_recv consumed nothing of %zu octets and made no "
                             "progress although want() says SMTPE_WANT_READ (want=0x%x)",
                             k, want);
                break;
            }
            if (want & SMTPE_WANT_CLOSE)
                break; /* the session is over; the rest of the input is never read */
            if ((want & SMTPE_WANT_VERDICT) && s->holding > 0)
                break; /* concurrent verdicts: it reads no further until the host gives those
                          it holds; the caller feeds the rest again after them */
            hs_sess_fail(s,
                         "smtpe_server_recv consumed nothing of %zu octets although no event, "
                         "verdict or output was pending (want=0x%x)",
                         k, want);
            break;
        }
        if (s->alloc.allocs != 1) {
            hs_sess_fail(s, "the engine allocated after session creation (%zu allocations)",
                         s->alloc.allocs);
            break;
        }
    }
    return off;
}

/* ---- transcripts ------------------------------------------------------------------------- */

static char *xstrdup(const char *s)
{
    size_t n = strlen(s);
    char *d = xrealloc(NULL, n + 1);
    memcpy(d, s, n + 1);
    return d;
}

static int parse_u64(const char *s, uint64_t *v)
{
    if (!*s)
        return -1;
    uint64_t x = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        if (x > (UINT64_MAX - 9) / 10)
            return -1;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    *v = x;
    return 0;
}

static const struct {
    const char *name;
    unsigned bit;
} ext_names[] = {{"PIPELINING", SMTPE_EXT_PIPELINING},
                 {"SIZE", SMTPE_EXT_SIZE},
                 {"8BITMIME", SMTPE_EXT_8BITMIME},
                 {"SMTPUTF8", SMTPE_EXT_SMTPUTF8},
                 {"ENHANCEDSTATUSCODES", SMTPE_EXT_ENHANCEDSTATUSCODES},
                 {"STARTTLS", SMTPE_EXT_STARTTLS},
                 {"CHUNKING", SMTPE_EXT_CHUNKING},
                 {"BINARYMIME", SMTPE_EXT_BINARYMIME},
                 {"DSN", SMTPE_EXT_DSN},
                 {"REQUIRETLS", SMTPE_EXT_REQUIRETLS},
                 {"MT-PRIORITY", SMTPE_EXT_MT_PRIORITY},
                 {"DELIVERBY", SMTPE_EXT_DELIVERBY},
                 {"XCLIENT", SMTPE_EXT_XCLIENT},
                 {"XFORWARD", SMTPE_EXT_XFORWARD}};

static int parse_extensions(const char *v, unsigned *ext)
{
    char *copy = xstrdup(v), *save = NULL;
    int rc = 0;
    for (char *t = strtok_r(copy, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (strcmp(t, "none") == 0) {
            *ext = 0;
            continue;
        }
        if (strcmp(t, "default") == 0) {
            *ext = SMTPE_EXT_DEFAULT;
            continue;
        }
        int add = 1;
        if (*t == '-' || *t == '+') {
            add = *t == '+';
            t++;
        }
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof ext_names / sizeof ext_names[0]; i++)
            if (strcmp(t, ext_names[i].name) == 0)
                bit = ext_names[i].bit;
        if (!bit) {
            rc = -1;
            break;
        }
        if (add)
            *ext |= bit;
        else
            *ext &= ~bit;
    }
    free(copy);
    return rc;
}

static int apply_config(hs_script *sc, const char *key, const char *val, hs_buf *err)
{
    uint64_t v = 0;
    smtpe_server_config *c = &sc->cfg;
    if (strcmp(key, "hostname") == 0) {
        free(sc->hostname);
        sc->hostname = xstrdup(val);
        c->hostname = sc->hostname;
        return 0;
    }
    if (strcmp(key, "greeting_text") == 0) {
        free(sc->greeting_text);
        sc->greeting_text = xstrdup(val);
        c->greeting_text = sc->greeting_text;
        return 0;
    }
    if (strcmp(key, "auth_mechanisms") == 0) {
        free(sc->auth_mechanisms);
        sc->auth_mechanisms = xstrdup(val);
        c->auth_mechanisms = sc->auth_mechanisms;
        return 0;
    }
    if (strcmp(key, "ehlo_extra") == 0) {
        sc->extra = xrealloc(sc->extra, (sc->extra_n + 1) * sizeof *sc->extra);
        sc->extra[sc->extra_n++] = xstrdup(val);
        return 0;
    }
    if (strcmp(key, "extensions") == 0) {
        if (parse_extensions(val, &c->extensions) < 0) {
            hs_buf_addf(err, "bad @extensions value \"%s\"", val);
            return -1;
        }
        return 0;
    }
    if (strcmp(key, "line_ending") == 0) {
        if (strcmp(val, "refuse") == 0)
            c->line_ending = SMTPE_LINE_ENDING_REFUSE;
        else if (strcmp(val, "normalise") == 0 || strcmp(val, "normalize") == 0)
            c->line_ending = SMTPE_LINE_ENDING_NORMALISE;
        else if (strcmp(val, "keep") == 0)
            c->line_ending = SMTPE_LINE_ENDING_KEEP;
        else {
            hs_buf_addf(err, "bad @line_ending value \"%s\"", val);
            return -1;
        }
        return 0;
    }
    if (parse_u64(val, &v) < 0) {
        hs_buf_addf(err, "@%s needs a decimal number, got \"%s\"", key, val);
        return -1;
    }
    if (strcmp(key, "max_message_size") == 0)
        c->max_message_size = v;
    else if (strcmp(key, "max_line_length") == 0)
        c->max_line_length = (size_t)v;
    else if (strcmp(key, "max_recipients") == 0)
        c->max_recipients = (unsigned)v;
    else if (strcmp(key, "max_errors") == 0)
        c->max_errors = (unsigned)v;
    else if (strcmp(key, "command_timeout") == 0)
        c->command_timeout_ms = v;
    else if (strcmp(key, "data_timeout") == 0)
        c->data_timeout_ms = v;
    else if (strcmp(key, "lax_angle_brackets") == 0)
        c->lax_angle_brackets = (int)v;
    else if (strcmp(key, "reply_buffer_size") == 0)
        c->reply_buffer_size = (size_t)v;
    else if (strcmp(key, "auth_without_tls") == 0)
        c->auth_without_tls = (int)v;
    else if (strcmp(key, "require_tls") == 0)
        c->require_tls = (int)v;
    else if (strcmp(key, "lmtp") == 0)
        c->lmtp = (int)v;
    else if (strcmp(key, "proxy_protocol") == 0)
        c->proxy_protocol = (int)v;
    else if (strcmp(key, "trusted") == 0)
        sc->trusted = (int)v;
    else if (strcmp(key, "max_pending_verdicts") == 0)
        c->max_pending_verdicts = (unsigned)v;
    else {
        hs_buf_addf(err, "unknown setting @%s", key);
        return -1;
    }
    return 0;
}

static const struct {
    const char *prefix;
    int kind;
    int has_text;
} line_kinds[] = {{"C:", HS_L_CLIENT, 1},   {"B:", HS_L_RAW, 1},     {"S:", HS_L_SERVER, 1},
                  {"E:", HS_L_EVENT, 1},    {"H:", HS_L_HOST, 1},    {"CLOSE:", HS_L_CLOSE, 1},
                  {"TIME", HS_L_TIME, 1},   {"SILENT", HS_L_SILENT, 0},
                  {"CLOSED", HS_L_CLOSED, 0}, {"OPEN", HS_L_OPEN, 0},
                  {"TLS", HS_L_TLS, 0},     {"DISCARDED", HS_L_DISCARDED, 1},
                  {"HOLD", HS_L_HOLD, 1},   {"V:", HS_L_VERDICT, 1},
                  {"NOEVENT", HS_L_NOEVENT, 0}, {"UNREAD", HS_L_UNREAD, 1}};

int hs_script_load(hs_script *sc, const char *path, hs_buf *err)
{
    memset(sc, 0, sizeof *sc);
    sc->path = xstrdup(path);
    const char *slash = strrchr(sc->path, '/');
    sc->name = slash ? slash + 1 : sc->path;
    smtpe_server_config_init(&sc->cfg);
    sc->hostname = xstrdup("mx.example");
    sc->cfg.hostname = sc->hostname;

    FILE *f = fopen(path, "rb");
    if (!f) {
        hs_buf_addf(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int lineno = 0, rc = 0, seen_action = 0;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (n == 0 || line[0] == '#')
            continue;
        if (line[0] == '@') {
            if (seen_action) {
                hs_buf_addf(err, "%s:%d: settings must come before the first action", path,
                            lineno);
                rc = -1;
                break;
            }
            char *key = line + 1, *val = strchr(key, ' ');
            if (val)
                *val++ = 0;
            else
                val = "";
            if (apply_config(sc, key, val, err) < 0) {
                hs_buf_addf(err, " (%s:%d)", path, lineno);
                rc = -1;
                break;
            }
            continue;
        }
        int kind = -1;
        const char *text = NULL;
        for (size_t i = 0; i < sizeof line_kinds / sizeof line_kinds[0]; i++) {
            size_t pl = strlen(line_kinds[i].prefix);
            if (strncmp(line, line_kinds[i].prefix, pl) != 0)
                continue;
            if (!line_kinds[i].has_text) {
                if (line[pl] != 0)
                    continue;
                text = "";
            } else if (line[pl] == ' ') {
                text = line + pl + 1;
            } else if (line[pl] == 0) {
                text = "";
            } else {
                continue;
            }
            kind = line_kinds[i].kind;
            break;
        }
        if (kind < 0) {
            hs_buf_addf(err, "%s:%d: cannot parse line \"%s\"", path, lineno, line);
            rc = -1;
            break;
        }
        seen_action = 1;
        if (kind == HS_L_EVENT || kind == HS_L_NOEVENT)
            sc->has_events = 1;
        sc->lines = xrealloc(sc->lines, (sc->n + 1) * sizeof *sc->lines);
        sc->lines[sc->n].kind = kind;
        sc->lines[sc->n].lineno = lineno;
        sc->lines[sc->n].text = xstrdup(text);
        sc->n++;
    }
    free(line);
    fclose(f);
    if (sc->extra_n) {
        sc->extra_ptrs = xrealloc(NULL, sc->extra_n * sizeof *sc->extra_ptrs);
        for (size_t i = 0; i < sc->extra_n; i++)
            sc->extra_ptrs[i] = sc->extra[i];
        sc->cfg.ehlo_extra = sc->extra_ptrs;
        sc->cfg.ehlo_extra_count = sc->extra_n;
    }
    return rc;
}

void hs_script_free(hs_script *sc)
{
    for (size_t i = 0; i < sc->n; i++)
        free(sc->lines[i].text);
    free(sc->lines);
    for (size_t i = 0; i < sc->extra_n; i++)
        free(sc->extra[i]);
    free(sc->extra);
    free(sc->extra_ptrs);
    free(sc->hostname);
    free(sc->greeting_text);
    free(sc->auth_mechanisms);
    free(sc->path);
    memset(sc, 0, sizeof *sc);
}

void hs_script_input(const hs_script *sc, hs_buf *out)
{
    for (size_t i = 0; i < sc->n; i++) {
        const hs_line *l = &sc->lines[i];
        if (l->kind != HS_L_CLIENT && l->kind != HS_L_RAW)
            continue;
        hs_unescape(out, l->text, strlen(l->text));
        if (l->kind == HS_L_CLIENT)
            hs_buf_adds(out, "\r\n");
    }
}

void hs_script_plan(const hs_script *sc, hs_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->trusted = sc->trusted;
    size_t off = 0;
    hs_buf tmp = {0};
    for (size_t i = 0; i < sc->n; i++) {
        const hs_line *l = &sc->lines[i];
        if (l->kind == HS_L_CLIENT || l->kind == HS_L_RAW) {
            hs_buf_reset(&tmp);
            hs_unescape(&tmp, l->text, strlen(l->text));
            off += tmp.len + (l->kind == HS_L_CLIENT ? 2 : 0);
        } else if (l->kind == HS_L_TLS) {
            if (i == 0) {
                plan->implicit_tls = 1;
                continue;
            }
            plan->tls_at = xrealloc(plan->tls_at, (plan->ntls + 1) * sizeof *plan->tls_at);
            plan->tls_at[plan->ntls++] = off;
        }
    }
    hs_buf_free(&tmp);
}

void hs_plan_free(hs_plan *plan)
{
    free(plan->tls_at);
    memset(plan, 0, sizeof *plan);
}

int hs_sess_open_plan(hs_sess *s, const smtpe_server_config *cfg, const hs_plan *plan)
{
    int rc = hs_sess_open(s, cfg, 0);
    if (rc != 0)
        return rc;
    if (plan && plan->trusted) {
        int r = smtpe_server_set_trusted(s->srv, 1);
        if (r != 0)
            hs_sess_fail(s, "smtpe_server_set_trusted returned %d (%s)", r, smtpe_strerror(r));
    }
    if (plan && plan->implicit_tls)
        hs_sess_tls(s, 1);
    return 0;
}

/* A host verdict: "accept", "challenge <octets>", or code [enhanced|-] [text]. */
typedef struct verdict {
    int accept;
    int challenge; /* smtpe_server_auth_challenge with text */
    unsigned code;
    int has_enh;
    char enh[32];
    int has_text;
    hs_buf text;
} verdict;

static int is_enhanced_token(const char *t, size_t n)
{
    int dots = 0, digits = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '.') {
            if (!digits)
                return 0;
            dots++;
            digits = 0;
        } else if (t[i] >= '0' && t[i] <= '9') {
            digits++;
        } else {
            return 0;
        }
    }
    return dots == 2 && digits > 0;
}

static int parse_verdict(const char *s, verdict *v)
{
    memset(v, 0, sizeof *v);
    if (strcmp(s, "accept") == 0) {
        v->accept = 1;
        return 0;
    }
    if (strncmp(s, "challenge", 9) == 0 && (s[9] == 0 || s[9] == ' ')) {
        v->challenge = 1;
        s += 9;
        if (*s)
            s++;
        v->has_text = 1;
        return hs_unescape(&v->text, s, strlen(s));
    }
    if (!(s[0] >= '1' && s[0] <= '9') || !(s[1] >= '0' && s[1] <= '9') ||
        !(s[2] >= '0' && s[2] <= '9') || (s[3] != ' ' && s[3] != 0))
        return -1;
    v->code = (unsigned)((s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0'));
    s += 3;
    if (!*s)
        return 0;
    s++;
    const char *sp = strchr(s, ' ');
    size_t tl = sp ? (size_t)(sp - s) : strlen(s);
    if (tl == 1 && s[0] == '-') {
        s += tl;
    } else if (is_enhanced_token(s, tl) && tl < sizeof v->enh) {
        memcpy(v->enh, s, tl);
        v->has_enh = 1;
        s += tl;
    } else {
        /* no enhanced code: the rest is the text */
        v->has_text = 1;
        return hs_unescape(&v->text, s, strlen(s));
    }
    if (*s == ' ') {
        s++;
        v->has_text = 1;
        return hs_unescape(&v->text, s, strlen(s));
    }
    return 0;
}

/* One entry of the host's verdict plan, in event order: an H: line, or one event of a HOLD
 * line. */
typedef struct qitem {
    const hs_line *l;
    int hold;
} qitem;

#define HS_HELD_SPANS (5 + 2 * SMTPE_MAX_PARAMS)

/* An event the host took and holds without a verdict (HOLD) until its V: lines. */
typedef struct held_ev {
    smtpe_event ev;      /* as taken: its spans point into engine memory */
    hs_buf text;         /* its E: text when taken */
    smtpe_span spans[HS_HELD_SPANS]; /* every span of the event */
    size_t nspans;
    hs_buf copy;         /* the spans' octets when taken, one after another */
    unsigned left;       /* verdicts still owed: 1, under LMTP one per recipient for DATA_END */
    const hs_line *hold; /* the HOLD line that held it */
} held_ev;

typedef struct runner {
    const hs_script *sc;
    hs_sess sess;
    qitem *queue;     /* the verdict plan: H: lines and HOLD events not yet used */
    size_t qhead, qlen, qcap;
    held_ev *held;    /* the events of this round of holding, in the order taken (V: k names
                         held[k-1]); a round starts when an event is held while none waits */
    size_t nheld, heldcap;
    size_t held_open; /* held events whose verdicts are still owed */
    size_t out_pos;   /* output octets matched so far */
    size_t ev_pos;    /* events matched so far */
    hs_buf pending;   /* client octets not yet consumed */
    size_t pend_off;
    hs_splitter sp;
    int mode;
    hs_buf *report;
    int failed;
} runner;

static void rfail(runner *r, const hs_line *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void rfail(runner *r, const hs_line *l, const char *fmt, ...)
{
    if (r->failed)
        return;
    r->failed = 1;
    char tmp[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    hs_buf_addf(r->report, "%s:%d [%s]: %s\n", r->sc->path, l ? l->lineno : 0,
                hs_mode_name(r->mode), tmp);
}

static void queue_push(runner *r, const hs_line *l, int hold)
{
    if (r->qlen == r->qcap) {
        r->qcap = r->qcap ? r->qcap * 2 : 16;
        r->queue = xrealloc(r->queue, r->qcap * sizeof *r->queue);
    }
    r->queue[r->qlen].l = l;
    r->queue[r->qlen].hold = hold;
    r->qlen++;
}

/* Every span of an event (those the engine promises stay valid until its verdict), into sp
 * (room for HS_HELD_SPANS). Returns their count. */
static size_t event_spans(const smtpe_event *ev, smtpe_span *sp)
{
    size_t n = 0;
    const smtpe_param *params = NULL;
    size_t np = 0;
    switch (ev->type) {
    case SMTPE_EV_HELO: sp[n++] = ev->helo.domain; break;
    case SMTPE_EV_MAIL:
        sp[n++] = ev->mail.reverse_path.mailbox;
        sp[n++] = ev->mail.reverse_path.local_part;
        sp[n++] = ev->mail.reverse_path.domain;
        sp[n++] = ev->mail.envid;
        sp[n++] = ev->mail.auth;
        params = ev->mail.params;
        np = ev->mail.param_count;
        break;
    case SMTPE_EV_RCPT:
        sp[n++] = ev->rcpt.forward_path.mailbox;
        sp[n++] = ev->rcpt.forward_path.local_part;
        sp[n++] = ev->rcpt.forward_path.domain;
        sp[n++] = ev->rcpt.orcpt_type;
        sp[n++] = ev->rcpt.orcpt;
        params = ev->rcpt.params;
        np = ev->rcpt.param_count;
        break;
    case SMTPE_EV_VRFY:
    case SMTPE_EV_EXPN:
    case SMTPE_EV_UNKNOWN:
        sp[n++] = ev->command.verb;
        sp[n++] = ev->command.argument;
        break;
    case SMTPE_EV_AUTH:
        sp[n++] = ev->auth.mechanism;
        sp[n++] = ev->auth.authzid;
        sp[n++] = ev->auth.authcid;
        sp[n++] = ev->auth.password;
        sp[n++] = ev->auth.response;
        break;
    case SMTPE_EV_PROXY: sp[n++] = ev->proxy.tlvs; break;
    case SMTPE_EV_XCLIENT:
    case SMTPE_EV_XFORWARD:
        params = ev->xclient.attrs;
        np = ev->xclient.count;
        break;
    default: break;
    }
    for (size_t i = 0; i < np && i < SMTPE_MAX_PARAMS; i++) {
        sp[n++] = params[i].keyword;
        sp[n++] = params[i].value;
    }
    return n;
}

/* The host takes ev and holds it without a verdict (HOLD): keeps its id, its E: text and a copy
 * of its spans' octets, to check them at its V: lines. */
static void hold_event(runner *r, const smtpe_event *ev, unsigned verdicts, const hs_line *l)
{
    if (r->held_open == 0) {
        /* a new round: held events are numbered from 1 again */
        for (size_t i = 0; i < r->nheld; i++) {
            hs_buf_free(&r->held[i].text);
            hs_buf_free(&r->held[i].copy);
        }
        r->nheld = 0;
    }
    if (r->nheld == r->heldcap) {
        r->heldcap = r->heldcap ? r->heldcap * 2 : 8;
        r->held = xrealloc(r->held, r->heldcap * sizeof *r->held);
    }
    held_ev *h = &r->held[r->nheld++];
    memset(h, 0, sizeof *h);
    h->ev = *ev;
    hs_buf err = {0};
    (void)hs_format_event(&h->text, ev, &err); /* a bad event already failed handle_event */
    hs_buf_free(&err);
    h->nspans = event_spans(ev, h->spans);
    for (size_t i = 0; i < h->nspans; i++)
        if (h->spans[i].len)
            hs_buf_add(&h->copy, h->spans[i].ptr, h->spans[i].len);
    h->left = verdicts;
    h->hold = l;
    r->held_open++;
    r->sess.holding = r->held_open;
}

/* 1 if every span of h still holds the octets it held when the event was taken. */
static int held_spans_intact(const held_ev *h)
{
    size_t off = 0;
    for (size_t i = 0; i < h->nspans; i++) {
        const smtpe_span *sp = &h->spans[i];
        if (sp->len == 0)
            continue;
        if (off + sp->len > h->copy.len || memcmp(sp->ptr, h->copy.p + off, sp->len) != 0)
            return 0;
        off += sp->len;
    }
    return 1;
}

/* Gives verdict v for the event id: by id (smtpe_server_reply_id, smtpe_server_accept_id), or
 * with by_id 0 for the oldest waiting event (smtpe_server_reply, smtpe_server_accept). A
 * challenge is always for the oldest (smtpe_server_auth_challenge has no id). */
static int give_verdict(smtpe_server *srv, verdict *v, uint64_t id, int by_id)
{
    const char *enh = v->has_enh ? v->enh : NULL;
    if (v->accept)
        return by_id ? smtpe_server_accept_id(srv, id) : smtpe_server_accept(srv);
    if (v->challenge)
        return smtpe_server_auth_challenge(srv, v->text.p, v->text.len);
    const char *text = v->has_text ? hs_buf_cstr(&v->text) : NULL;
    return by_id ? smtpe_server_reply_id(srv, id, v->code, enh, text)
                 : smtpe_server_reply(srv, v->code, enh, text);
}

/* Gives one verdict for ev: the next queued H: line, or accept when none is queued. While the
 * host holds events (HOLD) it names ev by its id, since ev is then not the oldest that waits;
 * otherwise it uses the calls without an id, as a host with one verdict at a time does. */
static int apply_one_verdict(runner *r, hs_sess *s, const smtpe_event *ev)
{
    int by_id = r->held_open > 0;
    verdict v;
    if (r->qhead == r->qlen) {
        memset(&v, 0, sizeof v);
        v.accept = 1;
        int rc = give_verdict(s->srv, &v, ev->id, by_id);
        if (rc != 0) {
            hs_sess_fail(s, "accept failed: %d (%s)", rc, smtpe_strerror(rc));
            return -1;
        }
        return 0;
    }
    const hs_line *l = r->queue[r->qhead++].l;
    if (parse_verdict(l->text, &v) < 0) {
        hs_buf_free(&v.text);
        hs_sess_fail(s, "line %d: cannot parse H: verdict", l->lineno);
        return -1;
    }
    int rc = give_verdict(s->srv, &v, ev->id, by_id);
    hs_buf_free(&v.text);
    if (rc != 0) {
        hs_sess_fail(s, "line %d: the engine refused the H: verdict: %d (%s)", l->lineno, rc,
                     smtpe_strerror(rc));
        return -1;
    }
    return 0;
}

static int apply_verdict(hs_sess *s, const smtpe_event *ev, void *ud)
{
    runner *r = ud;
    /* under LMTP the end of the content takes one verdict per accepted recipient */
    unsigned n = ev->type == SMTPE_EV_DATA_END && ev->data_end.replies > 1
                     ? ev->data_end.replies
                     : 1;
    if (r->qhead < r->qlen && r->queue[r->qhead].hold) {
        hold_event(r, ev, n, r->queue[r->qhead++].l);
        return 0;
    }
    for (unsigned i = 0; i < n && (smtpe_server_want(s->srv) & SMTPE_WANT_VERDICT); i++) {
        if (r->qhead < r->qlen && r->queue[r->qhead].hold) {
            hs_sess_fail(s, "line %d: HOLD reached in the middle of the %u verdicts of an "
                            "LMTP DATA_END (hold the whole event instead)",
                         r->queue[r->qhead].l->lineno, n);
            return -1;
        }
        if (apply_one_verdict(r, s, ev) < 0) /* a 421 ends the series early */
            return -1;
    }
    return 0;
}

static void pump(runner *r, const hs_line *l)
{
    if (r->pend_off < r->pending.len) {
        size_t used = hs_sess_feed(&r->sess, r->pending.p + r->pend_off,
                                   r->pending.len - r->pend_off, &r->sp);
        r->pend_off += used;
    } else {
        hs_sess_drain(&r->sess);
    }
    if (r->sess.failed && !r->failed)
        rfail(r, l, "%s", hs_buf_cstr(&r->sess.err));
}

/* The next whole reply line of the output, without CRLF; 0 if there is none. */
static int next_reply_line(runner *r, const uint8_t **p, size_t *n)
{
    const hs_buf *o = &r->sess.out;
    for (size_t i = r->out_pos; i + 1 < o->len; i++) {
        if (o->p[i] == '\r' && o->p[i + 1] == '\n') {
            *p = o->p + r->out_pos;
            *n = i - r->out_pos;
            r->out_pos = i + 2;
            return 1;
        }
    }
    return 0;
}

static void describe_unmatched_output(runner *r, hs_buf *d)
{
    const hs_buf *o = &r->sess.out;
    hs_escape(d, o->p + r->out_pos, o->len - r->out_pos);
}

/* Glob match of raw octets against the expected text of an E: line: an unescaped '*' in the
 * text matches any run of octets; everything else is compared after unescaping. */
static int glob_match(const char *pat, const uint8_t *s, size_t n)
{
    /* split the pattern at unescaped '*' */
    hs_buf seg = {0};
    const char *p = pat;
    size_t pos = 0;
    int first = 1, ok = 1;
    for (;;) {
        const char *q = p;
        while (*q && *q != '*') {
            if (*q == '\\' && q[1])
                q++;
            q++;
        }
        hs_buf_reset(&seg);
        if (hs_unescape(&seg, p, (size_t)(q - p)) < 0) {
            ok = 0;
            break;
        }
        int last = *q == 0;
        if (first && last) {
            ok = seg.len == n && (n == 0 || memcmp(seg.p, s, n) == 0);
            break;
        }
        if (first) {
            if (seg.len > n || (seg.len && memcmp(seg.p, s, seg.len) != 0)) {
                ok = 0;
                break;
            }
            pos = seg.len;
        } else if (last) {
            ok = seg.len <= n - pos &&
                 (seg.len == 0 || memcmp(seg.p, s + n - seg.len, seg.len) == 0);
            break;
        } else {
            size_t i;
            int found = 0;
            for (i = pos; i + seg.len <= n; i++)
                if (seg.len == 0 || memcmp(s + i, seg.p, seg.len) == 0) {
                    found = 1;
                    break;
                }
            if (!found) {
                ok = 0;
                break;
            }
            pos = i + seg.len;
        }
        first = 0;
        p = q + 1;
    }
    hs_buf_free(&seg);
    return ok;
}

/* The returns a V: line may expect instead of 0: "!STATE" and so on (and "!VOIDED", not an
 * error: the verdict of a voided RCPT). */
static const struct {
    const char *name;
    int code;
} verdict_errors[] = {{"STATE", SMTPE_ERR_STATE},
                      {"INVALID", SMTPE_ERR_INVALID_ARGUMENT},
                      {"TOO_LONG", SMTPE_ERR_REPLY_TOO_LONG},
                      {"VOIDED", SMTPE_VOIDED}};

static const char *verdict_error_name(int code)
{
    for (size_t i = 0; i < sizeof verdict_errors / sizeof verdict_errors[0]; i++)
        if (verdict_errors[i].code == code)
            return verdict_errors[i].name;
    return "0";
}

/* V: k [!ERR] verdict: the host's verdict for the k-th held event, by its id, once the client
 * octets sent before it are fed. Unless an error is expected (!VOIDED is none), the event's
 * spans must still hold the octets they held when it was taken. Then the pending client octets
 * are fed again (the engine may read on now). */
static void step_verdict(runner *r, const hs_line *l)
{
    pump(r, l);
    if (r->failed)
        return;
    const char *t = l->text;
    char *end = NULL;
    unsigned long k = strtoul(t, &end, 10);
    if (end == t || (*end != ' ' && *end != 0) || k == 0) {
        rfail(r, l, "V: needs the number of a held event (1, 2, ...), then a verdict");
        return;
    }
    t = *end ? end + 1 : end;
    int expect = 0;
    if (*t == '!') {
        const char *sp = strchr(t, ' ');
        size_t n = sp ? (size_t)(sp - t - 1) : strlen(t + 1);
        int found = 0;
        for (size_t i = 0; i < sizeof verdict_errors / sizeof verdict_errors[0]; i++)
            if (strlen(verdict_errors[i].name) == n &&
                strncmp(t + 1, verdict_errors[i].name, n) == 0) {
                expect = verdict_errors[i].code;
                found = 1;
            }
        if (!found) {
            rfail(r, l, "V: expects !STATE, !INVALID, !TOO_LONG or !VOIDED, not \"%.*s\"",
                  (int)n, t);
            return;
        }
        t = sp ? sp + 1 : t + 1 + n;
    }
    verdict v;
    if (parse_verdict(t, &v) < 0) {
        hs_buf_free(&v.text);
        rfail(r, l, "cannot parse verdict \"%s\"", t);
        return;
    }
    if (k > r->nheld) {
        hs_buf_free(&v.text);
        rfail(r, l, "V: %lu, but only %zu event(s) are held so far", k, r->nheld);
        return;
    }
    held_ev *h = &r->held[k - 1];
    int success = expect == 0 || expect == SMTPE_VOIDED;
    if (success && h->left == 0) {
        hs_buf_free(&v.text);
        rfail(r, l, "held event %lu (E: %s) has had its verdicts already (V: %lu !STATE ... "
                    "checks that another is refused)", k, hs_buf_cstr(&h->text), k);
        return;
    }
    if (success && !held_spans_intact(h)) {
        hs_buf now = {0}, err = {0}, d = {0};
        if (hs_format_event(&now, &h->ev, &err) < 0)
            hs_buf_add(&d, err.p, err.len);
        else
            hs_escape(&d, now.p, now.len);
        hs_buf_free(&v.text);
        rfail(r, l, "the spans of held event %lu changed before its verdict\n"
                    "    when taken: E: %s\n    now:        E: %s",
              k, hs_buf_cstr(&h->text), hs_buf_cstr(&d));
        hs_buf_free(&now);
        hs_buf_free(&err);
        hs_buf_free(&d);
        return;
    }
    if (v.challenge && h->ev.type != SMTPE_EV_AUTH) {
        hs_buf_free(&v.text);
        rfail(r, l, "V: %lu challenge, but held event %lu is not AUTH", k, k);
        return;
    }
    int rc = give_verdict(r->sess.srv, &v, h->ev.id, 1);
    hs_buf_free(&v.text);
    if (rc != expect) {
        rfail(r, l, "the verdict for held event %lu (id %llu, E: %s) returned %d (%s), "
                    "expected %s", k, (unsigned long long)h->ev.id, hs_buf_cstr(&h->text), rc,
              smtpe_strerror(rc), expect ? verdict_error_name(expect) : "0");
        return;
    }
    if (h->left > 0 &&
        (rc == 0 ? --h->left == 0 || (smtpe_server_want(r->sess.srv) & SMTPE_WANT_CLOSE)
                 : rc == SMTPE_ERR_STATE || rc == SMTPE_VOIDED)) {
        h->left = 0; /* done: all its verdicts given, a 421 closed, or none is owed any more */
        r->held_open--;
        r->sess.holding = r->held_open;
    }
    pump(r, l);
}

static void step(runner *r, const hs_line *l)
{
    hs_buf tmp = {0}, d1 = {0}, d2 = {0};
    switch (l->kind) {
    case HS_L_CLIENT:
    case HS_L_RAW:
        if (hs_unescape(&r->pending, l->text, strlen(l->text)) < 0)
            rfail(r, l, "bad escape in \"%s\"", l->text);
        if (l->kind == HS_L_CLIENT)
            hs_buf_adds(&r->pending, "\r\n");
        break;
    case HS_L_HOST: {
        verdict v;
        if (parse_verdict(l->text, &v) < 0)
            rfail(r, l, "cannot parse verdict \"%s\"", l->text);
        hs_buf_free(&v.text);
        queue_push(r, l, 0);
        break;
    }
    case HS_L_HOLD: {
        uint64_t n = 0;
        if (parse_u64(l->text, &n) < 0 || n == 0 || n > 100000) {
            rfail(r, l, "HOLD needs a number of events (1 or more)");
            break;
        }
        for (uint64_t i = 0; i < n; i++)
            queue_push(r, l, 1);
        break;
    }
    case HS_L_VERDICT:
        step_verdict(r, l);
        break;
    case HS_L_NOEVENT:
        pump(r, l);
        if (!r->failed && r->ev_pos < r->sess.log.n) {
            const hs_buf *ev = &r->sess.log.items[r->ev_pos];
            hs_escape(&d1, ev->p, ev->len);
            rfail(r, l, "expected no further event, but the host took E: %s", hs_buf_cstr(&d1));
        }
        break;
    case HS_L_UNREAD: {
        pump(r, l);
        if (r->failed)
            break;
        uint64_t want = 0;
        if (parse_u64(l->text, &want) < 0) {
            rfail(r, l, "UNREAD needs a number of octets");
            break;
        }
        size_t left = r->pending.len - r->pend_off;
        if (left != want) {
            hs_escape(&d1, r->pending.p + r->pend_off, left);
            rfail(r, l, "expected %llu client octets not consumed, but %zu are: \"%s\"",
                  (unsigned long long)want, left, hs_buf_cstr(&d1));
        }
        break;
    }
    case HS_L_SERVER: {
        pump(r, l);
        if (r->failed)
            break;
        const uint8_t *p;
        size_t n;
        if (hs_unescape(&tmp, l->text, strlen(l->text)) < 0) {
            rfail(r, l, "bad escape in \"%s\"", l->text);
            break;
        }
        if (!next_reply_line(r, &p, &n)) {
            describe_unmatched_output(r, &d1);
            rfail(r, l, "expected reply line \"%s\", but no further reply line (pending output: "
                        "\"%s\")", l->text, hs_buf_cstr(&d1));
            break;
        }
        if (n != tmp.len || (n && memcmp(p, tmp.p, n) != 0)) {
            hs_escape(&d1, p, n);
            rfail(r, l, "reply line mismatch\n    expected: \"%s\"\n    actual:   \"%s\"",
                  l->text, hs_buf_cstr(&d1));
        }
        break;
    }
    case HS_L_SILENT:
        pump(r, l);
        if (!r->failed && r->out_pos < r->sess.out.len) {
            describe_unmatched_output(r, &d1);
            rfail(r, l, "expected no reply, got \"%s\"", hs_buf_cstr(&d1));
        }
        break;
    case HS_L_EVENT:
        pump(r, l);
        if (r->failed)
            break;
        if (r->ev_pos >= r->sess.log.n) {
            rfail(r, l, "expected event \"%s\", but there is no further event", l->text);
            break;
        }
        {
            const hs_buf *ev = &r->sess.log.items[r->ev_pos++];
            if (!glob_match(l->text, ev->p, ev->len)) {
                hs_escape(&d1, ev->p, ev->len);
                rfail(r, l, "event mismatch\n    expected: %s\n    actual:   %s", l->text,
                      hs_buf_cstr(&d1));
            }
        }
        break;
    case HS_L_TIME: {
        pump(r, l);
        uint64_t dt = 0;
        if (l->text[0] != '+' || parse_u64(l->text + 1, &dt) < 0) {
            rfail(r, l, "TIME needs +milliseconds");
            break;
        }
        r->sess.now += dt;
        int rc = smtpe_server_handle_expiry(r->sess.srv, r->sess.now);
        if (rc != 0 && rc != 1)
            rfail(r, l, "smtpe_server_handle_expiry returned %d", rc);
        hs_sess_drain(&r->sess);
        break;
    }
    case HS_L_CLOSE: {
        verdict v;
        if (parse_verdict(l->text, &v) < 0 || v.accept) {
            rfail(r, l, "cannot parse CLOSE: \"%s\"", l->text);
            hs_buf_free(&v.text);
            break;
        }
        if (v.challenge) {
            rfail(r, l, "CLOSE: takes a reply, not a challenge");
            hs_buf_free(&v.text);
            break;
        }
        int rc = smtpe_server_close(r->sess.srv, v.code, v.has_enh ? v.enh : NULL,
                                    v.has_text ? hs_buf_cstr(&v.text) : NULL);
        hs_buf_free(&v.text);
        if (rc != 0)
            rfail(r, l, "smtpe_server_close returned %d (%s)", rc, smtpe_strerror(rc));
        break;
    }
    case HS_L_CLOSED:
        pump(r, l);
        if (!r->failed && !(smtpe_server_want(r->sess.srv) & SMTPE_WANT_CLOSE))
            rfail(r, l, "expected the session to want close (want=0x%x)",
                  smtpe_server_want(r->sess.srv));
        break;
    case HS_L_OPEN:
        pump(r, l);
        if (!r->failed && (smtpe_server_want(r->sess.srv) & SMTPE_WANT_CLOSE))
            rfail(r, l, "expected the session to be open, but it wants close");
        break;
    case HS_L_TLS:
        if (l == r->sc->lines) {
            /* the first action: TLS from the start (implicit TLS), done at creation */
            break;
        }
        pump(r, l);
        if (r->failed)
            break;
        if (hs_sess_tls(&r->sess, 0) < 0)
            rfail(r, l, "%s", hs_buf_cstr(&r->sess.err));
        break;
    case HS_L_DISCARDED: {
        pump(r, l);
        if (r->failed)
            break;
        uint64_t want = 0;
        if (parse_u64(l->text, &want) < 0) {
            rfail(r, l, "DISCARDED needs a number of octets");
            break;
        }
        smtpe_server_stats st;
        smtpe_server_get_stats(r->sess.srv, &st);
        if (st.discarded_octets != want)
            rfail(r, l, "expected %llu discarded octets, stats.discarded_octets is %llu",
                  (unsigned long long)want, (unsigned long long)st.discarded_octets);
        break;
    }
    }
    hs_buf_free(&tmp);
    hs_buf_free(&d1);
    hs_buf_free(&d2);
}

int hs_script_run(const hs_script *sc, int mode, uint64_t seed, hs_buf *out, hs_log *log,
                  hs_buf *report)
{
    runner r;
    memset(&r, 0, sizeof r);
    r.sc = sc;
    r.mode = mode;
    r.report = report;
    hs_splitter_init(&r.sp, mode, seed);
    hs_plan plan;
    hs_script_plan(sc, &plan);
    int rc = hs_sess_open_plan(&r.sess, &sc->cfg, &plan);
    hs_plan_free(&plan);
    if (rc != 0) {
        rfail(&r, NULL, "smtpe_server_new returned %d (%s)", rc, smtpe_strerror(rc));
        r.sess.srv = NULL;
        hs_sess_close(&r.sess);
        return -1;
    }
    r.sess.verdict = apply_verdict;
    r.sess.verdict_ud = &r;
    if (r.sess.failed)
        rfail(&r, sc->lines, "%s", hs_buf_cstr(&r.sess.err));
    for (size_t i = 0; i < sc->n && !r.failed; i++)
        step(&r, &sc->lines[i]);
    if (!r.failed) {
        const hs_line *last = sc->n ? &sc->lines[sc->n - 1] : NULL;
        pump(&r, last);
        hs_sess_flush_content(&r.sess);
        hs_buf d = {0};
        if (!r.failed && r.out_pos < r.sess.out.len) {
            describe_unmatched_output(&r, &d);
            rfail(&r, last, "end of transcript, but the server sent more: \"%s\"",
                  hs_buf_cstr(&d));
        }
        if (!r.failed && sc->has_events && r.ev_pos < r.sess.log.n) {
            hs_buf_reset(&d);
            for (size_t i = r.ev_pos; i < r.sess.log.n; i++) {
                hs_buf_adds(&d, "\n    E: ");
                hs_escape(&d, r.sess.log.items[i].p, r.sess.log.items[i].len);
            }
            rfail(&r, last, "end of transcript, but there were more events:%s",
                  hs_buf_cstr(&d));
        }
        if (!r.failed && r.qhead != r.qlen)
            rfail(&r, r.queue[r.qhead].l,
                  r.queue[r.qhead].hold
                      ? "end of transcript, but this HOLD line held fewer events than it says"
                      : "end of transcript, but this H: verdict was never used");
        if (!r.failed && r.held_open > 0 &&
            !(smtpe_server_want(r.sess.srv) & SMTPE_WANT_CLOSE))
            for (size_t i = 0; i < r.nheld; i++)
                if (r.held[i].left > 0) {
                    rfail(&r, r.held[i].hold,
                          "end of transcript, but held event %zu (E: %s) never got its "
                          "verdict (V: %zu ...)", i + 1, hs_buf_cstr(&r.held[i].text), i + 1);
                    break;
                }
        hs_buf_free(&d);
    }
    if (out)
        hs_buf_add(out, r.sess.out.p, r.sess.out.len);
    if (log)
        for (size_t i = 0; i < r.sess.log.n; i++)
            hs_log_add(log, r.sess.log.items[i].p, r.sess.log.items[i].len);
    if (hs_sess_close(&r.sess) < 0)
        rfail(&r, NULL, "smtpe_server_free did not free the session's one allocation once");
    int failed = r.failed;
    hs_buf_free(&r.pending);
    free(r.queue);
    for (size_t i = 0; i < r.nheld; i++) {
        hs_buf_free(&r.held[i].text);
        hs_buf_free(&r.held[i].copy);
    }
    free(r.held);
    return failed ? -1 : 0;
}
