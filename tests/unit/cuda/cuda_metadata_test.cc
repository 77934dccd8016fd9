// The device metadata ops (smla/cuda_metadata.h) against the host functions of
// smla/metadata.h: exact bytes on random batches (decode-only, mixed, MTP,
// padding, token_valid, both compressed groups, permuted and padded block
// tables, odd window / page sizes), every capacity row written (outputs
// poisoned first), error bits and no out-of-bounds access on invalid batches
// (run under compute-sanitizer by scripts/gpu-check.sh), CUDA-graph replay,
// and host-side Status errors (those need no device and run in CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "smla/metadata.h"
#include "tests/unit/cuda/cuda_context.h"
#include "smla/metadata.h"
#include "tests/common/test_common.h"
#include "testkit/cuda/device_copy.h"
#include "tests/unit/metadata/host_batch.h"

namespace smla {
namespace {

using cudatest::check_cuda;
using cudatest::DeviceBuffer;
using testing::FailsWith;
using testing::HostBatch;
using testing::HostTable;
using testing::IsOk;

#define SKIP_WITHOUT_DEVICE()                                               \
  do {                                                                      \
    if (!cudatest::cuda_device_present()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

constexpr std::uint8_t kPoisonByte = 0xA5;

// ---- device storage ---------------------------------------------------------

// A device array of T with a host mirror; `rows x row_stride` elements.
template <class T>
struct DeviceArray {
  DeviceBuffer buffer;
  std::vector<T> host;
  std::int64_t rows = 0, cols = 1, row_stride = 1;

  static DeviceArray upload(const std::vector<T>& values) {
    DeviceArray a;
    a.host = values;
    a.rows = static_cast<std::int64_t>(values.size());
    a.buffer = DeviceBuffer(std::max<std::size_t>(values.size(), 1) * sizeof(T));
    if (!values.empty()) {
      check_cuda(cudaMemcpy(a.buffer.data(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice),
                 "upload");
    }
    return a;
  }
  // Poisoned [rows, cols] storage with a padded row stride.
  static DeviceArray poisoned(std::int64_t rows, std::int64_t cols, std::int64_t pad) {
    DeviceArray a;
    a.rows = rows;
    a.cols = cols;
    a.row_stride = cols + pad;
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(rows * a.row_stride, 1));
    a.buffer = DeviceBuffer(n * sizeof(T));
    check_cuda(cudaMemset(a.buffer.data(), kPoisonByte, n * sizeof(T)), "poison");
    return a;
  }
  void download() {
    host.resize(buffer.bytes() / sizeof(T));
    check_cuda(cudaMemcpy(host.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost), "download");
  }
  T at(std::int64_t r, std::int64_t c = 0) const { return host[static_cast<std::size_t>(r * row_stride + c)]; }
  TensorView vector_view(DType dtype) const {
    return TensorView::strided(buffer.data(), dtype, {rows}, {row_stride}, cudatest::current_cuda_device());
  }
  TensorView matrix_view(DType dtype) const {
    return TensorView::strided(buffer.data(), dtype, {rows, cols}, {row_stride, 1}, cudatest::current_cuda_device());
  }
};

DeviceArray<std::int32_t> upload_table(const HostTable& t) {
  DeviceArray<std::int32_t> a = DeviceArray<std::int32_t>::upload(t.data);
  a.rows = t.rows;
  a.cols = t.cols;
  a.row_stride = t.row_stride;
  return a;
}

// A HostBatch on the device; num_tokens must be set (the capacity).
struct DeviceBatchCopy {
  DeviceArray<std::int32_t> query_lens, seq_lens, swa, c4, c128;
  DeviceArray<std::uint8_t> token_valid;
  BatchDescription desc;

  explicit DeviceBatchCopy(const HostBatch& b) {
    query_lens = DeviceArray<std::int32_t>::upload(b.query_lens);
    seq_lens = DeviceArray<std::int32_t>::upload(b.seq_lens);
    desc.query_lens = query_lens.vector_view(DType::kI32);
    desc.seq_lens = seq_lens.vector_view(DType::kI32);
    desc.num_tokens = b.num_tokens;
    if (!b.token_valid.empty()) {
      token_valid = DeviceArray<std::uint8_t>::upload(b.token_valid);
      desc.token_valid = token_valid.vector_view(DType::kU8);
    }
    swa = upload_table(b.swa);
    desc.swa_block_table = swa.matrix_view(DType::kI32);
    if (b.has_c4) {
      c4 = upload_table(b.c4);
      desc.c4_block_table = c4.matrix_view(DType::kI32);
    }
    if (b.has_c128) {
      c128 = upload_table(b.c128);
      desc.c128_block_table = c128.matrix_view(DType::kI32);
    }
  }
};

// Every output of cuda_build_step_metadata, poisoned, with padded strides.
struct DeviceStepOutputs {
  DeviceArray<std::int32_t> query_start_loc, token_to_req, swa_indices, swa_lens, prefill_gather_lens;
  DeviceArray<std::int32_t> c128a_decode_indices, c128a_decode_lens, c128a_prefill_indices;
  DeviceArray<std::int64_t> positions, swa_slot_mapping, c4_slot_mapping, c128_slot_mapping, counts;
  DeviceArray<std::uint8_t> is_valid_token;
  bool has_c4 = false, has_c128 = false;

  DeviceStepOutputs(std::int64_t reqs, std::int64_t tokens, const StepConfig& config, bool c4, bool c128,
                    std::int64_t pad)
      : has_c4(c4), has_c128(c128) {
    using I32 = DeviceArray<std::int32_t>;
    using I64 = DeviceArray<std::int64_t>;
    query_start_loc = I32::poisoned(reqs + 1, 1, pad);
    token_to_req = I32::poisoned(tokens, 1, pad);
    positions = I64::poisoned(tokens, 1, pad);
    is_valid_token = DeviceArray<std::uint8_t>::poisoned(tokens, 1, pad);
    swa_slot_mapping = I64::poisoned(tokens, 1, 0);
    swa_indices = I32::poisoned(tokens, config.window, pad);
    swa_lens = I32::poisoned(tokens, 1, 0);
    prefill_gather_lens = I32::poisoned(reqs, 1, pad);
    counts = I64::poisoned(kStepCountFields, 1, 0);
    if (c4) c4_slot_mapping = I64::poisoned(tokens, 1, pad);
    if (c128) {
      const std::int64_t width = c128a_width(config);
      c128_slot_mapping = I64::poisoned(tokens, 1, 0);
      c128a_decode_indices = I32::poisoned(tokens, width, pad);
      c128a_decode_lens = I32::poisoned(tokens, 1, pad);
      c128a_prefill_indices = I32::poisoned(tokens, width, 0);
    }
  }
  StepMetadataBuffers buffers() const {
    StepMetadataBuffers b;
    b.query_start_loc = query_start_loc.vector_view(DType::kI32);
    b.token_to_req = token_to_req.vector_view(DType::kI32);
    b.positions = positions.vector_view(DType::kI64);
    b.is_valid_token = is_valid_token.vector_view(DType::kU8);
    b.swa_slot_mapping = swa_slot_mapping.vector_view(DType::kI64);
    b.swa_indices = swa_indices.matrix_view(DType::kI32);
    b.swa_lens = swa_lens.vector_view(DType::kI32);
    b.prefill_gather_lens = prefill_gather_lens.vector_view(DType::kI32);
    if (has_c4) b.c4_slot_mapping = c4_slot_mapping.vector_view(DType::kI64);
    if (has_c128) {
      b.c128_slot_mapping = c128_slot_mapping.vector_view(DType::kI64);
      b.c128a_decode_indices = c128a_decode_indices.matrix_view(DType::kI32);
      b.c128a_decode_lens = c128a_decode_lens.vector_view(DType::kI32);
      b.c128a_prefill_indices = c128a_prefill_indices.matrix_view(DType::kI32);
    }
    return b;
  }
  TensorView counts_view() const { return counts.vector_view(DType::kI64); }
  void download() {
    for (auto* a : {&query_start_loc, &token_to_req, &swa_indices, &swa_lens, &prefill_gather_lens,
                    &c128a_decode_indices, &c128a_decode_lens, &c128a_prefill_indices}) {
      if (a->buffer.bytes() > 0) a->download();
    }
    for (auto* a : {&positions, &swa_slot_mapping, &c4_slot_mapping, &c128_slot_mapping, &counts}) {
      if (a->buffer.bytes() > 0) a->download();
    }
    is_valid_token.download();
  }
};

// ---- random batches -----------------------------------------------------------

struct BatchShape {
  std::int64_t reqs = 4;
  std::int64_t capacity = 64;     // T
  std::int64_t max_prefill_query = 40;
  std::int64_t max_prefix = 700;
  std::int64_t extra_cols = 2;    // table columns beyond what max_model_len needs
  bool allow_token_valid = true;
  int c4 = -1, c128 = -1;         // -1 random, 0 absent, 1 present
};

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

void fill_table(HostTable& table, const std::vector<std::int64_t>& needed, std::int64_t cols, std::mt19937_64& rng) {
  std::int64_t total = 0;
  for (auto c : needed) total += c;
  table.resize(static_cast<std::int64_t>(needed.size()), cols, uniform(rng, 0, 3));
  std::vector<std::int32_t> blocks(static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::int32_t>(i);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::size_t next = 0;
  for (std::size_t r = 0; r < needed.size(); ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      // Columns past the need hold junk a valid batch never reads.
      table.at(static_cast<std::int64_t>(r), c) =
          c < needed[r] ? blocks[next++] : static_cast<std::int32_t>(uniform(rng, -3, 1 << 30));
    }
  }
}

// A valid decode-first batch of exactly `shape.reqs` requests (some with
// query_len 0) and capacity T = shape.capacity, tables sized for max_model_len.
HostBatch random_batch(std::mt19937_64& rng, const StepConfig& config, const BatchShape& shape) {
  const std::int64_t thr = config.decode_threshold();
  std::vector<std::int32_t> decodes, prefills;
  const std::int64_t num_prefills = uniform(rng, 0, 3) == 0 ? 0 : uniform(rng, 0, shape.reqs);
  for (std::int64_t r = 0; r < shape.reqs - num_prefills; ++r) {
    decodes.push_back(static_cast<std::int32_t>(uniform(rng, 0, 5) == 0 ? 0 : uniform(rng, 1, thr)));
  }
  for (std::int64_t r = 0; r < num_prefills; ++r) {
    prefills.push_back(static_cast<std::int32_t>(uniform(rng, thr + 1, std::max(thr + 1, shape.max_prefill_query))));
  }
  auto total = [&] {
    std::int64_t n = 0;
    for (auto q : decodes) n += q;
    for (auto q : prefills) n += q;
    return n;
  };
  while (total() > shape.capacity) {
    if (!prefills.empty()) {
      prefills.pop_back();
      decodes.insert(decodes.begin(), 0);
    } else {
      *std::max_element(decodes.begin(), decodes.end()) = 0;
    }
  }
  HostBatch b;
  b.query_lens = decodes;
  b.query_lens.insert(b.query_lens.end(), prefills.begin(), prefills.end());
  for (auto q : b.query_lens) {
    const std::int64_t cap = std::min<std::int64_t>(shape.max_prefix, config.max_model_len - q);
    const std::int64_t prefix = uniform(rng, 0, 2) == 0 ? uniform(rng, 0, std::min<std::int64_t>(config.window, cap))
                                                        : uniform(rng, 0, cap);
    b.seq_lens.push_back(static_cast<std::int32_t>(q + prefix));
  }
  b.num_tokens = shape.capacity;
  if (shape.allow_token_valid && uniform(rng, 0, 2) == 0) {
    b.token_valid.resize(static_cast<std::size_t>(shape.capacity));
    for (auto& v : b.token_valid) v = uniform(rng, 0, 4) == 0 ? 0 : static_cast<std::uint8_t>(uniform(rng, 1, 255));
  }
  const std::int64_t c4_block = compressed_block_size(config, 4), c128_block = compressed_block_size(config, 128);
  std::vector<std::int64_t> swa_cols, c4_cols, c128_cols;
  for (auto s : b.seq_lens) {
    swa_cols.push_back((s + config.swa_page_size - 1) / config.swa_page_size);
    c4_cols.push_back((s / 4 + c4_block - 1) / c4_block);
    c128_cols.push_back((s / 128 + c128_block - 1) / c128_block);
  }
  const std::int64_t m = config.max_model_len;
  fill_table(b.swa, swa_cols, (m + config.swa_page_size - 1) / config.swa_page_size + shape.extra_cols, rng);
  for (std::size_t r = 0; r < b.seq_lens.size(); ++r) {  // pages older than the window may be freed
    const std::int64_t first = std::max<std::int64_t>(b.seq_lens[r] - b.query_lens[r] - config.window + 1, 0);
    for (std::int64_t c = 0; c < first / config.swa_page_size; ++c) {
      if (uniform(rng, 0, 1) == 0) b.swa.at(static_cast<std::int64_t>(r), c) = -1;
    }
  }
  fill_table(b.c4, c4_cols, (m / 4 + c4_block - 1) / c4_block + shape.extra_cols, rng);
  fill_table(b.c128, c128_cols, (m / 128 + c128_block - 1) / c128_block + shape.extra_cols, rng);
  b.has_c4 = shape.c4 < 0 ? uniform(rng, 0, 3) != 0 : shape.c4 == 1;
  b.has_c128 = shape.c128 < 0 ? uniform(rng, 0, 3) != 0 : shape.c128 == 1;
  return b;
}

StepConfig random_config(std::mt19937_64& rng) {
  StepConfig c;
  const int kind = static_cast<int>(uniform(rng, 0, 3));
  c.window = kind == 0 ? 128 : static_cast<int>(uniform(rng, 1, 70));
  c.max_model_len = uniform(rng, 1, 3) * 1024 + uniform(rng, 0, 200);
  c.max_num_batched_tokens = 4096;
  c.index_topk = static_cast<int>(uniform(rng, 1, 80));
  c.num_speculative_tokens = static_cast<int>(uniform(rng, 0, 3));
  c.swa_page_size = kind == 0 ? 64 : static_cast<int>(uniform(rng, 1, 40));
  c.logical_block_size = kind == 0 ? 256 : 128 * static_cast<int>(uniform(rng, 1, 3));
  c.c128a_active_width = uniform(rng, 0, 2) == 0 ? static_cast<int>(uniform(rng, 1, 8)) : 0;
  return c;
}

// ---- comparison -----------------------------------------------------------------

// Checks got(r, c) == want(r, c) for r < rows, c < cols; reports the first miss.
template <class Got, class Want>
::testing::AssertionResult rows_equal(const char* name, std::int64_t rows, std::int64_t cols, Got got, Want want) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto g = static_cast<std::int64_t>(got(r, c));
      const auto w = static_cast<std::int64_t>(want(r, c));
      if (g != w) {
        return ::testing::AssertionFailure() << name << "[" << r << "][" << c << "]: got " << g << ", want " << w;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The device outputs against make_step_metadata of the same batch; rows past
// the host's rows must hold the padding values.
void expect_matches_host(HostBatch& hb, const StepConfig& config, DeviceStepOutputs& got) {
  Expected<StepMetadata> host = make_step_metadata(hb.desc(), config);
  ASSERT_TRUE(IsOk(host.status()));
  StepMetadata& m = *host;
  got.download();
  const StepCounts& c = m.counts();
  const std::int64_t reqs = c.num_reqs, tokens = c.num_tokens;
  const std::int64_t want_counts[kStepCountFields] = {
      c.num_reqs,          c.num_tokens,         c.num_actual_tokens,   c.num_decodes,
      c.num_prefills,      c.num_decode_tokens,  c.num_prefill_tokens,  c.max_query_len,
      c.max_decode_query_len, c.max_prefill_query_len, c.max_seq_len, 0};
  EXPECT_TRUE(rows_equal("counts", kStepCountFields, 1, [&](auto r, auto) { return got.counts.at(r); },
                         [&](auto r, auto) { return want_counts[r]; }));
  auto at = [](const auto& v, std::int64_t i) { return v[static_cast<std::size_t>(i)]; };
  EXPECT_TRUE(rows_equal("query_start_loc", reqs + 1, 1, [&](auto r, auto) { return got.query_start_loc.at(r); },
                         [&](auto r, auto) { return at(m.query_start_loc, r); }));
  EXPECT_TRUE(rows_equal("token_to_req", tokens, 1, [&](auto r, auto) { return got.token_to_req.at(r); },
                         [&](auto r, auto) { return at(m.token_to_req, r); }));
  EXPECT_TRUE(rows_equal("positions", tokens, 1, [&](auto r, auto) { return got.positions.at(r); },
                         [&](auto r, auto) { return at(m.positions, r); }));
  EXPECT_TRUE(rows_equal("is_valid_token", tokens, 1, [&](auto r, auto) { return got.is_valid_token.at(r); },
                         [&](auto r, auto) { return at(m.is_valid_token, r); }));
  EXPECT_TRUE(rows_equal("swa_slot_mapping", tokens, 1, [&](auto r, auto) { return got.swa_slot_mapping.at(r); },
                         [&](auto r, auto) { return at(m.swa_slot_mapping, r); }));
  EXPECT_TRUE(rows_equal("swa_lens", tokens, 1, [&](auto r, auto) { return got.swa_lens.at(r); },
                         [&](auto r, auto) { return at(m.swa_lens, r); }));
  const std::int64_t w = config.window;
  EXPECT_TRUE(rows_equal("swa_indices", tokens, w, [&](auto r, auto k) { return got.swa_indices.at(r, k); },
                         [&](auto r, auto k) { return at(m.swa_indices, r * w + k); }));
  EXPECT_TRUE(rows_equal("prefill_gather_lens", reqs, 1, [&](auto r, auto) { return got.prefill_gather_lens.at(r); },
                         [&](auto r, auto) { return r < c.num_prefills ? at(m.prefill_gather_lens, r) : 0; }));
  if (hb.has_c4) {
    EXPECT_TRUE(rows_equal("c4_slot_mapping", tokens, 1, [&](auto r, auto) { return got.c4_slot_mapping.at(r); },
                           [&](auto r, auto) { return at(m.c4_slot_mapping, r); }));
  }
  if (!hb.has_c128) return;
  EXPECT_TRUE(rows_equal("c128_slot_mapping", tokens, 1, [&](auto r, auto) { return got.c128_slot_mapping.at(r); },
                         [&](auto r, auto) { return at(m.c128_slot_mapping, r); }));
  const std::int64_t cw = c128a_width(config);
  const std::int64_t dec = c.num_decode_tokens, pre = c.num_prefill_tokens;
  EXPECT_TRUE(rows_equal(
      "c128a_decode_indices", tokens, cw, [&](auto r, auto k) { return got.c128a_decode_indices.at(r, k); },
      [&](auto r, auto k) { return r < dec ? at(m.c128a_decode_indices, r * cw + k) : -1; }));
  EXPECT_TRUE(rows_equal("c128a_decode_lens", tokens, 1, [&](auto r, auto) { return got.c128a_decode_lens.at(r); },
                         [&](auto r, auto) { return r < dec ? at(m.c128a_decode_lens, r) : 0; }));
  EXPECT_TRUE(rows_equal(
      "c128a_prefill_indices", tokens, cw, [&](auto r, auto k) { return got.c128a_prefill_indices.at(r, k); },
      [&](auto r, auto k) { return r < pre ? at(m.c128a_prefill_indices, r * cw + k) : -1; }));
}

struct StepRun {
  DeviceBatchCopy batch;
  DeviceStepOutputs out;
  StepRun(const HostBatch& hb, const StepConfig& config, std::int64_t pad)
      : batch(hb), out(static_cast<std::int64_t>(hb.query_lens.size()), hb.num_tokens, config, hb.has_c4,
                       hb.has_c128, pad) {}
  Status run(const StepConfig& config, cudaStream_t stream = nullptr) {
    return build_step_metadata(cudatest_context(stream), batch.desc, config, out.buffers(), out.counts_view());
  }
};

// ---- cuda_build_step_metadata -------------------------------------------------------

TEST(CudaStepMetadata, MatchesHostOnRandomBatches) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 240; ++iter) {
    SCOPED_TRACE(::testing::Message() << "batch " << iter);
    const StepConfig config = random_config(rng);
    BatchShape shape;
    shape.reqs = uniform(rng, 0, 9);
    shape.capacity = uniform(rng, 0, 160);
    shape.max_prefix = uniform(rng, 0, 1) == 0 ? 300 : config.max_model_len;
    shape.max_prefill_query = uniform(rng, 4, 60);
    HostBatch hb = random_batch(rng, config, shape);
    StepRun run(hb, config, uniform(rng, 0, 3));
    ASSERT_TRUE(IsOk(run.run(config)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_matches_host(hb, config, run.out);
    if (HasFailure()) break;
  }
}

TEST(CudaStepMetadata, ProductionShapesDecodeOnlyAndMixed) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 1;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  StepConfig config;  // W 128, page 64, block 256, C128W 512
  config.num_speculative_tokens = 1;
  for (int iter = 0; iter < 6; ++iter) {
    BatchShape shape;
    shape.reqs = uniform(rng, 1, 40);
    shape.capacity = uniform(rng, 40, 600);
    shape.max_prefix = config.max_model_len;
    shape.max_prefill_query = 200;
    shape.extra_cols = 0;
    shape.c4 = shape.c128 = 1;
    HostBatch hb = random_batch(rng, config, shape);
    StepRun run(hb, config, 0);
    ASSERT_TRUE(IsOk(run.run(config)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_matches_host(hb, config, run.out);
  }
}

// Spec 5.7: the worked decode token (seq_len 1000) by hand.
TEST(CudaStepMetadata, WorkedExampleDecodeToken) {
  SKIP_WITHOUT_DEVICE();
  StepConfig config;
  HostBatch hb;
  hb.query_lens = {1};
  hb.seq_lens = {1000};
  hb.num_tokens = 2;  // one trailing padding token
  hb.swa.resize(1, 16);
  hb.c4.resize(1, 4);
  hb.c128.resize(1, 4);
  for (int c = 0; c < 16; ++c) hb.swa.at(0, c) = 100 + c;
  for (int c = 0; c < 4; ++c) hb.c4.at(0, c) = 50 + c;
  for (int c = 0; c < 4; ++c) hb.c128.at(0, c) = 7 + c;
  StepRun run(hb, config, 1);
  ASSERT_TRUE(IsOk(run.run(config)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  DeviceStepOutputs& o = run.out;
  o.download();
  EXPECT_EQ(o.positions.at(0), 999);
  EXPECT_EQ(o.swa_lens.at(0), 128);
  EXPECT_EQ(o.swa_indices.at(0, 0), (100 + 13) * 64 + 40);    // position 872
  EXPECT_EQ(o.swa_indices.at(0, 127), (100 + 15) * 64 + 39);  // position 999
  EXPECT_EQ(o.swa_slot_mapping.at(0), (100 + 15) * 64 + 39);
  EXPECT_EQ(o.c4_slot_mapping.at(0), (50 + 3) * 64 + 57);  // entry 249 closes at 999
  EXPECT_EQ(o.c128a_decode_lens.at(0), 7);
  EXPECT_EQ(o.c128a_decode_indices.at(0, 6), (7 + 3) * 2 + 0);  // entry 6
  EXPECT_EQ(o.c128a_decode_indices.at(0, 7), -1);
  EXPECT_EQ(o.token_to_req.at(1), -1);
  EXPECT_EQ(o.positions.at(1), 0);
  EXPECT_EQ(o.c128a_decode_lens.at(1), 0);
  EXPECT_EQ(o.c128a_prefill_indices.at(0, 0), -1);
  EXPECT_EQ(o.counts.at(kStepErrorWord), 0);
  EXPECT_EQ(o.counts.at(5), 1);  // num_decode_tokens
}

// Invalid values: the documented bit, every output row still written.
TEST(CudaStepMetadata, InvalidBatchesSetErrorBits) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 2;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  StepConfig config;
  config.max_model_len = 2048;
  config.window = 32;
  struct Case {
    const char* name;
    std::int64_t bit;
  };
  const Case cases[] = {{"negative query", kStepNegativeQueryLen}, {"seq below query", kStepSeqLenBelowQuery},
                        {"seq above max", kStepSeqLenAboveMax},    {"too many tokens", kStepTooManyTokens},
                        {"unordered", kStepUnordered},            {"swa id", kStepBadSwaTable},
                        {"c4 columns", kStepBadC4Table},          {"c128 id", kStepBadC128Table}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    BatchShape shape;
    shape.reqs = 4;
    shape.capacity = 40;
    shape.max_prefix = 1500;
    shape.c4 = shape.c128 = 1;
    shape.allow_token_valid = false;
    HostBatch hb = random_batch(rng, config, shape);
    hb.query_lens = {1, 1, 10, 12};  // the tables hold max_model_len already
    hb.seq_lens = {900, 1000, 1200, 1300};
    for (int r = 0; r < 4; ++r) {
      for (int col = 0; col < hb.swa.cols; ++col) hb.swa.at(r, col) = r * 100 + col;
      for (int col = 0; col < hb.c4.cols; ++col) hb.c4.at(r, col) = r * 100 + col;
      for (int col = 0; col < hb.c128.cols; ++col) hb.c128.at(r, col) = r * 1000 + col;
    }
    const std::string name = k.name;
    if (name == "negative query") hb.query_lens[0] = -3;
    if (name == "seq below query") hb.seq_lens[3] = 5;
    if (name == "seq above max") hb.seq_lens[2] = 1 << 30;
    if (name == "too many tokens") hb.query_lens[3] = 100;
    if (name == "unordered") std::swap(hb.query_lens[1], hb.query_lens[2]);
    if (name == "swa id") hb.swa.at(1, 999 / 64) = -5;
    if (name == "c4 columns") hb.c4.cols = 1;  // fewer columns than 1300 // 4 entries need
    if (name == "c128 id") hb.c128.at(2, 0) = 2000000000;
    StepRun run(hb, config, 1);
    ASSERT_TRUE(IsOk(run.run(config)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    run.out.download();
    const std::int64_t error = run.out.counts.at(kStepErrorWord);
    EXPECT_NE(error & k.bit, 0) << "error word " << error;
    for (std::int64_t t = 0; t < hb.num_tokens; ++t) {
      EXPECT_LE(run.out.is_valid_token.at(t), 1) << "token " << t;
      EXPECT_GE(run.out.token_to_req.at(t), -1);
      EXPECT_LT(run.out.token_to_req.at(t), 4);
      EXPECT_GE(run.out.swa_lens.at(t), 0);
      EXPECT_LE(run.out.swa_lens.at(t), config.window);
    }
  }
}

// Garbage in every value (negative and huge lengths, junk block ids): no
// launch error, no out-of-bounds access (compute-sanitizer), every row written.
TEST(CudaStepMetadata, GarbageValuesStayInBounds) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 3;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 30; ++iter) {
    StepConfig config = random_config(rng);
    BatchShape shape;
    shape.reqs = uniform(rng, 1, 6);
    shape.capacity = uniform(rng, 0, 50);
    shape.c4 = shape.c128 = 1;
    HostBatch hb = random_batch(rng, config, shape);
    auto junk = [&] {
      switch (uniform(rng, 0, 4)) {
        case 0: return static_cast<std::int32_t>(uniform(rng, -2147483647, -1));
        case 1: return static_cast<std::int32_t>(uniform(rng, 0, 2147483647));
        default: return static_cast<std::int32_t>(uniform(rng, -5, 300));
      }
    };
    for (auto& q : hb.query_lens) q = junk();
    for (auto& s : hb.seq_lens) s = junk();
    for (auto* t : {&hb.swa, &hb.c4, &hb.c128}) {
      for (auto& v : t->data) v = junk();
    }
    StepRun run(hb, config, 0);
    ASSERT_TRUE(IsOk(run.run(config)));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    run.out.download();
    EXPECT_NE(run.out.counts.at(kStepErrorWord), 0);
    for (std::int64_t t = 0; t < hb.num_tokens; ++t) {
      ASSERT_LE(run.out.is_valid_token.at(t), 1) << "token " << t;
      ASSERT_GE(run.out.swa_lens.at(t), 0);
      for (std::int64_t k = 0; k < config.window; ++k) {
        ASSERT_NE(static_cast<std::uint32_t>(run.out.swa_indices.at(t, k)), 0xA5A5A5A5u) << t << "," << k;
      }
    }
  }
}

// One graph captured with batch A's buffers replays batch B (same capacity,
// values uploaded in place) and gives B's eager result.
TEST(CudaStepMetadata, GraphReplayWithTwoBatches) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 4;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  StepConfig config;
  config.max_model_len = 4096;
  config.num_speculative_tokens = 2;
  BatchShape shape;
  shape.reqs = 7;
  shape.capacity = 300;
  shape.max_prefix = 4000;
  shape.max_prefill_query = 100;
  shape.c4 = shape.c128 = 1;
  shape.extra_cols = 1;
  HostBatch a = random_batch(rng, config, shape);
  HostBatch b = random_batch(rng, config, shape);
  // Same shapes for both: token_valid present in both or neither, same table padding.
  b.token_valid = a.token_valid.empty() ? std::vector<std::uint8_t>{} : std::vector<std::uint8_t>(300, 1);
  for (auto* t : {&b.swa, &b.c4, &b.c128}) {
    HostTable& ta = t == &b.swa ? a.swa : (t == &b.c4 ? a.c4 : a.c128);
    HostTable resized;
    resized.resize(ta.rows, ta.cols, ta.row_stride - ta.cols);
    for (std::int64_t r = 0; r < ta.rows; ++r) {
      for (std::int64_t c = 0; c < ta.cols; ++c) resized.at(r, c) = t->at(r, c);
    }
    *t = resized;
  }

  StepRun run(a, config, 2);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status captured = run.run(config, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(IsOk(captured));
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (HostBatch* hb : {&a, &b, &a}) {
    auto put = [&](auto& dst, const auto& src) {
      ASSERT_EQ(cudaMemcpy(dst.buffer.data(), src.data(), src.size() * sizeof(src[0]), cudaMemcpyHostToDevice),
                cudaSuccess);
    };
    put(run.batch.query_lens, hb->query_lens);
    put(run.batch.seq_lens, hb->seq_lens);
    if (!hb->token_valid.empty()) put(run.batch.token_valid, hb->token_valid);
    put(run.batch.swa, hb->swa.data);
    put(run.batch.c4, hb->c4.data);
    put(run.batch.c128, hb->c128.data);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_matches_host(*hb, config, run.out);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The bench case of docs/PERF.md "Step metadata": 248 MTP decodes x 2 + 8
// prefills x 512 (T = 4592), ~64K contexts, both groups. Checks the bytes once
// and prints the device time per call.
TEST(CudaStepMetadata, BenchCaseTiming) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937_64 rng(testing::test_seed() + 5);
  StepConfig config;
  config.num_speculative_tokens = 1;
  HostBatch hb;
  for (int r = 0; r < 256; ++r) {
    const bool decode = r < 248;
    hb.query_lens.push_back(decode ? 2 : 512);
    hb.seq_lens.push_back(static_cast<std::int32_t>(65536 - uniform(rng, 0, 4096)));
  }
  hb.num_tokens = 248 * 2 + 8 * 512;
  std::vector<std::int64_t> swa_cols(256, 1024), c4_cols(256, 256), c128_cols(256, 256);
  fill_table(hb.swa, swa_cols, 1024, rng);
  fill_table(hb.c4, c4_cols, 256, rng);
  fill_table(hb.c128, c128_cols, 256, rng);
  StepRun run(hb, config, 0);
  ASSERT_TRUE(IsOk(run.run(config)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_matches_host(hb, config, run.out);

  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  const auto wall0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(IsOk(run.run(config)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
  const int repeats = first_ms > 20.0 ? 2 : 200;  // short under compute-sanitizer
  ASSERT_EQ(cudaEventRecord(start), cudaSuccess);
  for (int i = 0; i < repeats; ++i) ASSERT_TRUE(IsOk(run.run(config)));
  ASSERT_EQ(cudaEventRecord(stop), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  std::printf("[ bench ] cuda_build_step_metadata T=4592 R=256 both groups: %.2f us per call (%d back-to-back calls)\n",
              1000.0 * ms / repeats, repeats);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// ---- index transforms ------------------------------------------------------------------

// bf16 bits with every NaN mapped to one pattern: the GPU's arithmetic NaN has
// another sign/payload than x86's, the value is the same (NaN).
std::uint16_t canonical_bf16(std::uint16_t v) {
  return (v & 0x7F80) == 0x7F80 && (v & 0x7F) != 0 ? std::uint16_t{0x7FC0} : v;
}

template <class T>
std::vector<T> download_vector(const DeviceArray<T>& a) {
  std::vector<T> v(a.buffer.bytes() / sizeof(T));
  check_cuda(cudaMemcpy(v.data(), a.buffer.data(), a.buffer.bytes(), cudaMemcpyDeviceToHost), "download");
  return v;
}

TEST(CudaIndexTransforms, C4aGlobalMatchesHost) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 6;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 60; ++iter) {
    const std::int64_t n = uniform(rng, 0, 40), k = uniform(rng, 1, 100), reqs = uniform(rng, 1, 5);
    const std::int64_t bs = uniform(rng, 0, 1) == 0 ? 64 : uniform(rng, 1, 70);
    HostTable table;
    table.resize(reqs, uniform(rng, 1, 6), uniform(rng, 0, 2));
    for (auto& v : table.data) v = static_cast<std::int32_t>(uniform(rng, -2, 1000));
    if (uniform(rng, 0, 3) == 0) table.at(0, 0) = 2000000000;  // slots beyond i32 are dropped
    std::vector<std::int32_t> local(static_cast<std::size_t>(n * k)), req(static_cast<std::size_t>(n));
    std::vector<std::uint8_t> valid(static_cast<std::size_t>(n));
    for (auto& v : local) v = static_cast<std::int32_t>(uniform(rng, 0, 5) == 0 ? -1 : uniform(rng, -3, 7 * bs));
    for (auto& v : req) v = static_cast<std::int32_t>(uniform(rng, -1, reqs));
    for (auto& v : valid) v = static_cast<std::uint8_t>(uniform(rng, 0, 3) != 0);
    const bool use_valid = uniform(rng, 0, 1) == 0;

    std::vector<std::int32_t> want(static_cast<std::size_t>(n * k), 77), want_lens(static_cast<std::size_t>(n), 77);
    auto hv = [&](void* p, DType d, std::initializer_list<std::int64_t> s) { return TensorView::contiguous(p, d, s); };
    ASSERT_TRUE(IsOk(c4a_global_topk_indices(
        hv(local.data(), DType::kI32, {n, k}), hv(req.data(), DType::kI32, {n}),
        use_valid ? hv(valid.data(), DType::kU8, {n}) : TensorView{}, table.view(), bs,
        hv(want.data(), DType::kI32, {n, k}), hv(want_lens.data(), DType::kI32, {n}))));

    auto d_local = DeviceArray<std::int32_t>::upload(local);
    d_local.rows = n;
    d_local.cols = k;
    d_local.row_stride = k;
    auto d_req = DeviceArray<std::int32_t>::upload(req);
    auto d_valid = DeviceArray<std::uint8_t>::upload(valid);
    auto d_table = upload_table(table);
    auto out = DeviceArray<std::int32_t>::poisoned(n, k, uniform(rng, 0, 3));
    auto lens = DeviceArray<std::int32_t>::poisoned(n, 1, 1);
    ASSERT_TRUE(IsOk(c4a_global_topk_indices(
        cudatest_context(nullptr), d_local.matrix_view(DType::kI32), d_req.vector_view(DType::kI32),
        use_valid ? d_valid.vector_view(DType::kU8) : TensorView{}, d_table.matrix_view(DType::kI32), bs,
        out.matrix_view(DType::kI32), lens.vector_view(DType::kI32))));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.download();
    lens.download();
    ASSERT_TRUE(rows_equal("global", n, k, [&](auto r, auto c) { return out.at(r, c); },
                           [&](auto r, auto c) { return want[static_cast<std::size_t>(r * k + c)]; }));
    ASSERT_TRUE(rows_equal("lens", n, 1, [&](auto r, auto) { return lens.at(r); },
                           [&](auto r, auto) { return want_lens[static_cast<std::size_t>(r)]; }));
  }
}

TEST(CudaIndexTransforms, V32GlobalMatchesHost) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 7;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 60; ++iter) {
    const std::int64_t n = uniform(rng, 0, 30), k = uniform(rng, 1, 130), reqs = uniform(rng, 1, 4);
    const std::int64_t bs = uniform(rng, 0, 1) == 0 ? 64 : uniform(rng, 1, 50);
    const std::int64_t stride_rows = uniform(rng, 0, 1) == 0 ? 0 : bs + uniform(rng, 0, 9);
    HostTable table;
    table.resize(reqs, uniform(rng, 1, 5), uniform(rng, 0, 2));
    for (auto& v : table.data) v = static_cast<std::int32_t>(uniform(rng, -2, 5000));
    if (uniform(rng, 0, 3) == 0) table.at(0, 0) = 2100000000;
    std::vector<std::int32_t> in(static_cast<std::size_t>(n * k)), req(static_cast<std::size_t>(n));
    for (auto& v : in) v = static_cast<std::int32_t>(uniform(rng, -3, 6 * bs));
    for (auto& v : req) v = static_cast<std::int32_t>(uniform(rng, -1, reqs));
    const bool counts = uniform(rng, 0, 1) == 0;
    std::vector<std::int32_t> want(static_cast<std::size_t>(n * k)), want_counts(static_cast<std::size_t>(n), 5);
    auto hv = [&](void* p, std::initializer_list<std::int64_t> s) { return TensorView::contiguous(p, DType::kI32, s); };
    ASSERT_TRUE(IsOk(v32_request_to_global_indices(hv(in.data(), {n, k}), hv(req.data(), {n}), table.view(), bs,
                                                   stride_rows, hv(want.data(), {n, k}),
                                                   counts ? hv(want_counts.data(), {n}) : TensorView{})));
    auto d_in = DeviceArray<std::int32_t>::upload(in);
    d_in.rows = n;
    d_in.cols = k;
    d_in.row_stride = k;
    auto d_req = DeviceArray<std::int32_t>::upload(req);
    auto d_table = upload_table(table);
    auto out = DeviceArray<std::int32_t>::poisoned(n, k, 2);
    auto got_counts = DeviceArray<std::int32_t>::poisoned(n, 1, 0);
    ASSERT_TRUE(IsOk(v32_request_to_global_indices(cudatest_context(nullptr), d_in.matrix_view(DType::kI32),
                                                   d_req.vector_view(DType::kI32), d_table.matrix_view(DType::kI32), bs,
                                                   stride_rows, out.matrix_view(DType::kI32),
                                                   counts ? got_counts.vector_view(DType::kI32) : TensorView{})));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.download();
    got_counts.download();
    ASSERT_TRUE(rows_equal("out", n, k, [&](auto r, auto c) { return out.at(r, c); },
                           [&](auto r, auto c) { return want[static_cast<std::size_t>(r * k + c)]; }));
    if (counts) {
      ASSERT_TRUE(rows_equal("valid_counts", n, 1, [&](auto r, auto) { return got_counts.at(r); },
                             [&](auto r, auto) { return want_counts[static_cast<std::size_t>(r)]; }));
    }
  }
}

TEST(CudaIndexTransforms, MixedSparseIndicesMatchHost) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 8;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 60; ++iter) {
    const int ratio = std::array<int, 3>{1, 4, 128}[static_cast<std::size_t>(uniform(rng, 0, 2))];
    StepConfig config = random_config(rng);
    BatchShape shape;
    shape.reqs = uniform(rng, 0, 7);
    shape.capacity = uniform(rng, 0, 120);
    shape.max_prefix = config.max_model_len;
    shape.c4 = ratio == 4 ? 1 : -1;
    shape.c128 = ratio == 128 ? 1 : -1;
    HostBatch hb = random_batch(rng, config, shape);
    const std::int64_t t = hb.num_tokens;
    const LayerType type = *layer_type_for_ratio(ratio);
    const std::int64_t topk_width = compressed_topk_width(config, type);
    const std::int64_t width = config.window + (topk_width + 3) / 4 * 4;
    const std::int64_t row_stride = (width + 3) / 4 * 4 + 4 * uniform(rng, 0, 1);
    std::vector<std::int32_t> topk;
    if (ratio == 4) {
      topk.resize(static_cast<std::size_t>(t * topk_width));
      for (auto& v : topk) v = static_cast<std::int32_t>(uniform(rng, -2, 400));
    }
    std::vector<std::int32_t> want(static_cast<std::size_t>(std::max<std::int64_t>(t, 1) * row_stride), 99);
    std::vector<std::int32_t> want_lens(static_cast<std::size_t>(t), 99);
    const TensorView host_topk =
        ratio == 4 ? TensorView::contiguous(topk.data(), DType::kI32, {t, topk_width}) : TensorView{};
    ASSERT_TRUE(IsOk(mixed_sparse_indices(
        hb.desc(), config, ratio, host_topk, TensorView::strided(want.data(), DType::kI32, {t, width}, {row_stride, 1}),
        TensorView::contiguous(want_lens.data(), DType::kI32, {t}))));

    DeviceBatchCopy batch(hb);
    auto d_topk = DeviceArray<std::int32_t>::upload(topk);
    d_topk.rows = t;
    d_topk.cols = topk_width;
    d_topk.row_stride = topk_width;
    auto out = DeviceArray<std::int32_t>::poisoned(t, width, row_stride - width);
    auto lens = DeviceArray<std::int32_t>::poisoned(t, 1, 0);
    ASSERT_TRUE(IsOk(mixed_sparse_indices(cudatest_context(nullptr), batch.desc, config, ratio,
                                               ratio == 4 ? d_topk.matrix_view(DType::kI32) : TensorView{},
                                               out.matrix_view(DType::kI32), lens.vector_view(DType::kI32))));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.download();
    lens.download();
    SCOPED_TRACE(::testing::Message() << "ratio " << ratio << " iter " << iter);
    ASSERT_TRUE(rows_equal("mixed", t, width, [&](auto r, auto c) { return out.at(r, c); },
                           [&](auto r, auto c) { return want[static_cast<std::size_t>(r * row_stride + c)]; }));
    ASSERT_TRUE(rows_equal("mixed lens", t, 1, [&](auto r, auto) { return lens.at(r); },
                           [&](auto r, auto) { return want_lens[static_cast<std::size_t>(r)]; }));
  }
}

// Random page bytes decode deterministically: the device bytes must equal the
// host's for every format, including the rows left untouched.
TEST(CudaIndexTransforms, DequantizeAndGatherMatchesHost) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 9;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (KvFormat format : {KvFormat::kV4Fp8, KvFormat::kV32Fp8, KvFormat::kBf16Rows, KvFormat::kFp8Rows}) {
    for (int iter = 0; iter < 4; ++iter) {
      const KvFormatInfo info = kv_format_info(format);
      const std::int64_t page = uniform(rng, 0, 1) == 0 ? 64 : uniform(rng, 1, 9);
      const std::int64_t pages = uniform(rng, 2, 12);
      const std::int64_t elem = static_cast<std::int64_t>(dtype_size(info.storage_dtype));
      const std::int64_t row_elems = info.row_elements;
      const std::int64_t page_elems = page * row_elems + (uniform(rng, 0, 1) * 64) / elem;  // padded page stride
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(pages * page_elems * elem));
      for (auto& v : bytes) v = static_cast<std::uint8_t>(uniform(rng, 0, 255));
      if (format == KvFormat::kV32Fp8) {  // keep the f32 scales finite powers of two, as a writer does
        for (std::int64_t p = 0; p < pages; ++p) {
          for (std::int64_t e = 0; e < page; ++e) {
            for (int tile = 0; tile < V32Fp8Format::kNumTiles; ++tile) {
              const float s = std::ldexp(1.0f, static_cast<int>(uniform(rng, -20, 5)));
              std::memcpy(&bytes[static_cast<std::size_t>(p * page_elems + V32Fp8Format::scale_offset(e, page) +
                                                          4 * tile)],
                          &s, 4);
            }
          }
        }
      }
      KvCacheView host_cache;
      host_cache.format = format;
      host_cache.fp8_scale = 0.75f;
      host_cache.pages = TensorView::strided(bytes.data(), info.storage_dtype, {pages, page, row_elems},
                                             {page_elems, row_elems, 1});
      const std::int64_t batch = uniform(rng, 1, 4), rows = uniform(rng, 4, 40), offset = uniform(rng, 0, 4);
      std::vector<std::int32_t> seq(static_cast<std::size_t>(batch)), gather(static_cast<std::size_t>(batch));
      HostTable table;
      table.resize(batch, pages, 1);
      for (std::int64_t b = 0; b < batch; ++b) {
        seq[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(uniform(rng, 0, std::min(pages * page, 60L)));
        gather[static_cast<std::size_t>(b)] =
            static_cast<std::int32_t>(uniform(rng, 0, std::min<std::int64_t>(seq[static_cast<std::size_t>(b)],
                                                                              rows - offset)));
        for (std::int64_t c = 0; c < pages; ++c) table.at(b, c) = static_cast<std::int32_t>(uniform(rng, 0, pages - 1));
      }
      const std::int64_t d = info.head_dim;
      const std::int64_t out_stride_m = d + 8;
      std::vector<std::uint16_t> want(static_cast<std::size_t>(batch * rows * out_stride_m), 0xBEEF);
      const TensorView host_out =
          TensorView::strided(want.data(), DType::kBF16, {batch, rows, d}, {rows * out_stride_m, out_stride_m, 1});
      auto hv = [](std::vector<std::int32_t>& v) {
        return TensorView::contiguous(v.data(), DType::kI32, {static_cast<std::int64_t>(v.size())});
      };
      ASSERT_TRUE(IsOk(dequantize_and_gather(host_cache, hv(seq), hv(gather), table.view(), offset, host_out)));

      DeviceArray<std::uint8_t> d_pages = DeviceArray<std::uint8_t>::upload(bytes);
      KvCacheView dev_cache = host_cache;
      dev_cache.pages.data = d_pages.buffer.data();
      dev_cache.pages.device = cudatest::current_cuda_device();
      auto d_seq = DeviceArray<std::int32_t>::upload(seq);
      auto d_gather = DeviceArray<std::int32_t>::upload(gather);
      auto d_table = upload_table(table);
      std::vector<std::uint16_t> initial(want.size(), 0xBEEF);
      auto d_out = DeviceArray<std::uint16_t>::upload(initial);
      TensorView dev_out = host_out;
      dev_out.data = d_out.buffer.data();
      dev_out.device = cudatest::current_cuda_device();
      ASSERT_TRUE(IsOk(dequantize_and_gather(cudatest_context(nullptr), dev_cache, d_seq.vector_view(DType::kI32),
                                                  d_gather.vector_view(DType::kI32), d_table.matrix_view(DType::kI32),
                                                  offset, dev_out)));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::uint16_t> got = download_vector(d_out);
      SCOPED_TRACE(::testing::Message() << kv_format_name(format) << " iter " << iter);
      ASSERT_TRUE(rows_equal("gathered", static_cast<std::int64_t>(want.size()), 1,
                             [&](auto i, auto) { return canonical_bf16(got[static_cast<std::size_t>(i)]); },
                             [&](auto i, auto) { return canonical_bf16(want[static_cast<std::size_t>(i)]); }));
    }
  }
}

// Device values the host would reject: clamped gather lengths, pages outside
// the cache written as zeros, never read.
TEST(CudaIndexTransforms, DequantizeAndGatherMasksBadPages) {
  SKIP_WITHOUT_DEVICE();
  const std::int64_t page = 4, pages = 2, rows = 6;
  std::vector<std::uint16_t> bytes(static_cast<std::size_t>(pages * page * 512), 0x3F80);  // bf16 1.0
  auto d_pages = DeviceArray<std::uint16_t>::upload(bytes);
  KvCacheView cache;
  cache.format = KvFormat::kBf16Rows;
  cache.pages = TensorView::contiguous(d_pages.buffer.data(), DType::kBF16, {pages, page, 512},
                                       cudatest::current_cuda_device());
  auto seq = DeviceArray<std::int32_t>::upload({12, 5});
  auto gather = DeviceArray<std::int32_t>::upload({100, -4});  // clamped to 6 rows, and to 0
  HostTable table;
  table.resize(2, 3, 0);
  table.at(0, 0) = 0;
  table.at(0, 1) = 7;  // outside the cache: rows of positions 4..7 become zeros
  table.at(0, 2) = 1;
  table.at(1, 0) = table.at(1, 1) = table.at(1, 2) = -9;
  auto d_table = upload_table(table);
  auto out = DeviceArray<std::uint16_t>::upload(std::vector<std::uint16_t>(2 * rows * 512, 0xBEEF));
  const TensorView out_view =
      TensorView::contiguous(out.buffer.data(), DType::kBF16, {2, rows, 512}, cudatest::current_cuda_device());
  ASSERT_TRUE(
      IsOk(dequantize_and_gather(cudatest_context(nullptr), cache, seq.vector_view(DType::kI32),
                                 gather.vector_view(DType::kI32), d_table.matrix_view(DType::kI32), 0, out_view)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint16_t> got = download_vector(out);
  // Request 0 gathers positions 6..11: 6, 7 from page 7 (zeros), 8..11 from page 1 (ones).
  for (int i = 0; i < rows; ++i) {
    EXPECT_EQ(got[static_cast<std::size_t>(i * 512)], i < 2 ? 0 : 0x3F80) << "row " << i;
  }
  for (int i = 0; i < rows; ++i) EXPECT_EQ(got[static_cast<std::size_t>((rows + i) * 512)], 0xBEEF);  // untouched
}

// Every chunk of the host plan, with random top-k rows (some out of range).
TEST(CudaIndexTransforms, CombineTopkSwaIndicesMatchHost) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 10;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 40; ++iter) {
    const int ratio = std::array<int, 3>{1, 4, 128}[static_cast<std::size_t>(uniform(rng, 0, 2))];
    StepConfig config = random_config(rng);
    config.prefill_chunk_size = static_cast<int>(uniform(rng, 1, 3));
    BatchShape shape;
    shape.reqs = uniform(rng, 1, 7);
    shape.capacity = uniform(rng, 10, 150);
    shape.max_prefix = config.max_model_len;
    HostBatch hb = random_batch(rng, config, shape);
    const LayerType type = *layer_type_for_ratio(ratio);
    const std::int64_t topk_width = compressed_topk_width(config, type);
    const std::int64_t width = combined_index_width(config, type);
    Expected<std::vector<PrefillChunk>> plan = prefill_chunk_plan(hb.desc(), config, ratio, ChunkPolicy::kFixed);
    ASSERT_TRUE(IsOk(plan.status()));
    DeviceBatchCopy batch(hb);
    for (const PrefillChunk& chunk : *plan) {
      const std::int64_t rows = chunk.token_end - chunk.token_begin;
      const std::int64_t n = chunk.compressed_rows + uniform(rng, 0, 2);
      const std::int64_t m = chunk.workspace_rows + (n - chunk.compressed_rows) + uniform(rng, 0, 3);
      std::vector<std::int32_t> topk;
      if (ratio > 1) {
        topk.resize(static_cast<std::size_t>(rows * topk_width));
        for (auto& v : topk) v = static_cast<std::int32_t>(uniform(rng, -2, chunk.compressed_rows + 3));
      }
      const TensorView host_topk =
          ratio > 1 ? TensorView::contiguous(topk.data(), DType::kI32, {rows, topk_width}) : TensorView{};
      std::vector<std::int32_t> want(static_cast<std::size_t>(rows * width), 55);
      std::vector<std::int32_t> want_lens(static_cast<std::size_t>(rows));
      ASSERT_TRUE(IsOk(combine_topk_swa_indices(hb.desc(), config, ratio, chunk, n, m, host_topk,
                                                TensorView::contiguous(want.data(), DType::kI32, {rows, width}),
                                                TensorView::contiguous(want_lens.data(), DType::kI32, {rows}))));
      auto d_topk = DeviceArray<std::int32_t>::upload(topk);
      d_topk.rows = rows;
      d_topk.cols = topk_width;
      d_topk.row_stride = topk_width;
      auto out = DeviceArray<std::int32_t>::poisoned(rows, width, uniform(rng, 0, 2));
      auto lens = DeviceArray<std::int32_t>::poisoned(rows, 1, 0);
      ASSERT_TRUE(IsOk(combine_topk_swa_indices(cudatest_context(nullptr), batch.desc, config, ratio, chunk, n, m,
                                                     ratio > 1 ? d_topk.matrix_view(DType::kI32) : TensorView{},
                                                     out.matrix_view(DType::kI32), lens.vector_view(DType::kI32))));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out.download();
      lens.download();
      SCOPED_TRACE(::testing::Message() << "ratio " << ratio << " iter " << iter << " chunk " << chunk.req_begin);
      ASSERT_TRUE(rows_equal("combined", rows, width, [&](auto r, auto c) { return out.at(r, c); },
                             [&](auto r, auto c) { return want[static_cast<std::size_t>(r * width + c)]; }));
      ASSERT_TRUE(rows_equal("combined lens", rows, 1, [&](auto r, auto) { return lens.at(r); },
                             [&](auto r, auto) { return want_lens[static_cast<std::size_t>(r)]; }));
    }
  }
}

// Pages a random_batch table of entries seq_len / ratio in pages of `page` uses (ids are a permutation).
std::int64_t table_pages(const HostBatch& hb, std::int64_t ratio, std::int64_t page) {
  std::int64_t pages = 1;
  for (auto s : hb.seq_lens) pages += (s / ratio + page - 1) / page;
  return pages;
}

// A cache of `pages` pages of random bytes.
struct RandomCache {
  std::vector<std::uint8_t> bytes;
  DeviceArray<std::uint8_t> device;
  KvCacheView host, dev;
  RandomCache(KvFormat format, std::int64_t page, std::int64_t pages, std::mt19937_64& rng) {
    const KvFormatInfo info = kv_format_info(format);
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(info.storage_dtype));
    bytes.resize(static_cast<std::size_t>(pages * page * info.row_elements * elem));
    std::uniform_int_distribution<std::uint32_t> byte(0, 255);
    for (auto& v : bytes) v = static_cast<std::uint8_t>(byte(rng));
    host.format = format;
    host.pages = TensorView::contiguous(bytes.data(), info.storage_dtype, {pages, page, info.row_elements});
    device = DeviceArray<std::uint8_t>::upload(bytes);
    dev = host;
    dev.pages.data = device.buffer.data();
    dev.pages.device = cudatest::current_cuda_device();
  }
};

TEST(CudaIndexTransforms, GatherPrefillChunkMatchesHost) {
  SKIP_WITHOUT_DEVICE();
  const std::uint64_t seed = testing::test_seed() + 11;
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 12; ++iter) {
    const int ratio = std::array<int, 3>{1, 4, 128}[static_cast<std::size_t>(iter % 3)];
    StepConfig config = random_config(rng);
    config.prefill_chunk_size = static_cast<int>(uniform(rng, 1, 3));
    BatchShape shape;
    shape.reqs = uniform(rng, 1, 4);
    shape.capacity = uniform(rng, 10, 80);
    shape.max_prefix = 400;
    shape.c4 = ratio == 4 ? 1 : -1;
    shape.c128 = ratio == 128 ? 1 : -1;
    HostBatch hb = random_batch(rng, config, shape);
    RandomCache swa(KvFormat::kBf16Rows, config.swa_page_size, table_pages(hb, 1, config.swa_page_size), rng);
    const std::int64_t group_page = ratio > 1 ? compressed_block_size(config, ratio) : 1;
    RandomCache compressed(KvFormat::kV4Fp8, group_page, ratio > 1 ? table_pages(hb, ratio, group_page) : 1, rng);
    Expected<std::vector<PrefillChunk>> plan = prefill_chunk_plan(hb.desc(), config, ratio, ChunkPolicy::kFixed);
    ASSERT_TRUE(IsOk(plan.status()));
    DeviceBatchCopy batch(hb);
    for (const PrefillChunk& chunk : *plan) {
      const std::int64_t reqs = chunk.req_end - chunk.req_begin;
      const std::int64_t rows = chunk.workspace_rows + uniform(rng, 0, 3);
      const std::int64_t stride_m = 512 + 8 * uniform(rng, 0, 1);
      std::vector<std::uint16_t> want(static_cast<std::size_t>(reqs * rows * stride_m), 0xBEEF);
      const TensorView host_out =
          TensorView::strided(want.data(), DType::kBF16, {reqs, rows, 512}, {rows * stride_m, stride_m, 1});
      ASSERT_TRUE(IsOk(gather_prefill_chunk(hb.desc(), config, ratio, chunk, chunk.compressed_rows, swa.host,
                                            compressed.host, host_out)));
      auto d_out = DeviceArray<std::uint16_t>::upload(std::vector<std::uint16_t>(want.size(), 0xBEEF));
      TensorView dev_out = host_out;
      dev_out.data = d_out.buffer.data();
      dev_out.device = cudatest::current_cuda_device();
      ASSERT_TRUE(IsOk(gather_prefill_chunk(cudatest_context(nullptr), batch.desc, config, ratio, chunk,
                                            chunk.compressed_rows, swa.dev, compressed.dev, dev_out)));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::uint16_t> got = download_vector(d_out);
      SCOPED_TRACE(::testing::Message() << "ratio " << ratio << " iter " << iter << " chunk " << chunk.req_begin);
      ASSERT_TRUE(rows_equal("workspace", static_cast<std::int64_t>(want.size()), 1,
                             [&](auto i, auto) { return canonical_bf16(got[static_cast<std::size_t>(i)]); },
                             [&](auto i, auto) { return canonical_bf16(want[static_cast<std::size_t>(i)]); }));
    }
  }
}

// ---- host-side argument errors (no device needed: nothing is launched) ---------

// A fake device view: the host never dereferences device pointers.
TensorView fake_device(DType dtype, std::initializer_list<std::int64_t> shape) {
  TensorView v = TensorView::contiguous(reinterpret_cast<void*>(std::uintptr_t{1} << 20), dtype, shape,
                                        Device{DeviceKind::kCuda, 0});
  return v;
}

struct FakeStep {
  StepConfig config;
  BatchDescription batch;
  StepMetadataBuffers out;
  TensorView counts = fake_device(DType::kI64, {kStepCountFields});
  FakeStep() {
    const std::int64_t r = 3, t = 16;
    batch.query_lens = fake_device(DType::kI32, {r});
    batch.seq_lens = fake_device(DType::kI32, {r});
    batch.num_tokens = t;
    batch.swa_block_table = fake_device(DType::kI32, {r, 8});
    batch.c128_block_table = fake_device(DType::kI32, {r, 8});
    out.query_start_loc = fake_device(DType::kI32, {r + 1});
    out.token_to_req = fake_device(DType::kI32, {t});
    out.positions = fake_device(DType::kI64, {t});
    out.is_valid_token = fake_device(DType::kU8, {t});
    out.swa_slot_mapping = fake_device(DType::kI64, {t});
    out.swa_indices = fake_device(DType::kI32, {t, config.window});
    out.swa_lens = fake_device(DType::kI32, {t});
    out.prefill_gather_lens = fake_device(DType::kI32, {r});
    out.c128_slot_mapping = fake_device(DType::kI64, {t});
    out.c128a_decode_indices = fake_device(DType::kI32, {t, c128a_width(config)});
    out.c128a_decode_lens = fake_device(DType::kI32, {t});
    out.c128a_prefill_indices = fake_device(DType::kI32, {t, c128a_width(config)});
  }
  Status run() const { return build_step_metadata(cudatest_context(nullptr), batch, config, out, counts); }
};

TEST(CudaMetadataArguments, StepMetadataShapeDtypeDeviceErrors) {
  {
    FakeStep s;
    s.batch.query_lens.dtype = DType::kI64;
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kInvalidArgument, {"batch.query_lens", "i32", "i64"}));
  }
  {
    FakeStep s;
    s.batch.seq_lens.device = Device{};
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kInvalidArgument, {"batch.seq_lens", "cuda", "cpu"}));
  }
  {
    FakeStep s;
    s.batch.num_tokens = -1;
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kOutOfRange, {"batch.num_tokens", "capacity", "-1"}));
  }
  {
    FakeStep s;
    s.batch.swa_block_table = fake_device(DType::kI32, {2, 8});
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kOutOfRange, {"batch.swa_block_table", "at least 3"}));
  }
  {
    FakeStep s;
    s.out.swa_indices = fake_device(DType::kI32, {16, 64});
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kInvalidArgument, {"out.swa_indices", "128", "64"}));
  }
  {
    FakeStep s;
    s.out.prefill_gather_lens = fake_device(DType::kI32, {2});
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kOutOfRange, {"out.prefill_gather_lens", "at least 3"}));
  }
  {
    FakeStep s;
    s.out.c4_slot_mapping = fake_device(DType::kI64, {16});
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kInvalidArgument, {"out.c4_slot_mapping", "absent"}));
  }
  {
    FakeStep s;
    s.counts = fake_device(DType::kI64, {11});
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kOutOfRange, {"counts", "at least 12"}));
  }
  {
    FakeStep s;
    s.out.positions.device.index = 3;
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kInvalidArgument, {"out.positions", "cuda:0", "cuda:3"}));
  }
  {
    FakeStep s;
    s.config.window = 0;
    EXPECT_TRUE(FailsWith(s.run(), StatusCode::kInvalidArgument, {"config.window"}));
  }
}

TEST(CudaMetadataArguments, TransformShapeErrors) {
  const TensorView local = fake_device(DType::kI32, {4, 8});
  const TensorView req = fake_device(DType::kI32, {4});
  const TensorView table = fake_device(DType::kI32, {2, 3});
  EXPECT_TRUE(FailsWith(c4a_global_topk_indices(cudatest_context(nullptr), local, req, {}, table, 0,
                                                fake_device(DType::kI32, {4, 8}), fake_device(DType::kI32, {4})),
                        StatusCode::kInvalidArgument, {"block_size"}));
  EXPECT_TRUE(FailsWith(c4a_global_topk_indices(cudatest_context(nullptr), local, req, {}, table, 64,
                                                fake_device(DType::kI32, {4, 7}), fake_device(DType::kI32, {4})),
                        StatusCode::kInvalidArgument, {"global_out", "8", "7"}));
  EXPECT_TRUE(FailsWith(v32_request_to_global_indices(cudatest_context(nullptr), local, fake_device(DType::kI32, {3}),
                                                      table, 64, 0, fake_device(DType::kI32, {4, 8}), {}),
                        StatusCode::kInvalidArgument, {"req_id", "4", "3"}));
  EXPECT_TRUE(FailsWith(v32_request_to_global_indices(cudatest_context(nullptr), local, req, table, 64, 10,
                                                      fake_device(DType::kI32, {4, 8}), {}),
                        StatusCode::kInvalidArgument, {"block_stride_rows"}));

  FakeStep s;
  EXPECT_TRUE(FailsWith(mixed_sparse_indices(cudatest_context(nullptr), s.batch, s.config, 4, {},
                                             fake_device(DType::kI32, {16, 640}), fake_device(DType::kI32, {16})),
                        StatusCode::kInvalidArgument, {"batch.c4_block_table", "absent"}));
  EXPECT_TRUE(FailsWith(mixed_sparse_indices(cudatest_context(nullptr), s.batch, s.config, 3, {}, {}, {}),
                        StatusCode::kInvalidArgument, {"compress_ratio"}));
  EXPECT_TRUE(FailsWith(mixed_sparse_indices(cudatest_context(nullptr), s.batch, s.config, 1, {},
                                             fake_device(DType::kI32, {16, 130}), fake_device(DType::kI32, {16})),
                        StatusCode::kInvalidArgument, {"out_indices", "128", "130"}));

  KvCacheView cache;
  cache.format = KvFormat::kBf16Rows;
  cache.pages = fake_device(DType::kBF16, {4, 64, 512});
  const TensorView seq = fake_device(DType::kI32, {2});
  const TensorView gtable = fake_device(DType::kI32, {2, 4});
  EXPECT_TRUE(FailsWith(dequantize_and_gather(cudatest_context(nullptr), cache, seq, {}, gtable, 0,
                                              fake_device(DType::kBF16, {2, 10, 576})),
                        StatusCode::kInvalidArgument, {"out", "512", "576"}));
  EXPECT_TRUE(FailsWith(dequantize_and_gather(cudatest_context(nullptr), cache, seq, {}, gtable, 11,
                                              fake_device(DType::kBF16, {2, 10, 512})),
                        StatusCode::kOutOfRange, {"offset", "11"}));
  PrefillChunk chunk;
  chunk.req_begin = 1;
  chunk.req_end = 4;  // past R = 3
  chunk.token_end = 8;
  EXPECT_TRUE(FailsWith(combine_topk_swa_indices(cudatest_context(nullptr), s.batch, s.config, 1, chunk, 0, 16, {},
                                                 fake_device(DType::kI32, {8, 128}), fake_device(DType::kI32, {8})),
                        StatusCode::kOutOfRange, {"chunk", "[1, 4)"}));
  chunk.req_end = 3;
  EXPECT_TRUE(FailsWith(combine_topk_swa_indices(cudatest_context(nullptr), s.batch, s.config, 128, chunk, 0, 16, {},
                                                 fake_device(DType::kI32, {8, 640}), fake_device(DType::kI32, {8})),
                        StatusCode::kInvalidArgument, {"topk", "absent"}));
  EXPECT_TRUE(FailsWith(gather_prefill_chunk(cudatest_context(nullptr), s.batch, s.config, 1, chunk, 11, cache, {},
                                                  fake_device(DType::kBF16, {2, 10, 512})),
                        StatusCode::kOutOfRange, {"compressed_rows", "11"}));
  KvCacheView host_cache = cache;
  host_cache.pages.device = Device{};
  EXPECT_TRUE(FailsWith(dequantize_and_gather(cudatest_context(nullptr), host_cache, seq, {}, gtable, 0,
                                                   fake_device(DType::kBF16, {2, 10, 512})),
                        StatusCode::kInvalidArgument, {"cache.pages", "cuda"}));
}

}  // namespace
}  // namespace smla
