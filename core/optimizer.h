// Optimizer choices shared by the embedding cache (sparse rows) and the dense model.
//
// Formulas (identical in every backend, in this order of operations):
//   SGD:               w -= lr * g
//   Adagrad:           s += g * g;            w -= lr * g / (sqrt(s) + eps)   (per element)
//   Row-wise Adagrad:  s += mean_c(g_c * g_c); w -= lr * g / (sqrt(s) + eps)  (s per row)
// Optimizer state travels with the row (cache, staging, write-back, servers).
#ifndef BAGPIPE_CORE_OPTIMIZER_H_
#define BAGPIPE_CORE_OPTIMIZER_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace bagpipe {

enum class OptimizerKind { kSgd, kAdagrad, kRowwiseAdagrad };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  // Adagrad kinds: added to sqrt(s) in the denominator (torch.optim.Adagrad's default is 1e-10).
  float eps = 1e-8f;
  // Adagrad kinds: the value s starts at (torch.optim.Adagrad's initial_accumulator_value).
  float initial_accumulator = 0.0f;
};

// Checks a configuration: a finite learning rate >= 0 and, for the Adagrad kinds, a finite
// eps > 0 (a zero gradient on a zero accumulator would otherwise divide 0 by 0) and a finite
// initial accumulator >= 0. `what` names the optimizer in the message, e.g. "--optimizer".
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config, std::string_view what);

// "sgd", "adagrad", "rowwise-adagrad" (also "rowwise_adagrad").
absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view text);
std::string_view OptimizerName(OptimizerKind kind);
// Optimizer-state floats per row of `dim` values: 0 (SGD), dim (Adagrad), 1 (row-wise).
int StateFloatsPerRow(OptimizerKind kind, int dim);
// Floats in one row record: values then state.
inline int RecordFloats(OptimizerKind kind, int dim) { return dim + StateFloatsPerRow(kind, dim); }

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_OPTIMIZER_H_
