#!/usr/bin/env bash
# ctest packaging.install_layout: `cmake --install` of the current build puts every file where
# docs/operations.md says, for a system prefix and for an arbitrary one.
#
#   install_layout.sh BUILD_DIR SOURCE_DIR
#
#   --prefix /usr, DESTDIR=root  root/usr/bin/ingressd, root/etc/ingressd/ingressd.example.yaml
#                                (/etc, not /usr/etc), root/usr/lib/systemd/system/ingressd.service
#                                identical to packaging/systemd/ (its ExecStart is /usr/bin/ingressd),
#                                root/usr/lib/sysusers.d/ingressd.conf, docs in
#                                root/usr/share/doc/ingressd, root/etc/logrotate.d/ingressd,
#                                root/usr/share/man/man8/ingressd.8, the dashboard and rules in
#                                root/usr/share/ingressd, each as in the source tree; a config already at
#                                /etc/ingressd/ingressd.yaml is left as it was; nothing else.
#   --prefix TMP                 the same under TMP (config in TMP/etc/ingressd), a unit whose
#                                paths all point into TMP, nothing installed outside TMP.
set -euo pipefail
build=$1 source=$2
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The installed files are compared whole with the expected list, so that a stray or missing file
# shows up as a diff.
check_tree() {  # ROOT PREFIX SYSCONFDIR [EXTRA FILE...]
  local root=$1 prefix=${2#/} sysconfdir=${3#/}
  shift 3
  local want got
  want=$( { "$here/expected_layout.sh" "$source" "$prefix" "$sysconfdir"; [ $# -eq 0 ] || printf "%s\n" "$@"; } |
          LC_ALL=C sort)
  got=$(cd "$root" && find . \( -type f -o -type l \) | sed 's#^\./##' | LC_ALL=C sort)
  if [ "$want" != "$got" ]; then
    fail "installed files under $root differ from the expected layout (< expected, > installed):"
    diff <(echo "$want") <(echo "$got") | grep '^[<>]' || true
  fi
  [ -x "$root/$prefix/bin/ingressd" ] || fail "$root/$prefix/bin/ingressd is not executable"
  cmp -s "$root/$sysconfdir/ingressd/ingressd.example.yaml" "$source/config/ingressd.example.yaml" ||
    fail "the installed example config differs from config/ingressd.example.yaml"
  local installed shipped
  for pair in "$sysconfdir/logrotate.d/ingressd packaging/logrotate/ingressd" \
              "${prefix:+$prefix/}share/man/man8/ingressd.8 packaging/man/ingressd.8" \
              "${prefix:+$prefix/}share/ingressd/grafana/ingressd.json contrib/grafana/ingressd.json" \
              "${prefix:+$prefix/}share/ingressd/prometheus/ingressd.rules.yml contrib/prometheus/ingressd.rules.yml"; do
    read -r installed shipped <<<"$pair"
    cmp -s "$root/$installed" "$source/$shipped" || fail "$root/$installed differs from $shipped"
  done
  local version
  version=$("$root/$prefix/bin/ingressd" --version) || fail "installed binary: --version failed"
  [[ $version == "ingressd "* ]] || fail "installed binary: --version printed '$version'"
}

unit_value() { sed -n "s/^$2=//p" "$1" | tail -1; }

# A unit must name this install's paths, as they will be seen at run time (without DESTDIR).
check_unit_paths() {  # UNIT ROOT BINDIR CONFIG
  local unit=$1 root=$2 bindir=$3 config=$4 doc
  [ "$(unit_value "$unit" ExecStart)" = "$bindir/ingressd --config $config" ] ||
    fail "$unit: ExecStart=$(unit_value "$unit" ExecStart), expected '$bindir/ingressd --config $config'"
  doc=$(unit_value "$unit" Documentation)
  [[ $doc == file:* ]] && [ -f "$root${doc#file:}" ] || fail "$unit: Documentation=$doc is not an installed file"
}

# 1. The system install: prefix /usr into a staging root, over an existing real config.
root=$tmp/root
mkdir -p "$root/etc/ingressd"
echo "# the operator's own config" > "$root/etc/ingressd/ingressd.yaml"
DESTDIR=$root cmake --install "$build" --prefix /usr > "$tmp/install-usr.log" ||
  { cat "$tmp/install-usr.log"; exit 1; }
check_tree "$root" /usr /etc etc/ingressd/ingressd.yaml
[ "$(cat "$root/etc/ingressd/ingressd.yaml")" = "# the operator's own config" ] ||
  fail "cmake --install changed an existing /etc/ingressd/ingressd.yaml"
[ ! -e "$root/usr/etc" ] || fail "prefix /usr installed into /usr/etc (expected /etc)"
unit=$root/usr/lib/systemd/system/ingressd.service
cmp -s "$unit" "$source/packaging/systemd/ingressd.service" ||
  fail "for prefix /usr the installed unit must be packaging/systemd/ingressd.service as is"
check_unit_paths "$unit" "$root" /usr/bin /etc/ingressd/ingressd.yaml

# 2. An arbitrary prefix, no DESTDIR: every path moves with it.
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" > "$tmp/install-prefix.log" ||
  { cat "$tmp/install-prefix.log"; exit 1; }
check_tree "$prefix" "" etc
unit=$prefix/lib/systemd/system/ingressd.service
check_unit_paths "$unit" "" "$prefix/bin" "$prefix/etc/ingressd/ingressd.yaml"
outside=$(grep -v "^$prefix/" "$build/install_manifest.txt" || true)
[ -z "$outside" ] || fail "installed outside the prefix $prefix: $outside"
# The unit as installed here is complete (its binary exists), so systemd can judge it as is.
if command -v systemd-analyze >/dev/null; then
  complaints=$(systemd-analyze verify --man=no "$unit" 2>&1 | grep -F ingressd.service || true)
  [ -z "$complaints" ] || fail "systemd-analyze verify on the unit installed with --prefix $prefix: $complaints"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures problem(s); install logs:"; cat "$tmp"/install-*.log
  exit 1
fi
echo "OK: install layout for --prefix /usr (DESTDIR) and --prefix $prefix"
