// Specifications of core/crc32c.h, core/atomic_file.h and the crash-safe metrics file: a file is
// never seen half-written, a failed write is an error, and one damaged byte anywhere in a
// checksummed file is detected.
#include "core/atomic_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bagpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class TempDir {
 public:
  TempDir() {
    path_ = ::testing::TempDir() + "/atomic_file_test_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter_++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(Crc32cTest, StandardCheckValueAndExtension) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  const std::string text = "checkpoints that survive a kill";
  for (size_t split = 0; split <= text.size(); ++split) {
    EXPECT_EQ(ExtendCrc32c(Crc32c(text.data(), split), text.data() + split, text.size() - split),
              Crc32c(text));
  }
}

TEST(AtomicFileTest, TargetKeepsOldContentsUntilCommit) {
  TempDir dir;
  const std::string path = dir / "summary.json";
  WriteRaw(path, "old");
  {
    auto writer = AtomicFileWriter::Open(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append(std::string(3 << 20, 'x')).ok());
    EXPECT_EQ(ReadAll(path), "old");
    // Destroyed without Commit (an error, or the process stopping): nothing changes.
  }
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_EQ(dir.Entries(), std::vector<std::string>{"summary.json"});
  auto writer = AtomicFileWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append("new contents").ok());
  EXPECT_EQ(ReadAll(path), "old");
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(ReadAll(path), "new contents");
  EXPECT_EQ((*writer)->digest(), (FileDigest{12, Crc32c("new contents")}));
  EXPECT_EQ(dir.Entries(), std::vector<std::string>{"summary.json"});
}

TEST(AtomicFileTest, RemovesTemporariesAKilledWriterLeft) {
  TempDir dir;
  WriteRaw(dir / ".params.bin.tmp-12345-0", "half");
  ASSERT_TRUE(WriteFileAtomically(dir / "params.bin", "whole").ok());
  EXPECT_EQ(dir.Entries(), std::vector<std::string>{"params.bin"});
  EXPECT_EQ(ReadAll(dir / "params.bin"), "whole");
}

TEST(AtomicFileTest, MissingDirectoryIsAnError) {
  TempDir dir;
  const absl::Status status = WriteFileAtomically(dir / "no/such/dir/file", "x");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("no/such/dir/file"));
}

TEST(AtomicFileTest, ASymbolicLinkKeepsPointingAtTheReplacedTarget) {
  TempDir dir;
  WriteRaw(dir / "real.json", "old");
  std::filesystem::create_symlink("real.json", dir / "summary.json");
  ASSERT_TRUE(WriteFileAtomically(dir / "summary.json", "new").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "summary.json"));
  EXPECT_EQ(ReadAll(dir / "real.json"), "new");
  // A dangling link: its target is created.
  std::filesystem::create_symlink("later.json", dir / "dangling.json");
  ASSERT_TRUE(WriteFileAtomically(dir / "dangling.json", "made").ok());
  EXPECT_EQ(ReadAll(dir / "later.json"), "made");
}

TEST(AtomicFileTest, WhatIsNoRegularFileIsRefusedNotReplaced) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  absl::Status status = WriteFileAtomically(dir / "pipe", "x");
  EXPECT_THAT(std::string(status.message()), HasSubstr("is a FIFO: refusing to replace it"));
  std::filesystem::create_directory(dir / "sub");
  std::filesystem::create_symlink("sub", dir / "to_sub");
  status = WriteFileAtomically(dir / "to_sub", "x");
  EXPECT_THAT(std::string(status.message()), HasSubstr("(a link to '"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("is a directory"));
  EXPECT_TRUE(std::filesystem::is_fifo(dir / "pipe"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "to_sub"));
  status = WriteFileAtomically("/dev/null", "x");
  EXPECT_THAT(std::string(status.message()), HasSubstr("is a character device"));
}

// Makes writes beyond `bytes` fail (EFBIG) while alive, as a full disk would.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limit = old_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_;
  sighandler_t old_handler_;
};

TEST(AtomicFileTest, AFailedWriteIsAnErrorAndLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir / "params.bin";
  WriteRaw(path, "old");
  absl::Status status;
  {
    FileSizeLimit limit(1 << 20);
    auto writer = AtomicFileWriter::Open(path);
    ASSERT_TRUE(writer.ok());
    for (int k = 0; k < 8 && status.ok(); ++k)
      status = (*writer)->Append(std::string(1 << 19, 'x'));
    if (status.ok()) status = (*writer)->Commit();
  }
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_EQ(ReadAll(path), "old");
  EXPECT_EQ(dir.Entries(), std::vector<std::string>{"params.bin"});
}

TEST(ChecksummedFileTest, RoundTrip) {
  TempDir dir;
  const std::string path = dir / "f";
  auto digest = WriteChecksummedFile(path, "BPTESTFL", 3, "payload bytes");
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(digest->bytes, 16 + 13 + 16u);
  EXPECT_EQ(digest->crc32c, Crc32c(ReadAll(path)));
  auto file = ChecksummedFile::Open(path, "BPTESTFL", 3, "test file");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->payload(), "payload bytes");
  EXPECT_EQ(file->digest(), *digest);
}

TEST(ChecksummedFileTest, EveryDamagedByteAndEveryTruncationIsDetected) {
  TempDir dir;
  const std::string path = dir / "f";
  ASSERT_TRUE(WriteChecksummedFile(path, "BPTESTFL", 1, std::string(100, 'p')).ok());
  const std::string good = ReadAll(path);
  for (size_t k = 0; k < good.size(); ++k) {
    for (const char flip : {'\x01', '\x80'}) {
      std::string bad = good;
      bad[k] ^= flip;
      WriteRaw(path, bad);
      auto file = ChecksummedFile::Open(path, "BPTESTFL", 1, "test file");
      ASSERT_FALSE(file.ok()) << "byte " << k << " changed and went unnoticed";
      EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
    }
  }
  for (size_t size = 0; size < good.size(); ++size) {
    WriteRaw(path, good.substr(0, size));
    auto file = ChecksummedFile::Open(path, "BPTESTFL", 1, "test file");
    ASSERT_FALSE(file.ok());
    EXPECT_THAT(std::string(file.status().message()), HasSubstr("truncated")) << size;
  }
}

TEST(ChecksummedFileTest, OtherKindOrVersionIsRefusedByName) {
  TempDir dir;
  const std::string path = dir / "f";
  ASSERT_TRUE(WriteChecksummedFile(path, "BPTESTFL", 2, "x").ok());
  auto version = ChecksummedFile::Open(path, "BPTESTFL", 1, "test file");
  EXPECT_EQ(version.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(version.status().message()),
              HasSubstr("has format version 2; this build reads version 1"));
  auto kind = ChecksummedFile::Open(path, "BPOTHERK", 2, "other file");
  EXPECT_THAT(std::string(kind.status().message()), HasSubstr("is not a other file"));
  auto missing = ChecksummedFile::Open(dir / "missing", "BPTESTFL", 2, "test file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// Another process truncates the file after it was opened and measured, before (or while) it is
// read: a mapped reader gets SIGBUS at the first page past the new end; this one a DataLoss
// naming the file and where it ended.
TEST(ChecksummedFileTest, FileTruncatedWhileBeingReadIsDataLossNotASignal) {
  TempDir dir;
  const std::string path = dir / "f";
  const std::string payload(size_t{3} << 20, 'p');  // several read blocks
  ASSERT_TRUE(WriteChecksummedFile(path, "BPTESTFL", 1, payload).ok());
  static size_t truncate_to;
  SetChecksummedFileOpenedHookForTesting(
      [](const std::string& p) { ASSERT_EQ(::truncate(p.c_str(), truncate_to), 0); });
  for (const size_t size : {size_t{0}, size_t{10}, size_t{1} << 20, (size_t{3} << 20) / 2}) {
    truncate_to = size;
    ASSERT_TRUE(WriteChecksummedFile(path, "BPTESTFL", 1, payload).ok());
    auto file = ChecksummedFile::Open(path, "BPTESTFL", 1, "test file");
    ASSERT_FALSE(file.ok()) << "truncated to " << size;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
    EXPECT_THAT(std::string(file.status().message()),
                AllOf(HasSubstr(path), HasSubstr(absl::StrCat("ends at byte ", size)),
                      HasSubstr("truncated or shrank while it was being read")));
  }
  SetChecksummedFileOpenedHookForTesting(nullptr);
  // The same file read whole (the reader itself works on a file of several blocks).
  ASSERT_TRUE(WriteChecksummedFile(path, "BPTESTFL", 1, payload).ok());
  auto file = ChecksummedFile::Open(path, "BPTESTFL", 1, "test file");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->payload(), payload);
}

// Something other than a regular file in a checkpoint's place is refused at once (a FIFO would
// otherwise block the reader until a writer came).
TEST(ChecksummedFileTest, NotARegularFileIsRefusedWithoutWaiting) {
  TempDir dir;
  const std::string path = dir / "fifo";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto fifo = ChecksummedFile::Open(path, "BPTESTFL", 1, "test file");
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fifo.status().message()), HasSubstr("is not a regular file"));
  auto directory = ChecksummedFile::Open(dir.path(), "BPTESTFL", 1, "test file");
  EXPECT_FALSE(directory.ok());
}

TEST(MetricsFileTest, ResumeKeepsCompleteLinesUpToTheIteration) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  WriteRaw(path,
           "{\"iteration\":10,\"loss\":1}\n{\"kind\":\"note\"}\n{\"iteration\":20,\"loss\":2}\n"
           "{\"iteration\":30,\"loss\":3}\n{\"iteration\":40,\"lo");
  auto writer = JsonLinesWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Start(20).ok());
  ASSERT_TRUE((*writer)->Write({{"iteration", 25}}).ok());
  EXPECT_EQ(ReadAll(path),
            "{\"iteration\":10,\"loss\":1}\n{\"kind\":\"note\"}\n{\"iteration\":20,\"loss\":2}\n"
            "{\"iteration\":25}\n");
}

// A file that ends before the checkpoint's iteration (the lines in between went to another
// file, or were never written) is continued with a warning naming the missing iterations; one
// that reaches the checkpoint gets none.
TEST(MetricsFileTest, ResumeWarnsOfIterationsMissingBeforeTheCheckpoint) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  WriteRaw(path, "{\"iteration\":5,\"loss\":1}\n{\"iteration\":10,\"loss\":2}\n");
  auto writer = JsonLinesWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE((*writer)->Start(16).ok());
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(warned, HasSubstr("ends at iteration 10, before the checkpoint's 16: it has no line "
                                "for iterations 11 to 16"));
  EXPECT_EQ(ReadAll(path), "{\"iteration\":5,\"loss\":1}\n{\"iteration\":10,\"loss\":2}\n");

  // The line that covered iterations up to the checkpoint went on past it: dropped, and said so.
  WriteRaw(path, "{\"iteration\":100,\"iterations\":25}\n{\"iteration\":125,\"iterations\":25}\n");
  auto straddled = JsonLinesWriter::Open(path);
  ASSERT_TRUE(straddled.ok());
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE((*straddled)->Start(120).ok());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("no line for iterations 101 to 120 (its line of iteration 125 covered "
                        "iterations 101 to 125, past the checkpoint too, and is dropped)"));

  // Also when no line comes before it.
  WriteRaw(path, "{\"iteration\":10,\"iterations\":10}\n");
  auto only = JsonLinesWriter::Open(path);
  ASSERT_TRUE(only.ok());
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE((*only)->Start(5).ok());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("keeps no line, before the checkpoint's 5: it has no line for iterations "
                        "1 to 5 (its line of iteration 10 covered iterations 1 to 10"));

  WriteRaw(path, "{\"iteration\":5,\"loss\":1}\n{\"iteration\":10,\"loss\":2}\n");
  auto reaching = JsonLinesWriter::Open(path);
  ASSERT_TRUE(reaching.ok());
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE((*reaching)->Start(10).ok());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// A resumed job's Start knows the first lines of the checkpointed run's metrics files: the file
// of another run (none of those first lines, and lines before the checkpoint) is refused and
// left as it was, not spliced with the resumed run's lines; the run's own files are continued,
// even when a resume in between wrote elsewhere.
TEST(MetricsFileTest, ResumeKeepsTheLinesOfTheCheckpointedRunOnly) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  const std::string first_line = "{\"iteration\":10,\"loss\":1}";
  std::vector<int64_t> run;
  {
    auto writer = JsonLinesWriter::Open(path);
    ASSERT_TRUE(writer.ok());
    EXPECT_THAT((*writer)->first_lines(), IsEmpty());
    ASSERT_TRUE((*writer)->Write({{"iteration", 10}, {"loss", 1}}).ok());
    ASSERT_TRUE((*writer)->Write({{"iteration", 20}, {"loss", 2}}).ok());
    run = (*writer)->first_lines();
    EXPECT_EQ(run, std::vector<int64_t>{static_cast<int64_t>(Crc32c(first_line))});
  }
  EXPECT_EQ(ReadAll(path), first_line + "\n{\"iteration\":20,\"loss\":2}\n");
  {  // A resume that writes elsewhere (a new file) carries the run's first line on, and adds
     // its own file's.
    auto elsewhere = JsonLinesWriter::Open(dir / "elsewhere.jsonl");
    ASSERT_TRUE(elsewhere.ok());
    ASSERT_TRUE((*elsewhere)->Start(20, run).ok());
    EXPECT_EQ((*elsewhere)->first_lines(), run);
    ASSERT_TRUE((*elsewhere)->Write({{"iteration", 25}}).ok());
    EXPECT_EQ((*elsewhere)->first_lines(),
              (std::vector<int64_t>{run[0], static_cast<int64_t>(Crc32c("{\"iteration\":25}"))}));
    run = (*elsewhere)->first_lines();
  }
  {  // ... so that a later resume into the run's first file continues it.
    auto resumed = JsonLinesWriter::Open(path);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE((*resumed)->Start(10, run).ok());
    ASSERT_TRUE((*resumed)->Write({{"iteration", 15}}).ok());
    EXPECT_EQ(ReadAll(path), first_line + "\n{\"iteration\":15}\n");
  }
  // Another run's file (the same iterations, other values): refused, unchanged, and Start may
  // be called again (the refusal started nothing).
  const std::string other = "{\"iteration\":10,\"loss\":7}\n{\"iteration\":20,\"loss\":8}\n";
  WriteRaw(path, other);
  {
    auto resumed = JsonLinesWriter::Open(path);
    ASSERT_TRUE(resumed.ok());
    const absl::Status status = (*resumed)->Start(15, run);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), AllOf(HasSubstr("holds another run's metrics"),
                                        HasSubstr("lines before the checkpoint's iteration 15 "
                                                  "(the first of iteration 10)")));
    EXPECT_EQ(ReadAll(path), other);
    EXPECT_TRUE((*resumed)->Start(-1).ok());  // a fresh start after the refusal
    EXPECT_EQ(ReadAll(path), "");
  }
  // A run that had written no line by its checkpoint of iteration 20: a line of iteration 10 is
  // another run's; its own final line of iteration 20 (written after the checkpoint of a
  // stopped run) and later lines are not.
  WriteRaw(path, other);
  {
    auto resumed = JsonLinesWriter::Open(path);
    ASSERT_TRUE(resumed.ok());
    EXPECT_THAT((*resumed)->Start(20, std::vector<int64_t>()).message(),
                HasSubstr("(the first of iteration 10)"));
    EXPECT_EQ(ReadAll(path), other);
  }
  WriteRaw(path, "{\"iteration\":20,\"final\":true}\n{\"iteration\":30}\n");
  {
    auto resumed = JsonLinesWriter::Open(path);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE((*resumed)->Start(20, std::vector<int64_t>()).ok());
    EXPECT_EQ(ReadAll(path), "{\"iteration\":20,\"final\":true}\n");
  }
  // No file (a new --out), or a checkpoint that did not record the lines: as before.
  std::filesystem::remove(path);
  {
    auto resumed = JsonLinesWriter::Open(path);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE((*resumed)->Start(10, run).ok());
    EXPECT_EQ((*resumed)->first_lines(), run);
    EXPECT_EQ(ReadAll(path), "");
  }
  WriteRaw(path, other);
  {
    auto resumed = JsonLinesWriter::Open(path);
    ASSERT_TRUE(resumed.ok());
    ASSERT_TRUE((*resumed)->Start(10).ok());
    EXPECT_EQ(ReadAll(path), "{\"iteration\":10,\"loss\":7}\n");
  }
}

TEST(MetricsFileTest, OpenDoesNotTouchTheFileAndStartReplacesIt) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  WriteRaw(path, "{\"iteration\":1}\n");
  auto writer = JsonLinesWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ(ReadAll(path), "{\"iteration\":1}\n");
  ASSERT_TRUE((*writer)->Write({{"iteration", 7}}).ok());
  EXPECT_EQ(ReadAll(path), "{\"iteration\":7}\n");
}

TEST(MetricsFileTest, AFailedLineIsAnErrorAndCutBack) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  auto writer = JsonLinesWriter::Open(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write({{"iteration", 1}}).ok());
  const std::string before = ReadAll(path);
  absl::Status status;
  {
    FileSizeLimit limit(before.size() + 10);  // the next line does not fit
    status = (*writer)->Write({{"iteration", 2}, {"padding", std::string(100, 'x')}});
  }
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("complete lines"));
  EXPECT_EQ(ReadAll(path), before);
  ASSERT_TRUE((*writer)->Write({{"iteration", 3}}).ok());
  EXPECT_EQ(ReadAll(path), before + "{\"iteration\":3}\n");
}

TEST(MetricsFileTest, SummaryIsReplacedWhole) {
  TempDir dir;
  const std::string path = dir / "summary.json";
  ASSERT_TRUE(WriteJsonFile(path, {{"a", 1}}).ok());
  ASSERT_TRUE(WriteJsonFile(path, {{"a", 2}}).ok());
  auto value = ReadJsonFile(path);
  ASSERT_TRUE(value.ok());
  EXPECT_EQ((*value)["a"], 2);
  EXPECT_EQ(dir.Entries(), std::vector<std::string>{"summary.json"});
}

}  // namespace
}  // namespace bagpipe
