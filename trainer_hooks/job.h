// A whole Bagpipe job: the oracle, S embedding servers and T trainers wired together, either as
// threads of this process over an InProcessHub (the embedded default, no cluster needed) or as
// this process's one rank of an mpirun job over MPI. Both run the same role code (sync/roles.h),
// so the embedded default exercises the distributed protocol.
//
// Each trainer runs the caller's TrainLoop on its Trainer (trainer_hooks/trainer.h) and fills
// a TrainerOutcome; at the end every role reports to rank 0, which gathers the outcomes, the
// statistics and — unless disabled — every parameter in canonical order (ParamSink), and
// builds the JobResult. A failure anywhere aborts every rank with the failing rank's message.
#ifndef BAGPIPE_TRAINER_HOOKS_JOB_H_
#define BAGPIPE_TRAINER_HOOKS_JOB_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// Receives the parameters at rank 0: first the dense parameters, then every embedding row that
// exists on the servers, in increasing RowId order.
struct ParamSink {
  std::function<absl::Status(const std::vector<float>& dense)> dense;
  std::function<absl::Status(RowId row, const float* record)> row;
};

// Runs every role as a thread of this process. `result` and `sink` are filled by rank 0.
absl::Status RunEmbeddedJob(const JobOptions& options, std::unique_ptr<BatchStream> train,
                            std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                            const ParamSink& sink, JobResult* result);

// Runs this process's rank of an mpirun job (MPI must be initialised). Only rank 0 reads the
// data (`train`/`eval` may be null elsewhere) and fills `result` and calls `sink`.
absl::Status RunDistributedRank(Transport& transport, const JobOptions& options,
                                std::unique_ptr<BatchStream> train,
                                std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                                const ParamSink& sink, JobResult* result);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_JOB_H_
