// The pull-style Job: the caller's own threads drive the trainers it hands out (as a PyTorch loop
// does), with the same results as the callback-driven RunEmbeddedJob; a failure or an abort on
// any thread ends every blocked call with the root cause, and nothing hangs.
#include "trainer_hooks/job.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

#include "core/status.h"
#include "core/timer.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer_hooks/job_config.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

constexpr char kData[] =
    "synthetic:samples=4000,rows=300/50/900,dense=2,alpha=1.1,pooling=1-2,seed=5";

JobConfig SmallConfig(int trainers, CachePolicy cache) {
  JobConfig config;
  config.data = kData;
  config.batch_size = 64;
  config.iterations = 40;
  config.trainers = trainers;
  config.servers = 1;
  config.cache = cache;
  config.cache_rows = 600;
  config.lookahead = 8;
  config.dim = 4;
  config.optimizer = {OptimizerKind::kAdagrad, 0.1f, 1e-8f, 0.0f};
  config.deterministic = true;
  config.peer_timeout = absl::Seconds(60);
  return config;
}

// A started job of `config` (the test fails if it cannot start).
std::unique_ptr<Job> StartJob(const JobConfig& config) {
  auto data = OpenJobData(config, true);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return nullptr;
  auto options = config.Resolve(data->schema);
  EXPECT_TRUE(options.ok()) << options.status();
  if (!options.ok()) return nullptr;
  auto job = Job::Start(*options, std::move(data->train), nullptr);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? std::move(*job) : nullptr;
}

// An embedding-only model: logit = sum of the pooled embeddings; the loss's gradient goes back.
absl::Status SumLoop(Trainer& trainer, TrainerOutcome* outcome, int stop_after = -1) {
  LocalBatch batch;
  std::vector<float> pooled, grad;
  int64_t iterations = 0;
  while (true) {
    if (stop_after >= 0 && iterations == stop_after) {
      return absl::InternalError("the loop gave up on purpose");
    }
    ASSIGN_OR_RETURN(const bool more, trainer.BeginIteration(&batch));
    if (!more) break;
    const size_t width = static_cast<size_t>(batch.num_tables) * 4;
    pooled.resize(batch.num_samples * width);
    RETURN_IF_ERROR(trainer.LookupPooledInto(pooled.data()));
    grad.assign(pooled.size(), 0.0f);
    for (int s = 0; s < batch.num_samples; ++s) {
      float logit = 0;
      for (size_t k = 0; k < width; ++k) logit += pooled[s * width + k];
      const float p = 1.0f / (1.0f + std::exp(-logit));
      const float d = (p - batch.labels_host[s]) / static_cast<float>(batch.global_batch_size);
      for (size_t k = 0; k < width; ++k) grad[s * width + k] = d;
    }
    RETURN_IF_ERROR(trainer.EndIteration(grad.data()));
    ++iterations;
  }
  outcome->info["iterations"] = iterations;
  return absl::OkStatus();
}

std::string Sha(const JobOptions& options,
                const std::function<absl::Status(JobOptions, std::unique_ptr<BatchStream>,
                                                 const ParamSink&, JobResult*)>& run) {
  auto writer = ParamWriter::Create(
      "", {}, RecordFloats(options.trainer.sparse_optimizer.kind, options.trainer.dim));
  EXPECT_TRUE(writer.ok());
  ParamSink sink;
  sink.dense = [&](const std::vector<float>& dense) { return (*writer)->AddDense(dense); };
  sink.row = [&](RowId row, const float* record) { return (*writer)->AddRow(row, record); };
  JobConfig config;
  config.data = kData;
  config.batch_size = 64;
  config.iterations = 40;
  auto data = OpenJobData(config, true);
  EXPECT_TRUE(data.ok());
  JobResult result;
  const absl::Status status = run(options, std::move(data->train), sink, &result);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GT(result.parameter_rows, 0);
  auto sha = (*writer)->Finish();
  return sha.ok() ? *sha : "";
}

TEST(JobTest, CallerThreadsDriveTheTrainersWithTheSameResultAsRunEmbeddedJob) {
  for (int trainers : {1, 2}) {
    auto options =
        SmallConfig(trainers, CachePolicy::kOracle)
            .Resolve(OpenJobData(SmallConfig(trainers, CachePolicy::kOracle), false)->schema);
    ASSERT_TRUE(options.ok()) << options.status();
    const std::string callback = Sha(*options, [](JobOptions o, std::unique_ptr<BatchStream> train,
                                                  const ParamSink& sink, JobResult* result) {
      return RunEmbeddedJob(
          o, std::move(train), nullptr,
          [](Trainer& trainer, TrainerOutcome* outcome) { return SumLoop(trainer, outcome); }, sink,
          result);
    });
    const std::string pulled = Sha(*options, [](JobOptions o, std::unique_ptr<BatchStream> train,
                                                const ParamSink& sink, JobResult* result) {
      ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Start(o, std::move(train), nullptr));
      EXPECT_TRUE(job->embedded());
      EXPECT_EQ(job->num_local_trainers(), o.layout.trainers);
      std::vector<std::thread> threads;
      for (int i = 0; i < job->num_local_trainers(); ++i) {
        threads.emplace_back([&job, i] {
          TrainerOutcome outcome;
          const absl::Status status = SumLoop(job->trainer(i), &outcome);
          if (status.ok()) {
            EXPECT_TRUE(job->CompleteTrainer(i, std::move(outcome)).ok());
          } else {
            (void)job->Fail(i, status);
          }
        });
      }
      for (std::thread& thread : threads) thread.join();
      RETURN_IF_ERROR(job->Finish(sink, result));
      EXPECT_EQ(result->trainers.size(), static_cast<size_t>(o.layout.trainers));
      EXPECT_EQ(result->trainers[0].info.value("iterations", 0), 40);
      EXPECT_GT(result->trainers[0].stats.hits, 0);
      EXPECT_THAT(std::string(job->Finish(sink, result).message()), HasSubstr("twice"));
      return absl::OkStatus();
    });
    EXPECT_FALSE(callback.empty());
    EXPECT_EQ(pulled, callback) << "T=" << trainers;
    // And the cache changes nothing.
    auto off = SmallConfig(trainers, CachePolicy::kOff).Resolve(options->oracle.planner.schema);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(Sha(*off,
                  [](JobOptions o, std::unique_ptr<BatchStream> train, const ParamSink& sink,
                     JobResult* result) {
                    return RunEmbeddedJob(
                        o, std::move(train), nullptr,
                        [](Trainer& trainer, TrainerOutcome* outcome) {
                          return SumLoop(trainer, outcome);
                        },
                        sink, result);
                  }),
              callback);
  }
}

TEST(JobTest, AFailedTrainerThreadEndsTheOthersWithItsMessage) {
  const JobConfig config = SmallConfig(2, CachePolicy::kOracle);
  auto data = OpenJobData(config, true);
  ASSERT_TRUE(data.ok());
  auto options = config.Resolve(data->schema);
  ASSERT_TRUE(options.ok());
  auto job = Job::Start(*options, std::move(data->train), nullptr);
  ASSERT_TRUE(job.ok()) << job.status();
  Stopwatch watch;
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      TrainerOutcome outcome;
      // Trainer 1 gives up at iteration 5; trainer 0 waits for its gradients there.
      absl::Status status = SumLoop((*job)->trainer(i), &outcome, i == 1 ? 5 : -1);
      statuses[i] = status.ok() ? (*job)->CompleteTrainer(i, outcome) : (*job)->Fail(i, status);
    });
  }
  for (std::thread& thread : threads) thread.join();
  JobResult result;
  const absl::Status status = (*job)->Finish(ParamSink{}, &result);
  // Every side reports the root cause, named by its rank — not a peer timeout.
  for (const absl::Status& s : {statuses[0], statuses[1], status}) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("gave up on purpose")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("trainer 1")) << s;
  }
  EXPECT_LT(watch.Seconds(), 30.0) << "the job waited for a peer timeout (60 s)";
}

TEST(JobTest, AnAbortFromAnotherThreadEndsBlockedCallsAndTheJob) {
  JobConfig config = SmallConfig(2, CachePolicy::kLru);
  auto data = OpenJobData(config, true);
  ASSERT_TRUE(data.ok());
  auto options = config.Resolve(data->schema);
  ASSERT_TRUE(options.ok());
  auto job = Job::Start(*options, std::move(data->train), nullptr);
  ASSERT_TRUE(job.ok()) << job.status();
  // Trainer 0 trains; trainer 1 never starts, so trainer 0 blocks on its first exchange or
  // all-reduce, as a loop interrupted by Ctrl-C leaves its peers.
  std::atomic<bool> started{false};
  absl::Status blocked;
  std::thread thread([&] {
    TrainerOutcome outcome;
    Trainer& trainer = (*job)->trainer(0);
    started = true;
    blocked = [&]() -> absl::Status {
      float value = 1;
      return trainer.AllReduce(&value, 1);
    }();
  });
  while (!started) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(200));
  (*job)->Abort(absl::CancelledError("interrupted (SIGINT)"));
  thread.join();
  EXPECT_THAT(std::string(blocked.message()), HasSubstr("interrupted"));
  JobResult result;
  const absl::Status status = (*job)->Finish(ParamSink{}, &result);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
}

TEST(JobTest, AnUnfinishedJobIsAbortedAndJoinedWhenDestroyed) {
  JobConfig config = SmallConfig(2, CachePolicy::kOracle);
  auto data = OpenJobData(config, true);
  ASSERT_TRUE(data.ok());
  auto options = config.Resolve(data->schema);
  ASSERT_TRUE(options.ok());
  auto job = Job::Start(*options, std::move(data->train), nullptr);
  ASSERT_TRUE(job.ok());
  LocalBatch batch;
  ASSERT_TRUE((*job)->trainer(0).BeginIteration(&batch).ok());
  job->reset();  // the oracle and servers still wait for the trainers: must not hang
  SUCCEED();
}

TEST(JobTest, MismatchedOptionsAndMisuseAreClearErrors) {
  JobConfig config = SmallConfig(2, CachePolicy::kOracle);
  auto data = OpenJobData(config, true);
  ASSERT_TRUE(data.ok());
  auto options = config.Resolve(data->schema);
  ASSERT_TRUE(options.ok());
  JobOptions bad = *options;
  bad.oracle.planner.capacity = 10000;
  EXPECT_THAT(std::string(Job::Start(bad, nullptr, nullptr).status().message()),
              HasSubstr("capacity"));
  EXPECT_THAT(std::string(Job::Start(*options, nullptr, nullptr).status().message()),
              HasSubstr("training batches"));
  auto job = Job::Start(*options, std::move(data->train), nullptr);
  ASSERT_TRUE(job.ok());
  Trainer& trainer = (*job)->trainer(0);
  EXPECT_EQ(trainer.SetExternalStream(reinterpret_cast<void*>(0x10)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(trainer.SetExternalStream(nullptr).ok());
  EXPECT_EQ(trainer.EndIteration(nullptr).code(), absl::StatusCode::kFailedPrecondition);
  float pooled[4];
  EXPECT_EQ(trainer.LookupPooledInto(pooled).code(), absl::StatusCode::kFailedPrecondition);
  LocalBatch batch;
  ASSERT_TRUE(*trainer.BeginIteration(&batch));
  EXPECT_EQ(trainer.BeginIteration(&batch).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(trainer.Flush().code(), absl::StatusCode::kFailedPrecondition);
  // LookupPooledInto writes what LookupPooled returns.
  std::vector<float> into(static_cast<size_t>(batch.num_samples) * batch.num_tables * 4);
  ASSERT_TRUE(trainer.LookupPooledInto(into.data()).ok());
  auto own = trainer.LookupPooled();
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(std::vector<float>(*own, *own + into.size()), into);
  (*job)->Abort(absl::CancelledError("test over"));
}

}  // namespace
}  // namespace bagpipe

namespace bagpipe {
namespace {

TEST(JobTest, AnExceptionOutOfTheLoopFailsTheJobWithItsMessage) {
  // On a trainer's thread an escaping exception would end the process (std::terminate) with
  // the oracle and the servers still running.
  const JobConfig config = SmallConfig(2, CachePolicy::kOracle);
  auto data = OpenJobData(config, true);
  ASSERT_TRUE(data.ok());
  auto options = config.Resolve(data->schema);
  ASSERT_TRUE(options.ok());
  const TrainLoop loop = [](Trainer& trainer, TrainerOutcome* outcome) -> absl::Status {
    if (trainer.id() == 1) throw std::runtime_error("the loop's own bug");
    return SumLoop(trainer, outcome);
  };
  JobResult result;
  Stopwatch watch;
  const absl::Status status =
      RunEmbeddedJob(*options, std::move(data->train), nullptr, loop, ParamSink{}, &result);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("trainer 1: the training loop threw an exception: the loop's own bug"));
  EXPECT_LT(watch.Seconds(), 30.0) << "the job waited for a peer timeout (60 s)";
}

TEST(JobTest, NullBuffersAndAllReducesAfterCompletionAreRefusedAtOnce) {
  JobConfig config = SmallConfig(1, CachePolicy::kOracle);
  std::unique_ptr<Job> job = StartJob(config);
  ASSERT_NE(job, nullptr);
  Trainer& trainer = job->trainer(0);
  EXPECT_EQ(trainer.BeginIteration(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer.AllReduce(static_cast<float*>(nullptr), 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer.AllReduce(static_cast<double*>(nullptr), 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer.AllReduceDevice(nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(trainer.AllReduce(static_cast<float*>(nullptr), 0).ok());  // reads nothing
  LocalBatch batch;
  ASSERT_TRUE(*trainer.BeginIteration(&batch));
  ASSERT_GT(batch.num_unique, 0);
  EXPECT_EQ(trainer.EndIterationWithRowGradients(nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // The iteration is still open: it ends normally.
  std::vector<float> grad(static_cast<size_t>(batch.num_samples) * batch.num_tables * 4, 0.0f);
  ASSERT_TRUE(trainer.EndIteration(grad.data()).ok());
  TrainerOutcome outcome;
  ASSERT_TRUE(SumLoop(trainer, &outcome).ok());
  ASSERT_TRUE(job->CompleteTrainer(0, outcome).ok());
  // Its part is over: an all-reduce fails now instead of waiting --peer-timeout (60 s).
  Stopwatch watch;
  float value = 1;
  const absl::Status late = trainer.AllReduce(&value, 1);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("was completed"));
  EXPECT_LT(watch.Seconds(), 5.0);
  JobResult result;
  EXPECT_TRUE(job->Finish(ParamSink{}, &result).ok());
}

TEST(JobTest, WorkBetweenTheTrainersEndAndFinishDoesNotTimeTheServersOut) {
  // The caller saves a model or computes metrics after its trainers completed: the servers,
  // waiting for Finish's collection, hear rank 0's keep-alives instead of giving it up after
  // --peer-timeout of silence.
  JobConfig config = SmallConfig(2, CachePolicy::kOracle);
  config.peer_timeout = absl::Seconds(1);
  std::unique_ptr<Job> job = StartJob(config);
  ASSERT_NE(job, nullptr);
  std::vector<std::thread> threads;
  std::vector<absl::Status> statuses(2);
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      TrainerOutcome outcome;
      const absl::Status status = SumLoop(job->trainer(i), &outcome);
      statuses[i] = status.ok() ? job->CompleteTrainer(i, outcome) : status;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
  absl::SleepFor(absl::Seconds(3));  // three peer timeouts of the caller's own work
  JobResult result;
  const absl::Status status = job->Finish(ParamSink{}, &result);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_GT(result.parameter_rows, 0);
}

}  // namespace
}  // namespace bagpipe

namespace bagpipe {
namespace {

TEST(JobTest, ANonFiniteGradientIsRefusedAndTheIterationStaysOpen) {
  JobConfig config = SmallConfig(1, CachePolicy::kOracle);
  std::unique_ptr<Job> job = StartJob(config);
  ASSERT_NE(job, nullptr);
  Trainer& trainer = job->trainer(0);
  LocalBatch batch;
  ASSERT_TRUE(*trainer.BeginIteration(&batch));
  const size_t per_sample = static_cast<size_t>(batch.num_tables) * 4;
  std::vector<float> grad(static_cast<size_t>(batch.num_samples) * per_sample, 0.0f);
  grad[2 * per_sample + 5] = std::numeric_limits<float>::quiet_NaN();
  absl::Status refused = trainer.EndIteration(grad.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("sample 2, float 5 is nan"));
  std::vector<float> rows(static_cast<size_t>(batch.num_unique) * 4, 0.0f);
  rows[7] = -std::numeric_limits<float>::infinity();
  refused = trainer.EndIterationWithRowGradients(rows.data());
  EXPECT_THAT(std::string(refused.message()), HasSubstr("unique row 1, float 3 is -inf"));
  // Nothing was applied: the iteration ends with finite gradients and the job trains on.
  grad[2 * per_sample + 5] = 0.0f;
  ASSERT_TRUE(trainer.EndIteration(grad.data()).ok());
  TrainerOutcome outcome;
  ASSERT_TRUE(SumLoop(trainer, &outcome).ok());
  ASSERT_TRUE(job->CompleteTrainer(0, outcome).ok());
  JobResult result;
  EXPECT_TRUE(job->Finish(ParamSink{}, &result).ok());
}

}  // namespace
}  // namespace bagpipe
