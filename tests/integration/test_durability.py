#!/usr/bin/env python3
"""Durability under kill -9 (issue 5): no acknowledged message is lost, no partial file in new/.

Each round starts smtpe-server on one fixed loopback port (chosen free at the start) with the same
Maildir every round, runs smtpe-loadgen against it (--unique: every session its own message, a
function of its sequence number; --ack-log: one line per end-of-data reply, written as soon as
it is read), waits until a random number of messages have been acknowledged plus a random few
milliseconds, then sends SIGKILL to the server's whole process group (the supervisor and the
workers under --model prefork). Once loadgen has ended (its remaining sessions fail), the round
checks:
  - every sequence number loadgen saw acknowledged with 250 has exactly one file in new/ under
    the queue id of that reply;
  - every file in new/, acknowledged or not, is complete and byte-exact: Return-Path and
    Received exactly as smtpe-server writes them for loadgen's session (only the date varies;
    it must parse), then the content regenerated from the Message-ID's sequence number;
  - a stored file whose 250 never reached loadgen ("stored, unacknowledged", which is allowed)
    belongs to a session that was sending its message or awaiting the end-of-data reply when
    the server died;
  - files checked in earlier rounds are still there.
tmp/ may keep files of messages that were being received or committed at the kill: they are
counted, not errors (Maildir readers ignore tmp/; nothing cleans it at restart).
Over all rounds it asserts that a meaningful number of messages were acknowledged and that the
kills landed mid-load: loadgen was still running and sessions were cut mid-message. Then a last
server is started on the crashed Maildir, serves one clean run, and must exit 0 on SIGTERM.

Note that SIGKILL tests the order of operations (nothing acknowledged before the rename into new/,
no partial file ever in new/), not fsync: the page cache survives a killed process. A power-loss
test would need a VM or dm-flakey.

Usage: test_durability.py SERVER LOADGEN [--model NAME] [--workers N] [--rounds 20]
                          [--seed N] [--sessions 400] [--concurrency 30] [--body-size 4096]
                          [--keep]
The seed (printed first; default from the clock) fixes each round's kill point (an ack count and
a delay); rerun with --seed to repeat a failing schedule (timing itself stays the machine's).
Only the Python 3 standard library is used. Time limits here are safety bounds, never speed
requirements.
"""

import argparse
import email.utils
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (helpers only: Stored, SANITIZER_MARKS)

HOST = "mx.example"
SENDER = b"loadgen@example.org"       # loadgen's MAIL FROM
RCPT = b"user1@example.com"           # loadgen's RCPT TO (--rcpts 1)
HELO = b"loadgen.example.org"         # loadgen's EHLO
START_BOUND = 20.0     # seconds: the longest a server may take to print "listening on"
LOADGEN_BOUND = 180.0  # seconds: the longest a loadgen run may take (also its --max-seconds)
KILL_BOUND = 10.0      # seconds: the longest a killed process group may take to vanish
SEQ_STRIDE = 1000000   # sequence numbers of round r: r * SEQ_STRIDE + [0, sessions)


# ------------------------------------------------------------------------------------------------
# The message of a sequence number: smtpe-loadgen --unique (see the header comment of
# tests/bench/loadgen.c, which this follows octet for octet)
# ------------------------------------------------------------------------------------------------
M64 = (1 << 64) - 1
ALPHA = b"abcdefghijklmnopqrstuvwxyz0123456789" * 4  # any 76-octet run from offset < 36


def unique_content(n, body_size):
    """The content octets (before dot-stuffing, ending in CRLF) loadgen sends for seq n."""
    st = n

    def nxt():
        nonlocal st
        st = (st + 0x9E3779B97F4A7C15) & M64
        z = st
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    tag = nxt() & 0xFFFFFFFF
    r = nxt()
    if r % 10 == 0:
        want = 49152 + (r >> 32) % 131072
    else:
        want = body_size // 2 + (r >> 32) % (body_size + 1)
    head = (b"From: <loadgen@example.org>\r\nTo: <user1@example.com>\r\n"
            b"Subject: smtpe-loadgen %d\r\nMessage-ID: <%d.%08x@loadgen>\r\n\r\n" % (n, n, tag))
    parts = [head]
    size = len(head)
    i = 0
    while size < want:
        v = nxt()
        ln = v % 77
        off = (n + i) % 36
        line = ALPHA[off:off + ln]
        if ln > 0 and (v >> 8) % 5 == 0:
            line = b"." + line[1:]
        parts.append(line + b"\r\n")
        size += ln + 2
        i += 1
    return b"".join(parts)


MSGID_RE = re.compile(rb"\r\nMessage-ID: <(\d+)\.[0-9a-f]{8}@loadgen>\r\n")


def expected_received(qid):
    """The Received header smtpe-server writes for a loadgen session, up to the date."""
    return (b"Received: from " + HELO + b" ([127.0.0.1])\r\n\tby " + HOST.encode() +
            b" (smtpe) with ESMTP id " + qid.encode() + b"\r\n\tfor <" + RCPT + b">; ")


class Problem(Exception):
    pass


def check_file(path, name, body_size):
    """Checks one file of new/; returns (seq, qid, size, content length). Raises Problem."""
    parts = name.split(".")
    if len(parts) < 3 or not parts[0].isdigit():
        raise Problem("%s: not a <secs>.<queue id>.<host> name" % name)
    qid = parts[1]
    with open(path, "rb") as f:
        data = f.read()
    try:
        st = ts.Stored(name, data)
    except AssertionError as e:
        raise Problem("unparsable (partial?) file %s (%d octets): %s" % (name, len(data), e))
    if st.return_path != b"<" + SENDER + b">":
        raise Problem("%s: Return-Path %r" % (name, st.return_path))
    want = expected_received(qid)
    if not st.received.startswith(want) or not st.received.endswith(b"\r\n"):
        raise Problem("%s: Received header %r, expected %r<date>CRLF" % (name, st.received, want))
    date = st.received[len(want):-2]
    try:
        email.utils.parsedate_to_datetime(date.decode("ascii"))
    except Exception as e:
        raise Problem("%s: bad date %r: %s" % (name, date, e))
    m = MSGID_RE.search(st.content)
    if not m:
        raise Problem("%s: no loadgen Message-ID in the content (%d octets, starts %r): partial?"
                      % (name, len(st.content), st.content[:120]))
    seq = int(m.group(1))
    exp = unique_content(seq, body_size)
    if st.content != exp:
        got = st.content
        i = next((k for k in range(min(len(got), len(exp))) if got[k] != exp[k]),
                 min(len(got), len(exp)))
        raise Problem("%s: content of seq %d differs at octet %d (stored %d octets, sent %d): "
                      "partial or corrupt\n  stored: %r\n  sent:   %r"
                      % (name, seq, i, len(got), len(exp), got[max(0, i - 30):i + 30],
                         exp[max(0, i - 30):i + 30]))
    return seq, qid, len(data), len(exp)


def parse_ack_log(path, lo, hi):
    """{seq: qid} for 250s, {seq: reason} for FAIL lines. Raises Problem on a bad line."""
    acked, failed = {}, {}
    with open(path, "rb") as f:
        text = f.read().decode("ascii", "replace")
    if text and not text.endswith("\n"):
        raise Problem("ack log %s ends in a partial line" % path)
    for line in text.splitlines():
        f = line.split(" ")
        if len(f) < 2 or not f[0].isdigit() or not lo <= int(f[0]) < hi:
            raise Problem("ack log: bad line %r" % line)
        seq = int(f[0])
        if seq in acked or seq in failed:
            raise Problem("ack log: seq %d twice" % seq)
        if f[1] == "FAIL" and len(f) == 3:
            failed[seq] = f[2]
        elif len(f) == 2 and re.fullmatch(r"[0-9A-Za-z]+", f[1]):
            acked[seq] = f[1]
        else:
            raise Problem("ack log: bad line %r (a 250 without a queue id?)" % line)
    return acked, failed


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def free_port():
    """A free loopback port below the ephemeral range when possible, so that no outgoing
    connection nor any other test's port 0 takes it while the server is down between rounds."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    pick = random.SystemRandom()
    candidates = [pick.randrange(10000, low) for _ in range(50)] if low > 10100 else []
    for port in candidates + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise Problem("no free loopback port")


def group_alive(pgid):
    """Whether a process of group pgid is alive: not a zombie (a worker orphaned by the kill is
    reaped by PID 1 when it gets to it, but its descriptors, the listener, are closed already)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


# ------------------------------------------------------------------------------------------------
class Server:
    """smtpe-server in its own process group, stderr to a file."""

    def __init__(self, exe, port, maildir, logpath, model_args):
        # --maildir-crlf: each file is checked byte-exact against what loadgen sent
        self.cmd = [exe, "--listen", "127.0.0.1:%d" % port, "--maildir", maildir,
                    "--maildir-crlf", "--hostname", HOST, "--drain-seconds", "2"] + model_args
        self.logpath = logpath
        self.log = open(logpath, "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log,
                                     start_new_session=True)
        self.pgid = self.proc.pid

    def wait_listening(self):
        deadline = time.monotonic() + START_BOUND
        while time.monotonic() < deadline:
            if "listening on" in self.text():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.01)
        return False

    def text(self):
        with open(self.logpath, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def kill9(self):
        """SIGKILL to the whole group; waits (bounded) until no process of it is left."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(KILL_BOUND)
        deadline = time.monotonic() + KILL_BOUND
        while group_alive(self.pgid):
            if time.monotonic() > deadline:
                raise Problem("processes of group %d still alive %.0f s after SIGKILL"
                              % (self.pgid, KILL_BOUND))
            time.sleep(0.002)
        self.log.close()

    def stop(self):
        """SIGTERM to the supervisor; returns its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise Problem("smtpe-server did not exit within 30 s of SIGTERM")
        self.log.close()
        return rc

    def sanitizer_report(self):
        t = self.text()
        return t if any(m in t for m in ts.SANITIZER_MARKS) else None


def start_server(a, port, maildir, logpath):
    """A listening server; retries a few times while the port is still held by the last one."""
    for attempt in range(20):
        srv = Server(a.server, port, maildir, logpath, a.model_args)
        if srv.wait_listening():
            return srv
        text = srv.text()
        if srv.proc.poll() is None:
            srv.kill9()
            raise Problem("smtpe-server printed no 'listening on' within %.0f s:\n%s"
                          % (START_BOUND, text[-3000:]))
        srv.kill9()
        if "in use" not in text:
            raise Problem("smtpe-server exited with status %s:\n%s"
                          % (srv.proc.returncode, text[-3000:]))
        time.sleep(0.1 * (attempt + 1))
    raise Problem("port %d stayed in use" % port)


def run_loadgen(a, port, ack, base, sessions, out, err):
    cmd = [a.loadgen, "--connect", "127.0.0.1:%d" % port, "--sessions", str(sessions),
           "--concurrency", str(a.concurrency), "--unique", "--ack-log", ack,
           "--seq-base", str(base), "--body-size", str(a.body_size), "--timeout-ms", "30000",
           "--max-seconds", str(int(LOADGEN_BOUND)), "--quiet"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)


def finish_loadgen(lg, outpath, errpath):
    """Waits for loadgen; returns its JSON summary. Raises Problem if it hangs or crashes."""
    try:
        rc = lg.wait(LOADGEN_BOUND + 30)
    except subprocess.TimeoutExpired:
        lg.kill()
        lg.wait()
        raise Problem("smtpe-loadgen did not end within %.0f s after the kill" % LOADGEN_BOUND)
    with open(errpath, "rb") as f:
        err = f.read().decode("utf-8", "replace")
    with open(outpath, "rb") as f:
        out = f.read().decode("utf-8", "replace").strip().splitlines()
    if rc not in (0, 1) or not out:
        raise Problem("smtpe-loadgen exited with status %d: %s" % (rc, err[-2000:]))
    if any(m in err for m in ts.SANITIZER_MARKS):
        raise Problem("sanitizer report on smtpe-loadgen's stderr:\n%s" % err[-4000:])
    return rc, json.loads(out[-1])


# ------------------------------------------------------------------------------------------------
class State:
    """What the rounds have established so far."""

    def __init__(self):
        self.checked = {}       # file name in new/ -> size, every file checked
        self.seq_file = {}      # seq -> file name
        self.acked_qid = {}     # seq -> queue id of its 250, over all rounds


def check_round(a, st, new_dir, acked, failed):
    """Checks new/ after a round. Returns figures; raises Problem."""
    names = os.listdir(new_dir)
    missing_old = [n for n in st.checked if n not in names]
    if missing_old:
        raise Problem("files checked in earlier rounds are gone from new/: %r" % missing_old[:5])
    by_qid = {}
    for n in names:
        parts = n.split(".")
        if len(parts) >= 2:
            by_qid.setdefault(parts[1], []).append(n)
    fresh = [n for n in names if n not in st.checked]
    figs = {"new_files": len(fresh), "large": 0, "unacked_stored": 0}
    for n in sorted(fresh):
        seq, qid, size, clen = check_file(os.path.join(new_dir, n), n, a.body_size)
        if seq in st.seq_file:
            raise Problem("seq %d stored twice: %s and %s" % (seq, st.seq_file[seq], n))
        if seq in acked:
            if acked[seq] != qid:
                raise Problem("seq %d was acknowledged as %s but is stored as %s"
                              % (seq, acked[seq], n))
        elif failed.get(seq) == "noreply":
            figs["unacked_stored"] += 1
        elif seq in failed:
            raise Problem("%s holds seq %d, whose end-of-data was refused with %s: a client "
                          "would send it again" % (n, seq, failed[seq]))
        else:
            raise Problem("%s holds seq %d, which this round's loadgen never finished sending "
                          "(no ack-log line)" % (n, seq))
        if clen > 65536:
            figs["large"] += 1
        st.seq_file[seq] = n
        st.checked[n] = size
    for seq, qid in sorted(acked.items()):
        files = by_qid.get(qid, [])
        if len(files) != 1:
            raise Problem("LOST: seq %d was acknowledged with 250 (queued as %s) but new/ holds "
                          "%d files for that queue id: %r" % (seq, qid, len(files), files))
        st.acked_qid[seq] = qid
    return figs


def run(a):
    seed = a.seed if a.seed is not None else int(time.time() * 1000) % 1000000007
    print("durability: seed %d (rerun with --seed %d), model %s, %d rounds of %d sessions at "
          "concurrency %d" % (seed, seed, " ".join(a.model_args) or "epoll", a.rounds,
                              a.sessions, a.concurrency))
    sys.stdout.flush()
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="smtpe-durability-")
    maildir = os.path.join(work, "maildir")
    st = State()
    totals = {"acked": 0, "in_flight": 0, "unacked_stored": 0, "mid_load": 0, "large": 0,
              "fail_code": 0}
    ok = False
    srv = None
    t_start = time.monotonic()
    try:
        port = free_port()
        print("port %d, work directory %s" % (port, work))
        print("round  kill-at(acks,+ms)  acks@kill  acked  cut-mid-msg  stored-unacked  new-files "
              ">64KiB  tmp/  lg-failed  lg-running  s")
        for rnd in range(1, a.rounds + 1):
            t0 = time.monotonic()
            logpath = os.path.join(work, "server.%d.log" % rnd)
            srv = start_server(a, port, maildir, logpath)
            base = rnd * SEQ_STRIDE
            ack = os.path.join(work, "acks.%d" % rnd)
            outp = os.path.join(work, "lg.%d.json" % rnd)
            errp = os.path.join(work, "lg.%d.err" % rnd)
            threshold = rng.randint(1, max(1, int(a.sessions * 0.7)))
            extra_ms = rng.uniform(0.0, 10.0)
            with open(outp, "wb") as out, open(errp, "wb") as err:
                lg = run_loadgen(a, port, ack, base, a.sessions, out, err)
            deadline = time.monotonic() + LOADGEN_BOUND
            while (count_lines(ack) < threshold and lg.poll() is None and
                   time.monotonic() < deadline):
                time.sleep(0.001)
            time.sleep(extra_ms / 1000.0)
            running = lg.poll() is None
            at_kill = count_lines(ack)
            srv.kill9()
            report = srv.sanitizer_report()
            if report:
                raise Problem("sanitizer report on the server's stderr:\n%s" % report[-4000:])
            srv = None
            _, summary = finish_loadgen(lg, outp, errp)
            acked, failed = parse_ack_log(ack, base, base + a.sessions)
            figs = check_round(a, st, os.path.join(maildir, "new"), acked, failed)
            in_flight = sum(1 for r in failed.values() if r == "noreply")
            fail_code = len(failed) - in_flight
            tmp_left = len(os.listdir(os.path.join(maildir, "tmp")))
            mid = running and summary["failed"] > 0
            totals["acked"] += len(acked)
            totals["in_flight"] += in_flight
            totals["fail_code"] += fail_code
            totals["unacked_stored"] += figs["unacked_stored"]
            totals["large"] += figs["large"]
            totals["mid_load"] += 1 if mid else 0
            print("%5d  %6d,+%4.1f  %10d  %5d  %11d  %14d  %9d  %6d  %4d  %9d  %10s  %.2f"
                  % (rnd, threshold, extra_ms, at_kill, len(acked), in_flight,
                     figs["unacked_stored"], figs["new_files"], figs["large"], tmp_left,
                     summary["failed"], "yes" if running else "NO", time.monotonic() - t0))
            sys.stdout.flush()

        # Every acknowledged message of every round is still there, with the size checked.
        new_dir = os.path.join(maildir, "new")
        for n, size in st.checked.items():
            if os.path.getsize(os.path.join(new_dir, n)) != size:
                raise Problem("%s changed size after it was checked" % n)

        # The crashed Maildir serves again, and a clean run ends cleanly. At start the server
        # sweeps tmp/ of files older than 36 hours (the Maildir convention for deliveries cut
        # short): the kills' leftovers are younger, so one is aged here to see it go, while a
        # fresh one (a delivery another agent may still be writing) must stay.
        tmp_dir = os.path.join(maildir, "tmp")
        leftovers = sorted(os.listdir(tmp_dir))
        old = os.path.join(tmp_dir, "1.old-crash-leftover")
        fresh = os.path.join(tmp_dir, "2.delivery-in-progress")
        for path in (old, fresh):
            with open(path, "wb") as f:
                f.write(b"Subject: partial\r\n")
        aged = time.time() - 37 * 3600
        os.utime(old, (aged, aged))
        if leftovers:
            os.utime(os.path.join(tmp_dir, leftovers[0]), (aged, aged))
        srv = start_server(a, port, maildir, os.path.join(work, "server.final.log"))
        gone = [p for p in (old, os.path.join(tmp_dir, leftovers[0]) if leftovers else old)
                if os.path.exists(p)]
        if gone or not os.path.exists(fresh):
            raise Problem("tmp/ sweep at start: aged files left %r, fresh file kept: %s"
                          % (gone, os.path.exists(fresh)))
        if "maildir tmp/: removed %d files" % (2 if leftovers else 1) not in srv.text():
            raise Problem("no log line for the tmp/ sweep:\n%s" % srv.text()[-2000:])
        os.unlink(fresh)
        base = (a.rounds + 1) * SEQ_STRIDE
        ack = os.path.join(work, "acks.final")
        outp, errp = os.path.join(work, "lg.final.json"), os.path.join(work, "lg.final.err")
        with open(outp, "wb") as out, open(errp, "wb") as err:
            lg = run_loadgen(a, port, ack, base, 50, out, err)
        rc, summary = finish_loadgen(lg, outp, errp)
        if rc != 0 or summary["failed"] != 0:
            raise Problem("clean run after the crashes: status %d, %r" % (rc, summary))
        acked, failed = parse_ack_log(ack, base, base + 50)
        if len(acked) != 50 or failed:
            raise Problem("clean run: %d acknowledged, failures %r" % (len(acked), failed))
        check_round(a, st, new_dir, acked, failed)
        rc = srv.stop()
        report = srv.sanitizer_report()
        srv = None
        if rc != 0:
            raise Problem("smtpe-server exited with status %d after SIGTERM" % rc)
        if report:
            raise Problem("sanitizer report on the server's stderr:\n%s" % report[-4000:])

        print("totals: %d acknowledged, all found byte-exact; %d files in new/; %d cut mid-message "
              "(%d of them stored though unacknowledged); %d refused with a code; %d over 64 KiB; "
              "%d of %d kills mid-load; tmp/ leftovers %d; %.1f s"
              % (totals["acked"], len(st.checked), totals["in_flight"],
                 totals["unacked_stored"], totals["fail_code"], totals["large"],
                 totals["mid_load"], a.rounds, len(os.listdir(os.path.join(maildir, "tmp"))),
                 time.monotonic() - t_start))
        # The test proves something only if the kills hit a loaded server.
        need_acked = a.rounds * 20
        if totals["acked"] < need_acked:
            raise Problem("only %d messages acknowledged in all (< %d): the test proves nothing"
                          % (totals["acked"], need_acked))
        if totals["mid_load"] < (a.rounds * 3 + 3) // 4:
            raise Problem("only %d of %d kills landed while loadgen was running with sessions "
                          "cut: the test proves nothing" % (totals["mid_load"], a.rounds))
        if totals["in_flight"] < a.rounds:
            raise Problem("only %d sessions were cut while sending or awaiting the end-of-data "
                          "reply (< %d): the kills missed the storing" % (totals["in_flight"],
                                                                        a.rounds))
        ok = True
    except Problem as e:
        print("FAIL (seed %d): %s" % (seed, e))
        print("work directory kept: %s" % work)
        a.keep = True
    finally:
        if srv is not None:
            srv.kill9()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("durability: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("server", nargs="?", default=os.environ.get("SMTPE_SERVER") or
                    os.path.join(here, "..", "..", "build", "smtpe-server"))
    ap.add_argument("loadgen", nargs="?", default=None,
                    help="smtpe-loadgen (default: tests/bench/smtpe-loadgen beside SERVER)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--workers", type=int, default=2, help="prefork/reuseport workers (2)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--sessions", type=int, default=400, help="sessions per round (400)")
    ap.add_argument("--concurrency", type=int, default=30)
    ap.add_argument("--body-size", type=int, default=4096)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    a.server = os.path.abspath(a.server)
    if a.loadgen is None:
        a.loadgen = os.path.join(os.path.dirname(a.server), "tests", "bench", "smtpe-loadgen")
    a.loadgen = os.path.abspath(a.loadgen)
    a.model_args = []
    if a.model:
        a.model_args = ["--model", a.model]
        if a.model in ("prefork", "reuseport"):
            a.model_args += ["--workers", str(a.workers)]
    for exe in (a.server, a.loadgen):
        if not os.access(exe, os.X_OK):
            print("not found or not executable: %s" % exe)
            print("durability: FAIL")
            return 1
    if a.rounds < 1 or not 10 <= a.sessions < SEQ_STRIDE:
        ap.error("--rounds >= 1 and 10 <= --sessions < %d" % SEQ_STRIDE)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
