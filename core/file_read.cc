#include "core/file_read.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace bagpipe {

absl::Status PreadExactly(int fd, int64_t offset, void* out, size_t bytes, std::string_view path,
                          std::string_view section, std::string_view prefix) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, bytes, offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrFormat("%scannot read '%s' at byte %d (%s): %s", prefix,
                                                 path, offset, section, std::strerror(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrFormat(
          "%s'%s' ends at byte %d inside the %s: the file was truncated or shrank while it was "
          "being read",
          prefix, path, offset, section));
    }
    p += got;
    offset += got;
    bytes -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace bagpipe
