// The rows one embedding server owns: values + optimizer state per row ("records"), created on
// first touch by the deterministic initialiser (core/row_init.h), with the stamp of the last
// write-back applied to each row.
//
// Storage is a chunked slab (no reallocation of the whole table as it grows) indexed by an
// absl::flat_hash_map from RowId; memory grows with the rows actually touched, so tables of
// 10^7+ rows are fine. Not thread-safe: one server thread owns it.
#ifndef BAGPIPE_SERVER_ROW_STORE_H_
#define BAGPIPE_SERVER_ROW_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/row_init.h"
#include "core/types.h"

namespace bagpipe {

class RowStore {
 public:
  explicit RowStore(RowInitializer initializer);

  int record_floats() const { return record_floats_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }

  // The record of `row`, created (initialised) if absent. The pointer stays valid for the
  // store's life (the slab never moves).
  float* GetOrCreate(RowId row);
  // The record of `row` or nullptr.
  const float* Find(RowId row) const;

  // Stamp of the last write-back applied to `row` (-1: none).
  Iteration stamp(RowId row) const;
  void set_stamp(RowId row, Iteration stamp);

  // Calls fn(row, record) for every row in increasing RowId order.
  void ForEachSorted(const std::function<void(RowId, const float*)>& fn) const;
  // Calls fn(row, record) for every row, in no particular order (no sort: checkpoints).
  void ForEach(const std::function<void(RowId, const float*)>& fn) const;
  // Adds `row` with `record` (not the initialiser's values; stamp -1). Returns false, changing
  // nothing, when the row exists.
  bool Insert(RowId row, const float* record);
  // Room for `rows` rows in the index without rehashing.
  void Reserve(int64_t rows) { index_.reserve(static_cast<size_t>(rows)); }

  // Bytes used per stored row (record + stamp + index entry, amortised) and in total.
  double bytes_per_row() const;
  int64_t bytes() const;

 private:
  // Rows per chunk: a power of two, at most 2^16, and chunks of about 16 MiB at most (a wide
  // record must not make the first row of a table allocate gigabytes).
  static constexpr int64_t kMaxChunkRows = 1 << 16;
  static constexpr int64_t kChunkBytes = 16 << 20;
  float* RecordAt(uint32_t index) const {
    return chunks_[index >> chunk_shift_].get() + (index & chunk_mask_) * record_floats_;
  }
  // Adds a chunk when record `index` is the first of one.
  void Grow(uint32_t index);

  RowInitializer initializer_;
  int record_floats_;
  int chunk_shift_ = 16;
  uint32_t chunk_mask_ = kMaxChunkRows - 1;
  absl::flat_hash_map<RowId, uint32_t> index_;
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<Iteration> stamps_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_SERVER_ROW_STORE_H_
