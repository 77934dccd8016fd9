// smla::CudaModel verification: after a step, each layer's staged attention
// rows (q, index lists, lengths, output) and its caches are copied to the host
// and the rows are re-run on the float64 reference (as Model does).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "smla/attention.h"
#include "smla/numeric.h"
#include "src/layer/model/cuda/cuda_model_impl.h"

namespace smla {

using cuda_model::DeviceMem;
using cuda_model::kHeadDim;

namespace {

template <class T>
Status download(std::vector<T>& dst, const void* src, std::size_t count) {
  dst.resize(count);
  return cuda_status(cudaMemcpy(dst.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost), "verify download");
}

}  // namespace

Status CudaModel::Impl::verify_step(const cuda_model::StepShape& shape, StepStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  const auto n = static_cast<std::int64_t>(shape.verify_rows.size());
  const std::int64_t H = config.num_heads, W = config.window;
  const std::int64_t row = H * kHeadDim;
  std::vector<std::uint16_t> q_rows, o_rows, ref(static_cast<std::size_t>(n * row));
  std::vector<std::int32_t> swa_idx, swa_len, ext_idx, ext_len;
  std::vector<std::uint8_t> swa_bytes, compressed_bytes;
  std::vector<float> sink;
  const std::size_t un = static_cast<std::size_t>(n);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const cuda_model::DeviceLayer& layer = layers[l];
    const VerifyStage& v = verify_stage[l];
    const bool compressed = layer.type != LayerType::kSwaOnly;
    const std::int64_t EW = layer.extra_width;
    SMLA_RETURN_IF_ERROR(download(q_rows, v.q.get(), un * static_cast<std::size_t>(row)));
    SMLA_RETURN_IF_ERROR(download(o_rows, v.o.get(), un * static_cast<std::size_t>(row)));
    SMLA_RETURN_IF_ERROR(download(swa_idx, v.swa_indices.get(), un * static_cast<std::size_t>(W)));
    SMLA_RETURN_IF_ERROR(download(swa_len, v.swa_lens.get(), un));
    SMLA_RETURN_IF_ERROR(download(swa_bytes, layer.swa.mem.get(), layer.swa.mem.bytes));
    SMLA_RETURN_IF_ERROR(download(sink, layer.sink.get(), static_cast<std::size_t>(H)));
    if (compressed) {
      SMLA_RETURN_IF_ERROR(download(ext_idx, v.extra_indices.get(), un * static_cast<std::size_t>(EW)));
      SMLA_RETURN_IF_ERROR(download(ext_len, v.extra_lens.get(), un));
      SMLA_RETURN_IF_ERROR(download(compressed_bytes, layer.compressed.mem.get(), layer.compressed.mem.bytes));
    }
    auto host_cache = [&](std::vector<std::uint8_t>& bytes, const cuda_model::DevicePaged& paged) {
      KvCacheView c = kv_view(paged);
      c.pages.data = bytes.data();
      c.pages.device = Device{};
      return c;
    };
    SparseDecodeArgs a;
    a.q = TensorView::contiguous(q_rows.data(), DType::kBF16, {n, H, kHeadDim});
    a.main_cache = host_cache(swa_bytes, layer.swa);
    a.main_indices = TensorView::contiguous(swa_idx.data(), DType::kI32, {n, W});
    a.main_lengths = TensorView::contiguous(swa_len.data(), DType::kI32, {n});
    if (compressed) {
      a.extra_cache = host_cache(compressed_bytes, layer.compressed);
      a.extra_indices = TensorView::contiguous(ext_idx.data(), DType::kI32, {n, EW});
      a.extra_lengths = TensorView::contiguous(ext_len.data(), DType::kI32, {n});
    }
    a.sink = TensorView::contiguous(sink.data(), DType::kF32, {H});
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    a.out = TensorView::contiguous(ref.data(), DType::kBF16, {n, H, kHeadDim});
    SMLA_RETURN_IF_ERROR(sparse_decode(a, Backend::kReference).with_context("verify reference: "));
    double max_err = 0.0;
    for (std::size_t k = 0; k < ref.size(); ++k) {
      const double err = std::fabs(static_cast<double>(bf16_to_f32(o_rows[k])) - bf16_to_f32(ref[k]));
      max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
    }
    stats.checks.push_back(LayerCheck{static_cast<int>(l), layer.type, max_err, n});
  }
  stats.verify_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

}  // namespace smla
