#include "src/cuda/attention_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "src/cuda/pack_union.h"
#include "src/cuda/token_order.h"
#include "src/cuda/common/sparse_attention_params.h"
#include "src/cuda/common/workspace_align.h"

namespace smla::cuda {
namespace {

Status cuda_failure(const char* what, cudaError_t error) {
  return internal_error(fmt::format("cuda: {} failed: {}", what, cudaGetErrorString(error)));
}

// A device query's answer, computed once per key for the process: the plan runs on
// every call, and the occupancy queries are driver calls. `query` returns an
// Expected<Value>; a failure is returned and not kept.
template <class Key, class Value, class Query>
Expected<Value> query_once(std::mutex& mutex, std::map<Key, Value>& cache, const Key& key, const Query& query) {
  std::lock_guard<std::mutex> lock(mutex);
  if (auto found = cache.find(key); found != cache.end()) return found->second;
  Expected<Value> answer = query();
  if (answer) cache.emplace(key, *answer);
  return answer;
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
Expected<RingChoice> choose_ring(const AttentionVariant& variant, LoaderKind kind, const DeviceProperties& device,
                                 Occupancy occupancy) {
  static std::mutex mutex;
  // The sm90 and portable 64-row variants differ in smem; a nominal device may share a real one's ordinal.
  static std::map<std::tuple<int, int, int, int, int, int>, RingChoice> cache;
  const auto key = std::make_tuple(device.ordinal, static_cast<int>(kind), variant.rows, variant.fixed_smem_bytes,
                                   static_cast<int>(occupancy), device.shared_memory_per_block);
  return query_once(mutex, cache, key, [&]() -> Expected<RingChoice> {
    RingChoice best;
    auto rank = [](const RingChoice& c) {
      return std::make_tuple(c.blocks_per_sm, c.k_buffers, c.blocks_per_sm * c.stages);
    };
    for (int k_buffers = 1; k_buffers <= 2; ++k_buffers) {
      for (int stages = 1; stages <= kMaxKvStages; ++stages) {
        const int smem = variant.smem_bytes(stages, k_buffers);
        if (smem > device.shared_memory_per_block) break;
        int blocks = device.shared_memory_per_block / smem;
        if (occupancy == Occupancy::kQueryDevice) {
          const cudaError_t error = variant.blocks_per_sm(smem, &blocks);
          if (error != cudaSuccess) return cuda_failure("occupancy query", error);
        }
        const RingChoice candidate{stages, k_buffers, blocks};
        if (rank(candidate) > rank(best)) best = candidate;
      }
    }
    return best;
  });
}

std::size_t partial_out_bytes(const AttentionPlan& plan, std::int64_t tokens, std::int64_t heads) {
  return align_workspace(static_cast<std::size_t>(plan.num_splits) * static_cast<std::size_t>(tokens) *
                  static_cast<std::size_t>(heads) * kValueDim * sizeof(float));
}
std::size_t partial_stat_bytes(const AttentionPlan& plan, std::int64_t tokens, std::int64_t heads) {
  return align_workspace(static_cast<std::size_t>(plan.num_splits) * static_cast<std::size_t>(tokens) *
                  static_cast<std::size_t>(heads) * sizeof(float));
}

std::size_t pack_keys_bytes(const AttentionPlan& plan, std::int64_t tokens) {
  return align_workspace(static_cast<std::size_t>(tokens / plan.pack_tokens) * static_cast<std::size_t>(plan.pack_capacity) *
                  2 * sizeof(std::uint32_t));
}
std::size_t pack_counts_bytes(const AttentionPlan& plan, std::int64_t tokens) {
  return align_workspace(static_cast<std::size_t>(tokens / plan.pack_tokens) * sizeof(int));
}

constexpr int kMaxTileRows = 64;
// Packed tiles stop at 32 rows by default: a 64-row tile runs one CTA per SM where
// 16/32-row tiles run two (measured 1.26-1.35x slower packed than unpacked at h 16/32).
constexpr int kDefaultPackMaxRows = 32;

int tile_rows_for(std::int64_t rows) { return rows <= 16 ? 16 : (rows <= 32 ? 32 : 64); }

// Prefetching rows into L2 a few tiles ahead (sm90 kernel) pays where a CTA has
// few keys, so that the requests it makes at its start cover its rows: split
// small batches, 7-10% faster (docs/PERF.md, session 17). CTAs of more keys lost
// up to 13% to it (h_q 128 and V3.2 at b >= 64, 18-32 tiles a CTA) or gained
// nothing (10 tiles), and long prefill launches, which find their rows in L2
// already, lost 12%. TuningOptions::sm90_prefetch overrides (A/B runs).
constexpr std::int64_t kPrefetchMaxWaves = 4;
constexpr std::int64_t kPrefetchMaxKeysPerCta = 4 * kSm90KeysPerTile;  // the kernel's four tiles ahead

// Staging FP8 rows pays on prefill-sized grids: the same rows are read by many
// CTAs, and its passes cost a few launches (docs/PERF.md).
constexpr std::int64_t kStageMinWaves = kPrefetchMaxWaves;
constexpr std::int64_t kDefaultStagingBytes = std::int64_t{256} << 20;

// Requests of more tokens than the portable kernel packs: prefill chunks, whose
// tokens name many of the same rows (queries_per_request is the caller's hint).
bool prefill_chunks(const AttentionShape& shape) { return shape.queries_per_request > kMaxPackTokens; }

// Split small batches of the sm90 FP8 kernel (h_q <= 128, one wave of CTAs): a CTA
// still runs a 64-row tile, but may attend only 32 or 16 of its heads
// (head_block_rows), so the grid runs more CTAs, each writing that fraction of the
// f32 partials (128 KB for 64 heads, bound by the SM's store queue: lg_throttle,
// docs/PERF.md, session 20) and expanding the same keys (the later reads hit L2).
// Fewer heads a block also means fewer splits, so more tiles a CTA. Over 99 timings
// of 29 small-batch shapes (16, 32 and 64 heads a block; docs/PERF.md, session 29) the
// step's time fits 2.5 us x tiles a split + 5.3 us x (heads a block / 64) + 5.9 us x
// (CTAs / slots) + 0.16 us x splits, rms 1.3 us (bench/cuda/head_block_fit.py), and
// the plan takes the size of least such cost, counted in tiles:
constexpr double kHeadRowsCostPer64Heads = 2.1;  // 5.3 / 2.5
constexpr double kCtaCostPerWave = 2.35;         // 5.9 / 2.5
constexpr double kCostPerSplit = 0.063;          // 0.16 / 2.5
constexpr int kSmallHeadBlockRows[] = {32, 16};  // after 64; ties keep the larger blocks
// CTA pairs (h_q 65-128) share the expansion of long CTAs, but the six split launches
// of one to three tiles a split timed both ways ran 3-9% faster unpaired.
constexpr std::int64_t kPairMinTilesPerSplit = 4;
// TuningOptions::sm90_head_block_rows forces a size.

// The fitted time of a split small-batch launch, in tiles (the weights above).
double fitted_cost_in_tiles(std::int64_t tiles_per_split, std::int64_t heads_per_block, std::int64_t ctas, int splits,
                            std::int64_t slots) {
  return static_cast<double>(tiles_per_split) +
         kHeadRowsCostPer64Heads * static_cast<double>(heads_per_block) / kMaxTileRows +
         kCtaCostPerWave * static_cast<double>(ctas) / static_cast<double>(slots) + kCostPerSplit * splits;
}

// Head blocks of `rows` heads that a token's h_q heads take.
int head_blocks_of(const AttentionShape& shape, int rows) {
  return static_cast<int>((shape.num_heads + rows - 1) / rows);
}

bool prefetch_rows_wanted(std::int64_t ctas, std::int64_t slots, std::int64_t keys_per_cta,
                          TuningOptions::Switch setting) {
  if (setting == TuningOptions::Switch::kOn) return true;
  if (setting == TuningOptions::Switch::kOff) return false;
  return ctas <= kPrefetchMaxWaves * slots && keys_per_cta <= kPrefetchMaxKeysPerCta;
}

// The token order prepass (token_order.h) serves the sm90 kernel of FP8 rows (the
// copying kernel walks its own work items), unpacked. Auto: decode grids of more
// than one wave, where a long token's CTA in the last wave sets the end (random
// lengths: 15-28% faster, docs/PERF.md, session 31); within one wave the order
// changes nothing and the prepass would cost its launch.
bool order_tokens_wanted(KernelFamily family, const AttentionShape& shape, const AttentionPlan& plan, std::int64_t ctas,
                         std::int64_t slots, TuningOptions::Switch setting) {
  if (family != KernelFamily::kSm90 || rows_stored_as_bf16(shape.kind) || plan.pack_tokens > 1 ||
      setting == TuningOptions::Switch::kOff) {
    return false;
  }
  return setting == TuningOptions::Switch::kOn || (shape.decode && ctas > slots);
}

}  // namespace

// SMLA_CUDA_PACK_MAX_ROWS / pack_max_rows = 0/16/32/64 forces the plain rule
// (the largest g within that many rows) for A/B runs and tests.
PackRule pack_rule(const TuningOptions& tuning) {
  if (tuning.pack_max_rows < 0) return PackRule{kDefaultPackMaxRows, true};
  return PackRule{std::clamp(tuning.pack_max_rows, 0, kMaxTileRows), false};
}

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

namespace {

// Tokens packed per CTA: the rule's choice when the group divides T and its
// key union fits the device's shared memory.
int packed_tokens(const AttentionShape& shape, const DeviceProperties& device, const TuningOptions& tuning) {
  const int g = choose_pack_tokens(shape.num_heads, shape.num_keys, shape.queries_per_request, pack_rule(tuning));
  if (shape.num_tokens % g != 0) return 1;  // validation makes s_q divide T
  if (g > 1 && pack_union_smem_bytes(static_cast<int>(g * shape.num_keys)) >
                   static_cast<std::size_t>(device.shared_memory_per_block)) {
    return 1;
  }
  return g;
}

// The portable kernel's tile: the smallest that holds every head (times the
// packed tokens; up to 64 rows per CTA), shrunk while the device's shared
// memory cannot hold it (which also ends packing).
Status choose_portable_tile(LoaderKind kind, std::int64_t num_heads, const DeviceProperties& device,
                            AttentionPlan* plan) {
  for (int rows = tile_rows_for(num_heads * plan->pack_tokens);; rows /= 2) {
    plan->variant = attention_variant(kind, rows);
    if (plan->variant.smem_bytes(1, 1) <= device.shared_memory_per_block) return Status::Ok();
    plan->pack_tokens = 1;
    if (rows == 16) {
      return unimplemented(fmt::format("cuda: the attention kernel needs {} B of shared memory per block, the device "
                                       "allows {} B",
                                       plan->variant.smem_bytes(1, 1), device.shared_memory_per_block));
    }
  }
}

std::size_t planned_workspace_bytes(const AttentionPlan& plan, const AttentionShape& shape) {
  std::size_t bytes = 0;
  if (plan.num_splits > 1) {
    bytes = partial_out_bytes(plan, shape.num_tokens, shape.num_heads) +
            2 * partial_stat_bytes(plan, shape.num_tokens, shape.num_heads);
  }
  if (plan.pack_tokens > 1) bytes += pack_keys_bytes(plan, shape.num_tokens) + pack_counts_bytes(plan, shape.num_tokens);
  if (plan.order_tokens) bytes += token_order_bytes(shape.num_tokens);
  return bytes;
}

// The tiled FP8 format (V4, V3.2) a row source reads, if it reads one.
std::optional<KvFormat> tiled_fp8_format(LoaderKind kind) {
  if (static_cast<int>(kind) >= KvFormats::kSize) return std::nullopt;
  const auto format = static_cast<KvFormat>(kind);
  if (kv_format_info(format).layout != KvRowLayout::kTiledNopeRope) return std::nullopt;
  return format;
}

// Attaches staged FP8 rows (src/cuda/staged_rows.h) to the sm90 plan `direct`
// when the tuning and the shape ask for them. prefill_sized: more than a few
// waves of unsplit CTAs.
Status plan_staging(const AttentionShape& shape, const DeviceProperties& device, const TuningOptions& tuning,
                    Occupancy occupancy, bool prefill_sized, AttentionPlan* direct) {
  const auto format = tiled_fp8_format(shape.kind);
  const auto setting = tuning.sm90_stage_rows;
  if (!format || setting == TuningOptions::Switch::kOff || shape.num_keys > INT32_MAX) return Status::Ok();
  const bool automatic = setting == TuningOptions::Switch::kAuto;
  if (automatic && !prefill_sized) return Status::Ok();  // decode: no second plan to make
  const int head_dim = kv_format_info(*format).head_dim;
  AttentionShape copied = shape;
  copied.kind = flat_bf16_loader_kind(head_dim);
  auto copying = plan_attention(KernelFamily::kSm90, copied, device, tuning, occupancy);
  if (!copying) return copying.status();
  const std::int64_t max_rows = tuning.sm90_staging_rows > 0
                                    ? tuning.sm90_staging_rows
                                    : kDefaultStagingBytes / (head_dim * static_cast<std::int64_t>(sizeof(std::uint16_t)));
  StagedRowsPlan staged{*copying, *format,
                        staging_layout(shape.num_tokens, static_cast<int>(shape.num_keys), head_dim, max_rows)};
  staged.gated = shape.num_tokens * shape.num_keys > staged.layout.capacity_rows;
  staged.stage_on_overflow = !automatic || prefill_chunks(shape);
  // A gated call has one combine for whichever grid ran: both must split alike.
  if (staged.gated && copying->num_splits != direct->num_splits) return Status::Ok();
  if (automatic && copying->num_splits != 1) return Status::Ok();
  direct->workspace_bytes = std::max(direct->workspace_bytes, copying->workspace_bytes) + staged.layout.bytes();
  direct->staged = std::make_shared<const StagedRowsPlan>(std::move(staged));
  return Status::Ok();
}

// The partials' share of a staged plan's workspace; the staging buffers follow it.
std::size_t partials_bytes(const AttentionPlan& plan) {
  return plan.workspace_bytes - (plan.staged ? plan.staged->layout.bytes() : 0);
}

// The heads a 64-row tile of the sm90 kernel attends: TuningOptions::sm90_head_block_rows
// where set, else, for a split launch of FP8 rows and at most 128 heads, the size of
// least cost above (unpaired; CTA pairs kept for 65-128 heads whose 64-head split
// has kPairMinTilesPerSplit tiles or more). `split_for(head_blocks)` is the split of
// that many blocks a token, `slots` the CTAs of one wave; `split` is updated to the
// chosen blocks' split.
template <class SplitFor, class Split>
Status choose_head_block_rows(const AttentionShape& shape, const TuningOptions& tuning, const SplitFor& split_for,
                              std::int64_t slots, AttentionPlan* plan, Split* split) {
  const int forced = tuning.sm90_head_block_rows;
  if (forced != 0 && forced != 16 && forced != 32 && forced != kMaxTileRows) {
    return invalid_argument("TuningOptions::sm90_head_block_rows", "0, 16, 32 or 64", std::to_string(forced));
  }
  // Copied rows (bf16) run the alternating kernel, whose blocks stay 64 heads.
  if (rows_stored_as_bf16(shape.kind)) return Status::Ok();
  int rows = forced;
  if (forced == 0) {
    if (shape.num_heads > 2 * kMaxTileRows || split->splits <= 1) return Status::Ok();
    // Staging forced on: a gated call's direct grid shares one combine with the copying
    // kernel's, whose blocks are 64 heads, so both must split alike (plan_staging).
    if (tuning.sm90_stage_rows == TuningOptions::Switch::kOn && tiled_fp8_format(shape.kind)) return Status::Ok();
    if (plan->flags.pair_head_blocks && shape.num_heads > kMaxTileRows &&
        split->tiles_per_split >= kPairMinTilesPerSplit) {
      return Status::Ok();
    }
    const auto cost_of = [&](const Split& s, int candidate) {
      return fitted_cost_in_tiles(s.tiles_per_split, std::min<std::int64_t>(candidate, shape.num_heads),
                                  s.blocks * s.splits, s.splits, slots);
    };
    rows = kMaxTileRows;  // `split` is its split
    double least = cost_of(*split, kMaxTileRows);
    for (int candidate : kSmallHeadBlockRows) {
      const Split s = split_for(head_blocks_of(shape, candidate));
      if (s.splits <= 1) continue;  // the fit covers split launches only
      const double cost = cost_of(s, candidate);
      if (cost < least) {  // a tie keeps the larger blocks
        rows = candidate;
        least = cost;
      }
    }
  }
  plan->head_block_rows = rows;
  plan->head_blocks = head_blocks_of(shape, rows);
  // A CTA pair splits 64-head blocks' tiles; forced 64 keeps the tuning's pairing.
  if (rows != kMaxTileRows || forced == 0) plan->flags.pair_head_blocks = false;
  *split = split_for(plan->head_blocks);
  return Status::Ok();
}

// Clusters of `ctas` one-CTA-an-SM CTAs resident at once on a device not queried:
// a cluster's CTAs share a GPC, taken as 16 usable SMs a GPC of up to 18. On the
// 132 SMs of an H200 this is at most the measured count (docs/PERF.md, session 36:
// 7 for 10-16 CTAs, 9 for 9, 15 for 8, 22 for 5, 30 for 4; here 7, 7, 14, 21, 28).
int nominal_resident_clusters(const DeviceProperties& device, int ctas) {
  return device.multiprocessors / 18 * (16 / ctas);
}

// The device's count of resident clusters of `splits` CTAs of the variant's FP8
// kernel, queried once per (device, rows, shared memory, splits), as choose_ring's queries.
Expected<int> resident_folded_clusters(const AttentionVariant& variant, LoaderKind kind, const DeviceProperties& device,
                                       int smem_bytes, int splits) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int>, int> cache;
  const auto key = std::make_tuple(device.ordinal, static_cast<int>(kind), variant.rows, smem_bytes, splits);
  return query_once(mutex, cache, key, [&]() -> Expected<int> {
    int clusters = 0;
    const cudaError_t error = variant.folded_clusters(smem_bytes, splits, &clusters);
    if (error != cudaSuccess) return cuda_failure("cluster occupancy query", error);
    return clusters;
  });
}

// Whether the sm90 kernel of FP8 rows merges a split launch's partials in its
// clusters (LaunchFlags::fold_splits): unless TuningOptions::sm90_fold_splits is
// off, where the blocks are not CTA pairs and the splits of a block make a cluster
// of at most kMostFoldedClusterCtas, all of the grid's clusters resident at once (the
// device's cluster occupancy; a validating context's nominal count) and each CTA's
// rows merged by its warps in one round (kFoldRowsARound). The splits, and so the workspace, are
// the same either way.
Status plan_folded_splits(KernelFamily family, const AttentionShape& shape, const DeviceProperties& device,
                          const TuningOptions& tuning, Occupancy occupancy, AttentionPlan* plan) {
  plan->flags.fold_splits = false;
  // A gated staged call has one combine for whichever of its grids ran (plan_staging).
  const bool gated = plan->staged != nullptr && plan->staged->gated;
  // Unless switched off: where it applies it measured 0.89-1.005x of the combine
  // kernel (docs/PERF.md, session 38).
  if (family != KernelFamily::kSm90 || rows_stored_as_bf16(shape.kind) || plan->num_splits <= 1 || gated ||
      tuning.sm90_fold_splits == TuningOptions::Switch::kOff) {
    return Status::Ok();
  }
  // The paired kernel has no merge: its registers have no room for it.
  if (runs_as_pairs(plan->flags, plan->head_blocks, plan->head_block_rows) ||
      plan->num_splits > kMostFoldedClusterCtas) {
    return Status::Ok();
  }
  int resident = nominal_resident_clusters(device, plan->num_splits);
  if (occupancy == Occupancy::kQueryDevice) {
    SMLA_ASSIGN_OR_RETURN(resident,
                          resident_folded_clusters(plan->variant, shape.kind, device, plan->smem_bytes, plan->num_splits));
  }
  // Clusters past one wave wait for a whole cluster's SMs to free up (CONFIG1 b = 2: 8 clusters
  // of 10, 39% slower than the combine launch, docs/PERF.md, session 36).
  const std::int64_t clusters = shape.num_tokens * plan->head_blocks;
  // A CTA's merge in one round of its warps, two to a row: with one warp a row, two
  // rounds measured 4-6% slower than the combine launch (64-head blocks of 5 splits,
  // docs/PERF.md, session 37); one round of two-warp rows 0-11% faster (session 38).
  const std::int64_t live_rows = std::min<std::int64_t>(plan->head_block_rows, shape.num_heads);
  const bool one_round = (live_rows + plan->num_splits - 1) / plan->num_splits <= kFoldRowsARound;
  plan->flags.fold_splits = resident > 0 && clusters <= resident && one_round;
  return Status::Ok();
}

}  // namespace

bool sm90_tiles_preferred(const AttentionShape& shape, const DeviceProperties& device) {
  if (shape.num_heads > 16 || !shape.decode) return true;
  return shape.num_tokens <= device.multiprocessors || prefill_chunks(shape);
}

Expected<AttentionPlan> plan_attention(KernelFamily family, const AttentionShape& shape, const DeviceProperties& device,
                                       const TuningOptions& tuning, Occupancy occupancy) {
  AttentionPlan plan;
  // A CTA pair shares the expansion of FP8 rows; bf16 rows are only copied, and each
  // CTA copying its own measured 3-4% faster than a pair's extra hop (docs/PERF.md).
  // (Only the sm90 kernel pairs: the portable one's plan says so too.)
  plan.flags = LaunchFlags{family == KernelFamily::kSm90 && tuning.sm90_pair_head_blocks && !rows_stored_as_bf16(shape.kind),
                           tuning.sm90_token_major};
  int rows = kMaxTileRows;
  if (family == KernelFamily::kSm90) {
    plan.variant = sm90_attention_variant(shape.kind);
    if (plan.variant.smem_bytes(1, 1) > device.shared_memory_per_block) {
      return unimplemented(fmt::format("cuda.sm90: the kernel needs {} B of shared memory per block, the device allows {} B",
                                       plan.variant.smem_bytes(1, 1), device.shared_memory_per_block));
    }
  } else {
    plan.pack_tokens = packed_tokens(shape, device, tuning);
    SMLA_RETURN_IF_ERROR(choose_portable_tile(shape.kind, shape.num_heads, device, &plan));
    rows = plan.variant.rows;
  }
  auto ring = choose_ring(plan.variant, shape.kind, device, occupancy);
  if (!ring) return ring.status();
  plan.kv_stages = ring->stages;
  plan.k_buffers = ring->k_buffers;
  plan.smem_bytes = plan.variant.smem_bytes(plan.kv_stages, plan.k_buffers);
  plan.head_blocks = head_blocks_of(shape, rows);

  // Split the keys only when the (token, head block) grid leaves SMs idle, and
  // never into more pieces than there are tiles (32 keys, 64 in the sm90 kernel).
  const std::int64_t slots = static_cast<std::int64_t>(device.multiprocessors) * std::max(ring->blocks_per_sm, 1);
  if (plan.pack_tokens > 1) {
    plan.head_blocks = 1;
    plan.pack_capacity = static_cast<int>(plan.pack_tokens * shape.num_keys);
  }
  const std::int64_t tile_keys = family == KernelFamily::kSm90 ? kSm90KeysPerTile : kKeysPerTile;
  const std::int64_t tiles = std::max<std::int64_t>((shape.num_keys + tile_keys - 1) / tile_keys, 1);
  struct Split {
    std::int64_t blocks;  // (token, head block) pairs
    std::int64_t tiles_per_split;
    int splits;
  };
  const auto split_for = [&](std::int64_t head_blocks) {
    const std::int64_t blocks = std::max<std::int64_t>(shape.num_tokens / plan.pack_tokens * head_blocks, 1);
    const std::int64_t most_splits = std::clamp<std::int64_t>(std::min(slots / blocks, tiles), 1, kMaxSplits);
    // The kernels round a split up to whole tiles, so of more splits than that
    // needs (e.g. 16 for 18 tiles: 2 tiles each) the last ones would have no keys.
    const std::int64_t tiles_per_split = (tiles + most_splits - 1) / most_splits;
    return Split{blocks, tiles_per_split, static_cast<int>((tiles + tiles_per_split - 1) / tiles_per_split)};
  };
  const Split wide = split_for(plan.head_blocks);  // of 64-head blocks, which decide the staging below
  Split split = wide;
  if (family == KernelFamily::kSm90) {
    SMLA_RETURN_IF_ERROR(choose_head_block_rows(shape, tuning, split_for, slots, &plan, &split));
  }
  const std::int64_t blocks = split.blocks;
  const std::int64_t tiles_per_split = split.tiles_per_split;
  plan.num_splits = split.splits;
  // Only the sm90 kernel prefetches (the plan description reports it).
  plan.prefetch_rows = family == KernelFamily::kSm90 &&
                       prefetch_rows_wanted(blocks * plan.num_splits, slots, tiles_per_split * tile_keys,
                                            tuning.sm90_prefetch);
  plan.flags.persistent_ctas = tuning.sm90_persistent_ctas < 0 ? static_cast<int>(slots) : tuning.sm90_persistent_ctas;
  // On unless turned off: 4-9% on the d 512 prefill cases (docs/PERF.md, session 35).
  plan.flags.tensor_stores = tuning.sm90_tensor_stores != TuningOptions::Switch::kOff;
  const int box_rows = tuning.sm90_output_box_rows;
  if (box_rows != 0 && box_rows != 16 && box_rows != 64) {
    return invalid_argument("TuningOptions::sm90_output_box_rows", "0, 16 or 64", std::to_string(box_rows));
  }
  plan.flags.output_box_rows = box_rows == 0 ? 16 : box_rows;
  plan.order_tokens = order_tokens_wanted(family, shape, plan, blocks * plan.num_splits, slots, tuning.sm90_length_order);
  plan.workspace_bytes = planned_workspace_bytes(plan, shape);
  if (family == KernelFamily::kSm90) {
    const bool prefill_sized = wide.splits == 1 && wide.blocks > kStageMinWaves * slots;
    SMLA_RETURN_IF_ERROR(plan_staging(shape, device, tuning, occupancy, prefill_sized, &plan));
  }
  SMLA_RETURN_IF_ERROR(plan_folded_splits(family, shape, device, tuning, occupancy, &plan));
  plan.chain_combine = plan.num_splits > 1 && device.compute_capability >= 90 && !plan.flags.fold_splits;
  return plan;
}

namespace {

// Points the split partials and the packed union of `params` into `workspace`;
// returns where the token order's place begins (after them).
std::uint8_t* assign_workspace(const AttentionPlan& plan, void* workspace, SparseAttentionParams* params) {
  params->num_splits = plan.num_splits;
  params->kv_stages = plan.kv_stages;
  params->k_buffers = plan.k_buffers;
  params->pack_tokens = plan.pack_tokens;
  params->pack_capacity = plan.pack_capacity;
  params->prefetch_rows = plan.prefetch_rows;
  params->head_block_rows = plan.head_block_rows;
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
    base += pack_keys_bytes(plan, params->num_tokens) + pack_counts_bytes(plan, params->num_tokens);
  }
  return base;
}

// `after_prepass`: the grid reads what the launch just before it writes (the token order).
Status launch_grid(const AttentionPlan& plan, const SparseAttentionParams& params, cudaStream_t stream,
                   bool after_prepass = false) {
  const dim3 grid(static_cast<unsigned>(params.num_tokens / plan.pack_tokens), static_cast<unsigned>(plan.head_blocks),
                  static_cast<unsigned>(plan.num_splits));
  LaunchFlags flags = plan.flags;
  flags.after_prepass = after_prepass;
  const cudaError_t error = plan.variant.launch(params, grid, plan.smem_bytes, flags, stream);
  if (error != cudaSuccess) return cuda_failure("attention kernel launch", error);
  return Status::Ok();
}

Status launch_combine(const AttentionPlan& plan, const SparseAttentionParams& params, cudaStream_t stream) {
  if (plan.num_splits <= 1 || plan.flags.fold_splits) return Status::Ok();  // folded: the grid merged them
  const cudaError_t error = launch_split_combine(params, plan.chain_combine, stream);
  if (error != cudaSuccess) return cuda_failure("split combine launch", error);
  return Status::Ok();
}

// The staging passes of `route` (not kDirectOnly), the copying kernel over the
// staged rows and, when the call may not fit them, the direct kernel behind it
// (each gated on the staging's verdict).
Status launch_staged(const AttentionPlan& plan, StagingRoute route, const SparseAttentionParams& direct,
                     void* workspace, cudaStream_t stream) {
  const StagedRowsPlan& staged = *plan.staged;
  const bool gated = route == StagingRoute::kNamedRowsGated;
  const StagingBuffers buffers = staging_buffers(staged.layout, static_cast<std::uint8_t*>(workspace) + partials_bytes(plan));
  SparseAttentionParams copying = direct;
  assign_workspace(staged.copying, workspace, &copying);
  if (route == StagingRoute::kWholePool) {
    const cudaError_t error = launch_pool_staging(staged.format, direct, staged.layout, buffers, stream);
    if (error != cudaSuccess) return cuda_failure("pool staging launch", error);
    for (int s = 0; s < direct.num_sources; ++s) copying.source[s] = pool_source(direct, s, staged.layout, buffers);
    SMLA_RETURN_IF_ERROR(launch_grid(staged.copying, copying, stream));
    return launch_combine(staged.copying, copying, stream);
  }
  const cudaError_t error = launch_row_staging(staged.format, direct, staged.layout, buffers, stream);
  if (error != cudaSuccess) return cuda_failure("row staging launch", error);
  copying.source[0] = staged_source(staged.layout, buffers);
  copying.num_sources = 1;
  if (gated) {
    copying.run_gate = buffers.counters + kGate;
    copying.run_gate_value = 0;
  }
  SMLA_RETURN_IF_ERROR(launch_grid(staged.copying, copying, stream));
  if (!gated) return launch_combine(staged.copying, copying, stream);
  SparseAttentionParams fallback = direct;
  fallback.run_gate = buffers.counters + kGate;
  fallback.run_gate_value = 1;
  SMLA_RETURN_IF_ERROR(launch_grid(plan, fallback, stream));
  return launch_combine(plan, fallback, stream);
}

}  // namespace

StagingRoute staging_route(const StagedRowsPlan& staged, const SparseAttentionParams& direct) {
  if (whole_pool_pays(direct, staged.layout)) return StagingRoute::kWholePool;
  // Fewer slots than the buffer's rows, or fewer index entries: every call fits.
  if (!staged.gated || pool_fits(direct, staged.layout)) return StagingRoute::kNamedRows;
  return staged.stage_on_overflow ? StagingRoute::kNamedRowsGated : StagingRoute::kDirectOnly;
}

Status launch_planned_attention(const AttentionPlan& plan, SparseAttentionParams params, void* workspace,
                                cudaStream_t stream, StepTokenOrder step_order) {
  if (params.num_tokens == 0 || params.num_heads == 0) return Status::Ok();
  std::uint8_t* order_place = assign_workspace(plan, workspace, &params);
  if (plan.staged) {
    const StagingRoute route = staging_route(*plan.staged, params);
    if (route != StagingRoute::kDirectOnly) {
      // The staged kernels follow no token order, but a call that is not ready owes the step's
      // buffer one (SparseDecodeArgs::token_order): a later call of the step may run direct
      // (another pool's size, another route) and read it. The staging passes are ordinary
      // launches, so they start after the order is written.
      if (plan.order_tokens && step_order.order != nullptr && !step_order.ready) {
        const cudaError_t error = launch_token_order(params, kSm90KeysPerTile, step_order.order, stream);
        if (error != cudaSuccess) return cuda_failure("token order launch", error);
      }
      return launch_staged(plan, route, params, workspace, stream);
    }
  }
  if (plan.pack_tokens > 1) {
    const cudaError_t error = launch_pack_union(params, stream);
    if (error != cudaSuccess) return cuda_failure("pack prepass launch", error);
  }
  int* order = nullptr;
  bool after_prepass = false;
  if (plan.order_tokens && step_order.order != nullptr) {
    // The step's buffer: written whenever it is not ready (lengths or not), so every later call of the
    // same plan finds an order there; read behind its prepass, or as an earlier call left it.
    order = step_order.order;
    after_prepass = !step_order.ready;
  } else if (plan.order_tokens && (params.source[0].lengths != nullptr ||
                                   (params.num_sources > 1 && params.source[1].lengths != nullptr))) {
    // Without lengths every token attends its full lists: any order is as good.
    order = reinterpret_cast<int*>(order_place);
    after_prepass = true;
  }
  params.token_order = order;
  if (after_prepass) {
    const cudaError_t error = launch_token_order(params, kSm90KeysPerTile, order, stream);
    if (error != cudaSuccess) return cuda_failure("token order launch", error);
  }
  SMLA_RETURN_IF_ERROR(launch_grid(plan, params, stream, after_prepass));
  return launch_combine(plan, params, stream);
}

}  // namespace smla::cuda
