#include "cache/cache_stats.h"

#include <iterator>
#include <string>

namespace bagpipe {
namespace {

constexpr std::string_view kNames[] = {
#define BAGPIPE_CACHE_COUNTER_NAME_(name, json, doc) json,
    BAGPIPE_CACHE_COUNTERS(BAGPIPE_CACHE_COUNTER_NAME_)
#undef BAGPIPE_CACHE_COUNTER_NAME_
};

constexpr std::string_view kDocs[] = {
#define BAGPIPE_CACHE_COUNTER_DOC_(name, json, doc) doc,
    BAGPIPE_CACHE_COUNTERS(BAGPIPE_CACHE_COUNTER_DOC_)
#undef BAGPIPE_CACHE_COUNTER_DOC_
};

static_assert(std::size(kNames) == kNumCacheCounters);

}  // namespace

std::string_view CacheCounterName(CacheCounter counter) {
  return kNames[static_cast<int>(counter)];
}

std::string_view CacheCounterDoc(CacheCounter counter) { return kDocs[static_cast<int>(counter)]; }

CacheStats::Values CacheStats::Snapshot() const {
  Values values;
  for (int i = 0; i < kNumCacheCounters; ++i) {
    values[i] = counters_[i].load(std::memory_order_relaxed);
  }
  return values;
}

void CacheStats::Merge(const Values& values) {
  for (int i = 0; i < kNumCacheCounters; ++i) {
    counters_[i].fetch_add(values[i], std::memory_order_relaxed);
  }
}

void CacheStats::Reset() {
  for (auto& counter : counters_) counter.store(0, std::memory_order_relaxed);
}

double CacheStats::HitRate() const {
  const int64_t hits = Get(CacheCounter::kHits);
  const int64_t total = hits + Get(CacheCounter::kMisses);
  return total == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(total);
}

nlohmann::json CacheStats::ToJson() const {
  nlohmann::json json = nlohmann::json::object();
  const Values values = Snapshot();
  for (int i = 0; i < kNumCacheCounters; ++i) json[std::string(kNames[i])] = values[i];
  json["hit_rate"] = HitRate();
  return json;
}

}  // namespace bagpipe
