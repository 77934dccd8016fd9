// Sparse MLA attention (DeepSeek-V4 / V3.2) over paged KV caches.
//
// Semantics (spec sections 1.10 and 5.1), per query token t and head h:
//   candidates = the first lengths[t] entries of each index set; an entry is
//   attended when it is >= 0 and < the cache's slot count; its row is read
//   only then (garbage or NaN elsewhere in the cache never reaches the output).
//   s_j = softmax_scale * <q[t,h], k_j> over d_qk dims; v_j = first d_v dims of k_j.
//   out = sum_j exp(s_j) v_j / (exp(sink[h]) + sum_j exp(s_j))
//   lse = log(sum_j exp(s_j))      (natural log, sink excluded)
//   A row with nothing to attend: out = 0, lse = +inf. sink = +inf: out = 0.
//   Duplicate indices are attended as many times as they appear.
//   NaN in q[t,h] or in an attended row makes out, lse (and max_logits) of the
//   rows that read it NaN; a NaN sink makes out NaN. Logits past f32 keep the
//   output exact, lse / max_logits become +-inf (docs/attention.md, non-finite
//   values and overflow).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/registry.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// Decode, and prefill read directly from the paged caches: every query token
// is its own row with its own index lists. T = number of query tokens.
struct SparseDecodeArgs {
  TensorView q;                         // [T, h_q, d_qk] bf16
  KvCacheView main_cache;               // sliding-window cache (V4) or the V3.2 cache
  TensorView main_indices;              // [T, k_main] i32 global slots (page * page_size + offset)
  TensorView main_lengths;              // [T] i32, may be absent (= k_main for every token)
  std::optional<KvCacheView> extra_cache;  // compressed cache, same format, own page size
  TensorView extra_indices;             // [T, k_extra] i32; required with extra_cache
  TensorView extra_lengths;             // [T] i32, may be absent
  TensorView sink;                      // [h_q] f32, may be absent (= -inf)
  float softmax_scale = 0.0f;
  TensorView out;                       // [T, h_q, d_v] bf16 (written)
  TensorView lse;                       // [T, h_q] f32 (written), may be absent
  // Consecutive query tokens belonging to one request (s_q; MTP): tokens
  // [r * s_q, (r + 1) * s_q) are request r's. A performance hint only: results
  // are the same for any value; it must be >= 1 and divide T. The CUDA backend
  // packs a request's tokens x heads into one tile for small h_q (TP shards) and
  // reads keys shared by those tokens once (docs/cuda_backend.md); requests of
  // more than 16 tokens (a prefill through sparse_decode) run on the Hopper
  // kernel and stage their FP8 rows as bf16 (docs/cuda_sm90.md).
  std::int64_t queries_per_request = 1;
  // The order in which the Hopper kernel runs the tokens (longest first, from
  // the lengths), kept across the calls of one step that share their lengths
  // (the layers of one kind), as FlashMLA's scheduler metadata is. Optional: a
  // [T] i32 buffer of the caller's on the call's device. With
  // token_order_ready = false a call whose plan orders its tokens computes the
  // order into it (on the device, so a captured graph follows every replay's
  // lengths); with true it reads what such a call wrote and computes nothing,
  // so only the first call of a step pays for the order. Absent, every call
  // that orders computes the order in its workspace (when it passes lengths).
  // Any order gives the same results; the buffer must hold what a call with the
  // same shapes and length values wrote (a value outside [0, T) runs the token
  // of its own place, so a buffer of -1 is the launch order). Other backends
  // and plans that do not order tokens (AttentionPlan::describe()) ignore it.
  TensorView token_order;
  bool token_order_ready = false;
};

// Prefill over a flat bf16 KV workspace (FlashMLA sparse prefill contract).
struct SparsePrefillArgs {
  TensorView q;             // [s_q, h_q, d_qk] bf16
  TensorView kv;            // [s_kv, d_qk] bf16; value = first d_v dims
  TensorView indices;       // [s_q, topk] i32; -1 or >= s_kv is not attended
  TensorView topk_length;   // [s_q] i32, may be absent (= topk)
  TensorView sink;          // [h_q] f32, may be absent
  float softmax_scale = 0.0f;
  int d_v = 512;
  TensorView out;           // [s_q, h_q, d_v] bf16 (written)
  TensorView max_logits;    // [s_q, h_q] f32 (written), may be absent; -inf for empty rows
  TensorView lse;           // [s_q, h_q] f32 (written), may be absent; natural log, +inf for empty rows
};

// How one attention call runs: the selected implementation and its layout
// (tile, splits, scratch), derived from shapes only. Plan once, run it for
// every call of the same shapes: every layer of a step, every step, every
// CUDA-graph replay. A plan belongs to the backend and device of the context
// that made it.
class AttentionPlan {
 public:
  const Implementation& implementation() const { return *implementation_; }
  const Problem& problem() const { return problem_; }
  std::size_t workspace_bytes() const;  // scratch one run takes from the context
  std::string describe() const;         // "cuda.sm90: 64-row tiles, 2 splits, 3 stages, 65536 B scratch"

  struct State;  // the implementation's own plan

 private:
  friend struct AttentionPlanAccess;
  const Implementation* implementation_ = nullptr;
  Problem problem_;
  std::shared_ptr<const State> state_;
};

// validate -> select -> plan. Reads shapes, dtypes, formats and devices, never
// values in device memory.
Expected<AttentionPlan> plan_sparse_decode(const Context& context, const SparseDecodeArgs& args);
Expected<AttentionPlan> plan_sparse_prefill(const Context& context, const SparsePrefillArgs& args);

// Runs a plan: validates the tensors (once) and checks that their shapes are the
// plan's, then runs (CUDA: enqueues on the context's stream without allocating
// when the context has a workspace of at least plan.workspace_bytes()).
Status sparse_decode(const Context& context, const AttentionPlan& plan, const SparseDecodeArgs& args);
Status sparse_prefill(const Context& context, const AttentionPlan& plan, const SparsePrefillArgs& args);

// Plan and run in one call (validates once).
Status sparse_decode(const Context& context, const SparseDecodeArgs& args);
Status sparse_prefill(const Context& context, const SparsePrefillArgs& args);

// Scratch bytes a call with these shapes takes (the plan's workspace_bytes()).
Expected<std::size_t> sparse_decode_workspace_size(const Context& context, const SparseDecodeArgs& args);
Expected<std::size_t> sparse_prefill_workspace_size(const Context& context, const SparsePrefillArgs& args);

// One call without a context: runs in default_context(backend) (smla/context.h).
Status sparse_decode(const SparseDecodeArgs& args, Backend backend = Backend::kAuto);
Status sparse_prefill(const SparsePrefillArgs& args, Backend backend = Backend::kAuto);

}  // namespace smla
