// Test support for the planner: running it over a trace, comparing plans, and an independent
// (slow, obviously correct) model of each residency policy's miss counts.
#ifndef BAGPIPE_TESTS_ORACLE_PLANNER_TESTING_H_
#define BAGPIPE_TESTS_ORACLE_PLANNER_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "oracle/planner.h"
#include "tests/oracle/trace_testing.h"

namespace bagpipe::testing {

struct PlannerRun {
  std::vector<std::vector<TrainerPlan>> plans;  // per iteration, per trainer
  std::vector<TrainerPlan> drain;
  PlannerStats stats;
};

// Pushes the trace, popping plans as they are released (as the runtime does), then finishes
// and drains. Fails the test on any error. With `recycle`, also does what the oracle role does
// with memory: hands a copy of every popped plan back (Planner::Recycle) and pushes each batch
// through the buffers the previous Push gave back.
inline PlannerRun RunPlanner(const PlannerOptions& options, const std::vector<Batch>& trace,
                             bool recycle = false) {
  PlannerRun run;
  auto planner = Planner::Create(options);
  EXPECT_TRUE(planner.ok()) << planner.status();
  if (!planner.ok()) return run;
  auto pop_all = [&] {
    while (true) {
      auto popped = (*planner)->Pop();
      EXPECT_TRUE(popped.ok()) << popped.status();
      if (!popped.ok() || !popped->has_value()) return;
      if (recycle) (*planner)->Recycle(**popped);
      run.plans.push_back(std::move(**popped));
    }
  };
  Batch spent;
  for (const Batch& batch : trace) {
    absl::Status status;
    if (recycle) {
      spent.first_sample = batch.first_sample;
      spent.num_samples = batch.num_samples;
      spent.num_dense = batch.num_dense;
      spent.num_tables = batch.num_tables;
      spent.labels.assign(batch.labels.begin(), batch.labels.end());
      spent.dense.assign(batch.dense.begin(), batch.dense.end());
      spent.offsets.assign(batch.offsets.begin(), batch.offsets.end());
      spent.ids.assign(batch.ids.begin(), batch.ids.end());
      status = (*planner)->Push(std::move(spent), &spent);
      EXPECT_TRUE(spent.ids.empty() && spent.offsets.size() == 1);
    } else {
      status = (*planner)->Push(batch);
    }
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) return run;
    pop_all();
  }
  const absl::Status status = (*planner)->Finish();
  EXPECT_TRUE(status.ok()) << status;
  pop_all();
  EXPECT_EQ(run.plans.size(), trace.size());
  auto drain = (*planner)->Drain();
  EXPECT_TRUE(drain.ok()) << drain.status();
  if (drain.ok()) run.drain = std::move(*drain);
  run.stats = (*planner)->stats();
  return run;
}

// The per-iteration misses of one cache fed `demand` (distinct rows per iteration, in
// first-occurrence order), by direct application of the policy's rule:
//   oracle: rows with no use in (i, i+L-1] first, least recently used first (ties: earlier
//           position in the batch of last use), then the furthest next use;
//   lru:    least recently used first (same ties);
//   lfu:    fewest uses since the start first, then as lru;
//   off:    every row is fetched at every use.
inline std::vector<int64_t> ReferenceMisses(const std::vector<std::vector<RowId>>& demand,
                                            CachePolicy policy, int64_t capacity, int lookahead) {
  const Iteration n = static_cast<Iteration>(demand.size());
  struct Info {
    Iteration last_use;
    int64_t pos;
  };
  std::map<RowId, Info> resident;
  std::map<RowId, int64_t> uses;
  std::vector<int64_t> misses(demand.size());
  constexpr Iteration kInf = std::numeric_limits<Iteration>::max();
  for (Iteration i = 0; i < n; ++i) {
    const std::vector<RowId>& d = demand[i];
    const std::set<RowId> now(d.begin(), d.end());
    if (policy == CachePolicy::kOff) {
      misses[i] = static_cast<int64_t>(d.size());
      continue;
    }
    int64_t m = 0;
    for (RowId r : d) m += resident.count(r) == 0 ? 1 : 0;
    misses[i] = m;
    int64_t need = static_cast<int64_t>(resident.size()) + m - capacity;
    if (need > 0) {
      // Eviction key: smaller goes first.
      std::vector<std::tuple<int, Iteration, int64_t, Iteration, int64_t, RowId>> order;
      for (const auto& [r, info] : resident) {
        if (now.count(r)) continue;
        Iteration next = kInf;
        if (policy == CachePolicy::kOracle) {
          for (Iteration j = i + 1; j < std::min(n, i + lookahead); ++j) {
            if (std::find(demand[j].begin(), demand[j].end(), r) != demand[j].end()) {
              next = j;
              break;
            }
          }
        }
        const int64_t u = policy == CachePolicy::kLfu ? uses[r] : 0;
        if (next == kInf) {
          order.emplace_back(0, 0, u, info.last_use, info.pos, r);
        } else {
          order.emplace_back(1, -next, 0, 0, 0, r);
        }
      }
      std::sort(order.begin(), order.end());
      for (int64_t k = 0; k < need; ++k) resident.erase(std::get<5>(order[k]));
    }
    for (size_t p = 0; p < d.size(); ++p) {
      resident[d[p]] = Info{i, static_cast<int64_t>(p)};
      ++uses[d[p]];
    }
  }
  return misses;
}

// The distinct rows of every trainer's shard of every batch: demand[t][i].
inline std::vector<std::vector<std::vector<RowId>>> Demand(const std::vector<Batch>& trace,
                                                           const Schema& schema, int trainers) {
  std::vector<std::vector<std::vector<RowId>>> demand(trainers);
  for (int t = 0; t < trainers; ++t) {
    for (const Batch& batch : trace) {
      demand[t].push_back(DistinctRows(ShardRows(batch, schema, trainers, t)));
    }
  }
  return demand;
}

inline int64_t MaxWorkingSet(const std::vector<Batch>& trace, const Schema& schema, int trainers) {
  int64_t ws = 1;
  for (const auto& per_trainer : Demand(trace, schema, trainers)) {
    for (const auto& d : per_trainer) ws = std::max<int64_t>(ws, static_cast<int64_t>(d.size()));
  }
  return ws;
}

}  // namespace bagpipe::testing

#endif  // BAGPIPE_TESTS_ORACLE_PLANNER_TESTING_H_
