// The servers' part of a checkpoint at full size: every row of the 26 Criteo Kaggle tables
// (33.8M rows; --rows to change) with its optimizer state, spread over --servers row stores as
// the job shards them (sync/protocol.h ServerOfRow), written as checkpoint shards
// (server/shard_file.h: checksummed, fsynced, renamed) by one thread per server — as the server
// ranks do in parallel — and loaded back (verified). This is the worst case of a long job: a
// checkpoint holds the rows the servers store, and after enough data every row was touched.
//
//   build/bench/checkpoint/checkpoint_shard_bench --dir /tmp/ckbench --servers 2
//
// Prints one JSON line: rows, bytes, write and load seconds, GB/s, peak RSS. Needs about
// 180 bytes of memory per row (the stores) and 136 bytes of disk per row (dim 16, Adagrad).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/json_fields.h"
#include "core/optimizer.h"
#include "core/row_init.h"
#include "data/synthetic.h"
#include "nlohmann/json.hpp"
#include "server/shard_file.h"
#include "sync/protocol.h"

namespace bagpipe {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Main(int argc, char** argv) {
  CLI::App app("checkpoint shards at Criteo-Kaggle size: write and load time");
  std::string dir = "/tmp/checkpoint_shard_bench";
  int servers = 2, dim = 16;
  int64_t rows = 0;
  std::string optimizer = "adagrad";
  app.add_option("--dir", dir, "where the shards go (removed afterwards)")->capture_default_str();
  app.add_option("--servers", servers, "shards, written in parallel")->capture_default_str();
  app.add_option("--rows", rows, "rows in all (0: the 26 Criteo Kaggle tables, 33.8M)");
  app.add_option("--dim", dim, "embedding dimension")->capture_default_str();
  app.add_option("--optimizer", optimizer, "sgd, adagrad, rowwise-adagrad")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto kind = ParseOptimizerKind(optimizer);
  if (!kind.ok()) {
    std::fprintf(stderr, "%s\n", std::string(kind.status().message()).c_str());
    return 2;
  }
  std::vector<int64_t> tables = CriteoKaggleTableRows();
  if (rows > 0) tables = {rows};
  int64_t total = 0;
  for (int64_t t : tables) total += t;
  const RowInitializer init(1, dim, StateFloatsPerRow(*kind, dim), 0.0f, tables);
  std::filesystem::create_directories(dir);

  // Fill: every row, initialised as a server creates it.
  double start = Now();
  std::vector<std::unique_ptr<RowStore>> stores;
  for (int s = 0; s < servers; ++s) {
    stores.push_back(std::make_unique<RowStore>(init));
    stores.back()->Reserve(total / servers + total / 100);
  }
  for (RowId row = 0; row < static_cast<RowId>(total); ++row) {
    stores[ServerOfRow(row, servers)]->GetOrCreate(row);
  }
  const double fill_s = Now() - start;

  auto parallel = [&](auto&& fn) {
    std::vector<std::thread> threads;
    std::vector<absl::Status> statuses(servers);
    for (int s = 0; s < servers; ++s) threads.emplace_back([&, s] { statuses[s] = fn(s); });
    for (auto& t : threads) t.join();
    for (const absl::Status& status : statuses) {
      if (!status.ok()) {
        std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
        return false;
      }
    }
    return true;
  };
  auto path = [&](int s) { return dir + "/server-" + std::to_string(s) + ".bin"; };
  std::vector<FileDigest> digests(servers);
  start = Now();
  if (!parallel([&](int s) -> absl::Status {
        auto digest = WriteShard(path(s), *stores[s], {s, servers, 1000});
        if (!digest.ok()) return digest.status();
        digests[s] = *digest;
        return absl::OkStatus();
      })) {
    return 1;
  }
  const double write_s = Now() - start;
  uint64_t bytes = 0;
  for (const FileDigest& d : digests) bytes += d.bytes;
  stores.clear();  // a resumed job starts with empty stores

  // Load (from the page cache when the machine has room for it: a resume right after).
  std::vector<std::unique_ptr<RowStore>> loaded;
  for (int s = 0; s < servers; ++s) loaded.push_back(std::make_unique<RowStore>(init));
  start = Now();
  if (!parallel([&](int s) {
        return LoadShard(path(s), {s, servers, 1000}, &digests[s], loaded[s].get());
      })) {
    return 1;
  }
  const double load_s = Now() - start;
  int64_t loaded_rows = 0;
  for (const auto& store : loaded) loaded_rows += store->size();
  std::filesystem::remove_all(dir);
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const nlohmann::json result = {{"rows", total},
                                 {"loaded_rows", loaded_rows},
                                 {"servers", servers},
                                 {"record_bytes", init.record_floats() * 4},
                                 {"bytes", bytes},
                                 {"fill_seconds", fill_s},
                                 {"write_seconds", write_s},
                                 {"write_gb_per_s", bytes / write_s / 1e9},
                                 {"load_seconds", load_s},
                                 {"load_gb_per_s", bytes / load_s / 1e9},
                                 {"peak_rss_gb", usage.ru_maxrss / 1e6}};
  std::printf("%s\n", DumpJson(result).c_str());
  return loaded_rows == total ? 0 : 1;
}

}  // namespace
}  // namespace bagpipe

int main(int argc, char** argv) { return bagpipe::Main(argc, argv); }
