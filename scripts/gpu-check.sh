#!/usr/bin/env bash
# One-shot GPU check for the CUDA backend, meant for a machine with an NVIDIA GPU:
# build (sm_90a by default), run the GPU tests, run compute-sanitizer (memcheck,
# racecheck, initcheck, synccheck) over them, then the GPU decode benchmark.
#   scripts/gpu-check.sh [OUT_DIR]      (OUT_DIR defaults to $OUT, else ./gpu-check-out)
# Environment: SMLA_CUDA_ARCHS (default 90a), SMLA_GPU_BENCH_ARGS (extra bench flags),
# SMLA_GPU_TESTS (test binaries to build and run, default all of tests/unit/cuda), SMLA_GTEST_FILTER,
# SMLA_GPU_EXTRA_TARGETS (more targets to build, e.g. smla_cli, the `smla` tool), SMLA_GPU_AFTER (a command run last, with the
# dependencies' libraries on LD_LIBRARY_PATH, e.g. "build/gpu/tools/smla/smla demo --backend cuda"),
# SMLA_SKIP_SANITIZER=1, SMLA_SKIP_BENCH=1, SMLA_SKIP_TESTS=1, SMLA_GPU_PROFILE="LABEL B" (Nsight Compute on the
# first attention launch of that bench case, e.g. "CONFIG2 128"), SMLA_GPU_DEPS=DIR (a folder of Debian .deb files
# for the build dependencies the GPU machine lacks: they are unpacked under /tmp/smla-deps
# and used from there, nothing is installed system-wide; scripts/gpu-deps.sh fills such a folder),
# SMLA_GPU_PEER=1 (with ../shared/peer copied to .peer: build FlashMLA's harness beside ours and run its
# decode and prefill sets after our benchmark, in the same call, with two prefill cases added to the copy's
# list by bench/peer_same_keys.py, FlashMLA over the keys of smla's direct V4 cases; $OUT/flashmla_peer.csv; then
# bench/side_by_side.py writes the bench/results JSON from gpu_bench.json and that CSV),
# SMLA_SKIP_PYTHON=1 (skip the Python package: build smla._C for the machine's python3, run
# python/tests on the GPU, the example and bench/python/host_overhead.py).
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
# The device copy of the checkout may carry a stale .git: pass SMLA_GPU_COMMIT=<hash> written out in the command
# (a $(git rev-parse ...) inside the command runs on the device and reads that stale copy).
echo "commit ${SMLA_GPU_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null) (read from the copied .git)}" | tee -a "$out/device.txt"

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

peer_build_pid=
if [[ "${SMLA_GPU_PEER:-0}" == 1 ]]; then
  [[ -f .peer/run.sh ]] || { echo "SMLA_GPU_PEER=1 needs .peer (cp -r ../shared/peer .peer, carried)"; exit 1; }
  # The direct V4 prefill cases' peer over as many keys (window + top-k), in the harness copy only.
  python3 bench/peer_same_keys.py .peer/harness/bench_flashmla.cu || status=1
  step "building the peer (FlashMLA harness) in the background"
  BUILD_ONLY=1 OUT=/tmp/peer-build bash .peer/run.sh >/tmp/peer-build.log 2>&1 &
  peer_build_pid=$!
fi

# Every GPU test binary (tests/unit/cuda/CMakeLists.txt) unless SMLA_GPU_TESTS names a subset.
tests=${SMLA_GPU_TESTS:-"cuda_attention_test cuda_attention_sm90_test cuda_attention_pack_test cuda_nonfinite_test cuda_dequant_exact_test cuda_layer_prep_test cuda_layer_indexer_test cuda_metadata_test cuda_model_test"}
[[ "${SMLA_SKIP_TESTS:-0}" == 1 ]] && tests=""  # e.g. a second call on a warm machine for the benchmarks
targets=($tests)
[[ "${SMLA_SKIP_BENCH:-0}" != 1 ]] && targets+=(smla_bench_cuda)
[[ -n "${SMLA_GPU_EXTRA_TARGETS:-}" ]] && targets+=($SMLA_GPU_EXTRA_TARGETS)
# With tests and benchmarks both skipped (an SMLA_GPU_AFTER run that builds its own), still build the library.
[[ ${#targets[@]} -eq 0 ]] && targets=(smla)
step "build (archs $archs, $jobs jobs, targets ${targets[*]})"
# A warm GPU machine keeps build/gpu between calls, but the copied sources may carry older
# mtimes than the objects there: touch every source whose content differs from the last
# build's (all of them when there is no record, e.g. after bench/cuda/ab_variants.sh).
manifest=build/gpu/.source-md5
mkdir -p build/gpu
find src include bench tests tools testkit -type f -print0 2>/dev/null | sort -z | xargs -0 md5sum >"$out/.source-md5"
if [[ -f $manifest ]]; then
  comm -13 <(sort "$manifest") <(sort "$out/.source-md5") | awk '{print $2}' | xargs -r touch
else
  awk '{print $2}' "$out/.source-md5" | xargs -r touch
fi
python_args=()
if [[ "${SMLA_SKIP_PYTHON:-0}" != 1 ]]; then
  targets+=(smla_python)
  python_args=(-DSMLA_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
fi
if ! { cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$archs" -DSMLA_BUILD_TESTS=ON \
       -DSMLA_BUILD_BENCH=ON "${dep_args[@]}" "${python_args[@]}" && cmake --build build/gpu -j "$jobs" --target "${targets[@]}"; } \
       >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  tail -20 "$out/build.log"
  echo "BUILD FAILED"
  exit 1
fi
mv "$out/.source-md5" "$manifest"
grep -E "Compiling entry|registers|spill" "$out/build.log" | grep -B1 -A1 sparse_attention | grep -E "registers|spill" | sort | uniq -c | head -20

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for test_name in $tests; do
  test_bin=build/gpu/tests/unit/cuda/$test_name
  step "GPU tests: $test_name"
  test_log=$(mktemp)
  if ! "$test_bin" --gtest_brief=1 ${SMLA_GTEST_FILTER:+--gtest_filter="$SMLA_GTEST_FILTER"} >"$test_log" 2>&1; then
    status=1
  fi
  tail -25 "$test_log"
  grep -qE "FAILED|SKIPPED" "$test_log" && status=1
  { echo "== $test_name"; cat "$test_log"; } >>"$out/tests.log"
  [[ "${SMLA_SKIP_SANITIZER:-0}" == 1 ]] && continue
  # Racecheck is slow: for the attention test, the cases that cover every kernel variant family and the combine.
  race_filter="*"
  [[ $test_name == cuda_attention_test ]] &&
    race_filter="CudaSparseDecode.V4TwoSourcesMatchesReference:CudaSparseDecode.ExplicitWorkspaceOnStream:CudaSparseDecode.V32Format:CudaSparsePrefill.*"
  for tool in memcheck racecheck initcheck synccheck; do
    filter=${SMLA_GTEST_FILTER:-*}
    [[ $tool == racecheck && -z "${SMLA_GTEST_FILTER:-}" ]] && filter=$race_filter
    sanitizer_log=$(mktemp)
    if ! timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 9 "$test_bin" --gtest_brief=1 --gtest_filter="$filter" \
         >"$sanitizer_log" 2>&1; then
      status=1
      echo "$test_name $tool: FAILED"
    else
      echo "$test_name $tool: clean"
    fi
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Uninitialized|Invalid|Race" "$sanitizer_log" | sort | uniq -c | head -8
    # One file for every sanitizer run: the device tool returns at most 8 files.
    { echo "== $test_name $tool"; head -c 2000000 "$sanitizer_log"; } >>"$out/sanitizer.log"
  done
done

if [[ "${SMLA_SKIP_PYTHON:-0}" != 1 ]]; then
  step "Python package: python/tests on the GPU ($(python3 -c 'import torch; print("torch", torch.__version__)'))"
  export PYTHONPATH="$PWD/build/gpu/python" PYTHONDONTWRITEBYTECODE=1
  python3 -m pytest -q -rs -p no:cacheprovider python/tests 2>&1 | tee "$out/python_tests.log" | tail -15
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
  python3 examples/python/flash_mla_decode_step.py --device cuda || status=1
  python3 bench/python/host_overhead.py --json "$out/python_overhead.json" || status=1
  unset PYTHONPATH
fi

if [[ "${SMLA_SKIP_BENCH:-0}" != 1 ]]; then
  step "benchmark"
  # shellcheck disable=SC2086
  if ! build/gpu/bench/cuda/smla_bench_cuda --json "$out/gpu_bench.json" ${SMLA_GPU_BENCH_ARGS:-} 2>&1 | tee "$out/bench.log"; then
    status=1
  fi
fi
if [[ -n "$peer_build_pid" ]]; then
  step "peer: FlashMLA decode and prefill sets, same card"
  wait "$peer_build_pid" || { tail -20 /tmp/peer-build.log; status=1; }
  for set in decode prefill; do
    OUT=/tmp/peer-$set bash .peer/run.sh --cases $set >/tmp/peer-$set.log 2>&1 || { tail -20 /tmp/peer-$set.log; status=1; }
  done
  { cat /tmp/peer-decode/flashmla_peer.csv; tail -n +2 /tmp/peer-prefill/flashmla_peer.csv; } >"$out/flashmla_peer.csv"
  tail -n 40 /tmp/peer-decode/flashmla_peer.log /tmp/peer-prefill/flashmla_peer.log 2>/dev/null | grep -vE "^$" | tail -60
fi

if [[ -n "${SMLA_GPU_PROFILE:-}" ]]; then
  read -r profile_label profile_b <<<"$SMLA_GPU_PROFILE"
  # SMLA_GPU_PROFILE_METRICS adds ncu metrics, e.g. "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio".
  step "ncu on $profile_label b=$profile_b"
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 300 "$ncu_bin" --clock-control none -k regex:attention_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
    ${SMLA_GPU_PROFILE_METRICS:+--metrics "$SMLA_GPU_PROFILE_METRICS"} build/gpu/bench/cuda/smla_bench_cuda --filter "$profile_label" --b "$profile_b" --runs 1 --warmup 0 \
    --check-max-b 0 --json /dev/null >"$out/ncu.log" 2>&1 || status=1
  grep -E "Duration|Throughput|Stall|Issue|Occupancy|Pipe|Bank|Registers|Shared Memory" "$out/ncu.log" | head -60
fi
if [[ -n "${SMLA_GPU_AFTER:-}" ]]; then
  # Runs with the unpacked dependencies on LD_LIBRARY_PATH (e.g. the CUDA demo or a disabled timing test).
  step "after: $SMLA_GPU_AFTER"
  bash -c "$SMLA_GPU_AFTER" 2>&1 | tee "$out/after.log" | tail -60
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
step "done, status $status"
exit $status
