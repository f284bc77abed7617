// Specifications of the cache-policy simulator (oracle/simulator.h): each policy against an
// independent straightforward implementation of its rule, and the output formats.
#include "oracle/simulator.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/source.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/oracle/planner_testing.h"
#include "tests/oracle/trace_testing.h"

namespace bagpipe {
namespace {

using ::bagpipe::testing::Demand;
using ::bagpipe::testing::MakeTrace;
using ::bagpipe::testing::MaxWorkingSet;
using ::bagpipe::testing::ReferenceMisses;
using ::bagpipe::testing::TraceSchema;
using ::bagpipe::testing::TraceSpec;
using ::testing::HasSubstr;

struct Trace {
  std::vector<Batch> batches;
  Schema schema;
  std::vector<std::vector<RowId>> demand;  // distinct rows per batch
};

Trace MakeSimTrace(uint64_t seed, double alpha, int batches = 60) {
  TraceSpec spec;
  spec.table_rows = {50, 400, 2000};
  spec.batches = batches;
  spec.batch_size = 20;
  spec.alpha = alpha;
  spec.max_pooling = 2;
  spec.seed = seed;
  Trace t;
  t.batches = MakeTrace(spec);
  t.schema = TraceSchema(spec);
  t.demand = Demand(t.batches, t.schema, 1)[0];
  return t;
}

const SimPolicyResult& Find(const SimResult& result, const std::string& policy, int64_t capacity) {
  for (const SimPolicyResult& r : result.results) {
    if (r.policy == policy && (policy == "ttl" || r.capacity == capacity)) return r;
  }
  ADD_FAILURE() << "no result for " << policy << " at " << capacity;
  static const SimPolicyResult kNone;
  return kNone;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// ttl read literally: at a use at i the expiry becomes the last use within [i, i+L-1]; rows
// expired before i are evicted at i.
struct TtlCounts {
  int64_t misses = 0;
  int64_t evictions = 0;
  int64_t peak = 0;
};
TtlCounts LiteralTtl(const std::vector<std::vector<RowId>>& demand, int lookahead) {
  TtlCounts c;
  std::map<RowId, int64_t> expiry;
  const int64_t n = static_cast<int64_t>(demand.size());
  for (int64_t i = 0; i < n; ++i) {
    for (auto it = expiry.begin(); it != expiry.end();) {
      if (it->second < i) {
        it = expiry.erase(it);
        ++c.evictions;
      } else {
        ++it;
      }
    }
    for (RowId r : demand[i]) {
      if (expiry.count(r) == 0) ++c.misses;
      int64_t last = i;
      for (int64_t j = i; j < std::min(n, i + lookahead); ++j) {
        for (RowId x : demand[j]) {
          if (x == r) last = j;
        }
      }
      expiry[r] = last;
    }
    c.peak = std::max<int64_t>(c.peak, static_cast<int64_t>(expiry.size()));
  }
  return c;
}

// lru-32way read literally: per set a list of (row, last use); look up the batch, then insert
// its misses into lines the batch does not use (empty lines first, then least recently used).
int64_t LiteralSetAssociative(const std::vector<std::vector<RowId>>& demand, int64_t capacity) {
  const int64_t sets = capacity / 32;
  std::map<int64_t, std::vector<std::pair<RowId, int64_t>>> lines;
  int64_t misses = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(demand.size()); ++i) {
    std::vector<RowId> missed;
    for (RowId r : demand[i]) {
      auto& set = lines[static_cast<int64_t>(Mix64(r) % sets)];
      bool hit = false;
      for (auto& [row, last] : set) {
        if (row == r) {
          last = i;
          hit = true;
        }
      }
      if (!hit) missed.push_back(r);
    }
    misses += static_cast<int64_t>(missed.size());
    for (RowId r : missed) {
      auto& set = lines[static_cast<int64_t>(Mix64(r) % sets)];
      if (set.size() < 32) {
        set.emplace_back(r, i);
        continue;
      }
      auto victim = set.end();
      for (auto it = set.begin(); it != set.end(); ++it) {
        if (it->second < i && (victim == set.end() || it->second < victim->second)) victim = it;
      }
      if (victim != set.end()) *victim = {r, i};
    }
  }
  return misses;
}

TEST(SimulatorTest, OracleWithTheWholeTraceInViewMatchesBelady) {
  for (uint64_t seed : {1, 2, 3}) {
    const Trace t = MakeSimTrace(seed, seed == 3 ? 0.0 : 1.1);
    const int64_t ws = MaxWorkingSet(t.batches, t.schema, 1);
    SimOptions options;
    options.capacities = {ws, ws + 10, 2 * ws, 4 * ws};
    options.lookahead = static_cast<int>(t.batches.size());
    options.policies = {"oracle", "belady"};
    auto result = Simulate(t.batches, t.schema, options);
    ASSERT_TRUE(result.ok()) << result.status();
    for (int64_t capacity : options.capacities) {
      EXPECT_EQ(Find(*result, "oracle", capacity).misses, Find(*result, "belady", capacity).misses)
          << "seed " << seed << " capacity " << capacity;
    }
  }
}

TEST(SimulatorTest, ShorterLookaheadsNeverBeatBeladyAndEveryPolicyPaysTheColdMisses) {
  const Trace t = MakeSimTrace(11, 1.05);
  const int64_t ws = MaxWorkingSet(t.batches, t.schema, 1);
  SimOptions options;
  options.capacities = {ws, 3 * ws};
  options.lookahead = 4;
  auto result = Simulate(t.batches, t.schema, options);
  ASSERT_TRUE(result.ok()) << result.status();
  for (const SimPolicyResult& r : result->results) {
    ASSERT_TRUE(r.error.empty()) << r.policy << ": " << r.error;
    EXPECT_GE(r.misses, result->unique_rows) << r.policy;
    EXPECT_EQ(r.hits + r.misses, result->accesses) << r.policy;
    EXPECT_EQ(r.writebacks, r.evictions) << r.policy;
    if (r.policy != "ttl") {
      EXPECT_GE(r.misses, Find(*result, "belady", r.capacity).misses) << r.policy;
    }
  }
}

TEST(SimulatorTest, ReactivePoliciesMatchTheirRules) {
  const Trace t = MakeSimTrace(5, 1.0);
  const int64_t ws = MaxWorkingSet(t.batches, t.schema, 1);
  SimOptions options;
  options.capacities = {ws, ws + 17, 5 * ws};
  options.lookahead = 6;
  options.policies = {"oracle", "lru", "lfu"};
  auto result = Simulate(t.batches, t.schema, options);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int64_t capacity : options.capacities) {
    EXPECT_EQ(Find(*result, "lru", capacity).misses,
              Sum(ReferenceMisses(t.demand, CachePolicy::kLru, capacity, 1)));
    EXPECT_EQ(Find(*result, "lfu", capacity).misses,
              Sum(ReferenceMisses(t.demand, CachePolicy::kLfu, capacity, 1)));
    EXPECT_EQ(Find(*result, "oracle", capacity).misses,
              Sum(ReferenceMisses(t.demand, CachePolicy::kOracle, capacity, 6)));
  }
}

TEST(SimulatorTest, TtlMatchesTheLiteralRule) {
  for (int lookahead : {1, 3, 10}) {
    const Trace t = MakeSimTrace(21 + lookahead, 1.1, 40);
    SimOptions options;
    options.lookahead = lookahead;
    options.policies = {"ttl"};
    auto result = Simulate(t.batches, t.schema, options);
    ASSERT_TRUE(result.ok()) << result.status();
    const TtlCounts expected = LiteralTtl(t.demand, lookahead);
    const SimPolicyResult& ttl = Find(*result, "ttl", 0);
    EXPECT_EQ(ttl.misses, expected.misses) << "L " << lookahead;
    EXPECT_EQ(ttl.evictions, expected.evictions) << "L " << lookahead;
    EXPECT_EQ(ttl.peak_rows, expected.peak) << "L " << lookahead;
  }
}

TEST(SimulatorTest, SetAssociativeLruMatchesItsRule) {
  const Trace t = MakeSimTrace(31, 0.9);
  SimOptions options;
  // More sets than the trace's distinct rows (the last two capacities) places only the sets the
  // trace touches: the same counts, and 2^31 - 1 rows of capacity take no 32 GiB.
  options.capacities = {32, 64, 320, 4096, 32 * 4096, std::numeric_limits<int32_t>::max()};
  options.policies = {"lru-32way"};
  auto result = Simulate(t.batches, t.schema, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_LT(result->unique_rows, 4096);
  for (int64_t capacity : options.capacities) {
    EXPECT_EQ(Find(*result, "lru-32way", capacity).misses,
              LiteralSetAssociative(t.demand, capacity))
        << "capacity " << capacity;
  }
}

TEST(SimulatorTest, ReportsTraceFiguresAndInfeasibleCapacities) {
  // Two batches of one table: {1, 2, 2}, {2, 3}.
  Schema schema;
  schema.table_names = {"t"};
  schema.table_rows = {10};
  std::vector<Batch> batches(2);
  batches[0].Reset(0, 1);
  batches[0].num_samples = 3;
  batches[0].ids = {1, 2, 2};
  batches[0].offsets = {0, 1, 2, 3};
  batches[1].Reset(0, 1);
  batches[1].num_samples = 1;
  batches[1].ids = {2, 3};
  batches[1].offsets = {0, 2};
  SimOptions options;
  options.capacities = {1, 2, 40};
  options.lookahead = 2;
  auto result = Simulate(batches, schema, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->batches, 2);
  EXPECT_EQ(result->ids, 5);
  EXPECT_EQ(result->accesses, 4);
  EXPECT_EQ(result->unique_rows, 3);
  EXPECT_EQ(result->max_batch_working_set, 2);
  EXPECT_THAT(Find(*result, "oracle", 1).error, HasSubstr("below the largest batch working set"));
  EXPECT_THAT(Find(*result, "lru-32way", 2).error, HasSubstr("below one set of 32 ways"));
  EXPECT_EQ(Find(*result, "belady", 2).misses, 3);
  EXPECT_EQ(Find(*result, "lru-32way", 40).misses, 3);

  const nlohmann::json json = result->ToJson();
  EXPECT_EQ(json["batches"], 2);
  EXPECT_EQ(json["unique_rows"], 3);
  EXPECT_EQ(json["max_batch_working_set"], 2);
  ASSERT_TRUE(json["results"].is_array());
  bool saw_ttl = false;
  for (const nlohmann::json& r : json["results"]) {
    ASSERT_TRUE(r.contains("policy"));
    if (r.contains("error")) {
      EXPECT_FALSE(r.contains("misses"));
      continue;
    }
    for (const char* key : {"capacity", "misses", "hits", "evictions", "writebacks"}) {
      EXPECT_TRUE(r.contains(key)) << key;
    }
    if (r["policy"] == "ttl") {
      saw_ttl = true;
      EXPECT_EQ(r["peak_rows"], 2);
      EXPECT_TRUE(r["capacity"].is_null());
    }
  }
  EXPECT_TRUE(saw_ttl);

  const std::string table = result->Table();
  for (const char* fragment : {"oracle", "belady", "lru-32way", "too small", "peak 2 resident"}) {
    EXPECT_THAT(table, HasSubstr(fragment));
  }

  const std::string path = std::string(BAGPIPE_BINARY_DIR) + "/oracle_simulator_test_mrc.csv";
  ASSERT_TRUE(result->WriteMrc(path).ok());
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  std::remove(path.c_str());
  const std::string csv = content.str();
  EXPECT_THAT(csv, ::testing::StartsWith("policy,capacity,misses,accesses,miss_ratio\n"));
  EXPECT_THAT(csv, HasSubstr("belady,2,3,4,0.750000\n"));
  EXPECT_THAT(csv, HasSubstr("ttl,2,3,4,0.750000\n"));
  EXPECT_THAT(csv, ::testing::Not(HasSubstr("oracle,1,")));
}

TEST(SimulatorTest, ReadsAStreamOnceAndAgreesWithTheBatchesInMemory) {
  SyntheticConfig config;
  config.samples = 3000;
  config.table_rows = {100, 5000, 40000};
  config.pooling_max = 2;
  config.seed = 9;
  auto source = OpenSynthetic(config, SourceOptions{});
  ASSERT_TRUE(source.ok()) << source.status();
  const Schema schema = (*source)->schema();
  BatchStream stream(std::move(*source), BatchStream::Options{.batch_size = 128});
  SimOptions options;
  options.capacities = {2000, 8000};
  options.lookahead = 5;
  auto streamed = Simulate(stream, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status();

  auto again = OpenSynthetic(config, SourceOptions{});
  ASSERT_TRUE(again.ok());
  std::vector<Batch> batches;
  Batch batch;
  while (true) {
    auto read = (*again)->Read(128, &batch);
    ASSERT_TRUE(read.ok()) << read.status();
    if (*read == 0) break;
    batches.push_back(batch);
  }
  auto in_memory = Simulate(batches, schema, options);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  EXPECT_EQ(streamed->ToJson(), in_memory->ToJson());
  EXPECT_EQ(streamed->batches, 24);
}

TEST(SimulatorTest, RejectsBadOptions) {
  const Trace t = MakeSimTrace(41, 1.0, 5);
  SimOptions options;
  options.capacities = {100};
  options.policies = {"fifo"};
  EXPECT_THAT(std::string(Simulate(t.batches, t.schema, options).status().message()),
              HasSubstr("unknown simulator policy \"fifo\""));
  options.policies = {"lru"};
  options.capacities = {};
  EXPECT_FALSE(Simulate(t.batches, t.schema, options).ok());
  options.capacities = {100};
  options.lookahead = 0;
  EXPECT_FALSE(Simulate(t.batches, t.schema, options).ok());
  SimResult empty;
  EXPECT_FALSE(empty.WriteMrc("/nonexistent-dir/mrc.csv").ok());
}

}  // namespace
}  // namespace bagpipe
