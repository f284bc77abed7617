// Criteo TSV reader (Kaggle display-advertising `train.txt`, Terabyte `day_N`).
//
// Each line: label, 13 integer columns, 26 categorical columns (8 hex digits), tab-separated,
// empty = missing, LF line endings. Dense transform: log(1 + max(x, 0)), missing = 0.
// Blank lines (empty, or a lone "\r") are skipped anywhere: they are neither samples nor bad
// lines, and later lines keep their true numbers. A UTF-8 byte order mark at the very start of
// the file is skipped (line 1's columns are counted after it); one anywhere else is data.
// Categorical values map to rows per table: by default a dictionary per table (first appearance
// = next row, from 1), or `mod N` hashing (row = 1 + value mod (N - 1)) when
// SourceOptions::row_budget = N is set. Row 0 of every table is the missing-value row.
//
// Parsing is parallel (TBB) over chunks of lines and streams the file; dictionary ids are
// assigned in sample order, so the result does not depend on the thread count.
// Errors name the file, line and column, echoing values as short escaped excerpts: wrong column
// count, a non-hex categorical, a non-integer dense value, a dense value outside int64 or a
// categorical of more than 16 hex digits (out of range), CRLF line endings, a line longer than
// SourceOptions::max_line_bytes, an empty file, a directory, a file with no valid line. Pipes and
// devices are read as streams (one epoch: they cannot be rewound).
#ifndef BAGPIPE_DATA_CRITEO_READER_H_
#define BAGPIPE_DATA_CRITEO_READER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/source.h"

namespace bagpipe {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoTables = 26;

absl::StatusOr<std::unique_ptr<SampleSource>> OpenCriteo(const std::string& path,
                                                         const SourceOptions& options);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_CRITEO_READER_H_
