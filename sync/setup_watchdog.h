// A bound on the start and the end of an mpirun job. MPI_Init and the transport's set-up
// collectives wait for every rank of the job, and the transport's heartbeats (MpiTransport,
// --peer-timeout) only run once it is up: a rank stopped (SIGSTOP), hung or dead before or inside
// them would leave every other rank waiting forever. The same holds at the end for MPI_Finalize,
// which waits for every rank, once the transport (and its heartbeats) has stopped. A
// SetupWatchdog is armed before MPI_Init (or MPI_Finalize) and told which phase this process is
// in; when one phase lasts longer than the limit, it prints one line naming this rank, the stage,
// the phase and the limit on stderr and ends the process with exit status 1 (_exit: no MPI call
// can be trusted to return then). mpirun then ends the whole job.
//
// Thread-safety: Enter and Disarm are called by one thread; the watchdog's own thread only
// waits and, when a phase overran, ends the process.
#ifndef BAGPIPE_SYNC_SETUP_WATCHDOG_H_
#define BAGPIPE_SYNC_SETUP_WATCHDOG_H_

#include <string>
#include <string_view>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace bagpipe {

class SetupWatchdog {
 public:
  // `who` names this process in the message ("rank 3 of 4"), `stage` the part of the job the
  // phases belong to ("set-up", "shutdown"). An infinite or non-positive `limit` watches
  // nothing.
  SetupWatchdog(absl::Duration limit, std::string who, std::string stage = "set-up");
  // Disarms.
  ~SetupWatchdog();
  SetupWatchdog(const SetupWatchdog&) = delete;
  SetupWatchdog& operator=(const SetupWatchdog&) = delete;

  // This process now waits in `phase` (a description: "MPI_Init, which waits for every rank of
  // the job"), which may last at most the limit from now.
  void Enter(std::string phase);
  // The set-up is over (something else watches the peers from here on): nothing fires.
  void Disarm();

 private:
  void Watch();

  const absl::Duration limit_;
  const std::string who_;
  const std::string stage_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::string phase_ ABSL_GUARDED_BY(mu_);
  absl::Time entered_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool disarmed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// This process's rank and the job's size as mpirun's environment gives them before MPI_Init
// (Open MPI, PMIx or PMI variables): "rank 3 of 4", or "this rank" when unknown.
std::string RankFromEnvironment();

// Test-only: when the environment variable BAGPIPE_TEST_STOP_IN_SETUP is "KEY:RANK" and this
// process is rank RANK of its mpirun job, stops this process (SIGSTOP) at the set-up point
// named KEY ("init": before MPI_Init; "transport": after it, before the transport's set-up;
// "started": once the transport is up; "shutdown": in the transport's shutdown barrier). Tests use
// it to stop a peer exactly there. A no-op otherwise; never set in production.
void StopInSetupForTesting(std::string_view key);

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_SETUP_WATCHDOG_H_
