#include "bench/cuda/gpu_prefill_bench.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "bench/cuda/bench_util.h"
#include "smla/metadata.h"

namespace smla::bench {
namespace {

// H100 SXM5 dense bf16 datasheet figure (shared/spec/kernel_notes.md section 6).
constexpr double kDatasheetBf16Tflops = 989.0;

KvFormat format_of(const PrefillCase& c) {
  auto format = parse_kv_format(c.format);
  if (!format) throw std::runtime_error(format.status().to_string());
  return *format;
}

struct Timing {
  double median_us = 0.0, min_us = 0.0, max_us = 0.0;
};

template <class Enqueue>
Timing time_case(int warmup, int runs, Enqueue&& enqueue) {
  const std::vector<float> times = time_runs(warmup, runs, enqueue);
  return {times[times.size() / 2], times.front(), times.back()};
}

// sparse_prefill over a flat bf16 workspace of s_kv rows; returns the timing.
Timing run_flat(const PrefillCase& c, int d_qk, int warmup, int runs, std::uint64_t seed, DeviceBuffer& q) {
  std::mt19937_64 rng(seed);
  const Device device = cudatest::current_cuda_device();
  DeviceBuffer kv(static_cast<std::size_t>(c.s_kv * d_qk * 2));
  check_cuda(fill_bf16(static_cast<std::uint16_t*>(kv.data()), c.s_kv * d_qk, seed + 7, nullptr), "fill kv");
  std::vector<std::int32_t> indices;
  indices.reserve(static_cast<std::size_t>(c.s_q * c.topk));
  DistinctPicker picker(c.s_kv);
  for (std::int64_t t = 0; t < c.s_q; ++t) {
    picker.pick(c.topk, rng, [&](std::int64_t position) { indices.push_back(static_cast<std::int32_t>(position)); });
  }
  DeviceBuffer d_indices = upload(indices);
  std::vector<float> sink(static_cast<std::size_t>(c.h_q));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& s : sink) s = normal(rng);
  DeviceBuffer d_sink = upload(sink);
  DeviceBuffer out(static_cast<std::size_t>(c.s_q * c.h_q * 512 * 2));
  DeviceBuffer lse(static_cast<std::size_t>(c.s_q * c.h_q * 4));
  DeviceBuffer max_logits(static_cast<std::size_t>(c.s_q * c.h_q * 4));

  SparsePrefillArgs args;
  args.q = TensorView::contiguous(q.data(), DType::kBF16, {c.s_q, c.h_q, d_qk}, device);
  args.kv = TensorView::contiguous(kv.data(), DType::kBF16, {c.s_kv, d_qk}, device);
  args.indices = TensorView::contiguous(d_indices.data(), DType::kI32, {c.s_q, c.topk}, device);
  args.sink = TensorView::contiguous(d_sink.data(), DType::kF32, {c.h_q}, device);
  args.softmax_scale = 1.0f / std::sqrt(512.0f);
  args.out = TensorView::contiguous(out.data(), DType::kBF16, {c.s_q, c.h_q, 512}, device);
  args.lse = TensorView::contiguous(lse.data(), DType::kF32, {c.s_q, c.h_q}, device);
  args.max_logits = TensorView::contiguous(max_logits.data(), DType::kF32, {c.s_q, c.h_q}, device);
  return time_case(warmup, runs, PlannedAttention<SparsePrefillArgs>(args));
}

// One dequantize_and_gather of a staging pass: `gather_len` rows ending at
// position seq_len - 1 of request 0 of `cache` (all seq_len rows when gather_len
// is 0), into the workspace from row `offset`.
struct StagedRows {
  const SyntheticCache* cache = nullptr;
  std::int32_t seq_len = 0;
  std::int32_t gather_len = 0;
  std::int64_t offset = 0;
};

// What a FlashMLA user runs before its bf16 prefill kernel for the same step:
// every row the step's indices can name, dequantized into a bf16 workspace (V4:
// the whole compressed cache, then the span of the queries' windows; V3.2: the
// whole cache), here by smla's device dequantize_and_gather, timed alone.
Timing run_staging(const std::vector<StagedRows>& parts, int d_qk, int warmup, int runs) {
  const Device device = cudatest::current_cuda_device();
  std::int64_t rows = 0;
  for (const StagedRows& part : parts) rows = std::max(rows, part.offset + (part.gather_len > 0 ? part.gather_len : part.seq_len));
  DeviceBuffer workspace(static_cast<std::size_t>(rows * d_qk * 2));
  const TensorView out = TensorView::contiguous(workspace.data(), DType::kBF16, {1, rows, d_qk}, device);
  struct Uploaded {
    DeviceBuffer seq_len, gather_len, table;
    std::int64_t table_columns = 0;
  };
  std::vector<Uploaded> uploaded;
  for (const StagedRows& part : parts) {
    std::vector<std::int32_t> table(part.cache->block_table.begin(),
                                    part.cache->block_table.begin() + part.cache->pages_per_request);
    uploaded.push_back({upload(std::vector<std::int32_t>{part.seq_len}),
                        upload(std::vector<std::int32_t>{part.gather_len}), upload(table),
                        part.cache->pages_per_request});
  }
  Context context = value_or_throw(Context::create(Backend::kCuda));
  return time_case(warmup, runs, [&](cudaStream_t stream) {
    context.set_stream(stream);
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const StagedRows& part = parts[i];
      const Uploaded& u = uploaded[i];
      const TensorView gather_len =
          part.gather_len > 0 ? TensorView::contiguous(u.gather_len.data(), DType::kI32, {1}, device) : TensorView{};
      const Status status = dequantize_and_gather(
          context, part.cache->view(), TensorView::contiguous(u.seq_len.data(), DType::kI32, {1}, device), gather_len,
          TensorView::contiguous(u.table.data(), DType::kI32, {1, u.table_columns}, device), part.offset, out);
      if (!status.ok()) throw std::runtime_error(status.to_string());
    }
  });
}

struct DirectTimings {
  Timing attention;
  Timing staging;  // the bf16 workspace a two-pass (FlashMLA) user fills first
};

// The whole prefill from the FP8 paged caches (one request of s_kv tokens whose
// last s_q tokens are the queries), and the staging pass it saves.
DirectTimings run_direct(const PrefillCase& c, KvFormat format, int d_qk, int warmup, int runs, std::uint64_t seed,
                         DeviceBuffer& q) {
  std::mt19937_64 rng(seed);
  const Device device = cudatest::current_cuda_device();
  const bool v4 = format == KvFormat::kV4Fp8;
  SyntheticCache main_cache = make_cache(format, 1, c.s_kv, v4 ? 256 : 64, rng, seed + 1);
  std::vector<std::int32_t> main_indices, extra_indices;
  SyntheticCache extra_cache;
  std::int64_t main_topk = c.topk;
  if (v4) {
    main_topk = c.window;
    for (std::int64_t t = 0; t < c.s_q; ++t) {
      const std::int64_t position = c.s_kv - c.s_q + t;
      for (std::int64_t w = c.window - 1; w >= 0; --w) {
        main_indices.push_back(position - w >= 0 ? main_cache.slot(0, position - w) : -1);
      }
    }
    const std::int64_t compressed = std::max(c.s_kv / c.compress_ratio, c.topk);
    extra_cache = make_cache(format, 1, compressed, 64, rng, seed + 2);
    DistinctPicker picker(compressed);
    for (std::int64_t t = 0; t < c.s_q; ++t) {
      picker.pick(c.topk, rng, [&](std::int64_t p) { extra_indices.push_back(extra_cache.slot(0, p)); });
    }
  } else {
    DistinctPicker picker(c.s_kv);
    for (std::int64_t t = 0; t < c.s_q; ++t) {
      picker.pick(c.topk, rng, [&](std::int64_t p) { main_indices.push_back(main_cache.slot(0, p)); });
    }
  }
  DeviceBuffer d_main = upload(main_indices), d_extra = upload(extra_indices);
  std::vector<float> sink(static_cast<std::size_t>(c.h_q));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& s : sink) s = normal(rng);
  DeviceBuffer d_sink = upload(sink);
  DeviceBuffer out(static_cast<std::size_t>(c.s_q * c.h_q * 512 * 2));
  DeviceBuffer lse(static_cast<std::size_t>(c.s_q * c.h_q * 4));

  SparseDecodeArgs args;
  args.q = TensorView::contiguous(q.data(), DType::kBF16, {c.s_q, c.h_q, d_qk}, device);
  args.main_cache = main_cache.view();
  args.main_indices = TensorView::contiguous(d_main.data(), DType::kI32, {c.s_q, main_topk}, device);
  if (v4) {
    args.extra_cache = extra_cache.view();
    args.extra_indices = TensorView::contiguous(d_extra.data(), DType::kI32, {c.s_q, c.topk}, device);
  }
  args.sink = TensorView::contiguous(d_sink.data(), DType::kF32, {c.h_q}, device);
  args.softmax_scale = 1.0f / std::sqrt(512.0f);
  args.out = TensorView::contiguous(out.data(), DType::kBF16, {c.s_q, c.h_q, 512}, device);
  args.lse = TensorView::contiguous(lse.data(), DType::kF32, {c.s_q, c.h_q}, device);
  args.queries_per_request = c.s_q;  // one request's prefill
  DirectTimings timings;
  TuningOptions tuning = value_or_throw(TuningOptions::from_environment());
  if (c.staging_rows > 0) {  // the gated path: staging forced, into a buffer the call overflows
    tuning.sm90_staging_rows = c.staging_rows;
    tuning.sm90_stage_rows = TuningOptions::Switch::kOn;
  }
  timings.attention = time_case(warmup, runs, PlannedAttention<SparseDecodeArgs>(args, tuning));
  std::vector<StagedRows> staged;
  if (v4) {
    const std::int32_t compressed = static_cast<std::int32_t>(std::max(c.s_kv / c.compress_ratio, c.topk));
    const std::int32_t span = static_cast<std::int32_t>(std::min<std::int64_t>(c.s_kv, c.s_q + c.window - 1));
    staged.push_back({&extra_cache, compressed, 0, 0});
    staged.push_back({&main_cache, static_cast<std::int32_t>(c.s_kv), span, compressed});
  } else {
    staged.push_back({&main_cache, static_cast<std::int32_t>(c.s_kv), 0, 0});
  }
  timings.staging = run_staging(staged, d_qk, warmup, runs);
  return timings;
}

}  // namespace

std::vector<PrefillCase> load_prefill_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<PrefillCase> cases;
  for (const auto& j : doc.at("cases")) {
    PrefillCase c;
    c.label = j.at("label").get<std::string>();
    c.mode = j.value("mode", std::string("flat"));
    c.format = j.value("format", std::string("v4-fp8"));
    c.s_q = j.value("s_q", 4096);
    c.h_q = j.at("h_q");
    c.s_kv = j.at("s_kv");
    c.topk = j.at("topk");
    c.window = j.value("window", 0);
    c.compress_ratio = j.value("compress_ratio", 4);
    c.staging_rows = j.value("staging_rows", std::int64_t{-1});
    c.peer_us = j.value("peer_us", 0.0);
    if (c.mode != "flat" && c.mode != "direct") throw std::runtime_error("prefill case mode must be flat or direct");
    cases.push_back(c);
  }
  return cases;
}

nlohmann::json run_prefill_case(const PrefillCase& c, int warmup, int runs, std::uint64_t seed, double ceiling_tflops) {
  const KvFormat format = format_of(c);
  const int d_qk = kv_format_info(format).head_dim;
  DeviceBuffer q(static_cast<std::size_t>(c.s_q * c.h_q * d_qk * 2));
  check_cuda(fill_bf16(static_cast<std::uint16_t*>(q.data()), c.s_q * c.h_q * d_qk, seed + 3, nullptr), "fill q");
  Timing timing;
  Timing staging;
  if (c.mode == "flat") {
    timing = run_flat(c, d_qk, warmup, runs, seed, q);
  } else {
    const DirectTimings direct = run_direct(c, format, d_qk, warmup, runs, seed, q);
    timing = direct.attention;
    staging = direct.staging;
  }
  // FlashMLA prefill basis: FLOP = 2 * s_q * attended * h_q * (d_qk + d_v); a
  // window entry before position 0 (-1) is not attended.
  const std::int64_t window = c.mode == "direct" && format == KvFormat::kV4Fp8 ? c.window : 0;
  double attended = static_cast<double>(c.s_q) * static_cast<double>(c.topk);
  for (std::int64_t t = 0; t < c.s_q && window > 0; ++t) {
    attended += static_cast<double>(std::min<std::int64_t>(window, c.s_kv - c.s_q + t + 1));
  }
  const double flop = 2.0 * attended * static_cast<double>(c.h_q) * (d_qk + 512);
  const double tflops = flop / (timing.median_us * 1e-6) / 1e12;
  return {{"label", c.label}, {"mode", c.mode}, {"format", c.format}, {"s_q", c.s_q}, {"h_q", c.h_q},
          {"s_kv", c.s_kv}, {"topk", c.topk}, {"window", window}, {"staging_rows", c.staging_rows},
          {"median_us", timing.median_us},
          {"min_us", timing.min_us}, {"max_us", timing.max_us}, {"runs", runs}, {"flop", flop},
          {"tflops", tflops}, {"pct_mma_sync_ceiling", 100.0 * tflops / ceiling_tflops},
          {"pct_datasheet_bf16", 100.0 * tflops / kDatasheetBf16Tflops}, {"peer_us", c.peer_us},
          {"vs_peer_throughput", c.peer_us > 0 ? c.peer_us / timing.median_us : 0.0},
          // direct mode: smla's dequantize_and_gather of the rows a two-pass user stages (0 for flat)
          {"staging_us", staging.median_us}};
}

}  // namespace smla::bench
