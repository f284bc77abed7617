#include "data/csv_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/excerpt.h"
#include "core/numbers.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace bagpipe {
namespace {

// Records are lines: a quoted field may hold the separator and doubled quotes ("") but not a
// line break, so that a bad line can be skipped without losing the rest of the file.
constexpr size_t kBlockBytes = size_t{1} << 20;
constexpr size_t kMaxKeptErrors = 10;
constexpr absl::string_view kUtf8Bom = "\xEF\xBB\xBF";

// Values that mean "missing" (as in R, pandas and NumPy exports such as MovieLens' "NA" years):
// dense features read them as 0 and sparse features as row 0. A label may not be missing.
bool IsMissing(absl::string_view text) {
  return text.empty() || text == "NA" || text == "N/A" || text == "NaN" || text == "nan" ||
         text == "null";
}

enum class Compare { kNone, kGreater, kGreaterEqual, kLess, kLessEqual, kEqual };

struct DenseColumn {
  int column;
  bool log;
};

struct SparseColumn {
  int column;
  std::string separator;  // empty: one value per bag
};

struct Spec {
  int label_column = -1;
  Compare compare = Compare::kNone;
  double threshold = 0;
  std::vector<DenseColumn> dense;
  std::vector<SparseColumn> sparse;
  std::vector<std::string> dense_names;
  std::vector<std::string> table_names;
};

// Splits on `separator` outside parentheses, so "split(genres,|)" stays one item.
std::vector<std::string> SplitTopLevel(absl::string_view text, char separator) {
  std::vector<std::string> items;
  int depth = 0;
  std::string current;
  for (const char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == separator && depth == 0) {
      items.emplace_back(absl::StripAsciiWhitespace(current));
      current.clear();
      continue;
    }
    current.push_back(c);
  }
  items.emplace_back(absl::StripAsciiWhitespace(current));
  return items;
}

// Parses one RFC 4180 line into fields, and sets (*columns)[f] to the 1-based column where field
// f starts (for messages). A quote has meaning only at the start of a field: one inside an
// unquoted field (Com"edy) is an ordinary character, as in Python's csv module. On an
// unterminated quote returns false with the column of the opening quote in *bad_column; on a
// stray character after a closing quote, that character's column.
bool SplitCsvLine(absl::string_view line, std::vector<std::string>* fields,
                  std::vector<size_t>* columns, size_t* bad_column, std::string* what) {
  fields->clear();
  columns->clear();
  std::string field;
  size_t i = 0;
  while (true) {
    field.clear();
    columns->push_back(i + 1);
    if (i < line.size() && line[i] == '"') {
      const size_t open = i;
      ++i;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            field.push_back('"');
            i += 2;
            continue;
          }
          closed = true;
          ++i;
          break;
        }
        field.push_back(line[i++]);
      }
      if (!closed) {
        *bad_column = open + 1;
        *what =
            "unterminated quote (the quoted field does not close on its line: records are lines, "
            "and a line break inside a quoted field is not supported)";
        return false;
      }
      if (i < line.size() && line[i] != ',') {
        *bad_column = i + 1;
        *what = absl::StrCat("unexpected character '", Excerpt(line.substr(i, 1)),
                             "' after a closing quote");
        return false;
      }
    } else {
      const size_t comma = std::min(line.find(',', i), line.size());
      field.assign(line.data() + i, comma - i);
      i = comma;
    }
    fields->push_back(field);
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  return true;
}

// Where the spec's columns are looked up: the header's fields and "FILE:LINE" of the header line.
struct Header {
  const std::vector<std::string>& names;
  std::string where;
};

// The index of the column `name` in the header. A name the header holds more than once is an
// error (which column was meant is unknown); duplicates the spec does not name are allowed.
absl::StatusOr<int> FindColumn(const Header& header_info, absl::string_view name,
                               absl::string_view clause) {
  const std::vector<std::string>& header = header_info.names;
  const auto found = std::find(header.begin(), header.end(), name);
  if (found != header.end()) {
    std::vector<std::string> at;
    constexpr size_t kListed = 10;
    size_t count = 0;
    for (auto it = found; it != header.end(); it = std::find(it + 1, header.end(), name)) {
      if (++count <= kListed) at.push_back(absl::StrCat(it - header.begin() + 1));
    }
    if (count == 1) return static_cast<int>(found - header.begin());
    std::string listed = count == 2 ? absl::StrCat(at[0], " and ", at[1]) : absl::StrJoin(at, ", ");
    if (count > kListed) absl::StrAppend(&listed, ", ... (", count, " times)");
    return absl::InvalidArgumentError(
        absl::StrCat(header_info.where, ": column '", Excerpt(name),
                     "' is ambiguous: the header has it at columns ", listed, " (csv spec clause '",
                     Excerpt(clause, 200), "'; rename the duplicates)"));
  }
  // The header may be hostile too: list the first columns, each cut short, up to a total length.
  constexpr size_t kListedBytes = 600;
  std::vector<std::string> listed;
  size_t listed_bytes = 0;
  for (size_t c = 0; c < header.size() && listed_bytes < kListedBytes; ++c) {
    listed.push_back(absl::StrCat("'", Excerpt(header[c]), "'"));
    listed_bytes += listed.back().size() + 2;
  }
  if (header.size() > listed.size()) {
    listed.push_back(absl::StrCat("... (", header.size(), " columns)"));
  }
  // One column with a tab, ';', ':' or '|' in it: a file separated by something else (csv: reads
  // commas), or one without a header line.
  std::string hint;
  if (header.size() == 1 && header[0].find_first_of("\t;:|") != std::string::npos) {
    hint =
        "; csv: reads comma-separated files whose first line names the columns: this one looks "
        "separated by something else (convert it first, e.g. sed 's/::/,/g' for '::', and add a "
        "header line if it has none)";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      header_info.where, ": csv spec clause '", Excerpt(clause, 200), "': unknown column '",
      Excerpt(name), "' (the header has: ", absl::StrJoin(listed, ", "), ")", hint));
}

// If `item` is "fn(args)" sets *args and returns true.
bool Call(absl::string_view item, absl::string_view fn, absl::string_view* args) {
  if (item.size() < fn.size() + 2 || item.substr(0, fn.size()) != fn) return false;
  absl::string_view rest = absl::StripAsciiWhitespace(item.substr(fn.size()));
  if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')') return false;
  *args = absl::StripAsciiWhitespace(rest.substr(1, rest.size() - 2));
  return true;
}

absl::Status ParseLabel(absl::string_view value, absl::string_view clause, const Header& header,
                        Spec* spec) {
  const size_t op_begin = value.find_first_of("<>=!");
  const absl::string_view column = absl::StripAsciiWhitespace(value.substr(0, op_begin));
  ASSIGN_OR_RETURN(spec->label_column, FindColumn(header, column, clause));
  if (op_begin == absl::string_view::npos) return absl::OkStatus();
  size_t op_end = value.find_first_not_of("<>=!", op_begin);
  if (op_end == absl::string_view::npos) op_end = value.size();
  const absl::string_view op = value.substr(op_begin, op_end - op_begin);
  if (op == ">") {
    spec->compare = Compare::kGreater;
  } else if (op == ">=") {
    spec->compare = Compare::kGreaterEqual;
  } else if (op == "<") {
    spec->compare = Compare::kLess;
  } else if (op == "<=") {
    spec->compare = Compare::kLessEqual;
  } else if (op == "==") {
    spec->compare = Compare::kEqual;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("csv spec clause '", Excerpt(clause, 200),
                                                   "': bad operator '", Excerpt(op),
                                                   "' (expected >, >=, <, <= or ==)"));
  }
  const absl::string_view threshold = absl::StripAsciiWhitespace(value.substr(op_end));
  if (!ParseDecimalDouble(threshold, &spec->threshold)) {
    return absl::InvalidArgumentError(absl::StrCat("csv spec clause '", Excerpt(clause, 200),
                                                   "': unparsable number '", Excerpt(threshold),
                                                   "' after '", Excerpt(op), "'"));
  }
  // A NaN threshold compares false with every value, an infinite one (or 1e999) true or false
  // with all of them: either makes every label the same.
  if (!std::isfinite(spec->threshold)) {
    return absl::InvalidArgumentError(absl::StrCat("csv spec clause '", Excerpt(clause, 200),
                                                   "': the threshold '", Excerpt(threshold),
                                                   "' is not a finite number"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Spec> ParseSpec(absl::string_view text, const Header& header) {
  Spec spec;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(
        "csv: a column spec is required, e.g. \"label=rating>3.5; dense=year; "
        "sparse=userId,movieId,split(genres,|)\"");
  }
  for (const std::string& clause : SplitTopLevel(text, ';')) {
    if (clause.empty()) continue;
    const size_t eq = clause.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("csv spec clause '", Excerpt(clause, 200),
                       "' is not KEY=VALUE (keys: label, dense, sparse)"));
    }
    const absl::string_view key =
        absl::StripAsciiWhitespace(absl::string_view(clause).substr(0, eq));
    const absl::string_view value =
        absl::StripAsciiWhitespace(absl::string_view(clause).substr(eq + 1));
    if (key == "label") {
      if (spec.label_column >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("csv spec clause '", Excerpt(clause, 200), "': the label is already set"));
      }
      RETURN_IF_ERROR(ParseLabel(value, clause, header, &spec));
    } else if (key == "dense") {
      for (const std::string& item : SplitTopLevel(value, ',')) {
        absl::string_view args;
        const bool log = Call(item, "log", &args);
        ASSIGN_OR_RETURN(const int column, FindColumn(header, log ? args : item, clause));
        spec.dense.push_back({column, log});
        spec.dense_names.push_back(item);
      }
    } else if (key == "sparse") {
      for (const std::string& item : SplitTopLevel(value, ',')) {
        absl::string_view args;
        SparseColumn sparse;
        absl::string_view name = item;
        if (Call(item, "split", &args)) {
          const size_t comma = args.find(',');
          if (comma == absl::string_view::npos || comma + 1 >= args.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat("csv spec clause '", Excerpt(clause, 200), "': '", Excerpt(item),
                             "' must be split(COLUMN,SEPARATOR)"));
          }
          name = absl::StripAsciiWhitespace(args.substr(0, comma));
          sparse.separator = std::string(args.substr(comma + 1));
          // One character, not one the spec's own syntax uses: "split(genres,|,userId)" is a
          // misplaced comma (a column lost inside the separator), not the separator "|,userId".
          if (sparse.separator.size() != 1 ||
              absl::StrContains(",;()\"' \t", sparse.separator[0])) {
            return absl::InvalidArgumentError(absl::StrCat(
                "csv spec clause '", Excerpt(clause, 200), "': '", Excerpt(item),
                "': the separator must be one character other than , ; ( ) quotes and spaces "
                "(got '",
                Excerpt(sparse.separator), "')"));
          }
        }
        ASSIGN_OR_RETURN(sparse.column, FindColumn(header, name, clause));
        spec.sparse.push_back(sparse);
        spec.table_names.emplace_back(name);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("csv spec clause '", Excerpt(clause, 200),
                                                     "': unknown key '", Excerpt(key),
                                                     "' (keys: label, dense, sparse)"));
    }
  }
  if (spec.label_column < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("csv spec '", Excerpt(text, 200), "' has no label=COLUMN clause"));
  }
  return spec;
}

class CsvSource final : public SampleSource {
 public:
  CsvSource(std::string path, std::FILE* file, const SourceOptions& options, size_t block_bytes)
      : path_(std::move(path)),
        shown_(Printable(path_)),
        file_(file),
        options_(options),
        block_bytes_(block_bytes) {}
  ~CsvSource() override { std::fclose(file_); }

  // Reads the header and the spec; called once by OpenCsv.
  absl::Status Init() {
    // The header is the first line that is not blank.
    std::string header_line;
    while (true) {
      ASSIGN_OR_RETURN(const bool has_header, NextLine(&header_line));
      if (!has_header) {
        return absl::InvalidArgumentError(
            absl::StrCat("csv: '", shown_, "' ",
                         line_number_ > 0 ? "has only blank lines (no header)" : "is empty"));
      }
      // A UTF-8 byte order mark (spreadsheet exports) is not part of the first column's name.
      if (line_number_ == 1 && absl::StartsWith(header_line, kUtf8Bom)) {
        header_line.erase(0, kUtf8Bom.size());
      }
      if (!header_line.empty()) break;
    }
    header_line_number_ = line_number_;
    size_t bad_column = 0;
    std::string what;
    if (!SplitCsvLine(header_line, &header_, &columns_, &bad_column, &what)) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown_, ":", header_line_number_, ":", bad_column, ": ", what));
    }
    ASSIGN_OR_RETURN(spec_,
                     ParseSpec(options_.schema,
                               Header{header_, absl::StrCat(shown_, ":", header_line_number_)}));
    schema_.dense_names = spec_.dense_names;
    schema_.table_names = spec_.table_names;
    schema_.table_rows.assign(spec_.sparse.size(), 1);
    dictionaries_.resize(spec_.sparse.size());
    data_start_ = file_offset_;
    stats_.lines += line_number_;
    return absl::OkStatus();
  }

  const Schema& schema() const override { return schema_; }

  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    const int tables = schema_.num_tables();
    const int dense = schema_.num_dense();
    batch->Reset(dense, tables);
    batch->first_sample = stream_offset_ + position_;
    // A batch counts samples in int32.
    int64_t want = std::min<int64_t>(max_samples, std::numeric_limits<int32_t>::max());
    if (options_.max_samples >= 0) want = std::min(want, options_.max_samples - position_);
    if (want <= 0) return 0;
    // Bags are gathered per table, then laid out table-major.
    std::vector<std::vector<int64_t>> table_ids(tables);
    std::vector<std::vector<int64_t>> table_sizes(tables);
    int64_t got = 0;
    std::string line;
    while (got < want) {
      ASSIGN_OR_RETURN(const bool more, NextLine(&line));
      if (!more) break;
      ++stats_.lines;
      // Blank lines (a trailing one is common) are neither samples nor bad lines.
      if (line.empty()) continue;
      const absl::Status parsed = ParseRecord(line, batch, &table_ids, &table_sizes);
      if (!parsed.ok()) {
        if (!options_.skip_bad_lines) return parsed;
        if (rewound_) continue;  // counted in the first pass
        ++stats_.skipped_lines;
        if (stats_.first_errors.size() < kMaxKeptErrors) {
          stats_.first_errors.emplace_back(parsed.message());
        }
        continue;
      }
      ++got;
    }
    if (got == 0) {
      // The end of an epoch that yielded nothing: the file has no usable data.
      if (position_ == 0) return NoData();
      return 0;
    }
    const int32_t n = static_cast<int32_t>(got);
    batch->num_samples = n;
    batch->offsets.assign(static_cast<size_t>(tables) * n + 1, 0);
    for (int t = 0; t < tables; ++t) {
      for (int32_t s = 0; s < n; ++s) {
        const size_t k = static_cast<size_t>(t) * n + s;
        batch->offsets[k + 1] = batch->offsets[k] + table_sizes[t][s];
      }
      batch->ids.insert(batch->ids.end(), table_ids[t].begin(), table_ids[t].end());
      schema_.table_rows[t] = static_cast<int64_t>(dictionaries_[t].size()) + 1;
    }
    position_ += got;
    stats_.samples += got;
    return got;
  }

  absl::Status Rewind() override {
    if (std::fseek(file_, data_start_, SEEK_SET) != 0) {
      return absl::DataLossError(
          absl::StrCat(shown_, ": cannot seek to the start for a new epoch"));
    }
    stream_offset_ += position_;
    position_ = 0;
    rewound_ = true;
    line_number_ = header_line_number_;
    block_.clear();
    block_pos_ = 0;
    file_offset_ = data_start_;
    eof_ = false;
    return absl::OkStatus();
  }

  SourceStats stats() const override { return stats_; }

  std::string Describe() const override {
    return absl::StrCat("csv:", shown_, " (", options_.schema, ")");
  }

 private:
  // Reads the next line (without '\n' and a trailing '\r'); false at the end of the file.
  absl::StatusOr<bool> NextLine(std::string* line) {
    line->clear();
    while (true) {
      if (block_pos_ == block_.size()) {
        if (eof_) {
          if (line->empty()) return false;
          break;
        }
        block_.resize(block_bytes_);
        const size_t read = std::fread(block_.data(), 1, block_bytes_, file_);
        if (read < block_bytes_) {
          if (std::ferror(file_)) {
            return absl::DataLossError(absl::StrCat(shown_, ": read error after line ",
                                                    line_number_, ": ", std::strerror(errno)));
          }
          eof_ = true;
        }
        block_.resize(read);
        block_pos_ = 0;
        stats_.bytes += static_cast<int64_t>(read);
        continue;
      }
      const char* begin = block_.data() + block_pos_;
      const void* nl = std::memchr(begin, '\n', block_.size() - block_pos_);
      const size_t len =
          nl == nullptr ? block_.size() - block_pos_ : static_cast<const char*>(nl) - begin;
      if (static_cast<int64_t>(line->size() + len) > options_.max_line_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(shown_, ":", line_number_ + 1, ": line longer than ",
                         options_.max_line_bytes, " bytes (no line break; not a CSV text file?)"));
      }
      line->append(begin, len);
      block_pos_ += len;
      file_offset_ += static_cast<int64_t>(len);
      if (nl != nullptr) {
        ++block_pos_;
        ++file_offset_;
        break;
      }
    }
    ++line_number_;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    return true;
  }

  absl::Status NoData() const {
    if (stats_.skipped_lines == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("csv: '", shown_, "' has a header but no data lines"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "csv: '", shown_, "' has no valid data line (", stats_.skipped_lines,
        " skipped; the first: ", stats_.first_errors.empty() ? "" : stats_.first_errors[0], ")"));
  }

  absl::Status LineError(size_t column, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(shown_, ":", line_number_, ":", column, ": ", what));
  }

  // Appends one sample; on error appends nothing.
  absl::Status ParseRecord(const std::string& line, Batch* batch,
                           std::vector<std::vector<int64_t>>* table_ids,
                           std::vector<std::vector<int64_t>>* table_sizes) {
    size_t bad_column = 0;
    std::string what;
    if (!SplitCsvLine(line, &fields_, &columns_, &bad_column, &what)) {
      return LineError(bad_column, what);
    }
    if (fields_.size() != header_.size()) {
      return LineError(line.size() + 1,
                       absl::StrCat("expected ", header_.size(), " comma-separated fields, found ",
                                    fields_.size()));
    }
    // Column of each field's start, for messages (quotes make it differ from the text offset).
    auto column_of = [&](int field) { return columns_[field]; };
    // A finite number (inf, -inf and 1e400 are refused: they would make the loss NaN).
    auto number = [&](int field, absl::string_view role, double* out) -> absl::Status {
      const std::string& text = fields_[field];
      // Decimal only: strtod would read "0x10" as 16.
      if (!ParseDecimalDouble(text, out) || std::isnan(*out)) {
        return LineError(column_of(field),
                         absl::StrCat(role, " column '", Excerpt(header_[field]), "': '",
                                      Excerpt(text), "' is not a number"));
      }
      if (!std::isfinite(*out)) {
        return LineError(column_of(field),
                         absl::StrCat(role, " column '", Excerpt(header_[field]), "': '",
                                      Excerpt(text), "' is not a finite float"));
      }
      return absl::OkStatus();
    };
    double label = 0;
    if (IsMissing(fields_[spec_.label_column])) {
      return LineError(column_of(spec_.label_column),
                       absl::StrCat("label column '", Excerpt(header_[spec_.label_column]),
                                    "' is missing ('", Excerpt(fields_[spec_.label_column]), "')"));
    }
    RETURN_IF_ERROR(number(spec_.label_column, "label", &label));
    if (spec_.compare == Compare::kNone && !(label >= 0 && label <= 1)) {
      return LineError(
          column_of(spec_.label_column),
          absl::StrCat("label column '", Excerpt(header_[spec_.label_column]),
                       "': ", Excerpt(fields_[spec_.label_column]),
                       " is outside [0, 1] (labels are click probabilities; for other values "
                       "use a comparison, e.g. label=",
                       Excerpt(header_[spec_.label_column]), ">3.5)"));
    }
    double dense_values[64];
    std::vector<double> dense_heap;
    double* dense_out = dense_values;
    if (spec_.dense.size() > 64) {
      dense_heap.resize(spec_.dense.size());
      dense_out = dense_heap.data();
    }
    for (size_t d = 0; d < spec_.dense.size(); ++d) {
      const DenseColumn& column = spec_.dense[d];
      double value = 0;
      if (!IsMissing(fields_[column.column])) {
        RETURN_IF_ERROR(number(column.column, "dense", &value));
      }
      if (column.log) value = std::log1p(std::max(value, 0.0));
      if (!std::isfinite(static_cast<float>(value))) {
        return LineError(column_of(column.column),
                         absl::StrCat("dense column '", Excerpt(header_[column.column]), "': '",
                                      Excerpt(fields_[column.column]), "' is not a finite float"));
      }
      dense_out[d] = value;
    }
    // The line is valid: only now may dictionaries grow.
    switch (spec_.compare) {
      case Compare::kNone:
        break;
      case Compare::kGreater:
        label = label > spec_.threshold;
        break;
      case Compare::kGreaterEqual:
        label = label >= spec_.threshold;
        break;
      case Compare::kLess:
        label = label < spec_.threshold;
        break;
      case Compare::kLessEqual:
        label = label <= spec_.threshold;
        break;
      case Compare::kEqual:
        label = label == spec_.threshold;
        break;
    }
    batch->labels.push_back(static_cast<float>(label));
    for (size_t d = 0; d < spec_.dense.size(); ++d) {
      batch->dense.push_back(static_cast<float>(dense_out[d]));
    }
    for (size_t t = 0; t < spec_.sparse.size(); ++t) {
      const SparseColumn& column = spec_.sparse[t];
      const std::string& text = fields_[column.column];
      std::vector<int64_t>& ids = (*table_ids)[t];
      if (IsMissing(text)) {
        ids.push_back(0);
        (*table_sizes)[t].push_back(1);
        continue;
      }
      if (column.separator.empty()) {
        ids.push_back(Encode(t, text));
        (*table_sizes)[t].push_back(1);
        continue;
      }
      int64_t size = 0;
      for (absl::string_view piece : absl::StrSplit(text, column.separator, absl::SkipEmpty())) {
        ids.push_back(Encode(t, piece));
        ++size;
      }
      (*table_sizes)[t].push_back(size);
    }
    return absl::OkStatus();
  }

  int64_t Encode(size_t table, absl::string_view value) {
    absl::flat_hash_map<std::string, int64_t>& dictionary = dictionaries_[table];
    const auto it = dictionary.find(value);
    if (it != dictionary.end()) return it->second;
    const int64_t id = static_cast<int64_t>(dictionary.size()) + 1;
    dictionary.emplace(std::string(value), id);
    return id;
  }

  const std::string path_;
  const std::string shown_;  // path_ as messages show it (Printable)
  std::FILE* const file_;
  const SourceOptions options_;
  const size_t block_bytes_;
  Spec spec_;
  std::vector<std::string> header_;
  Schema schema_;
  SourceStats stats_;
  std::vector<absl::flat_hash_map<std::string, int64_t>> dictionaries_;
  std::vector<std::string> fields_;  // scratch
  std::vector<size_t> columns_;      // scratch: the column where each of fields_ starts

  std::string block_;
  size_t block_pos_ = 0;
  bool eof_ = false;
  int64_t file_offset_ = 0;         // of block_[block_pos_]
  int64_t data_start_ = 0;          // of the first line after the header
  int64_t header_line_number_ = 1;  // blank lines may precede the header
  int64_t line_number_ = 0;         // of the line last returned by NextLine
  int64_t position_ = 0;            // samples returned this epoch
  int64_t stream_offset_ = 0;       // samples of previous epochs
  bool rewound_ = false;            // past the first pass: bad lines are not counted again
};

}  // namespace

nlohmann::json CanonicalCsvSpec(absl::string_view spec) {
  const nlohmann::json as_given = std::string(spec);
  bool has_label = false;
  std::string label;
  std::vector<std::string> dense;
  std::vector<std::string> sparse;
  // An item as the reader takes it: log(C) in a dense clause and split(C,S) in a sparse one are
  // calls (spaces around C are layout); any other item is a column name.
  auto items = [](absl::string_view value, absl::string_view call, std::vector<std::string>* out) {
    for (const std::string& item : SplitTopLevel(value, ',')) {
      absl::string_view args;
      if (call == "log" && Call(item, "log", &args)) {
        out->push_back(absl::StrCat("log(", args, ")"));
      } else if (call == "split" && Call(item, "split", &args) &&
                 args.find(',') != absl::string_view::npos) {
        // The separator is kept as written (a space there is a mistake the reader names).
        const size_t comma = args.find(',');
        out->push_back(absl::StrCat("split(", absl::StripAsciiWhitespace(args.substr(0, comma)),
                                    ",", args.substr(comma + 1), ")"));
      } else {
        out->push_back(item);
      }
    }
  };
  for (const std::string& clause : SplitTopLevel(spec, ';')) {
    if (clause.empty()) continue;
    const size_t eq = clause.find('=');
    if (eq == std::string::npos) return as_given;
    const absl::string_view key =
        absl::StripAsciiWhitespace(absl::string_view(clause).substr(0, eq));
    const absl::string_view value =
        absl::StripAsciiWhitespace(absl::string_view(clause).substr(eq + 1));
    if (key == "label") {
      if (has_label) return as_given;
      has_label = true;
      const size_t op_begin = value.find_first_of("<>=!");
      label = std::string(absl::StripAsciiWhitespace(value.substr(0, op_begin)));
      if (op_begin == absl::string_view::npos) continue;
      size_t op_end = value.find_first_not_of("<>=!", op_begin);
      if (op_end == absl::string_view::npos) op_end = value.size();
      const absl::string_view threshold = absl::StripAsciiWhitespace(value.substr(op_end));
      double number = 0;
      absl::StrAppend(&label, value.substr(op_begin, op_end - op_begin),
                      ParseDecimalDouble(threshold, &number) ? absl::StrFormat("%.17g", number)
                                                             : std::string(threshold));
    } else if (key == "dense") {
      items(value, "log", &dense);
    } else if (key == "sparse") {
      items(value, "split", &sparse);
    } else {
      return as_given;
    }
  }
  if (!has_label) return as_given;
  return {{"label", label}, {"dense", dense}, {"sparse", sparse}};
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenCsv(const std::string& path,
                                                      const SourceOptions& options) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    const std::string message =
        absl::StrCat("csv: cannot open '", Printable(path), "': ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::InvalidArgumentError(message);
  }
  struct stat st;
  const bool stated = fstat(fileno(file), &st) == 0;
  if (!stated || S_ISDIR(st.st_mode)) {
    const std::string message = absl::StrCat("csv: cannot read '", Printable(path),
                                             "': ", stated ? "a directory" : std::strerror(errno));
    std::fclose(file);
    return absl::InvalidArgumentError(message);
  }
  if (absl::Status plain = RefuseCompressedFile(fileno(file), "csv:" + Printable(path));
      !plain.ok()) {
    std::fclose(file);
    return plain;
  }
  // A small file needs no full-sized block (zero-filling 1 MiB per read would dominate).
  const size_t block = S_ISREG(st.st_mode)
                           ? std::min(kBlockBytes, static_cast<size_t>(st.st_size) + 1)
                           : kBlockBytes;
  auto source = std::make_unique<CsvSource>(path, file, options, block);
  RETURN_IF_ERROR(source->Init());
  return std::unique_ptr<SampleSource>(std::move(source));
}

}  // namespace bagpipe
