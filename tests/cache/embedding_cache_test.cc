// Specification of the embedding cache's CPU reference backend: every operation equals the
// naive loops of cache_test_util.h bit for bit on random inputs, results do not depend on the
// thread count, rows round-trip through records, the initializer matches core/row_init.h, and
// invalid input is rejected with a message naming the offending position.
#include "cache/embedding_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cache/cache_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tbb/global_control.h"
#include "tests/cache/cache_test_util.h"

namespace bagpipe {
namespace {

using cache_test::AllSlots;
using cache_test::BitEqual;
using cache_test::HostRows;
using cache_test::MakeRandomBatch;
using cache_test::RandomBatch;
using cache_test::RandomFloats;
using cache_test::RandomRecords;
using cache_test::ReadAll;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kCapacity = 293;  // not a power of two

OptimizerConfig Optimizer(OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  config.learning_rate = 0.05f;
  config.eps = 1e-6f;
  return config;
}

// A CPU cache whose every slot holds a random record.
std::unique_ptr<EmbeddingCache> RandomCache(int dim, OptimizerKind kind, uint64_t seed,
                                            int64_t capacity = kCapacity) {
  auto cache = EmbeddingCache::Create(DeviceContext::Cpu(), capacity, dim, Optimizer(kind));
  EXPECT_TRUE(cache.ok()) << cache.status();
  const int state = StateFloatsPerRow(kind, dim);
  const std::vector<float> records = RandomRecords(seed, capacity, dim, state);
  EXPECT_TRUE((*cache)->WriteRecords(AllSlots(capacity), records).ok());
  return std::move(cache).value();
}

// --- gather ----------------------------------------------------------------------------------

class GatherTest : public ::testing::TestWithParam<std::tuple<int, PoolingMode, bool>> {};

TEST_P(GatherTest, EqualsNaiveLoopsBitForBit) {
  const auto [dim, pooling, weighted] = GetParam();
  auto cache = RandomCache(dim, OptimizerKind::kSgd, 11 + dim);
  const RandomBatch batch =
      MakeRandomBatch(dim, /*tables=*/3, /*samples=*/37, /*max_bag=*/5, kCapacity, /*pool=*/120);
  std::vector<float> pooled(static_cast<size_t>(3) * 37 * dim, std::nanf(""));
  GatherOptions options;
  options.pooling = pooling;
  options.weights = weighted ? batch.weights.data() : nullptr;
  ASSERT_TRUE(
      cache->Gather(batch.slots.data(), batch.offsets.data(), 3, 37, pooled.data(), options).ok());
  const HostRows rows = ReadAll(*cache);
  EXPECT_TRUE(
      BitEqual(cache_test::NaiveGather(rows.values, dim, batch, pooling, weighted), pooled));
}

INSTANTIATE_TEST_SUITE_P(DimsPoolingsWeights, GatherTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 16, 64, 128),
                                            ::testing::Values(PoolingMode::kSum,
                                                              PoolingMode::kMean),
                                            ::testing::Bool()));

TEST(GatherSpecTest, EmptyBagsPoolToPositiveZero) {
  auto cache = RandomCache(8, OptimizerKind::kSgd, 1);
  const std::vector<int64_t> offsets(2 * 5 + 1, 0);  // 2 tables x 5 samples, all empty
  for (PoolingMode pooling : {PoolingMode::kSum, PoolingMode::kMean}) {
    std::vector<float> pooled(2 * 5 * 8, std::nanf(""));
    GatherOptions options;
    options.pooling = pooling;
    ASSERT_TRUE(cache->Gather(nullptr, offsets.data(), 2, 5, pooled.data(), options).ok());
    EXPECT_TRUE(BitEqual(std::vector<float>(pooled.size(), 0.0f), pooled));
  }
}

TEST(GatherSpecTest, SumsStartFromPositiveZero) {
  // Rows of -0.0: a sum that started from its first term would be -0.0.
  const int dim = 5;
  auto cache =
      *EmbeddingCache::Create(DeviceContext::Cpu(), 4, dim, Optimizer(OptimizerKind::kSgd));
  ASSERT_TRUE(cache->WriteRecords(AllSlots(4), std::vector<float>(4 * dim, -0.0f)).ok());
  const std::vector<SlotId> slots = {0, 1, 2};
  const std::vector<int64_t> offsets = {0, 2, 3};  // 1 table x 2 samples
  std::vector<float> pooled(2 * dim, std::nanf(""));
  ASSERT_TRUE(cache->Gather(slots.data(), offsets.data(), 1, 2, pooled.data()).ok());
  EXPECT_TRUE(BitEqual(std::vector<float>(2 * dim, 0.0f), pooled));
}

TEST(GatherSpecTest, OutputIsSampleMajorAndMeanDividesByBagLength) {
  // 2 tables x 2 samples, dim 1, rows hold their slot number.
  auto cache = *EmbeddingCache::Create(DeviceContext::Cpu(), 6, 1, Optimizer(OptimizerKind::kSgd));
  ASSERT_TRUE(cache->WriteRecords(AllSlots(6), {0, 1, 2, 3, 4, 5}).ok());
  // Bags (table-major): (t0,s0) = {1,2}, (t0,s1) = {3}, (t1,s0) = {}, (t1,s1) = {4,5,5}.
  const std::vector<SlotId> slots = {1, 2, 3, 4, 5, 5};
  const std::vector<int64_t> offsets = {0, 2, 3, 3, 6};
  std::vector<float> pooled(4);
  ASSERT_TRUE(cache->Gather(slots.data(), offsets.data(), 2, 2, pooled.data()).ok());
  // Sample-major: [s0 t0, s0 t1, s1 t0, s1 t1].
  EXPECT_EQ(pooled, (std::vector<float>{3, 0, 3, 14}));
  GatherOptions mean;
  mean.pooling = PoolingMode::kMean;
  ASSERT_TRUE(cache->Gather(slots.data(), offsets.data(), 2, 2, pooled.data(), mean).ok());
  // Mean pooling scales each row by the rounded 1 / length before adding (cache/pooling.h),
  // which is not always the rounded sum / length.
  const float third = 1.0f / 3.0f;
  const volatile float t4 = third * 4.0f, t5 = third * 5.0f;
  EXPECT_EQ(pooled, (std::vector<float>{1.5f, 0, 3, (0.0f + t4 + t5) + t5}));
}

// --- backward index and reduce ---------------------------------------------------------------

TEST(BackwardIndexTest, ListsEachRowsOccurrencesInOrderWithTheirPooledRowAndScale) {
  // 2 tables x 2 samples; unique rows: 0 = {j0, j3}, 1 = {j1, j2}, 2 = {j4}.
  const std::vector<int64_t> offsets = {0, 2, 3, 3, 5};
  const std::vector<uint32_t> unique_index = {0, 1, 1, 0, 2};
  BackwardIndex index;
  ASSERT_TRUE(
      index.Build(DeviceContext::Cpu(), offsets.data(), 2, 2, unique_index.data(), 5, 3).ok());
  EXPECT_FALSE(index.has_scales());
  EXPECT_EQ(index.scales(), nullptr);
  EXPECT_EQ(index.host_row_begin(), (std::vector<int64_t>{0, 2, 4, 5}));
  // Pooled rows (sample-major s * 2 + t): j0, j1 -> (t0,s0) = 0; j2 -> (t0,s1) = 2;
  // j3, j4 -> (t1,s1) = 3.
  EXPECT_EQ(index.host_pooled_rows(), (std::vector<int32_t>{0, 3, 0, 2, 3}));

  const std::vector<float> weights = {1, 2, 3, 4, 5};
  ASSERT_TRUE(index
                  .Build(DeviceContext::Cpu(), offsets.data(), 2, 2, unique_index.data(), 5, 3,
                         PoolingMode::kMean, weights.data())
                  .ok());
  ASSERT_TRUE(index.has_scales());
  // scale = weight / bag length, in the order of the lists above.
  EXPECT_EQ(index.host_scales(), (std::vector<float>{0.5f, 2.0f, 1.0f, 3.0f, 2.5f}));
}

TEST(BackwardIndexTest, RejectsInconsistentInputsAndStaysUnbuilt) {
  const auto cpu = DeviceContext::Cpu();
  BackwardIndex index;
  const std::vector<int64_t> offsets = {0, 2, 3};
  const std::vector<uint32_t> bad_unique = {0, 5, 1};
  absl::Status status = index.Build(cpu, offsets.data(), 1, 2, bad_unique.data(), 3, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("unique_index[1] = 5"));
  EXPECT_FALSE(index.built());

  const std::vector<uint32_t> unique = {0, 1, 1};
  const std::vector<int64_t> decreasing = {0, 3, 2, 3};
  status = index.Build(cpu, decreasing.data(), 1, 3, unique.data(), 3, 2);
  EXPECT_THAT(status.message(), HasSubstr("offsets decrease at bag 1"));
  const std::vector<int64_t> short_end = {0, 1, 2};
  status = index.Build(cpu, short_end.data(), 1, 2, unique.data(), 3, 2);
  EXPECT_THAT(status.message(), HasSubstr("offsets must run from 0 to num_ids = 3"));
  EXPECT_EQ(index.Build(cpu, offsets.data(), -1, 2, unique.data(), 3, 2).code(),
            absl::StatusCode::kInvalidArgument);
}

class ReduceTest : public ::testing::TestWithParam<std::tuple<int, PoolingMode, bool>> {};

// The CPU backend's row gradients of `batch` for random pooled gradients equal NaiveReduce's.
void ExpectReduceEqualsNaive(int dim, PoolingMode pooling, bool weighted,
                             const RandomBatch& batch) {
  auto cache = RandomCache(dim, OptimizerKind::kSgd, 3);
  const std::vector<float> pooled_grad = RandomFloats(
      dim, static_cast<size_t>(batch.num_tables) * batch.num_samples * dim, -1.0f, 1.0f);
  BackwardIndex index;
  ASSERT_TRUE(index
                  .Build(DeviceContext::Cpu(), batch.offsets.data(), batch.num_tables,
                         batch.num_samples, batch.unique_index.data(), batch.num_ids(),
                         batch.num_unique(), pooling, weighted ? batch.weights.data() : nullptr)
                  .ok());
  std::vector<float> grads(static_cast<size_t>(batch.num_unique()) * dim, std::nanf(""));
  ASSERT_TRUE(cache->ReduceGradients(index, pooled_grad.data(), grads.data()).ok());
  EXPECT_TRUE(BitEqual(cache_test::NaiveReduce(batch, pooled_grad, dim, pooling, weighted), grads));
}

TEST_P(ReduceTest, EqualsNaiveLoopsBitForBit) {
  const auto [dim, pooling, weighted] = GetParam();
  ExpectReduceEqualsNaive(dim, pooling, weighted,
                          MakeRandomBatch(100 + dim, 4, 29, 4, kCapacity, 60));
}

// Rows with hundreds of occurrences are summed in chunks of kReduceChunk, then the partials in
// chunk order (cache/cache_math.h).
TEST_P(ReduceTest, HotRowsSumInChunksBitForBit) {
  const auto [dim, pooling, weighted] = GetParam();
  const RandomBatch batch = MakeRandomBatch(7 + dim, 2, 400, 4, kCapacity, 3);
  std::vector<int64_t> occurrences(batch.num_unique(), 0);
  for (uint32_t u : batch.unique_index) ++occurrences[u];
  ASSERT_GT(*std::max_element(occurrences.begin(), occurrences.end()),
            4 * cache_math::kReduceChunk);
  ExpectReduceEqualsNaive(dim, pooling, weighted, batch);
}

INSTANTIATE_TEST_SUITE_P(DimsPoolingsWeights, ReduceTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 16, 64, 128),
                                            ::testing::Values(PoolingMode::kSum,
                                                              PoolingMode::kMean),
                                            ::testing::Bool()));

TEST(ReduceSpecTest, SumsStartFromPositiveZero) {
  auto cache = RandomCache(3, OptimizerKind::kSgd, 5);
  const std::vector<int64_t> offsets = {0, 1, 2};
  const std::vector<uint32_t> unique = {0, 0};
  BackwardIndex index;
  ASSERT_TRUE(index.Build(DeviceContext::Cpu(), offsets.data(), 1, 2, unique.data(), 2, 1).ok());
  const std::vector<float> pooled_grad(2 * 3, -0.0f);
  std::vector<float> grads(3, std::nanf(""));
  ASSERT_TRUE(cache->ReduceGradients(index, pooled_grad.data(), grads.data()).ok());
  EXPECT_TRUE(BitEqual(std::vector<float>(3, 0.0f), grads));
}

TEST(ReduceSpecTest, RejectsAnUnbuiltIndex) {
  auto cache = RandomCache(4, OptimizerKind::kSgd, 5);
  BackwardIndex index;
  std::vector<float> grads(4);
  EXPECT_EQ(cache->ReduceGradients(index, grads.data(), grads.data()).code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- optimizer apply -------------------------------------------------------------------------

class ApplyTest : public ::testing::TestWithParam<std::tuple<int, OptimizerKind>> {};

TEST_P(ApplyTest, EqualsNaiveLoopsBitForBit) {
  const auto [dim, kind] = GetParam();
  auto cache = RandomCache(dim, kind, 21);
  HostRows expected = ReadAll(*cache);
  // Three steps on overlapping slot sets, so state accumulates.
  for (int step = 0; step < 3; ++step) {
    const RandomBatch batch = MakeRandomBatch(step * 1000 + dim, 2, 40, 3, kCapacity, 150);
    const std::vector<float> grads =
        RandomFloats(step + 7, static_cast<size_t>(batch.num_unique()) * dim, -2.0f, 2.0f);
    ASSERT_TRUE(cache->Apply(batch.unique_slots.data(), grads.data(), batch.num_unique()).ok());
    cache_test::NaiveApply(Optimizer(kind), dim, batch.unique_slots, {}, grads, &expected);
  }
  const HostRows actual = ReadAll(*cache);
  EXPECT_TRUE(BitEqual(expected.values, actual.values));
  EXPECT_TRUE(BitEqual(expected.state, actual.state));
}

TEST_P(ApplyTest, IndexedTakesGradientRowsByIndex) {
  const auto [dim, kind] = GetParam();
  auto cache = RandomCache(dim, kind, 22);
  HostRows expected = ReadAll(*cache);
  const std::vector<SlotId> slots = {7, 3, 250, 0};
  const std::vector<int32_t> grad_rows = {5, 0, 2, 5};  // rows may repeat, slots may not
  const std::vector<float> grads = RandomFloats(9, static_cast<size_t>(6) * dim, -1.0f, 1.0f);
  ASSERT_TRUE(cache->ApplyIndexed(slots.data(), grad_rows.data(), grads.data(), 4).ok());
  cache_test::NaiveApply(Optimizer(kind), dim, slots, grad_rows, grads, &expected);
  const HostRows actual = ReadAll(*cache);
  EXPECT_TRUE(BitEqual(expected.values, actual.values));
  EXPECT_TRUE(BitEqual(expected.state, actual.state));
}

INSTANTIATE_TEST_SUITE_P(DimsOptimizers, ApplyTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 16, 64, 128),
                                            ::testing::Values(OptimizerKind::kSgd,
                                                              OptimizerKind::kAdagrad,
                                                              OptimizerKind::kRowwiseAdagrad)));

TEST(ApplySpecTest, RowwiseSquareSumIsTheMeanOfSquaresUpToRounding) {
  // The documented tree order is a valid evaluation of mean(g * g).
  const int dim = 100;
  auto cache = *EmbeddingCache::Create(DeviceContext::Cpu(), 1, dim,
                                       Optimizer(OptimizerKind::kRowwiseAdagrad));
  const std::vector<float> grads = RandomFloats(3, dim, -1.0f, 1.0f);
  double mean_square = 0;
  for (float g : grads) mean_square += static_cast<double>(g) * g;
  mean_square /= dim;
  const SlotId slot = 0;
  ASSERT_TRUE(cache->Apply(&slot, grads.data(), 1).ok());
  const HostRows rows = ReadAll(*cache);
  EXPECT_NEAR(rows.state[0], mean_square, 1e-6 * mean_square);
}

TEST(ApplySpecTest, AdagradWithZeroGradientOnZeroStateLeavesTheRow) {
  auto cache =
      *EmbeddingCache::Create(DeviceContext::Cpu(), 2, 4, Optimizer(OptimizerKind::kAdagrad));
  ASSERT_TRUE(cache->WriteRecords({1}, {1, 2, 3, 4, 0, 0, 0, 0}).ok());
  const SlotId slot = 1;
  const std::vector<float> zero(4, 0.0f);
  ASSERT_TRUE(cache->Apply(&slot, zero.data(), 1).ok());
  EXPECT_EQ(*cache->ReadRecords({1}), (std::vector<float>{1, 2, 3, 4, 0, 0, 0, 0}));
}

// --- determinism -----------------------------------------------------------------------------

// Gather, reduce and apply for a few steps; returns pooled outputs, gradients and final rows.
std::vector<float> RunSteps(OptimizerKind kind, int dim) {
  auto cache = RandomCache(dim, kind, 77, /*capacity=*/2000);
  std::vector<float> trace;
  for (int step = 0; step < 3; ++step) {
    const RandomBatch batch = MakeRandomBatch(500 + step, 8, 300, 6, 2000, 1500);
    std::vector<float> pooled(static_cast<size_t>(8) * 300 * dim);
    GatherOptions options;
    options.pooling = PoolingMode::kMean;
    options.weights = batch.weights.data();
    EXPECT_TRUE(
        cache->Gather(batch.slots.data(), batch.offsets.data(), 8, 300, pooled.data(), options)
            .ok());
    BackwardIndex index;
    EXPECT_TRUE(index
                    .Build(DeviceContext::Cpu(), batch.offsets.data(), 8, 300,
                           batch.unique_index.data(), batch.num_ids(), batch.num_unique(),
                           PoolingMode::kMean, batch.weights.data())
                    .ok());
    std::vector<float> grads(static_cast<size_t>(batch.num_unique()) * dim);
    EXPECT_TRUE(cache->ReduceGradients(index, pooled.data(), grads.data()).ok());
    EXPECT_TRUE(cache->Apply(batch.unique_slots.data(), grads.data(), batch.num_unique()).ok());
    trace.insert(trace.end(), pooled.begin(), pooled.end());
    trace.insert(trace.end(), grads.begin(), grads.end());
  }
  const HostRows rows = ReadAll(*cache);
  trace.insert(trace.end(), rows.values.begin(), rows.values.end());
  trace.insert(trace.end(), rows.state.begin(), rows.state.end());
  return trace;
}

TEST(DeterminismTest, RunsAreBitIdenticalWhateverTheThreadCount) {
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    SCOPED_TRACE(std::string(OptimizerName(kind)));
    const std::vector<float> first = RunSteps(kind, 20);
    EXPECT_TRUE(BitEqual(first, RunSteps(kind, 20)));
    tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    EXPECT_TRUE(BitEqual(first, RunSteps(kind, 20)));
  }
}

// --- fill, extract, host accessors -----------------------------------------------------------

TEST(RecordTest, FillThenExtractRoundTripsValuesAndState) {
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    for (int dim : {1, 3, 4, 64}) {
      SCOPED_TRACE(absl::StrFormat("%s dim %d", OptimizerName(kind), dim));
      auto cache = *EmbeddingCache::Create(DeviceContext::Cpu(), 50, dim, Optimizer(kind));
      const int record = cache->record_floats();
      EXPECT_EQ(record, RecordFloats(kind, dim));
      const std::vector<SlotId> slots = {49, 0, 17, 3};
      const std::vector<float> records = RandomRecords(dim, 4, dim, record - dim);
      ASSERT_TRUE(cache->Fill(slots.data(), records.data(), 4).ok());
      // Extract in another order, with a repeat.
      const std::vector<SlotId> again = {3, 49, 3};
      std::vector<float> out(3 * record);
      ASSERT_TRUE(cache->Extract(again.data(), 3, out.data()).ok());
      std::vector<float> expected;
      for (int k : {3, 0, 3}) {
        expected.insert(expected.end(), records.begin() + k * record,
                        records.begin() + (k + 1) * record);
      }
      EXPECT_TRUE(BitEqual(expected, out));
      // Untouched slots keep their zero fill.
      EXPECT_TRUE(BitEqual(std::vector<float>(record, 0.0f), *cache->ReadRecords({1})));
    }
  }
}

TEST(RecordTest, RawStorageIsSlotMajor) {
  auto cache = *EmbeddingCache::Create(DeviceContext::Cpu(), 3, 2,
                                       Optimizer(OptimizerKind::kRowwiseAdagrad));
  ASSERT_TRUE(cache->WriteRecords({2}, {7, 8, 9}).ok());
  EXPECT_EQ(cache->values()[4], 7);
  EXPECT_EQ(cache->values()[5], 8);
  EXPECT_EQ(cache->state()[2], 9);
  EXPECT_EQ(cache->bytes(), (3 * 2 + 3) * sizeof(float));
  auto sgd = *EmbeddingCache::Create(DeviceContext::Cpu(), 3, 2, Optimizer(OptimizerKind::kSgd));
  EXPECT_EQ(sgd->state(), nullptr);
}

// --- initialisation --------------------------------------------------------------------------

TEST(InitializeTest, MatchesRowInitializerBitForBitAndStaysInRange) {
  const std::vector<int64_t> tables = {10, 1000, 1, 50};
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    const int dim = 7;
    const RowInitializer init(/*seed=*/42, dim, StateFloatsPerRow(kind, dim),
                              /*initial_accumulator=*/0.25f, tables);
    auto cache = *EmbeddingCache::Create(DeviceContext::Cpu(), 1061, dim, Optimizer(kind));
    // device mode: slot = RowId for every row of every table.
    ASSERT_TRUE(cache->InitializeRows(init, 0, 1061).ok());
    const auto records = *cache->ReadRecords(AllSlots(1061));
    std::vector<float> expected(records.size());
    for (RowId row = 0; row < 1061; ++row)
      init.Init(row, expected.data() + row * init.record_floats());
    EXPECT_TRUE(BitEqual(expected, records));
    for (RowId row = 0; row < 1061; ++row) {
      const float scale = init.table_scales()[init.TableOf(row)];
      for (int c = 0; c < dim; ++c) {
        const float v = records[row * init.record_floats() + c];
        ASSERT_LE(std::fabs(v), scale) << "row " << row;
      }
      for (int k = dim; k < init.record_floats(); ++k) {
        ASSERT_EQ(records[row * init.record_floats() + k], 0.25f);
      }
    }
  }
}

TEST(InitializeTest, SlotRangeTakesRowsFromFirstRowAndIsReproducible) {
  const RowInitializer init(9, 16, 0, 0.0f, {100000});
  auto a = *EmbeddingCache::Create(DeviceContext::Cpu(), 10, 16, Optimizer(OptimizerKind::kSgd));
  auto b = *EmbeddingCache::Create(DeviceContext::Cpu(), 10, 16, Optimizer(OptimizerKind::kSgd));
  ASSERT_TRUE(a->InitializeRows(init, 2, 5, /*first_row=*/777).ok());
  ASSERT_TRUE(b->InitializeRows(init, 2, 5, /*first_row=*/777).ok());
  EXPECT_TRUE(BitEqual(ReadAll(*a).values, ReadAll(*b).values));
  std::vector<float> expected(16);
  init.Init(779, expected.data());
  EXPECT_TRUE(BitEqual(expected, *a->ReadRecords({4})));
  EXPECT_TRUE(BitEqual(std::vector<float>(16, 0.0f), *a->ReadRecords({7})));  // not in range
  // Another seed gives other values.
  const RowInitializer other(10, 16, 0, 0.0f, {100000});
  ASSERT_TRUE(b->InitializeRows(other, 2, 5, 777).ok());
  EXPECT_NE(*a->ReadRecords({4}), *b->ReadRecords({4}));
}

TEST(InitializeTest, RejectsMismatchedInitializerAndRanges) {
  auto cache =
      *EmbeddingCache::Create(DeviceContext::Cpu(), 10, 4, Optimizer(OptimizerKind::kAdagrad));
  const RowInitializer wrong_state(1, 4, 1, 0.0f, {100});
  EXPECT_THAT(cache->InitializeRows(wrong_state, 0, 10).message(),
              HasSubstr("4 values + 1 state floats; the cache holds 4 + 4"));
  const RowInitializer init(1, 4, 4, 0.0f, {100});
  EXPECT_THAT(cache->InitializeRows(init, 8, 3).message(),
              HasSubstr("slots [8, 11) are outside the cache's 10 slots"));
  EXPECT_THAT(cache->InitializeRows(init, 0, 5, /*first_row=*/98).message(),
              HasSubstr("rows [98, 103) are outside the 100 rows"));
  EXPECT_TRUE(cache->InitializeRows(init, 0, 0).ok());
}

// --- validation ------------------------------------------------------------------------------

TEST(ValidationTest, SlotsOutsideTheCacheAreNamedWithTheCapacity) {
  auto cache = RandomCache(4, OptimizerKind::kSgd, 1, /*capacity=*/100);
  const std::vector<SlotId> slots = {3, 100, 5};
  const std::vector<int64_t> offsets = {0, 3};
  std::vector<float> buffer(3 * 4);
  const auto message = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_THAT(message(cache->Gather(slots.data(), offsets.data(), 1, 1, buffer.data())),
              AllOf(HasSubstr("Gather"), HasSubstr("slots[1] = 100"), HasSubstr("100 slots")));
  EXPECT_THAT(message(cache->Apply(slots.data(), buffer.data(), 3)),
              HasSubstr("Apply: slots[1] = 100"));
  EXPECT_THAT(message(cache->Fill(slots.data(), buffer.data(), 3)),
              HasSubstr("Fill: slots[1] = 100"));
  EXPECT_THAT(message(cache->Extract(slots.data(), 3, buffer.data())),
              HasSubstr("Extract: slots[1] = 100"));
  const std::vector<SlotId> negative = {-1};
  EXPECT_THAT(message(cache->Extract(negative.data(), 1, buffer.data())),
              HasSubstr("slots[0] = -1"));
  EXPECT_THAT(message(cache->ReadRecords({0, 100}).status()), HasSubstr("slots[1] = 100"));
  EXPECT_THAT(message(cache->WriteRecords({100}, {1, 2, 3, 4})), HasSubstr("slots[0] = 100"));
}

TEST(ValidationTest, RepeatedSlotsAreRejectedWhereRowsAreWritten) {
  auto cache = RandomCache(2, OptimizerKind::kSgd, 1, 100);
  const std::vector<SlotId> slots = {4, 9, 4};
  std::vector<float> buffer(3 * 2);
  EXPECT_THAT(cache->Apply(slots.data(), buffer.data(), 3).message(),
              HasSubstr("slot 4 appears at positions 0 and 2"));
  EXPECT_THAT(cache->Fill(slots.data(), buffer.data(), 3).message(),
              HasSubstr("slot 4 appears at positions 0 and 2"));
  EXPECT_THAT(cache->WriteRecords({1, 1}, {0, 0, 0, 0}).message(), HasSubstr("appears"));
  // Reads may repeat; a later distinct call is not confused by earlier marks.
  EXPECT_TRUE(cache->Extract(slots.data(), 3, buffer.data()).ok());
  EXPECT_TRUE(cache->Apply(slots.data(), buffer.data(), 2).ok());
  EXPECT_TRUE(cache->Apply(slots.data(), buffer.data(), 2).ok());
}

TEST(ValidationTest, OffsetsAndCountsAreChecked) {
  auto cache = RandomCache(2, OptimizerKind::kSgd, 1, 100);
  const std::vector<SlotId> slots = {1, 2, 3};
  std::vector<float> pooled(2 * 2);
  const std::vector<int64_t> decreasing = {0, 2, 1};
  EXPECT_THAT(cache->Gather(slots.data(), decreasing.data(), 1, 2, pooled.data()).message(),
              HasSubstr("offsets decrease at bag 1 (table 0, sample 1)"));
  const std::vector<int64_t> shifted = {1, 2, 3};
  EXPECT_THAT(cache->Gather(slots.data(), shifted.data(), 1, 2, pooled.data()).message(),
              HasSubstr("offsets[0] must be 0"));
  EXPECT_THAT(cache->Gather(slots.data(), shifted.data(), -1, 2, pooled.data()).message(),
              HasSubstr("negative shape"));
  EXPECT_THAT(cache->Apply(slots.data(), pooled.data(), -1).message(), HasSubstr("negative count"));
  const std::vector<int32_t> rows = {0, -2};
  EXPECT_THAT(cache->ApplyIndexed(slots.data(), rows.data(), pooled.data(), 2).message(),
              HasSubstr("grad_rows[1] = -2"));
  EXPECT_THAT(cache->WriteRecords({1}, {1, 2, 3}).message(), HasSubstr("need 2 record floats"));
  // Zero-sized calls are no-ops, even with null pointers.
  EXPECT_TRUE(cache->Apply(nullptr, nullptr, 0).ok());
  EXPECT_TRUE(cache->Fill(nullptr, nullptr, 0).ok());
  EXPECT_TRUE(cache->Gather(nullptr, nullptr, 0, 5, nullptr).ok());
}

TEST(ValidationTest, ModesDecideWhetherChecksRun) {
  auto cache = RandomCache(2, OptimizerKind::kSgd, 1, 100);
  EXPECT_TRUE(cache->validating());  // kAuto on CPU
  cache->set_validation(Validation::kOff);
  EXPECT_FALSE(cache->validating());
  cache->set_validation(Validation::kOn);
  EXPECT_TRUE(cache->validating());
}

TEST(CreateTest, RejectsBadShapesAndOptimizerSettings) {
  const auto cpu = DeviceContext::Cpu();
  EXPECT_THAT(EmbeddingCache::Create(cpu, 0, 4, Optimizer(OptimizerKind::kSgd)).status().message(),
              HasSubstr("capacity"));
  EXPECT_THAT(EmbeddingCache::Create(cpu, int64_t{1} << 31, 4, Optimizer(OptimizerKind::kSgd))
                  .status()
                  .message(),
              HasSubstr("capacity"));
  EXPECT_THAT(EmbeddingCache::Create(cpu, 4, 0, Optimizer(OptimizerKind::kSgd)).status().message(),
              HasSubstr("dim"));
  OptimizerConfig bad_lr = Optimizer(OptimizerKind::kSgd);
  bad_lr.learning_rate = -1;
  EXPECT_THAT(EmbeddingCache::Create(cpu, 4, 4, bad_lr).status().message(),
              HasSubstr("learning rate"));
  OptimizerConfig no_eps = Optimizer(OptimizerKind::kAdagrad);
  no_eps.eps = 0;
  EXPECT_THAT(EmbeddingCache::Create(cpu, 4, 4, no_eps).status().message(), HasSubstr("eps"));
  no_eps.kind = OptimizerKind::kSgd;  // SGD has no eps
  EXPECT_TRUE(EmbeddingCache::Create(cpu, 4, 4, no_eps).ok());
  EXPECT_EQ(EmbeddingCache::Create(nullptr, 4, 4, Optimizer(OptimizerKind::kSgd)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto cache = *EmbeddingCache::Create(cpu, 4, 4, Optimizer(OptimizerKind::kSgd));
  EXPECT_FALSE(cache->set_learning_rate(std::numeric_limits<float>::infinity()).ok());
  EXPECT_TRUE(cache->set_learning_rate(0.5f).ok());
  EXPECT_EQ(cache->optimizer().learning_rate, 0.5f);
}

TEST(CreateTest, AMillionRowsOfDim128AreZeroFilledAndReportTheirBytes) {
  auto cache = EmbeddingCache::Create(DeviceContext::Cpu(), 1'000'000, 128,
                                      Optimizer(OptimizerKind::kRowwiseAdagrad));
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->bytes(), size_t{1'000'000} * (128 + 1) * sizeof(float));
  const std::vector<SlotId> last = {999'999};
  EXPECT_TRUE(BitEqual(std::vector<float>(129, 0.0f), *(*cache)->ReadRecords(last)));
}

// --- pooling names ---------------------------------------------------------------------------

TEST(PoolingTest, NamesRoundTrip) {
  for (PoolingMode mode : {PoolingMode::kSum, PoolingMode::kMean}) {
    EXPECT_EQ(*ParsePoolingMode(PoolingName(mode)), mode);
  }
  EXPECT_EQ(*ParsePoolingMode("MEAN"), PoolingMode::kMean);
  EXPECT_THAT(ParsePoolingMode("max").status().message(), HasSubstr("unknown pooling 'max'"));
}

}  // namespace
}  // namespace bagpipe
