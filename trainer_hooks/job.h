// A whole Bagpipe job: the oracle, S embedding servers and T trainers wired together, either as
// threads of this process over an InProcessHub (the embedded default, no cluster needed) or as
// this process's one rank of an mpirun job over MPI. Both run the same role code (sync/roles.h),
// so the embedded default exercises the distributed protocol.
//
// Job is the pull-style way in: Job::Start starts the roles this process plays — the oracle and
// the servers on threads the job owns — and creates the trainers this process hosts (all T
// embedded; one on a trainer rank of an mpirun job; none on the oracle's and the servers'
// ranks), which the caller drives from its own threads, one thread per trainer:
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Start(options, std::move(train), nullptr));
//   for each local trainer i, on a thread of the caller's:
//     Trainer& trainer = job->trainer(i);   // BeginIteration ... EndIteration, Flush
//     status = [the loop]; status.ok() ? job->CompleteTrainer(i, outcome) : job->Fail(i, status);
//   RETURN_IF_ERROR(job->Finish(sink, &result));  // after those threads are done
//
// Each trainer's loop fills a TrainerOutcome; CompleteTrainer flushes the trainer and reports
// the outcome to rank 0, where Finish gathers the outcomes, the statistics and — unless
// disabled — every parameter in canonical order (ParamSink), and builds the JobResult. A
// failure anywhere aborts every rank with the failing rank's message: every blocked call of
// every role and trainer returns it. RunEmbeddedJob and RunDistributedRank run a TrainLoop
// callback on such a job.
#ifndef BAGPIPE_TRAINER_HOOKS_JOB_H_
#define BAGPIPE_TRAINER_HOOKS_JOB_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/device.h"
#include "data/source.h"
#include "nlohmann/json.hpp"
#include "server/embedding_server.h"
#include "sync/roles.h"
#include "sync/transport.h"
#include "trainer_hooks/checkpoint.h"
#include "trainer_hooks/oracle_role.h"
#include "trainer_hooks/trainer.h"

namespace bagpipe {

struct TrainerOutcome {
  std::vector<float> dense_parameters;  // trainer 0's are the job's (replicas are identical)
  std::vector<float> eval_predictions;  // this trainer's evaluation shard, in order
  std::vector<float> eval_labels;
  nlohmann::json info = nlohmann::json::object();  // loop-specific figures (losses, timings)
  TrainerStats stats;
};

using TrainLoop = std::function<absl::Status(Trainer& trainer, TrainerOutcome* outcome)>;

struct JobOptions {
  JobLayout layout;
  TrainerOptions trainer;
  OracleRoleOptions oracle;
  Backend backend = Backend::kCpu;
  // Embedded only: emulate this network link on every message to or from a server.
  LinkModel server_link;
  absl::Duration peer_timeout = absl::Seconds(120);
  // Gather every parameter at rank 0 after training (for the fingerprint and dumps).
  bool collect_parameters = true;
  // Checkpoints and resume (trainer_hooks/checkpoint.h); checkpoint.identity gets the job's own
  // must-match options added.
  CheckpointOptions checkpoint;
  // Polled by every role at iteration boundaries: non-zero (e.g. the signal number of a SIGTERM)
  // stops the job after the iterations already planned, with a checkpoint when a directory is
  // set; the job then ends without evaluation or parameter collection and reports
  // result->oracle.stopped_at. May be empty.
  std::function<int()> stop_requested;
};

struct JobResult {
  std::vector<TrainerOutcome> trainers;  // by trainer id
  OracleRoleStats oracle;
  std::vector<ServerStats> servers;
  int64_t parameter_rows = 0;
  double seconds = 0;
};

// A server's counters as JSON (summaries, per-rank metrics).
nlohmann::json ServerStatsJson(const ServerStats& stats);

// What a trainer and a server report to rank 0 at the end, on the wire. The decoders fail with
// DataLoss naming `rank` and the field when a message is malformed, lacks a field or has one of
// the wrong type.
Bytes EncodeOutcome(const TrainerOutcome& outcome);
absl::StatusOr<TrainerOutcome> DecodeOutcome(const Bytes& bytes, int rank);
absl::StatusOr<ServerStats> DecodeServerStats(const Bytes& bytes, int rank);

// Receives the parameters at rank 0: first the dense parameters, then every embedding row that
// exists on the servers, in increasing RowId order.
struct ParamSink {
  std::function<absl::Status(const std::vector<float>& dense)> dense;
  std::function<absl::Status(RowId row, const float* record)> row;
};

class Job {
 public:
  // Checks `options` (ValidateJobOptions) and starts this process's part of the job:
  //  - `transport` null: the embedded job. Every rank of options.layout lives in this process
  //    over an InProcessHub the job owns (with options.server_link on the servers' messages).
  //  - otherwise this process is rank transport->rank() of a job of transport->size() ranks
  //    (mpirun; the layout must match the world size) and plays that rank's role only.
  // Rank 0's role needs `train` (and reads `eval` if not null); other ranks ignore them.
  // On failure nothing is left running.
  static absl::StatusOr<std::unique_ptr<Job>> Start(const JobOptions& options,
                                                    std::unique_ptr<BatchStream> train,
                                                    std::unique_ptr<BatchStream> eval,
                                                    Transport* transport = nullptr);
  // An unfinished job is aborted (every blocked call returns) and its threads are joined.
  // REQUIRES: no thread still uses one of its trainers.
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobOptions& options() const { return options_; }
  const JobLayout& layout() const { return options_.layout; }
  bool embedded() const { return hub_ != nullptr; }
  // This process's rank (0 in the embedded job, which hosts every rank).
  int rank() const { return embedded() ? 0 : transport_->rank(); }

  // The trainers this process hosts, in trainer-id order. A thread driving one makes its device
  // current first (trainer.context()->MakeCurrent(); CPU: nothing to do). Each is driven by one
  // thread at a time (trainer_hooks/trainer.h).
  int num_local_trainers() const { return static_cast<int>(trainers_.size()); }
  Trainer& trainer(int local) { return *trainers_[local].trainer; }

  // Ends local trainer `local`'s part, from the thread driving it, after its loop: flushes it
  // (Trainer::Flush; every planned iteration must have run), skips the evaluation batches the
  // loop did not take, and sends `outcome` (with the trainer's statistics) to rank 0. On
  // failure the job is aborted and the root cause returned (as Fail). REQUIRES: once per
  // trainer.
  absl::Status CompleteTrainer(int local, TrainerOutcome outcome);
  // Reports that local trainer `local`'s loop failed with `status`: aborts the job with it
  // (named by the trainer's rank) unless the job was already aborted, and returns the root
  // cause (the first abort's status).
  absl::Status Fail(int local, absl::Status status);
  // Aborts the job with `status` (first abort wins): every blocked call of every role and
  // trainer, on every rank, returns it. Thread-safe; never blocks for long.
  void Abort(const absl::Status& status);
  // The status the job was aborted with (OK if it was not). Thread-safe.
  absl::Status aborted() const { return transport_->aborted(); }
  // Whether local trainer `local` was completed (CompleteTrainer). Thread-safe.
  bool trainer_completed(int local) const;

  // Waits for this process's roles to end. Trainers not completed are completed here with an
  // empty outcome. Rank 0 gathers every trainer's outcome, the servers' statistics and (with
  // collect_parameters) every parameter into `sink`, and fills `result`; elsewhere `result`
  // gets only `seconds`. Returns the job's root cause on failure (the first abort's status).
  // REQUIRES: called once, after the threads driving the local trainers are done with them.
  absl::Status Finish(const ParamSink& sink, JobResult* result);

 private:
  struct LocalTrainer {
    int id = 0;
    std::unique_ptr<Trainer> trainer;
    bool completed = false;
  };
  Job(const JobOptions& options, std::unique_ptr<BatchStream> train,
      std::unique_ptr<BatchStream> eval);
  absl::Status StartRoles();
  // Runs `body` as a role thread of `rank`; a failure aborts the job.
  void StartRoleThread(int rank, std::function<absl::Status()> body);
  Transport& endpoint(int rank);
  void JoinRoleThreads();

  const JobOptions options_;
  std::unique_ptr<BatchStream> train_;
  std::unique_ptr<BatchStream> eval_;
  std::unique_ptr<InProcessHub> hub_;  // embedded only
  Transport* transport_ = nullptr;     // rank 0's endpoint (embedded) or this rank's
  std::vector<LocalTrainer> trainers_;
  struct RoleThread {
    int rank = 0;
    std::thread thread;
  };
  std::vector<RoleThread> role_threads_;
  OracleRoleStats oracle_stats_;
  int64_t start_nanos_ = 0;
  // Guards the role threads' outcomes and the job's state.
  mutable absl::Mutex mu_;
  std::vector<absl::Status> role_statuses_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Rank 0: notified when Finish starts the parameter collection (or the job ends). Until then,
  // once its oracle is done, rank 0 sends the servers keep-alives, so that a caller's work
  // between the trainers' end and Finish does not look like a dead rank to them.
  absl::Notification collecting_;
};

// Runs every role as a thread of this process (a Job with one thread per trainer running
// `loop`). `result` and `sink` are filled by rank 0.
absl::Status RunEmbeddedJob(const JobOptions& options, std::unique_ptr<BatchStream> train,
                            std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                            const ParamSink& sink, JobResult* result);

// Runs this process's rank of an mpirun job (MPI must be initialised): a Job on `transport`
// whose trainer, if this rank is one, runs `loop` on the calling thread. Only rank 0 reads the
// data (`train`/`eval` may be null elsewhere) and fills `result` and calls `sink`.
absl::Status RunDistributedRank(Transport& transport, const JobOptions& options,
                                std::unique_ptr<BatchStream> train,
                                std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                                const ParamSink& sink, JobResult* result);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_JOB_H_
