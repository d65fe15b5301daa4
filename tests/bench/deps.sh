#!/usr/bin/env bash
# Installs what the peer benchmark (tests/bench/run.sh) needs on Debian 12 beyond what tests/deps.sh
# installs anyway, only the packages that are missing (tests/deps.sh does the work). Idempotent;
# runs as root or through sudo. Usage: tests/bench/deps.sh
#
# postfix: /usr/sbin/smtp-sink (a peer server) and /usr/sbin/smtp-source (a second load
# generator); tests/deps.sh installs it with debconf's "No configuration", so no MTA is set up,
# and stops its service should it run all the same. python3-aiosmtpd, golang-go and
# golang-github-emersion-go-smtp-dev: the aiosmtpd and go-smtp peers (tests/bench/peers/), the
# latter built offline from Debian's packaged Go source; golang-github-emersion-go-sasl-dev is
# imported by go-smtp but is not among the Depends of its Debian 12 package, so it is named here.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "$here/../deps.sh" postfix python3-aiosmtpd golang-go golang-github-emersion-go-smtp-dev \
    golang-github-emersion-go-sasl-dev
