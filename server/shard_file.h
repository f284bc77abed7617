// One embedding server's part of a checkpoint: every row it stores (values + optimizer state),
// in a checksummed file (core/atomic_file.h) written atomically by the server itself, so that
// under mpirun each server rank writes its own shard in parallel (trainer_hooks/checkpoint.h
// describes the whole checkpoint).
//
// Payload (format version kShardFormatVersion, magic "BPCKSHRD"): uint32 header length, a JSON
// header {server, servers, iteration, record_floats, rows}, then `rows` times (uint64 RowId,
// record_floats floats), in no particular order. Write-back stamps are not kept: a job resumes
// with a fresh planner whose fills carry no stamps from before the checkpoint.
#ifndef BAGPIPE_SERVER_SHARD_FILE_H_
#define BAGPIPE_SERVER_SHARD_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/atomic_file.h"
#include "core/types.h"
#include "server/row_store.h"

namespace bagpipe {

inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr char kShardMagic[] = "BPCKSHRD";

// What a shard must be: checked against its header when it is loaded.
struct ShardIdentity {
  int server = 0;
  int servers = 1;
  Iteration iteration = 0;
};

// Writes every row of `store` to `path` (atomically, fsynced). Returns the file's digest.
absl::StatusOr<FileDigest> WriteShard(const std::string& path, const RowStore& store,
                                      const ShardIdentity& identity);

// Verifies `path` (complete, CRC32C, format version, and — when `expected` is given — the size
// and CRC32C the manifest recorded) and adds its rows to `store`, which must not hold any of
// them. Errors name the file.
absl::Status LoadShard(const std::string& path, const ShardIdentity& identity,
                       const FileDigest* expected, RowStore* store);

}  // namespace bagpipe

#endif  // BAGPIPE_SERVER_SHARD_FILE_H_
