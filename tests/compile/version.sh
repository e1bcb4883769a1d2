#!/usr/bin/env bash
# The version on the header's first line, the version macros and the newest entry of the
# history in the documentation block name the same version.
# Usage: version.sh OUTPUT_DIR (unused). Exits non-zero when they differ.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
H=$ROOT/autodiff.h
line1=$(head -1 "$H" | sed -n 's/^\/\* autodiff\.h - v\([0-9]*\.[0-9]*\.[0-9]*\) - .*/\1/p')
macro() { sed -n "s/^#define AUTODIFF_VERSION_$1 \([0-9]*\)\$/\1/p" "$H"; }
macros=$(macro MAJOR).$(macro MINOR).$(macro PATCH)
newest=$(sed -n '/>>history/,/^\*\//p' "$H" | sed -n 's/^   \([0-9]*\.[0-9]*\.[0-9]*\)  .*/\1/p' | tail -1)
echo "line 1: ${line1:-none}, macros: $macros, newest history entry: ${newest:-none}"
[ -n "$line1" ] && [ "$line1" = "$macros" ] && [ "$newest" = "$macros" ]
