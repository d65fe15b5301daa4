#!/usr/bin/env bash
# The long tests: what tests/run.sh leaves out because it takes minutes or moves gigabytes.
# Installs what is missing (tests/deps.sh), builds build/ (gcc) and build-asan/ (clang
# ASan+UBSan) as tests/run.sh does (an existing build/ is reused as it is configured), then runs
#   ctest -L long in build/        the integration suites under valgrind memcheck, a 1 GB message
#                                  over the size limit, the hostile suite under the reuseport and
#                                  threads models, the failing-allocator sweep under those models
#                                  and (every third allocation) under valgrind
#   ctest -L long in build-asan/   the same long tests that make sense under the sanitizers
#   fuzz/run.sh $FUZZ_SECONDS      every fuzz target, $FUZZ_SECONDS each (default 600)
# Stops at the first failure and exits non-zero. Usage: tests/run-long.sh
# `ctest --test-dir build -L long -N` lists the long tests.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-600}
START=$SECONDS

step() {
    echo
    echo "==> $*"
    "$@"
}

step bash tests/deps.sh
# configure DIR COMPILER ARGS...: keeps an existing cache (naming the compiler again would make
# CMake throw the cache away and rebuild everything).
configure() {
    local dir=$1 compiler=$2
    shift 2
    if [[ -f "$dir/CMakeCache.txt" ]]; then
        cmake -S . -B "$dir" "$@"
    else
        cmake -S . -B "$dir" -DCMAKE_C_COMPILER="$compiler" "$@"
    fi
}

step configure build gcc -DSMTPE_WERROR=ON
step cmake --build build -j 2
step ctest --test-dir build --output-on-failure --no-tests=error -L long

export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
step configure build-asan clang -DSMTPE_WERROR=ON -DSMTPE_SANITIZE=ON
step cmake --build build-asan -j 2
# Some long tests (valgrind) exist only in non-sanitizer builds: none here is not an error.
step ctest --test-dir build-asan --output-on-failure --no-tests=ignore -L long

step env CC=clang bash fuzz/run.sh "$FUZZ_SECONDS"

echo
echo "tests/run-long.sh: all long tests passed in $((SECONDS - START)) s"
