// The deterministic reduction of NcclCommunicator (sync/nccl_communicator.h): one thread per
// element sums the members' values in group order from +0.0f, exactly like the CPU AllReduceSum
// (sync/collectives.cc). __fadd_rn keeps every add a separate round-to-nearest add.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_checks.h"
#include "sync/nccl_communicator.h"

namespace bagpipe::internal {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__global__ void FixedOrderSumKernel(const float* gathered, int members, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int m = 0; m < members; ++m) acc = __fadd_rn(acc, gathered[m * count + i]);
    out[i] = acc;
  }
}

}  // namespace

absl::Status FixedOrderSumOnDevice(const float* gathered, int members, size_t count, float* out,
                                   CUstream_st* stream) {
  if (count == 0) return absl::OkStatus();
  if (members < 1) return absl::InvalidArgumentError("FixedOrderSumOnDevice: no members");
  const int64_t n = static_cast<int64_t>(count);
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  FixedOrderSumKernel<<<blocks, kThreads, 0, stream>>>(gathered, members, n, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace bagpipe::internal
