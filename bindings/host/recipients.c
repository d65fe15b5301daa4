/*
 * recipients.c - the known-recipients table and its lock-free replacement (see recipients.h).
 *
 * A table is one open-addressing hash set (FNV-1a, linear probing, at most half full) of keys
 * folded to ASCII lower case, their octets in one arena: "local@domain" for a mailbox,
 * "@domain" for a catch-all, and "domain" for every domain the file names (what postmaster@
 * is accepted for). The three kinds never collide: a mailbox key has octets before its '@', a
 * domain key has no '@' at all.
 */
#include "recipients.h"

#include <errno.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest key: a local-part of 64 octets, '@' and a domain of 255 (RFC 5321 §4.5.3.1); the
 * engine refuses longer paths, and a key that would be longer is never found. */
#define KEY_MAX (64 + 1 + 255)

struct slot {
    uint32_t off;  /* key octets at arena + off */
    uint32_t len;  /* 0: empty slot */
    uint32_t hash;
};

struct recipients {
    char *arena;
    size_t arena_len, arena_cap;
    struct slot *slots;
    size_t nslots; /* a power of two */
    size_t used;
    size_t mailboxes, catch_alls;
};

static uint32_t fnv1a(const char *p, size_t n)
{
    uint32_t h = 2166136261u;

    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 16777619u;
    }
    return h;
}

/* dst[0..n) = src[0..n) with ASCII upper case letters folded to lower case. */
static void fold(char *dst, const void *src, size_t n)
{
    const uint8_t *s = src;

    for (size_t i = 0; i < n; i++)
        dst[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
}

/* The slot of key k[0..n) (hash h): the one holding it, or the empty one where it would go. */
static struct slot *find_slot(const struct recipients *t, const char *k, size_t n, uint32_t h)
{
    size_t mask = t->nslots - 1;

    for (size_t i = h & mask;; i = (i + 1) & mask) {
        struct slot *s = &t->slots[i];
        if (s->len == 0 ||
            (s->hash == h && s->len == n && memcmp(t->arena + s->off, k, n) == 0))
            return s;
    }
}

static int contains(const struct recipients *t, const char *k, size_t n)
{
    return t->nslots > 0 && find_slot(t, k, n, fnv1a(k, n))->len != 0;
}

/* Doubles the slot array (from 64), rehashing. Returns 0, or -1 without memory. */
static int grow_slots(struct recipients *t)
{
    size_t n = t->nslots ? t->nslots * 2 : 64;
    struct slot *old = t->slots;
    size_t oldn = t->nslots;

    if (n > SIZE_MAX / sizeof *old || (t->slots = calloc(n, sizeof *old)) == NULL) {
        t->slots = old;
        return -1;
    }
    t->nslots = n;
    for (size_t i = 0; i < oldn; i++)
        if (old[i].len != 0)
            *find_slot(t, t->arena + old[i].off, old[i].len, old[i].hash) = old[i];
    free(old);
    return 0;
}

/* Adds key k[0..n) (already folded, 0 < n <= KEY_MAX). Returns 1 if added, 0 if it was there,
 * -1 without memory. */
static int add_key(struct recipients *t, const char *k, size_t n)
{
    uint32_t h = fnv1a(k, n);
    struct slot *s;

    if (contains(t, k, n))
        return 0;
    if ((t->used + 1) * 2 > t->nslots && grow_slots(t) < 0)
        return -1;
    if (t->arena_len + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap * 2 : 4096;
        char *a;
        while (cap < t->arena_len + n)
            cap *= 2;
        if (cap > UINT32_MAX || (a = realloc(t->arena, cap)) == NULL)
            return -1;
        t->arena = a;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, k, n);
    s = find_slot(t, k, n, h);
    s->off = (uint32_t)t->arena_len;
    s->len = (uint32_t)n;
    s->hash = h;
    t->arena_len += n;
    t->used++;
    return 1;
}

/* The checker of entries: a client engine session in memory of our own, made afresh for each
 * entry, that is given a transaction with the entry as its one forward-path. */
struct checker {
    smtpe_client_config cfg;
    size_t size;
    void *mem;
};

static int checker_init(struct checker *ck)
{
    smtpe_client_config_init(&ck->cfg);
    ck->cfg.max_recipients = 1;
    ck->cfg.output_buffer_size = 4096;
    ck->cfg.max_reply_line = 512;
    ck->cfg.max_reply_size = 512;
    ck->size = smtpe_client_memory_size(&ck->cfg);
    ck->mem = ck->size ? malloc(ck->size) : NULL;
    return ck->mem ? 0 : -1;
}

/* 1 if mailbox (NUL-terminated) is a valid forward-path mailbox for the engine, 0 if not, -1
 * if the checker itself failed. */
static int checker_valid(struct checker *ck, const char *mailbox)
{
    smtpe_client_rcpt r;
    smtpe_client_txn txn;
    smtpe_client *c;

    memset(&r, 0, sizeof r);
    memset(&txn, 0, sizeof txn);
    r.forward_path = mailbox;
    txn.reverse_path = "";
    txn.rcpts = &r;
    txn.rcpt_count = 1;
    if (smtpe_client_init(&c, ck->mem, ck->size, &ck->cfg, 0) != 0)
        return -1;
    return smtpe_client_submit(c, &txn) == 0;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* Cuts line[0..*n) at its comment and trims white space; returns the start of the entry (*n
 * its length, 0 for none). */
static char *entry_of(char *line, size_t *n)
{
    size_t len = *n, end = len;
    int quoted = 0;

    for (size_t i = 0; i < len; i++) {
        char c = line[i];
        if (quoted && c == '\\' && i + 1 < len) {
            i++;
        } else if (c == '"') {
            quoted = !quoted;
        } else if (!quoted && c == '#' && (i == 0 || is_space(line[i - 1]))) {
            end = i;
            break;
        }
    }
    while (end > 0 && is_space(line[end - 1]))
        end--;
    while (len > 0 && end > 0 && is_space(*line)) {
        line++;
        end--;
    }
    *n = end;
    line[end] = '\0';
    return line;
}

/* Adds the entry e[0..n) (NUL-terminated, n > 0) to t. Returns 0, or -1 with the reason in
 * why (a bad entry), or -2 (no memory). */
static int add_entry(struct recipients *t, struct checker *ck, const char *e, size_t n,
                     const char **why)
{
    char key[KEY_MAX + 3];
    const char *at = strrchr(e, '@');
    size_t dlen;
    int v, r;

    if (memchr(e, '\0', n) != NULL) {
        *why = "NUL octet in the entry";
        return -1;
    }
    if (at == NULL || at[1] == '\0') {
        *why = "not a mailbox (local-part@domain) or @domain";
        return -1;
    }
    dlen = n - (size_t)(at + 1 - e);
    if (at == e) { /* @domain: check it as the domain of a mailbox */
        if (n > 1 + 255) {
            *why = "domain longer than 255 octets";
            return -1;
        }
        key[0] = 'x';
        memcpy(key + 1, e, n + 1);
        v = checker_valid(ck, key);
    } else {
        v = checker_valid(ck, e);
    }
    if (v < 0)
        return -2;
    if (v == 0) {
        *why = at == e ? "not a valid @domain (RFC 5321 §4.1.2)"
                       : "not a valid mailbox (RFC 5321 §4.1.2)";
        return -1;
    }
    fold(key, e, n); /* valid: n <= KEY_MAX */
    if ((r = add_key(t, key, n)) < 0 || add_key(t, key + (n - dlen), dlen) < 0)
        return -2;
    if (at == e)
        t->catch_alls += (size_t)r;
    else
        t->mailboxes += (size_t)r;
    return 0;
}

struct recipients *recipients_load(const char *path, char *err, size_t errlen)
{
    struct recipients *t = calloc(1, sizeof *t);
    struct checker ck = {0};
    FILE *f = NULL;
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    const char *why = NULL;

    if (t == NULL || checker_init(&ck) < 0 || grow_slots(t) < 0)
        goto nomem;
    if ((f = fopen(path, "re")) == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto fail;
    }
    for (;;) {
        size_t n;
        char *e;
        int r;
        errno = 0;
        if ((got = getline(&line, &cap, f)) < 0)
            break;
        n = (size_t)got;
        lineno++;
        if (n > 0 && line[n - 1] == '\n')
            n--;
        e = entry_of(line, &n);
        if (n == 0)
            continue;
        if ((r = add_entry(t, &ck, e, n, &why)) == -2)
            goto nomem;
        if (r < 0) {
            snprintf(err, errlen, "%s:%zu: %s", path, lineno, why);
            goto fail;
        }
    }
    if (errno == ENOMEM)
        goto nomem;
    if (ferror(f)) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno ? errno : EIO));
        goto fail;
    }
    free(line);
    free(ck.mem);
    fclose(f);
    return t;
nomem:
    snprintf(err, errlen, "%s: out of memory", path);
fail:
    free(line);
    free(ck.mem);
    if (f != NULL)
        fclose(f);
    recipients_free(t);
    return NULL;
}

void recipients_free(struct recipients *t)
{
    if (t == NULL)
        return;
    /* Cleared first: a reader that broke the grace period would find nothing, not stale
     * entries (the unit test's concurrent reload would then see a known recipient refused). */
    if (t->slots != NULL)
        memset(t->slots, 0, t->nslots * sizeof *t->slots);
    free(t->slots);
    free(t->arena);
    free(t);
}

size_t recipients_mailboxes(const struct recipients *t)
{
    return t->mailboxes;
}

size_t recipients_catch_alls(const struct recipients *t)
{
    return t->catch_alls;
}

static int span_ieq(smtpe_span s, const char *lower)
{
    char buf[16];
    size_t n = strlen(lower);

    if (s.len != n || n > sizeof buf)
        return 0;
    fold(buf, s.ptr, n);
    return memcmp(buf, lower, n) == 0;
}

int recipients_known(const struct recipients *t, const smtpe_path *p)
{
    char key[KEY_MAX + 1];
    size_t l = p->local_part.len, d = p->domain.len;

    if (p->flags & SMTPE_PATH_POSTMASTER)
        return 1;
    if (l == 0 || d == 0 || l + 1 + d > KEY_MAX)
        return 0;
    fold(key, p->local_part.ptr, l);
    key[l] = '@';
    fold(key + l + 1, p->domain.ptr, d);
    return contains(t, key, l + 1 + d) || contains(t, key + l, 1 + d) ||
           (span_ieq(p->local_part, "postmaster") && contains(t, key + l + 1, d));
}

/* The read-section counters, each on a cache line of its own. */
struct phase_count {
    alignas(64) atomic_ulong readers;
};

struct recipients_source {
    char *path;
    _Atomic(struct recipients *) current;
    atomic_uint phase; /* its low bit: the counter new readers take */
    struct phase_count count[2];
};

struct recipients_source *recipients_source_new(const char *path, char *err, size_t errlen)
{
    struct recipients_source *src = aligned_alloc(64, (sizeof *src + 63) / 64 * 64);
    struct recipients *t;

    if (src == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    memset(src, 0, sizeof *src);
    if ((src->path = strdup(path)) == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        free(src);
        return NULL;
    }
    if ((t = recipients_load(path, err, errlen)) == NULL) {
        free(src->path);
        free(src);
        return NULL;
    }
    atomic_init(&src->current, t);
    atomic_init(&src->phase, 0);
    atomic_init(&src->count[0].readers, 0);
    atomic_init(&src->count[1].readers, 0);
    return src;
}

int recipients_source_known(struct recipients_source *src, const smtpe_path *p)
{
    unsigned ph = atomic_load(&src->phase) & 1u;
    const struct recipients *t;
    int known;

    atomic_fetch_add(&src->count[ph].readers, 1);
    t = atomic_load(&src->current);
    known = recipients_known(t, p);
    atomic_fetch_sub(&src->count[ph].readers, 1);
    return known;
}

/* Waits until every read section that began before the call has ended (see recipients.h). */
static void grace_period(struct recipients_source *src)
{
    for (int flip = 0; flip < 2; flip++) {
        unsigned old = atomic_fetch_add(&src->phase, 1) & 1u;
        while (atomic_load(&src->count[old].readers) != 0)
            sched_yield();
    }
}

int recipients_source_reload(struct recipients_source *src, char *err, size_t errlen)
{
    struct recipients *t = recipients_load(src->path, err, errlen), *old;

    if (t == NULL)
        return -1;
    old = atomic_exchange(&src->current, t);
    grace_period(src);
    recipients_free(old);
    return 0;
}

void recipients_source_counts(struct recipients_source *src, size_t *mailboxes,
                              size_t *catch_alls)
{
    const struct recipients *t = atomic_load(&src->current);

    *mailboxes = t->mailboxes;
    *catch_alls = t->catch_alls;
}

const char *recipients_source_path(const struct recipients_source *src)
{
    return src->path;
}

void recipients_source_free(struct recipients_source *src)
{
    if (src == NULL)
        return;
    recipients_free(atomic_load(&src->current));
    free(src->path);
    free(src);
}
