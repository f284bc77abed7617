#include "data/synthetic.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/excerpt.h"
#include "core/numbers.h"
#include "core/random.h"
#include "core/status.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace bagpipe {
namespace {

// Domain-separation constants for the per-purpose hash streams.
constexpr uint64_t kPoolingStream = 0x706f6f6cULL;
constexpr uint64_t kIdStream = 0x69647321ULL;
constexpr uint64_t kDenseStream = 0x64656e73ULL;
constexpr uint64_t kLabelStream = 0x6c61626cULL;
constexpr uint64_t kEffectStream = 0x65666663ULL;
constexpr uint64_t kWeightStream = 0x77656967ULL;
constexpr uint64_t kPermutationStream = 0x7065726dULL;

// Zipf(alpha) over ranks 1..n by rejection-inversion (Hörmann & Derflinger, "Rejection-inversion
// to generate variates from monotone discrete distributions", 1996): O(1) per draw for any
// alpha > 0. absl::zipf_distribution implements the same method but requires alpha > 1, and
// real popularity exponents are often at or below 1.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double alpha) : n_(n), alpha_(alpha) {
    h_integral_x1_ = HIntegral(1.5) - 1.0;
    h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
    s_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }

  // Returns a rank in [0, n), 0 the most popular.
  int64_t Sample(CounterRng& rng) const {
    while (true) {
      const double u = h_integral_n_ + rng.NextDouble() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      int64_t k = static_cast<int64_t>(x + 0.5);
      k = std::clamp<int64_t>(k, 1, n_);
      if (k - x <= s_ || u >= HIntegral(k + 0.5) - H(static_cast<double>(k))) return k - 1;
    }
  }

 private:
  // log1p(x) / x, continuous at 0.
  static double Helper1(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x / 2; }
  // expm1(x) / x, continuous at 0.
  static double Helper2(double x) { return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x / 2; }
  double H(double x) const { return std::exp(-alpha_ * std::log(x)); }
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - alpha_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - alpha_);
    if (t < -1.0) t = -1.0;  // numerical guard, as in the reference algorithm
    return std::exp(Helper1(t) * x);
  }

  int64_t n_;
  double alpha_;
  double h_integral_x1_;
  double h_integral_n_;
  double s_;
};

// A seeded bijection of [0, n): a 4-round Feistel network on the smallest even bit width that
// covers n, with cycle walking (at most ~4 steps on average since the domain is < 4n).
class Permutation {
 public:
  Permutation(int64_t n, uint64_t key) : n_(n), key_(key) {
    int bits = std::max(2, static_cast<int>(std::bit_width(static_cast<uint64_t>(n - 1))));
    half_bits_ = (bits + 1) / 2;
    half_mask_ = (uint64_t{1} << half_bits_) - 1;
  }
  int64_t operator()(int64_t x) const {
    uint64_t v = static_cast<uint64_t>(x);
    do {
      v = Encrypt(v);
    } while (v >= static_cast<uint64_t>(n_));
    return static_cast<int64_t>(v);
  }

 private:
  uint64_t Encrypt(uint64_t v) const {
    uint64_t left = v >> half_bits_;
    uint64_t right = v & half_mask_;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t next = left ^ (HashKey(key_, round, right) & half_mask_);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  int64_t n_;
  uint64_t key_;
  int half_bits_;
  uint64_t half_mask_;
};

// Standard normal from two uniforms (Box-Muller).
double Gaussian(uint64_t key) {
  CounterRng rng(key);
  const double u1 = 1.0 - rng.NextDouble();  // (0, 1]
  const double u2 = rng.NextDouble();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

class SyntheticSource final : public SampleSource {
 public:
  SyntheticSource(SyntheticConfig config, const SourceOptions& options)
      : config_(std::move(config)) {
    samples_per_epoch_ = config_.samples;
    if (options.max_samples >= 0) {
      samples_per_epoch_ = std::min(samples_per_epoch_, options.max_samples);
    }
    const int tables = static_cast<int>(config_.table_rows.size());
    for (int c = 0; c < config_.dense; ++c) schema_.dense_names.push_back(absl::StrCat("I", c + 1));
    for (int t = 0; t < tables; ++t) {
      schema_.table_names.push_back(absl::StrCat("C", t + 1));
      schema_.table_rows.push_back(config_.table_rows[t]);
      samplers_.emplace_back(config_.table_rows[t], config_.alpha);
      permutations_.emplace_back(config_.table_rows[t],
                                 HashKey(config_.seed, kPermutationStream, t));
    }
    for (int c = 0; c < config_.dense; ++c) {
      dense_weights_.push_back(0.6 * UnitDouble(HashKey(config_.seed, kWeightStream, c)) - 0.3);
    }
  }

  const Schema& schema() const override { return schema_; }

  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    // A batch counts samples in int32.
    const int64_t n = std::min({max_samples, samples_per_epoch_ - position_,
                                int64_t{std::numeric_limits<int32_t>::max()}});
    const int tables = schema_.num_tables();
    const int dense = config_.dense;
    batch->Reset(dense, tables);
    batch->first_sample = stream_offset_ + position_;
    if (n <= 0) return 0;
    const int32_t count = static_cast<int32_t>(n);
    batch->num_samples = count;
    batch->labels.resize(count);
    batch->dense.resize(static_cast<size_t>(count) * dense);
    // Bag sizes first (a pure function of the sample), then ids into their offsets.
    batch->offsets.assign(static_cast<size_t>(tables) * count + 1, 0);
    for (int t = 0; t < tables; ++t) {
      for (int32_t s = 0; s < count; ++s) {
        batch->offsets[static_cast<size_t>(t) * count + s + 1] = BagSize(position_ + s, t);
      }
    }
    std::partial_sum(batch->offsets.begin(), batch->offsets.end(), batch->offsets.begin());
    batch->ids.resize(batch->offsets.back());

    const int64_t base = position_;
    tbb::parallel_for(tbb::blocked_range<int32_t>(0, count, 1024),
                      [&](const tbb::blocked_range<int32_t>& range) {
                        for (int32_t s = range.begin(); s < range.end(); ++s) {
                          GenerateSample(base + s, s, batch);
                        }
                      });
    position_ += n;
    samples_returned_ += n;
    return n;
  }

  absl::Status Rewind() override {
    stream_offset_ += position_;
    position_ = 0;
    return absl::OkStatus();
  }

  SourceStats stats() const override {
    SourceStats stats;
    stats.samples = samples_returned_;
    return stats;
  }
  int64_t SamplesPerEpoch() const override { return samples_per_epoch_; }
  int64_t SamplesPerEpochWithoutLimit() const override { return config_.samples; }

  std::string Describe() const override {
    return absl::StrCat("synthetic (", schema_.num_tables(), " tables, ", schema_.TotalRows(),
                        " rows, alpha ", config_.alpha, ", seed ", config_.seed, ")");
  }

 private:
  int64_t BagSize(int64_t sample, int table) const {
    if (config_.pooling_min == config_.pooling_max) return config_.pooling_max;
    const uint64_t span = static_cast<uint64_t>(config_.pooling_max - config_.pooling_min + 1);
    CounterRng rng(HashKey(config_.seed, kPoolingStream, sample, table));
    return config_.pooling_min + static_cast<int64_t>(rng.NextBelow(span));
  }

  // Writes sample `sample` (epoch position) into row `s` of the batch.
  void GenerateSample(int64_t sample, int32_t s, Batch* batch) const {
    const int tables = schema_.num_tables();
    const int32_t count = batch->num_samples;
    double logit = -1.1;  // about a 25% click rate, as in Criteo
    for (int c = 0; c < config_.dense; ++c) {
      const double z = Gaussian(HashKey(config_.seed, kDenseStream, sample, c));
      // Shaped like Criteo's transformed counts: log(1 + floor(lognormal)).
      const double value = std::log1p(std::floor(std::exp(1.5 * z + 1.0)));
      batch->dense[static_cast<size_t>(s) * config_.dense + c] = static_cast<float>(value);
      logit += dense_weights_[c] * (value - 1.3);
    }
    for (int t = 0; t < tables; ++t) {
      const int64_t rows = schema_.table_rows[t];
      const int64_t begin = batch->offsets[static_cast<size_t>(t) * count + s];
      const int64_t end = batch->offsets[static_cast<size_t>(t) * count + s + 1];
      double effect = 0;
      for (int64_t k = begin; k < end; ++k) {
        CounterRng rng(
            HashKey(config_.seed, kIdStream, sample, (uint64_t{1} << 32) * t + (k - begin)));
        int64_t rank = samplers_[t].Sample(rng);
        if (config_.drift > 0) rank = (rank + sample / config_.drift) % rows;
        const int64_t id = permutations_[t](rank);
        batch->ids[k] = id;
        effect += UnitDouble(HashKey(config_.seed, kEffectStream, t, id)) - 0.5;
      }
      if (end > begin) logit += effect / static_cast<double>(end - begin);
    }
    const double p = 1.0 / (1.0 + std::exp(-logit));
    batch->labels[s] = UnitDouble(HashKey(config_.seed, kLabelStream, sample)) < p ? 1.0f : 0.0f;
  }

  SyntheticConfig config_;
  Schema schema_;
  std::vector<ZipfSampler> samplers_;
  std::vector<Permutation> permutations_;
  std::vector<double> dense_weights_;
  int64_t samples_per_epoch_ = 0;
  int64_t position_ = 0;       // within the epoch
  int64_t stream_offset_ = 0;  // samples of previous epochs
  int64_t samples_returned_ = 0;
};

absl::StatusOr<int64_t> ParseInt(const std::string& key, const std::string& value) {
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic: ", key, "=", Excerpt(value), " is not an integer"));
  }
  return parsed;
}

// Sum of k^-alpha for k = 1..n: exact up to a cut-off, Euler-Maclaurin beyond it.
double GeneralizedHarmonic(int64_t n, double alpha) {
  constexpr int64_t kExact = 100000;
  double sum = 0;
  const int64_t exact = std::min(n, kExact);
  for (int64_t k = exact; k >= 1; --k) sum += std::pow(static_cast<double>(k), -alpha);
  if (n <= kExact) return sum;
  const double m = static_cast<double>(kExact);
  const double x = static_cast<double>(n);
  auto f = [&](double v) { return std::pow(v, -alpha); };
  auto df = [&](double v) { return -alpha * std::pow(v, -alpha - 1); };
  const double integral = std::abs(alpha - 1.0) < 1e-12
                              ? std::log(x / m)
                              : (std::pow(x, 1 - alpha) - std::pow(m, 1 - alpha)) / (1 - alpha);
  // sum_{k=m+1}^{n} f(k) = integral_m^n f + (f(n) - f(m)) / 2 + (f'(n) - f'(m)) / 12 + ...
  return sum + integral + (f(x) - f(m)) / 2 + (df(x) - df(m)) / 12;
}

}  // namespace

absl::StatusOr<SyntheticConfig> ParseSyntheticConfig(const std::string& spec) {
  SyntheticConfig config;
  bool explicit_rows = false;
  bool explicit_tables = false;
  int tables = static_cast<int>(CriteoKaggleTableRows().size());
  double scale = 1.0;
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    // Spaces around keys and values are layout ("samples=100, tables=4"), not part of them.
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    for (std::string& part : kv) absl::StripAsciiWhitespace(&part);
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic: '", Excerpt(item),
                       "' is not key=value (keys: samples, tables, rows, "
                       "scale, alpha, pooling, dense, drift, seed)"));
    }
    const std::string& key = kv[0];
    const std::string& value = kv[1];
    // A key given twice is a mistake (which one was meant?), not "the last one wins".
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic: '", Excerpt(key), "' is given twice"));
    }
    if (key == "samples") {
      ASSIGN_OR_RETURN(config.samples, ParseInt(key, value));
      if (config.samples < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: samples=", Excerpt(value), " must be >= 0"));
      }
    } else if (key == "tables") {
      ASSIGN_OR_RETURN(const int64_t k, ParseInt(key, value));
      if (k < 1 || k > static_cast<int64_t>(CriteoKaggleTableRows().size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: tables=", Excerpt(value), " must be in [1, ",
                         CriteoKaggleTableRows().size(), "] (use rows=a/b/c for other shapes)"));
      }
      tables = static_cast<int>(k);
      explicit_tables = true;
    } else if (key == "rows") {
      config.table_rows.clear();
      for (absl::string_view part : absl::StrSplit(value, '/')) {
        if (part.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("synthetic: rows=", Excerpt(value), " has an empty entry (rows=a/b/c)"));
        }
        ASSIGN_OR_RETURN(const int64_t rows, ParseInt(key, std::string(part)));
        if (rows < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("synthetic: rows=", Excerpt(value), ": every table needs >= 1 row"));
        }
        config.table_rows.push_back(rows);
      }
      explicit_rows = true;
    } else if (key == "scale") {
      if (!ParseDecimalDouble(value, &scale) || !(scale > 0) || !std::isfinite(scale)) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: scale=", Excerpt(value), " must be a finite positive number"));
      }
    } else if (key == "alpha") {
      if (!ParseDecimalDouble(value, &config.alpha) || !(config.alpha > 0) || config.alpha > 10) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: alpha=", Excerpt(value), " must be a number in (0, 10]"));
      }
    } else if (key == "pooling") {
      const std::vector<std::string> range = absl::StrSplit(value, '-');
      if (range.size() > 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: pooling=", Excerpt(value), " must be P or MIN-MAX"));
      }
      // A leading '-' (pooling=-5) splits into an empty MIN: the whole value is named.
      int64_t first = 0, last = 0;
      if (!absl::SimpleAtoi(range[0], &first) ||
          (range.size() == 2 && !absl::SimpleAtoi(range[1], &last))) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: pooling=", Excerpt(value),
                         " must be P or MIN-MAX, integers with 0 <= MIN <= MAX <= 1024"));
      }
      if (range.size() == 1) last = first;
      if (first < 0 || last < first || last > 1024) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: pooling=", Excerpt(value), " needs 0 <= MIN <= MAX <= 1024"));
      }
      config.pooling_min = static_cast<int>(first);
      config.pooling_max = static_cast<int>(last);
    } else if (key == "dense") {
      ASSIGN_OR_RETURN(const int64_t d, ParseInt(key, value));
      if (d < 0 || d > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: dense=", Excerpt(value), " must be in [0, 4096]"));
      }
      config.dense = static_cast<int>(d);
    } else if (key == "drift") {
      ASSIGN_OR_RETURN(config.drift, ParseInt(key, value));
      if (config.drift < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic: drift=", Excerpt(value), " must be >= 0"));
      }
    } else if (key == "seed") {
      // The whole uint64 range, and only it (-1 is not 2^64 - 1).
      uint64_t seed = 0;
      if (value.empty() || value[0] == '-' || !absl::SimpleAtoi(value, &seed)) {
        return absl::InvalidArgumentError(absl::StrCat("synthetic: seed=", Excerpt(value),
                                                       " is not an integer in [0, 2^64 - 1]"));
      }
      config.seed = seed;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "synthetic: unknown key '", Excerpt(key),
          "' (keys: samples, tables, rows, scale, alpha, pooling, dense, drift, seed)"));
    }
  }
  if (!explicit_rows) {
    config.table_rows.assign(CriteoKaggleTableRows().begin(),
                             CriteoKaggleTableRows().begin() + tables);
  } else if (explicit_tables && static_cast<int>(config.table_rows.size()) != tables) {
    // tables=N with rows=R: N tables of R rows each; with rows=a/b/c the counts must agree.
    if (config.table_rows.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("synthetic: tables=", tables, " but rows= lists ", config.table_rows.size(),
                       " tables (give one count for all, or ", tables, ")"));
    }
    config.table_rows.assign(static_cast<size_t>(tables), config.table_rows[0]);
  }
  // Global row ids linearise every table: the total must stay far from the int64 range.
  constexpr double kMaxRows = 0x1p62;
  double total = 0;
  for (int64_t& rows : config.table_rows) {
    const double scaled = std::round(static_cast<double>(rows) * scale);
    total += scaled;
    if (!(total < kMaxRows)) {
      return absl::InvalidArgumentError(
          "synthetic: the tables hold more than 2^62 rows in all (lower rows= or scale=)");
    }
    if (scale != 1.0) rows = std::max<int64_t>(2, static_cast<int64_t>(scaled));
  }
  return config;
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenSynthetic(const SyntheticConfig& config,
                                                            const SourceOptions& options) {
  if (config.table_rows.empty()) return absl::InvalidArgumentError("synthetic: no tables");
  return std::unique_ptr<SampleSource>(new SyntheticSource(config, options));
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenSynthetic(const std::string& spec,
                                                            const SourceOptions& options) {
  ASSIGN_OR_RETURN(const SyntheticConfig config, ParseSyntheticConfig(spec));
  return OpenSynthetic(config, options);
}

double ZipfTopShare(int64_t rows, int64_t top_rows, double alpha) {
  if (rows <= 0) return 0.0;
  top_rows = std::clamp<int64_t>(top_rows, 0, rows);
  if (top_rows == 0) return 0.0;
  return GeneralizedHarmonic(top_rows, alpha) / GeneralizedHarmonic(rows, alpha);
}

}  // namespace bagpipe
