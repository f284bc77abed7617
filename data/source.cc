#include "data/source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/excerpt.h"
#include "core/status.h"
#include "data/binary_format.h"
#include "data/criteo_reader.h"
#include "data/csv_reader.h"
#include "data/synthetic.h"

namespace bagpipe {

absl::Status RefuseCompressedFile(int fd, const std::string& what) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return absl::OkStatus();
  unsigned char head[512] = {};
  const ssize_t got = pread(fd, head, sizeof(head), 0);
  if (got < 0) return absl::OkStatus();  // the reader's own read reports it
  struct Magic {
    const char* name;
    std::string_view bytes;
    const char* command;  // decompresses FILE beside itself
  };
  // bzip2: "BZh", the block size digit, then a block's or the stream end's magic (a text line
  // may well start with "BZh").
  static constexpr Magic kMagics[] = {{"gzip", "\x1f\x8b", "gzip -dk FILE; a .tar.gz: tar xzf"},
                                      {"bzip2", "BZh?1AY&SY", "bzip2 -dk"},
                                      {"bzip2", "BZh?\x17rE8P\x90", "bzip2 -dk"},
                                      {"xz", "\xfd\x37zXZ\x00", "xz -dk"},
                                      {"zstd", "\x28\xb5\x2f\xfd", "zstd -d"}};
  const std::string_view start(reinterpret_cast<const char*>(head), static_cast<size_t>(got));
  auto matches = [&start](std::string_view magic) {
    if (start.size() < magic.size()) return false;
    for (size_t k = 0; k < magic.size(); ++k) {
      const bool digit = start[k] >= '1' && start[k] <= '9';
      if (magic[k] == '?' ? !digit : start[k] != magic[k]) return false;
    }
    return true;
  };
  for (const Magic& m : kMagics) {
    if (!matches(m.bytes)) continue;
    // The decompressor's output also streams (docs/input.md): hashed ids read a pipe once.
    const std::string command = m.command;
    const std::string tool = command.substr(0, command.find(' '));
    const std::string spec(what);
    const std::string format =
        spec.find(':') == std::string::npos ? "FORMAT" : spec.substr(0, spec.find(':'));
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the file is ", m.name,
        "-compressed and the reader takes plain text; decompress it first (", command,
        " FILE), or stream it: ", tool, " -dc FILE | bagpipe convert --data ", format,
        ":/dev/stdin --out FILE.bin (or train --data ", format, ":/dev/stdin --row-budget N)"));
  }
  // Archives (datasets are often shipped as .zip or .tar) hold files rather than text.
  if (matches("PK\x03\x04") || matches("PK\x05\x06")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": the file is a zip archive and the reader takes plain text; extract the data "
        "file from it first (unzip FILE)"));
  }
  if (start.size() >= 263 && start.substr(257, 5) == "ustar") {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": the file is a tar archive and the reader takes plain text; extract the data "
        "file from it first (tar xf FILE)"));
  }
  // The readers take UTF-8 (ASCII) text; UTF-16 starts with its byte order mark.
  if (matches("\xff\xfe") || matches("\xfe\xff")) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": the file is UTF-16 text and the reader takes UTF-8; convert it first (iconv -f "
        "UTF-16 -t UTF-8 FILE > NEW)"));
  }
  return absl::OkStatus();
}

nlohmann::json SourceStats::ToJson() const {
  return {{"samples", samples},
          {"bytes", bytes},
          {"lines", lines},
          {"skipped_lines", skipped_lines},
          {"first_errors", first_errors}};
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenSource(std::string_view spec,
                                                         const SourceOptions& options) {
  const size_t colon = spec.find(':');
  const std::string kind(spec.substr(0, colon));
  const std::string rest(colon == std::string_view::npos ? "" : spec.substr(colon + 1));
  if (options.max_samples < -1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-samples ", options.max_samples,
                                                   ": must be >= 0, or -1 for all samples"));
  }
  if (!options.schema.empty() && kind != "csv") {
    return absl::InvalidArgumentError(
        absl::StrCat("--schema applies to csv: sources only; '", Excerpt(kind, 20),
                     ":' data have a fixed layout (leave --schema out)"));
  }
  if (options.row_budget != 0 && kind != "criteo") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--row-budget applies to criteo: sources only; '", Excerpt(kind, 20), ":' data ",
        kind == "csv" ? "encode categorical values with a dictionary" : "carry their own row ids",
        " (leave --row-budget out)"));
  }
  if (kind == "synthetic") return OpenSynthetic(rest, options);
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data source '", Excerpt(absl::string_view(spec.data(), spec.size()), 200),
        "' has no kind: expected synthetic[:k=v,...], criteo:PATH, csv:PATH or bin:PATH (for "
        "a file, prefix its format, e.g. criteo:",
        Excerpt(absl::string_view(spec.data(), spec.size()), 200), ")"));
  }
  if (rest.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data source '", Excerpt(absl::string_view(spec.data(), spec.size()), 200),
        "' names no file; expected synthetic[:k=v,...], criteo:PATH, csv:PATH or bin:PATH"));
  }
  if (kind == "criteo") return OpenCriteo(rest, options);
  if (kind == "csv") return OpenCsv(rest, options);
  if (kind == "bin") return OpenBinary(rest, options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data source kind '", Excerpt(kind), "' in '",
                   Excerpt(absl::string_view(spec.data(), spec.size()), 200),
                   "'; expected synthetic[:k=v,...], criteo:PATH, csv:PATH or bin:PATH"));
}

namespace {

// Reads one epoch of `source` in blocks, polling `stop_requested` between them; returns the
// samples read, and with `ids` adds the sparse ids they held to *ids.
absl::StatusOr<int64_t> ReadEpoch(SampleSource& source, const StopPoll& stop_requested,
                                  int64_t* ids = nullptr) {
  Batch batch;
  int64_t total = 0;
  while (true) {
    if (stop_requested) {
      if (const int signal = stop_requested(); signal != 0) {
        return absl::CancelledError(absl::StrCat("stop requested (signal ", signal, ") after ",
                                                 total, " samples of ", source.Describe()));
      }
    }
    ASSIGN_OR_RETURN(const int64_t read, source.Read(1 << 16, &batch));
    if (read == 0) return total;
    total += read;
    if (ids != nullptr) *ids += batch.num_ids();
  }
}

}  // namespace

absl::StatusOr<Schema> ScanSchema(SampleSource& source, const StopPoll& stop_requested,
                                  double* ids_per_sample) {
  int64_t ids = 0;
  ASSIGN_OR_RETURN(const int64_t samples, ReadEpoch(source, stop_requested, &ids));
  if (ids_per_sample != nullptr) {
    *ids_per_sample = samples > 0 ? static_cast<double>(ids) / static_cast<double>(samples) : -1;
  }
  Schema schema = source.schema();
  RETURN_IF_ERROR(source.Rewind());
  return schema;
}

namespace {

class RangeSource final : public SampleSource {
 public:
  RangeSource(std::unique_ptr<SampleSource> source, int64_t begin, int64_t end)
      : source_(std::move(source)), begin_(begin), end_(end) {}
  const Schema& schema() const override { return source_->schema(); }

  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    while (position_ < begin_) {
      ASSIGN_OR_RETURN(const int64_t skipped,
                       source_->Read(std::min<int64_t>(begin_ - position_, 1 << 16), batch));
      if (skipped == 0) return 0;
      position_ += skipped;
    }
    if (end_ >= 0) max_samples = std::min(max_samples, end_ - position_);
    if (max_samples <= 0) {
      batch->Reset(schema().num_dense(), schema().num_tables());
      return 0;
    }
    ASSIGN_OR_RETURN(const int64_t read, source_->Read(max_samples, batch));
    position_ += read;
    returned_ += read;
    return read;
  }

  absl::Status Rewind() override {
    position_ = 0;
    return source_->Rewind();
  }
  SourceStats stats() const override {
    SourceStats stats = source_->stats();
    stats.samples = returned_;
    return stats;
  }
  int64_t SamplesPerEpoch() const override {
    const int64_t all = source_->SamplesPerEpoch();
    if (all < 0) return -1;
    return std::max<int64_t>(0, (end_ >= 0 ? std::min(end_, all) : all) - std::min(begin_, all));
  }
  // Known only for a range over the whole epoch: a part's bags may be larger or smaller.
  double IdsPerSample() const override {
    if (begin_ > 0) return -1;
    if (end_ >= 0) {
      const int64_t all = source_->SamplesPerEpoch();
      if (all < 0 || end_ < all) return -1;
    }
    return source_->IdsPerSample();
  }
  std::string Describe() const override {
    return absl::StrCat(source_->Describe(), " samples [", begin_, ", ",
                        end_ < 0 ? std::string("end") : absl::StrCat(end_), ")");
  }

 private:
  std::unique_ptr<SampleSource> source_;
  const int64_t begin_;
  const int64_t end_;
  int64_t position_ = 0;  // within the epoch
  int64_t returned_ = 0;
};

}  // namespace

std::unique_ptr<SampleSource> SampleRange(std::unique_ptr<SampleSource> source, int64_t begin,
                                          int64_t end) {
  return std::make_unique<RangeSource>(std::move(source), begin, end);
}

absl::StatusOr<int64_t> CountSamples(SampleSource& source, const StopPoll& stop_requested) {
  ASSIGN_OR_RETURN(const int64_t total, ReadEpoch(source, stop_requested));
  RETURN_IF_ERROR(source.Rewind());
  return total;
}

BatchStream::BatchStream(std::unique_ptr<SampleSource> source, Options options)
    : source_(std::move(source)), options_(options) {
  pending_.Reset(source_->schema().num_dense(), source_->schema().num_tables());
}

absl::StatusOr<bool> BatchStream::Next(Batch* batch) {
  if (done_) return false;
  const int64_t want = options_.batch_size;
  batch->Reset(source_->schema().num_dense(), source_->schema().num_tables());
  while (batch->num_samples < want) {
    ASSIGN_OR_RETURN(const int64_t read, source_->Read(want - batch->num_samples, &pending_));
    if (read > 0) {
      batch->Append(pending_);
      continue;
    }
    // End of an epoch.
    const bool partial = batch->num_samples > 0;
    if (epoch_ == 0 && batches_ == 0 && !partial) {
      done_ = true;
      return absl::FailedPreconditionError(absl::StrCat(source_->Describe(), " yields no samples"));
    }
    if (partial && !options_.drop_last) break;  // return the short batch; rewind next call
    batch->Reset(source_->schema().num_dense(), source_->schema().num_tables());
    ++epoch_;
    if (options_.epochs != 0 && epoch_ >= options_.epochs) {
      done_ = true;
      return false;
    }
    RETURN_IF_ERROR(source_->Rewind());
    if (partial) continue;
    // An empty epoch right after a rewind would loop forever: the source has no samples.
    ASSIGN_OR_RETURN(const int64_t first, source_->Read(want, &pending_));
    if (first == 0) {
      done_ = true;
      return absl::FailedPreconditionError(absl::StrCat(source_->Describe(), " yields no samples"));
    }
    batch->Append(pending_);
  }
  ++batches_;
  return true;
}

}  // namespace bagpipe
