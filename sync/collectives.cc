#include "sync/collectives.h"

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

template <typename T>
Bytes ValuesToBytes(const T* data, size_t n) {
  Bytes bytes(n * sizeof(T));
  if (n > 0) std::memcpy(bytes.data(), data, bytes.size());
  return bytes;
}

absl::Status CheckSize(const Message& message, size_t bytes) {
  if (message.payload.size() != bytes) {
    return absl::DataLossError(absl::StrCat("all-reduce chunk from rank ", message.source, " has ",
                                            message.payload.size(), " bytes, expected ", bytes,
                                            " (members called with different sizes or types?)"));
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
        transport.Send(group.ranks[c], kTagDense, ValuesToBytes(data + begin, end - begin)));
  }
  // Own chunk: receive every member's part and sum in member order from zero.
  const auto [my_begin, my_end] = Chunk(count, n, me);
  const size_t my_count = my_end - my_begin;
  std::vector<Bytes> parts(n);
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    ASSIGN_OR_RETURN(Message message, ReceivePart(transport, group, m, timeout));
    RETURN_IF_ERROR(CheckSize(message, my_count * sizeof(T)));
    parts[m] = std::move(message.payload);
  }
  std::vector<T> sum(my_count, T{0});
  std::vector<T> part_values;
  for (int m = 0; m < n; ++m) {
    const T* part = data + my_begin;
    if (m != me) {
      // Copied out: a payload's bytes need not be aligned for T.
      part_values.resize(my_count);
      if (my_count > 0) std::memcpy(part_values.data(), parts[m].data(), my_count * sizeof(T));
      part = part_values.data();
    }
    for (size_t k = 0; k < my_count; ++k) sum[k] += part[k];
  }
  if (my_count > 0) std::memcpy(data + my_begin, sum.data(), my_count * sizeof(T));
  // All-gather: send the reduced chunk to everyone, receive theirs.
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    RETURN_IF_ERROR(transport.Send(group.ranks[m], kTagDense, ValuesToBytes(sum.data(), my_count)));
  }
  for (int c = 0; c < n; ++c) {
    if (c == me) continue;
    const auto [begin, end] = Chunk(count, n, c);
    ASSIGN_OR_RETURN(Message message, ReceivePart(transport, group, c, timeout));
    RETURN_IF_ERROR(CheckSize(message, (end - begin) * sizeof(T)));
    if (end > begin) std::memcpy(data + begin, message.payload.data(), message.payload.size());
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
