/*
 * log.c - key=value log lines on stderr (see log.h).
 */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOG_LINE_MAX 2048
#define LOG_BATCH 4096 /* PIPE_BUF: one write of whole lines never interleaves with another */

static pid_t log_pid;               /* cached: getpid() is a system call per line otherwise */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static __thread char *batch;        /* this thread's batch (host_log_batch), NULL: none */
static __thread size_t batch_len;

static void forget_pid(void)
{
    log_pid = 0; /* in a forked child: its own pid from the next line on */
}

static void log_setup(void)
{
    (void)pthread_atfork(NULL, NULL, forget_pid);
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

void host_log(const char *fmt, ...)
{
    char line[LOG_LINE_MAX];
    va_list ap;
    int n, m;
    size_t len;

    (void)pthread_once(&log_once, log_setup);
    if (log_pid == 0)
        log_pid = getpid();
    n = snprintf(line, sizeof line, "smtpe[%ld]: ", (long)log_pid);
    if (n < 0)
        return;
    va_start(ap, fmt);
    m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
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

void host_log_reject(uint64_t now_ms, const char *peer, const char *reason)
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
        host_log("reject peer=%s reason=%s (%u more rejects since the last report)", peer,
                 reason, quiet);
}

char *host_log_token(char *dst, size_t cap, const void *src, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *s = src;
    size_t o = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        int plain = c > ' ' && c < 0x7f && c != '%';
        size_t need = plain ? 1 : 3;
        if (o + need >= cap)
            break;
        if (plain) {
            dst[o++] = (char)c;
        } else {
            dst[o++] = '%';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        }
    }
    dst[o] = '\0';
    return dst;
}
