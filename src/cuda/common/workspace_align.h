// Internal: how the CUDA ops carve a caller's workspace. Every buffer starts on
// 256 bytes: what cudaMalloc returns and what a plan's workspace_bytes() promises
// to need (docs/cuda_backend.md), so each carved piece keeps the alignment of the base.
#pragma once

#include <cstddef>

namespace smla::cuda {

inline constexpr std::size_t kWorkspaceAlign = 256;

// `bytes` rounded up to the next buffer start.
constexpr std::size_t align_workspace(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace smla::cuda
