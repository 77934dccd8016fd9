// Property tests: the builder and the transforms against a deliberately naive
// model written here from the spec text, over thousands of random batches
// (decode, MTP decode, prefill, chunked prefill with long prefixes, padding,
// positions below the window, permuted and padded block tables, every ratio).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "smla/metadata.h"
#include "tests/common/test_common.h"
#include "tests/unit/metadata/host_batch.h"

namespace smla::testing {
namespace {

// ---- naive model --------------------------------------------------------
struct NaiveToken {
  int req = -1;
  long pos = 0;
  bool valid = false;
  bool decode = false;
};

struct NaiveStep {
  long num_decodes = 0, num_decode_tokens = 0, num_prefill_tokens = 0;
  std::vector<NaiveToken> tokens;
};

NaiveStep naive_step(const HostBatch& b, const StepConfig& c) {
  NaiveStep s;
  const long thr = 1 + c.num_speculative_tokens;
  const long reqs = static_cast<long>(b.query_lens.size());
  while (s.num_decodes < reqs && b.query_lens[static_cast<std::size_t>(s.num_decodes)] <= thr) ++s.num_decodes;
  for (long r = 0; r < reqs; ++r) {
    const long q = b.query_lens[static_cast<std::size_t>(r)], len = b.seq_lens[static_cast<std::size_t>(r)];
    for (long i = 0; i < q; ++i) {
      NaiveToken tok;
      tok.req = static_cast<int>(r);
      tok.pos = len - q + i;
      tok.decode = r < s.num_decodes;
      tok.valid = b.token_valid.empty() || b.token_valid[s.tokens.size()] != 0;
      s.tokens.push_back(tok);
      (tok.decode ? s.num_decode_tokens : s.num_prefill_tokens) += 1;
    }
  }
  const long total = b.num_tokens < 0 ? static_cast<long>(s.tokens.size()) : b.num_tokens;
  while (static_cast<long>(s.tokens.size()) < total) s.tokens.push_back({});
  return s;
}

long lookup(const HostTable& t, long req, long page, long logical) {
  return static_cast<long>(t.at(req, logical / page)) * page + logical % page;
}

std::vector<long> naive_window(const HostBatch& b, const StepConfig& c, const NaiveToken& tok) {
  std::vector<long> row;
  for (long p = tok.pos - c.window + 1; p <= tok.pos; ++p) {
    if (p >= 0) row.push_back(lookup(b.swa, tok.req, c.swa_page_size, p));
  }
  return row;
}

long naive_compressed_slot(const HostTable& t, const StepConfig& c, long ratio, const NaiveToken& tok) {
  if (!tok.valid || (tok.pos + 1) % ratio != 0) return -1;
  return lookup(t, tok.req, c.logical_block_size / ratio, tok.pos / ratio);
}

StepConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<int> v) {
    return *(v.begin() + std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng));
  };
  StepConfig c;
  c.window = pick({128, 128, 64, 16, 5, 1});
  c.max_model_len = pick({1024, 1500, 2048});
  c.max_num_batched_tokens = pick({64, 256, 512});
  c.index_topk = pick({512, 64, 7});
  c.num_speculative_tokens = pick({0, 1, 2, 3});
  c.prefill_chunk_size = pick({4, 1, 2});
  c.swa_page_size = pick({64, 64, 3, 53});
  c.logical_block_size = pick({256, 256, 128, 512});
  if (pick({0, 1, 2}) == 0) c.c128a_active_width = pick({1, 4, 7});
  return c;
}

struct SeededTest : ::testing::Test {
  std::uint64_t seed = test_seed();
  std::mt19937_64 rng{seed};
  void SetUp() override { RecordProperty("seed", std::to_string(seed)); }
};

// ---- builder ------------------------------------------------------------
TEST_F(SeededTest, BuilderMatchesNaiveModel) {
  SCOPED_TRACE(fmt::format("seed {} (SMLA_TEST_SEED reproduces)", seed));
  for (int iter = 0; iter < 2000; ++iter) {
    const StepConfig c = random_config(rng);
    HostBatch b = random_batch(rng, c);
    SCOPED_TRACE(fmt::format("iteration {}", iter));
    Expected<StepMetadata> m = make_step_metadata(b.desc(), c);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const NaiveStep n = naive_step(b, c);
    const StepCounts& k = m->counts();
    ASSERT_EQ(k.num_decodes, n.num_decodes);
    ASSERT_EQ(k.num_decode_tokens, n.num_decode_tokens);
    ASSERT_EQ(k.num_prefill_tokens, n.num_prefill_tokens);
    ASSERT_EQ(k.num_prefills, static_cast<long>(b.query_lens.size()) - n.num_decodes);
    ASSERT_EQ(k.num_tokens, static_cast<long>(n.tokens.size()));
    long start = 0;
    for (std::size_t r = 0; r < b.query_lens.size(); ++r) {
      ASSERT_EQ(m->query_start_loc[r], start);
      start += b.query_lens[r];
      if (static_cast<long>(r) >= n.num_decodes) {
        const long q = b.query_lens[r], len = b.seq_lens[r];
        ASSERT_EQ(m->prefill_gather_lens[r - static_cast<std::size_t>(n.num_decodes)],
                  q + std::min<long>(len - q, c.window - 1));
      }
    }
    ASSERT_EQ(m->query_start_loc.back(), start);
    const long c128_width = m->sizes.c128a_width;
    const long c128_active = c.c128a_active_width > 0 ? c.c128a_active_width : c128_width;
    for (std::size_t t = 0; t < n.tokens.size(); ++t) {
      const NaiveToken& tok = n.tokens[t];
      SCOPED_TRACE(fmt::format("token {} req {} pos {} valid {}", t, tok.req, tok.pos, tok.valid));
      ASSERT_EQ(m->token_to_req[t], tok.req);
      ASSERT_EQ(m->positions[t], tok.req < 0 ? 0 : tok.pos);
      ASSERT_EQ(m->is_valid_token[t], tok.valid ? 1 : 0);
      ASSERT_EQ(m->swa_slot_mapping[t], tok.valid ? lookup(b.swa, tok.req, c.swa_page_size, tok.pos) : -1);
      const std::vector<long> window = tok.valid ? naive_window(b, c, tok) : std::vector<long>{};
      ASSERT_EQ(m->swa_lens[t], static_cast<long>(window.size()));
      for (long i = 0; i < c.window; ++i) {
        const long expect = i < static_cast<long>(window.size()) ? window[static_cast<std::size_t>(i)] : -1;
        ASSERT_EQ(m->swa_indices[t * static_cast<std::size_t>(c.window) + static_cast<std::size_t>(i)], expect) << i;
      }
      if (b.has_c4) {
        ASSERT_EQ(m->c4_slot_mapping[t], naive_compressed_slot(b.c4, c, 4, tok));
      }
      if (!b.has_c128) continue;
      ASSERT_EQ(m->c128_slot_mapping[t], naive_compressed_slot(b.c128, c, 128, tok));
      if (tok.req < 0) continue;
      const long entries = std::min((tok.pos + 1) / 128, c128_active);
      if (tok.decode) {
        ASSERT_EQ(m->c128a_decode_lens[t], tok.valid ? entries : 0);
        for (long j = 0; j < c128_width; ++j) {
          const long expect = tok.valid && j < entries ? lookup(b.c128, tok.req, c.logical_block_size / 128, j) : -1;
          ASSERT_EQ(m->c128a_decode_indices[t * static_cast<std::size_t>(c128_width) + static_cast<std::size_t>(j)],
                    expect);
        }
      } else {
        const std::size_t row = t - static_cast<std::size_t>(n.num_decode_tokens);
        for (long j = 0; j < c128_width; ++j) {
          ASSERT_EQ(m->c128a_prefill_indices[row * static_cast<std::size_t>(c128_width) + static_cast<std::size_t>(j)],
                    j < entries ? j : -1);
        }
      }
    }
  }
}

// Caller-owned, oversized, strided buffers give the same rows as the owning struct
// and leave the extra rows untouched.
TEST_F(SeededTest, CallerBuffersMatchOwning) {
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (int iter = 0; iter < 200; ++iter) {
    StepConfig c = random_config(rng);
    HostBatch b = random_batch(rng, c);
    b.has_c4 = b.has_c128 = true;
    Expected<StepMetadata> owning = make_step_metadata(b.desc(), c);
    ASSERT_TRUE(owning.ok()) << owning.status().to_string();
    const StepMetadataSizes& s = owning->sizes;
    const long t = s.token_rows + 2, w = s.window, cw = s.c128a_width;
    constexpr std::int32_t kPoison = -12345;
    std::vector<std::int32_t> qsl(static_cast<std::size_t>(s.query_start_loc_rows + 1), kPoison),
        req(static_cast<std::size_t>(t) * 2, kPoison), win(static_cast<std::size_t>(t * (w + 1)), kPoison),
        lens(static_cast<std::size_t>(t), kPoison), gl(static_cast<std::size_t>(s.prefill_request_rows + 1), kPoison),
        cdi(static_cast<std::size_t>((s.c128a_decode_rows + 1) * cw), kPoison),
        cdl(static_cast<std::size_t>(s.c128a_decode_rows + 1), kPoison),
        cpi(static_cast<std::size_t>((s.c128a_prefill_rows + 1) * cw), kPoison);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(t), kPoison), slot(static_cast<std::size_t>(t), kPoison),
        c4s(static_cast<std::size_t>(t), kPoison), c128s(static_cast<std::size_t>(t), kPoison);
    std::vector<std::uint8_t> valid(static_cast<std::size_t>(t), 0xEE);
    StepMetadataBuffers o;
    o.query_start_loc = TensorView::contiguous(qsl.data(), DType::kI32, {s.query_start_loc_rows + 1});
    o.token_to_req = TensorView::strided(req.data(), DType::kI32, {t}, {2});  // non-contiguous
    o.positions = TensorView::contiguous(pos.data(), DType::kI64, {t});
    o.is_valid_token = TensorView::contiguous(valid.data(), DType::kU8, {t});
    o.swa_slot_mapping = TensorView::contiguous(slot.data(), DType::kI64, {t});
    o.swa_indices = TensorView::strided(win.data(), DType::kI32, {t, w}, {w + 1, 1});
    o.swa_lens = TensorView::contiguous(lens.data(), DType::kI32, {t});
    o.prefill_gather_lens = TensorView::contiguous(gl.data(), DType::kI32, {s.prefill_request_rows + 1});
    o.c4_slot_mapping = TensorView::contiguous(c4s.data(), DType::kI64, {t});
    o.c128_slot_mapping = TensorView::contiguous(c128s.data(), DType::kI64, {t});
    o.c128a_decode_indices = TensorView::contiguous(cdi.data(), DType::kI32, {s.c128a_decode_rows + 1, cw});
    o.c128a_decode_lens = TensorView::contiguous(cdl.data(), DType::kI32, {s.c128a_decode_rows + 1});
    o.c128a_prefill_indices = TensorView::contiguous(cpi.data(), DType::kI32, {s.c128a_prefill_rows + 1, cw});
    ASSERT_TRUE(build_step_metadata(b.desc(), c, o).ok());
    for (long i = 0; i < s.token_rows; ++i) {
      const auto u = static_cast<std::size_t>(i);
      ASSERT_EQ(req[2 * u], owning->token_to_req[u]);
      ASSERT_EQ(pos[u], owning->positions[u]);
      ASSERT_EQ(valid[u], owning->is_valid_token[u]);
      ASSERT_EQ(slot[u], owning->swa_slot_mapping[u]);
      ASSERT_EQ(lens[u], owning->swa_lens[u]);
      ASSERT_EQ(c4s[u], owning->c4_slot_mapping[u]);
      ASSERT_EQ(c128s[u], owning->c128_slot_mapping[u]);
      for (long j = 0; j < w; ++j)
        ASSERT_EQ(win[u * static_cast<std::size_t>(w + 1) + static_cast<std::size_t>(j)],
                  owning->swa_indices[u * static_cast<std::size_t>(w) + static_cast<std::size_t>(j)]);
      ASSERT_EQ(win[u * static_cast<std::size_t>(w + 1) + static_cast<std::size_t>(w)],
                kPoison);  // row padding untouched
    }
    const auto tr = static_cast<std::size_t>(s.token_rows);
    EXPECT_EQ(lens[tr], kPoison);
    EXPECT_EQ(slot[tr], kPoison);
    EXPECT_EQ(qsl.back(), kPoison);
    EXPECT_EQ(gl.back(), kPoison);
    EXPECT_EQ(cdl.back(), kPoison);
    for (long j = 0; j < s.c128a_decode_rows * cw; ++j)
      ASSERT_EQ(cdi[static_cast<std::size_t>(j)], owning->c128a_decode_indices[static_cast<std::size_t>(j)]);
    for (long j = 0; j < s.c128a_prefill_rows * cw; ++j)
      ASSERT_EQ(cpi[static_cast<std::size_t>(j)], owning->c128a_prefill_indices[static_cast<std::size_t>(j)]);
    for (long j = s.c128a_prefill_rows * cw; j < (s.c128a_prefill_rows + 1) * cw; ++j)
      ASSERT_EQ(cpi[static_cast<std::size_t>(j)], kPoison);
  }
}

// ---- chunk plans ----------------------------------------------------------
TEST_F(SeededTest, ChunkPlansMatchNaiveGreedy) {
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (int iter = 0; iter < 1000; ++iter) {
    const StepConfig c = random_config(rng);
    RandomBatchOptions opt;
    opt.max_prefills = 12;
    HostBatch b = random_batch(rng, c, opt);
    const NaiveStep n = naive_step(b, c);
    for (int ratio : {1, 4, 128}) {
      const long reqs = static_cast<long>(b.query_lens.size());
      auto comp = [&](long r) { return ratio > 1 ? b.seq_lens[static_cast<std::size_t>(r)] / ratio : 0L; };
      auto gath = [&](long r) {
        const long q = b.query_lens[static_cast<std::size_t>(r)], len = b.seq_lens[static_cast<std::size_t>(r)];
        return q + std::min<long>(len - q, c.window - 1);
      };
      const long area = c.prefill_chunk_size *
                        ((ratio > 1 ? (c.max_model_len + ratio - 1) / ratio : 0) + c.window + c.max_num_batched_tokens);
      for (ChunkPolicy policy : {ChunkPolicy::kFixed, ChunkPolicy::kAdaptive}) {
        auto plan = prefill_chunk_plan(b.desc(), c, ratio, policy);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        long r = n.num_decodes, token = n.num_decode_tokens;
        std::size_t idx = 0;
        while (r < reqs) {
          long end = r, mc = 0, mg = 0, tokens = 0;
          while (end < reqs) {
            const long nmc = std::max(mc, comp(end)), nmg = std::max(mg, gath(end));
            const long count = end - r + 1;
            const bool ok = end == r || (policy == ChunkPolicy::kFixed ? count <= c.prefill_chunk_size
                                                                       : count * (nmc + nmg) <= area);
            if (!ok) break;
            mc = nmc;
            mg = nmg;
            tokens += b.query_lens[static_cast<std::size_t>(end)];
            ++end;
          }
          ASSERT_LT(idx, plan->size());
          const PrefillChunk& ch = (*plan)[idx++];
          EXPECT_EQ(ch.req_begin, r);
          EXPECT_EQ(ch.req_end, end);
          EXPECT_EQ(ch.token_begin, token);
          EXPECT_EQ(ch.token_end, token + tokens);
          EXPECT_EQ(ch.compressed_rows, mc);
          EXPECT_EQ(ch.workspace_rows, mc + mg);
          r = end;
          token += tokens;
        }
        EXPECT_EQ(idx, plan->size());
      }
    }
  }
}

// ---- combined prefill indices (spec 4.4 formulas, literally) ---------------
TEST_F(SeededTest, CombineMatchesSpecFormula) {
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (int iter = 0; iter < 300; ++iter) {
    const StepConfig c = random_config(rng);
    HostBatch b = random_batch(rng, c);
    b.token_valid.clear();
    const NaiveStep n = naive_step(b, c);
    for (int ratio : {1, 4, 128}) {
      const LayerType type = *layer_type_for_ratio(ratio);
      const long topk_w = compressed_topk_width(c, type);
      const long width = combined_index_width(c, type);
      ASSERT_EQ(width % 128, 0);
      auto plan = prefill_chunk_plan(b.desc(), c, ratio, ChunkPolicy::kFixed);
      ASSERT_TRUE(plan.ok());
      for (const PrefillChunk& ch : *plan) {
        const long tokens = ch.token_end - ch.token_begin;
        // Indexer-like local top-k: a random subset of the visible entries, -1 padded.
        std::vector<std::int32_t> topk(static_cast<std::size_t>(std::max<long>(tokens * topk_w, 1)), -1);
        for (long i = 0; i < tokens; ++i) {
          const NaiveToken& tok = n.tokens[static_cast<std::size_t>(ch.token_begin + i)];
          const long vis = (tok.pos + 1) / ratio;
          std::vector<std::int32_t> pool(static_cast<std::size_t>(vis));
          for (long j = 0; j < vis; ++j) pool[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
          std::shuffle(pool.begin(), pool.end(), rng);
          for (long k = 0; k < std::min(vis, topk_w); ++k)
            topk[static_cast<std::size_t>(i * topk_w + k)] = pool[static_cast<std::size_t>(k)];
        }
        std::vector<std::int32_t> out(static_cast<std::size_t>(tokens * width), 77),
            lens(static_cast<std::size_t>(tokens), 77);
        const TensorView topk_view =
            ratio == 1 ? TensorView{} : TensorView::contiguous(topk.data(), DType::kI32, {tokens, topk_w});
        Status st = combine_topk_swa_indices(b.desc(), c, ratio, ch, ch.compressed_rows, ch.workspace_rows, topk_view,
                                             TensorView::contiguous(out.data(), DType::kI32, {tokens, width}),
                                             TensorView::contiguous(lens.data(), DType::kI32, {tokens}));
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (long i = 0; i < tokens; ++i) {
          const NaiveToken& tok = n.tokens[static_cast<std::size_t>(ch.token_begin + i)];
          const long bidx = tok.req - ch.req_begin;
          const long q = b.query_lens[static_cast<std::size_t>(tok.req)],
                     len = b.seq_lens[static_cast<std::size_t>(tok.req)];
          const long gather_len = q + std::min<long>(len - q, c.window - 1);
          const long gather_start = len - gather_len;
          const long topk_len = ratio == 1 ? 0 : std::min((tok.pos + 1) / ratio, topk_w);
          const long swa_len = std::min<long>(tok.pos + 1, c.window);
          std::vector<long> expect(static_cast<std::size_t>(width), -1);
          for (long k = 0; k < topk_len; ++k)
            expect[static_cast<std::size_t>(k)] =
                topk[static_cast<std::size_t>(i * topk_w + k)] + bidx * ch.workspace_rows;
          for (long j = 0; j < swa_len; ++j)
            expect[static_cast<std::size_t>(topk_len + j)] =
                bidx * ch.workspace_rows + ch.compressed_rows + (tok.pos - swa_len + 1 - gather_start) + j;
          ASSERT_EQ(lens[static_cast<std::size_t>(i)], topk_len + swa_len);
          for (long j = 0; j < width; ++j)
            ASSERT_EQ(out[static_cast<std::size_t>(i * width + j)], expect[static_cast<std::size_t>(j)]) << j;
          // Every index lands inside its own request's rows of the workspace.
          for (long j = 0; j < topk_len + swa_len; ++j) {
            const long x = out[static_cast<std::size_t>(i * width + j)] - bidx * ch.workspace_rows;
            ASSERT_GE(x, 0);
            ASSERT_LT(x, ch.compressed_rows + gather_len);
          }
        }
      }
    }
  }
}

// ---- C4A global conversion (spec 4.2, bounds-hardened) ---------------------
TEST_F(SeededTest, C4aGlobalMatchesNaive) {
  SCOPED_TRACE(fmt::format("seed {}", seed));
  auto uni = [&](long lo, long hi) { return std::uniform_int_distribution<long>(lo, hi)(rng); };
  for (int iter = 0; iter < 2000; ++iter) {
    const long n = uni(0, 6), k = uni(1, 9), rows = uni(1, 4), cols = uni(1, 4), bs = uni(1, 5);
    HostTable table;
    table.resize(rows, cols, uni(0, 2));
    for (long r = 0; r < rows; ++r)
      for (long cc = 0; cc < cols; ++cc) table.at(r, cc) = static_cast<std::int32_t>(uni(-2, 40));
    std::vector<std::int32_t> local(static_cast<std::size_t>(std::max<long>(n * k, 1))),
        req(static_cast<std::size_t>(std::max<long>(n, 1)));
    std::vector<std::uint8_t> valid(static_cast<std::size_t>(std::max<long>(n, 1)));
    for (auto& v : local) v = static_cast<std::int32_t>(uni(-3, bs * (cols + 1)));
    for (auto& v : req) v = static_cast<std::int32_t>(uni(-1, rows));
    for (auto& v : valid) v = static_cast<std::uint8_t>(uni(0, 3) != 0);
    std::vector<std::int32_t> out(local.size(), 99), lens(req.size(), 99);
    Status st = c4a_global_topk_indices(
        TensorView::contiguous(local.data(), DType::kI32, {n, k}), TensorView::contiguous(req.data(), DType::kI32, {n}),
        TensorView::contiguous(valid.data(), DType::kU8, {n}), table.view(), bs,
        TensorView::contiguous(out.data(), DType::kI32, {n, k}), TensorView::contiguous(lens.data(), DType::kI32, {n}));
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (long t = 0; t < n; ++t) {
      std::vector<long> kept;
      const long r = req[static_cast<std::size_t>(t)];
      for (long j = 0; j < k; ++j) {
        const long l = local[static_cast<std::size_t>(t * k + j)];
        if (r < 0 || r >= rows || l < 0 || l / bs >= cols) continue;
        const long block = table.at(r, l / bs);
        if (block < 0) continue;
        kept.push_back(block * bs + l % bs);
      }
      ASSERT_EQ(lens[static_cast<std::size_t>(t)],
                valid[static_cast<std::size_t>(t)] ? static_cast<long>(kept.size()) : 0);
      for (long j = 0; j < k; ++j)
        ASSERT_EQ(out[static_cast<std::size_t>(t * k + j)],
                  j < static_cast<long>(kept.size()) ? kept[static_cast<std::size_t>(j)] : -1);
    }
  }
}

// ---- mixed layout (spec 4.6) ------------------------------------------------
TEST_F(SeededTest, MixedLayoutMatchesNaive) {
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (int iter = 0; iter < 300; ++iter) {
    const StepConfig c = random_config(rng);
    HostBatch b = random_batch(rng, c);
    b.has_c4 = b.has_c128 = true;
    const NaiveStep n = naive_step(b, c);
    const long t_all = static_cast<long>(n.tokens.size());
    for (int ratio : {1, 4, 128}) {
      const LayerType type = *layer_type_for_ratio(ratio);
      const long topk_w = compressed_topk_width(c, type);
      const long pk = (topk_w + 3) / 4 * 4;
      const long width = c.window + pk;
      std::vector<std::int32_t> local(static_cast<std::size_t>(std::max<long>(t_all * topk_w, 1)), -1);
      for (long t = 0; t < t_all && ratio == 4; ++t) {
        const NaiveToken& tok = n.tokens[static_cast<std::size_t>(t)];
        const long vis = tok.req < 0 ? 0 : (tok.pos + 1) / 4;
        for (long kk = 0; kk < std::min(vis, topk_w); ++kk)
          local[static_cast<std::size_t>(t * topk_w + kk)] =
              static_cast<std::int32_t>(std::uniform_int_distribution<long>(0, vis - 1)(rng));
      }
      const long stride = (width + 3) / 4 * 4;
      std::vector<std::int32_t> out(static_cast<std::size_t>(std::max<long>(t_all * stride, 1)), 55),
          lens(static_cast<std::size_t>(std::max<long>(t_all, 1)), 55);
      const TensorView local_view =
          ratio == 4 ? TensorView::contiguous(local.data(), DType::kI32, {t_all, topk_w}) : TensorView{};
      Status st = mixed_sparse_indices(b.desc(), c, ratio, local_view,
                                       TensorView::strided(out.data(), DType::kI32, {t_all, width}, {stride, 1}),
                                       TensorView::contiguous(lens.data(), DType::kI32, {t_all}));
      ASSERT_TRUE(st.ok()) << st.to_string();
      const long c128_active = c.c128a_active_width > 0 ? c.c128a_active_width : topk_w;
      for (long t = 0; t < t_all; ++t) {
        const NaiveToken& tok = n.tokens[static_cast<std::size_t>(t)];
        std::vector<long> expect(static_cast<std::size_t>(width), -1);
        long len = 0;
        if (tok.valid) {
          const std::vector<long> win = naive_window(b, c, tok);
          for (std::size_t i = 0; i < win.size(); ++i) expect[i] = win[i];
          std::vector<long> comp;
          if (ratio == 4) {
            for (long kk = 0; kk < std::min((tok.pos + 1) / 4, topk_w); ++kk)
              comp.push_back(
                  lookup(b.c4, tok.req, c.logical_block_size / 4, local[static_cast<std::size_t>(t * topk_w + kk)]));
          } else if (ratio == 128) {
            for (long j = 0; j < std::min((tok.pos + 1) / 128, c128_active); ++j)
              comp.push_back(lookup(b.c128, tok.req, c.logical_block_size / 128, j));
          }
          for (std::size_t i = 0; i < comp.size(); ++i) expect[static_cast<std::size_t>(c.window) + i] = comp[i];
          len = c.window + static_cast<long>(comp.size());
        }
        ASSERT_EQ(lens[static_cast<std::size_t>(t)], len) << "token " << t;
        for (long j = 0; j < width; ++j)
          ASSERT_EQ(out[static_cast<std::size_t>(t * stride + j)], expect[static_cast<std::size_t>(j)])
              << t << "," << j;
      }
    }
  }
}

}  // namespace
}  // namespace smla::testing
