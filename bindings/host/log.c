/*
 * log.c - the lines of smtpe-server's log on stderr, as text or JSON (see log.h).
 */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOG_BATCH 4096 /* PIPE_BUF: one write of whole lines never interleaves with another */
#define LOG_PREFIX_MAX 64 /* "2026-12-02T17:20:05.123Z smtpe[4194304]: " and more */
#define SID_MASK ((UINT64_C(1) << 48) - 1)

static pid_t log_pid;               /* cached: getpid() is a system call per line otherwise */
static int log_format = HOST_LOG_TEXT; /* set by host_log_setup before any thread starts */
static int log_with_time = 1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static __thread char *batch;        /* this thread's batch (host_log_batch), NULL: none */
static __thread size_t batch_len;
static __thread int64_t time_sec = -1;  /* the second time_head holds; -1: none yet */
static __thread char time_head[20];     /* "2026-12-02T17:20:05" */
static _Atomic uint64_t sid_seed;       /* 0: not seeded in this process yet */
static atomic_uint_fast64_t sid_counter;

static void forget_pid(void)
{
    log_pid = 0; /* in a forked child: its own pid from the next line on */
    atomic_store(&sid_seed, 0); /* and its own session ids */
}

static void log_setup_once(void)
{
    (void)pthread_atfork(NULL, NULL, forget_pid);
}

void host_log_setup(int format, int with_time)
{
    log_format = format;
    log_with_time = with_time;
}

static void write_all(const char *p, size_t len)
{
    size_t off = 0;

    while (off < len) {
        ssize_t w = write(STDERR_FILENO, p + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* nowhere to report it */
        off += (size_t)w;
    }
}

int host_log_batch(void)
{
    if (batch == NULL && (batch = malloc(LOG_BATCH)) == NULL)
        return -1;
    batch_len = 0;
    return 0;
}

void host_log_flush(void)
{
    if (batch_len > 0)
        write_all(batch, batch_len);
    batch_len = 0;
}

void host_log_unbatch(void)
{
    host_log_flush();
    free(batch);
    batch = NULL;
}

/* ---- time ------------------------------------------------------------------------------- */

/* The civil date of day number days (0: 1970-01-01) in the proleptic Gregorian calendar, by
 * 400-year eras of 146097 days starting on March 1st (so that the leap day ends a year). */
static void civil_from_days(int64_t days, int64_t *y, unsigned *m, unsigned *d)
{
    int64_t z = days + 719468; /* days since 0000-03-01 */
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);                            /* [0, 146096] */
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;   /* [0, 399] */
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                 /* [0, 365] */
    unsigned mp = (5 * doy + 2) / 153;                                      /* [0, 11], March 0 */

    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

/* v as n decimal digits (the low ones) at p. */
static void put_digits(char *p, unsigned v, int n)
{
    while (n-- > 0) {
        p[n] = (char)('0' + v % 10);
        v /= 10;
    }
}

void host_log_time(char out[25])
{
    struct timespec ts;

    if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
        ts.tv_sec = 0, ts.tv_nsec = 0;
    if ((int64_t)ts.tv_sec != time_sec) {
        int64_t secs = (int64_t)ts.tv_sec, days = secs / 86400, rem = secs % 86400, y;
        unsigned m, d;
        if (rem < 0) {
            rem += 86400;
            days--;
        }
        civil_from_days(days, &y, &m, &d);
        memcpy(time_head, "0000-00-00T00:00:00", sizeof time_head);
        put_digits(time_head, (unsigned)(y % 10000), 4);
        put_digits(time_head + 5, m, 2);
        put_digits(time_head + 8, d, 2);
        put_digits(time_head + 11, (unsigned)(rem / 3600), 2);
        put_digits(time_head + 14, (unsigned)(rem / 60 % 60), 2);
        put_digits(time_head + 17, (unsigned)(rem % 60), 2);
        time_sec = (int64_t)ts.tv_sec;
    }
    memcpy(out, time_head, 19);
    out[19] = '.';
    put_digits(out + 20, (unsigned)(ts.tv_nsec / 1000000), 3);
    out[23] = 'Z';
    out[24] = '\0';
}

/* ---- session ids ------------------------------------------------------------------------ */

/* A bijection of [0, 2^48): xor-shifts and multiplications by odd constants, modulo 2^48. */
static uint64_t mix48(uint64_t x)
{
    x &= SID_MASK;
    x ^= x >> 25;
    x = (x * UINT64_C(0x9E3779B97F4B)) & SID_MASK;
    x ^= x >> 23;
    x = (x * UINT64_C(0xC2B2AE3D27D5)) & SID_MASK;
    x ^= x >> 24;
    return x;
}

void host_log_session_id(char out[HOST_LOG_SID_LEN + 1])
{
    uint64_t seed = atomic_load(&sid_seed), n;

    (void)pthread_once(&log_once, log_setup_once);
    if (seed == 0) {
        /* this process' start: its real time in microseconds and its pid, mixed (two threads
         * racing here store the same kind of value; one of them wins for good) */
        struct timespec ts;
        uint64_t us = 0, expected = 0;
        if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
            us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        seed = mix48(us ^ ((uint64_t)getpid() << 28)) | (UINT64_C(1) << 48); /* never 0 */
        if (!atomic_compare_exchange_strong(&sid_seed, &expected, seed))
            seed = expected;
    }
    n = atomic_fetch_add(&sid_counter, 1u);
    snprintf(out, HOST_LOG_SID_LEN + 1, "%012llx", (unsigned long long)mix48(seed + n));
}

/* ---- tokens ----------------------------------------------------------------------------- */

static const char hex_digits[] = "0123456789ABCDEF";

/* Copies src as a token into dst[o..cap), escaping ',' too when comma is set. Returns the new
 * length (dst NUL-terminated) and sets *all if every octet fitted. */
static size_t put_token(char *dst, size_t cap, size_t o, const void *src, size_t len, int comma,
                        int *all)
{
    const unsigned char *s = src;
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = s[i];
        int plain = c > ' ' && c < 0x7f && c != '%' && !(comma && c == ',');
        size_t need = plain ? 1 : 3;
        if (o + need >= cap)
            break;
        if (plain) {
            dst[o++] = (char)c;
        } else {
            dst[o++] = '%';
            dst[o++] = hex_digits[c >> 4];
            dst[o++] = hex_digits[c & 15];
        }
    }
    dst[o] = '\0';
    *all = i == len;
    return o;
}

char *host_log_token(char *dst, size_t cap, const void *src, size_t len)
{
    int all;

    (void)put_token(dst, cap, 0, src, len, 0, &all);
    return dst;
}

int host_log_list_add(char *list, size_t cap, size_t *len, const void *item, size_t item_len)
{
    size_t o = *len;
    int all;

    if (cap == 0 || o + (o > 0) >= cap)
        return -1;
    if (o > 0)
        list[o++] = ',';
    o = put_token(list, cap, o, item, item_len, 1, &all);
    if (!all) {
        list[*len] = '\0';
        return -1;
    }
    *len = o;
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------------- */

/* A JSON object being written into p[0..cap): stop is where the closing must still fit. */
struct json_out {
    char *p;
    size_t len, stop;
    int cut; /* something did not fit: the object ends with "truncated":true */
};

static int json_put(struct json_out *j, const char *s, size_t n)
{
    if (j->cut || j->len + n > j->stop) {
        j->cut = 1;
        return -1;
    }
    memcpy(j->p + j->len, s, n);
    j->len += n;
    return 0;
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
}

/* Decodes the %XX of a token: v[0..n) into out (n octets at most). Returns the length. */
static size_t token_decode(const char *v, size_t n, unsigned char *out)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (v[i] == '%' && i + 2 < n && (hi = hex_value(v[i + 1])) >= 0 &&
            (lo = hex_value(v[i + 2])) >= 0) {
            out[o++] = (unsigned char)(hi << 4 | lo);
            i += 2;
        } else {
            out[o++] = (unsigned char)v[i];
        }
    }
    return o;
}

/* The length of the valid UTF-8 sequence at s[0..n) (RFC 3629 §4: shortest form, no
 * surrogates, at most U+10FFFF), 0 if s does not start one. s[0] >= 0x80. */
static size_t utf8_length(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len = c >= 0xC2 && c <= 0xDF   ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
    unsigned lo = 0x80, hi = 0xBF;

    if (len == 0 || len > n)
        return 0;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* A JSON string of the token v[0..n): valid UTF-8 as itself, '"' and '\' escaped, control
 * octets, '%' and octets that are not UTF-8 as %XX. If it does not fit whole, as much of it
 * as fits (whole characters) and the closing quote, and j->cut is set. */
static void json_string(struct json_out *j, const char *v, size_t n)
{
    unsigned char raw[HOST_LOG_LINE_MAX];
    size_t len;

    if (n > sizeof raw)
        n = sizeof raw;
    len = token_decode(v, n, raw);
    if (j->cut || j->len + 2 > j->stop) {
        j->cut = 1;
        return;
    }
    j->p[j->len++] = '"';
    for (size_t i = 0; i < len;) {
        unsigned char c = raw[i];
        char esc[3];
        const char *s = esc;
        size_t k = 1, u;
        if (c >= 0x80 && (u = utf8_length(raw + i, len - i)) > 0) {
            s = (const char *)raw + i;
            k = u;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            k = 2;
        } else if (c < 0x20 || c >= 0x7f || c == '%') {
            esc[0] = '%';
            esc[1] = hex_digits[c >> 4];
            esc[2] = hex_digits[c & 15];
            k = 3;
        } else {
            esc[0] = (char)c;
        }
        if (j->len + k + 1 > j->stop) { /* + the closing quote */
            j->cut = 1;
            break;
        }
        memcpy(j->p + j->len, s, k);
        j->len += k;
        i += s == esc ? 1 : k;
    }
    j->p[j->len++] = '"'; /* within stop: room was left for it */
}

/* Keys whose values stay strings even when they are all digits (identifiers). */
static int identifier_key(const char *k, size_t n)
{
    static const char *const keys[] = {"sid", "id", "ids", "helo", "user", "auth", "from",
                                       "rcpts", "hostname", "name", "login", "mechanism"};

    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strlen(keys[i]) == n && memcmp(keys[i], k, n) == 0)
            return 1;
    return 0;
}

/* A decimal integer JSON can hold exactly: -?(0|[1-9][0-9]{0,14}). */
static int json_number(const char *v, size_t n)
{
    size_t i = v[0] == '-';

    if (n == i || n - i > 15 || (v[i] == '0' && n - i > 1))
        return 0;
    for (; i < n; i++)
        if (v[i] < '0' || v[i] > '9')
            return 0;
    return 1;
}

static int reserved_key(const char *k, size_t n)
{
    static const char *const keys[] = {"time", "pid", "event", "msg", "truncated"};

    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strlen(keys[i]) == n && memcmp(keys[i], k, n) == 0)
            return 1;
    return 0;
}

/* Whether w[0..n) is key=value with a key of letters, digits, '_' and '-'; *eq: the '='. */
static int key_value(const char *w, size_t n, size_t *eq)
{
    size_t i = 0;

    for (; i < n && w[i] != '='; i++)
        if (!((w[i] >= 'a' && w[i] <= 'z') || (w[i] >= 'A' && w[i] <= 'Z') ||
              (w[i] >= '0' && w[i] <= '9') || w[i] == '_' || w[i] == '-'))
            return 0;
    *eq = i;
    return i > 0 && i < n;
}

/* Keys whose values are lists (host_log_list_add): JSON arrays of strings. */
static int list_key(const char *k, size_t n)
{
    return (n == 5 && memcmp(k, "rcpts", 5) == 0) || (n == 3 && memcmp(k, "ids", 3) == 0);
}

/* The list v[0..n) (tokens separated by commas; "-" for none) as an array of JSON strings;
 * cut short (and closed) like a string when it does not fit. */
static void json_list(struct json_out *j, const char *v, size_t n)
{
    size_t i = 0;

    j->p[j->len++] = '['; /* the caller checked that "[" and "]" fit */
    j->stop--;            /* room for the "]" */
    if (n == 1 && v[0] == '-')
        n = 0; /* "-": the empty list */
    while (i < n && !j->cut) {
        size_t k = i;
        while (k < n && v[k] != ',')
            k++;
        if (i > 0 && json_put(j, ",", 1) < 0)
            break;
        json_string(j, v + i, k - i);
        i = k + 1;
    }
    j->stop++;
    j->p[j->len++] = ']';
}

/* One field "key":value; own is 0 for a key of the record, which is prefixed with event_ if
 * the object has it already. */
static void json_field(struct json_out *j, const char *event, size_t event_len, const char *k,
                       size_t kn, const char *v, size_t vn, int own)
{
    size_t mark = j->len;
    int number = json_number(v, vn) && !identifier_key(k, kn);
    int list = !own && list_key(k, kn);

    if (json_put(j, ",\"", 2) < 0 ||
        (!own && reserved_key(k, kn) &&
         (json_put(j, event, event_len) < 0 || json_put(j, "_", 1) < 0)) ||
        json_put(j, k, kn) < 0 || json_put(j, "\":", 2) < 0 ||
        (number && json_put(j, v, vn) < 0) || (!number && j->len + 4 > j->stop)) {
        j->len = mark; /* not even the start of its value fits: left out */
        j->cut = 1;
        return;
    }
    if (list)
        json_list(j, v, vn);
    else if (!number)
        json_string(j, v, vn);
}

/* The record "EVENT key=value ... words" as a JSON object into out[0..cap). */
static size_t json_line(char *out, size_t cap, const char *time, long pid, const char *rec)
{
    static const char tail[] = ",\"truncated\":true}\n";
    struct json_out j = {out, 0, cap - sizeof tail, 0}; /* tail and the NUL */
    const char *p = rec, *event;
    int words = 0;
    size_t event_len, msg_len = 0;
    char msg[HOST_LOG_LINE_MAX], num[32];

    (void)json_put(&j, "{", 1);
    if (time != NULL) {
        (void)json_put(&j, "\"time\":\"", 8);
        (void)json_put(&j, time, strlen(time));
        (void)json_put(&j, "\",", 2);
    }
    snprintf(num, sizeof num, "\"pid\":%ld,\"event\":", pid);
    (void)json_put(&j, num, strlen(num));
    event = p;
    event_len = strcspn(p, " ");
    json_string(&j, event, event_len);
    p += event_len;
    while (*p != '\0') {
        size_t n, eq;
        const char *w;
        while (*p == ' ')
            p++;
        w = p;
        n = strcspn(p, " ");
        p += n;
        if (n == 0)
            break;
        if (key_value(w, n, &eq)) {
            json_field(&j, event, event_len, w, eq, w + eq + 1, n - eq - 1, 0);
            continue;
        }
        words = 1;
        if (msg_len + n + 1 < sizeof msg) { /* the words, joined by one space */
            if (msg_len > 0)
                msg[msg_len++] = ' ';
            memcpy(msg + msg_len, w, n);
            msg_len += n;
        }
    }
    if (words)
        json_field(&j, event, event_len, "msg", 3, msg, msg_len, 1);
    if (j.cut) {
        memcpy(out + j.len, tail, sizeof tail); /* with its NUL */
        return j.len + sizeof tail - 1;
    }
    out[j.len++] = '}';
    out[j.len++] = '\n';
    out[j.len] = '\0';
    return j.len;
}

size_t host_log_format(char *out, size_t cap, int format, const char *time, long pid,
                       const char *record)
{
    int n;
    size_t len;

    if (cap > HOST_LOG_LINE_MAX + 1)
        cap = HOST_LOG_LINE_MAX + 1;
    if (format == HOST_LOG_JSON)
        return json_line(out, cap, time, pid, record);
    n = snprintf(out, cap, "%s%ssmtpe[%ld]: %s", time ? time : "", time ? " " : "", pid, record);
    len = n < 0 ? 0 : (size_t)n;
    if (len > cap - 2)
        len = cap - 2;
    out[len++] = '\n';
    out[len] = '\0';
    return len;
}

void host_log(const char *fmt, ...)
{
    char record[HOST_LOG_LINE_MAX], line[HOST_LOG_LINE_MAX + 1], now[25];
    va_list ap;
    size_t len;

    (void)pthread_once(&log_once, log_setup_once);
    if (log_pid == 0)
        log_pid = getpid();
    va_start(ap, fmt);
    if (vsnprintf(record, sizeof record, fmt, ap) < 0)
        record[0] = '\0';
    va_end(ap);
    if (log_with_time)
        host_log_time(now);
    len = host_log_format(line, sizeof line, log_format, log_with_time ? now : NULL,
                          (long)log_pid, record);
    if (batch == NULL) {
        write_all(line, len);
        return;
    }
    if (batch_len + len > LOG_BATCH)
        host_log_flush();
    memcpy(batch + batch_len, line, len);
    batch_len += len;
}

int host_log_limited(struct host_log_limit *r, uint64_t now_ms, uint64_t period_ms,
                     unsigned *quiet)
{
    if (r->logged != 0 && now_ms - r->logged < period_ms) {
        r->quiet++;
        return 0;
    }
    *quiet = r->quiet;
    r->logged = now_ms;
    r->quiet = 0;
    return 1;
}

void host_log_reject(uint64_t now_ms, const char *sid, const char *peer, const char *reason)
{
    /* One limit for the process: in the threads model a refusal after a PROXY header comes
     * from the connection's own thread, so a limit per thread would limit nothing. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static struct host_log_limit limit;
    unsigned quiet = 0;
    int log;

    pthread_mutex_lock(&lock);
    log = host_log_limited(&limit, now_ms, HOST_LOG_REJECT_MS, &quiet);
    pthread_mutex_unlock(&lock);
    if (log)
        host_log("reject %s%s%speer=%s reason=%s (%u more rejects since the last report)",
                 sid ? "sid=" : "", sid ? sid : "", sid ? " " : "", peer, reason, quiet);
}
