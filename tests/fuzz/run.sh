#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, libFuzzer coverage everywhere) in
# build/fuzz and runs each one for N seconds over its seed corpus.
#
#   tests/fuzz/run.sh [seconds per target, default 20]
#
# Environment: JOBS (build parallelism, default 2), INGRESSD_FUZZ_BUILD (build dir).
# New interesting inputs go to build/fuzz/corpus/<target>/ (the seeds in tests/fuzz/corpus stay
# untouched); crashes go to build/fuzz/artifacts/ and make the script exit 1.
set -euo pipefail

secs="${1:-20}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${INGRESSD_FUZZ_BUILD:-$root/build/fuzz}"
jobs="${JOBS:-2}"

if ! command -v clang++ >/dev/null 2>&1; then
  echo "run.sh: clang++ not found (Debian: apt-get install clang)" >&2
  exit 1
fi
# libFuzzer's runtime ships in libclang-rt-<N>-dev on Debian.
if ! apt list --installed 2>/dev/null | grep -q '^libclang-rt'; then
  echo "run.sh: installing libclang-rt-14-dev (libFuzzer runtime)"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get install -y libclang-rt-14-dev
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Every library is built with ASan + UBSan and libFuzzer's coverage instrumentation. UBSan's
# `function` check is left out: clang 14 fails on C++20 coroutines with it ("Cannot represent a
# difference across sections", src/topology/source.cpp, src/health/checker.cpp).
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize=function -fno-sanitize-recover=all -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
  -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DINGRESSD_SANITIZE="" \
  -DINGRESSD_BUILD_TESTS=ON \
  -DINGRESSD_FUZZ=ON >/dev/null
cmake --build "$build" --target request_fuzz topology_fuzz config_fuzz router_reply_fuzz llm_meter_fuzz h2_fuzz -j "$jobs"

mkdir -p "$build/artifacts"
failed=()
for t in request topology config router_reply llm_meter h2; do
  bin="$build/tests/fuzz/${t}_fuzz"
  work="$build/corpus/$t"
  mkdir -p "$work"
  extra=()
  [ "$t" = request ] && extra=(-dict="$root/tests/fuzz/http.dict")
  [ "$t" = router_reply ] && extra=(-dict="$root/tests/fuzz/json.dict")
  [ "$t" = llm_meter ] && extra=(-dict="$root/tests/fuzz/json.dict")
  [ "$t" = h2 ] && extra=(-dict="$root/tests/fuzz/h2.dict")
  echo "=== ${t}_fuzz: ${secs}s"
  # `timeout` is a backstop: libFuzzer stops itself after max_total_time, or on a finding.
  if ! timeout -k 10 $((secs + 120)) "$bin" "${extra[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/${t}-" "$work" "$root/tests/fuzz/corpus/$t" 2>"$build/${t}_fuzz.log"; then
    failed+=("$t")
    tail -40 "$build/${t}_fuzz.log" >&2
  else
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)" "$build/${t}_fuzz.log" || true
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "run.sh: FAILED: ${failed[*]} (artifacts in $build/artifacts, logs in $build/*_fuzz.log)" >&2
  exit 1
fi
echo "run.sh: all fuzz targets ran ${secs}s without a finding"
