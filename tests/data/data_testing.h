// Helpers shared by the data/ tests.
#ifndef BAGPIPE_TESTS_DATA_DATA_TESTING_H_
#define BAGPIPE_TESTS_DATA_DATA_TESTING_H_

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "data/source.h"
#include "gtest/gtest.h"

namespace bagpipe {

// A path in the test temp directory unique to this process (ctest runs tests in parallel).
inline std::string TestTempPath(const std::string& prefix, const std::string& name) {
  return ::testing::TempDir() + "/" + prefix + "_" + std::to_string(::getpid()) + "_" + name;
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
