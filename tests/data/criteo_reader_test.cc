// Specification of the Criteo TSV reader: parsing, encodings, epochs and error reports.
#include "data/criteo_reader.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tbb/global_control.h"
#include "tests/data/data_testing.h"

namespace bagpipe {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  return WriteTestFile("criteo_reader_test", name, text);
}

using ::testing::HasSubstr;

const std::string kFixture =
    std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/criteo_kaggle_sample_100.tsv";

// A valid line: label, 13 dense values, 26 hex values.
std::string Line(int label = 1, const std::string& first_dense = "3",
                 const std::string& first_categorical = "0000abcd") {
  std::vector<std::string> fields = {absl::StrCat(label), first_dense};
  for (int c = 1; c < kCriteoDense; ++c) fields.push_back(absl::StrCat(c));
  fields.push_back(first_categorical);
  for (int t = 1; t < kCriteoTables; ++t) fields.push_back(absl::StrCat("1000", t));
  return absl::StrJoin(fields, "\t");
}

std::unique_ptr<SampleSource> Open(const std::string& path, SourceOptions options = {}) {
  auto source = OpenCriteo(path, options);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? std::move(source).value() : nullptr;
}

absl::Status ReadError(const std::string& path, SourceOptions options = {}) {
  auto source = OpenCriteo(path, options);
  if (!source.ok()) return source.status();
  Batch batch;
  while (true) {
    auto read = (*source)->Read(7, &batch);
    if (!read.ok()) return read.status();
    if (*read == 0) return absl::OkStatus();
  }
}

TEST(CriteoReaderTest, FixtureHasKaggleShape) {
  auto source = Open(kFixture);
  const Batch all = ReadAll(*source, 32);
  EXPECT_EQ(all.num_samples, 100);
  EXPECT_EQ(all.num_dense, kCriteoDense);
  EXPECT_EQ(all.num_tables, kCriteoTables);
  EXPECT_EQ(source->schema().num_dense(), 13);
  EXPECT_EQ(source->schema().num_tables(), 26);
  EXPECT_EQ(source->schema().table_names[0], "C1");
  EXPECT_EQ(source->schema().dense_names[12], "I13");
  EXPECT_TRUE(all.Validate(source->schema()).ok());
  const SourceStats stats = source->stats();
  EXPECT_EQ(stats.samples, 100);
  EXPECT_EQ(stats.lines, 100);
  EXPECT_EQ(stats.skipped_lines, 0);
  EXPECT_GT(stats.bytes, 0);
  // 29 of the 100 fixture labels are clicks (counted with awk).
  int clicks = 0;
  for (float label : all.labels) clicks += label == 1.0f;
  EXPECT_EQ(clicks, 29);
}

TEST(CriteoReaderTest, FirstLineValuesComputedByHand) {
  // Line 1: 0 | "" 0 5 4 13275 14 35 4 41 "" 4 0 4 | 05db9164 ... C22 empty ... 731c3655
  auto source = Open(kFixture);
  Batch batch;
  ASSERT_EQ(*source->Read(2, &batch), 2);
  EXPECT_EQ(batch.labels[0], 0.0f);
  EXPECT_EQ(batch.labels[1], 1.0f);
  const std::vector<double> raw = {0, 0, 5, 4, 13275, 14, 35, 4, 41, 0, 4, 0, 4};
  for (int c = 0; c < kCriteoDense; ++c) {
    EXPECT_FLOAT_EQ(batch.dense[c], static_cast<float>(std::log(1.0 + raw[c]))) << "I" << c + 1;
  }
  // Dictionary encoding: every value of sample 0 is its table's first (row 1); C22 is empty.
  for (int t = 0; t < kCriteoTables; ++t) {
    EXPECT_EQ(batch.ids[batch.bag_begin(t, 0)], t == 21 ? 0 : 1) << "C" << t + 1;
    EXPECT_EQ(batch.bag_end(t, 0) - batch.bag_begin(t, 0), 1);
  }
  // Line 2 repeats C8 (0b153874), C9 (a73ee510), C19 and C20; C1 is new.
  EXPECT_EQ(batch.ids[batch.bag_begin(0, 1)], 2);
  EXPECT_EQ(batch.ids[batch.bag_begin(7, 1)], 1);
  EXPECT_EQ(batch.ids[batch.bag_begin(8, 1)], 1);
  EXPECT_EQ(batch.ids[batch.bag_begin(18, 1)], 1);
  EXPECT_EQ(batch.ids[batch.bag_begin(19, 1)], 1);
  // Line 2's dense I2 = 559.
  EXPECT_FLOAT_EQ(batch.dense[kCriteoDense + 1], static_cast<float>(std::log(560.0)));
  // Table sizes are exact for the samples read: C9 has seen one value, C1 two.
  EXPECT_EQ(source->schema().table_rows[8], 2);
  EXPECT_EQ(source->schema().table_rows[0], 3);
}

TEST(CriteoReaderTest, DictionaryTableRowsCountDistinctValues) {
  auto source = Open(kFixture);
  const Batch all = ReadAll(*source, 100);
  for (int t = 0; t < kCriteoTables; ++t) {
    absl::flat_hash_set<int64_t> distinct;
    for (int s = 0; s < all.num_samples; ++s) {
      const int64_t id = all.ids[all.bag_begin(t, s)];
      if (id != 0) distinct.insert(id);
    }
    EXPECT_EQ(source->schema().table_rows[t], static_cast<int64_t>(distinct.size()) + 1);
    // Ids are dense: 1..distinct.
    for (int64_t id : distinct) EXPECT_LE(id, static_cast<int64_t>(distinct.size()));
  }
  EXPECT_THAT(source->Describe(), HasSubstr("dictionary"));
}

TEST(CriteoReaderTest, ModHashingMapsIntoTheBudget) {
  SourceOptions options;
  options.row_budget = 1000;
  auto source = Open(kFixture, options);
  Batch batch;
  ASSERT_EQ(*source->Read(100, &batch), 100);
  EXPECT_EQ(source->schema().table_rows, std::vector<int64_t>(kCriteoTables, 1000));
  EXPECT_EQ(batch.ids[batch.bag_begin(0, 0)], 1 + static_cast<int64_t>(0x05db9164ULL % 999));
  EXPECT_EQ(batch.ids[batch.bag_begin(25, 0)], 1 + static_cast<int64_t>(0x731c3655ULL % 999));
  EXPECT_EQ(batch.ids[batch.bag_begin(21, 0)], 0);  // missing
  EXPECT_TRUE(batch.Validate(source->schema()).ok());
  EXPECT_THAT(source->Describe(), HasSubstr("mod 1000 hashing"));
}

TEST(CriteoReaderTest, OpenSourceDispatchesAndScansTheSchema) {
  auto source = OpenSource("criteo:" + kFixture, {});
  ASSERT_TRUE(source.ok()) << source.status();
  auto schema = ScanSchema(**source);
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->table_rows, (*source)->schema().table_rows);
  EXPECT_EQ(schema->table_rows[8], 3);  // C9: a73ee510 and 7cc72ec2 (cut -f23), plus row 0
  auto count = CountSamples(**source);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 100);
}

TEST(CriteoReaderTest, RowBudgetOfOneIsRejected) {
  SourceOptions options;
  options.row_budget = 1;
  EXPECT_EQ(OpenCriteo(kFixture, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CriteoReaderTest, RewindStartsANewEpochKeepingIds) {
  auto source = Open(kFixture);
  const Batch first = ReadAll(*source, 30);
  const std::vector<int64_t> rows = source->schema().table_rows;
  Batch batch;
  EXPECT_EQ(*source->Read(10, &batch), 0);  // stays at the end
  EXPECT_EQ(*source->Read(10, &batch), 0);
  ASSERT_TRUE(source->Rewind().ok());
  const Batch second = ReadAll(*source, 45);
  EXPECT_EQ(second.first_sample, 100);
  EXPECT_EQ(second.ids, first.ids);
  EXPECT_EQ(second.labels, first.labels);
  EXPECT_EQ(second.dense, first.dense);
  EXPECT_EQ(source->schema().table_rows, rows);
  EXPECT_EQ(source->stats().samples, 200);
}

TEST(CriteoReaderTest, MaxSamplesLimitsEachEpoch) {
  SourceOptions options;
  options.max_samples = 25;
  auto source = Open(kFixture, options);
  Batch batch;
  ASSERT_EQ(*source->Read(10, &batch), 10);
  ASSERT_EQ(*source->Read(100, &batch), 15);
  EXPECT_EQ(batch.first_sample, 10);
  ASSERT_EQ(*source->Read(100, &batch), 0);
  ASSERT_TRUE(source->Rewind().ok());
  ASSERT_EQ(*source->Read(100, &batch), 25);
  EXPECT_EQ(batch.first_sample, 25);
}

TEST(CriteoReaderTest, ResultDoesNotDependOnThreadCount) {
  // A larger file than the fixture so that parsing splits across tasks and chunks.
  std::string text;
  std::ifstream in(kFixture);
  const std::string fixture((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (int copy = 0; copy < 200; ++copy) text += fixture;
  const std::string path = WriteFile("threads.tsv", text);
  Batch one, four;
  {
    tbb::global_control control(tbb::global_control::max_allowed_parallelism, 1);
    auto source = Open(path);
    one = ReadAll(*source, 777);
  }
  {
    tbb::global_control control(tbb::global_control::max_allowed_parallelism, 4);
    auto source = Open(path);
    four = ReadAll(*source, 777);
  }
  EXPECT_EQ(one.num_samples, 20000);  // about 5 MB: more than one parse chunk
  EXPECT_TRUE(one == four);
}

TEST(CriteoReaderTest, LastLineWithoutNewlineIsRead) {
  const std::string path = WriteFile("no_newline.tsv", Line() + "\n" + Line(0));
  auto source = Open(path);
  EXPECT_EQ(ReadAll(*source, 10).num_samples, 2);
}

TEST(CriteoReaderTest, MissingFileIsNotFound) {
  const absl::Status status = OpenCriteo("/nonexistent/day_0", {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent/day_0"));
}

TEST(CriteoReaderTest, EmptyFileIsAnError) {
  const absl::Status status = OpenCriteo(WriteFile("empty.tsv", ""), {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("empty"));
}

TEST(CriteoReaderTest, WrongColumnCountNamesLine) {
  const std::string path = WriteFile("columns.tsv", Line() + "\n" + Line() + "\textra\n");
  const absl::Status status = ReadError(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":2:"));
  EXPECT_THAT(status.message(), HasSubstr("expected 40 tab-separated fields, found 41"));

  const std::string short_path = WriteFile("short.tsv", "1\t2\t3\n");
  EXPECT_THAT(ReadError(short_path).message(), HasSubstr(short_path + ":1:6: expected 40"));

  // The Kaggle test set's lines: no label column. The message says what is missing.
  const std::string unlabelled = WriteFile("test.txt", Line().substr(Line().find('\t') + 1) + "\n");
  EXPECT_THAT(ReadError(unlabelled).message(),
              HasSubstr("found 39 (the label, 13 integer and 26 categorical fields; a test file "
                        "without labels cannot train)"));
}

TEST(CriteoReaderTest, NonHexCategoricalNamesLineAndColumn) {
  const std::string path = WriteFile("hex.tsv", Line() + "\n" + Line(1, "3", "xyz12") + "\n");
  const absl::Status status = ReadError(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // Fields: "1\t3\t1\t...\t12\t" = 2 + 2 + 11 * 2 + 3 * 3 = 35 characters before C1.
  const std::string before = Line().substr(0, Line().find("0000abcd"));
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(path, ":2:", before.size() + 1, ":")));
  EXPECT_THAT(status.message(), HasSubstr("C1 'xyz12' is not a hexadecimal value"));
}

TEST(CriteoReaderTest, NonIntegerDenseNamesLineAndColumn) {
  const std::string path = WriteFile("dense.tsv", Line(1, "2.5") + "\n");
  const absl::Status status = ReadError(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":1:3:"));
  EXPECT_THAT(status.message(), HasSubstr("I1 '2.5' is not an integer"));
}

TEST(CriteoReaderTest, DenseIntegersOutsideInt64AreOutOfRange) {
  for (const std::string value :
       {"99999999999999999999", "-99999999999999999999", "9223372036854775808"}) {
    const std::string path = WriteFile("dense_range.tsv", Line() + "\n" + Line(1, value) + "\n");
    const absl::Status status = ReadError(path);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(path + ":2:3: dense field I1 '" + value + "' is out of range"))
        << value;
  }
  // The int64 limits themselves are values; a long number with a stray character is not one.
  auto source = Open(WriteFile("dense_limits.tsv", Line(1, "9223372036854775807") + "\n" +
                                                       Line(1, "-9223372036854775808") + "\n"));
  const Batch all = ReadAll(*source, 10);
  ASSERT_EQ(all.num_samples, 2);
  EXPECT_FLOAT_EQ(all.dense[0], std::log1p(9223372036854775807.0));
  EXPECT_EQ(all.dense[kCriteoDense], 0.0f);
  const std::string path = WriteFile("dense_junk.tsv", Line(1, "99999999999999999999x") + "\n");
  EXPECT_THAT(std::string(ReadError(path).message()),
              HasSubstr(":1:3: dense field I1 '99999999999999999999x' is not an integer"));
}

TEST(CriteoReaderTest, CategoricalsOfMoreThan16HexDigitsAreOutOfRange) {
  const std::string before = Line().substr(0, Line().find("0000abcd"));
  for (const std::string value : {"1ffffffffffffffff", "0000000000000000ab"}) {
    const std::string path = WriteFile("hex_range.tsv", Line(1, "3", value) + "\n");
    EXPECT_THAT(std::string(ReadError(path).message()),
                HasSubstr(absl::StrCat(path, ":1:", before.size() + 1, ": categorical field C1 '",
                                       value, "' is out of range (more than 16 hex digits)")))
        << value;
  }
  auto source = Open(WriteFile("hex_max.tsv", Line(1, "3", "ffffffffffffffff") + "\n"));
  EXPECT_EQ(ReadAll(*source, 10).num_samples, 1);
  const std::string path = WriteFile("hex_junk.tsv", Line(1, "3", "1ffffffffffffffffz") + "\n");
  EXPECT_THAT(std::string(ReadError(path).message()),
              HasSubstr("C1 '1ffffffffffffffffz' is not a hexadecimal value"));
}

TEST(CriteoReaderTest, BlankLinesAreSkippedAnywhere) {
  // Empty lines and lone "\r" lines: before, between and after the data.
  const std::string path = WriteFile("blank.tsv", "\n" + Line(1) + "\n\n\r\n" + Line(0) + "\n\n\n");
  auto source = Open(path);
  const Batch all = ReadAll(*source, 10);
  EXPECT_EQ(all.labels, (std::vector<float>{1, 0}));
  SourceStats stats = source->stats();
  EXPECT_EQ(stats.samples, 2);
  EXPECT_EQ(stats.lines, 7);  // every line read, blank ones included
  EXPECT_EQ(stats.skipped_lines, 0);
  // The next epoch reads the same samples.
  ASSERT_TRUE(source->Rewind().ok());
  EXPECT_EQ(ReadAll(*source, 1).labels, (std::vector<float>{1, 0}));

  // A file that ends with blank lines reads as the file without them.
  std::ifstream in(kFixture, std::ios::binary);
  const std::string fixture((std::istreambuf_iterator<char>(in)), {});
  auto plain = Open(kFixture);
  auto trailing = Open(WriteFile("trailing.tsv", fixture + "\n\n"));
  EXPECT_TRUE(ReadAll(*plain, 64) == ReadAll(*trailing, 64));
  EXPECT_EQ(trailing->stats().skipped_lines, 0);

  // Later errors keep the true line number.
  const std::string bad = WriteFile("blank_bad.tsv", "\n\n" + Line() + "\n\n" + Line(2) + "\n");
  EXPECT_THAT(std::string(ReadError(bad).message()),
              HasSubstr(bad + ":5:1: label '2' must be 0 or 1"));

  // Under skip_bad_lines a blank line is not a bad line.
  SourceOptions options;
  options.skip_bad_lines = true;
  source = Open(WriteFile("blank_skip.tsv", Line() + "\n\n" + Line(3) + "\n\n" + Line(0) + "\n"),
                options);
  EXPECT_EQ(ReadAll(*source, 10).num_samples, 2);
  stats = source->stats();
  EXPECT_EQ(stats.skipped_lines, 1);
  ASSERT_EQ(stats.first_errors.size(), 1u);
  EXPECT_THAT(stats.first_errors[0], HasSubstr(":3:1: label '3'"));

  // A line of spaces or tabs is not blank; a file of blank lines only has no data.
  const std::string spaces = WriteFile("spaces.tsv", Line() + "\n \n");
  EXPECT_THAT(std::string(ReadError(spaces).message()),
              HasSubstr(spaces + ":2:2: expected 40 tab-separated fields, found 1"));
  const std::string only = WriteFile("only_blank.tsv", "\n\r\n\n");
  EXPECT_THAT(std::string(ReadError(only).message()),
              HasSubstr("criteo: '" + only + "' has no data lines"));
}

TEST(CriteoReaderTest, AByteOrderMarkAtTheStartIsSkipped) {
  const std::string bom = "\xEF\xBB\xBF";
  std::ifstream in(kFixture, std::ios::binary);
  const std::string fixture((std::istreambuf_iterator<char>(in)), {});
  auto plain = Open(kFixture);
  auto marked = Open(WriteFile("bom_fixture.tsv", bom + fixture));
  const Batch expected = ReadAll(*plain, 64);
  EXPECT_TRUE(expected == ReadAll(*marked, 64));
  // Every epoch starts after it.
  ASSERT_TRUE(marked->Rewind().ok());
  ASSERT_TRUE(plain->Rewind().ok());
  EXPECT_TRUE(ReadAll(*plain, 64) == ReadAll(*marked, 64));

  // Columns on line 1 are counted after the mark.
  const std::string path = WriteFile("bom_error.tsv", bom + Line(1, "2.5") + "\n");
  EXPECT_THAT(std::string(ReadError(path).message()),
              HasSubstr(path + ":1:3: dense field I1 '2.5' is not an integer"));
  // A mark on a line of its own leaves a blank line; a doubled mark is data.
  auto own_line = Open(WriteFile("bom_line.tsv", bom + "\n" + Line() + "\n"));
  EXPECT_EQ(ReadAll(*own_line, 10).num_samples, 1);
  const std::string twice = WriteFile("bom_twice.tsv", bom + bom + Line() + "\n");
  EXPECT_THAT(std::string(ReadError(twice).message()),
              HasSubstr(twice + ":1:1: label '\\xef\\xbb\\xbf\\x31' must be 0 or 1"));
}

TEST(CriteoReaderTest, BadLabelIsAnError) {
  const std::string path = WriteFile("label.tsv", Line(2) + "\n");
  EXPECT_THAT(ReadError(path).message(), HasSubstr(path + ":1:1: label '2' must be 0 or 1"));
}

TEST(CriteoReaderTest, CrlfIsAnError) {
  const std::string path = WriteFile("crlf.tsv", Line() + "\r\n" + Line() + "\r\n");
  const absl::Status status = ReadError(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":1:"));
  EXPECT_THAT(status.message(), HasSubstr("CRLF"));
}

TEST(CriteoReaderTest, NegativeDenseClampsToZero) {
  const std::string path = WriteFile("negative.tsv", Line(1, "-3") + "\n");
  auto source = Open(path);
  Batch batch;
  ASSERT_EQ(*source->Read(1, &batch), 1);
  EXPECT_EQ(batch.dense[0], 0.0f);
  EXPECT_FLOAT_EQ(batch.dense[1], std::log(2.0f));
}

TEST(CriteoReaderTest, SkipBadLinesCountsAndKeepsErrors) {
  const std::string path =
      WriteFile("skip.tsv", Line() + "\n" + Line(1, "x") + "\n" + Line() + "\n" + "1\t2\n" +
                                Line(0, "4", "ffff") + "\r\n" + Line(0) + "\n");
  SourceOptions options;
  options.skip_bad_lines = true;
  auto source = Open(path, options);
  const Batch all = ReadAll(*source, 2);
  EXPECT_EQ(all.num_samples, 3);
  const SourceStats stats = source->stats();
  EXPECT_EQ(stats.lines, 6);
  EXPECT_EQ(stats.skipped_lines, 3);
  ASSERT_EQ(stats.first_errors.size(), 3u);
  EXPECT_THAT(stats.first_errors[0], HasSubstr(path + ":2:"));
  EXPECT_THAT(stats.first_errors[1], HasSubstr(path + ":4:"));
  EXPECT_THAT(stats.first_errors[2], HasSubstr("CRLF"));
  EXPECT_EQ(all.labels, (std::vector<float>{1, 1, 0}));
  // A second epoch skips the same lines without counting them again.
  ASSERT_TRUE(source->Rewind().ok());
  EXPECT_EQ(ReadAll(*source, 2).num_samples, 3);
  EXPECT_EQ(source->stats().skipped_lines, 3);
  EXPECT_EQ(source->stats().first_errors.size(), 3u);
}

TEST(CriteoReaderTest, EchoedValuesAreShortAndEscaped) {
  // A 10 MB categorical value, a NUL and a CR inside fields, a byte order mark before the label.
  std::string path = WriteFile("huge.tsv", Line(1, "3", std::string(10'000'000, 'f') + "g") + "\n");
  absl::Status status = ReadError(path);
  EXPECT_THAT(std::string(status.message()), HasSubstr(":1:"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("C1 'ffff"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("... (10000001 bytes)' is not a hex"));
  EXPECT_LT(status.message().size(), path.size() + 200);
  path = WriteFile("nul.tsv", Line(1, std::string("4\0", 2)) + "\n");
  EXPECT_THAT(std::string(ReadError(path).message()),
              HasSubstr(":1:3: dense field I1 '4\\x00' is not an integer"));
  path = WriteFile("cr.tsv", Line(1, "3", "ab\rcd") + "\n");
  EXPECT_THAT(std::string(ReadError(path).message()), HasSubstr("C1 'ab\\rcd'"));
  // A byte order mark after the start of the file is data.
  path = WriteFile("bom.tsv", Line() + "\n\xEF\xBB\xBF" + Line() + "\n");
  EXPECT_THAT(std::string(ReadError(path).message()),
              HasSubstr(":2:1: label '\\xef\\xbb\\xbf\\x31' must be 0 or 1"));
}

TEST(CriteoReaderTest, LinesLongerThanTheLimitAreRefused) {
  SourceOptions options;
  options.max_line_bytes = 1000;
  // A line inside one block, and an endless stream without line breaks.
  std::string path = WriteFile("long.tsv", Line() + "\n" + std::string(5000, '1') + "\n");
  EXPECT_THAT(std::string(ReadError(path, options).message()),
              HasSubstr(path + ":2: line longer than 1000 bytes"));
  options.max_line_bytes = 6 << 20;
  EXPECT_THAT(std::string(ReadError("/dev/zero", options).message()),
              HasSubstr("/dev/zero:1: line longer than 6291456 bytes (no line break"));
}

TEST(CriteoReaderTest, DirectoriesDevicesAndFilesWithoutValidLines) {
  EXPECT_THAT(std::string(OpenCriteo(::testing::TempDir(), {}).status().message()),
              HasSubstr("is a directory"));
  EXPECT_THAT(std::string(ReadError("/dev/null").message()),
              HasSubstr("criteo: '/dev/null' has no data lines"));
  SourceOptions options;
  options.skip_bad_lines = true;
  const std::string path = WriteFile("all_bad.tsv", "x\n" + Line(3) + "\n");
  EXPECT_THAT(std::string(ReadError(path, options).message()),
              HasSubstr("has no valid line (2 skipped; the first: " + path + ":1:"));
}

}  // namespace
}  // namespace bagpipe
