#!/usr/bin/env python3
"""Integration tests of smtpe-server --recipients FILE (known recipients, issue 14).

Under each host model (epoll, threads, prefork and reuseport with --workers 2): a known
mailbox gets 250 at RCPT, an unknown one 550 5.1.1 and the session stays in step (the next RCPT
works, the message is stored for the known ones only: smtplib's refused dict, the Received
header's "for <...>", the message log line's nrcpt=), a catch-all domain takes any local-part,
<postmaster> and postmaster@ a domain of the file are always accepted; SIGHUP with a changed
file (the session already open and new sessions see a user added and a user removed from their
next RCPT on; every process of prefork rereads), SIGHUP with a broken file (an error line
naming FILE:LINE from each process, the old table kept, the server still serving, and a later
good file taken). Once: the order with --domain and each refusal's text, LMTP's refusal at
RCPT, swaks against it, and a missing or bad file at start (exit 2 with the message).

Usage: test_recipients.py [SERVER] [-k PATTERN ...] [-q]  (test_server.py's options; its
--model is ignored here: every model is tested by name). Only the Python 3 standard library,
and swaks (tests/deps.sh).
"""

import os
import shutil
import signal
import smtplib
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (helpers only; its tests are not loaded here)

UNKNOWN = "550 5.1.1 <%s>: Recipient address rejected: User unknown"
OK = "250 2.1.5 Ok"
FIRST = "alice@example.com\nBob@Example.COM  # Bob\n@catchall.example\n"


class Base(ts.Base):
    model = "epoll"

    def model_args(self):
        args = ["--model", self.model]
        if self.model in ("prefork", "reuseport"):
            args += ["--workers", "2"]
        return args

    def processes(self):
        """The processes that each log one recipients line per reload."""
        return 3 if self.model == "prefork" else 1  # the supervisor and its two workers

    def start_with(self, text, *args):
        """A server (of this class' model) whose --recipients file holds text; the file's
        path is srv.rcpt_file."""
        d = ts.tempfile.mkdtemp(prefix="smtpe-rcpt-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "recipients")
        with open(path, "w") as f:
            f.write(text)
        srv = self.start(*(self.model_args() + ["--recipients", path] + list(args)))
        srv.rcpt_file = path
        line = srv.wait_log(lambda l: "]: recipients loaded " in l)
        self.assertIsNotNone(line, "no 'recipients loaded' line:\n%s" % srv.log_text())
        return srv

    def rewrite(self, srv, text):
        """Replaces the file as a deploy tool does: a new file renamed over the old one."""
        tmp = srv.rcpt_file + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, srv.rcpt_file)

    def sighup(self, srv, pred):
        """Sends SIGHUP and waits for a line matching pred from every process (the prefork
        workers too); returns those lines."""
        before = len(srv.wait_log_count(pred, 0, 0))
        srv.proc.send_signal(signal.SIGHUP)
        want = before + self.processes()
        got = srv.wait_log_count(pred, want)
        self.assertEqual(len(got), want, "expected %d lines after SIGHUP, got %r\n%s"
                         % (want, got, srv.log_text()))
        return got[before:]


class ModelTests:
    """The tests every model runs (mixed into one TestCase class per model below)."""

    def test_known_unknown_and_in_sync(self):
        srv = self.start_with(FIRST)
        c = self.session(srv)
        c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
        c.cmd("RCPT TO:<alice@example.com>", OK)
        c.cmd("RCPT TO:<carol@example.com>", UNKNOWN % "carol@example.com")
        c.cmd("RCPT TO:<ALICE@EXAMPLE.COM>", OK)          # case-insensitive
        c.cmd("RCPT TO:<bob@example.com>", OK)            # as Bob@Example.COM in the file
        c.cmd("RCPT TO:<bob@example.org>", UNKNOWN % "bob@example.org")
        c.cmd("RCPT TO:<any.one@catchall.example>", OK)   # the catch-all
        c.cmd("RCPT TO:<x@sub.catchall.example>", UNKNOWN % "x@sub.catchall.example")
        c.cmd("RCPT TO:<postmaster>", OK)
        c.cmd("RCPT TO:<Postmaster@example.com>", OK)     # a domain of the file
        c.cmd("RCPT TO:<postmaster@catchall.example>", OK)
        c.cmd("RCPT TO:<postmaster@example.net>", UNKNOWN % "postmaster@example.net")
        c.data()
        qid = self.finish_data(c, b"Subject: known\r\n\r\nto the known ones\r\n")
        st = self.stored_by_qid(srv, qid)
        self.assertEqual(st.content, b"Subject: known\r\n\r\nto the known ones\r\n")
        c.cmd("QUIT", 221)
        line = srv.wait_log(lambda l: ts.is_message(l, qid))
        self.assertIn(" nrcpt=7 ", line)  # the 250s only
        # smtplib: one known, one unknown; the message is stored for the known one only
        msg = b"Subject: smtplib\r\n\r\nhello alice\r\n"
        with smtplib.SMTP("127.0.0.1", srv.port, timeout=ts.SAFETY) as s:
            refused = s.sendmail("a@example.org", ["nobody@example.com", "alice@example.com"],
                                 msg)
            self.assertEqual(refused, {"nobody@example.com": (
                550, b"5.1.1 <nobody@example.com>: Recipient address rejected: User unknown")})
            # and the session goes on: a second message in the same session
            self.assertEqual(s.sendmail("a@example.org", ["u@catchall.example"], msg), {})
            with self.assertRaises(smtplib.SMTPRecipientsRefused) as cm:
                s.sendmail("a@example.org", ["zed@example.com"], msg)
            self.assertEqual(cm.exception.recipients["zed@example.com"][0], 550)
        msgs = [ts.Stored(n, d) for n, d in srv.messages()]
        self.assertEqual(len(msgs), 3)
        fors = sorted(b" ".join(m.received_lines).split(b"for <")[1].split(b">")[0]
                      for m in msgs if m.name.split(".")[1] != qid)
        self.assertEqual(fors, [b"alice@example.com", b"u@catchall.example"])

    def test_sighup_rereads(self):
        srv = self.start_with(FIRST)
        c = self.session(srv)  # a session open across the reload
        c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
        c.cmd("RCPT TO:<alice@example.com>", OK)
        c.cmd("RCPT TO:<dave@example.com>", UNKNOWN % "dave@example.com")
        self.rewrite(srv, "dave@example.com\nbob@example.com\n# alice left\n@new.example\n")
        lines = self.sighup(srv, lambda l: "]: recipients reloaded " in l)
        for l in lines:
            self.assertIn(" mailboxes=2 catch-alls=1", l)
        # the session in progress, from its next RCPT
        c.cmd("RCPT TO:<dave@example.com>", OK)
        c.cmd("RCPT TO:<alice@example.com>", UNKNOWN % "alice@example.com")
        c.cmd("RCPT TO:<u@catchall.example>", UNKNOWN % "u@catchall.example")
        c.cmd("RCPT TO:<u@new.example>", OK)
        c.data()
        qid = self.finish_data(c, b"Subject: across\r\n\r\nreload\r\n")
        self.stored_by_qid(srv, qid)
        c.cmd("QUIT", 221)
        # new sessions (several: under prefork and reuseport they spread over the workers)
        for i in range(6):
            n = self.session(srv)
            n.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
            n.cmd("RCPT TO:<alice@example.com>", UNKNOWN % "alice@example.com")
            n.cmd("RCPT TO:<dave@example.com>", OK)
            n.cmd("RCPT TO:<postmaster@new.example>", OK)
            n.cmd("RCPT TO:<postmaster@catchall.example>", UNKNOWN % "postmaster@catchall.example")
            n.cmd("QUIT", 221)
            n.close()
        self.assertEqual(srv.stop(), 0)

    def test_sighup_broken_file_keeps_the_table(self):
        srv = self.start_with(FIRST)
        self.rewrite(srv, "dave@example.com\nthis is not an address\n")
        lines = self.sighup(srv, lambda l: "]: error recipients reload: " in l)
        for l in lines:
            self.assertIn("%s:2: " % srv.rcpt_file, l)
            self.assertIn("the previous table stays", l)
        for i in range(4):
            c = self.session(srv)
            c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
            c.cmd("RCPT TO:<alice@example.com>", OK)
            c.cmd("RCPT TO:<dave@example.com>", UNKNOWN % "dave@example.com")
            c.data()
            self.stored_by_qid(srv, self.finish_data(c, b"Subject: old table\r\n\r\nx\r\n"))
            c.cmd("QUIT", 221)
            c.close()
        # a missing file is the same; then a good one is taken
        os.unlink(srv.rcpt_file)
        lines = self.sighup(srv, lambda l: "No such file or directory" in l)
        self.rewrite(srv, "dave@example.com\n")
        self.sighup(srv, lambda l: "]: recipients reloaded " in l)
        for i in range(4):
            c = self.session(srv)
            c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
            c.cmd("RCPT TO:<dave@example.com>", OK)
            c.cmd("RCPT TO:<alice@example.com>", UNKNOWN % "alice@example.com")
            c.cmd("QUIT", 221)
            c.close()
        self.assertEqual(srv.stop(), 0)


class TestEpoll(Base, ModelTests):
    model = "epoll"


class TestThreads(Base, ModelTests):
    model = "threads"


class TestPrefork(Base, ModelTests):
    model = "prefork"


class TestReuseport(Base, ModelTests):
    model = "reuseport"


class TestOnce(Base):
    def test_with_domain_list(self):
        # --domain first (550 5.7.1), then --recipients (550 5.1.1); postmaster passes both
        srv = self.start_with("alice@example.com\n@example.net\n", "--domain", "example.com")
        c = self.session(srv)
        c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
        c.cmd("RCPT TO:<alice@example.com>", OK)
        c.cmd("RCPT TO:<bob@example.com>", UNKNOWN % "bob@example.com")
        c.cmd("RCPT TO:<u@example.net>", "550 5.7.1 Relay access denied")
        c.cmd("RCPT TO:<u@example.org>", "550 5.7.1 Relay access denied")
        c.cmd("RCPT TO:<postmaster>", OK)
        c.cmd("RCPT TO:<postmaster@example.com>", OK)

    def test_lmtp(self):
        srv = self.start_with(FIRST, "--lmtp")
        c = self.client(srv)
        c.cmd("LHLO client.example", 250)
        c.cmd("MAIL FROM:<a@example.org>", "250 2.1.0 Ok")
        c.cmd("RCPT TO:<alice@example.com>", OK)
        c.cmd("RCPT TO:<carol@example.com>", UNKNOWN % "carol@example.com")
        c.cmd("RCPT TO:<u@catchall.example>", OK)
        c.data()
        c.send(b"Subject: lmtp\r\n\r\nhi\r\n.\r\n")
        r1, r2 = c.reply(), c.reply()  # one reply per accepted recipient (RFC 2033 §4.2)
        self.assertRegex(r1.text, r"^250 2\.0\.0 <alice@example\.com> Ok: queued as \S+$")
        self.assertRegex(r2.text, r"^250 2\.0\.0 <u@catchall\.example> Ok: queued as \S+$")
        c.cmd("QUIT", 221)
        self.assertEqual(len(self.stored(srv)), 1)

    def test_utf8_mailbox(self):
        srv = self.start_with("j\u00f6s\u00e9@example.com\n")
        c = self.session(srv)
        c.cmd("MAIL FROM:<a@example.org> SMTPUTF8", "250 2.1.0 Ok")
        c.cmd("RCPT TO:<J\u00f6S\u00e9@example.com>", OK)
        # not echoed (non-ASCII): the text without the address
        c.cmd("RCPT TO:<j\u00f6se@example.com>",
              "550 5.1.1 Recipient address rejected: User unknown")

    def test_swaks(self):
        srv = self.start_with(FIRST)
        swaks = shutil.which("swaks")
        self.assertIsNotNone(swaks, "swaks is not installed (run tests/deps.sh)")
        base = [swaks, "--server", "127.0.0.1:%d" % srv.port, "--from", "a@example.org",
                "--header", "Subject: swaks"]
        p = subprocess.run(base + ["--to", "alice@example.com"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=ts.bound(60))
        out = p.stdout.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, out)
        self.stored_by_qid(srv, ts.transcript_queue_id(p.stdout, "<-  "))
        p = subprocess.run(base + ["--to", "nobody@example.com"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=ts.bound(60))
        out = p.stdout.decode("utf-8", "replace")
        self.assertNotEqual(p.returncode, 0, out)  # swaks: 24, every recipient refused
        self.assertIn("<** " + UNKNOWN % "nobody@example.com", out)
        self.assertEqual(len(self.stored(srv)), 1)

    def test_bad_or_missing_file_at_start(self):
        d = ts.tempfile.mkdtemp(prefix="smtpe-rcpt-")
        self.addCleanup(shutil.rmtree, d, True)
        missing = os.path.join(d, "none")
        p = ts.run_server(["--listen", "127.0.0.1:0", "--sink", "--recipients", missing],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(("--recipients %s: No such file or directory" % missing).encode(),
                      p.stderr)
        bad = os.path.join(d, "bad")
        with open(bad, "w") as f:
            f.write("# ok so far\nalice@example.com\n<bob@example.com>\n")
        p = ts.run_server(["--listen", "127.0.0.1:0", "--sink", "--recipients", bad],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(("%s:3: " % bad).encode(), p.stderr)
        self.assertNotIn(b"listening on", p.stderr)
        p = ts.run_server(["--recipients", ""], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 2, p.stderr)

    def test_help(self):
        p = ts.run_server(["--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"--recipients FILE", p.stdout)


if __name__ == "__main__":
    sys.exit(ts.main(sys.modules[__name__]))
