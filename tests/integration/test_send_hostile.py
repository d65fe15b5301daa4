#!/usr/bin/env python3
"""Hostile-server tests of smtpe-send (the client program on the client engine): one scripted,
misbehaving SMTP or LMTP server per test, over TCP on 127.0.0.1, in the spirit of Dovecot's
src/lib-smtp/test-smtp-client-errors.c.

Each test starts a Peer (below): a listener that accepts one connection and runs the test's
script on it in a thread (raw sockets; TLS through ssl.MemoryBIO, so that every octet on the
wire is recorded, TLS records as received and their decrypted content apart). After the script
the Peer reads on until the client closes the connection. Then every test checks both sides:
  - what the server received, octet for octet (Peer.log: the command lines and the content as
    sent; nothing else, e.g. no credential octet, no command after the session was given up, no
    second message), and whether the client (not the server) closed the connection;
  - what smtpe-send reported: its lines "N RECIPIENT OUTCOME CODE ENHANCED TEXT" on standard
    output and its exit status (0, 64, 65, 69, 75), within a time bound.
The client conformance cases Q01-Q14 (/work/shared/conformance/client-cases.md) each have a
case here; the names carry the number.

A case where smtpe-send or the engine does the wrong thing keeps its correct expectation and is
marked with a "Regression" comment saying what the server sent and what the client must do
(each was a bug once).

Usage: test_send_hostile.py [SERVER] --send SMTPE_SEND [--slow N] [-k PATTERN] [-q]
  SERVER is not used (test_server.main wants one; ctest passes smtpe-server); SMTPE_SEND
  defaults to $SMTPE_SEND, then build/smtpe-send. Needs the openssl command (tests/deps.sh).
Only the Python 3 standard library is used; Linux (/proc/PID/status: the client's peak memory).
Time limits are safety bounds against a hung client, never speed requirements.
"""

import base64
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (helpers and main() only; its tests are not loaded)

SEND = None  # path of smtpe-send, set in __main__
CRLF = b"\r\n"
HELO = "client.example"
FROM = "a@example.org"
RCPT = "u@example.com"
MSG = b"Subject: hostile\r\n\r\nbody\r\n"
LINE = re.compile(r"^(\d+) (\S+) (delivered|permanent|temporary|unknown) (\d{3}) (\S+) (.*)$")
# the EHLO reply the conformance cases call CAPS
CAPS = (b"250-peer.test\r\n250-PIPELINING\r\n250-8BITMIME\r\n250-SIZE 10485760\r\n"
        b"250 ENHANCEDSTATUSCODES\r\n")
MAX_UNANSWERED = 4096  # smtpe_client_config.max_unanswered's default (smtpe-send keeps it)
MAX_REPLY_SIZE = 65536  # max_reply_size's default
WAIT = 3.0  # s: how long a script waits for the client's next octets (scaled by --slow); a
            # correct client answers in milliseconds, or after its --timeout-ms of 500
FIX = {}  # the test certificate: cert, key (TestTls.setUpClass)


# ------------------------------------------------------------------------------------------------
# What the client must send
# ------------------------------------------------------------------------------------------------
def normalised(msg):
    """msg as --line-ending normalise sends it: each bare CR and bare LF as CRLF, and a final
    CRLF when it has none (before dot-stuffing; also the SIZE= value's octets)."""
    out = re.sub(rb"\r\n|\r|\n", CRLF, msg)
    return out if out.endswith(CRLF) else out + CRLF


def stuffed(msg):
    """What goes between the 354 and the end of DATA, the final ".CRLF" included: normalised
    msg with every line-start dot doubled (RFC 5321 §4.5.2)."""
    lines = normalised(msg).split(CRLF)[:-1]
    return b"".join((b"." + l if l.startswith(b".") else l) + CRLF for l in lines) + b".\r\n"


def ehlo(lmtp=False):
    return (b"LHLO " if lmtp else b"EHLO ") + HELO.encode() + CRLF


def mail(msg=MSG, caps=CAPS, sender=FROM):
    """The MAIL line for msg to a server with caps (SIZE= and BODY=7BIT as offered)."""
    line = b"MAIL FROM:<%s>" % sender.encode()
    if b"SIZE" in caps:
        line += b" SIZE=%d" % len(normalised(msg))
    if b"8BITMIME" in caps:
        line += b" BODY=7BIT"
    return line + CRLF


def rcpt(addr=RCPT):
    return b"RCPT TO:<%s>\r\n" % addr.encode()


def group(msg=MSG, rcpts=(RCPT,), caps=CAPS):
    """A pipelined transaction's commands: MAIL, every RCPT, DATA."""
    return mail(msg, caps) + b"".join(rcpt(a) for a in rcpts) + b"DATA\r\n"


def b64(data):
    return base64.b64encode(data)


# ------------------------------------------------------------------------------------------------
# The scripted server
# ------------------------------------------------------------------------------------------------
class ClientGone(Exception):
    """The client closed (or reset) the connection while the script wanted more."""


class Peer:
    """A scripted SMTP server for one connection on 127.0.0.1 (self.server: "127.0.0.1:PORT").

    script(peer) runs in a thread once the client connects; it reads with line(), lines(n),
    data(), exactly(n), bdat(line) and writes with send(). A ClientGone ends the script quietly
    (the checks of the test then say whether the client should have gone); any other exception
    is kept in self.error. After the script the peer reads on (drain) until the client closes
    the connection, so self.log is everything the client ever sent.

    self.log        every octet received from the TCP connection, in order (TLS records raw)
    self.tls_at     the offset in log where the TLS handshake began (None: no TLS)
    self.tls_log    the octets decrypted from the TLS records (tls_error: why TLS failed)
    self.eof        the client closed or reset the connection
    self.server_closed  the script closed its side first (close())
    self.reads      [(len(log), self.answered)] after each read while self.count_reads is set
    self.client_pid smtpe-send's process id (self.client_started is set once it is known)
    rcvbuf, sndbuf  SO_RCVBUF / SO_SNDBUF of the listener (inherited by the connection)
    chunk, delay    each read takes at most chunk octets, after a sleep of delay seconds
    """

    def __init__(self, script, rcvbuf=None, sndbuf=None, chunk=65536, delay=0.0,
                 drain=None):
        self.script = script
        self.lsock = socket.socket()
        if rcvbuf:
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf:
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.server = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.chunk, self.delay = chunk, delay
        self.drain_bound = ts.bound(WAIT) if drain is None else drain
        self.log = bytearray()
        self.tls_log = bytearray()
        self.tls_at = None
        self.tls_error = None
        self.buf = bytearray()
        self.tls = self.tls_in = self.tls_out = None
        self.conn = None
        self.eof = False
        self.server_closed = False
        self.error = None
        self.answered = 0
        self.client_pid = None
        self.client_started = threading.Event()
        self.count_reads = False
        self.reads = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    # -- the connection --------------------------------------------------------------------------
    def _run(self):
        self.lsock.settimeout(ts.SAFETY)
        try:
            self.conn, _ = self.lsock.accept()
        except OSError:
            return
        self.conn.settimeout(ts.bound(WAIT))
        try:
            self.script(self)
        except ClientGone:
            pass
        except Exception:  # kept for the test (an assertion in the main thread shows it)
            self.error = traceback.format_exc()
            self.drain_bound = 0.1  # the test fails anyway: no need to wait for the client
        self._drain()

    def _drain(self):
        self.conn.settimeout(self.drain_bound)
        try:
            while True:
                self._fill()
        except ClientGone:
            pass
        except socket.timeout:
            pass  # self.eof stays False: the client kept the connection open
        except OSError:
            self.eof = True
        finally:
            self.buf.clear()
            self.conn.close()

    def _recv_raw(self):
        if self.delay:
            time.sleep(self.delay)
        try:
            data = self.conn.recv(self.chunk)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise ClientGone()
        self.log += data
        if self.count_reads:
            self.reads.append((len(self.log), self.answered))
        return data

    def _flush_tls(self):
        out = self.tls_out.read()
        if out:
            self._sendall(out)

    def _sendall(self, data):
        try:
            self.conn.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            raise ClientGone()

    def _fill(self):
        """Appends what arrives next to self.buf (decrypted under TLS)."""
        if self.tls is None:
            self.buf += self._recv_raw()
            return
        while True:
            try:
                d = self.tls.read(65536)
            except ssl.SSLWantReadError:
                self.tls_in.write(self._recv_raw())
                continue
            except ssl.SSLZeroReturnError:
                raise ClientGone()
            except ssl.SSLError as e:
                self.tls_error = e
                raise ClientGone()
            if not d:
                raise ClientGone()
            self.tls_log += d
            self.buf += d
            return

    # -- for scripts -----------------------------------------------------------------------------
    def send(self, data):
        if self.tls is not None:
            self.tls.write(data)
            self._flush_tls()
        else:
            self._sendall(data)

    def line(self):
        """The next line, CRLF included (a bare LF does not end it)."""
        while CRLF not in self.buf:
            self._fill()
        i = self.buf.index(CRLF) + 2
        out = bytes(self.buf[:i])
        del self.buf[:i]
        return out

    def lines(self, n):
        return [self.line() for _ in range(n)]

    def exactly(self, n):
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def data(self, limit=None):
        """The content after a 354, through the end of DATA (".CRLF" at a line start). With
        limit: returns as soon as at least limit octets are in (all that is in, which may
        include the end)."""
        start = 0
        while True:
            if self.buf.startswith(b".\r\n"):
                i = 3
                break
            j = self.buf.find(b"\r\n.\r\n", start)
            if j >= 0:
                i = j + 5
                break
            if limit is not None and len(self.buf) >= limit:
                i = len(self.buf)
                break
            start = max(0, len(self.buf) - 4)
            self._fill()
        out = bytes(self.buf[:i])
        del self.buf[:i]
        return out

    def bdat(self, line):
        """The chunk of a BDAT command line (RFC 3030 §2): (payload, is_last)."""
        m = re.match(rb"BDAT (\d+)( LAST)?\r\n$", line)
        if not m:
            raise AssertionError("not a BDAT line: %r" % line)
        return self.exactly(int(m.group(1))), m.group(2) is not None

    def greet(self, caps=CAPS, greeting=b"220 peer.test ESMTP\r\n"):
        """The greeting, the EHLO (or LHLO) line read, its reply (caps) sent."""
        self.send(greeting)
        line = self.line()
        self.send(caps)
        return line

    def starttls(self, ctx):
        """The server side of a TLS handshake; octets already received after STARTTLS go to
        it as TLS input (they are recorded in self.log like every octet)."""
        self.tls_at = len(self.log) - len(self.buf)
        self.tls_in, self.tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.tls_in, self.tls_out, server_side=True)
        self.tls_in.write(bytes(self.buf))
        self.buf.clear()
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush_tls()
                self.tls_in.write(self._recv_raw())
            except ssl.SSLError as e:
                self.tls_error = e
                self._flush_tls()
                raise ClientGone()
        self._flush_tls()

    def close(self):
        """Closes the server's sending side first (the client sees EOF)."""
        self.server_closed = True
        try:
            self.conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    # -- for the test ----------------------------------------------------------------------------
    def join(self):
        self.thread.join(ts.SAFETY + self.drain_bound + 5)
        if self.thread.is_alive():
            raise AssertionError("the scripted server is still running")
        try:  # one connection only: a second one waits in the backlog
            self.lsock.setblocking(False)
            c, _ = self.lsock.accept()
            c.close()
            self.extra_connection = True
        except BlockingIOError:
            self.extra_connection = False
        self.lsock.close()


# ------------------------------------------------------------------------------------------------
# smtpe-send
# ------------------------------------------------------------------------------------------------
class Result:
    """rc, out, err, lines [(N, RECIPIENT, OUTCOME, CODE, ENHANCED, TEXT)], elapsed (s)."""

    def __init__(self, rc, out, err, elapsed):
        self.rc, self.elapsed = rc, elapsed
        self.out = out.decode("utf-8", "replace")
        self.err = err.decode("utf-8", "replace")
        self.lines = []
        for l in self.out.splitlines():
            m = LINE.match(l)
            if not m:
                raise AssertionError("not an outcome line: %r\n%r" % (l, self))
            self.lines.append((int(m.group(1)), m.group(2), m.group(3), int(m.group(4)),
                               m.group(5), m.group(6)))

    def __repr__(self):
        return "exit %s after %.2f s\nstdout:\n%s\nstderr:\n%s" % (self.rc, self.elapsed,
                                                                  self.out, self.err)


def run_send(args, msg=MSG, env=None, timeout=None, on_start=None):
    """Runs smtpe-send args with msg on its standard input; returns a Result. on_start(pid) is
    called once it runs."""
    e = dict(os.environ)
    e.pop("SMTPE_PASSWORD", None)
    e.update(env or {})
    timeout = timeout or ts.bound(60)
    t0 = time.monotonic()
    p = subprocess.Popen([SEND] + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=e)
    if on_start:
        on_start(p.pid)
    try:
        out, err = p.communicate(msg, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError("smtpe-send %s did not end within %.0f s" % (" ".join(args),
                                                                          timeout))
    return Result(p.returncode, out, err, time.monotonic() - t0)


def vm_hwm(pid):
    """The peak resident memory (VmHWM, KiB) of process pid so far, or None once it is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for l in f:
                if l.startswith("VmHWM:"):
                    return int(l.split()[1])
    except OSError:
        pass
    return None


def ordinary(s, caps=CAPS, rcpts=1):
    """A well-behaved server for one transaction of rcpts recipients, DATA, then QUIT."""
    s.greet(caps)
    s.lines(rcpts + 2)
    s.send(b"250 2.1.0 ok\r\n" + b"250 2.1.5 ok\r\n" * rcpts + b"354 go\r\n")
    s.data()
    s.send(b"250 2.0.0 queued\r\n")
    s.line()
    s.send(b"221 2.0.0 bye\r\n")
    s.close()


class Base(unittest.TestCase):
    def peer(self, script, **kw):
        p = Peer(script, **kw)
        self.addCleanup(p.lsock.close)
        return p

    def send(self, peer, *args, msg=MSG, env=None, rc=None, rcpts=(RCPT,), timeout=None,
             base=True):
        """Runs smtpe-send against peer with --helo, --from and a --to for each of rcpts (base)
        and args; waits for the peer; checks the peer raised nothing, the client took one
        connection, no sanitizer spoke, and rc."""
        a = ["--server", peer.server]
        if base:
            a += ["--helo", HELO, "--from", FROM]
            for x in rcpts:
                a += ["--to", x]

        def started(pid):
            peer.client_pid = pid
            peer.client_started.set()
        r = run_send(a + list(args), msg=msg, env=env, timeout=timeout, on_start=started)
        peer.join()
        for mark in ts.SANITIZER_MARKS:
            self.assertNotIn(mark, r.err, "sanitizer report from smtpe-send:\n%s" % r.err)
        self.assertIsNone(peer.error, "the scripted server failed:\n%s\n%r" % (peer.error, r))
        self.assertFalse(peer.extra_connection, "a second connection")
        if rc is not None:
            self.assertEqual(r.rc, rc, r)
        return r

    def assert_octets(self, got, want, what="the server received"):
        got, want = bytes(got), bytes(want)
        if got == want:
            return
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
                 min(len(got), len(want)))
        raise AssertionError("%s %d octets, want %d; first difference at %d:\n got  %r\n want %r"
                             % (what, len(got), len(want), i, got[max(0, i - 80):i + 120],
                                want[max(0, i - 80):i + 120]))

    def assert_lines(self, r, want):
        """want: [(N, RECIPIENT, OUTCOME, CODE, ENHANCED)] in order (TEXT is the caller's)."""
        self.assertEqual([l[:5] for l in r.lines], want, r)

    def assert_retired(self, peer):
        """The client closed the connection (the server did not close it first)."""
        self.assertTrue(peer.eof, "the client did not close the connection")
        self.assertFalse(peer.server_closed)

    def assert_no_end_of_data(self, content):
        """content (after the 354) never ends the DATA: no ".CRLF" at a line start."""
        self.assertFalse(content.startswith(b".\r\n") or b"\r\n.\r\n" in content,
                         "the end of DATA went out")


def temp_lines(rcpts=(RCPT,), code=0, enhanced="-", n=1, outcome="temporary"):
    return [(n, a, outcome, code, enhanced) for a in rcpts]


# ------------------------------------------------------------------------------------------------
# STARTTLS: Q01 (response injection), Q02 (required but refused), Q03 (capabilities after TLS)
# ------------------------------------------------------------------------------------------------
STARTTLS_CAPS = b"250-peer.test\r\n250-PIPELINING\r\n250-STARTTLS\r\n250 ENHANCEDSTATUSCODES\r\n"
FORGED = b"250-peer.test\r\n250-AUTH PLAIN\r\n250 SIZE 1\r\n"  # injected before the handshake


class TestTls(Base):
    @classmethod
    def setUpClass(cls):
        d = tempfile.mkdtemp(prefix="smtpe-hostile-")
        cls.dir = d
        FIX["cert"], FIX["key"] = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        openssl = shutil.which("openssl")
        if openssl is None:
            raise AssertionError("the openssl command is needed (tests/deps.sh installs it)")
        subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-days", "2",
                        "-keyout", FIX["key"], "-out", FIX["cert"]], check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=60)
        cls.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cls.ctx.load_cert_chain(FIX["cert"], FIX["key"])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def tls_args(self):
        return ["--tls", "required", "--tls-ca", FIX["cert"]]

    def after_tls(self, s, caps=CAPS):
        """A well-behaved session inside TLS: EHLO, one transaction, QUIT (for a client that
        wrongly went on)."""
        s.line()
        s.send(caps)
        ordinary_txn(s)

    def injection_script(self, delay):
        def script(s):
            s.greet(STARTTLS_CAPS)
            s.line()  # STARTTLS
            if delay:
                s.send(b"220 2.0.0 Ready\r\n")
                time.sleep(delay)
                s.send(FORGED)
            else:
                s.send(b"220 2.0.0 Ready\r\n" + FORGED)
            s.starttls(self.ctx)  # only if the client starts one
            self.after_tls(s)
        return script

    def test_q01_injection_in_the_same_write(self):
        peer = self.peer(self.injection_script(0))
        r = self.send(peer, *self.tls_args(), "--auth-user", "alice", "--auth-plaintext-ok",
                      env={"SMTPE_PASSWORD": "secret"}, rc=75)
        # the octets after the 220 end the session: no handshake, nothing more in clear
        self.assert_octets(peer.log, ehlo() + b"STARTTLS\r\n")
        self.assertEqual(peer.tls_log, b"")
        self.assert_lines(r, temp_lines())
        self.assertIn("STARTTLS", r.err)
        self.assert_retired(peer)

    def test_q01_injection_a_moment_later(self):
        # the forged reply comes after the 220, when the client is already in its handshake:
        # the handshake reads it as a TLS record and fails; nothing in clear after STARTTLS
        peer = self.peer(self.injection_script(0.2))
        r = self.send(peer, *self.tls_args(), "--auth-user", "alice", "--auth-plaintext-ok",
                      env={"SMTPE_PASSWORD": "secret"}, rc=75)
        head = ehlo() + b"STARTTLS\r\n"
        self.assert_octets(peer.log[:len(head)], head)
        rest = bytes(peer.log[len(head):])
        self.assertTrue(rest == b"" or rest[:2] == b"\x16\x03", rest[:40])  # a ClientHello
        for word in (b"EHLO", b"AUTH", b"MAIL", b"secret", b64(b"\0alice\0secret")):
            self.assertNotIn(word, rest)
        self.assertEqual(peer.tls_log, b"")  # no TLS session came up
        self.assert_lines(r, temp_lines())
        self.assert_retired(peer)

    def starttls_refused(self, s):
        s.greet(STARTTLS_CAPS)
        s.line()
        s.send(b"454 4.7.0 TLS not available\r\n")
        s.line()  # QUIT
        s.send(b"221 2.0.0 bye\r\n")
        s.close()

    def test_q02_starttls_454_with_tls_required(self):
        peer = self.peer(self.starttls_refused)
        r = self.send(peer, *self.tls_args(), "--auth-user", "alice", "--auth-plaintext-ok",
                      env={"SMTPE_PASSWORD": "secret"}, rc=75)
        self.assert_octets(peer.log, ehlo() + b"STARTTLS\r\nQUIT\r\n")
        self.assert_lines(r, temp_lines(code=454, enhanced="4.7.0"))

    def test_q02_starttls_not_offered_with_tls_required(self):
        def script(s):
            s.greet(b"250-peer.test\r\n250-PIPELINING\r\n250 AUTH PLAIN LOGIN\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, *self.tls_args(), "--auth-user", "alice", "--auth-plaintext-ok",
                      env={"SMTPE_PASSWORD": "secret"}, rc=75)
        self.assert_octets(peer.log, ehlo() + b"QUIT\r\n")
        self.assert_lines(r, temp_lines())
        self.assertIn("TLS", r.err)

    def test_q03_only_the_capabilities_after_tls_count(self):
        # before TLS: AUTH LOGIN and SIZE 10 (the message is larger); after: AUTH PLAIN, SIZE
        # 10485760. The client must say EHLO first in TLS, use PLAIN, and send SIZE=.
        before = (b"250-peer.test\r\n250-PIPELINING\r\n250-SIZE 10\r\n250-AUTH LOGIN\r\n"
                  b"250 STARTTLS\r\n")
        after = (b"250-peer.test\r\n250-PIPELINING\r\n250-SIZE 10485760\r\n250-AUTH PLAIN\r\n"
                 b"250 ENHANCEDSTATUSCODES\r\n")

        def script(s):
            s.greet(before)
            s.line()
            s.send(b"220 2.0.0 Ready\r\n")
            s.starttls(self.ctx)
            s.line()
            s.send(after)
            s.line()  # AUTH
            s.send(b"235 2.7.0 ok\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, *self.tls_args(), "--auth-user", "alice",
                      env={"SMTPE_PASSWORD": "secret"}, rc=0)
        self.assert_octets(peer.log[:peer.tls_at], ehlo() + b"STARTTLS\r\n")
        self.assert_octets(peer.tls_log,
                           ehlo() + b"AUTH PLAIN " + b64(b"\0alice\0secret") + CRLF +
                           mail(caps=after) + rcpt() + b"DATA\r\n" + stuffed(MSG) + b"QUIT\r\n",
                           "the server decrypted")
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")])


CHUNKING_CAPS = (b"250-peer.test\r\n250-PIPELINING\r\n250-CHUNKING\r\n250-SIZE 10485760\r\n"
                 b"250 ENHANCEDSTATUSCODES\r\n")


def read_chunks(s, last_reply=b"250 2.0.0 queued\r\n"):
    """BDAT chunks through the LAST one, each answered (RFC 3030 §2); [(line, payload)]."""
    chunks = []
    while True:
        line = s.line()
        payload, last = s.bdat(line)
        chunks.append((line, payload))
        s.send(last_reply if last else b"250 2.0.0 more\r\n")
        if last:
            return chunks


def ordinary_txn(s, rcpts=1):
    """The transaction part of ordinary(): MAIL, RCPTs, DATA, the content, QUIT."""
    s.lines(rcpts + 2)
    s.send(b"250 2.1.0 ok\r\n" + b"250 2.1.5 ok\r\n" * rcpts + b"354 go\r\n")
    s.data()
    s.send(b"250 2.0.0 queued\r\n")
    s.line()
    s.send(b"221 2.0.0 bye\r\n")
    s.close()


# ------------------------------------------------------------------------------------------------
# Unsolicited, extra and out-of-order replies (RFC 2920 §3.1, RFC 5321 §4.2)
# ------------------------------------------------------------------------------------------------
class TestUnsolicited(Base):
    def test_a_250_with_the_greeting(self):
        def script(s):
            s.send(b"220 peer.test ESMTP\r\n250 2.0.0 nobody asked\r\n")
            s.line()  # only if the client sends something
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, b"")
        self.assert_lines(r, temp_lines())
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)

    # Regression (was bug A): the server writes its EHLO reply and a 250 in one write. The
    # engine stops at READY with the 250 unfed; smtpe-send feeds everything it has read before
    # it writes the MAIL group queued meanwhile, so the 250 reaches a command not yet handed
    # out: a protocol error, never the reply to the MAIL (a 421 there ends the session).
    def test_a_reply_while_idle(self):
        # after the EHLO reply nothing is outstanding: the extra reply matches no command, and
        # the client sends nothing after it
        def script(s):
            s.send(b"220 peer.test ESMTP\r\n")
            s.line()
            s.send(CAPS + b"250 2.0.0 idle chatter\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, ehlo())
        self.assert_lines(r, temp_lines())
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)

    # Regression (was bug A), as test_a_reply_while_idle, with a 421: nothing goes out after
    # the EHLO; the 421 ends the session.
    def test_a_421_while_idle(self):
        # RFC 5321 §3.8: a 421 may come at any time; it ends the session, no QUIT
        def script(s):
            s.send(b"220 peer.test ESMTP\r\n")
            s.line()
            s.send(CAPS + b"421 4.3.2 shutting down\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, ehlo())
        self.assert_lines(r, temp_lines(code=421, enhanced="4.3.2"))
        self.assert_retired(peer)

    # Regression (was bug A, and silent): the extra 250 once became the MAIL's reply and the
    # RCPT's 250 the BDAT LAST's, so the recipient was reported delivered although the server
    # refused the message with 554.
    def test_a_reply_while_idle_is_never_the_reply_to_a_later_command(self):
        def script(s):
            s.send(b"220 peer.test ESMTP\r\n")
            s.line()
            s.send(CHUNKING_CAPS + b"250 2.0.0 hello again\r\n")
            s.lines(2)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n")
            read_chunks(s, b"554 5.7.1 rejected as spam\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer)
        self.assert_lines(r, temp_lines())
        self.assertEqual(r.rc, 75, r)
        self.assert_octets(peer.log, ehlo())

    # Regression (was bug B): the server answers the final dot with "250 queued" and an
    # extra 250 in one write. The second transaction's MAIL, RCPT and DATA are queued, not yet
    # handed out, when the extra 250 is found to be a reply to a command not yet sent; they
    # never go: a session given up drops every octet it has not handed out.
    def test_an_extra_reply_after_the_final_250(self):
        # with --messages 2 the extra 250 must not become the reply to the second MAIL
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
            s.data()
            s.send(b"250 2.0.0 queued\r\n250 2.0.0 and again\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, "--messages", "2", rc=75)
        self.assert_octets(peer.log, ehlo() + group() + stuffed(MSG))
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")] + temp_lines(n=2))
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)

    def test_too_many_replies_to_a_pipelined_group(self):
        # MAIL, RCPT, DATA answered 250, 250, 250, 354: DATA got a 250
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
            s.data()
            s.send(b"250 2.0.0 queued\r\n")
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, ehlo() + group())
        self.assert_lines(r, temp_lines())
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)

    def test_replies_out_of_order(self):
        # 354 first: a 3xx to MAIL; nothing of the content may go
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"354 go\r\n250 2.1.0 ok\r\n250 2.1.5 ok\r\n")
            s.data()
            s.send(b"250 2.0.0 queued\r\n")
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, ehlo() + group())
        self.assert_lines(r, temp_lines())
        self.assertIn("protocol error", r.err)


# ------------------------------------------------------------------------------------------------
# Malformed and inconsistent replies: a protocol error at each stage, nothing sent after it
# ------------------------------------------------------------------------------------------------
def stage_script(stage, bad):
    """A server that is well-behaved up to stage (greeting, ehlo, mail, rcpt, data, dot) and
    sends bad there, then waits for whatever the client does."""
    def script(s):
        if stage == "greeting":
            s.send(bad)
            s.line()
            return
        s.send(b"220 peer.test ESMTP\r\n")
        s.line()
        if stage == "ehlo":
            s.send(bad)
            s.line()
            return
        s.send(CAPS)
        s.lines(3)
        good = {"mail": b"", "rcpt": b"250 2.1.0 ok\r\n",
                "data": b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n",
                "dot": b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n"}[stage]
        if stage == "dot":
            s.send(good)
            s.data()
            s.send(bad)
        else:
            s.send(good + bad)
        s.line()
    return script


def sent_until(stage):
    """What a correct client has sent when the server misbehaves at stage."""
    return {"greeting": b"", "ehlo": ehlo(), "mail": ehlo() + group(),
            "rcpt": ehlo() + group(), "data": ehlo() + group(),
            "dot": ehlo() + group() + stuffed(MSG)}[stage]


MALFORMED = [
    # name, stage, reply
    ("greeting_codes_disagree", "greeting", b"220-peer.test ESMTP\r\n221 hello\r\n"),
    ("greeting_1xx", "greeting", b"120 peer.test wait\r\n"),
    ("greeting_two_digits", "greeting", b"22\r\n"),
    ("greeting_overlong_line_100k", "greeting", b"220 " + b"x" * 100000 + CRLF),
    ("ehlo_25O", "ehlo", b"25O peer.test\r\n"),
    ("ehlo_codes_disagree", "ehlo", b"250-peer.test\r\n251 PIPELINING\r\n"),
    ("ehlo_no_separator", "ehlo", b"250peer.test\r\n"),
    ("ehlo_bare_lf", "ehlo", b"250-peer.test\n250 PIPELINING\r\n"),
    ("ehlo_nul", "ehlo", b"250-peer.test\r\n250 PIPE\x00LINING\r\n"),
    ("ehlo_overlong_continuation_100k", "ehlo", b"250-" + b"x" * 100000 + CRLF),
    ("mail_6xx", "mail", b"650 2.1.0 ok\r\n"),
    ("mail_1xx", "mail", b"150 2.1.0 ok\r\n"),
    ("rcpt_bare_lf", "rcpt", b"250 2.1.5 ok\n"),
    ("rcpt_bare_cr", "rcpt", b"250 2.1.5 o\rk\r\n"),
    ("rcpt_codes_disagree", "rcpt", b"250-2.1.5 ok\r\n550 5.1.1 no\r\n"),
    ("data_nul", "data", b"354 go\x00\r\n"),
    ("data_2xx", "data", b"250 2.0.0 no content please\r\n"),
    ("dot_codes_disagree", "dot", b"250-2.0.0 queued\r\n550 5.0.0 not really\r\n"),
    ("dot_nul", "dot", b"250 2.0.0 queu\x00ed\r\n"),
    ("dot_bare_lf", "dot", b"250 2.0.0 queued\n"),
]


class TestMalformed(Base):
    """Each reply of MALFORMED at its stage: a protocol error; every recipient temporary (or
    unknown once the end of the content went out), 75; nothing sent after it."""

    def check(self, stage, bad):
        peer = self.peer(stage_script(stage, bad))
        r = self.send(peer, rc=75, timeout=ts.bound(10))
        self.assert_octets(peer.log, sent_until(stage))
        self.assert_lines(r, temp_lines(outcome="unknown" if stage == "dot" else "temporary"))
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)
        self.assertLess(r.elapsed, ts.bound(5))


def _malformed_test(stage, bad):
    def test(self):
        self.check(stage, bad)
    test.__doc__ = "%s: %r" % (stage, bad[:60])
    return test


for _name, _stage, _bad in MALFORMED:
    setattr(TestMalformed, "test_" + _name, _malformed_test(_stage, _bad))


# ------------------------------------------------------------------------------------------------
# Endless replies: bounded time and memory
# ------------------------------------------------------------------------------------------------
class TestEndless(Base):
    def endless(self, s, first):
        """Continuation lines without end (at most 16 MB) until the client goes; the client's
        peak memory sampled before and after every 67 KB block (s.hwm, KiB)."""
        s.client_started.wait(ts.SAFETY)
        s.hwm = [vm_hwm(s.client_pid)]
        s.send(first)
        block = (b"250-" + b"x" * 70 + CRLF) * 900
        for _ in range(16 * 1024 * 1024 // len(block)):
            s.send(block)
            s.hwm.append(vm_hwm(s.client_pid))
        s.line()

    def check(self, script, sent):
        peer = self.peer(script)
        r = self.send(peer, rc=75, timeout=ts.bound(20))
        self.assert_octets(peer.log, sent)
        self.assert_lines(r, temp_lines())
        self.assertIn("protocol error", r.err)
        self.assertLess(r.elapsed, ts.bound(5))
        # the reply is not kept: the peak memory does not grow with it (a client that kept
        # it would read on, to 16 MB; 4 MiB leaves room for ASan's bookkeeping at the exit,
        # measured at 1.4 MiB)
        hwm = [k for k in peer.hwm if k is not None]
        self.assertTrue(hwm, "no sample of the client's memory")
        self.assertLess(max(hwm) - hwm[0], 4096, "peak RSS (KiB) while the reply came: %s"
                        % hwm)

    def test_endless_multiline_greeting(self):
        self.check(lambda s: self.endless(s, b""), b"")

    def test_endless_multiline_ehlo_reply(self):
        def script(s):
            s.send(b"220 peer.test ESMTP\r\n")
            s.line()
            self.endless(s, b"250-peer.test\r\n")
        self.check(script, ehlo())

    def test_reply_just_within_max_reply_size(self):
        # the limit is the documented one (65536 octets): an EHLO reply of that size is taken
        filler = b"250-X-FILLER " + b"y" * 100 + CRLF
        head, tail = b"250-peer.test\r\n", b"250 PIPELINING\r\n"
        caps = head + filler * ((MAX_REPLY_SIZE - len(head) - len(tail)) // len(filler)) + tail
        self.assertGreater(len(caps), MAX_REPLY_SIZE - len(filler))
        peer = self.peer(lambda s: ordinary(s, caps=caps))
        r = self.send(peer, rc=0)
        self.assert_octets(peer.log, ehlo() + group(caps=caps) + stuffed(MSG) + b"QUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "-")])


# ------------------------------------------------------------------------------------------------
# 421 at every stage (Q06): temporary, the connection retired, no HELO fallback, no QUIT
# ------------------------------------------------------------------------------------------------
def _client_send_buffer_max():
    """The most octets the kernel may buffer for the client's socket (tcp_wmem's maximum)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 * 1024 * 1024


# A body the client cannot have handed to its kernel whole when the server replies early: the
# send buffer grows to tcp_wmem's maximum (4 MiB by default; on loopback it took 2.6-3.1 MB in
# one measure), so "still sending" needs twice that plus 2 MB of content.
BIG_LINES = (2 * _client_send_buffer_max() + 2 * 1024 * 1024) // 60
BIG = b"Subject: big\r\n\r\n" + b"".join(
    b"line %07d .............................................\r\n" % i for i in range(BIG_LINES))
BIG_STUFFED = stuffed(BIG)


class Test421(Base):
    def check(self, peer, sent, enhanced="4.3.2", msg=MSG, **kw):
        r = self.send(peer, msg=msg, rc=75, **kw)
        self.assert_octets(peer.log, sent)
        self.assertNotIn(b"HELO", peer.log)
        self.assert_lines(r, temp_lines(code=421, enhanced=enhanced))
        self.assertIn("421", r.err)
        self.assert_retired(peer)
        return r

    def test_q06_421_greeting(self):
        peer = self.peer(stage_script("greeting", b"421 peer.test busy\r\n"))
        self.check(peer, b"", enhanced="-")

    def test_q06_421_ehlo(self):
        peer = self.peer(stage_script("ehlo", b"421 4.3.2 shutting down\r\n"))
        self.check(peer, ehlo(), enhanced="-")

    def test_q06_421_mail(self):
        peer = self.peer(stage_script("mail", b"421 4.3.2 shutting down\r\n"))
        self.check(peer, ehlo() + group())

    def test_q06_421_rcpt(self):
        peer = self.peer(stage_script("rcpt", b"421 4.3.2 shutting down\r\n"))
        self.check(peer, ehlo() + group())

    def test_q06_421_data(self):
        peer = self.peer(stage_script("data", b"421 4.3.2 shutting down\r\n"))
        self.check(peer, ehlo() + group())

    def test_q06_421_final_dot(self):
        # the end of the content went out, but the 421 says it was not taken: temporary
        peer = self.peer(stage_script("dot", b"421 4.3.2 shutting down\r\n"))
        self.check(peer, ehlo() + group() + stuffed(MSG))

    def test_q06_421_mid_content(self):
        # after 354 and 64 KB of a body far larger than the client's kernel buffers: the
        # client stops sending, the DATA never ends
        peer = self.peer(lambda s: early_reply(s, b"421 4.3.2 shutting down\r\n"), rcvbuf=8192)
        r = self.send(peer, msg=BIG, rc=75)
        self.check_stopped(peer)
        self.assert_lines(r, temp_lines(code=421, enhanced="4.3.2"))
        self.assert_retired(peer)

    def check_stopped(self, peer):
        head = ehlo() + group(BIG)
        self.assert_octets(peer.log[:len(head)], head)
        content = bytes(peer.log[len(head):])
        self.assert_octets(content, BIG_STUFFED[:len(content)], "the content sent")
        self.assertLess(len(content), len(BIG_STUFFED), "the client did not stop")
        self.assert_no_end_of_data(content)


def early_reply(s, reply):
    """A server that sends reply after 64 KB of the content, then reads (after a pause that
    lets the client see it) whatever else comes."""
    s.greet()
    s.lines(3)
    s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
    s.data(limit=65536)
    s.send(reply)
    time.sleep(0.3)
    s.data()
    s.send(b"250 2.0.0 queued\r\n")
    s.line()


# ------------------------------------------------------------------------------------------------
# Replies during the content
# ------------------------------------------------------------------------------------------------
class TestContentReplies(Base):
    def test_554_while_the_client_is_still_sending_the_body(self):
        # no command is outstanding while the content goes: a protocol error; the client
        # stops sending and never ends the DATA; nothing is delivered, so: temporary
        peer = self.peer(lambda s: early_reply(s, b"554 5.7.1 go away\r\n"), rcvbuf=8192)
        r = self.send(peer, msg=BIG, rc=75)
        Test421.check_stopped(self, peer)
        self.assert_lines(r, temp_lines())
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)

    def test_354_and_a_reply_in_one_write(self):
        # nothing of the content may go after a reply that matches no command
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n554 5.7.1 no\r\n")
            s.data()
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, ehlo() + group())
        self.assert_lines(r, temp_lines())
        self.assert_retired(peer)


# ------------------------------------------------------------------------------------------------
# LMTP reply counts (Q07; RFC 2033 §4.2)
# ------------------------------------------------------------------------------------------------
LMTP_CAPS = b"250-peer.test\r\n250-PIPELINING\r\n250 ENHANCEDSTATUSCODES\r\n"
V = "v@example.com"
W = "w@example.com"


class TestLmtp(Base):
    def lmtp_txn(self, s, rcpt_replies, end_replies):
        s.lines(2 + len(rcpt_replies))
        s.send(b"250 2.1.0 ok\r\n" + b"".join(rcpt_replies) + b"354 go\r\n")
        s.data()
        s.send(b"".join(end_replies))

    def test_q07_one_reply_per_accepted_recipient_then_in_sync(self):
        def script(s):
            s.greet(LMTP_CAPS)
            for _ in range(2):
                self.lmtp_txn(s, [b"250 2.1.5 ok\r\n", b"550 5.1.1 no such user\r\n",
                                  b"250 2.1.5 ok\r\n"],
                              [b"250 2.0.0 <u@example.com> delivered\r\n",
                               b"452 4.2.2 <w@example.com> mailbox full\r\n"])
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, "--lmtp", "--messages", "2", rcpts=(RCPT, V, W), rc=75)
        txn = group(rcpts=(RCPT, V, W), caps=LMTP_CAPS) + stuffed(MSG)
        self.assert_octets(peer.log, ehlo(True) + txn + txn + b"QUIT\r\n")
        want = []
        for n in (1, 2):
            want += [(n, RCPT, "delivered", 250, "2.0.0"), (n, V, "permanent", 550, "5.1.1"),
                     (n, W, "temporary", 452, "4.2.2")]
        self.assert_lines(r, want)
        self.assertIn("mailbox full", r.lines[2][5])

    def test_fewer_replies_than_accepted_recipients(self):
        def script(s):
            s.greet(LMTP_CAPS)
            self.lmtp_txn(s, [b"250 2.1.5 ok\r\n"] * 2, [b"250 2.0.0 <u@example.com> ok\r\n"])
            s.line()  # waits: the client's timeout
        peer = self.peer(script)
        r = self.send(peer, "--lmtp", "--timeout-ms", "500", rcpts=(RCPT, V), rc=75)
        self.assert_octets(peer.log,
                           ehlo(True) + group(rcpts=(RCPT, V), caps=LMTP_CAPS) + stuffed(MSG))
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0"), (1, V, "unknown", 0, "-")])
        self.assertGreaterEqual(r.elapsed, 0.5)
        self.assertLess(r.elapsed, ts.bound(5))
        self.assertIn("timed out", r.err)
        self.assert_retired(peer)

    # Regression (was bug B), as TestUnsolicited.test_an_extra_reply_after_the_final_250:
    # the third reply is a protocol error, and the second transaction's commands, queued but
    # not yet handed out when it was fed, never go to the server.
    def test_more_replies_than_accepted_recipients(self):
        # three replies for two: the third is a protocol error, never the reply to the second
        # transaction's MAIL; that transaction is not attempted
        def script(s):
            s.greet(LMTP_CAPS)
            self.lmtp_txn(s, [b"250 2.1.5 ok\r\n"] * 2,
                          [b"250 2.0.0 <u@example.com> ok\r\n",
                           b"250 2.0.0 <v@example.com> ok\r\n", b"250 2.0.0 one more\r\n"])
            self.lmtp_txn(s, [b"250 2.1.5 ok\r\n"] * 2, [b"250 2.0.0 ok\r\n"] * 2)
            s.line()
        peer = self.peer(script)
        r = self.send(peer, "--lmtp", "--messages", "2", rcpts=(RCPT, V), rc=75)
        self.assert_octets(peer.log,
                           ehlo(True) + group(rcpts=(RCPT, V), caps=LMTP_CAPS) + stuffed(MSG))
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0"),
                              (1, V, "delivered", 250, "2.0.0")] + temp_lines((RCPT, V), n=2))
        self.assertIn("protocol error", r.err)
        self.assert_retired(peer)


# ------------------------------------------------------------------------------------------------
# AUTH (Q08, Q09; RFC 4954)
# ------------------------------------------------------------------------------------------------
AUTH_CAPS = b"250-peer.test\r\n250-PIPELINING\r\n250-AUTH %s\r\n250 ENHANCEDSTATUSCODES\r\n"
AUTH_ARGS = ("--tls", "none", "--auth-plaintext-ok", "--auth-user", "alice")
SECRET = {"SMTPE_PASSWORD": "secret"}

LOGIN_PROMPTS = [
    # name, the two 334 lines
    ("lower_case", b"334 dXNlcm5hbWU6\r\n", b"334 cGFzc3dvcmQ6\r\n"),
    ("empty", b"334 \r\n", b"334\r\n"),
    ("nul_terminated", b"334 " + b64(b"Username:\0") + CRLF, b"334 " + b64(b"Password:\0") + CRLF),
    ("garbage_base64", b"334 !!not*base64!!\r\n", b"334 ====\r\n"),
    ("swapped", b"334 UGFzc3dvcmQ6\r\n", b"334 VXNlcm5hbWU6\r\n"),
]


class TestAuth(Base):
    """AUTH in clear (--auth-plaintext-ok) so that the fake server reads it."""

    def login(self, first, second):
        def script(s):
            s.greet(AUTH_CAPS % b"LOGIN")
            s.line()
            s.send(first)
            s.line()
            s.send(second)
            s.line()
            s.send(b"235 2.7.0 ok\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, *AUTH_ARGS, "--auth-mechanism", "LOGIN", env=SECRET, rc=0)
        caps = AUTH_CAPS % b"LOGIN"
        self.assert_octets(peer.log, ehlo() + b"AUTH LOGIN\r\n" + b64(b"alice") + CRLF +
                           b64(b"secret") + CRLF + group(caps=caps) + stuffed(MSG) +
                           b"QUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")])

    def test_xoauth2_error_exchange(self):
        # the 334 carries the error JSON; the client answers with an empty line and the 535
        # ends the session (no other mechanism, QUIT)
        error = b64(b'{"status":"401","schemes":"bearer","scope":"https://mail.example/"}')

        def script(s):
            s.greet(AUTH_CAPS % b"XOAUTH2 PLAIN LOGIN")
            s.line()
            s.send(b"334 " + error + CRLF)
            s.line()
            s.send(b"535-5.7.8 Username and Password not accepted.\r\n"
                   b"535 5.7.8 https://support.example/?p=BadCredentials\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        d = tempfile.mkdtemp(prefix="smtpe-hostile-")
        self.addCleanup(shutil.rmtree, d, True)
        tok = os.path.join(d, "token")
        with open(tok, "w") as f:
            f.write("ya29.token\n")
        peer = self.peer(script)
        r = self.send(peer, *AUTH_ARGS, "--auth-mechanism", "XOAUTH2", "--auth-token-file", tok,
                      env=SECRET, rc=75)
        self.assert_octets(peer.log, ehlo() + b"AUTH XOAUTH2 " +
                           b64(b"user=alice\x01auth=Bearer ya29.token\x01\x01") + CRLF +
                           CRLF + b"QUIT\r\n")
        self.assert_lines(r, temp_lines(code=535, enhanced="5.7.8"))
        self.assertIn("BadCredentials", r.lines[0][5])

    def test_q09_plain_initial_response_too_long_for_the_line(self):
        # 200-octet user, 250-octet password: "AUTH PLAIN " + base64 would pass 512 octets,
        # so the response follows the 334 (RFC 4954 §4)
        user, pw = "alice" + "u" * 195, "p" * 250
        d = tempfile.mkdtemp(prefix="smtpe-hostile-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "pw")
        with open(path, "w") as f:
            f.write(pw + "\n")

        def script(s):
            s.greet(AUTH_CAPS % b"PLAIN")
            s.line()
            s.send(b"334 \r\n")
            s.line()
            s.send(b"235 2.7.0 ok\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, "--tls", "none", "--auth-plaintext-ok", "--auth-user", user,
                      "--auth-password-file", path, rc=0)
        response = b64(b"\0" + user.encode() + b"\0" + pw.encode())
        self.assertGreater(len(b"AUTH PLAIN ") + len(response) + 2, 512)
        self.assert_octets(peer.log, ehlo() + b"AUTH PLAIN\r\n" + response + CRLF +
                           group(caps=AUTH_CAPS % b"PLAIN") + stuffed(MSG) + b"QUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")])

    def test_no_fallback_after_535(self):
        def script(s):
            s.greet(AUTH_CAPS % b"PLAIN LOGIN")
            s.line()
            s.send(b"535 5.7.8 authentication failed\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, *AUTH_ARGS, env=SECRET, rc=75)
        self.assert_octets(peer.log, ehlo() + b"AUTH PLAIN " + b64(b"\0alice\0secret") + CRLF +
                           b"QUIT\r\n")
        self.assert_lines(r, temp_lines(code=535, enhanced="5.7.8"))

    def test_auth_refused_before_any_credential_without_tls(self):
        # without --auth-plaintext-ok no credential octet leaves in clear
        def script(s):
            s.greet(AUTH_CAPS % b"PLAIN LOGIN")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, "--tls", "none", "--auth-user", "alice", env=SECRET, rc=75)
        self.assert_octets(peer.log, ehlo() + b"QUIT\r\n")
        self.assert_lines(r, temp_lines())


def _login_test(first, second):
    def test(self):
        self.login(first, second)
    test.__doc__ = "Q08: AUTH LOGIN prompts %r, %r: the text is ignored" % (first, second)
    return test


for _name, _first, _second in LOGIN_PROMPTS:
    setattr(TestAuth, "test_q08_login_prompt_" + _name, _login_test(_first, _second))


# ------------------------------------------------------------------------------------------------
# Thousands of recipients against a slow reader: no deadlock, the unanswered-octets cap
# ------------------------------------------------------------------------------------------------
class TestManyRecipients(Base):
    N = 3000
    RCPTS = ["r%04d@example.com" % i for i in range(N)]
    REFUSED = set(range(0, N, 7))

    def script(self, s, pause_every=0):
        """Answers each command line as it is read (pause_every > 0: sleeps 2 ms after that
        many replies, so that the client runs ahead as far as it may); s.answered counts the
        octets of the lines answered, s.reads what had arrived at each read."""
        s.greet()
        s.count_reads = True
        s.answered = len(ehlo())
        i, k = -1, 0
        while True:
            line = s.line()
            if line == b"DATA\r\n":
                break
            if line.startswith(b"RCPT"):
                i += 1
                s.send(b"550 5.1.1 no such user\r\n" if i in self.REFUSED else
                       b"250 2.1.5 ok\r\n")
            else:
                s.send(b"250 2.1.0 ok\r\n")
            s.answered += len(line)
            k += 1
            if pause_every and k % pause_every == 0:
                time.sleep(0.002)
        s.count_reads = False
        s.send(b"354 go\r\n")
        s.data()
        s.send(b"250 2.0.0 queued\r\n")
        s.line()
        s.send(b"221 2.0.0 bye\r\n")
        s.close()

    def check(self, peer):
        r = self.send(peer, rcpts=self.RCPTS, rc=69, timeout=ts.bound(40))
        self.assert_octets(peer.log, ehlo() + group(rcpts=self.RCPTS) + stuffed(MSG) +
                           b"QUIT\r\n")
        self.assert_lines(r, [(1, a, "permanent", 550, "5.1.1") if i in self.REFUSED else
                              (1, a, "delivered", 250, "2.0.0")
                              for i, a in enumerate(self.RCPTS)])
        # at every read at most MAX_UNANSWERED command octets had come beyond those answered
        # (the client can have seen no more replies than were sent)
        worst = max(total - answered for total, answered in peer.reads)
        self.assertLessEqual(worst, MAX_UNANSWERED, "unanswered command octets")
        return worst

    def test_3000_recipients_slow_reader_tiny_buffers(self):
        # reads 512 octets at a time through a 2 KB receive buffer, writes each reply at once
        # through a 2 KB send buffer (blocking): a client that wrote on without reading its
        # replies would deadlock with it
        peer = self.peer(lambda s: self.script(s), rcvbuf=2048, sndbuf=2048, chunk=512,
                         delay=0.0005)
        self.check(peer)

    def test_3000_recipients_the_unanswered_octets_cap(self):
        # reads all there is, answers slowly: the client pipelines as far as its cap
        # (max_unanswered, 4096 octets) and no further
        peer = self.peer(lambda s: self.script(s, pause_every=40))
        worst = self.check(peer)
        self.assertGreater(worst, MAX_UNANSWERED // 2, "the client hardly pipelined")


# ------------------------------------------------------------------------------------------------
# Content built to smuggle a second message (Q10)
# ------------------------------------------------------------------------------------------------
SMUGGLE = [
    ("lf_dot_crlf", b"Subject: s\r\n\r\nhello\n.\r\nMAIL FROM:<evil@example.net>\r\n"
                    b"RCPT TO:<victim@example.com>\r\nDATA\r\n\r\nforged\r\n.\r\n"),
    ("cr_dot_crlf", b"Subject: s\r\n\r\nhello\r.\r\nMAIL FROM:<evil@example.net>\r\n"),
    ("crlf_dot_lf", b"Subject: s\r\n\r\nhello\r\n.\nMAIL FROM:<evil@example.net>\r\n"),
    ("lone_dots", b"Subject: s\r\n\r\n.\r\n..\r\n.\r\n.x\r\nend\r\n"),
    ("dot_first", b".\r\nSubject: s\r\n\r\nbody\r\n"),
    ("dot_last_no_crlf", b"Subject: s\r\n\r\nbody\r\n."),
]


class TestSmuggling(Base):
    """The received DATA section (or the BDAT chunks), decoded, is exactly the one message:
    no bare CR or LF on the wire, every line-start dot doubled."""

    def data_case(self, msg):
        got = {}

        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
            got["content"] = s.data()
            s.send(b"250 2.0.0 queued\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, msg=msg, rc=0)
        self.assert_octets(peer.log, ehlo() + group(msg) + stuffed(msg) + b"QUIT\r\n")
        wire = got["content"]
        self.assertIsNone(re.search(rb"\r(?!\n)|(?<!\r)\n", wire), "a bare CR or LF")
        self.assertEqual(unstuff(wire), normalised(msg))
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")])

    def bdat_case(self, msg):
        got = []

        def script(s):
            s.greet(CHUNKING_CAPS)
            s.lines(2)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n")
            got.extend(read_chunks(s))
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, msg=msg, rc=0)
        self.assert_octets(peer.log, ehlo() + mail(msg, CHUNKING_CAPS) + rcpt() +
                           b"".join(l + p for l, p in got) + b"QUIT\r\n")
        self.assertEqual(b"".join(p for _, p in got), normalised(msg))
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")])

    def refuse_case(self, msg):
        # --line-ending refuse: a bare CR or LF refuses the message before MAIL (65)
        def script(s):
            s.greet()
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, "--line-ending", "refuse", msg=msg, rc=65)
        self.assert_octets(peer.log, ehlo() + b"QUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "permanent", 0, "5.6.0")])


def unstuff(wire):
    """The message in a DATA section (through its final .CRLF): dot-stuffing undone."""
    assert wire.endswith(b".\r\n"), wire[-20:]
    lines = wire[:-3].split(CRLF)[:-1] if wire != b".\r\n" else []
    return b"".join((l[1:] if l.startswith(b".") else l) + CRLF for l in lines)


def _smuggle_tests(msg):
    bare = re.search(rb"\r(?!\n)|(?<!\r)\n", msg) is not None

    def data(self):
        self.data_case(msg)

    def bdat(self):
        self.bdat_case(msg)

    def refuse(self):
        self.refuse_case(msg)
    return data, bdat, (refuse if bare else None)


for _name, _msg in SMUGGLE:
    _d, _b, _r = _smuggle_tests(_msg)
    setattr(TestSmuggling, "test_q10_%s_data" % _name, _d)
    setattr(TestSmuggling, "test_q10_%s_bdat" % _name, _b)
    if _r:
        setattr(TestSmuggling, "test_q10_%s_refused" % _name, _r)


# ------------------------------------------------------------------------------------------------
# Silence and lost connections (Q14)
# ------------------------------------------------------------------------------------------------
class TestSilence(Base):
    def test_closed_after_the_final_dot_without_a_reply(self):
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
            s.data()
            s.close()
        peer = self.peer(script)
        r = self.send(peer, rc=75)
        self.assert_octets(peer.log, ehlo() + group() + stuffed(MSG))
        self.assert_lines(r, temp_lines(outcome="unknown"))
        self.assertIn("connection lost", r.err)

    def test_q14_final_dot_never_answered(self):
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
            s.data()
            s.line()
        peer = self.peer(script)
        r = self.send(peer, "--timeout-ms", "500", rc=75)
        self.assert_octets(peer.log, ehlo() + group() + stuffed(MSG))
        self.assert_lines(r, temp_lines(outcome="unknown"))
        self.assertGreaterEqual(r.elapsed, 0.5)
        self.assertLess(r.elapsed, ts.bound(5))
        self.assertIn("timed out", r.err)
        self.assert_retired(peer)

    def test_greeting_never_comes(self):
        peer = self.peer(lambda s: s.line())
        r = self.send(peer, "--timeout-ms", "500", "--messages", "2", rc=75)
        self.assert_octets(peer.log, b"")
        self.assert_lines(r, temp_lines() + temp_lines(n=2))
        self.assertGreaterEqual(r.elapsed, 0.5)
        self.assertLess(r.elapsed, ts.bound(5))
        self.assertIn("timed out", r.err)
        self.assert_retired(peer)


# ------------------------------------------------------------------------------------------------
# Refusals inside a pipelined group (Q04, Q05, Q13)
# ------------------------------------------------------------------------------------------------
class TestRefusals(Base):
    def test_two_transactions_over_data(self):
        # the baseline for "the next transaction is not desynchronised" (Q04, Q07, Q13)
        def script(s):
            s.greet()
            for _ in range(2):
                s.lines(3)
                s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n354 go\r\n")
                s.data()
                s.send(b"250 2.0.0 queued\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, "--messages", "2", rc=0)
        self.assert_octets(peer.log, ehlo() + (group() + stuffed(MSG)) * 2 + b"QUIT\r\n")
        self.assert_lines(r, [(n, RCPT, "delivered", 250, "2.0.0") for n in (1, 2)])

    def test_two_transactions_over_bdat_chunks(self):
        msg = b"Subject: chunks\r\n\r\n" + b"0123456789abcdef" * 2500 + CRLF  # 40 KB
        got = []

        def script(s):
            s.greet(CHUNKING_CAPS)
            for _ in range(2):
                s.lines(2)
                s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n")
                got.append(read_chunks(s))
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, "--messages", "2", msg=msg, rc=0)
        txns = [mail(msg, CHUNKING_CAPS) + rcpt() + b"".join(l + p for l, p in c) for c in got]
        self.assert_octets(peer.log, ehlo() + b"".join(txns) + b"QUIT\r\n")
        for c in got:
            self.assertGreater(len(c), 1)
            self.assertEqual(b"".join(p for _, p in c), normalised(msg))
        self.assert_lines(r, [(n, RCPT, "delivered", 250, "2.0.0") for n in (1, 2)])

    def test_q04_rcpt_refused_and_data_503(self):
        def script(s):
            s.greet()
            s.lines(3)
            s.send(b"250 2.1.0 ok\r\n550 5.1.1 no such user\r\n503 5.5.1 no valid recipients\r\n")
            s.line()  # RSET
            s.send(b"250 2.0.0 ok\r\n")
            ordinary_txn(s)
        peer = self.peer(script)
        r = self.send(peer, "--messages", "2", rc=69)
        self.assert_octets(peer.log, ehlo() + group() + b"RSET\r\n" + group() + stuffed(MSG) +
                           b"QUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "permanent", 550, "5.1.1"),
                              (2, RCPT, "delivered", 250, "2.0.0")])

    def test_q05_354_after_every_recipient_was_refused(self):
        def script(s):
            s.greet()
            s.lines(4)
            s.send(b"250 2.1.0 ok\r\n550 5.1.1 no\r\n451 4.3.0 later\r\n354 go\r\n")
            s.data()
            s.send(b"554 5.5.1 no valid recipients\r\n")
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, rcpts=(RCPT, V), rc=75)
        self.assert_octets(peer.log, ehlo() + group(rcpts=(RCPT, V)) + b".\r\nQUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "permanent", 550, "5.1.1"),
                              (1, V, "temporary", 451, "4.3.0")])

    def test_q13_bdat_chunk_refused_552(self):
        # the first chunk of a 40 KB message refused: no more BDAT, no LAST, RSET before the
        # next MAIL (--messages 2), which goes whole
        msg = b"Subject: chunks\r\n\r\n" + b"0123456789abcdef" * 2500 + CRLF
        got = {}

        def script(s):
            s.greet(CHUNKING_CAPS)
            s.lines(2)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n")
            line = s.line()
            got["first"] = (line, s.bdat(line)[0])
            s.send(b"552 5.3.4 message too big\r\n")
            s.line()  # RSET
            s.send(b"250 2.0.0 reset\r\n")
            s.lines(2)
            s.send(b"250 2.1.0 ok\r\n250 2.1.5 ok\r\n")
            got["chunks"] = read_chunks(s)
            s.line()
            s.send(b"221 2.0.0 bye\r\n")
            s.close()
        peer = self.peer(script)
        r = self.send(peer, "--messages", "2", msg=msg, rc=69)
        line, payload = got["first"]
        self.assertRegex(line, rb"^BDAT \d+\r\n$")  # not LAST: 40 KB take several chunks
        self.assertTrue(normalised(msg).startswith(payload))
        txn = mail(msg, CHUNKING_CAPS) + rcpt()
        self.assert_octets(peer.log, ehlo() + txn + line + payload + b"RSET\r\n" + txn +
                           b"".join(l + p for l, p in got["chunks"]) + b"QUIT\r\n")
        self.assertEqual(b"".join(p for _, p in got["chunks"]), normalised(msg))
        self.assert_lines(r, [(1, RCPT, "permanent", 552, "5.3.4"),
                              (2, RCPT, "delivered", 250, "2.0.0")])


# ------------------------------------------------------------------------------------------------
# Arguments (Q11, Q12)
# ------------------------------------------------------------------------------------------------
class TestArguments(Base):
    def test_q11_cr_or_lf_in_an_argument_no_octet_at_all(self):
        cases = [
            ["--to", RCPT + "\r\nRCPT TO:<x@example.net>"],
            ["--to", RCPT, "--from", FROM + "\nRSET"],
            ["--to", RCPT, "--helo", HELO + "\rMAIL FROM:<x@y.example>"],
            ["--to", RCPT, "--auth-user", "alice\r\nAUTH PLAIN", "--auth-plaintext-ok"],
        ]
        for args in cases:
            with self.subTest(args=args):
                lsock = socket.socket()
                self.addCleanup(lsock.close)
                lsock.bind(("127.0.0.1", 0))
                lsock.listen(4)
                a = ["--server", "127.0.0.1:%d" % lsock.getsockname()[1], "--helo", HELO,
                     "--from", FROM] + args
                r = run_send(a, env=SECRET)
                self.assertEqual(r.rc, 64, r)
                self.assertEqual(r.lines, [], r)
                self.assertIn("CR or LF", r.err)
                lsock.setblocking(False)
                with self.assertRaises(BlockingIOError, msg="smtpe-send connected"):
                    lsock.accept()

    def test_q12_orcpt_and_envid_xtext_encoded(self):
        caps = b"250-peer.test\r\n250-PIPELINING\r\n250-DSN\r\n250 ENHANCEDSTATUSCODES\r\n"
        peer = self.peer(lambda s: ordinary(s, caps=caps))
        r = self.send(peer, "--envid", "id+1=2", "--orcpt", "rfc822;a+b=c@example.com",
                      "--notify", "SUCCESS,FAILURE", "--ret", "hdrs", rc=0)
        self.assert_octets(peer.log, ehlo() +
                           b"MAIL FROM:<a@example.org> RET=HDRS ENVID=id+2B1+3D2\r\n"
                           b"RCPT TO:<u@example.com> NOTIFY=SUCCESS,FAILURE "
                           b"ORCPT=rfc822;a+2Bb+3Dc@example.com\r\nDATA\r\n" + stuffed(MSG) +
                           b"QUIT\r\n")
        self.assert_lines(r, [(1, RCPT, "delivered", 250, "2.0.0")])


# ------------------------------------------------------------------------------------------------
if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    SEND = os.environ.get("SMTPE_SEND") or os.path.join(here, "..", "..", "build", "smtpe-send")
    if "--send" in sys.argv:
        i = sys.argv.index("--send")
        SEND = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    SEND = os.path.abspath(SEND)
    if not os.access(SEND, os.X_OK):
        print("smtpe-send not found or not executable: %s" % SEND, file=sys.stderr)
        print("0 passed, 1 failed")
        sys.exit(1)
    sys.exit(ts.main(sys.modules[__name__]))
