#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running demo: installs dependencies, builds a
# release binary and starts `ingressd --demo` (contract §8). Extra arguments go to ingressd.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DINGRESSD_BUILD_TESTS=OFF >/dev/null
cmake --build build/release --target ingressd -j"$(nproc)"
# Run as the systemd unit runs it (its allocator setting; docs/operations.md, "Memory allocator").
tunables=$(sed -n 's/^Environment=GLIBC_TUNABLES=//p' packaging/systemd/ingressd.service)
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-$tunables}
exec build/release/ingressd --demo "$@"
