// Internal: the CPU backend's worker threads.
//
// One process-wide pool, sized from the CPUs this process may run on (the
// SMLA_NUM_THREADS environment variable or set_num_threads() override it).
// Work is split into items that are each computed entirely by one thread, so a
// result never depends on how many threads ran or which thread took an item.
#pragma once

#include <cstdint>
#include <functional>

namespace smla::cpu {

// Threads used by parallel_for, the caller included (>= 1).
int num_threads();
// Sets the thread count for later calls; n <= 0 restores the default.
void set_num_threads(int n);
// Default: SMLA_NUM_THREADS when set and positive, else the CPUs in this
// process's affinity mask.
int default_num_threads();

// Calls fn(item, worker) for every item in [0, count) and returns when all are
// done. worker is in [0, num_threads()) and identifies per-thread scratch. The
// calling thread takes part; calls from inside fn run serially on that thread.
void parallel_for(std::int64_t count, const std::function<void(std::int64_t item, int worker)>& fn);

}  // namespace smla::cpu
