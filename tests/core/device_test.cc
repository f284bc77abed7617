// Specifications of the CPU device context's stream modes (core/device.h): the synchronous
// reference, and the asynchronous and lazy modes that behave like a GPU for ordering, so that
// ordering mistakes show up on a machine without one.
#include "core/device.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

class CpuStreamsTest : public ::testing::TestWithParam<CpuStreams> {};

TEST_P(CpuStreamsTest, CopiesAndKernelsRunInStreamOrder) {
  auto context = DeviceContext::Cpu(GetParam());
  EXPECT_EQ(context->is_asynchronous(), GetParam() != CpuStreams::kSync);
  auto a = DeviceArray<int>::Create(context, 1000);
  auto b = DeviceArray<int>::Create(context, 1000);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int> host(1000), back(1000, -1);
  for (int i = 0; i < 1000; ++i) host[i] = i;
  int* pa = a->data();
  int* pb = b->data();
  ASSERT_TRUE(context->CopyToDevice(pa, host.data(), 4000).ok());
  ASSERT_TRUE(context
                  ->Launch(Stream::kCompute,
                           [pa, pb] {
                             for (int i = 0; i < 1000; ++i) pb[i] = 2 * pa[i];
                           })
                  .ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), pb, 4000).ok());
  ASSERT_TRUE(context->Synchronize().ok());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(back[i], 2 * i);
}

TEST_P(CpuStreamsTest, StreamWaitOrdersTheCopyStreamBeforeCompute) {
  auto context = DeviceContext::Cpu(GetParam());
  auto staging = DeviceArray<float>::Create(context, 256);
  auto out = DeviceArray<float>::Create(context, 256);
  ASSERT_TRUE(staging.ok() && out.ok());
  std::vector<float> host(256, 3.0f), back(256, 0.0f);
  ASSERT_TRUE(context->CopyToDevice(staging->data(), host.data(), 1024, Stream::kCopy).ok());
  ASSERT_TRUE(context->StreamWait(Stream::kCompute, Stream::kCopy).ok());
  ASSERT_TRUE(context->CopyOnDevice(out->data(), staging->data(), 1024).ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), out->data(), 1024).ok());
  ASSERT_TRUE(context->Synchronize().ok());
  EXPECT_EQ(back, host);
}

TEST_P(CpuStreamsTest, EventsCaptureTheWorkQueuedBeforeTheirRecord) {
  auto context = DeviceContext::Cpu(GetParam());
  auto event = DeviceEvent::Create(context);
  ASSERT_TRUE(event.ok());
  EXPECT_TRUE(*event->Query());  // never recorded
  auto data = DeviceArray<float>::Create(context, 64);
  ASSERT_TRUE(data.ok());
  std::vector<float> host(64, 1.0f), back(64, 0.0f);
  ASSERT_TRUE(context->CopyToDevice(data->data(), host.data(), 256, Stream::kCopy).ok());
  ASSERT_TRUE(event->Record(Stream::kCopy).ok());
  ASSERT_TRUE(context->StreamWaitEvent(Stream::kCompute, *event).ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), data->data(), 256).ok());
  ASSERT_TRUE(context->Synchronize().ok());
  EXPECT_TRUE(*event->Query());
  EXPECT_EQ(back, host);
  // Timing events measure the stream's own progress.
  auto start = DeviceEvent::Create(context, /*timing=*/true);
  auto end = DeviceEvent::Create(context, /*timing=*/true);
  ASSERT_TRUE(start.ok() && end.ok());
  ASSERT_TRUE(start->Record(Stream::kCompute).ok());
  ASSERT_TRUE(context
                  ->Launch(Stream::kCompute,
                           [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); })
                  .ok());
  ASSERT_TRUE(end->Record(Stream::kCompute).ok());
  ASSERT_TRUE(end->Synchronize().ok());
  auto ms = DeviceEvent::ElapsedMs(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 1.5);
  auto other = DeviceContext::Cpu(GetParam());
  EXPECT_FALSE(other->StreamWaitEvent(Stream::kCompute, *event).ok());
  ASSERT_TRUE(context->MakeCurrent().ok());
}

TEST_P(CpuStreamsTest, CountsHostSynchronisationsAndAllocations) {
  auto context = DeviceContext::Cpu(GetParam());
  const int64_t thread_syncs = DeviceContext::ThreadHostSyncs();
  const int64_t thread_allocations = DeviceContext::ThreadAllocations();
  {
    auto array = DeviceArray<float>::Create(context, 16);
    ASSERT_TRUE(array.ok());
    ASSERT_TRUE(context->Synchronize().ok());
    ASSERT_TRUE(context->SynchronizeAll().ok());
    auto event = DeviceEvent::Create(context);
    ASSERT_TRUE(event.ok());
    ASSERT_TRUE(event->Record(Stream::kCopy).ok());
    ASSERT_TRUE(event->Synchronize().ok());
    EXPECT_EQ(context->host_syncs(), 3);
    EXPECT_EQ(context->allocations(), 1);
  }  // the free synchronises as cudaFree does
  EXPECT_EQ(context->host_syncs(), 4);
  EXPECT_EQ(context->allocations(), 2);
  EXPECT_EQ(DeviceContext::ThreadHostSyncs() - thread_syncs, 4);
  EXPECT_EQ(DeviceContext::ThreadAllocations() - thread_allocations, 2);
  // Other threads' synchronisations count for the context, not for this thread.
  std::thread([&] {
    ASSERT_TRUE(context->MakeCurrent().ok());
    ASSERT_TRUE(context->Synchronize(Stream::kComm).ok());
  }).join();
  EXPECT_EQ(context->host_syncs(), 5);
  EXPECT_EQ(DeviceContext::ThreadHostSyncs() - thread_syncs, 4);
}

TEST_P(CpuStreamsTest, FreeWaitsForQueuedWorkThatUsesTheMemory) {
  auto context = DeviceContext::Cpu(GetParam());
  std::atomic<bool> ran{false};
  {
    auto array = DeviceArray<int>::Create(context, 1 << 16);
    ASSERT_TRUE(array.ok());
    int* p = array->data();
    ASSERT_TRUE(context
                    ->Launch(Stream::kCompute,
                             [p, &ran] {
                               std::this_thread::sleep_for(std::chrono::milliseconds(5));
                               for (int i = 0; i < (1 << 16); ++i) p[i] = i;
                               ran = true;
                             })
                    .ok());
  }
  EXPECT_TRUE(ran);
}

INSTANTIATE_TEST_SUITE_P(Modes, CpuStreamsTest,
                         ::testing::Values(CpuStreams::kSync, CpuStreams::kAsync,
                                           CpuStreams::kLazy),
                         [](const auto& info) { return std::string(CpuStreamsName(info.param)); });

// The lazy mode runs work as late as a GPU may: the ordering mistakes below give wrong results
// every time instead of by chance.
TEST(LazyStreamsTest, WorkRunsOnlyWhenSomethingWaitsForIt) {
  auto context = DeviceContext::Cpu(CpuStreams::kLazy);
  std::atomic<int> runs{0};
  ASSERT_TRUE(context->Launch(Stream::kCompute, [&] { ++runs; }).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(runs, 0);
  auto event = DeviceEvent::Create(context);
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(event->Record(Stream::kCompute).ok());
  EXPECT_FALSE(*event->Query());  // a query demands nothing
  ASSERT_TRUE(event->Synchronize().ok());
  EXPECT_EQ(runs, 1);
}

TEST(LazyStreamsTest, AMissingStreamWaitReadsStaleData) {
  auto context = DeviceContext::Cpu(CpuStreams::kLazy);
  auto staging = DeviceArray<float>::Create(context, 8);
  auto out = DeviceArray<float>::Create(context, 8);
  ASSERT_TRUE(staging.ok() && out.ok());
  std::vector<float> host(8, 7.0f), back(8, -1.0f);
  ASSERT_TRUE(context->CopyToDevice(staging->data(), host.data(), 32, Stream::kCopy).ok());
  // No StreamWait(kCompute, kCopy): compute reads the staging before the copy ran.
  ASSERT_TRUE(context->CopyOnDevice(out->data(), staging->data(), 32).ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), out->data(), 32).ok());
  ASSERT_TRUE(context->Synchronize().ok());
  EXPECT_EQ(back, std::vector<float>(8, 0.0f));  // fresh memory, not the copied 7s
  // The copy has still not run: let it, before `host` goes (ThreadSanitizer caught this test
  // reading freed memory otherwise).
  ASSERT_TRUE(context->SynchronizeAll().ok());
}

TEST(LazyStreamsTest, AHostBufferReusedBeforeItsCopyRanIsSeenByTheCopy) {
  auto context = DeviceContext::Cpu(CpuStreams::kLazy);
  auto device = DeviceArray<float>::Create(context, 8);
  ASSERT_TRUE(device.ok());
  std::vector<float> host(8, 1.0f), back(8, 0.0f);
  ASSERT_TRUE(context->CopyToDevice(device->data(), host.data(), 32, Stream::kCopy).ok());
  std::fill(host.begin(), host.end(), 2.0f);  // too early: the copy has not run
  ASSERT_TRUE(context->StreamWait(Stream::kCompute, Stream::kCopy).ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), device->data(), 32).ok());
  ASSERT_TRUE(context->Synchronize().ok());
  EXPECT_EQ(back, std::vector<float>(8, 2.0f));
}

TEST(LazyStreamsTest, ReadingDeviceMemoryBeforeTheStreamFinishedSeesOldValues) {
  auto context = DeviceContext::Cpu(CpuStreams::kLazy);
  auto device = DeviceArray<float>::Create(context, 4);
  ASSERT_TRUE(device.ok());
  float* p = device->data();
  ASSERT_TRUE(context->Launch(Stream::kCompute, [p] { p[0] = 5.0f; }).ok());
  EXPECT_EQ(p[0], 0.0f);  // no synchronisation yet
  ASSERT_TRUE(context->Synchronize().ok());
  EXPECT_EQ(p[0], 5.0f);
}

TEST(AsyncStreamsTest, ThreadsMustMakeTheContextCurrent) {
  for (CpuStreams mode : {CpuStreams::kAsync, CpuStreams::kLazy}) {
    auto context = DeviceContext::Cpu(mode);
    std::vector<float> host(4, 1.0f);
    auto device = DeviceArray<float>::Create(context, 4);
    ASSERT_TRUE(device.ok());
    absl::Status without, with;
    std::thread([&] {
      without = context->CopyToDevice(device->data(), host.data(), 16, Stream::kCopy);
      ASSERT_TRUE(context->MakeCurrent().ok());
      with = context->CopyToDevice(device->data(), host.data(), 16, Stream::kCopy);
    }).join();
    EXPECT_THAT(std::string(without.message()), HasSubstr("MakeCurrent"));
    EXPECT_TRUE(with.ok()) << with;
  }
  // The synchronous reference keeps its old leniency.
  auto sync = DeviceContext::Cpu(CpuStreams::kSync);
  std::thread([&] { EXPECT_TRUE(sync->Synchronize().ok()); }).join();
}

TEST(AsyncStreamsTest, StreamWaitsFromManyThreadsKeepEveryOrder) {
  auto context = DeviceContext::Cpu(CpuStreams::kAsync);
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<std::vector<int>> sources(kThreads, std::vector<int>(64));
  std::vector<DeviceArray<int>> staging, out;
  for (int t = 0; t < kThreads; ++t) {
    staging.push_back(*DeviceArray<int>::Create(context, 64));
    out.push_back(*DeviceArray<int>::Create(context, 64));
  }
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_TRUE(context->MakeCurrent().ok());
      auto done = DeviceEvent::Create(context);
      ASSERT_TRUE(done.ok());
      std::vector<int> back(64);
      for (int r = 0; r < kRounds; ++r) {
        std::fill(sources[t].begin(), sources[t].end(), r * kThreads + t);
        ASSERT_TRUE(
            context->CopyToDevice(staging[t].data(), sources[t].data(), 256, Stream::kCopy).ok());
        ASSERT_TRUE(context->StreamWait(Stream::kComm, Stream::kCopy).ok());
        ASSERT_TRUE(
            context->CopyOnDevice(out[t].data(), staging[t].data(), 256, Stream::kComm).ok());
        ASSERT_TRUE(done->Record(Stream::kComm).ok());
        ASSERT_TRUE(done->Synchronize().ok());
        std::copy(out[t].data(), out[t].data() + 64, back.begin());
        if (back != sources[t]) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
}

TEST(CpuStreamsNamesTest, ParseAndDefault) {
  EXPECT_EQ(*ParseCpuStreams("lazy"), CpuStreams::kLazy);
  EXPECT_EQ(*ParseCpuStreams("1"), CpuStreams::kAsync);
  EXPECT_FALSE(ParseCpuStreams("eager").ok());
  EXPECT_EQ(DeviceContext::Cpu(CpuStreams::kLazy)->Describe(), "cpu (lazy streams)");
}

}  // namespace
}  // namespace bagpipe
