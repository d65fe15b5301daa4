#!/bin/sh
# check.sh - compares the ABI of a built libsmtpe.so with the committed baseline, using
# libabigail's abidw and abidiff (Debian: abigail-tools), and fails on any difference: an ABI
# change, even a compatible one (a new function, a field added at the end of a versioned
# struct), is announced by committing a new baseline in the same commit as the change, with the
# reason in the commit message. The baseline, tests/abi/libsmtpe.abi, is abidw's description of
# the library's exported functions (with their symbol versions) and of every type they reach.
# abidiff is told which types are public (--headers-dir2 include/): a change inside struct
# smtpe_server, opaque in smtpe.h, is not an ABI change, while one to a struct the caller
# allocates (smtpe_server_config, smtpe_event, smtpe_server_stats) is, even a field appended.
# (The baseline keeps its source locations: without them abidiff 2.2 cannot tell that a type
# is public and files such changes among the private ones.)
#
#   tests/abi/check.sh LIB                 compare LIB (e.g. build/libsmtpe.so) with the baseline
#   tests/abi/check.sh --update LIB        write LIB's ABI as the new baseline
#
# LIB must carry DWARF debug information (the default RelWithDebInfo build does; a Release
# build does not). Exit 0: same ABI (or baseline written); 1: the ABI differs (abidiff's report
# is printed); 2: usage, or a tool or file is missing, or abidiff failed.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
baseline=$here/libsmtpe.abi
headers=$top/include

update=0
if [ "${1:-}" = "--update" ]; then
    update=1
    shift
fi
if [ $# -ne 1 ]; then
    echo "usage: $0 [--update] LIB" >&2
    exit 2
fi
lib=$1
for tool in abidw abidiff; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "check.sh: $tool not found (Debian: apt-get install abigail-tools)" >&2
        exit 2
    fi
done
if [ ! -f "$lib" ]; then
    echo "check.sh: no library at $lib" >&2
    exit 2
fi

if [ "$update" = 1 ]; then
    abidw --headers-dir "$headers" --no-corpus-path --out-file "$baseline" "$lib"
    echo "check.sh: wrote $baseline from $lib; commit it with the ABI change and say why"
    exit 0
fi
if [ ! -f "$baseline" ]; then
    echo "check.sh: no baseline $baseline (write one with --update)" >&2
    exit 2
fi
set +e
report=$(abidiff --no-show-locs --headers-dir2 "$headers" "$baseline" "$lib" 2>&1)
rc=$?
set -e
if [ "$rc" -eq 0 ]; then
    echo "check.sh: $lib has the ABI of tests/abi/libsmtpe.abi"
    exit 0
fi
# abidiff's status is a bit field: 1 error, 2 usage, 4 ABI change, 8 incompatible ABI change
echo "check.sh: $lib differs from tests/abi/libsmtpe.abi (abidiff exit $rc):"
echo "$report"
if [ $((rc & 3)) -ne 0 ]; then
    exit 2
fi
if [ $((rc & 8)) -ne 0 ]; then
    echo "check.sh: an INCOMPATIBLE change: within ABI 1 (libsmtpe.so.1) only additions are allowed"
fi
echo "check.sh: if the change is meant, run 'tests/abi/check.sh --update $lib' and commit the"
echo "          new baseline with the change, saying in the commit message why the ABI changed"
exit 1
