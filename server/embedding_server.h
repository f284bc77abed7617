// One embedding server: owns the rows hashed to it (sync/protocol.h ServerOfRow) with their
// optimizer state, serves batched fetches and applies batched write-backs.
//
// Read-after-write: a fetch is served only when, for each row, the write-back the oracle named
// (`after_stamps`) has been applied, and every trainer's watermark (the stamp of its latest
// write-back message, sent at every boundary) has reached `iteration - horizon` — so a fetch
// never reads a row older than a write-back planned before it, even one the oracle no longer
// remembers. Fetches that are not ready wait in arrival order and are re-checked as
// write-backs arrive; no request is ever answered stale.
//
// EmbeddingServer is the message handler (not thread-safe: one thread drives it); RunServer is
// the loop a server rank or thread runs over a Transport until every trainer is done and the
// collector says stop.
#ifndef BAGPIPE_SERVER_EMBEDDING_SERVER_H_
#define BAGPIPE_SERVER_EMBEDDING_SERVER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/row_init.h"
#include "server/row_store.h"
#include "sync/protocol.h"
#include "sync/roles.h"
#include "sync/transport.h"

namespace bagpipe {

struct ServerOptions {
  RowInitializer initializer;
  // Fetches for iteration f also wait until every trainer's watermark is >= f - horizon.
  int64_t writeback_horizon = 1 << 30;
  absl::Duration peer_timeout = absl::Seconds(120);
  // Polled between messages: non-zero (a signal number) once this process was asked to stop;
  // the server then asks the oracle (rank 0) to stop the job at an iteration boundary. May be
  // empty.
  std::function<int()> stop_requested;
};

struct ServerStats {
  int64_t fetch_requests = 0;
  int64_t rows_fetched = 0;
  int64_t write_back_messages = 0;
  int64_t rows_written_back = 0;
  int64_t deferred_fetches = 0;  // requests that had to wait for a write-back
  int64_t rows_stored = 0;
  double bytes_per_row = 0;
};

class EmbeddingServer {
 public:
  EmbeddingServer(ServerOptions options, int num_trainers);

  // Applies a write-back from `trainer` and raises its watermark. Write-back stamps of a row
  // must increase (else DataLoss: a protocol violation).
  absl::Status HandleWriteBack(int trainer, const WriteBack& write_back);
  // Queues a fetch from `trainer`; it is answered by TakeReady once ready.
  void HandleFetch(int trainer, FetchRequest request);
  // Removes and returns (trainer, response) for every queued fetch that is now ready, in
  // arrival order per trainer.
  std::vector<std::pair<int, FetchResponse>> TakeReady();
  // True once every trainer's watermark is at least `iteration`.
  bool WatermarksReach(Iteration iteration) const;
  // A resumed job: every trainer's write-backs before `iteration` are in (the checkpoint).
  void ResumeAt(Iteration iteration);
  // Requests still waiting (for diagnostics).
  size_t waiting() const { return waiting_.size(); }
  // What the oldest waiting request waits for, for diagnostics: "" when none waits, else e.g.
  // "the oldest, trainer 1's for iteration 5, waits for the write-backs of trainer 0 (in up to
  // iteration 1, needed up to 3)".
  std::string OldestWait() const;

  const RowStore& store() const { return store_; }
  RowStore& mutable_store() { return store_; }
  ServerStats stats() const;

 private:
  struct Waiting {
    int trainer;
    FetchRequest request;
    size_t ready_prefix = 0;  // rows [0, ready_prefix) are known ready (stamps only grow)
    bool counted_deferred = false;
  };
  bool Ready(Waiting& waiting);

  ServerOptions options_;
  RowStore store_;
  std::vector<Iteration> watermarks_;  // per trainer, -1 before its first write-back
  std::deque<Waiting> waiting_;
  ServerStats stats_;
};

// Serves requests on `transport` as server `server_index` of `layout` until every trainer has
// sent kDone and a collector (any rank) has sent kStop; answers kCollect by streaming its rows
// (sorted by RowId) back. Checkpoints (server/shard_file.h): on kCheckpoint it writes its shard
// once every trainer's write-backs up to the checkpoint's iteration are in, on kRestore (before
// any fetch) it loads one; both are answered with kShardDone, and a failure aborts the job. Returns
// an error (and aborts the job) on a protocol violation or when no message arrives within
// options.peer_timeout while trainers are still running.
absl::Status RunServer(Transport& transport, const JobLayout& layout, int server_index,
                       const ServerOptions& options, ServerStats* stats = nullptr);

// Parameter collection, run by one rank after training: asks every server for its rows and
// calls fn(row, record) in increasing RowId order across all servers (a k-way merge).
// Then tells every server to stop.
absl::Status CollectRows(Transport& transport, const JobLayout& layout, int record_floats,
                         absl::Duration timeout,
                         const std::function<void(RowId, const float*)>& fn);

}  // namespace bagpipe

#endif  // BAGPIPE_SERVER_EMBEDDING_SERVER_H_
