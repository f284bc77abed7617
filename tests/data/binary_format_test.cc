// Specification of the binary format: exact round trips and detection of damaged files.
#include "data/binary_format.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "data/criteo_reader.h"
#include "data/source.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/binary_crafting.h"
#include "tests/data/data_testing.h"

namespace bagpipe {
namespace {

using ::testing::AnyOf;
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

uint32_t FormatVersion(const std::string& path) {
  uint32_t version = 0;
  const std::string bytes = ReadBytes(path);
  if (bytes.size() >= 12) std::memcpy(&version, bytes.data() + 8, 4);
  return version;
}

// Format version 3 stores no offsets for a table whose every bag holds one id (Criteo's 26
// tables: 160 bytes a sample instead of 368); tables with other bags keep theirs.
TEST(BinaryFormatTest, OneHotTablesAreStoredWithoutOffsets) {
  SourceOptions csv;
  csv.schema = "label=rating>3.5; dense=year; sparse=userId,movieId,split(genres,|)";
  const std::string movielens =
      std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  auto source = Must(OpenSource("csv:" + movielens, csv));
  const std::string path = TempPath("mixed.bin");
  ASSERT_TRUE(WriteBinary(*source, path).ok());
  const std::optional<BinaryParts> parts = SplitBinary(ReadBytes(path));
  ASSERT_TRUE(parts.has_value());
  const nlohmann::json& tables = parts->header["tables"];
  ASSERT_EQ(tables.size(), 3u);
  EXPECT_EQ(tables[0].value("one_hot", false), true) << tables.dump();
  EXPECT_EQ(tables[1].value("one_hot", false), true) << tables.dump();
  EXPECT_FALSE(tables[2].contains("one_hot")) << tables.dump();  // genres: 1-10 ids a bag
  EXPECT_TRUE(tables[2].contains("offsets")) << tables.dump();
  EXPECT_EQ(FormatVersion(path), 3u);
  source = Must(OpenSource("csv:" + movielens, csv));
  auto binary = Must(OpenBinary(path, {}));
  const std::vector<Batch> expected = ReadBatches(*source, 4099);
  const std::vector<Batch> actual = ReadBatches(*binary, 4099);
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_GT(actual.size(), 1u);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(actual[i] == expected[i]) << i;

  // Criteo: every table one-hot; labels, 13 dense floats and 26 4-byte ids a sample.
  auto criteo = Must(OpenCriteo(kCriteo, {}));
  const std::string criteo_path = TempPath("criteo_one_hot.bin");
  ASSERT_TRUE(WriteBinary(*criteo, criteo_path).ok());
  const std::optional<BinaryParts> criteo_parts = SplitBinary(ReadBytes(criteo_path));
  ASSERT_TRUE(criteo_parts.has_value());
  for (const nlohmann::json& table : criteo_parts->header["tables"]) {
    EXPECT_EQ(table.value("one_hot", false), true) << table.dump();
  }
  EXPECT_LE(criteo_parts->body.size(), 100u * (4 + 13 * 4 + 26 * 4) + 28 * 8);
  // Without a one-hot table the file is written in version 2 (older readers read it).
  auto multi_hot = Must(OpenSynthetic("samples=50,rows=10/5,pooling=0-3,seed=2", {}));
  const std::string multi_hot_path = TempPath("multi_hot.bin");
  ASSERT_TRUE(WriteBinary(*multi_hot, multi_hot_path).ok());
  EXPECT_EQ(FormatVersion(multi_hot_path), 2u);
}

// The mean ids a sample carries over one epoch, by reading it.
double ReadIdsPerSample(SampleSource& source) {
  int64_t samples = 0, ids = 0;
  for (const Batch& batch : ReadBatches(source, 1000)) {
    samples += batch.num_samples;
    ids += batch.num_ids();
  }
  EXPECT_TRUE(source.Rewind().ok());
  return samples > 0 ? static_cast<double>(ids) / static_cast<double>(samples) : -1;
}

// A binary file's header gives every table's id count: the mean ids per sample (which the
// oracle's window grows with) is known before the data are read, for multi-hot tables, one-hot
// ones (format version 3, no offsets) and within --max-samples.
TEST(BinaryFormatTest, TheHeaderSaysHowManyIdsASampleCarries) {
  auto pooled = Must(OpenSynthetic("samples=300,rows=50/20,pooling=20,seed=3", {}));
  const std::string pooled_path = TempPath("pooled.bin");
  ASSERT_TRUE(WriteBinary(*pooled, pooled_path).ok());
  auto binary = Must(OpenBinary(pooled_path, {}));
  EXPECT_EQ(binary->IdsPerSample(), 40.0);  // 2 tables of 20 ids a bag

  auto varied = Must(OpenSynthetic("samples=500,rows=50/20/30,pooling=0-9,seed=5", {}));
  const std::string varied_path = TempPath("varied.bin");
  ASSERT_TRUE(WriteBinary(*varied, varied_path).ok());
  binary = Must(OpenBinary(varied_path, {}));
  const double mean = binary->IdsPerSample();
  EXPECT_GT(mean, 3 * 2.0);
  EXPECT_LT(mean, 3 * 7.0);
  EXPECT_DOUBLE_EQ(mean, ReadIdsPerSample(*binary));
  // Within --max-samples: the first 123 samples' bags, not the file's.
  SourceOptions limited;
  limited.max_samples = 123;
  binary = Must(OpenBinary(varied_path, limited));
  EXPECT_DOUBLE_EQ(binary->IdsPerSample(), ReadIdsPerSample(*binary));
  EXPECT_NE(binary->IdsPerSample(), mean);

  // Criteo: 26 one-hot tables (version 3 stores no offsets for them).
  auto criteo = Must(OpenCriteo(kCriteo, {}));
  const std::string criteo_path = TempPath("criteo_ids.bin");
  ASSERT_TRUE(WriteBinary(*criteo, criteo_path).ok());
  ASSERT_EQ(FormatVersion(criteo_path), 3u);
  binary = Must(OpenBinary(criteo_path, {}));
  EXPECT_EQ(binary->IdsPerSample(), 26.0);
  limited.max_samples = 10;
  EXPECT_EQ(Must(OpenBinary(criteo_path, limited))->IdsPerSample(), 26.0);

  // One-hot and multi-hot tables together: two one-hot tables and 1-10 genres a movie.
  SourceOptions csv;
  csv.schema = "label=rating>3.5; sparse=userId,movieId,split(genres,|)";
  const std::string movielens =
      std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
  auto mixed = Must(OpenSource("csv:" + movielens, csv));
  const std::string mixed_path = TempPath("mixed_ids.bin");
  ASSERT_TRUE(WriteBinary(*mixed, mixed_path).ok());
  binary = Must(OpenBinary(mixed_path, {}));
  EXPECT_GT(binary->IdsPerSample(), 3.0);
  EXPECT_DOUBLE_EQ(binary->IdsPerSample(), ReadIdsPerSample(*binary));

  // No sample: no mean.
  auto empty = Must(OpenSynthetic("samples=0,scale=0.001", {}));
  const std::string empty_path = TempPath("empty_ids.bin");
  ASSERT_TRUE(WriteBinary(*empty, empty_path).ok());
  EXPECT_EQ(Must(OpenBinary(empty_path, {}))->IdsPerSample(), -1);
}

// A range over the whole epoch keeps its source's mean; a part of it does not know its own.
TEST(BinaryFormatTest, OnlyARangeOverTheWholeEpochKnowsItsIdsPerSample) {
  auto pooled = Must(OpenSynthetic("samples=100,rows=50/20,pooling=0-5,seed=3", {}));
  const std::string path = TempPath("range_ids.bin");
  ASSERT_TRUE(WriteBinary(*pooled, path).ok());
  const double mean = Must(OpenBinary(path, {}))->IdsPerSample();
  ASSERT_GT(mean, 0);
  EXPECT_EQ(SampleRange(Must(OpenBinary(path, {})), 0, -1)->IdsPerSample(), mean);
  EXPECT_EQ(SampleRange(Must(OpenBinary(path, {})), 0, 100)->IdsPerSample(), mean);
  EXPECT_EQ(SampleRange(Must(OpenBinary(path, {})), 0, 500)->IdsPerSample(), mean);
  EXPECT_EQ(SampleRange(Must(OpenBinary(path, {})), 0, 60)->IdsPerSample(), -1);
  EXPECT_EQ(SampleRange(Must(OpenBinary(path, {})), 40, -1)->IdsPerSample(), -1);
  // Text does not know it before it is read.
  EXPECT_EQ(Must(OpenCriteo(kCriteo, {}))->IdsPerSample(), -1);
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
  EXPECT_THAT(status.message(), HasSubstr("body checksum mismatch"));
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

// The header checksum covers every byte outside the body: the header JSON, the lengths in the
// prefix and the body's checksum.
TEST_F(CorruptionTest, EveryHeaderByteIsCoveredByTheChecksum) {
  for (size_t at : {size_t{12}, size_t{16}, size_t{24}, size_t{32}, size_t{47}, size_t{48},
                    size_t{60}, size_t{200}}) {
    std::string bytes = bytes_;
    bytes[at] ^= 0x01;
    const absl::Status status = OpenDamaged(bytes);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << at;
    EXPECT_THAT(status.message(), AnyOf(HasSubstr("header checksum mismatch"),
                                        HasSubstr("truncated inside its header")))
        << at;
  }
}

TEST_F(CorruptionTest, HugeHeaderLengthIsRefusedWithoutAllocating) {
  std::string bytes = bytes_;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(bytes.data() + 16, &huge, 8);
  const absl::Status status = OpenDamaged(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("4611686018427387904 header bytes announced"));
}

// Files whose checksums are valid but whose header or body lies: every size and offset is
// checked before it is used, and every value a read returns.
class CraftedFileTest : public ::testing::Test {
 protected:
  // 10 samples, 2 dense columns, 2 tables of 10 and 5 rows, 1-2 ids per bag.
  void SetUp() override { Convert("pooling=1-2", "crafted_base.bin"); }
  // parts_: the file converted from the synthetic stream above with `pooling`.
  void Convert(const std::string& pooling, const std::string& name) {
    auto source = Must(OpenSynthetic("samples=10,rows=10/5,dense=2,seed=3," + pooling, {}));
    const std::string path = TempPath(name);
    ASSERT_TRUE(WriteBinary(*source, path).ok());
    auto parts = SplitBinary(ReadBytes(path));
    ASSERT_TRUE(parts.has_value());
    parts_ = *parts;
  }
  // Opens the file of `parts` and reads it to its end in reads of 4 samples.
  absl::Status OpenAndRead(const BinaryParts& parts, uint32_t version = 3) {
    const std::string path = TempPath("crafted.bin");
    WriteBytes(path, JoinBinary(parts, version));
    absl::StatusOr<std::unique_ptr<SampleSource>> source = OpenBinary(path, {});
    if (!source.ok()) return source.status();
    Batch batch;
    while (true) {
      absl::StatusOr<int64_t> read = (*source)->Read(4, &batch);
      if (!read.ok()) return read.status();
      if (*read == 0) return absl::OkStatus();
      EXPECT_TRUE(batch.Validate((*source)->schema()).ok());
    }
  }
  template <typename T>
  void Poke(BinaryParts& parts, int64_t body_offset, T value) {
    ASSERT_LE(body_offset + sizeof(T), parts.body.size());
    std::memcpy(parts.body.data() + body_offset, &value, sizeof(T));
  }
  int64_t Section(const char* key) { return parts_.header[key].get<int64_t>(); }
  int64_t TableSection(int table, const char* key) {
    return parts_.header["tables"][table][key].get<int64_t>();
  }
  BinaryParts parts_;
};

TEST_F(CraftedFileTest, TheUnmodifiedFileReads) { EXPECT_TRUE(OpenAndRead(parts_).ok()); }

TEST_F(CraftedFileTest, FormatVersionOneIsReadWithTheSameValidation) {
  EXPECT_TRUE(OpenAndRead(parts_, 1).ok());
  BinaryParts parts = parts_;
  Poke<float>(parts, Section("labels") + 4 * 3, 7.0f);
  const absl::Status status = OpenAndRead(parts, 1);
  EXPECT_THAT(status.message(), HasSubstr("record 3 has label 7 (labels must be in [0, 1])"));
}

TEST_F(CraftedFileTest, LabelsOutsideZeroOneAndNonFiniteValuesNameTheRecord) {
  BinaryParts parts = parts_;
  Poke<float>(parts, Section("labels") + 4 * 6, 7.0f);
  absl::Status status = OpenAndRead(parts);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("crafted.bin': record 6 has label 7"));
  parts = parts_;
  Poke<float>(parts, Section("labels"), std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("record 0 has label nan"));
  parts = parts_;
  // Record 5's second dense column.
  Poke<float>(parts, Section("dense") + 4 * (5 * 2 + 1), std::numeric_limits<float>::infinity());
  status = OpenAndRead(parts);
  EXPECT_THAT(status.message(), HasSubstr("record 5, dense column 'I2': value inf is not finite"));
  parts = parts_;
  Poke<float>(parts, Section("dense") + 4 * 8, -std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("record 4, dense column 'I1'"));
}

TEST_F(CraftedFileTest, IdsOutOfTheTableNameTheRecord) {
  BinaryParts parts = parts_;
  // Table 1 has 5 rows and 4-byte ids; its first id belongs to record 0.
  Poke<uint32_t>(parts, TableSection(1, "ids"), 77);
  const absl::Status status = OpenAndRead(parts);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("record 0, table 'C2': id 77 is out of range [0, 5)"));
}

TEST_F(CraftedFileTest, OffsetsOutsideTheIdsOrDecreasingAreRefused) {
  const int64_t offsets = TableSection(0, "offsets");
  int64_t last = 0;
  std::memcpy(&last, parts_.body.data() + offsets + 8 * 10, 8);
  // Record 6's bag ends before it begins.
  BinaryParts parts = parts_;
  Poke<int64_t>(parts, offsets + 8 * 7, 0);
  absl::Status status = OpenAndRead(parts);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("record 6, table 'C1': bag ["));
  EXPECT_THAT(status.message(), HasSubstr("is decreasing or outside the table's"));
  // A bag past the table's ids (but offsets[n] intact).
  parts = parts_;
  Poke<int64_t>(parts, offsets + 8 * 2, last + 1000);
  status = OpenAndRead(parts);
  EXPECT_THAT(status.message(), HasSubstr("record 1, table 'C1'"));
  // A huge count of ids in the last offset, and a negative one: refused at open.
  for (const int64_t bad : {int64_t{1} << 61, int64_t{-8}}) {
    parts = parts_;
    Poke<int64_t>(parts, offsets + 8 * 10, bad);
    status = OpenAndRead(parts);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(status.message(), HasSubstr("outside its ids section"));
  }
}

// The same checks on a file whose tables are one-hot (no offsets section).
class CraftedOneHotFileTest : public CraftedFileTest {
 protected:
  void SetUp() override {
    Convert("pooling=1", "crafted_one_hot_base.bin");
    ASSERT_EQ(parts_.header["tables"][1].value("one_hot", false), true);
  }
};

TEST_F(CraftedOneHotFileTest, ReadsAndNamesTheRecordOfABadId) {
  EXPECT_TRUE(OpenAndRead(parts_).ok());
  BinaryParts parts = parts_;
  // Table 1 has 5 rows and 4-byte ids; id k is record k's.
  Poke<uint32_t>(parts, TableSection(1, "ids") + 4 * 7, 77);
  const absl::Status status = OpenAndRead(parts);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("record 7, table 'C2': id 77 is out of range [0, 5)"));
}

TEST_F(CraftedOneHotFileTest, AOneHotMarkIsCheckedLikeEveryHeaderField) {
  // Only version 3 has it.
  EXPECT_THAT(OpenAndRead(parts_, 2).message(),
              HasSubstr("table 'C1' is marked one_hot, which format version 2 has not"));
  EXPECT_THAT(OpenAndRead(parts_, 1).message(), HasSubstr("format version 1 has not"));
  for (const nlohmann::json& bad :
       {nlohmann::json(false), nlohmann::json("yes"), nlohmann::json(1), nlohmann::json(nullptr)}) {
    BinaryParts parts = parts_;
    parts.header["tables"][0]["one_hot"] = bad;
    const absl::Status status = OpenAndRead(parts);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << bad.dump();
    EXPECT_THAT(status.message(), HasSubstr("\"one_hot\" must be true")) << bad.dump();
  }
  BinaryParts parts = parts_;
  parts.header["tables"][0]["offsets"] = 0;
  EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("its table has no offsets"));
  // More samples than the ids section holds: refused at open, before any allocation.
  for (const int64_t samples : {int64_t{11}, int64_t{1} << 62}) {
    parts = parts_;
    parts.header["samples"] = samples;
    const absl::Status status = OpenAndRead(parts);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << samples;
    EXPECT_THAT(status.message(), HasSubstr("lies outside the")) << samples;
  }
  parts = parts_;
  parts.header["tables"][1]["ids"] = int64_t{1} << 40;
  EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("table 'C2' ids section"));
}

TEST_F(CraftedFileTest, SizesThatCannotBeInTheFileAreRefusedWithoutAllocating) {
  // Sample counts whose section sizes overflow int64, or exceed the body.
  for (const int64_t samples :
       {int64_t{1} << 62, std::numeric_limits<int64_t>::max(), int64_t{1} << 40, int64_t{-1}}) {
    BinaryParts parts = parts_;
    parts.header["samples"] = samples;
    const absl::Status status = OpenAndRead(parts);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << samples;
    EXPECT_THAT(status.message(), AnyOf(HasSubstr("lies outside the"), HasSubstr("samples")))
        << samples;
  }
  // One sample more than written: the sections still fit the body, so the file opens or fails,
  // but every batch it returns is valid (checked by OpenAndRead).
  BinaryParts parts = parts_;
  parts.header["samples"] = 11;
  (void)OpenAndRead(parts);
  // n * dense * 4 overflows although n * 4 does not.
  parts = parts_;
  parts.header["samples"] = int64_t{1} << 60;
  for (int d = 0; d < 14; ++d) parts.header["schema"]["dense"].push_back("x");
  EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("lies outside the"));
  // Section offsets: negative, unaligned, past the body.
  for (const int64_t offset :
       {int64_t{-8}, int64_t{4}, int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    parts = parts_;
    parts.header["dense"] = offset;
    EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("dense section")) << offset;
    parts = parts_;
    parts.header["tables"][1]["ids"] = offset;
    EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("table 'C2' ids section")) << offset;
  }
}

TEST_F(CraftedFileTest, MalformedHeaderFieldsAreErrorsNotExceptions) {
  std::vector<std::pair<std::string, nlohmann::json>> edits = {
      {"/samples", "ten"},
      {"/samples", 1e300},
      {"/samples", 18446744073709551615ull},
      {"/tables/0/id_bytes", 3},
      {"/tables/0/id_bytes", 1e20},
      {"/tables", nlohmann::json::object()},
      {"/schema/table_rows/0", 2.5},
      {"/schema/table_rows/0", -4},
      {"/schema/table_rows", {std::numeric_limits<int64_t>::max(), 5}},
      {"/schema/tables", {1, 2}},
      {"/schema", "none"},
      {"/source", 12},
  };
  for (const auto& [pointer, value] : edits) {
    BinaryParts parts = parts_;
    parts.header[nlohmann::json::json_pointer(pointer)] = value;
    const absl::Status status = OpenAndRead(parts);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << pointer << " = " << value;
    EXPECT_THAT(status.message(), HasSubstr("has a corrupt header")) << pointer;
  }
  // A table count that disagrees with the schema.
  BinaryParts parts = parts_;
  parts.header["tables"].erase(1);
  EXPECT_THAT(OpenAndRead(parts).message(), HasSubstr("1 table sections for 2 tables"));
}

TEST_F(CraftedFileTest, EchoedNamesAreShortAndEscaped) {
  BinaryParts parts = parts_;
  parts.header["schema"]["tables"][1] = std::string("t\r\n\0", 4) + std::string(100000, 'x');
  Poke<uint32_t>(parts, TableSection(1, "ids"), 77);
  const absl::Status status = OpenAndRead(parts);
  EXPECT_THAT(status.message(), HasSubstr("table 't\\r\\n\\x00xxx"));
  EXPECT_THAT(status.message(), HasSubstr("... (100004 bytes)': id 77"));
  EXPECT_LT(status.message().size(), 400u);
}

TEST(BinaryFormatTest, AFileThatShrinksWhileReadIsAnErrorNotASignal) {
  auto source = Must(OpenSynthetic("samples=20000,scale=0.001,seed=5", {}));
  const std::string path = TempPath("shrinks.bin");
  ASSERT_TRUE(WriteBinary(*source, path).ok());
  auto binary = Must(OpenBinary(path, {}));
  Batch batch;
  ASSERT_EQ(*binary->Read(1000, &batch), 1000);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  absl::Status status;
  while (status.ok()) {
    absl::StatusOr<int64_t> read = binary->Read(1000, &batch);
    status = read.status();
    if (read.ok() && *read == 0) break;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("shrinks.bin' ends at byte"));
  EXPECT_THAT(status.message(), HasSubstr("shrank while it was being read"));
}

TEST(BinaryFormatTest, ADirectoryOrDeviceIsNotAFile) {
  EXPECT_THAT(OpenBinary(::testing::TempDir(), {}).status().message(), HasSubstr("is a directory"));
  EXPECT_THAT(OpenBinary("/dev/zero", {}).status().message(), HasSubstr("not a regular file"));
}

// A source that returns one block of samples, then signals `fd` and blocks forever: a
// conversion in progress.
class BlockingSource final : public SampleSource {
 public:
  explicit BlockingSource(int fd) : fd_(fd) {
    schema_.dense_names = {"d"};
    schema_.table_names = {"t"};
    schema_.table_rows = {10};
  }
  const Schema& schema() const override { return schema_; }
  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    batch->Reset(1, 1);
    if (reads_++ == 0) {
      batch->num_samples = 3;
      batch->labels = {0, 1, 0};
      batch->dense = {1, 2, 3};
      batch->offsets = {0, 1, 2, 3};
      batch->ids = {1, 2, 3};
      return 3;
    }
    const char byte = 1;
    EXPECT_EQ(write(fd_, &byte, 1), 1);
    while (true) pause();
  }
  absl::Status Rewind() override { return absl::OkStatus(); }
  SourceStats stats() const override { return {}; }
  std::string Describe() const override { return "blocking"; }

 private:
  const int fd_;
  Schema schema_;
  int reads_ = 0;
};

TEST(BinaryFormatTest, AKilledConversionLeavesNothingBehind) {
  const std::string dir = TempPath("killed");
  std::filesystem::create_directories(dir);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    BlockingSource source(fds[1]);
    (void)WriteBinary(source, dir + "/out.bin");
    _exit(0);
  }
  close(fds[1]);
  char byte = 0;
  ASSERT_EQ(read(fds[0], &byte, 1), 1);  // the child is in the middle of the conversion
  close(fds[0]);
  // Its output and four spill files are open in `dir`, without names.
  int open_in_dir = 0;
  const std::string real_dir = std::filesystem::canonical(dir).string();
  const std::string fd_dir = "/proc/" + std::to_string(child) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (target.rfind(real_dir + "/", 0) == 0) ++open_in_dir;
  }
  EXPECT_EQ(open_in_dir, 5);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(left, ::testing::IsEmpty());
}

TEST(BinaryFormatTest, ConvertingOverAnExistingFileReplacesIt) {
  const std::string dir = TempPath("replace");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/out.bin";
  for (const std::string spec : {"samples=50,scale=0.001,seed=1", "samples=70,scale=0.001"}) {
    auto source = Must(OpenSynthetic(spec, {}));
    ASSERT_TRUE(WriteBinary(*source, path).ok());
  }
  auto binary = Must(OpenBinary(path, {}));
  EXPECT_THAT(binary->Describe(), HasSubstr("70 samples"));
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(files, std::vector<std::string>{"out.bin"});
  std::filesystem::remove(path);
  // A directory or a missing directory as the output fails before reading the source.
  auto source = Must(OpenSynthetic("samples=10,scale=0.001", {}));
  EXPECT_THAT(std::string(WriteBinary(*source, dir).status().message()), HasSubstr("a directory"));
  EXPECT_THAT(std::string(WriteBinary(*source, dir + "/no/such/dir/x.bin").status().message()),
              HasSubstr("no/such/dir/x.bin"));
  EXPECT_EQ(source->stats().samples, 0);
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
