// Internal: the queue of evictable rows of one (trainer, table) in eviction order.
//
// Entries are appended in the order rows become evictable (a row's last known use, for LRU
// order) and removed lazily: a slot's entry is valid while the slot is still queued and its
// version equals the entry's (the planner bumps the version each time it queues the slot).
// Invalid entries are skipped at the front and dropped by compaction, so memory stays
// proportional to the live entries. The queue also counts its live entries per last use, so that
// the planner can tell how many rows each queue gives up before popping any (and pop the queues
// of different tables in parallel). Not synchronised.
//
// Also the next-use buckets (NextUseBuckets below): the resident rows whose next use is known.
#ifndef BAGPIPE_ORACLE_EVICTION_QUEUE_H_
#define BAGPIPE_ORACLE_EVICTION_QUEUE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "core/types.h"
#include "oracle/uninit_vector.h"

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

// The resident rows of one (trainer, table) whose next use is known, by next use: Belady's
// victims of last resort (furthest next use first; within one next use, the row added last
// first). Adding is an append to one log in time order: the rows of one iteration go to up to
// L different next uses, and a list per next use took a cold cache line for nearly every
// append. The log is sorted into per-next-use lists only when victims are first taken from it
// (a cache with enough rows of no known next use never does); from then on, until the log is
// next compacted, adds go to those lists too, so that a cache taking such victims every
// iteration does not sort again each time. Not synchronised.
class NextUseBuckets {
 public:
  // `ring` > the largest distance from the first iteration not consumed to a next use added,
  // popped or counted (every next use lies in [that iteration, that iteration + ring)).
  void Init(int ring) {
    live_.assign(static_cast<size_t>(ring), 0);
    lists_.resize(static_cast<size_t>(ring));
  }

  void Add(SlotId slot, Iteration next_use) {
    const size_t r = Ring(next_use);
    if (indexed_) lists_[r].push_back(static_cast<uint32_t>(log_.size()));
    log_.push_back({slot, static_cast<int32_t>(next_use)});
    ++live_[r];
    ++total_;
  }

  // Adds the rows of a segment planned at iteration `i` (the first not consumed), in order: row
  // p, in slot slots[p], waits for i + next[p] if next[p] > 0; the positions of the other rows
  // (no known next use) go to `idle`, in order. Returns how many went there. The same as
  // Add(slots[p], i + next[p]) for each row with next[p] > 0, without a branch per row (which
  // rows have a next use follows no pattern a branch predictor could learn).
  // REQUIRES: `idle` has room for n positions; i >= the first iteration not consumed and
  // i + next[p] lies in the ring (see Init).
  template <typename Distance>
  int32_t AddSegment(const SlotId* slots, const Distance* next, int32_t n, Iteration i,
                     int32_t* idle) {
    // Sorted lists take each row apart anyway; a short segment is not worth the histograms.
    if (indexed_ || n < kMinSegment) {
      int32_t idle_count = 0;
      for (int32_t p = 0; p < n; ++p) {
        if (next[p] > 0) {
          Add(slots[p], i + next[p]);
        } else {
          idle[idle_count++] = p;
        }
      }
      return idle_count;
    }
    const size_t old = log_.size();
    log_.resize(old + static_cast<size_t>(n));
    Entry* const out = log_.data() + old;
    size_t added = 0;
    int32_t idle_count = 0;
    // Every row's entry and idle position are written; only the right ones are kept.
    auto scan = [&](auto count) {
      for (int32_t p = 0; p < n; ++p) {
        const int64_t d = next[p];
        out[added] = {slots[p], static_cast<int32_t>(i + d)};
        added += d != 0 ? 1 : 0;
        idle[idle_count] = p;
        idle_count += d == 0 ? 1 : 0;
        count(p, d);
      }
    };
    if constexpr (sizeof(Distance) == 1) {
      // Counts per distance in four interleaved histograms: rows in a row often share a
      // distance, and one counter would make each increment wait for the previous one.
      uint32_t counts[4][256] = {};
      scan([&](int32_t p, int64_t d) { ++counts[p & 3][d]; });
      for (size_t d = 1; d < 256; ++d) {
        const uint32_t c = counts[0][d] + counts[1][d] + counts[2][d] + counts[3][d];
        if (c != 0) live_[Ring(i + static_cast<Iteration>(d))] += c;
      }
    } else {
      scan([&](int32_t, int64_t d) { live_[Ring(i + d)] += d != 0 ? 1 : 0; });
    }
    log_.resize(old + added);
    total_ += static_cast<int64_t>(added);
    return idle_count;
  }

  // Rows waiting for `next_use`.
  int64_t count(Iteration next_use) const { return live_[Ring(next_use)]; }

  // Removes and returns the slot of the row added last among those waiting for `next_use`.
  // REQUIRES: count(next_use) > 0. `slots`: the trainer's slot states (prefetched ahead).
  SlotId Pop(Iteration next_use, const SlotState* slots) {
    if (!indexed_) Sort();
    std::vector<uint32_t>& list = lists_[Ring(next_use)];
    if (list.size() > kPrefetch)
      __builtin_prefetch(slots + log_[list[list.size() - kPrefetch]].slot);
    Entry& e = log_[list.back()];
    list.pop_back();
    e.next_use = kGone;
    --live_[Ring(next_use)];
    --total_;
    return e.slot;
  }

  // Iteration `i` is planned: the rows waiting for it are used at i and leave. Drops the
  // entries of rows gone once they dominate the log (amortised O(1)).
  void Consume(Iteration i) {
    for (; cursor_ <= i; ++cursor_) {
      total_ -= live_[cursor_ring_];
      live_[cursor_ring_] = 0;
      if (indexed_) lists_[cursor_ring_].clear();
      if (++cursor_ring_ == live_.size()) cursor_ring_ = 0;
    }
    if (log_.size() > 2 * static_cast<size_t>(total_) + 4096) {
      // Branch-free: about half the entries are gone, in no pattern a branch could predict.
      size_t out = 0;
      for (const Entry& e : log_) {
        log_[out] = e;
        out += e.next_use > i ? 1 : 0;
      }
      log_.resize(out);
      indexed_ = false;  // the positions moved
    }
  }

 private:
  static constexpr int32_t kGone = std::numeric_limits<int32_t>::min();
  static constexpr size_t kPrefetch = 16;      // victims whose slot states Pop prefetches ahead
  static constexpr int32_t kMinSegment = 256;  // rows AddSegment adds without a branch per row
  struct Entry {
    SlotId slot;
    int32_t next_use;  // kGone once popped
  };

  // The ring position of `next_use`, without a division (one per added row was a measurable
  // cost). REQUIRES: cursor_ <= next_use < cursor_ + ring.
  size_t Ring(Iteration next_use) const {
    size_t r = cursor_ring_ + static_cast<size_t>(next_use - cursor_);
    if (r >= live_.size()) r -= live_.size();
    return r;
  }

  // Lists, per next use not consumed, the log positions of the rows waiting for it, in log order.
  void Sort() {
    for (std::vector<uint32_t>& list : lists_) list.clear();
    for (size_t k = 0; k < log_.size(); ++k) {
      if (log_[k].next_use >= cursor_)
        lists_[Ring(log_[k].next_use)].push_back(static_cast<uint32_t>(k));
    }
    indexed_ = true;
  }

  UninitVector<Entry> log_;                   // in the order rows were added
  std::vector<int64_t> live_;                 // rows waiting, by next use (ring)
  std::vector<std::vector<uint32_t>> lists_;  // log positions by next use (ring), if indexed_
  int64_t total_ = 0;
  Iteration cursor_ = 0;    // the first next use not consumed
  size_t cursor_ring_ = 0;  // its ring position
  bool indexed_ = false;    // lists_ is current
};

}  // namespace oracle_internal
}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_EVICTION_QUEUE_H_
