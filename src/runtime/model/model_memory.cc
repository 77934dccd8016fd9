// The host memory of smla::Model and the one place a backend picks its memory.
#include "src/runtime/model/model_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace smla::model_detail {
namespace {

class HostMemory final : public ModelMemory {
 public:
  Device device() const override { return Device{}; }
  Status allocate(Buffer& buffer, std::size_t bytes, const char* what) override {
    void* p = std::calloc(std::max<std::size_t>(bytes, 64), 1);
    if (p == nullptr) return internal_error(fmt::format("Model: allocating {} bytes for {} failed", bytes, what));
    buffer.ptr = std::unique_ptr<void, void (*)(void*)>(p, std::free);
    buffer.bytes = bytes;
    return Status::Ok();
  }
  Status upload(void* dst, const void* src, std::size_t bytes) override { return copy(dst, src, bytes); }
  Status copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  Status download(void* dst, const void* src, std::size_t bytes) override { return copy(dst, src, bytes); }
  Status synchronize() override { return Status::Ok(); }

  Status make_marks(std::size_t count) override {
    marks_.assign(count, {});
    return Status::Ok();
  }
  Status mark(std::size_t index) override {
    marks_.at(index) = std::chrono::steady_clock::now();
    return Status::Ok();
  }
  double seconds_between(std::size_t first, std::size_t last) const override {
    return std::chrono::duration<double>(marks_.at(last) - marks_.at(first)).count();
  }

  Status begin_capture() override { return no_graphs(); }
  Status end_capture(const Status&) override { return no_graphs(); }
  Status launch_graph() override { return no_graphs(); }
  bool has_graph() const override { return false; }

 private:
  static Status no_graphs() { return unimplemented("host memory has no CUDA graphs"); }
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<ModelMemory> make_host_memory() { return std::make_unique<HostMemory>(); }

Expected<std::unique_ptr<ModelMemory>> make_model_memory(Context& context) {
  switch (context.backend()) {
    case Backend::kReference:
    case Backend::kCpu:
      return make_host_memory();
    case Backend::kCuda:
#if defined(SMLA_HAS_CUDA)
      return make_cuda_memory(context);
#else
      break;
#endif
    default:
      break;
  }
  return unimplemented(fmt::format("Model: no memory for backend '{}' in this build", backend_name(context.backend())));
}

}  // namespace smla::model_detail
