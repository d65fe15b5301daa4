/*
 * log.c - key=value log lines on stderr (see log.h).
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#define LOG_LINE_MAX 2048

void host_log(const char *fmt, ...)
{
    char line[LOG_LINE_MAX];
    va_list ap;
    int n = snprintf(line, sizeof line, "smtpe[%ld]: ", (long)getpid());
    int m;
    size_t len, off = 0;

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
    while (off < len) {
        ssize_t w = write(STDERR_FILENO, line + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* nowhere to report it */
        off += (size_t)w;
    }
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
