// JobConfig is the one place a job's options are set: Resolve derives the planner's, trainers'
// and oracle's options from it so that they agree, and every contradiction — in a JobConfig or
// in a JobOptions assembled by hand — is rejected with an error naming the options and values.
#include "trainer_hooks/job_config.h"

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/binary_format.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sync/roles.h"
#include "tests/data/data_testing.h"
#include "trainer_hooks/job_limits.h"

namespace bagpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

Schema SmallSchema() {
  Schema schema;
  schema.dense_names = {"d0", "d1"};
  schema.table_names = {"t0", "t1", "t2"};
  schema.table_rows = {100, 40, 1000};
  return schema;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(JobConfigTest, ResolveDerivesEveryComponentFromOnePlace) {
  JobConfig config;
  config.trainers = 2;
  config.servers = 3;
  config.cache = CachePolicy::kOracle;
  config.cache_rows = 500;
  config.lookahead = 7;
  config.dim = 8;
  config.optimizer = {OptimizerKind::kAdagrad, 0.01f, 1e-10f, 0.25f};
  config.iterations = 30;
  config.plan_queue_depth = 5;
  auto options = config.Resolve(SmallSchema());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->layout.trainers, 2);
  EXPECT_EQ(options->layout.servers, 3);
  EXPECT_EQ(options->oracle.planner.num_trainers, 2);
  EXPECT_EQ(options->oracle.planner.capacity, 500);
  EXPECT_EQ(options->trainer.cache_rows, 500);
  EXPECT_EQ(options->oracle.planner.lookahead, 7);
  EXPECT_EQ(options->oracle.planner.policy, CachePolicy::kOracle);
  EXPECT_EQ(options->trainer.policy, CachePolicy::kOracle);
  EXPECT_EQ(options->trainer.dim, 8);
  EXPECT_EQ(options->trainer.sparse_optimizer.eps, 1e-10f);
  EXPECT_EQ(options->trainer.initializer.dim(), 8);
  EXPECT_EQ(options->trainer.initializer.state_floats(), 8);
  EXPECT_EQ(options->trainer.initializer.initial_accumulator(), 0.25f);
  EXPECT_EQ(options->trainer.initializer.table_offsets(), SmallSchema().TableOffsets());
  EXPECT_EQ(options->oracle.max_iterations, 30);
  EXPECT_EQ(options->oracle.plan_queue_depth, 5);
  EXPECT_TRUE(ValidateJobOptions(*options).ok());

  // The reactive policies plan one batch at a time whatever the lookahead.
  config.cache = CachePolicy::kLru;
  options = config.Resolve(SmallSchema());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->oracle.planner.lookahead, 1);
  // The default capacity follows the schema, the batch and the trainers.
  config.cache_rows = 0;
  options = config.Resolve(SmallSchema());
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->trainer.cache_rows, DefaultCacheRows(SmallSchema(), config.batch_size, 2));
  EXPECT_EQ(options->oracle.planner.capacity, options->trainer.cache_rows);
  // Four local batches of ids would exceed the tables' rows: the default holds every row, no
  // more.
  Schema tiny;
  tiny.table_names = {"a", "b"};
  tiny.table_rows = {30, 20};
  EXPECT_EQ(DefaultCacheRows(tiny, 1024, 2), 50);
  EXPECT_EQ(DefaultCacheRows(tiny, 4, 1), 32);  // 4 x 4 x 2 ids, under the 50 rows
}

TEST(JobConfigTest, DenseOptimizerFollowsTheEmbeddingOneUnlessSetAndZeroMeansZero) {
  JobConfig config;
  config.optimizer = {OptimizerKind::kRowwiseAdagrad, 0.05f, 1e-9f, 0.5f};
  OptimizerConfig dense = config.DenseOptimizer();
  EXPECT_EQ(dense.kind, OptimizerKind::kAdagrad);  // dense parameters have no rows
  EXPECT_EQ(dense.learning_rate, 0.05f);
  EXPECT_EQ(dense.eps, 1e-9f);
  EXPECT_EQ(dense.initial_accumulator, 0.5f);
  config.dense_optimizer = OptimizerKind::kSgd;
  config.dense_lr = 0.0f;  // "--dense-lr 0" freezes the dense model, it does not mean "unset"
  config.dense_eps = 1e-6f;
  config.dense_initial_accumulator = 0.0f;
  dense = config.DenseOptimizer();
  EXPECT_EQ(dense.kind, OptimizerKind::kSgd);
  EXPECT_EQ(dense.learning_rate, 0.0f);
  EXPECT_EQ(dense.eps, 1e-6f);
  EXPECT_EQ(dense.initial_accumulator, 0.0f);
  EXPECT_TRUE(config.Validate().ok());
  const nlohmann::json json = config.ToJson();
  EXPECT_EQ(json["dense_lr"].get<float>(), 0.0f);
  EXPECT_EQ(json["eps"].get<float>(), 1e-9f);
  EXPECT_EQ(json["dense_optimizer"], "sgd");
}

TEST(JobConfigTest, ContradictionsAreRejectedNamingTheOptions) {
  JobConfig config;
  config.trainers = 2;
  config.oracle_split_parts = 4;
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("--oracle-split-parts 4"), HasSubstr("--trainers 2")));
  config = JobConfig();
  config.cache = CachePolicy::kDevice;
  config.oracle_split_parts = 2;
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("--oracle-split-parts 2"), HasSubstr("--cache device")));
  config = JobConfig();
  config.optimizer = {OptimizerKind::kAdagrad, 0.05f, 0.0f, 0.0f};
  EXPECT_THAT(Message(config.Validate()), AllOf(HasSubstr("--eps 0"), HasSubstr("adagrad")));
  config.optimizer.eps = 1e-8f;
  config.optimizer.initial_accumulator = -1;
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--initial-accumulator -1"));
  config = JobConfig();
  config.dense_lr = -0.5f;
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--dense-lr -0.5"));
  config = JobConfig();
  config.optimizer = {OptimizerKind::kSgd, 0.05f, 0.0f, 0.0f};  // SGD has no eps: fine...
  EXPECT_TRUE(config.Validate().ok());
  config.dense_optimizer = OptimizerKind::kAdagrad;  // ...but the dense Adagrad inherits 0
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--dense-eps 0"));
  config = JobConfig();
  config.cache_rows = -3;
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--cache-rows -3"));
  config = JobConfig();
  config.eval_fraction = 1.5;
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--eval-fraction 1.5"));
  config = JobConfig();
  config.lookahead = 0;
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--lookahead 0"));
  // The oracle may run at most 1024 plans ahead of a trainer (each holds megabytes).
  config = JobConfig();
  config.plan_queue_depth = 1024;
  EXPECT_TRUE(config.Validate().ok());
  config.plan_queue_depth = 1025;
  EXPECT_THAT(Message(config.Validate()),
              AllOf(HasSubstr("--plan-queue-depth 1025"), HasSubstr("[1, 1024]")));
  config.plan_queue_depth = 0;
  EXPECT_THAT(Message(config.Validate()), HasSubstr("--plan-queue-depth 0"));
}

TEST(JobConfigTest, MpirunLayoutMismatchesAreRejected) {
  JobConfig config;
  config.servers = 1;
  auto options = config.Resolve(SmallSchema(), /*world_size=*/4);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->layout.trainers, 2);  // implied by the world size
  EXPECT_EQ(options->oracle.planner.num_trainers, 2);
  config.trainers = 3;
  EXPECT_THAT(Message(config.Resolve(SmallSchema(), 4).status()),
              AllOf(HasSubstr("--trainers 3"), HasSubstr("4 ranks"), HasSubstr("--servers 1"),
                    HasSubstr("leaves 2 trainers")));
  config.trainers = 0;
  config.servers = 3;
  EXPECT_THAT(Message(config.Resolve(SmallSchema(), 4).status()), HasSubstr("leaves no trainer"));
  config.servers = 1;
  config.server_link = *LinkModel::Parse("1Gbit/s,100us");
  EXPECT_THAT(Message(config.Resolve(SmallSchema(), 4).status()), HasSubstr("--server-link"));
  EXPECT_TRUE(config.Resolve(SmallSchema()).ok());  // embedded: the link is emulated
  // Splitting is for one trainer: an mpirun world that implies two is refused.
  config = JobConfig();
  config.oracle_split_parts = 2;
  EXPECT_THAT(Message(config.Resolve(SmallSchema(), 4).status()),
              AllOf(HasSubstr("--oracle-split-parts 2"), HasSubstr("--trainers 2")));
}

TEST(JobConfigTest, HandAssembledJobOptionsThatDisagreeAreRejected) {
  JobConfig config;
  config.trainers = 2;
  config.cache_rows = 500;
  config.dim = 4;
  config.optimizer = {OptimizerKind::kAdagrad, 0.05f, 1e-8f, 0.1f};
  const auto good = config.Resolve(SmallSchema());
  ASSERT_TRUE(good.ok()) << good.status();

  JobOptions options = *good;
  options.oracle.planner.num_trainers = 1;  // a planner sized for fewer trainers
  EXPECT_THAT(Message(ValidateJobOptions(options)),
              AllOf(HasSubstr("plans for 1 trainer"), HasSubstr("has 2")));
  options = *good;
  options.oracle.planner.capacity = 800;  // slots past the cache
  EXPECT_THAT(Message(ValidateJobOptions(options)),
              AllOf(HasSubstr("cache of 800 rows"), HasSubstr("holds 500")));
  options = *good;
  options.oracle.planner.policy = CachePolicy::kLru;
  EXPECT_THAT(Message(ValidateJobOptions(options)),
              AllOf(HasSubstr("--cache lru"), HasSubstr("--cache oracle")));
  options = *good;
  options.trainer.dim = 8;
  EXPECT_THAT(Message(ValidateJobOptions(options)),
              AllOf(HasSubstr("dim 4"), HasSubstr("--dim 8")));
  options = *good;
  options.trainer.sparse_optimizer.kind = OptimizerKind::kSgd;  // records of another size
  EXPECT_THAT(Message(ValidateJobOptions(options)),
              AllOf(HasSubstr("4 optimizer-state"), HasSubstr("sgd keeps 0")));
  options = *good;
  options.trainer.sparse_optimizer.initial_accumulator = 0.0f;
  EXPECT_THAT(Message(ValidateJobOptions(options)), HasSubstr("accumulator 0.1"));
  options = *good;
  Schema other = SmallSchema();
  other.table_rows[1] = 41;
  options.oracle.planner.schema = other;
  EXPECT_THAT(Message(ValidateJobOptions(options)), HasSubstr("tables of"));
  options = *good;
  options.trainer.sparse_optimizer.eps = 0;
  EXPECT_THAT(Message(ValidateJobOptions(options)), HasSubstr("eps"));
  // kDevice ignores the capacity.
  config.cache = CachePolicy::kDevice;
  const auto device = config.Resolve(SmallSchema());
  ASSERT_TRUE(device.ok()) << device.status();
  options = *device;
  options.oracle.planner.capacity = 0;
  EXPECT_TRUE(ValidateJobOptions(options).ok());
}

TEST(JobConfigTest, OpenJobDataReadsTheSourceAndItsHeldOutTail) {
  JobConfig config;
  config.data = "synthetic:samples=1000,tables=3,seed=4";
  config.batch_size = 128;
  config.eval_fraction = 0.25;
  auto data = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->schema.num_tables(), 3);
  ASSERT_NE(data->train, nullptr);
  ASSERT_NE(data->eval, nullptr);
  int64_t train_samples = 0, eval_samples = 0;
  Batch batch;
  while (*data->train->Next(&batch)) train_samples += batch.num_samples;
  while (*data->eval->Next(&batch)) eval_samples += batch.num_samples;
  EXPECT_EQ(train_samples, 750);
  EXPECT_EQ(eval_samples, 250);
  // The counts the progress bars show, known without reading the stream.
  EXPECT_EQ(data->train_samples, 750);
  EXPECT_EQ(data->eval_samples, 250);
  config.eval_fraction = 0;
  config.source.max_samples = 600;
  auto limited = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->train_samples, 600);
  EXPECT_EQ(limited->eval_samples, -1);
  config.source.max_samples = -1;
  config.eval_fraction = 0.25;
  auto schema_only = OpenJobData(config, /*stream=*/false);
  ASSERT_TRUE(schema_only.ok());
  EXPECT_EQ(schema_only->train, nullptr);
  EXPECT_EQ(schema_only->schema, data->schema);
  config.data = "nosuch:x";
  EXPECT_FALSE(OpenJobData(config, true).ok());
}

// The whole source's size, for checkpoints (a --max-samples at or above it selects every
// sample): where known without reading more than the job does.
TEST(JobConfigTest, OpenJobDataKnowsTheWholeSourcesSizeWhereItCan) {
  JobConfig config;
  config.data = "synthetic:samples=1000,tables=3,seed=4";
  config.source.max_samples = 600;
  auto synthetic = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  EXPECT_EQ(synthetic->train_samples, 600);
  EXPECT_EQ(synthetic->source_samples, 1000);
  // A binary file's header.
  const std::string bin = TestTempPath("job_config_test", "whole.bin");
  {
    auto source = OpenSource(config.data, SourceOptions{});
    ASSERT_TRUE(source.ok());
    ASSERT_TRUE(WriteBinary(**source, bin).ok());
  }
  config.data = "bin:" + bin;
  auto binary = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(binary.ok()) << binary.status();
  EXPECT_EQ(binary->train_samples, 600);
  EXPECT_EQ(binary->source_samples, 1000);
  // Text: the scan for the table sizes reads it to its end only where --max-samples is beyond.
  config.data = "csv:" + std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  config.source.schema = "label=rating>3.5; sparse=userId,movieId";
  config.source.max_samples = 200000;
  auto whole = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->source_samples, 100004);
  config.source.max_samples = 100004;  // the scan stops there: more lines may follow
  auto stopped = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->train_samples, 100004);
  EXPECT_EQ(stopped->source_samples, -1);
}

// A stop during a pass over the whole data before training (minutes on a Criteo day file) ends
// it at the next block of samples, with the stopped line.
TEST(JobConfigTest, OpenJobDataStopsDuringItsPassesOverTheData) {
  const std::string movielens =
      std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  JobConfig config;
  config.data = "csv:" + movielens;  // dictionary-encoded: scanned for the table sizes
  config.source.schema = "label=rating>3.5; sparse=userId,movieId";
  config.batch_size = 1024;
  int polls = 0;
  const StopPoll second_poll = [&polls] { return ++polls >= 2 ? SIGTERM : 0; };
  auto scanned = OpenJobData(config, /*stream=*/true, nullptr, second_poll);
  ASSERT_TRUE(absl::IsCancelled(scanned.status())) << scanned.status();
  EXPECT_THAT(std::string(scanned.status().message()),
              HasSubstr("stopped by SIGTERM while scanning the data for the table sizes (stop "
                        "requested (signal 15) after 65536 samples of csv:" +
                        movielens));
  EXPECT_THAT(std::string(scanned.status().message()), HasSubstr("; nothing saved"));
  EXPECT_EQ(polls, 2);
  // Without a stop the same data opens (the poll is read at every block: 100,004 samples).
  polls = -100;
  ASSERT_TRUE(OpenJobData(config, true, nullptr, second_poll).ok());
  EXPECT_EQ(polls, -100 + 3);

  config.data = "synthetic:samples=200000,tables=2,seed=4";
  config.source.schema.clear();
  config.eval_fraction = 0.1;  // counts the samples first
  auto counted = OpenJobData(config, true, nullptr, [] { return SIGUSR1; });
  ASSERT_TRUE(absl::IsCancelled(counted.status())) << counted.status();
  EXPECT_THAT(std::string(counted.status().message()),
              HasSubstr("stopped by SIGUSR1 while counting the samples for --eval-fraction"));
}

// Under mpirun only rank 0 opens the data; the other ranks learn its schema (here over
// in-process ranks), so they need no access to the file and a dictionary-encoded file is
// scanned once per job.
std::vector<absl::StatusOr<JobData>> OpenOnRanks(const std::vector<JobConfig>& configs,
                                                 std::vector<StopPoll> polls = {}) {
  polls.resize(configs.size());
  const int n = static_cast<int>(configs.size());
  InProcessHub hub(n);
  std::vector<absl::StatusOr<JobData>> opened;
  for (int r = 0; r < n; ++r) opened.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      opened[r] = OpenJobDataOnRankZero(configs[r], &hub.endpoint(r), nullptr, polls[r]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return opened;
}

TEST(JobConfigTest, OnlyRankZeroOpensTheDataAndTellsTheOthersItsSchema) {
  const std::string movielens =
      std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  JobConfig config;
  config.data = "csv:" + movielens;  // dictionary-encoded: rank 0 scans it for the table sizes
  config.source.schema = "label=rating>3.5; dense=year; sparse=userId,movieId";
  config.batch_size = 1024;
  // Ranks 1 and 2 were given a path their machine does not have: they never open it.
  JobConfig elsewhere = config;
  elsewhere.data = "csv:/nonexistent/movielens_small.csv";
  auto opened = OpenOnRanks({config, elsewhere, elsewhere});
  auto alone = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(opened[0].ok()) << opened[0].status();
  ASSERT_NE(opened[0]->train, nullptr);
  EXPECT_EQ(opened[0]->schema, alone->schema);
  EXPECT_GT(alone->schema.table_rows[0], 600);  // the scan counted the users
  EXPECT_EQ(alone->train_samples, 100004);      // counted by the scan
  for (int r = 1; r < 3; ++r) {
    ASSERT_TRUE(opened[r].ok()) << opened[r].status();
    EXPECT_EQ(opened[r]->train_samples, 100004);  // told by rank 0, for the bars
    EXPECT_EQ(opened[r]->schema, alone->schema);
    EXPECT_EQ(opened[r]->description, alone->description);
    EXPECT_EQ(opened[r]->train, nullptr);
    EXPECT_EQ(opened[r]->eval, nullptr);
  }
  // One process (no transport, or a single rank) opens the data itself.
  auto embedded = OpenJobDataOnRankZero(config, nullptr);
  ASSERT_TRUE(embedded.ok()) << embedded.status();
  EXPECT_NE(embedded->train, nullptr);
}

// A binary file of 2 tables whose every bag holds 20 ids.
std::string PooledBinary() {
  const std::string path = TestTempPath("job_config_test", "pooled.bin");
  auto source = OpenSynthetic("samples=300,rows=50/20,pooling=20,seed=3", {});
  EXPECT_TRUE(source.ok()) << source.status();
  if (source.ok()) EXPECT_TRUE(WriteBinary(**source, path).ok());
  return path;
}

// The mean ids a sample carries, which the oracle's window grows with, where the data know it
// without a pass of its own: a binary file's header, the scan of dictionary-encoded text. Under
// mpirun every rank learns rank 0's value, so that every rank's memory check decides the same.
TEST(JobConfigTest, TheDataSayHowManyIdsASampleCarries) {
  JobConfig config;
  config.data = "bin:" + PooledBinary();
  config.batch_size = 64;
  auto data = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->ids_per_sample, 40.0);
  config.eval_fraction = 0.25;  // the whole file's mean stands for the training part's
  data = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->ids_per_sample, 40.0);
  config.eval_fraction = 0;

  // Dictionary-encoded Criteo (scanned): one id a table; hashed Criteo is not scanned.
  config.data =
      "criteo:" + std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/criteo_kaggle_sample_100.tsv";
  data = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->ids_per_sample, 26.0);
  config.source.row_budget = 1000;
  data = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->ids_per_sample, -1);
  config.source.row_budget = 0;
  // A synthetic spec's pooling is read by Resolve.
  config.data = "synthetic:samples=100,tables=2,pooling=4";
  data = OpenJobData(config, /*stream=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->ids_per_sample, -1);

  // CSV with multi-id bags (1-10 genres a movie), scanned by rank 0 alone.
  config.data = "csv:" + std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  config.source.schema = "label=rating>3.5; sparse=userId,movieId,split(genres,|)";
  JobConfig elsewhere = config;
  elsewhere.data = "csv:/nonexistent/movielens_small.csv";
  auto opened = OpenOnRanks({config, elsewhere});
  ASSERT_TRUE(opened[0].ok()) << opened[0].status();
  ASSERT_TRUE(opened[1].ok()) << opened[1].status();
  EXPECT_GT(opened[0]->ids_per_sample, 3.0);
  EXPECT_LT(opened[0]->ids_per_sample, 12.0);
  EXPECT_EQ(opened[1]->ids_per_sample, opened[0]->ids_per_sample);  // the same double
}

// A multi-hot binary file's window is estimated at its bags' size: a --lookahead whose window
// fits at one id a table but not at the file's 40 ids a sample is refused up front with the
// estimate, instead of running out of memory mid-run. Nothing is allocated for the window.
TEST(JobConfigTest, AMultiHotBinaryFilesWindowIsEstimatedAtItsBags) {
  JobConfig config;
  config.data = "bin:" + PooledBinary();
  config.batch_size = 1024;
  auto data = OpenJobData(config, /*stream=*/false);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->ids_per_sample, 40.0);

  // The lookahead just past half of `memory` at 40 ids a sample (the window holds
  // lookahead + 4 slots).
  JobShape shape;
  shape.batch_size = config.batch_size;
  shape.num_tables = data->schema.num_tables();
  shape.num_dense = data->schema.num_dense();
  const auto lookahead_past_half = [&](int64_t memory) {
    shape.lookahead = 0;
    shape.ids_per_sample = data->ids_per_sample;
    const int64_t per_slot = EstimateWindowBytes(shape) / 4;
    shape.lookahead = static_cast<int>(memory / 2 / per_slot + 1);
    EXPECT_GT(EstimateWindowBytes(shape), memory / 2);
    shape.ids_per_sample = 0;  // one id a table
    EXPECT_LE(EstimateWindowBytes(shape), memory / 2);
    return shape.lookahead;
  };
  // On a machine of 24 GiB.
  constexpr int64_t kMemory = int64_t{24} << 30;
  const int lookahead = lookahead_past_half(kMemory);
  shape.ids_per_sample = data->ids_per_sample;
  EXPECT_THAT(Message(CheckJobLimits(shape, kMemory)),
              AllOf(HasSubstr(absl::StrCat("--lookahead ", lookahead)),
                    HasSubstr("a batch of 1024 samples of 40 ids per window slot")));
  shape.ids_per_sample = 0;  // an unknown mean: one id a table, as before
  EXPECT_TRUE(CheckJobLimits(shape, kMemory).ok());

  // Resolve checks against this machine's memory with the data's mean.
  const int64_t memory = PhysicalMemoryBytes();
  if (memory <= 0) GTEST_SKIP() << "this machine's memory is unknown";
  config.lookahead = lookahead_past_half(memory);
  EXPECT_THAT(Message(config.Resolve(data->schema, 0, data->ids_per_sample).status()),
              AllOf(HasSubstr(absl::StrCat("--lookahead ", config.lookahead,
                                           ": the oracle's window would take about")),
                    HasSubstr("of 40 ids per window slot")));
  // Unknown (-1, or a caller that does not say): one id a table, which fits.
  EXPECT_TRUE(config.Resolve(data->schema, 0, -1).ok());
  EXPECT_TRUE(config.Resolve(data->schema).ok());
}

TEST(JobConfigTest, RankZerosErrorOpeningTheDataEndsEveryRankWithItsCode) {
  JobConfig config;
  config.data = "csv:/nonexistent/data.csv";
  config.source.schema = "label=rating>3.5; sparse=userId";
  JobConfig good = config;
  good.data = "synthetic:samples=1000,tables=3,seed=4";  // never opened: rank 0 decides
  auto opened = OpenOnRanks({config, good});
  ASSERT_FALSE(opened[0].ok());
  ASSERT_FALSE(opened[1].ok());
  EXPECT_EQ(opened[1].status().code(), opened[0].status().code());
  EXPECT_EQ(Message(opened[1].status()), "rank 0: " + Message(opened[0].status()));
  EXPECT_THAT(Message(opened[1].status()), HasSubstr("/nonexistent/data.csv"));

  // A stop during rank 0's scan stops every rank (Cancelled: exit status 75).
  JobConfig scanned;
  scanned.data = "csv:" + std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  scanned.source.schema = "label=rating>3.5; sparse=userId,movieId";
  int polls = 0;
  auto stopped =
      OpenOnRanks({scanned, scanned}, {[&polls] { return ++polls >= 2 ? SIGTERM : 0; }, nullptr});
  ASSERT_TRUE(absl::IsCancelled(stopped[0].status())) << stopped[0].status();
  ASSERT_TRUE(absl::IsCancelled(stopped[1].status())) << stopped[1].status();
  EXPECT_THAT(Message(stopped[1].status()),
              HasSubstr("rank 0: stopped by SIGTERM while scanning the data for the table sizes"));
}

TEST(JobConfigTest, AStopOnARankWaitingForTheSchemaStopsRankZerosScanAndEveryRank) {
  // Rank 1's stop goes to rank 0 as a stop request, which its scan polls between blocks of
  // samples (rank 0's own poll here waits until the request has arrived, so that the scan of
  // the small file cannot end first).
  JobConfig config;
  config.data = "csv:" + std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  config.source.schema = "label=rating>3.5; sparse=userId,movieId";
  InProcessHub hub(2);
  absl::StatusOr<JobData> zero = absl::UnknownError("not run");
  std::thread rank0([&] {
    zero = OpenJobDataOnRankZero(config, &hub.endpoint(0), nullptr, [&hub] {
      for (int k = 0; k < 10000 && hub.endpoint(0).SourcesWithPending(kTagStopRequest).empty();
           ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return 0;
    });
  });
  int polls = 0;
  auto one = OpenJobDataOnRankZero(config, &hub.endpoint(1), nullptr,
                                   [&polls] { return ++polls >= 2 ? SIGUSR1 : 0; });
  rank0.join();
  ASSERT_TRUE(absl::IsCancelled(zero.status())) << zero.status();
  EXPECT_THAT(Message(zero.status()),
              HasSubstr("stopped by SIGUSR1 while scanning the data for the table sizes"));
  ASSERT_TRUE(absl::IsCancelled(one.status())) << one.status();
  EXPECT_EQ(Message(one.status()), "rank 0: " + Message(zero.status()));
  EXPECT_EQ(polls, 2);  // forwarded once, then it waited for rank 0's word

  // A malformed message from rank 0 is an error, not a crash.
  InProcessHub other(2);
  ASSERT_TRUE(other.endpoint(0).Send(1, kTagSchema, Bytes{'{', 'x'}).ok());
  auto malformed = OpenJobDataOnRankZero(config, &other.endpoint(1));
  EXPECT_TRUE(absl::IsDataLoss(malformed.status())) << malformed.status();
}

}  // namespace
}  // namespace bagpipe
