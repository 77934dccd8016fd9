// Test helpers: a batch held in std::vectors, random batches, and a naive
// per-token model of the step metadata written straight from the spec
// (sections 3 and 4) without the library's rules, to check the builder against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "smla/metadata.h"

namespace smla::testing {

// A block table stored with a padded row stride (non-contiguous rows).
struct HostTable {
  std::int64_t rows = 0, cols = 0, row_stride = 0;
  std::vector<std::int32_t> data;

  void resize(std::int64_t r, std::int64_t c, std::int64_t pad = 3) {
    rows = r;
    cols = c;
    row_stride = c + pad;
    data.assign(static_cast<std::size_t>(rows * row_stride + 1), -7);
  }
  std::int32_t& at(std::int64_t r, std::int64_t c) { return data[static_cast<std::size_t>(r * row_stride + c)]; }
  std::int32_t at(std::int64_t r, std::int64_t c) const { return data[static_cast<std::size_t>(r * row_stride + c)]; }
  TensorView view() { return TensorView::strided(data.data(), DType::kI32, {rows, cols}, {row_stride, 1}); }
};

struct HostBatch {
  std::vector<std::int32_t> query_lens, seq_lens;
  std::vector<std::uint8_t> token_valid;  // empty = absent
  std::int64_t num_tokens = -1;
  HostTable swa, c4, c128;
  bool has_c4 = true, has_c128 = true;

  BatchDescription desc() {
    BatchDescription d;
    const auto r = static_cast<std::int64_t>(query_lens.size());
    d.query_lens = TensorView::contiguous(query_lens.data(), DType::kI32, {r});
    d.seq_lens = TensorView::contiguous(seq_lens.data(), DType::kI32, {r});
    d.num_tokens = num_tokens;
    if (!token_valid.empty()) {
      d.token_valid =
          TensorView::contiguous(token_valid.data(), DType::kU8, {static_cast<std::int64_t>(token_valid.size())});
    }
    d.swa_block_table = swa.view();
    if (has_c4) d.c4_block_table = c4.view();
    if (has_c128) d.c128_block_table = c128.view();
    return d;
  }
  std::int64_t actual_tokens() const {
    std::int64_t n = 0;
    for (auto q : query_lens) n += q;
    return n;
  }
};

// Fills a table so that every column a request needs holds a distinct random
// physical block (a permutation), extra columns hold junk that is never read.
inline void fill_permuted_table(HostTable& table, const std::vector<std::int64_t>& needed_cols, std::int64_t extra_cols,
                                std::mt19937_64& rng) {
  std::int64_t max_cols = 1, total = 0;
  for (auto c : needed_cols) {
    max_cols = std::max(max_cols, c);
    total += c;
  }
  table.resize(static_cast<std::int64_t>(needed_cols.size()), max_cols + extra_cols);
  std::vector<std::int32_t> blocks(static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::int32_t>(i);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::size_t next = 0;
  for (std::size_t r = 0; r < needed_cols.size(); ++r) {
    for (std::int64_t c = 0; c < table.cols; ++c) {
      table.at(static_cast<std::int64_t>(r), c) =
          c < needed_cols[r] ? blocks[next++] : 1000000 + static_cast<std::int32_t>(c);
    }
  }
}

struct RandomBatchOptions {
  int max_decodes = 6;
  int max_prefills = 4;
  int max_prefill_query = 40;
  int max_prefix = 700;
  bool allow_padding = true;
};

// Decode-first random batch valid for `config` (seq_len <= max_model_len, tokens <= budget).
inline HostBatch random_batch(std::mt19937_64& rng, const StepConfig& config, const RandomBatchOptions& opt = {}) {
  HostBatch b;
  auto uni = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  const std::int64_t thr = config.decode_threshold();
  const std::int64_t decodes = uni(0, opt.max_decodes);
  const std::int64_t prefills = uni(0, opt.max_prefills);
  std::int64_t budget = config.max_num_batched_tokens;
  auto add = [&](std::int64_t q) {
    if (q > budget) return;
    // Short prefixes (below the window) are drawn often on purpose.
    const std::int64_t prefix_cap = std::min<std::int64_t>(opt.max_prefix, config.max_model_len - q);
    const std::int64_t prefix =
        uni(0, 3) == 0 ? uni(0, std::min<std::int64_t>(config.window, prefix_cap)) : uni(0, prefix_cap);
    b.query_lens.push_back(static_cast<std::int32_t>(q));
    b.seq_lens.push_back(static_cast<std::int32_t>(q + prefix));
    budget -= q;
  };
  for (std::int64_t i = 0; i < decodes; ++i) add(uni(1, thr));
  for (std::int64_t i = 0; i < prefills; ++i) add(uni(thr + 1, std::max<std::int64_t>(thr + 1, opt.max_prefill_query)));
  const std::int64_t actual = b.actual_tokens();
  if (opt.allow_padding && uni(0, 3) == 0) {
    b.num_tokens = std::min<std::int64_t>(config.max_num_batched_tokens, actual + uni(0, 5));
  }
  if (opt.allow_padding && uni(0, 3) == 0) {
    const std::int64_t t = b.num_tokens < 0 ? actual : b.num_tokens;
    b.token_valid.resize(static_cast<std::size_t>(t));
    for (auto& v : b.token_valid) v = uni(0, 4) == 0 ? 0 : 1;
  }
  std::vector<std::int64_t> swa_cols, c4_cols, c128_cols;
  const std::int64_t c4_block = config.logical_block_size / 4, c128_block = config.logical_block_size / 128;
  for (auto s : b.seq_lens) {
    swa_cols.push_back((s + config.swa_page_size - 1) / config.swa_page_size);
    c4_cols.push_back((s / 4 + c4_block - 1) / c4_block);
    c128_cols.push_back((s / 128 + c128_block - 1) / c128_block);
  }
  fill_permuted_table(b.swa, swa_cols, uni(0, 2), rng);
  // Pages older than the window may be freed: they must never be read.
  for (std::size_t r = 0; r < b.seq_lens.size(); ++r) {
    const std::int64_t first = std::max<std::int64_t>(b.seq_lens[r] - b.query_lens[r] - config.window + 1, 0);
    for (std::int64_t c = 0; c < first / config.swa_page_size; ++c) {
      if (uni(0, 1) == 0) b.swa.at(static_cast<std::int64_t>(r), c) = -1;
    }
  }
  fill_permuted_table(b.c4, c4_cols, uni(0, 2), rng);
  fill_permuted_table(b.c128, c128_cols, uni(0, 2), rng);
  b.has_c4 = uni(0, 4) != 0;
  b.has_c128 = uni(0, 4) != 0;
  return b;
}

}  // namespace smla::testing
