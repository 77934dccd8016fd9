// Decodes one token with one head against two keys of a bf16-rows cache.
#include <smla/attention.h>
#include <smla/context.h>
#include <smla/numeric.h>
#include <smla/version.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  constexpr int kDim = 512;
  std::vector<std::uint16_t> q(kDim, smla::f32_to_bf16(0.0f));
  std::vector<std::uint16_t> cache(2 * kDim);  // one page of two tokens
  for (int i = 0; i < kDim; ++i) {
    cache[i] = smla::f32_to_bf16(1.0f);
    cache[kDim + i] = smla::f32_to_bf16(3.0f);
  }
  std::vector<std::int32_t> indices = {0, 1};
  std::vector<std::uint16_t> out(kDim);
  std::vector<float> lse(1);

  smla::SparseDecodeArgs args;
  args.q = smla::TensorView::contiguous(q.data(), smla::DType::kBF16, {1, 1, kDim});
  args.main_cache.format = smla::KvFormat::kBf16Rows;
  args.main_cache.pages = smla::TensorView::contiguous(cache.data(), smla::DType::kBF16, {1, 2, kDim});
  args.main_indices = smla::TensorView::contiguous(indices.data(), smla::DType::kI32, {1, 2});
  args.softmax_scale = 1.0f / std::sqrt(512.0f);
  args.out = smla::TensorView::contiguous(out.data(), smla::DType::kBF16, {1, 1, kDim});
  args.lse = smla::TensorView::contiguous(lse.data(), smla::DType::kF32, {1, 1});

  // q = 0: both keys score 0, so the output is their mean, 2.0, and lse = log(2).
  // A context and a plan made once serve every call of these shapes.
  auto context = smla::Context::create(smla::Backend::kReference);
  if (!context) {
    std::fprintf(stderr, "%s\n", context.status().to_string().c_str());
    return 1;
  }
  auto plan = smla::plan_sparse_decode(*context, args);
  const smla::Status status = plan ? smla::sparse_decode(*context, *plan, args) : plan.status();
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.to_string().c_str());
    return 1;
  }
  std::printf("smla %.*s: out[0] = %g, lse = %g\n", static_cast<int>(smla::version().size()), smla::version().data(),
              smla::bf16_to_f32(out[0]), lse[0]);
  return smla::bf16_to_f32(out[0]) == 2.0f && std::fabs(lse[0] - std::log(2.0f)) < 1e-6f ? 0 : 1;
}
