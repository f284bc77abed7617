#include "trainer_hooks/batch_staging.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace bagpipe {
namespace {

// Every array starts on its own 256-byte boundary (cuBLAS and vectorised kernels like that).
constexpr size_t kAlign = 256;
size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of one plan's arrays in a slot.
struct Layout {
  size_t dense = 0, labels = 0, offsets = 0, slots = 0, unique_slots = 0, row_begin = 0,
         pooled_rows = 0, fill = 0, extract = 0, private_slots = 0, private_rows = 0, total = 0;

  Layout(const TrainerPlan& plan, bool with_backward, bool identity) {
    size_t at = 0;
    auto place = [&](size_t* field, size_t bytes) {
      *field = at;
      at += AlignUp(bytes);
    };
    const size_t ids = plan.unique_index.size();
    const size_t unique = plan.unique_slots.size();
    place(&dense, plan.dense.size() * sizeof(float));
    place(&labels, plan.labels.size() * sizeof(float));
    place(&offsets, plan.offsets.size() * sizeof(int64_t));
    place(&slots, ids * sizeof(SlotId));
    place(&unique_slots, unique * sizeof(SlotId));
    place(&row_begin, with_backward ? (unique + 1) * sizeof(int64_t) : 0);
    place(&pooled_rows, with_backward ? ids * sizeof(int32_t) : 0);
    place(&fill, plan.fills.size() * sizeof(SlotId));
    place(&extract, plan.extract.size() * sizeof(SlotId));
    place(&private_slots, identity ? 0 : plan.private_unique.size() * sizeof(SlotId));
    place(&private_rows, identity ? 0 : plan.private_unique.size() * sizeof(int32_t));
    total = std::max<size_t>(at, kAlign);
  }
};

// True when the private rows are exactly the unique rows in order (one trainer, or no sharing).
bool PrivateIsIdentity(const TrainerPlan& plan) {
  if (plan.private_unique.size() != plan.unique_slots.size()) return false;
  for (size_t k = 0; k < plan.private_unique.size(); ++k) {
    if (plan.private_unique[k] != static_cast<int32_t>(k)) return false;
  }
  return true;
}

}  // namespace

struct BatchStaging::Slot {
  const DeviceContext* context = nullptr;
  char* host = nullptr;    // pinned
  char* device = nullptr;  // == host on a synchronous CPU context
  size_t capacity = 0;
  bool in_use = false;   // staged and not yet released (guarded by BatchStaging::mu_)
  DeviceEvent copied;    // after the copy host -> device (copy stream)
  DeviceEvent released;  // after the last read of the device buffer (the reader's stream)

  ~Slot() {
    if (context == nullptr) return;
    if (device != host) context->Free(device);
    context->FreePinned(host);
  }
};

BatchStaging::BatchStaging(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}

BatchStaging::~BatchStaging() = default;

absl::StatusOr<std::unique_ptr<BatchStaging>> BatchStaging::Create(
    std::shared_ptr<DeviceContext> context, int slots) {
  if (slots < 2) return absl::InvalidArgumentError("BatchStaging needs at least two slots");
  std::unique_ptr<BatchStaging> staging(new BatchStaging(context));
  for (int k = 0; k < slots; ++k) {
    auto slot = std::make_unique<Slot>();
    slot->context = context.get();
    ASSIGN_OR_RETURN(slot->copied, DeviceEvent::Create(context));
    ASSIGN_OR_RETURN(slot->released, DeviceEvent::Create(context));
    staging->slots_.push_back(std::move(slot));
  }
  return staging;
}

absl::Status BatchStaging::Grow(Slot& slot, size_t bytes) {
  // Headroom, so that batches a little larger than this one do not allocate again.
  const size_t capacity = AlignUp(bytes + bytes / 2);
  // Freeing waits for every stream (DeviceContext::Free): no queued copy or read still uses them.
  if (slot.device != slot.host) context_->Free(slot.device);
  context_->FreePinned(slot.host);
  slot.host = slot.device = nullptr;
  slot.capacity = 0;
  ASSIGN_OR_RETURN(void* host, context_->AllocatePinned(capacity));
  slot.host = static_cast<char*>(host);
  if (context_->is_asynchronous()) {
    ASSIGN_OR_RETURN(void* device, context_->Allocate(capacity));
    slot.device = static_cast<char*>(device);
  } else {
    slot.device = slot.host;
  }
  slot.capacity = capacity;
  return absl::OkStatus();
}

absl::StatusOr<StagedPlan> BatchStaging::Stage(const TrainerPlan& plan, bool with_backward) {
  const int64_t sequence = next_sequence_++;
  const int index = static_cast<int>(sequence % static_cast<int64_t>(slots_.size()));
  Slot& slot = *slots_[index];
  {
    absl::MutexLock lock(&mu_);
    auto free = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !slot.in_use || stop_; };
    mu_.Await(absl::Condition(&free));
    if (stop_) return absl::CancelledError("the trainer is stopping");
  }
  // The pinned buffer is written below: the copy out of it (for an earlier plan) must have run.
  // It normally has, iterations ago; the query then costs no synchronisation.
  ASSIGN_OR_RETURN(const bool copied, slot.copied.Query());
  if (!copied) RETURN_IF_ERROR(slot.copied.Synchronize());

  const bool identity = PrivateIsIdentity(plan);
  const Layout layout(plan, with_backward, identity);
  if (layout.total > slot.capacity) RETURN_IF_ERROR(Grow(slot, layout.total));

  char* h = slot.host;
  auto host_at = [&](size_t offset) { return h + offset; };
  // An empty vector's data() may be null (a batch without dense features), and memcpy from a
  // null pointer is undefined even for 0 bytes (UBSan reports it).
  auto copy = [](void* to, const void* from, size_t bytes) {
    if (bytes > 0) std::memcpy(to, from, bytes);
  };
  copy(host_at(layout.dense), plan.dense.data(), plan.dense.size() * sizeof(float));
  copy(host_at(layout.labels), plan.labels.data(), plan.labels.size() * sizeof(float));
  copy(host_at(layout.offsets), plan.offsets.data(), plan.offsets.size() * sizeof(int64_t));
  const size_t ids = plan.unique_index.size();
  auto* slots = reinterpret_cast<SlotId*>(host_at(layout.slots));
  for (size_t j = 0; j < ids; ++j) {
    const uint32_t u = plan.unique_index[j];
    if (u >= plan.unique_slots.size()) {
      return absl::DataLossError(absl::StrCat("plan of iteration ", plan.iteration,
                                              ": unique_index[", j, "] = ", u, " is not below ",
                                              plan.unique_slots.size(), " unique rows"));
    }
    slots[j] = plan.unique_slots[u];
  }
  copy(host_at(layout.unique_slots), plan.unique_slots.data(),
       plan.unique_slots.size() * sizeof(SlotId));
  BackwardIndexView backward;
  if (with_backward) {
    // The CSR of occurrences per unique row, built here, iterations before the reduce needs it.
    const int num_unique = static_cast<int>(plan.unique_slots.size());
    if (plan.offsets.size() !=
        static_cast<size_t>(plan.num_tables) * static_cast<size_t>(plan.num_samples) + 1) {
      return absl::DataLossError(absl::StrCat("plan of iteration ", plan.iteration, ": ",
                                              plan.offsets.size(), " offsets for ", plan.num_tables,
                                              " tables x ", plan.num_samples, " samples"));
    }
    RETURN_IF_ERROR(BuildBackwardIndexInto(plan.offsets.data(), plan.num_tables, plan.num_samples,
                                           plan.unique_index.data(), static_cast<int64_t>(ids),
                                           num_unique, PoolingMode::kSum, nullptr,
                                           reinterpret_cast<int64_t*>(host_at(layout.row_begin)),
                                           reinterpret_cast<int32_t*>(host_at(layout.pooled_rows)),
                                           nullptr, &cursor_)
                        .status());
    backward.num_tables = plan.num_tables;
    backward.num_samples = plan.num_samples;
    backward.num_unique = num_unique;
    backward.num_ids = static_cast<int64_t>(ids);
  }
  auto* fill = reinterpret_cast<SlotId*>(host_at(layout.fill));
  for (size_t k = 0; k < plan.fills.size(); ++k) fill[k] = plan.fills[k].slot;
  auto* extract = reinterpret_cast<SlotId*>(host_at(layout.extract));
  for (size_t k = 0; k < plan.extract.size(); ++k) extract[k] = plan.extract[k].slot;
  if (!identity) {
    auto* private_slots = reinterpret_cast<SlotId*>(host_at(layout.private_slots));
    auto* private_rows = reinterpret_cast<int32_t*>(host_at(layout.private_rows));
    for (size_t k = 0; k < plan.private_unique.size(); ++k) {
      const int32_t u = plan.private_unique[k];
      if (u < 0 || static_cast<size_t>(u) >= plan.unique_slots.size()) {
        return absl::DataLossError(absl::StrCat("plan of iteration ", plan.iteration,
                                                ": private row ", u, " is not a unique row"));
      }
      private_slots[k] = plan.unique_slots[u];
      private_rows[k] = u;
    }
  }

  if (slot.device != slot.host) {
    // The device buffer may still be read by the iteration that used the slot before.
    RETURN_IF_ERROR(context_->StreamWaitEvent(Stream::kCopy, slot.released));
    RETURN_IF_ERROR(context_->CopyToDevice(slot.device, slot.host, layout.total, Stream::kCopy));
  }
  RETURN_IF_ERROR(slot.copied.Record(Stream::kCopy));

  const char* d = slot.device;
  StagedPlan staged;
  staged.slot = index;
  staged.sequence = sequence;
  staged.dense = reinterpret_cast<const float*>(d + layout.dense);
  staged.labels = reinterpret_cast<const float*>(d + layout.labels);
  staged.offsets = reinterpret_cast<const int64_t*>(d + layout.offsets);
  staged.slots = reinterpret_cast<const SlotId*>(d + layout.slots);
  staged.unique_slots = reinterpret_cast<const SlotId*>(d + layout.unique_slots);
  if (with_backward) {
    backward.row_begin = reinterpret_cast<const int64_t*>(d + layout.row_begin);
    backward.pooled_rows = reinterpret_cast<const int32_t*>(d + layout.pooled_rows);
  }
  staged.backward = backward;
  staged.fill_slots = reinterpret_cast<const SlotId*>(d + layout.fill);
  staged.extract_slots = reinterpret_cast<const SlotId*>(d + layout.extract);
  staged.num_private = static_cast<int64_t>(plan.private_unique.size());
  if (identity) {
    staged.private_slots = staged.unique_slots;
  } else {
    staged.private_slots = reinterpret_cast<const SlotId*>(d + layout.private_slots);
    staged.private_rows = reinterpret_cast<const int32_t*>(d + layout.private_rows);
  }
  absl::MutexLock lock(&mu_);
  slot.in_use = true;
  return staged;
}

absl::Status BatchStaging::Acquire(const StagedPlan& staged, Stream stream) {
  if (staged.slot < 0) return absl::OkStatus();
  return context_->StreamWaitEvent(stream, slots_[staged.slot]->copied);
}

absl::Status BatchStaging::Release(const StagedPlan& staged, Stream reader) {
  if (staged.slot < 0) return absl::OkStatus();
  Slot& slot = *slots_[staged.slot];
  const absl::Status recorded = slot.released.Record(reader);
  absl::MutexLock lock(&mu_);
  slot.in_use = false;
  return recorded;
}

void BatchStaging::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
}

// --- UploadRing ----------------------------------------------------------------------------

struct UploadRing::Buffer {
  const DeviceContext* context = nullptr;
  char* host = nullptr;  // pinned
  char* device = nullptr;
  size_t capacity = 0;
  DeviceEvent copied;

  ~Buffer() {
    if (context == nullptr) return;
    if (device != host) context->Free(device);
    context->FreePinned(host);
  }
};

absl::StatusOr<std::unique_ptr<UploadRing>> UploadRing::Create(
    std::shared_ptr<DeviceContext> context, int buffers) {
  if (buffers < 1) return absl::InvalidArgumentError("UploadRing needs a buffer");
  std::unique_ptr<UploadRing> ring(new UploadRing(context));
  for (int k = 0; k < buffers; ++k) {
    auto buffer = std::make_unique<Buffer>();
    buffer->context = context.get();
    ASSIGN_OR_RETURN(buffer->copied, DeviceEvent::Create(context));
    ring->buffers_.push_back(std::move(buffer));
  }
  return ring;
}

UploadRing::UploadRing(std::shared_ptr<DeviceContext> context) : context_(std::move(context)) {}

UploadRing::~UploadRing() = default;

absl::StatusOr<void*> UploadRing::Upload(const void* data, size_t bytes, Stream stream,
                                         size_t room) {
  Buffer& buffer = *buffers_[next_];
  next_ = (next_ + 1) % buffers_.size();
  // The copy out of this pinned buffer, `buffers` uploads ago, must have run.
  ASSIGN_OR_RETURN(const bool copied, buffer.copied.Query());
  if (!copied) RETURN_IF_ERROR(buffer.copied.Synchronize());
  if (bytes > buffer.capacity) {
    // Only this buffer: the others hold uploads that are still valid. With room for what the
    // caller expects, each buffer grows once.
    const size_t capacity = AlignUp(std::max<size_t>({bytes + bytes / 2, room, 16384}));
    if (buffer.device != buffer.host) context_->Free(buffer.device);
    context_->FreePinned(buffer.host);
    buffer.host = buffer.device = nullptr;
    buffer.capacity = 0;
    ASSIGN_OR_RETURN(void* host, context_->AllocatePinned(capacity));
    buffer.host = static_cast<char*>(host);
    if (context_->is_asynchronous()) {
      ASSIGN_OR_RETURN(void* device, context_->Allocate(capacity));
      buffer.device = static_cast<char*>(device);
    } else {
      buffer.device = buffer.host;
    }
    buffer.capacity = capacity;
  }
  if (bytes > 0) std::memcpy(buffer.host, data, bytes);
  if (buffer.device != buffer.host) {
    RETURN_IF_ERROR(context_->CopyToDevice(buffer.device, buffer.host, bytes, stream));
  }
  RETURN_IF_ERROR(buffer.copied.Record(stream));
  return static_cast<void*>(buffer.device);
}

}  // namespace bagpipe
