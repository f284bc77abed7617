// The Transport over MPI: one rank per process, launched by mpirun.
//
// MPI is initialised with MPI_THREAD_MULTIPLE. A progress thread owns receiving: it probes for
// any message (MPI_Improbe), receives it (MPI_Mrecv) into the rank's Mailbox, and completes
// pending sends; Send posts MPI_Isend directly and keeps the payload alive until completion.
// Destruction is collective (see ~MpiTransport).
// Receive is the Mailbox's (with its timeout), so a dead or hung peer becomes a
// DeadlineExceeded naming it. Abort logs the reason and calls MPI_Abort, which ends every rank.
#ifndef BAGPIPE_SYNC_MPI_TRANSPORT_H_
#define BAGPIPE_SYNC_MPI_TRANSPORT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sync/transport.h"

namespace bagpipe {

// True when this process was started by mpirun/mpiexec (Open MPI, MPICH or PMIx variables).
bool LaunchedByMpirun();

// RAII for MPI_Init_thread(MPI_THREAD_MULTIPLE) / MPI_Finalize. One per process.
class MpiSession {
 public:
  static absl::StatusOr<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  // MPI_Finalize, which waits for every rank of the job (Open MPI's ends with a fence); bounded
  // by the limit set with BoundFinalize.
  ~MpiSession();
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Bounds this process's MPI_Finalize by `limit` (a SetupWatchdog of the shutdown stage): once
  // the transport has stopped, nothing watches the peers, and a rank stopped or hung after it
  // entered the transport's shutdown barrier (so that the others' barriers completed) would keep
  // every other rank in MPI_Finalize forever. Past the limit this process prints one line naming
  // itself and the phase and ends with exit status 1, and mpirun ends the job. Default: no bound.
  void BoundFinalize(absl::Duration limit) { finalize_limit_ = limit; }

 private:
  MpiSession(int rank, int size) : rank_(rank), size_(size) {}
  int rank_;
  int size_;
  absl::Duration finalize_limit_ = absl::InfiniteDuration();
};

class SetupWatchdog;

class MpiTransport final : public Transport {
 public:
  // Collective over every rank. REQUIRES: an MpiSession is alive for the transport's whole life.
  //
  // With a finite `peer_timeout`, the set-up is bounded and the peers are watched from the start:
  // rank 0 first waits at most peer_timeout / 2 for every rank to report (a roll call, before
  // any collective) and otherwise aborts the job (MPI_Abort) naming the ranks that did not;
  // `watchdog` (may be null) is told each set-up phase; and once up, the heartbeats are watched
  // at once (as WatchLiveness does, but without waiting to hear from each first), so a rank
  // stopped later in the job's start is named too. Every rank must pass the same timeout. With
  // an infinite one (the default), nothing is watched until WatchLiveness.
  //
  // Liveness runs both ways: rank 0 watches every rank's heartbeats and every rank watches
  // rank 0's, so a stopped rank 0 is named (by the first rank to notice) as well. A rank whose
  // transport is destroyed says goodbye to the ranks watching it: a Receive from it that finds no
  // message fails at once, naming it and, if set_exit_status was called, its error (a rank that
  // fails alone cannot keep its peers waiting for its messages). It goes on sending shutdown
  // heartbeats until its shutdown barrier completes, and is watched until then: rank 0 stopped
  // inside its own shutdown is named as well. Another rank stopped inside its barrier once the
  // others' completed is not seen here (they wait in MPI_Finalize, watching nobody): a session
  // whose MPI_Finalize is bounded (MpiSession::BoundFinalize, as StartMpiJob sets) ends then.
  static absl::StatusOr<std::unique_ptr<MpiTransport>> Create(
      absl::Duration peer_timeout = absl::InfiniteDuration(), SetupWatchdog* watchdog = nullptr);
  // Completes outstanding sends (receiving meanwhile), waits until every rank of the job has
  // completed its own (a barrier: every rank destroys its transport, as every rank calls
  // MPI_Finalize), then stops the progress thread. REQUIRES: no Send is running or follows; no
  // other MPI collective on MPI_COMM_WORLD runs concurrently in this process.
  ~MpiTransport() override;

  // Why this rank ends, if with an error: sent in its goodbye (at most 500 bytes of it) to the
  // ranks that watch it, which name it when they wait for one of its messages. Call before
  // destroying the transport.
  void set_exit_status(const absl::Status& status);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status Send(int destination, int tag, Bytes payload) override;
  absl::StatusOr<Message> Receive(int source, int tag, absl::Duration timeout) override;
  std::vector<int> SourcesWithPending(int tag) override { return mailbox_.SourcesWithPending(tag); }
  void Abort(const absl::Status& why) override;
  absl::Status aborted() const override;
  // From MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) at Create: a node is numbered by its lowest
  // world rank.
  std::vector<int> NodeOfRanks() const override { return node_of_rank_; }
  void WatchLiveness(absl::Duration peer_timeout,
                     std::function<std::string(int rank)> describe) override;

 private:
  struct PendingSend;
  MpiTransport(int rank, int size, std::vector<int> node_of_rank, absl::Duration peer_timeout);
  void ProgressLoop();
  // Whether this rank watches `rank`'s liveness (rank 0 watches every rank, the others rank 0);
  // those are the ranks it sends its heartbeats and its goodbye to.
  bool Watches(int rank) const;
  // Progress thread: sends this rank's heartbeats when due (shutdown heartbeats once
  // `draining`: it said goodbye), notes a watched `source` alive (a heartbeat or any message;
  // `goodbye` the payload of its goodbye, null otherwise) and aborts the job when a watched rank
  // went silent.
  void Heartbeat(absl::Time now, bool draining);
  void NoteAlive(int source, const Bytes* goodbye, absl::Time now);
  void CheckLiveness(absl::Time now);
  // Tests pending sends, freeing completed ones. Returns true if any completed; `*all_done`
  // says whether none is left.
  bool CompleteSends(bool* all_done);

  const int rank_;
  const int size_;
  const std::vector<int> node_of_rank_;
  Mailbox mailbox_;
  // Set by the destructor: the progress thread ends once every send has completed.
  std::atomic<bool> draining_{false};
  std::thread progress_;
  // Guards the pending sends (payloads owned until MPI completes them).
  absl::Mutex send_mu_;
  std::vector<std::unique_ptr<PendingSend>> pending_ ABSL_GUARDED_BY(send_mu_);
  // Liveness (WatchLiveness): set once, then read by the progress thread.
  absl::Mutex liveness_mu_;
  absl::Duration silence_limit_ ABSL_GUARDED_BY(liveness_mu_) = absl::InfiniteDuration();
  std::function<std::string(int)> describe_ ABSL_GUARDED_BY(liveness_mu_);
  absl::Status exit_status_ ABSL_GUARDED_BY(liveness_mu_);
  // Progress thread only: when this rank's next heartbeat is due; when each watched rank was
  // last heard from (InfinitePast: not heard from yet; InfiniteFuture: it left its shutdown
  // barrier); whether it said goodbye.
  absl::Time next_heartbeat_ = absl::InfinitePast();
  std::vector<absl::Time> last_heard_;
  std::vector<char> said_goodbye_;
  // Progress thread only: when it last ran Heartbeat (a long gap: this process was stopped).
  absl::Time last_run_ = absl::InfinitePast();
  mutable absl::Mutex abort_mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(abort_mu_);
};

// An mpirun job's MPI session and transport (the transport is destroyed first).
struct MpiJob {
  std::unique_ptr<MpiSession> session;
  std::unique_ptr<MpiTransport> transport;
};

// MPI_Init and MpiTransport::Create(peer_timeout), each phase bounded by a SetupWatchdog of
// `peer_timeout`: a rank stopped, hung or dead during the job's start ends the job with an error
// naming the phase (and, from the roll call on, the missing ranks) instead of hanging it. The
// watchdog is disarmed once the transport's heartbeats watch the peers. The session's
// MPI_Finalize is bounded by `peer_timeout` too (MpiSession::BoundFinalize): destroy the
// transport first, then the session (MpiJob's members do so in their declaration order).
absl::StatusOr<MpiJob> StartMpiJob(absl::Duration peer_timeout);

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_MPI_TRANSPORT_H_
