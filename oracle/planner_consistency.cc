// Consistency phase of planning an iteration with several trainers (see planner.h,
// "Consistency", and planner_impl.h): write-back owners, flushes, fill stamps, shared and
// private rows; then the per-trainer sync lists.

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

#include "oracle/planner_impl.h"

namespace bagpipe {

using oracle_internal::GlobalRow;
using oracle_internal::GlobalTable;
using oracle_internal::kNoHandle;
using oracle_internal::Segment;
using oracle_internal::SharedOut;
using oracle_internal::TableSync;
using oracle_internal::TableTrack;
using oracle_internal::TrainerRow;
using oracle_internal::TrainerSlice;
using oracle_internal::WindowBatch;

namespace {

uint64_t Bit(int trainer) { return uint64_t{1} << trainer; }

constexpr size_t kAhead = 16;  // records prefetched ahead in the hot loops

}  // namespace

void Planner::Impl::MarkNow(Iteration i, int table, int32_t flag) {
  window(i).now[static_cast<size_t>(table)][static_cast<size_t>(flag)] = 1;
}

void Planner::Impl::Expire(int table, Iteration i) {
  GlobalTable& gt = globals_[table];
  const Iteration limit = i - horizon_;
  size_t due = 0;
  while (due < gt.expiry.size() && gt.expiry[due].pushed < limit) ++due;
  // Records and index entries prefetched ahead: each is a miss, and the index entry is erased.
  for (size_t k = 0; k < due; ++k) {
    if (k + kAhead < due) {
      const oracle_internal::Expiry& ahead = gt.expiry[k + kAhead];
      __builtin_prefetch(&gt.rows[ahead.handle]);
      gt.index.Prefetch(ahead.id);
    }
    const oracle_internal::Expiry& e = gt.expiry[k];
    const GlobalRow& g = gt.rows[e.handle];
    // The record may have been freed (and reused) since; it is forgotten only if it is still
    // this row's, nobody holds it and its stamp is older than the horizon.
    if (g.id == e.id && g.holders == 0 && !g.dirty && g.write_back < limit) {
      gt.index.Erase(g.id);
      gt.rows.Free(e.handle);
    }
  }
  gt.expiry.erase(gt.expiry.begin(), gt.expiry.begin() + static_cast<std::ptrdiff_t>(due));
}

void Planner::Impl::Consistency(int table, Iteration i) {
  TableSync& sync = sync_[table];
  sync.Reset();
  Expire(table, i);
  GlobalTable& gt = globals_[table];
  WindowBatch& wb = window(i);
  const RowId base = table_offsets_[table];

  // a. Evictions. The lowest-id trainer evicting a row at this boundary decides for all.
  for (int t = 0; t < trainers_; ++t) {
    const std::vector<oracle_internal::Victim>& victims = wb.trainers[t].tables[table].victims;
    for (size_t v = 0; v < victims.size(); ++v) {
      if (v + kAhead < victims.size()) __builtin_prefetch(&gt.rows[victims[v + kAhead].global], 1);
      gt.rows[victims[v].global].evicting |= Bit(t);
    }
  }
  for (int t = 0; t < trainers_; ++t) {
    TrainerPlan& plan = wb.trainers[t].plan;
    for (const oracle_internal::Victim& v : wb.trainers[t].tables[table].victims) {
      GlobalRow& g = gt.rows[v.global];
      if (g.evicting == 0) continue;
      const uint64_t remaining = g.holders & ~g.evicting;
      if (remaining == 0 && g.dirty) {
        plan.extract[static_cast<size_t>(v.extract)].write_back = true;
        g.write_back = static_cast<int32_t>(i);
        g.dirty = false;
        ++sync.write_backs;
      }
      if (g.shared_iter == i - 1) MarkNow(i - 1, table, g.shared_index);
      g.holders = remaining;
      g.evicting = 0;
      if (remaining == 0) gt.expiry.push_back({i, v.global, g.id});
    }
  }

  // b. Fills: flush rows another trainer holds dirty; stamp every fill.
  for (int t = 0; t < trainers_; ++t) {
    TrainerSlice& slice = wb.trainers[t];
    Segment& seg = slice.tables[table];
    TableTrack& track = caches_[t].tables[table];
    for (size_t j = 0; j < seg.misses.size(); ++j) {
      if (j + kAhead < seg.misses.size()) {
        const int64_t ahead = static_cast<int64_t>(seg.rows[seg.misses[j + kAhead]] - base);
        gt.index.Prefetch(ahead);
        track.rows.Prefetch(ahead);
      }
      const int32_t p = seg.misses[j];
      const RowId row = seg.rows[p];
      const int64_t id = static_cast<int64_t>(row - base);
      uint32_t& handle_ref = gt.index.FindOrInsert(id);
      if (handle_ref == kNoHandle) {
        handle_ref = gt.rows.Allocate();
        gt.rows[handle_ref].id = id;
        const size_t need = gt.rows.capacity() * static_cast<size_t>(trainers_);
        if (gt.holder_slots.size() < need) {
          gt.holder_slots.resize(std::max(need, 2 * gt.holder_slots.size()), kNoSlot);
        }
      }
      const uint32_t handle = handle_ref;
      GlobalRow& g = gt.rows[handle];
      track.rows.Find(id)->global = handle;
      seg.globals[static_cast<size_t>(p)] = handle;
      if (g.holders != 0 && g.dirty) {
        const int owner = std::countr_zero(g.holders);
        Iteration at = std::max<Iteration>(g.last_touch + 1, i - emit_lag_);
        // A shared row whose plans of last_touch are already released may still have its
        // exchange in flight at last_touch + 1 (`now` is final): flush one boundary later.
        if (at == g.last_touch + 1 && g.last_touch < next_release_ &&
            g.shared_iter == g.last_touch) {
          ++at;
        }
        const SlotId owner_slot =
            gt.holder_slots[static_cast<size_t>(handle) * trainers_ + static_cast<size_t>(owner)];
        sync.flushes.push_back({owner, at,
                                Extraction{owner_slot, row, /*evict=*/false,
                                           /*write_back=*/true}});
        g.write_back = static_cast<int32_t>(at);
        g.dirty = false;
        if (g.shared_iter == at - 1) MarkNow(at - 1, table, g.shared_index);
      }
      slice.plan.fills[static_cast<size_t>(seg.first_fill) + j].after_stamp =
          g.write_back >= i - horizon_ ? g.write_back : -1;
      g.holders |= Bit(t);
      gt.holder_slots[static_cast<size_t>(handle) * trainers_ + static_cast<size_t>(t)] =
          seg.slots[static_cast<size_t>(p)];
    }
  }

  // c. Touches; private rows; rows held since i - 1 and used now were shared at i - 1 "now".
  for (int t = 0; t < trainers_; ++t) {
    TrainerSlice& slice = wb.trainers[t];
    const Segment& seg = slice.tables[table];
    std::vector<int32_t>& private_rows = sync.private_rows[t];
    size_t next_miss = 0;
    const int32_t n = static_cast<int32_t>(seg.rows.size());
    const uint32_t* globals = seg.globals.data();
    for (int32_t p = 0; p < n; ++p) {
      if (p + static_cast<int32_t>(kAhead) < n)
        __builtin_prefetch(&gt.rows[globals[p + kAhead]], 1);
      const bool miss = next_miss < seg.misses.size() && seg.misses[next_miss] == p;
      if (miss) ++next_miss;
      const uint32_t handle = globals[p];
      GlobalRow& g = gt.rows[handle];
      if (!miss && g.shared_iter == i - 1) MarkNow(i - 1, table, g.shared_index);
      if (g.touch_iter != i) {
        g.touch_iter = static_cast<int32_t>(i);
        g.touchers = 0;
        g.touch_index = static_cast<int32_t>(sync.touched.size());
        sync.touched.push_back(handle);
        sync.touch_pos.resize(sync.touch_pos.size() + static_cast<size_t>(trainers_), -1);
      }
      sync.touch_pos[static_cast<size_t>(g.touch_index) * trainers_ + t] = p;
      g.touchers |= Bit(t);
      g.last_touch = static_cast<int32_t>(i);
      g.dirty = true;
      if (g.holders == Bit(t)) private_rows.push_back(seg.first_unique + p);
    }
  }

  // d. Shared rows: touched and held by at least two trainers, in RowId order.
  // At least two holders (no POPCNT in the baseline instruction set).
  auto is_shared = [](const GlobalRow& g) { return (g.holders & (g.holders - 1)) != 0; };
  if (gt.index.dense()) {
    // Tables small enough for a direct index: mark the shared ids in a bitmap and read them back
    // in order (a scan of at most table_rows / 64 words instead of a sort), clearing the bits.
    std::vector<uint64_t>& bits = sync.shared_bits;
    bits.resize(static_cast<size_t>(table_rows(table) + 63) / 64, 0);
    size_t first = bits.size();
    size_t last = 0;
    for (uint32_t handle : sync.touched) {
      const GlobalRow& g = gt.rows[handle];
      if (!is_shared(g)) continue;
      const size_t w = static_cast<size_t>(g.id) / 64;
      bits[w] |= uint64_t{1} << (g.id % 64);
      first = std::min(first, w);
      last = std::max(last, w);
    }
    for (size_t w = first; w <= last && w < bits.size(); ++w) {
      for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
        const int64_t id = static_cast<int64_t>(w * 64) + std::countr_zero(word);
        sync.shared_rows.push_back(gt.index.Find(id));
      }
      bits[w] = 0;
    }
  } else {
    sync.shared_sorted.clear();
    for (uint32_t handle : sync.touched) {
      const GlobalRow& g = gt.rows[handle];
      if (is_shared(g)) sync.shared_sorted.emplace_back(g.id, handle);
    }
    // Row ids are distinct: sorting the pairs orders the handles by id.
    std::sort(sync.shared_sorted.begin(), sync.shared_sorted.end());
    for (const auto& [id, handle] : sync.shared_sorted) sync.shared_rows.push_back(handle);
  }
  sync.shared_count = static_cast<int64_t>(sync.shared_rows.size());
  wb.now[static_cast<size_t>(table)].assign(sync.shared_rows.size(), 0);
  const size_t trainers = static_cast<size_t>(trainers_);
  for (size_t q = 0; q < sync.shared_rows.size(); ++q) {
    if (q + kAhead < sync.shared_rows.size()) {
      const uint32_t ahead = sync.shared_rows[q + kAhead];
      __builtin_prefetch(&gt.rows[ahead], 1);
      __builtin_prefetch(&gt.holder_slots[ahead * trainers]);
    }
    const uint32_t handle = sync.shared_rows[q];
    GlobalRow& g = gt.rows[handle];
    g.shared_iter = static_cast<int32_t>(i);
    g.shared_index = static_cast<int32_t>(q);
    const RowId row = base + static_cast<RowId>(g.id);
    const SlotId* slots = &gt.holder_slots[handle * trainers];
    for (uint64_t holders = g.holders; holders != 0; holders &= holders - 1) {
      const int h = std::countr_zero(holders);
      const SlotId slot = slots[h];
      // A toucher's position is in its Segment.
      int32_t own = -1;
      if ((g.touchers & Bit(h)) != 0) {
        own = wb.trainers[h].tables[table].first_unique +
              sync.touch_pos[static_cast<size_t>(g.touch_index) * trainers_ + h];
      }
      std::vector<SharedOut>& out = sync.shared[h];
      const int32_t local = static_cast<int32_t>(out.size());
      out.push_back({SharedRow{slot, row, own, false}, static_cast<int32_t>(q)});
      std::vector<int32_t>* const send = &sync.send[static_cast<size_t>(h) * trainers];
      std::vector<int32_t>* const recv = &sync.recv[static_cast<size_t>(h) * trainers];
      if (own >= 0) {
        for (uint64_t peers = g.holders & ~Bit(h); peers != 0; peers &= peers - 1) {
          send[std::countr_zero(peers)].push_back(local);
          ++sync.exchanged;
        }
      }
      for (uint64_t peers = g.touchers & ~Bit(h); peers != 0; peers &= peers - 1) {
        recv[std::countr_zero(peers)].push_back(local);
      }
    }
  }
}

void Planner::Impl::Assemble(int trainer, Iteration i) {
  TrainerSlice& slice = window(i).trainers[trainer];
  TrainerPlan& plan = slice.plan;
  plan.private_unique.clear();
  plan.shared.clear();
  // The per-peer lists of a recycled plan (SparePlanningBuffers) keep their capacity.
  std::vector<PeerExchange> spare = std::move(plan.peers);
  plan.peers.clear();
  slice.shared_flags.clear();
  if (options_.policy == CachePolicy::kOff) {
    caches_[trainer].off_resident.assign(plan.unique_slots.begin(), plan.unique_slots.end());
  }
  if (trainers_ == 1) {
    plan.private_unique.resize(plan.unique_rows.size());
    std::iota(plan.private_unique.begin(), plan.private_unique.end(), 0);
    return;
  }
  const size_t trainers = static_cast<size_t>(trainers_);
  const size_t first = static_cast<size_t>(trainer) * trainers;  // this trainer's (h, peer) lists
  // Sized once (the per-peer lists too, counted first): these lists hold up to a few hundred
  // thousand entries per iteration, and growing them reallocates fresh memory each time.
  size_t private_total = 0;
  size_t shared_total = 0;
  for (const TableSync& sync : sync_) {
    private_total += sync.private_rows[trainer].size();
    shared_total += sync.shared[trainer].size();
  }
  plan.private_unique.reserve(private_total);
  plan.shared.reserve(shared_total);
  slice.shared_flags.reserve(shared_total);
  for (int peer = 0; peer < trainers_; ++peer) {
    size_t send_count = 0;
    size_t recv_count = 0;
    for (const TableSync& sync : sync_) {
      send_count += sync.send[first + static_cast<size_t>(peer)].size();
      recv_count += sync.recv[first + static_cast<size_t>(peer)].size();
    }
    if (send_count == 0 && recv_count == 0) continue;
    PeerExchange exchange;
    if (!spare.empty()) {
      exchange = std::move(spare.back());
      spare.pop_back();
      exchange.send.clear();
      exchange.recv.clear();
    }
    exchange.peer = peer;
    exchange.send.reserve(send_count);
    exchange.recv.reserve(recv_count);
    plan.peers.push_back(std::move(exchange));
  }
  for (int tb = 0; tb < tracks_; ++tb) {
    const TableSync& sync = sync_[tb];
    const std::vector<int32_t>& private_rows = sync.private_rows[trainer];
    plan.private_unique.insert(plan.private_unique.end(), private_rows.begin(), private_rows.end());
    const int32_t offset = static_cast<int32_t>(plan.shared.size());
    for (const SharedOut& out : sync.shared[trainer]) {
      plan.shared.push_back(out.row);
      slice.shared_flags.emplace_back(tb, out.flag);
    }
    // Per peer, the table's lists follow the earlier tables', shifted past their shared rows.
    for (PeerExchange& exchange : plan.peers) {
      auto append = [offset](std::vector<int32_t>& to, const std::vector<int32_t>& from) {
        const size_t at = to.size();
        to.resize(at + from.size());
        for (size_t k = 0; k < from.size(); ++k) to[at + k] = offset + from[k];
      };
      append(exchange.send, sync.send[first + static_cast<size_t>(exchange.peer)]);
      append(exchange.recv, sync.recv[first + static_cast<size_t>(exchange.peer)]);
    }
  }
}

}  // namespace bagpipe
