/* rb_smtpe.c - the extension's entry point (Init_smtpe), Smtpe's module functions and
 * constants (WANT_*), and the helpers every file shares (rb_smtpe.h). */
#include "rb_smtpe.h"

#include <stdarg.h>
#include <string.h>

VALUE rb_smtpe_mSmtpe;
VALUE rb_smtpe_eError;
static VALUE eInvalidArgument, eStateError, eReplyTooLong, eBufferTooSmall, eNoMemory,
    eConfigError;

static void *x_alloc(size_t size, void *ud)
{
    (void)ud;
    return ruby_xmalloc(size);
}

static void x_free(void *ptr, void *ud)
{
    (void)ud;
    ruby_xfree(ptr);
}

const smtpe_allocator rb_smtpe_allocator = {x_alloc, x_free, NULL};

static VALUE error_class(int err)
{
    switch (err) {
    case SMTPE_ERR_INVALID_ARGUMENT: return eInvalidArgument;
    case SMTPE_ERR_STATE: return eStateError;
    case SMTPE_ERR_REPLY_TOO_LONG: return eReplyTooLong;
    case SMTPE_ERR_BUFFER_TOO_SMALL: return eBufferTooSmall;
    case SMTPE_ERR_NOMEM: return eNoMemory;
    case SMTPE_ERR_CONFIG: return eConfigError;
    default: return rb_smtpe_eError;
    }
}

NORETURN(static void raise_msg(int err, VALUE msg));
static void raise_msg(int err, VALUE msg)
{
    VALUE exc = rb_exc_new_str(error_class(err), msg);
    rb_iv_set(exc, "@code", INT2FIX(err));
    rb_exc_raise(exc);
}

void rb_smtpe_raise(int err, const char *what)
{
    raise_msg(err, rb_sprintf("%s: %s", what, smtpe_strerror(err)));
}

void rb_smtpe_raisef(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    VALUE msg = rb_vsprintf(fmt, ap);
    va_end(ap);
    raise_msg(err, msg);
}

VALUE rb_smtpe_str(const uint8_t *p, size_t len, int enc)
{
    VALUE s = enc == RB_SMTPE_BINARY ? rb_str_new((const char *)p, (long)len)
                                     : rb_utf8_str_new((const char *)p, (long)len);
    if (enc == RB_SMTPE_TEXT && rb_enc_str_coderange(s) == ENC_CODERANGE_BROKEN)
        rb_enc_associate(s, rb_ascii8bit_encoding());
    return rb_obj_freeze(s);
}

VALUE rb_smtpe_span(smtpe_span s, int enc)
{
    return rb_smtpe_str(s.ptr, s.len, enc);
}

VALUE rb_smtpe_struct(VALUE klass, int n, ...)
{
    VALUE vals[RB_SMTPE_STRUCT_MAX];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n && i < RB_SMTPE_STRUCT_MAX; i++)
        vals[i] = va_arg(ap, VALUE);
    va_end(ap);
    VALUE st = rb_struct_alloc_noinit(klass);
    for (int i = 0; i < n && i < RB_SMTPE_STRUCT_MAX; i++)
        RSTRUCT_SET(st, i, vals[i]);
    RB_GC_GUARD(vals[0]);
    return st;
}

VALUE rb_smtpe_span_or_nil(smtpe_span s, int has, int enc)
{
    return has ? rb_smtpe_str(s.ptr, s.len, enc) : Qnil;
}

VALUE rb_smtpe_cstr_str(VALUE str, const char *name)
{
    VALUE s = rb_check_string_type(str);
    if (NIL_P(s))
        rb_raise(rb_eTypeError, "%s: must be a String (got %" PRIsVALUE ")", name,
                 rb_obj_class(str));
    s = rb_str_new_frozen(s);
    if (memchr(RSTRING_PTR(s), 0, (size_t)RSTRING_LEN(s)) != NULL)
        rb_smtpe_raisef(SMTPE_ERR_INVALID_ARGUMENT, "%s: contains a NUL octet", name);
    return s;
}

char *rb_smtpe_cstr_dup(VALUE str, const char *name)
{
    if (NIL_P(str))
        return NULL;
    str = rb_smtpe_cstr_str(str, name);
    size_t len = (size_t)RSTRING_LEN(str);
    char *copy = ruby_xmalloc(len + 1);
    memcpy(copy, RSTRING_PTR(str), len);
    copy[len] = 0;
    RB_GC_GUARD(str);
    return copy;
}

static int negative(VALUE v)
{
    if (FIXNUM_P(v))
        return FIX2LONG(v) < 0;
    return FIX2INT(rb_big_cmp(v, INT2FIX(0))) < 0;
}

uint64_t rb_smtpe_now(VALUE now_ms)
{
    if (!RB_INTEGER_TYPE_P(now_ms))
        rb_raise(rb_eTypeError, "now_ms must be an Integer of milliseconds");
    if (negative(now_ms))
        rb_raise(rb_eRangeError, "now_ms must not be negative");
    return NUM2ULL(now_ms);
}

VALUE rb_smtpe_opt(VALUE opts, const char *key)
{
    if (NIL_P(opts))
        return Qundef;
    return rb_hash_lookup2(opts, ID2SYM(rb_intern(key)), Qundef);
}

static int check_key(VALUE key, VALUE val, VALUE allowed_ptr)
{
    (void)val;
    const char *const *allowed = (const char *const *)allowed_ptr;
    if (SYMBOL_P(key)) {
        const char *name = rb_id2name(SYM2ID(key));
        for (size_t i = 0; allowed[i]; i++)
            if (strcmp(name, allowed[i]) == 0)
                return ST_CONTINUE;
    }
    rb_raise(rb_eArgError, "unknown keyword: %" PRIsVALUE, rb_inspect(key));
    return ST_STOP;
}

void rb_smtpe_check_keys(VALUE opts, const char *const *allowed)
{
    if (!NIL_P(opts))
        rb_hash_foreach(opts, check_key, (VALUE)allowed);
}

uint64_t rb_smtpe_opt_uint(VALUE v, const char *key, uint64_t lo, uint64_t hi)
{
    if (!RB_INTEGER_TYPE_P(v))
        rb_raise(rb_eTypeError, "%s: must be an Integer", key);
    if (negative(v))
        rb_raise(rb_eArgError, "%s: must be %llu..%llu", key, (unsigned long long)lo,
                 (unsigned long long)hi);
    uint64_t n = NUM2ULL(v);
    if (n < lo || n > hi)
        rb_raise(rb_eArgError, "%s: must be %llu..%llu", key, (unsigned long long)lo,
                 (unsigned long long)hi);
    return n;
}

uint64_t rb_smtpe_kw_uint(VALUE opts, const char *key, uint64_t lo, uint64_t hi, uint64_t dflt)
{
    VALUE v = rb_smtpe_opt(opts, key);
    return v == Qundef ? dflt : rb_smtpe_opt_uint(v, key, lo, hi);
}

int rb_smtpe_kw_bool(VALUE opts, const char *key, int dflt)
{
    VALUE v = rb_smtpe_opt(opts, key);
    return v == Qundef ? dflt : RTEST(v) ? 1 : 0;
}

int rb_smtpe_sym_index(VALUE v, const char *key, const char *const *names, int n)
{
    if (SYMBOL_P(v)) {
        ID id = SYM2ID(v);
        for (int i = 0; i < n; i++)
            if (id == rb_intern(names[i]))
                return i;
    }
    rb_raise(rb_eArgError, "%s: unknown value %" PRIsVALUE, key, rb_inspect(v));
    UNREACHABLE_RETURN(0);
}

const char *const rb_smtpe_ext_names[RB_SMTPE_EXT_COUNT] = {
    "pipelining", "size", "8bitmime", "smtputf8", "enhancedstatuscodes", "starttls",
    "chunking", "binarymime", "dsn", "requiretls", "mt_priority", "deliverby", "xclient",
    "xforward"};
_Static_assert(SMTPE_EXT_PIPELINING == 1u << 0 && SMTPE_EXT_SIZE == 1u << 1 &&
                   SMTPE_EXT_8BITMIME == 1u << 2 && SMTPE_EXT_SMTPUTF8 == 1u << 3 &&
                   SMTPE_EXT_ENHANCEDSTATUSCODES == 1u << 4 && SMTPE_EXT_STARTTLS == 1u << 5 &&
                   SMTPE_EXT_CHUNKING == 1u << 6 && SMTPE_EXT_BINARYMIME == 1u << 7 &&
                   SMTPE_EXT_DSN == 1u << 8 && SMTPE_EXT_REQUIRETLS == 1u << 9 &&
                   SMTPE_EXT_MT_PRIORITY == 1u << 10 && SMTPE_EXT_DELIVERBY == 1u << 11 &&
                   SMTPE_EXT_XCLIENT == 1u << 12 && SMTPE_EXT_XFORWARD == 1u << 13 &&
                   RB_SMTPE_EXT_COUNT == 14,
               "rb_smtpe_ext_names holds the SMTPE_EXT_* names in the order of their bits");

VALUE rb_smtpe_const(VALUE mod, const char *name)
{
    VALUE v = rb_const_get_at(mod, rb_intern(name));
    rb_gc_register_mark_object(v);
    return v;
}

size_t rb_smtpe_take_output(VALUE out, void *session,
                            const uint8_t *(*take)(void *session, size_t *len),
                            int (*ack)(void *session, size_t n))
{
    StringValue(out);
    rb_str_modify(out);
    if (RSTRING_LEN(out) == 0)
        rb_enc_associate(out, rb_ascii8bit_encoding());
    size_t total = 0;
    for (;;) {
        size_t len = 0;
        const uint8_t *p = take(session, &len);
        if (p == NULL || len == 0)
            break;
        rb_str_cat(out, (const char *)p, (long)len);
        ack(session, len);
        total += len;
    }
    return total;
}

VALUE rb_smtpe_no_copy(VALUE self, VALUE other)
{
    (void)other;
    rb_raise(rb_eTypeError, "%" PRIsVALUE " cannot be copied", rb_obj_class(self));
    UNREACHABLE_RETURN(Qnil);
}

/*
 * call-seq: Smtpe.engine_version -> String
 *
 * The version of the engine compiled into the extension ("0.4.0").
 */
static VALUE m_engine_version(VALUE self)
{
    (void)self;
    return rb_obj_freeze(rb_usascii_str_new_cstr(smtpe_version_string()));
}

/* The Smtpe::WANT_* bits that ServerSession#want and ClientSession#want give (include/smtpe.h
 * smtpe_server_want, smtpe_client_want). */
static void init_want(VALUE mSmtpe)
{
    mSmtpe = rb_define_module("Smtpe"); /* the same module; lets RDoc see the constants */
    /* #want bit: the engine would consume input now. */
    rb_define_const(mSmtpe, "WANT_READ", UINT2NUM(SMTPE_WANT_READ));
    /* #want bit: output is queued (#take_output gives octets). */
    rb_define_const(mSmtpe, "WANT_WRITE", UINT2NUM(SMTPE_WANT_WRITE));
    /* #want bit: the session is over; close once the output is written. */
    rb_define_const(mSmtpe, "WANT_CLOSE", UINT2NUM(SMTPE_WANT_CLOSE));
    /* #want bit: an event given out waits for the host's answer. */
    rb_define_const(mSmtpe, "WANT_VERDICT", UINT2NUM(SMTPE_WANT_VERDICT));
    /* #want bit: an event waits to be taken. */
    rb_define_const(mSmtpe, "WANT_EVENT", UINT2NUM(SMTPE_WANT_EVENT));
    /* #want bit: run the TLS handshake now (RFC 3207). */
    rb_define_const(mSmtpe, "WANT_TLS", UINT2NUM(SMTPE_WANT_TLS));
    /* #want bit (client): ClientSession#content would consume octets now. */
    rb_define_const(mSmtpe, "WANT_CONTENT", UINT2NUM(SMTPE_WANT_CONTENT));
}

RUBY_FUNC_EXPORTED void Init_smtpe(void)
{
#ifdef HAVE_RB_EXT_RACTOR_SAFE
    rb_ext_ractor_safe(true);
#endif
    rb_require("smtpe/events");
    rb_require("smtpe/handler");
    rb_smtpe_mSmtpe = rb_define_module("Smtpe");
    /* Document-class: Smtpe::Error
     * The base of every error the engine reports; #code is its SMTPE_ERR_* number. */
    rb_smtpe_eError = rb_define_class_under(rb_smtpe_mSmtpe, "Error", rb_eStandardError);
    /* The SMTPE_ERR_* number (include/smtpe.h): -501 invalid argument, -502 state, ... */
    rb_define_attr(rb_smtpe_eError, "code", 1, 0);
    /* A bad value for the call (a bad reply code, a control character in a text). */
    eInvalidArgument = rb_define_class_under(rb_smtpe_mSmtpe, "InvalidArgument", rb_smtpe_eError);
    /* The call does not fit the session's state (no verdict owed, no content wanted). */
    eStateError = rb_define_class_under(rb_smtpe_mSmtpe, "StateError", rb_smtpe_eError);
    /* A reply over the engine's limits (lines, octets). */
    eReplyTooLong = rb_define_class_under(rb_smtpe_mSmtpe, "ReplyTooLong", rb_smtpe_eError);
    /* Caller memory too small (not raised by the binding, which sizes every session itself). */
    eBufferTooSmall = rb_define_class_under(rb_smtpe_mSmtpe, "BufferTooSmall", rb_smtpe_eError);
    /* The allocator failed. */
    eNoMemory = rb_define_class_under(rb_smtpe_mSmtpe, "NoMemory", rb_smtpe_eError);
    /* The config is inconsistent (a limit out of range). */
    eConfigError = rb_define_class_under(rb_smtpe_mSmtpe, "ConfigError", rb_smtpe_eError);
    rb_define_module_function(rb_smtpe_mSmtpe, "engine_version", m_engine_version, 0);
    init_want(rb_smtpe_mSmtpe);
    rb_smtpe_init_server(rb_smtpe_mSmtpe);
    rb_smtpe_init_client(rb_smtpe_mSmtpe);
}
