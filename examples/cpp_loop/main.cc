// A training loop of your own on the Bagpipe runtime, built against the installed package.
//
// The model is a logistic regression over the pooled embeddings of every table:
//   logit = b + sum over tables t and columns c of w[t * dim + c] * pooled[t][c].
// The embedding rows live on an embedding server; Bagpipe plans, prefetches and caches them and
// updates them (Adagrad) from the pooled gradients this loop hands back. The dense weights w, b
// are replicated on every trainer and trained data-parallel (SGD on all-reduced gradients).
// The loop uses only the trainer hooks (trainer_hooks/trainer.h); RunEmbeddedJob starts the
// oracle, the server and the trainers as threads of this process.
//
// Usage: cpp_loop [MOVIELENS_CSV] [--cache oracle|lru|lfu|off|device]
//   MOVIELENS_CSV  ratings with a header (userId, movieId, genres, rating, ...), e.g. the
//                  repository's tests/fixtures/movielens_small.csv: label = rating > 3.5, one
//                  table each for users, movies and genres. Without it: synthetic data.
// Prints the global mean training loss of every epoch, then each trainer's cache hit rate and
// the bytes it fetched from the server.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/version.h"
#include "data/source.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/trainer.h"

namespace example {

using bagpipe::DeviceArray;
using bagpipe::LocalBatch;
using bagpipe::Trainer;
using bagpipe::TrainerOutcome;

constexpr int kDim = 8;
constexpr int kTrainers = 2;
constexpr int kServers = 1;
constexpr int64_t kBatchSize = 1024;
constexpr int kEpochs = 3;
constexpr int64_t kCacheRows = 3000;  // per trainer; MovieLens has ~10.7k rows in all
constexpr int kLookahead = 20;
constexpr float kSparseLr = 0.05f;  // Adagrad, embedding rows
constexpr float kDenseLr = 0.5f;    // SGD, w and b

// One trainer's loop. Every trainer runs it on its own thread with its own Trainer.
absl::Status LogisticRegressionLoop(Trainer& trainer, int tables, int64_t batches_per_epoch,
                                    TrainerOutcome* outcome) {
  const size_t width = static_cast<size_t>(tables) * kDim;
  std::vector<float> params(width + 1, 0.1f);  // w, then b (identical on every trainer)
  params[width] = 0.0f;
  std::vector<float> grads(params.size());
  std::vector<float> pooled, pooled_grad;
  // Per epoch: sum of this trainer's sample losses, then its sample count (all-reduced below).
  std::vector<float> epoch_totals(2 * kEpochs, 0.0f);

  const std::shared_ptr<bagpipe::DeviceContext>& context = trainer.context();
  // The pooled gradient goes back in the trainer's memory (host memory on the CPU backend). It
  // must stay valid until the next BeginIteration: one buffer, allocated once, grown as needed.
  DeviceArray<float> device_grad;
  LocalBatch batch;
  while (true) {
    ASSIGN_OR_RETURN(bool more, trainer.BeginIteration(&batch));  // plan + rows ready
    if (!more) break;
    ASSIGN_OR_RETURN(const float* device_pooled, trainer.LookupPooled());
    const size_t n = static_cast<size_t>(batch.num_samples);
    pooled.resize(n * width);
    RETURN_IF_ERROR(
        context->CopyToHost(pooled.data(), device_pooled, pooled.size() * sizeof(float)));
    RETURN_IF_ERROR(context->Synchronize());

    // Forward and backward of loss = (sum of this trainer's sample losses) / global batch size:
    // summed over trainers, that is the gradient of the global mean loss (the hooks' contract).
    const float scale = 1.0f / static_cast<float>(batch.global_batch_size);
    pooled_grad.assign(pooled.size(), 0.0f);
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    for (size_t s = 0; s < n; ++s) {
      const float* x = &pooled[s * width];
      double logit = params[width];
      for (size_t k = 0; k < width; ++k) logit += static_cast<double>(params[k]) * x[k];
      const double y = batch.labels_host[s];
      loss += std::max(logit, 0.0) - logit * y + std::log1p(std::exp(-std::abs(logit)));
      const float d = static_cast<float>(1.0 / (1.0 + std::exp(-logit)) - y) * scale;
      for (size_t k = 0; k < width; ++k) {
        pooled_grad[s * width + k] = d * params[k];
        grads[k] += d * x[k];
      }
      grads[width] += d;
    }
    const int epoch =
        static_cast<int>(std::min<int64_t>(batch.iteration / batches_per_epoch, kEpochs - 1));
    epoch_totals[2 * epoch] += static_cast<float>(loss);
    epoch_totals[2 * epoch + 1] += static_cast<float>(n);

    // Dense data parallelism: sum the gradients over trainers, then the same step everywhere.
    RETURN_IF_ERROR(trainer.AllReduce(grads.data(), grads.size()));
    for (size_t k = 0; k < params.size(); ++k) params[k] -= kDenseLr * grads[k];

    // Sparse: hand d(loss)/d(pooled) back; Bagpipe reduces it per row, exchanges the gradients
    // of rows other trainers also hold, and applies Adagrad to the rows.
    if (device_grad.size() < pooled_grad.size()) {
      ASSIGN_OR_RETURN(device_grad, DeviceArray<float>::Create(context, pooled_grad.size()));
    }
    RETURN_IF_ERROR(context->CopyToDevice(device_grad.data(), pooled_grad.data(),
                                          pooled_grad.size() * sizeof(float)));
    RETURN_IF_ERROR(trainer.EndIteration(device_grad.data()));
  }
  RETURN_IF_ERROR(trainer.Flush());  // every cached row back to the server

  RETURN_IF_ERROR(trainer.AllReduce(epoch_totals.data(), epoch_totals.size()));
  std::vector<double> epoch_loss;
  for (int e = 0; e < kEpochs; ++e) {
    epoch_loss.push_back(epoch_totals[2 * e + 1] > 0 ? epoch_totals[2 * e] / epoch_totals[2 * e + 1]
                                                     : 0.0);
  }
  outcome->dense_parameters = params;
  outcome->info["epoch_loss"] = epoch_loss;
  return absl::OkStatus();
}

absl::Status Run(const std::string& csv_path, const std::string& cache) {
  // The data: MovieLens ratings, or a synthetic Criteo-like stream.
  bagpipe::SourceOptions source_options;
  std::string spec = "synthetic:samples=60000,tables=4,rows=2000/500/5000/100,seed=1";
  if (!csv_path.empty()) {
    spec = "csv:" + csv_path;
    source_options.schema = "label=rating>3.5; sparse=userId,movieId,split(genres,|)";
  }
  ASSIGN_OR_RETURN(std::unique_ptr<bagpipe::SampleSource> source,
                   bagpipe::OpenSource(spec, source_options));
  // Dictionary-encoded CSV learns its table sizes by reading: scan once, then count samples.
  ASSIGN_OR_RETURN(const bagpipe::Schema schema, bagpipe::ScanSchema(*source));
  ASSIGN_OR_RETURN(const int64_t samples, bagpipe::CountSamples(*source));
  const int64_t batches_per_epoch = (samples + kBatchSize - 1) / kBatchSize;
  auto stream = std::make_unique<bagpipe::BatchStream>(
      std::move(source), bagpipe::BatchStream::Options{kBatchSize, kEpochs, false});

  // The runtime: 1 server, 2 trainers, each with a kCacheRows-row cache planned by the oracle.
  ASSIGN_OR_RETURN(const bagpipe::CachePolicy policy, bagpipe::ParseCachePolicy(cache));
  const bagpipe::OptimizerKind optimizer = bagpipe::OptimizerKind::kAdagrad;
  bagpipe::JobOptions options;
  options.layout = {kServers, kTrainers};
  options.collect_parameters = false;
  options.trainer.dim = kDim;
  options.trainer.sparse_optimizer = {optimizer, kSparseLr, 1e-8f, 0.0f};
  options.trainer.policy = policy;
  options.trainer.cache_rows = kCacheRows;
  options.trainer.deterministic = true;
  options.trainer.initializer =
      bagpipe::RowInitializer(/*seed=*/1, kDim, bagpipe::StateFloatsPerRow(optimizer, kDim),
                              /*initial_accumulator=*/0.0f, schema.table_rows);
  options.oracle.planner.schema = schema;
  options.oracle.planner.num_trainers = kTrainers;
  options.oracle.planner.capacity = kCacheRows;
  options.oracle.planner.policy = policy;
  options.oracle.planner.lookahead = policy == bagpipe::CachePolicy::kOracle ? kLookahead : 1;

  std::printf(
      "cpp_loop (Bagpipe %s): %s, %lld samples, %d tables (%lld rows), %d trainers, "
      "cache %s (%lld rows each)\n",
      BAGPIPE_VERSION, spec.c_str(), static_cast<long long>(samples), schema.num_tables(),
      static_cast<long long>(schema.TotalRows()), kTrainers, cache.c_str(),
      static_cast<long long>(kCacheRows));
  const int tables = schema.num_tables();
  bagpipe::JobResult result;
  RETURN_IF_ERROR(bagpipe::RunEmbeddedJob(
      options, std::move(stream), /*eval=*/nullptr,
      [&](Trainer& trainer, TrainerOutcome* outcome) {
        return LogisticRegressionLoop(trainer, tables, batches_per_epoch, outcome);
      },
      bagpipe::ParamSink{}, &result));

  const std::vector<double> epoch_loss = result.trainers.at(0).info["epoch_loss"];
  for (size_t e = 0; e < epoch_loss.size(); ++e) {
    std::printf("epoch %zu: mean training loss %.5f\n", e + 1, epoch_loss[e]);
  }
  for (size_t t = 0; t < result.trainers.size(); ++t) {
    const bagpipe::TrainerStats& stats = result.trainers[t].stats;
    std::printf("trainer %zu: %lld iterations, hit rate %.1f%%, fetched %.2f MB\n", t,
                static_cast<long long>(stats.iterations), 100 * stats.hit_rate(),
                stats.fetched_bytes / 1e6);
  }
  return absl::OkStatus();
}

}  // namespace example

int main(int argc, char** argv) {
  std::string csv_path;
  std::string cache = "oracle";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cache" && i + 1 < argc) {
      cache = argv[++i];
    } else if (arg == "--help" || arg == "-h" || arg.starts_with("--") || !csv_path.empty()) {
      std::fprintf(arg == "--help" || arg == "-h" ? stdout : stderr,
                   "usage: %s [MOVIELENS_CSV] [--cache oracle|lru|lfu|off|device]\n", argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 2;
    } else {
      csv_path = arg;
    }
  }
  const absl::Status status = example::Run(csv_path, cache);
  if (!status.ok()) {
    std::fprintf(stderr, "cpp_loop: error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
