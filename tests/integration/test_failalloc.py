#!/usr/bin/env python3
"""Failing-allocator test of smtpe-server (issue 5): every allocation the server's own code makes
is failed in turn, and each failure must be reported cleanly.

The server under test is smtpe-server-failalloc (smtpe-server linked with
tests/failalloc/failalloc.c, see tests/failalloc/README.md): SMTPE_FAILALLOC=N makes the Nth
malloc, calloc, realloc, strdup, strndup or mmap of our objects (bindings/ and the static
engine, not libc's or OpenSSL's own) fail, and SMTPE_FAILALLOC_COUNT=FILE receives the number
of allocations and where the failed one was called from.

For each configuration (maildir: plain Maildir with pipelining, a message over 64 KiB, BDAT
and a client over --max-clients; tls-auth: STARTTLS + AUTH with a crypt(3) user file; lmtp:
LMTP, 40 recipients and a client that pipelines faster than it reads; proxy-xclient: PROXY +
XCLIENT + XFORWARD) two runs without failure count its K allocations (startup, one scripted
session, exit); then for N = 1..K a run fails allocation N, and:
  - the server either refuses to start (non-zero exit and an "out of memory" or "Cannot
    allocate memory" line on stderr), or it starts and then
  - the scripted session gets only well-formed replies within bounded waits; every step answers
    as without failure, or a step fails with 421, 451, 452 or 454 (the session is then ended
    with QUIT, or by the server after a 421), or the failure is absorbed with nothing visible;
    a connection closed without a reply, a cut TLS handshake or any other reply is a failure;
  - no message is acknowledged with 250 unless it is in new/ byte-exact (under LMTP each
    recipient's reply names that recipient); new/ holds nothing else (a message stored whose
    250 was lost must be logged queued-unacknowledged) and tmp/ is empty at exit;
  - a second, clean session on the same server then works in full;
  - SIGTERM makes it exit 0, with no sanitizer report on stderr (in an AddressSanitizer build
    LeakSanitizer checks for leaks at that exit; gcc and clang builds have no leak check:
    --valgrind-every runs some N under valgrind memcheck, leaks counting as errors).
A full sweep must also have failed an allocation in each function of MODEL_SITES and
CONFIG_SITES below (proof that the wrapper sees the call and the script reaches it), and
every N must have been reached.

Usage: test_failalloc.py [SERVER] [--config NAME ...] [--model M] [--n N ...] [--every S]
                         [--jobs J] [--valgrind-every S] [--slow F] [-v]
  SERVER    smtpe-server-failalloc (default $SMTPE_SERVER_FAILALLOC, then
            build/smtpe-server-failalloc in the repository)
  --config  only these configurations (default all)
  --model   host model: epoll (default), threads, reuseport (--workers 1); not prefork: each
            forked worker counts on from the parent's number
  --n N     only these N (repeatable): reproduces one failure; -v shows what happened
  --every S only N = 1, 1+S, 1+2S, ... and K (default 1: every N)
  --jobs J  runs at a time (default 3)
  --valgrind-every S  also run every S-th N under valgrind (bounds x10 unless --slow)
  -v        one line per run: the failed allocation's call site and what the client saw

Needs the openssl command (certificate, password hashes) and llvm-symbolizer (clang's inline
records) or addr2line (binutils) to name the call sites. Time bounds are safety bounds against
a hung server, never speed requirements.
Only the Python 3 standard library is used.
"""

import argparse
import base64
import concurrent.futures
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (its Server's stderr reader; its tests are not loaded)

HOST = "mx.example"
CRLF = b"\r\n"
SAFETY = 15.0      # seconds: the longest any one expected reply or event may take (x --slow)
STOP_BOUND = 30.0  # seconds: the longest a SIGTERM'd server may take to exit (x --slow)
TEMP_FAIL = (421, 451, 452, 454)  # the replies a failed allocation may cause
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "SUMMARY: UndefinedBehaviorSanitizer", "WARNING: ThreadSanitizer")
OOM_TEXT = ("out of memory", "Cannot allocate memory")
VALGRIND_EXIT = 99

# alice's hash is SHA-512 crypt; carol's is MD5 crypt, a legacy method that the server checks
# at startup by hashing once (an allocation of its own)
USERS = {"alice": ("-6", "secret"), "carol": ("-1", "legacy")}
FIX = {}  # certificate, key, users file (setup())


class Bad(Exception):
    """The server did something a failed allocation must never cause."""


class CleanFailure(Exception):
    """A step failed with a 4xx reply (the session cannot go on as scripted)."""

    def __init__(self, step, reply):
        super().__init__("%s: %s" % (step, reply.lines[-1]))
        self.step = step
        self.reply = reply


class Reply:
    def __init__(self, lines):
        self.lines = lines  # str, without CRLF
        self.code = int(lines[-1][:3])
        self.text = lines[-1][4:]

    def __repr__(self):
        return "Reply(%r)" % self.lines


# ------------------------------------------------------------------------------------------------
# One client connection, tolerant (scripted session) or strict (the clean session after it)
# ------------------------------------------------------------------------------------------------
class Session:
    def __init__(self, port, strict, name):
        self.port = port
        self.strict = strict
        self.name = name
        self.seen = []         # every reply line, for the report
        self.acked = []        # (queue id, content): messages the server acknowledged with 250
        self.buf = b""
        self.sock = None
        self.closed = False    # a 421 came: the server closes the connection
        self.first_failure = None

    def connect(self, rcvbuf=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(SAFETY)
        s.connect(("127.0.0.1", self.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = s

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        try:
            self.sock.sendall(data)
        except (OSError, ssl.SSLError) as e:
            raise Bad("%s: sending failed: %s (replies so far %r)"
                      % (self.name, e, self.seen[-5:]))

    def _line(self):
        deadline = time.monotonic() + SAFETY
        while CRLF not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Bad("%s: no reply within %.0f s (buffered %r, replies so far %r)"
                          % (self.name, SAFETY, self.buf[:200], self.seen[-5:]))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (OSError, ssl.SSLError) as e:
                raise Bad("%s: connection failed while waiting for a reply: %s (replies so "
                          "far %r)" % (self.name, e, self.seen[-5:]))
            if not chunk:
                raise Bad("%s: the server closed the connection without a reply (buffered "
                          "%r, replies so far %r)" % (self.name, self.buf, self.seen[-5:]))
            self.buf += chunk
        i = self.buf.index(CRLF)
        raw, self.buf = self.buf[:i], self.buf[i + 2:]
        if len(raw) + 2 > 512:
            raise Bad("%s: reply line of %d octets (RFC 5321 limit 512): %r"
                      % (self.name, len(raw) + 2, raw[:100]))
        try:
            line = raw.decode("ascii")
        except UnicodeDecodeError:
            raise Bad("%s: reply line is not ASCII: %r" % (self.name, raw))
        self.seen.append(line)
        return line

    def reply(self):
        """One well-formed reply (3-digit code 2xx-5xx, the same on every line)."""
        lines = []
        while True:
            line = self._line()
            if not re.fullmatch(r"[2-5][0-9][0-9]([ -][\x20-\x7e]*)?", line):
                raise Bad("%s: malformed reply line %r (after %r)" % (self.name, line, lines))
            if lines and line[:3] != lines[0][:3]:
                raise Bad("%s: the code changes inside a multi-line reply: %r"
                          % (self.name, lines + [line]))
            lines.append(line)
            if len(line) == 3 or line[3] == " ":
                return Reply(lines)

    def expect_eof(self):
        deadline = time.monotonic() + SAFETY
        while True:
            if self.buf:
                raise Bad("%s: more output after the last reply: %r" % (self.name, self.buf))
            left = deadline - time.monotonic()
            if left <= 0:
                raise Bad("%s: the server did not close the connection" % self.name)
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, ssl.SSLError):
                return
            if not chunk:
                return
            self.buf += chunk

    def exchange(self, step, data, want):
        """Sends data (bytes, str or None) and reads one reply per code in want. A reply other
        than the wanted one is Bad, except (when not strict) a 421/451/452/454: the replies
        that follow in the same pipelined group may then be anything well formed (a 421 among
        them ends the session); raises CleanFailure. Returns the replies."""
        if data is not None:
            self.send(data)
        got = []
        for i, code in enumerate(want):
            r = self.reply()
            got.append(r)
            if r.code == code:
                continue
            self.fail_with(step, r)
            for _ in want[i + 1:]:  # the other replies of the group, whatever their codes
                if self.closed:
                    break
                self.closed = self.reply().code == 421
            raise CleanFailure(step, r)
        return got

    def fail_with(self, step, r):
        """A reply r that is not the wanted one: Bad unless it may come from a failed
        allocation (and the session is not strict)."""
        if self.strict or r.code not in TEMP_FAIL:
            raise Bad("%s: %s: unexpected %r (replies so far %r)"
                      % (self.name, step, r.lines, self.seen[-8:]))
        self.closed = self.closed or r.code == 421
        if self.first_failure is None:
            self.first_failure = (step, r)

    def transaction(self, step, sender, rcpts, content, lmtp=False, data_extra=b"",
                    extra_want=()):
        """MAIL, the RCPTs and DATA pipelined, then the content (stuffed, followed by
        data_extra, whose replies extra_want are read after the content's). A RCPT may fail
        with 451/452 and the message then goes to the others; under LMTP the content gets one
        reply per accepted recipient, in order, naming it (RFC 2033 §4.2). Records the message
        if acknowledged; raises CleanFailure after the transaction if a step failed."""
        self.send("MAIL FROM:%s\r\n" % sender + "".join("RCPT TO:%s\r\n" % r for r in rcpts) +
                  "DATA\r\n")
        failed = None
        r = self.reply()
        mail_ok = r.code == 250
        if not mail_ok:
            self.fail_with(step + " MAIL", r)
            failed = failed or (step + " MAIL", r)
        accepted = []
        for rcpt in rcpts:
            if self.closed:
                raise CleanFailure(*failed)
            r = self.reply()
            if r.code == 250 and mail_ok:
                accepted.append(rcpt)
            elif mail_ok:
                self.fail_with(step + " RCPT", r)
                failed = failed or (step + " RCPT", r)
            else:
                self.closed = r.code == 421
        if self.closed:
            raise CleanFailure(*failed)
        r = self.reply()
        if not accepted:
            if r.code != 354:  # 503/554: no valid recipients
                self.closed = r.code == 421
                raise CleanFailure(*failed)
            raise Bad("%s: %s: DATA got 354 without an accepted recipient" % (self.name, step))
        if r.code != 354:
            self.fail_with(step + " DATA", r)
            raise CleanFailure(step + " DATA", r)
        got = self.exchange(step + " content", stuff(content) + data_extra,
                            [250] * (len(accepted) if lmtp else 1))
        ids = set()
        for k, r in enumerate(got):
            m = re.fullmatch(r"2\.0\.0 (<[^>]*> )?Ok: queued as ([0-9A-F]+)", r.text)
            if not m:
                raise Bad("%s: %s: 250 without a queue id: %r" % (self.name, step, r.lines))
            if lmtp and m.group(1) != accepted[k] + " ":
                raise Bad("%s: %s: reply %d of the content names %r, the %dth accepted "
                          "recipient is %s" % (self.name, step, k + 1, m.group(1), k + 1,
                                               accepted[k]))
            ids.add(m.group(2))
        if len(ids) != 1:
            raise Bad("%s: %s: replies name different queue ids: %r" % (self.name, step, ids))
        self.acked.append((ids.pop(), content))
        if extra_want:
            self.exchange(step + " after the content", None, list(extra_want))
        if failed:
            raise CleanFailure(*failed)

    def message(self, step, payload, content):
        """Sends the last BDAT chunk (payload) and reads the final reply; records the message
        if acknowledged."""
        r = self.exchange(step, payload, [250])[0]
        m = re.fullmatch(r"2\.0\.0 Ok: queued as ([0-9A-F]+)", r.text)
        if not m:
            raise Bad("%s: %s: 250 without a queue id: %r" % (self.name, step, r.lines))
        self.acked.append((m.group(1), content))

    def starttls(self, step):
        self.exchange(step, "STARTTLS\r\n", [220])
        if self.buf:
            raise Bad("%s: plaintext after the STARTTLS 220: %r" % (self.name, self.buf))
        ctx = ssl.create_default_context(cafile=FIX["cert"])
        try:
            self.sock.settimeout(SAFETY)
            self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")
        except (OSError, ssl.SSLError) as e:
            raise Bad("%s: %s: TLS handshake failed: %s" % (self.name, step, e))

    def end(self):
        """Ends the session after a clean failure: QUIT -> 221 (unless a 421 came), then the
        server closes the connection."""
        if not self.closed:
            self.exchange("QUIT after the failure", "QUIT\r\n", [221])
        self.expect_eof()


def stuff(content):
    """The DATA payload of content (CRLF lines): dot-stuffed, with the final CRLF.CRLF."""
    assert content.endswith(CRLF)
    lines = content.split(CRLF)[:-1]
    return b"".join((b"." + l if l.startswith(b".") else l) + CRLF for l in lines) + b".\r\n"


def text_body(octets, tag):
    """CRLF text lines of about octets octets, some starting with a dot."""
    out, i = [b"Subject: " + tag + CRLF + CRLF], 0
    size = len(out[0])
    while size < octets:
        line = (b"." if i % 7 == 0 else b"") + (b"%s line %06d " % (tag, i)) + b"x" * 60 + CRLF
        out.append(line)
        size += len(line)
        i += 1
    return b"".join(out)


# ------------------------------------------------------------------------------------------------
# The configurations: server arguments, the scripted session, the clean session
# ------------------------------------------------------------------------------------------------
SMALL = b"Subject: small\r\n\r\n..leading dot\r\nbody\r\n"
BIG = text_body(200 * 1024, b"big")           # > 64 KiB: the file is created while it streams
BINARY = bytes((i * 7 + 3) % 256 for i in range(70000))  # BDAT chunk > 64 KiB, any octet
BINARY_TAIL = b"\r\n.\r\nend\r\n\x00\xff"
FLOOD = 100000  # HELP commands (600 KB) whose replies (7.9 MB) overfill the sockets' buffers
LMTP_RCPTS = ["<recipient-number-%02d-with-a-long-local-part@example.com>" % i
              for i in range(40)]  # > 1024 octets of names: the list grows twice


def greet(s):
    s.exchange("greeting", None, [220])


def connect_clean(s):
    """The clean session's connection. Under --max-clients 1 the threads model may still
    count the session before it for a moment after closing its socket: a greeting of 421
    4.7.0 is retried for up to SAFETY seconds (a count that never comes down still fails)."""
    deadline = time.monotonic() + SAFETY
    while True:
        s.connect()
        r = s.reply()
        if r.code == 220:
            return
        if r.code != 421 or "Too many connections" not in r.text or \
                time.monotonic() > deadline:
            raise Bad("%s: greeting: unexpected %r" % (s.name, r.lines))
        s.close()
        s.buf = b""
        time.sleep(0.05)


def script_maildir(s, full):
    if full:
        s.connect()
        greet(s)
    else:
        connect_clean(s)
    s.exchange("EHLO", "EHLO client.example\r\n", [250])
    if not full:
        s.transaction("clean", "<a@example.org>", ["<u@example.com>"], SMALL)
        s.exchange("QUIT", "QUIT\r\n", [221])
        return
    # --max-clients 1: a second client meanwhile is refused with 421 4.7.0
    other = Session(s.port, s.strict, s.name + " (second client)")
    try:
        other.connect()
        r = other.reply()
        if r.code != 421:
            raise Bad("%s: a client over --max-clients got %r" % (other.name, r.lines))
        other.expect_eof()
    finally:
        other.close()
    s.transaction("two recipients", "<a@example.org>", ["<u@example.com>", "<v@example.com>"],
                  SMALL)
    # NOOP and RSET right behind the end of data wait in the connection's own input buffer
    # while the message is made durable
    s.transaction("200 KiB + NOOP + RSET", "<b@example.org> BODY=8BITMIME", ["<u@example.com>"],
                  BIG, data_extra=b"NOOP\r\nRSET\r\n", extra_want=(250, 250))
    s.exchange("MAIL BINARYMIME/RCPT", "MAIL FROM:<> BODY=BINARYMIME\r\n"
               "RCPT TO:<u@example.com>\r\n", [250, 250])
    s.exchange("BDAT 70000", b"BDAT %d\r\n" % len(BINARY) + BINARY, [250])
    s.message("BDAT LAST", b"BDAT %d LAST\r\n" % len(BINARY_TAIL) + BINARY_TAIL,
              BINARY + BINARY_TAIL)
    s.exchange("VRFY", "VRFY u\r\n", [252])
    s.exchange("QUIT", "QUIT\r\n", [221])


def script_tls_auth(s, full):
    s.connect()
    greet(s)
    s.exchange("EHLO", "EHLO client.example\r\n", [250])
    s.starttls("STARTTLS")
    s.exchange("EHLO under TLS", "EHLO client.example\r\n", [250])
    if full:
        s.exchange("AUTH LOGIN", "AUTH LOGIN\r\n", [334])
        s.exchange("AUTH LOGIN user", base64.b64encode(b"alice") + CRLF, [334])
        s.exchange("AUTH LOGIN wrong password", base64.b64encode(b"wrong") + CRLF, [535])
    s.exchange("AUTH PLAIN", b"AUTH PLAIN " + base64.b64encode(b"\0alice\0secret") + CRLF, [235])
    s.transaction("authenticated", "<a@example.org>", ["<u@example.com>"], SMALL)
    s.exchange("QUIT", "QUIT\r\n", [221])


def script_lmtp(s, full):
    # a small receive buffer, and many more replies than the server's socket buffers hold:
    # the server stops reading with commands left, which the connection keeps in its own
    # 16 KiB input buffer
    s.connect(rcvbuf=4096 if full else None)
    greet(s)
    s.exchange("LHLO", "LHLO client.example\r\n", [250])
    if full:
        flood = b"HELP\r\n" * FLOOD

        def send_flood():  # a server that stops reading and closes shows in the replies
            try:
                s.sock.sendall(flood)
            except OSError:
                pass
        sender = threading.Thread(target=send_flood, daemon=True)
        sender.start()
        time.sleep(0.2)  # let the server fill the sockets before anything is read
        try:
            s.exchange("%d pipelined HELPs" % FLOOD, None, [214] * FLOOD)
        finally:
            sender.join(SAFETY)
        if sender.is_alive():
            raise Bad("%s: the server stopped reading the pipelined HELPs" % s.name)
    s.transaction("%d recipients" % (40 if full else 2), "<a@example.org>",
                  LMTP_RCPTS if full else LMTP_RCPTS[:2], SMALL, lmtp=True)
    s.exchange("QUIT", "QUIT\r\n", [221])


def script_proxy_xclient(s, full):
    s.connect()
    s.exchange("PROXY header + greeting", "PROXY TCP4 192.0.2.7 127.0.0.1 40000 25\r\n", [220])
    s.exchange("EHLO", "EHLO client.example\r\n", [250])
    s.exchange("XCLIENT", "XCLIENT NAME=client.example ADDR=192.0.2.8 PORT=4242 HELO=helo.example "
               "LOGIN=bob PROTO=ESMTP\r\n", [220])
    s.exchange("EHLO after XCLIENT", "EHLO client.example\r\n", [250])
    if full:
        s.exchange("XFORWARD", "XFORWARD NAME=relay.example ADDR=192.0.2.9 HELO=relay.example "
                   "PROTO=ESMTP\r\n", [250])
    s.transaction("forwarded" if full else "clean", "<a@example.org>", ["<u@example.com>"], SMALL)
    s.exchange("QUIT", "QUIT\r\n", [221])


CONFIGS = {
    "maildir": (["--max-clients", "1"], script_maildir),
    "tls-auth": (lambda: ["--tls-cert", FIX["cert"], "--tls-key", FIX["key"],
                          "--auth-users", FIX["users"]], script_tls_auth),
    "lmtp": (["--lmtp"], script_lmtp),
    "proxy-xclient": (["--proxy-protocol", "--proxy-from", "127.0.0.1",
                       "--xclient-from", "192.0.2.0/24"], script_proxy_xclient),
}


# ------------------------------------------------------------------------------------------------
# One run of the server
# ------------------------------------------------------------------------------------------------
class Run(ts.StderrLog):
    """smtpe-server-failalloc with allocation n failing (0: none), one scripted session, one
    clean session, SIGTERM. problems: what went wrong (empty: the run passed)."""

    def __init__(self, server, config, n, model_args, valgrind=False, clean=True):
        self.config = config
        self.clean = clean
        self.n = n
        self.problems = []
        self.outcome = "?"
        self.allocations = None
        self.failed = None   # the count file's "failed=" line, parsed: function, size, frames
        self.dir = tempfile.mkdtemp(prefix="smtpe-fa-")
        self.maildir = os.path.join(self.dir, "maildir")
        self.count_file = os.path.join(self.dir, "count")
        args, script = CONFIGS[config]
        self.script = script
        args = args() if callable(args) else args
        cmd = [server, "--listen", "127.0.0.1:0", "--maildir", self.maildir, "--maildir-crlf",
               "--hostname", HOST, "--drain-seconds", "5"] + model_args + args
        if valgrind:  # as valgrind_integration runs it (tests/integration/CMakeLists.txt)
            supp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "valgrind.supp")
            cmd = ["valgrind", "--error-exitcode=%d" % VALGRIND_EXIT, "--leak-check=full",
                   "--show-leak-kinds=definite,indirect,possible",
                   "--errors-for-leak-kinds=definite,indirect,possible", "--track-fds=no",
                   "--log-file=" + os.path.join(self.dir, "vg.%p.log")] + \
                (["--suppressions=" + supp] if os.path.exists(supp) else []) + cmd
        self.valgrind = valgrind
        env = dict(os.environ, SMTPE_FAILALLOC=str(n), SMTPE_FAILALLOC_COUNT=self.count_file)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._start_stderr_reader()

    def wait_listening(self):
        """The port, or None if the server exited first; Bad if neither happens in time."""
        deadline = time.monotonic() + SAFETY
        with self.cond:
            while True:
                for l in self.lines:
                    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", l)
                    if m:
                        return int(m.group(1))
                left = deadline - time.monotonic()
                if self.eof:
                    return None
                if left <= 0:
                    raise Bad("neither 'listening on' nor an exit within %.0f s" % SAFETY)
                self.cond.wait(left)

    def session(self, port, strict, name, full):
        s = Session(port, strict, name)
        try:
            self.script(s, full)
            return s, None
        except CleanFailure as f:
            s.end()
            return s, f
        finally:
            s.close()

    def execute(self):
        try:
            self._execute()
        except Bad as e:
            self.problems.append(str(e))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.reader.join(SAFETY)
        self._check_exit_artifacts()
        return self

    def _execute(self):
        port = self.wait_listening()
        if port is None:
            rc = self.proc.wait(SAFETY)
            self.reader.join(SAFETY)
            msgs = [l for l in self.log() if not l.startswith("failalloc:")]
            self.outcome = "refused to start (exit %d): %s" % (rc, msgs[-1] if msgs else "")
            if rc == 0:
                raise Bad("the server exited 0 without listening")
            if not any(t in l for l in msgs for t in OOM_TEXT):
                raise Bad("the server exited %d without an out-of-memory line on stderr" % rc)
            return
        self.acked = []
        s, failure = self.session(port, False, "scripted session", True)
        self.acked += s.acked
        self.outcome = ("%s (%s)" % (failure.reply.lines[-1], failure.step) if failure else
                        "session as without failure")
        if self.clean:
            if self.n and not self.failure_logged():
                # allocation N is still to come (one the counting run made at its exit, or
                # one that run did not make): a tolerant session first, then the strict one
                s, failure = self.session(port, False, "session before the clean one", False)
                self.acked += s.acked
                if failure:
                    self.outcome += "; %s (%s, before the clean session)" % (
                        failure.reply.lines[-1], failure.step)
            s, failure = self.session(port, True, "clean session", False)
            self.acked += s.acked
        self._stop()

    def failure_logged(self):
        return any(l.startswith("failalloc: allocation ") for l in self.log())

    def _stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            raise Bad("the server did not exit within %.0f s of SIGTERM" % STOP_BOUND)
        self.reader.join(SAFETY)
        if self.valgrind and rc == VALGRIND_EXIT:
            raise Bad("valgrind reported errors or leaks (exit %d)" % rc)
        if rc != 0:
            raise Bad("the server exited %d after SIGTERM" % rc)

    def _check_exit_artifacts(self):
        log = self.log()
        if any(m in l for l in log for m in SANITIZER_MARKS):
            self.problems.append("sanitizer report on stderr")
        if self.valgrind:
            if not any(name.startswith("vg.") for name in os.listdir(self.dir)):
                self.problems.append("valgrind wrote no log")
            for name in os.listdir(self.dir):
                if name.startswith("vg."):
                    with open(os.path.join(self.dir, name), errors="replace") as f:
                        text = f.read()
                    # leaks count as errors (--errors-for-leak-kinds)
                    if "ERROR SUMMARY: 0 errors" not in text:
                        self.problems.append("valgrind: %s" % text[-1500:])
        try:
            with open(self.count_file) as f:
                text = f.read()
        except OSError:
            text = ""
            if not self.problems:
                self.problems.append("no count file (the server did not exit normally)")
        m = re.search(r"^allocations=(\d+)$", text, re.M)
        if m:
            self.allocations = int(m.group(1))
        m = re.search(r"^failed=(\d+) function=(\S+) size=(\d+) frames=(\S*)$", text, re.M)
        if m:
            self.failed = (m.group(2), int(m.group(3)), m.group(4).split(","))
        if not self.problems and self.outcome != "?" and not self.outcome.startswith("refused"):
            self._check_maildir(log)

    def _check_maildir(self, log):
        tmp = os.path.join(self.maildir, "tmp")
        new = os.path.join(self.maildir, "new")
        left = os.listdir(tmp) if os.path.isdir(tmp) else []
        if left:
            self.problems.append("files left in tmp/ at exit: %r" % left)
        files = sorted(os.listdir(new)) if os.path.isdir(new) else []
        by_id = {}
        for name in files:
            parts = name.split(".")
            by_id.setdefault(parts[1] if len(parts) > 2 else name, []).append(name)
        for qid, content in self.acked:
            names = by_id.pop(qid, [])
            if len(names) != 1:
                self.problems.append("message %s acknowledged with 250, %d files in new/"
                                     % (qid, len(names)))
                continue
            with open(os.path.join(new, names[0]), "rb") as f:
                data = f.read()
            got = stored_content(data)
            if got != content:
                self.problems.append("message %s acknowledged with 250 but stored %s"
                                     % (qid, "without trace headers" if got is None else
                                        "with other content (%d octets, want %d)"
                                        % (len(got), len(content))))
        for qid, names in by_id.items():
            if not any("id=%s" % qid in l and "status=queued-unacknowledged" in l for l in log):
                self.problems.append("new/ holds %r, never acknowledged nor logged "
                                     "queued-unacknowledged" % names)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def stored_content(data):
    """The message after the Return-Path and Received (with its continuation lines) headers,
    or None if they are not there."""
    if not data.startswith(b"Return-Path: <"):
        return None
    i = data.find(CRLF)
    if data[i + 2:i + 17] != b"Received: from ":
        return None
    pos = data.find(CRLF, i + 2) + 2
    while data[pos:pos + 1] == b"\t":
        pos = data.find(CRLF, pos) + 2
    return data[pos:]


# ------------------------------------------------------------------------------------------------
# Naming the call sites (addr2line) and the sites each sweep must reach
# ------------------------------------------------------------------------------------------------
# Functions (in the inline chain of a failed allocation's caller) that a full sweep must fail at
# least once: proof that the wrapper catches the call and that the script reaches it ("a|b":
# either).
MODEL_SITES = {
    "epoll": {"cli_parse", "census_new", "loop_new", "job_pool_new", "host_log_batch", "lp_add",
              "conn_new", "timer_set|timer_heap_reserve", "on_helo"},
    "threads": {"cli_parse", "census_new", "threads_model_run", "conn_new", "on_helo"},
    "reuseport": {"cli_parse", "census_new", "reuseport_model_run", "loop_new", "job_pool_new",
                  "host_log_batch", "lp_add", "conn_new", "timer_set|timer_heap_reserve",
                  "on_helo"},
}
CONFIG_SITES = {
    "maildir": {"on_mail", "on_rcpt", "maildir_msg_begin", "on_data", "on_bdat", "job_get",
                # smtpe_server_new: in an optimised engine (no debug info) its malloc is a
                # tail call, so the frame named is conn_reject's
                "on_data_end", "done", "conn_reject", "smtpe_server_new|conn_reject"},
    "tls-auth": {"tls_server_new", "auth_db_load", "read_file", "hash_round_trips",
                 "tls_conn_new", "on_auth", "auth_db_check", "finish_auth"},
    "lmtp": {"remember_rcpt", "done"},
    "proxy-xclient": {"on_xclient", "on_xforward"},
}


def symbolizer():
    """llvm-symbolizer (which reads clang's inline records, binutils' addr2line does not), else
    addr2line; None if neither is installed."""
    for name in ("llvm-symbolizer",) + tuple("llvm-symbolizer-%d" % v for v in range(20, 10, -1)):
        if shutil.which(name):
            return [shutil.which(name), "--functions=short", "--inlines"], True
    if shutil.which("addr2line"):
        return [shutil.which("addr2line"), "-f", "-i", "-s"], False
    return None, False


def resolve(exe, offsets):
    """{offset: [(function, file:line), ...] innermost first}, for the return address minus one
    (the line of the call itself)."""
    tool, llvm = symbolizer()
    if tool is None:
        raise SystemExit("neither llvm-symbolizer nor addr2line (binutils) is installed")
    ordered = sorted(offsets)
    if llvm:  # one call: a block of (function, file:line:column) lines per address
        p = subprocess.run(tool + ["--obj=" + exe] + ["0x%x" % (o - 1) for o in ordered],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120)
        blocks = p.stdout.decode(errors="replace").split("\n\n")
    else:  # addr2line prints no separator: one call per address
        blocks = [subprocess.run(tool + ["-e", exe, "%x" % (o - 1)], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, timeout=60).stdout.decode(
                                     errors="replace") for o in ordered]
    out = {}
    for o, block in zip(ordered, blocks):
        lines = [l for l in block.splitlines() if l.strip()]
        pairs = []
        for k in range(0, len(lines) - 1, 2):
            loc = os.path.basename(lines[k + 1])
            if llvm and loc.count(":") >= 2:  # drop the column
                loc = loc.rsplit(":", 1)[0]
            pairs.append((lines[k], loc))
        out[o] = pairs
    return out


def our_frames(run, exe):
    """The offsets into the server executable of the failed allocation's frames."""
    offs = []
    for fr in run.failed[2] if run.failed else []:
        obj, _, off = fr.rpartition("+")
        if obj and os.path.realpath(obj) == exe:
            offs.append(int(off, 16))
    return offs


def site_of(run, exe, names):
    """'malloc 48: lp_add (loop.c:175) < lp_accept (...) <- ...': the failed function, its size
    and up to three callers (inlined ones joined by '<'), failalloc.c's own frames left out."""
    if not run.failed:
        return "-"
    parts = []
    for o in our_frames(run, exe):
        chain = [(f, l) for f, l in names.get(o, [])
                 if "failalloc.c" not in l and not l.startswith("??")]
        if chain:
            parts.append(" < ".join("%s (%s)" % fl for fl in chain))
        if len(parts) == 3:
            break
    return "%s %d: %s" % (run.failed[0], run.failed[1], " <- ".join(parts) or "?")


def functions_of(run, exe, names):
    return {f for o in our_frames(run, exe) for f, _ in names.get(o, [])}


# ------------------------------------------------------------------------------------------------
def setup(workdir):
    openssl = shutil.which("openssl")
    if openssl is None:
        raise SystemExit("the openssl command is not installed (run tests/deps.sh)")
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-days", "2",
                    "-keyout", key, "-out", cert], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    users = os.path.join(workdir, "users")
    with open(users, "w") as f:
        for user, (method, password) in USERS.items():
            h = subprocess.run([openssl, "passwd", method, password], check=True,
                               stdout=subprocess.PIPE, timeout=60).stdout.decode().strip()
            f.write("%s:%s\n" % (user, h))
    FIX.update(cert=cert, key=key, users=users)


def sweep(server, config, a, model_args):
    """Counts K, runs the N's of config; prints the result. Returns the number of problems."""
    exe = os.path.realpath(server)
    # the count: startup, the scripted session and the exit (no clean session)
    base = [Run(server, config, 0, model_args, clean=False).execute() for _ in range(2)]
    counts = [r.allocations for r in base]
    problems = [p for r in base for p in r.problems]
    if problems or None in counts:
        print("%s: the run without failure fails: %s\n  %s" % (
            config, "; ".join(problems) or "no count", "\n  ".join(base[0].log()[-30:])))
        for r in base:
            r.cleanup()
        return 1
    k = min(counts)
    full = a.every == 1 and not a.n
    ns = a.n or sorted(set(list(range(1, k + 1, a.every)) + [k]))
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        runs = list(pool.map(lambda n: Run(server, config, n, model_args).execute(), ns))
    if a.valgrind_every:  # one at a time: valgrind is slow enough
        for n in ns[::a.valgrind_every]:
            runs.append(Run(server, config, n, model_args, valgrind=True).execute())
    names = resolve(exe, {o for r in runs for o in our_frames(r, exe)})
    bad = [r for r in runs if r.problems]
    # a run without problems whose allocation N never came: it took another path than the
    # counting run (timing), so the sweep may have missed a site
    unreached = [r.n for r in runs if r.failed is None and not r.problems and r.n <= k]
    print("%s: K=%d allocations (counting runs: %s); %s: %d runs, %d with problems, %.1f s"
          % (config, k, "/".join(map(str, counts)),
             "N=1..%d" % k if full else "N=%s" % (",".join(map(str, ns[:20])) +
                                                  (",..." if len(ns) > 20 else "")),
             len(runs), len(bad), time.monotonic() - t0))
    for r in runs:
        if a.v or r.problems:
            print("  N=%-3d %s\n         -> %s%s" % (r.n, site_of(r, exe, names), r.outcome,
                                                    " [valgrind]" if r.valgrind else ""))
        for p in r.problems:
            print("         PROBLEM: %s" % p)
        if r.problems:
            print("         server stderr (last lines):\n           " +
                  "\n           ".join(r.log()[-12:]))
    failures = len(bad)
    if unreached:
        print("  PROBLEM: allocation N never made for N=%s" % unreached)
        failures += 1
    if full:
        want = MODEL_SITES[a.model] | CONFIG_SITES[config]
        if a.model == "threads" and config == "maildir":
            want.discard("done")  # no job pool: nothing waits behind the end of data
        reached = set().union(*(functions_of(r, exe, names) for r in runs))
        missing = sorted(w for w in want if not set(w.split("|")) & reached)
        if missing:
            print("  PROBLEM: no allocation failed in %s (a path the script no longer reaches, "
                  "or a call the wrapper does not catch)" % ", ".join(missing))
            failures += 1
    for r in base + runs:
        r.cleanup()
    return failures


def main():
    global SAFETY, STOP_BOUND
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("server", nargs="?", default=os.environ.get("SMTPE_SERVER_FAILALLOC") or
                    os.path.join(here, "..", "..", "build", "smtpe-server-failalloc"))
    ap.add_argument("--every", type=int, default=1, metavar="S")
    ap.add_argument("--n", type=int, action="append", default=[], metavar="N",
                    help="only these N (repeatable), e.g. to reproduce one failure")
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS))
    ap.add_argument("--model", default="epoll", choices=sorted(MODEL_SITES))
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--valgrind-every", type=int, default=0, metavar="S",
                    help="also run every S-th N under valgrind memcheck (0: none)")
    ap.add_argument("--slow", type=float, default=float(os.environ.get("SMTPE_TEST_SLOW", 1)))
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    if a.every < 1 or a.jobs < 1 or a.slow < 1 or a.valgrind_every < 0 or \
            any(n < 1 for n in a.n):
        ap.error("--every, --jobs, --slow and --n take numbers >= 1")
    if a.valgrind_every and "--slow" not in sys.argv and "SMTPE_TEST_SLOW" not in os.environ:
        a.slow = 10.0
    SAFETY *= a.slow
    STOP_BOUND *= a.slow
    server = os.path.abspath(a.server)
    if not os.access(server, os.X_OK):
        print("not found or not executable: %s" % server, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    model_args = ["--model", a.model] + (["--workers", "1"] if a.model == "reuseport" else [])
    if a.valgrind_every and shutil.which("valgrind") is None:
        print("--valgrind-every: valgrind is not installed", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    workdir = tempfile.mkdtemp(prefix="smtpe-fa-fix-")
    started = time.monotonic()
    configs = a.config or list(CONFIGS)
    failed = 0
    try:
        setup(workdir)
        for config in configs:
            failed += sweep(server, config, a, model_args) > 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("%d passed, %d failed (configurations; %.0f s)"
          % (len(configs) - failed, failed, time.monotonic() - started))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
