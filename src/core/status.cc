#include "smla/status.h"

#include <fmt/format.h>

namespace smla {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}{}", context, message_));
}

Status invalid_argument(std::string_view argument, std::string_view expected, std::string_view actual) {
  return Status(StatusCode::kInvalidArgument, fmt::format("{}: expected {}, got {}", argument, expected, actual));
}

Status out_of_range(std::string_view argument, std::string_view expected, std::string_view actual) {
  return Status(StatusCode::kOutOfRange, fmt::format("{}: expected {}, got {}", argument, expected, actual));
}

Status unimplemented(std::string_view what) { return Status(StatusCode::kUnimplemented, std::string(what)); }

Status internal_error(std::string_view what) { return Status(StatusCode::kInternal, std::string(what)); }

}  // namespace smla
