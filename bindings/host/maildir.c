/*
 * maildir.c - durable Maildir delivery and queue ids (see maildir.h).
 *
 * File names follow the Maildir convention <secs>.<unique>.<host>, with the queue id as the
 * unique part; all file operations are relative to directory descriptors opened once at start,
 * so a long Maildir path costs nothing per message and a renamed parent does not split tmp/ and
 * new/ across file systems.
 */
#include "maildir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAILDIR_WRITE_BUF 65536 /* octets buffered before a write() */
#define MAILDIR_HOST_IN_NAME 200 /* longest host part in a file name (NAME_MAX is 255) */
#define MAILDIR_NAME_MAX 256

struct maildir_msg {
    const struct maildir *md;
    int fd;
    int error;  /* errno of the first failed write, 0 if none */
    size_t len; /* octets in buf */
    char name[MAILDIR_NAME_MAX];
    unsigned char buf[MAILDIR_WRITE_BUF];
};

/* mkdir that accepts an existing directory. */
static int mkdir_ok(int dirfd, const char *path)
{
    struct stat st;

    if (mkdirat(dirfd, path, 0700) == 0)
        return 0;
    if (errno != EEXIST)
        return -1;
    if (fstatat(dirfd, path, &st, 0) < 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Creates path and every missing parent ("mkdir -p"). */
static int mkdir_parents(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i < n; i++) {
        if (buf[i] != '/')
            continue;
        buf[i] = '\0';
        if (mkdir_ok(AT_FDCWD, buf) < 0)
            return -1;
        buf[i] = '/';
    }
    return mkdir_ok(AT_FDCWD, buf);
}

static int open_dir(int dirfd, const char *path)
{
    return openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

/* The hostname with '/' and ':' escaped as octal, as Maildir readers expect. */
static void escape_host(char *out, size_t cap, const char *host)
{
    size_t o = 0;

    for (const char *p = host; *p; p++) {
        const char *piece = *p == '/' ? "\\057" : *p == ':' ? "\\072" : NULL;
        size_t plen = piece ? 4 : 1;
        if (o + plen >= cap || o + plen > MAILDIR_HOST_IN_NAME)
            break;
        if (piece)
            memcpy(out + o, piece, plen);
        else
            out[o] = *p;
        o += plen;
    }
    out[o] = '\0';
}

int maildir_open(struct maildir *md, const char *path, const char *hostname, char *err,
                 size_t errlen)
{
    static const char *const sub[] = {"tmp", "new", "cur"};

    md->root_fd = md->tmp_fd = md->new_fd = -1;
    escape_host(md->host_part, sizeof md->host_part, hostname);
    if (mkdir_parents(path) < 0 || (md->root_fd = open_dir(AT_FDCWD, path)) < 0) {
        snprintf(err, errlen, "maildir %s: %s", path, strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        if (mkdir_ok(md->root_fd, sub[i]) < 0) {
            snprintf(err, errlen, "maildir %s/%s: %s", path, sub[i], strerror(errno));
            maildir_close(md);
            return -1;
        }
    }
    md->tmp_fd = open_dir(md->root_fd, "tmp");
    md->new_fd = open_dir(md->root_fd, "new");
    if (md->tmp_fd < 0 || md->new_fd < 0) {
        snprintf(err, errlen, "maildir %s: %s", path, strerror(errno));
        maildir_close(md);
        return -1;
    }
    return 0;
}

long maildir_sweep_tmp(struct maildir *md, time_t now, time_t max_age)
{
    int fd = dup(md->tmp_fd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    struct dirent *e;
    long removed = 0;

    if (d == NULL) {
        if (fd >= 0)
            (void)close(fd);
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (e->d_name[0] == '.')
            continue;
        if (fstatat(md->tmp_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode) && st.st_mtime < now - max_age &&
            unlinkat(md->tmp_fd, e->d_name, 0) == 0)
            removed++;
    }
    (void)closedir(d);
    return removed;
}

void maildir_close(struct maildir *md)
{
    int *fds[] = {&md->root_fd, &md->tmp_fd, &md->new_fd};

    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
        if (*fds[i] >= 0)
            (void)close(*fds[i]);
        *fds[i] = -1;
    }
}

void maildir_queue_id(char out[MAILDIR_QUEUE_ID_LEN + 1])
{
    static atomic_uint counter;
    struct timespec ts;
    uint64_t us = 0;
    unsigned n = atomic_fetch_add(&counter, 1u);

    if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
        us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    /* 14 + 8 + 6 hex digits: fixed widths, so different triples never give the same id. */
    snprintf(out, MAILDIR_QUEUE_ID_LEN + 1, "%014" PRIX64 "%08X%06X",
             us & UINT64_C(0xFFFFFFFFFFFFFF), (unsigned)getpid(), n & 0xFFFFFFu);
}

struct maildir_msg *maildir_msg_begin(const struct maildir *md, const char *queue_id,
                                      time_t secs)
{
    struct maildir_msg *m = malloc(sizeof *m);
    int n;

    if (m == NULL)
        return NULL;
    m->md = md;
    m->error = 0;
    m->len = 0;
    n = snprintf(m->name, sizeof m->name, "%lld.%s.%s", (long long)secs, queue_id,
                 md->host_part);
    if (n < 0 || (size_t)n >= sizeof m->name) {
        free(m);
        errno = ENAMETOOLONG;
        return NULL;
    }
    m->fd = -1; /* opened when the buffer first fills, or at commit */
    return m;
}

/* Creates the file in tmp/ if that has not been done. Returns 0, or -1 (m->error set). */
static int ensure_open(struct maildir_msg *m)
{
    if (m->fd >= 0 || m->error)
        return m->error ? -1 : 0;
    m->fd = openat(m->md->tmp_fd, m->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (m->fd < 0)
        m->error = errno;
    return m->fd < 0 ? -1 : 0;
}

/* write() all of p[0..len), retrying on EINTR and short writes. */
static int write_all(int fd, const unsigned char *p, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static int flush_buf(struct maildir_msg *m)
{
    if (ensure_open(m) == 0 && m->len > 0 && write_all(m->fd, m->buf, m->len) < 0)
        m->error = errno;
    m->len = 0;
    return m->error ? -1 : 0;
}

int maildir_msg_write(struct maildir_msg *m, const void *p, size_t len)
{
    const unsigned char *s = p;

    if (m->error)
        return -1;
    if (len >= MAILDIR_WRITE_BUF) { /* large piece: bypass the buffer */
        if (flush_buf(m) < 0)
            return -1;
        if (write_all(m->fd, s, len) < 0) /* flush_buf opened it */
            m->error = errno;
        return m->error ? -1 : 0;
    }
    if (m->len + len > MAILDIR_WRITE_BUF && flush_buf(m) < 0)
        return -1;
    memcpy(m->buf + m->len, s, len);
    m->len += len;
    return 0;
}

int maildir_msg_commit(struct maildir_msg *m)
{
    const struct maildir *md = m->md;
    int fd, e;

    if (flush_buf(m) < 0) { /* also creates the file of a message that fit the buffer */
        e = m->error;
        goto fail;
    }
    fd = m->fd;
    m->fd = -1;
    if (fsync(fd) < 0) {
        e = errno;
        (void)close(fd);
        goto fail_created;
    }
    if (close(fd) < 0 && errno != EINTR) {
        e = errno;
        goto fail_created;
    }
    if (renameat(md->tmp_fd, m->name, md->new_fd, m->name) < 0) {
        e = errno;
        goto fail_created;
    }
    if (fsync(md->new_fd) < 0) {
        /* Not durable: take it back, the client will be told to retry. */
        e = errno;
        (void)unlinkat(md->new_fd, m->name, 0);
        free(m);
        errno = e;
        return -1;
    }
    free(m);
    return 0;
fail:
    if (m->fd < 0) { /* never created: nothing to remove */
        free(m);
        errno = e;
        return -1;
    }
    (void)close(m->fd);
fail_created:
    (void)unlinkat(md->tmp_fd, m->name, 0);
    free(m);
    errno = e;
    return -1;
}

void maildir_msg_abort(struct maildir_msg *m)
{
    if (m == NULL)
        return;
    if (m->fd >= 0) { /* created: remove it */
        (void)close(m->fd);
        (void)unlinkat(m->md->tmp_fd, m->name, 0);
    }
    free(m);
}
