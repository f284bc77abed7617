// Little helpers to serialise messages into byte buffers and read them back with bounds checks.
// Values are copied in host byte order (all ranks of a job run on the same architecture).
//
//   WireWriter w;  w.Put<int64_t>(iteration);  w.PutVector(rows);  Bytes b = w.Take();
//   WireReader r(b);  int64_t it;  RETURN_IF_ERROR(r.Get(&it));
//   RETURN_IF_ERROR(r.GetVector(&rows));
// A truncated or oversized buffer yields DataLoss naming the message, never a crash.
#ifndef BAGPIPE_SYNC_WIRE_H_
#define BAGPIPE_SYNC_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bagpipe {

using Bytes = std::vector<uint8_t>;

class WireWriter {
 public:
  template <typename T>
  void Put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    Append(&value, sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& values) {
    PutSpan(values.data(), values.size());
  }
  template <typename T>
  void PutSpan(const T* values, size_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put<uint64_t>(count);
    Append(values, count * sizeof(T));
  }
  void PutString(std::string_view text) { PutSpan(text.data(), text.size()); }
  // Reserves `count` elements at the end and returns where to write them (valid until the next
  // call on this writer). Lets a producer write straight into the message.
  template <typename T>
  T* PutUninitialized(size_t count) {
    Put<uint64_t>(count);
    const size_t at = bytes_.size();
    bytes_.resize(at + count * sizeof(T));
    return reinterpret_cast<T*>(bytes_.data() + at);
  }
  size_t size() const { return bytes_.size(); }
  Bytes Take() { return std::move(bytes_); }

 private:
  void Append(const void* data, size_t size) {
    if (size == 0) return;
    const size_t at = bytes_.size();
    bytes_.resize(at + size);
    std::memcpy(bytes_.data() + at, data, size);
  }
  Bytes bytes_;
};

class WireReader {
 public:
  // `what` names the message in errors ("fetch response from rank 2").
  WireReader(const Bytes& bytes, std::string what)
      : data_(bytes.data()), size_(bytes.size()), what_(std::move(what)) {}

  template <typename T>
  absl::Status Get(T* value) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (size_ - at_ < sizeof(T)) return Truncated(sizeof(T));
    std::memcpy(value, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status GetVector(std::vector<T>* values) {
    const T* data = nullptr;
    size_t count = 0;
    absl::Status status = GetSpan(&data, &count);
    if (!status.ok()) return status;
    values->resize(count);
    if (count > 0) std::memcpy(values->data(), data, count * sizeof(T));
    return absl::OkStatus();
  }
  // Points *data at `count` elements inside the buffer (no copy; valid while the buffer lives).
  // The elements may be unaligned for T: copy them out with memcpy unless T is a byte type.
  template <typename T>
  absl::Status GetSpan(const T** data, size_t* count) {
    static_assert(std::is_trivially_copyable_v<T>);
    uint64_t n = 0;
    absl::Status status = Get(&n);
    if (!status.ok()) return status;
    if (n > (size_ - at_) / (sizeof(T) == 0 ? 1 : sizeof(T))) return Truncated(n * sizeof(T));
    *data = reinterpret_cast<const T*>(data_ + at_);
    *count = n;
    at_ += n * sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetString(std::string* text) {
    const char* data = nullptr;
    size_t count = 0;
    absl::Status status = GetSpan(&data, &count);
    if (status.ok()) text->assign(data, count);
    return status;
  }
  bool done() const { return at_ == size_; }
  absl::Status ExpectDone() const {
    if (done()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(what_, ": ", size_ - at_, " unexpected trailing bytes"));
  }

 private:
  absl::Status Truncated(size_t wanted) const {
    return absl::DataLossError(absl::StrCat(what_, ": truncated message (needed ", wanted,
                                            " bytes at offset ", at_, " of ", size_, ")"));
  }
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
  std::string what_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_WIRE_H_
