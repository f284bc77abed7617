// The product's core promise: training through the cache is numerically identical to plain
// synchronous training. An embedding-only logistic regression (pooled embeddings times a dense
// weight vector, both trained) runs through the full runtime — oracle, servers, prefetchers,
// trainers, exchanges, write-backs — and after Flush() the tables, optimizer state and dense
// weights are bit-identical to the `off` run (fetch every row every iteration, write everything
// back), for every cache mode, capacity, lookahead, trainer count and optimizer.
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "cache/embedding_cache.h"
#include "core/device.h"
#include "core/status.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/ordering_faults.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 4;
constexpr char kData[] = "samples=6400,rows=400/60/1500/9,dense=2,alpha=1.1,pooling=1-3,seed=3";

struct TrainedRun {
  std::string policy;
  std::string sha;
  std::vector<float> dense;
  std::map<RowId, std::vector<float>> rows;
  JobResult result;
};

// Logistic regression over the pooled embeddings: logit = sum_{t,c} w[t,c] * pooled[t,c].
// Written to the device contract (trainer.h): one host synchronisation per iteration (to read
// the pooled embeddings), buffers reused across iterations.
absl::Status LogisticLoop(Trainer& trainer, int tables, TrainerOutcome* outcome) {
  std::vector<float> w(tables * kDim, 0.05f);
  std::vector<float> grad_w(w.size());
  std::vector<float> pooled_host, pooled_grad;
  const auto& context = trainer.context();
  DeviceArray<float> device_grad;
  LocalBatch batch;
  double loss_sum = 0;
  while (true) {
    ASSIGN_OR_RETURN(bool more, trainer.BeginIteration(&batch));
    if (!more) break;
    ASSIGN_OR_RETURN(const float* pooled, trainer.LookupPooled());
    const size_t width = static_cast<size_t>(tables) * kDim;
    pooled_host.resize(batch.num_samples * width);
    RETURN_IF_ERROR(context->CopyToHost(pooled_host.data(), pooled, pooled_host.size() * 4));
    RETURN_IF_ERROR(context->Synchronize());
    pooled_grad.assign(pooled_host.size(), 0.0f);
    std::fill(grad_w.begin(), grad_w.end(), 0.0f);
    const float scale = 1.0f / static_cast<float>(batch.global_batch_size);
    for (int s = 0; s < batch.num_samples; ++s) {
      float logit = 0;
      for (size_t k = 0; k < width; ++k) logit += w[k] * pooled_host[s * width + k];
      const float p = 1.0f / (1.0f + std::exp(-logit));
      const float y = batch.labels_host[s];
      loss_sum += -(y * std::log(std::max(p, 1e-7f)) + (1 - y) * std::log(std::max(1 - p, 1e-7f)));
      const float d = (p - y) * scale;
      for (size_t k = 0; k < width; ++k) {
        pooled_grad[s * width + k] = d * w[k];
        grad_w[k] += d * pooled_host[s * width + k];
      }
    }
    RETURN_IF_ERROR(trainer.AllReduce(grad_w.data(), grad_w.size()));
    for (size_t k = 0; k < w.size(); ++k) w[k] -= 0.5f * grad_w[k];
    // Hand the pooled gradient back in the trainer's memory. The copy reads pooled_grad when
    // the compute stream gets there: the host writes it again only after the next iteration's
    // synchronisation.
    if (device_grad.size() < pooled_grad.size()) {
      ASSIGN_OR_RETURN(device_grad, DeviceArray<float>::Create(context, pooled_grad.size()));
    }
    RETURN_IF_ERROR(
        context->CopyToDevice(device_grad.data(), pooled_grad.data(), pooled_grad.size() * 4));
    RETURN_IF_ERROR(trainer.EndIteration(device_grad.data()));
  }
  RETURN_IF_ERROR(trainer.Flush());
  outcome->dense_parameters = w;
  outcome->info["loss_sum"] = loss_sum;
  outcome->info["cpu_streams"] = std::string(CpuStreamsName(context->cpu_streams()));
  return absl::OkStatus();
}

TrainedRun Train(const std::string& policy, int64_t cache_rows, int lookahead, int trainers,
                 OptimizerKind optimizer, int servers = 2, int iterations = 200,
                 int prefetch_depth = 3) {
  TrainedRun run;
  run.policy = policy;
  auto config = ParseSyntheticConfig(kData);
  EXPECT_TRUE(config.ok());
  auto source = OpenSynthetic(*config, SourceOptions{});
  EXPECT_TRUE(source.ok());
  const Schema schema = (*source)->schema();
  auto stream = std::make_unique<BatchStream>(std::move(*source),
                                              BatchStream::Options{64, /*epochs=*/0, false});
  JobOptions options;
  options.layout = {servers, trainers};
  options.peer_timeout = absl::Seconds(60);
  options.trainer.dim = kDim;
  options.trainer.sparse_optimizer = {optimizer, 0.3f, 1e-8f, 0.1f};
  options.trainer.policy = *ParseCachePolicy(policy);
  options.trainer.cache_rows = cache_rows;
  options.trainer.prefetch_depth = prefetch_depth;
  options.trainer.initializer =
      RowInitializer(11, kDim, StateFloatsPerRow(optimizer, kDim), 0.1f, schema.table_rows);
  options.oracle.planner.schema = schema;
  options.oracle.planner.num_trainers = trainers;
  options.oracle.planner.capacity = cache_rows;
  options.oracle.planner.lookahead = lookahead;
  options.oracle.planner.policy = options.trainer.policy;
  options.oracle.max_iterations = iterations;
  options.oracle.plan_queue_depth = 3;
  auto writer = ParamWriter::Create("", {}, RecordFloats(optimizer, kDim));
  EXPECT_TRUE(writer.ok());
  ParamSink sink;
  sink.dense = [&](const std::vector<float>& dense) {
    run.dense = dense;
    return (*writer)->AddDense(dense);
  };
  sink.row = [&](RowId row, const float* record) {
    run.rows[row] = std::vector<float>(record, record + RecordFloats(optimizer, kDim));
    return (*writer)->AddRow(row, record);
  };
  const int tables = schema.num_tables();
  absl::Status status = RunEmbeddedJob(
      options, std::move(stream), nullptr,
      [&](Trainer& trainer, TrainerOutcome* outcome) {
        RETURN_IF_ERROR(LogisticLoop(trainer, tables, outcome));
        outcome->info["cache"] = trainer.cache().stats().ToJson();
        return absl::OkStatus();
      },
      sink, &run.result);
  EXPECT_TRUE(status.ok()) << policy << ": " << status;
  auto sha = (*writer)->Finish();
  EXPECT_TRUE(sha.ok());
  run.sha = *sha;
  return run;
}

// Each mode did its own work (a cache that silently behaved like `off`, or a runtime that
// exchanged nothing, would still match `off`): rows were served from the cache (hits) except
// under `off`, fetched into it (fills) except under `device`, and with several trainers the
// gradients of shared rows were exchanged. The cache's own counters (CacheStats) agree with
// the trainer's.
void ExpectEachModeDidItsWork(const TrainedRun& run, const std::string& what) {
  ASSERT_FALSE(run.result.trainers.empty()) << what;
  TrainerStats total;
  for (const TrainerOutcome& outcome : run.result.trainers) {
    const TrainerStats& stats = outcome.stats;
    total.hits += stats.hits;
    total.fills += stats.fills;
    total.exchanged_rows += stats.exchanged_rows;
    const nlohmann::json& cache = outcome.info.at("cache");
    EXPECT_EQ(cache.at("requests").get<int64_t>(), stats.ids) << what;
    EXPECT_EQ(cache.at("unique").get<int64_t>(), stats.unique_rows) << what;
    EXPECT_EQ(cache.at("hits").get<int64_t>(), stats.hits) << what;
    EXPECT_EQ(cache.at("misses").get<int64_t>(), stats.fills) << what;
    EXPECT_EQ(cache.at("evictions").get<int64_t>(), stats.evictions) << what;
    EXPECT_EQ(cache.at("write_backs").get<int64_t>(), stats.write_backs) << what;
    EXPECT_EQ(cache.at("flushes").get<int64_t>(), stats.flushes) << what;
    EXPECT_GT(cache.at("gathered_bytes").get<int64_t>(), 0) << what;
    EXPECT_GT(stats.ids, 0) << what;
    if (stats.unique_rows > 0) {
      EXPECT_DOUBLE_EQ(cache.at("hit_rate").get<double>(), stats.hit_rate()) << what;
    }
  }
  if (run.policy == "off") {
    EXPECT_EQ(total.hits, 0) << what;
  } else {
    EXPECT_GT(total.hits, 0) << what << ": the cache served nothing";
  }
  if (run.policy == "device") {
    EXPECT_EQ(total.fills, 0) << what;
  } else {
    EXPECT_GT(total.fills, 0) << what << ": nothing was fetched";
  }
  if (run.result.trainers.size() > 1) {
    EXPECT_GT(total.exchanged_rows, 0) << what << ": no shared row was exchanged";
  }
}

void ExpectIdentical(const TrainedRun& reference, const TrainedRun& run, const std::string& what) {
  ExpectEachModeDidItsWork(reference, "off (reference of " + what + ")");
  ExpectEachModeDidItsWork(run, what);
  ASSERT_FALSE(reference.rows.empty());
  EXPECT_EQ(run.dense, reference.dense) << what;
  EXPECT_EQ(run.rows.size(), reference.rows.size()) << what;
  int64_t differing = 0;
  for (const auto& [row, record] : reference.rows) {
    auto it = run.rows.find(row);
    if (it == run.rows.end() || it->second != record) ++differing;
  }
  EXPECT_EQ(differing, 0) << what << ": rows differing from `off`";
  EXPECT_EQ(run.sha, reference.sha) << what;
}

class EquivalenceTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(EquivalenceTest, EveryModeMatchesOffBitForBitOneTrainer) {
  const OptimizerKind optimizer = GetParam();
  const TrainedRun off = Train("off", 4000, 1, 1, optimizer);
  EXPECT_GT(off.result.trainers[0].stats.fills, 0);
  ExpectIdentical(off, Train("oracle", 1200, 20, 1, optimizer), "oracle C=1200 L=20");
  ExpectIdentical(off, Train("oracle", 350, 5, 1, optimizer), "oracle C=350 L=5");
  ExpectIdentical(off, Train("lru", 600, 1, 1, optimizer), "lru C=600");
  ExpectIdentical(off, Train("lfu", 600, 1, 1, optimizer), "lfu C=600");
  ExpectIdentical(off, Train("device", 0, 1, 1, optimizer), "device");
}

TEST_P(EquivalenceTest, EveryModeMatchesOffBitForBitSeveralTrainers) {
  const OptimizerKind optimizer = GetParam();
  for (int trainers : {2, 3}) {
    const TrainedRun off =
        Train("off", 4000, 1, trainers, optimizer, /*servers=*/2, /*iterations=*/120);
    const std::string t = " T=" + std::to_string(trainers);
    ExpectIdentical(off, Train("oracle", 500, 10, trainers, optimizer, 2, 120), "oracle" + t);
    ExpectIdentical(off, Train("lru", 500, 1, trainers, optimizer, 1, 120), "lru" + t);
    ExpectIdentical(off, Train("device", 0, 1, trainers, optimizer, 1, 120), "device" + t);
  }
}

// The prefetch distance bounds the iterations whose rows are requested and not yet filled
// (TrainerOptions::prefetch_depth: up to d + 1 ahead of the one training) and changes nothing
// in the training.
TEST(PrefetchDepthTest, AtMostDepthPlusTwoIterationsAreFetchedAtOnce) {
  const TrainedRun off = Train("off", 4000, 1, 2, OptimizerKind::kAdagrad, 2, 120);
  for (int depth : {1, 2}) {
    const TrainedRun run =
        Train("oracle", 500, 10, 2, OptimizerKind::kAdagrad, 2, 120, /*prefetch_depth=*/depth);
    ExpectIdentical(off, run, "oracle with --prefetch-depth " + std::to_string(depth));
    for (const TrainerOutcome& outcome : run.result.trainers) {
      EXPECT_GE(outcome.stats.prefetch_max_in_flight, 1);
      EXPECT_LE(outcome.stats.prefetch_max_in_flight, depth + 2) << "depth " << depth;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EquivalenceTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                                           OptimizerKind::kRowwiseAdagrad),
                         [](const auto& info) {
                           return std::string(OptimizerName(info.param)) == "rowwise-adagrad"
                                      ? std::string("rowwise_adagrad")
                                      : std::string(OptimizerName(info.param));
                         });

// A small job on kData for the fault tests.
JobOptions FaultJobOptions(const Schema& schema, int servers, int trainers, int64_t capacity,
                           int iterations) {
  JobOptions options;
  options.layout = {servers, trainers};
  options.peer_timeout = absl::Seconds(30);
  options.trainer.dim = kDim;
  options.trainer.cache_rows = capacity;
  options.trainer.initializer = RowInitializer(1, kDim, 0, 0, schema.table_rows);
  options.oracle.planner.schema = schema;
  options.oracle.planner.num_trainers = trainers;
  options.oracle.planner.capacity = capacity;
  options.oracle.max_iterations = iterations;
  return options;
}

TEST(RuntimeFaultTest, CapacityTooSmallForABatchIsAClearError) {
  auto source = OpenSynthetic(std::string(kData), SourceOptions{});
  ASSERT_TRUE(source.ok());
  const Schema schema = (*source)->schema();
  auto stream =
      std::make_unique<BatchStream>(std::move(*source), BatchStream::Options{64, 0, false});
  const JobOptions options = FaultJobOptions(schema, 1, 1, 20, 10);
  JobResult result;
  absl::Status status = RunEmbeddedJob(
      options, std::move(stream), nullptr,
      [&](Trainer& trainer, TrainerOutcome* outcome) {
        return LogisticLoop(trainer, schema.num_tables(), outcome);
      },
      ParamSink{}, &result);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("capacity"));
}

TEST(RuntimeFaultTest, AFailingTrainingLoopEndsEveryRoleWithItsMessage) {
  auto source = OpenSynthetic(std::string(kData), SourceOptions{});
  ASSERT_TRUE(source.ok());
  const Schema schema = (*source)->schema();
  auto stream =
      std::make_unique<BatchStream>(std::move(*source), BatchStream::Options{64, 0, false});
  const JobOptions options = FaultJobOptions(schema, 2, 2, 1000, 50);
  JobResult result;
  absl::Status status = RunEmbeddedJob(
      options, std::move(stream), nullptr,
      [&](Trainer& trainer, TrainerOutcome*) -> absl::Status {
        LocalBatch batch;
        for (int i = 0;; ++i) {
          ASSIGN_OR_RETURN(bool more, trainer.BeginIteration(&batch));
          if (!more) break;
          if (trainer.id() == 1 && i == 2) return absl::InternalError("trainer 1 ran out of luck");
          std::vector<float> zeros(batch.num_samples * schema.num_tables() * kDim, 0.0f);
          ASSIGN_OR_RETURN(const float* pooled, trainer.LookupPooled());
          (void)pooled;
          RETURN_IF_ERROR(trainer.EndIteration(zeros.data()));
        }
        return absl::InternalError("unreachable in this test");
      },
      ParamSink{}, &result);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("ran out of luck"));
}

// ---- The asynchronous CPU stream modes (core/device.h) -------------------------------------
// With CpuStreams::kAsync every stream of a trainer's context is an executor thread running its
// work after the call that queued it, concurrently with the host; with kLazy only when something
// waits for it. The runtime orders its streams with events, so training ends bit-identical to
// the synchronous run, with one host synchronisation per iteration on one trainer (the loop's
// read of the pooled embeddings). Dropping one of those orderings makes the lazy mode end with
// other parameters.

// Makes DeviceContext::Cpu() (the trainers' contexts) use `mode` for the scope.
class CpuStreamsScope {
 public:
  explicit CpuStreamsScope(CpuStreams mode) {
    SetDefaultCpuStreamsForTesting(static_cast<int>(mode));
  }
  ~CpuStreamsScope() { SetDefaultCpuStreamsForTesting(-1); }
};

class OrderingFaultScope {
 public:
  explicit OrderingFaultScope(OrderingFault fault) { SetOrderingFaultForTesting(fault); }
  ~OrderingFaultScope() { SetOrderingFaultForTesting(OrderingFault::kNone); }
};

struct ModeRun {
  std::string policy;
  int64_t cache_rows;
  int lookahead;
};

TEST(AsynchronousStreamsTest, EveryCacheModeIsBitIdenticalToTheSynchronousRun) {
  // Picks its stream modes itself: once is enough (not again in the BAGPIPE_CPU_STREAMS runs).
  if (std::getenv("BAGPIPE_CPU_STREAMS") != nullptr) GTEST_SKIP() << "runs in the plain suite";
  const std::vector<ModeRun> runs = {
      {"off", 4000, 1}, {"oracle", 500, 10}, {"lru", 500, 1}, {"device", 0, 1}};
  for (int trainers : {1, 2}) {
    const int iterations = trainers == 1 ? 200 : 120;
    std::vector<TrainedRun> reference;
    {
      CpuStreamsScope sync(CpuStreams::kSync);
      for (const ModeRun& r : runs) {
        reference.push_back(Train(r.policy, r.cache_rows, r.lookahead, trainers,
                                  OptimizerKind::kAdagrad, /*servers=*/2, iterations));
      }
    }
    for (CpuStreams mode : {CpuStreams::kAsync, CpuStreams::kLazy}) {
      CpuStreamsScope scope(mode);
      for (size_t k = 0; k < runs.size(); ++k) {
        const std::string what =
            absl::StrCat(runs[k].policy, " T=", trainers, " ", std::string(CpuStreamsName(mode)));
        const TrainedRun run = Train(runs[k].policy, runs[k].cache_rows, runs[k].lookahead,
                                     trainers, OptimizerKind::kAdagrad, 2, iterations);
        ExpectIdentical(reference[k], run, what);
        ASSERT_EQ(run.result.trainers.size(), static_cast<size_t>(trainers)) << what;
        for (const TrainerOutcome& trainer : run.result.trainers) {
          // The runs did run asynchronously, and did their work.
          EXPECT_EQ(trainer.info.value("cpu_streams", std::string()), CpuStreamsName(mode));
          EXPECT_EQ(trainer.stats.iterations, iterations) << what;
          if (runs[k].policy != "device") EXPECT_GT(trainer.stats.fills, 0) << what;
          // One host synchronisation per steady iteration on one trainer (the loop reading the
          // pooled embeddings); with two, one more: the shared rows' gradients go through host
          // memory. Buffers stop growing once the first batches were seen.
          EXPECT_LE(trainer.stats.max_iteration_host_syncs, trainers == 1 ? 1 : 2) << what;
          EXPECT_GE(trainer.stats.host_syncs, iterations) << what;
          EXPECT_LT(trainer.stats.last_growth_iteration, iterations / 2) << what;
        }
        if (trainers == 2 && runs[k].policy == "oracle") {
          EXPECT_GT(run.result.trainers[0].stats.exchanged_rows, 0) << what;
        }
      }
    }
  }
}

// The negative control: with the compute stream no longer waiting for the copy of the prefetched
// rows before the fill (one StreamWaitEvent dropped), the synchronous mode cannot tell
// (everything runs in program order), while the lazy mode, which runs queued work as late as a
// GPU may, fills the cache before the copy ran and ends with other parameters.
TEST(AsynchronousStreamsTest, TheLazyModeCatchesADroppedStreamWait) {
  // Picks its stream modes itself: once is enough (not again in the BAGPIPE_CPU_STREAMS runs).
  if (std::getenv("BAGPIPE_CPU_STREAMS") != nullptr) GTEST_SKIP() << "runs in the plain suite";
  const TrainedRun reference = Train("oracle", 350, 5, 1, OptimizerKind::kSgd);
  ASSERT_GT(reference.result.trainers[0].stats.fills, 0);
  OrderingFaultScope faulty(OrderingFault::kSkipFillWait);
  {
    CpuStreamsScope sync(CpuStreams::kSync);
    ExpectIdentical(reference, Train("oracle", 350, 5, 1, OptimizerKind::kSgd),
                    "fill wait dropped, synchronous");
  }
  CpuStreamsScope lazy(CpuStreams::kLazy);
  const TrainedRun run = Train("oracle", 350, 5, 1, OptimizerKind::kSgd);
  EXPECT_GT(run.result.trainers[0].stats.fills, 0);
  EXPECT_NE(run.sha, reference.sha) << "fill wait dropped: the lazy mode did not notice";
}

}  // namespace
}  // namespace bagpipe
