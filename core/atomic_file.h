// Files that are never seen half-written, and files that say when they are damaged.
//
// AtomicFileWriter: a file's new contents go to a temporary file in the same directory — an
// unnamed one (Linux O_TMPFILE) where the file system supports it, else a hidden
// ".NAME.tmp-PID-N" beside it — and Commit() flushes it to disk (fsync), renames it over the
// target and fsyncs the directory. Whatever happens to the process (an error, a signal,
// SIGKILL, a full disk), the target path holds either its old contents or all of the new ones;
// a killed writer leaves no temporary behind with O_TMPFILE, and a named one left by a killed
// writer is removed by the next writer of the same target. Every write error (ENOSPC, EIO...) is
// reported with the path, never swallowed.
//
// Checksummed files (ChecksummedFileWriter / ChecksummedFile): the container of every
// checkpoint file. Layout (little-endian):
//
//   [0, 8)        magic: 8 bytes naming the kind of file ("BPCKMANI", ...)
//   [8, 12)       uint32 format version of that kind
//   [12, 16)      uint32 0 (reserved)
//   [16, 16 + N)  payload
//   trailer:      uint64 N, uint32 CRC32C of bytes [0, 16 + N), 4 bytes "BPOK"
//
// The header and trailer keep this layout in every format version, so that a reader can tell
// "truncated", "corrupt" (CRC mismatch), "not this kind of file" and "another format version"
// apart — in that order: one flipped byte anywhere in a file is reported as damage, not as a
// version or kind mismatch. Readers read the file into memory (pread, not mmap: a file truncated
// or rewritten by another process meanwhile is a DataLoss naming it, never SIGBUS) and verify it
// whole before handing out the payload.
//
// Thread-safety: a writer or a reader is used by one thread at a time; distinct objects are
// independent.
#ifndef BAGPIPE_CORE_ATOMIC_FILE_H_
#define BAGPIPE_CORE_ATOMIC_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bagpipe {

// Size and CRC32C of a whole file (as a manifest records them).
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  bool operator==(const FileDigest&) const = default;
};

class AtomicFileWriter {
 public:
  // Starts a new version of `path` (its directory must exist). Nothing at `path` changes before
  // Commit. A symbolic link at `path` has its target replaced (it stays a link); a path that is,
  // or links to, something other than a regular file (a directory, a device, a FIFO) is refused.
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Open(std::string path);
  // Discards the new contents unless Commit succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends bytes (buffered). After an error the writer only reports it again.
  absl::Status Append(const void* data, size_t size);
  absl::Status Append(std::string_view data) { return Append(data.data(), data.size()); }
  // Overwrites bytes already appended, at `offset` (a header completed at the end). The
  // digest() then no longer describes the file. REQUIRES: offset + size <= bytes appended.
  absl::Status OverwriteAt(uint64_t offset, const void* data, size_t size);
  // Writes out, fsyncs, renames over the target and fsyncs its directory; then `path` holds
  // exactly the bytes appended, durably. REQUIRES: called once.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  // Of the bytes appended so far.
  FileDigest digest() const { return {bytes_, crc_}; }

 private:
  AtomicFileWriter() = default;
  absl::Status Flush();
  absl::Status Fail(absl::Status status);

  std::string path_;
  std::string dir_;
  std::string temp_name_;  // named temporary (empty with O_TMPFILE until Commit links it)
  int fd_ = -1;
  int dir_fd_ = -1;
  bool unnamed_ = false;
  bool committed_ = false;
  absl::Status error_;
  std::vector<char> buffer_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// Replaces `path` with `contents` atomically (AtomicFileWriter).
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

// fsync of a directory (after creating or removing entries in it).
absl::Status SyncDirectory(const std::string& dir);

// Writes a checksummed file (layout in the file comment) through an AtomicFileWriter.
class ChecksummedFileWriter {
 public:
  // REQUIRES: magic.size() == 8.
  static absl::StatusOr<std::unique_ptr<ChecksummedFileWriter>> Open(std::string path,
                                                                     std::string_view magic,
                                                                     uint32_t version);
  absl::Status Append(const void* data, size_t size);
  absl::Status Append(std::string_view data) { return Append(data.data(), data.size()); }
  // Writes the trailer and commits. Returns the digest of the whole file.
  absl::StatusOr<FileDigest> Commit();
  const std::string& path() const { return file_->path(); }

 private:
  explicit ChecksummedFileWriter(std::unique_ptr<AtomicFileWriter> file) : file_(std::move(file)) {}
  std::unique_ptr<AtomicFileWriter> file_;
  uint64_t payload_bytes_ = 0;
};

// Writes `payload` as a checksummed file.
absl::StatusOr<FileDigest> WriteChecksummedFile(const std::string& path, std::string_view magic,
                                                uint32_t version, std::string_view payload);

// A verified checksummed file, read whole into memory (it holds the file's size in bytes).
// Move-only.
class ChecksummedFile {
 public:
  // Reads and verifies `path`: it must be a regular file, complete (trailer present, length
  // consistent), its CRC32C must match, it must start with `magic` and have format `version`.
  // `what` names the kind in messages ("checkpoint manifest"). Errors: NotFound (cannot open),
  // DataLoss (truncated — also while it was being read —, corrupt, not this kind of file),
  // FailedPrecondition (another format version, not a regular file), ResourceExhausted (no
  // memory for its size).
  static absl::StatusOr<ChecksummedFile> Open(const std::string& path, std::string_view magic,
                                              uint32_t version, std::string_view what);
  ChecksummedFile(ChecksummedFile&& other) noexcept;
  ChecksummedFile& operator=(ChecksummedFile&& other) noexcept;
  ~ChecksummedFile();

  std::string_view payload() const { return payload_; }
  // Size and CRC32C of the whole file.
  FileDigest digest() const { return digest_; }
  const std::string& path() const { return path_; }

 private:
  ChecksummedFile() = default;
  void Reset();

  std::string path_;
  char* data_ = nullptr;  // the whole file, in anonymous memory (munmap)
  size_t data_bytes_ = 0;
  std::string_view payload_;
  FileDigest digest_;
};

// Test-only: `hook` runs inside ChecksummedFile::Open once the file is open and its size known,
// before its contents are read (a test truncates the file there); nullptr for none. Not
// thread-safe; never set in production.
void SetChecksummedFileOpenedHookForTesting(void (*hook)(const std::string& path));

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_ATOMIC_FILE_H_
