// CUDA backend entry points with a caller-owned workspace and stream, for
// serving engines that capture CUDA graphs.
//
// A call neither allocates nor synchronizes: it validates the arguments on the
// host (shapes, dtypes, devices; length and index VALUES stay on the device,
// where lengths are clamped to [0, width] and indices outside [0, num_slots)
// are masked without being read), then enqueues its kernels on `stream`.
// Scratch space comes from `workspace`, sized once with the matching
// *_workspace_size query; the size depends only on the shapes and the current
// device, never on length or index values, so one workspace sized for the
// largest batch serves every smaller one and survives graph replay.
//
// All tensors live on the current CUDA device (TensorView::device.kind ==
// DeviceKind::kCuda). `stream` is a cudaStream_t (nullptr = the legacy default
// stream). In builds without the CUDA backend they return Unimplemented.
// Semantics are those of smla::sparse_decode / smla::sparse_prefill
// (smla/attention.h).
#pragma once

#include <cstddef>

#include "smla/attention.h"
#include "smla/status.h"

namespace smla {

// Bytes of workspace cuda_sparse_decode needs for these shapes (0 when the
// call needs no scratch). The workspace must be 256-byte aligned.
Expected<std::size_t> cuda_sparse_decode_workspace_size(const SparseDecodeArgs& args);
Status cuda_sparse_decode(const SparseDecodeArgs& args, void* workspace, std::size_t workspace_bytes, void* stream);

// Prefill over a flat bf16 workspace (SparsePrefillArgs); d_v must be 512.
Expected<std::size_t> cuda_sparse_prefill_workspace_size(const SparsePrefillArgs& args);
Status cuda_sparse_prefill(const SparsePrefillArgs& args, void* workspace, std::size_t workspace_bytes, void* stream);

}  // namespace smla
