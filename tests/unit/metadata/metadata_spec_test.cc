// Every number of spec sections 5.7 (worked example) and 8 (vLLM tests),
// reproduced with hand-computed expectations.
#include <gtest/gtest.h>

#include <vector>

#include "smla/metadata.h"
#include "tests/unit/metadata/host_batch.h"

namespace smla::testing {
namespace {

std::vector<std::int32_t> iota_row(long n, long width, long first = 0) {
  std::vector<std::int32_t> row(static_cast<std::size_t>(width), -1);
  for (long i = 0; i < n; ++i) row[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(first + i);
  return row;
}

template <class T>
std::vector<std::int32_t> slice(const std::vector<T>& v, long row, long width) {
  return {v.begin() + row * width, v.begin() + (row + 1) * width};
}

// Spec 5.7, decode token: seq_len 1000 (pos 999), W=128, K=512, SWA page 64, logical block 256.
TEST(MetadataSpec, WorkedDecodeExample) {
  StepConfig c;
  c.window = 128;
  c.index_topk = 512;
  c.max_model_len = 65536;
  HostBatch b;
  b.query_lens = {1};
  b.seq_lens = {1000};
  b.swa.resize(1, 16);
  for (long col = 0; col < 16; ++col) b.swa.at(0, col) = static_cast<std::int32_t>(100 + 3 * col);
  b.c4.resize(1, 4);  // 250 entries of 64 per page
  for (long col = 0; col < 4; ++col) b.c4.at(0, col) = static_cast<std::int32_t>(7 - col);
  b.c128.resize(1, 4);  // 7 entries of 2 per page
  for (long col = 0; col < 4; ++col) b.c128.at(0, col) = static_cast<std::int32_t>(20 + col);
  Expected<StepMetadata> m = make_step_metadata(b.desc(), c);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->counts().num_decodes, 1);
  EXPECT_EQ(m->positions[0], 999);
  // SWA: start 872, len 128; first = bt[13]*64 + 40 = 139*64 + 40, last = bt[15]*64 + 39.
  EXPECT_EQ(m->swa_lens[0], 128);
  EXPECT_EQ(m->swa_indices[0], 8936);
  EXPECT_EQ(m->swa_indices[127], 9319);
  EXPECT_EQ(m->swa_indices[23], 8936 + 23);  // position 895 (still page 13)
  EXPECT_EQ(m->swa_indices[24], 142 * 64);   // position 896 starts page 14
  EXPECT_EQ(m->swa_slot_mapping[0], 9319);
  // C128A: n = 1000 // 128 = 7 -> bt[j/2]*2 + j%2, lens 7, width roundup(512, 128) = 512.
  ASSERT_EQ(m->sizes.c128a_width, 512);
  EXPECT_EQ(m->c128a_decode_lens[0], 7);
  const std::vector<std::int32_t> c128_expect = {40, 41, 42, 43, 44, 45, 46};
  for (long j = 0; j < 512; ++j) {
    EXPECT_EQ(m->c128a_decode_indices[static_cast<std::size_t>(j)],
              j < 7 ? c128_expect[static_cast<std::size_t>(j)] : -1);
  }
  // C4A: local [0..249, -1 x 262] -> global bt[j/64]*64 + j%64, lens 250.
  std::vector<std::int32_t> local = iota_row(250, 512);
  std::vector<std::int32_t> global(512, 99), lens(1, 99);
  ASSERT_TRUE(c4a_global_topk_indices(TensorView::contiguous(local.data(), DType::kI32, {1, 512}),
                                      TensorView::contiguous(m->token_to_req.data(), DType::kI32, {1}),
                                      TensorView::contiguous(m->is_valid_token.data(), DType::kU8, {1}), b.c4.view(),
                                      64, TensorView::contiguous(global.data(), DType::kI32, {1, 512}),
                                      TensorView::contiguous(lens.data(), DType::kI32, {1}))
                  .ok());
  EXPECT_EQ(lens[0], 250);
  EXPECT_EQ(global[0], 7 * 64);
  EXPECT_EQ(global[63], 7 * 64 + 63);
  EXPECT_EQ(global[64], 6 * 64);
  EXPECT_EQ(global[249], 4 * 64 + 57);
  EXPECT_EQ(global[250], -1);
  EXPECT_EQ(global[511], -1);
  // FlashMLA decode row: 128 SWA + 250 extra candidates; the mixed layout counts both.
  std::vector<std::int32_t> mixed(128 + 512, 5), mixed_lens(1, 5);
  ASSERT_TRUE(mixed_sparse_indices(b.desc(), c, 4, TensorView::contiguous(local.data(), DType::kI32, {1, 512}),
                                   TensorView::contiguous(mixed.data(), DType::kI32, {1, 640}),
                                   TensorView::contiguous(mixed_lens.data(), DType::kI32, {1}))
                  .ok());
  EXPECT_EQ(mixed_lens[0], 128 + 250);
  EXPECT_EQ(mixed[0], 8936);
  EXPECT_EQ(mixed[128], 7 * 64);
  EXPECT_EQ(mixed[128 + 250], -1);
}

// Spec 5.7, prefill chunk: 300 cached + 200 new tokens (seq_len 500), r=4, K=512, W=128.
TEST(MetadataSpec, WorkedPrefillExample) {
  StepConfig c;
  c.window = 128;
  c.index_topk = 512;
  HostBatch b;
  b.query_lens = {200};
  b.seq_lens = {500};
  b.swa.resize(1, 8);
  for (long col = 0; col < 8; ++col) b.swa.at(0, col) = static_cast<std::int32_t>(col);
  b.c4.resize(1, 2);
  b.c4.at(0, 0) = 0;
  b.c4.at(0, 1) = 1;
  b.has_c128 = false;
  Expected<StepMetadata> m = make_step_metadata(b.desc(), c);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->counts().num_prefills, 1);
  EXPECT_EQ(m->prefill_gather_lens[0], 327);
  auto plan = prefill_chunk_plan(b.desc(), c, 4, ChunkPolicy::kFixed);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 1u);
  const PrefillChunk& ch = (*plan)[0];
  EXPECT_EQ(ch.compressed_rows, 125);  // N = 500 // 4
  EXPECT_EQ(ch.workspace_rows, 452);   // M = 125 + 327
  auto shape = chunk_prefill_workspace(c, 4, ch);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->index_width, 640);  // roundup(512 + 128, 128)
  EXPECT_EQ(shape->index_rows, 200);
  // Short-context fill: token i sees local entries 0..(pos+1)//4 - 1.
  std::vector<std::int32_t> topk(200 * 512, -1);
  for (long i = 0; i < 200; ++i) {
    const long n = (300 + i + 1) / 4;
    for (long k = 0; k < n; ++k) topk[static_cast<std::size_t>(i * 512 + k)] = static_cast<std::int32_t>(k);
  }
  std::vector<std::int32_t> out(200 * 640, 3), lens(200, 3);
  ASSERT_TRUE(combine_topk_swa_indices(b.desc(), c, 4, ch, 125, 452,
                                       TensorView::contiguous(topk.data(), DType::kI32, {200, 512}),
                                       TensorView::contiguous(out.data(), DType::kI32, {200, 640}),
                                       TensorView::contiguous(lens.data(), DType::kI32, {200}))
                  .ok());
  // Token 0 (pos 300): topk_len 75, SWA rows 125 + k, k = 0..127 (positions 173..300); lens 203.
  std::vector<std::int32_t> row0 = iota_row(75, 640);
  for (long k = 0; k < 128; ++k) row0[static_cast<std::size_t>(75 + k)] = static_cast<std::int32_t>(125 + k);
  EXPECT_EQ(lens[0], 203);
  EXPECT_EQ(slice(out, 0, 640), row0);
  // Token 199 (pos 499): topk_len 125, SWA rows 125+199 .. 125+326 (positions 372..499); lens 253.
  std::vector<std::int32_t> row199 = iota_row(125, 640);
  for (long k = 0; k < 128; ++k) row199[static_cast<std::size_t>(125 + k)] = static_cast<std::int32_t>(324 + k);
  EXPECT_EQ(lens[199], 253);
  EXPECT_EQ(slice(out, 199, 640), row199);
}

// Spec 8 (test_flashmla_sparse.py): C128A capture-stable stride, positions
// [255, 511, 383, 639] with r=128 and an active width of 4.
TEST(MetadataSpec, C128aCaptureStableRows) {
  StepConfig c;
  c.max_model_len = 1024;  // C128W = roundup(8, 128) = 128
  c.c128a_active_width = 4;
  HostBatch b;
  b.query_lens = {1, 1, 2, 2};
  b.seq_lens = {256, 512, 384, 640};
  b.token_valid = {1, 0, 1, 1, 1, 1};  // the decode token at 511 has slot -1
  b.swa.resize(4, 10);
  for (long r = 0; r < 4; ++r)
    for (long col = 0; col < 10; ++col) b.swa.at(r, col) = static_cast<std::int32_t>(10 * r + col);
  b.c128.resize(4, 3);
  for (long r = 0; r < 4; ++r)
    for (long col = 0; col < 3; ++col) b.c128.at(r, col) = static_cast<std::int32_t>(768 + 5 * r + col);
  b.has_c4 = false;
  Expected<StepMetadata> m = make_step_metadata(b.desc(), c);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->sizes.c128a_width, 128);
  ASSERT_EQ(m->counts().num_decode_tokens, 2);
  const std::vector<std::int32_t> positions = {255, 511, 382, 383, 638, 639};
  for (std::size_t t = 0; t < positions.size(); ++t) EXPECT_EQ(m->positions[t], positions[t]);
  std::vector<std::int32_t> decode0(128, -1);
  decode0[0] = 1536;
  decode0[1] = 1537;
  EXPECT_EQ(slice(m->c128a_decode_indices, 0, 128), decode0);
  EXPECT_EQ(slice(m->c128a_decode_indices, 1, 128), std::vector<std::int32_t>(128, -1));
  EXPECT_EQ(m->c128a_decode_lens, (std::vector<std::int32_t>{2, 0}));
  EXPECT_EQ(slice(m->c128a_prefill_indices, 1, 128), iota_row(3, 128));  // pos 383: [0, 1, 2, -1, ...]
  EXPECT_EQ(slice(m->c128a_prefill_indices, 3, 128), iota_row(4, 128));  // pos 639: [0, 1, 2, 3, -1, ...]
  // Compressed slot mapping: only tokens closing an entry write one (pos 255, 383, 639).
  EXPECT_EQ(m->c128_slot_mapping,
            (std::vector<std::int64_t>{1537, -1, -1, (768 + 11) * 2 + 0, -1, (768 + 17) * 2 + 0}));
}

// Spec 3.6 / 8: 5 prefills of seq 80..144, query 4, W=64, r=4 -> one chunk (0, 5, 36, 103).
TEST(MetadataSpec, AdaptiveChunkPlan) {
  StepConfig c;
  c.window = 64;
  c.max_model_len = 4096;
  c.max_num_batched_tokens = 2048;
  HostBatch b;
  b.query_lens = {4, 4, 4, 4, 4};
  b.seq_lens = {80, 96, 112, 128, 144};
  b.swa.resize(5, 3);
  b.c4.resize(5, 1);
  for (long r = 0; r < 5; ++r) {
    for (long col = 0; col < 3; ++col) b.swa.at(r, col) = static_cast<std::int32_t>(3 * r + col);
    b.c4.at(r, 0) = static_cast<std::int32_t>(r);
  }
  b.has_c128 = false;
  auto plan = prefill_chunk_plan(b.desc(), c, 4, ChunkPolicy::kAdaptive);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].req_begin, 0);
  EXPECT_EQ((*plan)[0].req_end, 5);
  EXPECT_EQ((*plan)[0].compressed_rows, 36);
  EXPECT_EQ((*plan)[0].workspace_rows, 103);
  EXPECT_EQ((*plan)[0].token_end, 20);
  auto fixed = prefill_chunk_plan(b.desc(), c, 4, ChunkPolicy::kFixed);
  ASSERT_TRUE(fixed.ok());
  ASSERT_EQ(fixed->size(), 2u);
  EXPECT_EQ((*fixed)[0].req_end, 4);
  EXPECT_EQ((*fixed)[0].workspace_rows, 32 + 67);  // seq 128: 32 entries; gather 4 + 63
  EXPECT_EQ((*fixed)[1].req_begin, 4);
  EXPECT_EQ((*fixed)[1].token_begin, 16);
}

// Spec 5.5: max_model_len 16384, max_num_batched_tokens 8192, r=4, W=128, K=2048
// -> kv (4, 12415, 512) bf16, indices (8192, 2176) i32, lens (8192,).
TEST(MetadataSpec, StaticWorkspaceShapes) {
  StepConfig c;
  c.max_model_len = 16384;
  c.max_num_batched_tokens = 8192;
  c.window = 128;
  c.index_topk = 2048;
  auto s = static_prefill_workspace(c, 4);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->chunk_reqs, 4);
  EXPECT_EQ(s->rows, 12415);
  EXPECT_EQ(s->head_dim, 512);
  EXPECT_EQ(s->index_rows, 8192);
  EXPECT_EQ(s->index_width, 2176);
  auto swa_only = static_prefill_workspace(c, 1);
  ASSERT_TRUE(swa_only.ok());
  EXPECT_EQ(swa_only->rows, 127 + 8192);
  EXPECT_EQ(swa_only->index_width, 128);
  auto c128 = static_prefill_workspace(c, 128);
  ASSERT_TRUE(c128.ok());
  EXPECT_EQ(c128->compressed_rows, 128);
  EXPECT_EQ(c128->index_width, 256);  // roundup(128 + 128, 128)
}

// Spec 4.2 / 8 (test_compute_global_topk_bounds.py): [128, 64] with 2 columns of
// 64 -> [11*64, -1], lens 1; a bad request gives an empty row.
TEST(MetadataSpec, GlobalTopkBoundsAndCompaction) {
  HostTable table;
  table.resize(1, 2, 0);
  table.at(0, 0) = 10;
  table.at(0, 1) = 11;
  std::vector<std::int32_t> local = {128, 64, 5, 1};
  std::vector<std::int32_t> req = {0, 3};
  std::vector<std::int32_t> out(4, 9), lens(2, 9);
  ASSERT_TRUE(c4a_global_topk_indices(TensorView::contiguous(local.data(), DType::kI32, {2, 2}),
                                      TensorView::contiguous(req.data(), DType::kI32, {2}), TensorView{}, table.view(),
                                      64, TensorView::contiguous(out.data(), DType::kI32, {2, 2}),
                                      TensorView::contiguous(lens.data(), DType::kI32, {2}))
                  .ok());
  EXPECT_EQ(out, (std::vector<std::int32_t>{704, -1, -1, -1}));
  EXPECT_EQ(lens, (std::vector<std::int32_t>{1, 0}));
}

// Spec 3.1 / 8 (test_deepseek_v4_sparse_swa.py): threshold = 1 + speculative tokens.
TEST(MetadataSpec, DecodeThresholdWithMtp) {
  StepConfig c;
  c.num_speculative_tokens = 2;
  EXPECT_EQ(c.decode_threshold(), 3);
  HostBatch b;
  b.query_lens = {3, 1, 2, 4};
  b.seq_lens = {10, 20, 30, 40};
  b.swa.resize(4, 1);
  for (long r = 0; r < 4; ++r) b.swa.at(r, 0) = static_cast<std::int32_t>(r);
  b.has_c4 = b.has_c128 = false;
  auto counts = describe_step(b.desc(), c);
  ASSERT_TRUE(counts.ok()) << counts.status().to_string();
  EXPECT_EQ(counts->num_decodes, 3);
  EXPECT_EQ(counts->num_decode_tokens, 6);
  EXPECT_EQ(counts->num_prefill_tokens, 4);
  EXPECT_EQ(counts->max_decode_query_len, 3);
}

TEST(MetadataSpec, LayerTypes) {
  EXPECT_EQ(*layer_type_for_ratio(1), LayerType::kSwaOnly);
  EXPECT_EQ(*layer_type_for_ratio(4), LayerType::kC4A);
  EXPECT_EQ(*layer_type_for_ratio(128), LayerType::kC128A);
  for (int bad : {0, 2, 8, 64, -4}) {
    auto t = layer_type_for_ratio(bad);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("compress_ratio"), std::string::npos);
  }
  StepConfig c;
  EXPECT_EQ(compressed_block_size(c, 4), 64);
  EXPECT_EQ(compressed_block_size(c, 128), 2);
}

// Spec 4.7: V3.2 request-local tokens to global slots with 64-token pages.
TEST(MetadataSpec, V32Conversion) {
  HostTable table;
  table.resize(2, 3, 1);
  const std::int32_t ids[2][3] = {{4, 9, -1}, {2, 0, 7}};
  for (long r = 0; r < 2; ++r)
    for (long col = 0; col < 3; ++col) table.at(r, col) = ids[r][col];
  std::vector<std::int32_t> tok = {0, 70, 130, -1, 200, 63, 64, 191};
  std::vector<std::int32_t> req = {0, 1};
  std::vector<std::int32_t> out(8, 9), counts(2, 9);
  ASSERT_TRUE(v32_request_to_global_indices(TensorView::contiguous(tok.data(), DType::kI32, {2, 4}),
                                            TensorView::contiguous(req.data(), DType::kI32, {2}), table.view(), 64, 0,
                                            TensorView::contiguous(out.data(), DType::kI32, {2, 4}),
                                            TensorView::contiguous(counts.data(), DType::kI32, {2}))
                  .ok());
  // req 0: 0 -> 4*64; 70 -> 9*64+6; 130 -> block -1 -> -1; -1 -> -1.
  // req 1: 200 -> column 3 >= 3 -> -1; 63 -> 2*64+63; 64 -> 0; 191 -> 7*64+63.
  EXPECT_EQ(out, (std::vector<std::int32_t>{256, 582, -1, -1, -1, 191, 0, 511}));
  EXPECT_EQ(counts, (std::vector<std::int32_t>{2, 3}));
  // Padded block stride (rows per block 80): the slot uses the stride, the column uses 64.
  ASSERT_TRUE(v32_request_to_global_indices(TensorView::contiguous(tok.data(), DType::kI32, {2, 4}),
                                            TensorView::contiguous(req.data(), DType::kI32, {2}), table.view(), 64, 80,
                                            TensorView::contiguous(out.data(), DType::kI32, {2, 4}), TensorView{})
                  .ok());
  EXPECT_EQ(out, (std::vector<std::int32_t>{320, 726, -1, -1, -1, 223, 0, 623}));
}

}  // namespace
}  // namespace smla::testing
