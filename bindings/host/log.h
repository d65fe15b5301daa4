/*
 * log.h - the log of smtpe-server: one line per record on stderr, "smtpe[pid]: " then
 * space-separated key=value pairs. Each line, or each batch of whole lines of at most PIPE_BUF
 * octets (host_log_batch), goes out in a single write(2), so lines of concurrent threads or
 * processes never interleave. Message content is never logged.
 */
#ifndef SMTPE_HOST_LOG_H
#define SMTPE_HOST_LOG_H

#include <stddef.h>
#include <stdint.h>

/* Formats one record (printf-style, without the prefix and newline) and writes it. Lines
 * longer than 2 KiB are cut. */
void host_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* From now on this thread's lines collect in a buffer (4 KiB) and go out in one write when it
 * fills or at host_log_flush: an event loop logs a few lines per session and flushes once per
 * wakeup, before it waits again. Returns 0, or -1 without memory (lines then go out at once). */
int host_log_batch(void);

/* Writes this thread's collected lines, if any. */
void host_log_flush(void);

/* Flushes and ends this thread's batching (lines go out one by one again). */
void host_log_unbatch(void);

/* A recurring error line logged at most once per period: the state of one kind of line. */
struct host_log_limit {
    uint64_t logged; /* when last logged (host_now_ms); 0: never */
    unsigned quiet;  /* occurrences not logged since */
};

/* One occurrence at now_ms: returns 1 if its line may be logged (*quiet then gets the
 * occurrences not logged since the last one, and the count restarts), 0 if it is to be counted
 * only. */
int host_log_limited(struct host_log_limit *r, uint64_t now_ms, uint64_t period_ms,
                     unsigned *quiet);

#define HOST_LOG_REJECT_MS 1000u /* refused clients: at most one line a second per process */

/* A refused client (peer: its "ip:port", reason: a token) at now_ms: the line "reject
 * peer=... reason=... (N more rejects since the last report)", at most one per
 * HOST_LOG_REJECT_MS per thread, whatever the reason, so that a flood of refused connections
 * cannot flood the log. */
void host_log_reject(uint64_t now_ms, const char *peer, const char *reason);

/* Copies src[0..len) into dst[0..cap) as a log token: printable ASCII other than space and '%' is
 * kept and every other octet becomes %XX. Always NUL-terminates (cap > 0); truncates to
 * fit. Returns dst. */
char *host_log_token(char *dst, size_t cap, const void *src, size_t len);

#endif
