// smla::Model: creation in a Context, requests and pages, cache queries. The
// buffers are made in model_alloc.cc, a step's work in model_layer.cc and
// model_step.cc.
#include "smla/model.h"

#include <fmt/format.h>

#include "smla/compressor.h"
#include "src/runtime/model/model_impl.h"
#include "src/runtime/registry_internal.h"
#include "src/runtime/model/model_kernels.h"

namespace smla {

using model_detail::cdiv;
using model_detail::kLogicalBlock;
using model_detail::kSwaPage;

Model::Impl::~Impl() {
  if (memory != nullptr) (void)memory->synchronize();
}

TensorView Model::Impl::view(const model_detail::Buffer& mem, DType dtype, std::initializer_list<std::int64_t> shape,
                             std::int64_t row_offset) const {
  TensorView v = TensorView::contiguous(mem.get(), dtype, shape, memory->device());
  v.data = static_cast<std::uint8_t*>(mem.get()) +
           row_offset * v.stride[0] * static_cast<std::int64_t>(dtype_size(dtype));
  return v;
}

KvCacheView Model::Impl::kv_view(const model_detail::PagedBuffer& cache) const {
  KvCacheView v;
  v.format = options.kv_format;
  v.fp8_scale = 1.0f;
  const auto elem = static_cast<std::int64_t>(dtype_size(format.storage_dtype));
  v.pages = TensorView::strided(cache.mem.get(), format.storage_dtype,
                                {cache.pages, cache.page_size, format.row_elements},
                                {cache.page_stride / elem, format.row_elements, 1}, memory->device());
  return v;
}

IndexerCacheView Model::Impl::index_view(const model_detail::PagedBuffer& cache) const {
  return IndexerCacheView{TensorView::strided(cache.mem.get(), DType::kU8,
                                              {cache.pages, cache.page_size, IndexerFp8Format::kBytesPerToken},
                                              {cache.page_stride, IndexerFp8Format::kBytesPerToken, 1},
                                              memory->device())};
}

const RopeTable& Model::Impl::rope_of(const model_detail::ModelLayer& layer) const {
  return layer.type == LayerType::kSwaOnly ? *swa_rope : *compressed_rope;
}

// Page pools and fixed table widths; page ids depend only on the calls.
Status Model::Impl::init_pools() {
  const std::int64_t reqs = options.max_requests;
  swa_pool = model_detail::PagePool(reqs * cdiv(options.max_model_len, kSwaPage));
  c4_pool = model_detail::PagePool(reqs * cdiv(options.max_model_len, kLogicalBlock));
  c128_pool = model_detail::PagePool(reqs * cdiv(options.max_model_len, kLogicalBlock));
  // State rings hold one step's tokens plus the 2r rows an emission reads back.
  c4_ring_blocks = cdiv(options.max_batched_tokens + 8, compressor_state_block_size(4)) + 1;
  c128_ring_blocks = cdiv(options.max_batched_tokens + 128, compressor_state_block_size(128)) + 1;
  c4_state_pool = model_detail::PagePool(reqs * c4_ring_blocks);
  c128_state_pool = model_detail::PagePool(reqs * c128_ring_blocks);
  swa_cols = cdiv(options.max_model_len, kSwaPage);
  c_cols = cdiv(options.max_model_len, kLogicalBlock);
  c4_state_cols = cdiv(options.max_model_len, compressor_state_block_size(4));
  c128_state_cols = cdiv(options.max_model_len, compressor_state_block_size(128));
  c128_width = c128a_width(step_config);
  requests.resize(static_cast<std::size_t>(reqs));
  for (int l = 0; l < static_cast<int>(config.compress_ratios.size()); ++l) {
    auto type = layer_type_for_ratio(config.compress_ratios[static_cast<std::size_t>(l)]);
    if (!type) return type.status().with_context(fmt::format("compress_ratios[{}]: ", l));
    layers.emplace_back();
    layers.back().type = *type;
  }
  return Status::Ok();
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelConfig& Model::config() const { return impl_->config; }
Backend Model::backend() const { return impl_->context->backend(); }
const StepTiming& Model::last_timing() const { return impl_->timing; }
int Model::decode_graph_requests() const { return impl_->graph_requests; }

Expected<std::unique_ptr<Model>> Model::create(const ModelConfig& config, const ModelOptions& options,
                                               Backend backend) {
  auto context = Context::create(backend);
  if (!context) return context.status().with_context("Model::create: ");
  return create(*context, config, options);
}

Expected<std::unique_ptr<Model>> Model::create(const Context& context, const ModelConfig& config,
                                               const ModelOptions& options) {
  auto fail = [](const Status& s) { return s.with_context("Model::create: "); };
  auto step_config = model_detail::model_step_config(config, options);
  if (!step_config) return fail(step_config.status());
  // A model allocates its weights and caches at once: nothing a validating context may do.
  SMLA_RETURN_IF_ERROR(fail(runtime::check_runs(context)));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.config = config;
  m.options = options;
  m.format = kv_format_info(options.kv_format);
  m.step_config = *step_config;
  m.context = context;
  m.gemm_dtype = model_detail::gemm_dtype(context);
  auto memory = model_detail::make_model_memory(*m.context);
  if (!memory) return fail(memory.status());
  m.memory = std::move(*memory);
  auto swa_rope = RopeTable::create(RopeConfig::swa_only(), options.max_model_len);
  if (!swa_rope) return fail(swa_rope.status());
  auto compressed_rope = RopeTable::create(RopeConfig::compressed(), options.max_model_len);
  if (!compressed_rope) return fail(compressed_rope.status());
  m.swa_rope = std::move(*swa_rope);
  m.compressed_rope = std::move(*compressed_rope);
  if (Status s = m.init_pools(); !s.ok()) return fail(s);
  Status s = m.allocate_caches();
  if (s.ok()) s = m.allocate_step_buffers();
  if (s.ok()) s = m.allocate_activations();
  for (int l = 0; s.ok() && l < static_cast<int>(m.layers.size()); ++l) {
    s = m.upload_weights(l).with_context(fmt::format("layer {}: ", l));
  }
  if (s.ok()) s = m.size_workspaces();
  if (s.ok()) s = m.warm_up();
  if (!s.ok()) return fail(s);
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

Expected<int> Model::add_request() {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < m.requests.size(); ++i) {
    model_detail::RequestState& r = m.requests[i];
    if (r.live) continue;
    r = model_detail::RequestState{};
    SMLA_RETURN_IF_ERROR(m.c4_state_pool.reserve(r.c4_state_ring, m.c4_ring_blocks, "c4 state"));
    SMLA_RETURN_IF_ERROR(m.c128_state_pool.reserve(r.c128_state_ring, m.c128_ring_blocks, "c128 state"));
    r.live = true;
    return static_cast<int>(i);
  }
  return out_of_range("add_request", fmt::format("at most {} live requests", m.requests.size()), "all in use");
}

Status Model::finish_request(int request) {
  Impl& m = *impl_;
  if (request < 0 || request >= static_cast<int>(m.requests.size()) ||
      !m.requests[static_cast<std::size_t>(request)].live) {
    return invalid_argument("request", "a live request id", std::to_string(request));
  }
  model_detail::RequestState& r = m.requests[static_cast<std::size_t>(request)];
  m.swa_pool.release(r.swa_pages);
  m.c4_pool.release(r.c4_pages);
  m.c128_pool.release(r.c128_pages);
  m.c4_state_pool.release(r.c4_state_ring);
  m.c128_state_pool.release(r.c128_state_ring);
  r.live = false;
  return Status::Ok();
}

std::int64_t Model::seq_len(int request) const {
  if (request < 0 || request >= static_cast<int>(impl_->requests.size())) return -1;
  const model_detail::RequestState& r = impl_->requests[static_cast<std::size_t>(request)];
  return r.live ? r.seq_len : -1;
}

std::int64_t Model::kv_cache_bytes_used() const {
  const Impl& m = *impl_;
  std::int64_t bytes = 0;
  for (const auto& layer : m.layers) {
    bytes += m.swa_pool.used() * layer.swa.page_stride;
    if (layer.type == LayerType::kC4A) {
      bytes += m.c4_pool.used() * (layer.compressed.page_stride + layer.index_keys.page_stride);
    }
    if (layer.type == LayerType::kC128A) bytes += m.c128_pool.used() * layer.compressed.page_stride;
  }
  return bytes;
}

std::int64_t Model::kv_cache_bytes_reserved() const {
  std::int64_t bytes = 0;
  for (const auto& layer : impl_->layers) {
    bytes += static_cast<std::int64_t>(layer.swa.mem.bytes + layer.compressed.mem.bytes + layer.index_keys.mem.bytes);
  }
  return bytes;
}

std::vector<std::uint8_t> Model::layer_cache_bytes(int layer) const {
  std::vector<std::uint8_t> all;
  const Impl& m = *impl_;
  if (layer < 0 || layer >= static_cast<int>(m.layers.size())) return all;
  const model_detail::ModelLayer& l = m.layers[static_cast<std::size_t>(layer)];
  for (const model_detail::Buffer* mem : {&l.swa.mem, &l.compressed.mem, &l.index_keys.mem, &l.state, &l.index_state}) {
    if (mem->ptr == nullptr || mem->bytes == 0) continue;
    const std::size_t offset = all.size();
    all.resize(offset + mem->bytes);
    if (!m.memory->download(all.data() + offset, mem->get(), mem->bytes).ok()) return {};
  }
  return all;
}

}  // namespace smla
