// NcclCommunicator (sync/nccl_communicator.h) against its CPU twin, AllReduceSum
// (sync/collectives.h): the deterministic mode must give the CPU result bit for bit.
// Built only with the CUDA backend. Every test skips when no CUDA device is usable; the
// multi-member test needs one GPU per member and skips with fewer than two.
#include "sync/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sync/collectives.h"
#include "sync/transport.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Values whose sums depend on the order of the adds (mixed magnitudes and signs), with some
// negative zeros (+0.0f + -0.0f is +0.0f: the reduction must start from +0.0f).
std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = i % 17 == 3 ? -0.0f : std::ldexp(unit(rng), exponent(rng));
  }
  return v;
}

// The CPU reference: AllReduceSum over `inputs.size()` in-process members. Returns member 0's
// result (the test of collectives.cc pins that every member has the same).
std::vector<float> CpuAllReduce(const std::vector<std::vector<float>>& inputs) {
  const int members = static_cast<int>(inputs.size());
  std::vector<std::vector<float>> data = inputs;
  if (members == 1) {
    // AllReduceSum leaves a single member's data untouched; the fixed-order sum of one member
    // is +0.0f + x.
    for (float& x : data[0]) x = 0.0f + x;
    return data[0];
  }
  InProcessHub hub(members);
  std::vector<absl::Status> results(members);
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      Group group;
      for (int r = 0; r < members; ++r) group.ranks.push_back(r);
      group.me = m;
      results[m] = AllReduceSum(hub.endpoint(m), group, data[m].data(), data[m].size(), kTimeout);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& status : results) EXPECT_TRUE(status.ok()) << status;
  return data[0];
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no usable CUDA device (" << CudaDeviceDescription(0) << ")";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A new device buffer holding `host`; the caller frees it with cudaFree.
  float* ToDevice(const std::vector<float>& host) {
    float* device = nullptr;
    EXPECT_EQ(cudaMalloc(&device, std::max<size_t>(1, host.size()) * sizeof(float)), cudaSuccess);
    if (!host.empty()) {
      EXPECT_EQ(
          cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
          cudaSuccess);
    }
    return device;
  }
  std::vector<float> ToHost(const float* device, size_t n) {
    std::vector<float> host(n);
    if (n > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

  cudaStream_t stream_ = nullptr;
};

void ExpectBitEqual(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(want[i]))
        << what << ", element " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST_F(NcclTest, FixedOrderSumKernelEqualsCpuAllReduceBitForBit) {
  // Counts around the kernel's 256-thread blocks, and 0.
  for (int members : {1, 2, 3, 5, 8}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{1000},
                         size_t{100003}}) {
      std::vector<std::vector<float>> inputs;
      std::vector<float> gathered;
      for (int m = 0; m < members; ++m) {
        inputs.push_back(RandomFloats(count, 1000 * members + m + static_cast<uint32_t>(count)));
        gathered.insert(gathered.end(), inputs.back().begin(), inputs.back().end());
      }
      const std::vector<float> want = CpuAllReduce(inputs);
      float* d_gathered = ToDevice(gathered);
      float* d_out = ToDevice(std::vector<float>(count, 1.0f));
      ASSERT_TRUE(internal::FixedOrderSumOnDevice(d_gathered, members, count, d_out, stream_).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      ExpectBitEqual(ToHost(d_out, count), want,
                     "members " + std::to_string(members) + ", count " + std::to_string(count));
      cudaFree(d_gathered);
      cudaFree(d_out);
    }
  }
}

TEST_F(NcclTest, SingleMemberAllReduceLeavesDataUnchanged) {
  auto comm = NcclCommunicator::CreateSingle(0, kTimeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->members(), 1);
  for (bool deterministic : {true, false}) {
    for (size_t count : {size_t{0}, size_t{257}, size_t{4099}}) {
      const std::vector<float> input = RandomFloats(count, 7 + static_cast<uint32_t>(count));
      float* data = ToDevice(input);
      ASSERT_TRUE((*comm)->AllReduceSum(data, count, stream_, deterministic, kTimeout).ok());
      const std::vector<float> got = ToHost(data, count);
      cudaFree(data);
      if (deterministic) {
        // +0.0f + x: bit for bit the input, except that -0.0f becomes +0.0f (as on the CPU).
        ExpectBitEqual(got, CpuAllReduce({input}), "deterministic, count " + std::to_string(count));
      } else {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], input[i]) << i;
      }
    }
  }
}

TEST_F(NcclTest, GroupOfOneOverTransportIsASingleMember) {
  InProcessHub hub(1);
  Group group{{0}, 0};
  std::string unusable;
  auto comm = NcclCommunicator::Create(hub.endpoint(0), group, 0, kTimeout, &unusable);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_NE(*comm, nullptr);
  EXPECT_EQ((*comm)->members(), 1);
}

TEST_F(NcclTest, MembersSharingAGpuGetNoCommunicatorAndTheSameReason) {
  const int members = 2;
  InProcessHub hub(members);
  std::vector<std::string> unusable(members);
  std::vector<bool> null(members, false);
  std::vector<absl::Status> results(members);
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      Group group{{0, 1}, m};
      auto comm = NcclCommunicator::Create(hub.endpoint(m), group, 0, kTimeout, &unusable[m]);
      results[m] = comm.status();
      if (comm.ok()) null[m] = *comm == nullptr;
    });
  }
  for (auto& t : threads) t.join();
  for (int m = 0; m < members; ++m) {
    ASSERT_TRUE(results[m].ok()) << results[m];
    EXPECT_TRUE(null[m]) << m;
    EXPECT_THAT(unusable[m], HasSubstr("share GPU")) << m;
  }
  EXPECT_EQ(unusable[0], unusable[1]);
}

// One thread per GPU, each a member: NCCL across devices against the CPU reference.
TEST_F(NcclTest, MultiGpuAllReduceMatchesCpu) {
  const int members = std::min(CudaDeviceCount(), 4);
  if (members < 2) GTEST_SKIP() << "needs two CUDA devices, found " << CudaDeviceCount();
  const size_t count = 10007;
  std::vector<std::vector<float>> inputs;
  for (int m = 0; m < members; ++m) inputs.push_back(RandomFloats(count, 31 + m));
  const std::vector<float> want = CpuAllReduce(inputs);
  InProcessHub hub(members);
  std::vector<std::vector<std::vector<float>>> got(2, std::vector<std::vector<float>>(members));
  std::vector<absl::Status> results(members);
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      results[m] = [&]() -> absl::Status {
        if (cudaSetDevice(m) != cudaSuccess) return absl::InternalError("cudaSetDevice");
        cudaStream_t stream = nullptr;
        if (cudaStreamCreate(&stream) != cudaSuccess) return absl::InternalError("stream");
        Group group;
        for (int r = 0; r < members; ++r) group.ranks.push_back(r);
        group.me = m;
        std::string unusable;
        auto comm = NcclCommunicator::Create(hub.endpoint(m), group, m, kTimeout, &unusable);
        if (!comm.ok()) return comm.status();
        if (*comm == nullptr) return absl::FailedPreconditionError(unusable);
        for (int mode = 0; mode < 2; ++mode) {
          float* data = nullptr;
          if (cudaMalloc(&data, count * sizeof(float)) != cudaSuccess) {
            return absl::InternalError("cudaMalloc");
          }
          cudaMemcpy(data, inputs[m].data(), count * sizeof(float), cudaMemcpyHostToDevice);
          absl::Status status = (*comm)->AllReduceSum(data, count, stream, mode == 0, kTimeout);
          got[mode][m].resize(count);
          cudaMemcpy(got[mode][m].data(), data, count * sizeof(float), cudaMemcpyDeviceToHost);
          cudaFree(data);
          if (!status.ok()) return status;
        }
        comm->reset();
        cudaStreamDestroy(stream);
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (int m = 0; m < members; ++m) ASSERT_TRUE(results[m].ok()) << m << ": " << results[m];
  for (int m = 0; m < members; ++m) {
    ExpectBitEqual(got[0][m], want, "deterministic, member " + std::to_string(m));
    // NCCL's own order: equal up to rounding, bounded by the sum of magnitudes.
    for (size_t i = 0; i < count; ++i) {
      double magnitude = 0;
      for (int k = 0; k < members; ++k) magnitude += std::abs(inputs[k][i]);
      ASSERT_NEAR(got[1][m][i], want[i], 1e-6 * magnitude) << m << " " << i;
    }
  }
}

}  // namespace
}  // namespace bagpipe
