// bagpipe sim: miss counts and miss-ratio curves of a dataset under every cache policy.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "apps/command.h"
#include "core/json_fields.h"
#include "core/status.h"
#include "oracle/simulator.h"
#include "trainer_hooks/job_limits.h"

namespace bagpipe {
namespace {

constexpr char kSimModel[] =
    "Model: batch-granular; a batch needs all its distinct rows resident at once (but\n"
    "lru-32way, which like FBGEMM's cache fetches a row past the cache when its set has no\n"
    "free way); a miss is a needed row that is not resident when its batch runs (one fetch);\n"
    "capacity counts rows across all tables; one cache (one trainer). Every eviction is a\n"
    "write-back.\n"
    "Policies: oracle (Bagpipe C++'s planner, Belady within the lookahead window), belady\n"
    "(full future, the offline optimum), lru, lfu (reactive, fully associative, as TorchRec/\n"
    "FBGEMM UVM caches), lru-32way (FBGEMM's set-associative shape), ttl (reference Bagpipe:\n"
    "a row expires after its last use within the window; unbounded, reports peak_rows).\n";

absl::StatusOr<std::vector<int64_t>> ParseCapacities(const std::string& text) {
  std::vector<int64_t> capacities;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("--cache-rows is empty");
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(part, &value) || value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cache-rows '", text, "': expected positive row counts separated by commas"));
    }
    capacities.push_back(value);
  }
  return capacities;
}

// --mrc's file is checked before the data are read: a simulation of a large dataset is not lost
// to a path it cannot write at the end.
absl::Status CheckWritable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("--mrc '", path, "' is a directory"));
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (!fs::is_directory(dir, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mrc '", path, "': no directory '", dir, "' to write it in"));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--mrc '", path, "': cannot write in '", dir, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddSimCommand(CLI::App& root) {
  struct Flags {
    DataFlags data;
    int64_t batch_size = 1024;
    std::string capacities;
    int lookahead = 20;
    std::string policies = "oracle,belady,lru,lfu,lru-32way,ttl";
    bool json = false;
    std::string mrc;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "sim",
      "Simulate cache policies on a dataset: misses, hits, evictions, write-backs per "
      "policy and capacity, and miss-ratio curves to size a cache before training");
  AddDataFlags(app, &flags->data);
  app->add_option("--batch-size,-b", flags->batch_size, "global batch size")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--cache-rows", flags->capacities,
                  "cache capacity in rows (across tables); several: C1,C2,...")
      ->required();
  app->add_option("--lookahead,-L", flags->lookahead, "oracle/ttl window in batches")
      ->capture_default_str()
      ->check(kPositive);
  app->add_option("--policies", flags->policies,
                  "comma-separated: oracle, belady, lru, lfu, lru-32way, ttl")
      ->capture_default_str();
  app->add_flag("--json", flags->json, "print one JSON object instead of the table");
  app->add_option("--mrc", flags->mrc,
                  "write the miss-ratio curve (CSV: policy,capacity,misses,accesses,miss_ratio); "
                  "plot it with scripts/plot_mrc.py");
  app->footer(std::string(kSimModel) + "\n" + kDataHelp);
  return {
      app, [flags]() -> absl::Status {
        SimOptions options;
        ASSIGN_OR_RETURN(options.capacities, ParseCapacities(flags->capacities));
        options.lookahead = flags->lookahead;
        options.policies.clear();
        for (absl::string_view p : absl::StrSplit(flags->policies, ',', absl::SkipWhitespace())) {
          options.policies.emplace_back(p);
        }
        if (options.policies.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--policies '", flags->policies,
              "' names no policy; expected some of oracle, belady, lru, lfu, lru-32way, ttl"));
        }
        for (int64_t capacity : options.capacities) {
          if (capacity > std::numeric_limits<int32_t>::max()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "--cache-rows ", capacity, ": at most 2^31 - 1 rows (as bagpipe train)"));
          }
        }
        if (!flags->mrc.empty()) RETURN_IF_ERROR(CheckWritable(flags->mrc));
        ASSIGN_OR_RETURN(auto opened, OpenFromFlags(flags->data));
        // The oracle's and ttl's window grows with --lookahead whatever the data (as in train).
        JobShape shape;
        shape.lookahead = flags->lookahead;
        shape.batch_size = flags->batch_size;
        shape.num_tables = opened->schema().num_tables();
        shape.num_dense = opened->schema().num_dense();
        shape.host_trainers = false;  // no trainers here
        RETURN_IF_ERROR(CheckJobLimits(shape));
        auto source = WithProgress(std::move(opened), flags->data, "simulating");
        BatchStream stream(std::move(source), {flags->batch_size, 1, false});
        ASSIGN_OR_RETURN(const SimResult result, Simulate(stream, options));
        const SourceStats read = stream.source().stats();
        if (flags->json) {
          nlohmann::json out = result.ToJson();
          out["data"] = read.ToJson();
          std::printf("%s\n", DumpJson(out, 2).c_str());
        } else {
          std::printf("%s", result.Table().c_str());
          if (read.skipped_lines > 0) {
            std::printf("skipped %lld bad lines%s%s\n", static_cast<long long>(read.skipped_lines),
                        read.first_errors.empty() ? "" : "; the first: ",
                        read.first_errors.empty() ? "" : read.first_errors[0].c_str());
          }
        }
        if (!flags->mrc.empty()) {
          RETURN_IF_ERROR(result.WriteMrc(flags->mrc));
          if (!flags->json) std::printf("miss-ratio curve written to %s\n", flags->mrc.c_str());
        }
        return absl::OkStatus();
      }};
}

}  // namespace bagpipe
