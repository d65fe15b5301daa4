/* rb_server.c - the server engine for Ruby: Smtpe::ServerConfig (frozen, shareable by every
 * Ractor) and Smtpe::ServerSession (one per connection), include/smtpe.h's "Server session".
 *
 * A session is pumped: ServerSession#feed gives the engine the octets the host read, takes every
 * event the engine queued, appends message content to the caller's String, and returns the
 * events one at a time as frozen Smtpe::Event Structs. Chunk spans die at the next
 * smtpe_server_recv, so every event of one recv is taken before the next: content is copied
 * into the sink at once and the other events wait, already converted, in the session's queue. */
#include "rb_smtpe.h"

#include <string.h>
#ifdef HAVE_ARPA_INET_H
#include <arpa/inet.h>
#endif

static VALUE cServerConfig, cServerSession, cPath, cStats;
static VALUE cHelo, cMail, cRcpt, cData, cDataEnd, cRset, cVrfy, cExpn, cUnknown, cQuit, cTimeout,
    cErrorLimit, cStarttls, cAuth, cBdat, cChunkEnd, cProxy, cProxyInvalid, cXclient, cXforward;
static VALUE sym_voided, sym_unspecified, sym_7bit, sym_8bitmime, sym_binarymime, sym_full,
    sym_hdrs, sym_ok, sym_too_big, sym_bad_line_ending, sym_plain, sym_login, sym_other,
    sym_unspec, sym_inet, sym_inet6, sym_unix, sym_stream, sym_dgram;
static VALUE notify_lists[16]; /* frozen Arrays of :never/:success/:failure/:delay by bitmask */
static VALUE empty_list;       /* a frozen [] */

/* ------------------------------------------------------------------------------------------
 * Smtpe::ServerConfig
 * ---------------------------------------------------------------------------------------- */

typedef struct rb_server_config {
    smtpe_server_config cfg; /* its strings point into the fields below */
    char *hostname, *greeting_text, *auth_mechanisms;
    char **ehlo_extra;
    size_t ehlo_extra_count;
    int ready;
} rb_server_config;

static void config_free(void *p)
{
    rb_server_config *c = p;
    ruby_xfree(c->hostname);
    ruby_xfree(c->greeting_text);
    ruby_xfree(c->auth_mechanisms);
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        ruby_xfree(c->ehlo_extra[i]);
    ruby_xfree(c->ehlo_extra);
    ruby_xfree(c);
}

static size_t config_size(const void *p)
{
    const rb_server_config *c = p;
    size_t n = sizeof *c;
    if (c->hostname)
        n += strlen(c->hostname) + 1;
    if (c->greeting_text)
        n += strlen(c->greeting_text) + 1;
    if (c->auth_mechanisms)
        n += strlen(c->auth_mechanisms) + 1;
    for (size_t i = 0; i < c->ehlo_extra_count; i++)
        n += sizeof(char *) + strlen(c->ehlo_extra[i]) + 1;
    return n;
}

static const rb_data_type_t config_type = {
    .wrap_struct_name = "Smtpe::ServerConfig",
    .function = {.dfree = config_free, .dsize = config_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY | RUBY_TYPED_FROZEN_SHAREABLE,
};

static VALUE config_alloc(VALUE klass)
{
    rb_server_config *c;
    VALUE obj = TypedData_Make_Struct(klass, rb_server_config, &config_type, c);
    smtpe_server_config_init(&c->cfg);
    return obj;
}

static rb_server_config *get_config(VALUE obj)
{
    rb_server_config *c = rb_check_typeddata(obj, &config_type);
    if (!c->ready)
        rb_raise(rb_eRuntimeError, "Smtpe::ServerConfig not initialized");
    return c;
}

/* :default, or an Array of extension Symbols (:default in it adds SMTPE_EXT_DEFAULT). */
static unsigned ext_mask(VALUE v)
{
    if (SYMBOL_P(v) && SYM2ID(v) == rb_intern("default"))
        return SMTPE_EXT_DEFAULT;
    if (!RB_TYPE_P(v, T_ARRAY))
        rb_raise(rb_eTypeError, "extensions: must be :default or an Array of Symbols");
    unsigned mask = 0;
    for (long i = 0; i < RARRAY_LEN(v); i++) {
        VALUE e = RARRAY_AREF(v, i);
        if (!SYMBOL_P(e))
            rb_raise(rb_eTypeError, "extensions: Symbols expected");
        const char *name = rb_id2name(SYM2ID(e));
        if (strcmp(name, "default") == 0) {
            mask |= SMTPE_EXT_DEFAULT;
            continue;
        }
        unsigned k = 0;
        while (k < RB_SMTPE_EXT_COUNT && strcmp(rb_smtpe_ext_names[k], name) != 0)
            k++;
        if (k == RB_SMTPE_EXT_COUNT)
            rb_raise(rb_eArgError, "extensions: unknown extension :%s", name);
        mask |= 1u << k;
    }
    return mask;
}

static void config_strings(rb_server_config *c, VALUE opts)
{
    VALUE v;
    if ((v = rb_smtpe_opt(opts, "hostname")) != Qundef)
        c->cfg.hostname = c->hostname = rb_smtpe_cstr_dup(v, "hostname");
    if ((v = rb_smtpe_opt(opts, "greeting_text")) != Qundef)
        c->cfg.greeting_text = c->greeting_text = rb_smtpe_cstr_dup(v, "greeting_text");
    if ((v = rb_smtpe_opt(opts, "auth_mechanisms")) != Qundef && !NIL_P(v)) {
        if (RB_TYPE_P(v, T_ARRAY))
            v = rb_ary_join(v, rb_str_new_cstr(" "));
        c->cfg.auth_mechanisms = c->auth_mechanisms = rb_smtpe_cstr_dup(v, "auth_mechanisms");
    }
    if ((v = rb_smtpe_opt(opts, "ehlo_extra")) != Qundef && !NIL_P(v)) {
        if (!RB_TYPE_P(v, T_ARRAY))
            rb_raise(rb_eTypeError, "ehlo_extra: must be an Array of Strings");
        v = rb_ary_dup(v); /* an element's to_str cannot change what we walk */
        long n = RARRAY_LEN(v);
        c->ehlo_extra = ruby_xcalloc((size_t)n + 1, sizeof(char *));
        for (long i = 0; i < n; i++) {
            c->ehlo_extra[i] = rb_smtpe_cstr_dup(RARRAY_AREF(v, i), "ehlo_extra");
            c->ehlo_extra_count = (size_t)i + 1;
        }
        c->cfg.ehlo_extra = (const char *const *)c->ehlo_extra;
        c->cfg.ehlo_extra_count = c->ehlo_extra_count;
    }
}

static void config_limits(rb_server_config *c, VALUE opts)
{
    VALUE v;
    smtpe_server_config *cfg = &c->cfg;
    if ((v = rb_smtpe_opt(opts, "extensions")) != Qundef)
        cfg->extensions = ext_mask(v);
    if ((v = rb_smtpe_opt(opts, "max_message_size")) != Qundef)
        cfg->max_message_size = NIL_P(v) ? 0 : rb_smtpe_opt_uint(v, "max_message_size", 0, UINT64_MAX);
    cfg->max_line_length =
        rb_smtpe_kw_uint(opts, "max_line_length", 512, 65536, cfg->max_line_length);
    cfg->max_recipients =
        (unsigned)rb_smtpe_kw_uint(opts, "max_recipients", 1, 100000, cfg->max_recipients);
    cfg->max_errors = (unsigned)rb_smtpe_kw_uint(opts, "max_errors", 0, 1000000, cfg->max_errors);
    cfg->command_timeout_ms =
        rb_smtpe_kw_uint(opts, "command_timeout_ms", 0, UINT64_MAX / 2, cfg->command_timeout_ms);
    cfg->data_timeout_ms =
        rb_smtpe_kw_uint(opts, "data_timeout_ms", 0, UINT64_MAX / 2, cfg->data_timeout_ms);
    cfg->reply_buffer_size =
        rb_smtpe_kw_uint(opts, "reply_buffer_size", 2048, 1048576, cfg->reply_buffer_size);
    cfg->max_pending_verdicts = (unsigned)rb_smtpe_kw_uint(opts, "max_pending_verdicts", 1, 1024,
                                                           cfg->max_pending_verdicts);
    if ((v = rb_smtpe_opt(opts, "line_ending")) != Qundef) {
        static const char *const names[] = {"refuse", "normalise", "normalize", "keep"};
        static const smtpe_line_ending_policy vals[] = {
            SMTPE_LINE_ENDING_REFUSE, SMTPE_LINE_ENDING_NORMALISE, SMTPE_LINE_ENDING_NORMALISE,
            SMTPE_LINE_ENDING_KEEP};
        cfg->line_ending = vals[rb_smtpe_sym_index(v, "line_ending", names, 4)];
    }
    cfg->lax_angle_brackets = rb_smtpe_kw_bool(opts, "lax_angle_brackets", cfg->lax_angle_brackets);
    cfg->auth_without_tls = rb_smtpe_kw_bool(opts, "auth_without_tls", cfg->auth_without_tls);
    cfg->require_tls = rb_smtpe_kw_bool(opts, "require_tls", cfg->require_tls);
    cfg->lmtp = rb_smtpe_kw_bool(opts, "lmtp", cfg->lmtp);
    cfg->proxy_protocol = rb_smtpe_kw_bool(opts, "proxy_protocol", cfg->proxy_protocol);
}

static const char *const config_keys[] = {
    "hostname", "greeting_text", "extensions", "ehlo_extra", "max_message_size",
    "max_line_length", "max_recipients", "max_errors", "command_timeout_ms", "data_timeout_ms",
    "line_ending", "lax_angle_brackets", "reply_buffer_size", "auth_mechanisms",
    "auth_without_tls", "require_tls", "lmtp", "proxy_protocol", "max_pending_verdicts", NULL,
};

/*
 * call-seq:
 *   Smtpe::ServerConfig.new(**options) -> config
 *
 * A server engine configuration, frozen and shareable (Ractor.shareable? is true): make one,
 * then give it to every session on every Thread and Ractor. It copies every String it is given.
 * Options (defaults as include/smtpe.h's smtpe_server_config_init gives them):
 * hostname:: the name in the greeting and the EHLO reply ("localhost")
 * greeting_text:: the text after "220 <hostname> " ("ESMTP smtpe")
 * extensions:: :default, or an Array of :pipelining, :size, :"8bitmime", :smtputf8,
 *              :enhancedstatuscodes, :starttls, :chunking, :binarymime, :dsn, :requiretls,
 *              :mt_priority, :deliverby, :xclient, :xforward (and :default for the default set)
 * ehlo_extra:: further EHLO keyword lines (Array of Strings)
 * max_message_size:: octets, 0 or nil for no limit (10 MiB; RFC 1870)
 * max_line_length:: octets with CRLF, 512..65536 (512)
 * max_recipients:: 1..100000 (100); max_errors:: 0 for no limit (20)
 * command_timeout_ms, data_timeout_ms:: milliseconds, 0 for none (300000, 180000)
 * line_ending:: :refuse, :normalise or :keep for bare CR, bare LF and NUL (:refuse)
 * lax_angle_brackets, auth_without_tls, require_tls, lmtp, proxy_protocol:: booleans (false)
 * reply_buffer_size:: octets, 2048..1048576 (4096)
 * auth_mechanisms:: "PLAIN LOGIN" or an Array of names, nil for no AUTH (RFC 4954)
 * max_pending_verdicts:: 1..1024, concurrent verdicts for pipelined RCPTs (1; RFC 2920)
 * Raises ArgumentError (unknown keyword, value out of range), TypeError, Smtpe::ConfigError.
 */
static VALUE config_initialize(int argc, VALUE *argv, VALUE self)
{
    VALUE opts = Qnil;
    rb_scan_args(argc, argv, ":", &opts);
    rb_server_config *c = rb_check_typeddata(self, &config_type);
    if (c->ready)
        rb_raise(rb_eRuntimeError, "Smtpe::ServerConfig already initialized");
    rb_smtpe_check_keys(opts, config_keys);
    config_strings(c, opts);
    config_limits(c, opts);
    if (smtpe_server_memory_size(&c->cfg) == 0)
        rb_smtpe_raise(SMTPE_ERR_CONFIG, "Smtpe::ServerConfig.new");
    c->ready = 1;
    return rb_obj_freeze(self);
}

/*
 * call-seq: config.memory_size -> Integer
 *
 * Octets of memory each session of this config takes (smtpe_server_memory_size), fixed.
 */
static VALUE config_memory_size(VALUE self)
{
    return SIZET2NUM(smtpe_server_memory_size(&get_config(self)->cfg));
}

/* call-seq: config.lmtp? -> true or false
 *
 * Whether sessions speak LMTP (RFC 2033). */
static VALUE config_lmtp_p(VALUE self) { return get_config(self)->cfg.lmtp ? Qtrue : Qfalse; }

/* call-seq: config.hostname -> String
 *
 * The server's name in the greeting. */
static VALUE config_hostname(VALUE self)
{
    const char *h = get_config(self)->cfg.hostname;
    return rb_smtpe_str((const uint8_t *)h, strlen(h), RB_SMTPE_UTF8);
}

/* ------------------------------------------------------------------------------------------
 * Smtpe::ServerSession
 * ---------------------------------------------------------------------------------------- */

typedef struct rb_server {
    smtpe_server *s;
    VALUE config; /* keeps the config's strings alive */
    VALUE queue;  /* converted events of the last recv, not yet returned */
} rb_server;

static void session_mark(void *p)
{
    rb_server *r = p;
    rb_gc_mark(r->config);
    rb_gc_mark(r->queue);
}

static void session_free(void *p)
{
    rb_server *r = p;
    smtpe_server_free(r->s);
    ruby_xfree(r);
}

static size_t session_size(const void *p)
{
    const rb_server *r = p;
    size_t n = sizeof *r;
    if (r->s && r->config)
        n += smtpe_server_memory_size(&((rb_server_config *)RTYPEDDATA_DATA(r->config))->cfg);
    return n;
}

static const rb_data_type_t session_type = {
    .wrap_struct_name = "Smtpe::ServerSession",
    .function = {.dmark = session_mark, .dfree = session_free, .dsize = session_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE session_alloc(VALUE klass)
{
    rb_server *r;
    VALUE obj = TypedData_Make_Struct(klass, rb_server, &session_type, r);
    r->config = Qnil;
    r->queue = Qnil;
    return obj;
}

static rb_server *get_session(VALUE obj)
{
    rb_server *r = rb_check_typeddata(obj, &session_type);
    if (r->s == NULL)
        rb_raise(rb_eRuntimeError, "Smtpe::ServerSession not initialized");
    return r;
}

/*
 * call-seq: Smtpe::ServerSession.new(config, now_ms) -> session
 *
 * A server session for one connection, its greeting queued (RFC 5321 §3.1): take it with
 * #take_output. config is a Smtpe::ServerConfig; now_ms the host's monotonic clock in
 * milliseconds (Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond)), which starts
 * the command timeout. The session's memory (config.memory_size octets) is fixed from here
 * on. A session belongs to one Thread, Fiber or Ractor at a time.
 * Raises TypeError, Smtpe::ConfigError, Smtpe::NoMemory.
 */
static VALUE session_initialize(VALUE self, VALUE config, VALUE now_ms)
{
    rb_server *r = rb_check_typeddata(self, &session_type);
    if (r->s)
        rb_raise(rb_eRuntimeError, "Smtpe::ServerSession already initialized");
    rb_server_config *c = get_config(config);
    uint64_t now = rb_smtpe_now(now_ms);
    RB_OBJ_WRITE(self, &r->config, config);
    RB_OBJ_WRITE(self, &r->queue, rb_ary_new_capa(4));
    int rc = smtpe_server_new(&r->s, &c->cfg, &rb_smtpe_allocator, now);
    if (rc < 0)
        rb_smtpe_raise(rc, "Smtpe::ServerSession.new");
    return self;
}

static VALUE path_value(const smtpe_path *p)
{
    VALUE mailbox = rb_smtpe_span(p->mailbox, RB_SMTPE_UTF8);
    VALUE local = rb_smtpe_span(p->local_part, RB_SMTPE_UTF8);
    VALUE domain = rb_smtpe_span(p->domain, RB_SMTPE_UTF8);
    return rb_obj_freeze(rb_smtpe_struct(cPath, 4, mailbox, local, domain, UINT2NUM(p->flags)));
}

static VALUE params_value(const smtpe_param *params, size_t n)
{
    if (n == 0)
        return empty_list;
    VALUE list = rb_ary_new_capa((long)n);
    for (size_t i = 0; i < n; i++) {
        VALUE k = rb_smtpe_span(params[i].keyword, RB_SMTPE_UTF8);
        VALUE v = rb_smtpe_span(params[i].value, RB_SMTPE_UTF8);
        rb_ary_push(list, rb_obj_freeze(rb_assoc_new(k, v)));
    }
    return rb_obj_freeze(list);
}

static VALUE body_value(smtpe_body_type b)
{
    switch (b) {
    case SMTPE_BODY_7BIT: return sym_7bit;
    case SMTPE_BODY_8BITMIME: return sym_8bitmime;
    case SMTPE_BODY_BINARYMIME: return sym_binarymime;
    default: return sym_unspecified;
    }
}

static VALUE mail_value(VALUE id, const smtpe_event_mail *m)
{
    VALUE path = path_value(&m->reverse_path);
    VALUE size = m->has_size ? ULL2NUM(m->size) : Qnil;
    VALUE ret = m->ret == SMTPE_RET_FULL ? sym_full : m->ret == SMTPE_RET_HDRS ? sym_hdrs : Qnil;
    VALUE envid = rb_smtpe_span_or_nil(m->envid, m->has_envid, RB_SMTPE_UTF8);
    VALUE auth = rb_smtpe_span_or_nil(m->auth, m->has_auth, RB_SMTPE_UTF8);
    VALUE prio = m->has_mt_priority ? INT2NUM(m->mt_priority) : Qnil;
    VALUE by_time = m->by_mode ? LL2NUM(m->by_time) : Qnil;
    VALUE by_mode = m->by_mode ? rb_obj_freeze(rb_usascii_str_new(&m->by_mode, 1)) : Qnil;
    VALUE params = params_value(m->params, m->param_count);
    return rb_smtpe_struct(cMail, 14, id, path, size, body_value(m->body), m->smtputf8 ? Qtrue : Qfalse,
                         ret, envid, auth, m->requiretls ? Qtrue : Qfalse, prio, by_time, by_mode,
                         m->by_trace ? Qtrue : Qfalse, params);
}

static VALUE rcpt_value(VALUE id, const smtpe_event_rcpt *r)
{
    VALUE path = path_value(&r->forward_path);
    VALUE type = rb_smtpe_span_or_nil(r->orcpt_type, r->has_orcpt, RB_SMTPE_UTF8);
    VALUE orcpt = rb_smtpe_span_or_nil(r->orcpt, r->has_orcpt, RB_SMTPE_UTF8);
    return rb_smtpe_struct(cRcpt, 6, id, path, notify_lists[r->notify & 15], type, orcpt,
                         params_value(r->params, r->param_count));
}

static VALUE auth_value(VALUE id, const smtpe_event_auth *a)
{
    VALUE mech = rb_smtpe_span(a->mechanism, RB_SMTPE_UTF8);
    VALUE mid = a->mechanism_id == SMTPE_SASL_PLAIN   ? sym_plain
                : a->mechanism_id == SMTPE_SASL_LOGIN ? sym_login
                                                      : sym_other;
    int decoded = a->mechanism_id != SMTPE_SASL_OTHER;
    VALUE authzid =
        rb_smtpe_span_or_nil(a->authzid, decoded && a->authzid.len > 0, RB_SMTPE_BINARY);
    VALUE authcid = rb_smtpe_span_or_nil(a->authcid, decoded, RB_SMTPE_BINARY);
    VALUE password = rb_smtpe_span_or_nil(a->password, decoded, RB_SMTPE_BINARY);
    VALUE response =
        rb_smtpe_span_or_nil(a->response, !decoded && a->has_response, RB_SMTPE_BINARY);
    return rb_smtpe_struct(cAuth, 8, id, mech, mid, authzid, authcid, password, response,
                         UINT2NUM(a->step));
}

static VALUE addr_value(int family, const uint8_t *addr)
{
#ifdef HAVE_ARPA_INET_H
    char buf[64];
    if (family == SMTPE_PROXY_AF_INET && inet_ntop(AF_INET, addr, buf, sizeof buf))
        return rb_obj_freeze(rb_usascii_str_new_cstr(buf));
    if (family == SMTPE_PROXY_AF_INET6 && inet_ntop(AF_INET6, addr, buf, sizeof buf))
        return rb_obj_freeze(rb_usascii_str_new_cstr(buf));
#endif
    return Qnil;
}

static VALUE proxy_value(VALUE id, const smtpe_proxy_info *p)
{
    static const VALUE *const families[] = {&sym_unspec, &sym_inet, &sym_inet6, &sym_unix};
    VALUE family = (p->family >= 0 && p->family <= 3) ? *families[p->family] : sym_unspec;
    VALUE transport = p->transport == SMTPE_PROXY_TRANSPORT_STREAM  ? sym_stream
                      : p->transport == SMTPE_PROXY_TRANSPORT_DGRAM ? sym_dgram
                                                                    : sym_unspec;
    int inet = !p->local && (p->family == SMTPE_PROXY_AF_INET || p->family == SMTPE_PROXY_AF_INET6);
    VALUE tlvs = empty_list;
    smtpe_span rest = p->tlvs;
    uint8_t type;
    smtpe_span value;
    if (rest.len > 0) {
        tlvs = rb_ary_new();
        while (smtpe_proxy_tlv_next(&rest, &type, &value))
            rb_ary_push(tlvs, rb_obj_freeze(rb_assoc_new(INT2FIX(type),
                                                         rb_smtpe_span(value, RB_SMTPE_BINARY))));
        rb_obj_freeze(tlvs);
    }
    return rb_smtpe_struct(cProxy, 10, id, INT2FIX(p->version), p->local ? Qtrue : Qfalse, family,
                         transport, inet ? addr_value(p->family, p->src_addr) : Qnil,
                         inet ? INT2FIX(p->src_port) : Qnil,
                         inet ? addr_value(p->family, p->dst_addr) : Qnil,
                         inet ? INT2FIX(p->dst_port) : Qnil, tlvs);
}

static VALUE command_arg(const smtpe_event_command *c)
{
    return rb_smtpe_span(c->argument, RB_SMTPE_UTF8);
}

/* The event as its frozen Struct (all spans copied). DATA_CHUNK is not given here. */
static VALUE event_value(const smtpe_event *ev)
{
    VALUE id = ULL2NUM(ev->id);
    VALUE ab = ev->abandoned ? Qtrue : Qfalse;
    VALUE v;
    switch (ev->type) {
    case SMTPE_EV_HELO:
        v = rb_smtpe_struct(cHelo, 5, id, rb_smtpe_span(ev->helo.domain, RB_SMTPE_UTF8),
                          ev->helo.esmtp ? Qtrue : Qfalse, ev->helo.lmtp ? Qtrue : Qfalse, ab);
        break;
    case SMTPE_EV_MAIL: v = mail_value(id, &ev->mail); break;
    case SMTPE_EV_RCPT: v = rcpt_value(id, &ev->rcpt); break;
    case SMTPE_EV_DATA: v = rb_smtpe_struct(cData, 1, id); break;
    case SMTPE_EV_DATA_END: {
        const smtpe_event_data_end *d = &ev->data_end;
        VALUE status = d->status == SMTPE_DATA_OK          ? sym_ok
                       : d->status == SMTPE_DATA_TOO_BIG ? sym_too_big
                                                         : sym_bad_line_ending;
        v = rb_smtpe_struct(cDataEnd, 7, id, ULL2NUM(d->size), status,
                          (d->flags & SMTPE_DATA_NORMALISED) ? Qtrue : Qfalse,
                          (d->flags & SMTPE_DATA_HAS_8BIT) ? Qtrue : Qfalse,
                          d->chunked ? Qtrue : Qfalse, UINT2NUM(d->replies));
        break;
    }
    case SMTPE_EV_RSET: v = rb_smtpe_struct(cRset, 2, id, ab); break;
    case SMTPE_EV_VRFY: v = rb_smtpe_struct(cVrfy, 2, id, command_arg(&ev->command)); break;
    case SMTPE_EV_EXPN: v = rb_smtpe_struct(cExpn, 2, id, command_arg(&ev->command)); break;
    case SMTPE_EV_UNKNOWN:
        v = rb_smtpe_struct(cUnknown, 3, id,
                          rb_smtpe_span(ev->command.verb, RB_SMTPE_UTF8),
                          command_arg(&ev->command));
        break;
    case SMTPE_EV_QUIT: v = rb_smtpe_struct(cQuit, 2, id, ab); break;
    case SMTPE_EV_TIMEOUT: v = rb_smtpe_struct(cTimeout, 2, id, ab); break;
    case SMTPE_EV_ERROR_LIMIT: v = rb_smtpe_struct(cErrorLimit, 2, id, ab); break;
    case SMTPE_EV_STARTTLS: v = rb_smtpe_struct(cStarttls, 1, id); break;
    case SMTPE_EV_AUTH: v = auth_value(id, &ev->auth); break;
    case SMTPE_EV_BDAT:
    case SMTPE_EV_CHUNK_END:
        v = rb_smtpe_struct(ev->type == SMTPE_EV_BDAT ? cBdat : cChunkEnd, 4, id,
                          ULL2NUM(ev->bdat.size), ev->bdat.last ? Qtrue : Qfalse,
                          ev->bdat.first ? Qtrue : Qfalse);
        break;
    case SMTPE_EV_PROXY: v = proxy_value(id, &ev->proxy); break;
    case SMTPE_EV_PROXY_INVALID: v = rb_smtpe_struct(cProxyInvalid, 1, id); break;
    case SMTPE_EV_XCLIENT:
    case SMTPE_EV_XFORWARD:
        v = rb_smtpe_struct(ev->type == SMTPE_EV_XCLIENT ? cXclient : cXforward, 2, id,
                          params_value(ev->xclient.attrs, ev->xclient.count));
        break;
    default: return Qnil;
    }
    return rb_obj_freeze(v);
}

/* Takes every event the engine has queued: content into sink (dropped when sink is nil), the
 * others converted onto the session's queue. */
static void drain(rb_server *r, VALUE sink)
{
    smtpe_event ev;
    while (smtpe_server_next_event(r->s, &ev)) {
        if (ev.type == SMTPE_EV_DATA_CHUNK) {
            if (!NIL_P(sink) && ev.chunk.len > 0)
                rb_str_cat(sink, (const char *)ev.chunk.ptr, (long)ev.chunk.len);
            continue;
        }
        VALUE v = event_value(&ev);
        if (!NIL_P(v))
            rb_ary_push(r->queue, v);
    }
}

/*
 * call-seq:
 *   session.feed(inbuf, now_ms, sink = nil) -> event or nil
 *
 * The pump. Returns the next event (a frozen Smtpe::Event::* Struct), running the engine on the
 * octets of inbuf as far as it goes: the octets it consumes are removed from the front of
 * inbuf (the caller's binary String, which keeps the rest), message content (dot-unstuffed,
 * RFC 5321 §4.5.2) is appended to sink, and nil means the engine needs the host: more input,
 * the output sent (#take_output), or a verdict (#reply, #accept) for an event already given.
 * Call it again after each of those; feed("", now_ms) only takes events (after
 * #handle_expiry, say; a frozen "" will do). sink: a String, or nil to drop content; an empty
 * sink is made binary. now_ms: the monotonic clock in ms; a completed command restarts the
 * timeouts from it. The events of one read are all taken before the next octets are fed
 * (content spans die then), so a sink gets a message's content before the DataEnd event is
 * returned. Raises TypeError, FrozenError (a non-empty inbuf, or sink).
 */
static VALUE session_feed(int argc, VALUE *argv, VALUE self)
{
    VALUE inbuf, now_ms, sink = Qnil;
    rb_scan_args(argc, argv, "21", &inbuf, &now_ms, &sink);
    rb_server *r = get_session(self);
    uint64_t now = rb_smtpe_now(now_ms);
    StringValue(inbuf);
    if (RSTRING_LEN(inbuf) > 0)
        rb_check_frozen(inbuf); /* before the engine consumes what could not be removed */
    if (!NIL_P(sink)) {
        StringValue(sink);
        rb_str_modify(sink);
        if (sink == inbuf)
            rb_raise(rb_eArgError, "sink must not be inbuf");
        if (RSTRING_LEN(sink) == 0)
            rb_enc_associate(sink, rb_ascii8bit_encoding());
    }
    drain(r, sink);
    for (;;) {
        if (RARRAY_LEN(r->queue) > 0)
            return rb_ary_shift(r->queue);
        long len = RSTRING_LEN(inbuf);
        if (len == 0 || !(smtpe_server_want(r->s) & SMTPE_WANT_READ))
            return Qnil;
        smtpe_ssize n = smtpe_server_recv(r->s, (const uint8_t *)RSTRING_PTR(inbuf), (size_t)len, now);
        if (n < 0)
            rb_smtpe_raise((int)n, "ServerSession#feed");
        /* inbuf is an argument (on the VM stack): neither freed nor moved while drain runs */
        drain(r, sink);
        if (n > 0)
            rb_str_drop_bytes(inbuf, (long)n);
        else if (RARRAY_LEN(r->queue) == 0)
            return Qnil; /* progress without an event (output queued): the host sends */
    }
}

static VALUE verdict_result(int rc, const char *what)
{
    if (rc < 0)
        rb_smtpe_raise(rc, what);
    return rc == SMTPE_VOIDED ? sym_voided : Qnil;
}

static unsigned reply_code(VALUE code)
{
    return (unsigned)rb_smtpe_opt_uint(code, "code", 200, 599);
}

/* The enhanced code and text of a verdict as C strings: both converted first (to_str may run
 * Ruby code, which could free a buffer whose pointer was already taken), then both pointers
 * taken with no Ruby code in between. NUL inside raises ArgumentError. */
static void verdict_cstrs(VALUE *enhanced, VALUE *text, const char **e, const char **t)
{
    if (!NIL_P(*enhanced))
        StringValue(*enhanced);
    if (!NIL_P(*text))
        StringValue(*text);
    *e = NIL_P(*enhanced) ? NULL : StringValueCStr(*enhanced);
    *t = NIL_P(*text) ? NULL : StringValueCStr(*text);
}

/* An event id: an Integer (a Float would be truncated to another event's id). */
static uint64_t event_id(VALUE id)
{
    if (!RB_INTEGER_TYPE_P(id))
        rb_raise(rb_eTypeError, "id: must be an Integer");
    return NUM2ULL(id);
}

/*
 * call-seq:
 *   session.reply(code, enhanced = nil, text = nil) -> nil or :voided
 *
 * The verdict for the oldest event given that waits for one: reply code 200..599, enhanced
 * status code ("5.1.1"; nil: "x.0.0" from the code's class; RFC 3463), text (nil: a default;
 * a newline between the lines of a multi-line reply, but for HELO/EHLO; at most 32 lines of
 * 400 octets). Meaning by
 * event as smtpe_server_reply gives it (2xx to MAIL starts the transaction, 354 to DATA, ...).
 * Returns :voided for a RCPT whose MAIL was refused (concurrent verdicts). Raises
 * Smtpe::StateError (no verdict owed), Smtpe::InvalidArgument, Smtpe::ReplyTooLong,
 * ArgumentError (code out of range, NUL in a text). RFC 5321 §4.2.
 */
static VALUE session_reply(int argc, VALUE *argv, VALUE self)
{
    VALUE code, enhanced = Qnil, text = Qnil;
    rb_scan_args(argc, argv, "12", &code, &enhanced, &text);
    rb_server *r = get_session(self);
    unsigned c = reply_code(code);
    const char *e, *t;
    verdict_cstrs(&enhanced, &text, &e, &t);
    return verdict_result(smtpe_server_reply(r->s, c, e, t), "ServerSession#reply");
}

/*
 * call-seq: session.accept -> nil or :voided
 *
 * The engine's positive verdict for the oldest event that waits: EHLO 250 with the extensions,
 * MAIL 250 2.1.0, RCPT 250 2.1.5, DATA 354, DataEnd 250 2.0.0, STARTTLS 220, AUTH 235, ...
 * Raises Smtpe::StateError when no verdict is owed.
 */
static VALUE session_accept(VALUE self)
{
    return verdict_result(smtpe_server_accept(get_session(self)->s), "ServerSession#accept");
}

/*
 * call-seq:
 *   session.reply_id(id, code, enhanced = nil, text = nil) -> nil or :voided
 *
 * #reply for the event whose #id is id, in any order (config
 * max_pending_verdicts > 1: the RCPTs of a pipelined batch wait together; replies still leave
 * in command order, RFC 2920 §3.1). Raises as #reply.
 */
static VALUE session_reply_id(int argc, VALUE *argv, VALUE self)
{
    VALUE id, code, enhanced = Qnil, text = Qnil;
    rb_scan_args(argc, argv, "22", &id, &code, &enhanced, &text);
    rb_server *r = get_session(self);
    uint64_t i = event_id(id);
    unsigned c = reply_code(code);
    const char *e, *t;
    verdict_cstrs(&enhanced, &text, &e, &t);
    return verdict_result(smtpe_server_reply_id(r->s, i, c, e, t), "ServerSession#reply_id");
}

/*
 * call-seq: session.accept_id(id) -> nil or :voided
 *
 * #accept for the event whose #id is id (see #reply_id). Raises Smtpe::StateError.
 */
static VALUE session_accept_id(VALUE self, VALUE id)
{
    rb_server *r = get_session(self);
    return verdict_result(smtpe_server_accept_id(r->s, event_id(id)), "ServerSession#accept_id");
}

/*
 * call-seq: session.close(code = 421, enhanced = nil, text = nil) -> nil
 *
 * Queues a final reply (421, 221 or 5xx) and makes the session want to close once it is sent;
 * before any output was taken it replaces the greeting (421 4.7.0 when full, 554 to refuse).
 * Drops every verdict still owed. Raises Smtpe::StateError (already closing),
 * Smtpe::InvalidArgument, Smtpe::ReplyTooLong.
 */
static VALUE session_close(int argc, VALUE *argv, VALUE self)
{
    VALUE code, enhanced, text;
    rb_scan_args(argc, argv, "03", &code, &enhanced, &text);
    if (NIL_P(code))
        code = INT2FIX(421);
    rb_server *r = get_session(self);
    unsigned c = reply_code(code);
    const char *e, *t;
    verdict_cstrs(&enhanced, &text, &e, &t);
    verdict_result(smtpe_server_close(r->s, c, e, t), "ServerSession#close");
    return Qnil;
}

/*
 * call-seq: session.tls_started(now_ms) -> nil
 *
 * TLS is up (RFC 3207 §4.2): after a Starttls event was accepted, its 220 taken and sent, and
 * the handshake done; or, before anything was sent, for implicit TLS (RFC 8314). The session
 * starts afresh. Raises Smtpe::StateError.
 */
static VALUE session_tls_started(VALUE self, VALUE now_ms)
{
    rb_server *r = get_session(self);
    int rc = smtpe_server_tls_started(r->s, rb_smtpe_now(now_ms));
    if (rc < 0)
        rb_smtpe_raise(rc, "ServerSession#tls_started");
    return Qnil;
}

/*
 * call-seq: session.auth_challenge(data) -> nil
 *
 * For an Auth event of a mechanism the engine does not decode (mechanism_id :other): sends
 * "334 <base64 of data>" (at most 1536 octets); the client's answer comes as the next Auth
 * event, step + 1. RFC 4954 §4. Raises Smtpe::StateError, Smtpe::InvalidArgument.
 */
static VALUE session_auth_challenge(VALUE self, VALUE data)
{
    rb_server *r = get_session(self);
    StringValue(data);
    int rc = smtpe_server_auth_challenge(r->s, (const uint8_t *)RSTRING_PTR(data),
                                         (size_t)RSTRING_LEN(data));
    if (rc < 0)
        rb_smtpe_raise(rc, "ServerSession#auth_challenge");
    return Qnil;
}

/* call-seq: session.trusted = bool
 *
 * Marks the peer trusted for XCLIENT and XFORWARD (default false). */
static VALUE session_set_trusted(VALUE self, VALUE trusted)
{
    smtpe_server_set_trusted(get_session(self)->s, RTEST(trusted) ? 1 : 0);
    return trusted;
}

static const uint8_t *take_server(void *s, size_t *len) { return smtpe_server_send_buf(s, len); }
static int ack_server(void *s, size_t n) { return smtpe_server_send_ack(s, n); }

/*
 * call-seq: session.take_output(out) -> Integer
 *
 * Appends every reply octet queued to out (a String; made binary when empty), marks them sent,
 * and returns their count (0: nothing to send). The host writes them all, in one write for the
 * whole batch (RFC 2920: pipelined replies in one segment), before the session closes or a TLS
 * handshake starts.
 */
static VALUE session_take_output(VALUE self, VALUE out)
{
    rb_server *r = get_session(self);
    return SIZET2NUM(rb_smtpe_take_output(out, r->s, take_server, ack_server));
}

/* call-seq: session.want -> Integer
 *
 * What the session wants now: a bitmask of Smtpe::WANT_READ, WANT_WRITE, WANT_CLOSE,
 * WANT_VERDICT, WANT_EVENT, WANT_TLS (include/smtpe.h smtpe_server_want). */
static VALUE session_want(VALUE self) { return UINT2NUM(smtpe_server_want(get_session(self)->s)); }

#define WANT_P(name, bit)                                                                       \
    static VALUE session_##name(VALUE self)                                                     \
    {                                                                                           \
        return (smtpe_server_want(get_session(self)->s) & (bit)) ? Qtrue : Qfalse;             \
    }
WANT_P(want_read_p, SMTPE_WANT_READ)
WANT_P(want_write_p, SMTPE_WANT_WRITE)
WANT_P(want_close_p, SMTPE_WANT_CLOSE)
WANT_P(want_verdict_p, SMTPE_WANT_VERDICT)
WANT_P(want_tls_p, SMTPE_WANT_TLS)

/*
 * call-seq: session.expiry(now_ms) -> Integer or nil
 *
 * The monotonic time in ms at which #handle_expiry must be called, nil for never (no timer
 * while a verdict is owed, a handshake runs, or the session closes). Call it whenever you arm
 * your timer. RFC 5321 §4.5.3.2.
 */
static VALUE session_expiry(VALUE self, VALUE now_ms)
{
    uint64_t t = smtpe_server_expiry(get_session(self)->s, rb_smtpe_now(now_ms));
    return t == UINT64_MAX ? Qnil : ULL2NUM(t);
}

/*
 * call-seq: session.handle_expiry(now_ms) -> true or false
 *
 * Tells the engine the time; true when a timeout expired: 421 4.4.2 is queued and the next
 * #feed returns a Timeout event.
 */
static VALUE session_handle_expiry(VALUE self, VALUE now_ms)
{
    return smtpe_server_handle_expiry(get_session(self)->s, rb_smtpe_now(now_ms)) ? Qtrue : Qfalse;
}

/* call-seq: session.stats -> Smtpe::ServerStats
 *
 * The session's counters (frozen). */
static VALUE session_stats(VALUE self)
{
    smtpe_server_stats st;
    smtpe_server_get_stats(get_session(self)->s, &st);
    VALUE v = rb_smtpe_struct(cStats, 9, ULL2NUM(st.octets_in), ULL2NUM(st.octets_out),
                            UINT2NUM(st.commands), UINT2NUM(st.errors), UINT2NUM(st.transactions),
                            UINT2NUM(st.recipients), ULL2NUM(st.discarded_octets),
                            st.tls ? Qtrue : Qfalse, st.authenticated ? Qtrue : Qfalse);
    return rb_obj_freeze(v);
}

static void init_values(VALUE mSmtpe)
{
    VALUE ev = rb_const_get_at(mSmtpe, rb_intern("Event"));
    cPath = rb_smtpe_const(mSmtpe, "Path");
    cStats = rb_smtpe_const(mSmtpe, "ServerStats");
    cHelo = rb_smtpe_const(ev, "Helo");
    cMail = rb_smtpe_const(ev, "Mail");
    cRcpt = rb_smtpe_const(ev, "Rcpt");
    cData = rb_smtpe_const(ev, "Data");
    cDataEnd = rb_smtpe_const(ev, "DataEnd");
    cRset = rb_smtpe_const(ev, "Rset");
    cVrfy = rb_smtpe_const(ev, "Vrfy");
    cExpn = rb_smtpe_const(ev, "Expn");
    cUnknown = rb_smtpe_const(ev, "Unknown");
    cQuit = rb_smtpe_const(ev, "Quit");
    cTimeout = rb_smtpe_const(ev, "Timeout");
    cErrorLimit = rb_smtpe_const(ev, "ErrorLimit");
    cStarttls = rb_smtpe_const(ev, "Starttls");
    cAuth = rb_smtpe_const(ev, "Auth");
    cBdat = rb_smtpe_const(ev, "Bdat");
    cChunkEnd = rb_smtpe_const(ev, "ChunkEnd");
    cProxy = rb_smtpe_const(ev, "Proxy");
    cProxyInvalid = rb_smtpe_const(ev, "ProxyInvalid");
    cXclient = rb_smtpe_const(ev, "Xclient");
    cXforward = rb_smtpe_const(ev, "Xforward");
#define SYM(v, s) v = ID2SYM(rb_intern(s))
    SYM(sym_voided, "voided");
    SYM(sym_unspecified, "unspecified");
    SYM(sym_7bit, "7bit");
    SYM(sym_8bitmime, "8bitmime");
    SYM(sym_binarymime, "binarymime");
    SYM(sym_full, "full");
    SYM(sym_hdrs, "hdrs");
    SYM(sym_ok, "ok");
    SYM(sym_too_big, "too_big");
    SYM(sym_bad_line_ending, "bad_line_ending");
    SYM(sym_plain, "plain");
    SYM(sym_login, "login");
    SYM(sym_other, "other");
    SYM(sym_unspec, "unspec");
    SYM(sym_inet, "inet");
    SYM(sym_inet6, "inet6");
    SYM(sym_unix, "unix");
    SYM(sym_stream, "stream");
    SYM(sym_dgram, "dgram");
#undef SYM
    empty_list = rb_obj_freeze(rb_ary_new());
    rb_gc_register_mark_object(empty_list);
    static const char *const notify_names[] = {"never", "success", "failure", "delay"};
    for (unsigned m = 0; m < 16; m++) {
        VALUE list = rb_ary_new();
        for (unsigned b = 0; b < 4; b++)
            if (m & (1u << b))
                rb_ary_push(list, ID2SYM(rb_intern(notify_names[b])));
        notify_lists[m] = rb_obj_freeze(list);
        rb_gc_register_mark_object(notify_lists[m]);
    }
}

void rb_smtpe_init_server(VALUE mSmtpe)
{
    mSmtpe = rb_define_module("Smtpe"); /* the same module; lets RDoc see the classes */
    init_values(mSmtpe);
    /* the Smtpe::WANT_* constants are rb_smtpe.c's, which Init_smtpe defines first */

    /* Document-class: Smtpe::ServerConfig
     * A server engine configuration: frozen, shareable by every Thread and Ractor. */
    cServerConfig = rb_define_class_under(mSmtpe, "ServerConfig", rb_cObject);
    rb_define_alloc_func(cServerConfig, config_alloc);
    rb_define_method(cServerConfig, "initialize", config_initialize, -1);
    rb_define_method(cServerConfig, "initialize_copy", rb_smtpe_no_copy, 1);
    rb_define_method(cServerConfig, "memory_size", config_memory_size, 0);
    rb_define_method(cServerConfig, "lmtp?", config_lmtp_p, 0);
    rb_define_method(cServerConfig, "hostname", config_hostname, 0);

    /* Document-class: Smtpe::ServerSession
     * One SMTP or LMTP server session, sans-I/O: octets in (#feed), events out, verdicts in
     * (#reply, #accept), reply octets out (#take_output). */
    cServerSession = rb_define_class_under(mSmtpe, "ServerSession", rb_cObject);
    rb_define_alloc_func(cServerSession, session_alloc);
    rb_define_method(cServerSession, "initialize", session_initialize, 2);
    rb_define_method(cServerSession, "initialize_copy", rb_smtpe_no_copy, 1);
    rb_define_method(cServerSession, "feed", session_feed, -1);
    rb_define_method(cServerSession, "reply", session_reply, -1);
    rb_define_method(cServerSession, "accept", session_accept, 0);
    rb_define_method(cServerSession, "reply_id", session_reply_id, -1);
    rb_define_method(cServerSession, "accept_id", session_accept_id, 1);
    rb_define_method(cServerSession, "close", session_close, -1);
    rb_define_method(cServerSession, "tls_started", session_tls_started, 1);
    rb_define_method(cServerSession, "auth_challenge", session_auth_challenge, 1);
    rb_define_method(cServerSession, "trusted=", session_set_trusted, 1);
    rb_define_method(cServerSession, "take_output", session_take_output, 1);
    rb_define_method(cServerSession, "want", session_want, 0);
    rb_define_method(cServerSession, "want_read?", session_want_read_p, 0);
    rb_define_method(cServerSession, "want_write?", session_want_write_p, 0);
    rb_define_method(cServerSession, "want_close?", session_want_close_p, 0);
    rb_define_method(cServerSession, "want_verdict?", session_want_verdict_p, 0);
    rb_define_method(cServerSession, "want_tls?", session_want_tls_p, 0);
    rb_define_method(cServerSession, "expiry", session_expiry, 1);
    rb_define_method(cServerSession, "handle_expiry", session_handle_expiry, 1);
    rb_define_method(cServerSession, "stats", session_stats, 0);
}
