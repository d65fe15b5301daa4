#!/usr/bin/env bash
# Runs one peer SMTP server of the benchmark in the foreground, listening on 127.0.0.1:PORT. It
# execs the server, so the PID of this script is the server's own (the driver samples its CPU and
# RSS in /proc). Every peer accepts any MAIL and RCPT and discards the message, and prints
# "listening on 127.0.0.1:PORT" on stderr once it is bound; SIGTERM stops it.
#
#   tests/bench/peers/start.sh NAME PORT BUILD_DIR
#
#   null       BUILD_DIR/tests/bench/smtpe-null-responder: fixed replies, no parsing (the floor)
#   smtp-sink  Postfix's /usr/sbin/smtp-sink (announces PIPELINING; as root it runs as nobody)
#   aiosmtpd   peers/aiosmtpd_sink.py under Debian's /usr/bin/python3 (python3-aiosmtpd)
#   go-smtp    BUILD_DIR/tests/bench/peers/go-smtp-sink, built here from peers/gosink/main.go
#              (offline, Debian's golang-github-emersion-go-smtp-dev) when missing or older
#
# PORT must be non-zero. Exit status 127 with a one-line message when NAME is unknown or its
# tool is missing (tests/bench/deps.sh installs them), 2 on a usage error, 1 when the go-smtp
# build fails; otherwise that of the server.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if (($# != 3)); then
    echo "usage: start.sh null|smtp-sink|aiosmtpd|go-smtp PORT BUILD_DIR" >&2
    exit 2
fi
name=$1 port=$2 build=$3
if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    echo "start.sh: PORT must be 1..65535, not '$port'" >&2
    exit 2
fi
missing() {
    echo "start.sh: $name: $*" >&2
    exit 127
}

# 10 000 sessions need 10 000 descriptors: take the hard limit (each server may also raise it).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

case "$name" in
null)
    bin=$build/tests/bench/smtpe-null-responder
    [[ -x "$bin" ]] || missing "no $bin (cmake --build BUILD_DIR --target smtpe-null-responder)"
    exec "$bin" --listen "127.0.0.1:$port"
    ;;
smtp-sink)
    sink=/usr/sbin/smtp-sink
    [[ -x "$sink" ]] || missing "no $sink (package postfix: run tests/bench/deps.sh)"
    # -m: sessions handled at once (default 256; more stay in the accept queue), as many as the
    # descriptors allow. -a: no AUTH offered. The last argument is the listen backlog (the kernel
    # caps it at net.core.somaxconn). Not -c: its counters would cost output on every message.
    hard=$(ulimit -Hn)
    [[ "$hard" == unlimited ]] && hard=1048576
    max=$((hard - 64 > 100000 ? 100000 : hard - 64))
    args=(-4 -a -h smtp-sink -m "$max")
    [[ $(id -u) -eq 0 ]] && args+=(-u nobody) # smtp-sink refuses to run as root without -u
    # smtp-sink prints nothing once bound: a detached watcher does, as soon as a socket of this
    # very process ($$, which exec keeps) listens on the port (seen in /proc/net/tcp).
    (
        (
            hexport=$(printf '%04X' "$port")
            for _ in $(seq 400); do
                [[ -d /proc/$$ ]] || exit 0 # smtp-sink is gone (bind failed)
                inode=$(awk -v a="0100007F:$hexport" '$2 == a && $4 == "0A" { print $10 }' \
                    /proc/net/tcp 2>/dev/null)
                if [[ -n "$inode" ]]; then
                    for fd in "/proc/$$/fd"/*; do
                        if [[ $(readlink "$fd" 2>/dev/null) == "socket:[$inode]" ]]; then
                            echo "listening on 127.0.0.1:$port" >&2
                            exit 0
                        fi
                    done
                fi
                sleep 0.025
            done
        ) &
    )
    exec "$sink" "${args[@]}" "inet:127.0.0.1:$port" 65535
    ;;
aiosmtpd)
    py=/usr/bin/python3 # Debian's, which has python3-aiosmtpd (another python3 may come first)
    if ! [[ -x "$py" ]] || ! "$py" -c 'import aiosmtpd' 2>/dev/null; then
        missing "no aiosmtpd module for $py (package python3-aiosmtpd: run tests/bench/deps.sh)"
    fi
    exec "$py" "$here/aiosmtpd_sink.py" --listen "127.0.0.1:$port"
    ;;
go-smtp)
    bin=$build/tests/bench/peers/go-smtp-sink
    src=$here/gosink/main.go
    if [[ ! -x "$bin" || "$src" -nt "$bin" ]]; then
        go=/usr/bin/go
        [[ -x "$go" ]] || go=$(command -v go) ||
            missing "no go (package golang-go: run tests/bench/deps.sh)"
        gopath=/usr/share/gocode
        src_dir=$gopath/src/github.com/emersion
        [[ -d "$src_dir/go-smtp" && -d "$src_dir/go-sasl" ]] ||
            missing "no go-smtp source in $gopath (run tests/bench/deps.sh)"
        mkdir -p "$build/tests/bench/peers" || exit 1
        # GOPATH mode over Debian's packaged source: no module download, no network.
        if ! env GO111MODULE=off GOPATH="$gopath" GOPROXY=off GOFLAGS= GOTOOLCHAIN=local \
            GOCACHE="$build/tests/bench/peers/go-cache" \
            "$go" build -o "$bin.tmp.$$" "$src" >&2; then
            rm -f "$bin.tmp.$$"
            echo "start.sh: go-smtp: build of $src failed" >&2
            exit 1
        fi
        mv -f "$bin.tmp.$$" "$bin" || exit 1
    fi
    exec "$bin" -listen "127.0.0.1:$port"
    ;;
*)
    echo "start.sh: unknown peer '$name' (null, smtp-sink, aiosmtpd, go-smtp)" >&2
    exit 127
    ;;
esac
