// Crafted checkpoint files: a MANIFEST, a shard or a loop state whose checksum is valid (a
// CRC32C is no protection against a crafted file) but whose contents lie. Each is refused with
// an error naming the file and the field, never an exception, a huge allocation or a crash.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>

#include "core/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/loop_state.h"
#include "server/row_store.h"
#include "server/shard_file.h"
#include "trainer_hooks/checkpoint.h"

namespace bagpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/checkpoint_hostile_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string ManifestError(const std::string& dir, const std::string& json) {
  EXPECT_TRUE(
      WriteChecksummedFile(dir + "/MANIFEST", "BPCKMANI", kCheckpointFormatVersion, json).ok());
  const absl::StatusOr<CheckpointManifest> manifest = ReadManifest(dir);
  EXPECT_FALSE(manifest.ok()) << json;
  return manifest.ok() ? "" : std::string(manifest.status().message());
}

TEST(CheckpointHostileTest, ManifestFieldsAreTyped) {
  const std::string dir = TempPath("manifest");
  const std::string stream =
      R"("stream": {"batches": 5, "samples": 9, "epoch": 0, "last_batch_crc32c": 3})";
  const std::string files = R"("files": [{"name": "trainer.bin", "bytes": 10, "crc32c": 4}])";
  const std::string identity = R"("identity": {})";
  // The valid manifest first, so that each refusal below is about its one changed field.
  ASSERT_TRUE(
      WriteChecksummedFile(dir + "/MANIFEST", "BPCKMANI", kCheckpointFormatVersion,
                           "{\"iteration\": 5, " + identity + ", " + stream + ", " + files + "}")
          .ok());
  ASSERT_TRUE(ReadManifest(dir).ok());
  const std::string where = "checkpoint manifest '" + dir + "/MANIFEST': ";
  // A string, a float beyond any integer (an undefined cast before), a negative iteration.
  EXPECT_THAT(
      ManifestError(dir, "{\"iteration\": \"5\", " + identity + ", " + stream + ", " + files + "}"),
      HasSubstr(where + "\"iteration\" is a string, not an integer"));
  EXPECT_THAT(
      ManifestError(dir, "{\"iteration\": 1e300, " + identity + ", " + stream + ", " + files + "}"),
      HasSubstr(where + "\"iteration\" is a number, not an integer"));
  EXPECT_THAT(
      ManifestError(dir, "{\"iteration\": -1, " + identity + ", " + stream + ", " + files + "}"),
      HasSubstr(where + "\"iteration\" is -1, outside [0, "));
  EXPECT_THAT(ManifestError(dir, R"({"iteration": 5, "identity": {}, "stream": 7, )" + files + "}"),
              HasSubstr(where + "no \"stream\" object"));
  EXPECT_THAT(ManifestError(dir, "{\"iteration\": 5, " + identity + ", " + stream +
                                     R"(, "files": [{"name": 3, "bytes": 1, "crc32c": 1}]})"),
              HasSubstr(where + "\"name\" is a number, not a string"));
  EXPECT_THAT(
      ManifestError(dir, "{\"iteration\": 5, " + identity + ", " + stream +
                             R"(, "files": [{"name": "a", "bytes": 1, "crc32c": 4294967296}]})"),
      HasSubstr(where + "\"crc32c\" is 4294967296, outside [0, 4294967295]"));
  EXPECT_THAT(ManifestError(dir, "{\"iteration\": 5, " + stream + ", " + files + "}"),
              HasSubstr(where + "missing field \"identity\""));
  // Another count of batches than of iterations (one global batch each).
  EXPECT_THAT(ManifestError(dir, "{\"iteration\": 5, " + identity +
                                     R"(, "stream": {"batches": 4, "samples": 9, "epoch": 0, )"
                                     R"("last_batch_crc32c": 3}, )" +
                                     files + "}"),
              HasSubstr(where + "\"stream\" counts 4 batches for a checkpoint of iteration 5"));
  // More batches than samples: resuming would read a stream of several epochs for ever.
  EXPECT_THAT(
      ManifestError(dir, "{\"iteration\": 1000000000000000000, " + identity +
                             R"(, "stream": {"batches": 1000000000000000000, "samples": 512, )"
                             R"("epoch": 0, "last_batch_crc32c": 3}, )" +
                             files + "}"),
      HasSubstr(where + "\"stream\" counts 1000000000000000000 batches of 512 samples in all"));
  fs::remove_all(dir);
}

TEST(CheckpointHostileTest, IdentityMismatchEchoesShortEscapedValues) {
  const nlohmann::json job = {{"--dim", 8}};
  const nlohmann::json crafted = {{"--dim", std::string(100000, 'x') + "\xc3\xa9"},
                                  {std::string("bad\nkey\x01") + std::string(500, 'k'), 1}};
  const std::string message(MatchIdentity(crafted, job, "ck").message());
  // JSON with the é escaped (\u00e9), cut after 300 bytes.
  EXPECT_THAT(message, HasSubstr("option --dim is \"xxxx"));
  EXPECT_THAT(message, HasSubstr("... (100008 bytes) in the checkpoint and 8 here"));
  EXPECT_THAT(message, HasSubstr("option bad\\nkey\\x01kkk"));
  EXPECT_LT(message.size(), 1200u);
  for (const char c : message) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c);
}

// A shard payload as WriteShard lays it out: uint32 header length, header JSON, rows.
std::string ShardPayload(const std::string& header, const std::string& rows = "") {
  const uint32_t length = static_cast<uint32_t>(header.size());
  return std::string(reinterpret_cast<const char*>(&length), 4) + header + rows;
}

TEST(CheckpointHostileTest, ShardHeaderIsTypedAndItsRowCountCannotOverflow) {
  const std::string dir = TempPath("shard");
  const std::string path = dir + "/server-0-of-1.bin";
  RowStore store(RowInitializer(3, 4, 0, 0.0f, {100, 50}));  // 4 floats: 24-byte rows
  auto load = [&](const std::string& payload) {
    EXPECT_TRUE(WriteChecksummedFile(path, kShardMagic, kShardFormatVersion, payload).ok());
    return std::string(LoadShard(path, {0, 1, 9}, nullptr, &store).message());
  };
  const std::string fields = R"("server": 0, "servers": 1, "iteration": 9, "record_floats": 4)";
  EXPECT_THAT(load(ShardPayload("{" + fields + R"(, "rows": "many"})")),
              HasSubstr("checkpoint shard '" + path + "': header: \"rows\" is a string"));
  EXPECT_THAT(load(ShardPayload(R"({"server": [0], "servers": 1})")),
              HasSubstr("header: \"server\" is a array, not an integer"));
  // 2^61 rows of 24 bytes are 3 * 2^64 bytes: 0 in 64-bit arithmetic, the size of an empty
  // body. Unchecked, that passed the size check and reserved 2^61 rows.
  EXPECT_THAT(load(ShardPayload("{" + fields + R"(, "rows": 2305843009213693952})")),
              HasSubstr("0 bytes of rows for 2305843009213693952 rows of 24 bytes"));
  EXPECT_THAT(load(ShardPayload("{" + fields + R"(, "rows": -1})", std::string(24, '\0'))),
              HasSubstr("24 bytes of rows for -1 rows"));
  EXPECT_EQ(store.size(), 0);
  fs::remove_all(dir);
}

TEST(CheckpointHostileTest, LoopStateCountsAreCheckedBeforeAllocating) {
  DenseLoopState state;
  state.parameters = {1, 2, 3};
  state.optimizer_state = {4};
  state.global_samples = 99;
  const absl::StatusOr<DenseLoopState> back = DecodeDenseLoopState(EncodeDenseLoopState(state));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->parameters, state.parameters);
  EXPECT_EQ(back->optimizer_state, state.optimizer_state);
  EXPECT_EQ(back->global_samples, 99);
  EXPECT_FALSE(back->metrics_first_lines.has_value());
  for (const std::vector<int64_t>& lines :
       {std::vector<int64_t>(), std::vector<int64_t>{0, 4294967295}}) {
    state.metrics_first_lines = lines;
    const absl::StatusOr<DenseLoopState> with = DecodeDenseLoopState(EncodeDenseLoopState(state));
    ASSERT_TRUE(with.ok()) << with.status();
    EXPECT_EQ(with->metrics_first_lines, lines);
  }

  auto error = [](const std::string& bytes) {
    const absl::StatusOr<DenseLoopState> decoded = DecodeDenseLoopState(bytes);
    EXPECT_FALSE(decoded.ok()) << bytes;
    return decoded.ok() ? std::string() : std::string(decoded.status().message());
  };
  // 2^62 parameters were allocated before the size check (length_error, a crash).
  EXPECT_THAT(error(R"({"parameters": 4611686018427387904, "optimizer_state": 0, )"
                    R"("global_samples": 0})"
                    "\n1234"),
              HasSubstr("has the wrong size: 4 bytes after its header for 4611686018427387904 "
                        "parameters"));
  // Counts whose byte size wraps around to the body's.
  EXPECT_THAT(
      error(R"({"parameters": 4611686018427387904, "optimizer_state": 4611686018427387904, )"
            R"("global_samples": 0})"
            "\n"),
      HasSubstr("has the wrong size"));
  EXPECT_THAT(error(R"({"parameters": "3", "optimizer_state": 0, "global_samples": 0})"
                    "\n"),
              HasSubstr("the checkpoint's loop state header: \"parameters\" is a string"));
  EXPECT_THAT(error(R"({"parameters": 0, "optimizer_state": 0})"
                    "\n"),
              HasSubstr("missing field \"global_samples\""));
  EXPECT_THAT(error("no header line"), HasSubstr("has no header line"));
  EXPECT_THAT(error(R"({"parameters": 0, "optimizer_state": 0, "global_samples": 0, )"
                    R"("metrics_first_lines": [4294967296]})"
                    "\n"),
              HasSubstr("metrics_first_lines holds 4294967296, no CRC32C"));
  EXPECT_THAT(error(R"({"parameters": 0, "optimizer_state": 0, "global_samples": 0, )"
                    R"("metrics_first_lines": 7})"
                    "\n"),
              HasSubstr("metrics_first_lines is not a list"));
  EXPECT_THAT(error(R"({"parameters": 0, "optimizer_state": 0, "global_samples": 0, )"
                    R"("metrics_first_lines": ["7"]})"
                    "\n"),
              HasSubstr("is a string"));
  // A state saved after the training diverged: nothing trains on from it.
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    DenseLoopState diverged = state;
    diverged.parameters[1] = bad;
    EXPECT_THAT(CheckDenseLoopStateFinite(diverged).message(),
                HasSubstr("dense parameter 1 of 3 is"));
    EXPECT_THAT(error(EncodeDenseLoopState(diverged)),
                AllOf(HasSubstr("is not finite (dense parameter 1 of 3 is "),
                      HasSubstr("saved after the training diverged")));
    diverged = state;
    diverged.optimizer_state[0] = -bad;
    EXPECT_THAT(error(EncodeDenseLoopState(diverged)),
                HasSubstr("is not finite (dense optimizer value 0 of 1 is "));
  }
  EXPECT_TRUE(CheckDenseLoopStateFinite(state).ok());
  EXPECT_THAT(error("[1, 2]\n"), AllOf(HasSubstr("has no valid header"), Not(HasSubstr("["))));
}

}  // namespace
}  // namespace bagpipe
