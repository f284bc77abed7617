// Bagpipe's binary columnar dataset format: mmap-able, checksummed, exact.
//
// Layout (little-endian):
//   header   magic "BAGPIPE1", format version, header JSON length, header JSON (schema with
//            final table sizes, sample count, section offsets, body checksum XXH3-64)
//   body     8-byte aligned sections: labels float[n]; dense float[n * d]; per table:
//            offsets int64[n + 1] and ids uint32 or int64 (by table size)
// Reading it back yields exactly the batches of the source it was written from.
#ifndef BAGPIPE_DATA_BINARY_FORMAT_H_
#define BAGPIPE_DATA_BINARY_FORMAT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/source.h"

namespace bagpipe {

absl::StatusOr<std::unique_ptr<SampleSource>> OpenBinary(const std::string& path,
                                                         const SourceOptions& options);

struct ConvertStats {
  int64_t samples = 0;
  int64_t bytes_written = 0;
  double seconds = 0;
};

// Reads `source` to its end (one epoch) and writes it to `path` (atomically: a temporary file
// renamed on success, so a failed conversion leaves no partial output).
absl::StatusOr<ConvertStats> WriteBinary(SampleSource& source, const std::string& path);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_BINARY_FORMAT_H_
