// The objects behind bagpipe._core.Job and bagpipe._core.Trainer: a Job (trainer_hooks/job.h)
// whose trainers Python threads drive, one thread per trainer.
//
// Every call that may block (waiting for plans, rows, peers, the job's end) releases the GIL.
// A failed call raises: KeyboardInterrupt when a SIGINT is pending (the Python layer aborts the
// job on SIGINT so that blocked calls return), bagpipe.errors.JobError when the job was aborted
// (by a failure on another thread or rank, or abort()), UsageError for calls out of order, and
// TypeError/ValueError for a tensor of the wrong dtype, shape, device or layout (checked before
// the runtime sees it). A trainer is driven by one thread at a time: a second thread's call
// raises UsageError instead of racing.
//
// Lifetime: Trainer objects keep their JobCore alive; close() (or the last reference) aborts an
// unfinished job, waits for calls in flight to return and joins the job's threads.
#ifndef BAGPIPE_PYTHON_SRC_PY_JOB_H_
#define BAGPIPE_PYTHON_SRC_PY_JOB_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pybind11/pybind11.h"
#include "python/src/dlpack_view.h"
#include "trainer_hooks/external_stream.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/job_config.h"

namespace bagpipe::python {

// At the interpreter's exit (bagpipe._core._shutdown): waits, at most `timeout`, for the jobs
// that close() left to end on a thread of their own (their data iterable had not returned);
// false if some are still running. Call without the GIL.
bool WaitForDetachedJobs(absl::Duration timeout);
// In a forked child (which has none of the parent's threads): no job is left to wait for.
void ForgetDetachedJobsInChild();

// Raises the Python exception for `status` (see the file comment). `aborted`: the job's abort
// status (OK if it was not aborted).
[[noreturn]] void RaiseFailure(const absl::Status& status, const absl::Status& aborted);
// Raises bagpipe.errors.<name>(message).
[[noreturn]] void RaiseError(const char* name, const std::string& message);

class PyTrainer;

class JobCore : public std::enable_shared_from_this<JobCore> {
 public:
  // Opens the data (config.data, or the iterables `data`/`eval_data` with `schema` and the
  // Python `normalize`), resolves the options (ConfigError on a contradiction) and starts the
  // job: embedded, or this rank's part when launched by mpirun. `checkpoint_identity` (the
  // loop's options a resume must match) and `checkpoint_defaults` (CheckpointOptions'
  // identity_context.defaults, within the loop's options): each the JSON text of a dict, or a
  // callable that takes the data's Schema and returns it.
  static std::shared_ptr<JobCore> Create(const JobConfig& config, pybind11::object data,
                                         pybind11::object eval_data, pybind11::object normalize,
                                         std::optional<Schema> schema,
                                         pybind11::object checkpoint_identity,
                                         pybind11::object checkpoint_defaults);
  ~JobCore();

  // The local trainers (the same objects while Python holds them; they keep the core alive).
  std::vector<std::shared_ptr<PyTrainer>> trainers();
  int rank() const { return rank_; }
  int world_size() const { return options_.layout.size(); }
  bool mpirun() const { return mpirun_; }
  const JobOptions& options() const { return options_; }
  const JobConfig& config() const { return config_; }
  const Schema& schema() const { return options_.oracle.planner.schema; }
  const std::string& description() const { return description_; }

  // Asks the job to stop at an iteration boundary (as SIGINT/SIGTERM do for bagpipe train):
  // every role agrees on the iteration, a checkpoint is written when a directory is set, the
  // trainers' begin_iteration then returns None and Finish reports the stop. `signal`: the
  // signal number reported (> 0); the first request counts.
  void RequestStop(int signal);
  // Aborts the job (every blocked call everywhere returns JobError(message)).
  void Abort(const std::string& message);
  // The job's abort status.
  absl::Status aborted() const;
  // Ends the job (Job::Finish); at rank 0 writes params.bin/summary.json as asked and returns
  // the summary as JSON text, elsewhere None; a stopped job's rank 0 returns
  // {"stopped": {iteration, signal, checkpoint, resume, message}} instead.
  pybind11::object Finish(const std::string& summary_json, const std::string& dump_params,
                          const std::string& model_json);
  // Aborts an unfinished job, waits for trainer calls in flight, joins the job's threads.
  void Close();
  bool closed() const;

  // Trainer calls: Enter fails (UsageError) once the job is closed or finished.
  void Enter(const char* what);
  void Leave();
  Job& job() { return *job_; }

 private:
  JobCore() = default;
  // Where the calling thread must not close the job (it would wait for itself): inside one of
  // the job's calls, or reading the job's data iterable; nullptr elsewhere.
  const char* OnOwnThread() const;

  JobConfig config_;
  JobOptions options_;
  std::string description_;
  bool mpirun_ = false;
  int rank_ = 0;
  std::unique_ptr<Job> job_;
  std::vector<std::weak_ptr<PyTrainer>> trainers_;
  std::atomic<int> stop_signal_{0};  // RequestStop's signal; polled by the job's roles
  // Guards the state below; calls in flight are counted so Close can wait for them.
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // Finish was called
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Job::Finish returned
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id closer_ ABSL_GUARDED_BY(mu_);     // the thread that called Close
  absl::Status closed_abort_ ABSL_GUARDED_BY(mu_);  // the job's abort status when it closed
};

class PyTrainer {
 public:
  PyTrainer(std::shared_ptr<JobCore> core, int local);

  int id() const { return id_; }
  int num_trainers() const;
  std::string device() const;

  // Begins the next iteration: (iteration, num_samples, global_batch_size, dense, labels) with
  // the dense features [n, num_dense] and labels [n] as DLPack capsules (pooled buffers, see
  // TensorPool), or None when training has ended.
  pybind11::object BeginIteration();
  // After Flush: the next evaluation batch, in the same form, or None.
  pybind11::object BeginEvalBatch();
  // The pooled embeddings [n, num_tables, dim] of the current batch in a new capsule (pooled).
  pybind11::capsule LookupPooled();
  // Writes the pooled embeddings [n, num_tables, dim] into the caller's `pooled`.
  void LookupPooledInto(pybind11::handle pooled);
  // Ends the iteration with d(loss)/d(pooled) [n, num_tables, dim]; the tensor is kept alive
  // until the next begin_iteration/flush returns (the device contract).
  void EndIteration(pybind11::handle pooled_grad);
  // In-place sum over all trainers (dense gradients); kept alive the same way.
  void AllReduce(pybind11::handle tensor);
  void Flush();
  // Ends this trainer's part: outcome for rank 0 (dense parameters, held-out predictions and
  // labels as float32 numpy arrays, info as JSON text).
  void Complete(pybind11::object dense, pybind11::object predictions, pybind11::object labels,
                const std::string& info_json);
  std::string StatsJson();
  void SetExternalStream(uintptr_t stream);
  // Makes the trainer's device current on the calling thread (every call does it first).
  absl::Status MakeCurrent() { return trainer().context()->MakeCurrent(); }
  // Trainer::SetLoopState with Python callables: save() -> bytes (trainer 0, at each
  // checkpoint's iteration boundary, inside begin_iteration), restore(bytes) (every trainer of a
  // resumed job, inside this call). Before the first begin_iteration.
  void SetLoopState(pybind11::object save, pybind11::object restore);
  // Trainer::FirstIteration: 0, or the resumed checkpoint's iteration.
  int64_t FirstIteration();
  // Job.finish's check of this trainer: UsageError (nothing changes) while an iteration is open
  // or planned iterations are left to run; otherwise flushes it (as finish would).
  void CheckFinished();

 private:
  friend class TrainerCall;
  Trainer& trainer() { return core_->job().trainer(local_); }
  // Fails the job for a runtime failure of this trainer (not for misuse) and raises.
  [[noreturn]] void Raise(const absl::Status& status);
  // Asynchronous CPU streams (core/device.h): the host, where the Python loop computes, waits
  // for the compute stream. Otherwise nothing (CUDA orders the caller's stream by events).
  absl::Status HostWaitsForCompute();
  // Drops kept_ once the runtime's accesses to those buffers are ordered before their reuse.
  void ReleaseKept();
  // (iteration, n, global, dense, labels) of batch_ with copies of its dense features and labels.
  pybind11::object BatchTuple(int64_t global_batch_size);

  const std::shared_ptr<JobCore> core_;
  const int local_;
  const int id_;
  std::mutex busy_;  // one calling thread at a time
  std::unique_ptr<ExternalStream> copy_order_;
  TensorPool pool_;
  const std::string device_;
  LocalBatch batch_;
  bool has_batch_ = false;
  bool eval_batch_ = false;  // batch_ is a held-out batch (BeginEvalBatch)
  bool started_ = false;     // begin_iteration was called
  // Caller buffers the runtime may still read (device contract), released after the next
  // BeginIteration or Flush returns.
  std::vector<pybind11::object> kept_;
};

}  // namespace bagpipe::python

#endif  // BAGPIPE_PYTHON_SRC_PY_JOB_H_
