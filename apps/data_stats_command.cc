// bagpipe data-stats: what a user needs to size a cache.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "apps/command.h"
#include "core/json_fields.h"
#include "core/status.h"
#include "data/data_stats.h"

namespace bagpipe {

Subcommand AddDataStatsCommand(CLI::App& root) {
  struct Flags {
    DataFlags data;
    int64_t batch_size = 1024;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "data-stats",
      "Per table: distinct rows, access skew (share of the top 1%/10% of rows), and the distinct "
      "rows one batch needs (the working set a cache must hold)");
  AddDataFlags(app, &flags->data);
  app->add_option("--batch-size,-b", flags->batch_size, "global batch size for the working set")
      ->capture_default_str()
      ->check(kPositive);
  app->add_flag("--json", flags->json, "print one JSON object instead of the table");
  app->footer(kDataHelp);
  return {app, [flags]() -> absl::Status {
            ASSIGN_OR_RETURN(auto opened, OpenFromFlags(flags->data));
            auto source = WithProgress(std::move(opened), flags->data, "reading");
            ASSIGN_OR_RETURN(const DataStats stats, ComputeDataStats(*source, flags->batch_size));
            // As train: a source with no sample (an empty file, every line skipped) is an error.
            if (stats.samples == 0) {
              return absl::FailedPreconditionError(
                  absl::StrCat(source->Describe(), " yields no samples"));
            }
            if (flags->json) {
              std::printf("%s\n", DumpJson(stats.ToJson(), 2).c_str());
            } else {
              std::printf("%s", stats.Table().c_str());
            }
            return absl::OkStatus();
          }};
}

}  // namespace bagpipe
