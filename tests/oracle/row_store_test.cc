// The planner's row containers (oracle/row_store.h) against std::map under random churn.
#include "oracle/row_store.h"

#include <cstdint>
#include <map>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "oracle/huge_pages.h"

namespace bagpipe::oracle_internal {
namespace {

struct Record {
  int64_t value = -1;
  static Record Absent() { return Record{}; }
  bool present() const { return value >= 0; }
};

// Random inserts, updates and erasures over a key space much larger than the live set, as the
// planner's sliding window does; every state is compared with std::map.
void Churn(int64_t table_rows, int64_t dense_max_rows, uint64_t seed) {
  RowTable<Record> table;
  table.Init(table_rows, dense_max_rows);
  std::map<int64_t, int64_t> reference;
  CounterRng rng(seed);
  for (int step = 0; step < 200000; ++step) {
    // Keys cluster (a hot range) so that probe sequences collide and wrap around.
    const int64_t id = rng.NextBelow(4) == 0 ? static_cast<int64_t>(rng.NextBelow(64))
                                             : static_cast<int64_t>(rng.NextBelow(table_rows));
    const uint64_t op = rng.NextBelow(10);
    if (op < 5) {
      bool inserted;
      Record& r = table.FindOrInsert(id, &inserted);
      ASSERT_EQ(inserted, reference.count(id) == 0) << "step " << step << " id " << id;
      if (inserted) table.CountInsert();
      r.value = step;
      reference[id] = step;
    } else if (op < 8) {
      table.Erase(id);
      reference.erase(id);
    } else {
      const Record* r = table.Find(id);
      const auto it = reference.find(id);
      ASSERT_EQ(r != nullptr, it != reference.end()) << "step " << step << " id " << id;
      if (r != nullptr) ASSERT_EQ(r->value, it->second);
    }
    ASSERT_EQ(table.size(), static_cast<int64_t>(reference.size()));
  }
  for (const auto& [id, value] : reference) {
    const Record* r = table.Find(id);
    ASSERT_NE(r, nullptr) << id;
    EXPECT_EQ(r->value, value);
  }
}

TEST(RowTableTest, HashFormMatchesAMapUnderChurn) { Churn(1 << 20, 0, 1); }
TEST(RowTableTest, HashFormWrapsAroundInASmallKeySpace) { Churn(3000, 0, 2); }
TEST(RowTableTest, DenseFormMatchesAMapUnderChurn) { Churn(5000, 1 << 20, 3); }

TEST(RowTableTest, ReserveKeepsRecordsInPlace) {
  RowTable<Record> table;
  table.Init(int64_t{1} << 40, 0);
  table.Reserve(5000);
  bool inserted;
  Record* first = &table.FindOrInsert(7, &inserted);
  first->value = 1;
  for (int64_t id = 100; id < 5099; ++id) table.FindOrInsert(id * 977, &inserted).value = id;
  EXPECT_EQ(table.Find(7), first);
  EXPECT_EQ(table.size(), 5000);
}

// The hot-loop views (what the planner's Link uses): batches of lookups and insertions through
// DenseRecords / HashedRecords, counted with CountInserts, between erasures through the table,
// leave it as a map would.
TEST(RowTableTest, ViewsFindAndInsertAsTheTableDoes) {
  for (int64_t dense_max : {int64_t{0}, int64_t{1} << 20}) {
    SCOPED_TRACE(dense_max == 0 ? "hashed" : "dense");
    constexpr int64_t kRows = 50000;
    RowTable<Record> table;
    table.Init(kRows, dense_max);
    std::map<int64_t, int64_t> reference;
    CounterRng rng(9);
    for (int batch = 0; batch < 200; ++batch) {
      const int n = static_cast<int>(rng.NextBelow(600));
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (int64_t& id : ids) id = static_cast<int64_t>(rng.NextBelow(kRows));
      table.Reserve(ids.size());
      int64_t inserts = 0;
      auto visit = [&](int64_t id, Record& r) {
        ASSERT_EQ(r.present(), reference.count(id) == 1) << "batch " << batch << " id " << id;
        if (table.dense() && !r.present()) ++inserts;
        r.value = batch;
        reference[id] = batch;
      };
      if (table.dense()) {
        const auto records = table.dense_records();
        for (int64_t id : ids) visit(id, records[id]);
      } else {
        const auto records = table.hashed_records();
        for (int64_t id : ids) visit(id, records.FindOrInsert(id, records.Home(id), &inserts));
      }
      table.CountInserts(inserts);
      ASSERT_EQ(table.size(), static_cast<int64_t>(reference.size())) << "batch " << batch;
      for (int e = 0; e < n / 2; ++e) {
        const int64_t id = static_cast<int64_t>(rng.NextBelow(kRows));
        table.Erase(id);
        reference.erase(id);
      }
    }
    for (const auto& [id, value] : reference) {
      const Record* r = table.Find(id);
      ASSERT_NE(r, nullptr) << id;
      EXPECT_EQ(r->value, value);
    }
    EXPECT_EQ(table.size(), static_cast<int64_t>(reference.size()));
  }
}

TEST(RowIndexTest, MapsRowsToHandlesInBothForms) {
  for (int64_t dense_max : {int64_t{0}, int64_t{1} << 20}) {
    RowIndex index;
    index.Init(1000, dense_max);
    EXPECT_EQ(index.Find(5), kNoHandle);
    EXPECT_EQ(index.FindOrInsert(5), kNoHandle);
    index.FindOrInsert(5) = 42;
    EXPECT_EQ(index.Find(5), 42u);
    index.Erase(5);
    EXPECT_EQ(index.Find(5), kNoHandle);
  }
}

TEST(BatchDedupTest, NumbersDistinctKeysInFirstOccurrenceOrder) {
  BatchDedup dedup;
  for (int round = 0; round < 3; ++round) {
    dedup.Reset(6);
    std::vector<int32_t> positions;
    for (int64_t key : std::vector<int64_t>{9, 4, 9, 100000000000, 4, 7}) {
      bool inserted;
      positions.push_back(dedup.Insert(key, &inserted));
    }
    EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 0, 2, 1, 3}));
    EXPECT_EQ(dedup.size(), 4);
  }
}

// Arrays of 2 MiB or more get mappings of their own, aligned to 2 MiB; they grow, shrink and go
// away like any vector's storage, contents intact.
TEST(HugePageAllocatorTest, LargeArraysAreAlignedMappingsThatKeepTheirContents) {
  HugeVector<uint32_t> small(1000, 7);  // below 2 MiB: operator new
  EXPECT_EQ(small[999], 7u);
  for (size_t words : {kHugePageBytes / 4, kHugePageBytes / 4 + 1, 3 * kHugePageBytes / 4 + 5}) {
    HugeVector<uint32_t> large(words);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % kHugePageBytes, 0u) << words;
    for (size_t k = 0; k < words; ++k) large[k] = static_cast<uint32_t>(k * 2654435761u);
    large.resize(2 * words + 3, 1);  // a new mapping; the old one is unmapped
    EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % kHugePageBytes, 0u) << words;
    for (size_t k = 0; k < words; ++k) ASSERT_EQ(large[k], static_cast<uint32_t>(k * 2654435761u));
    EXPECT_EQ(large.back(), 1u);
    large.shrink_to_fit();
    EXPECT_EQ(large[words - 1], static_cast<uint32_t>((words - 1) * 2654435761u));
  }
}

}  // namespace
}  // namespace bagpipe::oracle_internal
