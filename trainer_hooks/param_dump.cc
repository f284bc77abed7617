#include "trainer_hooks/param_dump.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/excerpt.h"
#include "core/json_fields.h"
#include "core/status.h"

namespace bagpipe {
namespace {

constexpr char kMagic[8] = {'B', 'G', 'P', 'A', 'R', 'A', 'M', 'S'};
// The header is written first with a fixed size so the final values (row count, hash) can be
// filled in at the end without moving the body.
constexpr size_t kHeaderBytes = 64 * 1024;

std::string ParamsPath(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) return path + "/params.bin";
  return path;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParamWriter>> ParamWriter::Create(const std::string& dir,
                                                                 nlohmann::json header,
                                                                 int record_floats) {
  auto writer = std::unique_ptr<ParamWriter>(new ParamWriter());
  writer->header_ = std::move(header);
  writer->record_floats_ = record_floats;
  if (!dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create parameter directory '", dir, "': ", error.message()));
    }
    ASSIGN_OR_RETURN(writer->file_, AtomicFileWriter::Open(dir + "/params.bin"));
    const std::vector<char> blank(kHeaderBytes, ' ');
    RETURN_IF_ERROR(writer->file_->Append(blank.data(), blank.size()));
  }
  return writer;
}

ParamWriter::~ParamWriter() = default;

absl::Status ParamWriter::Write(const void* data, size_t bytes) {
  sha_.Update(data, bytes);
  if (file_ != nullptr) {
    if (absl::Status written = file_->Append(data, bytes); !written.ok()) {
      file_error_ = std::move(written);
      file_.reset();  // discards the partial file; the fingerprint goes on
    }
  }
  return absl::OkStatus();
}

absl::Status ParamWriter::AddDense(const std::vector<float>& dense) {
  dense_count_ = static_cast<int64_t>(dense.size());
  return Write(dense.data(), dense.size() * sizeof(float));
}

absl::Status ParamWriter::AddRow(RowId row, const float* record) {
  if (has_last_ && row <= last_row_) {
    return absl::InternalError(
        absl::StrCat("parameter rows out of order: ", row, " after ", last_row_));
  }
  has_last_ = true;
  last_row_ = row;
  ++rows_;
  RETURN_IF_ERROR(Write(&row, sizeof(row)));
  return Write(record, static_cast<size_t>(record_floats_) * sizeof(float));
}

absl::StatusOr<std::string> ParamWriter::Finish() {
  const std::string digest = sha_.HexDigest();
  if (file_ == nullptr) return digest;
  header_["record_floats"] = record_floats_;
  header_["dense_count"] = dense_count_;
  header_["rows"] = rows_;
  header_["sha256"] = digest;
  const std::string text = DumpJson(header_);
  if (text.size() + sizeof(kMagic) + sizeof(uint64_t) > kHeaderBytes) {
    return absl::InternalError("parameter header too large");
  }
  std::string head(kMagic, sizeof(kMagic));
  const uint64_t length = text.size();
  head.append(reinterpret_cast<const char*>(&length), sizeof(length));
  head += text;
  absl::Status written = file_->OverwriteAt(0, head.data(), head.size());
  if (written.ok()) written = file_->Commit();
  if (!written.ok()) file_error_ = std::move(written);
  file_.reset();
  return digest;
}

absl::StatusOr<ParamDump> ReadParamDump(const std::string& path) {
  const std::string file_path = ParamsPath(path);
  // Opened without blocking (a FIFO would wait for a writer) and checked before any read.
  const int fd = ::open(file_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open '", file_path, "': ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("'", file_path, "' is not a Bagpipe parameter file (not a regular file)"));
  }
  std::FILE* file = ::fdopen(fd, "rb");
  if (file == nullptr) {
    const int error = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("cannot read '", file_path, "': ", std::strerror(error)));
  }
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(file, &std::fclose);
  const int64_t size = st.st_size;
  char magic[8];
  uint64_t length = 0;
  if (std::fread(magic, 1, 8, file) != 8 || std::memcmp(magic, kMagic, 8) != 0 ||
      std::fread(&length, sizeof(length), 1, file) != 1) {
    return absl::DataLossError(absl::StrCat("'", file_path, "' is not a Bagpipe parameter file"));
  }
  constexpr uint64_t kPrefix = sizeof(kMagic) + sizeof(uint64_t);
  if (length > kHeaderBytes - kPrefix) {
    return absl::DataLossError(absl::StrCat("'", file_path, "': corrupt header (", length,
                                            " header bytes announced, at most ",
                                            kHeaderBytes - kPrefix, ")"));
  }
  if (size < static_cast<int64_t>(kHeaderBytes)) {
    return absl::DataLossError(absl::StrCat("'", file_path, "': truncated header (", size,
                                            " bytes, the header alone has ", kHeaderBytes, ")"));
  }
  std::string text(length, '\0');
  if (std::fread(text.data(), 1, length, file) != length) {
    return absl::DataLossError(absl::StrCat("'", file_path, "': truncated header"));
  }
  ParamDump dump;
  dump.header = ParseUntrustedJson(text);
  if (dump.header.is_discarded() || !dump.header.is_object()) {
    return absl::DataLossError(absl::StrCat("'", file_path, "': malformed header"));
  }
  // Every size is checked against the file before anything is allocated.
  auto field = [&](const char* key, int64_t max) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> value = JsonInt64(dump.header, key);
    if (!value.ok()) return Annotate(value.status(), absl::StrCat("'", file_path, "': header"));
    if (*value < 0 || *value > max) {
      return absl::DataLossError(absl::StrCat("'", file_path, "': header field \"", key, "\" is ",
                                              *value, " (expected 0 to ", max, ")"));
    }
    return *value;
  };
  constexpr int64_t kMaxRecordFloats = int64_t{1} << 24;
  const int64_t body = size - static_cast<int64_t>(kHeaderBytes);
  ASSIGN_OR_RETURN(const int64_t dense, field("dense_count", body / 4));
  ASSIGN_OR_RETURN(const int64_t rows, field("rows", body / 8));
  ASSIGN_OR_RETURN(const int64_t record_floats, field("record_floats", kMaxRecordFloats));
  const std::optional<int64_t> row_bytes = CheckedAdd(8, record_floats * 4);
  const std::optional<int64_t> all_rows = CheckedMul(rows, *row_bytes);
  const std::optional<int64_t> expected =
      all_rows ? CheckedAdd(dense * 4, *all_rows) : std::nullopt;
  if (!expected || *expected != body) {
    return absl::DataLossError(absl::StrCat(
        "'", file_path, "' is ", expected && *expected < body ? "longer than" : "truncated for",
        " its header (", dense, " dense values, ", rows, " rows of ", record_floats,
        " floats: ", expected ? absl::StrCat(*expected) : std::string("too many"),
        " body bytes; the file holds ", body, ")"));
  }
  dump.record_floats = static_cast<int>(record_floats);
  if (std::fseek(file, static_cast<long>(kHeaderBytes), SEEK_SET) != 0) {
    return absl::DataLossError(absl::StrCat("'", file_path, "': cannot seek to the body"));
  }
  Sha256 sha;
  dump.dense.resize(dense);
  dump.rows.resize(rows);
  dump.records.resize(static_cast<size_t>(rows) * dump.record_floats);
  bool ok = std::fread(dump.dense.data(), sizeof(float), dense, file) == static_cast<size_t>(dense);
  sha.Update(dump.dense.data(), dump.dense.size() * sizeof(float));
  for (int64_t r = 0; ok && r < rows; ++r) {
    float* record = dump.records.data() + r * dump.record_floats;
    ok = std::fread(&dump.rows[r], sizeof(RowId), 1, file) == 1 &&
         std::fread(record, sizeof(float), dump.record_floats, file) ==
             static_cast<size_t>(dump.record_floats);
    if (!ok) break;
    if (r > 0 && dump.rows[r] <= dump.rows[r - 1]) {
      return absl::DataLossError(absl::StrCat("'", file_path, "': row ", r, " (RowId ",
                                              dump.rows[r], ") does not follow RowId ",
                                              dump.rows[r - 1], " (rows must increase)"));
    }
    sha.Update(&dump.rows[r], sizeof(RowId));
    sha.Update(record, static_cast<size_t>(dump.record_floats) * sizeof(float));
  }
  if (!ok) {
    return absl::DataLossError(
        absl::StrCat("'", file_path, "': truncated body (the file shrank while being read)"));
  }
  // The fingerprint the writer stored covers exactly these bytes.
  if (dump.header.contains("sha256")) {
    ASSIGN_OR_RETURN(const std::string stored, JsonString(dump.header, "sha256"));
    const std::string actual = sha.HexDigest();
    if (stored != actual) {
      return absl::DataLossError(absl::StrCat("'", file_path,
                                              "' is corrupt: SHA-256 of the parameters is ", actual,
                                              ", the header says ", Excerpt(stored, 64)));
    }
  }
  return dump;
}

nlohmann::json ParamComparison::ToJson() const {
  nlohmann::json json = {{"identical", identical},
                         {"comparable", comparable},
                         {"same_shape", same_shape},
                         {"dense_values", {dense_values[0], dense_values[1]}},
                         {"record_floats", {record_floats[0], record_floats[1]}},
                         {"rows_only_in_a", rows_only_in_a},
                         {"rows_only_in_b", rows_only_in_b}};
  if (comparable) {
    json["dense_max_abs_diff"] = dense_max_abs_diff;
    json["rows_max_abs_diff"] = rows_max_abs_diff;
    json["differing_values"] = differing_values;
    json["nonfinite_differences"] = nonfinite_differences;
  } else {
    json["dense_max_abs_diff"] = nullptr;
    json["rows_max_abs_diff"] = nullptr;
    json["differing_values"] = nullptr;
  }
  return json;
}

ParamComparison CompareParams(const ParamDump& a, const ParamDump& b) {
  ParamComparison c;
  c.dense_values[0] = static_cast<int64_t>(a.dense.size());
  c.dense_values[1] = static_cast<int64_t>(b.dense.size());
  c.record_floats[0] = a.record_floats;
  c.record_floats[1] = b.record_floats;
  c.comparable = a.dense.size() == b.dense.size() && a.record_floats == b.record_floats;
  // One value pair: counted when its bits differ; a NaN difference makes the maximum NaN for
  // good (std::max would drop it), an infinite one makes it inf unless it is NaN already.
  auto compare = [&c](float x, float y, double* max_abs_diff) {
    if (std::memcmp(&x, &y, sizeof(float)) == 0) return;
    ++c.differing_values;
    const double d = std::abs(static_cast<double>(x) - static_cast<double>(y));
    if (!std::isfinite(d)) {
      ++c.nonfinite_differences;
      if (!std::isnan(*max_abs_diff)) *max_abs_diff = d;
    } else if (!std::isnan(*max_abs_diff) && d > *max_abs_diff) {
      *max_abs_diff = d;
    }
  };
  if (c.comparable) {
    for (size_t k = 0; k < a.dense.size(); ++k) {
      compare(a.dense[k], b.dense[k], &c.dense_max_abs_diff);
    }
  }
  const int rf = a.record_floats;
  size_t i = 0, j = 0;
  while (i < a.rows.size() || j < b.rows.size()) {
    if (j == b.rows.size() || (i < a.rows.size() && a.rows[i] < b.rows[j])) {
      ++c.rows_only_in_a;
      ++i;
    } else if (i == a.rows.size() || b.rows[j] < a.rows[i]) {
      ++c.rows_only_in_b;
      ++j;
    } else {
      if (c.comparable) {
        const float* x = a.records.data() + i * rf;
        const float* y = b.records.data() + j * rf;
        for (int k = 0; k < rf; ++k) compare(x[k], y[k], &c.rows_max_abs_diff);
      }
      ++i;
      ++j;
    }
  }
  c.same_shape = c.comparable && c.rows_only_in_a == 0 && c.rows_only_in_b == 0;
  c.identical = c.same_shape && c.differing_values == 0;
  return c;
}

}  // namespace bagpipe
