// write_replay_case: the inverse of replay_case, used by tests and by anyone
// who wants to keep a call for later.
#include <fmt/format.h>

#include <fstream>
#include <system_error>

#include "tools/smla/npy.h"
#include "tools/smla/replay.h"

namespace smla::cli {

namespace {

namespace fs = std::filesystem;

// The page stride to record: nothing when the pages are packed.
std::optional<std::int64_t> recorded_page_stride(const KvCacheView& cache) {
  const auto content = cache.page_size() * cache.pages.shape[2] * static_cast<std::int64_t>(dtype_size(cache.pages.dtype));
  if (cache.num_pages() <= 1 || cache.page_stride_bytes() == content) return std::nullopt;
  return cache.page_stride_bytes();
}

// The files of one case, converted before anything is written so that a bad
// argument leaves the directory untouched.
class CaseFiles {
 public:
  Status add(std::string_view key, const TensorView& view, std::string& file) {
    auto array = npy_from_tensor(view, key);
    if (!array) return array.status();
    file = fmt::format("{}.npy", key);
    arrays_.emplace_back(file, std::move(*array));
    return Status::Ok();
  }
  Status add_optional(std::string_view key, const TensorView& view, std::optional<std::string>& file) {
    if (!view.present()) return Status::Ok();
    file.emplace();
    return add(key, view, *file);
  }

  Status write(const fs::path& dir, const ReplayManifest& manifest) const {
    std::error_code error;
    fs::create_directories(dir, error);
    if (error) return invalid_argument(dir.string(), "a writable directory", error.message());
    for (const auto& [file, array] : arrays_) SMLA_RETURN_IF_ERROR(write_npy(dir / file, array));
    const fs::path path = dir / kManifestFileName;
    std::ofstream stream(path, std::ios::trunc);
    stream << manifest_to_json(manifest);
    if (!stream) return invalid_argument(path.string(), "a writable file", "write failed");
    return Status::Ok();
  }

 private:
  std::vector<std::pair<std::string, NpyArray>> arrays_;
};

}  // namespace

Status write_replay_case(const fs::path& dir, const SparseDecodeArgs& args, bool with_outputs) {
  if (args.extra_cache && args.extra_cache->format != args.main_cache.format) {
    return invalid_argument("extra_cache.format",
                            fmt::format("the main cache's format {}", kv_format_name(args.main_cache.format)),
                            kv_format_name(args.extra_cache->format));
  }
  ReplayManifest m;
  m.op = ReplayOp::kSparseDecode;
  m.format = args.main_cache.format;
  m.softmax_scale = args.softmax_scale;
  m.fp8_scale = args.main_cache.fp8_scale;
  CaseFiles files;
  SMLA_RETURN_IF_ERROR(files.add("q", args.q, m.q));
  SMLA_RETURN_IF_ERROR(files.add("main_cache", args.main_cache.pages, m.main_cache));
  m.main_page_stride_bytes = recorded_page_stride(args.main_cache);
  SMLA_RETURN_IF_ERROR(files.add("main_indices", args.main_indices, m.main_indices));
  SMLA_RETURN_IF_ERROR(files.add_optional("main_lengths", args.main_lengths, m.main_lengths));
  if (args.extra_cache) {
    m.extra_cache.emplace();
    m.extra_indices.emplace();
    SMLA_RETURN_IF_ERROR(files.add("extra_cache", args.extra_cache->pages, *m.extra_cache));
    m.extra_page_stride_bytes = recorded_page_stride(*args.extra_cache);
    SMLA_RETURN_IF_ERROR(files.add("extra_indices", args.extra_indices, *m.extra_indices));
    SMLA_RETURN_IF_ERROR(files.add_optional("extra_lengths", args.extra_lengths, m.extra_lengths));
  }
  SMLA_RETURN_IF_ERROR(files.add_optional("sink", args.sink, m.sink));
  if (with_outputs) {
    std::optional<std::string> unused;
    SMLA_RETURN_IF_ERROR(files.add_optional("out", args.out, unused));
    SMLA_RETURN_IF_ERROR(files.add_optional("lse", args.lse, unused));
  }
  return files.write(dir, m);
}

Status write_replay_case(const fs::path& dir, const SparsePrefillArgs& args, bool with_outputs) {
  ReplayManifest m;
  m.op = ReplayOp::kSparsePrefill;
  m.softmax_scale = args.softmax_scale;
  m.d_v = args.d_v;
  CaseFiles files;
  SMLA_RETURN_IF_ERROR(files.add("q", args.q, m.q));
  SMLA_RETURN_IF_ERROR(files.add("kv", args.kv, m.kv));
  SMLA_RETURN_IF_ERROR(files.add("indices", args.indices, m.indices));
  SMLA_RETURN_IF_ERROR(files.add_optional("topk_length", args.topk_length, m.topk_length));
  SMLA_RETURN_IF_ERROR(files.add_optional("sink", args.sink, m.sink));
  if (with_outputs) {
    std::optional<std::string> unused;
    SMLA_RETURN_IF_ERROR(files.add_optional("out", args.out, unused));
    SMLA_RETURN_IF_ERROR(files.add_optional("max_logits", args.max_logits, unused));
    SMLA_RETURN_IF_ERROR(files.add_optional("lse", args.lse, unused));
  }
  return files.write(dir, m);
}

}  // namespace smla::cli
