#include "trainer_hooks/job_limits.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace bagpipe {
namespace {

// Memory of the planner per window slot and (trainer, table) track, whatever the data: the
// slot's per-trainer slices and next-use buckets. Measured with bagpipe train on the 26-table
// Criteo fixture, peak RSS at --lookahead 20000 against 20: 284 bytes (1 trainer) and 271
// bytes (2 trainers) per track and slot.
constexpr int64_t kWindowBytesPerTrackSlot = 290;
// Per id of a window batch: its unique index and, for a distinct row, the plan's row and slot
// and the segment's row, slot and next-use distance. Measured with bagpipe train (26 synthetic
// tables of 100k rows, --batch-size 256, peak RSS at --lookahead 1020 against 20): 20 bytes an
// id at pooling=1 and 22 at pooling=8 beyond the offsets, dense values and tracks counted apart
// (the estimate before this term was 2.8x low at pooling 1, 30x at pooling 20).
constexpr int64_t kWindowBytesPerId = 24;
// An embedded job's memory per role thread beyond its data (stack, mailbox, buffers).
constexpr int64_t kBytesPerEmbeddedRank = int64_t{8} << 20;
// Servers worth running as threads of one process (beyond that, use mpirun).
constexpr int kMaxEmbeddedServers = 256;

std::string FormatBytes(double bytes) {
  if (bytes >= 1e12) return absl::StrFormat("%.1f TB", bytes / 1e12);
  if (bytes >= 1e9) return absl::StrFormat("%.1f GB", bytes / 1e9);
  return absl::StrFormat("%.1f MB", bytes / 1e6);
}

}  // namespace

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

int64_t EstimateWindowBytes(const JobShape& shape) {
  // Per slot: every track's bookkeeping, and the global batch (ids at one per table and
  // sample, dense values, label).
  const double tracks = static_cast<double>(shape.trainers) * shape.num_tables;
  const double ids_per_sample =
      shape.ids_per_sample > 0 ? shape.ids_per_sample : static_cast<double>(shape.num_tables);
  const double batch =
      static_cast<double>(shape.batch_size) *
      (8.0 * shape.num_tables + 4.0 * shape.num_dense + 4 + kWindowBytesPerId * ids_per_sample);
  const double bytes =
      (static_cast<double>(shape.lookahead) + 4) * (tracks * kWindowBytesPerTrackSlot + batch);
  return static_cast<int64_t>(std::min(bytes, 9e18));
}

int64_t EstimateTrainerBytes(const JobShape& shape) {
  const double trainers = std::max(1, shape.trainers);
  const double cache = static_cast<double>(shape.cache_rows) * shape.record_floats * sizeof(float);
  const double buffers = 2.0 * std::ceil(static_cast<double>(shape.batch_size) / trainers) *
                         shape.num_tables * shape.dim * sizeof(float);
  const double bytes = (shape.embedded ? trainers : 1.0) * (cache + buffers);
  return static_cast<int64_t>(std::min(bytes, 9e18));
}

absl::Status CheckJobLimits(const JobShape& shape, int64_t memory_bytes) {
  if (memory_bytes <= 0) memory_bytes = PhysicalMemoryBytes();
  const double memory = static_cast<double>(memory_bytes);
  if (memory > 0) {
    const double window = static_cast<double>(EstimateWindowBytes(shape));
    if (window > memory / 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--lookahead %d: the oracle's window would take about %s (%d trainer(s) x %d tables "
          "and a batch of %d samples%s per window slot), more than half of this machine's %s of "
          "memory",
          shape.lookahead, FormatBytes(window), shape.trainers, shape.num_tables, shape.batch_size,
          shape.ids_per_sample > shape.num_tables
              ? absl::StrFormat(" of %.4g ids", shape.ids_per_sample)
              : "",
          FormatBytes(memory)));
    }
    const double trainer = static_cast<double>(EstimateTrainerBytes(shape));
    if (shape.host_trainers && trainer > memory / 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--dim %d with %s and --batch-size %d: the %s would take about %s "
          "(caches of %d-float records and the pooled embeddings and their gradients), more "
          "than half of this machine's %s of memory",
          shape.dim,
          shape.whole_tables
              ? absl::StrCat("--cache device (a cache of all ", shape.cache_rows, " rows)")
              : absl::StrCat("--cache-rows ", shape.cache_rows),
          shape.batch_size,
          shape.embedded ? absl::StrCat(shape.trainers, " trainer(s)' memory") : "trainer's memory",
          FormatBytes(trainer), shape.record_floats, FormatBytes(memory)));
    }
  }
  if (shape.embedded) {
    if (shape.servers > kMaxEmbeddedServers) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--servers %d: an embedded job runs every server as a thread of this process; more "
          "than %d gain nothing (launch under mpirun for more)",
          shape.servers, kMaxEmbeddedServers));
    }
    const double ranks = 1.0 + shape.servers + shape.trainers;
    if (memory > 0 && ranks * kBytesPerEmbeddedRank > memory / 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--servers %d with --trainers %d: the embedded job's %d role threads would take about "
          "%s, more than half of this machine's %s of memory",
          shape.servers, shape.trainers, static_cast<int>(ranks),
          FormatBytes(ranks * kBytesPerEmbeddedRank), FormatBytes(memory)));
    }
  }
  const LinkModel& link = shape.server_link;
  if (link.enabled()) {
    const absl::Duration limit = shape.peer_timeout / 2;
    if (link.latency >= limit) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--server-link %s: a latency of %s reaches half the peer timeout (%s): every fetch "
          "would time out; lower the latency or raise --peer-timeout",
          link.ToString(), absl::FormatDuration(link.latency), absl::FormatDuration(limit)));
    }
    if (link.bytes_per_second > 0) {
      // One iteration's rows at most: every id of a trainer's share of the batch.
      const double bytes = static_cast<double>(shape.batch_size) / shape.trainers *
                           shape.num_tables * shape.record_floats * sizeof(float);
      const double seconds = bytes / link.bytes_per_second;
      if (!(seconds < absl::ToDoubleSeconds(limit))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--server-link %s: one iteration's rows (up to %s per trainer) would take %.3g s, "
            "more than half the peer timeout (%s); raise the bandwidth or --peer-timeout",
            link.ToString(), FormatBytes(bytes), seconds, absl::FormatDuration(limit)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace bagpipe
