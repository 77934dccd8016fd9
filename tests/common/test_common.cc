#include "tests/common/test_common.h"

#include <cstdlib>

namespace smla::testing {

std::uint64_t test_seed() {
  if (const char* env = std::getenv("SMLA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

::testing::AssertionResult IsOk(const Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status.to_string();
}

::testing::AssertionResult FailsWith(const Status& status, StatusCode code, const std::vector<std::string>& needles) {
  if (status.ok()) return ::testing::AssertionFailure() << "expected " << status_code_name(code) << ", got OK";
  if (status.code() != code) {
    return ::testing::AssertionFailure() << "expected " << status_code_name(code) << ", got " << status.to_string();
  }
  for (const std::string& needle : needles) {
    if (status.message().find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << status.to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult WithinTolerance(const testkit::ErrorStats& stats, const std::string& what) {
  if (stats.passed()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << stats.to_string();
}

}  // namespace smla::testing
