// A run of consecutive samples in columnar form: the unit the readers produce, the oracle plans
// and the trainers consume.
//
// Sparse features use a table-major CSR layout (FBGEMM's TBE input): the bag of table t for
// sample s is ids[offsets[t * n + s] .. offsets[t * n + s + 1]) where n = num_samples. Ids are
// rows within their table. One-hot data has exactly one id per bag; multi-hot bags may hold
// several or none.
#ifndef BAGPIPE_DATA_BATCH_H_
#define BAGPIPE_DATA_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "data/schema.h"

namespace bagpipe {

struct Batch {
  // Position of sample 0 in the stream (counts samples across epochs).
  int64_t first_sample = 0;
  int32_t num_samples = 0;
  int32_t num_dense = 0;
  int32_t num_tables = 0;
  std::vector<float> labels;     // num_samples
  std::vector<float> dense;      // num_samples * num_dense, sample-major
  std::vector<int64_t> offsets;  // num_tables * num_samples + 1, table-major
  std::vector<int64_t> ids;      // offsets.back() ids, row within table

  // Empties the batch and sets its shape (offsets = {0}).
  void Reset(int32_t dense_columns, int32_t tables);
  int64_t num_ids() const { return offsets.empty() ? 0 : offsets.back(); }
  // Index into `offsets` of the bag of (table, sample), in 64 bits: tables * samples may exceed
  // the int range (26 tables of 100M samples).
  static int64_t BagIndex(int table, int64_t sample, int64_t num_samples) {
    return static_cast<int64_t>(table) * num_samples + sample;
  }
  int64_t bag_begin(int table, int sample) const {
    return offsets[BagIndex(table, sample, num_samples)];
  }
  int64_t bag_end(int table, int sample) const {
    return offsets[BagIndex(table, sample, num_samples) + 1];
  }
  // Ids of table t for all samples: ids[table_begin(t) .. table_begin(t + 1)).
  int64_t table_begin(int table) const { return offsets[BagIndex(table, 0, num_samples)]; }

  // Samples [begin, end) as a new batch (first_sample adjusted). REQUIRES: begin <= end <=
  // num_samples.
  Batch Slice(int32_t begin, int32_t end) const;
  // Appends all samples of `other` (same shape) after this batch's samples.
  void Append(const Batch& other);
  // Checks the shape and that every id of table t is in [0, schema.table_rows[t]); the error
  // names the sample (stream position), the table and the id.
  absl::Status Validate(const Schema& schema) const;

  bool operator==(const Batch& other) const = default;
};

// The samples of shard `shard` of `num_shards` of a batch of `num_samples` samples:
// [begin, end) with begin = floor(shard * n / T). Deterministic; shards differ by at most one.
struct ShardRange {
  int32_t begin;
  int32_t end;
};
ShardRange ShardOf(int32_t num_samples, int num_shards, int shard);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_BATCH_H_
