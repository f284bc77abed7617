#include "data/criteo_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/excerpt.h"
#include "core/status.h"
#include "core/tunables.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace bagpipe {
namespace {

constexpr int kFields = 1 + kCriteoDense + kCriteoTables;
// Errors kept in SourceStats::first_errors under skip_bad_lines.
constexpr size_t kMaxKeptErrors = 10;
constexpr absl::string_view kUtf8Bom = "\xEF\xBB\xBF";

std::string FieldName(int field) {
  if (field == 0) return "label";
  if (field <= kCriteoDense) return absl::StrCat("I", field);
  return absl::StrCat("C", field - kCriteoDense);
}

// One parsed line, before categorical values become rows.
struct ParsedLine {
  float label = 0;
  float dense[kCriteoDense] = {};
  uint64_t values[kCriteoTables] = {};
  uint32_t missing = 0;  // bit t: table t's value is empty
  bool blank = false;    // an empty line (or a lone "\r"): skipped, neither a sample nor an error
  std::string error;     // empty when the line parsed
};

// Parses `line` (without its '\n'); on failure sets out->error to "LINE:COL: what".
void ParseLine(absl::string_view line, int64_t line_number, int64_t max_line_bytes,
               ParsedLine* out) {
  out->error.clear();
  out->missing = 0;
  // Blank lines (a trailing one is common) are skipped; every line still counts for numbering.
  out->blank = line.empty() || (line.size() == 1 && line[0] == '\r');
  if (out->blank) return;
  if (static_cast<int64_t>(line.size()) > max_line_bytes) {
    out->error = absl::StrCat(line_number, ": line longer than ", max_line_bytes, " bytes");
    return;
  }
  if (!line.empty() && line.back() == '\r') {
    out->error = absl::StrCat(line_number, ":", line.size(),
                              ": line ends with CRLF (\\r\\n); Criteo files use LF line endings");
    return;
  }
  const int64_t fields = std::count(line.begin(), line.end(), '\t') + 1;
  if (fields != kFields) {
    // Point at the first extra field, or at the end of a short line.
    size_t column = line.size() + 1;
    if (fields > kFields) {
      column = 0;
      for (int tabs = 0; tabs < kFields; ++column) tabs += line[column] == '\t';
      ++column;
    }
    // 39 fields: the layout of the Kaggle test set, which has no label (it cannot train).
    out->error = absl::StrCat(
        line_number, ":", column, ": expected ", kFields, " tab-separated fields, found ", fields,
        fields == kFields - 1 ? " (the label, 13 integer and 26 categorical fields; a test "
                                "file without labels cannot train)"
                              : "");
    return;
  }
  size_t begin = 0;
  int field = 0;
  while (true) {
    size_t end = line.find('\t', begin);
    if (end == absl::string_view::npos) end = line.size();
    const absl::string_view text = line.substr(begin, end - begin);
    const char* first = text.data();
    const char* last = text.data() + text.size();
    const size_t column = begin + 1;
    if (field == 0) {
      if (text != "0" && text != "1") {
        out->error =
            absl::StrCat(line_number, ":", column, ": label '", Excerpt(text), "' must be 0 or 1");
        return;
      }
      out->label = text[0] == '1' ? 1.0f : 0.0f;
    } else if (field <= kCriteoDense) {
      float value = 0;
      if (!text.empty()) {
        int64_t parsed = 0;
        const auto [ptr, ec] = std::from_chars(first, last, parsed);
        if (ec == std::errc::result_out_of_range && ptr == last) {
          out->error =
              absl::StrCat(line_number, ":", column, ": dense field ", FieldName(field), " '",
                           Excerpt(text), "' is out of range (dense values are 64-bit integers)");
          return;
        }
        if (ec != std::errc() || ptr != last) {
          out->error = absl::StrCat(line_number, ":", column, ": dense field ", FieldName(field),
                                    " '", Excerpt(text), "' is not an integer");
          return;
        }
        value = static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(parsed, 0))));
      }
      out->dense[field - 1] = value;
    } else {
      const int table = field - 1 - kCriteoDense;
      if (text.empty()) {
        out->missing |= uint32_t{1} << table;
        out->values[table] = 0;
      } else {
        uint64_t parsed = 0;
        const auto [ptr, ec] = std::from_chars(first, last, parsed, 16);
        if (ptr == last && (ec == std::errc::result_out_of_range || text.size() > 16)) {
          out->error =
              absl::StrCat(line_number, ":", column, ": categorical field ", FieldName(field), " '",
                           Excerpt(text), "' is out of range (more than 16 hex digits)");
          return;
        }
        if (ec != std::errc() || ptr != last) {
          out->error =
              absl::StrCat(line_number, ":", column, ": categorical field ", FieldName(field), " '",
                           Excerpt(text), "' is not a hexadecimal value (up to 16 hex digits)");
          return;
        }
        out->values[table] = parsed;
      }
    }
    ++field;
    if (end == line.size()) break;
    begin = end + 1;
  }
}

class CriteoSource final : public SampleSource {
 public:
  CriteoSource(std::string path, std::FILE* file, const SourceOptions& options, size_t chunk_bytes)
      : path_(std::move(path)),
        shown_(Printable(path_)),
        file_(file),
        options_(options),
        chunk_bytes_(chunk_bytes) {
    for (int c = 0; c < kCriteoDense; ++c) schema_.dense_names.push_back(FieldName(c + 1));
    for (int t = 0; t < kCriteoTables; ++t) {
      schema_.table_names.push_back(FieldName(1 + kCriteoDense + t));
      schema_.table_rows.push_back(options_.row_budget > 0 ? options_.row_budget : 1);
    }
    if (options_.row_budget == 0) dictionaries_.resize(kCriteoTables);
  }
  ~CriteoSource() override { std::fclose(file_); }

  const Schema& schema() const override { return schema_; }

  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    batch->Reset(kCriteoDense, kCriteoTables);
    batch->first_sample = stream_offset_ + position_;
    // A batch counts samples in int32.
    int64_t want = std::min<int64_t>(max_samples, std::numeric_limits<int32_t>::max());
    if (options_.max_samples >= 0) want = std::min(want, options_.max_samples - position_);
    if (want <= 0) return 0;
    // Gather parsed samples (labels and dense directly; raw categorical values staged).
    raw_.clear();
    missing_.clear();
    int64_t got = 0;
    while (got < want) {
      if (cursor_ == parsed_count_) {
        ASSIGN_OR_RETURN(const bool more, Refill());
        if (!more) break;
        continue;
      }
      const int64_t take = std::min<int64_t>(want - got, parsed_count_ - cursor_);
      for (int64_t i = cursor_; i < cursor_ + take; ++i) {
        const ParsedLine& line = lines_[good_[i]];
        batch->labels.push_back(line.label);
        batch->dense.insert(batch->dense.end(), line.dense, line.dense + kCriteoDense);
        raw_.insert(raw_.end(), line.values, line.values + kCriteoTables);
        missing_.push_back(line.missing);
      }
      cursor_ += take;
      got += take;
    }
    if (got == 0) {
      // The end of an epoch that yielded nothing: the file has no usable line.
      if (position_ == 0) return NoData();
      return 0;
    }
    const int32_t n = static_cast<int32_t>(got);
    batch->num_samples = n;
    batch->offsets.resize(static_cast<size_t>(kCriteoTables) * n + 1);
    for (size_t i = 0; i < batch->offsets.size(); ++i) batch->offsets[i] = static_cast<int64_t>(i);
    batch->ids.resize(static_cast<size_t>(kCriteoTables) * n);
    // Tables are independent: each is encoded by one task, in sample order, so dictionary ids
    // do not depend on the thread count.
    tbb::parallel_for(0, kCriteoTables, [&](int t) { EncodeTable(t, n, batch); });
    if (options_.row_budget == 0) {
      for (int t = 0; t < kCriteoTables; ++t) {
        schema_.table_rows[t] = static_cast<int64_t>(dictionaries_[t].size()) + 1;
      }
    }
    position_ += got;
    stats_.samples += got;
    return got;
  }

  absl::Status Rewind() override {
    if (std::fseek(file_, 0, SEEK_SET) != 0) {
      return absl::DataLossError(
          absl::StrCat(shown_, ": cannot seek to the start for a new epoch"));
    }
    stream_offset_ += position_;
    position_ = 0;
    rewound_ = true;
    line_number_ = 0;
    carry_.clear();
    eof_ = false;
    at_start_ = true;
    cursor_ = 0;
    parsed_count_ = 0;
    return absl::OkStatus();
  }

  SourceStats stats() const override { return stats_; }

  std::string Describe() const override {
    if (options_.row_budget > 0) {
      return absl::StrCat("criteo:", shown_, " (mod ", options_.row_budget, " hashing)");
    }
    return absl::StrCat("criteo:", shown_, " (dictionary encoding)");
  }

 private:
  absl::Status NoData() const {
    if (stats_.skipped_lines == 0) {
      return absl::InvalidArgumentError(absl::StrCat("criteo: '", shown_, "' has no data lines"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "criteo: '", shown_, "' has no valid line (", stats_.skipped_lines,
        " skipped; the first: ", stats_.first_errors.empty() ? "" : stats_.first_errors[0], ")"));
  }

  void EncodeTable(int t, int32_t n, Batch* batch) {
    int64_t* ids = batch->ids.data() + static_cast<size_t>(t) * n;
    const uint32_t bit = uint32_t{1} << t;
    if (options_.row_budget > 0) {
      const uint64_t modulus = static_cast<uint64_t>(options_.row_budget - 1);
      for (int32_t s = 0; s < n; ++s) {
        ids[s] = (missing_[s] & bit)
                     ? 0
                     : 1 + static_cast<int64_t>(raw_[static_cast<size_t>(s) * kCriteoTables + t] %
                                                modulus);
      }
      return;
    }
    absl::flat_hash_map<uint64_t, int64_t>& dictionary = dictionaries_[t];
    for (int32_t s = 0; s < n; ++s) {
      if (missing_[s] & bit) {
        ids[s] = 0;
        continue;
      }
      const auto [it, inserted] =
          dictionary.try_emplace(raw_[static_cast<size_t>(s) * kCriteoTables + t],
                                 static_cast<int64_t>(dictionary.size()) + 1);
      ids[s] = it->second;
    }
  }

  // Reads and parses the next chunk of complete lines. Returns false at the end of the file.
  absl::StatusOr<bool> Refill() {
    cursor_ = 0;
    parsed_count_ = 0;
    while (parsed_count_ == 0) {
      if (eof_ && carry_.empty()) return false;
      // buffer_ = carry_ (a partial line) + the next block of the file.
      buffer_.swap(carry_);
      carry_.clear();
      if (!eof_) {
        const size_t old = buffer_.size();
        buffer_.resize(old + chunk_bytes_);
        const size_t read = std::fread(buffer_.data() + old, 1, chunk_bytes_, file_);
        if (read < chunk_bytes_) {
          if (std::ferror(file_)) {
            return absl::DataLossError(absl::StrCat(shown_, ": read error after line ",
                                                    line_number_, ": ", std::strerror(errno)));
          }
          eof_ = true;
        }
        buffer_.resize(old + read);
        stats_.bytes += static_cast<int64_t>(read);
      }
      // A UTF-8 byte order mark at the very start of the file (some exporters write one) is not
      // part of the first label; columns on line 1 are counted after it. The first read holds
      // at least three bytes unless the file is shorter.
      if (at_start_) {
        at_start_ = false;
        if (absl::StartsWith(buffer_, kUtf8Bom)) buffer_.erase(0, kUtf8Bom.size());
      }
      // Complete lines end at the last '\n'; at the end of the file the rest is a line too.
      size_t usable = buffer_.size();
      if (!eof_) {
        const size_t last_newline = buffer_.rfind('\n');
        if (last_newline == std::string::npos) {
          // One line longer than a block: read more, up to the line length limit.
          if (static_cast<int64_t>(buffer_.size()) > options_.max_line_bytes) {
            return absl::InvalidArgumentError(absl::StrCat(
                shown_, ":", line_number_ + 1, ": line longer than ", options_.max_line_bytes,
                " bytes (no line break; not a Criteo TSV file?)"));
          }
          carry_.swap(buffer_);
          continue;
        }
        usable = last_newline + 1;
        carry_.assign(buffer_, usable, std::string::npos);
      }
      starts_.clear();
      for (size_t p = 0; p < usable;) {
        starts_.push_back(p);
        const void* nl = std::memchr(buffer_.data() + p, '\n', usable - p);
        p = nl == nullptr ? usable : static_cast<const char*>(nl) - buffer_.data() + 1;
      }
      const size_t count = starts_.size();
      starts_.push_back(usable);
      if (lines_.size() < count) lines_.resize(count);
      const int64_t first_line = line_number_ + 1;
      const absl::string_view text(buffer_.data(), usable);
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, count, 256), [&](const tbb::blocked_range<size_t>& range) {
            for (size_t i = range.begin(); i < range.end(); ++i) {
              size_t end = starts_[i + 1];
              if (end > starts_[i] && text[end - 1] == '\n') --end;
              ParseLine(text.substr(starts_[i], end - starts_[i]),
                        first_line + static_cast<int64_t>(i), options_.max_line_bytes, &lines_[i]);
            }
          });
      line_number_ += static_cast<int64_t>(count);
      stats_.lines += static_cast<int64_t>(count);
      good_.clear();
      for (size_t i = 0; i < count; ++i) {
        if (lines_[i].error.empty()) {
          if (!lines_[i].blank) good_.push_back(i);
          continue;
        }
        std::string message = absl::StrCat(shown_, ":", lines_[i].error);
        if (!options_.skip_bad_lines) return absl::InvalidArgumentError(message);
        if (rewound_) continue;  // counted in the first pass
        ++stats_.skipped_lines;
        if (stats_.first_errors.size() < kMaxKeptErrors) {
          stats_.first_errors.push_back(std::move(message));
        }
      }
      parsed_count_ = static_cast<int64_t>(good_.size());
    }
    return true;
  }

  const std::string path_;
  const std::string shown_;  // path_ as messages show it (Printable)
  std::FILE* const file_;
  const SourceOptions options_;
  const size_t chunk_bytes_;
  Schema schema_;
  SourceStats stats_;
  std::vector<absl::flat_hash_map<uint64_t, int64_t>> dictionaries_;  // dictionary encoding only

  std::string buffer_;  // the block being parsed
  std::string carry_;   // a partial line left over from the previous block
  bool eof_ = false;
  bool at_start_ = true;     // the next read is the first of the file (this epoch)
  bool rewound_ = false;     // past the first pass: bad lines are not counted again
  int64_t line_number_ = 0;  // lines read so far this epoch
  std::vector<size_t> starts_;
  std::vector<ParsedLine> lines_;
  std::vector<size_t> good_;  // indices of the parsed lines in lines_
  int64_t parsed_count_ = 0;
  int64_t cursor_ = 0;  // next entry of good_ to return

  std::vector<uint64_t> raw_;      // staged categorical values, sample-major
  std::vector<uint32_t> missing_;  // staged missing masks
  int64_t position_ = 0;           // samples returned this epoch
  int64_t stream_offset_ = 0;      // samples of previous epochs
};

}  // namespace

absl::StatusOr<std::unique_ptr<SampleSource>> OpenCriteo(const std::string& path,
                                                         const SourceOptions& options) {
  if (options.row_budget < 0 || options.row_budget == 1 ||
      options.row_budget > (int64_t{1} << 62) / kCriteoTables) {
    return absl::InvalidArgumentError(
        absl::StrCat("criteo:", Printable(path), ": row budget ", options.row_budget,
                     " must be 0 (dictionary encoding) or in [2, 2^62 / 26] (row 0 is the "
                     "missing row)"));
  }
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    const std::string message =
        absl::StrCat("criteo: cannot open '", Printable(path), "': ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::InvalidArgumentError(message);
  }
  // Regular files must hold something; pipes and devices stream (and cannot be rewound).
  struct stat st;
  if (fstat(fileno(file), &st) != 0) {
    const std::string message =
        absl::StrCat("criteo: cannot stat '", Printable(path), "': ", std::strerror(errno));
    std::fclose(file);
    return absl::InvalidArgumentError(message);
  }
  if (S_ISDIR(st.st_mode) || (S_ISREG(st.st_mode) && st.st_size == 0)) {
    std::fclose(file);
    return absl::InvalidArgumentError(absl::StrCat("criteo: '", Printable(path), "' is ",
                                                   S_ISDIR(st.st_mode) ? "a directory" : "empty"));
  }
  if (absl::Status plain = RefuseCompressedFile(fileno(file), "criteo:" + Printable(path));
      !plain.ok()) {
    std::fclose(file);
    return plain;
  }
  // Bytes per refill: large enough to amortise the parallel parse, small enough to stream (a
  // tunable). A small file needs no full-sized chunk (zero-filling 4 MiB per read would dominate).
  const size_t chunk_bytes = static_cast<size_t>(ReaderChunkBytes());
  const size_t chunk = S_ISREG(st.st_mode)
                           ? std::min(chunk_bytes, static_cast<size_t>(st.st_size) + 1)
                           : chunk_bytes;
  return std::unique_ptr<SampleSource>(new CriteoSource(path, file, options, chunk));
}

}  // namespace bagpipe
