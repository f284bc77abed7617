// The lookahead oracle: turns the stream of global batches into per-trainer plans (plan.h).
//
// The planner sees global batches `lookahead` (L) iterations ahead. For every iteration i and
// trainer t it decides which rows t's cache holds and in which slots, what is fetched, evicted
// and written back at the boundary of i, and which row gradients the trainers exchange.
//
// Residency, per trainer (each trainer has its own cache of `capacity` rows across all tables):
//  - D_t(i) = the distinct rows of t's shard (data/batch.h ShardOf) of batch i, linearised as
//    RowId = schema.TableOffsets()[table] + id. Every row of D_t(i) is resident at i at the slot
//    unique_slots names; missing rows are filled at the boundary of i (at first need).
//  - When slots are needed and none is free, victims are resident rows not in D_t(i), chosen by
//    the policy:
//      kOracle  Belady's MIN restricted to the window: furthest next use by t first; rows with no
//               use in the window tie at infinity and go first, least recently used first. Rows
//               stay after their last known use while capacity allows (lazy eviction).
//      kLru     least recently used first (the planner looks at batch i only).
//      kLfu     fewest uses first (a use = an iteration that needs the row; counts persist across
//               evictions, as in FBGEMM's LFU cache, so memory grows with the rows seen), then
//               least recently used.
//      kOff     nothing is kept: every row of D_t(i) is filled at i and evicted at i + 1.
//      kDevice  every row of every table is resident on every trainer from the start at slot
//               RowId (capacity = total rows); no fills, no evictions.
//    Remaining ties (same next use, same last use) are broken deterministically: lower table
//    first (then lower part of a split table, below), then the order rows entered the queue. A fill
//    takes the slot of a victim evicted at the same boundary, in victim order
//    (extract-before-fill), else a free slot (never-used slots lowest first). Plans are a pure
//    function of the options and the stream.
//  - |D_t(i)| > capacity fails with an error naming the iteration, the trainer, the working set
//    and the capacity.
//
// Consistency (planned globally across trainers; T <= 64):
//  - Evictions: when the last holder of a dirty row (touched since the servers' copy was last
//    made current) evicts it, the lowest-id trainer evicting it at that boundary writes it back,
//    stamped with the boundary's iteration.
//  - Fills: when trainer v fills row r at i while another trainer u holds r dirty, the lowest-id
//    holder u flushes r (Extraction{evict=false, write_back=true}) at boundary
//    g = max(last_touch(r) + 1, i - emit_lag), moved to last_touch(r) + 2 when r was a shared
//    row at last_touch(r) and those plans are already released (their exchange may then still
//    be in flight at last_touch(r) + 1). No trainer touches r in [g, i), so the flushed value is
//    the value v must read. This is why plans are released emit_lag iterations after they are
//    planned.
//  - Shared rows of i: rows touched at i by some trainer and held (after the fills of i) by at
//    least two. Every holder applies the sum of the touchers' gradients (plan.h). `now` is set
//    when a holder uses the row at i + 1 or the row is extracted at boundary i + 1 (including
//    the final Drain); otherwise the exchange may finish before boundary i + 2.
//  - Rows touched by t that no other trainer holds are t's private_unique rows.
//
// Write-back stamps (the contract with the embedding servers, sync/protocol.h):
//  - A write-back extracted at boundary g carries stamp g. A Fill's after_stamp is the latest
//    write-back stamp of the row the planner knows, or -1; stamps the planner hands out later
//    for that row are larger than the fill's iteration, so the server serves a fill at i after
//    applying the write-back stamped after_stamp and never waits for a later one.
//  - The planner forgets a row's stamp once it is older than `writeback_horizon` (H) iterations
//    and no trainer holds the row (with one trainer, at once when no fill could still read it:
//    no batch in the window uses the row and the next batch is more than H iterations away,
//    as when L > H), so its memory does not grow with the dataset: a fill at i
//    then carries after_stamp = -1 (also whenever the known stamp is < i - H). The server makes
//    this exact by also waiting, before serving any fill of iteration i, until every trainer has
//    sent its write-backs up to iteration i - H. H larger than the runtime's prefetch depth plus
//    emit_lag keeps that wait off the critical path.
//
// Memory is proportional to the window and the capacity: a per-trainer record for every row that
// is resident or occurs in the window, a global record for every held row and every row written
// back in the last H iterations, and the window's batches (kept in plan form, ids dropped).
// Tables with at most `dense_index_max_rows` rows index their rows with a direct array (4 bytes a
// row per trainer) instead of a hash map. The hash maps of a trainer start with room for twice
// the capacity in all (64 bytes a row), shared among the hashed tables in proportion to
// min(table rows, capacity), so that a steady stream rarely grows one: a grown map is rehashed
// into fresh memory, a stall of tens of milliseconds on one iteration.
//
// Splitting large tables (PlannerOptions::split_min_rows, split_parts; one trainer): the
// planner's work is parallel across (trainer, table), and the few largest tables of a Criteo-like
// stream take most of it. With one trainer such a table is split by a hash of its ids into parts
// that the planner treats as tables of their own, each one a task. Residency is unchanged in
// kind (Belady within the window, the same capacity), but ties between rows of different parts
// are broken by part, and unique_rows lists a split table's rows part by part (first-occurrence
// order within a part) — so plans depend on the split, deterministically. With several trainers
// every (trainer, table) is already a task, and tables are not split.
//
// Thread-safety: a Planner is used by one thread at a time (it parallelises internally with TBB
// across trainers and tables). After any call returns an error, the planner must be destroyed.
#ifndef BAGPIPE_ORACLE_PLANNER_H_
#define BAGPIPE_ORACLE_PLANNER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/schema.h"
#include "nlohmann/json.hpp"
#include "oracle/plan.h"

namespace bagpipe {

enum class CachePolicy { kOracle, kLru, kLfu, kOff, kDevice };

// "oracle", "lru", "lfu", "off", "device"; the error lists the valid names.
absl::StatusOr<CachePolicy> ParseCachePolicy(std::string_view name);
std::string_view CachePolicyName(CachePolicy policy);

struct PlannerOptions {
  // Table sizes: linearisation, id validation and (kDevice) the slot space.
  Schema schema;
  int num_trainers = 1;  // 1..64
  // Rows per trainer cache, across all tables. kDevice: ignored (= total rows).
  int64_t capacity = 0;
  // L: batches i .. i+L-1 are visible when planning i (kOracle); reactive policies see batch i.
  int lookahead = 20;
  CachePolicy policy = CachePolicy::kOracle;
  // Plans of iteration i are released once iteration i + emit_lag is planned (>= 1).
  int emit_lag = 2;
  // H, see "Write-back stamps" above; 0 = default (kDefaultWritebackHorizon).
  int64_t writeback_horizon = 0;
  // false: plans carry no dense features, labels, offsets or unique_index (the simulator).
  bool build_batch = true;
  // Tables up to this many rows use direct-array row indexes (see the file comment).
  int64_t dense_index_max_rows = int64_t{1} << 20;
  // kOracle, kLru: tables above this many rows record each row's slot when its batch enters,
  // so that planning looks up only the rows that were not resident then (tables whose records
  // stay cached gain nothing). Plans are the same for any value.
  int64_t capture_min_rows = int64_t{1} << 16;
  // With one trainer, under every policy but kDevice: tables above split_min_rows rows are
  // planned as `split_parts` parts (rows assigned by a hash of their ids), each with its own row
  // records (a directly indexed table's parts each index all its rows), queues and tasks, so
  // that a few large tables do not bound the planner's time on many cores ("Splitting large
  // tables" above). It costs some total work (~0.1 ms a batch per Criteo-sized table split in 4
  // on the 2-core VM; +10-25% on 2 threads for the 5 Kaggle tables above 1Mi rows), and pays
  // only on many cores (modeled from measured tasks, bench/RESULTS.md). 1 = no splitting. Plans
  // depend on both. The default threshold splits only hashed tables (> dense_index_max_rows).
  int64_t split_min_rows = int64_t{1} << 20;
  int split_parts = 1;
  // When > 0: the planner times every task of its parallel passes (two clock reads a task) and
  // PlannerStats models its time on this many workers (see PlannerStats::modeled_seconds).
  int model_workers = 0;
};

inline constexpr int64_t kDefaultWritebackHorizon = 64;

// The part of a split table (PlannerOptions::split_parts) that the table's row `id` belongs to,
// in [0, parts): the low 32 bits of the id's Fibonacci product, scaled to the range. (The row
// tables hash ids by the product's top bits, which these do not overlap for tables under 2^32
// buckets, so each part's rows still spread over all of its row table's buckets.)
inline int SplitTablePart(int64_t id, int parts) {
  const uint64_t low = static_cast<uint32_t>(static_cast<uint64_t>(id) * 0x9e3779b97f4a7c15ULL);
  return static_cast<int>((low * static_cast<uint64_t>(parts)) >> 32);
}

// Counters, FBGEMM style (enum-indexed array).
enum class PlannerCounter : int {
  kIterations,       // iterations planned
  kIds,              // sparse id occurrences
  kUniqueRows,       // sum over trainers and iterations of |D_t(i)|
  kHits,             // unique rows already resident
  kMisses,           // unique rows filled (= fills)
  kEvictions,        // rows evicted at boundaries (Drain excluded)
  kWriteBacks,       // evictions that write the row back
  kFlushes,          // flushes (write-backs of rows that stay resident)
  kSharedRows,       // distinct shared rows, summed over iterations
  kExchangedRows,    // gradient rows sent to peers (sum of send list sizes)
  kPrivateRows,      // sum of private_unique sizes
  kDrainWriteBacks,  // write-backs in the Drain plans
  kCount,
};
inline constexpr int kNumPlannerCounters = static_cast<int>(PlannerCounter::kCount);
std::string_view PlannerCounterName(PlannerCounter counter);

// Phases of the planner's work, timed in PlannerStats::phase_seconds.
enum class PlannerPhase : int {
  kEntry,        // validating a pushed batch, dedup, next-use links, local batch
  kClassify,     // hits and misses
  kVictims,      // eviction choices and fill slots
  kApply,        // row records, slots, eviction queues
  kConsistency,  // write-backs, flushes, fill stamps, shared and private rows
  kAssemble,     // per-trainer sync lists, flush placement, counters
  kRelease,      // handing finished plans to Pop
  kCount,
};
inline constexpr int kNumPlannerPhases = static_cast<int>(PlannerPhase::kCount);
std::string_view PlannerPhaseName(PlannerPhase phase);

struct PlannerStats {
  std::array<int64_t, kNumPlannerCounters> counters{};
  std::array<double, kNumPlannerPhases> phase_seconds{};
  // Wall-clock seconds spent turning pushed batches into window entries (validation, dedup,
  // next-use links) and planning iterations (residency, consistency, release).
  double entry_seconds = 0;
  double plan_seconds = 0;
  // The slowest iteration: its entry plus its planning, in milliseconds.
  double max_iteration_ms = 0;
  // With PlannerOptions::model_workers = P > 0 (else 0). The planner's work is serial steps and
  // parallel passes over (trainer, table) or trainer tasks that workers take one at a time.
  //   pass_seconds      wall-clock time inside the passes (part of entry and plan seconds)
  //   modeled_seconds   entry + plan seconds with every pass replaced by the makespan of its
  //                     measured tasks, handed out in the same order to P workers
  //   span_seconds      the same with unlimited workers: serial steps + the longest task of
  //                     each pass (no number of cores does better without splitting tasks)
  // Run on one thread, modeled_seconds estimates the time on P cores of the same kind; it does
  // not see memory-bandwidth contention or the cost of waking workers.
  double pass_seconds = 0;
  double modeled_seconds = 0;
  double span_seconds = 0;
  // Current sizes: per-trainer row records, global row records, resident rows (all trainers).
  int64_t tracked_rows = 0;
  int64_t global_rows = 0;
  int64_t resident_rows = 0;

  int64_t operator[](PlannerCounter counter) const { return counters[static_cast<int>(counter)]; }
  // (entry_seconds + plan_seconds) / iterations, in milliseconds.
  double mean_iteration_ms() const;
  // modeled_seconds / iterations and span_seconds / iterations, in milliseconds.
  double modeled_iteration_ms() const;
  double span_iteration_ms() const;
  nlohmann::json ToJson() const;
};

class Planner {
 public:
  // Validates the options (trainer count, capacity, lookahead, emit lag, horizon, schema).
  static absl::StatusOr<std::unique_ptr<Planner>> Create(PlannerOptions options);
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Next global batch, in stream order (iteration = number of batches pushed before it). Checks
  // its shape and ids against the schema and that every trainer's working set fits. Plans the
  // iterations whose window is now complete. REQUIRES: Finish() not called.
  // If `spent` is given (it may be the moved-from batch), it receives an empty batch whose
  // vectors keep the capacity of the ones the planner no longer needs, for the caller's next
  // read: a loader that reads into it allocates nothing in the steady state.
  absl::Status Push(Batch global_batch, Batch* spent = nullptr);
  // No more batches: the remaining iterations' windows end at the stream's end. Pop plans them
  // one at a time as it reaches them (planning them all at once would hold a whole window of
  // plans, and keep the trainers waiting for the last one).
  absl::Status Finish();

  // The plans of the next iteration (one per trainer, in trainer order) once they are released;
  // nullopt when more batches must be pushed first, or, after Finish(), when every iteration has
  // been popped. After Finish() it plans the next iteration first when none is ready, and
  // returns the error if that planning fails (as Push would have).
  absl::StatusOr<std::optional<std::vector<TrainerPlan>>> Pop();

  // Optional: hands popped plans back once the caller is done with them (sent, executed), so
  // that later plans reuse their memory. At Criteo batch sizes a plan holds megabytes, and
  // fresh memory costs page faults and zeroing on every iteration. Any plans are accepted
  // (only their vectors' capacity is kept); the planner keeps a few trainers' worth.
  void Recycle(std::vector<TrainerPlan> plans);

  // After Finish() and every iteration popped: one plan per trainer (iteration = number of
  // iterations) with only `extract` entries: every resident row is evicted, and every dirty row
  // is written back by exactly one owner (its lowest-id holder). kDevice lists only the rows
  // ever touched, on trainer 0 (the others' replicas equal it). Callable once.
  absl::StatusOr<std::vector<TrainerPlan>> Drain();

  PlannerStats stats() const;
  const PlannerOptions& options() const;

 private:
  class Impl;
  explicit Planner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_PLANNER_H_
