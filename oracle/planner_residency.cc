// Residency phases of planning an iteration (see planner_impl.h): which rows each trainer's
// cache holds, which it evicts, and in which slots the fills land. With one trainer these
// phases also plan the write-backs (every eviction writes back: each resident row was touched
// when it was filled) and the fill stamps.

#include <algorithm>
#include <bit>
#include <deque>
#include <limits>
#include <optional>
#include <utility>

#include "oracle/planner_impl.h"

namespace bagpipe {

using oracle_internal::EvictionQueue;
using oracle_internal::kNoHandle;
using oracle_internal::QueueEntry;
using oracle_internal::Revival;
using oracle_internal::Segment;
using oracle_internal::SlotState;
using oracle_internal::TableTrack;
using oracle_internal::TrainerCache;
using oracle_internal::TrainerRow;
using oracle_internal::TrainerSlice;
using oracle_internal::UninitVector;

namespace {

// kLfu: eviction order of the queue heads: fewer uses, then least recent use.
using QueueKey = std::pair<int64_t, Iteration>;

constexpr int32_t kAhead = 16;  // records prefetched ahead in the hot loops

}  // namespace

void Planner::Impl::Revive(TrainerCache& cache, TableTrack& track, const Revival& row,
                           Iteration next_use) {
  SlotState& state = cache.slots[row.slot];
  if (state.queued) {
    state.queued = 0;
    if (options_.policy == CachePolicy::kLfu) {
      auto it = track.lfu.find(row.uses);
      it->second.Unlink(row.last_occ);
      if (it->second.empty()) track.lfu.erase(it);
    } else {
      track.lru.Unlink(row.last_occ);
    }
  }
  track.buckets.Add(row.slot, next_use);
}

void Planner::Impl::Classify(int trainer, int table, Iteration i) {
  Segment& seg = window(i).trainers[trainer].tables[table];
  TableTrack& track = caches_[trainer].tables[table];
  seg.misses.clear();
  seg.victims.clear();
  seg.victim_runs.clear();
  const int32_t n = static_cast<int32_t>(seg.rows.size());
  if (capture_slots(table)) {
    ClassifyCaptured(trainer, table, i);
    return;
  }
  seg.slots.resize(static_cast<size_t>(n));
  if (options_.policy == CachePolicy::kOff) {
    std::fill(seg.slots.begin(), seg.slots.end(), kNoSlot);
    for (int32_t p = 0; p < n; ++p) seg.misses.push_back(p);
    if (trainers_ == 1) return;
  }
  const bool lfu = options_.policy == CachePolicy::kLfu;
  const bool off = options_.policy == CachePolicy::kOff;
  const bool several = trainers_ > 1;
  const RowId base = table_offsets_[table];
  const RowId* rows = seg.rows.data();
  if (!lfu && !off && !several && track.rows.dense()) {
    // The common case of a dense table with one trainer: slots and misses only, records read
    // directly (prefetched when they outgrow the caches).
    const bool prefetch = table_rows(table) > oracle_internal::kDenseNoPrefetchRows;
    const auto records = track.rows.dense_records();
    for (int32_t p = 0; p < n; ++p) {
      if (prefetch && p + kAhead < n) {
        __builtin_prefetch(&records[static_cast<int64_t>(rows[p + kAhead] - base)]);
      }
      const SlotId slot = records[static_cast<int64_t>(rows[p] - base)].slot;
      seg.slots[p] = slot;
      if (slot == kNoSlot) seg.misses.push_back(p);
    }
    return;
  }
  if (lfu) seg.uses.resize(static_cast<size_t>(n));
  if (several) seg.globals.resize(static_cast<size_t>(n));
  for (int32_t p = 0; p < n; ++p) {
    if (p + kAhead < n) track.rows.Prefetch(static_cast<int64_t>(rows[p + kAhead] - base));
    TrainerRow& row = *track.rows.Find(static_cast<int64_t>(rows[p] - base));
    // Valid for resident rows (a holder's GlobalRow is never freed); Merge finds the misses'.
    if (several) seg.globals[p] = row.global;
    if (off) continue;
    seg.slots[p] = row.slot;
    if (row.slot == kNoSlot) seg.misses.push_back(p);
    if (lfu) seg.uses[p] = ++row.uses;
  }
}

void Planner::Impl::ClassifyCaptured(int trainer, int table, Iteration i) {
  Segment& seg = window(i).trainers[trainer].tables[table];
  TableTrack& track = caches_[trainer].tables[table];
  const int32_t n = static_cast<int32_t>(seg.rows.size());
  const bool several = trainers_ > 1;
  const RowId base = table_offsets_[table];
  const RowId* rows = seg.rows.data();
  SlotId* slots = seg.slots.data();
  // Slots Link saw that a row with a known next use has lost since: look those rows up again.
  while (!track.stale_order.empty() && track.stale_order.front().first < i) {
    const auto [until, id] = track.stale_order.front();
    track.stale_order.pop_front();
    auto it = track.stale.find(id);
    if (it != track.stale.end() && it->second == until) track.stale.erase(it);
  }
  if (!track.stale.empty()) {
    for (int32_t p = 0; p < n; ++p) {
      if (slots[p] >= 0 && track.stale.contains(static_cast<int64_t>(rows[p] - base))) {
        slots[p] = oracle_internal::kPendingSlot;
      }
    }
  }
  // Branch-free passes: which rows to look up, then which rows miss.
  std::vector<int32_t>& positions = positions_.local();
  positions.resize(static_cast<size_t>(n));
  int32_t* out = positions.data();
  int32_t count = 0;
  for (int32_t p = 0; p < n; ++p) {
    out[count] = p;
    count += slots[p] == oracle_internal::kPendingSlot ? 1 : 0;
  }
  for (int32_t k = 0; k < count; ++k) {
    if (k + kAhead < count) {
      track.rows.Prefetch(static_cast<int64_t>(rows[out[k + kAhead]] - base));
    }
    const int32_t p = out[k];
    const TrainerRow& row = *track.rows.Find(static_cast<int64_t>(rows[p] - base));
    slots[p] = row.slot;
    if (several) seg.globals[p] = row.global;
  }
  count = 0;
  for (int32_t p = 0; p < n; ++p) {
    out[count] = p;
    count += slots[p] == kNoSlot ? 1 : 0;
  }
  seg.misses.assign(out, out + count);
}

bool Planner::Impl::SelectVictims(int trainer, Iteration i) {
  TrainerCache& c = caches_[trainer];
  TrainerSlice& slice = window(i).trainers[trainer];
  TrainerPlan& plan = slice.plan;
  int64_t misses = 0;
  for (Segment& seg : slice.tables) {
    seg.first_fill = static_cast<int32_t>(misses);
    misses += static_cast<int64_t>(seg.misses.size());
  }
  plan.extract.clear();
  plan.fills.resize(static_cast<size_t>(misses));
  c.fill_slots.clear();
  // With one trainer every resident row is dirty and its only holder writes it back.
  const bool write_back = trainers_ == 1;
  SlotState* slots = c.slots.data();

  auto add_victim = [&](SlotId slot, int table) {
    SlotState& state = slots[slot];
    slice.tables[table].victims.push_back(
        {slot, kNoHandle, static_cast<int32_t>(plan.extract.size())});
    plan.extract.push_back({slot, state.row, /*evict=*/true, write_back});
    state.table = -1;
    c.fill_slots.push_back(slot);
  };

  if (options_.policy == CachePolicy::kOff) {
    for (SlotId slot : c.off_resident) add_victim(slot, slots[slot].table);
    c.off_resident.clear();
  } else {
    int64_t need = c.resident + misses - capacity_;
    const bool lfu = options_.policy == CachePolicy::kLfu;
    // kLfu: the head of a table's queues of rows with no known next use, or nullopt.
    auto head = [&](int table) -> std::optional<QueueKey> {
      TableTrack& track = c.tables[table];
      while (!track.lfu.empty()) {
        auto it = track.lfu.begin();
        if (const QueueEntry* e = it->second.Front(slots)) return QueueKey{it->first, e->last_use};
        track.lfu.erase(it);
      }
      return std::nullopt;
    };
    auto pop = [&](int table) {
      TableTrack& track = c.tables[table];
      EvictionQueue& queue = track.lfu.begin()->second;
      const SlotId slot = queue.Front(slots)->slot;
      queue.PopFront();
      if (queue.empty()) track.lfu.erase(track.lfu.begin());
      slots[slot].queued = 0;
      add_victim(slot, table);
    };
    // Rows with no known next use, in key order across tables (ties: lower table first).
    if (lfu) {
      while (need > 0) {
        int best_table = -1;
        QueueKey best{};
        for (int tb = 0; tb < tracks_; ++tb) {
          const std::optional<QueueKey> key = head(tb);
          if (key && (best_table < 0 || *key < best)) {
            best = *key;
            best_table = tb;
          }
        }
        if (best_table < 0) break;
        for (int tb = best_table; tb < tracks_ && need > 0; ++tb) {
          while (need > 0) {
            const std::optional<QueueKey> key = head(tb);
            if (!key || *key != best) break;
            pop(tb);
            --need;
          }
        }
      }
    } else {
      // Only decide here how many rows each table's queue gives up and where they go in the
      // eviction order (from the queues' live counts per last use); Evict pops them, one task
      // per table.
      std::vector<size_t>& cursor = c.key_cursor;
      cursor.assign(static_cast<size_t>(tracks_), 0);
      int64_t position = 0;
      while (need > 0) {
        Iteration best = std::numeric_limits<Iteration>::max();
        for (int tb = 0; tb < tracks_; ++tb) {
          const std::deque<oracle_internal::KeyCount>& keys = c.tables[tb].lru.keys();
          size_t& k = cursor[static_cast<size_t>(tb)];
          while (k < keys.size() && keys[k].count == 0) ++k;
          if (k < keys.size()) best = std::min(best, keys[k].last_use);
        }
        if (best == std::numeric_limits<Iteration>::max()) break;
        for (int tb = 0; tb < tracks_ && need > 0; ++tb) {
          const std::deque<oracle_internal::KeyCount>& keys = c.tables[tb].lru.keys();
          size_t& k = cursor[static_cast<size_t>(tb)];
          if (k == keys.size() || keys[k].last_use != best) continue;
          const int64_t take = std::min(keys[k].count, need);
          slice.tables[tb].victim_runs.push_back({position, take});
          position += take;
          need -= take;
          ++k;
        }
      }
      plan.extract.resize(static_cast<size_t>(position));
      c.fill_slots.resize(static_cast<size_t>(position));
      for (Segment& seg : slice.tables) {
        int64_t taken = 0;
        for (const auto& [first, count] : seg.victim_runs) taken += count;
        seg.victims.resize(static_cast<size_t>(taken));  // Evict fills them in
      }
    }
    // Rows whose next use is known, furthest first (kOracle).
    for (Iteration b = i + lookahead_ - 1; b > i && need > 0; --b) {
      for (int tb = 0; tb < tracks_ && need > 0; ++tb) {
        oracle_internal::NextUseBuckets& buckets = c.tables[tb].buckets;
        while (need > 0 && buckets.count(b) > 0) {
          const SlotId slot = buckets.Pop(b, slots);
          if (capture_slots(tb)) {
            // The batches entered so far may hold this slot for the row (ClassifyCaptured).
            TableTrack& track = c.tables[tb];
            const int64_t id = static_cast<int64_t>(slots[slot].row - table_offsets_[tb]);
            track.stale[id] = pushed_ - 1;
            track.stale_order.emplace_back(pushed_ - 1, id);
          }
          add_victim(slot, tb);
          --need;
        }
      }
    }
    if (need > 0) return false;
  }

  const int64_t victims = static_cast<int64_t>(plan.extract.size());
  c.resident += misses - victims;
  if (victims > misses) {
    // kOff: slots left over go back to the free stack, lowest victim index on top.
    for (int64_t k = victims - 1; k >= misses; --k) c.free_slots.push_back(c.fill_slots[k]);
    c.fill_slots.resize(static_cast<size_t>(misses));
  }
  while (static_cast<int64_t>(c.fill_slots.size()) < misses) {
    c.fill_slots.push_back(c.free_slots.back());
    c.free_slots.pop_back();
  }
  return true;
}

bool Planner::Impl::Evict(int trainer, int table, Iteration i) {
  TrainerCache& c = caches_[trainer];
  TrainerSlice& slice = window(i).trainers[trainer];
  Segment& seg = slice.tables[table];
  EvictionQueue& queue = c.tables[table].lru;
  SlotState* slots = c.slots.data();
  const bool write_back = trainers_ == 1;
  size_t v = 0;
  for (const auto& [first, count] : seg.victim_runs) {
    for (int64_t k = first; k < first + count; ++k) {
      const QueueEntry* e = queue.Front(slots);
      if (e == nullptr) return false;
      const SlotId slot = e->slot;
      queue.PopFront();
      SlotState& state = slots[slot];
      state.queued = 0;
      seg.victims[v++] = {slot, kNoHandle, static_cast<int32_t>(k)};
      slice.plan.extract[static_cast<size_t>(k)] = {slot, state.row, /*evict=*/true, write_back};
      state.table = -1;
      c.fill_slots[static_cast<size_t>(k)] = slot;
    }
  }
  return true;
}

void Planner::Impl::ExpireRecords(int table, Iteration i) {
  TableTrack& track = caches_[0].tables[table];
  const Iteration limit = i - horizon_;
  size_t due = 0;
  while (due < track.expiry.size() && track.expiry[due].first < limit) ++due;
  for (size_t k = 0; k < due; ++k) {
    if (k + kAhead < due) track.rows.Prefetch(track.expiry[k + kAhead].second);
    const int64_t id = track.expiry[k].second;
    const TrainerRow* row = track.rows.Find(id);
    // Forgotten only if it is still not resident, has no window occurrence and its latest
    // write-back is older than the horizon (a later eviction queued a later entry).
    if (row != nullptr && row->slot == kNoSlot && row->last_occ < i && row->write_back < limit) {
      track.rows.Erase(id);
    }
  }
  track.expiry.erase(track.expiry.begin(), track.expiry.begin() + static_cast<std::ptrdiff_t>(due));
}

void Planner::Impl::Apply(int trainer, int table, Iteration i) {
  TrainerCache& c = caches_[trainer];
  TrainerSlice& slice = window(i).trainers[trainer];
  Segment& seg = slice.tables[table];
  TableTrack& track = c.tables[table];
  TrainerPlan& plan = slice.plan;
  const bool single = trainers_ == 1;
  const bool lfu = options_.policy == CachePolicy::kLfu;
  const RowId base = table_offsets_[table];
  SlotState* slots = c.slots.data();
  if (single && !lfu) ExpireRecords(table, i);

  // Victims first: their records may be erased, which moves records.
  // One trainer: a victim that no batch in the window uses again is next filled at the
  // earliest from batch pushed_ on; when that is beyond the horizon (L > H, or no batch will
  // come), its write-back stamp could never be read, so its record goes now rather than after H
  // iterations on the expiry queue.
  const bool stamp_unread = finished_ || pushed_ > i + horizon_;
  const size_t victims = seg.victims.size();
  auto victim_id = [&](size_t v) {
    return static_cast<int64_t>(plan.extract[seg.victims[v].extract].row - base);
  };
  for (size_t v = 0; v < victims; ++v) {
    if (v + kAhead < victims) track.rows.Prefetch(victim_id(v + kAhead));
    oracle_internal::Victim& victim = seg.victims[v];
    const int64_t id = victim_id(v);
    TrainerRow& row = *track.rows.Find(id);
    row.slot = kNoSlot;
    if (single) {
      // Written back now; the record keeps the stamp until it is older than the horizon
      // (kLfu keeps every record: use counts persist across evictions).
      if (!lfu && stamp_unread && row.last_occ < i) {
        track.rows.Erase(id);
        continue;
      }
      row.write_back = static_cast<int32_t>(i);
      if (!lfu) track.expiry.emplace_back(i, id);
    } else {
      victim.global = row.global;
      // Not used at i (except under kOff); the record goes unless the window still uses it.
      if (row.last_occ < i && !lfu) track.rows.Erase(id);
    }
  }

  // Several trainers: each fill's GlobalRow (Merge), kept in the record while the row is held.
  const uint32_t* const merged_handles = single ? nullptr : sync_[table].handles.data();
  const int32_t* const qpos = single ? nullptr : sync_[table].qpos[trainer].data();
  const size_t misses = seg.misses.size();
  for (size_t j = 0; j < misses; ++j) {
    if (j + kAhead < misses) {
      track.rows.Prefetch(static_cast<int64_t>(seg.rows[seg.misses[j + kAhead]] - base));
      __builtin_prefetch(slots + c.fill_slots[static_cast<size_t>(seg.first_fill) + j + kAhead], 1);
    }
    const int32_t p = seg.misses[j];
    const size_t fill = static_cast<size_t>(seg.first_fill) + j;
    const SlotId slot = c.fill_slots[fill];
    TrainerRow& row = *track.rows.Find(static_cast<int64_t>(seg.rows[p] - base));
    row.slot = slot;
    if (!single) row.global = merged_handles[qpos[p]];
    seg.slots[p] = slot;
    SlotState& state = slots[slot];
    state.row = seg.rows[p];
    state.table = static_cast<int16_t>(table);
    Iteration after = -1;
    if (single && row.write_back >= i - horizon_) after = row.write_back;
    plan.fills[fill] = Fill{slot, seg.rows[p], after};
  }

  const int32_t n = static_cast<int32_t>(seg.rows.size());
  std::copy(seg.slots.begin(), seg.slots.end(), plan.unique_slots.begin() + seg.first_unique);
  if (!queued_policy()) return;
  // Rows used again in the window go to the bucket of their next use; the others join the queue
  // of evictable rows, in a second pass that prefetches their slot states (random accesses)
  // a fixed distance ahead.
  UninitVector<int32_t>& idle = seg.idle;
  idle.resize(static_cast<size_t>(n));
  const uint8_t* next = NextUses(track, i);
  int32_t idle_rows;
  if (next_width_ == 1) {
    idle_rows = track.buckets.AddSegment(seg.slots.data(), next, n, i, idle.data());
  } else if (next_width_ == 2) {
    idle_rows = track.buckets.AddSegment(seg.slots.data(), reinterpret_cast<const uint16_t*>(next),
                                         n, i, idle.data());
  } else {
    idle_rows = track.buckets.AddSegment(seg.slots.data(), reinterpret_cast<const int32_t*>(next),
                                         n, i, idle.data());
  }
  idle.resize(static_cast<size_t>(idle_rows));
  const size_t idle_count = idle.size();
  for (size_t k = 0; k < idle_count; ++k) {
    if (k + kAhead < idle_count) __builtin_prefetch(slots + seg.slots[idle[k + kAhead]], 1);
    const int32_t p = idle[k];
    const SlotId slot = seg.slots[p];
    SlotState& state = slots[slot];
    const uint32_t version = ++state.version;
    state.queued = 1;
    if (lfu) {
      EvictionQueue& queue = track.lfu[seg.uses[p]];
      queue.Push(slot, version, i);
      queue.MaybeCompact(slots);
    } else {
      track.lru.Push(slot, version, i);
    }
  }
  track.buckets.Consume(i);
  if (!lfu) track.lru.MaybeCompact(slots);
}

std::vector<TrainerPlan> Planner::Impl::DrainCaches() {
  std::vector<TrainerPlan> plans;
  for (int t = 0; t < trainers_; ++t) {
    plans.push_back(DrainPlan(t));
    TrainerPlan& plan = plans.back();
    TrainerCache& c = caches_[t];
    for (SlotId slot = 0; slot < static_cast<SlotId>(c.slots.size()); ++slot) {
      const SlotState& state = c.slots[slot];
      if (state.table < 0) continue;
      bool write_back = true;  // one trainer: every resident row is dirty
      if (trainers_ > 1) {
        TableTrack& track = caches_[t].tables[state.table];
        const TrainerRow& row =
            *track.rows.Find(static_cast<int64_t>(state.row - table_offsets_[state.table]));
        const oracle_internal::GlobalRow& g = globals_[state.table].rows[row.global];
        write_back = g.dirty && std::countr_zero(g.holders) == t;
      }
      plan.extract.push_back({slot, state.row, /*evict=*/true, write_back});
      if (write_back) Count(PlannerCounter::kDrainWriteBacks, 1);
    }
  }
  return plans;
}

}  // namespace bagpipe
