#include "src/cpu/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace smla::cpu {

namespace {

// Items are claimed from a shared counter (dynamic balance); since each item is
// computed by one thread start to end, the claim order never changes results.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) { resize(threads); }
  ~ThreadPool() { stop_workers(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    stop_workers();
    stopping_ = false;
    // New workers start at the current generation: one that saw an older job's
    // generation as new would report done for a job it never ran (or twice for
    // the next one), letting run() return while another worker is still inside fn.
    const std::uint64_t current = generation_;
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w, current] { worker_loop(w, current); });
  }

  // Runs fn over [0, count) on `participants` threads (the caller and workers
  // 1..participants-1; the others wake and go back to sleep).
  void run(std::int64_t count, int participants, const std::function<void(std::int64_t, int)>& fn) {
    if (count <= 0) return;
    if (workers_.empty() || participants <= 1 || count == 1) {
      for (std::int64_t i = 0; i < count; ++i) fn(i, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      count_ = count;
      next_.store(0);
      participants_ = participants;
      busy_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    drain(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
  }

 private:
  void drain(int worker) {
    for (std::int64_t i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) (*job_)(i, worker);
  }

  void worker_loop(int worker, std::uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      if (worker < participants_) drain(worker);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--busy_ == 0) done_.notify_one();
      }
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(std::int64_t, int)>* job_ = nullptr;
  std::int64_t count_ = 0;
  std::atomic<std::int64_t> next_{0};
  int participants_ = 1;  // written under mutex_ before the generation changes
  int busy_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
};

std::mutex g_pool_mutex;  // serializes parallel_for callers and resizes
std::unique_ptr<ThreadPool> g_pool;
thread_local bool t_inside_pool_job = false;
thread_local int t_thread_limit = 0;  // ScopedThreadLimit; 0 = the pool's size

ThreadPool& pool_locked() {
  if (!g_pool) g_pool = std::make_unique<ThreadPool>(default_num_threads());
  return *g_pool;
}

}  // namespace

int default_num_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

int num_threads() {
  if (t_thread_limit > 0) return t_thread_limit;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  return pool_locked().size();
}

ScopedThreadLimit::ScopedThreadLimit(int threads) : previous_(t_thread_limit) {
  t_thread_limit = threads > 0 ? threads : 0;
}
ScopedThreadLimit::~ScopedThreadLimit() { t_thread_limit = previous_; }

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  pool_locked().resize(n > 0 ? n : default_num_threads());
}

void parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& fn) {
  if (t_inside_pool_job) {  // nested call: the pool is busy with our caller
    for (std::int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  ThreadPool& pool = pool_locked();
  // A limit above the pool's size grows it: the caller asked for that many threads.
  if (t_thread_limit > pool.size()) pool.resize(t_thread_limit);
  const int participants = t_thread_limit > 0 ? t_thread_limit : pool.size();
  t_inside_pool_job = true;
  pool.run(count, participants, [&](std::int64_t item, int worker) {
    const bool outer = t_inside_pool_job;
    t_inside_pool_job = true;
    fn(item, worker);
    t_inside_pool_job = outer;
  });
  t_inside_pool_job = false;
}

}  // namespace smla::cpu
