// Synthetic DeepSeek-V4 sparse decode cases (no test-framework dependency).
//
// A case owns every buffer: q, the paged main (sliding-window) cache and the
// optional extra (compressed) cache with randomly permuted block tables, the
// global-slot index lists, lengths, sink and poisoned outputs.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "smla/attention.h"
#include "smla/kv_format.h"
#include "testkit/host_tensor.h"

namespace smla::testkit {

struct DecodeCaseOptions {
  std::int64_t num_requests = 4;
  int s_q = 2;  // query tokens per request (MTP); T = num_requests * s_q
  std::int64_t num_heads = 64;
  KvFormat format = KvFormat::kV4Fp8;
  std::int64_t main_topk = 128;  // sliding window width W
  std::int64_t main_page_size = 64;
  std::int64_t main_context = 4096;  // tokens each request holds in the main cache
  std::int64_t extra_topk = 512;     // 0: no extra cache (V3.2 and SWA-only layers)
  std::int64_t extra_page_size = 64;
  std::int64_t extra_context = 1024;  // compressed entries each request holds
  bool random_lengths = false;        // per-token lengths uniform in [0, width]
  bool sink = true;                   // random finite per head, some heads -inf
  bool poison_unselected = true;      // NaN in every KV byte no attended index selects
  bool strided = false;               // padded strides for q/out/lse/indices and cache pages
  // q's head stride minus d_qk when >= 0 (its token stride follows), else kHeadPad when
  // strided and 0 otherwise: an odd pad puts q's rows off 16 bytes.
  std::int64_t q_head_pad = -1;
  std::uint64_t seed = 1;
  // Extensions beyond the basic case:
  double invalid_index_fraction = 0.0;  // share of attended entries replaced by out-of-range values
  double value_scale = 1.0;             // KV and q values ~ N(0, value_scale^2)
};

// Checks the options (positive sizes, s_q >= 1, main_context >= s_q, h in [1, 128],
// 0 <= invalid_index_fraction <= 1, finite value_scale > 0). Any format may
// have an extra cache (V3.2 production layers have none: set extra_topk = 0).
// make_decode_case requires OK options.
Status check_decode_case_options(const DecodeCaseOptions& options);

class DecodeCase {
 public:
  DecodeCase(DecodeCase&&) noexcept = default;
  DecodeCase& operator=(DecodeCase&&) noexcept = default;

  const DecodeCaseOptions& options() const { return options_; }
  std::int64_t num_tokens() const { return num_tokens_; }
  std::int64_t num_heads() const { return options_.num_heads; }
  int d_qk() const;
  int d_v() const;
  float softmax_scale() const { return softmax_scale_; }
  bool has_extra() const { return extra_pages_.present(); }

  // Views into this case's buffers. out and lse are poisoned first (see
  // poison_outputs), so an element the backend forgets to write shows.
  SparseDecodeArgs args();
  // Refills out and lse with NaN poison (testkit::poison).
  void poison_outputs();
  // The same inputs writing to caller-owned outputs (nothing is poisoned).
  SparseDecodeArgs args_with_outputs(const TensorView& out, const TensorView& lse) const;
  // Fresh zeroed outputs with this case's shapes and strides.
  HostTensor make_out() const;
  HostTensor make_lse() const;

  const HostTensor& out() const { return out_; }
  const HostTensor& lse() const { return lse_; }

  // Index entries that are attended (position < length, 0 <= idx < num_slots),
  // summed over tokens and both caches; duplicates count each time.
  std::int64_t attended_entries() const { return attended_entries_; }
  // Bytes of KV the attended entries read (bytes_per_token each).
  std::int64_t attended_kv_bytes() const;

 private:
  DecodeCase() = default;
  friend DecodeCase make_decode_case(const DecodeCaseOptions& options);

  DecodeCaseOptions options_{};
  std::int64_t num_tokens_ = 0;
  float softmax_scale_ = 0.0f;
  float fp8_scale_ = 1.0f;
  HostTensor q_, main_pages_, main_indices_, main_lengths_;
  HostTensor extra_pages_, extra_indices_, extra_lengths_;
  HostTensor sink_, out_, lse_;
  std::int64_t attended_entries_ = 0;
};

// Builds a case. Per request: a random permuted block table for each cache;
// main indices = the last main_topk positions before and including each
// token (padded with -1 near the start); extra indices = distinct random
// compressed entries, padded with -1. Only attended rows hold finite data
// (written with the production quantizer); with poison_unselected every other
// cache byte is a NaN pattern. Precondition: check_decode_case_options is OK
// (otherwise the options are clamped to valid values).
DecodeCase make_decode_case(const DecodeCaseOptions& options);

}  // namespace smla::testkit
