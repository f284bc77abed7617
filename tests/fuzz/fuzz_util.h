// Helpers shared by the fuzz harnesses (tests/fuzz/README.md).
#ifndef BAGPIPE_TESTS_FUZZ_FUZZ_UTIL_H_
#define BAGPIPE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bagpipe {

// Stops the run with a message: libFuzzer and the replay driver report it as a crash.
[[noreturn]] inline void FuzzFail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::abort();
}

// The fuzz input as a file: an anonymous in-memory file whose path the readers open.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) FuzzFail("memfd_create failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t put = write(fd_, data + done, size - done);
      if (put <= 0) FuzzFail("writing the memfd failed");
      done += static_cast<size_t>(put);
    }
    path_ = absl::StrCat("/proc/self/fd/", fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// What every error message owes the user however hostile the input: short, and printable ASCII
// only (echoed values are cut and escaped, core/excerpt.h). `path` (named by the user, not the
// input) is left out of the count.
inline void CheckMessage(const absl::Status& status, const std::string& path) {
  if (status.ok()) return;
  std::string message(status.message());
  for (size_t at = message.find(path); !path.empty() && at != std::string::npos;
       at = message.find(path)) {
    message.erase(at, path.size());
  }
  if (message.empty()) FuzzFail("an error without a message");
  if (message.size() > 2000) {
    FuzzFail(absl::StrCat("a ", message.size(), "-byte error message: ", message.substr(0, 200)));
  }
  for (const char c : message) {
    if (c < 0x20 || c > 0x7e) {
      FuzzFail(absl::StrCat("an unescaped byte ", static_cast<int>(static_cast<unsigned char>(c)),
                            " in the error message: ", message));
    }
  }
}

}  // namespace bagpipe

#endif  // BAGPIPE_TESTS_FUZZ_FUZZ_UTIL_H_
