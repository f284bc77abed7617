// Consistency phase of planning an iteration with several trainers (see planner.h,
// "Consistency", and planner_impl.h): write-back owners, flushes, fill stamps, shared and
// private rows; then the per-trainer sync lists.

#include <algorithm>
#include <bit>
#include <cstddef>
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
using oracle_internal::TrainerSlice;
using oracle_internal::UninitVector;
using oracle_internal::WindowBatch;

namespace {

uint64_t Bit(int trainer) { return uint64_t{1} << trainer; }

constexpr size_t kAhead = 16;  // records prefetched ahead in the hot loops
// WriteSync: entries ahead of each list's write cursor whose line is prefetched for writing
// (about 6 cache lines).
constexpr std::ptrdiff_t kSharedAhead = 16;  // 24-byte SharedRow
constexpr std::ptrdiff_t kListAhead = 96;    // 4-byte exchange list entries

// Sorts `pairs` by their first member, a row id in [0, rows) (least significant digit first,
// digits of up to 11 bits). The ids are distinct, so the order is std::sort's. Below
// kRadixMinPairs pairs std::sort is as quick (the bound is low enough for the digest test to
// reach the radix sort).
constexpr size_t kRadixMinPairs = 16;
void RadixSortById(int64_t rows, std::vector<std::pair<int64_t, int32_t>>& pairs,
                   std::vector<std::pair<int64_t, int32_t>>& scratch,
                   std::vector<uint32_t>& counts) {
  constexpr int kRadixBits = 11;
  const size_t n = pairs.size();
  if (n < kRadixMinPairs) {
    std::sort(pairs.begin(), pairs.end());
    return;
  }
  const int bits = std::bit_width(static_cast<uint64_t>(std::max<int64_t>(rows - 1, 1)));
  const int digits = (bits + kRadixBits - 1) / kRadixBits;
  const int digit_bits = (bits + digits - 1) / digits;
  const size_t buckets = size_t{1} << digit_bits;
  const uint64_t mask = buckets - 1;
  scratch.resize(n);
  counts.resize(buckets);
  std::pair<int64_t, int32_t>* from = pairs.data();
  std::pair<int64_t, int32_t>* to = scratch.data();
  for (int d = 0; d < digits; ++d) {
    const int shift = d * digit_bits;
    std::fill(counts.begin(), counts.end(), 0);
    for (size_t k = 0; k < n; ++k) ++counts[(static_cast<uint64_t>(from[k].first) >> shift) & mask];
    uint32_t sum = 0;
    for (uint32_t& c : counts) {
      const uint32_t here = c;
      c = sum;
      sum += here;
    }
    for (size_t k = 0; k < n; ++k) {
      to[counts[(static_cast<uint64_t>(from[k].first) >> shift) & mask]++] = from[k];
    }
    std::swap(from, to);
  }
  if (from != pairs.data()) pairs.swap(scratch);
}

}  // namespace

void Planner::Impl::MarkNow(Iteration i, int table, int32_t flag) {
  window(i).now[static_cast<size_t>(table)][static_cast<size_t>(flag)] = 1;
}

void Planner::Impl::Expire(int table, Iteration i) {
  GlobalTable& gt = globals_[table];
  const Iteration limit = i - horizon_;
  // Walked with iterators: indexing a deque of 24-byte entries divides by its block's entry count.
  const auto begin = gt.expiry.begin();
  auto end = begin;
  while (end != gt.expiry.end() && end->pushed < limit) ++end;
  // Records and index entries prefetched ahead: each is a miss, and the index entry is erased.
  auto ahead = begin;
  for (size_t k = 0; k < kAhead && ahead != end; ++k) ++ahead;
  for (auto it = begin; it != end; ++it) {
    if (ahead != end) {
      __builtin_prefetch(&gt.rows[ahead->handle]);
      gt.index.Prefetch(ahead->id);
      ++ahead;
    }
    const oracle_internal::Expiry& e = *it;
    const GlobalRow& g = gt.rows[e.handle];
    // The record may have been freed (and reused) since; it is forgotten only if nobody holds
    // it, its stamp is older than the horizon and it is still this row's.
    if (g.holders == 0 && !g.dirty && g.write_back < limit && gt.index.Find(e.id) == e.handle) {
      gt.index.Erase(e.id);
      gt.rows.Free(e.handle);
    }
  }
  gt.expiry.erase(begin, end);
}

void Planner::Impl::Merge(int table, Iteration i) {
  // Records whose stamps expire go first: a row nobody holds may be looked up below.
  Expire(table, i);
  TableSync& sync = sync_[table];
  GlobalTable& gt = globals_[table];
  WindowBatch& wb = window(i);
  const RowId base = table_offsets_[table];
  const size_t trainers = static_cast<size_t>(trainers_);
  size_t total = 0;
  for (const TrainerSlice& slice : wb.trainers) total += slice.tables[table].rows.size();
  oracle_internal::BatchDedup& dedup = sync.dedup;
  dedup.Reset(total);
  // Sized for every row distinct, written through pointers, cut to the merged count.
  sync.ids.resize(total);
  sync.touch_masks.resize(total);
  sync.hit_masks.resize(total);
  sync.handles.resize(total);
  sync.pos.resize(total * trainers);
  int64_t* const ids = sync.ids.data();
  uint64_t* const touch = sync.touch_masks.data();
  uint64_t* const hit = sync.hit_masks.data();
  uint32_t* const handles = sync.handles.data();
  int32_t* const pos = sync.pos.data();
  for (size_t t = 0; t < trainers; ++t) {
    const Segment& seg = wb.trainers[t].tables[table];
    const int32_t n = static_cast<int32_t>(seg.rows.size());
    sync.qpos[t].resize(static_cast<size_t>(n));
    int32_t* const qpos = sync.qpos[t].data();
    const RowId* const rows = seg.rows.data();
    const SlotId* const slots = seg.slots.data();
    const uint32_t* const globals = seg.globals.data();
    const uint64_t bit = Bit(static_cast<int>(t));
    for (int32_t p = 0; p < n; ++p) {
      // The dedup buckets are random accesses: most of Merge's time waited on them.
      if (p + static_cast<int32_t>(kAhead) < n) {
        dedup.Prefetch(static_cast<int64_t>(rows[p + static_cast<int32_t>(kAhead)] - base));
      }
      const int64_t id = static_cast<int64_t>(rows[p] - base);
      bool inserted;
      const int32_t q = dedup.Insert(id, &inserted);
      if (inserted) {
        ids[q] = id;
        touch[q] = 0;
        hit[q] = 0;
        handles[q] = kNoHandle;
      }
      touch[q] |= bit;
      pos[static_cast<size_t>(q) * trainers + t] = p;
      qpos[p] = q;
      // A resident row's GlobalRow is known (Link or Classify read it from the trainer's record).
      if (slots[p] != kNoSlot) {
        hit[q] |= bit;
        handles[q] = globals[p];
      }
    }
  }
  const size_t merged = static_cast<size_t>(dedup.size());
  sync.ids.resize(merged);
  sync.touch_masks.resize(merged);
  sync.hit_masks.resize(merged);
  sync.handles.resize(merged);
  sync.pos.resize(merged * trainers);
  // Rows no toucher holds: their GlobalRow, if any, through the index (prefetched ahead).
  UninitVector<int32_t>& unresolved = sync.unresolved;
  unresolved.resize(merged);
  size_t count = 0;
  for (size_t q = 0; q < merged; ++q) {
    unresolved[count] = static_cast<int32_t>(q);
    count += handles[q] == kNoHandle ? 1 : 0;
  }
  for (size_t k = 0; k < count; ++k) {
    if (k + kAhead < count) gt.index.Prefetch(ids[unresolved[k + kAhead]]);
    const int32_t q = unresolved[k];
    uint32_t& handle = gt.index.FindOrInsert(ids[q]);
    if (handle == kNoHandle) handle = gt.rows.Allocate();
    handles[q] = handle;
  }
  const size_t need = gt.rows.capacity() * trainers;
  if (gt.holder_slots.size() < need) {
    gt.holder_slots.resize(std::max(need, 2 * gt.holder_slots.size()), kNoSlot);
  }
}

void Planner::Impl::Consistency(int table, Iteration i) {
  TableSync& sync = sync_[table];
  sync.Reset();
  GlobalTable& gt = globals_[table];
  WindowBatch& wb = window(i);
  const size_t trainers = static_cast<size_t>(trainers_);
  const uint32_t* const handles = sync.handles.data();
  // The `now` flags of the previous iteration, set here for rows shared then (MarkNow without
  // its window lookup, a division, in the loops below). Only read when a row's shared_iter is
  // i - 1, which no row has at i = 0; iteration i - 1 is not released yet (emit lag >= 1).
  uint8_t* const now_prev = i > 0 ? window(i - 1).now[static_cast<size_t>(table)].data() : nullptr;

  // a. Evictions. Every evicting trainer leaves the row's holders (a row nobody holds any more
  // waits for its stamp to expire); then the lowest-id trainer evicting a row that nobody holds
  // writes it back if it is dirty.
  const RowId base = table_offsets_[table];
  for (int t = 0; t < trainers_; ++t) {
    const std::vector<oracle_internal::Victim>& victims = wb.trainers[t].tables[table].victims;
    const Extraction* const extract = wb.trainers[t].plan.extract.data();
    for (size_t v = 0; v < victims.size(); ++v) {
      if (v + kAhead < victims.size()) __builtin_prefetch(&gt.rows[victims[v + kAhead].global], 1);
      GlobalRow& g = gt.rows[victims[v].global];
      g.holders &= ~Bit(t);
      if (g.holders == 0) {
        const int64_t id = static_cast<int64_t>(extract[victims[v].extract].row - base);
        gt.expiry.push_back({i, victims[v].global, id});
      }
    }
  }
  for (int t = 0; t < trainers_; ++t) {
    TrainerPlan& plan = wb.trainers[t].plan;
    for (const oracle_internal::Victim& v : wb.trainers[t].tables[table].victims) {
      GlobalRow& g = gt.rows[v.global];
      if (g.holders == 0 && g.dirty) {
        plan.extract[static_cast<size_t>(v.extract)].write_back = true;
        g.write_back = static_cast<int32_t>(i);
        g.dirty = false;
        ++sync.write_backs;
      }
      if (g.shared_iter == i - 1) now_prev[g.shared_index] = 1;
    }
  }

  // b. Fills: flush rows another trainer holds dirty; stamp every fill.
  for (int t = 0; t < trainers_; ++t) {
    TrainerSlice& slice = wb.trainers[t];
    const Segment& seg = slice.tables[table];
    const int32_t* const qpos = sync.qpos[t].data();
    const int32_t* const misses = seg.misses.data();
    const size_t count = seg.misses.size();
    for (size_t j = 0; j < count; ++j) {
      if (j + 2 * kAhead < count) __builtin_prefetch(&handles[qpos[misses[j + 2 * kAhead]]]);
      if (j + kAhead < count) {
        const uint32_t ahead = handles[qpos[misses[j + kAhead]]];
        __builtin_prefetch(&gt.rows[ahead], 1);
        __builtin_prefetch(&gt.holder_slots[ahead * trainers + static_cast<size_t>(t)], 1);
      }
      const int32_t p = misses[j];
      const uint32_t handle = handles[qpos[p]];
      GlobalRow& g = gt.rows[handle];
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
            gt.holder_slots[static_cast<size_t>(handle) * trainers + static_cast<size_t>(owner)];
        sync.flushes.push_back({owner, at,
                                Extraction{owner_slot, seg.rows[p], /*evict=*/false,
                                           /*write_back=*/true}});
        g.write_back = static_cast<int32_t>(at);
        g.dirty = false;
        if (g.shared_iter == at - 1) MarkNow(at - 1, table, g.shared_index);
      }
      slice.plan.fills[static_cast<size_t>(seg.first_fill) + j].after_stamp =
          g.write_back >= i - horizon_ ? g.write_back : -1;
      g.holders |= Bit(t);
      gt.holder_slots[static_cast<size_t>(handle) * trainers + static_cast<size_t>(t)] =
          seg.slots[static_cast<size_t>(p)];
    }
  }

  // c. Touches, once per merged row: rows held since i - 1 and used now were shared at i - 1
  // "now"; every touched row is dirty; rows held (after the fills) by two trainers or more are
  // shared, the others private to their one toucher (touchers hold what they touch). The sync
  // lists are counted here and written by WriteSync.
  const size_t merged = sync.ids.size();
  const int64_t* const ids = sync.ids.data();
  const uint64_t* const touch = sync.touch_masks.data();
  const uint64_t* const hit = sync.hit_masks.data();
  sync.holder_masks.resize(merged);
  uint64_t* const holders = sync.holder_masks.data();
  wb.now[static_cast<size_t>(table)].assign(merged, 0);
  oracle_internal::MaskPairCounts& pairs = sync.pair_counts;
  pairs.Reset();
  for (size_t q = 0; q < merged; ++q) {
    if (q + kAhead < merged) __builtin_prefetch(&gt.rows[handles[q + kAhead]], 1);
    GlobalRow& g = gt.rows[handles[q]];
    if (hit[q] != 0 && g.shared_iter == i - 1) now_prev[g.shared_index] = 1;
    g.last_touch = static_cast<int32_t>(i);
    g.dirty = true;
    const uint64_t held = g.holders;
    holders[q] = held;
    // At least two holders (no POPCNT in the baseline instruction set).
    if ((held & (held - 1)) == 0) continue;
    g.shared_iter = static_cast<int32_t>(i);
    g.shared_index = static_cast<int32_t>(q);
    sync.shared_sorted.emplace_back(ids[q], static_cast<int32_t>(q));
    pairs.Add(touch[q], held);
  }
  // The sizes of the sync lists: every holder lists the row; every toucher sends it to every
  // other holder.
  sync.shared_counts.assign(trainers, 0);
  sync.send_counts.assign(trainers * trainers, 0);
  int32_t* const shared_counts = sync.shared_counts.data();
  int32_t* const send_counts = sync.send_counts.data();
  int64_t exchanged = 0;
  pairs.ForEach([&](uint64_t touched, uint64_t held, int64_t n) {
    const int32_t rows = static_cast<int32_t>(n);
    for (uint64_t h = held; h != 0; h &= h - 1) shared_counts[std::countr_zero(h)] += rows;
    for (uint64_t h = touched; h != 0; h &= h - 1) {
      const int sender = std::countr_zero(h);
      int32_t* const counts = send_counts + static_cast<size_t>(sender) * trainers;
      for (uint64_t peers = held & ~Bit(sender); peers != 0; peers &= peers - 1) {
        counts[std::countr_zero(peers)] += rows;
        exchanged += n;
      }
    }
  });
  sync.exchanged = exchanged;

  // d. The shared rows in RowId order. Row ids are distinct: ordering the (id, q) pairs by id
  // orders them (a radix sort on the id bits the table uses; a third of std::sort's
  // instructions at these sizes), and each row keeps its q without a lookup.
  RadixSortById(table_rows(table), sync.shared_sorted, sync.sort_scratch, sync.sort_counts);
  sync.shared_count = static_cast<int64_t>(sync.shared_sorted.size());
}

void Planner::Impl::WriteSync(int table, Iteration i) {
  TableSync& sync = sync_[table];
  GlobalTable& gt = globals_[table];
  WindowBatch& wb = window(i);
  const RowId base = table_offsets_[table];
  const size_t trainers = static_cast<size_t>(trainers_);
  // Write cursors into every holder's lists, from where this table's entries start.
  SharedRow* shared[oracle_internal::kMaxTrainers];
  int32_t local[oracle_internal::kMaxTrainers];
  int32_t first_unique[oracle_internal::kMaxTrainers];
  std::vector<int32_t*>& send = sync.send_cursors;
  std::vector<int32_t*>& recv = sync.recv_cursors;
  send.assign(trainers * trainers, nullptr);
  recv.assign(trainers * trainers, nullptr);
  for (size_t h = 0; h < trainers; ++h) {
    TrainerSlice& slice = wb.trainers[h];
    local[h] = sync.shared_first[h];
    shared[h] = slice.plan.shared.data() + local[h];
    first_unique[h] = slice.tables[table].first_unique;
    for (PeerExchange& exchange : slice.plan.peers) {
      const size_t at = h * trainers + static_cast<size_t>(exchange.peer);
      send[at] = exchange.send.data() + sync.send_first[at];
      recv[at] = exchange.recv.data() + sync.recv_first[at];
    }
  }
  const int32_t* const pos = sync.pos.data();
  const uint64_t* const touch = sync.touch_masks.data();
  const uint64_t* const holders = sync.holder_masks.data();
  const uint32_t* const handles = sync.handles.data();
  const std::pair<int64_t, int32_t>* const sorted = sync.shared_sorted.data();
  const size_t count = sync.shared_sorted.size();
  // The shared rows' q and holders in this order, for Release.
  wb.shared_q[static_cast<size_t>(table)].resize(count);
  wb.shared_holders[static_cast<size_t>(table)].resize(count);
  int32_t* const release_q = wb.shared_q[static_cast<size_t>(table)].data();
  uint64_t* const release_holders = wb.shared_holders[static_cast<size_t>(table)].data();
  int32_t at[oracle_internal::kMaxTrainers];  // each holder's index of the row in its list
  // Rows in id order visit their merged records (indexed by q) at random: those are
  // prefetched two distances ahead, the holders' slots (found through them) one.
  for (size_t s = 0; s < count; ++s) {
    if (s + 2 * kAhead < count) {
      const size_t q = static_cast<size_t>(sorted[s + 2 * kAhead].second);
      __builtin_prefetch(&handles[q]);
      __builtin_prefetch(&touch[q]);
      __builtin_prefetch(&holders[q]);
      __builtin_prefetch(&pos[q * trainers]);
    }
    if (s + kAhead < count) {
      __builtin_prefetch(&gt.holder_slots[handles[sorted[s + kAhead].second] * trainers]);
    }
    const auto [id, q] = sorted[s];
    const RowId row = base + static_cast<RowId>(id);
    const SlotId* const slots = &gt.holder_slots[handles[q] * trainers];
    const uint64_t held = holders[q];
    release_q[s] = q;
    release_holders[s] = held;
    // Every holder lists the row (the holders that do not touch it only apply the update)...
    for (uint64_t hs = held; hs != 0; hs &= hs - 1) {
      const int h = std::countr_zero(hs);
      // The lists are written as dozens of sequential streams at once, more than the hardware
      // prefetchers follow: each stream's lines are fetched for writing a few lines ahead.
      __builtin_prefetch(shared[h] + kSharedAhead, 1);
      *shared[h]++ = SharedRow{slots[h], row, -1, false};
      at[h] = local[h]++;
    }
    // ... and every toucher (a holder too) sends its gradient to every other holder, which
    // receives it.
    const int32_t* const row_pos = pos + static_cast<size_t>(q) * trainers;
    for (uint64_t ts = touch[q]; ts != 0; ts &= ts - 1) {
      const int t = std::countr_zero(ts);
      shared[t][-1].own_unique = first_unique[t] + row_pos[t];
      const int32_t sent = at[t];
      int32_t** const to = &send[static_cast<size_t>(t) * trainers];
      int32_t** const from = &recv[static_cast<size_t>(t)];
      for (uint64_t peers = held & ~Bit(t); peers != 0; peers &= peers - 1) {
        const int peer = std::countr_zero(peers);
        __builtin_prefetch(to[peer] + kListAhead, 1);
        __builtin_prefetch(from[static_cast<size_t>(peer) * trainers] + kListAhead, 1);
        *to[peer]++ = sent;
        *from[static_cast<size_t>(peer) * trainers]++ = at[peer];
      }
    }
  }
}

void Planner::Impl::Assemble(int trainer, Iteration i) {
  TrainerSlice& slice = window(i).trainers[trainer];
  TrainerPlan& plan = slice.plan;
  if (options_.policy == CachePolicy::kOff) {
    caches_[trainer].off_resident.assign(plan.unique_slots.begin(), plan.unique_slots.end());
  }
  if (trainers_ == 1) {
    plan.private_unique.resize(plan.unique_rows.size());
    std::iota(plan.private_unique.begin(), plan.private_unique.end(), 0);
    plan.shared.clear();
    plan.peers.clear();
    slice.shared_flags.clear();
    return;
  }
  if (options_.policy == CachePolicy::kDevice) {
    AssembleStaged(trainer, i);
    return;
  }
  const size_t trainers = static_cast<size_t>(trainers_);
  const uint64_t bit = Bit(trainer);
  // Private rows: the ones this trainer alone holds (it touches them), in table then Segment
  // order.
  plan.private_unique.resize(plan.unique_rows.size());
  int32_t* out = plan.private_unique.data();
  for (int tb = 0; tb < tracks_; ++tb) {
    const TableSync& sync = sync_[tb];
    const Segment& seg = slice.tables[tb];
    const int32_t* const qpos = sync.qpos[trainer].data();
    const uint64_t* const holders = sync.holder_masks.data();
    const int32_t n = static_cast<int32_t>(seg.rows.size());
    for (int32_t p = 0; p < n; ++p) {
      *out = seg.first_unique + p;
      out += holders[qpos[p]] == bit ? 1 : 0;
    }
  }
  plan.private_unique.resize(static_cast<size_t>(out - plan.private_unique.data()));
  // The sync lists: each table's entries follow the earlier tables' (WriteSync fills them in).
  int32_t shared_total = 0;
  std::vector<int32_t>& send_total = assemble_scratch_[static_cast<size_t>(trainer)];
  send_total.assign(2 * trainers, 0);
  int32_t* const recv_total = send_total.data() + trainers;
  const size_t first = static_cast<size_t>(trainer) * trainers;
  for (int tb = 0; tb < tracks_; ++tb) {
    TableSync& sync = sync_[tb];
    sync.shared_first[static_cast<size_t>(trainer)] = shared_total;
    shared_total += sync.shared_counts[static_cast<size_t>(trainer)];
    for (size_t peer = 0; peer < trainers; ++peer) {
      sync.send_first[first + peer] = send_total[peer];
      sync.recv_first[first + peer] = recv_total[peer];
      send_total[peer] += sync.send_counts[first + peer];
      recv_total[peer] += sync.send_counts[peer * trainers + static_cast<size_t>(trainer)];
    }
  }
  plan.shared.resize(static_cast<size_t>(shared_total));
  slice.shared_flags.clear();
  // The per-peer lists of a recycled plan (SparePlanningBuffers) keep their capacity.
  std::vector<PeerExchange> spare = std::move(plan.peers);
  plan.peers.clear();
  for (size_t peer = 0; peer < trainers; ++peer) {
    if (send_total[peer] == 0 && recv_total[peer] == 0) continue;
    PeerExchange exchange;
    if (!spare.empty()) {
      exchange = std::move(spare.back());
      spare.pop_back();
    }
    exchange.peer = static_cast<int>(peer);
    exchange.send.resize(static_cast<size_t>(send_total[peer]));
    exchange.recv.resize(static_cast<size_t>(recv_total[peer]));
    plan.peers.push_back(std::move(exchange));
  }
}

void Planner::Impl::AssembleStaged(int trainer, Iteration i) {
  TrainerSlice& slice = window(i).trainers[trainer];
  TrainerPlan& plan = slice.plan;
  // kDevice: every row a trainer touches is shared; nothing is private.
  plan.private_unique.clear();
  plan.shared.clear();
  std::vector<PeerExchange> spare = std::move(plan.peers);
  plan.peers.clear();
  slice.shared_flags.clear();
  const size_t trainers = static_cast<size_t>(trainers_);
  const size_t first = static_cast<size_t>(trainer) * trainers;  // this trainer's (h, peer) lists
  // Sized once (the per-peer lists too, counted first): these lists hold up to a few hundred
  // thousand entries per iteration, and growing them reallocates fresh memory each time.
  size_t shared_total = 0;
  for (const TableSync& sync : sync_) shared_total += sync.shared[trainer].size();
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
