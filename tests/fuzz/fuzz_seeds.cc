// Writes the seed corpora of the fuzz harnesses into OUT_DIR/<harness>/: cuts of the committed
// fixtures (Criteo TSV, MovieLens CSV) and small generated files (binary datasets, params.bin,
// plans, protocol messages, checkpoint files), each prefixed by the harness's options byte where it
// has one. Usage: fuzz_seeds OUT_DIR SOURCE_DIR
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "data/binary_format.h"
#include "data/source.h"
#include "model/loop_state.h"
#include "server/row_store.h"
#include "server/shard_file.h"
#include "sync/protocol.h"
#include "trainer_hooks/checkpoint.h"
#include "trainer_hooks/param_dump.h"
#include "trainer_hooks/plan_codec.h"

namespace bagpipe {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string FirstLines(const std::string& text, int lines) {
  size_t at = 0;
  for (int i = 0; i < lines && at != std::string::npos; ++i) {
    at = text.find('\n', at);
    if (at != std::string::npos) ++at;
  }
  return text.substr(0, at == std::string::npos ? text.size() : at);
}

std::string Bytes(const bagpipe::Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

absl::Status Run(const fs::path& out, const fs::path& source_dir) {
  const std::string criteo = ReadFile(source_dir / "tests/fixtures/criteo_kaggle_sample_100.tsv");
  const std::string movielens = ReadFile(source_dir / "tests/fixtures/movielens_small.csv");
  if (criteo.empty() || movielens.empty()) {
    return absl::NotFoundError(absl::StrCat("no fixtures under ", source_dir.string()));
  }
  // Criteo: 12 lines, with and without skipping, hashing and small limits.
  const std::string criteo_cut = FirstLines(criteo, 12);
  for (const char flags : {'\x00', '\x13', '\x26', '\x39'}) {
    WriteFile(out / "criteo" / absl::StrCat("fixture_", int{flags}), flags + criteo_cut);
  }
  // CSV: the MovieLens spec and 30 lines; a quoted, multi-hot sample; a log() and operator one.
  const std::string csv_cut = FirstLines(movielens, 30);
  WriteFile(out / "csv" / "movielens",
            std::string(1, '\x10') +
                "label=rating>3.5; dense=year; sparse=userId,movieId,split(genres,|)\n" + csv_cut);
  WriteFile(out / "csv" / "quoted",
            std::string(1, '\x01') + "label=label; sparse=name, split(tags,|)\n" +
                "label,name,tags\n1,\"Smith, \"\"J\"\"\",a|b\n0,,\n1,Smith,b||c\n1,NA,NA\n");
  WriteFile(out / "csv" / "ops", std::string(1, '\x20') + "label=a<=2; dense=log(b),b; sparse=c\n" +
                                     "a,b,c\r\n1,2,x\r\n3,-1,y\r\n2,,x\r\n");
  // Binary: small converted files (checksums repaired by the harness when bit 0 is set).
  const fs::path scratch = out / "scratch";
  fs::create_directories(scratch);
  struct BinSeed {
    std::string name, spec;
  };
  for (const BinSeed& seed :
       {BinSeed{"synthetic", "synthetic:samples=12,rows=10/5/3,dense=2,pooling=0-3,seed=4"},
        BinSeed{"wide_ids", "synthetic:samples=4,rows=5000000000,dense=1,seed=2"},
        BinSeed{"criteo", "criteo:" + (scratch / "criteo.tsv").string()}}) {
    WriteFile(scratch / "criteo.tsv", FirstLines(criteo, 6));
    ASSIGN_OR_RETURN(auto source, OpenSource(seed.spec, {}));
    const fs::path path = scratch / (seed.name + ".bin");
    RETURN_IF_ERROR(WriteBinary(*source, path.string()).status());
    const std::string bytes = ReadFile(path);
    WriteFile(out / "binary" / (seed.name + "_raw"), std::string(1, '\x00') + bytes);
    WriteFile(out / "binary" / (seed.name + "_repaired"), std::string(1, '\x21') + bytes);
    WriteFile(out / "binary" / (seed.name + "_v1"), std::string(1, '\x13') + bytes);
  }
  // params.bin: a real file, and the compact form (header JSON, NUL, body).
  {
    ASSIGN_OR_RETURN(auto writer, ParamWriter::Create(scratch.string(), {{"dim", 2}}, 3));
    RETURN_IF_ERROR(writer->AddDense({0.5f, -1.0f, 2.0f}));
    const float record[3] = {1, 2, 3};
    RETURN_IF_ERROR(writer->AddRow(3, record));
    RETURN_IF_ERROR(writer->AddRow(70, record));
    RETURN_IF_ERROR(writer->Finish().status());
    const std::string file = ReadFile(scratch / "params.bin");
    WriteFile(out / "params" / "written", std::string(1, '\x00') + file);
    uint64_t length = 0;
    std::memcpy(&length, file.data() + 8, 8);
    const size_t body_at = 64 * 1024;
    WriteFile(out / "params" / "compact", std::string(1, '\x01') + file.substr(16, length) +
                                              std::string(1, '\0') + file.substr(body_at));
  }
  // A plan with every list non-empty, and the other kinds.
  {
    TrainerPlan plan;
    plan.iteration = 7;
    plan.trainer = 1;
    plan.num_trainers = 2;
    plan.first_sample = 100;
    plan.num_samples = 2;
    plan.global_samples = 4;
    plan.num_dense = 1;
    plan.num_tables = 2;
    plan.labels = {0, 1};
    plan.dense = {0.5f, 1.5f};
    plan.offsets = {0, 1, 2, 3, 5};
    plan.unique_index = {0, 1, 2, 2, 3};
    plan.unique_rows = {4, 9, 20, 21};
    plan.unique_slots = {0, 1, 2, 3};
    plan.extract = {{5, 30, true, true}, {6, 31, false, true}};
    plan.fills = {{0, 4, -1}, {2, 20, 5}};
    plan.private_unique = {0, 3};
    plan.shared = {{1, 9, 1, true}, {2, 20, 2, false}};
    plan.peers = {{0, {1}, {2}}};
    WriteFile(out / "plan_codec" / "iteration", Bytes(EncodePlan(PlanKind::kIteration, plan)));
    WriteFile(out / "plan_codec" / "drain", Bytes(EncodePlan(PlanKind::kDrain, TrainerPlan())));
    WriteFile(out / "plan_codec" / "end", Bytes(EncodePlan(PlanKind::kEnd, TrainerPlan())));
  }
  // Protocol messages, each behind its type byte.
  WriteFile(out / "wire" / "fetch_request",
            std::string(1, '\x00') + Bytes(EncodeFetchRequest({1, 7, {3, 9}, {-1, 4}})));
  WriteFile(out / "wire" / "fetch_response",
            std::string(1, '\x01') + Bytes(EncodeFetchResponse({1, {0.5f, 1, 2}})));
  WriteFile(out / "wire" / "write_back",
            std::string(1, '\x02') + Bytes(EncodeWriteBack({5, {3}, {1, 2}})));
  WriteFile(out / "wire" / "control",
            std::string(1, '\x03') + Bytes(EncodeControl(ControlKind::kStats, {'{', '}'})));
  // Checkpoint files: the payloads of a manifest, a shard and a loop state (the harness wraps
  // them in their container), and one whole file as written.
  {
    CheckpointManifest manifest;
    manifest.iteration = 7;
    manifest.identity = {{"--dim", 8}, {"--trainers", 2}, {"tables", {10, 20}}};
    manifest.stream = {7, 112, 0, 0x1234abcd};
    manifest.every = 7;
    manifest.files = {{kLoopStateName, {120, 5}}, {ShardName(0, 1), {300, 6}}};
    const fs::path dir = scratch / "ckpt-7";
    fs::create_directories(dir);
    RETURN_IF_ERROR(WriteManifest(dir.string(), manifest));
    const std::string file = ReadFile(dir / kManifestName);
    WriteFile(out / "checkpoint" / "manifest", '\x00' + file.substr(16, file.size() - 32));
    WriteFile(out / "checkpoint" / "manifest_file", '\x04' + file);
    RowStore store(RowInitializer(1, 2, 1, 0.0f, {10, 20}));
    (void)store.GetOrCreate(3);
    (void)store.GetOrCreate(25);
    ASSIGN_OR_RETURN(const FileDigest digest,
                     WriteShard((dir / ShardName(0, 1)).string(), store, {0, 1, 7}));
    (void)digest;
    const std::string shard = ReadFile(dir / ShardName(0, 1));
    WriteFile(out / "checkpoint" / "shard", '\x01' + shard.substr(16, shard.size() - 32));
    DenseLoopState state;
    state.parameters = {0.5f, -1.0f, 2.0f};
    state.optimizer_state = {0.1f, 0.2f, 0.3f};
    state.global_samples = 112;
    WriteFile(out / "checkpoint" / "loop_state", '\x02' + EncodeDenseLoopState(state));
  }
  fs::remove_all(scratch);

  // Spec strings: the options byte's bits 0-2 pick the parser (specs_fuzz.cc); for synthetic
  // sources, bits 3-7 are the samples per read - 1.
  const std::vector<std::pair<char, std::vector<std::string>>> specs = {
      {'\x00',
       {"", "samples=200000,tables=26,scale=0.01", "samples=100000",
        "samples=100000,tables=8,scale=0.01", "samples=3000,scale=0.001,pooling=0-3,seed=7",
        "samples=50,rows=1000/20/5,alpha=0.8,dense=4", "samples=20,tables=3,rows=64,pooling=2-5",
        "samples=10,rows=2/3,drift=4,seed=-5", "samples=9,tables=1,alpha=10,dense=0,pooling=0",
        "samples=7,rows=4611686018427387000,scale=1", "samples=12,tables=26,scale=1e-9",
        "samples=5,rows=100,pooling=3,alpha=1,drift=1"}},
      {'\x01',
       {"1Gbit/s,200us", "25Gbit/s,20us", "10GB/s,5us", "100Mbit/s", "none", "", "1kbit/s,1s",
        "8bit/s", "1.5gb/s,0.5ms", "40MB/s,2ms", "100kb/s,1h", "1e3b/s,0"}},
      {'\x02', {"sum", "mean", "SUM", "Mean", "max", ""}},
      {'\x03', {"cpu", "cuda", "gpu", "auto", "CPU", "tpu", ""}},
      {'\x04', {"sync", "async", "lazy", "0", "1", "2", "ASYNC", "3", ""}},
      {'\x05', {"sgd", "adagrad", "rowwise-adagrad", "rowwise_adagrad", "adam", "SGD", ""}},
      {'\x06',
       {"13-512-256-64", "13-512-256-16", "64-32-1", "1", "4-3-2", "4-2-1", "13-x-64", "13--64",
        "-1", "2147483648", "13-64-", ""}},
      {'\x07', {"oracle", "lru", "lfu", "off", "device", "LRU", "random", ""}},
  };
  // Synthetic specs are read 1, 8 or 32 samples at a time.
  constexpr uint8_t kSyntheticFlags[] = {0, 7 << 3, 31 << 3};
  for (const auto& [selector, strings] : specs) {
    for (size_t i = 0; i < strings.size(); ++i) {
      const char flags = selector == '\x00' ? static_cast<char>(kSyntheticFlags[i % 3]) : selector;
      WriteFile(out / "specs" / absl::StrCat(int{selector}, "_", i), flags + strings[i]);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR SOURCE_DIR\n", argv[0]);
    return 2;
  }
  const absl::Status status = bagpipe::Run(argv[1], argv[2]);
  if (!status.ok()) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
