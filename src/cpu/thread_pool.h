// Internal: the CPU backend's worker threads.
//
// One process-wide pool, sized from the CPUs this process may run on
// (set_num_threads() overrides it). An op runs on as many of its threads as its
// Context's TuningOptions::cpu_threads asks (the runtime holds a
// ScopedThreadLimit around the call; the pool grows when asked for more).
// Work is split into items that are each computed entirely by one thread, so a
// result never depends on how many threads ran or which thread took an item.
#pragma once

#include <cstdint>
#include <functional>

namespace smla::cpu {

// Threads the calling thread's parallel_for calls use, the caller included
// (>= 1): its ScopedThreadLimit when one is active, else the pool's size.
int num_threads();
// Sets the pool's size for later calls; n <= 0 restores the default.
void set_num_threads(int n);
// Default: the CPUs in this process's affinity mask.
int default_num_threads();

// While alive, parallel_for calls from this thread use `threads` threads
// (threads <= 0: the pool's size). Nests; the previous limit returns at scope end.
class ScopedThreadLimit {
 public:
  explicit ScopedThreadLimit(int threads);
  ~ScopedThreadLimit();
  ScopedThreadLimit(const ScopedThreadLimit&) = delete;
  ScopedThreadLimit& operator=(const ScopedThreadLimit&) = delete;

 private:
  int previous_;
};

// Calls fn(item, worker) for every item in [0, count) and returns when all are
// done. worker is in [0, num_threads()) and identifies per-thread scratch. The
// calling thread takes part; calls from inside fn run serially on that thread.
void parallel_for(std::int64_t count, const std::function<void(std::int64_t item, int worker)>& fn);

}  // namespace smla::cpu
