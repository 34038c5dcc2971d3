#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite: installs dependencies,
# builds and runs the unit and integration tests (release build), then the same suite under
# ASan+UBSan and TSan. Set INGRESSD_QUICK=1 to skip the sanitizer builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
run_suite() {
  local preset=$1
  echo "=== ${preset}: configure and build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j"$jobs"
  echo "=== ${preset}: test"
  ctest --preset "$preset" -j"$jobs"
}
run_suite release
if [ "${INGRESSD_QUICK:-0}" != 1 ]; then
  run_suite asan
  run_suite tsan
fi
echo "=== all suites passed"
