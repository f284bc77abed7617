#include "data/data_stats.h"

#include <algorithm>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "tbb/parallel_for.h"

namespace bagpipe {
namespace {

// Share of `accesses` that go to the `fraction` most accessed of the distinct rows.
double TopShare(std::vector<int64_t>& counts, double fraction, int64_t accesses) {
  if (counts.empty() || accesses == 0) return 0.0;
  const int64_t top = std::max<int64_t>(1, static_cast<int64_t>(counts.size() * fraction));
  std::nth_element(counts.begin(), counts.begin() + (top - 1), counts.end(), std::greater<>());
  int64_t sum = 0;
  for (int64_t k = 0; k < top; ++k) sum += counts[k];
  return static_cast<double>(sum) / static_cast<double>(accesses);
}

}  // namespace

nlohmann::json DataStats::ToJson() const {
  nlohmann::json tables_json = nlohmann::json::array();
  for (const TableStats& t : tables) {
    tables_json.push_back({{"name", t.name},
                           {"rows", t.rows},
                           {"unique", t.unique},
                           {"accesses", t.accesses},
                           {"top1_share", t.top1_share},
                           {"top10_share", t.top10_share},
                           {"batch_unique_mean", t.batch_unique_mean},
                           {"batch_unique_max", t.batch_unique_max}});
  }
  return {{"source", source},
          {"samples", samples},
          {"batches", batches},
          {"batch_size", batch_size},
          {"label_mean", label_mean},
          {"total_unique", total_unique},
          {"working_set_mean", working_set_mean},
          {"working_set_max", working_set_max},
          {"tables", tables_json},
          {"reader", source_stats.ToJson()}};
}

std::string DataStats::Table() const {
  std::string out = absl::StrFormat("%s: %d samples, %d batches of %d, label mean %.4f\n", source,
                                    samples, batches, batch_size, label_mean);
  out += absl::StrFormat("%-12s %12s %12s %12s %7s %7s %12s %12s\n", "table", "rows", "unique",
                         "accesses", "top1%", "top10%", "batch_mean", "batch_max");
  for (const TableStats& t : tables) {
    out += absl::StrFormat("%-12s %12d %12d %12d %6.1f%% %6.1f%% %12.1f %12d\n", t.name, t.rows,
                           t.unique, t.accesses, 100 * t.top1_share, 100 * t.top10_share,
                           t.batch_unique_mean, t.batch_unique_max);
  }
  out += absl::StrFormat("%-12s %12s %12d %12s %7s %7s %12.1f %12d\n", "all tables", "",
                         total_unique, "", "", "", working_set_mean, working_set_max);
  out +=
      "batch_mean/batch_max: distinct rows one batch needs (the working set a cache must "
      "hold at once)\n";
  if (source_stats.skipped_lines > 0) {
    out += absl::StrFormat("skipped %d bad lines%s\n", source_stats.skipped_lines,
                           source_stats.first_errors.empty()
                               ? ""
                               : absl::StrCat("; the first: ", source_stats.first_errors[0]));
  }
  return out;
}

absl::StatusOr<DataStats> ComputeDataStats(SampleSource& source, int64_t batch_size) {
  if (batch_size <= 0) return absl::InvalidArgumentError("batch size must be positive");
  const int tables = source.schema().num_tables();
  std::vector<absl::flat_hash_map<int64_t, int64_t>> counts(tables);
  std::vector<absl::flat_hash_set<int64_t>> batch_sets(tables);
  std::vector<int64_t> accesses(tables, 0), batch_max(tables, 0);
  std::vector<double> batch_sum(tables, 0.0);
  DataStats stats;
  stats.source = source.Describe();
  stats.batch_size = batch_size;
  double label_sum = 0;
  double working_set_sum = 0;
  std::vector<int64_t> batch_unique(tables);
  Batch batch;
  while (true) {
    ASSIGN_OR_RETURN(const int64_t read, source.Read(batch_size, &batch));
    if (read == 0) break;
    ++stats.batches;
    stats.samples += read;
    for (float label : batch.labels) label_sum += label;
    tbb::parallel_for(0, tables, [&](int t) {
      auto& table_counts = counts[t];
      auto& set = batch_sets[t];
      set.clear();
      const int64_t begin = batch.table_begin(t);
      const int64_t end = batch.table_begin(t + 1);
      for (int64_t k = begin; k < end; ++k) {
        ++table_counts[batch.ids[k]];
        set.insert(batch.ids[k]);
      }
      accesses[t] += end - begin;
      batch_unique[t] = static_cast<int64_t>(set.size());
      batch_sum[t] += static_cast<double>(set.size());
      batch_max[t] = std::max<int64_t>(batch_max[t], set.size());
    });
    int64_t working_set = 0;
    for (int64_t u : batch_unique) working_set += u;
    working_set_sum += static_cast<double>(working_set);
    stats.working_set_max = std::max(stats.working_set_max, working_set);
  }
  stats.label_mean = stats.samples > 0 ? label_sum / stats.samples : 0.0;
  stats.working_set_mean = stats.batches > 0 ? working_set_sum / stats.batches : 0.0;
  const Schema& schema = source.schema();
  stats.tables.resize(tables);
  tbb::parallel_for(0, tables, [&](int t) {
    TableStats& table = stats.tables[t];
    table.name = schema.table_names[t];
    table.rows = schema.table_rows[t];
    table.unique = static_cast<int64_t>(counts[t].size());
    table.accesses = accesses[t];
    std::vector<int64_t> values;
    values.reserve(counts[t].size());
    for (const auto& [id, count] : counts[t]) values.push_back(count);
    table.top10_share = TopShare(values, 0.10, accesses[t]);
    table.top1_share = TopShare(values, 0.01, accesses[t]);
    table.batch_unique_mean = stats.batches > 0 ? batch_sum[t] / stats.batches : 0.0;
    table.batch_unique_max = batch_max[t];
  });
  for (const TableStats& t : stats.tables) stats.total_unique += t.unique;
  stats.source_stats = source.stats();
  return stats;
}

}  // namespace bagpipe
