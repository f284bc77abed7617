// Throughput of the dataset readers: Criteo TSV parsing (dictionary and mod hashing), the binary
// format, and CSV on the MovieLens fixture.
//
// The Criteo input is generated once per run: a seeded Criteo-like TSV of kLines lines whose
// values come from the synthetic source (Zipf-skewed ids written as 8 hex digits, dense counts
// from its log-normal features, ~5% missing values), in the system temp directory.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "core/random.h"
#include "data/binary_format.h"
#include "data/criteo_reader.h"
#include "data/csv_reader.h"
#include "data/synthetic.h"

namespace bagpipe {
namespace {

constexpr int64_t kLines = 200000;
constexpr int64_t kReadChunk = 1 << 16;

std::string TempFile(const std::string& name) {
  return (std::filesystem::temp_directory_path() / absl::StrCat("bagpipe_reader_bench_", name))
      .string();
}

// Writes the Criteo-like TSV once and returns its path.
const std::string& CriteoFile() {
  static const std::string path = [] {
    const std::string out = TempFile("criteo.tsv");
    auto source = OpenSynthetic(absl::StrCat("samples=", kLines, ",scale=0.01,seed=3"), {});
    if (!source.ok()) std::abort();
    std::FILE* file = std::fopen(out.c_str(), "wb");
    Batch batch;
    std::string line;
    while (true) {
      auto read = (*source)->Read(kReadChunk, &batch);
      if (!read.ok() || *read == 0) break;
      for (int32_t s = 0; s < batch.num_samples; ++s) {
        const int64_t position = batch.first_sample + s;
        line.clear();
        absl::StrAppend(&line, batch.labels[s] > 0.5f ? "1" : "0");
        for (int c = 0; c < batch.num_dense; ++c) {
          line.push_back('\t');
          if (HashKey(position, 1, c) % 20 == 0) continue;  // missing
          absl::StrAppend(&line, std::llround(std::expm1(batch.dense[s * batch.num_dense + c])));
        }
        for (int t = 0; t < batch.num_tables; ++t) {
          line.push_back('\t');
          if (HashKey(position, 2, t) % 20 == 0) continue;  // missing
          const int64_t id = batch.ids[batch.bag_begin(t, s)];
          absl::StrAppend(&line, absl::StrFormat("%08x", static_cast<uint32_t>(Mix64(id + t))));
        }
        line.push_back('\n');
        std::fwrite(line.data(), 1, line.size(), file);
      }
    }
    std::fclose(file);
    return out;
  }();
  return path;
}

const std::string& BinaryFile() {
  static const std::string path = [] {
    const std::string out = TempFile("criteo.bin");
    auto source = OpenCriteo(CriteoFile(), {});
    if (!source.ok() || !WriteBinary(**source, out).ok()) std::abort();
    return out;
  }();
  return path;
}

// Reads every sample of `open()`'s source once per iteration.
template <typename Open>
void ReadAll(benchmark::State& state, const std::string& path, Open open) {
  int64_t samples = 0;
  Batch batch;
  for (auto _ : state) {
    auto source = open();
    if (!source.ok()) {
      state.SkipWithError(std::string(source.status().message()).c_str());
      return;
    }
    while (true) {
      auto read = (*source)->Read(kReadChunk, &batch);
      if (!read.ok()) {
        state.SkipWithError(std::string(read.status().message()).c_str());
        return;
      }
      if (*read == 0) break;
      samples += *read;
    }
    benchmark::DoNotOptimize(batch.ids.data());
  }
  const int64_t bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  state.SetBytesProcessed(bytes * state.iterations());
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(samples), benchmark::Counter::kIsRate);
  state.counters["file_MB"] = static_cast<double>(bytes) / 1e6;
}

void BM_CriteoDictionary(benchmark::State& state) {
  const std::string& path = CriteoFile();
  ReadAll(state, path, [&] { return OpenCriteo(path, {}); });
}
BENCHMARK(BM_CriteoDictionary)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CriteoModHashing(benchmark::State& state) {
  const std::string& path = CriteoFile();
  SourceOptions options;
  options.row_budget = 1000000;
  ReadAll(state, path, [&] { return OpenCriteo(path, options); });
}
BENCHMARK(BM_CriteoModHashing)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_BinaryRead(benchmark::State& state) {
  const std::string& path = BinaryFile();
  ReadAll(state, path, [&] { return OpenBinary(path, {}); });
}
BENCHMARK(BM_BinaryRead)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CsvMovieLens(benchmark::State& state) {
  const std::string path = std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  SourceOptions options;
  options.schema = "label=rating>3.5; dense=year; sparse=userId,movieId,split(genres,|)";
  ReadAll(state, path, [&] { return OpenCsv(path, options); });
}
BENCHMARK(BM_CsvMovieLens)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace bagpipe

BENCHMARK_MAIN();
