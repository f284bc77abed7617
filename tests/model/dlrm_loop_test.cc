// The main job's promise, end to end: the reference DLRM trained through the runtime with any
// cache mode ends with parameters bit-identical to the `off` run (every row fetched from the
// servers every iteration), on one and on several trainers; and it learns.
#include "model/dlrm_loop.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "data/synthetic.h"
#include "gtest/gtest.h"
#include "model/eval_metrics.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {
namespace {

constexpr char kData[] = "synthetic:samples=20000,tables=6,scale=0.0005,dense=5,alpha=1.1,seed=4";
constexpr int kDim = 8;

struct DlrmRun {
  std::string sha;
  JobResult result;
  double auc = 0;
};

DlrmRun Train(const std::string& policy, int64_t cache_rows, int trainers, int servers,
              OptimizerKind optimizer, int iterations = 60,
              DenseHeadKind head = DenseHeadKind::kDlrm, Backend backend = Backend::kCpu) {
  DlrmRun run;
  auto source = OpenSource(kData, SourceOptions{});
  EXPECT_TRUE(source.ok()) << source.status();
  const Schema schema = (*source)->schema();
  auto train = std::make_unique<BatchStream>(SampleRange(std::move(*source), 0, 18000),
                                             BatchStream::Options{256, 0, false});
  auto tail = OpenSource(kData, SourceOptions{});
  EXPECT_TRUE(tail.ok());
  auto eval = std::make_unique<BatchStream>(SampleRange(std::move(*tail), 18000, -1),
                                            BatchStream::Options{500, 1, false});
  DlrmLoopOptions loop;
  loop.model.num_dense = schema.num_dense();
  loop.model.num_tables = schema.num_tables();
  loop.model.dim = kDim;
  loop.model.bottom = {schema.num_dense(), 16, kDim};
  loop.model.top = {16, 1};
  loop.model.seed = 7;
  loop.model.deterministic = true;
  loop.model.optimizer = {optimizer, 0.05f, 1e-8f, 0.0f};
  loop.metrics_interval = 20;
  loop.head = head;

  JobOptions options;
  options.layout = {servers, trainers};
  options.backend = backend;
  options.peer_timeout = absl::Seconds(60);
  options.trainer.dim = kDim;
  options.trainer.sparse_optimizer = {optimizer, 0.05f, 1e-8f, 0.0f};
  options.trainer.policy = *ParseCachePolicy(policy);
  options.trainer.cache_rows = cache_rows;
  options.trainer.prefetch_depth = 3;
  options.trainer.initializer =
      RowInitializer(3, kDim, StateFloatsPerRow(optimizer, kDim), 0.0f, schema.table_rows);
  options.oracle.planner.schema = schema;
  options.oracle.planner.num_trainers = trainers;
  options.oracle.planner.capacity = cache_rows;
  options.oracle.planner.lookahead = policy == "oracle" ? 16 : 1;
  options.oracle.planner.policy = options.trainer.policy;
  options.oracle.max_iterations = iterations;
  auto writer = ParamWriter::Create("", {}, RecordFloats(optimizer, kDim));
  EXPECT_TRUE(writer.ok());
  ParamSink sink;
  sink.dense = [&](const std::vector<float>& dense) { return (*writer)->AddDense(dense); };
  sink.row = [&](RowId row, const float* record) { return (*writer)->AddRow(row, record); };
  const absl::Status status = RunEmbeddedJob(options, std::move(train), std::move(eval),
                                             MakeDlrmLoop(loop), sink, &run.result);
  EXPECT_TRUE(status.ok()) << policy << ": " << status;
  auto sha = (*writer)->Finish();
  EXPECT_TRUE(sha.ok());
  run.sha = sha.ok() ? *sha : "";
  std::vector<float> predictions, labels;
  for (const TrainerOutcome& outcome : run.result.trainers) {
    predictions.insert(predictions.end(), outcome.eval_predictions.begin(),
                       outcome.eval_predictions.end());
    labels.insert(labels.end(), outcome.eval_labels.begin(), outcome.eval_labels.end());
  }
  run.auc = Evaluate(predictions, labels).auc;
  return run;
}

TEST(DlrmLoopTest, EveryCacheModeMatchesOffBitForBitOnOneTrainer) {
  const DlrmRun off = Train("off", 4000, 1, 1, OptimizerKind::kAdagrad);
  ASSERT_FALSE(off.sha.empty());
  EXPECT_EQ(Train("oracle", 900, 1, 1, OptimizerKind::kAdagrad).sha, off.sha) << "oracle";
  EXPECT_EQ(Train("lru", 900, 1, 2, OptimizerKind::kAdagrad).sha, off.sha) << "lru";
  EXPECT_EQ(Train("lfu", 900, 1, 1, OptimizerKind::kAdagrad).sha, off.sha) << "lfu";
  EXPECT_EQ(Train("device", 0, 1, 1, OptimizerKind::kAdagrad).sha, off.sha) << "device";
}

TEST(DlrmLoopTest, EveryCacheModeMatchesOffBitForBitOnSeveralTrainers) {
  for (int trainers : {2, 3}) {
    const DlrmRun off = Train("off", 4000, trainers, 2, OptimizerKind::kSgd, 40);
    EXPECT_EQ(Train("oracle", 600, trainers, 2, OptimizerKind::kSgd, 40).sha, off.sha)
        << "oracle T=" << trainers;
    EXPECT_EQ(Train("lru", 600, trainers, 1, OptimizerKind::kSgd, 40).sha, off.sha)
        << "lru T=" << trainers;
  }
}

TEST(DlrmLoopTest, LearnsAndEvaluatesTheHeldOutTail) {
  const DlrmRun run = Train("oracle", 900, 2, 1, OptimizerKind::kAdagrad, 70);
  int64_t eval_samples = 0;
  for (const TrainerOutcome& outcome : run.result.trainers) {
    eval_samples += static_cast<int64_t>(outcome.eval_predictions.size());
    EXPECT_EQ(outcome.eval_predictions.size(), outcome.eval_labels.size());
    EXPECT_EQ(outcome.info.value("iterations", int64_t{0}), 70);
  }
  EXPECT_EQ(eval_samples, 2000);
  // The synthetic labels depend on dense features and rows: a trained model ranks them.
  EXPECT_GT(run.auc, 0.6);
  EXPECT_EQ(run.result.trainers[0].dense_parameters.size() > 0, true);
}

TEST(DlrmLoopTest, EmbeddingOnlyLogisticRegressionMatchesOffAndLearns) {
  const DlrmRun off = Train("off", 4000, 2, 1, OptimizerKind::kAdagrad, 70, DenseHeadKind::kLogReg);
  const DlrmRun oracle =
      Train("oracle", 900, 2, 1, OptimizerKind::kAdagrad, 70, DenseHeadKind::kLogReg);
  EXPECT_EQ(oracle.sha, off.sha);
  // w (tables x dim) and the bias.
  EXPECT_EQ(off.result.trainers[0].dense_parameters.size(), 6u * kDim + 1);
  EXPECT_GT(off.auc, 0.55);
}

// The whole job with every trainer's streams run asynchronously (core/device.h, CpuStreams):
// kAsync (executor threads running queued work concurrently with the host) and kLazy (work run
// only when waited for, as late as a GPU may) end bit-identical to the synchronous run, with
// one host synchronisation per steady iteration on one trainer (reading the loss).
TEST(DlrmLoopTest, AsynchronousCpuStreamsMatchTheSynchronousRunBitForBit) {
  // Picks its stream modes itself: once is enough (not again in the BAGPIPE_CPU_STREAMS runs).
  if (std::getenv("BAGPIPE_CPU_STREAMS") != nullptr) GTEST_SKIP() << "runs in the plain suite";
  struct Case {
    std::string policy;
    int trainers;
    DenseHeadKind head;
  };
  const std::vector<Case> cases = {{"oracle", 1, DenseHeadKind::kDlrm},
                                   {"off", 1, DenseHeadKind::kDlrm},
                                   {"oracle", 2, DenseHeadKind::kDlrm},
                                   {"oracle", 1, DenseHeadKind::kLogReg}};
  for (const Case& c : cases) {
    SetDefaultCpuStreamsForTesting(static_cast<int>(CpuStreams::kSync));
    const DlrmRun reference =
        Train(c.policy, 600, c.trainers, 1, OptimizerKind::kAdagrad, 40, c.head);
    ASSERT_FALSE(reference.sha.empty());
    for (CpuStreams mode : {CpuStreams::kAsync, CpuStreams::kLazy}) {
      SetDefaultCpuStreamsForTesting(static_cast<int>(mode));
      const DlrmRun run = Train(c.policy, 600, c.trainers, 1, OptimizerKind::kAdagrad, 40, c.head);
      const std::string what = c.policy + " T=" + std::to_string(c.trainers) +
                               (c.head == DenseHeadKind::kLogReg ? " logreg " : " dlrm ") +
                               std::string(CpuStreamsName(mode));
      EXPECT_EQ(run.sha, reference.sha) << what;
      EXPECT_EQ(run.auc, reference.auc) << what;
      for (const TrainerOutcome& trainer : run.result.trainers) {
        EXPECT_GT(trainer.stats.fills, 0) << what;
        // On one trainer the loss is the only synchronisation; with two, the dense all-reduce
        // of the CPU backend and the shared rows' exchange go through host memory too.
        EXPECT_LE(trainer.stats.max_iteration_host_syncs, c.trainers == 1 ? 1 : 3) << what;
        EXPECT_GE(trainer.stats.host_syncs, 40) << what;
        EXPECT_LT(trainer.stats.last_growth_iteration, 20) << what;
      }
    }
  }
  SetDefaultCpuStreamsForTesting(-1);
}

// The job end to end on the CUDA backend: trainers on GPUs (cache, staging, the DLRM's dense
// part), the oracle and the servers on the host. With --deterministic every CUDA kernel sums in a
// fixed order, so each cache mode ends bit-identical to `off` on the GPU too, and the GPU run
// learns what the CPU run learns. Skipped without a usable CUDA device.
TEST(DlrmLoopCudaTest, EveryCacheModeMatchesOffOnTheGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << CudaDeviceDescription(0);
  for (int trainers : {1, 2}) {
    const std::string t = " T=" + std::to_string(trainers);
    const DlrmRun off = Train("off", 4000, trainers, 1, OptimizerKind::kAdagrad, 40,
                              DenseHeadKind::kDlrm, Backend::kCuda);
    ASSERT_FALSE(off.sha.empty()) << t;
    for (const std::string policy : {"oracle", "lru", "device"}) {
      const DlrmRun run = Train(policy, policy == "device" ? 0 : 600, trainers, 1,
                                OptimizerKind::kAdagrad, 40, DenseHeadKind::kDlrm, Backend::kCuda);
      EXPECT_EQ(run.sha, off.sha) << policy << t;
      for (const TrainerOutcome& trainer : run.result.trainers) {
        if (policy != "device") EXPECT_GT(trainer.stats.fills, 0) << policy << t;
        // Reading the loss is the one host synchronisation of a steady iteration on one GPU;
        // with two trainers the shared rows' gradients cross host memory too, and when both
        // share one GPU (no NCCL) the dense gradients also (copy out, all-reduce, copy back).
        const bool nccl = CudaDeviceCount() >= 2;
        EXPECT_LE(trainer.stats.max_iteration_host_syncs, trainers == 1 ? 1 : (nccl ? 2 : 4))
            << policy << t;
        EXPECT_LT(trainer.stats.last_growth_iteration, 20) << policy << t;
        EXPECT_EQ(trainer.stats.dense_allreduce,
                  trainers == 1 ? "none" : (nccl ? "nccl" : "transport-via-host"))
            << policy << t;
      }
    }
    const DlrmRun cpu = Train("oracle", 600, trainers, 1, OptimizerKind::kAdagrad, 40);
    EXPECT_NEAR(off.auc, cpu.auc, 0.02) << t;
  }
}

TEST(EvalMetricsTest, AucCountsOrderedPairsAndTiesHalf) {
  // Positives at 0.9 and 0.4, negatives at 0.4 and 0.1: pairs (0.9>0.4), (0.9>0.1), (0.4=0.4)
  // half, (0.4>0.1) -> 3.5 of 4.
  const EvalFigures f = Evaluate({0.9f, 0.4f, 0.4f, 0.1f}, {1, 1, 0, 0});
  EXPECT_DOUBLE_EQ(f.auc, 3.5 / 4);
  EXPECT_EQ(f.samples, 4);
  EXPECT_EQ(f.positives, 2);
  EXPECT_NEAR(f.log_loss, -(std::log(0.9) + std::log(0.4) + std::log(0.6) + std::log(0.9)) / 4,
              1e-6);
  EXPECT_DOUBLE_EQ(f.accuracy, 0.75);  // only the positive at 0.4 falls below 0.5
  EXPECT_DOUBLE_EQ(Evaluate({0.2f, 0.3f}, {1, 1}).auc, 0.5);
  EXPECT_EQ(Evaluate({}, {}).samples, 0);
}

TEST(EvalMetricsTest, FractionalLabelsKeepTheirLossAndCountAboveOneHalfAsPositive) {
  // The log loss is the training loss with the labels as they are; a label of 0.5 is not
  // positive, 0.75 is.
  const EvalFigures f = Evaluate({0.8f, 0.3f, 0.6f}, {0.25f, 0.5f, 0.75f});
  const double expected = -((0.25 * std::log(0.8) + 0.75 * std::log(0.2)) +
                            (0.5 * std::log(0.3) + 0.5 * std::log(0.7)) +
                            (0.75 * std::log(0.6) + 0.25 * std::log(0.4))) /
                          3;
  EXPECT_NEAR(f.log_loss, expected, 1e-6);
  EXPECT_EQ(f.positives, 1);
  EXPECT_DOUBLE_EQ(f.accuracy, 2.0 / 3);  // 0.8 for 0.25 is wrong; 0.3 for 0.5, 0.6 for 0.75 right
  EXPECT_DOUBLE_EQ(f.auc, 0.5);           // the positive (0.6) above 0.3, below 0.8
}

}  // namespace
}  // namespace bagpipe
