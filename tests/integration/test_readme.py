#!/usr/bin/env python3
"""test_readme.py - the C examples of README.md work as printed.

"Using the engine from C": it takes the section's first two ```c blocks exactly as the README
shows them (the poll-loop session `serve` and the config set-up), adds the main() the README
says a reader writes (set up the config, accept connections, call serve for each), compiles
them against the engine with warnings as errors, and drives the program with real clients:
smtplib, and raw pipelined writes. So a reader who copies the README gets a working server, and
the loop is right for the cases smtpe.h's want flags describe (pipelined input, recv consuming
part of a buffer).

"The client engine": its ```c block (the poll-loop function send_mail) with the pieces the
README says the embedder supplies (includes, now_ms(), report(), a main() that connects; the
socket's send buffer made small, so that sending meets EAGAIN), compiled the same way and run
against smtpe-server (--server) through a recording relay: a small message, and 200 KiB by
DATA (--no-chunking) and by BDAT. Each must end within SAFETY seconds with its outcome
(delivered, 250) and the message stored byte for byte; the DATA payload on the wire must
unstuff to it. A host that waits for input while the engine still wants content hangs on the
DATA case: the server says nothing before the final dot.

Usage: test_readme.py --readme README.md --include DIR --lib libsmtpe.a --cc CC
                      [--cflags FLAGS] [--server SMTPE_SERVER] [-q]
  Without --server the client sketch is only compiled (its runs are skipped).
"""
import argparse
import os
import re
import shlex
import smtplib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (its Server and stored-message helpers only)

ARGS = None
SAFETY = 30.0

MAIN = r"""
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

int serve(int fd, const smtpe_server_config *cfg);

int main(int argc, char **argv)
{
    int sessions = argc > 1 ? atoi(argv[1]) : 1;
%(config)s
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {0};
    socklen_t alen = sizeof a;
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &alen) != 0)
        return 1;
    fprintf(stderr, "listening on 127.0.0.1:%%d\n", ntohs(a.sin_port));
    for (int i = 0; i < sessions; i++) {
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            return 1;
        fprintf(stderr, "serve: %%d\n", serve(fd, &cfg));
        close(fd);
    }
    fflush(stdout);
    return 0;
}
"""


def readme_blocks(path):
    """The ```c blocks of the section "## Using the engine from C", in order."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Using the engine from C")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```c\n(.*?)```", text[start:end], re.S)


def client_blocks(path):
    """The ```c blocks of the section "## The client engine", in order."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index("## The client engine")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```c\n(.*?)```", text[start:end], re.S)


# What the README says the embedder of its client sketch supplies: the includes and now_ms()
# of the server example, <errno.h>, and report(); here report() prints the outcome on stdout
# as "OUTCOME CODE ENHANCED TEXT".
CLIENT_PRELUDE = r"""
#define _POSIX_C_SOURCE 200809L
#include <smtpe.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void report(const smtpe_client_outcome *o)
{
    printf("%d %u %.*s %.*s\n", o->outcome, o->code, (int)o->enhanced.len,
           o->enhanced.len ? (const char *)o->enhanced.ptr : "", (int)o->text.len,
           o->text.len ? (const char *)o->text.ptr : "");
}
"""

# ... and a main() that connects and calls it: send-sketch PORT FROM TO FILE. The send buffer
# is made small, so that a message of some size meets a full socket (EAGAIN, then POLLOUT).
CLIENT_MAIN = r"""
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    FILE *f = fopen(argv[4], "rb");
    static uint8_t msg[1 << 20];
    size_t len = f ? fread(msg, 1, sizeof msg, f) : 0;
    if (f == NULL || ferror(f) || !feof(f))
        return 2;
    fclose(f);
    int fd = socket(AF_INET, SOCK_STREAM, 0), sndbuf = 4096;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)atoi(argv[1]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) != 0 ||
        connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        return 3;
    int rc = send_mail(fd, argv[2], argv[3], msg, len);
    fprintf(stderr, "send_mail: %d\n", rc);
    fflush(stdout);
    close(fd);
    return rc == 0 ? 0 : 1;
}
"""


def build_client(tmp):
    """The client sketch with the supplied pieces, compiled and linked with warnings as errors:
    the path of the program. Fails (AssertionError) if it does not compile."""
    blocks = client_blocks(ARGS.readme)
    assert blocks, "README: no C block in 'The client engine'"
    src = os.path.join(tmp, "send-sketch.c")
    with open(src, "w") as f:
        f.write(CLIENT_PRELUDE + "\n" + blocks[0] + CLIENT_MAIN)
    exe = os.path.join(tmp, "send-sketch")
    cmd = ([ARGS.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", ARGS.include] +
           shlex.split(ARGS.cflags or "") + [src, ARGS.lib, "-o", exe])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.returncode == 0, "the client sketch does not compile:\n%s\n%s" % (
        " ".join(cmd), p.stdout.decode("utf-8", "replace"))
    return exe


class Relay:
    """A TCP relay on 127.0.0.1 in front of port: one connection, passed through both ways,
    what the client sent kept in self.sent (to tell DATA from BDAT and read the payload)."""

    def __init__(self, port):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.port = self.lsock.getsockname()[1]
        self.target = port
        self.sent = b""
        self.threads = [threading.Thread(target=self._run, daemon=True)]
        self.threads[0].start()

    def _pipe(self, a, b, keep):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if keep:
                    self.sent += data
                b.sendall(data)
        except OSError:
            pass
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _run(self):
        self.lsock.settimeout(SAFETY)
        try:
            client, _ = self.lsock.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", self.target), timeout=SAFETY)
        client.settimeout(None)
        server.settimeout(None)
        self.socks = (client, server)
        t = threading.Thread(target=self._pipe, args=(server, client, False), daemon=True)
        t.start()
        self._pipe(client, server, True)
        t.join(SAFETY)

    def close(self):
        self.lsock.close()
        self.threads[0].join(SAFETY)
        for s in getattr(self, "socks", ()):
            s.close()


def sketch_message(size):
    """A message of about size octets, CRLF lines, with what dot-stuffing must handle: lines
    that start with a dot, a lone dot, a dot after a blank line."""
    head = b"From: a@example.org\r\nTo: u@example.com\r\nSubject: sketch %d\r\n\r\n" % size
    lines, n, i = [head, b".\r\n", b"..two\r\n", b"\r\n.\r\n"], len(head) + 13, 0
    while n < size:
        l = (b"." if i % 5 == 0 else b"") + b"line %06d " % i + b"x" * 50 + b"\r\n"
        lines.append(l)
        n += len(l)
        i += 1
    return b"".join(lines) + b".\r\nend\r\n"


class ClientSketch(ts.Base):
    """The C sketch of "## The client engine" compiles as printed inside the pieces the README
    says the embedder supplies, and the program sends mail through smtpe-server: a small
    message, and 200 KiB both by DATA (CHUNKING off: the server says nothing until the final
    dot, so a host that waits for input while the engine still wants content hangs) and by
    BDAT; each delivered, stored byte for byte, the program ending within SAFETY seconds."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.exe = build_client(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_sketch(self, msg, *server_args):
        if not ARGS.server:
            self.skipTest("no --server: smtpe-server is not built")
        srv = self.start(*server_args)
        relay = Relay(srv.port)
        self.addCleanup(relay.close)
        path = os.path.join(srv.dir, "msg.eml")
        with open(path, "wb") as f:
            f.write(msg)
        t0 = time.monotonic()
        proc = subprocess.Popen([self.exe, str(relay.port), "a@example.org", "u@example.com",
                                 path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=SAFETY)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.fail("the client sketch did not end within %.0f s (it hangs): stdout %r "
                      "stderr %r; the server got %d octets, ending %r" % (
                          SAFETY, out, err, len(relay.sent), relay.sent[-60:]))
        err = err.decode("utf-8", "replace")
        for mark in ts.SANITIZER_MARKS:
            self.assertNotIn(mark, err)
        self.assertEqual((proc.returncode, err), (0, "send_mail: 0\n"),
                         "stdout %r after %.1f s" % (out, time.monotonic() - t0))
        # one outcome: SMTPE_OUTCOME_DELIVERED (1), 250 2.0.0 Ok: queued as QID
        m = re.fullmatch(rb"1 250 2\.0\.0 Ok: queued as (\S+)\n", out)
        self.assertIsNotNone(m, out)
        st, = self.stored(srv)
        st.check_name(m.group(1).decode())
        self.assertEqual(st.return_path, b"<a@example.org>")
        self.assert_content(st.content, msg)
        relay.close()
        return relay.sent

    def test_small_message(self):
        sent = self.run_sketch(sketch_message(300))
        self.assertIn(b"\r\nBDAT ", sent)

    def test_200k_by_data(self):
        msg = sketch_message(200 * 1024)
        sent = self.run_sketch(msg, "--no-chunking")
        self.assertNotIn(b"BDAT", sent)
        i = sent.index(b"\r\nDATA\r\n") + 8
        j = sent.index(b"\r\n.\r\n", i) + 5
        self.assertEqual(ts.unstuff(sent[i:j]), msg)  # dot-stuffed on the wire, as RFC 5321
        self.assertEqual(sent[j:], b"QUIT\r\n")

    def test_200k_by_bdat(self):
        sent = self.run_sketch(sketch_message(200 * 1024))
        self.assertNotIn(b"\r\nDATA\r\n", sent)
        self.assertGreater(len(re.findall(rb"BDAT \d+\r\n", sent)), 1)  # chunks before LAST
        self.assertIn(b" LAST\r\n", sent)


class ReadmeExample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        blocks = readme_blocks(ARGS.readme)
        assert len(blocks) >= 2, "README: fewer than two C blocks in 'Using the engine from C'"
        cls.tmp = tempfile.TemporaryDirectory()
        src = os.path.join(cls.tmp.name, "example.c")
        config = "\n".join("    " + l for l in blocks[1].splitlines())
        with open(src, "w") as f:
            f.write(blocks[0])
            f.write(MAIN % {"config": config})
        cls.exe = os.path.join(cls.tmp.name, "example")
        cmd = ([ARGS.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", ARGS.include] +
               shlex.split(ARGS.cflags or "") + [src, ARGS.lib, "-o", cls.exe])
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert p.returncode == 0, "the README example does not compile:\n%s\n%s" % (
            " ".join(cmd), p.stdout.decode("utf-8", "replace"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, sessions):
        self.proc = subprocess.Popen([self.exe, str(sessions)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        line = self.proc.stderr.readline().decode()
        m = re.match(r"listening on 127\.0\.0\.1:(\d+)", line)
        self.assertIsNotNone(m, "no 'listening on' line: %r" % line)
        return int(m.group(1))

    def finish(self):
        try:
            out, err = self.proc.communicate(timeout=SAFETY)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            self.fail("the example did not finish: %s" % err.decode("utf-8", "replace"))
        err = err.decode("utf-8", "replace")
        self.assertEqual(self.proc.returncode, 0, err)
        for mark in ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer"):
            self.assertNotIn(mark, err)
        return out, err

    def test_smtplib_message(self):
        port = self.start(1)
        body = "Subject: readme\r\n\r\nHello from the README.\r\n.dot line\r\n"
        with smtplib.SMTP("127.0.0.1", port, timeout=SAFETY) as s:
            refused = s.sendmail("a@example.org", ["u@example.com", "x@elsewhere.example"], body)
            self.assertEqual(refused, {"x@elsewhere.example": (550, b"5.7.1 Relaying denied")})
        out, err = self.finish()
        self.assertIn(b"Hello from the README.\r\n.dot line\r\n", out)
        self.assertIn("serve: 0", err)

    def test_pipelined_in_one_write(self):
        port = self.start(1)
        c = socket.create_connection(("127.0.0.1", port), timeout=SAFETY)
        f = c.makefile("rb")
        self.assertTrue(f.readline().startswith(b"220 "))
        c.sendall(b"EHLO c.example\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<u@example.com>\r\n"
                  b"RCPT TO:<v@other.example>\r\nDATA\r\n")
        codes = []
        while len(codes) < 4 or codes[-1] != "354":
            line = f.readline().decode()
            self.assertTrue(line, "connection closed early")
            if line[3] == " ":
                codes.append(line[:3])
        self.assertEqual(codes, ["250", "250", "250", "550", "354"])
        c.sendall(b"Subject: p\r\n\r\n" + b"line\r\n" * 2000 + b".\r\nQUIT\r\n")
        self.assertTrue(f.readline().startswith(b"250 "))
        self.assertTrue(f.readline().startswith(b"221 "))
        self.assertEqual(f.read(), b"")
        c.close()
        out, _ = self.finish()
        self.assertEqual(out, b"Subject: p\r\n\r\n" + b"line\r\n" * 2000)

    def test_client_gone_mid_reply(self):
        # a client that pipelines thousands of commands and leaves without reading: the
        # session ends with -1 (the send fails), the program lives on and serves the next
        port = self.start(4)
        for _ in range(3):  # the replies meet a closed socket: EPIPE (SIGPIPE for write())
            c = socket.create_connection(("127.0.0.1", port), timeout=SAFETY)
            c.sendall(b"EHLO x\r\n" + b"NOOP\r\n" * 3000)
            c.close()
            time.sleep(0.2)
        with smtplib.SMTP("127.0.0.1", port, timeout=SAFETY) as s:
            self.assertEqual(s.noop()[0], 250)
        _, err = self.finish()
        self.assertIn("serve: -1", err)

    def test_byte_at_a_time_and_sessions_in_turn(self):
        port = self.start(2)
        c = socket.create_connection(("127.0.0.1", port), timeout=SAFETY)
        f = c.makefile("rb")
        f.readline()
        for b in b"EHLO x\r\nNOOP\r\nQUIT\r\n":
            c.sendall(bytes([b]))
            time.sleep(0.001)
        lines = [f.readline() for _ in range(8)]
        self.assertTrue(lines[-2].startswith(b"250 2.0.0"), lines)
        self.assertTrue(lines[-1].startswith(b"221 "), lines)
        c.close()
        with smtplib.SMTP("127.0.0.1", port, timeout=SAFETY) as s:
            self.assertEqual(s.noop()[0], 250)
        self.finish()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", required=True)
    ap.add_argument("--include", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--cflags", default="")
    ap.add_argument("--server", default="", help="smtpe-server, for the client sketch's runs")
    ap.add_argument("-q", action="store_true")
    ARGS, rest = ap.parse_known_args()
    ts.SERVER = ARGS.server and os.path.abspath(ARGS.server)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=1 if ARGS.q else 2)


if __name__ == "__main__":
    main()
