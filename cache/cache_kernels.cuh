// CUDA-only: launchers of the cache kernels (cache_kernels_cuda.cu), used by the CUDA backend.
//
// Every kernel assigns one output row to a "group" of 1..32 consecutive threads of a warp
// (a whole warp for row-wise Adagrad), computes it in the fixed order of the CPU reference
// (cache/cache_math.h, cache/pooling.h) and never uses atomics; grids are grid-stride loops
// capped at a few waves. Rows are read and written as float4 when the row length and the
// pointers allow it (row length % 4 == 0, 16-byte alignment), else as floats; both give the
// same bits. Launchers return the launch error (CUDA_RETURN_IF_LAUNCH_ERROR) and do nothing for
// empty inputs. All pointers are device pointers; work is queued on `stream`.
#ifndef BAGPIPE_CACHE_CACHE_KERNELS_CUH_
#define BAGPIPE_CACHE_CACHE_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "core/optimizer.h"

namespace bagpipe::cache_kernels {

struct Storage {
  float* values;
  float* state;
  int dim;
  int state_floats;
};

// Gather (kBags): segment b = bag t * num_samples + s, entries are slots into `source` rows,
// output row s * num_tables + t. Reduce: segment u = unique row, entries are pooled rows,
// output row u. `entry_scales` may be nullptr (all 1); `mean` multiplies by BagMultiplier.
// `chunked` (the reduce) sums in cache_math's chunked reduce order: a segment of more than
// kReduceChunk entries is summed by a whole block, its chunks in parallel; otherwise every
// segment is the plain in-order sum.
struct SegmentSumArgs {
  const float* source;
  int dim;
  const int64_t* segment_begin;  // num_segments + 1
  const int32_t* source_rows;    // per entry
  const float* entry_scales;     // per entry or nullptr
  bool mean;
  bool bag_layout;
  int64_t num_segments;
  int num_samples;
  int num_tables;
  float* output;
  bool chunked = false;
};
absl::Status LaunchSegmentSum(const SegmentSumArgs& args, int sm_count, cudaStream_t stream);

absl::Status LaunchApply(const Storage& storage, OptimizerKind optimizer, const int32_t* slots,
                         const int32_t* grad_rows, const float* grads, int64_t n,
                         float learning_rate, float eps, int sm_count, cudaStream_t stream);

absl::Status LaunchFill(const Storage& storage, const int32_t* slots, const float* records,
                        int64_t n, int sm_count, cudaStream_t stream);
absl::Status LaunchExtract(const Storage& storage, const int32_t* slots, int64_t n, float* records,
                           int sm_count, cudaStream_t stream);

// table_offsets: num_tables + 1 cumulative row counts; table_scales: num_tables.
absl::Status LaunchInitialize(const Storage& storage, int64_t first_slot, int64_t count,
                              uint64_t first_row, uint64_t seed, const uint64_t* table_offsets,
                              const float* table_scales, int num_tables, float accumulator,
                              int sm_count, cudaStream_t stream);

}  // namespace bagpipe::cache_kernels

#endif  // BAGPIPE_CACHE_CACHE_KERNELS_CUH_
