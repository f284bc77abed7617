// Crafting binary datasets (data/binary_format.h) for tests and fuzzing: a file is split into
// its header JSON and body, edited, and joined back with valid checksums, so that a test or a
// fuzzer reaches the checks that stand behind the checksums (a hostile file can always carry
// valid ones).
#ifndef BAGPIPE_TESTS_DATA_BINARY_CRAFTING_H_
#define BAGPIPE_TESTS_DATA_BINARY_CRAFTING_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

namespace bagpipe {

inline constexpr size_t kBinaryPrefixBytes = 48;

struct BinaryParts {
  nlohmann::json header;
  std::string body;
};

inline size_t BinaryAlign8(size_t n) { return (n + 7) & ~size_t{7}; }

// Splits a version 2 or 3 file; nullopt if its prefix or header JSON is unreadable.
inline std::optional<BinaryParts> SplitBinary(const std::string& bytes) {
  if (bytes.size() < kBinaryPrefixBytes) return std::nullopt;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + 16, 8);
  if (header_bytes > bytes.size() - kBinaryPrefixBytes) return std::nullopt;
  BinaryParts parts;
  parts.header = nlohmann::json::parse(bytes.substr(kBinaryPrefixBytes, header_bytes), nullptr,
                                       /*allow_exceptions=*/false);
  if (parts.header.is_discarded()) return std::nullopt;
  const size_t body_at = BinaryAlign8(kBinaryPrefixBytes + header_bytes);
  parts.body = body_at <= bytes.size() ? bytes.substr(body_at) : std::string();
  return parts;
}

// Sets the body length and both checksums of a version 2 or 3 file whose prefix announces a header
// length that fits the file; other input is returned unchanged.
inline std::string RepairBinaryChecksums(std::string bytes) {
  if (bytes.size() < kBinaryPrefixBytes) return bytes;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + 16, 8);
  if (header_bytes > bytes.size() - kBinaryPrefixBytes) return bytes;
  const size_t body_at = BinaryAlign8(kBinaryPrefixBytes + header_bytes);
  const uint64_t body_bytes = body_at <= bytes.size() ? bytes.size() - body_at : 0;
  const uint64_t body_checksum =
      XXH3_64bits(bytes.data() + std::min(body_at, bytes.size()), body_bytes);
  std::memcpy(bytes.data() + 24, &body_bytes, 8);
  std::memcpy(bytes.data() + 32, &body_checksum, 8);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, bytes.data(), 40);
  XXH3_64bits_update(state, bytes.data() + kBinaryPrefixBytes, header_bytes);
  const uint64_t header_checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  std::memcpy(bytes.data() + 40, &header_checksum, 8);
  return bytes;
}

// A file of `parts` with valid checksums, in format version 3 (the current one), 2 or 1.
inline std::string JoinBinary(const BinaryParts& parts, uint32_t version = 3) {
  nlohmann::json header = parts.header;
  const size_t prefix_bytes = version == 1 ? 24 : kBinaryPrefixBytes;
  if (version == 1) {
    header["body_bytes"] = parts.body.size();
    header["checksum"] =
        absl::StrFormat("%016x", XXH3_64bits(parts.body.data(), parts.body.size()));
  }
  const std::string text = header.dump();
  std::string bytes(prefix_bytes, '\0');
  std::memcpy(bytes.data(), "BAGPIPE1", 8);
  std::memcpy(bytes.data() + 8, &version, 4);
  const uint64_t header_bytes = text.size();
  std::memcpy(bytes.data() + 16, &header_bytes, 8);
  bytes += text;
  bytes.resize(BinaryAlign8(bytes.size()), '\0');
  bytes += parts.body;
  return version == 1 ? bytes : RepairBinaryChecksums(std::move(bytes));
}

}  // namespace bagpipe

#endif  // BAGPIPE_TESTS_DATA_BINARY_CRAFTING_H_
