// smla_bench_cuda: the GPU decode set (bench/cases/gpu.json, see
// shared/bench/cases.md), then the prefill set (gpu_prefill.json,
// gpu_prefill_bench.h) and the measured ceilings (mma.sync, cuBLASLt GEMM, row gathers into shared
// memory), on the cuda backend through the explicit-workspace
// API. Per case: synthetic random caches filled on the device, random distinct
// indices per token through random block tables, sink on; per run a 256 MB
// L2-flush memset, then CUDA events around the attention (+ combine) kernels;
// median of --runs runs after --warmup runs. Reports us, TFLOPS, GB/s on the
// FlashMLA counting basis, the share of the measured H100 ceilings and the
// throughput relative to the FlashMLA figure stored with the case. Cases with
// b <= --check-max-b are also compared with the float64 reference backend.
// MTP cases ("mtp": true) use real decode index shapes instead: each token's
// main window ends at its own position (consecutive tokens' windows overlap
// W - 1 of W), and a share "extra_shared" of each token's extra entries is
// common to the request's tokens, as an indexer picks; they are timed packed
// (queries_per_request = s_q, the reported us) and unpacked (unpacked_us).
//
//   smla_bench_cuda [--cases FILE] [--prefill-cases FILE] [--no-decode] [--no-prefill] [--json OUT]
//                   [--runs N] [--warmup N] [--filter TEXT] [--b N] [--check-max-b N] [--tma-row-probe]
// --filter runs the cases whose label contains TEXT, or, as "=LABEL", that label alone.
// SMLA_BENCH_LENGTH_ORDER=desc|asc gives the random extra lengths to the requests longest
// (shortest) first: the same work in another block order (docs/PERF.md, session 31).
// The timed calls read a token order an untimed first call wrote (SparseDecodeArgs::token_order, as a
// step's later layers do); SMLA_BENCH_TOKEN_ORDER=call times calls that compute their own.
// SMLA_BENCH_FULL_LENGTHS=1 passes the fixed-length cases' extra lengths, all full (a C4A layer
// past 2K tokens of context): what a call that passes lengths pays over one that passes none.
// --tma-row-probe runs only bench/cuda/tma_row_probe.h's probe (a process of its own:
// a box the device refuses may leave the context unusable).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cuda/bench_util.h"
#include "bench/cuda/gather_ceiling.h"
#include "bench/cuda/tma_row_probe.h"
#include "bench/cuda/gpu_prefill_bench.h"
#include "bench/cuda/mma_ceiling.h"
#include "smla/attention.h"
#include "testkit/cuda/device_copy.h"
#include "testkit/testkit.h"

namespace smla::bench {
namespace {

// --filter: a label containing `filter`, or exactly the label after a leading '='.
bool label_selected(const std::string& filter, const std::string& label) {
  if (filter.empty()) return true;
  if (filter.front() == '=') return label == filter.substr(1);
  return label.find(filter) != std::string::npos;
}

constexpr double kMeasuredCopyTBps = 3.0;     // H100 device-to-device copy, read + write
constexpr double kMeasuredBf16Tflops = 800.0;  // H100 8192^3 bf16 GEMM

struct Options {
  std::string cases_path = std::string(SMLA_BENCH_CASES_DIR) + "/gpu.json";
  std::string prefill_cases_path = std::string(SMLA_BENCH_CASES_DIR) + "/gpu_prefill.json";
  bool decode = true;
  bool prefill = true;
  std::string json_path = "gpu_bench.json";
  bool tma_row_probe = false;
  int runs = 30;
  int warmup = 5;
  int check_max_b = 2;
  std::string filter;
  std::int64_t only_b = 0;  // 0: every b
  bool order_per_call = false;  // SMLA_BENCH_TOKEN_ORDER=call: no step token order (time_decode)
};

struct Case {
  std::string label;
  std::int64_t b = 1, s_q = 1, h_q = 64;
  KvFormat format = KvFormat::kV4Fp8;
  std::int64_t main_topk = 128, main_page = 64, main_context = 16384;
  std::int64_t extra_topk = 0, extra_page = 64, extra_context = 16384;
  bool random_extra_lengths = false;
  bool mtp = false;           // windows and shared extra entries as in MTP decode; timed packed and unpacked
  double extra_shared = 0.0;  // mtp: share of each token's extra entries common to its request
  double peer_us = 0.0;
};

// Sliding windows: token t of a request sits at position context - s_q + t and
// attends the topk positions ending at itself (consecutive windows overlap).
std::vector<std::int32_t> make_window_indices(const SyntheticCache& cache, std::int64_t b, std::int64_t s_q,
                                              std::int64_t topk, std::int64_t context) {
  std::vector<std::int32_t> indices;
  indices.reserve(static_cast<std::size_t>(b * s_q * topk));
  for (std::int64_t r = 0; r < b; ++r) {
    for (std::int64_t t = 0; t < s_q; ++t) {
      const std::int64_t last = context - s_q + t;
      for (std::int64_t k = 0; k < topk; ++k) {
        const std::int64_t position = last - topk + 1 + k;
        indices.push_back(position < 0 ? -1 : cache.slot(r, position));
      }
    }
  }
  return indices;
}

// Per request, topk distinct "shared" positions and topk distinct fresh ones;
// entry k of each token is the shared k-th with probability `shared`, else a
// fresh position (a token-dependent rotation of the fresh set, distinct in the row).
std::vector<std::int32_t> make_shared_indices(const SyntheticCache& cache, std::int64_t b, std::int64_t s_q,
                                              std::int64_t topk, std::int64_t context, double shared,
                                              std::mt19937_64& rng) {
  std::vector<std::int32_t> indices;
  indices.reserve(static_cast<std::size_t>(b * s_q * topk));
  DistinctPicker picker(context);
  std::bernoulli_distribution is_shared(shared);
  for (std::int64_t r = 0; r < b; ++r) {
    std::vector<std::int32_t> pool;
    picker.pick(std::min(2 * topk, context), rng, [&](std::int64_t position) { pool.push_back(cache.slot(r, position)); });
    const std::int64_t fresh = static_cast<std::int64_t>(pool.size()) - topk;
    for (std::int64_t t = 0; t < s_q; ++t) {
      for (std::int64_t k = 0; k < topk; ++k) {
        const bool take_shared = fresh <= 0 || is_shared(rng);
        indices.push_back(take_shared ? pool[static_cast<std::size_t>(k)]
                                      : pool[static_cast<std::size_t>(topk + (k + 131 * t) % fresh)]);
      }
    }
  }
  return indices;
}

// Random distinct positions of each token's request mapped to global slots.
std::vector<std::int32_t> make_indices(const SyntheticCache& cache, std::int64_t b, std::int64_t s_q,
                                       std::int64_t topk, std::int64_t context, std::mt19937_64& rng) {
  std::vector<std::int32_t> indices;
  indices.reserve(static_cast<std::size_t>(b * s_q * topk));
  DistinctPicker picker(context);
  for (std::int64_t r = 0; r < b; ++r) {
    for (std::int64_t t = 0; t < s_q; ++t) {
      picker.pick(topk, rng, [&](std::int64_t position) { indices.push_back(cache.slot(r, position)); });
    }
  }
  return indices;
}

// Distinct attended slots (positions >= length count as one -1 entry, as FlashMLA's test does).
std::int64_t retrieved_tokens(const std::vector<std::int32_t>& indices, std::int64_t topk,
                              const std::vector<std::int32_t>* lengths) {
  std::unordered_set<std::int32_t> distinct;
  const std::int64_t tokens = static_cast<std::int64_t>(indices.size()) / std::max<std::int64_t>(topk, 1);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t len = lengths == nullptr ? topk : (*lengths)[static_cast<std::size_t>(t)];
    for (std::int64_t k = 0; k < topk; ++k) distinct.insert(k < len ? indices[static_cast<std::size_t>(t * topk + k)] : -1);
  }
  return static_cast<std::int64_t>(distinct.size());
}

nlohmann::json run_case(const Case& c, const Options& o, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::int64_t T = c.b * c.s_q;
  const int d_qk = kv_format_info(c.format).head_dim;
  const int d_v = kv_format_info(c.format).value_dim;
  const Device device = cudatest::current_cuda_device();

  SyntheticCache main_cache = make_cache(c.format, c.b, c.main_context, c.main_page, rng, seed + 1);
  std::vector<std::int32_t> main_indices = c.mtp ? make_window_indices(main_cache, c.b, c.s_q, c.main_topk, c.main_context)
                                                 : make_indices(main_cache, c.b, c.s_q, c.main_topk, c.main_context, rng);
  const bool has_extra = c.extra_topk > 0;
  SyntheticCache extra_cache;
  std::vector<std::int32_t> extra_indices, extra_lengths;
  if (has_extra) {
    extra_cache = make_cache(c.format, c.b, c.extra_context, c.extra_page, rng, seed + 2);
    extra_indices = c.mtp ? make_shared_indices(extra_cache, c.b, c.s_q, c.extra_topk, c.extra_context, c.extra_shared, rng)
                          : make_indices(extra_cache, c.b, c.s_q, c.extra_topk, c.extra_context, rng);
    if (c.random_extra_lengths) {
      std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(c.extra_topk));
      std::vector<std::int32_t> request_lengths(static_cast<std::size_t>(c.b));
      for (std::int32_t& len : request_lengths) len = pick(rng);
      // A diagnostic of the block order: the same lengths given to the requests longest
      // first ("desc", the order a longest-first schedule would run them) or shortest first ("asc").
      const char* order = std::getenv("SMLA_BENCH_LENGTH_ORDER");
      if (order != nullptr && std::string(order) == "desc") std::sort(request_lengths.rbegin(), request_lengths.rend());
      if (order != nullptr && std::string(order) == "asc") std::sort(request_lengths.begin(), request_lengths.end());
      for (const std::int32_t len : request_lengths) {
        for (std::int64_t t = 0; t < c.s_q; ++t) extra_lengths.push_back(len);
      }
    } else if (const char* full = std::getenv("SMLA_BENCH_FULL_LENGTHS"); full != nullptr && std::string(full) == "1") {
      extra_lengths.assign(static_cast<std::size_t>(T), static_cast<std::int32_t>(c.extra_topk));
    }
  }
  std::vector<float> sink(static_cast<std::size_t>(c.h_q));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& s : sink) s = normal(rng);

  DeviceBuffer q(static_cast<std::size_t>(T * c.h_q * d_qk * 2));
  check_cuda(fill_bf16(static_cast<std::uint16_t*>(q.data()), T * c.h_q * d_qk, seed + 3, nullptr), "fill q");
  DeviceBuffer d_main_indices = upload(main_indices);
  DeviceBuffer d_extra_indices = upload(extra_indices);
  DeviceBuffer d_extra_lengths = upload(extra_lengths);
  DeviceBuffer d_sink = upload(sink);
  DeviceBuffer out(static_cast<std::size_t>(T * c.h_q * d_v * 2));
  DeviceBuffer lse(static_cast<std::size_t>(T * c.h_q * 4));

  SparseDecodeArgs args;
  args.q = TensorView::contiguous(q.data(), DType::kBF16, {T, c.h_q, d_qk}, device);
  args.main_cache = main_cache.view();
  args.main_indices = TensorView::contiguous(d_main_indices.data(), DType::kI32, {T, c.main_topk}, device);
  if (has_extra) {
    args.extra_cache = extra_cache.view();
    args.extra_indices = TensorView::contiguous(d_extra_indices.data(), DType::kI32, {T, c.extra_topk}, device);
    if (!extra_lengths.empty()) args.extra_lengths = TensorView::contiguous(d_extra_lengths.data(), DType::kI32, {T}, device);
  }
  args.sink = TensorView::contiguous(d_sink.data(), DType::kF32, {c.h_q}, device);
  args.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d_qk == 576 ? 512 : d_qk));
  args.out = TensorView::contiguous(out.data(), DType::kBF16, {T, c.h_q, d_v}, device);
  args.lse = TensorView::contiguous(lse.data(), DType::kF32, {T, c.h_q}, device);

  // The median of timed runs with the given packing hint, and that call's workspace. The step's token
  // order (SparseDecodeArgs::token_order) is written by an untimed first call and read by the timed
  // ones, as a step's later layers would (FlashMLA's scheduler metadata is computed once, untimed);
  // SMLA_BENCH_TOKEN_ORDER=call times calls that order their tokens themselves.
  DeviceBuffer step_order(static_cast<std::size_t>(T) * sizeof(std::int32_t));
  std::string plan;  // the timed call's AttentionPlan::describe()
  auto time_decode = [&](std::int64_t queries_per_request, std::size_t* bytes_used) {
    args.queries_per_request = queries_per_request;
    args.token_order = TensorView{};
    args.token_order_ready = false;
    if (!o.order_per_call) {
      args.token_order = TensorView::contiguous(step_order.data(), DType::kI32, {T}, device);
      PlannedAttention<SparseDecodeArgs> first_layer(args);
      first_layer(nullptr);
      check_cuda(cudaDeviceSynchronize(), "the step's first call");
      args.token_order_ready = true;
    }
    PlannedAttention<SparseDecodeArgs> call(args);
    std::vector<float> runs = time_runs(o.warmup, o.runs, call);
    *bytes_used = call.plan().workspace_bytes();
    plan = call.plan().describe();
    return runs;
  };
  std::size_t unpacked_workspace = 0;
  double unpacked_us = 0.0;
  if (c.mtp) {
    const std::vector<float> unpacked_times = time_decode(1, &unpacked_workspace);
    unpacked_us = unpacked_times[unpacked_times.size() / 2];
  }
  std::size_t workspace_bytes = 0;
  const std::vector<float> times = time_decode(c.mtp ? c.s_q : 1, &workspace_bytes);
  const double median_us = times[times.size() / 2];

  // FlashMLA counting basis.
  std::int64_t attended = T * c.main_topk;
  if (has_extra) {
    if (c.random_extra_lengths) {
      for (std::int32_t len : extra_lengths) attended += len;
    } else {
      attended += T * c.extra_topk;
    }
  }
  const std::int64_t token_bytes = c.format == KvFormat::kV4Fp8 ? 576 : 656;
  std::int64_t retrieved = retrieved_tokens(main_indices, c.main_topk, nullptr);
  if (has_extra) retrieved += retrieved_tokens(extra_indices, c.extra_topk, c.random_extra_lengths ? &extra_lengths : nullptr);
  const double flop = 2.0 * static_cast<double>(c.h_q) * static_cast<double>(attended) * (d_qk + d_v);
  const double bytes = 2.0 * T * c.h_q * d_qk + static_cast<double>(retrieved) * token_bytes + 2.0 * T * c.h_q * d_v;
  const double true_bytes = static_cast<double>(retrieved) * kv_format_info(c.format).bytes_per_token +
                            4.0 * T * (c.main_topk + c.extra_topk) + 2.0 * T * c.h_q * d_qk + 2.0 * T * c.h_q * d_v +
                            2.0 * static_cast<double>(workspace_bytes);
  const double tflops = flop / (median_us * 1e-6) / 1e12;
  const double gbps = bytes / (median_us * 1e-6) / 1e9;

  nlohmann::json result = {{"label", c.label}, {"b", c.b}, {"s_q", c.s_q}, {"h_q", c.h_q},
                           {"format", std::string(kv_format_name(c.format))}, {"main_topk", c.main_topk},
                           {"extra_topk", c.extra_topk}, {"token_order", o.order_per_call ? "call" : "step"},
                           {"median_us", median_us}, {"min_us", times.front()},
                           {"max_us", times.back()}, {"runs", o.runs}, {"tflops", tflops}, {"gbps", gbps},
                           {"true_gbps", true_bytes / (median_us * 1e-6) / 1e9},
                           {"pct_copy_ceiling", 100.0 * gbps / (kMeasuredCopyTBps * 1e3)},
                           {"pct_gemm_ceiling", 100.0 * tflops / kMeasuredBf16Tflops}, {"flop", flop},
                           {"bytes", bytes}, {"workspace_bytes", workspace_bytes}, {"peer_us", c.peer_us},
                           {"vs_peer_throughput", c.peer_us > 0 ? c.peer_us / median_us : 0.0},
                           {"plan", plan}};
  if (c.mtp) {
    result["packed"] = true;
    result["unpacked_us"] = unpacked_us;
    result["unpacked_workspace_bytes"] = unpacked_workspace;
    result["extra_shared"] = c.extra_shared;
  }

  if (c.b <= o.check_max_b) {  // the float64 reference on host copies of the same bytes
    std::vector<std::uint8_t> h_q = download(q), h_main = download(main_cache.pages), h_out = download(out),
                              h_lse = download(lse);
    std::vector<std::uint8_t> h_extra = has_extra ? download(extra_cache.pages) : std::vector<std::uint8_t>{};
    SparseDecodeArgs host = args;
    host.token_order = TensorView{};  // the device's, and a hint the reference has no use for
    host.token_order_ready = false;
    host.q = on_host(args.q, h_q.data());
    host.main_cache.pages = on_host(args.main_cache.pages, h_main.data());
    host.main_indices = on_host(args.main_indices, main_indices.data());
    if (has_extra) {
      host.extra_cache->pages = on_host(args.extra_cache->pages, h_extra.data());
      host.extra_indices = on_host(args.extra_indices, extra_indices.data());
      if (!extra_lengths.empty()) host.extra_lengths = on_host(args.extra_lengths, extra_lengths.data());
    }
    host.sink = on_host(args.sink, sink.data());
    testkit::HostTensor want_out = testkit::HostTensor::zeros(DType::kBF16, {T, c.h_q, d_v});
    testkit::HostTensor want_lse = testkit::HostTensor::zeros(DType::kF32, {T, c.h_q});
    host.out = want_out.view();
    host.lse = want_lse.view();
    const Status status = sparse_decode(host, Backend::kReference);
    if (!status.ok()) throw std::runtime_error("reference: " + status.to_string());
    const testkit::ErrorStats out_stats =
        testkit::compare_bf16(on_host(args.out, h_out.data()), want_out.view(), testkit::Tolerance{2e-2, 2e-2, 1e-4});
    const testkit::ErrorStats lse_stats =
        testkit::compare_f32(on_host(args.lse, h_lse.data()), want_lse.view(), testkit::Tolerance{2e-3, 1e-4, 1e-6});
    result["check"] = {{"out_pass", out_stats.passed()}, {"out", out_stats.to_string()},
                       {"lse_pass", lse_stats.passed()}, {"lse", lse_stats.to_string()}};
  }
  return result;
}

std::vector<Case> load_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& j : doc.at("cases")) {
    Case c;
    c.label = j.at("label").get<std::string>();
    c.b = j.at("b");
    c.s_q = j.at("s_q");
    c.h_q = j.at("h_q");
    if (j.contains("format")) {
      auto format = parse_kv_format(j.at("format").get<std::string>());
      if (!format) throw std::runtime_error(format.status().to_string());
      c.format = *format;
    }
    c.main_topk = j.at("main_topk");
    c.main_page = j.value("main_page", 64);
    c.main_context = j.value("main_context", 16384);
    c.extra_topk = j.value("extra_topk", 0);
    c.extra_page = j.value("extra_page", 64);
    c.extra_context = j.value("extra_context", 16384);
    c.random_extra_lengths = j.value("random_extra_lengths", false);
    c.mtp = j.value("mtp", false);
    c.extra_shared = j.value("extra_shared", 0.0);
    c.peer_us = j.value("peer_us", 0.0);
    cases.push_back(c);
  }
  return cases;
}

int main_impl(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--cases" && has_value) {
      o.cases_path = argv[++i];
    } else if (arg == "--prefill-cases" && has_value) {
      o.prefill_cases_path = argv[++i];
    } else if (arg == "--no-prefill") {
      o.prefill = false;
    } else if (arg == "--no-decode") {
      o.decode = false;
    } else if (arg == "--json" && has_value) {
      o.json_path = argv[++i];
    } else if (arg == "--runs" && has_value) {
      o.runs = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--warmup" && has_value) {
      o.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (arg == "--filter" && has_value) {
      o.filter = argv[++i];
    } else if (arg == "--b" && has_value) {
      o.only_b = std::atoll(argv[++i]);
    } else if (arg == "--check-max-b" && has_value) {
      o.check_max_b = std::atoi(argv[++i]);
    } else if (arg == "--tma-row-probe") {
      o.tma_row_probe = true;
    } else {
      std::fprintf(stderr,
                   "usage: smla_bench_cuda [--cases FILE] [--prefill-cases FILE] [--no-decode] [--no-prefill] [--json OUT] "
                   "[--runs N] [--warmup N] [--filter TEXT] [--b N] [--check-max-b N] [--tma-row-probe]\n"
                   "unknown or incomplete argument: %s\n",
                   arg.c_str());
      return 2;
    }
  }
  if (const char* order = std::getenv("SMLA_BENCH_TOKEN_ORDER"); order != nullptr) {
    if (std::string(order) != "call" && std::string(order) != "step") {
      std::fprintf(stderr, "SMLA_BENCH_TOKEN_ORDER: expected step or call, got %s\n", order);
      return 2;
    }
    o.order_per_call = std::string(order) == "call";
  }
  if (!cudatest::cuda_device_present()) {
    std::fprintf(stderr, "smla_bench_cuda: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "properties");
  nlohmann::json report = {{"device", prop.name}, {"sm_count", prop.multiProcessorCount}, {"results", nlohmann::json::array()}};
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (o.tma_row_probe) {
    for (const std::int64_t pool_rows : {std::int64_t{8192}, std::int64_t{131072}}) {
      const TmaRowProbe probe = probe_tma_row_gathers(pool_rows, 3, 20);
      if (!probe.ran) {
        std::printf("tma row probe: not run (%s)\n", probe.skipped.c_str());
        break;
      }
      std::printf("tma row probe, %lld MB pool: %lld of %lld 16-byte units misplaced (0: one-row boxes land swizzled "
                  "by address); gathers %.1f GB/s an SM, multicast by CTA pairs %.1f GB/s an SM\n",
                  static_cast<long long>(pool_rows / 1024), static_cast<long long>(probe.misplaced_units),
                  static_cast<long long>(probe.checked_units), probe.gbps_per_sm, probe.multicast_gbps_per_sm);
      report["tma_row_probe"].push_back({{"pool_mb", pool_rows / 1024},
                                         {"checked_units", probe.checked_units},
                                         {"misplaced_units", probe.misplaced_units},
                                         {"gbps_per_sm", probe.gbps_per_sm},
                                         {"multicast_gbps_per_sm", probe.multicast_gbps_per_sm}});
    }
    std::ofstream(o.json_path) << report.dump(1) << "\n";
    return 0;
  }
  // The tensor-core ceiling of the instruction the kernels use, measured here.
  const MmaCeiling ceiling = measure_mma_sync_ceiling(3, 20);
  report["mma_sync_ceiling_tflops"] = ceiling.tflops;
  std::printf("mma.sync m16n8k16 bf16 ceiling (register-resident loop, median of 20): %.1f TFLOPS; "
              "H100 SXM5 dense bf16 datasheet: 989 TFLOPS\n",
              ceiling.tflops);
  // What the chip's tensor cores reach through wgmma (the sm90 kernel's instruction), measured the same way.
  const MmaCeiling gemm_ceiling = measure_bf16_gemm_ceiling(3, 20);
  report["bf16_gemm_ceiling_tflops"] = gemm_ceiling.tflops;
  std::printf("cuBLASLt bf16 GEMM 8192^3 ceiling (median of 20): %.1f TFLOPS\n", gemm_ceiling.tflops);
  // What the copying kernel's producer pattern can pull into shared memory: random 1 KB rows by 16-byte cp.async,
  // by the bytes in flight. (Up to 192 KB of shared memory a CTA: a device that cannot give it reports why and goes on.)
  try {
    for (const std::int64_t pool_rows : {std::int64_t{8192}, std::int64_t{131072}}) {
      const std::vector<GatherCeiling> curve = measure_row_gather_ceiling(pool_rows, 3, 20);
      std::printf("row gather ceiling, random 1 KB rows of a %lld MB pool into shared memory (median of 20), "
                  "GB/s an SM (TB/s) by SMs x KB in flight:",
                  static_cast<long long>(pool_rows / 1024));
      for (const GatherCeiling& gather : curve) {
        report["row_gather_ceiling"].push_back({{"pool_mb", pool_rows / 1024},
                                                {"ctas", gather.ctas},
                                                {"in_flight_kb", gather.in_flight_kb},
                                                {"tbps", gather.tbps},
                                                {"gbps_per_sm", gather.gbps_per_sm}});
        std::printf(" %dx%d: %.1f (%.2f)", gather.ctas, gather.in_flight_kb, gather.gbps_per_sm, gather.tbps);
      }
      std::printf("\n");
    }
  } catch (const std::runtime_error& error) {
    std::printf("row gather ceiling: not measured (%s)\n", error.what());
    cudaGetLastError();  // a failed attribute or launch leaves no sticky error; clear the last one
  }
  if (o.decode) std::printf("%-12s %4s %3s %4s %9s %8s %8s %6s %6s %9s %7s %s\n", "case", "b", "s_q", "h", "us", "TFLOPS", "GB/s",
              "%bw", "%mma", "peer_us", "x_peer", "check");
  const std::vector<Case> cases = o.decode ? load_cases(o.cases_path) : std::vector<Case>{};
  std::uint64_t seed = 20261126;
  for (const Case& c : cases) {
    if (!label_selected(o.filter, c.label)) continue;
    if (o.only_b != 0 && c.b != o.only_b) continue;
    const nlohmann::json r = run_case(c, o, seed++);
    std::string check = "-";
    if (r.contains("check")) check = (r["check"]["out_pass"].get<bool>() && r["check"]["lse_pass"].get<bool>()) ? "pass" : "FAIL";
    std::printf("%-12s %4lld %3lld %4lld %9.2f %8.1f %8.1f %6.1f %6.1f %9.2f %7.2f %s\n", c.label.c_str(),
                static_cast<long long>(c.b), static_cast<long long>(c.s_q), static_cast<long long>(c.h_q),
                r["median_us"].get<double>(), r["tflops"].get<double>(), r["gbps"].get<double>(),
                r["pct_copy_ceiling"].get<double>(), r["pct_gemm_ceiling"].get<double>(), c.peer_us,
                r["vs_peer_throughput"].get<double>(), check.c_str());
    std::printf("  plan %s\n", r["plan"].get<std::string>().c_str());
    if (c.mtp) {
      std::printf("  %-10s unpacked %9.2f us, packed/unpacked %.3f\n", "", r["unpacked_us"].get<double>(),
                  r["median_us"].get<double>() / r["unpacked_us"].get<double>());
    }
    if (check == "FAIL") std::printf("  out: %s\n  lse: %s\n", r["check"]["out"].get<std::string>().c_str(), r["check"]["lse"].get<std::string>().c_str());
    std::fflush(stdout);
    report["results"].push_back(r);
  }
  if (o.prefill) {
    std::printf("\nprefill (s_q tokens of one request; %%mma = of the measured mma.sync ceiling, %%gemm = of the "
                "measured cuBLASLt GEMM ceiling, %%989 = of the datasheet bf16 peak)\n"
                "stage_us (direct) = smla's dequantize_and_gather of the bf16 workspace a two-pass user fills first\n"
                "%-13s %-6s %4s %7s %5s %9s %8s %6s %6s %6s %9s %7s %8s\n",
                "case", "mode", "h", "s_kv", "topk", "us", "TFLOPS", "%mma", "%gemm", "%989", "peer_us", "x_peer",
                "stage_us");
    report["prefill"] = nlohmann::json::array();
    for (const PrefillCase& c : load_prefill_cases(o.prefill_cases_path)) {
      if (!label_selected(o.filter, c.label)) continue;
      const nlohmann::json r = run_prefill_case(c, o.warmup, o.runs, seed++, ceiling.tflops);
      const double pct_gemm = 100.0 * r["tflops"].get<double>() / gemm_ceiling.tflops;
      std::printf("%-13s %-6s %4lld %7lld %5lld %9.1f %8.1f %6.1f %6.1f %6.1f %9.1f %7.2f %8.1f\n", c.label.c_str(),
                  c.mode.c_str(), static_cast<long long>(c.h_q), static_cast<long long>(c.s_kv),
                  static_cast<long long>(c.topk + r["window"].get<std::int64_t>()), r["median_us"].get<double>(),
                  r["tflops"].get<double>(), r["pct_mma_sync_ceiling"].get<double>(), pct_gemm,
                  r["pct_datasheet_bf16"].get<double>(), c.peer_us, r["vs_peer_throughput"].get<double>(),
                  r["staging_us"].get<double>());
      std::fflush(stdout);
      nlohmann::json row = r;
      row["pct_gemm_ceiling"] = pct_gemm;
      report["prefill"].push_back(row);
    }
  }
  std::ofstream(o.json_path) << report.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace smla::bench

int main(int argc, char** argv) {
  try {
    return smla::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla_bench_cuda: %s\n", e.what());
    return 1;
  }
}
