// The cross-backend consistency suite for non-finite values and overflow
// (docs/attention.md, "Non-finite values and overflow"): one table of
// adversarial cases that every backend runs and compares with the float64
// reference. The CPU test (nonfinite_cpu_test.cc) and the CUDA test
// (tests/unit/cuda/cuda_nonfinite_test.cc) share this table.
//
// Each case also names, per (token, head) row, what the semantics table says
// the row must be (RowKind); check_semantics verifies the reference output
// against it, so the reference itself is held to the table, not only the
// backends to the reference.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "smla/attention.h"
#include "testkit/testkit.h"

namespace smla::nonfinite {

enum class Op { kDecode, kPrefill };

// What one (token, head) row must hold.
enum class RowKind {
  kFinite,    // out, lse (and max_logits) finite
  kNan,       // every out element NaN, lse NaN, max_logits NaN
  kNanOut,    // every out element NaN, lse and max_logits finite (NaN sink)
  kZeroOut,   // every out element +-0, lse and max_logits finite (+inf sink)
  kEmpty,     // nothing attended: out 0, lse +inf, max_logits -inf
  kScaled,    // logits past f32: out finite (not all 0 without sink), lse / max_logits not NaN (+-inf allowed)
};

const char* row_kind_name(RowKind kind);

// The launch shape a case is built with. Decode: num_requests x s_q tokens,
// queries_per_request = s_q when `pack`. Prefill: s_q = num_requests * s_q queries.
// The CUDA test varies it to reach split, unsplit, packed and sm90 launches.
struct Shape {
  std::int64_t num_requests = 2;
  int s_q = 2;
  std::int64_t num_heads = 16;
  bool pack = false;
  std::string name() const;
};

// One built case: inputs, the softmax scale and the expected row kinds.
struct Case {
  std::string name;
  Op op = Op::kDecode;
  std::optional<testkit::DecodeCase> decode;
  std::optional<testkit::PrefillCase> prefill;
  bool has_sink = true;
  float softmax_scale = 0.0f;
  std::int64_t queries_per_request = 1;
  std::int64_t num_tokens = 0;
  std::int64_t num_heads = 0;
  std::vector<RowKind> rows;  // [num_tokens * num_heads]
  std::vector<RowKind> must_occur;   // kinds the case exists to produce (a planting that missed fails)
  bool stats_may_overflow = false;   // lse / max_logits of attended rows may be +-inf (scaled past f32)
  bool expect_lse_overflow = false;  // some row's lse must be +inf (the case reaches past f32)

  RowKind& row(std::int64_t t, std::int64_t h) { return rows[static_cast<std::size_t>(t * num_heads + h)]; }
  RowKind row(std::int64_t t, std::int64_t h) const { return rows[static_cast<std::size_t>(t * num_heads + h)]; }
};

// Outputs of one backend run, filled with a finite sentinel first (not NaN:
// an unwritten element must not pass for an expected NaN).
struct Outputs {
  testkit::HostTensor out, lse, max_logits;  // max_logits: prefill only
};

struct CaseSpec {
  const char* name;
  Op op;
  bool packable;  // its NaN rows are selected by every token of a packed group (docs/cuda_backend.md, packed MTP)
  Case (*build)(const Shape& shape, std::uint64_t seed);
};

// The table. Every case is built fresh for a shape (num_heads >= 4).
const std::vector<CaseSpec>& cases();
// GoogleTest prints a table entry by its name.
void PrintTo(const CaseSpec& spec, std::ostream* os);

Outputs make_outputs(const Case& c);
SparseDecodeArgs decode_args(Case& c, const Outputs& outputs);
SparsePrefillArgs prefill_args(Case& c, const Outputs& outputs);
// Runs the case on a CPU-side backend (reference, cpu) into fresh outputs.
Status run_host(Case& c, Backend backend, Outputs* outputs);

// "" when the reference outputs follow c.rows; otherwise what is wrong (first few rows).
std::string check_semantics(const Case& c, const Outputs& reference);

// The comparison rule: NaN positions identical, +-inf positions identical
// (testkit compare: same value class), finite values within tolerance.
struct Tolerances {
  testkit::Tolerance out;
  testkit::Tolerance stat;  // lse and max_logits
};
// "" when `got` matches `want` under the rule; otherwise the failing tensors' reports.
std::string compare(const Case& c, const Outputs& got, const Outputs& want, const Tolerances& tolerances);

}  // namespace smla::nonfinite
