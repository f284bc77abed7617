// An embedding-only model: logistic regression over the pooled embeddings,
// logit = b + sum over tables t and columns c of w[t * dim + c] * pooled[t, c]; the dense
// features are ignored. Its dense part is tiny, so a training loop with it measures the
// runtime (fetches, cache, exchanges, sparse optimizer) rather than the MLPs: it is
// `bagpipe train --model logreg` and the embedding-only model of the cache-mode benchmarks.
//
// Same calling contract as DenseModel (model/dense_model.h). CPU contexts only: the few
// multiply-adds per sample run on the host, after synchronising the compute stream (on a context
// with asynchronous streams the pooled embeddings are ready only then, and the previous
// iteration's reads of pooled_grad are done): that is the iteration's one host synchronisation.
// Not thread-safe.
#ifndef BAGPIPE_MODEL_LOGREG_HEAD_H_
#define BAGPIPE_MODEL_LOGREG_HEAD_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/optimizer.h"

namespace bagpipe {

class LogRegHead {
 public:
  // Weights uniform in [-0.05, 0.05) from `seed`, bias 0. Dense optimizer: SGD, or Adagrad for
  // the Adagrad kinds (accumulator from optimizer.initial_accumulator).
  static absl::StatusOr<std::unique_ptr<LogRegHead>> Create(std::shared_ptr<DeviceContext> context,
                                                            int num_tables, int dim, uint64_t seed,
                                                            OptimizerConfig optimizer);

  // As DenseModel::ForwardBackward: returns the sum of the per-sample losses, writes
  // loss_scale * d(sum)/d(pooled) into pooled_grad, accumulates parameter gradients.
  absl::StatusOr<double> ForwardBackward(const float* dense, const float* pooled,
                                         const float* labels, int n, float loss_scale,
                                         float* pooled_grad);
  // As DenseModel::Forward.
  absl::StatusOr<double> Forward(const float* dense, const float* pooled, const float* labels,
                                 int n, float* probabilities_host);
  float* gradients() { return gradients_.data(); }
  size_t num_parameters() const { return parameters_.size(); }
  absl::Status Step(float lr);
  absl::Status ReadParameters(std::vector<float>* parameters) const;
  // As DenseModel's (checkpoints).
  absl::Status WriteParameters(const std::vector<float>& parameters);
  absl::Status ReadOptimizerState(std::vector<float>* state) const;
  absl::Status WriteOptimizerState(const std::vector<float>& state);

 private:
  LogRegHead(std::shared_ptr<DeviceContext> context, int width, OptimizerConfig optimizer)
      : context_(std::move(context)), width_(width), optimizer_(optimizer) {}
  double Logit(const float* pooled_row) const;

  const std::shared_ptr<DeviceContext> context_;
  const int width_;  // num_tables * dim
  const OptimizerConfig optimizer_;
  std::vector<float> parameters_;  // w[width], b
  std::vector<float> gradients_;
  std::vector<float> accumulators_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_LOGREG_HEAD_H_
