/*
 * test_transcripts.c - runs every .txt file in tests/transcripts (format: transcripts/README.md)
 * through the server engine three times: the client octets fed whole, one octet at a time, and in
 * pseudo-random pieces (a fixed seed per file). Each run must meet every expectation of the file,
 * and the bytewise and random runs must give exactly the output octets and events of the whole
 * run (TLS lines finish a handshake at the same point of the client stream in every mode, so
 * the STARTTLS and BDAT boundaries are split like any other octets). Usage:
 * test_transcripts [transcript-dir]   (default: SMTPE_TRANSCRIPT_DIR)
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#ifndef SMTPE_TRANSCRIPT_DIR
#define SMTPE_TRANSCRIPT_DIR "tests/transcripts"
#endif

typedef struct tfile {
    char *path;
    hs_script sc;
    int loaded;
    hs_buf load_err;
    int whole_ok;
    hs_buf whole_out;
    hs_log whole_log;
} tfile;

typedef struct tcase {
    tfile *f;
    int mode;
    char name[320];
} tcase;

static void print_log(const char *label, const hs_log *log)
{
    hs_buf b = {0};
    fprintf(stderr, "  %s events:\n", label);
    for (size_t i = 0; i < log->n; i++) {
        hs_buf_reset(&b);
        hs_escape(&b, log->items[i].p, log->items[i].len);
        fprintf(stderr, "    E: %s\n", hs_buf_cstr(&b));
    }
    hs_buf_free(&b);
}

static void print_out(const char *label, const hs_buf *out)
{
    hs_buf b = {0};
    hs_escape(&b, out->p, out->len);
    fprintf(stderr, "  %s output: \"%s\"\n", label, hs_buf_cstr(&b));
    hs_buf_free(&b);
}

static void run_transcript(void **state)
{
    tcase *c = *state;
    tfile *f = c->f;
    if (!f->loaded)
        fail_msg("%s", hs_buf_cstr(&f->load_err));
    hs_buf out = {0}, report = {0};
    hs_log log = {0};
    uint64_t seed = hs_hash(f->sc.name);
    int rc = hs_script_run(&f->sc, c->mode, seed, &out, &log, &report);
    if (rc != 0) {
        print_out("actual", &out);
        if (f->sc.has_events)
            print_log("actual", &log);
        fprintf(stderr, "%s", hs_buf_cstr(&report));
        hs_buf_free(&out);
        hs_log_free(&log);
        hs_buf_free(&report);
        fail_msg("transcript %s failed when fed %s (see above)", f->path, hs_mode_name(c->mode));
    }
    if (c->mode == HS_WHOLE) {
        f->whole_ok = 1;
        f->whole_out = out;
        f->whole_log = log;
        hs_buf_free(&report);
        return;
    }
    int differs = 0;
    if (f->whole_ok) {
        if (out.len != f->whole_out.len || !hs_memeq(out.p, f->whole_out.p, out.len)) {
            print_out("whole", &f->whole_out);
            print_out(hs_mode_name(c->mode), &out);
            differs = 1;
        }
        if (!hs_log_equal(&log, &f->whole_log)) {
            print_log("whole", &f->whole_log);
            print_log(hs_mode_name(c->mode), &log);
            differs = 1;
        }
    }
    hs_buf_free(&out);
    hs_log_free(&log);
    hs_buf_free(&report);
    if (differs)
        fail_msg("%s: fed %s, the output or events differ from the whole run", f->path,
                 hs_mode_name(c->mode));
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The conformance cases of shared/conformance/cases.md that the engine reaches must each have
 * a transcript. */
static char **g_names;
static size_t g_count;

static void required_cases_present(void **state)
{
    (void)state;
    static const char *required[] = {"k01-", "k02-", "k03-", "k04-", "k05-", "k06-",
                                     "k07-", "k08-", "k09-", "k10-", "k11-", "k12-",
                                     "k13-", "k14-", "k15-", "k16-", "k18-", "k19-",
                                     "k20-", "k21-", "k22-"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        int found = 0;
        for (size_t k = 0; k < g_count && !found; k++)
            found = strncmp(g_names[k], required[i], strlen(required[i])) == 0;
        if (!found)
            fail_msg("no transcript %s*.txt", required[i]);
    }
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : SMTPE_TRANSCRIPT_DIR;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "test_transcripts: cannot open %s\n", dir);
        return 1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".txt") != 0 || e->d_name[0] == '.')
            continue;
        g_names = realloc(g_names, (g_count + 1) * sizeof *g_names);
        g_names[g_count] = malloc(l + 1);
        memcpy(g_names[g_count], e->d_name, l + 1);
        g_count++;
    }
    closedir(d);
    if (g_count == 0) {
        fprintf(stderr, "test_transcripts: no *.txt files in %s\n", dir);
        return 1;
    }
    qsort(g_names, g_count, sizeof *g_names, cmp_names);

    tfile *files = calloc(g_count, sizeof *files);
    tcase *cases = calloc(g_count * 3, sizeof *cases);
    struct CMUnitTest *tests = calloc(g_count * 3 + 1, sizeof *tests);
    if (!files || !cases || !tests)
        return 1;
    size_t nt = 0;
    tests[nt].name = "required conformance transcripts present";
    tests[nt].test_func = required_cases_present;
    nt++;
    for (size_t i = 0; i < g_count; i++) {
        tfile *f = &files[i];
        f->path = malloc(strlen(dir) + strlen(g_names[i]) + 2);
        sprintf(f->path, "%s/%s", dir, g_names[i]);
        f->loaded = hs_script_load(&f->sc, f->path, &f->load_err) == 0;
        static const int modes[3] = {HS_WHOLE, HS_BYTEWISE, HS_RANDOM};
        for (int m = 0; m < 3; m++) {
            tcase *c = &cases[i * 3 + (size_t)m];
            c->f = f;
            c->mode = modes[m];
            snprintf(c->name, sizeof c->name, "%s [%s]", g_names[i], hs_mode_name(modes[m]));
            tests[nt].name = c->name;
            tests[nt].test_func = run_transcript;
            tests[nt].initial_state = c;
            nt++;
        }
    }
    int failed = _cmocka_run_group_tests("transcripts", tests, nt, NULL, NULL);
    for (size_t i = 0; i < g_count; i++) {
        hs_script_free(&files[i].sc);
        hs_buf_free(&files[i].load_err);
        hs_buf_free(&files[i].whole_out);
        hs_log_free(&files[i].whole_log);
        free(files[i].path);
        free(g_names[i]);
    }
    free(g_names);
    free(files);
    free(cases);
    free(tests);
    return failed;
}
