#!/usr/bin/env python3
"""Interop tests of smtpe-send, the client program on the client engine, against real servers:
Postfix's smtpd, Dovecot's LMTP, aiosmtpd, go-smtp (SMTP and LMTP) and nodemailer's
smtp-server (SMTP and LMTP), each a private instance on loopback started by peers.py (its
docstring says how each is set up, what it offers and what it changes in its store).

Every delivery is read back from the server's OWN store and compared octet for octet with the
message given to smtpe-send (peers.Peer.assert_delivered: the server's trace fields stripped,
an LF store read as CRLF, nothing else undone); the envelope, TLS and AUTH as the server
recorded them; smtpe-send's outcome lines ("N RECIPIENT OUTCOME CODE ENHANCED TEXT") and its
exit status against the replies each server is known to give. Where a check is about the wire
(BDAT or DATA, dot-stuffing, the MAIL and RCPT parameters: BODY=8BITMIME, SMTPUTF8, DSN), the
session goes through Relay, a TCP relay in this file that records what the client sent, without
TLS; the envelope peers also record the parameters they parsed (Message.meta).

Per server: every endpoint (TCP, unix socket; plain, STARTTLS with --tls required, implicit
TLS) with AUTH where offered (each mechanism; without TLS only with --auth-plaintext-ok, else
no credential octet goes; a wrong password's 535); the certificate checked in every TLS mode
(another CA fails); several recipients with a refused or deferred one, and all refused;
--messages 3; PIPELINING used as offered (lock-step without it); the null reverse-path; lines
starting with "." and "." lines (DATA stuffed exactly, BDAT as is); bare CR and LF normalised;
a 1000-octet line, and one of 10 000 (BDAT, else refused locally); a 2 MB message; 8-bit
content (BODY=8BITMIME); an SMTPUTF8 address (refused locally where SMTPUTF8 is not offered);
DSN parameters (sent where DSN is offered, left out elsewhere; Postfix's own success DSN read
back); BDAT against DATA; refusals after the content (SMTP: the whole transaction; LMTP: one
recipient, also over --messages 3). One peer instance per test class; about 40 s in all.

Usage: test_send_peers.py [SMTPE_SERVER] --send SMTPE_SEND [--cache DIR] [--slow N]
                          [-k PATTERN] [-q]
  SMTPE_SEND defaults to $SMTPE_SEND, then build/smtpe-send; --cache: where the go-smtp peer is
  built (peers.set_cache_dir); the other options as test_server.py's (its main() runs this;
  SMTPE_SERVER is only checked to exist). Needs root and tests/deps.sh's servers; a server
  that cannot start fails its tests.
Only the Python 3 standard library.
"""

import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
import test_server as ts  # noqa: E402  (its main() and bounds)

SEND = None  # path of smtpe-send, set in __main__
CRLF = b"\r\n"
HELO = "client.test"
SENDER = "sender@client.test"
LINE = re.compile(r"^(\d+) (\S+) (delivered|permanent|temporary|unknown) (\d{3}) (\S+) (.*)$")


# ------------------------------------------------------------------------------------------------
# Contents
# ------------------------------------------------------------------------------------------------
def basic_content(subject):
    """A header and a body whose lines exercise dot-stuffing: ".", "..", ".x", "..x" and
    CRLF.CRLF in the middle (the end of the content if a client forgot to stuff it)."""
    return CRLF.join([
        b"From: Sender <sender@client.test>",
        b"To: <alice@peer.test>",
        b"Subject: " + subject.encode(),
        b"X-Folded: first part",
        b"\tsecond part",
        b"",
        b"first line",
        b".",
        b"..",
        b".leading dot",
        b"..two leading dots",
        b"trailing space   ",
        b"\ttab first",
        b"",
        b"last line",
    ]) + CRLF


def dot_content(subject):
    """Lines starting with "." everywhere, a "." line in the middle and as the last line."""
    return CRLF.join([
        b"Subject: " + subject.encode(),
        b"",
        b".",
        b".first",
        b"middle",
        b"..",
        b"...three",
        b". space after the dot",
        b".",
        b"",
        b".",
    ]) + CRLF


def eight_bit_content(subject):
    body = bytes(range(0x80, 0x100))
    return (b"Subject: " + subject.encode() + b"\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: text/plain; charset=iso-8859-1\r\n"
            b"Content-Transfer-Encoding: 8bit\r\n\r\n"
            + body[:64] + CRLF + body[64:] + CRLF + "Grüße, ½ €\r\n".encode())


def big_content(size=2 * 1024 * 1024):
    """About size octets in 78-octet lines, every 37th starting with ".", each numbered (a lost,
    doubled or reordered line shows)."""
    out = [b"Subject: two megabytes\r\n\r\n"]
    n, total = 0, 0
    while total < size:
        line = (b"." if n % 37 == 0 else b"") + b"%08d " % n + b"0123456789abcdefghij" * 3
        out.append(line + CRLF)
        total += len(line) + 2
        n += 1
    return b"".join(out)


def normalised(content):
    """What --line-ending normalise (the default) sends for content: each bare CR and bare LF
    as CRLF, and a final CRLF when it lacks one."""
    out = re.sub(rb"\r\n|\r|\n", CRLF, content)
    return out if out.endswith(CRLF) else out + CRLF


def dot_stuffed(content):
    """content as DATA must carry it (RFC 5321 section 4.5.2): "." before every line starting
    with ".", then ".CRLF"."""
    lines = content.split(CRLF)
    assert lines[-1] == b""
    return CRLF.join((b"." + l if l.startswith(b".") else l) for l in lines[:-1]) + CRLF + b".\r\n"


# ------------------------------------------------------------------------------------------------
# smtpe-send and what it printed
# ------------------------------------------------------------------------------------------------
class Result:
    """One run of smtpe-send: rc, out, err, and lines [(N, RECIPIENT, OUTCOME, CODE, ENHANCED,
    TEXT)] parsed from its standard output (every line must be an outcome line)."""

    def __init__(self, argv, proc):
        self.argv = argv
        self.rc = proc.returncode
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")
        self.lines = []
        for l in self.out.splitlines():
            m = LINE.match(l)
            if not m:
                raise AssertionError("not an outcome line: %r\n%r" % (l, self))
            self.lines.append((int(m.group(1)), m.group(2), m.group(3), int(m.group(4)),
                               m.group(5), m.group(6)))

    def __repr__(self):
        return "%s\nexit %d\nstdout:\n%s\nstderr:\n%s" % (
            " ".join(self.argv), self.rc, self.out, self.err)


# ------------------------------------------------------------------------------------------------
# A recording relay
# ------------------------------------------------------------------------------------------------
class Relay:
    """A TCP listener on 127.0.0.1 (server: its address for --server) that forwards each
    connection to an Endpoint of a peer and records, per connection, the octets the client sent
    and for each piece read from the client how many final reply lines ("NNN " lines) the
    server had sent before it (counted before they are passed on: a client cannot have seen
    more). sessions() waits until every connection has ended."""

    FINAL = re.compile(rb"^\d{3}(?: |$)")

    class Conn:
        def __init__(self):
            self.sent = bytearray()   # client to server
            self.pieces = []          # [(offset in sent, final replies passed on before it)]
            self.finals = 0
            self.partial = b""        # the server's unfinished reply line

    def __init__(self, ep):
        self.ep = ep
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.lsock.settimeout(0.1)
        self.server = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.conns = []
        self.pumps = []
        self.socks = []
        self.stopping = False
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            c.settimeout(None)
            try:
                s = self.ep.connect()
            except OSError:
                c.close()  # the client sees the connection end: its test fails
                continue
            s.settimeout(None)
            conn = self.Conn()
            self.conns.append(conn)
            self.socks += [c, s]
            for src, dst, up in ((c, s, True), (s, c, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, conn, up), daemon=True)
                t.start()
                self.pumps.append(t)

    def _pump(self, src, dst, conn, up):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if up:
                    conn.pieces.append((len(conn.sent), conn.finals))
                    conn.sent += data
                else:
                    lines = (conn.partial + data).split(CRLF)
                    conn.partial = lines.pop()
                    conn.finals += sum(1 for l in lines if self.FINAL.match(l))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def sessions(self, timeout=10.0):
        """[Conn] once each has ended (both directions closed)."""
        deadline = time.monotonic() + timeout
        for t in list(self.pumps):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise AssertionError("relay: a connection is still open after %.0f s" % timeout)
        return list(self.conns)

    def close(self):
        self.stopping = True
        self.accepter.join()
        self.lsock.close()
        for s in self.socks:
            s.close()


def replies_before(conn, offset):
    """How many final replies the server had sent when the client's octet at offset came."""
    n = 0
    for start, finals in conn.pieces:
        if start > offset:
            break
        n = finals
    return n


def commands(sent):
    """The client's octets of one session as [(command line, payload, offset)]: payload is the
    chunk of a BDAT, the content of a DATA up to and with its ".CRLF" (the client sends it
    after a 354, which every session recorded here gets), else None; offset: where the line
    starts in sent."""
    out = []
    i = 0
    while i < len(sent):
        j = sent.find(CRLF, i)
        if j < 0:
            raise AssertionError("unterminated command at octet %d: %r" % (i, sent[i:i + 80]))
        line, start, i = sent[i:j], i, j + 2
        verb = line.split(b" ", 1)[0].upper()
        payload = None
        if verb == b"BDAT":
            n = int(line.split()[1])
            payload, i = sent[i:i + n], i + n
            if len(payload) < n:
                raise AssertionError("BDAT %d with %d octets after it" % (n, len(payload)))
        elif verb == b"DATA":
            k = sent.find(b"\r\n.\r\n", i - 2)
            if k < 0:
                raise AssertionError("DATA content without its end: %r" % sent[i:i + 80])
            payload, i = sent[i:k + 5], k + 5
        out.append((line, payload, start))
    return out


def parameters(line):
    """The parameters of a MAIL or RCPT line: {KEYWORD (upper case): value or True}."""
    rest = line.split(b">", 1)[1].decode("utf-8")
    out = {}
    for word in rest.split():
        k, eq, v = word.partition("=")
        out[k.upper()] = v if eq else True
    return out


# ------------------------------------------------------------------------------------------------
# The tests every peer gets
# ------------------------------------------------------------------------------------------------
class SendPeerTests:
    """Mixed into one unittest.TestCase per peer: PEER (a peers class), ARGS (its keyword
    arguments). One instance per class; the store is cleared before each test."""

    PEER = None
    ARGS = {}
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.peer = cls.PEER(**cls.ARGS)
        cls.peer.start()

    @classmethod
    def tearDownClass(cls):
        cls.peer.stop()

    def setUp(self):
        self.peer.clear()

    # helpers ---------------------------------------------------------------------------------
    def main_ep(self, protocol=None):
        """The peer's TCP endpoint without TLS for protocol (default: its main one)."""
        protocol = protocol or self.peer.endpoints[0].protocol
        return next(e for e in self.peer.endpoints if e.protocol == protocol and
                    e.transport == "tcp" and e.tls != "implicit")

    def protocols(self):
        return sorted({e.protocol for e in self.peer.endpoints})

    def rcpt(self, local="alice"):
        return self.peer.address(local)

    def refused_local(self):
        """A local part the peer refuses at RCPT with 550 5.1.1."""
        return "nosuchuser" if self.peer.name == "dovecot" else "reject-me"

    def send(self, ep, rcpts, content, *extra, tls="none", auth=False, sender=SENDER, rc=0,
             server=None, password=None):
        """Runs smtpe-send to endpoint ep (or server, a relay's address, speaking ep's
        protocol) with content on its standard input; tls: the --tls mode (required and
        implicit add --tls-ca, and --tls-servername over a unix socket; None: no --tls, the
        default); auth: AUTH as the peer's user (True) with a mechanism (a name) or the best
        offered, with the peer's password unless password is given. Checks the exit status
        (rc; None: any) and that no sanitizer spoke; returns the Result."""
        argv = [SEND, "--server", server or ep.server, "--helo", HELO, "--from", sender]
        for r in rcpts:
            argv += ["--to", r]
        if ep.protocol == "lmtp":
            argv.append("--lmtp")
        if tls is not None:
            argv += ["--tls", tls]
        if tls != "none":
            argv += ["--tls-ca", self.peer.ca_file]
            if ep.transport == "unix":
                argv += ["--tls-servername", self.peer.tls_name]
        env = dict(os.environ)
        env.pop("SMTPE_PASSWORD", None)
        if auth:
            argv += ["--auth-user", self.peer.auth_user]
            env["SMTPE_PASSWORD"] = password or self.peer.auth_password
            if auth is not True:
                argv += ["--auth-mechanism", auth]
        argv += list(extra)
        p = subprocess.run(argv, input=content, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout=ts.bound(60))
        r = Result(argv, p)
        for mark in ts.SANITIZER_MARKS:
            self.assertNotIn(mark, r.err, "sanitizer report from smtpe-send:\n%r" % r)
        if rc is not None:
            self.assertEqual(r.rc, rc, "%r\n%s" % (r, self.peer.log_text(20)))
        return r

    def enhanced_ok(self, line, want):
        """line's ENHANCED and TEXT against want (an enhanced code, or None: any of the reply's
        class): ENHANCED when the peer advertises ENHANCEDSTATUSCODES; otherwise "-", and the
        code, if the server still wrote one, is part of TEXT."""
        if "ENHANCEDSTATUSCODES" in self.peer.extensions:
            if want is None:
                self.assertRegex(line[4], r"^%d\.\d{1,3}\.\d{1,3}$" % (line[3] // 100), line)
            else:
                self.assertEqual(line[4], want, line)
        else:
            self.assertEqual(line[4], "-", line)
            if want is not None:
                self.assertTrue(line[5].startswith(want + " "), line)

    def assert_lines(self, r, want):
        """want: [(N, RECIPIENT, OUTCOME, CODE, ENHANCED or None)], in order."""
        self.assertEqual([l[:4] for l in r.lines], [w[:4] for w in want], r)
        for l, w in zip(r.lines, want):
            if w[2] != "unknown" and w[3] != 0:
                self.enhanced_ok(l, w[4])

    def delivered(self, rcpts, n=1):
        return [(i, a, "delivered", 250, None) for i in range(1, n + 1) for a in rcpts]

    def round_trip(self, ep, content, rcpts=None, *extra, tls="none", auth=False,
                   sender=SENDER, server=None, stored=None):
        """Sends, expects every recipient delivered (exit 0) and exactly that delivery in the
        store (stored: the content expected there, default content), with the TLS and AUTH
        state the server recorded. Returns (Result, entries)."""
        rcpts = rcpts or [self.rcpt()]
        r = self.send(ep, rcpts, content, *extra, tls=tls, auth=auth, sender=sender,
                      server=server)
        self.assert_lines(r, self.delivered(rcpts))
        self.assertEqual(r.err, "", r)
        got = self.peer.assert_delivered(content if stored is None else stored, sender,
                                         rcpts, tls=tls != "none",
                                         auth=self.peer.auth_user if auth else False)
        for m in got:
            self.assert_session(m, ep if server is None else None)
        return r, got

    def assert_session(self, m, ep):
        """What the store says of the session: the EHLO/LHLO name, and for the envelope peers
        the listener (ep's name; None: not checked) and the protocol."""
        if m.meta:
            self.assertEqual(m.meta["helo"], HELO, m.meta)
            if ep is not None:
                self.assertEqual(m.meta["listener"], ep.name, m.meta)
                self.assertEqual(m.meta["protocol"], ep.protocol, m.meta)
        else:
            received = m.added[-1]
            self.assertTrue(received.startswith(b"Received: from " + HELO.encode()), received)
            if ep is not None and ep.protocol == "lmtp":
                self.assertIn(b" with LMTP", received)

    def relay(self, protocol=None):
        r = Relay(self.main_ep(protocol))
        self.addCleanup(r.close)
        return r

    def wire(self, relay, offsets=False):
        """The one session the relay saw, as commands() without the offsets (offsets: as
        (Conn, commands()))."""
        got = relay.sessions()
        self.assertEqual(len(got), 1, "sessions through the relay: %d" % len(got))
        cmds = commands(bytes(got[0].sent))
        return (got[0], cmds) if offsets else [(l, p) for l, p, _ in cmds]

    def lines_of(self, cmds, verb):
        return [(l, p) for l, p in cmds if l.split(b" ", 1)[0].upper() == verb]

    def assert_content_on_wire(self, cmds, content, bdat):
        """The content went as BDAT chunks joined to content, the last with LAST, and no DATA
        (bdat) or as one DATA, dot-stuffed exactly, and no BDAT."""
        datas, bdats = self.lines_of(cmds, b"DATA"), self.lines_of(cmds, b"BDAT")
        if bdat:
            self.assertEqual(datas, [], "DATA sent with CHUNKING")
            self.assertTrue(bdats, "no BDAT: %r" % [l for l, _ in cmds])
            self.assertEqual(b"".join(p for _, p in bdats), content)
            self.assertTrue(bdats[-1][0].upper().endswith(b" LAST"), bdats[-1][0])
            self.assertFalse(any(l.upper().endswith(b" LAST") for l, _ in bdats[:-1]))
        else:
            self.assertEqual(bdats, [], "BDAT sent")
            self.assertEqual(len(datas), 1, [l for l, _ in cmds])
            self.assertEqual(datas[0][1], dot_stuffed(content))

    def envelope_of(self, cmds):
        """(MAIL parameters, [RCPT parameters]) of the one transaction in cmds."""
        mails = self.lines_of(cmds, b"MAIL")
        self.assertEqual(len(mails), 1, mails)
        return parameters(mails[0][0]), [parameters(l) for l, _ in self.lines_of(cmds, b"RCPT")]

    def has_chunking(self):
        return "CHUNKING" in self.peer.extensions

    # endpoints, TLS, AUTH --------------------------------------------------------------------
    def test_plain_endpoints(self):
        """Every endpoint that is not implicit TLS, with --tls none: stored without TLS and
        without AUTH."""
        eps = [e for e in self.peer.endpoints if e.tls != "implicit"]
        self.assertTrue(any(e.transport == "unix" for e in eps), eps)
        for ep in eps:
            self.peer.clear()
            self.round_trip(ep, basic_content("plain " + ep.name))

    def test_starttls_required(self):
        """Every STARTTLS endpoint (TCP: the certificate's IP address; unix: its name), with
        --tls required and AUTH where offered: stored as over TLS, authenticated."""
        eps = [e for e in self.peer.endpoints if e.tls == "starttls"]
        self.assertTrue(eps or "STARTTLS" not in self.peer.extensions)
        for ep in eps:
            self.peer.clear()
            self.round_trip(ep, basic_content("starttls " + ep.name), tls="required",
                            auth=bool(self.peer.auth_user))

    def test_implicit_tls(self):
        eps = [e for e in self.peer.endpoints if e.tls == "implicit"]
        self.assertTrue(eps, "%s has no implicit TLS endpoint" % self.peer.name)
        for ep in eps:
            self.peer.clear()
            self.round_trip(ep, basic_content("implicit " + ep.name), tls="implicit",
                            auth=bool(self.peer.auth_user))

    def test_opportunistic_tls_used(self):
        """No --tls (opportunistic) with --tls-ca: the STARTTLS offered is taken."""
        ep = self.main_ep()
        r = self.send(ep, [self.rcpt()], basic_content("opportunistic"), tls=None)
        self.assert_lines(r, self.delivered([self.rcpt()]))
        self.peer.assert_delivered(basic_content("opportunistic"), SENDER, [self.rcpt()],
                                   tls=True, auth=False)

    def test_certificate_checked(self):
        """Another CA than the peer's, on every TLS endpoint and with --tls opportunistic too
        (README: the certificate is checked in every mode): the TLS handshake fails, nothing
        is delivered, every recipient temporary with code 000 (exit 75), the reason on
        stderr."""
        other = os.path.join(self.peer.dir, "other-ca")
        os.makedirs(other, exist_ok=True)
        cert, _ = peers.make_certificate(other)
        for ep, mode in [(e, "implicit" if e.tls == "implicit" else "required")
                         for e in self.peer.endpoints if e.tls] + [
                             (self.main_ep(), "opportunistic")]:
            argv = ["--tls", mode, "--tls-ca", cert] + (
                ["--tls-servername", self.peer.tls_name] if ep.transport == "unix" else [])
            r = self.send(ep, [self.rcpt()], basic_content("bad ca"), *argv, rc=75)
            self.assertEqual([l[:4] for l in r.lines], [(1, self.rcpt(), "temporary", 0)], r)
            self.assertIn("certificate", r.err.lower(), r)
        time.sleep(peers.SETTLE if self.peer.asynchronous else 0)
        self.assertEqual(self.peer.messages(), [])

    def test_auth_each_mechanism(self):
        """AUTH with each mechanism the peer offers (--auth-mechanism), over STARTTLS; and
        without TLS through the relay with --auth-plaintext-ok, where the AUTH line shows the
        mechanism."""
        p = self.peer
        if not p.auth_user:
            return self.assertNotIn("AUTH", p.extensions)
        for mech in p.auth_mechanisms:
            p.clear()
            self.round_trip(self.main_ep(), basic_content("auth " + mech), tls="required",
                            auth=mech)
            p.clear()
            relay = self.relay()
            self.round_trip(self.main_ep(), basic_content("auth plain-text " + mech), None,
                            "--auth-plaintext-ok", auth=mech, server=relay.server)
            auths = [l for l, _ in self.wire(relay) if l.upper().startswith(b"AUTH ")]
            self.assertEqual(len(auths), 1, auths)
            self.assertEqual(auths[0].split()[1].upper(), mech.encode(), auths)

    def test_auth_refused_without_tls(self):
        """--auth-user over a plain connection without --auth-plaintext-ok: the session ends
        before any credential octet (smtpe.h: AUTH wanted but impossible, the recipients
        temporary, code 000, exit 75): no AUTH command, no password on the wire, no mail."""
        p = self.peer
        if not p.auth_user:
            return
        relay = self.relay()
        r = self.send(self.main_ep(), [self.rcpt()], basic_content("no plaintext auth"),
                      auth=True, server=relay.server, rc=75)
        self.assertEqual([l[:5] for l in r.lines], [(1, self.rcpt(), "temporary", 0, "-")], r)
        self.assertIn("AUTH without TLS", r.lines[0][5], r)
        sent = b"".join(bytes(c.sent) for c in relay.sessions())
        self.assertNotIn(b"AUTH", sent.upper())
        self.assertNotIn(p.auth_password.encode(), sent)
        time.sleep(peers.SETTLE if p.asynchronous else 0)
        self.assertEqual(p.messages(), [])

    def test_auth_wrong_password(self):
        """A wrong password: the server's 535 ends the session before MAIL (smtpe.h: no
        fallback, the recipients temporary), exit 75; through the relay (plain text allowed)
        no MAIL is seen; nothing stored."""
        p = self.peer
        if not p.auth_user:
            return
        relay = self.relay()
        r = self.send(self.main_ep(), [self.rcpt()], basic_content("wrong password"),
                      "--auth-plaintext-ok", auth=True, password="not-" + p.auth_password,
                      server=relay.server, rc=75)
        self.assert_lines(r, [(1, self.rcpt(), "temporary", 535, "5.7.8")])
        self.assertIn("authentication failed", r.err)
        verbs = [l.split(b" ", 1)[0].upper() for l, _ in self.wire(relay)]
        self.assertIn(b"AUTH", verbs)
        self.assertEqual([v for v in verbs if v in (b"MAIL", b"RCPT", b"DATA", b"BDAT")], [])
        time.sleep(peers.SETTLE if p.asynchronous else 0)
        self.assertEqual(p.messages(), [])

    # recipients ------------------------------------------------------------------------------
    def test_null_reverse_path(self):
        """--from "": MAIL FROM:<> on the wire, stored with the null reverse-path."""
        relay = self.relay()
        self.round_trip(self.main_ep(), basic_content("null path"), None, sender="",
                        server=relay.server)
        mails = [l for l, _ in self.lines_of(self.wire(relay), b"MAIL")]
        self.assertEqual(len(mails), 1)
        self.assertTrue(mails[0].upper().startswith(b"MAIL FROM:<> ") or
                        mails[0].upper() == b"MAIL FROM:<>", mails)

    def test_refused_recipient(self):
        """alice, a recipient refused with 550 5.1.1, bob: the refused one permanent with the
        server's code, the others delivered (exit 69); the message stored for those two."""
        for proto in self.protocols():
            self.peer.clear()
            ep = self.main_ep(proto)
            rcpts = [self.rcpt("alice"), self.rcpt(self.refused_local()), self.rcpt("bob")]
            content = basic_content("refused recipient " + proto)
            r = self.send(ep, rcpts, content, rc=69)
            self.assert_lines(r, [(1, rcpts[0], "delivered", 250, None),
                                  (1, rcpts[1], "permanent", 550, "5.1.1"),
                                  (1, rcpts[2], "delivered", 250, None)])
            self.peer.assert_delivered(content, SENDER, [rcpts[0], rcpts[2]])

    def test_deferred_recipient(self):
        """A recipient deferred with 450 4.2.1 among delivered ones: temporary, exit 75."""
        if self.peer.name == "dovecot":
            return  # no such rule (peers.py): its refusals are its user list and quota
        for proto in self.protocols():
            self.peer.clear()
            ep = self.main_ep(proto)
            rcpts = [self.rcpt("defer-me"), self.rcpt("alice"), self.rcpt("reject-too")]
            content = basic_content("deferred recipient " + proto)
            r = self.send(ep, rcpts, content, rc=75)
            self.assert_lines(r, [(1, rcpts[0], "temporary", 450, "4.2.1"),
                                  (1, rcpts[1], "delivered", 250, None),
                                  (1, rcpts[2], "permanent", 550, "5.1.1")])
            self.peer.assert_delivered(content, SENDER, [rcpts[1]])

    def test_every_recipient_refused(self):
        """Only refused recipients: each permanent 550 (exit 69), nothing stored. Over DATA no
        content goes (DATA is refused); a pipelined BDAT may carry it (RFC 3030 section 4.2),
        and its refusal changes no outcome."""
        rcpts = [self.rcpt(self.refused_local()), self.rcpt(self.refused_local() + "2")]
        for chunking in ("never", "auto"):
            content = basic_content("all refused " + chunking)
            relay = self.relay()
            r = self.send(self.main_ep(), rcpts, content, "--chunking", chunking,
                          server=relay.server, rc=69)
            self.assert_lines(r, [(1, a, "permanent", 550, "5.1.1") for a in rcpts])
            (conn,) = relay.sessions()
            if chunking == "never" or not self.has_chunking():
                self.assertNotIn(b"Subject: all refused", bytes(conn.sent))
        time.sleep(peers.SETTLE if self.peer.asynchronous else 0)
        self.assertEqual(self.peer.messages(), [])

    # transactions and contents ---------------------------------------------------------------
    def test_three_messages(self):
        """--messages 3 with two recipients: three transactions on one connection, each
        stored, the lines numbered 1 to 3."""
        rcpts = [self.rcpt("alice"), self.rcpt("bob")]
        content = basic_content("three messages")
        relay = self.relay()
        r = self.send(self.main_ep(), rcpts, content, "--messages", "3", server=relay.server)
        self.assert_lines(r, self.delivered(rcpts, 3))
        self.assertEqual(len(self.lines_of(self.wire(relay), b"MAIL")), 3)
        per_rcpt = isinstance(self.peer, peers.MaildirPeer)
        got = self.peer.wait_messages(3 * len(rcpts) if per_rcpt else 3)
        for m in got:
            peers.assert_same_octets(m.content, content, "%s: %s" % (self.peer.name, m.path))
            self.assertEqual(m.mail_from, SENDER)
        if per_rcpt:
            self.assertEqual(sorted(m.rcpt_tos[0] for m in got), sorted(rcpts * 3))
        else:
            self.assertEqual([m.rcpt_tos for m in got], [rcpts] * 3)

    def test_pipelining_as_offered(self):
        """Three recipients, --messages 2, through the relay: without PIPELINING (aiosmtpd)
        every command and every content goes only after the reply to what came before it (RFC
        5321 section 4.1.1); with it, the RCPTs go before the MAIL's reply (RFC 2920)."""
        rcpts = [self.rcpt("alice"), self.rcpt("bob"), self.rcpt("carol")]
        content = basic_content("pipelining")
        relay = self.relay()
        r = self.send(self.main_ep(), rcpts, content, "--messages", "2", "--chunking", "never",
                      server=relay.server)
        self.assert_lines(r, self.delivered(rcpts, 2))
        conn, cmds = self.wire(relay, offsets=True)
        # the units that each get one reply: every command, and a DATA's content after its 354
        units = []
        for line, payload, start in cmds:
            units.append((line, start))
            if payload is not None and line.upper() == b"DATA":
                units.append((b"(content)", start + len(line) + 2))
        early = [(line, replies_before(conn, start), k + 1)
                 for k, (line, start) in enumerate(units) if replies_before(conn, start) < k + 1]
        if "PIPELINING" in self.peer.extensions:
            self.assertTrue(any(l.upper().startswith(b"RCPT") for l, _, _ in early),
                            "nothing pipelined: %r" % units)
        else:
            self.assertEqual(early, [], "sent before the reply it had to wait for "
                             "(line, replies seen, replies due)")
        self.peer.wait_messages(2 * len(rcpts) if isinstance(self.peer, peers.MaildirPeer)
                                else 2)

    def test_dot_lines(self):
        """Lines starting with ".", a "." line in the middle and last: over DATA (stuffed
        exactly on the wire) and, where CHUNKING is offered, BDAT (as they are)."""
        for chunking in ("never", "auto"):
            for content in (basic_content("dots " + chunking), dot_content("dots " + chunking)):
                self.peer.clear()
                relay = self.relay()
                self.round_trip(self.main_ep(), content, None, "--chunking", chunking,
                                server=relay.server)
                self.assert_content_on_wire(self.wire(relay), content,
                                            chunking == "auto" and self.has_chunking())

    def test_line_ends_normalised(self):
        """Bare LF and bare CR and no final CRLF in the message: sent as CRLF (the default
        --line-ending normalise), over DATA and BDAT where offered; the stores that keep a bare
        CR or LF (aiosmtpd, smtp-server; Dovecot a bare CR) hold CRLF."""
        msg = (b"Subject: line ends\nX-A: b\r\n\nbare lf\nbare cr\r.dot after cr\r\n"
               b"\r.dot after a bare cr line\nno final crlf")
        content = normalised(msg)
        for chunking in ("never", "auto"):
            self.peer.clear()
            relay = self.relay()
            self.round_trip(self.main_ep(), msg, None, "--chunking", chunking,
                            server=relay.server, stored=content)
            self.assert_content_on_wire(self.wire(relay), content,
                                        chunking == "auto" and self.has_chunking())

    def test_long_lines(self):
        """A line of 1000 octets with its CRLF, starting with "." (1001 once stuffed): sent by
        DATA and stored. A line of 10 000 octets: over BDAT where CHUNKING is offered (and the
        server takes it: Postfix, Dovecot), else refused locally before MAIL (5.6.0, code 000,
        exit 65, no MAIL sent: go-smtp would stall on it, peers.py)."""
        line = b"." + b"x" * 997 + CRLF
        self.assertEqual(len(line), 1000)
        content = b"Subject: 1000 octets\r\n\r\n" + line + b"end\r\n"
        relay = self.relay()
        self.round_trip(self.main_ep(), content, None, "--chunking", "never",
                        server=relay.server)
        self.assert_content_on_wire(self.wire(relay), content, False)
        long_content = b"Subject: long\r\n\r\n" + b"y" * 9998 + CRLF + b"end\r\n"
        for chunking in ("never", "auto"):
            self.peer.clear()
            relay = self.relay()
            if chunking == "auto" and self.has_chunking():
                self.round_trip(self.main_ep(), long_content, None, "--chunking", chunking,
                                server=relay.server)
                self.assert_content_on_wire(self.wire(relay), long_content, True)
                continue
            r = self.send(self.main_ep(), [self.rcpt()], long_content, "--chunking", chunking,
                          server=relay.server, rc=65)
            self.assertEqual([l[:5] for l in r.lines],
                             [(1, self.rcpt(), "permanent", 0, "5.6.0")], r)
            self.assertEqual(self.lines_of(self.wire(relay), b"MAIL"), [])
            time.sleep(peers.SETTLE if self.peer.asynchronous else 0)
            self.assertEqual(self.peer.messages(), [])

    def test_two_megabytes(self):
        content = big_content()
        self.assertGreater(len(content), 2 * 1024 * 1024)
        for chunking in ("never", "auto") if self.has_chunking() else ("auto",):
            self.peer.clear()
            relay = self.relay()
            self.round_trip(self.main_ep(), content, None, "--chunking", chunking,
                            server=relay.server)
            cmds = self.wire(relay)
            self.assert_content_on_wire(cmds, content, chunking == "auto" and
                                        self.has_chunking())
            mail, _ = self.envelope_of(cmds)
            if "SIZE" in self.peer.extensions:
                self.assertGreaterEqual(int(mail["SIZE"]), len(content), mail)

    def test_eight_bit(self):
        """8-bit content with --body auto: MAIL carries BODY=8BITMIME; stored as sent. 7-bit
        content: no BODY=8BITMIME."""
        self.assertIn("8BITMIME", self.peer.extensions)
        for content, body in ((eight_bit_content("eight bit"), "8BITMIME"),
                              (basic_content("seven bit"), None)):
            self.peer.clear()
            relay = self.relay()
            _, got = self.round_trip(self.main_ep(), content, None, "--body", "auto",
                                     server=relay.server)
            mail, _ = self.envelope_of(self.wire(relay))
            self.assertEqual(mail.get("BODY", "7BIT").upper(), body or "7BIT", mail)
            if got[0].meta and self.peer.name != "go-smtp":  # go-smtp 0.12 does not report BODY
                self.assertEqual(got[0].meta["mail_args"].get("BODY", "7BIT").upper(),
                                 body or "7BIT", got[0].meta)

    def test_smtputf8(self):
        """A non-ASCII reverse-path and forward-path: MAIL with SMTPUTF8, stored with both
        addresses as sent (Postfix: the jörg mailbox). Where SMTPUTF8 is not offered (Dovecot),
        refused locally before MAIL: permanent 000, exit 65, nothing sent after EHLO."""
        sender = "séndér@clïent.test"
        rcpt = self.rcpt(peers.UTF8_MAILBOX)
        content = "Subject: ünïcödé\r\nFrom: séndér@clïent.test\r\n\r\nGrüße\r\n".encode()
        relay = self.relay()
        if "SMTPUTF8" not in self.peer.extensions:
            r = self.send(self.main_ep(), [rcpt], content, sender=sender, server=relay.server,
                          rc=65)
            self.assertEqual([l[:4] for l in r.lines], [(1, rcpt, "permanent", 0)], r)
            self.assertEqual(self.lines_of(self.wire(relay), b"MAIL"), [])
            self.assertEqual(self.peer.messages(), [])
            return
        _, got = self.round_trip(self.main_ep(), content, [rcpt], sender=sender,
                                 server=relay.server)
        mail, _ = self.envelope_of(self.wire(relay))
        self.assertIs(mail.get("SMTPUTF8"), True, mail)
        self.assertEqual(got[0].rcpt_tos, [rcpt])
        if got[0].meta:
            self.assertTrue(got[0].meta["smtputf8"], got[0].meta)

    def test_dsn_parameters(self):
        """--notify, --orcpt, --ret, --envid: on the MAIL and RCPT lines (ENVID and ORCPT as
        xtext) where the server offers DSN, left out where it does not; delivered either way.
        The envelope peers' own record of them is checked too."""
        args = ["--notify", "SUCCESS,FAILURE", "--orcpt", "rfc822;Orig+Alice@peer.test",
                "--ret", "hdrs", "--envid", "env+id=1"]
        relay = self.relay()
        content = basic_content("dsn")
        _, got = self.round_trip(self.main_ep(), content, None, *args, server=relay.server)
        mail, rcpts = self.envelope_of(self.wire(relay))
        if "DSN" in self.peer.extensions:
            self.assertEqual((mail.get("RET"), mail.get("ENVID")), ("HDRS", "env+2Bid+3D1"),
                             mail)
            self.assertEqual(len(rcpts), 1)
            self.assertEqual(rcpts[0].get("NOTIFY"), "SUCCESS,FAILURE", rcpts)
            self.assertEqual(rcpts[0].get("ORCPT"), "rfc822;Orig+2BAlice@peer.test", rcpts)
        else:
            for k in ("RET", "ENVID"):
                self.assertNotIn(k, mail)
            for k in ("NOTIFY", "ORCPT"):
                self.assertNotIn(k, rcpts[0])
        meta = got[0].meta
        if meta and "DSN" in self.peer.extensions:
            self.assertEqual(meta["mail_args"].get("RET"), "HDRS", meta)
            self.assertEqual(meta["rcpt_args"][0].get("NOTIFY"), "SUCCESS,FAILURE", meta)
        elif meta:
            self.assertNotIn("RET", meta["mail_args"])

    def test_bdat_or_data(self):
        """--chunking never: DATA; auto: BDAT where CHUNKING is offered, else DATA. Two
        recipients; the content stored exactly each time."""
        rcpts = [self.rcpt("alice"), self.rcpt("carol")]
        for chunking in ("never", "auto"):
            self.peer.clear()
            relay = self.relay()
            content = basic_content("chunking " + chunking)
            self.round_trip(self.main_ep(), content, rcpts, "--chunking", chunking,
                            server=relay.server)
            self.assert_content_on_wire(self.wire(relay), content,
                                        chunking == "auto" and self.has_chunking())

    def test_refused_after_content(self):
        """SMTP: datafail (554) and datadefer (451) refuse the whole transaction after the
        content: every recipient permanent (69) or temporary (75); nothing stored. Postfix
        applies these to a one-recipient transaction only (peers.py)."""
        if "smtp" not in self.protocols():
            return
        for local, code, outcome, rc in (("datafail", 554, "permanent", 69),
                                         ("datadefer", 451, "temporary", 75)):
            rcpts = [self.rcpt(local)] + ([] if self.peer.name == "postfix" else
                                          [self.rcpt("alice")])
            for chunking in ("never", "auto"):
                r = self.send(self.main_ep("smtp"), rcpts, basic_content(local), "--chunking",
                              chunking, rc=rc)
                self.assert_lines(r, [(1, a, outcome, code, None) for a in rcpts])
                if self.peer.name == "postfix":
                    self.assertEqual(r.lines[0][4], "5.6.0" if code == 554 else "4.3.0", r)
        time.sleep(peers.SETTLE if self.peer.asynchronous else 0)
        self.assertEqual(self.peer.messages(), [])


class LmtpTests:
    """For peers with LMTP: one reply per recipient after the content (RFC 2033 section 4.2)."""

    DATAFAIL = (554, None)   # the reply to datafail after the content

    def test_lmtp_per_recipient_outcomes(self):
        """alice, datafail, bob over every LMTP endpoint (DATA and, where offered, BDAT):
        datafail refused after the content for itself only, alice and bob delivered (exit 69);
        the message stored for those two."""
        code, enh = self.DATAFAIL
        eps = [e for e in self.peer.endpoints if e.protocol == "lmtp"]
        self.assertTrue(eps)
        for ep in eps:
            for chunking in ("never", "auto"):
                self.peer.clear()
                rcpts = [self.rcpt("alice"), self.rcpt("datafail"), self.rcpt("bob")]
                content = basic_content("lmtp %s %s" % (ep.name, chunking))
                tls = {"starttls": "required", "implicit": "implicit"}.get(ep.tls, "none")
                r = self.send(ep, rcpts, content, "--chunking", chunking, tls=tls, rc=69)
                self.assert_lines(r, [(1, rcpts[0], "delivered", 250, None),
                                      (1, rcpts[1], "permanent", code, enh),
                                      (1, rcpts[2], "delivered", 250, None)])
                self.peer.assert_delivered(content, SENDER, [rcpts[0], rcpts[2]],
                                           tls=tls != "none")

    def test_lmtp_deferred_after_content(self):
        """datadefer under LMTP (the envelope peers): 451 for it alone, temporary, exit 75."""
        if self.peer.name == "dovecot":
            return
        ep = self.main_ep("lmtp")
        rcpts = [self.rcpt("datadefer"), self.rcpt("alice")]
        content = basic_content("lmtp datadefer")
        r = self.send(ep, rcpts, content, rc=75)
        self.assert_lines(r, [(1, rcpts[0], "temporary", 451, None),
                              (1, rcpts[1], "delivered", 250, None)])
        self.peer.assert_delivered(content, SENDER, [rcpts[1]])

    def test_lmtp_three_messages_pipelined(self):
        """--messages 3 over LMTP with a recipient refused after the content each time: the
        reply counts stay in step over the three transactions."""
        ep = self.main_ep("lmtp")
        rcpts = [self.rcpt("datafail"), self.rcpt("carol")]
        content = basic_content("lmtp three")
        code, enh = self.DATAFAIL
        r = self.send(ep, rcpts, content, "--messages", "3", rc=69)
        self.assert_lines(r, [(n, a, o, c, e) for n in (1, 2, 3) for a, o, c, e in
                              ((rcpts[0], "permanent", code, enh),
                               (rcpts[1], "delivered", 250, None))])
        got = self.peer.wait_messages(3)
        for m in got:
            peers.assert_same_octets(m.content, content, m.path)
            self.assertEqual((m.mail_from, m.rcpt_tos), (SENDER, [rcpts[1]]))
            self.assertEqual(m.meta.get("protocol", "lmtp"), "lmtp", m.meta)


# ------------------------------------------------------------------------------------------------
# One class per peer
# ------------------------------------------------------------------------------------------------
class TestPostfix(SendPeerTests, unittest.TestCase):
    PEER = peers.Postfix

    def test_postfix_dsn_read_back(self):
        """DSN against Postfix, from a sender in its own domain (bob): the message delivered to
        alice and Postfix's success DSN (NOTIFY=SUCCESS) in bob's mailbox, with the ENVID and
        the ORCPT as given (Postfix decoded the client's xtext); its log names the DSN. (RET is
        checked on the wire by test_dsn_parameters: Postfix returns the headers only in a
        success DSN whatever RET says.)"""
        p = self.peer
        content = basic_content("postfix dsn")
        args = ["--notify", "SUCCESS,FAILURE", "--orcpt", "rfc822;Orig+Alice@peer.test",
                "--ret", "hdrs", "--envid", "env+id=1"]
        r = self.send(self.main_ep(), [self.rcpt("alice")], content, *args,
                      sender=self.rcpt("bob"))
        self.assert_lines(r, self.delivered([self.rcpt("alice")]))
        got = p.wait_messages(2)
        by = {m.rcpt_tos[0]: m for m in got}
        self.assertEqual(sorted(by), [self.rcpt("alice"), self.rcpt("bob")], got)
        peers.assert_same_octets(by[self.rcpt("alice")].content, content)
        self.assertEqual(by[self.rcpt("alice")].mail_from, self.rcpt("bob"))
        dsn = by[self.rcpt("bob")]
        self.assertEqual(dsn.mail_from, "", dsn.raw[:300])
        text = dsn.content.decode("utf-8", "replace")
        self.assertIn("Original-Envelope-Id: env+id=1", text)
        self.assertRegex(text, r"Original-Recipient: rfc822; ?Orig\+Alice@peer\.test")
        self.assertRegex(text, r"Final-Recipient: rfc822; ?alice@peer\.test")
        self.assertIn("Action: delivered", text)
        self.assertIn("X-Postfix-Sender: rfc822; bob@peer.test", text)
        self.assertIn("Subject: postfix dsn", text)  # the returned header
        self.assertIn("sender delivery status notification", p.log_text(200))

    def test_utf8_mailbox_local_part(self):
        """jörg@peer.test over STARTTLS with AUTH, --smtputf8 given too: in jörg's mailbox."""
        content = "Subject: für jörg\r\n\r\nHallo\r\n".encode()
        _, got = self.round_trip(self.main_ep(), content, [self.rcpt("jörg")], "--smtputf8",
                                 tls="required", auth=True)
        self.assertEqual(got[0].added[1], "Delivered-To: jörg@peer.test\n".encode())

    def test_relay_and_unknown_refused(self):
        """Another domain: 554 5.7.1 (relay access denied); an unknown user of peer.test: 550
        5.1.1; with alice delivered (exit 69)."""
        rcpts = ["someone@elsewhere.test", self.rcpt("nosuchuser"), self.rcpt("alice")]
        content = basic_content("relay")
        r = self.send(self.main_ep(), rcpts, content, rc=69)
        self.assert_lines(r, [(1, rcpts[0], "permanent", 554, "5.7.1"),
                              (1, rcpts[1], "permanent", 550, "5.1.1"),
                              (1, rcpts[2], "delivered", 250, "2.0.0")])
        self.peer.assert_delivered(content, SENDER, [rcpts[2]])


class TestDovecot(SendPeerTests, LmtpTests, unittest.TestCase):
    PEER = peers.Dovecot
    DATAFAIL = (552, "5.2.2")


class TestAiosmtpd(SendPeerTests, unittest.TestCase):
    PEER = peers.Aiosmtpd


class TestGoSmtp(SendPeerTests, LmtpTests, unittest.TestCase):
    PEER = peers.GoSmtp


class TestSmtpServer(SendPeerTests, LmtpTests, unittest.TestCase):
    PEER = peers.SmtpServer


# ------------------------------------------------------------------------------------------------
if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    SEND = os.environ.get("SMTPE_SEND") or os.path.join(here, "..", "..", "build", "smtpe-send")
    for opt in ("--send", "--cache"):
        if opt in sys.argv:
            i = sys.argv.index(opt)
            if opt == "--send":
                SEND = sys.argv[i + 1]
            else:
                peers.set_cache_dir(sys.argv[i + 1])
            del sys.argv[i:i + 2]
    SEND = os.path.abspath(SEND)
    if not os.access(SEND, os.X_OK):
        print("smtpe-send not found or not executable: %s" % SEND, file=sys.stderr)
        print("0 passed, 1 failed")
        sys.exit(1)
    sys.exit(ts.main(sys.modules[__name__]))
