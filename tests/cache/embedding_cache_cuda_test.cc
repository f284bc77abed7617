// The CUDA backend against the CPU reference: every kernel runs on fresh random inputs on both
// backends and the results are compared with explicit tolerances (gather and reduce: relative
// 1e-5; optimizer apply: relative 1e-6); the initializer and record copies must match bit for
// bit. The header's stronger claim (same float operations in the same order, hence
// bit-identical results) is pinned separately, so a failure says which promise broke.
// Every test skips when no CUDA device is usable (CudaDeviceCount() == 0).
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_format.h"
#include "cache/embedding_cache.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/cache_test_util.h"

namespace bagpipe {
namespace {

using cache_test::AllSlots;
using cache_test::BitEqual;
using cache_test::Close;
using cache_test::HostRows;
using cache_test::MakeRandomBatch;
using cache_test::RandomBatch;
using cache_test::RandomFloats;
using cache_test::RandomRecords;
using cache_test::ReadAll;
using ::testing::HasSubstr;

constexpr double kGatherTolerance = 1e-5;
constexpr double kReduceTolerance = 1e-5;
constexpr double kApplyTolerance = 1e-6;
constexpr int64_t kCapacity = 4099;

OptimizerConfig Optimizer(OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  config.learning_rate = 0.05f;
  config.eps = 1e-6f;
  return config;
}

std::string Describe(int dim, PoolingMode pooling, bool weighted) {
  return absl::StrFormat("dim %d, %s pooling, %s", dim, PoolingName(pooling),
                         weighted ? "weighted" : "unweighted");
}

class CudaCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no usable CUDA device (" << CudaDeviceDescription(0) << ")";
    }
    auto context = DeviceContext::Cuda(0);
    ASSERT_TRUE(context.ok()) << context.status();
    cuda_ = *context;
  }

  // A CPU cache and a CUDA cache holding the same random records in every slot.
  struct Twins {
    std::unique_ptr<EmbeddingCache> cpu;
    std::unique_ptr<EmbeddingCache> cuda;
  };
  Twins MakeTwins(int dim, OptimizerKind kind, uint64_t seed, int64_t capacity = kCapacity,
                  CacheOptions options = {}) {
    Twins twins;
    auto cpu = EmbeddingCache::Create(cpu_, capacity, dim, Optimizer(kind));
    auto cuda = EmbeddingCache::Create(cuda_, capacity, dim, Optimizer(kind), options);
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    EXPECT_TRUE(cuda.ok()) << cuda.status();
    if (!cpu.ok() || !cuda.ok()) return twins;
    twins.cpu = std::move(cpu).value();
    twins.cuda = std::move(cuda).value();
    const auto records = RandomRecords(seed, capacity, dim, StateFloatsPerRow(kind, dim));
    EXPECT_TRUE(twins.cpu->WriteRecords(AllSlots(capacity), records).ok());
    EXPECT_TRUE(twins.cuda->WriteRecords(AllSlots(capacity), records).ok());
    return twins;
  }

  // A device copy of `host`, with `pad` leading floats (to misalign the data on purpose).
  template <typename T>
  DeviceArray<T> Upload(const std::vector<T>& host, size_t pad = 0) {
    auto array = DeviceArray<T>::Create(cuda_, std::max<size_t>(1, host.size() + pad));
    EXPECT_TRUE(array.ok()) << array.status();
    EXPECT_TRUE(
        cuda_->CopyToDevice(array->data() + pad, host.data(), host.size() * sizeof(T)).ok());
    return std::move(array).value();
  }
  DeviceArray<float> Zeros(size_t n) {
    auto array = DeviceArray<float>::Create(cuda_, std::max<size_t>(1, n));
    EXPECT_TRUE(array.ok()) << array.status();
    EXPECT_TRUE(cuda_->Zero(array->data(), array->bytes()).ok());
    return std::move(array).value();
  }
  template <typename T>
  std::vector<T> Download(const T* device, size_t n, Stream stream = Stream::kCompute) {
    std::vector<T> host(n);
    EXPECT_TRUE(cuda_->CopyToHost(host.data(), device, n * sizeof(T), stream).ok());
    EXPECT_TRUE(cuda_->Synchronize(stream).ok());
    return host;
  }

  // Gather on both backends; returns {cpu, cuda} pooled outputs. `pad` misaligns the CUDA
  // output by that many floats.
  std::pair<std::vector<float>, std::vector<float>> GatherBoth(Twins& twins,
                                                               const RandomBatch& batch,
                                                               PoolingMode pooling, bool weighted,
                                                               size_t pad = 0) {
    const int dim = twins.cpu->dim();
    const size_t out = static_cast<size_t>(batch.num_tables) * batch.num_samples * dim;
    GatherOptions options;
    options.pooling = pooling;
    // Both outputs start as NaN, so that an output row a backend leaves unwritten (an empty
    // bag skipped, say) shows.
    const float unset = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> cpu_pooled(out, unset);
    options.weights = weighted ? batch.weights.data() : nullptr;
    EXPECT_TRUE(twins.cpu
                    ->Gather(batch.slots.data(), batch.offsets.data(), batch.num_tables,
                             batch.num_samples, cpu_pooled.data(), options)
                    .ok());
    auto slots = Upload(batch.slots);
    auto offsets = Upload(batch.offsets);
    auto weights = Upload(batch.weights);
    auto pooled = Upload(std::vector<float>(out + pad, unset));
    options.weights = weighted ? weights.data() : nullptr;
    const absl::Status status = twins.cuda->Gather(slots.data(), offsets.data(), batch.num_tables,
                                                   batch.num_samples, pooled.data() + pad, options);
    EXPECT_TRUE(status.ok()) << status;
    return {cpu_pooled, Download(pooled.data() + pad, out)};
  }

  // Row gradients of `batch` from random pooled gradients (seed `seed`), by both backends.
  std::pair<std::vector<float>, std::vector<float>> ReduceBoth(Twins& twins,
                                                               const RandomBatch& batch,
                                                               PoolingMode pooling, bool weighted,
                                                               uint64_t seed) {
    const int dim = twins.cpu->dim();
    const int tables = batch.num_tables;
    const int samples = batch.num_samples;
    const std::vector<float> pooled_grad =
        RandomFloats(seed, static_cast<size_t>(tables) * samples * dim, -1.0f, 1.0f);
    const float* weights = weighted ? batch.weights.data() : nullptr;
    BackwardIndex cpu_index, cuda_index;
    EXPECT_TRUE(cpu_index
                    .Build(cpu_, batch.offsets.data(), tables, samples, batch.unique_index.data(),
                           batch.num_ids(), batch.num_unique(), pooling, weights)
                    .ok());
    EXPECT_TRUE(cuda_index
                    .Build(cuda_, batch.offsets.data(), tables, samples, batch.unique_index.data(),
                           batch.num_ids(), batch.num_unique(), pooling, weights)
                    .ok());
    const size_t grad_floats = static_cast<size_t>(batch.num_unique()) * dim;
    std::vector<float> cpu_grads(grad_floats);
    EXPECT_TRUE(twins.cpu->ReduceGradients(cpu_index, pooled_grad.data(), cpu_grads.data()).ok());
    auto device_pooled = Upload(pooled_grad);
    auto device_grads = Zeros(grad_floats);
    EXPECT_TRUE(
        twins.cuda->ReduceGradients(cuda_index, device_pooled.data(), device_grads.data()).ok());
    return {cpu_grads, Download(device_grads.data(), grad_floats)};
  }

  std::shared_ptr<DeviceContext> cpu_ = DeviceContext::Cpu();
  std::shared_ptr<DeviceContext> cuda_;
};

// --- gather ----------------------------------------------------------------------------------

class CudaGatherTest : public CudaCacheTest,
                       public ::testing::WithParamInterface<std::tuple<int, PoolingMode, bool>> {};

TEST_P(CudaGatherTest, MatchesTheCpuReference) {
  const auto [dim, pooling, weighted] = GetParam();
  SCOPED_TRACE(Describe(dim, pooling, weighted));
  Twins twins = MakeTwins(dim, OptimizerKind::kSgd, 31 + dim);
  // Bags of 0..9 ids (long bags exercise the unrolled loop and its tail).
  const RandomBatch batch = MakeRandomBatch(7 * dim, 5, 301, 9, kCapacity, 3000);
  const auto [cpu, cuda] = GatherBoth(twins, batch, pooling, weighted);
  EXPECT_TRUE(Close(cpu, cuda, kGatherTolerance));
}

TEST_P(CudaGatherTest, MatchesTheCpuReferenceWithAMisalignedOutput) {
  // A pooled buffer off the 16-byte grid takes the scalar path even when dim % 4 == 0.
  const auto [dim, pooling, weighted] = GetParam();
  SCOPED_TRACE(Describe(dim, pooling, weighted));
  Twins twins = MakeTwins(dim, OptimizerKind::kSgd, 32 + dim);
  const RandomBatch batch = MakeRandomBatch(8 * dim, 3, 65, 4, kCapacity, 500);
  const auto [cpu, cuda] = GatherBoth(twins, batch, pooling, weighted, /*pad=*/1);
  EXPECT_TRUE(Close(cpu, cuda, kGatherTolerance));
}

INSTANTIATE_TEST_SUITE_P(DimsPoolingsWeights, CudaGatherTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 16, 64, 128, 200),
                                            ::testing::Values(PoolingMode::kSum,
                                                              PoolingMode::kMean),
                                            ::testing::Bool()));

TEST_F(CudaCacheTest, OneHotCriteoShapedGatherMatchesTheCpuReference) {
  Twins twins = MakeTwins(128, OptimizerKind::kSgd, 5, /*capacity=*/100000);
  const RandomBatch batch = MakeRandomBatch(26, 26, 2048, 1, 100000, 60000);
  const auto [cpu, cuda] = GatherBoth(twins, batch, PoolingMode::kSum, false);
  EXPECT_TRUE(Close(cpu, cuda, kGatherTolerance));
}

TEST_F(CudaCacheTest, EmptyBagsGiveZeros) {
  Twins twins = MakeTwins(8, OptimizerKind::kSgd, 5);
  RandomBatch batch;
  batch.num_tables = 2;
  batch.num_samples = 9;
  batch.offsets.assign(19, 0);
  const auto [cpu, cuda] = GatherBoth(twins, batch, PoolingMode::kMean, false);
  EXPECT_TRUE(BitEqual(std::vector<float>(2 * 9 * 8, 0.0f), cpu));
  EXPECT_TRUE(BitEqual(std::vector<float>(2 * 9 * 8, 0.0f), cuda));
}

// --- reduce ----------------------------------------------------------------------------------

class CudaReduceTest : public CudaCacheTest,
                       public ::testing::WithParamInterface<std::tuple<int, PoolingMode, bool>> {};

TEST_P(CudaReduceTest, MatchesTheCpuReference) {
  const auto [dim, pooling, weighted] = GetParam();
  SCOPED_TRACE(Describe(dim, pooling, weighted));
  Twins twins = MakeTwins(dim, OptimizerKind::kSgd, 41);
  const RandomBatch batch = MakeRandomBatch(9 * dim, 4, 257, 7, kCapacity, 800);
  const auto [cpu, cuda] = ReduceBoth(twins, batch, pooling, weighted, dim + 1);
  EXPECT_TRUE(Close(cpu, cuda, kReduceTolerance));
}

// Rows with hundreds of occurrences: the CUDA backend sums their chunks in parallel, then the
// partials in chunk order, which must give the CPU reference's bits.
TEST_P(CudaReduceTest, HotRowsMatchTheCpuReferenceBitForBit) {
  const auto [dim, pooling, weighted] = GetParam();
  SCOPED_TRACE(Describe(dim, pooling, weighted));
  Twins twins = MakeTwins(dim, OptimizerKind::kSgd, 43);
  const RandomBatch batch = MakeRandomBatch(11 * dim, 3, 900, 5, kCapacity, 5);
  const auto [cpu, cuda] = ReduceBoth(twins, batch, pooling, weighted, dim + 2);
  EXPECT_TRUE(BitEqual(cpu, cuda));
}

INSTANTIATE_TEST_SUITE_P(DimsPoolingsWeights, CudaReduceTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 16, 64, 128, 200),
                                            ::testing::Values(PoolingMode::kSum,
                                                              PoolingMode::kMean),
                                            ::testing::Bool()));

TEST_F(CudaCacheTest, ReduceRejectsAnIndexBuiltForTheCpu) {
  Twins twins = MakeTwins(4, OptimizerKind::kSgd, 1);
  const std::vector<int64_t> offsets = {0, 1};
  const std::vector<uint32_t> unique = {0};
  BackwardIndex cpu_index;
  ASSERT_TRUE(cpu_index.Build(cpu_, offsets.data(), 1, 1, unique.data(), 1, 1).ok());
  auto buffer = Zeros(4);
  EXPECT_THAT(twins.cuda->ReduceGradients(cpu_index, buffer.data(), buffer.data()).message(),
              HasSubstr("built for the cpu backend"));
}

// --- apply -----------------------------------------------------------------------------------

class CudaApplyTest : public CudaCacheTest,
                      public ::testing::WithParamInterface<std::tuple<int, OptimizerKind>> {};

TEST_P(CudaApplyTest, MatchesTheCpuReferenceOverSeveralSteps) {
  const auto [dim, kind] = GetParam();
  SCOPED_TRACE(absl::StrFormat("dim %d, %s", dim, OptimizerName(kind)));
  Twins twins = MakeTwins(dim, kind, 51);
  for (int step = 0; step < 3; ++step) {
    const RandomBatch batch = MakeRandomBatch(step * 31 + dim, 4, 200, 3, kCapacity, 2500);
    const int n = batch.num_unique();
    const std::vector<float> grads =
        RandomFloats(step + 100 * dim, static_cast<size_t>(n) * dim, -2.0f, 2.0f);
    ASSERT_TRUE(twins.cpu->Apply(batch.unique_slots.data(), grads.data(), n).ok());
    auto slots = Upload(batch.unique_slots);
    auto device_grads = Upload(grads);
    ASSERT_TRUE(twins.cuda->Apply(slots.data(), device_grads.data(), n).ok());
  }
  // A permuted, indexed step.
  const std::vector<SlotId> slots = {9, 4000, 17, 0, 1234};
  const std::vector<int32_t> rows = {2, 0, 2, 1, 3};
  const std::vector<float> grads = RandomFloats(dim, static_cast<size_t>(4) * dim, -1.0f, 1.0f);
  ASSERT_TRUE(twins.cpu->ApplyIndexed(slots.data(), rows.data(), grads.data(), 5).ok());
  auto device_slots = Upload(slots);
  auto device_rows = Upload(rows);
  auto device_grads = Upload(grads);
  ASSERT_TRUE(
      twins.cuda->ApplyIndexed(device_slots.data(), device_rows.data(), device_grads.data(), 5)
          .ok());
  const HostRows cpu = ReadAll(*twins.cpu);
  const HostRows cuda = ReadAll(*twins.cuda);
  EXPECT_TRUE(Close(cpu.values, cuda.values, kApplyTolerance)) << "values";
  EXPECT_TRUE(Close(cpu.state, cuda.state, kApplyTolerance)) << "optimizer state";
}

INSTANTIATE_TEST_SUITE_P(DimsOptimizers, CudaApplyTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 16, 64, 128, 200),
                                            ::testing::Values(OptimizerKind::kSgd,
                                                              OptimizerKind::kAdagrad,
                                                              OptimizerKind::kRowwiseAdagrad)));

// --- bit identity and determinism ------------------------------------------------------------

// One training-like step (gather, reduce, apply) on a backend; returns everything it produced.
std::vector<float> Step(const std::shared_ptr<DeviceContext>& context, EmbeddingCache& cache,
                        const RandomBatch& batch) {
  const int dim = cache.dim();
  const size_t out = static_cast<size_t>(batch.num_tables) * batch.num_samples * dim;
  const size_t grad_floats = static_cast<size_t>(batch.num_unique()) * dim;
  auto array = [&](auto tag, size_t n) {
    using T = decltype(tag);
    return std::move(DeviceArray<T>::Create(context, std::max<size_t>(1, n))).value();
  };
  auto put = [&](auto& device, const auto& host) {
    EXPECT_TRUE(
        context->CopyToDevice(device.data(), host.data(), host.size() * sizeof(host[0])).ok());
  };
  auto slots = array(SlotId{}, batch.slots.size());
  auto offsets = array(int64_t{}, batch.offsets.size());
  auto weights = array(float{}, batch.weights.size());
  auto unique_slots = array(SlotId{}, batch.unique_slots.size());
  auto pooled = array(float{}, out);
  auto grads = array(float{}, grad_floats);
  put(slots, batch.slots);
  put(offsets, batch.offsets);
  put(weights, batch.weights);
  put(unique_slots, batch.unique_slots);
  GatherOptions options;
  options.pooling = PoolingMode::kMean;
  options.weights = weights.data();
  EXPECT_TRUE(cache
                  .Gather(slots.data(), offsets.data(), batch.num_tables, batch.num_samples,
                          pooled.data(), options)
                  .ok());
  BackwardIndex index;
  EXPECT_TRUE(index
                  .Build(context, batch.offsets.data(), batch.num_tables, batch.num_samples,
                         batch.unique_index.data(), batch.num_ids(), batch.num_unique(),
                         PoolingMode::kMean, batch.weights.data())
                  .ok());
  EXPECT_TRUE(cache.ReduceGradients(index, pooled.data(), grads.data()).ok());
  EXPECT_TRUE(cache.Apply(unique_slots.data(), grads.data(), batch.num_unique()).ok());
  std::vector<float> trace(out + grad_floats);
  EXPECT_TRUE(context->CopyToHost(trace.data(), pooled.data(), out * sizeof(float)).ok());
  EXPECT_TRUE(
      context->CopyToHost(trace.data() + out, grads.data(), grad_floats * sizeof(float)).ok());
  EXPECT_TRUE(context->Synchronize().ok());
  const HostRows rows = ReadAll(cache);
  trace.insert(trace.end(), rows.values.begin(), rows.values.end());
  trace.insert(trace.end(), rows.state.begin(), rows.state.end());
  return trace;
}

TEST_F(CudaCacheTest, KernelsAreBitIdenticalToTheCpuReference) {
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    for (int dim : {1, 3, 4, 16, 64, 128}) {
      SCOPED_TRACE(absl::StrFormat("%s, dim %d", OptimizerName(kind), dim));
      Twins twins = MakeTwins(dim, kind, 61 + dim);
      const RandomBatch batch = MakeRandomBatch(dim, 6, 150, 5, kCapacity, 2000);
      EXPECT_TRUE(BitEqual(Step(cpu_, *twins.cpu, batch), Step(cuda_, *twins.cuda, batch)));
    }
  }
}

TEST_F(CudaCacheTest, RunsAreBitIdentical) {
  for (OptimizerKind kind : {OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    SCOPED_TRACE(std::string(OptimizerName(kind)));
    const RandomBatch batch = MakeRandomBatch(3, 26, 1024, 3, kCapacity, 4000);
    Twins first = MakeTwins(64, kind, 71);
    Twins second = MakeTwins(64, kind, 71);
    EXPECT_TRUE(BitEqual(Step(cuda_, *first.cuda, batch), Step(cuda_, *second.cuda, batch)));
  }
}

// --- records, initialisation, validation -----------------------------------------------------

TEST_F(CudaCacheTest, FillOnTheCopyStreamAndExtractRoundTripBitForBit) {
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    for (int dim : {1, 3, 4, 64, 128}) {
      SCOPED_TRACE(absl::StrFormat("%s, dim %d", OptimizerName(kind), dim));
      Twins twins = MakeTwins(dim, kind, 81);
      const int record = twins.cuda->record_floats();
      const std::vector<SlotId> slots = {4098, 0, 77, 1000, 5};
      const std::vector<float> records = RandomRecords(dim + 5, 5, dim, record - dim);
      auto device_slots = Upload(slots);
      auto device_records = Upload(records);
      // The uploads ran on the compute stream: the copy stream's Fill waits for them.
      ASSERT_TRUE(cuda_->StreamWait(Stream::kCopy, Stream::kCompute).ok());
      ASSERT_TRUE(
          twins.cuda->Fill(device_slots.data(), device_records.data(), 5, Stream::kCopy).ok());
      ASSERT_TRUE(cuda_->StreamWait(Stream::kCompute, Stream::kCopy).ok());
      ASSERT_TRUE(twins.cpu->Fill(slots.data(), records.data(), 5).ok());
      const std::vector<SlotId> again = {77, 4098, 77, 5};
      auto device_again = Upload(again);
      auto out = Zeros(4 * record);
      ASSERT_TRUE(twins.cuda->Extract(device_again.data(), 4, out.data()).ok());
      std::vector<float> cpu_out(4 * record);
      ASSERT_TRUE(twins.cpu->Extract(again.data(), 4, cpu_out.data()).ok());
      EXPECT_TRUE(BitEqual(cpu_out, Download(out.data(), 4 * record)));
      EXPECT_TRUE(BitEqual(ReadAll(*twins.cpu).values, ReadAll(*twins.cuda).values));
      EXPECT_TRUE(BitEqual(ReadAll(*twins.cpu).state, ReadAll(*twins.cuda).state));
    }
  }
}

TEST_F(CudaCacheTest, InitializerKernelMatchesRowInitializerBitForBit) {
  const std::vector<int64_t> tables = {3, 10000, 1, 0, 777};
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad}) {
    for (int dim : {1, 3, 16, 128}) {
      SCOPED_TRACE(absl::StrFormat("%s, dim %d", OptimizerName(kind), dim));
      const RowInitializer init(1234, dim, StateFloatsPerRow(kind, dim), 0.1f, tables);
      const int64_t rows = 10781;
      auto cpu = *EmbeddingCache::Create(cpu_, rows, dim, Optimizer(kind));
      auto cuda = *EmbeddingCache::Create(cuda_, rows, dim, Optimizer(kind));
      ASSERT_TRUE(cpu->InitializeRows(init, 0, rows).ok());
      ASSERT_TRUE(cuda->InitializeRows(init, 0, rows).ok());
      EXPECT_TRUE(BitEqual(*cpu->ReadRecords(AllSlots(rows)), *cuda->ReadRecords(AllSlots(rows))));
      // A shifted range: slots 10..19 hold rows 5000..5009.
      ASSERT_TRUE(cuda->InitializeRows(init, 10, 10, /*first_row=*/5000).ok());
      std::vector<float> expected(init.record_floats());
      init.Init(5007, expected.data());
      EXPECT_TRUE(BitEqual(expected, *cuda->ReadRecords({17})));
    }
  }
}

TEST_F(CudaCacheTest, AMillionRowsOfDim128LiveOnTheDevice) {
  const RowInitializer init(5, 128, 1, 0.0f, {600000, 400000});
  auto cache =
      EmbeddingCache::Create(cuda_, 1'000'000, 128, Optimizer(OptimizerKind::kRowwiseAdagrad));
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->bytes(), size_t{1'000'000} * 129 * sizeof(float));
  ASSERT_TRUE((*cache)->InitializeRows(init, 0, 1'000'000).ok());
  for (RowId row : {RowId{0}, RowId{599999}, RowId{600000}, RowId{999999}}) {
    std::vector<float> expected(129);
    init.Init(row, expected.data());
    EXPECT_TRUE(BitEqual(expected, *(*cache)->ReadRecords({static_cast<SlotId>(row)})))
        << "row " << row;
  }
}

TEST_F(CudaCacheTest, ValidationIsOffByDefaultAndReportsSlotsWhenOn) {
  Twins twins = MakeTwins(4, OptimizerKind::kSgd, 1);
  EXPECT_FALSE(twins.cuda->validating());
  twins.cuda->set_validation(Validation::kOn);
  const std::vector<SlotId> slots = {1, kCapacity, 2};
  auto device_slots = Upload(slots);
  auto buffer = Zeros(3 * 4);
  EXPECT_THAT(twins.cuda->Extract(device_slots.data(), 3, buffer.data()).message(),
              HasSubstr("slots[1] = 4099 is outside the cache's 4099 slots"));
  const std::vector<SlotId> repeated = {3, 3};
  auto device_repeated = Upload(repeated);
  EXPECT_THAT(twins.cuda->Apply(device_repeated.data(), buffer.data(), 2).message(),
              HasSubstr("slot 3 appears at positions 0 and 1"));
  const std::vector<int64_t> offsets = {0, 2, 1};
  auto device_offsets = Upload(offsets);
  EXPECT_THAT(
      twins.cuda->Gather(device_slots.data(), device_offsets.data(), 1, 2, buffer.data()).message(),
      HasSubstr("offsets decrease at bag 1"));
}

}  // namespace
}  // namespace bagpipe
