#!/usr/bin/env bash
# Builds everything (CUDA code too when nvcc is present) and runs every test,
# then rebuilds the CPU code with clang 14 under AddressSanitizer + UBSan and runs the tests again,
# the libFuzzer targets (fuzz/) included, each for a short bounded run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
cmake --preset ci
cmake --build --preset ci -j "$jobs"
ctest --preset ci -j "$jobs"
cmake --preset asan
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"
