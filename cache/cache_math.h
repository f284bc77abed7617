// The exact float formulas of the cache, shared by the CPU reference backend and the CUDA
// kernels so that both perform the same operations in the same order.
//
// Every arithmetic step goes through Add/Sub/Mul/Div/Sqrt: on the device these are the
// round-to-nearest intrinsics (__fadd_rn, ...), which nvcc never contracts into FMAs; on the
// host they are plain IEEE operations (the cache is compiled with -ffp-contract=off). Hence a
// CPU and a CUDA result computed from the same inputs in the same order are bit-identical, and
// each backend is bit-reproducible run to run.
//
// Optimizer steps (lr = learning rate, g = gradient, w = weight, s = state), per column c:
//   SGD:               w = w - lr * g
//   Adagrad:           s = s + g * g;  w = w - (lr * g) / (sqrt(s) + eps)
//   Row-wise Adagrad:  s = s + Q / float(dim);  w = w - (lr * g) / (sqrt(s) + eps)   (s per row)
// where Q = RowwiseSquareSum(g): kRowwisePartials strided partial sums
//   p_l = sum over k ascending of g[l + 32 k]^2 (from +0.0f), l = 0..31,
// combined by the tree  for (h = 16; h >= 1; h /= 2) p_l = p_l + p_{l+h} for l < h;  Q = p_0.
// (This is the order of a warp's xor-shuffle reduction, so the CUDA backend reproduces it.)
//
// Gradient reduce of a row whose occurrences are e_0 .. e_{n-1} (occurrence order), each a
// pooled gradient row x_e with a scale a_e: the occurrences are cut into chunks of
// kReduceChunk consecutive ones; chunk k's partial is
//   p_k = sum over its occurrences in order of a_e * x_e (from +0.0f; the multiply is skipped
//         when a_e is exactly 1, which gives the same bits),
// and the row's gradient is p_0 + p_1 + ... in chunk order (from +0.0f). A row with at most
// kReduceChunk occurrences is therefore the plain in-order sum; the chunks of a hot row are
// summed in parallel by the CUDA backend, then combined in this order.
//
// This header compiles with a plain host compiler and with nvcc (functions are
// __host__ __device__ there).
#ifndef BAGPIPE_CACHE_CACHE_MATH_H_
#define BAGPIPE_CACHE_CACHE_MATH_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define BAGPIPE_HOST_DEVICE __host__ __device__
#else
#define BAGPIPE_HOST_DEVICE
#endif

namespace bagpipe::cache_math {

inline constexpr int kRowwisePartials = 32;
inline constexpr int64_t kReduceChunk = 32;

BAGPIPE_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

BAGPIPE_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

BAGPIPE_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

BAGPIPE_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

BAGPIPE_HOST_DEVICE inline float Sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// m_b of cache/pooling.h: 1 / len for mean pooling of a non-empty bag, else 1.
BAGPIPE_HOST_DEVICE inline float BagMultiplier(bool mean, int64_t len) {
  return (mean && len > 0) ? Div(1.0f, static_cast<float>(len)) : 1.0f;
}

BAGPIPE_HOST_DEVICE inline float SgdStep(float w, float g, float lr) { return Sub(w, Mul(lr, g)); }

// Updates s and returns the new w.
BAGPIPE_HOST_DEVICE inline float AdagradStep(float w, float g, float* s, float lr, float eps) {
  *s = Add(*s, Mul(g, g));
  return Sub(w, Div(Mul(lr, g), Add(Sqrt(*s), eps)));
}

// Updates the row's s from its square sum Q and returns the denominator sqrt(s) + eps.
BAGPIPE_HOST_DEVICE inline float RowwiseDenominator(float* s, float square_sum, int dim,
                                                    float eps) {
  *s = Add(*s, Div(square_sum, static_cast<float>(dim)));
  return Add(Sqrt(*s), eps);
}

BAGPIPE_HOST_DEVICE inline float RowwiseStep(float w, float g, float lr, float denominator) {
  return Sub(w, Div(Mul(lr, g), denominator));
}

// Q of the header comment, on the host (the CUDA backend computes it with warp shuffles). The
// partials advance a block of 32 columns at a time, which keeps each p_l's order and lets the
// compiler vectorise the block.
inline float RowwiseSquareSum(const float* g, int dim) {
  float partial[kRowwisePartials];
  for (int l = 0; l < kRowwisePartials; ++l) partial[l] = 0.0f;
  const int full = dim / kRowwisePartials * kRowwisePartials;
  for (int base = 0; base < full; base += kRowwisePartials) {
    for (int l = 0; l < kRowwisePartials; ++l) {
      partial[l] = Add(partial[l], Mul(g[base + l], g[base + l]));
    }
  }
  for (int l = 0; full + l < dim; ++l) partial[l] = Add(partial[l], Mul(g[full + l], g[full + l]));
  for (int half = kRowwisePartials / 2; half >= 1; half /= 2) {
    for (int l = 0; l < half; ++l) partial[l] = Add(partial[l], partial[l + half]);
  }
  return partial[0];
}

// core/row_init.h's value formula, scale * (2u - 1), with explicit rounding steps (2u - 1 is
// exact for the 24-bit u, so this equals RowInitializer::Value bit for bit).
BAGPIPE_HOST_DEVICE inline float InitValue(float scale, float unit) {
  return Mul(scale, Sub(Mul(2.0f, unit), 1.0f));
}

}  // namespace bagpipe::cache_math

#endif  // BAGPIPE_CACHE_CACHE_MATH_H_
