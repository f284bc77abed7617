// The cache's CUDA kernels. See cache/cache_kernels.cuh for the scheme and cache/cache_math.h
// for the formulas they share with the CPU reference.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cache/cache_kernels.cuh"
#include "cache/cache_math.h"
#include "core/cuda_checks.h"
#include "core/random.h"
#include "core/row_init.h"

namespace bagpipe::cache_kernels {
namespace {

using cache_math::Add;
using cache_math::Mul;

constexpr int kThreads = 256;
constexpr int kWarp = 32;
// Blocks per SM the grid-stride grids are capped at.
constexpr int kBlocksPerSm = 16;

// --- float / float4 helpers (component-wise, same operation per component) ---------------

__device__ __forceinline__ void SetZero(float& a) { a = 0.0f; }
__device__ __forceinline__ void SetZero(float4& a) { a = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

__device__ __forceinline__ void Accumulate(float& acc, float x) { acc = Add(acc, x); }
__device__ __forceinline__ void Accumulate(float4& acc, const float4& x) {
  acc.x = Add(acc.x, x.x);
  acc.y = Add(acc.y, x.y);
  acc.z = Add(acc.z, x.z);
  acc.w = Add(acc.w, x.w);
}

__device__ __forceinline__ void AccumulateScaled(float& acc, float scale, float x) {
  acc = Add(acc, Mul(scale, x));
}
__device__ __forceinline__ void AccumulateScaled(float4& acc, float scale, const float4& x) {
  acc.x = Add(acc.x, Mul(scale, x.x));
  acc.y = Add(acc.y, Mul(scale, x.y));
  acc.z = Add(acc.z, Mul(scale, x.z));
  acc.w = Add(acc.w, Mul(scale, x.w));
}

__device__ __forceinline__ void Sgd(float& w, float g, float lr) {
  w = cache_math::SgdStep(w, g, lr);
}
__device__ __forceinline__ void Sgd(float4& w, const float4& g, float lr) {
  Sgd(w.x, g.x, lr);
  Sgd(w.y, g.y, lr);
  Sgd(w.z, g.z, lr);
  Sgd(w.w, g.w, lr);
}

__device__ __forceinline__ void Adagrad(float& w, float g, float& s, float lr, float eps) {
  w = cache_math::AdagradStep(w, g, &s, lr, eps);
}
__device__ __forceinline__ void Adagrad(float4& w, const float4& g, float4& s, float lr,
                                        float eps) {
  Adagrad(w.x, g.x, s.x, lr, eps);
  Adagrad(w.y, g.y, s.y, lr, eps);
  Adagrad(w.z, g.z, s.z, lr, eps);
  Adagrad(w.w, g.w, s.w, lr, eps);
}

template <typename VecT>
__device__ __forceinline__ const VecT* RowAs(const float* base, int64_t row, int row_floats) {
  return reinterpret_cast<const VecT*>(base + row * row_floats);
}
template <typename VecT>
__device__ __forceinline__ VecT* RowAs(float* base, int64_t row, int row_floats) {
  return reinterpret_cast<VecT*>(base + row * row_floats);
}

// Threads of a row group, and the group's position in the grid.
struct GroupPosition {
  int lane;        // thread within the group
  int size;        // threads per group (power of two, <= 32)
  int64_t first;   // first row of this group
  int64_t stride;  // groups in the grid
};

__device__ __forceinline__ GroupPosition Position(int group_shift) {
  GroupPosition p;
  p.size = 1 << group_shift;
  p.lane = threadIdx.x & (p.size - 1);
  const int64_t per_block = blockDim.x >> group_shift;
  p.first = static_cast<int64_t>(blockIdx.x) * per_block + (threadIdx.x >> group_shift);
  p.stride = static_cast<int64_t>(gridDim.x) * per_block;
  return p;
}

// Sum over entries begin .. end - 1 in order (from +0.0f) of vector v of their source rows,
// each scaled by its entry scale times `multiplier` when kScaled. Loads of kUnroll rows are
// issued before their in-order accumulation.
template <typename VecT, bool kScaled>
__device__ __forceinline__ VecT SumEntries(const float* __restrict__ source, int dim,
                                           const int32_t* __restrict__ source_rows,
                                           const float* __restrict__ entry_scales, float multiplier,
                                           int64_t begin, int64_t end, int v) {
  constexpr int kUnroll = 4;
  VecT acc;
  SetZero(acc);
  int64_t j = begin;
  for (; j + kUnroll <= end; j += kUnroll) {
    VecT x[kUnroll];
    float scale[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u] = RowAs<VecT>(source, source_rows[j + u], dim)[v];
      if (kScaled) {
        scale[u] = Mul(entry_scales != nullptr ? entry_scales[j + u] : 1.0f, multiplier);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kScaled) {
        AccumulateScaled(acc, scale[u], x[u]);
      } else {
        Accumulate(acc, x[u]);
      }
    }
  }
  for (; j < end; ++j) {
    const VecT x = RowAs<VecT>(source, source_rows[j], dim)[v];
    if (kScaled) {
      AccumulateScaled(acc, Mul(entry_scales != nullptr ? entry_scales[j] : 1.0f, multiplier), x);
    } else {
      Accumulate(acc, x);
    }
  }
  return acc;
}

// --- kernels ---------------------------------------------------------------------------------

template <typename VecT, bool kScaled>
__global__ void __launch_bounds__(kThreads)
    SegmentSumKernel(const float* __restrict__ source, int dim,
                     const int64_t* __restrict__ segment_begin,
                     const int32_t* __restrict__ source_rows,
                     const float* __restrict__ entry_scales, bool mean, bool bag_layout,
                     int64_t num_segments, int num_samples, int num_tables, int64_t max_entries,
                     float* __restrict__ output, int group_shift) {
  const int vectors = dim / static_cast<int>(sizeof(VecT) / sizeof(float));
  const GroupPosition p = Position(group_shift);
  for (int64_t segment = p.first; segment < num_segments; segment += p.stride) {
    int64_t out_row = segment;
    if (bag_layout) {
      const int64_t t = segment / num_samples;
      out_row = (segment - t * num_samples) * num_tables + t;
    }
    const int64_t begin = segment_begin[segment];
    const int64_t end = segment_begin[segment + 1];
    if (end - begin > max_entries) continue;  // LongSegmentSumKernel's
    const float multiplier = cache_math::BagMultiplier(mean, end - begin);
    VecT* out = RowAs<VecT>(output, out_row, dim);
    for (int v = p.lane; v < vectors; v += p.size) {
      out[v] = SumEntries<VecT, kScaled>(source, dim, source_rows, entry_scales, multiplier, begin,
                                         end, v);
    }
  }
}

// Segments of more than kReduceChunk entries (the reduce's hot rows), one block at a time: the
// block's threads are `lanes` x `columns` (columns = the row's vectors rounded up to a power of
// two, at most kThreads); each lane sums one chunk of kReduceChunk entries, and lane 0 then adds
// the lanes' partials in chunk order, a round of `lanes` chunks after another. The order is
// cache_math's chunked reduce order, so the bits equal the CPU reference's.
template <typename VecT, bool kScaled>
__global__ void __launch_bounds__(kThreads)
    LongSegmentSumKernel(const float* __restrict__ source, int dim,
                         const int64_t* __restrict__ segment_begin,
                         const int32_t* __restrict__ source_rows,
                         const float* __restrict__ entry_scales, bool mean, int64_t num_segments,
                         float* __restrict__ output, int column_shift) {
  __shared__ VecT partials[kThreads];
  constexpr int64_t kChunk = cache_math::kReduceChunk;
  const int vectors = dim / static_cast<int>(sizeof(VecT) / sizeof(float));
  const int columns = 1 << column_shift;
  const int lanes = kThreads >> column_shift;
  const int column = static_cast<int>(threadIdx.x) & (columns - 1);
  const int lane = static_cast<int>(threadIdx.x) >> column_shift;
  for (int64_t segment = blockIdx.x; segment < num_segments; segment += gridDim.x) {
    const int64_t begin = segment_begin[segment];
    const int64_t end = segment_begin[segment + 1];
    if (end - begin <= kChunk) continue;  // the same for the whole block
    const float multiplier = cache_math::BagMultiplier(mean, end - begin);
    VecT* out = RowAs<VecT>(output, segment, dim);
    for (int first = 0; first < vectors; first += columns) {
      const int v = first + column;
      VecT acc;
      SetZero(acc);
      for (int64_t round = begin; round < end; round += lanes * kChunk) {
        const int64_t chunk = round + lane * kChunk;
        VecT partial;
        SetZero(partial);
        if (v < vectors && chunk < end) {
          partial = SumEntries<VecT, kScaled>(source, dim, source_rows, entry_scales, multiplier,
                                              chunk, min(chunk + kChunk, end), v);
        }
        partials[threadIdx.x] = partial;
        __syncthreads();
        if (lane == 0 && v < vectors) {
          const int64_t chunks =
              min(static_cast<int64_t>(lanes), (end - round + kChunk - 1) / kChunk);
          for (int l = 0; l < chunks; ++l) Accumulate(acc, partials[l * columns + column]);
        }
        __syncthreads();
      }
      if (lane == 0 && v < vectors) out[v] = acc;
    }
  }
}

template <typename VecT, bool kAdagrad>
__global__ void __launch_bounds__(kThreads)
    ApplyElementwiseKernel(float* __restrict__ values, float* __restrict__ state, int dim,
                           const int32_t* __restrict__ slots, const int32_t* __restrict__ grad_rows,
                           const float* __restrict__ grads, int64_t n, float lr, float eps,
                           int group_shift) {
  const int vectors = dim / static_cast<int>(sizeof(VecT) / sizeof(float));
  const GroupPosition p = Position(group_shift);
  for (int64_t k = p.first; k < n; k += p.stride) {
    const int64_t slot = slots[k];
    const int64_t grad_row = grad_rows != nullptr ? grad_rows[k] : k;
    VecT* w = RowAs<VecT>(values, slot, dim);
    const VecT* g = RowAs<VecT>(grads, grad_row, dim);
    for (int v = p.lane; v < vectors; v += p.size) {
      VecT wv = w[v];
      const VecT gv = g[v];
      if (kAdagrad) {
        VecT* s = RowAs<VecT>(state, slot, dim);
        VecT sv = s[v];
        Adagrad(wv, gv, sv, lr, eps);
        s[v] = sv;
      } else {
        Sgd(wv, gv, lr);
      }
      w[v] = wv;
    }
  }
}

// One warp per row: the square sum follows cache_math::RowwiseSquareSum's order exactly
// (lane l sums columns l, l + 32, ...; then the xor-shuffle tree 16, 8, 4, 2, 1).
__global__ void __launch_bounds__(kThreads)
    ApplyRowwiseKernel(float* __restrict__ values, float* __restrict__ state, int dim,
                       const int32_t* __restrict__ slots, const int32_t* __restrict__ grad_rows,
                       const float* __restrict__ grads, int64_t n, float lr, float eps) {
  static_assert(cache_math::kRowwisePartials == kWarp);
  const GroupPosition p = Position(/*group_shift=*/5);
  for (int64_t k = p.first; k < n; k += p.stride) {
    const int64_t slot = slots[k];
    const int64_t grad_row = grad_rows != nullptr ? grad_rows[k] : k;
    float* w = values + slot * dim;
    const float* g = grads + grad_row * dim;
    float partial = 0.0f;
    for (int c = p.lane; c < dim; c += kWarp) partial = Add(partial, Mul(g[c], g[c]));
    for (int half = kWarp / 2; half >= 1; half /= 2) {
      partial = Add(partial, __shfl_xor_sync(0xffffffffu, partial, half));
    }
    float s = state[slot];
    const float denominator = cache_math::RowwiseDenominator(&s, partial, dim, eps);
    __syncwarp();  // every lane has read the old state before lane 0 replaces it
    if (p.lane == 0) state[slot] = s;
    for (int c = p.lane; c < dim; c += kWarp) {
      w[c] = cache_math::RowwiseStep(w[c], g[c], lr, denominator);
    }
  }
}

// Record k <-> slot slots[k]. kToCache: records -> storage (Fill), else storage -> records.
template <typename VecT, bool kToCache>
__global__ void __launch_bounds__(kThreads)
    CopyRecordsKernel(float* __restrict__ values, float* __restrict__ state, int dim,
                      int state_floats, const int32_t* __restrict__ slots,
                      float* __restrict__ records, int64_t n, int group_shift) {
  constexpr int kWidth = static_cast<int>(sizeof(VecT) / sizeof(float));
  const int value_vectors = dim / kWidth;
  const int state_vectors = state_floats / kWidth;
  const int record_floats = dim + state_floats;
  const GroupPosition p = Position(group_shift);
  for (int64_t k = p.first; k < n; k += p.stride) {
    const int64_t slot = slots[k];
    VecT* record_values = RowAs<VecT>(records, k, record_floats);
    VecT* record_state = reinterpret_cast<VecT*>(records + k * record_floats + dim);
    VecT* slot_values = RowAs<VecT>(values, slot, dim);
    for (int v = p.lane; v < value_vectors; v += p.size) {
      if (kToCache) {
        slot_values[v] = record_values[v];
      } else {
        record_values[v] = slot_values[v];
      }
    }
    if (state_vectors == 0) continue;
    VecT* slot_state = RowAs<VecT>(state, slot, state_floats);
    for (int v = p.lane; v < state_vectors; v += p.size) {
      if (kToCache) {
        slot_state[v] = record_state[v];
      } else {
        record_state[v] = slot_state[v];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    InitializeKernel(float* __restrict__ values, float* __restrict__ state, int dim,
                     int state_floats, int64_t first_slot, int64_t count, uint64_t first_row,
                     uint64_t seed, const uint64_t* __restrict__ table_offsets,
                     const float* __restrict__ table_scales, int num_tables, float accumulator,
                     int group_shift) {
  const GroupPosition p = Position(group_shift);
  for (int64_t k = p.first; k < count; k += p.stride) {
    const uint64_t row = first_row + static_cast<uint64_t>(k);
    // RowInitializer::TableOf: upper_bound over the cumulative offsets, minus one.
    int lo = 0;
    int hi = num_tables + 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (table_offsets[mid] <= row) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const float scale = table_scales[lo - 1];
    const int64_t slot = first_slot + k;
    for (int c = p.lane; c < dim; c += p.size) {
      const float unit = UnitFloat(HashKey(seed, kRowInitStream, row, static_cast<uint64_t>(c)));
      values[slot * dim + c] = cache_math::InitValue(scale, unit);
    }
    for (int c = p.lane; c < state_floats; c += p.size) {
      state[slot * state_floats + c] = accumulator;
    }
  }
}

// --- launch shapes ---------------------------------------------------------------------------

bool Aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

struct Shape {
  int group_shift;
  int blocks;
};

// Groups of the smallest power of two >= `units` threads (at most a warp), one row per group.
Shape ShapeFor(int64_t rows, int units, int sm_count) {
  int shift = 0;
  while ((1 << shift) < units && shift < 5) ++shift;
  const int64_t per_block = kThreads >> shift;
  const int64_t needed = (rows + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(std::max(sm_count, 1)) * kBlocksPerSm;
  return Shape{shift, static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)))};
}

}  // namespace

absl::Status LaunchSegmentSum(const SegmentSumArgs& a, int sm_count, cudaStream_t stream) {
  if (a.num_segments == 0) return absl::OkStatus();
  const bool vec4 = a.dim % 4 == 0 && Aligned16(a.source) && Aligned16(a.output);
  const bool scaled = a.entry_scales != nullptr || a.mean;
  const int units = vec4 ? a.dim / 4 : a.dim;
  const Shape shape = ShapeFor(a.num_segments, units, sm_count);
  const int64_t max_entries =
      a.chunked ? cache_math::kReduceChunk : std::numeric_limits<int64_t>::max();
  // Long segments: one block each (grid-stride), columns = units rounded up to a power of two.
  int column_shift = 0;
  while ((1 << column_shift) < units && (1 << column_shift) < kThreads) ++column_shift;
  const int long_blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(a.num_segments, int64_t{std::max(sm_count, 1)} * 4)));
#define BAGPIPE_LAUNCH_SEGMENT_SUM_(VecT, kScaled)                                               \
  SegmentSumKernel<VecT, kScaled><<<shape.blocks, kThreads, 0, stream>>>(                        \
      a.source, a.dim, a.segment_begin, a.source_rows, a.entry_scales, a.mean, a.bag_layout,     \
      a.num_segments, a.num_samples, a.num_tables, max_entries, a.output, shape.group_shift);    \
  if (a.chunked) {                                                                               \
    LongSegmentSumKernel<VecT, kScaled><<<long_blocks, kThreads, 0, stream>>>(                   \
        a.source, a.dim, a.segment_begin, a.source_rows, a.entry_scales, a.mean, a.num_segments, \
        a.output, column_shift);                                                                 \
  }
  if (vec4) {
    if (scaled) {
      BAGPIPE_LAUNCH_SEGMENT_SUM_(float4, true);
    } else {
      BAGPIPE_LAUNCH_SEGMENT_SUM_(float4, false);
    }
  } else {
    if (scaled) {
      BAGPIPE_LAUNCH_SEGMENT_SUM_(float, true);
    } else {
      BAGPIPE_LAUNCH_SEGMENT_SUM_(float, false);
    }
  }
#undef BAGPIPE_LAUNCH_SEGMENT_SUM_
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LaunchApply(const Storage& s, OptimizerKind optimizer, const int32_t* slots,
                         const int32_t* grad_rows, const float* grads, int64_t n,
                         float learning_rate, float eps, int sm_count, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  if (optimizer == OptimizerKind::kRowwiseAdagrad) {
    const Shape shape = ShapeFor(n, kWarp, sm_count);
    ApplyRowwiseKernel<<<shape.blocks, kThreads, 0, stream>>>(
        s.values, s.state, s.dim, slots, grad_rows, grads, n, learning_rate, eps);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  const bool adagrad = optimizer == OptimizerKind::kAdagrad;
  const bool vec4 =
      s.dim % 4 == 0 && Aligned16(s.values) && Aligned16(grads) && (!adagrad || Aligned16(s.state));
  const Shape shape = ShapeFor(n, vec4 ? s.dim / 4 : s.dim, sm_count);
#define BAGPIPE_LAUNCH_APPLY_(VecT, kAdagrad)                                    \
  ApplyElementwiseKernel<VecT, kAdagrad><<<shape.blocks, kThreads, 0, stream>>>( \
      s.values, s.state, s.dim, slots, grad_rows, grads, n, learning_rate, eps, shape.group_shift)
  if (vec4) {
    if (adagrad) {
      BAGPIPE_LAUNCH_APPLY_(float4, true);
    } else {
      BAGPIPE_LAUNCH_APPLY_(float4, false);
    }
  } else {
    if (adagrad) {
      BAGPIPE_LAUNCH_APPLY_(float, true);
    } else {
      BAGPIPE_LAUNCH_APPLY_(float, false);
    }
  }
#undef BAGPIPE_LAUNCH_APPLY_
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

namespace {

template <bool kToCache>
absl::Status LaunchCopyRecords(const Storage& s, const int32_t* slots, float* records, int64_t n,
                               int sm_count, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  const bool vec4 = s.dim % 4 == 0 && s.state_floats % 4 == 0 && Aligned16(s.values) &&
                    (s.state_floats == 0 || Aligned16(s.state)) && Aligned16(records);
  const int floats = std::max(s.dim, s.state_floats);
  const Shape shape = ShapeFor(n, vec4 ? floats / 4 : floats, sm_count);
  if (vec4) {
    CopyRecordsKernel<float4, kToCache><<<shape.blocks, kThreads, 0, stream>>>(
        s.values, s.state, s.dim, s.state_floats, slots, records, n, shape.group_shift);
  } else {
    CopyRecordsKernel<float, kToCache><<<shape.blocks, kThreads, 0, stream>>>(
        s.values, s.state, s.dim, s.state_floats, slots, records, n, shape.group_shift);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchFill(const Storage& storage, const int32_t* slots, const float* records,
                        int64_t n, int sm_count, cudaStream_t stream) {
  // The kernel only reads `records` in this direction.
  return LaunchCopyRecords<true>(storage, slots, const_cast<float*>(records), n, sm_count, stream);
}

absl::Status LaunchExtract(const Storage& storage, const int32_t* slots, int64_t n, float* records,
                           int sm_count, cudaStream_t stream) {
  return LaunchCopyRecords<false>(storage, slots, records, n, sm_count, stream);
}

absl::Status LaunchInitialize(const Storage& s, int64_t first_slot, int64_t count,
                              uint64_t first_row, uint64_t seed, const uint64_t* table_offsets,
                              const float* table_scales, int num_tables, float accumulator,
                              int sm_count, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  const Shape shape = ShapeFor(count, std::max(s.dim, s.state_floats), sm_count);
  InitializeKernel<<<shape.blocks, kThreads, 0, stream>>>(
      s.values, s.state, s.dim, s.state_floats, first_slot, count, first_row, seed, table_offsets,
      table_scales, num_tables, accumulator, shape.group_shift);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace bagpipe::cache_kernels
