#!/usr/bin/env bash
# The main job on the CPU: builds smla and serves a DeepSeek-V4-shaped layer stack
# (chunked prefill, then MTP decode steps) with `smla demo`, verified against the
# float64 reference.
# Extra arguments go to the smla command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target smla_cli
exec build/cpu/tools/smla/smla demo --backend cpu "$@"
