// Fuzz harness: the Criteo TSV reader. Input: one options byte, then the file.
#include <cstdint>

#include "data/criteo_reader.h"
#include "tbb/global_control.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/source_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  if (size < 1) return 0;
  // One thread: the reader's parallel parse only costs wake-ups on inputs this small.
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  const uint8_t flags = data[0];
  MemFile file(data + 1, size - 1);
  SourceOptions options;
  options.skip_bad_lines = (flags & 1) != 0;
  options.row_budget = (flags & 2) != 0 ? 1000 : 0;
  options.max_line_bytes = (flags & 4) != 0 ? 300 : 1 << 16;
  options.max_samples = (flags & 8) != 0 ? 5 : -1;
  absl::StatusOr<std::unique_ptr<SampleSource>> source = OpenCriteo(file.path(), options);
  if (!source.ok()) {
    CheckMessage(source.status(), file.path());
    return 0;
  }
  ReadAndCheck(**source, 1 + (flags >> 4), 2, file.path());
  return 0;
}
