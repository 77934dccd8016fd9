// Reference sparse decode: plain float64 loops, the oracle for every backend.
#include <cmath>
#include <limits>
#include <vector>

#include "src/core/kv_rows.h"
#include "src/reference/attend_rows.h"
#include "src/reference/reference_ops.h"

namespace smla::reference {

namespace {

std::int32_t load_i32(const TensorView& t, std::int64_t i, std::int64_t j) {
  return t.ptr<const std::int32_t>()[i * t.stride[0] + j * t.stride[1]];
}

// Appends the dequantized rows token t attends in one cache (in index order,
// duplicates included) to `keys`. Invalid entries are skipped unread.
template <class Format>
std::int64_t gather_rows(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths,
                         std::int64_t width, std::int64_t t, std::vector<float>& row, std::vector<double>& keys) {
  const std::int64_t length = lengths.present() ? lengths.ptr<const std::int32_t>()[t * lengths.stride[0]] : width;
  std::int64_t count = 0;
  for (std::int64_t k = 0; k < length; ++k) {
    const std::int64_t slot = load_i32(indices, t, k);
    if (slot < 0 || slot >= cache.num_slots()) continue;
    std::int64_t entry = 0;
    const std::uint8_t* page = ::smla::detail::page_of_slot(cache, slot, &entry);
    ::smla::detail::decode_token<Format>(page, cache.page_size(), entry, cache.fp8_scale, row.data());
    keys.insert(keys.end(), row.begin(), row.end());
    ++count;
  }
  return count;
}

template <class Format>
void decode_all_tokens(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const int d_qk = shape.d_qk;
  const int d_v = shape.d_v;
  std::vector<float> row(static_cast<std::size_t>(d_qk));
  std::vector<double> keys, q(static_cast<std::size_t>(d_qk)), out(static_cast<std::size_t>(d_v));
  for (std::int64_t t = 0; t < shape.num_tokens; ++t) {
    // Rows are dequantized once per token and shared by all heads.
    keys.clear();
    std::int64_t num_rows = gather_rows<Format>(args.main_cache, args.main_indices, args.main_lengths,
                                                shape.main_topk, t, row, keys);
    if (shape.has_extra) {
      num_rows += gather_rows<Format>(*args.extra_cache, args.extra_indices, args.extra_lengths, shape.extra_topk,
                                      t, row, keys);
    }
    for (std::int64_t h = 0; h < shape.num_heads; ++h) {
      const auto* q_row = args.q.ptr<const std::uint16_t>() + t * args.q.stride[0] + h * args.q.stride[1];
      for (int d = 0; d < d_qk; ++d) q[static_cast<std::size_t>(d)] = bf16_to_f32(q_row[d]);
      const double sink = shape.has_sink ? args.sink.ptr<const float>()[h * args.sink.stride[0]] : kNegInf;
      const HeadResult r = attend_rows(q.data(), keys, num_rows, d_qk, d_v, args.softmax_scale, sink, out.data());
      auto* out_row = args.out.ptr<std::uint16_t>() + t * args.out.stride[0] + h * args.out.stride[1];
      for (int d = 0; d < d_v; ++d) out_row[d] = f32_to_bf16(static_cast<float>(out[static_cast<std::size_t>(d)]));
      if (shape.has_lse) {
        args.lse.ptr<float>()[t * args.lse.stride[0] + h * args.lse.stride[1]] = static_cast<float>(r.lse);
      }
    }
  }
}

}  // namespace

Status sparse_decode(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  visit_kv_format(args.main_cache.format, [&](auto traits) { decode_all_tokens<decltype(traits)>(args, shape); });
  return Status::Ok();
}

}  // namespace smla::reference
