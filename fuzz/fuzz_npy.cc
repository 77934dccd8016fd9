// .npy reader: parse_npy on the input as a whole file, read_npy on the same
// bytes through a file (they must agree), and a write/parse round trip.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <span>
#include <string>

#include "fuzz/fuzz_util.h"
#include "tools/smla/npy.h"

namespace {

int memory_file() {
  static const int fd = ::memfd_create("smla_fuzz_npy", 0);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto parsed = smla::cli::parse_npy(bytes, "input.npy");
  if (parsed) {
    const auto item = static_cast<std::int64_t>(smla::cli::npy_dtype_size(parsed->dtype));
    SMLA_FUZZ_CHECK(parsed->numel() * item == static_cast<std::int64_t>(parsed->data.size()));
    SMLA_FUZZ_CHECK(parsed->shape.size() <= static_cast<std::size_t>(smla::kMaxRank));
    const std::vector<std::byte> again = smla::cli::serialize_npy(*parsed);
    auto reparsed = smla::cli::parse_npy(again, "round-trip.npy");
    SMLA_FUZZ_CHECK(reparsed.ok());
    SMLA_FUZZ_CHECK(reparsed->dtype == parsed->dtype && reparsed->shape == parsed->shape &&
                    reparsed->data == parsed->data);
  }
  // The file reader reads the header first, then the data: same verdict, same array.
  const int fd = memory_file();
  if (fd >= 0 && ::ftruncate(fd, 0) == 0 && ::pwrite(fd, data, size, 0) == static_cast<::ssize_t>(size)) {
    auto read = smla::cli::read_npy("/proc/self/fd/" + std::to_string(fd));
    SMLA_FUZZ_CHECK(read.ok() == parsed.ok());
    if (read.ok()) SMLA_FUZZ_CHECK(read->shape == parsed->shape && read->data == parsed->data);
  }
  return 0;
}
