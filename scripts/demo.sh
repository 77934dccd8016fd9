#!/usr/bin/env bash
# The main job on the CPU: builds smla and runs it on a DeepSeek-V4 decode batch.
# Extra arguments go to the smla command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target smla_cli
exec build/cpu/tools/smla/smla attn "$@"
