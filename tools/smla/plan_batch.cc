#include "tools/smla/plan_batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "tools/smla/input_files.h"
#include "tools/smla/manifest.h"

namespace smla::cli {

namespace {

using Json = nlohmann::json;

constexpr std::uint64_t kMaxBatchFileBytes = std::uint64_t{64} << 20;

// Reads typed values; every error names the file and the JSON path.
class BatchReader {
 public:
  explicit BatchReader(std::string_view name) : name_(name) {}

  Status error(const std::string& path, std::string_view expected, std::string_view actual) const {
    return invalid_argument(fmt::format("{}: {}", name_, printable(path)), expected, actual);
  }

  // An integer JSON value in [lo, hi]; floats (even 2.0), booleans and strings are errors.
  template <class T>
  Status integer(const Json& value, const std::string& path, std::int64_t lo, std::int64_t hi, T& out) const {
    const std::string expected = fmt::format("an integer in [{}, {}]", lo, hi);
    if (!value.is_number_integer()) {
      if (value.is_number_float()) return error(path, expected, fmt::format("{}", value.get<double>()));
      return error(path, expected, json_type_name(value));
    }
    if (value.is_number_unsigned()) {
      const auto v = value.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(hi)) return error(path, expected, std::to_string(v));
      out = static_cast<T>(v);
      return Status::Ok();
    }
    const auto v = value.get<std::int64_t>();
    if (v < lo || v > hi) return error(path, expected, std::to_string(v));
    out = static_cast<T>(v);
    return Status::Ok();
  }

  template <class T>
  Status integer_array(const Json& value, const std::string& path, std::int64_t lo, std::int64_t hi,
                       std::vector<T>& out) const {
    if (!value.is_array()) return error(path, "an array of integers", json_type_name(value));
    out.resize(value.size());
    for (std::size_t i = 0; i < value.size(); ++i) {
      SMLA_RETURN_IF_ERROR(integer(value[i], fmt::format("{}[{}]", path, i), lo, hi, out[i]));
    }
    return Status::Ok();
  }

  Status object(const Json& value, const std::string& path) const {
    if (!value.is_object()) return error(path, "an object", json_type_name(value));
    return Status::Ok();
  }

  // Every key of `value` is one of `known` or a "_comment".
  template <std::size_t N>
  Status known_keys(const Json& value, const std::string& path, const std::array<const char*, N>& known) const {
    for (const auto& item : value.items()) {
      const std::string& key = item.key();
      if (!key.empty() && key.front() == '_') continue;
      if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) != known.end()) continue;
      std::string list;
      for (const char* k : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
      return error(path.empty() ? printable(key) : fmt::format("{}.{}", path, printable(key)),
                   fmt::format("a key among {} (keys starting with '_' are comments)", list), "an unknown key");
    }
    return Status::Ok();
  }

 private:
  std::string_view name_;
};

constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();

Status read_config(const BatchReader& r, const Json& j, StepConfig& c) {
  SMLA_RETURN_IF_ERROR(r.object(j, "config"));
  constexpr std::array<const char*, 9> kKeys = {"window",          "max_model_len",       "max_num_batched_tokens",
                                                "index_topk",      "num_speculative_tokens", "prefill_chunk_size",
                                                "swa_page_size",   "logical_block_size",  "c128a_active_width"};
  SMLA_RETURN_IF_ERROR(r.known_keys(j, "config", kKeys));
  struct IntField {
    const char* key;
    int* field;
  };
  for (const IntField& f : {IntField{"window", &c.window}, IntField{"index_topk", &c.index_topk},
                            IntField{"num_speculative_tokens", &c.num_speculative_tokens},
                            IntField{"prefill_chunk_size", &c.prefill_chunk_size},
                            IntField{"swa_page_size", &c.swa_page_size},
                            IntField{"logical_block_size", &c.logical_block_size},
                            IntField{"c128a_active_width", &c.c128a_active_width}}) {
    if (j.contains(f.key)) SMLA_RETURN_IF_ERROR(r.integer(j.at(f.key), fmt::format("config.{}", f.key), 0, kI32Max, *f.field));
  }
  for (const auto& [key, field] : {std::pair<const char*, std::int64_t*>{"max_model_len", &c.max_model_len},
                                   {"max_num_batched_tokens", &c.max_num_batched_tokens}}) {
    if (j.contains(key)) SMLA_RETURN_IF_ERROR(r.integer(j.at(key), fmt::format("config.{}", key), 0, kI64Max, *field));
  }
  return Status::Ok();
}

Status read_requests(const BatchReader& r, const Json& j, PlanInput& in) {
  if (!j.is_array()) return r.error("requests", "an array of request objects", json_type_name(j));
  constexpr std::array<const char*, 5> kKeys = {"query_len", "seq_len", "swa_block_table", "c4_block_table",
                                                "c128_block_table"};
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string path = fmt::format("requests[{}]", i);
    const Json& req = j[i];
    SMLA_RETURN_IF_ERROR(r.object(req, path));
    SMLA_RETURN_IF_ERROR(r.known_keys(req, path, kKeys));
    for (const char* key : {"query_len", "seq_len"}) {
      if (!req.contains(key)) return r.error(fmt::format("{}.{}", path, key), "an integer", "no such key");
    }
    std::int32_t query_len = 0, seq_len = 0;
    SMLA_RETURN_IF_ERROR(r.integer(req.at("query_len"), path + ".query_len", 0, kI32Max, query_len));
    SMLA_RETURN_IF_ERROR(r.integer(req.at("seq_len"), path + ".seq_len", 0, kI32Max, seq_len));
    in.query_lens.push_back(query_len);
    in.seq_lens.push_back(seq_len);
    for (int g = 0; g < 3; ++g) {
      std::vector<std::int32_t> table;
      if (req.contains(kPlanGroupTables[g])) {
        // Block ids: the builder checks the range; here they must be i32.
        SMLA_RETURN_IF_ERROR(r.integer_array(req.at(kPlanGroupTables[g]),
                                             fmt::format("{}.{}", path, kPlanGroupTables[g]),
                                             std::numeric_limits<std::int32_t>::min(), kI32Max, table));
      }
      in.given[g].push_back(std::move(table));
    }
  }
  return Status::Ok();
}

Status read_groups(const BatchReader& r, const Json& j, PlanInput& in) {
  if (!j.is_array()) return r.error("groups", "an array of group names (\"c4\", \"c128\")", json_type_name(j));
  in.has_c4 = in.has_c128 = false;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string path = fmt::format("groups[{}]", i);
    if (!j[i].is_string()) return r.error(path, "\"c4\" or \"c128\"", json_type_name(j[i]));
    const std::string group = j[i].get<std::string>();
    bool* has = group == "c4" ? &in.has_c4 : group == "c128" ? &in.has_c128 : nullptr;
    if (has == nullptr) return r.error(path, "\"c4\" or \"c128\"", fmt::format("\"{}\"", printable(group)));
    if (*has) return r.error(path, "each group once", fmt::format("\"{}\" again", group));
    *has = true;
  }
  return Status::Ok();
}

std::int64_t needed_cols(const StepConfig& c, int group, std::int64_t seq_len) {
  if (group == 0) return (seq_len + c.swa_page_size - 1) / c.swa_page_size;
  const int ratio = group == 1 ? 4 : 128;
  const std::int64_t block = c.logical_block_size / ratio;
  return (seq_len / ratio + block - 1) / block;
}

}  // namespace

TensorView PlanTable::view(std::int64_t rows) {
  return TensorView::contiguous(data.data(), DType::kI32, {rows, cols});
}

BatchDescription PlanInput::desc() {
  BatchDescription d;
  const auto r = static_cast<std::int64_t>(query_lens.size());
  d.query_lens = TensorView::contiguous(query_lens.data(), DType::kI32, {r});
  d.seq_lens = TensorView::contiguous(seq_lens.data(), DType::kI32, {r});
  d.num_tokens = num_tokens;
  if (!token_valid.empty()) {
    d.token_valid =
        TensorView::contiguous(token_valid.data(), DType::kU8, {static_cast<std::int64_t>(token_valid.size())});
  }
  d.swa_block_table = tables[0].view(r);
  if (has_c4) d.c4_block_table = tables[1].view(r);
  if (has_c128) d.c128_block_table = tables[2].view(r);
  return d;
}

Expected<PlanInput> parse_plan_batch(std::string_view json_text, std::string_view name) {
  auto parsed = parse_json_text(json_text, name);
  if (!parsed) return parsed.status();
  const Json& j = *parsed;
  const BatchReader r(name);
  if (!j.is_object()) return invalid_argument(name, "a JSON object", json_type_name(j));
  constexpr std::array<const char*, 5> kKeys = {"config", "num_tokens", "token_valid", "groups", "requests"};
  SMLA_RETURN_IF_ERROR(r.known_keys(j, "", kKeys));
  PlanInput in;
  if (j.contains("config")) SMLA_RETURN_IF_ERROR(read_config(r, j.at("config"), in.config));
  if (j.contains("num_tokens")) SMLA_RETURN_IF_ERROR(r.integer(j.at("num_tokens"), "num_tokens", -1, kI32Max, in.num_tokens));
  if (j.contains("token_valid")) SMLA_RETURN_IF_ERROR(r.integer_array(j.at("token_valid"), "token_valid", 0, 1, in.token_valid));
  if (j.contains("groups")) SMLA_RETURN_IF_ERROR(read_groups(r, j.at("groups"), in));
  if (!j.contains("requests")) return r.error("requests", "an array of request objects", "no such key");
  SMLA_RETURN_IF_ERROR(read_requests(r, j.at("requests"), in));
  for (int g = 1; g < 3; ++g) {
    if ((g == 1 ? in.has_c4 : in.has_c128)) continue;
    for (std::size_t i = 0; i < in.given[g].size(); ++i) {
      if (j.at("requests")[i].contains(kPlanGroupTables[g])) {
        return r.error(fmt::format("requests[{}].{}", i, kPlanGroupTables[g]),
                       fmt::format("no table for group \"{}\", which \"groups\" leaves out", g == 1 ? "c4" : "c128"),
                       "a table");
      }
    }
  }
  return in;
}

Expected<PlanInput> read_plan_batch(const std::filesystem::path& path) {
  auto text = read_text_file(path, "a batch file (JSON)", kMaxBatchFileBytes);
  if (!text) return text.status();
  return parse_plan_batch(*text, printable(path.string()));
}

std::int64_t plan_table_cells(const PlanInput& in) {
  // Each table is [requests, widest row]: that is what build_plan_tables allocates.
  const auto reqs = static_cast<std::int64_t>(in.seq_lens.size());
  std::int64_t cells = 0;
  for (int g = 0; g < 3; ++g) {
    std::int64_t cols = 1;
    for (std::size_t r = 0; r < in.seq_lens.size(); ++r) {
      const bool given = r < in.given[g].size() && !in.given[g][r].empty();
      cols = std::max(cols, given ? static_cast<std::int64_t>(in.given[g][r].size())
                                  : needed_cols(in.config, g, in.seq_lens[r]));
    }
    if (cols > kMaxPlanTableCells) return kMaxPlanTableCells + 1;
    cells += std::max<std::int64_t>(reqs, 1) * cols;
    if (cells > kMaxPlanTableCells) return kMaxPlanTableCells + 1;
  }
  return cells;
}

Status check_plan_input(const PlanInput& in) {
  SMLA_RETURN_IF_ERROR(validate_step_config(in.config));
  // Table sizes come from seq_lens: guard them before allocating (the builder checks the rest).
  for (std::size_t r = 0; r < in.seq_lens.size(); ++r) {
    if (in.seq_lens[r] < 0 || in.seq_lens[r] > in.config.max_model_len) {
      return out_of_range(fmt::format("seq_lens[{}]", r),
                          fmt::format("a value in [0, max_model_len = {}]", in.config.max_model_len),
                          std::to_string(in.seq_lens[r]));
    }
  }
  const std::int64_t cells = plan_table_cells(in);
  if (cells > kMaxPlanTableCells) {
    return invalid_argument("block tables", "at most 2^26 cells in all ([requests, widest row] per group)",
                            fmt::format("more ({} requests)", in.seq_lens.size()));
  }
  return Status::Ok();
}

void build_plan_tables(PlanInput& in, std::uint64_t permute_seed) {
  const std::size_t reqs = in.query_lens.size();
  for (int g = 0; g < 3; ++g) {
    PlanTable& t = in.tables[g];
    std::vector<std::int64_t> need(reqs);
    std::int64_t total = 0;
    t.cols = 1;
    for (std::size_t r = 0; r < reqs; ++r) {
      const bool given = r < in.given[g].size() && !in.given[g][r].empty();
      need[r] = given ? static_cast<std::int64_t>(in.given[g][r].size()) : needed_cols(in.config, g, in.seq_lens[r]);
      t.cols = std::max(t.cols, need[r]);
      total += given ? 0 : need[r];
    }
    std::vector<std::int32_t> pages(static_cast<std::size_t>(total));
    for (std::size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<std::int32_t>(i);
    if (permute_seed != 0) {
      std::mt19937_64 rng(permute_seed + static_cast<std::uint64_t>(g));
      std::shuffle(pages.begin(), pages.end(), rng);
    }
    t.data.assign(std::max<std::size_t>(reqs, 1) * static_cast<std::size_t>(t.cols), -1);
    std::size_t next = 0;
    for (std::size_t r = 0; r < reqs; ++r) {
      const bool given = r < in.given[g].size() && !in.given[g][r].empty();
      for (std::int64_t c = 0; c < need[r]; ++c) {
        t.data[r * static_cast<std::size_t>(t.cols) + static_cast<std::size_t>(c)] =
            given ? in.given[g][r][static_cast<std::size_t>(c)] : pages[next++];
      }
    }
  }
}

}  // namespace smla::cli
