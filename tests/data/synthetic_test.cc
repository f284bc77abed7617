// Specification of the synthetic generator: seeded, streaming, reproducible, Zipf-shaped.
#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tbb/global_control.h"
#include "tests/data/data_testing.h"

namespace bagpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<SampleSource> Open(const std::string& spec) {
  auto source = OpenSynthetic(spec, SourceOptions{});
  EXPECT_TRUE(source.ok()) << source.status();
  return std::move(source).value();
}

TEST(SyntheticTest, DefaultShapeIsCriteoKaggle) {
  auto source = Open("samples=10");
  const Schema& schema = source->schema();
  EXPECT_EQ(schema.num_dense(), 13);
  ASSERT_EQ(schema.num_tables(), 26);
  EXPECT_EQ(schema.table_rows, CriteoKaggleTableRows());
  EXPECT_EQ(schema.table_names[0], "C1");
  EXPECT_EQ(schema.dense_names[12], "I13");
}

TEST(SyntheticTest, SameSeedSameSamplesWhateverTheChunkingAndThreads) {
  const std::string spec = "samples=3000,scale=0.001,pooling=0-3,seed=7";
  auto a = Open(spec);
  Batch first = ReadAll(*a, 3000);
  Batch second;
  {
    tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    auto b = Open(spec);
    second = ReadAll(*b, 77);
  }
  EXPECT_EQ(first, second);
  ASSERT_TRUE(first.Validate(a->schema()).ok());
  EXPECT_EQ(first.num_samples, 3000);
}

TEST(SyntheticTest, DifferentSeedsDiffer) {
  Batch a = ReadAll(*Open("samples=200,scale=0.01,seed=1"), 200);
  Batch b = ReadAll(*Open("samples=200,scale=0.01,seed=2"), 200);
  EXPECT_NE(a.ids, b.ids);
  EXPECT_NE(a.dense, b.dense);
}

TEST(SyntheticTest, RewindRepeatsTheEpochAndKeepsCountingPositions) {
  auto source = Open("samples=100,scale=0.01");
  Batch first = ReadAll(*source, 64);
  ASSERT_TRUE(source->Rewind().ok());
  Batch again = ReadAll(*source, 64);
  EXPECT_EQ(first.first_sample, 0);
  EXPECT_EQ(again.first_sample, 100);
  EXPECT_EQ(first.ids, again.ids);
  EXPECT_EQ(first.labels, again.labels);
  EXPECT_EQ(source->stats().samples, 200);
}

TEST(SyntheticTest, MaxSamplesCapsTheEpoch) {
  SourceOptions options;
  options.max_samples = 10;
  auto source = OpenSynthetic("samples=100,scale=0.01", options);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ(ReadAll(**source, 64).num_samples, 10);
}

TEST(SyntheticTest, PoolingRangeBoundsBagSizes) {
  Batch batch = ReadAll(*Open("samples=500,scale=0.01,pooling=2-5"), 500);
  bool saw_two = false, saw_five = false;
  for (int t = 0; t < batch.num_tables; ++t) {
    for (int s = 0; s < batch.num_samples; ++s) {
      const int64_t size = batch.bag_end(t, s) - batch.bag_begin(t, s);
      ASSERT_GE(size, 2);
      ASSERT_LE(size, 5);
      saw_two |= size == 2;
      saw_five |= size == 5;
    }
  }
  EXPECT_TRUE(saw_two && saw_five);
}

TEST(SyntheticTest, LabelsAreBinaryWithACriteoLikeRate) {
  Batch batch = ReadAll(*Open("samples=20000,scale=0.001"), 20000);
  double positives = 0;
  for (float label : batch.labels) {
    ASSERT_TRUE(label == 0.0f || label == 1.0f);
    positives += label;
  }
  const double rate = positives / batch.num_samples;
  EXPECT_GT(rate, 0.15);
  EXPECT_LT(rate, 0.40);
}

// Empirical share of accesses of the `top` most accessed ids of one table.
double EmpiricalTopShare(const std::vector<int64_t>& ids, int64_t top) {
  absl::flat_hash_map<int64_t, int64_t> counts;
  for (int64_t id : ids) ++counts[id];
  std::vector<int64_t> sorted;
  for (const auto& [id, count] : counts) sorted.push_back(count);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  int64_t sum = 0;
  for (int64_t k = 0; k < top && k < static_cast<int64_t>(sorted.size()); ++k) sum += sorted[k];
  return static_cast<double>(sum) / ids.size();
}

TEST(SyntheticTest, TopSharesMatchTheAnalyticZipfShares) {
  constexpr int64_t kRows = 20000;
  for (double alpha : {0.8, 1.05, 1.3}) {
    SCOPED_TRACE(alpha);
    auto source = Open("samples=400000,rows=20000,dense=0,alpha=" + std::to_string(alpha));
    Batch batch = ReadAll(*source, 1 << 16);
    for (int64_t id : batch.ids) ASSERT_LT(id, kRows);
    for (double fraction : {0.01, 0.10}) {
      const int64_t top = static_cast<int64_t>(kRows * fraction);
      EXPECT_NEAR(EmpiricalTopShare(batch.ids, top), ZipfTopShare(kRows, top, alpha), 0.01)
          << "top " << fraction * 100 << "%";
    }
  }
}

TEST(SyntheticTest, HotRowsAreSpreadOverTheTable) {
  // The rank -> id permutation scatters the hottest rows instead of putting them at 0, 1, 2...
  Batch batch = ReadAll(*Open("samples=20000,rows=100000,dense=0,alpha=1.2"), 20000);
  absl::flat_hash_map<int64_t, int64_t> counts;
  for (int64_t id : batch.ids) ++counts[id];
  std::vector<std::pair<int64_t, int64_t>> by_count(counts.begin(), counts.end());
  std::sort(by_count.begin(), by_count.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  int low_ids = 0;
  for (int k = 0; k < 10; ++k) low_ids += by_count[k].first < 1000;
  EXPECT_LE(low_ids, 2);
}

TEST(SyntheticTest, DriftShiftsPopularityOverTime) {
  auto hottest = [](const Batch& batch) {
    absl::flat_hash_map<int64_t, int64_t> counts;
    for (int64_t id : batch.ids) ++counts[id];
    return std::max_element(counts.begin(), counts.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  };
  auto source = Open("samples=40000,rows=1000,dense=0,alpha=1.5,drift=10000");
  Batch early, late;
  ASSERT_TRUE(source->Read(10000, &early).ok());
  ASSERT_TRUE(source->Read(20000, &late).ok());  // samples 10000..29999
  ASSERT_TRUE(source->Read(10000, &late).ok());  // samples 30000..39999: 3 ranks rotated
  EXPECT_NE(hottest(early), hottest(late));
  auto steady = Open("samples=40000,rows=1000,dense=0,alpha=1.5");
  Batch steady_early, steady_late;
  ASSERT_TRUE(steady->Read(10000, &steady_early).ok());
  ASSERT_TRUE(steady->Read(20000, &steady_late).ok());
  ASSERT_TRUE(steady->Read(10000, &steady_late).ok());
  EXPECT_EQ(hottest(steady_early), hottest(steady_late));
}

TEST(SyntheticTest, ZipfTopShareAgreesWithDirectSums) {
  for (double alpha : {0.7, 1.0, 1.2}) {
    const int64_t rows = 300000;
    double total = 0, top = 0;
    for (int64_t k = 1; k <= rows; ++k) {
      const double term = std::pow(static_cast<double>(k), -alpha);
      total += term;
      if (k <= 3000) top += term;
    }
    EXPECT_NEAR(ZipfTopShare(rows, 3000, alpha), top / total, 1e-9) << alpha;
  }
  EXPECT_EQ(ZipfTopShare(100, 100, 1.1), 1.0);
  EXPECT_EQ(ZipfTopShare(100, 0, 1.1), 0.0);
}

TEST(SyntheticTest, BadSpecsNameTheProblem) {
  struct Case {
    std::string spec;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{{"alpha=-1", "alpha=-1"},
                                         {"alpha=abc", "alpha=abc"},
                                         {"tables=99", "tables=99"},
                                         {"rows=10/0", ">= 1 row"},
                                         {"pooling=5-2", "pooling=5-2"},
                                         {"pooling=-5", "pooling=-5 must be P or MIN-MAX"},
                                         {"pooling=2-x", "pooling=2-x must be P or MIN-MAX"},
                                         {"colour=blue", "unknown key 'colour'"},
                                         {"samples", "not key=value"},
                                         {"samples=10,samples=20", "'samples' is given twice"},
                                         {"rows=5//6", "rows=5//6 has an empty entry"},
                                         {"rows=5/", "rows=5/ has an empty entry"},
                                         {"tables=4,rows=10/20", "tables=4 but rows= lists 2"}}) {
    auto config = ParseSyntheticConfig(c.spec);
    ASSERT_FALSE(config.ok()) << c.spec;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.message)) << c.spec;
  }
}

// Caught by the specs fuzz harness: errors echoed keys and values whole and unescaped, so a
// spec holding control bytes or megabytes gave an unreadable, unbounded error line.
TEST(SyntheticTest, EchoedKeysAndValuesAreEscapedAndCut) {
  const std::string long_value = "1" + std::string(100000, '\x01');
  using namespace std::string_literals;
  for (const std::string& spec : std::vector<std::string>{
           "alpha=" + long_value, "samples=" + long_value, "rows=5/" + long_value,
           "pooling=" + long_value, "scale=" + long_value, "col\nour\0=1"s, "\xef\xbb\xbfsamples"s,
           "tables=\r99"s, "samples=1,samples\t=2"s}) {
    auto config = ParseSyntheticConfig(spec);
    ASSERT_FALSE(config.ok()) << spec.substr(0, 40);
    const std::string message(config.status().message());
    EXPECT_LT(message.size(), 300u) << message;
    for (const char c : message) {
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int{c} << " in " << message;
    }
  }
  EXPECT_THAT(std::string(ParseSyntheticConfig("col\nour=1").status().message()),
              HasSubstr("unknown key 'col\\nour'"));
  EXPECT_THAT(std::string(ParseSyntheticConfig("alpha=" + long_value).status().message()),
              HasSubstr("alpha=1\\x01\\x01"));
  EXPECT_THAT(std::string(ParseSyntheticConfig("alpha=" + long_value).status().message()),
              HasSubstr("(100001 bytes)"));
}

TEST(SyntheticTest, RangeErrorsNameTheKeyAndValue) {
  struct Case {
    std::string spec;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{{"samples=-5", "samples=-5 must be >= 0"},
                                         {"rows=10/0", "rows=10/0: every table needs >= 1 row"},
                                         {"dense=5000", "dense=5000 must be in [0, 4096]"},
                                         {"drift=-1", "drift=-1 must be >= 0"},
                                         {"scale=inf", "scale=inf must be a finite"},
                                         {"scale=1e999", "scale=1e999 must be a finite"},
                                         {"scale=nan", "scale=nan must be a finite"}}) {
    auto config = ParseSyntheticConfig(c.spec);
    ASSERT_FALSE(config.ok()) << c.spec;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.message)) << c.spec;
  }
}

TEST(SyntheticTest, SpacesAroundKeysAndValuesAreLayout) {
  auto spaced = ParseSyntheticConfig(" samples = 100, tables=2 ,seed= 3 ");
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_EQ(spaced->samples, 100);
  EXPECT_EQ(spaced->table_rows.size(), 2u);
  EXPECT_EQ(spaced->seed, 3u);
  EXPECT_THAT(std::string(ParseSyntheticConfig("samples=1, samples=2").status().message()),
              HasSubstr("'samples' is given twice"));
  EXPECT_THAT(std::string(ParseSyntheticConfig("samples= ,seed=1").status().message()),
              HasSubstr("not key=value"));
}

TEST(SyntheticTest, TablesWithOneRowCountMakesThatManyTablesOfIt) {
  auto config = ParseSyntheticConfig("tables=4,rows=2000");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->table_rows, ElementsAre(2000, 2000, 2000, 2000));
  config = ParseSyntheticConfig("rows=2000/500/5000/100,tables=4");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->table_rows, ElementsAre(2000, 500, 5000, 100));
  config = ParseSyntheticConfig("rows=2000");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->table_rows, ElementsAre(2000));
}

TEST(SyntheticTest, ScaleShrinksTablesButKeepsTwoRows) {
  auto config = ParseSyntheticConfig("scale=0.0001");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->table_rows[2], 1013);  // 10131227 * 1e-4
  EXPECT_EQ(config->table_rows[8], 2);     // 3 rows -> at least 2
}

}  // namespace
}  // namespace bagpipe
