// What the smla tool checks before it trusts its input: the kind and size of a
// file before reading it, the size of an allocation derived from input before
// making it, and the bytes of input it echoes in a message (escaped).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "smla/status.h"

namespace smla::cli {

// The most bytes one host allocation sized by input may take (documented in
// docs/reliability.md): 16 GiB, or half the physical memory when that is less.
inline constexpr std::int64_t kMaxHostAllocationBytes = std::int64_t{16} << 30;
std::int64_t host_allocation_limit();

// OK when `bytes` (a product of input sizes, computed in long double so that it
// cannot wrap) fits host_allocation_limit(); else an error naming `argument`,
// what is being allocated and the size asked for.
Status check_allocation(std::string_view argument, std::string_view what, long double bytes);

// "1.80 GB (1800000000 bytes)"
std::string format_bytes(long double bytes);

// `text` with every byte outside printable ASCII written as \xNN (and '\' as
// "\\"), so input echoed in a message cannot reach the terminal raw.
std::string printable(std::string_view text);

// An open regular file of known size, read with pread. open() checks that
// `path` names a regular file (following symlinks) of at most `max_bytes`: a
// missing file, a directory, FIFO, device, socket, symlink loop, a file that
// cannot be opened or one larger than `max_bytes` is an error naming the path
// and saying which. `what` names the expected content ("an .npy file").
class InputFile {
 public:
  static Expected<InputFile> open(const std::filesystem::path& path, std::string_view what, std::uint64_t max_bytes);
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  std::uint64_t size() const { return size_; }
  // Reads exactly `bytes` bytes at `offset`; a short read is an error.
  Status read(std::uint64_t offset, void* out, std::size_t bytes) const;

 private:
  InputFile(int fd, std::uint64_t size, std::string name) : fd_(fd), size_(size), name_(std::move(name)) {}
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string name_;
};

// Reads a whole file after check_input_file (text formats: manifest, batch).
Expected<std::string> read_text_file(const std::filesystem::path& path, std::string_view what,
                                     std::uint64_t max_bytes);

// Checks that `path` is a readable directory ("the case directory").
Status check_input_directory(const std::filesystem::path& path, std::string_view what);

// The 1-based line and column of byte `offset` in `text`: "line 3, column 7".
std::string line_column(std::string_view text, std::size_t offset);

}  // namespace smla::cli
