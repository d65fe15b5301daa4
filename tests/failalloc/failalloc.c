/*
 * failalloc.c - the failing allocator of smtpe-server-failalloc (tests/failalloc/README.md).
 *
 * The executable is linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=strndup,--wrap=mmap
 * so every call of those functions from our own objects (bindings/ and the static engine) comes
 * here instead; calls made inside libc, OpenSSL or libcrypt are not ours and are not wrapped.
 * Each such call is one allocation, numbered from 1 in the order they happen (an atomic counter,
 * so threads are fine; with fork every process counts on from the number it inherited):
 *   malloc, calloc, strdup, strndup: every call;
 *   realloc: every call with a size other than 0 (realloc(p, 0) frees);
 *   mmap: every call (our code maps only anonymous memory).
 *
 * Environment:
 *   SMTPE_FAILALLOC=N        allocation N (1-based) fails the way the real function fails when
 *                            memory runs out: NULL (MAP_FAILED for mmap) with errno ENOMEM.
 *                            Only that one; the ones after it succeed again. 0 or unset: none.
 *   SMTPE_FAILALLOC_COUNT=F  at exit (return from main or exit(), which is also the path of a
 *                            SIGTERM that the server handles) writes to F:
 *                              allocations=K
 *                              failed=N function=NAME size=OCTETS frames=OBJ+0xOFF,...
 *                            (the second line only when allocation N did fail; frames are the
 *                            return addresses of the failed call, innermost first, as offsets
 *                            into their object for addr2line). F is also written when
 *                            allocation N fails (then K = N), so that a process killed later
 *                            still tells where. A forked child writes F.<pid>.
 *
 * When allocation N fails, one line goes to stderr at once:
 *   failalloc: allocation N (NAME, OCTETS octets) fails
 * so that a log shows where in the session it happened.
 *
 * The real functions are reached through __real_*, which under AddressSanitizer are its
 * interceptors: ASan still sees every allocation, and LeakSanitizer every leak.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);

#define FA_FRAMES 8      /* return addresses kept for the failed allocation */
#define FA_PATH_MAX 4096 /* longest SMTPE_FAILALLOC_COUNT */

static atomic_ulong fa_count;     /* allocations so far */
static unsigned long fa_fail_at;  /* SMTPE_FAILALLOC; 0: none. Set before main, then only read */
static char fa_path[FA_PATH_MAX]; /* SMTPE_FAILALLOC_COUNT; "" for none */
static pid_t fa_pid;              /* the process that read the environment */
/* The count file's "failed=..." line, written by the one thread whose allocation fails. */
static char fa_failed_line[FA_FRAMES * 512 + 128];

/* Appends s to buf[*len..cap), keeping it NUL-terminated (cut if it does not fit). */
static void put(char *buf, size_t cap, size_t *len, const char *s)
{
    size_t room = cap - 1 - *len;

    for (; *s != '\0' && room > 0; s++, room--)
        buf[(*len)++] = *s;
    buf[*len] = '\0';
}

/* Appends v in base 10 or 16 (no prefix). */
static void put_num(char *buf, size_t cap, size_t *len, unsigned long long v, unsigned base)
{
    char tmp[32];
    size_t i = sizeof tmp - 1;

    tmp[i] = '\0';
    do {
        tmp[--i] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v != 0 && i > 0);
    put(buf, cap, len, tmp + i);
}

static void write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        len -= (size_t)w;
    }
}

/* One frame as "object+0xoffset" (the offset from the object's load address, what addr2line
 * wants), or "?+0xaddress" when dladdr does not know it. */
static void put_frame(char *buf, size_t cap, size_t *len, void *addr)
{
    Dl_info info;
    uintptr_t a = (uintptr_t)addr, base = 0;
    const char *obj = "?";

    if (dladdr(addr, &info) != 0 && info.dli_fname != NULL) {
        obj = info.dli_fname;
        base = (uintptr_t)info.dli_fbase;
    }
    put(buf, cap, len, obj);
    put(buf, cap, len, "+0x");
    put_num(buf, cap, len, (unsigned long long)(a - base), 16);
}

/* Writes the count file: "allocations=" the count so far, then the failed allocation's line if
 * there is one. Called at exit, and when allocation N fails. */
static void fa_write(void)
{
    char path[FA_PATH_MAX + 32], out[64];
    size_t plen = 0, len = 0;
    int fd;

    if (fa_path[0] == '\0')
        return;
    put(path, sizeof path, &plen, fa_path);
    if (getpid() != fa_pid) { /* a forked child: its own file */
        put(path, sizeof path, &plen, ".");
        put_num(path, sizeof path, &plen, (unsigned long long)getpid(), 10);
    }
    put(out, sizeof out, &len, "allocations=");
    put_num(out, sizeof out, &len, atomic_load(&fa_count), 10);
    put(out, sizeof out, &len, "\n");
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    write_all(fd, out, len);
    write_all(fd, fa_failed_line, strlen(fa_failed_line));
    (void)close(fd);
}

/* Fills fa_failed_line for allocation n (function name, size octets), with the frames of the
 * call. */
static void record_failure(unsigned long n, const char *name, size_t size)
{
    void *frames[FA_FRAMES];
    int nframes = backtrace(frames, FA_FRAMES); /* libgcc is loaded already: no allocation */
    char *b = fa_failed_line;
    size_t cap = sizeof fa_failed_line, len = 0;

    put(b, cap, &len, "failed=");
    put_num(b, cap, &len, n, 10);
    put(b, cap, &len, " function=");
    put(b, cap, &len, name);
    put(b, cap, &len, " size=");
    put_num(b, cap, &len, size, 10);
    put(b, cap, &len, " frames=");
    for (int i = 0; i < nframes; i++) {
        if (i > 0)
            put(b, cap, &len, ",");
        put_frame(b, cap, &len, frames[i]);
    }
    put(b, cap, &len, "\n");
}

/* Counts one allocation and decides whether it fails; a failure is recorded, written to the
 * count file and announced on stderr. Returns 1 if it fails. errno is kept. */
static int fa_fails(const char *name, size_t size)
{
    unsigned long n = atomic_fetch_add(&fa_count, 1ul) + 1ul;
    char line[160];
    size_t len = 0;
    int saved = errno;

    if (fa_fail_at == 0 || n != fa_fail_at)
        return 0;
    record_failure(n, name, size);
    fa_write();
    put(line, sizeof line, &len, "failalloc: allocation ");
    put_num(line, sizeof line, &len, n, 10);
    put(line, sizeof line, &len, " (");
    put(line, sizeof line, &len, name);
    put(line, sizeof line, &len, ", ");
    put_num(line, sizeof line, &len, size, 10);
    put(line, sizeof line, &len, " octets) fails\n");
    write_all(STDERR_FILENO, line, len);
    errno = saved;
    return 1;
}

void *__wrap_malloc(size_t size)
{
    if (fa_fails("malloc", size)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (fa_fails("calloc", size != 0 && n > SIZE_MAX / size ? SIZE_MAX : n * size)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    if (size != 0 && fa_fails("realloc", size)) {
        errno = ENOMEM; /* p stays valid, as with the real realloc */
        return NULL;
    }
    return __real_realloc(p, size);
}

char *__wrap_strdup(const char *s)
{
    if (fa_fails("strdup", strlen(s) + 1)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    if (fa_fails("strndup", strnlen(s, n) + 1)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_strndup(s, n);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (fa_fails("mmap", len)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

/* Before main: reads the environment, loads what backtrace needs (so that the failing call
 * does not load it), and arranges the report at exit. A bad SMTPE_FAILALLOC exits 2. */
__attribute__((constructor(101))) static void fa_setup(void)
{
    const char *n = getenv("SMTPE_FAILALLOC"), *f = getenv("SMTPE_FAILALLOC_COUNT");
    void *warm[2];

    fa_pid = getpid();
    if (n != NULL && *n != '\0') {
        char *end;
        errno = 0;
        fa_fail_at = strtoul(n, &end, 10);
        if (errno != 0 || *end != '\0') {
            static const char msg[] = "failalloc: SMTPE_FAILALLOC is not a number\n";
            write_all(STDERR_FILENO, msg, sizeof msg - 1);
            _exit(2);
        }
    }
    if (f != NULL && strlen(f) < sizeof fa_path)
        memcpy(fa_path, f, strlen(f) + 1);
    (void)backtrace(warm, 2);
    if (atexit(fa_write) != 0) {
        static const char msg[] = "failalloc: atexit failed\n";
        write_all(STDERR_FILENO, msg, sizeof msg - 1);
        _exit(2);
    }
}
