#!/usr/bin/env bash
# Installs what the peer benchmark (tests/bench/run.sh) needs on Debian 12 beyond tests/deps.sh,
# only the packages that are missing. Idempotent; runs as root or through sudo. Runs
# tests/deps.sh first. Usage: tests/bench/deps.sh
#
# postfix: /usr/sbin/smtp-sink (a peer server) and /usr/sbin/smtp-source (a second load
# generator). It is installed with debconf's "No configuration", so no MTA is set up; should its
# service run all the same, it is stopped. python3-aiosmtpd, golang-go and
# golang-github-emersion-go-smtp-dev: the aiosmtpd and go-smtp peers (tests/bench/peers/), the
# latter built offline from Debian's packaged Go source; golang-github-emersion-go-sasl-dev is
# imported by go-smtp but is not among the Depends of its Debian 12 package, so it is named here.
# gnuplot-nox: the benchmark's plots.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$here/../deps.sh"

PACKAGES=(postfix python3-aiosmtpd golang-go golang-github-emersion-go-smtp-dev
    golang-github-emersion-go-sasl-dev gnuplot-nox)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "bench/deps.sh: not a Debian-like system (no dpkg-query/apt-get); install yourself:" >&2
    echo "  ${PACKAGES[*]}" >&2
    exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
    echo "bench/deps.sh: all benchmark dependencies present"
    exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "bench/deps.sh: need root or sudo to install: ${missing[*]}" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "bench/deps.sh: installing ${missing[*]}"
# Postfix would otherwise ask what kind of mail server to set up; "No configuration" sets up none.
echo "postfix postfix/main_mailer_type select No configuration" |
    "${SUDO[@]}" debconf-set-selections
# Package lists may be absent (fresh image) or stale: update once, then install. Another apt run
# may hold the dpkg lock: wait for it (up to 10 minutes) rather than fail.
LOCK_WAIT=(-o DPkg::Lock::Timeout=600)
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${LOCK_WAIT[@]}" update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get "${LOCK_WAIT[@]}" install -y -q "${missing[@]}" </dev/null
# Only smtp-sink and smtp-source are wanted: no Postfix MTA left running.
if "${SUDO[@]}" postfix status >/dev/null 2>&1; then
    "${SUDO[@]}" postfix stop >/dev/null 2>&1 || true
fi
echo "bench/deps.sh: done"
