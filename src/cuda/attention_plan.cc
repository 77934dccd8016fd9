#include "src/cuda/attention_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "src/cuda/current_device.h"
#include "src/cuda/pack_union.h"
#include "src/cuda/sparse_attention_params.h"

namespace smla::cuda {
namespace {

constexpr std::size_t kWorkspaceAlign = 256;

struct DeviceInfo {
  int ordinal = 0;
  int sm_count = 0;
  int smem_optin = 0;
  int cc_major = 0;
};

Status cuda_failure(const char* what, cudaError_t error) {
  return internal_error(fmt::format("cuda: {} failed: {}", what, cudaGetErrorString(error)));
}

Expected<DeviceInfo> current_device_info() {
  static std::mutex mutex;
  static std::array<DeviceInfo, 64> cache{};
  const Expected<int> current = current_device();
  if (!current) return current.status();
  const int device = *current;
  if (device < 0 || device >= static_cast<int>(cache.size())) return unimplemented("cuda: device ordinal above 63");
  std::lock_guard<std::mutex> lock(mutex);
  DeviceInfo& info = cache[static_cast<std::size_t>(device)];
  if (info.sm_count == 0) {
    info.ordinal = device;
    cudaError_t error = cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, device);
    if (error == cudaSuccess) error = cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (error == cudaSuccess) error = cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, device);
    if (error != cudaSuccess) {
      info.sm_count = 0;
      return cuda_failure("cudaDeviceGetAttribute", error);
    }
  }
  return info;
}

struct RingChoice {
  int stages = 1;
  int k_buffers = 1;
  int blocks_per_sm = 0;
};

// The shared-memory layout of a kernel variant on this device, chosen by, in
// order: more CTAs per SM (they hide each other's barriers), a second K tile
// (the expansion of the next tile then overlaps P V), more raw KV tiles in
// flight per SM, (CTAs per SM) x (stages). One stage is the fallback for small
// shared memories (sm89, sm120): it issues the next tile where two stages would,
// with one buffer. Depends only on the device and the kernel variant, so it is
// computed once per pair.
Expected<RingChoice> choose_ring(const AttentionVariant& variant, LoaderKind kind, const DeviceInfo& device) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int>, RingChoice> cache;  // the sm90 and portable 64-row variants differ in smem
  const auto key = std::make_tuple(device.ordinal, static_cast<int>(kind), variant.rows, variant.fixed_smem_bytes);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = cache.find(key); found != cache.end()) return found->second;
  RingChoice best;
  auto rank = [](const RingChoice& c) {
    return std::make_tuple(c.blocks_per_sm, c.k_buffers, c.blocks_per_sm * c.stages);
  };
  for (int k_buffers = 1; k_buffers <= 2; ++k_buffers) {
    for (int stages = 1; stages <= kMaxKvStages; ++stages) {
      const int smem = variant.smem_bytes(stages, k_buffers);
      if (smem > device.smem_optin) break;
      int blocks = 0;
      const cudaError_t error = variant.blocks_per_sm(smem, &blocks);
      if (error != cudaSuccess) return cuda_failure("occupancy query", error);
      const RingChoice candidate{stages, k_buffers, blocks};
      if (rank(candidate) > rank(best)) best = candidate;
    }
  }
  cache.emplace(key, best);
  return best;
}

std::size_t align_up(std::size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

std::size_t partial_out_bytes(const AttentionPlan& plan, std::int64_t tokens, std::int64_t heads) {
  return align_up(static_cast<std::size_t>(plan.num_splits) * static_cast<std::size_t>(tokens) *
                  static_cast<std::size_t>(heads) * kValueDim * sizeof(float));
}
std::size_t partial_stat_bytes(const AttentionPlan& plan, std::int64_t tokens, std::int64_t heads) {
  return align_up(static_cast<std::size_t>(plan.num_splits) * static_cast<std::size_t>(tokens) *
                  static_cast<std::size_t>(heads) * sizeof(float));
}

std::size_t pack_keys_bytes(const AttentionPlan& plan, std::int64_t tokens) {
  return align_up(static_cast<std::size_t>(tokens / plan.pack_tokens) * static_cast<std::size_t>(plan.pack_capacity) *
                  2 * sizeof(std::uint32_t));
}
std::size_t pack_counts_bytes(const AttentionPlan& plan, std::int64_t tokens) {
  return align_up(static_cast<std::size_t>(tokens / plan.pack_tokens) * sizeof(int));
}

constexpr int kMaxTileRows = 64;
// Packed tiles stop at 32 rows by default: a 64-row tile runs one CTA per SM where
// 16/32-row tiles run two (measured 1.26-1.35x slower packed than unpacked at h 16/32).
constexpr int kDefaultPackMaxRows = 32;

int tile_rows_for(std::int64_t rows) { return rows <= 16 ? 16 : (rows <= 32 ? 32 : 64); }

// SMLA_CUDA_PACK_MAX_ROWS = 0/16/32/64 forces the plain rule (the largest g within
// that many rows) for A/B runs and tests; unset, packing is tuned.
PackRule pack_rule_from_environment() {
  const char* setting = std::getenv("SMLA_CUDA_PACK_MAX_ROWS");
  if (setting == nullptr) return PackRule{kDefaultPackMaxRows, true};
  return PackRule{std::clamp(std::atoi(setting), 0, kMaxTileRows), false};
}

// Prefetching rows into L2 a few tiles ahead (sm90 kernel) pays when they come
// from device memory: decode-sized grids, measured 5-11% faster on CONFIG1-4
// (docs/PERF.md). Long prefill launches find their rows in L2 already and lost
// 12% to the extra requests. SMLA_SM90_PREFETCH=on / off overrides (A/B runs).
constexpr std::int64_t kPrefetchMaxWaves = 4;

bool prefetch_rows_wanted(std::int64_t ctas, std::int64_t slots) {
  const char* setting = std::getenv("SMLA_SM90_PREFETCH");
  if (setting != nullptr && std::string_view(setting) == "on") return true;
  if (setting != nullptr && std::string_view(setting) == "off") return false;
  return ctas <= kPrefetchMaxWaves * slots;
}

}  // namespace

int choose_pack_tokens(std::int64_t num_heads, std::int64_t num_keys, std::int64_t queries_per_request, PackRule rule) {
  if (queries_per_request < 2 || num_heads < 1 || num_heads >= rule.max_rows || num_keys < 1) return 1;
  std::int64_t best = 1;
  for (std::int64_t g = 2; g <= std::min<std::int64_t>(queries_per_request, kMaxPackTokens); ++g) {
    if (queries_per_request % g != 0 || g * num_heads > rule.max_rows || g * num_keys > kMaxPackEntries) continue;
    if (!rule.only_when_fewer_rows) {
      best = g;
      continue;
    }
    // Tile rows per token, g's against best's: strictly fewer, or as few with more sharing.
    const std::int64_t candidate = tile_rows_for(g * num_heads) * best;
    const std::int64_t current = tile_rows_for(best * num_heads) * g;
    if (candidate < current || (candidate == current && best > 1)) best = g;
  }
  return static_cast<int>(best);
}

Expected<AttentionPlan> plan_attention(LoaderKind kind, std::int64_t num_tokens, std::int64_t num_heads,
                                       std::int64_t num_keys, std::int64_t queries_per_request) {
  auto device = current_device_info();
  if (!device) return device.status();
  AttentionPlan plan;
  plan.pack_tokens = choose_pack_tokens(num_heads, num_keys, queries_per_request, pack_rule_from_environment());
  if (num_tokens % plan.pack_tokens != 0) plan.pack_tokens = 1;  // validation makes s_q divide T
  if (plan.pack_tokens > 1 &&
      pack_union_smem_bytes(static_cast<int>(plan.pack_tokens * num_keys)) > static_cast<std::size_t>(device->smem_optin)) {
    plan.pack_tokens = 1;
  }
  // The smallest tile that holds every head (times the packed tokens; up to 64
  // rows per CTA), shrunk further when the device's shared memory cannot hold it.
  const std::int64_t tile_rows = num_heads * plan.pack_tokens;
  int rows = tile_rows_for(tile_rows);
  // 17-32 heads on an sm90 device, tokens within one wave of 64-row CTAs: the sm90
  // kernel with its padding rows beats two 32-row CTAs a token (docs/PERF.md, TP-h32).
  if (rows == 32 && plan.pack_tokens == 1 && num_tokens <= device->sm_count && sm90_attention_usable()) rows = 64;
  for (;; rows /= 2) {
    // Packed tiles map rows to (token, head) the way the portable kernel does, so they always use it.
    plan.variant = attention_variant(kind, rows, /*portable_only=*/plan.pack_tokens > 1);
    if (plan.variant.smem_bytes(1, 1) <= device->smem_optin) break;
    plan.pack_tokens = 1;  // a smaller tile no longer holds the packed rows
    if (rows == 16) {
      return unimplemented(fmt::format("cuda: the attention kernel needs {} B of shared memory per block, the device "
                                       "allows {} B",
                                       plan.variant.smem_bytes(1, 1), device->smem_optin));
    }
  }
  auto ring = choose_ring(plan.variant, kind, *device);
  if (!ring) return ring.status();
  plan.kv_stages = ring->stages;
  plan.k_buffers = ring->k_buffers;
  plan.smem_bytes = plan.variant.smem_bytes(plan.kv_stages, plan.k_buffers);
  plan.head_blocks = static_cast<int>((num_heads + rows - 1) / rows);

  // Split the keys only when the (token, head block) grid leaves SMs idle, and
  // never into more pieces than there are 32-key tiles.
  const int blocks_per_sm = ring->blocks_per_sm;
  const std::int64_t slots = static_cast<std::int64_t>(device->sm_count) * std::max(blocks_per_sm, 1);
  if (plan.pack_tokens > 1) {
    plan.head_blocks = 1;
    plan.pack_capacity = static_cast<int>(plan.pack_tokens * num_keys);
  }
  const std::int64_t blocks = std::max<std::int64_t>(num_tokens / plan.pack_tokens * plan.head_blocks, 1);
  const std::int64_t tiles = std::max<std::int64_t>((num_keys + kKeysPerTile - 1) / kKeysPerTile, 1);
  plan.num_splits = static_cast<int>(std::clamp<std::int64_t>(std::min(slots / blocks, tiles), 1, kMaxSplits));
  plan.prefetch_rows = prefetch_rows_wanted(blocks * plan.num_splits, slots);
  plan.chain_combine = plan.num_splits > 1 && device->cc_major >= 9;
  if (plan.num_splits > 1) {
    plan.workspace_bytes = partial_out_bytes(plan, num_tokens, num_heads) + 2 * partial_stat_bytes(plan, num_tokens, num_heads);
  }
  if (plan.pack_tokens > 1) plan.workspace_bytes += pack_keys_bytes(plan, num_tokens) + pack_counts_bytes(plan, num_tokens);
  return plan;
}

void assign_workspace(const AttentionPlan& plan, void* workspace, SparseAttentionParams* params) {
  params->num_splits = plan.num_splits;
  params->kv_stages = plan.kv_stages;
  params->k_buffers = plan.k_buffers;
  params->pack_tokens = plan.pack_tokens;
  params->pack_capacity = plan.pack_capacity;
  params->prefetch_rows = plan.prefetch_rows;
  auto* base = static_cast<std::uint8_t*>(workspace);
  if (plan.num_splits > 1) {
    const std::size_t out_bytes = partial_out_bytes(plan, params->num_tokens, params->num_heads);
    const std::size_t stat_bytes = partial_stat_bytes(plan, params->num_tokens, params->num_heads);
    params->partial_out = reinterpret_cast<float*>(base);
    params->partial_sum = reinterpret_cast<float*>(base + out_bytes);
    params->partial_max = reinterpret_cast<float*>(base + out_bytes + stat_bytes);
    base += out_bytes + 2 * stat_bytes;
  }
  if (plan.pack_tokens > 1) {
    params->pack_keys = reinterpret_cast<std::uint32_t*>(base);
    params->pack_counts = reinterpret_cast<int*>(base + pack_keys_bytes(plan, params->num_tokens));
  }
}

Status launch_planned_attention(const AttentionPlan& plan, SparseAttentionParams params, cudaStream_t stream) {
  if (params.num_tokens == 0 || params.num_heads == 0) return Status::Ok();
  cudaError_t error = cudaSuccess;
  if (plan.pack_tokens > 1) {
    error = launch_pack_union(params, stream);
    if (error != cudaSuccess) return cuda_failure("pack prepass launch", error);
  }
  const dim3 grid(static_cast<unsigned>(params.num_tokens / plan.pack_tokens), static_cast<unsigned>(plan.head_blocks),
                  static_cast<unsigned>(plan.num_splits));
  error = plan.variant.launch(params, grid, plan.smem_bytes, stream);
  if (error != cudaSuccess) return cuda_failure("attention kernel launch", error);
  if (plan.num_splits > 1) {
    error = launch_split_combine(params, plan.chain_combine, stream);
    if (error != cudaSuccess) return cuda_failure("split combine launch", error);
  }
  return Status::Ok();
}

}  // namespace smla::cuda
