// Internal: the CPU attention kernel's entry. It reads the backend-neutral
// detail::AttentionOperands (src/core/attention_operands.h) as they are, so the
// SIMD code never sees a TensorView and decode and prefill share one kernel.
#pragma once

#include <cstdint>

#include "src/core/attention_operands.h"

namespace smla::cpu {

// Computes heads [head_begin, head_end) of query token `token` with the best
// SIMD target of this CPU (or the one forced by force_simd_target).
void attend_token_heads(const detail::AttentionOperands& operands, std::int64_t token, std::int64_t head_begin,
                        std::int64_t head_end);

}  // namespace smla::cpu
