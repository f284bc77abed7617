// Golden digests of the plans for one fixed trace and 1-8 trainers (oracle/plan_digest.h): a
// change that only makes the planner faster must leave every plan byte-identical, whatever the
// trainer count. The digests were recorded with the planner as it was before its cross-trainer
// pass was reorganised around the distinct rows of the global batch. Each run is also checked to
// have done the work the digest vouches for (fills, evictions, write-backs, shared and
// exchanged rows), so that a digest of near-empty plans cannot pass for coverage.
#include "oracle/plan_digest.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "oracle/planner.h"
#include "tests/oracle/planner_testing.h"
#include "tests/oracle/trace_testing.h"

namespace bagpipe {
namespace {

using ::bagpipe::testing::MakeTrace;
using ::bagpipe::testing::MaxWorkingSet;
using ::bagpipe::testing::PlannerRun;
using ::bagpipe::testing::RunPlanner;
using ::bagpipe::testing::TraceSchema;
using ::bagpipe::testing::TraceSpec;

constexpr int kMaxTrainers = 8;

struct Config {
  const char* name;
  CachePolicy policy;
  int64_t extra_capacity = 0;  // rows above the largest per-trainer working set
  int lookahead = 1;
  int emit_lag = 2;
  int64_t horizon = 6;
  bool hashed = false;  // every table's row records hashed, slots recorded at entry
  int split_parts = 1;  // of the tables above 100 rows
};

using Digests = std::array<uint64_t, kMaxTrainers>;  // for 1..8 trainers

// What the plans of one run did, summed over iterations and trainers (the Drain included).
struct Work {
  int64_t fills = 0;
  int64_t evictions = 0;
  int64_t write_backs = 0;
  int64_t shared = 0;
  int64_t exchanged = 0;
  int64_t private_rows = 0;
};

Work Count(const PlannerRun& run) {
  Work w;
  auto add = [&w](const TrainerPlan& p) {
    w.fills += static_cast<int64_t>(p.fills.size());
    for (const Extraction& e : p.extract) {
      w.evictions += e.evict ? 1 : 0;
      w.write_backs += e.write_back ? 1 : 0;
    }
    w.shared += static_cast<int64_t>(p.shared.size());
    w.private_rows += static_cast<int64_t>(p.private_unique.size());
    for (const PeerExchange& e : p.peers) w.exchanged += static_cast<int64_t>(e.send.size());
  };
  for (const auto& plans : run.plans) {
    for (const TrainerPlan& p : plans) add(p);
  }
  for (const TrainerPlan& p : run.drain) add(p);
  return w;
}

TraceSpec Spec() {
  TraceSpec spec;
  spec.table_rows = {20, 300, 4000, 50000};
  spec.batches = 50;
  spec.batch_size = 120;
  spec.last_batch_size = 37;  // a partial last batch, split unevenly for most trainer counts
  spec.alpha = 1.05;
  spec.max_pooling = 2;  // empty, one-hot and two-hot bags
  spec.seed = 22;
  return spec;
}

std::string Hex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void CheckConfig(const Config& c, const Digests& digests) {
  const Schema schema = TraceSchema(Spec());
  const std::vector<Batch> trace = MakeTrace(Spec());
  std::string got;  // the digests this build computes, to paste into the table on purpose
  for (int trainers = 1; trainers <= kMaxTrainers; ++trainers) {
    SCOPED_TRACE(std::string(c.name) + " trainers " + std::to_string(trainers));
    PlannerOptions o;
    o.schema = schema;
    o.num_trainers = trainers;
    o.policy = c.policy;
    o.capacity = MaxWorkingSet(trace, schema, trainers) + c.extra_capacity;
    o.lookahead = c.lookahead;
    o.emit_lag = c.emit_lag;
    o.writeback_horizon = c.horizon;
    if (c.hashed) {
      o.dense_index_max_rows = 0;
      o.capture_min_rows = 0;
    }
    o.split_parts = c.split_parts;
    o.split_min_rows = 100;
    const PlannerRun run = RunPlanner(o, trace);
    ASSERT_EQ(run.plans.size(), trace.size());
    PlanDigest digest;
    for (const auto& plans : run.plans) {
      ASSERT_EQ(static_cast<int>(plans.size()), trainers);
      for (const TrainerPlan& p : plans) digest.Add(p);
    }
    for (const TrainerPlan& p : run.drain) digest.Add(p);
    got += Hex(digest.value()) + ", ";
    EXPECT_EQ(Hex(digest.value()), Hex(digests[trainers - 1]));

    const Work w = Count(run);
    // kDevice holds every row on every trainer: nothing is filled, and with several trainers
    // every touched row is shared.
    if (c.policy != CachePolicy::kDevice) {
      EXPECT_GT(w.fills, 0);
      EXPECT_GT(w.private_rows, 0);
      EXPECT_GT(w.evictions, 0);
      EXPECT_GT(w.write_backs, 0);
    }
    if (trainers > 1) {
      EXPECT_GT(w.shared, 0);
      EXPECT_GT(w.exchanged, 0);
    } else {
      EXPECT_EQ(w.shared, 0);
      EXPECT_EQ(w.exchanged, 0);
    }
  }
  if (::testing::Test::HasFailure()) ADD_FAILURE() << c.name << " digests: {" << got << "}";
}

TEST(PlanDigestTest, OracleLookahead10) {
  CheckConfig(
      {.name = "oracle L10", .policy = CachePolicy::kOracle, .extra_capacity = 40, .lookahead = 10},
      {0x334c9a7a8abee8a6, 0x33ab846fd5f1f5ab, 0x5426adfd94521a78, 0x50f0d400d13026d5,
       0x790abf1591b95f82, 0xfea11ac39c9ff4b7, 0xf35a99e921a6d267, 0x84f967ad7177ee26});
}

TEST(PlanDigestTest, OracleLookahead40HashedRecordsEmitLag3ShortHorizon) {
  CheckConfig({.name = "oracle L40 hashed",
               .policy = CachePolicy::kOracle,
               .extra_capacity = 5,
               .lookahead = 40,
               .emit_lag = 3,
               .horizon = 4,
               .hashed = true},
              {0xc21cbe10c11fe0b7, 0x52f7df962b2bfec3, 0x9c6ff6f18fa5ca52, 0xb30ce9db090f55d2,
               0x8ce9804ff08b2a06, 0xe4070447bd72be60, 0xd7a14dbc76ccec68, 0xecf5d94f54a8fceb});
}

TEST(PlanDigestTest, OracleSplitTables) {
  CheckConfig({.name = "oracle split3",
               .policy = CachePolicy::kOracle,
               .extra_capacity = 15,
               .lookahead = 12,
               .split_parts = 3},
              {0xefb965e4ae205e78, 0x7982e2974e522782, 0xc65ef0f2eb41a753, 0x1de55e7420949b5c,
               0x6991136275b2a45a, 0xea3311fe28e777bc, 0x52b15fa6dbf6a7af, 0xec8778e5d9c157f7});
}

TEST(PlanDigestTest, ReactivePolicies) {
  CheckConfig({.name = "lru", .policy = CachePolicy::kLru, .extra_capacity = 20},
              {0xb0ae7485fb1a6752, 0x945fb51505677efc, 0xdc91de4add24ecab, 0xc6dd3a53368b6647,
               0x66026448ae5df24a, 0xe4bbe4c487ebb01a, 0xf2ba6d37c1efed0c, 0x9e29c078994a6160});
  CheckConfig(
      {.name = "lfu hashed", .policy = CachePolicy::kLfu, .extra_capacity = 20, .hashed = true},
      {0x9db9813ee810dfb9, 0x301ac2ec062014d4, 0xcfb45ac087025af5, 0x4eb42d59c2261f4d,
       0xaf294c8c819e1665, 0xf368ef5bfdeb375b, 0xcf957a6075ee61bb, 0xe3d3fb58670ef001});
  CheckConfig({.name = "off", .policy = CachePolicy::kOff},
              {0x62bf41222f0c628a, 0x94a2127591a97923, 0x802115a70e024161, 0x4e21a294f17657b9,
               0x751806ad52679664, 0xd96fb64e7c3abb22, 0x360326c4ed9f2169, 0xb13c0131eddf9c17});
}

TEST(PlanDigestTest, DeviceMode) {
  CheckConfig({.name = "device", .policy = CachePolicy::kDevice},
              {0x21e06a86f80a3a2d, 0x851375c756578866, 0x3ac744e708eb6beb, 0x28d529263e87a26c,
               0x2d04fe58d9cf32bb, 0xdff807e8c47a23ff, 0xa8a1a58e937b2498, 0xc9b60e1c2d67a090});
}

}  // namespace
}  // namespace bagpipe
