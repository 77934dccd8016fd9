// Shared GoogleTest-side helpers (the framework-free parts live in testkit/).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "smla/context.h"
#include "smla/status.h"
#include "testkit/compare.h"

namespace smla::testing {

// The properties of an H100 SXM: the nominal device of validating contexts
// (Context::create_validating) in tests that run without a GPU.
inline DeviceProperties nominal_h100() {
  DeviceProperties device;
  device.ordinal = 0;
  device.compute_capability = 90;
  device.multiprocessors = 132;
  device.shared_memory_per_block = 232448;
  device.name = "NVIDIA H100 80GB HBM3 (nominal, validating)";
  return device;
}

// A fresh seed per run (printed by the caller on failure) unless SMLA_TEST_SEED is set.
std::uint64_t test_seed();

// Passes when the status is OK; otherwise reports its message.
::testing::AssertionResult IsOk(const Status& status);
// Passes when the status failed with `code` and its message contains every `needle`.
::testing::AssertionResult FailsWith(const Status& status, StatusCode code, const std::vector<std::string>& needles);
// Passes when stats.passed(); otherwise reports stats.to_string() and `what`.
::testing::AssertionResult WithinTolerance(const testkit::ErrorStats& stats, const std::string& what);

}  // namespace smla::testing

// Prints the seed with any failure in scope, and how to replay it.
#define SMLA_SEED_TRACE(seed) \
  SCOPED_TRACE(::testing::Message() << "seed " << (seed) << " (rerun with SMLA_TEST_SEED=" << (seed) << ")")
