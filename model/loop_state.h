// The reference loop's checkpoint state (model/dlrm_loop.cc hands it to Trainer::SetLoopState):
// a JSON header line {parameters, optimizer_state, global_samples[, metrics_first_lines]}, then the
// dense parameters and the dense optimizer state as raw little-endian floats. It is read back from
// a checkpoint file (trainer.bin), so decoding treats it as untrusted: every count is checked
// against the bytes present before anything is allocated.
#ifndef BAGPIPE_MODEL_LOOP_STATE_H_
#define BAGPIPE_MODEL_LOOP_STATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace bagpipe {

struct DenseLoopState {
  std::vector<float> parameters;
  std::vector<float> optimizer_state;
  int64_t global_samples = 0;
  // JsonLinesWriter::first_lines() of the run's metrics at the checkpoint (trainer 0's loop
  // writes them); nullopt: no metrics file, or a state saved before they were recorded.
  std::optional<std::vector<int64_t>> metrics_first_lines;
};

std::string EncodeDenseLoopState(const DenseLoopState& state);

// Errors (DataLoss) say what is wrong: no header line, a field missing or not an integer, counts
// that do not match the bytes that follow, a value that is not finite (a state saved after the
// training diverged: nothing can train on from it).
absl::StatusOr<DenseLoopState> DecodeDenseLoopState(std::string_view bytes);

// OK if every parameter and optimizer value is finite; else FailedPrecondition naming the first
// value that is not ("dense parameter 17 of 1345 is nan"). The reference loop calls it before
// saving a checkpoint, so that a diverged run never leaves a non-finite checkpoint as the
// newest one.
absl::Status CheckDenseLoopStateFinite(const DenseLoopState& state);

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_LOOP_STATE_H_
