// The trainer hooks: the C++ API a training loop calls (docs/architecture.md).
//
// A loop over one trainer's iterations looks like this (the reference DLRM in model/ is one):
//
//   LocalBatch batch;
//   while (true) {
//     ASSIGN_OR_RETURN(bool more, trainer.BeginIteration(&batch));  // data + rows are ready
//     if (!more) break;
//     ASSIGN_OR_RETURN(const float* pooled, trainer.LookupPooled()); // [n x tables x dim]
//     ... forward/backward of the dense model: pooled -> loss, d(loss)/d(pooled) ...
//     RETURN_IF_ERROR(trainer.AllReduce(dense_grads, count));        // dense data parallelism
//     RETURN_IF_ERROR(trainer.EndIteration(pooled_grad));            // sparse sync + update
//   }
//   RETURN_IF_ERROR(trainer.Flush());                                // every row back home
//
// BeginIteration waits for the iteration's plan and prefetched rows (the wait is measured:
// ~0 when the prefetcher keeps up), then runs the boundary: completes background gradient
// exchanges due now, extracts evicted/flushed rows and writes them back, fills slots from
// staging. The local batch's sparse ids arrive already turned into cache slots.
// EndIteration reduces d(loss)/d(pooled) to one gradient per unique row (fixed order), exchanges
// gradients of shared rows with the peers holding them, and applies the sparse optimizer to
// every held replica. The same calls run every cache mode (oracle, lru, lfu, off, device).
//
// Loss scaling contract: gradients handed to EndIteration and AllReduce must be those of
// (sum of the trainer's per-sample losses) / global_batch_size, so that summing over trainers
// gives the gradient of the global mean loss, for sparse and dense parameters alike.
//
// Device contract (what a loop on a GPU, e.g. PyTorch's, may rely on):
//  - A trainer queues its device work on its context's compute stream. What BeginIteration
//    hands out (the LocalBatch arrays) and what LookupPooled returns are ready in stream order on
//    that compute stream and stay valid until the next BeginIteration.
//  - The runtime reads `pooled_grad` (EndIteration), `row_grads` (EndIterationWithRowGradients)
//    and the AllReduceDevice buffer (which it also writes) asynchronously, in compute-stream
//    order; LookupPooledInto writes the caller's buffer the same way. The caller keeps these
//    buffers alive and unmodified until then: work it queues afterwards on the compute stream
//    (or, with SetExternalStream, on its own stream), including what the next BeginIteration or
//    Flush queues, is ordered after those accesses; the host itself must wait for the compute
//    stream (context()->Synchronize() or a DeviceEvent) before it frees, rewrites or reads such a
//    buffer. Nothing here blocks the host: an iteration queues without host synchronisation.
//  - A caller computing on another stream (PyTorch's current CUDA stream) registers it with
//    SetExternalStream. Then BeginIteration, BeginEvalBatch and LookupPooled(Into) make that
//    stream wait (an event) for the batch and the pooled embeddings; EndIteration(...),
//    LookupPooledInto and AllReduceDevice make the compute stream wait for the work queued so far
//    on the external stream before they read or write the caller's buffer and, after queueing
//    their last access to it, make the external stream wait for it — so a stream-ordered
//    allocator (PyTorch's caching allocator) cannot hand the caller's freed buffer out again
//    before the runtime is done with it.
//  - CPU: with the default synchronous streams every call has finished its work when it
//    returns, so all of this holds trivially; with asynchronous CPU streams (core/device.h) the
//    compute stream is an executor thread, and a loop computing on the host waits for it as
//    above (the Python package does).
//
// Thread-safety: a Trainer is driven by one thread at a time (it runs its own background
// threads internally); the thread makes the trainer's device current first
// (context()->MakeCurrent()).
#ifndef BAGPIPE_TRAINER_HOOKS_TRAINER_H_
#define BAGPIPE_TRAINER_HOOKS_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/optimizer.h"
#include "core/row_init.h"
#include "core/types.h"
#include "nlohmann/json.hpp"
#include "oracle/planner.h"
#include "sync/roles.h"
#include "sync/transport.h"

namespace bagpipe {

class EmbeddingCache;
class ExternalStream;

struct TrainerOptions {
  int dim = 16;
  OptimizerConfig sparse_optimizer;
  CachePolicy policy = CachePolicy::kOracle;
  // Rows the cache holds (kDevice: ignored, the whole tables).
  int64_t cache_rows = 0;
  // Plans (and their prefetches) in flight ahead of the iteration being trained: the plan
  // thread stages each plan's arrays for the device and requests its rows up to
  // prefetch_depth + 1 iterations ahead (its staging ring holds prefetch_depth + 2 plans).
  int prefetch_depth = 4;
  bool deterministic = true;
  absl::Duration peer_timeout = absl::Seconds(120);
  // Row initialisation (also the table sizes, for kDevice).
  RowInitializer initializer;
  // Polled at every BeginIteration: non-zero (a signal number) once this process was asked to
  // stop; the trainer then asks the oracle (rank 0) to stop the job at an iteration boundary
  // (trainer_hooks/checkpoint.h). May be empty.
  std::function<int()> stop_requested;
};

// The training loop's own part of a checkpoint (trainer_hooks/checkpoint.h): whatever the
// trainer does not hold — the dense parameters, the dense optimizer state, the loop's counters —
// as bytes the loop defines. Every trainer holds the same dense replica, so trainer 0's is
// saved and every trainer restores it.
struct LoopState {
  // Called on trainer 0 at the boundary of each checkpoint's iteration (after the iterations
  // before it, before the next). Must not call the trainer.
  std::function<absl::StatusOr<std::string>()> save;
  // Called on every trainer of a resumed job with what `save` returned, before the first
  // iteration.
  std::function<absl::Status(std::string_view state)> restore;
};

// The current iteration's inputs. Pointers are in the trainer's device memory (host memory for
// the CPU backend) and stay valid until the next BeginIteration.
struct LocalBatch {
  Iteration iteration = 0;
  int num_samples = 0;
  int num_dense = 0;
  int num_tables = 0;
  int64_t global_batch_size = 0;  // samples of all trainers at this iteration
  const float* dense = nullptr;   // [num_samples x num_dense]
  const float* labels = nullptr;  // [num_samples]
  const float* labels_host = nullptr;
  const int64_t* offsets = nullptr;  // table-major CSR, num_tables * num_samples + 1
  const int32_t* slots = nullptr;    // cache slot of every id occurrence
  int64_t num_ids = 0;
  int num_unique = 0;
  const int32_t* unique_slots = nullptr;    // the slot of each distinct row of the batch
  const RowId* unique_rows_host = nullptr;  // and its RowId
};

struct TrainerStats {
  int64_t iterations = 0;
  int64_t ids = 0;
  int64_t unique_rows = 0;
  int64_t hits = 0;   // unique rows already resident
  int64_t fills = 0;  // rows fetched into the cache
  int64_t evictions = 0;
  int64_t write_backs = 0;  // rows sent to servers (evictions and flushes)
  int64_t flushes = 0;
  int64_t shared_rows = 0;     // shared-row updates applied
  int64_t exchanged_rows = 0;  // gradient rows sent to peers
  int64_t exchanged_bytes = 0;
  int64_t fetched_bytes = 0;
  int64_t written_back_bytes = 0;
  int64_t prefetch_max_in_flight = 0;  // most iterations requested and not yet filled at once
  // Seconds spent in each phase, summed over iterations. The device phases (boundary, lookup,
  // reduce, apply) are measured with events on the compute stream (GPU time on CUDA) and are
  // complete once the stream has passed them (after Flush, for every iteration); wait and sync
  // are host time.
  double wait_seconds = 0;        // waiting for plans and prefetched rows
  double boundary_seconds = 0;    // extract, queue the write-back, fill
  double lookup_seconds = 0;      // pooled gather
  double reduce_seconds = 0;      // row-gradient reduction
  double sync_seconds = 0;        // shared-row gradient exchange on the critical path
  double apply_seconds = 0;       // sparse optimizer
  double allreduce_seconds = 0;   // dense all-reduce (host time)
  int64_t checkpoints = 0;        // consistent cuts taken (trainer_hooks/checkpoint.h)
  double checkpoint_seconds = 0;  // draining the cache at them and waiting for the checkpoint
  // Host synchronisations (DeviceContext counters) by the training thread during training
  // iterations, the loop's own included (e.g. reading the loss), and the most in one iteration
  // among those that allocated no memory; iterations in which the trainer's device context
  // allocated memory (buffers growing; none is expected once the first batches are seen) and
  // the last of them (-1: none).
  int64_t host_syncs = 0;
  int64_t max_iteration_host_syncs = 0;
  int64_t growth_iterations = 0;
  int64_t last_growth_iteration = -1;
  // The path of the dense all-reduce (AllReduceDevice): "nccl", "transport" (CPU backend:
  // the Transport all-reduce, MPI or in-process), "transport-via-host" (CUDA, NCCL unusable),
  // "none" (one trainer), or empty when the loop never called AllReduceDevice.
  std::string dense_allreduce;
  nlohmann::json ToJson() const;
  double hit_rate() const { return unique_rows > 0 ? static_cast<double>(hits) / unique_rows : 0; }
};

class Trainer {
 public:
  // Connects trainer `trainer` of `layout` to its transport, allocates its cache on `context`
  // and starts its background threads (plan receiver, prefetcher).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Transport& transport, JobLayout layout,
                                                         int trainer,
                                                         std::shared_ptr<DeviceContext> context,
                                                         const TrainerOptions& options);
  ~Trainer();

  int id() const;
  int num_trainers() const;

  // Registers the loop's checkpoint state; call it before the first BeginIteration. Waits until
  // the job starts (a resumed job starts once every server has loaded its shard) and, when the
  // job resumes from a checkpoint, restores the loop's state through state.restore. A loop that
  // keeps no state of its own need not call it (its checkpoints then hold an empty state).
  absl::Status SetLoopState(LoopState state);
  // The first iteration this job trains: 0, or the checkpoint's iteration when it resumed
  // (LocalBatch::iteration counts on from there). Waits for the job's start as SetLoopState.
  absl::StatusOr<Iteration> FirstIteration();
  const std::shared_ptr<DeviceContext>& context() const;

  // Waits for the next iteration and prepares it (see the file comment). Returns false when the
  // training stream has ended. Every pointer argument below must be non-null where it is read
  // (INVALID_ARGUMENT otherwise; an all-reduce of count 0 reads nothing).
  absl::StatusOr<bool> BeginIteration(LocalBatch* batch);
  // Pooled (sum) embeddings of the current batch, [num_samples x num_tables x dim], in memory
  // owned by the trainer (valid until the next BeginIteration).
  absl::StatusOr<const float*> LookupPooled();
  // The same, written to the caller's `pooled` (num_samples * num_tables * dim floats in the
  // trainer's device memory), e.g. a tensor the caller's framework owns.
  absl::Status LookupPooledInto(float* pooled);
  // Ends the iteration with d(loss)/d(pooled) [num_samples x num_tables x dim].
  absl::Status EndIteration(const float* pooled_grad);
  // Ends the iteration with one gradient row per unique row, [num_unique x dim] in device memory
  // (row u is the gradient of unique_slots[u]), for loops that compute them themselves.
  absl::Status EndIterationWithRowGradients(const float* row_grads);
  // Deterministic in-place sum over all trainers of `count` floats in HOST memory.
  absl::Status AllReduce(float* data, size_t count);
  // The same in double precision: loss sums and counters (exact for integers below 2^53).
  absl::Status AllReduce(double* data, size_t count);
  // In-place sum over all trainers of `count` floats in the trainer's device memory (host memory
  // on the CPU backend): the dense gradients. Every trainer calls it with the same count, in the
  // same order. CPU: AllReduce. CUDA with more than one trainer: NCCL
  // (sync/nccl_communicator.h), set up at the first call; with options.deterministic the result
  // is bit-identical to AllReduce's on the same inputs, otherwise NCCL's own sum. When two
  // trainers share a GPU (NCCL refuses that) the data go through host memory and AllReduce.
  // One trainer: nothing to do. Which path ran is stats().dense_allreduce.
  absl::Status AllReduceDevice(float* data, size_t count);
  // After the last iteration: writes every dirty cached row back to the servers (the oracle's
  // drain plan) and tells the servers and the oracle this trainer is done with training.
  absl::Status Flush();

  // Evaluation batches (after Flush): the oracle's evaluation shards, with rows read from the
  // servers. Returns false when there are no more. `batch->slots` index a scratch table whose
  // pooled embeddings LookupPooled returns, as in training.
  absl::StatusOr<bool> BeginEvalBatch(LocalBatch* batch);

  // Registers the stream the caller computes on (a cudaStream_t on the trainer's device;
  // nullptr: none, the default): see the device contract above. CPU: only nullptr is accepted.
  // The legacy default stream (PyTorch's default stream, which it reports as 0) is
  // cudaStreamLegacy, not nullptr.
  absl::Status SetExternalStream(void* stream);

  EmbeddingCache& cache();
  TrainerStats stats() const;

  // Job::CompleteTrainer calls it once the trainer's part is over: a later all-reduce fails at
  // once (FAILED_PRECONDITION) rather than waiting --peer-timeout for members that are gone.
  void MarkCompleted();

 private:
  class Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<ExternalStream> external_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_TRAINER_H_
