/*
 * auth.h - the user file of smtpe-server's AUTH (--auth-users) and password checks with
 * crypt(3).
 *
 * The file has one "user:hash" per line, hash being any crypt(3) hash libcrypt knows
 * ("openssl passwd -6", "mkpasswd -m yescrypt", ...); blank lines and lines starting with '#'
 * are skipped. It is read once at startup into an auth_db that is then only read, so all
 * threads may share it. A check runs crypt(3) whether or not the user exists (an unknown user is
 * checked against a hash of the same kind), so the time a refusal takes does not tell which
 * users exist. crypt(3) is deliberately slow (milliseconds): a check blocks the caller for that
 * long. Without libcrypt at build time (SMTPE_HAVE_CRYPT not defined) auth_db_load fails with
 * AUTH_UNAVAILABLE_TEXT.
 */
#ifndef SMTPE_HOST_AUTH_H
#define SMTPE_HOST_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define AUTH_UNAVAILABLE_TEXT "AUTH unavailable: smtpe-server was built without libcrypt"
#define AUTH_USER_MAX 255 /* longest user name kept (the engine's LOGIN limit) */
#define AUTH_PASSWORD_MAX 1024 /* longest password checked; longer ones never match */

struct auth_db;

/* 1 if this build has libcrypt. */
int auth_available(void);

/* Reads the user file at path. Returns the table, or NULL with a message in err (naming the
 * line at fault). */
struct auth_db *auth_db_load(const char *path, char *err, size_t errlen);

/* Frees what auth_db_load built (wiping the hashes). NULL is allowed. */
void auth_db_free(struct auth_db *db);

/* Checks a user name and password (octets as the client sent them). Returns 1 if they match
 * an entry, else 0 (unknown user, wrong password, NUL in either, too long, crypt failure), or
 * -1 if memory for crypt(3) runs out (no answer: a temporary failure). */
int auth_db_check(const struct auth_db *db, const uint8_t *user, size_t user_len,
                  const uint8_t *password, size_t password_len);

#endif
