// Times the once-per-step planning of a large mixed step (docs/PERF.md,
// "Step metadata (CPU)"). Default case: 256 requests with ~64K-token contexts,
// 248 MTP decodes (2 tokens each) and 8 chunked prefills of 512 tokens,
// W=128, K=512, both compressed groups, permuted block tables.
// Reports the median of --repeats runs of each stage, in microseconds.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "smla/metadata.h"

namespace {

using smla::DType;
using smla::TensorView;

struct Table {
  std::int64_t cols = 0;
  std::vector<std::int32_t> data;
};

Table permuted_table(const std::vector<std::int32_t>& seq_lens, std::int64_t per_page, std::int64_t ratio,
                     std::mt19937_64& rng) {
  Table t;
  for (auto s : seq_lens) t.cols = std::max(t.cols, (s / ratio + per_page - 1) / per_page);
  t.data.resize(seq_lens.size() * static_cast<std::size_t>(t.cols));
  std::iota(t.data.begin(), t.data.end(), 0);
  std::shuffle(t.data.begin(), t.data.end(), rng);
  return t;
}

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// Median wall time and median thread CPU time (the CPU figure is what counts
// on a shared, oversubscribed machine: it excludes time spent descheduled).
struct Timing {
  double wall_us, cpu_us;
};

template <class Fn>
Timing median_us(int repeats, Fn&& fn) {
  std::vector<double> wall, cpu;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_us();
    fn();
    cpu.push_back(thread_cpu_us() - cpu_start);
    wall.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

int arg_int(int argc, char** argv, const std::string& name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (name == argv[i]) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = arg_int(argc, argv, "--repeats", 51);
  const int decodes = arg_int(argc, argv, "--decodes", 248);
  const int prefills = arg_int(argc, argv, "--prefills", 8);
  const int context = arg_int(argc, argv, "--context", 65536);
  smla::StepConfig config;
  config.window = 128;
  config.index_topk = 512;
  config.max_model_len = 65536;
  config.max_num_batched_tokens = 8192;
  config.num_speculative_tokens = 1;

  std::mt19937_64 rng(1234);
  std::vector<std::int32_t> query_lens, seq_lens;
  for (int r = 0; r < decodes; ++r) {
    query_lens.push_back(2);
    seq_lens.push_back(context - std::uniform_int_distribution<int>(0, 1023)(rng));
  }
  for (int r = 0; r < prefills; ++r) {
    query_lens.push_back(512);
    seq_lens.push_back(context - std::uniform_int_distribution<int>(0, 4095)(rng));
  }
  Table swa = permuted_table(seq_lens, config.swa_page_size, 1, rng);
  Table c4 = permuted_table(seq_lens, config.logical_block_size / 4, 4, rng);
  Table c128 = permuted_table(seq_lens, config.logical_block_size / 128, 128, rng);
  const auto reqs = static_cast<std::int64_t>(query_lens.size());
  smla::BatchDescription batch;
  batch.query_lens = TensorView::contiguous(query_lens.data(), DType::kI32, {reqs});
  batch.seq_lens = TensorView::contiguous(seq_lens.data(), DType::kI32, {reqs});
  batch.swa_block_table = TensorView::contiguous(swa.data.data(), DType::kI32, {reqs, swa.cols});
  batch.c4_block_table = TensorView::contiguous(c4.data.data(), DType::kI32, {reqs, c4.cols});
  batch.c128_block_table = TensorView::contiguous(c128.data.data(), DType::kI32, {reqs, c128.cols});

  // Caller-owned buffers, allocated once as a serving engine would.
  smla::Expected<smla::StepMetadata> owned = smla::make_step_metadata(batch, config);
  if (!owned) {
    fmt::print(stderr, "{}\n", owned.status().to_string());
    return 1;
  }
  const smla::StepCounts counts = owned->counts();
  smla::StepMetadataBuffers buffers = owned->buffers();

  // C4A decode conversion input: each decode token's indexer picks K distinct visible entries.
  const std::int64_t t_dec = counts.num_decode_tokens, k = config.index_topk;
  std::vector<std::int32_t> local(static_cast<std::size_t>(t_dec * k)), global(local.size()),
      global_lens(static_cast<std::size_t>(t_dec));
  for (std::int64_t t = 0; t < t_dec; ++t) {
    const std::int64_t visible = (owned->positions[static_cast<std::size_t>(t)] + 1) / 4;
    for (std::int64_t j = 0; j < k; ++j)
      local[static_cast<std::size_t>(t * k + j)] = static_cast<std::int32_t>((j * 97 + t) % visible);
  }
  // Prefill combine input: local top-k of every prefill token (short-context fill pattern).
  auto plan = smla::prefill_chunk_plan(batch, config, 4, smla::ChunkPolicy::kFixed);
  if (!plan) return 1;
  const std::int64_t t_pre = counts.num_prefill_tokens;
  const std::int64_t width = smla::combined_index_width(config, smla::LayerType::kC4A);
  std::vector<std::int32_t> prefill_topk(static_cast<std::size_t>(t_pre * k));
  for (std::size_t i = 0; i < prefill_topk.size(); ++i) prefill_topk[i] = static_cast<std::int32_t>(i % 4096);
  std::vector<std::int32_t> combined(static_cast<std::size_t>(t_pre * width)),
      combined_lens(static_cast<std::size_t>(t_pre));

  bool ok = true;
  const Timing build_us = median_us(repeats, [&] { ok &= smla::build_step_metadata(batch, config, buffers).ok(); });
  const Timing owning_us = median_us(repeats, [&] { ok &= smla::make_step_metadata(batch, config).ok(); });
  const Timing c4a_us = median_us(repeats, [&] {
    ok &= smla::c4a_global_topk_indices(TensorView::contiguous(local.data(), DType::kI32, {t_dec, k}),
                                        TensorView::contiguous(owned->token_to_req.data(), DType::kI32, {t_dec}),
                                        TensorView::contiguous(owned->is_valid_token.data(), DType::kU8, {t_dec}),
                                        batch.c4_block_table, 64,
                                        TensorView::contiguous(global.data(), DType::kI32, {t_dec, k}),
                                        TensorView::contiguous(global_lens.data(), DType::kI32, {t_dec}))
              .ok();
  });
  const Timing combine_us = median_us(repeats, [&] {
    std::int64_t row = 0;
    for (const smla::PrefillChunk& ch : *plan) {
      const std::int64_t n = ch.token_end - ch.token_begin;
      ok &=
          smla::combine_topk_swa_indices(batch, config, 4, ch, ch.compressed_rows, ch.workspace_rows,
                                         TensorView::contiguous(prefill_topk.data() + row * k, DType::kI32, {n, k}),
                                         TensorView::contiguous(combined.data() + row * width, DType::kI32, {n, width}),
                                         TensorView::contiguous(combined_lens.data() + row, DType::kI32, {n}))
              .ok();
      row += n;
    }
  });
  if (!ok) {
    fmt::print(stderr, "a metadata call failed\n");
    return 1;
  }
  fmt::print("case: {} requests ({} decodes x 2 tokens, {} prefills x 512), contexts ~{}, T={}, W={}, K={}\n",
             counts.num_reqs, counts.num_decodes, counts.num_prefills, context, counts.num_tokens, config.window,
             config.index_topk);
  fmt::print("median of {} runs, microseconds: {:>10} {:>10}\n", repeats, "wall", "cpu");
  auto row = [](const std::string& name, const Timing& t) {
    fmt::print("  {:<42} {:10.1f} {:10.1f}\n", name, t.wall_us, t.cpu_us);
  };
  row("build_step_metadata (caller buffers)", build_us);
  row("make_step_metadata (owning, allocates)", owning_us);
  row(fmt::format("c4a_global_topk_indices ({} x {})", t_dec, k), c4a_us);
  row(fmt::format("combine_topk_swa_indices ({} chunks)", plan->size()), combine_us);
  return 0;
}
