// CUDA backend registration. The generic smla::sparse_decode / sparse_prefill
// path runs on the legacy default stream with a workspace cached per device
// and grown on demand; serving code that needs graph capture uses the
// explicit-workspace entries of smla/cuda.h instead.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <array>
#include <mutex>

#include "smla/cuda.h"
#include "src/core/backend_ops.h"

namespace smla::detail {
namespace {

struct CachedWorkspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

std::mutex workspace_mutex;
std::array<CachedWorkspace, 64> workspaces{};

// Serialised by the caller holding workspace_mutex; every user of the buffer
// enqueues on the legacy default stream, so reuse is ordered on the device.
Expected<void*> cached_workspace(std::size_t bytes) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess || device < 0 || device >= static_cast<int>(workspaces.size())) {
    return internal_error(fmt::format("cuda: no usable current device ({})", cudaGetErrorString(error)));
  }
  CachedWorkspace& ws = workspaces[static_cast<std::size_t>(device)];
  if (ws.bytes < bytes) {
    if (ws.data != nullptr) cudaFree(ws.data);  // cudaFree waits for work still using it
    ws.data = nullptr;
    ws.bytes = 0;
    error = cudaMalloc(&ws.data, bytes);
    if (error != cudaSuccess) {
      ws.data = nullptr;
      return internal_error(fmt::format("cuda: workspace allocation of {} bytes failed: {}", bytes,
                                        cudaGetErrorString(error)));
    }
    ws.bytes = bytes;
  }
  return ws.data;
}

template <class Args, class SizeFn, class RunFn>
Status run_with_cached_workspace(const Args& args, SizeFn size_fn, RunFn run_fn) {
  auto bytes = size_fn(args);
  if (!bytes) return bytes.status();
  std::lock_guard<std::mutex> lock(workspace_mutex);
  auto workspace = cached_workspace(*bytes);
  if (!workspace) return workspace.status();
  return run_fn(args, *workspace, *bytes, nullptr);
}

Status decode_entry(const SparseDecodeArgs& args, const DecodeShape& /*shape*/) {
  return run_with_cached_workspace(args, cuda_sparse_decode_workspace_size, cuda_sparse_decode);
}

Status prefill_entry(const SparsePrefillArgs& args, const PrefillShape& /*shape*/) {
  return run_with_cached_workspace(args, cuda_sparse_prefill_workspace_size, cuda_sparse_prefill);
}

}  // namespace

const BackendOps* cuda_backend_ops() {
  static const bool has_device = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  static const BackendOps ops{Backend::kCuda, &decode_entry, &prefill_entry};
  return has_device ? &ops : nullptr;
}

}  // namespace smla::detail
