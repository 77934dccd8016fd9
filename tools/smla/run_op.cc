#include "tools/smla/run_op.h"

#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "testkit/testkit.h"

#if defined(SMLA_HAS_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace smla::cli {

namespace {

Status call(const SparseDecodeArgs& args, Backend backend) { return sparse_decode(args, backend); }
Status call(const SparsePrefillArgs& args, Backend backend) { return sparse_prefill(args, backend); }

#if defined(SMLA_HAS_CUDA)

Status cuda_status(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::Ok();
  return internal_error(fmt::format("{}: {}", what, cudaGetErrorString(error)));
}

// Device copies of host views; frees them on destruction.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror() {
    for (void* allocation : allocations_) cudaFree(allocation);
  }

  // Replaces *view (when present) with a device copy of the same bytes.
  Status upload(TensorView* view) {
    if (!view->present()) return Status::Ok();
    const std::size_t bytes = testkit::storage_bytes(*view);
    int device = 0;
    SMLA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
    void* data = nullptr;
    SMLA_RETURN_IF_ERROR(cuda_status(cudaMalloc(&data, bytes > 0 ? bytes : 1), "cudaMalloc"));
    allocations_.push_back(data);
    if (bytes > 0) {
      SMLA_RETURN_IF_ERROR(cuda_status(cudaMemcpy(data, view->data, bytes, cudaMemcpyHostToDevice), "copy to device"));
    }
    view->data = data;
    view->device = Device{DeviceKind::kCuda, device};
    return Status::Ok();
  }
  Status upload(KvCacheView* cache) { return upload(&cache->pages); }

  // Copies a device view back over the host view it was made from.
  static Status download(const TensorView& device, const TensorView& host) {
    if (!host.present()) return Status::Ok();
    const std::size_t bytes = testkit::storage_bytes(host);
    if (bytes == 0) return Status::Ok();
    return cuda_status(cudaMemcpy(host.data, device.data, bytes, cudaMemcpyDeviceToHost), "copy to host");
  }

 private:
  std::vector<void*> allocations_;
};

Status upload_all(DeviceMirror& mirror, SparseDecodeArgs& a) {
  for (TensorView* view : {&a.q, &a.main_indices, &a.main_lengths, &a.extra_indices, &a.extra_lengths, &a.sink,
                           &a.out, &a.lse}) {
    SMLA_RETURN_IF_ERROR(mirror.upload(view));
  }
  SMLA_RETURN_IF_ERROR(mirror.upload(&a.main_cache));
  if (a.extra_cache) SMLA_RETURN_IF_ERROR(mirror.upload(&*a.extra_cache));
  return Status::Ok();
}
Status upload_all(DeviceMirror& mirror, SparsePrefillArgs& a) {
  for (TensorView* view : {&a.q, &a.kv, &a.indices, &a.topk_length, &a.sink, &a.out, &a.max_logits, &a.lse}) {
    SMLA_RETURN_IF_ERROR(mirror.upload(view));
  }
  return Status::Ok();
}
Status download_outputs(const SparseDecodeArgs& device, const SparseDecodeArgs& host) {
  SMLA_RETURN_IF_ERROR(DeviceMirror::download(device.out, host.out));
  return DeviceMirror::download(device.lse, host.lse);
}
Status download_outputs(const SparsePrefillArgs& device, const SparsePrefillArgs& host) {
  SMLA_RETURN_IF_ERROR(DeviceMirror::download(device.out, host.out));
  SMLA_RETURN_IF_ERROR(DeviceMirror::download(device.max_logits, host.max_logits));
  return DeviceMirror::download(device.lse, host.lse);
}

#endif  // SMLA_HAS_CUDA

template <class Args>
Status run_timed(const Args& args, Backend backend, int repeat, std::vector<double>* seconds) {
  if (repeat < 1) return invalid_argument("repeat", ">= 1", fmt::format("{}", repeat));
  const bool on_device = resolve_backend(backend) == Backend::kCuda;
#if defined(SMLA_HAS_CUDA)
  DeviceMirror mirror;
  Args device_args = args;
  if (on_device) SMLA_RETURN_IF_ERROR(upload_all(mirror, device_args));
  const Args& run_args = on_device ? device_args : args;
#else
  if (on_device) return unimplemented("backend 'cuda': this smla build has no CUDA support");
  const Args& run_args = args;
#endif
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    SMLA_RETURN_IF_ERROR(call(run_args, backend));
#if defined(SMLA_HAS_CUDA)
    if (on_device) SMLA_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
#endif
    seconds->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
#if defined(SMLA_HAS_CUDA)
  if (on_device) SMLA_RETURN_IF_ERROR(download_outputs(device_args, args));
#endif
  return Status::Ok();
}

}  // namespace

Status run_sparse_decode(const SparseDecodeArgs& args, Backend backend, int repeat, std::vector<double>* seconds) {
  return run_timed(args, backend, repeat, seconds);
}

Status run_sparse_prefill(const SparsePrefillArgs& args, Backend backend, int repeat, std::vector<double>* seconds) {
  return run_timed(args, backend, repeat, seconds);
}

}  // namespace smla::cli
