/* rb_smtpe.c - the extension's entry point (Init_smtpe), Smtpe's module functions and the
 * helpers every file shares (rb_smtpe.h). */
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

void rb_smtpe_raise(int err, const char *what)
{
    VALUE klass = rb_smtpe_eError;
    switch (err) {
    case SMTPE_ERR_INVALID_ARGUMENT: klass = eInvalidArgument; break;
    case SMTPE_ERR_STATE: klass = eStateError; break;
    case SMTPE_ERR_REPLY_TOO_LONG: klass = eReplyTooLong; break;
    case SMTPE_ERR_BUFFER_TOO_SMALL: klass = eBufferTooSmall; break;
    case SMTPE_ERR_NOMEM: klass = eNoMemory; break;
    case SMTPE_ERR_CONFIG: klass = eConfigError; break;
    default: break;
    }
    VALUE exc = rb_exc_new_str(klass, rb_sprintf("%s: %s", what, smtpe_strerror(err)));
    rb_iv_set(exc, "@code", INT2FIX(err));
    rb_exc_raise(exc);
}

VALUE rb_smtpe_str(const uint8_t *p, size_t len, int utf8)
{
    VALUE s = utf8 ? rb_utf8_str_new((const char *)p, (long)len)
                   : rb_str_new((const char *)p, (long)len);
    return rb_obj_freeze(s);
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

VALUE rb_smtpe_span_or_nil(smtpe_span s, int has, int utf8)
{
    return has ? rb_smtpe_str(s.ptr, s.len, utf8) : Qnil;
}

char *rb_smtpe_cstr_dup(VALUE str, const char *name)
{
    if (NIL_P(str))
        return NULL;
    StringValue(str);
    long len = RSTRING_LEN(str);
    const char *p = RSTRING_PTR(str);
    if (memchr(p, 0, (size_t)len) != NULL)
        rb_raise(eInvalidArgument, "%s: contains a NUL octet", name);
    char *copy = ruby_xmalloc((size_t)len + 1);
    memcpy(copy, p, (size_t)len);
    copy[len] = 0;
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
    rb_smtpe_init_server(rb_smtpe_mSmtpe);
    rb_smtpe_init_client(rb_smtpe_mSmtpe);
}
