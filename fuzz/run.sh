#!/usr/bin/env bash
# fuzz/run.sh - build and run smtpe's libFuzzer targets.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# SECONDS (default 60) is the time each target runs; TARGET defaults to every fuzz/fuzz_*.c.
# Targets run side by side, as many at a time as there are cores (override with JOBS=n), each
# with the dictionary fuzz/smtp.dict (plus fuzz/TARGET.dict, if there is one) and a working
# corpus fuzz/corpus-work/TARGET/ that starts as a copy of the seeds in fuzz/corpus/TARGET/ (plus,
# for fuzz_session and fuzz_command, every tests/transcripts/*.txt converted by
# fuzz/transcript_seed.c) and keeps what the fuzzer finds between runs.
#
# Binaries, logs and crash inputs go to fuzz/out/ (both directories are gitignored). The script
# exits non-zero if any target found a crash, a timeout, a leak or an oracle violation. Reproduce
# one with
#
#   fuzz/out/TARGET fuzz/out/TARGET-crash-...
#
# and, once it is fixed, keep it as a regression input that ctest replays (the script prints the
# commands for each finding): minimise it with -minimize_crash=1 and copy it to
# fuzz/regress/TARGET/NAME, NAME saying what it reproduces.
#
# It needs nothing but clang with libFuzzer (tests/deps.sh installs it). SMTPE_FUZZ_ENGINE=DIR
# builds the targets against another copy of engine/ (e.g. to try a fix) instead.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
SECONDS_EACH=${1:-60}
shift || true
case $SECONDS_EACH in
*[!0-9]* | "" | 0)
    echo "usage: fuzz/run.sh [SECONDS] [TARGET...]" >&2
    exit 2
    ;;
esac

CC=${CC:-clang}
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "fuzz/run.sh: '$CC' not found: clang with libFuzzer is needed; run tests/deps.sh" >&2
    exit 2
fi

ENGINE=${SMTPE_FUZZ_ENGINE:-engine}
OUT=$ROOT/fuzz/out
WORK=$ROOT/fuzz/corpus-work
mkdir -p "$OUT/obj" "$WORK"

if [ $# -gt 0 ]; then
    TARGETS=("$@")
else
    TARGETS=()
    for f in fuzz/fuzz_*.c; do
        TARGETS+=("$(basename "$f" .c)")
    done
fi

# ---- build ---------------------------------------------------------------------------------
CFLAGS=(-g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -fno-omit-frame-pointer
    -fsanitize=address,undefined -fno-sanitize-recover=all
    -Wall -Wextra -Wno-unused-parameter -Iinclude "-I$ENGINE" -Ifuzz)
echo "== building into fuzz/out/ with $("$CC" --version | head -n1)"
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
    "$CC" -x c -fsanitize=fuzzer - -o "$OUT/obj/probe" 2>/dev/null; then
    echo "fuzz/run.sh: $CC cannot link -fsanitize=fuzzer (libclang-rt missing?); run tests/deps.sh" >&2
    exit 2
fi
OBJS=()
rm -f "$OUT"/obj/*.o
for src in "$ENGINE"/*.c; do
    obj=$OUT/obj/$(basename "$src" .c).o
    "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" &
    OBJS+=("$obj")
done
wait_all() {
    local rc=0 p
    for p in $(jobs -p); do
        wait "$p" || rc=1
    done
    return $rc
}
wait_all || { echo "fuzz/run.sh: the engine does not build" >&2; exit 1; }
for t in "${TARGETS[@]}"; do
    "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer "fuzz/$t.c" "${OBJS[@]}" -o "$OUT/$t" &
done
wait_all || { echo "fuzz/run.sh: a target does not build" >&2; exit 1; }

# ---- seeds from the transcript tests ---------------------------------------------------------
# Every tests/transcripts/*.txt becomes a fuzz_session seed (its settings and client octets) and
# a fuzz_command seed, in the working corpora only.
if compgen -G "tests/transcripts/*.txt" >/dev/null &&
    "$CC" -O1 -std=c11 -D_POSIX_C_SOURCE=200809L fuzz/transcript_seed.c -o "$OUT/transcript_seed"; then
    mkdir -p "$WORK/fuzz_session" "$WORK/fuzz_command"
    count=0
    for f in tests/transcripts/*.txt; do
        name=transcript-$(basename "$f" .txt)
        "$OUT/transcript_seed" session "$f" "$WORK/fuzz_session/$name" &&
            "$OUT/transcript_seed" command "$f" "$WORK/fuzz_command/$name" &&
            count=$((count + 1))
    done
    echo "== seeded fuzz_session and fuzz_command with $count transcripts"
fi

# ---- run -----------------------------------------------------------------------------------
max_len() {
    case $1 in
    fuzz_session) echo 4096 ;;
    fuzz_data) echo 4096 ;;
    fuzz_stuff) echo 4096 ;;
    fuzz_bdat) echo 2048 ;;
    fuzz_reply) echo 2200 ;;
    fuzz_reply_parse) echo 4096 ;;
    fuzz_client) echo 4096 ;;
    fuzz_command) echo 2048 ;;
    *) echo 600 ;;
    esac
}

run_one() {
    local t=$1 log=$OUT/$1.log
    mkdir -p "$WORK/$t"
    if [ -d "fuzz/corpus/$t" ]; then
        cp -n "fuzz/corpus/$t"/* "$WORK/$t"/ 2>/dev/null || true
    fi
    set +e
    # a target's own dictionary fuzz/TARGET.dict, if any, goes with smtp.dict (libFuzzer takes one)
    local dict=fuzz/smtp.dict
    if [ -f "fuzz/$t.dict" ]; then
        dict=$OUT/$t.dict
        cat fuzz/smtp.dict "fuzz/$t.dict" >"$dict"
    fi
    "$OUT/$t" -dict="$dict" -max_len="$(max_len "$t")" -max_total_time="$SECONDS_EACH" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$OUT/$t-" \
        "$WORK/$t" >"$log" 2>&1
    echo $? >"$OUT/$t.rc"
    set -e
}

NJOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
echo "== running ${#TARGETS[@]} targets for ${SECONDS_EACH}s each, $NJOBS at a time"
rm -f "$OUT"/*.rc
for t in "${TARGETS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$NJOBS" ]; do
        sleep 0.5
    done
    echo "   $t"
    run_one "$t" &
done
wait

# ---- report --------------------------------------------------------------------------------
FAILED=0
printf '\n%-14s %12s %9s %8s %8s %7s  %s\n' target execs exec/s cov ft corpus result
for t in "${TARGETS[@]}"; do
    log=$OUT/$t.log
    rc=$(cat "$OUT/$t.rc" 2>/dev/null || echo 99)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n1 || true)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    result=ok
    if [ "$rc" != 0 ]; then
        FAILED=1
        art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n1)
        result="FINDING (exit $rc): ${art:-see $log}"
    fi
    printf '%-14s %12s %9s %8s %8s %7s  %s\n' "$t" "${execs:--}" "${speed:--}" "${cov:--}" \
        "${ft:--}" "${corp:--}" "$result"
done
if [ $FAILED != 0 ]; then
    echo
    echo "Findings: see the logs in fuzz/out/*.log; reproduce with fuzz/out/TARGET CRASHFILE"
    for t in "${TARGETS[@]}"; do
        if [ "$(cat "$OUT/$t.rc" 2>/dev/null || echo 99)" != 0 ]; then
            echo "--- $t"
            grep -E 'oracle violated|condition:|ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|SUMMARY' \
                "$OUT/$t.log" | head -n 8 || true
            art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$OUT/$t.log" | tail -n1)
            art=${art:-fuzz/out/$t-crash-...}
            art=${art#"$ROOT"/}
            cat <<EOF
    After the fix, keep it as a regression input (ctest fuzz_regress_$t replays fuzz/regress/$t/
    in every build; fuzz/README.md, "Findings"):
      fuzz/out/$t -minimize_crash=1 -max_total_time=60 -exact_artifact_path=fuzz/out/$t-min $art
      fuzz/out/$t fuzz/out/$t-min       # fails the same way (before the fix)
      cp fuzz/out/$t-min fuzz/regress/$t/WHAT-IT-REPRODUCES
EOF
        fi
    done
    exit 1
fi
echo
echo "no findings"
