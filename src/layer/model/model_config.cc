// Model presets (spec 1.1).
#include <fmt/format.h>

#include "smla/model.h"

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

}  // namespace smla
