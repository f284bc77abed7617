// MPI smoke test, run by ctest under `mpirun -np 2`: the MPI transport delivers, orders and
// times out like the in-process one.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sync/mpi_transport.h"
#include "tests/sync/mpi_test_main.h"

namespace bagpipe {
namespace {

MpiTransport* transport = nullptr;

TEST(MpiTransportTest, PingPongInOrder) {
  ASSERT_EQ(transport->size(), 2);
  const int peer = 1 - transport->rank();
  for (int k = 0; k < 50; ++k) {
    ASSERT_TRUE(transport->Send(peer, kTagTest, Bytes{static_cast<uint8_t>(k)}).ok());
  }
  for (int k = 0; k < 50; ++k) {
    auto m = transport->Receive(peer, kTagTest, absl::Seconds(30));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->payload.size(), 1u);
    EXPECT_EQ(m->payload[0], k);
  }
}

TEST(MpiTransportTest, LargeMessagesArriveIntact) {
  const int peer = 1 - transport->rank();
  Bytes big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31 + transport->rank());
  ASSERT_TRUE(transport->Send(peer, kTagTest, big).ok());
  auto m = transport->Receive(kAnySource, kTagTest, absl::Seconds(30));
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->payload.size(), big.size());
  for (size_t i = 0; i < big.size(); i += 4097) {
    ASSERT_EQ(m->payload[i], static_cast<uint8_t>(i * 31 + peer));
  }
}

TEST(MpiTransportTest, RanksOfOneMachineShareANode) {
  // ctest starts both ranks on this machine: one node, numbered by its lowest rank.
  EXPECT_EQ(transport->NodeOfRanks(), (std::vector<int>{0, 0}));
}

TEST(MpiTransportTest, SilenceBecomesDeadlineExceeded) {
  auto m = transport->Receive(1 - transport->rank(), kTagControl, absl::Milliseconds(50));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status()));
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) { return bagpipe::RunMpiTests(&argc, &argv, &bagpipe::transport); }
