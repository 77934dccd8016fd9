// A cuda Context for the CUDA op tests (smla/context.h): the given stream and,
// when given, a caller workspace. Without a usable device it is a validating
// context of a nominal H100 (Context::create_validating): the argument-error
// tests run everywhere, and a call that passes every check returns
// Unimplemented instead of running.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <iostream>

#include "smla/context.h"
#include "tests/common/test_common.h"

namespace smla {

inline Context cudatest_context(void* stream = nullptr, void* workspace = nullptr, std::size_t workspace_bytes = 0) {
  auto context = Context::create(Backend::kCuda);
  if (!context) {
    static const bool noted = [] {
      std::cout << "[ note ] no CUDA device: the cuda argument tests run in a validating context\n";
      return true;
    }();
    (void)noted;
    context = Context::create_validating(Backend::kCuda, testing::nominal_h100());
  }
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
