#include "tools/smla/commands.h"

#include <fmt/core.h>

#include <exception>
#include <new>

#include "tools/smla/input_files.h"

namespace smla::cli {

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const std::size_t first = value.find_first_not_of(" \t");
        if (first != std::string::npos && value[first] == '-') return "expected an integer >= 0, got " + value;
        return {};
      },
      "UINT");
}

int run_guarded(std::string_view command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "{}: out of host memory (an allocation failed; the input asks for more than this machine has)\n",
               command);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: internal error: {}\n", command, printable(e.what()));
  } catch (...) {
    fmt::print(stderr, "{}: internal error: unknown exception\n", command);
  }
  return 2;
}

}  // namespace smla::cli
