/*
 * test_recipients.c - unit tests of smtpe-server's known-recipients table
 * (bindings/host/recipients.c, --recipients): the file's syntax (entries, comments, white
 * space, CRLF), errors naming FILE:LINE, a missing file, case-insensitive matching of domain
 * and local-part (ASCII only), catch-all domains, postmaster, duplicates, quoted local-parts
 * and address-literals; and the published source: a reload replaces the table, a bad file
 * keeps the old one, and lookups running on other threads during many reloads always find
 * what both tables hold (a table freed too early is cleared first, so they would not).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "recipients.h"

static char file_path[64];

static int setup(void **state)
{
    int fd;

    (void)state;
    snprintf(file_path, sizeof file_path, "/tmp/smtpe-test-rcpt-XXXXXX");
    fd = mkstemp(file_path);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(file_path);
    return 0;
}

/* Replaces the file's content by text[0..n). */
static void write_file_n(const char *text, size_t n)
{
    char tmp[80];
    FILE *f;

    snprintf(tmp, sizeof tmp, "%s.new", file_path);
    f = fopen(tmp, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, file_path), 0); /* as an editor or a deploy tool does */
}

static void write_file(const char *text)
{
    write_file_n(text, strlen(text));
}

static struct recipients *load(const char *text)
{
    char err[512] = "";
    struct recipients *t;

    write_file(text);
    t = recipients_load(file_path, err, sizeof err);
    if (t == NULL)
        fail_msg("load failed: %s", err);
    return t;
}

/* The error recipients_load gives for text (it must fail), in err. */
static void load_error(const char *text, size_t n, char *err, size_t cap)
{
    struct recipients *t;

    write_file_n(text, n);
    err[0] = '\0';
    t = recipients_load(file_path, err, cap);
    if (t != NULL) {
        recipients_free(t);
        fail_msg("loaded, but must fail: %s", text);
    }
    assert_true(strncmp(err, file_path, strlen(file_path)) == 0);
}

/* A forward-path as a RCPT event gives it: "postmaster" alone has the POSTMASTER flag. */
static smtpe_path path(const char *mailbox)
{
    smtpe_path p;
    const char *at = strrchr(mailbox, '@');

    memset(&p, 0, sizeof p);
    if (at == NULL) {
        p.local_part = (smtpe_span){(const uint8_t *)mailbox, strlen(mailbox)};
        p.flags = SMTPE_PATH_POSTMASTER;
        return p;
    }
    p.mailbox = (smtpe_span){(const uint8_t *)mailbox, strlen(mailbox)};
    p.local_part = (smtpe_span){(const uint8_t *)mailbox, (size_t)(at - mailbox)};
    p.domain = (smtpe_span){(const uint8_t *)at + 1, strlen(at + 1)};
    if (at[1] == '[')
        p.flags |= SMTPE_PATH_ADDR_LITERAL;
    if (mailbox[0] == '"')
        p.flags |= SMTPE_PATH_QUOTED;
    return p;
}

static int known(const struct recipients *t, const char *mailbox)
{
    smtpe_path p = path(mailbox);
    return recipients_known(t, &p);
}

static void test_mailboxes_and_catch_alls(void **state)
{
    struct recipients *t = load("alice@example.com\nbob@example.com\n@example.net\n");

    (void)state;
    assert_int_equal(recipients_mailboxes(t), 2);
    assert_int_equal(recipients_catch_alls(t), 1);
    assert_true(known(t, "alice@example.com"));
    assert_true(known(t, "bob@example.com"));
    assert_false(known(t, "carol@example.com"));
    assert_false(known(t, "alice@example.org"));
    assert_false(known(t, "alice@sub.example.com"));
    assert_true(known(t, "anyone@example.net"));
    assert_true(known(t, "x.y+tag@example.net"));
    assert_false(known(t, "anyone@sub.example.net")); /* a catch-all is one domain, exactly */
    assert_false(known(t, "anyone@net"));
    recipients_free(t);
}

static void test_comments_and_white_space(void **state)
{
    struct recipients *t = load("# the users of example.com\n"
                                "\n"
                                "   alice@example.com   \n"
                                "\tbob@example.com\t# Bob, since 2026\n"
                                "carol@example.com\r\n"
                                "a#b@example.com\n"          /* '#' is atext in a local-part */
                                "\"x #y\"@example.com\n"     /* and quoted */
                                "   # indented comment\n"
                                "#@example.org\n"
                                " \t \r\n"
                                "@example.net # all of it"); /* no final newline */

    (void)state;
    assert_int_equal(recipients_mailboxes(t), 5);
    assert_int_equal(recipients_catch_alls(t), 1);
    assert_true(known(t, "alice@example.com"));
    assert_true(known(t, "bob@example.com"));
    assert_true(known(t, "carol@example.com"));
    assert_true(known(t, "a#b@example.com"));
    assert_true(known(t, "\"x #y\"@example.com"));
    assert_false(known(t, "a@example.com"));
    assert_false(known(t, "u@example.org"));
    assert_true(known(t, "u@example.net"));
    recipients_free(t);
}

static void test_empty_file(void **state)
{
    struct recipients *t = load("# nobody yet\n\n");

    (void)state;
    assert_int_equal(recipients_mailboxes(t), 0);
    assert_int_equal(recipients_catch_alls(t), 0);
    assert_false(known(t, "u@example.com"));
    assert_false(known(t, "postmaster@example.com")); /* no domain named */
    assert_true(known(t, "postmaster"));
    recipients_free(t);
}

static void test_errors_name_the_line(void **state)
{
    static const char *bad[] = {
        "postmaster",          /* no domain: <postmaster> is always known anyway */
        "alice",
        "alice@",
        "@",
        "alice@@example.com",
        "alice bob@example.com",
        "alice@example.com bob@example.com",
        "<alice@example.com>",
        "alice@-example.com",
        "alice@example..com",
        ".alice@example.com",
        "alice@[192.0.2.300]",
        "@a.example:alice@example.com", /* a source route */
        "@@example.com",
        "\"unterminated@example.com",
        "alice@exa_mple.com",
        "j\xc3@example.com",   /* malformed UTF-8 */
    };
    char text[512], err[512], want[128];

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(text, sizeof text, "# header\nok@example.com\n\n%s\nlater@example.com\n",
                 bad[i]);
        load_error(text, strlen(text), err, sizeof err);
        snprintf(want, sizeof want, "%s:4: ", file_path);
        if (strncmp(err, want, strlen(want)) != 0)
            fail_msg("entry %s: error %s does not name line 4", bad[i], err);
    }
    /* a local-part over 64 octets, a domain over 255 */
    memset(text, 'a', 65);
    snprintf(text + 65, sizeof text - 65, "@example.com\n");
    load_error(text, strlen(text), err, sizeof err);
    assert_non_null(strstr(err, ":1: "));
    text[0] = '@';
    for (size_t i = 1; i < 300; i++)
        text[i] = i % 60 == 0 ? '.' : 'd';
    snprintf(text + 300, sizeof text - 300, ".com\n");
    load_error(text, strlen(text), err, sizeof err);
    assert_non_null(strstr(err, ":1: "));
    /* a NUL octet */
    load_error("ok@example.com\nal\0ice@example.com\n", 34, err, sizeof err);
    assert_non_null(strstr(err, ":2: NUL"));
}

static void test_missing_file(void **state)
{
    char err[512];

    (void)state;
    unlink(file_path);
    assert_null(recipients_load(file_path, err, sizeof err));
    assert_non_null(strstr(err, file_path));
    assert_non_null(strstr(err, "No such file or directory"));
    assert_null(recipients_source_new(file_path, err, sizeof err));
    assert_non_null(strstr(err, "No such file or directory"));
}

static void test_case_insensitive(void **state)
{
    struct recipients *t = load("Alice@Example.COM\n@EXAMPLE.net\nj\xc3\xb6s\xc3\xa9@example.com\n"
                                "U@[IPv6:2001:DB8::25]\n");

    (void)state;
    assert_true(known(t, "alice@example.com"));
    assert_true(known(t, "ALICE@EXAMPLE.COM"));
    assert_true(known(t, "aLiCe@eXaMpLe.CoM"));
    assert_true(known(t, "x@Example.Net"));
    /* UTF-8 octets as they are, ASCII letters around them folded */
    assert_true(known(t, "j\xc3\xb6s\xc3\xa9@example.com"));
    assert_true(known(t, "J\xc3\xb6S\xc3\xa9@EXAMPLE.COM"));
    assert_false(known(t, "J\xc3\x96S\xc3\x89@example.com")); /* JÖSÉ: other octets */
    assert_true(known(t, "u@[ipv6:2001:db8::25]"));
    recipients_free(t);
}

static void test_postmaster(void **state)
{
    struct recipients *t = load("alice@example.com\n@example.net\n");

    (void)state;
    assert_true(known(t, "postmaster"));
    assert_true(known(t, "PostMaster"));
    assert_true(known(t, "postmaster@example.com")); /* a domain of a mailbox entry */
    assert_true(known(t, "POSTMASTER@EXAMPLE.COM"));
    assert_true(known(t, "postmaster@example.net")); /* a catch-all's domain */
    assert_false(known(t, "postmaster@example.org")); /* not named */
    assert_false(known(t, "postmaster2@example.com"));
    assert_false(known(t, "postmaste@example.com"));
    recipients_free(t);
}

static void test_duplicates_quoted_and_literals(void **state)
{
    struct recipients *t = load("alice@example.com\nALICE@example.com\n@example.net\n"
                                "@Example.Net\n\"odd user\"@example.com\nroot@[192.0.2.1]\n");

    (void)state;
    assert_int_equal(recipients_mailboxes(t), 3);
    assert_int_equal(recipients_catch_alls(t), 1);
    assert_true(known(t, "\"odd user\"@example.com"));
    assert_false(known(t, "odd user@example.com"));
    assert_false(known(t, "\"alice\"@example.com")); /* compared as written, quotes kept */
    assert_true(known(t, "root@[192.0.2.1]"));
    assert_false(known(t, "root@[192.0.2.2]"));
    recipients_free(t);
}

static void test_many_entries(void **state)
{
    size_t n = 20000, len = 0;
    char *text = malloc(n * 32);
    struct recipients *t;
    char mb[64];

    (void)state;
    assert_non_null(text);
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(text + len, "user%zu@d%zu.example\n", i, i % 97);
    write_file_n(text, len);
    free(text);
    {
        char err[256];
        t = recipients_load(file_path, err, sizeof err);
        if (t == NULL)
            fail_msg("%s", err);
    }
    assert_int_equal(recipients_mailboxes(t), n);
    for (size_t i = 0; i < n; i++) {
        snprintf(mb, sizeof mb, "USER%zu@D%zu.example", i, i % 97);
        assert_true(known(t, mb));
        snprintf(mb, sizeof mb, "user%zu@d%zu.example", i, (i + 1) % 97);
        assert_false(known(t, mb));
    }
    recipients_free(t);
}

static void test_source_reload(void **state)
{
    struct recipients_source *src;
    char err[512];
    smtpe_path a = path("alice@example.com"), b = path("bob@example.com");
    size_t mb, ca;

    (void)state;
    write_file("alice@example.com\n");
    src = recipients_source_new(file_path, err, sizeof err);
    assert_non_null(src);
    assert_string_equal(recipients_source_path(src), file_path);
    assert_true(recipients_source_known(src, &a));
    assert_false(recipients_source_known(src, &b));
    write_file("bob@example.com\n@example.org\n");
    assert_int_equal(recipients_source_reload(src, err, sizeof err), 0);
    assert_false(recipients_source_known(src, &a));
    assert_true(recipients_source_known(src, &b));
    recipients_source_counts(src, &mb, &ca);
    assert_int_equal(mb, 1);
    assert_int_equal(ca, 1);
    /* a bad file: an error naming the line, and the table stays */
    write_file("alice@example.com\nnot an address\n");
    assert_int_equal(recipients_source_reload(src, err, sizeof err), -1);
    assert_non_null(strstr(err, ":2: "));
    assert_false(recipients_source_known(src, &a));
    assert_true(recipients_source_known(src, &b));
    /* so does a missing one */
    unlink(file_path);
    assert_int_equal(recipients_source_reload(src, err, sizeof err), -1);
    assert_non_null(strstr(err, "No such file"));
    assert_true(recipients_source_known(src, &b));
    recipients_source_free(src);
}

struct reader {
    struct recipients_source *src;
    atomic_int *stop;
    unsigned long lookups, wrong, saw_a, saw_b;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    smtpe_path common = path("common@example.com"), a = path("a@example.com"),
               b = path("b@example.com"), none = path("none@example.com");

    while (!atomic_load(r->stop)) {
        int ka, kb;
        if (!recipients_source_known(r->src, &common))
            r->wrong++;
        if (recipients_source_known(r->src, &none))
            r->wrong++;
        ka = recipients_source_known(r->src, &a);
        kb = recipients_source_known(r->src, &b);
        r->saw_a += (unsigned long)ka;
        r->saw_b += (unsigned long)kb;
        r->lookups += 4;
    }
    return NULL;
}

/* Lookups on three threads while the main thread reloads 300 times between two files: every
 * lookup of what both hold succeeds (a table freed under a reader is cleared first), and the
 * readers see both tables. */
static void test_reload_under_concurrent_lookups(void **state)
{
    struct recipients_source *src;
    struct reader r[3];
    pthread_t th[3];
    atomic_int stop;
    char err[512];
    char file_a[4096], file_b[4096];
    size_t la = 0, lb = 0;

    (void)state;
    /* enough entries that a load takes a moment and a freed table is a real block */
    for (int i = 0; i < 100; i++) {
        la += (size_t)snprintf(file_a + la, sizeof file_a - la, "fa%d@example.com\n", i);
        lb += (size_t)snprintf(file_b + lb, sizeof file_b - lb, "fb%d@example.com\n", i);
    }
    snprintf(file_a + la, sizeof file_a - la, "common@example.com\na@example.com\n");
    snprintf(file_b + lb, sizeof file_b - lb, "common@example.com\nb@example.com\n");
    write_file(file_a);
    src = recipients_source_new(file_path, err, sizeof err);
    assert_non_null(src);
    atomic_init(&stop, 0);
    for (int i = 0; i < 3; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].src = src;
        r[i].stop = &stop;
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &r[i]), 0);
    }
    for (int k = 0; k < 300; k++) {
        write_file(k % 2 ? file_a : file_b);
        assert_int_equal(recipients_source_reload(src, err, sizeof err), 0);
        if (k % 50 == 0)
            usleep(1000); /* let the readers run on each table */
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(r[i].lookups > 0);
        if (r[i].wrong != 0)
            fail_msg("reader %d: %lu wrong answers in %lu lookups", i, r[i].wrong,
                     r[i].lookups);
    }
    assert_true(r[0].saw_a + r[1].saw_a + r[2].saw_a > 0);
    assert_true(r[0].saw_b + r[1].saw_b + r[2].saw_b > 0);
    recipients_source_free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mailboxes_and_catch_alls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_comments_and_white_space, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_name_the_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_case_insensitive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_postmaster, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicates_quoted_and_literals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reload_under_concurrent_lookups, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
