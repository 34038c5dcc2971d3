#!/usr/bin/env bash
# Writes ingressd(8) with help2man: NAME, SYNOPSIS, DESCRIPTION and OPTIONS come from the
# binary's own --help and --version, the other sections from ingressd.h2m. The result is
# committed as packaging/man/ingressd.8 (so that building needs no help2man), and ctest
# packaging.man_page regenerates it and fails when the two differ: after changing --help or the
# version, run
#
#   packaging/man/generate.sh build/release/ingressd packaging/man/ingressd.8
#
# Exit 77 when help2man is not installed (Debian: help2man).
set -euo pipefail
binary=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v help2man >/dev/null || { echo "help2man is not installed (Debian: help2man)" >&2; exit 77; }
help2man --no-info --section 8 --manual "System Administration" \
         --include "$here/ingressd.h2m" --output "$out" "$binary"
