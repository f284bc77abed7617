// Internal: the primitives behind DenseModel (faiss's public-method / impl split).
//
// DenseModel (dense_model.cc) runs one algorithm for every backend and calls these primitives
// with pointers in its context's memory; all matrices are row-major. The CPU backend
// (dense_model.cc, OpenBLAS + TBB) is the reference; the CUDA backend (dense_model_cuda.cu,
// cuBLAS + kernels) computes the same formulas. Reductions run in a fixed order in both, so each
// backend is bit-identical run to run; the two agree up to float rounding (GEMM blocking and
// exp/log differ). Not part of the public API.
#ifndef BAGPIPE_MODEL_DENSE_BACKEND_H_
#define BAGPIPE_MODEL_DENSE_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/optimizer.h"

namespace bagpipe::internal {

class DenseBackend {
 public:
  virtual ~DenseBackend() = default;

  // C[m x n] = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or X^T.
  // A is [m x k] (or [k x m] when trans_a), B is [k x n] (or [n x k] when trans_b).
  virtual absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc) = 0;
  // y[r][c] += bias[c], then ReLU when `relu`. y is [rows x cols].
  virtual absl::Status BiasActivation(float* y, const float* bias, int rows, int cols,
                                      bool relu) = 0;
  // dy[i] = y[i] > 0 ? dy[i] : 0 (y is the ReLU output).
  virtual absl::Status ReluBackward(float* dy, const float* y, int64_t count) = 0;
  // db[c] += sum over r of dy[r][c], in a fixed order (CPU: r = 0, 1, ..).
  virtual absl::Status BiasGradient(const float* dy, int rows, int cols, float* db) = 0;
  // z [n x (dim + P)] = [x, <V_i, V_j> for i in 1..T, j < i], V = [x, pooled_0 .. pooled_{T-1}],
  // P = (T + 1) T / 2. x [n x dim], pooled [n x T x dim].
  virtual absl::Status InteractionForward(const float* x, const float* pooled, int n,
                                          int num_tables, int dim, float* z) = 0;
  // The gradient of InteractionForward: dx [n x dim] and dpooled [n x T x dim] are overwritten.
  virtual absl::Status InteractionBackward(const float* dz, const float* x, const float* pooled,
                                           int n, int num_tables, int dim, float* dx,
                                           float* dpooled) = 0;
  // Per sample s: probabilities[s] = sigmoid(logit), losses[s] = BCE (0 when labels is null),
  // and, when dlogits is not null, dlogits[s] = (p - label) * scale. REQUIRES labels when
  // dlogits is set.
  virtual absl::Status Loss(const float* logits, const float* labels, int n, float scale,
                            float* losses, float* probabilities, float* dlogits) = 0;
  // Applies the optimizer element-wise to count parameters and zeroes grads.
  // SGD: w -= lr * g. Adagrad: s += g * g; w -= lr * g / (sqrt(s) + eps).
  virtual absl::Status OptimizerStep(OptimizerKind kind, float lr, float eps, int64_t count,
                                     float* params, float* grads, float* state) = 0;
};

// REQUIRES: context is a CPU context. deterministic: OpenBLAS runs on one thread.
std::unique_ptr<DenseBackend> CreateCpuDenseBackend(std::shared_ptr<DeviceContext> context,
                                                    bool deterministic);
// Defined in dense_model_cuda.cu (BAGPIPE_WITH_CUDA builds only).
absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCudaDenseBackend(
    std::shared_ptr<DeviceContext> context, bool deterministic);

}  // namespace bagpipe::internal

#endif  // BAGPIPE_MODEL_DENSE_BACKEND_H_
