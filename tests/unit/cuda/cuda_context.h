// A cuda Context for the CUDA op tests (smla/context.h): the given stream and,
// when given, a caller workspace. Without a usable device a cuda context does
// not exist; tests that call this skip first (SKIP_WITHOUT_CUDA_CONTEXT), and the
// fallback below (a cpu context) is never used to run a cuda case.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>

#include "smla/context.h"

namespace smla {

inline bool cudatest_context_available() { return Context::create(Backend::kCuda).ok(); }

inline Context cudatest_context(void* stream = nullptr, void* workspace = nullptr, std::size_t workspace_bytes = 0) {
  auto context = Context::create(Backend::kCuda);
  if (!context) {
    ADD_FAILURE() << "no cuda context: " << context.status().to_string();
    context = Context::create(Backend::kCpu);
  }
  Context result = *context;
  result.set_stream(stream);
  result.set_workspace(workspace, workspace_bytes);
  return result;
}

}  // namespace smla

#define SKIP_WITHOUT_CUDA_CONTEXT()                                                              \
  do {                                                                                          \
    if (!::smla::cudatest_context_available()) GTEST_SKIP() << "no CUDA device (cuda context)"; \
  } while (0)
