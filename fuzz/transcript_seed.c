/*
 * transcript_seed.c - turns a transcript test (a .txt file of tests/transcripts/, format in
 * tests/transcripts/README.md) into seed inputs for the fuzz targets. fuzz/run.sh builds it and
 * seeds the working corpora with every transcript.
 *
 *   transcript_seed session FILE.txt OUT   a fuzz_session input: the 16-octet header made from
 *                                          the file's @settings, then what the client sends
 *   transcript_seed command FILE.txt OUT   a fuzz_command input: policy, defaults, client octets
 *
 * Only the settings, the client lines (C:, B:) and a TLS line before anything else (implicit
 * TLS) are used; the host decisions of a session seed come from the header's seed, so they are
 * not the file's H: verdicts, and a STARTTLS handshake comes where those decisions put it.
 * @auth_mechanisms picks the nearest of the session target's lists ("PLAIN LOGIN", "PLAIN
 * LOGIN XOAUTH2", "X-TOKEN LOGIN CRAM-MD5 PLAIN").
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned hex(int c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 32) - 'a' + 10);
}

/* Appends the C-escaped text s (\r \n \t \0 \\ \" \xHH) to out. */
static size_t unescape(const char *s, uint8_t *out)
{
    size_t n = 0;
    for (; *s; s++) {
        if (*s != '\\' || !s[1]) {
            out[n++] = (uint8_t)*s;
            continue;
        }
        s++;
        switch (*s) {
        case 'r': out[n++] = '\r'; break;
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case '0': out[n++] = 0; break;
        case 'x':
            if (s[1] && s[2]) {
                out[n++] = (uint8_t)(hex(s[1]) << 4 | hex(s[2]));
                s += 2;
            }
            break;
        default: out[n++] = (uint8_t)*s; break; /* \\ \" \* */
        }
    }
    return n;
}

static unsigned closest(unsigned long v, const unsigned long *list, unsigned n)
{
    unsigned best = 0;
    for (unsigned i = 1; i < n; i++) {
        unsigned long d = v > list[i] ? v - list[i] : list[i] - v;
        unsigned long bd = v > list[best] ? v - list[best] : list[best] - v;
        if (d < bd)
            best = i;
    }
    return best;
}

/* SMTPE_EXT_* in bit order: bits 0-7 go to header octet 5, bits 8-13 to bits 0-5 of octet 15 */
static unsigned extensions(const char *arg, unsigned mask)
{
    static const char *names[] = {"PIPELINING", "SIZE", "8BITMIME", "SMTPUTF8",
                                  "ENHANCEDSTATUSCODES", "STARTTLS", "CHUNKING", "BINARYMIME",
                                  "DSN", "REQUIRETLS", "MT-PRIORITY", "DELIVERBY", "XCLIENT",
                                  "XFORWARD"};
    const unsigned nnames = sizeof names / sizeof names[0];
    char buf[512];
    snprintf(buf, sizeof buf, "%s", arg);
    for (char *t = strtok(buf, " \t"); t; t = strtok(NULL, " \t")) {
        if (!strcmp(t, "none")) {
            mask = 0;
            continue;
        }
        if (!strcmp(t, "default")) {
            mask = 0x1f;
            continue;
        }
        int sign = *t == '-' ? -1 : 1;
        if (*t == '+' || *t == '-')
            t++;
        for (unsigned i = 0; i < nnames; i++)
            if (!strcmp(t, names[i]))
                mask = sign > 0 ? mask | 1u << i : mask & ~(1u << i);
    }
    return mask;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "session") && strcmp(argv[1], "command"))) {
        fprintf(stderr, "usage: transcript_seed session|command FILE.txt OUT\n");
        return 2;
    }
    FILE *in = fopen(argv[2], "r");
    if (!in) {
        perror(argv[2]);
        return 1;
    }
    static const unsigned long rbuf[] = {2048, 2100, 3000, 4096, 65536};
    static const unsigned long lmax[] = {512, 513, 600, 1000, 4096};
    uint8_t h[16] = {0, 0, 0, 128, 128, 0x1f, 3, 0};
    unsigned ext = 0x1f;
    int actions = 0; /* a non-setting line was seen */
    static uint8_t client[1 << 20];
    size_t n = 0;
    static char line[1 << 16];
    uint32_t seed = 2166136261u;
    for (const char *p = argv[2]; *p; p++)
        seed = (seed ^ (uint8_t)*p) * 16777619u;
    while (fgets(line, sizeof line, in)) {
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r'))
            line[--l] = 0;
        if (line[0] == '@') {
            char *arg = strchr(line, ' ');
            arg = arg ? arg + 1 : line + l;
            unsigned long v = strtoul(arg, NULL, 10);
            if (!strncmp(line, "@line_ending", 12))
                h[0] = arg[0] == 'n' ? 1 : arg[0] == 'k' ? 2 : 0;
            else if (!strncmp(line, "@lax_angle_brackets", 19))
                h[1] |= v ? 1 : 0;
            else if (!strncmp(line, "@ehlo_extra", 11))
                h[1] |= 2;
            else if (!strncmp(line, "@greeting_text", 14))
                h[1] |= 8;
            else if (!strncmp(line, "@max_message_size", 17))
                h[2] = v == 0 ? 32 : v <= 1529 ? (uint8_t)(64 + (v - 1) / 8) : 0;
            else if (!strncmp(line, "@max_recipients", 15))
                h[3] = v >= 1 && v <= 4 ? (uint8_t)(v - 1) : v >= 192 && v <= 255 ? (uint8_t)v : 128;
            else if (!strncmp(line, "@max_errors", 11))
                h[4] = v <= 5 ? (uint8_t)v : 128;
            else if (!strncmp(line, "@extensions", 11))
                ext = extensions(arg, ext);
            else if (!strncmp(line, "@auth_mechanisms", 16))
                /* the target's lists: "PLAIN LOGIN", "PLAIN LOGIN XOAUTH2", others */
                h[15] = (uint8_t)((h[15] & 0x3f) |
                                  (strstr(arg, "XOAUTH2")                                ? 2u
                                   : strspn(arg, "PLAINLOG ") == strlen(arg) && arg[0] ? 1u
                                                                                       : 3u)
                                      << 6);
            else if (!strncmp(line, "@auth_without_tls", 17))
                h[14] |= v ? 0x04 : 0;
            else if (!strncmp(line, "@require_tls", 12))
                h[14] |= v ? 0x08 : 0;
            else if (!strncmp(line, "@lmtp", 5))
                h[14] |= v ? 0x10 : 0;
            else if (!strncmp(line, "@proxy_protocol", 15))
                h[14] |= v ? 0x20 : 0;
            else if (!strncmp(line, "@trusted", 8))
                h[1] |= v ? 0x40 : 0;
            else if (!strncmp(line, "@reply_buffer_size", 18))
                h[6] = (uint8_t)closest(v, rbuf, 5);
            else if (!strncmp(line, "@max_line_length", 16))
                h[7] = (uint8_t)closest(v, lmax, 5);
            else if (!strncmp(line, "@command_timeout", 16) || !strncmp(line, "@data_timeout", 13))
                h[1] = (uint8_t)((h[1] & ~0x30) | (v == 0 ? 0x10 : v <= 1000 ? 0x20 : 0));
            continue;
        }
        if (line[0] && line[0] != '#') {
            /* "TLS" before anything else (before the greeting is sent): implicit TLS */
            if (!actions && !strcmp(line, "TLS"))
                h[1] |= 0x80;
            actions = 1;
        }
        if ((line[0] == 'C' || line[0] == 'B') && line[1] == ':') {
            if (n + 2 * l + 2 > sizeof client)
                break;
            n += unescape(line[2] == ' ' ? line + 3 : line + 2, client + n);
            if (line[0] == 'C') {
                client[n++] = '\r';
                client[n++] = '\n';
            }
        }
    }
    fclose(in);
    h[5] = (uint8_t)ext;
    h[15] = (uint8_t)((h[15] & 0xc0) | ((ext >> 8) & 0x3f));
    h[10] = (uint8_t)seed;
    h[11] = (uint8_t)(seed >> 8);
    h[12] = (uint8_t)(seed >> 16);
    h[13] = (uint8_t)(seed >> 24);
    FILE *out = fopen(argv[3], "wb");
    if (!out) {
        perror(argv[3]);
        return 1;
    }
    if (!strcmp(argv[1], "session"))
        fwrite(h, 1, sizeof h, out);
    else
        fwrite((uint8_t[3]){h[0], 0, 0}, 1, 3, out);
    fwrite(client, 1, n, out);
    return fclose(out) ? 1 : 0;
}
