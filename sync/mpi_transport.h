// The Transport over MPI: one rank per process, launched by mpirun.
//
// MPI is initialised with MPI_THREAD_MULTIPLE. A progress thread owns receiving: it probes for
// any message (MPI_Improbe), receives it (MPI_Mrecv) into the rank's Mailbox, and completes
// pending sends; Send posts MPI_Isend directly and keeps the payload alive until completion.
// Receive is the Mailbox's (with its timeout), so a dead or hung peer becomes a
// DeadlineExceeded naming it. Abort logs the reason and calls MPI_Abort, which ends every rank.
#ifndef BAGPIPE_SYNC_MPI_TRANSPORT_H_
#define BAGPIPE_SYNC_MPI_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "sync/transport.h"

namespace bagpipe {

// True when this process was started by mpirun/mpiexec (Open MPI, MPICH or PMIx variables).
bool LaunchedByMpirun();

// RAII for MPI_Init_thread(MPI_THREAD_MULTIPLE) / MPI_Finalize. One per process.
class MpiSession {
 public:
  static absl::StatusOr<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  ~MpiSession();
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  MpiSession(int rank, int size) : rank_(rank), size_(size) {}
  int rank_;
  int size_;
};

class MpiTransport final : public Transport {
 public:
  // REQUIRES: an MpiSession is alive for the transport's whole life.
  static absl::StatusOr<std::unique_ptr<MpiTransport>> Create();
  // Completes outstanding sends, then stops the progress thread.
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status Send(int destination, int tag, Bytes payload) override;
  absl::StatusOr<Message> Receive(int source, int tag, absl::Duration timeout) override;
  void Abort(const absl::Status& why) override;
  absl::Status aborted() const override;
  // From MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) at Create: a node is numbered by its lowest
  // world rank.
  std::vector<int> NodeOfRanks() const override { return node_of_rank_; }

 private:
  struct PendingSend;
  MpiTransport(int rank, int size, std::vector<int> node_of_rank);
  void ProgressLoop();
  // Tests pending sends, freeing completed ones. Returns true if any completed.
  bool CompleteSends(bool wait_all);

  const int rank_;
  const int size_;
  const std::vector<int> node_of_rank_;
  Mailbox mailbox_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  // Guards the pending sends (payloads owned until MPI completes them).
  absl::Mutex send_mu_;
  std::vector<std::unique_ptr<PendingSend>> pending_ ABSL_GUARDED_BY(send_mu_);
  mutable absl::Mutex abort_mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(abort_mu_);
};

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_MPI_TRANSPORT_H_
