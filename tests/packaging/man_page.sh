#!/usr/bin/env bash
# ctest packaging.man_page: ingressd(8) is held to `ingressd --help`.
#
#   man_page.sh BINARY MAN_PAGE GENERATOR
#
# 1. Every option --help lists is an item of the page's OPTIONS section, in the same order, and the
#    page has no option --help does not list (no help2man needed for this part).
# 2. The page renders without a warning from man/groff.
# 3. The page is exactly what GENERATOR (packaging/man/generate.sh, help2man) makes of this
#    binary now, but for the month in its .TH line: a changed description or version shows up
#    as a diff. Exit 77 (ctest SKIP_RETURN_CODE) only when help2man is not installed, after 1 and 2.
set -euo pipefail
binary=$1 page=$2 generator=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

from_help=$("$binary" --help | sed -n 's/^  \(--[a-z][a-z-]*\).*/\1/p')
# help2man writes an option item as `.TP` then `\fB\-\-name\fR ...`.
from_page=$(sed -n '/^\.SH OPTIONS/,/^\.SH /p' "$page" | grep -A1 '^\.TP' |
            sed -n 's/^\\fB\(\\-\\-[a-z\\-]*\)\\fR.*/\1/p; s/^\\fB\(\\-\\-[a-z\\-]*\)$/\1/p' | sed 's/\\-/-/g')
[ -n "$from_help" ] || fail "no options found in $binary --help"
if [ "$from_help" != "$from_page" ]; then
  fail "options differ between --help (<) and the OPTIONS of $page (>):"
  diff <(echo "$from_help") <(echo "$from_page") | grep '^[<>]' || true
fi

if command -v man >/dev/null; then
  warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$page" 2>&1 >/dev/null || true)
  [ -z "$warnings" ] || fail "man reports problems in $page: $warnings"
fi

status=0
"$generator" "$binary" "$tmp/ingressd.8" || status=$?
if [ "$status" -eq 77 ]; then
  [ "$failures" -eq 0 ] || exit 1
  echo "SKIP: help2man is not installed; options match --help"
  exit 77
fi
[ "$status" -eq 0 ] || fail "$generator exited $status"
# The month help2man puts in .TH is the day's, not the binary's.
normalise() { sed -E 's/^(\.TH [^ ]+ "8") "[^"]*"/\1 "DATE"/' "$1"; }
if ! diff <(normalise "$page") <(normalise "$tmp/ingressd.8") > "$tmp/diff"; then
  fail "$page is not what help2man makes of --help now; run: packaging/man/generate.sh $binary $page"
  cat "$tmp/diff"
fi

[ "$failures" -eq 0 ] || exit 1
echo "OK: $(echo "$from_help" | wc -l) options, $page matches --help"
