// Test helpers for the cache suites: seeded random batches and records, the naive reference
// loops that define each operation (written independently of cache/cache_math.h, straight from
// the contracts in cache/embedding_cache.h and cache/pooling.h), and comparisons that say where
// two float arrays first differ.
#ifndef BAGPIPE_TESTS_CACHE_CACHE_TEST_UTIL_H_
#define BAGPIPE_TESTS_CACHE_CACHE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "cache/cache_math.h"
#include "cache/embedding_cache.h"
#include "core/random.h"
#include "gtest/gtest.h"

namespace bagpipe::cache_test {

// A local batch as a plan delivers it: table-major bags over occurrences, each occurrence
// naming its unique row (first-occurrence order) and that row's slot.
struct RandomBatch {
  int num_tables = 0;
  int num_samples = 0;
  std::vector<int64_t> offsets;        // num_tables * num_samples + 1
  std::vector<uint32_t> unique_index;  // per occurrence
  std::vector<SlotId> slots;           // per occurrence: unique_slots[unique_index[j]]
  std::vector<float> weights;          // per occurrence, in [0.5, 1.5)
  std::vector<SlotId> unique_slots;    // distinct
  int num_unique() const { return static_cast<int>(unique_slots.size()); }
  int64_t num_ids() const { return offsets.back(); }
};

// Uniform float in [lo, hi) from (seed, a, b).
inline float RandomFloat(uint64_t seed, uint64_t a, uint64_t b, float lo, float hi) {
  return lo + (hi - lo) * UnitFloat(HashKey(seed, a, b));
}

// Bags of 0 .. max_bag ids (about one in five empty when max_bag > 0) drawn from `pool` distinct
// random slots of [0, capacity), skewed so that rows repeat across and within bags.
inline RandomBatch MakeRandomBatch(uint64_t seed, int num_tables, int num_samples, int max_bag,
                                   int64_t capacity, int pool) {
  CounterRng rng(HashKey(seed, 0xba7c4));
  RandomBatch batch;
  batch.num_tables = num_tables;
  batch.num_samples = num_samples;
  // Pool of distinct slots (partial Fisher-Yates over [0, capacity)).
  std::vector<SlotId> all(static_cast<size_t>(capacity));
  std::iota(all.begin(), all.end(), 0);
  pool = static_cast<int>(std::min<int64_t>(pool, capacity));
  for (int i = 0; i < pool; ++i) {
    std::swap(all[i], all[i + rng.NextBelow(static_cast<uint64_t>(capacity - i))]);
  }
  std::vector<int32_t> unique_of(pool, -1);
  batch.offsets.push_back(0);
  for (int64_t bag = 0; bag < static_cast<int64_t>(num_tables) * num_samples; ++bag) {
    int length = static_cast<int>(rng.NextBelow(static_cast<uint64_t>(max_bag) + 1));
    if (max_bag > 1 && rng.NextBelow(5) == 0) length = 0;
    for (int k = 0; k < length; ++k) {
      const double u = rng.NextDouble();
      const int r = static_cast<int>(u * u * pool);  // skewed towards the pool's head
      if (unique_of[r] < 0) {
        unique_of[r] = static_cast<int32_t>(batch.unique_slots.size());
        batch.unique_slots.push_back(all[r]);
      }
      batch.unique_index.push_back(static_cast<uint32_t>(unique_of[r]));
      batch.slots.push_back(all[r]);
      batch.weights.push_back(0.5f + rng.NextFloat());
    }
    batch.offsets.push_back(static_cast<int64_t>(batch.slots.size()));
  }
  return batch;
}

// n floats uniform in [lo, hi).
inline std::vector<float> RandomFloats(uint64_t seed, size_t n, float lo, float hi) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = RandomFloat(seed, 0xf10a7, i, lo, hi);
  return out;
}

// Records for `n` rows: values in [-1, 1), state in [0, 2) (accumulators are non-negative).
inline std::vector<float> RandomRecords(uint64_t seed, int64_t n, int dim, int state_floats) {
  const int record = dim + state_floats;
  std::vector<float> records(static_cast<size_t>(n) * record);
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < record; ++c) {
      const size_t i = static_cast<size_t>(k) * record + c;
      records[i] = c < dim ? RandomFloat(seed, 0x5ec, i, -1.0f, 1.0f)
                           : RandomFloat(seed, 0x5ec, i, 0.0f, 2.0f);
    }
  }
  return records;
}

inline std::vector<SlotId> AllSlots(int64_t capacity) {
  std::vector<SlotId> slots(static_cast<size_t>(capacity));
  std::iota(slots.begin(), slots.end(), 0);
  return slots;
}

// The whole cache as host arrays (values [capacity x dim], state [capacity x state_floats]).
struct HostRows {
  std::vector<float> values;
  std::vector<float> state;
};

inline HostRows ReadAll(const EmbeddingCache& cache) {
  auto records = cache.ReadRecords(AllSlots(cache.capacity()));
  EXPECT_TRUE(records.ok()) << records.status();
  HostRows rows;
  if (!records.ok()) return rows;
  const int dim = cache.dim();
  const int state = cache.state_floats();
  for (int64_t k = 0; k < cache.capacity(); ++k) {
    const float* r = records->data() + k * (dim + state);
    rows.values.insert(rows.values.end(), r, r + dim);
    rows.state.insert(rows.state.end(), r + dim, r + dim + state);
  }
  return rows;
}

// --- naive reference loops -------------------------------------------------------------------

// pooled[(s * T + t) * dim + c] = sum_j (w_j * m_b) * v[slot_j][c] from +0.0f, in order.
inline std::vector<float> NaiveGather(const std::vector<float>& values, int dim,
                                      const RandomBatch& batch, PoolingMode pooling,
                                      bool weighted) {
  const int tables = batch.num_tables;
  const int samples = batch.num_samples;
  std::vector<float> pooled(static_cast<size_t>(tables) * samples * dim, 0.0f);
  for (int t = 0; t < tables; ++t) {
    for (int s = 0; s < samples; ++s) {
      const int64_t bag = static_cast<int64_t>(t) * samples + s;
      const int64_t begin = batch.offsets[bag];
      const int64_t end = batch.offsets[bag + 1];
      const float m = (pooling == PoolingMode::kMean && end > begin)
                          ? 1.0f / static_cast<float>(end - begin)
                          : 1.0f;
      float* out = pooled.data() + (static_cast<size_t>(s) * tables + t) * dim;
      for (int c = 0; c < dim; ++c) {
        float acc = 0.0f;
        for (int64_t j = begin; j < end; ++j) {
          const float scale = (weighted ? batch.weights[j] : 1.0f) * m;
          acc += scale * values[static_cast<size_t>(batch.slots[j]) * dim + c];
        }
        out[c] = acc;
      }
    }
  }
  return pooled;
}

// grad[u] = sum over occurrences j of u, in occurrence order, of scale_j * pooled_grad[bag(j)],
// in the documented chunked order (cache/cache_math.h): partial sums of kReduceChunk
// consecutive occurrences (from +0.0f), then the partials in chunk order (from +0.0f).
inline std::vector<float> NaiveReduce(const RandomBatch& batch,
                                      const std::vector<float>& pooled_grad, int dim,
                                      PoolingMode pooling, bool weighted) {
  const int tables = batch.num_tables;
  const int samples = batch.num_samples;
  // Every row's occurrences in occurrence order: (scale, pooled gradient row).
  std::vector<std::vector<std::pair<float, const float*>>> occurrences(batch.num_unique());
  for (int t = 0; t < tables; ++t) {
    for (int s = 0; s < samples; ++s) {
      const int64_t bag = static_cast<int64_t>(t) * samples + s;
      const int64_t begin = batch.offsets[bag];
      const int64_t end = batch.offsets[bag + 1];
      const float m = (pooling == PoolingMode::kMean && end > begin)
                          ? 1.0f / static_cast<float>(end - begin)
                          : 1.0f;
      const float* g = pooled_grad.data() + (static_cast<size_t>(s) * tables + t) * dim;
      for (int64_t j = begin; j < end; ++j) {
        occurrences[batch.unique_index[j]].emplace_back((weighted ? batch.weights[j] : 1.0f) * m,
                                                        g);
      }
    }
  }
  std::vector<float> grads(static_cast<size_t>(batch.num_unique()) * dim, 0.0f);
  std::vector<float> partial(static_cast<size_t>(dim));
  for (size_t u = 0; u < occurrences.size(); ++u) {
    const auto& list = occurrences[u];
    for (size_t first = 0; first < list.size(); first += cache_math::kReduceChunk) {
      std::fill(partial.begin(), partial.end(), 0.0f);
      const size_t last = std::min(list.size(), first + cache_math::kReduceChunk);
      for (size_t k = first; k < last; ++k) {
        for (int c = 0; c < dim; ++c) partial[c] += list[k].first * list[k].second[c];
      }
      float* out = grads.data() + u * dim;
      for (int c = 0; c < dim; ++c) out[c] += partial[c];
    }
  }
  return grads;
}

// The documented row-wise square sum: 32 strided partials, then the halving tree.
inline float NaiveRowwiseSquareSum(const float* g, int dim) {
  float partial[32];
  for (int l = 0; l < 32; ++l) {
    partial[l] = 0.0f;
    for (int c = l; c < dim; c += 32) partial[l] += g[c] * g[c];
  }
  for (int h = 16; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) partial[l] += partial[l + h];
  }
  return partial[0];
}

// Applies the optimizer to rows slots[k] of `rows` with gradient row grad_rows[k] (or k).
inline void NaiveApply(const OptimizerConfig& opt, int dim, const std::vector<SlotId>& slots,
                       const std::vector<int32_t>& grad_rows, const std::vector<float>& grads,
                       HostRows* rows) {
  for (size_t k = 0; k < slots.size(); ++k) {
    const size_t slot = static_cast<size_t>(slots[k]);
    const size_t grad_row = grad_rows.empty() ? k : static_cast<size_t>(grad_rows[k]);
    float* w = rows->values.data() + slot * dim;
    const float* g = grads.data() + grad_row * dim;
    switch (opt.kind) {
      case OptimizerKind::kSgd:
        for (int c = 0; c < dim; ++c) w[c] -= opt.learning_rate * g[c];
        break;
      case OptimizerKind::kAdagrad: {
        float* s = rows->state.data() + slot * dim;
        for (int c = 0; c < dim; ++c) {
          s[c] += g[c] * g[c];
          w[c] -= opt.learning_rate * g[c] / (std::sqrt(s[c]) + opt.eps);
        }
        break;
      }
      case OptimizerKind::kRowwiseAdagrad: {
        float& s = rows->state[slot];
        s += NaiveRowwiseSquareSum(g, dim) / static_cast<float>(dim);
        const float denominator = std::sqrt(s) + opt.eps;
        for (int c = 0; c < dim; ++c) w[c] -= opt.learning_rate * g[c] / denominator;
        break;
      }
    }
  }
}

// --- comparisons -------------------------------------------------------------------------------

inline uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

// Bit-for-bit equality (so -0.0 != +0.0 and NaN payloads count); reports the first difference.
inline ::testing::AssertionResult BitEqual(const std::vector<float>& expected,
                                           const std::vector<float>& actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: expected " << expected.size() << ", actual " << actual.size();
  }
  int64_t differing = 0;
  int64_t first = -1;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (Bits(expected[i]) != Bits(actual[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differing;
    }
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << absl::StrFormat(
             "%d of %d floats differ in their bits; first at [%d]: expected %.9g (0x%08x), "
             "actual %.9g (0x%08x)",
             differing, expected.size(), first, expected[first], Bits(expected[first]),
             actual[first], Bits(actual[first]));
}

// |actual - expected| <= rel * |expected| + abs_floor elementwise; reports the worst element.
inline ::testing::AssertionResult Close(const std::vector<float>& expected,
                                        const std::vector<float>& actual, double rel,
                                        double abs_floor = 1e-30) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: expected " << expected.size() << ", actual " << actual.size();
  }
  int64_t failing = 0;
  int64_t worst = -1;
  double worst_excess = 0;
  int64_t not_bit_identical = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (Bits(expected[i]) != Bits(actual[i])) ++not_bit_identical;
    const double e = expected[i];
    const double a = actual[i];
    const double bound = rel * std::fabs(e) + abs_floor;
    const double error = std::fabs(a - e);
    if (!(error <= bound)) {  // also catches NaN
      ++failing;
      const double excess = std::isnan(error) ? INFINITY : error / bound;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  if (failing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << absl::StrFormat(
             "%d of %d floats outside rel %g (+%g); worst at [%d]: expected %.9g, actual %.9g "
             "(%d floats not bit-identical)",
             failing, expected.size(), rel, abs_floor, worst, expected[worst], actual[worst],
             not_bit_identical);
}

}  // namespace bagpipe::cache_test

#endif  // BAGPIPE_TESTS_CACHE_CACHE_TEST_UTIL_H_
