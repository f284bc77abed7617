#include "apps/train_flags.h"

#include <cmath>
#include <filesystem>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/excerpt.h"
#include "core/metrics.h"
#include "core/status.h"
#include "model/dense_model.h"
#include "trainer_hooks/checkpoint.h"

namespace bagpipe {

const char kTrainFooter[] =
    "Cache modes: oracle (Bagpipe: lookahead planning, prefetch, Belady eviction), lru and lfu\n"
    "(reactive caches planned the same way, as TorchRec/FBGEMM), off (every row fetched from\n"
    "the servers every iteration and written back after it), device (whole tables in trainer\n"
    "memory, no servers on the critical path: the upper bound). All modes compute the same\n"
    "synchronous training: with --deterministic their parameters are bit-identical.\n"
    "Launch under mpirun to run distributed: rank 0 = oracle, ranks 1..S = servers, the rest\n"
    "trainers (--trainers is then implied by the world size).\n";

void AddTrainFlags(CLI::App* app, TrainFlags* flags) {
  JobConfig& config = flags->config;
  AddDataFlags(app, &flags->data);
  app->add_option("--batch-size,-b", config.batch_size, "global batch size (all trainers)")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--iterations,-n", config.iterations,
                  "global batches to train (0: --epochs passes over the data)")
      ->capture_default_str()
      ->check(kNonNegative);
  app->add_option("--epochs", config.epochs, "passes over the data when --iterations is 0")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--cache", flags->cache, "oracle, lru, lfu, off or device")
      ->capture_default_str();
  app->add_option("--cache-rows", config.cache_rows,
                  "rows each trainer's cache holds (0: a fifth of all rows, at least four "
                  "local batches, at most all rows)")
      ->capture_default_str()
      ->each([flags](const std::string&) { flags->cache_rows_given = true; });
  app->add_option(
         "--lookahead,-L", config.lookahead,
         "oracle window in batches (Belady within it; L >= 20 is within ~1% of the offline optimum "
         "on skewed data, and the first plan waits for L batches to be read)")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--oracle-split-parts", config.oracle_split_parts,
                  "with one trainer, plan each table above --oracle-split-min-rows rows as this "
                  "many parts, each a task of its own: more of the planner runs in parallel on "
                  "many cores, for ~10% more work in all (leave at 1 below ~8 cores; see "
                  "bench/RESULTS.md)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app->add_option("--oracle-split-min-rows", config.oracle_split_min_rows,
                  "tables above this many rows are split (--oracle-split-parts)")
      ->capture_default_str()
      ->check(kNonNegative);
  app->add_option("--optimizer", flags->optimizer,
                  "optimizer of the embedding rows: sgd, adagrad or rowwise-adagrad")
      ->capture_default_str();
  app->add_option("--lr", config.optimizer.learning_rate, "learning rate")->capture_default_str();
  app->add_option("--eps", config.optimizer.eps,
                  "Adagrad: added to sqrt(accumulator) (torch.optim.Adagrad: 1e-10)")
      ->capture_default_str()
      ->each([flags](const std::string&) { flags->eps_given = true; });
  app->add_option("--initial-accumulator", config.optimizer.initial_accumulator,
                  "Adagrad: the accumulator's initial value (torch: initial_accumulator_value)")
      ->capture_default_str()
      ->each([flags](const std::string&) { flags->initial_accumulator_given = true; });
  app->add_option("--dense-optimizer", flags->dense_optimizer,
                  "optimizer of the dense MLPs (default: --optimizer; rowwise-adagrad "
                  "means adagrad)");
  app->add_option_function<float>(
      "--dense-lr", [flags](const float& value) { flags->config.dense_lr = value; },
      "dense learning rate (default: --lr; 0 freezes the dense model)");
  app->add_option_function<float>(
      "--dense-eps", [flags](const float& value) { flags->config.dense_eps = value; },
      "dense Adagrad eps (default: --eps)");
  app->add_option_function<float>(
      "--dense-initial-accumulator",
      [flags](const float& value) { flags->config.dense_initial_accumulator = value; },
      "dense Adagrad initial accumulator (default: --initial-accumulator)");
  app->add_option("--seed", config.seed, "parameter initialisation seed")
      ->capture_default_str()
      ->check(kUint64);
  app->add_flag("--deterministic", config.deterministic,
                "bit-identical results run to run and across cache modes (single-threaded BLAS)");
  app->add_option("--dim", config.dim, "embedding dimension")
      ->capture_default_str()
      ->check(kPositive);
  // Layer lists are checked as flags (a usage error), not only when the model is built.
  const CLI::Validator layers(
      [](std::string& value) -> std::string {
        const absl::StatusOr<std::vector<int>> parsed = ParseLayers(value);
        return parsed.ok() ? "" : std::string(parsed.status().message());
      },
      "LAYERS");
  app->add_option("--bottom", flags->bottom,
                  "bottom MLP sizes, input first, last = --dim (default DENSE-64-DIM)")
      ->check(layers)
      ->each([flags](const std::string&) { flags->bottom_given = true; });
  app->add_option("--top", flags->top, "top MLP sizes after the interaction, last = 1")
      ->capture_default_str()
      ->check(layers)
      ->each([flags](const std::string&) { flags->top_given = true; });
  app->add_option("--model", flags->model,
                  "dlrm (the reference DLRM) or logreg (embedding-only logistic regression over "
                  "the pooled embeddings: measures the runtime, not the MLPs; CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"dlrm", "logreg"}));
  app->add_option("--trainers,-T", config.trainers,
                  "trainers (embedded; default 1; under mpirun implied by the world size)")
      ->check(CLI::Range(1, 64));
  app->add_option("--servers,-S", config.servers, "embedding servers")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--device", flags->device,
                  "cpu, cuda, or auto (cuda where a GPU is usable, else cpu)")
      ->capture_default_str();
  app->add_option("--server-link", flags->server_link,
                  "embedded only: emulate this network link to the servers, e.g. "
                  "\"25Gbit/s,20us\" (none: memory speed)")
      ->capture_default_str();
  app->add_option("--eval-fraction", config.eval_fraction,
                  "hold out this tail fraction of the data; report log loss and AUC on it")
      ->capture_default_str();
  app->add_option("--metrics-out", flags->metrics_out, "interval metrics as JSON lines");
  app->add_option("--metrics-interval", flags->metrics_interval, "iterations per metrics line")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--summary-json", flags->summary_json, "final figures as JSON");
  app->add_option("--dump-params", flags->dump_params,
                  "write every parameter to DIR/params.bin (see bagpipe compare)");
  app->add_option("--out", flags->out,
                  "run directory: metrics.jsonl and summary.json go there unless named");
  app->add_option("--prefetch-depth", config.prefetch_depth, "iterations prefetched ahead")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--plan-queue-depth", config.plan_queue_depth, "plans queued per trainer")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--writeback-horizon", config.writeback_horizon,
                  "iterations a server remembers write-back stamps (0: default)")
      ->capture_default_str();
  app->add_option("--peer-timeout", flags->peer_timeout_s,
                  "seconds without a message before a peer counts as dead (at start-up, a "
                  "rank not set up within half of it)")
      ->capture_default_str();
  app->add_option("--checkpoint-dir", config.checkpoint_dir,
                  "write checkpoints (DIR/ckpt-ITERATION) here: every --checkpoint-every "
                  "iterations, at the end, and on SIGINT/SIGTERM/SIGUSR1");
  app->add_option("--checkpoint-every", config.checkpoint_every,
                  "iterations between checkpoints (0: only at the end and on a stop; a resume "
                  "keeps the checkpoint's unless given)")
      ->capture_default_str()
      ->each([flags](const std::string&) { flags->config.checkpoint_every_given = true; });
  app->add_option("--keep-checkpoints", config.keep_checkpoints,
                  "complete checkpoints kept, the newest (0: all)")
      ->capture_default_str()
      ->each([flags](const std::string&) { flags->keep_checkpoints_given = true; });
  app->add_option("--resume", config.resume,
                  "resume from DIR (its latest complete checkpoint) or DIR/ckpt-K; implies "
                  "--checkpoint-dir DIR and the checkpoint's --checkpoint-every unless given");
  // A path or spec given empty (a script's unset variable: --resume "$CKPT") is refused rather
  // than taken for "not given": a resume would silently train from scratch.
  const CLI::Validator not_empty(
      [](std::string& value) -> std::string {
        return value.empty() ? "an empty value (an unset variable?) names nothing" : "";
      },
      "");
  for (const char* name : {"--server-link", "--metrics-out", "--summary-json", "--dump-params",
                           "--out", "--checkpoint-dir", "--resume"}) {
    app->get_option(name)->check(not_empty);
  }
}

namespace {

// True if `path` is `dir` or lies below it (both made absolute, symbolic links resolved as far as
// they exist).
bool PathWithin(const std::string& path, const std::string& dir) {
  std::error_code e1, e2;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, e1);
  const std::filesystem::path d = std::filesystem::weakly_canonical(dir, e2);
  if (e1 || e2) return false;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

// The job's outputs stay out of its checkpoint directory, which holds checkpoints only: a file
// there makes every later --resume refuse the directory as another job's.
absl::Status OutputsOutsideCheckpoints(const TrainFlags& flags) {
  const JobConfig& config = flags.config;
  std::vector<std::string> dirs;
  if (!config.checkpoint_dir.empty()) dirs.push_back(config.checkpoint_dir);
  if (!config.resume.empty()) {
    dirs.push_back(config.resume);
    // --resume DIR/ckpt-K writes next to it, in DIR.
    std::error_code error;
    if (std::filesystem::exists(std::filesystem::path(config.resume) / kManifestName, error)) {
      dirs.push_back(CheckpointParent(config.resume));
    }
  }
  const std::pair<const char*, const std::string*> outputs[] = {
      {"--out", &flags.out},
      {"--dump-params", &flags.dump_params},
      {"--metrics-out", &flags.metrics_out},
      {"--summary-json", &flags.summary_json}};
  for (const std::string& dir : dirs) {
    if (dir.empty()) continue;
    for (const auto& [name, path] : outputs) {
      if (path->empty() || *path == "-" || !PathWithin(*path, dir)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          name, " ", Excerpt(*path), " lies in the checkpoint directory ", Excerpt(dir),
          ", which holds checkpoints only (a later --resume would "
          "refuse it): write it elsewhere"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FinishTrainFlags(TrainFlags* flags) {
  JobConfig& config = flags->config;
  RETURN_IF_ERROR(OutputsOutsideCheckpoints(*flags));
  if (flags->keep_checkpoints_given && config.checkpoint_dir.empty() && config.resume.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--keep-checkpoints ", config.keep_checkpoints,
        " needs --checkpoint-dir (or --resume): without one no checkpoint is written"));
  }
  // Outputs: --out DIR sets the defaults of the others.
  if (!flags->out.empty()) {
    std::error_code error;
    std::filesystem::create_directories(flags->out, error);
    if (error) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out ", flags->out, ": cannot create the directory: ", error.message()));
    }
    const std::filesystem::path dir(flags->out);
    if (flags->metrics_out.empty()) flags->metrics_out = (dir / "metrics.jsonl").string();
    if (flags->summary_json.empty()) flags->summary_json = (dir / "summary.json").string();
  }
  // Two outputs on one file would overwrite each other (--dump-params DIR writes DIR/params.bin).
  const std::pair<const char*, std::string> files[] = {
      {"--metrics-out", flags->metrics_out},
      {"--summary-json", flags->summary_json},
      {"--dump-params", flags->dump_params.empty()
                            ? std::string()
                            : (std::filesystem::path(flags->dump_params) / "params.bin").string()}};
  for (size_t i = 0; i < std::size(files); ++i) {
    for (size_t j = i + 1; j < std::size(files); ++j) {
      const std::string& a = files[i].second;
      const std::string& b = files[j].second;
      if (a.empty() || b.empty()) continue;
      std::error_code e1, e2;
      const std::filesystem::path ca = std::filesystem::weakly_canonical(a, e1);
      const std::filesystem::path cb = std::filesystem::weakly_canonical(b, e2);
      if (a == b || (!e1 && !e2 && ca == cb)) {
        return absl::InvalidArgumentError(absl::StrCat(files[i].first, " and ", files[j].first,
                                                       " name the same file '", Excerpt(a),
                                                       "': each would overwrite the other"));
      }
    }
  }
  // The summary is written after the training: its directory is made now (as --out's and
  // --dump-params' are), and a path it cannot take fails now, not then.
  if (!flags->summary_json.empty()) {
    const std::filesystem::path parent = std::filesystem::path(flags->summary_json).parent_path();
    std::error_code error;
    if (!parent.empty() && !std::filesystem::exists(parent, error)) {
      std::filesystem::create_directories(parent, error);
    }
    RETURN_IF_ERROR(CheckOutputFile(flags->summary_json, "--summary-json"));
  }
  config.data = flags->data.data;
  config.source = flags->data.options;
  ASSIGN_OR_RETURN(config.cache, ParseCachePolicy(flags->cache));
  absl::StatusOr<OptimizerKind> sparse = ParseOptimizerKind(flags->optimizer);
  if (!sparse.ok()) return Annotate(sparse.status(), "--optimizer");
  config.optimizer.kind = *sparse;
  if (!flags->dense_optimizer.empty()) {
    absl::StatusOr<OptimizerKind> dense = ParseOptimizerKind(flags->dense_optimizer);
    if (!dense.ok()) return Annotate(dense.status(), "--dense-optimizer");
    config.dense_optimizer = *dense;
  }
  ASSIGN_OR_RETURN(config.device, ParseBackend(flags->device));
  ASSIGN_OR_RETURN(config.server_link, LinkModel::Parse(flags->server_link));
  // Seconds as given: NaN or infinity would become a duration JobConfig cannot tell apart from
  // a deliberate one.
  if (!(std::isfinite(flags->peer_timeout_s) && flags->peer_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--peer-timeout %g: must be a positive, finite number of seconds", flags->peer_timeout_s));
  }
  config.peer_timeout = absl::Seconds(flags->peer_timeout_s);
  if (config.peer_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--peer-timeout %g: below the nanosecond the timeouts count in", flags->peer_timeout_s));
  }
  return config.Validate();
}

}  // namespace bagpipe
