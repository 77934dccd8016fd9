// File: layer.h
//
// The DeepSeek-V4 attention layer around the sparse attention kernels
// (spec 1.3-1.12): query and KV preparation, the compressor, the lightning
// indexer and the grouped output projection. Every op takes TensorViews plus
// one args struct, validates everything before writing, and runs on a Backend:
//   kReference: float64 plain loops (the oracle),
//   kCpu:       float32 (BLAS for the projection GEMMs),
//   kCuda:      Unimplemented for now.
#pragma once

#include <cstdint>

#include "smla/backend.h"
#include "smla/compressor.h"
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

Status prepare_kv(const KvPrepArgs& args, Backend backend = Backend::kCpu);

// Output projection (spec 1.11): inverse GPT-J RoPE on dims 448..511 at the
// query position, then per group g (heads g*H/G .. (g+1)*H/G - 1)
// z[t, g] = wo_a[g] . o[t, g heads] (rank r_o), then out = wo_b . z. f32 math
// (kCpu: OpenBLAS sgemm), z kept in f32.
struct OutputProjectionArgs {
  TensorView o;          // [T, Hp, 512] bf16 or f32 attention output; heads >= num_heads ignored
  int num_heads = 0;     // H (<= Hp); 0 = all heads of o
  TensorView positions;  // [T] i32/i64
  const RopeTable* rope = nullptr;
  TensorView wo_a;       // [G, rank, (H/G)*512] f32, contiguous
  TensorView wo_b;       // [hidden, G*rank] f32, contiguous
  TensorView out;        // [T, hidden] f32 (written)
  // kCpu: one matrix-vector product per token instead of one GEMM per batch.
  // OpenBLAS sgemm results depend on the batch shape (M, threads); row-stable
  // results are bit-identical however the tokens are batched. Slower.
  bool row_stable = false;
};

Status project_output(const OutputProjectionArgs& args, Backend backend = Backend::kCpu);

// Converts bf16 weights to f32 once at load (same shape, both contiguous).
Status convert_bf16_to_f32(const TensorView& src, const TensorView& dst);

}  // namespace smla
