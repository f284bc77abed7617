// Internal: the implementation hook behind EmbeddingCache (faiss's public-method / impl split).
//
// EmbeddingCache validates arguments, then calls a backend with pointers in its context's
// memory. The CPU backend (cache_backend_cpu.cc, TBB) is the reference; the CUDA backend
// (cache_backend_cuda.cu) mirrors it operation for operation, with the same float formulas in
// the same order (cache/cache_math.h), so the two agree bit for bit on the same inputs.
// Backends may assume every precondition EmbeddingCache documents (slots in range, distinct
// where required, sizes consistent). Not part of the public API.
#ifndef BAGPIPE_CACHE_CACHE_BACKEND_H_
#define BAGPIPE_CACHE_CACHE_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/pooling.h"
#include "core/device.h"
#include "core/optimizer.h"
#include "core/row_init.h"
#include "core/types.h"

namespace bagpipe::internal {

// The cache's storage: values [capacity x dim] and state [capacity x state_floats], row-major.
struct CacheStorage {
  float* values = nullptr;
  float* state = nullptr;
  int64_t capacity = 0;
  int dim = 0;
  int state_floats = 0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
};

struct GatherArgs {
  const SlotId* slots = nullptr;     // per id occurrence
  const int64_t* offsets = nullptr;  // num_tables * num_samples + 1, table-major
  int num_tables = 0;
  int num_samples = 0;
  PoolingMode pooling = PoolingMode::kSum;
  const float* weights = nullptr;  // per occurrence, or nullptr
  float* pooled = nullptr;         // [num_samples x num_tables x dim]
};

struct ReduceArgs {
  const int64_t* row_begin = nullptr;    // num_unique + 1
  const int32_t* pooled_rows = nullptr;  // per entry
  const float* scales = nullptr;         // per entry, or nullptr (all 1)
  int num_unique = 0;
  const float* pooled_grad = nullptr;  // [num_samples * num_tables x dim]
  float* row_grads = nullptr;          // [num_unique x dim]
};

struct ApplyArgs {
  const SlotId* slots = nullptr;       // n distinct slots
  const int32_t* grad_rows = nullptr;  // n gradient rows, or nullptr for 0 .. n-1
  const float* grads = nullptr;
  int64_t n = 0;
  float learning_rate = 0;
  float eps = 0;
};

class CacheBackend {
 public:
  virtual ~CacheBackend() = default;
  virtual absl::Status Gather(const GatherArgs& args, Stream stream) = 0;
  virtual absl::Status Reduce(const ReduceArgs& args, Stream stream) = 0;
  virtual absl::Status Apply(const ApplyArgs& args, Stream stream) = 0;
  // records: n x (dim + state_floats), values then state.
  virtual absl::Status Fill(const SlotId* slots, const float* records, int64_t n,
                            Stream stream) = 0;
  virtual absl::Status Extract(const SlotId* slots, int64_t n, float* records, Stream stream) = 0;
  // Slots first_slot + k get row first_row + k's initial values, k < count; state is set to
  // `accumulator`. May synchronise `stream`.
  virtual absl::Status InitializeRows(const RowInitializer& initializer, int64_t first_slot,
                                      int64_t count, RowId first_row, float accumulator,
                                      Stream stream) = 0;
};

// Kernels run on the context's streams (DeviceContext::Launch): inside the call for a kSync
// context, later on the stream's executor otherwise. REQUIRES: context is a CPU context.
std::unique_ptr<CacheBackend> CreateCpuCacheBackend(std::shared_ptr<DeviceContext> context,
                                                    const CacheStorage& storage);

#if BAGPIPE_WITH_CUDA
// REQUIRES: context->is_cuda(); storage pointers are in that device's memory.
absl::StatusOr<std::unique_ptr<CacheBackend>> CreateCudaCacheBackend(
    std::shared_ptr<DeviceContext> context, const CacheStorage& storage);
#endif

}  // namespace bagpipe::internal

#endif  // BAGPIPE_CACHE_CACHE_BACKEND_H_
