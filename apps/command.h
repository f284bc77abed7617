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
};
void AddDataFlags(CLI::App* app, DataFlags* flags);
absl::StatusOr<std::unique_ptr<SampleSource>> OpenFromFlags(const DataFlags& flags);
// Text for --help describing the data source syntax.
extern const char kDataHelp[];

Subcommand AddConvertCommand(CLI::App& root);
Subcommand AddDataStatsCommand(CLI::App& root);
Subcommand AddSimCommand(CLI::App& root);
Subcommand AddTrainCommand(CLI::App& root);
Subcommand AddCompareCommand(CLI::App& root);
Subcommand AddTunablesCommand(CLI::App& root);

}  // namespace bagpipe

#endif  // BAGPIPE_APPS_COMMAND_H_
