// Plans: what the oracle tells one trainer to do for one iteration.
//
// The oracle sees global batches L iterations ahead and decides, for every trainer t and
// iteration i, exactly which rows its cache holds, in which slots, what is fetched from the
// servers, what is written back, and which gradients are exchanged with which peers. The
// trainer executes the plan without hashing a single id.
//
// Executing TrainerPlan i on trainer t, in this order:
//  1. Boundary (before iteration i runs; all updates of iterations < i are applied, except
//     `sync_later` rows of i-1, see below):
//     a. extractions: for each entry of `extract`, copy the slot's row (values + optimizer
//        state) out; if `write_back`, send it to the row's server stamped `stamp` (= i).
//        Entries with `evict` free the slot; others (flushes) keep it resident.
//     b. fills: for each entry of `fills`, copy the row fetched from the servers (after the
//        server applied every write-back of the row stamped < i that the oracle knew of:
//        `after_stamp`, -1 for none) from staging into `slot`.
//  2. Forward/backward on the local batch: bag b of table k holds the rows
//     unique_rows[unique_index[j]] for j in the bag's range of `batch.offsets`; their slots are
//     unique_slots[unique_index[j]]. Row gradients are reduced per unique row, in occurrence
//     order, starting from +0.0f.
//  3. Sync and apply: rows of `private_unique` are updated from the trainer's own gradient.
//     Rows in `shared` (rows touched at i by any trainer and held by more than one) are updated
//     from the sum of every toucher's gradient, accumulated from +0.0f in trainer order; own
//     gradients go to the peers listed in `peers[p].send`, peers' gradients arrive in
//     `peers[p].recv` order. `shared` entries flagged `now` are exchanged and applied before
//     iteration i+1; the others before the boundary of i+2 (they are neither used nor extracted
//     at i+1 by anyone).
//
// This reduction order is the same for every cache mode and trainer count, which is why runs
// with and without the cache are bit-identical under --deterministic.
#ifndef BAGPIPE_ORACLE_PLAN_H_
#define BAGPIPE_ORACLE_PLAN_H_

#include <cstdint>
#include <vector>

#include "core/types.h"

namespace bagpipe {

// Row copied out of a slot at the boundary.
struct Extraction {
  SlotId slot;
  RowId row;
  bool evict;       // the slot becomes free (else: a flush, the row stays resident)
  bool write_back;  // send the row to its server (the one owner of this write-back)

  bool operator==(const Extraction&) const = default;
};

// Row fetched from the servers into a slot at the boundary.
struct Fill {
  SlotId slot;
  RowId row;
  // The server serves the fetch only after applying the write-back of this row stamped
  // `after_stamp` (the latest the oracle planned before this fill); -1 = none known.
  Iteration after_stamp;

  bool operator==(const Fill&) const = default;
};

// A row updated at this iteration on several trainers.
struct SharedRow {
  SlotId slot;
  RowId row;
  // Index into unique_rows when this trainer touched the row at this iteration, else -1.
  int32_t own_unique;
  // Exchanged and applied before the next iteration (else before the boundary of i+2).
  bool now;

  bool operator==(const SharedRow&) const = default;
};

// Gradients exchanged with one peer trainer, as indices into TrainerPlan::shared, in RowId
// order on both sides.
struct PeerExchange {
  int peer;
  std::vector<int32_t> send;  // rows this trainer touched that `peer` holds
  std::vector<int32_t> recv;  // rows `peer` touched that this trainer holds

  bool operator==(const PeerExchange&) const = default;
};

struct TrainerPlan {
  Iteration iteration = 0;
  int trainer = 0;
  int num_trainers = 1;

  // The local batch: dense features, labels and bag offsets of this trainer's shard, with
  // sparse ids replaced by indices into unique_rows.
  int64_t first_sample = 0;
  int32_t num_samples = 0;
  // Samples of the whole global batch (all trainers): the loss scale is 1 / global_samples.
  int32_t global_samples = 0;
  int32_t num_dense = 0;
  int32_t num_tables = 0;
  std::vector<float> labels;
  std::vector<float> dense;
  std::vector<int64_t> offsets;        // table-major CSR as in Batch
  std::vector<uint32_t> unique_index;  // per id occurrence

  // Distinct rows of the shard, by table, first-occurrence order within a table (within each
  // part of a table the planner splits, parts in order: oracle/planner.h).
  std::vector<RowId> unique_rows;
  std::vector<SlotId> unique_slots;  // their slots at this iteration

  std::vector<Extraction> extract;
  std::vector<Fill> fills;

  // Indices into unique_rows of rows only this trainer holds (updated from its own gradient).
  std::vector<int32_t> private_unique;
  std::vector<SharedRow> shared;    // RowId order
  std::vector<PeerExchange> peers;  // only peers with something to exchange, by peer id

  // Member-wise; plans are deterministic, so equal inputs give equal plans.
  bool operator==(const TrainerPlan&) const = default;
};

}  // namespace bagpipe

#endif  // BAGPIPE_ORACLE_PLAN_H_
