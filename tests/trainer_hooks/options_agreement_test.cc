// The ranks of an mpirun job compare the options that must agree before anything runs
// (trainer_hooks/options_agreement.h); here over in-process ranks.
#include "trainer_hooks/options_agreement.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs the agreement round with rank r's options `options[r]`; returns every rank's status.
std::vector<absl::Status> Agree(const std::vector<nlohmann::json>& options) {
  const int n = static_cast<int>(options.size());
  InProcessHub hub(n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] = CheckOptionsAgree(hub.endpoint(r), options[r], absl::Seconds(30));
    });
  }
  for (auto& thread : threads) thread.join();
  return statuses;
}

JobOptions SomeJob() {
  JobOptions options;
  options.layout = {1, 2};
  options.trainer.dim = 16;
  options.trainer.sparse_optimizer = {OptimizerKind::kAdagrad, 0.05f, 1e-8f, 0.0f};
  options.oracle.planner.schema.table_rows = {100, 200};
  options.checkpoint.identity = {{"--batch-size", 1024}};
  return options;
}

TEST(OptionsAgreementTest, EqualOptionsPassOnEveryRank) {
  const nlohmann::json agreed = OptionsThatMustAgree(SomeJob());
  for (const absl::Status& status : Agree({agreed, agreed, agreed, agreed})) {
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(OptionsAgreementTest, AMismatchFailsEveryRankNamingTheOptionAndTheRanks) {
  JobOptions other = SomeJob();
  other.trainer.sparse_optimizer.learning_rate = 0.1f;
  const nlohmann::json mine = OptionsThatMustAgree(SomeJob());
  const nlohmann::json theirs = OptionsThatMustAgree(other);
  const std::vector<absl::Status> statuses = Agree({mine, mine, theirs, theirs});
  for (const absl::Status& status : statuses) {
    ASSERT_FALSE(status.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("--lr is 0.05 on rank 0 but 0.1 on ranks 2, 3"),
                                        HasSubstr("different options")));
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("--dim")));
  }
}

TEST(OptionsAgreementTest, EveryDifferingOptionIsNamedWithEachValue) {
  JobOptions a = SomeJob(), b = SomeJob();
  a.trainer.dim = 8;
  a.trainer.policy = CachePolicy::kLru;
  b.trainer.dim = 32;
  b.checkpoint.identity["--batch-size"] = 512;
  const std::vector<absl::Status> statuses =
      Agree({OptionsThatMustAgree(SomeJob()), OptionsThatMustAgree(a), OptionsThatMustAgree(b)});
  const std::string message(statuses[1].message());
  EXPECT_THAT(message, HasSubstr("--dim is 16 on rank 0 but 8 on rank 1, 32 on rank 2"));
  EXPECT_THAT(message, HasSubstr("--cache is 'oracle' on rank 0 but 'lru' on rank 1"));
  EXPECT_THAT(message, HasSubstr("--batch-size is 1024 on rank 0 but 512 on rank 2"));
  EXPECT_EQ(statuses[0].message(), message);
}

TEST(OptionsAgreementTest, LongOrControlCharacterValuesAreEscapedAndCutShort) {
  nlohmann::json mine = {{"--model", "dlrm"}};
  nlohmann::json theirs = {{"--model", std::string("dl\x01rm") + std::string(200, 'x')}};
  const std::vector<absl::Status> statuses = Agree({mine, theirs});
  const std::string message(statuses[0].message());
  EXPECT_THAT(message, HasSubstr("'dl\\x01rmxxx"));
  EXPECT_THAT(message, HasSubstr("..."));
  EXPECT_LT(message.size(), 300u);
}

}  // namespace
}  // namespace bagpipe
