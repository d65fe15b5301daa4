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
#include <limits.h>
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
    struct maildir_box *boxes; /* the caller's, boxes[0..nbox) */
    size_t nbox;
    size_t host;    /* the box whose tmp/ holds the written file (valid once fd >= 0) */
    unsigned flags; /* MAILDIR_* */
    int fd;         /* the written file, -1 until created */
    int error;      /* errno of the first failed write, 0 if none */
    int pending_cr; /* MAILDIR_LF: a CR ended the last piece, its LF may follow */
    off_t head;     /* octets of the host box's Delivered-To line: the shared content follows */
    size_t len;     /* octets in buf */
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

void maildir_host_part(char *out, size_t cap, const char *host)
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
    maildir_host_part(md->host_part, sizeof md->host_part, hostname);
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

int maildir_is_template(const char *tmpl)
{
    return strstr(tmpl, "{domain}") != NULL || strstr(tmpl, "{local}") != NULL;
}

int maildir_component(char *out, size_t cap, size_t *len, const uint8_t *p, size_t n, int colon)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = *len, start = *len;

    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        int esc = c < 0x20 || c == 0x7f || c == '/' || c == '%' || (colon && c == ':') ||
                  (i == 0 && c == '.');
        if (o + (esc ? 3 : 1) >= cap || o + (esc ? 3 : 1) - start > NAME_MAX)
            return -1;
        if (esc) {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        } else
            out[o++] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    out[o] = '\0';
    *len = o;
    return 0;
}

int maildir_expand(char *out, size_t cap, const char *tmpl, const uint8_t *local,
                   size_t local_len, const uint8_t *domain, size_t domain_len)
{
    /* room under the path for "/tmp/" and a file name */
    size_t limit = PATH_MAX - 5 - MAILDIR_NAME_MAX, o = 0, seg = 0;

    if (cap < limit + 1)
        limit = cap - 1;
    for (const char *t = tmpl; *t != '\0';) {
        if (strncmp(t, "{domain}", 8) == 0 || strncmp(t, "{local}", 7) == 0) {
            int dom = t[1] == 'd';
            if (maildir_component(out, limit + 1, &o, dom ? domain : local,
                                  dom ? domain_len : local_len, dom) < 0)
                return -1;
            t += dom ? 8 : 7;
        } else {
            if (o + 1 > limit)
                return -1;
            out[o++] = *t++;
        }
        /* every component, template text included, within NAME_MAX */
        if (out[o - 1] == '/')
            seg = o;
        else if (o - seg > NAME_MAX)
            return -1;
    }
    out[o] = '\0';
    return o > 0 ? 0 : -1;
}

struct maildir_msg *maildir_msg_begin(struct maildir_box *boxes, size_t nbox,
                                      const char *host_part, const char *queue_id, time_t secs,
                                      unsigned flags)
{
    struct maildir_msg *m;
    int n;

    if (nbox == 0) {
        errno = EINVAL;
        return NULL;
    }
    if ((m = malloc(sizeof *m)) == NULL)
        return NULL;
    m->boxes = boxes;
    m->nbox = nbox;
    m->host = 0;
    m->flags = flags;
    m->error = 0;
    m->pending_cr = 0;
    m->head = 0;
    m->len = 0;
    for (size_t i = 0; i < nbox; i++) {
        boxes[i].error = 0;
        boxes[i].tmp_fd = boxes[i].new_fd = -1;
        boxes[i].own_fds = boxes[i].made = 0;
    }
    n = snprintf(m->name, sizeof m->name, "%lld.%s.%s", (long long)secs, queue_id, host_part);
    if (n < 0 || (size_t)n >= sizeof m->name) {
        free(m);
        errno = ENAMETOOLONG;
        return NULL;
    }
    m->fd = -1; /* opened when the buffer first fills, or at commit */
    return m;
}

/* The box's tmp/ and new/: its Maildir's, or path's, created on first delivery (mkdir -p,
 * then tmp/ new/ cur/). Returns 0, or -1 with errno set. */
static int box_open(struct maildir_box *b)
{
    int root, e;

    if (b->tmp_fd >= 0)
        return 0;
    if (b->md != NULL) {
        b->tmp_fd = b->md->tmp_fd;
        b->new_fd = b->md->new_fd;
        return 0;
    }
    root = open_dir(AT_FDCWD, b->path);
    if (root < 0 && errno == ENOENT && mkdir_parents(b->path) == 0)
        root = open_dir(AT_FDCWD, b->path);
    if (root < 0)
        return -1;
    b->tmp_fd = open_dir(root, "tmp");
    b->new_fd = open_dir(root, "new");
    if (b->tmp_fd < 0 || b->new_fd < 0) { /* first delivery: make the Maildir */
        if (b->tmp_fd >= 0)
            (void)close(b->tmp_fd);
        if (b->new_fd >= 0)
            (void)close(b->new_fd);
        b->tmp_fd = b->new_fd = -1;
        if (mkdir_ok(root, "tmp") < 0 || mkdir_ok(root, "new") < 0 ||
            mkdir_ok(root, "cur") < 0 || (b->tmp_fd = open_dir(root, "tmp")) < 0 ||
            (b->new_fd = open_dir(root, "new")) < 0) {
            e = errno;
            if (b->tmp_fd >= 0)
                (void)close(b->tmp_fd);
            b->tmp_fd = -1;
            (void)close(root);
            errno = e;
            return -1;
        }
    }
    (void)close(root);
    b->own_fds = 1;
    return 0;
}

void maildir_boxes_clear(struct maildir_box *boxes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct maildir_box *b = &boxes[i];
        if (b->own_fds) {
            (void)close(b->tmp_fd);
            (void)close(b->new_fd);
        }
        b->tmp_fd = b->new_fd = -1;
        b->own_fds = 0;
        free(b->path);
        free(b->address);
        b->path = b->address = NULL;
    }
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

/* Writes the box's Delivered-To line (RFC 9228 §4), with the message's line end, to fd.
 * Returns its length in octets (0 without an address), or -1 with errno set. */
static off_t write_head(const struct maildir_msg *m, const struct maildir_box *b, int fd)
{
    char line[MAILDIR_ADDRESS_MAX + 32];
    int n;

    if (b->address == NULL)
        return 0;
    n = snprintf(line, sizeof line, "Delivered-To: %s%s", b->address,
                 (m->flags & MAILDIR_LF) ? "\n" : "\r\n");
    if (n < 0 || (size_t)n >= sizeof line) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return write_all(fd, (const unsigned char *)line, (size_t)n) < 0 ? -1 : (off_t)n;
}

/* Creates the file in the tmp/ of the first box that opens, after that box's Delivered-To
 * line, if that has not been done. Returns 0, or -1 (m->error set). */
static int ensure_open(struct maildir_msg *m)
{
    if (m->fd >= 0 || m->error)
        return m->error ? -1 : 0;
    for (size_t i = 0; i < m->nbox; i++) {
        struct maildir_box *b = &m->boxes[i];
        off_t h;
        if (box_open(b) < 0 ||
            (m->fd = openat(b->tmp_fd, m->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                            0600)) < 0) {
            b->error = errno;
            continue;
        }
        if ((h = write_head(m, b, m->fd)) < 0) {
            b->error = errno;
            (void)close(m->fd);
            (void)unlinkat(b->tmp_fd, m->name, 0);
            m->fd = -1;
            continue;
        }
        b->made = 1;
        m->host = i;
        m->head = h;
        return 0;
    }
    m->error = m->boxes[0].error;
    return -1;
}

static int flush_buf(struct maildir_msg *m)
{
    if (ensure_open(m) == 0 && m->len > 0 && write_all(m->fd, m->buf, m->len) < 0)
        m->error = errno;
    m->len = 0;
    return m->error ? -1 : 0;
}

/* Appends len octets as they are. */
static int put(struct maildir_msg *m, const unsigned char *s, size_t len)
{
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

int maildir_msg_write(struct maildir_msg *m, const void *p, size_t len)
{
    const unsigned char *s = p;

    if (!(m->flags & MAILDIR_LF))
        return put(m, s, len);
    /* CRLF -> LF, also across pieces: a CR that ends a piece waits for the next octet */
    while (len > 0) {
        const unsigned char *cr;
        size_t n;
        if (m->pending_cr) {
            m->pending_cr = 0;
            if (s[0] != '\n' && put(m, (const unsigned char *)"\r", 1) < 0)
                return -1;
        }
        cr = memchr(s, '\r', len);
        n = cr ? (size_t)(cr - s) : len;
        if (n > 0 && put(m, s, n) < 0)
            return -1;
        if (cr == NULL)
            break;
        m->pending_cr = 1;
        s = cr + 1;
        len -= n + 1;
    }
    return m->error ? -1 : 0;
}

/* Copies in[off..end of file) to out at its offset: copy_file_range(2), within the kernel,
 * or pread/write through buf (cap octets) where the kernel will not (EXDEV, EINVAL, ENOSYS,
 * EOPNOTSUPP, or a short count). Returns 0, or -1 with errno set. */
static int copy_rest(int in, off_t off, int out, unsigned char *buf, size_t cap)
{
    struct stat st;
    int plain = 0;

    if (fstat(in, &st) < 0)
        return -1;
    while (off < st.st_size) {
        size_t want = (size_t)(st.st_size - off);
        ssize_t n;
        if (!plain) {
            n = copy_file_range(in, &off, out, NULL, want, 0);
            if (n > 0 || (n < 0 && errno == EINTR))
                continue;
            if (n < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS &&
                errno != EOPNOTSUPP)
                return -1;
            plain = 1;
            continue;
        }
        n = pread(in, buf, want < cap ? want : cap, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO; /* the file shrank under us */
            return -1;
        }
        if (write_all(out, buf, (size_t)n) < 0)
            return -1;
        off += n;
    }
    return 0;
}

/* Takes back what was made for the box (its file in tmp/ or new/). */
static void box_remove(const struct maildir_msg *m, struct maildir_box *b)
{
    if (b->made == 1)
        (void)unlinkat(b->tmp_fd, m->name, 0);
    else if (b->made == 2)
        (void)unlinkat(b->new_fd, m->name, 0);
    b->made = 0;
}

/* A box's failure: records errno, removes its file. */
static void box_fail(const struct maildir_msg *m, struct maildir_box *b)
{
    b->error = errno ? errno : EIO;
    box_remove(m, b);
}

/* Another box's copy of the written file (which is in the host's new/ already): a hard link
 * (MAILDIR_LINK), else or across file systems its own Delivered-To line and the rest of the
 * file, fsync'd and renamed into its new/. Returns 0, or -1 (box_fail done). */
static int make_copy(struct maildir_msg *m, struct maildir_box *b)
{
    const struct maildir_box *h = &m->boxes[m->host];
    int fd;

    if (box_open(b) < 0)
        goto fail;
    if (m->flags & MAILDIR_LINK) {
        if (linkat(h->new_fd, m->name, b->new_fd, m->name, 0) == 0) {
            b->made = 2;
            return 0;
        }
        if (errno != EXDEV && errno != EPERM && errno != EMLINK)
            goto fail;
    }
    if ((fd = openat(b->tmp_fd, m->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0)
        goto fail;
    b->made = 1;
    if (write_head(m, b, fd) < 0 ||
        copy_rest(m->fd, (m->flags & MAILDIR_LINK) ? 0 : m->head, fd, m->buf,
                  sizeof m->buf) < 0 ||
        fsync(fd) < 0) {
        int e = errno;
        (void)close(fd);
        errno = e;
        goto fail;
    }
    if ((close(fd) < 0 && errno != EINTR) ||
        renameat(b->tmp_fd, m->name, b->new_fd, m->name) < 0)
        goto fail;
    b->made = 2;
    return 0;
fail:
    box_fail(m, b);
    return -1;
}

/* Every box not yet failed gets error e (the shared file could not be made). */
static void fail_rest(struct maildir_msg *m, int e)
{
    for (size_t i = 0; i < m->nbox; i++) {
        struct maildir_box *b = &m->boxes[i];
        if (b->error == 0)
            b->error = e;
        box_remove(m, b);
    }
}

/* The written file, durable in the host box's new/ (its directory fsync'd with the others).
 * Returns 0, or -1 with errno set (the caller fails every box). */
static int commit_host(struct maildir_msg *m)
{
    struct maildir_box *h;

    if (m->pending_cr) { /* a CR that ended the content */
        m->pending_cr = 0;
        (void)put(m, (const unsigned char *)"\r", 1);
    }
    if (flush_buf(m) < 0) { /* also creates the file of a message that fit the buffer */
        errno = m->error;
        return -1;
    }
    h = &m->boxes[m->host];
    if (fsync(m->fd) < 0 || renameat(h->tmp_fd, m->name, h->new_fd, m->name) < 0)
        return -1;
    h->made = 2;
    return 0;
}

int maildir_msg_commit(struct maildir_msg *m)
{
    int first = 0;

    if (commit_host(m) < 0) {
        int e = errno;
        fail_rest(m, e);
        first = e;
    } else {
        for (size_t i = 0; i < m->nbox; i++) /* the other copies */
            if (i != m->host && m->boxes[i].error == 0)
                (void)make_copy(m, &m->boxes[i]);
        for (size_t i = 0; i < m->nbox; i++) { /* each new/ that gained a file, fsync'd */
            struct maildir_box *b = &m->boxes[i];
            if (b->made == 2 && fsync(b->new_fd) < 0)
                box_fail(m, b); /* not durable: taken back, the client will retry */
        }
    }
    if (m->fd >= 0)
        (void)close(m->fd);
    m->fd = -1;
    for (size_t i = 0; i < m->nbox && first == 0; i++)
        first = m->boxes[i].error;
    if (first != 0 && (m->flags & MAILDIR_ALL)) {
        /* one reply for all recipients: a retry must not find any copy already delivered */
        for (size_t i = 0; i < m->nbox; i++) {
            struct maildir_box *b = &m->boxes[i];
            int was_new = b->made == 2;
            box_remove(m, b);
            if (was_new)
                (void)fsync(b->new_fd);
            if (b->error == 0)
                b->error = first;
        }
    }
    free(m);
    if (first != 0) {
        errno = first;
        return -1;
    }
    return 0;
}

void maildir_msg_abort(struct maildir_msg *m)
{
    if (m == NULL)
        return;
    if (m->fd >= 0) { /* created: remove it */
        (void)close(m->fd);
        box_remove(m, &m->boxes[m->host]);
    }
    free(m);
}
