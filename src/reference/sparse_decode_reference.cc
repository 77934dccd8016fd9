// Reference sparse decode: plain float64 loops, the oracle for every backend.
#include <vector>

#include "src/core/kv_rows.h"
#include "src/reference/attend_rows.h"
#include "src/reference/reference_ops.h"

namespace smla::reference {

namespace {

// Appends the dequantized rows token t attends in one cache (in index order,
// duplicates included) to `keys`. Invalid entries are skipped unread.
template <class Format>
std::int64_t gather_rows(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths,
                         std::int64_t width, std::int64_t t, std::vector<float>& row, std::vector<double>& keys) {
  const std::int64_t length = lengths.present() ? lengths.ptr<const std::int32_t>()[t * lengths.stride[0]] : width;
  std::int64_t count = 0;
  for (std::int64_t k = 0; k < length; ++k) {
    const std::int64_t slot = indices.ptr<const std::int32_t>()[t * indices.stride[0] + k * indices.stride[1]];
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
  std::vector<float> row(static_cast<std::size_t>(shape.d_qk));
  std::vector<double> keys;
  for (std::int64_t t = 0; t < shape.num_tokens; ++t) {
    // Rows are dequantized once per token and shared by all heads; both
    // index sets feed one softmax.
    keys.clear();
    std::int64_t num_rows =
        gather_rows<Format>(args.main_cache, args.main_indices, args.main_lengths, shape.main_topk, t, row, keys);
    if (shape.has_extra) {
      num_rows += gather_rows<Format>(*args.extra_cache, args.extra_indices, args.extra_lengths, shape.extra_topk, t,
                                      row, keys);
    }
    attend_token(args.q, t, args.sink, keys, num_rows, shape.d_v, args.softmax_scale, args.out, args.lse, TensorView{});
  }
}

}  // namespace

Status sparse_decode(const SparseDecodeArgs& args, const detail::DecodeShape& shape) {
  visit_kv_format(args.main_cache.format, [&](auto traits) { decode_all_tokens<decltype(traits)>(args, shape); });
  return Status::Ok();
}

}  // namespace smla::reference
