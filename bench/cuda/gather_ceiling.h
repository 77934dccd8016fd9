// The row-gather ceiling: how fast one CTA per SM can copy random 1 KB rows into
// shared memory with 16-byte cp.async, 128 KB in flight per SM, as the sm90
// copying (prefill) kernel's producer does. Measured from a pool that fits in L2
// and from one that does not, it tells whether that kernel's loop over pairs is
// bound by the memory system or by its tensor work (docs/PERF.md, session 22).
#pragma once

#include <cstdint>

namespace smla::bench {

struct GatherCeiling {
  double tbps = 0.0;         // bytes copied into shared memory per second, the whole chip
  double gbps_per_sm = 0.0;  // the same, per SM
  double median_us = 0.0;
};

// Rows drawn uniformly from a pool of pool_rows 1 KB rows; median of `runs`
// launches after `warmup`. Throws std::runtime_error on a CUDA failure.
GatherCeiling measure_row_gather_ceiling(std::int64_t pool_rows, int warmup, int runs);

}  // namespace smla::bench
