// Internal: which SIMD targets the CPU kernels were compiled for, and a way
// for tests and benchmarks to run them on a chosen one (Highway dynamic
// dispatch picks the best target this CPU supports by default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace smla::cpu {

struct SimdTarget {
  std::int64_t id = 0;  // Highway target bit
  std::string name;     // "AVX2", "AVX3", "SSE4", "EMU128", "NEON", ...
};

// Targets compiled into the CPU kernels that this CPU can run, best first.
std::vector<SimdTarget> available_simd_targets();
// Makes later calls use `id` (one of available_simd_targets()); 0 restores the best.
void force_simd_target(std::int64_t id);
// Name of the target the kernels dispatch to now.
std::string active_simd_target();

}  // namespace smla::cpu
