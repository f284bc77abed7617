#include "model/dense_model.h"

#include <cblas.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/excerpt.h"
#include "core/random.h"
#include "core/status.h"
#include "model/dense_backend.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace bagpipe {
namespace internal {
namespace {

// Rows per TBB task for the element-wise loops (large enough to amortise scheduling).
constexpr int kRowGrain = 64;

// Every primitive is a kernel queued on the compute stream (DeviceContext::Launch): it runs in
// the call on a synchronous CPU context, later on the stream's executor on an asynchronous one,
// so arguments are captured by value.
class CpuDenseBackend final : public DenseBackend {
 public:
  CpuDenseBackend(std::shared_ptr<DeviceContext> context, bool deterministic)
      : context_(std::move(context)) {
    // OpenBLAS's threaded GEMM may split the reduction dimension differently with the thread
    // count; one thread fixes the summation order. (Process-wide: OpenBLAS has no per-call knob.)
    if (deterministic) openblas_set_num_threads(1);
  }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    return Queue([=] {
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                  ldc);
    });
  }

  absl::Status BiasActivation(float* y, const float* bias, int rows, int cols, bool relu) override {
    return Queue([=] {
      tbb::parallel_for(tbb::blocked_range<int>(0, rows, kRowGrain),
                        [&](const tbb::blocked_range<int>& range) {
                          for (int r = range.begin(); r < range.end(); ++r) {
                            float* row = y + static_cast<int64_t>(r) * cols;
                            for (int c = 0; c < cols; ++c) {
                              const float v = row[c] + bias[c];
                              row[c] = relu ? std::max(v, 0.0f) : v;
                            }
                          }
                        });
    });
  }

  absl::Status ReluBackward(float* dy, const float* y, int64_t count) override {
    return Queue([=] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, 4096),
                        [&](const tbb::blocked_range<int64_t>& range) {
                          for (int64_t i = range.begin(); i < range.end(); ++i) {
                            if (!(y[i] > 0.0f)) dy[i] = 0.0f;
                          }
                        });
    });
  }

  absl::Status BiasGradient(const float* dy, int rows, int cols, float* db) override {
    return Queue([=] {
      // Each column is summed over the rows in order by one task: a fixed order.
      constexpr int kColumnBlock = 64;
      tbb::parallel_for(
          tbb::blocked_range<int>(0, cols, kColumnBlock),
          [&](const tbb::blocked_range<int>& range) {
            const int begin = range.begin();
            const int width = range.end() - begin;
            float sums[kColumnBlock];
            for (int c = 0; c < width; ++c) sums[c] = db[begin + c];
            for (int r = 0; r < rows; ++r) {
              const float* row = dy + static_cast<int64_t>(r) * cols + begin;
              for (int c = 0; c < width; ++c) sums[c] += row[c];
            }
            for (int c = 0; c < width; ++c) db[begin + c] = sums[c];
          },
          tbb::simple_partitioner());
    });
  }

  absl::Status InteractionForward(const float* x, const float* pooled, int n, int num_tables,
                                  int dim, float* z) override {
    return Queue([=] {
      const int features = InteractionFeatures(num_tables, dim);
      tbb::parallel_for(tbb::blocked_range<int>(0, n, 16), [&](const tbb::blocked_range<int>& r) {
        std::vector<const float*> v(num_tables + 1);
        for (int s = r.begin(); s < r.end(); ++s) {
          v[0] = x + static_cast<int64_t>(s) * dim;
          for (int t = 0; t < num_tables; ++t) {
            v[t + 1] = pooled + (static_cast<int64_t>(s) * num_tables + t) * dim;
          }
          float* out = z + static_cast<int64_t>(s) * features;
          std::memcpy(out, v[0], sizeof(float) * dim);
          int k = dim;
          for (int i = 1; i <= num_tables; ++i) {
            for (int j = 0; j < i; ++j) {
              float dot = 0.0f;
              for (int d = 0; d < dim; ++d) dot += v[i][d] * v[j][d];
              out[k++] = dot;
            }
          }
        }
      });
    });
  }

  absl::Status InteractionBackward(const float* dz, const float* x, const float* pooled, int n,
                                   int num_tables, int dim, float* dx, float* dpooled) override {
    return Queue([=] {
      const int features = InteractionFeatures(num_tables, dim);
      tbb::parallel_for(tbb::blocked_range<int>(0, n, 16), [&](const tbb::blocked_range<int>& r) {
        std::vector<const float*> v(num_tables + 1);
        std::vector<float*> dv(num_tables + 1);
        for (int s = r.begin(); s < r.end(); ++s) {
          v[0] = x + static_cast<int64_t>(s) * dim;
          dv[0] = dx + static_cast<int64_t>(s) * dim;
          for (int t = 0; t < num_tables; ++t) {
            const int64_t offset = (static_cast<int64_t>(s) * num_tables + t) * dim;
            v[t + 1] = pooled + offset;
            dv[t + 1] = dpooled + offset;
          }
          const float* g = dz + static_cast<int64_t>(s) * features;
          std::memcpy(dv[0], g, sizeof(float) * dim);
          for (int t = 1; t <= num_tables; ++t) std::fill(dv[t], dv[t] + dim, 0.0f);
          // Pair (i, j), j < i, contributes g * V_j to dV_i and g * V_i to dV_j, in pair order.
          int k = dim;
          for (int i = 1; i <= num_tables; ++i) {
            for (int j = 0; j < i; ++j) {
              const float gk = g[k++];
              for (int d = 0; d < dim; ++d) {
                dv[i][d] += gk * v[j][d];
                dv[j][d] += gk * v[i][d];
              }
            }
          }
        }
      });
    });
  }

  absl::Status Loss(const float* logits, const float* labels, int n, float scale, float* losses,
                    float* probabilities, float* dlogits) override {
    return Queue([=] {
      for (int s = 0; s < n; ++s) {
        const float z = logits[s];
        const float e = std::exp(-std::fabs(z));
        const float p = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        probabilities[s] = p;
        if (labels == nullptr) {
          losses[s] = 0.0f;
          continue;
        }
        const float y = labels[s];
        losses[s] = std::max(z, 0.0f) - z * y + std::log1p(e);
        if (dlogits != nullptr) dlogits[s] = (p - y) * scale;
      }
    });
  }

  absl::Status OptimizerStep(OptimizerKind kind, float lr, float eps, int64_t count, float* params,
                             float* grads, float* state) override {
    return Queue([=] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, 1 << 14),
                        [&](const tbb::blocked_range<int64_t>& r) {
                          if (kind == OptimizerKind::kSgd) {
                            for (int64_t i = r.begin(); i < r.end(); ++i) {
                              params[i] -= lr * grads[i];
                              grads[i] = 0.0f;
                            }
                          } else {
                            for (int64_t i = r.begin(); i < r.end(); ++i) {
                              const float g = grads[i];
                              state[i] += g * g;
                              params[i] -= lr * g / (std::sqrt(state[i]) + eps);
                              grads[i] = 0.0f;
                            }
                          }
                        });
    });
  }

 private:
  absl::Status Queue(std::function<void()> kernel) {
    return context_->Launch(Stream::kCompute, std::move(kernel));
  }

  const std::shared_ptr<DeviceContext> context_;
};

}  // namespace

std::unique_ptr<DenseBackend> CreateCpuDenseBackend(std::shared_ptr<DeviceContext> context,
                                                    bool deterministic) {
  return std::make_unique<CpuDenseBackend>(std::move(context), deterministic);
}

}  // namespace internal

namespace {

// A standard normal draw (Box-Muller, one output per pair of uniforms).
double NextNormal(CounterRng& rng) {
  const double u1 = 1.0 - rng.NextDouble();  // (0, 1]
  const double u2 = rng.NextDouble();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Domain tags for the initialisation streams.
constexpr uint64_t kWeightStream = 0x5745;
constexpr uint64_t kBiasStream = 0x4249;

}  // namespace

absl::StatusOr<std::vector<int>> ParseLayers(std::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("empty MLP layer spec");
  std::vector<int> layers;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find('-', begin), text.size());
    const std::string_view part = text.substr(begin, end - begin);
    int value = 0;
    const auto [parsed_end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || parsed_end != part.data() + part.size() ||
        value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MLP layer spec \"", Excerpt(absl::string_view(text.data(), text.size())), "\": \"",
          Excerpt(absl::string_view(part.data(), part.size())), "\" is not a positive integer"));
    }
    layers.push_back(value);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return layers;
}

std::string FormatLayers(const std::vector<int>& layers) { return absl::StrJoin(layers, "-"); }

int InteractionFeatures(int num_tables, int dim) { return dim + (num_tables + 1) * num_tables / 2; }

absl::Status ValidateDenseModelConfig(const DenseModelConfig& c) {
  if (c.num_dense <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_dense must be positive, got ", c.num_dense));
  }
  if (c.num_tables < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tables must be non-negative, got ", c.num_tables));
  }
  if (c.dim <= 0)
    return absl::InvalidArgumentError(absl::StrCat("dim must be positive, got ", c.dim));
  if (c.bottom.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("bottom layers \"", FormatLayers(c.bottom),
                     "\": need the input size and at least one layer"));
  }
  if (c.top.empty())
    return absl::InvalidArgumentError("top layers: need at least the output layer");
  for (int size : c.bottom) {
    if (size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bottom layers \"", FormatLayers(c.bottom), "\": sizes must be positive"));
    }
  }
  for (int size : c.top) {
    if (size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("top layers \"", FormatLayers(c.top), "\": sizes must be positive"));
    }
  }
  if (c.bottom.front() != c.num_dense) {
    return absl::InvalidArgumentError(absl::StrCat("bottom layers: first size ", c.bottom.front(),
                                                   " must equal the number of dense features ",
                                                   c.num_dense));
  }
  if (c.bottom.back() != c.dim) {
    return absl::InvalidArgumentError(absl::StrCat("bottom layers: last size ", c.bottom.back(),
                                                   " must equal the embedding dim ", c.dim));
  }
  if (c.top.back() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top layers: last size ", c.top.back(), " must be 1 (the logit)"));
  }
  if (c.optimizer.learning_rate < 0 || !std::isfinite(c.optimizer.learning_rate)) {
    return absl::InvalidArgumentError("optimizer learning rate must be finite and non-negative");
  }
  return absl::OkStatus();
}

double EstimateDenseModelBytes(const DenseModelConfig& c, int64_t samples) {
  double parameters = 0;
  double widths = 0;  // activations per sample, every layer's input and output
  auto layer = [&](double in, double out) {
    parameters += in * out + out;
    widths += in + out;
  };
  for (size_t i = 0; i + 1 < c.bottom.size(); ++i) layer(c.bottom[i], c.bottom[i + 1]);
  double in = InteractionFeatures(c.num_tables, c.dim);
  for (int out : c.top) {
    layer(in, out);
    in = out;
  }
  const double copies = c.optimizer.kind != OptimizerKind::kSgd ? 4 : 3;
  return sizeof(float) * (copies * parameters + 2.0 * static_cast<double>(samples) * widths);
}

DenseModel::DenseModel(std::shared_ptr<DeviceContext> context, DenseModelConfig config)
    : context_(std::move(context)), config_(std::move(config)) {}

DenseModel::~DenseModel() = default;

absl::StatusOr<std::unique_ptr<DenseModel>> DenseModel::Create(
    std::shared_ptr<DeviceContext> context, DenseModelConfig config) {
  if (context == nullptr) return absl::InvalidArgumentError("DenseModel: null device context");
  RETURN_IF_ERROR(ValidateDenseModelConfig(config));
  std::unique_ptr<DenseModel> model(new DenseModel(context, std::move(config)));
  const DenseModelConfig& c = model->config_;

  if (context->is_cuda()) {
#ifdef BAGPIPE_WITH_CUDA
    RETURN_IF_ERROR(context->MakeCurrent());
    ASSIGN_OR_RETURN(model->backend_, internal::CreateCudaDenseBackend(context, c.deterministic));
#else
    return absl::FailedPreconditionError(
        "DenseModel: a CUDA context was given but this build has no CUDA backend");
#endif
  } else {
    model->backend_ = internal::CreateCpuDenseBackend(context, c.deterministic);
  }

  // Layer shapes and the flat layout: W [out x in] then b [out], layer after layer.
  size_t offset = 0;
  auto add_layer = [&](int in, int out, bool relu) {
    LayerShape layer;
    layer.in = in;
    layer.out = out;
    layer.relu = relu;
    layer.weight_offset = offset;
    offset += static_cast<size_t>(in) * out;
    layer.bias_offset = offset;
    offset += out;
    model->layers_.push_back(layer);
  };
  for (size_t i = 0; i + 1 < c.bottom.size(); ++i) add_layer(c.bottom[i], c.bottom[i + 1], true);
  model->num_bottom_ = static_cast<int>(model->layers_.size());
  model->interaction_features_ = InteractionFeatures(c.num_tables, c.dim);
  int in = model->interaction_features_;
  for (size_t i = 0; i < c.top.size(); ++i) {
    add_layer(in, c.top[i], i + 1 < c.top.size());
    in = c.top[i];
  }
  model->num_parameters_ = offset;

  ASSIGN_OR_RETURN(model->parameters_, DeviceArray<float>::Create(context, offset));
  ASSIGN_OR_RETURN(model->gradients_, DeviceArray<float>::Create(context, offset));
  RETURN_IF_ERROR(context->Zero(model->gradients_.data(), model->gradients_.bytes()));
  const bool adagrad = c.optimizer.kind != OptimizerKind::kSgd;
  if (adagrad) {
    ASSIGN_OR_RETURN(model->optimizer_state_, DeviceArray<float>::Create(context, offset));
    std::vector<float> state(offset, c.optimizer.initial_accumulator);
    RETURN_IF_ERROR(
        context->CopyToDevice(model->optimizer_state_.data(), state.data(), state.size() * 4));
    RETURN_IF_ERROR(context->Synchronize());
  }

  // DLRM's initialisation, on the host from counter-based streams (one per layer and part).
  std::vector<float> initial(offset);
  for (size_t k = 0; k < model->layers_.size(); ++k) {
    const LayerShape& layer = model->layers_[k];
    const double w_std = std::sqrt(2.0 / (layer.in + layer.out));
    const double b_std = std::sqrt(1.0 / layer.out);
    CounterRng w_rng(HashKey(c.seed, kWeightStream, k));
    for (size_t i = 0; i < static_cast<size_t>(layer.in) * layer.out; ++i) {
      initial[layer.weight_offset + i] = static_cast<float>(w_std * NextNormal(w_rng));
    }
    CounterRng b_rng(HashKey(c.seed, kBiasStream, k));
    for (int i = 0; i < layer.out; ++i) {
      initial[layer.bias_offset + i] = static_cast<float>(b_std * NextNormal(b_rng));
    }
  }
  RETURN_IF_ERROR(model->WriteParameters(initial));
  return model;
}

absl::Status DenseModel::EnsureCapacity(int n) {
  if (n <= capacity_) return absl::OkStatus();
  const int capacity = std::max(n, capacity_ * 2);
  // Release first so that growth never holds both generations.
  activations_.clear();
  activation_grads_.clear();
  for (const LayerShape& layer : layers_) {
    const size_t size = static_cast<size_t>(capacity) * layer.out;
    ASSIGN_OR_RETURN(auto activation, DeviceArray<float>::Create(context_, size));
    ASSIGN_OR_RETURN(auto grad, DeviceArray<float>::Create(context_, size));
    activations_.push_back(std::move(activation));
    activation_grads_.push_back(std::move(grad));
  }
  const size_t z = static_cast<size_t>(capacity) * interaction_features_;
  interaction_.Reset();
  interaction_grad_.Reset();
  ASSIGN_OR_RETURN(interaction_, DeviceArray<float>::Create(context_, z));
  ASSIGN_OR_RETURN(interaction_grad_, DeviceArray<float>::Create(context_, z));
  losses_.Reset();
  probabilities_.Reset();
  ASSIGN_OR_RETURN(losses_, DeviceArray<float>::Create(context_, capacity));
  ASSIGN_OR_RETURN(probabilities_, DeviceArray<float>::Create(context_, capacity));
  host_losses_.resize(capacity);
  capacity_ = capacity;
  return absl::OkStatus();
}

absl::Status DenseModel::RunForward(const float* dense, const float* pooled, const float* labels,
                                    int n, float loss_scale, bool want_gradient) {
  RETURN_IF_ERROR(context_->MakeCurrent());
  RETURN_IF_ERROR(EnsureCapacity(n));
  const float* params = parameters_.data();
  const float* input = dense;
  for (size_t k = 0; k < layers_.size(); ++k) {
    const LayerShape& layer = layers_[k];
    if (static_cast<int>(k) == num_bottom_) {
      RETURN_IF_ERROR(backend_->InteractionForward(input, pooled, n, config_.num_tables,
                                                   config_.dim, interaction_.data()));
      input = interaction_.data();
    }
    float* out = activations_[k].data();
    RETURN_IF_ERROR(backend_->Gemm(false, true, n, layer.out, layer.in, 1.0f, input, layer.in,
                                   params + layer.weight_offset, layer.in, 0.0f, out, layer.out));
    RETURN_IF_ERROR(
        backend_->BiasActivation(out, params + layer.bias_offset, n, layer.out, layer.relu));
    input = out;
  }
  return backend_->Loss(input, labels, n, loss_scale, losses_.data(), probabilities_.data(),
                        want_gradient ? activation_grads_.back().data() : nullptr);
}

absl::StatusOr<double> DenseModel::SumLosses(int n, float* probabilities_host) {
  RETURN_IF_ERROR(context_->CopyToHost(host_losses_.data(), losses_.data(), sizeof(float) * n));
  if (probabilities_host != nullptr) {
    RETURN_IF_ERROR(
        context_->CopyToHost(probabilities_host, probabilities_.data(), sizeof(float) * n));
  }
  RETURN_IF_ERROR(context_->Synchronize());
  double sum = 0;
  for (int s = 0; s < n; ++s) sum += host_losses_[s];
  return sum;
}

absl::StatusOr<double> DenseModel::ForwardBackward(const float* dense, const float* pooled,
                                                   const float* labels, int n, float loss_scale,
                                                   float* pooled_grad) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ForwardBackward: n = ", n));
  if (n == 0) return 0.0;
  if (dense == nullptr || labels == nullptr || pooled_grad == nullptr ||
      (pooled == nullptr && config_.num_tables > 0)) {
    return absl::InvalidArgumentError("ForwardBackward: null input or output buffer");
  }
  RETURN_IF_ERROR(RunForward(dense, pooled, labels, n, loss_scale, /*want_gradient=*/true));

  float* grads = gradients_.data();
  const float* params = parameters_.data();
  for (int k = static_cast<int>(layers_.size()) - 1; k >= 0; --k) {
    const LayerShape& layer = layers_[k];
    float* g = activation_grads_[k].data();
    if (layer.relu) {
      RETURN_IF_ERROR(
          backend_->ReluBackward(g, activations_[k].data(), static_cast<int64_t>(n) * layer.out));
    }
    const float* input;
    float* input_grad;
    if (k == num_bottom_) {
      input = interaction_.data();
      input_grad = interaction_grad_.data();
    } else if (k == 0) {
      input = dense;
      input_grad = nullptr;
    } else {
      input = activations_[k - 1].data();
      input_grad = activation_grads_[k - 1].data();
    }
    // dW += g^T input; db += column sums of g; d(input) = g W.
    RETURN_IF_ERROR(backend_->Gemm(true, false, layer.out, layer.in, n, 1.0f, g, layer.out, input,
                                   layer.in, 1.0f, grads + layer.weight_offset, layer.in));
    RETURN_IF_ERROR(backend_->BiasGradient(g, n, layer.out, grads + layer.bias_offset));
    if (input_grad != nullptr) {
      RETURN_IF_ERROR(backend_->Gemm(false, false, n, layer.in, layer.out, 1.0f, g, layer.out,
                                     params + layer.weight_offset, layer.in, 0.0f, input_grad,
                                     layer.in));
    }
    if (k == num_bottom_) {
      RETURN_IF_ERROR(backend_->InteractionBackward(
          interaction_grad_.data(), activations_[num_bottom_ - 1].data(), pooled, n,
          config_.num_tables, config_.dim, activation_grads_[num_bottom_ - 1].data(), pooled_grad));
    }
  }
  return SumLosses(n, nullptr);
}

absl::StatusOr<double> DenseModel::Forward(const float* dense, const float* pooled,
                                           const float* labels, int n, float* probabilities_host) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Forward: n = ", n));
  if (n == 0) return 0.0;
  if (dense == nullptr || (pooled == nullptr && config_.num_tables > 0)) {
    return absl::InvalidArgumentError("Forward: null input buffer");
  }
  RETURN_IF_ERROR(RunForward(dense, pooled, labels, n, 1.0f, /*want_gradient=*/false));
  return SumLosses(n, probabilities_host);
}

absl::Status DenseModel::Step(float lr) {
  RETURN_IF_ERROR(context_->MakeCurrent());
  // Row-wise Adagrad is meant for embedding rows; the dense layers use element-wise Adagrad.
  const OptimizerKind kind =
      config_.optimizer.kind == OptimizerKind::kSgd ? OptimizerKind::kSgd : OptimizerKind::kAdagrad;
  return backend_->OptimizerStep(kind, lr, config_.optimizer.eps,
                                 static_cast<int64_t>(num_parameters_), parameters_.data(),
                                 gradients_.data(), optimizer_state_.data());
}

absl::Status DenseModel::ZeroGradients() {
  RETURN_IF_ERROR(context_->MakeCurrent());
  return context_->Zero(gradients_.data(), gradients_.bytes());
}

absl::Status DenseModel::ReadParameters(std::vector<float>* parameters) const {
  RETURN_IF_ERROR(context_->MakeCurrent());
  parameters->resize(num_parameters_);
  RETURN_IF_ERROR(
      context_->CopyToHost(parameters->data(), parameters_.data(), parameters_.bytes()));
  return context_->Synchronize();
}

absl::Status DenseModel::WriteParameters(const std::vector<float>& parameters) {
  if (parameters.size() != num_parameters_) {
    return absl::InvalidArgumentError(absl::StrCat("WriteParameters: got ", parameters.size(),
                                                   " values, the model has ", num_parameters_));
  }
  RETURN_IF_ERROR(context_->MakeCurrent());
  RETURN_IF_ERROR(
      context_->CopyToDevice(parameters_.data(), parameters.data(), parameters_.bytes()));
  return context_->Synchronize();
}

absl::Status DenseModel::ReadOptimizerState(std::vector<float>* state) const {
  RETURN_IF_ERROR(context_->MakeCurrent());
  state->resize(optimizer_state_.size());
  if (state->empty()) return absl::OkStatus();
  RETURN_IF_ERROR(
      context_->CopyToHost(state->data(), optimizer_state_.data(), optimizer_state_.bytes()));
  return context_->Synchronize();
}

absl::Status DenseModel::WriteOptimizerState(const std::vector<float>& state) {
  if (state.size() != optimizer_state_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteOptimizerState: got ", state.size(),
                                                   " values, the model has ",
                                                   optimizer_state_.size()));
  }
  if (state.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(context_->MakeCurrent());
  RETURN_IF_ERROR(
      context_->CopyToDevice(optimizer_state_.data(), state.data(), optimizer_state_.bytes()));
  return context_->Synchronize();
}

}  // namespace bagpipe
