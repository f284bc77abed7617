#include "trainer_hooks/trainer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
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
#include "trainer_hooks/batch_staging.h"
#include "trainer_hooks/external_stream.h"
#include "trainer_hooks/ordering_faults.h"
#include "trainer_hooks/plan_codec.h"
#include "trainer_hooks/write_back_sender.h"

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
          {"prefetch_max_in_flight", prefetch_max_in_flight},
          {"wait_seconds", wait_seconds},
          {"boundary_seconds", boundary_seconds},
          {"lookup_seconds", lookup_seconds},
          {"reduce_seconds", reduce_seconds},
          {"sync_seconds", sync_seconds},
          {"apply_seconds", apply_seconds},
          {"allreduce_seconds", allreduce_seconds},
          {"checkpoints", checkpoints},
          {"checkpoint_seconds", checkpoint_seconds},
          {"dense_allreduce", dense_allreduce},
          {"host_syncs", host_syncs},
          {"max_iteration_host_syncs", max_iteration_host_syncs},
          {"growth_iterations", growth_iterations},
          {"last_growth_iteration", last_growth_iteration}};
}

namespace {

// Write-backs stamped with this are a trainer's last: its watermark becomes "infinite".
constexpr Iteration kFinalStamp = std::numeric_limits<Iteration>::max() / 4;
// Evaluation fetches are numbered past the drain and the write-back horizon so that servers
// serve them only after every trainer's final write-back (sync/protocol.h).
constexpr Iteration kEvalIterationBase = std::numeric_limits<Iteration>::max() / 8;

// A host or device buffer of T that grows on demand (contents are not preserved). Growing
// frees the old array, which waits for the device (DeviceContext::Free): it grows to at least
// `headroom` elements, so that it does not grow again in the steady state.
template <typename T>
class Buffer {
 public:
  absl::Status Reserve(const std::shared_ptr<DeviceContext>& context, size_t size,
                       size_t headroom = 0) {
    if (array_.size() >= size && array_.size() > 0) return absl::OkStatus();
    size_t capacity = std::max<size_t>(64, array_.size());
    while (capacity < std::max(size, headroom)) capacity *= 2;
    array_.Reset();
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

// Device phases timed by timing events on the streams: CUDA events on a GPU, the executors'
// clocks on asynchronous CPU streams, the host clock on a synchronous CPU context. Each
// iteration records into one frame of a ring; a frame's times are collected once its events
// have completed (queries: no host synchronisation), at the latest when the frame is reused.
// A phase is timed from its first Begin to its first End in a frame.
enum Phase { kBoundaryPhase = 0, kLookupPhase, kReducePhase, kApplyPhase, kNumPhases };

class PhaseClock {
 public:
  absl::Status Init(const std::shared_ptr<DeviceContext>& context, int frames) {
    frames_.resize(frames);
    for (Frame& frame : frames_) {
      for (int p = 0; p < kNumPhases; ++p) {
        ASSIGN_OR_RETURN(frame.begin[p], DeviceEvent::Create(context, /*timing=*/true));
        ASSIGN_OR_RETURN(frame.end[p], DeviceEvent::Create(context, /*timing=*/true));
      }
    }
    return absl::OkStatus();
  }

  // Starts the next frame; the frame it reuses is collected first (waiting if it must).
  absl::Status NextFrame(double* seconds) {
    current_ = (current_ + 1) % static_cast<int>(frames_.size());
    return CollectFrame(frames_[current_], /*wait=*/true, seconds);
  }
  absl::Status Begin(Phase phase, Stream stream) {
    if (current_ < 0) return absl::OkStatus();
    Frame& frame = frames_[current_];
    if (frame.state[phase] != kIdle) return absl::OkStatus();
    frame.state[phase] = kBegun;
    return frame.begin[phase].Record(stream);
  }
  absl::Status End(Phase phase, Stream stream) {
    if (current_ < 0) return absl::OkStatus();
    Frame& frame = frames_[current_];
    if (frame.state[phase] != kBegun) return absl::OkStatus();
    frame.state[phase] = kEnded;
    return frame.end[phase].Record(stream);
  }
  // Adds the times of every frame whose events completed (every frame, waiting, with `wait`).
  absl::Status Collect(bool wait, double* seconds) {
    for (Frame& frame : frames_) RETURN_IF_ERROR(CollectFrame(frame, wait, seconds));
    return absl::OkStatus();
  }

 private:
  enum State { kIdle, kBegun, kEnded };
  struct Frame {
    std::array<DeviceEvent, kNumPhases> begin, end;
    std::array<State, kNumPhases> state = {};
  };

  static absl::Status CollectFrame(Frame& frame, bool wait, double* seconds) {
    for (int p = 0; p < kNumPhases; ++p) {
      if (frame.state[p] == kIdle) continue;
      if (frame.state[p] == kBegun) {
        // Begun and never ended in its iteration (an error path): drop it.
        if (!wait) continue;
        frame.state[p] = kIdle;
        continue;
      }
      ASSIGN_OR_RETURN(bool done, frame.end[p].Query());
      if (!done) {
        if (!wait) continue;
        RETURN_IF_ERROR(frame.end[p].Synchronize());
      }
      ASSIGN_OR_RETURN(const double ms, DeviceEvent::ElapsedMs(frame.begin[p], frame.end[p]));
      seconds[p] += std::max(ms, 0.0) / 1e3;
      frame.state[p] = kIdle;
    }
    return absl::OkStatus();
  }

  std::vector<Frame> frames_;
  int current_ = -1;
};

// A plan received from the oracle, with its arrays staged for the device.
struct ReadyPlan {
  PlanKind kind = PlanKind::kEnd;
  TrainerPlan plan;
  StagedPlan staged;
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

  ~Impl() {
    StopPlanThread();
    write_backs_.reset();  // before the buffers its thread reads
  }

  absl::Status Start() {
    RETURN_IF_ERROR(context_->MakeCurrent());
    // A collective whose peer died must not block a host wait forever.
    context_->set_sync_timeout(options_.peer_timeout);
    const bool device_mode = options_.policy == CachePolicy::kDevice;
    const int64_t capacity = device_mode
                                 ? static_cast<int64_t>(options_.initializer.table_offsets().back())
                                 : options_.cache_rows;
    if (capacity <= 0) {
      return absl::InvalidArgumentError("the cache needs a positive --cache-rows");
    }
    if (options_.prefetch_depth < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prefetch-depth ", options_.prefetch_depth, ": must be at least 1"));
    }
    ASSIGN_OR_RETURN(cache_,
                     EmbeddingCache::Create(context_, capacity, dim_, options_.sparse_optimizer));
    if (device_mode) RETURN_IF_ERROR(cache_->InitializeRows(options_.initializer, 0, capacity));
    // Plans staged ahead: the prefetch depth, the iteration being trained and the one whose
    // arrays the loop may still read.
    const int in_flight = std::max(options_.prefetch_depth, 1) + 2;
    ASSIGN_OR_RETURN(staging_, BatchStaging::Create(context_, in_flight));
    ASSIGN_OR_RETURN(uploads_, UploadRing::Create(context_, 8));
    ASSIGN_OR_RETURN(write_backs_,
                     WriteBackSender::Create(transport_, layout_, context_, record_floats_));
    RETURN_IF_ERROR(clock_.Init(context_, 8));
    // One fetch per staged plan, and one for an evaluation batch.
    prefetcher_ = std::make_unique<Prefetcher>(transport_, layout_, id_, context_, record_floats_,
                                               options_.peer_timeout, in_flight + 1);
    const OrderingFault fault = OrderingFaultForTesting();
    skip_fill_wait_ = fault == OrderingFault::kSkipFillWait;
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
    if (start_state_.empty()) {
      // Resuming a checkpoint whose loop state is empty (a loop that kept none, or a damaged
      // file) would restart this loop's state from scratch.
      if (!start_state_file_.empty() && loop_state_.restore) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the checkpoint's loop state ", start_state_file_,
            " is empty, but this job's training loop keeps one (dense parameters, optimizer "
            "state): a checkpoint of another loop, or a damaged file"));
      }
      return absl::OkStatus();
    }
    if (!loop_state_.restore) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job resumes from a checkpoint with loop state (", start_state_file_,
                       "), but LoopState::restore is empty"));
    }
    RETURN_IF_ERROR(Annotate(
        loop_state_.restore(start_state_),
        absl::StrCat("restoring the loop state of trainer ", id_, " from ", start_state_file_)));
    start_state_.clear();
    return absl::OkStatus();
  }

  absl::StatusOr<Iteration> FirstIteration() {
    RETURN_IF_ERROR(AwaitStart());
    return first_iteration_;
  }

  TrainerStats stats() const {
    // Device phase times of iterations whose events completed (never waits).
    (void)clock_.Collect(/*wait=*/false, phase_seconds_);
    TrainerStats stats = stats_;
    stats.boundary_seconds = phase_seconds_[kBoundaryPhase];
    stats.lookup_seconds = phase_seconds_[kLookupPhase];
    stats.reduce_seconds = phase_seconds_[kReducePhase];
    stats.apply_seconds = phase_seconds_[kApplyPhase];
    const PrefetchStats prefetch = prefetcher_->stats();
    stats.fetched_bytes = prefetch.bytes;
    stats.prefetch_max_in_flight = prefetch.max_in_flight;
    return stats;
  }

  absl::StatusOr<bool> BeginIteration(LocalBatch* batch) {
    if (in_iteration_) {
      return absl::FailedPreconditionError("BeginIteration called twice without EndIteration");
    }
    if (training_done_) return false;
    EndCountedIteration();
    // The previous iteration's arrays are no longer the loop's: their slot may be staged again
    // once the compute stream has read them.
    RETURN_IF_ERROR(ReleaseCurrent());
    RETURN_IF_ERROR(AwaitStart());
    if (!start_state_.empty()) {
      return absl::FailedPreconditionError(
          "the job resumes from a checkpoint that holds the training loop's state (dense "
          "parameters, optimizer state), but the loop registered none (Trainer::SetLoopState)");
    }
    ForwardStopRequest();
    ReadyPlan next;
    while (true) {
      Stopwatch wait_watch;
      ASSIGN_OR_RETURN(next, PopPlan());
      stats_.wait_seconds += wait_watch.Seconds();
      if (next.kind != PlanKind::kCheckpoint) break;
      RETURN_IF_ERROR(RunCheckpoint(next));
      // A checkpoint is not a steady-state iteration: count the next one from here.
      EndCountedIteration();
    }
    if (next.kind == PlanKind::kDrain) {
      drain_ = std::move(next);
      training_done_ = true;
      return false;
    }
    if (next.kind != PlanKind::kIteration) {
      return absl::InternalError("expected a training plan from the oracle");
    }
    plan_ = std::move(next.plan);
    staged_ = next.staged;
    counted_iteration_ = plan_.iteration;
    RETURN_IF_ERROR(clock_.NextFrame(phase_seconds_));
    RETURN_IF_ERROR(CompleteLaterExchanges(plan_.iteration - 2));
    RETURN_IF_ERROR(clock_.Begin(kBoundaryPhase, Stream::kCompute));
    RETURN_IF_ERROR(staging_->Acquire(staged_, Stream::kCompute));
    RETURN_IF_ERROR(RunExtractions(plan_, staged_, plan_.iteration));
    Stopwatch fill_wait;
    ASSIGN_OR_RETURN(Prefetcher::Staging staging, prefetcher_->Wait(plan_.iteration));
    stats_.wait_seconds += fill_wait.Seconds();
    RETURN_IF_ERROR(FillFromStaging(cache_.get(), plan_.iteration, staged_.fill_slots,
                                    static_cast<int64_t>(plan_.fills.size()), staging));
    RETURN_IF_ERROR(clock_.End(kBoundaryPhase, Stream::kCompute));
    MakeBatch(plan_, staged_, batch);
    const int64_t hits =
        static_cast<int64_t>(plan_.unique_rows.size()) - static_cast<int64_t>(plan_.fills.size());
    stats_.hits += std::max<int64_t>(hits, 0);
    stats_.fills += static_cast<int64_t>(plan_.fills.size());
    stats_.unique_rows += static_cast<int64_t>(plan_.unique_rows.size());
    stats_.ids += static_cast<int64_t>(plan_.unique_index.size());
    // The same events in the cache's own counters (cache/cache_stats.h: the runtime's part).
    CacheStats& counters = cache_->stats();
    counters.Add(CacheCounter::kRequests, static_cast<int64_t>(plan_.unique_index.size()));
    counters.Add(CacheCounter::kUnique, static_cast<int64_t>(plan_.unique_rows.size()));
    counters.Add(CacheCounter::kHits, std::max<int64_t>(hits, 0));
    counters.Add(CacheCounter::kMisses, static_cast<int64_t>(plan_.fills.size()));
    in_iteration_ = true;
    lookup_cache_ = cache_.get();
    return true;
  }

  absl::StatusOr<const float*> LookupPooled() {
    if (lookup_cache_ == nullptr) {
      return absl::FailedPreconditionError("LookupPooled outside an iteration");
    }
    const size_t out = static_cast<size_t>(batch_.num_samples) * batch_.num_tables * dim_;
    RETURN_IF_ERROR(pooled_.Reserve(context_, out));
    RETURN_IF_ERROR(LookupPooledInto(pooled_.data()));
    return pooled_.data();
  }

  absl::Status LookupPooledInto(float* pooled) {
    if (lookup_cache_ == nullptr) {
      return absl::FailedPreconditionError("LookupPooled outside an iteration");
    }
    RETURN_IF_ERROR(clock_.Begin(kLookupPhase, Stream::kCompute));
    RETURN_IF_ERROR(lookup_cache_->Gather(batch_.slots, batch_.offsets, batch_.num_tables,
                                          batch_.num_samples, pooled));
    RETURN_IF_ERROR(clock_.End(kLookupPhase, Stream::kCompute));
    // Rows read plus bags written, dim floats each.
    const int64_t bags = static_cast<int64_t>(batch_.num_samples) * batch_.num_tables;
    lookup_cache_->stats().Add(
        CacheCounter::kGatheredBytes,
        (batch_.num_ids + bags) * dim_ * static_cast<int64_t>(sizeof(float)));
    return absl::OkStatus();
  }

  // A NaN or infinite gradient would be applied to rows on the servers, which every later lookup
  // of every trainer reads: refused before anything changes (the iteration stays open). Host
  // memory the caller wrote already only: on CUDA, or with asynchronous CPU streams (where the
  // compute stream may still be writing it), the check would cost a synchronisation.
  absl::Status CheckFinite(const char* what, const float* grad, int64_t rows, int64_t row_floats,
                           const char* row_name) const {
    if (grad == nullptr || context_->is_cuda() || context_->is_asynchronous()) {
      return absl::OkStatus();
    }
    const int64_t count = rows * row_floats;
    // One pass the compiler vectorizes (a float is NaN or infinite iff its exponent bits are all
    // set; OR-ing those tests has no order to keep): half the time of a loop that tests and
    // branches per value, on the hot path of every iteration. The element is found only when
    // there is one.
    uint32_t any = 0;
    for (int64_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, grad + i, sizeof(bits));
      any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (any == 0) return absl::OkStatus();
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(grad[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", row_name, " ", i / row_floats, ", float ", i % row_floats, " is ",
            std::isnan(grad[i]) ? "nan" : (grad[i] > 0 ? "inf" : "-inf"),
            ": a non-finite gradient would corrupt the embedding rows (nothing was applied; the "
            "iteration is still open); if the training diverged, lower the learning rate"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status EndIteration(const float* pooled_grad) {
    if (!in_iteration_) return absl::FailedPreconditionError("EndIteration without BeginIteration");
    RETURN_IF_ERROR(CheckFinite("EndIteration: pooled_grad", pooled_grad, batch_.num_samples,
                                static_cast<int64_t>(batch_.num_tables) * dim_, "sample"));
    const size_t row_floats = static_cast<size_t>(batch_.num_unique) * dim_;
    RETURN_IF_ERROR(row_grads_.Reserve(context_, row_floats, row_floats + row_floats / 2));
    RETURN_IF_ERROR(clock_.Begin(kReducePhase, Stream::kCompute));
    RETURN_IF_ERROR(cache_->ReduceGradients(staged_.backward, pooled_grad, row_grads_.data()));
    RETURN_IF_ERROR(clock_.End(kReducePhase, Stream::kCompute));
    return FinishIteration(row_grads_.data());
  }

  absl::Status EndIterationWithRowGradients(const float* row_grads) {
    if (!in_iteration_) return absl::FailedPreconditionError("EndIteration without BeginIteration");
    if (row_grads == nullptr && batch_.num_unique > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("EndIterationWithRowGradients: row_grads is "
                       "null (",
                       batch_.num_unique, " unique rows)"));
    }
    RETURN_IF_ERROR(CheckFinite("EndIterationWithRowGradients: row_grads", row_grads,
                                batch_.num_unique, dim_, "unique row"));
    return FinishIteration(row_grads);
  }

  void MarkCompleted() { completed_.store(true); }

  // The checks every all-reduce makes before it waits for its peers.
  absl::Status CheckAllReduce(const char* what, const void* data, size_t count) const {
    if (completed_.load()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " after trainer ", id(),
                       " was completed (Job::CompleteTrainer): its peers are "
                       "gone"));
    }
    if (data == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": data is null (count ", count, ")"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status AllReduce(T* data, size_t count) {
    RETURN_IF_ERROR(CheckAllReduce("AllReduce", data, count));
    ScopedTimer timer(&stats_.allreduce_seconds);
    return AllReduceSum(transport_, trainer_group(), data, count, options_.peer_timeout);
  }

  absl::Status AllReduceDevice(float* data, size_t count) {
    RETURN_IF_ERROR(CheckAllReduce("AllReduceDevice", data, count));
    if (layout_.trainers <= 1) {
      stats_.dense_allreduce = "none";
      return absl::OkStatus();
    }
    if (!context_->is_cuda()) {
      stats_.dense_allreduce = "transport";
      // The gradients are written by work queued on the compute stream; the host reads them.
      if (context_->is_asynchronous()) RETURN_IF_ERROR(context_->Synchronize());
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
      // On its own stream, after the gradients (an event, not the whole compute stream), and
      // the compute stream's next work (the optimizer step) after the sum; nothing waits on
      // the host.
      RETURN_IF_ERROR(context_->StreamWait(Stream::kComm, Stream::kCompute));
      RETURN_IF_ERROR(nccl_->EnqueueAllReduceSum(
          data, count, static_cast<CUstream_st*>(context_->stream(Stream::kComm)),
          options_.deterministic, options_.peer_timeout));
      return context_->StreamWait(Stream::kCompute, Stream::kComm);
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
    if (in_iteration_) {
      return absl::FailedPreconditionError(
          "Flush inside an iteration: end the iteration first (EndIteration, which a backward "
          "pass through the embeddings calls), then run the loop to its end");
    }
    if (flushed_) return absl::OkStatus();
    EndCountedIteration();
    RETURN_IF_ERROR(ReleaseCurrent());
    // Consume the remaining plans up to the drain (a loop may stop early).
    if (!training_done_) RETURN_IF_ERROR(AwaitStart());
    while (!training_done_) {
      ASSIGN_OR_RETURN(ReadyPlan next, PopPlan());
      if (next.kind == PlanKind::kCheckpoint) {
        RETURN_IF_ERROR(RunCheckpoint(next));
      } else if (next.kind == PlanKind::kDrain) {
        drain_ = std::move(next);
        training_done_ = true;
      } else if (next.kind == PlanKind::kIteration) {
        const Iteration iteration = next.plan.iteration;
        ReturnPlan(std::move(next));  // the loop may go on: nothing is lost
        return absl::FailedPreconditionError(absl::StrCat(
            "Flush before the end of training: iteration ", iteration,
            " was never run (every planned iteration must run, or the plans' write-backs and "
            "exchanges would be missing)"));
      } else {
        return absl::InternalError("expected the drain plan");
      }
    }
    RETURN_IF_ERROR(CompleteLaterExchanges(kFinalStamp));
    ASSIGN_OR_RETURN(drain_.staged, staging_->Stage(drain_.plan, /*with_backward=*/false));
    RETURN_IF_ERROR(staging_->Acquire(drain_.staged, Stream::kCompute));
    RETURN_IF_ERROR(RunExtractions(drain_.plan, drain_.staged, drain_.plan.iteration));
    RETURN_IF_ERROR(staging_->Release(drain_.staged, Stream::kCompute));
    drain_.staged = StagedPlan();
    // Every write-back left before the final stamps (one sender per server and tag: in order).
    RETURN_IF_ERROR(write_backs_->Drain());
    for (int s = 0; s < layout_.servers; ++s) {
      RETURN_IF_ERROR(transport_.Send(layout_.server_rank(s), kTagWriteBack,
                                      EncodeWriteBack(WriteBack{kFinalStamp, {}, {}})));
      RETURN_IF_ERROR(
          transport_.Send(layout_.server_rank(s), kTagControl, EncodeControl(ControlKind::kDone)));
    }
    RETURN_IF_ERROR(clock_.Collect(/*wait=*/true, phase_seconds_));
    flushed_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> BeginEvalBatch(LocalBatch* batch) {
    if (!flushed_) return absl::FailedPreconditionError("evaluation runs after Flush");
    if (eval_done_) return false;
    RETURN_IF_ERROR(ReleaseCurrent());
    ASSIGN_OR_RETURN(ReadyPlan next, PopPlan());
    if (next.kind == PlanKind::kEnd) {
      eval_done_ = true;
      return false;
    }
    if (next.kind != PlanKind::kEval) return absl::InternalError("expected an evaluation plan");
    plan_ = std::move(next.plan);
    // Staged here: every training plan was (the plan thread stages only those).
    ASSIGN_OR_RETURN(staged_, staging_->Stage(plan_, /*with_backward=*/false));
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
    RETURN_IF_ERROR(staging_->Acquire(staged_, Stream::kCompute));
    // An evaluation batch fills every distinct row into the scratch slot the plan names.
    RETURN_IF_ERROR(
        FillFromStaging(scratch_.get(), ticket, staged_.unique_slots, staging.rows, staging));
    MakeBatch(plan_, staged_, batch);
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
    RETURN_IF_ERROR(r.GetString(&start_state_file_));
    RETURN_IF_ERROR(r.ExpectDone());
    started_ = true;
    return absl::OkStatus();
  }

  // A checkpoint's cut at the boundary of plan.iteration: every exchange completes, every dirty
  // row goes back to its server (the servers write their shards once all are in), and trainer
  // 0 sends the loop's state to the oracle. The next plan comes once the checkpoint is written.
  // The checkpoint plan was staged by the plan thread (its extraction slots).
  absl::Status RunCheckpoint(const ReadyPlan& ready) {
    const TrainerPlan& plan = ready.plan;
    Stopwatch watch;
    RETURN_IF_ERROR(CompleteLaterExchanges(kFinalStamp));
    RETURN_IF_ERROR(staging_->Acquire(ready.staged, Stream::kCompute));
    RETURN_IF_ERROR(RunExtractions(plan, ready.staged, plan.iteration));
    RETURN_IF_ERROR(staging_->Release(ready.staged, Stream::kCompute));
    // The cut's rows are on their way to the servers before the loop's state goes out.
    RETURN_IF_ERROR(write_backs_->Drain());
    if (id_ == 0) {
      std::string state;
      if (loop_state_.save) {
        absl::StatusOr<std::string> saved = loop_state_.save();
        if (!saved.ok()) {
          return Annotate(saved.status(),
                          absl::StrCat("saving the loop state for checkpoint ", plan.iteration));
        }
        state = std::move(*saved);
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

  // Counts the host synchronisations of the training thread in the training iteration that
  // ends now (from its BeginIteration to the next BeginIteration or Flush: the loop's own calls
  // included), and whether the context allocated memory meanwhile (any thread); then starts
  // the count of the next one.
  void EndCountedIteration() {
    const int64_t syncs = DeviceContext::ThreadHostSyncs();
    const int64_t allocations = context_->allocations();
    if (counted_iteration_ >= 0) {
      const int64_t iteration_syncs = syncs - syncs_mark_;
      stats_.host_syncs += iteration_syncs;
      if (allocations != allocations_mark_) {
        // Growing a buffer frees the old one, which synchronises: not a steady-state iteration.
        ++stats_.growth_iterations;
        stats_.last_growth_iteration = counted_iteration_;
      } else {
        stats_.max_iteration_host_syncs =
            std::max(stats_.max_iteration_host_syncs, iteration_syncs);
      }
    }
    counted_iteration_ = -1;
    syncs_mark_ = syncs;
    allocations_mark_ = allocations;
  }

  // --- plans -------------------------------------------------------------------------------

  void PlanLoop() {
    // This thread allocates staging and queues copies on the device: it must use the trainer's
    // device, not the default one (on CUDA every process would create a context on GPU 0).
    if (absl::Status status = context_->MakeCurrent(); !status.ok()) {
      absl::MutexLock lock(&plan_mu_);
      plan_error_ = status;
      return;
    }
    while (true) {
      // Plans come from the oracle; a message from this rank itself is StopPlanThread's wake-up.
      // PopPlan bounds the wait with the peer timeout.
      absl::StatusOr<Message> message =
          transport_.Receive(kAnySource, kTagPlan, absl::Hours(24 * 365));
      {
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
      }
      ReadyPlan ready;
      absl::Status status = DecodePlan(message->payload, &ready.kind, &ready.plan);
      if (status.ok() &&
          (ready.kind == PlanKind::kIteration || ready.kind == PlanKind::kCheckpoint)) {
        // Staged before the fetch is requested: the batch's copy is queued on the copy stream
        // ahead of its rows' copy. Waits for a free staging slot (the prefetch depth). A
        // checkpoint's cut (its extractions) comes in order between iterations; the drain and
        // evaluation plans, after training, are staged by the training thread.
        absl::StatusOr<StagedPlan> staged =
            staging_->Stage(ready.plan, /*with_backward=*/ready.kind == PlanKind::kIteration);
        if (staged.ok()) {
          ready.staged = *staged;
        } else {
          status = staged.status();
        }
      }
      if (status.ok() && ready.kind == PlanKind::kIteration) {
        std::vector<RowId> rows;
        std::vector<Iteration> stamps;
        rows.reserve(ready.plan.fills.size());
        stamps.reserve(ready.plan.fills.size());
        for (const Fill& fill : ready.plan.fills) {
          rows.push_back(fill.row);
          stamps.push_back(fill.after_stamp);
        }
        // Fills never exceed a batch's distinct rows: room for twice those keeps the staging
        // from growing after the first batches.
        status = prefetcher_->Request(ready.plan.iteration, rows, stamps,
                                      2 * static_cast<int64_t>(ready.plan.unique_rows.size()));
      }
      absl::MutexLock lock(&plan_mu_);
      if (stop_plans_) return;
      if (!status.ok()) {
        plan_error_ = status;
        return;
      }
      const bool end = ready.kind == PlanKind::kEnd;
      plans_.push_back(std::move(ready));
      if (end) return;
    }
  }

  void StopPlanThread() {
    if (!plan_thread_.joinable()) return;
    {
      absl::MutexLock lock(&plan_mu_);
      stop_plans_ = true;
    }
    staging_->Stop();
    // Wake the receiver if it still waits for plans (the job ended early or failed).
    (void)transport_.Send(transport_.rank(), kTagPlan, Bytes{});
    plan_thread_.join();
  }

  // Waits for the next plan (with the peer timeout) and returns one credit to the oracle.
  absl::StatusOr<ReadyPlan> PopPlan() {
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
    ReadyPlan next = std::move(plans_.front());
    plans_.pop_front();
    if (returned_plan_) {
      returned_plan_ = false;  // its credit went back when it was first popped
    } else {
      RETURN_IF_ERROR(transport_.Send(JobLayout::oracle_rank(), kTagPlanCredit, Bytes{}));
    }
    return next;
  }

  // Puts a popped plan back at the front of the queue (a call that popped it failed before it
  // changed anything); the next PopPlan returns it without a second credit to the oracle.
  void ReturnPlan(ReadyPlan plan) {
    absl::MutexLock lock(&plan_mu_);
    plans_.push_front(std::move(plan));
    returned_plan_ = true;
  }

  // Hands the current plan's staging slot back once the compute stream read it.
  absl::Status ReleaseCurrent() {
    const StagedPlan staged = staged_;
    staged_ = StagedPlan();
    return staging_->Release(staged, Stream::kCompute);
  }

  // --- boundary ----------------------------------------------------------------------------

  // Queues the extraction of the plan's extracted rows into a pinned buffer and hands their
  // write-back (stamped `stamp`) to the sender, which sends it once the copy ran; every server
  // gets a (possibly empty) write-back: the watermark.
  absl::Status RunExtractions(const TrainerPlan& plan, const StagedPlan& staged, Iteration stamp) {
    const size_t n = plan.extract.size();
    std::vector<RowId> rows(n);
    std::vector<bool> write_back(n);
    for (size_t k = 0; k < n; ++k) {
      const Extraction& e = plan.extract[k];
      rows[k] = e.row;
      write_back[k] = e.write_back;
      if (e.evict) ++stats_.evictions;
      if (!e.evict) ++stats_.flushes;
      cache_->stats().Add(e.evict ? CacheCounter::kEvictions : CacheCounter::kFlushes);
      if (!e.write_back) continue;
      ++stats_.write_backs;
      cache_->stats().Add(CacheCounter::kWriteBacks);
      stats_.written_back_bytes += record_floats_ * static_cast<int64_t>(sizeof(float));
    }
    WriteBackSender::Records buffer;
    if (n > 0) {
      // Extractions vary from one boundary to the next: room for twice the batch's distinct
      // rows keeps the buffers from growing after the first boundaries.
      const size_t room = std::max(n, 2 * plan.unique_rows.size());
      ASSIGN_OR_RETURN(buffer,
                       write_backs_->Buffer(static_cast<int64_t>(n), static_cast<int64_t>(room)));
      RETURN_IF_ERROR(record_buffer_.Reserve(context_, n * record_floats_, room * record_floats_));
      RETURN_IF_ERROR(
          cache_->Extract(staged.extract_slots, static_cast<int64_t>(n), record_buffer_.data()));
      RETURN_IF_ERROR(context_->CopyToHost(buffer.host, record_buffer_.data(),
                                           n * record_floats_ * sizeof(float)));
    }
    return write_backs_->Submit(stamp, buffer, std::move(rows), std::move(write_back),
                                Stream::kCompute);
  }

  // Fills `n` slots of `cache` (device array `slots`) from `staging`, on the compute stream
  // after the copy into the staging, and hands the staging back to the prefetcher.
  absl::Status FillFromStaging(EmbeddingCache* cache, Iteration ticket, const SlotId* slots,
                               int64_t n, const Prefetcher::Staging& staging) {
    if (n != staging.rows) {
      return absl::InternalError("staging does not match the plan's fills");
    }
    if (n > 0) {
      if (!skip_fill_wait_) {
        RETURN_IF_ERROR(context_->StreamWaitEvent(Stream::kCompute, *staging.ready));
      }
      RETURN_IF_ERROR(cache->Fill(slots, staging.device, n));
    }
    // The prefetcher reuses the staging after the fill (an event on the compute stream).
    return prefetcher_->Release(ticket, Stream::kCompute);
  }

  // The local batch the loop sees: arrays in the staged slot, host views in the plan.
  void MakeBatch(const TrainerPlan& plan, const StagedPlan& staged, LocalBatch* batch) {
    batch_ = LocalBatch();
    batch_.iteration = plan.iteration;
    batch_.num_samples = plan.num_samples;
    batch_.num_dense = plan.num_dense;
    batch_.num_tables = plan.num_tables;
    batch_.global_batch_size = plan.global_samples;
    batch_.num_ids = static_cast<int64_t>(plan.unique_index.size());
    batch_.num_unique = static_cast<int>(plan.unique_rows.size());
    batch_.labels_host = plan.labels.data();
    batch_.unique_rows_host = plan.unique_rows.data();
    batch_.dense = staged.dense;
    batch_.labels = staged.labels;
    batch_.offsets = staged.offsets;
    batch_.slots = staged.slots;
    batch_.unique_slots = staged.unique_slots;
    *batch = batch_;
  }

  // --- sync and apply ----------------------------------------------------------------------

  absl::Status FinishIteration(const float* row_grads) {
    const TrainerPlan& plan = plan_;
    in_iteration_ = false;
    lookup_cache_ = nullptr;
    if (plan.shared.empty()) {
      RETURN_IF_ERROR(ApplyPrivate(row_grads));
    } else {
      RETURN_IF_ERROR(ExchangeAndApply(plan, row_grads));
    }
    ++stats_.iterations;
    return absl::OkStatus();
  }

  // Applies the trainer's own gradient to its private rows (slots and gradient rows staged
  // with the plan).
  absl::Status ApplyPrivate(const float* row_grads) {
    if (staged_.num_private == 0) return absl::OkStatus();
    RETURN_IF_ERROR(clock_.Begin(kApplyPhase, Stream::kCompute));
    RETURN_IF_ERROR(cache_->ApplyIndexed(staged_.private_slots, staged_.private_rows, row_grads,
                                         staged_.num_private));
    return clock_.End(kApplyPhase, Stream::kCompute);
  }

  absl::Status ExchangeAndApply(const TrainerPlan& plan, const float* row_grads) {
    // Own gradients on the host (they go to peers and into the combined sums): the host waits
    // for the reduce here, as long as shared rows are exchanged through host memory.
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
    RETURN_IF_ERROR(ApplyPrivate(row_grads));
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
    // Through pinned buffers on the compute stream, behind the apply of the private rows. The
    // buffers carry slots and sums in turn; shared rows never outnumber a batch's distinct rows:
    // room for twice those keeps them from growing after the first iterations.
    const size_t room = 2 * std::max(n, plan_.unique_rows.size()) * dim_ * sizeof(float);
    ASSIGN_OR_RETURN(void* device_slots,
                     uploads_->Upload(slots.data(), n * sizeof(SlotId), Stream::kCompute, room));
    ASSIGN_OR_RETURN(void* device_sums, uploads_->Upload(sum.data(), sum.size() * sizeof(float),
                                                         Stream::kCompute, room));
    return cache_->Apply(static_cast<const SlotId*>(device_slots),
                         static_cast<const float*>(device_sums), static_cast<int64_t>(n));
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
  std::unique_ptr<BatchStaging> staging_;
  std::unique_ptr<UploadRing> uploads_;
  std::unique_ptr<WriteBackSender> write_backs_;
  std::unique_ptr<Prefetcher> prefetcher_;
  bool skip_fill_wait_ = false;  // OrderingFault::kSkipFillWait

  // Plans received and staged in the background, in order.
  absl::Mutex plan_mu_;
  std::deque<ReadyPlan> plans_ ABSL_GUARDED_BY(plan_mu_);
  absl::Status plan_error_ ABSL_GUARDED_BY(plan_mu_);
  bool stop_plans_ ABSL_GUARDED_BY(plan_mu_) = false;
  bool returned_plan_ ABSL_GUARDED_BY(plan_mu_) = false;  // plans_.front() came back (ReturnPlan)
  std::thread plan_thread_;

  TrainerPlan plan_;
  StagedPlan staged_;  // plan_'s arrays, until released
  ReadyPlan drain_;
  LocalBatch batch_;
  bool in_iteration_ = false;
  bool training_done_ = false;
  // Job start and checkpoints.
  bool started_ = false;
  Iteration first_iteration_ = 0;
  std::string start_state_;       // the loop state to restore, until SetLoopState restores it
  std::string start_state_file_;  // resuming: the checkpoint file it was read from
  LoopState loop_state_;
  bool after_checkpoint_ = false;
  bool stop_forwarded_ = false;
  bool flushed_ = false;
  std::atomic<bool> completed_{false};  // MarkCompleted: the trainer's part is over
  bool eval_done_ = false;
  std::deque<LaterExchange> later_;

  // Phase times (device events) and the per-iteration counters.
  mutable PhaseClock clock_;
  mutable double phase_seconds_[kNumPhases] = {};
  int64_t counted_iteration_ = -1;  // the training iteration being counted, -1: none
  int64_t syncs_mark_ = 0;
  int64_t allocations_mark_ = 0;

  // Scratch buffers.
  std::vector<float> host_grads_;
  std::vector<float> host_dense_;  // dense all-reduce staging when NCCL is unusable

#if BAGPIPE_WITH_CUDA
  // The dense all-reduce over the trainers' GPUs; null until the first AllReduceDevice, and after
  // it when NCCL cannot serve the group.
  std::unique_ptr<NcclCommunicator> nccl_;
  bool nccl_setup_done_ = false;
#endif
  Buffer<float> pooled_, row_grads_, record_buffer_;

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

// The public calls wrap the implementation's with the external-stream ordering of the device
// contract (trainer.h; no-ops on the CPU backend and without an external stream).
Trainer::Trainer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), external_(std::make_unique<ExternalStream>(impl_->context())) {}
Trainer::~Trainer() = default;
int Trainer::id() const { return impl_->id(); }
int Trainer::num_trainers() const { return impl_->num_trainers(); }
absl::Status Trainer::SetLoopState(LoopState state) {
  return impl_->SetLoopState(std::move(state));
}
absl::StatusOr<Iteration> Trainer::FirstIteration() { return impl_->FirstIteration(); }
const std::shared_ptr<DeviceContext>& Trainer::context() const { return impl_->context(); }
absl::Status Trainer::SetExternalStream(void* stream) { return external_->Set(stream); }
absl::StatusOr<bool> Trainer::BeginIteration(LocalBatch* batch) {
  if (batch == nullptr) return absl::InvalidArgumentError("BeginIteration: batch is null");
  ASSIGN_OR_RETURN(const bool more, impl_->BeginIteration(batch));
  if (more) RETURN_IF_ERROR(external_->ExternalWaitsForCompute());
  return more;
}
absl::StatusOr<const float*> Trainer::LookupPooled() {
  ASSIGN_OR_RETURN(const float* pooled, impl_->LookupPooled());
  RETURN_IF_ERROR(external_->ExternalWaitsForCompute());
  return pooled;
}
absl::Status Trainer::LookupPooledInto(float* pooled) {
  RETURN_IF_ERROR(external_->ComputeWaitsForExternal());
  RETURN_IF_ERROR(impl_->LookupPooledInto(pooled));
  return external_->ExternalWaitsForCompute();
}
absl::Status Trainer::EndIteration(const float* pooled_grad) {
  RETURN_IF_ERROR(external_->ComputeWaitsForExternal());
  RETURN_IF_ERROR(impl_->EndIteration(pooled_grad));
  return external_->ExternalWaitsForCompute();
}
absl::Status Trainer::EndIterationWithRowGradients(const float* row_grads) {
  RETURN_IF_ERROR(external_->ComputeWaitsForExternal());
  RETURN_IF_ERROR(impl_->EndIterationWithRowGradients(row_grads));
  return external_->ExternalWaitsForCompute();
}
absl::Status Trainer::AllReduce(float* data, size_t count) { return impl_->AllReduce(data, count); }
absl::Status Trainer::AllReduce(double* data, size_t count) {
  return impl_->AllReduce(data, count);
}
absl::Status Trainer::AllReduceDevice(float* data, size_t count) {
  RETURN_IF_ERROR(external_->ComputeWaitsForExternal());
  RETURN_IF_ERROR(impl_->AllReduceDevice(data, count));
  return external_->ExternalWaitsForCompute();
}
absl::Status Trainer::Flush() { return impl_->Flush(); }
absl::StatusOr<bool> Trainer::BeginEvalBatch(LocalBatch* batch) {
  if (batch == nullptr) return absl::InvalidArgumentError("BeginEvalBatch: batch is null");
  ASSIGN_OR_RETURN(const bool more, impl_->BeginEvalBatch(batch));
  if (more) RETURN_IF_ERROR(external_->ExternalWaitsForCompute());
  return more;
}
EmbeddingCache& Trainer::cache() { return impl_->cache(); }
TrainerStats Trainer::stats() const { return impl_->stats(); }
void Trainer::MarkCompleted() { impl_->MarkCompleted(); }

}  // namespace bagpipe
