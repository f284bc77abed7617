#include "trainer_hooks/job.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/tunables.h"
#include "sync/protocol.h"
#include "trainer_hooks/job_config.h"
#include "trainer_hooks/options_agreement.h"

namespace bagpipe {
namespace {

// Checked reads of the JSON a rank reports at the end (a peer running another build, or a
// damaged message, must give a clear error instead of an exception): every field is required
// and of its type.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string what)
      : object_(object), what_(std::move(what)) {}

  // An error unless the JSON is an object.
  absl::Status CheckObject() const {
    if (object_.is_object()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(what_, ": expected a JSON object, got ", object_.type_name()));
  }
  absl::Status Get(const char* key, int64_t* out) const {
    ASSIGN_OR_RETURN(const nlohmann::json* value, Find(key));
    if (!value->is_number_integer()) return WrongType(key, "an integer", *value);
    *out = value->get<int64_t>();
    return absl::OkStatus();
  }
  absl::Status Get(const char* key, double* out) const {
    ASSIGN_OR_RETURN(const nlohmann::json* value, Find(key));
    if (!value->is_number()) return WrongType(key, "a number", *value);
    *out = value->get<double>();
    return absl::OkStatus();
  }
  absl::Status Get(const char* key, std::string* out) const {
    ASSIGN_OR_RETURN(const nlohmann::json* value, Find(key));
    if (!value->is_string()) return WrongType(key, "a string", *value);
    *out = value->get<std::string>();
    return absl::OkStatus();
  }
  absl::Status GetObject(const char* key, nlohmann::json* out) const {
    ASSIGN_OR_RETURN(const nlohmann::json* value, Find(key));
    if (!value->is_object()) return WrongType(key, "an object", *value);
    *out = *value;
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<const nlohmann::json*> Find(const char* key) const {
    RETURN_IF_ERROR(CheckObject());
    auto it = object_.find(key);
    if (it == object_.end()) {
      return absl::DataLossError(absl::StrCat(what_, ": \"", key, "\" is missing"));
    }
    return &*it;
  }
  absl::Status WrongType(const char* key, const char* expected, const nlohmann::json& value) const {
    return absl::DataLossError(
        absl::StrCat(what_, ": \"", key, "\" should be ", expected, ", got ", value.type_name()));
  }

  const nlohmann::json& object_;
  const std::string what_;
};

}  // namespace

Bytes EncodeOutcome(const TrainerOutcome& outcome) {
  WireWriter w;
  w.PutVector(outcome.dense_parameters);
  w.PutVector(outcome.eval_predictions);
  w.PutVector(outcome.eval_labels);
  nlohmann::json blob = {{"info", outcome.info}, {"stats", outcome.stats.ToJson()}};
  w.PutString(DumpJson(blob));
  return w.Take();
}

absl::StatusOr<TrainerOutcome> DecodeOutcome(const Bytes& bytes, int rank) {
  const std::string what = absl::StrCat("the outcome reported by rank ", rank);
  WireReader r(bytes, what.c_str());
  TrainerOutcome outcome;
  RETURN_IF_ERROR(r.GetVector(&outcome.dense_parameters));
  RETURN_IF_ERROR(r.GetVector(&outcome.eval_predictions));
  RETURN_IF_ERROR(r.GetVector(&outcome.eval_labels));
  std::string text;
  RETURN_IF_ERROR(r.GetString(&text));
  const nlohmann::json blob = nlohmann::json::parse(text, nullptr, false);
  if (blob.is_discarded()) return absl::DataLossError(absl::StrCat(what, ": malformed JSON"));
  const JsonFields fields(blob, what);
  RETURN_IF_ERROR(fields.GetObject("info", &outcome.info));
  nlohmann::json stats;
  RETURN_IF_ERROR(fields.GetObject("stats", &stats));
  const JsonFields s(stats, absl::StrCat(what, ", its statistics"));
  TrainerStats& st = outcome.stats;
  for (auto [key, field] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"iterations", &st.iterations},
           {"ids", &st.ids},
           {"unique_rows", &st.unique_rows},
           {"hits", &st.hits},
           {"fills", &st.fills},
           {"evictions", &st.evictions},
           {"write_backs", &st.write_backs},
           {"flushes", &st.flushes},
           {"shared_rows", &st.shared_rows},
           {"exchanged_rows", &st.exchanged_rows},
           {"exchanged_bytes", &st.exchanged_bytes},
           {"fetched_bytes", &st.fetched_bytes},
           {"written_back_bytes", &st.written_back_bytes},
           {"prefetch_max_in_flight", &st.prefetch_max_in_flight},
           {"checkpoints", &st.checkpoints},
           {"host_syncs", &st.host_syncs},
           {"max_iteration_host_syncs", &st.max_iteration_host_syncs},
           {"growth_iterations", &st.growth_iterations},
           {"last_growth_iteration", &st.last_growth_iteration}}) {
    RETURN_IF_ERROR(s.Get(key, field));
  }
  for (auto [key, field] : std::initializer_list<std::pair<const char*, double*>>{
           {"wait_seconds", &st.wait_seconds},
           {"boundary_seconds", &st.boundary_seconds},
           {"lookup_seconds", &st.lookup_seconds},
           {"reduce_seconds", &st.reduce_seconds},
           {"sync_seconds", &st.sync_seconds},
           {"apply_seconds", &st.apply_seconds},
           {"allreduce_seconds", &st.allreduce_seconds},
           {"checkpoint_seconds", &st.checkpoint_seconds}}) {
    RETURN_IF_ERROR(s.Get(key, field));
  }
  RETURN_IF_ERROR(s.Get("dense_allreduce", &st.dense_allreduce));
  return outcome;
}

absl::StatusOr<ServerStats> DecodeServerStats(const Bytes& bytes, int rank) {
  const std::string what = absl::StrCat("the statistics reported by rank ", rank);
  const nlohmann::json j =
      nlohmann::json::parse(std::string(bytes.begin(), bytes.end()), nullptr, false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat(what, ": malformed JSON"));
  const JsonFields fields(j, what);
  ServerStats s;
  for (auto [key, field] : std::initializer_list<std::pair<const char*, int64_t*>>{
           {"fetch_requests", &s.fetch_requests},
           {"rows_fetched", &s.rows_fetched},
           {"write_back_messages", &s.write_back_messages},
           {"rows_written_back", &s.rows_written_back},
           {"deferred_fetches", &s.deferred_fetches},
           {"rows_stored", &s.rows_stored}}) {
    RETURN_IF_ERROR(fields.Get(key, field));
  }
  RETURN_IF_ERROR(fields.Get("bytes_per_row", &s.bytes_per_row));
  return s;
}

namespace {

// Receives the kStats control message `what` from `rank` and returns its body.
absl::StatusOr<Bytes> ReceiveStats(Transport& transport, int rank, absl::Duration timeout,
                                   const char* what) {
  ASSIGN_OR_RETURN(Message message, transport.Receive(rank, kTagControl, timeout));
  ControlKind kind;
  Bytes body;
  RETURN_IF_ERROR(DecodeControl(message.payload, &kind, &body));
  if (kind != ControlKind::kStats) {
    return absl::DataLossError(absl::StrCat("expected ", what, " from rank ", rank));
  }
  return body;
}

// Rank 0 after the oracle role: gathers every trainer's outcome, the parameters and every
// server's statistics.
absl::Status GatherAtRankZero(Transport& transport, const JobOptions& options,
                              const ParamSink& sink, JobResult* result) {
  const JobLayout& layout = options.layout;
  result->trainers.resize(layout.trainers);
  for (int t = 0; t < layout.trainers; ++t) {
    // Trainers report after training and evaluation, which may take a while: wait for them
    // as long as the peer timeout allows between messages.
    ASSIGN_OR_RETURN(const Bytes body, ReceiveStats(transport, layout.trainer_rank(t),
                                                    options.peer_timeout, "a trainer outcome"));
    ASSIGN_OR_RETURN(result->trainers[t], DecodeOutcome(body, layout.trainer_rank(t)));
  }
  const int record_floats =
      RecordFloats(options.trainer.sparse_optimizer.kind, options.trainer.dim);
  // A stop that came after the evaluation skips the parameter collection too (long with large
  // tables); the rows of the last iteration are in its checkpoint, where the job writes one.
  if (options.collect_parameters && result->oracle.stopped_at < 0) {
    if (const int signal = PollStopRequest(transport, options.stop_requested); signal != 0) {
      BAGPIPE_LOG(WARNING) << "stop requested (signal " << signal
                           << ") before the parameters were gathered: they stay unread";
      result->oracle.stopped_at = result->oracle.end_iteration;
      result->oracle.stop_signal = signal;
      result->oracle.stopped_after_training = true;
    }
  }
  // A stopped job's rows stay on the servers (and in its checkpoint).
  if (options.collect_parameters && result->oracle.stopped_at < 0) {
    if (sink.dense) RETURN_IF_ERROR(sink.dense(result->trainers[0].dense_parameters));
    absl::Status row_status;
    RETURN_IF_ERROR(CollectRows(transport, layout, record_floats, options.peer_timeout,
                                [&](RowId row, const float* record) {
                                  ++result->parameter_rows;
                                  if (row_status.ok() && sink.row)
                                    row_status = sink.row(row, record);
                                }));
    RETURN_IF_ERROR(row_status);
  } else {
    for (int s = 0; s < layout.servers; ++s) {
      RETURN_IF_ERROR(
          transport.Send(layout.server_rank(s), kTagControl, EncodeControl(ControlKind::kStop)));
    }
  }
  result->servers.resize(layout.servers);
  for (int s = 0; s < layout.servers; ++s) {
    ASSIGN_OR_RETURN(const Bytes body, ReceiveStats(transport, layout.server_rank(s),
                                                    options.peer_timeout, "server statistics"));
    ASSIGN_OR_RETURN(result->servers[s], DecodeServerStats(body, layout.server_rank(s)));
  }
  return absl::OkStatus();
}

absl::Status RunServerRank(Transport& transport, const JobOptions& options, int s) {
  ServerOptions server_options;
  server_options.initializer = options.trainer.initializer;
  server_options.writeback_horizon = options.oracle.planner.writeback_horizon > 0
                                         ? options.oracle.planner.writeback_horizon
                                         : kDefaultWritebackHorizon;
  server_options.peer_timeout = options.peer_timeout;
  server_options.stop_requested = options.stop_requested;
  ServerStats stats;
  RETURN_IF_ERROR(RunServer(transport, options.layout, s, server_options, &stats));
  const std::string text = ServerStatsJson(stats).dump();
  return transport.Send(JobLayout::oracle_rank(), kTagControl,
                        EncodeControl(ControlKind::kStats, Bytes(text.begin(), text.end())));
}

// The oracle role's options: the job's, with its checkpoint identity (the options a resumed job
// must share).
OracleRoleOptions OracleOptionsOf(const JobOptions& options) {
  OracleRoleOptions oracle = options.oracle;
  oracle.peer_timeout = options.peer_timeout;
  oracle.stop_requested = options.stop_requested;
  oracle.checkpoint = options.checkpoint;
  const OptimizerConfig& sparse = options.trainer.sparse_optimizer;
  nlohmann::json optimizer = {{"kind", std::string(OptimizerName(sparse.kind))},
                              {"lr", sparse.learning_rate}};
  if (sparse.kind != OptimizerKind::kSgd) {  // SGD ignores them (and warns when they are given)
    optimizer["eps"] = sparse.eps;
    optimizer["initial_accumulator"] = sparse.initial_accumulator;
  }
  oracle.checkpoint.identity.update(CheckpointIdentity(
      options.layout, options.trainer.dim, optimizer, options.trainer.initializer.seed(),
      options.oracle.planner.schema.table_rows));
  return oracle;
}

// A trainer's device context (CUDA): the trainer's index among the trainers of its machine picks
// the GPU (not the global index: trainers of one machine would share a GPU under --map-by node).
absl::StatusOr<std::shared_ptr<DeviceContext>> TrainerContext(Backend backend,
                                                              const JobLayout& layout, int t,
                                                              const Transport& transport) {
  if (backend != Backend::kCuda) return DeviceContext::Cpu();
  const int devices = CudaDeviceCount();
  if (devices == 0) return absl::FailedPreconditionError("--device cuda but no CUDA device");
  const int local = LocalTrainerIndex(layout, t, transport.NodeOfRanks());
  return DeviceContext::Cuda(local % devices);
}

// Drives local trainer `local` of `job` with `loop` on the calling thread. An exception out of
// the loop fails the job like an error status (on a trainer's thread it would end the process,
// with the oracle and servers still running).
void RunLocalTrainer(Job& job, int local, const TrainLoop& loop) {
  Trainer& trainer = job.trainer(local);
  TrainerOutcome outcome;
  absl::Status status = trainer.context()->MakeCurrent();
  if (status.ok()) {
    try {
      status = loop(trainer, &outcome);
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat(
          "trainer ", trainer.id(), ": the training loop threw an exception: ", e.what()));
    } catch (...) {
      status = absl::InternalError(
          absl::StrCat("trainer ", trainer.id(),
                       ": the training loop threw an exception (not a std::exception)"));
    }
  }
  if (status.ok()) {
    (void)job.CompleteTrainer(local, std::move(outcome));
  } else {
    (void)job.Fail(local, status);
  }
}

}  // namespace

nlohmann::json ServerStatsJson(const ServerStats& s) {
  return {{"fetch_requests", s.fetch_requests},
          {"rows_fetched", s.rows_fetched},
          {"write_back_messages", s.write_back_messages},
          {"rows_written_back", s.rows_written_back},
          {"deferred_fetches", s.deferred_fetches},
          {"rows_stored", s.rows_stored},
          {"bytes_per_row", s.bytes_per_row}};
}

Job::Job(const JobOptions& options, std::unique_ptr<BatchStream> train,
         std::unique_ptr<BatchStream> eval)
    : options_(options), train_(std::move(train)), eval_(std::move(eval)) {
  start_nanos_ = absl::GetCurrentTimeNanos();
}

absl::StatusOr<std::unique_ptr<Job>> Job::Start(const JobOptions& options,
                                                std::unique_ptr<BatchStream> train,
                                                std::unique_ptr<BatchStream> eval,
                                                Transport* transport) {
  RETURN_IF_ERROR(ValidateJobOptions(options));
  const JobLayout& layout = options.layout;
  if (transport != nullptr) RETURN_IF_ERROR(layout.Validate(transport->size()));
  if ((transport == nullptr || transport->rank() == 0) && train == nullptr) {
    return absl::InvalidArgumentError("the job's rank 0 (the oracle) needs the training batches");
  }
  if (transport != nullptr) {
    // A stopped or hung rank is named by rank 0 before its peers time out waiting for it.
    transport->WatchLiveness(options.peer_timeout,
                             [layout](int rank) { return layout.Describe(rank); });
    // Every rank was started with the same options, or none starts. Ranks may reach this at
    // different times (each opens the data to learn its schema): wait as long as for a job's
    // start.
    RETURN_IF_ERROR(CheckOptionsAgree(
        *transport, OptionsThatMustAgree(options),
        std::max(options.peer_timeout, absl::Milliseconds(CheckpointTimeoutMs()))));
  }
  std::unique_ptr<Job> job(new Job(options, std::move(train), std::move(eval)));
  if (transport == nullptr) {
    std::vector<int> server_ranks;
    for (int s = 0; s < layout.servers; ++s) server_ranks.push_back(layout.server_rank(s));
    job->hub_ = std::make_unique<InProcessHub>(layout.size(), options.server_link, server_ranks);
    job->transport_ = &job->hub_->endpoint(0);
  } else {
    job->transport_ = transport;
  }
  if (const absl::Status status = job->StartRoles(); !status.ok()) {
    job->Abort(status);
    return job->aborted();  // the destructor joins what started
  }
  return job;
}

Transport& Job::endpoint(int rank) { return hub_ != nullptr ? hub_->endpoint(rank) : *transport_; }

absl::Status Job::StartRoles() {
  const JobLayout& layout = options_.layout;
  std::vector<int> ranks;
  if (embedded()) {
    for (int rank = 0; rank < layout.size(); ++rank) ranks.push_back(rank);
  } else {
    ranks.push_back(transport_->rank());
  }
  {
    absl::MutexLock lock(&mu_);
    role_statuses_.assign(layout.size(), absl::OkStatus());
  }
  // Trainers first: a trainer that cannot start leaves no role thread behind.
  for (int rank : ranks) {
    if (layout.RoleOf(rank) != Role::kTrainer) continue;
    const int t = layout.IndexOf(rank);
    TrainerOptions trainer_options = options_.trainer;
    trainer_options.peer_timeout = options_.peer_timeout;
    trainer_options.stop_requested = options_.stop_requested;
    absl::StatusOr<std::shared_ptr<DeviceContext>> context =
        TrainerContext(options_.backend, layout, t, endpoint(rank));
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        context.ok() ? Trainer::Create(endpoint(rank), layout, t, *context, trainer_options)
                     : context.status();
    if (!trainer.ok()) return Annotate(trainer.status(), layout.Describe(rank));
    trainers_.push_back(LocalTrainer{t, std::move(*trainer), false});
  }
  for (int rank : ranks) {
    switch (layout.RoleOf(rank)) {
      case Role::kServer:
        StartRoleThread(rank, [this, rank] {
          return RunServerRank(endpoint(rank), options_, options_.layout.IndexOf(rank));
        });
        break;
      case Role::kOracle:
        StartRoleThread(rank, [this] {
          RETURN_IF_ERROR(RunOracle(endpoint(0), options_.layout, *train_, eval_.get(),
                                    OracleOptionsOf(options_), &oracle_stats_));
          // Every plan is sent; the servers wait for Finish's collection, which the caller may
          // start after work of its own: keep them from taking rank 0 for dead meanwhile.
          const absl::Duration every = options_.peer_timeout / 4;
          while (!collecting_.WaitForNotificationWithTimeout(every) && aborted().ok()) {
            for (int s = 0; s < options_.layout.servers; ++s) {
              RETURN_IF_ERROR(endpoint(0).Send(options_.layout.server_rank(s), kTagControl,
                                               EncodeControl(ControlKind::kKeepAlive)));
            }
          }
          return absl::OkStatus();
        });
        break;
      case Role::kTrainer:
        break;
    }
  }
  return absl::OkStatus();
}

void Job::StartRoleThread(int rank, std::function<absl::Status()> body) {
  role_threads_.push_back(RoleThread{rank, std::thread([this, rank, body = std::move(body)] {
                                       // An exception (out of memory in the oracle's window or
                                       // a server's rows) ends the job with its message.
                                       absl::Status status = StatusOfCall(body);
                                       if (!status.ok()) {
                                         // Report the root cause, not the echo of an abort.
                                         const absl::Status root = aborted();
                                         if (root.ok()) {
                                           status =
                                               Annotate(status, options_.layout.Describe(rank));
                                           Abort(status);
                                         } else {
                                           status = root;
                                         }
                                       }
                                       absl::MutexLock lock(&mu_);
                                       role_statuses_[rank] = status;
                                     })});
}

void Job::JoinRoleThreads() {
  for (RoleThread& role : role_threads_) {
    if (role.thread.joinable()) role.thread.join();
  }
}

Job::~Job() {
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = finished_;
  }
  if (!finished && aborted().ok()) {
    Abort(absl::CancelledError("the job was ended before it finished"));
  }
  if (!collecting_.HasBeenNotified()) collecting_.Notify();
  JoinRoleThreads();
  trainers_.clear();  // their threads use the transport
  hub_.reset();
}

void Job::Abort(const absl::Status& status) { transport_->Abort(status); }

absl::Status Job::Fail(int local, absl::Status status) {
  const absl::Status root = aborted();
  if (!root.ok()) return root;
  if (status.ok()) status = absl::UnknownError("a trainer failed without a message");
  Abort(Annotate(status,
                 options_.layout.Describe(options_.layout.trainer_rank(trainers_[local].id))));
  return aborted();
}

absl::Status Job::CompleteTrainer(int local, TrainerOutcome outcome) {
  LocalTrainer& entry = trainers_[local];
  {
    absl::MutexLock lock(&mu_);
    if (entry.completed) {
      return absl::FailedPreconditionError(
          absl::StrCat("trainer ", entry.id, " was completed twice"));
    }
    entry.completed = true;
  }
  Trainer& trainer = *entry.trainer;
  trainer.MarkCompleted();
  const absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(trainer.Flush());  // no-op when the loop flushed already
    // Evaluation batches the loop did not take would hold the oracle's plan credits.
    LocalBatch batch;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, trainer.BeginEvalBatch(&batch));
      if (!more) break;
    }
    outcome.stats = trainer.stats();
    return endpoint(options_.layout.trainer_rank(entry.id))
        .Send(JobLayout::oracle_rank(), kTagControl,
              EncodeControl(ControlKind::kStats, EncodeOutcome(outcome)));
  }();
  if (!status.ok()) return Fail(local, status);
  return absl::OkStatus();
}

bool Job::trainer_completed(int local) const {
  absl::MutexLock lock(&mu_);
  return trainers_[static_cast<size_t>(local)].completed;
}

absl::Status Job::Finish(const ParamSink& sink, JobResult* result) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return absl::FailedPreconditionError("Job::Finish called twice");
    finished_ = true;
  }
  for (int local = 0; local < num_local_trainers(); ++local) {
    bool completed;
    {
      absl::MutexLock lock(&mu_);
      completed = trainers_[local].completed;
    }
    if (!completed && aborted().ok()) (void)CompleteTrainer(local, TrainerOutcome{});
  }
  absl::Status gather = absl::OkStatus();
  if (rank() == 0) {
    // The oracle's thread ends once every plan is sent (and, with the notification, stops its
    // keep-alives); then rank 0 gathers.
    collecting_.Notify();
    for (RoleThread& role : role_threads_) {
      if (role.rank == 0 && role.thread.joinable()) role.thread.join();
    }
    absl::Status oracle;
    {
      absl::MutexLock lock(&mu_);
      oracle = role_statuses_[0];
    }
    if (oracle.ok() && aborted().ok()) {
      result->oracle = oracle_stats_;
      gather = GatherAtRankZero(*transport_, options_, sink, result);
      if (!gather.ok() && aborted().ok()) {
        gather = Annotate(gather, options_.layout.Describe(0));
        Abort(gather);
      }
    }
  }
  JoinRoleThreads();
  result->seconds = static_cast<double>(absl::GetCurrentTimeNanos() - start_nanos_) * 1e-9;
  if (const absl::Status root = aborted(); !root.ok()) return root;
  absl::MutexLock lock(&mu_);
  for (const absl::Status& status : role_statuses_) RETURN_IF_ERROR(status);
  return gather;
}

absl::Status RunEmbeddedJob(const JobOptions& options, std::unique_ptr<BatchStream> train,
                            std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                            const ParamSink& sink, JobResult* result) {
  ASSIGN_OR_RETURN(std::unique_ptr<Job> job,
                   Job::Start(options, std::move(train), std::move(eval)));
  std::vector<std::thread> threads;
  for (int local = 0; local < job->num_local_trainers(); ++local) {
    threads.emplace_back([&job, &loop, local] { RunLocalTrainer(*job, local, loop); });
  }
  for (std::thread& thread : threads) thread.join();
  return job->Finish(sink, result);
}

absl::Status RunDistributedRank(Transport& transport, const JobOptions& options,
                                std::unique_ptr<BatchStream> train,
                                std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                                const ParamSink& sink, JobResult* result) {
  ASSIGN_OR_RETURN(std::unique_ptr<Job> job,
                   Job::Start(options, std::move(train), std::move(eval), &transport));
  for (int local = 0; local < job->num_local_trainers(); ++local) {
    RunLocalTrainer(*job, local, loop);
  }
  return job->Finish(sink, result);
}

}  // namespace bagpipe
