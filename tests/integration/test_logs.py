#!/usr/bin/env python3
"""Integration tests of smtpe-server's log lines and of --lax-angle-brackets.

Each test starts its own smtpe-server (test_server.py's Server) and talks to it with smtplib; the
log (stderr) is read back line by line, in both forms:
  text   TIME smtpe[PID]: EVENT key=value ...      (TIME: RFC 3339 UTC with milliseconds)
  json   {"time":TIME,"pid":PID,"event":EVENT,"key":value,...}
and checked: every line parses and has a timestamp within the test's wall-clock window (none
with --log-no-time); all lines of a session share one sid= and another session has another;
the message line names the peer and both recipients (one of them non-ASCII, sent with
SMTPUTF8: %XX in text, itself in JSON); the disconnect line names the queue id the 250 gave;
50 sessions at once under the threads and prefork models leave only whole lines. And
--lax-angle-brackets: MAIL FROM:user@example.com without brackets is refused by default with
the engine's 501 and accepted with the switch.

Usage: test_logs.py [SERVER] [--model NAME] [-k PATTERN ...] [-q] (test_server.py's options)
Only the Python 3 standard library is used.
"""

import datetime
import json
import os
import re
import smtplib
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (the Server helper and main())

TEXT_LINE = re.compile(r"(?:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) )?smtpe\[(\d+)\]: (\S+)(.*)")
UTF8_RCPT = "j\u00f8rn@example.com"
MSG = b"Subject: log test\r\n\r\nHello.\r\n"
QUEUED = re.compile(r"queued as ([0-9A-F]+)")


class Record:
    """One log line, parsed: time (str or None), pid (int), event, fields (dict: key -> value,
    strings in text; JSON values in json), words (the rest)."""

    def __init__(self, line, fmt):
        self.line = line
        if fmt == "json":
            obj = json.loads(line)  # raises on anything but one whole object
            if not isinstance(obj, dict):
                raise ValueError("not an object: %r" % line)
            self.time = obj.pop("time", None)
            self.pid = obj.pop("pid")
            self.event = obj.pop("event")
            self.words = obj.pop("msg", "")
            self.fields = obj
            return
        m = TEXT_LINE.fullmatch(line)
        if not m:
            raise ValueError("not a log line: %r" % line)
        self.time, pid, self.event, rest = m.groups()
        self.pid = int(pid)
        self.fields, words = {}, []
        for w in rest.split():
            k, eq, v = w.partition("=")
            if eq and re.fullmatch(r"[A-Za-z0-9_-]+", k):
                self.fields[k] = v
            else:
                words.append(w)
        self.words = " ".join(words)

    def __repr__(self):
        return self.line


def utc_ms(stamp):
    """The RFC 3339 UTC timestamp "2026-12-02T17:20:05.123Z" as seconds since the epoch."""
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp):
        raise ValueError("not RFC 3339 UTC with milliseconds: %r" % stamp)
    t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def session(port, rcpts, sender="a@example.org", utf8=False):
    """One smtplib session: EHLO, MAIL (SMTPUTF8 if utf8), RCPT for each of rcpts, DATA, QUIT.
    Returns (the client's "127.0.0.1:PORT", the queue id the 250 gave)."""
    with smtplib.SMTP("127.0.0.1", port, timeout=ts.SAFETY) as s:
        s.ehlo("client.example")
        peer = "%s:%d" % s.sock.getsockname()[:2]
        code, text = s.mail(sender, ["SMTPUTF8"] if utf8 else [])
        assert code == 250, (code, text)
        for r in rcpts:
            code, text = s.rcpt(r)
            assert code == 250, (r, code, text)
        code, text = s.data(MSG)
        assert code == 250, (code, text)
        qid = QUEUED.search(text.decode()).group(1)
    return peer, qid


class JsonServer(ts.Server):
    """A Server whose log is JSON: the port comes from the "listening" object."""

    def __init__(self, *args):
        self.dir = __import__("tempfile").mkdtemp(prefix="smtpe-logs-")
        self.maildir = os.path.join(self.dir, "maildir")
        cmd = ["--listen", "127.0.0.1:0", "--maildir", self.maildir, "--hostname", ts.HOST]
        if "--model" not in args:
            cmd += ts.MODEL_ARGS
        self._spawn(cmd + ["--log-format", "json"] + list(args))
        line = self.wait_log(lambda l: '"event":"listening"' in l, ts.SAFETY)
        if line is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("no listening line: %s\n%s" % (" ".join(self.cmd),
                                                                 self.log_text()))
        m = re.search(r"on 127\.0\.0\.1:(\d+)", json.loads(line)["msg"])
        self.addr, self.port = "127.0.0.1", int(m.group(1))
        self.stopped = False


class LogTests(unittest.TestCase):

    def start(self, fmt, *args):
        srv = JsonServer(*args) if fmt == "json" else ts.Server(*args)
        self.addCleanup(srv.stop)
        return srv

    def records(self, srv, fmt):
        """Stops srv and parses every line of its log (each must parse)."""
        lines = srv.final_log()
        self.assertEqual(srv.proc.returncode, 0, "\n".join(lines))
        out = []
        for l in lines:
            try:
                out.append(Record(l, fmt))
            except (ValueError, KeyError) as e:
                self.fail("%s line does not parse (%s): %r\n%s" % (fmt, e, l, "\n".join(lines)))
        return out

    def check_two_sessions(self, fmt, *args, timed=True):
        t0 = time.time()
        srv = self.start(fmt, *args)
        peer_a, qid_a = session(srv.port, ["b@example.com", UTF8_RCPT], utf8=True)
        peer_b, qid_b = session(srv.port, ["c@example.com"])
        recs = self.records(srv, fmt)
        t1 = time.time()
        log = "\n".join(r.line for r in recs)
        for r in recs:
            if not timed:
                self.assertIsNone(r.time, r)
                continue
            self.assertIsNotNone(r.time, r)
            t = utc_ms(r.time)  # milliseconds cut, not rounded: floor the window too
            self.assertTrue(int(t0 * 1000) / 1000 <= t <= t1, "%s outside [%f, %f]" % (r, t0, t1))
            self.assertEqual(r.pid, srv.proc.pid, r)  # one process (epoll)
        by_sid = {}
        for r in recs:
            if "sid" in r.fields:
                self.assertRegex(r.fields["sid"], r"^[0-9a-f]{12}$", r)
                by_sid.setdefault(r.fields["sid"], []).append(r)
        sessions = {}
        for sid, rs in by_sid.items():
            connect = [r for r in rs if r.event == "connect"]
            self.assertEqual(len(connect), 1, "session %s: %s\n%s" % (sid, rs, log))
            self.assertEqual(rs[0].event, "connect", rs)
            self.assertEqual(rs[-1].event, "disconnect", rs)
            # every line naming the session's peer has its sid
            self.assertEqual({r.fields.get("peer") for r in rs}, {connect[0].fields["peer"]})
            sessions[connect[0].fields["peer"]] = rs
        self.assertEqual(set(sessions), {peer_a, peer_b}, log)
        others = [r for r in recs
                  if r.fields.get("peer") in (peer_a, peer_b) and "sid" not in r.fields]
        self.assertEqual(others, [], "session lines without sid")
        self.assertNotEqual(sessions[peer_a][0].fields["sid"], sessions[peer_b][0].fields["sid"])
        for peer, qid, rcpts in ((peer_a, qid_a, ["b@example.com", UTF8_RCPT]),
                                 (peer_b, qid_b, ["c@example.com"])):
            rs = sessions[peer]
            self.assertEqual([r.event for r in rs], ["connect", "message", "disconnect"], rs)
            msg, disc = rs[1], rs[2]
            self.assertEqual(msg.fields["id"], qid)
            self.assertEqual(msg.fields["peer"], peer)
            self.assertEqual(msg.fields["from"], "<a@example.org>")
            self.assertEqual(msg.fields["status"], "queued")
            if fmt == "json":
                self.assertEqual(msg.fields["rcpts"], rcpts)  # UTF-8 as itself
                self.assertEqual(msg.fields["nrcpt"], len(rcpts))  # numbers as numbers
                self.assertEqual(disc.fields["ids"], [qid])
                for k in ("mail", "rcpt", "data", "delivered", "errors", "in", "out", "ms"):
                    self.assertIsInstance(disc.fields[k], int, (k, disc))
                self.assertEqual(disc.fields["rcpt"], len(rcpts))
            else:
                want = ",".join(r.replace("\u00f8", "%C3%B8") for r in rcpts)
                self.assertEqual(msg.fields["rcpts"], want)
                self.assertEqual(msg.fields["nrcpt"], str(len(rcpts)))
                self.assertEqual(disc.fields["ids"], qid)
            self.assertEqual(str(disc.fields["delivered"]), "1")
            self.assertEqual(disc.fields["end"], "quit")
            self.assertEqual(disc.fields["helo"], "client.example")

    def test_text(self):
        self.check_two_sessions("text")

    def test_json(self):
        self.check_two_sessions("json")

    def test_text_no_time(self):
        self.check_two_sessions("text", "--log-no-time", timed=False)

    def test_json_no_time(self):
        self.check_two_sessions("json", "--log-no-time", timed=False)

    def test_bad_log_format(self):
        p = ts.run_server(["--log-format", "xml"], capture_output=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"bad --log-format", p.stderr)

    def check_concurrent(self, fmt, model):
        """50 sessions at once: every line whole, each session its own sid with one connect,
        one message and one disconnect line that names the message's queue id."""
        args = ["--model", model] + (["--workers", "2"] if model == "prefork" else [])
        srv = self.start(fmt, *args)
        n = 50
        barrier = threading.Barrier(n)
        results, errors = {}, []

        def client(i):
            try:
                barrier.wait(ts.SAFETY)
                rcpts = ["u%d@example.com" % i, "v%d\u00e9@example.com" % i]
                results[i] = session(srv.port, rcpts, utf8=True)
            except Exception as e:  # reported below
                errors.append("session %d: %r" % (i, e))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(ts.SAFETY * 3)
        self.assertEqual(errors, [])
        recs = self.records(srv, fmt)
        by_sid = {}
        for r in recs:
            if "sid" in r.fields:
                by_sid.setdefault(r.fields["sid"], []).append(r)
        self.assertEqual(len(by_sid), n, "sessions: %d sids" % len(by_sid))
        peers = {}
        for sid, rs in by_sid.items():
            self.assertEqual(sorted(r.event for r in rs), ["connect", "disconnect", "message"],
                             rs)
            ev = {r.event: r for r in rs}
            ids, qid = ev["disconnect"].fields["ids"], ev["message"].fields["id"]
            self.assertEqual(ids if fmt == "json" else ids.split(","), [qid], rs)
            self.assertEqual(len({r.fields["peer"] for r in rs}), 1, rs)
            peers[ev["connect"].fields["peer"]] = qid
        self.assertEqual(peers, dict(results.values()))

    def test_concurrent_threads_text(self):
        self.check_concurrent("text", "threads")

    def test_concurrent_threads_json(self):
        self.check_concurrent("json", "threads")

    def test_concurrent_prefork_text(self):
        self.check_concurrent("text", "prefork")

    def test_concurrent_prefork_json(self):
        self.check_concurrent("json", "prefork")

    def test_lax_angle_brackets(self):
        for lax in (False, True):
            srv = self.start("text", *(["--lax-angle-brackets"] if lax else []))
            with smtplib.SMTP("127.0.0.1", srv.port, timeout=ts.SAFETY) as s:
                s.ehlo("client.example")
                code, text = s.docmd("MAIL FROM:user@example.com")
                if not lax:
                    self.assertEqual((code, text), (501, b"5.5.2 Syntax: MAIL FROM:<address>"))
                    self.assertEqual(s.docmd("RCPT TO:u@example.com")[0], 503)
                    continue
                self.assertEqual((code, text), (250, b"2.1.0 Ok"))
                self.assertEqual(s.docmd("RCPT TO:u@example.com"), (250, b"2.1.5 Ok"))
                code, text = s.data(MSG)
                self.assertEqual(code, 250, text)
                qid = QUEUED.search(text.decode()).group(1)
            new = os.path.join(srv.maildir, "new")
            names = [f for f in os.listdir(new) if ".%s." % qid in f]
            self.assertEqual(len(names), 1, os.listdir(new))
            with open(os.path.join(new, names[0]), "rb") as f:
                data = f.read()
            self.assertTrue(data.startswith(b"Return-Path: <user@example.com>\r\n"), data[:80])
            self.assertIn(b"for <u@example.com>", data)
            self.assertTrue(data.endswith(MSG), data[-80:])


if __name__ == "__main__":
    sys.exit(ts.main(sys.modules[__name__]))
