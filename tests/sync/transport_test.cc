// Specification of the in-process transport (the embedded default's communicator).
#include "sync/transport.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sync/collectives.h"
#include "sync/protocol.h"
#include "sync/roles.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

Bytes Text(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string Str(const Bytes& b) { return std::string(b.begin(), b.end()); }

// A trainer's GPU is its index among the trainers of its machine, whatever the rank placement.
TEST(JobLayoutTest, LocalTrainerIndexCountsOnlyTheTrainersOfTheSameMachine) {
  const JobLayout layout{1, 4};  // rank 0 oracle, 1 server, 2..5 trainers
  // mpirun --map-by node over two machines: ranks alternate. The global index modulo 2 GPUs
  // would put trainers 0 and 2 (ranks 2 and 4, both on machine 0) on GPU 0.
  const std::vector<int> by_node = {0, 1, 0, 1, 0, 1};
  EXPECT_EQ(LocalTrainerIndex(layout, 0, by_node), 0);
  EXPECT_EQ(LocalTrainerIndex(layout, 1, by_node), 0);
  EXPECT_EQ(LocalTrainerIndex(layout, 2, by_node), 1);
  EXPECT_EQ(LocalTrainerIndex(layout, 3, by_node), 1);
  // A hostfile filling machines in order: oracle, server and trainer 0 on one, three trainers
  // on the other.
  const std::vector<int> by_slot = {0, 0, 0, 3, 3, 3};
  EXPECT_EQ(LocalTrainerIndex(layout, 0, by_slot), 0);
  EXPECT_EQ(LocalTrainerIndex(layout, 1, by_slot), 0);
  EXPECT_EQ(LocalTrainerIndex(layout, 3, by_slot), 2);
  // One process (the embedded job): the global index.
  InProcessHub hub(layout.size());
  for (int t = 0; t < 4; ++t)
    EXPECT_EQ(LocalTrainerIndex(layout, t, hub.endpoint(0).NodeOfRanks()), t);
}

TEST(InProcessTransportTest, MessagesBetweenAPairKeepTheirOrderPerTag) {
  InProcessHub hub(2);
  for (int k = 0; k < 100; ++k)
    ASSERT_TRUE(hub.endpoint(0).Send(1, kTagTest, Text(std::to_string(k))).ok());
  ASSERT_TRUE(hub.endpoint(0).Send(1, kTagPlan, Text("plan")).ok());
  auto plan = hub.endpoint(1).Receive(0, kTagPlan, absl::Seconds(1));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(Str(plan->payload), "plan");
  for (int k = 0; k < 100; ++k) {
    auto m = hub.endpoint(1).Receive(0, kTagTest, absl::Seconds(1));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(Str(m->payload), std::to_string(k));
    EXPECT_EQ(m->source, 0);
  }
}

TEST(InProcessTransportTest, AnySourceAndAnyTagReceiveWhateverCame) {
  InProcessHub hub(3);
  ASSERT_TRUE(hub.endpoint(2).Send(0, kTagControl, Text("c")).ok());
  auto m = hub.endpoint(0).Receive(kAnySource, kAnyTag, absl::Seconds(1));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->source, 2);
  EXPECT_EQ(m->tag, kTagControl);
}

// MPI's non-overtaking rule: a wildcard receive sees one sender's messages in the order they
// were sent, whatever their tags (the servers rely on a trainer's final write-back arriving
// before its "done").
TEST(InProcessTransportTest, WildcardReceivesKeepEachSendersOrderAcrossTags) {
  InProcessHub hub(2);
  const int tags[] = {kTagWriteBack, kTagControl, kTagFetchRequest, kTagPlan, kTagControl};
  for (int k = 0; k < 200; ++k) {
    ASSERT_TRUE(hub.endpoint(0).Send(1, tags[k % 5], Text(std::to_string(k))).ok());
  }
  for (int k = 0; k < 200; ++k) {
    auto m = hub.endpoint(1).Receive(kAnySource, kAnyTag, absl::Seconds(1));
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(Str(m->payload), std::to_string(k));
    EXPECT_EQ(m->tag, tags[k % 5]);
  }
}

TEST(InProcessTransportTest, ReceiveTimesOutNamingThePeer) {
  InProcessHub hub(2);
  auto m = hub.endpoint(1).Receive(0, kTagPlan, absl::Milliseconds(20));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status()));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("from rank 0"));
}

TEST(InProcessTransportTest, AbortWakesEveryWaiterWithTheReason) {
  InProcessHub hub(3);
  absl::Status seen;
  std::thread waiter(
      [&] { seen = hub.endpoint(2).Receive(kAnySource, kTagPlan, absl::Seconds(30)).status(); });
  hub.endpoint(1).Abort(absl::InternalError("trainer 0 failed"));
  waiter.join();
  EXPECT_THAT(std::string(seen.message()), HasSubstr("trainer 0 failed"));
  EXPECT_FALSE(hub.endpoint(0).Send(1, kTagTest, {}).ok());
  EXPECT_FALSE(hub.endpoint(0).aborted().ok());
}

// A peer that ended (its MPI transport said goodbye) sends nothing more: a receive from it fails
// at once, naming it and why, once what it sent before is received; other peers still wait.
TEST(MailboxTest, AReceiveFromAGonePeerFailsAtOnceAfterItsLastMessages) {
  Mailbox mailbox(0);
  mailbox.Deliver({2, kTagOptions, Text("last")});
  mailbox.MarkGone(2, "it ended with NOT_FOUND: no data");
  auto last = mailbox.Receive(2, kTagOptions, absl::Hours(1));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(Str(last->payload), "last");
  const absl::Time start = absl::Now();
  auto gone = mailbox.Receive(2, kTagOptions, absl::Hours(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gone.status().message(),
              HasSubstr("rank 0 waits for a message (tag 15) from rank 2"));
  EXPECT_THAT(gone.status().message(), HasSubstr("it ended with NOT_FOUND: no data"));
  // A receive from another peer, or from any peer, still waits (here: times out).
  EXPECT_EQ(mailbox.Receive(1, kTagOptions, absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(mailbox.Receive(kAnySource, kTagOptions, absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A receive already waiting is woken.
  absl::Status waiting;
  std::thread waiter([&] { waiting = mailbox.Receive(3, kTagOptions, absl::Hours(1)).status(); });
  absl::SleepFor(absl::Milliseconds(50));
  mailbox.MarkGone(3, "it ended (its own log says why)");
  waiter.join();
  EXPECT_THAT(waiting.message(), HasSubstr("from rank 3, which ended its part of the job"));
}

TEST(InProcessTransportTest, SendToAnInvalidRankFails) {
  InProcessHub hub(2);
  EXPECT_FALSE(hub.endpoint(0).Send(5, kTagTest, {}).ok());
}

TEST(InProcessTransportTest, EmulatedLinkDelaysByLatencyAndBandwidth) {
  auto link = LinkModel::Parse("8Mbit/s,30ms");  // 1 MB/s
  ASSERT_TRUE(link.ok()) << link.status();
  InProcessHub hub(2, *link, /*emulated=*/{1});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(hub.endpoint(0).Send(1, kTagTest, Bytes(20000)).ok());  // 20 ms on the wire
  auto m = hub.endpoint(1).Receive(0, kTagTest, absl::Seconds(5));
  ASSERT_TRUE(m.ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  // Not emulated: ranks 0 <-> 0 would be immediate; here only rank 1's links are slow.
}

TEST(LinkModelTest, ParsesUnitsAndRejectsNonsense) {
  auto a = LinkModel::Parse("25Gbit/s,20us");
  ASSERT_TRUE(a.ok());
  EXPECT_DOUBLE_EQ(a->bytes_per_second, 25e9 / 8);
  EXPECT_EQ(a->latency, absl::Microseconds(20));
  auto b = LinkModel::Parse("10GB/s");
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->bytes_per_second, 1e10);
  EXPECT_FALSE(LinkModel::Parse("none")->enabled());
  EXPECT_FALSE(LinkModel::Parse("fast").ok());
  EXPECT_FALSE(LinkModel::Parse("10Gbit/s,soon").ok());
  EXPECT_FALSE(LinkModel::Parse("-1Gbit/s").ok());
}

TEST(LinkModelTest, RefusesInfiniteAndDenormalValuesAndParsesItsOwnText) {
  // An infinite latency never delivers a message; an infinite or denormal bandwidth makes the
  // transfer times infinite or meaningless.
  for (const char* text : {"1Gbit/s,inf", "inf Gbit/s", "1e308GB/s", "1e-320bit/s", "3e307B/s"}) {
    const absl::StatusOr<LinkModel> link = LinkModel::Parse(text);
    EXPECT_EQ(link.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(link.status().message(), HasSubstr("--server-link")) << text;
  }
  // Echoed input is escaped and cut.
  const absl::StatusOr<LinkModel> long_text = LinkModel::Parse(std::string(5000, '\x01'));
  ASSERT_FALSE(long_text.ok());
  EXPECT_LT(long_text.status().message().size(), 400u);
  EXPECT_THAT(long_text.status().message(), HasSubstr("\\x01"));
  // What ToString prints ("1 Gbit/s, 200us") parses back to the same link.
  const absl::StatusOr<LinkModel> link = LinkModel::Parse("1Gbit/s,200us");
  ASSERT_TRUE(link.ok());
  const absl::StatusOr<LinkModel> again = LinkModel::Parse(link->ToString());
  ASSERT_TRUE(again.ok()) << link->ToString() << ": " << again.status();
  EXPECT_DOUBLE_EQ(again->bytes_per_second, link->bytes_per_second);
  EXPECT_EQ(again->latency, link->latency);
}

TEST(ProtocolTest, MessagesRoundTrip) {
  FetchRequest request{7, 42, {1, 2, 3}, {-1, 5, 9}};
  auto decoded = DecodeFetchRequest(EncodeFetchRequest(request));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->id, 7u);
  EXPECT_EQ(decoded->rows, request.rows);
  EXPECT_EQ(decoded->after_stamps, request.after_stamps);
  WriteBack wb{12, {4, 5}, {1.5f, 2.5f, 3.5f, 4.5f}};
  auto wb2 = DecodeWriteBack(EncodeWriteBack(wb));
  ASSERT_TRUE(wb2.ok());
  EXPECT_EQ(wb2->records, wb.records);
  EXPECT_EQ(wb2->stamp, 12);
}

TEST(ProtocolTest, TruncatedMessagesAreDataLossNotCrashes) {
  Bytes bytes = EncodeFetchRequest(FetchRequest{1, 2, {1, 2, 3}, {0, 0, 0}});
  for (size_t cut = 0; cut < bytes.size(); cut += 3) {
    Bytes part(bytes.begin(), bytes.begin() + cut);
    auto decoded = DecodeFetchRequest(part);
    ASSERT_FALSE(decoded.ok()) << cut;
    EXPECT_TRUE(absl::IsDataLoss(decoded.status()));
  }
}

TEST(ProtocolTest, RowsSpreadOverServers) {
  std::vector<int> counts(4, 0);
  for (RowId row = 0; row < 4000; ++row) ++counts[ServerOfRow(row, 4)];
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(JobLayoutTest, RanksAndValidation) {
  JobLayout layout{2, 3};
  EXPECT_EQ(layout.size(), 6);
  EXPECT_EQ(layout.RoleOf(0), Role::kOracle);
  EXPECT_EQ(layout.RoleOf(2), Role::kServer);
  EXPECT_EQ(layout.RoleOf(3), Role::kTrainer);
  EXPECT_EQ(layout.IndexOf(5), 2);
  EXPECT_EQ(layout.Describe(4), "rank 4 (trainer 1)");
  EXPECT_TRUE(layout.Validate(6).ok());
  absl::Status wrong = layout.Validate(4);
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("needs 1 + 2 + 3 = 6"));
  EXPECT_FALSE((JobLayout{0, 1}).Validate().ok());
}

}  // namespace
}  // namespace bagpipe

namespace bagpipe {
namespace {

TEST(CollectivesTest, AllReduceSumIsExactAndIdenticalOnEveryMember) {
  for (int members : {2, 3, 5}) {
    InProcessHub hub(members + 1);
    const size_t count = 1003;
    std::vector<std::vector<float>> data(members, std::vector<float>(count));
    for (int m = 0; m < members; ++m) {
      for (size_t k = 0; k < count; ++k) data[m][k] = 0.1f * (m + 1) + 1e-3f * k;
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(members);
    for (int m = 0; m < members; ++m) {
      threads.emplace_back([&, m] {
        Group group;
        for (int r = 1; r <= members; ++r) group.ranks.push_back(r);
        group.me = m;
        results[m] =
            AllReduceSum(hub.endpoint(m + 1), group, data[m].data(), count, absl::Seconds(10));
      });
    }
    for (auto& t : threads) t.join();
    for (int m = 0; m < members; ++m) ASSERT_TRUE(results[m].ok()) << results[m];
    for (size_t k = 0; k < count; ++k) {
      float expected = 0.0f;
      for (int m = 0; m < members; ++m) expected += 0.1f * (m + 1) + 1e-3f * k;
      for (int m = 0; m < members; ++m) ASSERT_EQ(data[m][k], expected) << m << " " << k;
    }
  }
}

TEST(CollectivesTest, DoubleSumsKeepCountsAboveTwoToThe24Exact) {
  // Counters summed over trainers (samples, rows, hits): 2^24 + 1 is not a float.
  const int members = 3;
  InProcessHub hub(members);
  const int64_t big = (int64_t{1} << 24) + 1;
  std::vector<std::vector<double>> data(members);
  for (int m = 0; m < members; ++m) {
    data[m] = {static_cast<double>(big), static_cast<double>(m), 0.5};
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(members);
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      Group group{{0, 1, 2}, m};
      results[m] =
          AllReduceSum(hub.endpoint(m), group, data[m].data(), data[m].size(), absl::Seconds(10));
    });
  }
  for (auto& t : threads) t.join();
  for (int m = 0; m < members; ++m) {
    ASSERT_TRUE(results[m].ok()) << results[m];
    EXPECT_EQ(static_cast<int64_t>(data[m][0]), 3 * big);
    EXPECT_EQ(data[m][1], 3.0);
    EXPECT_EQ(data[m][2], 1.5);
  }
}

TEST(CollectivesTest, MembersCallingWithDifferentTypesGetAClearError) {
  InProcessHub hub(2);
  std::vector<float> floats(4, 1.0f);
  std::vector<double> doubles(4, 1.0);
  absl::Status float_status, double_status;
  std::thread other([&] {
    float_status = AllReduceSum(hub.endpoint(0), Group{{0, 1}, 0}, floats.data(), floats.size(),
                                absl::Seconds(10));
  });
  double_status = AllReduceSum(hub.endpoint(1), Group{{0, 1}, 1}, doubles.data(), doubles.size(),
                               absl::Seconds(10));
  other.join();
  EXPECT_THAT(float_status.message(), testing::HasSubstr("different sizes or types"));
  EXPECT_THAT(double_status.message(), testing::HasSubstr("different sizes or types"));
}

TEST(CollectivesTest, DifferentTypesOfTheSameByteLengthAreRefusedNotMixed) {
  // 4 floats and 2 doubles split into parts of the same byte lengths: each part names its type
  // and count, so both members fail instead of summing floats with doubles' bytes.
  InProcessHub hub(2);
  std::vector<float> floats = {1, 2, 3, 4};
  std::vector<double> doubles = {3, 5};
  absl::Status float_status, double_status;
  std::thread other([&] {
    float_status = AllReduceSum(hub.endpoint(0), Group{{0, 1}, 0}, floats.data(), floats.size(),
                                absl::Seconds(10));
  });
  double_status = AllReduceSum(hub.endpoint(1), Group{{0, 1}, 1}, doubles.data(), doubles.size(),
                               absl::Seconds(10));
  other.join();
  EXPECT_THAT(float_status.message(),
              testing::HasSubstr("rank 1 reduces 2 double values, this member 4 float values"));
  EXPECT_THAT(double_status.message(),
              testing::HasSubstr("rank 0 reduces 4 float values, this member 2 double values"));
  // Same type, different counts whose parts have the same length: refused too.
  std::vector<float> three = {1, 2, 3}, four = {1, 2, 3, 4};
  std::thread again([&] {
    float_status = AllReduceSum(hub.endpoint(0), Group{{0, 1}, 0}, three.data(), three.size(),
                                absl::Seconds(10));
  });
  const absl::Status four_status =
      AllReduceSum(hub.endpoint(1), Group{{0, 1}, 1}, four.data(), four.size(), absl::Seconds(10));
  again.join();
  EXPECT_THAT(four_status.message(), testing::HasSubstr("rank 0 reduces 3 float values"));
}

TEST(CollectivesTest, AMemberThatDoesNotJoinIsNamedAndItsPeersPartIsVisible) {
  InProcessHub hub(3);
  std::vector<float> data(6, 1.0f);
  // Member 0 (rank 1) all-reduces; member 1 (rank 2) never does.
  const absl::Status status = AllReduceSum(hub.endpoint(1), Group{{1, 2}, 0}, data.data(),
                                           data.size(), absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status));
  EXPECT_THAT(status.message(),
              testing::AllOf(HasSubstr("rank 1 waited 50ms in an all-reduce over 2 members for "
                                       "the part of member 1 (rank 2), which did not join it"),
                             HasSubstr("the same all-reduces")));
  // Rank 2 sees that rank 1 waits in a collective it has not joined; nobody else does.
  EXPECT_EQ(hub.endpoint(2).SourcesWithPending(kTagDense), std::vector<int>{1});
  EXPECT_TRUE(hub.endpoint(0).SourcesWithPending(kTagDense).empty());
  EXPECT_TRUE(hub.endpoint(2).SourcesWithPending(kTagPlan).empty());
}

}  // namespace
}  // namespace bagpipe
