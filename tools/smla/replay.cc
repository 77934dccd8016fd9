#include "tools/smla/replay.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <optional>
#include <string_view>
#include <system_error>

#include "smla/numeric.h"
#include "testkit/testkit.h"
#include "tools/smla/check.h"
#include "tools/smla/input_files.h"
#include "tools/smla/npy.h"
#include "tools/smla/run_op.h"

namespace smla::cli {

namespace {

namespace fs = std::filesystem;
using testkit::HostTensor;

// Poured into the padding between cache pages: NaN in every element type
// (e4m3 0xFF, bf16 0xFFFF, UE8M0 0xFF), so a kernel that reads padding shows it.
constexpr unsigned char kPagePaddingByte = 0xFF;

std::string key_label(std::string_view key, const std::string& file) { return fmt::format("key '{}' ({})", key, file); }

std::string_view accepted_descr(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "'<u2' (bf16 raw bits) or '<f4'";
    case DType::kE4M3:
    case DType::kU8: return "'|u1'";
    case DType::kI32: return "'<i4'";
    case DType::kF32: return "'<f4'";
    default: return "(unsupported)";
  }
}

// A contiguous tensor of `dtype` holding the array's values; `label` names it in errors.
Expected<HostTensor> tensor_from_array(const NpyArray& array, DType dtype, const std::string& label) {
  auto storage = npy_dtype_for(dtype, label);
  if (!storage) return storage.status();
  HostTensor tensor = HostTensor::zeros(dtype, array.shape);
  if (array.dtype == *storage) {
    std::memcpy(tensor.bytes(), array.data.data(), array.data.size());
  } else if (dtype == DType::kBF16 && array.dtype == NpyDType::kF32) {
    auto* bits = reinterpret_cast<std::uint16_t*>(tensor.bytes());
    for (std::int64_t i = 0; i < array.numel(); ++i) {
      float value;
      std::memcpy(&value, array.data.data() + i * 4, sizeof value);
      bits[i] = f32_to_bf16(value);
    }
  } else {
    return invalid_argument(label, fmt::format("dtype {}", accepted_descr(dtype)),
                            fmt::format("'{}'", npy_dtype_descr(array.dtype)));
  }
  return tensor;
}

// Reads dir/file for manifest key `key` as a contiguous tensor of `dtype` and `rank`.
Expected<HostTensor> load_tensor(const fs::path& dir, std::string_view key, const std::string& file, DType dtype,
                                 int rank) {
  auto array = read_npy(dir / file);
  if (!array) return array.status().with_context(fmt::format("key '{}': ", key));
  const std::string label = key_label(key, file);
  if (static_cast<int>(array->shape.size()) != rank) {
    return invalid_argument(label, fmt::format("rank {}", rank), fmt::format("shape {}", array->describe()));
  }
  return tensor_from_array(*array, dtype, label);
}

// One expected extent; value < 0 accepts any extent.
struct Dim {
  std::int64_t value;
  std::string_view name;
};

Status check_dims(std::string_view key, const std::string& file, const HostTensor& tensor,
                  std::initializer_list<Dim> dims) {
  if (!tensor.present()) return Status::Ok();
  const TensorView& view = tensor.view();
  bool ok = true;
  std::string expected = "[";
  std::size_t d = 0;
  for (const Dim& dim : dims) {
    if (d) expected += ", ";
    expected += dim.value < 0 ? std::string(dim.name) : fmt::format("{}={}", dim.name, dim.value);
    ok = ok && (dim.value < 0 || view.shape[d] == dim.value);
    ++d;
  }
  expected += "]";
  if (ok) return Status::Ok();
  return invalid_argument(key_label(key, file), fmt::format("shape {}", expected), view.shape_string());
}

// A cache stored densely as [num_pages, page_size, row]; page_stride_bytes
// (when given) re-lays the pages at that stride, padding filled with NaN bytes.
Expected<KvCacheView> load_cache(const fs::path& dir, std::string_view key, const std::string& file,
                                 std::string_view stride_key, std::optional<std::int64_t> page_stride_bytes,
                                 const ReplayManifest& manifest, HostTensor& storage) {
  const KvFormatInfo info = kv_format_info(manifest.format);
  auto dense = load_tensor(dir, key, file, info.storage_dtype, 3);
  if (!dense) return dense.status();
  const TensorView& view = dense->view();
  if (view.shape[2] != info.row_elements) {
    return invalid_argument(key_label(key, file),
                            fmt::format("shape [num_pages, page_size, {}] for format {}", info.row_elements, info.name),
                            view.shape_string());
  }
  const auto item = static_cast<std::int64_t>(dtype_size(info.storage_dtype));
  const std::int64_t content_bytes = view.shape[1] * view.shape[2] * item;
  const std::int64_t stride_bytes = page_stride_bytes.value_or(content_bytes);
  if (stride_bytes < content_bytes || stride_bytes % item != 0) {
    return invalid_argument(fmt::format("key '{}'", stride_key),
                            fmt::format("a multiple of {} bytes >= {} (page_size {} x {} B)", item, content_bytes,
                                        view.shape[1], view.shape[2] * item),
                            fmt::format("{}", stride_bytes));
  }
  // The relayout holds every page at the new stride: its size is checked before it is allocated.
  const std::int64_t num_pages = view.shape[0];
  const long double relayout_bytes =
      num_pages == 0 ? 0.0L
                     : static_cast<long double>(num_pages - 1) * static_cast<long double>(stride_bytes) +
                           static_cast<long double>(content_bytes);
  SMLA_RETURN_IF_ERROR(check_allocation(
      fmt::format("key '{}'", stride_key),
      fmt::format("a stride whose relayout of {} pages ({} dense) stays", num_pages,
                  format_bytes(static_cast<long double>(num_pages) * static_cast<long double>(content_bytes))),
      relayout_bytes));
  if (stride_bytes == content_bytes) {
    storage = std::move(*dense);
  } else {
    storage = HostTensor::zeros(info.storage_dtype, {view.shape[0], view.shape[1], view.shape[2]},
                                {stride_bytes / item, view.shape[2], 1});
    std::memset(storage.bytes(), kPagePaddingByte, storage.size_bytes());
    for (std::int64_t page = 0; page < view.shape[0]; ++page) {
      std::memcpy(storage.bytes() + page * stride_bytes, dense->bytes() + page * content_bytes,
                  static_cast<std::size_t>(content_bytes));
    }
  }
  KvCacheView cache;
  cache.pages = storage.view();
  cache.format = manifest.format;
  cache.fp8_scale = manifest.fp8_scale;
  return cache;
}

Status write_tensor(const fs::path& path, const TensorView& view) {
  auto array = npy_from_tensor(view, path.string());
  if (!array) return array.status();
  return write_npy(path, *array);
}

// Loads the tensors of one case, keeps them alive and lists their shapes in the report.
class CaseLoader {
 public:
  CaseLoader(const fs::path& dir, const ReplayManifest& manifest, ReplayReport& report)
      : dir_(dir), manifest_(manifest), report_(report) {}

  Expected<TensorView> required(std::string_view key, const std::string& file, DType dtype,
                                std::initializer_list<Dim> dims) {
    auto tensor = load_tensor(dir_, key, file, dtype, static_cast<int>(dims.size()));
    if (!tensor) return tensor.status();
    SMLA_RETURN_IF_ERROR(check_dims(key, file, *tensor, dims));
    return keep(key, std::move(*tensor));
  }
  // An absent file gives an absent view.
  Expected<TensorView> optional(std::string_view key, const std::optional<std::string>& file, DType dtype,
                                std::initializer_list<Dim> dims) {
    if (!file) return TensorView{};
    return required(key, *file, dtype, dims);
  }
  Expected<KvCacheView> cache(std::string_view key, const std::string& file, std::string_view stride_key,
                              std::optional<std::int64_t> page_stride_bytes) {
    HostTensor storage;
    auto cache = load_cache(dir_, key, file, stride_key, page_stride_bytes, manifest_, storage);
    if (!cache) return cache.status();
    keep(key, std::move(storage));
    return cache;
  }
  // A poisoned output, so an element a backend forgets to write shows up as NaN.
  TensorView output(std::string file, DType dtype, const std::vector<std::int64_t>& shape) {
    HostTensor tensor = HostTensor::zeros(dtype, shape);
    testkit::poison(tensor.view());
    outputs_.emplace_back(std::move(file), tensor.view());
    storage_.push_back(std::move(tensor));
    return outputs_.back().second;
  }
  const fs::path& dir() const { return dir_; }
  // Output file names and views, in the order they are written.
  const std::vector<std::pair<std::string, TensorView>>& outputs() const { return outputs_; }

 private:
  TensorView keep(std::string_view key, HostTensor tensor) {
    report_.shapes.push_back(fmt::format("{}: {}", key, tensor.view().describe()));
    storage_.push_back(std::move(tensor));  // the bytes live on the heap: views stay valid
    return storage_.back().view();
  }

  const fs::path& dir_;
  const ReplayManifest& manifest_;
  ReplayReport& report_;
  std::vector<HostTensor> storage_;
  std::vector<std::pair<std::string, TensorView>> outputs_;
};

// The manifest key a library error is about: the argument name it starts with,
// after the entry's name ("sparse_decode: main_lengths[0]: ..." -> "main_lengths"), or empty.
std::string_view argument_of(std::string_view message) {
  for (std::string_view entry : {"sparse_decode: ", "sparse_prefill: "}) {
    if (message.substr(0, entry.size()) == entry) message.remove_prefix(entry.size());
  }
  std::size_t end = 0;
  while (end < message.size() && (std::islower(static_cast<unsigned char>(message[end])) != 0 ||
                                  std::isdigit(static_cast<unsigned char>(message[end])) != 0 || message[end] == '_')) {
    ++end;
  }
  return message.substr(0, end);
}

// Prefixes a failed library call's status with the manifest and, when the
// argument it names was loaded from a file, that file and its key.
Status in_case_files(const Status& status, const ReplayManifest& m, const fs::path& dir) {
  if (status.ok()) return status;
  const std::string manifest = printable((dir / kManifestFileName).string());
  const std::string_view argument = argument_of(status.message());
  const std::pair<std::string_view, const std::optional<std::string>> files[] = {
      {"q", m.q},
      {"main_cache", m.main_cache},
      {"main_indices", m.main_indices},
      {"main_lengths", m.main_lengths},
      {"extra_cache", m.extra_cache},
      {"extra_indices", m.extra_indices},
      {"extra_lengths", m.extra_lengths},
      {"sink", m.sink},
      {"kv", m.kv},
      {"indices", m.indices},
      {"topk_length", m.topk_length}};
  for (const auto& [key, file] : files) {
    if (argument == key && file && !file->empty()) {
      return status.with_context(fmt::format("{}: key '{}' ({}): ", manifest, key, printable((dir / *file).string())));
    }
  }
  if (!argument.empty()) return status.with_context(fmt::format("{}: key '{}': ", manifest, argument));
  return status.with_context(fmt::format("{}: ", manifest));
}

Status replay_decode(const ReplayManifest& m, Backend backend, CaseLoader& load, ReplayReport& report) {
  const KvFormatInfo info = kv_format_info(m.format);
  SparseDecodeArgs args;
  auto q = load.required("q", m.q, DType::kBF16, {{-1, "T"}, {-1, "h_q"}, {info.head_dim, "d_qk"}});
  if (!q) return q.status();
  const std::int64_t tokens = q->shape[0];
  const std::int64_t heads = q->shape[1];
  args.q = *q;
  SMLA_ASSIGN_OR_RETURN(args.main_cache,
                        load.cache("main_cache", m.main_cache, "main_page_stride_bytes", m.main_page_stride_bytes));
  SMLA_ASSIGN_OR_RETURN(args.main_indices,
                        load.required("main_indices", m.main_indices, DType::kI32, {{tokens, "T"}, {-1, "k_main"}}));
  SMLA_ASSIGN_OR_RETURN(args.main_lengths, load.optional("main_lengths", m.main_lengths, DType::kI32, {{tokens, "T"}}));
  if (m.extra_cache) {
    SMLA_ASSIGN_OR_RETURN(args.extra_cache, load.cache("extra_cache", *m.extra_cache, "extra_page_stride_bytes",
                                                       m.extra_page_stride_bytes));
    SMLA_ASSIGN_OR_RETURN(args.extra_indices, load.optional("extra_indices", m.extra_indices, DType::kI32,
                                                            {{tokens, "T"}, {-1, "k_extra"}}));
    SMLA_ASSIGN_OR_RETURN(args.extra_lengths,
                          load.optional("extra_lengths", m.extra_lengths, DType::kI32, {{tokens, "T"}}));
  }
  SMLA_ASSIGN_OR_RETURN(args.sink, load.optional("sink", m.sink, DType::kF32, {{heads, "h_q"}}));
  args.softmax_scale = m.softmax_scale;
  args.out = load.output("out.npy", DType::kBF16, {tokens, heads, info.value_dim});
  args.lse = load.output("lse.npy", DType::kF32, {tokens, heads});
  std::vector<double> seconds;
  SMLA_RETURN_IF_ERROR(in_case_files(run_sparse_decode(args, backend, 1, &seconds), m, load.dir()));
  report.seconds = seconds.front();
  return Status::Ok();
}

Status replay_prefill(const ReplayManifest& m, Backend backend, CaseLoader& load, ReplayReport& report) {
  SparsePrefillArgs args;
  auto q = load.required("q", m.q, DType::kBF16, {{-1, "s_q"}, {-1, "h_q"}, {-1, "d_qk"}});
  if (!q) return q.status();
  const std::int64_t queries = q->shape[0];
  const std::int64_t heads = q->shape[1];
  const std::int64_t d_qk = q->shape[2];
  args.q = *q;
  SMLA_ASSIGN_OR_RETURN(args.kv, load.required("kv", m.kv, DType::kBF16, {{-1, "s_kv"}, {d_qk, "d_qk"}}));
  SMLA_ASSIGN_OR_RETURN(args.indices,
                        load.required("indices", m.indices, DType::kI32, {{queries, "s_q"}, {-1, "topk"}}));
  SMLA_ASSIGN_OR_RETURN(args.topk_length, load.optional("topk_length", m.topk_length, DType::kI32, {{queries, "s_q"}}));
  SMLA_ASSIGN_OR_RETURN(args.sink, load.optional("sink", m.sink, DType::kF32, {{heads, "h_q"}}));
  if (m.d_v > d_qk) {
    return invalid_argument("key 'd_v'", fmt::format("at most d_qk = {}", d_qk), fmt::format("{}", m.d_v));
  }
  args.d_v = m.d_v;
  args.softmax_scale = m.softmax_scale;
  args.out = load.output("out.npy", DType::kBF16, {queries, heads, m.d_v});
  args.max_logits = load.output("max_logits.npy", DType::kF32, {queries, heads});
  args.lse = load.output("lse.npy", DType::kF32, {queries, heads});
  std::vector<double> seconds;
  SMLA_RETURN_IF_ERROR(in_case_files(run_sparse_prefill(args, backend, 1, &seconds), m, load.dir()));
  report.seconds = seconds.front();
  return Status::Ok();
}

}  // namespace

Expected<ReplayReport> replay_case(const fs::path& case_dir, const fs::path& out_dir, Backend backend) {
  auto manifest = read_manifest(case_dir);
  if (!manifest) return manifest.status();
  ReplayReport report;
  report.op = manifest->op;
  report.backend = resolve_backend(backend);
  CaseLoader load(case_dir, *manifest, report);
  if (manifest->op == ReplayOp::kSparseDecode) {
    SMLA_RETURN_IF_ERROR(replay_decode(*manifest, backend, load, report));
  } else {
    SMLA_RETURN_IF_ERROR(replay_prefill(*manifest, backend, load, report));
  }
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error) return invalid_argument(out_dir.string(), "a writable output directory", error.message());
  for (const auto& [file, view] : load.outputs()) {
    SMLA_RETURN_IF_ERROR(write_tensor(out_dir / file, view));
    report.written.push_back(out_dir / file);
  }
  return report;
}

Expected<std::vector<OutputCheck>> check_replay_outputs(const fs::path& got_dir, const fs::path& want_dir) {
  struct OutputFile {
    std::string_view file;
    DType dtype;
    bool required;
  };
  std::vector<OutputCheck> checks;
  for (const OutputFile& output : {OutputFile{"out.npy", DType::kBF16, true}, OutputFile{"lse.npy", DType::kF32, false},
                                   OutputFile{"max_logits.npy", DType::kF32, false}}) {
    const std::string file(output.file);
    std::error_code error;
    if (!output.required && !fs::exists(want_dir / file, error)) continue;
    auto want = read_npy(want_dir / file);
    if (!want) return want.status();
    auto got = read_npy(got_dir / file);
    if (!got) return got.status();
    // Both are converted alike, so a reference stored as '<f4' is rounded to bf16 like ours.
    auto want_tensor = tensor_from_array(*want, output.dtype, (want_dir / file).string());
    if (!want_tensor) return want_tensor.status();
    auto got_tensor = tensor_from_array(*got, output.dtype, (got_dir / file).string());
    if (!got_tensor) return got_tensor.status();
    if (got->shape != want->shape) {
      return invalid_argument(printable((want_dir / file).string()),
                              fmt::format("the shape of {}: {}", printable((got_dir / file).string()),
                                          got_tensor->view().shape_string()),
                              want_tensor->view().shape_string());
    }
    OutputCheck check{file, output.dtype == DType::kBF16
                                ? check_bf16_output(got_tensor->view(), want_tensor->view())
                                : check_f32_output(got_tensor->view(), want_tensor->view())};
    checks.push_back(std::move(check));
  }
  return checks;
}

}  // namespace smla::cli
