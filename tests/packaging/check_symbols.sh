#!/bin/sh
# check_symbols.sh - the public API is the same set of names in three places:
#   - the functions include/smtpe.h declares with SMTPE_API,
#   - the names the linker version script engine/smtpe.map exports (each explicitly),
#   - the symbols each FILE defines for the outside: for a shared library (*.so, *.so.N...)
#     those `nm -D --defined-only` lists, each in a node of the map (name@@NODE) when nm shows
#     versions; for any other file (an object: the amalgamated smtpe.o defines the API and
#     nothing else) those `nm --defined-only --extern-only` lists.
# Fails, naming each name that is missing from one of them, when they differ: a function added
# to the header must be added to engine/smtpe.map too. POSIX sh, awk, sort, comm; NM (default
# nm, GNU or LLVM) reads the files.
# Usage: tests/packaging/check_symbols.sh HEADER MAP [FILE...]
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 HEADER MAP [FILE...]" >&2
    exit 2
fi
header=$1
map=$2
shift 2
NM=${NM:-nm}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_symbols.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
status=0

# The header's API: each declaration that starts a line with SMTPE_API, up to its first "(",
# gives the identifier right before that "(" (the declaration may span lines).
awk '
    /^[ \t]*SMTPE_API[ \t]/ { decl = ""; open = 1 }
    open {
        decl = decl " " $0
        if (index(decl, "(") > 0) {
            sub(/\(.*/, "", decl)
            if (match(decl, /[A-Za-z_][A-Za-z0-9_]*[ \t]*$/)) {
                name = substr(decl, RSTART, RLENGTH)
                sub(/[ \t]+$/, "", name)
                print name
            }
            open = 0
        }
    }
' "$header" | sort >"$tmp/header"
if [ ! -s "$tmp/header" ]; then
    echo "check_symbols: no function declared with SMTPE_API in $header" >&2
    exit 1
fi
if [ -n "$(uniq -d "$tmp/header")" ]; then
    echo "check_symbols: declared twice in $header: $(uniq -d "$tmp/header" | tr '\n' ' ')" >&2
    status=1
fi

# The map: "NAME NODE" for every name of a global: list. Comments /* */ are dropped; a pattern
# (a name with * ? or [) in a global: list is an error.
awk '
    { text = text $0 "\n" }
    END {
        while ((i = index(text, "/*")) > 0) {
            rest = substr(text, i + 2)
            j = index(rest, "*/")
            if (j == 0) { print "unterminated comment" > "/dev/stderr"; exit 1 }
            text = substr(text, 1, i - 1) " " substr(rest, j + 2)
        }
        gsub(/[{};:]/, " & ", text)
        n = split(text, tok, /[ \t\n]+/)
        node = ""; mode = ""; prev = ""
        for (k = 1; k <= n; k++) {
            t = tok[k]
            if (t == "") continue
            if (t == "{") { node = prev; mode = "" }
            else if (t == "}") { node = ""; mode = "" }
            else if (t == ":" && (prev == "global" || prev == "local")) mode = prev
            else if (node != "" && mode == "global" && t != ";" && t != "global" && t != "local") {
                if (t ~ /[*?\[]/) {
                    printf "check_symbols: %s: a pattern in global: of %s: %s\n", \
                        FILENAME, node, t > "/dev/stderr"
                    bad = 1
                }
                else if (tok[k + 1] != ":") print t, node
            }
            prev = t
        }
        exit bad
    }
' "$map" >"$tmp/map-raw" || exit 1
sort "$tmp/map-raw" >"$tmp/map-versions"
cut -d' ' -f1 "$tmp/map-versions" | sort >"$tmp/map"
if [ -n "$(uniq -d "$tmp/map")" ]; then
    echo "check_symbols: listed twice in $map: $(uniq -d "$tmp/map" | tr '\n' ' ')" >&2
    status=1
fi
sort -u "$tmp/map" -o "$tmp/map"
sort -u "$tmp/header" -o "$tmp/header"

# differ A B LABEL_A LABEL_B: reports the names in one list only.
differ() {
    only_a=$(comm -23 "$1" "$2" | tr '\n' ' ')
    only_b=$(comm -13 "$1" "$2" | tr '\n' ' ')
    if [ -n "$only_a" ]; then
        echo "check_symbols: in $3, not in $4: $only_a" >&2
        status=1
    fi
    if [ -n "$only_b" ]; then
        echo "check_symbols: in $4, not in $3: $only_b" >&2
        status=1
    fi
}

differ "$tmp/header" "$tmp/map" "$header (SMTPE_API)" "$map"

for file in "$@"; do
    if [ ! -f "$file" ]; then
        echo "check_symbols: no file $file" >&2
        status=1
        continue
    fi
    case $file in
    *.so | *.so.*)
        # Version nodes show up as absolute (A) symbols named after the node: not functions.
        "$NM" -D --defined-only "$file" | awk 'NF >= 3 && $2 != "A" { print $3 }' >"$tmp/raw"
        : >"$tmp/file"
        : >"$tmp/file-versions"
        while read -r sym; do
            name=${sym%%@*}
            printf '%s\n' "$name" >>"$tmp/file"
            case $sym in
            *@*) printf '%s %s\n' "$name" "${sym##*@}" >>"$tmp/file-versions" ;;
            esac
        done <"$tmp/raw"
        sort -u "$tmp/file" -o "$tmp/file"
        differ "$tmp/header" "$tmp/file" "$header (SMTPE_API)" "$file (nm -D --defined-only)"
        if [ -s "$tmp/file-versions" ]; then
            sort "$tmp/file-versions" -o "$tmp/file-versions"
            wrong=$(comm -13 "$tmp/map-versions" "$tmp/file-versions" |
                while read -r name node; do
                    if grep -qx "$name" "$tmp/map"; then printf '%s@%s ' "$name" "$node"; fi
                done)
            if [ -n "$wrong" ]; then
                echo "check_symbols: $file: not in the node $map gives them: $wrong" >&2
                status=1
            fi
        fi
        ;;
    *)
        "$NM" --defined-only --extern-only "$file" |
            awk 'NF >= 3 && $1 !~ /:$/ { print $3 }' | sort -u >"$tmp/file"
        differ "$tmp/header" "$tmp/file" "$header (SMTPE_API)" \
            "$file (nm --defined-only --extern-only)"
        ;;
    esac
done

if [ "$status" -eq 0 ]; then
    echo "check_symbols: $(wc -l <"$tmp/header" | tr -d ' ') functions, the same in $header," \
        "$map${*:+ and }$*"
fi
exit "$status"
