// Internal: the state of the planner (oracle/planner.h) and the phases that plan an iteration.
//
// Layout of the state:
//  - The window: a ring of WindowBatch, one per iteration from the oldest unreleased one to the
//    newest pushed one. A window batch keeps, per trainer, the TrainerPlan under construction
//    (local batch, unique rows) and per table a Segment: the trainer's distinct rows of that
//    table in first-occurrence order; the distance from each row to its next occurrence on that
//    trainer is written into the TableTrack's next-use arena when the later batch enters.
//  - Per trainer a TrainerCache: per-slot state and per table a TableTrack (a RowTable of
//    24-byte TrainerRow records, the queue of evictable rows, the next-use buckets and
//    the next-use arena).
//  - With several trainers, per table a GlobalTable: the cross-trainer state of held and
//    recently written-back rows. With one trainer the write-back stamp lives in the TrainerRow
//    (the trainer is the only holder) and no global state is kept.
// Tracks: the planner works on tracks rather than tables. A track is a table, or one part of a
// table split by PlannerOptions::split_parts (planner.h); a split table's tracks are consecutive
// and its ids reach them through TableTrack::part_ids. Below, and in the phases' `table`
// arguments, "table" means track, except for the schema's tables (Validate, tables_, the plans'
// offsets).
// Everything TBB tasks touch in parallel is split by table or by trainer; the phases say which.
// Entering batch k:
//   Validate      (trainer, schema table)  offsets and ids; nothing changes before the batch is
//                                   good, but for a split table's ids sent to its tracks
//   Link          (trainer, table)  distinct rows (through the row records: a repeated id finds
//                                   its record with last_occ = k), unique_index, next-use
//                                   links, queue moves of revived rows (kDevice: Dedup)
// Planning iteration i:
//   Classify      (trainer, table)  hits and misses of D_t(i)
//   Merge         (table)           several trainers: the distinct rows of the table across the
//                                   trainers' segments, which trainers touch each and where,
//                                   and each row's GlobalRow (looked up once per row)
//   SelectVictims (trainer)         victims in eviction order, slots for the fills (how many
//                                   rows each queue gives up, from its live counts)
//   Evict         (trainer, table)  pops those rows from the table's queue
//   Apply         (trainer, table)  record updates, slot assignment, queue the rows of D_t(i);
//                                   with one trainer also write-back stamps and fill stamps
//   Consistency   (table)           several trainers: write-back owners, flushes, fill stamps;
//                                   one pass over the merged rows for touches, holders, shared
//                                   rows (ordered by id) and the sizes of the sync lists
//   Assemble      (trainer)         private rows; sizes the trainer's sync lists
//   WriteSync     (table)           several trainers: writes the shared rows and the exchange
//                                   lists straight into every holder's plan, and keeps each
//                                   shared row's q and holders for Release
// Releasing iteration i (per trainer, emit lag iterations after it is planned): sets the `now`
// flags of the shared rows, final by then, in every holder's plan. With several trainers the
// cross-trainer work thus grows with the distinct rows of the global batch, not with the sum over
// trainers of their distinct rows (most rows of a Criteo-like batch are touched by several
// trainers). The hot loops prefetch the records they will touch a few rows ahead: nearly every
// record access is a cache miss, and overlapping them is most of the planner's speed.
#ifndef BAGPIPE_ORACLE_PLANNER_IMPL_H_
#define BAGPIPE_ORACLE_PLANNER_IMPL_H_

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/types.h"
#include "data/batch.h"
#include "oracle/eviction_queue.h"
#include "oracle/huge_pages.h"
#include "oracle/plan.h"
#include "oracle/planner.h"
#include "oracle/row_store.h"
#include "oracle/uninit_vector.h"
#include "tbb/enumerable_thread_specific.h"

namespace bagpipe {
namespace oracle_internal {

// Dense tables up to this many rows (32-byte records: 32 KiB) stay in the caches; the loops over
// their records do not prefetch.
inline constexpr int64_t kDenseNoPrefetchRows = 1024;

// Bytes that hold every next-use distance in a window of `lookahead` batches (a distance is at
// most lookahead - 1).
inline int NextUseWidth(int lookahead) {
  if (lookahead <= 256) return 1;
  if (lookahead <= 65536) return 2;
  return 4;
}

// Next-use distances stored in `width` bytes (native byte order).
inline void StoreNextUse(uint8_t* at, int32_t distance, int width) {
  if (width == 1) {
    *at = static_cast<uint8_t>(distance);
  } else if (width == 2) {
    const uint16_t narrow = static_cast<uint16_t>(distance);
    std::memcpy(at, &narrow, sizeof(narrow));
  } else {
    std::memcpy(at, &distance, sizeof(distance));
  }
}

// PlannerOptions::split_parts at most.
inline constexpr int kMaxSplitParts = 64;
// PlannerOptions::num_trainers at most (trainer sets are 64-bit masks).
inline constexpr int kMaxTrainers = 64;

// The parallel passes over (trainer, table) pairs (Planner::Impl::ForEachTrainerTable).
enum class PlannerPass : int {
  kValidate,
  kLink,
  kCopy,
  kClassify,
  kEvict,
  kApply,
  kMerge,
  kConsistency,
  kWriteSync,
};
inline constexpr int kNumPlannerPasses = 9;

// How the tasks of one pass are handed out: `order` lists task indices longest first by
// `seconds`, a moving average of each task's measured durations (Planner::Impl::RunPass).
struct TaskSchedule {
  std::vector<float> seconds;
  std::vector<int> order;
};

// Segment::slots as Link leaves them, for a row not resident when its batch entered: the row
// occurs earlier in the window, so the planning of that occurrence decides its slot (Classify
// looks it up). kNoSlot there means the row is certainly a miss: nothing fills it before.
inline constexpr SlotId kPendingSlot = -2;

// A row evicted at the boundary being planned.
struct Victim {
  SlotId slot;
  uint32_t global;  // its GlobalRow (several trainers; filled by Apply)
  int32_t extract;  // index in the trainer's plan.extract (which names the row)
};

// A resident row with no use left in the window that a new batch uses again (Link): it leaves
// its eviction queue for the next-use bucket of that batch.
struct Revival {
  SlotId slot;
  int32_t last_occ;  // its last use, at which it entered its queue
  int32_t uses;      // kLfu: its use count (the queue it is in)
};

// One trainer's distinct rows of one table in one window batch.
struct Segment {
  UninitVector<RowId> rows;  // first-occurrence order
  // The distance from each row to its next occurrence on the trainer (0 = none) lives in the
  // TableTrack's next-use arena (Planner::Impl::NextUses).
  int64_t first_id = 0;      // index of the table's first id in the plan's unique_index
  int64_t id_count = 0;      // ids of the table in the shard
  int32_t first_unique = 0;  // index of rows[0] in the plan's unique_rows
  // The resident slot of each row (kNoSlot: a miss), final after Classify. Under kOracle and
  // kLru, for tables above PlannerOptions::capture_min_rows rows, Link already writes what it
  // sees when the batch enters: a resident row keeps its slot until it is used here unless it
  // is evicted as a row with a known next use (rare; TableTrack::stale lists those), so
  // Classify only looks up kPendingSlot rows (see above).
  UninitVector<SlotId> slots;
  // Several trainers: each resident row's GlobalRow (set by Classify, or by Link with the
  // slots; Merge reads it for the hits and looks up the others).
  UninitVector<uint32_t> globals;
  std::vector<int32_t> uses;     // kLfu: each row's use count including this use
  std::vector<int32_t> misses;   // positions of rows that are not resident
  std::vector<Victim> victims;   // rows of this table the trainer evicts
  UninitVector<int32_t> idle;    // positions of rows with no next use in the window (Apply)
  std::vector<Revival> revived;  // Link scratch, in id order
  // kOracle, kLru: the rows the table's queue gives up, as runs (first position in the
  // eviction order, count) in queue order; SelectVictims decides them and Evict pops them.
  std::vector<std::pair<int64_t, int64_t>> victim_runs;
  int32_t first_fill = 0;  // index of misses[0] in the plan's fills
};

struct TrainerSlice {
  TrainerPlan plan;
  std::vector<Segment> tables;
  // kDevice: per plan.shared entry, (table, index into WindowBatch::now[table]).
  std::vector<std::pair<int32_t, int32_t>> shared_flags;
};

struct WindowBatch {
  Iteration iteration = -1;
  int64_t ids = 0;
  double entry_seconds = 0;
  std::vector<TrainerSlice> trainers;
  // Per table, per shared row of this iteration (kDevice: by its index in the table's staged
  // rows; the other policies: by its merged row index q): exchange before i + 1.
  std::vector<std::vector<uint8_t>> now;
  // Several trainers but kDevice, per table (WriteSync): the shared rows in RowId order, each
  // as its q and its holders. Every holder's plan.shared lists the tables' shared rows in this
  // order, so Release sets their `now` by one walk over these lists, without a flag per entry.
  std::vector<UninitVector<int32_t>> shared_q;
  std::vector<UninitVector<uint64_t>> shared_holders;
};

// Per (trainer, table) record of a row that is resident, occurs in the window, or (one
// trainer) was written back within the horizon; kept in place in the table's RowTable.
struct TrainerRow {
  static constexpr int32_t kAbsent = std::numeric_limits<int32_t>::min();
  int32_t last_occ = kAbsent;  // latest window occurrence (iteration); kAbsent: not stored
  int32_t last_pos = 0;        // the row's position in the Segment of last_occ
  SlotId slot = kNoSlot;
  int32_t write_back = -1;  // one trainer: the latest write-back stamp (-1: none)
  // Several trainers: the row's GlobalRow while the trainer holds it (set at its fill; read only
  // for resident rows, whose GlobalRow is never freed).
  uint32_t global = kNoHandle;
  int32_t uses = 0;  // kLfu: planned uses since the start

  static TrainerRow Absent() { return TrainerRow{}; }
  bool present() const { return last_occ != kAbsent; }
};
static_assert(sizeof(TrainerRow) == 24);

struct TableTrack {
  RowTable<TrainerRow> rows;
  EvictionQueue lru;                     // kOracle, kLru: rows with no known next use
  std::map<int64_t, EvictionQueue> lfu;  // kLfu: by use count
  NextUseBuckets buckets;                // rows with a known next use
  // Next-use distances of the window's segments: window slot w owns entries
  // [w * next_stride, w * next_stride + its row count), each Planner::Impl::next_width_ bytes
  // (NextUseWidth). One huge-page array rather than a vector per segment: the links written when
  // a batch enters land at random in it, and the narrower the entries, the more of it the caches
  // hold (one byte an entry for L <= 256: a quarter of 4-byte entries).
  HugeVector<uint8_t> next;
  size_t next_stride = 0;
  // Tracks of a split table (Enter): the trainer's ids of the entering batch that fall in this
  // track, their positions in the table's ids of the shard, and Link's unique_index entries for
  // them (segment positions), which the copy after Link moves to their places.
  UninitVector<int64_t> part_ids;
  UninitVector<int32_t> part_pos;
  UninitVector<uint32_t> part_index;
  // One trainer: records of evicted rows waiting for their write-back stamp to expire.
  std::deque<std::pair<Iteration, int64_t>> expiry;  // (evicted at, row id)
  // Rows evicted while a known next use kept them in `buckets`: the window batches entered by
  // then may hold their old slot in Segment::slots (kOracle), up to the last of those batches.
  // Row id -> that batch; stale_order lists (batch, row id) in the order they were added.
  absl::flat_hash_map<int64_t, Iteration> stale;
  std::deque<std::pair<Iteration, int64_t>> stale_order;
};

struct TrainerCache {
  HugeVector<SlotState> slots;
  std::vector<SlotId> free_slots;  // stack
  int64_t resident = 0;
  std::vector<TableTrack> tables;
  std::vector<SlotId> off_resident;  // kOff: the slots filled at the last iteration
  // SelectVictims scratch: the slot of every fill, in fill order; a cursor per table into the
  // queue's live counts.
  std::vector<SlotId> fill_slots;
  std::vector<size_t> key_cursor;
};

// Cross-trainer state of a row (several trainers). Iterations fit in 31 bits (Planner::Enter).
// 32 bytes, two to a cache line (in a Slab large enough for huge pages, line-aligned, so that a
// record never straddles two lines): the passes over the rows of a batch read a record each, at
// random, and the denser the records, the more of them the caches hold. The row's id is not kept
// (the index maps it to its record, and the expiry entries name it).
struct GlobalRow {
  uint64_t holders = 0;
  int32_t last_touch = -1;
  int32_t write_back = -1;  // latest write-back stamp; -1 = none known
  // Latest iteration it was a shared row (never equal to i - 1 or g - 1 for a real iteration).
  int32_t shared_iter = std::numeric_limits<int32_t>::min();
  // Its index in WindowBatch::now[table] of shared_iter (kOracle, kLru, kLfu, kOff: its merged
  // row index, TableSync::ids, at that iteration).
  int32_t shared_index = 0;
  bool dirty = false;
  uint8_t padding[7] = {};
};
static_assert(sizeof(GlobalRow) == 32);

struct Expiry {
  Iteration pushed;
  uint32_t handle;
  int64_t id;
};

struct FlushOrder {
  int trainer;
  Iteration iteration;
  Extraction extraction;
};

struct SharedOut {
  SharedRow row;
  int32_t flag;  // index into WindowBatch::now[table]
};

// Counts the shared rows of one table and iteration by their (touchers, holders) pair: the
// sizes of the sync lists follow from these counts (a few distinct pairs) rather than from a
// count per holder and per (toucher, holder) of every row. Open addressing with generation tags
// (Reset is O(1)); grows to keep its load at most 1/2.
class MaskPairCounts {
 public:
  struct Entry {
    uint64_t touchers;
    uint64_t holders;
    int64_t count;
    uint32_t tag;
  };

  void Reset() {
    if (entries_.empty()) Resize(256);
    if (++tag_ == 0) {
      for (Entry& e : entries_) e.tag = 0;
      tag_ = 1;
    }
    used_.clear();
  }

  void Add(uint64_t touchers, uint64_t holders) {
    const uint64_t key = touchers * 0x9e3779b97f4a7c15ULL ^ holders;
    for (size_t b = HomeBucket(static_cast<int64_t>(key), shift_);; b = (b + 1) & mask_) {
      Entry& e = entries_[b];
      if (e.tag != tag_) {
        e = Entry{touchers, holders, 1, tag_};
        used_.push_back(static_cast<uint32_t>(b));
        if (2 * used_.size() > entries_.size()) Resize(2 * entries_.size());
        return;
      }
      if (e.touchers == touchers && e.holders == holders) {
        ++e.count;
        return;
      }
    }
  }

  // Calls f(touchers, holders, count) for every pair added since the last Reset.
  template <typename F>
  void ForEach(const F& f) const {
    for (uint32_t b : used_) f(entries_[b].touchers, entries_[b].holders, entries_[b].count);
  }

 private:
  void Resize(size_t size) {
    std::vector<Entry> old;
    old.swap(entries_);
    std::vector<uint32_t> used;
    used.swap(used_);
    entries_.assign(size, Entry{0, 0, 0, 0});
    mask_ = size - 1;
    shift_ = 64 - std::countr_zero(size);
    const uint32_t tag = tag_;
    tag_ = 1;
    for (uint32_t b : used) {
      const Entry& e = old[b];
      if (e.tag != tag) continue;
      const uint64_t key = e.touchers * 0x9e3779b97f4a7c15ULL ^ e.holders;
      for (size_t h = HomeBucket(static_cast<int64_t>(key), shift_);; h = (h + 1) & mask_) {
        if (entries_[h].tag != tag_) {
          entries_[h] = Entry{e.touchers, e.holders, e.count, tag_};
          used_.push_back(static_cast<uint32_t>(h));
          break;
        }
      }
    }
  }

  std::vector<Entry> entries_;
  std::vector<uint32_t> used_;  // buckets in use, in the order they were taken
  size_t mask_ = 0;
  int shift_ = 64;
  uint32_t tag_ = 0;
};

// Per table, per iteration state of the cross-trainer phases (several trainers). Merge,
// Consistency and WriteSync of the table write it; Assemble reads it.
struct TableSync {
  std::vector<FlushOrder> flushes;
  // The table's distinct rows at the iteration across trainers ("merged rows", in the order
  // Merge meets them: trainer by trainer, each in segment order), indexed by q:
  BatchDedup dedup;                     // row id -> q (kDevice: its own use)
  UninitVector<int64_t> ids;            // row id within the table
  UninitVector<uint64_t> touch_masks;   // trainers touching it
  UninitVector<uint64_t> hit_masks;     // touching trainers that held it before the fills
  UninitVector<uint32_t> handles;       // its GlobalRow
  UninitVector<uint64_t> holder_masks;  // trainers holding it after the fills (Consistency)
  // [q * trainers + t]: the row's position in t's Segment (valid where t touches it).
  UninitVector<int32_t> pos;
  std::vector<UninitVector<int32_t>> qpos;  // per trainer, per Segment position: its q
  UninitVector<int32_t> unresolved;         // Merge scratch: rows nobody holds
  // Shared rows (at least two holders), as (row id, q) in id order.
  std::vector<std::pair<int64_t, int32_t>> shared_sorted;
  // Scratch of their radix sort.
  std::vector<std::pair<int64_t, int32_t>> sort_scratch;
  std::vector<uint32_t> sort_counts;
  // Sizes of the sync lists (Consistency): per holder h, its shared rows here; per (h, peer) at
  // [h * trainers + peer], the rows h sends to the peer (= the rows the peer receives from h).
  MaskPairCounts pair_counts;
  std::vector<int32_t> shared_counts;
  std::vector<int32_t> send_counts;
  // Where this table's entries start in each holder's lists (Assemble): shared_first[h]; at
  // [h * trainers + peer], send_first and recv_first in the list of h's exchange with the peer.
  std::vector<int32_t> shared_first;
  std::vector<int32_t> send_first;
  std::vector<int32_t> recv_first;
  std::vector<int32_t*> send_cursors;  // WriteSync scratch, per (h, peer)
  std::vector<int32_t*> recv_cursors;
  // kDevice: per trainer, the table's staged shared rows and, per (h, peer), exchange lists (as
  // indices into shared[h]), which Assemble concatenates.
  std::vector<std::vector<SharedOut>> shared;
  std::vector<std::vector<int32_t>> send;
  std::vector<std::vector<int32_t>> recv;
  // kDevice scratch.
  std::vector<int32_t> order;
  std::vector<int32_t> rank;
  std::vector<int64_t> prev_ids;          // sorted shared ids of the previous iteration
  std::vector<std::vector<int32_t>> own;  // per trainer, per shared row: unique index or -1
  std::vector<std::vector<int32_t>> qs;   // per trainer, per unique row: its dedup position
  int64_t write_backs = 0;
  int64_t shared_count = 0;  // distinct shared rows
  int64_t exchanged = 0;

  // Clears the per-iteration outputs (keeps capacity and the kDevice history).
  void Reset() {
    flushes.clear();
    for (auto& v : shared) v.clear();
    for (auto& v : send) v.clear();
    for (auto& v : recv) v.clear();
    shared_sorted.clear();
    write_backs = 0;
    shared_count = 0;
    exchanged = 0;
  }
};

struct GlobalTable {
  RowIndex index;
  Slab<GlobalRow> rows;
  // The slot of each (row, holder): [handle * trainers + t], valid while t holds the row (set at
  // its fill). Lets the shared-row lists name every holder's slot without a random lookup in
  // each holder's row records.
  HugeVector<SlotId> holder_slots;
  std::deque<Expiry> expiry;
  std::vector<uint64_t> device_dirty;  // kDevice: bitmap of rows ever touched
};

}  // namespace oracle_internal

class Planner::Impl {
 public:
  explicit Impl(PlannerOptions options);
  absl::Status Init();

  absl::Status Push(Batch batch, Batch* spent);
  absl::Status Finish();
  absl::StatusOr<std::optional<std::vector<TrainerPlan>>> Pop();
  absl::StatusOr<std::vector<TrainerPlan>> Drain();
  void Recycle(std::vector<TrainerPlan> plans);
  PlannerStats stats() const;
  const PlannerOptions& options() const { return options_; }

 private:
  using WindowBatch = oracle_internal::WindowBatch;
  using Segment = oracle_internal::Segment;

  WindowBatch& window(Iteration i) { return window_[static_cast<size_t>(i % window_.size())]; }
  // The next-use distances of a trainer's segment of `table` in window batch `i`: entries of
  // next_width_ bytes.
  uint8_t* NextUses(oracle_internal::TableTrack& track, Iteration i) {
    return track.next.data() +
           static_cast<size_t>(i % window_.size()) * track.next_stride * next_width_;
  }
  // Makes room for a segment of `rows` rows in the next-use arena (keeps the live segments).
  void ReserveNextUses(int trainer, int table, size_t rows);
  // Link writes Segment::slots of `table` (see kPendingSlot): large tables, under the policies
  // whose Classify only needs slots.
  bool capture_slots(int table) const { return capture_[static_cast<size_t>(table)] != 0; }
  bool queued_policy() const {
    return options_.policy == CachePolicy::kOracle || options_.policy == CachePolicy::kLru ||
           options_.policy == CachePolicy::kLfu;
  }
  void Count(PlannerCounter counter, int64_t delta) {
    stats_.counters[static_cast<int>(counter)] += delta;
  }

  // planner.cc
  // Parallel passes. ForEachTrainerTable runs body(trainer, table) for every pair of `pass`;
  // workers take the pairs one at a time, longest first (longest-processing-time-first
  // scheduling, so that a few big tasks do not end up together at the end of one worker's
  // share): by the durations the same pass's tasks took in the previous iterations, measured
  // when more than one worker runs them (or model_workers > 0), else in table_order_ or `order`
  // (largest tables first). The order of the tasks never changes what they compute. ForEach
  // runs body(k) for k in [0, count). Both time their tasks for the model of
  // PlannerStats::modeled_seconds when options_.model_workers > 0.
  template <typename Body>
  void ForEachTrainerTable(oracle_internal::PlannerPass pass, int trainers, const Body& body) {
    ForEachTrainerTable(pass, trainers, table_order_, body);
  }
  template <typename Body>
  void ForEachTrainerTable(oracle_internal::PlannerPass pass, int trainers,
                           const std::vector<int>& order, const Body& body);
  template <typename Body>
  void ForEach(int count, const Body& body);
  template <typename Task>
  void RunPass(int count, const Task& task, oracle_internal::TaskSchedule* schedule = nullptr);
  absl::Status Enter(Batch& batch);
  // An empty plan for Enter, reusing a recycled plan's entry buffers when there is one.
  TrainerPlan SparePlan();
  // Gives the plans of iteration i recycled buffers for the lists filled while it is planned.
  void SparePlanningBuffers(Iteration i);
  template <typename Vector>
  void TakeSpare(int k, Vector& to, Vector& from, bool keep_contents);
  absl::Status Validate(int trainer, int table, const Batch& batch, Iteration iteration) const;
  // Sends the trainer's ids of split schema table `table` to its tracks (TableTrack::part_ids).
  void Partition(int trainer, int table, const Batch& batch);
  void Dedup(int trainer, int table, const Batch& batch, WindowBatch& wb);
  void Link(int trainer, int table, const Batch& batch, WindowBatch& wb);
  void BuildLocalBatch(Batch& batch, WindowBatch& wb);
  absl::Status PlanNext();
  // After Finish: plans and releases iterations until one is ready to pop or none is left.
  absl::Status PlanTail();
  void Release(Iteration i);
  TrainerPlan DrainPlan(int trainer) const;

  // planner_residency.cc
  void Classify(int trainer, int table, Iteration i);
  // Classify when Link has written the slots (capture_slots(table)).
  void ClassifyCaptured(int trainer, int table, Iteration i);
  // Returns false if the queues hold fewer victims than needed (an internal error).
  bool SelectVictims(int trainer, Iteration i);
  // Pops the queue victims SelectVictims assigned to `table` (kOracle, kLru); false if the queue
  // holds fewer than its live counts said (an internal error).
  bool Evict(int trainer, int table, Iteration i);
  void Apply(int trainer, int table, Iteration i);
  void Revive(oracle_internal::TrainerCache& cache, oracle_internal::TableTrack& track,
              const oracle_internal::Revival& row, Iteration next_use);
  void ExpireRecords(int table, Iteration i);
  std::vector<TrainerPlan> DrainCaches();

  // planner_consistency.cc (several trainers; Assemble for any number)
  void Merge(int table, Iteration i);
  void Consistency(int table, Iteration i);
  void Expire(int table, Iteration i);
  void MarkNow(Iteration i, int table, int32_t flag);
  void Assemble(int trainer, Iteration i);
  // kDevice: concatenates the tables' staged lists.
  void AssembleStaged(int trainer, Iteration i);
  void WriteSync(int table, Iteration i);

  // planner_device.cc
  void PlanDevice(int table, Iteration i);
  std::vector<TrainerPlan> DrainDevice();

  PlannerOptions options_;
  int trainers_ = 1;
  int tables_ = 0;  // the schema's
  int tracks_ = 0;
  std::vector<int> track_table_;        // per track: its schema table
  std::vector<int> table_first_track_;  // per schema table, and tables_: its first track
  int64_t table_rows(int track) const {
    return options_.schema.table_rows[static_cast<size_t>(track_table_[track])];
  }
  // The tracks of schema table `table`.
  int parts(int table) const { return table_first_track_[table + 1] - table_first_track_[table]; }
  bool split(int table) const { return parts(table) > 1; }
  int lookahead_ = 1;  // effective: options_.lookahead for kOracle, else 1
  // Bytes of a next-use distance (oracle_internal::NextUseWidth of lookahead_).
  int next_width_ = 4;
  int emit_lag_ = 2;
  int64_t horizon_ = kDefaultWritebackHorizon;
  int64_t capacity_ = 0;
  std::vector<RowId> table_offsets_;  // per track: its table's RowId offset
  // Schema tables by row count, largest first, and tracks by row count / parts: the order of
  // parallel work.
  std::vector<int> schema_order_;
  std::vector<int> table_order_;
  std::vector<uint8_t> capture_;  // per track: capture_slots

  std::vector<WindowBatch> window_;
  Iteration pushed_ = 0;        // batches entered
  Iteration next_plan_ = 0;     // first iteration not planned
  Iteration next_release_ = 0;  // first iteration not released
  bool finished_ = false;
  bool drained_ = false;
  absl::Status status_;  // sticky error
  std::deque<std::vector<TrainerPlan>> ready_;
  // Recycle()d plans: their entry buffers, for SparePlan, and their planning-time buffers, for
  // SparePlanningBuffers (planner.cc, ForEachEntryBuffer).
  std::vector<TrainerPlan> spare_entry_;
  std::vector<TrainerPlan> spare_planning_;
  // The largest size of each kind of reused plan buffer seen in a recycled plan.
  std::array<size_t, 10> spare_sizes_{};

  std::vector<oracle_internal::TrainerCache> caches_;
  std::vector<oracle_internal::GlobalTable> globals_;
  std::vector<oracle_internal::TableSync> sync_;
  // Assemble's scratch, per trainer.
  std::vector<std::vector<int32_t>> assemble_scratch_;
  tbb::enumerable_thread_specific<oracle_internal::BatchDedup> dedup_;
  // Classify's scratch: positions in a segment.
  tbb::enumerable_thread_specific<std::vector<int32_t>> positions_;

  PlannerStats stats_;
  // Per pass of ForEachTrainerTable: its tasks' measured durations and the order they are
  // handed out in.
  std::array<oracle_internal::TaskSchedule, oracle_internal::kNumPlannerPasses> schedules_;
  // options_.model_workers > 0: the durations of the current pass's tasks (in the order they
  // were handed out), and the sums over passes of their modeled makespans and of their longest
  // tasks.
  std::vector<double> task_seconds_;
  double modeled_pass_seconds_ = 0;
  double span_pass_seconds_ = 0;
};

}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_PLANNER_IMPL_H_
