// Specification of the cache statistics: enum-indexed counters, incremented by the cache's
// operations and by the runtime, readable concurrently and as JSON.
#include "cache/cache_stats.h"

#include <thread>
#include <vector>

#include "cache/embedding_cache.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

TEST(CacheStatsTest, CountersStartAtZeroAndAdd) {
  CacheStats stats;
  for (int i = 0; i < kNumCacheCounters; ++i) EXPECT_EQ(stats.Get(static_cast<CacheCounter>(i)), 0);
  stats.Add(CacheCounter::kHits, 3);
  stats.Add(CacheCounter::kMisses);
  EXPECT_EQ(stats.Get(CacheCounter::kHits), 3);
  EXPECT_EQ(stats.Get(CacheCounter::kMisses), 1);
  EXPECT_DOUBLE_EQ(stats.HitRate(), 0.75);
  stats.Reset();
  EXPECT_EQ(stats.Get(CacheCounter::kHits), 0);
  EXPECT_EQ(stats.HitRate(), 0.0);
}

TEST(CacheStatsTest, JsonNamesEveryCounterAndTheHitRate) {
  CacheStats stats;
  stats.Add(CacheCounter::kEvictions, 7);
  stats.Add(CacheCounter::kGatheredBytes, 1 << 20);
  const nlohmann::json json = stats.ToJson();
  EXPECT_EQ(json.size(), static_cast<size_t>(kNumCacheCounters) + 1);
  EXPECT_EQ(json["evictions"], 7);
  EXPECT_EQ(json["gathered_bytes"], 1 << 20);
  EXPECT_EQ(json["write_backs"], 0);
  EXPECT_EQ(json["hit_rate"], 0.0);
  for (int i = 0; i < kNumCacheCounters; ++i) {
    const auto counter = static_cast<CacheCounter>(i);
    EXPECT_TRUE(json.contains(std::string(CacheCounterName(counter))));
    EXPECT_FALSE(CacheCounterDoc(counter).empty());
  }
}

TEST(CacheStatsTest, MergeAddsSnapshots) {
  CacheStats a, b;
  a.Add(CacheCounter::kRequests, 10);
  b.Add(CacheCounter::kRequests, 5);
  b.Add(CacheCounter::kFlushes, 2);
  a.Merge(b.Snapshot());
  EXPECT_EQ(a.Get(CacheCounter::kRequests), 15);
  EXPECT_EQ(a.Get(CacheCounter::kFlushes), 2);
}

TEST(CacheStatsTest, ConcurrentAddsAreExact) {
  CacheStats stats;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&stats] {
      for (int i = 0; i < 10000; ++i) stats.Add(CacheCounter::kRequests);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(stats.Get(CacheCounter::kRequests), 40000);
}

TEST(CacheStatsTest, TheCacheCountsItsOwnOperations) {
  auto cache = *EmbeddingCache::Create(DeviceContext::Cpu(), 10, 2, OptimizerConfig{});
  const std::vector<SlotId> slots = {1, 2, 3};
  std::vector<float> buffer(3 * 2, 0.5f);
  ASSERT_TRUE(cache->Fill(slots.data(), buffer.data(), 3).ok());
  ASSERT_TRUE(cache->Extract(slots.data(), 2, buffer.data()).ok());
  ASSERT_TRUE(cache->Apply(slots.data(), buffer.data(), 3).ok());
  const std::vector<int64_t> offsets = {0, 1, 3};
  std::vector<float> pooled(2 * 2);
  ASSERT_TRUE(cache->Gather(slots.data(), offsets.data(), 1, 2, pooled.data()).ok());
  ASSERT_TRUE(cache->InitializeRows(RowInitializer(1, 2, 0, 0.0f, {10}), 0, 4).ok());
  const CacheStats& stats = cache->stats();
  EXPECT_EQ(stats.Get(CacheCounter::kFilledRows), 3);
  EXPECT_EQ(stats.Get(CacheCounter::kExtractedRows), 2);
  EXPECT_EQ(stats.Get(CacheCounter::kAppliedRows), 3);
  EXPECT_EQ(stats.Get(CacheCounter::kGatherCalls), 1);
  EXPECT_EQ(stats.Get(CacheCounter::kPooledRows), 2);
  EXPECT_EQ(stats.Get(CacheCounter::kInitializedRows), 4);
  // Plan-level counters are the runtime's.
  EXPECT_EQ(stats.Get(CacheCounter::kHits), 0);
  // A failed call counts nothing.
  const std::vector<SlotId> bad = {10};
  EXPECT_FALSE(cache->Fill(bad.data(), buffer.data(), 1).ok());
  EXPECT_EQ(stats.Get(CacheCounter::kFilledRows), 3);
}

}  // namespace
}  // namespace bagpipe
