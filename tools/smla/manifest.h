// manifest.json of a replay directory: which attention op, its scalar
// arguments, and the .npy file holding each tensor argument.
// docs/replay.md documents every key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "smla/kv_format.h"
#include "smla/status.h"

namespace smla::cli {

enum class ReplayOp : std::uint8_t { kSparseDecode, kSparsePrefill };

std::string_view replay_op_name(ReplayOp op);  // "sparse_decode", "sparse_prefill"

// File names are relative to the replay directory. Absent optional keys are
// std::nullopt. Keys that only one op uses are ignored by the other's loader
// (the parser refuses them, so they are never set).
struct ReplayManifest {
  ReplayOp op = ReplayOp::kSparseDecode;
  float softmax_scale = 0.0f;
  std::optional<std::string> sink;

  // sparse_decode
  KvFormat format = KvFormat::kV4Fp8;
  std::string q;
  std::string main_cache;
  std::string main_indices;
  std::optional<std::string> main_lengths;
  std::optional<std::string> extra_cache;
  std::optional<std::string> extra_indices;
  std::optional<std::string> extra_lengths;
  float fp8_scale = 1.0f;
  std::optional<std::int64_t> main_page_stride_bytes;
  std::optional<std::int64_t> extra_page_stride_bytes;

  // sparse_prefill (q and sink shared with decode)
  std::string kv;
  std::string indices;
  std::optional<std::string> topk_length;
  int d_v = 512;
};

inline constexpr std::string_view kManifestFileName = "manifest.json";

// Parses JSON text; a syntax error names `name`, the line, column and byte.
// Shared by the manifest and `smla plan --batch`.
Expected<nlohmann::json> parse_json_text(std::string_view text, std::string_view name);
// "null", "a boolean", "an integer", "a number with a fraction or exponent", "a string", "an array", "an object".
std::string_view json_type_name(const nlohmann::json& value);

// Parses and checks the JSON text: required keys present, every value of the
// right JSON type, op and format known, no unknown keys (keys starting with '_'
// are free-form comments), extra_cache and extra_indices given together.
// Errors name the file (`name`) and the key.
Expected<ReplayManifest> parse_manifest(std::string_view json_text, std::string_view name);
// dir must be a readable directory and dir/manifest.json a regular file of at
// most 1 MiB; a directory, FIFO, missing file... is named as such.
Expected<ReplayManifest> read_manifest(const std::filesystem::path& dir);

// JSON text with exactly the keys that are set (the inverse of parse_manifest).
std::string manifest_to_json(const ReplayManifest& manifest);

}  // namespace smla::cli
