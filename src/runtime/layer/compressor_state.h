// Internal: addressing of the compressor state cache, shared by the backends.
#pragma once

#include <cstdint>

#include "smla/compressor.h"
#include "src/core/strided_access.h"
#include "src/runtime/layer/layer_ops.h"

namespace smla::layer_detail {

inline float* state_row(const CompressorArgs& args, const CompressorShape& shape, std::int64_t slot) {
  return args.state_cache.ptr<float>() + (slot / shape.state_block_size) * args.state_cache.stride[0] +
         (slot % shape.state_block_size) * args.state_cache.stride[1];
}

// State slot of `position` of request `req` through the state block table
// (validated for every position an emission reads).
inline std::int64_t state_slot(const CompressorArgs& args, const CompressorShape& shape, std::int64_t req,
                               std::int64_t position) {
  const std::int64_t block = detail::read_table(args.state_block_table, req, position / shape.state_block_size);
  return block * shape.state_block_size + position % shape.state_block_size;
}

// Stage A for every token (identical bytes on every backend: kv copied, score + ape in f32).
inline void save_states(const CompressorArgs& args, const CompressorShape& shape) {
  const int width = shape.coff * shape.head_dim;
  for (std::int64_t t = 0; t < shape.tokens; ++t) {
    const std::int64_t slot = detail::read_index(args.state_slot_mapping, t);
    if (slot < 0) continue;
    const std::int64_t position = detail::read_index(args.positions, t);
    const float* in = args.kv_score.ptr<const float>() + t * args.kv_score.stride[0];
    const float* ape = args.ape.ptr<const float>() + (position % shape.ratio) * args.ape.stride[0];
    float* row = state_row(args, shape, slot);
    for (int i = 0; i < width; ++i) row[i] = in[i];
    for (int i = 0; i < width; ++i) row[width + i] = in[width + i] + ape[i];
  }
}

// True when token t emits a compressed entry in this step.
inline bool emits(const CompressorArgs& args, std::int64_t t) {
  return detail::read_index(args.state_slot_mapping, t) >= 0 &&
         detail::read_index(args.compressed_slot_mapping, t) >= 0;
}

}  // namespace smla::layer_detail
