// Fuzz harness: plans on the wire (trainer_hooks/plan_codec.h). Input: an encoded plan. A plan
// that decodes re-encodes to bytes that decode to the same plan.
#include <cstdint>

#include "tests/fuzz/fuzz_util.h"
#include "trainer_hooks/plan_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  const Bytes bytes(data, data + size);
  PlanKind kind;
  TrainerPlan plan;
  const absl::Status status = DecodePlan(bytes, &kind, &plan);
  if (!status.ok()) {
    CheckMessage(status, "");
    return 0;
  }
  const Bytes encoded = EncodePlan(kind, plan);
  PlanKind kind2;
  TrainerPlan plan2;
  if (!DecodePlan(encoded, &kind2, &plan2).ok() || kind2 != kind ||
      EncodePlan(kind2, plan2) != encoded) {
    FuzzFail("a decoded plan does not survive encoding");
  }
  return 0;
}
