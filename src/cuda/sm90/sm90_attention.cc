#include "src/cuda/sm90/sm90_attention.h"

#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace smla::cuda {

bool sm90_attention_usable() {
#if defined(SMLA_CUDA_SM90A)
  const char* choice = std::getenv("SMLA_CUDA_ATTENTION");
  if (choice != nullptr && std::string_view(choice) == "portable") return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  static std::mutex mutex;
  static std::array<int, 64> is_sm90{};  // 0 unknown, 1 yes, 2 no
  std::lock_guard<std::mutex> lock(mutex);
  int& known = is_sm90[static_cast<std::size_t>(device)];
  if (known == 0) {
    int major = 0;
    int minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
    known = ok && major == 9 && minor == 0 ? 1 : 2;
  }
  return known == 1;
#else
  return false;  // this build has no sm_90a code
#endif
}

AttentionVariant sm90_attention_variant(LoaderKind kind) {
  switch (kind) {
    case LoaderKind::kV4Fp8: return sm90_attention_variant_v4();
    case LoaderKind::kV32Fp8: return sm90_attention_variant_v32();
    case LoaderKind::kBf16Rows512: return sm90_attention_variant_bf16_512();
    case LoaderKind::kBf16Rows576: return sm90_attention_variant_bf16_576();
    case LoaderKind::kFp8Rows: break;
  }
  return sm90_attention_variant_fp8_rows();
}

}  // namespace smla::cuda
