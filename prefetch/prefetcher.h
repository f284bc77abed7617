// The background fetch pipeline of one trainer (docs/architecture.md).
//
// The trainer announces, in iteration order and ahead of time, which rows each iteration
// fills (Request). The prefetcher immediately sends one batched fetch per embedding server,
// and a receiver thread lands the responses in pinned host staging, queues the copy of each
// completed iteration to device staging on the context's copy stream, records an event after
// it and marks the iteration ready; no thread waits for the copy. At the iteration boundary the
// trainer takes the staging (Wait), makes its stream wait for the event, queues the fill of its
// cache slots, and hands the buffers back (Release) with the stream that reads them: before the
// next copy into that device staging, the copy stream waits for that stream's reads, and before
// the receiver writes the host staging again, the copy out of it has run. On a synchronous CPU
// context the host staging serves as device staging and the events are no-ops. Memory is
// bounded by the number of iterations requested and not yet released (the caller bounds that:
// plans in flight); buffers are recycled, so steady-state iterations allocate nothing.
//
// Errors (a server's DataLoss, a timeout because a server died, an abort elsewhere) are
// delivered to the trainer by Wait as a Status; nothing hangs: every wait has the peer timeout.
// Thread-safety: Request/Wait/Release are called from the trainer's threads (Request from the
// plan thread, Wait/Release from the training thread), each of which made the context current;
// stats() from any thread.
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
  int64_t max_in_flight = 0;  // most iterations requested and not yet released at once
};

class Prefetcher {
 public:
  // `buffers`: iterations the caller keeps requested and not yet released (the staging buffers
  // made at the first request, so that no buffer is added in the steady state).
  Prefetcher(Transport& transport, JobLayout layout, int trainer,
             std::shared_ptr<DeviceContext> context, int record_floats, absl::Duration peer_timeout,
             int buffers = 1);
  // Stops the receiver thread. Outstanding requests are abandoned.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Fetches `rows` for `iteration` (each after its write-back stamp, see sync/protocol.h). A
  // staging buffer that must grow grows to hold at least `room` rows (the caller's bound on
  // later requests, e.g. twice a batch's distinct rows), so that buffers stop growing once the
  // first iterations were seen. REQUIRES: iterations strictly increase across calls.
  absl::Status Request(Iteration iteration, const std::vector<RowId>& rows,
                       const std::vector<Iteration>& after_stamps, int64_t room = 0);

  struct Staging {
    const float* device = nullptr;  // rows.size() records, request order, context memory
    int64_t rows = 0;
    // Recorded on the copy stream after the copy into `device`: a stream reading `device` must
    // wait for it (DeviceContext::StreamWaitEvent). Valid until Release.
    const DeviceEvent* ready = nullptr;
  };
  // Blocks until `iteration`'s rows have arrived and their copy to device staging is queued.
  // REQUIRES: Request(iteration) was called. The staging stays valid until Release(iteration).
  absl::StatusOr<Staging> Wait(Iteration iteration);
  // Recycles `iteration`'s buffers once the work queued so far on `reader` (the stream that reads
  // the staging) has run. Unknown iterations are ignored.
  absl::Status Release(Iteration iteration, Stream reader = Stream::kCompute);

  PrefetchStats stats() const;

 private:
  struct Item;
  // Gives `item` new (empty) buffers for `rows` records or more.
  absl::Status Grow(Item& item, int64_t rows);
  void ReceiveLoop();
  absl::Status HandleResponse(const Message& message);
  void FailAll(const absl::Status& status);
  // Why a server may not answer: the trainers whose part of a dense all-reduce waits here, which
  // this trainer has not joined (they wait for it, and the servers for their rows), or else
  // "that server died or hung".
  std::string UnjoinedAllReduce();

  Transport& transport_;
  const JobLayout layout_;
  const int trainer_;
  const std::shared_ptr<DeviceContext> context_;
  const int record_floats_;
  const absl::Duration peer_timeout_;
  const int buffers_;
  bool made_buffers_ = false;  // Request's thread only

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
