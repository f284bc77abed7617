#include "trainer_hooks/external_stream.h"

#include "core/status.h"
#if BAGPIPE_WITH_CUDA
#include "core/cuda_checks.h"
#endif

namespace bagpipe {

#if BAGPIPE_WITH_CUDA
namespace {

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t AsEvent(void* event) { return static_cast<cudaEvent_t>(event); }

absl::Status CreateEvent(void** event) {
  if (*event != nullptr) return absl::OkStatus();
  cudaEvent_t created = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
  *event = created;
  return absl::OkStatus();
}

// `waiter` waits for the work queued so far on `signaller`, through `event`.
absl::Status StreamWaits(void* waiter, void* signaller, void* event) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(AsEvent(event), AsStream(signaller)));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(waiter), AsEvent(event), 0));
  return absl::OkStatus();
}

}  // namespace
#endif

ExternalStream::ExternalStream(std::shared_ptr<DeviceContext> context)
    : context_(std::move(context)) {}

ExternalStream::~ExternalStream() {
#if BAGPIPE_WITH_CUDA
  for (void* event : {external_done_, compute_done_}) {
    if (event != nullptr) (void)cudaEventDestroy(AsEvent(event));
  }
#endif
}

absl::Status ExternalStream::Set(void* stream) {
  if (!context_->is_cuda()) {
    if (stream != nullptr) {
      return absl::InvalidArgumentError(
          "SetExternalStream: a CPU trainer has no streams (pass nullptr)");
    }
    return absl::OkStatus();
  }
#if BAGPIPE_WITH_CUDA
  if (stream != nullptr) {
    RETURN_IF_ERROR(context_->MakeCurrent());
    RETURN_IF_ERROR(CreateEvent(&external_done_));
    RETURN_IF_ERROR(CreateEvent(&compute_done_));
  }
#endif
  stream_ = stream;
  return absl::OkStatus();
}

absl::Status ExternalStream::ComputeWaitsForExternal() {
#if BAGPIPE_WITH_CUDA
  if (stream_ != nullptr) {
    return StreamWaits(context_->stream(Stream::kCompute), stream_, external_done_);
  }
#endif
  return absl::OkStatus();
}

absl::Status ExternalStream::ExternalWaitsForCompute() {
#if BAGPIPE_WITH_CUDA
  if (stream_ != nullptr) {
    return StreamWaits(stream_, context_->stream(Stream::kCompute), compute_done_);
  }
#endif
  return absl::OkStatus();
}

}  // namespace bagpipe
