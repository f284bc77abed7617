// Tests of the eviction queue (oracle/eviction_queue.h): eviction order, lazy removal and the live
// counts per last use that the planner splits its victims by; and of the next-use buckets, against
// a list per next use.
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

// Planning iterations in order, as the planner does: iteration i may take victims from the
// furthest next uses, then adds its rows with next uses up to `lookahead` - 1 ahead (and, as a
// batch entering the window does, a few at exactly `lookahead` ahead), then consumes next use i.
// The buckets must give the same slots in the same order as a list per next use (the planner's
// former layout), across the log's compactions, sorts and adds to the sorted lists.
TEST(NextUseBucketsTest, PopsLikeAListPerNextUseUnderChurn) {
  constexpr int kLookahead = 12;
  constexpr int kIterations = 3000;
  constexpr int kMaxAdds = 40;
  std::vector<SlotState> slots(static_cast<size_t>(kIterations) * kMaxAdds);
  NextUseBuckets buckets;
  buckets.Init(kLookahead + 1);
  std::map<Iteration, std::vector<SlotId>> model;
  CounterRng rng(11);
  SlotId next_slot = 0;
  int64_t pops = 0;
  for (Iteration i = 0; i < kIterations; ++i) {
    if (rng.NextBelow(3) == 0) {
      int64_t need = static_cast<int64_t>(rng.NextBelow(60));
      for (Iteration b = i + kLookahead - 1; b > i && need > 0; --b) {
        std::vector<SlotId>& list = model[b];
        ASSERT_EQ(buckets.count(b), static_cast<int64_t>(list.size())) << "iteration " << i;
        while (need > 0 && !list.empty()) {
          ASSERT_EQ(buckets.Pop(b, slots.data()), list.back())
              << "iteration " << i << ", next use " << b;
          list.pop_back();
          --need;
          ++pops;
        }
      }
    }
    const int adds = static_cast<int>(rng.NextBelow(kMaxAdds));
    for (int a = 0; a < adds; ++a) {
      const Iteration use = a % 8 == 7
                                ? i + kLookahead
                                : i + 1 + static_cast<Iteration>(rng.NextBelow(kLookahead - 1));
      buckets.Add(next_slot, use);
      model[use].push_back(next_slot++);
    }
    buckets.Consume(i);
    model.erase(i);
    for (const auto& [use, list] : model) {
      ASSERT_EQ(buckets.count(use), static_cast<int64_t>(list.size())) << "next use " << use;
    }
  }
  EXPECT_GT(pops, 1000);  // the pops ran across many sorts and compactions
}

// A planned segment added at once (AddSegment: no branch per row, counts from histograms) must
// leave the buckets as adding its rows one by one does, and list its rows without a next use.
// Segments of every size around the one-by-one threshold, distances in one and two bytes.
template <typename Distance>
void CheckAddSegmentMatchesAdd(int lookahead, uint64_t seed) {
  constexpr int kIterations = 400;
  std::vector<SlotState> slots(1);
  NextUseBuckets one_by_one;
  NextUseBuckets segments;
  one_by_one.Init(lookahead + 1);
  segments.Init(lookahead + 1);
  CounterRng rng(seed);
  SlotId next_slot = 0;
  int64_t pops = 0;
  for (Iteration i = 0; i < kIterations; ++i) {
    if (rng.NextBelow(4) == 0) {
      int64_t need = static_cast<int64_t>(rng.NextBelow(300));
      for (Iteration b = i + lookahead; b > i && need > 0; --b) {
        ASSERT_EQ(segments.count(b), one_by_one.count(b)) << "iteration " << i;
        while (need > 0 && one_by_one.count(b) > 0) {
          ASSERT_EQ(segments.Pop(b, slots.data()), one_by_one.Pop(b, slots.data()))
              << "iteration " << i << ", next use " << b;
          --need;
          ++pops;
        }
      }
    }
    const int32_t n =
        static_cast<int32_t>(rng.NextBelow(3) == 0 ? rng.NextBelow(300) : rng.NextBelow(2000));
    std::vector<SlotId> seg_slots(static_cast<size_t>(n));
    std::vector<Distance> next(static_cast<size_t>(n));
    std::vector<int32_t> expected_idle;
    for (int32_t p = 0; p < n; ++p) {
      seg_slots[p] = next_slot++;
      // A third without a next use; runs of equal distances, as popular rows give.
      const uint64_t pick = rng.NextBelow(6);
      next[p] = pick < 2 ? Distance{0}
                : pick == 2 && p > 0
                    ? next[p - 1]
                    : static_cast<Distance>(1 + rng.NextBelow(static_cast<uint64_t>(lookahead)));
      if (next[p] > 0) {
        one_by_one.Add(seg_slots[p], i + next[p]);
      } else {
        expected_idle.push_back(p);
      }
    }
    std::vector<int32_t> idle(static_cast<size_t>(n) + 1, -1);
    const int32_t idle_count =
        segments.AddSegment(seg_slots.data(), next.data(), n, i, idle.data());
    idle.resize(static_cast<size_t>(idle_count));
    ASSERT_EQ(idle, expected_idle) << "iteration " << i;
    for (Iteration b = i; b <= i + lookahead; ++b) {
      ASSERT_EQ(segments.count(b), one_by_one.count(b)) << "iteration " << i << ", next use " << b;
    }
    one_by_one.Consume(i);
    segments.Consume(i);
  }
  EXPECT_GT(pops, 1000);  // victims were taken from sorted and unsorted buckets alike
}

TEST(NextUseBucketsTest, AddSegmentMatchesAddingRowsOneByOne) {
  CheckAddSegmentMatchesAdd<uint8_t>(/*lookahead=*/200, /*seed=*/5);
  CheckAddSegmentMatchesAdd<uint8_t>(/*lookahead=*/255, /*seed=*/6);
  CheckAddSegmentMatchesAdd<uint16_t>(/*lookahead=*/300, /*seed=*/7);
}

}  // namespace
}  // namespace bagpipe::oracle_internal
