// Tests of the eviction queue (oracle/eviction_queue.h): eviction order, lazy removal and the live
// counts per last use that the planner splits its victims by.
#include "oracle/eviction_queue.h"

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"

namespace bagpipe::oracle_internal {
namespace {

// The live counts per last use, without the zero counts the queue may keep.
std::map<Iteration, int64_t> NonZero(const EvictionQueue& queue) {
  std::map<Iteration, int64_t> counts;
  for (const KeyCount& k : queue.keys()) {
    EXPECT_GE(k.count, 0) << "last use " << k.last_use;
    if (k.count > 0) counts[k.last_use] += k.count;
  }
  return counts;
}

TEST(EvictionQueueTest, PopsInPushOrderAndSkipsUnlinkedEntries) {
  std::vector<SlotState> slots(4);
  EvictionQueue queue;
  for (SlotId s = 0; s < 4; ++s) {
    slots[s].queued = 1;
    slots[s].version = 1;
    queue.Push(s, 1, /*last_use=*/s < 2 ? 10 : 11);
  }
  // Slot 0 leaves the queue (a later batch uses its row again).
  slots[0].queued = 0;
  queue.Unlink(10);
  EXPECT_EQ(queue.live(), 3);
  EXPECT_EQ(NonZero(queue), (std::map<Iteration, int64_t>{{10, 1}, {11, 2}}));
  for (SlotId want : {1, 2, 3}) {
    const QueueEntry* e = queue.Front(slots.data());
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->slot, want);
    slots[e->slot].queued = 0;
    queue.PopFront();
  }
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(queue.Front(slots.data()), nullptr);
  EXPECT_TRUE(NonZero(queue).empty());
}

// Random pushes (in last-use order, as the planner queues rows), pops and unlinks, with
// compaction: the live counts per last use always equal those of a straightforward model, and
// the front is always the oldest live entry.
TEST(EvictionQueueTest, LiveCountsMatchAModelUnderChurn) {
  constexpr SlotId kSlots = 2000;
  std::vector<SlotState> slots(kSlots);
  std::vector<Iteration> queued_at(kSlots, -1);  // the last use of the slot's live entry
  std::deque<SlotId> order;                      // model: live entries in push order
  EvictionQueue queue;
  CounterRng rng(7);
  for (Iteration i = 0; i < 3000; ++i) {
    // Queue some free slots at last use i.
    for (int k = 0; k < 20; ++k) {
      const SlotId s = static_cast<SlotId>(rng.NextBelow(kSlots));
      if (slots[s].queued) continue;
      slots[s].queued = 1;
      queue.Push(s, ++slots[s].version, i);
      queued_at[s] = i;
      order.push_back(s);
    }
    // Unlink a few queued slots anywhere in the queue.
    for (int k = 0; k < 6; ++k) {
      const SlotId s = static_cast<SlotId>(rng.NextBelow(kSlots));
      if (!slots[s].queued) continue;
      slots[s].queued = 0;
      queue.Unlink(queued_at[s]);
      std::erase(order, s);
    }
    // Pop from the front.
    for (int k = 0; k < 12 && !order.empty(); ++k) {
      const QueueEntry* e = queue.Front(slots.data());
      ASSERT_NE(e, nullptr);
      ASSERT_EQ(e->slot, order.front()) << "iteration " << i;
      ASSERT_EQ(e->last_use, queued_at[e->slot]);
      slots[e->slot].queued = 0;
      queue.PopFront();
      order.pop_front();
    }
    queue.MaybeCompact(slots.data());
    std::map<Iteration, int64_t> want;
    for (SlotId s : order) ++want[queued_at[s]];
    ASSERT_EQ(NonZero(queue), want) << "iteration " << i;
    ASSERT_EQ(queue.live(), static_cast<int64_t>(order.size()));
    // The counts are kept in increasing last use.
    for (size_t k = 1; k < queue.keys().size(); ++k) {
      ASSERT_LT(queue.keys()[k - 1].last_use, queue.keys()[k].last_use);
    }
  }
}

}  // namespace
}  // namespace bagpipe::oracle_internal
