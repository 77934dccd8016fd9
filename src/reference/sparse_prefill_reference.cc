// Reference sparse prefill over a flat bf16 KV workspace: plain float64 loops.
#include <vector>

#include "smla/numeric.h"
#include "src/reference/attend_rows.h"
#include "src/reference/reference_ops.h"

namespace smla::reference {

Status sparse_prefill(const SparsePrefillArgs& args, const detail::PrefillShape& shape) {
  const TensorView& kv = args.kv;
  std::vector<double> keys;
  for (std::int64_t s = 0; s < shape.num_queries; ++s) {
    const std::int64_t length =
        shape.has_topk_length ? args.topk_length.ptr<const std::int32_t>()[s * args.topk_length.stride[0]] : shape.topk;
    keys.clear();
    std::int64_t num_rows = 0;
    for (std::int64_t k = 0; k < length; ++k) {
      const std::int64_t index =
          args.indices.ptr<const std::int32_t>()[s * args.indices.stride[0] + k * args.indices.stride[1]];
      if (index < 0 || index >= shape.num_kv) continue;  // -1, other negatives, >= s_kv: not attended
      const auto* kv_row = kv.ptr<const std::uint16_t>() + index * kv.stride[0];
      for (int d = 0; d < shape.d_qk; ++d) keys.push_back(bf16_to_f32(kv_row[d]));
      ++num_rows;
    }
    attend_token(args.q, s, args.sink, keys, num_rows, shape.d_v, args.softmax_scale, args.out, args.lse,
                 args.max_logits);
  }
  return Status::Ok();
}

}  // namespace smla::reference
