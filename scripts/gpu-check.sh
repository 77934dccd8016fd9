#!/usr/bin/env bash
# One-shot GPU check for the CUDA backend, meant for a machine with an NVIDIA GPU:
# build (sm_90a by default), run the GPU tests, run compute-sanitizer (memcheck,
# racecheck, initcheck) over them, then the GPU decode benchmark.
#   scripts/gpu-check.sh [OUT_DIR]      (OUT_DIR defaults to $OUT, else ./gpu-check-out)
# Environment: SMLA_CUDA_ARCHS (default 90a), SMLA_GPU_BENCH_ARGS (extra bench flags),
# SMLA_SKIP_SANITIZER=1, SMLA_SKIP_BENCH=1, SMLA_GPU_PROFILE="LABEL B" (Nsight Compute on the
# first attention launch of that bench case, e.g. "CONFIG2 128"), SMLA_GPU_DEPS=DIR (a folder of Debian .deb files
# for the build dependencies the GPU machine lacks: they are unpacked under /tmp/smla-deps
# and used from there, nothing is installed system-wide).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out"
jobs=$(nproc)
archs=${SMLA_CUDA_ARCHS:-90a}
status=0
step() { echo "== $* ($(date -u +%H:%M:%S))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv | tee "$out/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$out/device.txt"

dep_args=()
if [[ -n "${SMLA_GPU_DEPS:-}" ]]; then
  step "unpacking build dependencies from $SMLA_GPU_DEPS"
  prefix=/tmp/smla-deps
  mkdir -p "$prefix"
  for deb in "$SMLA_GPU_DEPS"/*.deb; do dpkg -x "$deb" "$prefix"; done
  multiarch=$prefix/usr/lib/x86_64-linux-gnu
  blas_dir=$multiarch/openblas-pthread
  export LD_LIBRARY_PATH="$blas_dir:$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  dep_args=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DBLAS_LIBRARIES="$blas_dir/libopenblas.so"
            -DCMAKE_CXX_FLAGS="-I$prefix/usr/include/x86_64-linux-gnu/openblas-pthread -I$prefix/usr/include"
            -DCMAKE_EXE_LINKER_FLAGS="-L$multiarch -Wl,-rpath-link,$multiarch")
fi

step "build (archs $archs, $jobs jobs)"
if ! { cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$archs" -DSMLA_BUILD_TESTS=ON \
       -DSMLA_BUILD_BENCH=ON "${dep_args[@]}" && cmake --build build/gpu -j "$jobs" --target cuda_attention_test smla_bench_cuda; } \
       >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "BUILD FAILED"
  exit 1
fi
grep -E "Compiling entry|registers|spill" "$out/build.log" | grep -B1 -A1 sparse_attention | grep -E "registers|spill" | sort | uniq -c | head -20
test_bin=build/gpu/tests/unit/cuda/cuda_attention_test

step "GPU tests"
if ! "$test_bin" --gtest_brief=1 2>&1 | tee "$out/tests.log" | tail -25; then status=1; fi
grep -qE "FAILED|SKIPPED" "$out/tests.log" && status=1

if [[ "${SMLA_SKIP_SANITIZER:-0}" != 1 ]]; then
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Racecheck is slow: the cases that cover every kernel variant family and the combine.
  race_filter="CudaSparseDecode.V4TwoSourcesMatchesReference:CudaSparseDecode.ExplicitWorkspaceOnStream:CudaSparseDecode.V32Format:CudaSparsePrefill.*"
  for tool in memcheck racecheck initcheck; do
    step "compute-sanitizer $tool"
    filter="*"
    [[ $tool == racecheck ]] && filter=$race_filter
    if ! timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 9 "$test_bin" --gtest_brief=1 --gtest_filter="$filter" \
         >"$out/sanitizer_$tool.log" 2>&1; then
      status=1
      echo "$tool: FAILED"
    else
      echo "$tool: clean"
    fi
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Uninitialized|Invalid|Race" "$out/sanitizer_$tool.log" | sort | uniq -c | head -8
  done
fi

if [[ "${SMLA_SKIP_BENCH:-0}" != 1 ]]; then
  step "benchmark"
  # shellcheck disable=SC2086
  if ! build/gpu/bench/cuda/smla_bench_cuda --json "$out/gpu_bench.json" ${SMLA_GPU_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"; then
    status=1
  fi
fi
if [[ -n "${SMLA_GPU_PROFILE:-}" ]]; then
  read -r profile_label profile_b <<<"$SMLA_GPU_PROFILE"
  step "ncu on $profile_label b=$profile_b"
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 300 "$ncu_bin" -k regex:sparse_attention_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
    build/gpu/bench/cuda/smla_bench_cuda --filter "$profile_label" --b "$profile_b" --runs 1 --warmup 0 \
    --check-max-b 0 --json /dev/null >"$out/ncu.log" 2>&1 || status=1
  grep -E "Duration|Throughput|Stall|Issue|Occupancy|Pipe|Bank|Registers|Shared Memory" "$out/ncu.log" | head -60
fi
step "done, status $status"
exit $status
