// Specification of the prefetch pipeline: batched fetches from every server, staging in request
// order, read-after-write through the servers, errors surface in Wait instead of hanging.
#include "prefetch/prefetcher.h"

#include <thread>

#include "core/row_init.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/embedding_server.h"
#include "sync/protocol.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 3;

class PrefetcherTest : public ::testing::Test {
 protected:
  void StartServers(int servers, absl::Duration timeout = absl::Seconds(20)) {
    layout_ = JobLayout{servers, 1};
    hub_ = std::make_unique<InProcessHub>(layout_.size());
    options_.initializer = init_;
    options_.peer_timeout = timeout;
    for (int s = 0; s < servers; ++s) {
      threads_.emplace_back([this, s] {
        (void)RunServer(hub_->endpoint(layout_.server_rank(s)), layout_, s, options_);
      });
    }
  }
  void StopServers() {
    Transport& trainer = trainer_endpoint();
    for (int s = 0; s < layout_.servers; ++s) {
      (void)trainer.Send(layout_.server_rank(s), kTagControl, EncodeControl(ControlKind::kDone));
      (void)trainer.Send(layout_.server_rank(s), kTagControl, EncodeControl(ControlKind::kStop));
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  Transport& trainer_endpoint() { return hub_->endpoint(layout_.trainer_rank(0)); }

  RowInitializer init_{5, kDim, 0, 0.0f, {1000}};
  JobLayout layout_;
  ServerOptions options_;
  std::unique_ptr<InProcessHub> hub_;
  std::vector<std::thread> threads_;
};

TEST_F(PrefetcherTest, StagesRowsFromEveryServerInRequestOrder) {
  StartServers(3);
  {
    Prefetcher prefetcher(trainer_endpoint(), layout_, 0, DeviceContext::Cpu(), kDim,
                          absl::Seconds(10));
    std::vector<RowId> rows = {17, 3, 999, 42, 5, 0};
    ASSERT_TRUE(prefetcher.Request(0, rows, std::vector<Iteration>(rows.size(), -1)).ok());
    ASSERT_TRUE(prefetcher.Request(1, {}, {}).ok());
    auto staging = prefetcher.Wait(0);
    ASSERT_TRUE(staging.ok()) << staging.status();
    ASSERT_EQ(staging->rows, 6);
    for (size_t k = 0; k < rows.size(); ++k) {
      std::vector<float> expected(kDim);
      init_.Init(rows[k], expected.data());
      for (int c = 0; c < kDim; ++c) EXPECT_EQ(staging->device[k * kDim + c], expected[c]) << k;
    }
    ASSERT_TRUE(prefetcher.Release(0).ok());
    auto empty = prefetcher.Wait(1);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->rows, 0);
    EXPECT_EQ(prefetcher.stats().rows, 6);
    EXPECT_FALSE(prefetcher.Request(1, {1}, {-1}).ok()) << "iterations must increase";
  }
  StopServers();
}

// On a context whose streams run later (the lazy CPU mode runs work only when waited for), the
// staging is read through the copy stream's event, and recycled buffers are reused only after
// the reads of their previous iteration.
TEST_F(PrefetcherTest, RecycledStagingIsOrderedByEventsOnAsynchronousStreams) {
  StartServers(2);
  for (CpuStreams mode : {CpuStreams::kAsync, CpuStreams::kLazy}) {
    auto context = DeviceContext::Cpu(mode);
    Prefetcher prefetcher(trainer_endpoint(), layout_, 0, context, kDim, absl::Seconds(10));
    auto out = DeviceArray<float>::Create(context, 64 * kDim);
    ASSERT_TRUE(out.ok());
    std::vector<float> back(64 * kDim);
    for (Iteration it = 0; it < 12; ++it) {
      std::vector<RowId> rows;
      for (int k = 0; k < 20 + it; ++k) rows.push_back((it * 37 + k * 11) % 1000);
      ASSERT_TRUE(prefetcher.Request(it, rows, std::vector<Iteration>(rows.size(), -1)).ok());
      auto staging = prefetcher.Wait(it);
      ASSERT_TRUE(staging.ok()) << staging.status();
      ASSERT_TRUE(context->StreamWaitEvent(Stream::kCompute, *staging->ready).ok());
      const size_t bytes = rows.size() * kDim * sizeof(float);
      ASSERT_TRUE(context->CopyOnDevice(out->data(), staging->device, bytes).ok());
      ASSERT_TRUE(prefetcher.Release(it).ok());
      ASSERT_TRUE(context->CopyToHost(back.data(), out->data(), bytes).ok());
      ASSERT_TRUE(context->Synchronize().ok());
      for (size_t k = 0; k < rows.size(); ++k) {
        std::vector<float> expected(kDim);
        init_.Init(rows[k], expected.data());
        for (int c = 0; c < kDim; ++c) {
          ASSERT_EQ(back[k * kDim + c], expected[c]) << CpuStreamsName(mode) << " it " << it;
        }
      }
    }
  }
  StopServers();
}

TEST_F(PrefetcherTest, FetchAfterAStampSeesTheWriteBack) {
  StartServers(2);
  {
    Prefetcher prefetcher(trainer_endpoint(), layout_, 0, DeviceContext::Cpu(), kDim,
                          absl::Seconds(10));
    // Ask for row 7 after its write-back stamped 4, before sending that write-back.
    ASSERT_TRUE(prefetcher.Request(5, {7}, {4}).ok());
    WriteBack wb{4, {7}, {1.0f, 2.0f, 3.0f}};
    const int owner = ServerOfRow(7, layout_.servers);
    for (int s = 0; s < layout_.servers; ++s) {
      WriteBack message = s == owner ? wb : WriteBack{4, {}, {}};
      ASSERT_TRUE(trainer_endpoint()
                      .Send(layout_.server_rank(s), kTagWriteBack, EncodeWriteBack(message))
                      .ok());
    }
    auto staging = prefetcher.Wait(5);
    ASSERT_TRUE(staging.ok());
    EXPECT_EQ(staging->device[0], 1.0f);
    EXPECT_EQ(staging->device[2], 3.0f);
  }
  StopServers();
}

TEST_F(PrefetcherTest, ADeadServerBecomesAnErrorInWait) {
  layout_ = JobLayout{1, 1};
  hub_ = std::make_unique<InProcessHub>(layout_.size());  // no server thread: it "died"
  Prefetcher prefetcher(trainer_endpoint(), layout_, 0, DeviceContext::Cpu(), kDim,
                        absl::Milliseconds(100));
  ASSERT_TRUE(prefetcher.Request(0, {1, 2}, {-1, -1}).ok());
  auto staging = prefetcher.Wait(0);
  ASSERT_FALSE(staging.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(staging.status()));
  EXPECT_THAT(std::string(staging.status().message()),
              HasSubstr("rows from server 0 (rank 1); that server died or hung"));
}

TEST_F(PrefetcherTest, AnAbortElsewhereReachesWait) {
  layout_ = JobLayout{1, 1};
  hub_ = std::make_unique<InProcessHub>(layout_.size());
  Prefetcher prefetcher(trainer_endpoint(), layout_, 0, DeviceContext::Cpu(), kDim,
                        absl::Seconds(30));
  ASSERT_TRUE(prefetcher.Request(0, {1}, {-1}).ok());
  hub_->endpoint(0).Abort(absl::InternalError("the oracle failed"));
  auto staging = prefetcher.Wait(0);
  ASSERT_FALSE(staging.ok());
  EXPECT_THAT(std::string(staging.status().message()), HasSubstr("the oracle failed"));
}

}  // namespace
}  // namespace bagpipe
