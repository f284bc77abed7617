#include "trainer_hooks/oracle_role.h"

#include <signal.h>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "core/tunables.h"
#include "trainer_hooks/plan_codec.h"

namespace bagpipe {

nlohmann::json OracleRoleStats::ToJson() const {
  return {{"iterations", iterations},
          {"eval_batches", eval_batches},
          {"plan_seconds", plan_seconds},
          {"read_seconds", read_seconds},
          {"credit_wait_seconds", credit_wait_seconds},
          {"planner", planner},
          {"checkpoint", checkpoint.ToJson()},
          {"data", data},
          {"eval_data", eval_data},
          {"stopped_at", stopped_at},
          {"stop_signal", stop_signal},
          {"stopped_after_training", stopped_after_training},
          {"end_iteration", end_iteration}};
}

int PollStopRequest(Transport& transport, const std::function<int()>& stop_requested) {
  if (stop_requested) {
    if (const int signal = stop_requested(); signal != 0) return signal;
  }
  absl::StatusOr<Message> message =
      transport.Receive(kAnySource, kTagStopRequest, absl::ZeroDuration());
  if (!message.ok()) return 0;
  WireReader r(message->payload, "stop request");
  int32_t signal = 0;
  if (!r.Get(&signal).ok() || signal == 0) signal = SIGTERM;
  return signal;
}

TrainerPlan MakeEvalPlan(const Batch& global_batch, const Schema& schema, int trainer,
                         int num_trainers, Iteration index) {
  const ShardRange range = ShardOf(global_batch.num_samples, num_trainers, trainer);
  const Batch shard = global_batch.Slice(range.begin, range.end);
  const std::vector<RowId> offsets = schema.TableOffsets();
  TrainerPlan plan;
  plan.iteration = index;
  plan.trainer = trainer;
  plan.num_trainers = num_trainers;
  plan.first_sample = shard.first_sample;
  plan.num_samples = shard.num_samples;
  plan.global_samples = global_batch.num_samples;
  plan.num_dense = shard.num_dense;
  plan.num_tables = shard.num_tables;
  plan.labels = shard.labels;
  plan.dense = shard.dense;
  plan.offsets = shard.offsets;
  plan.unique_index.resize(shard.ids.size());
  absl::flat_hash_map<RowId, uint32_t> seen;
  for (int t = 0; t < shard.num_tables; ++t) {
    for (int64_t k = shard.table_begin(t); k < shard.table_begin(t + 1); ++k) {
      const RowId row = offsets[t] + static_cast<RowId>(shard.ids[k]);
      auto [it, inserted] = seen.try_emplace(row, static_cast<uint32_t>(plan.unique_rows.size()));
      if (inserted) plan.unique_rows.push_back(row);
      plan.unique_index[k] = it->second;
    }
  }
  plan.unique_slots.resize(plan.unique_rows.size());
  for (size_t u = 0; u < plan.unique_slots.size(); ++u)
    plan.unique_slots[u] = static_cast<SlotId>(u);
  return plan;
}

namespace {

// Planners number iterations from 0 in each segment; the job's iterations (and write-back
// stamps) count on from the segment's first batch.
void OffsetPlan(Iteration base, TrainerPlan* plan) {
  if (base == 0) return;
  plan->iteration += base;
  for (Fill& fill : plan->fills) {
    if (fill.after_stamp >= 0) fill.after_stamp += base;
  }
}

void AddPlannerStats(const PlannerStats& s, PlannerStats* total) {
  for (int k = 0; k < kNumPlannerCounters; ++k) total->counters[k] += s.counters[k];
  for (int k = 0; k < kNumPlannerPhases; ++k) total->phase_seconds[k] += s.phase_seconds[k];
  total->entry_seconds += s.entry_seconds;
  total->plan_seconds += s.plan_seconds;
  total->max_iteration_ms = std::max(total->max_iteration_ms, s.max_iteration_ms);
  total->pass_seconds += s.pass_seconds;
  total->modeled_seconds += s.modeled_seconds;
  total->span_seconds += s.span_seconds;
  total->tracked_rows = s.tracked_rows;
  total->global_rows = s.global_rows;
  total->resident_rows = s.resident_rows;
}

class OracleRunner {
 public:
  OracleRunner(Transport& transport, const JobLayout& layout, const OracleRoleOptions& options,
               OracleRoleStats* stats)
      : transport_(transport),
        layout_(layout),
        options_(options),
        stats_(stats),
        credits_(layout.trainers, options.plan_queue_depth) {}

  // Sends `bytes` to trainer t once it has a credit (a free place in its plan queue).
  absl::Status SendPlan(int t, Bytes bytes) {
    if (credits_[t] == 0) {
      Stopwatch watch;
      ASSIGN_OR_RETURN(Message credit, transport_.Receive(layout_.trainer_rank(t), kTagPlanCredit,
                                                          options_.peer_timeout));
      stats_->credit_wait_seconds += watch.Seconds();
      ++credits_[t];
    }
    --credits_[t];
    return transport_.Send(layout_.trainer_rank(t), kTagPlan, std::move(bytes));
  }

  int PollStop() { return PollStopRequest(transport_, options_.stop_requested); }
  // After a read of the data failed with `error`: the signal that stops the job may end the
  // data's producers too, before the stop request gets here (a Ctrl-C reaches the worker
  // processes of a PyTorch DataLoader), and the work already planned needs no further batch.
  // Returns the stop's signal when one follows within a second, else `error`.
  absl::StatusOr<int> StopAfterFailedRead(const absl::Status& error) {
    for (int k = 0; k < 100; ++k) {
      if (const int signal = PollStop(); signal != 0) return signal;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return error;
  }

  absl::Status Run(BatchStream& train, BatchStream* eval) {
    if (!options_.checkpoint.resume.empty() && options_.planner.policy == CachePolicy::kDevice) {
      // Its caches hold every row from the start, initialised, not the checkpoint's values.
      return absl::UnimplementedError(
          "--cache device cannot resume a checkpoint yet; resume with --cache oracle (every "
          "cache mode trains the same)");
    }
    CheckpointCoordinator checkpoints(transport_, layout_, options_.checkpoint,
                                      absl::Milliseconds(CheckpointTimeoutMs()));
    ASSIGN_OR_RETURN(
        const CheckpointCoordinator::Start start,
        checkpoints.Begin(train, options_.max_iterations, [this] { return PollStop(); }));
    // Every trainer learns where the job starts (and, resuming, the loop state to restore).
    for (int t = 0; t < layout_.trainers; ++t) {
      WireWriter w;
      w.Put(start.iteration);
      w.PutString(start.loop_state);
      w.PutString(start.loop_state_file);
      RETURN_IF_ERROR(transport_.Send(layout_.trainer_rank(t), kTagCheckpoint, w.Take()));
    }
    StreamPosition position = start.stream;
    Iteration next = start.iteration;  // the next global batch to plan
    bool stream_end = false;
    int stop = 0;
    PlannerStats planner_total;
    Batch batch;
    // Planning segments: each ends at a checkpoint, at the end of training or at a stop.
    while (true) {
      ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, Planner::Create(options_.planner));
      const Iteration base = next;
      Iteration segment_end = options_.max_iterations >= 0 ? options_.max_iterations : kNever;
      if (checkpoints.writes() && checkpoints.every() > 0) {
        segment_end = std::min(segment_end, (base / checkpoints.every() + 1) * checkpoints.every());
      }
      bool finished = false;
      while (true) {
        Stopwatch plan_watch;
        ASSIGN_OR_RETURN(std::optional<std::vector<TrainerPlan>> plans, planner->Pop());
        stats_->plan_seconds += plan_watch.Seconds();
        if (plans.has_value()) {
          int32_t global_samples = 0;
          for (const TrainerPlan& plan : *plans) global_samples += plan.num_samples;
          for (int t = 0; t < layout_.trainers; ++t) {
            (*plans)[t].global_samples = global_samples;
            OffsetPlan(base, &(*plans)[t]);
            RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kIteration, (*plans)[t])));
          }
          planner->Recycle(std::move(*plans));  // encoded: their memory serves later plans
          ++stats_->iterations;
          continue;
        }
        if (finished) break;
        if (stop == 0 && (stop = PollStop()) != 0) {
          BAGPIPE_LOG(WARNING) << "stop requested (signal " << stop
                               << "): training stops after the iterations already planned, at "
                               << next;
        }
        bool got = false;
        if (stop == 0 && next < segment_end && !stream_end) {
          Stopwatch read_watch;
          absl::StatusOr<bool> read = train.Next(&batch);
          stats_->read_seconds += read_watch.Seconds();
          if (!read.ok()) {
            ASSIGN_OR_RETURN(stop, StopAfterFailedRead(read.status()));
            BAGPIPE_LOG(WARNING) << "stop requested (signal " << stop << ") as reading batch "
                                 << next << " failed (" << read.status().message()
                                 << "): training stops after the iterations already planned";
          } else {
            got = *read;
            stream_end = !got;
          }
          if (stream_end && next == start.iteration && start.iteration > 0) {
            BAGPIPE_LOG(WARNING) << "the data end at the checkpoint resumed from (iteration "
                                 << next << "): no iteration is left to train";
          }
        }
        Stopwatch push_watch;
        if (got) {
          ConsumeBatch(batch, &position);
          // The batch's buffers come back for the next read.
          RETURN_IF_ERROR(Annotate(planner->Push(std::move(batch), &batch),
                                   absl::StrCat("planning global batch ", next)));
          ++next;
          position.batches = next;
          position.epoch = train.epoch();
        } else {
          RETURN_IF_ERROR(planner->Finish());
          finished = true;
        }
        stats_->plan_seconds += push_watch.Seconds();
      }
      ASSIGN_OR_RETURN(std::vector<TrainerPlan> drain, planner->Drain());
      for (TrainerPlan& plan : drain) OffsetPlan(base, &plan);
      AddPlannerStats(planner->stats(), &planner_total);
      const bool done = stop != 0 || stream_end ||
                        (options_.max_iterations >= 0 && next >= options_.max_iterations);
      const bool cut = checkpoints.writes() && next > checkpoints.last_written() &&
                       (done || (checkpoints.every() > 0 && next % checkpoints.every() == 0));
      if (!cut) {
        if (!done) return absl::InternalError("a planning segment ended without a checkpoint");
        for (int t = 0; t < layout_.trainers; ++t) {
          RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kDrain, drain[t])));
        }
        break;
      }
      for (int t = 0; t < layout_.trainers; ++t) {
        RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kCheckpoint, drain[t])));
      }
      RETURN_IF_ERROR(checkpoints.Write(next, position).status());
      if (!done) continue;
      // Everything went back to the servers at the cut: an empty drain ends training.
      for (int t = 0; t < layout_.trainers; ++t) {
        TrainerPlan empty;
        empty.iteration = next;
        empty.trainer = t;
        empty.num_trainers = layout_.trainers;
        RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kDrain, empty)));
      }
      break;
    }
    stats_->planner = planner_total.ToJson();
    stats_->checkpoint = checkpoints.stats();
    stats_->end_iteration = next;
    if (eval != nullptr && stop == 0) {
      const Schema& schema = options_.planner.schema;
      Iteration index = 0;
      while (true) {
        // A stop during the evaluation skips the rest of it (and the parameter collection): the
        // trained state is in the checkpoint of the last iteration, where the job writes one.
        if ((stop = PollStop()) != 0) {
          BAGPIPE_LOG(WARNING) << "stop requested (signal " << stop
                               << ") during the evaluation: it ends after " << index
                               << " batch(es); the training ran to its end (iteration " << next
                               << ")";
          stats_->stopped_after_training = true;
          break;
        }
        absl::StatusOr<bool> got = eval->Next(&batch);
        if (!got.ok()) {
          ASSIGN_OR_RETURN(stop, StopAfterFailedRead(got.status()));
          BAGPIPE_LOG(WARNING) << "stop requested (signal " << stop
                               << ") as reading evaluation batch " << index << " failed ("
                               << got.status().message() << "): the evaluation ends there";
          stats_->stopped_after_training = true;
          break;
        }
        if (!*got) break;
        RETURN_IF_ERROR(Annotate(batch.Validate(schema), "evaluation data"));
        for (int t = 0; t < layout_.trainers; ++t) {
          RETURN_IF_ERROR(
              SendPlan(t, EncodePlan(PlanKind::kEval,
                                     MakeEvalPlan(batch, schema, t, layout_.trainers, index))));
        }
        ++index;
        ++stats_->eval_batches;
      }
    }
    if (stop != 0) {
      stats_->stopped_at = next;
      stats_->stop_signal = stop;
    }
    TrainerPlan end;
    for (int t = 0; t < layout_.trainers; ++t) {
      end.trainer = t;
      end.num_trainers = layout_.trainers;
      RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kEnd, end)));
    }
    return absl::OkStatus();
  }

 private:
  Transport& transport_;
  const JobLayout& layout_;
  const OracleRoleOptions& options_;
  OracleRoleStats* stats_;
  std::vector<int> credits_;
};

}  // namespace

absl::Status RunOracle(Transport& transport, const JobLayout& layout, BatchStream& train,
                       BatchStream* eval, const OracleRoleOptions& options,
                       OracleRoleStats* stats) {
  OracleRoleStats local;
  OracleRunner runner(transport, layout, options, stats != nullptr ? stats : &local);
  absl::Status status = runner.Run(train, eval);
  OracleRoleStats& out = stats != nullptr ? *stats : local;
  out.data = train.source().stats().ToJson();
  if (eval != nullptr) out.eval_data = eval->source().stats().ToJson();
  if (!status.ok()) {
    status = Annotate(status, "oracle (rank 0)");
    transport.Abort(status);
  }
  return status;
}

}  // namespace bagpipe
