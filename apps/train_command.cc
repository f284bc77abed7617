// bagpipe train: the main job. The reference DLRM (model/) trained through the Bagpipe runtime
// with a chosen cache mode, embedded (every role a thread of this process) or as one rank of an
// mpirun job. Writes interval metrics (JSON lines), a summary with the parameter fingerprint,
// and optionally every parameter.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/command.h"
#include "apps/train_flags.h"
#include "core/dir_lock.h"
#include "core/logging.h"
#include "core/metrics.h"
#include "core/optimizer.h"
#include "core/signals.h"
#include "core/status.h"
#include "data/criteo_reader.h"
#include "model/dlrm_loop.h"
#include "model/run_report.h"
#include "sync/mpi_transport.h"
#include "trainer_hooks/checkpoint.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/job_limits.h"

namespace bagpipe {
namespace {

// The options a resumed job must share that only the command knows (the job adds its own).
void SetCheckpointIdentity(const TrainFlags& flags, const DlrmLoopOptions& loop,
                           CheckpointOptions* checkpoint) {
  const OptimizerConfig& dense = loop.model.optimizer;
  nlohmann::json dense_optimizer = {{"kind", std::string(OptimizerName(dense.kind))},
                                    {"lr", dense.learning_rate}};
  if (dense.kind != OptimizerKind::kSgd) {
    // --dense-eps changes every later step; the accumulators start from the checkpoint's, but a
    // changed --dense-initial-accumulator says the resumed job is not the one checkpointed.
    dense_optimizer["eps"] = dense.eps;
    dense_optimizer["initial accumulator"] = dense.initial_accumulator;
  }
  checkpoint->identity.update({
      {"--batch-size", flags.config.batch_size},
      {"--model", flags.model},
      {"--eval-fraction", flags.config.eval_fraction},
      {"dense optimizer", std::move(dense_optimizer)},
  });
  if (loop.head == DenseHeadKind::kDlrm) {
    checkpoint->identity["--bottom"] = FormatLayers(loop.model.bottom);
    checkpoint->identity["--top"] = FormatLayers(loop.model.top);
  }
}

// One rank's part (`mpi` and `mpi_transport` null: the embedded job).
// Warns about options given on the command line that the configuration ignores (accepted so
// that one set of flags serves several configurations; --model logreg's MLPs are warned about
// with the model).
void WarnIgnoredOptions(const TrainFlags& flags) {
  const JobConfig& config = flags.config;
  if (flags.cache_rows_given && config.cache == CachePolicy::kDevice) {
    BAGPIPE_LOG(WARNING) << "--cache device keeps whole tables on every trainer: --cache-rows "
                         << config.cache_rows << " is ignored";
  }
  const auto adagrad = [](OptimizerKind kind) { return kind != OptimizerKind::kSgd; };
  // --eps and --initial-accumulator are also the dense optimizer's defaults.
  const bool dense_takes_sparse_eps = !config.dense_eps.has_value();
  const bool dense_takes_sparse_accumulator = !config.dense_initial_accumulator.has_value();
  const bool dense_adagrad = adagrad(config.DenseOptimizer().kind);
  const bool sparse_adagrad = adagrad(config.optimizer.kind);
  if (flags.eps_given && !sparse_adagrad && !(dense_adagrad && dense_takes_sparse_eps)) {
    BAGPIPE_LOG(WARNING) << "--eps is an Adagrad setting, and no optimizer here is Adagrad: "
                            "it is ignored";
  }
  if (flags.initial_accumulator_given && !sparse_adagrad &&
      !(dense_adagrad && dense_takes_sparse_accumulator)) {
    BAGPIPE_LOG(WARNING) << "--initial-accumulator is an Adagrad setting, and no optimizer here "
                            "is Adagrad: it is ignored";
  }
  if (!dense_adagrad && !dense_takes_sparse_eps) {
    BAGPIPE_LOG(WARNING) << "--dense-eps is an Adagrad setting, and the dense optimizer is sgd: "
                            "it is ignored";
  }
  if (!dense_adagrad && !dense_takes_sparse_accumulator) {
    BAGPIPE_LOG(WARNING) << "--dense-initial-accumulator is an Adagrad setting, and the dense "
                            "optimizer is sgd: it is ignored";
  }
}

// The outputs this rank writes outside --out (which its lock covers): never into another job's
// run or checkpoint directory (each holds its lock file there); a --dump-params directory is
// held as --out is, and a --metrics-out file by a lock file beside it (.NAME.lock): two jobs
// appending to one metrics file would interleave their lines.
absl::StatusOr<std::vector<std::unique_ptr<DirLock>>> LockOutputs(const TrainFlags& flags,
                                                                  bool is_rank0, bool is_trainer0) {
  namespace fs = std::filesystem;
  std::vector<std::unique_ptr<DirLock>> locks;
  // This job's run lock covers --out and --dump-params (rank 0 holds it, in this process or in
  // another rank's): files there are checked no further.
  auto ours = [&flags](const std::string& dir) {
    std::error_code error;
    for (const std::string* held : {&flags.out, &flags.dump_params}) {
      if (!held->empty() && fs::equivalent(dir, *held, error)) return true;
    }
    return false;
  };
  auto not_anothers = [](const std::string& dir, const std::string& what) -> absl::Status {
    RETURN_IF_ERROR(DirLock::CheckFree(dir, ".bagpipe-run.lock", what));
    return DirLock::CheckFree(dir, kCheckpointDirLock, what);
  };
  if (!flags.out.empty() && is_rank0) {
    RETURN_IF_ERROR(
        DirLock::CheckFree(flags.out, kCheckpointDirLock, absl::StrCat("--out ", flags.out)));
  }
  std::error_code error;
  if (!flags.dump_params.empty() && is_rank0 &&
      !(!flags.out.empty() && fs::equivalent(flags.dump_params, flags.out, error))) {
    fs::create_directories(flags.dump_params, error);  // an error is the dump's to report
    if (!error) {
      const std::string what = absl::StrCat("--dump-params ", flags.dump_params);
      RETURN_IF_ERROR(DirLock::CheckFree(flags.dump_params, kCheckpointDirLock, what));
      ASSIGN_OR_RETURN(std::unique_ptr<DirLock> lock,
                       DirLock::Acquire(flags.dump_params, ".bagpipe-run.lock", what));
      locks.push_back(std::move(lock));
    }
  }
  auto parent = [](const std::string& file) {
    const fs::path dir = fs::path(file).parent_path();
    return dir.empty() ? std::string(".") : dir.string();
  };
  if (!flags.summary_json.empty() && flags.summary_json != "-" && is_rank0) {
    const std::string dir = parent(flags.summary_json);
    if (fs::is_directory(dir) && !ours(dir)) {
      RETURN_IF_ERROR(not_anothers(dir, absl::StrCat("--summary-json ", flags.summary_json)));
    }
  }
  if (!flags.metrics_out.empty() && flags.metrics_out != "-" && is_trainer0) {
    const std::string dir = parent(flags.metrics_out);
    const std::string what = absl::StrCat("--metrics-out ", flags.metrics_out);
    if (fs::is_directory(dir) && !ours(dir)) {
      RETURN_IF_ERROR(not_anothers(dir, what));
      ASSIGN_OR_RETURN(
          std::unique_ptr<DirLock> lock,
          DirLock::Acquire(
              dir, absl::StrCat(".", fs::path(flags.metrics_out).filename().string(), ".lock"),
              what));
      locks.push_back(std::move(lock));
    }
  }
  return locks;
}

// What --bottom and --top say on their own, checked before the data are opened (a scan of a
// large dictionary-encoded file takes minutes): the layers' form and sizes, and, for Criteo
// data (13 dense columns), the bottom's input size. The rest is checked with the data's schema.
absl::Status CheckModelFlagsBeforeData(const TrainFlags& flags, const JobConfig& config) {
  if (flags.model != "dlrm") return absl::OkStatus();
  DenseModelConfig model;
  model.dim = config.dim;
  model.optimizer = config.DenseOptimizer();
  ASSIGN_OR_RETURN(model.top, ParseLayers(flags.top));
  if (!flags.bottom.empty()) {
    ASSIGN_OR_RETURN(model.bottom, ParseLayers(flags.bottom));
  }
  if (absl::StartsWith(config.data, "criteo:")) {
    model.num_dense = kCriteoDense;
  } else {  // known with the schema only
    model.num_dense = model.bottom.empty() ? 1 : std::max(model.bottom.front(), 1);
  }
  // The default bottom, "DENSE-64-DIM", fits any data.
  if (flags.bottom.empty()) model.bottom = {model.num_dense, config.dim};
  return ValidateDenseModelConfig(model);
}

// Global batches of `samples` (one epoch; the last one may be short, as BatchStream reads).
int64_t BatchesOf(int64_t samples, const JobConfig& config) {
  return (samples + config.batch_size - 1) / config.batch_size;
}

// For the progress bar: the iterations the job trains (--iterations, or --epochs passes over
// `epoch_samples` when known), 0 when unknown.
int64_t PlannedIterations(const JobConfig& config, int64_t epoch_samples) {
  if (config.iterations > 0) return config.iterations;
  if (epoch_samples <= 0 || config.epochs <= 0) return 0;
  return config.epochs * BatchesOf(epoch_samples, config);
}

absl::Status RunTrainRank(const TrainFlags& flags, MpiSession* mpi, MpiTransport* mpi_transport) {
  const JobConfig& config = flags.config;
  // SIGINT/SIGTERM/SIGUSR1 stop the job at an iteration boundary (after MPI's own handlers).
  InstallStopHandlers();
  const bool is_rank0 = mpi == nullptr || mpi->rank() == 0;
  RETURN_IF_ERROR(CheckModelFlagsBeforeData(flags, config));

  // Data: rank 0 opens and streams it (dictionary-encoded text is scanned once so the table
  // sizes are exact) and tells the other ranks its schema.
  ASSIGN_OR_RETURN(JobData data, OpenJobDataOnRankZero(
                                     config, mpi_transport,
                                     [&flags](std::unique_ptr<SampleSource> source,
                                              const std::string& label, int64_t samples) {
                                       return WithProgress(std::move(source), flags.data, label,
                                                           samples);
                                     },
                                     [] { return StopSignal(); }));
  const Schema& schema = data.schema;
  ASSIGN_OR_RETURN(JobOptions options,
                   config.Resolve(schema, mpi ? mpi->size() : 0, data.ids_per_sample));
  options.checkpoint.identity_context.source_samples = data.source_samples;
  const JobLayout& layout = options.layout;
  const bool is_trainer0 = mpi == nullptr || mpi->rank() == layout.trainer_rank(0);
  if (is_rank0) WarnIgnoredOptions(flags);
  // --out DIR is this job's until it ends: a second job started on it is refused before it
  // writes a file there (rank 0 holds the lock; the files there are replaced atomically).
  std::unique_ptr<DirLock> out_lock;
  if (!flags.out.empty() && is_rank0) {
    std::error_code error;
    std::filesystem::create_directories(flags.out, error);
    if (!error) {
      ASSIGN_OR_RETURN(out_lock, DirLock::Acquire(flags.out, ".bagpipe-run.lock",
                                                  absl::StrCat("--out ", flags.out)));
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<DirLock>> output_locks,
                   LockOutputs(flags, is_rank0, is_trainer0));

  // The model.
  DlrmLoopOptions loop;
  loop.model.num_dense = schema.num_dense();
  loop.model.num_tables = schema.num_tables();
  loop.model.dim = config.dim;
  if (flags.model == "dlrm" && schema.num_dense() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model dlrm: ", data.description,
        " has no dense features, and the DLRM's bottom MLP needs at least one (name dense "
        "columns in --schema, or use --model logreg)"));
  }
  // The MLPs. --model logreg has none: --bottom and --top are ignored (with a warning, so that
  // one set of flags serves both models) and its summary names no MLP.
  const bool logreg = flags.model == "logreg";
  if (logreg) {
    if (is_rank0 && (flags.bottom_given || flags.top_given)) {
      BAGPIPE_LOG(WARNING) << "--model logreg has no MLPs: "
                           << (flags.bottom_given && flags.top_given ? "--bottom and --top are"
                               : flags.top_given                     ? "--top is"
                                                                     : "--bottom is")
                           << " ignored";
    }
  } else {
    if (schema.num_dense() > 0 || !flags.bottom.empty()) {
      const std::string bottom = flags.bottom.empty()
                                     ? absl::StrCat(schema.num_dense(), "-64-", config.dim)
                                     : flags.bottom;
      ASSIGN_OR_RETURN(loop.model.bottom, ParseLayers(bottom));
    }
    ASSIGN_OR_RETURN(loop.model.top, ParseLayers(flags.top));
  }
  loop.model.seed = config.seed;
  loop.model.deterministic = config.deterministic;
  loop.model.optimizer = config.DenseOptimizer();
  if (flags.model == "logreg") {
    loop.head = DenseHeadKind::kLogReg;
  } else if (flags.model == "dlrm") {
    RETURN_IF_ERROR(ValidateDenseModelConfig(loop.model));
    // Every trainer of this process holds a replica: refused before allocating when they could
    // not fit (a typo in --bottom or --top asks for tens of GB).
    const int replicas = mpi == nullptr ? layout.trainers : 1;
    const int64_t local_batch = (config.batch_size + layout.trainers - 1) / layout.trainers;
    const double bytes = replicas * EstimateDenseModelBytes(loop.model, local_batch);
    const double memory = static_cast<double>(PhysicalMemoryBytes());
    if (memory > 0 && bytes > memory / 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--bottom %s --top %s: the dense model would take about %.1f GB (%d replica(s) with "
          "their gradients, optimizer state and activations), more than half of this "
          "machine's %.1f GB of memory",
          FormatLayers(loop.model.bottom), FormatLayers(loop.model.top), bytes / 1e9, replicas,
          memory / 1e9));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", flags.model, "': expected dlrm or logreg"));
  }
  loop.metrics_interval = flags.metrics_interval;
  loop.total_iterations = PlannedIterations(config, data.train_samples);
  loop.total_eval_batches = data.eval_samples > 0 ? BatchesOf(data.eval_samples, config) : 0;
  loop.progress = !flags.data.quiet;
  std::unique_ptr<JsonLinesWriter> metrics;
  if (!flags.metrics_out.empty() && is_trainer0) {
    ASSIGN_OR_RETURN(metrics, JsonLinesWriter::Open(flags.metrics_out));
    // The earlier run's summary and parameter dump, where this run writes them and in --out
    // (a dump there from a run with --dump-params would pass for this run's).
    metrics->set_stale_on_fresh_start(
        {flags.summary_json,
         flags.dump_params.empty()
             ? std::string()
             : (std::filesystem::path(flags.dump_params) / "params.bin").string(),
         flags.out.empty() ? std::string()
                           : (std::filesystem::path(flags.out) / "params.bin").string()});
    loop.metrics = metrics.get();
  }

  options.stop_requested = [] { return StopSignal(); };
  SetCheckpointIdentity(flags, loop, &options.checkpoint);

  if (is_rank0) {
    BAGPIPE_LOG(INFO) << absl::StrFormat(
        "train: %s, %d tables (%d rows), batch %d, cache %s (%s), %d trainer(s), %d "
        "server(s), %s%s",
        data.description, schema.num_tables(), schema.TotalRows(), config.batch_size,
        CachePolicyName(config.cache),
        config.cache == CachePolicy::kDevice ? std::string("whole tables")
                                             : absl::StrCat(options.trainer.cache_rows, " rows"),
        layout.trainers, layout.servers, BackendName(config.device),
        mpi ? " (mpirun)" : " (embedded)");
  }

  // Parameters gathered at rank 0: fingerprint, and the dump when asked.
  std::unique_ptr<RunRecorder> recorder;
  ParamSink sink;
  if (is_rank0) {
    nlohmann::json model = {{"model", flags.model}};
    if (!logreg) {
      model["bottom"] = FormatLayers(loop.model.bottom);
      model["top"] = FormatLayers(loop.model.top);
    }
    ASSIGN_OR_RETURN(recorder, RunRecorder::Create(config, options, std::move(model),
                                                   {flags.summary_json, flags.dump_params}));
    sink = recorder->sink();
  }

  JobResult result;
  const TrainLoop train_loop = MakeDlrmLoop(loop);
  if (mpi) {
    RETURN_IF_ERROR(RunDistributedRank(*mpi_transport, options, std::move(data.train),
                                       std::move(data.eval), train_loop, sink, &result));
  } else {
    RETURN_IF_ERROR(RunEmbeddedJob(options, std::move(data.train), std::move(data.eval), train_loop,
                                   sink, &result));
  }
  if (!is_rank0) return absl::OkStatus();
  if (result.oracle.stopped_at >= 0) return StoppedJobStatus(result.oracle, options.checkpoint);
  ASSIGN_OR_RETURN(const nlohmann::json summary,
                   recorder->Finish(result, data.description, mpi != nullptr));

  const int64_t iterations = summary["iterations"].get<int64_t>();
  std::printf("%s: %lld iterations in %.2f s, %.0f samples/s, %.2f ms/iteration\n",
              std::string(CachePolicyName(config.cache)).c_str(),
              static_cast<long long>(iterations), summary["train_seconds"].get<double>(),
              summary["samples_per_s"].get<double>(), summary["ms_per_iteration"].get<double>());
  const nlohmann::json& loss = summary["train_loss"];
  std::printf("  train loss %s, hit rate %.1f%%, fetched %.1f MB, written back %.1f MB\n",
              loss.is_number() ? absl::StrFormat("%.5f", loss.get<double>()).c_str()
                               : "- (no iteration trained)",
              100 * summary["hit_rate"].get<double>(),
              summary["fetched_bytes"].get<int64_t>() / 1e6,
              summary["written_back_bytes"].get<int64_t>() / 1e6);
  if (summary.contains("eval")) {
    std::printf("  held-out (%lld samples): log loss %.5f, AUC %.4f\n",
                static_cast<long long>(summary["eval"]["samples"].get<int64_t>()),
                summary["eval"]["log_loss"].get<double>(), summary["eval"]["auc"].get<double>());
  }
  std::printf("  parameters sha256 %s\n", summary["params_sha256"].get<std::string>().c_str());
  if (recorder->kept_summary()) {
    std::printf("  %s kept: the summary of the run that trained to iteration %lld\n",
                flags.summary_json.c_str(),
                static_cast<long long>(summary["first_iteration"].get<int64_t>()));
  }
  // --skip-bad-lines: what was skipped (summary.json: oracle.data and oracle.eval_data). Both
  // streams read the file from its start (the evaluation range reads past the training part),
  // so the larger count is the file's.
  const nlohmann::json* read = nullptr;
  int64_t skipped = 0;
  for (const nlohmann::json* stats : {&result.oracle.data, &result.oracle.eval_data}) {
    const int64_t here = stats->is_object() ? stats->value("skipped_lines", int64_t{0}) : 0;
    if (here > skipped) {
      skipped = here;
      read = stats;
    }
  }
  if (read != nullptr) {
    const nlohmann::json& first = (*read)["first_errors"];
    std::printf("  skipped %lld bad lines of the data%s%s\n", static_cast<long long>(skipped),
                first.empty() ? "" : "; the first: ",
                first.empty() ? "" : first[0].get<std::string>().c_str());
  }
  std::fflush(stdout);
  return recorder->dump_status();  // after the results: a full disk does not lose them
}

absl::Status RunTrain(TrainFlags flags) {
  // From the start: a stop during MPI_Init and the options' agreement (up to --peer-timeout
  // when a rank starts late) is a stop at iteration 0, not the signal's default action (death).
  // RunTrainRank installs them again over any MPI_Init may have set.
  InstallStopHandlers();
  RETURN_IF_ERROR(FinishTrainFlags(&flags));
  // Distributed or embedded.
  MpiJob job;
  if (LaunchedByMpirun()) {
    // Bounded by --peer-timeout: a rank stopped or dead during the start ends the job.
    ASSIGN_OR_RETURN(job, StartMpiJob(flags.config.peer_timeout));
  }
  const absl::Status status = RunTrainRank(flags, job.session.get(), job.transport.get());
  // A rank that fails alone tells the ranks waiting for it why, in its goodbye.
  if (job.transport != nullptr) job.transport->set_exit_status(status);
  return status;
}

}  // namespace

Subcommand AddTrainCommand(CLI::App& root) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* app = root.add_subcommand(
      "train", "Train the reference DLRM through the Bagpipe runtime (the main job)");
  AddTrainFlags(app, flags.get());
  app->footer(std::string(kTrainFooter) + "\n" + kDataHelp);
  return {app, [flags]() { return RunTrain(*flags); }};
}

}  // namespace bagpipe
