// Test support for the oracle: a tiny seeded trace generator (uniform or Zipf-skewed rows,
// one-hot or multi-hot bags) and the straightforward reading of a trace that the planner must
// agree with (per-trainer distinct rows in first-occurrence order).
#ifndef BAGPIPE_TESTS_ORACLE_TRACE_TESTING_H_
#define BAGPIPE_TESTS_ORACLE_TRACE_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/types.h"
#include "data/batch.h"
#include "data/schema.h"

namespace bagpipe::testing {

struct TraceSpec {
  std::vector<int64_t> table_rows = {40, 300};
  int batches = 30;
  int batch_size = 16;
  // Zipf exponent of row popularity; 0 = uniform.
  double alpha = 1.0;
  // Ids per bag: exactly 1 when max_pooling == 1, else uniform in [0, max_pooling].
  int max_pooling = 1;
  // The last batch has this many samples when > 0 (a partial final batch).
  int last_batch_size = 0;
  // Ids and table sizes are multiplied by this: sparse ids in huge tables (ids past 2^32).
  int64_t id_scale = 1;
  uint64_t seed = 1;
};

inline Schema TraceSchema(const TraceSpec& spec) {
  Schema schema;
  schema.dense_names = {"d0", "d1"};
  for (size_t t = 0; t < spec.table_rows.size(); ++t) {
    schema.table_names.push_back("t" + std::to_string(t));
  }
  for (int64_t rows : spec.table_rows) schema.table_rows.push_back(rows * spec.id_scale);
  return schema;
}

// Samples ranks 0..n-1 with P(k) proportional to (k + 1)^-alpha, by inverting the CDF.
class ZipfRanks {
 public:
  ZipfRanks(int64_t n, double alpha) : cdf_(static_cast<size_t>(n)) {
    double total = 0;
    for (int64_t k = 0; k < n; ++k) {
      total += alpha == 0 ? 1.0 : std::pow(static_cast<double>(k + 1), -alpha);
      cdf_[k] = total;
    }
    for (double& c : cdf_) c /= total;
  }
  int64_t Sample(CounterRng& rng) const {
    const double u = rng.NextDouble();
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<int64_t>(it - cdf_.begin(), static_cast<int64_t>(cdf_.size()) - 1);
  }

 private:
  std::vector<double> cdf_;
};

inline std::vector<Batch> MakeTrace(const TraceSpec& spec) {
  const int tables = static_cast<int>(spec.table_rows.size());
  std::vector<ZipfRanks> samplers;
  for (int64_t rows : spec.table_rows) samplers.emplace_back(rows, spec.alpha);
  CounterRng rng(HashKey(spec.seed, 0x7472616365ULL));
  std::vector<Batch> trace;
  int64_t first_sample = 0;
  for (int b = 0; b < spec.batches; ++b) {
    const int n = (b + 1 == spec.batches && spec.last_batch_size > 0) ? spec.last_batch_size
                                                                      : spec.batch_size;
    Batch batch;
    batch.Reset(2, tables);
    batch.first_sample = first_sample;
    batch.num_samples = n;
    for (int s = 0; s < n; ++s) {
      batch.labels.push_back(static_cast<float>(rng.NextBelow(2)));
      batch.dense.push_back(rng.NextFloat());
      batch.dense.push_back(rng.NextFloat());
    }
    for (int t = 0; t < tables; ++t) {
      // Hot ranks map to scattered ids (a fixed affine bijection of the table).
      const int64_t rows = spec.table_rows[t];
      for (int s = 0; s < n; ++s) {
        const int bag =
            spec.max_pooling == 1 ? 1 : static_cast<int>(rng.NextBelow(spec.max_pooling + 1));
        for (int k = 0; k < bag; ++k) {
          const int64_t rank = samplers[t].Sample(rng);
          batch.ids.push_back((rank * 7919 + 13) % rows * spec.id_scale);
        }
        batch.offsets.push_back(static_cast<int64_t>(batch.ids.size()));
      }
    }
    first_sample += n;
    trace.push_back(std::move(batch));
  }
  return trace;
}

// RowIds of the ids of trainer `trainer`'s shard of `batch`, in the shard's id order.
inline std::vector<RowId> ShardRows(const Batch& batch, const Schema& schema, int trainers,
                                    int trainer) {
  const std::vector<RowId> offsets = schema.TableOffsets();
  const ShardRange range = ShardOf(batch.num_samples, trainers, trainer);
  std::vector<RowId> rows;
  for (int t = 0; t < batch.num_tables; ++t) {
    for (int64_t j = batch.bag_begin(t, range.begin); j < batch.bag_begin(t, range.end); ++j) {
      rows.push_back(offsets[t] + static_cast<RowId>(batch.ids[j]));
    }
  }
  return rows;
}

// D_t(i): the distinct rows of the shard in first-occurrence order.
inline std::vector<RowId> DistinctRows(const std::vector<RowId>& rows) {
  std::vector<RowId> out;
  std::set<RowId> seen;
  for (RowId r : rows) {
    if (seen.insert(r).second) out.push_back(r);
  }
  return out;
}

}  // namespace bagpipe::testing

#endif  // BAGPIPE_TESTS_ORACLE_TRACE_TESTING_H_
