// Synthetic sparse prefill cases over a flat bf16 KV workspace.
#pragma once

#include <cstdint>

#include "smla/attention.h"
#include "testkit/host_tensor.h"

namespace smla::testkit {

struct PrefillCaseOptions {
  std::int64_t s_q = 8;
  std::int64_t s_kv = 256;
  std::int64_t num_heads = 64;
  int d_qk = 512;  // 512 (V4) or 576 (V3.2)
  int d_v = 512;
  std::int64_t topk = 128;
  bool topk_length = true;        // random per-query topk_length in [0, topk]
  bool sink = true;               // random finite per head, some heads -inf
  bool strided = false;           // padded strides for q/kv/out/lse/max_logits/indices
  double invalid_fraction = 0.1;  // entries set to -1, other negatives or >= s_kv
  bool poison_unselected = true;  // NaN bf16 in every kv row no attended index selects
  double value_scale = 1.0;
  double query_scale = 1.0;  // Q's deviation is value_scale * query_scale: logits that far apart, V as before
  std::uint64_t seed = 1;
};

Status check_prefill_case_options(const PrefillCaseOptions& options);

class PrefillCase {
 public:
  PrefillCase(PrefillCase&&) noexcept = default;
  PrefillCase& operator=(PrefillCase&&) noexcept = default;

  const PrefillCaseOptions& options() const { return options_; }
  float softmax_scale() const { return softmax_scale_; }

  // Views into this case's buffers; out, max_logits and lse are poisoned first.
  SparsePrefillArgs args();
  // Refills out, max_logits and lse with NaN poison (testkit::poison).
  void poison_outputs();
  SparsePrefillArgs args_with_outputs(const TensorView& out, const TensorView& max_logits, const TensorView& lse) const;
  HostTensor make_out() const;
  HostTensor make_max_logits() const;
  HostTensor make_lse() const;

  const HostTensor& out() const { return out_; }
  const HostTensor& max_logits() const { return max_logits_; }
  const HostTensor& lse() const { return lse_; }

 private:
  PrefillCase() = default;
  friend PrefillCase make_prefill_case(const PrefillCaseOptions& options);

  PrefillCaseOptions options_{};
  float softmax_scale_ = 0.0f;
  HostTensor q_, kv_, indices_, topk_length_, sink_, out_, max_logits_, lse_;
};

// Indices are distinct valid rows of [0, s_kv) mixed with -1, other negative
// values and values >= s_kv (invalid_fraction of them). Precondition:
// check_prefill_case_options is OK (otherwise the options are clamped).
PrefillCase make_prefill_case(const PrefillCaseOptions& options);

}  // namespace smla::testkit
