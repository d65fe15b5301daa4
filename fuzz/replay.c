/*
 * replay.c - runs a fuzz target's LLVMFuzzerTestOneInput over saved inputs, without libFuzzer,
 * so that every target also builds with gcc or clang in the normal CMake build and ctest
 * replays fuzz/regress/TARGET/ and fuzz/corpus/TARGET/ on every run (fuzz/CMakeLists.txt).
 *
 *   fuzz-replay-TARGET [-q] PATH...
 *
 * Each PATH is a file (replayed) or a directory (each regular file in it whose name does not
 * start with '.', in strcmp order; subdirectories are not entered). Every input is copied to a
 * heap block of exactly its size (as libFuzzer does), so that ASan sees a read past its end; an
 * empty input is passed as a non-NULL pointer with size 0.
 *
 * The oracles of the targets (FUZZ_CHECK in fuzz_util.h) print what was violated and call
 * abort(); sanitizers end the process with their report. Either way the process dies with the
 * name of the input printed ("replay: FAILED on PATH"), so ctest fails and says which input.
 * A target may also return non-zero, which libFuzzer does not allow (values other than 0 and
 * -1 are reserved); it is counted as a failure too.
 *
 * Exit status: 0 when every input ran and at least one did, 1 when a target returned non-zero,
 * 2 for a usage error, an unreadable path or no input at all (a replay of nothing proves
 * nothing). -q prints only the summary line instead of one line per input.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Sanitizer runtimes call this hook before they end the process (ASan, UBSan without
 * recovery); without a sanitizer the weak reference is NULL. */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static const char *current; /* the input being run, for the death message */

static void say_failed(void)
{
    /* async-signal-safe: write(2) only */
    static const char pre[] = "\nreplay: FAILED on ";
    if (!current)
        return;
    ssize_t w = write(2, pre, sizeof pre - 1);
    w = write(2, current, strlen(current));
    w = write(2, "\n", 1);
    (void)w;
}

static void on_abort(int sig)
{
    say_failed();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Reads path into an exact-size heap block (*data, *size). Returns 0, or -1 with errno. */
static int read_file(const char *path, uint8_t **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            uint8_t *q = realloc(buf, cap *= 2);
            if (!q) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = q;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        errno = EIO;
        return -1;
    }
    /* exactly n octets (one for an empty input, which is passed with size 0) */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    *data = exact;
    *size = n;
    return 0;
}

typedef struct tally {
    size_t inputs, octets, failures;
    int quiet;
} tally;

static int run_file(const char *path, tally *t)
{
    uint8_t *data = NULL;
    size_t size = 0;
    if (read_file(path, &data, &size) != 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!t->quiet) {
        printf("replay %s (%zu octets)\n", path, size);
        fflush(stdout);
    }
    current = path;
    int rc = LLVMFuzzerTestOneInput(data, size);
    current = NULL;
    free(data);
    t->inputs++;
    t->octets += size;
    if (rc != 0) {
        fprintf(stderr, "replay: %s: the target returned %d\n", path, rc);
        t->failures++;
    }
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays the regular files of dir in name order. Returns 0, or -1 after a message. */
static int run_dir(const char *dir, tally *t)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **q = realloc(names, cap * sizeof *names);
            if (!q)
                abort();
            names = q;
        }
        size_t len = strlen(dir) + 1 + strlen(e->d_name) + 1;
        if (!(names[n] = malloc(len)))
            abort();
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, by_name);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
            rc = run_file(names[i], t);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    tally t = {0, 0, 0, 0};
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "-q") == 0) {
        t.quiet = 1;
        first = 2;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: %s [-q] FILE-OR-DIRECTORY...\n", argv[0]);
        return 2;
    }
    signal(SIGABRT, on_abort);
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(say_failed);
    for (int i = first; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 2;
        }
        int rc = S_ISDIR(st.st_mode) ? run_dir(argv[i], &t) : run_file(argv[i], &t);
        if (rc != 0)
            return 2;
    }
    printf("replay: %zu inputs (%zu octets), %zu failures\n", t.inputs, t.octets, t.failures);
    if (t.inputs == 0) {
        fprintf(stderr, "replay: no input in the paths given\n");
        return 2;
    }
    return t.failures ? 1 : 0;
}
