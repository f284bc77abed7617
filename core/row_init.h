// Deterministic initial values of embedding rows: a pure function of (seed, RowId, column), so
// an embedding server, a `device`-mode cache and a test all create the same row without
// coordination, in any order, on any machine.
//
// Values follow the DLRM reference: row r of table t (n rows) is uniform in
// [-sqrt(1/n), sqrt(1/n)]: value = scale_t * (2u - 1) with u = UnitFloat(HashKey(seed,
// kRowInitStream, r, c)) (24 random bits, so 2u - 1 is exact in float and the only rounding is
// the multiply by scale_t — a CUDA kernel reproduces it bit for bit). Optimizer state starts
// at `initial_accumulator`.
#ifndef BAGPIPE_CORE_ROW_INIT_H_
#define BAGPIPE_CORE_ROW_INIT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/random.h"
#include "core/types.h"

namespace bagpipe {

inline constexpr uint64_t kRowInitStream = 0x726f77696e6974ULL;  // "rowinit"

class RowInitializer {
 public:
  RowInitializer() = default;
  // `table_rows`: rows per table (RowIds are linearised by their cumulative sums);
  // `state_floats`: optimizer state floats per row after the `dim` values.
  RowInitializer(uint64_t seed, int dim, int state_floats, float initial_accumulator,
                 const std::vector<int64_t>& table_rows)
      : seed_(seed),
        dim_(dim),
        state_floats_(state_floats),
        initial_accumulator_(initial_accumulator) {
    offsets_.push_back(0);
    for (int64_t rows : table_rows) {
      offsets_.push_back(offsets_.back() + static_cast<RowId>(rows));
      scales_.push_back(std::sqrt(1.0f / static_cast<float>(std::max<int64_t>(rows, 1))));
    }
  }

  int dim() const { return dim_; }
  int record_floats() const { return dim_ + state_floats_; }
  uint64_t seed() const { return seed_; }
  int state_floats() const { return state_floats_; }
  float initial_accumulator() const { return initial_accumulator_; }
  const std::vector<float>& table_scales() const { return scales_; }
  const std::vector<RowId>& table_offsets() const { return offsets_; }

  // Table of a RowId. REQUIRES: row < total rows.
  int TableOf(RowId row) const {
    return static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), row) -
                            offsets_.begin()) -
           1;
  }
  static float Value(uint64_t seed, float scale, RowId row, int column) {
    const float u = UnitFloat(HashKey(seed, kRowInitStream, row, static_cast<uint64_t>(column)));
    return scale * (2.0f * u - 1.0f);
  }
  // Writes the row's record (dim values, then state) to `record`.
  void Init(RowId row, float* record) const {
    const float scale = scales_[TableOf(row)];
    for (int c = 0; c < dim_; ++c) record[c] = Value(seed_, scale, row, c);
    for (int k = 0; k < state_floats_; ++k) record[dim_ + k] = initial_accumulator_;
  }

 private:
  uint64_t seed_ = 0;
  int dim_ = 0;
  int state_floats_ = 0;
  float initial_accumulator_ = 0;
  std::vector<RowId> offsets_;
  std::vector<float> scales_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_ROW_INIT_H_
