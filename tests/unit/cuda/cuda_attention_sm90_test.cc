// The Hopper (sm_90a, wgmma) attention kernel against the float64 reference:
// long key lists (many 64-key tiles, so both K buffers and every barrier are
// reused), tile-boundary lengths, splits, padded head rows, every row format,
// both prefill sources. Each case runs on every cuda implementation in the
// registry that runs on this device (attention_expect.h): cuda.sm90 with and
// with CTA pairs forced and without them for h_q 65..128, and cuda.portable, so all stay checked on
// an H100. On other devices only the portable kernel runs (a note says so).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/cuda/attention_plan.h"
#include "tests/common/test_common.h"
#include "tests/unit/cuda/attention_expect.h"

namespace smla {
namespace {

using cudatest::expect_decode_matches;
using cudatest::expect_prefill_matches;
using cudatest::KernelChoice;

testkit::DecodeCaseOptions long_v4_case() {
  testkit::DecodeCaseOptions o;
  o.num_requests = 2;
  o.s_q = 2;
  o.num_heads = 64;
  o.main_topk = 128;
  o.main_page_size = 256;
  o.main_context = 600;
  o.extra_topk = 1024;  // 18 tiles of 64 keys per token
  o.extra_page_size = 64;
  o.extra_context = 2000;
  return o;
}

TEST(CudaSm90Attention, LongKeyListsH64AndH128) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = long_v4_case();
  expect_decode_matches(o, "h64");
  o.num_heads = 128;
  o.seed = 2;
  expect_decode_matches(o, "h128");
}

TEST(CudaSm90Attention, LengthsInvalidIndicesOddPagesPaddedRows) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t heads : {33, 64, 100, 128}) {
    testkit::DecodeCaseOptions o = long_v4_case();
    o.num_heads = heads;
    o.random_lengths = true;
    o.invalid_index_fraction = 0.25;
    o.main_page_size = 37;
    o.extra_page_size = 3;
    o.num_requests = 3;
    o.s_q = 3;
    o.seed = static_cast<std::uint64_t>(heads);
    expect_decode_matches(o, "heads " + std::to_string(heads));
  }
}

// More CTAs than one wave, random lengths (0 included) and invalid indices: the
// default plan runs the tokens longest first, every other choice too or not at all.
TEST(CudaSm90Attention, TokensLongestFirstPastOneWave) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t heads : {33, 128}) {
    testkit::DecodeCaseOptions o = long_v4_case();
    o.num_requests = heads == 128 ? 40 : 80;  // 160 CTAs of 64 heads (80 pairs of two) or 160 CTAs
    o.num_heads = heads;
    o.extra_topk = 192;  // 1-5 tiles a token: a short reference
    o.extra_page_size = 5;
    o.random_lengths = true;
    o.invalid_index_fraction = 0.1;
    o.seed = static_cast<std::uint64_t>(40 + heads);
    expect_decode_matches(o, "heads " + std::to_string(heads));
  }
}

// Lengths on and around the 64-key tile edges and the 32-key halves of a CTA pair.
TEST(CudaSm90Attention, TileEdgeLengths) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t heads : {64, 128}) {  // 128: CTA pairs, each expanding half of a tile
    for (std::int64_t keys : {1, 31, 32, 33, 63, 64, 65, 127, 128, 129}) {
      testkit::DecodeCaseOptions o = long_v4_case();
      o.num_heads = heads;
      o.main_topk = keys;
      o.extra_topk = 0;
      o.main_context = 300;
      o.seed = static_cast<std::uint64_t>(keys);
      expect_decode_matches(o, "heads " + std::to_string(heads) + " keys " + std::to_string(keys));
    }
  }
  // V3.2 pairs send each producer warp's 8 rows of a tile on their own (kPeerSenderThreads):
  // lengths around those 8-key edges, inside either CTA's half and past a tile.
  for (std::int64_t keys : {1, 7, 8, 9, 40, 63, 64, 65, 100, 129}) {
    testkit::DecodeCaseOptions o = long_v4_case();
    o.format = KvFormat::kV32Fp8;
    o.num_heads = 128;
    o.main_topk = keys;
    o.main_page_size = 64;
    o.extra_topk = 0;
    o.main_context = 300;
    o.seed = static_cast<std::uint64_t>(keys) + 500;
    expect_decode_matches(o, "v3.2 heads 128 keys " + std::to_string(keys));
  }
}

// Unpaired FP8 CTAs (h_q <= 64) of 0 to 9 tiles each: enough tokens that the plan does
// not split them (h16), each with its own length, and fewer that it splits over keys
// (h64); invalid indices, odd pages, both sources, V4 and plain FP8 rows (whose other
// cases here run as CTA pairs) with their per-tensor scale.
TEST(CudaSm90Attention, UnpairedTileCountsBothFp8Formats) {
  SKIP_WITHOUT_DEVICE();
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kFp8Rows}) {
    for (std::int64_t heads : {16, 64}) {
      testkit::DecodeCaseOptions o = long_v4_case();
      o.format = format;
      o.num_heads = heads;
      o.num_requests = heads == 16 ? 100 : 12;  // 200 tokens: one CTA each; 24: split over keys
      o.extra_topk = 448;  // with the 128 window keys: up to 9 tiles
      o.main_page_size = 37;
      o.extra_page_size = 3;
      o.random_lengths = true;
      o.invalid_index_fraction = 0.2;
      o.seed = static_cast<std::uint64_t>(heads) + (format == KvFormat::kV4Fp8 ? 0 : 1000);
      expect_decode_matches(o, std::string(kv_format_name(format)) + " heads " + std::to_string(heads));
    }
  }
}

// Head blocks of 16 and 32 heads (TuningOptions::sm90_head_block_rows): head counts
// on and around both sizes and up to 128 (unpaired), split over keys (4 tokens) and not (140 tokens), in every
// FP8 format, with invalid indices, odd pages and random lengths; a block's padding
// rows are other blocks' heads or past h_q, and none of them may be written.
TEST(CudaSm90Attention, HeadBlocksOfFewerHeads) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "the sm90 kernel does not run on this device";
  for (int block_rows : {16, 32}) {
    TuningOptions tuning;
    tuning.implementation = "cuda.sm90";
    tuning.sm90_head_block_rows = block_rows;
    const std::vector<KernelChoice> choices{{"cuda.sm90, " + std::to_string(block_rows) + "-head blocks", tuning}};
    for (std::int64_t heads : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128}) {
      for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kFp8Rows}) {
        for (std::int64_t requests : {2, 70}) {  // 4 tokens: split over keys; 140: one CTA a block
          if (requests == 70 && heads % 16 != 1 && heads != 64) continue;  // unsplit: 1, 17, 33, 64 heads
          testkit::DecodeCaseOptions o = long_v4_case();
          o.format = format;
          o.num_heads = heads;
          o.num_requests = requests;
          o.extra_topk = format == KvFormat::kV32Fp8 ? 0 : 320;
          o.main_topk = format == KvFormat::kV32Fp8 ? 448 : 128;
          o.random_lengths = true;
          o.invalid_index_fraction = 0.2;
          o.main_page_size = 37;
          o.extra_page_size = 3;
          o.seed = testing::test_seed() + static_cast<std::uint64_t>(heads * 100 + block_rows + requests);
          SMLA_SEED_TRACE(o.seed);
          expect_decode_matches(o,
                                std::string(kv_format_name(format)) + " heads " + std::to_string(heads) + " requests " +
                                    std::to_string(requests),
                                0, choices);
        }
      }
    }
  }
}

// One token: its keys are split over many CTAs and merged by the combine.
TEST(CudaSm90Attention, SplitOverKeys) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions o = long_v4_case();
  o.num_requests = 1;
  o.s_q = 1;
  o.random_lengths = true;
  expect_decode_matches(o, "one token h64");
  o.num_heads = 128;
  o.strided = true;
  expect_decode_matches(o, "one token h128 strided");
}

TEST(CudaSm90Attention, EveryRowFormat) {
  SKIP_WITHOUT_DEVICE();
  testkit::DecodeCaseOptions v32;
  v32.format = KvFormat::kV32Fp8;
  v32.num_requests = 2;
  v32.num_heads = 128;
  v32.main_topk = 2048;
  v32.main_context = 3000;
  v32.extra_topk = 0;
  v32.random_lengths = true;
  v32.invalid_index_fraction = 0.1;
  expect_decode_matches(v32, "v3.2 h128 topk 2048");
  for (KvFormat format : {KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    testkit::DecodeCaseOptions o = long_v4_case();
    o.format = format;
    o.num_heads = 128;  // two head blocks: a CTA pair on the sm90 kernel
    o.random_lengths = true;
    o.strided = true;
    expect_decode_matches(o, "" + std::string(kv_format_name(format)));
  }
}

// Output rows that do not start on 16 bytes (4-byte aligned, and odd) take the
// fragment-by-fragment writes; every other case here goes through the staged output.
TEST(CudaSm90Attention, OutputRowsOff16Bytes) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t head_stride : {514, 513}) {
    testkit::DecodeCaseOptions o = long_v4_case();
    o.num_heads = 100;
    o.random_lengths = true;
    o.seed = static_cast<std::uint64_t>(head_stride);
    expect_decode_matches(o, "out head stride " + std::to_string(head_stride), head_stride);
  }
}

// Q reaches the sm90 kernel by the tensor memory accelerator where its base and
// strides are 16-byte multiples (pad 8: rows 16 bytes apart beyond d_qk, heads past
// h_q filled with zeros by the copy) and by the consumers' own loads otherwise
// (pad 1: rows off 16 bytes). The NaN padding shows any read past a row.
TEST(CudaSm90Attention, QueryRowsByTensorMapAndOff16Bytes) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t pad : {8, 1}) {
    for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8}) {
      testkit::DecodeCaseOptions o = long_v4_case();
      o.format = format;
      o.num_heads = 100;
      o.q_head_pad = pad;
      o.random_lengths = true;
      if (format == KvFormat::kV32Fp8) {
        o.extra_topk = 0;
        o.main_topk = 300;
        o.main_page_size = 64;
      }
      o.seed = static_cast<std::uint64_t>(pad);
      expect_decode_matches(o, "q head pad " + std::to_string(pad) + ", " + std::string(kv_format_name(format)));
    }
  }
}

TEST(CudaSm90Attention, FlatPrefillBothHeadDims) {
  SKIP_WITHOUT_DEVICE();
  testkit::PrefillCaseOptions o;
  o.s_q = 9;
  o.s_kv = 1500;
  o.num_heads = 128;
  o.topk = 700;
  expect_prefill_matches(o, "d512 h128");
  o.d_qk = 576;
  o.num_heads = 64;
  o.strided = true;
  expect_prefill_matches(o, "d576 h64 strided");
}

// Copied rows (bf16 caches, the flat prefill workspace) run the alternating-tiles
// scheme: the two consumer warpgroups take alternate 64-key tiles and an odd tile
// count gets one more, all invalid. Tile counts 1 to 5 and the lengths around them,
// head counts around the 64-row tile, every key invalid, and the producer's three
// ways to find a row's page (one page holding every slot, power-of-two and other page sizes).
TEST(CudaSm90Attention, AlternatingTilesEdges) {
  SKIP_WITHOUT_DEVICE();
  for (std::int64_t topk : {1, 63, 64, 65, 128, 129, 192, 193, 320}) {
    testkit::PrefillCaseOptions o;
    o.s_q = 5;
    o.s_kv = 700;  // one page of 700 rows
    o.topk = topk;
    o.d_qk = topk % 2 == 0 ? 512 : 576;
    o.seed = static_cast<std::uint64_t>(topk);
    expect_prefill_matches(o, "flat topk " + std::to_string(topk) + " d" + std::to_string(o.d_qk));
  }
  for (std::int64_t heads : {1, 63, 65, 127}) {
    testkit::PrefillCaseOptions o;
    o.s_q = 3;
    o.s_kv = 1024;
    o.num_heads = heads;
    o.topk = 200;
    o.strided = heads % 2 == 1;
    o.seed = static_cast<std::uint64_t>(heads);
    expect_prefill_matches(o, "flat heads " + std::to_string(heads));
  }
  testkit::PrefillCaseOptions none;
  none.topk = 150;
  none.invalid_fraction = 1.0;
  expect_prefill_matches(none, "flat, every index invalid");
  for (std::int64_t page_size : {37, 64}) {
    testkit::DecodeCaseOptions o = long_v4_case();
    o.format = KvFormat::kBf16Rows;
    o.num_heads = 100;
    o.main_page_size = page_size;
    o.extra_page_size = page_size == 37 ? 3 : 16;
    o.random_lengths = true;
    o.invalid_index_fraction = 0.25;
    o.seed = static_cast<std::uint64_t>(page_size);
    expect_decode_matches(o, "bf16 rows, pages of " + std::to_string(page_size));
  }
}

// The copying kernel's lazy references move only when a row's max runs 2^8 past
// them (log2 units). Logits of a standard deviation of 16 and 64 (Q of that
// deviation, K and V of 1, so the outputs keep the suite's tolerances) make the
// max jump by more than that from tile to tile, in either warpgroup's tile, so the
// reference moves mid-row, in pairs where only one side's max moved and where both
// did; the item's end takes O to the true max.
TEST(CudaSm90Attention, AlternatingTilesLazyReferences) {
  SKIP_WITHOUT_DEVICE();
  for (const double logit_deviation : {16.0, 64.0}) {
    for (const int d_qk : {512, 576}) {
      testkit::PrefillCaseOptions o;
      o.s_q = 6;
      o.s_kv = 2000;
      o.num_heads = d_qk == 512 ? 128 : 64;
      o.d_qk = d_qk;
      o.topk = 900;  // 15 tiles: seven pairs and the odd count's empty tile
      o.query_scale = logit_deviation;
      o.seed = static_cast<std::uint64_t>(d_qk) + static_cast<std::uint64_t>(logit_deviation);
      expect_prefill_matches(o, "flat d" + std::to_string(d_qk) + " logits of deviation " +
                                    std::to_string(static_cast<int>(logit_deviation)));
    }
  }
}

// The kernel of copied rows on fewer CTAs than blocks: each CTA runs its blocks in
// turn, and the barriers' phases, the Q tile and the K buffers carry over from one
// to the next. Per-token lengths (so neighbouring blocks have different tile
// counts, odd and even, and some none at all), splits with empty ones, two head
// blocks in both block orders, and one to five CTAs.
TEST(CudaSm90Attention, PersistentCtasRunBlocksInTurn) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  std::vector<KernelChoice> choices;
  for (int ctas : {1, 2, 5}) choices.push_back(cudatest::sm90_on_persistent_ctas(ctas));
  KernelChoice grid_order = cudatest::sm90_on_persistent_ctas(2);
  grid_order.tuning.sm90_token_major = false;
  grid_order.label += ", grid block order";
  choices.push_back(grid_order);

  testkit::PrefillCaseOptions prefill;
  prefill.s_q = 23;
  prefill.s_kv = 900;
  prefill.num_heads = 100;
  prefill.topk = 333;  // random per-token lengths in [0, 333]: 0 to 6 tiles
  prefill.strided = true;
  expect_prefill_matches(prefill, "flat prefill, h_q 100", choices);
  prefill.d_qk = 576;
  prefill.num_heads = 64;
  prefill.seed = 2;
  expect_prefill_matches(prefill, "flat prefill, d_qk 576", choices);

  testkit::DecodeCaseOptions decode = long_v4_case();  // few tokens: the keys are split
  decode.format = KvFormat::kBf16Rows;
  decode.num_heads = 128;
  decode.random_lengths = true;
  decode.invalid_index_fraction = 0.25;
  decode.seed = 3;
  expect_decode_matches(decode, "bf16 rows, split keys", 0, choices);
}

// The rows a case attends, each counted once: (source, slot) within a token's
// length and inside its cache. Counted here from the host arguments, not by the code under test.
std::int64_t distinct_attended_rows(testkit::DecodeCase& c) {
  const SparseDecodeArgs args = c.args();
  std::set<std::pair<int, std::int32_t>> rows;
  auto add = [&](int source, const TensorView& indices, const TensorView& lengths, std::int64_t num_slots) {
    for (std::int64_t t = 0; t < indices.shape[0]; ++t) {
      std::int64_t n = indices.shape[1];
      if (lengths.present()) n = std::clamp<std::int64_t>(*lengths.ptr_at<std::int32_t>({t}), 0, n);
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int32_t slot = *indices.ptr_at<std::int32_t>({t, j});
        if (slot >= 0 && slot < num_slots) rows.insert({source, slot});
      }
    }
  };
  add(0, args.main_indices, args.main_lengths, args.main_cache.num_slots());
  if (args.extra_cache.has_value()) add(1, args.extra_indices, args.extra_lengths, args.extra_cache->num_slots());
  return static_cast<std::int64_t>(rows.size());
}

std::int64_t cache_slots(testkit::DecodeCase& c) {
  const SparseDecodeArgs args = c.args();
  return args.main_cache.num_slots() + (args.extra_cache.has_value() ? args.extra_cache->num_slots() : 0);
}

// The staging tests' cases: odd pages, a quarter of the entries invalid, random
// lengths, and (V4, two sources) strided views.
testkit::DecodeCaseOptions staging_case(KvFormat format) {
  testkit::DecodeCaseOptions o = long_v4_case();
  o.format = format;
  o.random_lengths = true;
  o.invalid_index_fraction = 0.25;
  o.main_page_size = 37;
  o.extra_page_size = 3;
  o.strided = format == KvFormat::kV4Fp8;
  return o;
}

// A prefill-like case of small caches: many tokens per request, so that the caches'
// slots are few against the call's index entries (kEntriesPerPoolRow, staged_rows.cu)
// and the staging expands the whole pool.
constexpr std::int64_t kEntriesPerPoolRow = 32;
testkit::DecodeCaseOptions whole_pool_case(KvFormat format) {
  testkit::DecodeCaseOptions o = staging_case(format);
  o.num_heads = 128;
  o.num_requests = 2;
  o.s_q = 48;
  o.main_context = 200;
  o.extra_context = 1024;
  if (format == KvFormat::kV32Fp8) {  // d_qk 576 with an extra cache too
    o.main_topk = 512;
    o.main_context = 600;
    o.extra_topk = 256;
    o.extra_context = 300;
  }
  return o;
}

// The case expect_decode_matches builds from `options` (the same seed), for counting on the host.
testkit::DecodeCase case_as_run(testkit::DecodeCaseOptions options) {
  options.seed = testing::test_seed() + options.seed;
  return testkit::make_decode_case(options);
}

KernelChoice staged_choice(std::int64_t staging_rows) {
  TuningOptions tuning;
  tuning.implementation = "cuda.sm90";
  tuning.sm90_stage_rows = TuningOptions::Switch::kOn;
  tuning.sm90_staging_rows = staging_rows;
  return {"cuda.sm90, staging buffer of " + std::to_string(staging_rows) + " rows", tuning};
}

// Staged FP8 rows at the edge of the staging buffer: a call naming one row more
// than the buffer holds, or many more (a buffer of one row: the mark pass stops at
// the second key), runs the direct kernel (the gate, decided on the device),
// one that fits runs the copying kernel over the staged rows; both match the
// reference. Two sources with odd pages, invalid and out-of-range indices, random
// lengths and strided views (V4), and V3.2's one source.
TEST(CudaSm90Attention, StagedRowsAtTheBufferEdge) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8}) {
    testkit::DecodeCaseOptions o = staging_case(format);
    o.num_heads = 100;
    o.num_requests = 3;
    if (format == KvFormat::kV32Fp8) {
      o.extra_topk = 0;
      o.main_topk = 700;
      o.main_context = 1500;
    }
    testkit::DecodeCase c = case_as_run(o);
    const std::int64_t distinct = distinct_attended_rows(c);
    ASSERT_GT(distinct, 2);
    ASSERT_GT(cache_slots(c), distinct + 1);  // the staging numbers the named rows (not the whole pool)
    {  // the plan stages, with the direct kernel behind when the buffer is short
      cudatest::DeviceDecodeArgs device(c.args());
      auto plan = plan_sparse_decode(cudatest::cuda_context(staged_choice(distinct).tuning), device.args);
      ASSERT_TRUE(testing::IsOk(plan.status()));
      EXPECT_NE(plan->describe().find("staged as bf16"), std::string::npos) << plan->describe();
      EXPECT_NE(plan->describe().find("direct kernel behind"), std::string::npos) << plan->describe();
    }
    for (std::int64_t rows : {std::int64_t{1}, distinct - 1, distinct, distinct + 1}) {
      const KernelChoice choice = staged_choice(rows);
      expect_decode_matches(o, std::string(kv_format_name(format)) + ", " + std::to_string(distinct) + " distinct rows",
                            0, {choice});
    }
  }
}

// Caches with no more slots than the staging buffer has rows are expanded whole,
// slot for slot, and read through the call's own index lists: V4's two sources
// (odd pages, invalid indices, random lengths, strided views) and V3.2 rows (d_qk
// 576) with an extra cache too.
TEST(CudaSm90Attention, StagedWholePool) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8}) {
    testkit::DecodeCaseOptions o = whole_pool_case(format);
    testkit::DecodeCase c = case_as_run(o);
    // The buffer (T x width rows) holds every slot, and they are few against the index entries.
    ASSERT_LE(cache_slots(c) * kEntriesPerPoolRow, c.num_tokens() * (o.main_topk + o.extra_topk));
    expect_decode_matches(o, std::string(kv_format_name(format)) + ", whole pool", 0, {staged_choice(-1)});
  }
}

// A staged call captured in a CUDA graph, gated (the caches hold more slots than
// the buffer has rows), replayed after the lengths change on the device: the
// staging passes and the gate follow the new values.
TEST(CudaSm90Attention, StagedRowsGraphReplayFollowsNewLengths) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  testkit::DecodeCaseOptions o = long_v4_case();
  o.num_heads = 128;
  o.random_lengths = true;
  o.seed = testing::test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::DecodeCase c = testkit::make_decode_case(o);
  const std::int64_t distinct = distinct_attended_rows(c);
  cudatest::expect_graph_replay_follows_new_lengths(c, 1, &cudatest::halve_lengths, staged_choice(distinct).tuning);
}

// The token order prepass (forced on) is captured with the grid it precedes
// (a programmatic edge): a replay orders the tokens by the new lengths.
TEST(CudaSm90Attention, TokenOrderGraphReplayFollowsNewLengths) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  testkit::DecodeCaseOptions o = long_v4_case();
  o.num_requests = 70;  // 140 CTAs: past one wave of 132 as well
  o.extra_topk = 192;
  o.random_lengths = true;
  o.seed = testing::test_seed();
  SMLA_SEED_TRACE(o.seed);
  testkit::DecodeCase c = testkit::make_decode_case(o);
  TuningOptions tuning;
  tuning.implementation = "cuda.sm90";
  tuning.sm90_length_order = TuningOptions::Switch::kOn;
  cudatest::expect_graph_replay_follows_new_lengths(c, 1, &cudatest::halve_lengths, tuning);
}

// Each token's 64-key tiles by the host lengths (absent: the full lists).
std::vector<int> host_tile_counts(const SparseDecodeArgs& args) {
  std::vector<int> tiles;
  for (std::int64_t t = 0; t < args.q.shape[0]; ++t) {
    const auto length = [t](const TensorView& lengths, const TensorView& indices) -> std::int64_t {
      return lengths.present() ? *lengths.ptr_at<std::int32_t>({t}) : indices.shape[1];
    };
    std::int64_t keys = length(args.main_lengths, args.main_indices);
    if (args.extra_cache.has_value()) keys += length(args.extra_lengths, args.extra_indices);
    tiles.push_back(static_cast<int>((keys + 63) / 64));
  }
  return tiles;
}

// A step's token order (SparseDecodeArgs::token_order) in a caller's buffer: a call that is not
// `ready` writes a permutation of the tokens, most tiles first by the host lengths (with lengths and
// without), and every call, ready or not, gives the reference's results: reading the written order,
// a buffer of -1 or one of values past T (both run the launch order). `staged`: the plan stages the
// FP8 rows, whose copying kernel follows no order, but a later call of the step may run direct and
// read the buffer, so the call that is not ready writes it all the same.
void expect_step_token_order_written_once_then_read(bool staged) {
  TuningOptions tuning;
  tuning.implementation = "cuda.sm90";
  tuning.sm90_length_order = TuningOptions::Switch::kOn;  // ordered on a device of any SM count
  if (staged) tuning.sm90_stage_rows = TuningOptions::Switch::kOn;
  const Context context = cudatest::cuda_context(tuning);
  for (std::int64_t heads : {64, 128}) {
    for (bool lengths : {true, false}) {
      testkit::DecodeCaseOptions o = long_v4_case();
      o.num_requests = heads == 128 ? 40 : 80;  // 160 CTAs (80 pairs for h128)
      o.num_heads = heads;
      o.extra_topk = 192;
      o.extra_page_size = 5;
      o.random_lengths = lengths;
      o.invalid_index_fraction = 0.1;
      o.seed = testing::test_seed() + static_cast<std::uint64_t>(heads) + (lengths ? 0 : 7);
      SMLA_SEED_TRACE(o.seed);
      SCOPED_TRACE("heads " + std::to_string(heads) + (lengths ? ", random lengths" : ", no lengths"));
      testkit::DecodeCase c = testkit::make_decode_case(o);
      ASSERT_TRUE(testing::IsOk(sparse_decode(c.args(), Backend::kReference)));
      const std::int64_t T = c.num_tokens();  // (not c.args(): it poisons the reference's outputs)
      cudatest::DeviceBuffer order(static_cast<std::size_t>(T) * sizeof(std::int32_t));
      auto fill_order = [&](int byte) {
        ASSERT_EQ(cudaMemset(order.data(), byte, order.bytes()), cudaSuccess);
      };
      auto run = [&](bool ready, const std::string& what) {
        SCOPED_TRACE(what);
        testkit::HostTensor got_out = c.make_out();
        testkit::HostTensor got_lse = c.make_lse();
        testkit::poison(got_out.view());
        testkit::poison(got_lse.view());
        cudatest::DeviceDecodeArgs device(c.args_with_outputs(got_out.view(), got_lse.view()));
        device.args.token_order =
            TensorView::contiguous(order.data(), DType::kI32, {T}, cudatest::current_cuda_device());
        device.args.token_order_ready = ready;
        auto plan = plan_sparse_decode(context, device.args);
        ASSERT_TRUE(testing::IsOk(plan.status()));
        ASSERT_NE(plan->describe().find("tokens longest first"), std::string::npos) << plan->describe();
        ASSERT_EQ(plan->describe().find("staged as bf16") != std::string::npos, staged) << plan->describe();
        ASSERT_TRUE(testing::IsOk(sparse_decode(context, device.args)));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cudatest::copy_to_host(*device.out, got_out.view());
        cudatest::copy_to_host(*device.lse, got_lse.view());
        EXPECT_TRUE(testing::WithinTolerance(
            testkit::compare_bf16(got_out.view(), c.out().view(), cudatest::kOutTolerance), "out"));
        EXPECT_TRUE(testing::WithinTolerance(
            testkit::compare_f32(got_lse.view(), c.lse().view(), cudatest::kStatTolerance), "lse"));
      };
      fill_order(0x7F);  // values past T until a call writes it
      run(false, "written");
      std::vector<std::int32_t> written(static_cast<std::size_t>(T));
      ASSERT_EQ(cudaMemcpy(written.data(), order.data(), order.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<std::int32_t> sorted = written;
      std::sort(sorted.begin(), sorted.end());
      for (std::int64_t t = 0; t < T; ++t) ASSERT_EQ(sorted[static_cast<std::size_t>(t)], t) << "not a permutation";
      const std::vector<int> tiles = host_tile_counts(c.args_with_outputs(TensorView{}, TensorView{}));
      for (std::int64_t place = 1; place < T; ++place) {
        EXPECT_GE(tiles[static_cast<std::size_t>(written[static_cast<std::size_t>(place - 1)])],
                  tiles[static_cast<std::size_t>(written[static_cast<std::size_t>(place)])])
            << "place " << place;
      }
      run(true, "read as written");
      ASSERT_EQ(cudaMemcpy(sorted.data(), order.data(), order.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(sorted, written) << "a ready call wrote the order";
      fill_order(0xFF);
      run(true, "-1 everywhere");
      fill_order(0x7F);
      run(true, "values past T");
    }
  }
}

TEST(CudaSm90Attention, StepTokenOrderWrittenOnceThenRead) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  expect_step_token_order_written_once_then_read(false);
}

TEST(CudaSm90Attention, StagedStepTokenOrderWrittenOnceThenRead) {
  SKIP_WITHOUT_DEVICE();
  if (!cudatest::sm90_kernel_runs()) GTEST_SKIP() << "cuda.sm90 does not run on this device";
  expect_step_token_order_written_once_then_read(true);
}

// The sm90 plan of a call on a nominal H100 (132 SMs, one sm90 CTA each).
Expected<cuda::AttentionPlan> nominal_sm90_plan(cuda::LoaderKind kind, std::int64_t tokens, std::int64_t heads,
                                               std::int64_t keys, const TuningOptions& tuning = {}, bool decode = false) {
  cuda::AttentionShape shape;
  shape.kind = kind;
  shape.num_tokens = tokens;
  shape.num_heads = heads;
  shape.num_keys = keys;
  shape.decode = decode;
  return cuda::plan_attention(cuda::KernelFamily::kSm90, shape, testing::nominal_h100(), tuning,
                              cuda::Occupancy::kSharedMemoryOnly);
}

// Host-only: which plans order the tokens longest first (token_order.h): the sm90
// kernel of FP8 rows, decode grids of more than one wave of CTAs (132 on the
// nominal H100, one sm90 CTA an SM), and the order's place in the workspace.
TEST(Sm90Plan, TokenOrderPastOneWave) {
  const cuda::LoaderKind v4 = cuda::loader_kind(KvFormat::kV4Fp8);
  const cuda::LoaderKind flat = cuda::flat_bf16_loader_kind(512);
  auto plan_for = [&](cuda::LoaderKind kind, std::int64_t tokens, std::int64_t heads, std::int64_t keys, bool decode,
                      TuningOptions::Switch setting = TuningOptions::Switch::kAuto) {
    TuningOptions tuning;
    tuning.sm90_length_order = setting;
    auto plan = nominal_sm90_plan(kind, tokens, heads, keys, tuning, decode);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    return plan.ok() ? *plan : cuda::AttentionPlan{};
  };
  EXPECT_TRUE(plan_for(v4, 256, 128, 1152, true).order_tokens);   // CONFIG4 b=128: 512 CTAs
  EXPECT_TRUE(plan_for(v4, 134, 64, 1152, true).order_tokens);    // 134 unsplit CTAs: two waves
  EXPECT_FALSE(plan_for(v4, 132, 64, 1152, true).order_tokens);   // one wave exactly
  EXPECT_FALSE(plan_for(v4, 4, 64, 640, true).order_tokens);      // CONFIG1 b=2: 40 split CTAs
  EXPECT_FALSE(plan_for(v4, 4096, 64, 640, false).order_tokens);  // prefill: not a decode grid
  EXPECT_FALSE(plan_for(flat, 256, 128, 1152, true).order_tokens);  // copied rows: the copying kernel
  EXPECT_TRUE(plan_for(v4, 4, 64, 640, true, TuningOptions::Switch::kOn).order_tokens);
  EXPECT_FALSE(plan_for(flat, 4, 64, 640, true, TuningOptions::Switch::kOn).order_tokens);
  const cuda::AttentionPlan ordered = plan_for(v4, 256, 128, 1152, true);
  const cuda::AttentionPlan unordered = plan_for(v4, 256, 128, 1152, true, TuningOptions::Switch::kOff);
  EXPECT_FALSE(unordered.order_tokens);
  EXPECT_EQ(ordered.workspace_bytes - unordered.workspace_bytes, 1024u);  // 256 tokens x 4 bytes
  EXPECT_EQ(plan_for(v4, 257, 64, 640, true).workspace_bytes -
                plan_for(v4, 257, 64, 640, true, TuningOptions::Switch::kOff).workspace_bytes,
            1280u);  // 1028 bytes, rounded up to 256
  // Staging forced: the plan both stages and orders, so a staged call owes a step's buffer its order
  // (StagedStepTokenOrderWrittenOnceThenRead runs it).
  TuningOptions staged;
  staged.sm90_stage_rows = TuningOptions::Switch::kOn;
  staged.sm90_length_order = TuningOptions::Switch::kOn;
  const auto staged_plan = nominal_sm90_plan(v4, 160, 64, 320, staged, true);
  ASSERT_TRUE(staged_plan.ok()) << staged_plan.status().to_string();
  EXPECT_TRUE(staged_plan->staged != nullptr);
  EXPECT_TRUE(staged_plan->order_tokens);
}

// Host-only: the copying kernel's outputs leave by per-warp tensor stores unless
// TuningOptions::sm90_tensor_stores is off (the launch uses them where the rows are
// d 512 and the output unsplit and aligned).
TEST(Sm90Plan, TensorStoresUnlessTurnedOff) {
  const cuda::LoaderKind flat = cuda::flat_bf16_loader_kind(512);
  auto tensor_stores = [&](TuningOptions::Switch setting) {
    TuningOptions tuning;
    tuning.sm90_tensor_stores = setting;
    auto plan = nominal_sm90_plan(flat, 4096, 64, 512, tuning);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    return plan.ok() && plan->flags.tensor_stores;
  };
  EXPECT_TRUE(tensor_stores(TuningOptions::Switch::kAuto));
  EXPECT_TRUE(tensor_stores(TuningOptions::Switch::kOn));
  EXPECT_FALSE(tensor_stores(TuningOptions::Switch::kOff));
  // Their boxes: 16 rows unless 64 are asked for; other sizes are refused by name.
  auto box_rows = [&](int rows) {
    TuningOptions tuning;
    tuning.sm90_output_box_rows = rows;
    return nominal_sm90_plan(flat, 4096, 64, 512, tuning);
  };
  ASSERT_TRUE(box_rows(0).ok());
  EXPECT_EQ(box_rows(0)->flags.output_box_rows, 16);
  EXPECT_EQ(box_rows(16)->flags.output_box_rows, 16);
  EXPECT_EQ(box_rows(64)->flags.output_box_rows, 64);
  for (int rows : {-1, 8, 32, 128}) {
    EXPECT_TRUE(testing::FailsWith(box_rows(rows).status(), StatusCode::kInvalidArgument,
                                   {"TuningOptions::sm90_output_box_rows", "0, 16 or 64", std::to_string(rows)}))
        << rows;
  }
}

// Host-only: which split launches merge their partials in their clusters
// (LaunchFlags::fold_splits): FP8 rows, unpaired blocks, a cluster of the splits of a
// block of at most 16 CTAs, every cluster of the grid
// resident at once (a validating context's nominal count on 132 SMs: 7 clusters of
// 9-16 CTAs, 21 of 5, 14 of 8), at most 4 rows a CTA to merge (two warps a row), the switch not off.
// Splits and head blocks as worked out in SplitsAndL2Prefetch and HeadBlockRows below.
TEST(Sm90Plan, SplitsFoldedInClusters) {
  struct Fold {
    bool folded, chained;
    int splits, rows;
  };
  TuningOptions on;
  on.sm90_fold_splits = TuningOptions::Switch::kOn;
  auto fold_with = [&](const TuningOptions& tuning, cuda::LoaderKind kind, std::int64_t tokens, std::int64_t heads,
                       std::int64_t keys) {
    auto plan = nominal_sm90_plan(kind, tokens, heads, keys, tuning, true);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    return plan.ok() ? Fold{plan->flags.fold_splits, plan->chain_combine, plan->num_splits, plan->head_block_rows}
                     : Fold{false, false, -1, -1};
  };
  auto fold_for = [&](cuda::LoaderKind kind, std::int64_t tokens, std::int64_t heads, std::int64_t keys) {
    return fold_with(on, kind, tokens, heads, keys);
  };
  const cuda::LoaderKind v4 = cuda::loader_kind(KvFormat::kV4Fp8);
  const cuda::LoaderKind v32 = cuda::loader_kind(KvFormat::kV32Fp8);
  // SQ1-CONFIG1 b=2: 2 tokens x 2 blocks of 32 heads, 10 splits: 4 clusters of 10, 4 rows a CTA.
  const Fold sq1 = fold_for(v4, 2, 64, 640);
  EXPECT_EQ(sq1.splits, 10);
  EXPECT_EQ(sq1.rows, 32);
  EXPECT_TRUE(sq1.folded);
  EXPECT_FALSE(sq1.chained);  // no combine follows to chain
  const Fold config1 = fold_for(v4, 4, 64, 640);  // CONFIG1 b=2: 8 clusters of 10, 7 resident
  EXPECT_EQ(config1.splits, 10);
  EXPECT_FALSE(config1.folded);
  EXPECT_TRUE(config1.chained);
  EXPECT_FALSE(fold_for(v32, 4, 128, 2048).folded);  // V3.2 b=2: 8 clusters of 16
  // SB-CONFIG1 b=8: 16 tokens x one 64-head block, 5 splits: 16 clusters of 5 fit (21), but 13 rows a CTA.
  const Fold rows13 = fold_for(v4, 16, 64, 640);
  EXPECT_EQ(rows13.splits, 5);
  EXPECT_EQ(rows13.rows, 64);
  EXPECT_FALSE(rows13.folded);
  // Auto means on; off launches the combine, on the same splits.
  EXPECT_TRUE(fold_with(TuningOptions{}, v4, 2, 64, 640).folded);
  TuningOptions off;
  off.sm90_fold_splits = TuningOptions::Switch::kOff;
  const Fold launched = fold_with(off, v4, 2, 64, 640);
  EXPECT_FALSE(launched.folded);
  EXPECT_TRUE(launched.chained);
  EXPECT_EQ(launched.splits, 10);
  EXPECT_FALSE(fold_for(v4, 1, 64, 16385).folded);  // 52 splits: more than a cluster holds
  EXPECT_FALSE(fold_for(v4, 128, 64, 640).folded);  // CONFIG1 b=64: unsplit
  EXPECT_FALSE(fold_for(cuda::flat_bf16_loader_kind(512), 2, 64, 640).folded);  // copied rows: never
  // CTA pairs (forced 64-head blocks keep them) never fold: the paired kernel has no merge.
  TuningOptions paired = on;
  paired.sm90_head_block_rows = 64;
  const Fold pair8 = fold_with(paired, v4, 4, 128, 512);  // 8 tiles, 16 CTAs a block allowed: 8 splits of 1
  EXPECT_EQ(pair8.splits, 8);
  EXPECT_FALSE(pair8.folded);
  EXPECT_TRUE(pair8.chained);
  paired.sm90_pair_head_blocks = false;  // the same blocks unpaired: 8 clusters of 8 (14 resident), but 8 rows a CTA
  EXPECT_FALSE(fold_with(paired, v4, 4, 128, 512).folded);
}

// Host-only: how the sm90 plan splits a token's keys and which launches ask L2
// for their rows ahead (a nominal H100: 132 SMs, one sm90 CTA each). Expected
// values worked out by hand: at most as many splits as leave no SM idle, as few
// as give each the same number of 64-key tiles; the prefetch where each CTA
// attends at most 256 keys.
TEST(Sm90Plan, SplitsAndL2Prefetch) {
  const DeviceProperties h100 = testing::nominal_h100();
  auto plan_for = [&](cuda::LoaderKind kind, std::int64_t tokens, std::int64_t heads, std::int64_t keys,
                      TuningOptions tuning = {}) {
    auto plan = nominal_sm90_plan(kind, tokens, heads, keys, tuning);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    return plan;
  };
  auto prefetches = [&](cuda::LoaderKind kind, std::int64_t tokens, std::int64_t heads, std::int64_t keys,
                        TuningOptions tuning = {}) {
    auto plan = plan_for(kind, tokens, heads, keys, tuning);
    return plan.ok() && plan->prefetch_rows;
  };
  const cuda::LoaderKind v4 = cuda::loader_kind(KvFormat::kV4Fp8);
  const cuda::LoaderKind v32 = cuda::loader_kind(KvFormat::kV32Fp8);
  auto splits = [&](std::int64_t tokens, std::int64_t heads, std::int64_t keys) {
    auto plan = plan_for(v4, tokens, heads, keys);
    return plan.ok() ? plan->num_splits : -1;
  };
  EXPECT_EQ(splits(4, 64, 640), 10);     // CONFIG1 b=2: 10 tiles, 33 CTAs a token allowed
  EXPECT_EQ(splits(4, 128, 1152), 9);    // CONFIG2 b=2: 18 tiles, 16 allowed: 2 tiles each
  EXPECT_EQ(splits(4, 128, 2048), 16);   // V3.2 b=2: 32 tiles, 16 allowed
  EXPECT_EQ(splits(16, 32, 640), 5);     // TP-h32 b=8: 10 tiles, 8 allowed: 2 each
  EXPECT_EQ(splits(1, 64, 16385), 52);   // 257 tiles, at most 64 splits: 5 tiles each
  EXPECT_EQ(splits(128, 64, 640), 1);    // CONFIG1 b=64: the grid fills the SMs
  EXPECT_EQ(splits(4, 64, 1), 1);
  EXPECT_TRUE(prefetches(v4, 4, 64, 640));     // CONFIG1 b=2: 64 keys a CTA
  EXPECT_TRUE(prefetches(v4, 4, 128, 1152));   // CONFIG2 b=2: 128
  EXPECT_TRUE(prefetches(v32, 4, 128, 2048));  // V3.2 b=2: 128
  EXPECT_TRUE(prefetches(v4, 16, 32, 640));    // TP-h32 b=8: 128
  EXPECT_TRUE(prefetches(v4, 1, 64, 16384));   // one token, 64 splits (the most) of 256 keys: the bound
  EXPECT_FALSE(prefetches(v4, 1, 64, 16385));  // 52 splits of 5 tiles (320 keys)
  EXPECT_FALSE(prefetches(v4, 128, 64, 640));  // CONFIG1 b=64: unsplit, 640 keys a CTA
  EXPECT_FALSE(prefetches(v4, 256, 128, 1152));  // CONFIG2 b=128
  EXPECT_FALSE(prefetches(v32, 128, 128, 2048));  // V3.2 b=64
  TuningOptions on;
  on.sm90_prefetch = TuningOptions::Switch::kOn;
  TuningOptions off;
  off.sm90_prefetch = TuningOptions::Switch::kOff;
  EXPECT_TRUE(prefetches(v4, 256, 128, 1152, on));
  EXPECT_FALSE(prefetches(v4, 4, 64, 640, off));
  // The portable kernel never prefetches, whatever the switch says.
  cuda::AttentionShape portable_shape;
  portable_shape.num_tokens = 4;
  portable_shape.num_heads = 64;
  portable_shape.num_keys = 640;
  auto portable = cuda::plan_attention(cuda::KernelFamily::kPortable, portable_shape, h100, on,
                                       cuda::Occupancy::kSharedMemoryOnly);
  ASSERT_TRUE(portable.ok()) << portable.status().to_string();
  EXPECT_FALSE(portable->prefetch_rows);
}

// Host-only: the heads a 64-row tile attends (nominal H100, 132 SMs). Expected by
// hand from the rule: split launches of h_q <= 64 FP8 rows take the smallest of 16 /
// 32 whose blocks keep the split count of 64-head blocks (CONFIG1 b=2 in blocks of
// 16 heads: 16 blocks, 8 CTAs each, so its 10 tiles would be 5 splits of 2).
TEST(Sm90Plan, HeadBlockRows) {
  struct Layout {
    int rows, blocks, splits;
    bool paired;
  };
  auto layout = [&](KvFormat format, std::int64_t tokens, std::int64_t heads, std::int64_t keys,
                    TuningOptions tuning = {}) {
    auto plan = nominal_sm90_plan(cuda::loader_kind(format), tokens, heads, keys, tuning, true);
    EXPECT_TRUE(plan.ok()) << plan.status().to_string();
    if (!plan.ok()) return Layout{-1, -1, -1, false};
    return Layout{plan->head_block_rows, plan->head_blocks, plan->num_splits, plan->flags.pair_head_blocks};
  };
  auto expect = [](const Layout& got, int rows, int blocks, int splits, const std::string& what) {
    EXPECT_EQ(got.rows, rows) << what;
    EXPECT_EQ(got.blocks, blocks) << what;
    EXPECT_EQ(got.splits, splits) << what;
  };
  const KvFormat v4 = KvFormat::kV4Fp8;
  // The cost in tiles: tiles a split + 2.1 x heads a block / 64 + 2.35 x CTAs / 132 + 0.063 x splits.
  // CONFIG1 b=2 (4 tokens, 10 tiles): 64 heads: 10 splits of 1, 40 CTAs: 1 + 2.1 + 0.71 + 0.63 = 4.44;
  // 32: 10 splits of 1, 80 CTAs: 1 + 1.05 + 1.42 + 0.63 = 4.10; 16: 5 splits of 2, 80 CTAs:
  // 2 + 0.53 + 1.42 + 0.32 = 4.26.
  expect(layout(v4, 4, 64, 640), 32, 2, 10, "CONFIG1 b=2");
  expect(layout(v4, 2, 64, 640), 32, 2, 10, "SQ1-CONFIG1 b=2: 3.39 against 3.58 at 16 and 4.09 at 64");
  expect(layout(KvFormat::kFp8Rows, 1, 40, 640), 16, 3, 10, "one token, 40 heads: 3 blocks of 16");
  expect(layout(KvFormat::kV32Fp8, 1, 64, 2048), 32, 2, 32, "V3.2 h64, one token: 32 splits of 1");
  expect(layout(KvFormat::kV32Fp8, 4, 64, 2048), 32, 2, 16, "V3.2 h64 b=2: 16 splits of 2 (6.34 against 7.40 at 64)");
  expect(layout(v4, 4, 64, 1152), 32, 2, 9, "CONFIG3 b=2: 9 splits of 2 (4.90 against 5.52 at 64)");
  expect(layout(v4, 16, 32, 640), 64, 1, 5, "TP-h32 b=8: 16-head blocks would give 4 splits of 3");
  expect(layout(v4, 4, 16, 640), 64, 1, 10, "h16: one block of 16 either way, the larger size kept");
  expect(layout(v4, 6, 64, 640), 64, 1, 10, "CONFIG1 b=3: 60 CTAs of 1 tile");
  expect(layout(v4, 12, 64, 640), 32, 2, 5, "CONFIG1 b=6: 5.50 against 5.87 at 64 (10 splits of 1)");
  expect(layout(v4, 128, 64, 640), 64, 1, 1, "CONFIG1 b=64: unsplit");
  const Layout short_splits = layout(v4, 4, 128, 1152);
  expect(short_splits, 64, 2, 9, "CONFIG2 b=2: 9 splits of 2, unpaired");
  EXPECT_FALSE(short_splits.paired);
  const Layout pairs = layout(v4, 16, 128, 1152);
  expect(pairs, 64, 2, 4, "CONFIG2 b=8: 4 splits of 5 tiles, CTA pairs");
  EXPECT_TRUE(pairs.paired);
  const Layout single = layout(v4, 1, 128, 1152);
  expect(single, 16, 8, 9, "SQ1-CONFIG2 b=1: 9 splits of 2 (4.37 against 4.47 at 32, 18 splits of 1)");
  EXPECT_FALSE(single.paired);
  expect(layout(KvFormat::kV32Fp8, 1, 128, 2048), 16, 8, 16, "V3.2 h128, one token: 16 splits of 2");
  expect(layout(v4, 1, 96, 1152), 32, 3, 18, "one token, 96 heads: 3 blocks of 32");
  expect(layout(v4, 1, 256, 1152), 64, 4, 18, "256 heads: 64-head blocks");
  expect(layout(KvFormat::kBf16Rows, 4, 64, 640), 64, 1, 10, "bf16 rows: the copying kernel's blocks");
  TuningOptions staged_on;  // a gated direct grid must split as the copying kernel's 64-head blocks do
  staged_on.sm90_stage_rows = TuningOptions::Switch::kOn;
  expect(layout(v4, 4, 64, 640, staged_on), 64, 1, 10, "staging forced, CONFIG1 b=2");
  EXPECT_TRUE(layout(v4, 4, 128, 1152, staged_on).paired);
  TuningOptions forced;
  forced.sm90_head_block_rows = 16;
  expect(layout(v4, 128, 64, 640, forced), 16, 4, 1, "forced 16, unsplit");
  const Layout unpaired = layout(v4, 4, 128, 1152, forced);
  expect(unpaired, 16, 8, 4, "forced 16 on h128: 32 blocks, 4 CTAs a block");
  EXPECT_FALSE(unpaired.paired);
  forced.sm90_head_block_rows = 64;
  expect(layout(v4, 4, 64, 640, forced), 64, 1, 10, "forced 64");
  EXPECT_TRUE(layout(v4, 4, 128, 1152, forced).paired);
  // Whether FP8 rows are staged reads 64-head blocks: 16-head ones neither stage a grid nor unstage one.
  auto staged = [&](std::int64_t tokens, const TuningOptions& tuning) {
    auto plan = nominal_sm90_plan(cuda::loader_kind(v4), tokens, 64, 640, tuning, true);
    return plan.ok() && plan->staged != nullptr;
  };
  forced.sm90_head_block_rows = 16;
  EXPECT_FALSE(staged(134, {}));
  EXPECT_FALSE(staged(134, forced));  // 536 blocks of 16 heads, 134 of 64: not more than 4 waves
  EXPECT_TRUE(staged(600, {}));
  EXPECT_TRUE(staged(600, forced));
  forced.sm90_head_block_rows = 17;
  EXPECT_TRUE(testing::FailsWith(nominal_sm90_plan(cuda::loader_kind(v4), 4, 64, 640, forced).status(),
                                 StatusCode::kInvalidArgument, {"sm90_head_block_rows", "0, 16, 32 or 64", "17"}));
}

// Host-only: which shapes the sm90 kernel's 64-row tiles take (nominal H100, 132
// SMs, one sm90 CTA each). Expected by hand from the rule: every prefill and every
// head count above 16; decode of 1-16 heads within 132 tokens or with more than 16
// tokens a request.
TEST(Sm90Plan, TilesPreferredByShape) {
  const DeviceProperties h100 = testing::nominal_h100();
  auto preferred = [&](bool decode, std::int64_t tokens, std::int64_t heads, std::int64_t queries_per_request = 1) {
    cuda::AttentionShape shape;
    shape.num_tokens = tokens;
    shape.num_heads = heads;
    shape.num_keys = 640;
    shape.queries_per_request = queries_per_request;
    shape.decode = decode;
    return cuda::sm90_tiles_preferred(shape, h100);
  };
  EXPECT_TRUE(preferred(true, 4096, 64));
  EXPECT_TRUE(preferred(true, 1024, 32));  // TP-h32 b=512
  EXPECT_TRUE(preferred(true, 512, 17));
  EXPECT_TRUE(preferred(true, 132, 16));   // one wave
  EXPECT_FALSE(preferred(true, 133, 16));
  EXPECT_TRUE(preferred(true, 128, 8, 2));  // MTP-h8 s_q 2 b=64, packed on the portable kernel
  EXPECT_FALSE(preferred(true, 256, 8));    // TP-h8 b=128
  EXPECT_FALSE(preferred(true, 512, 8, 4));  // MTP-h8 s_q 4 b=128
  EXPECT_FALSE(preferred(true, 4096, 16, 16));
  EXPECT_TRUE(preferred(true, 4096, 16, 17));  // a prefill through sparse_decode
  EXPECT_TRUE(preferred(true, 1, 1));
  EXPECT_TRUE(preferred(false, 4096, 32));
  EXPECT_TRUE(preferred(false, 4096, 16));
  EXPECT_TRUE(preferred(false, 64, 8, 4));
  EXPECT_TRUE(preferred(false, 4096, 1));
}

// Host-only: how a staged plan runs a call, from its caches' slots. Expected by hand:
// the whole pool when it fits the buffer and has at most one slot per 32 index
// entries; the named rows when T x width or the slots fit the buffer; otherwise the
// direct kernel alone, or, when staging was forced or the tokens share rows
// (requests of more than 16 tokens), the named rows gated.
TEST(Sm90Plan, StagingRoute) {
  auto route = [](std::int64_t tokens, int width, std::int64_t capacity, std::int64_t slots, bool forced,
                  bool rows_shared = false) {
    cuda::StagedRowsPlan staged;
    staged.layout = cuda::staging_layout(tokens, width, 512, capacity);
    staged.gated = tokens * width > staged.layout.capacity_rows;
    staged.stage_on_overflow = forced || rows_shared;
    cuda::SparseAttentionParams direct;
    direct.num_sources = 2;
    direct.source[0].num_slots = slots / 2;
    direct.source[1].num_slots = slots - slots / 2;
    return cuda::staging_route(staged, direct);
  };
  using cuda::StagingRoute;
  EXPECT_EQ(route(4096, 640, 1000, 80000, false), StagingRoute::kDirectOnly);  // > 1000 slots, 2.6 M entries
  EXPECT_EQ(route(4096, 640, 1000, 80000, true), StagingRoute::kNamedRowsGated);
  EXPECT_EQ(route(4096, 640, 1000, 80000, false, true), StagingRoute::kNamedRowsGated);  // a prefill chunk
  EXPECT_EQ(route(4096, 640, 100000, 81920, false), StagingRoute::kWholePool);  // 81920 * 32 = 2621440 entries
  EXPECT_EQ(route(4096, 640, 100000, 81921, false), StagingRoute::kNamedRows);  // fits, too many slots to pay
  EXPECT_EQ(route(4096, 640, 100000, 200000, false), StagingRoute::kDirectOnly);
  EXPECT_EQ(route(100, 640, 100000, 200000, false), StagingRoute::kNamedRows);  // 64000 entries fit
}

}  // namespace
}  // namespace smla
