#include "core/optimizer.h"

#include "absl/strings/str_cat.h"

namespace bagpipe {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view text) {
  if (text == "sgd") return OptimizerKind::kSgd;
  if (text == "adagrad") return OptimizerKind::kAdagrad;
  if (text == "rowwise-adagrad" || text == "rowwise_adagrad") return OptimizerKind::kRowwiseAdagrad;
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", std::string(text),
                                                 "' (expected sgd, adagrad or rowwise-adagrad)"));
}

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kRowwiseAdagrad:
      return "rowwise-adagrad";
  }
  return "?";
}

int StateFloatsPerRow(OptimizerKind kind, int dim) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return dim;
    case OptimizerKind::kRowwiseAdagrad:
      return 1;
  }
  return 0;
}

}  // namespace bagpipe
