// The CUDA backend of DenseModel: cuBLAS GEMMs and small kernels on the compute stream.
//
// Every reduction has a fixed order (one thread owns each output of the interaction; bias
// gradients are a cuBLAS GEMV; no atomics anywhere), and cuBLAS's atomics are disallowed in
// deterministic mode, so results are bit-identical run to run on one GPU model. The CPU backend is
// the reference; the two agree up to float rounding (GEMM blocking, FMA contraction, exp/log1p).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "core/cuda_checks.h"
#include "core/status.h"
#include "model/dense_backend.h"
#include "model/dense_model.h"

namespace bagpipe::internal {
namespace {

constexpr int kThreads = 256;

__global__ void BiasActivationKernel(float* y, const float* bias, int64_t count, int cols,
                                     bool relu) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = y[i] + bias[i % cols];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void ReluBackwardKernel(float* dy, const float* y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!(y[i] > 0.0f)) dy[i] = 0.0f;
  }
}

__global__ void FillKernel(float* data, int64_t count, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = value;
  }
}

// Pair k of the strictly lower triangle, ordered (1,0), (2,0), (2,1), (3,0), ...: i(i-1)/2 <= k.
__device__ inline void PairOf(int k, int* i, int* j) {
  int row = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * k)) * 0.5f);
  while (row * (row - 1) / 2 > k) --row;
  while ((row + 1) * row / 2 <= k) ++row;
  *i = row;
  *j = k - row * (row - 1) / 2;
}

// Shared-memory row stride of the interaction's vectors: odd, so that the threads of a warp
// reading component d of different vectors hit different banks (a stride of dim = 48 or 64 would
// put every other vector, or all of them, on one bank).
__host__ __device__ inline int PaddedStride(int dim) { return dim % 2 == 0 ? dim + 1 : dim; }

// Stages V = [x, pooled_0 .. pooled_{T-1}] of sample s into shared memory, row stride `ld`.
__device__ inline void LoadVectors(const float* x, const float* pooled, int64_t s, int num_tables,
                                   int dim, int ld, float* v) {
  const int vectors = num_tables + 1;
  for (int e = threadIdx.x; e < vectors * dim; e += blockDim.x) {
    const int w = e / dim;
    const int d = e - w * dim;
    v[w * ld + d] = w == 0 ? x[s * dim + d] : pooled[(s * num_tables) * dim + (e - dim)];
  }
}

// One block per sample; V staged in shared memory.
__global__ void InteractionForwardKernel(const float* x, const float* pooled, int num_tables,
                                         int dim, float* z) {
  extern __shared__ float v[];  // (num_tables + 1) rows of stride PaddedStride(dim)
  const int64_t s = blockIdx.x;
  const int ld = PaddedStride(dim);
  const int features = dim + (num_tables + 1) * num_tables / 2;
  LoadVectors(x, pooled, s, num_tables, dim, ld, v);
  __syncthreads();
  float* out = z + s * features;
  for (int e = threadIdx.x; e < dim; e += blockDim.x) out[e] = v[e];
  const int pairs = features - dim;
  for (int k = threadIdx.x; k < pairs; k += blockDim.x) {
    int i, j;
    PairOf(k, &i, &j);
    const float* a = v + i * ld;
    const float* b = v + j * ld;
    float dot = 0.0f;
    for (int d = 0; d < dim; ++d) dot += a[d] * b[d];
    out[dim + k] = dot;
  }
}

// One block per sample; each thread owns outputs (vector w, component d) and accumulates the
// pairs that involve w in increasing pair order, as the CPU backend does.
__global__ void InteractionBackwardKernel(const float* dz, const float* x, const float* pooled,
                                          int num_tables, int dim, float* dx, float* dpooled) {
  extern __shared__ float v[];  // (num_tables + 1) rows of stride ld, then the pair gradients
  const int64_t s = blockIdx.x;
  const int ld = PaddedStride(dim);
  const int features = dim + (num_tables + 1) * num_tables / 2;
  const int vectors = num_tables + 1;
  const int pairs = features - dim;
  float* g = v + vectors * ld;
  LoadVectors(x, pooled, s, num_tables, dim, ld, v);
  const float* dz_row = dz + s * features;
  for (int k = threadIdx.x; k < pairs; k += blockDim.x) g[k] = dz_row[dim + k];
  __syncthreads();
  for (int e = threadIdx.x; e < vectors * dim; e += blockDim.x) {
    const int w = e / dim;
    const int d = e - w * dim;
    float acc = w == 0 ? dz_row[d] : 0.0f;
    // Pairs (w, j), j < w: k = w(w-1)/2 + j.
    const int first = w * (w - 1) / 2;
    for (int j = 0; j < w; ++j) acc += g[first + j] * v[j * ld + d];
    // Pairs (i, w), i > w: k = i(i-1)/2 + w.
    for (int i = w + 1; i < vectors; ++i) acc += g[i * (i - 1) / 2 + w] * v[i * ld + d];
    if (w == 0) {
      dx[s * dim + d] = acc;
    } else {
      dpooled[(s * num_tables) * dim + (e - dim)] = acc;
    }
  }
}

__global__ void LossKernel(const float* logits, const float* labels, int n, float scale,
                           float* losses, float* probabilities, float* dlogits) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n) return;
  const float z = logits[s];
  const float e = expf(-fabsf(z));
  const float p = z >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  probabilities[s] = p;
  if (labels == nullptr) {
    losses[s] = 0.0f;
    return;
  }
  const float y = labels[s];
  losses[s] = fmaxf(z, 0.0f) - z * y + log1pf(e);
  if (dlogits != nullptr) dlogits[s] = (p - y) * scale;
}

__global__ void SgdKernel(float lr, int64_t count, float* params, float* grads) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    params[i] -= lr * grads[i];
    grads[i] = 0.0f;
  }
}

__global__ void AdagradKernel(float lr, float eps, int64_t count, float* params, float* grads,
                              float* state) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grads[i];
    const float s = state[i] + g * g;
    state[i] = s;
    params[i] -= lr * g / (sqrtf(s) + eps);
    grads[i] = 0.0f;
  }
}

// Size of the workspace given to cuBLAS up front (NVIDIA's recommendation for Hopper), so that
// no GEMM allocates device memory in the steady state.
constexpr size_t kCublasWorkspaceBytes = 32u << 20;

class CudaDenseBackend final : public DenseBackend {
 public:
  // Takes ownership of `cublas` (a handle of its own: the context's shared handle keeps its
  // state) and of `workspace`.
  CudaDenseBackend(std::shared_ptr<DeviceContext> context, int sm_count, int max_shared_optin,
                   cublasHandle_t cublas, DeviceArray<char> workspace)
      : context_(std::move(context)),
        stream_(static_cast<cudaStream_t>(context_->stream(Stream::kCompute))),
        cublas_(cublas),
        workspace_(std::move(workspace)),
        sm_count_(sm_count),
        max_shared_optin_(max_shared_optin) {}
  ~CudaDenseBackend() override {
    cudaSetDevice(context_->device_index());
    cublasDestroy(cublas_);
  }
  void* workspace() { return workspace_.data(); }

  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
                                       a, lda, &beta, c, ldc));
    return absl::OkStatus();
  }

  absl::Status BiasActivation(float* y, const float* bias, int rows, int cols, bool relu) override {
    const int64_t count = static_cast<int64_t>(rows) * cols;
    BiasActivationKernel<<<Blocks(count), kThreads, 0, stream_>>>(y, bias, count, cols, relu);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status ReluBackward(float* dy, const float* y, int64_t count) override {
    ReluBackwardKernel<<<Blocks(count), kThreads, 0, stream_>>>(dy, y, count);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status BiasGradient(const float* dy, int rows, int cols, float* db) override {
    // db += dy^T 1 as a GEMV (dy row-major [rows x cols] is column-major [cols x rows]): cuBLAS
    // reduces in a fixed order without atomics when they are disallowed.
    if (static_cast<int64_t>(ones_.size()) < rows) {
      ASSIGN_OR_RETURN(ones_, DeviceArray<float>::Create(context_, rows));
      FillKernel<<<Blocks(rows), kThreads, 0, stream_>>>(ones_.data(), rows, 1.0f);
      CUDA_RETURN_IF_LAUNCH_ERROR();
    }
    const float one = 1.0f;
    CUBLAS_RETURN_IF_ERROR(cublasSgemv(cublas_, CUBLAS_OP_N, cols, rows, &one, dy, cols,
                                       ones_.data(), 1, &one, db, 1));
    return absl::OkStatus();
  }

  absl::Status InteractionForward(const float* x, const float* pooled, int n, int num_tables,
                                  int dim, float* z) override {
    const size_t shared = sizeof(float) * static_cast<size_t>(num_tables + 1) * PaddedStride(dim);
    RETURN_IF_ERROR(AllowShared(reinterpret_cast<const void*>(&InteractionForwardKernel), shared,
                                &forward_shared_limit_));
    InteractionForwardKernel<<<n, kThreads, shared, stream_>>>(x, pooled, num_tables, dim, z);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status InteractionBackward(const float* dz, const float* x, const float* pooled, int n,
                                   int num_tables, int dim, float* dx, float* dpooled) override {
    const size_t pairs = static_cast<size_t>(num_tables + 1) * num_tables / 2;
    const size_t shared =
        sizeof(float) * (static_cast<size_t>(num_tables + 1) * PaddedStride(dim) + pairs);
    RETURN_IF_ERROR(AllowShared(reinterpret_cast<const void*>(&InteractionBackwardKernel), shared,
                                &backward_shared_limit_));
    InteractionBackwardKernel<<<n, kThreads, shared, stream_>>>(dz, x, pooled, num_tables, dim, dx,
                                                                dpooled);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status Loss(const float* logits, const float* labels, int n, float scale, float* losses,
                    float* probabilities, float* dlogits) override {
    LossKernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(
        logits, labels, n, scale, losses, probabilities, dlogits);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

  absl::Status OptimizerStep(OptimizerKind kind, float lr, float eps, int64_t count, float* params,
                             float* grads, float* state) override {
    if (kind == OptimizerKind::kSgd) {
      SgdKernel<<<Blocks(count), kThreads, 0, stream_>>>(lr, count, params, grads);
    } else {
      AdagradKernel<<<Blocks(count), kThreads, 0, stream_>>>(lr, eps, count, params, grads, state);
    }
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }

 private:
  int Blocks(int64_t count) const {
    const int64_t needed = (count + kThreads - 1) / kThreads;
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, sm_count_ * 8LL)));
  }

  // Lets `kernel` use `bytes` of dynamic shared memory per block: up to 48 KiB by default;
  // beyond that the kernel must opt in (cudaFuncSetAttribute), up to the device's opt-in limit.
  // `*allowed` remembers what the kernel was opted in to.
  absl::Status AllowShared(const void* kernel, size_t bytes, size_t* allowed) {
    constexpr size_t kDefaultLimit = 48 * 1024;
    if (bytes <= kDefaultLimit || bytes <= *allowed) return absl::OkStatus();
    if (bytes > static_cast<size_t>(max_shared_optin_)) {
      return absl::UnimplementedError(absl::StrCat(
          "DenseModel CUDA: the interaction of this shape needs ", bytes,
          " bytes of shared memory per sample, more than this GPU's ", max_shared_optin_));
    }
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
    *allowed = bytes;
    return absl::OkStatus();
  }

  std::shared_ptr<DeviceContext> context_;
  // rows ones for the bias-gradient GEMV (grown on demand; freeing waits for no stream work, as
  // DeviceContext::Free synchronises the device).
  DeviceArray<float> ones_;
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  DeviceArray<char> workspace_;
  int sm_count_;
  int max_shared_optin_;
  size_t forward_shared_limit_ = 0;
  size_t backward_shared_limit_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DenseBackend>> CreateCudaDenseBackend(
    std::shared_ptr<DeviceContext> context, bool deterministic) {
  if (context == nullptr || !context->is_cuda() || context->cublas_handle() == nullptr) {
    return absl::InvalidArgumentError("CreateCudaDenseBackend: needs a CUDA context with cuBLAS");
  }
  RETURN_IF_ERROR(context->MakeCurrent());
  int sm_count = 0;
  CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, context->device_index()));
  int max_shared_optin = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &max_shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, context->device_index()));
  ASSIGN_OR_RETURN(auto workspace, DeviceArray<char>::Create(context, kCublasWorkspaceBytes));
  // A handle of our own: the modes below would otherwise change the context's shared handle
  // under every other user of it.
  cublasHandle_t handle = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  auto backend = std::unique_ptr<DenseBackend>(
      new CudaDenseBackend(context, sm_count, max_shared_optin, handle, std::move(workspace)));
  auto* cuda_backend = static_cast<CudaDenseBackend*>(backend.get());
  CUBLAS_RETURN_IF_ERROR(
      cublasSetStream(handle, static_cast<cudaStream_t>(context->stream(Stream::kCompute))));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(handle, cuda_backend->workspace(), kCublasWorkspaceBytes));
  // alpha and beta are passed from the host.
  CUBLAS_RETURN_IF_ERROR(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  // cuBLAS is reproducible run to run unless a routine may use atomics; forbid them.
  if (deterministic) {
    CUBLAS_RETURN_IF_ERROR(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));
  }
  return backend;
}

}  // namespace bagpipe::internal
