// Fuzz harness: the CSV reader and its column spec. Input: one options byte, the spec up to the
// first newline, then the file.
#include <cstdint>
#include <string>

#include "data/csv_reader.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/source_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t newline = rest.find('\n');
  if (newline == std::string::npos) return 0;
  SourceOptions options;
  options.schema = rest.substr(0, newline);
  options.skip_bad_lines = (flags & 1) != 0;
  options.max_line_bytes = (flags & 4) != 0 ? 300 : 1 << 16;
  options.max_samples = (flags & 8) != 0 ? 5 : -1;
  MemFile file(data + 2 + newline, rest.size() - newline - 1);
  absl::StatusOr<std::unique_ptr<SampleSource>> source = OpenCsv(file.path(), options);
  if (!source.ok()) {
    CheckMessage(source.status(), file.path());
    return 0;
  }
  ReadAndCheck(**source, 1 + (flags >> 4), 2, file.path());
  return 0;
}
