// Specification of the embedding server: deterministic rows, batched fetch and write-back,
// read-after-write ordering, parameter collection.
#include "server/embedding_server.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 4;

RowInitializer Init() {
  return RowInitializer(/*seed=*/9, kDim, /*state_floats=*/1, 0.5f, {100, 1000});
}

std::vector<float> Record(float value) { return std::vector<float>(kDim + 1, value); }

TEST(RowStoreTest, RowsAreCreatedDeterministicallyOnFirstTouch) {
  RowStore a(Init()), b(Init());
  const float* ra = a.GetOrCreate(150);
  b.GetOrCreate(3);
  const float* rb = b.GetOrCreate(150);
  for (int c = 0; c < kDim + 1; ++c) EXPECT_EQ(ra[c], rb[c]);
  // Row 150 is in table 1 (1000 rows): values within sqrt(1/1000).
  for (int c = 0; c < kDim; ++c) EXPECT_LE(std::abs(ra[c]), std::sqrt(1.0f / 1000));
  EXPECT_EQ(ra[kDim], 0.5f);  // optimizer state starts at the initial accumulator
  EXPECT_EQ(a.size(), 1);
  EXPECT_EQ(a.stamp(150), -1);
}

TEST(RowStoreTest, ManyRowsKeepStablePointersAndSortedIteration) {
  RowStore store(RowInitializer(1, kDim, 0, 0, {10'000'000}));
  const float* first = store.GetOrCreate(9'999'999);
  const float copy = first[0];
  for (RowId r = 0; r < 200000; ++r) store.GetOrCreate((r * 7919) % 10'000'000);
  EXPECT_EQ(first[0], copy);
  RowId previous = 0;
  bool sorted = true;
  int64_t seen = 0;
  store.ForEachSorted([&](RowId row, const float*) {
    sorted &= seen == 0 || row > previous;
    previous = row;
    ++seen;
  });
  EXPECT_TRUE(sorted);
  EXPECT_EQ(seen, store.size());
  EXPECT_GT(store.bytes_per_row(), kDim * 4);
}

TEST(RowStoreTest, WideRecordsAllocateSmallChunks) {
  // 100k floats a record (400 KB): the first row must not allocate 2^16 records (26 GB).
  constexpr int kWide = 100000;
  RowStore store(RowInitializer(1, kWide, 0, 0, {1000}));
  for (RowId r = 0; r < 100; ++r) store.GetOrCreate(r);
  EXPECT_LE(store.bytes(), int64_t{64} << 20);
  EXPECT_GE(store.bytes(), int64_t{100} * kWide * 4);
  for (RowId r = 0; r < 100; ++r) {
    EXPECT_EQ(store.Find(r), store.GetOrCreate(r));  // every record where it was created
  }
  int64_t seen = 0;
  store.ForEachSorted([&](RowId row, const float* record) {
    EXPECT_EQ(record, store.Find(row));
    ++seen;
  });
  EXPECT_EQ(seen, 100);
}

TEST(EmbeddingServerTest, FetchServesInitialRowsThenWrittenBackValues) {
  EmbeddingServer server({Init()}, /*num_trainers=*/1);
  server.HandleFetch(0, FetchRequest{1, 0, {5, 6}, {-1, -1}});
  auto ready = server.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].second.records.size(), 2u * (kDim + 1));
  WriteBack wb{3, {5}, Record(2.0f)};
  ASSERT_TRUE(server.HandleWriteBack(0, wb).ok());
  server.HandleFetch(0, FetchRequest{2, 4, {5}, {3}});
  ready = server.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].second.records, Record(2.0f));
}

TEST(EmbeddingServerTest, FetchWaitsForTheNamedWriteBack) {
  EmbeddingServer server({Init()}, 2);
  server.HandleFetch(1, FetchRequest{9, 10, {7, 8}, {-1, 8}});  // row 8 written back at 8
  EXPECT_TRUE(server.TakeReady().empty());
  ASSERT_TRUE(server.HandleWriteBack(0, WriteBack{5, {8}, Record(1.0f)}).ok());
  EXPECT_TRUE(server.TakeReady().empty()) << "stamp 5 is older than the awaited 8";
  EXPECT_EQ(server.OldestWait(),
            "the oldest, trainer 1's for iteration 10, waits for row 8's write-back of "
            "iteration 8 (the server holds its write-back of iteration 5)");
  ASSERT_TRUE(server.HandleWriteBack(0, WriteBack{8, {8}, Record(3.0f)}).ok());
  auto ready = server.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].first, 1);
  EXPECT_EQ(ready[0].second.id, 9u);
  EXPECT_EQ(ready[0].second.records[kDim + 1], 3.0f);
  EXPECT_EQ(server.stats().deferred_fetches, 1);
}

TEST(EmbeddingServerTest, FetchWaitsForEveryTrainerBeyondTheHorizon) {
  ServerOptions options{Init()};
  options.writeback_horizon = 10;
  EmbeddingServer server(options, 2);
  server.HandleFetch(0, FetchRequest{1, 25, {1}, {-1}});  // needs watermarks >= 15
  ASSERT_TRUE(server.HandleWriteBack(0, WriteBack{20, {}, {}}).ok());
  EXPECT_TRUE(server.TakeReady().empty()) << "trainer 1 has not passed iteration 15";
  EXPECT_EQ(server.OldestWait(),
            "the oldest, trainer 0's for iteration 25, waits for the write-backs of trainer 1 "
            "(none in yet, needed up to iteration 15)");
  ASSERT_TRUE(server.HandleWriteBack(1, WriteBack{12, {}, {}}).ok());
  EXPECT_TRUE(server.TakeReady().empty()) << "trainer 1 has not passed iteration 15";
  EXPECT_EQ(server.OldestWait(),
            "the oldest, trainer 0's for iteration 25, waits for the write-backs of trainer 1 (in "
            "up to iteration 12, needed up to 15)");
  ASSERT_TRUE(server.HandleWriteBack(1, WriteBack{15, {}, {}}).ok());
  EXPECT_EQ(server.TakeReady().size(), 1u);
  EXPECT_EQ(server.OldestWait(), "");
}

TEST(EmbeddingServerTest, ProtocolViolationsAreDataLoss) {
  EmbeddingServer server({Init()}, 2);
  ASSERT_TRUE(server.HandleWriteBack(0, WriteBack{4, {1}, Record(1)}).ok());
  absl::Status twice = server.HandleWriteBack(1, WriteBack{4, {1}, Record(1)});
  EXPECT_TRUE(absl::IsDataLoss(twice));
  EXPECT_THAT(std::string(twice.message()), HasSubstr("two owners"));
  absl::Status backwards = server.HandleWriteBack(0, WriteBack{2, {}, {}});
  EXPECT_TRUE(absl::IsDataLoss(backwards));
  absl::Status short_record = server.HandleWriteBack(0, WriteBack{9, {2}, {1.0f}});
  EXPECT_TRUE(absl::IsDataLoss(short_record));
}

TEST(RunServerTest, ServesOverTheTransportAndCollectsSortedAcrossShards) {
  JobLayout layout{3, 1};
  InProcessHub hub(layout.size());
  ServerOptions options{Init()};
  options.peer_timeout = absl::Seconds(20);
  std::vector<std::thread> servers;
  std::vector<absl::Status> results(layout.servers);
  for (int s = 0; s < layout.servers; ++s) {
    servers.emplace_back([&, s] {
      results[s] = RunServer(hub.endpoint(layout.server_rank(s)), layout, s, options);
    });
  }
  Transport& trainer = hub.endpoint(layout.trainer_rank(0));
  // Write back rows 0..59 to their shards, then fetch them back.
  std::vector<WriteBack> per_server(layout.servers);
  for (RowId row = 0; row < 60; ++row) {
    WriteBack& wb = per_server[ServerOfRow(row, layout.servers)];
    wb.stamp = 1;
    wb.rows.push_back(row);
    auto record = Record(static_cast<float>(row));
    wb.records.insert(wb.records.end(), record.begin(), record.end());
  }
  for (int s = 0; s < layout.servers; ++s) {
    ASSERT_TRUE(
        trainer.Send(layout.server_rank(s), kTagWriteBack, EncodeWriteBack(per_server[s])).ok());
    ASSERT_TRUE(trainer
                    .Send(layout.server_rank(s), kTagFetchRequest,
                          EncodeFetchRequest(
                              FetchRequest{static_cast<uint64_t>(s), 2, per_server[s].rows,
                                           std::vector<Iteration>(per_server[s].rows.size(), 1)}))
                    .ok());
  }
  for (int s = 0; s < layout.servers; ++s) {
    auto m = trainer.Receive(layout.server_rank(s), kTagFetchResponse, absl::Seconds(10));
    ASSERT_TRUE(m.ok()) << m.status();
    auto response = DecodeFetchResponse(m->payload);
    ASSERT_TRUE(response.ok());
    EXPECT_EQ(response->records, per_server[s].records);
  }
  for (int s = 0; s < layout.servers; ++s) {
    ASSERT_TRUE(
        trainer.Send(layout.server_rank(s), kTagControl, EncodeControl(ControlKind::kDone)).ok());
  }
  std::vector<RowId> collected;
  ASSERT_TRUE(CollectRows(hub.endpoint(0), layout, kDim + 1, absl::Seconds(10),
                          [&](RowId row, const float* record) {
                            collected.push_back(row);
                            EXPECT_EQ(record[0], static_cast<float>(row));
                          })
                  .ok());
  for (auto& t : servers) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  ASSERT_EQ(collected.size(), 60u);
  for (RowId row = 0; row < 60; ++row) EXPECT_EQ(collected[row], row);
}

TEST(RunServerTest, SilentPeersEndTheServerWithANamedError) {
  JobLayout layout{1, 1};
  InProcessHub hub(layout.size());
  ServerOptions options{Init()};
  options.peer_timeout = absl::Milliseconds(50);
  absl::Status status = RunServer(hub.endpoint(1), layout, 0, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(status));
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 1 (server 0)"));
  EXPECT_FALSE(hub.endpoint(2).aborted().ok()) << "the job is aborted for everyone";
}

}  // namespace
}  // namespace bagpipe
