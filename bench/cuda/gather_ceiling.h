// The row-gather ceiling: how fast one CTA per SM can copy random 1 KB rows into
// shared memory with 16-byte cp.async, as the sm90 copying (prefill) kernel's
// producer does, with 32 to 192 KB in flight per SM (that kernel keeps at most its
// four 32 KB halves, 128 KB). Measured from a pool that fits in L2 and from one that
// does not, it tells whether that kernel's loop over pairs is bound by the memory
// system, and how much a deeper pipeline could pull (docs/PERF.md, sessions 22-23).
// The same copy on a half and a quarter of the SMs tells which side sets the rate:
// if an SM pulls more while fewer pull, the L2 (shared by all) is the limit and
// fewer L2 reads, e.g. a CTA pair's rows multicast to both SMs, would raise it; if
// not, each SM's own port is, and only fewer bytes an SM would (session 30).
#pragma once

#include <cstdint>
#include <vector>

namespace smla::bench {

struct GatherCeiling {
  int ctas = 0;              // CTAs copying, one an SM (a full grid: every SM)
  int in_flight_kb = 0;      // shared memory in flight per SM (32 KB stages)
  double tbps = 0.0;         // bytes copied into shared memory per second, the whole chip
  double gbps_per_sm = 0.0;  // the same, per SM
  double median_us = 0.0;
};

// Rows drawn uniformly from a pool of pool_rows 1 KB rows; median of `runs`
// launches after `warmup`: one entry per depth (32, 64, 128 and 192 KB in flight)
// on every SM, then 128 KB in flight on half and on a quarter of the SMs.
// Throws std::runtime_error on a CUDA failure.
std::vector<GatherCeiling> measure_row_gather_ceiling(std::int64_t pool_rows, int warmup, int runs);

}  // namespace smla::bench
