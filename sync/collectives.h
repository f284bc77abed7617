// Collectives among a group of ranks over a Transport: the trainers' dense gradients on CPU
// ranks, and their loss sums and other small host-memory reductions everywhere. GPU trainers
// all-reduce their dense gradients with NCCL instead (sync/nccl_communicator.h, built with the
// CUDA backend, via Trainer::AllReduceDevice); its deterministic mode reproduces AllReduceSum
// bit for bit, and AllReduceSum remains the fallback when two trainers share a GPU.
//
// AllReduceSum is deterministic: the buffer is cut into one chunk per member; member c sums
// chunk c over the members in group order, starting from +0.0f (acc = 0; acc += x_0; acc +=
// x_1; ...), then every member receives every reduced chunk. The result is bit-identical on
// every member and from run to run, and independent of message timing.
#ifndef BAGPIPE_SYNC_COLLECTIVES_H_
#define BAGPIPE_SYNC_COLLECTIVES_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sync/transport.h"

namespace bagpipe {

struct Group {
  std::vector<int> ranks;  // members, in reduction order
  int me = 0;              // index of the calling rank in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
};

// In-place sum of `count` floats over the group. Every member must call it with the same
// count, in the same order relative to its other AllReduceSum calls (messages use kTagDense).
absl::Status AllReduceSum(Transport& transport, const Group& group, float* data, size_t count,
                          absl::Duration timeout);
// The same in double precision, e.g. for counters summed over trainers: doubles add integers
// exactly below 2^53 (floats only below 2^24).
absl::Status AllReduceSum(Transport& transport, const Group& group, double* data, size_t count,
                          absl::Duration timeout);

// Every member waits until all members reached the barrier.
absl::Status Barrier(Transport& transport, const Group& group, absl::Duration timeout);

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_COLLECTIVES_H_
