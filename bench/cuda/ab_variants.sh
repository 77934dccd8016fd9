#!/usr/bin/env bash
# A/B timing of attention-kernel variants in one GPU call, after scripts/gpu-check.sh
# has configured and built build/gpu (it also unpacks SMLA_GPU_DEPS to /tmp/smla-deps).
#   bench/cuda/ab_variants.sh OUT_DIR VARIANT...
# VARIANT is "NAME@DIR" (DIR's tree copied over src/cuda, subfolders included) or
# "NAME:FILE:SED" (the sed expression applied to src/cuda/FILE). Each variant is
# built incrementally, its GPU tests run, timed on the decode cases that matter (b = 128,
# or AB_DECODE="LABEL..." at each batch size of AB_B, e.g. AB_B="2 128"; AB_DECODE="" for none) and the prefill cases of AB_PREFILL (a label filter, empty for none),
# each set AB_REPEAT times (default 1) in a row,
# then src/cuda is restored (build/gpu then holds the last variant's objects until the
# next build); "current" (the tree as carried) is timed first.
set -uo pipefail
out=$1
shift
deps=/tmp/smla-deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$deps/openblas-pthread:$deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
saved=$(mktemp -d)
cp -a src/cuda/. "$saved/"
build_log=/tmp/ab_build.log
bench() { build/gpu/bench/cuda/smla_bench_cuda --runs 20 --warmup 3 --check-max-b 0 --json /dev/null "$@"; }
time_set() {
  local round
  for round in $(seq "${AB_REPEAT:-1}"); do time_set_once "$1"; done
}
time_set_once() {
  {
    for b in ${AB_B:-128}; do
      for filter in ${AB_DECODE-CONFIG TP-h32 V3.2}; do bench --no-prefill --filter "$filter" --b "$b"; done
    done
    [[ -n "${AB_PREFILL:-}" ]] && bench --no-decode --filter "$AB_PREFILL"
  } 2>&1 | grep -vE "^(device|mma|cuBLASLt|case|prefill|$)" | sed "s/^/$1 /" | tee -a "$out/ab.log"
}
# "current" is the carried tree: after an earlier ab_variants.sh on a warm machine build/gpu
# holds that run's last variant (and no source manifest), so rebuild the carried tree first.
[[ -f build/gpu/.source-md5 ]] || find src/cuda -type f -exec touch {} +
if ! cmake --build build/gpu -j "$(nproc)" --target smla_bench_cuda cuda_attention_test >"$build_log" 2>&1; then
  echo "current: BUILD FAILED" | tee -a "$out/ab.log"
  tail -5 "$build_log"
  exit 1
fi
time_set current
for variant in "$@"; do
  name=${variant%%[@:]*}
  if [[ $variant == *@* ]]; then
    cp -r "${variant#*@}"/. src/cuda/
  else
    rest=${variant#*:}
    sed -i "${rest#*:}" "src/cuda/${rest%%:*}"
  fi
  if cmake --build build/gpu -j "$(nproc)" --target smla_bench_cuda cuda_attention_test >"$build_log" 2>&1; then
    build/gpu/tests/unit/cuda/cuda_attention_test --gtest_brief=1 2>&1 | grep -E "PASSED|FAILED" | head -3 |
      sed "s/^/$name tests: /" | tee -a "$out/ab.log"
    time_set "$name"
  else
    echo "$name: BUILD FAILED" | tee -a "$out/ab.log"
    tail -5 "$build_log"
  fi
  cp -r "$saved"/. src/cuda/  # fresh mtimes: the next build sees the change
done
rm -rf "$saved"
rm -f build/gpu/.source-md5  # build/gpu holds the last variant: the next scripts/gpu-check.sh rebuilds everything
