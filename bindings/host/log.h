/*
 * log.h - the log of smtpe-server: one line per record on stderr. Each line, or each batch of
 * whole lines of at most PIPE_BUF octets (host_log_batch), goes out in a single write(2), so
 * lines of concurrent threads or processes never interleave. Message content is never logged.
 *
 * A record is given as "EVENT key=value key=value ... [words]" (host_log's format); it is
 * written in one of two forms (host_log_setup):
 *
 *   text (default)  "2026-12-02T17:20:05.123Z smtpe[1234]: EVENT key=value ...": the record as
 *                   given, after an RFC 3339 UTC timestamp with milliseconds (left out with
 *                   --log-no-time: journald stamps lines itself) and the program and pid.
 *   json            {"time":"2026-12-02T17:20:05.123Z","pid":1234,"event":"EVENT","key":"value",
 *                   ...,"msg":"words"}: one object per line, with the same keys; a value that is
 *                   a decimal number (and not an identifier: sid, id, ids, ...) is a JSON number;
 *                   words that are not key=value go into "msg"; a key the object already has
 *                   (time, pid, event, msg, truncated) becomes EVENT_key ("worker_pid").
 *
 * Client-supplied names and addresses reach the record through host_log_token (%XX for every
 * octet that is not printable ASCII, for space and for '%'). The text form keeps that; the JSON
 * form decodes it: valid UTF-8 appears as itself (with JSON's escapes), and only octets that
 * are not valid UTF-8, control octets and '%' stay %XX. A line is at most 2 KiB: a longer text
 * line is cut, a longer JSON line is cut at a whole character and closed, with "truncated":true.
 */
#ifndef SMTPE_HOST_LOG_H
#define SMTPE_HOST_LOG_H

#include <stddef.h>
#include <stdint.h>

#define HOST_LOG_LINE_MAX 2048 /* octets of one line, with its newline */
#define HOST_LOG_TEXT 0        /* host_log_setup's format: key=value text */
#define HOST_LOG_JSON 1        /* one JSON object per line */
#define HOST_LOG_SID_LEN 12    /* hex digits of a session id */

/* The form of every line from now on (HOST_LOG_TEXT or HOST_LOG_JSON) and whether it carries
 * the timestamp. Called once by main before any thread or worker starts. */
void host_log_setup(int format, int with_time);

/* Formats one record (printf-style, "EVENT key=value ...", without prefix and newline) and
 * writes it. */
void host_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The whole line for record (NUL-terminated, "EVENT key=value ...") in format, with the
 * timestamp time (NULL: none) and pid: into out[0..cap), newline included, NUL-terminated
 * after it. cap is at most HOST_LOG_LINE_MAX + 1 (longer lines are cut, see above). Returns
 * the length without the NUL. What host_log writes; separate for the unit tests. */
size_t host_log_format(char *out, size_t cap, int format, const char *time, long pid,
                       const char *record);

/* The RFC 3339 UTC time of the real-time clock with milliseconds, "2026-12-02T17:20:05.123Z",
 * into out (at least 25 octets). The date part is computed once per second per thread
 * (without gmtime's lock). */
void host_log_time(char out[25]);

/* A new session id: HOST_LOG_SID_LEN lower-case hex digits and a NUL. Ids are distinct within
 * a process (a per-process counter through a bijection of 48 bits) and, since each process
 * starts from a seed of its start time and pid, unlikely to repeat across the workers of a
 * server and across restarts (about n/2^48 for n sessions). Thread-safe; a forked child
 * reseeds. */
void host_log_session_id(char out[HOST_LOG_SID_LEN + 1]);

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

/* A refused client (sid: its session's id, NULL before it has one; peer: its "ip:port",
 * reason: a token) at now_ms: the line "reject [sid=...] peer=... reason=... (N more rejects
 * since the last report)", at most one per HOST_LOG_REJECT_MS per process, whatever the
 * reason, so that a flood of refused connections cannot flood the log. */
void host_log_reject(uint64_t now_ms, const char *sid, const char *peer, const char *reason);

/* Copies src[0..len) into dst[0..cap) as a log token: printable ASCII other than space and '%' is
 * kept and every other octet becomes %XX. Always NUL-terminates (cap > 0); truncates to
 * fit (never inside a %XX). Returns dst. */
char *host_log_token(char *dst, size_t cap, const void *src, size_t len);

/* Appends item[0..item_len) to the comma-separated list of tokens in list[0..cap) (*len octets
 * long, NUL-terminated): a comma if the list is not empty, then the token, with ',' as %2C too
 * so that the list splits back at its commas. Returns 0, or -1 if it does not fit (the list is
 * then unchanged). */
int host_log_list_add(char *list, size_t cap, size_t *len, const void *item, size_t item_len);

#endif
