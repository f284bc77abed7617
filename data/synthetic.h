// The seeded synthetic generator: Criteo-shaped traffic without a dataset.
//
// Spec: synthetic[:key=value,...] with keys
//   samples=N      samples per epoch (default 1048576)
//   tables=K       use the first K Criteo Kaggle tables (default 26)
//   rows=a/b/c     explicit table sizes (overrides tables=; '/'-separated)
//   scale=F        multiply every table size by F (min 2 rows), e.g. 0.01 for a small run
//   alpha=A        Zipf exponent of row popularity, A > 0 (default 1.05)
//   pooling=P      ids per bag (multi-hot), default 1; pooling=1-P draws a size in [1, P]
//   dense=D        dense features (default 13)
//   drift=R        every R samples the popularity ranking rotates by one rank (0 = none)
//   seed=S         default 1
// Popularity: in table t, the rank-k row (k = 0 hottest) has probability proportional to
// (k + 1)^-alpha, and ranks map to row ids through a seeded random permutation (a bijective
// mix of the id space), so hot rows are spread over the table as in hashed Criteo data.
// Labels depend on the dense features and on a seeded per-row effect, so a model can learn.
// Every sample is a pure function of (seed, sample position): generation streams, needs no
// materialisation, and is reproducible across runs and thread counts.
#ifndef BAGPIPE_DATA_SYNTHETIC_H_
#define BAGPIPE_DATA_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/source.h"

namespace bagpipe {

// Row counts of the 26 categorical features of Criteo Kaggle (dictionary-encoded).
inline const std::vector<int64_t>& CriteoKaggleTableRows() {
  static const std::vector<int64_t> rows = {
      1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
      93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
      2173,  4,    7046547,  18,      15,  286181, 105,     142572};
  return rows;
}

struct SyntheticConfig {
  int64_t samples = 1 << 20;
  std::vector<int64_t> table_rows = CriteoKaggleTableRows();
  double alpha = 1.05;
  int pooling_min = 1;
  int pooling_max = 1;
  int dense = 13;
  int64_t drift = 0;
  uint64_t seed = 1;
};

// Parses the key=value list (the part after "synthetic:"); errors name the bad key or value.
absl::StatusOr<SyntheticConfig> ParseSyntheticConfig(const std::string& spec);

absl::StatusOr<std::unique_ptr<SampleSource>> OpenSynthetic(const std::string& spec,
                                                            const SourceOptions& options);
absl::StatusOr<std::unique_ptr<SampleSource>> OpenSynthetic(const SyntheticConfig& config,
                                                            const SourceOptions& options);

// Share of accesses that go to the `top_rows` hottest rows of a table of `rows` rows under
// Zipf(alpha): H(top_rows, alpha) / H(rows, alpha). Used by tests and `data-stats`.
double ZipfTopShare(int64_t rows, int64_t top_rows, double alpha);

}  // namespace bagpipe

#endif  // BAGPIPE_DATA_SYNTHETIC_H_
