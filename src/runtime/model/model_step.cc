// smla::Model steps: batch validation and staging (pages, tables, x), the
// eager step with its phase times, the verification against the float64
// reference, and the whole-step decode graph.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "smla/attention.h"
#include "smla/metadata.h"
#include "smla/numeric.h"
#include "src/runtime/model/model_impl.h"

namespace smla {

using model_detail::cdiv;
using model_detail::kHeadDim;
using model_detail::kLogicalBlock;
using model_detail::kSwaPage;
using model_detail::StepShape;

Status Model::Impl::validate_batch(const std::vector<StepEntry>& batch, const TensorView& x_host,
                                   const TensorView& out_host, std::int64_t* tokens) const {
  const auto R = static_cast<std::int64_t>(batch.size());
  if (R < 1) return invalid_argument("batch", "at least one request", "none");
  std::int64_t T = 0;
  for (std::int64_t i = 0; i < R; ++i) {
    const StepEntry& e = batch[static_cast<std::size_t>(i)];
    if (e.request < 0 || e.request >= static_cast<int>(requests.size()) ||
        !requests[static_cast<std::size_t>(e.request)].live) {
      return invalid_argument(fmt::format("batch[{}].request", i), "a live request id", std::to_string(e.request));
    }
    for (std::int64_t j = 0; j < i; ++j) {
      if (batch[static_cast<std::size_t>(j)].request == e.request) {
        return invalid_argument(fmt::format("batch[{}].request", i), "each request at most once per step",
                                std::to_string(e.request));
      }
    }
    const std::int64_t new_len = requests[static_cast<std::size_t>(e.request)].seq_len + e.query_len;
    if (e.query_len < 1 || new_len > options.max_model_len) {
      return out_of_range(fmt::format("batch[{}].query_len", i),
                          fmt::format(">= 1 and a context of at most {} tokens", options.max_model_len),
                          std::to_string(e.query_len));
    }
    T += e.query_len;
  }
  if (T > options.max_batched_tokens) {
    return out_of_range("batch", fmt::format("at most {} tokens", options.max_batched_tokens), std::to_string(T));
  }
  for (const auto& [v, name] : {std::pair{&x_host, "x"}, std::pair{&out_host, "out"}}) {
    if (!v->present() || v->dtype != DType::kF32 || v->rank != 2 || v->shape[0] != T ||
        v->shape[1] != config.hidden || !v->is_contiguous() || v->data == nullptr ||
        v->device.kind != DeviceKind::kCpu) {
      return invalid_argument(name, fmt::format("contiguous host f32 [{}, {}]", T, config.hidden),
                              v->present() ? v->describe() : "absent");
    }
  }
  *tokens = T;
  return Status::Ok();
}

BatchDescription Model::Impl::host_batch(std::int64_t R) const {
  auto host = [](const std::vector<std::int32_t>& v, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(const_cast<std::int32_t*>(v.data()), DType::kI32, shape);
  };
  BatchDescription desc;
  desc.query_lens = host(in.h_query_lens, {R});
  desc.seq_lens = host(in.h_seq_lens, {R});
  desc.swa_block_table = host(in.h_swa_table, {R, swa_cols});
  desc.c4_block_table = host(in.h_c4_table, {R, c_cols});
  desc.c128_block_table = host(in.h_c128_table, {R, c_cols});
  return desc;
}

BatchDescription Model::Impl::staged_batch(std::int64_t R, std::int64_t T) const {
  BatchDescription desc;
  desc.query_lens = view(in.query_lens, DType::kI32, {R});
  desc.seq_lens = view(in.seq_lens, DType::kI32, {R});
  desc.num_tokens = T;
  desc.swa_block_table = view(in.swa_table, DType::kI32, {R, swa_cols});
  desc.c4_block_table = view(in.c4_table, DType::kI32, {R, c_cols});
  desc.c128_block_table = view(in.c128_table, DType::kI32, {R, c_cols});
  return desc;
}

// Pages for the new lengths, the host tables, then their upload.
Status Model::Impl::stage_batch(const std::vector<StepEntry>& batch) {
  const auto R = static_cast<std::int64_t>(batch.size());
  for (std::int64_t i = 0; i < R; ++i) {
    const StepEntry& e = batch[static_cast<std::size_t>(i)];
    model_detail::RequestState& r = requests[static_cast<std::size_t>(e.request)];
    const std::int64_t new_len = r.seq_len + e.query_len;
    SMLA_RETURN_IF_ERROR(swa_pool.reserve(r.swa_pages, cdiv(new_len, kSwaPage), "swa"));
    SMLA_RETURN_IF_ERROR(c4_pool.reserve(r.c4_pages, cdiv(new_len, kLogicalBlock), "c4"));
    SMLA_RETURN_IF_ERROR(c128_pool.reserve(r.c128_pages, cdiv(new_len, kLogicalBlock), "c128"));
    in.h_query_lens[static_cast<std::size_t>(i)] = e.query_len;
    in.h_seq_lens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(new_len);
    auto fill = [i](std::vector<std::int32_t>& table, std::int64_t cols, const std::vector<std::int32_t>& pages) {
      auto row = table.begin() + i * cols;
      std::fill(row, row + cols, 0);
      std::copy(pages.begin(), pages.end(), row);
    };
    fill(in.h_swa_table, swa_cols, r.swa_pages);
    fill(in.h_c4_table, c_cols, r.c4_pages);
    fill(in.h_c128_table, c_cols, r.c128_pages);
    // State rings: column c (positions c*bs ..) lives in ring block c % ring size.
    auto ring = [i](std::vector<std::int32_t>& table, std::int64_t cols, const std::vector<std::int32_t>& blocks) {
      for (std::int64_t c = 0; c < cols; ++c) {
        table[static_cast<std::size_t>(i * cols + c)] = blocks[static_cast<std::size_t>(c) % blocks.size()];
      }
    };
    ring(in.h_c4_state_table, c4_state_cols, r.c4_state_ring);
    ring(in.h_c128_state_table, c128_state_cols, r.c128_state_ring);
  }
  auto put = [&](const model_detail::Buffer& dst, const std::vector<std::int32_t>& src, std::int64_t count) {
    return memory->upload(dst.get(), src.data(), static_cast<std::size_t>(count) * 4);
  };
  SMLA_RETURN_IF_ERROR(put(in.query_lens, in.h_query_lens, R));
  SMLA_RETURN_IF_ERROR(put(in.seq_lens, in.h_seq_lens, R));
  SMLA_RETURN_IF_ERROR(put(in.swa_table, in.h_swa_table, R * swa_cols));
  SMLA_RETURN_IF_ERROR(put(in.c4_table, in.h_c4_table, R * c_cols));
  SMLA_RETURN_IF_ERROR(put(in.c128_table, in.h_c128_table, R * c_cols));
  SMLA_RETURN_IF_ERROR(put(in.c4_state_table, in.h_c4_state_table, R * c4_state_cols));
  return put(in.c128_state_table, in.h_c128_state_table, R * c128_state_cols);
}

// Validates, stages the batch and x, and returns the step's host-known shape.
Expected<StepShape> Model::Impl::prepare_step(const std::vector<StepEntry>& batch, const TensorView& x,
                                              const TensorView& out) {
  std::int64_t T = 0;
  SMLA_RETURN_IF_ERROR(validate_batch(batch, x, out, &T));
  SMLA_RETURN_IF_ERROR(stage_batch(batch));
  const auto R = static_cast<std::int64_t>(batch.size());
  auto counts = describe_step(host_batch(R), step_config);
  if (!counts) return counts.status();
  StepShape shape;
  shape.requests = R;
  shape.tokens = T;
  shape.decode_tokens = counts->num_decode_tokens;
  shape.prefill_tokens = counts->num_prefill_tokens;
  SMLA_RETURN_IF_ERROR(memory->upload(act.x.get(), x.data, static_cast<std::size_t>(T * config.hidden) * 4));
  return shape;
}

// The output, the step's error word, then the new lengths.
Status Model::Impl::finish_step(const std::vector<StepEntry>& batch, const TensorView& out, std::int64_t T) {
  SMLA_RETURN_IF_ERROR(memory->download(out.data, act.x.get(), static_cast<std::size_t>(T * config.hidden) * 4));
  SMLA_RETURN_IF_ERROR(check_metadata_errors());
  for (const StepEntry& e : batch) requests[static_cast<std::size_t>(e.request)].seq_len += e.query_len;
  return Status::Ok();
}

Status Model::step(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out, bool verify,
                   StepStats* stats) {
  auto fail = [](const Status& s) { return s.with_context("Model::step: "); };
  Impl& m = *impl_;
  if (stats == nullptr) return fail(invalid_argument("stats", "a StepStats", "nullptr"));
  auto shape = m.prepare_step(batch, x, out);
  if (!shape) return fail(shape.status());
  shape->timed = true;
  if (verify) shape->verify_rows = model_detail::sample_rows(shape->tokens, m.options.verify_rows);
  if (Status s = m.enqueue_step(*shape); !s.ok()) {
    (void)m.memory->synchronize();
    return fail(s);
  }
  if (Status s = m.finish_step(batch, out, shape->tokens); !s.ok()) return fail(s);
  m.collect_phase_times(*stats);
  m.timing.step_s = m.memory->seconds_between(0, model_detail::layer_mark(static_cast<int>(m.layers.size()) - 1, 5));
  if (verify) {
    if (Status s = m.verify_step(*shape, *stats); !s.ok()) return fail(s);
  }
  return Status::Ok();
}

// The host validated the batch; a set error bit means the metadata builder saw
// other values than the host did (a bug), so the step's output is not trusted.
Status Model::Impl::check_metadata_errors() const {
  std::int64_t error_word = 0;
  SMLA_RETURN_IF_ERROR(memory->download(&error_word, md.counts.get<std::int64_t>() + kStepErrorWord,
                                        sizeof(error_word)));
  if (error_word != 0) {
    return internal_error(
        fmt::format("Model: the step metadata reports error bits {:#x} for a batch the host accepted", error_word));
  }
  return Status::Ok();
}

void Model::Impl::collect_phase_times(StepStats& stats) const {
  auto elapsed = [&](std::size_t i) { return memory->seconds_between(i, i + 1); };
  stats.indexer_s += elapsed(0);  // step metadata and index transforms count with the indexer
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    const std::size_t base = model_detail::layer_mark(l, 0);
    stats.projection_s += elapsed(base);
    stats.cache_write_s += elapsed(base + 1);
    stats.indexer_s += elapsed(base + 2);
    stats.attention_s += elapsed(base + 3);
    stats.output_s += elapsed(base + 4);
  }
}

namespace {

template <class T>
Status fetch(model_detail::ModelMemory& memory, std::vector<T>& dst, const void* src, std::size_t count) {
  dst.resize(count);
  return memory.download(dst.data(), src, count * sizeof(T));
}

double max_abs_bf16_error(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want) {
  double max_err = 0.0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const double err = std::fabs(static_cast<double>(bf16_to_f32(got[k])) - bf16_to_f32(want[k]));
    max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
  }
  return max_err;
}

}  // namespace

// Each layer's staged rows re-run on the float64 reference over a host copy
// of its caches (the caches of a layer do not change after its attention).
Status Model::Impl::verify_step(const StepShape& shape, StepStats& stats) {
  const auto start = std::chrono::steady_clock::now();
  const auto n = static_cast<std::int64_t>(shape.verify_rows.size());
  const auto un = static_cast<std::size_t>(n);
  const std::int64_t H = config.num_heads, W = config.window;
  const auto row = static_cast<std::size_t>(H * kHeadDim);
  std::vector<std::uint16_t> q_rows, o_rows, ref(un * row);
  std::vector<std::int32_t> swa_idx, swa_len, ext_idx, ext_len;
  std::vector<std::uint8_t> swa_bytes, compressed_bytes;
  std::vector<float> sink;
  model_detail::ModelMemory& mem = *memory;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const model_detail::ModelLayer& layer = layers[l];
    const model_detail::VerifyStage& v = verify_stage[l];
    const bool compressed = layer.type != LayerType::kSwaOnly;
    SMLA_RETURN_IF_ERROR(fetch(mem, q_rows, v.q.get(), un * row));
    SMLA_RETURN_IF_ERROR(fetch(mem, o_rows, v.o.get(), un * row));
    SMLA_RETURN_IF_ERROR(fetch(mem, swa_idx, v.swa_indices.get(), un * static_cast<std::size_t>(W)));
    SMLA_RETURN_IF_ERROR(fetch(mem, swa_len, v.swa_lens.get(), un));
    SMLA_RETURN_IF_ERROR(fetch(mem, swa_bytes, layer.swa.mem.get(), layer.swa.mem.bytes));
    SMLA_RETURN_IF_ERROR(fetch(mem, sink, layer.sink.get(), static_cast<std::size_t>(H)));
    if (compressed) {
      SMLA_RETURN_IF_ERROR(fetch(mem, ext_idx, v.extra_indices.get(), un * static_cast<std::size_t>(layer.extra_width)));
      SMLA_RETURN_IF_ERROR(fetch(mem, ext_len, v.extra_lens.get(), un));
      SMLA_RETURN_IF_ERROR(fetch(mem, compressed_bytes, layer.compressed.mem.get(), layer.compressed.mem.bytes));
    }
    auto host_cache = [&](std::vector<std::uint8_t>& bytes, const model_detail::PagedBuffer& paged) {
      KvCacheView c = kv_view(paged);
      c.pages.data = bytes.data();
      c.pages.device = Device{};
      return c;
    };
    SparseDecodeArgs a;
    a.q = TensorView::contiguous(q_rows.data(), DType::kBF16, {n, H, kHeadDim});
    a.main_cache = host_cache(swa_bytes, layer.swa);
    a.main_indices = TensorView::contiguous(swa_idx.data(), DType::kI32, {n, W});
    a.main_lengths = TensorView::contiguous(swa_len.data(), DType::kI32, {n});
    if (compressed) {
      a.extra_cache = host_cache(compressed_bytes, layer.compressed);
      a.extra_indices = TensorView::contiguous(ext_idx.data(), DType::kI32, {n, layer.extra_width});
      a.extra_lengths = TensorView::contiguous(ext_len.data(), DType::kI32, {n});
    }
    a.sink = TensorView::contiguous(sink.data(), DType::kF32, {H});
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    a.out = TensorView::contiguous(ref.data(), DType::kBF16, {n, H, kHeadDim});
    SMLA_RETURN_IF_ERROR(sparse_decode(a, Backend::kReference).with_context("verify reference: "));
    stats.checks.push_back(LayerCheck{static_cast<int>(l), layer.type, max_abs_bf16_error(o_rows, ref), n});
  }
  stats.verify_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Whole-step decode graph

Status Model::capture_decode_graph(int batch_requests) {
  auto fail = [](const Status& s) { return s.with_context("Model::capture_decode_graph: "); };
  Impl& m = *impl_;
  if (m.memory->device().kind == DeviceKind::kCpu) {
    return fail(unimplemented(fmt::format("whole-step graphs need the cuda backend; this model runs on '{}'",
                                          backend_name(backend()))));
  }
  const std::int64_t width = 1 + m.options.num_speculative_tokens;
  if (batch_requests < 1 || batch_requests > m.options.max_requests ||
      batch_requests * width > m.options.max_batched_tokens) {
    return fail(out_of_range("batch_requests",
                             fmt::format("1 .. {} requests of {} tokens within {} batched tokens",
                                         m.options.max_requests, width, m.options.max_batched_tokens),
                             std::to_string(batch_requests)));
  }
  m.graph_requests = 0;
  StepShape shape;
  shape.requests = batch_requests;
  shape.tokens = batch_requests * width;
  shape.decode_tokens = shape.tokens;
  shape.timed = false;
  if (Status s = m.memory->begin_capture(); !s.ok()) return fail(s);
  if (Status s = m.memory->end_capture(m.enqueue_step(shape)); !s.ok()) return fail(s);
  m.graph_requests = batch_requests;
  return Status::Ok();
}

Status Model::replay_decode_graph(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out) {
  auto fail = [](const Status& s) { return s.with_context("Model::replay_decode_graph: "); };
  Impl& m = *impl_;
  if (m.memory->device().kind == DeviceKind::kCpu) {
    return fail(unimplemented(fmt::format("whole-step graphs need the cuda backend; this model runs on '{}'",
                                          backend_name(backend()))));
  }
  if (!m.memory->has_graph() || m.graph_requests == 0) {
    return fail(invalid_argument("graph", "a decode graph captured with capture_decode_graph", "none"));
  }
  if (static_cast<int>(batch.size()) != m.graph_requests) {
    return fail(invalid_argument("batch", fmt::format("{} requests (the captured size)", m.graph_requests),
                                 std::to_string(batch.size())));
  }
  const int width = 1 + m.options.num_speculative_tokens;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].query_len != width) {
      return fail(invalid_argument(fmt::format("batch[{}].query_len", i),
                                   fmt::format("{} (1 + num_speculative_tokens)", width),
                                   std::to_string(batch[i].query_len)));
    }
  }
  auto shape = m.prepare_step(batch, x, out);
  if (!shape) return fail(shape.status());
  Status s = m.memory->mark(m.replay_mark);
  if (s.ok()) s = m.memory->launch_graph();
  if (s.ok()) s = m.memory->mark(m.replay_mark + 1);
  if (s.ok()) s = m.finish_step(batch, out, shape->tokens);
  if (!s.ok()) return fail(s);
  m.timing.step_s = m.memory->seconds_between(m.replay_mark, m.replay_mark + 1);
  return Status::Ok();
}

}  // namespace smla
