// Internal: where smla::Model keeps its buffers and how it moves bytes, chosen
// once from the model's Context (make_model_memory): host memory for the
// reference / cpu backends, device memory on the model's own stream for cuda.
// Also the phase marks (host clock or cudaEvents) and, on cuda, the
// whole-step graph. Everything the step pipeline does differently per backend
// beyond this lives in the ops (smla/layer.h, ..., model_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "smla/context.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla::model_detail {

// One allocation in the model's memory (zero-filled at creation, never null).
struct Buffer {
  std::unique_ptr<void, void (*)(void*)> ptr{nullptr, nullptr};
  std::size_t bytes = 0;
  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr.get());
  }
};

class ModelMemory {
 public:
  virtual ~ModelMemory() = default;
  // The device of every TensorView over this memory.
  virtual Device device() const = 0;
  virtual Status allocate(Buffer& buffer, std::size_t bytes, const char* what) = 0;
  // Ordered with the model's ops. upload: host -> memory (the host bytes must
  // stay alive until synchronize()); copy: within the memory.
  virtual Status upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual Status copy(void* dst, const void* src, std::size_t bytes) = 0;
  // memory -> host; returns once the bytes are on the host.
  virtual Status download(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual Status synchronize() = 0;

  // Phase marks: make_marks(n) once, then mark(i) records point i in op order.
  virtual Status make_marks(std::size_t count) = 0;
  virtual Status mark(std::size_t index) = 0;
  virtual double seconds_between(std::size_t first, std::size_t last) const = 0;

  // Whole-step graph of everything enqueued between begin_capture and
  // end_capture (replaces an earlier one). Host memory: Unimplemented.
  virtual Status begin_capture() = 0;
  virtual Status end_capture(const Status& enqueued) = 0;  // discards the graph when !enqueued.ok()
  virtual Status launch_graph() = 0;
  virtual bool has_graph() const = 0;
};

// The memory of `context`'s backend. cuda: makes a non-blocking stream and
// sets it on `context` (the model's copy).
Expected<std::unique_ptr<ModelMemory>> make_model_memory(Context& context);

// Host memory (reference, cpu).
std::unique_ptr<ModelMemory> make_host_memory();
// Device memory of the current CUDA device (CUDA builds only: model/cuda).
Expected<std::unique_ptr<ModelMemory>> make_cuda_memory(Context& context);

}  // namespace smla::model_detail
