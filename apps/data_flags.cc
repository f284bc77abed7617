#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "apps/command.h"
#include "core/excerpt.h"
#include "core/progress.h"
#include "data/synthetic.h"

namespace bagpipe {

const char kDataHelp[] =
    "Data sources (--data):\n"
    "  synthetic[:k=v,...]  seeded Criteo-like stream; keys: samples, tables, rows=a/b/c (or\n"
    "                       tables=N,rows=R), scale, alpha (Zipf), pooling=P|MIN-MAX, dense,\n"
    "                       drift, seed\n"
    "  criteo:PATH          Criteo TSV (Kaggle train.txt, Terabyte day_N); --row-budget N\n"
    "                       hashes categorical values to N rows instead of a dictionary\n"
    "  csv:PATH             CSV with a header and --schema, e.g.\n"
    "                       \"label=rating>3.5; dense=year; sparse=userId,movieId,genres\"\n"
    "  bin:PATH             Bagpipe binary columnar file (bagpipe convert)\n";

namespace {

// A check of a number against a bound: "" when `value` is a number and `ok` of it, else the
// message CLI11 prints after the option's name.
CLI::Validator NumberCheck(bool (*ok)(double), const char* rule, const char* name) {
  return CLI::Validator(
      [ok, rule](std::string& value) -> std::string {
        double number = 0;
        if (!absl::SimpleAtod(value, &number)) return absl::StrCat("'", value, "' is not a number");
        if (!ok(number)) return absl::StrCat(value, " must be ", rule);
        return "";
      },
      name);
}

}  // namespace

const CLI::Validator kPositive = NumberCheck([](double x) { return x > 0; }, "> 0", "POSITIVE");
const CLI::Validator kNonNegative =
    NumberCheck([](double x) { return x >= 0; }, ">= 0", "NONNEGATIVE");

const CLI::Validator kUint64(
    [](std::string& value) -> std::string {
      uint64_t number = 0;
      const bool digits =
          !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || !absl::SimpleAtoi(value, &number)) {
        return absl::StrCat("'", value, "' is not an integer in [0, 18446744073709551615]");
      }
      return "";
    },
    "UINT64");

namespace {

// "" when `value` is a decimal number as a person writes it (an optional sign, digits with an
// optional fraction and exponent, or a spelled inf/nan that the range checks then refuse);
// otherwise what is wrong with it. `integer`: an optional sign and digits only, without a
// leading zero (C reads 010 as 8), within the 64-bit range (`is_unsigned`: [0, 2^64 - 1], else
// [-2^63, 2^63 - 1]; CLI11 would clamp or wrap a larger one), so an error names the value given.
std::string DecimalNumberError(const std::string& value, bool integer, bool is_unsigned) {
  if (value.empty()) return "an empty value is not a number";
  const size_t at = value[0] == '-' || value[0] == '+' ? 1 : 0;
  const absl::string_view body = absl::string_view(value).substr(at);
  if (integer) {
    if (body.empty() || body.find_first_not_of("0123456789") != absl::string_view::npos) {
      return absl::StrCat("'", Excerpt(value), "' is not an integer");
    }
    if (body.size() > 1 && body[0] == '0') {
      return absl::StrCat("'", value, "': a leading 0 would read as octal; write it in decimal");
    }
    int64_t signed_value = 0;
    uint64_t unsigned_value = 0;
    const bool fits = is_unsigned ? value[0] != '-' && absl::SimpleAtoi(value, &unsigned_value)
                                  : absl::SimpleAtoi(value, &signed_value);
    if (!fits) {
      return absl::StrCat("'", value, "' is out of range (",
                          is_unsigned ? "[0, 2^64 - 1]" : "[-2^63, 2^63 - 1]", ")");
    }
    return "";
  }
  if (!integer && (absl::EqualsIgnoreCase(body, "inf") || absl::EqualsIgnoreCase(body, "nan") ||
                   absl::EqualsIgnoreCase(body, "infinity"))) {
    return "";
  }
  if (body.size() > 1 && body[0] == '0' && absl::StrContains("xXbBoO", body[1])) {
    return absl::StrCat("'", value, "' is not a decimal number (no 0x, 0b or 0o prefixes)");
  }
  if (integer && body.size() > 1 && body[0] == '0') {
    return absl::StrCat("'", value, "': a leading 0 would read as octal; write it in decimal");
  }
  return "";
}

}  // namespace

void RequireDecimalNumbers(CLI::App* app) {
  for (CLI::Option* option : app->get_options()) {
    const std::string type = option->get_type_name();
    const bool is_unsigned = absl::StartsWith(type, "UINT");
    const bool integer = absl::StartsWith(type, "INT") || is_unsigned;
    if (!integer && !absl::StartsWith(type, "FLOAT")) continue;
    // Ahead of the option's own checks (transform() puts a validator first; this one leaves the
    // value as it is), so that "1.5" for an integer is called not an integer rather than out of
    // a range it lies in.
    option->transform(CLI::Validator(
        [integer, is_unsigned](std::string& value) {
          return DecimalNumberError(value, integer, is_unsigned);
        },
        ""));
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    RequireDecimalNumbers(sub);
  }
}

void AddDataFlags(CLI::App* app, DataFlags* flags) {
  app->add_option("--data", flags->data,
                  "data source: synthetic[:k=v,...], criteo:PATH, csv:PATH or bin:PATH")
      ->capture_default_str();
  app->add_option("--schema", flags->options.schema,
                  "CSV column spec: label=COL[>X]; dense=C,log(C); sparse=C,split(C,|)");
  app->add_flag("--skip-bad-lines", flags->options.skip_bad_lines,
                "count and skip malformed lines instead of failing");
  app->add_option(
         "--row-budget", flags->options.row_budget,
         "Criteo: hash categorical values to N rows per table, row 0 for an empty field and "
         "1 + value mod (N - 1) for the others (0 = dictionary)")
      ->check(kNonNegative);
  app->add_option("--max-samples", flags->options.max_samples,
                  "read at most this many samples per epoch (-1 = all)");
  app->add_flag("--quiet,-q", flags->quiet, "no progress bars");
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenFromFlags(const DataFlags& flags) {
  return OpenSource(flags.data, flags.options);
}

namespace {

// Forwards to a source and reports how far the reading got: one pass, to the end of the data
// or, with `end_samples` > 0, to that many samples of it.
class ProgressSource final : public SampleSource {
 public:
  ProgressSource(std::unique_ptr<SampleSource> source, std::unique_ptr<Progress> progress,
                 bool by_bytes, int64_t end_samples)
      : source_(std::move(source)),
        progress_(std::move(progress)),
        by_bytes_(by_bytes),
        end_samples_(end_samples),
        start_(source_->stats()) {}

  const Schema& schema() const override { return source_->schema(); }
  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    absl::StatusOr<int64_t> read = source_->Read(max_samples, batch);
    if (read.ok() && !finished_) {  // one pass: later epochs read silently
      const SourceStats stats = source_->stats();
      const int64_t samples = stats.samples - start_.samples;
      progress_->Update(by_bytes_ ? (stats.bytes - start_.bytes) / 1000000 : samples);
      if (*read == 0 || (end_samples_ > 0 && samples >= end_samples_)) {
        progress_->Finish();
        finished_ = true;
      }
    }
    return read;
  }
  absl::Status Rewind() override { return source_->Rewind(); }
  SourceStats stats() const override { return source_->stats(); }
  int64_t SamplesPerEpoch() const override { return source_->SamplesPerEpoch(); }
  int64_t SamplesPerEpochWithoutLimit() const override {
    return source_->SamplesPerEpochWithoutLimit();
  }
  double IdsPerSample() const override { return source_->IdsPerSample(); }
  std::string Describe() const override { return source_->Describe(); }

 private:
  std::unique_ptr<SampleSource> source_;
  std::unique_ptr<Progress> progress_;
  const bool by_bytes_;
  const int64_t end_samples_;  // > 0: the pass ends there
  const SourceStats start_;    // where the pass started (the counts are cumulative)
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<SampleSource> WithProgress(std::unique_ptr<SampleSource> source,
                                           const DataFlags& flags, const std::string& label,
                                           int64_t samples) {
  if (flags.quiet) return source;
  const std::string& spec = flags.data;
  int64_t total = 0;
  bool by_bytes = false;
  if (absl::StartsWith(spec, "synthetic")) {
    const size_t colon = spec.find(':');
    auto config = ParseSyntheticConfig(colon == std::string::npos ? "" : spec.substr(colon + 1));
    if (config.ok()) total = config->samples;
    if (flags.options.max_samples >= 0) total = std::min(total, flags.options.max_samples);
  } else if (const size_t colon = spec.find(':'); colon != std::string::npos) {
    std::error_code error;
    const auto bytes = std::filesystem::file_size(spec.substr(colon + 1), error);
    if (!error) {
      total = static_cast<int64_t>(bytes / 1000000);
      by_bytes = true;
    }
  }
  if (by_bytes && total < 1) return source;  // small files need no bar
  if (samples > 0) {  // part of the data: counted in samples, which say where it ends
    total = samples;
    by_bytes = false;
  }
  auto progress = std::make_unique<Progress>(label, total, true, by_bytes ? "MB" : "samples");
  return std::make_unique<ProgressSource>(std::move(source), std::move(progress), by_bytes,
                                          samples);
}

}  // namespace bagpipe
