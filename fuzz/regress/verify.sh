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
#   patch    today's target against today's engine with fuzz/regress/patches/REF.patch applied
#            (paths a/engine/..., a/include/..., a/fuzz/TARGET.c or a/fuzz/fuzz_util.h): a fix
#            reverted by hand, in the engine or in the target's oracle, where the code of the fix's
#            parent no longer builds with today's code; or, for a "guard-" patch, a plausible bug
#            the input is there to catch. A patch that does not apply (without fuzz) is a failure.
# The engine API changed under the targets: smtpe__data_start gained at_line_start (6aba4ef),
# which the script adapts when the two sides disagree; the public API 1.0 (d834be7, with the
# fuzz_session rewrite d266ccb, 97406ee) and the removal of smtpe__reply_text_valid (5b723ce) it
# does not, so fuzz_session's entries, and fuzz_reply's from before 5b723ce, are patches.
# Every input under fuzz/regress/TARGET/ must have a line (checked when no NAME-SUBSTRING is given).
# Exit status: 0 if every input selected failed as expected (and passes today), 1 otherwise.
set -uo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CC=${CC:-cc}
ONLY=${1:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

TABLE='
fuzz_session/lmtp-421-verdict-ends-per-recipient-series patch 09ef721-lmtp-421-verdict-continues-series a 421 verdict did not make the session close
fuzz_session/lmtp-bdat-refused-nonlast-one-reply patch 09ef721-lmtp-bdat-nonlast-refused-per-recipient refused content answered with a number of replies
fuzz_session/auth-credentials-wiped-when-error-limit-closes patch bd8ddc5-auth-credentials-kept-when-error-limit-closes AUTH credentials still in session memory
fuzz_session/xclient-220-greeting-text-not-truncated patch bd8ddc5-greeting-text-cut-at-511-octets not the host'"'"'s reply text verbatim
fuzz_session/proxy-220-greeting-text-not-truncated patch bd8ddc5-greeting-text-cut-at-511-octets not the host'"'"'s reply text verbatim
fuzz_session/quit-event-wanted-while-closing patch d1326c1-want-hides-event-while-closing SMTPE_WANT_EVENT disagrees with next_event
fuzz_session/timeout-event-wanted-while-closing patch d1326c1-want-hides-event-while-closing after a timeout the session must have an event and want to close
fuzz_session/normalise-data-line-bare-lf-starts-no-line patch 6aba4ef-bare-data-line-starts-a-line did not end exactly at the first CRLF.CRLF
fuzz_session/normalise-data-line-bare-lf-starts-no-line patch 18d9dc9-smuggling-oracle-counts-bare-data-line-break did not end exactly at the first CRLF.CRLF
fuzz_session/refuse-data-crlf-split-after-held-cr patch 274ec44-refuse-static-crlf-not-allowed DATA_CHUNK span neither in the fed octets nor a static line break
fuzz_session/normalise-bare-cr-line-answered-without-consuming patch 5605b22-reply-without-consuming-not-progress SMTPE_WANT_READ was set but recv neither consumed
fuzz_session/concurrent-auth-challenge-refused-behind-voided-rcpt patch fd4e5da-auth-challenge-refused-behind-voided-rcpt auth_challenge refused a challenge of at most 1536 octets
fuzz_session/concurrent-starttls-wait-hides-voided-rcpt-verdict patch fd4e5da-want-tls-hides-owed-verdict SMTPE_WANT_VERDICT disagrees with the verdicts the host owes
fuzz_data/refuse-crlf-split-after-held-cr harness 274ec44^ chunk outside the consumed octets and not a static line break
fuzz_data/refuse-bare-cr-never-handed-out engine adbaa26^ refused content is not everything before the first bare
fuzz_data/too-big-content-cut-at-max-whatever-the-split engine 8bc869c^ split invariance: contents differ
fuzz_command/extension-verbs-have-verb-codes harness c942ea7^ command_split: bad verb
fuzz_reply/text-with-horizontal-tab patch 26ed2a2-reply-text-oracle-refuses-ht a control octet in valid text
fuzz_address/domain-label-over-63-octets engine 6aba4ef^ domain label longer than 63 octets
fuzz_proxy/v2-local-ignores-family-octet engine 4c68e85^ a v2 LOCAL header was not read whole
fuzz_sasl/base64-nonzero-bits-under-padding-refused patch guard-base64-pad-bits-unchecked decode disagrees with the reference
fuzz_bdat/word-scan-stops-at-each-bare-octet patch guard-word-scan-skips-an-octet split invariance
fuzz_stuff/normalise-dot-after-bare-lf-doubled patch guard-stuff-bare-lf-starts-no-line the end of data is not exactly the final .CRLF
fuzz_stuff/long-line-refused-8bit-after-not-seen patch 89068a9-long-line-refused-counts-8bit-after seen differs
fuzz_client/chunk-size-below-4-bare-cr-consumes-nothing engine b40b1cf^ want() said CONTENT but smtpe_client_content consumed nothing
fuzz_client/memory-is-the-documented-formula-1-recipient engine f310bee^ smtpe_client_memory_size is not the formula documented in smtpe.h
fuzz_client/helo-name-of-255-octets-valid engine a3ba71c^ smtpe_client_memory_size refused a config smtpe.h calls valid
fuzz_client/reply-ahead-of-helo-same-close-in-every-split engine c28bc6c^ split invariance: the event log differs
fuzz_client/421-before-unsent-quit-is-the-servers engine 0de3407^ the engine closed for a reason the reference does not see
fuzz_client/reply-begun-before-quit-answers-nothing engine 662b1e8^ the engine closed for a reason the reference does not see
fuzz_client/ehlo-reply-and-334-in-one-read-auth-step-first engine f28e4f3^ split invariance: the event log differs
fuzz_client/xclient-nothing-left-auth-failed-before-next-reply-of-read engine f28e4f3^ the engine closed for a reason the reference does not see
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
    # shellcheck disable=SC2086 # EXTRA: zero or more words
    "$CC" -g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -w $EXTRA -I"$d/include" -I"$d/engine" \
        -I"$d/fuzz" "$ROOT/fuzz/replay.c" "$d/fuzz/$t.c" "$d"/engine/*.c -o "$d/replay"
}

FAILED=0
COUNT=0
while read -r input kind ref expect; do
    [ -z "$input" ] && continue
    case "$input $ref" in *"$ONLY"*) ;; *) continue ;; esac
    t=${input%%/*}
    d=$TMP/$COUNT
    EXTRA=
    COUNT=$((COUNT + 1))
    mkdir -p "$d"
    case $kind in
    engine)
        git archive "$ref" engine include | tar -x -C "$d"
        # fuzz_client: the defaults' memory figure is then the old engine's own (today's
        # smtpe.h figure is today's struct's)
        EXTRA=-DFZ_DEFAULTS_MEMORY=0
        mkdir -p "$d/fuzz" && cp fuzz/"$t".c fuzz/fuzz_util.h "$d/fuzz/" ;;
    harness)
        cp -r engine include "$d/"
        git archive "$ref" fuzz | tar -x -C "$d" ;;
    patch)
        cp -r engine include "$d/"
        mkdir -p "$d/fuzz" && cp fuzz/"$t".c fuzz/fuzz_util.h "$d/fuzz/"
        if ! patch -s -F 0 -d "$d" -p1 <"fuzz/regress/patches/$ref.patch" >"$d/patch.log" 2>&1; then
            echo "FAIL  $input against $kind $ref: the patch does not apply"
            sed 's/^/      /' "$d/patch.log" | head -n 5
            FAILED=1
            continue
        fi ;;
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
if [ -z "$ONLY" ]; then
    for f in fuzz/regress/fuzz_*/*; do
        [ -f "$f" ] || continue
        n=${f#fuzz/regress/}
        if ! grep -q "^$n " <<<"$TABLE"; then
            echo "FAIL  $n: no line in verify.sh's table"
            FAILED=1
        fi
    done
fi
exit $FAILED
