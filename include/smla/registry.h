// File: smla/registry.h
//
// What every compiled-in implementation of every op supports, and the one
// function that picks an implementation for a problem.
//
// Each implementation declares its capabilities (formats, head counts, head
// dimensions, architectures, features). select(context, problem) is the only
// place an implementation is chosen: the ops call it when they plan, the
// workspace queries call it, `smla info` prints the table, and the tests walk
// the table instead of naming backends. A backend that is not compiled in has
// no rows; one compiled in but unusable here (no GPU) has rows that select()
// never returns on this machine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "smla/backend.h"
#include "smla/context.h"
#include "smla/kv_format.h"
#include "smla/status.h"

namespace smla {

enum class Op {
  kSparseDecode,         // smla/attention.h: over paged caches (decode and FP8 prefill)
  kSparsePrefill,        // smla/attention.h: over a flat bf16 workspace
  kApplyRope,            // smla/rope.h
  kPrepareQuery,         // smla/layer.h
  kPrepareKv,            // smla/layer.h
  kRunCompressor,        // smla/compressor.h
  kPrepareIndexerQuery,  // smla/indexer.h
  kIndexerTopk,          // smla/indexer.h
  kProjectOutput,        // smla/layer.h
  kStepMetadata,         // smla/metadata.h: build_step_metadata and the index transforms
};
inline constexpr Op kAllOps[] = {Op::kSparseDecode,  Op::kSparsePrefill,        Op::kApplyRope,
                                 Op::kPrepareQuery,  Op::kPrepareKv,            Op::kRunCompressor,
                                 Op::kPrepareIndexerQuery, Op::kIndexerTopk,    Op::kProjectOutput,
                                 Op::kStepMetadata};
std::string_view op_name(Op op);  // "sparse_decode", ...

// Optional inputs/outputs of an op a problem uses (bit set).
enum Feature : unsigned {
  kFeatureSink = 1u << 0,
  kFeatureLse = 1u << 1,
  kFeatureMaxLogits = 1u << 2,
  kFeatureExtraCache = 1u << 3,     // sparse_decode: a second (compressed) cache
  kFeaturePackedTokens = 1u << 4,   // sparse_decode: queries_per_request > 1
};

// The declared limits of one implementation. An empty list or a zero bound
// means "any".
struct Capabilities {
  std::vector<KvFormat> formats;       // paged-cache formats read (sparse_decode)
  std::vector<int> d_qk;               // query/key head dims
  std::vector<int> d_v;                // value head dims
  std::int64_t max_heads = 0;          // most query heads
  int min_compute_capability = 0;      // CUDA: lowest sm (80 = sm_80); 0 on the host
  int max_compute_capability = 0;      // CUDA: highest sm (90 with 90 min = sm_90 only)
  unsigned features = ~0u;             // Feature bits it can serve
};

struct Implementation {
  Op op;
  std::string_view name;     // unique per op: "reference", "cpu", "cuda.portable", "cuda.sm90"
  Backend backend;
  int priority = 0;          // select() prefers the highest among those that fit
  Capabilities capabilities;
  std::string_view summary;  // one line for `smla info`
};

// The shape-level description of one call: what select() decides on.
struct Problem {
  Op op = Op::kSparseDecode;
  std::optional<KvFormat> format;  // sparse_decode
  std::int64_t tokens = 0;         // query tokens (rows)
  std::int64_t heads = 0;          // query heads
  int d_qk = 0;
  int d_v = 0;
  std::int64_t keys = 0;           // most keys one token may attend
  std::int64_t queries_per_request = 1;
  unsigned features = 0;           // Feature bits used
};

// Every compiled-in implementation, in table order (op, then priority, highest first).
const std::vector<Implementation>& implementations();

// Why `implementation` cannot run `problem` in `context` ("" when it can):
// another backend, an architecture outside its range, a format, head count,
// head dim or feature it does not declare.
std::string unsupported_reason(const Implementation& implementation, const Context& context, const Problem& problem);

// The implementation that runs `problem` in `context`: the one named by
// context.tuning().implementation when the op has it, else the highest
// priority one of the context's backend that supports the problem and, among
// equals, prefers it (a shape heuristic, e.g. the sm90 kernel takes 64-row
// tiles). Unimplemented with every candidate's reason when none fits.
Expected<const Implementation*> select(const Context& context, const Problem& problem);

}  // namespace smla
