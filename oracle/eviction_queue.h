// Internal: the queue of evictable rows of one (trainer, table) in eviction order.
//
// Entries are appended in the order rows become evictable (a row's last known use, for LRU
// order) and removed lazily: a slot's entry is valid while the slot is still queued and its
// version equals the entry's (the planner bumps the version each time it queues the slot).
// Invalid entries are skipped at the front and dropped by compaction, so memory stays
// proportional to the live entries. Not synchronised.
#ifndef BAGPIPE_ORACLE_EVICTION_QUEUE_H_
#define BAGPIPE_ORACLE_EVICTION_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace bagpipe {
namespace oracle_internal {

// Per-slot state of a trainer's cache. 16 bytes.
struct SlotState {
  RowId row = 0;
  uint32_t version = 0;  // bumped whenever the slot enters an eviction queue
  int16_t table = -1;    // -1: free
  uint8_t queued = 0;    // in an eviction queue (its entry with `version` is valid)
};
static_assert(sizeof(SlotState) == 16);

struct QueueEntry {
  SlotId slot;
  uint32_t version;
  Iteration last_use;
};

class EvictionQueue {
 public:
  void Push(SlotId slot, uint32_t version, Iteration last_use) {
    entries_.push_back({slot, version, last_use});
    ++live_;
  }

  // The first valid entry (dropping invalid ones before it), or nullptr when none is left.
  // `slots` is the trainer's per-slot state.
  const QueueEntry* Front(const SlotState* slots) {
    while (head_ < entries_.size()) {
      if (head_ + kPrefetch < entries_.size()) {
        __builtin_prefetch(slots + entries_[head_ + kPrefetch].slot);
      }
      const QueueEntry& e = entries_[head_];
      if (Valid(e, slots)) return &e;
      ++head_;
    }
    return nullptr;
  }

  // Removes the entry Front() returned.
  void PopFront() {
    ++head_;
    --live_;
  }

  // A queued slot left the queue other than through PopFront (its entry is now invalid).
  void Unlink() { --live_; }

  int64_t live() const { return live_; }
  bool empty() const { return live_ == 0; }

  // Drops consumed and invalid entries once they dominate the queue (amortised O(1)).
  void MaybeCompact(const SlotState* slots) {
    const size_t pending = entries_.size() - head_;
    if (pending > 2 * static_cast<size_t>(live_) + 1024) {
      size_t out = 0;
      for (size_t k = head_; k < entries_.size(); ++k) {
        const QueueEntry& e = entries_[k];
        if (Valid(e, slots)) entries_[out++] = e;
      }
      entries_.resize(out);
      head_ = 0;
    } else if (head_ > 4096 && head_ * 2 > entries_.size()) {
      entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }

 private:
  static constexpr size_t kPrefetch = 8;
  static bool Valid(const QueueEntry& e, const SlotState* slots) {
    return slots[e.slot].queued && slots[e.slot].version == e.version;
  }

  std::vector<QueueEntry> entries_;
  size_t head_ = 0;
  int64_t live_ = 0;
};

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_EVICTION_QUEUE_H_
