#!/usr/bin/env bash
# Installs the Debian packages smla builds with, when any is missing.
# Needs root for the install (CI and the project's machines run as root).
set -euo pipefail
packages=(cmake g++ make libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libfmt-dev
          nlohmann-json3-dev libhwy-dev libopenblas-dev
          # the Python package (smla._C over DLPack) and its tests
          python3-dev pybind11-dev libdlpack-dev python3-numpy python3-pytest python3-torch
          # the sanitizer stage is built by clang 14 with the libFuzzer targets; the ASan and
          # libFuzzer runtimes (libclang-rt-14-dev) are only a Recommends, so they are named
          clang-14 libclang-rt-14-dev libfuzzer-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "smla: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "smla: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
