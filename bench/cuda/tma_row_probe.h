// Can the tensor memory accelerator gather whole bf16 rows, one row a box, into
// the 128-byte-swizzled tiles wgmma reads, and how fast? The copying (prefill)
// kernel's producer gathers rows by 16-byte cp.async, 72 instructions a d 576
// row (docs/PERF.md, session 23: 4x FlashMLA's producer instructions). A box of
// 1 row x 64 values with the 128-byte swizzle, put at row r of a 1024-byte-aligned
// region, lands as wgmma expects only if the unit swizzles by the shared-memory
// address (bits 7-9), not by the row's place in its box. The probe checks that on
// the device, then times such gathers on every SM, and by CTA pairs whose boxes
// are multicast to both SMs (each row read from L2 once for two head blocks, the
// next prefill design of docs/PERF.md, session 30).
#pragma once

#include <cstdint>
#include <string>

namespace smla::bench {

struct TmaRowProbe {
  bool ran = false;
  std::string skipped;                  // why not, where it did not run
  std::int64_t checked_units = 0;       // 16-byte units compared
  std::int64_t misplaced_units = 0;     // of them, not where the swizzle of their address puts them
  double gbps_per_sm = 0.0;             // random 1 KB rows, 128 KB in flight, one CTA an SM
  double multicast_gbps_per_sm = 0.0;   // rows landed an SM when CTA pairs multicast each half
};

// Rows drawn uniformly from a pool of pool_rows 1 KB rows; medians of `runs` launches
// after `warmup`. A CUDA failure (a box the device refuses at that address) may leave
// the context unusable: run it in a process of its own (smla_bench_cuda --tma-row-probe).
TmaRowProbe probe_tma_row_gathers(std::int64_t pool_rows, int warmup, int runs);

}  // namespace smla::bench
