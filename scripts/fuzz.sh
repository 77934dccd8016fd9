#!/usr/bin/env bash
# Runs one libFuzzer target for a while: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
# TARGET: npy, manifest, plan_batch, step_metadata, index_transforms, attention.
# Builds it in the asan preset (clang, ASan + UBSan) when needed, fuzzes with the
# seed corpus fuzz/corpus/TARGET (read only; new inputs go to build/asan/fuzz/corpus_TARGET),
# one job, and prints libFuzzer's final line ("Done N runs in S second(s)").
# A crash or sanitizer report stops it with a non-zero exit; the input is in
# build/asan/fuzz/artifacts_TARGET/. Extra options pass through, e.g. -runs=10000000.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]" >&2
  echo "targets: $(ls fuzz/corpus | tr '\n' ' ')" >&2
  exit 2
fi
target=$1
seconds=$2
shift 2
if [ ! -d "fuzz/corpus/$target" ]; then
  echo "scripts/fuzz.sh: unknown target '$target' (targets: $(ls fuzz/corpus | tr '\n' ' '))" >&2
  exit 2
fi
if [ ! -f build/asan/CMakeCache.txt ]; then cmake --preset asan >/dev/null; fi
cmake --build --preset asan -j "${SMLA_FUZZ_BUILD_JOBS:-2}" --target "fuzz_$target" >/dev/null
work="build/asan/fuzz"
mkdir -p "$work/corpus_$target" "$work/artifacts_$target"
dict=()
if [ -f "fuzz/dict/$target.dict" ]; then dict=(-dict="fuzz/dict/$target.dict"); fi
exec "$work/fuzz_$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts_$target/" "${dict[@]}" "$@" "$work/corpus_$target" "fuzz/corpus/$target"
