/* sasl.h - base64 and the SASL PLAIN message (private to the engine).
 * RFC 4648 §4 (base64), RFC 4954 §4 (its use in AUTH), RFC 4616 §2 (PLAIN). */
#ifndef SMTPE_SASL_H
#define SMTPE_SASL_H
#include "smtpe.h"

#define SMTPE__BASE64_BAD SIZE_MAX

/* Decodes the base64 text p[0..n) into out, which may be p itself (the output is never longer
 * than the input, and each output octet is written after the input octets it comes from were
 * read). The text must be whole quanta: n a multiple of 4, '=' padding only at the end (one or
 * two), only A-Z a-z 0-9 + /, no spaces or line breaks; bits under the padding must be zero
 * (RFC 4648 §3.5). n == 0 decodes to nothing. Returns the decoded length, or SMTPE__BASE64_BAD. */
size_t smtpe__base64_decode(const uint8_t *p, size_t n, uint8_t *out);

/* The base64 text of n octets is this long. */
#define SMTPE__BASE64_LEN(n) (((n) + 2) / 3 * 4)

/* Encodes p[0..n) as padded base64 into out, which has room for SMTPE__BASE64_LEN(n) octets
 * (out must not overlap p). Returns SMTPE__BASE64_LEN(n). */
size_t smtpe__base64_encode(const uint8_t *p, size_t n, uint8_t *out);

/* Splits a decoded PLAIN message p[0..n) = [authzid] NUL authcid NUL passwd (RFC 4616 §2) into
 * spans into p. authcid and passwd must be non-empty; no part may hold NUL, and each is at most
 * 255 octets (RFC 4616 §2). Returns 0, or -1 if malformed. */
int smtpe__sasl_plain(const uint8_t *p, size_t n, smtpe_span *authzid, smtpe_span *authcid,
                      smtpe_span *password);

#endif
