#!/usr/bin/env bash
# fuzz/regress/verify.sh - checks that each regression input in fuzz/regress/ reproduces the bug
# it is named for: it must pass today (ctest fuzz_regress_TARGET checks that) and fail, with the
# expected oracle message, against the code before the fix. Not part of ctest: it builds one
# target per line below (about a minute in all, one core).
#
#   fuzz/regress/verify.sh [NAME-SUBSTRING]
#
# Each line of the table: TARGET/INPUT KIND REF EXPECTED-MESSAGE, where KIND is
#   engine   today's target against engine/ and include/ of git revision REF (before the fix);
#   harness  the target (fuzz/ of revision REF, an oracle that was wrong) against today's engine;
#   patch    today's target against today's engine with fuzz/regress/patches/REF.patch applied:
#            the fix reverted by hand where the old engine no longer fits today's API, or, for a
#            "guard-" patch, a plausible bug the input is there to catch.
# The engine API changed once under the targets: smtpe__data_start gained at_line_start
# (6aba4ef); the script adapts the call when the two sides disagree.
# Exit status: 0 if every input selected failed as expected (and passes today), 1 otherwise.
set -uo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CC=${CC:-cc}
ONLY=${1:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

TABLE='
fuzz_session/lmtp-421-verdict-ends-per-recipient-series engine 09ef721^ a 421 verdict did not make the session close
fuzz_session/lmtp-bdat-refused-nonlast-one-reply engine 09ef721^ refused content answered with a number of replies
fuzz_session/auth-credentials-wiped-when-error-limit-closes engine bd8ddc5^ AUTH credentials still in session memory
fuzz_session/xclient-220-greeting-text-not-truncated engine bd8ddc5^ not the host'"'"'s reply text verbatim
fuzz_session/proxy-220-greeting-text-not-truncated engine bd8ddc5^ not the host'"'"'s reply text verbatim
fuzz_session/quit-event-wanted-while-closing patch d1326c1-want-hides-event-while-closing SMTPE_WANT_EVENT disagrees with next_event
fuzz_session/timeout-event-wanted-while-closing patch d1326c1-want-hides-event-while-closing after a timeout the session must have an event and want to close
fuzz_session/normalise-data-line-bare-lf-starts-no-line patch 6aba4ef-bare-data-line-starts-a-line did not end exactly at the first CRLF.CRLF
fuzz_session/normalise-data-line-bare-lf-starts-no-line harness 18d9dc9^ did not end exactly at the first CRLF.CRLF
fuzz_session/refuse-data-crlf-split-after-held-cr harness 274ec44^ DATA_CHUNK span neither in the fed octets nor a static line break
fuzz_session/normalise-bare-cr-line-answered-without-consuming harness 5605b22^ SMTPE_WANT_READ was set but recv neither consumed nor made an event
fuzz_data/refuse-crlf-split-after-held-cr harness 274ec44^ chunk outside the consumed octets and not a static line break
fuzz_data/refuse-bare-cr-never-handed-out engine adbaa26^ refused content is not everything before the first bare
fuzz_data/too-big-content-cut-at-max-whatever-the-split engine 8bc869c^ split invariance: contents differ
fuzz_command/extension-verbs-have-verb-codes harness c942ea7^ command_split: bad verb
fuzz_reply/text-with-horizontal-tab harness 26ed2a2^ a control octet in valid text
fuzz_address/domain-label-over-63-octets engine 6aba4ef^ domain label longer than 63 octets
fuzz_proxy/v2-local-ignores-family-octet engine 4c68e85^ a v2 LOCAL header was not read whole
fuzz_sasl/base64-nonzero-bits-under-padding-refused patch guard-base64-pad-bits-unchecked decode disagrees with the reference
fuzz_bdat/word-scan-stops-at-each-bare-octet patch guard-word-scan-skips-an-octet split invariance
'

# build DIR TARGET: DIR holds engine/, include/ and fuzz/ (the target and fuzz_util.h) to use.
build() {
    local d=$1 t=$2
    local new_api=0 old_call=0
    grep -q at_line_start "$d/engine/data.h" && new_api=1
    grep -q 'smtpe__data_start(d, pol, max);' "$d/fuzz/$t.c" && old_call=1
    if [ $new_api = 1 ] && [ $old_call = 1 ]; then
        sed -i 's/smtpe__data_start(d, pol, max);/smtpe__data_start(d, pol, max, 1);/' "$d/fuzz/$t.c"
    elif [ $new_api = 0 ] && [ $old_call = 0 ]; then
        sed -i 's/smtpe__data_start(d, pol, max, 1);/smtpe__data_start(d, pol, max);/' "$d/fuzz/$t.c"
    fi
    "$CC" -g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -w -I"$d/include" -I"$d/engine" -I"$d/fuzz" \
        "$ROOT/fuzz/replay.c" "$d/fuzz/$t.c" "$d"/engine/*.c -o "$d/replay"
}

FAILED=0
COUNT=0
while read -r input kind ref expect; do
    [ -z "$input" ] && continue
    case "$input $ref" in *"$ONLY"*) ;; *) continue ;; esac
    t=${input%%/*}
    d=$TMP/$COUNT
    COUNT=$((COUNT + 1))
    mkdir -p "$d"
    case $kind in
    engine)
        git archive "$ref" engine include | tar -x -C "$d"
        mkdir -p "$d/fuzz" && cp fuzz/"$t".c fuzz/fuzz_util.h "$d/fuzz/" ;;
    harness)
        cp -r engine include "$d/"
        git archive "$ref" fuzz | tar -x -C "$d" ;;
    patch)
        cp -r engine include "$d/"
        mkdir -p "$d/fuzz" && cp fuzz/"$t".c fuzz/fuzz_util.h "$d/fuzz/"
        patch -s -d "$d" -p1 <"fuzz/regress/patches/$ref.patch" ;;
    esac
    if ! build "$d" "$t" 2>"$d/build.log"; then
        echo "FAIL  $input against $kind $ref: does not build"
        sed 's/^/      /' "$d/build.log" | head -n 5
        FAILED=1
        continue
    fi
    # the group's stderr silences bash's own notice of the expected abort
    { "$d/replay" -q "fuzz/regress/$input" >"$d/out.log" 2>&1; } 2>/dev/null
    rc=$?
    if [ $rc != 0 ] && grep -qF -- "$expect" "$d/out.log"; then
        echo "ok    $input fails against $kind $ref ($expect)"
    else
        echo "FAIL  $input against $kind $ref: exit $rc, expected \"$expect\""
        sed 's/^/      /' "$d/out.log" | tail -n 4
        FAILED=1
    fi
done <<<"$TABLE"
[ $COUNT -gt 0 ] || { echo "verify.sh: no input matches '$ONLY'" >&2; exit 1; }
exit $FAILED
