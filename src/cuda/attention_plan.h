// Internal: how one attention call is laid out on the device (head tile,
// split count, workspace), derived from shapes and device properties only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "smla/context.h"
#include "smla/status.h"
#include "src/cuda/sparse_attention_launch.h"
#include "src/cuda/staged_rows.h"

namespace smla::cuda {

// The two kernel families, each a registry row (src/cuda/cuda_attention.cc).
enum class KernelFamily { kPortable, kSm90 };

struct StagedRowsPlan;

struct AttentionPlan {
  AttentionVariant variant;
  LaunchFlags flags;
  int kv_stages = 1;
  int k_buffers = 1;
  int smem_bytes = 0;
  int head_blocks = 1;
  // sm90 kernels: query heads a 64-row tile attends (SparseAttentionParams::head_block_rows).
  int head_block_rows = 64;
  int num_splits = 1;
  int pack_tokens = 1;    // > 1: packed MTP, this many tokens of one request per CTA
  int pack_capacity = 0;  // union entries per packed group (pack_tokens * num_keys)
  bool prefetch_rows = false;  // SparseAttentionParams::prefetch_rows
  // sm90 FP8 decode of more than one wave: when the call passes lengths, the token
  // order prepass runs first (SparseAttentionParams::token_order, in the workspace).
  bool order_tokens = false;
  // sm90+: the combine is launched as a programmatic dependent of the attention
  // grid, so its launch overlaps the attention tail (it waits for the results).
  bool chain_combine = false;
  std::size_t workspace_bytes = 0;
  // sm90, FP8 rows of a prefill-sized call: expanded once into a staging buffer and
  // read by the copying kernel (src/cuda/staged_rows.h); nullptr: the kernel above
  // reads the FP8 pages directly.
  std::shared_ptr<const StagedRowsPlan> staged;
};

struct StagedRowsPlan {
  AttentionPlan copying;  // the copying kernel over the staged rows
  KvFormat format = KvFormat::kV4Fp8;  // of the cache rows staged
  StagingLayout layout;
  // The call may name more distinct rows than the layout holds: the direct kernel
  // is launched behind the copying one, and the staging's gate word lets one of them work.
  bool gated = false;
  // A call whose rows may overflow the buffer stages them anyway, with the direct
  // kernel behind (the gated path): TuningOptions::sm90_stage_rows was on, or the
  // requests are prefill chunks, whose tokens share rows. Otherwise such a call
  // runs the direct kernel alone (staging_route).
  bool stage_on_overflow = false;
};

// How a staged plan runs one call, from its caches' slot counts (launch time):
// the whole pool expanded (it fits and its slots are few against the index
// entries), the named rows (they fit the buffer whatever they are), the named rows
// with the direct kernel behind (they may not fit, and stage_on_overflow), or the
// direct kernel alone (they may not fit, and the tokens are a decode batch's: each
// names its own rows, they overflow the buffer, and the staging passes that find
// out cost as much as the direct kernel: CONFIG1 b=512 740 us against 315 us direct).
enum class StagingRoute { kWholePool, kNamedRows, kNamedRowsGated, kDirectOnly };
StagingRoute staging_route(const StagedRowsPlan& staged, const SparseAttentionParams& direct);

// One attention call's shapes. num_keys = main width + extra width (the most
// keys any token can attend). queries_per_request (s_q, divides num_tokens)
// lets heads below 64 share a CTA with the same request's other tokens
// (SparseDecodeArgs::queries_per_request).
struct AttentionShape {
  LoaderKind kind = loader_kind(KvFormat::kV4Fp8);
  std::int64_t num_tokens = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_keys = 0;
  std::int64_t queries_per_request = 1;
  bool decode = false;  // a sparse_decode call (which kernel's tiles pay differs from prefill's)
};

// Where a plan learns how many CTAs fit on an SM.
enum class Occupancy {
  kQueryDevice,      // the CUDA occupancy query on the current device
  kSharedMemoryOnly, // shared memory alone (registers ignored): at least the real count, so the
                     // splits and the scratch size are an upper bound; for validating contexts
};

// The layout of a call on `device`. kSm90 runs every head block as a 64-row
// tile of the sm90 kernel (no packing); kPortable picks 16/32/64-row tiles of
// the portable kernel and may pack MTP tokens.
Expected<AttentionPlan> plan_attention(KernelFamily family, const AttentionShape& shape, const DeviceProperties& device,
                                       const TuningOptions& tuning, Occupancy occupancy = Occupancy::kQueryDevice);

// Whether the sm90 kernel's 64-row tiles are the better layout for the shape
// (measured on an H200, docs/PERF.md, session 18): every prefill and every head
// count above 16, whose padding rows cost less than the portable kernel's smaller
// tiles (prefill h_q 16 / 32 1.5x / 2.7x faster, decode TP-h32 b=128 1.2x); decode
// of 1-16 heads within one wave of CTAs (a CTA a token, 5-22% faster) or of
// requests of more tokens than the portable kernel packs (a prefill through
// sparse_decode: rows shared by many tokens, 1.6x). Past one wave, decode batches
// of 1-16 heads keep the portable kernel's 16-row tiles and packing (2-25% faster).
bool sm90_tiles_preferred(const AttentionShape& shape, const DeviceProperties& device);

struct PackRule {
  int max_rows = 32;                 // g * num_heads stays within this many rows (<= 64)
  bool only_when_fewer_rows = true;  // tuned: pack only when it cuts the tile rows per token
};

// Tokens of one request packed into a CTA (1: none). g divides s_q, g * num_heads
// <= rule.max_rows, the group's union fits the prepass. Plain rule: the largest such
// g. Tuned rule (the default): the g with the fewest tile rows per token (16/32/64-row
// tiles), the larger g on ties, and only when that is fewer than unpacked: h 8 packs
// (half of a 16-row tile is padding unpacked), h 16 and 32 do not (measured on an
// H100: packing full 16-row tiles into 32-row ones was 0.89-1.19x unpacked).
int choose_pack_tokens(std::int64_t num_heads, std::int64_t num_keys, std::int64_t queries_per_request,
                       PackRule rule = {});
// The rule TuningOptions::pack_max_rows asks for (-1: the tuned default).
PackRule pack_rule(const TuningOptions& tuning);

// A caller's buffer for the token order that the calls of one step share
// (SparseDecodeArgs::token_order): `ready` = it holds the order already.
struct StepTokenOrder {
  int* order = nullptr;
  bool ready = false;
};

// Enqueues, on `workspace` (plan.workspace_bytes long): the pack prepass when packed,
// the staging passes when staged, the token order prepass when the plan orders tokens
// (into `step_order` when given and not ready; none when it is ready), the attention
// kernel(s) and, when split, the combine.
Status launch_planned_attention(const AttentionPlan& plan, SparseAttentionParams params, void* workspace,
                                cudaStream_t stream, StepTokenOrder step_order = {});

}  // namespace smla::cuda
