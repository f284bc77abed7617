// Throughput of the embedding cache's hot operations on a Criteo-like shape: 26 tables, one id
// per bag, batch 16384, a 10^6-slot cache, Zipf-skewed slots (exponent 1.05), dim 64 and 128.
//
// Reported: GBps = bytes read + written per second (decimal GB), counting row traffic and the
// index arrays. CPU runs use 1 thread and all cores (TBB arena). With a CUDA device, the same
// operations run on it, and a device-to-device cudaMemcpy moving the same bytes (copy of half
// the bytes: each copied byte is read once and written once) gives the reference bandwidth;
// `vs_memcpy` is the operation's GBps over that reference.
//
//   build-cache/bench/cache/cache_bench [--benchmark_filter=Gather]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "cache/embedding_cache.h"
#include "core/random.h"
#include "core/row_init.h"
#include "core/timer.h"
#include "tbb/info.h"
#include "tbb/task_arena.h"

namespace bagpipe {
namespace {

constexpr int kTables = 26;
constexpr int kSamples = 16384;
constexpr int64_t kCapacity = 1'000'000;
constexpr double kZipfExponent = 1.05;
// CUDA operations queued per timed iteration (amortises the launch and synchronisation).
constexpr int kCudaRepeats = 20;

// One global batch as a plan would deliver it, in host memory.
struct Workload {
  std::vector<int64_t> offsets;
  std::vector<SlotId> slots;
  std::vector<uint32_t> unique_index;
  std::vector<SlotId> unique_slots;
};

const Workload& GetWorkload() {
  static const Workload* workload = [] {
    auto* w = new Workload;
    // Zipf ranks over the cache, mapped to scattered slots by a bijection of [0, capacity).
    std::vector<double> cdf(kCapacity);
    double total = 0;
    for (int64_t r = 0; r < kCapacity; ++r) {
      total += std::pow(static_cast<double>(r + 1), -kZipfExponent);
      cdf[r] = total;
    }
    CounterRng rng(HashKey(2024, 0x21bf));
    std::vector<int32_t> unique_of(kCapacity, -1);
    w->offsets.push_back(0);
    for (int64_t bag = 0; bag < int64_t{kTables} * kSamples; ++bag) {
      const double target = rng.NextDouble() * total;
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), target) - cdf.begin();
      const auto slot = static_cast<SlotId>((rank * 999'983) % kCapacity);
      if (unique_of[slot] < 0) {
        unique_of[slot] = static_cast<int32_t>(w->unique_slots.size());
        w->unique_slots.push_back(slot);
      }
      w->unique_index.push_back(static_cast<uint32_t>(unique_of[slot]));
      w->slots.push_back(slot);
      w->offsets.push_back(static_cast<int64_t>(w->slots.size()));
    }
    return w;
  }();
  return *workload;
}

OptimizerConfig Optimizer(OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  config.learning_rate = 1e-3f;
  config.eps = 1e-8f;
  return config;
}

// One initialised cache per (backend, dim, optimizer), kept for the whole run.
EmbeddingCache* GetCache(const std::shared_ptr<DeviceContext>& context, int dim,
                         OptimizerKind kind) {
  static auto* caches =
      new std::map<std::tuple<bool, int, OptimizerKind>, std::unique_ptr<EmbeddingCache>>;
  auto& cache = (*caches)[{context->is_cuda(), dim, kind}];
  if (cache == nullptr) {
    CacheOptions options;
    options.validation = Validation::kOff;
    auto created = EmbeddingCache::Create(context, kCapacity, dim, Optimizer(kind), options);
    if (!created.ok()) return nullptr;
    cache = std::move(created).value();
    const RowInitializer init(7, dim, cache->state_floats(), 0.0f, {kCapacity});
    if (!cache->InitializeRows(init, 0, kCapacity).ok()) return nullptr;
  }
  return cache.get();
}

// Host or device copies of a vector in `context`'s memory.
template <typename T>
DeviceArray<T> Place(const std::shared_ptr<DeviceContext>& context, const std::vector<T>& host) {
  auto array = std::move(DeviceArray<T>::Create(context, std::max<size_t>(1, host.size()))).value();
  (void)context->CopyToDevice(array.data(), host.data(), host.size() * sizeof(T));
  (void)context->Synchronize();
  return array;
}

std::vector<float> SmallGradients(size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 1e-3f * (UnitFloat(HashKey(5, i)) - 0.5f);
  return g;
}

int64_t GatherBytes(int dim) {
  const Workload& w = GetWorkload();
  const int64_t ids = static_cast<int64_t>(w.slots.size());
  const int64_t bags = int64_t{kTables} * kSamples;
  return ids * (dim * 4 + 4) + (bags + 1) * 8 + bags * dim * 4;
}

int64_t ReduceBytes(int dim) {
  const Workload& w = GetWorkload();
  const int64_t ids = static_cast<int64_t>(w.slots.size());
  const int64_t unique = static_cast<int64_t>(w.unique_slots.size());
  return ids * (dim * 4 + 4) + (unique + 1) * 8 + unique * dim * 4;
}

int64_t ApplyBytes(int dim, OptimizerKind kind) {
  const int64_t unique = static_cast<int64_t>(GetWorkload().unique_slots.size());
  const int64_t per_row = kind == OptimizerKind::kSgd       ? 3 * dim * 4
                          : kind == OptimizerKind::kAdagrad ? 5 * dim * 4
                                                            : 3 * dim * 4 + 8;
  return unique * (per_row + 4);
}

void SetThroughput(benchmark::State& state, int64_t bytes_per_op, int64_t ops_per_iteration) {
  state.counters["GBps"] = benchmark::Counter(
      static_cast<double>(bytes_per_op) * ops_per_iteration * state.iterations() / 1e9,
      benchmark::Counter::kIsRate);
  state.counters["unique_rows"] = static_cast<double>(GetWorkload().unique_slots.size());
}

// --- CPU ---------------------------------------------------------------------------------------

int Threads(benchmark::State& state) {
  return state.range(1) == 0 ? tbb::info::default_concurrency() : static_cast<int>(state.range(1));
}

void BM_CpuGather(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const auto context = DeviceContext::Cpu();
  EmbeddingCache* cache = GetCache(context, dim, OptimizerKind::kSgd);
  const Workload& w = GetWorkload();
  std::vector<float> pooled(size_t{kTables} * kSamples * dim);
  tbb::task_arena arena(Threads(state));
  for (auto _ : state) {
    arena.execute([&] {
      auto status =
          cache->Gather(w.slots.data(), w.offsets.data(), kTables, kSamples, pooled.data());
      if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    });
    benchmark::DoNotOptimize(pooled.data());
  }
  state.counters["threads"] = Threads(state);
  SetThroughput(state, GatherBytes(dim), 1);
}

void BM_CpuReduce(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const auto context = DeviceContext::Cpu();
  EmbeddingCache* cache = GetCache(context, dim, OptimizerKind::kSgd);
  const Workload& w = GetWorkload();
  BackwardIndex index;
  (void)index.Build(context, w.offsets.data(), kTables, kSamples, w.unique_index.data(),
                    static_cast<int64_t>(w.slots.size()), static_cast<int>(w.unique_slots.size()));
  const std::vector<float> pooled_grad = SmallGradients(size_t{kTables} * kSamples * dim);
  std::vector<float> grads(w.unique_slots.size() * dim);
  tbb::task_arena arena(Threads(state));
  for (auto _ : state) {
    arena.execute([&] {
      auto status = cache->ReduceGradients(index, pooled_grad.data(), grads.data());
      if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    });
    benchmark::DoNotOptimize(grads.data());
  }
  state.counters["threads"] = Threads(state);
  SetThroughput(state, ReduceBytes(dim), 1);
}

void BM_CpuApply(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const auto kind = static_cast<OptimizerKind>(state.range(2));
  const auto context = DeviceContext::Cpu();
  EmbeddingCache* cache = GetCache(context, dim, kind);
  const Workload& w = GetWorkload();
  const std::vector<float> grads = SmallGradients(w.unique_slots.size() * dim);
  const auto n = static_cast<int64_t>(w.unique_slots.size());
  tbb::task_arena arena(Threads(state));
  for (auto _ : state) {
    arena.execute([&] {
      auto status = cache->Apply(w.unique_slots.data(), grads.data(), n);
      if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    });
  }
  state.counters["threads"] = Threads(state);
  SetThroughput(state, ApplyBytes(dim, kind), 1);
}

// --- CUDA --------------------------------------------------------------------------------------

std::shared_ptr<DeviceContext> CudaContext() {
  static std::shared_ptr<DeviceContext>* context = [] {
    auto created = DeviceContext::Cuda(0);
    return new std::shared_ptr<DeviceContext>(created.ok() ? *created : nullptr);
  }();
  return *context;
}

// GB/s of cudaMemcpy device-to-device moving `bytes` (read + write) per copy.
double MemcpyGBps(int64_t bytes) {
  const auto context = CudaContext();
  const size_t half = static_cast<size_t>(bytes / 2);
  auto src = std::move(DeviceArray<char>::Create(context, half)).value();
  auto dst = std::move(DeviceArray<char>::Create(context, half)).value();
  (void)context->CopyOnDevice(dst.data(), src.data(), half);
  (void)context->Synchronize();
  Stopwatch watch;
  constexpr int kCopies = 50;
  for (int i = 0; i < kCopies; ++i) (void)context->CopyOnDevice(dst.data(), src.data(), half);
  (void)context->Synchronize();
  return static_cast<double>(half) * 2 * kCopies / watch.Seconds() / 1e9;
}

// Runs `op` kCudaRepeats times per iteration, then synchronises; reports GBps, the memcpy
// reference and their ratio.
template <typename Op>
void TimeCuda(benchmark::State& state, int64_t bytes, const Op& op) {
  const auto context = CudaContext();
  double seconds = 0;
  for (auto _ : state) {
    Stopwatch watch;
    for (int r = 0; r < kCudaRepeats; ++r) {
      const absl::Status status = op();
      if (!status.ok()) {
        state.SkipWithError(status.ToString().c_str());
        return;
      }
    }
    const absl::Status status = context->Synchronize();
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
    seconds += watch.Seconds();
  }
  SetThroughput(state, bytes, kCudaRepeats);
  const double op_gbps =
      static_cast<double>(bytes) * kCudaRepeats * state.iterations() / seconds / 1e9;
  const double memcpy_gbps = MemcpyGBps(bytes);
  state.counters["memcpy_GBps"] = memcpy_gbps;
  state.counters["vs_memcpy"] = op_gbps / memcpy_gbps;
}

void BM_CudaGather(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const auto context = CudaContext();
  EmbeddingCache* cache = GetCache(context, dim, OptimizerKind::kSgd);
  const Workload& w = GetWorkload();
  auto slots = Place(context, w.slots);
  auto offsets = Place(context, w.offsets);
  auto pooled =
      std::move(DeviceArray<float>::Create(context, size_t{kTables} * kSamples * dim)).value();
  TimeCuda(state, GatherBytes(dim), [&] {
    return cache->Gather(slots.data(), offsets.data(), kTables, kSamples, pooled.data());
  });
}

void BM_CudaReduce(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const auto context = CudaContext();
  EmbeddingCache* cache = GetCache(context, dim, OptimizerKind::kSgd);
  const Workload& w = GetWorkload();
  BackwardIndex index;
  (void)index.Build(context, w.offsets.data(), kTables, kSamples, w.unique_index.data(),
                    static_cast<int64_t>(w.slots.size()), static_cast<int>(w.unique_slots.size()));
  auto pooled_grad = Place(context, SmallGradients(size_t{kTables} * kSamples * dim));
  auto grads = std::move(DeviceArray<float>::Create(context, w.unique_slots.size() * dim)).value();
  TimeCuda(state, ReduceBytes(dim),
           [&] { return cache->ReduceGradients(index, pooled_grad.data(), grads.data()); });
}

void BM_CudaApply(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const auto kind = static_cast<OptimizerKind>(state.range(1));
  const auto context = CudaContext();
  EmbeddingCache* cache = GetCache(context, dim, kind);
  const Workload& w = GetWorkload();
  auto slots = Place(context, w.unique_slots);
  auto grads = Place(context, SmallGradients(w.unique_slots.size() * dim));
  const auto n = static_cast<int64_t>(w.unique_slots.size());
  TimeCuda(state, ApplyBytes(dim, kind),
           [&] { return cache->Apply(slots.data(), grads.data(), n); });
}

void BM_CudaMemcpy(benchmark::State& state) {
  const int64_t bytes = GatherBytes(static_cast<int>(state.range(0)));
  const auto context = CudaContext();
  const size_t half = static_cast<size_t>(bytes / 2);
  auto src = std::move(DeviceArray<char>::Create(context, half)).value();
  auto dst = std::move(DeviceArray<char>::Create(context, half)).value();
  TimeCuda(state, bytes, [&] { return context->CopyOnDevice(dst.data(), src.data(), half); });
}

void RegisterAll() {
  const int all = 0;  // threads argument meaning "all cores"
  const std::vector<int64_t> kinds = {static_cast<int64_t>(OptimizerKind::kSgd),
                                      static_cast<int64_t>(OptimizerKind::kAdagrad),
                                      static_cast<int64_t>(OptimizerKind::kRowwiseAdagrad)};
  for (int dim : {64, 128}) {
    for (int threads : {1, all}) {
      benchmark::RegisterBenchmark("BM_CpuGather", BM_CpuGather)
          ->Args({dim, threads})
          ->ArgNames({"dim", "threads"})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark("BM_CpuReduce", BM_CpuReduce)
          ->Args({dim, threads})
          ->ArgNames({"dim", "threads"})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      for (int64_t kind : kinds) {
        benchmark::RegisterBenchmark("BM_CpuApply", BM_CpuApply)
            ->Args({dim, threads, kind})
            ->ArgNames({"dim", "threads", "optimizer"})
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
  if (CudaDeviceCount() == 0 || CudaContext() == nullptr) return;
  for (int dim : {64, 128}) {
    benchmark::RegisterBenchmark("BM_CudaMemcpy", BM_CudaMemcpy)
        ->Args({dim})
        ->ArgNames({"gather_bytes_of_dim"})
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark("BM_CudaGather", BM_CudaGather)
        ->Args({dim})
        ->ArgNames({"dim"})
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark("BM_CudaReduce", BM_CudaReduce)
        ->Args({dim})
        ->ArgNames({"dim"})
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    for (int64_t kind : kinds) {
      benchmark::RegisterBenchmark("BM_CudaApply", BM_CudaApply)
          ->Args({dim, kind})
          ->ArgNames({"dim", "optimizer"})
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bagpipe::RegisterAll();
  benchmark::AddCustomContext(
      "workload", absl::StrFormat("%d tables x %d samples, one-hot, capacity %d, "
                                  "Zipf %.2f",
                                  bagpipe::kTables, bagpipe::kSamples, bagpipe::kCapacity,
                                  bagpipe::kZipfExponent));
  benchmark::AddCustomContext("cuda", bagpipe::CudaDeviceDescription(0));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
