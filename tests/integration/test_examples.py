#!/usr/bin/env python3
"""Integration tests of the example servers on foreign event loops: smtpe-example-uv (libuv,
bindings/libuv) and smtpe-example-event (libevent, bindings/libevent), over TCP with smtplib and
raw sockets.

Each test starts the program on 127.0.0.1 port 0 with a fresh --dir and checks every stored
message byte for byte: the file holds exactly the content as the client sent it, after
dot-unstuffing, with CRLF line ends (the examples add no trace header). At its end the program
must still be running, must exit 0 on SIGTERM, and must have written no sanitizer report on its
stderr (the ASan + UBSan build runs this suite too).

Usage: test_examples.py PROGRAM [-q] [-k PATTERN ...]

The one speed requirement is the point of concurrent verdicts: 50 pipelined RCPTs whose lookups
take 100 ms each must all be answered in far less than 50 x 100 ms; that test prints the time it
measured ("[example] 50 RCPTs with 100 ms lookups: ..."). Other time limits are safety bounds
against a hung server. Only the Python 3 standard library is used; the stderr reader, the raw
client and the recording smtplib come from test_server.py.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (the helpers of the smtpe-server suite)

PROGRAM = None  # the example server under test, set by main()
SAFETY = ts.SAFETY
CRLF = b"\r\n"
QUEUED = re.compile(r"2\.0\.0 Ok: queued as (\S+)")


# ------------------------------------------------------------------------------------------------
# The program under test
# ------------------------------------------------------------------------------------------------
class Example(ts.StderrLog):
    """One example server process with its own --dir (self.store)."""

    wait_log = ts.Server.wait_log
    wait_log_count = ts.Server.wait_log_count
    log_text = ts.Server.log_text

    def __init__(self, *args, listen="127.0.0.1:0"):
        self.dir = tempfile.mkdtemp(prefix="smtpe-example-")
        self.store = os.path.join(self.dir, "mail")
        self.cmd = [PROGRAM, "--listen", listen, "--dir", self.store] + [str(a) for a in args]
        self.name = PROGRAM
        self.stopped = False
        self.proc = subprocess.Popen(self.cmd, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._start_stderr_reader()
        line = self.wait_log(lambda l: l.startswith("listening on "), SAFETY)
        if line is None:
            self.proc.kill()
            self.proc.wait()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise AssertionError("%s printed no 'listening on' line; stderr:\n%s"
                                 % (" ".join(self.cmd), self.log_text()))
        m = re.fullmatch(r"listening on (\[[0-9A-Fa-f:.]+\]|[0-9.]+):(\d+)", line)
        if not m or int(m.group(2)) == 0:
            raise AssertionError("not 'listening on ADDR:PORT' with the real port: %r" % line)
        self.addr = m.group(1).strip("[]")
        self.port = int(m.group(2))

    def messages(self):
        """{file name: content} of the messages stored in --dir."""
        out = {}
        for name in sorted(os.listdir(self.store)):
            if name != "tmp":
                with open(os.path.join(self.store, name), "rb") as f:
                    out[name] = f.read()
        return out

    def tmp_files(self):
        return sorted(os.listdir(os.path.join(self.store, "tmp")))

    def wait_tmp_empty(self, timeout=None):
        """Waits until DIR/tmp is empty (the server removes a dropped message when it sees the
        client gone, which may come a moment after the client's close); returns what is left."""
        deadline = time.monotonic() + (SAFETY if timeout is None else timeout)
        while self.tmp_files() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.tmp_files()

    def message_lines(self, n):
        """The first n "message file=... size=... rcpts=..." lines (fewer after SAFETY)."""
        return self.wait_log_count(lambda l: l.startswith("message file="), n)

    def alive(self):
        return self.proc.poll() is None

    def cleanup(self):
        try:
            problems = []
            if not self.stopped:
                if not self.alive():
                    problems.append("the server died during the test (status %d)"
                                    % self.proc.returncode)
                    self.stopped = True
                    self.reader.join(SAFETY)
                else:
                    rc = self.stop()
                    if rc != 0:
                        problems.append("exit status %d after SIGTERM" % rc)
            if any(m in l for l in self.log() for m in ts.SANITIZER_MARKS):
                problems.append("sanitizer report on stderr")
            if problems:
                raise AssertionError("%s: %s\nstderr:\n%s" % (" ".join(self.cmd),
                                                              "; ".join(problems),
                                                              self.log_text(200)))
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Client(ts.Client):
    """test_server's raw client. rcvbuf (octets) sets SO_RCVBUF before connecting, so that the
    server sees a small window and its writes fill the socket."""

    def __init__(self, port, host="127.0.0.1", rcvbuf=None, greeting=True):
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                  socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(SAFETY)
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.seen = []
        if greeting:
            self.greeting = self.expect(220)

    def lines(self, n, timeout=None):
        """Reads exactly n reply lines (without CRLF), however they arrive."""
        deadline = time.monotonic() + (SAFETY if timeout is None else timeout)
        have = self.buf.count(b"\n")
        while have < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("only %d of %d reply lines within the time bound"
                                     % (have, n))
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise AssertionError("EOF after %d of %d reply lines" % (have, n))
            self.buf += chunk
            have += chunk.count(b"\n")
        got = self.buf.split(CRLF)
        self.buf = CRLF.join(got[n:])
        return [l.decode("utf-8", "replace") for l in got[:n]]


def queued_name(code, text):
    """The file name from the final reply "250 2.0.0 Ok: queued as NAME"."""
    text = text.decode() if isinstance(text, bytes) else text
    m = QUEUED.fullmatch(text)
    if code != 250 or not m:
        raise AssertionError("final reply is not '250 2.0.0 Ok: queued as NAME': %d %s"
                             % (code, text))
    return m.group(1)


# ------------------------------------------------------------------------------------------------
# Base test case
# ------------------------------------------------------------------------------------------------
class Base(unittest.TestCase):
    maxDiff = 2000

    def setUp(self):
        self._servers = []  # ts.Result shows their stderr for a failed test

    def start(self, *args, **kw):
        srv = Example(*args, **kw)
        self._servers.append(srv)
        self.addCleanup(srv.cleanup)
        return srv

    def client(self, srv, **kw):
        c = Client(srv.port, **kw)
        self.addCleanup(c.close)
        return c

    def smtp(self, srv):
        s = ts.RecordingSMTP("127.0.0.1", srv.port, timeout=SAFETY)
        self.addCleanup(s.close)
        return s

    def assert_stored(self, srv, name, content, rcpts):
        """The message name is in --dir holding exactly content, its log line says so, and
        DIR/tmp is empty."""
        msgs = srv.messages()
        self.assertIn(name, msgs, "no file %s in --dir: %r" % (name, sorted(msgs)))
        got = msgs[name]
        if got != content:
            i = next((k for k in range(min(len(got), len(content))) if got[k] != content[k]),
                     min(len(got), len(content)))
            self.fail("%s differs at octet %d (stored %d octets, sent %d): stored %r, sent %r"
                      % (name, i, len(got), len(content), got[max(0, i - 40):i + 40],
                         content[max(0, i - 40):i + 40]))
        line = "message file=%s/%s size=%d rcpts=%d" % (srv.store, name, len(content), rcpts)
        self.assertIsNotNone(srv.wait_log(lambda l: l == line), "no log line %r" % line)
        self.assertEqual(srv.tmp_files(), [], "files left in DIR/tmp")

    def sendmail(self, smtp, srv, sender, rcpts, msg, accepted=None):
        """smtplib's sendmail on an open connection; checks the stored copy against the octets
        smtplib sent (dot-unstuffed). Returns (file name, refused recipients)."""
        n = len(smtp.payloads)
        refused = smtp.sendmail(sender, rcpts, msg)
        name = queued_name(*smtp.data_replies[-1])
        sent = ts.unstuff(b"".join(smtp.payloads[n:]))
        self.assertEqual(sent, ts.smtplib_expected(msg))
        self.assert_stored(srv, name, sent, len(rcpts) if accepted is None else accepted)
        return name, refused

    def open_data(self, srv):
        """A client in DATA (354 received) for one recipient: its temporary file is there."""
        c = self.client(srv)
        c.ehlo()
        c.txn()
        c.data()
        self.assertEqual(len(srv.tmp_files()), 1, "no temporary file during DATA")
        return c


# ------------------------------------------------------------------------------------------------
# Messages
# ------------------------------------------------------------------------------------------------
class TestMessages(Base):
    def test_several_messages_on_one_connection(self):
        srv = self.start()
        s = self.smtp(srv)
        names = set()
        for i, body in enumerate([b"Hello.\r\n",
                                  b".leading dot\r\n..two dots\r\n.\r\nlast line\r\n",
                                  b"\xc3\xa9t\xc3\xa9 8-bit\r\n" + b"x" * 998 + b"\r\n"]):
            msg = (b"From: a@example.org\r\nTo: u@example.com\r\nSubject: message %d\r\n\r\n"
                   % i) + body
            name, refused = self.sendmail(s, srv, "a@example.org", ["u@example.com"], msg)
            self.assertEqual(refused, {})
            names.add(name)
        self.assertEqual(s.quit()[0], 221)
        self.assertEqual(len(names), 3)
        self.assertEqual(sorted(srv.messages()), sorted(names))

    def test_five_megabyte_message(self):
        srv = self.start()
        lines = []
        for i in range(5 * 1024 * 1024 // 76):  # 76 octets a line, CRLF included
            lead = b"." if i % 7 == 3 else b""
            lines.append(lead + (b"%08d " % i + b"abcdefghij" * 7)[:74 - len(lead)] + CRLF)
        lines[100] = b"." + CRLF  # a line that is a lone dot, stuffed on the wire
        msg = b"Subject: five megabytes\r\n\r\n" + b"".join(lines)
        self.assertGreater(len(msg), 5 * 1000 * 1000)
        s = self.smtp(srv)
        self.sendmail(s, srv, "a@example.org", ["u@example.com", "v@example.com"], msg)
        self.assertEqual(s.quit()[0], 221)


# ------------------------------------------------------------------------------------------------
# Recipients and concurrent verdicts
# ------------------------------------------------------------------------------------------------
class TestRecipients(Base):
    def test_domain(self):
        for ms in (0, 30):  # the verdict given at once, and from an asynchronous lookup
            with self.subTest(rcpt_lookup_ms=ms):
                srv = self.start("--domain", "example.com", "--rcpt-lookup-ms", ms)
                s = self.smtp(srv)
                s.ehlo("client.example")
                self.assertEqual(s.mail("a@example.org")[0], 250)
                self.assertEqual(s.rcpt("x@other.org"), (550, b"5.7.1 Relaying denied"))
                self.assertEqual(s.rcpt("u@example.com"), (250, b"2.1.5 Ok"))
                self.assertEqual(s.rcpt("<postmaster>")[0], 250)
                self.assertEqual(s.rset()[0], 250)
                name, refused = self.sendmail(
                    s, srv, "a@example.org",
                    ["u@example.com", "x@other.org", "V@EXAMPLE.COM", "y@example.com.evil"],
                    b"Subject: mixed\r\n\r\nto two of four\r\n", accepted=2)
                self.assertEqual(sorted(refused), ["x@other.org", "y@example.com.evil"])
                self.assertEqual(refused["x@other.org"], (550, b"5.7.1 Relaying denied"))
                self.assertEqual(s.quit()[0], 221)
                self.assertEqual(list(srv.messages()), [name], "delivered once")

    def test_pipelined_50_recipients_with_100ms_lookups(self):
        srv = self.start("--domain", "example.com", "--rcpt-lookup-ms", 100)
        c = self.client(srv)
        self.assertIn("250-PIPELINING", c.ehlo().lines)
        rcpts = [("<r%d@other.org>" % i, True) if i % 5 == 2 else ("<r%d@example.com>" % i, False)
                 for i in range(50)]  # 10 of the 50 in another domain
        batch = ("MAIL FROM:<a@example.org>\r\n" +
                 "".join("RCPT TO:%s\r\n" % r for r, _ in rcpts) + "DATA\r\n").encode()
        content = b"Subject: fifty\r\n\r\n" + b"".join(b"line %d\r\n" % i for i in range(20))
        t0 = time.monotonic()
        c.send(batch)  # one write: real pipelining (RFC 2920)
        c.expect("250 2.1.0 Ok")
        for i, (r, foreign) in enumerate(rcpts):
            want = "550 5.7.1 Relaying denied" if foreign else "250 2.1.5 Ok"
            self.assertEqual(c.reply().text, want, "reply to RCPT %d (%s)" % (i + 1, r))
        c.expect(354)
        rcpt_s = time.monotonic() - t0
        c.send(content + b".\r\n")
        r = c.reply()
        elapsed = time.monotonic() - t0
        name = queued_name(r.code, r.text[4:])
        print("\n[example] %s: 50 RCPTs with 100 ms lookups: %.3f s to the 354, %.3f s to the "
              "250 (serial lookups: 50 x 0.1 s = 5.0 s)"
              % (os.path.basename(PROGRAM), rcpt_s, elapsed))
        sys.stdout.flush()
        # (the loops' clocks count whole milliseconds: a timer may fire a little early)
        self.assertGreaterEqual(rcpt_s, 0.09, "the lookups did not take their 100 ms")
        self.assertLess(elapsed, 50 * 0.1 / 4, "the lookups did not run side by side")
        self.assert_stored(srv, name, content, 40)
        c.cmd("QUIT", 221)
        c.expect_eof()

    def test_lookup_longer_than_command_timeout(self):
        # Time spent on a verdict never counts against the client; the timeout restarts after it.
        srv = self.start("--rcpt-lookup-ms", 600, "--command-timeout-ms", 300)
        c = self.client(srv)
        c.ehlo()
        c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
        t0 = time.monotonic()
        c.cmd("RCPT TO:<u@example.com>", "250 2.1.5 Ok")
        self.assertGreaterEqual(time.monotonic() - t0, 0.55)
        r = c.reply()  # then the client is idle: 421 after 300 ms
        self.assertTrue(r.text.startswith("421 4.4.2"), r)
        self.assertGreaterEqual(time.monotonic() - t0, 0.85)
        c.expect_eof()


# ------------------------------------------------------------------------------------------------
# Timeouts
# ------------------------------------------------------------------------------------------------
class TestTimeouts(Base):
    def test_command_timeout(self):
        srv = self.start("--command-timeout-ms", 300)
        c = self.client(srv)
        c.ehlo()
        t0 = time.monotonic()
        r = c.reply()
        self.assertTrue(r.text.startswith("421 4.4.2"), r)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        c.expect_eof()
        self.assertEqual(srv.messages(), {})

    def test_data_timeout(self):
        srv = self.start("--data-timeout-ms", 300)
        c = self.open_data(srv)
        c.send(b"Subject: never finished\r\n\r\npart of a line")
        r = c.reply()
        self.assertTrue(r.text.startswith("421 4.4.2"), r)
        c.expect_eof()
        self.assertEqual(srv.wait_tmp_empty(), [], "the temporary file is left")
        self.assertEqual(srv.messages(), {})


# ------------------------------------------------------------------------------------------------
# Closing, back-pressure, signals
# ------------------------------------------------------------------------------------------------
class TestClosing(Base):
    def test_quit(self):
        srv = self.start()
        c = self.client(srv)
        c.ehlo()
        c.cmd("QUIT", "221 2.0.0 Bye")
        self.assertEqual(c.expect_eof(), b"")

    def test_disconnect_in_data(self):
        srv = self.start()
        c = self.open_data(srv)
        c.send(b"Subject: cut\r\n\r\n" + b"y" * 100000 + b"\r\n")
        c.close()
        self.assertEqual(srv.wait_tmp_empty(), [], "the temporary file is left")
        self.assertEqual(srv.messages(), {})
        s = self.smtp(srv)  # and the server goes on
        self.sendmail(s, srv, "a@example.org", ["u@example.com"], b"Subject: next\r\n\r\nok\r\n")

    def test_disconnect_with_lookups_pending(self):
        # The lookups' callbacks must not touch the freed session (ASan would see it). Without
        # DATA the engine still reads (the batch is open), so the server sees the EOF while the
        # lookups run; with DATA it reads no more until the verdicts are in, and its replies
        # then meet a closed socket.
        srv = self.start("--rcpt-lookup-ms", 300)
        for i in range(6):
            c = self.client(srv)
            c.ehlo()
            c.send("MAIL FROM:<a@example.org>\r\n" +
                   "".join("RCPT TO:<u%d@example.com>\r\n" % i for i in range(20)) +
                   ("DATA\r\n" if i % 2 else ""))
            c.expect(250)
            c.close()
        time.sleep(0.5)  # past the lookups' 300 ms
        self.assertTrue(srv.alive())
        s = self.smtp(srv)
        self.sendmail(s, srv, "a@example.org", ["u@example.com"], b"Subject: after\r\n\r\nok\r\n")

    def test_200_connections_closed_abruptly(self):
        srv = self.start("--rcpt-lookup-ms", 20)
        for i in range(200):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=SAFETY)
            kind = i % 4
            if kind == 1:
                s.recv(100)  # the greeting, then gone
            elif kind == 2:  # lookups on their way
                s.sendall(b"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<u@example.com>\r\n")
            elif kind == 3:  # in DATA (once the RCPT's verdict is in)
                s.sendall(b"EHLO x\r\nMAIL FROM:<a@b.example>\r\nRCPT TO:<u@example.com>\r\n"
                          b"DATA\r\nSubject: cut\r\n\r\npart")
            if i % 2:  # a reset instead of a FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        self.assertTrue(srv.alive())
        s = self.smtp(srv)
        self.sendmail(s, srv, "a@example.org", ["u@example.com"], b"Subject: still\r\n\r\nhere\r\n")
        self.assertEqual(srv.wait_tmp_empty(), [], "temporary files left")

    def test_client_that_does_not_read(self):
        # 20 000 NOOPs, each followed by 4 HELPs (76-octet replies: 6.5 MB in all, more than
        # the kernel's socket buffers take) and after every 10th a VRFY (answered by the host,
        # through an event), sent in one go by a client that reads nothing for 1 s: the replies
        # fill the socket, the engine's ring and the server's input buffer (back-pressure,
        # partial writes, the ring's second run); then all must arrive, in order.
        srv = self.start()
        c = self.client(srv, rcvbuf=4096)
        c.ehlo()
        cmds = []
        for i in range(20000):
            cmds += ["NOOP"] + ["HELP"] * 4
            if i % 10 == 9:
                cmds.append("VRFY u%d" % i)
        payload = "".join(cmd + "\r\n" for cmd in cmds).encode()
        errors = []

        def send():
            try:
                c.sock.sendall(payload)
            except OSError as e:
                errors.append(e)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(1.0)
        self.assertTrue(srv.alive())
        got = c.lines(len(cmds))
        sender.join(SAFETY)
        self.assertEqual(errors, [])
        want = ["252 " if cmd.startswith("VRFY") else "214 " if cmd == "HELP" else "250 2.0.0 Ok"
                for cmd in cmds]
        for i, (g, w) in enumerate(zip(got, want)):
            if not g.startswith(w):
                self.fail("reply %d to %r is %r" % (i + 1, cmds[i], g))
        c.cmd("QUIT", 221)
        c.expect_eof()

    def test_sigterm_with_clients(self):
        srv = self.start("--rcpt-lookup-ms", 5000)
        idle = self.client(srv)
        idle.ehlo()
        deciding = self.client(srv)  # its RCPT's lookup would take 5 s
        deciding.ehlo()
        deciding.send("MAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\n")
        deciding.expect("250 2.1.0 Ok")
        t0 = time.monotonic()
        rc = srv.stop()
        self.assertEqual(rc, 0, "exit status after SIGTERM")
        self.assertLess(time.monotonic() - t0, 4.0, "the exit waited for the lookup")
        for c in (idle, deciding):
            r = c.reply()
            self.assertTrue(r.text.startswith("421 4.3.2"), r)
            c.expect_eof()

    def test_sigterm_in_data(self):
        srv = self.start()
        c = self.open_data(srv)
        c.send(b"Subject: cut by SIGTERM\r\n\r\nsome")
        time.sleep(0.1)
        self.assertEqual(srv.stop(), 0, "exit status after SIGTERM")
        r = c.reply()
        self.assertTrue(r.text.startswith("421 4.3.2"), r)
        self.assertEqual(srv.tmp_files(), [], "the temporary file is left")
        self.assertEqual(srv.messages(), {})


class TestListen(Base):
    def test_ipv6(self):
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError:
            self.skipTest("no IPv6 loopback")
        srv = self.start(listen="[::1]:0")
        self.assertEqual(srv.addr, "::1")
        c = self.client(srv, host="::1")
        c.ehlo()
        c.txn()
        c.data()
        content = b"Subject: over IPv6\r\n\r\nok\r\n"
        c.send(content + b".\r\n")
        r = c.reply()
        self.assert_stored(srv, queued_name(r.code, r.text[4:]), content, 1)
        c.cmd("QUIT", 221)


def main():
    global PROGRAM
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("program", help="smtpe-example-uv or smtpe-example-event")
    ap.add_argument("-k", action="append", default=[], help="only tests matching this pattern")
    ap.add_argument("-q", action="store_true", help="less output")
    a = ap.parse_args()
    PROGRAM = os.path.abspath(a.program)
    if not os.access(PROGRAM, os.X_OK):
        print("not found or not executable: %s" % PROGRAM, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    loader = unittest.TestLoader()
    if a.k:
        loader.testNamePatterns = ["*%s*" % k for k in a.k]
    suite = loader.loadTestsFromModule(sys.modules[__name__])
    res = unittest.TextTestRunner(stream=sys.stdout, verbosity=1 if a.q else 2,
                                  resultclass=ts.Result).run(suite)
    failed = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
    skipped = len(res.skipped)
    line = "%d passed, %d failed" % (res.testsRun - failed - skipped, failed)
    print(line + (", %d skipped" % skipped if skipped else ""))
    return 1 if failed or res.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
