#include "server/embedding_server.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/tunables.h"
#include "server/shard_file.h"

namespace bagpipe {

EmbeddingServer::EmbeddingServer(ServerOptions options, int num_trainers)
    : options_(std::move(options)), store_(options_.initializer), watermarks_(num_trainers, -1) {}

absl::Status EmbeddingServer::HandleWriteBack(int trainer, const WriteBack& write_back) {
  const int rf = store_.record_floats();
  if (write_back.records.size() != write_back.rows.size() * static_cast<size_t>(rf)) {
    return absl::DataLossError(absl::StrFormat(
        "write-back from trainer %d at iteration %d: %d rows but %d floats (expected %d per row)",
        trainer, write_back.stamp, write_back.rows.size(), write_back.records.size(), rf));
  }
  if (write_back.stamp < watermarks_[trainer]) {
    return absl::DataLossError(
        absl::StrFormat("write-back from trainer %d stamped %d arrived after one stamped %d",
                        trainer, write_back.stamp, watermarks_[trainer]));
  }
  for (size_t k = 0; k < write_back.rows.size(); ++k) {
    const RowId row = write_back.rows[k];
    const Iteration previous = store_.stamp(row);
    if (previous >= write_back.stamp) {
      return absl::DataLossError(absl::StrFormat(
          "row %d written back at iteration %d by trainer %d after a write-back stamped %d: "
          "two owners wrote the same row back",
          row, write_back.stamp, trainer, previous));
    }
    std::memcpy(store_.GetOrCreate(row), write_back.records.data() + k * rf, rf * sizeof(float));
    store_.set_stamp(row, write_back.stamp);
  }
  watermarks_[trainer] = write_back.stamp;
  ++stats_.write_back_messages;
  stats_.rows_written_back += static_cast<int64_t>(write_back.rows.size());
  return absl::OkStatus();
}

bool EmbeddingServer::WatermarksReach(Iteration iteration) const {
  for (Iteration watermark : watermarks_) {
    if (watermark < iteration) return false;
  }
  return true;
}

void EmbeddingServer::ResumeAt(Iteration iteration) {
  for (Iteration& watermark : watermarks_) watermark = iteration - 1;
}

void EmbeddingServer::HandleFetch(int trainer, FetchRequest request) {
  ++stats_.fetch_requests;
  waiting_.push_back(Waiting{trainer, std::move(request)});
}

bool EmbeddingServer::Ready(Waiting& waiting) {
  const FetchRequest& request = waiting.request;
  const Iteration floor = request.iteration - options_.writeback_horizon;
  for (Iteration watermark : watermarks_) {
    if (watermark < floor) return false;
  }
  for (; waiting.ready_prefix < request.rows.size(); ++waiting.ready_prefix) {
    const Iteration after = request.after_stamps[waiting.ready_prefix];
    if (after >= 0 && store_.stamp(request.rows[waiting.ready_prefix]) < after) return false;
  }
  return true;
}

std::string EmbeddingServer::OldestWait() const {
  if (waiting_.empty()) return "";
  const Waiting& oldest = waiting_.front();
  const Iteration floor = oldest.request.iteration - options_.writeback_horizon;
  std::vector<std::string> behind;
  for (size_t t = 0; t < watermarks_.size(); ++t) {
    if (watermarks_[t] < floor) {
      behind.push_back(
          watermarks_[t] < 0
              ? absl::StrFormat("trainer %d (none in yet, needed up to iteration %d)", t, floor)
              : absl::StrFormat("trainer %d (in up to iteration %d, needed up to %d)", t,
                                watermarks_[t], floor));
    }
  }
  std::string what;
  if (!behind.empty()) {
    what = absl::StrCat("the write-backs of ", absl::StrJoin(behind, ", "));
  } else {
    // Not the watermarks: a row whose write-back stamp is not there yet (Ready's prefix).
    const size_t k = oldest.ready_prefix;
    what = k < oldest.request.rows.size()
               ? absl::StrFormat(
                     "row %d's write-back of iteration %d (the server holds its "
                     "write-back of iteration %d)",
                     oldest.request.rows[k], oldest.request.after_stamps[k],
                     store_.stamp(oldest.request.rows[k]))
               : std::string("nothing (ready)");
  }
  return absl::StrFormat("the oldest, trainer %d's for iteration %d, waits for %s", oldest.trainer,
                         oldest.request.iteration, what);
}

std::vector<std::pair<int, FetchResponse>> EmbeddingServer::TakeReady() {
  std::vector<std::pair<int, FetchResponse>> ready;
  const int rf = store_.record_floats();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (!Ready(*it)) {
      if (!it->counted_deferred) {
        it->counted_deferred = true;
        ++stats_.deferred_fetches;
      }
      ++it;
      continue;
    }
    FetchResponse response;
    response.id = it->request.id;
    response.records.resize(it->request.rows.size() * rf);
    for (size_t k = 0; k < it->request.rows.size(); ++k) {
      std::memcpy(response.records.data() + k * rf, store_.GetOrCreate(it->request.rows[k]),
                  rf * sizeof(float));
    }
    stats_.rows_fetched += static_cast<int64_t>(it->request.rows.size());
    ready.emplace_back(it->trainer, std::move(response));
    it = waiting_.erase(it);
  }
  return ready;
}

ServerStats EmbeddingServer::stats() const {
  ServerStats stats = stats_;
  stats.rows_stored = store_.size();
  stats.bytes_per_row = store_.bytes_per_row();
  return stats;
}

namespace {

constexpr size_t kCollectChunkRows = 1 << 15;

absl::Status StreamRows(Transport& transport, int destination, const RowStore& store) {
  const int rf = store.record_floats();
  std::vector<RowId> rows;
  std::vector<float> records;
  auto flush = [&](bool last) -> absl::Status {
    WireWriter w;
    w.Put<uint8_t>(last ? 1 : 0);
    w.PutVector(rows);
    w.PutVector(records);
    rows.clear();
    records.clear();
    return transport.Send(destination, kTagControl, EncodeControl(ControlKind::kRows, w.Take()));
  };
  absl::Status status;
  store.ForEachSorted([&](RowId row, const float* record) {
    if (!status.ok()) return;
    rows.push_back(row);
    records.insert(records.end(), record, record + rf);
    if (rows.size() == kCollectChunkRows) status = flush(false);
  });
  RETURN_IF_ERROR(status);
  return flush(true);
}

// A rank 0 keep-alive (ControlKind::kKeepAlive).
bool IsKeepAlive(const Message& message) {
  if (message.tag != kTagControl) return false;
  ControlKind kind;
  Bytes body;
  return DecodeControl(message.payload, &kind, &body).ok() && kind == ControlKind::kKeepAlive;
}

}  // namespace

absl::Status RunServer(Transport& transport, const JobLayout& layout, int server_index,
                       const ServerOptions& options, ServerStats* stats_out) {
  EmbeddingServer server(options, layout.trainers);
  const std::string me = layout.Describe(transport.rank());
  int done = 0;
  std::vector<int> collect_from;  // ranks that asked for the rows, answered once all are done
  bool stop = false;
  // A checkpoint to write once every trainer's write-backs up to its iteration are in.
  std::optional<ShardRequest> checkpoint;
  // While a checkpoint or a resume is under way (until the next fetch or control message), the
  // other ranks may be busy writing, reading or skipping data for long: wait longer for them.
  bool checkpoint_phase = false;
  bool stop_forwarded = false;
  const absl::Duration checkpoint_timeout = absl::Milliseconds(CheckpointTimeoutMs());
  const ShardIdentity shard{server_index, layout.servers, 0};
  auto fail = [&](absl::Status status) {
    status = Annotate(status, me);
    transport.Abort(status);
    return status;
  };
  auto send_ready = [&]() -> absl::Status {
    for (auto& [trainer, response] : server.TakeReady()) {
      RETURN_IF_ERROR(transport.Send(layout.trainer_rank(trainer), kTagFetchResponse,
                                     EncodeFetchResponse(response)));
    }
    return absl::OkStatus();
  };
  // When the last message that shows progress came: rank 0's keep-alives count only once every
  // trainer is done (they bridge the wait for its parameter collection, which its caller may
  // start late), so that they never hide a trainer that went silent.
  absl::Time heard = absl::Now();
  while (!stop) {
    const absl::Duration timeout = checkpoint_phase ? checkpoint_timeout : options.peer_timeout;
    absl::StatusOr<Message> message = transport.Receive(
        kAnySource, kAnyTag, std::max(heard + timeout - absl::Now(), absl::ZeroDuration()));
    if (!message.ok()) {
      if (absl::IsDeadlineExceeded(message.status())) {
        const std::string oldest = server.OldestWait();
        return fail(absl::DeadlineExceededError(absl::StrFormat(
            "no message from any rank for %s (%s; %d of %d trainers done, %d fetches "
            "waiting%s); a peer died or hung, or a trainer waits for something the others do not "
            "do (e.g. an all-reduce not every trainer calls)",
            absl::FormatDuration(timeout),
            checkpoint_phase ? "the checkpoint timeout" : "--peer-timeout", done, layout.trainers,
            server.waiting(), oldest.empty() ? "" : absl::StrCat(": ", oldest))));
      }
      return message.status();  // aborted elsewhere
    }
    const int source = message->source;
    const bool from_trainer = layout.RoleOf(source) == Role::kTrainer;
    if (!IsKeepAlive(*message) || done == layout.trainers) heard = absl::Now();
    switch (message->tag) {
      case kTagWriteBack: {
        if (!from_trainer) return fail(absl::DataLossError("write-back from a non-trainer"));
        auto write_back = DecodeWriteBack(message->payload);
        if (!write_back.ok()) return fail(write_back.status());
        absl::Status status = server.HandleWriteBack(layout.IndexOf(source), *write_back);
        if (!status.ok()) return fail(status);
        if (absl::Status sent = send_ready(); !sent.ok()) return fail(sent);
        break;
      }
      case kTagFetchRequest: {
        if (!from_trainer) return fail(absl::DataLossError("fetch from a non-trainer"));
        checkpoint_phase = false;
        auto request = DecodeFetchRequest(message->payload);
        if (!request.ok()) return fail(request.status());
        server.HandleFetch(layout.IndexOf(source), std::move(*request));
        if (absl::Status sent = send_ready(); !sent.ok()) return fail(sent);
        break;
      }
      case kTagControl: {
        ControlKind kind;
        Bytes body;
        if (absl::Status s = DecodeControl(message->payload, &kind, &body); !s.ok()) {
          return fail(s);
        }
        if (kind == ControlKind::kCheckpoint || kind == ControlKind::kRestore) {
          auto request = DecodeShardRequest(body);
          if (!request.ok()) return fail(request.status());
          checkpoint_phase = true;
          if (kind == ControlKind::kCheckpoint) {
            checkpoint = std::move(*request);
          } else {
            ShardIdentity identity = shard;
            identity.iteration = request->iteration;
            const FileDigest expected{request->bytes, request->crc32c};
            if (server.store().size() > 0) {
              return fail(absl::FailedPreconditionError("a resume after rows were served"));
            }
            absl::Status loaded =
                LoadShard(request->path, identity, &expected, &server.mutable_store());
            if (!loaded.ok()) return fail(loaded);
            server.ResumeAt(request->iteration);
            const ShardReply reply{expected.bytes, expected.crc32c, server.store().size()};
            absl::Status sent =
                transport.Send(source, kTagControl,
                               EncodeControl(ControlKind::kShardDone, EncodeShardReply(reply)));
            if (!sent.ok()) return fail(sent);
          }
          break;
        }
        if (kind == ControlKind::kKeepAlive) {
          if (source != JobLayout::oracle_rank()) {
            return fail(
                absl::DataLossError(absl::StrCat("keep-alive from rank ", source, ", not rank 0")));
          }
          break;  // a message came: the wait for the next one starts again
        }
        checkpoint_phase = false;
        if (kind == ControlKind::kDone) {
          ++done;
        } else if (kind == ControlKind::kCollect) {
          // Messages from different ranks are not ordered: a trainer's final write-back may
          // still be on its way when the collector asks. Every trainer sends kDone after its
          // final write-back, so the rows are complete once all of them are done.
          collect_from.push_back(source);
        } else if (kind == ControlKind::kStop) {
          stop = true;
        } else {
          return fail(absl::DataLossError("unexpected control message at a server"));
        }
        break;
      }
      default:
        return fail(absl::DataLossError(
            absl::StrCat("unexpected message tag ", message->tag, " from rank ", source)));
    }
    if (checkpoint.has_value() && server.WatermarksReach(checkpoint->iteration)) {
      ShardIdentity identity = shard;
      identity.iteration = checkpoint->iteration;
      auto digest = WriteShard(checkpoint->path, server.store(), identity);
      if (!digest.ok()) return fail(digest.status());
      const ShardReply reply{digest->bytes, digest->crc32c, server.store().size()};
      absl::Status sent =
          transport.Send(JobLayout::oracle_rank(), kTagControl,
                         EncodeControl(ControlKind::kShardDone, EncodeShardReply(reply)));
      if (!sent.ok()) return fail(sent);
      checkpoint.reset();
    }
    if (!stop_forwarded && options.stop_requested) {
      if (const int signal = options.stop_requested(); signal != 0) {
        stop_forwarded = true;
        WireWriter w;
        w.Put<int32_t>(signal);
        (void)transport.Send(JobLayout::oracle_rank(), kTagStopRequest, w.Take());
      }
    }
    if (done == layout.trainers && !collect_from.empty()) {
      for (int collector : collect_from) {
        if (absl::Status s = StreamRows(transport, collector, server.store()); !s.ok()) {
          return fail(s);
        }
      }
      collect_from.clear();
    }
  }
  if (server.waiting() > 0) {
    return fail(absl::InternalError(
        absl::StrCat("stopped with ", server.waiting(), " fetches never served")));
  }
  if (stats_out != nullptr) *stats_out = server.stats();
  return absl::OkStatus();
}

absl::Status CollectRows(Transport& transport, const JobLayout& layout, int record_floats,
                         absl::Duration timeout,
                         const std::function<void(RowId, const float*)>& fn) {
  struct Stream {
    std::vector<RowId> rows;
    std::vector<float> records;
    size_t at = 0;
    bool last = false;
  };
  std::vector<Stream> streams(layout.servers);
  auto receive_chunk = [&](int s) -> absl::Status {
    ASSIGN_OR_RETURN(Message message,
                     transport.Receive(layout.server_rank(s), kTagControl, timeout));
    ControlKind kind;
    Bytes body;
    RETURN_IF_ERROR(DecodeControl(message.payload, &kind, &body));
    if (kind != ControlKind::kRows) return absl::DataLossError("expected a rows chunk");
    WireReader r(body, "rows chunk");
    uint8_t last = 0;
    RETURN_IF_ERROR(r.Get(&last));
    Stream& stream = streams[s];
    RETURN_IF_ERROR(r.GetVector(&stream.rows));
    RETURN_IF_ERROR(r.GetVector(&stream.records));
    if (stream.records.size() != stream.rows.size() * static_cast<size_t>(record_floats)) {
      return absl::DataLossError("rows chunk: record size mismatch");
    }
    stream.at = 0;
    stream.last = last != 0;
    return absl::OkStatus();
  };
  for (int s = 0; s < layout.servers; ++s) {
    RETURN_IF_ERROR(
        transport.Send(layout.server_rank(s), kTagControl, EncodeControl(ControlKind::kCollect)));
  }
  using Head = std::pair<RowId, int>;
  std::priority_queue<Head, std::vector<Head>, std::greater<>> heads;
  for (int s = 0; s < layout.servers; ++s) {
    RETURN_IF_ERROR(receive_chunk(s));
    while (streams[s].rows.empty() && !streams[s].last) RETURN_IF_ERROR(receive_chunk(s));
    if (!streams[s].rows.empty()) heads.push({streams[s].rows[0], s});
  }
  while (!heads.empty()) {
    const auto [row, s] = heads.top();
    heads.pop();
    Stream& stream = streams[s];
    fn(row, stream.records.data() + stream.at * record_floats);
    ++stream.at;
    if (stream.at == stream.rows.size()) {
      if (stream.last) continue;
      do {
        RETURN_IF_ERROR(receive_chunk(s));
      } while (stream.rows.empty() && !stream.last);
      if (stream.rows.empty()) continue;
    }
    heads.push({stream.rows[stream.at], s});
  }
  for (int s = 0; s < layout.servers; ++s) {
    RETURN_IF_ERROR(
        transport.Send(layout.server_rank(s), kTagControl, EncodeControl(ControlKind::kStop)));
  }
  return absl::OkStatus();
}

}  // namespace bagpipe
