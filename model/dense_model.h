// The dense part of the reference DLRM (facebookresearch/dlrm, dlrm_s_pytorch.py): bottom MLP over
// the dense features, dot interaction with the pooled embeddings, top MLP, sigmoid and binary
// cross entropy.
//
//   x      = ReLU(... ReLU(dense W_0^T + b_0) ...)                 bottom MLP, ReLU after every
//                                                                  layer, last size == dim
//   V      = [x, e_0, .., e_{T-1}]                                 T + 1 vectors of size dim
//   z      = [x, <V_i, V_j> for i in 1..T, j in 0..i-1]            dim + (T + 1) T / 2 features
//   logit  = top MLP(z)                                            ReLU on hidden layers, the
//                                                                  last layer (size 1) linear
//   loss_s = max(logit, 0) - logit * label + log1p(exp(-|logit|))  BCE from the logit
//
// The embedding side lives elsewhere: the trainer passes the pooled embeddings in and takes their
// gradient back. All parameters (every layer's W [out x in] row-major then b [out], bottom layers
// first, then top layers) live in one flat buffer in the context's memory, and so do their
// gradients, so a trainer can all-reduce the gradients in place with one call.
//
// Two backends share one algorithm (dense_model.cc) and differ in their primitives: the CPU
// backend (OpenBLAS + TBB) is the reference; the CUDA backend (cuBLAS + kernels,
// dense_model_cuda.cu) is tested against it with explicit tolerances. Initial parameters are
// computed on the host from the seed, so both backends start from identical values.
//
// Determinism: with `deterministic` set, every result is bit-identical run to run (fixed
// reduction orders; OpenBLAS runs on one thread on the CPU; no atomics on CUDA).
//
// Thread-safety: a DenseModel is not thread-safe; calls must be serialised by the caller. Work is
// queued on the context's compute stream; each call returning a host value synchronises it.
#ifndef BAGPIPE_MODEL_DENSE_MODEL_H_
#define BAGPIPE_MODEL_DENSE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/optimizer.h"

namespace bagpipe {

namespace internal {
class DenseBackend;
}  // namespace internal

// Parses an MLP spec such as "13-512-256-64" into its sizes. Every size must be a positive
// integer; at least one size is required.
absl::StatusOr<std::vector<int>> ParseLayers(std::string_view text);
// The inverse of ParseLayers: "13-512-256-64".
std::string FormatLayers(const std::vector<int>& layers);

struct DenseModelConfig {
  int num_dense = 13;   // dense features per sample
  int num_tables = 26;  // pooled embedding vectors per sample
  int dim = 16;         // embedding dimension
  // Bottom MLP sizes including the input: bottom.front() == num_dense, bottom.back() == dim.
  std::vector<int> bottom = {13, 512, 256, 16};
  // Top MLP sizes after the interaction (its input size is implied): hidden sizes, then 1.
  std::vector<int> top = {512, 256, 1};
  uint64_t seed = 0;
  // SGD or Adagrad; row-wise Adagrad (meant for embedding rows) is applied as Adagrad here.
  OptimizerConfig optimizer;
  // Bit-identical results run to run (see the file comment). On the CPU this sets OpenBLAS to one
  // thread for the whole process (OpenBLAS has no per-call setting); turn it off for speed.
  bool deterministic = true;
};

// Checks a configuration; the messages name the offending field ("bottom layers: last size 32
// must equal the embedding dim 16").
absl::Status ValidateDenseModelConfig(const DenseModelConfig& config);
// Bytes one replica of the model takes with a local batch of `samples`: parameters, gradients,
// optimizer state and the host copy made at creation, and the activations of forward and
// backward. For refusing shapes that cannot fit before allocating them (a typo such as
// --bottom 13-100000000-16 asks for tens of GB). REQUIRES: ValidateDenseModelConfig passed.
double EstimateDenseModelBytes(const DenseModelConfig& config, int64_t samples);

// Features the dot interaction produces: dim + (T + 1) T / 2.
int InteractionFeatures(int num_tables, int dim);

class DenseModel {
 public:
  // Validates `config`, allocates parameters, gradients (zero) and optimizer state in `context`'s
  // memory and initialises the parameters from config.seed (DLRM's scheme:
  // W ~ Normal(0, sqrt(2 / (fan_in + fan_out))), b ~ Normal(0, sqrt(1 / fan_out))).
  // A CUDA context needs a build with the CUDA backend (FailedPrecondition otherwise).
  static absl::StatusOr<std::unique_ptr<DenseModel>> Create(std::shared_ptr<DeviceContext> context,
                                                            DenseModelConfig config);
  ~DenseModel();
  DenseModel(const DenseModel&) = delete;
  DenseModel& operator=(const DenseModel&) = delete;

  // Forward and backward over n samples. Inputs are in the context's memory:
  // dense [n x num_dense], pooled [n x num_tables x dim], labels [n] (0 or 1; any value in [0, 1]
  // works). Gradients are those of loss_scale * sum of per-sample losses: d/d(pooled) is written
  // (overwritten) into pooled_grad [n x num_tables x dim] (context memory), parameter gradients
  // are accumulated into gradients(). Returns the sum of the per-sample losses (unscaled).
  // Synchronises the compute stream. n == 0 is a no-op returning 0.
  absl::StatusOr<double> ForwardBackward(const float* dense, const float* pooled,
                                         const float* labels, int n, float loss_scale,
                                         float* pooled_grad);
  // Evaluation: forward only, no gradients. labels may be nullptr (the loss is then 0).
  // probabilities_host, when not null, receives the n predicted probabilities (host memory).
  // Returns the sum of the per-sample losses. Synchronises the compute stream.
  absl::StatusOr<double> Forward(const float* dense, const float* pooled, const float* labels,
                                 int n, float* probabilities_host);

  // The flat gradient buffer (context memory), num_parameters() floats, same layout as the
  // parameters. The trainer may all-reduce it in place between ForwardBackward and Step (after
  // synchronising the compute stream, or by ordering its collective after it).
  float* gradients() { return gradients_.data(); }
  // The flat parameter buffer (context memory). Valid for the model's lifetime.
  const float* parameters() const { return parameters_.data(); }
  size_t num_parameters() const { return num_parameters_; }

  // Applies the optimizer with learning rate `lr` using the current gradients, then zeroes them.
  absl::Status Step(float lr);
  // Zeroes the gradient buffer.
  absl::Status ZeroGradients();

  // Host copies of the flat parameter buffer (for dumps and tests).
  absl::Status ReadParameters(std::vector<float>* parameters) const;
  // REQUIRES: parameters.size() == num_parameters(). Optimizer state is left as is.
  absl::Status WriteParameters(const std::vector<float>& parameters);
  // Host copies of the optimizer state (Adagrad: one accumulator per parameter; SGD: none), for
  // checkpoints. Write REQUIRES the size Read gives.
  absl::Status ReadOptimizerState(std::vector<float>* state) const;
  absl::Status WriteOptimizerState(const std::vector<float>& state);

  const DenseModelConfig& config() const { return config_; }
  const std::shared_ptr<DeviceContext>& context() const { return context_; }
  // Offsets (in floats) of layer k's weights and bias in the flat buffer; layers are numbered
  // bottom first (0 .. bottom.size() - 2), then top.
  struct LayerShape {
    int in = 0;
    int out = 0;
    bool relu = false;
    size_t weight_offset = 0;
    size_t bias_offset = 0;
  };
  const std::vector<LayerShape>& layers() const { return layers_; }

 private:
  DenseModel(std::shared_ptr<DeviceContext> context, DenseModelConfig config);
  absl::Status EnsureCapacity(int n);
  // Runs the forward pass into the activation buffers and the loss; with want_gradient, also
  // writes the scaled logit gradient into activation_grads_.back().
  absl::Status RunForward(const float* dense, const float* pooled, const float* labels, int n,
                          float loss_scale, bool want_gradient);
  // Copies the per-sample losses (and probabilities) to the host; synchronises.
  absl::StatusOr<double> SumLosses(int n, float* probabilities_host);

  std::shared_ptr<DeviceContext> context_;
  DenseModelConfig config_;
  std::unique_ptr<internal::DenseBackend> backend_;
  std::vector<LayerShape> layers_;
  int num_bottom_ = 0;  // layers_[0 .. num_bottom_) are the bottom MLP
  int interaction_features_ = 0;
  size_t num_parameters_ = 0;

  // Context memory.
  DeviceArray<float> parameters_;
  DeviceArray<float> gradients_;
  DeviceArray<float> optimizer_state_;  // num_parameters_ floats for Adagrad, else empty

  // Per-batch buffers, sized for capacity_ samples. activations_[k] is layer k's output
  // [capacity x out]; interaction_ is the top MLP's input; the *_grads_ twins hold gradients.
  int capacity_ = 0;
  std::vector<DeviceArray<float>> activations_;
  std::vector<DeviceArray<float>> activation_grads_;
  DeviceArray<float> interaction_;
  DeviceArray<float> interaction_grad_;
  DeviceArray<float> losses_;
  DeviceArray<float> probabilities_;
  std::vector<float> host_losses_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_MODEL_DENSE_MODEL_H_
