#include "trainer_hooks/oracle_role.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "trainer_hooks/plan_codec.h"

namespace bagpipe {

nlohmann::json OracleRoleStats::ToJson() const {
  return {{"iterations", iterations},
          {"eval_batches", eval_batches},
          {"plan_seconds", plan_seconds},
          {"read_seconds", read_seconds},
          {"credit_wait_seconds", credit_wait_seconds},
          {"planner", planner}};
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

  absl::Status Run(BatchStream& train, BatchStream* eval) {
    ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, Planner::Create(options_.planner));
    int64_t pushed = 0;
    bool finished = false;
    Batch batch;
    while (true) {
      Stopwatch plan_watch;
      ASSIGN_OR_RETURN(std::optional<std::vector<TrainerPlan>> plans, planner->Pop());
      stats_->plan_seconds += plan_watch.Seconds();
      if (!plans.has_value()) {
        if (finished) break;
        const bool want_more = options_.max_iterations < 0 || pushed < options_.max_iterations;
        bool got = false;
        if (want_more) {
          Stopwatch read_watch;
          ASSIGN_OR_RETURN(got, train.Next(&batch));
          stats_->read_seconds += read_watch.Seconds();
        }
        Stopwatch push_watch;
        if (got) {
          // The batch's buffers come back for the next read.
          RETURN_IF_ERROR(Annotate(planner->Push(std::move(batch), &batch),
                                   absl::StrCat("planning global batch ", pushed)));
          ++pushed;
        } else {
          RETURN_IF_ERROR(planner->Finish());
          finished = true;
        }
        stats_->plan_seconds += push_watch.Seconds();
        continue;
      }
      int32_t global_samples = 0;
      for (const TrainerPlan& plan : *plans) global_samples += plan.num_samples;
      for (int t = 0; t < layout_.trainers; ++t) {
        (*plans)[t].global_samples = global_samples;
        RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kIteration, (*plans)[t])));
      }
      planner->Recycle(std::move(*plans));  // encoded: their memory serves later plans
      ++stats_->iterations;
    }
    ASSIGN_OR_RETURN(std::vector<TrainerPlan> drain, planner->Drain());
    for (int t = 0; t < layout_.trainers; ++t) {
      RETURN_IF_ERROR(SendPlan(t, EncodePlan(PlanKind::kDrain, drain[t])));
    }
    stats_->planner = planner->stats().ToJson();
    if (eval != nullptr) {
      const Schema& schema = options_.planner.schema;
      Iteration index = 0;
      while (true) {
        ASSIGN_OR_RETURN(const bool got, eval->Next(&batch));
        if (!got) break;
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
  if (!status.ok()) {
    status = Annotate(status, "oracle (rank 0)");
    transport.Abort(status);
  }
  return status;
}

}  // namespace bagpipe
