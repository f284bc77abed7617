// The data loader + oracle role (rank 0): reads the global batches, plans them with the
// lookahead Planner, and streams every trainer its plans — ahead of need, but never more than
// `plan_queue_depth` unconsumed plans per trainer (credit-based flow control, so memory stays
// bounded whatever the speed difference). After the last iteration it sends each trainer the
// drain plan (write back everything), then the evaluation shards, then an end marker.
//
// Before the first plan every trainer gets a start message (the first iteration and, when the
// job resumes, the loop's state). With checkpoints (trainer_hooks/checkpoint.h) planning runs in
// segments that end at the checkpoints' iterations: each segment's planner is drained into
// kCheckpoint plans, the checkpoint is written, and the next segment plans afresh. A stop
// request (OracleRoleOptions::stop_requested, or kTagStopRequest from any rank) ends the current
// segment where its window stands, writes a checkpoint when a directory is set, and ends the
// job without evaluation.
#ifndef BAGPIPE_TRAINER_HOOKS_ORACLE_ROLE_H_
#define BAGPIPE_TRAINER_HOOKS_ORACLE_ROLE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "data/source.h"
#include "nlohmann/json.hpp"
#include "oracle/planner.h"
#include "sync/roles.h"
#include "sync/transport.h"
#include "trainer_hooks/checkpoint.h"

namespace bagpipe {

struct OracleRoleOptions {
  PlannerOptions planner;
  int64_t max_iterations = -1;  // stop after this many global batches (-1: end of stream)
  int plan_queue_depth = 8;     // unconsumed plans per trainer
  absl::Duration peer_timeout = absl::Seconds(120);
  CheckpointOptions checkpoint;
  // Polled between batches: non-zero (a signal number) asks for a stop. May be empty.
  std::function<int()> stop_requested;
};

struct OracleRoleStats {
  int64_t iterations = 0;
  int64_t eval_batches = 0;
  double plan_seconds = 0;         // time inside the planner
  double read_seconds = 0;         // time reading batches
  double credit_wait_seconds = 0;  // time waiting for trainers to consume plans
  nlohmann::json planner;          // the planner's own statistics (summed over segments)
  CheckpointStats checkpoint;
  // What the reading of the training and evaluation data counted (SourceStats::ToJson: samples,
  // lines, the bad lines skipped under --skip-bad-lines and the first of their errors); null
  // where there is none.
  nlohmann::json data;
  nlohmann::json eval_data;
  // A stopped job: the iteration it stopped at (-1: it ran to its end) and why. A stop after
  // the last iteration (during the evaluation, or before rank 0 gathers the parameters) sets
  // stopped_after_training: the training ran to its end, and is saved where the job writes
  // checkpoints; the evaluation and the parameter collection were skipped.
  Iteration stopped_at = -1;
  int stop_signal = 0;
  bool stopped_after_training = false;
  // The iteration after the last one trained (the first a resumed job would train).
  Iteration end_iteration = 0;
  nlohmann::json ToJson() const;
};

// Runs the oracle role until every plan, the drain and the evaluation shards are sent.
// `eval` may be null. On failure the job is aborted (every rank sees the error).
absl::Status RunOracle(Transport& transport, const JobLayout& layout, BatchStream& train,
                       BatchStream* eval, const OracleRoleOptions& options, OracleRoleStats* stats);

// A stop asked of this process (`stop_requested`, may be empty) or of any other rank (a
// kTagStopRequest message to rank 0, taken here): its signal number, or 0. Rank 0 only.
int PollStopRequest(Transport& transport, const std::function<int()>& stop_requested);

// Turns shard `trainer` of an evaluation batch into a kEval plan (rows deduplicated, slots
// 0..unique-1 of a scratch table). Exposed for tests.
TrainerPlan MakeEvalPlan(const Batch& global_batch, const Schema& schema, int trainer,
                         int num_trainers, Iteration index);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_ORACLE_ROLE_H_
