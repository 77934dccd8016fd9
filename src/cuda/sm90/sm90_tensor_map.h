// Internal: the host side of the sm90 kernel's tensor-memory-accelerator loads.
#pragma once

#include <cudaTypedefs.h>

#include "src/cuda/common/sparse_attention_params.h"

namespace smla::cuda::sm90 {

// The driver's cuTensorMapEncodeTiled, looked up once; nullptr where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// Encodes the tensor map of Q's 64-head x 64-value boxes (128-byte swizzled, the
// layout wgmma reads; heads past h_q arrive as zeros) into p->q_tensor_map and sets
// p->q_by_tensor_map. Leaves it unset, for the consumers' own loads, where Q's base
// or strides are not 16-byte multiples or the driver has no encoder.
void encode_query_tensor_map(SparseAttentionParams* p, int d_qk);

// The output's `box_rows`-head x 64-value boxes (16: a warp's rows, 64: a warpgroup's;
// 128-byte swizzled, as the consumers stage them; heads past h_q are not written)
// into p->out_tensor_map, setting p->out_by_tensor_map and p->out_box_rows; left
// unset unless the output is unsplit with 16-byte rows and units (out_aligned_16) in
// 64-row head blocks, or where the driver has no encoder.
void encode_output_tensor_map(SparseAttentionParams* p, int box_rows);

}  // namespace smla::cuda::sm90
