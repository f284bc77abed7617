#include "server/shard_file.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checked_math.h"
#include "core/json_fields.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "sync/protocol.h"

namespace bagpipe {
namespace {

constexpr std::string_view kMagic(kShardMagic, 8);

}  // namespace

absl::StatusOr<FileDigest> WriteShard(const std::string& path, const RowStore& store,
                                      const ShardIdentity& identity) {
  ASSIGN_OR_RETURN(std::unique_ptr<ChecksummedFileWriter> writer,
                   ChecksummedFileWriter::Open(path, kMagic, kShardFormatVersion));
  const int rf = store.record_floats();
  const nlohmann::json header = {{"server", identity.server},
                                 {"servers", identity.servers},
                                 {"iteration", identity.iteration},
                                 {"record_floats", rf},
                                 {"rows", store.size()}};
  const std::string text = DumpJson(header);
  const uint32_t length = static_cast<uint32_t>(text.size());
  RETURN_IF_ERROR(writer->Append(&length, sizeof(length)));
  RETURN_IF_ERROR(writer->Append(text));
  // Rows go out in blocks (one Append per block keeps the per-row cost to a memcpy).
  const size_t row_bytes = sizeof(RowId) + static_cast<size_t>(rf) * sizeof(float);
  std::vector<char> block;
  block.reserve((size_t{1} << 20) + row_bytes);
  absl::Status status;
  store.ForEach([&](RowId row, const float* record) {
    if (!status.ok()) return;
    const size_t at = block.size();
    block.resize(at + row_bytes);
    std::memcpy(block.data() + at, &row, sizeof(row));
    std::memcpy(block.data() + at + sizeof(row), record, rf * sizeof(float));
    if (block.size() >= (size_t{1} << 20)) {
      status = writer->Append(block.data(), block.size());
      block.clear();
    }
  });
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(writer->Append(block.data(), block.size()));
  return writer->Commit();
}

absl::Status LoadShard(const std::string& path, const ShardIdentity& identity,
                       const FileDigest* expected, RowStore* store) {
  ASSIGN_OR_RETURN(ChecksummedFile file,
                   ChecksummedFile::Open(path, kMagic, kShardFormatVersion, "checkpoint shard"));
  if (expected != nullptr && !(file.digest() == *expected)) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint shard '%s' is not the one its manifest names: %d bytes with CRC32C %08x, "
        "the manifest says %d bytes with CRC32C %08x",
        path, file.digest().bytes, file.digest().crc32c, expected->bytes, expected->crc32c));
  }
  const std::string_view payload = file.payload();
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrFormat("checkpoint shard '%s': %s", path, why));
  };
  uint32_t length = 0;
  if (payload.size() < sizeof(length)) return damaged("no header");
  std::memcpy(&length, payload.data(), sizeof(length));
  if (payload.size() - sizeof(length) < length) return damaged("header longer than the file");
  const nlohmann::json header = ParseUntrustedJson(payload.substr(sizeof(length), length));
  if (header.is_discarded() || !header.is_object()) return damaged("malformed header");
  const int rf = store->record_floats();
  // Typed fields: a crafted header (its CRC32C recomputed) must not throw or overflow.
  auto field = [&](const char* key) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> value = JsonInt64(header, key);
    if (!value.ok()) return damaged(absl::StrCat("header: ", value.status().message()));
    return value;
  };
  ASSIGN_OR_RETURN(const int64_t server, field("server"));
  ASSIGN_OR_RETURN(const int64_t servers, field("servers"));
  ASSIGN_OR_RETURN(const int64_t iteration, field("iteration"));
  ASSIGN_OR_RETURN(const int64_t record_floats, field("record_floats"));
  ASSIGN_OR_RETURN(const int64_t rows, field("rows"));
  auto mismatch = [&](const std::string& field, int64_t theirs, int64_t ours) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint shard '%s' has %s %d, this job expects %d", path, field, theirs, ours));
  };
  if (server != identity.server) return mismatch("server", server, identity.server);
  if (servers != identity.servers) return mismatch("servers", servers, identity.servers);
  if (iteration != identity.iteration) {
    return mismatch("iteration", iteration, identity.iteration);
  }
  if (record_floats != rf) {
    return mismatch("record_floats (embedding dim + optimizer state)", record_floats, rf);
  }
  const int64_t row_bytes = static_cast<int64_t>(sizeof(RowId) + static_cast<size_t>(rf) * 4);
  const std::string_view body = payload.substr(sizeof(length) + length);
  const std::optional<int64_t> body_bytes = CheckedMul(rows, row_bytes);
  if (rows < 0 || !body_bytes.has_value() || static_cast<uint64_t>(*body_bytes) != body.size()) {
    return damaged(
        absl::StrFormat("%d bytes of rows for %d rows of %d bytes", body.size(), rows, row_bytes));
  }
  store->Reserve(store->size() + rows);
  std::vector<float> record(rf);
  for (int64_t k = 0; k < rows; ++k) {
    const char* at = body.data() + static_cast<size_t>(k) * row_bytes;
    RowId row;
    std::memcpy(&row, at, sizeof(row));
    std::memcpy(record.data(), at + sizeof(row), rf * sizeof(float));
    // Rows are hashed to servers: a row of another server's (a shard from a different layout,
    // or forged) would never be served or written back here.
    if (ServerOfRow(row, identity.servers) != identity.server) {
      return damaged(absl::StrFormat("row %d belongs to server %d, not %d", row,
                                     ServerOfRow(row, identity.servers), identity.server));
    }
    // Training stops at a non-finite value (it diverged): a shard holding one is damaged.
    for (int f = 0; f < rf; ++f) {
      if (!std::isfinite(record[static_cast<size_t>(f)])) {
        return damaged(absl::StrFormat("row %d holds a non-finite value (%f) at float %d", row,
                                       record[static_cast<size_t>(f)], f));
      }
    }
    if (!store->Insert(row, record.data())) {
      return damaged(absl::StrFormat("row %d appears twice", row));
    }
  }
  return absl::OkStatus();
}

}  // namespace bagpipe
