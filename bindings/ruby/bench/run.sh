#!/usr/bin/env bash
# shellcheck disable=SC1091,SC2015,SC2016,SC2034,SC2317 # Markdown backquotes; borrowed functions use and run from globals and traps
# run.sh: the Ruby study redone with smtpe's gem. One server at a time on 127.0.0.1, each row a
# fresh server, a short warm-up, then smtpe-loadgen (4 KB message, one recipient) for about
# --seconds:
#   ruby bindings/ruby/examples/server.rb --model threads|fibers|prefork|ractors (--workers 2 for
#     prefork and ractors) --sink, with --protocol smtpe (the engine, through the gem) and with
#     --protocol ruby (the pure-Ruby baseline parser under the same model);
#   smtpe-server --model threads|epoll|prefork|reuseport (--workers 2 for the last two) --sink;
# every one at 10 000 concurrent sessions with --reply-delay-ms 10 (the study's setting) and at
# 1 000 concurrent without delay. Per row: sessions/s, p50/p99, failed sessions (smtpe-loadgen's
# JSON line), server CPU per session (utime+stime of the server's process tree, /proc/PID/stat),
# peak RSS (sum of VmHWM over the tree), sessions/s per busy server core; per Ruby model the
# smtpe/ruby CPU ratio. A row whose server does not start or dies is "n/a" with the reason and
# the matrix goes on. results.md ends with the goals: server CPU per session <= 0.5 x the
# pure-Ruby baseline on every model, prefork >= the study's 3 108 sessions/s per core, zero
# failed sessions.
#
# The process helpers (server start/stop, /proc accounting, the loadgen run) are those of
# tests/bench/run.sh, the C benchmark: this script defines them from that file's text.
#
#   usage: bindings/ruby/bench/run.sh [--smoke] [--out DIR] [--build DIR] [--no-build]
#                                     [--seconds N] [--models LIST]
#     --out DIR      where the results go (default bindings/ruby/bench/results; with --smoke a
#                    temp dir, removed when every check passed)
#     --build DIR    CMake build dir for smtpe-server and smtpe-loadgen, Release (default
#                    /tmp/build-rbench); the extension is built in DIR/ruby-ext, by
#                    bindings/ruby/test/build_ext.sh where it works
#     --no-build     use what is built already (the binaries in DIR, the extension in
#                    DIR/ruby-ext or bindings/ruby/tmp/ext)
#     --seconds N    aimed duration of a measured run (default 4; at least 3 x concurrency
#                    sessions whatever the rate)
#     --models LIST  comma-separated subset: a model name (both kinds where both have it),
#                    ruby:NAME or c:NAME for one kind, "ruby" or "c" for all of a kind
#                    (default: all; Ruby threads fibers prefork ractors, C threads epoll
#                    prefork reuseport)
#     --smoke        CI check, ~30 s: one Ruby model (threads, or the first Ruby one of
#                    --models) with --protocol smtpe and --protocol ruby, and smtpe-server
#                    epoll, 20 concurrent, 200 sessions, no warm-up; then checks the files;
#                    exit 1 when a check fails
# Environment: SMTPE_RBENCH_RUBY, the Ruby invocation (words; default ruby -I EXT -I LIB as
#   found above); SMTPE_RBENCH_SERVER, the server script (default
#   bindings/ruby/examples/server.rb); SMTPE_RBENCH_PORTS=LO-HI, ports for the Ruby servers
#   (default 29000-29999); SMTPE_BENCH_LOADGEN_ARGS, more smtpe-loadgen options for every run;
#   SMTPE_RBENCH_LOADS, the loads as CONCURRENCY:DELAY-MS words (default "10000:10 1000:",
#   with --smoke "20:"; for trying the script out: other loads are not what results.md describes).
set -u
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd) || exit 2
HERE=$ROOT/bindings/ruby/bench
C_RUN=$ROOT/tests/bench/run.sh
CMDLINE="bindings/ruby/bench/run.sh"
for a in "$@"; do CMDLINE+=" $(printf '%q' "$a")"; done

log() { printf 'bench/run.sh: %s\n' "$*" >&2; }
usage() { sed -n '/^#   usage:/,/^set -u/p' "${BASH_SOURCE[0]}" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }

# ---- the C benchmark's helpers ----------------------------------------------------------------
# borrow NAME...: defines each function NAME as tests/bench/run.sh has it (from its "NAME() {"
# line at the start of a line to the first "}" line, or that one line when it ends in "; }").
borrow() {
    local n src
    [ -r "$C_RUN" ] || { log "$C_RUN missing: its helpers are needed"; exit 2; }
    for n in "$@"; do
        src=$(awk -v n="$n" '
            !p && index($0, n "() {") == 1 { p = 1; print; if ($0 ~ /; }[[:space:]]*$/) exit; next }
            p { print; if ($0 ~ /^}/) exit }' "$C_RUN")
        [ -n "$src" ] && eval "$src" && declare -F "$n" >/dev/null ||
            { log "cannot take $n() from $C_RUN"; exit 2; }
    done
}
borrow abspath cleanup find_bin tree_stat tree_hwm_kib alive listen_port port_in_use free_port \
    json_get exit_reason start_server stop_server run_loadgen pick_sessions save_logs csv_note

SMOKE=0
OUT=
BUILD=
DO_BUILD=1
TARGET_SECONDS=4
MODELS_ARG=
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
        --models) [ $# -ge 2 ] || { usage >&2; exit 2; }; MODELS_ARG=$2; shift ;;
        --models=*) MODELS_ARG=${1#--models=} ;;
        -h|--help) usage; exit 0 ;;
        *) log "unknown argument: $1"; usage >&2; exit 2 ;;
    esac
    shift
done
case $TARGET_SECONDS in ''|*[!0-9]*|0) log "--seconds wants a positive integer"; exit 2 ;; esac

# ---- which models -----------------------------------------------------------------------------
ALL_RB="threads fibers prefork ractors"
ALL_C="threads epoll prefork reuseport"
RB_MODELS=$ALL_RB
C_MODELS=$ALL_C
if [ -n "$MODELS_ARG" ]; then
    RB_MODELS="" C_MODELS=""
    for w in ${MODELS_ARG//,/ }; do
        kind=any name=$w
        case $w in ruby) RB_MODELS+=" $ALL_RB"; continue ;; c) C_MODELS+=" $ALL_C"; continue ;;
            ruby:*) kind=ruby name=${w#ruby:} ;; c:*) kind=c name=${w#c:} ;; esac
        hit=0
        [ "$kind" != c ] && [[ " $ALL_RB " == *" $name "* ]] && { RB_MODELS+=" $name"; hit=1; }
        [ "$kind" != ruby ] && [[ " $ALL_C " == *" $name "* ]] && { C_MODELS+=" $name"; hit=1; }
        [ $hit = 1 ] || { log "--models: no such model: $w (Ruby: $ALL_RB; C: $ALL_C)"; exit 2; }
    done
    RB_MODELS=$(tr ' ' '\n' <<<"$RB_MODELS" | awk 'NF && !s[$0]++' | tr '\n' ' ')
    C_MODELS=$(tr ' ' '\n' <<<"$C_MODELS" | awk 'NF && !s[$0]++' | tr '\n' ' ')
fi
if [ $SMOKE = 1 ]; then
    first=$(awk '{ print $1 }' <<<"$RB_MODELS")
    RB_MODELS=${first:-threads}
    C_MODELS=epoll
fi
WORKERS=2

# ---- output, work dir -------------------------------------------------------------------------
BUILD=$(abspath "${BUILD:-/tmp/build-rbench}")
KEEP_OUT=1
if [ -n "$OUT" ]; then
    OUT=$(abspath "$OUT")
elif [ $SMOKE = 1 ]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/smtpe-rbench-smoke.XXXXXX") || exit 2
    KEEP_OUT=0
else
    OUT=$HERE/results
fi
mkdir -p "$OUT/logs" || exit 2
rm -f "$OUT"/logs/*.log "$OUT"/logs/*.json 2>/dev/null
WORK=$(mktemp -d "${TMPDIR:-/tmp}/smtpe-rbench.XXXXXX") || exit 2
CUR_PIDS=""
CLIENT_PID=""
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

# ---- build: smtpe-server, smtpe-loadgen -------------------------------------------------------
if [ $DO_BUILD = 1 ]; then
    log "configuring and building smtpe-server smtpe-loadgen in $BUILD (Release)"
    { cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release &&
        cmake --build "$BUILD" -j2 --target smtpe-server smtpe-loadgen; } >"$OUT/logs/build.log" 2>&1 ||
        { tail -n 30 "$OUT/logs/build.log" >&2; log "build failed"; exit 2; }
fi
SERVER=$(find_bin smtpe-server "$BUILD/smtpe-server")
LOADGEN=$(find_bin smtpe-loadgen "$BUILD/tests/bench/smtpe-loadgen")
[ -n "$SERVER" ] || { log "no smtpe-server in $BUILD"; exit 2; }
[ -n "$LOADGEN" ] || { log "no smtpe-loadgen in $BUILD"; exit 2; }
BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ "$BUILD_TYPE" = Release ] || log "warning: $BUILD is not a Release build (CMAKE_BUILD_TYPE='$BUILD_TYPE')"

# ---- build: the extension, and the Ruby invocation --------------------------------------------
# RUBY_CMD: what runs server.rb. SMTPE_RBENCH_RUBY wins; else the extension built in
# BUILD/ruby-ext by bindings/ruby/test/build_ext.sh (SMTPE_RUBY_EXT_DIR; it prints the directory,
# or, as it may one day, the -I flags), or by hand the same way (vendor.sh, extconf.rb, make)
# where that script is missing or fails; with --no-build, whichever of BUILD/ruby-ext and
# bindings/ruby/tmp/ext holds a built smtpe/smtpe.so.
SERVER_RB=${SMTPE_RBENCH_SERVER:-$ROOT/bindings/ruby/examples/server.rb}
SERVER_RB=$(abspath "$SERVER_RB")
BUILD_EXT=$ROOT/bindings/ruby/test/build_ext.sh
RB_LIB=$ROOT/bindings/ruby/lib
EXT_DIR=$BUILD/ruby-ext
RUBY_NOTE=""
declare -a RUBY_CMD=()
if [ -n "${SMTPE_RBENCH_RUBY:-}" ]; then
    read -r -a RUBY_CMD <<<"$SMTPE_RBENCH_RUBY"
    RUBY_NOTE="SMTPE_RBENCH_RUBY"
elif [ $DO_BUILD = 1 ]; then
    if [ -f "$BUILD_EXT" ]; then
        log "building the extension in $EXT_DIR: bindings/ruby/test/build_ext.sh"
        if flags=$(SMTPE_RUBY_EXT_DIR=$EXT_DIR bash "$BUILD_EXT" 2>"$OUT/logs/build-ext.log"); then
            flags=$(printf '%s\n' "$flags" | tail -n 1)
            printf 'build_ext.sh printed: %s\n' "$flags" >>"$OUT/logs/build-ext.log"
            if [[ $flags == *-I* ]]; then
                # shellcheck disable=SC2207
                RUBY_CMD=(ruby $(printf '%s\n' "$flags" | grep -o -E -- '-I *[^ ]+' | tr -d ' ') -I "$RB_LIB")
            elif [ -f "$flags/smtpe/smtpe.so" ]; then
                RUBY_CMD=(ruby -I "$flags" -I "$RB_LIB")
            fi
        fi
        if [ ${#RUBY_CMD[@]} -gt 0 ]; then
            RUBY_NOTE="extension built by bindings/ruby/test/build_ext.sh"
        else
            tail -n 20 "$OUT/logs/build-ext.log" >&2
            log "bindings/ruby/test/build_ext.sh failed or printed no directory: building by hand"
        fi
    fi
    if [ ${#RUBY_CMD[@]} = 0 ]; then
        log "building the extension in $EXT_DIR (bindings/ruby/vendor.sh, extconf.rb, make)"
        if (bash "$ROOT/bindings/ruby/vendor.sh" && mkdir -p "$EXT_DIR" && cd "$EXT_DIR" &&
            ruby "$ROOT/bindings/ruby/ext/smtpe/extconf.rb" && make -j2 && mkdir -p smtpe &&
            cp smtpe.so smtpe/) >>"$OUT/logs/build-ext.log" 2>&1; then
            RUBY_CMD=(ruby -I "$EXT_DIR" -I "$RB_LIB")
            RUBY_NOTE="extension built in $EXT_DIR by hand"
        else
            tail -n 20 "$OUT/logs/build-ext.log" >&2
            RUBY_NOTE="the extension did not build (see logs/build-ext.log)"
            log "$RUBY_NOTE"
        fi
    fi
else
    for d in "$EXT_DIR" "$ROOT/bindings/ruby/tmp/ext"; do
        if [ -f "$d/smtpe/smtpe.so" ]; then
            RUBY_CMD=(ruby -I "$d" -I "$RB_LIB")
            RUBY_NOTE="--no-build: extension in $d"
            break
        fi
    done
    [ ${#RUBY_CMD[@]} -gt 0 ] || RUBY_NOTE="--no-build and no built extension in $EXT_DIR or bindings/ruby/tmp/ext"
fi
RUBY_SHOWN=$(printf '%s ' "${RUBY_CMD[@]}" | sed "s|$ROOT/||g; s| $||")
log "Ruby servers: ${RUBY_SHOWN:-none} ${SERVER_RB#"$ROOT"/} ($RUBY_NOTE)"

# ---- limits -----------------------------------------------------------------------------------
# 10 000 sessions: the server holds 10 000 descriptors and so does the load generator. As root,
# lift the hard limit first; otherwise take what the hard limit allows.
[ "$(id -u)" = 0 ] && ulimit -Hn "$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)" 2>/dev/null
HARD_NOFILE=$(ulimit -Hn)
[ "$HARD_NOFILE" = unlimited ] && HARD_NOFILE=1048576
ulimit -n "$HARD_NOFILE" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
NOFILE=$(ulimit -n)
CLK_TCK=$(getconf CLK_TCK)
LOADGEN_ARGS=${SMTPE_BENCH_LOADGEN_ARGS:-}
PORTS=${SMTPE_RBENCH_PORTS:-29000-29999}
PORT_LO=${PORTS%-*}
PORT_HI=${PORTS#*-}
case $PORT_LO$PORT_HI in ''|*[!0-9]*) log "SMTPE_RBENCH_PORTS wants LO-HI"; exit 2 ;; esac

# ---- rows -------------------------------------------------------------------------------------
CSV=$OUT/results.csv
CSV_HEAD='server,model,workers,protocol,concurrency,reply_delay_ms,sessions,failed,sessions_per_s,p50_ms,p95_ms,p99_ms,server_cpu_us_per_session,server_cpu_s,wall_s,server_peak_rss_mib,peak_concurrency,client_cpu_s,note'
printf '%s\n' "$CSV_HEAD" >"$CSV"
ROWNO=0
NROWS=0
SRV_PID=""

emit() { # the 19 fields of CSV_HEAD, the last one (note) made CSV-safe
    local -a f=("$@")
    f[18]=$(csv_note "${f[18]}")
    (IFS=,; printf '%s\n' "${f[*]}") >>"$CSV"
}
na() { # server model workers protocol conc delay reason
    emit "$1" "$2" "$3" "$4" "$5" "$6" n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a "n/a: $7"
    log "[$ROWNO/$NROWS] $1 $2 $4 c=$5${6:+ delay=$6}: n/a ($7)"
}
# server_errors LOG SERVER: a note on the error lines of a server's stderr ("" if none).
server_errors() {
    local re n first
    if [ "$2" = smtpe-server ]; then re='^smtpe\[[0-9]*\]: error '; else re='(Error|Exception)\b|\berror\b|Traceback'; fi
    n=$(grep -c -E "$re" "$1" 2>/dev/null)
    [ "${n:-0}" -gt 0 ] || return 0
    first=$(grep -m 1 -E "$re" "$1" | sed "s|$ROOT/||g" | cut -c 1-160)
    printf 'server logged %s error lines; first: %s' "$n" "$first"
}
# died REASON-PREFIX: the server is gone; SRV_REASON = why, from its output.
died() {
    local line
    wait "$SRV_PID" 2>/dev/null
    line=$(exit_reason "$SRV_LOG" "$SRV_LOG.out" | sed "s|$ROOT/||g")
    SRV_REASON="$1: ${line:-no message}"
    SRV_PID="" CUR_PIDS=""
}

# row SERVER MODEL PROTOCOL CONC DELAY SESSIONS(0: pick) WARMUP(0|1)
#   SERVER: ruby (server.rb, PROTOCOL smtpe|ruby) or smtpe-server (PROTOCOL -)
row() {
    local server=$1 model=$2 proto=$3 c=$4 delay=$5 s=$6 warm=$7
    local workers=- tag port note="" json wjson rate="" wfailed=0 st0 st1 hwm pids t0 t1 why
    local sessions failed sps p50 p95 p99 ccpu secs peak cpu_s cpu_us rss
    local -a cmd pa
    ROWNO=$((ROWNO + 1))
    case $model in prefork|ractors|reuseport) workers=$WORKERS ;; esac
    tag=$(printf '%02d-%s-%s%s-c%s%s' "$ROWNO" "${server%%-*}" "$model" "$([ "$proto" != - ] && echo "-$proto")" "$c" "${delay:+-d$delay}")
    t0=$EPOCHREALTIME
    if [ "$server" = ruby ]; then
        [ -f "$SERVER_RB" ] || { na "$server" "$model" "$workers" "$proto" "$c" "$delay" "${SERVER_RB#"$ROOT"/} missing"; return; }
        [ ${#RUBY_CMD[@]} -gt 0 ] || { na "$server" "$model" "$workers" "$proto" "$c" "$delay" "$RUBY_NOTE"; return; }
        port=$(free_port) || { na "$server" "$model" "$workers" "$proto" "$c" "$delay" "no free port in $PORTS"; return; }
        cmd=("${RUBY_CMD[@]}" "$SERVER_RB" --model "$model")
        [ "$workers" != - ] && cmd+=(--workers "$workers")
        cmd+=(--listen "127.0.0.1:$port" --sink)
        [ -n "$delay" ] && cmd+=(--reply-delay-ms "$delay")
        cmd+=(--protocol "$proto")
        start_server "$WORK/$tag.server.log" 30 "$port" "${cmd[@]}"
    else
        cmd=("$SERVER" --model "$model" --listen 127.0.0.1:0 --max-clients 20000 --hostname bench.test
             --drain-seconds 1 --sink)
        [ "$workers" != - ] && cmd+=(--workers "$workers")
        [ -n "$delay" ] && cmd+=(--reply-delay-ms "$delay")
        start_server "$WORK/$tag.server.log" 10 "" "${cmd[@]}"
    fi
    if [ -z "$SRV_PID" ]; then
        save_logs "$tag"
        na "$server" "$model" "$workers" "$proto" "$c" "$delay" "$SRV_REASON"
        return
    fi
    [ "$NOFILE" -lt $((c + 100)) ] && note="ulimit -n is $NOFILE: too few descriptors for $c sessions"

    # Warm-up: up to 3000 sessions at this concurrency (capped to them); its rate sizes the run.
    if [ "$warm" = 1 ]; then
        local wn wc
        wn=$((c < 1000 ? 1000 : (c > 3000 ? 3000 : c)))
        wc=$((c < wn ? c : wn))
        run_loadgen "$WORK/$tag.warmup.json" "$wn" "$wc"
        wjson=$LG_JSON
        json_get rate sessions_per_s "$wjson"
        json_get wfailed failed "$wjson"
        if ! alive "$SRV_PID"; then
            died "server exited during the warm-up"
            save_logs "$tag"
            na "$server" "$model" "$workers" "$proto" "$c" "$delay" "$SRV_REASON"
            return
        fi
        if [ -z "$wjson" ] || [ "$wfailed" = "$wn" ]; then
            why=$(grep -m 1 'session failed' "$WORK/$tag.warmup.json.err" 2>/dev/null | sed 's/^smtpe-loadgen: //')
            stop_server
            save_logs "$tag"
            na "$server" "$model" "$workers" "$proto" "$c" "$delay" "every warm-up session failed (${why:-$(tail -n 1 "$WORK/$tag.warmup.json.err" 2>/dev/null)})"
            return
        fi
        [ "$wfailed" != 0 ] && note="${note:+$note; }warm-up: $wfailed of $wn sessions failed"
    fi
    [ "$s" = 0 ] && s=$(pick_sessions "${rate:-0}" "$c")

    # The measured run.
    tree_stat "$SRV_PID"
    st0=$TREE_TICKS
    run_loadgen "$WORK/$tag.json" "$s" "$c"
    json=$LG_JSON
    cp "$WORK/$tag.json" "$OUT/logs/$tag.json" 2>/dev/null
    grep -v ' done .* failed .* active ' "$WORK/$tag.json.err" >"$OUT/logs/$tag.loadgen.log" 2>/dev/null
    json_get failed failed "$json"
    if ! alive "$SRV_PID"; then
        died "server exited during the run${failed:+ ($failed of $s sessions failed)}"
        save_logs "$tag"
        na "$server" "$model" "$workers" "$proto" "$c" "$delay" "$SRV_REASON"
        return
    fi
    tree_stat "$SRV_PID"
    st1=$TREE_TICKS
    pids=$TREE_PIDS
    # shellcheck disable=SC2086
    hwm=$(tree_hwm_kib $pids)
    if [ -z "$json" ]; then
        stop_server
        save_logs "$tag"
        na "$server" "$model" "$workers" "$proto" "$c" "$delay" "smtpe-loadgen gave no result (status $LG_RC: $(tail -n 1 "$WORK/$tag.json.err" 2>/dev/null | tr -d '\n'))"
        return
    fi
    json_get sessions sessions "$json"
    json_get sps sessions_per_s "$json"
    json_get p50 p50_ms "$json"
    json_get p95 p95_ms "$json"
    json_get p99 p99_ms "$json"
    json_get ccpu client_cpu_s "$json"
    json_get secs seconds "$json"
    json_get peak peak_concurrency "$json"
    [ "$LG_RC" -gt 1 ] && note="${note:+$note; }smtpe-loadgen status $LG_RC"
    if [ "$failed" != 0 ]; then
        why=$(grep -m 1 'session failed' "$WORK/$tag.json.err" | sed 's/^smtpe-loadgen: //')
        [ -n "$why" ] && note="${note:+$note; }first failure: $why"
    fi
    read -r cpu_s cpu_us rss < <(awk -v t="$((st1 - st0))" -v hz="$CLK_TCK" -v n="$sessions" -v k="$hwm" 'BEGIN {
        printf "%.3f %s %.1f\n", t / hz, (n > 0) ? sprintf("%.1f", t * 1e6 / hz / n) : "n/a", k / 1024 }')
    read -r -a pa <<<"$pids"
    [ ${#pa[@]} -gt 1 ] && note="${note:+$note; }${#pa[@]} server processes"
    stop_server
    [ -n "$STOP_NOTE" ] && note="${note:+$note; }$STOP_NOTE"
    why=$(server_errors "$SRV_LOG" "$server")
    [ -n "$why" ] && note="${note:+$note; }$why"
    save_logs "$tag"
    t1=$EPOCHREALTIME
    emit "$server" "$model" "$workers" "$proto" "$c" "$delay" "$sessions" "$failed" "$sps" "$p50" "$p95" \
        "$p99" "$cpu_us" "$cpu_s" "$secs" "$rss" "$peak" "$ccpu" "$note"
    log "$(printf '[%d/%d] %s %s %s c=%s%s: %s sessions/s, p99 %s ms, failed %s/%s, %s us/session, %s MiB (row %.1f s)%s' \
        "$ROWNO" "$NROWS" "$server" "$model" "$proto" "$c" "${delay:+ delay=${delay}ms}" "$sps" "$p99" \
        "$failed" "$sessions" "$cpu_us" "$rss" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        "${note:+ [$note]}")"
}

# ---- the matrix -------------------------------------------------------------------------------
# Model by model, each load with smtpe then the baseline right after it: the ratio compares runs
# seconds apart, not minutes, on a shared machine.
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$ROOT" status --porcelain -- . ':!bindings/ruby/bench/results' 2>/dev/null | head -n 1)" ] &&
    commit="$commit (with uncommitted changes in the tree)"
T_START=$(date +%s)
n_rb=$(wc -w <<<"$RB_MODELS")
n_c=$(wc -w <<<"$C_MODELS")
if [ $SMOKE = 1 ]; then
    LOADS=${SMTPE_RBENCH_LOADS:-20:}
    SESS=200 WARM=0
else
    LOADS=${SMTPE_RBENCH_LOADS:-10000:10 1000:}
    SESS=0 WARM=1
fi
NROWS=$(((n_rb * 2 + n_c) * $(wc -w <<<"$LOADS")))
for m in $RB_MODELS; do
    for ld in $LOADS; do
        for p in smtpe ruby; do row ruby "$m" "$p" "${ld%%:*}" "${ld#*:}" "$SESS" "$WARM"; done
    done
done
for m in $C_MODELS; do
    for ld in $LOADS; do row smtpe-server "$m" - "${ld%%:*}" "${ld#*:}" "$SESS" "$WARM"; done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
ELAPSED=$(($(date +%s) - T_START))

# ---- results.md, results.png ------------------------------------------------------------------
MD=$OUT/results.md
PNG=$OUT/results.png
cpu_model=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)
os=$(. /etc/os-release 2>/dev/null && printf '%s' "${PRETTY_NAME:-}")
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
{
    printf '# smtpe Ruby benchmark: the gem against the pure-Ruby baseline%s\n\n' \
        "$([ $SMOKE = 1 ] && echo ' (smoke run: tiny counts, figures mean nothing)')"
    printf -- '- Date: %s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    printf -- '- Command: `%s` (%d s of rows)\n' "$CMDLINE" "$ELAPSED"
    printf -- '- Commit: %s\n' "$commit"
    printf -- '- Ruby: %s; servers run as `%s %s ...` (%s)\n' "$(ruby -e 'print RUBY_DESCRIPTION' 2>/dev/null || echo '?')" \
        "${RUBY_SHOWN:-?}" "${SERVER_RB#"$ROOT"/}" "$RUBY_NOTE"
    printf -- '- smtpe-server and smtpe-loadgen: %s, %s, %s\n' "$BUILD" "${BUILD_TYPE:-unknown build type}" \
        "$({ [ -n "$cc" ] && "$cc" --version 2>/dev/null | head -n 1; } || echo 'compiler unknown')"
    printf -- '- Machine: %s CPUs (`nproc`), %s, %s RAM; %s, kernel %s\n' "$(nproc)" "${cpu_model:-$(uname -m)}" \
        "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)" "${os:-unknown OS}" "$(uname -r)"
    printf -- '- Load average before / after: %s / %s; `ulimit -n` %s; somaxconn %s\n\n' "$LOAD_START" "$LOAD_END" \
        "$NOFILE" "$(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo '?')"
    printf 'Server and load generator share the machine, on 127.0.0.1. Each row: a fresh server, '
    if [ $SMOKE = 1 ]; then printf 'no warm-up, '; else printf 'a warm-up run (up to 3000 sessions), '; fi
    printf 'then `smtpe-loadgen --sources 4 --timeout-ms 60000%s%s` (a session: banner, EHLO, MAIL, ' \
        "$([ $SMOKE = 0 ] && echo ' --max-opening 3000 (at 10 000 concurrent)')" "${LOADGEN_ARGS:+ $LOADGEN_ARGS}"
    printf 'one RCPT, DATA with a 4096-octet message, QUIT; latency from connect to the QUIT reply). '
    printf 'Every server discards the message (`--sink`). Ruby rows: `server.rb --model M --listen '
    printf '127.0.0.1:PORT --sink --protocol smtpe|ruby`, `--workers %s` for prefork and ractors; ' "$WORKERS"
    printf '`smtpe` is the engine through the gem, `ruby` the pure-Ruby baseline parser '
    printf '(bindings/ruby/baseline) under the same model. C rows: `smtpe-server --model M --sink '
    printf -- '--max-clients 20000 --drain-seconds 1`, `--workers %s` for prefork and reuseport. ' "$WORKERS"
    printf 'Server CPU is user+system time of the server process, its threads and all its '
    printf 'descendants over the measured run (/proc/PID/stat), divided by the sessions run; '
    printf '*per busy core* is sessions/s divided by server CPU seconds per wall second. Peak RSS '
    printf 'is the sum of VmHWM over those processes, read just before SIGTERM (forked workers '
    printf 'count the pages they share with their parent again).\n\n'
    ruby "$HERE/table.rb" "$CSV" --plot-data "$WORK/plot.dat"
    printf '\n![sessions/s, server CPU per session, peak RSS](results.png)\n\n'
    printf 'Rows n/a carry their reason in the note column; per-row logs (loadgen JSON and '
    printf 'failures, head and tail of the server log) are in logs/.\n'
} >"$MD" 2>"$OUT/logs/table.log" || { cat "$OUT/logs/table.log" >&2; log "results.md: table.rb failed"; }

PNG_NOTE=""
rm -f "$PNG"
if ! command -v gnuplot >/dev/null 2>&1; then
    PNG_NOTE="gnuplot is not installed (apt-get install gnuplot-nox)"
elif [ ! -s "$WORK/plot.dat" ]; then
    PNG_NOTE="no rows to plot"
else
    term=pngcairo
    gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 || term=png
    # the first load without a delay, the first with one (table.rb --plot-data takes the same)
    c1=- c2=- d2=-
    for ld in $LOADS; do
        if [ -z "${ld#*:}" ]; then [ "$c1" = - ] && c1=${ld%%:*}; else [ "$c2" = - ] && c2=${ld%%:*} d2=${ld#*:}; fi
    done
    gnuplot -e "datafile='$WORK/plot.dat'; outfile='$PNG'; termname='$term'; c1='$c1'; c2='$c2'; d2='$d2'; subtitle='$(nproc) CPUs, $(date -u +%Y-%m-%d), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)'" \
        "$HERE/plot.gp" >"$OUT/logs/gnuplot.log" 2>&1 && [ -s "$PNG" ] ||
        { PNG_NOTE="gnuplot failed (see logs/gnuplot.log)"; rm -f "$PNG"; }
fi
if [ -n "$PNG_NOTE" ]; then
    log "$PNG_NOTE: no results.png"
    sed -i "s|^!\[sessions/s, server CPU per session, peak RSS\](results.png)\$|(no results.png: ${PNG_NOTE//|/ })|" "$MD"
fi
log "done: $CSV, $MD${PNG_NOTE:+ (no PNG)}${PNG_NOTE:-, $PNG}"

# ---- smoke checks -----------------------------------------------------------------------------
if [ $SMOKE = 1 ]; then
    fails=0
    check() { [ "$2" = 0 ] || { log "smoke check FAILED: $1"; fails=$((fails + 1)); }; }
    [ "$(head -n 1 "$CSV")" = "$CSV_HEAD" ]
    check "results.csv header" $?
    [ "$(($(wc -l <"$CSV") - 1))" = "$NROWS" ]
    check "results.csv has $NROWS rows" $?
    for p in smtpe ruby; do
        awk -F, -v p="$p" '$1 == "ruby" && $4 == p && $7 == 200 && $8 == 0 && $9 > 0 { f = 1 } END { exit !f }' "$CSV"
        check "a Ruby --protocol $p row that ran 200 sessions, none failed" $?
    done
    awk -F, '$1 == "smtpe-server" && $7 == 200 && $8 == 0 && $9 > 0 { f = 1 } END { exit !f }' "$CSV"
    check "the smtpe-server row ran 200 sessions, none failed" $?
    grep -q '^| server | model | protocol |' "$MD"
    check "results.md has the table" $?
    grep -q '^## Goals' "$MD"
    check "results.md has the goals" $?
    if command -v gnuplot >/dev/null 2>&1; then
        [ -s "$PNG" ] && [ "$(head -c 4 "$PNG" | od -An -c | tr -d ' ')" = '211PNG' ]
        check "results.png is a PNG" $?
    fi
    if [ $fails -gt 0 ]; then
        sed -n '2,$p' "$CSV" >&2
        log "smoke: $fails check(s) failed; results kept in $OUT"
        exit 1
    fi
    if [ $KEEP_OUT = 0 ]; then
        rm -rf "$OUT"
        log "smoke: ok ($ELAPSED s of rows); $OUT removed (--out DIR keeps the files)"
    else
        log "smoke: ok ($ELAPSED s of rows)"
    fi
fi
exit 0
