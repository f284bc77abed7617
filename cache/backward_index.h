// The transposed occurrence index one iteration's gradient reduce needs.
//
// The forward pass reads, per id occurrence j (table-major, as in data/batch.h), the row
// unique_index[j] of the iteration's unique rows (oracle/plan.h). The backward pass needs the
// opposite direction: for each unique row u, the occurrences that read it, in occurrence order,
// each with the pooled-output row it contributed to and its scale (cache/pooling.h). Build makes
// that CSR once per iteration on the host, in O(ids + bags + unique), then places it in the
// context's memory (device memory on CUDA, on the compute stream) for
// EmbeddingCache::ReduceGradients:
//   row_begin    [num_unique + 1]  occurrences of u are entries row_begin[u] .. row_begin[u+1]
//   pooled_rows  [num_ids]         sample-major pooled row s * num_tables + t of the occurrence
//   scales       [num_ids]         scale_j, or absent (nullptr) for unweighted sum pooling
//
// Not thread-safe. On CUDA, Build's uploads are queued on the compute stream: reduces queued
// on that stream with the previous contents finish before they are overwritten; a reduce
// queued on another stream must be ordered by the caller (DeviceContext::StreamWait). On a CPU
// context with asynchronous streams the host arrays serve the reduce, so Build first waits for
// the compute stream.
//
// A runtime that prepares batches ahead of time (trainer_hooks/) builds the same arrays into its
// own staging memory with BuildBackwardIndexInto, off the critical path, and hands their device
// copies to EmbeddingCache::ReduceGradients as a BackwardIndexView.
#ifndef BAGPIPE_CACHE_BACKWARD_INDEX_H_
#define BAGPIPE_CACHE_BACKWARD_INDEX_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/pooling.h"
#include "core/device.h"

namespace bagpipe {

// The index's arrays wherever they live (context memory when handed to ReduceGradients).
struct BackwardIndexView {
  const int64_t* row_begin = nullptr;    // num_unique + 1
  const int32_t* pooled_rows = nullptr;  // num_ids
  const float* scales = nullptr;         // num_ids, or nullptr for unweighted sum pooling
  int num_tables = 0;
  int num_samples = 0;
  int num_unique = 0;
  int64_t num_ids = 0;
};

// Builds the index of one local batch (inputs as BackwardIndex::Build) into host arrays the
// caller owns: row_begin [num_unique + 1], pooled_rows [num_ids] and, when pooling is kMean or
// `weights` is set, scales [num_ids] (else untouched, may be null). `cursor` is scratch (grown,
// kept by the caller to avoid allocating). Returns whether scales were written. Fails with
// InvalidArgument naming the first offending position; the outputs are then unspecified.
absl::StatusOr<bool> BuildBackwardIndexInto(const int64_t* offsets, int num_tables, int num_samples,
                                            const uint32_t* unique_index, int64_t num_ids,
                                            int num_unique, PoolingMode pooling,
                                            const float* weights, int64_t* row_begin,
                                            int32_t* pooled_rows, float* scales,
                                            std::vector<int64_t>* cursor);

class BackwardIndex {
 public:
  BackwardIndex() = default;
  BackwardIndex(BackwardIndex&&) = default;
  BackwardIndex& operator=(BackwardIndex&&) = default;

  // Builds the index of one local batch. Host inputs: `offsets` (num_tables * num_samples + 1
  // entries, table-major CSR with offsets[0] = 0 and offsets[last] = num_ids), `unique_index`
  // (num_ids entries, each < num_unique), `weights` (num_ids per-occurrence weights, or nullptr).
  // Fails with InvalidArgument (and leaves the index empty) when the inputs are inconsistent:
  // the message names the first offending position.
  absl::Status Build(const std::shared_ptr<DeviceContext>& context, const int64_t* offsets,
                     int num_tables, int num_samples, const uint32_t* unique_index, int64_t num_ids,
                     int num_unique, PoolingMode pooling = PoolingMode::kSum,
                     const float* weights = nullptr);

  bool built() const { return context_ != nullptr; }
  Backend backend() const { return context_ ? context_->backend() : Backend::kCpu; }
  int num_tables() const { return num_tables_; }
  int num_samples() const { return num_samples_; }
  int num_unique() const { return num_unique_; }
  int64_t num_ids() const { return num_ids_; }
  bool has_scales() const { return has_scales_; }

  // The index on the host (always available after Build).
  const std::vector<int64_t>& host_row_begin() const { return host_row_begin_; }
  const std::vector<int32_t>& host_pooled_rows() const { return host_pooled_rows_; }
  const std::vector<float>& host_scales() const { return host_scales_; }

  // The index in the context's memory (the host vectors on CPU). scales() is nullptr when
  // !has_scales(). Valid until the next Build.
  const int64_t* row_begin() const;
  const int32_t* pooled_rows() const;
  const float* scales() const;
  // The device arrays and shape, for EmbeddingCache::ReduceGradients.
  BackwardIndexView view() const;

 private:
  absl::Status Upload();
  void Clear();

  std::shared_ptr<DeviceContext> context_;
  int num_tables_ = 0;
  int num_samples_ = 0;
  int num_unique_ = 0;
  int64_t num_ids_ = 0;
  bool has_scales_ = false;
  std::vector<int64_t> host_row_begin_;
  std::vector<int32_t> host_pooled_rows_;
  std::vector<float> host_scales_;
  // CUDA copies in device_context_'s memory; they only grow, so steady-state iterations
  // allocate nothing.
  std::shared_ptr<DeviceContext> device_context_;
  DeviceArray<int64_t> device_row_begin_;
  DeviceArray<int32_t> device_pooled_rows_;
  DeviceArray<float> device_scales_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CACHE_BACKWARD_INDEX_H_
