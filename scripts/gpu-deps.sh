#!/usr/bin/env bash
# Downloads the Debian packages the GPU machine lacks into a folder (default build/gpu-deps)
# for scripts/gpu-check.sh's SMLA_GPU_DEPS: nothing is installed here or there.
#   scripts/gpu-deps.sh [DIR]     then carry DIR with the device call
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/gpu-deps}
mkdir -p "$dir"
cd "$dir"
apt-get download libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libhwy-dev libhwy1 libopenblas-dev \
  libopenblas0-pthread libopenblas-pthread-dev libopenblas0 libgfortran5 libgtest-dev libgmock-dev libbenchmark-dev \
  libbenchmark1debian libdlpack-dev >/dev/null
ls
