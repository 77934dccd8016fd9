// Layer types and the step configuration (spec 1.2, 2.1).
#include <fmt/format.h>

#include "smla/metadata.h"
#include "src/core/metadata/metadata_rules.h"

namespace smla {

Expected<LayerType> layer_type_for_ratio(int compress_ratio) {
  switch (compress_ratio) {
    case 1:
      return LayerType::kSwaOnly;
    case 4:
      return LayerType::kC4A;
    case 128:
      return LayerType::kC128A;
    default:
      break;
  }
  return invalid_argument("compress_ratio", "1 (SWA-only), 4 (C4A) or 128 (C128A)", std::to_string(compress_ratio));
}

std::string_view layer_type_name(LayerType type) {
  switch (type) {
    case LayerType::kSwaOnly:
      return "swa-only";
    case LayerType::kC4A:
      return "c4a";
    case LayerType::kC128A:
      return "c128a";
  }
  return "unknown";
}

namespace {

Status check_range(std::string_view name, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) {
    return invalid_argument(name, fmt::format("a value in [{}, {}]", lo, hi), std::to_string(value));
  }
  return Status::Ok();
}

}  // namespace

Status validate_step_config(const StepConfig& c) {
  // Bounds keep every slot, index and workspace offset inside i32.
  constexpr std::int64_t kMaxLen = std::int64_t{1} << 28;
  SMLA_RETURN_IF_ERROR(check_range("config.window", c.window, 1, 1 << 16).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(check_range("config.max_model_len", c.max_model_len, 1, kMaxLen).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(
      check_range("config.max_num_batched_tokens", c.max_num_batched_tokens, 1, 1 << 24).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(check_range("config.index_topk", c.index_topk, 1, 1 << 16).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(
      check_range("config.num_speculative_tokens", c.num_speculative_tokens, 0, 64).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(
      check_range("config.prefill_chunk_size", c.prefill_chunk_size, 1, 1 << 16).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(check_range("config.swa_page_size", c.swa_page_size, 1, 1 << 16).with_context("step config: "));
  SMLA_RETURN_IF_ERROR(
      check_range("config.logical_block_size", c.logical_block_size, 128, 1 << 16).with_context("step config: "));
  if (c.logical_block_size % 128 != 0) {
    return invalid_argument("config.logical_block_size", "a multiple of 128 (every ratio divides it)",
                            std::to_string(c.logical_block_size))
        .with_context("step config: ");
  }
  SMLA_RETURN_IF_ERROR(
      check_range("config.c128a_active_width", c.c128a_active_width, 0, c128a_width(c)).with_context("step config: "));
  return Status::Ok();
}

std::int64_t compressed_block_size(const StepConfig& config, int compress_ratio) {
  return compress_ratio > 0 ? config.logical_block_size / compress_ratio : 0;
}

std::int64_t c128a_width(const StepConfig& config) {
  return detail::roundup(detail::cdiv(config.max_model_len, 128), 128);
}

std::int64_t compressed_topk_width(const StepConfig& config, LayerType type) {
  switch (type) {
    case LayerType::kC4A:
      return config.index_topk;
    case LayerType::kC128A:
      return c128a_width(config);
    case LayerType::kSwaOnly:
      break;
  }
  return 0;
}

std::int64_t combined_index_width(const StepConfig& config, LayerType type) {
  return detail::roundup(compressed_topk_width(config, type) + config.window, 128);
}

}  // namespace smla
