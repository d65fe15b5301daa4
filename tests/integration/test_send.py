#!/usr/bin/env python3
"""Integration tests of smtpe-send, the client program on the client engine, against the real
smtpe-server: delivery into its Maildir byte for byte (after the documented normalisation: a
bare CR or LF becomes CRLF, a missing final CRLF is added), several recipients, --messages,
LMTP over TCP and a unix socket, STARTTLS with a generated certificate, implicit TLS (through
a TLS-terminating relay in this file, as smtpe-server has no implicit-TLS listener), AUTH PLAIN
against --auth-users, and the exit statuses of the contract: 0, 64 (usage, a CR or LF in an
argument), 65 (refused locally before MAIL), 69 (refused recipient), 75 (temporary, unknown,
connection refused, timeout). Scripted peers in this file stand for servers smtpe-server
cannot be made into (silent, or gone after the end of the content).

Each test starts its own smtpe-server (test_extensions.Server: fresh Maildir, TCP or unix:
listener), runs smtpe-send as a subprocess, parses its standard output line by line
("N RECIPIENT OUTCOME CODE ENHANCED TEXT") and checks the stored messages and the server's
log; the server must exit 0 on SIGTERM.

Usage: test_send.py [SERVER] --send SMTPE_SEND [--wrapper "CMD ARGS"] [--slow N] [-k PATTERN]
                    [-q]
  SERVER as in test_server.py; SMTPE_SEND defaults to $SMTPE_SEND, then build/smtpe-send.
Needs the openssl command (tests/deps.sh installs it).
"""

import os
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (helpers only)
import test_extensions as tx  # noqa: E402  (its Server, fixtures; its tests are not loaded)

SEND = None  # path of smtpe-send, set in __main__
CRLF = b"\r\n"
LINE = re.compile(r"^(\d+) (\S+) (delivered|permanent|temporary|unknown) (\d{3}) (\S+) (.*)$")
FIX = tx.FIX


def setUpModule():
    tx.SAFETY = ts.SAFETY  # main() scaled it (--slow) after test_extensions was imported
    tx.setUpModule()


def tearDownModule():
    tx.tearDownModule()


def normalised(msg):
    """What --line-ending normalise (the default) sends for msg: each bare CR and bare LF as
    CRLF, and a final CRLF if the message lacks one."""
    out = re.sub(rb"\r\n|\r|\n", CRLF, msg)
    return out if out.endswith(CRLF) else out + CRLF


class Result:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")
        self.lines = []
        for l in self.out.splitlines():
            m = LINE.match(l)
            if not m:
                raise AssertionError("not an outcome line: %r\nstdout:\n%s\nstderr:\n%s"
                                     % (l, self.out, self.err))
            self.lines.append((int(m.group(1)), m.group(2), m.group(3), int(m.group(4)),
                               m.group(5), m.group(6)))

    def __repr__(self):
        return "exit %d\nstdout:\n%s\nstderr:\n%s" % (self.rc, self.out, self.err)


class Base(tx.Base):
    def send(self, *args, msg=b"Subject: t\r\n\r\nbody\r\n", server=None, env=None, rc=None,
             timeout=None):
        """Runs smtpe-send args with msg on its standard input; returns a Result. server: a
        Server (its address becomes --server) or an address string; rc: the exit status
        wanted."""
        cmd = [SEND]
        if server is not None:
            addr = server if isinstance(server, str) else (
                "unix:" + server.path if server.port is None else "127.0.0.1:%d" % server.port)
            cmd += ["--server", addr]
        e = dict(os.environ)
        e.pop("SMTPE_PASSWORD", None)
        e.update(env or {})
        p = subprocess.run(cmd + list(args), input=msg, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=e,
                           timeout=timeout or ts.bound(60))
        r = Result(p)
        for mark in ts.SANITIZER_MARKS:
            self.assertNotIn(mark, r.err, "sanitizer report from smtpe-send:\n%s" % r.err)
        if rc is not None:
            self.assertEqual(r.rc, rc, r)
        return r

    def assert_lines(self, r, want):
        """want: [(N, RECIPIENT, OUTCOME, CODE)] in order; ENHANCED and TEXT are checked by
        the caller where they matter."""
        self.assertEqual([l[:4] for l in r.lines], want, r)

    def qids(self, r):
        """The queue id of each line ('... Ok: queued as QID' or LMTP's '<rcpt> Ok: ...')."""
        out = []
        for l in r.lines:
            m = re.search(r"queued as (\S+)$", l[5])
            self.assertTrue(m, "no queue id in %r" % (l,))
            out.append(m.group(1))
        return out

    def assert_stored(self, srv, qid, content, sender="a@example.org"):
        st = self.stored_by_qid(srv, qid)
        self.assert_content(st.content, content)
        self.assertEqual(st.return_path, ("<%s>" % sender).encode("utf-8"))
        return st

    def no_session(self, srv):
        """The server saw no connection at all (read after its final log)."""
        log = srv.final_log()
        self.assertFalse([l for l in log if " disconnect " in l + " "], "\n".join(log))


# ------------------------------------------------------------------------------------------------
# Delivery
# ------------------------------------------------------------------------------------------------
class TestDelivery(Base):
    MSG = (b"From: Alice <a@example.org>\r\nTo: u@example.com\r\nSubject: exact\r\n\r\n"
           b"line one\r\n.leading dot\r\n..two dots\r\n.\r\nend\r\n")

    def test_byte_exact_bdat_and_data(self):
        srv = self.start()
        for chunking in ("auto", "never"):
            r = self.send("--from", "a@example.org", "--to", "u@example.com", "--chunking",
                          chunking, msg=self.MSG, server=srv, rc=0)
            self.assert_lines(r, [(1, "u@example.com", "delivered", 250)])
            self.assertEqual(r.lines[0][4], "2.0.0")
            self.assert_stored(srv, self.qids(r)[0], self.MSG)
        self.assertEqual(r.err, "")

    def test_normalised_line_ends_and_final_crlf(self):
        srv = self.start()
        msg = b"Subject: lf\nX-A: b\r\n\nbare lf\nbare cr\r.dot after cr\r\n\rno final crlf"
        r = self.send("--from", "a@example.org", "--to", "u@example.com", msg=msg, server=srv,
                      rc=0)
        self.assert_stored(srv, self.qids(r)[0], normalised(msg))

    def test_message_from_file_and_null_reverse_path(self):
        srv = self.start()
        d = tempfile.mkdtemp(prefix="smtpe-send-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "msg")
        with open(path, "wb") as f:
            f.write(self.MSG)
        r = self.send("--from", "", "--to", "u@example.com", path, msg=b"", server=srv, rc=0)
        self.assert_stored(srv, self.qids(r)[0], self.MSG, sender="")

    def test_paths_in_angle_brackets(self):
        # one enclosing pair of angle brackets is taken off, as MAIL and RCPT write a path;
        # "<>" is the null reverse-path like ""; RECIPIENT is printed without them
        srv = self.start()
        r = self.send("--from", "<a@example.org>", "--to", "<u@example.com>", "--to",
                      "v@example.com", msg=self.MSG, server=srv, rc=0)
        self.assert_lines(r, [(1, "u@example.com", "delivered", 250),
                              (1, "v@example.com", "delivered", 250)])
        self.assertEqual(r.err, "")
        self.assert_stored(srv, self.qids(r)[0], self.MSG)
        r = self.send("--from", "<>", "--to", "<postmaster>", msg=self.MSG, server=srv, rc=0)
        self.assert_lines(r, [(1, "postmaster", "delivered", 250)])
        self.assert_stored(srv, self.qids(r)[0], self.MSG, sender="")
        log = "\n".join(self.message_log(srv, 2))
        self.assertIn("from=<> nrcpt=1", log)
        self.assertIn("from=<a@example.org> nrcpt=2", log)
        # only one pair: what is left must be a path the engine can send, and the message
        # quotes the argument as given
        for args, text in (
                (["--from", "<<a@example.org>>", "--to", "u@example.com"],
                 "bad --from '<<a@example.org>>'"),
                (["--from", "a@example.org", "--to", "<<u@example.com>>"],
                 "bad --to '<<u@example.com>>'"),
                (["--from", "a@example.org", "--to", "<>"], "bad --to '<>'"),
                (["--from", "<a@example.org", "--to", "u@example.com"],
                 "bad --from '<a@example.org'"),
                (["--from", "a@example.org>", "--to", "u@example.com"],
                 "bad --from 'a@example.org>'")):
            with self.subTest(args=args):
                r = self.send(*args, server=srv, rc=64)
                self.assertEqual(r.lines, [], r)
                self.assertIn(text, r.err)
        self.assertEqual(len(srv.messages()), 2)

    def test_8bit_content_goes_8bitmime(self):
        srv = self.start()
        msg = "Subject: caf\u00e9\r\n\r\n\u00fcber\r\n".encode("utf-8")
        for chunking in ("auto", "never"):
            r = self.send("--from", "a@example.org", "--to", "u@example.com", "--chunking",
                          chunking, msg=msg, server=srv, rc=0)
            self.assert_stored(srv, self.qids(r)[0], msg)
        self.assertEqual(len(srv.messages()), 2)

    def test_binarymime_verbatim(self):
        srv = self.start()
        msg = b"Subject: bin\r\n\r\n\x00\x01\xff bare\nlf\rcr\r\n.\r\nno final"
        r = self.send("--from", "a@example.org", "--to", "u@example.com", "--body",
                      "binarymime", msg=msg, server=srv, rc=0)
        self.assert_stored(srv, self.qids(r)[0], msg)

    def test_large_message_back_pressure(self):
        srv = self.start("--max-message-size", "0")
        line = b"0123456789abcdefghijklmnopqrstuvwxyz" * 2 + b"\r\n"
        msg = b"Subject: large\r\n\r\n" + b"".join(
            (b"." if i % 7 == 0 else b"") + line for i in range(60000))  # about 4.4 MB
        for chunking in ("auto", "never"):
            r = self.send("--from", "a@example.org", "--to", "u@example.com", "--chunking",
                          chunking, msg=msg, server=srv, rc=0)
            self.assert_stored(srv, self.qids(r)[0], msg)

    def test_several_recipients_in_order(self):
        srv = self.start()
        rcpts = ["u@example.com", "v@example.com", "postmaster", "w@example.com"]
        args = ["--from", "a@example.org"]
        for a in rcpts:
            args += ["--to", a]
        r = self.send(*args, msg=self.MSG, server=srv, rc=0)
        self.assert_lines(r, [(1, a, "delivered", 250) for a in rcpts])
        self.assertEqual(len(set(self.qids(r))), 1, r)
        self.assert_stored(srv, self.qids(r)[0], self.MSG)
        self.assertIn("nrcpt=4", "\n".join(self.message_log(srv)))

    def test_messages_3_over_one_connection(self):
        srv = self.start()
        r = self.send("--from", "a@example.org", "--to", "u@example.com", "--to",
                      "v@example.com", "--messages", "3", msg=self.MSG, server=srv, rc=0)
        self.assert_lines(r, [(n, a, "delivered", 250) for n in (1, 2, 3)
                              for a in ("u@example.com", "v@example.com")])
        q = self.qids(r)
        self.assertEqual((q[0], q[2], q[4]), (q[1], q[3], q[5]), r)
        self.assertEqual(len({q[0], q[2], q[4]}), 3, r)
        for qid in q[::2]:
            self.assert_stored(srv, qid, self.MSG)
        disc = [l for l in srv.final_log() if " disconnect " in l]
        self.assertEqual(len(disc), 1, disc)
        self.assertIn(" mail=3 ", disc[0])
        self.assertIn(" end=quit", disc[0])


# ------------------------------------------------------------------------------------------------
# LMTP and unix sockets
# ------------------------------------------------------------------------------------------------
class TestLmtp(Base):
    MSG = b"Subject: lmtp\r\n\r\nper recipient\r\n.dot\r\n"

    def unix_path(self):
        d = tempfile.mkdtemp(prefix="smtpe-send-")
        self.addCleanup(shutil.rmtree, d, True)
        return os.path.join(d, "s.sock")

    def test_lmtp_over_tcp(self):
        srv = self.start("--lmtp", "--domain", "example.com")
        r = self.send("--lmtp", "--from", "a@example.org", "--to", "u@example.com", "--to",
                      "x@other.example", "--to", "v@example.com", msg=self.MSG, server=srv,
                      rc=69)
        self.assert_lines(r, [(1, "u@example.com", "delivered", 250),
                              (1, "x@other.example", "permanent", 550),
                              (1, "v@example.com", "delivered", 250)])
        self.assertRegex(r.lines[0][5], r"^<u@example\.com> Ok: queued as ")
        self.assertRegex(r.lines[2][5], r"^<v@example\.com> Ok: queued as ")
        self.assert_stored(srv, re.search(r"queued as (\S+)", r.lines[0][5]).group(1), self.MSG)

    def test_lmtp_unix_socket_messages_2(self):
        srv = self.start("--lmtp", listen="unix:" + self.unix_path())
        r = self.send("--lmtp", "--from", "a@example.org", "--to", "u@example.com", "--to",
                      "v@example.com", "--messages", "2", msg=self.MSG, server=srv, rc=0)
        self.assert_lines(r, [(n, a, "delivered", 250) for n in (1, 2)
                              for a in ("u@example.com", "v@example.com")])
        self.assertEqual(len(srv.messages()), 2)

    def test_smtp_unix_socket(self):
        srv = self.start(listen="unix:" + self.unix_path())
        r = self.send("--from", "a@example.org", "--to", "u@example.com", msg=self.MSG,
                      server=srv, rc=0)
        self.assert_stored(srv, self.qids(r)[0], self.MSG)

    def test_smtp_to_an_lmtp_server_is_refused(self):
        srv = self.start("--lmtp")
        r = self.send("--from", "a@example.org", "--to", "u@example.com", msg=self.MSG,
                      server=srv, rc=69)
        self.assert_lines(r, [(1, "u@example.com", "permanent", 500)])
        self.assertIn("session ended", r.err)
        self.assert_nothing_stored(srv)


# ------------------------------------------------------------------------------------------------
# TLS and AUTH
# ------------------------------------------------------------------------------------------------
class TlsRelay:
    """Implicit TLS (RFC 8314) in front of a plain server: accepts TLS on 127.0.0.1 (self.port)
    with the test certificate, connects to the server's port for each connection and copies
    the octets both ways. self.versions: the TLS version of each handshake."""

    def __init__(self, target_port):
        self.target = target_port
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(FIX["cert"], FIX["key"])
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.port = self.lsock.getsockname()[1]
        self.versions = []
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._relay, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _relay(self, conn):
        conn.settimeout(ts.SAFETY)
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()
            return
        self.versions.append(tls.version())
        up = socket.create_connection(("127.0.0.1", self.target), timeout=ts.SAFETY)
        try:
            self._pump(tls, up)
        except (ssl.SSLError, OSError):
            pass
        finally:
            up.close()
            tls.close()

    @staticmethod
    def _pump(tls, up):
        while True:
            readable, _, _ = select.select([tls, up], [], [], ts.SAFETY)
            if not readable:
                return
            for s in readable:
                data = s.recv(65536)
                while s is tls and data and tls.pending():
                    data += tls.recv(tls.pending())
                if not data:
                    return
                (up if s is tls else tls).sendall(data)

    def close(self):
        self.lsock.close()
        for t in self.threads:
            t.join(ts.SAFETY)


class TestTls(Base):
    MSG = b"Subject: tls\r\n\r\nover TLS\r\n.dot\r\n"

    def test_starttls_required_with_ca(self):
        srv = self.start(*tx.tls_args())
        r = self.send("--tls", "required", "--tls-ca", FIX["cert"], "--from", "a@example.org",
                      "--to", "u@example.com", msg=self.MSG, server=srv, rc=0)
        st = self.assert_stored(srv, self.qids(r)[0], self.MSG)
        self.assertIn(b" with ESMTPS ", tx.received_text(st))
        line = self.disconnect_line(srv)
        self.assertRegex(line, r" tls=TLSv1\.[23]/")

    def test_starttls_opportunistic_is_the_default(self):
        srv = self.start(*tx.tls_args())
        r = self.send("--server", "localhost:%d" % srv.port, "--tls-ca", FIX["cert"],
                      "--from", "a@example.org", "--to", "u@example.com", msg=self.MSG, rc=0)
        st = self.assert_stored(srv, self.qids(r)[0], self.MSG)
        self.assertIn(b" with ESMTPS ", tx.received_text(st))

    def test_starttls_certificate_checked(self):
        srv = self.start(*tx.tls_args())
        # the system store does not know the self-signed certificate
        r = self.send("--from", "a@example.org", "--to", "u@example.com", msg=self.MSG,
                      server=srv, rc=75)
        self.assert_lines(r, [(1, "u@example.com", "temporary", 0)])
        self.assertIn("certificate verify failed", r.err)
        # the name: the certificate is for localhost and 127.0.0.1 only
        r = self.send("--tls-ca", FIX["cert"], "--tls-servername", "mx.example", "--from",
                      "a@example.org", "--to", "u@example.com", msg=self.MSG, server=srv,
                      rc=75)
        self.assertIn("hostname mismatch", r.err)
        self.assert_nothing_stored(srv)
        r = self.send("--tls-insecure", "--tls-servername", "mx.example", "--from",
                      "a@example.org", "--to", "u@example.com", msg=self.MSG, server=srv,
                      rc=0)
        self.assert_stored(srv, self.qids(r)[0], self.MSG)

    def test_tls_required_but_not_offered(self):
        srv = self.start()
        r = self.send("--tls", "required", "--from", "a@example.org", "--to", "u@example.com",
                      msg=self.MSG, server=srv, rc=75)
        self.assert_lines(r, [(1, "u@example.com", "temporary", 0)])
        self.assertIn("TLS", r.err)
        line = self.disconnect_line(srv)
        self.assertIn(" mail=0 ", line)
        self.assert_nothing_stored(srv)

    def test_implicit_tls(self):
        # smtpe-server has no implicit-TLS listener: a TLS-terminating relay stands in front
        srv = self.start()
        relay = TlsRelay(srv.port)
        self.addCleanup(relay.close)
        r = self.send("--tls", "implicit", "--tls-ca", FIX["cert"], "--server",
                      "127.0.0.1:%d" % relay.port, "--from", "a@example.org", "--to",
                      "u@example.com", "--messages", "2", msg=self.MSG, rc=0)
        self.assert_lines(r, [(1, "u@example.com", "delivered", 250),
                              (2, "u@example.com", "delivered", 250)])
        for qid in self.qids(r):
            self.assert_stored(srv, qid, self.MSG)
        self.assertEqual(len(relay.versions), 1)
        self.assertRegex(relay.versions[0], r"^TLSv1\.[23]$")
        # implicit TLS to a plain server: the handshake fails, nothing is sent in clear
        r = self.send("--tls", "implicit", "--tls-ca", FIX["cert"], "--from", "a@example.org",
                      "--to", "u@example.com", msg=self.MSG, server=srv, rc=75, timeout=30)
        self.assert_lines(r, [(1, "u@example.com", "temporary", 0)])
        self.assertIn("TLS handshake", r.err)

    def test_auth_plain(self):
        srv = self.start(*tx.auth_args())
        base = ["--tls-ca", FIX["cert"], "--auth-user", "alice", "--auth-mechanism", "PLAIN",
                "--from", "alice@example.org", "--to", "u@example.com"]
        r = self.send(*base, msg=self.MSG, server=srv, env={"SMTPE_PASSWORD": "secret"}, rc=0)
        st = self.assert_stored(srv, self.qids(r)[0], self.MSG, sender="alice@example.org")
        self.assertIn(b" with ESMTPSA ", tx.received_text(st))
        self.assertTrue(srv.wait_log(lambda l: "auth " in l and "auth=alice" in l
                                     and "mechanism=PLAIN" in l), srv.log_text())
        # the password from a file, one final newline stripped; the default mechanism
        d = tempfile.mkdtemp(prefix="smtpe-send-")
        self.addCleanup(shutil.rmtree, d, True)
        pw = os.path.join(d, "pw")
        with open(pw, "w") as f:
            f.write("hunter2\n")
        r = self.send("--tls-ca", FIX["cert"], "--auth-user", "bob", "--auth-password-file", pw,
                      "--from", "bob@example.org", "--to", "u@example.com", msg=self.MSG,
                      server=srv, env={"SMTPE_PASSWORD": "not this one"}, rc=0)
        self.assert_stored(srv, self.qids(r)[0], self.MSG, sender="bob@example.org")

    def test_auth_refused_and_plaintext(self):
        srv = self.start(*tx.auth_args())
        base = ["--auth-user", "alice", "--from", "alice@example.org", "--to", "u@example.com"]
        r = self.send("--tls-ca", FIX["cert"], *base, msg=self.MSG, server=srv,
                      env={"SMTPE_PASSWORD": "wrong"}, rc=75)
        self.assert_lines(r, [(1, "u@example.com", "temporary", 535)])
        self.assertIn("authentication failed", r.err)
        # without TLS no credential octet leaves: the session ends before AUTH
        r = self.send("--tls", "none", *base, msg=self.MSG, server=srv,
                      env={"SMTPE_PASSWORD": "secret"}, rc=75)
        self.assert_lines(r, [(1, "u@example.com", "temporary", 0)])
        failed = [l for l in srv.final_log() if "auth-failed " in l]
        self.assertEqual(len(failed), 1, failed)  # the wrong password's session only
        self.assert_nothing_stored(srv)


# ------------------------------------------------------------------------------------------------
# Exit statuses: usage, local refusal, refused recipients, temporary failures
# ------------------------------------------------------------------------------------------------
class SilentPeer:
    """A listener that accepts and then says nothing (or, with script, runs it on the socket
    in a thread: script(sock))."""

    def __init__(self, script=None):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.port = self.lsock.getsockname()[1]
        self.conns = []
        self.script = script
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            conn, _ = self.lsock.accept()
        except OSError:
            return
        self.conns.append(conn)
        if self.script:
            conn.settimeout(ts.SAFETY)
            try:
                self.script(conn)
            except OSError:
                pass

    def close(self):
        self.lsock.close()
        self.thread.join(ts.SAFETY)
        for c in self.conns:
            c.close()


def lines_until(conn, buf, end):
    """Reads from conn until buf holds end; returns (the octets up to and with end, rest)."""
    while end not in buf:
        data = conn.recv(65536)
        if not data:
            raise OSError("client closed")
        buf += data
    i = buf.index(end) + len(end)
    return buf[:i], buf[i:]


class TestExitStatus(Base):
    def test_usage_errors(self):
        srv = self.start()
        good = ["--from", "a@example.org", "--to", "u@example.com"]
        cases = [
            ([], "--from is required"),
            (["--from", "a@example.org"], "--to is required"),
            # a CR or LF through argv: command injection must be impossible
            (["--from", "a@example.org", "--to", "u@example.com\r\nRCPT TO:<x@example.com>"],
             "contains a CR or LF"),
            (["--from", "a@example.org\nRSET", "--to", "u@example.com"], "contains a CR or LF"),
            (good + ["--helo", "client\r\nMAIL FROM:<x@y>"], "contains a CR or LF"),
            (good + ["--tls", "sometimes"], "bad --tls"),
            (good + ["--messages", "0"], "bad --messages"),
            (good + ["--mt-priority", "10"], "bad --mt-priority"),
            (good + ["--notify", "NEVER,SUCCESS"], "bad --notify"),
            (good + ["--deliver-by", "0;R"], "bad --deliver-by"),
            (good + ["--no-such-option"], "unknown option"),
            (good + ["--server", "127.0.0.1"], "--server"),
            (good + ["--auth-mechanism", "PLAIN"], "need --auth-user"),
            (good + ["--auth-user", "alice"], "needs a password"),
            (good + ["one", "two"], "more than one FILE"),
            (good + ["/nonexistent/message"], "/nonexistent/message"),
            (["--from", "a b@example.org", "--to", "u@example.com"], "bad --from"),
            (["--from", "a@example.org", "--to", "u@example.com", "--to", "<x"], "bad --to '<x'"),
            (good + ["--helo", "bad_name!"], "bad --helo"),
        ]
        for args, text in cases:
            with self.subTest(args=args):
                r = self.send(*args, server=srv, rc=64)
                self.assertEqual(r.lines, [], r)
                self.assertIn(text, r.err)
        self.no_session(srv)

    def test_help(self):
        p = subprocess.run([SEND, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=ts.bound(10))
        self.assertEqual(p.returncode, 0)
        self.assertTrue(p.stdout.startswith(b"usage: smtpe-send "), p.stdout)
        for opt in (b"--server", b"--lmtp", b"--tls-ca", b"--auth-mechanism", b"--messages",
                    b"--timeout-ms", b"N RECIPIENT OUTCOME CODE ENHANCED TEXT"):
            self.assertIn(opt, p.stdout)
        self.assertEqual(p.stderr, b"")

    def test_refused_locally_before_mail(self):
        srv = self.start()
        r = self.send("--line-ending", "refuse", "--from", "a@example.org", "--to",
                      "u@example.com", "--to", "v@example.com", "--messages", "2",
                      msg=b"Subject: x\r\n\r\nbare\nLF\r\n", server=srv, rc=65)
        self.assert_lines(r, [(n, a, "permanent", 0) for n in (1, 2)
                              for a in ("u@example.com", "v@example.com")])
        line = self.disconnect_line(srv)
        self.assertIn(" mail=0 ", line)
        self.assert_nothing_stored(srv)
        # NUL needs BINARYMIME: refused locally too
        r = self.send("--from", "a@example.org", "--to", "u@example.com",
                      msg=b"Subject: x\r\n\r\nnul \x00 here\r\n", server=srv, rc=65)
        self.assert_lines(r, [(1, "u@example.com", "permanent", 0)])
        self.assert_nothing_stored(srv)

    def test_refused_recipients(self):
        srv = self.start("--domain", "example.com", "--max-recipients", "2")
        r = self.send("--from", "a@example.org", "--to", "u@example.com", "--to",
                      "x@other.example", server=srv, rc=69)
        self.assert_lines(r, [(1, "u@example.com", "delivered", 250),
                              (1, "x@other.example", "permanent", 550)])
        self.assertEqual(r.lines[1][4], "5.7.1")
        # all refused: nothing is delivered, still 69
        r = self.send("--from", "a@example.org", "--to", "x@other.example", server=srv, rc=69)
        self.assert_lines(r, [(1, "x@other.example", "permanent", 550)])
        # too many recipients: 452, temporary, 75 even with a permanent one beside it
        r = self.send("--from", "a@example.org", "--to", "u@example.com", "--to",
                      "x@other.example", "--to", "v@example.com", "--to", "w@example.com",
                      server=srv, rc=75)
        self.assert_lines(r, [(1, "u@example.com", "delivered", 250),
                              (1, "x@other.example", "permanent", 550),
                              (1, "v@example.com", "delivered", 250),
                              (1, "w@example.com", "temporary", 452)])
        self.assertEqual(r.lines[3][4], "4.5.3")
        self.assertEqual(len(srv.messages()), 2)

    def test_recipient_field_is_one_word(self):
        # a quoted local part may hold spaces; RECIPIENT is written so that no address can
        # pose as the OUTCOME and CODE fields (found by a hostile-input trial)
        srv = self.start("--domain", "example.com")
        spoof = '"x delivered 250 2.0.0 ok"@other.example'
        r = self.send("--from", "a@example.org", "--to", spoof, "--to", "u@example.com",
                      server=srv, rc=69)
        self.assert_lines(r, [(1, r'"x\x20delivered\x20250\x202.0.0\x20ok"@other.example',
                               "permanent", 550),
                              (1, "u@example.com", "delivered", 250)])
        self.assertEqual(len(srv.messages()), 1)

    def test_connection_refused(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nobody listens there now
        r = self.send("--from", "a@example.org", "--to", "u@example.com", "--to",
                      "v@example.com", "--messages", "2", server="127.0.0.1:%d" % port, rc=75)
        self.assert_lines(r, [(n, a, "temporary", 0) for n in (1, 2)
                              for a in ("u@example.com", "v@example.com")])
        self.assertTrue(all(l[4] == "-" and "Connection refused" in l[5] for l in r.lines), r)
        self.assertIn("Connection refused", r.err)

    def test_timeout(self):
        peer = SilentPeer()
        self.addCleanup(peer.close)
        t0 = time.monotonic()
        r = self.send("--timeout-ms", "300", "--from", "a@example.org", "--to", "u@example.com",
                      server="127.0.0.1:%d" % peer.port, rc=75)
        self.assertLess(time.monotonic() - t0, ts.bound(5))
        self.assert_lines(r, [(1, "u@example.com", "temporary", 0)])
        self.assertIn("timed out", r.err)

    def test_session_ends_between_transactions(self):
        def script(conn):
            conn.sendall(b"220 peer ESMTP\r\n")
            buf = b""
            for reply in (b"250 peer", b"250 ok", b"250 ok", b"250 ok", b"354 go"):
                _, buf = lines_until(conn, buf, CRLF)  # EHLO, MAIL, RCPT, RCPT, DATA
                conn.sendall(reply + CRLF)
            _, buf = lines_until(conn, buf, b"\r\n.\r\n")
            conn.sendall(b"250 queued\r\n")
            _, buf = lines_until(conn, buf, CRLF)  # the second MAIL
            conn.sendall(b"421 shutting down\r\n")
            conn.shutdown(socket.SHUT_RDWR)
        peer = SilentPeer(script)
        self.addCleanup(peer.close)
        r = self.send("--from", "a@example.org", "--to", "u@example.com", "--to",
                      "v@example.com", "--messages", "3", server="127.0.0.1:%d" % peer.port,
                      rc=75)
        self.assert_lines(r, [(1, "u@example.com", "delivered", 250),
                              (1, "v@example.com", "delivered", 250),
                              (2, "u@example.com", "temporary", 421),
                              (2, "v@example.com", "temporary", 421),
                              (3, "u@example.com", "temporary", 0),
                              (3, "v@example.com", "temporary", 0)])
        self.assertTrue(all(l[5].startswith("not attempted") for l in r.lines[4:]), r)
        self.assertIn("421 shutting down", r.err)

    def test_421_diagnostic_as_received(self):
        # the server offers ENHANCEDSTATUSCODES, so the engine splits "4.3.2" from the text
        # of the 421; standard error still shows the reply's last line as it came: code,
        # enhanced code, text, and nothing of what followed it in the same segment
        caps = b"250-peer\r\n250-PIPELINING\r\n250 ENHANCEDSTATUSCODES\r\n"
        cases = [  # (what answers MAIL, the recipient's ENHANCED and TEXT)
            (b"421 4.3.2 going down\r\n250 2.0.0 not a reply to anything\r\n",
             "4.3.2", "going down"),
            (b"421-4.3.2 first line\r\n421 4.3.2 going down\r\n", "4.3.2", "going down"),
            (b"421 going down, no enhanced code\r\n", "-", "going down, no enhanced code"),
        ]
        for reply, enhanced, text in cases:
            def script(conn, reply=reply):
                conn.sendall(b"220 peer ESMTP\r\n")
                _, buf = lines_until(conn, b"", CRLF)  # EHLO
                conn.sendall(caps)
                lines_until(conn, buf, b"MAIL FROM:")
                conn.sendall(reply)
                conn.shutdown(socket.SHUT_RDWR)
            with self.subTest(reply=reply):
                peer = SilentPeer(script)
                self.addCleanup(peer.close)
                r = self.send("--tls", "none", "--from", "a@example.org", "--to",
                              "u@example.com", server="127.0.0.1:%d" % peer.port, rc=75)
                self.assert_lines(r, [(1, "u@example.com", "temporary", 421)])
                self.assertEqual(r.lines[0][4:], (enhanced, text), r)
                last = reply.rstrip(CRLF).split(CRLF)[-1].decode()
                if b"not a reply" in reply:
                    last = "421 4.3.2 going down"
                self.assertIn("session ended: the server closed the session: %s\n" % last,
                              r.err)
                self.assertNotIn("not a reply", r.err)

    def test_lost_after_the_content_is_unknown(self):
        def script(conn):
            conn.sendall(b"220 peer ESMTP\r\n")
            buf = b""
            for reply in (b"250 peer\r\n", b"250 ok\r\n", b"250 ok\r\n", b"354 go\r\n"):
                _, buf = lines_until(conn, buf, CRLF)
                conn.sendall(reply)
            lines_until(conn, buf, b"\r\n.\r\n")
            conn.shutdown(socket.SHUT_RDWR)  # gone without the verdict
        peer = SilentPeer(script)
        self.addCleanup(peer.close)
        r = self.send("--from", "a@example.org", "--to", "u@example.com",
                      server="127.0.0.1:%d" % peer.port, rc=75)
        self.assert_lines(r, [(1, "u@example.com", "unknown", 0)])
        self.assertIn("connection lost", r.err)


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
