#include "trainer_hooks/job.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "sync/protocol.h"

namespace bagpipe {
namespace {

Bytes EncodeOutcome(const TrainerOutcome& outcome) {
  WireWriter w;
  w.PutVector(outcome.dense_parameters);
  w.PutVector(outcome.eval_predictions);
  w.PutVector(outcome.eval_labels);
  nlohmann::json blob = {{"info", outcome.info}, {"stats", outcome.stats.ToJson()}};
  w.PutString(blob.dump());
  return w.Take();
}

absl::StatusOr<TrainerOutcome> DecodeOutcome(const Bytes& bytes) {
  WireReader r(bytes, "trainer outcome");
  TrainerOutcome outcome;
  RETURN_IF_ERROR(r.GetVector(&outcome.dense_parameters));
  RETURN_IF_ERROR(r.GetVector(&outcome.eval_predictions));
  RETURN_IF_ERROR(r.GetVector(&outcome.eval_labels));
  std::string text;
  RETURN_IF_ERROR(r.GetString(&text));
  nlohmann::json blob = nlohmann::json::parse(text, nullptr, false);
  if (blob.is_discarded()) return absl::DataLossError("trainer outcome: malformed JSON");
  outcome.info = blob["info"];
  const nlohmann::json& s = blob["stats"];
  TrainerStats& st = outcome.stats;
  st.iterations = s.value("iterations", int64_t{0});
  st.ids = s.value("ids", int64_t{0});
  st.unique_rows = s.value("unique_rows", int64_t{0});
  st.hits = s.value("hits", int64_t{0});
  st.fills = s.value("fills", int64_t{0});
  st.evictions = s.value("evictions", int64_t{0});
  st.write_backs = s.value("write_backs", int64_t{0});
  st.flushes = s.value("flushes", int64_t{0});
  st.shared_rows = s.value("shared_rows", int64_t{0});
  st.exchanged_rows = s.value("exchanged_rows", int64_t{0});
  st.exchanged_bytes = s.value("exchanged_bytes", int64_t{0});
  st.fetched_bytes = s.value("fetched_bytes", int64_t{0});
  st.written_back_bytes = s.value("written_back_bytes", int64_t{0});
  st.wait_seconds = s.value("wait_seconds", 0.0);
  st.boundary_seconds = s.value("boundary_seconds", 0.0);
  st.lookup_seconds = s.value("lookup_seconds", 0.0);
  st.reduce_seconds = s.value("reduce_seconds", 0.0);
  st.sync_seconds = s.value("sync_seconds", 0.0);
  st.apply_seconds = s.value("apply_seconds", 0.0);
  st.allreduce_seconds = s.value("allreduce_seconds", 0.0);
  st.dense_allreduce = s.value("dense_allreduce", std::string());
  st.checkpoints = s.value("checkpoints", int64_t{0});
  st.checkpoint_seconds = s.value("checkpoint_seconds", 0.0);
  st.host_syncs = s.value("host_syncs", int64_t{0});
  st.max_iteration_host_syncs = s.value("max_iteration_host_syncs", int64_t{0});
  st.growth_iterations = s.value("growth_iterations", int64_t{0});
  st.last_growth_iteration = s.value("last_growth_iteration", int64_t{-1});
  return outcome;
}

ServerStats ServerStatsFromJson(const nlohmann::json& j) {
  ServerStats s;
  s.fetch_requests = j.value("fetch_requests", int64_t{0});
  s.rows_fetched = j.value("rows_fetched", int64_t{0});
  s.write_back_messages = j.value("write_back_messages", int64_t{0});
  s.rows_written_back = j.value("rows_written_back", int64_t{0});
  s.deferred_fetches = j.value("deferred_fetches", int64_t{0});
  s.rows_stored = j.value("rows_stored", int64_t{0});
  s.bytes_per_row = j.value("bytes_per_row", 0.0);
  return s;
}

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
    ASSIGN_OR_RETURN(result->trainers[t], DecodeOutcome(body));
  }
  const int record_floats =
      RecordFloats(options.trainer.sparse_optimizer.kind, options.trainer.dim);
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
    nlohmann::json j = nlohmann::json::parse(std::string(body.begin(), body.end()), nullptr, false);
    result->servers[s] = ServerStatsFromJson(j);
  }
  return absl::OkStatus();
}

absl::Status RunTrainerRank(Transport& transport, const JobOptions& options, int t,
                            const TrainLoop& loop) {
  std::shared_ptr<DeviceContext> context;
  if (options.backend == Backend::kCuda) {
    const int devices = CudaDeviceCount();
    if (devices == 0) return absl::FailedPreconditionError("--device cuda but no CUDA device");
    // The trainer's index among the trainers of its machine picks the GPU (not the global
    // index: trainers of one machine would share a GPU under --map-by node).
    const int local = LocalTrainerIndex(options.layout, t, transport.NodeOfRanks());
    ASSIGN_OR_RETURN(context, DeviceContext::Cuda(local % devices));
  } else {
    context = DeviceContext::Cpu();
  }
  TrainerOptions trainer_options = options.trainer;
  trainer_options.peer_timeout = options.peer_timeout;
  trainer_options.stop_requested = options.stop_requested;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(transport, options.layout, t, context, trainer_options));
  TrainerOutcome outcome;
  RETURN_IF_ERROR(loop(*trainer, &outcome));
  RETURN_IF_ERROR(trainer->Flush());  // no-op when the loop flushed already
  outcome.stats = trainer->stats();
  return transport.Send(JobLayout::oracle_rank(), kTagControl,
                        EncodeControl(ControlKind::kStats, EncodeOutcome(outcome)));
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

absl::Status RunOracleRank(Transport& transport, const JobOptions& options, BatchStream& train,
                           BatchStream* eval, const ParamSink& sink, JobResult* result) {
  OracleRoleOptions oracle = options.oracle;
  oracle.peer_timeout = options.peer_timeout;
  oracle.stop_requested = options.stop_requested;
  oracle.checkpoint = options.checkpoint;
  const OptimizerConfig& sparse = options.trainer.sparse_optimizer;
  oracle.checkpoint.identity.update(CheckpointIdentity(
      options.layout, options.trainer.dim,
      {{"kind", std::string(OptimizerName(sparse.kind))},
       {"lr", sparse.learning_rate},
       {"eps", sparse.eps},
       {"initial_accumulator", sparse.initial_accumulator}},
      options.trainer.initializer.seed(), options.oracle.planner.schema.table_rows));
  RETURN_IF_ERROR(RunOracle(transport, options.layout, train, eval, oracle, &result->oracle));
  return GatherAtRankZero(transport, options, sink, result);
}

// Runs one rank's role; on failure aborts the job so that no other rank waits forever.
absl::Status RunRole(Transport& transport, const JobOptions& options, BatchStream* train,
                     BatchStream* eval, const TrainLoop& loop, const ParamSink& sink,
                     JobResult* result) {
  const JobLayout& layout = options.layout;
  const int rank = transport.rank();
  absl::Status status;
  switch (layout.RoleOf(rank)) {
    case Role::kOracle:
      status = RunOracleRank(transport, options, *train, eval, sink, result);
      break;
    case Role::kServer:
      status = RunServerRank(transport, options, layout.IndexOf(rank));
      break;
    case Role::kTrainer:
      status = RunTrainerRank(transport, options, layout.IndexOf(rank), loop);
      break;
  }
  if (!status.ok()) {
    // Report the root cause, not the echo of an abort another rank started.
    const absl::Status aborted = transport.aborted();
    if (!aborted.ok()) return aborted;
    status = Annotate(status, layout.Describe(rank));
    transport.Abort(status);
  }
  return status;
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

absl::Status RunEmbeddedJob(const JobOptions& options, std::unique_ptr<BatchStream> train,
                            std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                            const ParamSink& sink, JobResult* result) {
  const JobLayout& layout = options.layout;
  RETURN_IF_ERROR(layout.Validate());
  std::vector<int> server_ranks;
  for (int s = 0; s < layout.servers; ++s) server_ranks.push_back(layout.server_rank(s));
  InProcessHub hub(layout.size(), options.server_link, server_ranks);
  Stopwatch watch;
  std::vector<absl::Status> statuses(layout.size());
  std::vector<std::thread> threads;
  for (int rank = layout.size() - 1; rank >= 0; --rank) {
    threads.emplace_back([&, rank] {
      statuses[rank] =
          RunRole(hub.endpoint(rank), options, train.get(), eval.get(), loop, sink, result);
    });
  }
  for (auto& thread : threads) thread.join();
  result->seconds = watch.Seconds();
  const absl::Status aborted = hub.endpoint(0).aborted();
  if (!aborted.ok()) return aborted;
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

absl::Status RunDistributedRank(Transport& transport, const JobOptions& options,
                                std::unique_ptr<BatchStream> train,
                                std::unique_ptr<BatchStream> eval, const TrainLoop& loop,
                                const ParamSink& sink, JobResult* result) {
  RETURN_IF_ERROR(options.layout.Validate(transport.size()));
  Stopwatch watch;
  absl::Status status = RunRole(transport, options, train.get(), eval.get(), loop, sink, result);
  result->seconds = watch.Seconds();
  return status;
}

}  // namespace bagpipe
