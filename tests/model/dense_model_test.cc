// Specification of DenseModel, the dense part of the reference DLRM: layer specs, exact gradients
// (finite differences), learning, determinism, batch splitting, and the CUDA backend against the
// CPU reference.
#include "model/dense_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#if BAGPIPE_WITH_CUDA
#include <cublas_v2.h>
#endif
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A batch of inputs in host memory.
struct Batch {
  int n = 0;
  std::vector<float> dense;   // n x num_dense
  std::vector<float> pooled;  // n x num_tables x dim
  std::vector<float> labels;  // n
};

// Random inputs; labels follow a learnable rule: sign of (sum of dense + <e_0, e_last>).
Batch MakeBatch(const DenseModelConfig& c, int n, uint64_t seed) {
  Batch b;
  b.n = n;
  CounterRng rng(HashKey(seed, 77));
  b.dense.resize(static_cast<size_t>(n) * c.num_dense);
  b.pooled.resize(static_cast<size_t>(n) * c.num_tables * c.dim);
  b.labels.resize(n);
  for (float& v : b.dense) v = 2.0f * rng.NextFloat() - 1.0f;
  for (float& v : b.pooled) v = 2.0f * rng.NextFloat() - 1.0f;
  for (int s = 0; s < n; ++s) {
    double score = 0;
    for (int f = 0; f < c.num_dense; ++f) score += b.dense[s * c.num_dense + f];
    if (c.num_tables > 0) {
      const float* e0 = &b.pooled[static_cast<size_t>(s) * c.num_tables * c.dim];
      const float* e1 = e0 + (c.num_tables - 1) * c.dim;
      for (int d = 0; d < c.dim; ++d) score += e0[d] * e1[d];
    }
    b.labels[s] = score > 0 ? 1.0f : 0.0f;
  }
  return b;
}

DenseModelConfig TinyConfig() {
  DenseModelConfig c;
  c.num_dense = 3;
  c.num_tables = 2;
  c.dim = 4;
  c.bottom = {3, 5, 4};
  c.top = {6, 1};
  c.seed = 11;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.deterministic = true;
  return c;
}

DenseModelConfig SmallConfig() {
  DenseModelConfig c;
  c.num_dense = 8;
  c.num_tables = 5;
  c.dim = 8;
  c.bottom = {8, 32, 16, 8};
  c.top = {32, 16, 1};
  c.seed = 5;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.deterministic = true;
  return c;
}

std::unique_ptr<DenseModel> MakeModel(std::shared_ptr<DeviceContext> context,
                                      const DenseModelConfig& config) {
  auto model = DenseModel::Create(std::move(context), config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<float> Gradients(DenseModel& model) {
  std::vector<float> host(model.num_parameters());
  EXPECT_TRUE(model.context()
                  ->CopyToHost(host.data(), model.gradients(), host.size() * sizeof(float))
                  .ok());
  EXPECT_TRUE(model.context()->Synchronize().ok());
  return host;
}

std::vector<float> Parameters(const DenseModel& model) {
  std::vector<float> host;
  EXPECT_TRUE(model.ReadParameters(&host).ok());
  return host;
}

// ForwardBackward on a CPU model with host inputs; returns the loss and the pooled gradient.
double TrainStep(DenseModel& model, const Batch& b, float loss_scale,
                 std::vector<float>* pooled_grad, int begin = 0, int count = -1) {
  const DenseModelConfig& c = model.config();
  if (count < 0) count = b.n;
  pooled_grad->assign(static_cast<size_t>(count) * c.num_tables * c.dim, 0.0f);
  auto loss = model.ForwardBackward(&b.dense[static_cast<size_t>(begin) * c.num_dense],
                                    &b.pooled[static_cast<size_t>(begin) * c.num_tables * c.dim],
                                    &b.labels[begin], count, loss_scale, pooled_grad->data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  return loss.ok() ? *loss : 0.0;
}

double EvalLoss(DenseModel& model, const Batch& b, const std::vector<float>* pooled = nullptr) {
  auto loss = model.Forward(b.dense.data(), pooled ? pooled->data() : b.pooled.data(),
                            b.labels.data(), b.n, nullptr);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return loss.ok() ? *loss : 0.0;
}

TEST(ParseLayersTest, ParsesDashSeparatedSizes) {
  auto layers = ParseLayers("13-512-256-64");
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_THAT(*layers, ElementsAre(13, 512, 256, 64));
  EXPECT_THAT(*ParseLayers("1"), ElementsAre(1));
  EXPECT_EQ(FormatLayers({13, 512, 1}), "13-512-1");
}

TEST(ParseLayersTest, RejectsMalformedSpecs) {
  for (const char* bad :
       {"", "13--64", "13-", "-13", "13-x-64", "13-0-64", "13--5", "1.5-2", "13-64 "}) {
    auto layers = ParseLayers(bad);
    EXPECT_FALSE(layers.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(std::string(ParseLayers("13-x-64").status().message()), HasSubstr("\"x\""));
}

TEST(DenseModelConfigTest, NamesTheInconsistentField) {
  DenseModelConfig c = TinyConfig();
  c.dim = 16;
  c.bottom = {3, 8, 32};
  EXPECT_THAT(std::string(ValidateDenseModelConfig(c).message()),
              HasSubstr("bottom layers: last size 32 must equal the embedding dim 16"));
  c = TinyConfig();
  c.bottom = {4, 5, 4};
  EXPECT_THAT(std::string(ValidateDenseModelConfig(c).message()),
              HasSubstr("first size 4 must equal the number of dense features 3"));
  c = TinyConfig();
  c.top = {6, 2};
  EXPECT_THAT(std::string(ValidateDenseModelConfig(c).message()),
              HasSubstr("top layers: last size 2 must be 1"));
  c = TinyConfig();
  c.bottom = {3};
  EXPECT_FALSE(ValidateDenseModelConfig(c).ok());
  EXPECT_FALSE(DenseModel::Create(DeviceContext::Cpu(), c).ok());
}

TEST(DenseModelTest, LayoutCountsEveryWeightAndBias) {
  const DenseModelConfig c = TinyConfig();
  auto model = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_NE(model, nullptr);
  // Interaction: dim 4 + 3 * 2 / 2 = 7 features.
  EXPECT_EQ(InteractionFeatures(2, 4), 7);
  const size_t expected = (3 * 5 + 5) + (5 * 4 + 4) + (7 * 6 + 6) + (6 * 1 + 1);
  EXPECT_EQ(model->num_parameters(), expected);
  ASSERT_EQ(model->layers().size(), 4u);
  EXPECT_TRUE(model->layers()[1].relu);  // DLRM: ReLU after the last bottom layer too
  EXPECT_TRUE(model->layers()[2].relu);
  EXPECT_FALSE(model->layers()[3].relu);
  EXPECT_EQ(model->layers()[2].in, 7);
}

TEST(DenseModelTest, InitialisationFollowsTheSeedAndDlrmScales) {
  DenseModelConfig c = SmallConfig();
  c.bottom = {8, 256, 8};
  auto a = MakeModel(DeviceContext::Cpu(), c);
  auto b = MakeModel(DeviceContext::Cpu(), c);
  c.seed += 1;
  auto other = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_TRUE(a && b && other);
  EXPECT_EQ(Parameters(*a), Parameters(*b));
  EXPECT_NE(Parameters(*a), Parameters(*other));
  // First layer W is 256 x 8: std sqrt(2 / 264).
  const std::vector<float> p = Parameters(*a);
  double sum2 = 0;
  for (int i = 0; i < 256 * 8; ++i) sum2 += p[i] * p[i];
  EXPECT_NEAR(std::sqrt(sum2 / (256 * 8)), std::sqrt(2.0 / 264), 0.01);
}

TEST(DenseModelTest, GradientsMatchCentralFiniteDifferences) {
  const DenseModelConfig c = TinyConfig();
  auto model = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_NE(model, nullptr);
  const Batch b = MakeBatch(c, 3, 1);
  std::vector<float> pooled_grad;
  const double loss = TrainStep(*model, b, 1.0f, &pooled_grad);
  EXPECT_GT(loss, 0);
  EXPECT_NEAR(loss, EvalLoss(*model, b), 1e-5);
  const std::vector<float> grads = Gradients(*model);
  const std::vector<float> params = Parameters(*model);
  // The check is meaningful only if the gradients are well above its absolute tolerance.
  EXPECT_GT(*std::max_element(grads.begin(), grads.end()), 0.05f);
  EXPECT_GT(*std::max_element(pooled_grad.begin(), pooled_grad.end()), 0.05f);

  constexpr double kStep = 1e-3;
  auto expect_close = [](double analytic, double numeric, const std::string& what) {
    EXPECT_NEAR(analytic, numeric, 2e-3 + 1e-2 * std::fabs(numeric)) << what;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> p = params;
    p[i] = params[i] + kStep;
    ASSERT_TRUE(model->WriteParameters(p).ok());
    const double up = EvalLoss(*model, b);
    p[i] = params[i] - kStep;
    ASSERT_TRUE(model->WriteParameters(p).ok());
    const double down = EvalLoss(*model, b);
    expect_close(grads[i], (up - down) / (2 * kStep), "parameter " + std::to_string(i));
  }
  ASSERT_TRUE(model->WriteParameters(params).ok());
  for (size_t i = 0; i < b.pooled.size(); ++i) {
    std::vector<float> pooled = b.pooled;
    pooled[i] = b.pooled[i] + kStep;
    const double up = EvalLoss(*model, b, &pooled);
    pooled[i] = b.pooled[i] - kStep;
    const double down = EvalLoss(*model, b, &pooled);
    expect_close(pooled_grad[i], (up - down) / (2 * kStep), "pooled " + std::to_string(i));
  }
}

TEST(DenseModelTest, LossScaleScalesEveryGradient) {
  const DenseModelConfig c = TinyConfig();
  auto a = MakeModel(DeviceContext::Cpu(), c);
  auto b = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_TRUE(a && b);
  const Batch batch = MakeBatch(c, 8, 2);
  std::vector<float> ga, gb;
  TrainStep(*a, batch, 1.0f, &ga);
  TrainStep(*b, batch, 0.25f, &gb);
  const std::vector<float> pa = Gradients(*a), pb = Gradients(*b);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_NEAR(pb[i], 0.25f * pa[i], 1e-6) << i;
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(gb[i], 0.25f * ga[i], 1e-6) << i;
}

TEST(DenseModelTest, ForwardReturnsProbabilities) {
  const DenseModelConfig c = TinyConfig();
  auto model = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_NE(model, nullptr);
  const Batch b = MakeBatch(c, 5, 3);
  std::vector<float> probabilities(5, -1.0f);
  auto loss =
      model->Forward(b.dense.data(), b.pooled.data(), b.labels.data(), 5, probabilities.data());
  ASSERT_TRUE(loss.ok());
  double expected = 0;
  for (int s = 0; s < 5; ++s) {
    EXPECT_GT(probabilities[s], 0.0f);
    EXPECT_LT(probabilities[s], 1.0f);
    expected -= b.labels[s] > 0 ? std::log(probabilities[s]) : std::log(1 - probabilities[s]);
  }
  EXPECT_NEAR(*loss, expected, 1e-4);
  auto no_labels = model->Forward(b.dense.data(), b.pooled.data(), nullptr, 5, nullptr);
  ASSERT_TRUE(no_labels.ok());
  EXPECT_EQ(*no_labels, 0.0);
  // Forward leaves the gradients alone.
  for (float g : Gradients(*model)) EXPECT_EQ(g, 0.0f);
}

void ExpectLearns(OptimizerKind kind, float lr) {
  DenseModelConfig c = SmallConfig();
  c.optimizer.kind = kind;
  auto model = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_NE(model, nullptr);
  const Batch eval = MakeBatch(c, 512, 1000);
  const double before = EvalLoss(*model, eval) / eval.n;
  constexpr int kBatch = 64;
  std::vector<float> pooled_grad;
  for (int step = 0; step < 300; ++step) {
    const Batch b = MakeBatch(c, kBatch, step);
    TrainStep(*model, b, 1.0f / kBatch, &pooled_grad);
    ASSERT_TRUE(model->Step(lr).ok());
  }
  const double after = EvalLoss(*model, eval) / eval.n;
  EXPECT_LT(after, 0.75 * before) << OptimizerName(kind) << ": " << before << " -> " << after;
}

TEST(DenseModelTest, SgdLearnsASyntheticTask) { ExpectLearns(OptimizerKind::kSgd, 0.5f); }
TEST(DenseModelTest, AdagradLearnsASyntheticTask) { ExpectLearns(OptimizerKind::kAdagrad, 0.02f); }
TEST(DenseModelTest, RowwiseAdagradActsAsAdagrad) {
  DenseModelConfig c = TinyConfig();
  c.optimizer.kind = OptimizerKind::kAdagrad;
  auto a = MakeModel(DeviceContext::Cpu(), c);
  c.optimizer.kind = OptimizerKind::kRowwiseAdagrad;
  auto b = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_TRUE(a && b);
  const Batch batch = MakeBatch(c, 16, 4);
  std::vector<float> g;
  for (DenseModel* m : {a.get(), b.get()}) {
    TrainStep(*m, batch, 1.0f / 16, &g);
    ASSERT_TRUE(m->Step(0.1f).ok());
  }
  EXPECT_EQ(Parameters(*a), Parameters(*b));
}

TEST(DenseModelTest, StepAppliesSgdAndZeroesGradients) {
  const DenseModelConfig c = TinyConfig();
  auto model = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_NE(model, nullptr);
  const Batch b = MakeBatch(c, 4, 9);
  std::vector<float> g;
  TrainStep(*model, b, 0.25f, &g);
  const std::vector<float> before = Parameters(*model);
  const std::vector<float> grads = Gradients(*model);
  ASSERT_TRUE(model->Step(0.1f).ok());
  const std::vector<float> after = Parameters(*model);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i] - 0.1f * grads[i]);
  for (float v : Gradients(*model)) EXPECT_EQ(v, 0.0f);
}

TEST(DenseModelTest, DeterministicRunsAreBitIdentical) {
  DenseModelConfig c = SmallConfig();
  c.optimizer.kind = OptimizerKind::kAdagrad;
  std::vector<std::vector<float>> params, pooled;
  for (int run = 0; run < 2; ++run) {
    auto model = MakeModel(DeviceContext::Cpu(), c);
    ASSERT_NE(model, nullptr);
    std::vector<float> g;
    for (int step = 0; step < 10; ++step) {
      TrainStep(*model, MakeBatch(c, 200, step), 1.0f / 200, &g);
      ASSERT_TRUE(model->Step(0.05f).ok());
    }
    params.push_back(Parameters(*model));
    pooled.push_back(g);
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  EXPECT_EQ(std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pooled[0].data(), pooled[1].data(), pooled[0].size() * sizeof(float)), 0);
}

TEST(DenseModelTest, SplitBatchGradientsSumToTheFullBatch) {
  const DenseModelConfig c = SmallConfig();
  auto full = MakeModel(DeviceContext::Cpu(), c);
  auto split = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_TRUE(full && split);
  constexpr int kN = 100;
  const Batch b = MakeBatch(c, kN, 21);
  std::vector<float> full_pooled, first, second;
  const double full_loss = TrainStep(*full, b, 1.0f / kN, &full_pooled);
  const double loss1 = TrainStep(*split, b, 1.0f / kN, &first, 0, 40);
  const double loss2 = TrainStep(*split, b, 1.0f / kN, &second, 40, 60);
  EXPECT_NEAR(loss1 + loss2, full_loss, 1e-6 * full_loss);
  const std::vector<float> gf = Gradients(*full), gs = Gradients(*split);
  for (size_t i = 0; i < gf.size(); ++i) {
    EXPECT_NEAR(gs[i], gf[i], 1e-6 + 1e-4 * std::fabs(gf[i])) << i;
  }
  first.insert(first.end(), second.begin(), second.end());
  ASSERT_EQ(first.size(), full_pooled.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_NEAR(first[i], full_pooled[i], 1e-7) << i;
}

TEST(DenseModelTest, RejectsBadArguments) {
  const DenseModelConfig c = TinyConfig();
  auto model = MakeModel(DeviceContext::Cpu(), c);
  ASSERT_NE(model, nullptr);
  const Batch b = MakeBatch(c, 2, 1);
  std::vector<float> g(b.pooled.size());
  EXPECT_FALSE(
      model->ForwardBackward(b.dense.data(), b.pooled.data(), b.labels.data(), -1, 1, g.data())
          .ok());
  EXPECT_FALSE(
      model->ForwardBackward(b.dense.data(), b.pooled.data(), nullptr, 2, 1, g.data()).ok());
  auto zero = model->ForwardBackward(nullptr, nullptr, nullptr, 0, 1, nullptr);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0.0);
  EXPECT_FALSE(model->WriteParameters(std::vector<float>(3)).ok());
}

// ---- CUDA backend against the CPU reference --------------------------------------------------

class DenseModelCudaTest : public ::testing::TestWithParam<OptimizerKind> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << CudaDeviceDescription(0);
    auto context = DeviceContext::Cuda(0);
    ASSERT_TRUE(context.ok()) << context.status();
    cuda_ = *context;
  }

  // Copies host floats to a fresh device array.
  DeviceArray<float> ToDevice(const std::vector<float>& host) {
    auto array = DeviceArray<float>::Create(cuda_, host.size());
    EXPECT_TRUE(array.ok());
    EXPECT_TRUE(cuda_->CopyToDevice(array->data(), host.data(), array->bytes()).ok());
    EXPECT_TRUE(cuda_->Synchronize().ok());
    return std::move(*array);
  }
  std::vector<float> ToHost(const float* device, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(cuda_->CopyToHost(host.data(), device, n * sizeof(float)).ok());
    EXPECT_TRUE(cuda_->Synchronize().ok());
    return host;
  }

  std::shared_ptr<DeviceContext> cuda_;
};

// |actual - expected| <= scale_tol * max|expected| + rtol * |expected|, element-wise: sums over
// many samples cancel, so near-zero entries are judged against the vector's scale.
void ExpectAllClose(const std::vector<float>& actual, const std::vector<float>& expected,
                    double scale_tol, double rtol, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0;
  for (float v : expected) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 10; ++i) {
    if (std::fabs(actual[i] - expected[i]) > scale_tol * scale + rtol * std::fabs(expected[i])) {
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " vs " << expected[i]
                    << " (max |expected| " << scale << ")";
      ++failures;
    }
  }
}

TEST_P(DenseModelCudaTest, MatchesTheCpuReference) {
  DenseModelConfig c;
  c.num_dense = 13;
  c.num_tables = 26;
  c.dim = 16;
  c.bottom = {13, 64, 32, 16};
  c.top = {64, 32, 1};
  c.seed = 3;
  c.optimizer.kind = GetParam();
  // With a zero accumulator the first Adagrad step is lr * sign(g): a near-zero gradient that
  // rounds to opposite signs would move a parameter by 2 lr. Start from 1 to compare smoothly.
  c.optimizer.initial_accumulator = 1.0f;
  c.deterministic = true;
  auto cpu = MakeModel(DeviceContext::Cpu(), c);
  auto gpu = MakeModel(cuda_, c);
  ASSERT_TRUE(cpu && gpu);
  // Initial parameters come from the host: identical bits.
  EXPECT_EQ(Parameters(*cpu), Parameters(*gpu));

  constexpr int kN = 300;
  const float lr = GetParam() == OptimizerKind::kSgd ? 0.1f : 0.01f;
  for (int step = 0; step < 3; ++step) {
    const Batch b = MakeBatch(c, kN, 40 + step);
    std::vector<float> cpu_pooled_grad;
    const double cpu_loss = TrainStep(*cpu, b, 1.0f / kN, &cpu_pooled_grad);
    DeviceArray<float> dense = ToDevice(b.dense), pooled = ToDevice(b.pooled),
                       labels = ToDevice(b.labels);
    auto pooled_grad = DeviceArray<float>::Create(cuda_, b.pooled.size());
    ASSERT_TRUE(pooled_grad.ok());
    auto gpu_loss = gpu->ForwardBackward(dense.data(), pooled.data(), labels.data(), kN, 1.0f / kN,
                                         pooled_grad->data());
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
    EXPECT_NEAR(*gpu_loss, cpu_loss, 1e-4 * cpu_loss) << "step " << step;
    ExpectAllClose(ToHost(pooled_grad->data(), b.pooled.size()), cpu_pooled_grad, 1e-4, 1e-3,
                   "pooled_grad");
    ExpectAllClose(ToHost(gpu->gradients(), gpu->num_parameters()), Gradients(*cpu), 1e-4, 1e-3,
                   "gradients");
    ASSERT_TRUE(cpu->Step(lr).ok());
    ASSERT_TRUE(gpu->Step(lr).ok());
    ExpectAllClose(Parameters(*gpu), Parameters(*cpu), 1e-5, 1e-4, "parameters");
    for (float g : ToHost(gpu->gradients(), gpu->num_parameters())) ASSERT_EQ(g, 0.0f);

    std::vector<float> cpu_p(kN), gpu_p(kN);
    auto cpu_eval =
        cpu->Forward(b.dense.data(), b.pooled.data(), b.labels.data(), kN, cpu_p.data());
    auto gpu_eval = gpu->Forward(dense.data(), pooled.data(), labels.data(), kN, gpu_p.data());
    ASSERT_TRUE(cpu_eval.ok() && gpu_eval.ok());
    EXPECT_NEAR(*gpu_eval, *cpu_eval, 1e-4 * *cpu_eval);
    ExpectAllClose(gpu_p, cpu_p, 1e-5, 1e-4, "probabilities");
  }
}

TEST_P(DenseModelCudaTest, DeterministicRunsAreBitIdentical) {
  DenseModelConfig c = SmallConfig();
  c.optimizer.kind = GetParam();
  std::vector<std::vector<float>> params;
  for (int run = 0; run < 2; ++run) {
    auto model = MakeModel(cuda_, c);
    ASSERT_NE(model, nullptr);
    for (int step = 0; step < 5; ++step) {
      const Batch b = MakeBatch(c, 257, step);
      DeviceArray<float> dense = ToDevice(b.dense), pooled = ToDevice(b.pooled),
                         labels = ToDevice(b.labels);
      auto pooled_grad = DeviceArray<float>::Create(cuda_, b.pooled.size());
      ASSERT_TRUE(pooled_grad.ok());
      ASSERT_TRUE(model
                      ->ForwardBackward(dense.data(), pooled.data(), labels.data(), b.n, 1.0f / b.n,
                                        pooled_grad->data())
                      .ok());
      ASSERT_TRUE(model->Step(0.05f).ok());
    }
    params.push_back(Parameters(*model));
  }
  EXPECT_EQ(std::memcmp(params[0].data(), params[1].data(), params[0].size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DenseModelCudaTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad),
                         [](const ::testing::TestParamInfo<OptimizerKind>& info) {
                           return info.param == OptimizerKind::kSgd ? "Sgd" : "Adagrad";
                         });

// A DenseModel and its inputs on the GPU and on the CPU, for the shape tests below.
class DenseModelCudaShapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << CudaDeviceDescription(0);
    auto context = DeviceContext::Cuda(0);
    ASSERT_TRUE(context.ok()) << context.status();
    cuda_ = *context;
  }
  std::shared_ptr<DeviceContext> cuda_;
};

// 101 vectors of dim 128 need 52 KB of shared memory per sample: more than the 48 KB a kernel
// gets without opting in (cudaFuncSetAttribute).
TEST_F(DenseModelCudaShapeTest, AnInteractionBeyond48KiBOfSharedMemoryMatchesTheCpu) {
  DenseModelConfig c;
  c.num_dense = 4;
  c.num_tables = 100;
  c.dim = 128;
  c.bottom = {4, 128};
  c.top = {8, 1};
  c.seed = 5;
  c.deterministic = true;
  auto cpu = MakeModel(DeviceContext::Cpu(CpuStreams::kSync), c);
  auto gpu = MakeModel(cuda_, c);
  ASSERT_TRUE(cpu && gpu);
  constexpr int kN = 16;
  const Batch b = MakeBatch(c, kN, 9);
  std::vector<float> cpu_pooled_grad;
  const double cpu_loss = TrainStep(*cpu, b, 1.0f / kN, &cpu_pooled_grad);
  auto to_device = [&](const std::vector<float>& host) {
    auto array = DeviceArray<float>::Create(cuda_, host.size());
    EXPECT_TRUE(array.ok());
    EXPECT_TRUE(cuda_->CopyToDevice(array->data(), host.data(), array->bytes()).ok());
    EXPECT_TRUE(cuda_->Synchronize().ok());
    return std::move(*array);
  };
  DeviceArray<float> dense = to_device(b.dense), pooled = to_device(b.pooled),
                     labels = to_device(b.labels);
  auto pooled_grad = DeviceArray<float>::Create(cuda_, b.pooled.size());
  ASSERT_TRUE(pooled_grad.ok());
  auto gpu_loss = gpu->ForwardBackward(dense.data(), pooled.data(), labels.data(), kN, 1.0f / kN,
                                       pooled_grad->data());
  ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
  EXPECT_NEAR(*gpu_loss, cpu_loss, 1e-4 * cpu_loss);
  std::vector<float> back(b.pooled.size());
  ASSERT_TRUE(cuda_->CopyToHost(back.data(), pooled_grad->data(), back.size() * 4).ok());
  ASSERT_TRUE(cuda_->Synchronize().ok());
  double scale = 0;
  for (float v : cpu_pooled_grad) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < back.size(); ++i) {
    ASSERT_NEAR(back[i], cpu_pooled_grad[i], 1e-4 * scale + 1e-3 * std::fabs(cpu_pooled_grad[i]))
        << i;
  }
}

#if BAGPIPE_WITH_CUDA
TEST_F(DenseModelCudaShapeTest, LeavesTheContextsSharedCublasHandleAsItWas) {
  auto shared = static_cast<cublasHandle_t>(cuda_->cublas_handle());
  ASSERT_EQ(cublasSetAtomicsMode(shared, CUBLAS_ATOMICS_ALLOWED), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetPointerMode(shared, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  DenseModelConfig c = SmallConfig();
  c.deterministic = true;
  auto model = MakeModel(cuda_, c);
  ASSERT_NE(model, nullptr);
  cublasAtomicsMode_t atomics;
  cublasPointerMode_t pointers;
  ASSERT_EQ(cublasGetAtomicsMode(shared, &atomics), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasGetPointerMode(shared, &pointers), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(atomics, CUBLAS_ATOMICS_ALLOWED);
  EXPECT_EQ(pointers, CUBLAS_POINTER_MODE_DEVICE);
}
#endif

}  // namespace
}  // namespace bagpipe
