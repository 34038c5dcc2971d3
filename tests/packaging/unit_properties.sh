#!/usr/bin/env bash
# ctest packaging.unit_properties: the systemd unit has the settings docs/operations.md promises.
#
#   unit_properties.sh UNIT EXAMPLE_CONFIG CONTAINERFILE
#
# The drain and connection defaults are read from EXAMPLE_CONFIG (config/ingressd.example.yaml,
# which a unit test holds equal to the compiled-in defaults), so they are written down only once.
set -euo pipefail
unit=$1 example=$2 containerfile=$3
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The value systemd uses: the last assignment in [Service] wins.
service_value() {
  awk -v key="$1" '
    /^\[/ { in_service = ($0 == "[Service]") }
    in_service && index($0, key "=") == 1 { value = substr($0, length(key) + 2) }
    END { print value }' "$unit"
}

# A key from the example config: "drain.timeout" -> the value under "drain:", comment stripped.
example_value() {
  awk -v section="${1%%.*}" -v key="${1#*.}" '
    /^[^ #][^:]*:/ { current = substr($0, 1, index($0, ":") - 1) }
    current == section && $1 == key ":" { sub(/#.*/, ""); print $2; exit }' "$example"
}

# ingressd durations (250ms, 30s, 2m, 1h, 0) in milliseconds.
ingressd_ms() {
  local v=$1
  case "$v" in
    0) echo 0 ;;
    *ms) echo "${v%ms}" ;;
    *s) echo $(( ${v%s} * 1000 )) ;;
    *m) echo $(( ${v%m} * 60000 )) ;;
    *h) echo $(( ${v%h} * 3600000 )) ;;
    *) echo "cannot read ingressd duration '$v'" >&2; return 1 ;;
  esac
}

# systemd time spans (660, 660s, 11min, "10min 60s", infinity) in milliseconds; infinity = -1.
systemd_ms() {
  local total=0 token number unit
  [ "$1" = infinity ] && { echo -1; return; }
  for token in $1; do
    [[ $token =~ ^([0-9]+)([a-z]*)$ ]] || { echo "cannot read systemd time span '$1'" >&2; return 1; }
    number=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
    case "$unit" in
      ms|msec) total=$(( total + number )) ;;
      ""|s|sec|second|seconds) total=$(( total + number * 1000 )) ;;
      m|min|minute|minutes) total=$(( total + number * 60000 )) ;;
      h|hr|hour|hours) total=$(( total + number * 3600000 )) ;;
      *) echo "unsupported unit '$unit' in '$1'" >&2; return 1 ;;
    esac
  done
  echo "$total"
}

is_yes() { [[ $1 =~ ^(yes|true|on|1)$ ]]; }

user=$(service_value User)
if [ -z "$user" ] || [ "$user" = root ] || [ "$user" = 0 ]; then
  fail "User= must name an unprivileged user, got '${user}'"
fi

exec_start=$(service_value ExecStart)
[[ " $exec_start " == *" --config /etc/ingressd/ingressd.yaml "* ]] ||
  fail "ExecStart= must read /etc/ingressd/ingressd.yaml, got '$exec_start'"
[[ $exec_start == /* ]] || fail "ExecStart= must start with an absolute path, got '$exec_start'"

[ "$(service_value Restart)" = on-failure ] || fail "Restart= must be on-failure, got '$(service_value Restart)'"

reload=$(service_value ExecReload)
[[ $reload =~ kill\ +(-HUP|-SIGHUP|-1|-s\ +HUP|-s\ +SIGHUP)\ +\$MAINPID$ ]] ||
  fail "ExecReload= must send SIGHUP to \$MAINPID, got '$reload'"

kill_signal=$(service_value KillSignal)
[[ $kill_signal =~ ^(SIG)?TERM$ ]] || fail "KillSignal= must be SIGTERM, got '$kill_signal'"

# systemd must wait out the whole drain: drain.timeout starts after drain.min_period.
min_period=$(example_value drain.min_period)
drain_timeout=$(example_value drain.timeout)
[ -n "$min_period" ] && [ -n "$drain_timeout" ] || fail "no drain.min_period / drain.timeout in $example"
drain_ms=$(( $(ingressd_ms "$min_period") + $(ingressd_ms "$drain_timeout") ))
stop=$(service_value TimeoutStopSec)
if [ -z "$stop" ]; then
  fail "TimeoutStopSec= is not set (systemd's default, 90s, cuts the drain short)"
else
  stop_ms=$(systemd_ms "$stop")
  if [ "$stop_ms" -ne -1 ] && [ "$stop_ms" -le "$drain_ms" ]; then
    fail "TimeoutStopSec=$stop must be longer than drain.min_period + drain.timeout ($min_period + $drain_timeout)"
  fi
fi

is_yes "$(service_value NoNewPrivileges)" || fail "NoNewPrivileges= must be yes, got '$(service_value NoNewPrivileges)'"
[ "$(service_value ProtectSystem)" = strict ] || fail "ProtectSystem= must be strict, got '$(service_value ProtectSystem)'"

# Each client connection can hold a second descriptor towards a replica or router.
nofile=$(service_value LimitNOFILE)
max_connections=$(example_value client.max_connections)
if [ -z "$nofile" ]; then
  fail "LimitNOFILE= is not set (the default soft limit, 1024, caps connections far below client.max_connections)"
elif [ "$nofile" != infinity ]; then
  soft=${nofile%%:*}
  [[ $soft =~ ^[0-9]+$ ]] || fail "LimitNOFILE=$nofile is not a number"
  [[ $soft =~ ^[0-9]+$ ]] && [ "$soft" -lt $(( 2 * max_connections )) ] &&
    fail "LimitNOFILE=$nofile is below 2 x client.max_connections ($max_connections)"
fi

# The allocator tuning the benchmark measures ingressd with (bench/run.sh reads it from the unit):
# the container image must run with the same.
tunables=$(service_value Environment)
[[ $tunables == GLIBC_TUNABLES=*glibc.malloc.tcache_count=* ]] ||
  fail "Environment= must set GLIBC_TUNABLES with glibc.malloc.tcache_count, got '$tunables'"
grep -qxF "ENV $tunables" "$containerfile" || fail "$containerfile must have 'ENV $tunables' (the unit's setting)"

if [ "$failures" -ne 0 ]; then
  echo "$failures problem(s) in $unit"
  exit 1
fi
echo "OK: $unit (drain $min_period + $drain_timeout < TimeoutStopSec=$stop; LimitNOFILE=$nofile for $max_connections connections)"
