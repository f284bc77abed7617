// The slot-addressed embedding cache of one trainer: a dense store of `capacity` rows of `dim`
// floats plus their optimizer state, addressed by slot (docs/architecture.md).
//
// The cache knows nothing of plans, servers or communication: the oracle decides which row
// lives in which slot, and the runtime moves rows in (Fill) and out (Extract) at iteration
// boundaries. Per iteration the trainer pools its bags from slots (Gather), reduces the pooled
// gradient to one gradient per unique row (ReduceGradients, with a BackwardIndex) and applies
// the optimizer to the slots (Apply). Storage lives in the DeviceContext's memory: values
// [capacity x dim] and state [capacity x StateFloatsPerRow(optimizer, dim)] (SGD: none;
// Adagrad: dim floats per row; row-wise Adagrad: 1 float per row).
//
// A row "record" (what travels to and from the servers and through staging) is the row's dim
// values followed by its state floats: RecordFloats(optimizer, dim) floats (core/optimizer.h).
//
// Numerics. Every result is a fixed sequence of float operations (cache/pooling.h for pooling,
// cache/cache_math.h for the optimizers): no atomics, no order that depends on threads or
// launch shapes. The CPU backend (TBB) is the reference; the CUDA backend performs the same
// operations in the same order, so both are bit-reproducible run to run and agree with each
// other. Sums start from +0.0f, so they are never -0.0f.
//
// Pointers. Every pointer argument is in the context's memory: host memory for a CPU context,
// device memory for a CUDA context (except where a method says "host"). Operations are queued on
// the named stream (default Stream::kCompute); on an asynchronous context (CUDA, or a CPU
// context with asynchronous streams) they return before they complete: the caller orders
// streams (DeviceContext::StreamWait, StreamWaitEvent) and keeps inputs alive until the stream
// has passed them. On a synchronous CPU context they complete before returning.
//
// Validation. Public methods check their arguments (slots in [0, capacity), distinct where
// required, offsets non-decreasing, ...) and fail with InvalidArgument naming the first
// offending position. The checks are O(n); on an asynchronous context they copy the index arrays
// to the host and synchronise the stream, so by default (Validation::kAuto) they run on
// synchronous CPU contexts only; the oracle guarantees valid slots on the hot path. Invalid input
// with validation off is undefined behaviour.
//
// Thread-safety: not internally synchronised. Concurrent calls are safe only when they touch
// disjoint slots and outputs and the caller orders them (e.g. a Fill on the copy stream of
// slots no queued Gather reads). stats() may be used from any thread.
#ifndef BAGPIPE_CACHE_EMBEDDING_CACHE_H_
#define BAGPIPE_CACHE_EMBEDDING_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache/backward_index.h"
#include "cache/cache_stats.h"
#include "cache/pooling.h"
#include "core/device.h"
#include "core/optimizer.h"
#include "core/row_init.h"
#include "core/types.h"

namespace bagpipe {

namespace internal {
class CacheBackend;
}  // namespace internal

enum class Validation {
  kAuto,  // validate on synchronous CPU contexts (cheap), not on asynchronous ones (would
          // synchronise)
  kOn,    // always validate (asynchronous contexts: copies index arrays to the host and
          // synchronises)
  kOff,   // never validate
};

struct CacheOptions {
  Validation validation = Validation::kAuto;
};

struct GatherOptions {
  PoolingMode pooling = PoolingMode::kSum;
  // Per-occurrence weights (one per slot entry), or nullptr for unweighted pooling.
  const float* weights = nullptr;
  Stream stream = Stream::kCompute;
};

class EmbeddingCache {
 public:
  // A cache of `capacity` slots of `dim` values with `optimizer`'s state, zero-filled.
  // Fails with InvalidArgument for a capacity outside [1, 2^31 - 1] (SlotId range), dim < 1, a
  // negative or non-finite learning rate, or (Adagrad kinds) eps not > 0; with
  // ResourceExhausted (or the CUDA error) when memory runs out.
  static absl::StatusOr<std::unique_ptr<EmbeddingCache>> Create(
      std::shared_ptr<DeviceContext> context, int64_t capacity, int dim,
      const OptimizerConfig& optimizer, const CacheOptions& options = {});
  ~EmbeddingCache();
  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;

  const std::shared_ptr<DeviceContext>& context() const { return context_; }
  int64_t capacity() const { return capacity_; }
  int dim() const { return dim_; }
  int state_floats() const { return state_floats_; }
  int record_floats() const { return dim_ + state_floats_; }
  const OptimizerConfig& optimizer() const { return optimizer_; }
  // Learning rate of later Apply calls (schedules). REQUIRES: rate > 0.
  absl::Status set_learning_rate(float rate);
  bool validating() const;
  void set_validation(Validation validation) { validation_ = validation; }
  // Bytes of storage held (values + state).
  size_t bytes() const;

  // Raw storage in the context's memory, for zero-copy consumers (e.g. a model reading rows of
  // a `device`-mode cache): values()[slot * dim + c], state()[slot * state_floats + k].
  // state() is nullptr for SGD. Valid for the cache's life.
  float* values() { return values_.data(); }
  const float* values() const { return values_.data(); }
  float* state() { return state_.data(); }
  const float* state() const { return state_.data(); }

  CacheStats& stats() { return stats_; }
  const CacheStats& stats() const { return stats_; }

  // Embedding-bag forward over slots. Bag b = t * num_samples + s of table t and sample s holds
  // the occurrences j in [offsets[b], offsets[b + 1]) (table-major CSR, data/batch.h), reading
  // the row in slots[j]. Writes pooled[(s * num_tables + t) * dim + c] (sample-major) as
  // cache/pooling.h defines; empty bags give zeros.
  // REQUIRES: offsets has num_tables * num_samples + 1 entries, offsets[0] = 0, non-decreasing;
  // slots (and weights) have offsets[last] entries; pooled has num_samples * num_tables * dim.
  absl::Status Gather(const SlotId* slots, const int64_t* offsets, int num_tables, int num_samples,
                      float* pooled, const GatherOptions& options = {});

  // Gradient reduce by unique row: row_grads[u * dim + c] = sum over u's occurrences j in
  // occurrence order, from +0.0f, of scale_j * pooled_grad[pooled_row(j) * dim + c].
  // `index` must have been built for this cache's backend (its pooling must match the forward's).
  // REQUIRES: pooled_grad has index.num_samples() * index.num_tables() rows of dim floats;
  // row_grads has index.num_unique() rows.
  absl::Status ReduceGradients(const BackwardIndex& index, const float* pooled_grad,
                               float* row_grads, Stream stream = Stream::kCompute);
  // The same with the index's arrays in the context's memory, e.g. built ahead of time with
  // BuildBackwardIndexInto and copied to the device (not validated: the caller built them).
  absl::Status ReduceGradients(const BackwardIndexView& index, const float* pooled_grad,
                               float* row_grads, Stream stream = Stream::kCompute);

  // Fused optimizer step (cache/cache_math.h formulas) on n (slot, gradient) pairs: slot
  // slots[k] is updated with gradient row k of `grads` (n x dim).
  // REQUIRES: the n slots are distinct (each row is updated once per call).
  absl::Status Apply(const SlotId* slots, const float* grads, int64_t n,
                     Stream stream = Stream::kCompute);
  // As Apply, with gradient row grad_rows[k] for slots[k] (grads has max(grad_rows) + 1 rows).
  absl::Status ApplyIndexed(const SlotId* slots, const int32_t* grad_rows, const float* grads,
                            int64_t n, Stream stream = Stream::kCompute);

  // Writes record k of `records` (n x record_floats()) into slot slots[k].
  // REQUIRES: distinct slots.
  absl::Status Fill(const SlotId* slots, const float* records, int64_t n,
                    Stream stream = Stream::kCompute);
  // Copies slot slots[k] into record k of `records` (n x record_floats()). Slots may repeat.
  absl::Status Extract(const SlotId* slots, int64_t n, float* records,
                       Stream stream = Stream::kCompute);

  // Sets slots first_slot .. first_slot + count - 1 to the initial records of RowIds
  // first_row .. first_row + count - 1 (core/row_init.h: values from (seed, RowId, column),
  // state = the initializer's accumulator), bit-identical to RowInitializer::Init on every
  // backend. Synchronises `stream`.
  // REQUIRES: initializer.dim() == dim(), initializer.record_floats() == record_floats(), and
  // the RowIds lie within the initializer's tables.
  absl::Status InitializeRows(const RowInitializer& initializer, int64_t first_slot, int64_t count,
                              RowId first_row, Stream stream = Stream::kCompute);
  // `device` mode: slot = RowId for slots first_slot .. first_slot + count - 1.
  absl::Status InitializeRows(const RowInitializer& initializer, int64_t first_slot, int64_t count,
                              Stream stream = Stream::kCompute) {
    return InitializeRows(initializer, first_slot, count, static_cast<RowId>(first_slot), stream);
  }

  // Host accessors for tests and checkpoints (synchronous; always validated). `slots` and the
  // records are host memory; records are record_floats() floats per slot.
  absl::StatusOr<std::vector<float>> ReadRecords(absl::Span<const SlotId> slots) const;
  absl::Status WriteRecords(absl::Span<const SlotId> slots, absl::Span<const float> records);

 private:
  EmbeddingCache(std::shared_ptr<DeviceContext> context, int64_t capacity, int dim,
                 const OptimizerConfig& optimizer, const CacheOptions& options);

  // Host copies of `count` elements at `pointer` in the context's memory (copied and
  // synchronised on `stream` for CUDA).
  template <typename T>
  absl::StatusOr<std::vector<T>> ToHost(const T* pointer, int64_t count, Stream stream) const;
  // Checks slots[0 .. n) (host) lie in [0, capacity) and, if `distinct`, do not repeat.
  absl::Status CheckSlots(const char* op, const SlotId* slots, int64_t n, bool distinct) const;
  absl::Status ValidateSlots(const char* op, const SlotId* slots, int64_t n, bool distinct,
                             Stream stream) const;

  const std::shared_ptr<DeviceContext> context_;
  const int64_t capacity_;
  const int dim_;
  const int state_floats_;
  OptimizerConfig optimizer_;
  Validation validation_;
  DeviceArray<float> values_;
  DeviceArray<float> state_;
  std::unique_ptr<internal::CacheBackend> backend_;
  mutable CacheStats stats_;
  // Distinctness check scratch: mark_[slot] == mark_epoch_ means "seen in this check".
  mutable std::vector<uint32_t> mark_;
  mutable uint32_t mark_epoch_ = 0;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CACHE_EMBEDDING_CACHE_H_
