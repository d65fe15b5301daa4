#!/usr/bin/env python3
"""test_readme.py - the C example of README.md's "Using the engine from C" works as printed.

It takes the section's first two ```c blocks exactly as the README shows them (the poll-loop
session `serve` and the config set-up), adds the main() the README says a reader writes (set up
the config, accept connections, call serve for each), compiles them against the engine with
warnings as errors, and drives the program with real clients: smtplib, and raw pipelined
writes. So a reader who copies the README gets a working server, and the loop is right for the
cases smtpe.h's want flags describe (pipelined input, recv consuming part of a buffer).

Usage: test_readme.py --readme README.md --include DIR --lib libsmtpe.a --cc CC
                      [--cflags FLAGS] [-q]
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
import time
import unittest

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
    text = open(path, encoding="utf-8").read()
    start = text.index("## Using the engine from C")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```c\n(.*?)```", text[start:end], re.S)


CLIENT_WRAP = r"""
#define _POSIX_C_SOURCE 200809L
#include <smtpe.h>
#include <sys/types.h>
#include <unistd.h>

static uint64_t now_ms(void) { return 0; }
static void report(const smtpe_client_outcome *o) { (void)o; }

int sketch(int fd, const uint8_t *buf, size_t n, const uint8_t *msg, size_t len)
{
    size_t at = 0;
    int closed = 0;
%(block)s
    smtpe_client_free(c);
    return closed + (int)at;
}
"""


class ClientSketch(unittest.TestCase):
    """The C sketch of "## The client engine" compiles as printed, inside a function that
    supplies what it leaves to the reader (the socket, its buffer, the message, report())."""

    def test_compiles(self):
        text = open(ARGS.readme, encoding="utf-8").read()
        start = text.index("## The client engine")
        end = text.index("\n## ", start + 1)
        blocks = re.findall(r"```c\n(.*?)```", text[start:end], re.S)
        self.assertTrue(blocks, "README: no C block in 'The client engine'")
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "sketch.c")
            with open(src, "w") as f:
                f.write(CLIENT_WRAP % {"block": "\n".join("    " + l for l in
                                                         blocks[0].splitlines())})
            cmd = ([ARGS.cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", ARGS.include] +
                   shlex.split(ARGS.cflags or "") + ["-c", src, "-o", os.path.join(tmp, "s.o")])
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.assertEqual(p.returncode, 0, "the client sketch does not compile:\n%s\n%s" % (
                " ".join(cmd), p.stdout.decode("utf-8", "replace")))


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
    ap.add_argument("-q", action="store_true")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=1 if ARGS.q else 2)


if __name__ == "__main__":
    main()
