// One set of options for a whole Bagpipe job, shared by `bagpipe train`, C++ programs and the
// Python package: what is read (data source, batch size, iterations, held-out tail), how the job
// is laid out (trainers, servers, device, emulated link), the cache and the oracle (policy,
// capacity, lookahead, queue depths), the embeddings and both optimizers.
//
// The runtime's components each take their own options (PlannerOptions for the oracle,
// TrainerOptions for every trainer, OracleRoleOptions, ServerOptions); several of those must
// agree (the planner's trainer count and capacity with the layout and the caches, the row
// initialiser's record size with the optimizer...). A JobConfig is the one place they are set:
// Resolve() validates it and derives every component's options from it, so they agree by
// construction, and ValidateJobOptions() rejects a JobOptions assembled by hand whose parts
// disagree. Errors name the options the way `bagpipe train` spells them ("--cache-rows"); a
// Python Config field has the same name with underscores (cache_rows).
#ifndef BAGPIPE_TRAINER_HOOKS_JOB_CONFIG_H_
#define BAGPIPE_TRAINER_HOOKS_JOB_CONFIG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/device.h"
#include "core/optimizer.h"
#include "data/source.h"
#include "nlohmann/json.hpp"
#include "oracle/planner.h"
#include "sync/transport.h"
#include "trainer_hooks/job.h"

namespace bagpipe {

struct JobConfig {
  // --- data (OpenJobData) ---------------------------------------------------------------
  // A source name (data/source.h: synthetic[:k=v,...], criteo:PATH, csv:PATH, bin:PATH), or
  // empty when the caller supplies the batch streams and the schema itself.
  std::string data = "synthetic";
  SourceOptions source;
  int64_t batch_size = 1024;  // global batch: the samples of all trainers at one iteration
  int64_t iterations = 0;     // global batches to train; 0: `epochs` passes over the data
  int epochs = 1;
  double eval_fraction = 0;  // held-out tail of the data, in [0, 1)

  // --- layout ---------------------------------------------------------------------------
  // 0: one trainer in the embedded job; under mpirun, the world size - 1 - servers (a nonzero
  // value must then equal it).
  int trainers = 0;
  int servers = 1;
  Backend device = Backend::kCpu;
  LinkModel server_link;  // embedded only: emulated network to the servers
  absl::Duration peer_timeout = absl::Seconds(120);

  // --- cache and oracle -------------------------------------------------------------------
  CachePolicy cache = CachePolicy::kOracle;
  // Rows of each trainer's cache. 0: a fifth of all rows, at least four local batches' ids,
  // at most all rows.
  // kDevice ignores it (the whole tables).
  int64_t cache_rows = 0;
  // The oracle's window in batches; the reactive policies (lru, lfu, off, device) plan one
  // batch at a time whatever it is.
  int lookahead = 20;
  int prefetch_depth = 4;
  int plan_queue_depth = 8;       // unconsumed plans per trainer
  int64_t writeback_horizon = 0;  // 0: kDefaultWritebackHorizon
  int oracle_split_parts = 1;     // PlannerOptions::split_parts (one trainer, not kDevice)
  int64_t oracle_split_min_rows = PlannerOptions{}.split_min_rows;

  // --- embeddings and optimizers ----------------------------------------------------------
  int dim = 16;
  // The embedding rows' optimizer. eps and initial_accumulator matter to the Adagrad kinds
  // (torch.optim.Adagrad's defaults are eps 1e-10 and initial_accumulator_value 0).
  OptimizerConfig optimizer = {OptimizerKind::kAdagrad, 0.05f, 1e-8f, 0.0f};
  // The dense model's optimizer: each unset field is the embedding optimizer's (row-wise
  // Adagrad becomes Adagrad: dense parameters have no rows). A set value is used as given, 0
  // included.
  std::optional<OptimizerKind> dense_optimizer;
  std::optional<float> dense_lr;
  std::optional<float> dense_eps;
  std::optional<float> dense_initial_accumulator;
  uint64_t seed = 1;  // parameter initialisation (rows and dense model)
  // Bit-identical results run to run and across cache modes (fixed reduction orders).
  bool deterministic = false;
  // Gather every parameter at rank 0 after training (fingerprint, dumps).
  bool collect_parameters = true;

  // --- checkpoints (trainer_hooks/checkpoint.h) -------------------------------------------
  std::string checkpoint_dir;    // "": none
  int64_t checkpoint_every = 0;  // 0: only at the end and at a stop
  // checkpoint_every was set (a flag, a Python Config attribute): a resumed job keeps it, 0
  // included, instead of taking the checkpoint's.
  bool checkpoint_every_given = false;
  int keep_checkpoints = 2;  // complete checkpoints kept, the newest (0: all)
  // DIR (its latest complete checkpoint) or DIR/ckpt-K; implies checkpoint_dir DIR and the
  // checkpoint's checkpoint_every unless they are set.
  std::string resume;

  // The dense model's optimizer after defaults (see dense_optimizer).
  OptimizerConfig DenseOptimizer() const;

  // Checks what can be checked without the data: ranges, and options that contradict each
  // other. The error names every option involved and its value.
  absl::Status Validate() const;

  // Validates, checks the limits that depend on the machine (trainer_hooks/job_limits.h: the
  // oracle's window, an embedded job's threads, an emulated link) and derives every
  // component's options for data of `schema`. `world_size` > 0:
  // the job runs under mpirun with that many ranks (the trainers follow from it).
  // `ids_per_sample` > 0: the data's mean sparse ids per sample over all tables
  // (JobData::ids_per_sample), which the oracle's window grows with; otherwise a synthetic
  // spec's pooling says it, and other data count one id per table. Every rank of a job must
  // pass the same value (they then decide the same).
  absl::StatusOr<JobOptions> Resolve(const Schema& schema, int world_size = 0,
                                     double ids_per_sample = -1) const;

  // The options as JSON (summary.json): every field, enums by name.
  nlohmann::json ToJson() const;
};

// Checks that the parts of a JobOptions agree with each other (the planner's trainers, policy
// and capacity with the layout and the trainers' caches; the row initialiser with the dim, the
// optimizer and the schema) — for JobOptions assembled without JobConfig::Resolve. Job::Start
// calls it.
absl::Status ValidateJobOptions(const JobOptions& options);

// The one line a stopped job (JobResult::oracle.stopped_at >= 0) ends with: what stopped it,
// at which iteration, and how to resume (--resume DIR and the checkpoint), as a Cancelled error.
absl::Status StoppedJobStatus(const OracleRoleStats& oracle, const CheckpointOptions& checkpoint);

// Default cache rows: a fifth of all rows, at least four local batches' worth of ids,
// at most all rows.
int64_t DefaultCacheRows(const Schema& schema, int64_t batch_size, int trainers);

// The data of a job opened from config.data.
struct JobData {
  Schema schema;  // exact table sizes (dictionary-encoded text is scanned once for them)
  std::string description;
  // Null unless `stream` was set (rank 0 reads the data; other ranks only need the schema).
  std::unique_ptr<BatchStream> train;
  std::unique_ptr<BatchStream> eval;  // null without eval_fraction
  // For progress bars (on every rank): the samples of one training epoch and of the held-out
  // tail where they are known without a pass of their own (the scan of dictionary-encoded
  // text, the count for eval_fraction, a binary file's header), else -1.
  int64_t train_samples = -1;
  int64_t eval_samples = -1;
  // Rank 0: the samples of one epoch of the whole source, before --max-samples (and
  // eval_fraction), where known without reading more of it than the job does, else -1
  // (IdentityContext::source_samples).
  int64_t source_samples = -1;
  // For JobConfig::Resolve's memory check (on every rank): the mean sparse ids per sample over
  // all tables of one epoch of the whole data where known without a pass of its own (a binary
  // file's header, the scan of dictionary-encoded text), else -1.
  double ids_per_sample = -1;
};

// Wraps a source for display while it is read (e.g. a progress bar) from where it stands; `label`
// says what the read is for, and `samples` how many samples it reads, where known (-1: one pass
// to the end of the source). May be null.
using SourceWrapper = std::function<std::unique_ptr<SampleSource>(
    std::unique_ptr<SampleSource> source, const std::string& label, int64_t samples)>;

// Opens config.data: the schema, and with `stream` the training batches (the first
// 1 - eval_fraction of the data, `epochs` passes or endless when `iterations` is set) and the
// held-out tail. `stop_requested` (may be empty) is polled during the passes over the whole data
// before training (the scan of dictionary-encoded text, the count for eval_fraction): a stop
// there ends it with a Cancelled error (the stopped line). REQUIRES: config.data is not empty.
absl::StatusOr<JobData> OpenJobData(const JobConfig& config, bool stream,
                                    const SourceWrapper& wrap = nullptr,
                                    const StopPoll& stop_requested = nullptr);

// OpenJobData for a job whose ranks are spread over `transport` (null: one process, which opens
// the data as OpenJobData(config, true, ...)). Only rank 0 opens and streams the data: it sends
// every other rank the schema, the data's description, sample counts and ids per sample
// (kTagSchema), or the error that ended
// its opening (with its code: a stop there ends every rank as a stop), so that the other ranks
// need no access to the data and a dictionary-encoded file is scanned once per job, not once
// per rank. The other ranks wait for that message as long as rank 0 is alive (the transport's
// liveness watch ends the job otherwise). A stop requested on one of them (`stop_requested`,
// polled every 100 ms) is sent to rank 0 as a stop request (kTagStopRequest): rank 0 polls for
// those during its passes over the data (which then end every rank with its Cancelled error),
// and after them the oracle does (a stop at the first iteration).
absl::StatusOr<JobData> OpenJobDataOnRankZero(const JobConfig& config, Transport* transport,
                                              const SourceWrapper& wrap = nullptr,
                                              const StopPoll& stop_requested = nullptr);

// "SIGINT", "SIGTERM", "SIGUSR1", or "a stop request" for another signal number.
const char* StopSignalName(int signal);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_JOB_CONFIG_H_
