#!/usr/bin/env bash
# Every kernel of one smla decode case and of the same FlashMLA peer case under Nsight Compute
# (caches flushed before each kernel, clocks left alone): name, grid, duration, compute and memory
# throughput, issue activity. Where a small-batch step's time goes, kernel by kernel.
#   bench/cuda/ncu_kernel_times.sh OUT_DIR "LABEL B PEER_CASE" ...
# e.g. bench/cuda/ncu_kernel_times.sh "$OUT" "SQ1-CONFIG1 1 MODEL1_CONFIG1_SQ1" "CONFIG2 2 MODEL1_CONFIG2"
# Needs build/gpu/bench/cuda/smla_bench_cuda (scripts/gpu-check.sh) and, for the peer (PEER_CASE "-" skips
# it), /tmp/flashmla_peer_build/bench_flashmla (.peer/run.sh). Writes OUT_DIR/ncu_kernel_times.txt.
set -uo pipefail
out=$1
shift
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
report="$out/ncu_kernel_times.txt"
# One line per kernel from ncu's details page.
summarise() {
  awk '
    function flush() {
      if (kernel != "") printf "  %-64.64s %-14s %10s us  SM %6s%%  mem %6s%%  eligible %6s%%\n", kernel, grid, duration, sm, mem, eligible
      kernel = ""
    }
    / Context [0-9]+, Stream [0-9]+/ {
      flush()
      at = match($0, / \([0-9]+, [0-9]+, [0-9]+\)x\(/)
      kernel = substr($0, 1, at - 1); sub(/^ +/, "", kernel)
      grid = substr($0, at + 1); sub(/x\(.*/, "", grid); gsub(/ /, "", grid)
      duration = sm = mem = eligible = "-"
    }
    $1 == "Duration" { v = $3; gsub(/,/, "", v); duration = $2 == "ms" ? v * 1000 : $2 == "ns" ? v / 1000 : v }
    $1 == "Compute" && $2 == "(SM)" { sm = $NF }
    $1 == "Memory" && $2 == "Throughput" && $3 == "%" { mem = $NF }
    $1 == "One" && $2 == "or" && $3 == "More" { eligible = $NF }
    END { flush() }
  '
}
for spec in "$@"; do
  read -r label b peer_case <<<"$spec"
  {
    echo "== smla $label b=$b"
    timeout 240 "$ncu" --clock-control none -k 'regex:attention|combine|pack_union' --section SpeedOfLight \
      --section SchedulerStats build/gpu/bench/cuda/smla_bench_cuda --no-prefill --filter "$label" --b "$b" \
      --runs 1 --warmup 0 --check-max-b 0 --json /dev/null 2>&1 | summarise
    if [[ $peer_case != - ]]; then
      echo "== FlashMLA $peer_case b=$b"
      timeout 240 "$ncu" --clock-control none -k 'regex:splitkv|combine|sched' --section SpeedOfLight \
        --section SchedulerStats /tmp/flashmla_peer_build/bench_flashmla --cases "$peer_case" --b "$b" --iters 1 \
        --warmup 0 --no-ref 2>&1 | summarise
    fi
  } | tee -a "$report"
done
