#!/usr/bin/env python3
"""The real-server peers of the client interop tests (peers.py), validated with a real client,
Python's smtplib, so that they are known to be good before smtpe-send is driven through them.

For every peer (Postfix, Dovecot LMTP, aiosmtpd, go-smtp, nodemailer's smtp-server) one private
instance is started per test class; every test delivers through it and reads the message back
from the server's own store: the content must be byte-exact after the peer's documented
normalisation (peers.py: the trace fields the server adds are stripped, an LF-only store is
read as CRLF), the envelope must be the one sent, the replies must be the documented ones.
Transports: TCP, unix socket, STARTTLS (the certificate verified against the peer's ca_file and
name), implicit TLS; AUTH with each mechanism offered (over TLS and without); LMTP with its
per-recipient replies; CHUNKING (BDAT written by hand: smtplib has none); 8BITMIME, SMTPUTF8,
DSN parameters; content with lines starting with "."; a 2 MB message; and a negative control
showing that the comparison fails when one stored octet is changed.

A peer that cannot start fails its tests (tests/deps.sh installs every server); nothing skips.

Usage: test_peers_smtplib.py [--cache DIR] [-k PATTERN ...] [-q]
  --cache DIR   where the go-smtp peer is built (default $SMTPE_PEERS_CACHE, else a directory
                in /tmp); ctest passes one in the build directory.
Only the Python 3 standard library.
"""

import argparse
import os
import smtplib
import socket
import ssl
import sys
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

SAFETY = peers.SAFETY
HELO = "client.test"
SENDER = "sender@client.test"
CRLF = b"\r\n"


# ------------------------------------------------------------------------------------------------
# smtplib over every transport
# ------------------------------------------------------------------------------------------------
class UnixSMTP(smtplib.SMTP):
    """smtplib.SMTP over a unix socket when host is a path (smtplib.LMTP has this, SMTP not)."""

    def connect(self, host="localhost", port=0, source_address=None):
        if not host.startswith("/"):
            return super().connect(host, port, source_address)
        self._host = host
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.file = None
        self.sock.connect(host)
        code, msg = self.getreply()
        return code, msg


class LMTP_SSL(smtplib.LMTP):
    """LMTP over implicit TLS (smtplib has SMTP_SSL only)."""

    def __init__(self, host, port, context, **kw):
        self.context = context
        super().__init__(host, port, **kw)

    def _get_socket(self, host, port, timeout):
        sock = super()._get_socket(host, port, timeout)
        return self.context.wrap_socket(sock, server_hostname=host)


def tls_context(peer):
    """A client context trusting only the peer's certificate, names checked."""
    ctx = ssl.create_default_context(cafile=peer.ca_file)
    ctx.check_hostname = True
    return ctx


def open_client(peer, ep, starttls=False):
    """A connected smtplib client for endpoint ep, EHLO/LHLO done (and STARTTLS then EHLO
    again when starttls). The certificate is verified: 127.0.0.1 for TCP, peer.tls_name for a
    unix socket."""
    kw = dict(local_hostname=HELO, timeout=SAFETY)
    lmtp = ep.protocol == "lmtp"
    if ep.tls == "implicit":
        c = (LMTP_SSL(ep.host, ep.port, tls_context(peer), **kw) if lmtp else
             smtplib.SMTP_SSL(ep.host, ep.port, context=tls_context(peer), **kw))
    elif ep.path:
        c = smtplib.LMTP(ep.path, **kw) if lmtp else UnixSMTP(ep.path, **kw)
    else:
        c = smtplib.LMTP(ep.host, ep.port, **kw) if lmtp else smtplib.SMTP(ep.host, ep.port,
                                                                           **kw)
    code, _ = c.ehlo()
    if code != 250:
        raise AssertionError("%s: EHLO/LHLO answered %d" % (ep, code))
    if starttls:
        if ep.path:
            c._host = peer.tls_name  # the name smtplib checks the certificate against
        c.starttls(context=tls_context(peer))
        code, _ = c.ehlo()
        if code != 250:
            raise AssertionError("%s: EHLO after STARTTLS answered %d" % (ep, code))
    return c


def lmtp_send(c, sender, rcpts, content, mail_options=(), rcpt_options=()):
    """One LMTP transaction by hand (smtplib's sendmail reads one reply after DATA, LMTP sends
    one per accepted recipient, RFC 2033 section 4.2). Returns (rcpt replies, data replies):
    {recipient: (code, text)} for RCPT, and [(recipient, code, text)] after the content, one
    per accepted recipient, in RCPT order."""
    code, text = c.mail(sender, list(mail_options))
    if code != 250:
        raise AssertionError("MAIL answered %d %r" % (code, text))
    at_rcpt, accepted = {}, []
    for r in rcpts:
        at_rcpt[r] = c.rcpt(r, list(rcpt_options))
        if at_rcpt[r][0] == 250:
            accepted.append(r)
    if not accepted:
        c.rset()
        return at_rcpt, []
    code, text = c.data(content)
    out = [(accepted[0], code, text)]
    for r in accepted[1:]:
        code, text = c.getreply()
        out.append((r, code, text))
    return at_rcpt, out


def bdat_send(c, sender, rcpts, chunks, lmtp=False):
    """One transaction with its content in BDAT chunks (RFC 3030), written on smtplib's
    connection; returns the replies to the last BDAT (one, or one per recipient for LMTP)."""
    code, text = c.mail(sender, ["BODY=8BITMIME"])
    if code != 250:
        raise AssertionError("MAIL answered %d %r" % (code, text))
    for r in rcpts:
        code, text = c.rcpt(r)
        if code != 250:
            raise AssertionError("RCPT %s answered %d %r" % (r, code, text))
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        c.send(("BDAT %d%s\r\n" % (len(chunk), " LAST" if last else "")).encode() + chunk)
        if not last:
            code, text = c.getreply()
            if code != 250:
                raise AssertionError("BDAT chunk %d answered %d %r" % (i, code, text))
    return [c.getreply() for _ in (rcpts if lmtp else rcpts[:1])]


# ------------------------------------------------------------------------------------------------
# Contents
# ------------------------------------------------------------------------------------------------
def basic_content(subject):
    """A plain message whose lines exercise dot-stuffing: a line ".", "..", ".x", and a line
    that is ".\r\n" in the middle of the content (the end marker if the client forgot to
    stuff it), trailing white space, a tab, a long header folded."""
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


def eight_bit_content():
    body = bytes(range(0x80, 0x100)).replace(b"\r", b"").replace(b"\n", b"")
    return (b"Subject: eight bit\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: text/plain; charset=iso-8859-1\r\n"
            b"Content-Transfer-Encoding: 8bit\r\n\r\n"
            + body[:64] + CRLF + body[64:] + CRLF + "Grüße, ½ €\r\n".encode())


def big_content(size=2 * 1024 * 1024):
    """A message of about size octets: 76-octet lines, every 37th starting with ".", numbered
    so that a lost, doubled or reordered line shows."""
    out = [b"Subject: two megabytes\r\n\r\n"]
    n, total = 0, 0
    while total < size:
        prefix = b"." if n % 37 == 0 else b""
        line = prefix + (b"%08d " % n) + (b"abcdefghijklmnopqrstuvwxyz0123456789" * 3)[:67]
        out.append(line + CRLF)
        total += len(line) + 2
        n += 1
    return b"".join(out)


# ------------------------------------------------------------------------------------------------
# The tests every peer gets
# ------------------------------------------------------------------------------------------------
class PeerTests:
    """Mixed into one unittest.TestCase per peer: PEER (a peers class) and ARGS (its keyword
    arguments) are set by the subclass."""

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
        self._clients = []

    def tearDown(self):
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass

    # helpers ---------------------------------------------------------------------------------
    def client(self, ep_name=None, starttls=False):
        ep = self.peer.endpoint(ep_name or self.main_endpoint())
        c = open_client(self.peer, ep, starttls=starttls)
        self._clients.append(c)
        return c

    def main_endpoint(self):
        return self.peer.endpoints[0].name

    def rcpt(self, local="alice"):
        return self.peer.address(local)

    def protocol(self, ep_name=None):
        return self.peer.endpoint(ep_name or self.main_endpoint()).protocol

    def deliver(self, c, content, rcpts, sender=SENDER, mail_options=(), rcpt_options=(),
                lmtp=False):
        """Delivers and checks every recipient was accepted and the content too."""
        if lmtp:
            at_rcpt, after = lmtp_send(c, sender, rcpts, content, mail_options, rcpt_options)
            for r, (code, text) in at_rcpt.items():
                self.assertEqual(code, 250, "RCPT %s: %d %r" % (r, code, text))
            self.assertEqual([r for r, _, _ in after], list(rcpts))
            for r, code, text in after:
                self.assertEqual(code, 250, "after the content, %s: %d %r" % (r, code, text))
        else:
            refused = c.sendmail(sender, rcpts, content, list(mail_options), list(rcpt_options))
            self.assertEqual(refused, {})

    def round_trip(self, ep_name=None, starttls=False, content=None, rcpts=None, tls=None,
                   auth=False, sender=SENDER, mail_options=()):
        ep_name = ep_name or self.main_endpoint()
        c = self.client(ep_name, starttls=starttls)
        content = content if content is not None else basic_content(ep_name)
        rcpts = rcpts or [self.rcpt()]
        self.deliver(c, content, rcpts, sender=sender, mail_options=mail_options,
                     lmtp=self.protocol(ep_name) == "lmtp")
        c.quit()
        return self.peer.assert_delivered(content, sender, rcpts, tls=tls, auth=auth)

    def endpoints(self, protocol=None, tls=None):
        return [e for e in self.peer.endpoints
                if (protocol is None or e.protocol == protocol) and (tls is None or e.tls == tls)]

    # tests -----------------------------------------------------------------------------------
    def test_extensions_advertised(self):
        c = self.client()
        for kw in sorted(self.peer.extensions):
            self.assertTrue(c.has_extn(kw), "%s does not advertise %s: %r"
                            % (self.peer.name, kw, c.esmtp_features))
        for ep in self.peer.endpoints:
            if ep.tls == "implicit":
                continue
            c = self.client(ep.name)
            self.assertEqual(c.has_extn("starttls"), ep.tls == "starttls", ep)
        if "PIPELINING" not in self.peer.extensions:
            self.assertFalse(c.has_extn("pipelining"), "%s advertises PIPELINING" % self.peer.name)
        if "CHUNKING" not in self.peer.extensions:
            self.assertFalse(c.has_extn("chunking"), "%s advertises CHUNKING" % self.peer.name)

    def test_every_plain_endpoint(self):
        """TCP and unix socket, each protocol, no TLS."""
        eps = [e for e in self.peer.endpoints if e.tls != "implicit"]
        self.assertTrue(any(e.transport == "unix" for e in eps), "no unix socket endpoint")
        for ep in eps:
            self.peer.clear()
            self.round_trip(ep.name, tls=False)

    def test_starttls(self):
        eps = self.endpoints(tls="starttls")
        if not eps:
            return self.assertNotIn("STARTTLS", self.peer.extensions)
        for ep in eps:
            self.peer.clear()
            self.round_trip(ep.name, starttls=True, tls=True)

    def test_starttls_certificate_checked(self):
        """The ca_file is the only trust anchor: a context without it refuses the server."""
        eps = self.endpoints(tls="starttls")
        if not eps:
            return
        c = open_client(self.peer, eps[0])
        self._clients.append(c)
        with self.assertRaises(ssl.SSLError):
            c.starttls(context=ssl.create_default_context(cadata=self.other_ca()))

    def other_ca(self):
        d = self.peer.dir
        other = os.path.join(d, "other")
        os.makedirs(other, exist_ok=True)
        cert, _ = peers.make_certificate(other)
        with open(cert) as f:
            return f.read()

    def test_implicit_tls(self):
        eps = self.endpoints(tls="implicit")
        self.assertTrue(eps, "%s has no implicit TLS endpoint" % self.peer.name)
        for ep in eps:
            self.peer.clear()
            self.round_trip(ep.name, tls=True)

    def test_auth_every_mechanism(self):
        p = self.peer
        if not p.auth_user:
            return self.assertNotIn("AUTH", p.extensions)
        starttls = bool(self.endpoints(tls="starttls"))
        for tls in ([True, False] if starttls else [False]):
            c = self.client(starttls=tls)
            offered = c.esmtp_features.get("auth", "").upper().split()
            for mech in p.auth_mechanisms:
                self.assertIn(mech, offered)
            c.close()
            for mech in p.auth_mechanisms:
                p.clear()
                c = self.client(starttls=tls)
                c.user, c.password = p.auth_user, p.auth_password
                code, text = c.auth(mech, getattr(c, "auth_" + mech.lower().replace("-", "_")),
                                    initial_response_ok=(mech == "PLAIN"))
                self.assertEqual(code, 235, "AUTH %s: %d %r" % (mech, code, text))
                content = basic_content("auth %s tls=%s" % (mech, tls))
                self.deliver(c, content, [self.rcpt()])
                c.quit()
                p.assert_delivered(content, SENDER, [self.rcpt()], tls=tls, auth=p.auth_user)

    def test_auth_wrong_password_refused(self):
        p = self.peer
        if not p.auth_user:
            return
        c = self.client()
        with self.assertRaises(smtplib.SMTPAuthenticationError) as cm:
            c.login(p.auth_user, p.auth_password + "x")
        self.assertEqual(cm.exception.smtp_code, 535)

    def test_null_reverse_path(self):
        self.round_trip(sender="", tls=False)

    def test_several_recipients_and_transactions(self):
        c = self.client()
        lmtp = self.protocol() == "lmtp"
        first = basic_content("first of two")
        second = basic_content("second of two")
        r1 = [self.rcpt("alice"), self.rcpt("bob")]
        r2 = [self.rcpt("carol")]
        self.deliver(c, first, r1, lmtp=lmtp)
        got = self.peer.assert_delivered(first, SENDER, r1)
        self.peer.clear()
        self.deliver(c, second, r2, lmtp=lmtp)
        self.peer.assert_delivered(second, SENDER, r2)
        c.quit()
        if not self.peer.mailboxes:
            self.assertEqual(got[0].rcpt_tos, r1)

    def test_8bitmime(self):
        if "8BITMIME" not in self.peer.extensions:
            return
        self.round_trip(content=eight_bit_content(), mail_options=["BODY=8BITMIME"])

    def test_smtputf8(self):
        if "SMTPUTF8" not in self.peer.extensions:
            return
        local = peers.UTF8_MAILBOX
        sender = "séndér@clïent.test"
        content = ("Subject: ünïcödé\r\nFrom: séndér@clïent.test\r\n\r\nGrüße\r\n").encode()
        got = self.round_trip(content=content, rcpts=[self.rcpt(local)], sender=sender,
                              mail_options=["SMTPUTF8", "BODY=8BITMIME"])
        self.assertEqual(got[0].mail_from, sender)
        self.assertEqual(got[0].rcpt_tos, [self.rcpt(local)])

    def test_two_megabytes(self):
        content = big_content()
        self.assertGreater(len(content), 2 * 1024 * 1024)
        self.round_trip(content=content)

    def test_longest_line(self):
        """A content line as long as the peer's line_limit (10 000 octets when it has none),
        starting with "." so that its stuffed form is one octet longer still."""
        n = self.peer.line_limit or 10000
        line = b"." + b"x" * (n - 3) + CRLF
        self.assertEqual(len(line), n)
        self.round_trip(content=b"Subject: long line\r\n\r\n" + line + b"end\r\n")

    def test_recipient_rules(self):
        """reject* and defer* at RCPT (not Dovecot: its rule is its user list and quota)."""
        c = self.client()
        if self.peer.name == "dovecot":
            code, _ = c.mail(SENDER)
            self.assertEqual(code, 250)
            code, text = c.rcpt(self.rcpt("nosuchuser"))
            self.assertEqual((code, text[:5]), (550, b"5.1.1"), text)
            return
        c.mail(SENDER)
        code, text = c.rcpt(self.rcpt("reject-me"))
        self.assertEqual(code, 550, text)
        code, text = c.rcpt(self.rcpt("defer-me"))
        self.assertEqual(code, 450, text)
        if "ENHANCEDSTATUSCODES" in self.peer.extensions:
            self.assertEqual(text[:2], b"4.", text)
        code, text = c.rcpt(self.rcpt("alice"))
        self.assertEqual(code, 250, text)
        content = basic_content("rules")
        code, text = c.data(content)
        self.assertEqual(code, 250, text)
        c.quit()
        self.peer.assert_delivered(content, SENDER, [self.rcpt("alice")])

    def test_refused_after_content(self):
        """datafail (554) and datadefer (451) refuse the whole SMTP transaction after the
        content: nothing is stored."""
        if self.protocol() != "smtp":
            return
        for local, want in (("datafail", 554), ("datadefer", 451)):
            c = self.client()
            with self.assertRaises(smtplib.SMTPDataError) as cm:
                c.sendmail(SENDER, [self.rcpt(local)], basic_content(local))
            self.assertEqual(cm.exception.smtp_code, want)
            c.quit()
        time.sleep(peers.SETTLE if self.peer.asynchronous else 0)
        self.assertEqual(self.peer.messages(), [])

    def test_dsn_parameters(self):
        if "DSN" not in self.peer.extensions:
            return
        c = self.client()
        content = basic_content("dsn")
        self.deliver(c, content, [self.rcpt()], mail_options=["RET=HDRS", "ENVID=test+2Denvid"],
                     rcpt_options=["NOTIFY=NEVER", "ORCPT=rfc822;alice@peer.test"])
        c.quit()
        (m,) = self.peer.assert_delivered(content, SENDER, [self.rcpt()])
        if m.meta:
            self.assertEqual(m.meta["rcpt_args"][0].get("NOTIFY"), "NEVER", m.meta)

    def test_altered_content_is_detected(self):
        """The negative control: one changed octet in the store fails assert_delivered."""
        (m,) = self.round_trip()[:1]
        with open(m.path, "r+b") as f:
            f.seek(len(m.raw) - 5)
            octet = f.read(1)
            f.seek(len(m.raw) - 5)
            f.write(b"Z" if octet != b"Z" else b"Y")
        content = basic_content(self.main_endpoint())
        with self.assertRaises(AssertionError) as cm:
            self.peer.assert_delivered(content, SENDER, [self.rcpt()])
        self.assertIn("differs from the submitted content", str(cm.exception))


class LmtpTests:
    """For peers with LMTP endpoints: the per-recipient replies after the content."""

    def test_lmtp_per_recipient_replies(self):
        eps = self.endpoints(protocol="lmtp")
        self.assertTrue(eps, "%s has no LMTP endpoint" % self.peer.name)
        for ep in eps:
            self.peer.clear()
            c = self.client(ep.name, starttls=ep.tls == "starttls" and ep.transport == "tcp")
            rcpts = [self.rcpt("alice"), self.rcpt("datafail"), self.rcpt("bob")]
            content = basic_content("lmtp " + ep.name)
            at_rcpt, after = lmtp_send(c, SENDER, rcpts, content)
            self.assertEqual([v[0] for v in at_rcpt.values()], [250, 250, 250], at_rcpt)
            codes = [(r, code) for r, code, _ in after]
            self.assertEqual(codes, [(rcpts[0], 250), (rcpts[1], 552 if self.peer.name ==
                                      "dovecot" else 554), (rcpts[2], 250)], after)
            c.quit()
            self.peer.assert_delivered(content, SENDER, [rcpts[0], rcpts[2]])

    def test_lmtp_pipelined_transactions(self):
        """Three transactions on one LMTP connection, each with its reply count."""
        ep = self.endpoints(protocol="lmtp")[0]
        c = self.client(ep.name)
        for i in range(3):
            self.peer.clear()
            rcpts = [self.rcpt("alice"), self.rcpt("bob")][: 1 + i % 2]
            content = basic_content("lmtp transaction %d" % i)
            self.deliver(c, content, rcpts, lmtp=True)
            self.peer.assert_delivered(content, SENDER, rcpts)
        c.quit()


class ChunkingTests:
    """For peers offering CHUNKING: BDAT chunks, no dot-stuffing."""

    def test_bdat_chunks(self):
        c = self.client()
        self.assertTrue(c.has_extn("chunking"))
        content = basic_content("bdat") + b".\r\n..\r\nafter the dot lines\r\n"
        chunks = [content[:7], content[7:50], content[50:]]
        lmtp = self.protocol() == "lmtp"
        rcpts = [self.rcpt("alice"), self.rcpt("bob")]
        replies = bdat_send(c, SENDER, rcpts, chunks, lmtp=lmtp)
        self.assertEqual([r[0] for r in replies], [250] * len(replies), replies)
        c.quit()
        self.peer.assert_delivered(content, SENDER, rcpts)

    def test_bdat_two_megabytes(self):
        c = self.client()
        content = big_content()
        step = 300001
        chunks = [content[i:i + step] for i in range(0, len(content), step)]
        replies = bdat_send(c, SENDER, [self.rcpt()], chunks, lmtp=self.protocol() == "lmtp")
        self.assertEqual(replies[0][0], 250, replies)
        c.quit()
        self.peer.assert_delivered(content, SENDER, [self.rcpt()])


# ------------------------------------------------------------------------------------------------
# One class per peer
# ------------------------------------------------------------------------------------------------
class TestPostfix(PeerTests, ChunkingTests, unittest.TestCase):
    PEER = peers.Postfix

    def test_trace_fields(self):
        """Exactly Return-Path, Delivered-To and smtpd's Received, naming TLS and AUTH."""
        c = self.client(starttls=True)
        c.login(self.peer.auth_user, self.peer.auth_password)
        content = basic_content("trace")
        self.deliver(c, content, [self.rcpt()])
        c.quit()
        (m,) = self.peer.assert_delivered(content, SENDER, [self.rcpt()], tls=True,
                                          auth=peers.AUTH_USER)
        self.assertEqual(m.added[0], b"Return-Path: <sender@client.test>\n")
        self.assertEqual(m.added[1], b"Delivered-To: alice@peer.test\n")
        self.assertTrue(m.added[2].startswith(b"Received: from client.test"), m.added[2])
        self.assertIn(b"(Authenticated sender: tester)", m.added[2])
        self.assertIn(b"with ESMTPSA", m.added[2])
        self.assertEqual(m.raw, b"".join(m.added) + content.replace(CRLF, b"\n"))

    def test_documented_alterations(self):
        """What peers.py says Postfix changes beyond its trace fields, still so: a bare CR
        becomes a space, a CR before CRLF goes, a bare LF ends a line; and content without a
        header first gets an empty line."""
        c = self.client()
        sent = b"Subject: x\r\n\r\nbare\rCR\r\nbare\nLF\r\nCRCR\r\r\nNUL\0kept\r\n"
        self.deliver(c, sent, [self.rcpt()])
        self.peer.assert_delivered(
            b"Subject: x\r\n\r\nbare CR\r\nbare\r\nLF\r\nCRCR\r\nNUL\0kept\r\n", SENDER,
            [self.rcpt()])
        self.peer.clear()
        self.deliver(c, b"no header here\r\n", [self.rcpt()])
        self.peer.assert_delivered(b"\r\nno header here\r\n", SENDER, [self.rcpt()])
        c.quit()

    def test_relay_refused(self):
        c = self.client()
        c.mail(SENDER)
        code, text = c.rcpt("someone@elsewhere.test")
        self.assertEqual(code, 554, text)
        code, text = c.rcpt(self.rcpt("nosuchuser"))
        self.assertEqual(code, 550, text)


class TestDovecot(PeerTests, LmtpTests, ChunkingTests, unittest.TestCase):
    PEER = peers.Dovecot

    def test_trace_fields(self):
        c = self.client(starttls=True)
        content = basic_content("trace")
        self.deliver(c, content, [self.rcpt()], lmtp=True)
        c.quit()
        (m,) = self.peer.assert_delivered(content, SENDER, [self.rcpt()], tls=True)
        self.assertEqual(m.added[0], b"Return-Path: <sender@client.test>\r\n")
        self.assertTrue(m.added[1].startswith(b"Received: from client.test"), m.added[1])
        self.assertEqual(m.raw, b"".join(m.added) + content)

    def test_bare_cr_kept(self):
        """Dovecot's store keeps a bare CR (Postfix's does not: it is no test for that)."""
        content = b"Subject: cr\r\n\r\nbare\rCR\r\nCR before CRLF\r\r\n"
        self.round_trip(content=content)


class TestAiosmtpd(PeerTests, unittest.TestCase):
    PEER = peers.Aiosmtpd

    def test_envelope_record(self):
        c = self.client(starttls=True)
        c.login(self.peer.auth_user, self.peer.auth_password)
        content = basic_content("record")
        self.deliver(c, content, [self.rcpt("a"), self.rcpt("b")], mail_options=["SIZE=%d"
                                                                                   % len(content)])
        c.quit()
        (m,) = self.peer.assert_delivered(content, SENDER, [self.rcpt("a"), self.rcpt("b")],
                                          tls=True, auth=peers.AUTH_USER)
        self.assertEqual(m.raw, content)
        self.assertEqual(m.meta["mail_args"], {"SIZE": str(len(content))})
        self.assertEqual(m.meta["helo"], HELO)
        self.assertEqual(m.meta["listener"], "smtp")

    def test_bare_cr_and_lf_kept(self):
        content = b"Subject: raw\r\n\r\nbare\rCR\r\nbare\nLF\r\n"
        self.round_trip(content=content)


class TestAiosmtpdPlain(PeerTests, unittest.TestCase):
    """aiosmtpd without TLS and without AUTH."""
    PEER = peers.Aiosmtpd
    ARGS = {"tls": False, "auth": False}

    def test_implicit_tls(self):
        self.assertEqual(self.endpoints(tls="implicit"), [])
        c = self.client()
        self.assertFalse(c.has_extn("starttls"))
        self.assertFalse(c.has_extn("auth"))


class TestAiosmtpdRequireStarttls(unittest.TestCase):
    """aiosmtpd with require_starttls: MAIL before STARTTLS is refused, after it delivered."""

    def test_require_starttls(self):
        with peers.Aiosmtpd(require_starttls=True) as p:
            ep = p.endpoint("smtp")
            c = open_client(p, ep)
            code, text = c.mail(SENDER)
            self.assertEqual(code, 530, text)
            c.close()
            c = open_client(p, ep, starttls=True)
            content = basic_content("after starttls")
            self.assertEqual(c.sendmail(SENDER, [p.address("x")], content), {})
            c.quit()
            p.assert_delivered(content, SENDER, [p.address("x")], tls=True)


class TestGoSmtp(PeerTests, LmtpTests, unittest.TestCase):
    PEER = peers.GoSmtp

    def test_store_has_lf(self):
        (m,) = self.round_trip()
        self.assertNotIn(b"\r\n", m.raw)
        self.assertEqual(m.raw.replace(b"\n", CRLF), m.content)


class TestSmtpServer(PeerTests, LmtpTests, unittest.TestCase):
    PEER = peers.SmtpServer

    def test_bare_cr_and_lf_kept(self):
        content = b"Subject: raw\r\n\r\nbare\rCR\r\nbare\nLF\r\n"
        self.round_trip(content=content)


class TestPeersModule(unittest.TestCase):
    """peers.py's own parts that a server does not exercise."""

    def test_split_trace_fields(self):
        raw = b"Return-Path: <a>\nReceived: from x\n\tby y\nSubject: s\n\nbody\n"
        fields, rest = peers.split_trace_fields(raw, ("Return-Path", "Received"), b"\n")
        self.assertEqual(fields, [b"Return-Path: <a>\n", b"Received: from x\n\tby y\n"])
        self.assertEqual(rest, b"Subject: s\n\nbody\n")
        with self.assertRaises(AssertionError):   # a field the server was not to add
            peers.split_trace_fields(b"X-Other: 1\n" + raw, ("Return-Path", "Received"), b"\n")
        with self.assertRaises(AssertionError):   # one missing
            peers.split_trace_fields(raw, ("Return-Path", "Delivered-To", "Received"), b"\n")

    def test_assert_same_octets(self):
        peers.assert_same_octets(b"abc", b"abc")
        for got in (b"abd", b"ab", b"abcd", b""):
            with self.assertRaises(AssertionError):
                peers.assert_same_octets(got, b"abc")

    def test_no_process_left(self):
        """A stopped peer leaves no process of its group (checked in /proc)."""
        p = peers.Aiosmtpd()
        p.start()
        pgids = [proc.pgid for proc in p.procs]
        p.stop()
        for pgid in pgids:
            self.assertEqual(peers._group_members(pgid), [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", help="where the go-smtp peer is built")
    ap.add_argument("-k", action="append", default=[], help="only tests matching this pattern")
    ap.add_argument("-q", action="store_true", help="less output")
    a = ap.parse_args()
    if a.cache:
        peers.set_cache_dir(a.cache)
    loader = unittest.TestLoader()
    if a.k:
        loader.testNamePatterns = ["*%s*" % k for k in a.k]
    suite = loader.loadTestsFromModule(sys.modules[__name__])
    t0 = time.monotonic()
    res = unittest.TextTestRunner(stream=sys.stdout, verbosity=1 if a.q else 2).run(suite)
    failed = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
    skipped = len(res.skipped)
    print("peers: %.1f s" % (time.monotonic() - t0))
    line = "%d passed, %d failed" % (res.testsRun - failed - skipped, failed)
    print(line + (", %d skipped" % skipped if skipped else ""))
    return 1 if failed or res.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
