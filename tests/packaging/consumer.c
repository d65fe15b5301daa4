/*
 * consumer.c - a program that uses smtpe the way an embedder does, built by
 * tests/packaging/run.sh against each way smtpe is delivered: the installed shared and static
 * libraries through pkg-config and through find_package(smtpe), the source tree through
 * add_subdirectory / FetchContent, and the amalgamated smtpe.c on its own.
 *
 * It runs one SMTP session in memory through the public API (EHLO, MAIL, RCPT, DATA with a
 * short message, QUIT), gives the default positive verdict to every event that needs one,
 * collects the replies, and checks that they hold 220, 250, 354, 250 and 221 in that order.
 * Exits 0 on success, 1 (with the replies on stderr) on failure. Standard C11 only: it
 * includes "smtpe.h" and nothing that is not ISO C.
 */
#include "smtpe.h"

#include <stdio.h>
#include <string.h>

static const char input[] = "EHLO x\r\n"
                            "MAIL FROM:<a@b>\r\n"
                            "RCPT TO:<c@d>\r\n"
                            "DATA\r\n"
                            "Subject: packaging\r\n"
                            "\r\n"
                            "Hello from consumer.c\r\n"
                            "..a stuffed dot\r\n"
                            ".\r\n"
                            "QUIT\r\n";

static char out[8192];
static size_t out_len;
static size_t content_len;

static int fail(const char *what, int err)
{
    fprintf(stderr, "consumer: %s", what);
    if (err != 0)
        fprintf(stderr, ": %s (%d)", smtpe_strerror(err), err);
    fprintf(stderr, "\nconsumer: replies so far:\n%.*s\n", (int)out_len, out);
    return 1;
}

/* Takes every pending event; accepts those that wait for a verdict. Returns 0 or an error. */
static int take_events(smtpe_server *s, int *progress)
{
    smtpe_event ev;

    while (smtpe_server_next_event(s, &ev) == 1) {
        *progress = 1;
        if (ev.type == SMTPE_EV_DATA_CHUNK)
            content_len += ev.chunk.len;
        if (smtpe_event_needs_reply(&ev)) {
            int rc = smtpe_server_accept(s);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* Appends the queued output to out[] and acknowledges it. Returns 0 or an error. */
static int take_output(smtpe_server *s, int *progress)
{
    size_t len;
    const uint8_t *p = smtpe_server_send_buf(s, &len);

    while (len > 0) {
        if (len > sizeof out - out_len)
            return SMTPE_ERR_BUFFER_TOO_SMALL;
        memcpy(out + out_len, p, len);
        out_len += len;
        *progress = 1;
        int rc = smtpe_server_send_ack(s, len);
        if (rc != 0)
            return rc;
        p = smtpe_server_send_buf(s, &len);
    }
    return 0;
}

/* 1 if the reply codes appear in out[] in this order, each at the start of a reply line. */
static int replies_in_order(const char *const *codes, size_t count)
{
    size_t at = 0, i = 0;

    while (i < count && at < out_len) {
        size_t eol = at;
        while (eol < out_len && out[eol] != '\n')
            eol++;
        if (eol - at >= 4 && memcmp(out + at, codes[i], 3) == 0 && out[at + 3] == ' ')
            i++;
        at = eol + 1;
    }
    return i == count;
}

int main(void)
{
    static const char *const codes[] = {"220", "250", "354", "250", "221"};
    const size_t n = sizeof input - 1;
    smtpe_server_config cfg;
    smtpe_server *s;
    size_t fed = 0;
    int idle = 0, rc;

    smtpe_server_config_init(&cfg);
    cfg.hostname = "packaging.example";
    rc = smtpe_server_new(&s, &cfg, NULL, 0);
    if (rc != 0)
        return fail("smtpe_server_new", rc);
    for (int round = 0; round < 1000 && idle < 2; round++) {
        int progress = 0;
        if ((rc = take_events(s, &progress)) != 0 || (rc = take_output(s, &progress)) != 0)
            break;
        unsigned want = smtpe_server_want(s);
        if (want & SMTPE_WANT_CLOSE)
            break;
        if (fed < n && (want & SMTPE_WANT_READ)) {
            /* the input lives as long as the program: DATA_CHUNK spans stay valid */
            long long used = (long long)smtpe_server_recv(s, (const uint8_t *)input + fed,
                                                         n - fed, (uint64_t)round);
            if (used < 0) {
                rc = (int)used;
                break;
            }
            fed += (size_t)used;
            progress |= used > 0;
        }
        idle = progress ? 0 : idle + 1;
    }
    unsigned want = smtpe_server_want(s);
    smtpe_server_free(s);
    if (rc != 0)
        return fail("session", rc);
    if (!(want & SMTPE_WANT_CLOSE) || fed != n)
        return fail("the session did not end after QUIT with all input consumed", 0);
    if (!replies_in_order(codes, sizeof codes / sizeof codes[0]))
        return fail("the replies are not 220, 250, 354, 250, 221 in that order", 0);
    /* "Subject: packaging\r\n\r\nHello from consumer.c\r\n.a stuffed dot\r\n" */
    if (content_len != 20 + 2 + 23 + 16)
        return fail("the message content is not the one sent (dot-unstuffed)", 0);
    printf("consumer: ok (%zu octets of replies, %zu of content)\n", out_len, content_len);
    return 0;
}
