#!/usr/bin/env bash
# A/B of runtime switches in one GPU call, after scripts/gpu-check.sh built build/gpu:
#   bench/cuda/env_ab.sh OUT_DIR "NAME[:VAR=VALUE ...]"...
# e.g. env_ab.sh out default "nopair:SMLA_SM90_PAIR=off" "prefetch:SMLA_SM90_PREFETCH=on".
# Every setting is timed twice, interleaved (card noise), on the AB_DECODE labels at
# AB_B (default "CONFIG2 CONFIG4 V3.2" at 64) and the AB_PREFILL label filter (default PFD).
set -uo pipefail
out=$1
shift
deps=/tmp/smla-deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$deps/openblas-pthread:$deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bench() { build/gpu/bench/cuda/smla_bench_cuda --runs 20 --warmup 3 --check-max-b 0 --json /dev/null "$@"; }
for pass in 1 2; do
  for setting in "$@"; do
    name=${setting%%:*}
    vars=()
    [[ $setting == *:* ]] && read -r -a vars <<<"${setting#*:}"
    {
      for filter in ${AB_DECODE-CONFIG2 CONFIG4 V3.2}; do env "${vars[@]}" bash -c "$(declare -f bench); bench --no-prefill --filter $filter --b ${AB_B:-64}"; done
      [[ -n "${AB_PREFILL-PFD}" ]] && env "${vars[@]}" bash -c "$(declare -f bench); bench --no-decode --filter ${AB_PREFILL-PFD}"
    } 2>&1 | grep -vE "^(device|mma|cuBLASLt|case|prefill|$)" | sed "s/^/$name.$pass /" | tee -a "$out/ab.log"
  done
done
