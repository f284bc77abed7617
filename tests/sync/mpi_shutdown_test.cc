// Run by ctest under `mpirun -np 2`: an MpiTransport destroyed while its large sends are still
// outstanding on both ranks at once completes them and ends. Each send completes only once the
// peer has received it, so each rank's progress thread must go on receiving while its
// destructor waits (holding the lock the progress thread needs would deadlock both ranks).
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "sync/mpi_transport.h"

namespace bagpipe {
namespace {

constexpr int kWatchdogSeconds = 60;

void OnWatchdog(int) {
  constexpr char kMessage[] = "mpi_shutdown_test: the transport did not end within 60 s\n";
  (void)!write(2, kMessage, sizeof(kMessage) - 1);
  _exit(3);
}

TEST(MpiTransportShutdownTest, EndsWithLargeSendsOutstandingOnBothRanks) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 2);
  const int peer = 1 - rank;
  for (int round = 0; round < 2; ++round) {
    auto transport = MpiTransport::Create();
    ASSERT_TRUE(transport.ok()) << transport.status();
    MPI_Barrier(MPI_COMM_WORLD);
    // Far above the shared-memory eager limit: completes only once the peer receives it.
    for (int k = 0; k < 2; ++k) {
      ASSERT_TRUE((*transport)->Send(peer, kTagTest, Bytes(1 << 20, static_cast<uint8_t>(k))).ok());
    }
    signal(SIGALRM, OnWatchdog);
    alarm(kWatchdogSeconds);
    transport->reset();  // nobody calls Receive: the progress threads take the messages
    alarm(0);
    // Both transports are gone before the next round's probes start.
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto session = bagpipe::MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", std::string(session.status().message()).c_str());
    return 1;
  }
  int result = RUN_ALL_TESTS();
  int worst = result;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
