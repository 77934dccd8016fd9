// The CUDA layer ops of smla/cuda_layer.h (RoPE, query/KV preparation, the
// compressor, the indexer query) against the float64 reference backend on
// random cases, the cache bytes against the host codec, and the argument
// errors (device-free: those run everywhere).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "smla/codec.h"
#include "smla/compressor.h"
#include "smla/layer.h"
#include "tests/unit/cuda/cuda_context.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/rope.h"
#include "src/runtime/layer/cache_rows.h"
#include "src/runtime/layer/indexer_cache_rows.h"
#include "tests/common/test_common.h"
#include "testkit/cuda/device_copy.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using layer_test::Buffer;
using layer_test::OwnedIndexerCache;
using layer_test::OwnedKvCache;
using testing::FailsWith;
using testing::IsOk;

#define SKIP_WITHOUT_DEVICE()                                              \
  do {                                                                     \
    if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

constexpr std::uint16_t kBf16NaN = 0x7FC0;

// Device copies of host views (same strides and bytes); results copied back on demand.
class OnDevice {
 public:
  TensorView put(const TensorView& host) {
    views_.push_back(std::make_unique<cudatest::DeviceView>(cudatest::copy_to_device(host)));
    hosts_.push_back(host);
    return views_.back()->view;
  }
  KvCacheView put(const KvCacheView& host) {
    KvCacheView device = host;
    device.pages = put(host.pages);
    return device;
  }
  IndexerCacheView put(const IndexerCacheView& host) {
    IndexerCacheView device = host;
    device.pages = put(host.pages);
    return device;
  }
  // Copies the device data of `device` back over the host view it came from.
  void fetch(const TensorView& device) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (std::size_t i = 0; i < views_.size(); ++i) {
      if (views_[i]->view.data == device.data) {
        cudatest::copy_to_host(*views_[i], hosts_[i]);
        return;
      }
    }
    FAIL() << "not a device copy";
  }

 private:
  std::vector<std::unique_ptr<cudatest::DeviceView>> views_;
  std::vector<TensorView> hosts_;
};

RopeTable make_table(RopeConfig config, std::int64_t max_positions) {
  auto table = RopeTable::create(config, max_positions);
  EXPECT_TRUE(IsOk(table.status()));
  return std::move(*table);
}

// bf16 results against the float64 reference: one bf16 ulp (plus f32 noise near 0).
::testing::AssertionResult bf16_close(std::uint16_t got, std::uint16_t want, float abs_tol = 1e-5f) {
  const float a = bf16_to_f32(got), b = bf16_to_f32(want);
  if (std::fabs(a - b) <= 8e-3f * std::fabs(b) + abs_tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << a << " want " << b;
}

// ---------------------------------------------------------------------------
// RoPE

TEST(CudaApplyRope, MatchesReferenceAndCpuBitsAtAnyOffset) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::int64_t max_positions = 5000;
  const RopeTable table = make_table(RopeConfig::compressed(), max_positions);
  const int tokens = 6, heads = 3, dim = 150, offset = 37;  // odd offset: pairs straddle words
  for (RopeDirection direction : {RopeDirection::kForward, RopeDirection::kInverse}) {
    // x is strided: one padding head per token.
    Buffer<float> storage(DType::kF32, {tokens, heads + 1, dim});
    layer_test::fill_uniform(storage.data, rng, -4.0f, 4.0f);
    const TensorView x =
        TensorView::strided(storage.data.data(), DType::kF32, {tokens, heads, dim}, {(heads + 1) * dim, dim, 1});
    Buffer<std::int32_t> pos(DType::kI32, {tokens});
    for (auto& p : pos.data) p = static_cast<std::int32_t>(rng() % max_positions);
    pos.data[2] = static_cast<std::int32_t>(max_positions);  // out of range: unrotated
    pos.data[4] = -3;                                         // negative: unrotated
    const std::vector<float> input = storage.data;

    OnDevice device;
    const TensorView dx = device.put(x);
    ASSERT_TRUE(IsOk(apply_rope(cudatest_context(nullptr), {dx, device.put(pos.view), &table, offset, direction})));
    device.fetch(dx);
    const std::vector<float> got = storage.data;

    // Reference and kCpu on the input, position 0 (the identity) where the device leaves rows alone.
    Buffer<std::int32_t> valid_pos(DType::kI32, {tokens});
    valid_pos.data = pos.data;
    valid_pos.data[2] = valid_pos.data[4] = 0;
    storage.data = input;
    ASSERT_TRUE(IsOk(apply_rope({x, valid_pos.view, &table, offset, direction}, Backend::kReference)));
    const std::vector<float> want = storage.data;
    storage.data = input;
    ASSERT_TRUE(IsOk(apply_rope({x, valid_pos.view, &table, offset, direction}, Backend::kCpu)));
    const std::vector<float> cpu = storage.data;
    int cpu_mismatches = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::int64_t t = static_cast<std::int64_t>(i) / ((heads + 1) * dim);
      if (t == 2 || t == 4 || (i / dim) % (heads + 1) == static_cast<std::size_t>(heads)) {
        ASSERT_EQ(got[i], input[i]) << "element " << i << " must be untouched";
        continue;
      }
      ASSERT_NEAR(got[i], want[i], 2e-6f * std::max(1.0f, std::fabs(want[i]))) << i;
      cpu_mismatches += got[i] != cpu[i];
    }
    // Same f32 table values and operations as kCpu: bit-identical barring a cos/sin rounding tie.
    EXPECT_EQ(cpu_mismatches, 0);
  }
}

// ---------------------------------------------------------------------------
// Query preparation

TEST(CudaPrepareQuery, MatchesReferenceWithPaddedHeadsAndStridedInput) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const RopeTable table = make_table(RopeConfig::compressed(), 3000);
  const int tokens = 5, heads = 11, padded = 16;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Buffer<float> qf(DType::kF32, {tokens, heads + 1, 512});
    layer_test::fill_uniform(qf.data, rng, -5.0f, 5.0f);
    Buffer<std::uint16_t> qb(DType::kBF16, {tokens, heads + 1, 512});
    for (std::size_t i = 0; i < qf.data.size(); ++i) qb.data[i] = f32_to_bf16(qf.data[i]);
    void* base = dtype == DType::kF32 ? static_cast<void*>(qf.data.data()) : static_cast<void*>(qb.data.data());
    const TensorView q = TensorView::strided(base, dtype, {tokens, heads, 512}, {(heads + 1) * 512, 512, 1});
    Buffer<std::int64_t> pos(DType::kI64, {tokens});
    for (auto& p : pos.data) p = static_cast<std::int64_t>(rng() % 3000);
    pos.data[1] = 1 << 20;  // out of range: normalized, unrotated
    Buffer<std::uint16_t> got(DType::kBF16, {tokens, padded, 512}, kBf16NaN);
    OnDevice device;
    const TensorView dout = device.put(got.view);
    ASSERT_TRUE(
        IsOk(prepare_query(cudatest_context(nullptr), {device.put(q), device.put(pos.view), &table, 1e-6f, dout})));
    device.fetch(dout);

    pos.data[1] = 0;
    Buffer<std::uint16_t> want(DType::kBF16, {tokens, padded, 512}, kBf16NaN);
    ASSERT_TRUE(IsOk(prepare_query({q, pos.view, &table, 1e-6f, want.view}, Backend::kReference)));
    for (std::size_t i = 0; i < got.data.size(); ++i) {
      const auto h = static_cast<int>((i / 512) % padded);
      if (h >= heads) {
        ASSERT_EQ(got.data[i], 0) << i;
      } else {
        ASSERT_TRUE(bf16_close(got.data[i], want.data[i])) << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// KV preparation

// Tokens of one KV call: in-range slots, -1, a repeated slot, an
// out-of-range slot, a negative and an out-of-range position, and rows past
// the end of slot_mapping.
constexpr int kKvTokens = 9;
constexpr int kKvInserted = 7;
constexpr std::int64_t kKvMaxPositions = 4096;

void expect_kv_matches(KvFormat format, DType input_dtype, std::uint64_t seed) {
  SCOPED_TRACE(std::string(kv_format_name(format)) + " " + std::string(dtype_name(input_dtype)));
  std::mt19937_64 rng(seed);
  const RopeTable table = make_table(RopeConfig::swa_only(), kKvMaxPositions);
  constexpr int T = kKvTokens;
  // kv rows with a padded stride of 520.
  Buffer<float> kv_f32(DType::kF32, {T, 520});
  layer_test::fill_uniform(kv_f32.data, rng, -3.0f, 3.0f);
  kv_f32.data[3 * 520 + 10] = std::numeric_limits<float>::infinity();  // saturates in its fp8 tile
  Buffer<std::uint16_t> kv_bf16(DType::kBF16, {T, 520});
  for (std::size_t i = 0; i < kv_f32.data.size(); ++i) kv_bf16.data[i] = f32_to_bf16(kv_f32.data[i]);
  void* base = input_dtype == DType::kF32 ? static_cast<void*>(kv_f32.data.data()) : kv_bf16.data.data();
  const TensorView kv = TensorView::strided(base, input_dtype, {T, 512}, {520, 1});

  OwnedKvCache cache(format, 4, 3);  // odd page size, padded pages, 0xFF canaries
  cache.view.fp8_scale = format == KvFormat::kFp8Rows ? 0.03125f : 1.0f;
  const std::int64_t slots_total = cache.view.num_slots();
  Buffer<std::int64_t> pos(DType::kI64, {T});
  for (auto& p : pos.data) p = static_cast<std::int64_t>(rng() % kKvMaxPositions);
  pos.data[5] = -4;                         // padding position: no insert
  pos.data[6] = kKvMaxPositions + 7;  // inserted unrotated
  Buffer<std::int32_t> slots(DType::kI32, {kKvInserted});
  slots.data = {10, -1, 4, static_cast<std::int32_t>(slots_total + 3), 10, 7, 0};  // 10 twice: token 4 wins
  const std::vector<std::uint8_t> initial = cache.bytes;

  Buffer<std::uint16_t> rotated_storage(DType::kBF16, {T, 600}, kBf16NaN);
  const TensorView rotated = TensorView::strided(rotated_storage.data.data(), DType::kBF16, {T, 512}, {600, 1});
  OnDevice device;
  const KvCacheView dcache = device.put(cache.view);
  const TensorView drotated = device.put(rotated);
  ASSERT_TRUE(IsOk(prepare_kv(cudatest_context(nullptr), {device.put(kv), device.put(pos.view), &table,
                                                          device.put(slots.view), dcache, drotated})));
  device.fetch(dcache.pages);
  device.fetch(drotated);

  // Rotated rows against the reference (position 0 = unrotated where the device skips the rotation).
  Buffer<std::int64_t> valid_pos(DType::kI64, {T});
  valid_pos.data = pos.data;
  valid_pos.data[5] = valid_pos.data[6] = 0;
  Buffer<std::int64_t> no_slots(DType::kI64, {T}, -1);
  OwnedKvCache scratch(format, 1, 1);
  scratch.view.fp8_scale = cache.view.fp8_scale;
  Buffer<std::uint16_t> want(DType::kBF16, {T, 512}, kBf16NaN);
  ASSERT_TRUE(
      IsOk(prepare_kv({kv, valid_pos.view, &table, no_slots.view, scratch.view, want.view}, Backend::kReference)));
  Buffer<std::uint16_t> cpu(DType::kBF16, {T, 512}, kBf16NaN);
  ASSERT_TRUE(IsOk(prepare_kv({kv, valid_pos.view, &table, no_slots.view, scratch.view, cpu.view}, Backend::kCpu)));
  int cpu_mismatches = 0;
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < 512; ++i) {
      const std::uint16_t g = rotated_storage.data[static_cast<std::size_t>(t * 600 + i)];
      const std::uint16_t w = want.data[static_cast<std::size_t>(t * 512 + i)];
      if (std::isinf(bf16_to_f32(w))) {
        ASSERT_EQ(g, w);
      } else {
        ASSERT_TRUE(bf16_close(g, w)) << "token " << t << " dim " << i;
      }
      cpu_mismatches += g != cpu.data[static_cast<std::size_t>(t * 512 + i)];
    }
    for (int i = 512; i < 600; ++i) ASSERT_EQ(rotated_storage.data[static_cast<std::size_t>(t * 600 + i)], kBf16NaN);
  }
  EXPECT_EQ(cpu_mismatches, 0) << "same f32 operations as kCpu";

  // Cache bytes: the host codec applied in token order to the device's rotated
  // rows at the slots the device must honour; every other byte keeps its canary.
  std::vector<std::uint8_t> expected = initial;
  KvCacheView expected_view = cache.view;
  expected_view.pages.data = expected.data();
  Buffer<std::uint16_t> rows(DType::kBF16, {T, 512});
  Buffer<std::int64_t> honoured(DType::kI64, {T}, -1);
  for (int t = 0; t < kKvInserted; ++t) {
    std::memcpy(rows.data.data() + t * 512, rotated_storage.data.data() + t * 600, 1024);
    const std::int64_t s = slots.data[static_cast<std::size_t>(t)];
    if (s >= 0 && s < cache.view.num_slots() && pos.data[static_cast<std::size_t>(t)] >= 0) {
      honoured.data[static_cast<std::size_t>(t)] = s;
    }
  }
  ASSERT_TRUE(IsOk(quantize_into_cache(expected_view, rows.view, honoured.view)));
  ASSERT_EQ(cache.bytes.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(cache.bytes[i], expected[i]) << "byte " << i;
}

TEST(CudaPrepareKv, CacheBytesEqualHostCodecForEveryFormat) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  expect_kv_matches(KvFormat::kV4Fp8, DType::kF32, seed);
  expect_kv_matches(KvFormat::kV4Fp8, DType::kBF16, seed + 1);
  expect_kv_matches(KvFormat::kBf16Rows, DType::kF32, seed + 2);
  expect_kv_matches(KvFormat::kFp8Rows, DType::kBF16, seed + 3);
}

// ---------------------------------------------------------------------------
// Compressor

// Paged state (permuted blocks) and destination pages (permuted) of R
// requests; each call passes one step's tokens as (request, position).
struct CompressorCase {
  int ratio, head_dim, width, max_len, requests = 2;
  std::int64_t state_bs, blocks_per_req, page_size = 3, pages_per_req;
  std::vector<float> projections;
  Buffer<float> ape, norm, state;
  Buffer<std::int32_t> state_table;
  std::vector<std::int32_t> dest_pages;
  std::optional<OwnedKvCache> kv_cache;
  std::optional<OwnedIndexerCache> index_cache;

  CompressorCase(int ratio_, std::optional<KvFormat> format, int max_len_, std::mt19937_64& rng)
      : ratio(ratio_), head_dim(format ? 512 : 128), width(compressor_state_width(ratio_, format ? 512 : 128)),
        max_len(max_len_), state_bs(compressor_state_block_size(ratio_)) {
    const int coff = compressor_coff(ratio);
    blocks_per_req = (max_len + state_bs - 1) / state_bs;
    pages_per_req = (max_len / ratio + page_size - 1) / page_size;
    projections.resize(static_cast<std::size_t>(requests * max_len * width));
    layer_test::fill_uniform(projections, rng, -2.0f, 2.0f);
    ape.reset(DType::kF32, {ratio, coff * head_dim});
    layer_test::fill_uniform(ape.data, rng, -0.5f, 0.5f);
    norm.reset(DType::kF32, {head_dim});
    layer_test::fill_uniform(norm.data, rng, 0.5f, 1.5f);
    state.reset(DType::kF32, {requests * blocks_per_req, state_bs, width}, layer_test::kNaN);
    state_table.reset(DType::kI32, {requests, blocks_per_req});
    const auto order = layer_test::permuted_pages(requests * blocks_per_req, rng);
    std::copy(order.begin(), order.end(), state_table.data.begin());
    dest_pages = layer_test::permuted_pages(requests * pages_per_req, rng);
    if (format) {
      kv_cache.emplace(*format, requests * pages_per_req, page_size);
    } else {
      index_cache.emplace(requests * pages_per_req, page_size);
    }
  }

  std::int64_t state_slot(int req, std::int64_t pos) const {
    return state_table.data[static_cast<std::size_t>(req * blocks_per_req + pos / state_bs)] * state_bs +
           pos % state_bs;
  }
  std::int64_t entry_slot(int req, std::int64_t entry) const {
    return dest_pages[static_cast<std::size_t>(req * pages_per_req + entry / page_size)] * page_size +
           entry % page_size;
  }
  std::vector<std::uint8_t>& dest_bytes() { return kv_cache ? kv_cache->bytes : index_cache->bytes; }
  TensorView dest_pages_view() const { return kv_cache ? kv_cache->view.pages : index_cache->view.pages; }

  // One step's inputs (views into owned buffers).
  struct Step {
    Buffer<float> kv_score;
    Buffer<std::int64_t> positions, state_slots, comp_slots;
    Buffer<std::int32_t> to_req;
    CompressorArgs args;
  };
  std::unique_ptr<Step> step(const std::vector<std::pair<int, std::int64_t>>& tokens, const RopeTable* rope) {
    auto s = std::make_unique<Step>();
    const auto n = static_cast<std::int64_t>(tokens.size());
    s->kv_score.reset(DType::kF32, {n, width});
    s->positions.reset(DType::kI64, {n});
    s->state_slots.reset(DType::kI64, {n});
    s->comp_slots.reset(DType::kI64, {n});
    s->to_req.reset(DType::kI32, {n});
    for (std::int64_t t = 0; t < n; ++t) {
      const auto [req, pos] = tokens[static_cast<std::size_t>(t)];
      const auto ti = static_cast<std::size_t>(t);
      std::copy_n(
          projections.data() + (static_cast<std::size_t>(req) * max_len + static_cast<std::size_t>(pos)) * width, width,
          s->kv_score.data.data() + t * width);
      s->positions.data[ti] = pos;
      s->to_req.data[ti] = req;
      s->state_slots.data[ti] = state_slot(req, pos);
      s->comp_slots.data[ti] = (pos + 1) % ratio == 0 ? entry_slot(req, pos / ratio) : -1;
    }
    CompressorArgs& a = s->args;
    a.ratio = ratio;
    a.kv_score = s->kv_score.view;
    a.ape = ape.view;
    a.norm_weight = norm.view;
    a.positions = s->positions.view;
    a.token_to_request = s->to_req.view;
    a.state_cache = state.view;
    a.state_block_table = state_table.view;
    a.state_slot_mapping = s->state_slots.view;
    a.compressed_slot_mapping = s->comp_slots.view;
    a.rope = rope;
    if (kv_cache) a.kv_cache = kv_cache->view;
    if (index_cache) a.index_cache = index_cache->view;
    return s;
  }
};

// Tokens [begin, end) of one request.
std::vector<std::pair<int, std::int64_t>> token_range(int req, std::int64_t begin, std::int64_t end) {
  std::vector<std::pair<int, std::int64_t>> tokens;
  for (std::int64_t p = begin; p < end; ++p) tokens.emplace_back(req, p);
  return tokens;
}

// The same args on the device: inputs copied, the state and destination caches shared across steps.
CompressorArgs on_device(const CompressorArgs& host, OnDevice& device, const TensorView& dstate,
                         const TensorView& ddest) {
  CompressorArgs d = host;
  d.kv_score = device.put(host.kv_score);
  d.ape = device.put(host.ape);
  d.norm_weight = device.put(host.norm_weight);
  d.positions = device.put(host.positions);
  d.token_to_request = device.put(host.token_to_request);
  d.state_cache = dstate;
  d.state_block_table = device.put(host.state_block_table);
  d.state_slot_mapping = device.put(host.state_slot_mapping);
  d.compressed_slot_mapping = device.put(host.compressed_slot_mapping);
  if (d.kv_cache) d.kv_cache->pages = ddest;
  if (d.index_cache) d.index_cache->pages = ddest;
  return d;
}

// Decoded entries of two destination caches agree within an fp8 step, and
// re-encoding the emitted slots with one fixed row makes them byte-identical
// (so nothing outside the emitted entries was written).
void expect_destinations_match(CompressorCase& got, CompressorCase& want, const std::set<std::int64_t>& emitted) {
  std::vector<float> a(static_cast<std::size_t>(got.head_dim)), b(a.size());
  for (std::int64_t slot : emitted) {
    if (got.kv_cache) {
      layer_detail::load_row_512(got.kv_cache->view, slot, a.data());
      layer_detail::load_row_512(want.kv_cache->view, slot, b.data());
    } else {
      decode_indexer_key(got.index_cache->view, slot, a.data());
      decode_indexer_key(want.index_cache->view, slot, b.data());
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_FALSE(std::isnan(a[i])) << "slot " << slot << " dim " << i;
      // A rounding flip of the f32 row costs at most one e4m3 step (1/8 of the binade).
      ASSERT_NEAR(a[i], b[i], 0.13f * std::max(0.05f, std::fabs(b[i]))) << "slot " << slot << " dim " << i;
    }
  }
  const std::vector<float> fixed(a.size(), 0.5f);
  for (CompressorCase* c : {&got, &want}) {
    for (std::int64_t slot : emitted) {
      if (c->kv_cache) {
        layer_detail::store_row_512(c->kv_cache->view, slot, fixed.data());
      } else {
        layer_detail::encode_indexer_key(c->index_cache->view, slot, fixed.data());
      }
    }
  }
  ASSERT_EQ(got.dest_bytes(), want.dest_bytes());
}

void expect_compressor_matches(int ratio, std::optional<KvFormat> format, int max_len, std::uint64_t seed) {
  SCOPED_TRACE("ratio " + std::to_string(ratio) + " " +
               (format ? std::string(kv_format_name(*format)) : std::string("indexer")));
  const RopeTable rope = make_table(RopeConfig::compressed(), 1024);
  std::mt19937_64 rng_got(seed), rng_want(seed);
  CompressorCase got(ratio, format, max_len, rng_got), want(ratio, format, max_len, rng_want);
  OnDevice device;
  const TensorView dstate = device.put(got.state.view);
  const TensorView ddest = device.put(got.dest_pages_view());
  // Step 1: a prefill chunk of both requests (interleaved); step 2: the rest, one request at a time.
  const int split = max_len / 2 + 1;
  std::vector<std::vector<std::pair<int, std::int64_t>>> steps(2);
  for (std::int64_t p = 0; p < split; ++p) {
    steps[0].emplace_back(0, p);
    steps[0].emplace_back(1, p);
  }
  for (int req : {1, 0}) {
    for (std::int64_t p = split; p < max_len; ++p) steps[1].emplace_back(req, p);
  }
  std::set<std::int64_t> emitted;
  for (const auto& tokens : steps) {
    auto host_step = want.step(tokens, &rope);
    ASSERT_TRUE(IsOk(run_compressor(host_step->args, Backend::kReference)));
    auto device_step = got.step(tokens, &rope);
    ASSERT_TRUE(IsOk(run_compressor(cudatest_context(nullptr), on_device(device_step->args, device, dstate, ddest))));
    for (const auto& [req, pos] : tokens) {
      if ((pos + 1) % ratio == 0) emitted.insert(got.entry_slot(req, pos / ratio));
    }
  }
  device.fetch(dstate);
  device.fetch(ddest);
  // Stage A is a copy and one f32 add: identical bits, NaN poison included.
  ASSERT_EQ(std::memcmp(got.state.data.data(), want.state.data.data(), got.state.data.size() * sizeof(float)), 0);
  ASSERT_FALSE(emitted.empty());
  expect_destinations_match(got, want, emitted);
}

TEST(CudaRunCompressor, MatchesReferenceForBothRatiosAndDestinations) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  expect_compressor_matches(4, KvFormat::kV4Fp8, 23, seed);
  expect_compressor_matches(4, std::nullopt, 19, seed + 1);
  expect_compressor_matches(128, KvFormat::kBf16Rows, 260, seed + 2);
  expect_compressor_matches(128, KvFormat::kFp8Rows, 140, seed + 3);
}

TEST(CudaRunCompressor, OutOfRangeValuesAreSkippedWithoutFaults) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const RopeTable rope = make_table(RopeConfig::compressed(), 64);
  CompressorCase c(4, KvFormat::kV4Fp8, 16, rng);
  auto s = c.step({{0, 3}, {0, 7}, {1, 3}, {1, 7}, {0, 11}, {1, 11}, {0, 15}, {1, 15}}, &rope);
  s->comp_slots.data[0] = c.kv_cache->view.num_slots();  // destination slot out of range
  s->to_req.data[1] = 9;                                 // request row out of range
  s->positions.data[2] = -5;                             // padding position
  s->state_slots.data[3] = 1 << 30;                      // state slot out of range (and emits)
  c.state_table.data[1] = 1 << 20;                       // token 4's window (positions 4..11) reads a bad block
  s->positions.data[5] = (1 << 20) + 3;                  // its window lies past the block table
  s->comp_slots.data[6] = -1;
  s->comp_slots.data[7] = -1;
  const std::vector<std::uint8_t> before = c.dest_bytes();
  OnDevice device;
  const TensorView dstate = device.put(c.state.view);
  const TensorView ddest = device.put(c.dest_pages_view());
  ASSERT_TRUE(IsOk(run_compressor(cudatest_context(nullptr), on_device(s->args, device, dstate, ddest))));
  device.fetch(ddest);
  EXPECT_EQ(c.dest_bytes(), before) << "no emission may land";
}

// ---------------------------------------------------------------------------
// Indexer query

TEST(CudaPrepareIndexerQuery, MatchesReferenceAndCpuBytes) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const RopeTable rope = make_table(RopeConfig::compressed(), 2048);
  const int tokens = 4, heads = 9;
  Buffer<float> q_storage(DType::kF32, {tokens, heads + 2, 128});
  layer_test::fill_uniform(q_storage.data, rng, -6.0f, 6.0f);
  for (int i = 0; i < 128; ++i) q_storage.data[static_cast<std::size_t>(2 * 128 + i)] *= 1e-6f;  // tiny: amax clamp
  const TensorView q =
      TensorView::strided(q_storage.data.data(), DType::kF32, {tokens, heads, 128}, {(heads + 2) * 128, 128, 1});
  Buffer<float> weights(DType::kF32, {tokens, heads});
  layer_test::fill_uniform(weights.data, rng, -1.0f, 1.0f);
  Buffer<std::int32_t> pos(DType::kI32, {tokens});
  for (auto& p : pos.data) p = static_cast<std::int32_t>(rng() % 2048);
  Buffer<std::uint8_t> got_q(DType::kE4M3, {tokens, heads, 128}, 0x7F);
  Buffer<float> got_w(DType::kF32, {tokens, heads}, layer_test::kNaN);
  OnDevice device;
  const TensorView dq8 = device.put(got_q.view);
  const TensorView dw = device.put(got_w.view);
  ASSERT_TRUE(IsOk(prepare_indexer_query(
      cudatest_context(nullptr), {device.put(q), device.put(weights.view), device.put(pos.view), &rope, dq8, dw})));
  device.fetch(dq8);
  device.fetch(dw);

  Buffer<std::uint8_t> ref_q(DType::kE4M3, {tokens, heads, 128}, 0x7F), cpu_q(DType::kE4M3, {tokens, heads, 128}, 0x7F);
  Buffer<float> ref_w(DType::kF32, {tokens, heads}, layer_test::kNaN),
      cpu_w(DType::kF32, {tokens, heads}, layer_test::kNaN);
  ASSERT_TRUE(
      IsOk(prepare_indexer_query({q, weights.view, pos.view, &rope, ref_q.view, ref_w.view}, Backend::kReference)));
  ASSERT_TRUE(IsOk(prepare_indexer_query({q, weights.view, pos.view, &rope, cpu_q.view, cpu_w.view}, Backend::kCpu)));
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const auto th = static_cast<std::size_t>(t * heads + h);
      ASSERT_NEAR(got_w.data[th], ref_w.data[th], 1e-6f * std::fabs(ref_w.data[th]) + 1e-30f) << t << "," << h;
      // Dequantized q (code * scale, the scale recovered from the weight ratio) within one e4m3 step.
      for (int i = 0; i < 128; ++i) {
        const std::size_t k = th * 128 + static_cast<std::size_t>(i);
        ASSERT_NEAR(e4m3_to_f32(got_q.data[k]), e4m3_to_f32(ref_q.data[k]),
                    0.13f * std::fabs(e4m3_to_f32(ref_q.data[k])) + 0.002f)
            << t << "," << h << "," << i;
      }
    }
  }
  EXPECT_EQ(got_q.data, cpu_q.data) << "same f32 operations as kCpu";
  EXPECT_EQ(std::memcmp(got_w.data.data(), cpu_w.data.data(), got_w.data.size() * sizeof(float)), 0);
}

// ---------------------------------------------------------------------------
// Streams, graphs, shapes at the edges

TEST(CudaApplyRope, RankTwoInverseUndoesForward) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const RopeTable table = make_table(RopeConfig::swa_only(), 1000);
  Buffer<float> x(DType::kF32, {7, 128});
  layer_test::fill_uniform(x.data, rng, -2.0f, 2.0f);
  const std::vector<float> input = x.data;
  Buffer<std::int64_t> pos(DType::kI64, {7});
  for (auto& p : pos.data) p = static_cast<std::int64_t>(rng() % 1000);
  OnDevice device;
  const TensorView dx = device.put(x.view), dpos = device.put(pos.view);
  ASSERT_TRUE(IsOk(apply_rope(cudatest_context(nullptr), {dx, dpos, &table, 64, RopeDirection::kForward})));
  device.fetch(dx);
  Buffer<float> want(DType::kF32, {7, 128});
  want.data = input;
  ASSERT_TRUE(IsOk(apply_rope({want.view, pos.view, &table, 64, RopeDirection::kForward}, Backend::kReference)));
  for (std::size_t i = 0; i < x.data.size(); ++i) ASSERT_NEAR(x.data[i], want.data[i], 4e-6f) << i;
  ASSERT_TRUE(IsOk(apply_rope(cudatest_context(nullptr), {dx, dpos, &table, 64, RopeDirection::kInverse})));
  device.fetch(dx);
  for (std::size_t i = 0; i < x.data.size(); ++i) ASSERT_NEAR(x.data[i], input[i], 4e-6f) << i;
}

TEST(CudaLayerPrep, EmptyBatchesAreNoOps) {
  SKIP_WITHOUT_DEVICE();
  const RopeTable table = make_table(RopeConfig::swa_only(), 16);
  Buffer<float> x(DType::kF32, {1, 1, 512});
  Buffer<std::int64_t> pos(DType::kI64, {1});
  Buffer<std::uint16_t> out(DType::kBF16, {1, 1, 512});
  OwnedKvCache cache(KvFormat::kV4Fp8, 1, 2);
  OnDevice device;
  TensorView q = device.put(x.view), dpos = device.put(pos.view), dout = device.put(out.view);
  q.shape[0] = dpos.shape[0] = dout.shape[0] = 0;
  EXPECT_TRUE(IsOk(prepare_query(cudatest_context(nullptr), {q, dpos, &table, 1e-6f, dout})));
  EXPECT_TRUE(IsOk(apply_rope(cudatest_context(nullptr), {q, dpos, &table, 448, RopeDirection::kForward})));
  TensorView kv = q;
  kv.rank = 2;
  kv.shape[1] = 512;
  kv.stride[0] = 512;
  kv.stride[1] = 1;
  EXPECT_TRUE(IsOk(prepare_kv(cudatest_context(nullptr), {kv, dpos, &table, dpos, device.put(cache.view), {}})));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Every op captured in one CUDA graph on a stream: the ops neither allocate
// nor synchronize, and a replay writes what the eager calls wrote.
TEST(CudaLayerPrep, OpsCaptureInACudaGraphOnAStream) {
  SKIP_WITHOUT_DEVICE();
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const RopeTable rope = make_table(RopeConfig::compressed(), 256);
  const int tokens = 8, heads = 3;
  Buffer<float> q(DType::kF32, {tokens, heads, 512}), kv(DType::kF32, {tokens, 512});
  layer_test::fill_uniform(q.data, rng, -2.0f, 2.0f);
  layer_test::fill_uniform(kv.data, rng, -2.0f, 2.0f);
  Buffer<std::int32_t> pos(DType::kI32, {tokens}), slots(DType::kI32, {tokens});
  for (int t = 0; t < tokens; ++t) {
    pos.data[static_cast<std::size_t>(t)] = t;
    slots.data[static_cast<std::size_t>(t)] = (t * 5) % tokens;
  }
  Buffer<std::uint16_t> q_out(DType::kBF16, {tokens, 4, 512}, kBf16NaN);
  OwnedKvCache cache(KvFormat::kV4Fp8, 3, 3);
  CompressorCase c(4, std::nullopt, tokens, rng);
  auto step = c.step(token_range(0, 0, tokens), &rope);

  OnDevice device;
  const TensorView dq = device.put(q.view), dkv = device.put(kv.view), dpos = device.put(pos.view),
                   dslots = device.put(slots.view), dq_out = device.put(q_out.view);
  const KvCacheView dcache = device.put(cache.view);
  const TensorView dstate = device.put(c.state.view), ddest = device.put(c.dest_pages_view());
  const CompressorArgs dcomp = on_device(step->args, device, dstate, ddest);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const auto enqueue = [&] {
    EXPECT_TRUE(IsOk(prepare_query(cudatest_context(stream), {dq, dpos, &rope, 1e-6f, dq_out})));
    EXPECT_TRUE(IsOk(prepare_kv(cudatest_context(stream), {dkv, dpos, &rope, dslots, dcache, {}})));
    EXPECT_TRUE(IsOk(run_compressor(cudatest_context(stream), dcomp)));
  };
  enqueue();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  device.fetch(dq_out);
  device.fetch(dcache.pages);
  device.fetch(ddest);
  const std::vector<std::uint16_t> eager_q = q_out.data;
  const std::vector<std::uint8_t> eager_cache = cache.bytes, eager_dest = c.dest_bytes();

  ASSERT_EQ(cudaMemset(dq_out.data, 0xFF, sizeof(std::uint16_t) * q_out.data.size()), cudaSuccess);
  ASSERT_EQ(cudaMemset(ddest.data, 0, testkit::storage_bytes(ddest)), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  enqueue();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  device.fetch(dq_out);
  device.fetch(dcache.pages);
  device.fetch(ddest);
  EXPECT_EQ(q_out.data, eager_q);
  EXPECT_EQ(cache.bytes, eager_cache);
  // The zeroed destination got back exactly the emitted entries (positions 3 and 7).
  const std::int64_t page_bytes = c.index_cache->view.pages.stride[0];
  for (std::int64_t entry : {0, 1}) {
    const std::int64_t slot = c.entry_slot(0, entry);
    const std::int64_t page = slot / c.page_size, e = slot % c.page_size;
    const auto* got = c.dest_bytes().data() + page * page_bytes;
    const auto* want = eager_dest.data() + page * page_bytes;
    EXPECT_EQ(std::memcmp(got + IndexerFp8Format::data_offset(e, c.page_size),
                          want + IndexerFp8Format::data_offset(e, c.page_size), IndexerFp8Format::kHeadDim), 0);
    EXPECT_EQ(std::memcmp(got + IndexerFp8Format::scale_offset(e, c.page_size),
                          want + IndexerFp8Format::scale_offset(e, c.page_size), 4), 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Timings of production-sized calls (not run by default: --gtest_also_run_disabled_tests).
TEST(CudaLayerPrepTiming, DISABLED_LargeBatches) {
  SKIP_WITHOUT_DEVICE();
  const RopeTable rope = make_table(RopeConfig::compressed(), 65536);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const auto time_us = [&](const char* what, const auto& call) {
    call();
    cudaEventRecord(start, stream);
    constexpr int kRuns = 20;
    for (int i = 0; i < kRuns; ++i) call();
    cudaEventRecord(stop, stream);
    ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    std::printf("[timing] %-48s %9.1f us\n", what, 1000.0f * ms / kRuns);
  };
  for (std::int64_t tokens : {64, 8192}) {
    const std::string label = " T=" + std::to_string(tokens);
    Buffer<std::int32_t> pos(DType::kI32, {tokens});
    Buffer<std::int64_t> slots(DType::kI64, {tokens});
    for (std::int64_t t = 0; t < tokens; ++t) {
      pos.data[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
      slots.data[static_cast<std::size_t>(t)] = t;
    }
    OnDevice device;
    const TensorView dpos = device.put(pos.view), dslots = device.put(slots.view);
    const auto zeros = [&](DType dtype, std::initializer_list<std::int64_t> shape) {
      std::int64_t n = 1;
      for (auto e : shape) n *= e;
      void* data = nullptr;
      cudatest::check_cuda(cudaMalloc(&data, static_cast<std::size_t>(n) * dtype_size(dtype)), "cudaMalloc");
      cudatest::check_cuda(cudaMemset(data, 0x3C, static_cast<std::size_t>(n) * dtype_size(dtype)), "cudaMemset");
      return TensorView::contiguous(data, dtype, shape, Device{DeviceKind::kCuda, 0});
    };
    std::vector<TensorView> owned;
    const auto keep = [&](TensorView v) {
      owned.push_back(v);
      return v;
    };
    const TensorView q = keep(zeros(DType::kBF16, {tokens, 128, 512}));
    const TensorView q_out = keep(zeros(DType::kBF16, {tokens, 128, 512}));
    time_us(("prepare_query H=128 bf16" + label).c_str(),
            [&] { EXPECT_TRUE(IsOk(prepare_query(cudatest_context(stream), {q, dpos, &rope, 1e-6f, q_out}))); });
    const TensorView kv = keep(zeros(DType::kBF16, {tokens, 512}));
    const std::int64_t pages = (tokens + 63) / 64, page_bytes = V4Fp8Format::page_bytes(64);
    KvCacheView cache;
    cache.format = KvFormat::kV4Fp8;
    cache.pages = TensorView::strided(keep(zeros(DType::kU8, {pages * page_bytes})).data, DType::kU8,
                                      {pages, 64, V4Fp8Format::kBytesPerToken},
                                      {page_bytes, V4Fp8Format::kBytesPerToken, 1}, Device{DeviceKind::kCuda, 0});
    time_us(("prepare_kv v4-fp8 bf16" + label).c_str(),
            [&] { EXPECT_TRUE(IsOk(prepare_kv(cudatest_context(stream), {kv, dpos, &rope, dslots, cache, {}}))); });
    const TensorView iq = keep(zeros(DType::kBF16, {tokens, 64, 128}));
    const TensorView iw = keep(zeros(DType::kF32, {tokens, 64}));
    const TensorView iq8 = keep(zeros(DType::kE4M3, {tokens, 64, 128}));
    const TensorView ihw = keep(zeros(DType::kF32, {tokens, 64}));
    time_us(("prepare_indexer_query Hi=64" + label).c_str(), [&] {
      EXPECT_TRUE(IsOk(prepare_indexer_query(cudatest_context(stream), {iq, iw, dpos, &rope, iq8, ihw})));
    });
    for (int ratio : {4, 128}) {
      std::mt19937_64 rng(7);
      CompressorCase c(ratio, KvFormat::kV4Fp8, static_cast<int>(tokens), rng);
      auto step = c.step(token_range(0, 0, tokens), &rope);
      const TensorView dstate = device.put(c.state.view), ddest = device.put(c.dest_pages_view());
      const CompressorArgs args = on_device(step->args, device, dstate, ddest);
      time_us(("run_compressor r=" + std::to_string(ratio) + " v4-fp8" + label).c_str(),
              [&] { EXPECT_TRUE(IsOk(run_compressor(cudatest_context(stream), args))); });
    }
    for (const TensorView& v : owned) cudaFree(v.data);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

// ---------------------------------------------------------------------------
// Argument errors: validation never touches device memory, so the views below
// carry a cuda device tag over host storage they never read (without a device,
// cudatest_context is a validating context and these run too).

TensorView on_cuda(TensorView view) {
  view.device = Device{DeviceKind::kCuda, 0};
  return view;
}

TEST(CudaLayerPrepErrors, RopeArgumentsAreNamed) {
  const RopeTable table = make_table(RopeConfig::swa_only(), 16);
  Buffer<float> x(DType::kF32, {2, 3, 128});
  Buffer<std::int32_t> pos(DType::kI32, {2});
  const TensorView dx = on_cuda(x.view), dpos = on_cuda(pos.view);
  EXPECT_TRUE(FailsWith(apply_rope(cudatest_context(nullptr), {dx, dpos, nullptr, 64, RopeDirection::kForward}),
                        StatusCode::kInvalidArgument, {"apply_rope", "table"}));
  EXPECT_TRUE(FailsWith(apply_rope(cudatest_context(nullptr), {x.view, dpos, &table, 64, RopeDirection::kForward}),
                        StatusCode::kInvalidArgument, {"x", "cuda"}));
  EXPECT_TRUE(FailsWith(apply_rope(cudatest_context(nullptr), {dx, dpos, &table, 65, RopeDirection::kForward}),
                        StatusCode::kOutOfRange, {"rope_offset", "[0, 64]", "65"}));
  EXPECT_TRUE(FailsWith(apply_rope(cudatest_context(nullptr), {dx, pos.view, &table, 0, RopeDirection::kForward}),
                        StatusCode::kInvalidArgument, {"positions", "cuda"}));
  Buffer<std::int32_t> pos3(DType::kI32, {3});
  EXPECT_TRUE(
      FailsWith(apply_rope(cudatest_context(nullptr), {dx, on_cuda(pos3.view), &table, 0, RopeDirection::kForward}),
                StatusCode::kInvalidArgument, {"positions", "[2]", "[3]"}));
  Buffer<std::uint16_t> xb(DType::kBF16, {2, 128});
  EXPECT_TRUE(
      FailsWith(apply_rope(cudatest_context(nullptr), {on_cuda(xb.view), dpos, &table, 0, RopeDirection::kForward}),
                StatusCode::kInvalidArgument, {"x", "f32", "bf16"}));
}

TEST(CudaLayerPrepErrors, QueryAndKvArgumentsAreNamed) {
  const RopeTable table = make_table(RopeConfig::swa_only(), 16);
  Buffer<float> q(DType::kF32, {2, 4, 512});
  Buffer<std::uint16_t> out(DType::kBF16, {2, 3, 512});
  Buffer<std::uint16_t> out_ok(DType::kBF16, {2, 4, 512});
  Buffer<std::int64_t> pos(DType::kI64, {2});
  EXPECT_TRUE(FailsWith(
      prepare_query(cudatest_context(nullptr), {on_cuda(q.view), on_cuda(pos.view), &table, 1e-6f, on_cuda(out.view)}),
      StatusCode::kInvalidArgument, {"prepare_query", "out", "at least 4 heads"}));
  EXPECT_TRUE(FailsWith(prepare_query(cudatest_context(nullptr),
                                      {on_cuda(q.view), on_cuda(pos.view), &table, 0.0f, on_cuda(out_ok.view)}),
                        StatusCode::kInvalidArgument, {"eps"}));
  EXPECT_TRUE(FailsWith(
      prepare_query(cudatest_context(nullptr), {q.view, on_cuda(pos.view), &table, 1e-6f, on_cuda(out_ok.view)}),
      StatusCode::kInvalidArgument, {"q", "cuda"}));
  EXPECT_TRUE(FailsWith(
      prepare_query(cudatest_context(nullptr), {on_cuda(q.view), pos.view, &table, 1e-6f, on_cuda(out_ok.view)}),
      StatusCode::kInvalidArgument, {"positions", "cuda"}));

  Buffer<float> kv(DType::kF32, {2, 512});
  Buffer<std::int64_t> slots3(DType::kI64, {3}), slots(DType::kI64, {2});
  OwnedKvCache cache(KvFormat::kBf16Rows, 2, 3);
  KvCacheView dcache = cache.view;
  dcache.pages = on_cuda(cache.view.pages);
  const TensorView dkv = on_cuda(kv.view), dpos = on_cuda(pos.view), dslots = on_cuda(slots.view);
  EXPECT_TRUE(FailsWith(prepare_kv(cudatest_context(nullptr), {dkv, dpos, &table, on_cuda(slots3.view), dcache, {}}),
                        StatusCode::kInvalidArgument, {"prepare_kv", "slot_mapping", "at most 2"}));
  EXPECT_TRUE(FailsWith(prepare_kv(cudatest_context(nullptr), {dkv, dpos, &table, dslots, cache.view, {}}),
                        StatusCode::kInvalidArgument, {"cache", "cuda"}));
  OwnedKvCache v32(KvFormat::kV32Fp8, 1, 2);
  KvCacheView dv32 = v32.view;
  dv32.pages = on_cuda(v32.view.pages);
  EXPECT_TRUE(FailsWith(prepare_kv(cudatest_context(nullptr), {dkv, dpos, &table, dslots, dv32, {}}),
                        StatusCode::kInvalidArgument, {"cache", "512-dim"}));
  Buffer<std::uint16_t> rotated(DType::kBF16, {3, 512});
  EXPECT_TRUE(
      FailsWith(prepare_kv(cudatest_context(nullptr), {dkv, dpos, &table, dslots, dcache, on_cuda(rotated.view)}),
                StatusCode::kInvalidArgument, {"rotated", "[2, 512]"}));
  Buffer<std::uint16_t> kv_bad(DType::kBF16, {2, 448});
  EXPECT_TRUE(FailsWith(prepare_kv(cudatest_context(nullptr), {on_cuda(kv_bad.view), dpos, &table, dslots, dcache, {}}),
                        StatusCode::kInvalidArgument, {"kv", "512"}));
}

TEST(CudaLayerPrepErrors, CompressorAndIndexerQueryArgumentsAreNamed) {
  std::mt19937_64 rng(1);
  const RopeTable rope = make_table(RopeConfig::compressed(), 64);
  CompressorCase c(4, std::nullopt, 8, rng);
  auto s = c.step({{0, 3}, {1, 3}}, &rope);
  CompressorArgs d = s->args;
  for (TensorView* v : {&d.kv_score, &d.ape, &d.norm_weight, &d.positions, &d.token_to_request, &d.state_cache,
                        &d.state_block_table, &d.state_slot_mapping, &d.compressed_slot_mapping}) {
    *v = on_cuda(*v);
  }
  d.index_cache->pages = on_cuda(d.index_cache->pages);
  CompressorArgs bad = d;
  bad.ratio = 8;
  EXPECT_TRUE(FailsWith(run_compressor(cudatest_context(nullptr), bad), StatusCode::kInvalidArgument,
                        {"run_compressor", "ratio", "8"}));
  bad = d;
  bad.kv_cache = KvCacheView{};
  EXPECT_TRUE(
      FailsWith(run_compressor(cudatest_context(nullptr), bad), StatusCode::kInvalidArgument, {"destination", "both"}));
  bad = d;
  bad.state_block_table = s->args.state_block_table;
  EXPECT_TRUE(FailsWith(run_compressor(cudatest_context(nullptr), bad), StatusCode::kInvalidArgument,
                        {"state_block_table", "cuda"}));
  bad = d;
  bad.index_cache = s->args.index_cache;
  EXPECT_TRUE(
      FailsWith(run_compressor(cudatest_context(nullptr), bad), StatusCode::kInvalidArgument, {"index_cache", "cuda"}));
  bad = d;
  bad.kv_score.shape[1] = 100;
  EXPECT_TRUE(FailsWith(run_compressor(cudatest_context(nullptr), bad), StatusCode::kInvalidArgument,
                        {"kv_score", "[*, 512]"}));
  bad = d;
  bad.compressed_slot_mapping.dtype = DType::kF32;
  EXPECT_TRUE(FailsWith(run_compressor(cudatest_context(nullptr), bad), StatusCode::kInvalidArgument,
                        {"compressed_slot_mapping", "i32 or i64"}));

  Buffer<float> q(DType::kF32, {2, 4, 128}), weights(DType::kF32, {2, 4}), head_weights(DType::kF32, {2, 4});
  Buffer<std::uint8_t> q8(DType::kE4M3, {2, 4, 128});
  Buffer<std::uint16_t> q8_bad(DType::kBF16, {2, 4, 128});
  Buffer<std::int32_t> pos(DType::kI32, {2});
  const IndexerQueryArgs ok{on_cuda(q.view), on_cuda(weights.view), on_cuda(pos.view), &rope, on_cuda(q8.view),
                            on_cuda(head_weights.view)};
  IndexerQueryArgs bad_q = ok;
  bad_q.q_fp8 = on_cuda(q8_bad.view);
  EXPECT_TRUE(FailsWith(prepare_indexer_query(cudatest_context(nullptr), bad_q), StatusCode::kInvalidArgument,
                        {"prepare_indexer_query", "q_fp8", "e4m3"}));
  bad_q = ok;
  bad_q.weights = on_cuda(head_weights.view);
  bad_q.weights.shape[1] = 3;
  EXPECT_TRUE(FailsWith(prepare_indexer_query(cudatest_context(nullptr), bad_q), StatusCode::kInvalidArgument,
                        {"weights", "[2, 4]"}));
  bad_q = ok;
  bad_q.rope = nullptr;
  EXPECT_TRUE(
      FailsWith(prepare_indexer_query(cudatest_context(nullptr), bad_q), StatusCode::kInvalidArgument, {"rope"}));
  bad_q = ok;
  bad_q.head_weights = head_weights.view;
  EXPECT_TRUE(FailsWith(prepare_indexer_query(cudatest_context(nullptr), bad_q), StatusCode::kInvalidArgument,
                        {"head_weights", "cuda"}));
}

}  // namespace
}  // namespace smla
