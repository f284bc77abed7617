// Specifications of checkpoints (trainer_hooks/checkpoint.h, server/shard_file.h) and of the C++
// job API's checkpoint options: a stop requested through JobOptions::stop_requested, resumed
// with CheckpointOptions::resume, ends bit-identical to the uninterrupted job; the checkpoint
// directory's rules; the manifest's and shards' refusals.
#include "trainer_hooks/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/csv_reader.h"
#include "data/source.h"
#include "data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_file.h"
#include "sync/protocol.h"
#include "trainer_hooks/job.h"
#include "trainer_hooks/job_config.h"
#include "trainer_hooks/param_dump.h"

namespace bagpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class TempDir {
 public:
  TempDir() {
    path_ = ::testing::TempDir() + "/checkpoint_test_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter_++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

const nlohmann::json kIdentity = {{"--dim", 8}, {"--batch-size", 256}};

// A complete checkpoint of `iteration` in `dir` with only a manifest (enough for the directory
// rules).
void FakeCheckpoint(const std::string& dir, Iteration iteration,
                    const nlohmann::json& identity = kIdentity) {
  const std::string path = dir + "/" + CheckpointName(iteration);
  fs::create_directories(path);
  CheckpointManifest manifest;
  manifest.iteration = iteration;
  manifest.stream.batches = iteration;  // one global batch of one sample an iteration
  manifest.stream.samples = iteration;
  manifest.identity = identity;
  ASSERT_TRUE(WriteManifest(path, manifest).ok());
}

TEST(CheckpointIdentityTest, NamesTheOptionAndBothValues) {
  EXPECT_TRUE(MatchIdentity(kIdentity, kIdentity, "ck").ok());
  nlohmann::json other = kIdentity;
  other["--dim"] = 16;
  const absl::Status status = MatchIdentity(kIdentity, other, "ck/ckpt-10");
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("checkpoint ck/ckpt-10 does not match this job: option --dim is 8 in "
                        "the checkpoint and 16 here"));
  other = kIdentity;
  other["--model"] = "dlrm";
  EXPECT_THAT(std::string(MatchIdentity(kIdentity, other, "ck").message()),
              HasSubstr("option --model is (not set) in the checkpoint and \"dlrm\" here"));
  // An option made of fields names the fields that differ.
  nlohmann::json ours = kIdentity;
  nlohmann::json theirs = kIdentity;
  theirs["optimizer"] = {{"kind", "adagrad"}, {"lr", 0.01}, {"eps", 1e-8}};
  ours["optimizer"] = {{"kind", "adagrad"}, {"lr", 0.5}, {"eps", 1e-8}, {"decay", 1}};
  const std::string fields(MatchIdentity(theirs, ours, "ck").message());
  EXPECT_THAT(fields, HasSubstr("option optimizer: lr is 0.01 in the checkpoint and 0.5 here; "
                                "option optimizer: decay is (not set) in the checkpoint and 1 "
                                "here"));
  EXPECT_THAT(fields, Not(HasSubstr("kind")));
  // A foreign manifest that differs in every one of a thousand long options: a short message.
  nlohmann::json foreign;
  for (int k = 0; k < 1000; ++k) foreign[absl::StrCat("--", std::string(100, 'k'), k)] = k;
  const absl::Status many = MatchIdentity(foreign, kIdentity, "ck");
  EXPECT_THAT(std::string(many.message()), HasSubstr(" more (they must be the same to resume)"));
  EXPECT_LT(many.message().size(), 2000u);
}

TEST(CheckpointIdentityTest, ASyntheticStreamMatchesWhateverItsSpecsSpelling) {
  // Key order, tables=N against the same rows=..., defaults named or left out: one stream.
  const nlohmann::json a = SyntheticStreamIdentity("synthetic:samples=100,tables=2,seed=3");
  EXPECT_TRUE(a.is_object()) << a.dump();
  EXPECT_EQ(a, SyntheticStreamIdentity("synthetic:seed=3,rows=1460/583,samples=100,alpha=1.05"));
  EXPECT_EQ(SyntheticStreamIdentity("synthetic"), SyntheticStreamIdentity("synthetic:"));
  // A checkpoint written when the spec was recorded as given matches the parsed form.
  nlohmann::json old_style = kIdentity;
  old_style["--data"] = "synthetic:tables=2,seed=3,samples=100";
  nlohmann::json job = kIdentity;
  job["--data"] = a;
  EXPECT_TRUE(MatchIdentity(old_style, job, "ck").ok());
  EXPECT_TRUE(MatchIdentity(job, job, "ck").ok());
  // Another stream: the field that differs, with both values.
  job["--data"] = SyntheticStreamIdentity("synthetic:samples=100,tables=2,seed=4");
  EXPECT_THAT(std::string(MatchIdentity(old_style, job, "ck").message()),
              HasSubstr("option --data: seed is 3 in the checkpoint and 4 here"));
  job["--data"] = SyntheticStreamIdentity("synthetic:samples=100,tables=3,seed=3");
  EXPECT_THAT(std::string(MatchIdentity(old_style, job, "ck").message()),
              HasSubstr("option --data: rows is [1460,583] in the checkpoint and "
                        "[1460,583,10131227] here"));
  // A CSV --schema as written in a checkpoint matches its other spellings.
  nlohmann::json csv_old = kIdentity;
  csv_old["--schema"] = "label=rating>3.5; dense=year; sparse=userId,movieId";
  nlohmann::json csv_new = kIdentity;
  csv_new["--schema"] = CanonicalCsvSpec("sparse=userId,movieId;label=rating > 3.5;dense=year");
  EXPECT_TRUE(MatchIdentity(csv_old, csv_new, "ck").ok());
  csv_new["--schema"] = CanonicalCsvSpec("label=rating>4; dense=year; sparse=userId,movieId");
  EXPECT_THAT(
      std::string(MatchIdentity(csv_old, csv_new, "ck").message()),
      HasSubstr(
          "option --schema: label is \"rating>3.5\" in the checkpoint and \"rating>4\" here"));
  // SGD's eps and accumulators are no difference (an older checkpoint recorded them).
  nlohmann::json sgd_old = kIdentity;
  sgd_old["embedding optimizer"] = {
      {"kind", "sgd"}, {"lr", 0.1}, {"eps", 1e-8}, {"initial_accumulator", 0.0}};
  sgd_old["dense optimizer"] = {{"kind", "sgd"}, {"lr", 0.1}, {"eps", 1e-8}};
  nlohmann::json sgd_new = kIdentity;
  sgd_new["embedding optimizer"] = {{"kind", "sgd"}, {"lr", 0.1}};
  sgd_new["dense optimizer"] = {{"kind", "sgd"}, {"lr", 0.1}, {"eps", 1e-6}};
  EXPECT_TRUE(MatchIdentity(sgd_old, sgd_new, "ck").ok());
  sgd_new["embedding optimizer"]["lr"] = 0.2;
  EXPECT_THAT(std::string(MatchIdentity(sgd_old, sgd_new, "ck").message()),
              HasSubstr("option embedding optimizer: lr is 0.1 in the checkpoint and 0.2 here"));
  nlohmann::json adagrad_old = kIdentity;
  adagrad_old["embedding optimizer"] = {{"kind", "adagrad"}, {"lr", 0.1}, {"eps", 1e-8}};
  nlohmann::json adagrad_new = adagrad_old;
  adagrad_new["embedding optimizer"]["eps"] = 1e-6;
  EXPECT_THAT(std::string(MatchIdentity(adagrad_old, adagrad_new, "ck").message()),
              HasSubstr("embedding optimizer: eps is 1e-08 in the checkpoint and 1e-06 here"));
  // A spec that does not parse stays the string it is (the job refuses it when it opens it).
  EXPECT_EQ(SyntheticStreamIdentity("synthetic:seed=x"), nlohmann::json("synthetic:seed=x"));
  EXPECT_EQ(SyntheticStreamIdentity("synthetics"), nlohmann::json("synthetics"));
}

// --max-samples N at or above the stream's size selects the samples none selects: the same job.
TEST(CheckpointIdentityTest, AMaxSamplesThatSelectsTheWholeStreamMatchesNone) {
  // A synthetic stream says its size (samples=100).
  nlohmann::json none = kIdentity;
  none["--data"] = SyntheticStreamIdentity("synthetic:samples=100,tables=2,seed=3");
  none["--max-samples"] = -1;
  nlohmann::json all = none;
  all["--max-samples"] = 100;
  nlohmann::json more = none;
  more["--max-samples"] = 250;
  EXPECT_TRUE(MatchIdentity(all, none, "ck").ok());
  EXPECT_TRUE(MatchIdentity(none, all, "ck").ok());
  EXPECT_TRUE(MatchIdentity(more, all, "ck").ok());
  // Fewer samples are another stream, named with the values as recorded.
  nlohmann::json fewer = none;
  fewer["--max-samples"] = 99;
  EXPECT_THAT(std::string(MatchIdentity(fewer, none, "ck").message()),
              HasSubstr("option --max-samples is 99 in the checkpoint and -1 here"));
  EXPECT_THAT(std::string(MatchIdentity(all, fewer, "ck").message()),
              HasSubstr("option --max-samples is 100 in the checkpoint and 99 here"));
  // Another synthetic stream is named as such, whatever --max-samples says.
  nlohmann::json bigger = all;
  bigger["--data"] = SyntheticStreamIdentity("synthetic:samples=200,tables=2,seed=3");
  EXPECT_THAT(std::string(MatchIdentity(all, bigger, "ck").message()),
              HasSubstr("option --data: samples is 100 in the checkpoint and 200 here"));

  // A file's size is what each job knew of it (a binary file's header: the checkpoint records
  // its job's); either unknown, N is not none.
  nlohmann::json file_none = kIdentity;
  file_none["--max-samples"] = -1;
  nlohmann::json file_all = kIdentity;
  file_all["--max-samples"] = 5000;
  EXPECT_THAT(std::string(MatchIdentity(file_all, file_none, "ck").message()),
              HasSubstr("option --max-samples is 5000 in the checkpoint and -1 here"));
  IdentityContext context;
  context.source_samples = 5000;
  EXPECT_TRUE(MatchIdentity(file_all, file_none, "ck", context, 5000).ok());
  EXPECT_TRUE(MatchIdentity(file_none, file_all, "ck", context, 5000).ok());
  // A checkpoint without its job's size (an older one) compares N as recorded, and says why.
  const std::string unrecorded =
      std::string(MatchIdentity(file_all, file_none, "ck", context).message());
  EXPECT_THAT(unrecorded, HasSubstr("option --max-samples is 5000 in the checkpoint and -1 here"));
  EXPECT_THAT(unrecorded, HasSubstr("the checkpoint does not record how many samples its job's "
                                    "data held"));
  // Data of another size: N is not none, and the same N over them is another stream (the
  // checkpoint's job trained on 2800 of 3000 samples an epoch; this file holds 2500).
  context.source_samples = 5001;
  EXPECT_THAT(std::string(MatchIdentity(file_all, file_none, "ck", context, 5000).message()),
              HasSubstr("option --max-samples is 5000 in the checkpoint and -1 here"));
  nlohmann::json file_2800 = kIdentity;
  file_2800["--max-samples"] = 2800;
  context.source_samples = 2500;
  const std::string other_data =
      std::string(MatchIdentity(file_2800, file_none, "ck", context, 3000).message());
  EXPECT_THAT(other_data, HasSubstr("option --max-samples is 2800 in the checkpoint and -1 here"));
  EXPECT_THAT(
      other_data,
      HasSubstr("its job trained on 2800 samples an epoch and this one would train on 2500"));
  EXPECT_THAT(
      std::string(MatchIdentity(file_2800, file_2800, "ck", context, 3000).message()),
      HasSubstr("its job trained on 2800 samples an epoch and this one would train on 2500"));
  // The same samples an epoch under other words: 2500 of 2500 against none of 2500.
  nlohmann::json file_2500 = kIdentity;
  file_2500["--max-samples"] = 2500;
  EXPECT_TRUE(MatchIdentity(file_2500, file_none, "ck", context, 2500).ok());
}

// A checkpoint that recorded an option as given ("" for its default) against a job that records
// the value it resolves to: "" is compared as this job's default.
TEST(CheckpointIdentityTest, ADefaultRecordedAsEmptyIsComparedAsItResolvesHere) {
  nlohmann::json older = kIdentity;
  older["model"] = {{"bottom", ""}, {"top", "16-1"}};
  nlohmann::json job = kIdentity;
  job["model"] = {{"bottom", "13-64-16"}, {"top", "16-1"}};
  EXPECT_THAT(std::string(MatchIdentity(older, job, "ck").message()),
              HasSubstr("option model: bottom is \"\" in the checkpoint and \"13-64-16\" here"));
  IdentityContext context;
  context.defaults = {{"model", {{"bottom", "13-64-16"}}}};
  EXPECT_TRUE(MatchIdentity(older, job, "ck", context).ok());
  // Other layers than the default are another model.
  job["model"]["bottom"] = "13-32-16";
  EXPECT_THAT(std::string(MatchIdentity(older, job, "ck", context).message()),
              HasSubstr("option model: bottom is \"13-64-16\" in the checkpoint and "
                        "\"13-32-16\" here"));
  // Only "" stands for the default: layers recorded as given are compared as they are.
  older["model"]["bottom"] = "13-32-16";
  job["model"]["bottom"] = "13-64-16";
  EXPECT_THAT(std::string(MatchIdentity(older, job, "ck", context).message()),
              HasSubstr("option model: bottom is \"13-32-16\" in the checkpoint and "
                        "\"13-64-16\" here"));
}

TEST(CheckpointDirTest, TheParentOfACheckpointWhateverItsSpelling) {
  EXPECT_EQ(CheckpointParent("runs/ck/ckpt-10"), "runs/ck");
  EXPECT_EQ(CheckpointParent("runs/ck/ckpt-10/"), "runs/ck");
  EXPECT_EQ(CheckpointParent("runs/ck/ckpt-10//"), "runs/ck");
  EXPECT_EQ(CheckpointParent("runs/ck/ckpt-10/."), "runs/ck");
  // ".." inside is the file system's (through a link it is not the lexical parent).
  EXPECT_EQ(CheckpointParent("runs/ck/link/../ckpt-10"), "runs/ck/link/..");
  EXPECT_EQ(CheckpointParent("/ck/ckpt-10"), "/ck");
  EXPECT_EQ(CheckpointParent("ckpt-10"), ".");
  EXPECT_EQ(CheckpointParent("ckpt-10/."), ".");
  // A path that ends in "..": the checkpoint it resolves to.
  TempDir dir;
  const std::string inside = dir / "ck/ckpt-3/shards";
  ASSERT_TRUE(fs::create_directories(inside));
  EXPECT_EQ(CheckpointParent(inside + "/.."), fs::weakly_canonical(dir / "ck").string());
}

TEST(CheckpointDirTest, HoldsOnlyThisJobsCheckpoints) {
  TempDir dir;
  const std::string ck = dir / "ck";
  EXPECT_TRUE(PrepareCheckpointDir(ck, kIdentity, -1).ok());  // created
  EXPECT_TRUE(fs::is_directory(ck));
  std::ofstream(ck + "/.MANIFEST.tmp-1-0") << "left by a killed writer";
  EXPECT_TRUE(PrepareCheckpointDir(ck, kIdentity, -1).ok());
  fs::create_directories(ck + "/ckpt-7");  // incomplete: does not exist as a checkpoint
  EXPECT_TRUE(PrepareCheckpointDir(ck, kIdentity, -1).ok());
  FakeCheckpoint(ck, 10);
  EXPECT_THAT(std::string(PrepareCheckpointDir(ck, kIdentity, -1).message()),
              HasSubstr("already holds checkpoints of this job (ckpt-10)"));
  fs::create_directories(ck + "/ckpt-12");  // being written when the job was killed
  EXPECT_TRUE(PrepareCheckpointDir(ck, kIdentity, 10).ok());
  // A resume clears incomplete checkpoints older than the newest complete one (nothing would
  // replace them); a newer one is the resumed job's to write again.
  EXPECT_FALSE(fs::exists(ck + "/ckpt-7"));
  EXPECT_TRUE(fs::exists(ck + "/ckpt-12"));
  EXPECT_TRUE(fs::exists(ck + "/ckpt-10/MANIFEST"));
  // Resuming an older checkpoint into a directory with newer ones (another run's) is refused,
  // and nothing is removed.
  const std::string older(PrepareCheckpointDir(ck, kIdentity, 5).message());
  EXPECT_THAT(older, HasSubstr("holds ckpt-10, newer than the checkpoint this job resumes from "
                               "(ckpt-5)"));
  EXPECT_TRUE(fs::exists(ck + "/ckpt-10/MANIFEST"));
  EXPECT_TRUE(fs::exists(ck + "/ckpt-12"));
  nlohmann::json other = kIdentity;
  other["--batch-size"] = 512;
  EXPECT_THAT(std::string(PrepareCheckpointDir(ck, other, 10).message()),
              HasSubstr("holds another job's checkpoints"));
  std::ofstream(ck + "/notes.txt") << "x";
  EXPECT_THAT(std::string(PrepareCheckpointDir(ck, kIdentity, 10).message()),
              HasSubstr("holds files that are not checkpoints of this job (e.g. 'notes.txt')"));
}

TEST(CheckpointDirTest, PruneKeepsTheNewestAndDropsIncompleteOnes) {
  TempDir dir;
  for (Iteration k : {10, 20, 30, 40}) FakeCheckpoint(dir.path(), k);
  fs::create_directories(dir / "ckpt-35");  // a crashed write
  fs::create_directories(dir / "ckpt-50");  // being written (newer than `newest`)
  ASSERT_TRUE(PruneCheckpoints(dir.path(), 2, 40).ok());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"ckpt-30", "ckpt-40", "ckpt-50"}));
  ASSERT_TRUE(PruneCheckpoints(dir.path(), 0, 40).ok());  // keep all
  EXPECT_EQ(ListCheckpoints(dir.path()).size(), 2u);
}

TEST(CheckpointDirTest, ResumeFindsTheLatestCompleteOne) {
  TempDir dir;
  EXPECT_EQ(ResolveCheckpoint(dir.path()).status().code(), absl::StatusCode::kNotFound);
  FakeCheckpoint(dir.path(), 9);
  FakeCheckpoint(dir.path(), 10);
  fs::create_directories(dir / "ckpt-11");  // no manifest: does not exist
  auto latest = ResolveCheckpoint(dir.path());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(fs::path(*latest).filename(), "ckpt-10");
  auto named = ResolveCheckpoint(dir / "ckpt-9");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, dir / "ckpt-9");
}

TEST(CheckpointFilesTest, ManifestRoundTripAndVersionRefusal) {
  TempDir dir;
  CheckpointManifest m;
  m.iteration = 42;
  m.identity = kIdentity;
  m.stream = {42, 10752, 1, 0xdeadbeef};
  m.every = 7;
  m.files = {{"trainer.bin", {100, 5}}, {"server-0-of-1.bin", {2000, 6}}};
  ASSERT_TRUE(WriteManifest(dir.path(), m).ok());
  auto back = ReadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->iteration, 42);
  EXPECT_EQ(back->identity, kIdentity);
  EXPECT_EQ(back->stream, m.stream);
  EXPECT_EQ(back->every, 7);
  EXPECT_EQ(back->source_samples, -1);  // its job did not know its data's size
  ASSERT_NE(back->Find("server-0-of-1.bin"), nullptr);
  EXPECT_EQ(back->Find("server-0-of-1.bin")->digest, (FileDigest{2000, 6}));
  m.source_samples = 3000;
  ASSERT_TRUE(WriteManifest(dir.path(), m).ok());
  back = ReadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->source_samples, 3000);
  // A manifest of another format version (valid checksum) is refused by version.
  ASSERT_TRUE(
      WriteChecksummedFile(dir / "MANIFEST", "BPCKMANI", kCheckpointFormatVersion + 1, "{}").ok());
  EXPECT_THAT(std::string(ReadManifest(dir.path()).status().message()),
              HasSubstr("has format version 2; this build reads version 1"));
}

TEST(CheckpointFilesTest, ShardRoundTripAndRefusals) {
  TempDir dir;
  const RowInitializer init(3, 4, 4, 0.1f, {100, 50});
  RowStore store(init);
  // Server 1 of 2 stores the rows hashed to it.
  std::vector<RowId> rows;
  for (RowId row = 0; row < 150; ++row) {
    if (ServerOfRow(row, 2) == 1) rows.push_back(row);
  }
  ASSERT_GT(rows.size(), 20u);
  for (RowId row : rows) store.GetOrCreate(row)[0] = static_cast<float>(row);
  auto digest = WriteShard(dir / "s", store, {1, 2, 30});
  ASSERT_TRUE(digest.ok()) << digest.status();
  RowStore loaded(init);
  ASSERT_TRUE(LoadShard(dir / "s", {1, 2, 30}, &*digest, &loaded).ok());
  EXPECT_EQ(loaded.size(), static_cast<int64_t>(rows.size()));
  for (RowId row : rows) {
    ASSERT_NE(loaded.Find(row), nullptr);
    EXPECT_EQ(std::memcmp(loaded.Find(row), store.Find(row), 8 * sizeof(float)), 0);
  }
  // A non-finite value (training stops before it writes one; its checksum holds).
  {
    RowStore nan_store(init);
    for (RowId row : rows) nan_store.GetOrCreate(row)[0] = static_cast<float>(row);
    nan_store.GetOrCreate(rows[3])[5] = std::nanf("");
    ASSERT_TRUE(WriteShard(dir / "n", nan_store, {1, 2, 30}).ok());
    RowStore refused(init);
    EXPECT_THAT(std::string(LoadShard(dir / "n", {1, 2, 30}, nullptr, &refused).message()),
                HasSubstr(absl::StrCat("row ", rows[3],
                                       " holds a non-finite value (nan) at "
                                       "float 5")));
  }
  // A row of server 0's in server 1's shard (a forged or mislabelled file; its checksum holds).
  RowId foreign = 0;
  while (ServerOfRow(foreign, 2) != 0) ++foreign;
  store.GetOrCreate(foreign);
  ASSERT_TRUE(WriteShard(dir / "f", store, {1, 2, 30}).ok());
  RowStore refused(init);
  EXPECT_THAT(std::string(LoadShard(dir / "f", {1, 2, 30}, nullptr, &refused).message()),
              HasSubstr(absl::StrCat("row ", foreign, " belongs to server 0, not 1")));
  RowStore other(init);
  EXPECT_THAT(std::string(LoadShard(dir / "s", {0, 2, 30}, nullptr, &other).message()),
              HasSubstr("has server 1, this job expects 0"));
  EXPECT_THAT(std::string(LoadShard(dir / "s", {1, 2, 31}, nullptr, &other).message()),
              HasSubstr("has iteration 30, this job expects 31"));
  const FileDigest wrong{digest->bytes, digest->crc32c ^ 1};
  EXPECT_THAT(std::string(LoadShard(dir / "s", {1, 2, 30}, &wrong, &other).message()),
              HasSubstr("is not the one its manifest names"));
  RowStore sgd(RowInitializer(3, 4, 0, 0.0f, {100, 50}));
  EXPECT_THAT(std::string(LoadShard(dir / "s", {1, 2, 30}, nullptr, &sgd).message()),
              HasSubstr("record_floats (embedding dim + optimizer state) 8, this job expects 4"));
}

// --- the C++ job API ----------------------------------------------------------------------------

constexpr int kDim = 4;
constexpr char kData[] = "samples=6400,rows=400/60/1500/9,dense=2,alpha=1.1,pooling=1-3,seed=3";

// Logistic regression over the pooled embeddings whose dense weights are its LoopState.
absl::Status LogisticLoop(Trainer& trainer, int tables, TrainerOutcome* outcome,
                          bool keep_state = true) {
  std::vector<float> w(tables * kDim, 0.05f);
  LoopState state;
  state.save = [&]() -> absl::StatusOr<std::string> {
    return std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  };
  state.restore = [&](std::string_view bytes) -> absl::Status {
    if (bytes.size() != w.size() * sizeof(float)) return absl::DataLossError("size");
    std::memcpy(w.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  };
  if (keep_state) RETURN_IF_ERROR(trainer.SetLoopState(state));
  std::vector<float> grad_w(w.size()), pooled_grad;
  LocalBatch batch;
  const size_t width = static_cast<size_t>(tables) * kDim;
  while (true) {
    ASSIGN_OR_RETURN(bool more, trainer.BeginIteration(&batch));
    if (!more) break;
    ASSIGN_OR_RETURN(const float* pooled, trainer.LookupPooled());  // CPU: host memory
    pooled_grad.assign(static_cast<size_t>(batch.num_samples) * width, 0.0f);
    std::fill(grad_w.begin(), grad_w.end(), 0.0f);
    const float scale = 1.0f / static_cast<float>(batch.global_batch_size);
    for (int s = 0; s < batch.num_samples; ++s) {
      float logit = 0;
      for (size_t k = 0; k < width; ++k) logit += w[k] * pooled[s * width + k];
      const float d = (1.0f / (1.0f + std::exp(-logit)) - batch.labels_host[s]) * scale;
      for (size_t k = 0; k < width; ++k) {
        pooled_grad[s * width + k] = d * w[k];
        grad_w[k] += d * pooled[s * width + k];
      }
    }
    RETURN_IF_ERROR(trainer.AllReduce(grad_w.data(), grad_w.size()));
    for (size_t k = 0; k < w.size(); ++k) w[k] -= 0.5f * grad_w[k];
    RETURN_IF_ERROR(trainer.EndIteration(pooled_grad.data()));
  }
  RETURN_IF_ERROR(trainer.Flush());
  outcome->dense_parameters = w;
  return absl::OkStatus();
}

struct JobRun {
  absl::Status status;
  std::string sha;
  JobResult result;
};

// When the run says SIGTERM through stop_requested.
struct StopAt {
  int polls = -1;               // after this many polls (by any role; -1: never)
  bool after_training = false;  // once a trainer's loop has returned
};

// Trains on the first 5120 samples of kData (80 batches of 64); with `eval`, evaluates the last
// 1280 (20 batches).
JobRun Train(const std::string& policy, int trainers, int iterations, CheckpointOptions checkpoint,
             StopAt stop = {}, bool eval = false, bool loop_state = true) {
  JobRun run;
  auto config = ParseSyntheticConfig(kData);
  auto source = OpenSynthetic(*config, SourceOptions{});
  const Schema schema = (*source)->schema();
  auto stream = std::make_unique<BatchStream>(SampleRange(std::move(*source), 0, 5120),
                                              BatchStream::Options{64, /*epochs=*/0, false});
  std::unique_ptr<BatchStream> eval_stream;
  if (eval) {
    auto tail = OpenSynthetic(*config, SourceOptions{});
    eval_stream = std::make_unique<BatchStream>(SampleRange(std::move(*tail), 5120, -1),
                                                BatchStream::Options{64, /*epochs=*/1, false});
  }
  JobOptions options;
  options.layout = {2, trainers};
  options.peer_timeout = absl::Seconds(60);
  options.trainer.dim = kDim;
  options.trainer.sparse_optimizer = {OptimizerKind::kAdagrad, 0.3f, 1e-8f, 0.1f};
  options.trainer.policy = *ParseCachePolicy(policy);
  options.trainer.cache_rows = 600;
  options.trainer.initializer = RowInitializer(
      11, kDim, StateFloatsPerRow(OptimizerKind::kAdagrad, kDim), 0.1f, schema.table_rows);
  options.oracle.planner.schema = schema;
  options.oracle.planner.num_trainers = trainers;
  options.oracle.planner.capacity = 600;
  options.oracle.planner.lookahead = 5;
  options.oracle.planner.policy = options.trainer.policy;
  options.oracle.max_iterations = iterations;
  options.checkpoint = std::move(checkpoint);
  // stop_requested is polled by every role at its boundaries: say SIGTERM after `stop.polls`
  // polls (somewhere in the middle of the run), or once the training has ended.
  std::atomic<int> polls{0};
  std::atomic<bool> trained{false};
  if (stop.polls >= 0 || stop.after_training) {
    options.stop_requested = [&polls, &trained, stop] {
      if (stop.after_training) return trained.load() ? SIGTERM : 0;
      return polls.fetch_add(1) >= stop.polls ? SIGTERM : 0;
    };
  }
  auto writer = ParamWriter::Create("", {}, RecordFloats(OptimizerKind::kAdagrad, kDim));
  ParamSink sink;
  sink.dense = [&](const std::vector<float>& dense) { return (*writer)->AddDense(dense); };
  sink.row = [&](RowId row, const float* record) { return (*writer)->AddRow(row, record); };
  const int tables = schema.num_tables();
  run.status = RunEmbeddedJob(
      options, std::move(stream), std::move(eval_stream),
      [&](Trainer& trainer, TrainerOutcome* outcome) {
        const absl::Status status = LogisticLoop(trainer, tables, outcome, loop_state);
        trained = true;
        return status;
      },
      sink, &run.result);
  if (run.status.ok()) run.sha = *(*writer)->Finish();
  return run;
}

TEST(CheckpointJobTest, RunStoppedAndResumedEqualsTheUninterruptedRun) {
  TempDir dir;
  const JobRun reference = Train("off", 2, 60, {});
  ASSERT_TRUE(reference.status.ok()) << reference.status;

  // A run to 25 with a checkpoint every 10 (10, 20, and 25 at the end), resumed to 60.
  CheckpointOptions first;
  first.dir = dir / "ck";
  first.every = 10;
  const JobRun stopped = Train("oracle", 2, 25, first);
  ASSERT_TRUE(stopped.status.ok()) << stopped.status;
  EXPECT_EQ(stopped.result.oracle.checkpoint.written, 3);
  EXPECT_EQ(ListCheckpoints(first.dir).size(), 2u);  // keep = 2
  EXPECT_EQ(stopped.result.trainers[0].stats.checkpoints, 3);

  CheckpointOptions resume = first;
  resume.resume = first.dir;
  const JobRun resumed = Train("lru", 2, 60, resume);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  EXPECT_EQ(resumed.result.oracle.checkpoint.first_iteration, 25);
  EXPECT_EQ(resumed.result.oracle.iterations, 35);
  EXPECT_GT(resumed.result.trainers[0].stats.fills, 0);
  EXPECT_EQ(resumed.sha, reference.sha);
}

TEST(CheckpointJobTest, StopRequestedMidRunThenResumedEqualsTheUninterruptedRun) {
  TempDir dir;
  const JobRun reference = Train("off", 2, 60, {});
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  CheckpointOptions checkpoint;
  checkpoint.dir = dir / "ck";
  const JobRun stopped = Train("oracle", 2, 60, checkpoint, {.polls = 60});
  ASSERT_TRUE(stopped.status.ok()) << stopped.status;
  const Iteration at = stopped.result.oracle.stopped_at;
  EXPECT_GT(at, 0);
  EXPECT_LT(at, 60);
  EXPECT_EQ(stopped.result.oracle.checkpoint.written, 1);
  EXPECT_EQ(stopped.result.oracle.checkpoint.last, checkpoint.dir + "/" + CheckpointName(at));
  EXPECT_TRUE(stopped.result.trainers[0].dense_parameters.size() > 0);
  CheckpointOptions resume = checkpoint;
  resume.resume = checkpoint.dir;
  const JobRun resumed = Train("oracle", 2, 60, resume);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  EXPECT_EQ(resumed.result.oracle.checkpoint.first_iteration, at);
  EXPECT_EQ(resumed.sha, reference.sha);
}

TEST(CheckpointJobTest, StopRequestedBeforeTheFirstBatchSavesNothing) {
  TempDir dir;
  CheckpointOptions checkpoint;
  checkpoint.dir = dir / "ck";
  const JobRun early = Train("oracle", 1, 60, checkpoint, {.polls = 0});
  ASSERT_TRUE(early.status.ok()) << early.status;
  EXPECT_EQ(early.result.oracle.stopped_at, 0);
  EXPECT_EQ(early.result.oracle.stop_signal, SIGTERM);
  EXPECT_EQ(early.result.oracle.checkpoint.written, 0);
}

// What a resume must not take as a checkpoint of this job: a loop state that is empty while the
// loop keeps one (it would restart from scratch), a checkpoint under another iteration's name;
// and a link in place of a checkpoint is removed without following it.
TEST(CheckpointJobTest, ResumeRefusesMismatchedCheckpointsAndLeavesLinkedOnesAlone) {
  TempDir dir;
  const JobRun reference = Train("off", 2, 60, {});
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  CheckpointOptions first;
  first.dir = dir / "ck";
  first.every = 10;
  ASSERT_TRUE(Train("oracle", 2, 25, first).status.ok());  // ckpt-20, ckpt-25
  CheckpointOptions resume = first;
  resume.resume = first.dir;

  // ckpt-25 replaced by a link to a copy outside the directory: read through, and pruned as a
  // link (the copy keeps its files).
  const std::string outside = dir / "outside-25";
  fs::copy(first.dir + "/ckpt-25", outside, fs::copy_options::recursive);
  fs::remove_all(first.dir + "/ckpt-25");
  fs::create_directory_symlink(outside, first.dir + "/ckpt-25");
  const JobRun resumed = Train("oracle", 2, 60, resume);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  EXPECT_EQ(resumed.result.oracle.checkpoint.first_iteration, 25);
  EXPECT_EQ(resumed.sha, reference.sha);
  EXPECT_FALSE(fs::exists(first.dir + "/ckpt-25"));
  EXPECT_TRUE(fs::exists(outside + "/MANIFEST"));
  EXPECT_TRUE(fs::exists(outside + "/trainer.bin"));

  // A checkpoint renamed over another iteration's name.
  TempDir other;
  CheckpointOptions second;
  second.dir = other / "ck";
  second.every = 10;
  ASSERT_TRUE(Train("oracle", 2, 25, second).status.ok());
  fs::remove_all(second.dir + "/ckpt-25");
  fs::rename(second.dir + "/ckpt-20", second.dir + "/ckpt-25");
  CheckpointOptions renamed = second;
  renamed.resume = second.dir;
  const JobRun refused = Train("oracle", 2, 60, renamed);
  EXPECT_THAT(std::string(refused.status.message()),
              HasSubstr("ckpt-25: its manifest says iteration 20, its name ckpt-25"));

  // A loop that keeps no state, resumed by one that does.
  TempDir stateless;
  CheckpointOptions third;
  third.dir = stateless / "ck";
  ASSERT_TRUE(Train("oracle", 2, 20, third, {}, false, /*loop_state=*/false).status.ok());
  CheckpointOptions with_state = third;
  with_state.resume = third.dir;
  const JobRun empty = Train("oracle", 2, 60, with_state);
  EXPECT_THAT(std::string(empty.status.message()),
              HasSubstr("the checkpoint's loop state " + third.dir +
                        "/ckpt-20/trainer.bin is empty, but this job's training loop keeps one"));
}

// A stop after the last iteration skips the evaluation and the parameter collection (the final
// checkpoint holds the trained state); the resumed job trains nothing, evaluates and gathers the
// same parameters as the uninterrupted run.
TEST(CheckpointJobTest, StopAfterTheTrainingSkipsEvaluationAndCollection) {
  const JobRun reference = Train("oracle", 2, 60, {}, {}, /*eval=*/true);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_EQ(reference.result.oracle.eval_batches, 20);
  EXPECT_GT(reference.result.parameter_rows, 0);
  EXPECT_LT(reference.result.oracle.stopped_at, 0);
  for (const bool eval : {true, false}) {
    SCOPED_TRACE(eval ? "stop during the evaluation" : "stop before the parameter collection");
    TempDir dir;
    CheckpointOptions checkpoint;
    checkpoint.dir = dir / "ck";
    const JobRun stopped = Train("oracle", 2, 60, checkpoint, {.after_training = true}, eval);
    ASSERT_TRUE(stopped.status.ok()) << stopped.status;
    const OracleRoleStats& oracle = stopped.result.oracle;
    EXPECT_EQ(oracle.stopped_at, 60);
    EXPECT_EQ(oracle.stop_signal, SIGTERM);
    EXPECT_TRUE(oracle.stopped_after_training);
    EXPECT_EQ(oracle.iterations, 60);
    if (eval) EXPECT_LT(oracle.eval_batches, 20);  // the queues hold fewer than 20 plans
    EXPECT_EQ(stopped.result.parameter_rows, 0);
    EXPECT_EQ(oracle.checkpoint.last, checkpoint.dir + "/" + CheckpointName(60));
    const std::string message(StoppedJobStatus(oracle, checkpoint).message());
    EXPECT_THAT(message, HasSubstr("stopped by SIGTERM after the training ended at iteration 60 "
                                   "(the rest of the evaluation and the parameter collection "
                                   "skipped); resume with --resume " +
                                   checkpoint.dir));
    EXPECT_THAT(message, HasSubstr("to run them"));

    CheckpointOptions resume = checkpoint;
    resume.resume = checkpoint.dir;
    const JobRun resumed = Train("oracle", 2, 60, resume, {}, /*eval=*/true);
    ASSERT_TRUE(resumed.status.ok()) << resumed.status;
    EXPECT_EQ(resumed.result.oracle.iterations, 0);
    EXPECT_EQ(resumed.result.oracle.eval_batches, 20);
    EXPECT_EQ(resumed.result.parameter_rows, reference.result.parameter_rows);
    EXPECT_EQ(resumed.sha, reference.sha);
  }
  // Without a checkpoint directory nothing is saved, and the line says so.
  const JobRun unsaved = Train("oracle", 2, 60, {}, {.after_training = true}, /*eval=*/true);
  ASSERT_TRUE(unsaved.status.ok()) << unsaved.status;
  EXPECT_THAT(std::string(StoppedJobStatus(unsaved.result.oracle, {}).message()),
              HasSubstr("ended at iteration 60 (the rest of the evaluation and the parameter "
                        "collection skipped); nothing saved (no --checkpoint-dir)"));
}

}  // namespace
}  // namespace bagpipe
