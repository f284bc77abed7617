// Reading files with pread instead of mapping them. A mapped file that another process
// truncates or rewrites while it is mapped raises SIGBUS at the first access past its new end;
// a pread that finds the file shorter than expected returns a short count instead, which these
// helpers turn into a clear error naming the file and the byte offset.
//
// Thread-safety: pure functions over a file descriptor (pread does not move the file offset),
// so several threads may read one descriptor at once.
#ifndef BAGPIPE_CORE_FILE_READ_H_
#define BAGPIPE_CORE_FILE_READ_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace bagpipe {

// Reads exactly `bytes` bytes at `offset` of `fd` into `out` (short reads and EINTR retried).
// Errors are DataLoss: a read error ("cannot read"), or the file ending before offset + bytes
// ("ends at byte B inside the SECTION: the file was truncated or shrank while it was being
// read"). Messages start with `prefix` (may be empty), name `path`, the byte offset and
// `section` (what was being read: "header", "checkpoint shard", ...).
// REQUIRES: offset >= 0; `out` holds `bytes` bytes.
absl::Status PreadExactly(int fd, int64_t offset, void* out, size_t bytes, std::string_view path,
                          std::string_view section, std::string_view prefix = {});

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_FILE_READ_H_
