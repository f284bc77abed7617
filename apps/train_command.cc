// bagpipe train: the main job. The reference DLRM (model/) trained through the Bagpipe runtime
// with a chosen cache mode, embedded (every role a thread of this process) or as one rank of an
// mpirun job. Writes interval metrics (JSON lines), a summary with the parameter fingerprint,
// and optionally every parameter.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/command.h"
#include "core/logging.h"
#include "core/metrics.h"
#include "core/signals.h"
#include "core/status.h"
#include "model/dlrm_loop.h"
#include "model/eval_metrics.h"
#include "sync/mpi_transport.h"
#include "trainer_hooks/checkpoint.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {
namespace {

struct TrainFlags {
  DataFlags data;
  int64_t batch_size = 1024;
  int64_t iterations = 0;
  int epochs = 1;
  std::string cache = "oracle";
  int64_t cache_rows = 0;
  int lookahead = 20;
  int oracle_split_parts = 1;
  int64_t oracle_split_min_rows = PlannerOptions{}.split_min_rows;
  std::string optimizer = "adagrad";
  std::string dense_optimizer;
  float lr = 0.05f;
  float dense_lr = -1;
  uint64_t seed = 1;
  bool deterministic = false;
  int dim = 16;
  std::string bottom;
  std::string top = "64-32-1";
  std::string model = "dlrm";
  int trainers = 1;
  int servers = 1;
  std::string device = "cpu";
  std::string server_link = "none";
  double eval_fraction = 0.0;
  std::string metrics_out;
  int metrics_interval = 50;
  std::string summary_json;
  std::string dump_params;
  std::string out;
  int prefetch_depth = 4;
  int plan_queue_depth = 8;
  int writeback_horizon = 0;
  double peer_timeout_s = 120;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep_checkpoints = 2;
  std::string resume;
};

constexpr char kTrainFooter[] =
    "Cache modes: oracle (Bagpipe: lookahead planning, prefetch, Belady eviction), lru and lfu\n"
    "(reactive caches planned the same way, as TorchRec/FBGEMM), off (every row fetched from\n"
    "the servers every iteration and written back after it), device (whole tables in trainer\n"
    "memory, no servers on the critical path: the upper bound). All modes compute the same\n"
    "synchronous training: with --deterministic their parameters are bit-identical.\n"
    "Launch under mpirun to run distributed: rank 0 = oracle, ranks 1..S = servers, the rest\n"
    "trainers (--trainers is then implied by the world size).\n";

// Default cache size: a fifth of the rows, at least four local batches' worth of ids.
int64_t DefaultCacheRows(const Schema& schema, int64_t batch_size, int trainers) {
  const int64_t local = (batch_size + trainers - 1) / trainers;
  return std::max<int64_t>(schema.TotalRows() / 5, 4 * local * schema.num_tables());
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// Checkpoints (trainer_hooks/checkpoint.h): --resume alone goes on writing to the directory it
// resumes from, every as many iterations as the checkpoint's job did. The identity holds the
// options the job does not know itself; the job adds its own.
absl::Status SetCheckpointOptions(const TrainFlags& flags, const DlrmLoopOptions& loop,
                                  OptimizerKind dense_kind, CheckpointOptions* checkpoint) {
  if (flags.checkpoint_every < 0 || flags.keep_checkpoints < 0) {
    return absl::InvalidArgumentError("--checkpoint-every and --keep-checkpoints must be >= 0");
  }
  if (flags.checkpoint_every > 0 && flags.checkpoint_dir.empty() && flags.resume.empty()) {
    return absl::InvalidArgumentError("--checkpoint-every needs --checkpoint-dir");
  }
  checkpoint->dir = flags.checkpoint_dir;
  checkpoint->every = flags.checkpoint_every;
  checkpoint->keep = flags.keep_checkpoints;
  checkpoint->resume = flags.resume;
  if (!flags.resume.empty() && checkpoint->dir.empty()) {
    namespace fs = std::filesystem;
    std::error_code error;
    const bool is_checkpoint = fs::exists(fs::path(flags.resume) / kManifestName, error);
    checkpoint->dir = is_checkpoint ? fs::path(flags.resume).parent_path().string() : flags.resume;
    if (checkpoint->dir.empty()) checkpoint->dir = ".";
    if (checkpoint->every == 0) {
      // Unreadable here: the job reports why when it resumes.
      auto path = ResolveCheckpoint(flags.resume);
      if (path.ok()) {
        auto manifest = ReadManifest(*path);
        if (manifest.ok()) checkpoint->every = manifest->every;
      }
    }
  }
  const OptimizerConfig& dense = loop.model.optimizer;
  checkpoint->identity = {
      {"--batch-size", flags.batch_size},
      {"--model", flags.model},
      {"--eval-fraction", flags.eval_fraction},
      {"dense optimizer",
       {{"kind", std::string(OptimizerName(dense_kind))}, {"lr", dense.learning_rate}}},
  };
  if (loop.head == DenseHeadKind::kDlrm) {
    checkpoint->identity["--bottom"] = FormatLayers(loop.model.bottom);
    checkpoint->identity["--top"] = FormatLayers(loop.model.top);
  }
  return absl::OkStatus();
}

// The one line a stopped job ends with: where it stopped and how to go on.
absl::Status StoppedStatus(const OracleRoleStats& oracle, const CheckpointOptions& checkpoint) {
  const char* signal = oracle.stop_signal == SIGINT    ? "SIGINT"
                       : oracle.stop_signal == SIGTERM ? "SIGTERM"
                       : oracle.stop_signal == SIGUSR1 ? "SIGUSR1"
                                                       : "a stop request";
  const CheckpointStats& saved = oracle.checkpoint;
  if (saved.last.empty() && saved.resumed_from.empty()) {
    return absl::CancelledError(absl::StrFormat(
        "stopped by %s at iteration %d; nothing saved (%s)", signal, oracle.stopped_at,
        checkpoint.dir.empty() ? "no --checkpoint-dir" : "no iteration ran"));
  }
  return absl::CancelledError(absl::StrFormat(
      "stopped by %s at iteration %d; resume with --resume %s (checkpoint %s)", signal,
      oracle.stopped_at, checkpoint.dir.empty() ? saved.resumed_from : checkpoint.dir,
      saved.last.empty() ? saved.resumed_from : saved.last));
}

absl::Status RunTrain(TrainFlags flags) {
  // Outputs: --out DIR sets the defaults of the others.
  if (!flags.out.empty()) {
    std::error_code error;
    std::filesystem::create_directories(flags.out, error);
    if (error) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out ", flags.out, ": cannot create the directory: ", error.message()));
    }
    if (flags.metrics_out.empty()) flags.metrics_out = JoinPath(flags.out, "metrics.jsonl");
    if (flags.summary_json.empty()) flags.summary_json = JoinPath(flags.out, "summary.json");
  }
  if (flags.eval_fraction < 0 || flags.eval_fraction >= 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-fraction %g: must be in [0, 1)", flags.eval_fraction));
  }
  ASSIGN_OR_RETURN(const CachePolicy policy, ParseCachePolicy(flags.cache));
  ASSIGN_OR_RETURN(const OptimizerKind sparse_kind, ParseOptimizerKind(flags.optimizer));
  ASSIGN_OR_RETURN(
      OptimizerKind dense_kind,
      ParseOptimizerKind(flags.dense_optimizer.empty() ? flags.optimizer : flags.dense_optimizer));
  if (dense_kind == OptimizerKind::kRowwiseAdagrad) dense_kind = OptimizerKind::kAdagrad;
  ASSIGN_OR_RETURN(const Backend backend, ParseBackend(flags.device));
  ASSIGN_OR_RETURN(const LinkModel link, LinkModel::Parse(flags.server_link));

  // Distributed or embedded.
  std::unique_ptr<MpiSession> mpi;
  std::unique_ptr<MpiTransport> mpi_transport;
  JobLayout layout{flags.servers, flags.trainers};
  if (LaunchedByMpirun()) {
    int argc = 0;
    char** argv = nullptr;
    ASSIGN_OR_RETURN(mpi, MpiSession::Init(&argc, &argv));
    ASSIGN_OR_RETURN(mpi_transport, MpiTransport::Create());
    layout.trainers = mpi->size() - 1 - flags.servers;
    if (layout.trainers < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "mpirun started %d ranks but --servers %d leaves no trainer: a job needs 1 + S + T "
          "ranks (rank 0 the data loader and oracle, ranks 1..S the embedding servers, the "
          "rest trainers)",
          mpi->size(), flags.servers));
    }
    RETURN_IF_ERROR(layout.Validate(mpi->size()));
  }
  // SIGINT/SIGTERM/SIGUSR1 stop the job at an iteration boundary (after MPI's own handlers).
  InstallStopHandlers();
  const bool is_rank0 = mpi == nullptr || mpi->rank() == 0;
  const bool is_trainer0 = mpi == nullptr || mpi->rank() == layout.trainer_rank(0);

  // Data: every rank opens it to learn the schema (dictionary-encoded text is scanned once so
  // the table sizes are exact); only rank 0 streams it.
  ASSIGN_OR_RETURN(std::unique_ptr<SampleSource> source, OpenFromFlags(flags.data));
  const bool dictionary_text =
      absl::StartsWith(flags.data.data, "csv:") ||
      (absl::StartsWith(flags.data.data, "criteo:") && flags.data.options.row_budget == 0);
  Schema schema = source->schema();
  if (dictionary_text) {
    // Dictionary-encoded text: one pass to learn the exact table sizes.
    if (is_rank0) source = WithProgress(std::move(source), flags.data, "scanning for table sizes");
    ASSIGN_OR_RETURN(schema, ScanSchema(*source));
  }
  if (schema.num_tables() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data ", flags.data.data, ": the dataset has no embedding tables"));
  }
  int64_t eval_samples = 0;
  std::unique_ptr<BatchStream> train, eval;
  if (flags.eval_fraction > 0) {
    ASSIGN_OR_RETURN(const int64_t total, CountSamples(*source));
    eval_samples = static_cast<int64_t>(std::llround(flags.eval_fraction * total));
    if (eval_samples <= 0 || eval_samples >= total) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--eval-fraction %g of %d samples leaves no training or no evaluation data",
          flags.eval_fraction, total));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SampleSource> tail, OpenFromFlags(flags.data));
    eval = std::make_unique<BatchStream>(SampleRange(std::move(tail), total - eval_samples, -1),
                                         BatchStream::Options{flags.batch_size, 1, false});
    source = SampleRange(std::move(source), 0, total - eval_samples);
  }
  train = std::make_unique<BatchStream>(
      std::move(source),
      BatchStream::Options{flags.batch_size, flags.iterations > 0 ? 0 : flags.epochs, false});

  // The model.
  DlrmLoopOptions loop;
  loop.model.num_dense = schema.num_dense();
  loop.model.num_tables = schema.num_tables();
  loop.model.dim = flags.dim;
  const std::string bottom =
      flags.bottom.empty() ? absl::StrCat(schema.num_dense(), "-64-", flags.dim) : flags.bottom;
  ASSIGN_OR_RETURN(loop.model.bottom, ParseLayers(bottom));
  ASSIGN_OR_RETURN(loop.model.top, ParseLayers(flags.top));
  loop.model.seed = flags.seed;
  loop.model.deterministic = flags.deterministic;
  loop.model.optimizer = {dense_kind, flags.dense_lr > 0 ? flags.dense_lr : flags.lr, 1e-8f, 0.0f};
  if (flags.model == "logreg") {
    loop.head = DenseHeadKind::kLogReg;
  } else if (flags.model == "dlrm") {
    RETURN_IF_ERROR(ValidateDenseModelConfig(loop.model));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", flags.model, "': expected dlrm or logreg"));
  }
  loop.metrics_interval = flags.metrics_interval;
  loop.total_iterations = flags.iterations;
  loop.progress = !flags.data.quiet;
  std::unique_ptr<JsonLinesWriter> metrics;
  if (!flags.metrics_out.empty() && is_trainer0) {
    ASSIGN_OR_RETURN(metrics, JsonLinesWriter::Open(flags.metrics_out));
    loop.metrics = metrics.get();
  }

  // The runtime.
  JobOptions options;
  options.layout = layout;
  options.backend = backend;
  options.server_link = link;
  options.peer_timeout = absl::Seconds(flags.peer_timeout_s);
  options.trainer.dim = flags.dim;
  options.trainer.sparse_optimizer = {sparse_kind, flags.lr, 1e-8f, 0.0f};
  options.trainer.policy = policy;
  options.trainer.cache_rows = flags.cache_rows > 0
                                   ? flags.cache_rows
                                   : DefaultCacheRows(schema, flags.batch_size, layout.trainers);
  options.trainer.prefetch_depth = flags.prefetch_depth;
  options.trainer.deterministic = flags.deterministic;
  options.trainer.peer_timeout = options.peer_timeout;
  options.trainer.initializer = RowInitializer(
      flags.seed, flags.dim, StateFloatsPerRow(sparse_kind, flags.dim), 0.0f, schema.table_rows);
  options.oracle.planner.schema = schema;
  options.oracle.planner.num_trainers = layout.trainers;
  options.oracle.planner.capacity = options.trainer.cache_rows;
  options.oracle.planner.lookahead = policy == CachePolicy::kOracle ? flags.lookahead : 1;
  options.oracle.planner.policy = policy;
  options.oracle.planner.writeback_horizon = flags.writeback_horizon;
  options.oracle.planner.split_parts = flags.oracle_split_parts;
  options.oracle.planner.split_min_rows = flags.oracle_split_min_rows;
  options.oracle.max_iterations = flags.iterations > 0 ? flags.iterations : -1;
  options.oracle.plan_queue_depth = flags.plan_queue_depth;
  options.oracle.peer_timeout = options.peer_timeout;

  options.stop_requested = [] { return StopSignal(); };
  RETURN_IF_ERROR(SetCheckpointOptions(flags, loop, dense_kind, &options.checkpoint));

  const std::string describe = train->source().Describe();
  if (is_rank0) {
    BAGPIPE_LOG(INFO) << absl::StrFormat(
        "train: %s, %d tables (%d rows), batch %d, cache %s (%d rows), %d trainer(s), %d "
        "server(s), %s%s",
        describe, schema.num_tables(), schema.TotalRows(), flags.batch_size, flags.cache,
        options.trainer.cache_rows, layout.trainers, layout.servers, flags.device,
        mpi ? " (mpirun)" : " (embedded)");
  }

  // Parameters gathered at rank 0: fingerprint, and the dump when asked.
  const int record_floats = RecordFloats(sparse_kind, flags.dim);
  std::string dump_dir = flags.dump_params;
  nlohmann::json header = {{"dim", flags.dim},
                           {"optimizer", std::string(OptimizerName(sparse_kind))},
                           {"schema", schema.ToJson()},
                           {"bottom", FormatLayers(loop.model.bottom)},
                           {"top", FormatLayers(loop.model.top)}};
  std::unique_ptr<ParamWriter> writer;
  if (is_rank0) {
    if (!dump_dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(dump_dir, error);
      if (error) {
        return absl::InvalidArgumentError(
            absl::StrCat("--dump-params ", dump_dir, ": cannot create: ", error.message()));
      }
    }
    ASSIGN_OR_RETURN(writer, ParamWriter::Create(dump_dir, header, record_floats));
  }
  ParamSink sink;
  sink.dense = [&](const std::vector<float>& dense) { return writer->AddDense(dense); };
  sink.row = [&](RowId row, const float* record) { return writer->AddRow(row, record); };

  JobResult result;
  const TrainLoop train_loop = MakeDlrmLoop(loop);
  if (mpi) {
    RETURN_IF_ERROR(
        RunDistributedRank(*mpi_transport, options, is_rank0 ? std::move(train) : nullptr,
                           is_rank0 ? std::move(eval) : nullptr, train_loop, sink, &result));
  } else {
    RETURN_IF_ERROR(
        RunEmbeddedJob(options, std::move(train), std::move(eval), train_loop, sink, &result));
  }
  if (!is_rank0) return absl::OkStatus();
  if (result.oracle.stopped_at >= 0) return StoppedStatus(result.oracle, options.checkpoint);
  ASSIGN_OR_RETURN(const std::string sha, writer->Finish());

  // Summary.
  std::vector<float> predictions, labels;
  TrainerStats total;
  for (const TrainerOutcome& outcome : result.trainers) {
    predictions.insert(predictions.end(), outcome.eval_predictions.begin(),
                       outcome.eval_predictions.end());
    labels.insert(labels.end(), outcome.eval_labels.begin(), outcome.eval_labels.end());
    total.unique_rows += outcome.stats.unique_rows;
    total.hits += outcome.stats.hits;
    total.fills += outcome.stats.fills;
    total.evictions += outcome.stats.evictions;
    total.write_backs += outcome.stats.write_backs;
    total.fetched_bytes += outcome.stats.fetched_bytes;
    total.written_back_bytes += outcome.stats.written_back_bytes;
    total.exchanged_bytes += outcome.stats.exchanged_bytes;
    total.exchanged_rows += outcome.stats.exchanged_rows;
    total.shared_rows += outcome.stats.shared_rows;
    total.sync_seconds += outcome.stats.sync_seconds;
  }
  // Without the private-row optimisation every trainer would send the gradient of every row it
  // touched to every other trainer (as a dense all-to-all of touched rows does).
  const double all_rows_exchange_bytes =
      static_cast<double>(total.unique_rows) * flags.dim * sizeof(float) * (layout.trainers - 1);
  const nlohmann::json& info = result.trainers.at(0).info;
  const int64_t iterations = info.value("iterations", int64_t{0});
  int64_t samples = 0;
  for (const TrainerOutcome& outcome : result.trainers) {
    samples += outcome.info.value("samples", int64_t{0});
  }
  const double train_seconds = info.value("seconds", 0.0);
  nlohmann::json summary = {
      {"data", describe},
      {"cache", flags.cache},
      {"cache_rows", options.trainer.cache_rows},
      {"lookahead", options.oracle.planner.lookahead},
      {"oracle_split_parts", flags.oracle_split_parts},
      {"trainers", layout.trainers},
      {"servers", layout.servers},
      {"device", flags.device},
      {"mode", mpi ? "mpirun" : "embedded"},
      {"server_link", link.ToString()},
      {"batch_size", flags.batch_size},
      {"optimizer", flags.optimizer},
      {"lr", flags.lr},
      {"seed", flags.seed},
      {"deterministic", flags.deterministic},
      {"dim", flags.dim},
      {"bottom", FormatLayers(loop.model.bottom)},
      {"top", FormatLayers(loop.model.top)},
      {"model", flags.model},
      {"iterations", iterations},
      {"samples", samples},
      {"train_seconds", train_seconds},
      {"job_seconds", result.seconds},
      {"samples_per_s", train_seconds > 0 ? samples / train_seconds : 0.0},
      {"ms_per_iteration", iterations > 0 ? 1e3 * train_seconds / iterations : 0.0},
      {"train_loss", info.value("train_loss", 0.0)},
      {"hit_rate", total.hit_rate()},
      {"fills", total.fills},
      {"evictions", total.evictions},
      {"write_backs", total.write_backs},
      {"fetched_bytes", total.fetched_bytes},
      {"written_back_bytes", total.written_back_bytes},
      {"exchanged_bytes", total.exchanged_bytes},
      {"exchanged_rows", total.exchanged_rows},
      {"exchanged_bytes_without_private_rows", all_rows_exchange_bytes},
      {"unique_rows", total.unique_rows},
      {"shared_row_updates", total.shared_rows},
      {"sync_ms_per_iteration_mean_over_trainers",
       iterations > 0 ? 1e3 * total.sync_seconds / iterations / layout.trainers : 0.0},
      {"time_ms", info.value("time_ms", nlohmann::json::object())},
      {"oracle", result.oracle.ToJson()},
      {"parameter_rows", result.parameter_rows},
      {"params_sha256", sha},
      {"first_iteration", result.oracle.checkpoint.first_iteration},
      {"checkpoint", result.oracle.checkpoint.ToJson()},
  };
  // Per rank: every trainer's own counters and phase times, and every server's.
  nlohmann::json per_trainer = nlohmann::json::array();
  for (size_t t = 0; t < result.trainers.size(); ++t) {
    nlohmann::json entry = result.trainers[t].stats.ToJson();
    entry["trainer"] = t;
    entry["rank"] = layout.trainer_rank(static_cast<int>(t));
    entry["time_ms"] = result.trainers[t].info.value("time_ms", nlohmann::json::object());
    per_trainer.push_back(std::move(entry));
  }
  summary["per_trainer"] = std::move(per_trainer);
  nlohmann::json per_server = nlohmann::json::array();
  for (size_t s = 0; s < result.servers.size(); ++s) {
    nlohmann::json entry = ServerStatsJson(result.servers[s]);
    entry["server"] = s;
    entry["rank"] = layout.server_rank(static_cast<int>(s));
    per_server.push_back(std::move(entry));
  }
  summary["per_server"] = std::move(per_server);
  if (!dump_dir.empty()) summary["params"] = JoinPath(dump_dir, "params.bin");
  if (!predictions.empty()) summary["eval"] = Evaluate(predictions, labels).ToJson();
  if (!flags.summary_json.empty()) RETURN_IF_ERROR(WriteJsonFile(flags.summary_json, summary));

  std::printf("%s: %lld iterations in %.2f s, %.0f samples/s, %.2f ms/iteration\n",
              flags.cache.c_str(), static_cast<long long>(iterations), train_seconds,
              summary["samples_per_s"].get<double>(), summary["ms_per_iteration"].get<double>());
  std::printf("  train loss %.5f, hit rate %.1f%%, fetched %.1f MB, written back %.1f MB\n",
              summary["train_loss"].get<double>(), 100 * total.hit_rate(),
              total.fetched_bytes / 1e6, total.written_back_bytes / 1e6);
  if (summary.contains("eval")) {
    std::printf("  held-out (%lld samples): log loss %.5f, AUC %.4f\n",
                static_cast<long long>(summary["eval"]["samples"].get<int64_t>()),
                summary["eval"]["log_loss"].get<double>(), summary["eval"]["auc"].get<double>());
  }
  std::printf("  parameters sha256 %s\n", sha.c_str());
  return absl::OkStatus();
}

}  // namespace

Subcommand AddTrainCommand(CLI::App& root) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = root.add_subcommand(
      "train", "Train the reference DLRM through the Bagpipe runtime (the main job)");
  AddDataFlags(app, &flags->data);
  app->add_option("--batch-size,-b", flags->batch_size, "global batch size (all trainers)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--iterations,-n", flags->iterations,
                  "global batches to train (0: --epochs passes over the data)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--epochs", flags->epochs, "passes over the data when --iterations is 0")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--cache", flags->cache, "oracle, lru, lfu, off or device")
      ->capture_default_str();
  app->add_option("--cache-rows", flags->cache_rows,
                  "rows each trainer's cache holds (0: a fifth of all rows, at least four "
                  "local batches)")
      ->capture_default_str();
  app->add_option(
         "--lookahead,-L", flags->lookahead,
         "oracle window in batches (Belady within it; L >= 20 is within ~1% of the offline optimum "
         "on skewed data, and the first plan waits for L batches to be read)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--oracle-split-parts", flags->oracle_split_parts,
                  "with one trainer, plan each table above --oracle-split-min-rows rows as this "
                  "many parts, each a task of its own: more of the planner runs in parallel on "
                  "many cores, for ~10% more work in all (leave at 1 below ~8 cores; see "
                  "bench/RESULTS.md)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app->add_option("--oracle-split-min-rows", flags->oracle_split_min_rows,
                  "tables above this many rows are split (--oracle-split-parts)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--optimizer", flags->optimizer, "sgd, adagrad or rowwise-adagrad")
      ->capture_default_str();
  app->add_option("--dense-optimizer", flags->dense_optimizer,
                  "optimizer of the dense MLPs (default: --optimizer; rowwise-adagrad "
                  "means adagrad)");
  app->add_option("--lr", flags->lr, "learning rate")->capture_default_str();
  app->add_option("--dense-lr", flags->dense_lr, "dense learning rate (default: --lr)");
  app->add_option("--seed", flags->seed, "parameter initialisation seed")->capture_default_str();
  app->add_flag("--deterministic", flags->deterministic,
                "bit-identical results run to run and across cache modes (single-threaded BLAS)");
  app->add_option("--dim", flags->dim, "embedding dimension")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--bottom", flags->bottom,
                  "bottom MLP sizes, input first, last = --dim (default DENSE-64-DIM)");
  app->add_option("--top", flags->top, "top MLP sizes after the interaction, last = 1")
      ->capture_default_str();
  app->add_option("--model", flags->model,
                  "dlrm (the reference DLRM) or logreg (embedding-only logistic regression over "
                  "the pooled embeddings: measures the runtime, not the MLPs; CPU)")
      ->capture_default_str();
  app->add_option("--trainers,-T", flags->trainers, "trainers (embedded)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--servers,-S", flags->servers, "embedding servers")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--device", flags->device, "cpu or cuda")->capture_default_str();
  app->add_option("--server-link", flags->server_link,
                  "embedded only: emulate this network link to the servers, e.g. "
                  "\"25Gbit/s,20us\" (none: memory speed)")
      ->capture_default_str();
  app->add_option("--eval-fraction", flags->eval_fraction,
                  "hold out this tail fraction of the data; report log loss and AUC on it")
      ->capture_default_str();
  app->add_option("--metrics-out", flags->metrics_out, "interval metrics as JSON lines");
  app->add_option("--metrics-interval", flags->metrics_interval, "iterations per metrics line")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--summary-json", flags->summary_json, "final figures as JSON");
  app->add_option("--dump-params", flags->dump_params,
                  "write every parameter to DIR/params.bin (see bagpipe compare)");
  app->add_option("--out", flags->out,
                  "run directory: metrics.jsonl and summary.json go there unless named");
  app->add_option("--prefetch-depth", flags->prefetch_depth, "iterations prefetched ahead")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--plan-queue-depth", flags->plan_queue_depth, "plans queued per trainer")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--writeback-horizon", flags->writeback_horizon,
                  "iterations a server remembers write-back stamps (0: default)")
      ->capture_default_str();
  app->add_option("--peer-timeout", flags->peer_timeout_s,
                  "seconds without a message before a peer counts as dead")
      ->capture_default_str();
  app->add_option("--checkpoint-dir", flags->checkpoint_dir,
                  "write checkpoints (DIR/ckpt-ITERATION) here: every --checkpoint-every "
                  "iterations, at the end, and on SIGINT/SIGTERM/SIGUSR1");
  app->add_option("--checkpoint-every", flags->checkpoint_every,
                  "iterations between checkpoints (0: only at the end and on a stop)")
      ->capture_default_str();
  app->add_option("--keep-checkpoints", flags->keep_checkpoints,
                  "complete checkpoints kept, the newest (0: all)")
      ->capture_default_str();
  app->add_option("--resume", flags->resume,
                  "resume from DIR (its latest complete checkpoint) or DIR/ckpt-K; implies "
                  "--checkpoint-dir DIR and the checkpoint's --checkpoint-every unless given");
  app->footer(std::string(kTrainFooter) + "\n" + kDataHelp);
  return {app, [flags]() { return RunTrain(*flags); }};
}

}  // namespace bagpipe
