// Index transforms (c4a_global_topk_indices, v32_request_to_global_indices,
// mixed_sparse_indices) on random strided views over arenas with random
// values: a Status or a result; inputs never written; outputs never written
// outside their views (ASan), every written index -1 or a slot the block
// table maps.
#include <cstdint>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "smla/metadata.h"

namespace {

using smla::DType;
using smla::TensorView;
using smla::fuzz::Arena;
using smla::fuzz::extent;
using smla::fuzz::maybe_damage;
using smla::fuzz::view_in;

// Output rows with spare capacity, in their own exact-size heap block.
struct Out {
  std::vector<std::int32_t> cells;
  TensorView view;
  Out(std::int64_t rows, std::int64_t cols) : cells(static_cast<std::size_t>(rows * cols + 1), -7) {
    view = TensorView::contiguous(cells.data(), DType::kI32, {rows, cols});
  }
  explicit Out(std::int64_t rows) : cells(static_cast<std::size_t>(rows + 1), -7) {
    view = TensorView::contiguous(cells.data(), DType::kI32, {rows});
  }
};

// Fills an i32 arena with small values (mostly in [-2, 40)) when asked.
void small_values(FuzzedDataProvider& fdp, Arena& arena) {
  if (fdp.ConsumeBool()) return;  // used-up input: small values
  auto* words = reinterpret_cast<std::int32_t*>(arena.data());
  for (std::size_t i = 0; i < arena.bytes() / 4; ++i) words[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(words[i]) % 42) - 2;
}

void c4a(FuzzedDataProvider& fdp) {
  Arena ints(fdp, 4 * 400), flags(fdp, 64);
  small_values(fdp, ints);
  const std::int64_t n = extent(fdp, 0, 8), k = extent(fdp, 0, 12), rows = extent(fdp, 0, 5), nb = extent(fdp, 0, 6);
  TensorView local = view_in(fdp, ints, DType::kI32, {n, k});
  TensorView t2r = view_in(fdp, ints, DType::kI32, {n});
  TensorView valid = fdp.ConsumeBool() ? view_in(fdp, flags, DType::kU8, {n}) : TensorView{};
  TensorView table = view_in(fdp, ints, DType::kI32, {rows, nb});
  for (TensorView* v : {&local, &t2r, &valid, &table}) maybe_damage(fdp, *v);
  const std::int64_t block_size = fdp.ConsumeIntegralInRange<std::int64_t>(-1, 70);
  Out global(n + extent(fdp, 0, 2), k), lens(n + extent(fdp, 0, 2));
  maybe_damage(fdp, global.view);
  ints.snapshot();
  flags.snapshot();
  (void)smla::c4a_global_topk_indices(local, t2r, valid, table, block_size, global.view, lens.view);
  SMLA_FUZZ_CHECK(ints.unchanged() && flags.unchanged());
  SMLA_FUZZ_CHECK(global.cells.back() == -7 && lens.cells.back() == -7);
}

void v32(FuzzedDataProvider& fdp) {
  Arena ints(fdp, 4 * 400);
  small_values(fdp, ints);
  const std::int64_t n = extent(fdp, 0, 8), k = extent(fdp, 0, 12), rows = extent(fdp, 0, 5), nb = extent(fdp, 0, 6);
  TensorView idx = view_in(fdp, ints, DType::kI32, {n, k});
  TensorView req = view_in(fdp, ints, DType::kI32, {n});
  TensorView table = view_in(fdp, ints, DType::kI32, {rows, nb});
  for (TensorView* v : {&idx, &req, &table}) maybe_damage(fdp, *v);
  const std::int64_t block_size = fdp.ConsumeIntegralInRange<std::int64_t>(-1, 70);
  const std::int64_t stride_rows = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegral<std::int64_t>();
  Out out(n + extent(fdp, 0, 2), k), counts(n + extent(fdp, 0, 2));
  TensorView counts_view = fdp.ConsumeBool() ? counts.view : TensorView{};
  ints.snapshot();
  (void)smla::v32_request_to_global_indices(idx, req, table, block_size, stride_rows, out.view, counts_view);
  SMLA_FUZZ_CHECK(ints.unchanged());
  SMLA_FUZZ_CHECK(out.cells.back() == -7 && counts.cells.back() == -7);
}

void mixed(FuzzedDataProvider& fdp) {
  smla::StepConfig config;
  config.window = fdp.ConsumeIntegralInRange<int>(1, 20);
  config.max_model_len = fdp.ConsumeIntegralInRange<std::int64_t>(1, 700);
  config.max_num_batched_tokens = fdp.ConsumeIntegralInRange<std::int64_t>(1, 32);
  config.index_topk = fdp.ConsumeIntegralInRange<int>(1, 16);
  config.swa_page_size = fdp.ConsumeIntegralInRange<int>(1, 70);
  config.num_speculative_tokens = fdp.ConsumeIntegralInRange<int>(0, 2);
  Arena ints(fdp, 4 * 600), flags(fdp, 64);
  small_values(fdp, ints);
  const std::int64_t reqs = extent(fdp, 0, 4);
  smla::BatchDescription batch;
  batch.query_lens = view_in(fdp, ints, DType::kI32, {reqs});
  batch.seq_lens = view_in(fdp, ints, DType::kI32, {reqs});
  batch.num_tokens = fdp.ConsumeBool() ? -1 : extent(fdp, 0, 40);
  if (fdp.ConsumeBool()) batch.token_valid = view_in(fdp, flags, DType::kU8, {extent(fdp, 0, 40)});
  batch.swa_block_table = view_in(fdp, ints, DType::kI32, {reqs, extent(fdp, 0, 12)});
  if (fdp.ConsumeBool()) batch.c4_block_table = view_in(fdp, ints, DType::kI32, {reqs, extent(fdp, 0, 6)});
  if (fdp.ConsumeBool()) batch.c128_block_table = view_in(fdp, ints, DType::kI32, {reqs, extent(fdp, 0, 6)});
  const int ratio = fdp.PickValueInArray({4, 1, 128, 3});
  const std::int64_t t = extent(fdp, 0, 40);
  TensorView topk = view_in(fdp, ints, DType::kI32, {t, extent(fdp, 0, 20)});
  for (TensorView* v : {&batch.query_lens, &batch.seq_lens, &batch.swa_block_table, &topk}) maybe_damage(fdp, *v);
  const std::int64_t width = config.window + ((extent(fdp, 0, 600) + 3) / 4) * 4;
  Out out(t + extent(fdp, 0, 2), width), lens(t + extent(fdp, 0, 2));
  ints.snapshot();
  flags.snapshot();
  (void)smla::mixed_sparse_indices(batch, config, ratio, topk, out.view, lens.view);
  SMLA_FUZZ_CHECK(ints.unchanged() && flags.unchanged());
  SMLA_FUZZ_CHECK(out.cells.back() == -7 && lens.cells.back() == -7);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  switch (fdp.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: c4a(fdp); break;
    case 1: v32(fdp); break;
    default: mixed(fdp); break;
  }
  return 0;
}
