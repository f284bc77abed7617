#include "model/dlrm_loop.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/device.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/timer.h"
#include "model/logreg_head.h"
#include "model/loop_state.h"

namespace bagpipe {
namespace {

// Per-iteration phase times of this trainer, in seconds, summed over an interval.
struct PhaseTimes {
  double wait = 0;              // plans and prefetched rows
  double boundary = 0;          // extract, write back, fill
  double lookup = 0;            // pooled gather (forward of the embedding bags)
  double forward_backward = 0;  // dense model
  double allreduce = 0;         // dense gradient all-reduce
  double optimizer = 0;         // dense optimizer step
  double reduce = 0;            // row-gradient reduction (backward of the embedding bags)
  double sync = 0;              // shared-row gradient exchange
  double apply = 0;             // sparse optimizer

  static PhaseTimes FromStats(const TrainerStats& s, double forward_backward, double optimizer) {
    PhaseTimes t;
    t.wait = s.wait_seconds;
    t.boundary = s.boundary_seconds;
    t.lookup = s.lookup_seconds;
    t.forward_backward = forward_backward;
    t.allreduce = s.allreduce_seconds;
    t.optimizer = optimizer;
    t.reduce = s.reduce_seconds;
    t.sync = s.sync_seconds;
    t.apply = s.apply_seconds;
    return t;
  }
  PhaseTimes Minus(const PhaseTimes& o) const {
    return {wait - o.wait,           boundary - o.boundary,
            lookup - o.lookup,       forward_backward - o.forward_backward,
            allreduce - o.allreduce, optimizer - o.optimizer,
            reduce - o.reduce,       sync - o.sync,
            apply - o.apply};
  }
  // Milliseconds per iteration over `iterations`.
  nlohmann::json ToJsonMs(int64_t iterations) const {
    const double k = iterations > 0 ? 1e3 / static_cast<double>(iterations) : 0;
    return {{"wait", wait * k},           {"boundary", boundary * k},
            {"lookup", lookup * k},       {"forward_backward", forward_backward * k},
            {"allreduce", allreduce * k}, {"optimizer", optimizer * k},
            {"reduce", reduce * k},       {"sync", sync * k},
            {"apply", apply * k}};
  }
};

// The loop's checkpoint state (model/loop_state.h): the dense parameters and optimizer state,
// and what the run's metrics file starts with (`metrics`: trainer 0's, else null), which a
// resumed job's restore leaves in *metrics_first_lines.
template <typename Head>
LoopState MakeLoopState(Head* model, int64_t* global_samples, const JsonLinesWriter* metrics,
                        std::optional<std::vector<int64_t>>* metrics_first_lines) {
  LoopState state;
  state.save = [model, global_samples, metrics]() -> absl::StatusOr<std::string> {
    DenseLoopState saved;
    RETURN_IF_ERROR(model->ReadParameters(&saved.parameters));
    RETURN_IF_ERROR(model->ReadOptimizerState(&saved.optimizer_state));
    saved.global_samples = *global_samples;
    if (metrics != nullptr) saved.metrics_first_lines = metrics->first_lines();
    // A diverged run fails here rather than leave a checkpoint nothing can train on from as
    // the newest one (the complete ones before it are kept).
    const absl::Status finite = CheckDenseLoopStateFinite(saved);
    if (!finite.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "training diverged: ", finite.message(),
          "; the checkpoint is not written (the newest complete one is kept); lower the "
          "learning rate (--lr, --dense-lr) or scale extreme dense values (e.g. log(C))"));
    }
    return EncodeDenseLoopState(saved);
  };
  state.restore = [model, global_samples,
                   metrics_first_lines](std::string_view bytes) -> absl::Status {
    ASSIGN_OR_RETURN(const DenseLoopState saved, DecodeDenseLoopState(bytes));
    std::vector<float> current;
    RETURN_IF_ERROR(model->ReadParameters(&current));
    if (saved.parameters.size() != current.size()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the checkpoint's dense model has %d parameters, this one %d (another --model, "
          "--bottom or --top?)",
          saved.parameters.size(), current.size()));
    }
    RETURN_IF_ERROR(model->WriteParameters(saved.parameters));
    RETURN_IF_ERROR(model->WriteOptimizerState(saved.optimizer_state));
    *global_samples = saved.global_samples;
    *metrics_first_lines = saved.metrics_first_lines;
    return absl::OkStatus();
  };
  return state;
}

// Times a phase of the loop's own device work (the dense forward/backward, the optimizer step)
// with timing events on the compute stream: GPU time on CUDA, the host clock on a synchronous
// CPU context. A few intervals are in flight; each is added once its end event completed
// (queries, no host synchronisation; Flush waits for the rest).
class PhaseEvents {
 public:
  absl::Status Init(const std::shared_ptr<DeviceContext>& context) {
    for (Interval& interval : intervals_) {
      ASSIGN_OR_RETURN(interval.begin, DeviceEvent::Create(context, /*timing=*/true));
      ASSIGN_OR_RETURN(interval.end, DeviceEvent::Create(context, /*timing=*/true));
    }
    return absl::OkStatus();
  }
  absl::Status Begin() {
    Interval& interval = intervals_[next_];
    RETURN_IF_ERROR(Collect(interval, /*wait=*/true));
    return interval.begin.Record(Stream::kCompute);
  }
  absl::Status End() {
    Interval& interval = intervals_[next_];
    next_ = (next_ + 1) % intervals_.size();
    RETURN_IF_ERROR(interval.end.Record(Stream::kCompute));
    interval.pending = true;
    return absl::OkStatus();
  }
  // Seconds of every interval collected so far (completed ones are collected first; `wait`:
  // all of them).
  absl::StatusOr<double> Seconds(bool wait) {
    for (Interval& interval : intervals_) RETURN_IF_ERROR(Collect(interval, wait));
    return seconds_;
  }

 private:
  struct Interval {
    DeviceEvent begin, end;
    bool pending = false;
  };
  absl::Status Collect(Interval& interval, bool wait) {
    if (!interval.pending) return absl::OkStatus();
    ASSIGN_OR_RETURN(const bool done, interval.end.Query());
    if (!done) {
      if (!wait) return absl::OkStatus();
      RETURN_IF_ERROR(interval.end.Synchronize());
    }
    ASSIGN_OR_RETURN(const double ms, DeviceEvent::ElapsedMs(interval.begin, interval.end));
    seconds_ += std::max(ms, 0.0) / 1e3;
    interval.pending = false;
    return absl::OkStatus();
  }
  std::array<Interval, 4> intervals_;
  size_t next_ = 0;
  double seconds_ = 0;
};

// The loop for any dense head with DenseModel's calling contract (DenseModel, LogRegHead).
template <typename Head>
absl::Status RunLoop(Trainer& trainer, Head* model, const DlrmLoopOptions& options,
                     TrainerOutcome* outcome) {
  const auto& context = trainer.context();
  const DenseModelConfig& config = options.model;
  const float lr = config.optimizer.learning_rate;
  const bool leader = trainer.id() == 0;
  Progress progress("train", options.total_iterations, leader && options.progress);

  DeviceArray<float> pooled_grad;
  LocalBatch batch;
  Stopwatch total_watch;
  Stopwatch interval_watch;
  double forward_backward_seconds = 0, optimizer_seconds = 0;
  PhaseEvents forward_backward_events, optimizer_events;
  RETURN_IF_ERROR(forward_backward_events.Init(context));
  RETURN_IF_ERROR(optimizer_events.Init(context));
  PhaseTimes interval_start;
  TrainerStats stats_start = trainer.stats();
  // Interval sums: loss, samples, unique rows, hits (summed over trainers at each report).
  double interval_loss = 0;
  int64_t interval_samples = 0, iterations = 0, samples = 0, interval_iterations = 0;
  double last_loss = 0;
  int64_t global_samples = 0;  // all trainers', through the last iteration (the same everywhere)

  // Checkpoints hold the dense replica (the same on every trainer) and the job-wide counters.
  std::optional<std::vector<int64_t>> metrics_first_lines;  // a resumed job's checkpoint's
  RETURN_IF_ERROR(trainer.SetLoopState(MakeLoopState(
      model, &global_samples, leader ? options.metrics : nullptr, &metrics_first_lines)));
  ASSIGN_OR_RETURN(const Iteration first_iteration, trainer.FirstIteration());
  if (leader && options.metrics != nullptr) {
    // A resumed job keeps the metrics of the iterations before its checkpoint, in the file of
    // the run it continues only.
    RETURN_IF_ERROR(
        options.metrics->Start(first_iteration > 0 ? first_iteration : -1, metrics_first_lines));
  }

  auto report = [&](bool final_report) -> absl::Status {
    const TrainerStats stats = trainer.stats();
    ASSIGN_OR_RETURN(forward_backward_seconds, forward_backward_events.Seconds(final_report));
    ASSIGN_OR_RETURN(optimizer_seconds, optimizer_events.Seconds(final_report));
    // In double: the counts stay exact (floats would round them above 2^24).
    double sums[4] = {interval_loss, static_cast<double>(interval_samples),
                      static_cast<double>(stats.unique_rows - stats_start.unique_rows),
                      static_cast<double>(stats.hits - stats_start.hits)};
    RETURN_IF_ERROR(trainer.AllReduce(sums, 4));
    // Every trainer sees the same sums, so all stop here together. Input is checked for
    // non-finite values when it is read; what remains is divergence.
    if (!std::isfinite(sums[0])) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "training diverged: the loss summed over iterations %d to %d is %f (not finite); "
          "lower the learning rate (--lr, --dense-lr) or scale extreme dense values (e.g. log(C))",
          first_iteration + iterations - interval_iterations + 1, first_iteration + iterations,
          sums[0]));
    }
    const double seconds = interval_watch.Seconds();
    const PhaseTimes now =
        PhaseTimes::FromStats(stats, forward_backward_seconds, optimizer_seconds);
    last_loss = sums[1] > 0 ? sums[0] / sums[1] : 0;
    if (leader) {
      const double samples_per_s = seconds > 0 ? sums[1] / seconds : 0;
      const double hit_rate = sums[2] > 0 ? sums[3] / sums[2] : 0;
      if (options.metrics != nullptr) {
        RETURN_IF_ERROR(options.metrics->Write(
            {{"kind", "train"},
             {"iteration", first_iteration + iterations},
             // The iterations the line covers: fewer than --metrics-interval at the end, and
             // after a resume from a checkpoint between two lines.
             {"iterations", interval_iterations},
             {"samples", global_samples},
             // No sample in the interval (a resume with no iteration left): no loss.
             {"loss", sums[1] > 0 ? nlohmann::json(last_loss) : nlohmann::json(nullptr)},
             {"samples_per_s", samples_per_s},
             {"hit_rate", hit_rate},
             {"seconds", total_watch.Seconds()},
             {"time_ms", now.Minus(interval_start).ToJsonMs(interval_iterations)},
             {"final", final_report}}));
      }
      progress.Update(first_iteration + iterations,
                      absl::StrFormat("loss %.4f  %.0f samples/s  hit %.1f%%", last_loss,
                                      samples_per_s, 100 * hit_rate));
    }
    interval_start = now;
    stats_start = stats;
    interval_loss = 0;
    interval_samples = 0;
    interval_iterations = 0;
    interval_watch.Reset();
    return absl::OkStatus();
  };

  while (true) {
    ASSIGN_OR_RETURN(bool more, trainer.BeginIteration(&batch));
    if (!more) break;
    if (first_iteration > 0 && iterations == 0) {
      // A resumed job's clocks start at its first iteration: rank 0 replays the data stream up
      // to the checkpoint first (seconds for a long job), which is no training time.
      total_watch.Reset();
      interval_watch.Reset();
      // Its bar starts at the checkpoint; its rate and ETA count its own iterations.
      progress.Resume(first_iteration);
    }
    ASSIGN_OR_RETURN(const float* pooled, trainer.LookupPooled());
    const size_t pooled_size =
        static_cast<size_t>(batch.num_samples) * batch.num_tables * config.dim;
    if (pooled_grad.size() < pooled_size) {
      ASSIGN_OR_RETURN(pooled_grad, DeviceArray<float>::Create(context, pooled_size));
    }
    const float loss_scale =
        batch.global_batch_size > 0 ? 1.0f / static_cast<float>(batch.global_batch_size) : 0.0f;
    RETURN_IF_ERROR(forward_backward_events.Begin());
    ASSIGN_OR_RETURN(double loss,
                     model->ForwardBackward(batch.dense, pooled, batch.labels, batch.num_samples,
                                            loss_scale, pooled_grad.data()));
    RETURN_IF_ERROR(forward_backward_events.End());
    // Diverged: said as such here, before the runtime refuses the non-finite gradients that come
    // with a non-finite loss (its message names the gradient, not the cause).
    if (!std::isfinite(loss)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "training diverged: the loss at iteration %d is %f (not finite); lower the learning "
          "rate (--lr, --dense-lr) or scale extreme dense values (e.g. log(C))",
          first_iteration + iterations + 1, loss));
    }
    // Dense gradients stay in device memory: NCCL on GPUs, the Transport all-reduce on CPUs.
    RETURN_IF_ERROR(trainer.AllReduceDevice(model->gradients(), model->num_parameters()));
    RETURN_IF_ERROR(optimizer_events.Begin());
    RETURN_IF_ERROR(model->Step(lr));
    RETURN_IF_ERROR(optimizer_events.End());
    RETURN_IF_ERROR(trainer.EndIteration(pooled_grad.data()));
    interval_loss += loss;
    interval_samples += batch.num_samples;
    samples += batch.num_samples;
    global_samples += batch.global_batch_size;
    ++iterations;
    ++interval_iterations;
    if (options.metrics_interval > 0 &&
        (first_iteration + iterations) % options.metrics_interval == 0) {
      RETURN_IF_ERROR(report(false));
    }
  }
  // Every trainer ran the same number of iterations, so all take part in the last report. A
  // resumed job with no iteration left reports nothing: the metrics it continues end with the
  // checkpoint's iteration already.
  if (interval_iterations > 0 || (iterations == 0 && first_iteration == 0)) {
    RETURN_IF_ERROR(report(true));
  }
  const double train_seconds = total_watch.Seconds();
  RETURN_IF_ERROR(trainer.Flush());
  progress.Finish(absl::StrFormat("%d iterations, final loss %.4f", iterations, last_loss));

  // Held-out evaluation with the trained parameters (its own bar: at a million held-out
  // samples it takes as long as a few thousand iterations).
  std::vector<float> probabilities;
  Progress eval_progress("evaluating", options.total_eval_batches, leader && options.progress,
                         "batches");
  int64_t eval_batches = 0;
  while (true) {
    ASSIGN_OR_RETURN(bool more, trainer.BeginEvalBatch(&batch));
    if (!more) break;
    eval_progress.Update(++eval_batches);
    ASSIGN_OR_RETURN(const float* pooled, trainer.LookupPooled());
    probabilities.resize(batch.num_samples);
    RETURN_IF_ERROR(
        model->Forward(batch.dense, pooled, nullptr, batch.num_samples, probabilities.data())
            .status());
    outcome->eval_predictions.insert(outcome->eval_predictions.end(), probabilities.begin(),
                                     probabilities.end());
    outcome->eval_labels.insert(outcome->eval_labels.end(), batch.labels_host,
                                batch.labels_host + batch.num_samples);
  }
  if (eval_batches > 0) eval_progress.Finish();
  RETURN_IF_ERROR(model->ReadParameters(&outcome->dense_parameters));
  ASSIGN_OR_RETURN(forward_backward_seconds, forward_backward_events.Seconds(/*wait=*/true));
  ASSIGN_OR_RETURN(optimizer_seconds, optimizer_events.Seconds(/*wait=*/true));
  const PhaseTimes totals =
      PhaseTimes::FromStats(trainer.stats(), forward_backward_seconds, optimizer_seconds);
  // A job that trained no iteration (resumed at its last) has no training loss.
  outcome->info["train_loss"] =
      iterations > 0 ? nlohmann::json(last_loss) : nlohmann::json(nullptr);
  outcome->info["iterations"] = iterations;
  outcome->info["samples"] = samples;
  outcome->info["seconds"] = train_seconds;
  outcome->info["time_ms"] = totals.ToJsonMs(iterations);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunDlrmLoop(Trainer& trainer, const DlrmLoopOptions& options,
                         TrainerOutcome* outcome) {
  if (options.head == DenseHeadKind::kLogReg) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<LogRegHead> head,
        LogRegHead::Create(trainer.context(), options.model.num_tables, options.model.dim,
                           options.model.seed, options.model.optimizer));
    return RunLoop(trainer, head.get(), options, outcome);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DenseModel> model,
                   DenseModel::Create(trainer.context(), options.model));
  return RunLoop(trainer, model.get(), options, outcome);
}

TrainLoop MakeDlrmLoop(DlrmLoopOptions options) {
  return [options](Trainer& trainer, TrainerOutcome* outcome) {
    DlrmLoopOptions mine = options;
    if (trainer.id() != 0) {
      mine.metrics = nullptr;
      mine.progress = false;
    }
    return RunDlrmLoop(trainer, mine, outcome);
  };
}

}  // namespace bagpipe
