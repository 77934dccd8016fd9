// Quantize rows into paged caches and read them back.
#pragma once

#include "smla/kv_format.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// Writes rows [n, head_dim] (bf16 or f32; f32 is rounded to bf16 first) into
// the cache at slots [n] (i32 or i64). Slot -1 is skipped; any other slot
// outside [0, num_slots) is an error and nothing is written. head_dim is the
// format's (512 for V4 and plain rows, 576 for V3.2: 512 NoPE then 64 RoPE).
// Byte-exact with the production rule described in kv_format.h.
Status quantize_into_cache(const KvCacheView& cache, const TensorView& rows, const TensorView& slots);

// Reads slots [n] (i32 or i64) into out [n, head_dim] (bf16 or f32).
// Slot -1 yields a zero row; any other out-of-range slot is an error.
Status gather_from_cache(const KvCacheView& cache, const TensorView& slots, const TensorView& out);

}  // namespace smla
