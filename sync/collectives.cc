#include "sync/collectives.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"

namespace bagpipe {
namespace {

// Chunk c of a buffer of `count` values split into `parts`.
std::pair<size_t, size_t> Chunk(size_t count, int parts, int c) {
  return {count * c / parts, count * (c + 1) / parts};
}

// Every part starts with what its sender reduces: the bytes of a value (4: float, 8: double) and
// the all-reduce's whole count, so that members that called with different types or counts get
// an error even where their parts happen to have the same length (4 floats and 2 doubles).
constexpr size_t kPartHeaderBytes = 1 + sizeof(uint64_t);

template <typename T>
Bytes PartToBytes(const T* data, size_t n, size_t total) {
  Bytes bytes(kPartHeaderBytes + n * sizeof(T));
  bytes[0] = static_cast<uint8_t>(sizeof(T));
  const uint64_t count = total;
  std::memcpy(bytes.data() + 1, &count, sizeof(count));
  if (n > 0) std::memcpy(bytes.data() + kPartHeaderBytes, data, n * sizeof(T));
  return bytes;
}

const char* ValueName(size_t value_bytes) {
  return value_bytes == 4 ? "float" : value_bytes == 8 ? "double" : "unknown";
}

// Checks that member `m`'s part reduces the same type and count as this member and holds
// `n` values of `value_bytes` bytes.
absl::Status CheckPart(const Message& message, size_t value_bytes, size_t total, size_t n) {
  const size_t size = message.payload.size();
  if (size < kPartHeaderBytes) {
    return absl::DataLossError(absl::StrCat("all-reduce part from rank ", message.source, " has ",
                                            size, " bytes, less than its header"));
  }
  const size_t theirs = message.payload[0];
  uint64_t their_total = 0;
  std::memcpy(&their_total, message.payload.data() + 1, sizeof(their_total));
  if (theirs != value_bytes || their_total != total) {
    return absl::DataLossError(absl::StrCat(
        "all-reduce: rank ", message.source, " reduces ", their_total, " ", ValueName(theirs),
        " values, this member ", total, " ", ValueName(value_bytes),
        " values (members called with different sizes or types: every member must call the same "
        "all-reduce with the same count and type)"));
  }
  if (size != kPartHeaderBytes + n * value_bytes) {
    return absl::DataLossError(absl::StrCat("all-reduce part from rank ", message.source, " has ",
                                            size - kPartHeaderBytes, " bytes, expected ",
                                            n * value_bytes));
  }
  return absl::OkStatus();
}

// The next part from member m. A part that does not come within the timeout usually means that
// the members called different collectives (one more all-reduce on some of them), which the
// message says rather than only blaming the peer.
absl::StatusOr<Message> ReceivePart(Transport& transport, const Group& group, int m,
                                    absl::Duration timeout) {
  absl::StatusOr<Message> message = transport.Receive(group.ranks[m], kTagDense, timeout);
  if (absl::IsDeadlineExceeded(message.status())) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "rank %d waited %s in an all-reduce over %d members for the part of member %d (rank %d), "
        "which did not join it: every member must call the same all-reduces (all_reduce_, "
        "all_reduce_gradients, Trainer::AllReduce) equally often and in the same order; or "
        "rank %d died or hung",
        transport.rank(), absl::FormatDuration(timeout), group.size(), m, group.ranks[m],
        group.ranks[m]));
  }
  return message;
}

template <typename T>
absl::Status AllReduceSumOf(Transport& transport, const Group& group, T* data, size_t count,
                            absl::Duration timeout) {
  const int n = group.size();
  if (n <= 1) return absl::OkStatus();
  const int me = group.me;
  // Reduce-scatter: send every chunk to its owner.
  for (int c = 0; c < n; ++c) {
    if (c == me) continue;
    const auto [begin, end] = Chunk(count, n, c);
    RETURN_IF_ERROR(
        transport.Send(group.ranks[c], kTagDense, PartToBytes(data + begin, end - begin, count)));
  }
  // Own chunk: receive every member's part and sum in member order from zero.
  const auto [my_begin, my_end] = Chunk(count, n, me);
  const size_t my_count = my_end - my_begin;
  std::vector<Bytes> parts(n);
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    ASSIGN_OR_RETURN(Message message, ReceivePart(transport, group, m, timeout));
    RETURN_IF_ERROR(CheckPart(message, sizeof(T), count, my_count));
    parts[m] = std::move(message.payload);
  }
  std::vector<T> sum(my_count, T{0});
  std::vector<T> part_values;
  for (int m = 0; m < n; ++m) {
    const T* part = data + my_begin;
    if (m != me) {
      // Copied out: a payload's bytes need not be aligned for T.
      part_values.resize(my_count);
      if (my_count > 0) {
        std::memcpy(part_values.data(), parts[m].data() + kPartHeaderBytes, my_count * sizeof(T));
      }
      part = part_values.data();
    }
    for (size_t k = 0; k < my_count; ++k) sum[k] += part[k];
  }
  if (my_count > 0) std::memcpy(data + my_begin, sum.data(), my_count * sizeof(T));
  // All-gather: send the reduced chunk to everyone, receive theirs.
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    RETURN_IF_ERROR(
        transport.Send(group.ranks[m], kTagDense, PartToBytes(sum.data(), my_count, count)));
  }
  for (int c = 0; c < n; ++c) {
    if (c == me) continue;
    const auto [begin, end] = Chunk(count, n, c);
    ASSIGN_OR_RETURN(Message message, ReceivePart(transport, group, c, timeout));
    RETURN_IF_ERROR(CheckPart(message, sizeof(T), count, end - begin));
    if (end > begin) {
      std::memcpy(data + begin, message.payload.data() + kPartHeaderBytes,
                  (end - begin) * sizeof(T));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceSum(Transport& transport, const Group& group, float* data, size_t count,
                          absl::Duration timeout) {
  return AllReduceSumOf(transport, group, data, count, timeout);
}

absl::Status AllReduceSum(Transport& transport, const Group& group, double* data, size_t count,
                          absl::Duration timeout) {
  return AllReduceSumOf(transport, group, data, count, timeout);
}

absl::Status Barrier(Transport& transport, const Group& group, absl::Duration timeout) {
  for (int m = 0; m < group.size(); ++m) {
    if (m != group.me) RETURN_IF_ERROR(transport.Send(group.ranks[m], kTagBarrier, Bytes{}));
  }
  for (int m = 0; m < group.size(); ++m) {
    if (m != group.me) {
      ASSIGN_OR_RETURN(Message message, transport.Receive(group.ranks[m], kTagBarrier, timeout));
    }
  }
  return absl::OkStatus();
}

}  // namespace bagpipe
