#!/usr/bin/env bash
# CI for the container image, without a container engine: runs the build stage (build.sh) into a
# temporary staging root and checks what the runtime stage would get from it.
#
#   packaging/container/check.sh
#
#   - the staged tree is the install layout for prefix /usr, and nothing else;
#   - the staged binary runs: --version names the project version, --check-config accepts the
#     staged example config with a topology source given the way the image takes it;
#   - every shared library `ldd` finds for the staged binary belongs to a package in
#     runtime-packages.txt or to the base image's essential set, and every listed package is needed;
#   - the Containerfile uses build.sh's staging root, exposes the example config's ports and runs
#     the staged binary with /etc/ingressd/ingressd.yaml as a numeric unprivileged user it creates.
#
# Environment:
#   INGRESSD_BUILD_DIR  reuse this configured build directory (e.g. build/release, to save the
#                       build); by default build/container is deleted and built from scratch, as the
#                       image's build stage does.
#   JOBS                build parallelism (default: number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$(date +%s)
here=packaging/container
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

if [ -n "${INGRESSD_BUILD_DIR:-}" ]; then
  build_dir=$INGRESSD_BUILD_DIR
else
  build_dir=build/container
  rm -rf "$build_dir"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
staging=$tmp/staging

echo "=== container: build.sh (build dir $build_dir)"
INGRESSD_BUILD_DIR=$build_dir "$here/build.sh" "$staging"

echo "=== container: staged tree"
want=$(tests/packaging/expected_layout.sh . usr etc)
got=$(cd "$staging" && find . \( -type f -o -type l \) | sed 's#^\./##' | LC_ALL=C sort)
if [ "$want" != "$got" ]; then
  fail "staged files differ from the install layout (< expected, > staged):"
  diff <(echo "$want") <(echo "$got") | grep '^[<>]' || true
fi
cmp -s "$staging/usr/lib/systemd/system/ingressd.service" packaging/systemd/ingressd.service ||
  fail "the staged unit differs from packaging/systemd/ingressd.service (prefix /usr)"

echo "=== container: staged binary"
binary=$staging/usr/bin/ingressd
config=$staging/etc/ingressd/ingressd.example.yaml
project_version=$(sed -n 's/^project(ingressd VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
version=$("$binary" --version) || fail "--version exited $?"
[ "$version" = "ingressd $project_version" ] || fail "--version printed '$version', expected 'ingressd $project_version'"
# The example has no topology source, so on its own it must fail for that reason only (exit 2);
# with a source given as the image's arguments it is a complete configuration.
status=0
out=$("$binary" --config "$config" --check-config 2>&1) || status=$?
[ "$status" -eq 2 ] && [[ $out == *"no topology source"* ]] ||
  fail "--check-config on the bare example: expected exit 2 'no topology source', got $status: $out"
status=0
out=$("$binary" --config "$config" --ray-dashboard http://127.0.0.1:8265 --node-ip 127.0.0.1 --check-config 2>&1) ||
  status=$?
[ "$status" -eq 0 ] && [[ $out == *"configuration OK"* ]] ||
  fail "--check-config on the example with --ray-dashboard: exit $status: $out"
echo "$out"

echo "=== container: runtime libraries"
# The package that owns a library. On merged-/usr Debian, ldd reports /lib/... while the package
# may have registered /usr/lib/... (or the other way round), and the soname may be a symlink.
owner() {
  local path candidate real
  real=$(readlink -f "$1")
  for path in "$1" "$real"; do
    for candidate in "$path" "/usr$path" "${path#/usr}"; do
      dpkg -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1 && return 0
    done
  done
  return 1
}
essential=(libc6 libgcc-s1 libstdc++6)
mapfile -t listed < <(sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$here/runtime-packages.txt" | LC_ALL=C sort)
ldd_out=$(ldd "$binary")
if grep -q "not found" <<<"$ldd_out"; then fail "ldd: missing libraries: $(grep 'not found' <<<"$ldd_out")"; fi
needed=()
while read -r lib; do
  package=$(owner "$lib") || { fail "no Debian package owns $lib"; continue; }
  needed+=("$package")
  echo "  $lib  ($package)"
done < <(grep -o '/[^ ]*' <<<"$ldd_out")
mapfile -t needed < <(printf '%s\n' "${needed[@]}" | LC_ALL=C sort -u)
mapfile -t should_list < <(printf '%s\n' "${needed[@]}" | grep -vxF -f <(printf '%s\n' "${essential[@]}") || true)
if [ "${should_list[*]}" != "${listed[*]}" ]; then
  fail "$here/runtime-packages.txt lists '${listed[*]}'; the binary needs '${should_list[*]}' (beyond ${essential[*]})"
fi

echo "=== container: Containerfile"
containerfile=$here/Containerfile
grep -qx 'FROM debian:12 AS build' "$containerfile" || fail "the build stage must be FROM debian:12"
grep -qx 'FROM debian:12-slim' "$containerfile" || fail "the runtime stage must be FROM debian:12-slim"
grep -qx 'RUN packaging/container/build.sh /staging' "$containerfile" || fail "the build stage must run build.sh /staging"
grep -qx 'COPY --from=build /staging/ /' "$containerfile" || fail "the runtime stage must copy /staging/ to /"
grep -q 'runtime-packages.txt' "$containerfile" || fail "the runtime stage must install runtime-packages.txt"
port_of() { sed -n "s/^$1: *[^ ]*:\([0-9]*\).*/\1/p" "$config"; }
expose=$(sed -n 's/^EXPOSE //p' "$containerfile")
[ "$expose" = "$(port_of listen) $(port_of admin_listen)" ] ||
  fail "EXPOSE $expose; the example config listens on $(port_of listen) and $(port_of admin_listen)"
entrypoint=$(sed -n 's/^ENTRYPOINT //p' "$containerfile")
[ "$entrypoint" = '["/usr/bin/ingressd", "--config", "/etc/ingressd/ingressd.yaml"]' ] ||
  fail "ENTRYPOINT $entrypoint: expected the staged /usr/bin/ingressd with --config /etc/ingressd/ingressd.yaml"
user=$(sed -n 's/^USER //p' "$containerfile")
if [[ $user =~ ^([0-9]+):([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ne 0 ]; then
  # The user and group must exist in the image under those ids, or the process has no name.
  grep -q -- "--uid ${BASH_REMATCH[1]} --gid ${BASH_REMATCH[2]} " "$containerfile" &&
    grep -q -- "groupadd --gid ${BASH_REMATCH[2]} " "$containerfile" ||
    fail "USER $user: the Containerfile must create that user and group (useradd --uid --gid, groupadd --gid)"
else
  fail "USER must be a numeric unprivileged UID:GID, got '$user'"
fi

elapsed=$(( $(date +%s) - started ))
if [ "$failures" -ne 0 ]; then
  echo "=== container: $failures problem(s) (${elapsed}s)"
  exit 1
fi
echo "=== container: build steps and staged tree OK (${elapsed}s)"
