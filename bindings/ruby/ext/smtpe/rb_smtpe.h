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

/* A new frozen String holding a copy of p[0..len): UTF-8 when utf8, else binary. */
VALUE rb_smtpe_str(const uint8_t *p, size_t len, int utf8);
/* A new instance of the Struct class klass with its n members (n <= RB_SMTPE_STRUCT_MAX) set to
 * the VALUEs that follow, made without calling #initialize: no Ruby code runs (so no interrupt,
 * Thread#raise or trap, can land) between the engine handing out an event and the binding
 * keeping it. */
#define RB_SMTPE_STRUCT_MAX 16
VALUE rb_smtpe_struct(VALUE klass, int n, ...);

/* rb_smtpe_str of a span; nil when has is 0. */
VALUE rb_smtpe_span_or_nil(smtpe_span s, int has, int utf8);

/* A NUL-terminated copy of str in *owned memory (ruby_xmalloc; the caller frees it with
 * ruby_xfree), or NULL for nil. Raises TypeError for a non-String and Smtpe::InvalidArgument
 * (name in the message) for a String holding NUL. */
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
