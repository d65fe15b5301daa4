/* rb_smtpe.h - what the files of smtpe's Ruby extension share: the error classes, the
 * conversions between engine spans and Ruby Strings, the allocator and the clock argument.
 *
 * Rules every file keeps (they make the extension Ractor-safe and GC-safe):
 *  - The only C globals are VALUEs and IDs written once in Init_smtpe (classes, symbols) and
 *    registered with the GC; nothing is written after Init.
 *  - No VALUE is kept in engine memory, and no Ruby object points into engine memory: every
 *    span is copied into a new frozen String before the next engine call.
 *  - No I/O, no blocking, no GVL release: each call is microseconds of work.
 *  - No Ruby code runs (no method call: to_str, initialize) between an engine call that
 *    consumes or hands out something and the binding taking it in: Ruby code is where
 *    interrupts land, and it may free the buffers a C pointer was taken from. Arguments are
 *    converted (StringValue) before any pointer into them is taken.
 */
#ifndef RB_SMTPE_H
#define RB_SMTPE_H

#include <ruby.h>
#include <ruby/encoding.h>

#include "rb_smtpe_api.h"

/* Smtpe, Smtpe::Error and its subclasses (one per SMTPE_ERR_* kind). */
extern VALUE rb_smtpe_mSmtpe;
extern VALUE rb_smtpe_eError;

/* The allocator every session uses: ruby_xmalloc / ruby_xfree, so the GC sees the memory. */
extern const smtpe_allocator rb_smtpe_allocator;

/* Raises the Smtpe::Error subclass for err (an SMTPE_ERR_* code), its message "what: reason". */
NORETURN(void rb_smtpe_raise(int err, const char *what));
/* The same with a message of the caller's (rb_sprintf's format: %"PRIsVALUE" too); #code is
 * err. */
NORETURN(void rb_smtpe_raisef(int err, const char *fmt, ...));

/* The encoding rb_smtpe_str gives its copy: BINARY (octets), UTF8 (text the engine checked),
 * TEXT (a peer's text nothing checked: UTF-8 when it is well-formed UTF-8, else binary). */
enum { RB_SMTPE_BINARY = 0, RB_SMTPE_UTF8 = 1, RB_SMTPE_TEXT = 2 };
/* A new frozen String holding a copy of p[0..len), in the encoding enc (RB_SMTPE_*). */
VALUE rb_smtpe_str(const uint8_t *p, size_t len, int enc);
/* rb_smtpe_str of a span. */
VALUE rb_smtpe_span(smtpe_span s, int enc);
/* A new instance of the Struct class klass with its n members (n <= RB_SMTPE_STRUCT_MAX) set to
 * the VALUEs that follow, made without calling #initialize: no Ruby code runs (so no interrupt,
 * Thread#raise or trap, can land) between the engine handing out an event and the binding
 * keeping it. */
#define RB_SMTPE_STRUCT_MAX 16
VALUE rb_smtpe_struct(VALUE klass, int n, ...);

/* rb_smtpe_str of a span; nil when has is 0. */
VALUE rb_smtpe_span_or_nil(smtpe_span s, int has, int enc);

/* A String argument the engine will read as a NUL-terminated string, as a frozen String (its
 * octets fixed: a later to_str elsewhere cannot change them). An object with to_str is
 * converted. Raises TypeError for anything else and Smtpe::InvalidArgument (#code
 * SMTPE_ERR_INVALID_ARGUMENT) for a String holding NUL, name in both messages. */
VALUE rb_smtpe_cstr_str(VALUE str, const char *name);
/* A NUL-terminated copy of str (rb_smtpe_cstr_str: same checks) in owned memory (ruby_xmalloc;
 * the caller frees it with ruby_xfree), or NULL for nil. */
char *rb_smtpe_cstr_dup(VALUE str, const char *name);

/* The clock argument: a non-negative Integer of milliseconds (Process.clock_gettime(
 * Process::CLOCK_MONOTONIC, :millisecond)). Raises TypeError / RangeError otherwise. */
uint64_t rb_smtpe_now(VALUE now_ms);

/* A keyword of an options Hash (nil opts: Qundef for every key), Qundef when absent. */
VALUE rb_smtpe_opt(VALUE opts, const char *key);
/* Raises ArgumentError naming the first key of opts not in allowed (NULL-terminated). */
void rb_smtpe_check_keys(VALUE opts, const char *const *allowed);
/* Integer option within lo..hi, else ArgumentError naming key. */
uint64_t rb_smtpe_opt_uint(VALUE v, const char *key, uint64_t lo, uint64_t hi);
/* The keyword key of opts as rb_smtpe_opt_uint reads it; dflt when it is absent. */
uint64_t rb_smtpe_kw_uint(VALUE opts, const char *key, uint64_t lo, uint64_t hi, uint64_t dflt);
/* The boolean keyword key of opts: 1 for a truthy value, 0 for nil and false (RTEST, as Ruby's
 * own keyword flags read them); dflt when it is absent. */
int rb_smtpe_kw_bool(VALUE opts, const char *key, int dflt);
/* A Symbol option: the index of its name in names[0..n), else ArgumentError naming key. */
int rb_smtpe_sym_index(VALUE v, const char *key, const char *const *names, int n);

/* The names of the SMTPE_EXT_* bits, bit i (1u << i) at [i]: the Symbols both engines use. */
#define RB_SMTPE_EXT_COUNT 14
extern const char *const rb_smtpe_ext_names[RB_SMTPE_EXT_COUNT];

/* The constant name of mod (a class the Ruby side defines), kept from the GC for good: for
 * the static VALUEs Init_smtpe writes. */
VALUE rb_smtpe_const(VALUE mod, const char *name);

/* Appends a copy of the session's output to out (a String, made binary if it was empty) and
 * acknowledges it; returns the octets appended. take(s, &len) gives the next run. */
size_t rb_smtpe_take_output(VALUE out, void *session,
                            const uint8_t *(*take)(void *session, size_t *len),
                            int (*ack)(void *session, size_t n));

/* initialize_copy of the configs and sessions: raises TypeError. A session's copy would share
 * its engine memory; a config is frozen, so it is shared, never copied. */
VALUE rb_smtpe_no_copy(VALUE self, VALUE other);

void rb_smtpe_init_server(VALUE mSmtpe);
void rb_smtpe_init_client(VALUE mSmtpe);

#endif
