// Replays a synthetic Criteo-Kaggle-like stream through the planner and prints, as one JSON
// line, a digest of every plan it produced and the steady-state time per batch and per phase.
//
// What it is for: checking that a change to the planner leaves its plans byte-identical (the
// digest covers every field of every plan, the Drain plans included) and timing it without the
// batch generator in the way. The batches are generated (or read from --cache) before the first
// Push; each is copied into the batch the planner handed back just before it is pushed, as a
// loader would (warm in the caches); popped plans are hashed and recycled outside the timing.
//
//   build/bench/oracle/oracle_planner_replay --trainers 1 --threads 2 --warmup 420 --measure 150
//
// With --model-workers P it also prints the planner's model of its time on P workers and with
// unlimited workers (PlannerStats::modeled_seconds, span_seconds), from its tasks' measured
// durations; run with --threads 1 so that the tasks are timed without contention:
//
//   build/bench/oracle/oracle_planner_replay --threads 1 --model-workers 16
//
// Timing runs on this project's 2-core VMs drift by up to 1.5x within minutes: compare builds
// by alternating their runs, and prefer the digest and callgrind for exact answers. Under
// `valgrind --tool=callgrind --instr-atstart=no` (with or without --cache-sim=yes) only the
// measured batches are instrumented:
//
//   valgrind --tool=callgrind --instr-atstart=no --cache-sim=yes \
//     build/bench/oracle/oracle_planner_replay --trainers 4 --warmup 420 --measure 10
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/json_fields.h"
#include "data/synthetic.h"
#include "nlohmann/json.hpp"
#include "oracle/plan_digest.h"
#include "oracle/planner.h"
#include "tbb/global_control.h"
#include "tbb/info.h"
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

namespace bagpipe {
namespace {

template <typename T>
void WriteVector(std::ostream& out, const std::vector<T>& v) {
  const uint64_t n = v.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
}

template <typename T>
bool ReadVector(std::istream& in, std::vector<T>* v) {
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), sizeof(n))) return false;
  v->resize(n);
  return static_cast<bool>(
      in.read(reinterpret_cast<char*>(v->data()), static_cast<std::streamsize>(n * sizeof(T))));
}

// The stream of batches: generated into memory, or (with a cache file) written once to the file
// and read back one batch at a time, so that long streams (8 trainers need about 1000 batches to
// fill their caches) need no memory beyond one batch. The file starts with a description of the
// stream and is rewritten when that differs.
class Stream {
 public:
  Stream(const SyntheticConfig& config, int64_t batch_size, int batches, std::string cache)
      : batch_size_(batch_size), batches_(batches), cache_(std::move(cache)) {
    tag_ = "bagpipe-replay-v1 " + std::to_string(batch_size) + " " + std::to_string(batches) + " " +
           std::to_string(config.table_rows[2]) + " " + std::to_string(config.seed);
  }

  // Generates the stream from `source` unless the cache file already holds it.
  bool Open(SampleSource& source, std::string* error) {
    if (!cache_.empty()) {
      in_.open(cache_, std::ios::binary);
      std::string header;
      if (in_ && std::getline(in_, header) && header == tag_) return true;
      in_.close();
      std::ofstream out(cache_, std::ios::binary | std::ios::trunc);
      out << tag_ << '\n';
      Batch b;
      for (int k = 0; k < batches_; ++k) {
        if (!Generate(source, &b, error)) return false;
        out.write(reinterpret_cast<const char*>(&b.first_sample), sizeof(b.first_sample));
        out.write(reinterpret_cast<const char*>(&b.num_samples), sizeof(b.num_samples));
        out.write(reinterpret_cast<const char*>(&b.num_dense), sizeof(b.num_dense));
        out.write(reinterpret_cast<const char*>(&b.num_tables), sizeof(b.num_tables));
        WriteVector(out, b.labels);
        WriteVector(out, b.dense);
        WriteVector(out, b.offsets);
        WriteVector(out, b.ids);
      }
      if (!out.flush()) {
        *error = "cannot write " + cache_;
        return false;
      }
      out.close();
      in_.open(cache_, std::ios::binary);
      std::string header2;
      if (!in_ || !std::getline(in_, header2) || header2 != tag_) {
        *error = "cannot read back " + cache_;
        return false;
      }
      return true;
    }
    memory_.assign(static_cast<size_t>(batches_), Batch{});
    for (Batch& b : memory_) {
      if (!Generate(source, &b, error)) return false;
    }
    return true;
  }

  // Copies batch `k` (k = 0, 1, ... in order) into `batch`, keeping its buffers.
  bool Next(int k, Batch* batch, std::string* error) {
    if (cache_.empty()) {
      const Batch& next = memory_[static_cast<size_t>(k)];
      batch->Reset(next.num_dense, next.num_tables);
      batch->first_sample = next.first_sample;
      batch->num_samples = next.num_samples;
      batch->labels.assign(next.labels.begin(), next.labels.end());
      batch->dense.assign(next.dense.begin(), next.dense.end());
      batch->offsets.assign(next.offsets.begin(), next.offsets.end());
      batch->ids.assign(next.ids.begin(), next.ids.end());
      return true;
    }
    Batch& b = *batch;
    const bool ok = in_.read(reinterpret_cast<char*>(&b.first_sample), sizeof(b.first_sample)) &&
                    in_.read(reinterpret_cast<char*>(&b.num_samples), sizeof(b.num_samples)) &&
                    in_.read(reinterpret_cast<char*>(&b.num_dense), sizeof(b.num_dense)) &&
                    in_.read(reinterpret_cast<char*>(&b.num_tables), sizeof(b.num_tables)) &&
                    ReadVector(in_, &b.labels) && ReadVector(in_, &b.dense) &&
                    ReadVector(in_, &b.offsets) && ReadVector(in_, &b.ids);
    if (!ok) *error = "cannot read batch " + std::to_string(k) + " from " + cache_;
    return ok;
  }

 private:
  bool Generate(SampleSource& source, Batch* b, std::string* error) {
    auto read = source.Read(batch_size_, b);
    if (!read.ok() || *read != batch_size_) {
      *error = "the synthetic stream ended early";
      return false;
    }
    return true;
  }

  int64_t batch_size_;
  int batches_;
  std::string cache_;
  std::string tag_;
  std::vector<Batch> memory_;
  std::ifstream in_;
};

double CpuMs(int who) {
  rusage usage{};
  getrusage(who, &usage);
  return (static_cast<double>(usage.ru_utime.tv_sec) + static_cast<double>(usage.ru_stime.tv_sec)) *
             1e3 +
         (static_cast<double>(usage.ru_utime.tv_usec) +
          static_cast<double>(usage.ru_stime.tv_usec)) /
             1e3;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "Replays a synthetic Criteo-Kaggle-like stream through the planner; prints one JSON line "
      "with the digest of every plan and the steady-state time per batch and per phase.");
  int trainers = 1;
  int threads = 0;
  int warmup = 420;
  int measure = 150;
  int lookahead = 200;
  int64_t batch_size = 16384;
  double capacity_fraction = 0.05;
  double scale = 1.0;
  std::string policy_name = "oracle";
  std::string cache;
  int pause = 0;
  int64_t dense_max_rows = PlannerOptions{}.dense_index_max_rows;
  int64_t capture_min_rows = PlannerOptions{}.capture_min_rows;
  int model_workers = 0;
  int split_parts = PlannerOptions{}.split_parts;
  int64_t split_min_rows = PlannerOptions{}.split_min_rows;
  app.add_option("--trainers", trainers, "trainers (1..64)")->capture_default_str();
  app.add_option("--threads", threads, "TBB threads (0: all cores)")->capture_default_str();
  app.add_option("--warmup", warmup, "batches pushed before the measured ones")
      ->capture_default_str();
  app.add_option("--measure", measure, "batches measured")->capture_default_str();
  app.add_option("--lookahead,-L", lookahead, "L")->capture_default_str();
  app.add_option("--batch-size,-b", batch_size, "samples per global batch")->capture_default_str();
  app.add_option("--capacity-fraction", capacity_fraction, "cache rows per trainer / all rows")
      ->capture_default_str();
  app.add_option("--scale", scale, "multiplies the Kaggle table sizes (at least 2 rows)")
      ->capture_default_str();
  app.add_option("--policy", policy_name, "oracle, lru, lfu, off or device")->capture_default_str();
  app.add_option("--dense-index-max-rows", dense_max_rows,
                 "tables up to this many rows index their rows directly (PlannerOptions)")
      ->capture_default_str();
  app.add_option("--capture-min-rows", capture_min_rows,
                 "tables above this many rows record slots at entry (PlannerOptions)")
      ->capture_default_str();
  app.add_option("--split-parts", split_parts,
                 "parts of each table above --split-min-rows rows (PlannerOptions; 1 = none)")
      ->capture_default_str();
  app.add_option("--split-min-rows", split_min_rows, "PlannerOptions::split_min_rows")
      ->capture_default_str();
  app.add_option("--model-workers", model_workers,
                 "P > 0: also print the planner's modeled time per batch on P workers and its "
                 "span (PlannerOptions::model_workers)")
      ->capture_default_str();
  app.add_option("--cache", cache,
                 "file keeping the generated stream between runs (read back one batch at a "
                 "time: long streams need no memory)");
  app.add_option("--pause", pause,
                 "seconds to sleep before the measured batches (to attach a profiler to the "
                 "printed pid)");
  CLI11_PARSE(app, argc, argv);

  auto policy = ParseCachePolicy(policy_name);
  if (!policy.ok()) {
    std::cerr << "planner_replay: " << policy.status().message() << "\n";
    return 2;
  }
  if (warmup < 0 || measure < 1 || batch_size < 1 || scale <= 0) {
    std::cerr << "planner_replay: --warmup >= 0, --measure >= 1, --batch-size >= 1 and "
                 "--scale > 0 are required\n";
    return 2;
  }
  tbb::global_control control(tbb::global_control::max_allowed_parallelism,
                              threads > 0 ? threads : tbb::info::default_concurrency());
  SyntheticConfig config;  // Kaggle tables, Zipf 1.05, one-hot
  for (int64_t& rows : config.table_rows) {
    rows = std::max<int64_t>(2, static_cast<int64_t>(static_cast<double>(rows) * scale));
  }
  const int batches = warmup + measure;
  config.samples = batch_size * batches;
  auto source = OpenSynthetic(config, SourceOptions{});
  if (!source.ok()) {
    std::cerr << "planner_replay: " << source.status().message() << "\n";
    return 1;
  }
  Stream stream(config, batch_size, batches, cache);
  std::string error;
  if (!stream.Open(**source, &error)) {
    std::cerr << "planner_replay: " << error << "\n";
    return 1;
  }

  PlannerOptions options;
  options.schema = (*source)->schema();
  options.num_trainers = trainers;
  options.capacity =
      static_cast<int64_t>(static_cast<double>(options.schema.TotalRows()) * capacity_fraction);
  options.lookahead = lookahead;
  options.policy = *policy;
  options.dense_index_max_rows = dense_max_rows;
  options.capture_min_rows = capture_min_rows;
  options.model_workers = model_workers;
  options.split_parts = split_parts;
  options.split_min_rows = split_min_rows;
  auto planner = Planner::Create(options);
  if (!planner.ok()) {
    std::cerr << "planner_replay: " << planner.status().message() << "\n";
    return 1;
  }

  PlanDigest digest;
  std::vector<std::vector<TrainerPlan>> popped;
  auto pop_all = [&]() -> bool {
    while (true) {
      auto plans = (*planner)->Pop();
      if (!plans.ok()) {
        std::cerr << "planner_replay: " << plans.status().message() << "\n";
        return false;
      }
      if (!plans->has_value()) return true;
      popped.push_back(std::move(**plans));
    }
  };
  auto consume = [&]() {
    for (std::vector<TrainerPlan>& plans : popped) {
      for (const TrainerPlan& plan : plans) digest.Add(plan);
      (*planner)->Recycle(std::move(plans));
    }
    popped.clear();
  };

  Batch batch;  // the loader's batch: refilled from the stream, handed back by Push
  PlannerStats before;
  std::vector<double> times;
  double cpu_ms = 0;
  for (int b = 0; b < batches; ++b) {
    if (b == warmup) {
      if (pause > 0) {
        std::cerr << "planner_replay: pid " << getpid() << ", measuring in " << pause << " s\n";
        std::this_thread::sleep_for(std::chrono::seconds(pause));
      }
      before = (*planner)->stats();
      CALLGRIND_START_INSTRUMENTATION;
    }
    if (!stream.Next(b, &batch, &error)) {
      std::cerr << "planner_replay: " << error << "\n";
      return 1;
    }
    const double cpu_before = CpuMs(RUSAGE_SELF);
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = (*planner)->Push(std::move(batch), &batch);
    if (!status.ok()) {
      std::cerr << "planner_replay: " << status.message() << "\n";
      return 1;
    }
    if (!pop_all()) return 1;
    const auto end = std::chrono::steady_clock::now();
    if (b >= warmup) {
      times.push_back(std::chrono::duration<double, std::milli>(end - start).count());
      cpu_ms += CpuMs(RUSAGE_SELF) - cpu_before;
    }
    consume();
  }
  CALLGRIND_STOP_INSTRUMENTATION;
  const PlannerStats after = (*planner)->stats();
  if (absl::Status status = (*planner)->Finish(); !status.ok()) {
    std::cerr << "planner_replay: " << status.message() << "\n";
    return 1;
  }
  if (!pop_all()) return 1;
  consume();
  auto drain = (*planner)->Drain();
  if (!drain.ok()) {
    std::cerr << "planner_replay: " << drain.status().message() << "\n";
    return 1;
  }
  for (const TrainerPlan& plan : *drain) digest.Add(plan);

  const double iterations =
      static_cast<double>(after[PlannerCounter::kIterations] - before[PlannerCounter::kIterations]);
  double sum = 0;
  for (double t : times) sum += t;
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(digest.value()));
  nlohmann::json out = {
      {"digest", hex},
      {"batches_measured", times.size()},
      {"ms_per_batch_mean", sum / static_cast<double>(times.size())},
      {"ms_per_batch_median", sorted[sorted.size() / 2]},
      {"cpu_ms_per_batch", cpu_ms / static_cast<double>(times.size())},
      {"hits", after[PlannerCounter::kHits]},
      {"misses", after[PlannerCounter::kMisses]},
      {"evictions", after[PlannerCounter::kEvictions]},
  };
  nlohmann::json phases = nlohmann::json::object();
  for (int k = 0; k < kNumPlannerPhases; ++k) {
    phases[std::string(PlannerPhaseName(static_cast<PlannerPhase>(k)))] =
        iterations > 0 ? (after.phase_seconds[k] - before.phase_seconds[k]) * 1e3 / iterations
                       : 0.0;
  }
  out["phase_ms"] = std::move(phases);
  // Per measured iteration: the work the plans describe (sums over trainers).
  nlohmann::json per_batch = nlohmann::json::object();
  for (const PlannerCounter counter :
       {PlannerCounter::kUniqueRows, PlannerCounter::kMisses, PlannerCounter::kEvictions,
        PlannerCounter::kWriteBacks, PlannerCounter::kFlushes, PlannerCounter::kSharedRows,
        PlannerCounter::kExchangedRows, PlannerCounter::kPrivateRows}) {
    per_batch[std::string(PlannerCounterName(counter))] =
        iterations > 0 ? static_cast<double>(after[counter] - before[counter]) / iterations : 0.0;
  }
  out["per_batch"] = std::move(per_batch);
  if (model_workers > 0 && iterations > 0) {
    out["model_workers"] = model_workers;
    out["modeled_ms_per_batch"] =
        (after.modeled_seconds - before.modeled_seconds) * 1e3 / iterations;
    out["span_ms_per_batch"] = (after.span_seconds - before.span_seconds) * 1e3 / iterations;
    out["pass_ms_per_batch"] = (after.pass_seconds - before.pass_seconds) * 1e3 / iterations;
  }
  std::cout << DumpJson(out) << "\n";
  return 0;
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) { return bagpipe::Main(argc, argv); }
