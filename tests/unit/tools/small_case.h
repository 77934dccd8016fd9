// The small decode batch the tools tests write as replay directories:
// one request of 2 tokens, 2 heads, pages of 4 tokens, and (unless
// extra_topk is 0) a compressed cache of pages of 3 entries.
#pragma once

#include <cstdint>

#include "testkit/testkit.h"

namespace smla::cli {

inline testkit::DecodeCaseOptions small_case_options(std::uint64_t seed, std::int64_t extra_topk = 4) {
  testkit::DecodeCaseOptions options;
  options.num_requests = 1;
  options.s_q = 2;
  options.num_heads = 2;
  options.main_topk = 8;
  options.main_page_size = 4;
  options.main_context = 16;
  options.extra_topk = extra_topk;
  options.extra_page_size = 3;
  options.extra_context = 9;
  options.seed = seed;
  return options;
}

}  // namespace smla::cli
