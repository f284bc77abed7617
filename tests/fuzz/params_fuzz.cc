// Fuzz harness: params.bin (trainer_hooks/param_dump.h), as `bagpipe compare` reads it. Input:
// one options byte, then either the file (bit 0 clear) or, to keep inputs small, a header JSON
// and a body separated by a NUL byte, laid out as the writer does (magic, length, JSON padded
// to the fixed header size, body).
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "trainer_hooks/param_dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((flags & 1) != 0) {
    constexpr size_t kHeaderBytes = 64 * 1024;
    const size_t nul = bytes.find('\0');
    if (nul == std::string::npos || nul + 16 > kHeaderBytes) return 0;
    const uint64_t length = nul;
    std::string file("BGPARAMS", 8);
    file.append(reinterpret_cast<const char*>(&length), 8);
    file.append(bytes, 0, nul);
    file.resize(kHeaderBytes, ' ');
    file.append(bytes, nul + 1);
    bytes = std::move(file);
  }
  MemFile file(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  absl::StatusOr<ParamDump> dump = ReadParamDump(file.path());
  if (!dump.ok()) {
    CheckMessage(dump.status(), file.path());
    return 0;
  }
  if (dump->records.size() != dump->rows.size() * static_cast<size_t>(dump->record_floats)) {
    FuzzFail("records do not match rows * record_floats");
  }
  const ParamComparison self = CompareParams(*dump, *dump);
  if (!self.identical) FuzzFail("a parameter dump differs from itself");
  return 0;
}
