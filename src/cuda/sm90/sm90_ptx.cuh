// Hopper (sm_90a) building blocks of the sm90 attention kernel: shared-memory
// matrix descriptors for 128-byte-swizzled tiles, the wgmma fence / commit /
// wait protocol, named barriers and warpgroup register reallocation.
// Compiled to real instructions only for sm_90a; other targets see stubs that
// are never launched (the host dispatch checks the device first).
#pragma once

#include <cstdint>

#include "src/cuda/common/ptx.cuh"

namespace smla::cuda::sm90 {

// A 128-byte-swizzled tile: rows of 64 bf16 values (128 B); 16-byte unit c of
// row r sits at unit c ^ (r % 8). Tiles start on 1024-byte boundaries.
inline constexpr int kSwizzleRowBytes = 128;
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows

__device__ __forceinline__ std::uint32_t swizzled_offset(int row, int unit16) {
  return static_cast<std::uint32_t>(row * kSwizzleRowBytes + ((unit16 ^ (row & 7)) << 4));
}

// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (all >> 4), 128-byte swizzle (mode 1, bits 62-63).
__device__ __forceinline__ std::uint64_t make_sw128_desc(std::uint32_t smem_byte_address, std::uint32_t leading_bytes,
                                                         std::uint32_t stride_bytes) {
  return static_cast<std::uint64_t>((smem_byte_address & 0x3FFFFu) >> 4) |
         (static_cast<std::uint64_t>((leading_bytes & 0x3FFFFu) >> 4) << 16) |
         (static_cast<std::uint64_t>((stride_bytes & 0x3FFFFu) >> 4) << 32) | (std::uint64_t{1} << 62);
}

// The descriptor of the same tile `bytes` further on (a multiple of 16): the
// start address field is the low 14 bits (address >> 4), and shared-memory
// addresses stay below 256 KB, so the add never carries into the other fields.
__device__ __forceinline__ std::uint64_t advance_desc(std::uint64_t desc, std::uint32_t bytes) {
  return desc + (bytes >> 4);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Generic-proxy shared-memory writes become visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// A CTA pair (a cluster of two) shares expanded K tiles: mbarriers that the peer
// arrives on, bulk copies from this CTA's shared memory into the peer's.
__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// All threads of both CTAs: what either wrote before is visible to both after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// All threads of both CTAs have arrived, with no memory ordering: for the pair's
// last meeting, where every access one CTA makes to the other's shared memory was
// already waited for on an mbarrier. (A release there waited for the CTA's output
// stores: ERRBAR, 7% of a V3.2 b=2 decode's warp samples, ncu, docs/PERF.md.)
__device__ __forceinline__ void cluster_meet() {
  asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait;\n" ::: "memory");
}
// The address of the same shared-memory byte in CTA `rank` of the cluster.
__device__ __forceinline__ std::uint32_t peer_address(std::uint32_t local, std::uint32_t rank) {
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ void mbarrier_init(std::uint32_t barrier, std::uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival on this CTA's barrier, which also expects `bytes` of bulk copies.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(std::uint32_t barrier, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}
// One arrival (CTA-scope release of this thread's earlier accesses).
__device__ __forceinline__ void mbarrier_arrive(std::uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}
// An arrival on `barrier` once every cp.async this thread issued so far has
// landed (.noinc: it counts against the barrier's expected arrivals).
__device__ __forceinline__ void cp_async_arrive_when_done(std::uint32_t barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}
// One arrival on a barrier of the peer CTA (a shared::cluster address). Default
// (CTA-scope release) semantics: a cluster-scope release costs a MEMBAR.GPU that
// waits for the thread's loads in flight.
__device__ __forceinline__ void mbarrier_arrive_peer(std::uint32_t peer_barrier) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(peer_barrier) : "memory");
}
// Waits until the barrier's phase of this parity has completed. Default (CTA-scope
// acquire) semantics: a cluster-scope acquire invalidates L1 on every poll.
__device__ __forceinline__ void mbarrier_wait(std::uint32_t barrier, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16) from this CTA's shared memory to the peer's, completing
// on the peer's barrier; in this thread's bulk group.
__device__ __forceinline__ void bulk_copy_to_peer(std::uint32_t peer_destination, std::uint32_t source, std::uint32_t bytes,
                                                  std::uint32_t peer_barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          peer_destination),
      "r"(source), "r"(bytes), "r"(peer_barrier)
      : "memory");
}
// One box of a 3-D tensor map (a __grid_constant__ parameter) into this CTA's shared
// memory at coordinates {x, y, z}, completing `bytes` on the barrier, under an L2 policy.
__device__ __forceinline__ void tensor_load_3d(std::uint32_t destination, const void* tensor_map, int x, int y, int z,
                                               std::uint32_t barrier, std::uint64_t l2_policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(destination),
      "l"(reinterpret_cast<std::uint64_t>(tensor_map)), "r"(x), "r"(y), "r"(z), "r"(barrier), "l"(l2_policy)
      : "memory");
}
// One box of this CTA's shared memory out to a 3-D tensor map at {x, y, z}, in this
// thread's bulk group, under an L2 policy.
__device__ __forceinline__ void tensor_store_3d(const void* tensor_map, std::uint32_t source, int x, int y, int z,
                                                std::uint64_t l2_policy) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;\n" ::
                   "l"(reinterpret_cast<std::uint64_t>(tensor_map)),
               "r"(source), "r"(x), "r"(y), "r"(z), "l"(l2_policy)
               : "memory");
}
// Brings a tensor map (a __grid_constant__ parameter) into the descriptor cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(tensor_map)) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk copies have read their sources (the shared memory may be written again).
__device__ __forceinline__ void bulk_wait_sources_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// The same for all but this thread's newest kPending bulk groups.
template <int kPending>
__device__ __forceinline__ void bulk_wait_older_sources_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// An L2 policy that keeps lines over others: KV rows, which many tokens' CTAs read.
__device__ __forceinline__ std::uint64_t l2_evict_last_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// An L2 policy that gives lines up first: Q rows and outputs, each touched once, so
// they do not push out the KV rows (evict_last) that other CTAs read again; 0.3-4%
// on the d 512 prefill cases (docs/PERF.md, session 35).
__device__ __forceinline__ std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp.async of 16 bytes (L1 bypassed) under an L2 policy, asking L2 for the whole
// 256-byte block around it: a row's next units are then in L2 when their copies come.
__device__ __forceinline__ void cp_async_16_keep(std::uint32_t smem, const void* global, std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(global),
               "l"(policy)
               : "memory");
}
template <int kRegisters>
__device__ __forceinline__ void raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
#endif

// Named barriers: `sync` waits for `threads` arrivals (its own included);
// `arrive` counts one thread without waiting. These are the non-.aligned forms
// (barrier.sync, barrier.arrive): the warpgroups reach one barrier from
// different code (producer, score and value paths), and bar.sync / bar.arrive
// mean barrier.*.aligned, which PTX defines only when every thread of the CTA
// executes the same instruction. compute-sanitizer synccheck reported the
// aligned form as divergent, and racecheck an intermittent hazard beside it.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Four 8x8 bf16 matrices from their m16n8 accumulator-layout fragments (lane l
// holds row l / 4, values 2 (l % 4) and + 1 of each, packed) into shared memory:
// lanes 8 j .. 8 j + 7 give the addresses of matrix j's rows 0..7.
__device__ __forceinline__ void store_matrices_x4(std::uint32_t row_address, std::uint32_t m0, std::uint32_t m1,
                                                  std::uint32_t m2, std::uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_address), "r"(m0),
               "r"(m1), "r"(m2), "r"(m3)
               : "memory");
}

// 2^x in one MUFU instruction. exp2f without fast math adds a range check and two
// multiplies to keep subnormal results; here they flush to zero. A softmax weight
// below 2^-126 of the row's largest changes no sum or output that f32 holds.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Keeps the compiler from moving reads or writes of an accumulator across the
// wgmma issue / wait points (the registers change asynchronously in between).
template <int kCount>
__device__ __forceinline__ void pin_registers(float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(values[i])::"memory");
}

}  // namespace smla::cuda::sm90
