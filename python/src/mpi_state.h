// MPI for the Python package: initialised once per process, at the first Job created under
// mpirun, and finalised at interpreter exit (bagpipe._core._shutdown, registered with atexit by
// the package). A process runs one job under mpirun: its ranks' transport carries one job.
#ifndef BAGPIPE_PYTHON_SRC_MPI_STATE_H_
#define BAGPIPE_PYTHON_SRC_MPI_STATE_H_

#include <memory>

#include "absl/status/status.h"
#include "sync/mpi_transport.h"

namespace bagpipe::python {

struct MpiState {
  std::unique_ptr<MpiSession> session;
  std::unique_ptr<MpiTransport> transport;
  bool used = false;

  // Initialises MPI and the transport for this process's job. Fails on a second job.
  absl::Status Start();
  // Stops the transport and finalises MPI (after the job is closed).
  void Shutdown();
};

MpiState& Mpi();

}  // namespace bagpipe::python

#endif  // BAGPIPE_PYTHON_SRC_MPI_STATE_H_
