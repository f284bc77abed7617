#include "core/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checked_math.h"
#include "core/crc32c.h"
#include "core/file_read.h"
#include "core/status.h"

namespace bagpipe {
namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kTrailerBytes = 16;
constexpr char kTrailerMagic[4] = {'B', 'P', 'O', 'K'};

void (*opened_hook_for_testing)(const std::string& path) = nullptr;

absl::Status ErrnoError(const std::string& what, const std::string& path, int error) {
  const std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == ENOSPC || error == EDQUOT || error == EIO) return absl::DataLossError(message);
  return absl::FailedPreconditionError(message);
}

// Writes all of data[0, size) to fd (retrying short writes and EINTR).
int WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

std::string TempPrefix(const std::string& name) { return absl::StrCat(".", name, ".tmp-"); }

// Removes hidden temporaries of `name` in `dir` that a killed writer left behind.
void RemoveStaleTemporaries(const std::string& dir, const std::string& name) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = TempPrefix(name);
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(d)) {
    if (absl::StartsWith(entry->d_name, prefix)) stale.emplace_back(entry->d_name);
  }
  ::closedir(d);
  for (const std::string& file : stale) ::unlink((dir + "/" + file).c_str());
}

// What replacing `path` replaces: a symbolic link's target (the link stays a link); an error
// when that exists and is no regular file (a directory, a device such as /dev/stdout's, a
// FIFO), which a rename over it would replace by a file.
absl::StatusOr<std::string> ReplacedPath(const std::string& path) {
  namespace fs = std::filesystem;
  std::string target = path;
  struct stat st;
  for (int links = 0; ::lstat(target.c_str(), &st) == 0 && S_ISLNK(st.st_mode); ++links) {
    std::error_code error;
    const fs::path to = fs::read_symlink(target, error);
    if (error || links == 40) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is a symbolic link that cannot be followed"));
    }
    target = (to.is_absolute() ? to : fs::path(target).parent_path() / to).string();
  }
  if (::lstat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "'", target == path ? "" : absl::StrCat(" (a link to '", target, "')"), " is ",
        kind, ": refusing to replace it with a file"));
  }
  return target;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Open(std::string path) {
  ASSIGN_OR_RETURN(path, ReplacedPath(path));
  std::unique_ptr<AtomicFileWriter> w(new AtomicFileWriter());
  const std::filesystem::path p(path);
  w->path_ = std::move(path);
  w->dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
  const std::string name = p.filename().string();
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", w->path_, "' names no file"));
  }
  w->dir_fd_ = ::open(w->dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (w->dir_fd_ < 0) return ErrnoError("cannot open the directory of", w->path_, errno);
  RemoveStaleTemporaries(w->dir_, name);
  w->fd_ = ::openat(w->dir_fd_, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (w->fd_ >= 0) {
    w->unnamed_ = true;
  } else {
    // No O_TMPFILE on this file system (e.g. NFS): a hidden temporary beside the target.
    static std::atomic<uint64_t> counter{0};
    w->temp_name_ = absl::StrCat(TempPrefix(name), ::getpid(), "-", counter++);
    w->fd_ =
        ::openat(w->dir_fd_, w->temp_name_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (w->fd_ < 0) return ErrnoError("cannot create a temporary file for", w->path_, errno);
  }
  w->buffer_.reserve(kBufferBytes);
  return w;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_name_.empty() && dir_fd_ >= 0) {
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

absl::Status AtomicFileWriter::Fail(absl::Status status) {
  if (error_.ok()) error_ = status;
  return error_;
}

absl::Status AtomicFileWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  const int error = WriteAll(fd_, buffer_.data(), buffer_.size());
  buffer_.clear();
  if (error != 0) return Fail(ErrnoError("failed writing", path_, error));
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Append(const void* data, size_t size) {
  RETURN_IF_ERROR(error_);
  if (committed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": already committed"));
  crc_ = ExtendCrc32c(crc_, data, size);
  bytes_ += size;
  const char* bytes = static_cast<const char*>(data);
  if (buffer_.size() + size <= kBufferBytes) {
    buffer_.insert(buffer_.end(), bytes, bytes + size);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Flush());
  if (size >= kBufferBytes) {
    const int error = WriteAll(fd_, bytes, size);
    if (error != 0) return Fail(ErrnoError("failed writing", path_, error));
    return absl::OkStatus();
  }
  buffer_.insert(buffer_.end(), bytes, bytes + size);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::OverwriteAt(uint64_t offset, const void* data, size_t size) {
  RETURN_IF_ERROR(error_);
  if (offset + size > bytes_) {
    return absl::InternalError(absl::StrCat(path_, ": overwrite past the end"));
  }
  RETURN_IF_ERROR(Flush());
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Fail(ErrnoError("failed writing", path_, n < 0 ? errno : EIO));
    bytes += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  RETURN_IF_ERROR(error_);
  if (committed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": already committed"));
  RETURN_IF_ERROR(Flush());
  if (::fsync(fd_) != 0) return Fail(ErrnoError("failed to flush to disk", path_, errno));
  const std::string name = std::filesystem::path(path_).filename().string();
  if (unnamed_) {
    // Give the unnamed file a (hidden) name, then rename it over the target: linkat cannot
    // replace an existing file.
    static std::atomic<uint64_t> counter{0};
    temp_name_ = absl::StrCat(TempPrefix(name), ::getpid(), "-l", counter++);
    int linked = ::linkat(fd_, "", dir_fd_, temp_name_.c_str(), AT_EMPTY_PATH);
    if (linked != 0) {
      const std::string proc = absl::StrCat("/proc/self/fd/", fd_);
      linked = ::linkat(AT_FDCWD, proc.c_str(), dir_fd_, temp_name_.c_str(), AT_SYMLINK_FOLLOW);
    }
    if (linked != 0) {
      const int error = errno;
      temp_name_.clear();
      return Fail(ErrnoError("cannot link the new contents of", path_, error));
    }
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Fail(ErrnoError("failed closing", path_, errno));
  }
  fd_ = -1;
  if (::renameat(dir_fd_, temp_name_.c_str(), dir_fd_, name.c_str()) != 0) {
    return Fail(ErrnoError("cannot rename the new contents over", path_, errno));
  }
  committed_ = true;
  if (::fsync(dir_fd_) != 0)
    return Fail(ErrnoError("failed to flush the directory of", path_, errno));
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(writer->Append(contents));
  return writer->Commit();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", dir, errno);
  const int result = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0) return ErrnoError("failed to flush directory", dir, error);
  return absl::OkStatus();
}

// --- checksummed files ------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ChecksummedFileWriter>> ChecksummedFileWriter::Open(
    std::string path, std::string_view magic, uint32_t version) {
  if (magic.size() != 8) return absl::InternalError("a checksummed file's magic has 8 bytes");
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file, AtomicFileWriter::Open(std::move(path)));
  char header[kHeaderBytes] = {};
  std::memcpy(header, magic.data(), 8);
  std::memcpy(header + 8, &version, 4);
  RETURN_IF_ERROR(file->Append(header, sizeof(header)));
  return std::unique_ptr<ChecksummedFileWriter>(new ChecksummedFileWriter(std::move(file)));
}

absl::Status ChecksummedFileWriter::Append(const void* data, size_t size) {
  payload_bytes_ += size;
  return file_->Append(data, size);
}

absl::StatusOr<FileDigest> ChecksummedFileWriter::Commit() {
  char trailer[kTrailerBytes];
  const uint64_t length = payload_bytes_;
  const uint32_t crc = file_->digest().crc32c;
  std::memcpy(trailer, &length, 8);
  std::memcpy(trailer + 8, &crc, 4);
  std::memcpy(trailer + 12, kTrailerMagic, 4);
  RETURN_IF_ERROR(file_->Append(trailer, sizeof(trailer)));
  RETURN_IF_ERROR(file_->Commit());
  return file_->digest();
}

absl::StatusOr<FileDigest> WriteChecksummedFile(const std::string& path, std::string_view magic,
                                                uint32_t version, std::string_view payload) {
  ASSIGN_OR_RETURN(std::unique_ptr<ChecksummedFileWriter> writer,
                   ChecksummedFileWriter::Open(path, magic, version));
  RETURN_IF_ERROR(writer->Append(payload));
  return writer->Commit();
}

absl::StatusOr<ChecksummedFile> ChecksummedFile::Open(const std::string& path,
                                                      std::string_view magic, uint32_t version,
                                                      std::string_view what_view) {
  const std::string what(what_view);
  ChecksummedFile file;
  file.path_ = path;
  // O_NONBLOCK: opening a FIFO put in the file's place must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot open ", what), path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoError("cannot stat", path, error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("%s '%s' is not a regular file", what, path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  // Read, not mapped: a file truncated or rewritten by another process while it is being read
  // gives a short read (a DataLoss naming it), where a mapping would give SIGBUS. The contents
  // are checksummed as they arrive (each block while it is still in the cache).
  if (opened_hook_for_testing != nullptr) opened_hook_for_testing(path);
  uint32_t crc = 0;
  if (size > 0) {
    // The whole file is held in memory until it is verified: refuse one larger than this
    // machine's memory instead of being killed for it.
    const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGESIZE);
    const std::optional<int64_t> memory = CheckedMul(pages, page_bytes);
    if (pages > 0 && page_bytes > 0 && memory.has_value() && st.st_size > *memory) {
      ::close(fd);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot read %s '%s': its %d bytes exceed this machine's memory (%d bytes)", what, path,
          size, *memory));
    }
    // Pages populated at once (MAP_POPULATE): faulting in a large buffer 4 KiB at a time while
    // reading measured about 30% slower.
    void* buffer = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buffer == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::ResourceExhaustedError(
          absl::StrFormat("cannot read %s '%s': no memory for its %d bytes (%s)", what, path, size,
                          std::strerror(error)));
    }
    file.data_ = static_cast<char*>(buffer);
    file.data_bytes_ = size;
    const size_t crc_end = size >= kTrailerBytes ? size - kTrailerBytes : 0;
    for (size_t at = 0; at < size; at += kBufferBytes) {
      const size_t block = std::min(kBufferBytes, size - at);
      const absl::Status read =
          PreadExactly(fd, static_cast<int64_t>(at), file.data_ + at, block, path, what);
      if (!read.ok()) {
        ::close(fd);
        return read;
      }
      if (at < crc_end) crc = ExtendCrc32c(crc, file.data_ + at, std::min(block, crc_end - at));
    }
  }
  ::close(fd);
  const char* bytes = file.data_;
  if (size < kHeaderBytes + kTrailerBytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s '%s' is truncated: %d bytes, fewer than its header and trailer", what, path, size));
  }
  uint64_t length = 0;
  uint32_t stored_crc = 0;
  const char* trailer = bytes + size - kTrailerBytes;
  std::memcpy(&length, trailer, 8);
  std::memcpy(&stored_crc, trailer + 8, 4);
  if (std::memcmp(trailer + 12, kTrailerMagic, 4) != 0 ||
      length != size - kHeaderBytes - kTrailerBytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s '%s' is truncated or damaged: %d bytes, and its trailer is missing or does not "
        "match its length",
        what, path, size));
  }
  if (crc != stored_crc) {
    return absl::DataLossError(absl::StrFormat(
        "%s '%s' is corrupt: the CRC32C of its contents is %08x, its trailer says %08x", what, path,
        crc, stored_crc));
  }
  if (std::memcmp(bytes, magic.data(), 8) != 0) {
    return absl::DataLossError(absl::StrFormat("'%s' is not a %s (it starts with '%s')", path, what,
                                               absl::CHexEscape(std::string(bytes, 8))));
  }
  uint32_t file_version = 0;
  std::memcpy(&file_version, bytes + 8, 4);
  if (file_version != version) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s '%s' has format version %d; this build reads version %d", what, path,
                        file_version, version));
  }
  file.payload_ = std::string_view(bytes + kHeaderBytes, length);
  file.digest_ = {size, ExtendCrc32c(crc, trailer, kTrailerBytes)};
  return file;
}

void SetChecksummedFileOpenedHookForTesting(void (*hook)(const std::string& path)) {
  opened_hook_for_testing = hook;
}

ChecksummedFile::ChecksummedFile(ChecksummedFile&& other) noexcept { *this = std::move(other); }

ChecksummedFile& ChecksummedFile::operator=(ChecksummedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = other.data_;
    data_bytes_ = other.data_bytes_;
    payload_ = other.payload_;
    digest_ = other.digest_;
    other.data_ = nullptr;
    other.data_bytes_ = 0;
    other.payload_ = {};
  }
  return *this;
}

ChecksummedFile::~ChecksummedFile() { Reset(); }

void ChecksummedFile::Reset() {
  if (data_ != nullptr) ::munmap(data_, data_bytes_);
  data_ = nullptr;
  data_bytes_ = 0;
  payload_ = {};
}

}  // namespace bagpipe
