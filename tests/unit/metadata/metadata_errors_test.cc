// Bad inputs return a clear error and write nothing.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "smla/metadata.h"
#include "tests/unit/metadata/host_batch.h"

namespace smla::testing {
namespace {

// A small valid mixed batch: two decodes, one prefill with a long prefix.
HostBatch good_batch() {
  HostBatch b;
  b.query_lens = {1, 1, 5};
  b.seq_lens = {70, 3, 300};
  b.swa.resize(3, 5);
  b.c4.resize(3, 2);
  b.c128.resize(3, 1);
  for (long r = 0; r < 3; ++r) {
    for (long col = 0; col < 5; ++col) b.swa.at(r, col) = static_cast<std::int32_t>(5 * r + col);
    for (long col = 0; col < 2; ++col) b.c4.at(r, col) = static_cast<std::int32_t>(2 * r + col);
    b.c128.at(r, 0) = static_cast<std::int32_t>(r);
  }
  return b;
}

// Owning-style buffers filled with a poison value, to prove nothing is written on error.
struct PoisonedBuffers {
  static constexpr std::int32_t kPoison = -777;
  std::vector<std::int32_t> i32[8];
  std::vector<std::int64_t> i64[4];
  std::vector<std::uint8_t> u8;
  StepMetadataBuffers views;

  PoisonedBuffers(long reqs, long tokens, long window, long c128w) {
    for (auto& v : i32) v.assign(static_cast<std::size_t>((tokens + reqs + 1) * std::max(window, c128w)), kPoison);
    for (auto& v : i64) v.assign(static_cast<std::size_t>(tokens), kPoison);
    u8.assign(static_cast<std::size_t>(tokens), 0xAB);
    views.query_start_loc = TensorView::contiguous(i32[0].data(), DType::kI32, {reqs + 1});
    views.token_to_req = TensorView::contiguous(i32[1].data(), DType::kI32, {tokens});
    views.swa_indices = TensorView::contiguous(i32[2].data(), DType::kI32, {tokens, window});
    views.swa_lens = TensorView::contiguous(i32[3].data(), DType::kI32, {tokens});
    views.prefill_gather_lens = TensorView::contiguous(i32[4].data(), DType::kI32, {reqs});
    views.c128a_decode_indices = TensorView::contiguous(i32[5].data(), DType::kI32, {tokens, c128w});
    views.c128a_decode_lens = TensorView::contiguous(i32[6].data(), DType::kI32, {tokens});
    views.c128a_prefill_indices = TensorView::contiguous(i32[7].data(), DType::kI32, {tokens, c128w});
    views.positions = TensorView::contiguous(i64[0].data(), DType::kI64, {tokens});
    views.swa_slot_mapping = TensorView::contiguous(i64[1].data(), DType::kI64, {tokens});
    views.c4_slot_mapping = TensorView::contiguous(i64[2].data(), DType::kI64, {tokens});
    views.c128_slot_mapping = TensorView::contiguous(i64[3].data(), DType::kI64, {tokens});
    views.is_valid_token = TensorView::contiguous(u8.data(), DType::kU8, {tokens});
  }
  bool untouched() const {
    for (const auto& v : i32)
      for (auto x : v)
        if (x != kPoison) return false;
    for (const auto& v : i64)
      for (auto x : v)
        if (x != kPoison) return false;
    for (auto x : u8)
      if (x != 0xAB) return false;
    return true;
  }
};

// Builds with `mutate` applied and expects an error mentioning `needle`, with nothing written.
void expect_build_error(const std::function<void(HostBatch&, StepConfig&, BatchDescription&)>& mutate,
                        const std::string& needle, StatusCode code) {
  HostBatch b = good_batch();
  StepConfig c;
  c.max_model_len = 1024;
  c.max_num_batched_tokens = 64;
  BatchDescription d = b.desc();
  mutate(b, c, d);
  PoisonedBuffers out(8, 16, c.window, 128);
  Expected<StepCounts> r = build_step_metadata(d, c, out.views);
  ASSERT_FALSE(r.ok()) << "expected an error about " << needle;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(out.untouched()) << r.status().to_string();
}

TEST(MetadataErrors, GoodBatchBuilds) {
  HostBatch b = good_batch();
  StepConfig c;
  c.max_model_len = 1024;
  c.max_num_batched_tokens = 64;
  PoisonedBuffers out(8, 16, c.window, 128);
  Expected<StepCounts> r = build_step_metadata(b.desc(), c, out.views);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_decodes, 2);
  EXPECT_FALSE(out.untouched());
}

TEST(MetadataErrors, BlockTableTooShort) {
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.swa_block_table.shape[1] = 4; },
                     "batch.swa_block_table", StatusCode::kOutOfRange);
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.c4_block_table.shape[1] = 1; },
                     "batch.c4_block_table", StatusCode::kOutOfRange);
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.c128_block_table.shape[0] = 2; },
                     "batch.c128_block_table", StatusCode::kOutOfRange);
}

TEST(MetadataErrors, NegativeOrHugeBlockIdInWindow) {
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.swa.at(2, 4) = -1; },
                     "batch.swa_block_table[2][4]", StatusCode::kOutOfRange);
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.swa.at(0, 1) = 2000000000; },
                     "batch.swa_block_table[0][1]", StatusCode::kOutOfRange);
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.c4.at(2, 1) = -3; },
                     "batch.c4_block_table[2][1]", StatusCode::kOutOfRange);
}

TEST(MetadataErrors, FreedPagesBeforeTheWindowAreFine) {
  HostBatch b = good_batch();
  b.swa.at(2, 0) = -1;  // positions 0..63; the prefill's window starts at 295 - 127 = 168
  StepConfig c;
  auto m = make_step_metadata(b.desc(), c);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
}

TEST(MetadataErrors, BadLengths) {
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.seq_lens[2] = 4; }, "batch.seq_lens[2]",
                     StatusCode::kInvalidArgument);
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.query_lens[1] = -1; }, "batch.query_lens[1]",
                     StatusCode::kInvalidArgument);
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.seq_lens[0] = 1 << 30; }, "max_model_len",
                     StatusCode::kOutOfRange);
  expect_build_error([](HostBatch& b, StepConfig&, BatchDescription&) { b.query_lens[2] = 100, b.seq_lens[2] = 300; },
                     "max_num_batched_tokens", StatusCode::kOutOfRange);
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.num_tokens = 3; }, "batch.num_tokens",
                     StatusCode::kOutOfRange);
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.num_tokens = -5; }, "batch.num_tokens",
                     StatusCode::kOutOfRange);
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.seq_lens.shape[0] = 2; }, "batch.seq_lens",
                     StatusCode::kInvalidArgument);
  expect_build_error([](HostBatch&, StepConfig&, BatchDescription& d) { d.query_lens.dtype = DType::kI64; },
                     "batch.query_lens", StatusCode::kInvalidArgument);
}

TEST(MetadataErrors, UnorderedBatch) {
  expect_build_error(
      [](HostBatch& b, StepConfig&, BatchDescription&) {
        b.query_lens = {5, 1, 1};
        b.seq_lens = {300, 70, 3};
      },
      "decode-first", StatusCode::kInvalidArgument);
}

TEST(MetadataErrors, MismatchedWidthsAndMissingBuffers) {
  HostBatch b = good_batch();
  StepConfig c;
  {
    PoisonedBuffers out(8, 16, c.window, 128);
    out.views.swa_indices.shape[1] = c.window - 1;
    auto r = build_step_metadata(b.desc(), c, out.views);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("out.swa_indices"), std::string::npos);
    EXPECT_TRUE(out.untouched());
  }
  {
    PoisonedBuffers out(8, 16, c.window, 256);
    out.views.c128a_decode_indices.shape[1] = 256;  // c128a_width is 512 for 65536
    auto r = build_step_metadata(b.desc(), c, out.views);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("out.c128a_decode_indices"), std::string::npos);
    EXPECT_TRUE(out.untouched());
  }
  {
    PoisonedBuffers out(8, 2, c.window, 512);  // too few token rows
    auto r = build_step_metadata(b.desc(), c, out.views);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
    EXPECT_TRUE(out.untouched());
  }
  {
    b.has_c4 = false;
    PoisonedBuffers out(8, 16, c.window, 512);  // c4_slot_mapping given without a ratio-4 table
    auto r = build_step_metadata(b.desc(), c, out.views);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("out.c4_slot_mapping"), std::string::npos);
    EXPECT_TRUE(out.untouched());
  }
}

TEST(MetadataErrors, BadConfig) {
  HostBatch b = good_batch();
  auto check = [&](const std::function<void(StepConfig&)>& mutate, const std::string& needle) {
    StepConfig c;
    mutate(c);
    auto m = make_step_metadata(b.desc(), c);
    ASSERT_FALSE(m.ok()) << needle;
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().to_string();
  };
  check([](StepConfig& c) { c.window = 0; }, "config.window");
  check([](StepConfig& c) { c.logical_block_size = 200; }, "config.logical_block_size");
  check([](StepConfig& c) { c.swa_page_size = -64; }, "config.swa_page_size");
  check([](StepConfig& c) { c.max_model_len = 0; }, "config.max_model_len");
  check([](StepConfig& c) { c.num_speculative_tokens = -1; }, "config.num_speculative_tokens");
  check([](StepConfig& c) { c.c128a_active_width = 100000; }, "config.c128a_active_width");
}

TEST(MetadataErrors, TransformsRejectBadShapes) {
  HostBatch b = good_batch();
  StepConfig c;
  auto plan = prefill_chunk_plan(b.desc(), c, 4, ChunkPolicy::kFixed);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 1u);
  const PrefillChunk ch = (*plan)[0];
  std::vector<std::int32_t> topk(5 * 512, 0), out(5 * 640, 42), lens(5, 42);
  auto topk_view = TensorView::contiguous(topk.data(), DType::kI32, {5, 512});
  auto out_view = TensorView::contiguous(out.data(), DType::kI32, {5, 640});
  auto lens_view = TensorView::contiguous(lens.data(), DType::kI32, {5});
  auto untouched = [&] {
    for (auto x : out)
      if (x != 42) return false;
    for (auto x : lens)
      if (x != 42) return false;
    return true;
  };
  // Wrong ratio, too-small workspace, wrong top-k width, wrong output width, chunk not matching the batch.
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 3, ch, ch.compressed_rows, ch.workspace_rows, topk_view, out_view,
                                        lens_view)
                   .ok());
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 4, ch, ch.compressed_rows, ch.workspace_rows - 1, topk_view,
                                        out_view, lens_view)
                   .ok());
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 4, ch, ch.compressed_rows - 1, ch.workspace_rows, topk_view,
                                        out_view, lens_view)
                   .ok());
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 4, ch, ch.compressed_rows, std::int64_t{1} << 62, topk_view,
                                        out_view, lens_view)
                   .ok());  // absurd workspace: indices would overflow i32
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 4, ch, std::int64_t{1} << 62, std::int64_t{1} << 62, topk_view,
                                        out_view, lens_view)
                   .ok());
  auto narrow = TensorView::contiguous(topk.data(), DType::kI32, {5, 256});
  Status st =
      combine_topk_swa_indices(b.desc(), c, 4, ch, ch.compressed_rows, ch.workspace_rows, narrow, out_view, lens_view);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("topk"), std::string::npos);
  auto wide = TensorView::contiguous(out.data(), DType::kI32, {4, 768});
  EXPECT_FALSE(
      combine_topk_swa_indices(b.desc(), c, 4, ch, ch.compressed_rows, ch.workspace_rows, topk_view, wide, lens_view)
          .ok());
  PrefillChunk shifted = ch;
  shifted.token_begin += 1;
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 4, shifted, ch.compressed_rows, ch.workspace_rows, topk_view,
                                        out_view, lens_view)
                   .ok());
  PrefillChunk decodes = ch;
  decodes.req_begin = 0;
  EXPECT_FALSE(combine_topk_swa_indices(b.desc(), c, 4, decodes, ch.compressed_rows, ch.workspace_rows, topk_view,
                                        out_view, lens_view)
                   .ok());
  EXPECT_TRUE(untouched());
  // Mixed layout: width must be W + roundup4(K); C4A needs its table and top-k.
  b.has_c4 = false;
  std::vector<std::int32_t> mixed(7 * 640, 42), mixed_lens(7, 42);
  st = mixed_sparse_indices(b.desc(), c, 4, TensorView::contiguous(topk.data(), DType::kI32, {5, 512}),
                            TensorView::contiguous(mixed.data(), DType::kI32, {7, 640}),
                            TensorView::contiguous(mixed_lens.data(), DType::kI32, {7}));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("c4_block_table"), std::string::npos);
  b.has_c4 = true;
  st = mixed_sparse_indices(b.desc(), c, 128, TensorView{}, TensorView::contiguous(mixed.data(), DType::kI32, {7, 600}),
                            TensorView::contiguous(mixed_lens.data(), DType::kI32, {7}));
  ASSERT_FALSE(st.ok());  // C128A width is W + c128a_width = 128 + 512
  EXPECT_NE(st.message().find("out_indices"), std::string::npos);
  for (auto x : mixed) ASSERT_EQ(x, 42);
  // Conversions: mismatched out width, i64 indices.
  std::vector<std::int32_t> local(4, 0), req(2, 0), gout(4, 42), glens(2, 42);
  st = c4a_global_topk_indices(TensorView::contiguous(local.data(), DType::kI32, {2, 2}),
                               TensorView::contiguous(req.data(), DType::kI32, {2}), TensorView{}, b.c4.view(), 64,
                               TensorView::contiguous(gout.data(), DType::kI32, {1, 4}),
                               TensorView::contiguous(glens.data(), DType::kI32, {2}));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("global_out"), std::string::npos);
  st = v32_request_to_global_indices(TensorView::contiguous(local.data(), DType::kI64, {2, 1}),
                                     TensorView::contiguous(req.data(), DType::kI32, {2}), b.swa.view(), 64, 0,
                                     TensorView::contiguous(gout.data(), DType::kI32, {2, 1}), TensorView{});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("req_indices"), std::string::npos);
  st = v32_request_to_global_indices(TensorView::contiguous(local.data(), DType::kI32, {2, 2}),
                                     TensorView::contiguous(req.data(), DType::kI32, {2}), b.swa.view(), 0, 0,
                                     TensorView::contiguous(gout.data(), DType::kI32, {2, 2}), TensorView{});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("block_size"), std::string::npos);
  for (auto x : gout) ASSERT_EQ(x, 42);
}

// Absurd indices in the conversions are dropped, never dereferenced.
TEST(MetadataErrors, AbsurdIndicesBecomeInvalid) {
  HostTable table;
  table.resize(1, 2, 0);
  table.at(0, 0) = 2000000000;  // slot would overflow i32
  table.at(0, 1) = 3;
  std::vector<std::int32_t> local = {5, 2147483647, -2147483647 - 1, 70};
  std::vector<std::int32_t> req = {0};
  std::vector<std::int32_t> out(4, 9), lens(1, 9);
  ASSERT_TRUE(c4a_global_topk_indices(TensorView::contiguous(local.data(), DType::kI32, {1, 4}),
                                      TensorView::contiguous(req.data(), DType::kI32, {1}), TensorView{}, table.view(),
                                      64, TensorView::contiguous(out.data(), DType::kI32, {1, 4}),
                                      TensorView::contiguous(lens.data(), DType::kI32, {1}))
                  .ok());
  EXPECT_EQ(out, (std::vector<std::int32_t>{3 * 64 + 6, -1, -1, -1}));
  EXPECT_EQ(lens[0], 1);
}

}  // namespace
}  // namespace smla::testing
