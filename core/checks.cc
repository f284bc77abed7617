#include "core/checks.h"

#include <mpi.h>

#include "absl/strings/str_format.h"

namespace bagpipe::internal {

absl::Status CallError(absl::StatusCode status_code, std::string_view library, int code,
                       std::string_view detail, std::string_view call, const char* file, int line) {
  return absl::Status(
      status_code, absl::StrFormat("%s failed at %s:%d: %s error %d: %s", std::string(call), file,
                                   line, std::string(library), code, std::string(detail)));
}

absl::Status MpiStatus(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // MPI_Error_string may only be called between MPI_Init and MPI_Finalize.
  if (!initialized || finalized || MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return CallError(absl::StatusCode::kInternal, "MPI", code, std::string_view(text, len), call,
                   file, line);
}

}  // namespace bagpipe::internal
