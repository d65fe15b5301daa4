#!/usr/bin/env bash
# shellcheck disable=SC1091,SC2016,SC2317 # backquotes are Markdown; cleanup() runs from a trap
# run.sh: the benchmark of issue 4. Builds smtpe-server, smtpe-loadgen and smtpe-null-responder in
# Release, then runs the whole matrix in one go, one server at a time on 127.0.0.1:
#   smtpe-server --model threads|epoll|prefork|reuseport (--workers 2 for the last two), each
#     with --sink and with --maildir (durable: fsync before the 250), at 100, 1000 and 10000
#     concurrent sessions, plus 10000 concurrent with --reply-delay-ms 10 (the Ruby study's
#     setting; sink only);
#   the peers of tests/bench/peers/start.sh (null, smtp-sink, aiosmtpd, go-smtp; sink only) at
#     100, 1000 and 10000;
#   Postfix's smtp-source driving smtpe-server --model epoll --sink at 100 (sessions/s from wall
#     time; no latency figures).
# Every row gets a fresh server, a short warm-up, then smtpe-loadgen (4 KB message, one
# recipient; see loadgen.c) with enough sessions to last a few seconds. Per row it records
# sessions/s, p50/p95/p99, failed sessions (from loadgen's JSON line), the server's CPU per
# session (utime+stime of the server process and all its descendants and threads, from
# /proc/PID/stat), the server's peak RSS (sum of VmHWM over the process tree, read just before
# SIGTERM) and the load generator's CPU. A row whose server does not start (a model or option not
# there yet, a peer not installed) is reported "n/a" with the reason; the matrix always goes on.
#
# Writes DIR/results.csv, DIR/results.md (machine, commit, command, table, the comparison with
# the Ruby study) and DIR/results.png (gnuplot, tests/bench/plot.gp); per-row logs in DIR/logs/.
#
#   usage: tests/bench/run.sh [--smoke] [--out DIR] [--build DIR] [--no-build] [--seconds N]
#     --out DIR     where the results go (default tests/bench/results; with --smoke a temp dir,
#                   removed when every check passed)
#     --build DIR   CMake build dir (default build-bench at the repo root)
#     --no-build    use the binaries already in the build dir (ctest: bench_run_smoke)
#     --seconds N   aimed duration of a measured run (default 4)
#     --smoke       CI check, ~10 s: epoll and whatever other smtpe models start (sink and
#                   maildir) and the null responder, 50 concurrent, 1000 sessions, no warm-up;
#                   then checks the three files; exit 1 when a check fails
# Environment: SMTPE_BENCH_PORTS=LO-HI, the range for peers' fixed ports (default 28000-28999);
#   SMTPE_BENCH_LOADGEN_ARGS, more smtpe-loadgen options for every run (e.g. --max-opening 1024).
set -u
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || exit 2
BENCH=$ROOT/tests/bench
CMDLINE="tests/bench/run.sh"
for a in "$@"; do CMDLINE+=" $(printf '%q' "$a")"; done

SMOKE=0
OUT=
BUILD=
DO_BUILD=1
TARGET_SECONDS=4
usage() { sed -n '/^#   usage:/,/^set -u/p' "${BASH_SOURCE[0]}" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) SMOKE=1 ;;
        --out) [ $# -ge 2 ] || { usage >&2; exit 2; }; OUT=$2; shift ;;
        --out=*) OUT=${1#--out=} ;;
        --build) [ $# -ge 2 ] || { usage >&2; exit 2; }; BUILD=$2; shift ;;
        --build=*) BUILD=${1#--build=} ;;
        --no-build) DO_BUILD=0 ;;
        --seconds) [ $# -ge 2 ] || { usage >&2; exit 2; }; TARGET_SECONDS=$2; shift ;;
        --seconds=*) TARGET_SECONDS=${1#--seconds=} ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
case $TARGET_SECONDS in ''|*[!0-9]*|0) echo "run.sh: --seconds wants a positive integer" >&2; exit 2 ;; esac

abspath() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
BUILD=$(abspath "${BUILD:-$ROOT/build-bench}")
KEEP_OUT=1
if [ -n "$OUT" ]; then
    OUT=$(abspath "$OUT")
elif [ $SMOKE = 1 ]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/smtpe-bench-smoke.XXXXXX") || exit 2
    KEEP_OUT=0
else
    OUT=$BENCH/results
fi
mkdir -p "$OUT/logs" || exit 2
rm -f "$OUT"/logs/*.log "$OUT"/logs/*.json 2>/dev/null
WORK=$(mktemp -d "${TMPDIR:-/tmp}/smtpe-bench.XXXXXX") || exit 2

log() { printf 'run.sh: %s\n' "$*" >&2; }

# ---- cleanup: whatever server (tree) or client is still running goes --------------------------
CUR_PIDS=""      # the running server's root and known descendants
CLIENT_PID=""
cleanup() {
    local p
    [ -n "$CLIENT_PID" ] && kill -TERM "$CLIENT_PID" 2>/dev/null
    for p in $CUR_PIDS; do kill -TERM "$p" 2>/dev/null; done
    [ -n "$CUR_PIDS" ] && sleep 0.5
    for p in $CUR_PIDS; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$WORK"
    rm -rf "$OUT"/maildir.* 2>/dev/null
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

# ---- build ------------------------------------------------------------------------------------
JOBS=$(nproc 2>/dev/null || echo 2)
NULL_NOTE=""
if [ $DO_BUILD = 1 ]; then
    log "configuring $BUILD (Release)"
    (cd "$ROOT" && cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release) >"$OUT/logs/build.log" 2>&1 ||
        { tail -n 30 "$OUT/logs/build.log" >&2; log "cmake configure failed"; exit 2; }
    log "building smtpe-server smtpe-loadgen smtpe-null-responder"
    if ! cmake --build "$BUILD" -j"$JOBS" --target smtpe-server smtpe-loadgen smtpe-null-responder \
        smtpe-bench-fsync \
        >>"$OUT/logs/build.log" 2>&1; then
        # smtpe-null-responder may not exist (yet): the other two are what we cannot do without.
        cmake --build "$BUILD" -j"$JOBS" --target smtpe-server smtpe-loadgen \
            >>"$OUT/logs/build.log" 2>&1 ||
            { tail -n 30 "$OUT/logs/build.log" >&2; log "build failed"; exit 2; }
        NULL_NOTE="target smtpe-null-responder did not build"
        log "note: $NULL_NOTE (the null row will say n/a)"
    fi
fi
find_bin() { # NAME PREFERRED-PATH
    if [ -x "$2" ]; then printf '%s\n' "$2"; return 0; fi
    find "$BUILD" -name "$1" -type f -perm -u+x 2>/dev/null | head -n 1
}
SERVER=$(find_bin smtpe-server "$BUILD/smtpe-server")
LOADGEN=$(find_bin smtpe-loadgen "$BUILD/tests/bench/smtpe-loadgen")
[ -n "$SERVER" ] || { log "no smtpe-server in $BUILD"; exit 2; }
[ -n "$LOADGEN" ] || { log "no smtpe-loadgen in $BUILD"; exit 2; }
BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ "$BUILD_TYPE" = Release ] || log "warning: $BUILD is not a Release build (CMAKE_BUILD_TYPE='$BUILD_TYPE')"
START_SH=$BENCH/peers/start.sh
SMTP_SOURCE=$(command -v smtp-source 2>/dev/null || true)
[ -z "$SMTP_SOURCE" ] && [ -x /usr/sbin/smtp-source ] && SMTP_SOURCE=/usr/sbin/smtp-source

# ---- limits -----------------------------------------------------------------------------------
# 10 000 sessions storing messages hold 20 000 descriptors in the server alone: as root, lift the
# hard limit first (to fs.nr_open); otherwise take what the hard limit allows.
[ "$(id -u)" = 0 ] && ulimit -Hn "$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)" 2>/dev/null
HARD_NOFILE=$(ulimit -Hn)
[ "$HARD_NOFILE" = unlimited ] && HARD_NOFILE=1048576
ulimit -n "$HARD_NOFILE" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
NOFILE=$(ulimit -n)
CLK_TCK=$(getconf CLK_TCK)
LOADGEN_ARGS=${SMTPE_BENCH_LOADGEN_ARGS:-}

# ---- /proc helpers ----------------------------------------------------------------------------
# tree_stat ROOT: TREE_PIDS = ROOT and every descendant (found through
# /proc/PID/task/TID/children, or a scan of every /proc/PID/stat's ppid where the kernel lacks
# those), TREE_TICKS = the sum over them of utime, stime, cutime and cstime (fields 14-17 of
# /proc/PID/stat: all the threads of a process, and its children already reaped). No fork but
# for the fallback scan: this runs three times a row.
TREE_PIDS=""
TREE_TICKS=0
tree_stat() {
    local -a q=("$1") kids f
    local i=0 p line r sum=0 list="" k
    if [ -e "/proc/$$/task/$$/children" ]; then
        while [ $i -lt ${#q[@]} ]; do
            p=${q[i]}
            i=$((i + 1))
            for k in /proc/"$p"/task/*/children; do
                [ -r "$k" ] || continue
                kids=()
                read -r -a kids 2>/dev/null <"$k"
                [ ${#kids[@]} -gt 0 ] && q+=("${kids[@]}")
            done
        done
    else
        # shellcheck disable=SC2207
        q=($(cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
            {
                sp = index($0, " "); pid = substr($0, 1, sp - 1)
                r = $0; while ((k = index(r, ")")) > 0) r = substr(r, k + 1)
                split(r, f, " "); ppid[pid] = f[2]; all[pid] = 1
            }
            END {
                q[1] = root; n = 1; seen[root] = 1
                for (i = 1; i <= n; i++)
                    for (p in all)
                        if (ppid[p] == q[i] && !(p in seen)) { q[++n] = p; seen[p] = 1 }
                for (i = 1; i <= n; i++) print q[i]
            }'))
    fi
    for p in "${q[@]}"; do
        read -r line 2>/dev/null <"/proc/$p/stat" || continue
        r=${line##*) }      # after the command name: field 3 (state) onwards
        read -r -a f <<<"$r"
        [ ${#f[@]} -ge 15 ] || continue
        sum=$((sum + f[11] + f[12] + f[13] + f[14]))
        list+=" $p"
    done
    TREE_TICKS=$sum
    TREE_PIDS=${list# }
}
tree_hwm_kib() { # PID...: the sum of VmHWM (kB)
    local p
    for p in "$@"; do cat "/proc/$p/status" 2>/dev/null; done | awk '/^VmHWM:/ { s += $2 } END { print s + 0 }'
}
alive() { # PID: running (not gone, not a zombie)
    local line st
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    st=${line##*) }
    st=${st%% *}
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
listen_port() { # FILE...: SRV_PORT = the port of the first "listening on 127.0.0.1:PORT" line
    local f line re='listening on 127\.0\.0\.1:([0-9]+)'
    SRV_PORT=""
    for f in "$@"; do
        [ -f "$f" ] || continue
        while IFS= read -r line; do
            [[ $line =~ $re ]] && { SRV_PORT=${BASH_REMATCH[1]}; return 0; }
        done <"$f"
    done
    return 1
}
port_in_use() { # PORT [0A]: some TCP socket (in state 0A, LISTEN, if given) has it as local port
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v h=":$(printf '%04X' "$1")" -v st="${2:-}" '
        substr($2, length($2) - 4) == h && (st == "" || $4 == st) { found = 1; exit }
        END { exit !found }'
}
PORTS=${SMTPE_BENCH_PORTS:-28000-28999}
PORT_LO=${PORTS%-*}
PORT_HI=${PORTS#*-}
case $PORT_LO$PORT_HI in ''|*[!0-9]*) echo "run.sh: SMTPE_BENCH_PORTS wants LO-HI" >&2; exit 2 ;; esac
free_port() {
    local i p span=$((PORT_HI - PORT_LO + 1))
    for i in $(seq 1 200); do
        p=$((PORT_LO + (RANDOM * 32768 + RANDOM) % span))
        port_in_use "$p" || { echo "$p"; return 0; }
    done
    return 1
}
json_get() { # VAR KEY JSON: VAR = the value of "KEY" in the flat JSON line ("" if none)
    local re="\"$2\":([^,}]*)"
    if [[ $3 =~ $re ]]; then printf -v "$1" '%s' "${BASH_REMATCH[1]}"; else printf -v "$1" '%s' ""; fi
}

# ---- server start/stop ------------------------------------------------------------------------
SRV_PID=""
SRV_PORT=""
SRV_LOG=""
SRV_REASON=""
# exit_reason FILE...: the line of a start failure's output most likely to say why.
exit_reason() {
    local l
    l=$(cat "$@" 2>/dev/null | grep -v '^[[:space:]]*$' |
        grep -i -m 1 -E 'error|unknown|unrecogni|invalid|illegal|cannot|can.t|no such|not found|not installed|fail|missing|denied|usage|^[^ ]*: no ')
    [ -n "$l" ] || l=$(cat "$@" 2>/dev/null | grep -v '^[[:space:]]*$' | tail -n 1)
    printf '%s' "$l" | sed "s|^$SERVER: |smtpe-server: |"
}
# start_server LOG WAIT-SECONDS FIXED-PORT(or "") CMD...: starts CMD in the background, waits for
# "listening on 127.0.0.1:PORT" on its stderr (or, for a fixed port, that port listening).
start_server() {
    local logf=$1 waits=$2 fixed=$3 i limit line
    shift 3
    SRV_LOG=$logf SRV_PORT="" SRV_REASON=""
    (cd "$WORK" && exec "$@") </dev/null >"$logf.out" 2>"$logf" &
    SRV_PID=$!
    CUR_PIDS=$SRV_PID
    limit=$((waits * 20))
    for ((i = 0; i < limit; i++)); do
        listen_port "$logf" "$logf.out"
        [ -n "$SRV_PORT" ] && [ "$SRV_PORT" != 0 ] && break
        SRV_PORT=""
        if [ -n "$fixed" ] && port_in_use "$fixed" 0A && alive "$SRV_PID"; then
            SRV_PORT=$fixed # listening, no line (yet): good enough
            break
        fi
        if ! alive "$SRV_PID"; then
            wait "$SRV_PID" 2>/dev/null
            line=$(exit_reason "$logf" "$logf.out")
            SRV_REASON="exited at start: ${line:-no message}"
            SRV_PID="" CUR_PIDS=""
            return 1
        fi
        sleep 0.05
    done
    if [ -z "$SRV_PORT" ]; then
        SRV_REASON="no 'listening on' within ${waits}s"
        stop_server
        return 1
    fi
    return 0
}
# stop_server: SIGTERM to the root, up to 6 s to exit, then SIGKILL to the whole tree. Sets
# STOP_NOTE when it had to kill something.
STOP_NOTE=""
stop_server() {
    local pids p i note=""
    STOP_NOTE=""
    [ -n "$SRV_PID" ] || return 0
    tree_stat "$SRV_PID"
    pids=$TREE_PIDS
    [ -n "$pids" ] || pids=$SRV_PID
    CUR_PIDS=$pids
    kill -TERM "$SRV_PID" 2>/dev/null
    for ((i = 0; i < 120; i++)); do
        alive "$SRV_PID" || break
        sleep 0.05
    done
    if alive "$SRV_PID"; then
        note="server still running 6 s after SIGTERM: killed"
        for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    fi
    wait "$SRV_PID" 2>/dev/null
    [ "$pids" != "$SRV_PID" ] && sleep 0.1 # workers get a moment to follow
    for p in $pids; do
        if [ "$p" != "$SRV_PID" ] && alive "$p"; then
            kill -KILL "$p" 2>/dev/null
            note="${note:+$note; }descendant $p left after the server exited: killed"
        fi
    done
    SRV_PID="" CUR_PIDS=""
    STOP_NOTE=$note
}

# ---- the loads --------------------------------------------------------------------------------
# run_loadgen OUTFILE SESSIONS CONCURRENCY: sets LG_JSON (the JSON line, "" on a crash), LG_RC.
LG_RC=0
LG_JSON=""
run_loadgen() {
    local outf=$1 s=$2 c=$3 cap opening=""
    cap=$((120 + s / 20))
    # At 10 000 concurrent, let up to 3000 connect at once (under the 4096 accept backlog of
    # every server here) so that 10 000 sessions really are open at once.
    [ "$c" -ge 10000 ] && opening="--max-opening 3000"
    # Not --quiet: its stderr (a progress line a second, the first failures' reasons) goes to a file.
    # shellcheck disable=SC2086
    timeout -k 5 "$cap" "$LOADGEN" --connect "127.0.0.1:$SRV_PORT" --sessions "$s" \
        --concurrency "$c" --sources 4 --timeout-ms 60000 $opening $LOADGEN_ARGS >"$outf" 2>"$outf.err" &
    CLIENT_PID=$!
    wait "$CLIENT_PID"
    LG_RC=$?
    CLIENT_PID=""
    LG_JSON=$(grep '^{' "$outf" | tail -n 1)
}
# run_smtp_source OUTFILE SESSIONS CONCURRENCY: sets SS_RES to "WALL USER SYS RC".
SS_RES=""
run_smtp_source() {
    local outf=$1 s=$2 c=$3 cap rc
    cap=$((120 + s / 20))
    local TIMEFORMAT='%3R %3U %3S'
    { time timeout -k 5 "$cap" "$SMTP_SOURCE" -s "$c" -m "$s" -l 4096 -r 1 -M bench.test \
          -f sender@bench.test -t rcpt@bench.test "127.0.0.1:$SRV_PORT" >"$outf" 2>&1 &
      CLIENT_PID=$!
      wait "$CLIENT_PID"; } 2>"$outf.time"
    rc=$?
    CLIENT_PID=""
    SS_RES="$(tail -n 1 "$outf.time") $rc"
}
queued_count() { grep -c 'status=queued' "$1" 2>/dev/null || true; }

# sessions for a measured run: enough for TARGET_SECONDS at the warm-up's rate, at least 3 x C.
pick_sessions() { # RATE CONCURRENCY
    awk -v r="$1" -v c="$2" -v t="$TARGET_SECONDS" 'BEGIN {
        r += 0; s = int(r * t); if (s < 3 * c) s = 3 * c; if (s < 2000) s = 2000
        if (s > 400000) s = 400000; print s }'
}

# ---- rows -------------------------------------------------------------------------------------
CSV=$OUT/results.csv
EXTRA=$WORK/extra.tsv     # row index, wall seconds, server CPU seconds, peak concurrency
printf 'server,model,store,concurrency,reply_delay_ms,sessions,failed,sessions_per_s,p50_ms,p95_ms,p99_ms,server_cpu_us_per_session,server_peak_rss_mib,client_cpu_s,note\n' >"$CSV"
: >"$EXTRA"
ROWNO=0
NROWS=0
# A reference rate for durable delivery on the file system of the Maildir rows: files stored as
# the Maildir delivery does (create, write, fsync, rename, fsync new/) by 4 threads (the
# --job-threads default), no SMTP. Measured before and after the matrix: it drifts too.
FSYNC_BIN=$(find_bin smtpe-bench-fsync "$BUILD/tests/bench/smtpe-bench-fsync")
fsync_ref() { # WHEN: prints files/s, or nothing
    local fl v=""
    [ $SMOKE = 0 ] && [ -n "$FSYNC_BIN" ] || return 0
    log "reference rate for durable delivery ($1 the matrix): smtpe-bench-fsync, 4 threads"
    fl=$("$FSYNC_BIN" "$OUT/maildir.fsync-ref" --threads 4 --files 1000 --size 4300 \
        2>>"$OUT/logs/fsync.log" | tail -n 1)
    rm -rf "$OUT/maildir.fsync-ref"
    json_get v files_per_s "$fl"
    printf '%s' "$v"
}
FLOOR_BEFORE=""
[ $SMOKE = 0 ] && FLOOR_BEFORE=$(fsync_ref before)
T_START=$(date +%s)

csv_note() { printf '%s' "$1" | tr ',\n\r"' ';  '"'"; }
emit_row() { # server model store conc delay sessions failed sps p50 p95 p99 cpu rss ccpu note
    local note
    note=$(csv_note "${15}")
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" \
        "$8" "$9" "${10}" "${11}" "${12}" "${13}" "${14}" "$note" >>"$CSV"
}
na_row() { # server model store conc delay reason
    emit_row "$1" "$2" "$3" "$4" "$5" n/a n/a n/a n/a n/a n/a n/a n/a n/a "n/a: $6"
    printf '%s\t%s\t%s\t%s\n' "$ROWNO" "" "" "" >>"$EXTRA"
    log "[$ROWNO/$NROWS] $1 $2 $3 c=$4${5:+ delay=$5}: n/a ($6)"
}

# bench_row KIND SERVER MODEL STORE CONC DELAY SESSIONS(0: pick) WARMUP(0|1)
#   KIND: smtpe | peer | smtp-source
bench_row() {
    local kind=$1 server=$2 model=$3 store=$4 c=$5 delay=$6 s=$7 warm=$8
    local tag md="" port="" json="" wjson="" rate="" wfailed=0 wsessions=0 t0 t1 st0 st1 ticks pids hwm note=""
    local sessions failed sps p50 p95 p99 cpu_us rss ccpu ccpu_u ccpu_s secs="" cpu_s peak="" rc q0 q1
    local -a cmd
    ROWNO=$((ROWNO + 1))
    tag=$(printf '%02d-%s-%s-%s-c%s%s' "$ROWNO" "$server" "$model" "$store" "$c" "${delay:+-d$delay}")
    case $kind in
        smtpe|smtp-source)
            cmd=("$SERVER" --model "$model" --listen 127.0.0.1:0 --max-clients 20000
                 --hostname bench.test --drain-seconds 1)
            case $model in prefork|reuseport) cmd+=(--workers 2) ;; esac
            if [ "$store" = maildir ]; then
                md=$(mktemp -d "$OUT/maildir.XXXXXX") || { na_row "$server" "$model" "$store" "$c" "$delay" "cannot make a maildir"; return; }
                cmd+=(--maildir "$md/Maildir")
            else
                cmd+=(--sink)
            fi
            [ -n "$delay" ] && cmd+=(--reply-delay-ms "$delay")
            start_server "$WORK/$tag.server.log" 10 "" "${cmd[@]}"
            ;;
        peer)
            if [ ! -f "$START_SH" ]; then
                na_row "$server" "$model" "$store" "$c" "$delay" "tests/bench/peers/start.sh missing"
                return
            fi
            port=$(free_port) || { na_row "$server" "$model" "$store" "$c" "$delay" "no free port"; return; }
            start_server "$WORK/$tag.server.log" 60 "$port" bash "$START_SH" "$server" "$port" "$BUILD"
            ;;
    esac
    if [ -z "$SRV_PID" ]; then
        local why=$SRV_REASON
        [ "$server" = null ] && [ -n "$NULL_NOTE" ] && why="$NULL_NOTE; $why"
        cp "$WORK/$tag.server.log" "$OUT/logs/$tag.server.log" 2>/dev/null
        na_row "$server" "$model" "$store" "$c" "$delay" "$why"
        [ -n "$md" ] && rm -rf "$md"
        return
    fi
    t0=$EPOCHREALTIME
    if [ "$NOFILE" -lt $((c + 100)) ]; then
        note="ulimit -n is $NOFILE: too few descriptors for $c sessions"
    fi

    # Warm-up: a short run at this concurrency (up to 3000 sessions), its rate sizes the real one.
    rate=""
    if [ "$warm" = 1 ]; then
        local wn wc
        wn=$((c < 1000 ? 1000 : (c > 3000 ? 3000 : c)))
        wc=$((c < wn ? c : wn))
        if [ "$kind" = smtp-source ]; then
            run_smtp_source "$WORK/$tag.warmup" "$wn" "$wc"
            rate=$(awk -v n="$wn" -v w="${SS_RES%% *}" 'BEGIN { if (w > 0) printf "%.1f", n / w; else print 0 }')
        else
            run_loadgen "$WORK/$tag.warmup.json" "$wn" "$wc"
            wjson=$LG_JSON
            json_get rate sessions_per_s "$wjson"
            json_get wfailed failed "$wjson"
            json_get wsessions sessions "$wjson"
            if [ -z "$wjson" ] || [ "$wfailed" = "$wn" ]; then
                stop_server
                save_logs "$tag"
                [ -n "$md" ] && rm -rf "$md"
                na_row "$server" "$model" "$store" "$c" "$delay" "every warm-up session failed ($(tail -n 1 "$WORK/$tag.warmup.json.err" 2>/dev/null | tr -d '\n'))"
                return
            fi
            [ "$wfailed" != 0 ] && note="${note:+$note; }warm-up: $wfailed of $wn sessions failed"
        fi
    fi
    [ "$s" = 0 ] && s=$(pick_sessions "${rate:-0}" "$c")

    # The measured run.
    tree_stat "$SRV_PID"
    st0=$TREE_TICKS
    q0=$(queued_count "$SRV_LOG")
    if [ "$kind" = smtp-source ]; then
        run_smtp_source "$WORK/$tag.run" "$s" "$c"
        tree_stat "$SRV_PID"
        st1=$TREE_TICKS
        q1=$(queued_count "$SRV_LOG")
        read -r secs ccpu_u ccpu_s rc <<<"$SS_RES"
        sessions=$s
        failed=$((s - (q1 - q0)))
        [ $failed -lt 0 ] && failed=0
        sps=$(awk -v n="$s" -v f="$failed" -v w="$secs" 'BEGIN { if (w > 0) printf "%.1f", (n - f) / w; else print "n/a" }')
        p50=n/a p95=n/a p99=n/a peak=""
        ccpu=$(awk -v u="$ccpu_u" -v s="$ccpu_s" 'BEGIN { printf "%.3f", u + s }')
        [ "$rc" != 0 ] && note="${note:+$note; }smtp-source exit status $rc: $(grep -v '^$' "$WORK/$tag.run" | tail -n 1)"
        note="${note:+$note; }load by smtp-source -s $c -m $s -l 4096 -r 1; sessions/s from wall time; failed = sessions without a queued message in the server log"
    else
        run_loadgen "$WORK/$tag.json" "$s" "$c"
        json=$LG_JSON
        tree_stat "$SRV_PID"
        st1=$TREE_TICKS
        cp "$WORK/$tag.json" "$OUT/logs/$tag.json" 2>/dev/null
        grep -v ' done .* failed .* active ' "$WORK/$tag.json.err" >"$OUT/logs/$tag.loadgen.log" 2>/dev/null
        if [ -z "$json" ]; then
            stop_server
            save_logs "$tag"
            [ -n "$md" ] && rm -rf "$md"
            na_row "$server" "$model" "$store" "$c" "$delay" "smtpe-loadgen gave no result (status $LG_RC: $(tail -n 1 "$WORK/$tag.json.err" 2>/dev/null | tr -d '\n'))"
            return
        fi
        json_get sessions sessions "$json"
        json_get failed failed "$json"
        json_get sps sessions_per_s "$json"
        json_get p50 p50_ms "$json"
        json_get p95 p95_ms "$json"
        json_get p99 p99_ms "$json"
        json_get ccpu client_cpu_s "$json"
        json_get secs seconds "$json"
        json_get peak peak_concurrency "$json"
        [ "$LG_RC" -gt 1 ] && note="${note:+$note; }smtpe-loadgen status $LG_RC"
        if [ "$failed" != 0 ]; then
            local why
            why=$(grep -m 1 'session failed' "$WORK/$tag.json.err" | sed 's/^smtpe-loadgen: //')
            [ -n "$why" ] && note="${note:+$note; }first failure: $why"
        fi
        [ -n "$peak" ] && [ "$peak" -lt "$c" ] 2>/dev/null &&
            note="${note:+$note; }at most $peak sessions open at once"
    fi
    ticks=$((st1 - st0))
    pids=$TREE_PIDS
    # shellcheck disable=SC2086
    hwm=$(tree_hwm_kib $pids)
    read -r cpu_s cpu_us rss < <(awk -v t="$ticks" -v hz="$CLK_TCK" -v n="$sessions" -v k="$hwm" 'BEGIN {
        printf "%.3f %s %.1f\n", t / hz, (n > 0) ? sprintf("%.1f", t * 1e6 / hz / n) : "n/a", k / 1024 }')
    local -a pa
    read -r -a pa <<<"$pids"
    [ ${#pa[@]} -gt 1 ] && note="${note:+$note; }${#pa[@]} server processes"
    stop_server
    [ -n "$STOP_NOTE" ] && note="${note:+$note; }$STOP_NOTE"
    if [ "$kind" != peer ]; then # smtpe-server logs "[TIME ]smtpe[PID]: error ..." lines
        local nerr first re='^([0-9T:.Z-]+ )?smtpe\[[0-9]+\]: error '
        nerr=$(grep -Ec "$re" "$SRV_LOG" 2>/dev/null)
        if [ "${nerr:-0}" -gt 0 ]; then
            first=$(grep -E -m 1 "$re" "$SRV_LOG" | sed -E "s/$re//" | cut -c 1-120)
            note="${note:+$note; }server logged $nerr errors; first: $first"
        fi
    fi
    if [ -n "$md" ]; then
        local got want
        got=$(find "$md/Maildir/new" -type f 2>/dev/null | wc -l)
        want=$(awk -v a="$sessions" -v b="$failed" 'BEGIN { print a - b }')
        if [ "$warm" = 1 ] && [ -n "$wjson" ]; then
            want=$((want + wsessions - wfailed))
        fi
        [ "$got" != "$want" ] && note="${note:+$note; }MAILDIR MISMATCH: $got messages in new/ for $want delivered sessions"
        rm -rf "$md"
    fi
    save_logs "$tag"
    t1=$EPOCHREALTIME
    emit_row "$server" "$model" "$store" "$c" "$delay" "$sessions" "$failed" "$sps" "$p50" "$p95" \
        "$p99" "$cpu_us" "$rss" "$ccpu" "$note"
    printf '%s\t%s\t%s\t%s\n' "$ROWNO" "$secs" "$cpu_s" "$peak" >>"$EXTRA"
    log "$(printf '[%d/%d] %s %s %s c=%s%s: %s sessions/s, p99 %s ms, failed %s/%s, %s us/session, %s MiB, client %s s (row %.1f s)%s' \
        "$ROWNO" "$NROWS" "$server" "$model" "$store" "$c" "${delay:+ delay=${delay}ms}" "$sps" "$p99" \
        "$failed" "$sessions" "$cpu_us" "$rss" "$ccpu" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        "${note:+ [$note]}")"
}
# save_logs TAG: the server log's first and last lines (it has a line per session) into OUT/logs.
save_logs() {
    local f=$WORK/$1.server.log
    [ -f "$f" ] || return 0
    if [ "$(wc -l <"$f")" -gt 60 ]; then
        { head -n 20 "$f"; echo "... ($(wc -l <"$f") lines in all)"; tail -n 20 "$f"; } >"$OUT/logs/$1.server.log"
    else
        cp "$f" "$OUT/logs/$1.server.log"
    fi
    rm -f "$f"
}

# ---- the matrix -------------------------------------------------------------------------------
MODELS="threads epoll prefork reuseport"
PEERS="null smtp-sink aiosmtpd go-smtp"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- . ':!tests/bench/results' 2>/dev/null ||
    commit="$commit (with uncommitted changes)" # the results it is writing do not count
if [ $SMOKE = 1 ]; then
    NROWS=$(( $(wc -w <<<"$MODELS") * 2 + 1 ))
    for m in $MODELS; do
        for st in sink maildir; do bench_row smtpe smtpe-server "$m" "$st" 50 "" 1000 0; done
    done
    bench_row peer null - sink 50 "" 1000 0
else
    NROWS=$(( $(wc -w <<<"$MODELS") * 7 + $(wc -w <<<"$PEERS") * 3 + 1 ))
    for m in $MODELS; do
        for c in 100 1000 10000; do bench_row smtpe smtpe-server "$m" sink "$c" "" 0 1; done
        bench_row smtpe smtpe-server "$m" sink 10000 10 0 1
        for c in 100 1000 10000; do bench_row smtpe smtpe-server "$m" maildir "$c" "" 0 1; done
    done
    for p in $PEERS; do
        for c in 100 1000 10000; do bench_row peer "$p" - sink "$c" "" 0 1; done
    done
    if [ -n "$SMTP_SOURCE" ]; then
        bench_row smtp-source smtpe-server epoll sink 100 "" 0 1
    else
        ROWNO=$((ROWNO + 1))
        na_row smtpe-server epoll sink 100 "" "load by smtp-source: not installed (Debian package postfix)"
    fi
fi
# Side by side: server CPU per session of smtpe epoll (sink), the null responder and smtp-sink at
# 100 concurrent, in alternating runs (three rounds), so that the drift of a shared machine over
# the minutes of the matrix does not decide the comparison. Sets SIDE (lines for results.md).
SIDE=""
cpu_once() { # NAME ROUND: prints the server CPU us/session of a run of 30000 sessions, or nothing
    local name=$1 tag="side-$2-$1" port
    case $name in
        smtpe) start_server "$WORK/$tag.server.log" 10 "" "$SERVER" --listen 127.0.0.1:0 \
                   --max-clients 20000 --hostname bench.test --drain-seconds 1 --sink ;;
        *) port=$(free_port) || return 0
           start_server "$WORK/$tag.server.log" 60 "$port" bash "$START_SH" "$name" "$port" "$BUILD" ;;
    esac
    [ -n "$SRV_PID" ] || return 0
    run_loadgen "$WORK/$tag.warm.json" 2000 100
    tree_stat "$SRV_PID"
    local t0=$TREE_TICKS
    run_loadgen "$WORK/$tag.json" 30000 100
    tree_stat "$SRV_PID"
    local t1=$TREE_TICKS f=""
    json_get f failed "$LG_JSON"
    stop_server
    [ "$f" = 0 ] && awk -v d=$((t1 - t0)) -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", d / hz * 1e6 / 30000 }'
}
median3() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { if (NR == 3) print v[2]; else if (NR > 0) print v[1] }'; }
if [ $SMOKE = 0 ]; then
    declare -A side
    for round in 1 2 3; do
        for name in smtpe null smtp-sink; do
            log "side by side, round $round: $name"
            v=$(cpu_once "$name" "$round")
            [ -n "$v" ] && side[$name]+=" $v"
        done
    done
    m_s=$(median3 ${side[smtpe]:-}) m_n=$(median3 ${side[null]:-}) m_k=$(median3 ${side[smtp-sink]:-})
    SIDE=$(printf '| smtpe-server epoll --sink |%s | %s |\n| null responder |%s | %s |\n| Postfix smtp-sink |%s | %s |\n' \
        "${side[smtpe]:-}" "${m_s:-n/a}" "${side[null]:-}" "${m_n:-n/a}" "${side[smtp-sink]:-}" "${m_k:-n/a}")
    if [ -n "$m_s" ] && [ -n "$m_n" ] && [ -n "$m_k" ]; then
        rounds=$(paste -d' ' <(printf '%s\n' ${side[smtpe]}) <(printf '%s\n' ${side[null]}) |
            awk 'NF == 2 && $2 > 0 { printf "%s%.2f", (n++ ? ", " : ""), $1 / $2 }')
        SIDE+=$(printf '\n\nsmtpe / null responder: **%s** on the medians (round by round: %s); smtpe / smtp-sink: **%s** (medians).' \
            "$(awk -v a="$m_s" -v b="$m_n" 'BEGIN { printf "%.2f", a / b }')" "$rounds" \
            "$(awk -v a="$m_s" -v b="$m_k" 'BEGIN { printf "%.2f", a / b }')")
    fi
fi

FLOOR_AFTER=$(fsync_ref after)
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
T_END=$(date +%s)
ELAPSED=$((T_END - T_START))

# ---- results.md -------------------------------------------------------------------------------
MD=$OUT/results.md
cpu_model=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)
[ -n "$cpu_model" ] || cpu_model=$(uname -m)
mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
os=$(. /etc/os-release 2>/dev/null && printf '%s' "${PRETTY_NAME:-}")
debv=$(cat /etc/debian_version 2>/dev/null || echo "not Debian")
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
ccv=$({ [ -n "$cc" ] && "$cc" --version 2>/dev/null | head -n 1; } || true)
fstype=$(df -PT "$OUT" 2>/dev/null | awk 'NR == 2 { print $2 }')
somax=$(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo "?")

{
    printf '# smtpe benchmark%s\n\n' "$([ $SMOKE = 1 ] && echo ' (smoke run: tiny counts, figures mean nothing)')"
    printf -- '- Date: %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    printf -- '- Command: `%s` (%d s in all)\n' "$CMDLINE" "$ELAPSED"
    printf -- '- Commit: %s\n' "$commit"
    printf -- '- Build: %s, %s, %s; smtpe-server built %s (the commit above is the source tree'"'"'s when the run began)\n' \
        "$BUILD" "${BUILD_TYPE:-unknown build type}" "${ccv:-compiler unknown}" \
        "$(date -u -r "$SERVER" '+%Y-%m-%d %H:%M:%S UTC' 2>/dev/null || echo '?')"
    printf -- '- Machine: %s CPUs (`nproc`), %s, %s RAM\n' "$(nproc)" "$cpu_model" "$mem"
    printf -- '- System: %s (Debian %s), kernel %s\n' "${os:-unknown}" "$debv" "$(uname -r)"
    printf -- '- Load average before / after: %s / %s; `ulimit -n` %s; somaxconn %s; Maildir rows on %s\n' \
        "$LOAD_START" "$LOAD_END" "$NOFILE" "$somax" "${fstype:-unknown}"
    printf '\n'
    printf 'Server and load generator share the machine, on 127.0.0.1. Each row: a fresh server, '
    if [ $SMOKE = 1 ]; then printf 'no warm-up, '; else printf 'a warm-up run, '; fi
    printf 'then `smtpe-loadgen --sources 4 --timeout-ms 60000%s` (a session: banner, EHLO, MAIL, ' "${LOADGEN_ARGS:+ $LOADGEN_ARGS}"
    printf 'one RCPT, DATA with a 4096-octet message, QUIT; latency from connect to the QUIT reply). '
    printf 'Server CPU is user+system time of the server process, its threads and all its '
    printf 'descendants over the measured run (/proc/PID/stat), divided by the sessions run; peak RSS '
    printf 'is the sum of VmHWM over those processes, read just before SIGTERM. `maildir` stores '
    printf 'every message durably (fsync, then 250); `sink` discards it. smtpe-server runs with '
    printf '`--max-clients 20000 --drain-seconds 1`, `--workers 2` for prefork and reuseport.\n\n'
    printf '| server | model | store | concurrency | reply delay ms | sessions | failed | sessions/s | p50 ms | p95 ms | p99 ms | server CPU µs/session | server peak RSS MiB | client CPU s | note |\n'
    printf '|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n'
    awk -F, 'NR > 1 {
        sps = ($8 == "n/a") ? "n/a" : sprintf("%.0f", $8)
        cpu = ($12 == "n/a") ? "n/a" : sprintf("%.1f", $12)
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
            $1, $2, $3, $4, ($5 == "" ? "-" : $5), $6, $7, sps, $9, $10, $11, cpu, $13, $14, $15
    }' "$CSV"
    printf '\n'
    if [ -n "$FLOOR_BEFORE$FLOOR_AFTER" ]; then
        printf 'Reference for the `maildir` rows: this disk stores %s files/s before the matrix and %s ' \
            "${FLOOR_BEFORE:-n/a}" "${FLOOR_AFTER:-n/a}"
        printf 'after it when 4 threads do nothing but what the Maildir delivery does per message '
        printf '(create in tmp/, write 4300 octets, fsync, rename into new/, fsync new/; '
        printf '`smtpe-bench-fsync`, no SMTP). It is what the file system and the disk cost by '
        printf 'themselves, and drifts with the load of a shared machine as the rows do.\n\n'
    fi
    if [ -n "$SIDE" ]; then
        printf '## Side by side: server CPU per session\n\n'
        printf 'The CPU columns above come from runs minutes apart on a shared machine. Here the '
        printf 'same load (30 000 sessions, 100 concurrent, after 2000 to warm up) runs against '
        printf 'the three servers in turn, three rounds, right after the matrix.\n\n'
        printf '| server | CPU µs per session, rounds 1-3 | median |\n|---|---|---:|\n'
        printf '%s\n\n' "$SIDE"
    fi
    printf '![sessions/s and server CPU per session](results.png)\n\n'
    printf '## Against the Ruby study\n\n'
    printf 'The Ruby study (the writing smtpe started from: an SMTP server in Ruby, threads vs fork vs '
    printf 'Ractors vs Fibers; only its best figure is quoted here) ran 10 000 '
    printf 'concurrent clients with a 10 ms delay before each reply; its best figure was prefork + '
    printf 'Fibers. Ours below are the smtpe-server rows of the same setting (`--reply-delay-ms 10`, '
    printf '10 000 concurrent, sink). *sessions/s per server core*: for the study 12 430 / 4, i.e. '
    printf 'assuming its 4 vCPU all busy (it gives no CPU time, so that is a lower bound for it); for '
    printf 'ours sessions/s divided by the cores the server kept busy on average (server CPU seconds '
    printf '/ wall seconds of the measured run, both given). The study had 4 vCPU for the server '
    printf 'alone; here %s CPUs are shared by server and load generator, and the load generator caps ' "$(nproc)"
    printf 'sessions being opened at once (`--max-opening 3000` at 10 000 concurrent unless '
    printf 'SMTPE_BENCH_LOADGEN_ARGS says otherwise), so fewer than 10 000 may be open at once when the '
    printf 'server answers faster than connections open (the column says how many were).\n\n'
    printf '| server | setting | most sessions open at once | sessions/s | p99 | peak RSS | server CPU s / wall s | avg server cores busy | sessions/s per server core |\n'
    printf '|---|---|---:|---:|---:|---:|---:|---:|---:|\n'
    printf '| Ruby study: prefork + Fibers | 10 000 concurrent, 10 ms delay, 4 vCPU | 10 000 | 12 430 | 0.44 s | 317 MB | n/a | 4 (assumed) | 3 108 |\n'
    awk -F'\t' 'NR == FNR { secs[$1] = $2; cpu[$1] = $3; peak[$1] = $4; next }
        FNR > 1 {
            split($0, f, ",")
            row = FNR - 1
            if (f[1] != "smtpe-server" || f[5] != "10") next
            if (f[8] == "n/a" || secs[row] == "") {
                printf "| smtpe-server %s | 10 000 concurrent, 10 ms delay | n/a | n/a | n/a | n/a | n/a | n/a | n/a |\n", f[2]
                next
            }
            busy = (secs[row] > 0) ? cpu[row] / secs[row] : 0
            per = (busy > 0) ? f[8] / busy : 0
            printf "| smtpe-server %s | 10 000 concurrent, 10 ms delay, %d CPUs shared | %s | %.0f | %.3f s | %.1f MiB | %.2f / %.2f | %.2f | %.0f |\n",
                f[2], ncpu, (peak[row] == "" ? "?" : peak[row]), f[8], f[11] / 1000, f[13], cpu[row], secs[row], busy, per
        }' ncpu="$(nproc)" "$EXTRA" "$CSV"
    printf '\nRows failed or n/a carry their reason in the note column; per-row logs (loadgen JSON, '
    printf 'head and tail of the server log) are in logs/.\n'
} >"$MD"

# ---- results.png ------------------------------------------------------------------------------
PNG=$OUT/results.png
PNG_NOTE=""
rm -f "$PNG"
if command -v gnuplot >/dev/null 2>&1; then
    # One line per server configuration: sessions/s then CPU us/session at 100, 1000, 10000 and
    # 10000 with the 10 ms reply delay (NaN where there is no such row or it is n/a).
    awk -F, 'NR > 1 {
        label = ($1 == "smtpe-server") ? $2 " " $3 : $1
        if (index($15, "smtp-source") > 0) label = label " (smtp-source)"
        col = ($5 == "10") ? 4 : ($4 == 100 || $4 == 50) ? 1 : ($4 == 1000) ? 2 : ($4 == 10000) ? 3 : 0
        if (col == 0) next
        if (!(label in seen)) { seen[label] = ++n; name[n] = label }
        i = seen[label]
        sps[i, col] = ($8 == "n/a") ? "NaN" : $8
        cpu[i, col] = ($12 == "n/a") ? "NaN" : $12
    }
    END {
        for (i = 1; i <= n; i++) {
            line = "\"" name[i] "\""
            for (c = 1; c <= 4; c++) line = line " " (((i, c) in sps) ? sps[i, c] : "NaN")
            for (c = 1; c <= 4; c++) line = line " " (((i, c) in cpu) ? cpu[i, c] : "NaN")
            print line
        }
    }' "$CSV" >"$WORK/plot.dat"
    term=pngcairo
    gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 || term=png
    c1=100
    [ $SMOKE = 1 ] && c1=50
    if gnuplot -e "datafile='$WORK/plot.dat'; outfile='$PNG'; termname='$term'; c1='$c1'; subtitle='$(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)'" \
        "$BENCH/plot.gp" >"$OUT/logs/gnuplot.log" 2>&1 && [ -s "$PNG" ]; then
        :
    else
        PNG_NOTE="gnuplot failed (see logs/gnuplot.log)"
        rm -f "$PNG"
    fi
else
    PNG_NOTE="gnuplot is not installed (apt-get install gnuplot-nox): no results.png"
fi
if [ -n "$PNG_NOTE" ]; then
    log "$PNG_NOTE"
    sed -i 's/^!\[sessions\/s and server CPU per session\](results.png)$/(no results.png: '"$(printf '%s' "$PNG_NOTE" | sed 's/[\/&]/\\&/g')"')/' "$MD"
fi

if [ -n "$PNG_NOTE" ]; then log "done in ${ELAPSED}s: $CSV, $MD (no PNG)"; else log "done in ${ELAPSED}s: $CSV, $MD, $PNG"; fi

# ---- smoke checks -----------------------------------------------------------------------------
if [ $SMOKE = 1 ]; then
    fails=0
    check() { # DESCRIPTION CONDITION-STATUS
        if [ "$2" != 0 ]; then log "smoke check FAILED: $1"; fails=$((fails + 1)); fi
    }
    head -n 1 "$CSV" | grep -qx 'server,model,store,concurrency,reply_delay_ms,sessions,failed,sessions_per_s,p50_ms,p95_ms,p99_ms,server_cpu_us_per_session,server_peak_rss_mib,client_cpu_s,note'
    check "results.csv header" $?
    [ "$(($(wc -l <"$CSV") - 1))" = "$NROWS" ]
    check "results.csv has $NROWS rows" $?
    for st in sink maildir; do
        awk -F, -v st="$st" '$1 == "smtpe-server" && $2 == "epoll" && $3 == st && $6 == 1000 { f = 1 } END { exit !f }' "$CSV"
        check "an epoll $st row that ran 1000 sessions" $?
    done
    awk -F, 'NR > 1 && $1 == "smtpe-server" && $8 != "n/a" {
            if ($7 != 0 || !($8 > 0)) { print "run.sh: bad row: " $0 > "/dev/stderr"; bad = 1 }
            if (index($15, "MISMATCH") > 0) { print "run.sh: bad row: " $0 > "/dev/stderr"; bad = 1 }
        } END { exit bad }' "$CSV"
    check "every smtpe row that ran has failed 0, sessions/s > 0 and a full Maildir" $?
    awk -F, 'NR > 1 && $1 != "smtpe-server" && $8 != "n/a" && $7 != 0 {
        print "run.sh: warning: " $1 " row failed sessions: " $0 > "/dev/stderr" }' "$CSV"
    grep -q '^| server | model | store | concurrency |' "$MD"
    check "results.md has the table header" $?
    [ "$(grep -c '^| smtpe-server |' "$MD")" -ge 2 ]
    check "results.md has the smtpe rows" $?
    if command -v gnuplot >/dev/null 2>&1; then
        [ -s "$PNG" ] && [ "$(head -c 4 "$PNG" | od -An -c | tr -d ' ')" = '211PNG' ]
        check "results.png is a PNG" $?
    else
        log "smoke: gnuplot not installed, results.png not checked"
    fi
    if [ $fails -gt 0 ]; then
        log "smoke: $fails check(s) failed; results kept in $OUT"
        exit 1
    fi
    if [ $KEEP_OUT = 0 ]; then
        rm -rf "$OUT"
        log "smoke: ok ($ELAPSED s); $OUT removed (--out DIR keeps the files)"
    else
        log "smoke: ok ($ELAPSED s)"
    fi
fi
exit 0
