// The shape of a dataset: dense feature columns, embedding tables and their sizes.
//
// Every sample has one label, `num_dense()` dense floats and, per table, a bag of zero or more
// row ids in [0, table_rows[t]). Global rows are linearised across tables:
// RowId = TableOffsets()[t] + row (FBGEMM's cumulative table-size offset).
#ifndef BAGPIPE_DATA_SCHEMA_H_
#define BAGPIPE_DATA_SCHEMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/types.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

// Global row ids linearise every table: the tables hold at most this many rows in all (headroom
// below 2^63 for sums of offsets and counts).
inline constexpr int64_t kMaxTotalRows = int64_t{1} << 62;
// Plans name tables in 16 bits: a schema has at most this many.
inline constexpr int kMaxTables = 32767;

struct Schema {
  std::vector<std::string> dense_names;
  std::vector<std::string> table_names;
  // Rows per table: every id of table t is < table_rows[t]. For dictionary-encoded text sources
  // this is the number of distinct values seen so far (plus the reserved missing-value row) and
  // grows while the source is read.
  std::vector<int64_t> table_rows;

  int num_dense() const { return static_cast<int>(dense_names.size()); }
  int num_tables() const { return static_cast<int>(table_names.size()); }
  // Cumulative table sizes: offsets[t] is the RowId of row 0 of table t; offsets[num_tables()]
  // is the total row count. Size num_tables() + 1.
  std::vector<RowId> TableOffsets() const;
  int64_t TotalRows() const;
  // OK when there are at most kMaxTables tables, every table has at least `min_rows` rows and
  // they hold at most kMaxTotalRows in all; else an error naming the table.
  absl::Status CheckRowCounts(int64_t min_rows) const;

  nlohmann::json ToJson() const;
  static absl::StatusOr<Schema> FromJson(const nlohmann::json& json);
  bool operator==(const Schema& other) const = default;
};

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_SCHEMA_H_
