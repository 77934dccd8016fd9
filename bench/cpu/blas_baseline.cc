#include "bench/cpu/blas_baseline.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "src/core/kv_rows.h"
#include "src/cpu/thread_pool.h"

namespace smla::bench {

namespace {

void gather_rows(const KvCacheView& cache, const TensorView& indices, const TensorView& lengths, std::int64_t token,
                 int d_qk, std::vector<float>* rows) {
  const std::int64_t width = indices.shape[1];
  const std::int64_t length = lengths.present() ? lengths.ptr<const std::int32_t>()[token * lengths.stride[0]] : width;
  for (std::int64_t j = 0; j < length; ++j) {
    const std::int64_t slot = indices.ptr<const std::int32_t>()[token * indices.stride[0] + j];
    if (slot < 0 || slot >= cache.num_slots()) continue;
    std::int64_t entry = 0;
    const std::uint8_t* page = detail::page_of_slot(cache, slot, &entry);
    rows->resize(rows->size() + static_cast<std::size_t>(d_qk));
    float* row = rows->data() + rows->size() - d_qk;
    visit_kv_format(cache.format, [&](auto format) {
      detail::decode_token<decltype(format)>(page, cache.page_size(), entry, cache.fp8_scale, row);
    });
  }
}

}  // namespace

void blas_baseline_decode(const SparseDecodeArgs& args) {
  openblas_set_num_threads(1);
  const KvFormatInfo info = kv_format_info(args.main_cache.format);
  const int d_qk = info.head_dim;
  const int d_v = info.value_dim;
  const std::int64_t heads = args.q.shape[1];
  cpu::parallel_for(args.q.shape[0], [&](std::int64_t t, int) {
    thread_local std::vector<float> k, q, s, o;
    k.clear();
    gather_rows(args.main_cache, args.main_indices, args.main_lengths, t, d_qk, &k);
    if (args.extra_cache.has_value()) gather_rows(*args.extra_cache, args.extra_indices, args.extra_lengths, t, d_qk, &k);
    const int n = static_cast<int>(k.size() / static_cast<std::size_t>(d_qk));
    q.resize(static_cast<std::size_t>(heads * d_qk));
    for (std::int64_t h = 0; h < heads; ++h) {
      const auto* src = args.q.ptr<const std::uint16_t>() + t * args.q.stride[0] + h * args.q.stride[1];
      for (int i = 0; i < d_qk; ++i) q[h * d_qk + i] = bf16_to_f32(src[i]);
    }
    s.assign(static_cast<std::size_t>(heads * std::max(n, 1)), 0.0f);
    o.assign(static_cast<std::size_t>(heads * d_v), 0.0f);
    const int h = static_cast<int>(heads);
    if (n > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, h, n, d_qk, args.softmax_scale, q.data(), d_qk, k.data(),
                  d_qk, 0.0f, s.data(), n);
    }
    std::vector<float> denominators(static_cast<std::size_t>(heads));
    for (int r = 0; r < h; ++r) {
      float* row = s.data() + r * n;
      float max_logit = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) max_logit = std::max(max_logit, row[j]);
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) sum += row[j] = std::exp(row[j] - max_logit);
      const float sink = args.sink.present() ? args.sink.ptr<const float>()[r * args.sink.stride[0]]
                                             : -std::numeric_limits<float>::infinity();
      denominators[r] = sum + std::exp(sink - max_logit);
      if (args.lse.present()) {
        args.lse.ptr<float>()[t * args.lse.stride[0] + r * args.lse.stride[1]] =
            n > 0 ? max_logit + std::log(sum) : std::numeric_limits<float>::infinity();
      }
    }
    if (n > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, h, d_v, n, 1.0f, s.data(), n, k.data(), d_qk, 0.0f,
                  o.data(), d_v);
    }
    for (int r = 0; r < h; ++r) {
      auto* out = args.out.ptr<std::uint16_t>() + t * args.out.stride[0] + r * args.out.stride[1];
      for (int i = 0; i < d_v; ++i) out[i] = f32_to_bf16(n > 0 ? o[r * d_v + i] / denominators[r] : 0.0f);
    }
  });
}

}  // namespace smla::bench
