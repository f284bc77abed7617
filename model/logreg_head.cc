#include "model/logreg_head.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "core/status.h"

namespace bagpipe {
namespace {

// Numerically stable binary cross entropy from a logit.
double Bce(double logit, double label) {
  return std::max(logit, 0.0) - logit * label + std::log1p(std::exp(-std::abs(logit)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LogRegHead>> LogRegHead::Create(
    std::shared_ptr<DeviceContext> context, int num_tables, int dim, uint64_t seed,
    OptimizerConfig optimizer) {
  if (context->is_cuda()) {
    return absl::UnimplementedError(
        "the embedding-only logistic regression (--model logreg) runs on --device cpu only");
  }
  if (num_tables <= 0 || dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logreg: ", num_tables, " tables of dim ", dim, ": both must be positive"));
  }
  // One weight per pooled float (num_tables x dim), counted in an int.
  const int64_t width = int64_t{num_tables} * dim;
  if (width >= std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("logreg: ", num_tables, " tables of dim ", dim,
                                                   " make ", width,
                                                   " weights: at most 2^31 - 2 are supported"));
  }
  std::unique_ptr<LogRegHead> head(new LogRegHead(context, num_tables * dim, optimizer));
  head->parameters_.resize(head->width_ + 1, 0.0f);
  for (int k = 0; k < head->width_; ++k) {
    head->parameters_[k] = static_cast<float>(0.1 * UnitDouble(HashKey(seed, 0x109e, k)) - 0.05);
  }
  head->gradients_.assign(head->parameters_.size(), 0.0f);
  head->accumulators_.assign(head->parameters_.size(), optimizer.initial_accumulator);
  return head;
}

double LogRegHead::Logit(const float* pooled_row) const {
  double logit = parameters_[width_];
  for (int k = 0; k < width_; ++k) logit += static_cast<double>(parameters_[k]) * pooled_row[k];
  return logit;
}

absl::StatusOr<double> LogRegHead::ForwardBackward(const float* /*dense*/, const float* pooled,
                                                   const float* labels, int n, float loss_scale,
                                                   float* pooled_grad) {
  RETURN_IF_ERROR(context_->Synchronize());
  double loss = 0;
  for (int s = 0; s < n; ++s) {
    const float* row = pooled + static_cast<size_t>(s) * width_;
    const double logit = Logit(row);
    loss += Bce(logit, labels[s]);
    const float d = static_cast<float>((1.0 / (1.0 + std::exp(-logit)) - labels[s]) * loss_scale);
    float* grad_row = pooled_grad + static_cast<size_t>(s) * width_;
    for (int k = 0; k < width_; ++k) {
      grad_row[k] = d * parameters_[k];
      gradients_[k] += d * row[k];
    }
    gradients_[width_] += d;
  }
  return loss;
}

absl::StatusOr<double> LogRegHead::Forward(const float* /*dense*/, const float* pooled,
                                           const float* labels, int n, float* probabilities_host) {
  RETURN_IF_ERROR(context_->Synchronize());
  double loss = 0;
  for (int s = 0; s < n; ++s) {
    const double logit = Logit(pooled + static_cast<size_t>(s) * width_);
    if (labels != nullptr) loss += Bce(logit, labels[s]);
    if (probabilities_host != nullptr) {
      probabilities_host[s] = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
    }
  }
  return loss;
}

absl::Status LogRegHead::Step(float lr) {
  const bool adagrad = optimizer_.kind != OptimizerKind::kSgd;
  for (size_t k = 0; k < parameters_.size(); ++k) {
    const float g = gradients_[k];
    if (adagrad) {
      accumulators_[k] += g * g;
      parameters_[k] -= lr * g / (std::sqrt(accumulators_[k]) + optimizer_.eps);
    } else {
      parameters_[k] -= lr * g;
    }
    gradients_[k] = 0.0f;
  }
  return absl::OkStatus();
}

absl::Status LogRegHead::ReadParameters(std::vector<float>* parameters) const {
  *parameters = parameters_;
  return absl::OkStatus();
}

absl::Status LogRegHead::WriteParameters(const std::vector<float>& parameters) {
  if (parameters.size() != parameters_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logreg: got ", parameters.size(), " parameters, the model has ", parameters_.size()));
  }
  parameters_ = parameters;
  return absl::OkStatus();
}

absl::Status LogRegHead::ReadOptimizerState(std::vector<float>* state) const {
  // SGD keeps no state (the accumulators stay at their initial value).
  if (optimizer_.kind == OptimizerKind::kSgd) {
    state->clear();
  } else {
    *state = accumulators_;
  }
  return absl::OkStatus();
}

absl::Status LogRegHead::WriteOptimizerState(const std::vector<float>& state) {
  if (optimizer_.kind == OptimizerKind::kSgd) {
    if (!state.empty()) return absl::InvalidArgumentError("logreg: SGD keeps no optimizer state");
    return absl::OkStatus();
  }
  if (state.size() != accumulators_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logreg: got ", state.size(), " accumulators, the model has ", accumulators_.size()));
  }
  accumulators_ = state;
  return absl::OkStatus();
}

}  // namespace bagpipe
