// Specification of the binary format: exact round trips and detection of damaged files.
#include "data/binary_format.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/criteo_reader.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/data_testing.h"

namespace bagpipe {
namespace {

using ::testing::HasSubstr;

const std::string kCriteo =
    std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/criteo_kaggle_sample_100.tsv";

std::string TempPath(const std::string& name) { return TestTempPath("binary_format_test", name); }

std::unique_ptr<SampleSource> Must(absl::StatusOr<std::unique_ptr<SampleSource>> source) {
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? std::move(source).value() : nullptr;
}

// Reads one epoch in pieces of `chunk` samples.
std::vector<Batch> ReadBatches(SampleSource& source, int64_t chunk) {
  std::vector<Batch> batches;
  Batch batch;
  while (true) {
    auto read = source.Read(chunk, &batch);
    EXPECT_TRUE(read.ok()) << read.status();
    if (!read.ok() || *read == 0) break;
    batches.push_back(batch);
  }
  return batches;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(BinaryFormatTest, SyntheticRoundTripIsExact) {
  const std::string spec = "samples=5000,scale=0.001,pooling=0-3,seed=7";
  auto source = Must(OpenSynthetic(spec, {}));
  const std::string path = TempPath("synthetic.bin");
  auto stats = WriteBinary(*source, path);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->samples, 5000);
  EXPECT_EQ(stats->bytes_written, static_cast<int64_t>(std::filesystem::file_size(path)));

  auto expected_source = Must(OpenSynthetic(spec, {}));
  auto binary = Must(OpenBinary(path, {}));
  EXPECT_EQ(binary->schema(), expected_source->schema());
  const std::vector<Batch> expected = ReadBatches(*expected_source, 333);
  const std::vector<Batch> actual = ReadBatches(*binary, 333);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(actual[i] == expected[i]) << i;
  EXPECT_EQ(binary->stats().samples, 5000);
  EXPECT_THAT(binary->Describe(), HasSubstr("synthetic"));
  // No temporary files are left beside the output.
  for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir())) {
    EXPECT_THAT(entry.path().string(), ::testing::Not(HasSubstr("synthetic.bin.tmp")));
  }
}

TEST(BinaryFormatTest, CriteoRoundTripIsExactAcrossEpochs) {
  auto criteo = Must(OpenCriteo(kCriteo, {}));
  const std::string path = TempPath("criteo.bin");
  ASSERT_TRUE(WriteBinary(*criteo, path).ok());
  const Schema final_schema = criteo->schema();
  // A fresh reader assigns the same dictionary ids and starts at stream position 0.
  criteo = Must(OpenCriteo(kCriteo, {}));
  auto binary = Must(OpenBinary(path, {}));
  EXPECT_EQ(binary->schema(), final_schema);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const std::vector<Batch> expected = ReadBatches(*criteo, 17);
    const std::vector<Batch> actual = ReadBatches(*binary, 17);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(actual[i] == expected[i]) << i;
    EXPECT_EQ(actual.front().first_sample, epoch * 100);
    ASSERT_TRUE(criteo->Rewind().ok());
    ASSERT_TRUE(binary->Rewind().ok());
  }
}

TEST(BinaryFormatTest, MaxSamplesLimitsEachEpoch) {
  auto source = Must(OpenSynthetic("samples=100,scale=0.001", {}));
  const std::string path = TempPath("max.bin");
  ASSERT_TRUE(WriteBinary(*source, path).ok());
  SourceOptions options;
  options.max_samples = 30;
  auto binary = Must(OpenBinary(path, options));
  Batch batch;
  EXPECT_EQ(*binary->Read(100, &batch), 30);
  EXPECT_EQ(*binary->Read(100, &batch), 0);
  ASSERT_TRUE(binary->Rewind().ok());
  EXPECT_EQ(*binary->Read(100, &batch), 30);
  EXPECT_EQ(batch.first_sample, 30);
}

TEST(BinaryFormatTest, EmptySourceRoundTrips) {
  auto source = Must(OpenSynthetic("samples=0,scale=0.001", {}));
  const std::string path = TempPath("empty.bin");
  ASSERT_TRUE(WriteBinary(*source, path).ok());
  auto binary = Must(OpenBinary(path, {}));
  Batch batch;
  EXPECT_EQ(*binary->Read(10, &batch), 0);
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto source = Must(OpenCriteo(kCriteo, {}));
    path_ = TempPath("corrupt.bin");
    ASSERT_TRUE(WriteBinary(*source, path_).ok());
    bytes_ = ReadBytes(path_);
  }
  absl::Status OpenDamaged(const std::string& bytes) {
    const std::string path = TempPath("damaged.bin");
    WriteBytes(path, bytes);
    return OpenBinary(path, {}).status();
  }
  std::string path_;
  std::string bytes_;
};

TEST_F(CorruptionTest, FlippedBodyByteFailsTheChecksum) {
  std::string bytes = bytes_;
  bytes[bytes.size() - 9] ^= 0x10;
  const absl::Status status = OpenDamaged(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("checksum mismatch"));
}

TEST_F(CorruptionTest, TruncatedFileIsDetected) {
  absl::Status status = OpenDamaged(bytes_.substr(0, bytes_.size() - 100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  status = OpenDamaged(bytes_.substr(0, 40));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
  status = OpenDamaged(bytes_.substr(0, 10));
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
}

TEST_F(CorruptionTest, BadMagicAndVersion) {
  std::string bytes = bytes_;
  bytes[0] = 'X';
  absl::Status status = OpenDamaged(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("bad magic"));
  bytes = bytes_;
  bytes[8] = 9;
  status = OpenDamaged(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("version 9"));
}

TEST_F(CorruptionTest, CorruptHeaderIsDetected) {
  std::string bytes = bytes_;
  bytes[24] = '#';  // the JSON's opening brace
  const absl::Status status = OpenDamaged(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("corrupt header"));
}

TEST(BinaryFormatTest, MissingFileIsNotFound) {
  EXPECT_EQ(OpenBinary("/nonexistent.bin", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST(BinaryFormatTest, FailedConversionLeavesNoOutput) {
  // A source that fails half-way (a bad line) must not leave a partial file.
  const std::string tsv = TempPath("bad.tsv");
  std::string text = ReadBytes(kCriteo);
  text += "bad line\n";
  WriteBytes(tsv, text);
  auto source = Must(OpenCriteo(tsv, {}));
  const std::string path = TempPath("failed.bin");
  std::filesystem::remove(path);
  EXPECT_FALSE(WriteBinary(*source, path).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace bagpipe
