// The machine's random-access roofline for the planner: how many independent random cache-line
// reads per second the memory system serves, on 1 thread and on all cores.
//
// The planner's hot loops (entering a batch, classifying and applying an iteration) touch one
// row record per distinct row at random in arrays far larger than the last-level cache, with
// the records prefetched a few rows ahead; once the prefetches overlap as far as the core
// allows, a batch costs about (random lines touched) / (lines per second measured here). This
// program measures that rate the same way: a 1 GiB array on transparent huge pages (as the
// planner's, oracle/huge_pages.h), seeded random line indices, each line prefetched 32 reads
// ahead of its use.
//
// BM_RandomLines/threads:P: P threads (0 = all cores) each read kReadsPerThread random lines.
// Counter: lines_per_s (all threads together).
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"

namespace bagpipe {
namespace {

constexpr size_t kArrayBytes = size_t{1} << 30;
constexpr size_t kLineBytes = 64;
constexpr size_t kLines = kArrayBytes / kLineBytes;
constexpr int64_t kReadsPerThread = 20'000'000;
constexpr int kAhead = 32;

struct alignas(kLineBytes) Line {
  uint64_t words[kLineBytes / sizeof(uint64_t)];
};

Line* Array() {
  static Line* lines = [] {
    void* p = std::aligned_alloc(size_t{2} << 20, kArrayBytes);
    if (p == nullptr) return static_cast<Line*>(nullptr);
    madvise(p, kArrayBytes, MADV_HUGEPAGE);
    Line* l = static_cast<Line*>(p);
    for (size_t k = 0; k < kLines; ++k) l[k].words[0] = k;
    return l;
  }();
  return lines;
}

// Reads `reads` random lines (seeded by `seed`), each prefetched kAhead reads before its use.
uint64_t ReadRandomLines(const Line* lines, uint64_t seed, int64_t reads) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(state >> 34) & (kLines - 1);
  };
  size_t ring[kAhead];
  for (size_t& r : ring) {
    r = next();
    __builtin_prefetch(lines + r);
  }
  uint64_t sum = 0;
  for (int64_t k = 0; k < reads; ++k) {
    const size_t ahead = next();
    __builtin_prefetch(lines + ahead);
    size_t& slot = ring[k % kAhead];
    sum += lines[slot].words[0];
    slot = ahead;
  }
  return sum;
}

void BM_RandomLines(benchmark::State& state) {
  const Line* lines = Array();
  if (lines == nullptr) {
    state.SkipWithError("could not allocate 1 GiB");
    return;
  }
  const int threads = state.range(0) > 0 ? static_cast<int>(state.range(0))
                                         : static_cast<int>(std::thread::hardware_concurrency());
  uint64_t sink = 0;
  for (auto _ : state) {
    std::vector<uint64_t> sums(static_cast<size_t>(threads), 0);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] { sums[t] = ReadRandomLines(lines, t + 1, kReadsPerThread); });
    }
    for (std::thread& w : workers) w.join();
    for (uint64_t s : sums) sink += s;
  }
  benchmark::DoNotOptimize(sink);
  const double lines_read = static_cast<double>(state.iterations()) * threads * kReadsPerThread;
  state.counters["threads"] = threads;
  state.counters["lines_per_s"] = benchmark::Counter(lines_read, benchmark::Counter::kIsRate);
}

BENCHMARK(BM_RandomLines)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(0)
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace bagpipe

BENCHMARK_MAIN();
