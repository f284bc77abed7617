// CSV reader with a column spec.
//
// The file has a header line naming its columns (RFC 4180 quoting: "a,b" and "" inside quotes;
// a quote only opens a quoted field at the field's start, and inside an unquoted field, as in
// Com"edy, it is an ordinary character). Blank lines (empty, or a lone "\r") are skipped
// anywhere, before the header too; messages give the lines' true numbers.
// The spec (SourceOptions::schema) says how columns become a sample, clauses separated by ';':
//   label=COL            the label is COL's numeric value, in [0, 1]
//   label=COL>X          1 when COL > X else 0 (also >=, <, <=, ==)
//   dense=C1,C2,...      dense features; each C or log(C) for log(1 + max(x, 0)); missing = 0;
//                        inf, -inf and values beyond the float range are errors
//   sparse=C1,C2,...     one table per column, values dictionary-encoded exactly (first
//                        appearance = next row, from 1; row 0 = missing); split(C,|) makes a
//                        multi-hot bag of the values separated by '|'
// Example (MovieLens): "label=rating>3.5; dense=year; sparse=userId,movieId,genres".
// Errors name the file, line and column, or the spec clause (unknown column, bad operator), and
// echo values as short escaped excerpts. A column named more than once in the header is an error
// if the spec uses that name (ambiguous, naming the header line and the columns); a duplicate the
// spec does not use is accepted. A UTF-8 byte order mark before the header is skipped;
// CR LF line endings are accepted; a file with a header but no (valid) data line is an error.
#ifndef BAGPIPE_DATA_CSV_READER_H_
#define BAGPIPE_DATA_CSV_READER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/source.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

absl::StatusOr<std::unique_ptr<SampleSource>> OpenCsv(const std::string& path,
                                                      const SourceOptions& options);

// The spec in one form for every way of writing the same columns: {"label": "rating>3.5",
// "dense": [...], "sparse": [...]} (several dense or sparse clauses joined in order; no spaces
// around names, operators and call arguments; the label's threshold as the number it is, so
// "rating > 3.50" and "rating>3.5" alike). Needs no header; a spec it cannot split (or without
// a label) is returned as the string given. For comparing specs (a resumed job's against its
// checkpoint's), not for reading.
nlohmann::json CanonicalCsvSpec(absl::string_view spec);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_CSV_READER_H_
