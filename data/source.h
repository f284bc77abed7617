// Sample sources: every dataset reader and the synthetic generator stream samples through this
// one interface, and are named the same way everywhere on the command line:
//
//   synthetic[:key=value,...]   seeded Criteo-like generator (data/synthetic.h lists the keys)
//   criteo:PATH                 Criteo TSV (Kaggle train.txt, Terabyte day_N)
//   csv:PATH                    CSV with a header and a column spec (SourceOptions::schema)
//   bin:PATH                    Bagpipe's binary columnar format (written by `bagpipe convert`)
//
// A source is single-threaded from the caller's view (it may parallelise internally with TBB).
// Errors in the data are reported with file, line and column (record index for binary files),
// with any echoed value cut to a short escaped excerpt (core/excerpt.h); with skip_bad_lines the
// bad line is counted in SourceStats and skipped instead. Blank lines (empty, or a lone "\r") are
// skipped by the text readers, neither samples nor bad lines; line numbers in messages stay the
// lines' true numbers in the file. A text source whose first epoch holds no valid line is an
// error naming the file. Labels are in [0, 1] and dense values finite.
#ifndef BAGPIPE_DATA_SOURCE_H_
#define BAGPIPE_DATA_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/schema.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

struct SourceStats {
  int64_t samples = 0;  // samples returned so far (all epochs)
  int64_t bytes = 0;    // input bytes consumed (text and binary readers)
  int64_t lines = 0;    // text lines read, including blank, skipped and CSV header lines
  // Bad lines skipped under skip_bad_lines, counted in the first pass over the data (a rewound
  // source skips them again without counting them twice).
  int64_t skipped_lines = 0;
  // The first few skipped lines' errors, for the report.
  std::vector<std::string> first_errors;
  nlohmann::json ToJson() const;
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;

  // The dataset's schema. For dictionary-encoded text sources table_rows grows as values are
  // first seen; it is exact for the samples returned so far.
  virtual const Schema& schema() const = 0;

  // Replaces *batch with the next up to `max_samples` samples (first_sample set to their stream
  // position) and returns how many were read; 0 means the end of the data (and keeps meaning
  // it until Rewind). After an error the source must not be read again.
  virtual absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) = 0;

  // Restarts at the first sample (the next epoch). Dictionaries keep their ids; stream positions
  // keep counting.
  virtual absl::Status Rewind() = 0;

  // The samples one epoch yields when that is known without reading it (a binary file's
  // header, a synthetic stream's configuration; both within SourceOptions::max_samples), else
  // -1 (text, whose lines are known only once read). For progress bars: nothing reads it to
  // decide what to return.
  virtual int64_t SamplesPerEpoch() const { return -1; }
  // As SamplesPerEpoch, before SourceOptions::max_samples: the samples of one epoch of the whole
  // data where known without reading it, else -1. A job's checkpoints take a --max-samples at or
  // above it for none (both select every sample).
  virtual int64_t SamplesPerEpochWithoutLimit() const { return -1; }

  // The mean sparse ids per sample over all tables and one epoch, where known without reading
  // the data (a binary file's header: every table's id count; within
  // SourceOptions::max_samples), else -1 (text; an epoch of no sample). For the job's up-front
  // memory estimate of the oracle's window (trainer_hooks/job_limits.h), which multi-hot bags
  // grow.
  virtual double IdsPerSample() const { return -1; }

  virtual SourceStats stats() const = 0;
  // e.g. "criteo:/data/day_0 (mod 10000000 hashing)".
  virtual std::string Describe() const = 0;
};

struct SourceOptions {
  // CSV column spec, e.g. "label=rating>3.5; dense=year; sparse=userId,movieId,genres".
  std::string schema;
  // Skip (and count) malformed lines instead of failing.
  bool skip_bad_lines = false;
  // Criteo categorical columns: 0 = dictionary encoding (first appearance = next row);
  // N > 0 = `mod N` hashing into N rows per table (row 0 stays the missing-value row).
  int64_t row_budget = 0;
  // Stop after this many samples per epoch (-1 = all).
  int64_t max_samples = -1;
  // Text readers refuse a longer line (a binary file, /dev/zero, a missing line break) with an
  // error naming the line, instead of growing without bound.
  int64_t max_line_bytes = int64_t{16} << 20;
};

// Text readers: an error naming the compression if the regular file open as `fd` starts like a
// gzip, bzip2, xz or zstd stream, or what it is if it starts like a zip or tar archive or UTF-16
// text (read with pread: the file position does not move), else OK.
// Pipes and devices are not looked at. `what` names the file in the message ("criteo:PATH").
absl::Status RefuseCompressedFile(int fd, const std::string& what);

// Opens a source from its command-line name (see the file comment).
absl::StatusOr<std::unique_ptr<SampleSource>> OpenSource(std::string_view spec,
                                                         const SourceOptions& options);

// Polled between blocks of a whole-source pass (ScanSchema, CountSamples): non-zero (a signal
// number) ends the pass with a Cancelled error saying how far it got. May be empty.
using StopPoll = std::function<int()>;

// Reads the whole source once (one epoch) and returns its final schema (exact table sizes for
// dictionary-encoded text), then rewinds it. Used where table sizes must be known up front.
// With `ids_per_sample`, also sets *ids_per_sample to the mean sparse ids per sample over all
// tables of the epoch it read (-1 when the epoch held no sample).
absl::StatusOr<Schema> ScanSchema(SampleSource& source, const StopPoll& stop_requested = nullptr,
                                  double* ids_per_sample = nullptr);

// Samples [begin, end) of every epoch of `source` (earlier samples are read and dropped), e.g.
// the held-out tail of a dataset. end = -1: to the end of the epoch.
std::unique_ptr<SampleSource> SampleRange(std::unique_ptr<SampleSource> source, int64_t begin,
                                          int64_t end);

// Counts the samples of one epoch of `source` by reading it, then rewinds it.
absl::StatusOr<int64_t> CountSamples(SampleSource& source,
                                     const StopPoll& stop_requested = nullptr);

// Global batches of `batch_size` consecutive samples from a source: the unit the oracle plans.
// With `epochs` > 1 (or 0 = endless) the source is rewound at its end; with drop_last the final
// partial batch of each epoch is dropped (otherwise it is returned short). A source that yields
// no sample at all is an error (FailedPrecondition naming it), not an empty stream.
class BatchStream {
 public:
  struct Options {
    int64_t batch_size = 1024;
    int epochs = 1;  // 0 = endless
    bool drop_last = false;
  };
  BatchStream(std::unique_ptr<SampleSource> source, Options options);

  // Replaces *batch with the next global batch; returns false at the end of the stream.
  absl::StatusOr<bool> Next(Batch* batch);
  SampleSource& source() { return *source_; }
  int64_t batches() const { return batches_; }
  int epoch() const { return epoch_; }

 private:
  std::unique_ptr<SampleSource> source_;
  Options options_;
  int64_t batches_ = 0;
  int epoch_ = 0;
  bool done_ = false;
  Batch pending_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_SOURCE_H_
