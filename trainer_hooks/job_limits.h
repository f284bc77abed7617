// Limits of a job that depend on the machine: options whose memory or time grows with their
// value whatever the data (the oracle's window with --lookahead, the threads of an embedded job
// with --servers and --trainers, an emulated link with --server-link) are checked against an
// estimate before the job starts and refused with the figure, instead of ending in bad_alloc,
// thousands of threads or a job that never finishes.
#ifndef BAGPIPE_TRAINER_HOOKS_JOB_LIMITS_H_
#define BAGPIPE_TRAINER_HOOKS_JOB_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sync/transport.h"

namespace bagpipe {

struct JobShape {
  int lookahead = 20;         // the planner's effective window (1 unless --cache oracle)
  int64_t batch_size = 1024;  // global
  int num_tables = 1;
  int num_dense = 0;
  // Sparse ids a sample carries over all its tables, where the data say (a synthetic spec's
  // pooling, a binary file's header, the scan of dictionary-encoded text); 0: one per table.
  double ids_per_sample = 0;
  int trainers = 1;
  int servers = 1;
  bool embedded = true;    // every role a thread of this process
  int record_floats = 16;  // floats a row travels with (values + optimizer state)
  int dim = 16;
  int64_t cache_rows = 0;     // per trainer (0: no cache)
  bool whole_tables = false;  // --cache device: cache_rows is every row of every table
  bool host_trainers = true;  // the trainers' caches and buffers are in host memory (CPU backend)
  LinkModel server_link;      // embedded only
  absl::Duration peer_timeout = absl::Seconds(120);
};

// Bytes of physical memory of this machine (0 when unknown).
int64_t PhysicalMemoryBytes();

// The oracle's window: memory that grows with --lookahead whatever the data (per window slot,
// every trainer's per-table bookkeeping and the batch itself in plan form: offsets, each id's
// unique index and each distinct row's records, counted as if every id were distinct).
int64_t EstimateWindowBytes(const JobShape& shape);

// The caches and per-batch buffers of the trainers this process hosts (all of them when
// embedded, else one): each trainer's cache (cache_rows records) and its pooled embeddings and
// their gradients (its share of the batch x tables x dim floats, twice).
int64_t EstimateTrainerBytes(const JobShape& shape);

// InvalidArgument naming the flag, its value and the estimate when the job cannot run on a
// machine with `memory_bytes` of memory (0: this machine's) or would never finish: the window
// above half the memory; the trainers' caches and per-batch buffers in host memory (embedded:
// all of them; else one trainer's) above half the memory; an embedded job with more role
// threads than it can use or memory can hold; an emulated link whose latency, or transfer time for
// one iteration's rows, reaches half the peer timeout (every receive would time out).
absl::Status CheckJobLimits(const JobShape& shape, int64_t memory_bytes = 0);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_JOB_LIMITS_H_
