// Internal to the trainer (trainer_hooks/trainer.cc): how the per-iteration arrays reach the
// device without the host waiting for the device on the critical path.
//
// BatchStaging is a ring of slots, each a pinned host buffer and a device buffer. The trainer's
// plan thread stages every plan as it arrives, iterations ahead of its use: it derives what the
// device needs from the plan (the occurrence slots, the backward index of the gradient reduce,
// the fill, extraction and apply slots), writes it straight into the slot's pinned buffer and
// queues one copy to the device buffer on the copy stream, recording an event. The training
// thread makes its compute stream wait for that event (Acquire) and, when the iteration's arrays
// are no longer needed, releases the slot with the stream that read them (Release): the copy of
// a later plan into the same device buffer then waits for those reads, and the plan thread
// writes the pinned buffer again only once the copy out of it has run. Slots are reused in
// order; a slot grows (with headroom) only when a plan does not fit, so steady-state iterations
// allocate nothing. On a synchronous CPU context the pinned buffer serves as the device buffer.
//
// UploadRing carries the few arrays the host computes during an iteration (combined gradients of
// shared rows and their slots) the same way, on the compute stream, through a ring of pinned
// buffers guarded by events.
//
// Thread-safety: Stage is called by one thread at a time (the plan thread during training, the
// training thread after it: the hand-over of the plans orders the two), Acquire/Release by the
// training thread; Stop from any thread. UploadRing is used by one thread.
#ifndef BAGPIPE_TRAINER_HOOKS_BATCH_STAGING_H_
#define BAGPIPE_TRAINER_HOOKS_BATCH_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/backward_index.h"
#include "core/device.h"
#include "core/types.h"
#include "oracle/plan.h"

namespace bagpipe {

// One staged plan: pointers into a slot's device buffer (context memory).
struct StagedPlan {
  int slot = -1;
  int64_t sequence = -1;  // staging order
  const float* dense = nullptr;
  const float* labels = nullptr;
  const int64_t* offsets = nullptr;
  const SlotId* slots = nullptr;         // per id occurrence: unique_slots[unique_index[j]]
  const SlotId* unique_slots = nullptr;  // per distinct row
  BackwardIndexView backward;            // for training plans
  const SlotId* fill_slots = nullptr;
  const SlotId* extract_slots = nullptr;
  // The rows updated from this trainer's own gradient: private_slots[k] takes gradient row
  // private_rows[k] (nullptr: row k).
  const SlotId* private_slots = nullptr;
  const int32_t* private_rows = nullptr;
  int64_t num_private = 0;
};

class BatchStaging {
 public:
  // `slots` >= 2 ring slots. REQUIRES: the calling thread made `context` current.
  static absl::StatusOr<std::unique_ptr<BatchStaging>> Create(
      std::shared_ptr<DeviceContext> context, int slots);
  ~BatchStaging();

  // Plan thread: waits for the next slot in ring order to be released (returns Cancelled after
  // Stop), writes the plan's arrays into it and queues their copy to the device. The backward
  // index is built for training plans (`with_backward`).
  absl::StatusOr<StagedPlan> Stage(const TrainerPlan& plan, bool with_backward);
  // Training thread: work queued on `stream` from now on sees the staged arrays.
  absl::Status Acquire(const StagedPlan& staged, Stream stream);
  // Training thread: the arrays are read only by work queued so far on `reader`; the slot may be
  // staged again after it. Slots are released in staging order.
  absl::Status Release(const StagedPlan& staged, Stream reader);
  // Wakes a Stage waiting for a slot (it fails with Cancelled), now and later.
  void Stop();

 private:
  struct Slot;
  explicit BatchStaging(std::shared_ptr<DeviceContext> context);
  absl::Status Grow(Slot& slot, size_t bytes);

  const std::shared_ptr<DeviceContext> context_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int64_t next_sequence_ = 0;    // plan thread only
  std::vector<int64_t> cursor_;  // plan thread only: BuildBackwardIndexInto's scratch
  mutable absl::Mutex mu_;       // guards the slots' in-use flags and stop_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

class UploadRing {
 public:
  // REQUIRES: the calling thread made `context` current.
  static absl::StatusOr<std::unique_ptr<UploadRing>> Create(std::shared_ptr<DeviceContext> context,
                                                            int buffers);
  ~UploadRing();
  // Copies `bytes` of host data to device memory on `stream` and returns the device copy. The
  // host data may change once Upload returns. The device copy is valid for work queued on
  // `stream` until `buffers` more uploads. A buffer that must grow grows to `room` bytes if that
  // is more (the caller's bound on later uploads), so that it grows once.
  absl::StatusOr<void*> Upload(const void* data, size_t bytes, Stream stream, size_t room = 0);

 private:
  struct Buffer;
  explicit UploadRing(std::shared_ptr<DeviceContext> context);
  const std::shared_ptr<DeviceContext> context_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  size_t next_ = 0;
};

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_BATCH_STAGING_H_
