// How an embedding bag combines its rows: the pooling modes of the cache's gather and the
// matching gradient scales of its reduce.
//
// A bag b with ids j in [begin, end) and optional per-occurrence weights w_j produces
//   pooled[b] = sum over j, in occurrence order, from +0.0f, of scale_j * row(j)
// with scale_j = w_j * m_b, where w_j = 1 without weights and m_b = 1.0f / float(end - begin)
// for kMean (rounded once, as a float division) and 1 for kSum. The gradient of row(j) from
// the bag is scale_j * pooled_grad[b]: the same scale, so forward and backward agree exactly.
// Empty bags pool to zeros. Pure functions; thread-safe.
#ifndef BAGPIPE_CACHE_POOLING_H_
#define BAGPIPE_CACHE_POOLING_H_

#include <string_view>

#include "absl/status/statusor.h"

namespace bagpipe {

enum class PoolingMode { kSum, kMean };

// "sum" or "mean".
std::string_view PoolingName(PoolingMode mode);
// Parses "sum" or "mean" (any case).
absl::StatusOr<PoolingMode> ParsePoolingMode(std::string_view text);

}  // namespace bagpipe

#endif  // BAGPIPE_CACHE_POOLING_H_
