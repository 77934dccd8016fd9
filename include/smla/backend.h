// Backends: the same operations with the same contracts, on different hardware.
#pragma once

#include <string_view>
#include <vector>

#include "smla/status.h"

namespace smla {

enum class Backend {
  kAuto,       // the fastest available: cuda when a device is present, else cpu
  kReference,  // float64 accumulation, plain loops: the oracle and a slow fallback
  kCpu,        // multithreaded SIMD
  kCuda,       // NVIDIA GPUs, sm80 and newer
};

std::string_view backend_name(Backend backend);
Expected<Backend> parse_backend(std::string_view name);  // "auto", "reference", "cpu", "cuda"
// Compiled in and, for cuda, a device present.
bool backend_available(Backend backend);
std::vector<Backend> available_backends();
// kAuto resolved to a concrete available backend.
Backend resolve_backend(Backend backend);

}  // namespace smla
