// Specifications of the planner's interface and residency decisions (oracle/planner.h). The
// end-to-end consistency properties are in plan_replay_test.cc.
#include "oracle/planner.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tbb/global_control.h"
#include "tbb/task_arena.h"
#include "tests/oracle/planner_testing.h"
#include "tests/oracle/trace_testing.h"

namespace bagpipe {
namespace {

using ::bagpipe::testing::Demand;
using ::bagpipe::testing::MakeTrace;
using ::bagpipe::testing::MaxWorkingSet;
using ::bagpipe::testing::PlannerRun;
using ::bagpipe::testing::ReferenceMisses;
using ::bagpipe::testing::RunPlanner;
using ::bagpipe::testing::TraceSchema;
using ::bagpipe::testing::TraceSpec;
using ::testing::HasSubstr;

// The plans on four workers (more than this machine may have: the passes reorder their tasks by
// measured durations once several workers share them) equal those on one, trainer by trainer.
void ExpectSamePlansOnOneThread(const PlannerOptions& options, const std::vector<Batch>& trace) {
  PlannerRun a;
  {
    tbb::global_control four_threads(tbb::global_control::max_allowed_parallelism, 4);
    tbb::task_arena four(4);
    four.execute([&] { a = RunPlanner(options, trace); });
  }
  PlannerRun b;
  {
    tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    b = RunPlanner(options, trace);
  }
  ASSERT_EQ(a.plans.size(), b.plans.size());
  for (size_t i = 0; i < a.plans.size(); ++i) {
    ASSERT_EQ(a.plans[i].size(), b.plans[i].size());
    for (size_t t = 0; t < a.plans[i].size(); ++t) {
      EXPECT_TRUE(a.plans[i][t] == b.plans[i][t])
          << CachePolicyName(options.policy) << " iteration " << i << " trainer " << t;
    }
  }
  ASSERT_EQ(a.drain.size(), b.drain.size());
  for (size_t t = 0; t < a.drain.size(); ++t) EXPECT_TRUE(a.drain[t] == b.drain[t]);
}

Schema OneTable(int64_t rows) {
  Schema schema;
  schema.table_names = {"t"};
  schema.table_rows = {rows};
  return schema;
}

// A one-table batch without dense features: sample s holds the ids bags[s].
Batch MakeBatch(int64_t first_sample, const std::vector<std::vector<int64_t>>& bags) {
  Batch batch;
  batch.Reset(0, 1);
  batch.first_sample = first_sample;
  batch.num_samples = static_cast<int32_t>(bags.size());
  for (const auto& bag : bags) {
    batch.labels.push_back(0);
    batch.ids.insert(batch.ids.end(), bag.begin(), bag.end());
    batch.offsets.push_back(static_cast<int64_t>(batch.ids.size()));
  }
  return batch;
}

// One sample per batch; batch i holds rows[i].
std::vector<Batch> Sequence(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<Batch> trace;
  for (size_t i = 0; i < rows.size(); ++i) {
    trace.push_back(MakeBatch(static_cast<int64_t>(i), {rows[i]}));
  }
  return trace;
}

PlannerOptions Options(Schema schema, CachePolicy policy, int64_t capacity, int lookahead = 8,
                       int trainers = 1) {
  PlannerOptions o;
  o.schema = std::move(schema);
  o.policy = policy;
  o.capacity = capacity;
  o.lookahead = lookahead;
  o.num_trainers = trainers;
  o.capture_min_rows = 0;  // the path of large tables: slots recorded when a batch enters
  return o;
}

std::vector<RowId> Evicted(const TrainerPlan& plan) {
  std::vector<RowId> rows;
  for (const Extraction& e : plan.extract) {
    if (e.evict) rows.push_back(e.row);
  }
  return rows;
}

std::vector<RowId> Filled(const TrainerPlan& plan) {
  std::vector<RowId> rows;
  for (const Fill& f : plan.fills) rows.push_back(f.row);
  return rows;
}

TEST(CachePolicyTest, ParsesEveryNameAndRejectsOthers) {
  for (CachePolicy policy : {CachePolicy::kOracle, CachePolicy::kLru, CachePolicy::kLfu,
                             CachePolicy::kOff, CachePolicy::kDevice}) {
    auto parsed = ParseCachePolicy(CachePolicyName(policy));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, policy);
  }
  auto bad = ParseCachePolicy("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("oracle, lru, lfu, off, device"));
}

TEST(PlannerOptionsTest, RejectsInvalidOptions) {
  auto expect_invalid = [](PlannerOptions o, const std::string& fragment) {
    auto planner = Planner::Create(std::move(o));
    ASSERT_FALSE(planner.ok()) << fragment;
    EXPECT_EQ(planner.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(planner.status().message()), HasSubstr(fragment));
  };
  expect_invalid(Options(OneTable(10), CachePolicy::kOracle, 0), "capacity");
  PlannerOptions o = Options(OneTable(10), CachePolicy::kOracle, 4);
  o.num_trainers = 65;
  expect_invalid(o, "num_trainers");
  o = Options(OneTable(10), CachePolicy::kOracle, 4, /*lookahead=*/0);
  expect_invalid(o, "lookahead");
  o = Options(OneTable(10), CachePolicy::kOracle, 4);
  o.emit_lag = 0;
  expect_invalid(o, "emit_lag");
  o.emit_lag = 1;
  o.writeback_horizon = -1;
  expect_invalid(o, "writeback_horizon");
  expect_invalid(Options(Schema{}, CachePolicy::kOracle, 4), "at least one table");
  o = Options(OneTable(10), CachePolicy::kOracle, 4);
  o.model_workers = -1;
  expect_invalid(o, "model_workers");
  o = Options(OneTable(10), CachePolicy::kOracle, 4);
  o.split_parts = 0;
  expect_invalid(o, "split_parts");
  o.split_parts = 65;
  expect_invalid(o, "split_parts");
  o.split_parts = 2;
  o.split_min_rows = -1;
  expect_invalid(o, "split_min_rows");
  // Device mode needs no capacity.
  EXPECT_TRUE(Planner::Create(Options(OneTable(10), CachePolicy::kDevice, 0)).ok());
}

TEST(PlannerTest, WorkingSetAboveCapacityNamesIterationTrainerAndSizes) {
  // Two trainers of two samples each; at iteration 2 trainer 1's shard needs 3 rows.
  std::vector<Batch> trace;
  trace.push_back(MakeBatch(0, {{1}, {1}, {2}, {2}}));
  trace.push_back(MakeBatch(4, {{1}, {2}, {3}, {3}}));
  trace.push_back(MakeBatch(8, {{1}, {1}, {4}, {5, 6}}));
  auto planner = Planner::Create(Options(OneTable(10), CachePolicy::kOracle, 2, 4, 2));
  ASSERT_TRUE(planner.ok());
  ASSERT_TRUE((*planner)->Push(trace[0]).ok());
  ASSERT_TRUE((*planner)->Push(trace[1]).ok());
  const absl::Status status = (*planner)->Push(trace[2]);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "iteration 2, trainer 1: batch working set 3 rows exceeds cache capacity 2 rows; "
            "raise --cache-rows or lower --batch-size");
  // The planner is unusable after an error and says why.
  EXPECT_EQ((*planner)->Pop().status(), status);
  EXPECT_EQ((*planner)->Finish(), status);
}

TEST(PlannerTest, RejectsMalformedBatches) {
  auto planner = Planner::Create(Options(OneTable(10), CachePolicy::kLru, 4));
  ASSERT_TRUE(planner.ok());
  Batch two_tables;
  two_tables.Reset(0, 2);
  absl::Status status = (*planner)->Push(two_tables);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("2 tables; the schema has 1"));

  planner = Planner::Create(Options(OneTable(10), CachePolicy::kLru, 4));
  ASSERT_TRUE(planner.ok());
  status = (*planner)->Push(MakeBatch(100, {{1}, {2, 10}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("sample 101, table t: id 10 is outside [0, 10)"));

  // Negative ids and ids near 2^63 are out of range too (the range scan works on sign bits).
  for (const int64_t bad : {int64_t{-1}, std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max(), int64_t{1} << 62}) {
    planner = Planner::Create(Options(OneTable(10), CachePolicy::kLru, 4));
    ASSERT_TRUE(planner.ok());
    Batch batch = MakeBatch(7, {{1}, {2}, {3, 4}});
    batch.ids[2] = bad;
    status = (*planner)->Push(batch);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("sample 9, table t: id ", bad, " is outside [0, 10)")));
  }

  // Offsets that decrease inside the table's range (its ends are in order).
  planner = Planner::Create(Options(OneTable(10), CachePolicy::kLru, 4));
  ASSERT_TRUE(planner.ok());
  Batch decreasing = MakeBatch(20, {{1, 2}, {3}, {4, 5}, {6}});
  decreasing.offsets[2] = 1;  // 0, 2, 3, 5, 6 -> 0, 2, 1, 5, 6
  status = (*planner)->Push(decreasing);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("offsets decrease at sample 21, table t"));

  // A negative offset inside the range.
  planner = Planner::Create(Options(OneTable(10), CachePolicy::kLru, 4));
  ASSERT_TRUE(planner.ok());
  Batch negative = MakeBatch(30, {{1, 2}, {3}, {4, 5}, {6}});
  negative.offsets[2] = std::numeric_limits<int64_t>::min();
  status = (*planner)->Push(negative);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("offsets decrease at sample 31, table t"));

  // A table split into parts (PlannerOptions::split_parts) is validated, and named, as one
  // table, also after good batches went through its parts.
  PlannerOptions split = Options(OneTable(10), CachePolicy::kOracle, 4, /*lookahead=*/3);
  split.split_parts = 3;
  split.split_min_rows = 2;
  planner = Planner::Create(split);
  ASSERT_TRUE(planner.ok());
  ASSERT_TRUE((*planner)->Push(MakeBatch(0, {{1, 7}, {2}, {9}})).ok());
  ASSERT_TRUE((*planner)->Push(MakeBatch(3, {{0}, {5, 6}, {3}})).ok());
  status = (*planner)->Push(MakeBatch(6, {{4}, {8}, {2, 10}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("sample 8, table t: id 10 is outside [0, 10)"));

  planner = Planner::Create(Options(OneTable(10), CachePolicy::kLru, 4));
  ASSERT_TRUE(planner.ok());
  Batch short_offsets = MakeBatch(0, {{1}, {2}});
  short_offsets.offsets.pop_back();
  status = (*planner)->Push(short_offsets);
  EXPECT_THAT(std::string(status.message()), HasSubstr("malformed sparse layout"));
}

// Recycled plans and returned batch buffers change nothing: every policy, one and several
// trainers, with and without local batches, on batches whose sizes go up and down.
TEST(PlannerTest, RecyclingPlansAndBatchesGivesTheSamePlans) {
  TraceSpec spec;
  spec.table_rows = {30, 500, 7};
  spec.batches = 40;
  spec.batch_size = 12;
  spec.max_pooling = 3;  // 0..3 ids per bag: every batch has its own number of ids
  spec.last_batch_size = 5;
  const std::vector<Batch> trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);
  for (CachePolicy policy : {CachePolicy::kOracle, CachePolicy::kLru, CachePolicy::kLfu,
                             CachePolicy::kOff, CachePolicy::kDevice}) {
    for (int trainers : {1, 3}) {
      for (bool build_batch : {true, false}) {
        PlannerOptions options =
            Options(schema, policy, MaxWorkingSet(trace, schema, trainers) + 20, 6, trainers);
        options.build_batch = build_batch;
        SCOPED_TRACE(absl::StrCat(std::string(CachePolicyName(policy)), ", ", trainers, " trainers",
                                  std::string(build_batch ? "" : ", no local batches")));
        const PlannerRun fresh = RunPlanner(options, trace);
        const PlannerRun recycled = RunPlanner(options, trace, /*recycle=*/true);
        ASSERT_EQ(fresh.plans.size(), recycled.plans.size());
        for (size_t i = 0; i < fresh.plans.size(); ++i) {
          ASSERT_TRUE(fresh.plans[i] == recycled.plans[i]) << "iteration " << i;
        }
        EXPECT_TRUE(fresh.drain == recycled.drain);
      }
    }
  }
}

TEST(PlannerTest, FinishLeavesTheTailToPopOneIterationAtATime) {
  // Lookahead 4, two trainers: after Finish, the last four iterations are planned as Pop
  // reaches them, not all at once (which would hold a window of plans).
  auto planner = Planner::Create(Options(OneTable(10), CachePolicy::kOracle, 4, 4, 2));
  ASSERT_TRUE(planner.ok());
  for (int b = 0; b < 6; ++b) {
    ASSERT_TRUE((*planner)->Push(MakeBatch(b, {{b % 3}, {b % 3 + 1}})).ok());
  }
  auto planned = [&] { return (*planner)->stats()[PlannerCounter::kIterations]; };
  int popped = 0;
  while (true) {
    auto plans = (*planner)->Pop();
    ASSERT_TRUE(plans.ok());
    if (!plans->has_value()) break;
    ++popped;
  }
  EXPECT_EQ(planned(), 3);  // 6 - lookahead + 1: the windows complete before Finish
  ASSERT_TRUE((*planner)->Finish().ok());
  EXPECT_EQ(planned(), 3);
  auto next = (*planner)->Pop();
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((**next)[0].iteration, popped);
  EXPECT_LE(planned(), popped + 1 + 2);  // at most the emit lag (2) ahead of what is released
  EXPECT_LT(planned(), 6);
  for (++popped; true; ++popped) {
    auto plans = (*planner)->Pop();
    ASSERT_TRUE(plans.ok());
    if (!plans->has_value()) break;
    EXPECT_EQ((**plans)[1].iteration, popped);
  }
  EXPECT_EQ(popped, 6);
  EXPECT_EQ(planned(), 6);
  EXPECT_TRUE((*planner)->Drain().ok());
}

TEST(PlannerTest, EnforcesCallOrder) {
  auto planner = Planner::Create(Options(OneTable(10), CachePolicy::kOracle, 4));
  ASSERT_TRUE(planner.ok());
  ASSERT_TRUE((*planner)->Push(MakeBatch(0, {{1}})).ok());
  EXPECT_EQ((*planner)->Drain().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*planner)->Finish().ok());
  EXPECT_EQ((*planner)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*planner)->Push(MakeBatch(1, {{1}})).code(), absl::StatusCode::kFailedPrecondition);
  // Plans not popped yet: no Drain.
  EXPECT_EQ((*planner)->Drain().status().code(), absl::StatusCode::kFailedPrecondition);
  auto plans = (*planner)->Pop();
  ASSERT_TRUE(plans.ok() && plans->has_value());
  auto none = (*planner)->Pop();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto drain = (*planner)->Drain();
  ASSERT_TRUE(drain.ok());
  ASSERT_EQ(drain->size(), 1u);
  ASSERT_EQ((*drain)[0].extract.size(), 1u);
  EXPECT_TRUE((*drain)[0].extract[0].write_back);
  EXPECT_EQ((*drain)[0].iteration, 1);
  EXPECT_EQ((*planner)->Drain().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PlannerTest, ReleasesPlansOnceTheWindowAndEmitLagAreCovered) {
  PlannerOptions o = Options(OneTable(10), CachePolicy::kOracle, 4, /*lookahead=*/3);
  o.emit_lag = 2;
  auto planner = Planner::Create(o);
  ASSERT_TRUE(planner.ok());
  // Iteration 0 is planned once batch 2 is in and released once iteration 2 is planned,
  // i.e. after batch 4.
  for (int b = 0; b < 4; ++b) {
    ASSERT_TRUE((*planner)->Push(MakeBatch(b, {{b % 3}})).ok());
    auto popped = (*planner)->Pop();
    ASSERT_TRUE(popped.ok());
    EXPECT_FALSE(popped->has_value()) << "after batch " << b;
  }
  ASSERT_TRUE((*planner)->Push(MakeBatch(4, {{1}})).ok());
  auto popped = (*planner)->Pop();
  ASSERT_TRUE(popped.ok() && popped->has_value());
  EXPECT_EQ((**popped)[0].iteration, 0);
}

TEST(PlannerTest, OracleEvictsTheFurthestNextUse) {
  // Capacity 2. At iteration 2 row 3 needs a slot: row 1 is next used at 3, row 2 at 4.
  const auto trace = Sequence({{1}, {2}, {3}, {1}, {2}});
  const PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kOracle, 2, 8), trace);
  ASSERT_EQ(run.plans.size(), 5u);
  EXPECT_EQ(Evicted(run.plans[2][0]), std::vector<RowId>{2});
  EXPECT_EQ(Filled(run.plans[2][0]), std::vector<RowId>{3});
  // Row 3 (never used again) goes before row 1 (used next).
  EXPECT_EQ(Evicted(run.plans[4][0]), std::vector<RowId>{3});
  EXPECT_EQ(run.stats[PlannerCounter::kMisses], 4);
}

TEST(PlannerTest, OracleRefillsARowEvictedAfterItsNextBatchEntered) {
  // Capacity 2, L = 3. Row 1 is resident (filled at 0) when batch 4 enters, which uses it
  // again; planning iteration 2 then evicts it, the furthest next use, for row 3. Iteration 4
  // must fill it again rather than read the slot it had when batch 4 entered (row 3's now).
  const auto trace = Sequence({{1}, {2}, {3}, {2}, {1}});
  for (const int64_t capture_min_rows : {int64_t{0}, int64_t{1} << 16}) {
    SCOPED_TRACE(::testing::Message() << "capture_min_rows " << capture_min_rows);
    PlannerOptions o = Options(OneTable(10), CachePolicy::kOracle, 2, 3);
    o.capture_min_rows = capture_min_rows;
    const PlannerRun run = RunPlanner(o, trace);
    ASSERT_EQ(run.plans.size(), 5u);
    EXPECT_EQ(Evicted(run.plans[2][0]), std::vector<RowId>{1});
    EXPECT_EQ(Evicted(run.plans[4][0]), std::vector<RowId>{3});
    ASSERT_EQ(Filled(run.plans[4][0]), std::vector<RowId>{1});
    EXPECT_EQ(run.plans[4][0].unique_slots, std::vector<SlotId>{run.plans[4][0].fills[0].slot});
  }
}

TEST(PlannerTest, OracleKeepsRowsAfterTheirLastKnownUseWhileCapacityAllows) {
  // Row 1 reappears after the window (L = 2) and is still resident: a hit.
  const auto trace = Sequence({{1}, {2}, {3}, {4}, {1}});
  const PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kOracle, 8, 2), trace);
  EXPECT_TRUE(run.plans[4][0].fills.empty());
  EXPECT_EQ(run.stats[PlannerCounter::kEvictions], 0);
}

TEST(PlannerTest, OracleBreaksTiesAtInfinityByLeastRecentUse) {
  // L = 1 sees no future: every resident row is at infinity; row 1 was used longest ago.
  const auto trace = Sequence({{1}, {2}, {1, 3}, {4}});
  PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kOracle, 3, 1), trace);
  EXPECT_EQ(Evicted(run.plans[3][0]), std::vector<RowId>{2});
  // Within one batch, earlier first occurrence goes first.
  run = RunPlanner(Options(OneTable(10), CachePolicy::kOracle, 2, 1), Sequence({{5, 6}, {7}}));
  EXPECT_EQ(Evicted(run.plans[1][0]), std::vector<RowId>{5});
}

TEST(PlannerTest, LruEvictsTheLeastRecentlyUsedRow) {
  const auto trace = Sequence({{1}, {2}, {1}, {3}});
  const PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kLru, 2), trace);
  EXPECT_EQ(Evicted(run.plans[3][0]), std::vector<RowId>{2});
}

TEST(PlannerTest, LfuEvictsTheLeastFrequentlyUsedRowCountingUsesAcrossEvictions) {
  // Row 1 is used three times, row 2 once: at iteration 4 row 2 goes although row 1 is older.
  auto trace = Sequence({{1}, {1}, {1}, {2}, {3}});
  PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kLfu, 2), trace);
  EXPECT_EQ(Evicted(run.plans[4][0]), std::vector<RowId>{2});
  // Row 1's uses survive its eviction at 5: back at 6 it has 3 uses like row 2, and the tie
  // goes to the least recently used, row 2 (with counts reset on eviction row 1 would go).
  trace = Sequence({{1}, {1}, {2}, {2}, {2}, {3}, {1}, {4}});
  run = RunPlanner(Options(OneTable(10), CachePolicy::kLfu, 2), trace);
  EXPECT_EQ(Evicted(run.plans[5][0]), std::vector<RowId>{1});
  EXPECT_EQ(Evicted(run.plans[7][0]), std::vector<RowId>{2});
}

TEST(PlannerTest, OffFillsEveryRowAndEvictsItAtTheNextBoundary) {
  const auto trace = Sequence({{1, 2}, {2, 3}});
  const PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kOff, 4), trace);
  EXPECT_EQ(Filled(run.plans[0][0]), (std::vector<RowId>{1, 2}));
  EXPECT_EQ(Evicted(run.plans[1][0]), (std::vector<RowId>{1, 2}));
  EXPECT_EQ(Filled(run.plans[1][0]), (std::vector<RowId>{2, 3}));
  // Row 2 is written back at boundary 1 and fetched after that write-back.
  EXPECT_EQ(run.plans[1][0].fills[0].after_stamp, 1);
  EXPECT_EQ(run.stats[PlannerCounter::kHits], 0);
}

TEST(PlannerTest, DeviceHoldsEveryRowAtItsRowIdSlot) {
  Schema schema = OneTable(5);
  schema.table_names.push_back("u");
  schema.table_rows.push_back(7);
  Batch batch;
  batch.Reset(0, 2);
  batch.num_samples = 2;
  batch.labels = {0, 1};
  batch.ids = {4, 4, 6, 0};
  batch.offsets = {0, 1, 2, 3, 4};
  const PlannerRun run = RunPlanner(Options(schema, CachePolicy::kDevice, 0), {batch});
  const TrainerPlan& plan = run.plans[0][0];
  EXPECT_EQ(plan.unique_rows, (std::vector<RowId>{4, 11, 5}));
  EXPECT_EQ(plan.unique_slots, (std::vector<SlotId>{4, 11, 5}));
  EXPECT_TRUE(plan.fills.empty());
  EXPECT_TRUE(plan.extract.empty());
  ASSERT_EQ(run.drain.size(), 1u);
  EXPECT_EQ(run.drain[0].extract.size(), 3u);
}

TEST(PlannerTest, FillsWaitForTheLatestWriteBackWithinTheHorizon) {
  // Capacity 1, T = 1: row 1 is evicted (written back) at 1 and fetched again at 2 and at 9.
  PlannerOptions o = Options(OneTable(10), CachePolicy::kLru, 1);
  o.writeback_horizon = 4;
  const auto trace = Sequence({{1}, {2}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {1}});
  const PlannerRun run = RunPlanner(o, trace);
  ASSERT_EQ(run.plans[2][0].fills.size(), 1u);
  EXPECT_EQ(run.plans[2][0].fills[0].after_stamp, 1);
  // Row 1's last write-back (boundary 3) is more than 4 iterations before 9: forgotten.
  ASSERT_EQ(run.plans[9][0].fills.size(), 1u);
  EXPECT_EQ(run.plans[9][0].fills[0].after_stamp, -1);
  // Forgotten stamps free their records: at the end the planner remembers the resident row
  // and the rows written back at the last H + 1 boundaries.
  EXPECT_EQ(run.stats.tracked_rows, 1 + 5);
}

TEST(PlannerTest, StampsNoFillCanReadAreNotKept) {
  // Capacity 1, L = 3 > H = 2: a row evicted with no use in the window is next used from batch
  // i + L on, past the horizon, so its record goes at the eviction (no expiry wait), and the
  // fills read exactly what they would with the record kept: -1. The same trace with L = H
  // keeps the stamps.
  const auto trace = Sequence({{1}, {2}, {3}, {4}, {5}, {6}, {1}, {2}});
  PlannerOptions o = Options(OneTable(10), CachePolicy::kOracle, 1, /*lookahead=*/3);
  o.writeback_horizon = 2;
  const PlannerRun run = RunPlanner(o, trace);
  ASSERT_EQ(run.plans[6][0].fills.size(), 1u);
  EXPECT_EQ(run.plans[6][0].fills[0].row, 1);
  EXPECT_EQ(run.plans[6][0].fills[0].after_stamp, -1);
  ASSERT_EQ(run.plans[7][0].fills.size(), 1u);
  EXPECT_EQ(run.plans[7][0].fills[0].after_stamp, -1);
  EXPECT_EQ(run.stats.tracked_rows, 1);  // the resident row only

  o.lookahead = 2;
  const PlannerRun kept = RunPlanner(o, trace);
  for (size_t i = 0; i < trace.size(); ++i) {
    EXPECT_EQ(kept.plans[i][0].fills, run.plans[i][0].fills) << "iteration " << i;
    EXPECT_EQ(kept.plans[i][0].extract, run.plans[i][0].extract) << "iteration " << i;
  }
  // The resident row plus rows whose stamps wait on the expiry queue (the iterations planned
  // by Finish drop theirs at once: no batch follows).
  EXPECT_GT(kept.stats.tracked_rows, 1);
}

TEST(PlannerTest, FillOfADirtyRowHeldElsewhereIsPrecededByAFlush) {
  // Trainer 0 touches row 7 at 0 and 1; trainer 1 first needs it at 4.
  std::vector<Batch> trace = {MakeBatch(0, {{7}, {1}}), MakeBatch(2, {{7}, {1}}),
                              MakeBatch(4, {{2}, {1}}), MakeBatch(6, {{2}, {1}}),
                              MakeBatch(8, {{2}, {7}})};
  PlannerOptions o = Options(OneTable(10), CachePolicy::kOracle, 4, 8, 2);
  o.emit_lag = 2;
  const PlannerRun run = RunPlanner(o, trace);
  // Flushed by trainer 0 at boundary max(last_touch + 1, 4 - emit_lag) = 2.
  const TrainerPlan& flusher = run.plans[2][0];
  ASSERT_EQ(flusher.extract.size(), 1u);
  EXPECT_EQ(flusher.extract[0].row, 7u);
  EXPECT_FALSE(flusher.extract[0].evict);
  EXPECT_TRUE(flusher.extract[0].write_back);
  ASSERT_EQ(run.plans[4][1].fills.size(), 1u);
  EXPECT_EQ(run.plans[4][1].fills[0].row, 7u);
  EXPECT_EQ(run.plans[4][1].fills[0].after_stamp, 2);
  EXPECT_EQ(run.stats[PlannerCounter::kFlushes], 1);
  // From iteration 4 both hold row 7; trainer 1 touches it: shared, trainer 1 sends to 0.
  const TrainerPlan& holder = run.plans[4][0];
  ASSERT_EQ(holder.shared.size(), 1u);
  EXPECT_EQ(holder.shared[0].own_unique, -1);
  ASSERT_EQ(holder.peers.size(), 1u);
  EXPECT_EQ(holder.peers[0].recv, std::vector<int32_t>{0});
  EXPECT_TRUE(holder.peers[0].send.empty());
  // The last iteration's exchanges are needed before the Drain extracts everything.
  EXPECT_TRUE(holder.shared[0].now);
}

TEST(PlannerTest, SharedRowsAreExchangedNowOnlyWhenUsedOrExtractedNext) {
  // Both trainers hold rows 1 and 2 from iteration 0. Row 1 is used again at 1, row 2 at 3.
  std::vector<Batch> trace = {MakeBatch(0, {{1, 2}, {1, 2}}), MakeBatch(2, {{1}, {3}}),
                              MakeBatch(4, {{4}, {5}}), MakeBatch(6, {{2}, {6}})};
  const PlannerRun run = RunPlanner(Options(OneTable(10), CachePolicy::kOracle, 8, 8, 2), trace);
  const TrainerPlan& first = run.plans[0][0];
  ASSERT_EQ(first.shared.size(), 2u);
  EXPECT_EQ(first.shared[0].row, 1u);
  EXPECT_TRUE(first.shared[0].now);
  EXPECT_EQ(first.shared[1].row, 2u);
  EXPECT_FALSE(first.shared[1].now);
  EXPECT_TRUE(first.private_unique.empty());
  // Rows only trainer 1 ever held are private to it.
  EXPECT_EQ(run.plans[1][1].private_unique, std::vector<int32_t>{0});
}

TEST(PlannerTest, MissCountsMatchADirectApplicationOfEachPolicy) {
  for (double alpha : {0.0, 1.1}) {
    TraceSpec spec;
    spec.alpha = alpha;
    spec.batches = 40;
    spec.max_pooling = 2;
    spec.seed = 7;
    const auto trace = MakeTrace(spec);
    const Schema schema = TraceSchema(spec);
    for (int trainers : {1, 3}) {
      const auto demand = Demand(trace, schema, trainers);
      const int64_t ws = MaxWorkingSet(trace, schema, trainers);
      for (CachePolicy policy :
           {CachePolicy::kOracle, CachePolicy::kLru, CachePolicy::kLfu, CachePolicy::kOff}) {
        for (int64_t capacity : {ws, ws + 5, 3 * ws}) {
          for (int lookahead : {1, 3, 100}) {
            if (policy != CachePolicy::kOracle && lookahead != 1) continue;
            SCOPED_TRACE(::testing::Message()
                         << CachePolicyName(policy) << " alpha " << alpha << " T " << trainers
                         << " capacity " << capacity << " L " << lookahead);
            PlannerOptions o = Options(schema, policy, capacity, lookahead, trainers);
            if (capacity != ws) o.dense_index_max_rows = 0;  // hash-form row tables
            // ws + 5: Classify looks up every record (small tables' default path).
            if (capacity == ws + 5) o.capture_min_rows = PlannerOptions{}.capture_min_rows;
            const PlannerRun run = RunPlanner(o, trace);
            ASSERT_EQ(run.plans.size(), trace.size());
            for (int t = 0; t < trainers; ++t) {
              const std::vector<int64_t> expected =
                  ReferenceMisses(demand[t], policy, capacity, lookahead);
              for (size_t i = 0; i < trace.size(); ++i) {
                ASSERT_EQ(static_cast<int64_t>(run.plans[i][t].fills.size()), expected[i])
                    << "iteration " << i << ", trainer " << t;
              }
            }
          }
        }
      }
    }
  }
}

// Split tables (PlannerOptions::split_parts) break ties between rows of different parts by part,
// which cannot change the misses of Belady's full-future choice: with L beyond the trace they
// are the reference's, iteration by iteration. The plans do not depend on the thread count, and
// with several trainers the option changes nothing.
TEST(PlannerTest, SplitTablesKeepBeladysMissesAndDeterminism) {
  TraceSpec spec;
  spec.table_rows = {30, 400, 2000};
  spec.batches = 40;
  spec.batch_size = 24;
  spec.max_pooling = 2;
  spec.seed = 17;
  const auto trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);
  const auto demand = Demand(trace, schema, 1);
  const int64_t ws = MaxWorkingSet(trace, schema, 1);
  for (int parts : {2, 4, 7}) {
    for (int64_t capacity : {ws, ws + 20}) {
      SCOPED_TRACE(::testing::Message() << "parts " << parts << " capacity " << capacity);
      PlannerOptions o = Options(schema, CachePolicy::kOracle, capacity, /*lookahead=*/100);
      o.split_parts = parts;
      o.split_min_rows = 100;
      if (capacity != ws) o.dense_index_max_rows = 0;
      const PlannerRun run = RunPlanner(o, trace);
      ASSERT_EQ(run.plans.size(), trace.size());
      const std::vector<int64_t> expected =
          ReferenceMisses(demand[0], CachePolicy::kOracle, capacity, 100);
      for (size_t i = 0; i < trace.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(run.plans[i][0].fills.size()), expected[i])
            << "iteration " << i;
      }
      o.lookahead = 4;
      ExpectSamePlansOnOneThread(o, trace);
    }
  }
  PlannerOptions o =
      Options(schema, CachePolicy::kOracle, MaxWorkingSet(trace, schema, 2) + 3, 5, 2);
  const PlannerRun whole = RunPlanner(o, trace);
  o.split_parts = 4;
  o.split_min_rows = 100;
  const PlannerRun split = RunPlanner(o, trace);
  ASSERT_EQ(whole.plans.size(), split.plans.size());
  for (size_t i = 0; i < whole.plans.size(); ++i) {
    for (size_t t = 0; t < whole.plans[i].size(); ++t) {
      EXPECT_TRUE(whole.plans[i][t] == split.plans[i][t]) << "iteration " << i;
    }
  }
}

// Next-use distances are stored in one byte up to L = 256, two bytes up to 65536 and four
// beyond: rows that come back after more than 255 batches must still be evicted in Belady's
// order.
TEST(PlannerTest, LongLookaheadsKeepExactNextUses) {
  TraceSpec spec;
  spec.table_rows = {1500};
  spec.alpha = 0.0;  // uniform: a row comes back every few hundred batches
  spec.batches = 700;
  spec.batch_size = 4;
  spec.seed = 11;
  const auto trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);
  const auto demand = Demand(trace, schema, 1);
  const int64_t ws = MaxWorkingSet(trace, schema, 1);
  for (int lookahead : {255, 256, 257, 400, 70000}) {
    for (int64_t capacity : {ws + 30, ws + 200}) {
      SCOPED_TRACE(::testing::Message() << "capacity " << capacity << " L " << lookahead);
      const PlannerRun run =
          RunPlanner(Options(schema, CachePolicy::kOracle, capacity, lookahead), trace);
      ASSERT_EQ(run.plans.size(), trace.size());
      const std::vector<int64_t> expected =
          ReferenceMisses(demand[0], CachePolicy::kOracle, capacity, lookahead);
      for (size_t i = 0; i < trace.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(run.plans[i][0].fills.size()), expected[i])
            << "iteration " << i;
      }
    }
  }
}

TEST(PlannerTest, PlansAreDeterministic) {
  TraceSpec spec;
  spec.batches = 25;
  spec.max_pooling = 3;
  const auto trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);
  for (CachePolicy policy : {CachePolicy::kOracle, CachePolicy::kLfu, CachePolicy::kDevice}) {
    const PlannerOptions o =
        Options(schema, policy, MaxWorkingSet(trace, schema, 3) + 2, /*lookahead=*/6, 3);
    // The same plans whatever the parallelism (the phases split work across TBB threads).
    ExpectSamePlansOnOneThread(o, trace);
  }
}

TEST(PlannerTest, StatsAddUp) {
  TraceSpec spec;
  spec.batches = 20;
  const auto trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);
  const PlannerRun run = RunPlanner(
      Options(schema, CachePolicy::kOracle, MaxWorkingSet(trace, schema, 2) + 3, 5, 2), trace);
  const PlannerStats& s = run.stats;
  int64_t ids = 0;
  for (const Batch& b : trace) ids += b.num_ids();
  EXPECT_EQ(s[PlannerCounter::kIterations], 20);
  EXPECT_EQ(s[PlannerCounter::kIds], ids);
  EXPECT_EQ(s[PlannerCounter::kHits] + s[PlannerCounter::kMisses], s[PlannerCounter::kUniqueRows]);
  int64_t fills = 0;
  int64_t sends = 0;
  int64_t priv = 0;
  for (const auto& plans : run.plans) {
    for (const TrainerPlan& p : plans) {
      fills += static_cast<int64_t>(p.fills.size());
      priv += static_cast<int64_t>(p.private_unique.size());
      for (const PeerExchange& e : p.peers) sends += static_cast<int64_t>(e.send.size());
    }
  }
  EXPECT_EQ(s[PlannerCounter::kMisses], fills);
  EXPECT_EQ(s[PlannerCounter::kExchangedRows], sends);
  EXPECT_EQ(s[PlannerCounter::kPrivateRows], priv);
  const nlohmann::json json = s.ToJson();
  EXPECT_EQ(json["iterations"], 20);
  EXPECT_EQ(json["misses"], fills);
  EXPECT_TRUE(json.contains("mean_iteration_ms"));
  EXPECT_TRUE(json.contains("hit_rate"));
  EXPECT_EQ(PlannerCounterName(PlannerCounter::kWriteBacks), "write_backs");
  // No model unless asked for.
  EXPECT_EQ(s.pass_seconds, 0);
  EXPECT_EQ(s.modeled_seconds, 0);
  EXPECT_EQ(s.span_seconds, 0);
}

TEST(PlannerTest, ModelsItsTimeOnMoreWorkersFromItsTasks) {
  TraceSpec spec;
  spec.batches = 30;
  spec.table_rows = {40, 300, 5000, 20};
  const auto trace = MakeTrace(spec);
  const Schema schema = TraceSchema(spec);
  for (const int trainers : {1, 3}) {
    PlannerOptions o = Options(schema, CachePolicy::kOracle, MaxWorkingSet(trace, schema, trainers),
                               /*lookahead=*/5, trainers);
    const PlannerRun plain = RunPlanner(o, trace);
    o.model_workers = 4;
    PlannerRun modeled;
    {
      // One thread: the passes' wall-clock time is the sum of their tasks' times.
      tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
      modeled = RunPlanner(o, trace);
    }
    // Timing changes nothing in the plans.
    ASSERT_EQ(plain.plans.size(), modeled.plans.size());
    for (size_t i = 0; i < plain.plans.size(); ++i) {
      for (size_t t = 0; t < plain.plans[i].size(); ++t) {
        EXPECT_TRUE(plain.plans[i][t] == modeled.plans[i][t]) << "iteration " << i;
      }
    }
    const PlannerStats& s = modeled.stats;
    const double total = s.entry_seconds + s.plan_seconds;
    EXPECT_GT(s.pass_seconds, 0);
    EXPECT_LE(s.pass_seconds, total);
    // Four workers can do no worse than one thread and no better than the longest tasks.
    EXPECT_GT(s.span_seconds, 0);
    EXPECT_LE(s.span_seconds, s.modeled_seconds);
    EXPECT_LE(s.modeled_seconds, total);
    EXPECT_GT(s.modeled_iteration_ms(), 0);
    EXPECT_LE(s.span_iteration_ms(), s.modeled_iteration_ms());
    const nlohmann::json json = s.ToJson();
    EXPECT_EQ(json["modeled_seconds"], s.modeled_seconds);
    EXPECT_EQ(json["span_seconds"], s.span_seconds);
  }
}

}  // namespace
}  // namespace bagpipe
