#!/usr/bin/env bash
# A/B timing of attention-kernel variants in one GPU call, after scripts/gpu-check.sh
# has configured and built build/gpu (it also unpacks SMLA_GPU_DEPS to /tmp/smla-deps).
#   bench/cuda/ab_variants.sh OUT_DIR VARIANT...
# VARIANT is "NAME@DIR" (DIR's tree copied over src/cuda, subfolders included),
# "NAME:FILE:SED" (the sed expression applied to src/cuda/FILE; consecutive arguments
# of one NAME, e.g. a sed in each of two files, make one variant), "NAME+PATCH" (a
# patch of files under src/cuda applied by git apply from the repository root, e.g.
# bench/cuda/patches/*.patch) or "NAME%VAR=VALUE ..."
# (the carried tree's binary run with those environment settings, e.g.
# "nopair%SMLA_SM90_PAIR=off"; nothing is rebuilt). A rebuilt variant is built
# incrementally (its benchmark binary kept aside) and its GPU tests run; then
# "current" (the tree as carried) and every variant that built are timed in turn,
# AB_REPEAT rounds (default 1), interleaved case by case, so a drift of the card over
# the call (5-8% between rounds, docs/PERF.md, sessions 19 and 20) falls on all of them
# alike. Each round starts the order one variant later (round 2: variant 1, ..., current),
# because the first timed of a case ran up to 3% slower at b = 2 (docs/PERF.md, session 21):
# with as many rounds as variants, each is first once. AB_RUNS runs per timing (default
# 20, the median). Timed: the decode cases that matter (b = 128, or AB_DECODE="LABEL..."
# at each batch size of AB_B, e.g. AB_B="2 128"; AB_DECODE="" for none) and the prefill
# cases of AB_PREFILL (a label filter, empty for none). src/cuda is restored after each
# variant (build/gpu then holds the last variant's objects until the next build). AB_TESTS names the GPU
# test binaries each rebuilt variant runs (default cuda_attention_test).
set -uo pipefail
out=$1
shift
mkdir -p "$out"  # ab.log goes there from the first build on
deps=/tmp/smla-deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$deps/openblas-pthread:$deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
saved=$(mktemp -d)
binaries=$(mktemp -d)  # one benchmark binary per variant (the library is linked in statically)
cp -a src/cuda/. "$saved/"
build_log=/tmp/ab_build.log
# The timed cases, each one benchmark call's arguments.
# AB_CASES names another decode case file (e.g. bench/cases/gpu_small_batch.json); AB_B="all" times every b of a label.
cases=()
cases_arg=${AB_CASES:+--cases $AB_CASES}
for b in ${AB_B:-128}; do
  b_arg="--b $b"
  [[ $b == all ]] && b_arg=""
  for filter in ${AB_DECODE-CONFIG TP-h32 V3.2}; do cases+=("--no-prefill $cases_arg --filter $filter $b_arg"); done
done
# AB_MORE="FILE:LABEL ...": besides those, every b of LABEL in case file FILE (e.g.
# "bench/cases/gpu_small_batch.json:SB-"), so one call times two case sets with one build of each variant.
for more in ${AB_MORE:-}; do cases+=("--no-prefill --cases ${more%%:*} --filter ${more#*:}"); done
[[ -n "${AB_PREFILL:-}" ]] && cases+=("--no-decode --filter $AB_PREFILL")
declare -A settings  # NAME -> "VAR=VALUE ..." of a runtime-switch variant (its binary: current's)
time_case() {  # NAME CASE: one case with that variant's binary and settings
  local binary=$1 vars=()
  if [[ -n "${settings[$1]+set}" ]]; then
    binary=current
    read -r -a vars <<<"${settings[$1]}"
  fi
  # shellcheck disable=SC2086
  env "${vars[@]}" "$binaries/$binary" --runs "${AB_RUNS:-20}" --warmup 3 --check-max-b 0 --json /dev/null $2 2>&1 |
    grep -vE "^(device|mma|cuBLASLt|row gather|case|prefill|stage_us|$)" | sed "s/^/$1 /" | tee -a "$out/ab.log"
}
# The GPU test binaries built and run for every rebuilt variant (AB_TESTS, default the attention suite; e.g.
# AB_TESTS="cuda_attention_test cuda_attention_sm90_test cuda_nonfinite_test" for a change to the softmax).
read -r -a ab_tests <<<"${AB_TESTS:-cuda_attention_test}"
build() { cmake --build build/gpu -j "$(nproc)" --target smla_bench_cuda "${ab_tests[@]}" >"$build_log" 2>&1; }
# "current" is the carried tree: after an earlier ab_variants.sh on a warm machine build/gpu
# holds that run's last variant (and no source manifest), so rebuild the carried tree first.
[[ -f build/gpu/.source-md5 ]] || find src/cuda -type f -exec touch {} +
if ! build; then
  echo "current: BUILD FAILED" | tee -a "$out/ab.log"
  tail -5 "$build_log"
  exit 1
fi
cp build/gpu/bench/cuda/smla_bench_cuda "$binaries/current"
timed=(current)
rebuilt=0  # whether a variant's sources were built into build/gpu
variants=("$@")
name_of() { local v=$1; echo "${v%%[@:%+]*}"; }
for ((k = 0; k < ${#variants[@]}; ++k)); do
  variant=${variants[k]}
  name=$(name_of "$variant")
  kind=${variant:${#name}:1}
  if [[ $kind == % ]]; then
    settings[$name]=${variant#*%}
    timed+=("$name")
    continue
  fi
  if [[ $kind != @ && $kind != : && $kind != + ]]; then
    echo "$variant: not NAME@DIR, NAME:FILE:SED, NAME+PATCH or NAME%VAR=VALUE" | tee -a "$out/ab.log"
    continue
  fi
  # This edit and those of the arguments right after it with the same name: one build.
  unusable=0
  while :; do
    if [[ $kind == @ ]]; then
      cp -r "${variant#*@}"/. src/cuda/
    elif [[ $kind == + ]]; then
      patch_file=${variant#*+}
      if grep -E '^\+\+\+ ' "$patch_file" | grep -vqE '^\+\+\+ b/src/cuda/'; then
        echo "$name: $patch_file touches files outside src/cuda (only src/cuda is restored after a variant): skipped" |
          tee -a "$out/ab.log"
        unusable=1
      elif ! git apply "$patch_file"; then
        echo "$name: $patch_file does not apply: skipped" | tee -a "$out/ab.log"
        unusable=1
      fi
    else
      rest=${variant#*:}
      sed -i "${rest#*:}" "src/cuda/${rest%%:*}"
    fi
    next=${variants[k + 1]:-}
    [[ -n $next && $(name_of "$next") == "$name" && ${next:${#name}:1} =~ ^[@:+]$ ]] || break
    k=$((k + 1))
    variant=$next
    kind=${variant:${#name}:1}
  done
  if [[ $unusable == 1 ]]; then
    cp -r "$saved"/. src/cuda/
    continue
  fi
  rebuilt=1
  if build; then
    for test in "${ab_tests[@]}"; do
      build/gpu/tests/unit/cuda/"$test" --gtest_brief=1 2>&1 | grep -E "PASSED|FAILED" | head -3 |
        sed "s/^/$name $test: /" | tee -a "$out/ab.log"
    done
    cp build/gpu/bench/cuda/smla_bench_cuda "$binaries/$name"
    timed+=("$name")
  else
    echo "$name: BUILD FAILED" | tee -a "$out/ab.log"
    tail -5 "$build_log"
  fi
  cp -r "$saved"/. src/cuda/  # fresh mtimes: the next build sees the change
done
for round in $(seq "${AB_REPEAT:-1}"); do
  for case in "${cases[@]}"; do
    for i in "${!timed[@]}"; do
      time_case "${timed[$(((i + round - 1) % ${#timed[@]}))]}" "$case"
    done
  done
done
rm -rf "$saved" "$binaries"
# build/gpu holds the last rebuilt variant, if any: then the next scripts/gpu-check.sh rebuilds everything.
[[ $rebuilt == 1 ]] && rm -f build/gpu/.source-md5
