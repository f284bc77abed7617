#include "python/src/py_job.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#if BAGPIPE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/excerpt.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"
#include "model/run_report.h"
#include "pybind11/numpy.h"
#include "python/src/dlpack_view.h"
#include "python/src/mpi_state.h"
#include "python/src/python_source.h"

namespace bagpipe::python {
namespace py = pybind11;

void RaiseError(const char* name, const std::string& message) {
  py::object type = py::module_::import("bagpipe.errors").attr(name);
  // Whole (a NUL does not end it) and whatever its bytes (a file name's invalid UTF-8 is
  // escaped rather than raising UnicodeDecodeError in place of the error).
  py::object text = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
      message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace"));
  if (!text) throw py::error_already_set();
  PyErr_SetObject(type.ptr(), text.ptr());
  throw py::error_already_set();
}

void RaiseFailure(const absl::Status& status, const absl::Status& aborted) {
  // A SIGINT's handler raises KeyboardInterrupt here (on the main thread).
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  if (!aborted.ok()) RaiseError("JobError", std::string(aborted.message()));
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
      // The runtime's messages name its C++ calls; Python users know the methods' names.
      RaiseError("UsageError", absl::StrReplaceAll(status.message(),
                                                   {{"Trainer::SetLoopState", "set_loop_state"},
                                                    {"LoopState::restore", "the restore callback"},
                                                    {"BeginIteration", "begin_iteration"},
                                                    {"EndIteration", "end_iteration"},
                                                    {"LookupPooled", "lookup_pooled"},
                                                    {"after Flush", "after flush()"},
                                                    {"Flush inside", "flush() inside"},
                                                    {"Flush before", "flush() before"}}));
    case absl::StatusCode::kInvalidArgument:
      RaiseError("ConfigError", std::string(status.message()));
    default:
      RaiseError("JobError", std::string(status.message()));
  }
}

namespace {

// Counts a trainer call in flight and holds the trainer for the calling thread.
class TrainerCall {
 public:
  TrainerCall(PyTrainer& trainer, std::mutex& busy, JobCore& core, const char* what)
      : core_(core), lock_(busy, std::try_to_lock) {
    if (!lock_.owns_lock()) {
      RaiseError("UsageError",
                 absl::StrCat(what, ": trainer ", trainer.id(),
                              " is in a call on another thread (drive each trainer from one "
                              "thread)"));
    }
    core_.Enter(what);
    // The calling Python thread uses the trainer's device (CUDA: cudaSetDevice; asynchronous
    // CPU streams: their check).
    if (absl::Status status = trainer.MakeCurrent(); !status.ok()) {
      core_.Leave();
      RaiseError("JobError", absl::StrCat(what, ": ", status.message()));
    }
  }
  ~TrainerCall() { core_.Leave(); }

 private:
  JobCore& core_;
  std::unique_lock<std::mutex> lock_;
};

// Jobs left to end on a thread of their own (their oracle thread inside the user's data
// iterable when they were closed): the interpreter's exit waits for them a while
// (WaitForDetachedJobs), for a reading thread that returns from the iterable during the
// interpreter's finalisation would be ended inside it (CPython exits a thread that wants the
// GIL back then), and crash the process.
std::atomic<int> detached_jobs{0};

void EndDetached(std::unique_ptr<Job> job) {
  ++detached_jobs;
  std::thread([job = std::move(job)]() mutable {
    job.reset();
    --detached_jobs;
  }).detach();
}

}  // namespace

bool WaitForDetachedJobs(absl::Duration timeout) {
  if (detached_jobs.load() == 0) return true;
  BAGPIPE_LOG(WARNING) << "exiting: waiting up to " << absl::FormatDuration(timeout) << " for "
                       << detached_jobs.load()
                       << " closed job(s) whose data iterable has not returned";
  const absl::Time deadline = absl::Now() + timeout;
  while (detached_jobs.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return detached_jobs.load() == 0;
}

void ForgetDetachedJobsInChild() { detached_jobs = 0; }

namespace {

// A loop's part of a checkpoint identity: `value` is the JSON text of a dict, or a callable that
// takes the data's schema and returns it (called here, with the GIL held).
nlohmann::json LoopIdentity(const py::object& value, const Schema& schema, const char* what) {
  const py::object text = py::isinstance<py::str>(value) ? value : value(py::cast(schema));
  nlohmann::json parsed = py::isinstance<py::str>(text)
                              ? nlohmann::json::parse(text.cast<std::string>(), nullptr, false)
                              : nlohmann::json();
  if (parsed.is_discarded() || !parsed.is_object()) {
    RaiseError("ConfigError", absl::StrCat(what, " must be a dict of JSON values"));
  }
  return parsed;
}

}  // namespace

std::shared_ptr<JobCore> JobCore::Create(const JobConfig& config, py::object data,
                                         py::object eval_data, py::object normalize,
                                         std::optional<Schema> schema,
                                         py::object checkpoint_identity,
                                         py::object checkpoint_defaults) {
  std::shared_ptr<JobCore> core(new JobCore());
  core->config_ = config;
  if (absl::Status status = config.Validate(); !status.ok()) {
    RaiseError("ConfigError", std::string(status.message()));
  }
  MpiState& mpi = Mpi();
  core->mpirun_ = LaunchedByMpirun();
  if (core->mpirun_) {
    if (absl::Status status = mpi.Start(config.peer_timeout); !status.ok()) {
      RaiseError("JobError", std::string(status.message()));
    }
    core->rank_ = mpi.transport->rank();
  }
  const bool is_rank0 = core->rank_ == 0;
  const bool iterable = !data.is_none();
  std::unique_ptr<BatchStream> train, eval;
  Schema data_schema;
  int64_t source_samples = -1;  // JobData::source_samples (config.data only)
  double ids_per_sample = -1;   // where the data know it (JobData::ids_per_sample)
  if (iterable) {
    if (!schema.has_value()) {
      RaiseError("ConfigError",
                 "data given as an iterable needs a schema (bagpipe.Schema(table_rows=[...], "
                 "num_dense=...))");
    }
    if (config.data != JobConfig().data) {
      RaiseError("ConfigError",
                 absl::StrCat("data given twice: config.data '", config.data, "' and an iterable"));
    }
    if (config.eval_fraction > 0) {
      RaiseError("ConfigError",
                 "config.eval_fraction splits a data source; with an iterable pass eval_data");
    }
    data_schema = *schema;
    if (is_rank0) {
      train = std::make_unique<BatchStream>(
          MakePythonSource(data, normalize, data_schema, core.get(), "data"),
          BatchStream::Options{config.batch_size, config.iterations > 0 ? 0 : config.epochs,
                               false});
      core->description_ = train->source().Describe();
      if (!eval_data.is_none()) {
        eval = std::make_unique<BatchStream>(
            MakePythonSource(eval_data, normalize, data_schema, core.get(), "eval_data"),
            BatchStream::Options{config.batch_size, 1, false});
      }
    } else {
      core->description_ = "python iterable";
    }
  } else {
    if (schema.has_value()) {
      RaiseError("ConfigError",
                 "a schema goes with data from an iterable; the readers know their own");
    }
    if (!eval_data.is_none()) {
      RaiseError("ConfigError",
                 "eval_data goes with data from an iterable; with config.data set "
                 "config.eval_fraction instead");
    }
    absl::StatusOr<JobData> opened;
    {
      // The passes over the whole data before training (minutes on a Criteo day file) run
      // Python's signal handlers between blocks: Ctrl-C raises KeyboardInterrupt there, not
      // once they end. (PyErr_CheckSignals does nothing off the main thread.)
      const StopPoll poll = [] {
        py::gil_scoped_acquire gil;
        return PyErr_CheckSignals() != 0 ? SIGINT : 0;
      };
      py::gil_scoped_release release;
      opened = OpenJobDataOnRankZero(config, core->mpirun_ ? mpi.transport.get() : nullptr, nullptr,
                                     poll);
    }
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();  // from a signal handler
    if (!opened.ok()) RaiseError("ConfigError", std::string(opened.status().message()));
    data_schema = opened->schema;
    source_samples = opened->source_samples;
    ids_per_sample = opened->ids_per_sample;
    core->description_ = opened->description;
    train = std::move(opened->train);
    eval = std::move(opened->eval);
  }
  absl::StatusOr<JobOptions> options =
      config.Resolve(data_schema, core->mpirun_ ? mpi.transport->size() : 0, ids_per_sample);
  if (!options.ok()) RaiseError("ConfigError", std::string(options.status().message()));
  core->options_ = *options;
  // Checkpoints: the loop's own must-match options (the job adds its own), as the data resolve
  // them, and stops requested from Python (request_stop: a signal handler, or the caller) polled
  // by every role.
  core->options_.checkpoint.identity.update(
      {{"loop", "python"},
       {"--batch-size", config.batch_size},
       {"--eval-fraction", config.eval_fraction},
       {"model", LoopIdentity(checkpoint_identity, data_schema, "checkpoint_identity")}});
  core->options_.checkpoint.identity_context.source_samples = source_samples;
  core->options_.checkpoint.identity_context.defaults = {
      {"model", LoopIdentity(checkpoint_defaults, data_schema, "checkpoint_defaults")}};
  core->options_.stop_requested = [raw = core.get()] {
    return raw->stop_signal_.load(std::memory_order_relaxed);
  };
  absl::StatusOr<std::unique_ptr<Job>> job;
  {
    py::gil_scoped_release release;
    job = Job::Start(core->options_, std::move(train), std::move(eval),
                     core->mpirun_ ? mpi.transport.get() : nullptr);
  }
  if (!job.ok()) RaiseError("JobError", std::string(job.status().message()));
  core->job_ = std::move(*job);
  core->trainers_.resize(core->job_->num_local_trainers());
  return core;
}

namespace {
// The jobs whose trainer calls this thread is in, innermost last (a callback the runtime runs
// inside a call, e.g. the loop's save, runs on the caller's thread).
thread_local std::vector<const JobCore*> tls_calls;
}  // namespace

JobCore::~JobCore() {
  // A destructor never throws (that would terminate the process). The last reference may go
  // wherever Python collects it: on this job's own thread (reading its data iterable) closing
  // would join that very thread, so the job is aborted and joined on a thread of its own.
  if (OnOwnThread() != nullptr) {
    Abort(
        "the job was collected on its own thread (reading the data iterable) before it "
        "was closed");
    std::unique_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      job = std::move(job_);
    }
    if (job != nullptr) EndDetached(std::move(job));
    return;
  }
  try {
    Close();
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable("bagpipe Job's destructor");
  } catch (const std::exception&) {
    // Nothing to report to: the job is aborted and its threads joined as far as they could be.
  }
}

const char* JobCore::OnOwnThread() const {
  if (std::find(tls_calls.begin(), tls_calls.end(), this) != tls_calls.end()) {
    return "inside one of the job's calls (a callback it runs)";
  }
  if (python::ReadingPythonData(this)) return "on the job's own thread (reading the data iterable)";
  return nullptr;
}

std::vector<std::shared_ptr<PyTrainer>> JobCore::trainers() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) RaiseError("UsageError", "trainers: the job is closed");
  }
  std::vector<std::shared_ptr<PyTrainer>> trainers;
  for (size_t local = 0; local < trainers_.size(); ++local) {
    std::shared_ptr<PyTrainer> trainer = trainers_[local].lock();
    if (trainer == nullptr) {
      trainer = std::make_shared<PyTrainer>(shared_from_this(), static_cast<int>(local));
      trainers_[local] = trainer;
    }
    trainers.push_back(std::move(trainer));
  }
  return trainers;
}

void JobCore::Abort(const std::string& message) {
  std::optional<py::gil_scoped_release> release;
  if (PyGILState_Check()) release.emplace();
  absl::MutexLock lock(&mu_);
  // A job that finished is over: its outcome stays what finish() said.
  if (job_ != nullptr && !finished_) job_->Abort(absl::CancelledError(message));
}

absl::Status JobCore::aborted() const {
  absl::MutexLock lock(&mu_);
  return job_ != nullptr ? job_->aborted() : closed_abort_;
}

bool JobCore::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void JobCore::Enter(const char* what) {
  absl::MutexLock lock(&mu_);
  if (closed_ && !finishing_ && !finished_ && closer_ != std::this_thread::get_id()) {
    // Closed by another thread (or collected) while this trainer's loop ran: the job ended
    // under it, no call out of order of its own (UsageError says the trainer can go on). A
    // call after this thread's own close() is that thread's mistake: UsageError below.
    RaiseError("JobError", absl::StrCat(what, ": the job was closed before it finished"));
  }
  if (closed_ || finishing_) {
    RaiseError("UsageError", absl::StrCat(what, ": the job is ",
                                          closed_ ? "closed" : "finished (Job.finish was called)"));
  }
  ++in_flight_;
  tls_calls.push_back(this);
}

void JobCore::Leave() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  auto it = std::find(tls_calls.rbegin(), tls_calls.rend(), this);
  if (it != tls_calls.rend()) tls_calls.erase(std::next(it).base());
}

py::object JobCore::Finish(const std::string& summary_json, const std::string& dump_params,
                           const std::string& model_json) {
  // A finish before the loops are done is a call out of order: refused, the job going on (it
  // used to complete the trainers, whose Flush failed and so ended the job).
  bool check = false;
  {
    absl::MutexLock lock(&mu_);
    check = !closed_ && !finishing_ && job_ != nullptr && job_->aborted().ok();
  }
  if (check) {
    for (const std::shared_ptr<PyTrainer>& trainer : trainers()) trainer->CheckFinished();
  }
  {
    absl::MutexLock lock(&mu_);
    if (closed_) RaiseError("UsageError", "finish: the job is closed");
    if (finishing_) RaiseError("UsageError", "finish: called twice");
    if (in_flight_ > 0) {
      RaiseError("UsageError",
                 "finish: a trainer is still in a call on another thread (join the threads "
                 "that drive the trainers first)");
    }
    finishing_ = true;
    ++in_flight_;  // Close waits for Finish
  }
  struct Leaving {
    JobCore* core;
    ~Leaving() { core->Leave(); }
  } leaving{this};
  std::unique_ptr<RunRecorder> recorder;
  ParamSink sink;
  if (rank_ == 0) {
    nlohmann::json model = nlohmann::json::parse(model_json, nullptr, false);
    if (model.is_discarded() || !model.is_object()) {
      RaiseError("ConfigError", "finish: model must be a dict of JSON values");
    }
    absl::StatusOr<std::unique_ptr<RunRecorder>> created =
        RunRecorder::Create(config_, options_, model, {summary_json, dump_params});
    if (!created.ok()) {
      job_->Abort(created.status());
      RaiseError("ConfigError", std::string(created.status().message()));
    }
    recorder = std::move(*created);
    sink = recorder->sink();
  }
  JobResult result;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = job_->Finish(sink, &result);
  }
  {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  if (!status.ok()) RaiseFailure(status, job_->aborted());
  if (rank_ != 0) return py::none();
  if (result.oracle.stopped_at >= 0) {
    // Stopped (request_stop): no parameters were gathered; say where to resume.
    const CheckpointStats& saved = result.oracle.checkpoint;
    return py::str(DumpJson(nlohmann::json{
        {"stopped",
         {{"iteration", result.oracle.stopped_at},
          {"signal", result.oracle.stop_signal},
          {"checkpoint", saved.last.empty() ? saved.resumed_from : saved.last},
          {"resume", options_.checkpoint.dir},
          {"message",
           std::string(StoppedJobStatus(result.oracle, options_.checkpoint).message())}}}}));
  }
  absl::StatusOr<nlohmann::json> summary = recorder->Finish(result, description_, mpirun_);
  if (!summary.ok()) RaiseError("JobError", std::string(summary.status().message()));
  if (recorder->kept_summary()) {
    BAGPIPE_LOG(WARNING) << summary_json << " kept: the summary of the run that trained to "
                         << "iteration " << (*summary)["first_iteration"].get<int64_t>()
                         << " (this resumed job had no iteration left to train)";
  }
  // A failed parameter dump: the summary (written if asked) holds "params_error", and Job.finish
  // raises JobError with the summary attached, so that the results are not lost with the file.
  return py::str(summary->dump());
}

void JobCore::RequestStop(int signal) {
  if (signal <= 0) RaiseError("UsageError", "request_stop: the signal number must be > 0");
  int none = 0;
  stop_signal_.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

void JobCore::Close() {
  // A closed job closes again as a no-op, from anywhere.
  if (closed()) return;
  // From inside one of this job's calls (a callback such as the loop's save) or on its runtime
  // thread (reading its data iterable), closing would wait for that call or join that thread:
  // the job is aborted instead, so that every call returns, and the caller is told to close it
  // from its own thread. Another job's threads are no such place.
  if (const char* where = OnOwnThread(); where != nullptr) {
    Abort(absl::StrCat("Job.close was called ", where));
    RaiseError("UsageError",
               absl::StrCat("close: called ", where,
                            "; the job is aborted: close it from the thread that created it (a "
                            "`with` block does)"));
  }
  std::unique_ptr<Job> job;
  {
    // Joining may wait for the oracle's thread, which takes the GIL to read an iterable.
    std::optional<py::gil_scoped_release> release;
    if (PyGILState_Check()) release.emplace();
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    closer_ = std::this_thread::get_id();
    if (job_ == nullptr) return;
    // Calls in flight return once the job is aborted (every wait of the runtime observes it).
    if (job_->aborted().ok() && !finished_) {
      job_->Abort(absl::CancelledError("the job was closed before it finished"));
    }
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.Await(absl::Condition(&idle));
    closed_abort_ = job_->aborted();
    job = std::move(job_);
  }
  std::optional<py::gil_scoped_release> release;
  if (PyGILState_Check()) release.emplace();
  // An aborted job's oracle thread may be inside the user's data iterable (a loader blocked on
  // a queue or a slow read), which nothing can interrupt: joining it could wait forever, and a
  // Ctrl-C would not reach the caller. Give it a moment to return, then leave the job to be
  // joined on a thread of its own once it does.
  if (!closed_abort_.ok()) {
    for (int k = 0; k < 50 && python::PythonDataReadInFlight(this); ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (python::PythonDataReadInFlight(this)) {
      BAGPIPE_LOG(WARNING) << "Job.close: the job's data iterable has not returned since the job "
                              "was aborted; its reading thread is left to end when it does";
      EndDetached(std::move(job));
      return;
    }
  }
  job.reset();
}

PyTrainer::PyTrainer(std::shared_ptr<JobCore> core, int local)
    : core_(std::move(core)),
      local_(local),
      id_(core_->job().trainer(local).id()),
      copy_order_(std::make_unique<ExternalStream>(core_->job().trainer(local).context())),
      pool_(core_->job().trainer(local).context()),
      device_(core_->job().trainer(local).context()->is_cuda()
                  ? absl::StrCat("cuda:", core_->job().trainer(local).context()->device_index())
                  : "cpu") {}

int PyTrainer::num_trainers() const { return core_->options().layout.trainers; }

std::string PyTrainer::device() const { return device_; }

void PyTrainer::Raise(const absl::Status& status) {
  absl::Status aborted = core_->aborted();
  if (aborted.ok() && status.code() != absl::StatusCode::kFailedPrecondition &&
      status.code() != absl::StatusCode::kInvalidArgument) {
    // A runtime failure of this trainer ends the job everywhere.
    aborted = core_->job().Fail(local_, status);
  }
  RaiseFailure(status, aborted);
}

py::object PyTrainer::BatchTuple(int64_t global_batch_size) {
  const DeviceContext& context = *trainer().context();
  const int64_t n = batch_.num_samples;
  float* dense = nullptr;
  float* labels = nullptr;
  py::capsule dense_capsule = pool_.Take({n, batch_.num_dense}, &dense);
  py::capsule labels_capsule = pool_.Take({n}, &labels);
  // A recycled buffer may still be read by the caller's earlier work on its stream.
  absl::Status status = copy_order_->ComputeWaitsForExternal();
  if (status.ok()) {
    status =
        context.CopyOnDevice(dense, batch_.dense, static_cast<size_t>(n) * batch_.num_dense * 4);
  }
  if (status.ok()) {
    status = context.CopyOnDevice(labels, batch_.labels, static_cast<size_t>(n) * sizeof(float));
  }
  if (status.ok()) status = copy_order_->ExternalWaitsForCompute();
  if (status.ok()) status = HostWaitsForCompute();
  if (!status.ok()) Raise(status);
  return py::make_tuple(batch_.iteration, batch_.num_samples, global_batch_size, dense_capsule,
                        labels_capsule);
}

absl::Status PyTrainer::HostWaitsForCompute() {
  const DeviceContext& context = *trainer().context();
  if (context.is_cuda() || !context.is_asynchronous()) return absl::OkStatus();
  return context.Synchronize(Stream::kCompute);
}

void PyTrainer::ReleaseKept() {
  if (kept_.empty()) return;
  // CUDA: the caller's stream already waits for the runtime's accesses (SetExternalStream), and
  // torch's allocator reuses the memory in that stream's order. The host frees CPU tensors now.
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = HostWaitsForCompute();
  }
  if (!status.ok()) Raise(status);
  kept_.clear();
}

py::object PyTrainer::BeginIteration() {
  TrainerCall call(*this, busy_, *core_, "begin_iteration");
  absl::StatusOr<bool> more;
  {
    py::gil_scoped_release release;
    more = trainer().BeginIteration(&batch_);
  }
  started_ = true;
  if (!more.ok()) Raise(more.status());
  // The end of training while the job is being closed (its Job collected, or closed from
  // another thread) is no end of the data: say so rather than end the loop as if it were.
  if (!*more && core_->closed()) {
    const absl::Status aborted = core_->aborted();
    RaiseError("UsageError",
               absl::StrCat("begin_iteration: the job is closed",
                            aborted.ok() ? "" : absl::StrCat(" (", aborted.message(), ")")));
  }
  ReleaseKept();
  has_batch_ = *more;
  eval_batch_ = false;
  if (!*more) return py::none();
  return BatchTuple(batch_.global_batch_size);
}

py::object PyTrainer::BeginEvalBatch() {
  TrainerCall call(*this, busy_, *core_, "begin_eval_batch");
  absl::StatusOr<bool> more;
  {
    py::gil_scoped_release release;
    more = trainer().BeginEvalBatch(&batch_);
  }
  if (!more.ok()) Raise(more.status());
  has_batch_ = *more;
  eval_batch_ = *more;
  if (!*more) return py::none();
  return BatchTuple(batch_.num_samples);
}

py::capsule PyTrainer::LookupPooled() {
  TrainerCall call(*this, busy_, *core_, "lookup_pooled");
  if (!has_batch_) {
    RaiseError("UsageError", "lookup_pooled: outside an iteration (call begin_iteration first)");
  }
  float* pooled = nullptr;
  py::capsule capsule =
      pool_.Take({batch_.num_samples, batch_.num_tables, core_->options().trainer.dim}, &pooled);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().LookupPooledInto(pooled);
    if (status.ok()) status = HostWaitsForCompute();
  }
  if (!status.ok()) Raise(status);
  return capsule;
}

void PyTrainer::LookupPooledInto(py::handle pooled) {
  TrainerCall call(*this, busy_, *core_, "lookup_pooled_into");
  if (!has_batch_) {
    RaiseError("UsageError", "lookup_pooled: outside an iteration (call begin_iteration first)");
  }
  const int64_t dim = core_->options().trainer.dim;
  TensorView view = ViewTensor(pooled, "pooled", {batch_.num_samples, batch_.num_tables, dim},
                               *trainer().context());
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().LookupPooledInto(static_cast<float*>(view.data));
    if (status.ok()) status = HostWaitsForCompute();
  }
  if (!status.ok()) Raise(status);
}

void PyTrainer::EndIteration(py::handle pooled_grad) {
  TrainerCall call(*this, busy_, *core_, "end_iteration");
  if (!has_batch_) {
    RaiseError("UsageError",
               "end_iteration: no iteration to end (begin_iteration first; each iteration ends "
               "once)");
  }
  const int64_t dim = core_->options().trainer.dim;
  TensorView view = ViewTensor(pooled_grad, "pooled_grad",
                               {batch_.num_samples, batch_.num_tables, dim}, *trainer().context());
  if (!trainer().context()->is_cuda()) {
    // A NaN or infinite gradient would be applied to the rows on the servers, where every later
    // lookup of every trainer reads it: refuse it before the runtime sees it (the iteration stays
    // open). Host memory only: on CUDA the check would cost a host synchronisation.
    const float* grad = static_cast<const float*>(view.data);
    // One pass the compiler vectorizes: the largest magnitude as the float's bits without the
    // sign (they order like the magnitudes, and NaN and infinity, whose exponent bits are all
    // set, come above every finite value). The element is looked for only when it is refused.
    uint32_t largest_bits = 0;
    for (int64_t i = 0; i < view.elements; ++i) {
      uint32_t bits;
      std::memcpy(&bits, grad + i, sizeof(bits));
      largest_bits = std::max(largest_bits, bits & 0x7fffffffu);
    }
    const float largest = std::bit_cast<float>(largest_bits);
    if (largest_bits >= 0x7f800000u) {
      int64_t i = 0;
      while (std::isfinite(grad[i])) ++i;  // the first non-finite element
      const int64_t per_sample = static_cast<int64_t>(batch_.num_tables) * dim;
      throw py::value_error(absl::StrCat(
          "pooled_grad: element (", i / per_sample, ", ", (i / dim) % batch_.num_tables, ", ",
          i % dim, ") is ", std::isnan(grad[i]) ? "nan" : (grad[i] > 0 ? "inf" : "-inf"),
          ": a non-finite gradient would corrupt the embedding rows (nothing was applied; the "
          "iteration is still open)"));
    }
    // A finite gradient still overflows float32 when a row sums it: over every id of the
    // batch that names the row (repeated ids of a bag and of the batch add up), over the
    // trainers that share it, then SGD scales the sum by the learning rate and Adagrad squares
    // it into the accumulator (its step, lr * g / sqrt(accumulator), stays within lr). Each
    // trainer's part of a row's sum is at most its largest element times its ids: refused
    // while num_trainers times that, so scaled or squared, could overflow.
    const OptimizerConfig& optimizer = core_->options().trainer.sparse_optimizer;
    const bool sgd = optimizer.kind == OptimizerKind::kSgd;
    const double bound =
        sgd ? std::numeric_limits<float>::max() : std::sqrt(std::numeric_limits<float>::max());
    const double ids = static_cast<double>(std::max<int64_t>(1, batch_.num_ids));
    const double trainers = static_cast<double>(std::max(1, num_trainers()));
    const double scale = sgd ? std::max(1.0, static_cast<double>(optimizer.learning_rate)) : 1.0;
    if (static_cast<double>(largest) * ids * trainers * scale >= bound) {
      int64_t at = 0;
      while (std::fabs(grad[at]) < largest) ++at;  // the first element of that magnitude
      const int64_t per_sample = static_cast<int64_t>(batch_.num_tables) * dim;
      throw py::value_error(absl::StrCat(
          "pooled_grad: element (", at / per_sample, ", ", (at / dim) % batch_.num_tables, ", ",
          at % dim, ") is ", grad[at], ": summed into a row over the ", batch_.num_ids,
          " ids of this trainer's share of the batch and the ", num_trainers(), " trainer(s)",
          sgd ? absl::StrCat(" and scaled by the learning rate ", optimizer.learning_rate)
              : " and squared (Adagrad)",
          ", a row's gradient could overflow float32 (nothing was applied; the iteration is "
          "still open)"));
    }
  }
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().EndIteration(static_cast<const float*>(view.data));
  }
  kept_.push_back(std::move(view.owner));
  if (!status.ok()) Raise(status);
  has_batch_ = false;
}

void PyTrainer::AllReduce(py::handle tensor) {
  TrainerCall call(*this, busy_, *core_, "all_reduce_");
  TensorView view = ViewTensor(tensor, "all_reduce_ tensor", {}, *trainer().context());
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().AllReduceDevice(static_cast<float*>(view.data),
                                       static_cast<size_t>(view.elements));
  }
  kept_.push_back(std::move(view.owner));
  if (!status.ok()) Raise(status);
}

void PyTrainer::Flush() {
  TrainerCall call(*this, busy_, *core_, "flush");
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().Flush();
  }
  if (!status.ok()) Raise(status);
  ReleaseKept();
  has_batch_ = false;
}

void PyTrainer::CheckFinished() {
  TrainerCall call(*this, busy_, *core_, "finish");
  if (core_->job().trainer_completed(local_)) return;
  if (has_batch_ && !eval_batch_) {
    RaiseError("UsageError",
               absl::StrCat("finish: trainer ", id_, " is inside iteration ", batch_.iteration,
                            " (end it with end_iteration and run the loop to its end first; "
                            "close() ends the job early)"));
  }
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().Flush();
  }
  if (absl::IsFailedPrecondition(status)) {
    RaiseError("UsageError", absl::StrCat("finish: trainer ", id_, ": ", status.message(),
                                          " (run every trainer's loop to its end first; close() "
                                          "ends the job early)"));
  }
  if (!status.ok()) Raise(status);
  ReleaseKept();
}

void PyTrainer::Complete(py::object dense, py::object predictions, py::object labels,
                         const std::string& info_json) {
  TrainerCall call(*this, busy_, *core_, "complete");
  // A held-out batch needs no ending (a loop may leave eval_batches early).
  if (has_batch_ && !eval_batch_) {
    RaiseError("UsageError",
               "complete: inside an iteration (end it with end_iteration, then flush, first)");
  }
  using F = py::array_t<float, py::array::c_style | py::array::forcecast>;
  TrainerOutcome outcome;
  auto take = [](const py::object& array, std::vector<float>* out) {
    if (array.is_none()) return;
    F values = array.cast<F>();
    out->assign(values.data(), values.data() + values.size());
  };
  take(dense, &outcome.dense_parameters);
  take(predictions, &outcome.eval_predictions);
  take(labels, &outcome.eval_labels);
  if (outcome.eval_predictions.size() != outcome.eval_labels.size()) {
    RaiseError("UsageError",
               absl::StrCat("complete: ", outcome.eval_predictions.size(), " predictions for ",
                            outcome.eval_labels.size(), " labels"));
  }
  nlohmann::json info = nlohmann::json::parse(info_json, nullptr, false);
  if (info.is_discarded() || !info.is_object()) {
    RaiseError("UsageError", "complete: info must be a dict of JSON values");
  }
  outcome.info = std::move(info);
  // Flushed here first (a no-op once the loop flushed): before the last iteration that is a
  // UsageError that changes nothing, as flush's, rather than the trainer's failure that
  // completing would make of it.
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().Flush();
  }
  if (status.code() == absl::StatusCode::kFailedPrecondition && core_->aborted().ok()) {
    RaiseError("UsageError",
               absl::StrCat("complete: ", status.message(),
                            " (nothing was done: the trainer can go on, then complete)"));
  }
  if (!status.ok()) Raise(status);
  {
    py::gil_scoped_release release;
    status = core_->job().CompleteTrainer(local_, std::move(outcome));
  }
  kept_.clear();
  if (!status.ok()) RaiseFailure(status, core_->aborted());
}

void PyTrainer::SetLoopState(py::object save, py::object restore) {
  TrainerCall call(*this, busy_, *core_, "set_loop_state");
  if (!PyCallable_Check(save.ptr()) || !PyCallable_Check(restore.ptr())) {
    RaiseError("UsageError", "set_loop_state: save and restore must be callables");
  }
  if (started_) {
    RaiseError("UsageError", "set_loop_state: call it before the first begin_iteration");
  }
  // Both run on this trainer's thread inside its calls (which released the GIL). An exception
  // in them fails the checkpoint or the resume, and so the job, with its message.
  auto run = [](const char* what, auto&& body) -> absl::Status {
    py::gil_scoped_acquire acquire;
    try {
      body();
      return absl::OkStatus();
    } catch (py::error_already_set& error) {
      // Not FailedPrecondition (a usage error that leaves the job going): the checkpoint or
      // the resume is half done everywhere, so the job fails with this message at once.
      return absl::AbortedError(absl::StrCat("the loop's ", what, " raised ", error.what()));
    }
  };
  // The runtime copies and destroys its LoopState without the GIL: the callables are held
  // through shared pointers whose deleter takes the GIL.
  auto hold = [](py::object callable) {
    return std::shared_ptr<py::object>(new py::object(std::move(callable)), [](py::object* o) {
      if (!Py_IsInitialized()) return;  // the interpreter is gone: leave it
      py::gil_scoped_acquire acquire;
      delete o;
    });
  };
  std::shared_ptr<py::object> save_fn = hold(std::move(save));
  std::shared_ptr<py::object> restore_fn = hold(std::move(restore));
  LoopState state;
  state.save = [save_fn, run]() -> absl::StatusOr<std::string> {
    std::string bytes;
    std::string not_bytes;  // the type save() returned instead of bytes
    RETURN_IF_ERROR(run("save", [&] {
      py::object out = (*save_fn)();
      if (!py::isinstance<py::bytes>(out)) {
        not_bytes = py::str(py::type::of(out).attr("__name__")).cast<std::string>();
        return;
      }
      bytes = out.cast<std::string>();
    }));
    // Failed like a save() that raised: the checkpoint is half written everywhere.
    if (!not_bytes.empty()) {
      return absl::AbortedError(absl::StrCat(
          "the loop's save returned ", Printable(not_bytes),
          ", not bytes (set_loop_state: save() must return the loop's state as bytes)"));
    }
    return bytes;
  };
  state.restore = [restore_fn, run](std::string_view bytes) -> absl::Status {
    return run("restore", [&] { (*restore_fn)(py::bytes(bytes.data(), bytes.size())); });
  };
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = trainer().SetLoopState(std::move(state));
  }
  if (!status.ok()) Raise(status);
}

int64_t PyTrainer::FirstIteration() {
  TrainerCall call(*this, busy_, *core_, "first_iteration");
  absl::StatusOr<Iteration> first;
  {
    py::gil_scoped_release release;
    first = trainer().FirstIteration();
  }
  if (!first.ok()) Raise(first.status());
  return *first;
}

std::string PyTrainer::StatsJson() {
  TrainerCall call(*this, busy_, *core_, "stats");
  return DumpJson(trainer().stats().ToJson());
}

void PyTrainer::SetExternalStream(uintptr_t stream) {
  TrainerCall call(*this, busy_, *core_, "set_external_stream");
  void* pointer = reinterpret_cast<void*>(stream);
#if BAGPIPE_WITH_CUDA
  // PyTorch names its default stream 0: the legacy default stream, which CUDA calls take as
  // cudaStreamLegacy. Passed on as 0 it would mean "no stream", and nothing would order the
  // loop's work on it against the runtime's streams (created non-blocking).
  if (stream == 0) pointer = static_cast<void*>(cudaStreamLegacy);
#endif
  absl::Status status = trainer().SetExternalStream(pointer);
  if (status.ok()) status = copy_order_->Set(pointer);
  if (!status.ok()) RaiseError("UsageError", std::string(status.message()));
}

}  // namespace bagpipe::python
