#!/usr/bin/env bash
# The build stage of the container image (Containerfile), kept as a plain script so that CI runs
# exactly these steps without a container engine (check.sh): installs the build dependencies,
# configures and builds the release preset, and installs it with prefix /usr into STAGING
# (DESTDIR), the tree the runtime stage copies to /.
#
#   packaging/container/build.sh STAGING
#
# Environment:
#   INGRESSD_BUILD_DIR  build directory (default build/container). A directory that is already
#                       configured (e.g. build/release) is reused with its own settings; only the
#                       ingressd target is built in it.
#   JOBS                build parallelism (default: number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 1 ] || { echo "usage: $0 STAGING" >&2; exit 2; }
# Absolute: DESTDIR is prepended to absolute install paths verbatim.
staging=$(realpath -m "$1")
build_dir=${INGRESSD_BUILD_DIR:-build/container}
jobs=${JOBS:-$(nproc)}
# The runtime stage copies the whole tree to /: anything left over would end up in the image.
if [ -d "$staging" ] && [ -n "$(ls -A "$staging")" ]; then
  echo "build.sh: $staging is not empty" >&2
  exit 2
fi

scripts/deps.sh
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  # No tests: the image needs the daemon only (CI runs the suites on the same sources).
  cmake --preset release -B "$build_dir" -DINGRESSD_BUILD_TESTS=OFF
fi
cmake --build "$build_dir" --target ingressd -j"$jobs"
# --prefix here, not at configure time, so that a reused build directory installs the same tree.
# --strip: debug info is 60 of the binary's 62 MB, and nothing in the image reads it.
DESTDIR=$staging cmake --install "$build_dir" --prefix /usr --strip
