// NcclCommunicator across two MPI processes, run by ctest under `mpirun -np 2`: rank r uses GPU r
// and the result is compared with the CPU AllReduceSum over the same MPI transport
// (deterministic mode: bit for bit). Needs two CUDA devices; with fewer, every rank skips (the
// ranks agree on the device count before any NCCL call, so none waits for a peer that skipped).
#include <cuda_runtime.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sync/collectives.h"
#include "sync/mpi_transport.h"
#include "sync/nccl_communicator.h"
#include "tests/sync/mpi_test_main.h"

namespace bagpipe {
namespace {

MpiTransport* transport = nullptr;
constexpr absl::Duration kTimeout = absl::Seconds(60);

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

TEST(NcclMpiTest, TwoRanksMatchCpuAllReduce) {
  ASSERT_EQ(transport->size(), 2);
  const int rank = transport->rank();
  // The fewest devices any rank sees decides for all ranks.
  int devices = CudaDeviceCount();
  int fewest = devices;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest < 2) GTEST_SKIP() << "needs two CUDA devices per node, found " << fewest;

  const size_t count = 4099;
  std::mt19937 rng(11 + rank);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> input(count);
  for (size_t i = 0; i < count; ++i)
    input[i] = std::ldexp(unit(rng), static_cast<int>(i % 31) - 15);
  const Group group{{0, 1}, rank};
  std::vector<float> want = input;
  ASSERT_TRUE(AllReduceSum(*transport, group, want.data(), count, kTimeout).ok());

  ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::string unusable;
  auto comm = NcclCommunicator::Create(*transport, group, rank, kTimeout, &unusable);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_NE(*comm, nullptr) << unusable;
  float* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, count * sizeof(float)), cudaSuccess);
  for (bool deterministic : {true, false}) {
    ASSERT_EQ(cudaMemcpy(data, input.data(), count * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_TRUE((*comm)->AllReduceSum(data, count, stream, deterministic, kTimeout).ok());
    std::vector<float> got(count);
    ASSERT_EQ(cudaMemcpy(got.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < count; ++i) {
      if (deterministic) {
        ASSERT_EQ(Bits(got[i]), Bits(want[i])) << i;
      } else {
        // Two members: one add, whatever the order.
        ASSERT_EQ(got[i], want[i]) << i;
      }
    }
  }
  cudaFree(data);
  comm->reset();
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) { return bagpipe::RunMpiTests(&argc, &argv, &bagpipe::transport); }
