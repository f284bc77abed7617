#include "oracle/simulator.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/random.h"
#include "core/status.h"
#include "oracle/planner.h"
#include "oracle/row_store.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace bagpipe {
namespace {

constexpr int kWays = 32;

// The distinct rows of every batch, table by table, in first-occurrence order: what a batch
// means to a cache.
class CompactTrace {
 public:
  explicit CompactTrace(int tables) : tables_(tables) { offsets_.push_back(0); }

  absl::Status Add(const Batch& batch) {
    if (batch.num_tables != tables_ ||
        batch.offsets.size() != static_cast<size_t>(batch.num_tables) * batch.num_samples + 1 ||
        batch.ids.size() != static_cast<size_t>(batch.num_ids())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch ", batches_, " (first sample ", batch.first_sample, ") has ", batch.num_tables,
          " tables and a malformed sparse layout for a schema of ", tables_, " tables"));
    }
    for (int t = 0; t < tables_; ++t) {
      const int64_t begin = batch.table_begin(t);
      const int64_t end = t + 1 < tables_ ? batch.table_begin(t + 1) : batch.num_ids();
      dedup_.Reset(static_cast<size_t>(end - begin));
      for (int64_t j = begin; j < end; ++j) {
        if (batch.ids[j] < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("batch ", batches_, ", table ", t, ": negative id ", batch.ids[j]));
        }
        bool inserted;
        dedup_.Insert(batch.ids[j], &inserted);
        if (inserted) ids_.push_back(batch.ids[j]);
      }
      offsets_.push_back(static_cast<int64_t>(ids_.size()));
    }
    ++batches_;
    id_count_ += batch.num_ids();
    return absl::OkStatus();
  }

  // Linearises the rows with the final schema and links every access to its next use.
  absl::Status Finalize(const Schema& schema) {
    if (schema.num_tables() != tables_) {
      return absl::InvalidArgumentError(
          absl::StrCat("the schema has ", schema.num_tables(), " tables, the batches ", tables_));
    }
    const std::vector<RowId> table_offsets = schema.TableOffsets();
    rows_.resize(ids_.size());
    for (int64_t b = 0; b < batches_; ++b) {
      for (int t = 0; t < tables_; ++t) {
        for (int64_t a = offsets_[b * tables_ + t]; a < offsets_[b * tables_ + t + 1]; ++a) {
          if (ids_[a] >= schema.table_rows[t]) {
            return absl::InvalidArgumentError(
                absl::StrCat("batch ", b, ", table ", schema.table_names[t], ": id ", ids_[a],
                             " is outside [0, ", schema.table_rows[t], ")"));
          }
          rows_[a] = table_offsets[t] + static_cast<RowId>(ids_[a]);
        }
      }
      max_working_set_ = std::max(max_working_set_, end(b) - begin(b));
    }
    next_use_.assign(rows_.size(), kNever);
    absl::flat_hash_map<RowId, Iteration> later;
    for (int64_t b = batches_ - 1; b >= 0; --b) {
      for (int64_t a = begin(b); a < end(b); ++a) {
        auto [it, inserted] = later.try_emplace(rows_[a], b);
        if (!inserted) {
          next_use_[a] = it->second;
          it->second = b;
        }
      }
    }
    unique_rows_ = static_cast<int64_t>(later.size());
    return absl::OkStatus();
  }

  // Batch b as a one-sample batch whose bag of table t holds the table's distinct ids.
  Batch CompactBatch(int64_t b, int num_dense) const {
    Batch batch;
    batch.Reset(num_dense, tables_);
    batch.first_sample = b;
    batch.num_samples = 1;
    const int64_t first = offsets_[b * tables_];
    for (int t = 0; t < tables_; ++t) {
      batch.offsets.push_back(offsets_[b * tables_ + t + 1] - first);
    }
    batch.ids.assign(ids_.begin() + first, ids_.begin() + end(b));
    return batch;
  }

  int64_t batches() const { return batches_; }
  int64_t id_count() const { return id_count_; }
  int64_t accesses() const { return static_cast<int64_t>(rows_.size()); }
  int64_t unique_rows() const { return unique_rows_; }
  int64_t max_working_set() const { return max_working_set_; }
  int64_t begin(int64_t b) const { return offsets_[b * tables_]; }
  int64_t end(int64_t b) const { return offsets_[(b + 1) * tables_]; }
  RowId row(int64_t a) const { return rows_[a]; }
  Iteration next_use(int64_t a) const { return next_use_[a]; }

 private:
  int tables_;
  int64_t batches_ = 0;
  int64_t id_count_ = 0;
  std::vector<int64_t> ids_;
  std::vector<int64_t> offsets_;  // access range of (batch b, table t): [b*K+t], [b*K+t+1]
  std::vector<RowId> rows_;
  std::vector<Iteration> next_use_;
  int64_t unique_rows_ = 0;
  int64_t max_working_set_ = 0;
  oracle_internal::BatchDedup dedup_;
};

// oracle, lru, lfu: the planner itself, without local batches.
absl::Status RunPlanner(const CompactTrace& trace, const Schema& schema, CachePolicy policy,
                        int64_t capacity, int lookahead, SimPolicyResult* result) {
  PlannerOptions options;
  options.schema = schema;
  options.policy = policy;
  // Beyond the trace's distinct rows extra capacity changes nothing; do not allocate it.
  options.capacity = std::min(capacity, std::max<int64_t>(trace.unique_rows(), 1));
  options.lookahead = lookahead;
  options.build_batch = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Planner> planner, Planner::Create(options));
  auto drain_popped = [&]() -> absl::Status {
    while (true) {
      ASSIGN_OR_RETURN(std::optional<std::vector<TrainerPlan>> plans, planner->Pop());
      if (!plans) return absl::OkStatus();
      planner->Recycle(std::move(*plans));
    }
  };
  for (int64_t b = 0; b < trace.batches(); ++b) {
    RETURN_IF_ERROR(planner->Push(trace.CompactBatch(b, schema.num_dense())));
    RETURN_IF_ERROR(drain_popped());
  }
  RETURN_IF_ERROR(planner->Finish());
  RETURN_IF_ERROR(drain_popped());
  const PlannerStats stats = planner->stats();
  result->misses = stats[PlannerCounter::kMisses];
  result->hits = stats[PlannerCounter::kHits];
  result->evictions = stats[PlannerCounter::kEvictions];
  result->writebacks = stats[PlannerCounter::kWriteBacks];
  return absl::OkStatus();
}

// belady: evict the row whose next use is furthest (never used again first).
void RunBelady(const CompactTrace& trace, int64_t capacity, SimPolicyResult* result) {
  std::set<std::pair<Iteration, RowId>> by_next_use;
  absl::flat_hash_map<RowId, Iteration> resident;
  for (int64_t b = 0; b < trace.batches(); ++b) {
    int64_t misses = 0;
    for (int64_t a = trace.begin(b); a < trace.end(b); ++a) {
      auto it = resident.find(trace.row(a));
      if (it == resident.end()) {
        ++misses;
      } else {
        by_next_use.erase({it->second, trace.row(a)});
      }
    }
    // The batch's rows are out of by_next_use: every candidate is a legal victim.
    int64_t need = static_cast<int64_t>(resident.size()) + misses - capacity;
    for (; need > 0; --need) {
      auto victim = std::prev(by_next_use.end());
      resident.erase(victim->second);
      by_next_use.erase(victim);
      ++result->evictions;
    }
    for (int64_t a = trace.begin(b); a < trace.end(b); ++a) {
      resident[trace.row(a)] = trace.next_use(a);
      by_next_use.insert({trace.next_use(a), trace.row(a)});
    }
    result->misses += misses;
  }
  result->hits = trace.accesses() - result->misses;
  result->writebacks = result->evictions;
}

// lru-32way: FBGEMM-shaped set-associative LRU (see the header).
void RunSetAssociative(const CompactTrace& trace, int64_t capacity, SimPolicyResult* result) {
  const int64_t sets = capacity / kWays;
  constexpr RowId kEmpty = std::numeric_limits<RowId>::max();
  // The lines of the sets the trace touches: all sets when there are no more sets than distinct
  // rows (a set's lines at set * kWays), else only the touched ones, placed as first touched
  // (a 2^31-row capacity would otherwise take 32 GiB for a trace of a few rows).
  const bool dense = sets <= trace.unique_rows();
  std::vector<RowId> tags(dense ? static_cast<size_t>(sets * kWays) : 0, kEmpty);
  std::vector<Iteration> last_use(tags.size(), -1);
  absl::flat_hash_map<int64_t, int64_t> placed;  // sparse: set -> its first line
  std::vector<int64_t> missed;
  // The first line of `row`'s set; -1 for a set not placed yet unless `place`.
  auto base_of = [&](RowId row, bool place) -> int64_t {
    const int64_t set = static_cast<int64_t>(Mix64(row) % static_cast<uint64_t>(sets));
    if (dense) return set * kWays;
    if (!place) {
      const auto it = placed.find(set);
      return it == placed.end() ? -1 : it->second;
    }
    const auto [it, inserted] = placed.try_emplace(set, static_cast<int64_t>(tags.size()));
    if (inserted) {
      tags.resize(tags.size() + kWays, kEmpty);
      last_use.resize(tags.size(), -1);
    }
    return it->second;
  };
  for (int64_t b = 0; b < trace.batches(); ++b) {
    missed.clear();
    for (int64_t a = trace.begin(b); a < trace.end(b); ++a) {
      const int64_t base = base_of(trace.row(a), false);
      if (base < 0) {
        missed.push_back(a);
        continue;
      }
      bool hit = false;
      for (int w = 0; w < kWays && !hit; ++w) {
        if (tags[base + w] == trace.row(a)) {
          last_use[base + w] = b;
          hit = true;
        }
      }
      if (!hit) missed.push_back(a);
    }
    for (int64_t a : missed) {
      const int64_t base = base_of(trace.row(a), true);
      int64_t victim = -1;
      for (int w = 0; w < kWays; ++w) {
        const int64_t line = base + w;
        if (last_use[line] == b) continue;  // used by this batch
        if (victim < 0 || tags[line] == kEmpty ||
            (tags[victim] != kEmpty && last_use[line] < last_use[victim])) {
          victim = line;
          if (tags[line] == kEmpty) break;
        }
      }
      if (victim < 0) continue;  // every way serves this batch: fetched uncached
      if (tags[victim] != kEmpty) ++result->evictions;
      tags[victim] = trace.row(a);
      last_use[victim] = b;
    }
    result->misses += static_cast<int64_t>(missed.size());
  }
  result->hits = trace.accesses() - result->misses;
  result->writebacks = result->evictions;
}

// ttl: a row used at b stays until its last use within [b, b+L-1]. Holding the expiry at the
// next use inside the window and extending it there gives the same residency at every batch.
void RunTtl(const CompactTrace& trace, int lookahead, SimPolicyResult* result) {
  absl::flat_hash_map<RowId, Iteration> expiry;
  std::vector<std::vector<RowId>> expiring(static_cast<size_t>(lookahead) + 1);
  int64_t peak = 0;
  for (int64_t b = 0; b < trace.batches(); ++b) {
    if (b > 0) {
      std::vector<RowId>& due = expiring[static_cast<size_t>((b - 1) % (lookahead + 1))];
      for (RowId row : due) {
        auto it = expiry.find(row);
        if (it != expiry.end() && it->second == b - 1) {
          expiry.erase(it);
          ++result->evictions;
        }
      }
      due.clear();
    }
    for (int64_t a = trace.begin(b); a < trace.end(b); ++a) {
      const RowId row = trace.row(a);
      const Iteration next = trace.next_use(a);
      const Iteration until = next <= b + lookahead - 1 ? next : b;
      auto [it, inserted] = expiry.try_emplace(row, until);
      if (inserted) {
        ++result->misses;
      } else {
        it->second = until;
      }
      expiring[static_cast<size_t>(until % (lookahead + 1))].push_back(row);
    }
    peak = std::max(peak, static_cast<int64_t>(expiry.size()));
  }
  result->hits = trace.accesses() - result->misses;
  result->writebacks = result->evictions;
  result->peak_rows = peak;
}

double MissRatio(int64_t misses, int64_t accesses) {
  return accesses > 0 ? static_cast<double>(misses) / static_cast<double>(accesses) : 0.0;
}

absl::StatusOr<SimResult> SimulateTrace(const CompactTrace& trace, const Schema& schema,
                                        const SimOptions& options) {
  if (options.lookahead < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lookahead must be >= 1, got ", options.lookahead));
  }
  for (const std::string& policy : options.policies) {
    if (std::find(SimPolicyNames().begin(), SimPolicyNames().end(), policy) ==
        SimPolicyNames().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown simulator policy \"", policy,
                       "\"; expected one of: oracle, belady, lru, lfu, lru-32way, ttl"));
    }
  }
  std::vector<int64_t> capacities = options.capacities;
  std::sort(capacities.begin(), capacities.end());
  capacities.erase(std::unique(capacities.begin(), capacities.end()), capacities.end());
  for (const std::string& policy : options.policies) {
    if (policy != "ttl" && capacities.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("policy ", policy, " needs capacities"));
    }
  }
  if (!capacities.empty() && capacities.front() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacities must be positive, got ", capacities.front()));
  }

  SimResult result;
  result.batches = trace.batches();
  result.ids = trace.id_count();
  result.accesses = trace.accesses();
  result.unique_rows = trace.unique_rows();
  result.max_batch_working_set = trace.max_working_set();
  result.lookahead = options.lookahead;
  for (const std::string& policy : options.policies) {
    SimPolicyResult r;
    r.policy = policy;
    if (policy == "ttl") {
      result.results.push_back(r);
      continue;
    }
    for (int64_t capacity : capacities) {
      r.capacity = capacity;
      result.results.push_back(r);
    }
  }

  std::vector<absl::Status> errors(result.results.size());
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, result.results.size(), 1),
      [&](const tbb::blocked_range<size_t>& range) {
        for (size_t k = range.begin(); k != range.end(); ++k) {
          SimPolicyResult& r = result.results[k];
          const bool whole_batches = r.policy != "ttl" && r.policy != "lru-32way";
          if (whole_batches && r.capacity < trace.max_working_set()) {
            r.error =
                absl::StrCat("capacity ", r.capacity, " is below the largest batch working set (",
                             trace.max_working_set(), " rows)");
          } else if (r.policy == "lru-32way" && r.capacity < kWays) {
            r.error =
                absl::StrCat("capacity ", r.capacity, " is below one set of ", kWays, " ways");
          } else if (r.policy == "oracle") {
            errors[k] =
                RunPlanner(trace, schema, CachePolicy::kOracle, r.capacity, options.lookahead, &r);
          } else if (r.policy == "lru") {
            errors[k] = RunPlanner(trace, schema, CachePolicy::kLru, r.capacity, 1, &r);
          } else if (r.policy == "lfu") {
            errors[k] = RunPlanner(trace, schema, CachePolicy::kLfu, r.capacity, 1, &r);
          } else if (r.policy == "belady") {
            RunBelady(trace, r.capacity, &r);
          } else if (r.policy == "lru-32way") {
            RunSetAssociative(trace, r.capacity, &r);
          } else {
            RunTtl(trace, options.lookahead, &r);
          }
        }
      });
  for (size_t k = 0; k < errors.size(); ++k) {
    RETURN_IF_ERROR(Annotate(errors[k], absl::StrCat("simulating ", result.results[k].policy,
                                                     " at capacity ", result.results[k].capacity)));
  }
  return result;
}

}  // namespace

const std::vector<std::string>& SimPolicyNames() {
  static const std::vector<std::string> names = {"oracle", "belady",    "lru",
                                                 "lfu",    "lru-32way", "ttl"};
  return names;
}

nlohmann::json SimResult::ToJson() const {
  nlohmann::json json = {{"batches", batches},
                         {"ids", ids},
                         {"accesses", accesses},
                         {"unique_rows", unique_rows},
                         {"max_batch_working_set", max_batch_working_set},
                         {"lookahead", lookahead}};
  nlohmann::json list = nlohmann::json::array();
  for (const SimPolicyResult& r : results) {
    nlohmann::json item = {{"policy", r.policy}};
    item["capacity"] = r.policy == "ttl" ? nlohmann::json(nullptr) : nlohmann::json(r.capacity);
    if (!r.error.empty()) {
      item["error"] = r.error;
    } else {
      item["misses"] = r.misses;
      item["hits"] = r.hits;
      item["evictions"] = r.evictions;
      item["writebacks"] = r.writebacks;
      item["miss_ratio"] = MissRatio(r.misses, accesses);
      if (r.policy == "ttl") item["peak_rows"] = r.peak_rows;
    }
    list.push_back(std::move(item));
  }
  json["results"] = std::move(list);
  return json;
}

absl::Status SimResult::WriteMrc(const std::string& csv_path) const {
  std::ofstream out(csv_path, std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", csv_path, ": ", std::strerror(errno)));
  }
  out << "policy,capacity,misses,accesses,miss_ratio\n";
  for (const SimPolicyResult& r : results) {
    if (!r.error.empty()) continue;
    const int64_t capacity = r.policy == "ttl" ? r.peak_rows : r.capacity;
    out << absl::StrFormat("%s,%d,%d,%d,%.6f\n", r.policy, capacity, r.misses, accesses,
                           MissRatio(r.misses, accesses));
  }
  out.close();
  if (!out) {
    return absl::DataLossError(absl::StrCat("error writing ", csv_path));
  }
  return absl::OkStatus();
}

std::string SimResult::Table() const {
  std::string text = absl::StrFormat(
      "%d batches, %d ids, %d accesses (distinct rows per batch, summed), %d distinct rows, "
      "largest batch working set %d rows, lookahead %d\n",
      batches, ids, accesses, unique_rows, max_batch_working_set, lookahead);
  std::vector<std::string> columns;
  std::vector<int64_t> capacities;
  const SimPolicyResult* ttl = nullptr;
  for (const SimPolicyResult& r : results) {
    if (r.policy == "ttl") {
      ttl = &r;
      continue;
    }
    if (std::find(columns.begin(), columns.end(), r.policy) == columns.end()) {
      columns.push_back(r.policy);
    }
    if (std::find(capacities.begin(), capacities.end(), r.capacity) == capacities.end()) {
      capacities.push_back(r.capacity);
    }
  }
  std::sort(capacities.begin(), capacities.end());
  if (!columns.empty()) {
    absl::StrAppend(&text, "miss ratio (misses) by cache capacity in rows:\n");
    absl::StrAppend(&text, absl::StrFormat("%14s", "capacity"));
    for (const std::string& c : columns) absl::StrAppend(&text, absl::StrFormat("  %22s", c));
    absl::StrAppend(&text, "\n");
    for (int64_t capacity : capacities) {
      absl::StrAppend(&text, absl::StrFormat("%14d", capacity));
      for (const std::string& c : columns) {
        std::string cell = "-";
        for (const SimPolicyResult& r : results) {
          if (r.policy != c || r.capacity != capacity) continue;
          cell = r.error.empty() ? absl::StrFormat("%.2f%% (%d)",
                                                   100.0 * MissRatio(r.misses, accesses), r.misses)
                                 : "too small";
        }
        absl::StrAppend(&text, absl::StrFormat("  %22s", cell));
      }
      absl::StrAppend(&text, "\n");
    }
  }
  if (ttl != nullptr) {
    absl::StrAppend(
        &text, absl::StrFormat("ttl (rows live until their last use within %d batches): %.2f%% "
                               "(%d misses), peak %d resident rows\n",
                               lookahead, 100.0 * MissRatio(ttl->misses, accesses), ttl->misses,
                               ttl->peak_rows));
  }
  return text;
}

absl::StatusOr<SimResult> Simulate(BatchStream& stream, const SimOptions& options) {
  const int tables = stream.source().schema().num_tables();
  CompactTrace trace(tables);
  Batch batch;
  while (true) {
    ASSIGN_OR_RETURN(bool more, stream.Next(&batch));
    if (!more) break;
    RETURN_IF_ERROR(trace.Add(batch));
  }
  const Schema& schema = stream.source().schema();
  RETURN_IF_ERROR(trace.Finalize(schema));
  return SimulateTrace(trace, schema, options);
}

absl::StatusOr<SimResult> Simulate(const std::vector<Batch>& batches, const Schema& schema,
                                   const SimOptions& options) {
  CompactTrace trace(schema.num_tables());
  for (const Batch& batch : batches) RETURN_IF_ERROR(trace.Add(batch));
  RETURN_IF_ERROR(trace.Finalize(schema));
  return SimulateTrace(trace, schema, options);
}

}  // namespace bagpipe
