#!/usr/bin/env bash
# Builds the extension in the tree for the tests: vendor.sh, then extconf.rb + make in
# bindings/ruby/tmp/ext (or $SMTPE_RUBY_EXT_DIR), warnings as errors. Prints the directory to
# put on Ruby's load path (ruby -I "$(test/build_ext.sh)" -I lib ...).
# Environment: CC (e.g. clang), SMTPE_EXTRA_CFLAGS / SMTPE_EXTRA_LDFLAGS (sanitizers).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${SMTPE_RUBY_EXT_DIR:-$here/tmp/ext}
"$here/vendor.sh" >/dev/null
mkdir -p "$out"
(
    cd "$out"
    SMTPE_WERROR=1 ruby "$here/ext/smtpe/extconf.rb" >extconf.out 2>&1 ||
        { cat extconf.out mkmf.log >&2; exit 1; }
    # objects depend on no flag: a build with other flags (CC, sanitizers) starts clean
    stamp="${CC:-cc} ${SMTPE_EXTRA_CFLAGS:-} ${SMTPE_EXTRA_LDFLAGS:-}"
    [[ -f flags.stamp && "$(cat flags.stamp)" == "$stamp" ]] || make clean >/dev/null 2>&1 || true
    echo "$stamp" >flags.stamp
    make -j2 V=0 >make.out 2>&1 || { cat make.out >&2; exit 1; }
    mkdir -p smtpe
    cp smtpe.so smtpe/smtpe.so
)
echo "$out"
