// `smla plan --batch` reader: parse_plan_batch on arbitrary text; an accepted
// batch goes through the same checks and builders as the command (tables,
// make_step_metadata, chunk plans), which must return a Status, never crash.
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "smla/metadata.h"
#include "tools/smla/plan_batch.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto batch = smla::cli::parse_plan_batch(text, "batch.json");
  if (!batch) return 0;
  for (std::uint8_t v : batch->token_valid) SMLA_FUZZ_CHECK(v <= 1);
  SMLA_FUZZ_CHECK(batch->query_lens.size() == batch->seq_lens.size());
  if (!smla::cli::check_plan_input(*batch).ok()) return 0;
  // The command allows 2^26 cells; the fuzzer keeps to small tables to stay fast.
  if (smla::cli::plan_table_cells(*batch) > (1 << 16)) return 0;
  smla::cli::build_plan_tables(*batch, size);
  const smla::BatchDescription desc = batch->desc();
  auto sizes = smla::step_metadata_sizes(desc, batch->config);
  if (!sizes) return 0;
  const std::int64_t cells = sizes->token_rows * (sizes->window + 8) +
                             (sizes->c128a_decode_rows + sizes->c128a_prefill_rows) * sizes->c128a_width;
  if (cells > (std::int64_t{1} << 22)) return 0;
  auto m = smla::make_step_metadata(desc, batch->config);
  if (m) SMLA_FUZZ_CHECK(static_cast<std::int64_t>(m->positions.size()) == m->sizes.token_rows);
  for (int ratio : {1, 4, 128}) {
    for (auto policy : {smla::ChunkPolicy::kFixed, smla::ChunkPolicy::kAdaptive}) {
      auto plan = smla::prefill_chunk_plan(desc, batch->config, ratio, policy);
      if (!plan) continue;
      for (const smla::PrefillChunk& chunk : *plan) {
        SMLA_FUZZ_CHECK(chunk.req_begin <= chunk.req_end && chunk.token_begin <= chunk.token_end);
        (void)smla::chunk_prefill_workspace(batch->config, ratio, chunk);
      }
    }
  }
  return 0;
}
