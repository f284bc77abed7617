// Checkpoints: a Bagpipe job saves its whole training state at an iteration boundary and a later
// job resumes from it, continuing bit for bit (with --deterministic) as if never interrupted.
//
// The consistent cut. A checkpoint of iteration K holds the state after iterations 0..K-1:
//  - every embedding row with its optimizer state, in the servers' shards. The cut *drains*
//    the trainers' caches first: the oracle ends its planning window at K (no batch >= K is
//    planned before the cut), sends every trainer a kCheckpoint plan (the planner's Drain:
//    every dirty cached row is written back by exactly one owner, stamped K), and each server
//    writes its shard once every trainer's write-backs up to K are in. Training then goes on
//    with a fresh planner from batch K — exactly what a resumed job does — and the caches
//    refill. The alternative, saving each trainer's cache contents beside the servers' rows,
//    was rejected: replicas of shared rows would be saved several times and could differ while
//    background exchanges are in flight, a resume would have to merge the newest copy of every
//    row back into the shards (or rebuild the planner's residency, slot and stamp state
//    exactly), and the files would depend on the cache mode. Draining makes the checkpoint the
//    servers' rows only — the state every cache mode agrees on (docs/architecture.md, consistency
//    contract), so a job may even resume with another --cache — at the price of one cold cache
//    after each checkpoint (bench/RESULTS.md measures it).
//  - the dense parameters, the dense optimizer state and the loop's counters: the training
//    loop's LoopState (trainer_hooks/trainer.h), saved by trainer 0 (every trainer holds the
//    same replica) and restored on every trainer.
//  - the data stream position: batches and samples consumed, the epoch, a CRC32C of the last
//    batch consumed and one chained over every batch. A resumed job reads the stream again up
//    to K (so dictionary-encoded sources rebuild the same ids) and checks all five: a change
//    anywhere in the batches before K (say two lines swapped, which swaps the ids a dictionary
//    gives their values) is refused, not trained on with rows that now mean other values.
//  - RNGs: none carry state across iterations. Row initial values are a pure function of (seed,
//    row) (core/row_init.h), the synthetic source derives every sample from (seed, position),
//    the dense model draws its initial parameters once from the seed (then they are saved).
//  - the options that must match: `identity` (tables and their sizes, dim, optimizer and its
//    hyper-parameters, trainers, servers, seed, and whatever the caller adds: batch size, the
//    dense model...). A mismatch names the option and both values. Options that do not change
//    the training (the cache mode and size, lookahead, prefetch depth, --iterations) may differ.
//
// Files. DIR/ckpt-K/ holds MANIFEST (written last: a checkpoint without it does not exist),
// trainer.bin (the loop state, written by rank 0) and server-S-of-N.bin (one per server,
// written by that server: under mpirun each server rank writes its own shard, so DIR must be
// on a file system every server rank reaches, and rank 0 writes the manifest). Every file is a
// checksummed file (core/atomic_file.h: format version, CRC32C, written to a temporary name,
// fsynced, renamed); the manifest records every other file's size and CRC32C. Older
// checkpoints are removed only after a newer one is complete, down to the newest `keep`.
//
// A stop (SIGINT/SIGTERM, JobOptions::stop_requested, or a stop request from any rank) ends the
// planning window where it stands: the iterations already read into it run (at most the
// lookahead + the plan queue depth + 2), then the cut, the checkpoint (when a directory is set),
// and the job ends without evaluation.
//
// Thread-safety: functions are independent; a CheckpointCoordinator is used by the oracle
// thread only.
#ifndef BAGPIPE_TRAINER_HOOKS_CHECKPOINT_H_
#define BAGPIPE_TRAINER_HOOKS_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/atomic_file.h"
#include "core/dir_lock.h"
#include "core/types.h"
#include "data/batch.h"
#include "data/source.h"
#include "nlohmann/json.hpp"
#include "sync/roles.h"
#include "sync/transport.h"

namespace bagpipe {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

// What a job knows beyond its identity that decides whether a checkpoint's identity, written
// otherwise, names the same job (MatchIdentity). Rank 0's: nothing here is compared across ranks.
struct IdentityContext {
  // Samples in one epoch of the job's whole training source, before --max-samples, where known
  // without reading more than the job does (a binary file's header, a synthetic spec, a text
  // file the table-size scan read to its end), else -1. Its checkpoints record it; where a
  // checkpoint's is known too, --max-samples is compared by the samples an epoch holds (one at
  // or above the size selects every sample, as none does), and streams of other sizes under the
  // same --max-samples differ. (A synthetic `--data` in the identity gives its own size.)
  int64_t source_samples = -1;
  // Options that checkpoints recorded as given, "" for the default, where this job records the
  // value the default resolves to: that value, at the same place in the identity (e.g.
  // {"model": {"bottom": "13-64-16"}}). A checkpoint's "" there is compared as it.
  nlohmann::json defaults = nlohmann::json::object();
};

struct CheckpointOptions {
  // Where checkpoints go ("": none). Created if missing.
  std::string dir;
  // A checkpoint every this many iterations (at multiples of it); 0: only at the end of
  // training and at a stop. With a directory, the end of training always writes one.
  int64_t every = 0;
  // Complete checkpoints kept (the newest); 0 keeps all.
  int keep = 2;
  // "": a fresh start. Else a checkpoint (DIR/ckpt-K) or a directory of checkpoints (its
  // latest complete one) to resume from.
  std::string resume;
  // Options that must match on resume, name -> value (names as the command-line flags). The
  // job adds its own (CheckpointIdentity); the caller adds what only it knows.
  nlohmann::json identity = nlohmann::json::object();
  // How identities written otherwise are compared with this job's.
  IdentityContext identity_context;
};

// Where a job stands in its training stream.
struct StreamPosition {
  int64_t batches = 0;  // global batches consumed (= iterations)
  int64_t samples = 0;  // samples consumed
  int epoch = 0;
  uint32_t last_batch_crc32c = 0;  // of the last batch consumed (0: none)
  // Chained over every batch consumed: the CRC32C of their CRC32Cs in order (little-endian).
  uint32_t batches_crc32c = 0;
  bool operator==(const StreamPosition&) const = default;
};

// CRC32C of a batch's contents (labels, dense features, offsets, ids).
uint32_t BatchCrc32c(const Batch& batch);
// Counts a consumed batch in `position`: its samples and CRC32Cs (not `batches`, which the
// caller keeps).
void ConsumeBatch(const Batch& batch, StreamPosition* position);

struct CheckpointFile {
  std::string name;  // within the checkpoint's directory
  FileDigest digest;
};

struct CheckpointManifest {
  Iteration iteration = 0;
  nlohmann::json identity = nlohmann::json::object();
  StreamPosition stream;
  int64_t every = 0;  // the --checkpoint-every of the job that wrote it
  // The samples of one epoch of its job's whole training source, before --max-samples, where
  // that job knew it (IdentityContext::source_samples), else -1 (also: written before it was
  // recorded).
  int64_t source_samples = -1;
  // false: written before manifests recorded StreamPosition::batches_crc32c (a resume then
  // checks the last batch only).
  bool chained = true;
  std::vector<CheckpointFile> files;  // trainer.bin, then the servers' shards in server order
  const CheckpointFile* Find(std::string_view name) const;
};

inline constexpr char kManifestName[] = "MANIFEST";
// The lock a writing job holds on its checkpoint directory (core/dir_lock.h): a second job on
// the same directory is refused while the first runs.
inline constexpr char kCheckpointDirLock[] = ".bagpipe-checkpoints.lock";
inline constexpr char kLoopStateName[] = "trainer.bin";
// "ckpt-K".
std::string CheckpointName(Iteration iteration);
// "server-S-of-N.bin".
std::string ShardName(int server, int servers);

// The complete checkpoints (with a MANIFEST) in `dir`, by increasing iteration, as paths.
std::vector<std::pair<Iteration, std::string>> ListCheckpoints(const std::string& dir);
// --resume PATH: PATH itself when it holds a MANIFEST, else the latest complete checkpoint in
// it. NotFound names what is missing.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);
// The directory holding checkpoint `checkpoint` (DIR of DIR/ckpt-K, also given as DIR/ckpt-K/,
// DIR/ckpt-K/. or, resolved, a path ending in ".."); "." for a bare ckpt-K.
std::string CheckpointParent(const std::string& checkpoint);

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& checkpoint);
absl::Status WriteManifest(const std::string& checkpoint, const CheckpointManifest& manifest);

// The options a resumed job must share with the checkpoint: checks every key of either; the
// error names every option that differs with both values. `context` says which values written
// otherwise are the same (a default recorded as "", a --max-samples selecting as many samples an
// epoch: with `checkpoint_source_samples`, CheckpointManifest::source_samples, and the job's
// IdentityContext::source_samples both known, or a synthetic --data's size).
absl::Status MatchIdentity(const nlohmann::json& checkpoint, const nlohmann::json& job,
                           std::string_view checkpoint_path, const IdentityContext& context = {},
                           int64_t checkpoint_source_samples = -1);
// The identity of a `synthetic[:k=v,...]` stream: its parsed configuration (samples, rows,
// alpha, pooling, dense, drift, seed), so that specs naming the same stream in another key order
// or spelling (tables=N against rows=...) match, and a difference is named by its field. A spec
// that does not parse is kept as the string it is.
nlohmann::json SyntheticStreamIdentity(std::string_view data);
// The job's part of the identity: table sizes, dim, sparse optimizer, trainers, servers, seed.
nlohmann::json CheckpointIdentity(const JobLayout& layout, int dim, const nlohmann::json& optimizer,
                                  uint64_t seed, const std::vector<int64_t>& table_rows);

// Checks `dir` before a job writes checkpoints to it (creating it if missing): it must hold
// nothing but checkpoints of this job (same identity), and none at all unless the job resumes
// (from the checkpoint of iteration `resumed_from`; -1: a fresh start), then none newer than
// that one (another run's: the job's own would mix with them, and a later resume of the
// directory would go on with that run). A resuming job removes the incomplete checkpoints
// older than the newest complete one.
absl::Status PrepareCheckpointDir(const std::string& dir, const nlohmann::json& identity,
                                  Iteration resumed_from, const IdentityContext& context = {});
// Removes every complete checkpoint but the newest `keep` (0: keeps all) and every incomplete
// one older than `newest`. Each goes by its MANIFEST first, so a half-removed one does not
// exist.
absl::Status PruneCheckpoints(const std::string& dir, int keep, Iteration newest);

absl::StatusOr<FileDigest> WriteLoopStateFile(const std::string& path, std::string_view state);
// Verifies the file (and its size and CRC32C against the manifest's) and returns the state.
absl::StatusOr<std::string> ReadLoopStateFile(const std::string& path, const FileDigest& expected);

struct CheckpointStats {
  Iteration first_iteration = 0;  // where this job started (the resumed checkpoint's iteration)
  std::string resumed_from;
  int64_t written = 0;
  double seconds = 0;       // rank 0: from the cut's plans to the manifest, summed
  double max_seconds = 0;   // the slowest checkpoint
  uint64_t last_bytes = 0;  // size of the last checkpoint (all files)
  std::string last;         // its path
  nlohmann::json ToJson() const;
};

// Rank 0's side of checkpoints: resuming (the servers load their shards, the stream is read up
// to the checkpoint) and writing them (the servers write their shards, trainer 0 sends the
// loop state, the manifest goes last).
class CheckpointCoordinator {
 public:
  // `identity` is the complete identity of this job.
  CheckpointCoordinator(Transport& transport, const JobLayout& layout, CheckpointOptions options,
                        absl::Duration timeout);

  bool writes() const { return !options_.dir.empty(); }
  int64_t every() const { return options_.every; }
  Iteration last_written() const { return last_written_; }
  const CheckpointStats& stats() const { return stats_; }

  struct Start {
    Iteration iteration = 0;
    std::string loop_state;
    std::string loop_state_file;  // resuming: the file `loop_state` was read from
    StreamPosition stream;
  };
  // Before training: with options.resume, verifies the checkpoint, has every server load its
  // shard and reads `train` up to the checkpoint (checking the position); checks the checkpoint
  // directory. Nothing is written before this returns OK. `max_iterations` is the job's last
  // iteration (-1: none): a checkpoint past it is refused before anything is read (the job
  // would train nothing, and the stream would be read up to the checkpoint for nothing); one at
  // it starts a job with no iteration left (a finished job started again), with a warning.
  // `stop_requested` (may be empty; a signal's number or 0) is polled while the stream is read
  // up to the checkpoint: a stop there ends the job with a Cancelled error, nothing trained or
  // written.
  absl::StatusOr<Start> Begin(BatchStream& train, Iteration max_iterations = -1,
                              const std::function<int()>& stop_requested = nullptr);
  // After the kCheckpoint plans of `iteration` went to the trainers: collects trainer 0's loop
  // state and the servers' shards, writes trainer.bin and the manifest, prunes. Returns the
  // checkpoint's path.
  absl::StatusOr<std::string> Write(Iteration iteration, const StreamPosition& stream);

 private:
  Transport& transport_;
  const JobLayout layout_;
  const CheckpointOptions options_;
  const absl::Duration timeout_;
  Iteration last_written_ = 0;  // (the start: nothing new to save)
  CheckpointStats stats_;
  std::unique_ptr<DirLock> lock_;  // held from Begin while the job writes options_.dir
};

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_CHECKPOINT_H_
