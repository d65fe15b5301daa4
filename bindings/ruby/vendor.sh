#!/usr/bin/env bash
# Copies the engine into the gem as one file: ext/smtpe/vendor/smtpe.c and smtpe.h, the
# amalgamation that engine/amalgamate.cmake writes from the project's own sources (every
# internal function static). Run before building the extension in the tree or `gem build`.
# Needs cmake (only its script mode: nothing is configured or built).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cmake -DOUTPUT_DIR="$here/ext/smtpe/vendor" -DSOURCE_DIR="$root" -P "$root/engine/amalgamate.cmake"
