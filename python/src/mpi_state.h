// MPI for the Python package: initialised once per process, at the first Job created under
// mpirun, and finalised at interpreter exit (bagpipe._core._shutdown, registered with atexit by
// the package). A process runs one job under mpirun: its ranks' transport carries one job.
#ifndef BAGPIPE_PYTHON_SRC_MPI_STATE_H_
#define BAGPIPE_PYTHON_SRC_MPI_STATE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "sync/mpi_transport.h"

namespace bagpipe::python {

struct MpiState {
  std::unique_ptr<MpiSession> session;
  std::unique_ptr<MpiTransport> transport;
  bool used = false;

  // Initialises MPI and the transport for this process's job (StartMpiJob: bounded by
  // `peer_timeout`, which every rank must pass alike; a rank stopped, hung or dead during the
  // start ends the job with an error naming the phase or the rank, and once up the heartbeats
  // are watched). Fails on a second job.
  absl::Status Start(absl::Duration peer_timeout);
  // Stops the transport and finalises MPI (after the job is closed).
  void Shutdown();
};

MpiState& Mpi();

}  // namespace bagpipe::python

#endif  // BAGPIPE_PYTHON_SRC_MPI_STATE_H_
