#include "sync/mpi_transport.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/checks.h"
#include "core/logging.h"
#include "core/status.h"
#include "sync/setup_watchdog.h"

namespace bagpipe {

bool LaunchedByMpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<MpiSession>> MpiSession::Init(int* argc, char*** argv) {
  int provided = 0;
  MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    return absl::FailedPreconditionError(
        "this MPI library does not provide MPI_THREAD_MULTIPLE, which Bagpipe needs (Open MPI "
        "4 does by default)");
  }
  // Errors come back as codes (turned into Status) instead of aborting inside MPI.
  MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return std::unique_ptr<MpiSession>(new MpiSession(rank, size));
}

MpiSession::~MpiSession() {
  SetupWatchdog watchdog(finalize_limit_, RankFromEnvironment(), "shutdown");
  watchdog.Enter(
      "MPI_Finalize (which waits for every rank of the job to end; a rank stopped or hung after it "
      "entered the transport's shutdown barrier holds it)");
  MPI_Finalize();
}

struct MpiTransport::PendingSend {
  Bytes payload;
  MPI_Request request = MPI_REQUEST_NULL;
};

namespace {

// Rank 0's half of the roll call: waits at most `limit` for every other rank's message, then
// aborts the job naming the ranks that did not send it.
void AwaitRollCall(int size, absl::Duration limit) {
  std::vector<MPI_Request> requests(size, MPI_REQUEST_NULL);
  std::vector<char> bytes(size, 0);
  for (int r = 1; r < size; ++r) {
    MPI_Irecv(&bytes[r], 1, MPI_BYTE, r, kTagRollCall, MPI_COMM_WORLD, &requests[r]);
  }
  const absl::Time deadline = absl::Now() + limit;
  while (true) {
    int all = 0;
    MPI_Testall(size, requests.data(), &all, MPI_STATUSES_IGNORE);
    if (all) return;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::vector<int> missing;
  for (int r = 1; r < size; ++r) {
    int done = 0;
    MPI_Test(&requests[r], &done, MPI_STATUS_IGNORE);
    if (!done) missing.push_back(r);
  }
  BAGPIPE_LOG(ERROR) << absl::StrFormat(
      "rank 0 aborts the job: %s %s of %d did not reach the transport's set-up within %s of "
      "MPI_Init (half the peer timeout): %s stopped, hung or died",
      missing.size() == 1 ? "rank" : "ranks", absl::StrJoin(missing, ", "), size,
      absl::FormatDuration(limit), missing.size() == 1 ? "its process is" : "their processes are");
  MPI_Abort(MPI_COMM_WORLD, 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiTransport>> MpiTransport::Create(absl::Duration peer_timeout,
                                                                   SetupWatchdog* watchdog) {
  int rank = 0, size = 0;
  MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const bool bounded =
      peer_timeout != absl::InfiniteDuration() && peer_timeout > absl::ZeroDuration();
  // The roll call: point to point, so that rank 0 can tell which ranks did not come (a blocking
  // collective would only wait).
  char present = 1;
  MPI_Request reported = MPI_REQUEST_NULL;
  if (bounded) {
    if (watchdog != nullptr) watchdog->Enter("the roll call (every rank reports to rank 0)");
    if (rank == 0) {
      AwaitRollCall(size, peer_timeout / 2);
    } else {
      MPI_RETURN_IF_ERROR(
          MPI_Isend(&present, 1, MPI_BYTE, 0, kTagRollCall, MPI_COMM_WORLD, &reported));
    }
    if (watchdog != nullptr) {
      watchdog->Enter(
          "the transport's set-up collectives (MPI_Comm_split_type, MPI_Allreduce, "
          "MPI_Allgather)");
    }
  }
  // Which ranks share a machine (collective over every rank, before any message flows): the
  // trainers of one machine pick their GPUs by their index among themselves.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int leader = rank;
  const int reduced = MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  MPI_RETURN_IF_ERROR(reduced);
  std::vector<int> node_of_rank(size);
  MPI_RETURN_IF_ERROR(
      MPI_Allgather(&leader, 1, MPI_INT, node_of_rank.data(), 1, MPI_INT, MPI_COMM_WORLD));
  // Rank 0 received it before the collectives began.
  MPI_RETURN_IF_ERROR(MPI_Wait(&reported, MPI_STATUS_IGNORE));
  return std::unique_ptr<MpiTransport>(new MpiTransport(
      rank, size, std::move(node_of_rank), bounded ? peer_timeout : absl::InfiniteDuration()));
}

MpiTransport::MpiTransport(int rank, int size, std::vector<int> node_of_rank,
                           absl::Duration peer_timeout)
    : rank_(rank),
      size_(size),
      node_of_rank_(std::move(node_of_rank)),
      mailbox_(rank),
      last_heard_(size, absl::InfinitePast()),
      said_goodbye_(size, 0) {
  if (peer_timeout != absl::InfiniteDuration()) {
    // Every rank starts its heartbeats now (the collectives above ended together on every rank),
    // so rank 0 expects each from now on, and each rank expects rank 0's, instead of waiting to
    // hear from it first.
    absl::MutexLock lock(&liveness_mu_);
    silence_limit_ = peer_timeout / 2;
    const absl::Time now = absl::Now();
    for (int r = 0; r < size_; ++r) {
      if (Watches(r)) last_heard_[r] = now;
    }
    // As if the progress thread ran now: a process stopped before it first runs must not blame
    // its peers for the time it was stopped.
    last_run_ = now;
  }
  progress_ = std::thread([this] { ProgressLoop(); });
}

MpiTransport::~MpiTransport() {
  // The progress thread completes the outstanding sends, then waits until every rank has
  // completed its own, and ends. It must go on receiving meanwhile: a large send completes only
  // once the peer's progress thread has received it, and the peer may be waiting for one of
  // ours (waiting here without the progress thread would deadlock two ranks that end
  // together, and ending as soon as this rank's sends are done would strand a peer's).
  bool watched = false;
  {
    absl::MutexLock lock(&liveness_mu_);
    watched = silence_limit_ != absl::InfiniteDuration();
  }
  // The ranks watching this one stop: it is done, not silent. The goodbye carries why this rank
  // ends when it ends with an error (set_exit_status), so that a peer waiting for one of its
  // messages fails at once naming it.
  if (watched) {
    Bytes goodbye{1};
    {
      absl::MutexLock lock(&liveness_mu_);
      if (!exit_status_.ok()) {
        const std::string why = exit_status_.ToString();
        goodbye.insert(goodbye.end(), why.begin(), why.begin() + std::min<size_t>(why.size(), 500));
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (Watches(r)) (void)Send(r, kTagHeartbeat, goodbye);
    }
  }
  draining_.store(true, std::memory_order_release);
  progress_.join();
}

void MpiTransport::WatchLiveness(absl::Duration peer_timeout,
                                 std::function<std::string(int rank)> describe) {
  if (peer_timeout == absl::InfiniteDuration() || peer_timeout <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&liveness_mu_);
  silence_limit_ = peer_timeout / 2;
  describe_ = std::move(describe);
}

void MpiTransport::set_exit_status(const absl::Status& status) {
  absl::MutexLock lock(&liveness_mu_);
  exit_status_ = status;
}

bool MpiTransport::Watches(int rank) const { return rank != rank_ && (rank_ == 0 || rank == 0); }

void MpiTransport::Heartbeat(absl::Time now, bool draining) {
  absl::Duration limit;
  {
    absl::MutexLock lock(&liveness_mu_);
    limit = silence_limit_;
  }
  if (limit == absl::InfiniteDuration()) return;
  // This thread runs many times a second: a long gap means this process itself did not run
  // (it was stopped and continued, e.g. by mpirun ending the job). Its peers' silence over the
  // gap is not theirs: hear them anew instead of blaming one.
  if (last_run_ != absl::InfinitePast() && now - last_run_ > limit / 2) {
    for (absl::Time& last : last_heard_) {
      if (last != absl::InfinitePast() && last != absl::InfiniteFuture()) last = now;
    }
  }
  last_run_ = now;
  if (now < next_heartbeat_) return;
  // Several heartbeats per silence limit, at most a second apart.
  next_heartbeat_ = now + std::min(limit / 5, absl::Seconds(1));
  CheckLiveness(now);
  // Once draining, this rank said goodbye: it sends shutdown heartbeats (2) until its shutdown
  // barrier completes (then one last, 3: see ProgressLoop), so that a rank stopped inside its
  // own shutdown is named too. A peer that
  // is done waits in its own shutdown barrier, then in MPI_Finalize (which waits for every
  // rank), so these small messages still reach it.
  for (int r = 0; r < size_; ++r) {
    if (Watches(r)) (void)Send(r, kTagHeartbeat, Bytes{static_cast<uint8_t>(draining ? 2 : 0)});
  }
}

void MpiTransport::NoteAlive(int source, const Bytes* goodbye, absl::Time now) {
  if (source < 0 || source >= size_ || !Watches(source)) return;
  if (last_heard_[source] == absl::InfiniteFuture()) return;  // it left its shutdown barrier
  last_heard_[source] = now;
  if (goodbye != nullptr) {
    said_goodbye_[source] = 1;
    // It sends nothing more (its earlier messages were delivered before this one): a receive
    // waiting for it fails now instead of at its timeout.
    const std::string why(goodbye->begin() + 1, goodbye->end());
    mailbox_.MarkGone(source, why.empty() ? std::string("it ended (its own log says why)")
                                          : absl::StrCat("it ended with ", why));
  }
}

void MpiTransport::CheckLiveness(absl::Time now) {
  absl::Duration limit;
  std::function<std::string(int)> describe;
  {
    absl::MutexLock lock(&liveness_mu_);
    limit = silence_limit_;
    describe = describe_;
  }
  for (int r = 0; r < size_; ++r) {
    if (!Watches(r)) continue;
    const absl::Time last = last_heard_[r];
    if (last == absl::InfinitePast() || last == absl::InfiniteFuture()) continue;
    if (now - last <= limit) continue;
    std::string who = describe ? describe(r) : absl::StrCat("rank ", r);
    if (r == 0 && !describe) who = "rank 0 (oracle)";
    if (said_goodbye_[r]) {
      Abort(absl::DeadlineExceededError(absl::StrFormat(
          "%s said goodbye, then sent nothing, not even its shutdown heartbeat, for %s (half the "
          "peer timeout): its process is stopped or hung in its shutdown",
          who, absl::FormatDuration(now - last))));
      return;
    }
    Abort(absl::DeadlineExceededError(absl::StrFormat(
        "%s has sent nothing, not even its heartbeat, for %s (half the peer timeout): its "
        "process is stopped or hung",
        who, absl::FormatDuration(now - last))));
    return;
  }
}

absl::Status MpiTransport::Send(int destination, int tag, Bytes payload) {
  if (absl::Status status = aborted(); !status.ok()) return status;
  if (destination < 0 || destination >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, " sent to rank ", destination, " of ", size_));
  }
  if (payload.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", payload.size(), " bytes exceeds MPI's 2 GiB count limit"));
  }
  auto pending = std::make_unique<PendingSend>();
  pending->payload = std::move(payload);
  MPI_RETURN_IF_ERROR(MPI_Isend(pending->payload.data(), static_cast<int>(pending->payload.size()),
                                MPI_BYTE, destination, tag, MPI_COMM_WORLD, &pending->request));
  absl::MutexLock lock(&send_mu_);
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::StatusOr<Message> MpiTransport::Receive(int source, int tag, absl::Duration timeout) {
  return mailbox_.Receive(source, tag, timeout);
}

void MpiTransport::Abort(const absl::Status& why) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (!aborted_.ok()) return;
    aborted_ = why;
  }
  mailbox_.Poison(why);
  BAGPIPE_LOG(ERROR) << "rank " << rank_ << " aborts the job: " << why.message();
  MPI_Abort(MPI_COMM_WORLD, 1);
}

absl::Status MpiTransport::aborted() const {
  absl::MutexLock lock(&abort_mu_);
  return aborted_;
}

bool MpiTransport::CompleteSends(bool* all_done) {
  absl::MutexLock lock(&send_mu_);
  bool any = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    int done = 0;
    MPI_Test(&(*it)->request, &done, MPI_STATUS_IGNORE);
    if (done) {
      it = pending_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  *all_done = pending_.empty();
  return any;
}

void MpiTransport::ProgressLoop() {
  int idle_rounds = 0;
  // The shutdown barrier (see the destructor): entered once this rank's sends are complete.
  MPI_Request shutdown = MPI_REQUEST_NULL;
  bool shutdown_started = false;
  // Receives in flight, in the order MPI matched them; each source's are delivered in that order
  // (its send order) as they complete. Non-blocking: a peer stopped in the middle of a large
  // message must not stop this thread (this rank's heartbeats, the other peers' messages).
  struct PendingReceive {
    MPI_Request request = MPI_REQUEST_NULL;
    Message message;
  };
  std::deque<std::unique_ptr<PendingReceive>> receiving;
  std::vector<char> source_blocked(size_, 0);
  while (true) {
    // Read before the sends are tested: once the destructor started, no Send comes after it.
    const bool draining = draining_.load(std::memory_order_acquire);
    bool progressed = false;
    int flag = 0;
    MPI_Message handle;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &handle, &status) ==
            MPI_SUCCESS &&
        flag) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      auto pending = std::make_unique<PendingReceive>();
      pending->message.source = status.MPI_SOURCE;
      pending->message.tag = status.MPI_TAG;
      pending->message.payload.resize(count);
      // A message matched: its sender is alive (even while the rest of a large one is coming).
      NoteAlive(status.MPI_SOURCE, /*goodbye=*/nullptr, absl::Now());
      MPI_Imrecv(pending->message.payload.data(), count, MPI_BYTE, &handle, &pending->request);
      receiving.push_back(std::move(pending));
      progressed = true;
    }
    if (!receiving.empty()) {
      std::fill(source_blocked.begin(), source_blocked.end(), 0);
      for (auto it = receiving.begin(); it != receiving.end();) {
        PendingReceive& pending = **it;
        const int source = pending.message.source;
        int done = 0;
        if (!source_blocked[source]) MPI_Test(&pending.request, &done, MPI_STATUS_IGNORE);
        if (!done) {
          source_blocked[source] = 1;  // its later messages wait for this one
          ++it;
          continue;
        }
        Message message = std::move(pending.message);
        it = receiving.erase(it);
        const bool heartbeat = message.tag == kTagHeartbeat;
        if (heartbeat) {
          const int kind = message.payload.empty() ? 0 : message.payload[0];
          NoteAlive(message.source, kind == 1 ? &message.payload : nullptr, absl::Now());
          // It left its shutdown barrier (every rank entered it): it ends, never watched again.
          if (kind == 3 && Watches(message.source)) {
            last_heard_[message.source] = absl::InfiniteFuture();
          }
        } else {
          mailbox_.Deliver(std::move(message));
        }
        progressed = true;
      }
    }
    // Every rank goes on watching while it drains: a rank that is stopped (not one that said
    // goodbye) would otherwise hold the shutdown barrier below, and the job, forever.
    Heartbeat(absl::Now(), draining);
    bool all_sent = false;
    progressed |= CompleteSends(&all_sent);
    if (draining && all_sent) {
      if (!shutdown_started) {
        shutdown_started = true;
        if (MPI_Ibarrier(MPI_COMM_WORLD, &shutdown) != MPI_SUCCESS) break;
        StopInSetupForTesting("shutdown");
      }
      int done = 0;
      if (MPI_Test(&shutdown, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) break;
    }
    if (progressed) {
      idle_rounds = 0;
    } else if (++idle_rounds > 64) {
      // Back off when idle so the progress thread does not steal a core from compute.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // The ranks watching this one stop: it passed the barrier and goes on to MPI_Finalize, which
  // waits for every rank (a rank still in its barrier would otherwise take this rank's silence
  // there for a hang of its own). Then the shutdown heartbeats still in flight complete (one
  // byte each: MPI completes them locally) before their payloads are freed.
  bool watching = false;
  {
    absl::MutexLock lock(&liveness_mu_);
    watching = silence_limit_ != absl::InfiniteDuration();
  }
  if (watching && shutdown_started && aborted().ok()) {
    for (int r = 0; r < size_; ++r) {
      if (Watches(r)) (void)Send(r, kTagHeartbeat, Bytes{3});
    }
  }
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10); absl::Now() < give_up;) {
    bool all_sent = false;
    CompleteSends(&all_sent);
    if (all_sent) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Every rank's sends completed before it entered the barrier, and the heartbeats since are
  // one byte: what is still being received here has arrived. Nobody reads it any more.
  for (auto& pending : receiving) MPI_Wait(&pending->request, MPI_STATUS_IGNORE);
}

absl::StatusOr<MpiJob> StartMpiJob(absl::Duration peer_timeout) {
  SetupWatchdog watchdog(peer_timeout, RankFromEnvironment());
  StopInSetupForTesting("init");
  watchdog.Enter("MPI_Init (which waits for every rank of the job to start)");
  MpiJob job;
  int argc = 0;
  char** argv = nullptr;
  ASSIGN_OR_RETURN(job.session, MpiSession::Init(&argc, &argv));
  job.session->BoundFinalize(peer_timeout);
  StopInSetupForTesting("transport");
  ASSIGN_OR_RETURN(job.transport, MpiTransport::Create(peer_timeout, &watchdog));
  // From here rank 0 watches every rank's heartbeats.
  watchdog.Disarm();
  StopInSetupForTesting("started");
  return job;
}

}  // namespace bagpipe
