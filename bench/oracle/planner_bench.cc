// Planner throughput on a Criteo-Kaggle-like stream (docs/architecture.md): the 26 Kaggle
// tables at their real sizes (data/synthetic.h), Zipf alpha 1.05, global batches of 16384
// samples, lookahead L = 200, cache capacity 5% of all rows per trainer.
//
// BM_PlanBatch/threads:P/trainers:T measures one steady-state Push (the window is full, so one
// batch enters and one iteration is planned and released) plus its Pop, on P TBB threads
// (0 = all cores), once every trainer's cache is full and has been evicting for a while.
// Batch generation is excluded; as the oracle role does, popped plans are handed back to the
// planner (Recycle) and each pushed batch's buffers come back for the next read.
// Counters: ms_per_batch, ids_per_s, peak_rss_mb (getrusage), huge_pages_mb (transparent huge
// pages in use at the end), hit_rate, misses_per_batch,
// evictions_per_batch, warmup_iterations (iterations planned before the measured ones),
// tracked_rows (per-trainer row records: the window's distinct rows plus the cached ones),
// entry_ms and plan_ms (the planner's own split of a batch's time: entering the batch into the
// window vs planning an iteration).
#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "data/synthetic.h"
#include "oracle/planner.h"
#include "tbb/global_control.h"
#include "tbb/info.h"

namespace bagpipe {
namespace {

constexpr int64_t kBatchSize = 16384;
constexpr int kLookahead = 200;
constexpr int kMeasuredBatches = 40;
constexpr int kSettleIterations = 100;
constexpr int kMaxWarmupBatches = 2000;

// The process's memory on transparent huge pages (the planner's random-access arrays ask for
// them, oracle/huge_pages.h); 0 where /proc is not available.
double HugePagesMb() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  double kb = 0;
  while (in >> key) {
    if (key == "AnonHugePages:") {
      in >> kb;
      break;
    }
  }
  return kb / 1024.0;
}

double PeakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void BM_PlanBatch(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int trainers = static_cast<int>(state.range(1));
  tbb::global_control control(tbb::global_control::max_allowed_parallelism,
                              threads > 0 ? threads : tbb::info::default_concurrency());

  SyntheticConfig config;  // Kaggle tables, alpha 1.05, one-hot
  config.samples = kBatchSize * (kMaxWarmupBatches + kMeasuredBatches + 8);
  auto source = OpenSynthetic(config, SourceOptions{});
  if (!source.ok()) {
    state.SkipWithError(std::string(source.status().message()).c_str());
    return;
  }
  PlannerOptions options;
  options.schema = (*source)->schema();
  options.num_trainers = trainers;
  options.capacity = options.schema.TotalRows() / 20;
  options.lookahead = kLookahead;
  options.policy = CachePolicy::kOracle;
  auto planner = Planner::Create(options);
  if (!planner.ok()) {
    state.SkipWithError(std::string(planner.status().message()).c_str());
    return;
  }

  Batch batch;
  std::vector<std::vector<TrainerPlan>> popped;
  auto push_and_pop = [&]() -> bool {
    if (!(*planner)->Push(std::move(batch), &batch).ok()) return false;
    while (true) {
      auto plans = (*planner)->Pop();
      if (!plans.ok()) return false;
      if (!plans->has_value()) return true;
      popped.push_back(std::move(**plans));
    }
  };
  auto next_batch = [&]() { return (*source)->Read(kBatchSize, &batch).ok(); };
  auto recycle = [&]() {
    for (std::vector<TrainerPlan>& plans : popped) (*planner)->Recycle(std::move(plans));
    popped.clear();
  };

  // Warm up to the steady state: fill the window (from then on every Push plans and releases
  // one iteration), plan until every trainer's cache is full, then L + kSettleIterations more.
  // Timing the iterations that still fill free slots would leave out the eviction work, and
  // while the caches fill, the buffers the planner keeps per window batch or gets back through
  // Recycle keep growing (a one-time cost of a run's start): one more window lets every one of
  // them see steady-state batches.
  const int64_t full = options.capacity * trainers;
  int64_t settle = -1;  // iterations left once the caches are full
  for (int b = 0; b < kMaxWarmupBatches && settle != 0; ++b) {
    if (!next_batch() || !push_and_pop()) {
      state.SkipWithError("warm-up failed");
      return;
    }
    recycle();
    if (settle > 0) {
      --settle;
    } else if (settle < 0 && (*planner)->stats().resident_rows >= full) {
      settle = kLookahead + kSettleIterations;
    }
  }
  if (settle != 0) {
    state.SkipWithError("the caches did not fill during the warm-up");
    return;
  }
  const PlannerStats before = (*planner)->stats();

  int64_t ids = 0;
  for (auto _ : state) {
    state.PauseTiming();
    recycle();
    const bool ok = next_batch();
    ids += batch.num_ids();
    state.ResumeTiming();
    if (!ok || !push_and_pop()) {
      state.SkipWithError("push failed");
      return;
    }
  }
  const PlannerStats after = (*planner)->stats();
  const double iterations =
      static_cast<double>(after[PlannerCounter::kIterations] - before[PlannerCounter::kIterations]);
  const double unique =
      static_cast<double>(after[PlannerCounter::kUniqueRows] - before[PlannerCounter::kUniqueRows]);
  const double hits =
      static_cast<double>(after[PlannerCounter::kHits] - before[PlannerCounter::kHits]);
  const double misses =
      static_cast<double>(after[PlannerCounter::kMisses] - before[PlannerCounter::kMisses]);
  state.counters["ids_per_s"] =
      benchmark::Counter(static_cast<double>(ids), benchmark::Counter::kIsRate);
  state.counters["ms_per_batch"] =
      benchmark::Counter(static_cast<double>(state.iterations()) / 1e3,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["peak_rss_mb"] = PeakRssMb();
  state.counters["huge_pages_mb"] = HugePagesMb();
  state.counters["hit_rate"] = unique > 0 ? hits / unique : 0;
  state.counters["misses_per_batch"] = iterations > 0 ? misses / iterations : 0;
  state.counters["evictions_per_batch"] =
      iterations > 0 ? static_cast<double>(after[PlannerCounter::kEvictions] -
                                           before[PlannerCounter::kEvictions]) /
                           iterations
                     : 0;
  state.counters["warmup_iterations"] = static_cast<double>(before[PlannerCounter::kIterations]);
  state.counters["tracked_rows"] = static_cast<double>(after.tracked_rows);
  // Where the time goes: entering batches (dedup, next-use links) vs planning iterations.
  state.counters["entry_ms"] =
      iterations > 0 ? (after.entry_seconds - before.entry_seconds) * 1e3 / iterations : 0;
  state.counters["plan_ms"] =
      iterations > 0 ? (after.plan_seconds - before.plan_seconds) * 1e3 / iterations : 0;
  for (int k = 1; k < kNumPlannerPhases; ++k) {
    const double seconds = after.phase_seconds[k] - before.phase_seconds[k];
    state.counters[std::string(PlannerPhaseName(static_cast<PlannerPhase>(k))) + "_ms"] =
        iterations > 0 ? seconds * 1e3 / iterations : 0;
  }
}

BENCHMARK(BM_PlanBatch)
    ->ArgNames({"threads", "trainers"})
    ->Args({1, 1})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Args({1, 4})
    ->Args({0, 4})
    ->Args({0, 8})
    ->Iterations(kMeasuredBatches)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace bagpipe

BENCHMARK_MAIN();
