// Options whose cost grows with their value whatever the data are refused up front with the
// estimate (trainer_hooks/job_limits.h), on a machine of a given memory.
#include "trainer_hooks/job_limits.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kMemory = int64_t{24} << 30;

JobShape CriteoLike() {
  JobShape shape;
  shape.num_tables = 26;
  shape.num_dense = 13;
  shape.batch_size = 1024;
  return shape;
}

TEST(JobLimitsTest, AnOrdinaryJobPasses) {
  EXPECT_TRUE(CheckJobLimits(CriteoLike(), kMemory).ok());
  JobShape shape = CriteoLike();
  shape.lookahead = 2000;
  shape.trainers = 4;
  shape.servers = 8;
  shape.server_link = *LinkModel::Parse("25Gbit/s,20us");
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());
}

TEST(JobLimitsTest, TheWindowGrowsWithTheLookaheadAndIsRefusedWithItsSize) {
  JobShape shape = CriteoLike();
  shape.lookahead = 100000;
  // Per slot: 26 tracks of bookkeeping and a batch of 1024 samples.
  EXPECT_GT(EstimateWindowBytes(shape), int64_t{100000} * 26 * 200);
  shape.lookahead = 1000000000;
  const absl::Status status = CheckJobLimits(shape, kMemory);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("--lookahead 1000000000"), HasSubstr(" TB"), HasSubstr("25.8 GB")));
}

// Bags of many ids (pooling) fill the window in proportion: a synthetic spec's pooling=20 was
// estimated as one id a table (38 MB against 1.13 GB measured at --lookahead 500).
TEST(JobLimitsTest, TheWindowCountsEveryIdOfABag) {
  JobShape shape = CriteoLike();
  shape.batch_size = 256;
  shape.lookahead = 5000;
  const int64_t one_hot = EstimateWindowBytes(shape);
  shape.ids_per_sample = 20.0 * shape.num_tables;
  const int64_t pooled = EstimateWindowBytes(shape);
  EXPECT_GT(pooled, 10 * one_hot);
  EXPECT_GT(pooled, int64_t{5000} * 256 * 26 * 20 * 20);  // at least 20 bytes an id
  const absl::Status status = CheckJobLimits(shape, kMemory);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("a batch of 256 samples of 520 ids per window slot"));
}

TEST(JobLimitsTest, TheTrainersCachesAndBuffersAreRefusedWithTheirSize) {
  JobShape shape = CriteoLike();
  shape.cache_rows = 1000000;
  shape.record_floats = 32;
  shape.dim = 16;
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());
  // A wide row: 100k floats per record; 1M rows of them are 400 GB (and 21 GB of buffers).
  shape.dim = 100000;
  shape.record_floats = 100000;
  EXPECT_GT(EstimateTrainerBytes(shape), int64_t{400} * 1000 * 1000 * 1000);
  absl::Status status = CheckJobLimits(shape, kMemory);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("--dim 100000"), HasSubstr("--cache-rows 1000000"),
                                      HasSubstr("421.3 GB"), HasSubstr("25.8 GB")));
  // Embedded: every trainer's share counts; under mpirun, one trainer's.
  shape.cache_rows = 50000;  // 20 GB per trainer
  shape.trainers = 4;
  EXPECT_FALSE(CheckJobLimits(shape, kMemory).ok());
  shape.embedded = false;
  shape.cache_rows = 10000;  // 4 GB, and 5.3 GB of buffers for a quarter of the batch
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());
  // Caches on a GPU are not host memory (the device reports its own allocation failures).
  shape.embedded = true;
  shape.cache_rows = 1000000;
  shape.host_trainers = false;
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());
}

TEST(JobLimitsTest, EmbeddedJobsRefuseThousandsOfServerThreads) {
  JobShape shape = CriteoLike();
  shape.servers = 100000;
  EXPECT_THAT(CheckJobLimits(shape, kMemory).message(),
              AllOf(HasSubstr("--servers 100000"), HasSubstr("thread"), HasSubstr("mpirun")));
  // Under mpirun every server is a process the launcher started: no thread limit here.
  shape.embedded = false;
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());
  // A small machine: the role threads' memory.
  shape.embedded = true;
  shape.servers = 200;
  EXPECT_THAT(CheckJobLimits(shape, int64_t{2} << 30).message(),
              AllOf(HasSubstr("--servers 200"), HasSubstr("role threads")));
}

TEST(JobLimitsTest, LinksThatCouldNeverDeliverInTimeAreRefused) {
  JobShape shape = CriteoLike();
  shape.server_link = *LinkModel::Parse("10Gbit/s,1000h");
  EXPECT_THAT(CheckJobLimits(shape, kMemory).message(),
              AllOf(HasSubstr("--server-link"), HasSubstr("latency of 1000h"),
                    HasSubstr("peer timeout (1m)")));
  shape.server_link = *LinkModel::Parse("1bit/s");
  EXPECT_THAT(CheckJobLimits(shape, kMemory).message(),
              AllOf(HasSubstr("--server-link"), HasSubstr("one iteration's rows")));
  // The same link passes with a peer timeout long enough for it.
  shape.server_link = *LinkModel::Parse("100Mbit/s,50ms");
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());
  shape.peer_timeout = absl::Milliseconds(80);
  EXPECT_THAT(CheckJobLimits(shape, kMemory).message(), HasSubstr("latency of 50ms"));
}

}  // namespace
}  // namespace bagpipe
