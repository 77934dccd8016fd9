// Dequantize-and-gather into the prefill workspace (spec 4.5), checked row by
// row against the codec's own per-slot reader (gather_from_cache) on slots
// computed here by hand. Every cache row that must not be read holds NaN.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "smla/codec.h"
#include "smla/metadata.h"
#include "tests/common/test_common.h"
#include "tests/unit/metadata/host_batch.h"

namespace smla::testing {
namespace {

constexpr std::uint16_t kPoison = 0x7FC1;  // a bf16 NaN pattern no decoder produces

// A V4 FP8 cache with padded pages, every slot quantized from random rows.
struct V4Cache {
  std::int64_t pages, page_size, page_stride;
  std::vector<std::uint8_t> bytes;
  KvCacheView view;

  V4Cache(std::int64_t num_pages, std::int64_t page, std::mt19937_64& rng) : pages(num_pages), page_size(page) {
    page_stride = V4Fp8Format::page_bytes(page) + 576;  // extra padding between pages
    bytes.assign(static_cast<std::size_t>(std::max<std::int64_t>(pages, 1) * page_stride), 0xFF);
    view.format = KvFormat::kV4Fp8;
    view.pages = TensorView::strided(bytes.data(), DType::kU8, {pages, page, V4Fp8Format::kBytesPerToken},
                                     {page_stride, V4Fp8Format::kBytesPerToken, 1});
    const std::int64_t n = pages * page;
    std::vector<float> rows(static_cast<std::size_t>(std::max<std::int64_t>(n, 1) * 512));
    std::normal_distribution<float> dist(0.0f, 2.0f);
    for (auto& x : rows) x = dist(rng);
    std::vector<std::int64_t> slots(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
    for (std::int64_t s = 0; s < n; ++s) slots[static_cast<std::size_t>(s)] = s;
    EXPECT_TRUE(quantize_into_cache(view, TensorView::contiguous(rows.data(), DType::kF32, {n, 512}),
                                    TensorView::contiguous(slots.data(), DType::kI64, {n}))
                    .ok());
  }
  // NaN scales: a read of this slot poisons the whole row.
  void poison(std::int64_t slot) {
    std::uint8_t* page = bytes.data() + (slot / page_size) * page_stride;
    std::memset(page + V4Fp8Format::scale_offset(slot % page_size, page_size), 0xFF, 7);
  }
  std::vector<std::uint16_t> row(std::int64_t slot) const {
    std::vector<std::uint16_t> out(512);
    std::int64_t s = slot;
    EXPECT_TRUE(gather_from_cache(view, TensorView::contiguous(&s, DType::kI64, {1}),
                                  TensorView::contiguous(out.data(), DType::kBF16, {1, 512}))
                    .ok());
    return out;
  }
};

long slot_of(const HostTable& t, long req, long page, long logical) {
  return static_cast<long>(t.at(req, logical / page)) * page + logical % page;
}

TEST(MetadataGather, PrefillChunkWorkspaceMatchesCodec) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(fmt::format("seed {} (SMLA_TEST_SEED reproduces)", seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 6; ++iter) {
    StepConfig c;
    c.window = iter % 2 ? 16 : 128;
    c.max_model_len = 1024;
    c.max_num_batched_tokens = 256;
    RandomBatchOptions opt;
    opt.max_decodes = 2;
    opt.max_prefills = 4;
    opt.max_prefix = 400;
    opt.allow_padding = false;
    HostBatch b = random_batch(rng, c, opt);
    b.has_c4 = b.has_c128 = true;
    for (int ratio : {1, 4, 128}) {
      // The compressed group of the layer: ratio-4 pages hold 64 entries, ratio-128 pages 2.
      const long cpage = ratio > 1 ? 256 / ratio : 64;
      const HostTable& ctable = ratio == 128 ? b.c128 : b.c4;
      const long cr = ratio > 1 ? ratio : 4;
      auto plan = prefill_chunk_plan(b.desc(), c, ratio, ChunkPolicy::kFixed);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      // fill_permuted_table numbers the needed pages 0..total-1.
      long swa_pages = 0, comp_pages = 0;
      for (auto s : b.seq_lens) {
        swa_pages += (s + 63) / 64;
        comp_pages += (s / cr + cpage - 1) / cpage;
      }
      V4Cache swa(swa_pages + 1, 64, rng);
      V4Cache comp(comp_pages + 1, cpage, rng);
      for (const PrefillChunk& ch : *plan) {
        const long reqs = ch.req_end - ch.req_begin, m = ch.workspace_rows + 2;
        // Poison every slot outside what this chunk reads.
        V4Cache swa_c = swa, comp_c = comp;
        swa_c.view.pages.data = swa_c.bytes.data();
        comp_c.view.pages.data = comp_c.bytes.data();
        std::vector<char> swa_read(static_cast<std::size_t>(swa_c.pages * 64), 0),
            comp_read(static_cast<std::size_t>(comp_c.pages * cpage), 0);
        for (long r = ch.req_begin; r < ch.req_end; ++r) {
          const long q = b.query_lens[static_cast<std::size_t>(r)], s = b.seq_lens[static_cast<std::size_t>(r)];
          const long g = q + std::min<long>(s - q, c.window - 1);
          for (long p = s - g; p < s; ++p) swa_read[static_cast<std::size_t>(slot_of(b.swa, r, 64, p))] = 1;
          for (long x = 0; ratio > 1 && x < s / ratio; ++x)
            comp_read[static_cast<std::size_t>(slot_of(ctable, r, cpage, x))] = 1;
        }
        for (long s = 0; s < swa_c.pages * 64; ++s)
          if (!swa_read[static_cast<std::size_t>(s)]) swa_c.poison(s);
        for (long s = 0; s < comp_c.pages * cpage; ++s)
          if (!comp_read[static_cast<std::size_t>(s)]) comp_c.poison(s);
        std::vector<std::uint16_t> ws(static_cast<std::size_t>(reqs * m * 512), kPoison);
        Status st = gather_prefill_chunk(b.desc(), c, ratio, ch, ch.compressed_rows, swa_c.view, comp_c.view,
                                         TensorView::contiguous(ws.data(), DType::kBF16, {reqs, m, 512}));
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (long r = ch.req_begin; r < ch.req_end; ++r) {
          const long bi = r - ch.req_begin;
          const long q = b.query_lens[static_cast<std::size_t>(r)], s = b.seq_lens[static_cast<std::size_t>(r)];
          const long g = q + std::min<long>(s - q, c.window - 1);
          const long n = ratio > 1 ? s / ratio : 0;
          for (long x = 0; x < m; ++x) {
            std::vector<std::uint16_t> expect(512, kPoison);
            if (x < n) expect = comp_c.row(slot_of(ctable, r, cpage, x));
            const long y = x - ch.compressed_rows;
            if (y >= 0 && y < g) expect = swa_c.row(slot_of(b.swa, r, 64, s - g + y));
            const std::uint16_t* got = ws.data() + (bi * m + x) * 512;
            ASSERT_EQ(std::memcmp(got, expect.data(), 1024), 0) << "request " << r << " row " << x;
            if (x < n || (y >= 0 && y < g)) {
              for (int d = 0; d < 512; ++d) ASSERT_FALSE(std::isnan(bf16_to_f32(got[d])));
            }
          }
        }
      }
    }
  }
}

TEST(MetadataGather, OddPageBf16RowsAndErrors) {
  // Plain bf16 rows, page size 53, 3 pages; row value = slot + dim / 1024.
  const long page = 53, pages = 3;
  std::vector<std::uint16_t> cache(static_cast<std::size_t>(pages * page * 512));
  for (long s = 0; s < pages * page; ++s)
    for (long d = 0; d < 512; ++d)
      cache[static_cast<std::size_t>(s * 512 + d)] =
          f32_to_bf16(static_cast<float>(s) + static_cast<float>(d) / 1024.0f);
  KvCacheView kv;
  kv.format = KvFormat::kBf16Rows;
  kv.pages = TensorView::contiguous(cache.data(), DType::kBF16, {pages, page, 512});
  HostTable table;
  table.resize(2, 3, 2);
  const std::int32_t ids[2][3] = {{2, 0, 1}, {1, 2, 0}};
  for (long r = 0; r < 2; ++r)
    for (long col = 0; col < 3; ++col) table.at(r, col) = ids[r][col];
  std::vector<std::int32_t> seq = {60, 120}, gl = {10, 70};
  const long m = 80;
  std::vector<std::uint16_t> out(static_cast<std::size_t>(2 * m * 512), kPoison);
  auto out_view = TensorView::contiguous(out.data(), DType::kBF16, {2, m, 512});
  ASSERT_TRUE(dequantize_and_gather(kv, TensorView::contiguous(seq.data(), DType::kI32, {2}),
                                    TensorView::contiguous(gl.data(), DType::kI32, {2}), table.view(), 3, out_view)
                  .ok());
  // Request 0 gathers positions 50..59: 50..52 in page 2 (slots 156..158), 53..59 in page 0 (0..6).
  // Request 1 gathers positions 50..119: 50..52 in page 1 (103..105), 53..105 in page 2, 106..119 in page 0.
  auto slot = [&](long b, long p) { return static_cast<long>(ids[b][p / page]) * page + p % page; };
  EXPECT_EQ(slot(0, 50), 156);
  EXPECT_EQ(slot(0, 53), 0);
  EXPECT_EQ(slot(1, 106), 0);
  for (long b = 0; b < 2; ++b) {
    for (long x = 0; x < m; ++x) {
      const long i = x - 3;
      for (long d = 0; d < 512; d += 97) {
        const std::uint16_t got = out[static_cast<std::size_t>((b * m + x) * 512 + d)];
        if (i >= 0 && i < gl[static_cast<std::size_t>(b)]) {
          const long pos = seq[static_cast<std::size_t>(b)] - gl[static_cast<std::size_t>(b)] + i;
          ASSERT_EQ(got, cache[static_cast<std::size_t>(slot(b, pos) * 512 + d)]) << b << " " << x;
        } else {
          ASSERT_EQ(got, kPoison) << b << " " << x;
        }
      }
    }
  }
  // Errors: a page id beyond the cache, a gather longer than the context, a
  // workspace too short; nothing is written.
  std::vector<std::uint16_t> fresh(out.size(), kPoison);
  auto fresh_view = TensorView::contiguous(fresh.data(), DType::kBF16, {2, m, 512});
  table.at(1, 2) = 3;
  Status st = dequantize_and_gather(kv, TensorView::contiguous(seq.data(), DType::kI32, {2}),
                                    TensorView::contiguous(gl.data(), DType::kI32, {2}), table.view(), 3, fresh_view);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("block_table[1][2]"), std::string::npos) << st.to_string();
  table.at(1, 2) = 0;
  gl[0] = 61;
  st = dequantize_and_gather(kv, TensorView::contiguous(seq.data(), DType::kI32, {2}),
                             TensorView::contiguous(gl.data(), DType::kI32, {2}), table.view(), 3, fresh_view);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gather_lens[0]"), std::string::npos) << st.to_string();
  gl[0] = 10;
  st = dequantize_and_gather(kv, TensorView::contiguous(seq.data(), DType::kI32, {2}),
                             TensorView::contiguous(gl.data(), DType::kI32, {2}), table.view(), 20, fresh_view);
  ASSERT_FALSE(st.ok());  // 20 + 70 > 80 rows
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  for (auto v : fresh) ASSERT_EQ(v, kPoison);
}

}  // namespace
}  // namespace smla::testing
