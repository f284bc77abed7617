// The `bagpipe` command's subcommands. Each Add*Command registers its options on the root
// CLI11 app and returns the function that runs it once the command line is parsed.
#ifndef BAGPIPE_APPS_COMMAND_H_
#define BAGPIPE_APPS_COMMAND_H_

#include <functional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "data/source.h"

namespace bagpipe {

struct Subcommand {
  CLI::App* app = nullptr;
  std::function<absl::Status()> run;
};

// Options naming a data source, the same on every subcommand:
//   --data synthetic[:k=v,...] | criteo:PATH | csv:PATH | bin:PATH, --schema, --skip-bad-lines,
//   --row-budget, --max-samples.
struct DataFlags {
  std::string data = "synthetic";
  SourceOptions options;
  bool quiet = false;  // --quiet: no progress bars
};
void AddDataFlags(CLI::App* app, DataFlags* flags);
absl::StatusOr<std::unique_ptr<SampleSource>> OpenFromFlags(const DataFlags& flags);
// Wraps `source` (opened from `flags`) so that reading it draws a progress bar labelled
// `label` on stderr — by megabytes of the input file, or by samples for generated data —
// unless --quiet. The bar counts from where the source stands (a second pass over a file starts
// at 0) and ends when a read returns the end of the data. `samples` > 0: the pass reads that
// many samples: the bar counts them, with that total, and ends there; later reads are silent. Files
// under a megabyte get no bar.
std::unique_ptr<SampleSource> WithProgress(std::unique_ptr<SampleSource> source,
                                           const DataFlags& flags, const std::string& label,
                                           int64_t samples = -1);
// Text for --help describing the data source syntax.
extern const char kDataHelp[];

// Option checks with messages that say what is wrong ("--dim: 0 must be > 0", "--dim: 'abc' is
// not a number"); CLI11's PositiveNumber and NonNegativeNumber print their range as 0 to 1.8e308.
extern const CLI::Validator kPositive;
extern const CLI::Validator kNonNegative;
// An unsigned 64-bit integer in decimal (no sign: CLI11 would wrap -1 to 2^64 - 1).
extern const CLI::Validator kUint64;

// Makes every numeric option of `app` and of its subcommands (those CLI11 types INT, UINT or
// FLOAT) accept only a decimal number: CLI11 reads an empty value ("--lr $UNSET") as 0, "010" as
// octal 8 and "0x10" as 16. Call once every option is added.
void RequireDecimalNumbers(CLI::App* app);

Subcommand AddConvertCommand(CLI::App& root);
Subcommand AddDataStatsCommand(CLI::App& root);
Subcommand AddSimCommand(CLI::App& root);
Subcommand AddTrainCommand(CLI::App& root);
Subcommand AddCompareCommand(CLI::App& root);
Subcommand AddTunablesCommand(CLI::App& root);

}  // namespace bagpipe

#endif  // BAGPIPE_APPS_COMMAND_H_
