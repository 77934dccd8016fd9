// Comparing a backend's output with a reference, and output poisoning.
#pragma once

#include <cstdint>
#include <string>

#include "smla/tensor.h"

namespace smla::testkit {

// An element passes when |got - want| <= abs OR |got - want| <= rel * |want|.
// Inf/NaN must sit in the same places with the same value class.
struct Tolerance {
  double abs = 0.0;
  double rel = 0.0;
  double max_cosine_diff = 1.0;  // 1 - cos(got, want) over the finite elements
};

struct ErrorStats {
  double max_abs_err = 0.0;
  double max_rel_err = 0.0;       // over elements with want != 0
  double cosine_diff = 0.0;       // 1 - cosine similarity of the finite elements (0 when identical)
  std::int64_t nan_mismatch = 0;  // elements where got and want differ in NaN/+inf/-inf/finite class
  std::int64_t count = 0;         // elements compared
  std::int64_t num_outside = 0;   // elements outside the tolerance given to compare_*
  std::int64_t worst_index = -1;  // flat (row-major) index of the largest abs error or first mismatch
  double worst_got = 0.0;
  double worst_want = 0.0;
  bool shape_mismatch = false;
  double tolerance_cosine = 1.0;

  // True when shapes agree, no NaN/inf mismatch, every element within tolerance
  // and the cosine bound holds.
  bool passed() const;
  // "count=... max_abs=... max_rel=... cos_diff=... nan_mismatch=... outside=... worst[i]: got g want w"
  std::string to_string() const;
};

// Elementwise comparison of two CPU tensors of the same shape (any strides).
// compare_bf16 expects bf16 tensors, compare_f32 f32 tensors; a dtype or
// shape disagreement sets shape_mismatch.
ErrorStats compare_bf16(const TensorView& got, const TensorView& want, const Tolerance& tolerance = {});
ErrorStats compare_f32(const TensorView& got, const TensorView& want, const Tolerance& tolerance = {});

// Fills every element of a CPU tensor with a NaN bit pattern of its dtype
// (bf16/f16 0x7FFF-ish quiet NaN, f32/f64 NaN, e4m3 0x7F, integers 0x7F.. bytes).
// Padding between elements is left untouched.
void poison(const TensorView& view);
// True when no element of a floating-point tensor still holds the exact bit pattern poison() wrote.
bool all_written(const TensorView& view);
// Number of elements still holding the poison pattern.
std::int64_t count_poisoned(const TensorView& view);

}  // namespace smla::testkit
