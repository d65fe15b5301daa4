#!/usr/bin/env bash
# tests/packaging/run.sh BUILD - proves every way an embedder gets smtpe, from a build
# directory BUILD that has been built (tests/run.sh: build/, gcc). In a temporary directory:
#   install     cmake --install BUILD --prefix TMP/prefix: exactly the expected files, and
#               the installed libsmtpe.so exports the API and nothing else (check_symbols.sh)
#   pkg-config  consumer.c built with `pkg-config --cflags --libs smtpe` (shared, run with
#               LD_LIBRARY_PATH) and with --static (linked -static: no libsmtpe.so needed)
#   find_package  tests/packaging/find_package: consumer.c linked to smtpe::smtpe and to
#               smtpe::smtpe_static from the installed CMake package
#   subproject  tests/packaging/subproject by add_subdirectory and by FetchContent: the
#               library only (no smtpe-server, no tests), and its install holds the parent's
#               program only (with -DSMTPE_INSTALL=ON: and smtpe's library files)
#   amalgamation  `cmake --build BUILD --target amalgamation`; smtpe.c compiles alone with gcc
#               and clang (-std=c11 -Wall -Wextra -pedantic -Werror, -O0 and -O2, no define, no
#               include path) and defines only the API (nm); consumer.c + smtpe.c + smtpe.h
#               alone in a directory build and run with each
#   c++         smtpe.h compiles as C++11, 17 and 20 with g++ and clang++ (those installed),
#               -Wall -Wextra -pedantic -Werror (tests/packaging/header.cpp)
# Each consumer runs one SMTP session in memory and exits 0 when the replies are right.
# Stops at the first failure. KEEP=1 keeps the temporary directory. The engine's unit and
# transcript tests against the amalgamation are a separate step of tests/run.sh (a build with
# -DSMTPE_TEST_AMALGAMATION=ON). Usage: tests/packaging/run.sh BUILD
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 BUILD" >&2
    exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=$(cd "$1" && pwd)
CC=${CC:-cc}
JOBS=${JOBS:-2}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/smtpe-packaging.XXXXXX")
if [[ "${KEEP:-0}" == 1 ]]; then
    echo "packaging: keeping $TMP"
else
    trap 'rm -rf "$TMP"' EXIT
fi
CFLAGS_STRICT=(-std=c11 -Wall -Wextra -pedantic -Werror)
# The consumer projects are configured with the compiler BUILD uses.
BUILD_CC=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
CMAKE_GEN_ARGS=(-DCMAKE_C_COMPILER="${BUILD_CC:-$CC}")

step() {
    echo
    echo "--- packaging: $*"
}

fail() {
    echo "packaging: FAILED: $*" >&2
    exit 1
}

# needed BINARY: the NEEDED entries of an ELF file, one a line (none for a static executable).
needed() {
    readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p'
}

# needs BINARY LIB: BINARY has LIB among its NEEDED entries.
needs() {
    local list
    list=$(needed "$1")
    grep -qx "$2" <<<"$list"
}

# consumer LABEL [VAR=VALUE...] PROGRAM: runs a consumer program, its output labelled.
consumer() {
    local label=$1
    shift
    printf '%s: ' "$label"
    env "$@" || fail "$label failed"
}

# expect_files DIR EXPECTED...: the files and symlinks under DIR, relative, are exactly these.
expect_files() {
    local dir=$1
    shift
    local have want
    have=$(cd "$dir" && find . \( -type f -o -type l \) | sed 's|^\./||' | LC_ALL=C sort)
    want=$(printf '%s\n' "$@" | LC_ALL=C sort)
    if [[ "$have" != "$want" ]]; then
        echo "packaging: $dir holds:" >&2
        diff <(echo "$want") <(echo "$have") |
            sed -n 's/^</  missing: /p; s/^>/  unexpected: /p' >&2
        fail "unexpected installed files in $dir"
    fi
}

VERSION=$(sed -n 's/^CMAKE_PROJECT_VERSION:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
[[ -n "$VERSION" ]] ||
    VERSION=$(sed -n 's/^project(smtpe VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
ABI=$(sed -n 's/^set(SMTPE_ABI_VERSION \([0-9]*\)).*/\1/p' "$ROOT/CMakeLists.txt")
[[ -n "$VERSION" && -n "$ABI" ]] || fail "cannot read the version from $ROOT/CMakeLists.txt"
echo "packaging: smtpe $VERSION, ABI $ABI, from $BUILD, in $TMP"

# ---- install ----------------------------------------------------------------------------
step "cmake --install $BUILD --prefix $TMP/prefix"
PREFIX=$TMP/prefix
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" || {
    cat "$TMP/install.log"
    fail "cmake --install"
}
PC=$(find "$PREFIX" -name smtpe.pc)
[[ -n "$PC" ]] || fail "no smtpe.pc installed"
LIBDIR=$(dirname "$(dirname "$PC")")
LIBREL=${LIBDIR#"$PREFIX"/}
CONFIG_FILES=()
for f in "$PREFIX/$LIBREL/cmake/smtpe/"smtpeTargets-*.cmake; do
    [[ -e "$f" ]] && CONFIG_FILES+=("$LIBREL/cmake/smtpe/$(basename "$f")")
done
((${#CONFIG_FILES[@]} > 0)) || fail "no smtpeTargets-<config>.cmake installed"
SERVER=()
grep -q '^SMTPE_BUILD_SERVER:BOOL=ON' "$BUILD/CMakeCache.txt" &&
    SERVER=(bin/smtpe-send bin/smtpe-server share/man/man1/smtpe-send.1
        share/man/man8/smtpe-server.8)
expect_files "$PREFIX" include/smtpe.h "${SERVER[@]}" \
    "$LIBREL/libsmtpe.a" "$LIBREL/libsmtpe.so" "$LIBREL/libsmtpe.so.$ABI" \
    "$LIBREL/libsmtpe.so.$VERSION" "$LIBREL/pkgconfig/smtpe.pc" \
    "$LIBREL/cmake/smtpe/smtpeConfig.cmake" "$LIBREL/cmake/smtpe/smtpeConfigVersion.cmake" \
    "$LIBREL/cmake/smtpe/smtpeTargets.cmake" "${CONFIG_FILES[@]}"
[[ "$(readlink "$LIBDIR/libsmtpe.so")" == "libsmtpe.so.$ABI" ]] ||
    fail "libsmtpe.so is not a link to libsmtpe.so.$ABI"
soname=$(readelf -d "$LIBDIR/libsmtpe.so.$VERSION" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[[ "$soname" == "libsmtpe.so.$ABI" ]] || fail "the soname of libsmtpe.so.$VERSION is '$soname'"
cmp -s "$PREFIX/include/smtpe.h" "$ROOT/include/smtpe.h" || fail "the installed smtpe.h differs"
sh "$HERE/check_symbols.sh" "$PREFIX/include/smtpe.h" "$ROOT/engine/smtpe.map" \
    "$LIBDIR/libsmtpe.so.$VERSION"
deps=$(needed "$LIBDIR/libsmtpe.so.$VERSION")
[[ "$deps" == libc.so.* && "$deps" != *$'\n'* ]] || fail "libsmtpe.so needs: $(echo $deps)"

# ---- pkg-config -------------------------------------------------------------------------
step "pkg-config"
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
[[ "$(pkg-config --variable=pcfiledir smtpe)" == "$LIBDIR/pkgconfig" ]] ||
    fail "pkg-config finds another smtpe.pc: $(pkg-config --variable=pcfiledir smtpe)"
[[ "$(pkg-config --modversion smtpe)" == "$VERSION" ]] || fail "pkg-config --modversion smtpe"
echo "pkg-config --cflags --libs smtpe: $(pkg-config --cflags --libs smtpe)"
mkdir "$TMP/pc"
cp "$HERE/consumer.c" "$TMP/pc/"
# shellcheck disable=SC2046 # pkg-config's output is meant to be split into words
"$CC" "${CFLAGS_STRICT[@]}" "$TMP/pc/consumer.c" $(pkg-config --cflags --libs smtpe) \
    -o "$TMP/pc/consumer-shared"
needs "$TMP/pc/consumer-shared" "libsmtpe.so.$ABI" ||
    fail "consumer-shared does not need libsmtpe.so.$ABI"
consumer "pkg-config, shared" LD_LIBRARY_PATH="$LIBDIR" "$TMP/pc/consumer-shared"
# shellcheck disable=SC2046
"$CC" "${CFLAGS_STRICT[@]}" "$TMP/pc/consumer.c" $(pkg-config --cflags smtpe) -static \
    $(pkg-config --static --libs smtpe) -o "$TMP/pc/consumer-static"
[[ -z "$(needed "$TMP/pc/consumer-static")" ]] || fail "consumer-static is not static"
consumer "pkg-config --static" "$TMP/pc/consumer-static"
unset PKG_CONFIG_PATH

# ---- find_package -----------------------------------------------------------------------
step "find_package(smtpe 0.2 REQUIRED): smtpe::smtpe and smtpe::smtpe_static"
cmake -S "$HERE/find_package" -B "$TMP/fp" "${CMAKE_GEN_ARGS[@]}" \
    -DCMAKE_PREFIX_PATH="$PREFIX" >"$TMP/fp.log" || {
    cat "$TMP/fp.log"
    fail "configuring tests/packaging/find_package"
}
grep 'smtpe .* from' "$TMP/fp.log"
cmake --build "$TMP/fp" -j "$JOBS" >"$TMP/fp-build.log" || {
    cat "$TMP/fp-build.log"
    fail "building tests/packaging/find_package"
}
needs "$TMP/fp/consumer_shared" "libsmtpe.so.$ABI" ||
    fail "consumer_shared does not need libsmtpe.so.$ABI"
! needs "$TMP/fp/consumer_static" "libsmtpe.so.$ABI" ||
    fail "consumer_static needs libsmtpe.so.$ABI"
# the build tree's RPATH points at the prefix's library: no LD_LIBRARY_PATH
loads=$(ldd "$TMP/fp/consumer_shared")
[[ "$loads" == *"$LIBDIR/libsmtpe.so.$ABI "* ]] || fail "consumer_shared does not load $LIBDIR/libsmtpe.so.$ABI"
consumer "find_package, smtpe::smtpe" "$TMP/fp/consumer_shared"
consumer "find_package, smtpe::smtpe_static" "$TMP/fp/consumer_static"

# ---- add_subdirectory / FetchContent ----------------------------------------------------
for via in add_subdirectory FetchContent; do
    install_opt=()
    extra=()
    if [[ $via == FetchContent ]]; then
        # a subproject installs nothing of its own unless asked
        install_opt=(-DSMTPE_INSTALL=ON)
        extra=(include/smtpe.h "$LIBREL/libsmtpe.a" "$LIBREL/libsmtpe.so"
            "$LIBREL/libsmtpe.so.$ABI" "$LIBREL/libsmtpe.so.$VERSION"
            "$LIBREL/pkgconfig/smtpe.pc" "$LIBREL/cmake/smtpe/smtpeConfig.cmake"
            "$LIBREL/cmake/smtpe/smtpeConfigVersion.cmake" "$LIBREL/cmake/smtpe/smtpeTargets.cmake"
            "$LIBREL/cmake/smtpe/smtpeTargets-noconfig.cmake")
    fi
    step "$via(smtpe) ${install_opt[*]}"
    dir=$TMP/sub-$via
    cmake -S "$HERE/subproject" -B "$dir" "${CMAKE_GEN_ARGS[@]}" -DSMTPE_SOURCE_DIR="$ROOT" \
        -DSMTPE_VIA="$via" "${install_opt[@]}" >"$dir.log" || {
        cat "$dir.log"
        fail "configuring tests/packaging/subproject with $via"
    }
    grep 'smtpe via' "$dir.log"
    cmake --build "$dir" -j "$JOBS" >"$dir-build.log" || {
        cat "$dir-build.log"
        fail "building tests/packaging/subproject with $via"
    }
    found=$(find "$dir" -name 'smtpe-server*' -type f -perm -u+x; find "$dir" -name 'test_*' -type f -perm -u+x)
    [[ -z "$found" ]] || fail "$via built programs of smtpe: $found"
    consumer "$via, smtpe::smtpe_static" "$dir/consumer_static"
    consumer "$via, smtpe::smtpe" "$dir/consumer_shared"
    cmake --install "$dir" --prefix "$dir-prefix" >/dev/null
    expect_files "$dir-prefix" bin/consumer_static "${extra[@]}"
done

# ---- amalgamation -----------------------------------------------------------------------
step "amalgamation: cmake --build $BUILD --target amalgamation"
cmake --build "$BUILD" --target amalgamation
AMALG=$BUILD/amalgamation
[[ -f "$AMALG/smtpe.c" && -f "$AMALG/smtpe.h" ]] || fail "no $AMALG/smtpe.c and smtpe.h"
cmp -s "$AMALG/smtpe.h" "$ROOT/include/smtpe.h" || fail "amalgamation/smtpe.h is not include/smtpe.h"
if grep -n '^[ \t]*#[ \t]*include[ \t]*"' "$AMALG/smtpe.c" | grep -v ':#include "smtpe.h"$'; then
    fail "amalgamation/smtpe.c still includes a private header"
fi
compilers=()
for c in gcc clang; do
    if command -v "$c" >/dev/null 2>&1; then
        compilers+=("$c")
    else
        echo "packaging: $c not installed, skipped"
    fi
done
for c in "${compilers[@]}"; do
    dir=$TMP/amalgamation-$c
    mkdir "$dir"
    cp "$AMALG/smtpe.c" "$AMALG/smtpe.h" "$HERE/consumer.c" "$dir/"
    for opt in -O0 -O2; do
        echo "$c ${CFLAGS_STRICT[*]} $opt -c smtpe.c"
        (cd "$dir" && "$c" "${CFLAGS_STRICT[@]}" "$opt" -c smtpe.c -o "smtpe$opt.o")
        sh "$HERE/check_symbols.sh" "$dir/smtpe.h" "$ROOT/engine/smtpe.map" "$dir/smtpe$opt.o"
        rm "$dir/smtpe$opt.o"
    done
    echo "$c ${CFLAGS_STRICT[*]} consumer.c smtpe.c"
    (cd "$dir" && "$c" "${CFLAGS_STRICT[@]}" consumer.c smtpe.c -o consumer)
    consumer "amalgamation, $c" "$dir/consumer"
done

# ---- C++ --------------------------------------------------------------------------------
step "smtpe.h as C++"
cxx_found=0
for cxx in g++ clang++; do
    if ! command -v "$cxx" >/dev/null 2>&1; then
        echo "packaging: $cxx not installed, skipped"
        continue
    fi
    cxx_found=1
    for std in c++11 c++17 c++20; do
        echo "$cxx -std=$std -Wall -Wextra -pedantic -Werror -x c++ -fsyntax-only header.cpp"
        "$cxx" -std="$std" -Wall -Wextra -pedantic -Werror -x c++ -fsyntax-only \
            -I"$PREFIX/include" "$HERE/header.cpp"
    done
done
((cxx_found)) || fail "neither g++ nor clang++ is installed"

echo
echo "packaging: all passed"
