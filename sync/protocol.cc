#include "sync/protocol.h"

#include "core/status.h"

namespace bagpipe {

Bytes EncodeFetchRequest(const FetchRequest& request) {
  WireWriter w;
  w.Put(request.id);
  w.Put(request.iteration);
  w.PutVector(request.rows);
  w.PutVector(request.after_stamps);
  return w.Take();
}

absl::StatusOr<FetchRequest> DecodeFetchRequest(const Bytes& bytes) {
  WireReader r(bytes, "fetch request");
  FetchRequest request;
  RETURN_IF_ERROR(r.Get(&request.id));
  RETURN_IF_ERROR(r.Get(&request.iteration));
  RETURN_IF_ERROR(r.GetVector(&request.rows));
  RETURN_IF_ERROR(r.GetVector(&request.after_stamps));
  RETURN_IF_ERROR(r.ExpectDone());
  if (request.after_stamps.size() != request.rows.size()) {
    return absl::DataLossError("fetch request: rows and stamps differ in length");
  }
  return request;
}

Bytes EncodeFetchResponse(const FetchResponse& response) {
  WireWriter w;
  w.Put(response.id);
  w.PutVector(response.records);
  return w.Take();
}

absl::StatusOr<FetchResponse> DecodeFetchResponse(const Bytes& bytes) {
  WireReader r(bytes, "fetch response");
  FetchResponse response;
  RETURN_IF_ERROR(r.Get(&response.id));
  RETURN_IF_ERROR(r.GetVector(&response.records));
  RETURN_IF_ERROR(r.ExpectDone());
  return response;
}

Bytes EncodeWriteBack(const WriteBack& write_back) {
  WireWriter w;
  w.Put(write_back.stamp);
  w.PutVector(write_back.rows);
  w.PutVector(write_back.records);
  return w.Take();
}

absl::StatusOr<WriteBack> DecodeWriteBack(const Bytes& bytes) {
  WireReader r(bytes, "write-back");
  WriteBack write_back;
  RETURN_IF_ERROR(r.Get(&write_back.stamp));
  RETURN_IF_ERROR(r.GetVector(&write_back.rows));
  RETURN_IF_ERROR(r.GetVector(&write_back.records));
  RETURN_IF_ERROR(r.ExpectDone());
  return write_back;
}

Bytes EncodeControl(ControlKind kind, const Bytes& body) {
  WireWriter w;
  w.Put(static_cast<uint32_t>(kind));
  w.PutVector(body);
  return w.Take();
}

absl::Status DecodeControl(const Bytes& bytes, ControlKind* kind, Bytes* body) {
  WireReader r(bytes, "control message");
  uint32_t raw = 0;
  RETURN_IF_ERROR(r.Get(&raw));
  RETURN_IF_ERROR(r.GetVector(body));
  RETURN_IF_ERROR(r.ExpectDone());
  if (raw < 1 || raw > static_cast<uint32_t>(ControlKind::kKeepAlive)) {
    return absl::DataLossError("control message: unknown kind");
  }
  *kind = static_cast<ControlKind>(raw);
  return absl::OkStatus();
}

Bytes EncodeShardRequest(const ShardRequest& request) {
  WireWriter w;
  w.Put(request.iteration);
  w.PutString(request.path);
  w.Put(request.bytes);
  w.Put(request.crc32c);
  return w.Take();
}

absl::StatusOr<ShardRequest> DecodeShardRequest(const Bytes& bytes) {
  WireReader r(bytes, "shard request");
  ShardRequest request;
  RETURN_IF_ERROR(r.Get(&request.iteration));
  RETURN_IF_ERROR(r.GetString(&request.path));
  RETURN_IF_ERROR(r.Get(&request.bytes));
  RETURN_IF_ERROR(r.Get(&request.crc32c));
  RETURN_IF_ERROR(r.ExpectDone());
  return request;
}

Bytes EncodeShardReply(const ShardReply& reply) {
  WireWriter w;
  w.Put(reply.bytes);
  w.Put(reply.crc32c);
  w.Put(reply.rows);
  return w.Take();
}

absl::StatusOr<ShardReply> DecodeShardReply(const Bytes& bytes) {
  WireReader r(bytes, "shard reply");
  ShardReply reply;
  RETURN_IF_ERROR(r.Get(&reply.bytes));
  RETURN_IF_ERROR(r.Get(&reply.crc32c));
  RETURN_IF_ERROR(r.Get(&reply.rows));
  RETURN_IF_ERROR(r.ExpectDone());
  return reply;
}

}  // namespace bagpipe
