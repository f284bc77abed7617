// Messages between trainers and embedding servers, and the row -> server sharding.
//
//   FetchRequest   trainer -> server: rows needed for the fills of iteration `iteration`; the
//                  server answers once each row's write-back stamped `after_stamps[k]` (if >= 0)
//                  is applied and every trainer's write-backs are in up to iteration
//                  `iteration - horizon` (see oracle/planner.h, "write-back stamps").
//   FetchResponse  server -> trainer: the rows' records (values + optimizer state), request order.
//   WriteBack      trainer -> server: records written back at the boundary of iteration `stamp`.
//                  Sent at every boundary to every server, possibly empty: it is also the
//                  trainer's watermark ("all my write-backs up to `stamp` are sent").
//   Control        kDone (a trainer finished), kCollect/kRows (parameter collection), kStop,
//                  kKeepAlive (rank 0 between its oracle's end and the collection);
//                  checkpoints (trainer_hooks/checkpoint.h): kCheckpoint / kRestore (rank 0 ->
//                  server: write / load the shard at `path`, a ShardRequest) answered by
//                  kShardDone (a ShardReply).
#ifndef BAGPIPE_SYNC_PROTOCOL_H_
#define BAGPIPE_SYNC_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/random.h"
#include "core/types.h"
#include "sync/wire.h"

namespace bagpipe {

// The server (0..num_servers-1) that owns `row`: a hash, so hot rows of every table spread.
inline int ServerOfRow(RowId row, int num_servers) {
  return static_cast<int>(Mix64(row ^ 0x5bd1e995ULL) % static_cast<uint64_t>(num_servers));
}

struct FetchRequest {
  uint64_t id = 0;
  Iteration iteration = 0;
  std::vector<RowId> rows;
  std::vector<Iteration> after_stamps;
};

struct FetchResponse {
  uint64_t id = 0;
  std::vector<float> records;  // rows.size() * record_floats
};

struct WriteBack {
  Iteration stamp = 0;
  std::vector<RowId> rows;
  std::vector<float> records;
};

enum class ControlKind : uint32_t {
  kDone = 1,        // trainer -> servers/oracle: finished, no more requests
  kCollect = 2,     // collector -> server: send every row, sorted by RowId
  kRows = 3,        // server -> collector: a chunk of rows (last chunk flagged)
  kStop = 4,        // collector -> server: exit
  kStats = 5,       // any -> collector: a JSON blob of statistics
  kCheckpoint = 6,  // rank 0 -> server: write your shard once every trainer's write-backs
                    // up to `iteration` are applied
  kRestore = 7,     // rank 0 -> server: load your shard (a resumed job), before any fetch
  kShardDone = 8,   // server -> rank 0: the shard was written or loaded
  kKeepAlive = 9,   // rank 0 -> server: rank 0 lives; its parameter collection is still to come
};

// Body of kCheckpoint and kRestore.
struct ShardRequest {
  Iteration iteration = 0;
  std::string path;
  // kRestore: the size and CRC32C the manifest recorded (verified before loading).
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};
// Body of kShardDone.
struct ShardReply {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  int64_t rows = 0;
};
Bytes EncodeShardRequest(const ShardRequest& request);
absl::StatusOr<ShardRequest> DecodeShardRequest(const Bytes& bytes);
Bytes EncodeShardReply(const ShardReply& reply);
absl::StatusOr<ShardReply> DecodeShardReply(const Bytes& bytes);

Bytes EncodeFetchRequest(const FetchRequest& request);
absl::StatusOr<FetchRequest> DecodeFetchRequest(const Bytes& bytes);
Bytes EncodeFetchResponse(const FetchResponse& response);
absl::StatusOr<FetchResponse> DecodeFetchResponse(const Bytes& bytes);
Bytes EncodeWriteBack(const WriteBack& write_back);
absl::StatusOr<WriteBack> DecodeWriteBack(const Bytes& bytes);

// Control messages: a kind and an opaque body.
Bytes EncodeControl(ControlKind kind, const Bytes& body = {});
absl::Status DecodeControl(const Bytes& bytes, ControlKind* kind, Bytes* body);

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_PROTOCOL_H_
