#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite: installs dependencies,
# builds and runs the unit and integration tests (release build), then the benchmark's quick gate
# (bench/run.sh --quick: fails when the router path serves less than 2x the req/s of HAProxy + Lua
# in the same run), then the container image's build steps from a clean build directory
# (packaging/container/check.sh), then the same suite under ASan+UBSan and TSan, then a short
# libFuzzer run of every fuzz target over its seed corpus (clang). Set INGRESSD_QUICK=1 to skip
# all but the first step.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tools ctest runs, none of them started as a service: systemd for systemd-analyze (the unit),
# prometheus for promtool (the rules), logrotate (the logrotate snippet), help2man (the man page
# held to --help), python3-yaml (the tests that read the rules), python3-grpcio and
# python3-websockets (the gRPC and WebSocket tests' clients and fake replicas)
scripts/deps.sh systemd prometheus logrotate help2man python3-yaml python3-grpcio python3-websockets
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
  # performance regressions: timed, so it runs alone, right after the release build it measures
  echo "=== bench: quick gate (bench/README.md)"
  bench/run.sh --quick
  JOBS="$jobs" packaging/container/check.sh
  run_suite asan
  run_suite tsan
  echo "=== fuzz: 15 s per target"
  scripts/deps.sh clang libclang-rt-14-dev
  JOBS="$jobs" tests/fuzz/run.sh 15
fi
echo "=== all suites passed"
