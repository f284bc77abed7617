// Specifications of core/: status macros, error conversion, hashing, randomness, row
// initialisation, the CPU device context, metrics files.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/checks.h"
#include "core/device.h"
#include "core/excerpt.h"
#include "core/json_fields.h"
#include "core/metrics.h"
#include "core/optimizer.h"
#include "core/progress.h"
#include "core/random.h"
#include "core/row_init.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/tunables.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

absl::Status FailsWhen(bool fail) {
  if (fail) return absl::InvalidArgumentError("bad");
  return absl::OkStatus();
}
absl::StatusOr<int> ValueOr(bool fail) {
  if (fail) return absl::NotFoundError("missing");
  return 42;
}
absl::Status UsesMacros(bool fail_first, bool fail_second, int* out) {
  RETURN_IF_ERROR(FailsWhen(fail_first));
  ASSIGN_OR_RETURN(const int value, ValueOr(fail_second));
  *out = value;
  return absl::OkStatus();
}

// An exception escaping a thread's body becomes the job's error, named by kind.
TEST(StatusTest, ExceptionsBecomeStatuses) {
  EXPECT_TRUE(StatusOfCall([] { return absl::OkStatus(); }).ok());
  EXPECT_EQ(StatusOfCall([] { return absl::NotFoundError("x"); }).code(),
            absl::StatusCode::kNotFound);
  const absl::Status memory = StatusOfCall([]() -> absl::Status { throw std::bad_alloc(); });
  EXPECT_EQ(memory.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(memory.message()), HasSubstr("out of memory (lower the sizes"));
  const absl::Status thread =
      StatusOfCall([]() -> absl::Status { throw std::runtime_error("pthread_create has failed"); });
  EXPECT_THAT(std::string(thread.message()),
              HasSubstr("cannot start a thread (pthread_create has failed)"));
  const absl::Status other =
      StatusOfCall([]() -> absl::Status { throw std::out_of_range("vector::at"); });
  EXPECT_EQ(other.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(other.message()), HasSubstr("unexpected exception: vector::at"));
  EXPECT_EQ(StatusOfCall([]() -> absl::Status { throw 7; }).code(), absl::StatusCode::kInternal);
}

TEST(StatusTest, MacrosPropagateErrorsAndAssignValues) {
  int out = 0;
  EXPECT_TRUE(UsesMacros(false, false, &out).ok());
  EXPECT_EQ(out, 42);
  EXPECT_TRUE(absl::IsInvalidArgument(UsesMacros(true, false, &out)));
  EXPECT_TRUE(absl::IsNotFound(UsesMacros(false, true, &out)));
  EXPECT_EQ(Annotate(absl::NotFoundError("x"), "reading plan 3").message(), "reading plan 3: x");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
}

// A resumed job's bar starts at its checkpoint, and its rate counts the iterations done since:
// 10 iterations in at least 50 ms are at most 200 per second (counting the 900 before the
// checkpoint as done in that time gave thousands).
TEST(ProgressTest, AResumedCountsRateLeavesOutTheWorkBefore) {
  ::testing::internal::CaptureStderr();
  {
    Progress progress("train", 1000, true);
    progress.Resume(900);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    progress.Update(910);
  }
  const std::string line = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(line, ::testing::HasSubstr("910/1000  91%"));
  const size_t at = line.find(" it/s");
  ASSERT_NE(at, std::string::npos) << line;
  const size_t begin = line.rfind(' ', at - 1) + 1;
  const double rate = std::stod(line.substr(begin, at - begin));
  EXPECT_GT(rate, 0) << line;
  EXPECT_LE(rate, 200) << line;
}

TEST(ExcerptTest, ShortEscapedAndCut) {
  EXPECT_EQ(Excerpt("abc"), "abc");
  // Control characters, a NUL, quotes and a UTF-8 byte order mark are all visible.
  EXPECT_EQ(Excerpt(std::string("a\r\0'\xEF\xBB\xBF", 7)), "a\\r\\x00\\'\\xef\\xbb\\xbf");
  // A 10 MB field becomes its first bytes and its length.
  const std::string huge(10'000'000, 'x');
  const std::string cut = Excerpt(huge);
  EXPECT_EQ(cut, std::string(kExcerptBytes, 'x') + "... (10000000 bytes)");
  EXPECT_EQ(Excerpt("abcdef", 3), "abc... (6 bytes)");
  // The result is printable ASCII however hostile the input.
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  for (char c : Excerpt(all, 256)) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c);
  // The bound holds for the escaped form: bytes that escape to four characters are cut sooner.
  EXPECT_EQ(Excerpt(std::string(1000, '\xff'), 10), "\\xff\\xff... (1000 bytes)");
  EXPECT_EQ(Excerpt("ab\x01", 6), "ab\\x01");
  EXPECT_EQ(Excerpt("ab\x01", 5), "ab... (3 bytes)");
  EXPECT_LE(Excerpt(all, 256).size(), 256u + 30);
}

TEST(PrintableTest, EscapesControlsAndInvalidBytesKeepsText) {
  EXPECT_EQ(Printable("/data/day_0.tsv"), "/data/day_0.tsv");
  // Valid UTF-8 stays (2, 3 and 4 bytes), backslashes too.
  EXPECT_EQ(Printable("/données/日本/\xF0\x9F\x98\x80\\x"), "/données/日本/\xF0\x9F\x98\x80\\x");
  // Tab, CR, LF, ESC (a terminal's escape sequences), NUL, DEL and the C1 controls (U+009B is
  // CSI) are escaped; LF stays a line break where asked.
  EXPECT_EQ(Printable(std::string("a\tb\rc\nd\x1b[31me\0f\x7fg", 17)),
            "a\\tb\\rc\\nd\\x1b[31me\\x00f\\x7fg");
  EXPECT_EQ(Printable("a\nb\x1b", /*keep_newlines=*/true), "a\nb\\x1b");
  EXPECT_EQ(Printable("\xC2\x9B"
                      "1m"),
            "\\xc2\\x9b1m");
  // Bytes outside valid UTF-8: a lone continuation byte, a truncated sequence, an overlong form,
  // a surrogate, a code point above U+10FFFF.
  EXPECT_EQ(Printable("\x80"), "\\x80");
  EXPECT_EQ(Printable("\xE6\x97"), "\\xe6\\x97");
  EXPECT_EQ(Printable("\xC0\xAF"), "\\xc0\\xaf");
  EXPECT_EQ(Printable("\xED\xA0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(Printable("\xF4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  // Every byte value: the result holds no control character (as the bytes or as UTF-8).
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  for (char c : Printable(all)) EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
  EXPECT_EQ(Printable(all).find("\xC2\x9B"), std::string::npos);
}

TEST(ChecksTest, MpiErrorsNameTheCallAndLocation) {
  absl::Status status = internal::MpiStatus(/*MPI_ERR_RANK*/ 6, "MPI_Send(x)", "sync/a.cc", 12);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("MPI_Send(x) failed at sync/a.cc:12"));
  EXPECT_TRUE(internal::MpiStatus(0, "MPI_Send", "f", 1).ok());
}

TEST(Sha256Test, KnownVectors) {
  Sha256 empty;
  EXPECT_EQ(empty.HexDigest(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.Update("a", 1);
  abc.Update("bc", 2);
  EXPECT_EQ(abc.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(RandomTest, CounterRngIsAPureFunctionOfKeyAndPosition) {
  CounterRng a(HashKey(1, 2, 3)), b(HashKey(1, 2, 3)), c(HashKey(1, 2, 4));
  for (int k = 0; k < 10; ++k) EXPECT_EQ(a(), b());
  EXPECT_NE(CounterRng(HashKey(1, 2, 3))(), c());
  CounterRng skip(HashKey(1, 2, 3), 5);
  CounterRng walk(HashKey(1, 2, 3));
  for (int k = 0; k < 5; ++k) walk();
  EXPECT_EQ(skip(), walk());
  double sum = 0;
  CounterRng u(7);
  for (int k = 0; k < 100000; ++k) {
    const double x = u.NextDouble();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    sum += x;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
  for (int k = 0; k < 1000; ++k) EXPECT_LT(u.NextBelow(7), 7u);
}

TEST(RowInitTest, SameRowSameValuesWithinTheTableScale) {
  RowInitializer init(3, 8, 8, 0.1f, {10, 400});
  EXPECT_EQ(init.TableOf(0), 0);
  EXPECT_EQ(init.TableOf(9), 0);
  EXPECT_EQ(init.TableOf(10), 1);
  std::vector<float> a(16), b(16);
  init.Init(123, a.data());
  init.Init(123, b.data());
  EXPECT_EQ(a, b);
  for (int c = 0; c < 8; ++c) EXPECT_LE(std::abs(a[c]), 0.05f);  // sqrt(1/400)
  for (int c = 8; c < 16; ++c) EXPECT_EQ(a[c], 0.1f);
  std::vector<float> other(16);
  init.Init(124, other.data());
  EXPECT_NE(a, other);
  EXPECT_EQ(RowInitializer(4, 8, 8, 0.1f, {10, 400}).record_floats(), 16);
}

TEST(OptimizerTest, NamesAndStateSizes) {
  EXPECT_EQ(*ParseOptimizerKind("adagrad"), OptimizerKind::kAdagrad);
  EXPECT_EQ(*ParseOptimizerKind("rowwise-adagrad"), OptimizerKind::kRowwiseAdagrad);
  EXPECT_FALSE(ParseOptimizerKind("adam").ok());
  EXPECT_EQ(StateFloatsPerRow(OptimizerKind::kSgd, 16), 0);
  EXPECT_EQ(StateFloatsPerRow(OptimizerKind::kAdagrad, 16), 16);
  EXPECT_EQ(RecordFloats(OptimizerKind::kRowwiseAdagrad, 16), 17);
}

TEST(DeviceTest, CpuContextCopiesAndAllocates) {
  auto context = DeviceContext::Cpu(CpuStreams::kSync);
  EXPECT_EQ(context->backend(), Backend::kCpu);
  auto array = DeviceArray<float>::Create(context, 100);
  ASSERT_TRUE(array.ok());
  std::vector<float> host(100, 2.5f), back(100, 0);
  ASSERT_TRUE(context->CopyToDevice(array->data(), host.data(), 400).ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), array->data(), 400).ok());
  EXPECT_EQ(back, host);
  ASSERT_TRUE(context->Zero(array->data(), 400).ok());
  ASSERT_TRUE(context->CopyToHost(back.data(), array->data(), 400).ok());
  EXPECT_EQ(back, std::vector<float>(100, 0));
  EXPECT_TRUE(ParseBackend("cpu").ok());
  EXPECT_FALSE(ParseBackend("tpu").ok());
}

TEST(DeviceTest, CudaIsEitherUsableOrCleanlyAbsent) {
  if (CudaDeviceCount() == 0) {
    EXPECT_FALSE(DeviceContext::Cuda(0).ok());
    EXPECT_FALSE(CudaDeviceDescription(0).empty());
    GTEST_SKIP() << "no CUDA device: " << CudaDeviceDescription(0);
  }
  auto context = DeviceContext::Cuda(0);
  ASSERT_TRUE(context.ok()) << context.status();
  auto array = DeviceArray<float>::Create(*context, 1 << 20);
  ASSERT_TRUE(array.ok());
  std::vector<float> host(1 << 20, 1.5f), back(1 << 20, 0);
  ASSERT_TRUE((*context)->CopyToDevice(array->data(), host.data(), host.size() * 4).ok());
  ASSERT_TRUE((*context)->CopyToHost(back.data(), array->data(), host.size() * 4).ok());
  ASSERT_TRUE((*context)->Synchronize().ok());
  EXPECT_EQ(back, host);
}

TEST(MetricsTest, JsonLinesAreOneObjectPerLine) {
  const std::string path =
      ::testing::TempDir() + "/metrics_" + std::to_string(::getpid()) + ".jsonl";
  {
    auto writer = JsonLinesWriter::Open(path);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Write({{"iteration", 1}, {"loss", 0.5}}).ok());
    ASSERT_TRUE((*writer)->Write({{"iteration", 2}, {"loss", 0.25}}).ok());
  }
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    auto record = nlohmann::json::parse(line);
    EXPECT_EQ(record["iteration"], ++lines);
  }
  EXPECT_EQ(lines, 2);
  in.close();
  std::filesystem::remove(path);
  EXPECT_FALSE(JsonLinesWriter::Open("/nonexistent/dir/x.jsonl").ok());
}

// A resumed job keeps the lines up to the iteration it resumes from; damaged lines go, and a
// path that is not a regular file is refused before it is read (a FIFO would block).
TEST(MetricsTest, ResumingKeepsTheLinesUpToTheCheckpointAndRefusesOtherFiles) {
  const std::string path =
      ::testing::TempDir() + "/metrics_resume_" + std::to_string(::getpid()) + ".jsonl";
  {
    std::ofstream out(path);
    out << "{\"iteration\":1}\n{\"iteration\":null}\n{\"iteration\":\"2\"}\n"
        << "{\"iteration\":1e300}\n{\"iteration\":18446744073709551615}\n"
        << "{\"iteration\":{}}\n{\"note\":\"kept\"}\n{\"iteration\":3}\n{\"iteration\":2}\n";
  }
  {
    auto writer = JsonLinesWriter::Open(path);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Start(2).ok());
  }
  std::ifstream in(path);
  std::stringstream kept;
  kept << in.rdbuf();
  EXPECT_EQ(kept.str(), "{\"iteration\":1}\n{\"note\":\"kept\"}\n{\"iteration\":2}\n");
  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto writer = JsonLinesWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  const absl::Status fifo = (*writer)->Start(2);
  EXPECT_THAT(std::string(fifo.message()), ::testing::HasSubstr("is not a regular file"));
  std::filesystem::remove(path);
}

TEST(JsonFieldsTest, UntrustedJsonNestedTooDeepIsRefused) {
  bool too_deep = true;
  const nlohmann::json shallow = ParseUntrustedJson(R"({"a": [1, {"b": [2]}]})", &too_deep);
  EXPECT_FALSE(shallow.is_discarded());
  EXPECT_FALSE(too_deep);
  EXPECT_EQ(shallow["a"][1]["b"][0], 2);
  EXPECT_TRUE(ParseUntrustedJson("{\"a\": ", &too_deep).is_discarded());
  EXPECT_FALSE(too_deep);
  // Deep enough to overflow the stack in a recursive copy, comparison or dump.
  const std::string deep = "{\"a\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_TRUE(ParseUntrustedJson(deep, &too_deep).is_discarded());
  EXPECT_TRUE(too_deep);
  const std::string limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_FALSE(ParseUntrustedJson(limit).is_discarded());
}

// A Latin-1 path or column name (Linux and CSV files allow them) in a summary, a header or a
// message: written with U+FFFD for the bytes that are not UTF-8, where nlohmann's dump throws.
TEST(JsonFieldsTest, StringsThatAreNotUtf8AreDumpedWithReplacementCharacters) {
  const nlohmann::json value = {{"path", "/data/ann\xe9e.tsv"}, {"ok", "caf\xc3\xa9"}};
  EXPECT_THROW((void)value.dump(), nlohmann::json::type_error);
  EXPECT_EQ(DumpJson(value), "{\"ok\":\"caf\xc3\xa9\",\"path\":\"/data/ann\xef\xbf\xbd.tsv\"}");
  EXPECT_EQ(DumpJson(value, -1, /*ensure_ascii=*/true),
            "{\"ok\":\"caf\\u00e9\",\"path\":\"/data/ann\\ufffd.tsv\"}");
  EXPECT_EQ(DumpJson(nlohmann::json{{"a", 1}}, 2), "{\n  \"a\": 1\n}");
}

TEST(TunablesTest, ListedWithDefaults) {
  auto list = ListTunables();
  ASSERT_FALSE(list.empty());
  for (const auto& t : list) {
    EXPECT_EQ(t.env.rfind("BAGPIPE_", 0), 0u) << t.env;
    EXPECT_LE(t.min_value, t.default_value) << t.env;
    EXPECT_LE(t.default_value, t.max_value) << t.env;
  }
}

TEST(TunablesTest, ValuesOutsideTheRangeOrNotIntegersFallBackToTheDefault) {
  constexpr char kEnv[] = "BAGPIPE_TEST_TUNABLE_VALUE";
  unsetenv(kEnv);
  EXPECT_EQ(ReadTunable(kEnv, 7, 1, 100), 7);
  setenv(kEnv, "42", 1);
  EXPECT_EQ(ReadTunable(kEnv, 7, 1, 100), 42);
  for (const char* bad : {"0", "101", "-5", "12abc", "", "1e3", "99999999999999999999999"}) {
    setenv(kEnv, bad, 1);
    EXPECT_EQ(ReadTunable(kEnv, 7, 1, 100), 7) << "'" << bad << "'";
  }
  unsetenv(kEnv);
}

}  // namespace
}  // namespace bagpipe
