// Shared test helpers. Owned by the reference-attention work; extend as needed.
#pragma once

#include <cstdint>
#include <random>

namespace smla::testing {

// A fresh seed per run (printed by the caller on failure) unless SMLA_TEST_SEED is set.
std::uint64_t test_seed();

}  // namespace smla::testing
