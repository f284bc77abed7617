// Fuzz harness: the binary columnar reader. Input: one options byte, then the file; with bit 0
// set the file's checksums are repaired first (tests/data/binary_crafting.h), so that the
// fuzzer reaches the validation behind them, as a crafted file would; with bit 1 set (and a
// readable version 2 or 3 layout) the file is rewritten in format version 1, with a valid checksum.
#include <cstdint>
#include <optional>
#include <string>

#include "data/binary_format.h"
#include "tests/data/binary_crafting.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/source_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((flags & 1) != 0) bytes = RepairBinaryChecksums(std::move(bytes));
  if ((flags & 2) != 0) {
    // Only a header that is a JSON object can take version 1's fields (a fuzzed header may be a
    // number or an array: regressions/binary/binary-crash-4be1ba1c...).
    if (const std::optional<BinaryParts> parts = SplitBinary(bytes);
        parts.has_value() && parts->header.is_object()) {
      bytes = JoinBinary(*parts, 1);
    }
  }
  MemFile file(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  SourceOptions options;
  options.max_samples = (flags & 8) != 0 ? 5 : -1;
  absl::StatusOr<std::unique_ptr<SampleSource>> source = OpenBinary(file.path(), options);
  if (!source.ok()) {
    CheckMessage(source.status(), file.path());
    return 0;
  }
  (void)(*source)->Describe();
  ReadAndCheck(**source, 1 + (flags >> 4), 2, file.path());
  return 0;
}
