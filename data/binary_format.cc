#include "data/binary_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/atomic_file.h"
#include "core/checked_math.h"
#include "core/excerpt.h"
#include "core/file_read.h"
#include "core/json_fields.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "xxhash.h"

namespace bagpipe {
namespace {

static_assert(std::endian::native == std::endian::little, "the binary format is little-endian");

constexpr char kMagic[8] = {'B', 'A', 'G', 'P', 'I', 'P', 'E', '1'};
constexpr uint32_t kVersion = 3;
// Version 2 prefix: magic, uint32 version, uint32 reserved (0), uint64 header JSON length,
// uint64 body length, uint64 body checksum, uint64 header checksum.
constexpr int64_t kPrefixBytes = 48;
// The header checksum covers the prefix up to itself, then the header JSON.
constexpr int64_t kHeaderChecksumAt = 40;
// Version 1 prefix: magic, uint32 version, uint32 reserved, uint64 header JSON length.
constexpr int64_t kPrefixBytesV1 = 24;
// A header lists names and section offsets: far below this even for thousands of tables. A
// larger length is damage, and must not become an allocation.
constexpr int64_t kMaxHeaderBytes = int64_t{64} << 20;
constexpr int64_t kReadBlock = 1 << 16;
constexpr size_t kCopyBlock = size_t{4} << 20;
// Reads hashed at open: small enough that the copy is still in the L2 cache when hashed.
constexpr size_t kHashBlock = size_t{256} << 10;

int64_t Align8(int64_t n) { return (n + 7) & ~int64_t{7}; }

std::string ErrnoText(int error) { return std::strerror(error); }

// Reads exactly `bytes` bytes at `offset` of `fd`. A short read means the file ended early:
// it was truncated, or shrank after it was opened.
absl::Status ReadAt(int fd, int64_t offset, void* out, size_t bytes, const std::string& path,
                    const char* what) {
  return PreadExactly(fd, offset, out, bytes, path, what, "bin: ");
}

// Writes exactly `bytes` bytes at `offset` of `fd`.
absl::Status WriteAt(int fd, int64_t offset, const void* data, size_t bytes,
                     const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = pwrite(fd, p, bytes, offset);
    if (put < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat("cannot write ", what, ": ", ErrnoText(errno)));
    }
    p += put;
    offset += put;
    bytes -= static_cast<size_t>(put);
  }
  return absl::OkStatus();
}

// XXH3-64 fed in pieces.
class Xxh3 {
 public:
  Xxh3() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~Xxh3() { XXH3_freeState(state_); }
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void Update(const void* data, size_t bytes) { XXH3_64bits_update(state_, data, bytes); }
  uint64_t Digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

// A file descriptor closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Writing.

// The directory a new file at `path` goes to.
std::string DirectoryOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// An unnamed file in `dir` that disappears with the process: O_TMPFILE, or where the file system
// lacks it, a named file unlinked right after it is created.
absl::StatusOr<Fd> CreateUnnamedFile(const std::string& dir) {
  const int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
  if (fd >= 0) return Fd(fd);
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a temporary file in '", dir, "': ", ErrnoText(errno)));
  }
  std::string name = (std::filesystem::path(dir) / ".bagpipe-spill-XXXXXX").string();
  const int named = mkostemp(name.data(), O_CLOEXEC);
  if (named < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create a temporary file in '", dir, "': ", ErrnoText(errno)));
  }
  unlink(name.c_str());
  return Fd(named);
}

// A file written sequentially through a buffer, with a running size.
class OutFile {
 public:
  OutFile() = default;
  OutFile(Fd fd, std::string what) : fd_(std::move(fd)), what_(std::move(what)) {
    buffer_.reserve(kBufferBytes);
  }
  absl::Status Write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + bytes > kBufferBytes) RETURN_IF_ERROR(Flush());
    if (bytes >= kBufferBytes) {
      RETURN_IF_ERROR(WriteAt(fd_.get(), size_, p, bytes, what_));
    } else {
      buffer_.insert(buffer_.end(), p, p + bytes);
    }
    size_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  absl::Status Flush() {
    const int64_t at = size_ - static_cast<int64_t>(buffer_.size());
    RETURN_IF_ERROR(WriteAt(fd_.get(), at, buffer_.data(), buffer_.size(), what_));
    buffer_.clear();
    return absl::OkStatus();
  }
  int64_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  const std::string& what() const { return what_; }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  Fd fd_;
  std::string what_;
  std::vector<char> buffer_;
  int64_t size_ = 0;
};

// Copies the spill `in` onto `out`, feeding the checksum; with `narrow` the spill holds int64
// ids that are written as uint32.
absl::Status AppendSpill(OutFile& in, bool narrow, AtomicFileWriter& out, Xxh3* checksum) {
  RETURN_IF_ERROR(in.Flush());
  std::vector<int64_t> buffer(kCopyBlock / 8);
  std::vector<uint32_t> small(narrow ? buffer.size() : 0);
  for (int64_t at = 0; at < in.size();) {
    const size_t bytes = static_cast<size_t>(std::min<int64_t>(in.size() - at, kCopyBlock));
    RETURN_IF_ERROR(ReadAt(in.fd(), at, buffer.data(), bytes, in.what(), "spill file"));
    at += static_cast<int64_t>(bytes);
    const void* data = buffer.data();
    size_t put = bytes;
    if (narrow) {
      for (size_t k = 0; k < bytes / 8; ++k) small[k] = static_cast<uint32_t>(buffer[k]);
      data = small.data();
      put = bytes / 2;
    }
    checksum->Update(data, put);
    RETURN_IF_ERROR(out.Append(data, put));
  }
  return absl::OkStatus();
}

absl::Status Pad8(AtomicFileWriter& out, Xxh3* checksum) {
  static const char kZeros[8] = {};
  const int64_t size = static_cast<int64_t>(out.digest().bytes);
  const size_t pad = static_cast<size_t>(Align8(size) - size);
  if (checksum != nullptr) checksum->Update(kZeros, pad);
  return out.Append(kZeros, pad);
}

// ---------------------------------------------------------------------------------------------
// Reading.

struct TableSection {
  // Format version 3: every bag holds one id, and the file stores no offsets (bag s is id s).
  bool one_hot = false;
  int64_t offsets = 0;  // body offset of int64[n + 1] (unless one_hot)
  int64_t ids = 0;      // body offset of the ids
  int id_bytes = 8;     // 4 (uint32) or 8 (int64)
  int64_t num_ids = 0;  // offsets[n]
};

bool IsFinite(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return (bits & 0x7f800000u) != 0x7f800000u;
}

// The inner loops of Read, kept out of its body so that their flags stay in registers.
// out[s] = base + in[s + 1] - in[0] for s in [0, n); returns whether `in` decreases anywhere.
[[gnu::noinline]] bool RebaseOffsets(const int64_t* in, int32_t n, int64_t base, int64_t* out) {
  bool decreasing = false;
  const int64_t shift = base - in[0];
  for (int32_t s = 0; s < n; ++s) {
    decreasing |= in[s + 1] < in[s];
    out[s] = in[s + 1] + shift;
  }
  return decreasing;
}

// Whether any of `ids` lies outside [0, rows) (one unsigned comparison: negatives are huge).
[[gnu::noinline]] bool AnyOutOfRange(const int64_t* ids, int64_t num, uint64_t rows) {
  bool out_of_range = false;
  for (int64_t k = 0; k < num; ++k) out_of_range |= static_cast<uint64_t>(ids[k]) >= rows;
  return out_of_range;
}

// Widens `num` little-endian uint32 ids at `raw` into `out` (front to back, so `raw` may be the
// upper half of `out`); returns whether any is >= rows.
[[gnu::noinline]] bool WidenIds(const char* raw, int64_t num, uint64_t rows, int64_t* out) {
  bool out_of_range = false;
  for (int64_t k = 0; k < num; ++k) {
    uint32_t id;
    std::memcpy(&id, raw + k * 4, 4);
    out[k] = id;
    out_of_range |= id >= rows;
  }
  return out_of_range;
}

class BinarySource final : public SampleSource {
 public:
  BinarySource(std::string path, const SourceOptions& options)
      : path_(std::move(path)), shown_(Printable(path_)), options_(options) {}

  absl::Status Init() {
    const int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      const std::string message =
          absl::StrCat("bin: cannot open '", shown_, "': ", ErrnoText(error));
      if (error == ENOENT) return absl::NotFoundError(message);
      return absl::InvalidArgumentError(message);
    }
    fd_ = Fd(fd);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      return absl::DataLossError(
          absl::StrCat("bin: cannot stat '", shown_, "': ", ErrnoText(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bin: '", shown_, "' is ", S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
          " (expected a file written by bagpipe convert)"));
    }
    size_ = st.st_size;
    if (size_ < kPrefixBytesV1) {
      return absl::DataLossError(absl::StrCat("bin: '", shown_, "' is truncated: ", size_,
                                              " bytes, shorter than the header"));
    }
    char prefix[kPrefixBytes] = {};
    RETURN_IF_ERROR(ReadAt(fd, 0, prefix, static_cast<size_t>(std::min(size_, kPrefixBytes)),
                           shown_, "header"));
    if (std::memcmp(prefix, kMagic, sizeof(kMagic)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("bin: '", shown_,
                       "' is not a Bagpipe binary dataset (bad magic; expected \"BAGPIPE1\")"));
    }
    uint32_t version = 0;
    uint64_t header_bytes = 0, body_bytes = 0, body_checksum = 0, header_checksum = 0;
    std::memcpy(&version, prefix + 8, 4);
    std::memcpy(&header_bytes, prefix + 16, 8);
    if (version < 1 || version > kVersion) {
      return absl::InvalidArgumentError(absl::StrCat("bin: '", shown_, "' has format version ",
                                                     version, "; this build reads versions 1 to ",
                                                     kVersion));
    }
    const int64_t prefix_bytes = version == 1 ? kPrefixBytesV1 : kPrefixBytes;
    if (size_ < prefix_bytes) {
      return absl::DataLossError(absl::StrCat("bin: '", shown_, "' is truncated: ", size_,
                                              " bytes, shorter than the header"));
    }
    if (version != 1) {
      std::memcpy(&body_bytes, prefix + 24, 8);
      std::memcpy(&body_checksum, prefix + 32, 8);
      std::memcpy(&header_checksum, prefix + 40, 8);
    }
    if (header_bytes > static_cast<uint64_t>(size_ - prefix_bytes)) {
      return absl::DataLossError(
          absl::StrCat("bin: '", shown_, "' is truncated inside its header (", header_bytes,
                       " header bytes announced, ", size_, " bytes in the file)"));
    }
    if (header_bytes > static_cast<uint64_t>(kMaxHeaderBytes)) {
      return absl::DataLossError(
          absl::StrCat("bin: '", shown_, "' has a corrupt header: ", header_bytes,
                       " header bytes announced (at most ", kMaxHeaderBytes, ")"));
    }
    std::string text(header_bytes, '\0');
    RETURN_IF_ERROR(ReadAt(fd, prefix_bytes, text.data(), text.size(), shown_, "header"));
    if (version != 1) {
      Xxh3 checksum;
      checksum.Update(prefix, kHeaderChecksumAt);
      checksum.Update(text.data(), text.size());
      const uint64_t actual = checksum.Digest();
      if (actual != header_checksum) {
        return absl::DataLossError(absl::StrCat(
            "bin: '", shown_, "' is corrupt: header checksum mismatch (XXH3-64 of bytes [0, ",
            prefix_bytes + static_cast<int64_t>(header_bytes), ") is ",
            absl::StrFormat("%016x", actual), ", the file says ",
            absl::StrFormat("%016x", header_checksum), ")"));
      }
    }
    const nlohmann::json header = ParseUntrustedJson(text);
    if (header.is_discarded() || !header.is_object()) {
      return absl::DataLossError(
          absl::StrCat("bin: '", shown_, "' has a corrupt header (not a JSON object)"));
    }
    const absl::Status parsed = ParseHeader(header, version, &body_bytes, &body_checksum);
    if (!parsed.ok()) {
      return absl::DataLossError(
          absl::StrCat("bin: '", shown_, "' has a corrupt header: ", parsed.message()));
    }
    static std::atomic<bool> warned{false};
    if (version == 1 && !warned.exchange(true)) {
      BAGPIPE_LOG(WARNING) << "bin: '" << shown_
                           << "' has format version 1, whose header is not covered by a "
                              "checksum; it is read with full validation. Re-run bagpipe convert "
                              "to write the current version.";
    }
    body_offset_ = Align8(prefix_bytes + static_cast<int64_t>(header_bytes));
    const int64_t have = std::max<int64_t>(size_ - body_offset_, 0);
    if (body_bytes != static_cast<uint64_t>(have)) {
      return absl::DataLossError(absl::StrCat(
          "bin: '", shown_, "' is ",
          body_bytes > static_cast<uint64_t>(have) ? "truncated" : "longer than its header says",
          ": the header announces ", body_bytes, " body bytes, the file holds ", have));
    }
    RETURN_IF_ERROR(CheckLayout(have));
    RETURN_IF_ERROR(CheckBody(have, body_checksum));
    per_epoch_ = options_.max_samples >= 0 ? std::min(samples_, options_.max_samples) : samples_;
    // Each table's id count, and so the extent of its ids section; and the ids of one epoch
    // (the first per_epoch_ bags), for IdsPerSample.
    int64_t epoch_ids = 0;
    for (int t = 0; t < schema_.num_tables(); ++t) {
      TableSection& table = tables_[t];
      if (table.one_hot) {
        // CheckLayout found its n ids inside the body.
        table.num_ids = samples_;
        epoch_ids += per_epoch_;
        continue;
      }
      int64_t first = 0, last = 0;
      RETURN_IF_ERROR(ReadAt(fd, body_offset_ + table.offsets, &first, 8, shown_, "offsets"));
      RETURN_IF_ERROR(
          ReadAt(fd, body_offset_ + table.offsets + samples_ * 8, &last, 8, shown_, "offsets"));
      const std::optional<int64_t> id_bytes = CheckedMul(last, table.id_bytes);
      if (first != 0 || last < 0 || !id_bytes || !RangeInside(table.ids, *id_bytes, have)) {
        return absl::DataLossError(absl::StrCat("bin: '", shown_, "': ", TableName(t),
                                                " has offsets from ", first, " to ", last,
                                                ", outside its ids section"));
      }
      table.num_ids = last;
      int64_t epoch_end = last;
      if (per_epoch_ < samples_) {
        RETURN_IF_ERROR(ReadAt(fd, body_offset_ + table.offsets + per_epoch_ * 8, &epoch_end, 8,
                               shown_, "offsets"));
        // A decreasing offset is reported by the read that meets it; the estimate stays in range.
        epoch_end = std::clamp<int64_t>(epoch_end, 0, last);
      }
      epoch_ids += epoch_end;
    }
    ids_per_sample_ =
        per_epoch_ > 0 ? static_cast<double>(epoch_ids) / static_cast<double>(per_epoch_) : -1;
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
    const int fd = fd_.get();
    int64_t bytes = 0;
    batch->num_samples = n;
    batch->labels.resize(n);
    RETURN_IF_ERROR(ReadAt(fd, body_offset_ + labels_ + begin * 4, batch->labels.data(),
                           static_cast<size_t>(n) * 4, shown_, "labels"));
    bytes += int64_t{n} * 4;
    bool labels_ok = true;
    for (const float label : batch->labels) labels_ok &= label >= 0.0f && label <= 1.0f;
    if (!labels_ok) {
      for (int32_t s = 0; s < n; ++s) {
        const float label = batch->labels[s];
        if (!(label >= 0.0f && label <= 1.0f)) {
          return absl::InvalidArgumentError(absl::StrCat("bin: '", shown_, "': record ", begin + s,
                                                         " has label ", label,
                                                         " (labels must be in [0, 1])"));
        }
      }
    }
    batch->dense.resize(static_cast<size_t>(n) * dense);
    RETURN_IF_ERROR(ReadAt(fd, body_offset_ + dense_ + begin * 4 * dense, batch->dense.data(),
                           batch->dense.size() * 4, shown_, "dense values"));
    bytes += static_cast<int64_t>(batch->dense.size()) * 4;
    bool dense_ok = true;
    for (const float value : batch->dense) dense_ok &= IsFinite(value);
    if (!dense_ok) {
      for (size_t k = 0; k < batch->dense.size(); ++k) {
        if (!IsFinite(batch->dense[k])) {
          const int64_t record = begin + static_cast<int64_t>(k / dense);
          return absl::InvalidArgumentError(
              absl::StrCat("bin: '", shown_, "': record ", record, ", dense column '",
                           Excerpt(schema_.dense_names[k % dense]), "': value ", batch->dense[k],
                           " is not finite"));
        }
      }
    }
    batch->offsets.resize(static_cast<size_t>(tables) * n + 1);
    batch->offsets[0] = 0;
    offsets_.resize(static_cast<size_t>(n) + 1);
    for (int t = 0; t < tables; ++t) {
      const TableSection& table = tables_[t];
      if (table.one_hot) {
        // Bag s of the file is id s: records [begin, begin + n) hold ids [begin, begin + n).
        for (int32_t s = 0; s <= n; ++s) offsets_[s] = begin + s;
      } else {
        RETURN_IF_ERROR(ReadAt(fd, body_offset_ + table.offsets + begin * 8, offsets_.data(),
                               offsets_.size() * 8, shown_, "offsets"));
        bytes += static_cast<int64_t>(offsets_.size()) * 8;
      }
      // Non-decreasing from first >= 0 to last <= num_ids: every bag lies in the ids section.
      // Checked in the same pass that rebases the offsets (one pass per array: reading is on
      // the oracle's critical path).
      const int64_t first = offsets_[0];
      const int64_t last = offsets_[n];
      const int64_t base = static_cast<int64_t>(batch->ids.size());
      int64_t* out_offsets = batch->offsets.data() + static_cast<size_t>(t) * n;
      const bool decreasing = RebaseOffsets(offsets_.data(), n, base, out_offsets + 1);
      if (decreasing || first < 0 || last > table.num_ids) {
        // The first record whose bag is decreasing or leaves the ids section.
        int32_t s = 0;
        while (s < n && offsets_[s] >= 0 && offsets_[s + 1] >= offsets_[s] &&
               offsets_[s + 1] <= table.num_ids) {
          ++s;
        }
        return absl::InvalidArgumentError(
            absl::StrCat("bin: '", shown_, "': record ", begin + s, ", ", TableName(t), ": bag [",
                         offsets_[s], ", ", offsets_[s + 1],
                         ") is decreasing or outside the table's ", table.num_ids, " ids"));
      }
      const int64_t num = last - first;
      batch->ids.resize(static_cast<size_t>(base + num));
      int64_t* out = batch->ids.data() + base;
      // Ids in [0, rows), as one unsigned comparison (a negative id compares as huge).
      const uint64_t rows = static_cast<uint64_t>(schema_.table_rows[t]);
      bool out_of_range = false;
      if (table.id_bytes == 8) {
        RETURN_IF_ERROR(ReadAt(fd, body_offset_ + table.ids + first * 8, out,
                               static_cast<size_t>(num) * 8, shown_, "ids"));
        out_of_range = AnyOutOfRange(out, num, rows);
      } else {
        // Read into the upper half of the output and widen in place, front to back: id k
        // (bytes 4 * num + 4k) is read before the write of out[k] (bytes [8k, 8k + 8)) can
        // reach any id not yet widened.
        char* raw = reinterpret_cast<char*>(out);
        RETURN_IF_ERROR(ReadAt(fd, body_offset_ + table.ids + first * 4, raw + num * 4,
                               static_cast<size_t>(num) * 4, shown_, "ids"));
        out_of_range = WidenIds(raw + num * 4, num, rows, out);
      }
      bytes += num * table.id_bytes;
      if (out_of_range) {
        for (int64_t k = 0; k < num; ++k) {
          if (static_cast<uint64_t>(out[k]) >= rows) {
            // The record whose bag holds id k.
            const int64_t* bag =
                std::upper_bound(offsets_.data(), offsets_.data() + n + 1, first + k);
            const int64_t record = begin + (bag - offsets_.data()) - 1;
            return absl::InvalidArgumentError(absl::StrCat("bin: '", shown_, "': record ", record,
                                                           ", ", TableName(t), ": id ", out[k],
                                                           " is out of range [0, ", rows, ")"));
          }
        }
      }
    }
    position_ += count;
    stats_.samples += count;
    stats_.bytes += bytes;
    return count;
  }

  absl::Status Rewind() override {
    stream_offset_ += position_;
    position_ = 0;
    return absl::OkStatus();
  }

  SourceStats stats() const override { return stats_; }
  int64_t SamplesPerEpoch() const override { return per_epoch_; }
  int64_t SamplesPerEpochWithoutLimit() const override { return samples_; }
  double IdsPerSample() const override { return ids_per_sample_; }

  std::string Describe() const override {
    return absl::StrCat("bin:", shown_, " (", samples_, " samples",
                        source_.empty() ? "" : absl::StrCat(", from ", Excerpt(source_, 200)), ")");
  }

 private:
  std::string TableName(int t) const {
    return absl::StrCat("table '", Excerpt(schema_.table_names[t]), "'");
  }

  // The header's fields; version 1 headers also hold the body's length and checksum.
  absl::Status ParseHeader(const nlohmann::json& header, uint32_t version, uint64_t* body_bytes,
                           uint64_t* body_checksum) {
    if (!header.contains("schema")) return absl::InvalidArgumentError("missing field \"schema\"");
    ASSIGN_OR_RETURN(schema_, Schema::FromJson(header["schema"]));
    ASSIGN_OR_RETURN(samples_, JsonInt64(header, "samples"));
    ASSIGN_OR_RETURN(labels_, JsonInt64(header, "labels"));
    ASSIGN_OR_RETURN(dense_, JsonInt64(header, "dense"));
    if (!header.contains("tables") || !header["tables"].is_array()) {
      return absl::InvalidArgumentError("\"tables\" is not a list");
    }
    if (header["tables"].size() != static_cast<size_t>(schema_.num_tables())) {
      return absl::InvalidArgumentError(absl::StrCat("it describes ", header["tables"].size(),
                                                     " table sections for ", schema_.num_tables(),
                                                     " tables"));
    }
    for (const nlohmann::json& table : header["tables"]) {
      TableSection section;
      if (table.is_object() && table.contains("one_hot")) {
        const std::string name = Excerpt(schema_.table_names[tables_.size()]);
        if (version < 3) {
          return absl::InvalidArgumentError(absl::StrCat(
              "table '", name, "' is marked one_hot, which format version ", version, " has not"));
        }
        if (!table["one_hot"].is_boolean() || !table["one_hot"].get<bool>() ||
            table.contains("offsets")) {
          return absl::InvalidArgumentError(absl::StrCat(
              "table '", name, "': \"one_hot\" must be true, and its table has no offsets"));
        }
        section.one_hot = true;
      } else {
        ASSIGN_OR_RETURN(section.offsets, JsonInt64(table, "offsets"));
      }
      ASSIGN_OR_RETURN(section.ids, JsonInt64(table, "ids"));
      ASSIGN_OR_RETURN(const int64_t id_bytes, JsonInt64(table, "id_bytes"));
      if (id_bytes != 4 && id_bytes != 8) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", Excerpt(schema_.table_names[tables_.size()]), "' has ",
                         id_bytes, "-byte ids (expected 4 or 8)"));
      }
      section.id_bytes = static_cast<int>(id_bytes);
      tables_.push_back(section);
    }
    if (header.contains("source")) {
      ASSIGN_OR_RETURN(source_, JsonString(header, "source"));
    }
    if (version == 1) {
      ASSIGN_OR_RETURN(const int64_t announced, JsonInt64(header, "body_bytes"));
      if (announced < 0) return absl::InvalidArgumentError("negative body length");
      *body_bytes = static_cast<uint64_t>(announced);
      ASSIGN_OR_RETURN(const std::string hex, JsonString(header, "checksum"));
      if (hex.size() != 16 || !absl::SimpleHexAtoi(hex, body_checksum)) {
        return absl::InvalidArgumentError(absl::StrCat("bad checksum '", Excerpt(hex), "'"));
      }
    }
    return absl::OkStatus();
  }

  // Every section lies inside the body (`body` bytes), with sizes computed without overflow.
  absl::Status CheckLayout(int64_t body) {
    const int64_t n = samples_;
    if (n < 0) {
      return absl::DataLossError(
          absl::StrCat("bin: '", shown_, "' has a corrupt header: ", n, " samples"));
    }
    auto check = [&](int64_t offset, std::optional<int64_t> bytes,
                     const std::string& what) -> absl::Status {
      if (!bytes || offset % 8 != 0 || !RangeInside(offset, *bytes, body)) {
        return absl::DataLossError(absl::StrCat("bin: '", shown_, "': the ", what,
                                                " section (body offset ", offset, ", ", n,
                                                " samples) lies outside the ", body, "-byte body"));
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(check(labels_, CheckedMul(n, 4), "labels"));
    const std::optional<int64_t> dense_values = CheckedMul(n, schema_.num_dense());
    RETURN_IF_ERROR(
        check(dense_, dense_values ? CheckedMul(*dense_values, 4) : std::nullopt, "dense"));
    for (int t = 0; t < schema_.num_tables(); ++t) {
      const TableSection& table = tables_[t];
      if (table.one_hot) {
        RETURN_IF_ERROR(check(table.ids, CheckedMul(n, table.id_bytes), TableName(t) + " ids"));
        continue;
      }
      const std::optional<int64_t> entries = CheckedAdd(n, 1);
      RETURN_IF_ERROR(check(table.offsets, entries ? CheckedMul(*entries, 8) : std::nullopt,
                            TableName(t) + " offsets"));
      if (table.ids % 8 != 0 || !RangeInside(table.ids, 0, body)) {
        return absl::DataLossError(absl::StrCat("bin: '", shown_, "': ", TableName(t),
                                                " ids section at body offset ", table.ids,
                                                " lies outside the ", body, "-byte body"));
      }
    }
    return absl::OkStatus();
  }

  // The body's XXH3-64 matches the header's, reading the body once in blocks.
  absl::Status CheckBody(int64_t body, uint64_t expected) {
    Xxh3 checksum;
    std::vector<char> block(std::min<int64_t>(body, kHashBlock));
    for (int64_t at = 0; at < body;) {
      const size_t bytes = static_cast<size_t>(std::min<int64_t>(body - at, kHashBlock));
      RETURN_IF_ERROR(ReadAt(fd_.get(), body_offset_ + at, block.data(), bytes, shown_, "body"));
      checksum.Update(block.data(), bytes);
      at += static_cast<int64_t>(bytes);
    }
    const uint64_t actual = checksum.Digest();
    if (actual != expected) {
      return absl::DataLossError(absl::StrCat("bin: '", shown_,
                                              "' is corrupt: body checksum mismatch (XXH3-64 ",
                                              absl::StrFormat("%016x", actual), ", header says ",
                                              absl::StrFormat("%016x", expected), ")"));
    }
    return absl::OkStatus();
  }

  const std::string path_;
  const std::string shown_;  // path_ as messages show it (Printable)
  const SourceOptions options_;
  Fd fd_;
  int64_t size_ = 0;
  int64_t body_offset_ = 0;
  Schema schema_;
  std::string source_;
  int64_t samples_ = 0;
  int64_t labels_ = 0;
  int64_t dense_ = 0;
  std::vector<TableSection> tables_;
  int64_t per_epoch_ = 0;
  double ids_per_sample_ = -1;  // over the first per_epoch_ samples (-1: none)
  int64_t position_ = 0;
  int64_t stream_offset_ = 0;
  SourceStats stats_;
  std::vector<int64_t> offsets_;  // scratch: one table's offsets for a read
};

}  // namespace

absl::StatusOr<std::unique_ptr<SampleSource>> OpenBinary(const std::string& path,
                                                         const SourceOptions& options) {
  auto source = std::make_unique<BinarySource>(path, options);
  RETURN_IF_ERROR(source->Init());
  return std::unique_ptr<SampleSource>(std::move(source));
}

absl::StatusOr<ConvertStats> WriteBinary(SampleSource& source, const std::string& path) {
  Stopwatch watch;
  // The output is checked before the input is read: a directory, or no directory to hold it.
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", Printable(path), "': a directory"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Open(path));
  const std::string dir = DirectoryOf(path);
  const int tables = source.schema().num_tables();
  const int dense = source.schema().num_dense();
  // Sections are spilled to one unnamed file each while the source streams (their sizes are
  // unknown until the end), then concatenated behind the header.
  const int sections = 2 + 2 * tables;
  std::vector<OutFile> spills;
  spills.reserve(sections);
  for (int i = 0; i < sections; ++i) {
    ASSIGN_OR_RETURN(Fd fd, CreateUnnamedFile(dir));
    spills.emplace_back(std::move(fd), absl::StrCat("a temporary file in '", dir, "'"));
  }
  const int64_t zero = 0;
  for (int t = 0; t < tables; ++t) RETURN_IF_ERROR(spills[2 + 2 * t].Write(&zero, 8));
  std::vector<int64_t> table_ids(tables, 0);
  // Tables every bag of which holds one id so far: written without offsets (format version 3).
  std::vector<uint8_t> one_hot(tables, 1);
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
      bool single = true;
      for (int32_t s = 0; s < batch.num_samples; ++s) {
        scratch[s] = base + batch.bag_end(t, s);
        single &= scratch[s] == table_ids[t] + s + 1;
      }
      one_hot[t] &= single ? 1 : 0;
      RETURN_IF_ERROR(spills[2 + 2 * t].Write(scratch.data(), scratch.size() * 8));
      const int64_t begin = batch.table_begin(t);
      const int64_t end = batch.bag_end(t, batch.num_samples - 1);
      RETURN_IF_ERROR(spills[3 + 2 * t].Write(batch.ids.data() + begin, (end - begin) * 8));
      table_ids[t] += end - begin;
    }
    samples += read;
  }

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
    if (one_hot[t]) {
      const int64_t ids_at = place(table_ids[t] * id_bytes[t]);
      header["tables"].push_back({{"one_hot", true}, {"ids", ids_at}, {"id_bytes", id_bytes[t]}});
      continue;
    }
    const int64_t offsets_at = place((samples + 1) * 8);
    const int64_t ids_at = place(table_ids[t] * id_bytes[t]);
    header["tables"].push_back(
        {{"offsets", offsets_at}, {"ids", ids_at}, {"id_bytes", id_bytes[t]}});
  }
  const std::string header_text = DumpJson(header);

  // The prefix's checksums are known only after the body is written: it is written with zeros
  // first and overwritten at the end.
  char prefix[kPrefixBytes] = {};
  std::memcpy(prefix, kMagic, 8);
  // Version 3 only where a table is one-hot: other files stay readable by version 2 readers.
  const bool any_one_hot = std::find(one_hot.begin(), one_hot.end(), 1) != one_hot.end();
  const uint32_t version = any_one_hot ? kVersion : 2;
  std::memcpy(prefix + 8, &version, 4);
  const uint64_t header_bytes = header_text.size();
  const uint64_t body_bytes = static_cast<uint64_t>(offset);
  std::memcpy(prefix + 16, &header_bytes, 8);
  std::memcpy(prefix + 24, &body_bytes, 8);
  RETURN_IF_ERROR(out->Append(prefix, kPrefixBytes));
  RETURN_IF_ERROR(out->Append(header_text.data(), header_text.size()));
  RETURN_IF_ERROR(Pad8(*out, nullptr));
  const int64_t body_start = static_cast<int64_t>(out->digest().bytes);
  Xxh3 body_checksum;
  for (int i = 0; i < sections; ++i) {
    if (i >= 2 && i % 2 == 0 && one_hot[(i - 2) / 2]) continue;  // a one-hot table's offsets
    const bool narrow = i >= 2 && i % 2 == 1 && id_bytes[(i - 3) / 2] == 4;
    RETURN_IF_ERROR(AppendSpill(spills[i], narrow, *out, &body_checksum));
    RETURN_IF_ERROR(Pad8(*out, &body_checksum));
  }
  const int64_t written = static_cast<int64_t>(out->digest().bytes);
  if (written - body_start != offset) {
    return absl::InternalError(
        absl::StrCat("binary body is ", written - body_start, " bytes, expected ", offset));
  }
  const uint64_t body_digest = body_checksum.Digest();
  std::memcpy(prefix + 32, &body_digest, 8);
  Xxh3 header_checksum;
  header_checksum.Update(prefix, kHeaderChecksumAt);
  header_checksum.Update(header_text.data(), header_text.size());
  const uint64_t header_digest = header_checksum.Digest();
  std::memcpy(prefix + 40, &header_digest, 8);
  RETURN_IF_ERROR(out->OverwriteAt(0, prefix, kPrefixBytes));
  RETURN_IF_ERROR(out->Commit());
  ConvertStats stats;
  stats.samples = samples;
  stats.bytes_written = written;
  stats.seconds = watch.Seconds();
  return stats;
}

}  // namespace bagpipe
