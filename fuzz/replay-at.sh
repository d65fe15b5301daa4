#!/usr/bin/env bash
# fuzz/replay-at.sh - replays inputs through a fuzz target built against the engine of another
# git revision: the check that a regression input in fuzz/regress/ really reproduces the bug it
# is named for (it must fail before the fix and pass after it).
#
#   fuzz/replay-at.sh REV TARGET INPUT...
#
# REV is any git revision (e.g. 09ef721^, the code before a fix); TARGET a fuzz/fuzz_*.c name
# (fuzz_session); INPUT files or directories as fuzz/replay.c takes them. The target and
# fuzz/replay.c are today's; engine/ and include/ come from REV (so the revision's API must be
# the one the target uses). Built with ${CC:-cc} -fsanitize=address,undefined when the compiler
# supports it, in a temporary directory that is removed afterwards.
#
# Exit status: the replay's (0 all inputs pass, non-zero an oracle or a sanitizer failed: see
# the "replay: FAILED on" line), 2 for a usage or build error.
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: fuzz/replay-at.sh REV TARGET INPUT..." >&2
    exit 2
fi
REV=$1
TARGET=$2
shift 2
cd "$(dirname "$0")/.."
ROOT=$(pwd)
[ -f "fuzz/$TARGET.c" ] || { echo "fuzz/replay-at.sh: no fuzz/$TARGET.c" >&2; exit 2; }
git rev-parse --verify -q "$REV^{commit}" >/dev/null ||
    { echo "fuzz/replay-at.sh: unknown revision $REV" >&2; exit 2; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
git archive "$REV" engine include | tar -x -C "$TMP"

CC=${CC:-cc}
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=all)
echo 'int main(void) { return 0; }' | "$CC" -x c "${SAN[@]}" - -o "$TMP/probe" 2>/dev/null || SAN=()
"$CC" -g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -fno-omit-frame-pointer "${SAN[@]}" \
    -w -I"$TMP/include" -I"$TMP/engine" -I"$ROOT/fuzz" \
    "$ROOT/fuzz/replay.c" "$ROOT/fuzz/$TARGET.c" "$TMP"/engine/*.c -o "$TMP/replay" ||
    { echo "fuzz/replay-at.sh: $TARGET does not build against $REV" >&2; exit 2; }
echo "== $TARGET against engine/ of $(git rev-parse --short "$REV")"
set +e
"$TMP/replay" "$@"
rc=$?
set -e
exit $rc
