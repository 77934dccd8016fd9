// The Hopper (sm_90a) sparse MLA attention kernel: same contract and params as
// the portable kernel (src/cuda/sm80/sparse_attention_kernel.cuh), for 64-head tiles.
//
// One CTA = one query token x 64 heads x one split of the token's keys, three
// warpgroups working on 64-key tiles:
//   producer  gathers the tile's rows (16-byte loads issued one round ahead),
//             expands them to bf16 and stores them into one of two 128-byte-
//             swizzled K buffers; invalid keys become zero rows and flag 0;
//   score     S = Q K^T with wgmma (both operands in shared memory), masking,
//             online softmax in registers, P to shared memory for the value
//             warpgroup, then O[:, 0:256] += P V with P taken from registers;
//   value     O[:, 256:512] += P V with P from shared memory.
// V is the first 512 columns of the same K buffer, read N-major by wgmma.
// Copied rows (bf16, the flat prefill workspace) run another consumer scheme,
// alternating tiles between the two consumer warpgroups (sm90_alternating.cuh).
// Hand-offs: FULL(b) producer -> consumers, P_FULL / P_EMPTY score <-> value
// are named barriers; EMPTY(b) consumers -> producer is an mbarrier (every
// consumer thread arrives, the producer threads wait on its phase), so the
// producer's writes into a buffer are ordered after every consumer's reads of
// it by an acquire that the sanitizers model exactly. Each side counts the same
// uses of every named barrier, so none is left half-arrived at exit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "src/cuda/common/attention_epilogue.cuh"
#include "src/cuda/common/split_combine.cuh"
#include "src/cuda/sm90/sm90_ptx.cuh"
#include "src/cuda/sm90/sm90_row_loaders.cuh"
#include "src/cuda/sm90/sm90_trace.cuh"
#include "src/cuda/sm90/wgmma_ops.cuh"
#include "src/cuda/sm80/sparse_attention_kernel.cuh"

namespace smla::cuda::sm90 {

inline constexpr int kRows = 64;        // query heads per CTA
inline constexpr int kKeys = kSm90KeysPerTile;  // keys per tile
inline constexpr int kThreads = 384;    // score, value and producer warpgroups
inline constexpr int kConsumerThreads = 256;  // score and value warpgroups
inline constexpr int kHalfColumns = kValueDim / 2;
inline constexpr int kPrefetchTiles = 4;  // how far ahead the value warpgroup asks L2 for rows
// Invalid keys load kZeroRow (sm90_row_loaders.cuh) rather than zeroing their share.
#ifndef SMLA_SM90_ZERO_ROW
#define SMLA_SM90_ZERO_ROW 1
#endif
inline constexpr bool kZeroRowLoads = SMLA_SM90_ZERO_ROW != 0;
// The lean producer (no packed-path test, zero-row loads, the fast V4 scale decoding)
// runs in unpaired CTAs, whose producer sets the pace at b >= 64: CONFIG1 / CONFIG3
// b = 128 4-8% faster on an H200. CTA pairs, paced by the score warpgroup, keep the
// old code: with it their h128 cases ran 2-11% slower (docs/PERF.md, session 26).
template <bool kPair>
inline constexpr bool kLeanProducer = !kPair;
// Whether a CTA's key requests keep the packed path's test (request_key / resolve_key).
// The plan never packs tokens for this kernel (pack_tokens 1, attention_plan.cc; the
// launch refuses params that do), so the lean producer skips it.
template <bool kPair>
inline constexpr bool kMayPackKeys = !kLeanProducer<kPair>;
// A thread of a 384-thread CTA starts with 168 registers (65536 / 384, rounded
// down to a multiple of 8). setmaxnreg only raises above or lowers below that,
// and a raise waits until the lowered warpgroups have returned enough to the
// CTA's pool: the three budgets must fit in 3 x 168 or a raising warpgroup
// waits forever.
inline constexpr int kStartRegisters = 65536 / kThreads / 8 * 8;
// Per warpgroup: the expanding producer holds a pass of rows in registers; the
// copying one (bf16 rows, alternating tiles) only addresses, and its registers
// go to the two consumers, which both run softmax and P V.
template <bool kCopiesRows>
struct RegisterBudget {
  static constexpr int kScore = 192;
  static constexpr int kValue = 160;
  static constexpr int kProducer = 152;
};
template <>
struct RegisterBudget<true> {
  static constexpr int kScore = 208;
  static constexpr int kValue = 208;
  static constexpr int kProducer = 88;
};
template <bool kCopiesRows>
constexpr bool budget_fits() {
  using Budget = RegisterBudget<kCopiesRows>;
  return Budget::kScore + Budget::kValue + Budget::kProducer <= 3 * kStartRegisters &&
         Budget::kScore >= kStartRegisters && Budget::kProducer <= kStartRegisters;
}
static_assert(budget_fits<false>() && budget_fits<true>());

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// setmaxnreg to kRegisters, up or down from the start.
template <int kRegisters>
__device__ __forceinline__ void set_registers() {
  if constexpr (kRegisters > kStartRegisters) {
    raise_registers<kRegisters>();
  } else if constexpr (kRegisters < kStartRegisters) {
    lower_registers<kRegisters>();
  }
}
#endif

enum NamedBarrier : int {
  kFull0 = 1,  // and kFull0 + 1: one per K buffer
  kPFull = 3,
  kPEmpty = 4,
  kConsumers = 5,
  kProducers = 6,
  kOutput0 = 7,  // and kOutput0 + 1: a consumer warpgroup's staged output half
};

// A CTA pair (h_q 65..128: the two head blocks of a token, one cluster) splits
// each tile's expansion: CTA `rank` expands keys [32 rank, 32 rank + 32) and
// bulk-copies them into the peer's buffer, so each producer does half the work.
inline constexpr int kPairKeys = kKeys / 2;

template <int kDim>
struct Sm90Layout {
  static constexpr int kChunkBytes = 64 * kSwizzleRowBytes;  // 64 rows x 64 values
  static constexpr int kTileBytes = kDim / 64 * kChunkBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kTileBytes;  // two K buffers
  static constexpr int kP = kK + 2 * kTileBytes;
  static constexpr int kAlpha = kP + kChunkBytes;
  static constexpr int kRowMax = kAlpha + kRows * 4;
  static constexpr int kRowSum = kRowMax + kRows * 4;
  static constexpr int kRowFactor = kRowSum + kRows * 4;  // an unsplit row's output factor (staged output)
  static constexpr int kValid = kRowFactor + kRows * 4;  // [2][kKeys]
  // CTA pairs: per K buffer, "the peer's half has landed here" and "the peer's
  // consumers are done with their copy of the buffer" (mbarriers, 8 bytes each).
  static constexpr int kPeerFull = kValid + 2 * kKeys * 4;
  static constexpr int kPeerEmpty = kPeerFull + 2 * 8;
  // Per K buffer: "this CTA's consumers are done with it" (all 256 arrive).
  static constexpr int kConsumed = kPeerEmpty + 2 * 8;
  // Alternating tiles (sm90_alternating.cuh): FULL and EMPTY mbarriers per K buffer half, [kind][buffer][half],
  // then the four hand-offs between the consumers.
  static constexpr int kHalfBarriers = kConsumed + 2 * 8;
  // The Q tile's tensor-map loads have landed (one arrival plus their bytes).
  static constexpr int kQueryLoaded = kHalfBarriers + 12 * 8;
  static constexpr int kBarriersEnd = kQueryLoaded + 8;
  // ... and the even tiles' P, which the odd tiles' warpgroup reads: for d_qk 576 in K buffer 0's RoPE
  // columns (only Q K^T reads them, and the buffer's right half is released after this P's last reader),
  // else a chunk of its own.
  static constexpr int kEvenP = kDim > kValueDim
                                    ? kK + kValueDim / 64 * kChunkBytes
                                    : (kBarriersEnd + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr int kBytes = kDim > kValueDim ? kBarriersEnd : kEvenP + kChunkBytes;
  static constexpr int kPairChunkBytes = kPairKeys * kSwizzleRowBytes;  // half of a 64-row region
  static constexpr int kPairBytes = kDim / 64 * kPairChunkBytes + kPairKeys * 4;  // K rows and valid flags
  static constexpr int kDynamicBytes = kBytes + kSwizzleAtomBytes;  // slack to align the base to 1024 B
  static_assert(kDynamicBytes <= 227 * 1024, "an H100 block has 227 KB of shared memory");
  // The copying kernel's output slots (tensor stores, d 512): 4 KB for each consumer warp, two
  // 16-row x 64-value boxes. Warps 0-1 of each warpgroup use the two P tiles (free once the
  // item's last P V is done), warps 2-3 a region after the rest.
  static constexpr bool kHasOutputSlots = kDim == kValueDim;
  static constexpr int kOutputSlotBytes = 2 * 16 * kSwizzleRowBytes;
  static constexpr int kOutputSlots = kBytes;
  static constexpr int kCopyingBytes = kHasOutputSlots ? kOutputSlots + 4 * kOutputSlotBytes : kBytes;
  static constexpr int kCopyingDynamicBytes = kCopyingBytes + kSwizzleAtomBytes;
  static_assert(kCopyingDynamicBytes <= 227 * 1024, "an H100 block has 227 KB of shared memory");
  static_assert(!kHasOutputSlots ||
                (kOutputSlots % kSwizzleAtomBytes == 0 && kEvenP % kSwizzleAtomBytes == 0 && kP % kSwizzleAtomBytes == 0));
  static_assert(2 * kOutputSlotBytes == kChunkBytes, "two slots a P tile");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The heads of the block that starts at head0: p.head_block_rows of them (64, or
// 32 / 16 in unpaired FP8 CTAs of small split launches); the tile's other rows are
// padding, whose results are never written.
__device__ __forceinline__ HeadBlockRows block_rows(const SparseAttentionParams& p, int token, int head0) {
  return {p, token, head0, p.head_block_rows};
}

// Q rows of the head block into the swizzled Q tile (rows past h_q are zero), by the 256 consumer threads.
// Aligned rows travel by cp.async, all of a thread's 16-byte units in flight at
// once: a load-then-store loop waited one memory latency per unit (16 of them).
template <int kDim>
__device__ __forceinline__ void load_query(const SparseAttentionParams& p, int token, int head0, std::uint8_t* q_tile,
                                           int consumer_thread) {
  load_query_rows<kRows, kDim, kConsumerThreads, true>(
      p, consumer_thread, block_rows(p, token, head0),
      [&](int row, int unit) { return q_tile + (unit / 8) * (64 * kSwizzleRowBytes) + swizzled_offset(row, unit % 8); });
  cp_async_commit();
  cp_async_wait_all();
}

// The Q tile by the tensor memory accelerator, one 64-value box per 128-byte
// swizzled region (heads past h_q arrive as zeros): issued by one thread, waited on
// by the consumers (stage_query). One bulk request per region keeps the whole tile
// in flight: the consumers' 16-byte cp.async of it waited several memory latencies,
// about a quarter of a short prefill CTA's time (ncu, docs/PERF.md).
template <int kDim>
__device__ __forceinline__ void request_query(const SparseAttentionParams& p, int token, int head0, std::uint8_t* smem) {
  using Layout = Sm90Layout<kDim>;
  const std::uint32_t loaded = smem_address(smem + Layout::kQueryLoaded);
  mbarrier_arrive_expect_bytes(loaded, kDim / 64 * Layout::kChunkBytes);
  const std::uint64_t read_once = l2_evict_first_policy();
#pragma unroll
  for (int region = 0; region < kDim / 64; ++region) {
    tensor_load_3d(smem_address(smem + Layout::kQ + region * Layout::kChunkBytes), p.q_tensor_map, 64 * region, head0,
                   token, loaded, read_once);
  }
}

// Both consumer warpgroups: the Q tile is in shared memory and visible to wgmma.
// `parity`: of the Q tiles this CTA loaded before (a persistent CTA loads one per work item).
template <int kDim>
__device__ __forceinline__ void stage_query(const SparseAttentionParams& p, int token, int head0, std::uint8_t* smem,
                                            int consumer_thread, int parity = 0) {
  if (p.q_by_tensor_map) {
    mbarrier_wait(smem_address(smem + Sm90Layout<kDim>::kQueryLoaded), parity);
    return;
  }
  load_query<kDim>(p, token, head0, smem + Sm90Layout<kDim>::kQ, consumer_thread);
  fence_view_async_shared();
  named_barrier_sync(kConsumers, kConsumerThreads);
}

// O *= alpha per row of a wgmma m64n256 accumulator (this thread's two rows), before the next P V.
__device__ __forceinline__ void rescale_rows(float (&o)[128], float alpha_row0, float alpha_row8) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= alpha_row0;
    o[4 * i + 1] *= alpha_row0;
    o[4 * i + 2] *= alpha_row8;
    o[4 * i + 3] *= alpha_row8;
  }
  pin_registers(o);
}

// The same where some row of the warp changed its max: a warp whose rows all kept
// theirs (alpha exactly 1) skips the 128 multiplies, most tiles of a long prefill.
__device__ __forceinline__ void rescale_changed_rows(float (&o)[128], float alpha_row0, float alpha_row8) {
  if (__any_sync(0xFFFFFFFFu, alpha_row0 != 1.0f || alpha_row8 != 1.0f)) rescale_rows(o, alpha_row0, alpha_row8);
}

// stmatrix x4 of a warp's 16 rows x two 8-column units (both the P store and the
// staged output): the row this lane addresses and which of the two units it is in.
struct MatrixLane {
  int row;   // 16 warp + 8 (block % 2) + lane % 8, block = lane / 8
  int unit;  // 0 or 1: block / 2
};
__device__ __forceinline__ MatrixLane matrix_lane(int warp, int lane) {
  return {16 * warp + 8 * ((lane / 8) % 2) + lane % 8, lane / 16};
}

// An unsplit bf16 output whose rows start on 16 bytes is staged through shared
// memory (write_output_half); the score warpgroup then leaves each row's factor there.
__device__ __forceinline__ bool output_is_staged(const SparseAttentionParams& p) {
  return p.num_splits == 1 && p.out_aligned_16;
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// This thread's two rows' output factors, as the score warpgroup left them (publish_block_rows).
template <int kDim>
struct RowFactors {
  float value[2];
  __device__ RowFactors(const std::uint8_t* smem, int warp, int lane) {
    const float* factor_s = reinterpret_cast<const float*>(smem + Sm90Layout<kDim>::kRowFactor);
    value[0] = factor_s[16 * warp + lane / 4];
    value[1] = factor_s[16 * warp + lane / 4 + 8];
  }
};

// One stmatrix x4 of n-tiles 2 j and 2 j + 1 of a warp's accumulator (v = o + 8 j),
// scaled by the rows' factors, at this lane's row address (matrix_lane).
__device__ __forceinline__ void store_scaled_tile_pair(std::uint32_t address, float* v, const float (&factor)[2]) {
  // Converted here, after the last pair's stmatrix: hoisting them all measured spills in the value warpgroup.
  asm volatile("" : "+f"(v[0]), "+f"(v[1]), "+f"(v[2]), "+f"(v[3]), "+f"(v[4]), "+f"(v[5]), "+f"(v[6]), "+f"(v[7]));
  store_matrices_x4(address, pack_bf16(v[0] * factor[0], v[1] * factor[0]), pack_bf16(v[2] * factor[1], v[3] * factor[1]),
                    pack_bf16(v[4] * factor[0], v[5] * factor[0]), pack_bf16(v[6] * factor[1], v[7] * factor[1]));
}

// Writes one consumer warpgroup's 256 output columns, half `half` (the wgmma
// m64n256 accumulator: warp w's quarter is rows 16 w .. 16 w + 15 in 32 m16n8 fragments).
// A bf16 output with 16-byte aligned rows goes through shared memory (the Q tile,
// which no wgmma reads any more once both warpgroups are here): stmatrix of the
// scaled fragments, then each warp stores whole 512-byte row halves. Writing the
// fragments straight out took 64 four-byte stores a thread, each warp's store
// touching 8 rows, and cost the consumers a tenth of a prefill CTA's time.
template <int kDim>
__device__ __forceinline__ void write_output_half(const SparseAttentionParams& p, float (&o)[128],
                                                  std::uint8_t* smem, int token, int head0, int split, int half,
                                                  const float* row_max, const float* row_sum, int warp, int lane) {
  const HeadBlockRows rows = block_rows(p, token, head0);
  if (!output_is_staged(p)) {
    write_output_fragments<1, kHalfColumns / 8>(p, split, rows, 16 * warp, half * kHalfColumns, lane, row_max, row_sum,
                                                [&](int /*mt*/, int nt, int i) { return o[4 * nt + i]; });
    return;
  }
  using Layout = Sm90Layout<kDim>;
  constexpr int kUnitsPerHalf = kHalfColumns / 8;
  const RowFactors<kDim> factors(smem, warp, lane);
  const std::uint32_t stage = smem_address(smem + Layout::kQ);
  const MatrixLane at = matrix_lane(warp, lane);
#pragma unroll
  for (int pair = 0; pair < kUnitsPerHalf / 2; ++pair) {  // n-tiles 2 pair and 2 pair + 1
    const int unit = half * kUnitsPerHalf + 2 * pair + at.unit;
    store_scaled_tile_pair(stage + (unit / 8) * Layout::kChunkBytes + swizzled_offset(at.row, unit % 8), o + 8 * pair,
                           factors.value);
  }
  named_barrier_sync(kOutput0 + half, 128);
  const int unit = half * kUnitsPerHalf + lane;
#pragma unroll 4
  for (int row = warp; row < kRows; row += 4) {
    if (!rows.live(row)) continue;
    const uint4 value =
        *reinterpret_cast<const uint4*>(smem + Layout::kQ + (unit / 8) * Layout::kChunkBytes + swizzled_offset(row, unit % 8));
    *reinterpret_cast<uint4*>(p.out + token * p.stride_out_t + rows.head(row) * p.stride_out_h + unit * 8) = value;
  }
}

// CTA pairs: once a tile's rows are stored, each sender sends its producers' rows
// (K rows and valid flags) into the peer's copy of buffer `buffer`, once the peer's
// consumers are done with it. A sender is kPeerSenderThreads producer threads:
// - 128 (V4 and other d 512 rows): all producers meet at a named barrier, then
//   thread 0 sends the CTA's 32 rows, one bulk copy a 64-row region, and makes its
//   own kPeerFull expect the peer's half;
// - 32 (V3.2's d 576 rows): each warp's lane 0 sends the warp's rows as soon as they
//   are stored, so no warp waits for the slowest (thread 0 arms kPeerFull in
//   wait_buffer_free). A warp's keys of a round are kWarpRows consecutive rows, so
//   each region takes one bulk copy a round.
// Measured (docs/PERF.md, session 30): by warp, V3.2 b = 128 ran 4.6% faster and the
// V4 pairs 0.6-2.2% slower. Each unit sent by st.async as it was stored (as FlashMLA
// does) was 13-33% slower.
template <class Loader>
inline constexpr int kPeerSenderThreads = Loader::kDim > kValueDim ? 32 : 128;
// Whether producer thread `thread` (0..127) is the one of its sender that sends
// (thread 0 spelled out: the compiler cannot know thread < 128, and % 128 cost an AND).
template <class Loader>
__device__ __forceinline__ bool sends_to_peer(int thread) {
  return kPeerSenderThreads<Loader> == 128 ? thread == 0 : thread % kPeerSenderThreads<Loader> == 0;
}

template <class Loader>
__device__ __forceinline__ void send_rows_to_peer(std::uint8_t* smem, int tile, int buffer, std::uint32_t rank,
                                                  int thread) {
  using Layout = Sm90Layout<Loader::kDim>;
  constexpr bool kByWarp = kPeerSenderThreads<Loader> == 32;
  static_assert(kByWarp || kPeerSenderThreads<Loader> == 128);
  constexpr int kKeysPerRound = 128 / Loader::kParts;
  constexpr int kRounds = kPairKeys / kKeysPerRound;
  constexpr int kWarpRows = kKeysPerRound / 4;  // Loader::key_of: warp w's keys of a round are kWarpRows w ...
  static_assert(kRounds * kKeysPerRound == kPairKeys && kWarpRows * 4 % 16 == 0);
  constexpr int kRuns = kByWarp ? kRounds : 1;                 // runs of consecutive rows a sender sends
  constexpr int kRunRows = kByWarp ? kWarpRows : kPairKeys;
  if constexpr (kByWarp) {
    __syncwarp();  // the warp's stores, before lane 0's copy reads them
  } else {
    // Thread 0's sends of the tile before read the other buffer, which every producer
    // stores the next tile into once past this meeting: those reads end first.
    if (thread == 0) bulk_wait_sources_read();
    named_barrier_sync(kProducers, 128);  // every producer thread's rows are in (and fenced)
  }
  if (!sends_to_peer<Loader>(thread)) return;
  const std::uint32_t peer = rank ^ 1u;
  const std::uint32_t full = smem_address(smem + Layout::kPeerFull + 8 * buffer);
  const std::uint32_t peer_full = peer_address(full, peer);
  if (tile >= 2) mbarrier_wait(smem_address(smem + Layout::kPeerEmpty + 8 * buffer), ((tile - 2) / 2) & 1);
  if constexpr (!kByWarp) mbarrier_arrive_expect_bytes(full, Layout::kPairBytes);
  const int warp = thread / 32;
#pragma unroll
  for (int run = 0; run < kRuns; ++run) {
    const int row = static_cast<int>(rank) * kPairKeys + (kByWarp ? run * kKeysPerRound + warp * kWarpRows : 0);
    const std::uint32_t k_rows = smem_address(smem + Layout::kK + buffer * Layout::kTileBytes) + row * kSwizzleRowBytes;
#pragma unroll
    for (int region = 0; region < Loader::kDim / 64; ++region) {
      const std::uint32_t at = k_rows + region * Layout::kChunkBytes;
      bulk_copy_to_peer(peer_address(at, peer), at, kRunRows * kSwizzleRowBytes, peer_full);
    }
    const std::uint32_t flags = smem_address(smem + Layout::kValid) + (buffer * kKeys + row) * 4;
    bulk_copy_to_peer(peer_address(flags, peer), flags, kRunRows * 4, peer_full);
  }
  bulk_commit();
}

// mbarrier_wait, whose cycles thread 0 of the waiting warpgroup adds to the trace's
// sum for `site` (SMLA_SM90_TRACE builds; otherwise only the wait).
__device__ __forceinline__ void wait_at(WaitSite site, int thread, std::uint32_t barrier, std::uint32_t parity) {
  const long long begin = trace_clock();
  mbarrier_wait(barrier, parity);
  if (thread == 0) trace_wait(site, begin);
}
// named_barrier_sync, timed likewise.
__device__ __forceinline__ void sync_at(WaitSite site, int thread, int barrier, int threads) {
  const long long begin = trace_clock();
  named_barrier_sync(barrier, threads);
  if (thread == 0) trace_wait(site, begin);
}

// The producers' two hand-offs of K buffer `buffer` around tile `tile`, the same
// for both producers: wait until the consumers (and, in a pair, the last bulk
// sends) are done with the tile two back; publish the stored tile to the
// consumers (and the peer). Sent by warp, thread 0 also makes this CTA's kPeerFull
// expect the peer's half of the tile here (that barrier's phase for the tile two
// back completed before this CTA's consumers released the buffer), and each warp's
// sends from the buffer must have read it before the warp stores into it again
// (sent by thread 0 after a meeting, that wait is in the meeting: send_rows_to_peer).
template <class Loader, bool kPair>
__device__ __forceinline__ void wait_buffer_free(std::uint8_t* smem, int tile, int buffer, int thread) {
  using Layout = Sm90Layout<Loader::kDim>;
  constexpr bool kByWarp = kPair && kPeerSenderThreads<Loader> == 32;
  if (tile >= 2) {
    if constexpr (kByWarp) {
      if (sends_to_peer<Loader>(thread)) bulk_wait_sources_read();  // its warp's last sends from this buffer
      __syncwarp();
    }
    wait_at(kWaitProducerFree, thread, smem_address(smem + Layout::kConsumed + 8 * buffer), ((tile - 2) / 2) & 1);
  }
  if (kByWarp && thread == 0) {
    mbarrier_arrive_expect_bytes(smem_address(smem + Layout::kPeerFull + 8 * buffer), Layout::kPairBytes);
  }
}
template <class Loader, bool kPair>
__device__ __forceinline__ void publish_tile(std::uint8_t* smem, int tile, int buffer, std::uint32_t rank, int thread) {
  fence_view_async_shared();  // for wgmma and the bulk copy (async proxy)
  if constexpr (kPair) send_rows_to_peer<Loader>(smem, tile, buffer, rank, thread);
  named_barrier_arrive(kFull0 + buffer, kThreads);
}

template <class Loader, bool kPair>
__device__ __forceinline__ void run_producer(const SparseAttentionParams& p, std::uint8_t* smem, int token, int begin,
                                             int end, int n_main, int num_tiles, int thread, std::uint32_t rank) {
  using Layout = Sm90Layout<Loader::kDim>;
  constexpr int kKeysPerRound = 128 / Loader::kParts;
  constexpr int kRounds = (kPair ? kPairKeys : kKeys) / kKeysPerRound;  // this CTA's rounds per tile
  static_assert(kRounds >= 1 && kRounds * kKeysPerRound == (kPair ? kPairKeys : kKeys));
  const int first_row = kPair ? static_cast<int>(rank) * kPairKeys : 0;  // of the rows this CTA expands
  int* valid_s = reinterpret_cast<int*>(smem + Layout::kValid);
  const int part = Loader::part_of(thread);
  const int key_in_round = Loader::key_of(thread);
  const int total_rounds = num_tiles * kRounds;

  // Rows are loaded kAhead passes before they are stored (a gather from device
  // memory takes far longer than one pass), and each index value is requested a
  // pass before its row load needs it (request_key / resolve_key).
  // The kAhead + 1 shares form a ring, pass r in slot r % kRing. With two or
  // more passes ahead the loop is unrolled kRing times so every slot index is a
  // constant (measured on V3.2 when it ran two passes ahead: 3-5% faster than moving the shares down).
  // With one pass ahead, moving a share down after its pass's loads were issued
  // waits for those loads (Nsight Compute, docs/PERF.md, session 25); unrolled, it
  // measured faster for unpaired d 512 CTAs of many keys, but slower for small
  // batches (whose code runs cold) and CTA pairs, which keep the moves.
  constexpr int kAhead = Loader::kPassesAhead;
  constexpr int kRing = kAhead + 1;
  constexpr bool kUnrollLongCtas = Loader::kDim == 512 && !kPair;
  constexpr bool kLean = kLeanProducer<kPair>;
  constexpr bool kMayPack = kMayPackKeys<kPair>;
  auto request_round = [&](int round) {
    const int position = begin + round / kRounds * kKeys + first_row + (round % kRounds) * kKeysPerRound + key_in_round;
    return request_key<kMayPack>(p, token, position, end, n_main);  // past `end`: nothing is read
  };
  auto load_share = [&](const KeySlot& key, typename Loader::Share& share) {
    if (kZeroRowLoads && kLean) {
      Loader::load(key_source(p, key.source), key.slot, key.valid, part, share);  // invalid: kZeroRow
    } else if (key.valid) {
      Loader::load(key_source(p, key.source), key.slot, true, part, share);
    } else {
      share = {};  // an invalid key's row is zero
    }
  };
  KeySlot keys[kRing];
  typename Loader::Share shares[kRing];
  PendingKey pending;
  // One pass: requests and loads pass round + kAhead into `incoming`, stores pass `round` from `current`.
  auto run_pass = [&](int round, int current, int incoming) {
    if (thread == 0) trace_wait_for_load(kWaitProducerIndex, pending.word);
    keys[incoming] = resolve_key<kMayPack>(p, pending);  // requested a pass ago
    pending = request_round(round + kAhead + 1);
    load_share(keys[incoming], shares[incoming]);
    const int tile = round / kRounds;
    const int buffer = tile & 1;
    if (round % kRounds == 0) wait_buffer_free<Loader, kPair>(smem, tile, buffer, thread);
    const int key = first_row + (round % kRounds) * kKeysPerRound + key_in_round;
    const float fp8_scale = key_source(p, keys[current].source).fp8_scale;
    if (thread == 0 && round == 0) trace_when_loaded(kTraceRows0In, shares[current].units[0].x);
    if (thread == 0) trace_wait_for_load(kWaitProducerRows, shares[current].units[0].x);
    Loader::template store<kFastScaleDecode && kLean>(smem + Layout::kK + buffer * Layout::kTileBytes, key, part,
                                                      shares[current], fp8_scale);
    if (part == 0) valid_s[buffer * kKeys + key] = keys[current].valid ? 1 : 0;
    if (round % kRounds == kRounds - 1) {
      publish_tile<Loader, kPair>(smem, tile, buffer, rank, thread);
      if (thread == 0 && tile == 0) trace(kTraceTile0Stored);
      if (thread == 0 && tile == num_tiles - 1) trace(kTraceLastTileStored);
    }
  };
#pragma unroll
  for (int i = 0; i < kAhead; ++i) keys[i] = resolve_key<kMayPack>(p, request_round(i));
  if (thread == 0) trace(kTraceFirstKeys);
#pragma unroll
  for (int i = 0; i < kAhead; ++i) load_share(keys[i], shares[i]);
  pending = request_round(kAhead);
  auto run_unrolled = [&] {
    for (int base = 0; base < total_rounds; base += kRing) {
#pragma unroll
      for (int slot = 0; slot < kRing; ++slot) {
        if (base + slot >= total_rounds) break;
        run_pass(base + slot, slot, (slot + kAhead) % kRing);  // the incoming slot was stored a pass ago
      }
    }
  };
  auto run_moving = [&] {
    for (int round = 0; round < total_rounds; ++round) {
      run_pass(round, 0, kAhead);
#pragma unroll
      for (int i = 0; i < kAhead; ++i) {
        keys[i] = keys[i + 1];
        shares[i] = shares[i + 1];
      }
    }
  };
  if constexpr (kAhead > 1) {
    run_unrolled();
  } else if (kUnrollLongCtas && !p.prefetch_rows) {
    run_unrolled();
  } else {
    run_moving();
  }
  // Before the CTA may exit, every sender's copies have read their source.
  if (kPair && sends_to_peer<Loader>(thread)) bulk_wait_sources_read();
}

// Once a consumer thread's P V is done (the wgmma wait covers its reads of the
// buffer) it releases the buffer to this CTA's producers: every consumer thread
// arrives, because an mbarrier arrival releases only the arriving thread's own
// accesses (one lane per warp after __syncwarp measured no faster, and racecheck
// reported the other lanes' reads). A CTA pair's consumers also tell the peer's
// producer, one arrival per warp, that it may send the next half into this buffer
// (that write is a bulk copy, ordered after the peer's wait).
template <int kDim, bool kPair>
__device__ __forceinline__ void release_buffer(std::uint8_t* smem, int tile, int num_tiles, int buffer, int lane,
                                               std::uint32_t rank) {
  if (tile + 2 >= num_tiles) return;  // the last two tiles: the producers stop sending
  mbarrier_arrive(smem_address(smem + Sm90Layout<kDim>::kConsumed + 8 * buffer));
  if constexpr (kPair) __syncwarp();  // the warp's reads, ordered before lane 0's release to the peer
  if (kPair && lane == 0) {
    mbarrier_arrive_peer(peer_address(smem_address(smem + Sm90Layout<kDim>::kPeerEmpty + 8 * buffer), rank ^ 1u));
  }
}

// Consumers of a CTA pair also wait for the peer's half of the tile.
template <int kDim, bool kPair>
__device__ __forceinline__ void wait_full(std::uint8_t* smem, int tile, int buffer, WaitSite site, int thread) {
  const long long begin = trace_clock();
  named_barrier_sync(kFull0 + buffer, kThreads);
  if constexpr (kPair) mbarrier_wait(smem_address(smem + Sm90Layout<kDim>::kPeerFull + 8 * buffer), (tile / 2) & 1);
  if (thread == 0) trace_wait(site, begin);
}

// S = Q K^T of one K buffer (64 rows x 64 keys), complete on return.
template <int kDim>
__device__ __forceinline__ void score_tile(float (&s)[32], std::uint64_t q_desc, std::uint64_t k_desc) {
  using Layout = Sm90Layout<kDim>;
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kDim / 16; ++step) {
    const std::uint32_t offset = (step / 4) * Layout::kChunkBytes + (step % 4) * 32;
    wgmma_m64n64k16_ss<0>(s, advance_desc(q_desc, offset), advance_desc(k_desc, offset), step > 0 ? 1 : 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  pin_registers(s);
}

// Invalid keys score -inf; the tile's max of this thread's two rows (a row lives in the 4 lanes of a quad).
__device__ __forceinline__ void mask_scores(float (&s)[32], const int* valid, int lane, float (&tile_max)[2]) {
  tile_max[0] = -INFINITY;
  tile_max[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int2 flags = *reinterpret_cast<const int2*>(valid + 8 * i + 2 * (lane % 4));  // one 8-byte load a key pair
    const bool v0 = flags.x != 0;
    const bool v1 = flags.y != 0;
    s[4 * i] = v0 ? s[4 * i] : -INFINITY;
    s[4 * i + 1] = v1 ? s[4 * i + 1] : -INFINITY;
    s[4 * i + 2] = v0 ? s[4 * i + 2] : -INFINITY;
    s[4 * i + 3] = v1 ? s[4 * i + 3] : -INFINITY;
    tile_max[0] = fmaxf(tile_max[0], fmaxf(s[4 * i], s[4 * i + 1]));
    tile_max[1] = fmaxf(tile_max[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  tile_max[0] = row_reduce_max<4>(tile_max[0]);
  tile_max[1] = row_reduce_max<4>(tile_max[1]);
}

// s = exp2((s - reference) * scale_log2), argument <= 0 (NaN for a NaN score), added to row_sum.
// For ordinary logits one FMA gives it, s * scale_log2 - reference * scale_log2,
// but the FMA exposes the rounding error of the shift (half an ulp of
// reference * scale_log2): harmless below 2^12 (a relative error of p under 1e-4),
// 2^100 and more at scales near f32's end (exp2 of it is inf). Past 2^12 the
// difference is taken first (a rare, slower path).
__device__ __forceinline__ void exponentiate_scores(float (&s)[32], const float (&reference)[2], float scale_log2,
                                                    float (&row_sum)[2]) {
  constexpr float kMaxFmaShift = 4096.0f;
  const float shift0 = -reference[0] * scale_log2;
  const float shift1 = -reference[1] * scale_log2;
  if (fabsf(shift0) <= kMaxFmaShift && fabsf(shift1) <= kMaxFmaShift) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i % 4) / 2;
      s[i] = fast_exp2(fmaf(s[i], scale_log2, h == 0 ? shift0 : shift1));
      row_sum[h] += s[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i % 4) / 2;
      s[i] = fast_exp2((s[i] - reference[h]) * scale_log2);
      row_sum[h] += s[i];
    }
  }
}

// Both of this thread's rows take the tile's max into their running max: the
// reference the tile's scores are exponentiated against, the factor alpha for what
// was accumulated before, and the row sums rescaled by it.
__device__ __forceinline__ void advance_rows(float (&row_max)[2], const float (&tile_max)[2], float scale_log2,
                                             float (&reference)[2], float (&alpha)[2], float (&row_sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const RowRescale step = advance_row_max(row_max[h], tile_max[h], scale_log2);
    reference[h] = step.reference;
    alpha[h] = step.alpha;
    row_sum[h] *= alpha[h];
  }
}

// P as the A fragments of the four 16-key steps of P V: [step][r] holds keys
// 16 step + 8 (r / 2) + 2 (lane % 4) + {0, 1} of row row0 (r even) or row0 + 8.
using Probabilities = std::uint32_t[4][4];

__device__ __forceinline__ void pack_probabilities(const float (&s)[32], Probabilities& probabilities) {
#pragma unroll
  for (int step = 0; step < 4; ++step) {
#pragma unroll
    for (int r = 0; r < 4; ++r) probabilities[step][r] = pack_bf16(s[8 * step + 2 * r], s[8 * step + 2 * r + 1]);
  }
}

// P into a swizzled 64 x 64 bf16 chunk of shared memory, where the other
// warpgroup's wgmma reads it: per 16-key step, one stmatrix of the warp's four
// 8x8 blocks (rows 0-7 / 8-15 x the step's two 8-key units).
__device__ __forceinline__ void store_probabilities(std::uint32_t p_address, const Probabilities& probabilities,
                                                    int warp, int lane) {
  const MatrixLane at = matrix_lane(warp, lane);
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    store_matrices_x4(p_address + swizzled_offset(at.row, 2 * step + at.unit), probabilities[step][0],
                      probabilities[step][1], probabilities[step][2], probabilities[step][3]);
  }
}

// The N-major descriptor of V columns [256 half, 256 half + 256) of the K buffer at k_address.
template <int kDim>
__device__ __forceinline__ std::uint64_t value_half_desc(std::uint32_t k_address, int half) {
  using Layout = Sm90Layout<kDim>;
  return make_sw128_desc(k_address + half * (kHalfColumns / 64) * Layout::kChunkBytes, Layout::kChunkBytes,
                         kSwizzleAtomBytes);
}

// O (256 columns) += P V, P from registers; committed, not waited for.
__device__ __forceinline__ void issue_pv_from_registers(float (&o)[128], const Probabilities& probabilities,
                                                        std::uint64_t v_desc) {
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    wgmma_m64n256k16_rs<1>(o, probabilities[step], advance_desc(v_desc, step * 16 * kSwizzleRowBytes), 1);
  }
  wgmma_commit();
}

// O (256 columns) += P V, P from a shared-memory chunk; committed, not waited for.
__device__ __forceinline__ void issue_pv_from_shared(float (&o)[128], std::uint32_t p_address, std::uint64_t v_desc) {
  const std::uint64_t p_desc = make_sw128_desc(p_address, 16, kSwizzleAtomBytes);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    wgmma_m64n256k16_ss<1>(o, advance_desc(p_desc, step * 32), advance_desc(v_desc, step * 16 * kSwizzleRowBytes), 1);
  }
  wgmma_commit();
}

// The block's statistics of this thread's two rows once all tiles are in (row_sum
// the whole row's): lane 0 of the quad publishes them (max_s / sum_s, and lse /
// max_logits or the split partials) and, for a staged output, the row's output
// factor, computed once here for both consumer warpgroups (the sink is a load
// from device memory).
template <int kDim>
__device__ __forceinline__ void publish_block_rows(const SparseAttentionParams& p, std::uint8_t* smem, int token,
                                                   int head0, int split, int row0, int lane, const float (&row_max)[2],
                                                   const float (&row_sum)[2]) {
  using Layout = Sm90Layout<kDim>;
  if (lane % 4 != 0) return;
  float* max_s = reinterpret_cast<float*>(smem + Layout::kRowMax);
  float* sum_s = reinterpret_cast<float*>(smem + Layout::kRowSum);
  float* factor_s = reinterpret_cast<float*>(smem + Layout::kRowFactor);
  const HeadBlockRows rows = block_rows(p, token, head0);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    publish_row_statistics(p, split, rows, row, row_max[h], row_sum[h], max_s, sum_s);
    if (output_is_staged(p)) {
      factor_s[row] = rows.live(row) ? row_output_factor(p, rows.head(row), row_max[h], row_sum[h]) : 0.0f;
    }
  }
}

template <class Loader, bool kPair>
__device__ __forceinline__ void run_score_warpgroup(const SparseAttentionParams& p, std::uint8_t* smem, int token,
                                                    int head0, int split, int num_tiles, int thread,
                                                    std::uint32_t rank) {
  using Layout = Sm90Layout<Loader::kDim>;
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int row0 = 16 * warp + lane / 4;  // this thread's rows: row0 and row0 + 8
  const int* valid_s = reinterpret_cast<const int*>(smem + Layout::kValid);
  float* alpha_s = reinterpret_cast<float*>(smem + Layout::kAlpha);
  std::uint8_t* p_tile = smem + Layout::kP;
  const std::uint64_t q_desc = make_sw128_desc(smem_address(smem + Layout::kQ), 16, kSwizzleAtomBytes);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw dot products (the scale multiplies differences)
  float row_sum[2] = {0.0f, 0.0f};            // this thread's share; the quad's shares meet at the end

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buffer = tile & 1;
    const std::uint32_t k_address = smem_address(smem + Layout::kK + buffer * Layout::kTileBytes);
    wait_full<Loader::kDim, kPair>(smem, tile, buffer, kWaitScoreFull, thread);
    if (thread == 0 && tile == 0) trace(kTraceTile0Full);

    float s[32];
    score_tile<Loader::kDim>(s, q_desc, make_sw128_desc(k_address, 16, kSwizzleAtomBytes));
    if (thread == 0 && tile == 0) trace(kTraceScores0);
    float tile_max[2];
    mask_scores(s, valid_s + buffer * kKeys, lane, tile_max);
    float alpha[2];
    float reference[2];
    advance_rows(row_max, tile_max, p.scale_log2, reference, alpha, row_sum);
    exponentiate_scores(s, reference, p.scale_log2, row_sum);
    Probabilities probabilities;
    pack_probabilities(s, probabilities);

    // P and the rescale factors for the value warpgroup (one buffer: wait until it read the last ones).
    if (tile > 0) sync_at(kWaitScorePEmpty, thread, kPEmpty, kConsumerThreads);
    store_probabilities(smem_address(p_tile), probabilities, warp, lane);
    if (lane % 4 == 0) {
      alpha_s[row0] = alpha[0];
      alpha_s[row0 + 8] = alpha[1];
    }
    fence_view_async_shared();
    named_barrier_arrive(kPFull, kConsumerThreads);

    // O[:, 0:256] = alpha O + P V.
    rescale_changed_rows(o, alpha[0], alpha[1]);
    issue_pv_from_registers(o, probabilities, value_half_desc<Loader::kDim>(k_address, 0));
    wgmma_wait<0>();
    pin_registers(o);
    release_buffer<Loader::kDim, kPair>(smem, tile, num_tiles, buffer, lane, rank);
  }

  if (thread == 0) trace(kTraceTilesDone);
  // Row statistics: the quad's partial sums meet.
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] = row_reduce_sum<4>(row_sum[h]);
  publish_block_rows<Loader::kDim>(p, smem, token, head0, split, row0, lane, row_max, row_sum);
  if (thread == 0) trace(kTraceStatsPublished);
  named_barrier_sync(kConsumers, kConsumerThreads);
  if (thread == 0) trace(kTraceScoreBarrier);
  write_output_half<Loader::kDim>(p, o, smem, token, head0, split, 0,
                                  reinterpret_cast<const float*>(smem + Layout::kRowMax),
                                  reinterpret_cast<const float*>(smem + Layout::kRowSum), warp, lane);
  if (thread == 0) trace(kTraceOutputWritten);
}

template <class Loader, bool kPair>
__device__ __forceinline__ void run_value_warpgroup(const SparseAttentionParams& p, std::uint8_t* smem, int token,
                                                    int head0, int split, int begin, int end, int n_main, int num_tiles,
                                                    int thread, std::uint32_t rank) {
  using Layout = Sm90Layout<Loader::kDim>;
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int row0 = 16 * warp + lane / 4;
  const float* alpha_s = reinterpret_cast<const float*>(smem + Layout::kAlpha);
  const std::uint32_t p_address = smem_address(smem + Layout::kP);

  // This warpgroup mostly waits for the producer; meanwhile it asks L2 for the
  // rows of the tile kPrefetchTiles ahead (two threads a key: row, scales), so
  // the producer's loads find them there. Tiles 1..kPrefetchTiles - 1 go first.
  // A CTA of a pair fetches only the rows it expands (threads 0..63).
  const int first_row = kPair ? static_cast<int>(rank) * kPairKeys : 0;
  auto request_prefetch = [&](int tile) {
    return request_key<kMayPackKeys<kPair>>(p, token, begin + tile * kKeys + first_row + thread / 2, end,
                                             n_main);  // past `end`: nothing is read
  };
  auto prefetch = [&](const PendingKey& pending) {
    const KeySlot key = resolve_key<kMayPackKeys<kPair>>(p, pending);
    if (key.valid) Loader::prefetch_l2(key_source(p, key.source), key.slot, thread % 2);
  };
  // Only where the plan asks (p.prefetch_rows: rows that L2 already holds gain nothing).
  const bool prefetching = p.prefetch_rows && (!kPair || thread < 2 * kPairKeys);
  if (prefetching) {
    PendingKey first[kPrefetchTiles - 1];
#pragma unroll
    for (int i = 0; i < kPrefetchTiles - 1; ++i) first[i] = request_prefetch(i + 1);
#pragma unroll
    for (int i = 0; i < kPrefetchTiles - 1; ++i) prefetch(first[i]);
  }
  PendingKey upcoming = prefetching ? request_prefetch(kPrefetchTiles) : PendingKey{};

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buffer = tile & 1;
    const std::uint64_t v_desc =
        value_half_desc<Loader::kDim>(smem_address(smem + Layout::kK + buffer * Layout::kTileBytes), 1);
    wait_full<Loader::kDim, kPair>(smem, tile, buffer, kWaitValueFull, thread);
    sync_at(kWaitValuePFull, thread, kPFull, kConsumerThreads);
    // Always: the skipping branch cost this warpgroup registers it does not have (ptxas spilled).
    rescale_rows(o, alpha_s[row0], alpha_s[row0 + 8]);
    issue_pv_from_shared(o, p_address, v_desc);
    if (prefetching) {  // while P V runs
      prefetch(upcoming);
      upcoming = request_prefetch(tile + 1 + kPrefetchTiles);
    }
    wgmma_wait<0>();
    pin_registers(o);
    if (tile + 1 < num_tiles) named_barrier_arrive(kPEmpty, kConsumerThreads);
    release_buffer<Loader::kDim, kPair>(smem, tile, num_tiles, buffer, lane, rank);
  }
  named_barrier_sync(kConsumers, kConsumerThreads);
  if (thread == 0) trace(kTraceValueBarrier);
  write_output_half<Loader::kDim>(p, o, smem, token, head0, split, 1,
                                  reinterpret_cast<const float*>(smem + Layout::kRowMax),
                                  reinterpret_cast<const float*>(smem + Layout::kRowSum), warp, lane);
  if (thread == 0) trace(kTraceValueDone);
}

// Splits a merging lane has in flight (half a row's columns a warp: 8 registers a split).
inline constexpr int kFoldSplitsInFlight = 8;

// Where the launch folds the combine (SparseAttentionParams::fold_splits; unpaired
// CTAs only), the cluster's CTAs are the splits of one (token, head block). After
// the cluster's barrier, CTA `split` merges rows split, split + num_splits, ... of
// its block, kFoldWarpsARow consumer warps to a row (`thread` < kConsumerThreads).
__device__ __forceinline__ void merge_cluster_rows(const SparseAttentionParams& p, int token, int head0, int split,
                                                   int thread) {
  const int warp = thread / 32;
  const HeadBlockRows rows = block_rows(p, token, head0);
  for (int row = split + p.num_splits * (warp / kFoldWarpsARow); row < p.head_block_rows;
       row += p.num_splits * kFoldRowsARound) {
    if (!rows.live(row)) continue;
    const int token_of_row = rows.token(row);
    const int head = rows.head(row);
    combine_split_row<kFoldSplitsInFlight, kFoldWarpsARow>(p, split_row(p, token_of_row, head), token_of_row, head,
                                                            thread % 32, warp % kFoldWarpsARow);
  }
}

// The dynamic shared memory, its base aligned to the 1024-byte swizzle atom.
__device__ __forceinline__ std::uint8_t* aligned_shared_memory(std::uint8_t* smem_raw) {
  const std::uint32_t raw_address = smem_address(smem_raw);
  return smem_raw + ((kSwizzleAtomBytes - raw_address % kSwizzleAtomBytes) % kSwizzleAtomBytes);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#include "src/cuda/sm90/sm90_alternating.cuh"  // uses the helpers above

// kPair: launched as clusters of the two head blocks of a token (grid y = 2).
template <class Loader, bool kTokenMajor, bool kPair>
__global__ void __launch_bounds__(kThreads, 1) sm90_attention_kernel(const __grid_constant__ SparseAttentionParams p) {
  static_assert(!(kPair && kTokenMajor), "a pair's CTAs start together anyway");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  allow_dependent_launch();
  // Staged FP8 rows: of the copying grid and the direct one, only the one the staging chose works.
  if (p.run_gate != nullptr && *p.run_gate != p.run_gate_value) return;
  using Layout = Sm90Layout<Loader::kDim>;
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  // (Not aligned_shared_memory(): through it ptxas spilled 24 bytes in the FP8-rows kernels.)
  const std::uint32_t raw_address = smem_address(smem_raw);
  std::uint8_t* smem = smem_raw + ((kSwizzleAtomBytes - raw_address % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  const long long trace_start = trace_global_time();
  if (threadIdx.x == 0) trace(kTraceStart);

  // Blocks start in x-fastest order. kTokenMajor renumbers them so that a
  // token's head blocks start together and the second reads the rows the first
  // just brought into L2.
  const int dispatch = static_cast<int>(blockIdx.x + blockIdx.y * gridDim.x);
  const int head_blocks = static_cast<int>(gridDim.y);
  const int slot = kTokenMajor ? dispatch / head_blocks : static_cast<int>(blockIdx.x);
  // Behind the token order prepass (launched programmatically): nothing is read before its order is out.
  // Without the prepass (a step's order computed by an earlier call) the wait returns at once.
  int token = slot;
  if (p.token_order != nullptr) {
    wait_for_prior_grid();
    const int ordered = p.token_order[slot];
    if (static_cast<unsigned>(ordered) < static_cast<unsigned>(p.num_tokens)) token = ordered;
  }
  const int head0 = (kTokenMajor ? dispatch % head_blocks : static_cast<int>(blockIdx.y)) * p.head_block_rows;
  const int split = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  std::uint32_t rank = 0;
  if constexpr (kPair) rank = cluster_rank();
  // Copied rows run the alternating-tiles kernel (sm90_alternating.cuh).
  static_assert(!Loader::kCopiesRows);
  if (tid == 0) {
    if (p.q_by_tensor_map) prefetch_tensor_map(p.q_tensor_map);  // fetched while the barriers are set up
    mbarrier_init(smem_address(smem + Layout::kQueryLoaded), 1);
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(smem_address(smem + Layout::kConsumed + 8 * b), kConsumerThreads);
      if constexpr (kPair) {
        mbarrier_init(smem_address(smem + Layout::kPeerFull + 8 * b), 1);   // this CTA's expect-bytes arrival
        mbarrier_init(smem_address(smem + Layout::kPeerEmpty + 8 * b), kConsumerThreads / 32);  // the peer's consumer warps
      }
    }
    fence_mbarrier_init_cluster();  // the barriers, before tensor loads (async proxy) complete on one
  }
  if constexpr (kPair) {
    cluster_sync();  // both CTAs' barriers exist before either uses the other's
  } else {
    __syncthreads();
  }
  if (tid == 0) trace(kTraceBarriersReady);

  // This split's share of the token's valid keys, from the length values on the device.
  const auto [n_main, begin, end] = split_keys<kKeys>(token_key_counts(p, token), p.num_splits, split);
  const int warpgroup = tid / 128;
  if (begin >= end) {  // the same for both CTAs of a pair: neither touches the other
    write_empty_split_rows<kRows, kThreads>(p, split, tid, block_rows(p, token, head0));
    if (kPair || !p.fold_splits) return;  // folding, it meets the cluster's other CTAs below like them
  } else {
    const int num_tiles = (end - begin + kKeys - 1) / kKeys;
    if (tid == 0) trace(kTraceLengthsRead);

    using Budget = RegisterBudget<false>;
    if (warpgroup == 2) {
      set_registers<Budget::kProducer>();
      run_producer<Loader, kPair>(p, smem, token, begin, end, n_main, num_tiles, tid - kConsumerThreads, rank);
    } else if (warpgroup == 0) {
      if (p.q_by_tensor_map && tid == 0) request_query<Loader::kDim>(p, token, head0, smem);
      set_registers<Budget::kScore>();
      stage_query<Loader::kDim>(p, token, head0, smem, tid);
      if (tid == 0) trace(kTraceQueryStaged);
      run_score_warpgroup<Loader, kPair>(p, smem, token, head0, split, num_tiles, tid, rank);
    } else {
      set_registers<Budget::kValue>();
      stage_query<Loader::kDim>(p, token, head0, smem, tid);
      run_value_warpgroup<Loader, kPair>(p, smem, token, head0, split, begin, end, n_main, num_tiles, tid - 128, rank);
    }
  }
  // One merge for both paths (each inlined copy of it is 14 KB of kernel code); none
  // in the paired kernel, whose registers have no room for it (20 bytes spilled).
  // Every thread's arrival releases its partials, the wait acquires the others';
  // the producers then leave: the merge runs on the consumers' registers.
  if (!kPair && p.fold_splits) {
    cluster_sync();
    if (warpgroup != 2) merge_cluster_rows(p, token, head0, split, tid);
  }
  // No CTA leaves while its peer may still reach into it. Each consumer warp's
  // arrivals on the peer's kPeerEmpty are waited for by the peer's producer before
  // its next send, and the sends by their receiver's consumers, so none is in flight here.
  if constexpr (kPair) cluster_meet();
  if (tid == 0) trace(kTraceEnd);
  trace_finish(trace_start);
#else
  (void)p;  // never launched: the host uses this kernel only on sm_90 devices of an sm_90a build
#endif
}

}  // namespace smla::cuda::sm90
