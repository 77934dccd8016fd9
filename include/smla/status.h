// Error reporting for every public smla entry point.
//
// No smla function throws, aborts or exits on bad input: it returns a Status
// (or an Expected<T>) whose message names the argument, what was expected and
// what was found, e.g. "q: expected dtype bf16, got f32".
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace smla {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // shape, dtype, stride or value the caller can fix
  kOutOfRange = 2,       // an index or size beyond what a tensor holds
  kUnimplemented = 3,    // valid request this backend or build does not serve
  kInternal = 4,         // a bug or a failure below us (CUDA error, allocation)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: q: expected dtype bf16, got f32"
  std::string to_string() const;

  // Prepends context ("decode: ") to the message of a failed status.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// "<argument>: expected <expected>, got <actual>"
Status invalid_argument(std::string_view argument, std::string_view expected, std::string_view actual);
Status out_of_range(std::string_view argument, std::string_view expected, std::string_view actual);
Status unimplemented(std::string_view what);
Status internal_error(std::string_view what);

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Expected(Status status) : state_(std::move(status)) {
    if (std::get<Status>(state_).ok()) {
      state_ = Status(StatusCode::kInternal, "Expected constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(state_);
  }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace smla

// Returns early from a function returning Status (or Expected) when expr fails.
#define SMLA_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::smla::Status smla_status_ = (expr);       \
    if (!smla_status_.ok()) return smla_status_; \
  } while (0)

// Declares-and-assigns from an Expected, or returns its Status early:
//   SMLA_ASSIGN_OR_RETURN(args.q, load.required("q", ...));
#define SMLA_ASSIGN_OR_RETURN(lhs, expr) SMLA_ASSIGN_OR_RETURN_IMPL_(SMLA_CONCAT_(smla_expected_, __LINE__), lhs, expr)
#define SMLA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp) return tmp.status();                    \
  lhs = std::move(*tmp)
#define SMLA_CONCAT_(a, b) SMLA_CONCAT_INNER_(a, b)
#define SMLA_CONCAT_INNER_(a, b) a##b
