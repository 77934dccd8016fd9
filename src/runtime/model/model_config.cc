// Model presets (spec 1.1).
#include <fmt/format.h>

#include "smla/model.h"
#include "src/runtime/model/model_common.h"

namespace smla {

Expected<ModelConfig> ModelConfig::preset(std::string_view name, int layers) {
  constexpr int kMaxLayers = 64;
  if (layers < 1 || layers > kMaxLayers) {
    return invalid_argument("layers", fmt::format("a count in [1, {}]", kMaxLayers), std::to_string(layers));
  }
  ModelConfig c;
  c.name = std::string(name);
  if (name == "v4-flash") {
    // hidden 4096, 64 heads, q_lora 1024, o_lora 1024 x 8 groups, top-k 512.
  } else if (name == "v4-pro") {
    c.hidden = 7168;
    c.num_heads = 128;
    c.q_lora_rank = 1536;
    c.o_groups = 16;
    c.index_topk = 1024;
  } else if (name == "tiny") {
    // Same layer structure with small widths; a short window and top-k so short
    // prompts still exercise window eviction and the indexer's selection.
    c.hidden = 256;
    c.num_heads = 4;
    c.q_lora_rank = 128;
    c.o_lora_rank = 64;
    c.o_groups = 2;
    c.window = 32;
    c.index_topk = 16;
    c.index_heads = 8;
  } else {
    return invalid_argument("model", "one of v4-flash, v4-pro, tiny", fmt::format("'{}'", name));
  }
  // Layer 0 SWA-only, then C4A / C128A alternating: 3 layers cover every type.
  for (int l = 0; l < layers; ++l) c.compress_ratios.push_back(l == 0 ? 1 : (l % 2 == 1 ? 4 : 128));
  return c;
}

Expected<StepConfig> model_detail::model_step_config(const ModelConfig& config, const ModelOptions& options) {
  if (config.hidden < 1 || config.num_heads < 1 || config.q_lora_rank < 1 || config.o_lora_rank < 1 ||
      config.o_groups < 1 || config.num_heads % config.o_groups != 0 || config.index_heads < 1 ||
      config.index_topk < 1 || config.window < 1 || config.compress_ratios.empty()) {
    return invalid_argument("config", "positive sizes, o_groups dividing num_heads, at least one layer",
                            fmt::format("hidden {} heads {} groups {} layers {}", config.hidden, config.num_heads,
                                        config.o_groups, config.compress_ratios.size()));
  }
  if (kv_format_info(options.kv_format).head_dim != V4Fp8Format::kHeadDim) {
    return invalid_argument("options.kv_format", "a 512-dim V4 format", kv_format_name(options.kv_format));
  }
  if (options.max_requests < 1 || options.max_model_len < 1 || options.max_batched_tokens < 1 ||
      options.num_speculative_tokens < 0 || options.verify_rows < 1) {
    return invalid_argument("options", "positive limits",
                            fmt::format("max_requests {} max_model_len {} max_batched_tokens {} "
                                        "num_speculative_tokens {} verify_rows {}",
                                        options.max_requests, options.max_model_len, options.max_batched_tokens,
                                        options.num_speculative_tokens, options.verify_rows));
  }
  StepConfig step;
  step.window = config.window;
  step.max_model_len = options.max_model_len;
  step.max_num_batched_tokens = options.max_batched_tokens;
  step.index_topk = config.index_topk;
  step.num_speculative_tokens = options.num_speculative_tokens;
  step.swa_page_size = kModelSwaPage;
  step.logical_block_size = kModelLogicalBlock;
  SMLA_RETURN_IF_ERROR(validate_step_config(step));
  return step;
}

}  // namespace smla
