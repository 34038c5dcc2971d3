#!/usr/bin/env bash
# ctest packaging.systemd_verify: `systemd-analyze verify` accepts the unit without a single
# complaint about it, and the sysusers entry creates the user and group the unit runs as.
#
#   systemd_verify.sh UNIT SYSUSERS BINARY
#
# verify refuses a unit whose ExecStart binary does not exist, so it checks a temporary copy
# whose ExecStart names BINARY (the built ingressd); everything else is verified as shipped.
# Exit 77 (ctest SKIP_RETURN_CODE) only when the systemd tools are not installed.
set -euo pipefail
unit=$1 sysusers=$2 binary=$3

for tool in systemd-analyze systemd-sysusers; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (Debian: systemd)"; exit 77; }
done
# Absolute: systemd-sysusers --root reads relative paths inside the root.
sysusers=$(realpath "$sysusers")
[ -x "$binary" ] || { echo "FAIL: $binary is not an executable"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
name=$(basename "$unit")
exec_start=$(grep -E '^ExecStart=' "$unit" | head -1)
shipped_binary=${exec_start#ExecStart=}
shipped_binary=${shipped_binary%% *}
[ -n "$shipped_binary" ] || { echo "FAIL: $unit has no ExecStart="; exit 1; }
sed "s#^ExecStart=${shipped_binary}#ExecStart=${binary}#" "$unit" > "$tmp/$name"
grep -qF "ExecStart=$binary " "$tmp/$name" || { echo "FAIL: could not point ExecStart at $binary"; exit 1; }

# verify exits 0 on many problems (unknown keys, unparseable values are only "ignoring" warnings),
# so every line that names the unit counts as a failure, not just the exit status.
status=0
out=$(systemd-analyze verify --man=no "$tmp/$name" 2>&1) || status=$?
complaints=$(grep -F "$name" <<<"$out" || true)
if [ "$status" -ne 0 ] || [ -n "$complaints" ]; then
  echo "FAIL: systemd-analyze verify (exit $status) on $unit:"
  echo "$out"
  exit 1
fi
[ -z "$out" ] || { echo "note: systemd-analyze said (not about $name):"; echo "$out"; }

# The unit's User=/Group= must be what the shipped sysusers entry creates.
user=$(sed -n 's/^User=//p' "$unit")
group=$(sed -n 's/^Group=//p' "$unit")
mkdir -p "$tmp/root/etc"
systemd-sysusers --root="$tmp/root" "$sysusers" >/dev/null 2>&1 || {
  echo "FAIL: systemd-sysusers rejects $sysusers:"; systemd-sysusers --root="$tmp/root" "$sysusers"; exit 1; }
entry=$(grep "^${user}:" "$tmp/root/etc/passwd" || true)
[ -n "$entry" ] || { echo "FAIL: $sysusers does not create User=$user"; cat "$tmp/root/etc/passwd"; exit 1; }
grep -q "^${group}:" "$tmp/root/etc/group" || { echo "FAIL: $sysusers does not create Group=$group"; exit 1; }
uid=$(cut -d: -f3 <<<"$entry")
# A system user: below 1000 on Debian, and never root.
if [ "$uid" -eq 0 ] || [ "$uid" -ge 1000 ]; then
  echo "FAIL: $user gets uid $uid, expected a system uid in 1..999"; exit 1
fi
echo "OK: $name verifies cleanly; $sysusers creates $user:$group (uid $uid)"
