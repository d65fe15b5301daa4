/*
 * recipients.h - the known recipients of smtpe-server (--recipients FILE): the mailboxes and
 * catch-all domains it accepts at RCPT, so that an MX never accepts what it must later bounce
 * (others get 550 5.1.1 from session.c).
 *
 * The file: one entry per line, "local-part@domain" (a mailbox, RFC 5321 §4.1.2, quoted
 * local-parts and address-literals included) or "@domain" (every local-part of that domain).
 * White space around an entry is ignored (space, HT, and the CR of a CRLF file), so are blank
 * lines; '#' at the start of a line or after white space, outside a quoted-string, starts a
 * comment (a '#' inside an entry is a local-part's atext, RFC 5322 §3.2.3). Each entry is
 * checked with the engine's own path parser (through smtpe_client_submit, which checks a
 * forward-path by RFC 5321 §4.1.2's grammar and the lengths of §4.5.3.1): anything else, a
 * source route or a bare "postmaster" included, is an error naming FILE:LINE.
 *
 * Matching: the domain is compared without ASCII case (RFC 5321 §2.4), and so is the
 * local-part (ASCII letters folded; other octets, UTF-8 included, compared as they are), since
 * a site with case-sensitive local-parts is rare and the Maildir layout lower-cases too. The
 * local-part is compared as written, quotes kept: "u"@example.com and u@example.com are two
 * entries. A domain's A-label and U-label are two domains. A recipient is known if its mailbox
 * is listed, or its domain is a catch-all; <postmaster> and postmaster@ any domain the file
 * names (in a mailbox or a catch-all) always are (RFC 5321 §4.5.1).
 *
 * Lifetimes and threads. A struct recipients is built once by recipients_load and never
 * changed: any number of threads may read it. A struct recipients_source publishes the current
 * table of a file and replaces it when the file is reread (SIGHUP) without a lock on the
 * reader's path: recipients_source_accepts (one RCPT) enters a read section, loads the table
 * pointer, looks up, and leaves; recipients_source_reload builds the new table, swaps the
 * pointer (C11 atomic exchange), waits for a grace period and frees the old table. The read
 * section is two counters, one per phase: a reader increments the counter of the phase it
 * reads, then loads the pointer, and decrements the same counter when done. The writer, after
 * the swap, flips the phase and waits until the old phase's counter is 0, twice (once per
 * counter): a reader that could have loaded the old pointer incremented one of the two
 * counters before the swap, and each is seen at 0 after it; readers that come later load the
 * new pointer. Two flips rather than one because a slow reader may have read the phase one
 * flip ago (userspace RCU's reason). Readers never wait; the writer waits only for lookups
 * already under way (microseconds: a read section holds no lock, makes no system call). All
 * atomics are sequentially consistent. One writer at a time: in each process only the thread
 * that takes SIGHUP reloads (the event loop of epoll and of each prefork worker, the main
 * thread of reuseport and threads, prefork's supervisor for the workers it forks later).
 * A load costs about 0.8 us per entry (100 000 entries: about 80 ms, Debug build), on the
 * reloading thread: an epoll or prefork worker loop serves nothing meanwhile.
 */
#ifndef SMTPE_HOST_RECIPIENTS_H
#define SMTPE_HOST_RECIPIENTS_H

#include <stddef.h>

#include "smtpe.h"

struct recipients;
struct recipients_source;

/* Reads and checks the file at path. Returns the table, or NULL with a message in err:
 * "PATH: <strerror>" when it cannot be read, "PATH:LINE: <why>" for a bad line, "PATH: out of
 * memory". */
struct recipients *recipients_load(const char *path, char *err, size_t errlen);

/* Frees a table from recipients_load. NULL is allowed. */
void recipients_free(struct recipients *t);

/* The entries of t: distinct mailboxes and distinct catch-all domains. */
size_t recipients_mailboxes(const struct recipients *t);
size_t recipients_catch_alls(const struct recipients *t);

/* Whether t knows the forward-path p as the engine gave it in a RCPT event (its local_part
 * and domain spans; SMTPE_PATH_POSTMASTER for <postmaster>): 1 known, 0 unknown. */
int recipients_known(const struct recipients *t, const smtpe_path *p);

/* A source for the file at path (copied), with its first table loaded. Returns it, or NULL
 * with a message in err (as recipients_load). */
struct recipients_source *recipients_source_new(const char *path, char *err, size_t errlen);

/* Rereads the file. A good file replaces the table for every later lookup (and the old one
 * is freed once no lookup can still use it); a bad one changes nothing. Not concurrent with
 * itself (one writer, see above); concurrent with any number of recipients_source_known.
 * Returns 0, or -1 with a message in err. */
int recipients_source_reload(struct recipients_source *src, char *err, size_t errlen);

/* recipients_known on the current table, lock-free, from any thread. */
int recipients_source_known(struct recipients_source *src, const smtpe_path *p);

/* The counts of the current table (for the log; call from the writer's thread). */
void recipients_source_counts(struct recipients_source *src, size_t *mailboxes,
                              size_t *catch_alls);

/* The file name. */
const char *recipients_source_path(const struct recipients_source *src);

/* Frees the source and its table; no lookup may run any more. NULL is allowed. */
void recipients_source_free(struct recipients_source *src);

#endif
