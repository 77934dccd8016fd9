// The device memory of smla::Model: cudaMalloc'd buffers, copies on the
// model's non-blocking stream, cudaEvent phase marks and the whole-step graph.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "src/runtime/model/model_memory.h"

namespace smla::model_detail {
namespace {

Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return internal_error(fmt::format("Model (cuda): {} failed: {}", what, cudaGetErrorString(error)));
}

void cuda_free(void* p) { cudaFree(p); }

class CudaMemory final : public ModelMemory {
 public:
  CudaMemory(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaMemory() override {
    drop_graph();
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device{DeviceKind::kCuda, ordinal_}; }
  Status allocate(Buffer& buffer, std::size_t bytes, const char* what) override {
    void* p = nullptr;
    const std::size_t size = std::max<std::size_t>(bytes, 256);  // never a null pointer for an empty buffer
    if (cudaMalloc(&p, size) != cudaSuccess) {
      (void)cudaGetLastError();
      return internal_error(fmt::format("Model (cuda): cudaMalloc of {} bytes for {} failed", size, what));
    }
    buffer.ptr = std::unique_ptr<void, void (*)(void*)>(p, cuda_free);
    buffer.bytes = bytes;
    return cuda_status(cudaMemsetAsync(p, 0, size, stream_), "cudaMemsetAsync");
  }
  Status upload(void* dst, const void* src, std::size_t bytes) override {
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  }
  Status copy(void* dst, const void* src, std::size_t bytes) override {
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
  }
  Status download(void* dst, const void* src, std::size_t bytes) override {
    SMLA_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download"));
    return synchronize();
  }
  Status synchronize() override { return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  Status make_marks(std::size_t count) override {
    marks_.resize(count, nullptr);
    for (cudaEvent_t& e : marks_) SMLA_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e), "cudaEventCreate"));
    return Status::Ok();
  }
  Status mark(std::size_t index) override {
    return cuda_status(cudaEventRecord(marks_.at(index), stream_), "cudaEventRecord");
  }
  double seconds_between(std::size_t first, std::size_t last) const override {
    float ms = 0.0f;
    return cudaEventElapsedTime(&ms, marks_.at(first), marks_.at(last)) == cudaSuccess ? ms * 1e-3 : 0.0;
  }

  Status begin_capture() override {
    drop_graph();
    SMLA_RETURN_IF_ERROR(synchronize());
    return cuda_status(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  Status end_capture(const Status& enqueued) override {
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!enqueued.ok() || end != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return enqueued.ok() ? cuda_status(end, "cudaStreamEndCapture") : enqueued;
    }
    cudaGraphExec_t exec = nullptr;
    if (Status s = cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"); !s.ok()) {
      cudaGraphDestroy(graph);
      return s;
    }
    graph_ = graph;
    exec_ = exec;
    return Status::Ok();
  }
  Status launch_graph() override { return cuda_status(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }
  bool has_graph() const override { return exec_ != nullptr; }

 private:
  void drop_graph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }

  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> marks_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

Expected<std::unique_ptr<ModelMemory>> make_cuda_memory(Context& context) {
  int ordinal = 0;
  SMLA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&ordinal), "cudaGetDevice"));
  cudaStream_t stream = nullptr;
  SMLA_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  context.set_stream(stream);
  return std::unique_ptr<ModelMemory>(std::make_unique<CudaMemory>(ordinal, stream));
}

}  // namespace smla::model_detail
