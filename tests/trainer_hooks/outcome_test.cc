// What trainers and servers report to rank 0 at the end of a job (trainer_hooks/job.h): a
// message that lacks a field, has one of the wrong type or is not JSON is a clear error naming
// the rank and the field, never an exception.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sync/wire.h"
#include "trainer_hooks/job.h"

namespace bagpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// An outcome message whose JSON part is `json` (the vectors empty).
Bytes OutcomeWithJson(const std::string& json) {
  WireWriter w;
  w.PutVector(std::vector<float>{});
  w.PutVector(std::vector<float>{});
  w.PutVector(std::vector<float>{});
  w.PutString(json);
  return w.Take();
}

TrainerOutcome SomeOutcome() {
  TrainerOutcome outcome;
  outcome.dense_parameters = {1.5f, -2.0f};
  outcome.eval_predictions = {0.25f};
  outcome.eval_labels = {1.0f};
  outcome.info = {{"iterations", 7}, {"train_loss", 0.5}};
  outcome.stats.hits = (int64_t{1} << 40) + 3;
  outcome.stats.fills = 9;
  outcome.stats.sync_seconds = 0.125;
  outcome.stats.dense_allreduce = "transport";
  return outcome;
}

TEST(OutcomeTest, RoundTrips) {
  const TrainerOutcome outcome = SomeOutcome();
  auto decoded = DecodeOutcome(EncodeOutcome(outcome), 3);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->dense_parameters, outcome.dense_parameters);
  EXPECT_EQ(decoded->eval_predictions, outcome.eval_predictions);
  EXPECT_EQ(decoded->eval_labels, outcome.eval_labels);
  EXPECT_EQ(decoded->info, outcome.info);
  EXPECT_EQ(decoded->stats.ToJson(), outcome.stats.ToJson());
}

TEST(OutcomeTest, AMissingFieldIsNamedWithTheRank) {
  nlohmann::json blob = {{"info", nlohmann::json::object()},
                         {"stats", SomeOutcome().stats.ToJson()}};
  blob["stats"].erase("fills");
  auto decoded = DecodeOutcome(OutcomeWithJson(blob.dump()), 4);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(absl::IsDataLoss(decoded.status()));
  EXPECT_THAT(decoded.status().message(),
              AllOf(HasSubstr("rank 4"), HasSubstr("\"fills\" is missing")));

  auto no_stats = DecodeOutcome(OutcomeWithJson(R"({"info": {}})"), 4);
  EXPECT_THAT(no_stats.status().message(), HasSubstr("\"stats\" is missing"));
}

TEST(OutcomeTest, AFieldOfTheWrongTypeIsNamed) {
  nlohmann::json blob = {{"info", nlohmann::json::object()},
                         {"stats", SomeOutcome().stats.ToJson()}};
  blob["stats"]["hits"] = "many";
  auto decoded = DecodeOutcome(OutcomeWithJson(blob.dump()), 5);
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(),
              AllOf(HasSubstr("rank 5"), HasSubstr("\"hits\" should be an integer, got string")));

  blob["stats"]["hits"] = 1;
  blob["stats"]["wait_seconds"] = nlohmann::json::array();
  EXPECT_THAT(DecodeOutcome(OutcomeWithJson(blob.dump()), 5).status().message(),
              HasSubstr("\"wait_seconds\" should be a number, got array"));
  blob["info"] = 3;
  EXPECT_THAT(DecodeOutcome(OutcomeWithJson(blob.dump()), 5).status().message(),
              HasSubstr("\"info\" should be an object, got number"));
}

TEST(OutcomeTest, NotJsonOrNotAnObjectIsDataLoss) {
  EXPECT_THAT(DecodeOutcome(OutcomeWithJson("{\"info\": "), 2).status().message(),
              AllOf(HasSubstr("rank 2"), HasSubstr("malformed JSON")));
  EXPECT_THAT(DecodeOutcome(OutcomeWithJson("[1, 2]"), 2).status().message(),
              HasSubstr("expected a JSON object, got array"));
  // A truncated message: the wire reader's error.
  Bytes bytes = EncodeOutcome(SomeOutcome());
  bytes.resize(bytes.size() / 2);
  EXPECT_TRUE(absl::IsDataLoss(DecodeOutcome(bytes, 2).status()));
}

TEST(OutcomeTest, ServerStatisticsAreCheckedTheSameWay) {
  ServerStats stats;
  stats.rows_fetched = 12;
  stats.bytes_per_row = 64;
  const std::string text = ServerStatsJson(stats).dump();
  auto decoded = DecodeServerStats(Bytes(text.begin(), text.end()), 1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->rows_fetched, 12);
  EXPECT_EQ(decoded->bytes_per_row, 64);

  const std::string partial = R"({"fetch_requests": 1})";
  EXPECT_THAT(DecodeServerStats(Bytes(partial.begin(), partial.end()), 2).status().message(),
              AllOf(HasSubstr("rank 2"), HasSubstr("\"rows_fetched\" is missing")));
  const std::string garbage = "not json";
  EXPECT_THAT(DecodeServerStats(Bytes(garbage.begin(), garbage.end()), 2).status().message(),
              HasSubstr("malformed JSON"));
}

}  // namespace
}  // namespace bagpipe
