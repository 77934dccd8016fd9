// Argument validation of sparse_decode / sparse_prefill on the reference
// backend: random TensorViews (shapes, strides, dtypes, absent or damaged
// arguments) over small arenas, random index and length values, random scales.
// The call must return a Status or compute; it must never read outside the
// views' memory (ASan: every arena is an exact-size heap block), never write to
// an input, and never write outside `out` / `lse` / `max_logits`.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "smla/attention.h"

namespace {

using smla::DType;
using smla::TensorView;
using smla::fuzz::Arena;
using smla::fuzz::extent;
using smla::fuzz::maybe_damage;
using smla::fuzz::view_in;

// Index values: mostly small (valid or just out of range), sometimes anything.
void index_values(FuzzedDataProvider& fdp, Arena& arena, std::int64_t slots) {
  if (fdp.ConsumeIntegralInRange<int>(0, 7) == 7) return;
  auto* words = reinterpret_cast<std::int32_t*>(arena.data());
  for (std::size_t i = 0; i < arena.bytes() / 4; ++i) {
    const auto modulus = static_cast<std::uint32_t>(std::clamp<std::int64_t>(slots, 0, 1 << 20) + 4);
    words[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(words[i]) % modulus) - 2;
  }
}

// A paged cache [pages, page_size, row] with a page stride of at least the
// page contents plus random padding (or, rarely, too small), inside `arena`.
smla::KvCacheView cache_in(FuzzedDataProvider& fdp, const Arena& arena, smla::KvFormat format) {
  const smla::KvFormatInfo info = smla::kv_format_info(format);
  const std::int64_t item = static_cast<std::int64_t>(smla::dtype_size(info.storage_dtype));
  const std::int64_t capacity = static_cast<std::int64_t>(arena.bytes()) / item;
  std::int64_t pages = 3 - extent(fdp, 0, 3), page_size = 4 - extent(fdp, 0, 3);
  const std::int64_t row = info.row_elements;
  // V4 pages are padded to 576-byte multiples: give room for it.
  std::int64_t stride = page_size * row + extent(fdp, 0, 2) * (576 / item) + extent(fdp, 0, 8);
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 15) stride = extent(fdp, 0, page_size * row);
  while (pages > 0 && (pages - 1) * stride + page_size * row > capacity) --pages;
  smla::KvCacheView cache;
  cache.format = format;
  cache.fp8_scale = fdp.ConsumeBool() ? fdp.ConsumeFloatingPoint<float>() : 0.5f;
  cache.pages = TensorView::strided(arena.data(), info.storage_dtype, {pages, page_size, row}, {stride, row, 1});
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 15) cache.pages.stride[1] = row + 1;  // rows not packed
  if (pages > 0) {
    const std::int64_t used = (pages - 1) * stride + page_size * row;
    cache.pages.data = arena.data() + extent(fdp, 0, capacity - used) * item;
  }
  maybe_damage(fdp, cache.pages);
  return cache;
}

void decode(FuzzedDataProvider& fdp) {
  const auto format = static_cast<smla::KvFormat>(fdp.ConsumeIntegralInRange<int>(0, 3));
  const smla::KvFormatInfo info = smla::kv_format_info(format);
  const std::int64_t t = 3 - extent(fdp, 0, 3);
  const std::int64_t h = fdp.ConsumeIntegralInRange<int>(0, 31) == 31 ? extent(fdp, 0, 130) : extent(fdp, 1, 4);
  const std::int64_t d_qk = fdp.ConsumeIntegralInRange<int>(0, 31) == 31 ? extent(fdp, 0, 600) : info.head_dim;
  Arena q_arena(fdp, static_cast<std::size_t>(2 * (t * h * d_qk + 64)));
  Arena main_arena(fdp, 4 * 2400), extra_arena(fdp, 2 * 2400), index_arena(fdp, 4 * 96), small(fdp, 4 * 160);
  smla::SparseDecodeArgs args;
  args.q = view_in(fdp, q_arena, DType::kBF16, {t, h, d_qk});
  args.main_cache = cache_in(fdp, main_arena, format);
  index_values(fdp, index_arena, args.main_cache.num_slots());
  args.main_indices = view_in(fdp, index_arena, DType::kI32, {t, 8 - extent(fdp, 0, 8)});
  if (fdp.ConsumeBool()) args.main_lengths = view_in(fdp, small, DType::kI32, {t});
  if (fdp.ConsumeBool()) {
    args.extra_cache = cache_in(fdp, extra_arena, format);
    args.extra_indices = view_in(fdp, index_arena, DType::kI32, {t, extent(fdp, 0, 6)});
    if (fdp.ConsumeBool()) args.extra_lengths = view_in(fdp, small, DType::kI32, {t});
  } else if (fdp.ConsumeIntegralInRange<int>(0, 15) == 15) {
    args.extra_indices = view_in(fdp, index_arena, DType::kI32, {t, 2});  // indices without a cache
  }
  if (fdp.ConsumeBool()) args.sink = view_in(fdp, small, DType::kF32, {h});
  args.softmax_scale = fdp.ConsumeBool() ? fdp.ConsumeFloatingPoint<float>() : 0.0442f;
  args.queries_per_request = 1 + fdp.ConsumeIntegralInRange<std::int64_t>(-2, 3) * (fdp.ConsumeBool() ? 1 : -1);
  for (TensorView* v : {&args.q, &args.main_indices, &args.main_lengths, &args.extra_indices, &args.extra_lengths,
                        &args.sink}) {
    maybe_damage(fdp, *v);
  }
  const std::int64_t d_v = fdp.ConsumeIntegralInRange<int>(0, 31) == 31 ? extent(fdp, 0, 600) : info.value_dim;
  Arena out_arena(fdp, static_cast<std::size_t>(2 * (t * h * d_v + 32))), lse_arena(fdp, static_cast<std::size_t>(4 * (t * h + 8)));
  args.out = view_in(fdp, out_arena, DType::kBF16, {t, h, d_v});
  if (fdp.ConsumeBool()) args.lse = view_in(fdp, lse_arena, DType::kF32, {t, h});
  maybe_damage(fdp, args.out);
  maybe_damage(fdp, args.lse);
  for (Arena* a : {&q_arena, &main_arena, &extra_arena, &index_arena, &small, &out_arena, &lse_arena}) a->snapshot();

  (void)smla::sparse_decode(args, smla::Backend::kReference);

  for (Arena* a : {&q_arena, &main_arena, &extra_arena, &index_arena, &small}) SMLA_FUZZ_CHECK(a->unchanged());
  SMLA_FUZZ_CHECK(smla::fuzz::unchanged_outside(out_arena, out_arena.before(), args.out));
  SMLA_FUZZ_CHECK(smla::fuzz::unchanged_outside(lse_arena, lse_arena.before(), args.lse));
}

void prefill(FuzzedDataProvider& fdp) {
  const std::int64_t s_q = 3 - extent(fdp, 0, 3);
  const std::int64_t h = fdp.ConsumeIntegralInRange<int>(0, 31) == 31 ? extent(fdp, 0, 130) : extent(fdp, 1, 4);
  const std::int64_t d_qk = !fdp.ConsumeBool() ? 512 : fdp.ConsumeBool() ? extent(fdp, 0, 600) : 576;
  const std::int64_t s_kv = 6 - extent(fdp, 0, 6);
  Arena q_arena(fdp, static_cast<std::size_t>(2 * (s_q * h * d_qk + 64)));
  Arena kv_arena(fdp, static_cast<std::size_t>(2 * (s_kv * d_qk + 64))), index_arena(fdp, 4 * 96), small(fdp, 4 * 64);
  smla::SparsePrefillArgs args;
  args.q = view_in(fdp, q_arena, DType::kBF16, {s_q, h, d_qk});
  args.kv = view_in(fdp, kv_arena, DType::kBF16, {s_kv, d_qk});
  index_values(fdp, index_arena, s_kv);
  args.indices = view_in(fdp, index_arena, DType::kI32, {s_q, 8 - extent(fdp, 0, 8)});
  if (fdp.ConsumeBool()) args.topk_length = view_in(fdp, small, DType::kI32, {s_q});
  if (fdp.ConsumeBool()) args.sink = view_in(fdp, small, DType::kF32, {h});
  args.softmax_scale = fdp.ConsumeBool() ? fdp.ConsumeFloatingPoint<float>() : 0.0442f;
  args.d_v = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<int>(-1, 600) : 512;
  for (TensorView* v : {&args.q, &args.kv, &args.indices, &args.topk_length, &args.sink}) maybe_damage(fdp, *v);
  const std::int64_t d_v = args.d_v > 0 ? args.d_v : 1;
  Arena out_arena(fdp, static_cast<std::size_t>(2 * (s_q * h * d_v + 32)));
  Arena max_arena(fdp, static_cast<std::size_t>(4 * (s_q * h + 8))), lse_arena(fdp, static_cast<std::size_t>(4 * (s_q * h + 8)));
  args.out = view_in(fdp, out_arena, DType::kBF16, {s_q, h, d_v});
  if (fdp.ConsumeBool()) args.max_logits = view_in(fdp, max_arena, DType::kF32, {s_q, h});
  if (fdp.ConsumeBool()) args.lse = view_in(fdp, lse_arena, DType::kF32, {s_q, h});
  for (TensorView* v : {&args.out, &args.max_logits, &args.lse}) maybe_damage(fdp, *v);
  for (Arena* a : {&q_arena, &kv_arena, &index_arena, &small, &out_arena, &max_arena, &lse_arena}) a->snapshot();

  (void)smla::sparse_prefill(args, smla::Backend::kReference);

  for (Arena* a : {&q_arena, &kv_arena, &index_arena, &small}) SMLA_FUZZ_CHECK(a->unchanged());
  SMLA_FUZZ_CHECK(smla::fuzz::unchanged_outside(out_arena, out_arena.before(), args.out));
  SMLA_FUZZ_CHECK(smla::fuzz::unchanged_outside(max_arena, max_arena.before(), args.max_logits));
  SMLA_FUZZ_CHECK(smla::fuzz::unchanged_outside(lse_arena, lse_arena.before(), args.lse));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  if (fdp.ConsumeBool()) {
    decode(fdp);
  } else {
    prefill(fdp);
  }
  return 0;
}
