// smla::CudaModel: creation, requests and pages, eager steps and the
// whole-step decode graph. The per-layer work is in cuda_model_layer.cc, the
// verification in cuda_model_verify.cc.
#include "smla/cuda_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "smla/compressor.h"
#include "smla/context.h"
#include "smla/metadata.h"
#include "smla/numeric.h"
#include "src/cuda/cublaslt_gemm.h"
#include "src/layer/model/cuda/cuda_model_impl.h"
#include "src/layer/model/model_weights.h"

namespace smla {

using cuda_model::cdiv;
using cuda_model::DeviceMem;
using cuda_model::kHeadDim;
using cuda_model::kLogicalBlock;
using cuda_model::kSwaPage;

Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return internal_error(fmt::format("CudaModel: {} failed: {}", what, cudaGetErrorString(error)));
}

namespace cuda_model {

Status allocate(DeviceMem& mem, std::size_t bytes, const char* what) {
  void* p = nullptr;
  const std::size_t size = std::max<std::size_t>(bytes, 256);  // never a null pointer for an empty buffer
  if (cudaMalloc(&p, size) != cudaSuccess) {
    (void)cudaGetLastError();
    return internal_error(fmt::format("CudaModel: cudaMalloc of {} bytes for {} failed", size, what));
  }
  mem.ptr.reset(p);
  mem.bytes = bytes;
  return cuda_status(cudaMemset(p, 0, size), "cudaMemset");
}

}  // namespace cuda_model

CudaModel::Impl::~Impl() {
  if (graph_exec != nullptr) cudaGraphExecDestroy(graph_exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  if (replay_start != nullptr) cudaEventDestroy(replay_start);
  if (replay_end != nullptr) cudaEventDestroy(replay_end);
  if (stream != nullptr) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

TensorView CudaModel::Impl::dev(const DeviceMem& mem, DType dtype, std::initializer_list<std::int64_t> shape,
                                 std::int64_t row_offset) const {
  TensorView v = TensorView::contiguous(mem.get(), dtype, shape, device);
  v.data = static_cast<std::uint8_t*>(mem.get()) + row_offset * v.stride[0] * static_cast<std::int64_t>(dtype_size(dtype));
  return v;
}

KvCacheView CudaModel::Impl::kv_view(const cuda_model::DevicePaged& cache) const {
  KvCacheView v;
  v.format = options.kv_format;
  v.fp8_scale = 1.0f;
  const auto elem = static_cast<std::int64_t>(dtype_size(format.storage_dtype));
  v.pages = TensorView::strided(cache.mem.get(), format.storage_dtype, {cache.pages, cache.page_size, format.row_elements},
                                {cache.page_stride / elem, format.row_elements, 1}, device);
  return v;
}

IndexerCacheView CudaModel::Impl::index_view(const cuda_model::DevicePaged& cache) const {
  return IndexerCacheView{TensorView::strided(cache.mem.get(), DType::kU8,
                                              {cache.pages, cache.page_size, IndexerFp8Format::kBytesPerToken},
                                              {cache.page_stride, IndexerFp8Format::kBytesPerToken, 1}, device)};
}

namespace {

Status upload(const DeviceMem& dst, const void* src, std::size_t bytes) {
  return cuda_status(cudaMemcpy(dst.get(), src, bytes, cudaMemcpyHostToDevice), "weight upload");
}

Status upload_matrix(cuda_model::DeviceMatrix& dst, const model_detail::Matrix& m, const char* what) {
  std::vector<std::uint16_t> bits(m.values.size());
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(m.values[i]);  // exact: values are bf16
  dst.rows = m.rows;
  dst.cols = m.cols;
  SMLA_RETURN_IF_ERROR(cuda_model::allocate(dst.mem, bits.size() * 2, what));
  return upload(dst.mem, bits.data(), bits.size() * 2);
}

Status upload_bf16(DeviceMem& dst, const std::vector<float>& values, const char* what) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  SMLA_RETURN_IF_ERROR(cuda_model::allocate(dst, bits.size() * 2, what));
  return upload(dst, bits.data(), bits.size() * 2);
}

Status upload_f32(DeviceMem& dst, const std::vector<float>& values, const char* what) {
  SMLA_RETURN_IF_ERROR(cuda_model::allocate(dst, values.size() * 4, what));
  return upload(dst, values.data(), values.size() * 4);
}

Status upload_compressor(cuda_model::DeviceCompressor& dst, const model_detail::CompressorWeights& w) {
  SMLA_RETURN_IF_ERROR(upload_matrix(dst.wkv_wgate, w.wkv_wgate, "compressor wkv_wgate"));
  SMLA_RETURN_IF_ERROR(upload_f32(dst.ape, w.ape, "compressor ape"));
  return upload_f32(dst.norm, w.norm, "compressor norm");
}

}  // namespace

Status CudaModel::Impl::upload_weights(int l) {
  cuda_model::DeviceLayer& layer = layers[static_cast<std::size_t>(l)];
  const model_detail::LayerWeights w = model_detail::make_layer_weights(config, l, options.seed);
  SMLA_RETURN_IF_ERROR(upload_matrix(layer.wq_a, w.wq_a, "wq_a"));
  SMLA_RETURN_IF_ERROR(upload_matrix(layer.wkv, w.wkv, "wkv"));
  SMLA_RETURN_IF_ERROR(upload_matrix(layer.wq_b, w.wq_b, "wq_b"));
  SMLA_RETURN_IF_ERROR(upload_f32(layer.q_norm, w.q_norm, "q_norm"));
  SMLA_RETURN_IF_ERROR(upload_f32(layer.kv_norm, w.kv_norm, "kv_norm"));
  SMLA_RETURN_IF_ERROR(upload_f32(layer.sink, w.sink, "sink"));
  SMLA_RETURN_IF_ERROR(upload_bf16(layer.wo_a, w.wo_a, "wo_a"));
  SMLA_RETURN_IF_ERROR(upload_bf16(layer.wo_b, w.wo_b.values, "wo_b"));
  if (layer.type != LayerType::kSwaOnly) SMLA_RETURN_IF_ERROR(upload_compressor(layer.compressor, w.compressor));
  if (layer.type == LayerType::kC4A) {
    SMLA_RETURN_IF_ERROR(upload_matrix(layer.index_wq_b, w.index_wq_b, "index_wq_b"));
    SMLA_RETURN_IF_ERROR(upload_matrix(layer.index_weights_proj, w.index_weights_proj, "index_weights_proj"));
    SMLA_RETURN_IF_ERROR(upload_compressor(layer.index_compressor, w.index_compressor));
  }
  return Status::Ok();
}

Status CudaModel::Impl::allocate_all() {
  using cuda_model::allocate;
  const std::int64_t R = options.max_requests;
  const std::int64_t T = options.max_batched_tokens;
  const std::int64_t H = config.num_heads;
  const std::int64_t Hi = config.index_heads;
  const std::int64_t W = config.window;
  auto i32 = [](std::int64_t n) { return static_cast<std::size_t>(n) * 4; };
  auto i64 = [](std::int64_t n) { return static_cast<std::size_t>(n) * 8; };

  // Caches, sized as Model sizes them.
  auto make_paged = [&](cuda_model::DevicePaged& cache, std::int64_t pages, std::int64_t page_size,
                        std::int64_t content, const char* what) {
    cache.pages = pages;
    cache.page_size = page_size;
    cache.page_stride = cdiv(content, V4Fp8Format::kPageAlign) * V4Fp8Format::kPageAlign;
    return allocate(cache.mem, static_cast<std::size_t>(pages * cache.page_stride), what);
  };
  std::int64_t max_extra = 0;
  for (auto& layer : layers) {
    SMLA_RETURN_IF_ERROR(make_paged(layer.swa, swa_pool.capacity, kSwaPage, format.bytes_per_token * kSwaPage, "swa cache"));
    const int ratio = static_cast<int>(layer.type);
    if (ratio > 1) {
      const std::int64_t page_size = kLogicalBlock / ratio;
      SMLA_RETURN_IF_ERROR(make_paged(layer.compressed, ratio == 4 ? c4_pool.capacity : c128_pool.capacity, page_size,
                                      format.bytes_per_token * page_size, "compressed cache"));
      layer.state_blocks = ratio == 4 ? c4_state_pool.capacity : c128_state_pool.capacity;
      SMLA_RETURN_IF_ERROR(allocate(layer.state,
                                    static_cast<std::size_t>(layer.state_blocks * compressor_state_block_size(ratio) *
                                                             compressor_state_width(ratio, kHeadDim)) * 4,
                                    "compressor state"));
      layer.extra_width = ratio == 4 ? config.index_topk : c128_width;
      max_extra = std::max(max_extra, layer.extra_width);
    }
    if (ratio == 4) {
      SMLA_RETURN_IF_ERROR(make_paged(layer.index_keys, c4_pool.capacity, kLogicalBlock / 4,
                                      IndexerFp8Format::page_content_bytes(kLogicalBlock / 4), "indexer key cache"));
      layer.index_state_blocks = c4_state_pool.capacity;
      SMLA_RETURN_IF_ERROR(allocate(layer.index_state,
                                    static_cast<std::size_t>(layer.index_state_blocks * compressor_state_block_size(4) *
                                                             compressor_state_width(4, 128)) * 4,
                                    "indexer compressor state"));
    }
  }

  // Step inputs.
  SMLA_RETURN_IF_ERROR(allocate(query_lens, i32(R), "query_lens"));
  SMLA_RETURN_IF_ERROR(allocate(seq_lens, i32(R), "seq_lens"));
  SMLA_RETURN_IF_ERROR(allocate(swa_table, i32(R * swa_cols), "swa block table"));
  SMLA_RETURN_IF_ERROR(allocate(c4_table, i32(R * c_cols), "c4 block table"));
  SMLA_RETURN_IF_ERROR(allocate(c128_table, i32(R * c_cols), "c128 block table"));
  SMLA_RETURN_IF_ERROR(allocate(c4_state_table, i32(R * c4_state_cols), "c4 state table"));
  SMLA_RETURN_IF_ERROR(allocate(c128_state_table, i32(R * c128_state_cols), "c128 state table"));
  h_query_lens.assign(static_cast<std::size_t>(R), 0);
  h_seq_lens.assign(static_cast<std::size_t>(R), 0);
  h_swa_table.assign(static_cast<std::size_t>(R * swa_cols), 0);
  h_c4_table.assign(static_cast<std::size_t>(R * c_cols), 0);
  h_c128_table.assign(static_cast<std::size_t>(R * c_cols), 0);
  h_c4_state_table.assign(static_cast<std::size_t>(R * c4_state_cols), 0);
  h_c128_state_table.assign(static_cast<std::size_t>(R * c128_state_cols), 0);

  // Metadata.
  SMLA_RETURN_IF_ERROR(allocate(query_start_loc, i32(R + 1), "query_start_loc"));
  SMLA_RETURN_IF_ERROR(allocate(token_to_req, i32(T), "token_to_req"));
  SMLA_RETURN_IF_ERROR(allocate(positions, i64(T), "positions"));
  SMLA_RETURN_IF_ERROR(allocate(is_valid_token, static_cast<std::size_t>(T), "is_valid_token"));
  SMLA_RETURN_IF_ERROR(allocate(swa_slot_mapping, i64(T), "swa_slot_mapping"));
  SMLA_RETURN_IF_ERROR(allocate(swa_indices, i32(T * W), "swa_indices"));
  SMLA_RETURN_IF_ERROR(allocate(swa_lens, i32(T), "swa_lens"));
  SMLA_RETURN_IF_ERROR(allocate(prefill_gather_lens, i32(R), "prefill_gather_lens"));
  SMLA_RETURN_IF_ERROR(allocate(c4_slot_mapping, i64(T), "c4_slot_mapping"));
  SMLA_RETURN_IF_ERROR(allocate(c128_slot_mapping, i64(T), "c128_slot_mapping"));
  SMLA_RETURN_IF_ERROR(allocate(c128a_decode_indices, i32(T * c128_width), "c128a_decode_indices"));
  SMLA_RETURN_IF_ERROR(allocate(c128a_decode_lens, i32(T), "c128a_decode_lens"));
  SMLA_RETURN_IF_ERROR(allocate(c128a_prefill_indices, i32(T * c128_width), "c128a_prefill_indices"));
  SMLA_RETURN_IF_ERROR(allocate(counts, i64(32), "step counts"));
  SMLA_RETURN_IF_ERROR(allocate(c4_state_slots, i64(T), "c4 state slots"));
  SMLA_RETURN_IF_ERROR(allocate(c128_state_slots, i64(T), "c128 state slots"));

  // Activations.
  // [kv | score] rows of the widest compressor (the ratio-4 one overlaps windows).
  std::int64_t score_width = 0;
  for (const auto& layer : layers) {
    if (layer.type != LayerType::kSwaOnly) {
      score_width = std::max<std::int64_t>(score_width, compressor_state_width(static_cast<int>(layer.type), kHeadDim));
    }
  }
  SMLA_RETURN_IF_ERROR(allocate(x, static_cast<std::size_t>(T * config.hidden) * 4, "x"));
  SMLA_RETURN_IF_ERROR(allocate(x_bf16, static_cast<std::size_t>(T * config.hidden) * 2, "x bf16"));
  SMLA_RETURN_IF_ERROR(allocate(layer_out, static_cast<std::size_t>(T * config.hidden) * 4, "layer output"));
  SMLA_RETURN_IF_ERROR(allocate(qr, static_cast<std::size_t>(T * config.q_lora_rank) * 4, "qr"));
  SMLA_RETURN_IF_ERROR(allocate(qr_bf16, static_cast<std::size_t>(T * config.q_lora_rank) * 2, "qr bf16"));
  SMLA_RETURN_IF_ERROR(allocate(kv, static_cast<std::size_t>(T * kHeadDim) * 4, "kv"));
  SMLA_RETURN_IF_ERROR(allocate(q, static_cast<std::size_t>(T * H * kHeadDim) * 4, "q"));
  SMLA_RETURN_IF_ERROR(allocate(q_bf16, static_cast<std::size_t>(T * H * kHeadDim) * 2, "q bf16"));
  SMLA_RETURN_IF_ERROR(allocate(kv_score, static_cast<std::size_t>(T * score_width) * 4, "kv_score"));
  SMLA_RETURN_IF_ERROR(allocate(index_q, static_cast<std::size_t>(T * Hi * 128) * 4, "index q"));
  SMLA_RETURN_IF_ERROR(allocate(index_w, static_cast<std::size_t>(T * Hi) * 4, "index weights"));
  SMLA_RETURN_IF_ERROR(allocate(index_kv_score, static_cast<std::size_t>(T * compressor_state_width(4, 128)) * 4,
                                "index kv_score"));
  SMLA_RETURN_IF_ERROR(allocate(q8, static_cast<std::size_t>(T * Hi * 128), "index q fp8"));
  SMLA_RETURN_IF_ERROR(allocate(head_weights, static_cast<std::size_t>(T * Hi) * 4, "index head weights"));
  SMLA_RETURN_IF_ERROR(allocate(local_topk, i32(T * config.index_topk), "local top-k"));
  SMLA_RETURN_IF_ERROR(allocate(extra_indices, i32(T * std::max<std::int64_t>(max_extra, 1)), "extra indices"));
  SMLA_RETURN_IF_ERROR(allocate(extra_lens, i32(T), "extra lens"));
  SMLA_RETURN_IF_ERROR(allocate(o, static_cast<std::size_t>(T * H * kHeadDim) * 2, "attention output"));
  SMLA_RETURN_IF_ERROR(allocate(gemm_workspace, cuda::kCublasLtWorkspaceBytes, "cuBLASLt workspace"));

  // Verification staging.
  const std::int64_t n = options.verify_rows;
  verify_stage.resize(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    VerifyStage& v = verify_stage[l];
    SMLA_RETURN_IF_ERROR(allocate(v.q, static_cast<std::size_t>(n * H * kHeadDim) * 2, "verify q"));
    SMLA_RETURN_IF_ERROR(allocate(v.o, static_cast<std::size_t>(n * H * kHeadDim) * 2, "verify o"));
    SMLA_RETURN_IF_ERROR(allocate(v.swa_indices, i32(n * W), "verify swa indices"));
    SMLA_RETURN_IF_ERROR(allocate(v.swa_lens, i32(n), "verify swa lens"));
    SMLA_RETURN_IF_ERROR(allocate(v.extra_indices, i32(n * std::max<std::int64_t>(layers[l].extra_width, 1)),
                                  "verify extra indices"));
    SMLA_RETURN_IF_ERROR(allocate(v.extra_lens, i32(n), "verify extra lens"));
  }

  events.resize(2 + 5 * layers.size(), nullptr);
  for (cudaEvent_t& e : events) SMLA_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e), "cudaEventCreate"));
  SMLA_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&replay_start), "cudaEventCreate"));
  return cuda_status(cudaEventCreate(&replay_end), "cudaEventCreate");
}

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

const ModelConfig& CudaModel::config() const { return impl_->config; }
const CudaStepTiming& CudaModel::last_timing() const { return impl_->timing; }
int CudaModel::decode_graph_requests() const { return impl_->graph_requests; }

Expected<std::unique_ptr<CudaModel>> CudaModel::create(const ModelConfig& config, const ModelOptions& options) {
  auto fail = [](const Status& s) { return s.with_context("CudaModel::create: "); };
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    (void)cudaGetLastError();
    return fail(unimplemented("no CUDA device is present (the cuda backend needs an NVIDIA GPU)"));
  }
  auto step_config = model_detail::model_step_config(config, options);
  if (!step_config) return fail(step_config.status());
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.config = config;
  m.options = options;
  m.format = kv_format_info(options.kv_format);
  int device_index = 0;
  SMLA_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device_index), "cudaGetDevice"));
  m.device = Device{DeviceKind::kCuda, device_index};
  m.step_config = *step_config;
  auto swa_rope = RopeTable::create(RopeConfig::swa_only(), options.max_model_len);
  if (!swa_rope) return fail(swa_rope.status());
  auto compressed_rope = RopeTable::create(RopeConfig::compressed(), options.max_model_len);
  if (!compressed_rope) return fail(compressed_rope.status());
  m.swa_rope = std::move(*swa_rope);
  m.compressed_rope = std::move(*compressed_rope);

  const std::int64_t reqs = options.max_requests;
  m.swa_pool = cuda_model::PagePool(reqs * cdiv(options.max_model_len, kSwaPage));
  m.c4_pool = cuda_model::PagePool(reqs * cdiv(options.max_model_len, kLogicalBlock));
  m.c128_pool = cuda_model::PagePool(reqs * cdiv(options.max_model_len, kLogicalBlock));
  m.c4_ring_blocks = cdiv(options.max_batched_tokens + 8, compressor_state_block_size(4)) + 1;
  m.c128_ring_blocks = cdiv(options.max_batched_tokens + 128, compressor_state_block_size(128)) + 1;
  m.c4_state_pool = cuda_model::PagePool(reqs * m.c4_ring_blocks);
  m.c128_state_pool = cuda_model::PagePool(reqs * m.c128_ring_blocks);
  m.swa_cols = cdiv(options.max_model_len, kSwaPage);
  m.c_cols = cdiv(options.max_model_len, kLogicalBlock);
  m.c4_state_cols = cdiv(options.max_model_len, compressor_state_block_size(4));
  m.c128_state_cols = cdiv(options.max_model_len, compressor_state_block_size(128));
  m.c128_width = c128a_width(m.step_config);
  m.requests.resize(static_cast<std::size_t>(reqs));

  for (int l = 0; l < static_cast<int>(config.compress_ratios.size()); ++l) {
    auto type = layer_type_for_ratio(config.compress_ratios[static_cast<std::size_t>(l)]);
    if (!type) return fail(type.status().with_context(fmt::format("compress_ratios[{}]: ", l)));
    m.layers.emplace_back();
    m.layers.back().type = *type;
  }
  if (Status s = cuda_status(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      !s.ok()) {
    return fail(s);
  }
  auto context = Context::create(Backend::kCuda);
  if (!context) return fail(context.status());
  m.context = *context;
  m.context->set_stream(m.stream);
  if (Status s = m.allocate_all(); !s.ok()) return fail(s);
  for (int l = 0; l < static_cast<int>(m.layers.size()); ++l) {
    if (Status s = m.upload_weights(l); !s.ok()) return fail(s.with_context(fmt::format("layer {}: ", l)));
  }
  if (Status s = m.size_workspaces(); !s.ok()) return fail(s);
  // Zero-fills and uploads ran on the legacy stream, which the model's
  // non-blocking stream does not wait for.
  if (Status s = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); !s.ok()) return fail(s);
  if (Status s = m.warm_up(); !s.ok()) return fail(s);
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

Expected<int> CudaModel::add_request() {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < m.requests.size(); ++i) {
    cuda_model::RequestState& r = m.requests[i];
    if (r.live) continue;
    r = cuda_model::RequestState{};
    SMLA_RETURN_IF_ERROR(m.c4_state_pool.reserve(r.c4_state_ring, m.c4_ring_blocks, "c4 state"));
    SMLA_RETURN_IF_ERROR(m.c128_state_pool.reserve(r.c128_state_ring, m.c128_ring_blocks, "c128 state"));
    r.live = true;
    return static_cast<int>(i);
  }
  return out_of_range("add_request", fmt::format("at most {} live requests", m.requests.size()), "all in use");
}

Status CudaModel::finish_request(int request) {
  Impl& m = *impl_;
  if (request < 0 || request >= static_cast<int>(m.requests.size()) ||
      !m.requests[static_cast<std::size_t>(request)].live) {
    return invalid_argument("request", "a live request id", std::to_string(request));
  }
  cuda_model::RequestState& r = m.requests[static_cast<std::size_t>(request)];
  m.swa_pool.release(r.swa_pages);
  m.c4_pool.release(r.c4_pages);
  m.c128_pool.release(r.c128_pages);
  m.c4_state_pool.release(r.c4_state_ring);
  m.c128_state_pool.release(r.c128_state_ring);
  r.live = false;
  return Status::Ok();
}

std::int64_t CudaModel::seq_len(int request) const {
  if (request < 0 || request >= static_cast<int>(impl_->requests.size())) return -1;
  const cuda_model::RequestState& r = impl_->requests[static_cast<std::size_t>(request)];
  return r.live ? r.seq_len : -1;
}

std::int64_t CudaModel::kv_cache_bytes_used() const {
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

std::int64_t CudaModel::kv_cache_bytes_reserved() const {
  std::int64_t bytes = 0;
  for (const auto& layer : impl_->layers) {
    bytes += static_cast<std::int64_t>(layer.swa.mem.bytes + layer.compressed.mem.bytes + layer.index_keys.mem.bytes);
  }
  return bytes;
}

std::vector<std::uint8_t> CudaModel::layer_cache_bytes(int layer) const {
  std::vector<std::uint8_t> all;
  const Impl& m = *impl_;
  if (layer < 0 || layer >= static_cast<int>(m.layers.size())) return all;
  if (cudaStreamSynchronize(m.stream) != cudaSuccess) return all;
  const cuda_model::DeviceLayer& l = m.layers[static_cast<std::size_t>(layer)];
  for (const DeviceMem* mem : {&l.swa.mem, &l.compressed.mem, &l.index_keys.mem, &l.state, &l.index_state}) {
    if (mem->ptr == nullptr || mem->bytes == 0) continue;
    const std::size_t offset = all.size();
    all.resize(offset + mem->bytes);
    if (cudaMemcpy(all.data() + offset, mem->get(), mem->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return {};
  }
  return all;
}

// ---------------------------------------------------------------------------
// Steps

Status CudaModel::Impl::validate_batch(const std::vector<StepEntry>& batch, const TensorView& x_host,
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
  for (const auto& [view, name] : {std::pair{&x_host, "x"}, std::pair{&out_host, "out"}}) {
    if (!view->present() || view->dtype != DType::kF32 || view->rank != 2 || view->shape[0] != T ||
        view->shape[1] != config.hidden || !view->is_contiguous() || view->data == nullptr ||
        view->device.kind != DeviceKind::kCpu) {
      return invalid_argument(name, fmt::format("contiguous host f32 [{}, {}]", T, config.hidden),
                              view->present() ? view->describe() : "absent");
    }
  }
  *tokens = T;
  return Status::Ok();
}

BatchDescription CudaModel::Impl::host_batch(std::int64_t R) const {
  auto host = [](const std::vector<std::int32_t>& v, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(const_cast<std::int32_t*>(v.data()), DType::kI32, shape);
  };
  BatchDescription desc;
  desc.query_lens = host(h_query_lens, {R});
  desc.seq_lens = host(h_seq_lens, {R});
  desc.swa_block_table = host(h_swa_table, {R, swa_cols});
  desc.c4_block_table = host(h_c4_table, {R, c_cols});
  desc.c128_block_table = host(h_c128_table, {R, c_cols});
  return desc;
}

BatchDescription CudaModel::Impl::device_batch(std::int64_t R, std::int64_t T) const {
  BatchDescription desc;
  desc.query_lens = dev(query_lens, DType::kI32, {R});
  desc.seq_lens = dev(seq_lens, DType::kI32, {R});
  desc.num_tokens = T;
  desc.swa_block_table = dev(swa_table, DType::kI32, {R, swa_cols});
  desc.c4_block_table = dev(c4_table, DType::kI32, {R, c_cols});
  desc.c128_block_table = dev(c128_table, DType::kI32, {R, c_cols});
  return desc;
}

Status CudaModel::Impl::stage_batch(const std::vector<StepEntry>& batch) {
  const auto R = static_cast<std::int64_t>(batch.size());
  for (std::int64_t i = 0; i < R; ++i) {
    const StepEntry& e = batch[static_cast<std::size_t>(i)];
    cuda_model::RequestState& r = requests[static_cast<std::size_t>(e.request)];
    const std::int64_t new_len = r.seq_len + e.query_len;
    SMLA_RETURN_IF_ERROR(swa_pool.reserve(r.swa_pages, cdiv(new_len, kSwaPage), "swa"));
    SMLA_RETURN_IF_ERROR(c4_pool.reserve(r.c4_pages, cdiv(new_len, kLogicalBlock), "c4"));
    SMLA_RETURN_IF_ERROR(c128_pool.reserve(r.c128_pages, cdiv(new_len, kLogicalBlock), "c128"));
    h_query_lens[static_cast<std::size_t>(i)] = e.query_len;
    h_seq_lens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(new_len);
    auto fill = [i](std::vector<std::int32_t>& table, std::int64_t cols, const std::vector<std::int32_t>& pages) {
      auto row = table.begin() + i * cols;
      std::fill(row, row + cols, 0);
      std::copy(pages.begin(), pages.end(), row);
    };
    fill(h_swa_table, swa_cols, r.swa_pages);
    fill(h_c4_table, c_cols, r.c4_pages);
    fill(h_c128_table, c_cols, r.c128_pages);
    // State rings: column c (positions c*bs ..) lives in ring block c % ring size.
    for (std::int64_t c = 0; c < c4_state_cols; ++c) {
      h_c4_state_table[static_cast<std::size_t>(i * c4_state_cols + c)] =
          r.c4_state_ring[static_cast<std::size_t>(c % c4_ring_blocks)];
    }
    for (std::int64_t c = 0; c < c128_state_cols; ++c) {
      h_c128_state_table[static_cast<std::size_t>(i * c128_state_cols + c)] =
          r.c128_state_ring[static_cast<std::size_t>(c % c128_ring_blocks)];
    }
  }
  auto put = [&](const DeviceMem& dst, const std::vector<std::int32_t>& src, std::int64_t count) {
    return cuda_status(cudaMemcpyAsync(dst.get(), src.data(), static_cast<std::size_t>(count) * 4,
                                       cudaMemcpyHostToDevice, stream),
                       "batch upload");
  };
  SMLA_RETURN_IF_ERROR(put(query_lens, h_query_lens, R));
  SMLA_RETURN_IF_ERROR(put(seq_lens, h_seq_lens, R));
  SMLA_RETURN_IF_ERROR(put(swa_table, h_swa_table, R * swa_cols));
  SMLA_RETURN_IF_ERROR(put(c4_table, h_c4_table, R * c_cols));
  SMLA_RETURN_IF_ERROR(put(c128_table, h_c128_table, R * c_cols));
  SMLA_RETURN_IF_ERROR(put(c4_state_table, h_c4_state_table, R * c4_state_cols));
  return put(c128_state_table, h_c128_state_table, R * c128_state_cols);
}

Status CudaModel::step(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out, bool verify,
                       StepStats* stats) {
  auto fail = [](const Status& s) { return s.with_context("CudaModel::step: "); };
  Impl& m = *impl_;
  std::int64_t T = 0;
  if (Status s = m.validate_batch(batch, x, out, &T); !s.ok()) return fail(s);
  if (stats == nullptr) return fail(invalid_argument("stats", "a StepStats", "nullptr"));
  if (Status s = m.stage_batch(batch); !s.ok()) return fail(s);
  const auto R = static_cast<std::int64_t>(batch.size());
  auto counts = describe_step(m.host_batch(R), m.step_config);
  if (!counts) return fail(counts.status());

  cuda_model::StepShape shape;
  shape.requests = R;
  shape.tokens = T;
  shape.decode_tokens = counts->num_decode_tokens;
  shape.prefill_tokens = counts->num_prefill_tokens;
  shape.timed = true;
  if (verify) shape.verify_rows = model_detail::sample_rows(T, m.options.verify_rows);
  const std::size_t x_bytes = static_cast<std::size_t>(T * m.config.hidden) * 4;
  if (Status s = cuda_status(cudaMemcpyAsync(m.x.get(), x.data, x_bytes, cudaMemcpyHostToDevice, m.stream), "x upload");
      !s.ok()) {
    return fail(s);
  }
  if (Status s = m.enqueue_step(shape); !s.ok()) {
    (void)cudaStreamSynchronize(m.stream);
    return fail(s);
  }
  if (Status s = cuda_status(cudaMemcpyAsync(out.data, m.x.get(), x_bytes, cudaMemcpyDeviceToHost, m.stream),
                             "out download");
      !s.ok()) {
    return fail(s);
  }
  if (Status s = cuda_status(cudaStreamSynchronize(m.stream), "step"); !s.ok()) return fail(s);
  if (Status s = m.check_metadata_errors(); !s.ok()) return fail(s);
  m.collect_phase_times(*stats);
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, m.events.front(), m.events.back()) == cudaSuccess) m.timing.step_s = ms * 1e-3;
  if (verify) {
    if (Status s = m.verify_step(shape, *stats); !s.ok()) return fail(s);
  }
  for (const StepEntry& e : batch) m.requests[static_cast<std::size_t>(e.request)].seq_len += e.query_len;
  return Status::Ok();
}

// The host validated the batch; a set error bit means the device builder saw
// other values than the host did (a bug), so the step's output is not trusted.
Status CudaModel::Impl::check_metadata_errors() const {
  std::int64_t error_word = 0;
  SMLA_RETURN_IF_ERROR(cuda_status(cudaMemcpy(&error_word, counts.get<std::int64_t>() + kStepErrorWord,
                                              sizeof(error_word), cudaMemcpyDeviceToHost),
                                   "metadata error word download"));
  if (error_word != 0) {
    return internal_error(fmt::format("CudaModel: the device step metadata reports error bits {:#x} for a batch the "
                                      "host accepted",
                                      error_word));
  }
  return Status::Ok();
}

void CudaModel::Impl::collect_phase_times(StepStats& stats) const {
  auto elapsed = [&](std::size_t i) {
    float ms = 0.0f;
    return cudaEventElapsedTime(&ms, events[i], events[i + 1]) == cudaSuccess ? ms * 1e-3 : 0.0;
  };
  stats.indexer_s += elapsed(0);  // step metadata and index transforms count with the indexer
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::size_t base = 1 + 5 * l;
    stats.projection_s += elapsed(base);
    stats.cache_write_s += elapsed(base + 1);
    stats.indexer_s += elapsed(base + 2);
    stats.attention_s += elapsed(base + 3);
    stats.output_s += elapsed(base + 4);
  }
}

Status CudaModel::Impl::record(std::size_t event_index, const cuda_model::StepShape& shape) {
  if (!shape.timed) return Status::Ok();
  return cuda_status(cudaEventRecord(events[event_index], stream), "cudaEventRecord");
}

Status CudaModel::Impl::enqueue_step(const cuda_model::StepShape& shape) {
  SMLA_RETURN_IF_ERROR(record(0, shape));
  SMLA_RETURN_IF_ERROR(enqueue_metadata(shape).with_context("step metadata: "));
  SMLA_RETURN_IF_ERROR(record(1, shape));
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    Status s = enqueue_layer(l, shape);
    if (!s.ok()) {
      return s.with_context(fmt::format("layer {} ({}): ", l, layer_type_name(layers[static_cast<std::size_t>(l)].type)));
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Whole-step decode graph

Status CudaModel::capture_decode_graph(int batch_requests) {
  auto fail = [](const Status& s) { return s.with_context("CudaModel::capture_decode_graph: "); };
  Impl& m = *impl_;
  const std::int64_t width = 1 + m.options.num_speculative_tokens;
  if (batch_requests < 1 || batch_requests > m.options.max_requests ||
      batch_requests * width > m.options.max_batched_tokens) {
    return fail(out_of_range("batch_requests",
                             fmt::format("1 .. {} requests of {} tokens within {} batched tokens",
                                         m.options.max_requests, width, m.options.max_batched_tokens),
                             std::to_string(batch_requests)));
  }
  if (m.graph_exec != nullptr) cudaGraphExecDestroy(m.graph_exec);
  if (m.graph != nullptr) cudaGraphDestroy(m.graph);
  m.graph_exec = nullptr;
  m.graph = nullptr;
  m.graph_requests = 0;
  if (Status s = cuda_status(cudaStreamSynchronize(m.stream), "synchronize before capture"); !s.ok()) return fail(s);

  cuda_model::StepShape shape;
  shape.requests = batch_requests;
  shape.tokens = batch_requests * width;
  shape.decode_tokens = shape.tokens;
  shape.timed = false;
  if (Status s = cuda_status(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      !s.ok()) {
    return fail(s);
  }
  Status enqueued = m.enqueue_step(shape);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(m.stream, &graph);
  if (!enqueued.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return fail(enqueued.ok() ? cuda_status(end, "cudaStreamEndCapture") : enqueued);
  }
  cudaGraphExec_t exec = nullptr;
  if (Status s = cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"); !s.ok()) {
    cudaGraphDestroy(graph);
    return fail(s);
  }
  m.graph = graph;
  m.graph_exec = exec;
  m.graph_requests = batch_requests;
  return Status::Ok();
}

Status CudaModel::replay_decode_graph(const std::vector<StepEntry>& batch, const TensorView& x, const TensorView& out) {
  auto fail = [](const Status& s) { return s.with_context("CudaModel::replay_decode_graph: "); };
  Impl& m = *impl_;
  if (m.graph_exec == nullptr) {
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
  std::int64_t T = 0;
  if (Status s = m.validate_batch(batch, x, out, &T); !s.ok()) return fail(s);
  if (Status s = m.stage_batch(batch); !s.ok()) return fail(s);
  if (auto counts = describe_step(m.host_batch(static_cast<std::int64_t>(batch.size())), m.step_config); !counts) {
    return fail(counts.status());
  }
  const std::size_t x_bytes = static_cast<std::size_t>(T * m.config.hidden) * 4;
  Status s = cuda_status(cudaMemcpyAsync(m.x.get(), x.data, x_bytes, cudaMemcpyHostToDevice, m.stream), "x upload");
  if (s.ok()) s = cuda_status(cudaEventRecord(m.replay_start, m.stream), "cudaEventRecord");
  if (s.ok()) s = cuda_status(cudaGraphLaunch(m.graph_exec, m.stream), "cudaGraphLaunch");
  if (s.ok()) s = cuda_status(cudaEventRecord(m.replay_end, m.stream), "cudaEventRecord");
  if (s.ok()) {
    s = cuda_status(cudaMemcpyAsync(out.data, m.x.get(), x_bytes, cudaMemcpyDeviceToHost, m.stream), "out download");
  }
  if (s.ok()) s = cuda_status(cudaStreamSynchronize(m.stream), "graph replay");
  if (s.ok()) s = m.check_metadata_errors();
  if (!s.ok()) return fail(s);
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, m.replay_start, m.replay_end) == cudaSuccess) m.timing.step_s = ms * 1e-3;
  for (const StepEntry& e : batch) m.requests[static_cast<std::size_t>(e.request)].seq_len += e.query_len;
  return Status::Ok();
}

}  // namespace smla
