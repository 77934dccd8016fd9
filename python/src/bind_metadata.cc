// Step metadata and index transforms (smla/metadata.h). Each transform runs
// where its data lives: host views through the host form, CUDA views through
// the Context form in a cuda context on the caller's stream.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "python/src/bindings.h"
#include "python/src/py_tensor.h"
#include "smla/context.h"
#include "smla/metadata.h"

namespace smla::python {
namespace {

// smla.Batch (a dataclass in the package) -> BatchDescription over its tensors.
BatchDescription batch_from(PyTensorArgs& t, const py::handle& batch) {
  BatchDescription b;
  b.query_lens = t.view(batch.attr("query_lens"), "batch.query_lens");
  b.seq_lens = t.view(batch.attr("seq_lens"), "batch.seq_lens");
  b.num_tokens = batch.attr("num_tokens").cast<std::int64_t>();
  b.token_valid = t.view(batch.attr("token_valid"), "batch.token_valid");
  b.swa_block_table = t.view(batch.attr("swa_block_table"), "batch.swa_block_table");
  b.c4_block_table = t.view(batch.attr("c4_block_table"), "batch.c4_block_table");
  b.c128_block_table = t.view(batch.attr("c128_block_table"), "batch.c128_block_table");
  return b;
}

bool on_cuda(const TensorView& view) { return view.present() && view.device.kind == DeviceKind::kCuda; }
// Runs call(context) in the thread's cuda context on the caller's stream.
template <class Call>
Status on_device(std::uintptr_t stream, Call&& call) {
  auto context = thread_context(Backend::kCuda);
  if (!context) return context.status();
  (*context)->set_stream(reinterpret_cast<void*>(stream));
  return call(**context);
}

// A struct of int64 fields as a dict, keyed by the C++ field names.
template <class S>
py::dict fields_dict(const S& s, std::initializer_list<std::pair<const char*, std::int64_t S::*>> fields) {
  py::dict d;
  for (const auto& [name, member] : fields) d[name] = s.*member;
  return d;
}

py::dict counts_dict(const StepCounts& c) {
  return fields_dict(c, {{"num_reqs", &StepCounts::num_reqs},
                         {"num_tokens", &StepCounts::num_tokens},
                         {"num_actual_tokens", &StepCounts::num_actual_tokens},
                         {"num_decodes", &StepCounts::num_decodes},
                         {"num_prefills", &StepCounts::num_prefills},
                         {"num_decode_tokens", &StepCounts::num_decode_tokens},
                         {"num_prefill_tokens", &StepCounts::num_prefill_tokens},
                         {"max_query_len", &StepCounts::max_query_len},
                         {"max_decode_query_len", &StepCounts::max_decode_query_len},
                         {"max_prefill_query_len", &StepCounts::max_prefill_query_len},
                         {"max_seq_len", &StepCounts::max_seq_len}});
}

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& values, std::int64_t rows, std::int64_t width) {
  if (width > 0) {
    py::array_t<T> a({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(width)});
    std::copy(values.begin(), values.end(), a.mutable_data());
    return a;
  }
  py::array_t<T> a(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), a.mutable_data());
  return a;
}

// Field names match StepMetadataBuffers (and docs/metadata.md); absent keys stay absent.
StepMetadataBuffers buffers_from(PyTensorArgs& t, const py::dict& d) {
  using B = StepMetadataBuffers;
  static constexpr std::pair<const char*, TensorView B::*> kFields[] = {
      {"query_start_loc", &B::query_start_loc},   {"token_to_req", &B::token_to_req},
      {"positions", &B::positions},               {"is_valid_token", &B::is_valid_token},
      {"swa_slot_mapping", &B::swa_slot_mapping}, {"swa_indices", &B::swa_indices},
      {"swa_lens", &B::swa_lens},                 {"prefill_gather_lens", &B::prefill_gather_lens},
      {"c4_slot_mapping", &B::c4_slot_mapping},   {"c128_slot_mapping", &B::c128_slot_mapping},
      {"c128a_decode_indices", &B::c128a_decode_indices},
      {"c128a_decode_lens", &B::c128a_decode_lens},
      {"c128a_prefill_indices", &B::c128a_prefill_indices},
  };
  B b;
  for (const auto& [key, member] : kFields) {
    if (d.contains(key)) b.*member = t.view(d[key], key, Access::kWrite);
  }
  return b;
}

constexpr std::pair<const char*, std::int64_t PrefillChunk::*> kChunkFields[] = {
    {"req_begin", &PrefillChunk::req_begin},         {"req_end", &PrefillChunk::req_end},
    {"token_begin", &PrefillChunk::token_begin},     {"token_end", &PrefillChunk::token_end},
    {"compressed_rows", &PrefillChunk::compressed_rows}, {"workspace_rows", &PrefillChunk::workspace_rows},
};

// A chunk as prefill_chunk_plan returns it (a dict), or any object with those attributes.
PrefillChunk chunk_from(const py::handle& c) {
  const bool is_dict = py::isinstance<py::dict>(c);
  PrefillChunk chunk;
  for (const auto& [key, member] : kChunkFields) {
    chunk.*member = (is_dict ? py::object(c[key]) : py::object(c.attr(key))).cast<std::int64_t>();
  }
  return chunk;
}

template <class Fn>
void run_released(Fn&& fn) {
  Status status;
  {
    py::gil_scoped_release release;
    status = fn();
  }
  throw_if_error(status);
}

py::dict workspace_dict(const PrefillWorkspaceShape& w) {
  using W = PrefillWorkspaceShape;
  return fields_dict(w, {{"chunk_reqs", &W::chunk_reqs}, {"compressed_rows", &W::compressed_rows}, {"rows", &W::rows},
                         {"head_dim", &W::head_dim}, {"index_rows", &W::index_rows},
                         {"index_width", &W::index_width}});
}

py::dict chunk_dict(const PrefillChunk& c) {
  py::dict d;
  for (const auto& [key, member] : kChunkFields) d[key] = c.*member;
  return d;
}

}  // namespace

void bind_metadata(py::module_& m) {
  py::class_<StepConfig>(m, "StepConfig", "Step-independent settings (smla/metadata.h StepConfig).")
      .def(py::init<>())
      .def_readwrite("window", &StepConfig::window)
      .def_readwrite("max_model_len", &StepConfig::max_model_len)
      .def_readwrite("max_num_batched_tokens", &StepConfig::max_num_batched_tokens)
      .def_readwrite("index_topk", &StepConfig::index_topk)
      .def_readwrite("num_speculative_tokens", &StepConfig::num_speculative_tokens)
      .def_readwrite("prefill_chunk_size", &StepConfig::prefill_chunk_size)
      .def_readwrite("swa_page_size", &StepConfig::swa_page_size)
      .def_readwrite("logical_block_size", &StepConfig::logical_block_size)
      .def_readwrite("c128a_active_width", &StepConfig::c128a_active_width)
      .def("validate", [](const StepConfig& c) { throw_if_error(validate_step_config(c)); })
      .def("c128a_width", [](const StepConfig& c) {
        throw_if_error(validate_step_config(c));
        return c128a_width(c);
      })
      .def("combined_index_width", [](const StepConfig& c, int ratio) {
        throw_if_error(validate_step_config(c));
        const Expected<LayerType> type = layer_type_for_ratio(ratio);
        throw_if_error(type.status());
        return combined_index_width(c, *type);
      });

  m.def("describe_step", [](py::handle batch, const StepConfig& config) {
    PyTensorArgs t;
    const BatchDescription b = batch_from(t, batch);
    const Expected<StepCounts> counts = describe_step(b, config);
    throw_if_error(counts.status());
    return counts_dict(*counts);
  });
  m.def("make_step_metadata", [](py::handle batch, const StepConfig& config) {
    PyTensorArgs t;
    const BatchDescription b = batch_from(t, batch);
    Expected<StepMetadata> md = [&] {
      py::gil_scoped_release release;
      return make_step_metadata(b, config);
    }();
    throw_if_error(md.status());
    const StepMetadataSizes& s = md->sizes;
    py::dict d;
    d["counts"] = counts_dict(s.counts);
    d["query_start_loc"] = to_numpy(md->query_start_loc, 0, 0);
    d["token_to_req"] = to_numpy(md->token_to_req, 0, 0);
    d["positions"] = to_numpy(md->positions, 0, 0);
    d["is_valid_token"] = to_numpy(md->is_valid_token, 0, 0);
    d["swa_slot_mapping"] = to_numpy(md->swa_slot_mapping, 0, 0);
    d["swa_indices"] = to_numpy(md->swa_indices, s.token_rows, s.window);
    d["swa_lens"] = to_numpy(md->swa_lens, 0, 0);
    d["prefill_gather_lens"] = to_numpy(md->prefill_gather_lens, 0, 0);
    if (s.has_c4) d["c4_slot_mapping"] = to_numpy(md->c4_slot_mapping, 0, 0);
    if (s.has_c128) {
      d["c128_slot_mapping"] = to_numpy(md->c128_slot_mapping, 0, 0);
      d["c128a_decode_indices"] = to_numpy(md->c128a_decode_indices, s.c128a_decode_rows, s.c128a_width);
      d["c128a_decode_lens"] = to_numpy(md->c128a_decode_lens, 0, 0);
      d["c128a_prefill_indices"] = to_numpy(md->c128a_prefill_indices, s.c128a_prefill_rows, s.c128a_width);
    }
    return d;
  });
  m.def("build_step_metadata", [](py::handle batch, const StepConfig& config, const py::dict& buffers,
                                  py::handle counts, std::uintptr_t stream) -> py::object {
    PyTensorArgs t;
    const BatchDescription b = batch_from(t, batch);
    const StepMetadataBuffers out = buffers_from(t, buffers);
    if (on_cuda(b.query_lens)) {
      const TensorView counts_view = t.view(counts, "counts", Access::kWrite);
      run_released([&] {
        return on_device(stream, [&](const Context& c) { return build_step_metadata(c, b, config, out, counts_view); });
      });
      return py::none();
    }
    Expected<StepCounts> result = [&] {
      py::gil_scoped_release release;
      return build_step_metadata(b, config, out);
    }();
    throw_if_error(result.status());
    return counts_dict(*result);
  });
  m.def("c4a_global_topk_indices", [](py::handle local_topk, py::handle token_to_req, py::handle is_valid_token,
                                      py::handle block_table, std::int64_t block_size, py::handle global_out,
                                      py::handle lens_out, std::uintptr_t stream) {
    PyTensorArgs t;
    const TensorView topk = t.view(local_topk, "local_topk"), req = t.view(token_to_req, "token_to_req");
    const TensorView valid = t.view(is_valid_token, "is_valid_token"), table = t.view(block_table, "block_table");
    const TensorView out = t.view(global_out, "global_out", Access::kWrite);
    const TensorView lens = t.view(lens_out, "lens_out", Access::kWrite);
    run_released([&] {
      if (!on_cuda(topk)) return c4a_global_topk_indices(topk, req, valid, table, block_size, out, lens);
      return on_device(stream, [&](const Context& c) {
        return c4a_global_topk_indices(c, topk, req, valid, table, block_size, out, lens);
      });
    });
  });
  m.def("v32_request_to_global_indices",
        [](py::handle req_indices, py::handle req_id, py::handle block_table, std::int64_t block_size,
           std::int64_t block_stride_rows, py::handle out, py::handle valid_counts, std::uintptr_t stream) {
          PyTensorArgs t;
          const TensorView idx = t.view(req_indices, "req_indices"), req = t.view(req_id, "req_id");
          const TensorView table = t.view(block_table, "block_table");
          const TensorView o = t.view(out, "out", Access::kWrite);
          const TensorView counts = t.view(valid_counts, "valid_counts", Access::kWrite);
          run_released([&] {
            if (!on_cuda(idx)) {
              return v32_request_to_global_indices(idx, req, table, block_size, block_stride_rows, o, counts);
            }
            return on_device(stream, [&](const Context& c) {
              return v32_request_to_global_indices(c, idx, req, table, block_size, block_stride_rows, o, counts);
            });
          });
        });
  m.def("mixed_sparse_indices", [](py::handle batch, const StepConfig& config, int compress_ratio,
                                   py::handle c4a_local_topk, py::handle out_indices, py::handle out_lens,
                                   std::uintptr_t stream) {
    PyTensorArgs t;
    const BatchDescription b = batch_from(t, batch);
    const TensorView topk = t.view(c4a_local_topk, "c4a_local_topk");
    const TensorView idx = t.view(out_indices, "out_indices", Access::kWrite);
    const TensorView lens = t.view(out_lens, "out_lens", Access::kWrite);
    run_released([&] {
      if (!on_cuda(idx)) return mixed_sparse_indices(b, config, compress_ratio, topk, idx, lens);
      return on_device(stream, [&](const Context& c) {
        return mixed_sparse_indices(c, b, config, compress_ratio, topk, idx, lens);
      });
    });
  });
  m.def("prefill_chunk_plan", [](py::handle batch, const StepConfig& config, int compress_ratio, bool adaptive) {
    PyTensorArgs t;
    const BatchDescription b = batch_from(t, batch);
    const auto plan =
        prefill_chunk_plan(b, config, compress_ratio, adaptive ? ChunkPolicy::kAdaptive : ChunkPolicy::kFixed);
    throw_if_error(plan.status());
    py::list chunks;
    for (const PrefillChunk& c : *plan) chunks.append(chunk_dict(c));
    return chunks;
  });
  m.def("static_prefill_workspace", [](const StepConfig& config, int compress_ratio) {
    const auto w = static_prefill_workspace(config, compress_ratio);
    throw_if_error(w.status());
    return workspace_dict(*w);
  });
  m.def("chunk_prefill_workspace", [](const StepConfig& config, int compress_ratio, py::handle chunk) {
    const auto w = chunk_prefill_workspace(config, compress_ratio, chunk_from(chunk));
    throw_if_error(w.status());
    return workspace_dict(*w);
  });
  m.def("combine_topk_swa_indices", [](py::handle batch, const StepConfig& config, int compress_ratio,
                                       py::handle chunk, std::int64_t compressed_rows, std::int64_t workspace_rows,
                                       py::handle topk, py::handle out_indices, py::handle out_lens,
                                       std::uintptr_t stream) {
    PyTensorArgs t;
    const BatchDescription b = batch_from(t, batch);
    const PrefillChunk c = chunk_from(chunk);
    const TensorView k = t.view(topk, "topk");
    const TensorView idx = t.view(out_indices, "out_indices", Access::kWrite);
    const TensorView lens = t.view(out_lens, "out_lens", Access::kWrite);
    run_released([&] {
      if (!on_cuda(idx)) {
        return combine_topk_swa_indices(b, config, compress_ratio, c, compressed_rows, workspace_rows, k, idx, lens);
      }
      return on_device(stream, [&](const Context& context) {
        return combine_topk_swa_indices(context, b, config, compress_ratio, c, compressed_rows, workspace_rows, k, idx,
                                        lens);
      });
    });
  });
  m.def("dequantize_and_gather", [](py::handle pages, int format, float fp8_scale, py::handle seq_lens,
                                    py::handle gather_lens, py::handle block_table, std::int64_t offset,
                                    py::handle out, std::uintptr_t stream) {
    PyTensorArgs t;
    const KvCacheView cache = t.cache(pages, "cache", format, fp8_scale);
    const TensorView seq = t.view(seq_lens, "seq_lens"), gather = t.view(gather_lens, "gather_lens");
    const TensorView table = t.view(block_table, "block_table");
    const TensorView o = t.view(out, "out", Access::kWrite);
    run_released([&] {
      if (!on_cuda(o)) return dequantize_and_gather(cache, seq, gather, table, offset, o);
      return on_device(stream, [&](const Context& c) {
        return dequantize_and_gather(c, cache, seq, gather, table, offset, o);
      });
    });
  });
}

}  // namespace smla::python
