// The background fetch pipeline of one trainer (docs/architecture.md).
//
// The trainer announces, in iteration order and ahead of time, which rows each iteration
// fills (Request). The prefetcher immediately sends one batched fetch per embedding server,
// and a receiver thread lands the responses in pinned host staging, copies each completed
// iteration to device staging on the context's copy stream, and marks it ready. At the
// iteration boundary the trainer takes the staging (Wait) and fills its cache slots from it;
// Release recycles the buffers. Memory is bounded by the number of iterations requested and not
// yet released (the caller bounds that: plans in flight).
//
// Errors (a server's DataLoss, a timeout because a server died, an abort elsewhere) are
// delivered to the trainer by Wait as a Status; nothing hangs: every wait has the peer timeout.
// Thread-safety: Request/Wait/Release are called from the trainer's threads (Request from the
// plan thread, Wait/Release from the training thread); stats() from any thread.
#ifndef BAGPIPE_PREFETCH_PREFETCHER_H_
#define BAGPIPE_PREFETCH_PREFETCHER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "core/types.h"
#include "sync/roles.h"
#include "sync/transport.h"

namespace bagpipe {

struct PrefetchStats {
  int64_t iterations = 0;
  int64_t requests = 0;     // fetch messages sent
  int64_t rows = 0;         // rows fetched
  int64_t bytes = 0;        // record bytes received
  double wait_seconds = 0;  // time Wait blocked the trainer (0 when the pipeline keeps up)
  double max_wait_seconds = 0;
};

class Prefetcher {
 public:
  Prefetcher(Transport& transport, JobLayout layout, int trainer,
             std::shared_ptr<DeviceContext> context, int record_floats,
             absl::Duration peer_timeout);
  // Stops the receiver thread. Outstanding requests are abandoned.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Fetches `rows` for `iteration` (each after its write-back stamp, see sync/protocol.h).
  // REQUIRES: iterations strictly increase across calls.
  absl::Status Request(Iteration iteration, const std::vector<RowId>& rows,
                       const std::vector<Iteration>& after_stamps);

  struct Staging {
    const float* device = nullptr;  // rows.size() records, request order, context memory
    int64_t rows = 0;
  };
  // Blocks until `iteration`'s rows are in device staging. REQUIRES: Request(iteration) was
  // called. The staging stays valid until Release(iteration).
  absl::StatusOr<Staging> Wait(Iteration iteration);
  void Release(Iteration iteration);

  PrefetchStats stats() const;

 private:
  struct Item;
  void ReceiveLoop();
  absl::Status HandleResponse(const Message& message);
  void FailAll(const absl::Status& status);

  Transport& transport_;
  const JobLayout layout_;
  const int trainer_;
  const std::shared_ptr<DeviceContext> context_;
  const int record_floats_;
  const absl::Duration peer_timeout_;

  // Guards the items, the request map, the error and the stats.
  mutable absl::Mutex mu_;
  std::map<Iteration, std::unique_ptr<Item>> items_ ABSL_GUARDED_BY(mu_);
  // Request id -> (iteration, server).
  absl::flat_hash_map<uint64_t, std::pair<Iteration, int>> requests_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  PrefetchStats stats_ ABSL_GUARDED_BY(mu_);
  // Freed staging buffers for reuse (host pinned, device), largest first is not needed.
  std::vector<std::unique_ptr<Item>> free_items_ ABSL_GUARDED_BY(mu_);
  std::thread receiver_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_PREFETCH_PREFETCHER_H_
