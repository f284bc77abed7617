// Dataset statistics that size a cache: per table, how many distinct rows are used, how skewed
// the accesses are, and how many distinct rows one batch needs (`bagpipe data-stats`).
#ifndef BAGPIPE_DATA_DATA_STATS_H_
#define BAGPIPE_DATA_DATA_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/source.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

struct TableStats {
  std::string name;
  int64_t rows = 0;      // table size from the schema (ids are < rows)
  int64_t unique = 0;    // distinct rows accessed
  int64_t accesses = 0;  // ids read (multi-hot bags count every id)
  // Share of accesses going to the most accessed 1% of the distinct rows (max(1, floor(1% of
  // them)) rows: a table of 104 rows counts its top row).
  double top1_share = 0;
  double top10_share = 0;        // ... top 10%
  double batch_unique_mean = 0;  // distinct rows per batch
  int64_t batch_unique_max = 0;
};

struct DataStats {
  std::string source;
  int64_t samples = 0;
  int64_t batches = 0;
  int64_t batch_size = 0;
  double label_mean = 0;
  std::vector<TableStats> tables;
  // Distinct rows per batch over all tables: the working set a cache must hold at once.
  double working_set_mean = 0;
  int64_t working_set_max = 0;
  int64_t total_unique = 0;
  SourceStats source_stats;

  nlohmann::json ToJson() const;
  // Human-readable report (one line per table and a total).
  std::string Table() const;
};

// Reads one epoch of `source` in batches of `batch_size` (the last may be short) and computes
// the statistics. Tables are processed in parallel (TBB); memory grows with distinct rows.
absl::StatusOr<DataStats> ComputeDataStats(SampleSource& source, int64_t batch_size);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_DATA_STATS_H_
