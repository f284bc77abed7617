// Helpers shared by the data/ tests.
#ifndef BAGPIPE_TESTS_DATA_DATA_TESTING_H_
#define BAGPIPE_TESTS_DATA_DATA_TESTING_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "data/source.h"
#include "gtest/gtest.h"

namespace bagpipe {

// The paths TestTempPath gave out; the files are removed when the test program exits (by the
// process that named them, not by a forked child).
class TestTempFiles {
 public:
  static TestTempFiles& Get() {
    static TestTempFiles files;
    return files;
  }
  void Add(const std::string& path) { paths_.push_back(path); }
  ~TestTempFiles() {
    if (::getpid() != owner_) return;
    for (const std::string& path : paths_) {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  }

 private:
  TestTempFiles() : owner_(::getpid()) {}
  pid_t owner_;
  std::vector<std::string> paths_;
};

// A path in the test temp directory unique to this process (ctest runs tests in parallel),
// removed when the test program exits.
inline std::string TestTempPath(const std::string& prefix, const std::string& name) {
  std::string path =
      ::testing::TempDir() + "/" + prefix + "_" + std::to_string(::getpid()) + "_" + name;
  TestTempFiles::Get().Add(path);
  return path;
}

// Writes `text` to TestTempPath(prefix, name) and returns the path.
inline std::string WriteTestFile(const std::string& prefix, const std::string& name,
                                 const std::string& text) {
  const std::string path = TestTempPath(prefix, name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Reads one epoch of `source` in reads of `chunk` samples into one batch (first_sample of the
// first read).
inline Batch ReadAll(SampleSource& source, int64_t chunk) {
  Batch all, part;
  all.Reset(source.schema().num_dense(), source.schema().num_tables());
  bool first = true;
  while (true) {
    auto read = source.Read(chunk, &part);
    EXPECT_TRUE(read.ok()) << read.status();
    if (!read.ok() || *read == 0) break;
    if (first) all.first_sample = part.first_sample;
    first = false;
    all.Append(part);
  }
  return all;
}

}  // namespace bagpipe

#endif  // BAGPIPE_TESTS_DATA_DATA_TESTING_H_
