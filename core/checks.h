// Turning foreign return codes into absl::Status.
//
// Every MPI, CUDA, cuBLAS and NCCL call is checked through one of these macros; a failure
// becomes a Status whose message names the call, the library's own error text and the source
// location, e.g. "MPI_Send(...) failed at sync/mpi_transport.cc:88: MPI_ERR_RANK: invalid rank".
//
//   MPI_RETURN_IF_ERROR(MPI_Send(...));          // here (core/checks.h)
//   CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(...));  // core/cuda_checks.h, CUDA builds only
//   CUBLAS_RETURN_IF_ERROR(cublasSgemm(...));    // core/cuda_checks.h
//   NCCL_RETURN_IF_ERROR(ncclAllReduce(...));    // core/cuda_checks.h
#ifndef BAGPIPE_CORE_CHECKS_H_
#define BAGPIPE_CORE_CHECKS_H_

#include <string_view>

#include "absl/status/status.h"

namespace bagpipe::internal {

// Builds the error for a failed call: `call` is the stringified expression, `detail` the
// library's description of `code`.
absl::Status CallError(absl::StatusCode status_code, std::string_view library, int code,
                       std::string_view detail, std::string_view call, const char* file, int line);

// MPI error code -> Status (MPI_SUCCESS -> OK). Uses MPI_Error_string for the text.
absl::Status MpiStatus(int code, const char* call, const char* file, int line);

}  // namespace bagpipe::internal

#define MPI_RETURN_IF_ERROR(call)                                                        \
  do {                                                                                   \
    int bagpipe_mpi_rc_ = (call);                                                        \
    if (bagpipe_mpi_rc_ != 0)                                                            \
      return ::bagpipe::internal::MpiStatus(bagpipe_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (false)

#endif  // BAGPIPE_CORE_CHECKS_H_
