// The library's version, as built.
#pragma once

#include <string_view>

namespace smla {

std::string_view version();  // "0.1.0"

}  // namespace smla
