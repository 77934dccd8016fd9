// The baseline the CPU backend is measured against: sparse attention written
// plainly the way a PyTorch CPU user effectively computes it. Per token:
// gather the attended rows and dequantize them to f32 ([n, d_qk], like
// index_select + a dequantize op), S = scale Q K^T and O = P V with OpenBLAS
// sgemm (like torch.matmul), softmax with the sink in between. Tokens run in
// parallel on the same threads as the cpu backend (like torch's intra-op
// parallelism over the batch), OpenBLAS itself single-threaded inside them.
#pragma once

#include "smla/attention.h"

namespace smla::bench {

// Same contract and outputs as sparse_decode (out, and lse when present).
void blas_baseline_decode(const SparseDecodeArgs& args);

}  // namespace smla::bench
