#!/usr/bin/env bash
# The Ruby gem's tests (tests/run.sh runs this): builds the extension with gcc, runs every
# bindings/ruby/test/test_*.rb under minitest (warnings on), then again with the extension built
# by clang with AddressSanitizer + UndefinedBehaviorSanitizer (the binding and GC.stress tests:
# the engine's memory and every span copied out), then builds the gem, installs it into a
# temporary GEM_HOME and requires it from a clean process (test_gem.rb), and, given
# SMTPE_BUILD_DIR (a CMake build with smtpe-server and smtpe-loadgen), smokes bench/run.sh.
# Usage: bindings/ruby/test/run.sh   (from anywhere; needs ruby, ruby-dev, ruby-async, minitest)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"

ext=$(test/build_ext.sh)
echo "ruby: extension built in $ext (gcc)"
status=0
for t in test/test_*.rb; do
    echo "==> ruby -w $t"
    ruby -w -I"$ext" -Ilib "$t" || status=1
done

# the same binding tests against an ASan+UBSan build of the extension (clang's runtime preloaded:
# ruby itself is not instrumented; leak checks off, as the interpreter keeps memory at exit;
# heap checks only: Debian's ruby unwinds exceptions by __builtin_longjmp, which ASan does not
# see, so stack poisoning would go stale; SMTPE_ASAN=1 skips the two Ractor cases, whose thread
# exit the preloaded runtime cannot handle)
asan_rt=$(clang -print-file-name=libclang_rt.asan-x86_64.so 2>/dev/null || true)
if [[ -f "$asan_rt" ]]; then
    asan_ext=$(SMTPE_RUBY_EXT_DIR="$here/tmp/ext-asan" CC=clang \
        SMTPE_EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -mllvm -asan-stack=0" \
        SMTPE_EXTRA_LDFLAGS="-fsanitize=address,undefined" test/build_ext.sh)
    # test_hostile.rb: its binding cases only (the others start servers as child processes)
    for t in test/test_server_binding.rb test/test_client_binding.rb \
        "test/test_hostile.rb -n /^TestHostileBinding#/"; do
        echo "==> ASan+UBSan: ruby $t"
        # shellcheck disable=SC2086 # $t is a file and its options
        SMTPE_ASAN=1 LD_PRELOAD="$asan_rt" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            ruby -I"$asan_ext" -Ilib $t || status=1
    done
else
    echo "ruby: no clang ASan runtime; the sanitizer pass is skipped" >&2
    status=1
fi
# the benchmark's plumbing (bench/run.sh --smoke: a few hundred sessions per row, no figures
# kept) when a build of smtpe-server and smtpe-loadgen is given (tests/run.sh gives build/)
if [[ -n "${SMTPE_BUILD_DIR:-}" && -x "$SMTPE_BUILD_DIR/tests/bench/smtpe-loadgen" ]]; then
    echo "==> bench/run.sh --smoke"
    bench/run.sh --smoke --build "$SMTPE_BUILD_DIR" --no-build || status=1
fi
exit "$status"
