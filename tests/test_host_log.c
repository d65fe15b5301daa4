/*
 * test_host_log.c - unit tests of smtpe-server's log formatting (bindings/host/log.c): the
 * RFC 3339 timestamp, the text and JSON forms of one record (numbers, identifiers, words,
 * reserved keys, lists as arrays, UTF-8 kept and invalid octets as %XX), a JSON line cut at
 * 2 KiB that still closes its object, tokens and lists, and session ids.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

static char line[HOST_LOG_LINE_MAX + 1];

static const char *json(const char *record)
{
    (void)host_log_format(line, sizeof line, HOST_LOG_JSON, "2026-12-02T17:20:05.123Z", 42,
                          record);
    return line;
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ", and the same second as time(2) (or the next one). */
static void test_time(void **state)
{
    char t[25];
    struct tm tm;
    time_t before = time(NULL), got;
    int y, mo, d, h, mi, s, ms;
    char z;

    (void)state;
    host_log_time(t);
    assert_int_equal(strlen(t), 24);
    assert_int_equal(sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &s, &ms, &z),
                     8);
    assert_int_equal(z, 'Z');
    assert_true(t[4] == '-' && t[7] == '-' && t[10] == 'T' && t[13] == ':' && t[19] == '.');
    memset(&tm, 0, sizeof tm);
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = s;
    got = timegm(&tm);
    assert_true(got >= before && got <= time(NULL));
    assert_true(ms >= 0 && ms <= 999);
}

static void test_text(void **state)
{
    size_t len = host_log_format(line, sizeof line, HOST_LOG_TEXT, "2026-12-02T17:20:05.123Z",
                                 1234, "connect sid=0123456789ab peer=192.0.2.1:25");

    (void)state;
    assert_int_equal(len, strlen(line));
    assert_string_equal(line, "2026-12-02T17:20:05.123Z smtpe[1234]: connect sid=0123456789ab "
                              "peer=192.0.2.1:25\n");
    host_log_format(line, sizeof line, HOST_LOG_TEXT, NULL, 7, "stop status=0");
    assert_string_equal(line, "smtpe[7]: stop status=0\n");
}

static void test_json_fields(void **state)
{
    (void)state;
    assert_string_equal(json("disconnect sid=000000000123 peer=192.0.2.1:25 mail=2 in=0 ms=012 "
                             "id=123 end=quit"),
                        "{\"time\":\"2026-12-02T17:20:05.123Z\",\"pid\":42,\"event\":\"disconnect\","
                        "\"sid\":\"000000000123\",\"peer\":\"192.0.2.1:25\",\"mail\":2,\"in\":0,"
                        "\"ms\":\"012\",\"id\":\"123\",\"end\":\"quit\"}\n");
    /* words go to "msg"; a key of the object itself is prefixed with the event */
    assert_string_equal(json("worker 3 pid=77 started"),
                        "{\"time\":\"2026-12-02T17:20:05.123Z\",\"pid\":42,\"event\":\"worker\","
                        "\"worker_pid\":77,\"msg\":\"3 started\"}\n");
    host_log_format(line, sizeof line, HOST_LOG_JSON, NULL, 1, "listening on 127.0.0.1:25");
    assert_string_equal(line, "{\"pid\":1,\"event\":\"listening\",\"msg\":\"on 127.0.0.1:25\"}\n");
}

/* Valid UTF-8 as itself, invalid octets, controls and '%' as %XX, '"' and '\' escaped; lists
 * as arrays split at their commas (an escaped comma stays in its item). */
static void test_json_strings(void **state)
{
    (void)state;
    assert_string_equal(json("message from=<j%C3%B8rn@example.com> helo=a%FFb%25c%22d%5Ce%0D "
                             "rcpts=a@b,x%2Cy@z,%E2%82%AC@c"),
                        "{\"time\":\"2026-12-02T17:20:05.123Z\",\"pid\":42,\"event\":\"message\","
                        "\"from\":\"<j\xC3\xB8rn@example.com>\",\"helo\":\"a%FFb%25c\\\"d\\\\e%0D\","
                        "\"rcpts\":[\"a@b\",\"x,y@z\",\"\xE2\x82\xAC@c\"]}\n");
    /* overlong, surrogate and cut sequences are not UTF-8 */
    assert_string_equal(json("x v=%C0%80%ED%A0%80%E2%82"),
                        "{\"time\":\"2026-12-02T17:20:05.123Z\",\"pid\":42,\"event\":\"x\","
                        "\"v\":\"%C0%80%ED%A0%80%E2%82\"}\n");
    assert_string_equal(json("disconnect ids=-"),
                        "{\"time\":\"2026-12-02T17:20:05.123Z\",\"pid\":42,\"event\":\"disconnect\","
                        "\"ids\":[]}\n");
}

/* The quotes of a JSON line balance (outside escapes) and it ends as expected. */
static void assert_closed(const char *l, size_t len)
{
    int in = 0;

    assert_true(len <= HOST_LOG_LINE_MAX);
    assert_int_equal(strlen(l), len);
    for (size_t i = 0; i < len; i++) {
        if (in && l[i] == '\\')
            i++;
        else if (l[i] == '"')
            in = !in;
    }
    assert_false(in);
    assert_string_equal(l + len - 19, ",\"truncated\":true}\n");
}

/* A record longer than a line: the object is closed and says "truncated", whether the cut
 * falls in a string, in a list or between fields, and never inside a character. */
static void test_json_truncated(void **state)
{
    char rec[HOST_LOG_LINE_MAX];
    size_t len;
    int in_string = 0;

    (void)state;
    /* numeric fields grow in JSON (",\"k\":1" for "k=1 "): the cut falls in the UTF-8 string
     * after them, wherever it starts */
    for (size_t k = 292; k < 334; k++) {
        size_t n = (size_t)snprintf(rec, sizeof rec, "message ");
        const char *v;
        for (size_t i = 0; i < k; i++)
            n += (size_t)snprintf(rec + n, sizeof rec - n, "k=1 ");
        n += (size_t)snprintf(rec + n, sizeof rec - n, "from=<");
        while (n + 7 < sizeof rec - 1)
            n += (size_t)snprintf(rec + n, sizeof rec - n, "%%C3%%B8");
        rec[n] = '\0';
        len = host_log_format(line, sizeof line, HOST_LOG_JSON, NULL, 1, rec);
        assert_closed(line, len);
        if ((v = strstr(line, "\"from\":\"<")) == NULL)
            continue; /* cut before it */
        assert_int_equal((strstr(v, "\",\"truncated\"") - (v + 9)) % 2, 0); /* whole characters */
        in_string++;
    }
    assert_true(in_string > 30);
    for (size_t pad = 0; pad < 40; pad++) {
        size_t n = (size_t)snprintf(rec, sizeof rec, "message %*srcpts=a", (int)pad, "");
        while (n + 4 < sizeof rec - 1)
            n += (size_t)snprintf(rec + n, sizeof rec - n, ",b@c");
        rec[n] = '\0';
        len = host_log_format(line, sizeof line, HOST_LOG_JSON, NULL, 1, rec);
        assert_closed(line, len);
        assert_non_null(strstr(line, "],\"truncated\":true}\n"));
    }
    for (size_t pad = 0; pad < 40; pad++) {
        size_t n = (size_t)snprintf(rec, sizeof rec, "message %*s", (int)pad, "");
        while (n + 8 < sizeof rec - 1)
            n += (size_t)snprintf(rec + n, sizeof rec - n, "n=12345 ");
        rec[n] = '\0';
        len = host_log_format(line, sizeof line, HOST_LOG_JSON, NULL, 1, rec);
        assert_closed(line, len);
        assert_non_null(strstr(line, "5,\"truncated\":true}\n"));
    }
    /* text: cut, still one line */
    memset(rec, 'x', sizeof rec - 1);
    rec[sizeof rec - 1] = '\0';
    len = host_log_format(line, sizeof line, HOST_LOG_TEXT, NULL, 1, rec);
    assert_int_equal(len, HOST_LOG_LINE_MAX);
    assert_int_equal(line[len - 1], '\n');
}

static void test_tokens(void **state)
{
    char t[16], list[24];
    size_t len = 0;

    (void)state;
    assert_string_equal(host_log_token(t, sizeof t, "a b%\xC3\xB8", 6), "a%20b%25%C3%B8");
    assert_string_equal(host_log_token(t, 6, "a\xC3\xB8", 3), "a%C3"); /* never half a %XX */
    list[0] = '\0';
    assert_int_equal(host_log_list_add(list, sizeof list, &len, "a@b", 3), 0);
    assert_int_equal(host_log_list_add(list, sizeof list, &len, "\"x,y\"@z", 7), 0);
    assert_string_equal(list, "a@b,\"x%2Cy\"@z");
    assert_int_equal(len, strlen(list));
    assert_int_equal(host_log_list_add(list, sizeof list, &len, "0123456789", 10), -1);
    assert_string_equal(list, "a@b,\"x%2Cy\"@z"); /* unchanged */
    assert_int_equal(host_log_list_add(list, sizeof list, &len, "c", 1), 0);
    assert_string_equal(list, "a@b,\"x%2Cy\"@z,c");
}

static int cmp_ids(const void *a, const void *b)
{
    return memcmp(a, b, HOST_LOG_SID_LEN + 1);
}

/* 12 lower-case hex digits, no two alike among many. */
static void test_session_ids(void **state)
{
    enum { N = 100000 };
    char (*ids)[HOST_LOG_SID_LEN + 1] = malloc(N * sizeof *ids);

    (void)state;
    assert_non_null(ids);
    for (size_t i = 0; i < N; i++) {
        host_log_session_id(ids[i]);
        assert_int_equal(strspn(ids[i], "0123456789abcdef"), HOST_LOG_SID_LEN);
        assert_int_equal(ids[i][HOST_LOG_SID_LEN], '\0');
    }
    qsort(ids, N, sizeof *ids, cmp_ids);
    for (size_t i = 1; i < N; i++)
        assert_true(cmp_ids(ids[i - 1], ids[i]) != 0);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_time),          cmocka_unit_test(test_text),
        cmocka_unit_test(test_json_fields),   cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_json_truncated), cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_session_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
