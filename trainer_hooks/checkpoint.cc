#include "trainer_hooks/checkpoint.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/crc32c.h"
#include "core/excerpt.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "core/tunables.h"
#include "data/csv_reader.h"
#include "data/synthetic.h"
#include "sync/protocol.h"

namespace bagpipe {
namespace {

namespace fs = std::filesystem;

constexpr char kManifestMagic[] = "BPCKMANI";
constexpr char kLoopStateMagic[] = "BPCKLOOP";
constexpr absl::string_view kCheckpointPrefix = "ckpt-";

// The iteration of a "ckpt-K" name, or -1.
Iteration ParseCheckpointName(absl::string_view name) {
  if (!absl::StartsWith(name, kCheckpointPrefix)) return -1;
  Iteration iteration = -1;
  const absl::string_view digits = name.substr(kCheckpointPrefix.size());
  if (digits.empty() || !absl::SimpleAtoi(digits, &iteration) || iteration < 0) return -1;
  return iteration;
}

bool IsTemporary(absl::string_view name) {
  return absl::StartsWith(name, ".") && absl::StrContains(name, ".tmp-");
}

// An identity value in a message: JSON with non-ASCII escaped, cut when long (a crafted
// manifest may hold anything).
std::string Show(const nlohmann::json& value) {
  if (value.is_null()) return "(not set)";
  std::string text = DumpJson(value, -1, /*ensure_ascii=*/true);
  constexpr size_t kMaxBytes = 300;
  if (text.size() > kMaxBytes) {
    text = absl::StrCat(text.substr(0, kMaxBytes), "... (", text.size(), " bytes)");
  }
  return text;
}

nlohmann::json StreamJson(const StreamPosition& s) {
  return {{"batches", s.batches},
          {"samples", s.samples},
          {"epoch", s.epoch},
          {"last_batch_crc32c", s.last_batch_crc32c},
          {"batches_crc32c", s.batches_crc32c}};
}

// Removes a checkpoint directory: its manifest first, so that it stops existing at once.
absl::Status RemoveCheckpoint(const std::string& path) {
  std::error_code error;
  // The job writes directories: a symbolic link in their place is removed, not followed (what
  // it points to is not this job's).
  if (fs::is_symlink(fs::symlink_status(path, error))) {
    fs::remove(path, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot remove the link '", path, "': ", error.message()));
    }
    return absl::OkStatus();
  }
  fs::remove(fs::path(path) / kManifestName, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove checkpoint '", path, "': ", error.message()));
  }
  fs::remove_all(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove checkpoint '", path, "': ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace

void ConsumeBatch(const Batch& batch, StreamPosition* position) {
  position->samples += batch.num_samples;
  const uint32_t crc = BatchCrc32c(batch);
  position->last_batch_crc32c = crc;
  const uint8_t bytes[4] = {static_cast<uint8_t>(crc), static_cast<uint8_t>(crc >> 8),
                            static_cast<uint8_t>(crc >> 16), static_cast<uint8_t>(crc >> 24)};
  position->batches_crc32c = ExtendCrc32c(position->batches_crc32c, bytes, sizeof(bytes));
}

uint32_t BatchCrc32c(const Batch& batch) {
  uint32_t crc = 0;
  crc = ExtendCrc32c(crc, batch.labels.data(), batch.labels.size() * sizeof(float));
  crc = ExtendCrc32c(crc, batch.dense.data(), batch.dense.size() * sizeof(float));
  crc = ExtendCrc32c(crc, batch.offsets.data(), batch.offsets.size() * sizeof(int64_t));
  crc = ExtendCrc32c(crc, batch.ids.data(), batch.ids.size() * sizeof(int64_t));
  return crc;
}

const CheckpointFile* CheckpointManifest::Find(std::string_view name) const {
  for (const CheckpointFile& file : files) {
    if (file.name == name) return &file;
  }
  return nullptr;
}

std::string CheckpointName(Iteration iteration) {
  return absl::StrCat(kCheckpointPrefix, iteration);
}

std::string ShardName(int server, int servers) {
  return absl::StrCat("server-", server, "-of-", servers, ".bin");
}

std::vector<std::pair<Iteration, std::string>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<Iteration, std::string>> list;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const Iteration iteration = ParseCheckpointName(entry.path().filename().string());
    if (iteration < 0 || !fs::exists(entry.path() / kManifestName, error)) continue;
    list.emplace_back(iteration, entry.path().string());
  }
  std::sort(list.begin(), list.end());
  return list;
}

std::string CheckpointParent(const std::string& checkpoint) {
  // Trailing separators and "." components name the checkpoint itself (DIR/ckpt-K/,
  // DIR/ckpt-K/.). Other ".." are left to the file system (DIR/link/../ckpt-K follows the
  // link); a path that ends in "." or ".." (`--resume .` inside the checkpoint) is resolved.
  std::string path = checkpoint;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    if (path.size() <= 2 || !path.ends_with("/.")) break;
    path.resize(path.size() - 2);
  }
  const std::string last = fs::path(path).filename().string();
  if (last == "." || last == "..") {
    std::error_code error;
    const fs::path resolved = fs::weakly_canonical(path, error);
    if (!error) path = resolved.string();
  }
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    return absl::NotFoundError(absl::StrCat(
        "--resume ", path, fs::exists(path, error) ? ": not a directory" : ": no such directory"));
  }
  if (fs::exists(fs::path(path) / kManifestName, error)) return path;
  const auto list = ListCheckpoints(path);
  if (list.empty()) {
    return absl::NotFoundError(absl::StrCat("--resume ", path,
                                            ": holds no complete checkpoint (a ckpt-K directory "
                                            "with a MANIFEST)"));
  }
  return list.back().second;
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& checkpoint) {
  ASSIGN_OR_RETURN(ChecksummedFile file,
                   ChecksummedFile::Open((fs::path(checkpoint) / kManifestName).string(),
                                         std::string_view(kManifestMagic, 8),
                                         kCheckpointFormatVersion, "checkpoint manifest"));
  bool too_deep = false;
  const nlohmann::json j = ParseUntrustedJson(file.payload(), &too_deep);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", file.path(), "': ", why));
  };
  if (too_deep) return bad(absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  // Typed fields: a crafted manifest (its CRC32C recomputed) must not throw or overflow a cast.
  auto integer = [&](const nlohmann::json& object, const char* key, int64_t min,
                     int64_t max) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> value = JsonInt64(object, key);
    if (!value.ok()) return bad(std::string(value.status().message()));
    if (*value < min || *value > max) {
      return bad(absl::StrFormat("\"%s\" is %d, outside [%d, %d]", key, *value, min, max));
    }
    return value;
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
  CheckpointManifest m;
  ASSIGN_OR_RETURN(m.iteration, integer(j, "iteration", 0, kMax));
  if (!j.contains("identity")) return bad("missing field \"identity\"");
  m.identity = j["identity"];
  if (!j.contains("stream") || !j["stream"].is_object()) return bad("no \"stream\" object");
  const nlohmann::json& s = j["stream"];
  ASSIGN_OR_RETURN(m.stream.batches, integer(s, "batches", 0, kMax));
  ASSIGN_OR_RETURN(m.stream.samples, integer(s, "samples", 0, kMax));
  ASSIGN_OR_RETURN(m.stream.epoch, integer(s, "epoch", 0, std::numeric_limits<int>::max()));
  ASSIGN_OR_RETURN(m.stream.last_batch_crc32c, integer(s, "last_batch_crc32c", 0, kMaxU32));
  m.chained = s.contains("batches_crc32c");
  if (m.chained) {
    ASSIGN_OR_RETURN(m.stream.batches_crc32c, integer(s, "batches_crc32c", 0, kMaxU32));
  }
  if (m.stream.batches != m.iteration) {
    return bad(
        absl::StrFormat("\"stream\" counts %d batches for a checkpoint of iteration %d "
                        "(one global batch an iteration)",
                        m.stream.batches, m.iteration));
  }
  if (m.stream.batches > m.stream.samples) {
    return bad(absl::StrFormat("\"stream\" counts %d batches of %d samples in all",
                               m.stream.batches, m.stream.samples));
  }
  if (j.contains("every")) {
    ASSIGN_OR_RETURN(m.every, integer(j, "every", 0, kMax));
  }
  if (j.contains("source_samples")) {
    ASSIGN_OR_RETURN(m.source_samples, integer(j, "source_samples", 0, kMax));
  }
  if (!j.contains("files") || !j["files"].is_array()) return bad("no \"files\" array");
  for (const nlohmann::json& f : j["files"]) {
    absl::StatusOr<std::string> name = JsonString(f, "name");
    if (!name.ok()) return bad(std::string(name.status().message()));
    ASSIGN_OR_RETURN(const int64_t bytes, integer(f, "bytes", 0, kMax));
    ASSIGN_OR_RETURN(const int64_t crc, integer(f, "crc32c", 0, kMaxU32));
    m.files.push_back(
        {*std::move(name), FileDigest{static_cast<uint64_t>(bytes), static_cast<uint32_t>(crc)}});
  }
  return m;
}

absl::Status WriteManifest(const std::string& checkpoint, const CheckpointManifest& m) {
  nlohmann::json files = nlohmann::json::array();
  for (const CheckpointFile& f : m.files) {
    files.push_back({{"name", f.name}, {"bytes", f.digest.bytes}, {"crc32c", f.digest.crc32c}});
  }
  nlohmann::json j = {{"format_version", kCheckpointFormatVersion},
                      {"iteration", m.iteration},
                      {"identity", m.identity},
                      {"stream", StreamJson(m.stream)},
                      {"every", m.every},
                      {"files", files}};
  if (m.source_samples >= 0) j["source_samples"] = m.source_samples;
  return WriteChecksummedFile((fs::path(checkpoint) / kManifestName).string(),
                              std::string_view(kManifestMagic, 8), kCheckpointFormatVersion,
                              DumpJson(j, 2))
      .status();
}

nlohmann::json SyntheticStreamIdentity(std::string_view data) {
  const nlohmann::json as_given = std::string(data);
  absl::string_view spec(data.data(), data.size());
  if (!absl::ConsumePrefix(&spec, "synthetic")) return as_given;
  if (!spec.empty() && !absl::ConsumePrefix(&spec, ":")) return as_given;
  const absl::StatusOr<SyntheticConfig> config = ParseSyntheticConfig(std::string(spec));
  if (!config.ok()) return as_given;
  return {{"samples", config->samples}, {"rows", config->table_rows},
          {"alpha", config->alpha},     {"pooling", {config->pooling_min, config->pooling_max}},
          {"dense", config->dense},     {"drift", config->drift},
          {"seed", config->seed}};
}

namespace {

// An SGD optimizer has no eps and no accumulators: what a job or an older checkpoint recorded
// for them (an ignored --eps, the defaults) is no difference.
void DropSgdOnlyFields(nlohmann::json* identity) {
  if (!identity->is_object()) return;
  for (const char* key : {"embedding optimizer", "dense optimizer"}) {
    if (!identity->contains(key)) continue;
    nlohmann::json& optimizer = (*identity)[key];
    if (!optimizer.is_object() || optimizer.value("kind", nlohmann::json()) != "sgd") continue;
    for (const char* field : {"eps", "initial_accumulator", "initial accumulator"}) {
      optimizer.erase(field);
    }
  }
}

// A checkpoint's "" where `defaults` names the value this job's default resolves to: that value
// (an older checkpoint recorded the option as given, "" where it was left to its default).
void ResolveDefaults(const nlohmann::json& defaults, nlohmann::json* checkpoint) {
  if (!defaults.is_object() || !checkpoint->is_object()) return;
  for (const auto& [key, value] : defaults.items()) {
    if (!checkpoint->contains(key)) continue;
    nlohmann::json& recorded = (*checkpoint)[key];
    if (value.is_object()) {
      ResolveDefaults(value, &recorded);
    } else if (recorded == "") {
      recorded = value;
    }
  }
}

// The samples an epoch of an identity's job trains on: its --max-samples within the stream's
// size (its synthetic --data's, else `source_samples`, the size its job knew), or -1 where that
// size is not known (or the identity records no --max-samples as a JSON integer).
int64_t EpochSamples(const nlohmann::json& identity, int64_t source_samples) {
  if (!identity.is_object() || !identity.contains("--max-samples")) return -1;
  const nlohmann::json& recorded = identity["--max-samples"];
  if (!recorded.is_number_integer()) return -1;
  const int64_t max_samples = recorded.get<int64_t>();
  int64_t size = source_samples;
  if (identity.contains("--data") && identity["--data"].is_object() &&
      identity["--data"].contains("samples") && identity["--data"]["samples"].is_number_integer()) {
    size = identity["--data"]["samples"].get<int64_t>();
  }
  if (size < 0) return -1;
  return max_samples < 0 ? size : std::min(max_samples, size);
}

}  // namespace

absl::Status MatchIdentity(const nlohmann::json& checkpoint_given, const nlohmann::json& job_given,
                           std::string_view checkpoint_view, const IdentityContext& context,
                           int64_t checkpoint_source_samples) {
  const std::string checkpoint_path(checkpoint_view);
  // Checkpoints written before the synthetic stream was recorded as parsed hold its spec.
  nlohmann::json checkpoint = checkpoint_given;
  if (checkpoint.is_object() && checkpoint.contains("--data") && checkpoint["--data"].is_string()) {
    checkpoint["--data"] = SyntheticStreamIdentity(checkpoint["--data"].get<std::string>());
  }
  // And a CSV --schema as written.
  if (checkpoint.is_object() && checkpoint.contains("--schema") &&
      checkpoint["--schema"].is_string()) {
    checkpoint["--schema"] = CanonicalCsvSpec(checkpoint["--schema"].get<std::string>());
  }
  nlohmann::json job = job_given;
  DropSgdOnlyFields(&checkpoint);
  DropSgdOnlyFields(&job);
  ResolveDefaults(context.defaults, &checkpoint);
  std::vector<std::string> differences;
  // Where both jobs' stream sizes are known, --max-samples is compared by the samples an epoch
  // holds: one at or above the size selects every sample, as none does. Otherwise (an older
  // checkpoint, text not read to its end) as recorded. A difference is named with the values as
  // recorded, and with the samples an epoch (the same --max-samples over data of other sizes
  // differs there only).
  const int64_t theirs = EpochSamples(checkpoint, checkpoint_source_samples);
  const int64_t ours = EpochSamples(job, context.source_samples);
  if (theirs >= 0 && ours >= 0) {
    if (theirs == ours) {
      checkpoint["--max-samples"] = job["--max-samples"];
    } else {
      differences.push_back(absl::StrFormat(
          "its job trained on %d samples an epoch and this one would train on %d", theirs, ours));
    }
  }
  // Said after the options: a --max-samples that may select the same samples in other words.
  const bool size_unrecorded = theirs < 0 && ours >= 0 && checkpoint.contains("--max-samples") &&
                               job.contains("--max-samples") &&
                               checkpoint["--max-samples"] != job["--max-samples"];
  std::vector<std::string> keys;
  for (const auto& [key, value] : checkpoint.items()) keys.push_back(key);
  for (const auto& [key, value] : job.items()) {
    if (!checkpoint.contains(key)) keys.push_back(key);
  }
  auto differ = [&](const std::string& name, const nlohmann::json& theirs,
                    const nlohmann::json& ours) {
    differences.push_back(absl::StrFormat("option %s is %s in the checkpoint and %s here", name,
                                          Show(theirs), Show(ours)));
  };
  for (const std::string& key : keys) {
    const nlohmann::json theirs = checkpoint.contains(key) ? checkpoint[key] : nlohmann::json();
    const nlohmann::json ours = job.contains(key) ? job[key] : nlohmann::json();
    if (theirs == ours) continue;
    if (!theirs.is_object() || !ours.is_object()) {
      differ(Excerpt(key, 60), theirs, ours);
      continue;
    }
    // An option made of fields (an optimizer: kind, lr, eps...): the fields that differ.
    std::vector<std::string> fields;
    for (const auto& [field, value] : theirs.items()) fields.push_back(field);
    for (const auto& [field, value] : ours.items()) {
      if (!theirs.contains(field)) fields.push_back(field);
    }
    for (const std::string& field : fields) {
      const nlohmann::json a = theirs.contains(field) ? theirs[field] : nlohmann::json();
      const nlohmann::json b = ours.contains(field) ? ours[field] : nlohmann::json();
      if (a != b) differ(absl::StrCat(Excerpt(key, 60), ": ", Excerpt(field, 60)), a, b);
    }
  }
  if (differences.empty()) return absl::OkStatus();
  if (size_unrecorded) {
    differences.push_back(
        "the checkpoint does not record how many samples its job's data held (written by an "
        "older build, or text whose scan stopped at --max-samples): give --max-samples as it "
        "recorded");
  }
  // A damaged or foreign manifest may differ in any number of keys: name the first ones, up to a
  // total length.
  constexpr size_t kShownBytes = 600;
  size_t shown = 0;
  for (size_t bytes = 0; shown < differences.size() && bytes < kShownBytes; ++shown) {
    bytes += differences[shown].size() + 2;
  }
  const size_t more = differences.size() - shown;
  differences.resize(shown);
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", checkpoint_path,
      " does not match this job: ", absl::StrJoin(differences, "; "),
      more > 0 ? absl::StrCat("; and ", more, " more") : "", " (they must be the same to resume)"));
}

nlohmann::json CheckpointIdentity(const JobLayout& layout, int dim, const nlohmann::json& optimizer,
                                  uint64_t seed, const std::vector<int64_t>& table_rows) {
  return {{"--trainers", layout.trainers},
          {"--servers", layout.servers},
          {"--dim", dim},
          {"--seed", seed},
          {"embedding optimizer", optimizer},
          {"table sizes", table_rows}};
}

absl::Status PrepareCheckpointDir(const std::string& dir, const nlohmann::json& identity,
                                  Iteration resumed_from, const IdentityContext& context) {
  const bool resuming = resumed_from >= 0;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-dir ", dir, ": cannot create: ", error.message()));
  }
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (IsTemporary(name) || name == kCheckpointDirLock) continue;
    if (ParseCheckpointName(name) < 0 || !entry.is_directory()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint-dir ", dir, " holds files that are not checkpoints of this job (e.g. '",
          name, "'); use an empty or new directory"));
    }
    if (!fs::exists(entry.path() / kManifestName, error)) continue;  // incomplete: not ours?
    auto manifest = ReadManifest(entry.path().string());
    if (!manifest.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--checkpoint-dir ", dir, " holds a checkpoint this job cannot read (",
                       manifest.status().message(), "); use another directory"));
    }
    absl::Status same = MatchIdentity(manifest->identity, identity, entry.path().string(), context,
                                      manifest->source_samples);
    if (!same.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint-dir ", dir, " holds another job's checkpoints: ", same.message(),
          "; use another directory"));
    }
    if (!resuming) {
      return absl::FailedPreconditionError(
          absl::StrCat("--checkpoint-dir ", dir, " already holds checkpoints of this job (", name,
                       "); continue it with --resume ", dir,
                       ", or use another directory (a new run never "
                       "overwrites checkpoints)"));
    }
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-dir ", dir, ": cannot list: ", error.message()));
  }
  // A resumed job clears what a killed one left: incomplete checkpoints older than the newest
  // complete one (a kill while one was written, or while retention removed one) can never be
  // resumed, and no later checkpoint of this job would replace them.
  if (resuming) {
    const auto complete = ListCheckpoints(dir);
    if (!complete.empty() && complete.back().first > resumed_from) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--checkpoint-dir ", dir, " holds ", fs::path(complete.back().second).filename().string(),
          ", newer than the checkpoint this job resumes from (", CheckpointName(resumed_from),
          "): they come from another run, and a later resume of the directory would go on with "
          "that run. Resume from the newest (--resume ",
          dir, "), remove the newer checkpoints, or write to another --checkpoint-dir"));
    }
    if (!complete.empty()) RETURN_IF_ERROR(PruneCheckpoints(dir, 0, complete.back().first));
  }
  return absl::OkStatus();
}

absl::Status PruneCheckpoints(const std::string& dir, int keep, Iteration newest) {
  std::error_code error;
  std::vector<std::pair<Iteration, std::string>> incomplete;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const Iteration iteration = ParseCheckpointName(entry.path().filename().string());
    if (iteration >= 0 && iteration < newest && !fs::exists(entry.path() / kManifestName, error)) {
      incomplete.emplace_back(iteration, entry.path().string());
    }
  }
  for (const auto& [iteration, path] : incomplete) RETURN_IF_ERROR(RemoveCheckpoint(path));
  if (keep > 0) {
    const auto complete = ListCheckpoints(dir);
    for (size_t k = 0; k + keep < complete.size(); ++k) {
      RETURN_IF_ERROR(RemoveCheckpoint(complete[k].second));
    }
  }
  return SyncDirectory(dir);
}

absl::StatusOr<FileDigest> WriteLoopStateFile(const std::string& path, std::string_view state) {
  return WriteChecksummedFile(path, std::string_view(kLoopStateMagic, 8), kCheckpointFormatVersion,
                              state);
}

absl::StatusOr<std::string> ReadLoopStateFile(const std::string& path, const FileDigest& expected) {
  ASSIGN_OR_RETURN(ChecksummedFile file,
                   ChecksummedFile::Open(path, std::string_view(kLoopStateMagic, 8),
                                         kCheckpointFormatVersion, "checkpoint loop state"));
  if (!(file.digest() == expected)) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint loop state '%s' is not the one its manifest names: %d bytes with CRC32C "
        "%08x, the manifest says %d bytes with CRC32C %08x",
        path, file.digest().bytes, file.digest().crc32c, expected.bytes, expected.crc32c));
  }
  return std::string(file.payload());
}

nlohmann::json CheckpointStats::ToJson() const {
  return {{"first_iteration", first_iteration},
          {"resumed_from", resumed_from},
          {"written", written},
          {"seconds", seconds},
          {"max_seconds", max_seconds},
          {"last_bytes", last_bytes},
          {"last", last}};
}

// --- rank 0 -------------------------------------------------------------------------------------

CheckpointCoordinator::CheckpointCoordinator(Transport& transport, const JobLayout& layout,
                                             CheckpointOptions options, absl::Duration timeout)
    : transport_(transport), layout_(layout), options_(std::move(options)), timeout_(timeout) {}

absl::StatusOr<CheckpointCoordinator::Start> CheckpointCoordinator::Begin(
    BatchStream& train, Iteration max_iterations, const std::function<int()>& stop_requested) {
  Start start;
  // A --resume path that names no directory (a typo) is refused before anything is created:
  // the directory it writes to defaults to it, and creating it would leave a stray directory
  // behind (in the checkpoint directory, one that later resumes refuse as foreign).
  if (!options_.resume.empty()) {
    std::error_code error;
    if (!fs::is_directory(options_.resume, error)) {
      return absl::NotFoundError(absl::StrCat(
          "--resume ", options_.resume,
          fs::exists(options_.resume, error) ? ": not a directory" : ": no such directory"));
    }
  }
  // A resume of another job is refused before anything is created (a new --checkpoint-dir, its
  // lock): the identity is read once here, read only; what cannot be read is reported below.
  if (!options_.resume.empty()) {
    absl::StatusOr<std::string> path = ResolveCheckpoint(options_.resume);
    absl::StatusOr<CheckpointManifest> manifest =
        path.ok() ? ReadManifest(*path) : absl::StatusOr<CheckpointManifest>(path.status());
    if (manifest.ok()) {
      RETURN_IF_ERROR(MatchIdentity(manifest->identity, options_.identity, *path,
                                    options_.identity_context, manifest->source_samples));
    }
  }
  // The directory is locked before anything in it is read or written: two jobs started on it
  // at once would otherwise both pass PrepareCheckpointDir and replace each other's checkpoints.
  if (writes()) {
    std::error_code error;
    fs::create_directories(options_.dir, error);  // an error is PrepareCheckpointDir's to report
    if (!error) {
      ASSIGN_OR_RETURN(lock_, DirLock::Acquire(options_.dir, kCheckpointDirLock,
                                               absl::StrCat("--checkpoint-dir ", options_.dir)));
      // Nor another job's run directory (its --out).
      RETURN_IF_ERROR(DirLock::CheckFree(options_.dir, ".bagpipe-run.lock",
                                         absl::StrCat("--checkpoint-dir ", options_.dir)));
    }
  }
  if (!options_.resume.empty()) {
    ASSIGN_OR_RETURN(const std::string path, ResolveCheckpoint(options_.resume));
    ASSIGN_OR_RETURN(const CheckpointManifest manifest, ReadManifest(path));
    RETURN_IF_ERROR(MatchIdentity(manifest.identity, options_.identity, path,
                                  options_.identity_context, manifest.source_samples));
    // The job names a checkpoint by its iteration: another name is a renamed or copied one.
    if (const Iteration named = ParseCheckpointName(fs::path(path).filename().string());
        named >= 0 && named != manifest.iteration) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint %s: its manifest says iteration %d, its name %s (renamed or copied over "
          "another checkpoint?)",
          path, manifest.iteration, CheckpointName(named)));
    }
    if (max_iterations >= 0 && manifest.iteration > max_iterations) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s is at iteration %d, past this job's last iteration %d (--iterations): "
          "raise --iterations above %d to train on from it",
          path, manifest.iteration, max_iterations, manifest.iteration));
    }
    if (manifest.iteration == max_iterations) {
      BAGPIPE_LOG(WARNING) << "checkpoint " << path << " is at iteration " << manifest.iteration
                           << ", this job's last (--iterations): no iteration is left to train";
    }
    // The directory it writes to, before anything is read (the stream's replay takes a while).
    if (writes()) {
      RETURN_IF_ERROR(PrepareCheckpointDir(options_.dir, options_.identity, manifest.iteration,
                                           options_.identity_context));
    }
    const CheckpointFile* loop = manifest.Find(kLoopStateName);
    if (loop == nullptr) {
      return absl::DataLossError(
          absl::StrCat("checkpoint manifest of ", path, " names no ", kLoopStateName));
    }
    start.loop_state_file = (fs::path(path) / kLoopStateName).string();
    ASSIGN_OR_RETURN(start.loop_state, ReadLoopStateFile(start.loop_state_file, loop->digest));
    // Every server loads (and verifies) its shard; the first failure aborts the job.
    for (int s = 0; s < layout_.servers; ++s) {
      const std::string name = ShardName(s, layout_.servers);
      const CheckpointFile* shard = manifest.Find(name);
      if (shard == nullptr) {
        return absl::DataLossError(
            absl::StrCat("checkpoint manifest of ", path, " names no ", name));
      }
      ShardRequest request;
      request.iteration = manifest.iteration;
      request.path = (fs::path(path) / name).string();
      request.bytes = shard->digest.bytes;
      request.crc32c = shard->digest.crc32c;
      RETURN_IF_ERROR(
          transport_.Send(layout_.server_rank(s), kTagControl,
                          EncodeControl(ControlKind::kRestore, EncodeShardRequest(request))));
    }
    // Meanwhile, the stream is read up to the checkpoint (dictionaries rebuild the same ids).
    BAGPIPE_LOG(INFO) << "resuming from " << path << ": reading the data up to iteration "
                      << manifest.iteration << " (" << manifest.stream.samples << " samples)";
    Batch batch;
    StreamPosition position;
    bool ended = false;
    // Bounded by the samples and epoch too: a stream of several epochs has no end, and a
    // manifest naming more batches than its samples allow would be read forever.
    while (position.batches < manifest.stream.batches &&
           position.samples < manifest.stream.samples && train.epoch() <= manifest.stream.epoch) {
      ASSIGN_OR_RETURN(const bool got, train.Next(&batch));
      if (!got) {
        ended = true;
        break;
      }
      ++position.batches;
      ConsumeBatch(batch, &position);
      if (stop_requested && position.batches % 64 == 0) {
        if (const int signal = stop_requested(); signal != 0) {
          return absl::CancelledError(
              absl::StrCat("stopped by ",
                           signal == SIGINT    ? "SIGINT"
                           : signal == SIGTERM ? "SIGTERM"
                           : signal == SIGUSR1 ? "SIGUSR1"
                                               : absl::StrCat("signal ", signal),
                           " while the data were read up to ", path, " (", position.batches, " of ",
                           manifest.stream.batches,
                           " batches): nothing was trained or written; resume with "
                           "--resume ",
                           options_.resume, " again"));
        }
      }
    }
    position.epoch = train.epoch();
    StreamPosition expected = manifest.stream;
    if (!manifest.chained) expected.batches_crc32c = position.batches_crc32c;  // not recorded
    if (ended && position.batches < expected.batches) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s is at iteration %d, past the end of this job's data: it ends after %d "
          "batches (%d samples, epoch %d) — raise --epochs or --max-samples to train on from "
          "the checkpoint, or this job's data differ (another dataset or --batch-size)",
          path, manifest.iteration, position.batches, position.samples, position.epoch));
    }
    if (!(position == expected)) {
      const bool before = position.batches == expected.batches &&
                          position.samples == expected.samples &&
                          position.epoch == expected.epoch &&
                          position.last_batch_crc32c == expected.last_batch_crc32c;
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint %s does not match this job's data: it was taken after %d batches (%d "
          "samples, epoch %d, CRC32C %08x of the last batch, %08x of all); this job's data "
          "gives %d batches (%d samples, epoch %d, CRC32C %08x, %08x) — %s",
          path, expected.batches, expected.samples, expected.epoch, expected.last_batch_crc32c,
          expected.batches_crc32c, position.batches, position.samples, position.epoch,
          position.last_batch_crc32c, position.batches_crc32c,
          before ? "the batches before the last one differ (lines changed or reordered: a "
                   "dictionary would give values other ids)"
                 : "a different dataset, order or --batch-size"));
    }
    for (int s = 0; s < layout_.servers; ++s) {
      ASSIGN_OR_RETURN(Message message,
                       transport_.Receive(layout_.server_rank(s), kTagControl, timeout_));
      ControlKind kind;
      Bytes body;
      RETURN_IF_ERROR(DecodeControl(message.payload, &kind, &body));
      if (kind != ControlKind::kShardDone) {
        return absl::DataLossError(absl::StrCat("expected server ", s, "'s shard to be loaded"));
      }
    }
    start.iteration = manifest.iteration;
    start.stream = position;
    stats_.first_iteration = start.iteration;
    stats_.resumed_from = path;
    last_written_ = start.iteration;
    BAGPIPE_LOG(INFO) << "resumed from " << path << " at iteration " << start.iteration;
  }
  if (writes() && options_.resume.empty()) {
    RETURN_IF_ERROR(
        PrepareCheckpointDir(options_.dir, options_.identity, -1, options_.identity_context));
  }
  return start;
}

absl::StatusOr<std::string> CheckpointCoordinator::Write(Iteration iteration,
                                                         const StreamPosition& stream) {
  Stopwatch watch;
  const std::string path = (fs::path(options_.dir) / CheckpointName(iteration)).string();
  std::error_code error;
  // A checkpoint of this iteration from an earlier run (complete or not) is replaced: it stops
  // existing before any of its files changes.
  if (fs::exists(path, error)) RETURN_IF_ERROR(RemoveCheckpoint(path));
  fs::create_directories(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint directory '", path, "': ", error.message()));
  }
  // A checkpoint that fails part-way (a full disk, a server gone) is removed: without its
  // manifest it is no checkpoint, and its files would only take the space.
  struct RemoveUnlessComplete {
    const std::string& path;
    bool complete = false;
    ~RemoveUnlessComplete() {
      if (!complete) (void)RemoveCheckpoint(path);
    }
  } incomplete{path};
  RETURN_IF_ERROR(SyncDirectory(options_.dir));
  for (int s = 0; s < layout_.servers; ++s) {
    ShardRequest request;
    request.iteration = iteration;
    request.path = (fs::path(path) / ShardName(s, layout_.servers)).string();
    RETURN_IF_ERROR(
        transport_.Send(layout_.server_rank(s), kTagControl,
                        EncodeControl(ControlKind::kCheckpoint, EncodeShardRequest(request))));
  }
  CheckpointManifest manifest;
  manifest.iteration = iteration;
  manifest.identity = options_.identity;
  manifest.stream = stream;
  manifest.every = options_.every;
  manifest.source_samples = options_.identity_context.source_samples;
  {
    ASSIGN_OR_RETURN(Message message,
                     transport_.Receive(layout_.trainer_rank(0), kTagCheckpoint, timeout_));
    WireReader r(message.payload, "trainer 0's loop state");
    Iteration theirs = -1;
    std::string state;
    RETURN_IF_ERROR(r.Get(&theirs));
    RETURN_IF_ERROR(r.GetString(&state));
    RETURN_IF_ERROR(r.ExpectDone());
    if (theirs != iteration) {
      return absl::InternalError(absl::StrCat("trainer 0 sent the loop state of iteration ", theirs,
                                              " for checkpoint ", iteration));
    }
    ASSIGN_OR_RETURN(const FileDigest digest,
                     WriteLoopStateFile((fs::path(path) / kLoopStateName).string(), state));
    manifest.files.push_back({kLoopStateName, digest});
  }
  for (int s = 0; s < layout_.servers; ++s) {
    ASSIGN_OR_RETURN(Message message,
                     transport_.Receive(layout_.server_rank(s), kTagControl, timeout_));
    ControlKind kind;
    Bytes body;
    RETURN_IF_ERROR(DecodeControl(message.payload, &kind, &body));
    if (kind != ControlKind::kShardDone) {
      return absl::DataLossError(absl::StrCat("expected server ", s, "'s checkpoint shard"));
    }
    ASSIGN_OR_RETURN(const ShardReply reply, DecodeShardReply(body));
    // Under mpirun the directory must be one file system for every rank that writes there: a
    // shard rank 0 does not see (another machine's local directory) would make the checkpoint
    // one that no resume can read.
    const fs::path shard = fs::path(path) / ShardName(s, layout_.servers);
    const uintmax_t seen = fs::file_size(shard, error);
    if (error || seen != reply.bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, ": server ", s, " wrote ", shard.string(), " (", reply.bytes,
          " bytes), which rank 0 ",
          error ? absl::StrCat("cannot see (", error.message(), ")")
                : absl::StrCat("sees with ", seen, " bytes"),
          ": --checkpoint-dir must be a directory every server rank and rank 0 share"));
    }
    manifest.files.push_back({shard.filename().string(), {reply.bytes, reply.crc32c}});
  }
  if (TestKillInCheckpoint() == iteration) {
    BAGPIPE_LOG(WARNING) << "BAGPIPE_TEST_KILL_IN_CHECKPOINT: killing rank 0 before the manifest "
                            "of checkpoint "
                         << iteration;
    ::raise(SIGKILL);
  }
  RETURN_IF_ERROR(WriteManifest(path, manifest));
  incomplete.complete = true;  // written: a later error leaves it to resume from
  RETURN_IF_ERROR(SyncDirectory(path));
  last_written_ = iteration;
  RETURN_IF_ERROR(PruneCheckpoints(options_.dir, options_.keep, iteration));
  const double seconds = watch.Seconds();
  uint64_t bytes = 0;
  for (const CheckpointFile& file : manifest.files) bytes += file.digest.bytes;
  ++stats_.written;
  stats_.seconds += seconds;
  stats_.max_seconds = std::max(stats_.max_seconds, seconds);
  stats_.last_bytes = bytes;
  stats_.last = path;
  BAGPIPE_LOG(INFO) << absl::StrFormat("checkpoint %s: %.1f MB in %.2f s", path, bytes / 1e6,
                                       seconds);
  return path;
}

}  // namespace bagpipe
