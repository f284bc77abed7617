// CUDA, cuBLAS and NCCL return codes -> absl::Status (see core/checks.h for the convention).
// Include only from translation units compiled when BAGPIPE_WITH_CUDA is set.
#ifndef BAGPIPE_CORE_CUDA_CHECKS_H_
#define BAGPIPE_CORE_CUDA_CHECKS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "core/checks.h"

namespace bagpipe::internal {

absl::Status CudaStatus(cudaError_t code, const char* call, const char* file, int line);
absl::Status CublasStatus(cublasStatus_t code, const char* call, const char* file, int line);
absl::Status NcclStatus(ncclResult_t code, const char* call, const char* file, int line);

}  // namespace bagpipe::internal

#define CUDA_RETURN_IF_ERROR(call)                                                         \
  do {                                                                                     \
    cudaError_t bagpipe_cuda_rc_ = (call);                                                 \
    if (bagpipe_cuda_rc_ != cudaSuccess)                                                   \
      return ::bagpipe::internal::CudaStatus(bagpipe_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (false)

#define CUBLAS_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                         \
    cublasStatus_t bagpipe_cublas_rc_ = (call);                                                \
    if (bagpipe_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                           \
      return ::bagpipe::internal::CublasStatus(bagpipe_cublas_rc_, #call, __FILE__, __LINE__); \
  } while (false)

#define NCCL_RETURN_IF_ERROR(call)                                                         \
  do {                                                                                     \
    ncclResult_t bagpipe_nccl_rc_ = (call);                                                \
    if (bagpipe_nccl_rc_ != ncclSuccess)                                                   \
      return ::bagpipe::internal::NcclStatus(bagpipe_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (false)

// Checks the last kernel launch (launch-configuration errors surface here, not at the launch).
#define CUDA_RETURN_IF_LAUNCH_ERROR() CUDA_RETURN_IF_ERROR(cudaGetLastError())

#endif  // BAGPIPE_CORE_CUDA_CHECKS_H_
