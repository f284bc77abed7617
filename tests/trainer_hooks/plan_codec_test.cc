// Plans survive the wire exactly, and corrupted plans are rejected instead of executed.
#include "trainer_hooks/plan_codec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer_hooks/oracle_role.h"

namespace bagpipe {
namespace {

TrainerPlan SamplePlan() {
  TrainerPlan plan;
  plan.iteration = 12;
  plan.trainer = 1;
  plan.num_trainers = 3;
  plan.first_sample = 4096;
  plan.num_samples = 2;
  plan.global_samples = 6;
  plan.num_dense = 1;
  plan.num_tables = 2;
  plan.labels = {1, 0};
  plan.dense = {0.5f, 1.5f};
  plan.offsets = {0, 1, 2, 4, 5};
  plan.unique_index = {0, 1, 2, 0, 1};
  plan.unique_rows = {10, 11, 90};
  plan.unique_slots = {4, 7, 2};
  plan.extract = {{3, 55, true, true}, {9, 56, false, true}, {1, 57, true, false}};
  plan.fills = {{3, 90, 8}, {1, 11, -1}};
  plan.private_unique = {2};
  plan.shared = {{4, 10, 0, true}, {7, 11, 1, false}, {8, 99, -1, true}};
  plan.peers = {{0, {0, 1}, {2}}, {2, {}, {0}}};
  return plan;
}

void ExpectSame(const TrainerPlan& a, const TrainerPlan& b) {
  EXPECT_EQ(EncodePlan(PlanKind::kIteration, a), EncodePlan(PlanKind::kIteration, b));
  EXPECT_TRUE(a == b);  // every field, the ones the encoding could drop included
}

TEST(PlanCodecTest, RoundTripsEveryField) {
  const TrainerPlan plan = SamplePlan();
  PlanKind kind;
  TrainerPlan decoded;
  ASSERT_TRUE(DecodePlan(EncodePlan(PlanKind::kDrain, plan), &kind, &decoded).ok());
  EXPECT_EQ(kind, PlanKind::kDrain);
  ExpectSame(plan, decoded);
  EXPECT_EQ(decoded.global_samples, 6);
}

TEST(PlanCodecTest, CorruptionIsDataLoss) {
  Bytes bytes = EncodePlan(PlanKind::kIteration, SamplePlan());
  PlanKind kind;
  TrainerPlan decoded;
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    Bytes part(bytes.begin(), bytes.begin() + cut);
    EXPECT_TRUE(absl::IsDataLoss(DecodePlan(part, &kind, &decoded))) << cut;
  }
  TrainerPlan bad = SamplePlan();
  bad.unique_index[0] = 7;  // beyond the unique rows
  EXPECT_TRUE(absl::IsDataLoss(DecodePlan(EncodePlan(PlanKind::kIteration, bad), &kind, &decoded)));
}

TEST(OracleRoleTest, EvalPlansDeduplicateRowsPerShard) {
  Schema schema;
  schema.dense_names = {"d"};
  schema.table_names = {"a", "b"};
  schema.table_rows = {10, 5};
  Batch batch;
  batch.Reset(1, 2);
  batch.num_samples = 4;
  batch.labels = {1, 0, 1, 0};
  batch.dense = {1, 2, 3, 4};
  batch.offsets = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  batch.ids = {3, 3, 7, 3, 4, 4, 0, 4};
  TrainerPlan plan = MakeEvalPlan(batch, schema, /*trainer=*/0, /*num_trainers=*/2, 5);
  EXPECT_EQ(plan.num_samples, 2);
  EXPECT_EQ(plan.global_samples, 4);
  EXPECT_EQ(plan.unique_rows, (std::vector<RowId>{3, 14}));  // table b starts at RowId 10
  EXPECT_EQ(plan.unique_index, (std::vector<uint32_t>{0, 0, 1, 1}));
  EXPECT_EQ(plan.unique_slots, (std::vector<SlotId>{0, 1}));
  TrainerPlan second = MakeEvalPlan(batch, schema, 1, 2, 5);
  EXPECT_EQ(second.unique_rows, (std::vector<RowId>{7, 3, 10, 14}));
}

}  // namespace
}  // namespace bagpipe
