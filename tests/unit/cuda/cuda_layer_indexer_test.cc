// CUDA indexer top-k, grouped output projection and the cuBLASLt wrapper,
// against the float64 reference ops and small cases computed by hand.
// Argument errors are checked without a device (views only claim to be on cuda).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "smla/layer.h"
#include "tests/unit/cuda/cuda_context.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/numeric.h"
#include "src/cuda/common/cublaslt_gemm.h"
#include "tests/common/test_common.h"
#include "testkit/cuda/device_copy.h"
#include "tests/unit/layer/layer_test_util.h"

namespace smla {
namespace {

using cudatest::check_cuda;
using cudatest::copy_to_device;
using cudatest::copy_to_host;
using cudatest::cuda_device_present;
using cudatest::DeviceBuffer;
using cudatest::DeviceView;
using layer_test::Buffer;
using layer_test::kNaN;
using testing::FailsWith;
using testing::IsOk;

constexpr float kInf = std::numeric_limits<float>::infinity();

// A device view that claims cuda:0 without memory: for argument checks only.
TensorView fake_cuda(TensorView view) {
  static std::uint8_t dummy[16];
  view.data = dummy;
  view.device = Device{DeviceKind::kCuda, 0};
  return view;
}

// Every element the device view's storage holds (padding included).
template <class T>
std::vector<T> device_to_vector(const DeviceView& device) {
  std::vector<T> host(device.buffer.bytes() / sizeof(T));
  check_cuda(cudaMemcpy(host.data(), device.view.data, host.size() * sizeof(T), cudaMemcpyDeviceToHost),
             "copy to host");
  return host;
}

// ---------------------------------------------------------------- cuBLASLt wrapper

struct GemmCase {
  int m, n, k, batch;
  DType in, out;
};

TEST(CublasLtGemm, BatchedMatchesHostLoop) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const GemmCase& c :
       {GemmCase{5, 7, 33, 3, DType::kF32, DType::kF32}, GemmCase{1, 9, 64, 1, DType::kF32, DType::kF32},
        GemmCase{6, 5, 40, 2, DType::kBF16, DType::kF32}, GemmCase{3, 8, 24, 4, DType::kBF16, DType::kBF16}}) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " n " << c.n << " k " << c.k << " batch " << c.batch << " "
                                      << dtype_name(c.in) << " -> " << dtype_name(c.out));
    const std::int64_t lda = c.k + 3, ldb = c.k + 1, ldc = c.n + 2;
    const std::int64_t stride_a = c.m * lda + 5, stride_b = c.n * ldb, stride_out = c.m * ldc;
    const bool bf16_in = c.in == DType::kBF16;
    std::vector<float> a(static_cast<std::size_t>(stride_a * c.batch)), b(static_cast<std::size_t>(stride_b * c.batch));
    for (float& x : a) x = bf16_in ? round_to_bf16(uni(rng)) : uni(rng);
    for (float& x : b) x = bf16_in ? round_to_bf16(uni(rng)) : uni(rng);
    auto to_device = [&](const std::vector<float>& values) {
      DeviceBuffer buffer(values.size() * 4);
      if (bf16_in) {
        std::vector<std::uint16_t> bits(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
        check_cuda(cudaMemcpy(buffer.data(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "copy");
      } else {
        check_cuda(cudaMemcpy(buffer.data(), values.data(), values.size() * 4, cudaMemcpyHostToDevice), "copy");
      }
      return buffer;
    };
    DeviceBuffer da = to_device(a), db = to_device(b);
    const std::size_t out_elements = static_cast<std::size_t>(stride_out * c.batch);
    DeviceBuffer dout(out_elements * 4), workspace(cuda::kCublasLtWorkspaceBytes);
    check_cuda(cudaMemset(dout.data(), 0xFF, out_elements * 4), "poison");
    cuda::GemmArgs args;
    args.m = c.m;
    args.n = c.n;
    args.k = c.k;
    args.batch = c.batch;
    args.input_dtype = c.in;
    args.a = da.data();
    args.lda = lda;
    args.batch_stride_a = stride_a;
    args.b = db.data();
    args.ldb = ldb;
    args.batch_stride_b = stride_b;
    args.out_dtype = c.out;
    args.out = dout.data();
    args.ldc = ldc;
    args.batch_stride_out = stride_out;
    args.workspace = workspace.data();
    args.workspace_bytes = workspace.bytes();
    ASSERT_TRUE(IsOk(cuda::cublaslt_gemm(args)));
    check_cuda(cudaDeviceSynchronize(), "sync");
    std::vector<float> out(out_elements);
    if (c.out == DType::kBF16) {
      std::vector<std::uint16_t> bits(out_elements);
      check_cuda(cudaMemcpy(bits.data(), dout.data(), out_elements * 2, cudaMemcpyDeviceToHost), "copy");
      for (std::size_t i = 0; i < out_elements; ++i) out[i] = bf16_to_f32(bits[i]);
    } else {
      check_cuda(cudaMemcpy(out.data(), dout.data(), out_elements * 4, cudaMemcpyDeviceToHost), "copy");
    }
    for (int batch = 0; batch < c.batch; ++batch) {
      for (int i = 0; i < c.m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double expected = 0.0, magnitude = 0.0;
          for (int p = 0; p < c.k; ++p) {
            const double term = static_cast<double>(a[static_cast<std::size_t>(batch * stride_a + i * lda + p)]) *
                                b[static_cast<std::size_t>(batch * stride_b + j * ldb + p)];
            expected += term;
            magnitude += std::fabs(term);
          }
          const double tolerance =
              (c.out == DType::kBF16 ? std::fabs(expected) * 0.0079 : 0.0) + 1e-6 * magnitude + 1e-7;
          ASSERT_NEAR(out[static_cast<std::size_t>(batch * stride_out + i * ldc + j)], expected, tolerance)
              << "batch " << batch << " [" << i << ", " << j << "]";
        }
      }
    }
  }
}

TEST(CublasLtGemm, RejectsBadArgumentsNamingThem) {
  static float dummy[4];
  cuda::GemmArgs args;
  args.m = 2;
  args.n = 2;
  args.k = 2;
  args.a = args.b = dummy;
  args.out = dummy;
  args.lda = args.ldb = args.ldc = 2;
  args.out_dtype = DType::kBF16;  // f32 inputs give f32 only
  EXPECT_TRUE(FailsWith(cuda::cublaslt_gemm(args), StatusCode::kInvalidArgument, {"out_dtype"}));
  args.out_dtype = DType::kF32;
  args.lda = 1;
  EXPECT_TRUE(FailsWith(cuda::cublaslt_gemm(args), StatusCode::kInvalidArgument, {"lda"}));
  args.lda = 2;
  args.input_dtype = DType::kF16;
  EXPECT_TRUE(FailsWith(cuda::cublaslt_gemm(args), StatusCode::kInvalidArgument, {"input_dtype"}));
  args.input_dtype = DType::kF32;
  args.batch = 2;
  args.batch_stride_out = 1;  // the two outputs overlap
  EXPECT_TRUE(FailsWith(cuda::cublaslt_gemm(args), StatusCode::kInvalidArgument, {"batch_stride_out"}));
}

// ---------------------------------------------------------------- output projection

struct ProjectionCase {
  int tokens, padded_heads, heads, groups, rank, hidden;
  DType o_dtype, weight_dtype;
};

// Runs one case on the device and through the float64 reference; returns max |diff| / max |ref|.
void check_projection(const ProjectionCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << "T " << c.tokens << " Hp " << c.padded_heads << " H " << c.heads << " G "
                                    << c.groups << " rank " << c.rank << " hidden " << c.hidden << " o "
                                    << dtype_name(c.o_dtype) << " weights " << dtype_name(c.weight_dtype));
  constexpr int kMaxPositions = 300;
  auto table = RopeTable::create(RopeConfig::compressed(), kMaxPositions);
  ASSERT_TRUE(IsOk(table.status()));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const std::int64_t token_stride = c.padded_heads * 512 + 64;  // padded token rows
  const bool o_bf16 = c.o_dtype == DType::kBF16;
  std::vector<float> o_f32(static_cast<std::size_t>(c.tokens * token_stride), kNaN);
  std::vector<std::uint16_t> o_bits(o_f32.size(), 0x7FC0);  // NaN everywhere not written, heads >= H included
  for (int t = 0; t < c.tokens; ++t) {
    for (int i = 0; i < c.heads * 512; ++i) {
      const float v = round_to_bf16(uni(rng));
      o_f32[static_cast<std::size_t>(t * token_stride + i)] = v;
      o_bits[static_cast<std::size_t>(t * token_stride + i)] = f32_to_bf16(v);
    }
  }
  void* o_data = o_bf16 ? static_cast<void*>(o_bits.data()) : static_cast<void*>(o_f32.data());
  const TensorView o = TensorView::strided(o_data, c.o_dtype, {c.tokens, c.padded_heads, 512}, {token_stride, 512, 1});
  // Positions: random, plus one past the table and one negative (both rotate nothing on the device;
  // the reference sees position 0, an identity rotation).
  Buffer<std::int64_t> device_positions(DType::kI64, {c.tokens}), reference_positions(DType::kI64, {c.tokens});
  std::uniform_int_distribution<std::int64_t> position(0, kMaxPositions - 1);
  for (int t = 0; t < c.tokens; ++t) {
    device_positions.data[static_cast<std::size_t>(t)] = reference_positions.data[static_cast<std::size_t>(t)] =
        position(rng);
  }
  if (c.tokens >= 3) {
    device_positions.data[1] = kMaxPositions + 7;
    device_positions.data[2] = -4;
    reference_positions.data[1] = reference_positions.data[2] = 0;
  }
  const std::int64_t group_width = c.heads / c.groups * 512;
  const float wa_bound = 1.0f / std::sqrt(static_cast<float>(group_width));
  const float wb_bound = 1.0f / std::sqrt(static_cast<float>(c.groups * c.rank));
  Buffer<float> wo_a(DType::kF32, {c.groups, c.rank, group_width}), wo_b(DType::kF32, {c.hidden, c.groups * c.rank});
  for (float& x : wo_a.data) x = round_to_bf16(uni(rng) * wa_bound);
  for (float& x : wo_b.data) x = round_to_bf16(uni(rng) * wb_bound);
  Buffer<std::uint16_t> wo_a_bits(DType::kBF16, {c.groups, c.rank, group_width}),
      wo_b_bits(DType::kBF16, {c.hidden, c.groups * c.rank});
  for (std::size_t i = 0; i < wo_a.data.size(); ++i) wo_a_bits.data[i] = f32_to_bf16(wo_a.data[i]);
  for (std::size_t i = 0; i < wo_b.data.size(); ++i) wo_b_bits.data[i] = f32_to_bf16(wo_b.data[i]);
  const std::int64_t out_stride = c.hidden + 3;
  std::vector<float> reference_out(static_cast<std::size_t>(c.tokens * out_stride), kNaN);
  const TensorView reference_view =
      TensorView::strided(reference_out.data(), DType::kF32, {c.tokens, c.hidden}, {out_stride, 1});

  OutputProjectionArgs host{o,
                            c.heads == c.padded_heads ? 0 : c.heads,
                            reference_positions.view,
                            &*table,
                            wo_a.view,
                            wo_b.view,
                            reference_view};
  ASSERT_TRUE(IsOk(project_output(host, Backend::kReference)));

  const bool bf16_weights = c.weight_dtype == DType::kBF16;
  DeviceView d_o = copy_to_device(o), d_pos = copy_to_device(device_positions.view);
  DeviceView d_wa = copy_to_device(bf16_weights ? wo_a_bits.view : wo_a.view);
  DeviceView d_wb = copy_to_device(bf16_weights ? wo_b_bits.view : wo_b.view);
  std::vector<float> poisoned(reference_out.size(), kNaN);
  DeviceView d_out =
      copy_to_device(TensorView::strided(poisoned.data(), DType::kF32, {c.tokens, c.hidden}, {out_stride, 1}));
  OutputProjectionArgs device = host;
  device.o = d_o.view;
  device.positions = d_pos.view;
  device.wo_a = d_wa.view;
  device.wo_b = d_wb.view;
  device.out = d_out.view;
  auto bytes = project_output_workspace_size(cudatest_context(), device);
  ASSERT_TRUE(IsOk(bytes.status()));
  DeviceBuffer workspace(*bytes);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "stream");
  const Status status = project_output(cudatest_context(stream, workspace.data(), workspace.bytes()), device);
  check_cuda(cudaStreamSynchronize(stream), "sync");
  check_cuda(cudaStreamDestroy(stream), "stream destroy");
  ASSERT_TRUE(IsOk(status));
  std::vector<float> out = device_to_vector<float>(d_out);

  double max_ref = 0.0;
  for (int t = 0; t < c.tokens; ++t) {
    for (int n = 0; n < c.hidden; ++n)
      max_ref = std::max(max_ref,
                         std::fabs(static_cast<double>(reference_out[static_cast<std::size_t>(t * out_stride + n)])));
  }
  // f32: sums of a few thousand f32 products; bf16: the rotated o and z are rounded to bf16 (2^-9 relative each).
  const double tolerance = (bf16_weights ? 1.5e-2 : 2e-5) * max_ref + 1e-6;
  for (int t = 0; t < c.tokens; ++t) {
    for (int n = 0; n < c.hidden; ++n) {
      const std::size_t i = static_cast<std::size_t>(t * out_stride + n);
      ASSERT_FALSE(std::isnan(out[i])) << "unwritten or NaN at [" << t << ", " << n << "]";
      ASSERT_NEAR(out[i], reference_out[i], tolerance) << "[" << t << ", " << n << "]";
    }
    // The row padding past `hidden` is never written.
    for (std::int64_t n = c.hidden; n < out_stride && t + 1 < c.tokens; ++n) {
      ASSERT_TRUE(std::isnan(out[static_cast<std::size_t>(t * out_stride + n)])) << "padding written at token " << t;
    }
  }
}

TEST(CudaProjectOutput, F32WeightsMatchReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (const ProjectionCase& c : {ProjectionCase{3, 4, 4, 2, 16, 24, DType::kF32, DType::kF32},
                                  ProjectionCase{5, 8, 6, 3, 8, 10, DType::kBF16, DType::kF32},
                                  ProjectionCase{1, 2, 1, 1, 12, 7, DType::kF32, DType::kF32},
                                  ProjectionCase{7, 4, 4, 4, 5, 33, DType::kBF16, DType::kF32}}) {
    check_projection(c, rng);
  }
}

TEST(CudaProjectOutput, Bf16WeightsMatchReference) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (const ProjectionCase& c : {ProjectionCase{3, 4, 4, 2, 16, 24, DType::kBF16, DType::kBF16},
                                  ProjectionCase{5, 8, 6, 3, 8, 10, DType::kF32, DType::kBF16},
                                  ProjectionCase{9, 2, 2, 1, 32, 16, DType::kBF16, DType::kBF16}}) {
    check_projection(c, rng);
  }
}

TEST(CudaProjectOutput, ErrorsNameTheArgument) {
  auto table = RopeTable::create(RopeConfig::compressed(), 8);
  ASSERT_TRUE(IsOk(table.status()));
  OutputProjectionArgs args;
  args.o = fake_cuda(TensorView::contiguous(nullptr, DType::kBF16, {2, 4, 512}));
  args.positions = fake_cuda(TensorView::contiguous(nullptr, DType::kI32, {2}));
  args.rope = &*table;
  args.wo_a = fake_cuda(TensorView::contiguous(nullptr, DType::kBF16, {2, 8, 1024}));
  args.wo_b = fake_cuda(TensorView::contiguous(nullptr, DType::kBF16, {16, 16}));
  args.out = fake_cuda(TensorView::contiguous(nullptr, DType::kF32, {2, 16}));
  auto bytes = project_output_workspace_size(cudatest_context(), args);
  ASSERT_TRUE(IsOk(bytes.status()));
  EXPECT_GE(*bytes, cuda::kCublasLtWorkspaceBytes + 2 * 4 * 512 * 2 + 2 * 16 * 2);
  EXPECT_TRUE(FailsWith(project_output(cudatest_context(nullptr, nullptr, *bytes - 1), args),
                        StatusCode::kInvalidArgument, {"workspace", std::to_string(*bytes)}));
  auto expect_error = [&](OutputProjectionArgs bad, const char* name) {
    EXPECT_TRUE(
        FailsWith(project_output(cudatest_context(nullptr, nullptr, 0), bad), StatusCode::kInvalidArgument, {name}))
        << name;
    EXPECT_TRUE(FailsWith(project_output_workspace_size(cudatest_context(), bad).status(), StatusCode::kInvalidArgument,
                          {name}))
        << name;
  };
  OutputProjectionArgs bad = args;
  bad.rope = nullptr;
  expect_error(bad, "rope");
  bad = args;
  bad.o.device = Device{};  // a cpu tensor
  expect_error(bad, "o");
  bad = args;
  bad.num_heads = 5;
  expect_error(bad, "num_heads");
  bad = args;
  bad.positions = fake_cuda(TensorView::contiguous(nullptr, DType::kI32, {3}));
  expect_error(bad, "positions");
  bad = args;
  bad.wo_b = fake_cuda(TensorView::contiguous(nullptr, DType::kF32, {16, 16}));  // dtype differs from wo_a
  expect_error(bad, "wo_b");
  bad = args;
  bad.wo_a = fake_cuda(TensorView::contiguous(nullptr, DType::kBF16, {3, 8, 1024}));  // 3 groups for 4 heads
  expect_error(bad, "wo_a");
  bad = args;
  bad.out = fake_cuda(TensorView::contiguous(nullptr, DType::kBF16, {2, 16}));
  expect_error(bad, "out");
  bad = args;
  bad.out.device.index = 1;
  expect_error(bad, "out");
}

// ---------------------------------------------------------------- indexer top-k

// An indexer key cache whose page stride is `page_stride` bytes (>= content); every byte starts 0xFF (NaN).
struct IndexerCache {
  std::vector<std::uint8_t> bytes;
  IndexerCacheView view;
  IndexerCache(std::int64_t num_pages, std::int64_t page_size, std::int64_t page_stride) {
    bytes.assign(static_cast<std::size_t>(num_pages * page_stride), 0xFF);
    view.pages = TensorView::strided(bytes.data(), DType::kU8, {num_pages, page_size, IndexerFp8Format::kBytesPerToken},
                                     {page_stride, IndexerFp8Format::kBytesPerToken, 1});
  }
  std::uint8_t* codes(std::int64_t slot) {
    const std::int64_t ps = view.page_size();
    return bytes.data() + (slot / ps) * view.pages.stride[0] + IndexerFp8Format::data_offset(slot % ps, ps);
  }
  void set_scale(std::int64_t slot, float scale) {
    const std::int64_t ps = view.page_size();
    std::memcpy(bytes.data() + (slot / ps) * view.pages.stride[0] + IndexerFp8Format::scale_offset(slot % ps, ps),
                &scale, 4);
  }
};

// Device copies of a host top-k call; the output starts as a copy of the (poisoned) host output.
struct DeviceTopk {
  DeviceView q, w, cache, positions, requests, table, out;
  IndexerTopkArgs args;
  explicit DeviceTopk(const IndexerTopkArgs& host)
      : q(copy_to_device(host.q_fp8)),
        w(copy_to_device(host.head_weights)),
        cache(copy_to_device(host.key_cache.pages)),
        positions(copy_to_device(host.positions)),
        requests(copy_to_device(host.token_to_request)),
        table(copy_to_device(host.block_table)),
        out(copy_to_device(host.topk_indices)) {
    args = host;
    args.q_fp8 = q.view;
    args.head_weights = w.view;
    args.key_cache.pages = cache.view;
    args.positions = positions.view;
    args.token_to_request = requests.view;
    args.block_table = table.view;
    args.topk_indices = out.view;
  }
  // Runs the op (workspace from the size query) and returns the rows [T, k].
  std::vector<std::int32_t> run() {
    auto bytes = indexer_topk_workspace_size(cudatest_context(), args);
    EXPECT_TRUE(IsOk(bytes.status()));
    if (!bytes) return {};
    DeviceBuffer workspace(*bytes);
    const Status status = indexer_topk(cudatest_context(nullptr, workspace.data(), workspace.bytes()), args);
    check_cuda(cudaDeviceSynchronize(), "sync");
    EXPECT_TRUE(IsOk(status));
    const std::int64_t tokens = args.topk_indices.shape[0], k = args.topk_indices.shape[1];
    std::vector<std::int32_t> all = device_to_vector<std::int32_t>(out);
    std::vector<std::int32_t> rows;
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t j = 0; j < k; ++j)
        rows.push_back(all[static_cast<std::size_t>(t * args.topk_indices.stride[0] + j)]);
    }
    return rows;
  }
};

std::vector<std::int32_t> host_rows(const IndexerTopkArgs& args, Backend backend) {
  const std::int64_t tokens = args.topk_indices.shape[0], k = args.topk_indices.shape[1];
  std::vector<std::int32_t> out(static_cast<std::size_t>(tokens * k), 77);
  IndexerTopkArgs host = args;
  host.topk_indices = TensorView::contiguous(out.data(), DType::kI32, {tokens, k});
  const Status status = indexer_topk(host, backend);
  EXPECT_TRUE(IsOk(status));
  return out;
}

struct RandomTopkCase {
  int tokens, heads, top_k, page_size, pages_per_request, requests;
  std::int64_t page_stride_pad;  // extra bytes per page (0 with a 16-byte multiple page: the aligned path)
};

TEST(CudaIndexerTopk, RandomMatchesHostOps) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  for (const RandomTopkCase& c : {RandomTopkCase{6, 64, 8, 5, 9, 2, 40}, RandomTopkCase{5, 3, 5, 3, 11, 3, 7},
                                  RandomTopkCase{4, 40, 16, 4, 20, 1, 0}, RandomTopkCase{3, 1, 1, 7, 3, 2, 1}}) {
    SCOPED_TRACE(::testing::Message() << "T " << c.tokens << " H " << c.heads << " k " << c.top_k << " page "
                                      << c.page_size);
    const std::int64_t content = IndexerFp8Format::page_content_bytes(c.page_size);
    const std::int64_t stride = c.page_stride_pad == 0 ? (content + 15) / 16 * 16 : content + c.page_stride_pad;
    const std::int64_t num_pages = c.pages_per_request * c.requests + 2;  // 2 pages nobody references (NaN bytes)
    IndexerCache cache(num_pages, c.page_size, stride);
    std::vector<std::int32_t> pages = layer_test::permuted_pages(num_pages, rng);
    // Table rows padded to a stride of columns + 2 (non-contiguous rows).
    const std::int64_t table_stride = c.pages_per_request + 2;
    std::vector<std::int32_t> table_data(static_cast<std::size_t>(c.requests * table_stride), -1);
    for (int r = 0; r < c.requests; ++r) {
      for (int col = 0; col < c.pages_per_request; ++col) {
        const std::int32_t page = pages[static_cast<std::size_t>(r * c.pages_per_request + col)];
        table_data[static_cast<std::size_t>(r * table_stride + col)] = page;
        for (int e = 0; e < c.page_size; ++e) {
          const std::int64_t slot = std::int64_t{page} * c.page_size + e;
          for (int i = 0; i < 128; ++i) cache.codes(slot)[i] = f32_to_e4m3(uni(rng));
          cache.set_scale(slot, std::ldexp(1.0f, static_cast<int>(rng() % 5) - 2));
        }
      }
    }
    const TensorView table =
        TensorView::strided(table_data.data(), DType::kI32, {c.requests, c.pages_per_request}, {table_stride, 1});
    Buffer<std::uint8_t> q8(DType::kE4M3, {c.tokens, c.heads, 128});
    for (auto& code : q8.data) code = f32_to_e4m3(uni(rng));
    Buffer<float> weights(DType::kF32, {c.tokens, c.heads});
    layer_test::fill_uniform(weights.data, rng, -0.5f, 1.0f);
    Buffer<std::int32_t> positions(DType::kI32, {c.tokens}), requests(DType::kI32, {c.tokens});
    const std::int64_t max_entries = std::int64_t{c.pages_per_request} * c.page_size;
    for (int t = 0; t < c.tokens; ++t) {
      // Token 0: the longest context; token 1: exactly k entries (short-context fill); others random.
      std::int64_t entries = t == 0   ? max_entries
                             : t == 1 ? c.top_k
                                      : static_cast<std::int64_t>(rng() % (max_entries + 1));
      positions.data[static_cast<std::size_t>(t)] =
          static_cast<std::int32_t>(entries * 4 + static_cast<std::int64_t>(rng() % 4) - 1 + (entries == 0 ? 1 : 0));
      requests.data[static_cast<std::size_t>(t)] =
          static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c.requests));
    }
    Buffer<std::int32_t> out(DType::kI32, {c.tokens, c.top_k}, 77);
    const IndexerTopkArgs host{q8.view, weights.view, cache.view, positions.view, requests.view,
                               table,   -1,           false,      out.view};
    const std::vector<std::int32_t> reference = host_rows(host, Backend::kReference);
    DeviceTopk device(host);
    const std::vector<std::int32_t> rows = device.run();
    ASSERT_EQ(rows.size(), reference.size());
    // Continuous random logits: a near-tie at the k-th place is vanishingly rare; the rows must agree.
    for (int t = 0; t < c.tokens; ++t) {
      for (int j = 0; j < c.top_k; ++j) {
        const std::size_t i = static_cast<std::size_t>(t * c.top_k + j);
        ASSERT_EQ(rows[i], reference[i]) << "token " << t << " column " << j << " (position "
                                         << positions.data[static_cast<std::size_t>(t)] << ")";
      }
    }
    EXPECT_EQ(rows, host_rows(host, Backend::kCpu));
  }
}

// Rows longer than one select block (512 entries) with many exact ties (zero keys -> logit 0): the
// radix threshold and the tie order must carry across chunks.
TEST(CudaIndexerTopk, LongRowsWithTiesAcrossChunks) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  constexpr int kPage = 16, kPages = 100, kHeads = 2;
  IndexerCache cache(kPages, kPage, IndexerFp8Format::page_content_bytes(kPage));
  for (std::int64_t slot = 0; slot < kPages * kPage; ++slot) {
    const bool zero = rng() % 10 < 7;
    for (int i = 0; i < 128; ++i) cache.codes(slot)[i] = zero ? 0 : f32_to_e4m3(uni(rng));
    cache.set_scale(slot, 1.0f);
  }
  std::vector<std::int32_t> table_data = layer_test::permuted_pages(kPages, rng);
  const TensorView table = TensorView::contiguous(table_data.data(), DType::kI32, {1, kPages});
  Buffer<std::uint8_t> q8(DType::kE4M3, {3, kHeads, 128});
  for (auto& code : q8.data) code = f32_to_e4m3(uni(rng));
  Buffer<float> w(DType::kF32, {3, kHeads});
  layer_test::fill_uniform(w.data, rng, 0.1f, 1.0f);
  Buffer<std::int32_t> pos(DType::kI32, {3}), to_req(DType::kI32, {3}, 0);
  pos.data = {kPages * kPage * 4 - 1, 1100 * 4 + 2, 800 * 4};
  for (const int top_k : {700, 37}) {
    SCOPED_TRACE(::testing::Message() << "k " << top_k);
    Buffer<std::int32_t> out(DType::kI32, {3, top_k}, 77);
    const IndexerTopkArgs host{q8.view, w.view, cache.view, pos.view, to_req.view, table, -1, false, out.view};
    const std::vector<std::int32_t> reference = host_rows(host, Backend::kReference);
    DeviceTopk device(host);
    EXPECT_EQ(device.run(), reference);
  }
}

// One key per entry: value v_j in dim 0 (other dims 0), scale 1.
struct HandCache {
  IndexerCache cache{4, 3, 3 * 132 + 5};
  std::vector<std::int32_t> table_data{2, 0, 3};
  TensorView table = TensorView::contiguous(table_data.data(), DType::kI32, {1, 3});
  void set(std::int64_t j, float value, float scale = 1.0f, bool all_dims = false) {
    const std::int64_t slot = table_data[static_cast<std::size_t>(j / 3)] * 3 + j % 3;
    std::memset(cache.codes(slot), all_dims ? f32_to_e4m3(value) : 0, 128);
    cache.codes(slot)[0] = f32_to_e4m3(value);
    cache.set_scale(slot, scale);
  }
};

// The host reference is checked against the hand values too (so this runs without a device).
TEST(CudaIndexerTopk, HandTiesAndNaNLogits) {
  const bool device_present = cuda_device_present();
  // Token 0: q = e_0 in one head, weight 1: logits = ReLU(v) = 0.5, 2, 2, 0, 3, 1, 2 (ties at 2).
  // Token 1: all-zero keys -> every logit 0: the first k entries.
  // Token 2: head weight NaN -> every logit NaN: the first k entries.
  // Token 3: two heads (weights 2, -1), q all ones; entries with all-ones codes and an infinite scale
  //          give inf - inf = NaN, the others ReLU(v): logits 1, NaN, 1, 0.5, NaN, 3.
  HandCache ties, zeros, nan_cache;
  const std::vector<float> values{0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 1.0f, 2.0f};
  for (std::size_t j = 0; j < values.size(); ++j) {
    ties.set(static_cast<std::int64_t>(j), values[j]);
    zeros.set(static_cast<std::int64_t>(j), 0.0f);
  }
  const std::vector<float> nan_values{1.0f, 1.0f, 1.0f, 0.5f, 1.0f, 3.0f};
  for (std::size_t j = 0; j < nan_values.size(); ++j) {
    const bool infinite = j == 1 || j == 4;
    nan_cache.set(static_cast<std::int64_t>(j), nan_values[j], infinite ? kInf : 1.0f, infinite);
  }
  struct HandRun {
    HandCache* keys;
    int heads;
    std::vector<float> weights;
    bool ones_query;
    int top_k;
    std::vector<std::int32_t> expected;
  };
  const std::vector<HandRun> runs{
      {&ties, 1, {1.0f}, false, 3, {1, 2, 4}},
      {&ties, 1, {1.0f}, false, 5, {1, 2, 4, 5, 6}},
      {&zeros, 1, {1.0f}, false, 3, {0, 1, 2}},
      {&ties, 1, {kNaN}, false, 3, {0, 1, 2}},
      {&nan_cache, 2, {2.0f, -1.0f}, true, 3, {0, 2, 5}},
      {&nan_cache, 2, {2.0f, -1.0f}, true, 5, {0, 1, 2, 3, 5}},
  };
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const HandRun& run = runs[r];
    SCOPED_TRACE(::testing::Message() << "hand run " << r);
    Buffer<std::uint8_t> q8(DType::kE4M3, {1, run.heads, 128}, run.ones_query ? f32_to_e4m3(1.0f) : 0);
    if (!run.ones_query) q8.data[0] = f32_to_e4m3(1.0f);
    Buffer<float> w(DType::kF32, {1, run.heads});
    w.data = run.weights;
    Buffer<std::int64_t> pos(DType::kI64, {1}, 27);  // 7 entries (6 for the NaN cache: 6 are set, the 7th is NaN bytes)
    if (run.keys == &nan_cache) pos.data[0] = 23;
    Buffer<std::int64_t> to_req(DType::kI64, {1}, 0);
    Buffer<std::int32_t> out(DType::kI32, {1, run.top_k}, 77);
    const IndexerTopkArgs host{q8.view, w.view,  run.keys->cache.view, pos.view, to_req.view, run.keys->table, -1,
                               false,   out.view};
    EXPECT_EQ(host_rows(host, Backend::kReference), run.expected);
    EXPECT_EQ(host_rows(host, Backend::kCpu), run.expected);
    if (!device_present) continue;
    DeviceTopk device(host);
    EXPECT_EQ(device.run(), run.expected);
  }
  if (!device_present) GTEST_SKIP() << "no CUDA device (host reference checked)";
}

// Unreadable entries: a page id out of range (never read: see compute-sanitizer), a request row out of
// range, entries past the block table, negative positions, and tokens with no entry yet.
TEST(CudaIndexerTopk, OutOfRangeValuesAreNeverSelected) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  const auto seed = testing::test_seed();
  SMLA_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  constexpr int kPage = 5, kHeads = 4, kTopK = 3;
  IndexerCache cache(3, kPage, IndexerFp8Format::page_content_bytes(kPage) + 12);
  for (std::int64_t slot = 0; slot < 3 * kPage; ++slot) {
    for (int i = 0; i < 128; ++i) cache.codes(slot)[i] = f32_to_e4m3(uni(rng));
    cache.set_scale(slot, 0.5f);
  }
  // Row 0: page 2 then an out-of-range page; row 1: pages 1, 0; row 2: a negative page then page 0.
  std::vector<std::int32_t> table_data{2, 1000000, 1, 0, -3, 0};
  const TensorView table = TensorView::contiguous(table_data.data(), DType::kI32, {3, 2});
  Buffer<std::uint8_t> q8(DType::kE4M3, {6, kHeads, 128});
  for (auto& code : q8.data) code = f32_to_e4m3(uni(rng));
  Buffer<float> w(DType::kF32, {6, kHeads});
  layer_test::fill_uniform(w.data, rng, 0.1f, 1.0f);
  Buffer<std::int32_t> pos(DType::kI32, {6}), to_req(DType::kI32, {6});
  pos.data = {39, 400, 39, 39, -7, 2};  // 10 entries; 100 entries (capacity is 10); 10; 10; padding; 0 entries
  to_req.data = {0, 1, 9, 2, 0, 0};     // request row 9 does not exist
  Buffer<std::int32_t> out(DType::kI32, {6, kTopK}, 77);
  const IndexerTopkArgs args{q8.view, w.view, cache.view, pos.view, to_req.view, table, -1, false, out.view};
  DeviceTopk device(args);
  const std::vector<std::int32_t> rows = device.run();
  ASSERT_EQ(rows.size(), 18u);

  // Expected rows from the reference on inputs where only the readable entries exist.
  auto reference_row = [&](int t, std::int32_t position, std::vector<std::int32_t> table_row, std::int32_t offset) {
    Buffer<std::int32_t> one_pos(DType::kI32, {1}, position), one_req(DType::kI32, {1}, 0);
    Buffer<std::int32_t> one_out(DType::kI32, {1, kTopK}, 77);
    const TensorView one_table =
        TensorView::contiguous(table_row.data(), DType::kI32, {1, static_cast<std::int64_t>(table_row.size())});
    TensorView q_row = q8.view, w_row = w.view;
    q_row.data = q8.data.data() + t * kHeads * 128;
    q_row.shape[0] = 1;
    w_row.data = w.data.data() + t * kHeads;
    w_row.shape[0] = 1;
    std::vector<std::int32_t> row =
        host_rows({q_row, w_row, cache.view, one_pos.view, one_req.view, one_table, -1, false, one_out.view},
                  Backend::kReference);
    for (auto& j : row) j = j < 0 ? j : j + offset;
    return row;
  };
  auto row_of = [&](int t) {
    return std::vector<std::int32_t>(rows.begin() + t * kTopK, rows.begin() + (t + 1) * kTopK);
  };
  EXPECT_EQ(row_of(0), reference_row(0, 4 * kPage - 1, {2}, 0)) << "entries 5..9 sit on an out-of-range page";
  EXPECT_EQ(row_of(1), reference_row(1, 39, {1, 0}, 0)) << "entries past the table are not selectable";
  EXPECT_EQ(row_of(2), (std::vector<std::int32_t>{-1, -1, -1})) << "request row out of range";
  EXPECT_EQ(row_of(3), reference_row(3, 4 * kPage - 1, {0}, kPage)) << "entries 0..4 sit on a negative page";
  EXPECT_EQ(row_of(4), (std::vector<std::int32_t>{-1, -1, -1})) << "negative position = padding";
  EXPECT_EQ(row_of(5), (std::vector<std::int32_t>{-1, -1, -1})) << "no entry yet";
}

TEST(CudaIndexerTopk, ShortContextRowsNeedNoReadableKeys) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  IndexerCache cache(1, 4, IndexerFp8Format::page_content_bytes(4));
  std::vector<std::int32_t> table_data{-1, -1};  // nothing readable: short rows must not care
  const TensorView table = TensorView::contiguous(table_data.data(), DType::kI32, {1, 2});
  Buffer<std::uint8_t> q8(DType::kE4M3, {4, 2, 128}, 0x38);
  Buffer<float> w(DType::kF32, {4, 2}, 1.0f);
  Buffer<std::int64_t> pos(DType::kI64, {4});
  pos.data = {0, 3, 13, 19};                         // 0, 1, 3 and 5 entries with k = 5
  Buffer<std::int32_t> to_req(DType::kI32, {4}, 5);  // out of range too
  Buffer<std::int32_t> out(DType::kI32, {4, 5}, 77);
  DeviceTopk device({q8.view, w.view, cache.view, pos.view, to_req.view, table, -1, true, out.view});
  EXPECT_EQ(device.run(),
            (std::vector<std::int32_t>{-1, -1, -1, -1, -1, 0, -1, -1, -1, -1, 0, 1, 2, -1, -1, 0, 1, 2, 3, 4}));
}

TEST(CudaIndexerTopk, ErrorsNameTheArgument) {
  IndexerTopkArgs args;
  args.q_fp8 = fake_cuda(TensorView::contiguous(nullptr, DType::kE4M3, {2, 4, 128}));
  args.head_weights = fake_cuda(TensorView::contiguous(nullptr, DType::kF32, {2, 4}));
  args.key_cache.pages = fake_cuda(TensorView::contiguous(nullptr, DType::kU8, {3, 5, 132}));
  args.positions = fake_cuda(TensorView::contiguous(nullptr, DType::kI64, {2}));
  args.token_to_request = fake_cuda(TensorView::contiguous(nullptr, DType::kI32, {2}));
  args.block_table = fake_cuda(TensorView::contiguous(nullptr, DType::kI32, {1, 6}));
  args.topk_indices = fake_cuda(TensorView::contiguous(nullptr, DType::kI32, {2, 8}));
  auto bytes = indexer_topk_workspace_size(cudatest_context(), args);
  ASSERT_TRUE(IsOk(bytes.status()));
  EXPECT_GE(*bytes, std::size_t{2} * 30 * 4);  // [T, columns * page size] keys
  EXPECT_TRUE(FailsWith(indexer_topk(cudatest_context(nullptr, nullptr, *bytes - 1), args),
                        StatusCode::kInvalidArgument, {"workspace"}));
  EXPECT_TRUE(
      FailsWith(indexer_topk(cudatest_context(nullptr, reinterpret_cast<void*>(std::uintptr_t{8}), *bytes), args),
                StatusCode::kInvalidArgument, {"workspace", "aligned"}));
  auto expect_error = [&](IndexerTopkArgs bad, const char* name) {
    EXPECT_TRUE(
        FailsWith(indexer_topk(cudatest_context(nullptr, nullptr, 0), bad), StatusCode::kInvalidArgument, {name}))
        << name;
    EXPECT_TRUE(
        FailsWith(indexer_topk_workspace_size(cudatest_context(), bad).status(), StatusCode::kInvalidArgument, {name}))
        << name;
  };
  IndexerTopkArgs bad = args;
  bad.q_fp8.device = Device{};
  expect_error(bad, "q_fp8");
  bad = args;
  bad.head_weights = fake_cuda(TensorView::contiguous(nullptr, DType::kF32, {2, 3}));
  expect_error(bad, "head_weights");
  bad = args;
  bad.positions = fake_cuda(TensorView::contiguous(nullptr, DType::kF32, {2}));
  expect_error(bad, "positions");
  bad = args;
  bad.token_to_request = TensorView{};
  expect_error(bad, "token_to_request");
  bad = args;
  bad.topk_indices = fake_cuda(TensorView::contiguous(nullptr, DType::kI32, {2, 0}));
  expect_error(bad, "topk_indices");
  bad = args;
  bad.key_cache.pages = TensorView{};
  expect_error(bad, "key_cache");
  bad = args;
  bad.key_cache.pages =
      fake_cuda(TensorView::strided(nullptr, DType::kU8, {3, 5, 132}, {600, 132, 1}));  // page stride < 660
  expect_error(bad, "key_cache");
  bad = args;
  bad.block_table = fake_cuda(TensorView::contiguous(nullptr, DType::kI64, {1, 6}));
  expect_error(bad, "block_table");
  bad = args;
  bad.block_table.device.index = 2;
  expect_error(bad, "block_table");
}

// ---------------------------------------------------------------- timing (not part of the suite)

// Mean device time of `launch` over `iterations` runs after one warm-up, in microseconds.
template <class Launch>
double time_us(Launch launch, int iterations) {
  launch();
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  check_cuda(cudaEventRecord(start), "record");
  for (int i = 0; i < iterations; ++i) launch();
  check_cuda(cudaEventRecord(stop), "record");
  check_cuda(cudaEventSynchronize(stop), "sync");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 1000.0 * ms / iterations;
}

// Run by hand: --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Timing*'.
TEST(CudaLayerIndexerTiming, DISABLED_TimingV4Shapes) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  // Indexer top-k: 64 heads, k = 512, page size 64, contexts of 64K tokens (16K entries).
  for (const int tokens : {1, 64, 512}) {
    constexpr int kHeads = 64, kTopK = 512, kPage = 64;
    constexpr std::int64_t kEntries = 16384, kPagesPerRequest = kEntries / kPage;
    const int requests = tokens == 1 ? 1 : 8;
    IndexerCache cache(kPagesPerRequest * requests, kPage, IndexerFp8Format::page_content_bytes(kPage));
    for (std::int64_t slot = 0; slot < cache.view.num_slots(); ++slot) {
      for (int i = 0; i < 128; ++i) cache.codes(slot)[i] = f32_to_e4m3(uni(rng));
      cache.set_scale(slot, 0.5f);
    }
    std::vector<std::int32_t> table_data = layer_test::permuted_pages(kPagesPerRequest * requests, rng);
    const TensorView table = TensorView::contiguous(table_data.data(), DType::kI32, {requests, kPagesPerRequest});
    Buffer<std::uint8_t> q8(DType::kE4M3, {tokens, kHeads, 128});
    for (auto& code : q8.data) code = f32_to_e4m3(uni(rng));
    Buffer<float> w(DType::kF32, {tokens, kHeads});
    layer_test::fill_uniform(w.data, rng, 0.1f, 1.0f);
    Buffer<std::int32_t> pos(DType::kI32, {tokens}), to_req(DType::kI32, {tokens});
    for (int t = 0; t < tokens; ++t) {
      pos.data[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(kEntries * 4 - 1 - t);
      to_req.data[static_cast<std::size_t>(t)] = t % requests;
    }
    Buffer<std::int32_t> out(DType::kI32, {tokens, kTopK}, 77);
    DeviceTopk device({q8.view, w.view, cache.view, pos.view, to_req.view, table, -1, false, out.view});
    auto bytes = indexer_topk_workspace_size(cudatest_context(), device.args);
    ASSERT_TRUE(IsOk(bytes.status()));
    DeviceBuffer workspace(*bytes);
    const double us = time_us(
        [&] { (void)indexer_topk(cudatest_context(nullptr, workspace.data(), workspace.bytes()), device.args); }, 10);
    std::printf("indexer_topk T=%d H=%d entries=%lld k=%d: %.1f us\n", tokens, kHeads, static_cast<long long>(kEntries),
                kTopK, us);
  }
  // Output projection, V4-like: 64 heads (8 groups), rank 1024, hidden 7168.
  for (const DType weights : {DType::kBF16, DType::kF32}) {
    for (const int tokens : {1, 64, 1024}) {
      constexpr int kHeads = 64, kGroups = 8, kRank = 1024, kHidden = 7168;
      const std::size_t weight_size = dtype_size(weights);
      DeviceBuffer o(static_cast<std::size_t>(tokens) * kHeads * 512 * 2),
          positions(static_cast<std::size_t>(tokens) * 4);
      DeviceBuffer wo_a(std::size_t{kGroups} * kRank * (kHeads / kGroups) * 512 * weight_size);
      DeviceBuffer wo_b(std::size_t{kHidden} * kGroups * kRank * weight_size);
      DeviceBuffer out(static_cast<std::size_t>(tokens) * kHidden * 4);
      check_cuda(cudaMemset(o.data(), 0x3C, o.bytes()), "fill");
      check_cuda(cudaMemset(positions.data(), 0, positions.bytes()), "fill");
      check_cuda(cudaMemset(wo_a.data(), 0x3C, wo_a.bytes()), "fill");
      check_cuda(cudaMemset(wo_b.data(), 0x3C, wo_b.bytes()), "fill");
      auto table = RopeTable::create(RopeConfig::compressed(), 16);
      ASSERT_TRUE(IsOk(table.status()));
      const Device device = cudatest::current_cuda_device();
      OutputProjectionArgs args;
      args.o = TensorView::contiguous(o.data(), DType::kBF16, {tokens, kHeads, 512}, device);
      args.positions = TensorView::contiguous(positions.data(), DType::kI32, {tokens}, device);
      args.rope = &*table;
      args.wo_a = TensorView::contiguous(wo_a.data(), weights, {kGroups, kRank, kHeads / kGroups * 512}, device);
      args.wo_b = TensorView::contiguous(wo_b.data(), weights, {kHidden, kGroups * kRank}, device);
      args.out = TensorView::contiguous(out.data(), DType::kF32, {tokens, kHidden}, device);
      auto bytes = project_output_workspace_size(cudatest_context(), args);
      ASSERT_TRUE(IsOk(bytes.status()));
      DeviceBuffer workspace(*bytes);
      Status status = Status::Ok();
      const double us = time_us(
          [&] { status = project_output(cudatest_context(nullptr, workspace.data(), workspace.bytes()), args); }, 10);
      ASSERT_TRUE(IsOk(status));
      std::printf("project_output %s weights T=%d: %.1f us\n", std::string(dtype_name(weights)).c_str(), tokens, us);
    }
  }
}

}  // namespace
}  // namespace smla
