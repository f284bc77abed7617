// Cache statistics: an enum-indexed array of monotonically increasing counters (FBGEMM's
// cache-stats convention), with a JSON form for metrics files.
//
// Two kinds of counters live here. The runtime, which knows the plans, adds the plan-level ones
// (requests, unique, hits, misses, evictions, write-backs, flushes, gathered bytes); the cache
// itself adds the operation-level ones (rows filled, extracted, pooled, reduced, applied,
// initialised, gather calls) in its public methods. Each counter's documentation says which.
//
// Thread-safety: Add/Get/Snapshot/ToJson may be called concurrently from any thread (relaxed
// atomics: each counter is exact, a snapshot across counters is not an atomic cut).
#ifndef BAGPIPE_CACHE_CACHE_STATS_H_
#define BAGPIPE_CACHE_CACHE_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

#include "nlohmann/json.hpp"

namespace bagpipe {

// X(enumerator, json name, meaning)
#define BAGPIPE_CACHE_COUNTERS(X)                                                             \
  X(kRequests, "requests", "id occurrences looked up through the cache (runtime)")            \
  X(kUnique, "unique", "distinct rows per iteration, summed over iterations (runtime)")       \
  X(kHits, "hits", "unique rows already resident when their iteration began (runtime)")       \
  X(kMisses, "misses", "unique rows fetched into a slot for their iteration (runtime)")       \
  X(kEvictions, "evictions", "rows whose slot was freed (runtime)")                           \
  X(kWriteBacks, "write_backs", "rows extracted and sent to their server (runtime)")          \
  X(kFlushes, "flushes", "rows extracted that stay resident (runtime)")                       \
  X(kGatheredBytes, "gathered_bytes",                                                         \
    "bytes read and written by gathers: (ids + bags) * dim * 4 (runtime)")                    \
  X(kGatherCalls, "gather_calls", "Gather calls (cache)")                                     \
  X(kPooledRows, "pooled_rows", "bags pooled by Gather (cache)")                              \
  X(kReducedRows, "reduced_rows", "unique rows whose gradient ReduceGradients built (cache)") \
  X(kAppliedRows, "applied_rows", "rows updated by Apply/ApplyIndexed (cache)")               \
  X(kFilledRows, "filled_rows", "slots written by Fill/WriteRecords (cache)")                 \
  X(kExtractedRows, "extracted_rows", "slots copied out by Extract/ReadRecords (cache)")      \
  X(kInitializedRows, "initialized_rows", "slots set by InitializeRows (cache)")

enum class CacheCounter : int {
#define BAGPIPE_CACHE_COUNTER_ENUM_(name, json, doc) name,
  BAGPIPE_CACHE_COUNTERS(BAGPIPE_CACHE_COUNTER_ENUM_)
#undef BAGPIPE_CACHE_COUNTER_ENUM_
};

inline constexpr int kNumCacheCounters = 0
#define BAGPIPE_CACHE_COUNTER_COUNT_(name, json, doc) +1
    BAGPIPE_CACHE_COUNTERS(BAGPIPE_CACHE_COUNTER_COUNT_)
#undef BAGPIPE_CACHE_COUNTER_COUNT_
    ;

// The counter's JSON name ("requests", "hits", ...).
std::string_view CacheCounterName(CacheCounter counter);
// One sentence: what it counts and who increments it.
std::string_view CacheCounterDoc(CacheCounter counter);

class CacheStats {
 public:
  using Values = std::array<int64_t, kNumCacheCounters>;

  CacheStats() = default;
  CacheStats(const CacheStats&) = delete;
  CacheStats& operator=(const CacheStats&) = delete;

  void Add(CacheCounter counter, int64_t amount = 1) {
    counters_[static_cast<int>(counter)].fetch_add(amount, std::memory_order_relaxed);
  }
  int64_t Get(CacheCounter counter) const {
    return counters_[static_cast<int>(counter)].load(std::memory_order_relaxed);
  }
  Values Snapshot() const;
  // Adds every counter of `values` (e.g. another trainer's snapshot).
  void Merge(const Values& values);
  void Reset();

  // Hits / (hits + misses); 0 when both are 0.
  double HitRate() const;
  // {"requests": n, ..., "hit_rate": x}: every counter by its JSON name plus the hit rate.
  nlohmann::json ToJson() const;

 private:
  std::array<std::atomic<int64_t>, kNumCacheCounters> counters_{};
};

}  // namespace bagpipe

#endif  // BAGPIPE_CACHE_CACHE_STATS_H_
