// A timeline of the sm90 kernels' phases, for reading where a short CTA's time goes
// (docs/cuda_backend.md, "Phase timeline"). Compiled in only with -DSMLA_SM90_TRACE:
// chosen threads stamp the SM clock at fixed events into a global table, thread 0 of
// each CTA stores where it ran when it ends, and a kernel launched after each traced
// one prints the table (one line a CTA and launch: "sm90trace" with its "sm90waits", or "sm90items").
// Without the macro every call below is empty. ptxas may schedule a clock read ahead
// of a bare named barrier or of a load's first use: a stamp can come early.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace smla::cuda::sm90 {

enum TraceEvent : int {
  kTraceStart = 0,         // thread 0, kernel entry
  kTraceBarriersReady,     // thread 0, after the CTA's (or the pair's) first barrier
  kTraceLengthsRead,       // thread 0, the split's keys known
  kTraceFirstKeys,         // producer thread 0: the first pass's index values resolved
  kTraceTile0Stored,       // producer thread 0: tile 0 published
  kTraceLastTileStored,    // producer thread 0: the last tile published
  kTraceQueryStaged,       // consumer thread 0: Q in shared memory
  kTraceTile0Full,         // consumer thread 0: tile 0 (and the peer's half) in
  kTraceTilesDone,         // consumer thread 0: every tile's P V done
  kTraceOutputWritten,     // consumer thread 0: its half of the output stored
  kTraceValueDone,         // value / odd thread 0: its half of the output stored
  kTraceEnd,               // thread 0, after the last barrier
  kTraceRows0In,           // producer thread 0: its first pass's row loads landed
  kTraceScores0,           // consumer thread 0: tile 0's Q K^T done
  kTraceStatsPublished,    // consumer thread 0: the row statistics stored
  kTraceScoreBarrier,      // consumer thread 0: both warpgroups at the output (the value one's last P V done)
  kTraceValueBarrier,      // value thread 0: the same barrier
  kTraceEvents,
};

// The copying (alternating) kernel: per CTA, the even warpgroup's stamps at each
// phase end summed over its work items (a persistent CTA runs many short items).
// Sums by reduction (no load waits in the kernel); a phase's time is the difference
// of two sums (bench/cuda/sm90_trace.py).
enum ItemStamp : int {
  kItemQueryIn = 1,  // the Q tile in (the item before's output stored)
  kItemFirstTiles,   // the first pair's tiles for even in
  kItemPairsDone,    // every pair's P V done
  kItemOutputDone,   // the output stored, both warpgroups done with the Q tile
  kItemCount,        // the count of items
  kItemLastOutput,   // the last item's kItemOutputDone stamp
  kItemProducerStart,  // producer thread 0: the item's lengths known, its first index values requested next
  kItemIndicesIn,      // producer thread 0: the first pair's index values in
  kItemFirstFill,      // producer thread 0: the first half-buffer's copies issued
  kItemStatsDone,      // even thread 0: row statistics published, both warpgroups at the output
  kItemStoresIssued,   // even thread 0: its output stores issued
  kItemFirstLeftIn,    // even thread 0: the first pair's buffer 0 left half in (its right half is the third fill)
  kItemThirdFill,      // producer thread 0: the first pair's buffer 0 right half's copies issued
};

// The copying kernel's waits inside its loop over pairs: the cycles thread 0 of the
// waiting warpgroup spent in each, summed over the CTA's pairs (which hand-off a pair
// waits on). FULL and EMPTY sites are indexed 2 buffer + half (half 0: columns 0-255).
enum WaitSite : int {
  kWaitEmpty = 0,         // the producer, for a half's release
  kWaitEvenFull = 4,      // even, for a half's rows (buffer 0: its Q K^T; buffer 1 left: odd's P V)
  kWaitOddFull = 8,       // odd, likewise (buffer 1: its Q K^T; buffer 0 right: even's P V)
  kWaitEvenPairMax = 12,  // even, for the pair's row max from odd
  kWaitEvenOddP = 13,     // even, for odd's P
  kWaitOddEvenMax = 14,   // odd, for even's row max
  kWaitOddEvenP = 15,     // odd, for even's P
  // The FP8 rows kernel's waits over its tiles (thread 0 of each warpgroup):
  kWaitProducerFree = 16,  // the producer, for a K buffer's release
  kWaitProducerRows = 17,  // the producer, for a pass's rows (its first unit) before storing them
  kWaitScoreFull = 18,     // the score warpgroup, for a tile
  kWaitScorePEmpty = 19,   // the score warpgroup, for the value one to be done with the last P
  kWaitValueFull = 20,     // the value warpgroup, for a tile
  kWaitValuePFull = 21,    // the value warpgroup, for P
  kWaitProducerIndex = 22,  // the producer, for a pass's index value (its first key's)
  kWaitSites = 23,
};
// The site of a FULL or EMPTY wait for half `half` of buffer `buffer`.
constexpr WaitSite half_site(WaitSite first, int buffer, int half) {
  return static_cast<WaitSite>(first + 2 * buffer + half);
}

#if defined(SMLA_SM90_TRACE)
inline constexpr int kTraceCtas = 1 << 14;
static_assert(kTraceEvents == 17 && static_cast<int>(kItemThirdFill) < static_cast<int>(kTraceEvents),
              "sm90_trace_dump_kernel prints 16 deltas; the item sums fit a row");
static __device__ long long g_sm90_trace[kTraceCtas][kTraceEvents];  // one per translation unit; the host pass sees it too (its stub registers it)
static __device__ unsigned long long g_sm90_waits[kTraceCtas][kWaitSites];
// Where a CTA ran, stored when it ends: its block, SM and %globaltimer at its start.
struct TraceCta {
  unsigned block[3];
  unsigned sm;
  long long global_start;
};
static __device__ TraceCta g_sm90_trace_ctas[kTraceCtas];

// Prints the table of the launch before it on the stream, one line a CTA, and clears
// the sums (the copying kernel's stamps, every wait) for the next launch. A kernel of
// its own: a printf in the traced kernels is a function call, across which ptxas
// serializes their wgmma (C7510), and their timeline would not be theirs.
static __global__ void sm90_trace_dump_kernel(int ctas, bool items) {
  for (int c = 0; c < ctas; ++c) {
    const TraceCta& cta = g_sm90_trace_ctas[c];
    long long* row = g_sm90_trace[c];
    unsigned long long* waits = g_sm90_waits[c];
    if (!items) {
      printf("sm90trace cta %u %u %u sm %u t0 %lld cycles %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld "
             "%lld %lld %lld %lld\n",
             cta.block[0], cta.block[1], cta.block[2], cta.sm, cta.global_start, row[1] - row[0], row[2] - row[0],
             row[3] - row[0], row[4] - row[0], row[5] - row[0], row[6] - row[0], row[7] - row[0], row[8] - row[0],
             row[9] - row[0], row[10] - row[0], row[11] - row[0], row[12] - row[0], row[13] - row[0], row[14] - row[0],
             row[15] - row[0], row[16] - row[0]);
      printf("sm90waits cta %u %u %u producer_free %llu producer_rows %llu score_full %llu score_p_empty %llu "
             "value_full %llu value_p_full %llu producer_index %llu\n",
             cta.block[0], cta.block[1], cta.block[2], waits[kWaitProducerFree], waits[kWaitProducerRows],
             waits[kWaitScoreFull], waits[kWaitScorePEmpty], waits[kWaitValueFull], waits[kWaitValuePFull],
             waits[kWaitProducerIndex]);
    } else {
      printf("sm90items cta %u sm %u start %lld query %lld first_tiles %lld pairs %lld output %lld items %lld "
             "last %lld producer_start %lld indices_in %lld first_fill %lld stats %lld stores %lld first_left %lld "
             "third_fill %lld wait_empty_0l %llu wait_empty_0r %llu wait_empty_1l %llu wait_empty_1r %llu "
             "wait_even_full_0l %llu wait_even_full_0r %llu wait_even_full_1l %llu wait_odd_full_0r %llu "
             "wait_odd_full_1l %llu wait_odd_full_1r %llu wait_even_pair_max %llu wait_even_odd_p %llu "
             "wait_odd_even_max %llu wait_odd_even_p %llu\n",
             cta.block[0], cta.sm, row[0], row[kItemQueryIn], row[kItemFirstTiles], row[kItemPairsDone],
             row[kItemOutputDone], row[kItemCount], row[kItemLastOutput], row[kItemProducerStart], row[kItemIndicesIn],
             row[kItemFirstFill], row[kItemStatsDone], row[kItemStoresIssued], row[kItemFirstLeftIn],
             row[kItemThirdFill], waits[kWaitEmpty], waits[kWaitEmpty + 1], waits[kWaitEmpty + 2],
             waits[kWaitEmpty + 3], waits[kWaitEvenFull], waits[kWaitEvenFull + 1], waits[kWaitEvenFull + 2],
             waits[kWaitOddFull + 1], waits[kWaitOddFull + 2], waits[kWaitOddFull + 3], waits[kWaitEvenPairMax],
             waits[kWaitEvenOddP], waits[kWaitOddEvenMax], waits[kWaitOddEvenP]);
      for (int e = 0; e < kTraceEvents; ++e) row[e] = 0;  // the copying kernel's stamps are sums
    }
    for (int site = 0; site < kWaitSites; ++site) waits[site] = 0;  // the next launch sums afresh
  }
}

// After a traced kernel's launch (`launched`: its status) of `ctas` CTAs, prints its table.
static cudaError_t trace_dump_after(cudaError_t launched, long long ctas, bool items, cudaStream_t stream) {
  if (launched != cudaSuccess) return launched;
  sm90_trace_dump_kernel<<<1, 1, 0, stream>>>(static_cast<int>(std::min<long long>(ctas, kTraceCtas)), items);
  return cudaGetLastError();
}
#else
inline cudaError_t trace_dump_after(cudaError_t launched, long long, bool, cudaStream_t) { return launched; }
#endif

#if defined(SMLA_SM90_TRACE) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ int trace_cta() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) % kTraceCtas;
}
__device__ __forceinline__ std::uint32_t sm_id() {
  std::uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}
// Returns once `value` (a load's destination) has landed: the instruction reads it, so it waits on the load.
__device__ __forceinline__ void wait_for_load(std::uint32_t value) {
  std::uint32_t sink;
  asm volatile("mov.b32 %0, %1;" : "=r"(sink) : "r"(value));
  asm volatile("" ::"r"(sink));
}
__device__ __forceinline__ void trace(TraceEvent event) { g_sm90_trace[trace_cta()][event] = clock64(); }
__device__ __forceinline__ void trace_when_loaded(TraceEvent event, std::uint32_t value) {
  wait_for_load(value);
  trace(event);
}
// Thread 0, once every stamping thread is past its last event (after a CTA-wide
// barrier): where the CTA ran (its start's %globaltimer: 0 for the copying kernel).
__device__ __forceinline__ void trace_finish(long long global_start) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  g_sm90_trace_ctas[trace_cta()] = TraceCta{{blockIdx.x, blockIdx.y, blockIdx.z}, sm_id(), global_start};
}
__device__ __forceinline__ void trace_item(ItemStamp stamp) {
  long long* row = g_sm90_trace[trace_cta()];
  const long long now = clock64();
  atomicAdd(reinterpret_cast<unsigned long long*>(row + stamp), static_cast<unsigned long long>(now));
  if (stamp == kItemOutputDone) {
    atomicAdd(reinterpret_cast<unsigned long long*>(row + kItemCount), 1ull);
    row[kItemLastOutput] = now;
  }
}
__device__ __forceinline__ void trace_item_when_loaded(ItemStamp stamp, std::uint32_t value) {
  wait_for_load(value);
  trace_item(stamp);
}
// The clock before a timed wait (trace_wait adds what the wait took).
__device__ __forceinline__ long long trace_clock() { return clock64(); }
__device__ __forceinline__ void trace_wait(WaitSite site, long long begin) {
  atomicAdd(&g_sm90_waits[trace_cta()][site], static_cast<unsigned long long>(clock64() - begin));
}
// Adds to `site` the cycles until `value` (a load's destination) has landed.
__device__ __forceinline__ void trace_wait_for_load(WaitSite site, std::uint32_t value) {
  const long long begin = trace_clock();
  wait_for_load(value);
  trace_wait(site, begin);
}
__device__ __forceinline__ long long trace_global_time() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#else
__device__ __forceinline__ long long trace_clock() { return 0; }
__device__ __forceinline__ void trace_wait(WaitSite, long long) {}
__device__ __forceinline__ void trace_item(ItemStamp) {}
__device__ __forceinline__ void trace_item_when_loaded(ItemStamp, std::uint32_t) {}
__device__ __forceinline__ void trace_wait_for_load(WaitSite, std::uint32_t) {}
__device__ __forceinline__ void trace(TraceEvent) {}
__device__ __forceinline__ void trace_when_loaded(TraceEvent, std::uint32_t) {}
__device__ __forceinline__ void trace_finish(long long) {}
__device__ __forceinline__ long long trace_global_time() { return 0; }
#endif

}  // namespace smla::cuda::sm90
