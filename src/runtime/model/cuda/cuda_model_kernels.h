// Internal: the small element-wise kernels of smla::Model on cuda (the ops
// with a public home live in smla/layer.h, smla/attention.h and
// smla/metadata.h). Launchers enqueue on `stream`, never synchronize and
// return the launch error as a Status.
#pragma once

#include <cstdint>

#include "smla/numeric.h"
#include "smla/status.h"

namespace smla::cuda_model {

// Per row: v = in (+ addend); with `normalize`, v *= rsqrt(mean(v^2) + eps)
// (sum of squares in f32), times weight when present; then written to out_f32
// and/or out_bf16 (either may be nullptr; out_f32 may alias in).
struct RowNormParams {
  const float* in = nullptr;           // [rows, width]
  std::int64_t stride_in = 0;
  const float* addend = nullptr;       // [rows, width] or nullptr
  std::int64_t stride_addend = 0;
  const float* weight = nullptr;       // [width] or nullptr
  float* out_f32 = nullptr;            // [rows, width] or nullptr
  std::int64_t stride_out_f32 = 0;
  std::uint16_t* out_bf16 = nullptr;   // [rows, width] bf16 bits or nullptr
  std::int64_t stride_out_bf16 = 0;
  std::int64_t rows = 0, width = 0;
  bool normalize = true;
  float eps = 1e-6f;
};
Status launch_row_norm(const RowNormParams& params, void* stream);

// Compressor state slot of each token, for both state groups at once:
// slot = table[req][pos / bs] * bs + pos % bs, -1 for padding (is_valid 0 or
// req outside [0, rows)) and for a column or block id outside the table.
struct StateSlotParams {
  const std::int32_t* token_to_req = nullptr;  // [tokens]
  const std::int64_t* positions = nullptr;     // [tokens]
  const std::uint8_t* is_valid = nullptr;      // [tokens]
  std::int64_t tokens = 0;
  struct Group {
    const std::int32_t* table = nullptr;  // [rows, cols] contiguous
    std::int64_t rows = 0, cols = 0;
    int block_size = 1;
    std::int64_t* slots = nullptr;        // [tokens]
  } groups[2];
};
Status launch_state_slots(const StateSlotParams& params, void* stream);

// Token t's slot in one group (the rule above), for the kernel and the host loop.
SMLA_HOST_DEVICE std::int64_t state_slot(const StateSlotParams& p, const StateSlotParams::Group& g, std::int64_t t) {
  const std::int32_t req = p.token_to_req[t];
  const std::int64_t pos = p.positions[t];
  if (p.is_valid[t] == 0 || req < 0 || pos < 0 || req >= g.rows || pos / g.block_size >= g.cols) return -1;
  const std::int32_t block = g.table[req * g.cols + pos / g.block_size];
  return block >= 0 ? static_cast<std::int64_t>(block) * g.block_size + pos % g.block_size : -1;
}

}  // namespace smla::cuda_model
