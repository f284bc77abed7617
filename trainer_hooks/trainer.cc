#include "trainer_hooks/trainer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/embedding_cache.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "core/tunables.h"
#include "prefetch/prefetcher.h"
#include "sync/collectives.h"
#if BAGPIPE_WITH_CUDA
#include "sync/nccl_communicator.h"
#endif
#include "sync/protocol.h"
#include "trainer_hooks/plan_codec.h"

namespace bagpipe {

nlohmann::json TrainerStats::ToJson() const {
  return {{"iterations", iterations},
          {"ids", ids},
          {"unique_rows", unique_rows},
          {"hits", hits},
          {"hit_rate", hit_rate()},
          {"fills", fills},
          {"evictions", evictions},
          {"write_backs", write_backs},
          {"flushes", flushes},
          {"shared_rows", shared_rows},
          {"exchanged_rows", exchanged_rows},
          {"exchanged_bytes", exchanged_bytes},
          {"fetched_bytes", fetched_bytes},
          {"written_back_bytes", written_back_bytes},
          {"wait_seconds", wait_seconds},
          {"boundary_seconds", boundary_seconds},
          {"lookup_seconds", lookup_seconds},
          {"reduce_seconds", reduce_seconds},
          {"sync_seconds", sync_seconds},
          {"apply_seconds", apply_seconds},
          {"allreduce_seconds", allreduce_seconds},
          {"checkpoints", checkpoints},
          {"checkpoint_seconds", checkpoint_seconds},
          {"dense_allreduce", dense_allreduce}};
}

namespace {

// Write-backs stamped with this are a trainer's last: its watermark becomes "infinite".
constexpr Iteration kFinalStamp = std::numeric_limits<Iteration>::max() / 4;
// Evaluation fetches are numbered past the drain and the write-back horizon so that servers
// serve them only after every trainer's final write-back (sync/protocol.h).
constexpr Iteration kEvalIterationBase = std::numeric_limits<Iteration>::max() / 8;

// A host or device buffer of T that grows on demand (contents are not preserved).
template <typename T>
class Buffer {
 public:
  absl::Status Reserve(const std::shared_ptr<DeviceContext>& context, size_t size) {
    if (array_.size() >= size && array_.size() > 0) return absl::OkStatus();
    size_t capacity = std::max<size_t>(64, array_.size());
    while (capacity < size) capacity *= 2;
    ASSIGN_OR_RETURN(array_, DeviceArray<T>::Create(context, capacity));
    return absl::OkStatus();
  }
  T* data() { return array_.data(); }

 private:
  DeviceArray<T> array_;
};

// Gradients of one iteration's shared rows that are exchanged in the background.
struct LaterExchange {
  Iteration iteration = 0;
  std::vector<int32_t> shared_indices;  // indices into the plan's `shared` (later rows only)
  std::vector<SharedRow> shared;        // the plan's shared list
  std::vector<PeerExchange> peers;
  std::vector<float> own;  // own gradient per shared entry (dim each; 0 if none)
};

}  // namespace

class Trainer::Impl {
 public:
  Impl(Transport& transport, JobLayout layout, int id, std::shared_ptr<DeviceContext> context,
       TrainerOptions options)
      : transport_(transport),
        layout_(layout),
        id_(id),
        context_(std::move(context)),
        options_(std::move(options)),
        dim_(options_.dim),
        record_floats_(RecordFloats(options_.sparse_optimizer.kind, options_.dim)) {}

  ~Impl() { StopPlanThread(); }

  absl::Status Start() {
    RETURN_IF_ERROR(context_->MakeCurrent());
    const bool device_mode = options_.policy == CachePolicy::kDevice;
    const int64_t capacity = device_mode
                                 ? static_cast<int64_t>(options_.initializer.table_offsets().back())
                                 : options_.cache_rows;
    if (capacity <= 0) {
      return absl::InvalidArgumentError("the cache needs a positive --cache-rows");
    }
    ASSIGN_OR_RETURN(cache_,
                     EmbeddingCache::Create(context_, capacity, dim_, options_.sparse_optimizer));
    if (device_mode) RETURN_IF_ERROR(cache_->InitializeRows(options_.initializer, 0, capacity));
    prefetcher_ = std::make_unique<Prefetcher>(transport_, layout_, id_, context_, record_floats_,
                                               options_.peer_timeout);
    plan_thread_ = std::thread([this] { PlanLoop(); });
    return absl::OkStatus();
  }

  int id() const { return id_; }
  int num_trainers() const { return layout_.trainers; }
  const std::shared_ptr<DeviceContext>& context() const { return context_; }
  EmbeddingCache& cache() { return *cache_; }

  absl::Status SetLoopState(LoopState state) {
    RETURN_IF_ERROR(AwaitStart());
    loop_state_ = std::move(state);
    if (start_state_.empty()) return absl::OkStatus();
    if (!loop_state_.restore) {
      return absl::FailedPreconditionError(
          "the job resumes from a checkpoint with loop state, but LoopState::restore is empty");
    }
    RETURN_IF_ERROR(Annotate(loop_state_.restore(start_state_),
                             absl::StrCat("restoring the loop state of trainer ", id_)));
    start_state_.clear();
    return absl::OkStatus();
  }

  absl::StatusOr<Iteration> FirstIteration() {
    RETURN_IF_ERROR(AwaitStart());
    return first_iteration_;
  }

  TrainerStats stats() const {
    TrainerStats stats = stats_;
    const PrefetchStats prefetch = prefetcher_->stats();
    stats.fetched_bytes = prefetch.bytes;
    return stats;
  }

  absl::StatusOr<bool> BeginIteration(LocalBatch* batch) {
    if (in_iteration_) {
      return absl::FailedPreconditionError("BeginIteration called twice without EndIteration");
    }
    if (training_done_) return false;
    RETURN_IF_ERROR(AwaitStart());
    if (!start_state_.empty()) {
      return absl::FailedPreconditionError(
          "the job resumes from a checkpoint that holds the training loop's state (dense "
          "parameters, optimizer state), but the loop registered none (Trainer::SetLoopState)");
    }
    ForwardStopRequest();
    std::pair<PlanKind, TrainerPlan> next;
    while (true) {
      Stopwatch wait_watch;
      ASSIGN_OR_RETURN(next, PopPlan());
      stats_.wait_seconds += wait_watch.Seconds();
      if (next.first != PlanKind::kCheckpoint) break;
      RETURN_IF_ERROR(RunCheckpoint(next.second));
    }
    if (next.first == PlanKind::kDrain) {
      drain_ = std::move(next.second);
      training_done_ = true;
      return false;
    }
    if (next.first != PlanKind::kIteration) {
      return absl::InternalError("expected a training plan from the oracle");
    }
    plan_ = std::move(next.second);
    Stopwatch boundary_watch;
    RETURN_IF_ERROR(CompleteLaterExchanges(plan_.iteration - 2));
    RETURN_IF_ERROR(RunExtractions(plan_, plan_.iteration));
    Stopwatch fill_wait;
    ASSIGN_OR_RETURN(Prefetcher::Staging staging, prefetcher_->Wait(plan_.iteration));
    const double waited = fill_wait.Seconds();
    stats_.wait_seconds += waited;
    RETURN_IF_ERROR(FillFromStaging(plan_, staging));
    prefetcher_->Release(plan_.iteration);
    RETURN_IF_ERROR(StageBatch(plan_, batch));
    stats_.boundary_seconds += boundary_watch.Seconds() - waited;
    const int64_t hits =
        static_cast<int64_t>(plan_.unique_rows.size()) - static_cast<int64_t>(plan_.fills.size());
    stats_.hits += std::max<int64_t>(hits, 0);
    stats_.fills += static_cast<int64_t>(plan_.fills.size());
    stats_.unique_rows += static_cast<int64_t>(plan_.unique_rows.size());
    stats_.ids += static_cast<int64_t>(plan_.unique_index.size());
    in_iteration_ = true;
    lookup_cache_ = cache_.get();
    return true;
  }

  absl::StatusOr<const float*> LookupPooled() {
    if (lookup_cache_ == nullptr) {
      return absl::FailedPreconditionError("LookupPooled outside an iteration");
    }
    ScopedTimer timer(&stats_.lookup_seconds);
    const size_t out = static_cast<size_t>(batch_.num_samples) * batch_.num_tables * dim_;
    RETURN_IF_ERROR(pooled_.Reserve(context_, out));
    RETURN_IF_ERROR(lookup_cache_->Gather(batch_.slots, batch_.offsets, batch_.num_tables,
                                          batch_.num_samples, pooled_.data()));
    return pooled_.data();
  }

  absl::Status EndIteration(const float* pooled_grad) {
    if (!in_iteration_) return absl::FailedPreconditionError("EndIteration without BeginIteration");
    {
      ScopedTimer timer(&stats_.reduce_seconds);
      RETURN_IF_ERROR(row_grads_.Reserve(context_, static_cast<size_t>(batch_.num_unique) * dim_));
      RETURN_IF_ERROR(cache_->ReduceGradients(backward_, pooled_grad, row_grads_.data()));
    }
    return FinishIteration(row_grads_.data());
  }

  absl::Status EndIterationWithRowGradients(const float* row_grads) {
    if (!in_iteration_) return absl::FailedPreconditionError("EndIteration without BeginIteration");
    return FinishIteration(row_grads);
  }

  absl::Status AllReduce(float* data, size_t count) {
    ScopedTimer timer(&stats_.allreduce_seconds);
    return AllReduceSum(transport_, trainer_group(), data, count, options_.peer_timeout);
  }

  absl::Status AllReduceDevice(float* data, size_t count) {
    if (layout_.trainers <= 1) {
      stats_.dense_allreduce = "none";
      return absl::OkStatus();
    }
    if (!context_->is_cuda()) {
      stats_.dense_allreduce = "transport";
      return AllReduce(data, count);
    }
    ScopedTimer timer(&stats_.allreduce_seconds);
#if BAGPIPE_WITH_CUDA
    if (!nccl_setup_done_) {
      // Every trainer reaches its first dense all-reduce: set NCCL up now, once.
      nccl_setup_done_ = true;
      std::string unusable;
      ASSIGN_OR_RETURN(
          nccl_, NcclCommunicator::Create(transport_, trainer_group(), context_->device_index(),
                                          options_.peer_timeout, &unusable));
      if (nccl_ == nullptr && id_ == 0) {
        BAGPIPE_LOG(WARNING) << "dense all-reduce goes through host memory, not NCCL: " << unusable;
      }
    }
    if (nccl_ != nullptr) {
      stats_.dense_allreduce = "nccl";
      return nccl_->AllReduceSum(data, count,
                                 static_cast<CUstream_st*>(context_->stream(Stream::kCompute)),
                                 options_.deterministic, options_.peer_timeout);
    }
#endif
    stats_.dense_allreduce = "transport-via-host";
    host_dense_.resize(count);
    RETURN_IF_ERROR(context_->CopyToHost(host_dense_.data(), data, count * sizeof(float)));
    RETURN_IF_ERROR(context_->Synchronize());
    RETURN_IF_ERROR(AllReduceSum(transport_, trainer_group(), host_dense_.data(), count,
                                 options_.peer_timeout));
    RETURN_IF_ERROR(context_->CopyToDevice(data, host_dense_.data(), count * sizeof(float)));
    return context_->Synchronize();
  }

  absl::Status Flush() {
    if (in_iteration_) return absl::FailedPreconditionError("Flush inside an iteration");
    if (flushed_) return absl::OkStatus();
    // Consume the remaining plans up to the drain (a loop may stop early).
    if (!training_done_) RETURN_IF_ERROR(AwaitStart());
    while (!training_done_) {
      ASSIGN_OR_RETURN(auto next, PopPlan());
      if (next.first == PlanKind::kCheckpoint) {
        RETURN_IF_ERROR(RunCheckpoint(next.second));
      } else if (next.first == PlanKind::kDrain) {
        drain_ = std::move(next.second);
        training_done_ = true;
      } else if (next.first == PlanKind::kIteration) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Flush before the end of training: iteration ", next.second.iteration,
            " was never run (every planned iteration must run, or the plans' write-backs and "
            "exchanges would be missing)"));
      } else {
        return absl::InternalError("expected the drain plan");
      }
    }
    RETURN_IF_ERROR(CompleteLaterExchanges(kFinalStamp));
    RETURN_IF_ERROR(RunExtractions(drain_, drain_.iteration));
    for (int s = 0; s < layout_.servers; ++s) {
      RETURN_IF_ERROR(transport_.Send(layout_.server_rank(s), kTagWriteBack,
                                      EncodeWriteBack(WriteBack{kFinalStamp, {}, {}})));
      RETURN_IF_ERROR(
          transport_.Send(layout_.server_rank(s), kTagControl, EncodeControl(ControlKind::kDone)));
    }
    flushed_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> BeginEvalBatch(LocalBatch* batch) {
    if (!flushed_) return absl::FailedPreconditionError("evaluation runs after Flush");
    if (eval_done_) return false;
    ASSIGN_OR_RETURN(auto next, PopPlan());
    if (next.first == PlanKind::kEnd) {
      eval_done_ = true;
      return false;
    }
    if (next.first != PlanKind::kEval) return absl::InternalError("expected an evaluation plan");
    plan_ = std::move(next.second);
    const Iteration ticket = kEvalIterationBase + plan_.iteration;
    RETURN_IF_ERROR(prefetcher_->Request(ticket, plan_.unique_rows,
                                         std::vector<Iteration>(plan_.unique_rows.size(), -1)));
    ASSIGN_OR_RETURN(Prefetcher::Staging staging, prefetcher_->Wait(ticket));
    const int64_t rows = std::max<int64_t>(1, staging.rows);
    if (scratch_ == nullptr || scratch_capacity_ < rows) {
      scratch_capacity_ = std::max<int64_t>(rows, 2 * scratch_capacity_);
      ASSIGN_OR_RETURN(scratch_, EmbeddingCache::Create(context_, scratch_capacity_, dim_,
                                                        options_.sparse_optimizer));
    }
    RETURN_IF_ERROR(slot_buffer_.Reserve(context_, std::max<size_t>(1, plan_.unique_slots.size())));
    RETURN_IF_ERROR(context_->CopyToDevice(slot_buffer_.data(), plan_.unique_slots.data(),
                                           plan_.unique_slots.size() * sizeof(SlotId)));
    RETURN_IF_ERROR(scratch_->Fill(slot_buffer_.data(), staging.device, staging.rows));
    RETURN_IF_ERROR(context_->Synchronize());
    prefetcher_->Release(ticket);
    RETURN_IF_ERROR(StageBatch(plan_, batch));
    lookup_cache_ = scratch_.get();
    return true;
  }

 private:
  Group trainer_group() const {
    Group group;
    for (int t = 0; t < layout_.trainers; ++t) group.ranks.push_back(layout_.trainer_rank(t));
    group.me = id_;
    return group;
  }

  // --- job start, checkpoints, stops (trainer_hooks/checkpoint.h) ----------------------------

  // Receives the oracle's start message once: the first iteration and, when the job resumes,
  // the loop's state. The oracle sends it after validating (and, to resume, loading) the
  // checkpoint, which may take long: the wait is the checkpoint timeout.
  absl::Status AwaitStart() {
    if (started_) return absl::OkStatus();
    ASSIGN_OR_RETURN(Message message,
                     transport_.Receive(JobLayout::oracle_rank(), kTagCheckpoint,
                                        absl::Milliseconds(CheckpointTimeoutMs())));
    WireReader r(message.payload, "job start message");
    RETURN_IF_ERROR(r.Get(&first_iteration_));
    RETURN_IF_ERROR(r.GetString(&start_state_));
    RETURN_IF_ERROR(r.ExpectDone());
    started_ = true;
    return absl::OkStatus();
  }

  // A checkpoint's cut at the boundary of plan.iteration: every exchange completes, every dirty
  // row goes back to its server (the servers write their shards once all are in), and trainer
  // 0 sends the loop's state to the oracle. The next plan comes once the checkpoint is written.
  absl::Status RunCheckpoint(const TrainerPlan& plan) {
    Stopwatch watch;
    RETURN_IF_ERROR(CompleteLaterExchanges(kFinalStamp));
    RETURN_IF_ERROR(RunExtractions(plan, plan.iteration));
    if (id_ == 0) {
      std::string state;
      if (loop_state_.save) {
        ASSIGN_OR_RETURN(state, loop_state_.save());
      }
      WireWriter w;
      w.Put(plan.iteration);
      w.PutString(state);
      RETURN_IF_ERROR(transport_.Send(JobLayout::oracle_rank(), kTagCheckpoint, w.Take()));
    }
    ++stats_.checkpoints;
    stats_.checkpoint_seconds += watch.Seconds();
    after_checkpoint_ = true;
    return absl::OkStatus();
  }

  // Tells the oracle once that this process was asked to stop (SIGINT/SIGTERM).
  void ForwardStopRequest() {
    if (stop_forwarded_ || !options_.stop_requested) return;
    const int signal = options_.stop_requested();
    if (signal == 0) return;
    stop_forwarded_ = true;
    WireWriter w;
    w.Put<int32_t>(signal);
    (void)transport_.Send(JobLayout::oracle_rank(), kTagStopRequest, w.Take());
  }

  // --- plans -------------------------------------------------------------------------------

  void PlanLoop() {
    while (true) {
      // Plans come from the oracle; a message from this rank itself is StopPlanThread's wake-up.
      // PopPlan bounds the wait with the peer timeout.
      absl::StatusOr<Message> message =
          transport_.Receive(kAnySource, kTagPlan, absl::Hours(24 * 365));
      absl::MutexLock lock(&plan_mu_);
      if (stop_plans_) return;
      if (!message.ok()) {
        plan_error_ = message.status();
        return;
      }
      if (message->source != JobLayout::oracle_rank()) {
        plan_error_ = absl::DataLossError(
            absl::StrCat("trainer ", id_, " got a plan from rank ", message->source));
        return;
      }
      PlanKind kind;
      TrainerPlan plan;
      absl::Status status = DecodePlan(message->payload, &kind, &plan);
      if (status.ok() && kind == PlanKind::kIteration) {
        std::vector<RowId> rows;
        std::vector<Iteration> stamps;
        rows.reserve(plan.fills.size());
        stamps.reserve(plan.fills.size());
        for (const Fill& fill : plan.fills) {
          rows.push_back(fill.row);
          stamps.push_back(fill.after_stamp);
        }
        status = prefetcher_->Request(plan.iteration, rows, stamps);
      }
      if (!status.ok()) {
        plan_error_ = status;
        return;
      }
      plans_.emplace_back(kind, std::move(plan));
      if (kind == PlanKind::kEnd) return;
    }
  }

  void StopPlanThread() {
    if (!plan_thread_.joinable()) return;
    {
      absl::MutexLock lock(&plan_mu_);
      stop_plans_ = true;
    }
    // Wake the receiver if it still waits for plans (the job ended early or failed).
    (void)transport_.Send(transport_.rank(), kTagPlan, Bytes{});
    plan_thread_.join();
  }

  // Waits for the next plan (with the peer timeout) and returns one credit to the oracle.
  absl::StatusOr<std::pair<PlanKind, TrainerPlan>> PopPlan() {
    absl::MutexLock lock(&plan_mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(plan_mu_) {
      return !plans_.empty() || !plan_error_.ok();
    };
    // After a checkpoint's cut the next plan comes once the checkpoint is written.
    const absl::Duration timeout =
        after_checkpoint_ ? absl::Milliseconds(CheckpointTimeoutMs()) : options_.peer_timeout;
    if (!plan_mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "trainer %d waited %s for a plan from the oracle (rank 0); it died or hung", id_,
          absl::FormatDuration(timeout)));
    }
    after_checkpoint_ = false;
    if (plans_.empty()) return plan_error_;
    auto next = std::move(plans_.front());
    plans_.pop_front();
    RETURN_IF_ERROR(transport_.Send(JobLayout::oracle_rank(), kTagPlanCredit, Bytes{}));
    return next;
  }

  // --- boundary ----------------------------------------------------------------------------

  // Copies the plan's extracted rows out of the cache and writes back those it owns, stamped
  // `stamp`; always sends every server a (possibly empty) write-back: the watermark.
  absl::Status RunExtractions(const TrainerPlan& plan, Iteration stamp) {
    const size_t n = plan.extract.size();
    std::vector<WriteBack> per_server(layout_.servers);
    for (WriteBack& wb : per_server) wb.stamp = stamp;
    if (n > 0) {
      std::vector<SlotId> slots(n);
      for (size_t k = 0; k < n; ++k) slots[k] = plan.extract[k].slot;
      RETURN_IF_ERROR(slot_buffer_.Reserve(context_, n));
      RETURN_IF_ERROR(record_buffer_.Reserve(context_, n * record_floats_));
      RETURN_IF_ERROR(
          context_->CopyToDevice(slot_buffer_.data(), slots.data(), n * sizeof(SlotId)));
      RETURN_IF_ERROR(
          cache_->Extract(slot_buffer_.data(), static_cast<int64_t>(n), record_buffer_.data()));
      host_records_.resize(n * record_floats_);
      RETURN_IF_ERROR(context_->CopyToHost(host_records_.data(), record_buffer_.data(),
                                           n * record_floats_ * sizeof(float)));
      RETURN_IF_ERROR(context_->Synchronize());
      for (size_t k = 0; k < n; ++k) {
        const Extraction& e = plan.extract[k];
        if (e.evict) ++stats_.evictions;
        if (!e.evict) ++stats_.flushes;
        if (!e.write_back) continue;
        WriteBack& wb = per_server[ServerOfRow(e.row, layout_.servers)];
        wb.rows.push_back(e.row);
        wb.records.insert(wb.records.end(), host_records_.begin() + k * record_floats_,
                          host_records_.begin() + (k + 1) * record_floats_);
        ++stats_.write_backs;
        stats_.written_back_bytes += record_floats_ * static_cast<int64_t>(sizeof(float));
      }
    }
    for (int s = 0; s < layout_.servers; ++s) {
      RETURN_IF_ERROR(
          transport_.Send(layout_.server_rank(s), kTagWriteBack, EncodeWriteBack(per_server[s])));
    }
    return absl::OkStatus();
  }

  absl::Status FillFromStaging(const TrainerPlan& plan, const Prefetcher::Staging& staging) {
    const size_t n = plan.fills.size();
    if (static_cast<int64_t>(n) != staging.rows) {
      return absl::InternalError("staging does not match the plan's fills");
    }
    if (n == 0) return absl::OkStatus();
    std::vector<SlotId> slots(n);
    for (size_t k = 0; k < n; ++k) slots[k] = plan.fills[k].slot;
    RETURN_IF_ERROR(slot_buffer_.Reserve(context_, n));
    RETURN_IF_ERROR(context_->CopyToDevice(slot_buffer_.data(), slots.data(), n * sizeof(SlotId)));
    RETURN_IF_ERROR(cache_->Fill(slot_buffer_.data(), staging.device, static_cast<int64_t>(n)));
    // The staging buffer is recycled after Release: the fill must be complete.
    return context_->Synchronize();
  }

  // Puts the plan's local batch in device memory and prepares the backward index.
  absl::Status StageBatch(const TrainerPlan& plan, LocalBatch* batch) {
    const size_t ids = plan.unique_index.size();
    occurrence_slots_.resize(ids);
    for (size_t j = 0; j < ids; ++j) occurrence_slots_[j] = plan.unique_slots[plan.unique_index[j]];
    batch_ = LocalBatch();
    batch_.iteration = plan.iteration;
    batch_.num_samples = plan.num_samples;
    batch_.num_dense = plan.num_dense;
    batch_.num_tables = plan.num_tables;
    batch_.global_batch_size = plan.global_samples;
    batch_.num_ids = static_cast<int64_t>(ids);
    batch_.num_unique = static_cast<int>(plan.unique_rows.size());
    batch_.labels_host = plan.labels.data();
    batch_.unique_rows_host = plan.unique_rows.data();
    if (context_->is_cuda()) {
      RETURN_IF_ERROR(dense_.Reserve(context_, std::max<size_t>(1, plan.dense.size())));
      RETURN_IF_ERROR(labels_.Reserve(context_, std::max<size_t>(1, plan.labels.size())));
      RETURN_IF_ERROR(offsets_.Reserve(context_, plan.offsets.size()));
      RETURN_IF_ERROR(slots_.Reserve(context_, std::max<size_t>(1, ids)));
      RETURN_IF_ERROR(
          unique_slots_.Reserve(context_, std::max<size_t>(1, plan.unique_slots.size())));
      RETURN_IF_ERROR(context_->CopyToDevice(dense_.data(), plan.dense.data(),
                                             plan.dense.size() * sizeof(float)));
      RETURN_IF_ERROR(context_->CopyToDevice(labels_.data(), plan.labels.data(),
                                             plan.labels.size() * sizeof(float)));
      RETURN_IF_ERROR(context_->CopyToDevice(offsets_.data(), plan.offsets.data(),
                                             plan.offsets.size() * sizeof(int64_t)));
      RETURN_IF_ERROR(
          context_->CopyToDevice(slots_.data(), occurrence_slots_.data(), ids * sizeof(int32_t)));
      RETURN_IF_ERROR(context_->CopyToDevice(unique_slots_.data(), plan.unique_slots.data(),
                                             plan.unique_slots.size() * sizeof(SlotId)));
      batch_.dense = dense_.data();
      batch_.labels = labels_.data();
      batch_.offsets = offsets_.data();
      batch_.slots = slots_.data();
      batch_.unique_slots = unique_slots_.data();
    } else {
      batch_.dense = plan.dense.data();
      batch_.labels = plan.labels.data();
      batch_.offsets = plan.offsets.data();
      batch_.slots = occurrence_slots_.data();
      batch_.unique_slots = plan.unique_slots.data();
    }
    RETURN_IF_ERROR(backward_.Build(context_, plan.offsets.data(), plan.num_tables,
                                    plan.num_samples, plan.unique_index.data(),
                                    static_cast<int64_t>(ids), batch_.num_unique));
    *batch = batch_;
    return absl::OkStatus();
  }

  // --- sync and apply ----------------------------------------------------------------------

  absl::Status FinishIteration(const float* row_grads) {
    const TrainerPlan& plan = plan_;
    in_iteration_ = false;
    lookup_cache_ = nullptr;
    if (plan.shared.empty()) {
      ScopedTimer timer(&stats_.apply_seconds);
      RETURN_IF_ERROR(ApplyPrivate(plan, row_grads));
    } else {
      RETURN_IF_ERROR(ExchangeAndApply(plan, row_grads));
    }
    ++stats_.iterations;
    return absl::OkStatus();
  }

  // Applies the trainer's own gradient to its private rows.
  absl::Status ApplyPrivate(const TrainerPlan& plan, const float* row_grads) {
    const size_t n = plan.private_unique.size();
    if (n == 0) return absl::OkStatus();
    if (n == plan.unique_slots.size()) {
      bool identity = true;
      for (size_t k = 0; k < n && identity; ++k)
        identity = plan.private_unique[k] == static_cast<int32_t>(k);
      if (identity) {
        return cache_->Apply(batch_.unique_slots, row_grads, static_cast<int64_t>(n));
      }
    }
    std::vector<int32_t> index(plan.private_unique.begin(), plan.private_unique.end());
    std::vector<SlotId> slots(n);
    for (size_t k = 0; k < n; ++k) slots[k] = plan.unique_slots[index[k]];
    RETURN_IF_ERROR(apply_slots_.Reserve(context_, n));
    RETURN_IF_ERROR(apply_index_.Reserve(context_, n));
    RETURN_IF_ERROR(context_->CopyToDevice(apply_slots_.data(), slots.data(), n * sizeof(SlotId)));
    RETURN_IF_ERROR(context_->CopyToDevice(apply_index_.data(), index.data(), n * sizeof(int32_t)));
    return cache_->ApplyIndexed(apply_slots_.data(), apply_index_.data(), row_grads,
                                static_cast<int64_t>(n));
  }

  absl::Status ExchangeAndApply(const TrainerPlan& plan, const float* row_grads) {
    // Own gradients on the host (they go to peers and into the combined sums).
    host_grads_.resize(static_cast<size_t>(batch_.num_unique) * dim_);
    RETURN_IF_ERROR(
        context_->CopyToHost(host_grads_.data(), row_grads, host_grads_.size() * sizeof(float)));
    RETURN_IF_ERROR(context_->Synchronize());
    // Send: per peer, the gradients of the rows it holds that this trainer touched.
    {
      ScopedTimer timer(&stats_.sync_seconds);
      for (const PeerExchange& peer : plan.peers) {
        for (const bool now : {true, false}) {
          std::vector<float> payload;
          for (int32_t k : peer.send) {
            const SharedRow& row = plan.shared[k];
            if (row.now != now) continue;
            const float* g = host_grads_.data() + static_cast<size_t>(row.own_unique) * dim_;
            payload.insert(payload.end(), g, g + dim_);
          }
          if (payload.empty()) continue;
          stats_.exchanged_rows += static_cast<int64_t>(payload.size() / dim_);
          stats_.exchanged_bytes += static_cast<int64_t>(payload.size() * sizeof(float));
          RETURN_IF_ERROR(SendGradients(peer.peer, now, plan.iteration, payload));
        }
      }
    }
    {
      ScopedTimer timer(&stats_.apply_seconds);
      RETURN_IF_ERROR(ApplyPrivate(plan, row_grads));
    }
    // Shared rows needed next iteration: receive, combine in trainer order, apply now.
    std::vector<int32_t> now_rows, later_rows;
    for (size_t k = 0; k < plan.shared.size(); ++k) {
      (plan.shared[k].now ? now_rows : later_rows).push_back(static_cast<int32_t>(k));
    }
    stats_.shared_rows += static_cast<int64_t>(plan.shared.size());
    std::vector<float> own(plan.shared.size() * dim_, 0.0f);
    for (size_t k = 0; k < plan.shared.size(); ++k) {
      if (plan.shared[k].own_unique < 0) continue;
      std::memcpy(own.data() + k * dim_,
                  host_grads_.data() + static_cast<size_t>(plan.shared[k].own_unique) * dim_,
                  dim_ * sizeof(float));
    }
    {
      ScopedTimer timer(&stats_.sync_seconds);
      RETURN_IF_ERROR(CombineAndApply(plan.iteration, plan.shared, plan.peers, now_rows, own,
                                      /*now=*/true));
    }
    if (!later_rows.empty()) {
      LaterExchange later;
      later.iteration = plan.iteration;
      later.shared_indices = std::move(later_rows);
      later.shared = plan.shared;
      later.peers = plan.peers;
      later.own = std::move(own);
      later_.push_back(std::move(later));
    }
    return absl::OkStatus();
  }

  absl::Status SendGradients(int peer, bool now, Iteration iteration,
                             const std::vector<float>& payload) {
    WireWriter w;
    w.Put(iteration);
    w.PutVector(payload);
    return transport_.Send(layout_.trainer_rank(peer), now ? kTagGradients : kTagGradientsLater,
                           w.Take());
  }

  // Sums, for each shared row in `rows`, the touchers' gradients in trainer order (own
  // gradients from `own`, peers' from their messages) starting from +0.0f, and applies them.
  absl::Status CombineAndApply(Iteration iteration, const std::vector<SharedRow>& shared,
                               const std::vector<PeerExchange>& peers,
                               const std::vector<int32_t>& rows, const std::vector<float>& own,
                               bool now) {
    if (rows.empty()) return absl::OkStatus();
    // Position of each shared index within `rows`.
    std::vector<int32_t> position(shared.size(), -1);
    for (size_t p = 0; p < rows.size(); ++p) position[rows[p]] = static_cast<int32_t>(p);
    std::vector<float> sum(rows.size() * dim_, 0.0f);
    auto add = [&](int32_t k, const float* g) {
      float* acc = sum.data() + static_cast<size_t>(position[k]) * dim_;
      for (int c = 0; c < dim_; ++c) acc[c] += g[c];
    };
    // Received payloads, by peer id.
    std::vector<std::vector<float>> received(layout_.trainers);
    for (const PeerExchange& peer : peers) {
      size_t expected = 0;
      for (int32_t k : peer.recv) expected += shared[k].now == now ? 1 : 0;
      if (expected == 0) continue;
      ASSIGN_OR_RETURN(Message message, transport_.Receive(layout_.trainer_rank(peer.peer),
                                                           now ? kTagGradients : kTagGradientsLater,
                                                           options_.peer_timeout));
      WireReader r(message.payload, absl::StrCat("gradients from trainer ", peer.peer));
      Iteration their_iteration = 0;
      RETURN_IF_ERROR(r.Get(&their_iteration));
      RETURN_IF_ERROR(r.GetVector(&received[peer.peer]));
      if (their_iteration != iteration || received[peer.peer].size() != expected * dim_) {
        return absl::DataLossError(absl::StrFormat(
            "trainer %d expected %d gradient rows of iteration %d from trainer %d, got %d of "
            "iteration %d",
            id_, expected, iteration, peer.peer, received[peer.peer].size() / dim_,
            their_iteration));
      }
    }
    for (int t = 0; t < layout_.trainers; ++t) {
      if (t == id_) {
        for (int32_t k : rows) {
          if (shared[k].own_unique >= 0) add(k, own.data() + static_cast<size_t>(k) * dim_);
        }
        continue;
      }
      const PeerExchange* peer = nullptr;
      for (const PeerExchange& p : peers) {
        if (p.peer == t) peer = &p;
      }
      if (peer == nullptr) continue;
      size_t j = 0;
      for (int32_t k : peer->recv) {
        if (shared[k].now != now) continue;
        add(k, received[t].data() + j * dim_);
        ++j;
      }
    }
    std::vector<SlotId> slots(rows.size());
    for (size_t p = 0; p < rows.size(); ++p) slots[p] = shared[rows[p]].slot;
    const size_t n = rows.size();
    RETURN_IF_ERROR(shared_slots_.Reserve(context_, n));
    RETURN_IF_ERROR(shared_grads_.Reserve(context_, n * dim_));
    RETURN_IF_ERROR(context_->CopyToDevice(shared_slots_.data(), slots.data(), n * sizeof(SlotId)));
    RETURN_IF_ERROR(
        context_->CopyToDevice(shared_grads_.data(), sum.data(), sum.size() * sizeof(float)));
    return cache_->Apply(shared_slots_.data(), shared_grads_.data(), static_cast<int64_t>(n));
  }

  // Receives and applies the background exchanges of iterations <= `through`.
  absl::Status CompleteLaterExchanges(Iteration through) {
    while (!later_.empty() && later_.front().iteration <= through) {
      LaterExchange later = std::move(later_.front());
      later_.pop_front();
      ScopedTimer timer(&stats_.sync_seconds);
      RETURN_IF_ERROR(CombineAndApply(later.iteration, later.shared, later.peers,
                                      later.shared_indices, later.own, /*now=*/false));
    }
    return absl::OkStatus();
  }

  Transport& transport_;
  const JobLayout layout_;
  const int id_;
  const std::shared_ptr<DeviceContext> context_;
  const TrainerOptions options_;
  const int dim_;
  const int record_floats_;

  std::unique_ptr<EmbeddingCache> cache_;
  std::unique_ptr<EmbeddingCache> scratch_;  // evaluation rows
  int64_t scratch_capacity_ = 0;
  EmbeddingCache* lookup_cache_ = nullptr;
  std::unique_ptr<Prefetcher> prefetcher_;

  // Plans received in the background, in order.
  absl::Mutex plan_mu_;
  std::deque<std::pair<PlanKind, TrainerPlan>> plans_ ABSL_GUARDED_BY(plan_mu_);
  absl::Status plan_error_ ABSL_GUARDED_BY(plan_mu_);
  bool stop_plans_ ABSL_GUARDED_BY(plan_mu_) = false;
  std::thread plan_thread_;

  TrainerPlan plan_;
  TrainerPlan drain_;
  LocalBatch batch_;
  BackwardIndex backward_;
  bool in_iteration_ = false;
  bool training_done_ = false;
  // Job start and checkpoints.
  bool started_ = false;
  Iteration first_iteration_ = 0;
  std::string start_state_;  // the loop state to restore, until SetLoopState restores it
  LoopState loop_state_;
  bool after_checkpoint_ = false;
  bool stop_forwarded_ = false;
  bool flushed_ = false;
  bool eval_done_ = false;
  std::deque<LaterExchange> later_;

  // Scratch buffers (device memory on CUDA).
  std::vector<int32_t> occurrence_slots_;
  std::vector<float> host_records_;
  std::vector<float> host_grads_;
  std::vector<float> host_dense_;  // dense all-reduce staging when NCCL is unusable

#if BAGPIPE_WITH_CUDA
  // The dense all-reduce over the trainers' GPUs; null until the first AllReduceDevice, and after
  // it when NCCL cannot serve the group.
  std::unique_ptr<NcclCommunicator> nccl_;
  bool nccl_setup_done_ = false;
#endif
  Buffer<float> dense_, labels_, pooled_, row_grads_, record_buffer_, shared_grads_;
  Buffer<int64_t> offsets_;
  Buffer<int32_t> slots_, unique_slots_, slot_buffer_, apply_slots_, apply_index_, shared_slots_;

  TrainerStats stats_;
};

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(Transport& transport, JobLayout layout,
                                                         int trainer,
                                                         std::shared_ptr<DeviceContext> context,
                                                         const TrainerOptions& options) {
  auto impl = std::make_unique<Impl>(transport, layout, trainer, std::move(context), options);
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;
int Trainer::id() const { return impl_->id(); }
int Trainer::num_trainers() const { return impl_->num_trainers(); }
absl::Status Trainer::SetLoopState(LoopState state) {
  return impl_->SetLoopState(std::move(state));
}
absl::StatusOr<Iteration> Trainer::FirstIteration() { return impl_->FirstIteration(); }
const std::shared_ptr<DeviceContext>& Trainer::context() const { return impl_->context(); }
absl::StatusOr<bool> Trainer::BeginIteration(LocalBatch* batch) {
  return impl_->BeginIteration(batch);
}
absl::StatusOr<const float*> Trainer::LookupPooled() { return impl_->LookupPooled(); }
absl::Status Trainer::EndIteration(const float* pooled_grad) {
  return impl_->EndIteration(pooled_grad);
}
absl::Status Trainer::EndIterationWithRowGradients(const float* row_grads) {
  return impl_->EndIterationWithRowGradients(row_grads);
}
absl::Status Trainer::AllReduce(float* data, size_t count) { return impl_->AllReduce(data, count); }
absl::Status Trainer::AllReduceDevice(float* data, size_t count) {
  return impl_->AllReduceDevice(data, count);
}
absl::Status Trainer::Flush() { return impl_->Flush(); }
absl::StatusOr<bool> Trainer::BeginEvalBatch(LocalBatch* batch) {
  return impl_->BeginEvalBatch(batch);
}
EmbeddingCache& Trainer::cache() { return impl_->cache(); }
TrainerStats Trainer::stats() const { return impl_->stats(); }

}  // namespace bagpipe
