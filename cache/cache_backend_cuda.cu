// The CUDA backend: launches the kernels of cache_kernels_cuda.cu on the context's streams.
#include <cuda_runtime.h>

#include <memory>
#include <utility>
#include <vector>

#include "cache/cache_backend.h"
#include "cache/cache_kernels.cuh"
#include "core/cuda_checks.h"
#include "core/status.h"

namespace bagpipe::internal {
namespace {

class CudaCacheBackend final : public CacheBackend {
 public:
  CudaCacheBackend(std::shared_ptr<DeviceContext> context, const CacheStorage& storage,
                   int sm_count)
      : context_(std::move(context)),
        storage_(storage),
        kernel_storage_{storage.values, storage.state, storage.dim, storage.state_floats},
        sm_count_(sm_count) {}

  absl::Status Gather(const GatherArgs& a, Stream stream) override {
    RETURN_IF_ERROR(context_->MakeCurrent());
    cache_kernels::SegmentSumArgs args;
    args.source = storage_.values;
    args.dim = storage_.dim;
    args.segment_begin = a.offsets;
    args.source_rows = a.slots;
    args.entry_scales = a.weights;
    args.mean = a.pooling == PoolingMode::kMean;
    args.bag_layout = true;
    args.num_segments = static_cast<int64_t>(a.num_tables) * a.num_samples;
    args.num_samples = a.num_samples;
    args.num_tables = a.num_tables;
    args.output = a.pooled;
    return cache_kernels::LaunchSegmentSum(args, sm_count_, StreamOf(stream));
  }

  absl::Status Reduce(const ReduceArgs& a, Stream stream) override {
    RETURN_IF_ERROR(context_->MakeCurrent());
    cache_kernels::SegmentSumArgs args;
    args.source = a.pooled_grad;
    args.dim = storage_.dim;
    args.segment_begin = a.row_begin;
    args.source_rows = a.pooled_rows;
    args.entry_scales = a.scales;
    args.mean = false;
    args.bag_layout = false;
    args.num_segments = a.num_unique;
    args.num_samples = 0;
    args.num_tables = 0;
    args.output = a.row_grads;
    args.chunked = true;
    return cache_kernels::LaunchSegmentSum(args, sm_count_, StreamOf(stream));
  }

  absl::Status Apply(const ApplyArgs& a, Stream stream) override {
    RETURN_IF_ERROR(context_->MakeCurrent());
    return cache_kernels::LaunchApply(kernel_storage_, storage_.optimizer, a.slots, a.grad_rows,
                                      a.grads, a.n, a.learning_rate, a.eps, sm_count_,
                                      StreamOf(stream));
  }

  absl::Status Fill(const SlotId* slots, const float* records, int64_t n, Stream stream) override {
    RETURN_IF_ERROR(context_->MakeCurrent());
    return cache_kernels::LaunchFill(kernel_storage_, slots, records, n, sm_count_,
                                     StreamOf(stream));
  }

  absl::Status Extract(const SlotId* slots, int64_t n, float* records, Stream stream) override {
    RETURN_IF_ERROR(context_->MakeCurrent());
    return cache_kernels::LaunchExtract(kernel_storage_, slots, n, records, sm_count_,
                                        StreamOf(stream));
  }

  absl::Status InitializeRows(const RowInitializer& initializer, int64_t first_slot, int64_t count,
                              RowId first_row, float accumulator, Stream stream) override {
    RETURN_IF_ERROR(context_->MakeCurrent());
    const std::vector<RowId>& offsets = initializer.table_offsets();
    const std::vector<float>& scales = initializer.table_scales();
    const int num_tables = static_cast<int>(scales.size());
    ASSIGN_OR_RETURN(auto device_offsets, DeviceArray<uint64_t>::Create(context_, offsets.size()));
    ASSIGN_OR_RETURN(auto device_scales, DeviceArray<float>::Create(context_, scales.size()));
    RETURN_IF_ERROR(context_->CopyToDevice(device_offsets.data(), offsets.data(),
                                           offsets.size() * sizeof(uint64_t), stream));
    RETURN_IF_ERROR(context_->CopyToDevice(device_scales.data(), scales.data(),
                                           scales.size() * sizeof(float), stream));
    RETURN_IF_ERROR(cache_kernels::LaunchInitialize(
        kernel_storage_, first_slot, count, first_row, initializer.seed(), device_offsets.data(),
        device_scales.data(), num_tables, accumulator, sm_count_, StreamOf(stream)));
    // The table arrays are freed on return: the kernel must be done with them.
    return context_->Synchronize(stream);
  }

 private:
  cudaStream_t StreamOf(Stream stream) const {
    return static_cast<cudaStream_t>(context_->stream(stream));
  }

  const std::shared_ptr<DeviceContext> context_;
  const CacheStorage storage_;
  const cache_kernels::Storage kernel_storage_;
  const int sm_count_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CacheBackend>> CreateCudaCacheBackend(
    std::shared_ptr<DeviceContext> context, const CacheStorage& storage) {
  if (context == nullptr || !context->is_cuda()) {
    return absl::InvalidArgumentError("CreateCudaCacheBackend needs a CUDA context");
  }
  RETURN_IF_ERROR(context->MakeCurrent());
  int sm_count = 0;
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, context->device_index()));
  return std::unique_ptr<CacheBackend>(new CudaCacheBackend(std::move(context), storage, sm_count));
}

}  // namespace bagpipe::internal
