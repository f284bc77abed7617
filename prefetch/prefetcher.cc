#include "prefetch/prefetcher.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "sync/protocol.h"

namespace bagpipe {

struct Prefetcher::Item {
  const DeviceContext* context = nullptr;
  Iteration iteration = 0;
  int64_t rows = 0;
  // Per server: positions (in request order) of the rows it owns.
  std::vector<std::vector<int64_t>> positions;
  int pending = 0;  // servers yet to answer
  bool ready = false;
  // Host staging (pinned on CUDA) and device staging; on a synchronous CPU context the host
  // buffer serves both.
  float* host = nullptr;
  float* device = nullptr;
  int64_t capacity_floats = 0;
  // After the copy host -> device (copy stream), and after the last read of `device` by the
  // stream it was released to. Created with the item; recorded once per use.
  DeviceEvent copied;
  DeviceEvent released;

  ~Item() {
    if (context == nullptr) return;
    if (device != host) context->Free(device);
    context->FreePinned(host);
  }
};

Prefetcher::Prefetcher(Transport& transport, JobLayout layout, int trainer,
                       std::shared_ptr<DeviceContext> context, int record_floats,
                       absl::Duration peer_timeout, int buffers)
    : transport_(transport),
      layout_(layout),
      trainer_(trainer),
      context_(std::move(context)),
      record_floats_(record_floats),
      peer_timeout_(peer_timeout),
      buffers_(std::max(buffers, 1)) {
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

Prefetcher::~Prefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Wake the receiver: a message to ourselves with the response tag and an empty payload.
  if (!transport_.Send(transport_.rank(), kTagFetchResponse, Bytes{}).ok()) {
    // The job was aborted: the receiver sees the abort status and exits on its own.
  }
  receiver_.join();
}

absl::Status Prefetcher::Request(Iteration iteration, const std::vector<RowId>& rows,
                                 const std::vector<Iteration>& after_stamps, int64_t room) {
  const int servers = layout_.servers;
  std::vector<FetchRequest> requests(servers);
  const int64_t rows_room = std::max<int64_t>(static_cast<int64_t>(rows.size()), room);
  if (!made_buffers_) {
    // Every buffer the caller's iterations in flight need, now: made one by one as the pipeline
    // first fills, the last would appear whenever the timing first allowed that many in flight.
    made_buffers_ = true;
    for (int k = 1; k < buffers_; ++k) {
      auto spare = std::make_unique<Item>();
      ASSIGN_OR_RETURN(spare->copied, DeviceEvent::Create(context_));
      ASSIGN_OR_RETURN(spare->released, DeviceEvent::Create(context_));
      RETURN_IF_ERROR(Grow(*spare, rows_room));
      absl::MutexLock lock(&mu_);
      free_items_.push_back(std::move(spare));
    }
  }
  auto item = std::unique_ptr<Item>();
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(error_);
    if (!items_.empty() && items_.rbegin()->first >= iteration) {
      return absl::InternalError(absl::StrCat("prefetch requests out of order: ", iteration,
                                              " after ", items_.rbegin()->first));
    }
    // A free buffer big enough, else the largest free one (it grows below): the number of
    // buffers stays the number of iterations in flight.
    const int64_t floats = static_cast<int64_t>(rows.size()) * record_floats_;
    auto chosen = free_items_.end();
    for (auto it = free_items_.begin(); it != free_items_.end(); ++it) {
      if ((*it)->capacity_floats >= floats) {
        chosen = it;
        break;
      }
      if (chosen == free_items_.end() || (*it)->capacity_floats > (*chosen)->capacity_floats) {
        chosen = it;
      }
    }
    if (chosen != free_items_.end()) {
      item = std::move(*chosen);
      free_items_.erase(chosen);
    }
  }
  if (item == nullptr) {
    item = std::make_unique<Item>();
    ASSIGN_OR_RETURN(item->copied, DeviceEvent::Create(context_));
    ASSIGN_OR_RETURN(item->released, DeviceEvent::Create(context_));
  } else {
    // The receiver is about to write the host staging: the copy out of it must have run (it
    // normally has, iterations ago: the query then costs no synchronisation).
    ASSIGN_OR_RETURN(const bool copied, item->copied.Query());
    if (!copied) RETURN_IF_ERROR(item->copied.Synchronize());
  }
  if (item->capacity_floats < static_cast<int64_t>(rows.size()) * record_floats_) {
    RETURN_IF_ERROR(Grow(*item, rows_room));
  }
  item->iteration = iteration;
  item->rows = static_cast<int64_t>(rows.size());
  item->positions.assign(servers, {});
  item->ready = false;
  for (size_t k = 0; k < rows.size(); ++k) {
    const int s = ServerOfRow(rows[k], servers);
    requests[s].rows.push_back(rows[k]);
    requests[s].after_stamps.push_back(after_stamps[k]);
    item->positions[s].push_back(static_cast<int64_t>(k));
  }
  std::vector<int> targets;
  {
    absl::MutexLock lock(&mu_);
    item->pending = 0;
    for (int s = 0; s < servers; ++s) {
      if (requests[s].rows.empty()) continue;
      requests[s].id = next_request_id_++;
      requests[s].iteration = iteration;
      requests_[requests[s].id] = {iteration, s};
      ++item->pending;
      targets.push_back(s);
      ++stats_.requests;
    }
    item->ready = item->pending == 0;
    stats_.rows += item->rows;
    ++stats_.iterations;
    items_[iteration] = std::move(item);
    stats_.max_in_flight = std::max<int64_t>(stats_.max_in_flight, items_.size());
  }
  for (int s : targets) {
    RETURN_IF_ERROR(
        transport_.Send(layout_.server_rank(s), kTagFetchRequest, EncodeFetchRequest(requests[s])));
  }
  return absl::OkStatus();
}

absl::Status Prefetcher::Grow(Item& item, int64_t rows) {
  // The next power of two, to amortise reallocations. The old buffers are not in use: the
  // item is free, and freeing waits for every stream (DeviceContext::Free).
  const int64_t floats = rows * record_floats_;
  int64_t capacity = 1;
  while (capacity < floats) capacity <<= 1;
  Item fresh;
  fresh.context = context_.get();
  ASSIGN_OR_RETURN(void* host, context_->AllocatePinned(capacity * sizeof(float)));
  fresh.host = static_cast<float*>(host);
  if (context_->is_asynchronous()) {
    ASSIGN_OR_RETURN(void* device, context_->Allocate(capacity * sizeof(float)));
    fresh.device = static_cast<float*>(device);
  } else {
    fresh.device = fresh.host;
  }
  fresh.capacity_floats = capacity;
  std::swap(item.context, fresh.context);
  std::swap(item.host, fresh.host);
  std::swap(item.device, fresh.device);
  std::swap(item.capacity_floats, fresh.capacity_floats);
  return absl::OkStatus();
}

absl::StatusOr<Prefetcher::Staging> Prefetcher::Wait(Iteration iteration) {
  Stopwatch watch;
  absl::MutexLock lock(&mu_);
  auto found = items_.find(iteration);
  if (found == items_.end()) {
    return absl::InternalError(absl::StrCat("no prefetch was requested for iteration ", iteration));
  }
  Item* item = found->second.get();
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return item->ready || !error_.ok(); };
  mu_.Await(absl::Condition(&done));
  const double waited = watch.Seconds();
  stats_.wait_seconds += waited;
  stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, waited);
  RETURN_IF_ERROR(error_);
  return Staging{item->device, item->rows, &item->copied};
}

absl::Status Prefetcher::Release(Iteration iteration, Stream reader) {
  std::unique_ptr<Item> item;
  {
    absl::MutexLock lock(&mu_);
    auto found = items_.find(iteration);
    if (found == items_.end()) return absl::OkStatus();
    item = std::move(found->second);
    items_.erase(found);
  }
  // The next copy into this device staging waits for the reads queued so far on `reader`.
  absl::Status recorded = item->released.Record(reader);
  absl::MutexLock lock(&mu_);
  // The caller bounds the iterations in flight; keeping every buffer avoids freeing and
  // allocating again in the steady state.
  constexpr size_t kKeepFree = 16;
  if (recorded.ok() && free_items_.size() < kKeepFree) free_items_.push_back(std::move(item));
  return recorded;
}

PrefetchStats Prefetcher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::string Prefetcher::UnjoinedAllReduce() {
  std::vector<std::string> waiting;
  for (const int rank : transport_.SourcesWithPending(kTagDense)) {
    const int trainer = rank - layout_.trainer_rank(0);
    if (trainer < 0 || trainer >= layout_.trainers || trainer == trainer_) continue;
    waiting.push_back(absl::StrFormat("trainer %d (rank %d)", trainer, rank));
  }
  // The server may be waiting itself: a fetch is answered once every trainer's write-backs up
  // to its stamp are in, so one trainer stuck in its own code stalls the others' fetches.
  if (waiting.empty()) {
    return "that server died or hung, or it waits for the write-backs of another trainer that "
           "went silent (stuck in its own loop, or dead)";
  }
  const bool one = waiting.size() == 1;
  return absl::StrCat(
      absl::StrJoin(waiting, ", "), one ? " is" : " are",
      " waiting in a dense all-reduce that trainer ", trainer_, " has not joined (",
      one ? "its part waits" : "their parts wait", " here), and the servers wait for ",
      one ? "it" : "them",
      ": every trainer must call the same all-reduces (all_reduce_, all_reduce_gradients, "
      "Trainer::AllReduce) equally often and in the same order");
}

void Prefetcher::FailAll(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = status;
}

absl::Status Prefetcher::HandleResponse(const Message& message) {
  ASSIGN_OR_RETURN(FetchResponse response, DecodeFetchResponse(message.payload));
  Item* item = nullptr;
  int server = 0;
  {
    absl::MutexLock lock(&mu_);
    auto request = requests_.find(response.id);
    if (request == requests_.end()) {
      return absl::DataLossError(absl::StrCat("fetch response with unknown id ", response.id,
                                              " from rank ", message.source));
    }
    server = request->second.second;
    item = items_.at(request->second.first).get();
    requests_.erase(request);
  }
  // The item cannot be released while a response is outstanding (it is not ready), so it is
  // safe to fill without the lock.
  const std::vector<int64_t>& positions = item->positions[server];
  if (response.records.size() != positions.size() * static_cast<size_t>(record_floats_)) {
    return absl::DataLossError(absl::StrFormat(
        "fetch response from rank %d for iteration %d has %d floats, expected %d", message.source,
        item->iteration, response.records.size(), positions.size() * record_floats_));
  }
  for (size_t k = 0; k < positions.size(); ++k) {
    std::memcpy(item->host + positions[k] * record_floats_,
                response.records.data() + k * record_floats_, record_floats_ * sizeof(float));
  }
  bool complete = false;
  {
    absl::MutexLock lock(&mu_);
    stats_.bytes += static_cast<int64_t>(response.records.size() * sizeof(float));
    complete = --item->pending == 0;
  }
  if (complete) {
    if (item->device != item->host) {
      // The device staging may still be read by the fill of its previous use.
      RETURN_IF_ERROR(context_->StreamWaitEvent(Stream::kCopy, item->released));
      RETURN_IF_ERROR(context_->CopyToDevice(
          item->device, item->host, item->rows * record_floats_ * sizeof(float), Stream::kCopy));
    }
    RETURN_IF_ERROR(item->copied.Record(Stream::kCopy));
    absl::MutexLock lock(&mu_);
    item->ready = true;
  }
  return absl::OkStatus();
}

void Prefetcher::ReceiveLoop() {
  if (absl::Status status = context_->MakeCurrent(); !status.ok()) {
    FailAll(status);
    return;
  }
  while (true) {
    absl::StatusOr<Message> message =
        transport_.Receive(kAnySource, kTagFetchResponse, peer_timeout_);
    bool outstanding = false;
    std::set<int> silent_servers;  // servers with unanswered requests
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      outstanding = !requests_.empty();
      for (const auto& [id, request] : requests_) silent_servers.insert(request.second);
    }
    if (!message.ok()) {
      if (absl::IsDeadlineExceeded(message.status()) && !outstanding) continue;
      std::vector<std::string> names;
      for (int s : silent_servers) {
        names.push_back(absl::StrFormat("server %d (rank %d)", s, layout_.server_rank(s)));
      }
      FailAll(absl::IsDeadlineExceeded(message.status())
                  ? absl::DeadlineExceededError(
                        absl::StrCat(absl::StrFormat("trainer %d waited %s for rows from %s; ",
                                                     trainer_, absl::FormatDuration(peer_timeout_),
                                                     absl::StrJoin(names, ", ")),
                                     UnjoinedAllReduce()))
                  : message.status());
      return;
    }
    if (message->source == transport_.rank()) continue;  // a wake-up
    if (absl::Status status = HandleResponse(*message); !status.ok()) {
      FailAll(status);
      transport_.Abort(status);
      return;
    }
  }
}

}  // namespace bagpipe
