// The CPU reference backend: plain loops over the cache_math.h formulas, parallelised over
// output rows with TBB. Each output row is computed by one task in a fixed order, so results
// do not depend on the thread count.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cache/cache_backend.h"
#include "cache/cache_math.h"
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
  explicit CpuCacheBackend(const CacheStorage& storage) : s_(storage) {}

  absl::Status Gather(const GatherArgs& a, Stream) override {
    const int dim = s_.dim;
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
        AccumulateRow(out, s_.values + static_cast<int64_t>(a.slots[j]) * dim,
                      Mul(weight, multiplier), dim);
      }
    });
    return absl::OkStatus();
  }

  absl::Status Reduce(const ReduceArgs& a, Stream) override {
    const int dim = s_.dim;
    ForRows(a.num_unique, dim, [&](int64_t u) {
      float* out = a.row_grads + u * dim;
      std::fill(out, out + dim, 0.0f);
      for (int64_t e = a.row_begin[u]; e < a.row_begin[u + 1]; ++e) {
        AccumulateRow(out, a.pooled_grad + static_cast<int64_t>(a.pooled_rows[e]) * dim,
                      a.scales != nullptr ? a.scales[e] : 1.0f, dim);
      }
    });
    return absl::OkStatus();
  }

  absl::Status Apply(const ApplyArgs& a, Stream) override {
    const int dim = s_.dim;
    const float lr = a.learning_rate;
    const float eps = a.eps;
    auto grad_of = [&](int64_t k) {
      const int64_t row = a.grad_rows != nullptr ? a.grad_rows[k] : k;
      return a.grads + row * dim;
    };
    switch (s_.optimizer) {
      case OptimizerKind::kSgd:
        ForRows(a.n, dim, [&](int64_t k) {
          float* w = s_.values + static_cast<int64_t>(a.slots[k]) * dim;
          const float* g = grad_of(k);
          for (int c = 0; c < dim; ++c) w[c] = cache_math::SgdStep(w[c], g[c], lr);
        });
        break;
      case OptimizerKind::kAdagrad:
        ForRows(a.n, 2 * dim, [&](int64_t k) {
          const int64_t slot = a.slots[k];
          float* w = s_.values + slot * dim;
          float* state = s_.state + slot * dim;
          const float* g = grad_of(k);
          for (int c = 0; c < dim; ++c) {
            w[c] = cache_math::AdagradStep(w[c], g[c], &state[c], lr, eps);
          }
        });
        break;
      case OptimizerKind::kRowwiseAdagrad:
        ForRows(a.n, dim, [&](int64_t k) {
          const int64_t slot = a.slots[k];
          float* w = s_.values + slot * dim;
          const float* g = grad_of(k);
          const float denominator = cache_math::RowwiseDenominator(
              &s_.state[slot], cache_math::RowwiseSquareSum(g, dim), dim, eps);
          for (int c = 0; c < dim; ++c) w[c] = cache_math::RowwiseStep(w[c], g[c], lr, denominator);
        });
        break;
    }
    return absl::OkStatus();
  }

  absl::Status Fill(const SlotId* slots, const float* records, int64_t n, Stream) override {
    const int dim = s_.dim;
    const int state = s_.state_floats;
    const int64_t record = dim + state;
    ForRows(n, static_cast<int>(record), [&](int64_t k) {
      const int64_t slot = slots[k];
      const float* in = records + k * record;
      std::memcpy(s_.values + slot * dim, in, sizeof(float) * dim);
      if (state > 0) std::memcpy(s_.state + slot * state, in + dim, sizeof(float) * state);
    });
    return absl::OkStatus();
  }

  absl::Status Extract(const SlotId* slots, int64_t n, float* records, Stream) override {
    const int dim = s_.dim;
    const int state = s_.state_floats;
    const int64_t record = dim + state;
    ForRows(n, static_cast<int>(record), [&](int64_t k) {
      const int64_t slot = slots[k];
      float* out = records + k * record;
      std::memcpy(out, s_.values + slot * dim, sizeof(float) * dim);
      if (state > 0) std::memcpy(out + dim, s_.state + slot * state, sizeof(float) * state);
    });
    return absl::OkStatus();
  }

  absl::Status InitializeRows(const RowInitializer& initializer, int64_t first_slot, int64_t count,
                              RowId first_row, float accumulator, Stream) override {
    const int dim = s_.dim;
    const int state = s_.state_floats;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, Grain(dim)),
                      [&](const tbb::blocked_range<int64_t>& range) {
                        std::vector<float> record(dim + state);
                        for (int64_t k = range.begin(); k != range.end(); ++k) {
                          const int64_t slot = first_slot + k;
                          initializer.Init(first_row + static_cast<RowId>(k), record.data());
                          std::memcpy(s_.values + slot * dim, record.data(), sizeof(float) * dim);
                          std::fill(s_.state + slot * state, s_.state + (slot + 1) * state,
                                    accumulator);
                        }
                      });
    return absl::OkStatus();
  }

 private:
  const CacheStorage s_;
};

}  // namespace

std::unique_ptr<CacheBackend> CreateCpuCacheBackend(const CacheStorage& storage) {
  return std::make_unique<CpuCacheBackend>(storage);
}

}  // namespace bagpipe::internal
