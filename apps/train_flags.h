// The flags of `bagpipe train`, shared with the Python package (bagpipe.parse_train_args, used by
// examples/dlrm_pytorch.py), so that a PyTorch loop takes exactly the same options, defaults and
// validation as the command. Everything about the job goes into a JobConfig
// (trainer_hooks/job_config.h); the model and the outputs stay beside it.
#ifndef BAGPIPE_APPS_TRAIN_FLAGS_H_
#define BAGPIPE_APPS_TRAIN_FLAGS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "apps/command.h"
#include "trainer_hooks/job_config.h"

namespace bagpipe {

struct TrainFlags {
  JobConfig config;  // complete after FinishTrainFlags
  DataFlags data;
  // Names parsed by FinishTrainFlags.
  std::string cache = "oracle";
  std::string optimizer = "adagrad";
  std::string dense_optimizer;  // empty: --optimizer
  std::string device = "cpu";
  std::string server_link = "none";
  double peer_timeout_s = 120;
  // The model.
  std::string model = "dlrm";
  std::string bottom;  // empty: DENSE-64-DIM
  std::string top = "64-32-1";
  // Given on the command line (--model logreg warns that it ignores them).
  bool bottom_given = false;
  bool top_given = false;
  // --keep-checkpoints given (it needs a checkpoint directory).
  bool keep_checkpoints_given = false;
  // Given on the command line: options that some configurations ignore (with a warning).
  bool cache_rows_given = false;
  bool eps_given = false;
  bool initial_accumulator_given = false;
  // Outputs.
  std::string metrics_out;
  int metrics_interval = 50;
  std::string summary_json;
  std::string dump_params;
  std::string out;
};

// Registers every flag of `bagpipe train` on `app`, bound to `flags`.
void AddTrainFlags(CLI::App* app, TrainFlags* flags);

// After parsing: parses the names (--cache, --optimizer, --device, --server-link...), points
// --metrics-out and --summary-json into --out DIR (created) unless named, fills flags->config
// and validates it (JobConfig::Validate). The error names the flag.
absl::Status FinishTrainFlags(TrainFlags* flags);

// Footer of `bagpipe train --help`: the cache modes and mpirun.
extern const char kTrainFooter[];

}  // namespace bagpipe

#endif  // BAGPIPE_APPS_TRAIN_FLAGS_H_
