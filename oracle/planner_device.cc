// kDevice: every row of every table is resident on every trainer at slot RowId. Nothing is
// fetched or evicted; with several trainers every touched row is shared by all of them.

#include <algorithm>
#include <bit>
#include <numeric>

#include "oracle/planner_impl.h"

namespace bagpipe {

using oracle_internal::Segment;
using oracle_internal::TableSync;
using oracle_internal::TrainerSlice;
using oracle_internal::WindowBatch;

void Planner::Impl::PlanDevice(int table, Iteration i) {
  TableSync& sync = sync_[table];
  sync.Reset();
  WindowBatch& wb = window(i);
  std::vector<uint64_t>& dirty = globals_[table].device_dirty;
  const RowId base = table_offsets_[table];
  size_t total = 0;
  for (TrainerSlice& slice : wb.trainers) {
    Segment& seg = slice.tables[table];
    seg.misses.clear();
    seg.victims.clear();
    SlotId* slots = slice.plan.unique_slots.data() + seg.first_unique;
    for (size_t p = 0; p < seg.rows.size(); ++p) {
      slots[p] = static_cast<SlotId>(seg.rows[p]);
      const uint64_t id = seg.rows[p] - base;
      dirty[id / 64] |= uint64_t{1} << (id % 64);
    }
    total += seg.rows.size();
  }
  if (trainers_ == 1) return;

  // The union of the trainers' rows, with the mask of trainers touching each.
  sync.dedup.Reset(total);
  sync.ids.clear();
  sync.touch_masks.clear();
  for (int t = 0; t < trainers_; ++t) {
    const Segment& seg = wb.trainers[t].tables[table];
    std::vector<int32_t>& qs = sync.qs[t];
    qs.resize(seg.rows.size());
    for (size_t p = 0; p < seg.rows.size(); ++p) {
      const int64_t id = static_cast<int64_t>(seg.rows[p] - base);
      bool inserted;
      const int32_t q = sync.dedup.Insert(id, &inserted);
      if (inserted) {
        sync.ids.push_back(id);
        sync.touch_masks.push_back(0);
      }
      sync.touch_masks[q] |= uint64_t{1} << t;
      qs[p] = q;
    }
  }
  const int32_t m = static_cast<int32_t>(sync.ids.size());
  sync.order.resize(m);
  std::iota(sync.order.begin(), sync.order.end(), 0);
  std::sort(sync.order.begin(), sync.order.end(),
            [&](int32_t a, int32_t b) { return sync.ids[a] < sync.ids[b]; });
  sync.rank.resize(m);
  for (int32_t s = 0; s < m; ++s) sync.rank[sync.order[s]] = s;
  for (int t = 0; t < trainers_; ++t) {
    const Segment& seg = wb.trainers[t].tables[table];
    std::vector<int32_t>& own = sync.own[t];
    own.assign(m, -1);
    for (size_t p = 0; p < seg.rows.size(); ++p) {
      own[sync.rank[sync.qs[t][p]]] = seg.first_unique + static_cast<int32_t>(p);
    }
  }
  wb.now[static_cast<size_t>(table)].assign(m, 0);
  sync.shared_count = m;
  for (int h = 0; h < trainers_; ++h) {
    std::vector<oracle_internal::SharedOut>& out = sync.shared[h];
    out.reserve(m);
    const uint64_t others =
        (trainers_ == 64 ? ~uint64_t{0} : (uint64_t{1} << trainers_) - 1) & ~(uint64_t{1} << h);
    for (int32_t s = 0; s < m; ++s) {
      const int32_t q = sync.order[s];
      const RowId row = base + static_cast<RowId>(sync.ids[q]);
      const int32_t own = sync.own[h][s];
      out.push_back({SharedRow{static_cast<SlotId>(row), row, own, false}, s});
      std::vector<int32_t>* const send = &sync.send[static_cast<size_t>(h * trainers_)];
      std::vector<int32_t>* const recv = &sync.recv[static_cast<size_t>(h * trainers_)];
      if (own >= 0) {
        for (uint64_t peers = others; peers != 0; peers &= peers - 1) {
          send[std::countr_zero(peers)].push_back(s);
          ++sync.exchanged;
        }
      }
      for (uint64_t peers = sync.touch_masks[q] & others; peers != 0; peers &= peers - 1) {
        recv[std::countr_zero(peers)].push_back(s);
      }
    }
  }

  // Rows shared at i - 1 and used again at i were needed "now" at i - 1.
  std::vector<int64_t> sorted(m);
  for (int32_t s = 0; s < m; ++s) sorted[s] = sync.ids[sync.order[s]];
  if (i > 0) {
    size_t a = 0;
    size_t b = 0;
    while (a < sync.prev_ids.size() && b < sorted.size()) {
      if (sync.prev_ids[a] < sorted[b]) {
        ++a;
      } else if (sorted[b] < sync.prev_ids[a]) {
        ++b;
      } else {
        MarkNow(i - 1, table, static_cast<int32_t>(a));
        ++a;
        ++b;
      }
    }
  }
  sync.prev_ids = std::move(sorted);
}

std::vector<TrainerPlan> Planner::Impl::DrainDevice() {
  std::vector<TrainerPlan> plans;
  for (int t = 0; t < trainers_; ++t) plans.push_back(DrainPlan(t));
  TrainerPlan& owner = plans[0];
  for (int tb = 0; tb < tracks_; ++tb) {
    const std::vector<uint64_t>& dirty = globals_[tb].device_dirty;
    for (size_t w = 0; w < dirty.size(); ++w) {
      for (uint64_t bits = dirty[w]; bits != 0; bits &= bits - 1) {
        const RowId row = table_offsets_[tb] + w * 64 + static_cast<RowId>(std::countr_zero(bits));
        owner.extract.push_back({static_cast<SlotId>(row), row, /*evict=*/true,
                                 /*write_back=*/true});
      }
    }
  }
  Count(PlannerCounter::kDrainWriteBacks, static_cast<int64_t>(owner.extract.size()));
  return plans;
}

}  // namespace bagpipe
