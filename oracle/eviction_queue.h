// Internal: the queue of evictable rows of one (trainer, table) in eviction order.
//
// Entries are appended in the order rows become evictable (a row's last known use, for LRU
// order) and removed lazily: a slot's entry is valid while the slot is still queued and its
// version equals the entry's (the planner bumps the version each time it queues the slot).
// Invalid entries are skipped at the front and dropped by compaction, so memory stays
// proportional to the live entries. The queue also counts its live entries per last use, so that
// the planner can tell how many rows each queue gives up before popping any (and pop the queues
// of different tables in parallel). Not synchronised.
#ifndef BAGPIPE_ORACLE_EVICTION_QUEUE_H_
#define BAGPIPE_ORACLE_EVICTION_QUEUE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
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

// The number of live entries of a queue with one last use.
struct KeyCount {
  Iteration last_use;
  int64_t count;
};

class EvictionQueue {
 public:
  // REQUIRES: last_use >= the last use of every entry pushed before (entries stay in key order).
  void Push(SlotId slot, uint32_t version, Iteration last_use) {
    entries_.push_back({slot, version, last_use});
    if (keys_.empty() || keys_.back().last_use != last_use) {
      keys_.push_back({last_use, 1});
    } else {
      ++keys_.back().count;
    }
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
    Uncount(entries_[head_].last_use);
    ++head_;
    --live_;
  }

  // A queued slot whose entry has `last_use` left the queue other than through PopFront (its
  // entry is now invalid).
  void Unlink(Iteration last_use) {
    Uncount(last_use);
    --live_;
  }

  int64_t live() const { return live_; }
  bool empty() const { return live_ == 0; }
  // Live entries per last use, in increasing last use (some counts may be 0).
  const std::deque<KeyCount>& keys() const { return keys_; }

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
  static constexpr size_t kPrefetch = 24;  // entries whose slot states Front prefetches ahead
  static bool Valid(const QueueEntry& e, const SlotState* slots) {
    return slots[e.slot].queued && slots[e.slot].version == e.version;
  }

  void Uncount(Iteration last_use) {
    auto it = keys_.begin();
    if (it->last_use != last_use) {
      it = std::lower_bound(keys_.begin(), keys_.end(), last_use,
                            [](const KeyCount& k, Iteration u) { return k.last_use < u; });
    }
    --it->count;
    while (!keys_.empty() && keys_.front().count == 0) keys_.pop_front();
  }

  std::vector<QueueEntry> entries_;
  std::deque<KeyCount> keys_;  // live entries per last use, in increasing last use
  size_t head_ = 0;
  int64_t live_ = 0;
};

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_EVICTION_QUEUE_H_
