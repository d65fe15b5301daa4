#!/usr/bin/env bash
# Installs what building and testing smtpe needs on Debian 12, only the packages that are
# missing, and any further packages named as arguments (tests/bench/deps.sh names the
# benchmark's). Idempotent; runs as root or through sudo. Usage: tests/deps.sh [PACKAGE...]
set -euo pipefail

# abigail-tools: abidw/abidiff, the ABI check against tests/abi/libsmtpe.abi (ctest abi_baseline).
# gnuplot-nox: the plot of tests/bench/run.sh (its --smoke runs in ctest).
# valgrind: the integration suites under memcheck (ctest -L long: valgrind_*).
# libssl-dev, libcrypt-dev: STARTTLS and AUTH in smtpe-server. openssl (certificates, password
# hashes), haproxy (PROXY protocol) and libnet-ssleay-perl (swaks --tls): integration tests.
# libuv1-dev, libevent-dev: the example servers bindings/libuv and bindings/libevent.
# postfix, dovecot-core, dovecot-lmtpd, python3-aiosmtpd, golang-go, golang-github-emersion-go-
# smtp-dev and -go-sasl-dev (go-smtp imports it; not among its Depends), and nodejs + npm (only
# when there is no npm: a Node.js of the machine's stays): the real-server peers of the client's
# interop tests (tests/integration/peers.py), each run as a private instance; npm ci puts
# nodemailer's smtp-server (pinned in tests/integration/peers/node/package-lock.json) there.
# groff-base, man-db: the man pages' test (tests/integration/test_manpages.py: groff -ww, man -l).
# ruby, ruby-dev, ruby-async, ruby-minitest: the Ruby gem (bindings/ruby: the extension's build,
# the Fiber models, its minitest suite; Net::SMTP is Ruby's own bundled gem).
PACKAGES=(build-essential cmake pkg-config clang libclang-rt-14-dev libcmocka-dev python3 swaks curl
    libssl-dev libcrypt-dev openssl haproxy libnet-ssleay-perl gnuplot-nox valgrind abigail-tools
    libuv1-dev libevent-dev postfix dovecot-core dovecot-lmtpd python3-aiosmtpd golang-go
    golang-github-emersion-go-smtp-dev golang-github-emersion-go-sasl-dev ruby ruby-dev
    ruby-async ruby-minitest s-nail groff-base man-db "$@")
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

# node_peer_modules: npm ci in tests/integration/peers/node unless its node_modules is as new as
# its package-lock.json (npm writes node_modules/.package-lock.json).
node_peer_modules() {
    local dir
    dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/integration/peers/node"
    if [[ -f "$dir/node_modules/.package-lock.json" &&
        ! "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]]; then
        return 0
    fi
    echo "deps.sh: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps.sh: not a Debian-like system (no dpkg-query/apt-get); install these yourself:" >&2
    echo "  ${PACKAGES[*]}" >&2
    for tool in cc cmake clang python3 swaks curl openssl haproxy; do
        command -v "$tool" >/dev/null 2>&1 || { echo "deps.sh: missing $tool" >&2; exit 1; }
    done
    exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
    node_peer_modules
    echo "deps.sh: all dependencies present"
    exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "deps.sh: need root or sudo to install: ${missing[*]}" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "deps.sh: installing ${missing[*]}"
postfix_new=0
dovecot_new=0
[[ " ${missing[*]} " == *" dovecot-core "* ]] && dovecot_new=1
if [[ " ${missing[*]} " == *" postfix "* ]]; then
    # Postfix would ask what kind of mail server to set up; "No configuration" sets up none.
    postfix_new=1
    echo "postfix postfix/main_mailer_type select No configuration" |
        "${SUDO[@]}" debconf-set-selections
fi
# Package lists may be absent (fresh image) or stale: update once, then install. Another apt run
# may hold the dpkg lock: wait for it (up to 10 minutes) rather than fail.
LOCK_WAIT=(-o DPkg::Lock::Timeout=600)
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${LOCK_WAIT[@]}" update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get "${LOCK_WAIT[@]}" install -y -q "${missing[@]}" </dev/null
# Postfix is wanted for its smtp-sink and smtp-source and for private instances (peers.py): no
# MTA left running.
if ((postfix_new)) && "${SUDO[@]}" postfix status >/dev/null 2>&1; then
    "${SUDO[@]}" postfix stop >/dev/null 2>&1 || true
fi
# Dovecot likewise: the tests run private instances only; the system's is stopped if it started.
if ((dovecot_new)); then
    "${SUDO[@]}" doveadm stop >/dev/null 2>&1 || true
fi
node_peer_modules
echo "deps.sh: done"
