#!/usr/bin/env bash
# Installs shardscope's build dependencies from Debian packages. Idempotent: does nothing
# (and needs no network) when everything is already installed.
set -euo pipefail

packages=(
  cmake ninja-build g++ clang-14 libclang-rt-14-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libboost-graph-dev zlib1g-dev
  libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3
  openmpi-bin libopenmpi-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
