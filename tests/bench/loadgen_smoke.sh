#!/bin/sh
# loadgen_smoke: starts smtpe-server --sink on a free loopback port, runs smtpe-loadgen with 300
# sessions (50 at once) against it, checks the JSON line (sessions 300, failed 0), stops the
# server with SIGTERM. Exits non-zero on any problem.
#   usage: loadgen_smoke.sh SMTPE-SERVER SMTPE-LOADGEN
set -u
server=$1
loadgen=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/smtpe-loadgen-smoke.XXXXXX") || exit 1
pid=

cleanup() {
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fail() {
    echo "loadgen_smoke: FAIL: $*" >&2
    echo "--- server stderr (last lines):" >&2
    tail -n 20 "$dir/server.log" >&2 2>/dev/null
    exit 1
}

cd "$dir" || exit 1
"$server" --sink --listen 127.0.0.1:0 --hostname loadgen.test --drain-seconds 1 \
    </dev/null >/dev/null 2>"$dir/server.log" &
pid=$!

port=
i=0
while [ $i -lt 100 ]; do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$dir/server.log" | head -n 1)
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "smtpe-server exited before listening"
    sleep 0.05
    i=$((i + 1))
done
[ -n "$port" ] && [ "$port" != 0 ] || fail "no 'listening on 127.0.0.1:PORT' line from smtpe-server"

"$loadgen" --connect "127.0.0.1:$port" --sessions 300 --concurrency 50 --timeout-ms 5000 \
    >"$dir/out.json" 2>"$dir/loadgen.log"
rc=$?
json=$(tail -n 1 "$dir/out.json")
echo "$json"
[ $rc -eq 0 ] || { cat "$dir/loadgen.log" >&2; fail "smtpe-loadgen exited with $rc"; }
case $json in
    *'"sessions":300,'*) ;;
    *) fail "JSON does not say sessions 300: $json" ;;
esac
case $json in
    *'"failed":0,'*) ;;
    *) fail "JSON does not say failed 0: $json" ;;
esac

# A pipelined run with two recipients and a 1 KiB body, too.
"$loadgen" --connect "127.0.0.1:$port" --sessions 100 --concurrency 20 --pipelining --rcpts 2 \
    --body-size 1000 --timeout-ms 5000 --quiet >"$dir/out2.json" 2>"$dir/loadgen2.log"
rc=$?
json=$(tail -n 1 "$dir/out2.json")
echo "$json"
[ $rc -eq 0 ] || { cat "$dir/loadgen2.log" >&2; fail "smtpe-loadgen --pipelining exited with $rc"; }
case $json in
    *'"sessions":100,"failed":0,'*) ;;
    *) fail "pipelined run: $json" ;;
esac

kill -TERM "$pid" || fail "cannot signal smtpe-server"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] || fail "smtpe-server exited with $rc after SIGTERM"
echo "loadgen_smoke: ok"
exit 0
