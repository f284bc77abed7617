// Specification of core/dir_lock.h: one job at a time holds a directory; the second is refused
// naming the first one's pid, and the lock goes with its holder.
#include "core/dir_lock.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(DirLockTest, ASecondHolderIsRefusedUntilTheFirstLetsGo) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/dir_lock_", getpid());
  std::filesystem::create_directories(dir);
  auto first = DirLock::Acquire(dir, ".lock", "--out " + dir);
  ASSERT_TRUE(first.ok()) << first.status();
  // flock locks belong to the open file: a second open in this process conflicts as another
  // process's would.
  auto second = DirLock::Acquire(dir, ".lock", "--out " + dir);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()),
              AllOf(HasSubstr("--out " + dir + " is in use by another job (pid " +
                              std::to_string(getpid()) + " holds the lock '" + dir + "/.lock')"),
                    HasSubstr("use another directory")));
  // Another name in the same directory is another lock (--out and --checkpoint-dir may share).
  EXPECT_TRUE(DirLock::Acquire(dir, ".other.lock", "--checkpoint-dir " + dir).ok());
  first->reset();
  EXPECT_TRUE(DirLock::Acquire(dir, ".lock", "--out " + dir).ok());
  std::filesystem::remove_all(dir);
}

TEST(DirLockTest, ADirectoryThatCannotHoldTheLockFileIsNamed) {
  auto lock = DirLock::Acquire("/nonexistent/dir", ".lock", "--out /nonexistent/dir");
  ASSERT_FALSE(lock.ok());
  EXPECT_THAT(std::string(lock.status().message()),
              HasSubstr("--out /nonexistent/dir: cannot create the lock file "
                        "'/nonexistent/dir/.lock'"));
}

}  // namespace
}  // namespace bagpipe
