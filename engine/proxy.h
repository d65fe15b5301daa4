/* proxy.h - the PROXY protocol header, versions 1 and 2 (private to the engine).
 * HAProxy's proxy-protocol.txt: §2.1 (v1, text), §2.2 (v2, binary), §2.2.7 (TLVs). */
#ifndef SMTPE_PROXY_H
#define SMTPE_PROXY_H
#include "smtpe.h"

#define SMTPE__PROXY_V1_MAX 107 /* a v1 header's longest form, CRLF included (§2.1) */
#define SMTPE__PROXY_V2_FIXED 16 /* signature (12), ver_cmd, fam, len (2) */

/* Incremental reader: gathers header octets into a caller buffer. */
typedef struct smtpe__proxy {
    size_t len;  /* octets gathered in buf */
    size_t need; /* v2: total header octets once the length is known, else 0 */
} smtpe__proxy;

/* Results of smtpe__proxy_feed. */
#define SMTPE__PROXY_MORE 0    /* all of p consumed, the header is not complete yet */
#define SMTPE__PROXY_DONE 1    /* the header is complete in buf[0..st->len) */
#define SMTPE__PROXY_INVALID 2 /* not a PROXY header, malformed, or longer than cap */

/* Starts reading a header. */
void smtpe__proxy_start(smtpe__proxy *st);

/* Consumes octets of p[0..n) into buf (cap octets, at least 108) and sets *used. It never
 * consumes an octet past the end of the header, and it decides as early as it can: the first
 * octet that cannot begin or continue a v1 ("PROXY ") or v2 (the 12-octet signature) header,
 * a v1 header with no CRLF within 107 octets, a v2 length that does not fit in cap, or a
 * version other than 2 give INVALID at once. Returns SMTPE__PROXY_*. */
int smtpe__proxy_feed(smtpe__proxy *st, uint8_t *buf, size_t cap, const uint8_t *p, size_t n,
                      size_t *used);

/* Parses the complete header buf[0..len) that smtpe__proxy_feed gathered into *out (tlvs point
 * into buf). v1: "PROXY TCP4|TCP6 src dst sport dport\r\n" with single spaces, addresses in the
 * family's text form (IPv4 dotted quad without leading zeros, IPv6 RFC 4291 §2.2 including
 * "::" and an embedded IPv4 tail), ports 0..65535 without leading zeros; or
 * "PROXY UNKNOWN...\r\n" (local). v2: version 2, command LOCAL (local) or PROXY, family/transport
 * from the fam octet, the address block at least as long as the family needs, and the TLVs
 * after it exactly covering the rest; for LOCAL whatever follows the fixed part is ignored, and
 * for AF_UNSPEC (local) a rest that is not well-formed TLVs is ignored. Returns 0, or -1 if malformed. An INVALID reader must be restarted
 * (smtpe__proxy_start) before it is fed again; on INVALID, *used counts the octet that made it
 * so. */
int smtpe__proxy_parse(const uint8_t *buf, size_t len, smtpe_proxy_info *out);

/* Writes the PROXY header for info (info->version 1 or 2; HAProxy's proxy-protocol.txt §2.1,
 * §2.2) into out[0..cap), the inverse of smtpe__proxy_parse: v1 "PROXY TCP4|TCP6 ..." (or
 * "PROXY UNKNOWN\r\n" when info->local or the family is not INET/INET6), v2 the signature,
 * command PROXY (LOCAL when info->local), the family/transport octet, the address block and
 * info->tlvs verbatim. Returns the length, or 0 if info is invalid (version, family, a v2
 * header over 65535 + 16 octets) or the header does not fit. */
size_t smtpe__proxy_emit(const smtpe_proxy_info *info, uint8_t *out, size_t cap);

#endif
