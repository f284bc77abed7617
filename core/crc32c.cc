#include "core/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace bagpipe {

uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t size) {
  // ISA-L works on the raw register (no final XOR) and takes an int length.
  unsigned int state = ~crc;
  auto* bytes = static_cast<unsigned char*>(const_cast<void*>(data));
  constexpr size_t kChunk = size_t{1} << 30;
  while (size > 0) {
    const size_t n = std::min(size, kChunk);
    state = crc32_iscsi(bytes, static_cast<int>(n), state);
    bytes += n;
    size -= n;
  }
  return ~state;
}

}  // namespace bagpipe
