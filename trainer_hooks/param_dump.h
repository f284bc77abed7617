// Parameter dumps and fingerprints: every trained parameter of a run in one canonical order —
// the dense model's parameters, then every embedding row that exists on the servers (created by
// a fetch or a write-back, i.e. every row the run touched) in increasing RowId order, each
// followed by its optimizer state.
//
// File DIR/params.bin: a 64 KiB header block — magic "BGPARAMS", a little-endian uint64 length
// L, L bytes of JSON (dim, record_floats, dense_count, rows, optimizer, schema, sha256), spaces
// to the end of the block — then, from byte 65536, the body: the dense floats, then per row
// (uint64 RowId, record floats). All numbers little-endian. The SHA-256 of exactly those body bytes
// is the run's parameter fingerprint (--summary-json "params_sha256"), so two runs have the same
// fingerprint iff their parameters are bit-identical.
#ifndef BAGPIPE_TRAINER_HOOKS_PARAM_DUMP_H_
#define BAGPIPE_TRAINER_HOOKS_PARAM_DUMP_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/atomic_file.h"
#include "core/sha256.h"
#include "core/types.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

// Streams parameters into a fingerprint and, if a directory is given, into DIR/params.bin,
// atomically (core/atomic_file.h): until Finish renames the complete file into place the old
// params.bin stays, and an interrupted run leaves no partial file. Not thread-safe.
class ParamWriter {
 public:
  // `dir` empty: fingerprint only. `header` is stored in the file (dim, optimizer, schema...).
  static absl::StatusOr<std::unique_ptr<ParamWriter>> Create(const std::string& dir,
                                                             nlohmann::json header,
                                                             int record_floats);
  ~ParamWriter();
  // REQUIRES: called once, before any AddRow.
  absl::Status AddDense(const std::vector<float>& dense);
  // REQUIRES: rows in strictly increasing RowId order.
  absl::Status AddRow(RowId row, const float* record);
  // Completes the file and returns the SHA-256 of the parameters.
  absl::StatusOr<std::string> Finish();
  int64_t rows() const { return rows_; }
  // Why the file could not be written (a full disk): the fingerprint is computed all the same
  // (the run's results are not lost with the file), and no file is left. OK otherwise.
  const absl::Status& file_error() const { return file_error_; }

 private:
  ParamWriter() = default;
  absl::Status Write(const void* data, size_t bytes);

  std::unique_ptr<AtomicFileWriter> file_;
  nlohmann::json header_;
  int record_floats_ = 0;
  int64_t dense_count_ = 0;
  int64_t rows_ = 0;
  bool has_last_ = false;
  RowId last_row_ = 0;
  Sha256 sha_;
  absl::Status file_error_;
};

struct ParamDump {
  nlohmann::json header;
  std::vector<float> dense;
  std::vector<RowId> rows;
  std::vector<float> records;  // rows.size() * record_floats
  int record_floats = 0;
};

// Reads DIR/params.bin (or a path to the file itself). Trusts nothing in the file: the header
// length, the counts and the record size must describe exactly the file's size (checked without
// overflow, before anything is allocated), rows must increase, and the body must match the
// header's SHA-256; any other file is an error naming it.
absl::StatusOr<ParamDump> ReadParamDump(const std::string& path);

struct ParamComparison {
  bool identical = false;
  // The same dense count and row record size: the values are compared (the rows' over the rows
  // both dumps hold). Dumps of different models (another --dim, other dense layers) are not:
  // their differences and max differences stay 0 here and are null in ToJson.
  bool comparable = false;
  bool same_shape = false;           // comparable, and the same row set
  int64_t dense_values[2] = {0, 0};  // of a, of b
  int record_floats[2] = {0, 0};
  // NaN where a differing value is NaN in one dump and not the other (or in both, with other
  // bits), inf where an infinite value meets another: ToJson writes them as null, with
  // nonfinite_differences counting the values that differ that way.
  double dense_max_abs_diff = 0;
  double rows_max_abs_diff = 0;
  int64_t nonfinite_differences = 0;
  int64_t rows_only_in_a = 0;
  int64_t rows_only_in_b = 0;
  int64_t differing_values = 0;
  nlohmann::json ToJson() const;
};
ParamComparison CompareParams(const ParamDump& a, const ParamDump& b);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_PARAM_DUMP_H_
