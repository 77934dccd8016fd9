// Shared pieces of smla_bench_cuda: synthetic paged caches, host<->device
// copies and the timing protocol (256 MB L2 flush per run, CUDA events,
// median after warm-up), used by the decode and the prefill case sets.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <type_traits>
#include <utility>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bench/cuda/synthetic_fill.h"
#include "smla/attention.h"
#include "smla/context.h"
#include "smla/kv_format.h"
#include "testkit/cuda/device_copy.h"

namespace smla::bench {

using cudatest::check_cuda;
using cudatest::DeviceBuffer;

inline constexpr std::size_t kFlushBytes = 256u << 20;

template <class T>
T value_or_throw(Expected<T> expected) {
  if (!expected) throw std::runtime_error(expected.status().to_string());
  return std::move(*expected);
}

// One attention call planned once on the cuda backend, with the plan's
// workspace, run on the stream each timing run passes (how a serving engine
// runs a step: plan once, run many).
template <class Args>
class PlannedAttention {
 public:
  explicit PlannedAttention(const Args& args)
      : PlannedAttention(args, value_or_throw(TuningOptions::from_environment())) {}
  PlannedAttention(const Args& args, const TuningOptions& tuning)
      : args_(args), context_(value_or_throw(Context::create(Backend::kCuda, tuning))), plan_(make_plan()),
        workspace_(plan_.workspace_bytes()) {
    context_.set_workspace(workspace_.data(), plan_.workspace_bytes());
  }
  void operator()(cudaStream_t stream) {
    context_.set_stream(stream);
    const Status status = run();
    if (!status.ok()) throw std::runtime_error(status.to_string());
  }
  const AttentionPlan& plan() const { return plan_; }

 private:
  AttentionPlan make_plan() const {
    if constexpr (std::is_same_v<Args, SparseDecodeArgs>) return value_or_throw(plan_sparse_decode(context_, args_));
    else return value_or_throw(plan_sparse_prefill(context_, args_));
  }
  Status run() const {
    if constexpr (std::is_same_v<Args, SparseDecodeArgs>) return sparse_decode(context_, plan_, args_);
    else return sparse_prefill(context_, plan_, args_);
  }

  Args args_;
  Context context_;
  AttentionPlan plan_;
  DeviceBuffer workspace_;
};

// One cache on the device: b requests of `context` tokens each, block tables random.
struct SyntheticCache {
  KvFormat format = KvFormat::kV4Fp8;
  std::int64_t page_size = 0, pages_per_request = 0, num_pages = 0, page_stride = 0;
  DeviceBuffer pages;
  std::vector<std::int64_t> block_table;  // [request * pages_per_request + logical] -> physical page

  KvCacheView view() const {
    const KvFormatInfo info = kv_format_info(format);
    KvCacheView cache;
    cache.format = format;
    cache.pages = TensorView::strided(pages.data(), DType::kU8, {num_pages, page_size, info.row_elements},
                                      {page_stride, info.row_elements, 1}, cudatest::current_cuda_device());
    return cache;
  }
  // Global slot of `position` in `request`'s context.
  std::int32_t slot(std::int64_t request, std::int64_t position) const {
    const std::int64_t page = block_table[static_cast<std::size_t>(request * pages_per_request + position / page_size)];
    return static_cast<std::int32_t>(page * page_size + position % page_size);
  }
};

inline SyntheticCache make_cache(KvFormat format, std::int64_t b, std::int64_t context, std::int64_t page_size,
                                 std::mt19937_64& rng, std::uint64_t seed) {
  SyntheticCache cache;
  cache.format = format;
  cache.page_size = page_size;
  cache.pages_per_request = (context + page_size - 1) / page_size;
  cache.num_pages = b * cache.pages_per_request;
  cache.page_stride = visit_kv_format(format, [&](auto traits) { return decltype(traits)::page_bytes(page_size); });
  cache.pages = DeviceBuffer(static_cast<std::size_t>(cache.num_pages * cache.page_stride));
  check_cuda(fill_fp8_pages(format, static_cast<std::uint8_t*>(cache.pages.data()), cache.num_pages, page_size,
                            cache.page_stride, seed, nullptr),
             "fill pages");
  cache.block_table.resize(static_cast<std::size_t>(cache.num_pages));
  for (std::int64_t i = 0; i < cache.num_pages; ++i) cache.block_table[static_cast<std::size_t>(i)] = i;
  std::shuffle(cache.block_table.begin(), cache.block_table.end(), rng);
  return cache;
}

// `count` distinct random values of [0, range) per call; a partial Fisher-Yates
// over a permutation kept between calls (any permutation works as the start).
class DistinctPicker {
 public:
  explicit DistinctPicker(std::int64_t range) : pool_(static_cast<std::size_t>(range)) {
    for (std::int64_t i = 0; i < range; ++i) pool_[static_cast<std::size_t>(i)] = i;
  }
  template <class Emit>
  void pick(std::int64_t count, std::mt19937_64& rng, Emit&& emit) {
    const std::int64_t range = static_cast<std::int64_t>(pool_.size());
    for (std::int64_t k = 0; k < count; ++k) {
      std::uniform_int_distribution<std::int64_t> choose(k, range - 1);
      std::swap(pool_[static_cast<std::size_t>(k)], pool_[static_cast<std::size_t>(choose(rng))]);
      emit(pool_[static_cast<std::size_t>(k)]);
    }
  }

 private:
  std::vector<std::int64_t> pool_;
};

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  if (!host.empty()) {
    check_cuda(cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  return buffer;
}

inline std::vector<std::uint8_t> download(const DeviceBuffer& buffer) {
  std::vector<std::uint8_t> host(buffer.bytes());
  check_cuda(cudaMemcpy(host.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost), "download");
  return host;
}

inline TensorView on_host(TensorView view, void* data) {
  view.data = data;
  view.device = Device{};
  return view;
}

// Times `enqueue(stream)` with CUDA events: per run a 256 MB memset flushes L2
// first; returns the sorted times (us) of the runs after the warm-up.
// Diagnosis only, never for recorded figures: SMLA_BENCH_WARM_L2=1 skips the flush
// (what the kernels' code and rows cost when L2 still holds them), SMLA_BENCH_FLUSH=read
// flushes by reading the buffer (L2 then holds clean lines: writes need not evict dirty ones).
enum class L2Flush { kMemset, kReads, kNone };
inline L2Flush l2_flush_from_environment() {
  const auto is = [](const char* name, std::string_view value) {
    const char* set = std::getenv(name);
    return set != nullptr && std::string_view(set) == value;
  };
  if (is("SMLA_BENCH_WARM_L2", "1")) return L2Flush::kNone;
  return is("SMLA_BENCH_FLUSH", "read") ? L2Flush::kReads : L2Flush::kMemset;
}

template <class Enqueue>
std::vector<float> time_runs(int warmup, int runs, Enqueue&& enqueue) {
  const L2Flush flush_kind = l2_flush_from_environment();
  DeviceBuffer flush(kFlushBytes);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "stream");
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int run = 0; run < warmup + runs; ++run) {
    if (flush_kind == L2Flush::kReads) {
      if (run == 0) check_cuda(cudaMemsetAsync(flush.data(), 0, kFlushBytes, stream), "flush");
      check_cuda(read_through(flush.data(), kFlushBytes, stream), "flush");
    } else if (flush_kind == L2Flush::kMemset) {
      check_cuda(cudaMemsetAsync(flush.data(), run & 0xFF, kFlushBytes, stream), "flush");
    }
    check_cuda(cudaEventRecord(start, stream), "record");
    enqueue(stream);
    check_cuda(cudaEventRecord(stop, stream), "record");
    check_cuda(cudaEventSynchronize(stop), "sync");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (run >= warmup) times.push_back(ms * 1000.0f);
  }
  check_cuda(cudaDeviceSynchronize(), "sync");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  return times;
}

}  // namespace smla::bench
