/*
 * auth.c - the user file and crypt(3) password checks (see auth.h).
 *
 * The file is read whole into one buffer; the table's entries point into it. Lookups are a
 * linear scan (the file is meant for a handful of users; the crypt(3) call that follows costs
 * far more than the scan). crypt_rn works in a struct crypt_data (about 32 KiB) allocated for
 * the one call and wiped after it, so checks are thread-safe and keep no memory.
 */
#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SMTPE_HAVE_CRYPT
#include <crypt.h>
#endif

#define AUTH_FILE_MAX (16u << 20) /* largest user file read */

struct auth_entry {
    const char *user;
    size_t user_len;
    const char *hash;
};

struct auth_db {
    char *text; /* the file, NUL-terminated, cut into user and hash strings */
    size_t text_len;
    struct auth_entry *entries;
    size_t count;
};

#ifdef SMTPE_HAVE_CRYPT

int auth_available(void)
{
    return 1;
}

/* Reads the whole file into a NUL-terminated buffer. Returns it, or NULL with errno set. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "re");
    char *buf = NULL;
    size_t cap = 0, n = 0;
    int e;

    if (f == NULL)
        return NULL;
    for (;;) {
        size_t r;
        if (n + 1 >= cap) {
            size_t ncap = cap ? cap * 2 : 4096;
            char *nb;
            if (ncap > AUTH_FILE_MAX + 1) {
                errno = EFBIG;
                goto fail;
            }
            nb = realloc(buf, ncap);
            if (nb == NULL)
                goto fail;
            buf = nb;
            cap = ncap;
        }
        r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                errno = EIO;
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
fail:
    e = errno;
    if (buf != NULL)
        memset(buf, 0, cap);
    free(buf);
    fclose(f);
    errno = e;
    return NULL;
}

static int valid_user(const char *s, size_t n)
{
    if (n == 0 || n > AUTH_USER_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] == 0x7f)
            return 0;
    return 1;
}

/* Whether hashing with this hash as the setting gives a hash of the same length: a hash of a
 * method libcrypt knows, not cut short. Costs one crypt(3). Returns 1 or 0, or -1 if memory
 * runs out. */
static int hash_round_trips(const char *hash)
{
    struct crypt_data *cd = calloc(1, sizeof *cd);
    const char *out;
    int ok;

    if (cd == NULL)
        return -1;
    out = crypt_rn("", hash, cd, (int)sizeof *cd);
    ok = out != NULL && strlen(out) == strlen(hash);
    free(cd);
    return ok;
}

/* Whether libcrypt knows the hash's method. Legacy methods (DES, MD5, ...) are cheap, and DES
 * takes any two characters as its setting, so those are hashed once to check the whole hash;
 * the others (SHA-crypt, yescrypt, bcrypt) are costly and their setting is checked only.
 * Returns 1 or 0, or -1 if memory runs out. */
static int valid_hash(const char *hash)
{
#ifdef CRYPT_SALT_OK
    int r = crypt_checksalt(hash);
    return r == CRYPT_SALT_OK ? 1 : r == CRYPT_SALT_METHOD_LEGACY ? hash_round_trips(hash) : 0;
#else
    return hash_round_trips(hash);
#endif
}

/* Parses one line (NUL-terminated, without its newline) into e. Returns 1 for an entry, 0 for
 * a line to skip, -1 with a message in err. */
static int parse_line(char *line, struct auth_entry *e, char *err, size_t errlen)
{
    size_t n = strlen(line);
    char *colon, *end;
    int valid = 0;

    if (n > 0 && line[n - 1] == '\r')
        line[--n] = '\0';
    if (n == 0 || line[0] == '#')
        return 0;
    colon = strchr(line, ':');
    if (colon == NULL) {
        snprintf(err, errlen, "want user:hash");
        return -1;
    }
    *colon = '\0';
    if (!valid_user(line, (size_t)(colon - line))) {
        snprintf(err, errlen, "bad user name (1-%d printable characters, no space)",
                 AUTH_USER_MAX);
        return -1;
    }
    end = strchr(colon + 1, ':'); /* further fields, as in a shadow file: ignored */
    if (end != NULL)
        *end = '\0';
    if (colon[1] == '\0' || (valid = valid_hash(colon + 1)) <= 0) {
        if (valid < 0)
            snprintf(err, errlen, "user %s: out of memory checking the hash", line);
        else
            snprintf(err, errlen, "user %s: the hash is not one crypt(3) knows (make one "
                                  "with 'openssl passwd -6')", line);
        return -1;
    }
    e->user = line;
    e->user_len = (size_t)(colon - line);
    e->hash = colon + 1;
    return 1;
}

static const struct auth_entry *find(const struct auth_db *db, const uint8_t *user, size_t len)
{
    for (size_t i = 0; i < db->count; i++)
        if (db->entries[i].user_len == len && memcmp(db->entries[i].user, user, len) == 0)
            return &db->entries[i];
    return NULL;
}

struct auth_db *auth_db_load(const char *path, char *err, size_t errlen)
{
    struct auth_db *db = calloc(1, sizeof *db);
    char why[256];
    size_t lines = 1, lineno = 0;
    char *p;

    if (db == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    db->text = read_file(path, &db->text_len);
    if (db->text == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        free(db);
        return NULL;
    }
    for (size_t i = 0; i < db->text_len; i++)
        lines += db->text[i] == '\n';
    db->entries = calloc(lines, sizeof *db->entries);
    if (db->entries == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        auth_db_free(db);
        return NULL;
    }
    for (p = db->text; p != NULL && *p != '\0';) {
        char *nl = strchr(p, '\n');
        struct auth_entry e;
        int r;
        if (nl != NULL)
            *nl = '\0';
        lineno++;
        r = parse_line(p, &e, why, sizeof why);
        if (r == 1 && find(db, (const uint8_t *)e.user, e.user_len) != NULL) {
            snprintf(why, sizeof why, "user %s appears twice", e.user);
            r = -1;
        }
        if (r < 0) {
            snprintf(err, errlen, "%s line %zu: %s", path, lineno, why);
            auth_db_free(db);
            return NULL;
        }
        if (r == 1)
            db->entries[db->count++] = e;
        p = nl ? nl + 1 : NULL;
    }
    if (db->count == 0) {
        snprintf(err, errlen, "%s: no users (want user:hash lines)", path);
        auth_db_free(db);
        return NULL;
    }
    return db;
}

void auth_db_free(struct auth_db *db)
{
    if (db == NULL)
        return;
    if (db->text != NULL)
        explicit_bzero(db->text, db->text_len);
    free(db->text);
    free(db->entries);
    free(db);
}

/* Compares two NUL-terminated strings in time that depends only on their lengths. */
static int ct_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), n = la < lb ? la : lb;
    unsigned char d = la != lb;

    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

int auth_db_check(const struct auth_db *db, const uint8_t *user, size_t user_len,
                  const uint8_t *password, size_t password_len)
{
    const struct auth_entry *e = find(db, user, user_len);
    /* An unknown user is checked against the first entry's hash (same method and cost), and
     * refused whatever the result, so that both cases take the same time. */
    const char *hash = e != NULL ? e->hash : db->entries[0].hash;
    int usable = password_len <= AUTH_PASSWORD_MAX &&
                 memchr(password, '\0', password_len) == NULL;
    char phrase[AUTH_PASSWORD_MAX + 1];
    struct crypt_data *cd = calloc(1, sizeof *cd);
    const char *out;
    int ok;

    if (cd == NULL)
        return -1;
    if (usable)
        memcpy(phrase, password, password_len);
    phrase[usable ? password_len : 0] = '\0';
    errno = 0;
    out = crypt_rn(phrase, hash, cd, (int)sizeof *cd);
    if (out == NULL && errno == ENOMEM) /* yescrypt and scrypt allocate inside libcrypt */
        ok = -1;
    else
        ok = out != NULL && e != NULL && usable && ct_equal(out, e->hash);
    explicit_bzero(phrase, sizeof phrase);
    explicit_bzero(cd, sizeof *cd);
    free(cd);
    return ok;
}

#else /* !SMTPE_HAVE_CRYPT */

int auth_available(void)
{
    return 0;
}

struct auth_db *auth_db_load(const char *path, char *err, size_t errlen)
{
    (void)path;
    snprintf(err, errlen, "%s", AUTH_UNAVAILABLE_TEXT);
    return NULL;
}

void auth_db_free(struct auth_db *db)
{
    (void)db;
}

int auth_db_check(const struct auth_db *db, const uint8_t *user, size_t user_len,
                  const uint8_t *password, size_t password_len)
{
    (void)db;
    (void)user;
    (void)user_len;
    (void)password;
    (void)password_len;
    return 0;
}

#endif
