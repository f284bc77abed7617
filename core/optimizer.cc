#include "core/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/excerpt.h"

namespace bagpipe {

absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view text) {
  if (text == "sgd") return OptimizerKind::kSgd;
  if (text == "adagrad") return OptimizerKind::kAdagrad;
  if (text == "rowwise-adagrad" || text == "rowwise_adagrad") return OptimizerKind::kRowwiseAdagrad;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", Excerpt(absl::string_view(text.data(), text.size())),
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

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config, std::string_view what) {
  const std::string name(OptimizerName(config.kind));
  if (!(std::isfinite(config.learning_rate) && config.learning_rate >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s: the learning rate must be finite and >= 0, got %g", what, name,
                        config.learning_rate));
  }
  if (config.kind == OptimizerKind::kSgd) return absl::OkStatus();
  if (!(std::isfinite(config.eps) && config.eps > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s: eps must be finite and > 0 (a zero gradient on a zero accumulator would divide "
        "0 by 0), got %g",
        what, name, config.eps));
  }
  if (!(std::isfinite(config.initial_accumulator) && config.initial_accumulator >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %s: the initial accumulator must be finite and >= 0, got %g", what,
                        name, config.initial_accumulator));
  }
  return absl::OkStatus();
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
