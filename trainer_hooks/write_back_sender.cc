#include "trainer_hooks/write_back_sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "sync/protocol.h"

namespace bagpipe {

struct WriteBackSender::Slot {
  const DeviceContext* context = nullptr;
  float* host = nullptr;   // pinned
  int64_t capacity = 0;    // records
  bool in_flight = false;  // guarded by WriteBackSender::mu_
  DeviceEvent ready;       // after the copy of the records into `host`

  ~Slot() {
    if (context != nullptr) context->FreePinned(host);
  }
};

WriteBackSender::WriteBackSender(Transport& transport, JobLayout layout,
                                 std::shared_ptr<DeviceContext> context, int record_floats)
    : transport_(transport),
      layout_(layout),
      context_(std::move(context)),
      record_floats_(record_floats) {}

absl::StatusOr<std::unique_ptr<WriteBackSender>> WriteBackSender::Create(
    Transport& transport, JobLayout layout, std::shared_ptr<DeviceContext> context,
    int record_floats, int buffers) {
  std::unique_ptr<WriteBackSender> sender(
      new WriteBackSender(transport, layout, context, record_floats));
  for (int k = 0; k < std::max(buffers, 1); ++k) {
    auto slot = std::make_unique<Slot>();
    slot->context = context.get();
    ASSIGN_OR_RETURN(slot->ready, DeviceEvent::Create(context));
    sender->slots_.push_back(std::move(slot));
  }
  sender->thread_ = std::thread([s = sender.get()] { s->Loop(); });
  return sender;
}

WriteBackSender::~WriteBackSender() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::StatusOr<WriteBackSender::Records> WriteBackSender::Buffer(int64_t records, int64_t room) {
  int index = -1;
  {
    absl::MutexLock lock(&mu_);
    auto free = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      if (!status_.ok()) return true;
      for (const auto& slot : slots_) {
        if (!slot->in_flight) return true;
      }
      return false;
    };
    mu_.Await(absl::Condition(&free));
    RETURN_IF_ERROR(status_);
    // The free buffer with the most room (fewest reallocations).
    for (int k = 0; k < static_cast<int>(slots_.size()); ++k) {
      if (slots_[k]->in_flight) continue;
      if (index < 0 || slots_[k]->capacity > slots_[index]->capacity) index = k;
    }
    slots_[index]->in_flight = true;
  }
  Slot& slot = *slots_[index];
  if (slot.capacity < records) {
    // Headroom, so that slightly larger boundaries do not allocate again. Every buffer not in
    // flight grows with it (nothing reads those): a buffer first used late in a run, when the
    // sender falls behind, then does not allocate in the steady state.
    const int64_t capacity = std::max<int64_t>({records + records / 2, room, 256});
    for (int k = 0; k < static_cast<int>(slots_.size()); ++k) {
      Slot& other = *slots_[k];
      if (other.capacity >= capacity) continue;
      if (k != index) {
        absl::MutexLock lock(&mu_);
        if (other.in_flight) continue;
        other.in_flight = true;  // ours while it grows
      }
      context_->FreePinned(other.host);
      other.host = nullptr;
      other.capacity = 0;
      absl::StatusOr<void*> host =
          context_->AllocatePinned(static_cast<size_t>(capacity) * record_floats_ * sizeof(float));
      if (host.ok()) {
        other.host = static_cast<float*>(*host);
        other.capacity = capacity;
      }
      if (k != index || !host.ok()) {
        absl::MutexLock lock(&mu_);
        other.in_flight = false;
        if (k == index) slot.in_flight = false;
      }
      if (!host.ok()) return host.status();
    }
  }
  return Records{index, slot.host};
}

absl::Status WriteBackSender::Submit(Iteration stamp, const Records& buffer,
                                     std::vector<RowId> rows, std::vector<bool> write_back,
                                     Stream stream) {
  if (buffer.index >= 0) RETURN_IF_ERROR(slots_[buffer.index]->ready.Record(stream));
  Job job{stamp, buffer.index, std::move(rows), std::move(write_back)};
  if (!context_->is_asynchronous()) {
    // The records are there already: send now, without the thread's wake-up on the path of a
    // fetch that waits for this write-back. After the queue, to keep the order.
    RETURN_IF_ERROR(Drain());
    const absl::Status status = Send(job);
    absl::MutexLock lock(&mu_);
    if (job.buffer >= 0) slots_[job.buffer]->in_flight = false;
    if (!status.ok() && status_.ok()) status_ = status;
    return status;
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(status_);
  queue_.push_back(std::move(job));
  return absl::OkStatus();
}

absl::Status WriteBackSender::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !status_.ok() || (queue_.empty() && sending_ == 0);
  };
  mu_.Await(absl::Condition(&idle));
  return status_;
}

absl::Status WriteBackSender::Send(const Job& job) {
  std::vector<WriteBack> per_server(layout_.servers);
  for (WriteBack& wb : per_server) wb.stamp = job.stamp;
  if (job.buffer >= 0) {
    const Slot& slot = *slots_[job.buffer];
    RETURN_IF_ERROR(slot.ready.Synchronize());
    for (size_t k = 0; k < job.rows.size(); ++k) {
      if (!job.write_back[k]) continue;
      WriteBack& wb = per_server[ServerOfRow(job.rows[k], layout_.servers)];
      wb.rows.push_back(job.rows[k]);
      const float* record = slot.host + k * record_floats_;
      wb.records.insert(wb.records.end(), record, record + record_floats_);
    }
  }
  for (int s = 0; s < layout_.servers; ++s) {
    RETURN_IF_ERROR(
        transport_.Send(layout_.server_rank(s), kTagWriteBack, EncodeWriteBack(per_server[s])));
  }
  return absl::OkStatus();
}

void WriteBackSender::Loop() {
  if (absl::Status status = context_->MakeCurrent(); !status.ok()) {
    absl::MutexLock lock(&mu_);
    status_ = status;
    return;
  }
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      ++sending_;
    }
    const absl::Status status = Send(job);
    absl::MutexLock lock(&mu_);
    --sending_;
    if (job.buffer >= 0) slots_[job.buffer]->in_flight = false;
    if (!status.ok() && status_.ok()) status_ = status;
  }
}

}  // namespace bagpipe
