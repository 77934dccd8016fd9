#include "tools/smla/manifest.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tools/smla/input_files.h"

namespace smla::cli {

namespace {

using Json = nlohmann::json;

// A manifest is a few hundred bytes; anything past this is not one.
constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{1} << 20;

constexpr std::array<std::string_view, 14> kDecodeKeys = {
    "op",           "format",        "softmax_scale", "q",         "main_cache",
    "main_indices", "main_lengths",  "extra_cache",   "extra_indices", "extra_lengths",
    "sink",         "fp8_scale",     "main_page_stride_bytes", "extra_page_stride_bytes"};
constexpr std::array<std::string_view, 8> kPrefillKeys = {"op",          "softmax_scale", "q", "kv", "indices",
                                                          "topk_length", "sink",          "d_v"};

// Reads the typed values of one manifest, each error naming the file and the key.
class ManifestReader {
 public:
  ManifestReader(const Json& root, std::string_view name) : root_(root), name_(name) {}

  Status key_error(std::string_view key, std::string_view expected, std::string_view actual) const {
    return invalid_argument(fmt::format("{}: key '{}'", name_, key), expected, actual);
  }

  Expected<std::string> file(std::string_view key) const {
    auto it = root_.find(key);
    if (it == root_.end()) return key_error(key, "a .npy file name", "no such key");
    return file_value(key, *it);
  }
  Expected<std::optional<std::string>> optional_file(std::string_view key) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return std::optional<std::string>{};
    auto value = file_value(key, *it);
    if (!value) return value.status();
    return std::optional<std::string>(*value);
  }

  Expected<std::string> text(std::string_view key) const {
    auto it = root_.find(key);
    if (it == root_.end()) return key_error(key, "a string", "no such key");
    if (!it->is_string()) return key_error(key, "a string", json_type_name(*it));
    return it->get<std::string>();
  }

  // A finite float; `fallback` when the key is absent (required when fallback is empty).
  Expected<float> number(std::string_view key, std::optional<float> fallback = std::nullopt) const {
    auto it = root_.find(key);
    if (it == root_.end()) {
      if (fallback) return *fallback;
      return key_error(key, "a number", "no such key");
    }
    if (!it->is_number()) return key_error(key, "a number", json_type_name(*it));
    const double value = it->get<double>();
    if (!std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max()) {
      return key_error(key, "a finite f32 number", fmt::format("{}", value));
    }
    return static_cast<float>(value);
  }

  Expected<std::optional<std::int64_t>> optional_integer(std::string_view key, std::int64_t min_value) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return std::optional<std::int64_t>{};
    if (!it->is_number_integer()) return key_error(key, "an integer", json_type_name(*it));
    const std::int64_t value = it->get<std::int64_t>();
    if (value < min_value || (it->is_number_unsigned() && it->get<std::uint64_t>() > std::uint64_t{1} << 62)) {
      return key_error(key, fmt::format("an integer >= {}", min_value), it->dump());
    }
    return std::optional<std::int64_t>(value);
  }

 private:
  Expected<std::string> file_value(std::string_view key, const Json& value) const {
    if (!value.is_string()) return key_error(key, "a .npy file name (string)", json_type_name(value));
    std::string file = value.get<std::string>();
    if (file.empty()) return key_error(key, "a .npy file name", "an empty string");
    for (char c : file) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
        return key_error(key, "a .npy file name without NUL or control characters",
                         fmt::format("'{}'", printable(file)));
      }
    }
    return file;
  }

  const Json& root_;
  std::string_view name_;
};

template <std::size_t N>
Status reject_unknown_keys(const Json& root, const std::array<std::string_view, N>& known, std::string_view op,
                           std::string_view name) {
  for (const auto& [key, value] : root.items()) {
    if (!key.empty() && key.front() == '_') continue;  // free-form comment
    bool found = false;
    for (std::string_view k : known) found = found || k == key;
    if (!found) {
      return invalid_argument(fmt::format("{}: key '{}'", name, printable(key)), fmt::format("a key of op {}", op),
                              "an unknown key (keys starting with '_' are comments)");
    }
  }
  return Status::Ok();
}

Status parse_decode(const ManifestReader& reader, const Json& root, std::string_view name, ReplayManifest& m) {
  SMLA_RETURN_IF_ERROR(reject_unknown_keys(root, kDecodeKeys, "sparse_decode", name));
  auto format_name = reader.text("format");
  if (!format_name) return format_name.status();
  auto format = parse_kv_format(*format_name);
  if (!format) {
    return reader.key_error("format", "one of " + kv_format_names(),
                            fmt::format("'{}'", printable(*format_name)));
  }
  m.format = *format;

  struct Required {
    std::string_view key;
    std::string* field;
  };
  for (const Required& r : {Required{"q", &m.q}, Required{"main_cache", &m.main_cache},
                            Required{"main_indices", &m.main_indices}}) {
    auto file = reader.file(r.key);
    if (!file) return file.status();
    *r.field = *file;
  }
  struct Optional {
    std::string_view key;
    std::optional<std::string>* field;
  };
  for (const Optional& o : {Optional{"main_lengths", &m.main_lengths}, Optional{"extra_cache", &m.extra_cache},
                            Optional{"extra_indices", &m.extra_indices}, Optional{"extra_lengths", &m.extra_lengths},
                            Optional{"sink", &m.sink}}) {
    auto file = reader.optional_file(o.key);
    if (!file) return file.status();
    *o.field = *file;
  }
  if (m.extra_cache.has_value() != m.extra_indices.has_value()) {
    const std::string_view missing = m.extra_cache ? "extra_indices" : "extra_cache";
    return reader.key_error(missing, "present (extra_cache and extra_indices come together)", "no such key");
  }
  if (m.extra_lengths && !m.extra_cache) {
    return reader.key_error("extra_lengths", "only with extra_cache", "extra_lengths without extra_cache");
  }
  auto fp8_scale = reader.number("fp8_scale", 1.0f);
  if (!fp8_scale) return fp8_scale.status();
  if (root.contains("fp8_scale") && !kv_format_info(m.format).per_tensor_scale) {
    return reader.key_error("fp8_scale", "only with a format that has a per-tensor scale (fp8-rows)",
                            fmt::format("fp8_scale with format {}", kv_format_name(m.format)));
  }
  m.fp8_scale = *fp8_scale;
  auto main_stride = reader.optional_integer("main_page_stride_bytes", 0);
  if (!main_stride) return main_stride.status();
  m.main_page_stride_bytes = *main_stride;
  auto extra_stride = reader.optional_integer("extra_page_stride_bytes", 0);
  if (!extra_stride) return extra_stride.status();
  if (*extra_stride && !m.extra_cache) {
    return reader.key_error("extra_page_stride_bytes", "only with extra_cache", "no extra_cache");
  }
  m.extra_page_stride_bytes = *extra_stride;
  return Status::Ok();
}

Status parse_prefill(const ManifestReader& reader, const Json& root, std::string_view name, ReplayManifest& m) {
  SMLA_RETURN_IF_ERROR(reject_unknown_keys(root, kPrefillKeys, "sparse_prefill", name));
  for (auto [key, field] : {std::pair<std::string_view, std::string*>{"q", &m.q}, {"kv", &m.kv}, {"indices", &m.indices}}) {
    auto file = reader.file(key);
    if (!file) return file.status();
    *field = *file;
  }
  for (auto [key, field] : {std::pair<std::string_view, std::optional<std::string>*>{"topk_length", &m.topk_length},
                            {"sink", &m.sink}}) {
    auto file = reader.optional_file(key);
    if (!file) return file.status();
    *field = *file;
  }
  auto d_v = reader.optional_integer("d_v", 1);
  if (!d_v) return d_v.status();
  if (d_v->has_value()) {
    if (**d_v > std::numeric_limits<int>::max()) return reader.key_error("d_v", "a positive int", fmt::format("{}", **d_v));
    m.d_v = static_cast<int>(**d_v);
  }
  return Status::Ok();
}

}  // namespace

std::string_view json_type_name(const Json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_float()) return "a number with a fraction or exponent";
  if (value.is_number()) return "an integer";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  return "an object";
}

Expected<nlohmann::json> parse_json_text(std::string_view text, std::string_view name) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // e.byte is 1-based: the position of the byte that stopped the parser.
    const std::size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    return invalid_argument(name, "valid JSON",
                            fmt::format("a syntax error at {} (byte {}): {}", line_column(text, offset), offset,
                                        printable(e.what())));
  } catch (const Json::exception& e) {
    return invalid_argument(name, "valid JSON", printable(e.what()));
  }
}

std::string_view replay_op_name(ReplayOp op) {
  return op == ReplayOp::kSparseDecode ? "sparse_decode" : "sparse_prefill";
}

Expected<ReplayManifest> parse_manifest(std::string_view json_text, std::string_view name) {
  auto parsed = parse_json_text(json_text, name);
  if (!parsed) return parsed.status();
  const Json& root = *parsed;
  if (!root.is_object()) return invalid_argument(name, "a JSON object", json_type_name(root));
  const ManifestReader reader(root, name);
  auto op = reader.text("op");
  if (!op) return op.status();
  ReplayManifest manifest;
  if (*op == replay_op_name(ReplayOp::kSparseDecode)) {
    manifest.op = ReplayOp::kSparseDecode;
  } else if (*op == replay_op_name(ReplayOp::kSparsePrefill)) {
    manifest.op = ReplayOp::kSparsePrefill;
  } else {
    return reader.key_error("op", "sparse_decode or sparse_prefill", fmt::format("'{}'", printable(*op)));
  }
  auto scale = reader.number("softmax_scale");
  if (!scale) return scale.status();
  manifest.softmax_scale = *scale;
  if (manifest.op == ReplayOp::kSparseDecode) {
    SMLA_RETURN_IF_ERROR(parse_decode(reader, root, name, manifest));
  } else {
    SMLA_RETURN_IF_ERROR(parse_prefill(reader, root, name, manifest));
  }
  return manifest;
}

Expected<ReplayManifest> read_manifest(const std::filesystem::path& dir) {
  SMLA_RETURN_IF_ERROR(check_input_directory(dir, "a replay case directory"));
  const std::filesystem::path path = dir / kManifestFileName;
  auto text = read_text_file(path, "a manifest file (JSON)", kMaxManifestBytes);
  if (!text) return text.status();
  return parse_manifest(*text, printable(path.string()));
}

std::string manifest_to_json(const ReplayManifest& m) {
  Json root;
  root["op"] = replay_op_name(m.op);
  root["softmax_scale"] = m.softmax_scale;
  root["q"] = m.q;
  if (m.sink) root["sink"] = *m.sink;
  if (m.op == ReplayOp::kSparseDecode) {
    root["format"] = kv_format_name(m.format);
    root["main_cache"] = m.main_cache;
    root["main_indices"] = m.main_indices;
    if (m.main_lengths) root["main_lengths"] = *m.main_lengths;
    if (m.extra_cache) root["extra_cache"] = *m.extra_cache;
    if (m.extra_indices) root["extra_indices"] = *m.extra_indices;
    if (m.extra_lengths) root["extra_lengths"] = *m.extra_lengths;
    if (kv_format_info(m.format).per_tensor_scale) root["fp8_scale"] = m.fp8_scale;
    if (m.main_page_stride_bytes) root["main_page_stride_bytes"] = *m.main_page_stride_bytes;
    if (m.extra_page_stride_bytes) root["extra_page_stride_bytes"] = *m.extra_page_stride_bytes;
  } else {
    root["kv"] = m.kv;
    root["indices"] = m.indices;
    if (m.topk_length) root["topk_length"] = *m.topk_length;
    root["d_v"] = m.d_v;
  }
  return root.dump(2) + "\n";
}

}  // namespace smla::cli
