#include "model/run_report.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/json_fields.h"
#include "core/metrics.h"
#include "core/status.h"
#include "model/eval_metrics.h"
#include "trainer_hooks/job.h"

namespace bagpipe {

absl::StatusOr<std::unique_ptr<RunRecorder>> RunRecorder::Create(const JobConfig& config,
                                                                 const JobOptions& options,
                                                                 nlohmann::json model,
                                                                 RunOutputs outputs) {
  std::unique_ptr<RunRecorder> recorder(new RunRecorder());
  recorder->config_ = config;
  recorder->options_ = options;
  recorder->model_ = std::move(model);
  recorder->outputs_ = std::move(outputs);
  const std::string& dir = recorder->outputs_.dump_params;
  if (!dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dump-params ", dir, ": cannot create: ", error.message()));
    }
  }
  const OptimizerKind kind = options.trainer.sparse_optimizer.kind;
  nlohmann::json header = {{"dim", options.trainer.dim},
                           {"optimizer", std::string(OptimizerName(kind))},
                           {"schema", options.oracle.planner.schema.ToJson()}};
  for (const auto& [key, value] : recorder->model_.items()) {
    if (key != "model") header[key] = value;
  }
  ASSIGN_OR_RETURN(recorder->writer_, ParamWriter::Create(dir, std::move(header),
                                                          RecordFloats(kind, options.trainer.dim)));
  return recorder;
}

ParamSink RunRecorder::sink() {
  ParamSink sink;
  sink.dense = [this](const std::vector<float>& dense) { return writer_->AddDense(dense); };
  sink.row = [this](RowId row, const float* record) { return writer_->AddRow(row, record); };
  return sink;
}

absl::StatusOr<nlohmann::json> RunRecorder::Finish(const JobResult& result, const std::string& data,
                                                   bool mpirun) {
  ASSIGN_OR_RETURN(const std::string sha, writer_->Finish());
  const JobLayout& layout = options_.layout;
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
  if (predictions.size() != labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the trainers returned ", predictions.size(),
                                                   " held-out predictions for ", labels.size(),
                                                   " labels"));
  }
  // Without the private-row optimisation every trainer would send the gradient of every row it
  // touched to every other trainer (as a dense all-to-all of touched rows does).
  const double all_rows_exchange_bytes = static_cast<double>(total.unique_rows) *
                                         options_.trainer.dim * sizeof(float) *
                                         (layout.trainers - 1);
  const nlohmann::json info =
      result.trainers.empty() ? nlohmann::json::object() : result.trainers.at(0).info;
  // A loop that reports no "iterations" (a user's own loop may pass no info) gets the count the
  // runtime kept itself: the iterations trainer 0 began.
  const int64_t iterations =
      info.contains("iterations")
          ? info.value("iterations", int64_t{0})
          : (result.trainers.empty() ? 0 : result.trainers.at(0).stats.iterations);
  // Figures a loop did not report (a user's loop may pass no info) are null, not 0: `compare`
  // shows them as "-" rather than as a measurement.
  int64_t samples = 0;
  bool samples_reported = false;
  for (const TrainerOutcome& outcome : result.trainers) {
    samples += outcome.info.value("samples", int64_t{0});
    samples_reported |= outcome.info.contains("samples");
  }
  const double train_seconds = info.value("seconds", 0.0);
  const bool seconds_reported = info.contains("seconds");
  const OptimizerConfig& sparse = config_.optimizer;
  const OptimizerConfig dense = config_.DenseOptimizer();
  nlohmann::json summary = {
      {"data", data},
      {"cache", std::string(CachePolicyName(config_.cache))},
      {"cache_rows", options_.trainer.cache_rows},
      {"lookahead", options_.oracle.planner.lookahead},
      {"oracle_split_parts", config_.oracle_split_parts},
      {"trainers", layout.trainers},
      {"servers", layout.servers},
      {"device", std::string(BackendName(config_.device))},
      {"mode", mpirun ? "mpirun" : "embedded"},
      {"server_link", config_.server_link.ToString()},
      {"batch_size", config_.batch_size},
      {"optimizer", std::string(OptimizerName(sparse.kind))},
      {"lr", sparse.learning_rate},
      {"eps", sparse.eps},
      {"initial_accumulator", sparse.initial_accumulator},
      {"dense_optimizer", std::string(OptimizerName(dense.kind))},
      {"dense_lr", dense.learning_rate},
      {"dense_eps", dense.eps},
      {"dense_initial_accumulator", dense.initial_accumulator},
      {"seed", config_.seed},
      {"deterministic", config_.deterministic},
      {"dim", options_.trainer.dim},
      {"iterations", iterations},
      {"samples", samples_reported ? nlohmann::json(samples) : nlohmann::json(nullptr)},
      {"train_seconds", seconds_reported ? nlohmann::json(train_seconds) : nlohmann::json(nullptr)},
      {"job_seconds", result.seconds},
      {"samples_per_s", !samples_reported || !seconds_reported ? nlohmann::json(nullptr)
                        : train_seconds > 0 ? nlohmann::json(samples / train_seconds)
                                            : nlohmann::json(0.0)},
      {"ms_per_iteration",
       !seconds_reported ? nlohmann::json(nullptr)
                         : nlohmann::json(iterations > 0 ? 1e3 * train_seconds / iterations : 0.0)},
      // null where no iteration was trained (a resume at the job's last iteration) or the loop
      // reported no loss.
      {"train_loss", info.contains("train_loss") && info["train_loss"].is_number()
                         ? info["train_loss"]
                         : nlohmann::json(nullptr)},
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
  for (const auto& [key, value] : model_.items()) summary[key] = value;
  summary["config"] = config_.ToJson();
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
  if (!writer_->file_error().ok()) {
    summary["params_error"] = std::string(dump_status().message());
  } else if (!outputs_.dump_params.empty()) {
    // Absolute: `bagpipe compare` reads it from anywhere (relative to where the run ran, it
    // named another file from elsewhere).
    const std::filesystem::path params = std::filesystem::path(outputs_.dump_params) / "params.bin";
    std::error_code error;
    const std::filesystem::path absolute = std::filesystem::absolute(params, error);
    summary["params"] = (error ? params : absolute.lexically_normal()).string();
  }
  if (!predictions.empty()) summary["eval"] = Evaluate(predictions, labels).ToJson();
  kept_summary_ = false;
  if (outputs_.summary_json.empty()) return summary;
  // A resumed job with no iteration left (its checkpoint is at the job's end) has no training
  // figures: the summary of the run that trained to there, where this one would go, stays (with
  // this run's parameter dump, if it wrote one). Only that run's: its parameters are these, and
  // its iterations end at the checkpoint's.
  const int64_t first = result.oracle.checkpoint.first_iteration;
  std::error_code error;
  // Read only from a regular file (a FIFO would block the job here; WriteJsonFile refuses it).
  if (outputs_.summary_json != "-" && iterations == 0 && first > 0 &&
      std::filesystem::is_regular_file(
          std::filesystem::symlink_status(outputs_.summary_json, error))) {
    std::ifstream in(outputs_.summary_json, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json earlier = in ? ParseUntrustedJson(text.str()) : nlohmann::json();
    // -1 unless a non-negative JSON integer below 2^62 (their sum cannot overflow).
    auto count = [&](const char* key) {
      if (!earlier.contains(key) || !earlier[key].is_number_integer()) return int64_t{-1};
      const absl::StatusOr<int64_t> value = JsonToInt64(earlier[key], key);
      return value.ok() && *value >= 0 && *value < (int64_t{1} << 62) ? *value : int64_t{-1};
    };
    if (earlier.is_object() && earlier.contains("params_sha256") &&
        earlier["params_sha256"].is_string() && earlier["params_sha256"] == sha &&
        count("first_iteration") >= 0 && count("iterations") > 0 &&
        count("first_iteration") + count("iterations") == first) {
      kept_summary_ = true;
      // This run's parameter dump, if it wrote one (or why it failed), replaces the finished
      // run's entry.
      bool changed = false;
      const bool dumped = !outputs_.dump_params.empty() || summary.contains("params_error");
      for (const char* key : {"params", "params_error"}) {
        if (dumped &&
            (summary.contains(key) ? !earlier.contains(key) || earlier[key] != summary[key]
                                   : earlier.contains(key))) {
          if (summary.contains(key)) {
            earlier[key] = summary[key];
          } else {
            earlier.erase(key);
          }
          changed = true;
        }
      }
      if (changed) RETURN_IF_ERROR(WriteJsonFile(outputs_.summary_json, earlier));
      return summary;
    }
  }
  RETURN_IF_ERROR(WriteJsonFile(outputs_.summary_json, summary));
  return summary;
}

absl::Status RunRecorder::dump_status() const {
  if (writer_->file_error().ok()) return absl::OkStatus();
  return absl::Status(
      writer_->file_error().code(),
      absl::StrCat("--dump-params ", outputs_.dump_params, ": ", writer_->file_error().message(),
                   " (no params.bin was left; the run's results and fingerprint are in its "
                   "summary",
                   options_.checkpoint.dir.empty()
                       ? ")"
                       : absl::StrCat("; --resume ", options_.checkpoint.dir,
                                      " with another --out and --dump-params writes the "
                                      "parameters again without training)")));
}

}  // namespace bagpipe
