#include "core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/logging.h"

namespace bagpipe {

namespace {

// The refusal when another process holds the lock on `fd` (the file at `path`), naming its pid.
absl::Status HeldBy(int fd, const std::string& path, const std::string& what) {
  char text[32] = {};
  const ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
  int64_t pid = 0;
  const bool known =
      got > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(text)), &pid);
  return absl::FailedPreconditionError(absl::StrCat(
      what, " is in use by another job (", known ? absl::StrCat("pid ", pid) : "a process",
      " holds the lock '", path,
      "'): two jobs writing one directory would replace each other's files; wait for it to "
      "end or use another directory"));
}

}  // namespace

absl::Status DirLock::CheckFree(const std::string& dir, const std::string& name,
                                const std::string& what) {
  const std::string path = absl::StrCat(dir, "/", name);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return absl::OkStatus();  // no lock file: nobody locks it
  absl::Status status;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) status = HeldBy(fd, path, what);
  }
  close(fd);  // releases a lock taken here
  return status;
}

absl::StatusOr<std::unique_ptr<DirLock>> DirLock::Acquire(const std::string& dir,
                                                          const std::string& name,
                                                          const std::string& what) {
  const std::string path = absl::StrCat(dir, "/", name);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot create the lock file '", path, "': ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      absl::Status held = HeldBy(fd, path, what);
      close(fd);
      return held;
    }
    close(fd);
    BAGPIPE_LOG(WARNING) << what << ": cannot lock '" << path << "' (" << std::strerror(error)
                         << "): going on without a lock; no other job may write this directory";
    return std::unique_ptr<DirLock>(new DirLock(-1));
  }
  // The owner's pid, for the message a second job prints (best effort: the lock is the flock).
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, pid.data(), pid.size(), 0);
  return std::unique_ptr<DirLock>(new DirLock(fd));
}

DirLock::~DirLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

}  // namespace bagpipe
