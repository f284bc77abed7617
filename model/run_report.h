// What a training run leaves at rank 0, the same for `bagpipe train` and the Python package
// (examples/dlrm_pytorch.py): every parameter streamed into the fingerprint and, if asked,
// DIR/params.bin (trainer_hooks/param_dump.h), and summary.json — the options, throughput, cache
// and exchange counters, the loop's loss, held-out log loss and AUC, every trainer's and server's
// statistics and the parameter fingerprint — so `bagpipe compare` reads runs of either kind.
//
// The loop's figures come from trainer 0's TrainerOutcome::info: "iterations", "seconds",
// "train_loss", "time_ms", and every trainer's "samples"; held-out predictions and labels from
// every outcome.
#ifndef BAGPIPE_MODEL_RUN_REPORT_H_
#define BAGPIPE_MODEL_RUN_REPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "trainer_hooks/job.h"
#include "trainer_hooks/job_config.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {

struct RunOutputs {
  std::string summary_json;  // path of summary.json ("" : none)
  std::string dump_params;   // directory of params.bin ("" : fingerprint only), created
};

// Not thread-safe; used at rank 0 only.
class RunRecorder {
 public:
  // `model` describes the dense model (e.g. {"model": "dlrm", "bottom": "13-64-16", "top":
  // "64-32-1"}); it goes into the params.bin header and summary.json.
  static absl::StatusOr<std::unique_ptr<RunRecorder>> Create(const JobConfig& config,
                                                             const JobOptions& options,
                                                             nlohmann::json model,
                                                             RunOutputs outputs);
  // Where Job::Finish sends the parameters. Valid while the recorder lives.
  ParamSink sink();
  // After Job::Finish: completes params.bin, builds the summary, writes it if asked and returns
  // it. `data` describes the data source; `mpirun`: the job ran under mpirun.
  absl::StatusOr<nlohmann::json> Finish(const JobResult& result, const std::string& data,
                                        bool mpirun);
  // After Finish: the run resumed a checkpoint at the job's end (no iteration trained) and kept
  // the summary.json already where it would write its own, the finished run's (same parameters,
  // its iterations ending at the checkpoint's), adding only this run's parameter dump.
  bool kept_summary() const { return kept_summary_; }
  // After Finish: why params.bin could not be written (the summary, written all the same, then
  // names no "params" but a "params_error"); OK otherwise. The caller reports the results, then
  // this error.
  absl::Status dump_status() const;

 private:
  RunRecorder() = default;
  JobConfig config_;
  JobOptions options_;
  nlohmann::json model_;
  RunOutputs outputs_;
  std::unique_ptr<ParamWriter> writer_;
  bool kept_summary_ = false;
};

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_RUN_REPORT_H_
