#include "oracle/planner.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/excerpt.h"
#include "core/status.h"
#include "core/target_clones.h"
#include "core/timer.h"
#include "oracle/planner_impl.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

namespace bagpipe {

using oracle_internal::kNoHandle;
using oracle_internal::PlannerPass;
using oracle_internal::Segment;
using oracle_internal::TableTrack;
using oracle_internal::TrainerCache;
using oracle_internal::TrainerRow;
using oracle_internal::TrainerSlice;
using oracle_internal::WindowBatch;

namespace {

constexpr std::pair<std::string_view, CachePolicy> kPolicyNames[] = {
    {"oracle", CachePolicy::kOracle}, {"lru", CachePolicy::kLru},       {"lfu", CachePolicy::kLfu},
    {"off", CachePolicy::kOff},       {"device", CachePolicy::kDevice},
};

constexpr std::string_view kCounterNames[kNumPlannerCounters] = {
    "iterations",  "ids",     "unique_rows", "hits",           "misses",       "evictions",
    "write_backs", "flushes", "shared_rows", "exchanged_rows", "private_rows", "drain_write_backs",
};

constexpr std::string_view kPhaseNames[kNumPlannerPhases] = {
    "entry", "classify", "victims", "apply", "consistency", "assemble", "release",
};

// Batch validation scans (Validate). Each has a copy compiled for AVX2 (chosen at load time
// where the processor has it; the baseline build targets plain x86-64): they are most of a
// batch's checking, and it reads every id and offset.
//
// The OR over offsets[0, n) of offset | (next offset - offset): its sign bit is set iff an
// offset is negative or (all being non-negative, so the difference cannot wrap) decreases.
BAGPIPE_TARGET_CLONES("avx2", "default") uint64_t OffsetFlags(const int64_t* offsets, int64_t n) {
  uint64_t flags = 0;
  for (int64_t s = 0; s < n; ++s) {
    const uint64_t here = static_cast<uint64_t>(offsets[s]);
    flags |= here | (static_cast<uint64_t>(offsets[s + 1]) - here);
  }
  return flags;
}

// The OR over ids[0, n) of id | (rows - 1 - id): its sign bit is set iff an id is negative (its
// own sign bit) or at least `rows` (that of rows - 1 - id; ids and rows below 2^63).
BAGPIPE_TARGET_CLONES("avx2", "default")
uint64_t IdFlags(const int64_t* ids, int64_t n, uint64_t rows) {
  const uint64_t last = rows - 1;
  uint64_t flags = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t id = static_cast<uint64_t>(ids[j]);
    flags |= id | (last - id);
  }
  return flags;
}

// Revivals whose slot states Link prefetches ahead.
constexpr size_t kRevivalsAhead = 8;

// What SegmentLinker::First reads and writes besides the record. `rows`, `slots` (if capture) and
// `globals` (if capture and several) have room for every distinct row of the segment.
struct LinkSetup {
  const int64_t* ids;  // the segment's ids
  RowId base;
  int32_t k32;
  Iteration next_plan;  // rows used at or after it are in the window
  bool capture;
  bool several;
  bool revive;
  uint8_t* arena;
  size_t stride;
  int64_t k_slot;  // the window slot of iteration k32
  int64_t window_size;
  int width;
  RowId* rows;
  SlotId* slots;
  uint32_t* globals;
  std::vector<oracle_internal::Revival>* revived;
};

// Link's work on the first occurrence of a row in a segment, kept out of the loops over ids
// (most ids repeat a row seen earlier in the segment, and that path is a few instructions when
// the loop holds nothing else in its registers). kWidth: the next-use width, 0 for `width` at
// run time.
template <int kWidth>
class SegmentLinker {
 public:
  explicit SegmentLinker(const LinkSetup& setup) : s_(setup) {
    for (PendingLink& p : pending_) p = {sink_, 0};
  }

  // The first occurrence in the segment of its j-th id, whose record is `row` (absent iff
  // !row.present()): appends the row, links its previous occurrence in the window to this one,
  // and returns its position in the segment.
  __attribute__((noinline)) int32_t First(int64_t j, TrainerRow& row) {
    const int32_t pos = distinct_++;
    s_.rows[pos] = s_.base + static_cast<RowId>(s_.ids[j]);
    const bool in_window = row.last_occ >= s_.next_plan;
    if (s_.capture) {
      s_.slots[pos] =
          row.slot != kNoSlot ? row.slot : (in_window ? oracle_internal::kPendingSlot : kNoSlot);
      if (s_.several) s_.globals[pos] = row.global;
    }
    if (in_window) {
      // The window slot of last_occ, without a division: k - last_occ < window size.
      int64_t w = s_.k_slot - (s_.k32 - row.last_occ);
      if (w < 0) w += s_.window_size;
      uint8_t* const at = s_.arena + (static_cast<size_t>(w) * s_.stride + row.last_pos) * width();
      Link(at, s_.k32 - row.last_occ);
    } else if (s_.revive && row.slot != kNoSlot) {
      Revive(row);
    }
    row.last_occ = s_.k32;
    row.last_pos = pos;
    return pos;
  }

  // Stores the links still waiting; returns the segment's row count.
  int32_t Finish() {
    for (uint32_t d = 0; d < kDelay; ++d) {
      const PendingLink& p = pending_[(head_ + d) % kDelay];
      oracle_internal::StoreNextUse(p.at, p.distance, width());
    }
    return distinct_;
  }

 private:
  // Next-use links land at random in the arena: each store waits in a ring of kDelay links while
  // its line is prefetched for writing, so that the loop does not wait for the misses. The ring
  // starts full of links into a sink, so that every link stores the one it replaces.
  static constexpr uint32_t kDelay = 16;
  struct PendingLink {
    uint8_t* at;
    int32_t distance;
  };

  int width() const { return kWidth != 0 ? kWidth : s_.width; }
  // Rare (a resident row back in the window), and apart so that First needs few registers.
  __attribute__((noinline, cold)) void Revive(const TrainerRow& row) {
    s_.revived->push_back({row.slot, row.last_occ, row.uses});
  }
  void Link(uint8_t* at, int32_t distance) {
    __builtin_prefetch(at, 1);
    PendingLink& p = pending_[head_++ % kDelay];
    oracle_internal::StoreNextUse(p.at, p.distance, width());
    p = {at, distance};
  }

  const LinkSetup s_;
  int32_t distinct_ = 0;
  uint32_t head_ = 0;
  PendingLink pending_[kDelay];
  alignas(4) uint8_t sink_[4];
};

// The makespan of tasks of the given durations handed out in order to `workers` workers, each
// taking the next task when it is free (how ForEachTrainerTable's workers take them).
double ListScheduleMakespan(const std::vector<double>& task_seconds, int workers) {
  std::vector<double> free_at(static_cast<size_t>(std::max(workers, 1)), 0.0);
  for (const double seconds : task_seconds) {
    const auto first_free = std::min_element(free_at.begin(), free_at.end());
    *first_free += seconds;
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace

absl::StatusOr<CachePolicy> ParseCachePolicy(std::string_view name) {
  for (const auto& [text, policy] : kPolicyNames) {
    if (name == text) return policy;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cache policy \"", Excerpt(absl::string_view(name.data(), name.size())),
                   "\"; expected one of: oracle, lru, lfu, off, device"));
}

std::string_view CachePolicyName(CachePolicy policy) {
  for (const auto& [text, p] : kPolicyNames) {
    if (p == policy) return text;
  }
  return "unknown";
}

std::string_view PlannerCounterName(PlannerCounter counter) {
  const int k = static_cast<int>(counter);
  return k >= 0 && k < kNumPlannerCounters ? kCounterNames[k] : "unknown";
}

std::string_view PlannerPhaseName(PlannerPhase phase) {
  const int k = static_cast<int>(phase);
  return k >= 0 && k < kNumPlannerPhases ? kPhaseNames[k] : "unknown";
}

double PlannerStats::mean_iteration_ms() const {
  const int64_t iterations = (*this)[PlannerCounter::kIterations];
  return iterations > 0 ? (entry_seconds + plan_seconds) * 1e3 / static_cast<double>(iterations)
                        : 0.0;
}

double PlannerStats::modeled_iteration_ms() const {
  const int64_t iterations = (*this)[PlannerCounter::kIterations];
  return iterations > 0 ? modeled_seconds * 1e3 / static_cast<double>(iterations) : 0.0;
}

double PlannerStats::span_iteration_ms() const {
  const int64_t iterations = (*this)[PlannerCounter::kIterations];
  return iterations > 0 ? span_seconds * 1e3 / static_cast<double>(iterations) : 0.0;
}

nlohmann::json PlannerStats::ToJson() const {
  nlohmann::json json = nlohmann::json::object();
  for (int k = 0; k < kNumPlannerCounters; ++k) {
    json[std::string(kCounterNames[k])] = counters[k];
  }
  const int64_t unique = (*this)[PlannerCounter::kUniqueRows];
  json["hit_rate"] =
      unique > 0 ? static_cast<double>((*this)[PlannerCounter::kHits]) / unique : 0.0;
  json["entry_seconds"] = entry_seconds;
  json["plan_seconds"] = plan_seconds;
  json["mean_iteration_ms"] = mean_iteration_ms();
  json["max_iteration_ms"] = max_iteration_ms;
  json["pass_seconds"] = pass_seconds;
  json["modeled_seconds"] = modeled_seconds;
  json["span_seconds"] = span_seconds;
  nlohmann::json phases = nlohmann::json::object();
  for (int k = 0; k < kNumPlannerPhases; ++k)
    phases[std::string(kPhaseNames[k])] = phase_seconds[k];
  json["phase_seconds"] = std::move(phases);
  json["tracked_rows"] = tracked_rows;
  json["global_rows"] = global_rows;
  json["resident_rows"] = resident_rows;
  return json;
}

Planner::Impl::Impl(PlannerOptions options) : options_(std::move(options)) {}

template <typename Body>
void Planner::Impl::ForEachTrainerTable(oracle_internal::PlannerPass pass, int trainers,
                                        const std::vector<int>& tables, const Body& body) {
  const int count = trainers * static_cast<int>(tables.size());
  RunPass(
      count, [&](int k) { body(k % trainers, tables[static_cast<size_t>(k / trainers)]); },
      &schedules_[static_cast<size_t>(pass)]);
}

template <typename Body>
void Planner::Impl::ForEach(int count, const Body& body) {
  RunPass(count, body);
}

template <typename Task>
void Planner::Impl::RunPass(int count, const Task& task, oracle_internal::TaskSchedule* schedule) {
  const bool modeled = options_.model_workers > 0;
  const int workers = std::min(count, tbb::this_task_arena::max_concurrency());
  // Tasks are timed for the model, and to order them when several workers share them.
  const bool learn = schedule != nullptr && (workers > 1 || modeled);
  const int* order = nullptr;
  if (learn) {
    if (schedule->seconds.size() != static_cast<size_t>(count)) {
      schedule->seconds.assign(static_cast<size_t>(count), 0.0f);
      schedule->order.resize(static_cast<size_t>(count));
      std::iota(schedule->order.begin(), schedule->order.end(), 0);
    }
    order = schedule->order.data();
  }
  const bool timed = modeled || learn;
  Stopwatch wall;
  if (modeled) task_seconds_.assign(static_cast<size_t>(count), 0.0);
  std::atomic<int> next{0};
  tbb::parallel_for(0, workers, [&](int) {
    for (int at = next.fetch_add(1, std::memory_order_relaxed); at < count;
         at = next.fetch_add(1, std::memory_order_relaxed)) {
      const int k = order != nullptr ? order[at] : at;
      if (!timed) {
        task(k);
        continue;
      }
      Stopwatch watch;
      task(k);
      const double seconds = watch.Seconds();
      if (modeled) task_seconds_[static_cast<size_t>(at)] = seconds;
      if (learn) {
        float& average = schedule->seconds[static_cast<size_t>(k)];
        average = 0.5f * average + 0.5f * static_cast<float>(seconds);
      }
    }
  });
  if (learn) {
    // Longest first; ties (and tasks not yet measured) keep the static order.
    const float* seconds = schedule->seconds.data();
    std::iota(schedule->order.begin(), schedule->order.end(), 0);
    std::stable_sort(schedule->order.begin(), schedule->order.end(),
                     [&](int a, int b) { return seconds[a] > seconds[b]; });
  }
  if (!modeled) return;
  stats_.pass_seconds += wall.Seconds();
  modeled_pass_seconds_ += ListScheduleMakespan(task_seconds_, options_.model_workers);
  span_pass_seconds_ +=
      count > 0 ? *std::max_element(task_seconds_.begin(), task_seconds_.end()) : 0.0;
}

absl::Status Planner::Impl::Init() {
  const PlannerOptions& o = options_;
  if (o.num_trainers < 1 || o.num_trainers > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_trainers must be in [1, 64], got ", o.num_trainers));
  }
  if (o.lookahead < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lookahead must be >= 1, got ", o.lookahead));
  }
  if (o.emit_lag < 1) {
    return absl::InvalidArgumentError(absl::StrCat("emit_lag must be >= 1, got ", o.emit_lag));
  }
  if (o.writeback_horizon < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("writeback_horizon must be >= 0 (0 = default), got ", o.writeback_horizon));
  }
  if (o.model_workers < 0 || o.model_workers > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_workers must be in [0, 4096] (0 = off), got ", o.model_workers));
  }
  if (o.split_parts < 1 || o.split_parts > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("split_parts must be in [1, 64] (1 = no splitting), got ", o.split_parts));
  }
  if (o.split_min_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split_min_rows must be >= 0, got ", o.split_min_rows));
  }
  if (o.schema.num_tables() < 1 ||
      o.schema.table_rows.size() != static_cast<size_t>(o.schema.num_tables())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the schema needs at least one table and one row count per table (", o.schema.num_tables(),
        " tables, ", o.schema.table_rows.size(), " row counts)"));
  }
  if (o.schema.num_tables() > std::numeric_limits<int16_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", std::numeric_limits<int16_t>::max(),
                                                   " tables, got ", o.schema.num_tables()));
  }
  RETURN_IF_ERROR(o.schema.CheckRowCounts(0));
  constexpr int64_t kMaxSlots = std::numeric_limits<SlotId>::max();
  if (o.policy == CachePolicy::kDevice) {
    if (o.schema.TotalRows() > kMaxSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("device mode uses RowIds as slots; ", o.schema.TotalRows(),
                       " rows exceed the slot range (", kMaxSlots, ")"));
    }
    capacity_ = o.schema.TotalRows();
  } else {
    if (o.capacity < 1 || o.capacity > kMaxSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("cache capacity must be in [1, ", kMaxSlots, "] rows, got ", o.capacity));
    }
    capacity_ = o.capacity;
  }

  trainers_ = o.num_trainers;
  tables_ = o.schema.num_tables();
  lookahead_ = o.policy == CachePolicy::kOracle ? o.lookahead : 1;
  next_width_ = oracle_internal::NextUseWidth(lookahead_);
  emit_lag_ = o.emit_lag;
  horizon_ = o.writeback_horizon > 0 ? o.writeback_horizon : kDefaultWritebackHorizon;
  const bool splitting = trainers_ == 1 && o.policy != CachePolicy::kDevice && o.split_parts > 1;
  const std::vector<RowId> offsets = o.schema.TableOffsets();
  table_first_track_.assign(1, 0);
  for (int t = 0; t < tables_; ++t) {
    const int64_t rows = o.schema.table_rows[t];
    const int parts = splitting && rows > o.split_min_rows ? o.split_parts : 1;
    for (int p = 0; p < parts; ++p) {
      track_table_.push_back(t);
      table_offsets_.push_back(offsets[t]);
    }
    table_first_track_.push_back(static_cast<int>(track_table_.size()));
  }
  tracks_ = static_cast<int>(track_table_.size());
  if (tracks_ > std::numeric_limits<int16_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", std::numeric_limits<int16_t>::max(),
                                                   " tables and parts, got ", tracks_,
                                                   " (lower split_parts)"));
  }
  // The order of the passes' tasks until their durations are measured (RunPass): by rows, shared
  // among a table's parts.
  auto track_weight = [&](int track) { return table_rows(track) / parts(track_table_[track]); };
  schema_order_.resize(static_cast<size_t>(tables_));
  std::iota(schema_order_.begin(), schema_order_.end(), 0);
  std::stable_sort(schema_order_.begin(), schema_order_.end(),
                   [&](int a, int b) { return o.schema.table_rows[a] > o.schema.table_rows[b]; });
  table_order_.resize(static_cast<size_t>(tracks_));
  std::iota(table_order_.begin(), table_order_.end(), 0);
  std::stable_sort(table_order_.begin(), table_order_.end(),
                   [&](int a, int b) { return track_weight(a) > track_weight(b); });
  capture_.resize(static_cast<size_t>(tracks_));
  for (int t = 0; t < tracks_; ++t) {
    capture_[t] = (o.policy == CachePolicy::kOracle || o.policy == CachePolicy::kLru) &&
                  table_rows(t) > o.capture_min_rows;
  }

  window_.resize(static_cast<size_t>(lookahead_ + emit_lag_ + 2));
  for (WindowBatch& wb : window_) {
    wb.trainers.resize(trainers_);
    for (TrainerSlice& slice : wb.trainers) slice.tables.resize(tracks_);
    wb.now.resize(tracks_);
    wb.shared_q.resize(tracks_);
    wb.shared_holders.resize(tracks_);
  }
  if (o.policy != CachePolicy::kDevice) {
    caches_.resize(trainers_);
    // A cache never holds more rows than the tables have: larger capacities need no more slots.
    const size_t cap = static_cast<size_t>(
        std::min<int64_t>(capacity_, std::max<int64_t>(1, o.schema.TotalRows())));
    // Hashed row tables start with room for their share of twice the capacity (the resident
    // rows plus about as many rows of the window), split in proportion to how many rows each
    // could hold (planner.h): growing a large table mid-stream rehashes it into fresh memory, a
    // stall of tens of milliseconds on one iteration.
    std::vector<int64_t> reserve(static_cast<size_t>(tracks_), 0);
    double weights = 0;
    for (int t = 0; t < tracks_; ++t) {
      if (table_rows(t) <= o.dense_index_max_rows) continue;
      reserve[t] = std::min<int64_t>(table_rows(t), capacity_) / parts(track_table_[t]);
      weights += static_cast<double>(reserve[t]);
    }
    for (int64_t& r : reserve) {
      r = std::min<int64_t>(
          r, static_cast<int64_t>(2.0 * static_cast<double>(capacity_) * static_cast<double>(r) /
                                  std::max(weights, 1.0)));
    }
    for (TrainerCache& c : caches_) {
      c.slots.resize(cap);
      c.free_slots.resize(cap);
      for (size_t s = 0; s < cap; ++s) c.free_slots[s] = static_cast<SlotId>(cap - 1 - s);
      c.tables.resize(tracks_);
      for (int t = 0; t < tracks_; ++t) {
        TableTrack& track = c.tables[t];
        track.rows.Init(table_rows(t), o.dense_index_max_rows);
        track.rows.Reserve(static_cast<size_t>(reserve[t]));
        track.buckets.Init(lookahead_ + 1);
      }
    }
  }
  globals_.resize(tracks_);
  for (int t = 0; t < tracks_; ++t) {
    if (o.policy == CachePolicy::kDevice) {
      globals_[t].device_dirty.assign(static_cast<size_t>(table_rows(t) + 63) / 64, 0);
    } else if (trainers_ > 1) {
      globals_[t].index.Init(table_rows(t), o.dense_index_max_rows);
    }
  }
  sync_.resize(tracks_);
  for (oracle_internal::TableSync& s : sync_) {
    s.qpos.resize(trainers_);
    s.shared_first.resize(trainers_);
    s.send_first.resize(static_cast<size_t>(trainers_ * trainers_));
    s.recv_first.resize(static_cast<size_t>(trainers_ * trainers_));
    if (o.policy == CachePolicy::kDevice) {
      s.shared.resize(trainers_);
      s.send.resize(static_cast<size_t>(trainers_ * trainers_));
      s.recv.resize(static_cast<size_t>(trainers_ * trainers_));
      s.own.resize(trainers_);
      s.qs.resize(trainers_);
    }
  }
  assemble_scratch_.resize(trainers_);
  return absl::OkStatus();
}

absl::Status Planner::Impl::Push(Batch batch, Batch* spent) {
  RETURN_IF_ERROR(status_);
  if (finished_) return absl::FailedPreconditionError("Planner::Push after Finish");
  absl::Status status = Enter(batch);
  if (spent != nullptr) {
    batch.Reset(batch.num_dense, batch.num_tables);
    *spent = std::move(batch);
  }
  while (status.ok() && next_plan_ + lookahead_ <= pushed_) status = PlanNext();
  status_ = status;
  return status;
}

absl::Status Planner::Impl::Finish() {
  RETURN_IF_ERROR(status_);
  if (finished_) return absl::FailedPreconditionError("Planner::Finish called twice");
  finished_ = true;
  return absl::OkStatus();
}

absl::Status Planner::Impl::PlanTail() {
  // One iteration at a time, as Pop needs them: planning the whole window's tail at once would
  // hold a window of plans and keep the trainers waiting until the last one is planned.
  while (ready_.empty() && next_plan_ < pushed_) {
    status_ = PlanNext();
    RETURN_IF_ERROR(status_);
  }
  if (!ready_.empty() || next_release_ == next_plan_) return absl::OkStatus();
  // Every iteration is planned; the last ones wait for their release.
  if (next_plan_ > 0) {
    // The Drain plans extract every row at the boundary after the last iteration.
    for (std::vector<uint8_t>& flags : window(next_plan_ - 1).now) {
      std::fill(flags.begin(), flags.end(), 1);
    }
  }
  // Releasing is planning work (Release runs parallel passes, which count in pass_seconds).
  Stopwatch watch;
  while (next_release_ < next_plan_) Release(next_release_++);
  const double seconds = watch.Seconds();
  stats_.plan_seconds += seconds;
  stats_.phase_seconds[static_cast<int>(PlannerPhase::kRelease)] += seconds;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::vector<TrainerPlan>>> Planner::Impl::Pop() {
  RETURN_IF_ERROR(status_);
  if (finished_) RETURN_IF_ERROR(PlanTail());
  if (ready_.empty()) return std::optional<std::vector<TrainerPlan>>();
  std::vector<TrainerPlan> plans = std::move(ready_.front());
  ready_.pop_front();
  return std::optional<std::vector<TrainerPlan>>(std::move(plans));
}

namespace {

// The plan buffers that recycling reuses, in two groups: those Enter fills when a batch enters
// the window, and those filled when the iteration is planned, L iterations later. The groups
// are recycled separately: a buffer taken at entry only comes back after the whole window has
// passed, by which time the planning-time ones (whose sizes grow while the caches fill) would
// be long outgrown.
// Calls f(k, to_buffer, from_buffer) for the buffers of one group, k indexing
// Planner::Impl::spare_sizes_. A field added to TrainerPlan later starts fresh unless it is
// listed here.
template <typename F>
void ForEachEntryBuffer(TrainerPlan& to, TrainerPlan& from, const F& f) {
  f(0, to.labels, from.labels);
  f(1, to.dense, from.dense);
  f(2, to.offsets, from.offsets);
  f(3, to.unique_index, from.unique_index);
  f(4, to.unique_rows, from.unique_rows);
  f(5, to.unique_slots, from.unique_slots);
}
template <typename F>
void ForEachPlanningBuffer(TrainerPlan& to, TrainerPlan& from, const F& f) {
  f(6, to.extract, from.extract);
  f(7, to.fills, from.fills);
  f(8, to.private_unique, from.private_unique);
  f(9, to.shared, from.shared);
}

}  // namespace

void Planner::Impl::Recycle(std::vector<TrainerPlan> plans) {
  // Enough for the next iteration or two; more would only hold memory.
  const size_t keep = 2 * static_cast<size_t>(trainers_);
  for (TrainerPlan& plan : plans) {
    auto track = [&](int k, auto& buffer, auto&) {
      spare_sizes_[k] = std::max(spare_sizes_[k], buffer.size());
    };
    ForEachEntryBuffer(plan, plan, track);
    ForEachPlanningBuffer(plan, plan, track);
    if (spare_planning_.size() < keep) {
      TrainerPlan shell;
      ForEachPlanningBuffer(shell, plan, [](int, auto& to, auto& from) { to.swap(from); });
      shell.peers.swap(plan.peers);  // Assemble reuses their lists
      spare_planning_.push_back(std::move(shell));
    }
    if (spare_entry_.size() < keep) spare_entry_.push_back(std::move(plan));
  }
}

template <typename Vector>
void Planner::Impl::TakeSpare(int k, Vector& to, Vector& from, bool keep_contents) {
  // Room for an eighth more than the largest recycled buffer of its kind held: sizes vary from
  // batch to batch, and a buffer that is outgrown reallocates, which is the cost recycling
  // avoids. A buffer that needs more room is emptied first (nothing to copy).
  const size_t largest = spare_sizes_[k];
  if (from.capacity() < largest + largest / 8) {
    from.clear();
    from.reserve(largest + largest / 4);
  }
  if (!keep_contents) from.clear();
  to.swap(from);
}

TrainerPlan Planner::Impl::SparePlan() {
  TrainerPlan plan;
  if (spare_entry_.empty()) return plan;
  ForEachEntryBuffer(plan, spare_entry_.back(), [&](int k, auto& to, auto& from) {
    // unique_index, unique_rows, unique_slots and offsets keep their size and contents: Enter
    // resizes them and every element is written before the plan is released (ids by Link or
    // Dedup, rows by Enter, slots by Apply or PlanDevice, offsets by BuildLocalBatch or from the
    // batch), so only growth is zero-filled. Without local batches unique_index and offsets stay
    // empty.
    const bool overwritten = k == 4 || k == 5 || ((k == 2 || k == 3) && options_.build_batch);
    TakeSpare(k, to, from, overwritten);
  });
  spare_entry_.pop_back();
  return plan;
}

void Planner::Impl::SparePlanningBuffers(Iteration i) {
  for (TrainerSlice& slice : window(i).trainers) {
    if (spare_planning_.empty()) return;
    // fills (but under kDevice, which has none), private_unique and shared keep their size and
    // contents: they are resized when planned and every element is written (fills by Apply, the
    // others by Assemble or WriteSync), so only growth is zero-filled; extract is appended to.
    const bool device = options_.policy == CachePolicy::kDevice;
    ForEachPlanningBuffer(slice.plan, spare_planning_.back(), [&](int k, auto& to, auto& from) {
      TakeSpare(k, to, from, k == 8 || k == 9 || (k == 7 && !device));
    });
    slice.plan.peers.swap(spare_planning_.back().peers);
    spare_planning_.pop_back();
  }
}

absl::StatusOr<std::vector<TrainerPlan>> Planner::Impl::Drain() {
  RETURN_IF_ERROR(status_);
  if (!finished_ || !ready_.empty() || next_release_ < pushed_) {
    return absl::FailedPreconditionError(
        "Planner::Drain needs Finish() and every iteration popped first");
  }
  if (drained_) return absl::FailedPreconditionError("Planner::Drain called twice");
  drained_ = true;
  return options_.policy == CachePolicy::kDevice ? DrainDevice() : DrainCaches();
}

PlannerStats Planner::Impl::stats() const {
  PlannerStats stats = stats_;
  stats.tracked_rows = 0;
  stats.resident_rows = 0;
  for (const TrainerCache& c : caches_) {
    stats.resident_rows += c.resident;
    for (const TableTrack& track : c.tables) stats.tracked_rows += track.rows.size();
  }
  stats.global_rows = 0;
  for (const oracle_internal::GlobalTable& g : globals_) stats.global_rows += g.rows.live();
  if (options_.policy == CachePolicy::kDevice) stats.resident_rows = capacity_ * trainers_;
  if (options_.model_workers > 0) {
    const double serial = stats.entry_seconds + stats.plan_seconds - stats.pass_seconds;
    stats.modeled_seconds = serial + modeled_pass_seconds_;
    stats.span_seconds = serial + span_pass_seconds_;
  }
  return stats;
}

absl::Status Planner::Impl::Enter(Batch& batch) {
  const Iteration k = pushed_;
  const std::string where = absl::StrCat("batch ", k, " (first sample ", batch.first_sample, ")");
  if (k >= std::numeric_limits<int32_t>::max() - lookahead_ - emit_lag_ - 2) {
    return absl::OutOfRangeError(absl::StrCat(where, ": the planner counts iterations in 31 bits"));
  }
  if (batch.num_tables != tables_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", batch.num_tables, " tables; the schema has ", tables_));
  }
  if (batch.num_dense != options_.schema.num_dense()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " has ", batch.num_dense,
                                                   " dense features; the schema has ",
                                                   options_.schema.num_dense()));
  }
  const int64_t n = batch.num_samples;
  if (n < 0 || batch.offsets.size() != static_cast<size_t>(tables_ * n + 1) ||
      batch.offsets[0] != 0 || batch.ids.size() != static_cast<size_t>(batch.offsets.back())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": malformed sparse layout (", n,
                                                   " samples, ", batch.offsets.size(), " offsets, ",
                                                   batch.ids.size(), " ids)"));
  }
  if (options_.build_batch && (batch.labels.size() != static_cast<size_t>(n) ||
                               batch.dense.size() != static_cast<size_t>(n * batch.num_dense))) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", batch.labels.size(), " labels and ",
                                                   batch.dense.size(), " dense values for ", n,
                                                   " samples"));
  }
  Stopwatch watch;
  WindowBatch& wb = window(k);
  wb.iteration = k;
  wb.ids = batch.num_ids();
  for (std::vector<uint8_t>& flags : wb.now) flags.clear();
  for (int t = 0; t < trainers_; ++t) {
    TrainerSlice& slice = wb.trainers[t];
    slice.plan = SparePlan();
    slice.shared_flags.clear();
    TrainerPlan& plan = slice.plan;
    const ShardRange range = ShardOf(batch.num_samples, trainers_, t);
    plan.iteration = k;
    plan.trainer = t;
    plan.num_trainers = trainers_;
    plan.first_sample = batch.first_sample + range.begin;
    plan.num_samples = range.end - range.begin;
    plan.global_samples = batch.num_samples;
    plan.num_dense = batch.num_dense;
    plan.num_tables = tables_;
    int64_t first_id = 0;
    for (int tb = 0; tb < tables_; ++tb) {
      const int64_t begin = batch.offsets[tb * n + range.begin];
      const int64_t end = batch.offsets[tb * n + range.end];
      if (begin < 0 || end < begin || end > batch.num_ids()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": offsets of table ", options_.schema.table_names[tb], " are out of order"));
      }
      // A split table's tracks learn their id counts from Partition.
      for (int track = table_first_track_[tb]; track < table_first_track_[tb + 1]; ++track) {
        Segment& seg = slice.tables[track];
        seg.first_id = first_id;
        seg.id_count = end - begin;
      }
      first_id += end - begin;
    }
    if (options_.build_batch) plan.unique_index.resize(static_cast<size_t>(first_id));
  }

  // Nothing of the planner's state changes before the batch is known to be good.
  std::vector<absl::Status> errors(static_cast<size_t>(trainers_ * tables_));
  ForEachTrainerTable(PlannerPass::kValidate, trainers_, schema_order_, [&](int t, int tb) {
    absl::Status& status = errors[static_cast<size_t>(tb * trainers_ + t)];
    status = Validate(t, tb, batch, k);
    if (status.ok() && split(tb)) Partition(t, tb, batch);
  });
  for (const absl::Status& status : errors) RETURN_IF_ERROR(status);
  const bool device = options_.policy == CachePolicy::kDevice;
  ForEachTrainerTable(PlannerPass::kLink, trainers_, [&](int t, int tb) {
    if (device) {
      Dedup(t, tb, batch, wb);
    } else {
      Link(t, tb, batch, wb);
    }
  });
  for (int t = 0; t < trainers_; ++t) {
    TrainerSlice& slice = wb.trainers[t];
    int32_t total = 0;
    for (Segment& seg : slice.tables) {
      seg.first_unique = total;
      total += static_cast<int32_t>(seg.rows.size());
    }
    if (total > capacity_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "iteration %d, trainer %d: batch working set %d rows exceeds cache capacity %d rows; "
          "raise --cache-rows or lower --batch-size",
          k, t, total, capacity_));
    }
    slice.plan.unique_rows.resize(static_cast<size_t>(total));
    slice.plan.unique_slots.resize(static_cast<size_t>(total));
  }
  ForEachTrainerTable(PlannerPass::kCopy, trainers_, [&](int t, int tb) {
    TrainerSlice& slice = wb.trainers[t];
    const Segment& seg = slice.tables[tb];
    std::copy(seg.rows.begin(), seg.rows.end(), slice.plan.unique_rows.begin() + seg.first_unique);
    if (!options_.build_batch) return;
    uint32_t* index = slice.plan.unique_index.data() + seg.first_id;
    const uint32_t base = static_cast<uint32_t>(seg.first_unique);
    if (split(track_table_[tb])) {
      const TableTrack& track = caches_[t].tables[tb];
      const int32_t* pos = track.part_pos.data();
      const uint32_t* local = track.part_index.data();
      for (int64_t j = 0; j < seg.id_count; ++j) index[pos[j]] = local[j] + base;
    } else if (base != 0) {
      for (int64_t j = 0; j < seg.id_count; ++j) index[j] += base;
    }
  });
  if (options_.build_batch) BuildLocalBatch(batch, wb);

  ++pushed_;
  wb.entry_seconds = watch.Seconds();
  stats_.entry_seconds += wb.entry_seconds;
  stats_.phase_seconds[static_cast<int>(PlannerPhase::kEntry)] += wb.entry_seconds;
  return absl::OkStatus();
}

absl::Status Planner::Impl::Validate(int trainer, int table, const Batch& batch,
                                     Iteration iteration) const {
  const ShardRange range = ShardOf(batch.num_samples, trainers_, trainer);
  const int64_t* offsets = batch.offsets.data() + table * static_cast<int64_t>(batch.num_samples);
  // Both scans are branch-free so that they vectorise; the exact loops below only run to name
  // the culprit.
  if (static_cast<int64_t>(OffsetFlags(offsets + range.begin, range.end - range.begin)) < 0) {
    for (int32_t s = range.begin; s < range.end; ++s) {
      if (offsets[s + 1] < offsets[s] || offsets[s] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch ", iteration, ": offsets decrease at sample ",
                         batch.first_sample + s, ", table ", options_.schema.table_names[table]));
      }
    }
  }
  const uint64_t rows = static_cast<uint64_t>(options_.schema.table_rows[table]);
  const int64_t* ids = batch.ids.data();
  const bool bad =
      static_cast<int64_t>(
          IdFlags(ids + offsets[range.begin], offsets[range.end] - offsets[range.begin], rows)) < 0;
  if (!bad) return absl::OkStatus();
  for (int32_t s = range.begin; s < range.end; ++s) {
    for (int64_t j = offsets[s]; j < offsets[s + 1]; ++j) {
      if (static_cast<uint64_t>(ids[j]) >= rows) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch ", iteration, ": sample ", batch.first_sample + s, ", table ",
            options_.schema.table_names[table], ": id ", ids[j], " is outside [0, ", rows, ")"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Sends ids[j] (and j) to the lists of part SplitPart(ids[j], parts); returns the lists' sizes in
// `counts`.
void SplitIds(const int64_t* ids, int64_t n, int parts, int64_t* const* part_ids,
              int32_t* const* part_pos, int64_t* counts) {
  std::fill_n(counts, parts, 0);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t id = ids[j];
    const int p = SplitTablePart(id, parts);
    const int64_t at = counts[p]++;
    part_ids[p][at] = id;
    part_pos[p][at] = static_cast<int32_t>(j);
  }
}

}  // namespace

void Planner::Impl::Partition(int trainer, int table, const Batch& batch) {
  const ShardRange range = ShardOf(batch.num_samples, trainers_, trainer);
  const int64_t* offsets = batch.offsets.data() + table * static_cast<int64_t>(batch.num_samples);
  const int64_t begin = offsets[range.begin];
  const int64_t n = offsets[range.end] - begin;
  const int64_t* ids = batch.ids.data() + begin;
  const int first = table_first_track_[table];
  const int n_parts = parts(table);
  TableTrack* tracks = caches_[trainer].tables.data() + first;
  int64_t* part_ids[oracle_internal::kMaxSplitParts];
  int32_t* part_pos[oracle_internal::kMaxSplitParts];
  int64_t counts[oracle_internal::kMaxSplitParts];
  for (int p = 0; p < n_parts; ++p) {
    tracks[p].part_ids.resize(static_cast<size_t>(n));
    tracks[p].part_pos.resize(static_cast<size_t>(n));
    part_ids[p] = tracks[p].part_ids.data();
    part_pos[p] = tracks[p].part_pos.data();
  }
  SplitIds(ids, n, n_parts, part_ids, part_pos, counts);
  WindowBatch& wb = window(pushed_);
  for (int p = 0; p < n_parts; ++p) {
    tracks[p].part_ids.resize(static_cast<size_t>(counts[p]));
    tracks[p].part_pos.resize(static_cast<size_t>(counts[p]));
    wb.trainers[trainer].tables[first + p].id_count = counts[p];
  }
}

void Planner::Impl::Dedup(int trainer, int table, const Batch& batch, WindowBatch& wb) {
  TrainerSlice& slice = wb.trainers[trainer];
  Segment& seg = slice.tables[table];
  seg.rows.clear();
  const ShardRange range = ShardOf(batch.num_samples, trainers_, trainer);
  const int64_t* offsets =
      batch.offsets.data() + track_table_[table] * static_cast<int64_t>(batch.num_samples);
  const int64_t begin = offsets[range.begin];
  const int64_t end = offsets[range.end];
  const RowId base = table_offsets_[table];
  uint32_t* out = options_.build_batch ? slice.plan.unique_index.data() + seg.first_id : nullptr;
  oracle_internal::BatchDedup& dedup = dedup_.local();
  dedup.Reset(static_cast<size_t>(end - begin));
  for (int64_t j = begin; j < end; ++j) {
    const int64_t id = batch.ids[j];
    bool inserted;
    const int32_t pos = dedup.Insert(id, &inserted);
    if (inserted) seg.rows.push_back(base + static_cast<RowId>(id));
    if (out != nullptr) out[j - begin] = static_cast<uint32_t>(pos);
  }
}

void Planner::Impl::Link(int trainer, int table, const Batch& batch, WindowBatch& wb) {
  TrainerSlice& slice = wb.trainers[trainer];
  Segment& seg = slice.tables[table];
  TrainerCache& cache = caches_[trainer];
  TableTrack& track = cache.tables[table];
  seg.revived.clear();
  const bool capture = capture_slots(table);
  const bool several = trainers_ > 1;
  const Iteration k = wb.iteration;
  const int32_t k32 = static_cast<int32_t>(k);
  const bool part = split(track_table_[table]);
  // The segment's ids: the shard's ids of the table, or those Partition sent to this track.
  const int64_t* ids = track.part_ids.data();
  int64_t n = static_cast<int64_t>(track.part_ids.size());
  if (!part) {
    const ShardRange range = ShardOf(batch.num_samples, trainers_, trainer);
    const int64_t* offsets =
        batch.offsets.data() + track_table_[table] * static_cast<int64_t>(batch.num_samples);
    ids = batch.ids.data() + offsets[range.begin];
    n = offsets[range.end] - offsets[range.begin];
  }
  oracle_internal::RowTable<TrainerRow>& rows = track.rows;
  rows.Reserve(static_cast<size_t>(n));  // records stay put during the loop
  // The segment has at most as many rows as ids (and as the table): its lists are sized for that
  // up front, without initialisation, written through pointers and cut to size at the end.
  const size_t bound = static_cast<size_t>(std::min<int64_t>(n, table_rows(table)));
  seg.rows.clear();
  seg.rows.resize(bound);
  seg.slots.clear();
  seg.globals.clear();
  if (capture) {
    seg.slots.resize(bound);
    if (several) seg.globals.resize(bound);
  }
  const LinkSetup setup{
      .ids = ids,
      .base = table_offsets_[table],
      .k32 = k32,
      .next_plan = next_plan_,
      .capture = capture,
      .several = several,
      .revive = queued_policy(),
      .arena = track.next.data(),
      .stride = track.next_stride,
      .k_slot = k % static_cast<int64_t>(window_.size()),
      .window_size = static_cast<int64_t>(window_.size()),
      .width = next_width_,
      .rows = seg.rows.data(),
      .slots = seg.slots.data(),
      .globals = seg.globals.data(),
      .revived = &seg.revived,
  };
  if (part && options_.build_batch) track.part_index.resize(static_cast<size_t>(n));
  uint32_t* const out = !options_.build_batch ? nullptr
                        : part                ? track.part_index.data()
                                              : slice.plan.unique_index.data() + seg.first_id;
  constexpr int64_t kAhead = 32;
  const int64_t ahead_end = std::max<int64_t>(0, n - kAhead);
  // The loops over ids for next-use width kWidth (0: next_width_ at run time).
  auto run = [&](auto width_tag) -> int32_t {
    SegmentLinker<decltype(width_tag)::value> linker(setup);
    if (rows.dense()) {
      // Most tables are small and dense, and most of their ids repeat a row seen earlier in the
      // segment: that path is a load and a compare (no hashing, no form tests), prefetching
      // only when the records outgrow the caches. A record with last_occ = k is present, so only
      // first occurrences count inserts.
      const auto records = rows.dense_records();
      int64_t inserts = 0;
      auto visit = [&](int64_t j, auto write_out) __attribute__((always_inline)) {
        TrainerRow& row = records[ids[j]];
        int32_t pos;
        if (row.last_occ == k32) [[likely]] {
          pos = row.last_pos;
        } else {
          inserts += row.present() ? 0 : 1;
          pos = linker.First(j, row);
        }
        if constexpr (decltype(write_out)::value) out[j] = static_cast<uint32_t>(pos);
      };
      auto loop = [&](auto write_out) {
        int64_t j = 0;
        if (table_rows(table) > oracle_internal::kDenseNoPrefetchRows) {
          for (; j < ahead_end; ++j) {
            __builtin_prefetch(&records[ids[j + kAhead]]);
            visit(j, write_out);
          }
        }
        for (; j < n; ++j) visit(j, write_out);
      };
      out != nullptr ? loop(std::true_type{}) : loop(std::false_type{});
      rows.CountInserts(inserts);
    } else {
      const auto records = rows.hashed_records();
      int64_t inserts = 0;
      // Each id's home bucket is computed once, when it is prefetched, and waits in a ring.
      size_t homes[kAhead];
      for (int64_t j = 0; j < std::min(kAhead, n); ++j) {
        homes[j] = records.Home(ids[j]);
        records.Prefetch(homes[j]);
      }
      auto visit = [&](int64_t j, size_t home) __attribute__((always_inline)) {
        TrainerRow& row = records.FindOrInsert(ids[j], home, &inserts);
        const int32_t pos = row.last_occ == k32 ? row.last_pos : linker.First(j, row);
        if (out != nullptr) out[j] = static_cast<uint32_t>(pos);
      };
      int64_t j = 0;
      for (; j < ahead_end; ++j) {
        size_t& slot = homes[static_cast<size_t>(j) % kAhead];
        const size_t home = slot;
        slot = records.Home(ids[j + kAhead]);
        records.Prefetch(slot);
        visit(j, home);
      }
      for (; j < n; ++j) visit(j, homes[static_cast<size_t>(j) % kAhead]);
      rows.CountInserts(inserts);
    }
    return linker.Finish();
  };
  int32_t distinct;
  switch (next_width_) {
    case 1:
      distinct = run(std::integral_constant<int, 1>{});
      break;
    case 2:
      distinct = run(std::integral_constant<int, 2>{});
      break;
    default:
      distinct = run(std::integral_constant<int, 0>{});
      break;
  }
  seg.rows.resize(static_cast<size_t>(distinct));
  if (capture) {
    seg.slots.resize(static_cast<size_t>(distinct));
    if (several) seg.globals.resize(static_cast<size_t>(distinct));
  }
  // Revivals after the loop, in id order, prefetching their slot states (random accesses that
  // stalled the loop when done in place).
  const size_t revivals = seg.revived.size();
  for (size_t v = 0; v < revivals; ++v) {
    if (v + kRevivalsAhead < revivals) {
      __builtin_prefetch(cache.slots.data() + seg.revived[v + kRevivalsAhead].slot, 1);
    }
    Revive(cache, track, seg.revived[v], k);
  }
  // This segment's own next-use distances start unknown.
  ReserveNextUses(trainer, table, seg.rows.size());
  std::fill_n(NextUses(track, k), seg.rows.size() * next_width_, 0);
}

void Planner::Impl::ReserveNextUses(int trainer, int table, size_t rows) {
  TableTrack& track = caches_[trainer].tables[table];
  if (rows <= track.next_stride) return;
  const size_t stride = std::max(rows, 2 * track.next_stride);
  const size_t width = static_cast<size_t>(next_width_);
  oracle_internal::HugeVector<uint8_t> next(window_.size() * stride * width, 0);
  // Carry over the segments still in the window (planned ones no longer read theirs).
  for (Iteration i = next_plan_; i < pushed_; ++i) {
    const size_t w = static_cast<size_t>(i % window_.size());
    const size_t size = window(i).trainers[trainer].tables[table].rows.size();
    std::copy_n(track.next.data() + w * track.next_stride * width, size * width,
                next.data() + w * stride * width);
  }
  track.next.swap(next);
  track.next_stride = stride;
}

void Planner::Impl::BuildLocalBatch(Batch& batch, WindowBatch& wb) {
  const int64_t n = batch.num_samples;
  if (trainers_ == 1) {
    // Swapped rather than moved: the batch takes the plan's spare buffers (Push's `spent`).
    TrainerPlan& plan = wb.trainers[0].plan;
    plan.labels.swap(batch.labels);
    plan.dense.swap(batch.dense);
    plan.offsets.swap(batch.offsets);
    return;
  }
  ForEach(trainers_, [&](int t) {
    TrainerSlice& slice = wb.trainers[t];
    TrainerPlan& plan = slice.plan;
    const ShardRange range = ShardOf(batch.num_samples, trainers_, t);
    const int64_t ns = range.end - range.begin;
    plan.labels.assign(batch.labels.begin() + range.begin, batch.labels.begin() + range.end);
    plan.dense.assign(batch.dense.begin() + range.begin * batch.num_dense,
                      batch.dense.begin() + range.end * batch.num_dense);
    plan.offsets.resize(static_cast<size_t>(tables_ * ns + 1));
    for (int tb = 0; tb < tables_; ++tb) {
      const int64_t* src = batch.offsets.data() + tb * n + range.begin;
      int64_t* dst = plan.offsets.data() + tb * ns;
      const int64_t shift = slice.tables[tb].first_id - src[0];
      for (int64_t s = 0; s < ns; ++s) dst[s] = src[s] + shift;
    }
    plan.offsets.back() = static_cast<int64_t>(plan.unique_index.size());
  });
}

TrainerPlan Planner::Impl::DrainPlan(int trainer) const {
  TrainerPlan plan;
  plan.iteration = next_plan_;
  plan.trainer = trainer;
  plan.num_trainers = trainers_;
  plan.num_tables = tables_;
  plan.num_dense = options_.schema.num_dense();
  plan.offsets = {0};
  return plan;
}

absl::Status Planner::Impl::PlanNext() {
  const Iteration i = next_plan_;
  Stopwatch watch;
  double lap_start = 0;
  auto lap = [&](PlannerPhase phase) {
    const double now = watch.Seconds();
    stats_.phase_seconds[static_cast<int>(phase)] += now - lap_start;
    lap_start = now;
  };
  WindowBatch& wb = window(i);
  SparePlanningBuffers(i);
  if (options_.policy == CachePolicy::kDevice) {
    ForEach(tracks_, [&](int tb) { PlanDevice(tb, i); });
    lap(PlannerPhase::kConsistency);
  } else {
    ForEachTrainerTable(PlannerPass::kClassify, trainers_,
                        [&](int t, int tb) { Classify(t, tb, i); });
    if (trainers_ > 1) {
      ForEachTrainerTable(PlannerPass::kMerge, 1, [&](int, int tb) { Merge(tb, i); });
    }
    lap(PlannerPhase::kClassify);
    std::vector<uint8_t> ok(trainers_, 1);
    ForEach(trainers_, [&](int t) { ok[t] = SelectVictims(t, i); });
    for (int t = 0; t < trainers_; ++t) {
      if (!ok[t]) {
        return absl::InternalError(absl::StrCat("iteration ", i, ", trainer ", t,
                                                ": the eviction queues ran out of victims"));
      }
    }
    bool runs = false;
    for (const TrainerSlice& slice : wb.trainers) {
      for (const Segment& seg : slice.tables) runs |= !seg.victim_runs.empty();
    }
    if (runs) {
      std::vector<uint8_t> popped(static_cast<size_t>(trainers_ * tracks_), 1);
      ForEachTrainerTable(PlannerPass::kEvict, trainers_, [&](int t, int tb) {
        popped[static_cast<size_t>(t * tracks_ + tb)] = Evict(t, tb, i);
      });
      for (int t = 0; t < trainers_ * tracks_; ++t) {
        if (!popped[t]) {
          return absl::InternalError(
              absl::StrCat("iteration ", i, ", trainer ", t / tracks_, ", table ",
                           options_.schema.table_names[track_table_[t % tracks_]],
                           ": the eviction queue holds fewer rows than counted"));
        }
      }
    }
    lap(PlannerPhase::kVictims);
    ForEachTrainerTable(PlannerPass::kApply, trainers_, [&](int t, int tb) { Apply(t, tb, i); });
    lap(PlannerPhase::kApply);
    if (trainers_ > 1) {
      ForEachTrainerTable(PlannerPass::kConsistency, 1, [&](int, int tb) { Consistency(tb, i); });
    }
    lap(PlannerPhase::kConsistency);
  }
  // Flushes land in plans of earlier (unreleased) iterations, appended in table order.
  for (oracle_internal::TableSync& sync : sync_) {
    for (const oracle_internal::FlushOrder& f : sync.flushes) {
      window(f.iteration).trainers[f.trainer].plan.extract.push_back(f.extraction);
    }
    Count(PlannerCounter::kFlushes, static_cast<int64_t>(sync.flushes.size()));
    Count(PlannerCounter::kExchangedRows, sync.exchanged);
    Count(PlannerCounter::kSharedRows, sync.shared_count);
  }
  ForEach(trainers_, [&](int t) { Assemble(t, i); });
  if (trainers_ > 1 && options_.policy != CachePolicy::kDevice) {
    ForEachTrainerTable(PlannerPass::kWriteSync, 1, [&](int, int tb) { WriteSync(tb, i); });
  }

  Count(PlannerCounter::kIterations, 1);
  Count(PlannerCounter::kIds, wb.ids);
  for (const TrainerSlice& slice : wb.trainers) {
    const int64_t unique = static_cast<int64_t>(slice.plan.unique_rows.size());
    const int64_t misses = static_cast<int64_t>(slice.plan.fills.size());
    int64_t evictions = 0;
    int64_t write_backs = 0;
    for (const Extraction& e : slice.plan.extract) {
      evictions += e.evict ? 1 : 0;
      write_backs += e.evict && e.write_back ? 1 : 0;
    }
    Count(PlannerCounter::kWriteBacks, write_backs);
    Count(PlannerCounter::kUniqueRows, unique);
    Count(PlannerCounter::kHits, unique - misses);
    Count(PlannerCounter::kMisses, misses);
    Count(PlannerCounter::kEvictions, evictions);
    Count(PlannerCounter::kPrivateRows, static_cast<int64_t>(slice.plan.private_unique.size()));
  }
  ++next_plan_;
  lap(PlannerPhase::kAssemble);
  while (next_release_ + emit_lag_ < next_plan_) Release(next_release_++);
  lap(PlannerPhase::kRelease);
  const double seconds = watch.Seconds();
  stats_.plan_seconds += seconds;
  stats_.max_iteration_ms = std::max(stats_.max_iteration_ms, (seconds + wb.entry_seconds) * 1e3);
  return absl::OkStatus();
}

void Planner::Impl::Release(Iteration i) {
  WindowBatch& wb = window(i);
  std::vector<TrainerPlan> plans;
  plans.reserve(static_cast<size_t>(trainers_));
  if (trainers_ > 1 && options_.policy != CachePolicy::kDevice) {
    // Each holder's shared rows: table by table, each table's in RowId order (WriteSync). One
    // task per trainer walks every table's shared rows and writes its own entries in order
    // (branch-free: a row it does not hold writes to `skip`).
    ForEach(trainers_, [&](int t) {
      SharedRow* entry = wb.trainers[t].plan.shared.data();
      SharedRow skip;
      for (int tb = 0; tb < tracks_; ++tb) {
        const uint8_t* const now = wb.now[static_cast<size_t>(tb)].data();
        const int32_t* const qs = wb.shared_q[static_cast<size_t>(tb)].data();
        const uint64_t* const holders = wb.shared_holders[static_cast<size_t>(tb)].data();
        const size_t count = wb.shared_q[static_cast<size_t>(tb)].size();
        for (size_t s = 0; s < count; ++s) {
          const bool mine = ((holders[s] >> t) & 1) != 0;
          (mine ? entry : &skip)->now = now[qs[s]] != 0;
          entry += mine ? 1 : 0;
        }
      }
    });
  }
  for (TrainerSlice& slice : wb.trainers) {
    TrainerPlan& plan = slice.plan;
    for (size_t j = 0; j < slice.shared_flags.size(); ++j) {
      const auto [table, flag] = slice.shared_flags[j];
      plan.shared[j].now = wb.now[table][flag] != 0;
    }
    plans.push_back(std::move(plan));
    slice.plan = TrainerPlan{};
  }
  ready_.push_back(std::move(plans));
}

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(PlannerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Planner>(new Planner(std::move(impl)));
}

Planner::Planner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Planner::~Planner() = default;

absl::Status Planner::Push(Batch global_batch, Batch* spent) {
  return impl_->Push(std::move(global_batch), spent);
}
absl::Status Planner::Finish() { return impl_->Finish(); }
absl::StatusOr<std::optional<std::vector<TrainerPlan>>> Planner::Pop() { return impl_->Pop(); }
absl::StatusOr<std::vector<TrainerPlan>> Planner::Drain() { return impl_->Drain(); }
void Planner::Recycle(std::vector<TrainerPlan> plans) { impl_->Recycle(std::move(plans)); }
PlannerStats Planner::stats() const { return impl_->stats(); }
const PlannerOptions& Planner::options() const { return impl_->options(); }

}  // namespace bagpipe
