#include "src/cpu/cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <new>

#include <fmt/format.h>

#include "src/core/attention_operands.h"
#include "src/cpu/attention_kernel.h"
#include "src/cpu/thread_pool.h"

namespace smla::cpu {

namespace {

// Work items are (token, head group). Below kMinItemsForThreads tokens the
// heads are split so small batches still feed every thread; the split depends
// on the shape only, and a head's result never depends on its group anyway.
constexpr std::int64_t kMinItemsForThreads = 16;
constexpr std::int64_t kHeadGroupAlign = 6;  // the kernel's head tile
// Longest row the kernel's per-thread buffers are sized for (V3.2: 576).
constexpr int kMaxHeadDim = 1024;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Status run_attention(const detail::AttentionOperands& operands) {
  if (operands.d_qk <= 0 || operands.d_qk > kMaxHeadDim || operands.d_v <= 0 || operands.d_v > operands.d_qk) {
    return unimplemented(fmt::format("cpu attention: d_qk {} with d_v {} (supported: 0 < d_v <= d_qk <= {})",
                                     operands.d_qk, operands.d_v, kMaxHeadDim));
  }
  const std::int64_t tokens = operands.num_tokens;
  const std::int64_t heads = operands.num_heads;
  if (tokens <= 0 || heads <= 0) return Status::Ok();
  std::int64_t groups = 1;
  if (tokens < kMinItemsForThreads) {
    groups = std::min(ceil_div(heads, kHeadGroupAlign), ceil_div(kMinItemsForThreads, tokens));
  }
  const std::int64_t group_heads = ceil_div(ceil_div(heads, groups), kHeadGroupAlign) * kHeadGroupAlign;
  groups = ceil_div(heads, group_heads);

  std::atomic<bool> failed{false};
  parallel_for(tokens * groups, [&](std::int64_t item, int /*worker*/) {
    const std::int64_t token = item / groups;
    const std::int64_t head_begin = (item % groups) * group_heads;
    try {
      attend_token_heads(operands, token, head_begin, std::min(heads, head_begin + group_heads));
    } catch (const std::bad_alloc&) {
      failed.store(true);
    }
  });
  if (failed.load()) return internal_error("cpu attention: out of memory for per-thread buffers");
  return Status::Ok();
}

Status run_guarded(const detail::AttentionOperands& operands, const char* op) {
  try {
    return run_attention(operands).with_context(op);
  } catch (const std::exception& e) {  // thread creation or allocation failures
    return internal_error(fmt::format("{}cpu backend: {}", op, e.what()));
  }
}

}  // namespace

Status sparse_decode(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  return run_guarded(detail::decode_operands(args, shape), "sparse_decode: ");
}

Status sparse_prefill(const SparsePrefillArgs& args, const detail::PrefillShape& shape) {
  return run_guarded(detail::prefill_operands(args, shape), "sparse_prefill: ");
}

}  // namespace smla::cpu
