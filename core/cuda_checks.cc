#include "core/cuda_checks.h"

namespace bagpipe::internal {

absl::Status CudaStatus(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) return absl::OkStatus();
  const auto status_code = code == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                                                             : absl::StatusCode::kInternal;
  return CallError(status_code, "CUDA", static_cast<int>(code),
                   std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code), call,
                   file, line);
}

absl::Status CublasStatus(cublasStatus_t code, const char* call, const char* file, int line) {
  if (code == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return CallError(absl::StatusCode::kInternal, "cuBLAS", static_cast<int>(code),
                   cublasGetStatusString(code), call, file, line);
}

absl::Status NcclStatus(ncclResult_t code, const char* call, const char* file, int line) {
  if (code == ncclSuccess) return absl::OkStatus();
  return CallError(absl::StatusCode::kInternal, "NCCL", static_cast<int>(code),
                   ncclGetErrorString(code), call, file, line);
}

}  // namespace bagpipe::internal
