#!/usr/bin/env python3
"""fuzz/client_seeds.py - writes the fuzz_client seeds (fuzz/corpus/fuzz_client/).

    python3 fuzz/client_seeds.py [DIR]      # default: fuzz/corpus/fuzz_client next to this file

Each seed is a header (the config, see the top of fuzz/fuzz_client.c) and a program of ops: the
scripted server's replies (a choice octet per reply; 0 is the happy one), submitted
transactions, host actions. The helpers below spell them out; the scenarios are test_client's
(pipelined, Q01-Q14, protocol errors, HELO fallback, local refusals) and more (AUTH mechanisms,
BDAT, LMTP, XCLIENT, PROXY, implicit TLS, slow writes, aborts, invalid calls).
"""
import os
import sys

OBS = {4096: 0, 4160: 1, 16384: 2, 65536: 3}
MU = {512: 0, 513: 1, 600: 2, 1000: 3, 4096: 4, 65536: 5, 1048576: 6}
MRL = {512: 0, 513: 1, 600: 2, 1024: 3, 2048: 4, 4096: 5, 65536: 6}
MR = {1: 0, 2: 1, 3: 2, 5: 3, 8: 4, 100: 5, 1000: 6, 100000: 7}
TLS = {'none': 0, 'opp': 1, 'req': 2, 'implicit': 3}
MECH = {None: 0, '': 1, 'PLAIN': 2, 'LOGIN': 3, 'XOAUTH2': 4, 'OAUTHBEARER': 5, 'X-TOKEN': 6, 'cram-md5': 7}
# the indices of fuzz_client.c's path_choices, for rcpt() and submit(rev=...)
PATHS = ['alice@example.com', '', 'jose8bit', 'quoted', 'literal', 'postmaster', 'Postmaster',
         'bob@example.org', 'long64', 'long65', 'crlf', 'space', 'route', 'a+b=c', 'c@example.org', 'user@']

def hdr(lmtp=0, tls='none', chunking=0, nopipe=0, refuse=0, proxy=0, auto=0, mech=None, creds=0,
        authzid=0, plain_ok=0, longc=0, obs=16384, chunk=0, mu=4096, mrl=2048, mrs=2, mr=1000,
        timeouts=0, t0=0, helo=0, xclient=0, octetwise=0, seed=1, manual_tls=0, manual_auth=0,
        proxy2=0, evl=0):
    h = [0] * 8
    h[0] = lmtp | TLS[tls] << 1 | chunking << 3 | nopipe << 4 | refuse << 5 | proxy << 6 | auto << 7
    h[1] = MECH[mech] | creds << 3 | authzid << 5 | plain_ok << 6 | longc << 7
    h[2] = OBS[obs] | chunk << 2 | MU[mu] << 5
    h[3] = MRL[mrl] | mrs << 3 | MR[mr] << 5
    h[4] = timeouts | t0 << 2 | helo << 4 | xclient << 6 | octetwise << 7
    h[5] = seed & 255
    h[6] = seed >> 8
    h[7] = manual_tls | manual_auth << 1 | proxy2 << 2 | evl << 3
    return bytes(h)

# ---- ops ----
def server(*choices, hold=False):
    """replies to len(choices) commands; each choice is an int or a list of octets (a choice
    octet and what it reads: the EHLO caps, a 334 challenge, a text)"""
    n = len(choices)
    assert 1 <= n <= 7
    out = [n | (8 if hold else 0)]
    out = [out[0] << 4]
    for c in choices:
        out += c if isinstance(c, list) else [c]
    return bytes(out)

def server_all(*choices):
    out = [0]
    for c in choices:
        out += c if isinstance(c, list) else [c]
    return bytes(out)

def ehlo(m1, m2=0, m3=3, code_idx=0):
    return [code_idx, m1, m2, m3]

# EHLO keywords: the first list goes in ehlo()'s m1, the second in its m2
PIPELINING, SIZE, EIGHTBIT, SMTPUTF8, ENH, STARTTLS, CHUNKING, BINARYMIME = [1 << i for i in range(8)]
DSN, REQUIRETLS, MTPRI, DELIVERBY, AUTH, XCLIENT, XFORWARD, LOWER = [1 << i for i in range(8)]

def raw(b):
    assert len(b) < 65536
    return bytes([0xF1, len(b) & 255, len(b) >> 8]) + b

def extra(code_idx, text=0, hold=False):
    return bytes([0x02 | code_idx << 4, text | (0x80 if hold else 0)])

def submit(rcpts, rev=0, body=0, smtputf8=0, ret=0, envid=0, requiretls=0, scan=0, mtby=0,
           xforward=0, piece=0, kind=2, param=0, content=b'', arg=0):
    b0 = (len(rcpts) - 1) | rev << 4
    b1 = body | smtputf8 << 2 | ret << 3 | envid << 5 | requiretls << 6 | scan << 7
    b2 = mtby | xforward << 3 | piece << 4
    b3 = kind | param << 4
    out = bytes([0x03 | arg << 4, b0, b1, b2, b3]) + bytes(rcpts)
    if kind == 0:
        assert len(content) < 256
        out += bytes([len(content)]) + content
    elif kind == 15:
        out += bytes([len(content) & 255, len(content) >> 8]) + content
    return out

def rcpt(path, notify=0, orcpt=0, orcpt_kind=0):
    return path | notify << 4 | orcpt << 6 | orcpt_kind << 7

PAUSE = lambda on: bytes([0x04 | (1 if on else 0) << 4])
ABORT = b'\x05'
LOST = b'\x06'
QUIT = b'\x07'
TLS_UP = b'\x08'
TLS_FAIL = b'\x18'
AUTHR = lambda i: bytes([0x09 | i << 4])
TIME = lambda i: bytes([0x0a | i << 4])
BUDGET = lambda i: bytes([0x0b | i << 4])
WRITE = lambda i: bytes([0x0b | (8 + i) << 4])
BAD = lambda i: bytes([0x0c | i << 4])
AUTO = lambda n: bytes([0x0d | (n - 1) << 4])

def write(name, data):
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus', 'fuzz_client')
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)

# ---- the seeds ----
CAPS = ehlo(PIPELINING | SIZE | EIGHTBIT | ENH)
CAPS_NOPIPE = ehlo(EIGHTBIT | ENH)
H = hdr()
# 1 the plain pipelined session (test_client's sc_pipelined)
write('pipelined', H + submit([rcpt(7)]) + server(0) + server(CAPS) + server(0, 0, 0) + server(0) + QUIT + server(0))
# 2 no PIPELINING: one command per reply
write('no-pipelining', H + server(0) + server(CAPS_NOPIPE) + submit([rcpt(7), rcpt(14), rcpt(0)], rev=1) +
      server(0) + server(2) + server(0) + server(3) + server(0) + server(0) + QUIT + server(0))
# 3 cfg.pipelining off though offered
write('pipelining-off', hdr(nopipe=1) + server(0) + server(CAPS) + submit([rcpt(7), rcpt(14)]) +
      server(0) + server(0) + server(0) + server(0) + server(0))
# 4 Q04 a refused RCPT, 503 to DATA, then a second transaction with RSET
write('q04-refused-rcpt-503', H + server(0) + server(CAPS) + submit([rcpt(7)]) + server(0, 2, 4) +
      submit([rcpt(7)]) + server(0, 0, 0, 0) + server(0) + QUIT + server(0))
# 5 Q05 every recipient refused, 354: a lone dot
write('q05-lone-dot', H + server(0) + server(CAPS) + submit([rcpt(7), rcpt(14), rcpt(0)]) +
      server(0, 2, 2, 2, 0) + server(0) + AUTO(4))
# 6 Q06 421 at each stage
write('q06-421-greeting', H + submit([rcpt(7)]) + server(3))
write('q06-421-ehlo', H + submit([rcpt(7)]) + server(0) + server(4 | 8))
write('q06-421-mail', H + submit([rcpt(7)]) + server(0) + server(CAPS) + server(3))
write('q06-421-rcpt', H + submit([rcpt(7)]) + server(0) + server(CAPS) + server(0, 5))
write('q06-421-data', H + submit([rcpt(7)]) + server(0) + server(CAPS) + server(0, 0, 3))
write('q06-421-dot', H + submit([rcpt(7)]) + server(0) + server(CAPS) + server(0, 0, 0) + server(4))
write('q06-421-unsolicited', H + server(0) + server(CAPS) + extra(0, 1))
# 7 Q07 LMTP: one reply per accepted recipient, then the next transaction
write('q07-lmtp', hdr(lmtp=1) + server(0) + server(ehlo(PIPELINING | ENH)) +
      submit([rcpt(0), rcpt(7), rcpt(14)]) + server(0, 0, 2 | 8, 0, 0) + server(0 | 8, 1 | 8) +
      submit([rcpt(7)]) + server(0, 0, 0) + server(0) + QUIT + server(0))
write('lmtp-421-among-replies', hdr(lmtp=1) + server(0) + server(ehlo(PIPELINING | ENH)) +
      submit([rcpt(0), rcpt(7), rcpt(14)]) + server(0, 0, 0, 0, 0) + server(0, 4))
write('lmtp-all-refused-354', hdr(lmtp=1) + server(0) + server(ehlo(PIPELINING)) +
      submit([rcpt(0), rcpt(7)]) + server(0, 2, 2, 0))
# 8 Q01 STARTTLS: the 220 and a forged EHLO reply in one read
write('q01-starttls-injection', hdr(tls='req', manual_tls=1) + server(0) + server(ehlo(PIPELINING | STARTTLS)) +
      server(0, hold=True) + raw(b'250-mx.example\r\n250 AUTH PLAIN\r\n'))
# 9 Q02 TLS required: refused, and not offered
write('q02-tls-required-refused', hdr(tls='req', mech='', plain_ok=0) + submit([rcpt(7)]) + server(0) +
      server(ehlo(STARTTLS, AUTH, 0)) + server(1 | 8))
write('q02-tls-required-not-offered', hdr(tls='req', mech='') + submit([rcpt(7)]) + server(0) + server(ehlo(0, AUTH, 0)))
# 10 Q03 the capabilities after TLS are the new EHLO's
write('q03-caps-after-tls', hdr(tls='opp') + server(0) + server(ehlo(SIZE | STARTTLS, 0, 2)) + server(0) +
      server(ehlo(SIZE, 0, 3)) + submit([rcpt(7)]) + server(0) + server(0) + server(0) + server(0) + QUIT + server(0))
write('tls-opportunistic-refused', hdr(tls='opp') + server(0) + server(ehlo(PIPELINING | STARTTLS)) + server(1) +
      submit([rcpt(7)]) + server(0, 0, 0) + server(0))
write('tls-handshake-failed', hdr(tls='opp', manual_tls=1) + server(0) + server(ehlo(STARTTLS)) + server(0) + TLS_FAIL)
# 11 Q08 LOGIN with odd prompts
write('q08-login', hdr(mech='LOGIN', plain_ok=1) + server(0) + server(ehlo(0, AUTH, 0 << 2)) +
      server([1, 1]) + server([1, 0]) + server(0) + submit([rcpt(7)]) + server(0) + server(0) + server(0) + server(0))
# 12 Q09 PLAIN initial response too long for the AUTH line
write('q09-plain-long', hdr(mech='PLAIN', authzid=1, longc=1, plain_ok=1) + server(0) + server(ehlo(0, AUTH, 0)) +
      server([1, 0]) + server(2 | 8))
write('plain-ir', hdr(mech='PLAIN', authzid=1, plain_ok=1) + submit([rcpt(7)]) + server(0) + server(ehlo(PIPELINING, AUTH, 0)) +
      server(0) + server(0, 0, 0) + server(0))
# 13 no AUTH in clear without auth_plaintext_ok
write('auth-needs-tls', hdr(mech='') + submit([rcpt(7)]) + server(0) + server(ehlo(0, AUTH, 0)))
write('auth-after-tls', hdr(mech='', tls='req') + submit([rcpt(7)]) + server(0) + server(ehlo(STARTTLS | PIPELINING, AUTH, 0)) +
      server(0) + server(ehlo(PIPELINING, AUTH, 3 << 2)) + server(0) + server(0, 0, 0) + server(0) + QUIT + server(0))
# 14 XOAUTH2 and OAUTHBEARER error challenges
write('xoauth2-error', hdr(mech='', creds=1, plain_ok=1) + server(0) + server(ehlo(0, AUTH, 2 << 2)) +
      server([1, 3]) + server(2 | 8))
write('oauthbearer-error', hdr(mech='OAUTHBEARER', creds=1, plain_ok=1) + server(0) + server(ehlo(0, AUTH, 3 << 2)) +
      server([1, 3]) + server(2))
# 15 host-run mechanisms
write('auth-host-x-token', hdr(mech='X-TOKEN', plain_ok=1) + submit([rcpt(7)]) + server(0) + server(ehlo(PIPELINING, AUTH, 4 << 2)) +
      server([1, 2]) + server([1, 5]) + server(0) + server(0, 0, 0) + server(0))
write('auth-host-manual', hdr(mech='cram-md5', plain_ok=1, manual_auth=1) + server(0) + server(ehlo(0, AUTH, 4 << 2)) +
      AUTHR(1) + server([1, 2]) + AUTHR(3) + server(0) + AUTHR(0))
write('auth-host-bad-base64', hdr(mech='X-TOKEN', plain_ok=1) + server(0) + server(ehlo(0, AUTH, 4 << 2)) + server([1, 4]))
# 16 Q10 smuggling content
write('q10-smuggling', H + server(0) + server(CAPS) + submit([rcpt(7)], kind=3) + server(0, 0, 0) + server(0))
write('dots-and-bare', H + server(0) + server(CAPS) + submit([rcpt(7)], kind=5, piece=1) + server(0, 0, 0) + server(0) +
      submit([rcpt(7)], kind=4, piece=2) + server(0, 0, 0) + server(0))
# 17 Q12 DSN parameters xtext-encoded
write('q12-xtext', H + server(0) + server(ehlo(PIPELINING, DSN)) +
      submit([rcpt(13, 1, 1, 0)], envid=1, ret=2) + server(0, 0, 0) + server(0))
write('mail-params', H + server(0) + server(ehlo(PIPELINING | SIZE | EIGHTBIT | SMTPUTF8, DSN | MTPRI | DELIVERBY, 2)) +
      submit([rcpt(2), rcpt(6)], rev=2, body=2, scan=1, mtby=1, kind=8) + server(0, 0, 0, 0) + server(0) +
      submit([rcpt(4)], rev=3, body=1, mtby=3) + server(0, 0, 0) + server(0))
# 18 Q13 BDAT refused mid-message
write('q13-bdat-refused', hdr(chunking=1, obs=4096) + server(0) + server(ehlo(PIPELINING | CHUNKING | ENH)) +
      submit([rcpt(7)], kind=7, param=7) + server(0, 0, 1) + submit([rcpt(7)]) + server(0, 0, 0, 0) + server(0))
write('bdat-binarymime', hdr(chunking=1, obs=4160, chunk=3) + server(0) + server(ehlo(PIPELINING | CHUNKING | BINARYMIME | EIGHTBIT)) +
      submit([rcpt(7)], body=3, kind=12, param=3, piece=5) + AUTO(12))
write('bdat-lmtp', hdr(chunking=1, lmtp=1) + server(0) + server(ehlo(PIPELINING | CHUNKING)) +
      submit([rcpt(0), rcpt(7)], kind=2) + server(0, 0, 0, 0, 0))
# 19 Q14 no reply to the dot: unknown after data_end_timeout
write('q14-timeout-after-dot', H + server(0) + server(CAPS) + submit([rcpt(0), rcpt(7), rcpt(14)]) +
      server(0, 0, 2, 0, 0) + TIME(11) + TIME(0))
write('timeouts-small', hdr(timeouts=2) + server(0) + TIME(2) + TIME(2))
# 20 protocol errors
for i, bad in enumerate([b'250-ok\r\n251 ok\r\n', b'150 ok\r\n', b'2500 ok\r\n', b'250 ok\n',
                         b'250 ok\r\n354 go\r\n354 again\r\n', b'334 what\r\n', b'250 ok\r\n250 ok\r\n250 data?\r\n',
                         b'250 ' + b'x' * 2100 + b'\r\n']):
    write('protocol-error-%d' % i, H + server(0) + server(CAPS) + submit([rcpt(7)]) + raw(bad))
write('unsolicited-250', H + server(0) + server(CAPS) + extra(1, 1))
# 21 HELO fallback, refused greeting
write('helo-fallback', H + server(0) + server(2) + server(0) + submit([rcpt(7)]) + server(0) + server(0) + server(0) + server(0))
write('greeting-554', H + submit([rcpt(7)]) + server(2 | 8))
write('lhlo-502-refused', hdr(lmtp=1) + server(0) + server(2))
# 22 local refusals before MAIL
write('local-refusals', H + server(0) + server(ehlo(PIPELINING | SIZE, 0, 2)) +
      submit([rcpt(7)], scan=1, kind=8) + submit([rcpt(2)]) + submit([rcpt(7)], requiretls=1) +
      submit([rcpt(7)], body=3) + submit([rcpt(7)], scan=1, kind=7) + submit([rcpt(7)], mtby=3))
write('refuse-mid-stream', hdr(refuse=1) + server(0) + server(CAPS) + submit([rcpt(7)], kind=5) + server(0, 0, 0))
write('refuse-8bit-mid-stream', H + server(0) + server(CAPS) + submit([rcpt(7)], kind=8) + server(0, 0, 0))
# 23 implicit TLS with a PROXY v2 header, XCLIENT
write('implicit-proxy2', hdr(tls='implicit', proxy=1, proxy2=1) + submit([rcpt(7)]) + AUTO(10))
write('proxy1', hdr(proxy=1) + submit([rcpt(7)]) + AUTO(10))
write('xclient', hdr(xclient=1) + server(0) + server(ehlo(PIPELINING, XCLIENT, 0)) + server(0) +
      server(CAPS) + submit([rcpt(7)], xforward=1) + server(0, 0, 0) + server(0))
write('xforward', H + server(0) + server(ehlo(PIPELINING, XFORWARD, 0)) + submit([rcpt(7)], xforward=1) +
      server(0, 0, 0, 0) + server(0))
# 24 the host aborts, loses the connection, writes slowly, submits twice
write('abort-content', H + server(0) + server(CAPS) + PAUSE(1) + submit([rcpt(7)], kind=7, param=15, piece=9) +
      server(0, 0, 0) + BUDGET(1) + PAUSE(0) + ABORT + AUTO(3))
write('lost-after-end', H + server(0) + server(CAPS) + submit([rcpt(7), rcpt(0)]) + server(0, 0, 0, 0) + LOST)
write('lost-unacked-end', H + server(0) + server(CAPS) + submit([rcpt(7)]) + server(0, 0, 0) + BUDGET(4) + LOST)
write('slow-writer', hdr(obs=4096, mu=512) + BUDGET(3) + server(0) + server(CAPS) +
      submit([rcpt(i) for i in (7, 14, 0, 8, 13, 4, 6, 5)], kind=7, param=3, piece=10) + AUTO(16))
write('second-submit-refused', H + submit([rcpt(7)]) + submit([rcpt(7)]) + QUIT + submit([rcpt(7)]) + AUTO(10))
write('bad-calls', H + BAD(0) + BAD(1) + BAD(2) + BAD(3) + BAD(4) + BAD(5) + BAD(6) + BAD(7) + submit([rcpt(7)]) +
      server(0) + server(CAPS) + server(0, 0, 0) + BAD(5) + BAD(4) + server(0) + BAD(6))
write('invalid-submits', H + server(0) + server(CAPS) + submit([rcpt(10)]) + submit([rcpt(7)], rev=11) +
      submit([rcpt(7)], mtby=5) + submit([rcpt(7)] * 2, arg=2 | 4) + submit([rcpt(7)], envid=1, arg=1) + AUTO(8))
# 25 auto-finish sessions with various configs
for i, h in enumerate([hdr(auto=1), hdr(auto=1, chunking=1, obs=4096, mu=512), hdr(auto=1, lmtp=1, chunking=1),
                       hdr(auto=1, tls='req', mech='', creds=2, xclient=1), hdr(auto=1, tls='implicit', mech='LOGIN'),
                       hdr(auto=1, refuse=1, nopipe=1, mrl=512, mrs=0), hdr(auto=1, octetwise=1, mech='XOAUTH2', creds=1, plain_ok=1)]):
    write('auto-%d' % i, h + submit([rcpt(7), rcpt(0)], kind=[2, 7, 5, 3, 4, 13, 10][i], param=1))

h = bytearray(hdr(xclient=1, auto=1))
h[7] |= 0x20  # XCLIENT values of 150 octets: two lines
write('xclient-two-lines', bytes(h) + submit([rcpt(7)]))
