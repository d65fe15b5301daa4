/*
 * smtpe-bench-fsync: a reference rate for durable delivery on this disk. T threads each store
 * M files the way smtpe-server's Maildir delivery does (create tmp/NAME exclusively, write S
 * octets, fsync, close, rename into new/, fsync new/), with no SMTP at all, and it prints the
 * files per second: what the file system and the disk cost by themselves, for comparison with
 * the --maildir rows of the benchmark (run.sh prints it beside them). On a shared machine it
 * drifts as much as they do, so it is measured before and after the matrix.
 *
 *   smtpe-bench-fsync DIR [--threads T] [--files M] [--size S]
 *
 * DIR is created (with tmp/ and new/) and emptied of what this run wrote afterwards. One line
 * of JSON on stdout: {"files":N,"threads":T,"size":S,"seconds":X,"files_per_s":R}.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct run {
    int tmp_fd, new_fd;
    unsigned files, size, id;
    const char *buf;
    int failed;
};

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *store(void *arg)
{
    struct run *r = arg;
    char name[64];

    for (unsigned i = 0; i < r->files && !r->failed; i++) {
        int fd;
        snprintf(name, sizeof name, "f.%u.%u", r->id, i);
        fd = openat(r->tmp_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, r->buf, r->size) != (ssize_t)r->size || fsync(fd) < 0 ||
            close(fd) < 0 || renameat(r->tmp_fd, name, r->new_fd, name) < 0 ||
            fsync(r->new_fd) < 0) {
            perror("smtpe-bench-fsync");
            r->failed = 1;
        }
    }
    return NULL;
}

static void cleanup(int new_fd, unsigned threads, unsigned files)
{
    char name[64];

    for (unsigned t = 0; t < threads; t++)
        for (unsigned i = 0; i < files; i++) {
            snprintf(name, sizeof name, "f.%u.%u", t, i);
            (void)unlinkat(new_fd, name, 0);
        }
}

int main(int argc, char **argv)
{
    unsigned threads = 4, files = 2000, size = 4300;
    const char *dir = NULL;
    struct run *runs;
    pthread_t *tids;
    char *buf;
    int root, tmp_fd, new_fd, failed = 0;
    double t0, t1;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--files") == 0 && i + 1 < argc)
            files = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (argv[i][0] != '-' && dir == NULL)
            dir = argv[i];
        else {
            fprintf(stderr, "usage: smtpe-bench-fsync DIR [--threads T] [--files M] "
                            "[--size S]\n");
            return 2;
        }
    }
    if (dir == NULL || threads == 0 || threads > 1024 || files == 0 || size == 0) {
        fprintf(stderr, "usage: smtpe-bench-fsync DIR [--threads T] [--files M] [--size S]\n");
        return 2;
    }
    if ((mkdir(dir, 0700) < 0 && errno != EEXIST) ||
        (root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        (mkdirat(root, "tmp", 0700) < 0 && errno != EEXIST) ||
        (mkdirat(root, "new", 0700) < 0 && errno != EEXIST) ||
        (tmp_fd = openat(root, "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
        (new_fd = openat(root, "new", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        perror(dir);
        return 2;
    }
    buf = malloc(size);
    runs = calloc(threads, sizeof *runs);
    tids = calloc(threads, sizeof *tids);
    if (buf == NULL || runs == NULL || tids == NULL) {
        fprintf(stderr, "smtpe-bench-fsync: out of memory\n");
        return 2;
    }
    for (unsigned i = 0; i < size; i++)
        buf[i] = (i % 78 == 77) ? '\n' : (char)('a' + i % 26);
    t0 = now_s();
    for (unsigned t = 0; t < threads; t++) {
        runs[t] = (struct run){tmp_fd, new_fd, files, size, t, buf, 0};
        if (pthread_create(&tids[t], NULL, store, &runs[t]) != 0) {
            fprintf(stderr, "smtpe-bench-fsync: pthread_create failed\n");
            return 2;
        }
    }
    for (unsigned t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        failed |= runs[t].failed;
    }
    t1 = now_s();
    cleanup(new_fd, threads, files);
    if (failed)
        return 1;
    printf("{\"files\":%u,\"threads\":%u,\"size\":%u,\"seconds\":%.3f,\"files_per_s\":%.1f}\n",
           threads * files, threads, size, t1 - t0, (double)threads * files / (t1 - t0));
    free(buf);
    free(runs);
    free(tids);
    return 0;
}
