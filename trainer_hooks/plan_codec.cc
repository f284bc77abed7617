#include "trainer_hooks/plan_codec.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace bagpipe {
namespace {

constexpr uint32_t kPlanMagic = 0x504c414e;  // "PLAN"

}  // namespace

Bytes EncodePlan(PlanKind kind, const TrainerPlan& plan) {
  WireWriter w;
  w.Put(kPlanMagic);
  w.Put(static_cast<uint8_t>(kind));
  w.Put(plan.iteration);
  w.Put<int32_t>(plan.trainer);
  w.Put<int32_t>(plan.num_trainers);
  w.Put(plan.first_sample);
  w.Put(plan.num_samples);
  w.Put(plan.global_samples);
  w.Put(plan.num_dense);
  w.Put(plan.num_tables);
  w.PutVector(plan.labels);
  w.PutVector(plan.dense);
  w.PutVector(plan.offsets);
  w.PutVector(plan.unique_index);
  w.PutVector(plan.unique_rows);
  w.PutVector(plan.unique_slots);

  std::vector<SlotId> slots;
  std::vector<RowId> rows;
  std::vector<uint8_t> flags;
  for (const Extraction& e : plan.extract) {
    slots.push_back(e.slot);
    rows.push_back(e.row);
    flags.push_back(static_cast<uint8_t>((e.evict ? 1 : 0) | (e.write_back ? 2 : 0)));
  }
  w.PutVector(slots);
  w.PutVector(rows);
  w.PutVector(flags);

  slots.clear();
  rows.clear();
  std::vector<Iteration> stamps;
  for (const Fill& f : plan.fills) {
    slots.push_back(f.slot);
    rows.push_back(f.row);
    stamps.push_back(f.after_stamp);
  }
  w.PutVector(slots);
  w.PutVector(rows);
  w.PutVector(stamps);

  w.PutVector(plan.private_unique);

  slots.clear();
  rows.clear();
  flags.clear();
  std::vector<int32_t> own;
  for (const SharedRow& s : plan.shared) {
    slots.push_back(s.slot);
    rows.push_back(s.row);
    own.push_back(s.own_unique);
    flags.push_back(s.now ? 1 : 0);
  }
  w.PutVector(slots);
  w.PutVector(rows);
  w.PutVector(own);
  w.PutVector(flags);

  w.Put<uint32_t>(static_cast<uint32_t>(plan.peers.size()));
  for (const PeerExchange& p : plan.peers) {
    w.Put<int32_t>(p.peer);
    w.PutVector(p.send);
    w.PutVector(p.recv);
  }
  return w.Take();
}

absl::Status DecodePlan(const Bytes& bytes, PlanKind* kind, TrainerPlan* plan) {
  WireReader r(bytes, "plan");
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Get(&magic));
  if (magic != kPlanMagic) return absl::DataLossError("plan: bad magic");
  uint8_t raw_kind = 0;
  RETURN_IF_ERROR(r.Get(&raw_kind));
  if (raw_kind < 1 || raw_kind > 5) return absl::DataLossError("plan: unknown kind");
  *kind = static_cast<PlanKind>(raw_kind);
  *plan = TrainerPlan();
  int32_t trainer = 0, num_trainers = 0;
  RETURN_IF_ERROR(r.Get(&plan->iteration));
  RETURN_IF_ERROR(r.Get(&trainer));
  RETURN_IF_ERROR(r.Get(&num_trainers));
  plan->trainer = trainer;
  plan->num_trainers = num_trainers;
  RETURN_IF_ERROR(r.Get(&plan->first_sample));
  RETURN_IF_ERROR(r.Get(&plan->num_samples));
  RETURN_IF_ERROR(r.Get(&plan->global_samples));
  RETURN_IF_ERROR(r.Get(&plan->num_dense));
  RETURN_IF_ERROR(r.Get(&plan->num_tables));
  RETURN_IF_ERROR(r.GetVector(&plan->labels));
  RETURN_IF_ERROR(r.GetVector(&plan->dense));
  RETURN_IF_ERROR(r.GetVector(&plan->offsets));
  RETURN_IF_ERROR(r.GetVector(&plan->unique_index));
  RETURN_IF_ERROR(r.GetVector(&plan->unique_rows));
  RETURN_IF_ERROR(r.GetVector(&plan->unique_slots));

  std::vector<SlotId> slots;
  std::vector<RowId> rows;
  std::vector<uint8_t> flags;
  RETURN_IF_ERROR(r.GetVector(&slots));
  RETURN_IF_ERROR(r.GetVector(&rows));
  RETURN_IF_ERROR(r.GetVector(&flags));
  if (rows.size() != slots.size() || flags.size() != slots.size()) {
    return absl::DataLossError("plan: extraction lists differ in length");
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    plan->extract.push_back({slots[k], rows[k], (flags[k] & 1) != 0, (flags[k] & 2) != 0});
  }

  std::vector<Iteration> stamps;
  RETURN_IF_ERROR(r.GetVector(&slots));
  RETURN_IF_ERROR(r.GetVector(&rows));
  RETURN_IF_ERROR(r.GetVector(&stamps));
  if (rows.size() != slots.size() || stamps.size() != slots.size()) {
    return absl::DataLossError("plan: fill lists differ in length");
  }
  for (size_t k = 0; k < slots.size(); ++k) plan->fills.push_back({slots[k], rows[k], stamps[k]});

  RETURN_IF_ERROR(r.GetVector(&plan->private_unique));

  std::vector<int32_t> own;
  RETURN_IF_ERROR(r.GetVector(&slots));
  RETURN_IF_ERROR(r.GetVector(&rows));
  RETURN_IF_ERROR(r.GetVector(&own));
  RETURN_IF_ERROR(r.GetVector(&flags));
  if (rows.size() != slots.size() || own.size() != slots.size() || flags.size() != slots.size()) {
    return absl::DataLossError("plan: shared-row lists differ in length");
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    plan->shared.push_back({slots[k], rows[k], own[k], flags[k] != 0});
  }

  uint32_t peers = 0;
  RETURN_IF_ERROR(r.Get(&peers));
  for (uint32_t p = 0; p < peers; ++p) {
    PeerExchange exchange;
    int32_t peer = 0;
    RETURN_IF_ERROR(r.Get(&peer));
    exchange.peer = peer;
    RETURN_IF_ERROR(r.GetVector(&exchange.send));
    RETURN_IF_ERROR(r.GetVector(&exchange.recv));
    plan->peers.push_back(std::move(exchange));
  }
  RETURN_IF_ERROR(r.ExpectDone());
  // Structural checks a corrupted or mismatched plan would fail.
  const size_t bags = static_cast<size_t>(plan->num_tables) * plan->num_samples + 1;
  if (plan->labels.size() != static_cast<size_t>(plan->num_samples) ||
      plan->dense.size() != static_cast<size_t>(plan->num_samples) * plan->num_dense ||
      (plan->num_samples > 0 && plan->offsets.size() != bags) ||
      plan->unique_slots.size() != plan->unique_rows.size()) {
    return absl::DataLossError(
        absl::StrCat("plan for iteration ", plan->iteration, " has inconsistent batch arrays"));
  }
  if (!plan->offsets.empty() &&
      static_cast<size_t>(plan->offsets.back()) != plan->unique_index.size()) {
    return absl::DataLossError(
        absl::StrCat("plan for iteration ", plan->iteration, ": offsets do not cover the ids"));
  }
  for (uint32_t u : plan->unique_index) {
    if (u >= plan->unique_rows.size()) {
      return absl::DataLossError(
          absl::StrCat("plan for iteration ", plan->iteration, ": unique index out of range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace bagpipe
