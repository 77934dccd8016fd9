// `smla plan`: builds the step metadata of a batch and prints it (JSON, or
// readable tables with --pretty), so a user can see which slots each token
// attends. The batch comes from command-line lists or a JSON file (format in
// docs/metadata.md); block tables not given are allocated page by page,
// optionally shuffled with --permute-seed.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "smla/metadata.h"
#include "tools/smla/commands.h"
#include "tools/smla/input_files.h"
#include "tools/smla/plan_batch.h"

namespace smla::cli {

namespace {

using nlohmann::json;

json config_json(const StepConfig& c) {
  return {{"window", c.window},
          {"max_model_len", c.max_model_len},
          {"max_num_batched_tokens", c.max_num_batched_tokens},
          {"index_topk", c.index_topk},
          {"num_speculative_tokens", c.num_speculative_tokens},
          {"prefill_chunk_size", c.prefill_chunk_size},
          {"swa_page_size", c.swa_page_size},
          {"logical_block_size", c.logical_block_size},
          {"c128a_active_width", c.c128a_active_width}};
}

template <class T>
json rows_json(const std::vector<T>& flat, std::int64_t width) {
  json rows = json::array();
  if (width <= 0) return rows;
  for (std::size_t i = 0; i + static_cast<std::size_t>(width) <= flat.size(); i += static_cast<std::size_t>(width)) {
    rows.push_back(std::vector<T>(flat.begin() + static_cast<std::ptrdiff_t>(i),
                                  flat.begin() + static_cast<std::ptrdiff_t>(i) + width));
  }
  return rows;
}

json counts_json(const StepCounts& c) {
  return {{"num_reqs", c.num_reqs},
          {"num_tokens", c.num_tokens},
          {"num_actual_tokens", c.num_actual_tokens},
          {"num_decodes", c.num_decodes},
          {"num_prefills", c.num_prefills},
          {"num_decode_tokens", c.num_decode_tokens},
          {"num_prefill_tokens", c.num_prefill_tokens},
          {"max_query_len", c.max_query_len},
          {"max_decode_query_len", c.max_decode_query_len},
          {"max_prefill_query_len", c.max_prefill_query_len},
          {"max_seq_len", c.max_seq_len}};
}

json chunk_json(const PrefillChunk& c) {
  return {{"req_begin", c.req_begin},
          {"req_end", c.req_end},
          {"token_begin", c.token_begin},
          {"token_end", c.token_end},
          {"compressed_rows", c.compressed_rows},
          {"workspace_rows", c.workspace_rows}};
}

json shape_json(const PrefillWorkspaceShape& s) {
  return {{"kv", {s.chunk_reqs, s.rows, s.head_dim}},
          {"compressed_rows", s.compressed_rows},
          {"indices", {s.index_rows, s.index_width}},
          {"lens", {s.index_rows}}};
}

// Everything `plan` prints, as one JSON document.
Expected<json> plan_json(PlanInput& in) {
  const BatchDescription desc = in.desc();
  Expected<StepMetadata> m = make_step_metadata(desc, in.config);
  if (!m) return m.status();
  const StepMetadataSizes& s = m->sizes;
  json out;
  out["config"] = config_json(in.config);
  out["counts"] = counts_json(s.counts);
  out["decode_threshold"] = in.config.decode_threshold();
  out["query_start_loc"] = m->query_start_loc;
  out["prefill_gather_lens"] = m->prefill_gather_lens;
  json tables = json::object();
  const auto reqs = static_cast<std::int64_t>(in.query_lens.size());
  for (int g = 0; g < 3; ++g) {
    if ((g == 1 && !in.has_c4) || (g == 2 && !in.has_c128)) continue;
    tables[kPlanGroupTables[g]] = rows_json(in.tables[g].data, reqs > 0 ? in.tables[g].cols : 0);
  }
  out["block_tables"] = tables;
  json tokens = {{"token_to_req", m->token_to_req},
                 {"positions", m->positions},
                 {"is_valid_token", m->is_valid_token},
                 {"swa_slot_mapping", m->swa_slot_mapping},
                 {"swa_lens", m->swa_lens},
                 {"swa_indices", rows_json(m->swa_indices, s.window)}};
  if (s.has_c4) tokens["c4_slot_mapping"] = m->c4_slot_mapping;
  if (s.has_c128) {
    tokens["c128_slot_mapping"] = m->c128_slot_mapping;
    out["c128a"] = {{"width", s.c128a_width},
                    {"decode_indices", rows_json(m->c128a_decode_indices, s.c128a_width)},
                    {"decode_lens", m->c128a_decode_lens},
                    {"prefill_indices", rows_json(m->c128a_prefill_indices, s.c128a_width)}};
  }
  out["tokens"] = tokens;
  json layers = json::object();
  for (int ratio : {1, 4, 128}) {
    if ((ratio == 4 && !in.has_c4) || (ratio == 128 && !in.has_c128)) continue;
    const LayerType type = *layer_type_for_ratio(ratio);
    json layer;
    for (ChunkPolicy policy : {ChunkPolicy::kFixed, ChunkPolicy::kAdaptive}) {
      Expected<std::vector<PrefillChunk>> plan = prefill_chunk_plan(desc, in.config, ratio, policy);
      if (!plan) return plan.status();
      json chunks = json::array();
      for (const PrefillChunk& c : *plan) {
        json cj = chunk_json(c);
        Expected<PrefillWorkspaceShape> shape = chunk_prefill_workspace(in.config, ratio, c);
        if (!shape) return shape.status();
        cj["workspace"] = shape_json(*shape);
        chunks.push_back(cj);
      }
      layer[policy == ChunkPolicy::kFixed ? "fixed_chunks" : "adaptive_chunks"] = chunks;
    }
    Expected<PrefillWorkspaceShape> bound = static_prefill_workspace(in.config, ratio);
    if (!bound) return bound.status();
    layer["static_workspace"] = shape_json(*bound);
    layer["compressed_topk_width"] = compressed_topk_width(in.config, type);
    layers[std::string(layer_type_name(type))] = layer;
  }
  out["layers"] = layers;
  return out;
}

// "a..b" for runs of consecutive values, so a window of 128 slots reads in one line.
std::string runs(const json& row, std::int64_t len) {
  std::string text;
  std::int64_t i = 0;
  while (i < len) {
    const std::int64_t first = row[static_cast<std::size_t>(i)].get<std::int64_t>();
    std::int64_t j = i;
    while (j + 1 < len && first != -1 &&
           row[static_cast<std::size_t>(j + 1)].get<std::int64_t>() == first + (j + 1 - i)) {
      ++j;
    }
    if (!text.empty()) text += ' ';
    text += j > i ? fmt::format("{}..{}", first, first + (j - i)) : std::to_string(first);
    i = j + 1;
  }
  return text.empty() ? "-" : text;
}

std::string pretty_text(const json& p) {
  const json& c = p["counts"];
  const json& cfg = p["config"];
  std::ostringstream os;
  os << fmt::format(
      "step: {} requests ({} decode, {} prefill), {} tokens ({} decode, {} prefill, {} padding)\n"
      "config: W={} max_model_len={} max_num_batched_tokens={} K={} decode_threshold={} swa_page={} "
      "logical_block={}\n\n",
      c["num_reqs"].get<long>(), c["num_decodes"].get<long>(), c["num_prefills"].get<long>(),
      c["num_tokens"].get<long>(), c["num_decode_tokens"].get<long>(), c["num_prefill_tokens"].get<long>(),
      c["num_tokens"].get<long>() - c["num_actual_tokens"].get<long>(), cfg["window"].get<long>(),
      cfg["max_model_len"].get<long>(), cfg["max_num_batched_tokens"].get<long>(), cfg["index_topk"].get<long>(),
      p["decode_threshold"].get<long>(), cfg["swa_page_size"].get<long>(), cfg["logical_block_size"].get<long>());
  os << "requests:\n"
     << fmt::format("  {:>4} {:>8} {:>6} {:>7} {:>9} {:>10}\n", "req", "kind", "query", "seq_len", "q_start",
                    "gather_len");
  const json& qsl = p["query_start_loc"];
  const long decodes = c["num_decodes"].get<long>();
  for (long r = 0; r < c["num_reqs"].get<long>(); ++r) {
    const long q = qsl[static_cast<std::size_t>(r + 1)].get<long>() - qsl[static_cast<std::size_t>(r)].get<long>();
    const std::string gather =
        r >= decodes ? std::to_string(p["prefill_gather_lens"][static_cast<std::size_t>(r - decodes)].get<long>())
                     : "-";
    long seq = 0;
    for (std::size_t t = 0; t < p["tokens"]["token_to_req"].size(); ++t) {
      if (p["tokens"]["token_to_req"][t].get<long>() == r) seq = p["tokens"]["positions"][t].get<long>() + 1;
    }
    os << fmt::format("  {:>4} {:>8} {:>6} {:>7} {:>9} {:>10}\n", r, r < decodes ? "decode" : "prefill", q,
                      q > 0 ? std::to_string(seq) : "?", qsl[static_cast<std::size_t>(r)].get<long>(), gather);
  }
  const json& tk = p["tokens"];
  const bool c4 = tk.contains("c4_slot_mapping"), c128 = tk.contains("c128_slot_mapping");
  os << "\ntokens (slots written; windows and C128A entries attended, oldest first):\n";
  os << fmt::format("  {:>5} {:>4} {:>7} {:>5} {:>9} {:>8} {:>9}  {}\n", "token", "req", "pos", "valid", "swa_slot",
                    "c4_slot", "c128_slot", "window [len]: slots");
  const long tdec = c["num_decode_tokens"].get<long>();
  for (std::size_t t = 0; t < tk["positions"].size(); ++t) {
    const long len = tk["swa_lens"][t].get<long>();
    os << fmt::format(
        "  {:>5} {:>4} {:>7} {:>5} {:>9} {:>8} {:>9}  [{}]: {}\n", t, tk["token_to_req"][t].get<long>(),
        tk["positions"][t].get<long>(), tk["is_valid_token"][t].get<int>(), tk["swa_slot_mapping"][t].get<long>(),
        c4 ? std::to_string(tk["c4_slot_mapping"][t].get<long>()) : "-",
        c128 ? std::to_string(tk["c128_slot_mapping"][t].get<long>()) : "-", len, runs(tk["swa_indices"][t], len));
    if (c128 && tk["token_to_req"][t].get<long>() >= 0) {
      const json& a = p["c128a"];
      const auto ti = static_cast<long>(t);
      if (ti < tdec) {
        const long n = a["decode_lens"][t].get<long>();
        os << fmt::format("  {:>52}  C128A global [{}]: {}\n", "", n, runs(a["decode_indices"][t], n));
      } else if (ti < tdec + c["num_prefill_tokens"].get<long>()) {
        const json& row = a["prefill_indices"][static_cast<std::size_t>(ti - tdec)];
        long n = 0;
        while (n < static_cast<long>(row.size()) && row[static_cast<std::size_t>(n)].get<long>() >= 0) ++n;
        os << fmt::format("  {:>52}  C128A local  [{}]: {}\n", "", n, runs(row, n));
      }
    }
  }
  if (c4) os << "  (C4A attends the indexer's top-k of each token, chosen at run time.)\n";
  os << "\nprefill chunks and workspaces (kv [reqs, M, 512] bf16, indices [tokens, width] i32):\n";
  for (const auto& [name, layer] : p["layers"].items()) {
    os << fmt::format("  {} (compressed top-k width {}):\n", name, layer["compressed_topk_width"].get<long>());
    for (const char* key : {"fixed_chunks", "adaptive_chunks"}) {
      for (const json& ch : layer[key]) {
        os << fmt::format("    {:<9} reqs [{}, {}) tokens [{}, {}) N={} M={} indices [{}, {}]\n",
                          std::string(key).substr(0, std::string(key).find('_')), ch["req_begin"].get<long>(),
                          ch["req_end"].get<long>(), ch["token_begin"].get<long>(), ch["token_end"].get<long>(),
                          ch["compressed_rows"].get<long>(), ch["workspace_rows"].get<long>(),
                          ch["workspace"]["indices"][0].get<long>(), ch["workspace"]["indices"][1].get<long>());
      }
    }
    const json& sw = layer["static_workspace"];
    os << fmt::format("    static    kv [{}, {}, {}], indices [{}, {}]\n", sw["kv"][0].get<long>(),
                      sw["kv"][1].get<long>(), sw["kv"][2].get<long>(), sw["indices"][0].get<long>(),
                      sw["indices"][1].get<long>());
  }
  return os.str();
}

struct PlanOptions {
  std::vector<std::int32_t> query_lens, seq_lens;
  std::vector<int> token_valid;
  std::string batch_file, output;
  bool pretty = false, no_c4 = false, no_c128 = false;
  std::uint64_t permute_seed = 0;
  std::int64_t num_tokens = -1;
  StepConfig config;
};

int fail_plan(const Status& status) {
  fmt::print(stderr, "smla plan: {}\n", status.to_string());
  return 2;
}

int run_plan(const PlanOptions& opt, const std::vector<std::pair<std::string, bool>>& set_flags) {
  PlanInput in;
  if (!opt.batch_file.empty()) {
    auto batch = read_plan_batch(opt.batch_file);
    if (!batch) return fail_plan(batch.status().with_context("--batch "));
    in = std::move(*batch);
  }
  auto is_set = [&](const std::string& name) {
    for (const auto& [flag, set] : set_flags)
      if (flag == name) return set;
    return false;
  };
  // Command-line values override the file's.
  const StepConfig& c = opt.config;
  if (is_set("window")) in.config.window = c.window;
  if (is_set("max-model-len")) in.config.max_model_len = c.max_model_len;
  if (is_set("max-num-batched-tokens")) in.config.max_num_batched_tokens = c.max_num_batched_tokens;
  if (is_set("index-topk")) in.config.index_topk = c.index_topk;
  if (is_set("spec-tokens")) in.config.num_speculative_tokens = c.num_speculative_tokens;
  if (is_set("chunk-size")) in.config.prefill_chunk_size = c.prefill_chunk_size;
  if (is_set("swa-page")) in.config.swa_page_size = c.swa_page_size;
  if (is_set("logical-block")) in.config.logical_block_size = c.logical_block_size;
  if (is_set("c128a-active-width")) in.config.c128a_active_width = c.c128a_active_width;
  if (is_set("num-tokens")) in.num_tokens = opt.num_tokens;
  if (!opt.query_lens.empty() || !opt.seq_lens.empty()) {
    if (opt.query_lens.size() != opt.seq_lens.size()) {
      return fail_plan(invalid_argument("--query-lens", fmt::format("{} values (one per --seq-lens entry)", opt.seq_lens.size()),
                                        std::to_string(opt.query_lens.size())));
    }
    in.query_lens = opt.query_lens;
    in.seq_lens = opt.seq_lens;
    for (auto& g : in.given) g.clear();
  }
  if (!opt.token_valid.empty()) {
    // Exactly 0 or 1: a u8 would turn 256 into 0 and -1 into 255.
    for (std::size_t t = 0; t < opt.token_valid.size(); ++t) {
      if (opt.token_valid[t] != 0 && opt.token_valid[t] != 1) {
        return fail_plan(invalid_argument(fmt::format("--token-valid[{}]", t), "0 or 1",
                                          std::to_string(opt.token_valid[t])));
      }
    }
    in.token_valid.assign(opt.token_valid.begin(), opt.token_valid.end());
  }
  if (opt.no_c4) in.has_c4 = false;
  if (opt.no_c128) in.has_c128 = false;
  if (in.query_lens.empty() && opt.batch_file.empty()) {
    fmt::print(stderr, "smla plan: give --query-lens and --seq-lens, or --batch FILE\n");
    return 2;
  }
  if (Status status = check_plan_input(in); !status.ok()) return fail_plan(status);
  build_plan_tables(in, opt.permute_seed);
  Expected<json> doc = plan_json(in);
  if (!doc) {
    fmt::print(stderr, "smla plan: {}\n", doc.status().to_string());
    return 2;
  }
  const std::string text = opt.pretty ? pretty_text(*doc) : doc->dump(opt.output.empty() ? 1 : 2) + "\n";
  if (opt.output.empty()) {
    fmt::print("{}", text);
  } else {
    std::ofstream file(opt.output);
    file << text;
    if (!file) {
      fmt::print(stderr, "smla plan: --output {}: cannot write\n", opt.output);
      return 2;
    }
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto* cmd =
      app.add_subcommand("plan", "Build the step metadata of a batch and print it (JSON, or tables with --pretty)");
  auto opt = std::make_shared<PlanOptions>();
  cmd->add_option("--query-lens", opt->query_lens, "Query tokens per request, decode-first (e.g. 1,1,200)")
      ->delimiter(',');
  cmd->add_option("--seq-lens", opt->seq_lens, "Context length per request, this step included")->delimiter(',');
  cmd->add_option("--token-valid", opt->token_valid, "Per-token 1/0; 0 marks a padding token (slot -1)")
      ->delimiter(',');
  cmd->add_option("--batch", opt->batch_file, "JSON batch description (format: docs/metadata.md)");
  cmd->add_option("-o,--output", opt->output, "Write to this file instead of stdout");
  cmd->add_flag("--pretty", opt->pretty, "Readable tables instead of JSON");
  cmd->add_flag("--no-c4", opt->no_c4, "The model has no ratio-4 (C4A) group");
  cmd->add_flag("--no-c128", opt->no_c128, "The model has no ratio-128 (C128A) group");
  cmd->add_option("--permute-seed", opt->permute_seed, "Shuffle the generated block tables (0: pages in order)")
      ->check(unsigned_integer());
  std::vector<std::pair<std::string, CLI::Option*>> config_opts = {
      {"num-tokens", cmd->add_option("--num-tokens", opt->num_tokens, "Tokens in the step, trailing padding included")},
      {"window", cmd->add_option("--window", opt->config.window, "Sliding window W (128)")},
      {"max-model-len", cmd->add_option("--max-model-len", opt->config.max_model_len, "Longest context (65536)")},
      {"max-num-batched-tokens",
       cmd->add_option("--max-num-batched-tokens", opt->config.max_num_batched_tokens, "Token budget (8192)")},
      {"index-topk", cmd->add_option("--index-topk", opt->config.index_topk, "C4A top-k K (512)")},
      {"spec-tokens",
       cmd->add_option("--spec-tokens", opt->config.num_speculative_tokens, "MTP speculative tokens (0)")},
      {"chunk-size", cmd->add_option("--chunk-size", opt->config.prefill_chunk_size, "Prefill chunk requests (4)")},
      {"swa-page", cmd->add_option("--swa-page", opt->config.swa_page_size, "SWA page size (64)")},
      {"logical-block",
       cmd->add_option("--logical-block", opt->config.logical_block_size, "Compressed logical block (256)")},
      {"c128a-active-width",
       cmd->add_option("--c128a-active-width", opt->config.c128a_active_width, "C128A active width (0: full)")},
  };
  cmd->callback([&exit_code, opt, config_opts] {
    std::vector<std::pair<std::string, bool>> set;
    for (const auto& [name, o] : config_opts) set.emplace_back(name, o->count() > 0);
    exit_code = run_guarded("smla plan", [&] { return run_plan(*opt, set); });
  });
}

}  // namespace smla::cli
