// File: layer.h
//
// The DeepSeek-V4 attention layer around the sparse attention kernels
// (spec 1.3-1.12): query and KV preparation, the compressor, the lightning
// indexer and the grouped output projection. Every op takes TensorViews plus
// one args struct, validates everything before writing, and runs on the
// implementation the registry (smla/registry.h) selects for the context:
//   "reference" (Backend::kReference): float64 plain loops (the oracle),
//   "cpu"       (Backend::kCpu):       float32 (BLAS for the projection GEMMs),
//   "cuda"      (Backend::kCuda, sm80+): CUDA kernels, cuBLASLt for the projection.
//
// Contexts and backends. Every op has one entry taking a Context
// (smla/context.h), e.g. prepare_query(context, args), and a one-call
// convenience prepare_query(args, backend) that runs in default_context(backend).
// Ops that need scratch take it from context.scratch() (the caller's workspace
// when one is set); *_workspace_size(context, args) reports how much (sizes
// depend on shapes only; 0 on the host backends).
//
// On the device (cuda contexts): every tensor and cache page lives on the
// context's device, work is enqueued on context.stream(), nothing allocates
// (given a context workspace) or synchronizes, so a whole step can be captured
// in a CUDA graph. The host validates shapes, dtypes, strides and devices only:
// VALUES in device memory (positions, slot mappings, block tables, request
// rows) are never read on the host. On the device, a value outside its valid
// range is never dereferenced:
//   - a position outside [0, rope->max_positions()) rotates nothing for that
//     token: its rows are written unrotated (so output stays defined), and
//     positions < 0 count as padding where the host op would reject them;
//   - a slot, page or request row outside its range skips that write/read
//     (an insert or emission is dropped; an indexer entry is not selectable).
// The RopeTable pointer is read on the host for its inverse frequencies, which
// travel by value in the kernel parameters: no device copy of the table. The
// first project_output on a device creates the cuBLASLt handle: make one eager
// call before capturing a graph. Details: docs/layer.md, "On the GPU".
#pragma once

#include <cstddef>
#include <cstdint>

#include "smla/backend.h"
#include "smla/compressor.h"
#include "smla/context.h"
#include "smla/indexer.h"
#include "smla/kv_format.h"
#include "smla/rope.h"
#include "smla/status.h"
#include "smla/tensor.h"

namespace smla {

// Query preparation (spec 1.4): per head, weight-free RMSNorm over all 512 dims
// (q * rsqrt(mean(q^2) + eps)), GPT-J RoPE on dims 448..511 at the token's
// position, one rounding to bf16. Heads H..Hp-1 of the output are zero-filled.
struct QueryPrepArgs {
  TensorView q;          // [T, H, 512] f32 or bf16 (wq_b output)
  TensorView positions;  // [T] i32/i64
  const RopeTable* rope = nullptr;
  float eps = 1e-6f;
  TensorView out;        // [T, Hp, 512] bf16 (written), Hp >= H
};

Status prepare_query(const Context& context, const QueryPrepArgs& args);
Status prepare_query(const QueryPrepArgs& args, Backend backend = Backend::kCpu);

// KV preparation (spec 1.5): GPT-J RoPE on dims 448..511 at the position,
// rounding to bf16, quantize and insert at slot_mapping[t] of the sliding-window
// cache (-1 skipped). Only the first slot_mapping.size(0) rows are inserted.
struct KvPrepArgs {
  TensorView kv;            // [T, 512] f32 or bf16 (already kv_norm-ed)
  TensorView positions;     // [T] i32/i64
  const RopeTable* rope = nullptr;
  TensorView slot_mapping;  // [n <= T] i64 (or i32); -1 = skip
  KvCacheView cache;        // a 512-dim format (v4-fp8, bf16-rows, fp8-rows)
  TensorView rotated;       // optional [T, 512] bf16 (written): the rotated, rounded rows
};

Status prepare_kv(const Context& context, const KvPrepArgs& args);
Status prepare_kv(const KvPrepArgs& args, Backend backend = Backend::kCpu);

// Output projection (spec 1.11): inverse GPT-J RoPE on dims 448..511 at the
// query position, then per group g (heads g*H/G .. (g+1)*H/G - 1)
// z[t, g] = wo_a[g] . o[t, g heads] (rank r_o), then out = wo_b . z. f32 math
// (cpu: OpenBLAS sgemm), z kept in f32. cuda: wo_a / wo_b may be f32 (true f32
// GEMMs) or bf16 (tensor cores; the rotated o and z rounded to bf16 once each).
struct OutputProjectionArgs {
  TensorView o;          // [T, Hp, 512] bf16 or f32 attention output; heads >= num_heads ignored
  int num_heads = 0;     // H (<= Hp); 0 = all heads of o
  TensorView positions;  // [T] i32/i64
  const RopeTable* rope = nullptr;
  TensorView wo_a;       // [G, rank, (H/G)*512] f32 (cuda: or bf16), contiguous
  TensorView wo_b;       // [hidden, G*rank] of wo_a's dtype, contiguous
  TensorView out;        // [T, hidden] f32 (written)
  // kCpu: one matrix-vector product per token instead of one GEMM per batch.
  // OpenBLAS sgemm results depend on the batch shape (M, threads); row-stable
  // results are bit-identical however the tokens are batched. Slower.
  bool row_stable = false;
};

Status project_output(const Context& context, const OutputProjectionArgs& args);
// cuda: align256(T H 512 e) + align256(T G rank e) + 32 MiB (e = 4 for f32
// weights, 2 for bf16); 0 on the host backends.
Expected<std::size_t> project_output_workspace_size(const Context& context, const OutputProjectionArgs& args);
Status project_output(const OutputProjectionArgs& args, Backend backend = Backend::kCpu);

// Converts bf16 weights to f32 once at load (same shape, both contiguous).
Status convert_bf16_to_f32(const TensorView& src, const TensorView& dst);

}  // namespace smla
