// An independent replay of oracle plans: a tiny simulated "servers + trainer caches" that
// executes extractions, fills and gradient exchanges on integer row versions, and checks that
// the plans keep synchronous-training semantics (plan.h, planner.h).
//
// Row values are (count, sum): `count` = iterations whose update the value includes, `sum` =
// the sum of the contributions Mix64(i, t, row) of every (iteration, trainer) that touched the
// row. The reference value of a row before iteration i includes every touch of iterations < i.
// The replay is adversarial where the contract allows it:
//  - a fill at i is served from the server's state as of stamp max(after_stamp, i - H) (later
//    write-backs are ignored), and a positive after_stamp must name a write-back of that row;
//  - shared-row exchanges not flagged `now` are applied as late as allowed: at the boundary of
//    i + 2, before its extractions.
// It checks, with ADD_FAILURE naming the iteration, trainer and row:
//  - slots: in [0, capacity), a fill never lands in an occupied slot, extractions name the
//    slot's row, each unique row is resident at its planned slot;
//  - the local batch: unique_rows = the shard's distinct rows in first-occurrence order (split
//    tables: part by part, planner.h),
//    unique_index maps every id, labels/dense/offsets = Batch::Slice of the shard;
//  - values: every row read at i and every write-back at boundary i carries every update of
//    iterations < i; every write-back brings the server something new (no redundant write-back)
//    and no row is evicted by its last holder with updates the server lacks (none lost);
//  - sync lists: private_unique = rows the trainer alone holds, shared = touched rows held by
//    >= 2 trainers in RowId order with correct slots and own_unique, peer lists exact;
//  - after Drain: no trainer holds anything and the servers equal the reference.
#ifndef BAGPIPE_TESTS_ORACLE_PLAN_REPLAY_H_
#define BAGPIPE_TESTS_ORACLE_PLAN_REPLAY_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "data/batch.h"
#include "data/schema.h"
#include "gtest/gtest.h"
#include "oracle/plan.h"
#include "oracle/planner.h"
#include "tests/oracle/trace_testing.h"

namespace bagpipe::testing {

struct RowValue {
  int64_t count = 0;
  uint64_t sum = 0;
  bool operator==(const RowValue& o) const = default;
};

inline std::string Describe(const RowValue& v) {
  return absl::StrCat("{count ", v.count, ", sum ", v.sum, "}");
}

class PlanReplay {
 public:
  struct Options {
    Schema schema;
    int trainers = 1;
    int64_t capacity = 0;
    int64_t horizon = 0;
    bool device = false;  // every row resident everywhere at slot RowId from the start
    bool build_batch = true;
    // PlannerOptions::split_parts and split_min_rows (one trainer): unique_rows lists a split
    // table's rows part by part.
    int split_parts = 1;
    int64_t split_min_rows = 0;
  };

  explicit PlanReplay(Options options) : o_(std::move(options)), caches_(o_.trainers) {}

  // Executes the plans of iteration `batch` index `i` (one per trainer, trainer order).
  void Step(const Batch& batch, Iteration i, const std::vector<TrainerPlan>& plans) {
    ASSERT_EQ(plans.size(), static_cast<size_t>(o_.trainers)) << "iteration " << i;
    ASSERT_EQ(i, next_) << "iterations out of order";
    ++next_;
    for (int t = 0; t < o_.trainers; ++t) {
      ASSERT_EQ(plans[t].iteration, i);
      ASSERT_EQ(plans[t].trainer, t);
      ASSERT_EQ(plans[t].num_trainers, o_.trainers);
    }
    Boundary(i, plans);
    if (::testing::Test::HasFatalFailure()) return;

    // The shards and their distinct rows, computed here from the raw batch.
    std::vector<std::vector<RowId>> distinct(o_.trainers);
    std::map<RowId, uint64_t> touchers;
    for (int t = 0; t < o_.trainers; ++t) {
      distinct[t] = DistinctRows(ShardRows(batch, o_.schema, o_.trainers, t));
      if (o_.trainers == 1 && o_.split_parts > 1 && !o_.device) SplitOrder(distinct[t]);
      for (RowId r : distinct[t]) touchers[r] |= uint64_t{1} << t;
      CheckLocalBatch(batch, i, t, plans[t], distinct[t]);
      if (::testing::Test::HasFatalFailure()) return;
    }

    // Compute: every row read carries every update of iterations < i.
    for (int t = 0; t < o_.trainers; ++t) {
      const TrainerPlan& plan = plans[t];
      for (size_t p = 0; p < plan.unique_rows.size(); ++p) {
        const RowId r = plan.unique_rows[p];
        const RowValue v = Read(t, plan.unique_slots[p], r, i, "read");
        EXPECT_EQ(v, reference_[r])
            << "iteration " << i << ", trainer " << t << ": row " << r << " read " << Describe(v)
            << ", expected " << Describe(reference_[r]);
      }
    }

    // Sync: expected lists, then the exchange, then the reference update.
    std::map<RowId, RowValue> delta;
    for (const auto& [r, mask] : touchers) {
      RowValue d{1, 0};
      for (int t = 0; t < o_.trainers; ++t) {
        if (mask & (uint64_t{1} << t)) d.sum += Contribution(i, t, r);
      }
      delta[r] = d;
    }
    for (int t = 0; t < o_.trainers; ++t) CheckSyncLists(i, t, plans, touchers);
    if (::testing::Test::HasFailure()) return;
    for (int t = 0; t < o_.trainers; ++t) {
      const TrainerPlan& plan = plans[t];
      for (int32_t p : plan.private_unique) {
        const RowId r = plan.unique_rows[p];
        Cache(t).slots[plan.unique_slots[p]].value.count += 1;
        Cache(t).slots[plan.unique_slots[p]].value.sum += Contribution(i, t, r);
      }
      // Messages: what each peer sends this trainer, in the peer's send order.
      std::vector<RowValue> update(plan.shared.size());
      for (size_t j = 0; j < plan.shared.size(); ++j) {
        update[j].count = 1;
        if (plan.shared[j].own_unique >= 0) update[j].sum += Contribution(i, t, plan.shared[j].row);
      }
      for (const PeerExchange& ex : plan.peers) {
        const TrainerPlan& peer = plans[ex.peer];
        const PeerExchange* back = nullptr;
        for (const PeerExchange& e : peer.peers) {
          if (e.peer == t) back = &e;
        }
        ASSERT_NE(back, nullptr) << "iteration " << i << ": trainer " << t << " exchanges with "
                                 << ex.peer << " but not the other way";
        ASSERT_EQ(back->send.size(), ex.recv.size())
            << "iteration " << i << ": trainer " << ex.peer << " sends " << back->send.size()
            << " rows to " << t << ", which expects " << ex.recv.size();
        for (size_t k = 0; k < ex.recv.size(); ++k) {
          const RowId sent = peer.shared[back->send[k]].row;
          ASSERT_EQ(sent, plan.shared[ex.recv[k]].row)
              << "iteration " << i << ": message " << ex.peer << " -> " << t << " position " << k;
          update[ex.recv[k]].sum += Contribution(i, ex.peer, sent);
        }
      }
      for (size_t j = 0; j < plan.shared.size(); ++j) {
        const SharedRow& s = plan.shared[j];
        EXPECT_EQ(update[j], delta[s.row])
            << "iteration " << i << ", trainer " << t << ": shared row " << s.row
            << " gets an update other than the sum of its touchers' gradients";
        Pending pending{i + 2, t, s.slot, s.row, update[j]};
        if (s.now) {
          Apply(pending);
        } else {
          pending_.push_back(pending);
        }
      }
    }
    for (const auto& [r, d] : delta) {
      reference_[r].count += d.count;
      reference_[r].sum += d.sum;
    }
  }

  // Executes the Drain plans (boundary `end`) and checks the final state.
  void Finish(Iteration end, const std::vector<TrainerPlan>& plans) {
    ASSERT_EQ(plans.size(), static_cast<size_t>(o_.trainers));
    for (const TrainerPlan& plan : plans) {
      ASSERT_EQ(plan.iteration, end);
      EXPECT_TRUE(plan.fills.empty());
      EXPECT_TRUE(plan.unique_rows.empty());
    }
    ASSERT_EQ(end, next_);
    Boundary(end, plans);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_TRUE(pending_.empty()) << pending_.size() << " exchanges never applied";
    if (!o_.device) {
      for (int t = 0; t < o_.trainers; ++t) {
        EXPECT_TRUE(caches_[t].slots.empty())
            << "trainer " << t << " still holds " << caches_[t].slots.size() << " rows";
      }
    }
    for (const auto& [r, v] : reference_) {
      const RowValue server = ServerValue(r, end);
      EXPECT_EQ(server, v) << "row " << r << ": server ends with " << Describe(server)
                           << ", reference " << Describe(v);
    }
  }

  int64_t write_backs() const { return write_backs_; }
  int64_t flushes() const { return flushes_; }

 private:
  struct Replica {
    RowId row;
    RowValue value;
  };
  struct TrainerState {
    std::map<SlotId, Replica> slots;
    std::map<RowId, SlotId> where;
  };
  struct Pending {
    Iteration due;  // applied at the boundary of `due`, before its extractions
    int trainer;
    SlotId slot;
    RowId row;
    RowValue delta;
  };

  static uint64_t Contribution(Iteration i, int t, RowId r) {
    return HashKey(0x67726164ULL, static_cast<uint64_t>(i), static_cast<uint64_t>(t), r);
  }

  TrainerState& Cache(int t) { return caches_[t]; }

  // kDevice replicas exist from the start: materialise on first access.
  void Materialise(int t, SlotId slot) {
    if (!o_.device) return;
    TrainerState& c = caches_[t];
    if (c.slots.count(slot) == 0 && device_evicted_[t].count(slot) == 0) {
      c.slots[slot] = Replica{static_cast<RowId>(slot), RowValue{}};
      c.where[static_cast<RowId>(slot)] = slot;
    }
  }

  bool Holds(int t, RowId r) {
    if (o_.device) return device_evicted_[t].count(static_cast<SlotId>(r)) == 0;
    return caches_[t].where.count(r) != 0;
  }

  RowValue Read(int t, SlotId slot, RowId r, Iteration i, const char* what) {
    Materialise(t, slot);
    auto it = caches_[t].slots.find(slot);
    if (it == caches_[t].slots.end()) {
      ADD_FAILURE() << "iteration " << i << ", trainer " << t << ": " << what << " of row " << r
                    << " from empty slot " << slot;
      return {};
    }
    if (it->second.row != r) {
      ADD_FAILURE() << "iteration " << i << ", trainer " << t << ": " << what << " of row " << r
                    << " from slot " << slot << ", which holds row " << it->second.row;
    }
    return it->second.value;
  }

  void Apply(const Pending& p) {
    Materialise(p.trainer, p.slot);
    auto it = caches_[p.trainer].slots.find(p.slot);
    if (it == caches_[p.trainer].slots.end() || it->second.row != p.row) {
      ADD_FAILURE() << "trainer " << p.trainer << ": an exchange for row " << p.row
                    << " finds slot " << p.slot << " no longer holding it";
      return;
    }
    it->second.value.count += p.delta.count;
    it->second.value.sum += p.delta.sum;
  }

  // The server's value of `r` as of stamp `stamp`: its latest write-back stamped <= stamp.
  RowValue ServerValue(RowId r, Iteration stamp) const {
    RowValue v;
    auto it = server_.find(r);
    if (it == server_.end()) return v;
    for (const auto& [s, value] : it->second) {
      if (s <= stamp) v = value;
    }
    return v;
  }

  void Boundary(Iteration i, const std::vector<TrainerPlan>& plans) {
    // Deferred exchanges of i - 2 complete before this boundary's extractions.
    std::vector<Pending> later;
    for (const Pending& p : pending_) {
      if (p.due <= i) {
        Apply(p);
      } else {
        later.push_back(p);
      }
    }
    pending_ = std::move(later);

    std::set<std::pair<RowId, Iteration>> stamps;
    std::set<RowId> evicted;
    for (int t = 0; t < o_.trainers; ++t) {
      for (const Extraction& e : plans[t].extract) {
        const RowValue v = Read(t, e.slot, e.row, i, e.evict ? "eviction" : "flush");
        if (::testing::Test::HasFailure()) return;
        if (e.write_back) {
          EXPECT_EQ(v, reference_[e.row])
              << "iteration " << i << ", trainer " << t << ": write-back of row " << e.row
              << " carries " << Describe(v) << ", expected " << Describe(reference_[e.row]);
          EXPECT_TRUE(stamps.insert({e.row, i}).second)
              << "iteration " << i << ": row " << e.row << " written back twice";
          const RowValue server = ServerValue(e.row, i);
          EXPECT_GT(v.count, server.count) << "iteration " << i << ", trainer " << t
                                           << ": redundant write-back of row " << e.row;
          server_[e.row].emplace_back(i, v);
          ++write_backs_;
          if (!e.evict) ++flushes_;
        } else {
          EXPECT_TRUE(e.evict) << "iteration " << i << ": extraction that neither evicts nor "
                               << "writes back (row " << e.row << ")";
        }
        if (e.evict) {
          caches_[t].slots.erase(e.slot);
          caches_[t].where.erase(e.row);
          if (o_.device) device_evicted_[t].insert(e.slot);
          evicted.insert(e.row);
        }
      }
    }
    // No update is lost: a row nobody holds any more is current on its server.
    for (RowId r : evicted) {
      bool held = false;
      for (int t = 0; t < o_.trainers; ++t) held |= Holds(t, r);
      if (!held) {
        EXPECT_EQ(ServerValue(r, i), reference_[r])
            << "iteration " << i << ": row " << r << " evicted everywhere with updates lost";
      }
    }
    for (int t = 0; t < o_.trainers; ++t) {
      for (const Fill& f : plans[t].fills) {
        ASSERT_GE(f.slot, 0) << "iteration " << i << ", trainer " << t;
        ASSERT_LT(f.slot, o_.capacity)
            << "iteration " << i << ", trainer " << t << ": slot beyond capacity";
        ASSERT_EQ(caches_[t].slots.count(f.slot), 0u)
            << "iteration " << i << ", trainer " << t << ": fill of row " << f.row
            << " into occupied slot " << f.slot;
        ASSERT_EQ(caches_[t].where.count(f.row), 0u)
            << "iteration " << i << ", trainer " << t << ": row " << f.row
            << " filled while already resident";
        ASSERT_LE(f.after_stamp, i);
        if (f.after_stamp >= 0) {
          bool exists = false;
          for (const auto& [s, value] : server_[f.row]) exists |= s == f.after_stamp;
          EXPECT_TRUE(exists) << "iteration " << i << ", trainer " << t << ": fill of row " << f.row
                              << " waits for write-back stamp " << f.after_stamp
                              << ", which is never sent";
        }
        const RowValue served = ServerValue(f.row, std::max(f.after_stamp, i - o_.horizon));
        EXPECT_EQ(served, reference_[f.row])
            << "iteration " << i << ", trainer " << t << ": fill of row " << f.row
            << " (after_stamp " << f.after_stamp << ") is served " << Describe(served)
            << ", expected " << Describe(reference_[f.row]);
        caches_[t].slots[f.slot] = Replica{f.row, served};
        caches_[t].where[f.row] = f.slot;
      }
      if (!o_.device) {
        EXPECT_LE(static_cast<int64_t>(caches_[t].slots.size()), o_.capacity);
      }
    }
  }

  // Distinct rows in the planner's order for split tables: by table, a split table's rows by
  // part (planner.h SplitTablePart), first-occurrence order within a part.
  void SplitOrder(std::vector<RowId>& rows) const {
    const std::vector<RowId> offsets = o_.schema.TableOffsets();
    auto key = [&](RowId r) {
      const int table = static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), r) -
                                         offsets.begin() - 1);
      const int64_t id = r - offsets[table];
      const bool split = o_.schema.table_rows[table] > o_.split_min_rows;
      return std::pair<int, int>(table, split ? SplitTablePart(id, o_.split_parts) : 0);
    };
    std::stable_sort(rows.begin(), rows.end(), [&](RowId a, RowId b) { return key(a) < key(b); });
  }

  void CheckLocalBatch(const Batch& batch, Iteration i, int t, const TrainerPlan& plan,
                       const std::vector<RowId>& distinct) {
    ASSERT_EQ(plan.unique_rows, distinct) << "iteration " << i << ", trainer " << t;
    ASSERT_EQ(plan.unique_slots.size(), distinct.size());
    const ShardRange range = ShardOf(batch.num_samples, o_.trainers, t);
    EXPECT_EQ(plan.first_sample, batch.first_sample + range.begin);
    EXPECT_EQ(plan.num_samples, range.end - range.begin);
    EXPECT_EQ(plan.global_samples, batch.num_samples);
    EXPECT_EQ(plan.num_tables, batch.num_tables);
    if (!o_.build_batch) return;
    const Batch shard = batch.Slice(range.begin, range.end);
    EXPECT_EQ(plan.labels, shard.labels);
    EXPECT_EQ(plan.dense, shard.dense);
    EXPECT_EQ(plan.offsets, shard.offsets);
    const std::vector<RowId> rows = ShardRows(batch, o_.schema, o_.trainers, t);
    ASSERT_EQ(plan.unique_index.size(), rows.size());
    for (size_t j = 0; j < rows.size(); ++j) {
      ASSERT_LT(plan.unique_index[j], plan.unique_rows.size());
      ASSERT_EQ(plan.unique_rows[plan.unique_index[j]], rows[j]) << "id occurrence " << j;
    }
  }

  void CheckSyncLists(Iteration i, int t, const std::vector<TrainerPlan>& plans,
                      const std::map<RowId, uint64_t>& touchers) {
    const TrainerPlan& plan = plans[t];
    std::map<RowId, int32_t> own;
    for (size_t p = 0; p < plan.unique_rows.size(); ++p) {
      own[plan.unique_rows[p]] = static_cast<int32_t>(p);
    }
    auto holders = [&](RowId r) {
      uint64_t mask = 0;
      for (int u = 0; u < o_.trainers; ++u) {
        if (Holds(u, r)) mask |= uint64_t{1} << u;
      }
      return mask;
    };
    std::vector<int32_t> expected_private;
    std::vector<RowId> expected_shared;
    for (const auto& [r, mask] : touchers) {
      const uint64_t h = holders(r);
      if (!(h & (uint64_t{1} << t))) continue;
      if (h == (uint64_t{1} << t)) {
        expected_private.push_back(own.at(r));
      } else {
        expected_shared.push_back(r);
      }
    }
    std::sort(expected_private.begin(), expected_private.end());
    std::vector<int32_t> got_private = plan.private_unique;
    std::sort(got_private.begin(), got_private.end());
    EXPECT_EQ(got_private, expected_private) << "iteration " << i << ", trainer " << t;
    ASSERT_EQ(plan.shared.size(), expected_shared.size())
        << "iteration " << i << ", trainer " << t << ": shared rows";
    std::map<int, std::pair<std::vector<int32_t>, std::vector<int32_t>>> expected_peers;
    for (size_t j = 0; j < expected_shared.size(); ++j) {
      const RowId r = expected_shared[j];
      const SharedRow& s = plan.shared[j];
      ASSERT_EQ(s.row, r) << "iteration " << i << ", trainer " << t << ": shared entry " << j;
      if (o_.device) {
        EXPECT_EQ(s.slot, static_cast<SlotId>(r));
      } else {
        ASSERT_EQ(caches_[t].where.count(r), 1u);
        EXPECT_EQ(s.slot, caches_[t].where[r]);
      }
      const auto it = own.find(r);
      EXPECT_EQ(s.own_unique, it == own.end() ? -1 : it->second);
      const uint64_t h = holders(r);
      const uint64_t touch = touchers.at(r);
      for (int p = 0; p < o_.trainers; ++p) {
        if (p == t) continue;
        if ((touch & (uint64_t{1} << t)) && (h & (uint64_t{1} << p))) {
          expected_peers[p].first.push_back(static_cast<int32_t>(j));
        }
        if (touch & (uint64_t{1} << p)) expected_peers[p].second.push_back(static_cast<int32_t>(j));
      }
    }
    std::vector<PeerExchange> expected;
    for (auto& [p, lists] : expected_peers) {
      if (lists.first.empty() && lists.second.empty()) continue;
      expected.push_back(PeerExchange{p, lists.first, lists.second});
    }
    ASSERT_EQ(plan.peers.size(), expected.size()) << "iteration " << i << ", trainer " << t;
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ(plan.peers[k].peer, expected[k].peer);
      EXPECT_EQ(plan.peers[k].send, expected[k].send)
          << "iteration " << i << ", trainer " << t << " -> " << expected[k].peer;
      EXPECT_EQ(plan.peers[k].recv, expected[k].recv)
          << "iteration " << i << ", trainer " << t << " <- " << expected[k].peer;
    }
  }

  Options o_;
  std::vector<TrainerState> caches_;
  std::vector<std::set<SlotId>> device_evicted_ = std::vector<std::set<SlotId>>(64);
  std::map<RowId, std::vector<std::pair<Iteration, RowValue>>> server_;
  std::map<RowId, RowValue> reference_;
  std::vector<Pending> pending_;
  Iteration next_ = 0;
  int64_t write_backs_ = 0;
  int64_t flushes_ = 0;
};

}  // namespace bagpipe::testing

#endif  // BAGPIPE_TESTS_ORACLE_PLAN_REPLAY_H_
