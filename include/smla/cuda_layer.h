// File: cuda_layer.h
//
// The DeepSeek-V4 layer ops (smla/layer.h, rope.h, compressor.h, indexer.h) on
// the CUDA backend, with a caller-chosen stream and caller-owned workspace so a
// whole step can be captured in a CUDA graph (same contract as smla/cuda.h).
//
// Every entry takes the same Args struct as its host counterpart; all tensors
// (and cache pages) live on the current CUDA device. The host validates shapes,
// dtypes, strides and devices only: VALUES in device memory (positions, slot
// mappings, block tables, request rows) are never read on the host. On the
// device, a value outside its valid range is never dereferenced:
//   - a position outside [0, rope->max_positions()) rotates nothing for that
//     token: its rows are written unrotated (so output stays defined), and
//     positions < 0 count as padding where the host op would reject them;
//   - a slot, page or request row outside its range skips that write/read
//     (an insert or emission is dropped; an indexer entry is not selectable).
// The RopeTable pointer is read on the host for its inverse frequencies, which
// travel by value in the kernel parameters: no device copy of the table.
//
// Ops that need scratch report its size with *_workspace_size; sizes depend on
// shapes only. The first call of cuda_project_output on a device creates the
// cuBLASLt handle: make one eager call before capturing a graph.
//
// In builds without the CUDA backend every entry returns Unimplemented.
#pragma once

#include <cstddef>

#include "smla/compressor.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/rope.h"
#include "smla/status.h"

namespace smla {

// `stream` is a cudaStream_t (nullptr = the legacy default stream).
Status cuda_apply_rope(const RopeArgs& args, void* stream);
Status cuda_prepare_query(const QueryPrepArgs& args, void* stream);
Status cuda_prepare_kv(const KvPrepArgs& args, void* stream);
Status cuda_run_compressor(const CompressorArgs& args, void* stream);
Status cuda_prepare_indexer_query(const IndexerQueryArgs& args, void* stream);

// IndexerTopkArgs::max_seq_len is ignored on the device: the shortcut is taken
// per token (a token with (pos + 1) / 4 <= k entries gets the short-context
// fill), which gives the same rows as the host rule.
Expected<std::size_t> cuda_indexer_topk_workspace_size(const IndexerTopkArgs& args);
Status cuda_indexer_topk(const IndexerTopkArgs& args, void* workspace, std::size_t workspace_bytes, void* stream);

// wo_a / wo_b may be f32 or bf16 on the device (bf16 runs the tensor cores).
Expected<std::size_t> cuda_project_output_workspace_size(const OutputProjectionArgs& args);
Status cuda_project_output(const OutputProjectionArgs& args, void* workspace, std::size_t workspace_bytes,
                           void* stream);

}  // namespace smla
