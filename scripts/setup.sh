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
  # The Python module (python/, pybind11 over Debian's /usr/bin/python3) and the notebooks
  # (notebooks/, executed by nbconvert on the python3 kernel in ctest's "notebooks" test).
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-matplotlib python3-pandas
  python3-ipykernel python3-nbformat python3-nbclient jupyter-nbconvert
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
