/* rb_client.c - the client engine bound to Ruby: Smtpe::ClientConfig and Smtpe::ClientSession.
 *
 * A ClientConfig is a smtpe_client_config that owns copies of all its strings (ruby_xmalloc
 * memory, no VALUE): frozen once initialised, so it is shareable between Ractors, and every
 * session marks the config it was made from, so the strings the engine reads outlive it.
 *
 * A ClientSession is one smtpe_client (allocated with rb_smtpe_allocator). Its transaction
 * (the smtpe_client_txn and every string the engine reads from it) lives in one ruby_xmalloc
 * block that the session owns from #submit until the TRANSACTION_DONE event is taken, or the
 * session is freed. Every event is turned into its Smtpe::ClientEvent Struct as soon as it is
 * taken: spans are copied into frozen Strings before the next engine call.
 *
 * GC: the only pointers into Ruby memory given to the engine are RSTRING_PTRs of Strings held
 * on the C stack, and only for the length of one engine call that allocates nothing.
 */
#include "rb_smtpe.h"

#include <string.h>

/* Written once in rb_smtpe_init_client (registered with the GC), read after. */
static VALUE cConfig, cSession;
static VALUE cReady, cStarttls, cAuthStep, cContent, cOutcome, cDone, cClosed;

/* The IDs of rb_smtpe_ext_names, bit i at [i] (Ready#extensions). */
static ID ext_ids[RB_SMTPE_EXT_COUNT];

/* SMTPE_OUTCOME_* 1..4 and SMTPE_CLOSE_* 0..8. */
static ID outcome_ids[5];
static const char *const close_names[] = {"quit",         "server_421",    "protocol_error",
                                          "lost",         "timeout",       "tls_required",
                                          "auth_failed",  "aborted",       "refused"};
#define CLOSE_COUNT (sizeof close_names / sizeof *close_names)
static ID close_ids[CLOSE_COUNT];

/* ---------------------------------------------------------------------------------------------
 * Small conversions
 * ------------------------------------------------------------------------------------------- */

static VALUE code_or_nil(unsigned code)
{
    return code ? UINT2NUM(code) : Qnil;
}

/* Copies str (a String with no NUL) into *at as a NUL-terminated string; returns it. */
static const char *put_cstr(char **at, VALUE str)
{
    char *p = *at;
    size_t n = (size_t)RSTRING_LEN(str);
    memcpy(p, RSTRING_PTR(str), n);
    p[n] = 0;
    *at = p + n + 1;
    return p;
}

static smtpe_span put_span(char **at, VALUE str)
{
    smtpe_span s;
    size_t n = (size_t)RSTRING_LEN(str);
    s.ptr = (const uint8_t *)*at;
    s.len = n;
    memcpy(*at, RSTRING_PTR(str), n);
    *at += n;
    return s;
}

static int hash_pair(VALUE key, VALUE val, VALUE list)
{
    rb_ary_push(list, rb_assoc_new(key, val));
    return ST_CONTINUE;
}

/* The [name, value] pairs of a Hash or an Array of pairs (XCLIENT, XFORWARD), as a new Array
 * of frozen Strings name, value, name, value, ...; *octets gets the total length. */
static VALUE attr_pairs(VALUE v, const char *key, size_t *octets)
{
    VALUE list, out;
    if (RB_TYPE_P(v, T_HASH)) {
        list = rb_ary_new_capa((long)RHASH_SIZE(v)); /* no to_a: it may be redefined */
        rb_hash_foreach(v, hash_pair, list);
    } else if (RB_TYPE_P(v, T_ARRAY))
        list = rb_ary_dup(v); /* a to_str below cannot change what we walk */
    else
        rb_raise(rb_eTypeError, "%s: must be a Hash or an Array of [name, value]", key);
    out = rb_ary_new_capa(2 * RARRAY_LEN(list));
    *octets = 0;
    for (long i = 0; i < RARRAY_LEN(list); i++) {
        VALUE pair = rb_ary_entry(list, i), name, value;
        if (!RB_TYPE_P(pair, T_ARRAY) || RARRAY_LEN(pair) != 2)
            rb_raise(rb_eTypeError, "%s: each attribute must be a [name, value] pair", key);
        name = rb_ary_entry(pair, 0);
        value = rb_ary_entry(pair, 1);
        if (SYMBOL_P(name))
            name = rb_sym2str(name);
        name = rb_smtpe_cstr_str(name, key);
        value = rb_smtpe_cstr_str(value, key);
        rb_ary_push(out, name);
        rb_ary_push(out, value);
        *octets += (size_t)RSTRING_LEN(name) + (size_t)RSTRING_LEN(value);
    }
    return out;
}

/* Fills params[0..n) from attr_pairs' Array, the octets at *at. */
static void put_params(smtpe_param *params, VALUE pairs, char **at)
{
    for (long i = 0; i + 1 < RARRAY_LEN(pairs); i += 2) {
        params[i / 2].keyword = put_span(at, RARRAY_AREF(pairs, i));
        params[i / 2].value = put_span(at, RARRAY_AREF(pairs, i + 1));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Smtpe::ClientConfig
 * ------------------------------------------------------------------------------------------- */

enum { S_HELO, S_MECH, S_AUTHZID, S_USER, S_PASSWORD, S_TOKEN, S_COUNT };

typedef struct client_cfg {
    smtpe_client_config cfg; /* its strings point at str[] and xmem */
    char *str[S_COUNT];      /* owned copies (ruby_xmalloc) */
    void *xmem;              /* the XCLIENT attributes: smtpe_param[] then their octets */
    size_t owned;            /* octets of str[] and xmem */
    size_t memory_size;      /* smtpe_client_memory_size of cfg */
    int state;               /* 0 new, 1 initialising (or failed), 2 ready */
} client_cfg;

static void cfg_free(void *p)
{
    client_cfg *k = p;
    for (int i = 0; i < S_COUNT; i++)
        ruby_xfree(k->str[i]);
    ruby_xfree(k->xmem);
    ruby_xfree(k);
}

static size_t cfg_size(const void *p)
{
    const client_cfg *k = p;
    return sizeof *k + k->owned;
}

static const rb_data_type_t cfg_type = {
    .wrap_struct_name = "Smtpe::ClientConfig",
    .function = {.dmark = NULL, .dfree = cfg_free, .dsize = cfg_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY | RUBY_TYPED_FROZEN_SHAREABLE,
};

static VALUE cfg_alloc(VALUE klass)
{
    client_cfg *k;
    return TypedData_Make_Struct(klass, client_cfg, &cfg_type, k);
}

/* The config of a ClientConfig that is ready; raises otherwise. */
static const client_cfg *cfg_ready(VALUE obj)
{
    const client_cfg *k = rb_check_typeddata(obj, &cfg_type);
    if (k->state != 2)
        rb_raise(rb_eRuntimeError, "Smtpe::ClientConfig not initialized");
    return k;
}

static const char *const cfg_keys[] = {
    "helo_name", "lmtp", "tls", "auth_mechanism", "auth_authzid", "auth_user",
    "auth_password", "auth_token", "auth_plaintext_ok", "chunking", "chunk_size",
    "line_ending", "pipelining", "max_unanswered", "max_recipients", "max_reply_line",
    "max_reply_size", "output_buffer_size", "greeting_timeout_ms", "command_timeout_ms",
    "data_timeout_ms", "data_block_timeout_ms", "data_end_timeout_ms", "xclient", NULL};

/* A string option: copied into k->str[slot] (nil: NULL) and returned; undef leaves dflt. */
static const char *cfg_string(client_cfg *k, VALUE opts, const char *key, int slot,
                              const char *dflt)
{
    VALUE v = rb_smtpe_opt(opts, key);
    if (v == Qundef)
        return dflt;
    k->str[slot] = rb_smtpe_cstr_dup(v, key);
    if (k->str[slot])
        k->owned += strlen(k->str[slot]) + 1;
    return k->str[slot];
}

/* The keyword named as the field of c; absent, the field keeps its default. */
#define CFG_BOOL(field) (c->field = rb_smtpe_kw_bool(opts, #field, c->field))
#define CFG_UINT(field, max) (c->field = rb_smtpe_kw_uint(opts, #field, 0, (max), c->field))

static void cfg_xclient(client_cfg *k, VALUE opts)
{
    VALUE v = rb_smtpe_opt(opts, "xclient"), pairs;
    size_t octets, count, len;
    char *at;
    if (v == Qundef || NIL_P(v))
        return;
    pairs = attr_pairs(v, "xclient", &octets);
    count = (size_t)RARRAY_LEN(pairs) / 2;
    if (count == 0)
        return;
    len = count * sizeof(smtpe_param) + octets;
    k->xmem = ruby_xmalloc(len); /* nothing allocates from here to the end */
    k->owned += len;
    at = (char *)k->xmem + count * sizeof(smtpe_param);
    put_params(k->xmem, pairs, &at);
    k->cfg.xclient = k->xmem;
    k->cfg.xclient_count = count;
    RB_GC_GUARD(pairs);
}

/*
 * call-seq:
 *   Smtpe::ClientConfig.new(**opts) -> config
 *
 * A client engine configuration (smtpe_client_config), frozen and shareable between Ractors
 * once made: any number of ClientSessions on any Threads, Fibers or Ractors may use it. It
 * keeps its own copies of every String given. Every keyword is optional; the defaults are
 * smtpe_client_config_init's.
 *
 * helo_name:: String, the EHLO/LHLO argument: a domain or an address-literal, ASCII, at most
 *             255 octets (RFC 5321 §4.1.1.1). Default "localhost".
 * lmtp:: true to speak LMTP (RFC 2033). Default false.
 * tls:: :none (default), :opportunistic, :required or :implicit (RFC 3207, RFC 8314).
 * auth_mechanism:: nil (no AUTH, the default), "" (the best the server offers that the
 *                  credentials allow) or a SASL mechanism name (RFC 4954).
 * auth_authzid, auth_user, auth_password, auth_token:: Strings or nil: PLAIN's authorization
 *                  identity, the authentication identity, the password (PLAIN, LOGIN), the
 *                  OAuth 2.0 bearer token (XOAUTH2, OAUTHBEARER). At most 255 octets (tokens
 *                  8192), no control octet.
 * auth_plaintext_ok:: true allows AUTH without TLS. Default false.
 * chunking:: use BDAT when the server offers CHUNKING (RFC 3030). Default true.
 * chunk_size:: most wire octets of one BDAT, 1..output_buffer_size - 64; 0 (default) as large
 *              as the output buffer allows.
 * line_ending:: :normalise (default: bare CR and LF in content go as CRLF) or :refuse.
 * pipelining:: use PIPELINING when offered (RFC 2920). Default true.
 * max_unanswered:: octets of commands sent and not yet answered, 512..1048576 (4096).
 * max_recipients:: recipients of one transaction, 1..100000 (1000).
 * max_reply_line:: octets of one reply line with its CRLF, 512..65536 (2048).
 * max_reply_size:: octets of one reply, max_reply_line..1048576 (65536).
 * output_buffer_size:: octets of the output ring, 4096..16777216 (16384).
 * greeting_timeout_ms, command_timeout_ms, data_timeout_ms, data_block_timeout_ms,
 * data_end_timeout_ms:: timeouts in milliseconds, 0 for none (RFC 5321 §4.5.3.2; defaults
 *              5 min, 5 min, 2 min, 3 min, 10 min).
 * xclient:: Hash or Array of [name, value] of Postfix XCLIENT attributes (NAME, ADDR, PORT,
 *           PROTO, HELO, LOGIN, DESTADDR, DESTPORT), Strings (names may be Symbols).
 *
 * Raises ArgumentError for an unknown keyword or an Integer out of its type's range,
 * TypeError for a value of the wrong class, Smtpe::InvalidArgument for a bad string (a NUL,
 * CR or LF, a malformed helo_name), Smtpe::ConfigError for a limit out of range or
 * credentials too long for the output buffer (RFC 4954 §4: the AUTH line must fit it), and
 * RuntimeError when called on a config already initialized.
 */
static VALUE cfg_initialize(int argc, VALUE *argv, VALUE self)
{
    client_cfg *k = rb_check_typeddata(self, &cfg_type);
    smtpe_client_config *c = &k->cfg;
    smtpe_client *probe = NULL;
    VALUE opts = Qnil, v;
    int err;
    rb_scan_args(argc, argv, ":", &opts);
    if (k->state != 0)
        rb_raise(rb_eRuntimeError, "Smtpe::ClientConfig already initialized");
    k->state = 1;
    rb_smtpe_check_keys(opts, cfg_keys);
    smtpe_client_config_init(c);

    c->helo_name = cfg_string(k, opts, "helo_name", S_HELO, c->helo_name);
    if (!c->helo_name)
        rb_raise(rb_eTypeError, "helo_name: must be a String");
    c->auth_mechanism = cfg_string(k, opts, "auth_mechanism", S_MECH, NULL);
    c->auth_authzid = cfg_string(k, opts, "auth_authzid", S_AUTHZID, NULL);
    c->auth_user = cfg_string(k, opts, "auth_user", S_USER, NULL);
    c->auth_password = cfg_string(k, opts, "auth_password", S_PASSWORD, NULL);
    c->auth_token = cfg_string(k, opts, "auth_token", S_TOKEN, NULL);

    CFG_BOOL(lmtp);
    CFG_BOOL(auth_plaintext_ok);
    CFG_BOOL(chunking);
    CFG_BOOL(pipelining);
    if ((v = rb_smtpe_opt(opts, "tls")) != Qundef) {
        static const char *const names[] = {"none", "opportunistic", "required", "implicit"};
        static const smtpe_tls_policy vals[] = {SMTPE_TLS_NONE, SMTPE_TLS_OPPORTUNISTIC,
                                                SMTPE_TLS_REQUIRED, SMTPE_TLS_IMPLICIT};
        c->tls = vals[rb_smtpe_sym_index(v, "tls", names, 4)];
    }
    if ((v = rb_smtpe_opt(opts, "line_ending")) != Qundef) {
        static const char *const names[] = {"normalise", "refuse"};
        c->line_ending = rb_smtpe_sym_index(v, "line_ending", names, 2) == 0
                             ? SMTPE_LINE_ENDING_NORMALISE
                             : SMTPE_LINE_ENDING_REFUSE;
    }
    CFG_UINT(chunk_size, SIZE_MAX);
    CFG_UINT(max_unanswered, SIZE_MAX);
    CFG_UINT(max_recipients, UINT_MAX);
    CFG_UINT(max_reply_line, SIZE_MAX);
    CFG_UINT(max_reply_size, SIZE_MAX);
    CFG_UINT(output_buffer_size, SIZE_MAX);
    CFG_UINT(greeting_timeout_ms, UINT64_MAX);
    CFG_UINT(command_timeout_ms, UINT64_MAX);
    CFG_UINT(data_timeout_ms, UINT64_MAX);
    CFG_UINT(data_block_timeout_ms, UINT64_MAX);
    CFG_UINT(data_end_timeout_ms, UINT64_MAX);
    cfg_xclient(k, opts);

    /* the engine judges: a session made and freed says what is wrong, precisely */
    err = smtpe_client_new(&probe, c, &rb_smtpe_allocator, 0);
    if (err < 0)
        rb_smtpe_raise(err, "Smtpe::ClientConfig.new");
    smtpe_client_free(probe);
    k->memory_size = smtpe_client_memory_size(c);
    if (k->memory_size == 0)
        rb_smtpe_raise(SMTPE_ERR_CONFIG, "Smtpe::ClientConfig.new");
    k->state = 2;
    rb_obj_freeze(self);
    return self;
}
#undef CFG_BOOL
#undef CFG_UINT

/*
 * call-seq:
 *   config.memory_size -> Integer
 *
 * Octets of engine memory one session made from this config takes
 * (smtpe_client_memory_size: fixed, whatever the server sends).
 */
static VALUE cfg_memory_size(VALUE self)
{
    return SIZET2NUM(cfg_ready(self)->memory_size);
}


/* ---------------------------------------------------------------------------------------------
 * Smtpe::ClientSession
 * ------------------------------------------------------------------------------------------- */

typedef struct client_sess {
    smtpe_client *c;
    VALUE config;       /* the ClientConfig (marked: its strings outlive the session) */
    const client_cfg *k;
    void *txn;          /* the current transaction's block (ruby_xmalloc), NULL for none */
    size_t txn_len;
    VALUE rcpts;        /* frozen Array of the transaction's recipient Strings, or nil */
    size_t memory_size; /* the engine's */
    int ready_seen;
} client_sess;

static void sess_mark(void *p)
{
    client_sess *s = p;
    rb_gc_mark(s->config);
    rb_gc_mark(s->rcpts);
}

static void sess_free(void *p)
{
    client_sess *s = p;
    smtpe_client_free(s->c); /* touches nothing of the config */
    ruby_xfree(s->txn);
    ruby_xfree(s);
}

static size_t sess_size(const void *p)
{
    const client_sess *s = p;
    return sizeof *s + s->memory_size + s->txn_len;
}

static const rb_data_type_t sess_type = {
    .wrap_struct_name = "Smtpe::ClientSession",
    .function = {.dmark = sess_mark, .dfree = sess_free, .dsize = sess_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE sess_alloc(VALUE klass)
{
    client_sess *s;
    VALUE obj = TypedData_Make_Struct(klass, client_sess, &sess_type, s);
    s->config = Qnil;
    s->rcpts = Qnil;
    return obj;
}

static client_sess *sess_of(VALUE self)
{
    client_sess *s = rb_check_typeddata(self, &sess_type);
    if (!s->c)
        rb_raise(rb_eRuntimeError, "Smtpe::ClientSession not initialized");
    return s;
}

/*
 * call-seq:
 *   Smtpe::ClientSession.new(config, now_ms) -> session
 *
 * A client session (smtpe_client_new) for a connection the host has just opened; with
 * tls: :implicit, one whose TLS handshake the host runs before calling #tls_started. It waits
 * for the greeting (RFC 5321 §3.1) until now_ms + greeting_timeout_ms.
 *
 * config:: a Smtpe::ClientConfig (kept alive by the session).
 * now_ms:: Integer, the monotonic clock in milliseconds
 *          (Process.clock_gettime(Process::CLOCK_MONOTONIC, :millisecond)).
 *
 * A session is used by one Thread, Fiber or Ractor at a time and is not shareable.
 * Raises TypeError for a config of another class or a bad now_ms, RangeError for a negative
 * now_ms, RuntimeError for a config not initialized (or a session initialized twice),
 * NoMemoryError when its config.memory_size octets cannot be had.
 */
static VALUE sess_initialize(VALUE self, VALUE config, VALUE now_ms)
{
    client_sess *s = rb_check_typeddata(self, &sess_type);
    const client_cfg *k;
    uint64_t now;
    int err;
    if (s->c)
        rb_raise(rb_eRuntimeError, "Smtpe::ClientSession already initialized");
    k = cfg_ready(config);
    now = rb_smtpe_now(now_ms);
    err = smtpe_client_new(&s->c, &k->cfg, &rb_smtpe_allocator, now);
    if (err < 0) {
        s->c = NULL;
        rb_smtpe_raise(err, "Smtpe::ClientSession.new");
    }
    s->config = config;
    s->k = k;
    s->memory_size = k->memory_size;
    return self;
}

/* ---------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------- */

/* A Ready Struct of caps (spans copied). */
static VALUE ready_value(const smtpe_client_caps *caps)
{
    VALUE exts = rb_ary_new(), auth = rb_ary_new();
    smtpe_span a = caps->auth;
    for (size_t i = 0; i < RB_SMTPE_EXT_COUNT; i++)
        if (caps->extensions & (1u << i))
            rb_ary_push(exts, ID2SYM(ext_ids[i]));
    for (size_t i = 0; i < a.len;) {
        size_t j = i;
        while (j < a.len && a.ptr[j] != ' ')
            j++;
        if (j > i) {
            smtpe_span word = {a.ptr + i, j - i};
            rb_ary_push(auth, rb_smtpe_span(word, RB_SMTPE_TEXT));
        }
        i = j + 1;
    }
    rb_ary_freeze(exts);
    rb_ary_freeze(auth);
    return rb_obj_freeze(rb_smtpe_struct(cReady, 6, exts, caps->esmtp ? Qtrue : Qfalse,
                                       caps->size_limit ? ULL2NUM(caps->size_limit) : Qnil,
                                       auth, caps->tls ? Qtrue : Qfalse,
                                       caps->authenticated ? Qtrue : Qfalse));
}

/* Frees the transaction's block: its TRANSACTION_DONE was taken (the engine no longer reads
 * it). */
static void txn_release(client_sess *s)
{
    ruby_xfree(s->txn);
    s->txn = NULL;
    s->txn_len = 0;
    s->rcpts = Qnil;
}

static VALUE outcome_value(client_sess *s, const smtpe_client_outcome *o)
{
    VALUE rcpt = NIL_P(s->rcpts) ? Qnil : rb_ary_entry(s->rcpts, (long)o->index);
    VALUE kind = o->outcome >= 1 && o->outcome <= 4 ? ID2SYM(outcome_ids[o->outcome]) : Qnil;
    VALUE enhanced = rb_smtpe_span_or_nil(o->enhanced, o->enhanced.len > 0, RB_SMTPE_TEXT);
    VALUE text = rb_smtpe_span(o->text, RB_SMTPE_TEXT);
    return rb_obj_freeze(rb_smtpe_struct(cOutcome, 8, SIZET2NUM(o->index), rcpt, kind,
                                       code_or_nil(o->code), enhanced, text,
                                       o->local ? Qtrue : Qfalse,
                                       o->before_mail ? Qtrue : Qfalse));
}

/* The next event as its Struct, or nil for none. */
static VALUE take_event(client_sess *s)
{
    smtpe_client_event ev;
    if (smtpe_client_next_event(s->c, &ev) != 1)
        return Qnil;
    switch (ev.type) {
    case SMTPE_CEV_READY:
        s->ready_seen = 1;
        return ready_value(&ev.ready);
    case SMTPE_CEV_STARTTLS:
        return rb_obj_freeze(rb_smtpe_struct(cStarttls, 1, INT2FIX(220)));
    case SMTPE_CEV_AUTH_STEP: {
        VALUE chal = ev.auth_step.step == 0
                         ? Qnil
                         : rb_smtpe_span(ev.auth_step.challenge, RB_SMTPE_BINARY);
        return rb_obj_freeze(rb_smtpe_struct(cAuthStep, 2, UINT2NUM(ev.auth_step.step), chal));
    }
    case SMTPE_CEV_CONTENT: {
        const smtpe_client_caps *caps = smtpe_client_get_caps(s->c);
        int bdat = s->k->cfg.chunking && (caps->extensions & SMTPE_EXT_CHUNKING);
        return rb_obj_freeze(rb_smtpe_struct(cContent, 1, bdat ? Qtrue : Qfalse));
    }
    case SMTPE_CEV_OUTCOME:
        return outcome_value(s, &ev.outcome);
    case SMTPE_CEV_TRANSACTION_DONE: {
        smtpe_client_done d = ev.done;
        txn_release(s); /* before anything allocates: nothing is left to leak */
        return rb_obj_freeze(rb_smtpe_struct(cDone, 5, SIZET2NUM(d.delivered), SIZET2NUM(d.permanent),
                                           SIZET2NUM(d.temporary), SIZET2NUM(d.unknown),
                                           d.reusable ? Qtrue : Qfalse));
    }
    case SMTPE_CEV_CLOSED: {
        int r = ev.closed.reason;
        VALUE reason = r >= 0 && (size_t)r < CLOSE_COUNT ? ID2SYM(close_ids[r]) : INT2FIX(r);
        return rb_obj_freeze(rb_smtpe_struct(cClosed, 3, reason, code_or_nil(ev.closed.code),
                                           rb_smtpe_span(ev.closed.text, RB_SMTPE_TEXT)));
    }
    default:
        return Qnil;
    }
}

/*
 * call-seq:
 *   session.feed(inbuf, now_ms) -> event or nil
 *
 * The pump: gives the next event, feeding the octets read from the server as it needs them
 * (smtpe_client_recv, smtpe_client_next_event). It first returns an event already queued;
 * else, while inbuf holds octets, feeds them, removes those the engine consumed from the
 * front of inbuf, and returns the first event that came of them. nil: the engine needs the
 * host (more input, output to send, content, an AUTH response) - see #want.
 *
 * Call it until it returns nil (with "" once the octets are all consumed: events may still be
 * queued), then #take_output: a host feeds everything it has read before it sends the output
 * queued meanwhile, so that a reply that came before a command was written is judged
 * unsolicited (RFC 2920 §3.1; smtpe_client_recv).
 *
 * inbuf:: a mutable String of the server's octets (binary; "" only takes queued events).
 * now_ms:: Integer, the monotonic clock in milliseconds.
 *
 * Returns a Smtpe::ClientEvent::Ready, Starttls, AuthStep, Content, Outcome, TransactionDone
 * or Closed (frozen, its Strings frozen copies), or nil. A reply that breaks the protocol is
 * no error here: the session ends with Closed :protocol_error (RFC 5321 §4.2, §4.3.2).
 * Raises TypeError (inbuf not a String), FrozenError (inbuf frozen), Smtpe::StateError (for
 * tls: :implicit, before #tls_started).
 */
static VALUE sess_feed(VALUE self, VALUE inbuf, VALUE now_ms)
{
    client_sess *s = sess_of(self);
    uint64_t now = rb_smtpe_now(now_ms);
    VALUE ev;
    StringValue(inbuf);
    ev = take_event(s);
    if (!NIL_P(ev))
        return ev;
    if (RSTRING_LEN(inbuf) > 0)
        rb_check_frozen(inbuf); /* before the engine consumes what could not be removed */
    while (RSTRING_LEN(inbuf) > 0) {
        smtpe_ssize n = smtpe_client_recv(s->c, (const uint8_t *)RSTRING_PTR(inbuf),
                                          (size_t)RSTRING_LEN(inbuf), now);
        if (n < 0)
            rb_smtpe_raise((int)n, "ClientSession#feed");
        if (n > 0)
            rb_str_drop_bytes(inbuf, (long)n);
        ev = take_event(s);
        if (!NIL_P(ev) || n == 0)
            break;
    }
    RB_GC_GUARD(inbuf);
    return ev;
}

/* ---------------------------------------------------------------------------------------------
 * Transactions
 * ------------------------------------------------------------------------------------------- */

static const char *const submit_keys[] = {
    "reverse_path", "recipients", "content", "body", "smtputf8", "ret", "envid", "requiretls",
    "mt_priority", "by_time", "by_mode", "xforward", NULL};
static const char *const rcpt_keys[] = {"address", "notify", "orcpt", NULL};

static unsigned notify_bits(VALUE v)
{
    static const char *const names[] = {"never", "success", "failure", "delay"};
    static const unsigned bits[] = {SMTPE_NOTIFY_NEVER, SMTPE_NOTIFY_SUCCESS,
                                    SMTPE_NOTIFY_FAILURE, SMTPE_NOTIFY_DELAY};
    unsigned n = 0;
    if (NIL_P(v) || v == Qundef)
        return 0;
    if (!RB_TYPE_P(v, T_ARRAY))
        rb_raise(rb_eTypeError, "notify: must be an Array of Symbols");
    for (long i = 0; i < RARRAY_LEN(v); i++)
        n |= bits[rb_smtpe_sym_index(rb_ary_entry(v, i), "notify", names, 4)];
    return n;
}

/* What #submit gathered before it allocates: frozen Strings and the block's size. */
typedef struct txn_plan {
    VALUE reverse_path, rcpts, orcpts, envid, xforward;
    size_t octets;
} txn_plan;

/* Reads recipients into plan: rcpts (frozen forward-path Strings), orcpts (frozen String or
 * nil each), notifies (Integer each). */
static void plan_rcpts(txn_plan *p, VALUE list, VALUE notifies, unsigned max)
{
    long n;
    if (!RB_TYPE_P(list, T_ARRAY))
        rb_raise(rb_eTypeError, "recipients: must be an Array");
    list = rb_ary_dup(list); /* a to_str below cannot change what we walk */
    n = RARRAY_LEN(list);
    if (n < 1 || (unsigned long)n > max)
        rb_smtpe_raisef(SMTPE_ERR_INVALID_ARGUMENT,
                        "recipients: must hold 1..%u (the config's max_recipients)", max);
    p->rcpts = rb_ary_new_capa(n);
    p->orcpts = rb_ary_new_capa(n);
    for (long i = 0; i < n; i++) {
        VALUE r = rb_ary_entry(list, i), addr, orcpt = Qnil;
        unsigned notify = 0;
        if (RB_TYPE_P(r, T_HASH)) {
            VALUE v;
            rb_smtpe_check_keys(r, rcpt_keys);
            addr = rb_smtpe_opt(r, "address");
            if (addr == Qundef)
                rb_raise(rb_eArgError, "recipients[%ld]: missing key :address", i);
            notify = notify_bits(rb_smtpe_opt(r, "notify"));
            v = rb_smtpe_opt(r, "orcpt");
            if (v != Qundef && !NIL_P(v)) {
                orcpt = rb_smtpe_cstr_str(v, "orcpt");
                p->octets += (size_t)RSTRING_LEN(orcpt) + 1;
            }
        } else {
            addr = r;
        }
        addr = rb_smtpe_cstr_str(addr, "recipients");
        p->octets += (size_t)RSTRING_LEN(addr) + 1;
        rb_ary_push(p->rcpts, addr);
        rb_ary_push(p->orcpts, orcpt);
        rb_ary_push(notifies, UINT2NUM(notify));
    }
    RB_GC_GUARD(list);
}

/* An optional String keyword as a frozen String (nil when absent or nil). */
static VALUE opt_cstr(VALUE opts, const char *key, size_t *octets)
{
    VALUE v = rb_smtpe_opt(opts, key);
    if (v == Qundef || NIL_P(v))
        return Qnil;
    v = rb_smtpe_cstr_str(v, key);
    *octets += (size_t)RSTRING_LEN(v) + 1;
    return v;
}

/* The fields of txn that are no strings, from opts. */
static void txn_scalars(smtpe_client_txn *t, VALUE opts)
{
    VALUE v;
    if ((v = rb_smtpe_opt(opts, "body")) != Qundef && !NIL_P(v)) {
        static const char *const names[] = {"7bit", "8bitmime", "binarymime"};
        static const smtpe_body_type vals[] = {SMTPE_BODY_7BIT, SMTPE_BODY_8BITMIME,
                                               SMTPE_BODY_BINARYMIME};
        t->body = vals[rb_smtpe_sym_index(v, "body", names, 3)];
    }
    if ((v = rb_smtpe_opt(opts, "ret")) != Qundef && !NIL_P(v)) {
        static const char *const names[] = {"full", "hdrs"};
        t->ret = rb_smtpe_sym_index(v, "ret", names, 2) == 0 ? SMTPE_RET_FULL : SMTPE_RET_HDRS;
    }
    t->smtputf8 = rb_smtpe_kw_bool(opts, "smtputf8", t->smtputf8);
    t->requiretls = rb_smtpe_kw_bool(opts, "requiretls", t->requiretls);
    if ((v = rb_smtpe_opt(opts, "mt_priority")) != Qundef && !NIL_P(v)) {
        if (!RB_INTEGER_TYPE_P(v))
            rb_raise(rb_eTypeError, "mt_priority: must be an Integer");
        t->has_mt_priority = 1;
        t->mt_priority = NUM2INT(v);
    }
    if ((v = rb_smtpe_opt(opts, "by_mode")) != Qundef && !NIL_P(v)) {
        VALUE name = SYMBOL_P(v) ? rb_sym2str(v) : v;
        if (!RB_TYPE_P(name, T_STRING) || RSTRING_LEN(name) != 1 ||
            (RSTRING_PTR(name)[0] != 'R' && RSTRING_PTR(name)[0] != 'N'))
            rb_raise(rb_eArgError, "by_mode: must be \"R\" or \"N\"");
        t->by_mode = RSTRING_PTR(name)[0];
    }
    if ((v = rb_smtpe_opt(opts, "by_time")) != Qundef && !NIL_P(v)) {
        if (!RB_INTEGER_TYPE_P(v))
            rb_raise(rb_eTypeError, "by_time: must be an Integer of seconds");
        if (!t->by_mode)
            rb_raise(rb_eArgError, "by_time: needs by_mode");
        t->by_time = NUM2LL(v);
    }
}

/*
 * call-seq:
 *   session.submit(reverse_path:, recipients:, content: nil, body: nil, smtputf8: false,
 *                  ret: nil, envid: nil, requiretls: false, mt_priority: nil, by_time: nil,
 *                  by_mode: nil, xforward: nil) -> nil
 *
 * Submits a mail transaction (smtpe_client_submit; RFC 5321 §3.3), at any time before #quit,
 * even before the greeting; one at a time: the next only once this one's TransactionDone
 * event was taken. The session keeps its own copy of everything until then.
 *
 * reverse_path:: String, the mailbox without angle brackets; "" for the null path <>.
 * recipients:: Array of 1..max_recipients forward-paths: Strings ("bob@example.org",
 *              "postmaster"), or Hashes {address:, notify:, orcpt:} with notify an Array of
 *              :success, :failure, :delay, or [:never] (RFC 3461 §4.1) and orcpt
 *              "rfc822;bob@example.org", the address decoded (RFC 3461 §4.2). Each
 *              Outcome#recipient is the (frozen) address given here.
 * content:: the whole content as a String, or nil: when given it is scanned
 *           (smtpe_content_scan) so that SIZE= is sent and what must be refused (8-bit data
 *           without 8BITMIME, a long line under DATA, over the server's SIZE) is refused
 *           before MAIL. The content itself is still given by #content.
 * body:: nil, :"7bit", :"8bitmime" (RFC 6152) or :binarymime (RFC 3030).
 * smtputf8:: true for SMTPUTF8 (RFC 6531; set by the engine when an address is not ASCII).
 * ret:: nil, :full or :hdrs (RFC 3461 §4.3); envid:: String, ENVID= decoded (§4.4).
 * requiretls:: true for REQUIRETLS (RFC 8689).
 * mt_priority:: nil or an Integer -9..9 (RFC 6710).
 * by_time, by_mode:: DELIVERBY (RFC 2852): seconds and "R" or "N".
 * xforward:: Hash or Array of [name, value] Postfix XFORWARD attributes.
 *
 * Raises ArgumentError (an unknown or missing keyword, a bad Symbol), TypeError (a value of
 * the wrong class), Smtpe::InvalidArgument (a malformed path or parameter, a NUL, too many
 * recipients; nothing is queued), Smtpe::StateError (a transaction under way, QUIT asked for,
 * or the session over).
 */
static VALUE sess_submit(int argc, VALUE *argv, VALUE self)
{
    client_sess *s = sess_of(self);
    VALUE opts = Qnil, v, content, notifies = rb_ary_new();
    txn_plan p = {Qnil, Qnil, Qnil, Qnil, Qnil, 0};
    smtpe_client_txn t, *tp;
    smtpe_client_rcpt *rc;
    smtpe_param *xf;
    size_t n_rcpt, n_xf = 0, head, xf_octets = 0;
    char *blk, *at;
    int err;

    rb_scan_args(argc, argv, ":", &opts);
    rb_smtpe_check_keys(opts, submit_keys);
    if (s->txn)
        rb_smtpe_raisef(SMTPE_ERR_STATE, "ClientSession#submit: a transaction is under way");
    memset(&t, 0, sizeof t);

    v = rb_smtpe_opt(opts, "reverse_path");
    if (v == Qundef)
        rb_raise(rb_eArgError, "missing keyword: :reverse_path");
    p.reverse_path = rb_smtpe_cstr_str(v, "reverse_path");
    p.octets += (size_t)RSTRING_LEN(p.reverse_path) + 1;
    v = rb_smtpe_opt(opts, "recipients");
    if (v == Qundef)
        rb_raise(rb_eArgError, "missing keyword: :recipients");
    plan_rcpts(&p, v, notifies, s->k->cfg.max_recipients);
    p.envid = opt_cstr(opts, "envid", &p.octets);
    if ((v = rb_smtpe_opt(opts, "xforward")) != Qundef && !NIL_P(v)) {
        p.xforward = attr_pairs(v, "xforward", &xf_octets);
        n_xf = (size_t)RARRAY_LEN(p.xforward) / 2;
        p.octets += xf_octets;
    }
    content = rb_smtpe_opt(opts, "content");
    if (content == Qundef)
        content = Qnil;
    if (!NIL_P(content))
        StringValue(content);
    txn_scalars(&t, opts);

    /* one block: the txn, its recipients, the XFORWARD params, then the strings */
    n_rcpt = (size_t)RARRAY_LEN(p.rcpts);
    head = sizeof t + n_rcpt * sizeof *rc + n_xf * sizeof *xf;
    blk = ruby_xmalloc(head + p.octets);
    /* nothing below allocates or raises until the block is handed over or freed */
    tp = (smtpe_client_txn *)(void *)blk;
    rc = (smtpe_client_rcpt *)(void *)(blk + sizeof t);
    xf = (smtpe_param *)(void *)(blk + sizeof t + n_rcpt * sizeof *rc);
    at = blk + head;
    t.reverse_path = put_cstr(&at, p.reverse_path);
    for (size_t i = 0; i < n_rcpt; i++) {
        VALUE orcpt = RARRAY_AREF(p.orcpts, (long)i);
        rc[i].forward_path = put_cstr(&at, RARRAY_AREF(p.rcpts, (long)i));
        rc[i].notify = NUM2UINT(RARRAY_AREF(notifies, (long)i));
        rc[i].orcpt = NIL_P(orcpt) ? NULL : put_cstr(&at, orcpt);
    }
    t.rcpts = rc;
    t.rcpt_count = n_rcpt;
    t.envid = NIL_P(p.envid) ? NULL : put_cstr(&at, p.envid);
    if (n_xf) {
        put_params(xf, p.xforward, &at);
        t.xforward = xf;
        t.xforward_count = n_xf;
    }
    if (!NIL_P(content)) {
        smtpe_content_scan_init(&t.content);
        smtpe_content_scan(&t.content, (const uint8_t *)RSTRING_PTR(content),
                           (size_t)RSTRING_LEN(content));
        smtpe_content_scan_end(&t.content);
        t.has_content_info = 1;
    }
    *tp = t;
    err = smtpe_client_submit(s->c, tp);
    if (err < 0) {
        ruby_xfree(blk);
        rb_smtpe_raise(err, "ClientSession#submit");
    }
    s->txn = blk;
    s->txn_len = head + p.octets;
    s->rcpts = rb_ary_freeze(p.rcpts);
    RB_GC_GUARD(p.reverse_path);
    RB_GC_GUARD(p.orcpts);
    RB_GC_GUARD(p.envid);
    RB_GC_GUARD(p.xforward);
    RB_GC_GUARD(notifies);
    RB_GC_GUARD(content);
    return Qnil;
}

/*
 * call-seq:
 *   session.content(str, last: false) -> Integer
 *
 * Gives the next octets of the transaction's content (smtpe_client_content), after the
 * Content event: the engine encodes what fits in its output buffer (dot-stuffing RFC 5321
 * §4.5.2, line ends as config.line_ending says, BDAT framing RFC 3030) into its own memory and
 * returns how many octets of str it consumed; give the rest again once #want_content? is
 * true. last: true with the final piece (str may be ""; it counts only when all of str was
 * consumed). The final CRLF is added if the content lacks one (not for BINARYMIME).
 *
 * Returns the octets consumed (0..str.bytesize). Raises TypeError (str not a String),
 * Smtpe::StateError (no content wanted now), Smtpe::InvalidArgument.
 */
static VALUE sess_content(int argc, VALUE *argv, VALUE self)
{
    client_sess *s = sess_of(self);
    VALUE str, opts = Qnil;
    static const char *const keys[] = {"last", NULL};
    int last;
    smtpe_ssize n;
    rb_scan_args(argc, argv, "1:", &str, &opts);
    rb_smtpe_check_keys(opts, keys);
    last = rb_smtpe_kw_bool(opts, "last", 0);
    StringValue(str);
    n = smtpe_client_content(s->c, (const uint8_t *)RSTRING_PTR(str), (size_t)RSTRING_LEN(str),
                             last);
    RB_GC_GUARD(str);
    if (n < 0)
        rb_smtpe_raise((int)n, "ClientSession#content");
    return SSIZET2NUM(n);
}

/*
 * call-seq:
 *   session.abort_content -> nil
 *
 * The content's source failed (smtpe_client_abort_content): the end of the content is never
 * sent, every recipient not yet decided becomes :temporary, and the session ends (Closed
 * :aborted): drop the connection. Raises Smtpe::StateError (no content under way).
 */
static VALUE sess_abort_content(VALUE self)
{
    int err = smtpe_client_abort_content(sess_of(self)->c);
    if (err < 0)
        rb_smtpe_raise(err, "ClientSession#abort_content");
    return Qnil;
}

/*
 * call-seq:
 *   session.auth_response(data) -> nil
 *
 * Answers an AuthStep event (smtpe_client_auth_response; RFC 4954 §4): data is the response
 * as octets (the engine base64-encodes it); nil at step 0 means no initial response, and at a
 * later step cancels the exchange ("*").
 *
 * Raises TypeError (data neither a String nor nil), Smtpe::StateError (no step waits),
 * Smtpe::InvalidArgument (over 8192 octets, or more than the output buffer holds).
 */
static VALUE sess_auth_response(VALUE self, VALUE data)
{
    client_sess *s = sess_of(self);
    int err;
    if (NIL_P(data)) {
        err = smtpe_client_auth_response(s->c, NULL, 0);
    } else {
        StringValue(data);
        err = smtpe_client_auth_response(s->c, (const uint8_t *)RSTRING_PTR(data),
                                         (size_t)RSTRING_LEN(data));
    }
    RB_GC_GUARD(data);
    if (err < 0)
        rb_smtpe_raise(err, "ClientSession#auth_response");
    return Qnil;
}

/*
 * call-seq:
 *   session.tls_started(now_ms) -> nil
 *
 * TLS is up (smtpe_client_tls_started): after the Starttls event and the host's handshake,
 * or for tls: :implicit before the first #feed. The session starts over with EHLO
 * (RFC 3207 §4.2). now_ms: Integer, the monotonic clock in milliseconds.
 * Raises Smtpe::StateError (no handshake was due).
 */
static VALUE sess_tls_started(VALUE self, VALUE now_ms)
{
    client_sess *s = sess_of(self);
    int err = smtpe_client_tls_started(s->c, rb_smtpe_now(now_ms));
    if (err < 0)
        rb_smtpe_raise(err, "ClientSession#tls_started");
    return Qnil;
}

/*
 * call-seq:
 *   session.quit -> nil
 *
 * Asks for QUIT once the current transaction (if any) is done (smtpe_client_quit; RFC 5321
 * §4.1.1.10); the session ends with Closed :quit after the 221.
 * Raises Smtpe::StateError (already ending).
 */
static VALUE sess_quit(VALUE self)
{
    int err = smtpe_client_quit(sess_of(self)->c);
    if (err < 0)
        rb_smtpe_raise(err, "ClientSession#quit");
    return Qnil;
}

/*
 * call-seq:
 *   session.lost -> nil
 *
 * The connection is gone: EOF, a reset, a failed TLS handshake (smtpe_client_lost). Every
 * recipient not yet decided becomes :temporary, or :unknown if the end of its content was
 * taken by #take_output (RFC 5321 §4.5.3.2.6); then Closed :lost (:quit after QUIT was
 * sent). Output not yet taken is dropped. Raises Smtpe::StateError (already over).
 */
static VALUE sess_lost(VALUE self)
{
    int err = smtpe_client_lost(sess_of(self)->c);
    if (err < 0)
        rb_smtpe_raise(err, "ClientSession#lost");
    return Qnil;
}

/*
 * call-seq:
 *   session.content_held -> Integer
 *
 * Octets of content the engine's output still points to (smtpe_client_content_held). #content
 * copies, so this is 0 from this binding: the host may always reuse its Strings.
 */
static VALUE sess_content_held(VALUE self)
{
    return SIZET2NUM(smtpe_client_content_held(sess_of(self)->c));
}

/* ---------------------------------------------------------------------------------------------
 * Output, wants, timers
 * ------------------------------------------------------------------------------------------- */

static const uint8_t *out_take(void *c, size_t *len)
{
    return smtpe_client_send_buf(c, len);
}

static int out_ack(void *c, size_t n)
{
    return smtpe_client_send_ack(c, n);
}

/*
 * call-seq:
 *   session.take_output(out) -> Integer
 *
 * Appends all the octets the engine has queued for the server (commands, content) to out
 * and acknowledges them (smtpe_client_send_buf / smtpe_client_send_ack): from then on the
 * engine counts them as written. The host must write all of them, in order, before the
 * octets of its next read are fed; and it feeds everything it has read (#feed until nil)
 * before it takes output, so that a reply that came before a command was written is judged
 * unsolicited (RFC 2920 §3.1). An end of content taken counts as sent: after #lost its
 * recipients are :unknown, not :temporary.
 *
 * out:: a mutable String (made binary if it was empty).
 * Returns the octets appended (0 for none). Raises TypeError, FrozenError.
 */
static VALUE sess_take_output(VALUE self, VALUE out)
{
    client_sess *s = sess_of(self);
    return SIZET2NUM(rb_smtpe_take_output(out, s->c, out_take, out_ack));
}

/*
 * call-seq:
 *   session.want -> Integer
 *
 * What the session wants now (smtpe_client_want), a bitmask of Smtpe::WANT_READ (feed what
 * you hold; read the socket for more unless WANT_TLS), WANT_WRITE (output is queued: #take_output),
 * WANT_CLOSE (the session is over: close once the output is written), WANT_VERDICT (an
 * AuthStep waits for #auth_response), WANT_EVENT (an event waits: #feed), WANT_TLS (run the
 * handshake now, then #tls_started) and WANT_CONTENT (#content would consume octets now).
 */
static VALUE sess_want(VALUE self)
{
    return UINT2NUM(smtpe_client_want(sess_of(self)->c));
}

#define WANT_P(name, bit)                                                                       \
    static VALUE sess_want_##name(VALUE self)                                                   \
    {                                                                                           \
        return (smtpe_client_want(sess_of(self)->c) & (bit)) ? Qtrue : Qfalse;                  \
    }
/*
 * Document-method: Smtpe::ClientSession#want_read?
 * call-seq: session.want_read? -> true or false
 *
 * WANT_READ is set: feed the octets you hold, read the socket for more (unless want_tls?).
 */
WANT_P(read, SMTPE_WANT_READ)
/*
 * Document-method: Smtpe::ClientSession#want_write?
 * call-seq: session.want_write? -> true or false
 *
 * WANT_WRITE is set: output is queued (#take_output).
 */
WANT_P(write, SMTPE_WANT_WRITE)
/*
 * Document-method: Smtpe::ClientSession#want_close?
 * call-seq: session.want_close? -> true or false
 *
 * WANT_CLOSE is set: the session is over; close the connection once the output is written.
 */
WANT_P(close, SMTPE_WANT_CLOSE)
/*
 * Document-method: Smtpe::ClientSession#want_tls?
 * call-seq: session.want_tls? -> true or false
 *
 * WANT_TLS is set: run the TLS handshake (RFC 3207), then #tls_started.
 */
WANT_P(tls, SMTPE_WANT_TLS)
/*
 * Document-method: Smtpe::ClientSession#want_content?
 * call-seq: session.want_content? -> true or false
 *
 * WANT_CONTENT is set: #content would consume octets now.
 */
WANT_P(content, SMTPE_WANT_CONTENT)
/*
 * Document-method: Smtpe::ClientSession#want_verdict?
 * call-seq: session.want_verdict? -> true or false
 *
 * WANT_VERDICT is set: an AuthStep waits for #auth_response.
 */
WANT_P(verdict, SMTPE_WANT_VERDICT)
/*
 * Document-method: Smtpe::ClientSession#want_event?
 * call-seq: session.want_event? -> true or false
 *
 * WANT_EVENT is set: an event waits to be taken (#feed with "").
 */
WANT_P(event, SMTPE_WANT_EVENT)
#undef WANT_P

/*
 * call-seq:
 *   session.expiry(now_ms) -> Integer or nil
 *
 * The deadline of the timeout that runs now, in the milliseconds of now_ms
 * (smtpe_client_expiry; RFC 5321 §4.5.3.2), or nil for none (no timer while an event waits
 * or an AUTH response is owed). Arm a timer for it and call #handle_expiry when it fires.
 * now_ms: Integer, the monotonic clock in milliseconds.
 */
static VALUE sess_expiry(VALUE self, VALUE now_ms)
{
    client_sess *s = sess_of(self);
    uint64_t d = smtpe_client_expiry(s->c, rb_smtpe_now(now_ms));
    return d == UINT64_MAX ? Qnil : ULL2NUM(d);
}

/*
 * call-seq:
 *   session.handle_expiry(now_ms) -> true or false
 *
 * true if the deadline has passed at now_ms (smtpe_client_handle_expiry): the session ends
 * with Closed :timeout (recipients :temporary, or :unknown once the end of the content was
 * sent), taken with #feed. now_ms: Integer, the monotonic clock in milliseconds.
 */
static VALUE sess_handle_expiry(VALUE self, VALUE now_ms)
{
    client_sess *s = sess_of(self);
    return smtpe_client_handle_expiry(s->c, rb_smtpe_now(now_ms)) ? Qtrue : Qfalse;
}

/*
 * call-seq:
 *   session.caps -> Smtpe::ClientEvent::Ready or nil
 *
 * The server's capabilities as last parsed from its EHLO reply (smtpe_client_get_caps;
 * RFC 5321 §4.1.1.1), as a Ready Struct; nil before the EHLO reply (and, after a HELO
 * fallback, until the Ready event).
 */
static VALUE sess_caps(VALUE self)
{
    client_sess *s = sess_of(self);
    const smtpe_client_caps *c = smtpe_client_get_caps(s->c);
    if (!s->ready_seen && !c->esmtp && !c->extensions && !c->size_limit && !c->auth.len &&
        !c->xclient.len && !c->xforward.len)
        return Qnil;
    return ready_value(c);
}

/* ---------------------------------------------------------------------------------------------
 * Init
 * ------------------------------------------------------------------------------------------- */

void rb_smtpe_init_client(VALUE mSmtpe)
{
    VALUE mEvent;
    mSmtpe = rb_define_module("Smtpe"); /* the same module; written so that RDoc knows it */
    mEvent = rb_const_get_at(mSmtpe, rb_intern("ClientEvent"));
    cReady = rb_smtpe_const(mEvent, "Ready");
    cStarttls = rb_smtpe_const(mEvent, "Starttls");
    cAuthStep = rb_smtpe_const(mEvent, "AuthStep");
    cContent = rb_smtpe_const(mEvent, "Content");
    cOutcome = rb_smtpe_const(mEvent, "Outcome");
    cDone = rb_smtpe_const(mEvent, "TransactionDone");
    cClosed = rb_smtpe_const(mEvent, "Closed");
    for (size_t i = 0; i < RB_SMTPE_EXT_COUNT; i++)
        ext_ids[i] = rb_intern(rb_smtpe_ext_names[i]);
    outcome_ids[0] = 0;
    outcome_ids[SMTPE_OUTCOME_DELIVERED] = rb_intern("delivered");
    outcome_ids[SMTPE_OUTCOME_PERMANENT] = rb_intern("permanent");
    outcome_ids[SMTPE_OUTCOME_TEMPORARY] = rb_intern("temporary");
    outcome_ids[SMTPE_OUTCOME_UNKNOWN] = rb_intern("unknown");
    for (size_t i = 0; i < CLOSE_COUNT; i++)
        close_ids[i] = rb_intern(close_names[i]);
    /* the Smtpe::WANT_* constants are rb_smtpe.c's, which Init_smtpe defines first */

    /* Document-class: Smtpe::ClientConfig
     * A client engine configuration: frozen once made, shareable between Ractors, used by
     * any number of ClientSessions. */
    cConfig = rb_define_class_under(mSmtpe, "ClientConfig", rb_cObject);
    rb_gc_register_address(&cConfig);
    rb_define_alloc_func(cConfig, cfg_alloc);
    rb_define_method(cConfig, "initialize", cfg_initialize, -1);
    rb_define_method(cConfig, "initialize_copy", rb_smtpe_no_copy, 1);
    rb_define_method(cConfig, "memory_size", cfg_memory_size, 0);

    /* Document-class: Smtpe::ClientSession
     * One SMTP/LMTP client session on the client engine (sans-I/O: the host reads, writes,
     * keeps the clock and runs TLS). Used by one Thread, Fiber or Ractor at a time. */
    cSession = rb_define_class_under(mSmtpe, "ClientSession", rb_cObject);
    rb_gc_register_address(&cSession);
    rb_define_alloc_func(cSession, sess_alloc);
    rb_define_method(cSession, "initialize", sess_initialize, 2);
    rb_define_method(cSession, "initialize_copy", rb_smtpe_no_copy, 1);
    rb_define_method(cSession, "feed", sess_feed, 2);
    rb_define_method(cSession, "submit", sess_submit, -1);
    rb_define_method(cSession, "content", sess_content, -1);
    rb_define_method(cSession, "abort_content", sess_abort_content, 0);
    rb_define_method(cSession, "auth_response", sess_auth_response, 1);
    rb_define_method(cSession, "tls_started", sess_tls_started, 1);
    rb_define_method(cSession, "quit", sess_quit, 0);
    rb_define_method(cSession, "lost", sess_lost, 0);
    rb_define_method(cSession, "content_held", sess_content_held, 0);
    rb_define_method(cSession, "take_output", sess_take_output, 1);
    rb_define_method(cSession, "want", sess_want, 0);
    rb_define_method(cSession, "want_read?", sess_want_read, 0);
    rb_define_method(cSession, "want_write?", sess_want_write, 0);
    rb_define_method(cSession, "want_close?", sess_want_close, 0);
    rb_define_method(cSession, "want_tls?", sess_want_tls, 0);
    rb_define_method(cSession, "want_content?", sess_want_content, 0);
    rb_define_method(cSession, "want_verdict?", sess_want_verdict, 0);
    rb_define_method(cSession, "want_event?", sess_want_event, 0);
    rb_define_method(cSession, "expiry", sess_expiry, 1);
    rb_define_method(cSession, "handle_expiry", sess_handle_expiry, 1);
    rb_define_method(cSession, "caps", sess_caps, 0);
}
