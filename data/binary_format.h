// Bagpipe's binary columnar dataset format: checksummed, exact, validated on read.
//
// Layout (little-endian), format version 3:
//   prefix   48 bytes: magic "BAGPIPE1", uint32 format version (3), uint32 reserved (0),
//            uint64 header JSON length, uint64 body length, uint64 body checksum (XXH3-64 of the
//            body), uint64 header checksum (XXH3-64 of prefix bytes [0, 40) followed by the
//            header JSON: it covers every byte of the file outside the body, and the body's
//            checksum)
//   header   JSON: schema with final table sizes, sample count, section offsets, the source
//   body     8-byte aligned sections: labels float[n]; dense float[n * d]; per table:
//            offsets int64[n + 1] and ids uint32 or int64 (by table size); a table every bag of
//            which holds one id is marked "one_hot" in the header and has no offsets (bag s is
//            id s: Criteo's tables, 160 bytes a sample instead of 368); a file without such a
//            table is written as version 2, which older readers read
// Reading it back yields exactly the batches of the source it was written from.
//
// Reading trusts nothing in the file. Opening checks the header checksum, then that every size
// and offset fits the file (overflow-checked), then the body checksum; each Read checks the
// offsets, ids, labels and dense values it returns (ids in [0, table_rows), offsets within
// their table's ids, labels in [0, 1], dense values finite) and names the record and the table
// or column of a bad one. The file is read with pread, not mapped: a file that shrinks or
// changes while it is read gives an error naming the byte offset, never a SIGBUS.
//
// Format versions 2 (every table with offsets) and 1 (written before the header was
// checksummed: a 24-byte prefix, the body length and checksum in the header JSON) are still
// read, with the same validation.
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

// Reads `source` to its end (one epoch) and writes it to `path`. Nothing is left behind if the
// conversion fails or the process is killed: the per-section spill files are unnamed
// (O_TMPFILE, or unlinked at once) in the output's directory, and the output is written through
// an AtomicFileWriter (core/atomic_file.h: an unnamed file renamed over `path` when complete; on
// file systems without O_TMPFILE a hidden temporary that the next conversion to `path` removes).
absl::StatusOr<ConvertStats> WriteBinary(SampleSource& source, const std::string& path);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_BINARY_FORMAT_H_
