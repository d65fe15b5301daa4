#!/usr/bin/env python3
"""loadgen_vs_old.py - smtpe-loadgen's client CPU per session beside the tool it replaced.

smtpe-loadgen once spoke SMTP with its own code (commit a6f84c7, before the client engine); issue
12 bounds what the engine may add to the benchmark's client CPU per session (10 %). This script
builds that old tool from git history (its one C file needs libc only), starts smtpe-server
--model epoll --sink on a free loopback port, and runs the old and the new tool side by side.

Each round runs both tools at the same time, on the same CPU (CPU 0, the server on CPU 1, when
there are two), against the same server, so that both meet the same noise: this shared machine's
absolute figures drift by tens of percent between runs, but the two tools of one round see the
same drift. A tool's CPU is its utime + stime from wait4(2) (the kernel's sum of run time is
exact; only its split into user and system is sampled per tick), divided by its sessions. The
order the two start in alternates. Prints each round, then per tool the median CPU per session
and the median, 10th and 90th percentile of the per-round ratio new / old. A failed session in
either tool is an error (exit 1).

  usage: tests/bench/loadgen_vs_old.py [--build DIR] [--rounds N] [--sessions N]
                                       [--concurrency C] [--smoke] [-- LOADGEN-ARGS...]
    --build DIR      a CMake build with smtpe-server and tests/bench/smtpe-loadgen (default
                     build-bench, as tests/bench/run.sh makes it: a Release build)
    --rounds N       rounds (default 20); --sessions N per tool a round (default 10000);
    --concurrency C  per tool (default 100)
    --smoke          2 rounds of 300 sessions; checks that both tools ran, prints no verdict
    LOADGEN-ARGS     passed to both tools, e.g. -- --pipelining, or -- --sources 4
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

OLD_COMMIT = "a6f84c7"  # the last commit whose smtpe-loadgen had its own protocol code

# the integration tests' helpers (free_port) serve here too
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "integration"))
from peers import free_port  # noqa: E402


def pin(cpu):
    if len(os.sched_getaffinity(0)) < 2:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(usage=__doc__.split("usage: ")[1].split("\n    ")[0])
    ap.add_argument("--build", default=os.path.join(root, "build-bench"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.sessions = 2, 300
    new = os.path.join(a.build, "tests", "bench", "smtpe-loadgen")
    server = os.path.join(a.build, "smtpe-server")
    for f in (new, server):
        if not os.access(f, os.X_OK):
            sys.exit(f"loadgen_vs_old: no {f}: build it first (cmake -B {a.build} "
                     "-DCMAKE_BUILD_TYPE=Release && cmake --build "
                     f"{a.build} --target smtpe-server smtpe-loadgen)")

    work = tempfile.mkdtemp(prefix="loadgen-vs-old.")
    src = os.path.join(work, "loadgen-old.c")
    old = os.path.join(work, "smtpe-loadgen-old")
    with open(src, "wb") as f:
        f.write(subprocess.run(["git", "-C", root, "show", OLD_COMMIT + ":tests/bench/loadgen.c"],
                               check=True, stdout=subprocess.PIPE).stdout)
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O3", "-DNDEBUG", "-D_GNU_SOURCE", "-std=c11", "-o", old, src],
                   check=True)

    port = free_port()
    log = open(os.path.join(work, "server.log"), "w")
    srv = subprocess.Popen([server, "--model", "epoll", "--sink", "--listen",
                            f"127.0.0.1:{port}", "--max-clients", "20000"],
                           stdout=log, stderr=log, preexec_fn=pin(1))
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            sys.exit("loadgen_vs_old: smtpe-server did not start (see " + log.name + ")")
        cpu = {old: [], new: []}
        names = {old: "old (a6f84c7)", new: "new (client engine)"}
        print(f"# {a.rounds} rounds, {a.sessions} sessions a tool, concurrency "
              f"{a.concurrency} a tool, loadgen args {a.args or 'none'}; old and new at once on "
              f"one CPU against smtpe-server --model epoll --sink", flush=True)
        for r in range(a.rounds):
            procs = {}
            for tool in ((old, new) if r % 2 == 0 else (new, old)):
                p = subprocess.Popen([tool, "--connect", f"127.0.0.1:{port}", "--sessions",
                                      str(a.sessions), "--concurrency", str(a.concurrency),
                                      "--quiet"] + a.args,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     preexec_fn=pin(0))
                procs[p.pid] = (tool, p)
            line = []
            while procs:
                pid, status, ru = os.wait4(-1, 0)
                if pid not in procs:
                    continue
                tool, p = procs.pop(pid)
                out = p.stdout.read().decode()
                try:
                    failed = json.loads(out.strip().splitlines()[-1])["failed"]
                except (ValueError, KeyError, IndexError):
                    failed = None
                if status != 0 or failed != 0:
                    sys.exit(f"loadgen_vs_old: {names[tool]} failed: status {status}: {out}")
                cpu[tool].append((ru.ru_utime + ru.ru_stime) / a.sessions * 1e6)
            print(f"round {r + 1}: old {cpu[old][-1]:.2f} us/session, new {cpu[new][-1]:.2f}, "
                  f"ratio {cpu[new][-1] / cpu[old][-1]:.3f}", flush=True)
    finally:
        srv.terminate()
        srv.wait()
    if a.smoke:
        print("loadgen_vs_old: smoke ok (no verdict from so few sessions)")
        return 0
    ratios = sorted(n / o for n, o in zip(cpu[new], cpu[old]))
    def q(f):
        return ratios[min(len(ratios) - 1, int(f * len(ratios)))]
    print(f"old: median {statistics.median(cpu[old]):.2f} us of client CPU a session")
    print(f"new: median {statistics.median(cpu[new]):.2f} us of client CPU a session")
    print(f"new / old, per round: median {statistics.median(ratios):.3f}, "
          f"10th percentile {q(0.1):.3f}, 90th percentile {q(0.9):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
