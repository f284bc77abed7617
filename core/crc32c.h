// CRC32C (Castagnoli, the iSCSI / ext4 / LevelDB checksum) of byte buffers, through Intel's
// ISA-L (`crc32_iscsi`, hardware-accelerated with SSE4.2/AVX-512 where the CPU has them).
//
// Why not absl/crc/crc32c.h: Debian 12's Abseil (20220623) predates it (it arrived in 20230125),
// and the project builds from Debian's packages; ISA-L (libisal-dev) is the Debian package that
// ships a fast CRC32C. Values follow the standard convention (initial value and final XOR
// 0xFFFFFFFF): Crc32c("123456789") == 0xE3069283, as absl::ComputeCrc32c and google/crc32c.
//
// Thread-safe (pure functions).
#ifndef BAGPIPE_CORE_CRC32C_H_
#define BAGPIPE_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace bagpipe {

// The CRC32C of data[0, size) appended to data whose CRC32C is `crc` (0 for none):
// ExtendCrc32c(Crc32c(a), b) == Crc32c(a + b).
uint32_t ExtendCrc32c(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return ExtendCrc32c(0, data, size); }
inline uint32_t Crc32c(std::string_view data) { return Crc32c(data.data(), data.size()); }

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_CRC32C_H_
