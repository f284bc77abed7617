// The CPU reference backend: plain loops over the cache_math.h formulas, parallelised over
// output rows with TBB. Each output row is computed by one task in a fixed order, so results
// do not depend on the thread count. Every operation is a kernel queued on the context's stream
// (DeviceContext::Launch): it runs in the call for a synchronous context, later on the stream's
// executor for an asynchronous one, so the arguments are captured by value.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cache/cache_backend.h"
#include "cache/cache_math.h"
#include "core/status.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace bagpipe::internal {
namespace {

using cache_math::Add;
using cache_math::Mul;

// Rows per TBB task: enough work (~16 KiB of floats) to amortise scheduling.
int64_t Grain(int row_floats) { return std::max<int64_t>(1, 4096 / std::max(1, row_floats)); }

template <typename Body>
void ForRows(int64_t n, int row_floats, const Body& body) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, Grain(row_floats)),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      for (int64_t i = range.begin(); i != range.end(); ++i) body(i);
                    });
}

// out[c] = out[c] + scale * in[c]; the multiply is skipped when scale is exactly 1 (same bits).
inline void AccumulateRow(float* out, const float* in, float scale, int dim) {
  if (scale == 1.0f) {
    for (int c = 0; c < dim; ++c) out[c] = Add(out[c], in[c]);
  } else {
    for (int c = 0; c < dim; ++c) out[c] = Add(out[c], Mul(scale, in[c]));
  }
}

class CpuCacheBackend final : public CacheBackend {
 public:
  CpuCacheBackend(std::shared_ptr<DeviceContext> context, const CacheStorage& storage)
      : context_(std::move(context)), s_(storage) {}

  absl::Status Gather(const GatherArgs& args, Stream stream) override {
    return context_->Launch(stream, [st = s_, a = args] { RunGather(st, a); });
  }
  absl::Status Reduce(const ReduceArgs& args, Stream stream) override {
    return context_->Launch(stream, [st = s_, a = args] { RunReduce(st, a); });
  }
  absl::Status Apply(const ApplyArgs& args, Stream stream) override {
    return context_->Launch(stream, [st = s_, a = args] { RunApply(st, a); });
  }
  absl::Status Fill(const SlotId* slots, const float* records, int64_t n, Stream stream) override {
    return context_->Launch(stream,
                            [st = s_, slots, records, n] { RunFill(st, slots, records, n); });
  }
  absl::Status Extract(const SlotId* slots, int64_t n, float* records, Stream stream) override {
    return context_->Launch(stream,
                            [st = s_, slots, records, n] { RunExtract(st, slots, n, records); });
  }
  absl::Status InitializeRows(const RowInitializer& initializer, int64_t first_slot, int64_t count,
                              RowId first_row, float accumulator, Stream stream) override {
    // The initializer is the caller's: wait for the kernel before returning (as CUDA does).
    RETURN_IF_ERROR(context_->Launch(stream, [&, st = s_] {
      RunInitialize(st, initializer, first_slot, count, first_row, accumulator);
    }));
    if (!context_->is_asynchronous()) return absl::OkStatus();
    return context_->Synchronize(stream);
  }

 private:
  static void RunGather(const CacheStorage& st, const GatherArgs& a) {
    const int dim = st.dim;
    const int tables = a.num_tables;
    const int samples = a.num_samples;
    const bool mean = a.pooling == PoolingMode::kMean;
    // Output rows in memory order: row r = s * tables + t reads bag t * samples + s.
    ForRows(static_cast<int64_t>(tables) * samples, dim, [&](int64_t r) {
      const int64_t s = r / tables;
      const int64_t t = r - s * tables;
      const int64_t bag = t * samples + s;
      float* out = a.pooled + r * dim;
      std::fill(out, out + dim, 0.0f);
      const int64_t begin = a.offsets[bag];
      const int64_t end = a.offsets[bag + 1];
      const float multiplier = cache_math::BagMultiplier(mean, end - begin);
      for (int64_t j = begin; j < end; ++j) {
        const float weight = a.weights != nullptr ? a.weights[j] : 1.0f;
        AccumulateRow(out, st.values + static_cast<int64_t>(a.slots[j]) * dim,
                      Mul(weight, multiplier), dim);
      }
    });
  }

  // The chunked order of cache/cache_math.h: a row with more than kReduceChunk occurrences is
  // summed chunk by chunk into `partial`, and the partials are added in chunk order.
  static void RunReduce(const CacheStorage& st, const ReduceArgs& a) {
    const int dim = st.dim;
    ForRows(a.num_unique, dim, [&](int64_t u) {
      float* out = a.row_grads + u * dim;
      std::fill(out, out + dim, 0.0f);
      const int64_t begin = a.row_begin[u];
      const int64_t end = a.row_begin[u + 1];
      auto sum_into = [&](float* into, int64_t from, int64_t to) {
        for (int64_t e = from; e < to; ++e) {
          AccumulateRow(into, a.pooled_grad + static_cast<int64_t>(a.pooled_rows[e]) * dim,
                        a.scales != nullptr ? a.scales[e] : 1.0f, dim);
        }
      };
      if (end - begin <= cache_math::kReduceChunk) {
        sum_into(out, begin, end);
        return;
      }
      thread_local std::vector<float> partial;
      partial.resize(static_cast<size_t>(dim));
      for (int64_t chunk = begin; chunk < end; chunk += cache_math::kReduceChunk) {
        std::fill(partial.begin(), partial.end(), 0.0f);
        sum_into(partial.data(), chunk, std::min(chunk + cache_math::kReduceChunk, end));
        AccumulateRow(out, partial.data(), 1.0f, dim);
      }
    });
  }

  static void RunApply(const CacheStorage& st, const ApplyArgs& a) {
    const int dim = st.dim;
    const float lr = a.learning_rate;
    const float eps = a.eps;
    auto grad_of = [&](int64_t k) {
      const int64_t row = a.grad_rows != nullptr ? a.grad_rows[k] : k;
      return a.grads + row * dim;
    };
    switch (st.optimizer) {
      case OptimizerKind::kSgd:
        ForRows(a.n, dim, [&](int64_t k) {
          float* w = st.values + static_cast<int64_t>(a.slots[k]) * dim;
          const float* g = grad_of(k);
          for (int c = 0; c < dim; ++c) w[c] = cache_math::SgdStep(w[c], g[c], lr);
        });
        break;
      case OptimizerKind::kAdagrad:
        ForRows(a.n, 2 * dim, [&](int64_t k) {
          const int64_t slot = a.slots[k];
          float* w = st.values + slot * dim;
          float* state = st.state + slot * dim;
          const float* g = grad_of(k);
          for (int c = 0; c < dim; ++c) {
            w[c] = cache_math::AdagradStep(w[c], g[c], &state[c], lr, eps);
          }
        });
        break;
      case OptimizerKind::kRowwiseAdagrad:
        ForRows(a.n, dim, [&](int64_t k) {
          const int64_t slot = a.slots[k];
          float* w = st.values + slot * dim;
          const float* g = grad_of(k);
          const float denominator = cache_math::RowwiseDenominator(
              &st.state[slot], cache_math::RowwiseSquareSum(g, dim), dim, eps);
          for (int c = 0; c < dim; ++c) w[c] = cache_math::RowwiseStep(w[c], g[c], lr, denominator);
        });
        break;
    }
  }

  static void RunFill(const CacheStorage& st, const SlotId* slots, const float* records,
                      int64_t n) {
    const int dim = st.dim;
    const int state = st.state_floats;
    const int64_t record = dim + state;
    ForRows(n, static_cast<int>(record), [&](int64_t k) {
      const int64_t slot = slots[k];
      const float* in = records + k * record;
      std::memcpy(st.values + slot * dim, in, sizeof(float) * dim);
      if (state > 0) std::memcpy(st.state + slot * state, in + dim, sizeof(float) * state);
    });
  }

  static void RunExtract(const CacheStorage& st, const SlotId* slots, int64_t n, float* records) {
    const int dim = st.dim;
    const int state = st.state_floats;
    const int64_t record = dim + state;
    ForRows(n, static_cast<int>(record), [&](int64_t k) {
      const int64_t slot = slots[k];
      float* out = records + k * record;
      std::memcpy(out, st.values + slot * dim, sizeof(float) * dim);
      if (state > 0) std::memcpy(out + dim, st.state + slot * state, sizeof(float) * state);
    });
  }

  static void RunInitialize(const CacheStorage& st, const RowInitializer& initializer,
                            int64_t first_slot, int64_t count, RowId first_row, float accumulator) {
    const int dim = st.dim;
    const int state = st.state_floats;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, Grain(dim)),
                      [&](const tbb::blocked_range<int64_t>& range) {
                        std::vector<float> record(dim + state);
                        for (int64_t k = range.begin(); k != range.end(); ++k) {
                          const int64_t slot = first_slot + k;
                          initializer.Init(first_row + static_cast<RowId>(k), record.data());
                          std::memcpy(st.values + slot * dim, record.data(), sizeof(float) * dim);
                          std::fill(st.state + slot * state, st.state + (slot + 1) * state,
                                    accumulator);
                        }
                      });
  }

  const std::shared_ptr<DeviceContext> context_;
  const CacheStorage s_;
};

}  // namespace

std::unique_ptr<CacheBackend> CreateCpuCacheBackend(std::shared_ptr<DeviceContext> context,
                                                    const CacheStorage& storage) {
  return std::make_unique<CpuCacheBackend>(std::move(context), storage);
}

}  // namespace bagpipe::internal
