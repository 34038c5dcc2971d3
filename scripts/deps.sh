#!/usr/bin/env bash
# Installs the Debian packages ingressd builds and tests with. Idempotent: runs apt only when
# something is missing. Needs root (or sudo) on a fresh Debian 12 machine.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config
          libboost1.81-all-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
          libssl-dev openssl libnghttp2-dev libgtest-dev libgmock-dev curl)
packages+=("$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
