// smla_bench_cpu: runs the CPU case set (bench/cases/cpu.json, see
// shared/bench/cases.md) on the cpu backend and, in the same process, on the
// plain gather + dequantize + OpenBLAS baseline; reports per case the median
// time, GFLOP/s on the FlashMLA counting basis, the fraction of this machine's
// f32 FMA peak (measured here) and the speed-up over the baseline.
//
//   smla_bench_cpu [--cases FILE] [--json OUT] [--runs N] [--threads N] [--filter TEXT]
//                  [--simd TARGET] [--no-baseline]
// --simd forces one compiled-in target (e.g. AVX2) for the kernels and the FMA probe alike.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/cpu/blas_baseline.h"
#include "bench/cpu/fma_peak.h"
#include "smla/attention.h"
#include "src/cpu/simd_targets.h"
#include "src/cpu/thread_pool.h"
#include "testkit/testkit.h"

namespace smla::bench {
namespace {

struct Options {
  std::string cases_path = std::string(SMLA_BENCH_CASES_DIR) + "/cpu.json";
  std::string json_path = "cpu_bench.json";
  int runs = 20;
  int warmup = 2;
  int threads = 0;
  std::string filter;
  std::string simd;  // force a SIMD target by name ("AVX2"); empty: the best
  bool baseline = true;
};

bool parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--cases" && has_value) {
      o->cases_path = argv[++i];
    } else if (arg == "--json" && has_value) {
      o->json_path = argv[++i];
    } else if (arg == "--runs" && has_value) {
      o->runs = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--threads" && has_value) {
      o->threads = std::atoi(argv[++i]);
    } else if (arg == "--filter" && has_value) {
      o->filter = argv[++i];
    } else if (arg == "--simd" && has_value) {
      o->simd = argv[++i];
    } else if (arg == "--no-baseline") {
      o->baseline = false;
    } else {
      std::fprintf(stderr,
                   "usage: smla_bench_cpu [--cases FILE] [--json OUT] [--runs N] [--threads N] [--filter TEXT] "
                   "[--simd TARGET] [--no-baseline]\nunknown or incomplete argument: %s\n",
                   arg.c_str());
      return false;
    }
  }
  return true;
}

// Evicts the caches between runs (the cases.md protocol flushes L2 on GPUs; here
// a write and read of 4x the L3 size).
void flush_caches() {
  static std::vector<std::uint8_t> buffer(32u << 20);
  static volatile std::uint8_t observed = 0;
  std::memset(buffer.data(), static_cast<int>(observed) + 1, buffer.size());
  std::uint8_t x = 0;
  for (std::size_t i = 0; i < buffer.size(); i += 64) x = static_cast<std::uint8_t>(x + buffer[i]);
  observed = x;
}

template <class FN>
double median_ms(const Options& o, FN&& fn) {
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < o.runs; ++i) {
    flush_caches();
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
}

std::string read_first_line(const std::string& command) {
  std::string line;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[256];
    if (std::fgets(buffer, sizeof buffer, pipe)) line = buffer;
    pclose(pipe);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

int run(const Options& o) {
  std::ifstream in(o.cases_path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", o.cases_path.c_str());
    return 1;
  }
  const nlohmann::json cases = nlohmann::json::parse(in, nullptr, false);
  if (cases.is_discarded() || !cases.contains("cases")) {
    std::fprintf(stderr, "%s: not a case list\n", o.cases_path.c_str());
    return 1;
  }
  if (!o.simd.empty()) {
    std::int64_t id = 0;
    for (const auto& target : cpu::available_simd_targets()) {
      if (target.name == o.simd) id = target.id;
    }
    if (id == 0) {
      std::fprintf(stderr, "--simd %s: not compiled in or not supported by this CPU\n", o.simd.c_str());
      return 1;
    }
    cpu::force_simd_target(id);
  }
  cpu::set_num_threads(o.threads);
  const int threads = cpu::num_threads();
  const FmaPeak peak = measure_fma_peak(threads);
  const std::string commit = read_first_line(fmt::format("git -C {} rev-parse --short HEAD 2>/dev/null", SMLA_BENCH_CASES_DIR));
  nlohmann::json report = {
      {"date", read_first_line("date -u +%Y-%m-%dT%H:%M:%SZ")}, {"commit", commit}, {"cpu", cpu_model()},
      {"threads", threads}, {"simd_target", cpu::active_simd_target()},
      {"fma_peak_gflops", peak.gflops}, {"fma_peak_lanes", peak.lanes}, {"runs", o.runs},
      {"protocol", "median of runs after warm-up, caches flushed (32 MiB write+read) before every run"},
      {"cases", nlohmann::json::array()}};
  std::printf("smla_bench_cpu: %s, %d threads, target %s, measured f32 FMA peak %.1f GFLOP/s\n",
              cpu_model().c_str(), threads, cpu::active_simd_target().c_str(), peak.gflops);
  std::printf("%-16s %6s %9s %10s %9s %7s %11s %9s %8s %10s\n", "case", "tokens", "attended", "ms", "GFLOP/s",
              "%peak", "blas ms", "blas GF/s", "speedup", "max|diff|");

  for (const auto& spec : cases["cases"]) {
    const std::string label = spec.value("label", "");
    if (!o.filter.empty() && label.find(o.filter) == std::string::npos) continue;
    testkit::DecodeCaseOptions co;
    co.num_requests = spec.value("b", 1);
    co.s_q = spec.value("s_q", 1);
    co.num_heads = spec.value("h_q", 64);
    auto format = parse_kv_format(spec.value("format", "v4-fp8"));
    if (!format) {
      std::fprintf(stderr, "%s: %s\n", label.c_str(), format.status().to_string().c_str());
      return 1;
    }
    co.format = *format;
    co.main_topk = spec.value("main_topk", 128);
    co.main_page_size = spec.value("main_page", 64);
    co.main_context = spec.value("main_context", 1024);
    co.extra_topk = spec.value("extra_topk", 0);
    co.extra_page_size = spec.value("extra_page", 64);
    co.extra_context = spec.value("extra_context", 0);
    co.sink = true;
    co.poison_unselected = false;
    co.seed = 20261126;
    if (Status s = testkit::check_decode_case_options(co); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", label.c_str(), s.to_string().c_str());
      return 1;
    }
    testkit::DecodeCase c = testkit::make_decode_case(co);
    const SparseDecodeArgs args = c.args();
    const double flop = 2.0 * static_cast<double>(c.num_heads()) * static_cast<double>(c.attended_entries()) *
                        (c.d_qk() + c.d_v());
    Status status;
    const double ms = median_ms(o, [&] { status = sparse_decode(args, Backend::kCpu); });
    if (!status.ok()) {
      std::fprintf(stderr, "%s: %s\n", label.c_str(), status.to_string().c_str());
      return 1;
    }
    const double gflops = flop / (ms * 1e6);
    nlohmann::json row = {{"label", label}, {"op", spec.value("op", "decode")}, {"tokens", c.num_tokens()},
                          {"h_q", c.num_heads()}, {"d_qk", c.d_qk()}, {"d_v", c.d_v()},
                          {"attended", c.attended_entries()}, {"flop", flop}, {"median_ms", ms},
                          {"gflops", gflops}, {"fraction_of_fma_peak", gflops / peak.gflops}};
    double blas_ms = 0.0, max_diff = 0.0;
    if (o.baseline) {
      testkit::HostTensor out = c.make_out();
      testkit::HostTensor lse = c.make_lse();
      const SparseDecodeArgs baseline_args = c.args_with_outputs(out.view(), lse.view());
      blas_ms = median_ms(o, [&] { blas_baseline_decode(baseline_args); });
      const testkit::ErrorStats diff = testkit::compare_bf16(args.out, out.view());
      max_diff = diff.max_abs_err;
      row["baseline_median_ms"] = blas_ms;
      row["baseline_gflops"] = flop / (blas_ms * 1e6);
      row["speedup_over_baseline"] = blas_ms / ms;
      row["max_abs_diff_vs_baseline"] = max_diff;
      row["cosine_diff_vs_baseline"] = diff.cosine_diff;
    }
    report["cases"].push_back(row);
    std::printf("%-16s %6lld %9lld %10.2f %9.1f %6.1f%% %11.2f %9.1f %7.2fx %10.2e\n", label.c_str(),
                static_cast<long long>(c.num_tokens()), static_cast<long long>(c.attended_entries()), ms, gflops,
                100.0 * gflops / peak.gflops, blas_ms, blas_ms > 0 ? flop / (blas_ms * 1e6) : 0.0,
                blas_ms > 0 ? blas_ms / ms : 0.0, max_diff);
    std::fflush(stdout);
  }
  std::ofstream(o.json_path) << report.dump(2) << "\n";
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace
}  // namespace smla::bench

int main(int argc, char** argv) {
  smla::bench::Options options;
  if (!smla::bench::parse_options(argc, argv, &options)) return 2;
  return smla::bench::run(options);
}
