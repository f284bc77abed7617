// The cache-policy simulator behind `bagpipe sim`: miss counts and miss-ratio curves of a trace
// under several cache policies and capacities, to size a cache before training.
//
// Model:
//  - Batch-granular: a batch needs all of its distinct rows resident at once. A miss is a needed
//    row that is not resident when its batch runs (one fetch); hits + misses = accesses = the
//    sum over batches of their distinct rows.
//  - One cache (one trainer) whose capacity counts rows across all tables.
//  - Every cached row was used since it was fetched, so every eviction is a write-back
//    (writebacks = evictions); the final write-back of the rows still cached is not counted.
// Policies:
//   oracle     Bagpipe C++'s planner (oracle/planner.h) with lookahead L: Belady's MIN within
//              the window of L batches, lazy eviction, ties at infinity by least recent use.
//   belady     the offline optimum: furthest next use over the whole trace (an independent,
//              simple implementation).
//   lru, lfu   fully associative reactive caches (the planner's kLru and kLfu: least recently
//              used; fewest uses since the start, then least recently used), as TorchRec's and
//              FBGEMM's UVM caches decide.
//   lru-32way  set-associative like FBGEMM's cache: capacity / 32 sets of 32 ways, the set a
//              hash of the row, LRU within the set. Rows of a batch are looked up first (hits
//              are kept); misses then replace lines not used by the batch. When a set has no
//              such line left, the row is fetched without being cached (a miss, no eviction).
//   ttl        the reference Bagpipe's rule: a row used at i expires at its last use within
//              [i, i+L-1] and is evicted after that; capacity is unbounded, the result reports
//              the peak number of resident rows instead.
// oracle, belady, lru and lfu need capacity >= the largest batch working set; infeasible
// (policy, capacity) pairs get a result carrying an error instead of counts.
//
// Simulate reads the stream once, keeps its distinct rows per batch in memory (8 bytes per
// access) and runs the (policy, capacity) pairs in parallel with TBB. Thread-compatible.
#ifndef BAGPIPE_ORACLE_SIMULATOR_H_
#define BAGPIPE_ORACLE_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/schema.h"
#include "data/source.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

// The policy names Simulate accepts, in their default order.
const std::vector<std::string>& SimPolicyNames();

struct SimOptions {
  std::vector<int64_t> capacities;
  int lookahead = 20;  // L of oracle and ttl
  std::vector<std::string> policies = SimPolicyNames();
};

struct SimPolicyResult {
  std::string policy;
  int64_t capacity = 0;  // ttl: 0 (unbounded; null in ToJson)
  int64_t misses = 0;
  int64_t hits = 0;
  int64_t evictions = 0;
  int64_t writebacks = 0;
  int64_t peak_rows = -1;  // ttl only
  std::string error;       // non-empty: infeasible, no counts
};

struct SimResult {
  int64_t batches = 0;
  int64_t ids = 0;
  int64_t accesses = 0;               // sum over batches of their distinct rows
  int64_t unique_rows = 0;            // distinct rows of the whole trace
  int64_t max_batch_working_set = 0;  // largest number of distinct rows in one batch
  int lookahead = 0;
  std::vector<SimPolicyResult> results;  // policies in option order, capacities ascending

  // {"batches","ids","accesses","unique_rows","max_batch_working_set","lookahead",
  //  "results":[{"policy","capacity","misses","hits","evictions","writebacks","miss_ratio"
  //  (, "peak_rows" for ttl) (, "error" instead of the counts when infeasible)}]}.
  nlohmann::json ToJson() const;
  // Miss-ratio curve as CSV: policy,capacity,misses,accesses,miss_ratio; feasible results
  // only; ttl's point sits at capacity = its peak_rows.
  absl::Status WriteMrc(const std::string& csv_path) const;
  // The trace summary and one line per capacity with the policies side by side.
  std::string Table() const;
};

// Reads `stream` to its end and simulates every (policy, capacity) pair; row ids are
// linearised with the source's schema once the stream is read.
absl::StatusOr<SimResult> Simulate(BatchStream& stream, const SimOptions& options);
// The same on batches in memory.
absl::StatusOr<SimResult> Simulate(const std::vector<Batch>& batches, const Schema& schema,
                                   const SimOptions& options);

}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_SIMULATOR_H_
