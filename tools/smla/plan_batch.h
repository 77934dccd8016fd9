// The batch `smla plan` describes: read strictly from a JSON batch file
// (docs/metadata.md) and/or the command line, then turned into block tables
// and a BatchDescription for the metadata builder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "smla/metadata.h"
#include "smla/status.h"

namespace smla::cli {

// A block table, [rows, cols] i32, unused cells -1.
struct PlanTable {
  std::int64_t cols = 0;
  std::vector<std::int32_t> data;

  TensorView view(std::int64_t rows);
};

struct PlanInput {
  StepConfig config;
  std::vector<std::int32_t> query_lens, seq_lens;
  std::vector<std::uint8_t> token_valid;
  std::int64_t num_tokens = -1;
  bool has_c4 = true, has_c128 = true;
  std::vector<std::vector<std::int32_t>> given[3];  // per group (swa, c4, c128), per request (may be empty)
  PlanTable tables[3];                              // swa, c4, c128

  BatchDescription desc();
};

inline constexpr const char* kPlanGroupTables[3] = {"swa_block_table", "c4_block_table", "c128_block_table"};

// Parses a batch file's text. Strict: unknown keys (other than "_comments"),
// wrong JSON types, non-integers (1.9, true), integers outside their C++ type
// (query_len 4294967297), unknown group names and token_valid values other
// than 0 / 1 are errors naming `name` and the JSON path ("requests[0].seq_len").
Expected<PlanInput> parse_plan_batch(std::string_view json_text, std::string_view name);
// Checks the file (kind, at most 64 MiB) and parses it.
Expected<PlanInput> read_plan_batch(const std::filesystem::path& path);

// Cells of the tables build_plan_tables allocates ([requests, widest row] per
// group), or kMaxPlanTableCells + 1 when above. Precondition: validated config.
std::int64_t plan_table_cells(const PlanInput& in);
inline constexpr std::int64_t kMaxPlanTableCells = std::int64_t{1} << 26;

// Checks what build_plan_tables relies on: a valid config, seq_lens in
// [0, max_model_len], at most kMaxPlanTableCells cells.
Status check_plan_input(const PlanInput& in);

// Uses the given tables where present; otherwise allocates pages in order
// (shuffled with permute_seed when it is not 0). Precondition: check_plan_input.
void build_plan_tables(PlanInput& in, std::uint64_t permute_seed);

}  // namespace smla::cli
