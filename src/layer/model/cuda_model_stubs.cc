// Entry points of smla/cuda_model.h for builds without the CUDA backend: the
// model cannot be created, so no other member is ever reached.
#include "smla/cuda_model.h"

namespace smla {

struct CudaModel::Impl {
  ModelConfig config;
  CudaStepTiming timing;
};

namespace {
Status not_built() {
  return unimplemented("CudaModel: the CUDA backend was not built (configure with nvcc and SMLA_ENABLE_CUDA=ON)");
}
}  // namespace

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

Expected<std::unique_ptr<CudaModel>> CudaModel::create(const ModelConfig&, const ModelOptions&) {
  return not_built();
}
const ModelConfig& CudaModel::config() const { return impl_->config; }
Expected<int> CudaModel::add_request() { return not_built(); }
Status CudaModel::finish_request(int) { return not_built(); }
std::int64_t CudaModel::seq_len(int) const { return -1; }
Status CudaModel::step(const std::vector<StepEntry>&, const TensorView&, const TensorView&, bool, StepStats*) {
  return not_built();
}
Status CudaModel::capture_decode_graph(int) { return not_built(); }
int CudaModel::decode_graph_requests() const { return 0; }
Status CudaModel::replay_decode_graph(const std::vector<StepEntry>&, const TensorView&, const TensorView&) {
  return not_built();
}
const CudaStepTiming& CudaModel::last_timing() const { return impl_->timing; }
std::int64_t CudaModel::kv_cache_bytes_used() const { return 0; }
std::int64_t CudaModel::kv_cache_bytes_reserved() const { return 0; }
std::vector<std::uint8_t> CudaModel::layer_cache_bytes(int) const { return {}; }

}  // namespace smla
