#include "tests/common/test_common.h"

#include <cstdlib>

namespace smla::testing {

std::uint64_t test_seed() {
  if (const char* env = std::getenv("SMLA_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

}  // namespace smla::testing
