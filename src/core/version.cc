#include "smla/version.h"

namespace smla {

std::string_view version() { return SMLA_VERSION; }

}  // namespace smla
