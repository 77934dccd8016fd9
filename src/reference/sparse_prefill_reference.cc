// Reference sparse prefill over a flat bf16 KV workspace: plain float64 loops.
#include <cmath>
#include <limits>
#include <vector>

#include "smla/numeric.h"
#include "src/reference/attend_rows.h"
#include "src/reference/reference_ops.h"

namespace smla::reference {

Status sparse_prefill(const SparsePrefillArgs& args, const detail::PrefillShape& shape) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const int d_qk = shape.d_qk;
  const int d_v = shape.d_v;
  std::vector<double> keys, q(static_cast<std::size_t>(d_qk)), out(static_cast<std::size_t>(d_v));
  for (std::int64_t s = 0; s < shape.num_queries; ++s) {
    const std::int64_t length =
        shape.has_topk_length ? args.topk_length.ptr<const std::int32_t>()[s * args.topk_length.stride[0]] : shape.topk;
    keys.clear();
    std::int64_t num_rows = 0;
    for (std::int64_t k = 0; k < length; ++k) {
      const std::int64_t index = args.indices.ptr<const std::int32_t>()[s * args.indices.stride[0] + k * args.indices.stride[1]];
      if (index < 0 || index >= shape.num_kv) continue;
      const auto* kv_row = args.kv.ptr<const std::uint16_t>() + index * args.kv.stride[0];
      for (int d = 0; d < d_qk; ++d) keys.push_back(bf16_to_f32(kv_row[d]));
      ++num_rows;
    }
    for (std::int64_t h = 0; h < shape.num_heads; ++h) {
      const auto* q_row = args.q.ptr<const std::uint16_t>() + s * args.q.stride[0] + h * args.q.stride[1];
      for (int d = 0; d < d_qk; ++d) q[static_cast<std::size_t>(d)] = bf16_to_f32(q_row[d]);
      const double sink = shape.has_sink ? args.sink.ptr<const float>()[h * args.sink.stride[0]] : kNegInf;
      const HeadResult r = attend_rows(q.data(), keys, num_rows, d_qk, d_v, args.softmax_scale, sink, out.data());
      auto* out_row = args.out.ptr<std::uint16_t>() + s * args.out.stride[0] + h * args.out.stride[1];
      for (int d = 0; d < d_v; ++d) out_row[d] = f32_to_bf16(static_cast<float>(out[static_cast<std::size_t>(d)]));
      if (shape.has_lse) args.lse.ptr<float>()[s * args.lse.stride[0] + h * args.lse.stride[1]] = static_cast<float>(r.lse);
      if (shape.has_max_logits) {
        args.max_logits.ptr<float>()[s * args.max_logits.stride[0] + h * args.max_logits.stride[1]] =
            static_cast<float>(r.max_logit);
      }
    }
  }
  return Status::Ok();
}

}  // namespace smla::reference
