// Specification of the CSV reader: the column-spec grammar, encodings, quoting and errors.
#include "data/csv_reader.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data/data_testing.h"

namespace bagpipe {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  return WriteTestFile("csv_reader_test", name, text);
}

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kMovieLens =
    std::string(BAGPIPE_SOURCE_DIR) + "/tests/fixtures/movielens_small.csv";
const std::string kMovieLensSpec =
    "label=rating>3.5; dense=year; sparse=userId,movieId,split(genres,|)";

SourceOptions Spec(const std::string& spec) {
  SourceOptions options;
  options.schema = spec;
  return options;
}

std::unique_ptr<SampleSource> Open(const std::string& path, const SourceOptions& options) {
  auto source = OpenCsv(path, options);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? std::move(source).value() : nullptr;
}

absl::Status ReadError(const std::string& path, const SourceOptions& options) {
  auto source = OpenCsv(path, options);
  if (!source.ok()) return source.status();
  Batch batch;
  while (true) {
    auto read = (*source)->Read(5, &batch);
    if (!read.ok()) return read.status();
    if (*read == 0) return absl::OkStatus();
  }
}

std::vector<int64_t> Bag(const Batch& batch, int table, int sample) {
  return {batch.ids.begin() + batch.bag_begin(table, sample),
          batch.ids.begin() + batch.bag_end(table, sample)};
}

TEST(CsvReaderTest, MovieLensFixture) {
  auto source = Open(kMovieLens, Spec(kMovieLensSpec));
  const Batch all = ReadAll(*source, 30000);
  // 100005 lines: the header and 100004 ratings (checked with Python's csv module).
  EXPECT_EQ(all.num_samples, 100004);
  const Schema& schema = source->schema();
  EXPECT_EQ(schema.num_dense(), 1);
  EXPECT_EQ(schema.dense_names[0], "year");
  ASSERT_EQ(schema.num_tables(), 3);
  EXPECT_EQ(schema.table_names, (std::vector<std::string>{"userId", "movieId", "genres"}));
  // Distinct values (Python): 671 users, 9066 movies, 20 genres; plus the missing row.
  EXPECT_EQ(schema.table_rows, (std::vector<int64_t>{672, 9067, 21}));
  EXPECT_TRUE(all.Validate(schema).ok());
  // 51568 ratings are above 3.5.
  int positive = 0;
  for (float label : all.labels) positive += label == 1.0f;
  EXPECT_EQ(positive, 51568);
  // Line 2: 789652009,383,21,"Comedy|Crime|Thriller",1995,3
  EXPECT_EQ(all.labels[0], 0.0f);
  EXPECT_EQ(all.dense[0], 1995.0f);
  EXPECT_EQ(Bag(all, 0, 0), (std::vector<int64_t>{1}));
  EXPECT_EQ(Bag(all, 1, 0), (std::vector<int64_t>{1}));
  EXPECT_EQ(Bag(all, 2, 0), (std::vector<int64_t>{1, 2, 3}));
  // Line 3: 789652009,383,47,"Mystery|Thriller",1995,5: same user, new movie, Thriller again.
  EXPECT_EQ(all.labels[1], 1.0f);
  EXPECT_EQ(Bag(all, 0, 1), (std::vector<int64_t>{1}));
  EXPECT_EQ(Bag(all, 1, 1), (std::vector<int64_t>{2}));
  EXPECT_EQ(Bag(all, 2, 1), (std::vector<int64_t>{4, 3}));
  // Line 4: 789652009,383,1079,"Comedy|Crime",1988,3
  EXPECT_EQ(Bag(all, 2, 2), (std::vector<int64_t>{1, 2}));
  // Seven ratings have the year "NA" (missing: dense 0), the first on line 87728.
  int missing_years = 0;
  for (float year : all.dense) missing_years += year == 0.0f;
  EXPECT_EQ(missing_years, 7);
  EXPECT_EQ(all.dense[87728 - 2], 0.0f);
  const SourceStats stats = source->stats();
  EXPECT_EQ(stats.lines, 100005);
  EXPECT_EQ(stats.samples, 100004);
}

TEST(CsvReaderTest, OneSpellingForEveryWayOfWritingASpec) {
  const std::string written =
      "label=rating>3.5; dense=year,log(votes); sparse=userId,movieId,split(genres,|)";
  const nlohmann::json canonical = {{"label", "rating>3.5"},
                                    {"dense", {"year", "log(votes)"}},
                                    {"sparse", {"userId", "movieId", "split(genres,|)"}}};
  EXPECT_EQ(CanonicalCsvSpec(written), canonical);
  for (const std::string& spec : std::vector<std::string>{
           "label=rating>3.5;dense=year,log(votes);sparse=userId,movieId,split(genres,|)",
           " sparse = userId , movieId,split( genres ,|) ; dense=year, log( votes ); "
           "label = rating > 3.50 ;",
           "label=rating>3.5; dense=year; sparse=userId; dense=log(votes); "
           "sparse=movieId,split(genres,|)"}) {
    EXPECT_EQ(CanonicalCsvSpec(spec), canonical) << spec;
  }
  // Other columns, operators, thresholds or order within a list stay different.
  for (const std::string& spec : std::vector<std::string>{
           "label=rating>=3.5; dense=year,log(votes); sparse=userId,movieId,split(genres,|)",
           "label=rating>4; dense=year,log(votes); sparse=userId,movieId,split(genres,|)",
           "label=rating>3.5; dense=log(votes),year; sparse=userId,movieId,split(genres,|)",
           "label=rating>3.5; dense=year,votes; sparse=userId,movieId,split(genres,|)",
           "label=rating>3.5; dense=year,log(votes); sparse=userId,movieId,split(genres,;)"}) {
    EXPECT_NE(CanonicalCsvSpec(spec), canonical) << spec;
  }
  // An empty dense clause names the column "" (a pandas index column): not the same as none.
  EXPECT_NE(CanonicalCsvSpec("label=r; dense=; sparse=u"), CanonicalCsvSpec("label=r; sparse=u"));
  // Calls are calls only where the reader takes them: a sparse column named "log( x )" is not
  // "log(x)", nor a dense "split( a ,|)" "split(a,|)".
  EXPECT_NE(CanonicalCsvSpec("label=r; sparse=log( x )"),
            CanonicalCsvSpec("label=r; sparse=log(x)"));
  EXPECT_NE(CanonicalCsvSpec("label=r; dense=split( a ,|)"),
            CanonicalCsvSpec("label=r; dense=split(a,|)"));
  EXPECT_EQ(CanonicalCsvSpec("label=r; dense=log( x )"), CanonicalCsvSpec("label=r; dense=log(x)"));
  // What it cannot split, or a spec without a label, is kept as given.
  EXPECT_EQ(CanonicalCsvSpec("label"), "label");
  EXPECT_EQ(CanonicalCsvSpec("colour=x"), "colour=x");
  EXPECT_EQ(CanonicalCsvSpec("label=a;label=b"), "label=a;label=b");
  EXPECT_EQ(CanonicalCsvSpec("dense=x"), "dense=x");
}

TEST(CsvReaderTest, OperatorsAndLogDense) {
  const std::string path = WriteFile("ops.csv", "a,b,c\n1,2,x\n3,-1,y\n2,,x\n");
  auto check = [&](const std::string& label, const std::vector<float>& expected) {
    auto source = Open(path, Spec("label=" + label + "; dense=log(b),b; sparse=c"));
    const Batch all = ReadAll(*source, 10);
    EXPECT_EQ(all.labels, expected) << label;
  };
  check("a>2", {0, 1, 0});
  check("a>=2", {0, 1, 1});
  check("a<2", {1, 0, 0});
  check("a<=2", {1, 0, 1});
  check("a==2", {0, 0, 1});
  auto source = Open(path, Spec("label=a>1; dense=log(b),b; sparse=c"));
  const Batch all = ReadAll(*source, 10);
  EXPECT_EQ(source->schema().dense_names, (std::vector<std::string>{"log(b)", "b"}));
  EXPECT_FLOAT_EQ(all.dense[0], std::log(3.0f));
  EXPECT_EQ(all.dense[1], 2.0f);
  EXPECT_EQ(all.dense[2], 0.0f);  // log(1 + max(-1, 0))
  EXPECT_EQ(all.dense[3], -1.0f);
  EXPECT_EQ(all.dense[4], 0.0f);  // missing
  EXPECT_EQ(all.dense[5], 0.0f);
  EXPECT_EQ(all.ids, (std::vector<int64_t>{1, 2, 1}));
}

TEST(CsvReaderTest, QuotingAndMissingValues) {
  const std::string path = WriteFile(
      "quotes.csv",
      "label,name,tags\n1,\"Smith, \"\"J\"\"\",a|b\n0,,\n1,Smith,b||c\n1,NA,NA\n0,nan,\" a\"\n");
  auto source = Open(path, Spec("label=label; sparse=name, split(tags,|)"));
  const Batch all = ReadAll(*source, 10);
  ASSERT_EQ(all.num_samples, 5);
  EXPECT_EQ(Bag(all, 0, 0), (std::vector<int64_t>{1}));
  EXPECT_EQ(Bag(all, 0, 1), (std::vector<int64_t>{0}));  // missing
  EXPECT_EQ(Bag(all, 0, 2), (std::vector<int64_t>{2}));  // "Smith" differs from "Smith, "J""
  EXPECT_EQ(Bag(all, 1, 0), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Bag(all, 1, 1), (std::vector<int64_t>{0}));
  EXPECT_EQ(Bag(all, 1, 2), (std::vector<int64_t>{2, 3}));  // empty pieces are skipped
  EXPECT_EQ(Bag(all, 0, 3), (std::vector<int64_t>{0}));     // "NA" is missing
  EXPECT_EQ(Bag(all, 1, 3), (std::vector<int64_t>{0}));
  EXPECT_EQ(Bag(all, 0, 4), (std::vector<int64_t>{0}));  // NumPy's "nan" is missing too
  EXPECT_EQ(Bag(all, 1, 4), (std::vector<int64_t>{4}));  // " a" is not "a": values as written
  EXPECT_EQ(source->schema().table_rows, (std::vector<int64_t>{3, 5}));
}

TEST(CsvReaderTest, CrlfLinesAreAccepted) {
  const std::string path = WriteFile("crlf.csv", "a,b\r\n1,x\r\n0,y\r\n");
  auto source = Open(path, Spec("label=a; sparse=b"));
  const Batch all = ReadAll(*source, 10);
  EXPECT_EQ(all.num_samples, 2);
  EXPECT_EQ(source->schema().table_rows, (std::vector<int64_t>{3}));
}

TEST(CsvReaderTest, RewindAndMaxSamples) {
  SourceOptions options = Spec(kMovieLensSpec);
  options.max_samples = 1000;
  auto source = Open(kMovieLens, options);
  const Batch first = ReadAll(*source, 300);
  EXPECT_EQ(first.num_samples, 1000);
  const std::vector<int64_t> rows = source->schema().table_rows;
  ASSERT_TRUE(source->Rewind().ok());
  const Batch second = ReadAll(*source, 999);
  EXPECT_EQ(second.first_sample, 1000);
  EXPECT_EQ(second.ids, first.ids);
  EXPECT_EQ(second.labels, first.labels);
  EXPECT_EQ(source->schema().table_rows, rows);
}

// The scan for the table sizes also counts the ids: multi-id bags (split) are known to hold
// more than one id a table before training (the oracle's window grows with them).
TEST(CsvReaderTest, TheScanCountsTheIdsPerSample) {
  auto source = Open(kMovieLens, Spec(kMovieLensSpec));
  EXPECT_EQ(source->IdsPerSample(), -1);  // unknown before it is read
  double ids_per_sample = 0;
  auto schema = ScanSchema(*source, nullptr, &ids_per_sample);
  ASSERT_TRUE(schema.ok()) << schema.status();
  // One user, one movie and 1-10 genres a rating: the mean of the whole file, read again.
  const Batch all = ReadAll(*source, 30000);
  EXPECT_EQ(all.first_sample, 100004);  // the scan rewound the source
  EXPECT_DOUBLE_EQ(ids_per_sample, static_cast<double>(all.num_ids()) / 100004);
  EXPECT_GT(ids_per_sample, 3.0);
  // Within --max-samples, and for one id a table.
  SourceOptions options = Spec("label=rating>3.5; sparse=userId,movieId");
  options.max_samples = 1000;
  source = Open(kMovieLens, options);
  ASSERT_TRUE(ScanSchema(*source, nullptr, &ids_per_sample).ok());
  EXPECT_EQ(ids_per_sample, 2.0);
}

TEST(CsvReaderTest, SpecErrors) {
  auto error = [](const std::string& spec) { return OpenCsv(kMovieLens, Spec(spec)).status(); };
  absl::Status status = error("label=rating>3.5; sparse=userId,nosuch");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("unknown column 'nosuch'"));
  EXPECT_THAT(status.message(), HasSubstr("sparse=userId,nosuch"));
  EXPECT_THAT(status.message(), HasSubstr(std::string(kMovieLens) + ":1: csv spec clause"));
  // A file separated by something other than commas reads as one column: the message says so.
  const std::string dat = WriteFile("ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n");
  status = OpenCsv(dat, Spec("label=rating>3.5; sparse=userId")).status();
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dat + ":1: csv spec clause"),
                                      HasSubstr("looks separated by something else")));
  status = error("label=rating=>3.5");
  EXPECT_THAT(status.message(), HasSubstr("bad operator '=>'"));
  status = error("label=rating!=3");
  EXPECT_THAT(status.message(), HasSubstr("bad operator '!='"));
  status = error("label=rating>high");
  EXPECT_THAT(status.message(), HasSubstr("unparsable number 'high'"));
  for (const char* threshold : {"nan", "inf", "-inf", "1e999"}) {
    status = error(absl::StrCat("label=rating>", threshold, "; sparse=userId"));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << threshold;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("the threshold '", threshold, "' is not a finite number")));
  }
  EXPECT_TRUE(error("label=rating>-3.5e2; sparse=userId").ok());
  status = error("dense=year");
  EXPECT_THAT(status.message(), HasSubstr("no label"));
  status = error("label=rating; weights=year");
  EXPECT_THAT(status.message(), HasSubstr("unknown key 'weights'"));
  status = error("");
  EXPECT_THAT(status.message(), HasSubstr("column spec is required"));
  status = error("label=rating; sparse=split(genres)");
  EXPECT_THAT(status.message(), HasSubstr("split(COLUMN,SEPARATOR)"));
  // A misplaced comma or parenthesis is not taken into a longer separator (which would drop a
  // column silently): the separator is one character outside the spec's syntax.
  for (const char* bad : {"split(genres,|,userId)", "split(genres,(|)", "split(genres,\"|\")",
                          "split(genres,||)", "split(genres,;)"}) {
    status = error(absl::StrCat("label=rating>3.5; sparse=", bad));
    EXPECT_THAT(status.message(), HasSubstr("the separator must be one character")) << bad;
  }
  EXPECT_TRUE(error("label=rating>3.5; sparse=split(genres,/)").ok());
}

TEST(CsvReaderTest, ASpecNamingADuplicatedColumnIsAmbiguous) {
  const std::string path =
      WriteFile("dup.csv", "userId,userId,movieId,genres,year,rating\n1,2,3,Comedy,1995,4\n");
  absl::Status status = OpenCsv(path, Spec("label=rating>3.5; sparse=userId")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(path + ":1: column 'userId' is ambiguous: the header has it at columns 1 "
                               "and 2 (csv spec clause 'sparse=userId'"));
  // In every clause and form: the label, dense, log(C), split(C,SEP).
  for (const std::string spec :
       {"label=userId>1", "label=rating>3.5; dense=userId", "label=rating>3.5; dense=log(userId)",
        "label=rating>3.5; sparse=split(userId,|)"}) {
    status = OpenCsv(path, Spec(spec)).status();
    EXPECT_THAT(std::string(status.message()), HasSubstr(":1: column 'userId' is ambiguous"))
        << spec;
  }
  // A duplicate the spec does not name is accepted.
  auto source = Open(path, Spec("label=rating>3.5; dense=year; sparse=movieId,genres"));
  EXPECT_EQ(ReadAll(*source, 10).num_samples, 1);
  // Three or more: all are listed, the header's line is its true line.
  const std::string three = WriteFile("dup3.csv", "\n\na,b,a,c,a\n1,2,3,4,5\n");
  EXPECT_THAT(
      std::string(OpenCsv(three, Spec("label=a")).status().message()),
      HasSubstr(three + ":3: column 'a' is ambiguous: the header has it at columns 1, 3, 5"));
}

TEST(CsvReaderTest, BlankLinesAreSkippedAnywhere) {
  // Empty lines and lone "\r" lines: before the header, between and after the data.
  const std::string path = WriteFile("blank.csv", "\n\r\na,b\n\n1,x\n\r\n\n0,y\n\n");
  auto source = Open(path, Spec("label=a; sparse=b"));
  EXPECT_EQ(ReadAll(*source, 10).labels, (std::vector<float>{1, 0}));
  SourceStats stats = source->stats();
  EXPECT_EQ(stats.samples, 2);
  EXPECT_EQ(stats.lines, 9);  // every line read, blank ones and the header included
  EXPECT_EQ(stats.skipped_lines, 0);
  // The next epoch reads the same samples, and numbers its lines the same.
  ASSERT_TRUE(source->Rewind().ok());
  EXPECT_EQ(ReadAll(*source, 1).labels, (std::vector<float>{1, 0}));

  // A one-column file too: a blank line is not a record with one empty field.
  source = Open(WriteFile("one_column.csv", "a\n1\n\n0\n\n"), Spec("label=a"));
  EXPECT_EQ(ReadAll(*source, 10).labels, (std::vector<float>{1, 0}));

  // Later errors keep the true line number, in every epoch.
  const std::string bad = WriteFile("blank_bad.csv", "\na,b\n\n1,x\n\nz,y\n");
  EXPECT_THAT(std::string(ReadError(bad, Spec("label=a; sparse=b")).message()),
              HasSubstr(bad + ":6:1: label column 'a': 'z' is not a number"));
  SourceOptions options = Spec("label=a; sparse=b");
  options.skip_bad_lines = true;
  source = Open(bad, options);
  EXPECT_EQ(ReadAll(*source, 10).num_samples, 1);
  ASSERT_TRUE(source->Rewind().ok());
  EXPECT_EQ(ReadAll(*source, 10).num_samples, 1);
  stats = source->stats();
  // Line 6, skipped in each epoch, counted in the first; the blank lines are not bad lines.
  EXPECT_EQ(stats.skipped_lines, 1);
  ASSERT_EQ(stats.first_errors.size(), 1u);
  EXPECT_THAT(stats.first_errors[0], HasSubstr(bad + ":6:1:"));

  // A header line's errors name its true line too.
  const std::string header = WriteFile("blank_header.csv", "\n\n\"a,b\n1,x\n");
  EXPECT_THAT(std::string(OpenCsv(header, Spec("label=a")).status().message()),
              HasSubstr(header + ":3:1: unterminated quote"));

  // A line of spaces is not blank; blank lines alone are no header; a header and blank lines
  // are no data.
  const std::string spaces = WriteFile("spaces.csv", "a,b\n1,x\n \n");
  EXPECT_THAT(std::string(ReadError(spaces, Spec("label=a; sparse=b")).message()),
              HasSubstr(spaces + ":3:"));
  const std::string only = WriteFile("only_blank.csv", "\n\r\n\n");
  EXPECT_THAT(std::string(OpenCsv(only, Spec("label=a")).status().message()),
              HasSubstr("csv: '" + only + "' has only blank lines (no header)"));
  const std::string no_data = WriteFile("no_data.csv", "a,b\n\n\r\n");
  EXPECT_THAT(std::string(ReadError(no_data, Spec("label=a; sparse=b")).message()),
              HasSubstr("csv: '" + no_data + "' has a header but no data lines"));
}

TEST(CsvReaderTest, AQuoteInsideAnUnquotedFieldIsAnOrdinaryCharacter) {
  const SourceOptions options = Spec("label=f>3; dense=e; sparse=d");
  // The quote is kept literally: Com"edy is one value, and the fields after it are where the
  // commas say.
  auto source = Open(WriteFile("stray.csv",
                               "a,b,c,d,e,f\n1,2,3,Com\"edy,1995,4\n"
                               "1,2,3,\"Com\"\"edy\",1996,3\n1,2,3,x\"y\",1997,5\n"),
                     options);
  const Batch all = ReadAll(*source, 10);
  EXPECT_EQ(all.labels, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(all.dense, (std::vector<float>{1995, 1996, 1997}));
  EXPECT_EQ(all.ids, (std::vector<int64_t>{1, 1, 2}));  // "Com""edy" quoted is Com"edy too

  // Errors after such a field name the right column: abc starts at column 15.
  std::string path = WriteFile("stray_bad.csv", "a,b,c,d,e,f\n1,2,3,Com\"edy,abc,3\n");
  EXPECT_THAT(std::string(ReadError(path, options).message()),
              HasSubstr(path + ":2:15: dense column 'e': 'abc' is not a number"));
  // ... and after quoted fields holding commas and doubled quotes.
  const std::string line = "1,\"x,\"\"y\",3,Co\"m\"edy,abc,3";
  path = WriteFile("stray_bad2.csv", "a,b,c,d,e,f\n" + line + "\n");
  EXPECT_THAT(std::string(ReadError(path, options).message()),
              HasSubstr(absl::StrCat(path, ":2:", line.find("abc") + 1, ": dense column 'e'")));
  // A quoted field must end at its closing quote.
  path = WriteFile("after_quote.csv", "a,b,c,d,e,f\n1,2,3,\"Com\"edy,1995,3\n");
  EXPECT_THAT(std::string(ReadError(path, options).message()),
              HasSubstr(path + ":2:12: unexpected character 'e' after a closing quote"));
}

TEST(CsvReaderTest, FileErrors) {
  EXPECT_EQ(OpenCsv("/nonexistent.csv", Spec("label=a")).status().code(),
            absl::StatusCode::kNotFound);
  const absl::Status empty = OpenCsv(WriteFile("empty.csv", ""), Spec("label=a")).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("empty"));
}

TEST(CsvReaderTest, CompressedFilesAreRefusedByName) {
  struct Case {
    const char* name;
    std::string bytes;
    const char* says;
  };
  const Case cases[] = {
      {"gz.csv", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00", 8), "gzip-compressed"},
      {"bz.csv", "BZh91AY&SY\x01\x02", "bzip2-compressed"},
      {"xz.csv", std::string("\xfd\x37zXZ\x00\x00\x04", 9), "xz-compressed"},
      {"zst.csv", "\x28\xb5\x2f\xfd\x04\x00", "zstd-compressed"}};
  for (const Case& c : cases) {
    const std::string path = WriteFile(c.name, c.bytes);
    const absl::Status status = OpenCsv(path, Spec("label=a")).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("csv:" + path), HasSubstr(c.says), HasSubstr("decompress it")))
        << c.name;
  }
  // Text that merely starts like a bzip2 stream is read.
  const std::string path = WriteFile("bzh.csv", "BZhang,a\n1,1\n0,2\n");
  EXPECT_TRUE(OpenCsv(path, Spec("label=a; sparse=BZhang")).ok());
}

TEST(CsvReaderTest, ArchivesAndUtf16NameWhatTheyAre) {
  std::string tar(1024, '\0');
  tar.replace(0, 9, "train.txt");
  tar.replace(257, 6, std::string("ustar\0", 6));
  const struct {
    const char* name;
    std::string bytes;
    const char* says;
  } cases[] = {{"zip.csv", std::string("PK\x03\x04\x14\x00\x00\x00", 8), "zip archive"},
               {"tar.csv", tar, "tar archive"},
               {"utf16le.csv", std::string("\xff\xfeu\0s\0e\0r\0", 10), "UTF-16"},
               {"utf16be.csv", std::string("\xfe\xff\0u\0s\0e\0r", 10), "UTF-16"}};
  for (const auto& c : cases) {
    const std::string path = WriteFile(c.name, c.bytes);
    const absl::Status status = OpenCsv(path, Spec("label=a")).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(status.message()), AllOf(HasSubstr("csv:" + path), HasSubstr(c.says)))
        << c.name;
  }
  // A UTF-8 byte order mark is text.
  const std::string path = WriteFile("bom.csv",
                                     "\xef\xbb\xbf"
                                     "a,b\n1,1\n");
  EXPECT_TRUE(OpenCsv(path, Spec("label=a; sparse=b")).ok());
}

TEST(CsvReaderTest, LineErrorsNameLineAndColumn) {
  const SourceOptions options = Spec("label=a>1; dense=b; sparse=c");
  std::string path = WriteFile("number.csv", "a,b,c\n1,2,x\n1,2.5.1,x\n");
  absl::Status status = ReadError(path, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr(path + ":3:3: dense column 'b': '2.5.1' is not a number"));

  path = WriteFile("quote.csv", "a,b,c\n1,2,\"x\n");
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr(path + ":2:5: unterminated quote"));
  EXPECT_THAT(status.message(), HasSubstr("a line break inside a quoted field is not supported"));

  // Numbers are decimal: strtod's hexadecimal forms are refused.
  path = WriteFile("hex.csv", "a,b,c\n1,2,x\n1,0x10,x\n");
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr(path + ":3:3: dense column 'b': '0x10' is not a number"));

  path = WriteFile("count.csv", "a,b,c\n1,2\n");
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr(path + ":2:"));
  EXPECT_THAT(status.message(), HasSubstr("expected 3 comma-separated fields, found 2"));

  path = WriteFile("label.csv", "a,b,c\n,2,x\n");
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr(path + ":2:1: label column 'a' is missing"));

  path = WriteFile("label2.csv", "a,b,c\n1,2,x\nyes,2,x\n");
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr(path + ":3:1: label column 'a': 'yes' is not a number"));
}

TEST(CsvReaderTest, SkipBadLines) {
  SourceOptions options = Spec("label=a; dense=b; sparse=c");
  options.skip_bad_lines = true;
  const std::string path =
      WriteFile("skip.csv", "a,b,c\n1,2,x\n1,bad,y\n0,3,\"z\n1,4,w,extra\n0,5,v\n");
  auto source = Open(path, options);
  const Batch all = ReadAll(*source, 10);
  EXPECT_EQ(all.num_samples, 2);
  EXPECT_EQ(all.dense, (std::vector<float>{2, 5}));
  // Values of skipped lines do not enter the dictionary.
  EXPECT_EQ(all.ids, (std::vector<int64_t>{1, 2}));
  const SourceStats stats = source->stats();
  EXPECT_EQ(stats.lines, 6);
  EXPECT_EQ(stats.skipped_lines, 3);
  ASSERT_EQ(stats.first_errors.size(), 3u);
  EXPECT_THAT(stats.first_errors[0], HasSubstr(":3:"));
  EXPECT_THAT(stats.first_errors[1], HasSubstr("unterminated quote"));
  EXPECT_THAT(stats.first_errors[2], HasSubstr(":5:"));
}

TEST(CsvReaderTest, RawLabelsMustBeInZeroOne) {
  // Probabilities are labels as they are.
  std::string path = WriteFile("soft.csv", "p,c\n0,x\n0.25,y\n1,x\n");
  auto source = Open(path, Spec("label=p; sparse=c"));
  EXPECT_EQ(ReadAll(*source, 10).labels, (std::vector<float>{0, 0.25f, 1}));
  // A rating is not: the message suggests a comparison.
  path = WriteFile("rating.csv", "r,c\n1,x\n7,y\n");
  const absl::Status status = ReadError(path, Spec("label=r; sparse=c"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":3:1: label column 'r': 7 is outside [0, 1]"));
  EXPECT_THAT(status.message(), HasSubstr("label=r>3.5"));
}

TEST(CsvReaderTest, NonFiniteNumbersAreRefusedWithLineAndColumn) {
  const SourceOptions options = Spec("label=a>1; dense=b; sparse=c");
  for (const std::string value : {"inf", "-inf", "Infinity", "1e400", "-1e39"}) {
    const std::string path = WriteFile("inf.csv", "a,b,c\n1,2,x\n1," + value + ",x\n");
    const absl::Status status = ReadError(path, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(status.message(),
                HasSubstr(path + ":3:3: dense column 'b': '" + value + "' is not a finite float"));
  }
  const std::string path = WriteFile("inflabel.csv", "a,b,c\ninf,2,x\n");
  EXPECT_THAT(ReadError(path, options).message(),
              HasSubstr(":2:1: label column 'a': 'inf' is not a finite float"));
  // log(C) of a huge value is finite, and allowed.
  auto source = Open(WriteFile("logbig.csv", "a,b,c\n1,1e300,x\n"),
                     Spec("label=a>0; dense=log(b); sparse=c"));
  EXPECT_NEAR(ReadAll(*source, 10).dense[0], std::log1p(1e300), 1e-3);
}

TEST(CsvReaderTest, AHeaderWithoutDataIsAnError) {
  std::string path = WriteFile("header_only.csv", "a,b,c\n");
  absl::Status status = ReadError(path, Spec("label=a; sparse=c"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("csv: '" + path + "' has a header but no data lines"));
  SourceOptions options = Spec("label=a; dense=b; sparse=c");
  options.skip_bad_lines = true;
  path = WriteFile("all_bad.csv", "a,b,c\n1,x,y\n1\n");
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr("has no valid data line (2 skipped; the first: " + path +
                                          ":2:3: dense column 'b'"));
}

TEST(CsvReaderTest, AByteOrderMarkBeforeTheHeaderIsSkipped) {
  const std::string path = WriteFile("bom.csv",
                                     "\xEF\xBB\xBF"
                                     "a,b\r\n1,x\r\n0,y\r\n");
  auto source = Open(path, Spec("label=a; sparse=b"));
  EXPECT_EQ(ReadAll(*source, 10).labels, (std::vector<float>{1, 0}));
  // A BOM elsewhere is data, and is shown escaped in messages.
  const absl::Status status = ReadError(WriteFile("bom2.csv",
                                                  "a,b\n\xEF\xBB\xBF"
                                                  "1,x\n"),
                                        Spec("label=a; sparse=b"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("label column 'a': '\\xef\\xbb\\xbf\\x31' is not a number"));
}

TEST(CsvReaderTest, EchoedValuesAreShortAndEscaped) {
  const SourceOptions options = Spec("label=a>1; dense=b; sparse=c");
  // A 10 MB field: the message shows its first bytes and its length.
  std::string path = WriteFile("huge.csv", "a,b,c\n1," + std::string(10'000'000, '7') + "x,y\n");
  absl::Status status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr(":2:3: dense column 'b': '7777"));
  EXPECT_THAT(status.message(), HasSubstr("... (10000001 bytes)' is not a number"));
  EXPECT_LT(status.message().size(), path.size() + 200);
  // CR and NUL inside a field.
  path = WriteFile("ctrl.csv", std::string("a,b,c\n1,\"4\r\0\",y\n", 17));
  status = ReadError(path, options);
  EXPECT_THAT(status.message(), HasSubstr("dense column 'b': '4\\r\\x00' is not a number"));
  // A hostile header: an unknown column lists a few columns, each cut short.
  std::string header;
  for (int c = 0; c < 1000; ++c) absl::StrAppend(&header, c ? "," : "", std::string(1000, 'h'));
  status = OpenCsv(WriteFile("wide.csv", header + "\n"), Spec("label=nosuch")).status();
  EXPECT_THAT(status.message(), HasSubstr("unknown column 'nosuch'"));
  EXPECT_THAT(status.message(), HasSubstr("... (1000 columns)"));
  EXPECT_LT(status.message().size(), 2000u);
  // Bytes that escape to four characters each, in the header and in the clause (a fuzzer's find).
  const std::string bytes(1000, '\xff');
  header.clear();
  for (int c = 0; c < 1000; ++c) absl::StrAppend(&header, c ? "," : "", bytes);
  status = OpenCsv(WriteFile("bytes.csv", header + "\n"), Spec("label=labe" + bytes)).status();
  EXPECT_THAT(status.message(), HasSubstr("unknown column 'labe\\xff"));
  EXPECT_THAT(status.message(), HasSubstr("... (1000 columns)"));
  EXPECT_LT(status.message().size(), 2000u);
  for (const char c : status.message()) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c);
}

TEST(CsvReaderTest, LinesLongerThanTheLimitAreRefused) {
  SourceOptions options = Spec("label=a; sparse=b");
  options.max_line_bytes = 100;
  const std::string path = WriteFile("long.csv", "a,b\n1," + std::string(500, 'x') + "\n");
  const absl::Status status = ReadError(path, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":2: line longer than 100 bytes"));
  // An endless file without line breaks (the header itself).
  options.max_line_bytes = 1 << 20;
  EXPECT_THAT(OpenCsv("/dev/zero", options).status().message(),
              HasSubstr("/dev/zero:1: line longer than 1048576 bytes"));
}

}  // namespace
}  // namespace bagpipe
