// Fuzz harness: messages between trainers and servers (sync/protocol.h over sync/wire.h).
// Input: one byte choosing the message type, then the message. A message that decodes
// re-encodes to the same bytes.
#include <cstdint>

#include "sync/protocol.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <typename Message, typename Decode, typename Encode>
void RoundTrip(const bagpipe::Bytes& bytes, Decode decode, Encode encode) {
  absl::StatusOr<Message> message = decode(bytes);
  if (!message.ok()) return bagpipe::CheckMessage(message.status(), "");
  if (encode(*message) != bytes) bagpipe::FuzzFail("a decoded message re-encodes differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  if (size < 1) return 0;
  const Bytes bytes(data + 1, data + size);
  switch (data[0] % 4) {
    case 0:
      RoundTrip<FetchRequest>(bytes, DecodeFetchRequest, EncodeFetchRequest);
      break;
    case 1:
      RoundTrip<FetchResponse>(bytes, DecodeFetchResponse, EncodeFetchResponse);
      break;
    case 2:
      RoundTrip<WriteBack>(bytes, DecodeWriteBack, EncodeWriteBack);
      break;
    case 3: {
      ControlKind kind;
      Bytes body;
      const absl::Status status = DecodeControl(bytes, &kind, &body);
      if (!status.ok()) {
        CheckMessage(status, "");
      } else if (EncodeControl(kind, body) != bytes) {
        FuzzFail("a decoded control message re-encodes differently");
      }
      break;
    }
  }
  return 0;
}
