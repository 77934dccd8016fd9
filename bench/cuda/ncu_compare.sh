#!/usr/bin/env bash
# Nsight Compute on one smla bench case and one FlashMLA peer case, same sections,
# plus per-instruction stall samples (SASS, CSV) for both, for the GPU machine:
#   bench/cuda/ncu_compare.sh OUT_DIR SMLA_FILTER PEER_CASE [SMLA_KERNEL_REGEX PEER_KERNEL_REGEX]
# (PEER_CASE "-": smla only, no peer build needed)
# e.g. bench/cuda/ncu_compare.sh "$OUT" PF-V4-h128 PF_MODEL1_C2_h128_k1024
# Needs build/gpu/bench/cuda/smla_bench_cuda (scripts/gpu-check.sh) and the peer harness
# built by .peer/run.sh (/tmp/flashmla_peer_build/bench_flashmla). The first matching launch
# of each is profiled (a warm-up run of the case). SMLA_BENCH_ARGS (default --no-decode) and PEER_ARGS
# (default none) pick other cases, e.g. decode: SMLA_BENCH_ARGS="--no-prefill --b 128" PEER_ARGS="--b 128"
# bench/cuda/ncu_compare.sh "$OUT" CONFIG2 MODEL1_CONFIG2 regex:sm90_attention_kernel regex:splitkv
# Everything goes into OUT_DIR/ncu.tar.gz (the device tool returns at most 8 files), with
# NAME.summary.txt (bench/cuda/ncu_sass_summary.py: stall samples by reason, region, instruction).
set -uo pipefail
final_out=$1 smla_filter=$2 peer_case=$3
out=$(mktemp -d)
smla_kernel=${4:-regex:sm90_(attention|alternating)_kernel}  # the FP8 kernel, or the copying one (prefill)
peer_kernel=${5:-regex:sparse_attn_fwd_kernel}
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
          --section InstructionStats --section LaunchStats --section Occupancy --section SourceCounters)
metrics="sm__inst_executed_pipe_tensor_op_gmma.sum,"
metrics+="l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,"
metrics+="l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg"

profile() {  # name kernel_regex command...
  local name=$1 kernel=$2
  shift 2
  timeout 240 "$ncu" --clock-control none --import-source no -k "$kernel" -c 1 "${sections[@]}" --metrics "$metrics" \
    -o "/tmp/$name" -f "$@" >"/tmp/$name.run.log" 2>&1 || { echo "ncu $name failed"; tail -20 "/tmp/$name.run.log"; }
  "$ncu" -i "/tmp/$name.ncu-rep" --page details >"$out/$name.details.txt" 2>&1
  "$ncu" -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass >"$out/$name.sass.csv" 2>&1
  grep -E "Duration|Elapsed Cycles|Throughput|gmma|wavefronts|bank|Stall|Issue Slot|Registers|Warp Cycles" \
    "$out/$name.details.txt" | head -40
  python3 "$(dirname "$0")/ncu_sass_summary.py" "$out/$name.sass.csv" --regions >"$out/$name.summary.txt" 2>&1
  head -30 "$out/$name.summary.txt"
}
read -r -a smla_args <<<"${SMLA_BENCH_ARGS:---no-decode}"
read -r -a peer_args <<<"${PEER_ARGS:-}"
profile smla "$smla_kernel" build/gpu/bench/cuda/smla_bench_cuda "${smla_args[@]}" --filter "$smla_filter" --runs 1 \
  --warmup 0 --check-max-b 0 --json /dev/null
[[ $peer_case == - ]] || profile peer "$peer_kernel" /tmp/flashmla_peer_build/bench_flashmla --cases "$peer_case" \
  "${peer_args[@]}" --iters 1 --warmup 0 --no-ref
tar -czf "$final_out/ncu.tar.gz" -C "$out" .
