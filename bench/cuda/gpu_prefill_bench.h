// The GPU prefill case set (bench/cases/gpu_prefill.json, shared/bench/cases.md):
// s_q query tokens of one request, timed with the protocol of bench_util.h.
//   mode "flat":   sparse_prefill (cuda) over a contiguous bf16 KV workspace
//                  (FlashMLA's sparse prefill contract; peer figures exist).
//   mode "direct": the whole prefill straight from the FP8 paged caches through
//                  sparse_decode (cuda; V4: the 128-token window from the main
//                  cache + top-k from the compressed cache; V3.2: top-k).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace smla::bench {

struct PrefillCase {
  std::string label;
  std::string mode = "flat";
  std::string format = "v4-fp8";  // v4-fp8 (d_qk 512) or v32-fp8 (d_qk 576)
  std::int64_t s_q = 4096, h_q = 64, s_kv = 8192;
  std::int64_t topk = 512;        // random distinct entries (flat: of s_kv; direct V4: of the compressed cache)
  std::int64_t window = 0;        // direct V4: sliding-window entries before each token
  std::int64_t compress_ratio = 4;  // direct V4: compressed cache holds s_kv / ratio entries
  std::int64_t staging_rows = -1;   // direct: TuningOptions::sm90_staging_rows (a buffer the call overflows)
  double peer_us = 0.0;
};

std::vector<PrefillCase> load_prefill_cases(const std::string& path);

// Times one case; `ceiling_tflops` is the measured mma.sync ceiling of this device.
nlohmann::json run_prefill_case(const PrefillCase& c, int warmup, int runs, std::uint64_t seed, double ceiling_tflops);

}  // namespace smla::bench
