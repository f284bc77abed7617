// Orders a trainer's compute stream against a stream of the caller's (PyTorch's current CUDA
// stream) with CUDA events: the mechanism behind Trainer::SetExternalStream and the device
// contract in trainer_hooks/trainer.h. With a CPU context, or before a stream is set, every call
// is a no-op (the CPU backend runs everything in program order).
//
// Thread-safety: used by the one thread driving its trainer.
#ifndef BAGPIPE_TRAINER_HOOKS_EXTERNAL_STREAM_H_
#define BAGPIPE_TRAINER_HOOKS_EXTERNAL_STREAM_H_

#include <memory>

#include "absl/status/status.h"
#include "core/device.h"

namespace bagpipe {

class ExternalStream {
 public:
  explicit ExternalStream(std::shared_ptr<DeviceContext> context);
  ~ExternalStream();
  ExternalStream(const ExternalStream&) = delete;
  ExternalStream& operator=(const ExternalStream&) = delete;

  // Sets the caller's stream (a cudaStream_t of the context's device; nullptr: none). CPU: must
  // be nullptr.
  absl::Status Set(void* stream);
  void* stream() const { return stream_; }

  // Work queued on the compute stream from now on waits for the work queued so far on the
  // external stream (the caller's buffer is written there).
  absl::Status ComputeWaitsForExternal();
  // Work queued on the external stream from now on waits for the work queued so far on the
  // compute stream (results ready; reads of the caller's buffers done).
  absl::Status ExternalWaitsForCompute();

 private:
  const std::shared_ptr<DeviceContext> context_;
  void* stream_ = nullptr;
  void* external_done_ = nullptr;  // cudaEvent_t recorded on the external stream
  void* compute_done_ = nullptr;   // cudaEvent_t recorded on the compute stream
};

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_EXTERNAL_STREAM_H_
