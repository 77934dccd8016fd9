#include "bench/cpu/fma_peak.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/cpu/fma_peak.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target re-includes this file per target; highway.h must follow it.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace smla::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent accumulators cover FMA latency x FMA ports on current x86 and
// Arm cores (e.g. 5 cycles x 2 ports), so the loop is throughput-bound.
constexpr int kChains = 12;

// Returns a value depending on every chain so nothing is optimized away;
// *lanes receives the vector length, *chains the FMAs per iteration.
float FmaChains(std::int64_t iterations, int* lanes, int* chains) {
  const hn::ScalableTag<float> df;
  *lanes = static_cast<int>(hn::Lanes(df));
  *chains = kChains;
  hn::Vec<decltype(df)> acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(df, 1.0f + 0.001f * static_cast<float>(i));
  const auto mul = hn::Set(df, 0.999999f);
  const auto add = hn::Set(df, 1e-6f);
  for (std::int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], mul, add);
  }
  auto sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  return hn::GetLane(sum);
}

}  // namespace HWY_NAMESPACE
}  // namespace smla::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace smla::bench {

HWY_EXPORT(FmaChains);

volatile float g_observed = 0.0f;

FmaPeak measure_fma_peak(int threads) {
  constexpr std::int64_t kIterations = 20'000'000;
  FmaPeak best;
  best.threads = threads;
  for (int repeat = 0; repeat < 3; ++repeat) {
    std::vector<std::thread> workers;
    std::vector<float> sinks(static_cast<std::size_t>(threads));
    std::vector<int> lanes(static_cast<std::size_t>(threads)), chains(static_cast<std::size_t>(threads));
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] { sinks[t] = HWY_DYNAMIC_DISPATCH(FmaChains)(kIterations, &lanes[t], &chains[t]); });
    }
    for (auto& w : workers) w.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double flop = 2.0 * chains[0] * lanes[0] * static_cast<double>(kIterations) * threads;
    for (float sink : sinks) g_observed = sink;  // the chains' results stay observable
    best.lanes = lanes[0];
    best.gflops = std::max(best.gflops, flop / seconds / 1e9);
  }
  return best;
}

}  // namespace smla::bench
#endif  // HWY_ONCE
