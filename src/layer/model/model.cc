// The layer-stack runner: metadata, layer ops and sparse attention in one step.
#include "smla/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "smla/attention.h"
#include "smla/compressor.h"
#include "smla/context.h"
#include "smla/indexer.h"
#include "smla/layer.h"
#include "smla/rope.h"
#include "src/layer/model/model_common.h"
#include "src/layer/model/model_weights.h"

namespace smla {

using model_detail::LayerWeights;
using model_detail::PagePool;
using model_detail::RequestState;

namespace {

constexpr int kHeadDim = V4Fp8Format::kHeadDim;
constexpr int kLogicalBlock = model_detail::kModelLogicalBlock;
constexpr int kSwaPage = model_detail::kModelSwaPage;

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// An owned paged byte cache with an aligned page stride.
struct PagedBytes {
  std::vector<std::uint8_t> bytes;
  std::int64_t page_stride = 0;
};

struct LayerState {
  LayerWeights w;
  LayerType type = LayerType::kSwaOnly;
  PagedBytes swa, compressed, index_keys;
  std::vector<float> state, index_state;  // compressor state caches [blocks, bs, width]
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
TensorView view_of(std::vector<T>& v, DType dtype, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(v.data(), dtype, shape);
}

}  // namespace

struct Model::Impl {
  ModelConfig config;
  ModelOptions options;
  StepConfig step_config;
  std::optional<RopeTable> swa_rope, compressed_rope;
  std::vector<LayerState> layers;
  std::vector<RequestState> requests;
  PagePool swa_pool, c4_pool, c128_pool, c4_state_pool, c128_state_pool;
  std::int64_t c4_ring_blocks = 0, c128_ring_blocks = 0;
  KvFormatInfo format;

  KvCacheView kv_view(PagedBytes& cache, std::int64_t page_size) const {
    KvCacheView v;
    v.format = options.kv_format;
    v.fp8_scale = 1.0f;
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(format.storage_dtype));
    const std::int64_t pages = static_cast<std::int64_t>(cache.bytes.size()) / cache.page_stride;
    v.pages = TensorView::strided(cache.bytes.data(), format.storage_dtype, {pages, page_size, format.row_elements},
                                  {cache.page_stride / elem, format.row_elements, 1});
    return v;
  }
  IndexerCacheView index_view(PagedBytes& cache) const {
    const std::int64_t pages = static_cast<std::int64_t>(cache.bytes.size()) / cache.page_stride;
    return IndexerCacheView{TensorView::strided(cache.bytes.data(), DType::kU8,
                                                {pages, kLogicalBlock / 4, IndexerFp8Format::kBytesPerToken},
                                                {cache.page_stride, IndexerFp8Format::kBytesPerToken, 1})};
  }
  PagedBytes make_kv_cache(std::int64_t pages, std::int64_t page_size) const {
    const std::int64_t content = format.bytes_per_token * page_size;
    const std::int64_t stride = cdiv(content, V4Fp8Format::kPageAlign) * V4Fp8Format::kPageAlign;
    return PagedBytes{std::vector<std::uint8_t>(static_cast<std::size_t>(pages * stride), 0), stride};
  }

  Status run_layer(int l, const StepMetadata& meta, const std::vector<std::int32_t>& c4_table,
                   const std::vector<std::int32_t>& c128_table, std::int64_t table_rows, std::int64_t c4_cols,
                   std::int64_t c128_cols, const std::vector<std::int32_t>& c4_state_table,
                   const std::vector<std::int32_t>& c128_state_table, std::int64_t c4_state_cols,
                   std::int64_t c128_state_cols, std::vector<float>& x, std::vector<float>& layer_out,
                   const Context& context, bool verify, StepStats& stats);

  // The context of a backend, created on first use (one per backend; map
  // nodes stay put, so the pointers stay valid).
  Expected<const Context*> context_for(Backend backend);
  std::map<Backend, Context> contexts;
};

Expected<const Context*> Model::Impl::context_for(Backend backend) {
  const Backend resolved = resolve_backend(backend);
  if (auto found = contexts.find(resolved); found != contexts.end()) return &found->second;
  auto created = Context::create(resolved);
  if (!created) return created.status();
  return &contexts.emplace(resolved, *created).first->second;
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelConfig& Model::config() const { return impl_->config; }

Expected<std::unique_ptr<Model>> Model::create(const ModelConfig& config, const ModelOptions& options) {
  auto fail = [](const Status& s) { return s.with_context("Model::create: "); };
  auto step_config = model_detail::model_step_config(config, options);
  if (!step_config) return fail(step_config.status());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->options = options;
  impl->format = kv_format_info(options.kv_format);
  impl->step_config = *step_config;
  auto swa_rope = RopeTable::create(RopeConfig::swa_only(), options.max_model_len);
  if (!swa_rope) return fail(swa_rope.status());
  auto compressed_rope = RopeTable::create(RopeConfig::compressed(), options.max_model_len);
  if (!compressed_rope) return fail(compressed_rope.status());
  impl->swa_rope = std::move(*swa_rope);
  impl->compressed_rope = std::move(*compressed_rope);

  const std::int64_t reqs = options.max_requests;
  impl->swa_pool = PagePool(reqs * cdiv(options.max_model_len, kSwaPage));
  impl->c4_pool = PagePool(reqs * cdiv(options.max_model_len, kLogicalBlock));
  impl->c128_pool = PagePool(reqs * cdiv(options.max_model_len, kLogicalBlock));
  // State rings hold one step's tokens plus the 2r rows an emission reads back.
  impl->c4_ring_blocks = cdiv(options.max_batched_tokens + 8, compressor_state_block_size(4)) + 1;
  impl->c128_ring_blocks = cdiv(options.max_batched_tokens + 128, compressor_state_block_size(128)) + 1;
  impl->c4_state_pool = PagePool(reqs * impl->c4_ring_blocks);
  impl->c128_state_pool = PagePool(reqs * impl->c128_ring_blocks);

  for (int l = 0; l < static_cast<int>(config.compress_ratios.size()); ++l) {
    auto type = layer_type_for_ratio(config.compress_ratios[static_cast<std::size_t>(l)]);
    if (!type) return fail(type.status().with_context(fmt::format("compress_ratios[{}]: ", l)));
    LayerState layer;
    layer.type = *type;
    layer.w = model_detail::make_layer_weights(config, l, options.seed);
    layer.swa = impl->make_kv_cache(impl->swa_pool.capacity, kSwaPage);
    const int ratio = static_cast<int>(*type);
    if (ratio > 1) {
      layer.compressed = impl->make_kv_cache(ratio == 4 ? impl->c4_pool.capacity : impl->c128_pool.capacity,
                                             kLogicalBlock / ratio);
      const std::int64_t blocks = ratio == 4 ? impl->c4_state_pool.capacity : impl->c128_state_pool.capacity;
      layer.state.assign(static_cast<std::size_t>(blocks * compressor_state_block_size(ratio) *
                                                  compressor_state_width(ratio, kHeadDim)),
                         0.0f);
    }
    if (ratio == 4) {
      const std::int64_t content = IndexerFp8Format::page_content_bytes(kLogicalBlock / 4);
      const std::int64_t stride = cdiv(content, V4Fp8Format::kPageAlign) * V4Fp8Format::kPageAlign;
      layer.index_keys =
          PagedBytes{std::vector<std::uint8_t>(static_cast<std::size_t>(impl->c4_pool.capacity * stride), 0), stride};
      layer.index_state.assign(static_cast<std::size_t>(impl->c4_state_pool.capacity * compressor_state_block_size(4) *
                                                        compressor_state_width(4, 128)),
                               0.0f);
    }
    impl->layers.push_back(std::move(layer));
  }
  impl->requests.resize(static_cast<std::size_t>(reqs));
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

Expected<int> Model::add_request() {
  for (std::size_t i = 0; i < impl_->requests.size(); ++i) {
    RequestState& r = impl_->requests[i];
    if (r.live) continue;
    r = RequestState{};
    SMLA_RETURN_IF_ERROR(impl_->c4_state_pool.reserve(r.c4_state_ring, impl_->c4_ring_blocks, "c4 state"));
    SMLA_RETURN_IF_ERROR(impl_->c128_state_pool.reserve(r.c128_state_ring, impl_->c128_ring_blocks, "c128 state"));
    r.live = true;
    return static_cast<int>(i);
  }
  return out_of_range("add_request", fmt::format("at most {} live requests", impl_->requests.size()), "all in use");
}

Status Model::finish_request(int request) {
  if (request < 0 || request >= static_cast<int>(impl_->requests.size()) ||
      !impl_->requests[static_cast<std::size_t>(request)].live) {
    return invalid_argument("request", "a live request id", std::to_string(request));
  }
  RequestState& r = impl_->requests[static_cast<std::size_t>(request)];
  impl_->swa_pool.release(r.swa_pages);
  impl_->c4_pool.release(r.c4_pages);
  impl_->c128_pool.release(r.c128_pages);
  impl_->c4_state_pool.release(r.c4_state_ring);
  impl_->c128_state_pool.release(r.c128_state_ring);
  r.live = false;
  return Status::Ok();
}

std::int64_t Model::seq_len(int request) const {
  if (request < 0 || request >= static_cast<int>(impl_->requests.size())) return -1;
  const RequestState& r = impl_->requests[static_cast<std::size_t>(request)];
  return r.live ? r.seq_len : -1;
}

std::int64_t Model::kv_cache_bytes_used() const {
  std::int64_t bytes = 0;
  for (const LayerState& layer : impl_->layers) {
    bytes += impl_->swa_pool.used() * layer.swa.page_stride;
    if (layer.type == LayerType::kC4A) {
      bytes += impl_->c4_pool.used() * (layer.compressed.page_stride + layer.index_keys.page_stride);
    }
    if (layer.type == LayerType::kC128A) bytes += impl_->c128_pool.used() * layer.compressed.page_stride;
  }
  return bytes;
}

std::int64_t Model::kv_cache_bytes_reserved() const {
  std::int64_t bytes = 0;
  for (const LayerState& layer : impl_->layers) {
    bytes += static_cast<std::int64_t>(layer.swa.bytes.size() + layer.compressed.bytes.size() +
                                       layer.index_keys.bytes.size());
  }
  return bytes;
}

std::vector<std::uint8_t> Model::layer_cache_bytes(int layer) const {
  std::vector<std::uint8_t> all;
  if (layer < 0 || layer >= static_cast<int>(impl_->layers.size())) return all;
  const LayerState& l = impl_->layers[static_cast<std::size_t>(layer)];
  auto append = [&all](const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    all.insert(all.end(), b, b + n);
  };
  append(l.swa.bytes.data(), l.swa.bytes.size());
  append(l.compressed.bytes.data(), l.compressed.bytes.size());
  append(l.index_keys.bytes.data(), l.index_keys.bytes.size());
  append(l.state.data(), l.state.size() * sizeof(float));
  append(l.index_state.data(), l.index_state.size() * sizeof(float));
  return all;
}

namespace {

// Copies rows `rows` of a [T, width] array.
template <class T>
std::vector<T> gather_rows(const std::vector<T>& src, std::int64_t width, const std::vector<std::int64_t>& rows) {
  std::vector<T> out;
  out.reserve(rows.size() * static_cast<std::size_t>(width));
  for (std::int64_t r : rows) out.insert(out.end(), src.begin() + r * width, src.begin() + (r + 1) * width);
  return out;
}

}  // namespace

Status Model::Impl::run_layer(int l, const StepMetadata& meta, const std::vector<std::int32_t>& c4_table,
                              const std::vector<std::int32_t>& c128_table, std::int64_t table_rows,
                              std::int64_t c4_cols, std::int64_t c128_cols,
                              const std::vector<std::int32_t>& c4_state_table,
                              const std::vector<std::int32_t>& c128_state_table, std::int64_t c4_state_cols,
                              std::int64_t c128_state_cols, std::vector<float>& x, std::vector<float>& layer_out,
                              const Context& context, bool verify, StepStats& stats) {
  using clock = std::chrono::steady_clock;
  LayerState& layer = layers[static_cast<std::size_t>(l)];
  const LayerWeights& w = layer.w;
  const std::int64_t T = meta.counts().num_tokens;
  const std::int64_t H = config.num_heads;
  const int ratio = static_cast<int>(layer.type);
  const RopeTable& rope = ratio == 1 ? *swa_rope : *compressed_rope;
  auto positions = TensorView::contiguous(const_cast<std::int64_t*>(meta.positions.data()), DType::kI64, {T});
  auto token_to_req = TensorView::contiguous(const_cast<std::int32_t*>(meta.token_to_req.data()), DType::kI32, {T});

  // 1. Projections and norms.
  auto start = clock::now();
  std::vector<float> qr(static_cast<std::size_t>(T * config.q_lora_rank)), kv(static_cast<std::size_t>(T * kHeadDim));
  model_detail::linear(x.data(), T, w.wq_a, qr.data(), options.row_stable);
  model_detail::rms_norm_rows(qr.data(), T, config.q_lora_rank, w.q_norm.data(), config.rms_eps);
  model_detail::linear(x.data(), T, w.wkv, kv.data(), options.row_stable);
  model_detail::rms_norm_rows(kv.data(), T, kHeadDim, w.kv_norm.data(), config.rms_eps);
  std::vector<float> q(static_cast<std::size_t>(T * H * kHeadDim));
  model_detail::linear(qr.data(), T, w.wq_b, q.data(), options.row_stable);
  std::vector<float> kv_score, index_q, index_w, index_kv_score;
  if (ratio > 1) {
    kv_score.resize(static_cast<std::size_t>(T * w.compressor.wkv_wgate.rows));
    model_detail::linear(x.data(), T, w.compressor.wkv_wgate, kv_score.data(), options.row_stable);
  }
  if (ratio == 4) {
    index_q.resize(static_cast<std::size_t>(T * w.index_wq_b.rows));
    model_detail::linear(qr.data(), T, w.index_wq_b, index_q.data(), options.row_stable);
    index_w.resize(static_cast<std::size_t>(T * config.index_heads));
    model_detail::linear(x.data(), T, w.index_weights_proj, index_w.data(), options.row_stable);
    index_kv_score.resize(static_cast<std::size_t>(T * w.index_compressor.wkv_wgate.rows));
    model_detail::linear(x.data(), T, w.index_compressor.wkv_wgate, index_kv_score.data(), options.row_stable);
  }
  stats.projection_s += seconds_since(start);

  // 2. Query prep, SWA insert, compressors.
  start = clock::now();
  std::vector<std::uint16_t> q_bf16(static_cast<std::size_t>(T * H * kHeadDim));
  const auto q_view = view_of(q_bf16, DType::kBF16, {T, H, kHeadDim});
  SMLA_RETURN_IF_ERROR(
      prepare_query(context, {view_of(q, DType::kF32, {T, H, kHeadDim}), positions, &rope, config.rms_eps, q_view}));
  const KvCacheView swa_cache = kv_view(layer.swa, kSwaPage);
  SMLA_RETURN_IF_ERROR(prepare_kv(
      context, {view_of(kv, DType::kF32, {T, kHeadDim}),
                positions,
                &rope,
                TensorView::contiguous(const_cast<std::int64_t*>(meta.swa_slot_mapping.data()), DType::kI64, {T}),
                swa_cache,
                {}}));
  std::optional<KvCacheView> compressed_cache;
  auto compress = [&](int r, int head_dim, std::vector<float>& scores, const model_detail::CompressorWeights& cw,
                      std::vector<float>& state, const std::vector<std::int32_t>& state_table, std::int64_t state_cols,
                      const std::vector<std::int64_t>& slots, std::optional<KvCacheView> kv_dest,
                      std::optional<IndexerCacheView> index_dest) -> Status {
    const std::int64_t bs = compressor_state_block_size(r);
    const std::int64_t width = compressor_state_width(r, head_dim);
    std::vector<std::int64_t> state_slots(static_cast<std::size_t>(T), -1);
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t req = meta.token_to_req[static_cast<std::size_t>(t)];
      if (req < 0 || !meta.is_valid_token[static_cast<std::size_t>(t)]) continue;
      const std::int64_t p = meta.positions[static_cast<std::size_t>(t)];
      state_slots[static_cast<std::size_t>(t)] =
          state_table[static_cast<std::size_t>(req * state_cols + p / bs)] * bs + p % bs;
    }
    CompressorArgs args;
    args.ratio = r;
    args.kv_score = view_of(scores, DType::kF32, {T, width});
    args.ape = TensorView::contiguous(const_cast<float*>(cw.ape.data()), DType::kF32,
                                      {r, compressor_coff(r) * head_dim});
    args.norm_weight = TensorView::contiguous(const_cast<float*>(cw.norm.data()), DType::kF32, {head_dim});
    args.positions = positions;
    args.token_to_request = token_to_req;
    args.state_cache = view_of(state, DType::kF32,
                               {static_cast<std::int64_t>(state.size()) / (bs * width), bs, width});
    args.state_block_table = TensorView::contiguous(const_cast<std::int32_t*>(state_table.data()), DType::kI32,
                                                    {table_rows, state_cols});
    args.state_slot_mapping = view_of(state_slots, DType::kI64, {T});
    args.compressed_slot_mapping = TensorView::contiguous(const_cast<std::int64_t*>(slots.data()), DType::kI64, {T});
    args.rope = &rope;
    args.eps = config.rms_eps;
    args.kv_cache = kv_dest;
    args.index_cache = index_dest;
    return run_compressor(context, args);
  };
  if (ratio > 1) {
    compressed_cache = kv_view(layer.compressed, kLogicalBlock / ratio);
    SMLA_RETURN_IF_ERROR(compress(ratio, kHeadDim, kv_score, w.compressor, layer.state,
                                  ratio == 4 ? c4_state_table : c128_state_table,
                                  ratio == 4 ? c4_state_cols : c128_state_cols,
                                  ratio == 4 ? meta.c4_slot_mapping : meta.c128_slot_mapping, compressed_cache,
                                  std::nullopt));
  }
  stats.cache_write_s += seconds_since(start);

  // 3. Compressed-entry selection: indexer top-k (C4A) or every entry (C128A).
  start = clock::now();
  std::int64_t extra_width = 0;
  std::vector<std::int32_t> extra_indices, extra_lens;
  if (ratio > 1) {
    const std::int64_t block_size = kLogicalBlock / ratio;
    std::vector<std::int32_t> local;
    if (ratio == 4) {
      const IndexerCacheView keys = index_view(layer.index_keys);
      SMLA_RETURN_IF_ERROR(compress(4, 128, index_kv_score, w.index_compressor, layer.index_state, c4_state_table,
                                    c4_state_cols, meta.c4_slot_mapping, std::nullopt, keys));
      const std::int64_t Hi = config.index_heads;
      std::vector<std::uint8_t> q8(static_cast<std::size_t>(T * Hi * 128));
      std::vector<float> head_weights(static_cast<std::size_t>(T * Hi));
      SMLA_RETURN_IF_ERROR(prepare_indexer_query(
          context, {view_of(index_q, DType::kF32, {T, Hi, 128}), view_of(index_w, DType::kF32, {T, Hi}), positions,
                    &rope, view_of(q8, DType::kE4M3, {T, Hi, 128}), view_of(head_weights, DType::kF32, {T, Hi})}));
      extra_width = config.index_topk;
      local.assign(static_cast<std::size_t>(T * extra_width), -1);
      IndexerTopkArgs topk{view_of(q8, DType::kE4M3, {T, Hi, 128}),
                           view_of(head_weights, DType::kF32, {T, Hi}),
                           keys,
                           positions,
                           token_to_req,
                           TensorView::contiguous(const_cast<std::int32_t*>(c4_table.data()), DType::kI32,
                                                  {table_rows, c4_cols}),
                           meta.counts().max_seq_len,
                           true,
                           view_of(local, DType::kI32, {T, extra_width})};
      SMLA_RETURN_IF_ERROR(indexer_topk(context, topk));
      extra_indices.assign(static_cast<std::size_t>(T * extra_width), -1);
      extra_lens.assign(static_cast<std::size_t>(T), 0);
      SMLA_RETURN_IF_ERROR(c4a_global_topk_indices(
          view_of(local, DType::kI32, {T, extra_width}), token_to_req,
          TensorView::contiguous(const_cast<std::uint8_t*>(meta.is_valid_token.data()), DType::kU8, {T}),
          TensorView::contiguous(const_cast<std::int32_t*>(c4_table.data()), DType::kI32, {table_rows, c4_cols}),
          block_size, view_of(extra_indices, DType::kI32, {T, extra_width}), view_of(extra_lens, DType::kI32, {T})));
    } else {
      // C128A attends every entry: decode rows come global from the metadata;
      // prefill rows are local (0..n-1) and go through the ratio-128 table.
      extra_width = c128a_width(step_config);
      const std::int64_t decode_rows = meta.counts().num_decode_tokens;
      const std::int64_t prefill_rows = meta.counts().num_prefill_tokens;
      extra_indices.assign(static_cast<std::size_t>(T * extra_width), -1);
      extra_lens.assign(static_cast<std::size_t>(T), 0);
      std::copy_n(meta.c128a_decode_indices.begin(), decode_rows * extra_width, extra_indices.begin());
      std::copy_n(meta.c128a_decode_lens.begin(), decode_rows, extra_lens.begin());
      if (prefill_rows > 0) {
        auto rows = [&](const void* base, DType dtype, std::int64_t width) {
          const std::int64_t elem = static_cast<std::int64_t>(dtype_size(dtype));
          auto* p = static_cast<std::uint8_t*>(const_cast<void*>(base)) +
                    decode_rows * std::max<std::int64_t>(width, 1) * elem;
          return width == 0 ? TensorView::contiguous(p, dtype, {prefill_rows})
                            : TensorView::contiguous(p, dtype, {prefill_rows, width});
        };
        SMLA_RETURN_IF_ERROR(c4a_global_topk_indices(
            TensorView::contiguous(const_cast<std::int32_t*>(meta.c128a_prefill_indices.data()), DType::kI32,
                                   {prefill_rows, extra_width}),
            rows(meta.token_to_req.data(), DType::kI32, 0), rows(meta.is_valid_token.data(), DType::kU8, 0),
            TensorView::contiguous(const_cast<std::int32_t*>(c128_table.data()), DType::kI32, {table_rows, c128_cols}),
            block_size, rows(extra_indices.data(), DType::kI32, extra_width),
            rows(extra_lens.data(), DType::kI32, 0)));
      }
    }
  }
  stats.indexer_s += seconds_since(start);

  // 4. Sparse attention: every token is a row over the paged caches.
  start = clock::now();
  const std::int64_t W = config.window;
  std::vector<std::uint16_t> o(static_cast<std::size_t>(T * H * kHeadDim));
  std::vector<float> sink = w.sink;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  auto attend = [&](std::vector<std::uint16_t>& q_rows, const std::vector<std::int32_t>& swa_idx,
                    const std::vector<std::int32_t>& swa_len, const std::vector<std::int32_t>& ext_idx,
                    const std::vector<std::int32_t>& ext_len, std::vector<std::uint16_t>& out_rows, std::int64_t rows,
                    const Context& on) -> Status {
    SparseDecodeArgs a;
    a.q = view_of(q_rows, DType::kBF16, {rows, H, kHeadDim});
    a.main_cache = swa_cache;
    a.main_indices = TensorView::contiguous(const_cast<std::int32_t*>(swa_idx.data()), DType::kI32, {rows, W});
    a.main_lengths = TensorView::contiguous(const_cast<std::int32_t*>(swa_len.data()), DType::kI32, {rows});
    if (compressed_cache) {
      a.extra_cache = *compressed_cache;
      a.extra_indices = TensorView::contiguous(const_cast<std::int32_t*>(ext_idx.data()), DType::kI32,
                                               {rows, extra_width});
      a.extra_lengths = TensorView::contiguous(const_cast<std::int32_t*>(ext_len.data()), DType::kI32, {rows});
    }
    a.sink = view_of(sink, DType::kF32, {H});
    a.softmax_scale = scale;
    a.out = view_of(out_rows, DType::kBF16, {rows, H, kHeadDim});
    return sparse_decode(on, a);
  };
  SMLA_RETURN_IF_ERROR(attend(q_bf16, meta.swa_indices, meta.swa_lens, extra_indices, extra_lens, o, T, context));
  stats.attention_s += seconds_since(start);

  if (verify) {
    start = clock::now();
    auto reference = context_for(Backend::kReference);
    if (!reference) return reference.status();
    const auto rows = model_detail::sample_rows(T, options.verify_rows);
    const auto n = static_cast<std::int64_t>(rows.size());
    auto q_rows = gather_rows(q_bf16, H * kHeadDim, rows);
    std::vector<std::uint16_t> ref(static_cast<std::size_t>(n * H * kHeadDim));
    SMLA_RETURN_IF_ERROR(attend(q_rows, gather_rows(meta.swa_indices, W, rows), gather_rows(meta.swa_lens, 1, rows),
                                gather_rows(extra_indices, extra_width, rows),
                                compressed_cache ? gather_rows(extra_lens, 1, rows) : extra_lens, ref, n,
                                **reference));
    double max_err = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t k = 0; k < H * kHeadDim; ++k) {
        const double got =
            bf16_to_f32(o[static_cast<std::size_t>(rows[static_cast<std::size_t>(i)] * H * kHeadDim + k)]);
        const double want = bf16_to_f32(ref[static_cast<std::size_t>(i * H * kHeadDim + k)]);
        const double err = std::fabs(got - want);
        max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
      }
    }
    stats.checks.push_back(LayerCheck{l, layer.type, max_err, n});
    stats.verify_s += seconds_since(start);
  }

  // 5. Output projection, then the next layer's input.
  start = clock::now();
  layer_out.assign(static_cast<std::size_t>(T * config.hidden), 0.0f);
  SMLA_RETURN_IF_ERROR(project_output(
      context,
      {view_of(o, DType::kBF16, {T, H, kHeadDim}), static_cast<int>(H), positions, &rope,
       TensorView::contiguous(const_cast<float*>(w.wo_a.data()), DType::kF32,
                              {config.o_groups, config.o_lora_rank, H / config.o_groups * kHeadDim}),
       TensorView::contiguous(const_cast<float*>(w.wo_b.values.data()), DType::kF32, {w.wo_b.rows, w.wo_b.cols}),
       view_of(layer_out, DType::kF32, {T, config.hidden}), options.row_stable}));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += layer_out[i];
  model_detail::rms_norm_rows(x.data(), T, config.hidden, nullptr, config.rms_eps);
  stats.output_s += seconds_since(start);
  return Status::Ok();
}

Status Model::step(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out, Backend backend,
                   bool verify, StepStats* stats) {
  auto fail = [](const Status& s) { return s.with_context("Model::step: "); };
  Impl& m = *impl_;
  const auto R = static_cast<std::int64_t>(batch.size());
  std::int64_t T = 0;
  for (std::int64_t i = 0; i < R; ++i) {
    const StepEntry& e = batch[static_cast<std::size_t>(i)];
    if (e.request < 0 || e.request >= static_cast<int>(m.requests.size()) ||
        !m.requests[static_cast<std::size_t>(e.request)].live) {
      return fail(
          invalid_argument(fmt::format("batch[{}].request", i), "a live request id", std::to_string(e.request)));
    }
    for (std::int64_t j = 0; j < i; ++j) {
      if (batch[static_cast<std::size_t>(j)].request == e.request) {
        return fail(invalid_argument(fmt::format("batch[{}].request", i), "each request at most once per step",
                                     std::to_string(e.request)));
      }
    }
    const std::int64_t new_len = m.requests[static_cast<std::size_t>(e.request)].seq_len + e.query_len;
    if (e.query_len < 1 || new_len > m.options.max_model_len) {
      return fail(out_of_range(fmt::format("batch[{}].query_len", i),
                               fmt::format(">= 1 and a context of at most {} tokens", m.options.max_model_len),
                               std::to_string(e.query_len)));
    }
    T += e.query_len;
  }
  if (T > m.options.max_batched_tokens) {
    return fail(
        out_of_range("batch", fmt::format("at most {} tokens", m.options.max_batched_tokens), std::to_string(T)));
  }
  for (const auto& [view, name] : {std::pair{&x, "x"}, std::pair{&out, "out"}}) {
    if (!view->present() || view->dtype != DType::kF32 || view->rank != 2 || view->shape[0] != T ||
        view->shape[1] != m.config.hidden || !view->is_contiguous() || view->data == nullptr) {
      return fail(invalid_argument(name, fmt::format("contiguous f32 [{}, {}]", T, m.config.hidden),
                                   view->present() ? view->describe() : "absent"));
    }
  }
  if (stats == nullptr) return fail(invalid_argument("stats", "a StepStats", "nullptr"));
  const Backend resolved = resolve_backend(backend);
  if (resolved != Backend::kReference && resolved != Backend::kCpu) {
    return fail(unimplemented(fmt::format("Model runs on the host backends (reference, cpu), not '{}': the GPU "
                                          "step is CudaModel (smla/cuda_model.h)",
                                          backend_name(resolved))));
  }
  auto context = m.context_for(resolved);
  if (!context) return fail(context.status());

  // Pages for the new lengths, then the batch description.
  std::vector<std::int32_t> query_lens(static_cast<std::size_t>(R)), seq_lens(static_cast<std::size_t>(R));
  std::int64_t swa_cols = 1, c_cols = 1;
  for (std::int64_t i = 0; i < R; ++i) {
    const StepEntry& e = batch[static_cast<std::size_t>(i)];
    RequestState& r = m.requests[static_cast<std::size_t>(e.request)];
    const std::int64_t new_len = r.seq_len + e.query_len;
    SMLA_RETURN_IF_ERROR(m.swa_pool.reserve(r.swa_pages, cdiv(new_len, kSwaPage), "swa").with_context("Model::step: "));
    SMLA_RETURN_IF_ERROR(
        m.c4_pool.reserve(r.c4_pages, cdiv(new_len, kLogicalBlock), "c4").with_context("Model::step: "));
    SMLA_RETURN_IF_ERROR(
        m.c128_pool.reserve(r.c128_pages, cdiv(new_len, kLogicalBlock), "c128").with_context("Model::step: "));
    query_lens[static_cast<std::size_t>(i)] = e.query_len;
    seq_lens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(new_len);
    swa_cols = std::max<std::int64_t>(swa_cols, static_cast<std::int64_t>(r.swa_pages.size()));
    c_cols = std::max<std::int64_t>(c_cols, static_cast<std::int64_t>(r.c4_pages.size()));
  }
  const std::int64_t c4_state_cols = cdiv(m.options.max_model_len, compressor_state_block_size(4));
  const std::int64_t c128_state_cols = cdiv(m.options.max_model_len, compressor_state_block_size(128));
  std::vector<std::int32_t> swa_table(static_cast<std::size_t>(R * swa_cols), 0),
      c4_table(static_cast<std::size_t>(R * c_cols), 0), c128_table(static_cast<std::size_t>(R * c_cols), 0),
      c4_state_table(static_cast<std::size_t>(R * c4_state_cols)),
      c128_state_table(static_cast<std::size_t>(R * c128_state_cols));
  for (std::int64_t i = 0; i < R; ++i) {
    const RequestState& r = m.requests[static_cast<std::size_t>(batch[static_cast<std::size_t>(i)].request)];
    std::copy(r.swa_pages.begin(), r.swa_pages.end(), swa_table.begin() + i * swa_cols);
    std::copy(r.c4_pages.begin(), r.c4_pages.end(), c4_table.begin() + i * c_cols);
    std::copy(r.c128_pages.begin(), r.c128_pages.end(), c128_table.begin() + i * c_cols);
    // State rings: column c (positions c*bs ..) lives in ring block c % ring size.
    for (std::int64_t c = 0; c < c4_state_cols; ++c) {
      c4_state_table[static_cast<std::size_t>(i * c4_state_cols + c)] =
          r.c4_state_ring[static_cast<std::size_t>(c % m.c4_ring_blocks)];
    }
    for (std::int64_t c = 0; c < c128_state_cols; ++c) {
      c128_state_table[static_cast<std::size_t>(i * c128_state_cols + c)] =
          r.c128_state_ring[static_cast<std::size_t>(c % m.c128_ring_blocks)];
    }
  }
  BatchDescription desc;
  desc.query_lens = view_of(query_lens, DType::kI32, {R});
  desc.seq_lens = view_of(seq_lens, DType::kI32, {R});
  desc.swa_block_table = view_of(swa_table, DType::kI32, {R, swa_cols});
  desc.c4_block_table = view_of(c4_table, DType::kI32, {R, c_cols});
  desc.c128_block_table = view_of(c128_table, DType::kI32, {R, c_cols});
  auto meta = make_step_metadata(desc, m.step_config);
  if (!meta) return fail(meta.status());

  std::vector<float> hidden(x.ptr<const float>(), x.ptr<const float>() + T * m.config.hidden), layer_out;
  for (int l = 0; l < static_cast<int>(m.layers.size()); ++l) {
    Status s = m.run_layer(l, *meta, c4_table, c128_table, R, c_cols, c_cols, c4_state_table, c128_state_table,
                           c4_state_cols, c128_state_cols, hidden, layer_out, **context, verify, *stats);
    if (!s.ok())
      return s.with_context(
          fmt::format("Model::step: layer {} ({}): ", l, layer_type_name(m.layers[static_cast<std::size_t>(l)].type)));
  }
  std::copy(hidden.begin(), hidden.end(), out.ptr<float>());
  for (std::int64_t i = 0; i < R; ++i) {
    m.requests[static_cast<std::size_t>(batch[static_cast<std::size_t>(i)].request)].seq_len +=
        batch[static_cast<std::size_t>(i)].query_len;
  }
  return Status::Ok();
}

}  // namespace smla
