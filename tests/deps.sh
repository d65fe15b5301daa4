#!/usr/bin/env bash
# Installs what building and testing smtpe needs on Debian 12, only the packages that are
# missing. Idempotent; runs as root or through sudo. Usage: tests/deps.sh
set -euo pipefail

# gnuplot-nox: the plot of tests/bench/run.sh (its --smoke runs in ctest).
# libssl-dev, libcrypt-dev: STARTTLS and AUTH in smtpe-server. openssl (certificates, password
# hashes), haproxy (PROXY protocol) and libnet-ssleay-perl (swaks --tls): integration tests.
PACKAGES=(build-essential cmake pkg-config clang libclang-rt-14-dev libcmocka-dev python3 swaks curl
    libssl-dev libcrypt-dev openssl haproxy libnet-ssleay-perl gnuplot-nox)

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
# Package lists may be absent (fresh image) or stale: update once, then install.
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q "${missing[@]}" </dev/null
echo "deps.sh: done"
