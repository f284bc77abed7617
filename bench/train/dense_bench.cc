// Throughput of the reference DLRM's dense part: one ForwardBackward + Step per iteration.
//
// Shapes: "paper" = 13 dense features, bottom 13-512-256-64-48, 26 tables of dim 48, top
// 1024-1024-1024-256-128-1; "small" = bottom 13-64-16, 8 tables of dim 16, top 64-32-1.
// Batch 2048 (and 256 for small). CPU runs use OpenBLAS's default thread count (non-deterministic
// mode) and report samples/s; with a CUDA device the same shapes run on it.
//
//   build-model/bench/train/dense_bench [--benchmark_filter=Cpu]
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "core/device.h"
#include "core/random.h"
#include "model/dense_model.h"

namespace bagpipe {
namespace {

DenseModelConfig PaperShape() {
  DenseModelConfig c;
  c.num_dense = 13;
  c.num_tables = 26;
  c.dim = 48;
  c.bottom = {13, 512, 256, 64, 48};
  c.top = {1024, 1024, 1024, 256, 128, 1};
  return c;
}

DenseModelConfig SmallShape() {
  DenseModelConfig c;
  c.num_dense = 13;
  c.num_tables = 8;
  c.dim = 16;
  c.bottom = {13, 64, 16};
  c.top = {64, 32, 1};
  return c;
}

void RunDense(benchmark::State& state, const DenseModelConfig& shape, bool cuda) {
  DenseModelConfig config = shape;
  config.seed = 1;
  config.deterministic = false;
  config.optimizer.kind = OptimizerKind::kSgd;
  const int n = static_cast<int>(state.range(0));
  std::shared_ptr<DeviceContext> context;
  if (cuda) {
    if (CudaDeviceCount() == 0) {
      state.SkipWithError("no CUDA device");
      return;
    }
    auto made = DeviceContext::Cuda(0);
    if (!made.ok()) {
      state.SkipWithError(std::string(made.status().message()).c_str());
      return;
    }
    context = *made;
  } else {
    context = DeviceContext::Cpu();
  }
  auto model = DenseModel::Create(context, config);
  if (!model.ok()) {
    state.SkipWithError(std::string(model.status().message()).c_str());
    return;
  }
  // Random inputs, copied into the context's memory.
  CounterRng rng(HashKey(9, 9));
  std::vector<float> dense(static_cast<size_t>(n) * config.num_dense);
  std::vector<float> pooled(static_cast<size_t>(n) * config.num_tables * config.dim);
  std::vector<float> labels(n);
  for (float& v : dense) v = rng.NextFloat();
  for (float& v : pooled) v = rng.NextFloat() - 0.5f;
  for (float& v : labels) v = rng.NextFloat() < 0.25f ? 1.0f : 0.0f;
  auto d_dense = DeviceArray<float>::Create(context, dense.size());
  auto d_pooled = DeviceArray<float>::Create(context, pooled.size());
  auto d_labels = DeviceArray<float>::Create(context, labels.size());
  auto d_grad = DeviceArray<float>::Create(context, pooled.size());
  if (!d_dense.ok() || !d_pooled.ok() || !d_labels.ok() || !d_grad.ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  (void)context->CopyToDevice(d_dense->data(), dense.data(), d_dense->bytes());
  (void)context->CopyToDevice(d_pooled->data(), pooled.data(), d_pooled->bytes());
  (void)context->CopyToDevice(d_labels->data(), labels.data(), d_labels->bytes());
  (void)context->Synchronize();

  double loss = 0;
  for (auto _ : state) {
    auto result = (*model)->ForwardBackward(d_dense->data(), d_pooled->data(), d_labels->data(), n,
                                            1.0f / n, d_grad->data());
    if (!result.ok()) {
      state.SkipWithError(std::string(result.status().message()).c_str());
      return;
    }
    loss = *result;
    if (!(*model)->Step(0.01f).ok()) {
      state.SkipWithError("Step failed");
      return;
    }
    (void)context->Synchronize();
  }
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params_M"] = static_cast<double>((*model)->num_parameters()) / 1e6;
  state.counters["loss"] = loss / n;
  state.SetLabel(absl::StrFormat("bottom %s top %s T=%d dim=%d %s", FormatLayers(config.bottom),
                                 FormatLayers(config.top), config.num_tables, config.dim,
                                 context->Describe()));
}

void BM_DensePaperCpu(benchmark::State& state) { RunDense(state, PaperShape(), false); }
void BM_DenseSmallCpu(benchmark::State& state) { RunDense(state, SmallShape(), false); }
void BM_DensePaperCuda(benchmark::State& state) { RunDense(state, PaperShape(), true); }
void BM_DenseSmallCuda(benchmark::State& state) { RunDense(state, SmallShape(), true); }

BENCHMARK(BM_DensePaperCpu)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DenseSmallCpu)->Arg(256)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DensePaperCuda)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DenseSmallCuda)->Arg(256)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace bagpipe

BENCHMARK_MAIN();
