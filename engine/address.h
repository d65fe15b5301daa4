/* address.h - RFC 5321 §4.1.2 Path / Mailbox parser (private to the engine). */
#ifndef SMTPE_ADDRESS_H
#define SMTPE_ADDRESS_H
#include "smtpe.h"

/* Options of smtpe__parse_path. */
#define SMTPE__PATH_ALLOW_NULL (1u << 0)       /* <> is a valid reverse-path */
#define SMTPE__PATH_ALLOW_POSTMASTER (1u << 1) /* <postmaster> without domain (RCPT) */
#define SMTPE__PATH_LAX_BRACKETS (1u << 2)     /* a mailbox without <> is accepted */

/* Results of smtpe__parse_path. */
#define SMTPE__PATH_OK 0
#define SMTPE__PATH_NO_BRACKETS 1 /* the path does not start with '<' */
#define SMTPE__PATH_SYNTAX 2      /* anything else malformed */
#define SMTPE__PATH_TOO_LONG 3    /* local-part > 64, domain > 255 or path > 256 octets */

/* Longest parts, in octets (RFC 5321 §4.5.3.1.1-3). */
#define SMTPE__MAX_LOCAL_PART 64
#define SMTPE__MAX_DOMAIN 255
#define SMTPE__MAX_PATH 256

/* Parses a Path (or Reverse-path with ALLOW_NULL) at p[0..n). On SMTPE__PATH_OK fills *out
 * (spans into p) and sets *used to the octets the path took, '>' included; what follows is left
 * to the caller. Non-ASCII octets must be well-formed UTF-8 and set SMTPE_PATH_UTF8; whether they
 * are allowed (SMTPUTF8) is the caller's check. */
int smtpe__parse_path(const uint8_t *p, size_t n, unsigned opts, smtpe_path *out, size_t *used);

/* 1 if p[0..n) is a valid IPv4 dotted quad / IPv6-addr of RFC 5321 §4.1.3, else 0. */
int smtpe__is_ipv4(const uint8_t *p, size_t n);
int smtpe__is_ipv6(const uint8_t *p, size_t n);

/* Length of the well-formed UTF-8 sequence at p[0..n) that starts with a non-ASCII octet, or 0
 * if it is malformed (overlong, surrogate, above U+10FFFF, truncated). RFC 3629. */
size_t smtpe__utf8_seq(const uint8_t *p, size_t n);

#endif
