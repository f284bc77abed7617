#include "data/binary_format.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/timer.h"
#include "xxhash.h"

namespace bagpipe {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the binary format is little-endian and read by mapping it");

constexpr char kMagic[8] = {'B', 'A', 'G', 'P', 'I', 'P', 'E', '1'};
constexpr uint32_t kVersion = 1;
// Fixed prefix: magic, uint32 version, uint32 reserved (0), uint64 header JSON length.
constexpr size_t kPrefixBytes = 24;
constexpr int64_t kReadBlock = 1 << 16;

int64_t Align8(int64_t n) { return (n + 7) & ~int64_t{7}; }

std::string ErrnoText() { return std::strerror(errno); }

// An append-only file with a running byte count.
class OutFile {
 public:
  ~OutFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  absl::Status Open(const std::string& path) {
    path_ = path;
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("cannot create '", path, "': ", ErrnoText()));
    }
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
      return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", ErrnoText()));
    }
    size_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  absl::Status Close() {
    const bool flushed = std::fflush(file_) == 0 && fsync(fileno(file_)) == 0;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!flushed || !closed) {
      return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", ErrnoText()));
    }
    return absl::OkStatus();
  }
  // Replaces bytes already written at `offset` (the size is unchanged).
  absl::Status Overwrite(int64_t offset, const std::string& bytes) {
    if (std::fflush(file_) != 0 || std::fseek(file_, offset, SEEK_SET) != 0 ||
        std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size() ||
        std::fseek(file_, 0, SEEK_END) != 0) {
      return absl::DataLossError(absl::StrCat("cannot write '", path_, "': ", ErrnoText()));
    }
    return absl::OkStatus();
  }
  int64_t size() const { return size_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t size_ = 0;
};

// Removes the listed files when it goes out of scope (spill files, a failed output).
class FileCleanup {
 public:
  ~FileCleanup() {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }
  void Add(std::string path) { paths_.push_back(std::move(path)); }
  void Release(const std::string& path) { std::erase(paths_, path); }

 private:
  std::vector<std::string> paths_;
};

struct TableSection {
  int64_t offsets = 0;  // body offset of int64[n + 1]
  int64_t ids = 0;      // body offset of the ids
  int id_bytes = 8;     // 4 (uint32) or 8 (int64)
};

class BinarySource final : public SampleSource {
 public:
  BinarySource(std::string path, const SourceOptions& options)
      : path_(std::move(path)), options_(options) {}
  ~BinarySource() override {
    if (map_ != nullptr) munmap(map_, size_);
  }

  absl::Status Init() {
    const int fd = open(path_.c_str(), O_RDONLY);
    if (fd < 0) {
      const std::string message = absl::StrCat("bin: cannot open '", path_, "': ", ErrnoText());
      if (errno == ENOENT) return absl::NotFoundError(message);
      return absl::InvalidArgumentError(message);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      return absl::DataLossError(absl::StrCat("bin: cannot stat '", path_, "': ", ErrnoText()));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ < kPrefixBytes) {
      close(fd);
      return absl::DataLossError(absl::StrCat("bin: '", path_, "' is truncated: ", size_,
                                              " bytes, shorter than the ", kPrefixBytes,
                                              "-byte header"));
    }
    map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      return absl::DataLossError(absl::StrCat("bin: cannot map '", path_, "': ", ErrnoText()));
    }
    const char* data = static_cast<const char*>(map_);
    if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bin: '", path_, "' is not a Bagpipe binary dataset (bad magic; expected \"BAGPIPE1\")"));
    }
    uint32_t version = 0;
    uint64_t header_bytes = 0;
    std::memcpy(&version, data + 8, 4);
    std::memcpy(&header_bytes, data + 16, 8);
    if (version != kVersion) {
      return absl::InvalidArgumentError(absl::StrCat("bin: '", path_, "' has format version ",
                                                     version, "; this build reads version ",
                                                     kVersion));
    }
    if (header_bytes > size_ - kPrefixBytes) {
      return absl::DataLossError(absl::StrCat("bin: '", path_, "' is truncated inside its header (",
                                              header_bytes, " header bytes announced, ", size_,
                                              " bytes in the file)"));
    }
    const nlohmann::json header =
        nlohmann::json::parse(data + kPrefixBytes, data + kPrefixBytes + header_bytes, nullptr,
                              /*allow_exceptions=*/false);
    if (header.is_discarded() || !header.is_object()) {
      return absl::DataLossError(absl::StrCat("bin: '", path_, "' has a corrupt header"));
    }
    int64_t body_bytes = 0;
    uint64_t checksum = 0;
    try {
      ASSIGN_OR_RETURN(schema_, Schema::FromJson(header.at("schema")));
      samples_ = header.at("samples").get<int64_t>();
      body_bytes = header.at("body_bytes").get<int64_t>();
      const std::string hex = header.at("checksum").get<std::string>();
      if (hex.size() != 16 || !absl::SimpleHexAtoi(hex, &checksum)) {
        return absl::DataLossError(
            absl::StrCat("bin: '", path_, "' has a corrupt header: bad checksum '", hex, "'"));
      }
      labels_ = header.at("labels").get<int64_t>();
      dense_ = header.at("dense").get<int64_t>();
      for (const nlohmann::json& table : header.at("tables")) {
        tables_.push_back({table.at("offsets").get<int64_t>(), table.at("ids").get<int64_t>(),
                           table.at("id_bytes").get<int>()});
      }
      source_ = header.value("source", "");
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(
          absl::StrCat("bin: '", path_, "' has a corrupt header: ", e.what()));
    }
    body_offset_ = Align8(static_cast<int64_t>(kPrefixBytes + header_bytes));
    const int64_t have = static_cast<int64_t>(size_) - body_offset_;
    if (have != body_bytes) {
      return absl::DataLossError(absl::StrCat(
          "bin: '", path_, "' is ", have < body_bytes ? "truncated" : "longer than its header says",
          ": the header announces ", body_bytes, " body bytes, the file holds ",
          std::max<int64_t>(have, 0)));
    }
    const uint64_t actual = XXH3_64bits(data + body_offset_, static_cast<size_t>(body_bytes));
    if (actual != checksum) {
      return absl::DataLossError(absl::StrCat("bin: '", path_,
                                              "' is corrupt: body checksum mismatch (XXH3-64 ",
                                              absl::StrFormat("%016x", actual), ", header says ",
                                              absl::StrFormat("%016x", checksum), ")"));
    }
    // Section bounds, so that a consistent but wrong header cannot make Read run off the map.
    const int64_t n = samples_;
    auto check = [&](int64_t offset, int64_t bytes, const std::string& what) -> absl::Status {
      if (n < 0 || offset < 0 || bytes < 0 || offset % 8 != 0 || offset + bytes > body_bytes) {
        return absl::DataLossError(
            absl::StrCat("bin: '", path_, "' has an out-of-bounds ", what, " section"));
      }
      return absl::OkStatus();
    };
    if (static_cast<int>(tables_.size()) != schema_.num_tables()) {
      return absl::DataLossError(absl::StrCat("bin: '", path_, "' describes ", tables_.size(),
                                              " table sections for ", schema_.num_tables(),
                                              " tables"));
    }
    RETURN_IF_ERROR(check(labels_, n * 4, "labels"));
    RETURN_IF_ERROR(check(dense_, n * 4 * schema_.num_dense(), "dense"));
    for (int t = 0; t < schema_.num_tables(); ++t) {
      const TableSection& table = tables_[t];
      const std::string name = absl::StrCat("table ", schema_.table_names[t]);
      RETURN_IF_ERROR(check(table.offsets, (n + 1) * 8, name + " offsets"));
      if (table.id_bytes != 4 && table.id_bytes != 8) {
        return absl::DataLossError(absl::StrCat("bin: '", path_, "': ", name, " has ",
                                                table.id_bytes, "-byte ids (expected 4 or 8)"));
      }
      const int64_t* offsets = Offsets(t);
      if (offsets[0] != 0 || offsets[n] < 0) {
        return absl::DataLossError(absl::StrCat("bin: '", path_, "': bad ", name, " offsets"));
      }
      RETURN_IF_ERROR(check(table.ids, offsets[n] * table.id_bytes, name + " ids"));
    }
    per_epoch_ = options_.max_samples >= 0 ? std::min(samples_, options_.max_samples) : samples_;
    return absl::OkStatus();
  }

  const Schema& schema() const override { return schema_; }

  absl::StatusOr<int64_t> Read(int64_t max_samples, Batch* batch) override {
    const int tables = schema_.num_tables();
    const int dense = schema_.num_dense();
    batch->Reset(dense, tables);
    batch->first_sample = stream_offset_ + position_;
    const int64_t count = std::min(
        {max_samples, per_epoch_ - position_, int64_t{std::numeric_limits<int32_t>::max()}});
    if (count <= 0) return 0;
    const int32_t n = static_cast<int32_t>(count);
    const int64_t begin = position_;
    const char* body = Body();
    batch->num_samples = n;
    batch->labels.resize(n);
    std::memcpy(batch->labels.data(), body + labels_ + begin * 4, static_cast<size_t>(n) * 4);
    batch->dense.resize(static_cast<size_t>(n) * dense);
    std::memcpy(batch->dense.data(), body + dense_ + begin * 4 * dense,
                static_cast<size_t>(n) * 4 * dense);
    batch->offsets.resize(static_cast<size_t>(tables) * n + 1);
    batch->offsets[0] = 0;
    for (int t = 0; t < tables; ++t) {
      const int64_t* offsets = Offsets(t);
      const int64_t first = offsets[begin];
      const int64_t base = static_cast<int64_t>(batch->ids.size());
      const int64_t last = offsets[begin + n];
      if (last < first) {
        return absl::DataLossError(absl::StrCat("bin: '", path_, "': decreasing offsets in table ",
                                                schema_.table_names[t]));
      }
      for (int32_t s = 0; s < n; ++s) {
        batch->offsets[static_cast<size_t>(t) * n + s + 1] = base + offsets[begin + s + 1] - first;
      }
      batch->ids.resize(static_cast<size_t>(base + last - first));
      int64_t* out = batch->ids.data() + base;
      if (tables_[t].id_bytes == 8) {
        std::memcpy(out, body + tables_[t].ids + first * 8, static_cast<size_t>(last - first) * 8);
      } else {
        const char* in = body + tables_[t].ids + first * 4;
        for (int64_t k = 0; k < last - first; ++k) {
          uint32_t id;
          std::memcpy(&id, in + k * 4, 4);
          out[k] = id;
        }
      }
    }
    position_ += count;
    stats_.samples += count;
    stats_.bytes += count * 4 * (1 + dense);
    return count;
  }

  absl::Status Rewind() override {
    stream_offset_ += position_;
    position_ = 0;
    return absl::OkStatus();
  }

  SourceStats stats() const override { return stats_; }

  std::string Describe() const override {
    return absl::StrCat("bin:", path_, " (", samples_, " samples",
                        source_.empty() ? "" : absl::StrCat(", from ", source_), ")");
  }

 private:
  const char* Body() const { return static_cast<const char*>(map_) + body_offset_; }
  const int64_t* Offsets(int t) const {
    return reinterpret_cast<const int64_t*>(Body() + tables_[t].offsets);
  }

  const std::string path_;
  const SourceOptions options_;
  void* map_ = nullptr;
  size_t size_ = 0;
  int64_t body_offset_ = 0;
  Schema schema_;
  std::string source_;
  int64_t samples_ = 0;
  int64_t labels_ = 0;
  int64_t dense_ = 0;
  std::vector<TableSection> tables_;
  int64_t per_epoch_ = 0;
  int64_t position_ = 0;
  int64_t stream_offset_ = 0;
  SourceStats stats_;
};

// Copies the spill file `path` onto `out`, feeding the checksum; with `narrow` the file holds
// int64 ids that are written as uint32.
absl::Status AppendFile(const std::string& path, bool narrow, OutFile& out, XXH3_state_t* state) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) {
    return absl::DataLossError(absl::StrCat("cannot reopen '", path, "': ", ErrnoText()));
  }
  std::vector<int64_t> buffer(size_t{1} << 19);
  std::vector<uint32_t> small(narrow ? buffer.size() : 0);
  absl::Status status;
  while (status.ok()) {
    const size_t read = std::fread(buffer.data(), 1, buffer.size() * 8, in);
    if (read == 0) {
      if (std::ferror(in)) {
        status = absl::DataLossError(absl::StrCat("cannot read '", path, "': ", ErrnoText()));
      }
      break;
    }
    const void* data = buffer.data();
    size_t bytes = read;
    if (narrow) {
      for (size_t k = 0; k < read / 8; ++k) small[k] = static_cast<uint32_t>(buffer[k]);
      data = small.data();
      bytes = read / 2;
    }
    XXH3_64bits_update(state, data, bytes);
    status = out.Write(data, bytes);
  }
  std::fclose(in);
  return status;
}

absl::Status Pad8(OutFile& out, XXH3_state_t* state) {
  static const char kZeros[8] = {};
  const size_t pad = static_cast<size_t>(Align8(out.size()) - out.size());
  if (state != nullptr) XXH3_64bits_update(state, kZeros, pad);
  return out.Write(kZeros, pad);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SampleSource>> OpenBinary(const std::string& path,
                                                         const SourceOptions& options) {
  auto source = std::make_unique<BinarySource>(path, options);
  RETURN_IF_ERROR(source->Init());
  return std::unique_ptr<SampleSource>(std::move(source));
}

absl::StatusOr<ConvertStats> WriteBinary(SampleSource& source, const std::string& path) {
  Stopwatch watch;
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  FileCleanup cleanup;
  const int tables = source.schema().num_tables();
  const int dense = source.schema().num_dense();
  // Sections are spilled to one file each while the source streams (their sizes are unknown
  // until the end), then concatenated behind the header.
  const int sections = 2 + 2 * tables;
  std::vector<OutFile> spills(sections);
  std::vector<std::string> spill_paths(sections);
  for (int i = 0; i < sections; ++i) {
    spill_paths[i] = absl::StrCat(temp, ".section", i);
    cleanup.Add(spill_paths[i]);
    RETURN_IF_ERROR(spills[i].Open(spill_paths[i]));
  }
  const int64_t zero = 0;
  for (int t = 0; t < tables; ++t) RETURN_IF_ERROR(spills[2 + 2 * t].Write(&zero, 8));
  std::vector<int64_t> table_ids(tables, 0);
  std::vector<int64_t> scratch;
  Batch batch;
  int64_t samples = 0;
  while (true) {
    ASSIGN_OR_RETURN(const int64_t read, source.Read(kReadBlock, &batch));
    if (read == 0) break;
    if (batch.num_dense != dense || batch.num_tables != tables) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.Describe(), " returned a batch of another shape"));
    }
    RETURN_IF_ERROR(spills[0].Write(batch.labels.data(), batch.labels.size() * 4));
    RETURN_IF_ERROR(spills[1].Write(batch.dense.data(), batch.dense.size() * 4));
    for (int t = 0; t < tables; ++t) {
      scratch.resize(batch.num_samples);
      const int64_t base = table_ids[t] - batch.table_begin(t);
      for (int32_t s = 0; s < batch.num_samples; ++s) scratch[s] = base + batch.bag_end(t, s);
      RETURN_IF_ERROR(spills[2 + 2 * t].Write(scratch.data(), scratch.size() * 8));
      const int64_t begin = batch.table_begin(t);
      const int64_t end = batch.bag_end(t, batch.num_samples - 1);
      RETURN_IF_ERROR(spills[3 + 2 * t].Write(batch.ids.data() + begin, (end - begin) * 8));
      table_ids[t] += end - begin;
    }
    samples += read;
  }
  for (OutFile& spill : spills) RETURN_IF_ERROR(spill.Close());

  // Final table sizes decide the id width: int64 spills of small tables are narrowed.
  const Schema schema = source.schema();
  std::vector<int> id_bytes(tables, 8);
  for (int t = 0; t < tables; ++t) {
    if (schema.table_rows[t] <= (int64_t{1} << 32)) id_bytes[t] = 4;
  }

  // Section offsets within the body, each 8-byte aligned.
  nlohmann::json header;
  header["schema"] = schema.ToJson();
  header["samples"] = samples;
  header["source"] = source.Describe();
  int64_t offset = 0;
  auto place = [&](int64_t bytes) {
    const int64_t at = offset;
    offset = Align8(offset + bytes);
    return at;
  };
  header["labels"] = place(samples * 4);
  header["dense"] = place(samples * 4 * dense);
  header["tables"] = nlohmann::json::array();
  for (int t = 0; t < tables; ++t) {
    const int64_t offsets_at = place((samples + 1) * 8);
    const int64_t ids_at = place(table_ids[t] * id_bytes[t]);
    header["tables"].push_back(
        {{"offsets", offsets_at}, {"ids", ids_at}, {"id_bytes", id_bytes[t]}});
  }
  header["body_bytes"] = offset;

  // The checksum is known only after the body is written: the header holds it as 16 hex
  // digits, written as a placeholder and overwritten in place at the end.
  header["checksum"] = std::string(16, '0');
  const std::string header_text = header.dump();
  const std::string placeholder = "\"checksum\":\"0000000000000000\"";
  const size_t checksum_at = header_text.find(placeholder) + placeholder.size() - 17;
  OutFile out;
  cleanup.Add(temp);
  RETURN_IF_ERROR(out.Open(temp));
  char prefix[kPrefixBytes] = {};
  std::memcpy(prefix, kMagic, 8);
  std::memcpy(prefix + 8, &kVersion, 4);
  const uint64_t header_bytes = header_text.size();
  std::memcpy(prefix + 16, &header_bytes, 8);
  RETURN_IF_ERROR(out.Write(prefix, kPrefixBytes));
  RETURN_IF_ERROR(out.Write(header_text.data(), header_text.size()));
  RETURN_IF_ERROR(Pad8(out, nullptr));
  const int64_t body_start = out.size();
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  absl::Status status;
  for (int i = 0; i < sections && status.ok(); ++i) {
    const bool narrow = i >= 2 && i % 2 == 1 && id_bytes[(i - 3) / 2] == 4;
    status = AppendFile(spill_paths[i], narrow, out, state);
    if (status.ok()) status = Pad8(out, state);
  }
  const uint64_t checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  RETURN_IF_ERROR(status);
  if (out.size() - body_start != offset) {
    return absl::InternalError(
        absl::StrCat("binary body is ", out.size() - body_start, " bytes, expected ", offset));
  }
  RETURN_IF_ERROR(out.Overwrite(static_cast<int64_t>(kPrefixBytes + checksum_at),
                                absl::StrFormat("%016x", checksum)));
  RETURN_IF_ERROR(out.Close());
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::DataLossError(
        absl::StrCat("cannot rename '", temp, "' to '", path, "': ", ErrnoText()));
  }
  cleanup.Release(temp);
  ConvertStats stats;
  stats.samples = samples;
  stats.bytes_written = out.size();
  stats.seconds = watch.Seconds();
  return stats;
}

}  // namespace bagpipe
