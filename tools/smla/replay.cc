#include "tools/smla/replay.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <string_view>
#include <system_error>

#include "smla/numeric.h"
#include "testkit/compare.h"
#include "testkit/host_tensor.h"
#include "tools/smla/check.h"
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

Expected<HostTensor> load_optional(const fs::path& dir, std::string_view key, const std::optional<std::string>& file,
                                   DType dtype, int rank) {
  if (!file) return HostTensor{};
  return load_tensor(dir, key, *file, dtype, rank);
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

std::string shape_line(std::string_view name, const HostTensor& tensor) {
  return fmt::format("{}: {}", name, tensor.view().describe());
}

Status write_tensor(const fs::path& path, const TensorView& view) {
  auto array = npy_from_tensor(view, path.string());
  if (!array) return array.status();
  return write_npy(path, *array);
}

// Poisoned outputs, so elements a backend forgets to write show up as NaN.
HostTensor make_output(DType dtype, const std::vector<std::int64_t>& shape) {
  HostTensor tensor = HostTensor::zeros(dtype, shape);
  testkit::poison(tensor.view());
  return tensor;
}

// Output file name and tensor, in the order they are written.
using Outputs = std::vector<std::pair<std::string, HostTensor>>;

Status replay_decode(const fs::path& dir, const ReplayManifest& m, Backend backend, ReplayReport& report,
                     Outputs& outputs) {
  const KvFormatInfo info = kv_format_info(m.format);
  auto q = load_tensor(dir, "q", m.q, DType::kBF16, 3);
  if (!q) return q.status();
  const std::int64_t tokens = q->view().shape[0];
  const std::int64_t heads = q->view().shape[1];
  SMLA_RETURN_IF_ERROR(check_dims("q", m.q, *q, {{-1, "T"}, {-1, "h_q"}, {info.head_dim, "d_qk"}}));

  HostTensor main_storage, extra_storage;
  auto main_cache = load_cache(dir, "main_cache", m.main_cache, "main_page_stride_bytes", m.main_page_stride_bytes, m,
                               main_storage);
  if (!main_cache) return main_cache.status();
  auto main_indices = load_tensor(dir, "main_indices", m.main_indices, DType::kI32, 2);
  if (!main_indices) return main_indices.status();
  SMLA_RETURN_IF_ERROR(check_dims("main_indices", m.main_indices, *main_indices, {{tokens, "T"}, {-1, "k_main"}}));
  auto main_lengths = load_optional(dir, "main_lengths", m.main_lengths, DType::kI32, 1);
  if (!main_lengths) return main_lengths.status();
  SMLA_RETURN_IF_ERROR(check_dims("main_lengths", m.main_lengths.value_or(""), *main_lengths, {{tokens, "T"}}));
  auto sink = load_optional(dir, "sink", m.sink, DType::kF32, 1);
  if (!sink) return sink.status();
  SMLA_RETURN_IF_ERROR(check_dims("sink", m.sink.value_or(""), *sink, {{heads, "h_q"}}));

  SparseDecodeArgs args;
  std::optional<Expected<HostTensor>> extra_indices, extra_lengths;
  if (m.extra_cache) {
    auto extra_cache = load_cache(dir, "extra_cache", *m.extra_cache, "extra_page_stride_bytes",
                                  m.extra_page_stride_bytes, m, extra_storage);
    if (!extra_cache) return extra_cache.status();
    args.extra_cache = *extra_cache;
    extra_indices = load_tensor(dir, "extra_indices", m.extra_indices.value_or(""), DType::kI32, 2);
    if (!*extra_indices) return extra_indices->status();
    SMLA_RETURN_IF_ERROR(
        check_dims("extra_indices", *m.extra_indices, extra_indices->value(), {{tokens, "T"}, {-1, "k_extra"}}));
    extra_lengths = load_optional(dir, "extra_lengths", m.extra_lengths, DType::kI32, 1);
    if (!*extra_lengths) return extra_lengths->status();
    SMLA_RETURN_IF_ERROR(check_dims("extra_lengths", m.extra_lengths.value_or(""), extra_lengths->value(), {{tokens, "T"}}));
    args.extra_indices = extra_indices->value().view();
    args.extra_lengths = extra_lengths->value().view();
  }

  HostTensor out = make_output(DType::kBF16, {tokens, heads, info.value_dim});
  HostTensor lse = make_output(DType::kF32, {tokens, heads});
  args.q = q->view();
  args.main_cache = *main_cache;
  args.main_indices = main_indices->view();
  args.main_lengths = main_lengths->view();
  args.sink = sink->view();
  args.softmax_scale = m.softmax_scale;
  args.out = out.view();
  args.lse = lse.view();

  report.shapes = {shape_line("q", *q), shape_line("main_cache", main_storage),
                   shape_line("main_indices", *main_indices)};
  if (main_lengths->present()) report.shapes.push_back(shape_line("main_lengths", *main_lengths));
  if (m.extra_cache) {
    report.shapes.push_back(shape_line("extra_cache", extra_storage));
    report.shapes.push_back(shape_line("extra_indices", extra_indices->value()));
    if (extra_lengths->value().present()) report.shapes.push_back(shape_line("extra_lengths", extra_lengths->value()));
  }
  if (sink->present()) report.shapes.push_back(shape_line("sink", *sink));
  std::vector<double> seconds;
  SMLA_RETURN_IF_ERROR(run_sparse_decode(args, backend, 1, &seconds));
  report.seconds = seconds.front();
  outputs.emplace_back("out.npy", std::move(out));
  outputs.emplace_back("lse.npy", std::move(lse));
  return Status::Ok();
}

Status replay_prefill(const fs::path& dir, const ReplayManifest& m, Backend backend, ReplayReport& report,
                      Outputs& outputs) {
  auto q = load_tensor(dir, "q", m.q, DType::kBF16, 3);
  if (!q) return q.status();
  const std::int64_t queries = q->view().shape[0];
  const std::int64_t heads = q->view().shape[1];
  const std::int64_t d_qk = q->view().shape[2];
  auto kv = load_tensor(dir, "kv", m.kv, DType::kBF16, 2);
  if (!kv) return kv.status();
  SMLA_RETURN_IF_ERROR(check_dims("kv", m.kv, *kv, {{-1, "s_kv"}, {d_qk, "d_qk"}}));
  auto indices = load_tensor(dir, "indices", m.indices, DType::kI32, 2);
  if (!indices) return indices.status();
  SMLA_RETURN_IF_ERROR(check_dims("indices", m.indices, *indices, {{queries, "s_q"}, {-1, "topk"}}));
  auto topk_length = load_optional(dir, "topk_length", m.topk_length, DType::kI32, 1);
  if (!topk_length) return topk_length.status();
  SMLA_RETURN_IF_ERROR(check_dims("topk_length", m.topk_length.value_or(""), *topk_length, {{queries, "s_q"}}));
  auto sink = load_optional(dir, "sink", m.sink, DType::kF32, 1);
  if (!sink) return sink.status();
  SMLA_RETURN_IF_ERROR(check_dims("sink", m.sink.value_or(""), *sink, {{heads, "h_q"}}));
  if (m.d_v > d_qk) {
    return invalid_argument("key 'd_v'", fmt::format("at most d_qk = {}", d_qk), fmt::format("{}", m.d_v));
  }

  HostTensor out = make_output(DType::kBF16, {queries, heads, m.d_v});
  HostTensor max_logits = make_output(DType::kF32, {queries, heads});
  HostTensor lse = make_output(DType::kF32, {queries, heads});
  SparsePrefillArgs args;
  args.q = q->view();
  args.kv = kv->view();
  args.indices = indices->view();
  args.topk_length = topk_length->view();
  args.sink = sink->view();
  args.softmax_scale = m.softmax_scale;
  args.d_v = m.d_v;
  args.out = out.view();
  args.max_logits = max_logits.view();
  args.lse = lse.view();

  report.shapes = {shape_line("q", *q), shape_line("kv", *kv), shape_line("indices", *indices)};
  if (topk_length->present()) report.shapes.push_back(shape_line("topk_length", *topk_length));
  if (sink->present()) report.shapes.push_back(shape_line("sink", *sink));
  std::vector<double> seconds;
  SMLA_RETURN_IF_ERROR(run_sparse_prefill(args, backend, 1, &seconds));
  report.seconds = seconds.front();
  outputs.emplace_back("out.npy", std::move(out));
  outputs.emplace_back("max_logits.npy", std::move(max_logits));
  outputs.emplace_back("lse.npy", std::move(lse));
  return Status::Ok();
}

}  // namespace

Expected<ReplayReport> replay_case(const fs::path& case_dir, const fs::path& out_dir, Backend backend) {
  auto manifest = read_manifest(case_dir);
  if (!manifest) return manifest.status();
  ReplayReport report;
  report.op = manifest->op;
  report.backend = resolve_backend(backend);
  Outputs outputs;
  if (manifest->op == ReplayOp::kSparseDecode) {
    SMLA_RETURN_IF_ERROR(replay_decode(case_dir, *manifest, backend, report, outputs));
  } else {
    SMLA_RETURN_IF_ERROR(replay_prefill(case_dir, *manifest, backend, report, outputs));
  }
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error) return invalid_argument(out_dir.string(), "a writable output directory", error.message());
  for (const auto& [file, tensor] : outputs) {
    SMLA_RETURN_IF_ERROR(write_tensor(out_dir / file, tensor.view()));
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
    OutputCheck check{file, output.dtype == DType::kBF16
                                ? check_bf16_output(got_tensor->view(), want_tensor->view())
                                : check_f32_output(got_tensor->view(), want_tensor->view())};
    checks.push_back(std::move(check));
  }
  return checks;
}

}  // namespace smla::cli
