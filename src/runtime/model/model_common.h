// Internal: the setup checks and host-side page bookkeeping of smla::Model
// (the same on every backend, so models fed the same calls hold the same pages).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "smla/model.h"
#include "smla/status.h"

namespace smla::model_detail {

inline constexpr int kModelSwaPage = 64;        // tokens per sliding-window page
inline constexpr int kModelLogicalBlock = 256;  // tokens per logical block of the compressed groups

// Checks the setup (positive sizes, o_groups dividing num_heads, a 512-dim V4
// KV format, positive limits) and returns the step configuration of the model.
Expected<StepConfig> model_step_config(const ModelConfig& config, const ModelOptions& options);

// A pool of page ids shared by the caches of one group (every layer of the
// group holds the same page ids in its own tensor, as vLLM's block tables do).
struct PagePool {
  std::vector<std::int32_t> free_pages;
  std::int64_t capacity = 0;
  explicit PagePool(std::int64_t pages = 0) : capacity(pages) {
    for (std::int64_t p = pages - 1; p >= 0; --p) free_pages.push_back(static_cast<std::int32_t>(p));
  }
  std::int64_t used() const { return capacity - static_cast<std::int64_t>(free_pages.size()); }
  // Grows `pages` to `count` entries; nothing changes when the pool is short.
  Status reserve(std::vector<std::int32_t>& pages, std::int64_t count, const char* group) {
    if (count - static_cast<std::int64_t>(pages.size()) > static_cast<std::int64_t>(free_pages.size())) {
      return out_of_range(fmt::format("{} page pool", group), fmt::format("{} free pages", count - pages.size()),
                          fmt::format("{} free", free_pages.size()));
    }
    while (static_cast<std::int64_t>(pages.size()) < count) {
      pages.push_back(free_pages.back());
      free_pages.pop_back();
    }
    return Status::Ok();
  }
  void release(std::vector<std::int32_t>& pages) {
    for (auto p : pages) free_pages.push_back(p);
    pages.clear();
  }
};

// Rows re-run on the float64 reference when a step verifies: all rows when
// there are at most `count`, else `count` evenly spaced (first and last included).
inline std::vector<std::int64_t> sample_rows(std::int64_t tokens, int count) {
  std::vector<std::int64_t> rows;
  if (tokens <= count) {
    for (std::int64_t t = 0; t < tokens; ++t) rows.push_back(t);
    return rows;
  }
  for (int i = 0; i < count; ++i) rows.push_back(i * (tokens - 1) / (count - 1));
  return rows;
}

// Pages of one request.
struct RequestState {
  bool live = false;
  std::int64_t seq_len = 0;
  std::vector<std::int32_t> swa_pages, c4_pages, c128_pages;  // grow with seq_len
  std::vector<std::int32_t> c4_state_ring, c128_state_ring;   // fixed rings
};

}  // namespace smla::model_detail
