// Plans on the wire: the oracle rank sends each trainer its TrainerPlan (oracle/plan.h) for
// every iteration, then a drain plan (write back everything), evaluation batches and an end
// marker. Fields are encoded one by one (no struct padding on the wire), so equal plans encode
// to equal bytes.
#ifndef BAGPIPE_TRAINER_HOOKS_PLAN_CODEC_H_
#define BAGPIPE_TRAINER_HOOKS_PLAN_CODEC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "oracle/plan.h"
#include "sync/wire.h"

namespace bagpipe {

enum class PlanKind : uint8_t {
  kIteration = 1,  // a training iteration
  kDrain = 2,      // final extractions: write every dirty cached row back
  kEval = 3,       // an evaluation batch: rows are read from the servers, nothing is updated
  kEnd = 4,        // no more plans
  // A checkpoint's consistent cut (trainer_hooks/checkpoint.h): like kDrain (every dirty cached
  // row goes back to the servers, every slot is freed), then training continues with the
  // iteration the plan names, planned afresh.
  kCheckpoint = 5,
};

Bytes EncodePlan(PlanKind kind, const TrainerPlan& plan);
absl::Status DecodePlan(const Bytes& bytes, PlanKind* kind, TrainerPlan* plan);

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_PLAN_CODEC_H_
