#include "data/batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace bagpipe {

void Batch::Reset(int32_t dense_columns, int32_t tables) {
  first_sample = 0;
  num_samples = 0;
  num_dense = dense_columns;
  num_tables = tables;
  labels.clear();
  dense.clear();
  offsets.assign(1, 0);
  ids.clear();
}

Batch Batch::Slice(int32_t begin, int32_t end) const {
  Batch out;
  out.Reset(num_dense, num_tables);
  out.first_sample = first_sample + begin;
  out.num_samples = end - begin;
  out.labels.assign(labels.begin() + begin, labels.begin() + end);
  out.dense.assign(dense.begin() + static_cast<int64_t>(begin) * num_dense,
                   dense.begin() + static_cast<int64_t>(end) * num_dense);
  out.offsets.resize(static_cast<size_t>(num_tables) * out.num_samples + 1);
  out.offsets[0] = 0;
  int64_t total = 0;
  for (int t = 0; t < num_tables; ++t) total += bag_begin(t, end) - bag_begin(t, begin);
  out.ids.resize(total);
  int64_t written = 0;
  for (int t = 0; t < num_tables; ++t) {
    const int64_t from = bag_begin(t, begin);
    const int64_t to = bag_begin(t, end);
    std::copy(ids.begin() + from, ids.begin() + to, out.ids.begin() + written);
    for (int32_t s = begin; s < end; ++s) {
      out.offsets[static_cast<size_t>(t) * out.num_samples + (s - begin) + 1] =
          written + (bag_end(t, s) - from);
    }
    written += to - from;
  }
  return out;
}

void Batch::Append(const Batch& other) {
  if (other.num_samples == 0) return;
  if (num_samples == 0) {
    *this = other;
    return;
  }
  const int32_t n = num_samples + other.num_samples;
  std::vector<int64_t> new_offsets(static_cast<size_t>(num_tables) * n + 1);
  std::vector<int64_t> new_ids;
  new_ids.reserve(ids.size() + other.ids.size());
  new_offsets[0] = 0;
  for (int t = 0; t < num_tables; ++t) {
    const size_t base = static_cast<size_t>(t) * n;
    for (int32_t s = 0; s < num_samples; ++s) {
      new_ids.insert(new_ids.end(), ids.begin() + bag_begin(t, s), ids.begin() + bag_end(t, s));
      new_offsets[base + s + 1] = static_cast<int64_t>(new_ids.size());
    }
    for (int32_t s = 0; s < other.num_samples; ++s) {
      new_ids.insert(new_ids.end(), other.ids.begin() + other.bag_begin(t, s),
                     other.ids.begin() + other.bag_end(t, s));
      new_offsets[base + num_samples + s + 1] = static_cast<int64_t>(new_ids.size());
    }
  }
  labels.insert(labels.end(), other.labels.begin(), other.labels.end());
  dense.insert(dense.end(), other.dense.begin(), other.dense.end());
  offsets = std::move(new_offsets);
  ids = std::move(new_ids);
  num_samples = n;
}

absl::Status Batch::Validate(const Schema& schema) const {
  if (num_dense != schema.num_dense() || num_tables != schema.num_tables()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch has ", num_dense, " dense columns and ", num_tables,
                     " tables; the schema has ", schema.num_dense(), " and ", schema.num_tables()));
  }
  if (labels.size() != static_cast<size_t>(num_samples) ||
      dense.size() != static_cast<size_t>(num_samples) * num_dense ||
      offsets.size() != static_cast<size_t>(num_tables) * num_samples + 1 || offsets[0] != 0 ||
      static_cast<size_t>(offsets.back()) != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch at sample ", first_sample, " has inconsistent array sizes"));
  }
  for (int t = 0; t < num_tables; ++t) {
    const int64_t rows = schema.table_rows[t];
    for (int32_t s = 0; s < num_samples; ++s) {
      if (bag_end(t, s) < bag_begin(t, s)) {
        return absl::InvalidArgumentError(absl::StrCat("batch at sample ", first_sample + s,
                                                       ": decreasing offsets in table ",
                                                       schema.table_names[t]));
      }
      for (int64_t k = bag_begin(t, s); k < bag_end(t, s); ++k) {
        if (ids[k] < 0 || ids[k] >= rows) {
          return absl::OutOfRangeError(absl::StrCat("sample ", first_sample + s, ", table ",
                                                    schema.table_names[t], ": id ", ids[k],
                                                    " is out of range [0, ", rows, ")"));
        }
      }
    }
  }
  return absl::OkStatus();
}

ShardRange ShardOf(int32_t num_samples, int num_shards, int shard) {
  const int64_t n = num_samples;
  return {static_cast<int32_t>(n * shard / num_shards),
          static_cast<int32_t>(n * (shard + 1) / num_shards)};
}

}  // namespace bagpipe
