// main() of a GoogleTest program run under mpirun: every rank runs every test over one MPI
// session and transport; only rank 0 prints; the job fails if any rank's tests failed.
//
//   MpiTransport* transport = nullptr;  // the tests' handle on the transport
//   int main(int argc, char** argv) { return bagpipe::RunMpiTests(&argc, &argv, &transport); }
#ifndef BAGPIPE_TESTS_SYNC_MPI_TEST_MAIN_H_
#define BAGPIPE_TESTS_SYNC_MPI_TEST_MAIN_H_

#include <mpi.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "sync/mpi_transport.h"

namespace bagpipe {

// Sets `*transport` for the duration of the tests; returns the worst verdict of all ranks.
inline int RunMpiTests(int* argc, char*** argv, MpiTransport** transport) {
  ::testing::InitGoogleTest(argc, *argv);
  auto session = MpiSession::Init(argc, argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", std::string(session.status().message()).c_str());
    return 1;
  }
  auto created = MpiTransport::Create();
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", std::string(created.status().message()).c_str());
    return 1;
  }
  *transport = created->get();
  if ((*session)->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  // The transport ends (its sends complete, its progress thread joins) before this thread calls
  // MPI itself: an MPI call here would progress the transport's sends still in flight, reading
  // their payloads through Open MPI's uninstrumented TCP plugin while the progress thread frees
  // them, a race that ThreadSanitizer cannot see ordered.
  *transport = nullptr;
  created->reset();
  int worst = result;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace bagpipe

#endif  // BAGPIPE_TESTS_SYNC_MPI_TEST_MAIN_H_
