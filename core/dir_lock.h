// An advisory, exclusive lock on a directory a job writes (--out, --checkpoint-dir), so that a
// second job started on the same directory is refused instead of silently replacing the first
// one's files. The lock is flock(2) on a small file DIR/NAME that holds the owner's pid; it is
// released when the DirLock is destroyed or the process ends (even by SIGKILL), so a crashed
// job never leaves a stale lock. The file itself stays (an empty or old file locks nothing).
// Where the file system does not support flock (some network file systems answer ENOLCK or
// EOPNOTSUPP), Acquire succeeds without a lock and logs a warning: the lock is a safeguard, not
// a condition of running.
//
// Not thread-safe; one DirLock per (directory, name) per process.
#ifndef BAGPIPE_CORE_DIR_LOCK_H_
#define BAGPIPE_CORE_DIR_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bagpipe {

class DirLock {
 public:
  // Locks DIR/`name` (DIR must exist). `what` names the directory in messages (e.g.
  // "--checkpoint-dir /ck"). FailedPrecondition when another process holds the lock, naming
  // its pid; other errors (the file cannot be created) name the path.
  static absl::StatusOr<std::unique_ptr<DirLock>> Acquire(const std::string& dir,
                                                          const std::string& name,
                                                          const std::string& what);
  // Refuses (as Acquire) when another process holds DIR/`name`; creates nothing and holds
  // nothing. For a directory this process writes without owning it: another job's run or
  // checkpoint directory. Must not be called on a lock this process holds (flock would see it
  // as another holder).
  static absl::Status CheckFree(const std::string& dir, const std::string& name,
                                const std::string& what);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_ = -1;  // -1: not locked (unsupported file system)
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_DIR_LOCK_H_
