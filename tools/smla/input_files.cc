#include "tools/smla/input_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

namespace smla::cli {

namespace fs = std::filesystem;

std::int64_t host_allocation_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return kMaxHostAllocationBytes;
  const long double half = static_cast<long double>(pages) * static_cast<long double>(page_size) / 2;
  return half < static_cast<long double>(kMaxHostAllocationBytes) ? static_cast<std::int64_t>(half)
                                                                  : kMaxHostAllocationBytes;
}

std::string format_bytes(long double bytes) {
  if (!(bytes < 1e30L)) return "more than 10^30 bytes";
  const char* unit = "bytes";
  long double scaled = bytes;
  for (const char* next : {"KB", "MB", "GB", "TB", "PB", "EB"}) {
    if (scaled < 1000) break;
    scaled /= 1000;
    unit = next;
  }
  const auto exact = fmt::format("{:.0f} bytes", static_cast<double>(bytes));
  if (bytes < 1000) return exact;
  return fmt::format("{:.2f} {} ({})", static_cast<double>(scaled), unit, exact);
}

Status check_allocation(std::string_view argument, std::string_view what, long double bytes) {
  const std::int64_t limit = host_allocation_limit();
  if (bytes >= 0 && bytes <= static_cast<long double>(limit)) return Status::Ok();
  return invalid_argument(argument,
                          fmt::format("{} within the host allocation limit of {}", what,
                                      format_bytes(static_cast<long double>(limit))),
                          fmt::format("{} asked for", format_bytes(bytes)));
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (byte >= 0x20 && byte < 0x7F) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

namespace {

std::string file_kind(fs::file_type type) {
  switch (type) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::symlink: return "a symbolic link";
    case fs::file_type::regular: return "a regular file";
    default: return "not a regular file";
  }
}

// Why `path` cannot be used, from the error of fs::status / open.
std::string describe_error(const std::error_code& error) {
  if (error == std::errc::no_such_file_or_directory) return "file not found";
  if (error == std::errc::too_many_symbolic_link_levels) return "a symbolic link loop";
  if (error == std::errc::permission_denied) return "permission denied";
  if (error == std::errc::not_a_directory) return "a path component is not a directory";
  return error.message();
}

Status path_error(const fs::path& path, std::string_view what, std::string_view actual) {
  return invalid_argument(printable(path.string()), what, actual);
}

}  // namespace

Expected<InputFile> InputFile::open(const fs::path& path, std::string_view what, std::uint64_t max_bytes) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) return path_error(path, what, "file not found");
  if (error) return path_error(path, what, describe_error(error));
  if (status.type() != fs::file_type::regular) return path_error(path, what, file_kind(status.type()));
  // O_NONBLOCK: a FIFO swapped in after the check must not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return path_error(path, what, describe_error(std::error_code(errno, std::generic_category())));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return path_error(path, what, "not a regular file");
  }
  const auto size = static_cast<std::uint64_t>(info.st_size);
  if (size > max_bytes) {
    ::close(fd);
    return path_error(path, fmt::format("{} of at most {}", what, format_bytes(static_cast<long double>(max_bytes))),
                      fmt::format("a file of {}", format_bytes(static_cast<long double>(size))));
  }
  return InputFile(fd, size, printable(path.string()));
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), name_(std::move(other.name_)) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    name_ = std::move(other.name_);
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status InputFile::read(std::uint64_t offset, void* out, std::size_t bytes) const {
  auto* dst = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < bytes) {
    const ::ssize_t got = ::pread(fd_, dst + done, std::min<std::size_t>(bytes - done, std::size_t{1} << 30),
                                  static_cast<::off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return invalid_argument(name_, "a readable file", describe_error(std::error_code(errno, std::generic_category())));
    }
    if (got == 0) {
      return invalid_argument(name_, fmt::format("{} bytes at offset {}", bytes, offset),
                              fmt::format("end of file after {} (the file shrank while being read)", done));
    }
    done += static_cast<std::size_t>(got);
  }
  return Status::Ok();
}

Expected<std::string> read_text_file(const fs::path& path, std::string_view what, std::uint64_t max_bytes) {
  auto file = InputFile::open(path, what, max_bytes);
  if (!file) return file.status();
  std::string text(static_cast<std::size_t>(file->size()), '\0');
  SMLA_RETURN_IF_ERROR(file->read(0, text.data(), text.size()));
  return text;
}

Status check_input_directory(const fs::path& path, std::string_view what) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) return path_error(path, what, "no such directory");
  if (error) return path_error(path, what, describe_error(error));
  if (status.type() != fs::file_type::directory) return path_error(path, what, file_kind(status.type()));
  fs::directory_iterator listing(path, error);
  if (error) return path_error(path, what, fmt::format("a directory that cannot be read ({})", describe_error(error)));
  return Status::Ok();
}

std::string line_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return fmt::format("line {}, column {}", line, offset - line_start + 1);
}

}  // namespace smla::cli
