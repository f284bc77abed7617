// Fuzz harness: checkpoint files as `bagpipe train --resume` reads them — the MANIFEST
// (trainer_hooks/checkpoint.h), a server's shard (server/shard_file.h), the reference loop's
// state in trainer.bin (model/loop_state.h) — and the checksummed container around each
// (core/atomic_file.h). Input: one options byte, then a payload. Bits 0-1 pick the file
// (0: manifest, 1: shard, 2: loop state, 3: the container alone); unless bit 2 is set the
// payload is wrapped in a valid container (magic, format version, length, CRC32C), as a crafted
// file would be, so that the fuzzer reaches the parsers behind the checksum.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "model/loop_state.h"
#include "server/row_store.h"
#include "server/shard_file.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer_hooks/checkpoint.h"

namespace bagpipe {
namespace {

constexpr uint32_t kVersion = 1;  // kCheckpointFormatVersion and kShardFormatVersion

// The checksummed container's layout (core/atomic_file.h).
std::string Wrap(std::string_view magic, uint32_t version, std::string_view payload) {
  std::string file(magic);
  file.append(reinterpret_cast<const char*>(&version), 4);
  file.append(4, '\0');
  file.append(payload);
  const uint64_t length = payload.size();
  const uint32_t crc = Crc32c(file);
  file.append(reinterpret_cast<const char*>(&length), 8);
  file.append(reinterpret_cast<const char*>(&crc), 4);
  file.append("BPOK", 4);
  return file;
}

// One checkpoint directory for the whole run: its three files are links to one in-memory file
// that each input overwrites (no disk traffic per input).
struct Checkpoint {
  int fd = -1;
  std::string dir;
  Checkpoint() {
    fd = memfd_create("fuzz-checkpoint", MFD_CLOEXEC);
    if (fd < 0) FuzzFail("memfd_create failed");
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/checkpoint_fuzz.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) FuzzFail("mkdtemp failed");
    dir = pattern;
    const std::string target = absl::StrCat("/proc/self/fd/", fd);
    for (const std::string& name :
         {std::string(kManifestName), std::string(kLoopStateName), ShardName(0, 1)}) {
      std::filesystem::create_symlink(target, std::filesystem::path(dir) / name);
    }
  }
  void Set(const std::string& bytes) const {
    if (ftruncate(fd, 0) != 0 ||
        pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
      FuzzFail("writing the memfd failed");
    }
  }
  ~Checkpoint() {
    std::error_code error;
    std::filesystem::remove_all(dir, error);
    close(fd);
  }
  std::string Path(const std::string& name) const { return absl::StrCat(dir, "/", name); }
};

void Run(const uint8_t* data, size_t size) {
  static const Checkpoint checkpoint_files;
  const Checkpoint* const checkpoint = &checkpoint_files;
  if (size < 1) return;
  const uint8_t flags = data[0];
  const std::string_view payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int kind = flags & 3;
  static constexpr std::string_view kMagics[4] = {"BPCKMANI", "BPCKSHRD", "BPCKLOOP", "BPCKLOOP"};
  checkpoint->Set((flags & 4) != 0 ? std::string(payload) : Wrap(kMagics[kind], kVersion, payload));
  switch (kind) {
    case 0: {
      const absl::StatusOr<CheckpointManifest> manifest = ReadManifest(checkpoint->dir);
      if (!manifest.ok()) return CheckMessage(manifest.status(), checkpoint->dir);
      (void)manifest->Find(kLoopStateName);
      const nlohmann::json job = {{"--dim", 8}, {"--trainers", 2}, {"tables", {10, 20}}};
      CheckMessage(MatchIdentity(manifest->identity, job, "ck"), checkpoint->dir);
      if (!MatchIdentity(manifest->identity, manifest->identity, "ck").ok()) {
        FuzzFail("a manifest's identity does not match itself");
      }
      return;
    }
    case 1: {
      RowStore store(RowInitializer(1, 2, 1, 0.0f, {10, 20}));
      const std::string path = checkpoint->Path(ShardName(0, 1));
      const absl::Status status = LoadShard(path, {0, 1, 7}, nullptr, &store);
      if (!status.ok()) return CheckMessage(status, path);
      int64_t rows = 0;
      store.ForEach([&](RowId, const float*) { ++rows; });
      if (rows != store.size()) FuzzFail("a loaded shard's rows do not match its size");
      return;
    }
    default: {
      const std::string path = checkpoint->Path(kLoopStateName);
      const absl::StatusOr<ChecksummedFile> file =
          ChecksummedFile::Open(path, kMagics[kind], kVersion, "checkpoint loop state");
      if (!file.ok()) return CheckMessage(file.status(), path);
      const absl::StatusOr<std::string> state = ReadLoopStateFile(path, file->digest());
      if (!state.ok()) FuzzFail("ReadLoopStateFile refused what ChecksummedFile accepted");
      const absl::StatusOr<DenseLoopState> decoded = DecodeDenseLoopState(*state);
      if (!decoded.ok()) return CheckMessage(decoded.status(), path);
      const absl::StatusOr<DenseLoopState> again =
          DecodeDenseLoopState(EncodeDenseLoopState(*decoded));
      if (!again.ok() || again->global_samples != decoded->global_samples ||
          EncodeDenseLoopState(*again) != EncodeDenseLoopState(*decoded)) {
        FuzzFail("a decoded loop state does not survive re-encoding");
      }
      return;
    }
  }
}

}  // namespace
}  // namespace bagpipe

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bagpipe::Run(data, size);
  return 0;
}
