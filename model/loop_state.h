// The reference loop's checkpoint state (model/dlrm_loop.cc hands it to Trainer::SetLoopState):
// a JSON header line {parameters, optimizer_state, global_samples}, then the dense parameters
// and the dense optimizer state as raw little-endian floats. It is read back from a checkpoint
// file (trainer.bin), so decoding treats it as untrusted: every count is checked against the
// bytes present before anything is allocated.
#ifndef BAGPIPE_MODEL_LOOP_STATE_H_
#define BAGPIPE_MODEL_LOOP_STATE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace bagpipe {

struct DenseLoopState {
  std::vector<float> parameters;
  std::vector<float> optimizer_state;
  int64_t global_samples = 0;
};

std::string EncodeDenseLoopState(const DenseLoopState& state);

// Errors (DataLoss) say what is wrong: no header line, a field missing or not an integer, counts
// that do not match the bytes that follow.
absl::StatusOr<DenseLoopState> DecodeDenseLoopState(std::string_view bytes);

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_LOOP_STATE_H_
