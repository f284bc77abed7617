// Property tests: plans for random and Zipf-skewed traces, T = 1..4, 8, 10 and 16 trainers,
// every policy, several capacities, lookaheads, emit lags and write-back horizons, executed by an
// independent replay (tests/oracle/plan_replay.h) that checks synchronous-training semantics end
// to end.
#include "tests/oracle/plan_replay.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oracle/planner.h"
#include "tests/oracle/planner_testing.h"
#include "tests/oracle/trace_testing.h"

namespace bagpipe {
namespace {

using ::bagpipe::testing::MakeTrace;
using ::bagpipe::testing::MaxWorkingSet;
using ::bagpipe::testing::PlannerRun;
using ::bagpipe::testing::PlanReplay;
using ::bagpipe::testing::RunPlanner;
using ::bagpipe::testing::TraceSchema;
using ::bagpipe::testing::TraceSpec;

struct Case {
  CachePolicy policy;
  int trainers;
  int64_t extra_capacity;  // rows above the largest working set
  int lookahead;
  int emit_lag;
  int64_t horizon;
  double alpha;
  int max_pooling;
  uint64_t seed;
  int64_t id_scale = 1;  // TraceSpec::id_scale
  int split_parts = 1;   // PlannerOptions::split_parts for the tables above 100 rows
};

std::string Name(const Case& c) {
  return std::string(CachePolicyName(c.policy)) + " T" + std::to_string(c.trainers) + " +cap" +
         std::to_string(c.extra_capacity) + " L" + std::to_string(c.lookahead) + " E" +
         std::to_string(c.emit_lag) + " H" + std::to_string(c.horizon) + " alpha" +
         std::to_string(c.alpha) + " pool" + std::to_string(c.max_pooling) + " seed" +
         std::to_string(c.seed) + " split" + std::to_string(c.split_parts);
}

// Plans the trace and replays every plan and the Drain.
void Replay(const Case& c, bool build_batch = true) {
  SCOPED_TRACE(Name(c));
  TraceSpec spec;
  spec.table_rows = {30, 120, 500};
  spec.batches = 36;
  spec.batch_size = 12;
  spec.last_batch_size = 5;
  spec.alpha = c.alpha;
  spec.max_pooling = c.max_pooling;
  spec.seed = c.seed;
  spec.id_scale = c.id_scale;
  const std::vector<Batch> trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);

  PlannerOptions o;
  o.schema = schema;
  o.num_trainers = c.trainers;
  o.policy = c.policy;
  o.capacity = MaxWorkingSet(trace, schema, c.trainers) + c.extra_capacity;
  o.lookahead = c.lookahead;
  o.emit_lag = c.emit_lag;
  o.writeback_horizon = c.horizon;
  o.build_batch = build_batch;
  // Odd seeds keep every row record in the hash form of the row tables, even seeds in the
  // direct-array form.
  if (c.seed % 2 == 1) o.dense_index_max_rows = 0;
  // Seeds 2 and 3 mod 4 have Link record the slots of every table (PlannerOptions).
  if (c.seed % 4 >= 2) o.capture_min_rows = 0;
  o.split_parts = c.split_parts;
  o.split_min_rows = 100;
  const PlannerRun run = RunPlanner(o, trace);
  ASSERT_EQ(run.plans.size(), trace.size());

  PlanReplay::Options r;
  r.schema = schema;
  r.trainers = c.trainers;
  r.capacity = c.policy == CachePolicy::kDevice ? schema.TotalRows() : o.capacity;
  r.horizon = c.horizon;
  r.device = c.policy == CachePolicy::kDevice;
  r.build_batch = build_batch;
  r.split_parts = c.split_parts;
  r.split_min_rows = o.split_min_rows;
  PlanReplay replay(r);
  for (size_t i = 0; i < trace.size(); ++i) {
    replay.Step(trace[i], static_cast<Iteration>(i), run.plans[i]);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "stopped at iteration " << i;
  }
  replay.Finish(static_cast<Iteration>(trace.size()), run.drain);
  EXPECT_EQ(run.stats[PlannerCounter::kFlushes], replay.flushes());
  EXPECT_EQ(run.stats[PlannerCounter::kWriteBacks] + run.stats[PlannerCounter::kFlushes] +
                run.stats[PlannerCounter::kDrainWriteBacks],
            replay.write_backs());
}

TEST(PlanReplayTest, OracleAcrossTrainersCapacitiesAndWindows) {
  uint64_t seed = 1;
  for (int trainers : {1, 2, 3, 4, 8}) {
    for (int64_t extra : {0, 7, 400}) {
      for (int lookahead : {1, 4, 50}) {
        Replay({CachePolicy::kOracle, trainers, extra, lookahead, 2, 6, 1.1, 1, seed++});
        if (HasFailure()) return;
      }
    }
  }
}

TEST(PlanReplayTest, ReactivePoliciesAcrossTrainersAndCapacities) {
  uint64_t seed = 100;
  for (CachePolicy policy : {CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kOff}) {
    for (int trainers : {1, 2, 4, 8}) {
      for (int64_t extra : {0, 9, 400}) {
        Replay({policy, trainers, extra, 1, 2, 5, 1.05, 2, seed++});
        if (HasFailure()) return;
      }
    }
  }
}

TEST(PlanReplayTest, DeviceModeAcrossTrainers) {
  for (int trainers : {1, 2, 3, 4, 8}) {
    Replay({CachePolicy::kDevice, trainers, 0, 1, 2, 8, 0.8, 3, 200u + trainers});
    if (HasFailure()) return;
  }
}

TEST(PlanReplayTest, UniformRowsMultiHotBagsAndEmitLags) {
  uint64_t seed = 300;
  for (int emit_lag : {1, 2, 4}) {
    for (int trainers : {2, 4, 8}) {
      Replay({CachePolicy::kOracle, trainers, 3, 6, emit_lag, 3, 0.0, 3, seed++});
      if (HasFailure()) return;
      Replay({CachePolicy::kLru, trainers, 3, 1, emit_lag, 3, 0.0, 3, seed++});
      if (HasFailure()) return;
    }
  }
}

// More trainers than samples in some batches (empty shards), and trainer masks past 8 bits.
TEST(PlanReplayTest, TenAndSixteenTrainers) {
  uint64_t seed = 500;
  for (int trainers : {10, 16}) {
    Replay({CachePolicy::kOracle, trainers, 5, 6, 2, 6, 1.1, 2, seed++});
    if (HasFailure()) return;
    Replay({CachePolicy::kLru, trainers, 3, 1, 2, 5, 1.05, 1, seed++});
    if (HasFailure()) return;
  }
}

TEST(PlanReplayTest, ShortHorizonsForgetStampsExactly) {
  uint64_t seed = 400;
  for (int64_t horizon : {1, 2, 3}) {
    for (int trainers : {1, 3}) {
      Replay({CachePolicy::kOracle, trainers, 2, 5, 2, horizon, 1.2, 1, seed++});
      if (HasFailure()) return;
    }
  }
}

// Row ids past 2^32: tables of billions of rows, sparsely used (hashed row records, 64-bit ids
// through the plans and the shared-row ordering).
TEST(PlanReplayTest, IdsBeyond32Bits) {
  uint64_t seed = 600;
  for (int trainers : {2, 3, 8}) {
    Replay({CachePolicy::kOracle, trainers, 4, 6, 2, 6, 1.1, 2, seed++, int64_t{1} << 24});
    Replay({CachePolicy::kLru, trainers, 2, 1, 2, 5, 1.05, 1, seed++, int64_t{1} << 24});
  }
}

// One trainer with the tables above 100 rows split into parts (PlannerOptions::split_parts):
// every policy, capacities from the working set up, both row-record forms, slot capture on and
// off (seeds), pooled bags, ids past 2^32; with several trainers the option changes nothing.
TEST(PlanReplayTest, SplitTables) {
  uint64_t seed = 700;
  for (int parts : {2, 3, 4}) {
    for (int64_t extra : {0, 11, 400}) {
      Replay({CachePolicy::kOracle, 1, extra, 6, 2, 5, 1.1, 1, seed++, 1, parts});
      Replay({CachePolicy::kOracle, 1, extra, 50, 1, 3, 0.9, 3, seed++, 1, parts});
      Replay({CachePolicy::kLru, 1, extra, 1, 2, 5, 1.05, 2, seed++, 1, parts});
      Replay({CachePolicy::kLfu, 1, extra, 1, 2, 5, 1.05, 2, seed++, 1, parts});
      Replay({CachePolicy::kOff, 1, extra, 1, 2, 5, 1.05, 1, seed++, 1, parts});
      if (HasFailure()) return;
    }
    Replay({CachePolicy::kOracle, 1, 4, 6, 2, 6, 1.1, 2, seed++, int64_t{1} << 24, parts});
    Replay({CachePolicy::kOracle, 3, 4, 6, 2, 6, 1.1, 2, seed++, 1, parts});
    Replay({CachePolicy::kDevice, 1, 0, 1, 2, 8, 0.8, 3, seed++, 1, parts});
    if (HasFailure()) return;
  }
}

TEST(PlanReplayTest, PlansWithoutLocalBatches) {
  Replay({CachePolicy::kOracle, 3, 4, 8, 2, 6, 1.1, 2, 500}, /*build_batch=*/false);
}

}  // namespace
}  // namespace bagpipe
