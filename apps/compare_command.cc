// bagpipe compare RUN_A RUN_B: are two runs' parameters identical, how far apart are they, and
// their loss curves side by side. A run is a directory written by `bagpipe train --out DIR`
// (summary.json, metrics.jsonl, and params.bin when --dump-params DIR was the same directory)
// or the path of a summary.json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/command.h"
#include "core/json_fields.h"
#include "core/metrics.h"
#include "core/status.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {
namespace {

namespace fs = std::filesystem;

struct MetricPoint {
  int64_t iteration = 0;
  double loss = 0;  // NaN where the line holds null
};

struct Run {
  std::string name;
  nlohmann::json summary;
  std::vector<MetricPoint> metrics;  // "train" lines
  std::string params;                // params.bin path, empty if none
};

// A run's files may be damaged or hostile like any input: fields of the wrong type are errors
// naming the file and line, never exceptions.
absl::Status RegularFile(const fs::path& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path.string(), "' is not a regular file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Run> LoadRun(const std::string& path) {
  Run run;
  run.name = path;
  fs::path summary_path = path;
  std::error_code error;
  if (fs::is_directory(summary_path, error)) summary_path /= "summary.json";
  if (fs::exists(summary_path, error)) RETURN_IF_ERROR(RegularFile(summary_path));
  ASSIGN_OR_RETURN(run.summary, ReadJsonFile(summary_path.string()));
  if (!run.summary.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(summary_path.string(), ": not a run summary (not a JSON object)"));
  }
  // Every run summary carries its parameters' fingerprint: an object without one (`{}`, another
  // tool's JSON) would compare as "not bit-identical" with nothing behind it.
  const absl::StatusOr<std::string> sha = JsonString(run.summary, "params_sha256");
  if (!sha.ok() || sha->size() != 64 ||
      sha->find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        summary_path.string(),
        ": not a run summary (no \"params_sha256\": 64 hex digits of the parameters' SHA-256)"));
  }
  const fs::path dir = summary_path.parent_path();
  fs::path metrics_path = dir / "metrics.jsonl";
  if (fs::exists(metrics_path, error)) {
    RETURN_IF_ERROR(RegularFile(metrics_path));
    std::ifstream in(metrics_path);
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      const nlohmann::json record = ParseUntrustedJson(line);
      // A last line without its newline is one a killed job was writing (core/metrics.h).
      if (record.is_discarded() && in.eof()) break;
      const std::string where = absl::StrCat(metrics_path.string(), ":", number, ": ");
      if (record.is_discarded() || !record.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "not a JSON object"));
      }
      const auto kind = record.find("kind");
      if (kind == record.end() || !kind->is_string() || *kind != "train") continue;
      MetricPoint point;
      absl::StatusOr<int64_t> iteration = JsonInt64(record, "iteration");
      if (!iteration.ok()) return Annotate(iteration.status(), where + "metrics line");
      point.iteration = *iteration;
      const auto loss = record.find("loss");
      if (loss == record.end() || !(loss->is_number() || loss->is_null())) {
        return absl::InvalidArgumentError(absl::StrCat(where, "\"loss\" is not a number"));
      }
      point.loss = loss->is_null() ? std::nan("") : loss->get<double>();
      run.metrics.push_back(point);
    }
  }
  // Only a run whose summary names a dump has one (a params.bin beside a summary that names
  // none is an earlier run's). The run directory's own params.bin first (a copied or moved
  // directory's summary still names the original), else the path the summary records (absolute;
  // relative to where the run ran, from older builds). params_sha256 vouches for either
  // (RunCompare).
  if (run.summary.contains("params")) {
    absl::StatusOr<std::string> params = JsonString(run.summary, "params");
    if (!params.ok()) return Annotate(params.status(), summary_path.string());
    run.params = fs::exists(dir / "params.bin", error) ? (dir / "params.bin").string() : *params;
  }
  return run;
}

// A figure of the summary; NaN where it has none (e.g. the train loss of a run that trained no
// iteration): "-" in the table, null in --json.
double Number(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number()
             ? j[key].get<double>()
             : std::numeric_limits<double>::quiet_NaN();
}

std::string Text(const nlohmann::json& j, const char* key, const std::string& otherwise) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : otherwise;
}

absl::Status RunCompare(const std::string& a_path, const std::string& b_path, bool json_out) {
  ASSIGN_OR_RETURN(Run a, LoadRun(a_path));
  ASSIGN_OR_RETURN(Run b, LoadRun(b_path));
  nlohmann::json out;
  const std::string sha_a = Text(a.summary, "params_sha256", "");
  const std::string sha_b = Text(b.summary, "params_sha256", "");
  out["identical"] = !sha_a.empty() && sha_a == sha_b;
  out["params_sha256"] = {sha_a, sha_b};
  if (!a.params.empty() && !b.params.empty()) {
    ASSIGN_OR_RETURN(const ParamDump dump_a, ReadParamDump(a.params));
    ASSIGN_OR_RETURN(const ParamDump dump_b, ReadParamDump(b.params));
    // A run's summary may name a dump outside its directory (relative to where it ran): one of
    // another run, or of this run's later resume, is not compared as this run's.
    for (const auto& [path, run_dir, dump, sha] : {std::tuple{a.params, a_path, &dump_a, sha_a},
                                                   std::tuple{b.params, b_path, &dump_b, sha_b}}) {
      const std::string dumped = Text(dump->header, "sha256", "");
      if (!sha.empty() && dumped != sha) {
        return absl::FailedPreconditionError(
            absl::StrCat("'", path, "' holds other parameters (sha256 ", dumped, ") than the run '",
                         run_dir, "' finished with (summary.json: params_sha256 ", sha,
                         "); put the run's own params.bin in its directory"));
      }
    }
    const ParamComparison comparison = CompareParams(dump_a, dump_b);
    out["params"] = comparison.ToJson();
    out["identical"] = comparison.identical;
  }
  for (const char* key : {"samples_per_s", "ms_per_iteration", "hit_rate", "train_loss"}) {
    out[key] = {Number(a.summary, key), Number(b.summary, key)};
  }
  if (a.summary.contains("eval") && b.summary.contains("eval")) {
    out["eval_auc"] = {Number(a.summary["eval"], "auc"), Number(b.summary["eval"], "auc")};
    out["eval_log_loss"] = {Number(a.summary["eval"], "log_loss"),
                            Number(b.summary["eval"], "log_loss")};
  }
  // Loss curves, aligned by iteration.
  nlohmann::json curve = nlohmann::json::array();
  size_t j = 0;
  for (const MetricPoint& ra : a.metrics) {
    const int64_t it = ra.iteration;
    while (j < b.metrics.size() && b.metrics[j].iteration < it) ++j;
    nlohmann::json point = {{"iteration", it}, {"loss_a", ra.loss}};
    if (j < b.metrics.size() && b.metrics[j].iteration == it) point["loss_b"] = b.metrics[j].loss;
    curve.push_back(point);
  }
  out["loss_curve"] = curve;
  if (json_out) {
    std::printf("%s\n", DumpJson(out, 2).c_str());
    return absl::OkStatus();
  }
  std::printf("A: %s (cache %s)\nB: %s (cache %s)\n", a.name.c_str(),
              Text(a.summary, "cache", "?").c_str(), b.name.c_str(),
              Text(b.summary, "cache", "?").c_str());
  std::printf("parameters bit-identical: %s\n", out["identical"].get<bool>() ? "yes" : "no");
  if (out.contains("params") && !out["params"].value("comparable", true)) {
    const nlohmann::json& p = out["params"];
    std::printf(
        "  different models: A has %lld dense values and %lld-float row records, B %lld and "
        "%lld; values not compared; rows only in A %lld, only in B %lld\n",
        static_cast<long long>(p["dense_values"][0].get<int64_t>()),
        static_cast<long long>(p["record_floats"][0].get<int64_t>()),
        static_cast<long long>(p["dense_values"][1].get<int64_t>()),
        static_cast<long long>(p["record_floats"][1].get<int64_t>()),
        static_cast<long long>(p.value("rows_only_in_a", int64_t{0})),
        static_cast<long long>(p.value("rows_only_in_b", int64_t{0})));
  } else if (out.contains("params")) {
    const nlohmann::json& p = out["params"];
    // A NaN or infinite maximum (a value that is NaN or inf in one run) prints as such.
    const int64_t nonfinite = p.value("nonfinite_differences", int64_t{0});
    std::printf(
        "  max |a - b|: dense %.3g, embedding rows %.3g; differing values %lld%s; rows "
        "only in A %lld, only in B %lld\n",
        p.value("dense_max_abs_diff", 0.0), p.value("rows_max_abs_diff", 0.0),
        static_cast<long long>(p.value("differing_values", int64_t{0})),
        nonfinite > 0 ? absl::StrFormat(" (%d by a NaN or infinite amount)", nonfinite).c_str()
                      : "",
        static_cast<long long>(p.value("rows_only_in_a", int64_t{0})),
        static_cast<long long>(p.value("rows_only_in_b", int64_t{0})));
  } else {
    const bool neither = a.params.empty() && b.params.empty();
    std::printf("  (no params.bin in %s: compared the SHA-256 fingerprints only)\n",
                neither ? "either run" : (a.params.empty() ? "run A" : "run B"));
  }
  const double speed_a = out["samples_per_s"][0].get<double>();
  const double speed_b = out["samples_per_s"][1].get<double>();
  std::printf("%-22s %14s %14s %10s\n", "", "A", "B", "B / A");
  auto row = [&](const char* label, double va, double vb, const char* format) {
    auto text = [format](double v) {
      return std::isnan(v) ? std::string("-") : absl::StrFormat(format, v);
    };
    std::printf("%-22s %14s %14s %10s\n", label, text(va).c_str(), text(vb).c_str(),
                va != 0 && !std::isnan(va) && !std::isnan(vb)
                    ? absl::StrFormat("%.3f", vb / va).c_str()
                    : "-");
  };
  row("samples/s", speed_a, speed_b, "%.0f");
  row("ms/iteration", out["ms_per_iteration"][0].get<double>(),
      out["ms_per_iteration"][1].get<double>(), "%.3f");
  row("hit rate", out["hit_rate"][0].get<double>(), out["hit_rate"][1].get<double>(), "%.4f");
  row("final train loss", out["train_loss"][0].get<double>(), out["train_loss"][1].get<double>(),
      "%.6f");
  if (out.contains("eval_auc")) {
    row("held-out AUC", out["eval_auc"][0].get<double>(), out["eval_auc"][1].get<double>(), "%.5f");
    row("held-out log loss", out["eval_log_loss"][0].get<double>(),
        out["eval_log_loss"][1].get<double>(), "%.6f");
  }
  if (!curve.empty()) {
    std::printf("\nloss curve (every interval%s):\n%10s %12s %12s\n",
                curve.size() > 20 ? ", sampled" : "", "iteration", "A", "B");
    const size_t step = std::max<size_t>(1, curve.size() / 20);
    for (size_t k = 0; k < curve.size(); k += step) {
      const nlohmann::json& point = curve[k];
      std::printf("%10lld %12.6f %12s\n", static_cast<long long>(point["iteration"].get<int64_t>()),
                  point["loss_a"].get<double>(),
                  point.contains("loss_b")
                      ? absl::StrFormat("%.6f", point["loss_b"].get<double>()).c_str()
                      : "-");
    }
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand AddCompareCommand(CLI::App& root) {
  struct Flags {
    std::string a, b;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "compare",
      "Compare two training runs: bit-identical parameters?, max differences, throughput, "
      "hit rate and loss curves side by side (plot them with scripts/plot_runs.py)");
  app->add_option("RUN_A", flags->a, "run directory (bagpipe train --out) or its summary.json")
      ->required();
  app->add_option("RUN_B", flags->b, "run directory or summary.json")->required();
  app->add_flag("--json", flags->json, "print one JSON object");
  return {app, [flags]() { return RunCompare(flags->a, flags->b, flags->json); }};
}

}  // namespace bagpipe
