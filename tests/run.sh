#!/usr/bin/env bash
# The test command: installs what is missing (tests/deps.sh), then builds and runs every test in
# three configurations (all but the ctest label "long": tests/run-long.sh runs those), checks
# the packaging, runs the engine's own tests against the amalgamation, then the fuzzers briefly:
#   build/        gcc,   warnings as errors; then tests/packaging/run.sh build (install,
#                 pkg-config, find_package, add_subdirectory/FetchContent, the amalgamation
#                 alone with gcc and clang, smtpe.h as C++)
#   bindings/ruby/test/run.sh  the Ruby gem: minitest under ruby -w, the binding tests again
#                 against an ASan+UBSan build of the extension, gem build + install
#   build-amalgamation/  gcc, the engine built from the amalgamation (SMTPE_TEST_AMALGAMATION):
#                 the unit, transcript and fuzz-regression tests only
#   build-clang/  clang, warnings as errors
#   build-asan/   clang with AddressSanitizer + UndefinedBehaviorSanitizer
#   fuzz/run.sh 20 (when fuzz/run.sh exists)
# Stops at the first failure and exits non-zero. Usage: tests/run.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
JOBS=2
SUMMARY=()
TOTAL_PASSED=0
TOTAL_FAILED=0
START=$SECONDS

summary() {
    echo
    echo "==================== tests/run.sh summary ===================="
    local line
    for line in "${SUMMARY[@]}"; do
        echo "  $line"
    done
}

# run_step NAME COMMAND...: runs one command; on failure prints the summary and exits.
run_step() {
    local name=$1
    shift
    local t0=$SECONDS
    echo
    echo "==> $name"
    if "$@"; then
        SUMMARY+=("PASS  $name ($((SECONDS - t0)) s)")
    else
        local rc=$?
        SUMMARY+=("FAIL  $name (exit $rc)")
        summary
        echo "tests/run.sh: FAILED at: $name"
        exit 1
    fi
}

# configure DIR COMPILER [CMAKE ARGS...]: a fresh cache when the directory was configured with
# another compiler, so that switching compilers never trips CMake.
configure() {
    local dir=$1 compiler=$2
    shift 2
    local want cached
    want=$(readlink -f "$(command -v "$compiler")")
    if [[ -f "$dir/CMakeCache.txt" ]]; then
        cached=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$dir/CMakeCache.txt")
        if [[ -n "$cached" && "$(readlink -f "$cached" 2>/dev/null)" == "$want" ]]; then
            cmake -S "$ROOT" -B "$dir" "$@"
            return
        fi
        rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
    fi
    cmake -S "$ROOT" -B "$dir" -DCMAKE_C_COMPILER="$compiler" "$@"
}

# run_ctest DIR [CTEST ARGS...]: ctest with the output kept for the summary's counts.
run_ctest() {
    local dir=$1 log rc
    shift
    log=$(mktemp)
    set +e
    ctest --test-dir "$dir" --output-on-failure --no-tests=error -LE long "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    local counts
    counts=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\1 \2/p' \
        "$log" | tail -n 1)
    rm -f "$log"
    if [[ -n "$counts" ]]; then
        local failed=${counts% *} total=${counts#* }
        TOTAL_PASSED=$((TOTAL_PASSED + total - failed))
        TOTAL_FAILED=$((TOTAL_FAILED + failed))
    fi
    return "$rc"
}

run_step "dependencies (tests/deps.sh)" bash tests/deps.sh

# RelWithDebInfo also when build/ is the quick start's Release build: the ABI check needs the
# debug information (ctest abi_baseline exists only then)
run_step "gcc: configure" configure build gcc -DSMTPE_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
run_step "gcc: build" cmake --build build -j "$JOBS"
run_step "gcc: ctest" run_ctest build
run_step "packaging (tests/packaging/run.sh)" bash tests/packaging/run.sh build
# needs build/'s smtpe-server and smtpe-send for the client and integration tests
run_step "ruby gem (bindings/ruby/test/run.sh)" env SMTPE_BUILD_DIR="$ROOT/build" \
    bash bindings/ruby/test/run.sh

run_step "amalgamation: configure" configure build-amalgamation gcc -DSMTPE_WERROR=ON \
    -DSMTPE_TEST_AMALGAMATION=ON -DSMTPE_BUILD_SERVER=OFF
run_step "amalgamation: build" cmake --build build-amalgamation -j "$JOBS"
run_step "amalgamation: ctest (unit, transcripts, fuzz regress)" run_ctest build-amalgamation \
    -L '^(unit|transcripts|fuzz)$'

run_step "clang: configure" configure build-clang clang -DSMTPE_WERROR=ON
run_step "clang: build" cmake --build build-clang -j "$JOBS"
run_step "clang: ctest" run_ctest build-clang

export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_step "clang ASan+UBSan: configure" configure build-asan clang -DSMTPE_WERROR=ON \
    -DSMTPE_SANITIZE=ON
run_step "clang ASan+UBSan: build" cmake --build build-asan -j "$JOBS"
run_step "clang ASan+UBSan: ctest" run_ctest build-asan

if [[ -f fuzz/run.sh ]]; then
    run_step "fuzz: fuzz/run.sh 20" env CC=clang bash fuzz/run.sh 20
else
    SUMMARY+=("----  fuzz: no fuzz/run.sh")
fi

summary
echo "  all steps passed in $((SECONDS - START)) s (ctest runs: gcc, amalgamation, clang, ASan+UBSan)"
echo "total: $TOTAL_PASSED passed, $TOTAL_FAILED failed"
