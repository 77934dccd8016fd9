// Step metadata from a batch description: a random StepConfig (mostly small
// and valid) and BatchDescription (query/seq lengths, token_valid, block
// tables as strided views over an arena), then describe_step,
// step_metadata_sizes, build_step_metadata into caller buffers with spare rows,
// the chunk plans and combine_topk_swa_indices. Checks: a Status or a result,
// inputs never written, outputs never written past their views (ASan) nor on
// error, rows past the reported sizes untouched.
#include <cstdint>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "smla/metadata.h"

namespace {

using smla::DType;
using smla::TensorView;
using smla::fuzz::Arena;
using smla::fuzz::view_in;

constexpr std::uint8_t kSentinel = 0xA5;

smla::StepConfig random_config(FuzzedDataProvider& fdp) {
  smla::StepConfig c;
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 15) {  // anything, valid or not
    c.window = fdp.ConsumeIntegral<int>();
    c.max_model_len = fdp.ConsumeIntegral<std::int64_t>();
    c.max_num_batched_tokens = fdp.ConsumeIntegral<std::int64_t>();
    c.index_topk = fdp.ConsumeIntegral<int>();
    c.num_speculative_tokens = fdp.ConsumeIntegral<int>();
    c.prefill_chunk_size = fdp.ConsumeIntegral<int>();
    c.swa_page_size = fdp.ConsumeIntegral<int>();
    c.logical_block_size = fdp.ConsumeIntegral<int>();
    c.c128a_active_width = fdp.ConsumeIntegral<int>();
    return c;
  }
  // Small and mostly valid; 0 (an invalid size) now and then. Used-up input gives the upper ends.
  c.window = 40 - fdp.ConsumeIntegralInRange<int>(0, 40);
  c.max_model_len = 1200 - fdp.ConsumeIntegralInRange<std::int64_t>(0, 1200);
  c.max_num_batched_tokens = 64 - fdp.ConsumeIntegralInRange<std::int64_t>(0, 64);
  c.index_topk = 40 - fdp.ConsumeIntegralInRange<int>(0, 40);
  c.num_speculative_tokens = fdp.ConsumeIntegralInRange<int>(0, 3);
  c.prefill_chunk_size = 4 - fdp.ConsumeIntegralInRange<int>(0, 4);
  c.swa_page_size = 70 - fdp.ConsumeIntegralInRange<int>(0, 70);
  c.logical_block_size = 128 * (3 - fdp.ConsumeIntegralInRange<int>(0, 3)) + (fdp.ConsumeBool() ? 1 : 0);
  c.c128a_active_width = fdp.ConsumeIntegralInRange<int>(0, 20);
  return c;
}

// A caller buffer of `rows` x `cols` (spare rows beyond the size) filled with the sentinel.
struct Buffer {
  std::vector<std::uint8_t> bytes;
  TensorView view;
  Buffer(DType dtype, std::int64_t rows, std::int64_t cols, bool two_d) {
    const std::int64_t n = rows * (two_d ? cols : 1);
    bytes.assign(static_cast<std::size_t>(n) * smla::dtype_size(dtype) + 1, kSentinel);
    view = two_d ? TensorView::contiguous(bytes.data(), dtype, {rows, cols})
                 : TensorView::contiguous(bytes.data(), dtype, {rows});
  }
  bool untouched_from(std::int64_t row, std::int64_t cols) const {
    const std::size_t first = static_cast<std::size_t>(row * cols) * smla::dtype_size(view.dtype);
    for (std::size_t i = first; i < bytes.size(); ++i) {
      if (bytes[i] != kSentinel) return false;
    }
    return true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const smla::StepConfig config = random_config(fdp);
  const std::int64_t reqs = 6 - smla::fuzz::extent(fdp, 0, 6);
  Arena ints(fdp, 4 * 512);
  // Lengths: mostly plausible (small), sometimes any i32.
  auto* words = reinterpret_cast<std::int32_t*>(ints.data());
  if (!fdp.ConsumeBool()) {  // used-up input: plausible lengths
    for (std::size_t i = 0; i < 512; ++i) {
      words[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(words[i]) % 1100) - (words[i] % 37 == 0 ? 1 : 0);
    }
  }
  smla::BatchDescription batch;
  batch.query_lens = view_in(fdp, ints, DType::kI32, {reqs});
  batch.seq_lens = view_in(fdp, ints, DType::kI32, {reqs});
  batch.num_tokens = fdp.ConsumeBool() ? -1 : fdp.ConsumeIntegralInRange<std::int64_t>(-3, 80);
  Arena flags(fdp, 128);
  if (fdp.ConsumeBool()) batch.token_valid = view_in(fdp, flags, DType::kU8, {smla::fuzz::extent(fdp, 0, 80)});
  Arena tables(fdp, 4 * 600);
  batch.swa_block_table = view_in(fdp, tables, DType::kI32, {reqs, smla::fuzz::extent(fdp, 0, 24)});
  if (fdp.ConsumeBool()) batch.c4_block_table = view_in(fdp, tables, DType::kI32, {reqs, smla::fuzz::extent(fdp, 0, 8)});
  if (fdp.ConsumeBool()) batch.c128_block_table = view_in(fdp, tables, DType::kI32, {reqs, smla::fuzz::extent(fdp, 0, 8)});
  for (TensorView* v : {&batch.query_lens, &batch.seq_lens, &batch.token_valid, &batch.swa_block_table,
                        &batch.c4_block_table, &batch.c128_block_table}) {
    smla::fuzz::maybe_damage(fdp, *v);
  }
  ints.snapshot();
  flags.snapshot();
  tables.snapshot();

  auto counts = smla::describe_step(batch, config);
  auto sizes = smla::step_metadata_sizes(batch, config);
  SMLA_FUZZ_CHECK(counts.ok() == sizes.ok());
  if (sizes) {
    const smla::StepMetadataSizes& s = *sizes;
    const std::int64_t spare = fdp.ConsumeIntegralInRange<std::int64_t>(0, 2);
    const std::int64_t t = s.token_rows + spare;
    if (t * (s.window + s.c128a_width + 8) < (std::int64_t{1} << 20)) {
      Buffer qsl(DType::kI32, s.query_start_loc_rows + spare, 1, false), t2r(DType::kI32, t, 1, false),
          pos(DType::kI64, t, 1, false), valid(DType::kU8, t, 1, false), swa_slot(DType::kI64, t, 1, false),
          swa_idx(DType::kI32, t, s.window, true), swa_lens(DType::kI32, t, 1, false),
          gather(DType::kI32, s.prefill_request_rows + spare, 1, false), c4_slot(DType::kI64, t, 1, false),
          c128_slot(DType::kI64, t, 1, false), dec_idx(DType::kI32, s.c128a_decode_rows + spare, s.c128a_width, true),
          dec_lens(DType::kI32, s.c128a_decode_rows + spare, 1, false),
          pre_idx(DType::kI32, s.c128a_prefill_rows + spare, s.c128a_width, true);
      smla::StepMetadataBuffers out;
      out.query_start_loc = qsl.view;
      out.token_to_req = t2r.view;
      out.positions = pos.view;
      out.is_valid_token = valid.view;
      out.swa_slot_mapping = swa_slot.view;
      out.swa_indices = swa_idx.view;
      out.swa_lens = swa_lens.view;
      out.prefill_gather_lens = gather.view;
      if (s.has_c4) out.c4_slot_mapping = c4_slot.view;
      if (s.has_c128) {
        out.c128_slot_mapping = c128_slot.view;
        out.c128a_decode_indices = dec_idx.view;
        out.c128a_decode_lens = dec_lens.view;
        out.c128a_prefill_indices = pre_idx.view;
      }
      auto built = smla::build_step_metadata(batch, config, out);
      if (built) {
        SMLA_FUZZ_CHECK(qsl.untouched_from(s.query_start_loc_rows, 1));
        SMLA_FUZZ_CHECK(t2r.untouched_from(s.token_rows, 1));
        SMLA_FUZZ_CHECK(swa_idx.untouched_from(s.token_rows, s.window));
        SMLA_FUZZ_CHECK(gather.untouched_from(s.prefill_request_rows, 1));
        SMLA_FUZZ_CHECK(dec_idx.untouched_from(s.c128a_decode_rows, s.c128a_width));
        SMLA_FUZZ_CHECK(pre_idx.untouched_from(s.c128a_prefill_rows, s.c128a_width));
      } else {
        // "on error nothing is written"
        SMLA_FUZZ_CHECK(qsl.untouched_from(0, 1) && t2r.untouched_from(0, 1) && swa_idx.untouched_from(0, s.window));
      }
    }
  }
  // Chunk plans and the combined prefill indices of the first chunk.
  const int ratio = fdp.PickValueInArray({1, 4, 128, 2, 0});
  auto plan = smla::prefill_chunk_plan(batch, config, ratio,
                                       fdp.ConsumeBool() ? smla::ChunkPolicy::kFixed : smla::ChunkPolicy::kAdaptive);
  if (plan && !plan->empty()) {
    const smla::PrefillChunk& chunk = plan->front();
    auto shape = smla::chunk_prefill_workspace(config, ratio, chunk);
    if (shape && shape->index_rows * shape->index_width < (1 << 18)) {
      Arena topk(fdp, 4 * 256);
      const std::int64_t topk_cols = fdp.ConsumeIntegralInRange<std::int64_t>(0, 40);
      TensorView topk_view = ratio == 1 ? TensorView{} : view_in(fdp, topk, DType::kI32, {shape->index_rows, topk_cols});
      smla::fuzz::maybe_damage(fdp, topk_view);
      Buffer idx(DType::kI32, shape->index_rows, shape->index_width, true), lens(DType::kI32, shape->index_rows, 1, false);
      const std::int64_t n_rows = shape->compressed_rows + fdp.ConsumeIntegralInRange<std::int64_t>(-1, 2);
      const std::int64_t m_rows = shape->rows + fdp.ConsumeIntegralInRange<std::int64_t>(-1, 2);
      (void)smla::combine_topk_swa_indices(batch, config, ratio, chunk, n_rows, m_rows, topk_view, idx.view, lens.view);
    }
  }
  SMLA_FUZZ_CHECK(ints.unchanged() && flags.unchanged() && tables.unchanged());
  return 0;
}
