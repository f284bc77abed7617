#include "trainer_hooks/job_config.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/json_fields.h"
#include "core/status.h"
#include "data/csv_reader.h"
#include "data/synthetic.h"
#include "trainer_hooks/checkpoint.h"
#include "trainer_hooks/job_limits.h"
#include "trainer_hooks/oracle_role.h"

namespace bagpipe {
namespace {

template <typename... Parts>
absl::Status Invalid(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

// The optimizer options of `config`, named with `prefix` ("" or "dense-") as the flags are.
absl::Status CheckOptimizer(const OptimizerConfig& config, const std::string& prefix) {
  if (!(std::isfinite(config.learning_rate) && config.learning_rate >= 0)) {
    return Invalid("--", prefix, "lr ", config.learning_rate, ": must be finite and >= 0");
  }
  if (config.kind == OptimizerKind::kSgd) return absl::OkStatus();
  if (!(std::isfinite(config.eps) && config.eps > 0)) {
    return Invalid("--", prefix, "eps ", config.eps, ": --", prefix, "optimizer ",
                   std::string(OptimizerName(config.kind)),
                   " needs a finite eps > 0 (a zero gradient on a zero accumulator would divide "
                   "0 by 0)");
  }
  if (!(std::isfinite(config.initial_accumulator) && config.initial_accumulator >= 0)) {
    return Invalid("--", prefix, "initial-accumulator ", config.initial_accumulator,
                   ": must be finite and >= 0");
  }
  return absl::OkStatus();
}

std::string SplitNeedsOneTrainer(int parts, int trainers) {
  return absl::StrCat(
      "--oracle-split-parts ", parts,
      " splits the tables of a single trainer's plans, but the "
      "job has --trainers ",
      trainers,
      " (with several trainers every (trainer, table) is already a task of its own): leave "
      "--oracle-split-parts at 1");
}

}  // namespace

int64_t DefaultCacheRows(const Schema& schema, int64_t batch_size, int trainers) {
  const int64_t local = (batch_size + trainers - 1) / trainers;
  const int64_t rows = std::max<int64_t>(schema.TotalRows() / 5, 4 * local * schema.num_tables());
  // A cache of every row holds whatever a larger one would: more slots are memory for nothing.
  return std::max<int64_t>(1, std::min(rows, schema.TotalRows()));
}

OptimizerConfig JobConfig::DenseOptimizer() const {
  OptimizerConfig dense = optimizer;
  dense.kind = dense_optimizer.value_or(optimizer.kind);
  if (dense.kind == OptimizerKind::kRowwiseAdagrad) dense.kind = OptimizerKind::kAdagrad;
  if (dense_lr.has_value()) dense.learning_rate = *dense_lr;
  if (dense_eps.has_value()) dense.eps = *dense_eps;
  if (dense_initial_accumulator.has_value()) {
    dense.initial_accumulator = *dense_initial_accumulator;
  }
  return dense;
}

// More iterations prefetched ahead gain nothing; each holds buffers for a batch's rows.
constexpr int kMaxPrefetchDepth = 1 << 16;
// Plans the oracle may run ahead of a trainer. Each queued plan holds the trainer's lists for one
// iteration (megabytes for a Criteo-sized batch), so the bound keeps a typo from letting the
// oracle fill the memory with plans of the whole stream.
constexpr int kMaxPlanQueueDepth = 1024;
constexpr int kMaxDim = 1 << 20;

absl::Status JobConfig::Validate() const {
  if (batch_size < 1) return Invalid("--batch-size ", batch_size, ": must be >= 1");
  if (iterations < 0) return Invalid("--iterations ", iterations, ": must be >= 0");
  if (iterations == 0 && epochs < 1) {
    return Invalid("--epochs ", epochs, ": must be >= 1 when --iterations is 0");
  }
  if (!(eval_fraction >= 0 && eval_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-fraction %.9g: must be in [0, 1)", eval_fraction));
  }
  if (trainers < 0 || trainers > 64) {
    return Invalid("--trainers ", trainers, ": must be in [1, 64] (0: the default)");
  }
  if (servers < 1) return Invalid("--servers ", servers, ": must be >= 1");
  if (device == Backend::kCuda && !CudaCompiledIn()) {
    return Invalid(
        "--device cuda: this build has no CUDA backend (configure with -DBAGPIPE_CUDA=ON)");
  }
  if (peer_timeout <= absl::ZeroDuration()) {
    return Invalid("--peer-timeout ", absl::FormatDuration(peer_timeout), ": must be > 0");
  }
  if (cache_rows < 0 || cache_rows > std::numeric_limits<int32_t>::max()) {
    return Invalid("--cache-rows ", cache_rows, ": must be in [0, 2^31 - 1] (0: the default)");
  }
  if (lookahead < 1) return Invalid("--lookahead ", lookahead, ": must be >= 1");
  if (prefetch_depth < 1 || prefetch_depth > kMaxPrefetchDepth) {
    // The trainer stages prefetch_depth + 2 plans: an unbounded depth would overflow that.
    return Invalid("--prefetch-depth ", prefetch_depth, ": must be in [1, ", kMaxPrefetchDepth,
                   "]");
  }
  if (plan_queue_depth < 1 || plan_queue_depth > kMaxPlanQueueDepth) {
    return Invalid("--plan-queue-depth ", plan_queue_depth, ": must be in [1, ", kMaxPlanQueueDepth,
                   "]");
  }
  if (writeback_horizon < 0) {
    return Invalid("--writeback-horizon ", writeback_horizon, ": must be >= 0 (0: the default)");
  }
  if (oracle_split_parts < 1 || oracle_split_parts > 64) {
    return Invalid("--oracle-split-parts ", oracle_split_parts, ": must be in [1, 64]");
  }
  if (oracle_split_min_rows < 0) {
    return Invalid("--oracle-split-min-rows ", oracle_split_min_rows, ": must be >= 0");
  }
  if (oracle_split_parts > 1 && trainers > 1) {
    return Invalid(SplitNeedsOneTrainer(oracle_split_parts, trainers));
  }
  if (oracle_split_parts > 1 && cache == CachePolicy::kDevice) {
    return Invalid("--oracle-split-parts ", oracle_split_parts,
                   " has no effect with --cache device (whole tables, nothing is planned): "
                   "leave it at 1");
  }
  // Up to 2^20 floats a row (a record with optimizer state is then 8 MiB): far above any
  // model's, and sizes computed from it stay far from overflowing.
  if (dim < 1 || dim > kMaxDim) return Invalid("--dim ", dim, ": must be in [1, 2^20]");
  if (checkpoint_every < 0) {
    return Invalid("--checkpoint-every ", checkpoint_every, ": must be >= 0");
  }
  if (keep_checkpoints < 0) {
    return Invalid("--keep-checkpoints ", keep_checkpoints, ": must be >= 0 (0: all)");
  }
  if (checkpoint_every > 0 && checkpoint_dir.empty() && resume.empty()) {
    return Invalid("--checkpoint-every ", checkpoint_every, " needs --checkpoint-dir");
  }
  RETURN_IF_ERROR(CheckOptimizer(optimizer, ""));
  RETURN_IF_ERROR(CheckOptimizer(DenseOptimizer(), "dense-"));
  return absl::OkStatus();
}

absl::StatusOr<JobOptions> JobConfig::Resolve(const Schema& schema, int world_size,
                                              double ids_per_sample) const {
  RETURN_IF_ERROR(Validate());
  JobLayout layout{servers, trainers > 0 ? trainers : 1};
  if (world_size > 0) {
    const int implied = world_size - 1 - servers;
    if (implied < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "mpirun started %d ranks but --servers %d leaves no trainer: a job needs 1 + S + T "
          "ranks (rank 0 the data loader and oracle, ranks 1..S the embedding servers, the "
          "rest trainers)",
          world_size, servers));
    }
    if (trainers > 0 && trainers != implied) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--trainers %d, but mpirun started %d ranks, which with --servers %d leaves %d "
          "trainers (rank 0 the oracle, ranks 1..S the servers, the rest trainers): leave "
          "--trainers out under mpirun or start 1 + %d + %d ranks",
          trainers, world_size, servers, implied, servers, trainers));
    }
    if (server_link.enabled()) {
      return Invalid("--server-link ", server_link.ToString(),
                     " emulates the network in the embedded job; under mpirun the servers' "
                     "messages cross the real one: leave it out");
    }
    layout.trainers = implied;
  }
  RETURN_IF_ERROR(layout.Validate(world_size));
  if (oracle_split_parts > 1 && layout.trainers > 1) {
    return Invalid(SplitNeedsOneTrainer(oracle_split_parts, layout.trainers));
  }
  if (schema.num_tables() == 0) return Invalid("the data has no embedding tables");
  // --cache device holds every row at the slot of its RowId (the planner's and the cache's
  // 32-bit slots), whatever --cache-rows says.
  if (cache == CachePolicy::kDevice && schema.TotalRows() > std::numeric_limits<int32_t>::max()) {
    return Invalid("--cache device: the tables' ", schema.TotalRows(),
                   " rows exceed a cache's 2^31 - 1 slots; use --cache oracle (or lru) with "
                   "--cache-rows");
  }
  const int64_t rows =
      cache_rows > 0 ? cache_rows : DefaultCacheRows(schema, batch_size, layout.trainers);
  if (cache != CachePolicy::kDevice && rows > std::numeric_limits<int32_t>::max()) {
    if (cache_rows > 0) {
      return Invalid("--cache-rows ", cache_rows, ": at most 2^31 - 1 rows (32-bit slots)");
    }
    // The default is the larger of a fifth of the tables and 4 x the rows one trainer's batch
    // may touch: which one is too large says what to change.
    const bool from_batch = rows > schema.TotalRows() / 5;
    return Invalid("the default cache of ", rows, " rows (",
                   from_batch
                       ? absl::StrCat("4 x --batch-size ", batch_size, " / ", layout.trainers,
                                      " trainer(s) x ", schema.num_tables(), " tables")
                       : absl::StrCat("a fifth of the tables' ", schema.TotalRows(), " rows"),
                   ") is too large for 32-bit slots: ",
                   from_batch ? "lower --batch-size, or set --cache-rows" : "set --cache-rows");
  }

  JobOptions options;
  options.layout = layout;
  options.backend = device;
  options.server_link = server_link;
  options.peer_timeout = peer_timeout;
  options.collect_parameters = collect_parameters;
  TrainerOptions& trainer = options.trainer;
  trainer.dim = dim;
  trainer.sparse_optimizer = optimizer;
  trainer.policy = cache;
  trainer.cache_rows = rows;
  trainer.prefetch_depth = prefetch_depth;
  trainer.deterministic = deterministic;
  trainer.peer_timeout = peer_timeout;
  trainer.initializer = RowInitializer(seed, dim, StateFloatsPerRow(optimizer.kind, dim),
                                       optimizer.initial_accumulator, schema.table_rows);
  PlannerOptions& planner = options.oracle.planner;
  planner.schema = schema;
  planner.num_trainers = layout.trainers;
  planner.capacity = rows;
  planner.lookahead = cache == CachePolicy::kOracle ? lookahead : 1;
  planner.policy = cache;
  planner.writeback_horizon = writeback_horizon;
  planner.split_parts = oracle_split_parts;
  planner.split_min_rows = oracle_split_min_rows;
  options.oracle.max_iterations = iterations > 0 ? iterations : -1;
  options.oracle.plan_queue_depth = plan_queue_depth;
  options.oracle.peer_timeout = peer_timeout;
  CheckpointOptions& checkpoint = options.checkpoint;
  checkpoint.dir = checkpoint_dir;
  checkpoint.every = checkpoint_every;
  checkpoint.keep = keep_checkpoints;
  checkpoint.resume = resume;
  // The training stream, where the options name it whole: a resume reading another stream (other
  // synthetic data, fewer samples, other CSV columns) would not continue the checkpointed job,
  // and only the batches up to the checkpoint are checked. A file's path is not recorded (data
  // may move).
  checkpoint.identity["--max-samples"] = source.max_samples;
  if (!source.schema.empty()) checkpoint.identity["--schema"] = CanonicalCsvSpec(source.schema);
  if (absl::StartsWith(data, "synthetic")) {
    checkpoint.identity["--data"] = SyntheticStreamIdentity(data);
  }
  // --resume alone goes on writing to the directory it resumes from; to any directory, every as
  // many iterations as the checkpoint's job did unless --checkpoint-every says otherwise.
  if (!resume.empty() && checkpoint.dir.empty()) {
    namespace fs = std::filesystem;
    std::error_code error;
    const bool is_checkpoint = fs::exists(fs::path(resume) / kManifestName, error);
    checkpoint.dir = is_checkpoint ? CheckpointParent(resume) : resume;
    if (checkpoint.dir.empty()) checkpoint.dir = ".";
  }
  if (!resume.empty() && !checkpoint_every_given && checkpoint.every == 0) {
    // Unreadable here: the job reports why when it resumes.
    absl::StatusOr<std::string> path = ResolveCheckpoint(resume);
    if (path.ok()) {
      absl::StatusOr<CheckpointManifest> manifest = ReadManifest(*path);
      if (manifest.ok()) checkpoint.every = manifest->every;
    }
  }
  RETURN_IF_ERROR(ValidateJobOptions(options));

  // Limits that depend on the machine (the oracle's window, an embedded job's threads, an
  // emulated link) against an estimate, now that the data's shape is known.
  JobShape shape;
  shape.lookahead = planner.lookahead;
  shape.batch_size = batch_size;
  shape.num_tables = schema.num_tables();
  shape.num_dense = schema.num_dense();
  if (ids_per_sample > 0 && std::isfinite(ids_per_sample)) {
    // The data's own mean (a binary file's header, the scan of dictionary-encoded text).
    shape.ids_per_sample = ids_per_sample;
  } else if (absl::StartsWith(data, "synthetic:")) {
    // Its bags' mean size (pooling=P or MIN-MAX); an invalid spec was refused when opened.
    absl::StatusOr<SyntheticConfig> synthetic =
        ParseSyntheticConfig(data.substr(std::string("synthetic:").size()));
    if (synthetic.ok()) {
      shape.ids_per_sample = static_cast<double>(schema.num_tables()) *
                             (synthetic->pooling_min + synthetic->pooling_max) / 2.0;
    }
  }
  shape.trainers = layout.trainers;
  shape.servers = layout.servers;
  shape.embedded = world_size <= 0;
  shape.record_floats = RecordFloats(optimizer.kind, dim);
  shape.dim = dim;
  // Device mode's caches hold every row (not --cache-rows, which it ignores).
  shape.cache_rows =
      cache == CachePolicy::kDevice ? schema.TotalRows() : options.trainer.cache_rows;
  shape.whole_tables = cache == CachePolicy::kDevice;
  shape.host_trainers = device == Backend::kCpu;
  shape.server_link = server_link;
  shape.peer_timeout = peer_timeout;
  RETURN_IF_ERROR(CheckJobLimits(shape));
  return options;
}

nlohmann::json JobConfig::ToJson() const {
  const OptimizerConfig dense = DenseOptimizer();
  return {{"data", data},
          {"batch_size", batch_size},
          {"iterations", iterations},
          {"epochs", epochs},
          {"eval_fraction", eval_fraction},
          {"trainers", trainers},
          {"servers", servers},
          {"device", std::string(BackendName(device))},
          {"server_link", server_link.ToString()},
          {"peer_timeout", absl::ToDoubleSeconds(peer_timeout)},
          {"cache", std::string(CachePolicyName(cache))},
          {"cache_rows", cache_rows},
          {"lookahead", lookahead},
          {"prefetch_depth", prefetch_depth},
          {"plan_queue_depth", plan_queue_depth},
          {"writeback_horizon", writeback_horizon},
          {"oracle_split_parts", oracle_split_parts},
          {"oracle_split_min_rows", oracle_split_min_rows},
          {"dim", dim},
          {"optimizer", std::string(OptimizerName(optimizer.kind))},
          {"lr", optimizer.learning_rate},
          {"eps", optimizer.eps},
          {"initial_accumulator", optimizer.initial_accumulator},
          {"dense_optimizer", std::string(OptimizerName(dense.kind))},
          {"dense_lr", dense.learning_rate},
          {"dense_eps", dense.eps},
          {"dense_initial_accumulator", dense.initial_accumulator},
          {"seed", seed},
          {"deterministic", deterministic},
          {"collect_parameters", collect_parameters},
          {"checkpoint_dir", checkpoint_dir},
          {"checkpoint_every", checkpoint_every},
          {"keep_checkpoints", keep_checkpoints},
          {"resume", resume}};
}

absl::Status ValidateJobOptions(const JobOptions& options) {
  const JobLayout& layout = options.layout;
  RETURN_IF_ERROR(layout.Validate());
  const TrainerOptions& trainer = options.trainer;
  const PlannerOptions& planner = options.oracle.planner;
  if (planner.num_trainers != layout.trainers) {
    return Invalid("the oracle plans for ", planner.num_trainers,
                   " trainer(s) (PlannerOptions::num_trainers) but the job has ", layout.trainers,
                   " (--trainers): its plans would not match the trainers");
  }
  if (planner.policy != trainer.policy) {
    return Invalid("the oracle plans --cache ", std::string(CachePolicyName(planner.policy)),
                   " (PlannerOptions::policy) but the trainers run --cache ",
                   std::string(CachePolicyName(trainer.policy)), " (TrainerOptions::policy)");
  }
  if (planner.schema.num_tables() == 0) return Invalid("the schema has no embedding tables");
  if (trainer.policy != CachePolicy::kDevice) {
    if (trainer.cache_rows <= 0) {
      return Invalid("--cache-rows ", trainer.cache_rows, ": the cache needs a positive size");
    }
    if (planner.capacity != trainer.cache_rows) {
      return Invalid("the oracle plans a cache of ", planner.capacity,
                     " rows (PlannerOptions::capacity) but each trainer's cache holds ",
                     trainer.cache_rows,
                     " (TrainerOptions::cache_rows, --cache-rows): they must be the same");
    }
  }
  if (trainer.dim < 1 || trainer.dim > kMaxDim) {
    return Invalid("--dim ", trainer.dim, ": must be in [1, 2^20]");
  }
  RETURN_IF_ERROR(ValidateOptimizerConfig(trainer.sparse_optimizer, "--optimizer"));
  const RowInitializer& init = trainer.initializer;
  const OptimizerConfig& optimizer = trainer.sparse_optimizer;
  if (init.dim() != trainer.dim) {
    return Invalid("rows are initialised with dim ", init.dim(),
                   " (TrainerOptions::initializer) but the caches hold --dim ", trainer.dim);
  }
  const int state = StateFloatsPerRow(optimizer.kind, trainer.dim);
  if (init.state_floats() != state) {
    return Invalid("rows are initialised with ", init.state_floats(),
                   " optimizer-state float(s) (TrainerOptions::initializer) but --optimizer ",
                   std::string(OptimizerName(optimizer.kind)), " keeps ", state);
  }
  if (state > 0 && init.initial_accumulator() != optimizer.initial_accumulator) {
    return Invalid("rows are initialised with accumulator ", init.initial_accumulator(),
                   " (TrainerOptions::initializer) but --initial-accumulator is ",
                   optimizer.initial_accumulator);
  }
  if (init.table_offsets() != planner.schema.TableOffsets()) {
    return Invalid("rows are initialised for ", init.table_offsets().size() - 1, " tables of ",
                   init.table_offsets().back(),
                   " rows (TrainerOptions::initializer) but the "
                   "oracle's schema has ",
                   planner.schema.num_tables(), " tables of ", planner.schema.TotalRows(), " rows");
  }
  if (options.oracle.plan_queue_depth < 1 || options.oracle.plan_queue_depth > kMaxPlanQueueDepth) {
    return Invalid("--plan-queue-depth ", options.oracle.plan_queue_depth, ": must be in [1, ",
                   kMaxPlanQueueDepth, "]");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobData> OpenJobData(const JobConfig& config, bool stream, const SourceWrapper& wrap,
                                    const StopPoll& stop_requested) {
  if (config.data.empty()) return Invalid("no data source (--data)");
  // The passes over the whole data (minutes on a Criteo day file) end at a stop.
  int stop_signal = 0;
  StopPoll poll;
  if (stop_requested) {
    poll = [&] { return stop_signal = stop_requested(); };
  }
  const auto stopped = [&](const absl::Status& status, const char* pass) {
    if (!absl::IsCancelled(status) || stop_signal == 0) return status;
    return absl::CancelledError(absl::StrCat("stopped by ", StopSignalName(stop_signal), " while ",
                                             pass, " (", status.message(), "); nothing saved"));
  };
  const bool dictionary_text =
      absl::StartsWith(config.data, "csv:") ||
      (absl::StartsWith(config.data, "criteo:") && config.source.row_budget == 0);
  // A pipe or FIFO is read once: what needs a second pass is refused before the first one
  // (which may take hours on a Criteo day) rather than after it.
  if (absl::StartsWith(config.data, "csv:") || absl::StartsWith(config.data, "criteo:")) {
    const std::string path = config.data.substr(config.data.find(':') + 1);
    std::error_code error;
    const auto status = std::filesystem::status(path, error);
    const bool one_pass = !error && std::filesystem::exists(status) &&
                          !std::filesystem::is_regular_file(status) &&
                          !std::filesystem::is_directory(status);
    const bool epochs = config.iterations == 0 && config.epochs > 1;
    if (one_pass && (dictionary_text || config.eval_fraction > 0 || epochs)) {
      return Invalid(
          "--data ", config.data, ": not a regular file (a pipe, FIFO or device is read once), ",
          "and ",
          dictionary_text ? absl::StrCat(absl::StartsWith(config.data, "csv:")
                                             ? "csv: data are"
                                             : "criteo: data without --row-budget are",
                                         " dictionary-encoded, which reads the data once for the "
                                         "table sizes before training")
          : config.eval_fraction > 0
              ? std::string("--eval-fraction counts the samples before training")
              : absl::StrCat("--epochs ", config.epochs, " reads it ", config.epochs, " times"),
          ": write it to a file first (bagpipe convert --data ", config.data,
          " --out FILE.bin reads it in one pass; then --data bin:FILE.bin)");
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SampleSource> source, OpenSource(config.data, config.source));
  JobData data;
  data.schema = source->schema();
  // Of the whole data: with --eval-fraction it stands for the training part's, which is not
  // known without reading it.
  data.ids_per_sample = source->IdsPerSample();
  if (dictionary_text) {
    // Dictionary-encoded text: one pass to learn the exact table sizes (and the bags' sizes).
    if (stream && wrap) source = wrap(std::move(source), "scanning for table sizes", -1);
    absl::StatusOr<Schema> scanned = ScanSchema(*source, poll, &data.ids_per_sample);
    if (!scanned.ok()) return stopped(scanned.status(), "scanning the data for the table sizes");
    data.schema = *std::move(scanned);
    // The scan is the source's first pass: what it returned is one epoch.
    data.train_samples = source->stats().samples;
    // Read to its end where it stopped short of --max-samples: then that is the whole source.
    if (config.source.max_samples < 0 || data.train_samples < config.source.max_samples) {
      data.source_samples = data.train_samples;
    }
  } else {
    data.train_samples = source->SamplesPerEpoch();
    data.source_samples = source->SamplesPerEpochWithoutLimit();
  }
  if (data.schema.num_tables() == 0) {
    return Invalid("--data ", config.data, ": the dataset has no embedding tables");
  }
  if (!stream) {
    data.description = source->Describe();
    return data;
  }
  if (config.eval_fraction > 0) {
    // A pass over the whole data too (seconds at millions of lines), shown as the scan is; by
    // samples, with a total, where they are known (after a scan, from a binary file's header).
    if (wrap) {
      source =
          wrap(std::move(source), "counting the samples for --eval-fraction", data.train_samples);
    }
    absl::StatusOr<int64_t> counted = CountSamples(*source, poll);
    if (!counted.ok()) return stopped(counted.status(), "counting the samples for --eval-fraction");
    const int64_t total = *counted;
    const int64_t eval_samples = static_cast<int64_t>(std::llround(config.eval_fraction * total));
    if (eval_samples <= 0 || eval_samples >= total) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--eval-fraction %.9g of %d samples leaves no training or no evaluation data",
          config.eval_fraction, total));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SampleSource> tail, OpenSource(config.data, config.source));
    // The held-out samples are reached by reading the training part once more, on the oracle's
    // thread once it has planned the last iteration: while trainer 0 still draws the train bar,
    // so that read has no bar of its own (two bars would overwrite each other's line).
    data.eval =
        std::make_unique<BatchStream>(SampleRange(std::move(tail), total - eval_samples, -1),
                                      BatchStream::Options{config.batch_size, 1, false});
    source = SampleRange(std::move(source), 0, total - eval_samples);
    data.train_samples = total - eval_samples;
    data.eval_samples = eval_samples;
  }
  data.train = std::make_unique<BatchStream>(
      std::move(source),
      BatchStream::Options{config.batch_size, config.iterations > 0 ? 0 : config.epochs, false});
  data.description = data.train->source().Describe();
  return data;
}

absl::StatusOr<JobData> OpenJobDataOnRankZero(const JobConfig& config, Transport* transport,
                                              const SourceWrapper& wrap,
                                              const StopPoll& stop_requested) {
  if (transport == nullptr || transport->size() == 1) {
    return OpenJobData(config, /*stream=*/true, wrap, stop_requested);
  }
  if (transport->rank() == 0) {
    // A stop requested on another rank while this one scans the data stops the scan too.
    const StopPoll poll = [&] { return PollStopRequest(*transport, stop_requested); };
    absl::StatusOr<JobData> data = OpenJobData(config, /*stream=*/true, wrap, poll);
    nlohmann::json message;
    if (data.ok()) {
      message = {{"schema", data->schema.ToJson()},
                 {"description", data->description},
                 {"train_samples", data->train_samples},
                 {"eval_samples", data->eval_samples},
                 {"ids_per_sample", data->ids_per_sample}};
    } else {
      message = {{"code", static_cast<int>(data.status().code())},
                 {"error", std::string(data.status().message())}};
    }
    const std::string text = DumpJson(message);
    for (int r = 1; r < transport->size(); ++r) {
      const absl::Status sent = transport->Send(r, kTagSchema, Bytes(text.begin(), text.end()));
      if (!sent.ok() && data.ok()) return sent;
    }
    return data;
  }
  // The other ranks: rank 0's message, however long its scan of the data takes. A stop
  // requested here goes to rank 0 (once), which ends its scan and tells every rank, or, its
  // scan done, stops the job at its first iteration.
  absl::StatusOr<Message> received;
  bool forwarded = false;
  while (true) {
    received = transport->Receive(0, kTagSchema, absl::Milliseconds(100));
    if (!absl::IsDeadlineExceeded(received.status())) break;
    if (const int signal = stop_requested && !forwarded ? stop_requested() : 0; signal != 0) {
      WireWriter w;
      w.Put<int32_t>(signal);
      RETURN_IF_ERROR(transport->Send(0, kTagStopRequest, w.Take()));
      forwarded = true;
    }
  }
  if (!received.ok()) return received.status();
  const nlohmann::json message = ParseUntrustedJson(std::string_view(
      reinterpret_cast<const char*>(received->payload.data()), received->payload.size()));
  const absl::StatusOr<std::string> error = JsonString(message, "error");
  const absl::StatusOr<int64_t> code = JsonInt64(message, "code");
  if (error.ok() && code.ok()) {
    return absl::Status(*code > 0 && *code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                            ? static_cast<absl::StatusCode>(*code)
                            : absl::StatusCode::kUnknown,
                        absl::StrCat("rank 0: ", *error));
  }
  const absl::StatusOr<std::string> description = JsonString(message, "description");
  if (!description.ok() || !message.contains("schema")) {
    return absl::DataLossError("rank 0 sent a malformed description of the data");
  }
  JobData data;
  ASSIGN_OR_RETURN(data.schema, Schema::FromJson(message["schema"]));
  data.description = *description;
  // Only for the progress bars: a message without them (or with nonsense) shows none.
  data.train_samples = JsonInt64(message, "train_samples").value_or(-1);
  data.eval_samples = JsonInt64(message, "eval_samples").value_or(-1);
  // The same memory check as rank 0's: its value as sent (JSON keeps a double exactly).
  if (const auto ids = message.find("ids_per_sample"); ids != message.end() && ids->is_number()) {
    data.ids_per_sample = ids->get<double>();
  }
  return data;
}

const char* StopSignalName(int signal) {
  return signal == SIGINT    ? "SIGINT"
         : signal == SIGTERM ? "SIGTERM"
         : signal == SIGUSR1 ? "SIGUSR1"
                             : "a stop request";
}

absl::Status StoppedJobStatus(const OracleRoleStats& oracle, const CheckpointOptions& checkpoint) {
  const char* signal = StopSignalName(oracle.stop_signal);
  const CheckpointStats& saved = oracle.checkpoint;
  // A stop after the last iteration: the training is complete; what was skipped is said.
  const std::string at = oracle.stopped_after_training
                             ? absl::StrFormat(
                                   "after the training ended at iteration %d (the rest of the "
                                   "evaluation and the parameter collection skipped)",
                                   oracle.stopped_at)
                             : absl::StrFormat("at iteration %d", oracle.stopped_at);
  if (saved.last.empty() && saved.resumed_from.empty()) {
    return absl::CancelledError(
        absl::StrFormat("stopped by %s %s; nothing saved (%s)", signal, at,
                        checkpoint.dir.empty() ? "no --checkpoint-dir" : "no iteration ran"));
  }
  return absl::CancelledError(
      absl::StrFormat("stopped by %s %s; resume with --resume %s (checkpoint %s)%s", signal, at,
                      checkpoint.dir.empty() ? saved.resumed_from : checkpoint.dir,
                      saved.last.empty() ? saved.resumed_from : saved.last,
                      oracle.stopped_after_training ? " to run them" : ""));
}

}  // namespace bagpipe
