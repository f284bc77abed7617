// Specification of params.bin reading: a written dump reads back exactly, and a damaged or
// crafted file is an error naming it, never a crash or a huge allocation.
#include "trainer_hooks/param_dump.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "core/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/data_testing.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

constexpr size_t kHeaderBytes = 64 * 1024;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ParamDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestTempPath("param_dump_test", "run");
    std::filesystem::create_directories(dir_);
    auto writer = ParamWriter::Create(dir_, {{"dim", 2}}, 3);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->AddDense({0.5f, -1.0f}).ok());
    const float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    ASSERT_TRUE((*writer)->AddRow(3, a).ok());
    ASSERT_TRUE((*writer)->AddRow(70, b).ok());
    auto sha = (*writer)->Finish();
    ASSERT_TRUE(sha.ok()) << sha.status();
    bytes_ = ReadBytes(dir_ + "/params.bin");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Reads `bytes` as a params.bin.
  absl::Status ReadDamaged(const std::string& bytes) {
    const std::string path = dir_ + "/damaged.bin";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return ReadParamDump(path).status();
  }
  // The file with its header JSON replaced by `header`.
  std::string WithHeader(const nlohmann::json& header) {
    const std::string text = header.dump();
    std::string bytes = bytes_;
    const uint64_t length = text.size();
    std::memcpy(bytes.data() + 8, &length, 8);
    std::fill(bytes.begin() + 16, bytes.begin() + kHeaderBytes, ' ');
    std::memcpy(bytes.data() + 16, text.data(), text.size());
    return bytes;
  }
  nlohmann::json Header() {
    uint64_t length = 0;
    std::memcpy(&length, bytes_.data() + 8, 8);
    return nlohmann::json::parse(bytes_.substr(16, length));
  }

  std::string dir_;
  std::string bytes_;
};

// A dump that cannot be written (a full disk; here a file size limit) leaves no file, but the
// fingerprint is computed all the same: the run's results are not lost with the file.
TEST_F(ParamDumpTest, AFailedFileKeepsTheFingerprintAndLeavesNoFile) {
  const std::string dir = dir_ + "/full";
  std::filesystem::create_directories(dir);
  auto fingerprint_only = ParamWriter::Create("", {{"dim", 2}}, 1024);
  auto writer = ParamWriter::Create(dir, {{"dim", 2}}, 1024);
  ASSERT_TRUE(writer.ok() && fingerprint_only.ok());
  const std::vector<float> record(1024, 0.25f);
  {
    const sighandler_t old_handler = ::signal(SIGXFSZ, SIG_IGN);
    rlimit old_limit;
    ::getrlimit(RLIMIT_FSIZE, &old_limit);
    rlimit limit = old_limit;
    limit.rlim_cur = kHeaderBytes + 64 * 1024;  // the header and a few rows
    ::setrlimit(RLIMIT_FSIZE, &limit);
    for (RowId row = 0; row < 200; ++row) {
      ASSERT_TRUE((*writer)->AddRow(row, record.data()).ok());
      ASSERT_TRUE((*fingerprint_only)->AddRow(row, record.data()).ok());
    }
    const absl::StatusOr<std::string> sha = (*writer)->Finish();
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    ::signal(SIGXFSZ, old_handler);
    ASSERT_TRUE(sha.ok()) << sha.status();
    EXPECT_EQ(*sha, *(*fingerprint_only)->Finish());
  }
  EXPECT_THAT((*writer)->file_error().message(), HasSubstr("params.bin"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST_F(ParamDumpTest, AWrittenDumpReadsBack) {
  auto dump = ReadParamDump(dir_);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->dense, (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(dump->rows, (std::vector<RowId>{3, 70}));
  EXPECT_EQ(dump->records, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(CompareParams(*dump, *dump).identical);
}

// Another dump beside the fixture's: `dense` values and rows 3 and `row` of `floats` floats.
absl::StatusOr<ParamDump> WriteAndRead(const std::string& dir, std::vector<float> dense, int floats,
                                       RowId row) {
  std::filesystem::create_directories(dir);
  ASSIGN_OR_RETURN(auto writer, ParamWriter::Create(dir, {{"dim", floats}}, floats));
  RETURN_IF_ERROR(writer->AddDense(dense));
  const std::vector<float> a(static_cast<size_t>(floats), 1.0f),
      b(static_cast<size_t>(floats), 2.5f);
  RETURN_IF_ERROR(writer->AddRow(3, a.data()));
  RETURN_IF_ERROR(writer->AddRow(row, b.data()));
  RETURN_IF_ERROR(writer->Finish().status());
  return ReadParamDump(dir);
}

// A value NaN or infinite in one dump: counted, and the maximum difference says so (std::max
// used to drop a NaN difference and report 0).
TEST_F(ParamDumpTest, NonFiniteDifferencesShowInTheMaximum) {
  auto dump = ReadParamDump(dir_);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ParamDump nan = *dump;
  nan.dense[0] = std::numeric_limits<float>::quiet_NaN();
  nan.records[4] = 5.5f;  // a finite difference among the rows
  ParamComparison c = CompareParams(*dump, nan);
  EXPECT_FALSE(c.identical);
  EXPECT_EQ(c.differing_values, 2);
  EXPECT_EQ(c.nonfinite_differences, 1);
  EXPECT_TRUE(std::isnan(c.dense_max_abs_diff));
  EXPECT_DOUBLE_EQ(c.rows_max_abs_diff, 0.5);
  EXPECT_NE(c.ToJson().dump().find("\"dense_max_abs_diff\":null"), std::string::npos);
  EXPECT_EQ(c.ToJson()["nonfinite_differences"], 1);
  // NaN against the same NaN is no difference; an infinite one makes the maximum inf.
  EXPECT_TRUE(CompareParams(nan, nan).identical);
  ParamDump inf = *dump;
  inf.records[0] = std::numeric_limits<float>::infinity();
  c = CompareParams(*dump, inf);
  EXPECT_EQ(c.nonfinite_differences, 1);
  EXPECT_TRUE(std::isinf(c.rows_max_abs_diff));
  EXPECT_EQ(c.dense_max_abs_diff, 0.0);
}

TEST_F(ParamDumpTest, DumpsOfDifferentModelsAreNotComparedValueByValue) {
  auto dump = ReadParamDump(dir_);
  ASSERT_TRUE(dump.ok()) << dump.status();
  // Another embedding dimension: the first floats of each record are equal, and must not make the
  // comparison look close.
  auto wider = WriteAndRead(dir_ + "/wider", {0.5f, -1.0f}, 4, 70);
  ASSERT_TRUE(wider.ok()) << wider.status();
  ParamComparison c = CompareParams(*dump, *wider);
  EXPECT_FALSE(c.comparable);
  EXPECT_FALSE(c.same_shape);
  EXPECT_FALSE(c.identical);
  EXPECT_EQ(c.differing_values, 0);
  nlohmann::json json = c.ToJson();
  EXPECT_EQ(json["record_floats"], nlohmann::json({3, 4}));
  EXPECT_TRUE(json["differing_values"].is_null());
  EXPECT_TRUE(json["rows_max_abs_diff"].is_null());
  // Another dense model.
  auto other_dense = WriteAndRead(dir_ + "/dense", {0.5f, -1.0f, 7.0f}, 3, 70);
  ASSERT_TRUE(other_dense.ok()) << other_dense.status();
  c = CompareParams(*dump, *other_dense);
  EXPECT_FALSE(c.comparable);
  EXPECT_EQ(c.ToJson()["dense_values"], nlohmann::json({2, 3}));
  // The same model over other rows: the shared rows are compared, the others counted.
  auto other_rows = WriteAndRead(dir_ + "/rows", {0.5f, -1.0f}, 3, 71);
  ASSERT_TRUE(other_rows.ok()) << other_rows.status();
  c = CompareParams(*dump, *other_rows);
  EXPECT_TRUE(c.comparable);
  EXPECT_FALSE(c.same_shape);
  EXPECT_EQ(c.rows_only_in_a, 1);
  EXPECT_EQ(c.rows_only_in_b, 1);
  EXPECT_EQ(c.differing_values, 2);  // row 3: {1, 2, 3} against {1, 1, 1}
  EXPECT_DOUBLE_EQ(c.rows_max_abs_diff, 2.0);
}

TEST_F(ParamDumpTest, TruncatedOrExtendedFilesAreRefused) {
  absl::Status status = ReadDamaged(bytes_.substr(0, bytes_.size() - 1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("damaged.bin' is truncated for its header"));
  status = ReadDamaged(bytes_ + "xxxx");
  EXPECT_THAT(std::string(status.message()), HasSubstr("is longer than its header"));
  status = ReadDamaged(bytes_.substr(0, 1000));
  EXPECT_THAT(std::string(status.message()), HasSubstr("truncated header"));
  status = ReadDamaged("BGPARAMS");
  EXPECT_THAT(std::string(status.message()), HasSubstr("is not a Bagpipe parameter file"));
}

// A FIFO (or device) in place of the dump is refused without blocking on it.
TEST_F(ParamDumpTest, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto dump = ReadParamDump(fifo);
  ASSERT_FALSE(dump.ok());
  EXPECT_THAT(std::string(dump.status().message()), HasSubstr("(not a regular file)"));
  EXPECT_FALSE(ReadParamDump("/dev/zero").ok());
}

TEST_F(ParamDumpTest, AFlippedByteFailsTheFingerprint) {
  std::string bytes = bytes_;
  bytes[bytes.size() - 2] ^= 0x40;
  const absl::Status status = ReadDamaged(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("is corrupt: SHA-256 of the parameters"));
}

TEST_F(ParamDumpTest, CraftedCountsAreRefusedBeforeAllocating) {
  const uint64_t huge_length = uint64_t{1} << 62;
  std::string bytes = bytes_;
  std::memcpy(bytes.data() + 8, &huge_length, 8);
  EXPECT_THAT(std::string(ReadDamaged(bytes).message()), HasSubstr("corrupt header"));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"rows", int64_t{1} << 60},
                                                           {"rows", -1},
                                                           {"dense_count", int64_t{1} << 61},
                                                           {"record_floats", int64_t{1} << 40},
                                                           {"record_floats", 1e300},
                                                           {"rows", "two"},
                                                           {"dense_count", nullptr}}) {
    nlohmann::json header = Header();
    header[key] = value;
    const absl::Status status = ReadDamaged(WithHeader(header));
    EXPECT_FALSE(status.ok()) << key << " = " << value;
    EXPECT_THAT(std::string(status.message()), HasSubstr("damaged.bin")) << key;
  }
}

TEST_F(ParamDumpTest, RowsOutOfOrderAreRefused) {
  std::string bytes = bytes_;
  const uint64_t row = 99;  // the first row, now after the second one (70)
  std::memcpy(bytes.data() + kHeaderBytes + 2 * 4, &row, 8);
  EXPECT_THAT(std::string(ReadDamaged(bytes).message()),
              HasSubstr("row 1 (RowId 70) does not follow RowId 99"));
}

}  // namespace
}  // namespace bagpipe
