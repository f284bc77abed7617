// Internal to the trainer (trainer_hooks/trainer.cc): sends the rows a trainer extracts from its
// cache (evictions and flushes) to their servers without the training thread waiting for the
// device.
//
// At an iteration boundary the training thread queues, on the compute stream, the extraction
// kernel and the copy of the records into a pinned buffer it took from this sender (Buffer),
// then hands the write-back over (Submit). A sender thread waits for the copy (an event
// recorded at Submit), splits the records by server and sends every server its write-back
// stamped with the iteration — an empty one too: it is the server's watermark. Write-backs go
// out in submission order, so each server sees a trainer's stamps increase. A few pinned buffers
// circulate; Buffer blocks while all are in flight (a host wait on the sender, not on the
// device). Drain waits until everything submitted has been sent.
//
// On a synchronous CPU context the records are complete at Submit, which then sends them itself
// (no thread hop on the path of a fetch that waits for the write-back).
//
// Errors (a failed send: the job was aborted) are returned by the next Buffer, Submit or Drain.
// Thread-safety: Buffer, Submit and Drain are called by the training thread (which made the
// context current).
#ifndef BAGPIPE_TRAINER_HOOKS_WRITE_BACK_SENDER_H_
#define BAGPIPE_TRAINER_HOOKS_WRITE_BACK_SENDER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/device.h"
#include "core/types.h"
#include "sync/roles.h"
#include "sync/transport.h"

namespace bagpipe {

class WriteBackSender {
 public:
  // REQUIRES: the calling thread made `context` current.
  static absl::StatusOr<std::unique_ptr<WriteBackSender>> Create(
      Transport& transport, JobLayout layout, std::shared_ptr<DeviceContext> context,
      int record_floats, int buffers = 3);
  // Stops the sender thread; write-backs not yet sent are dropped (the job is ending).
  ~WriteBackSender();

  struct Records {
    int index = -1;         // which buffer
    float* host = nullptr;  // pinned, room for the requested records
  };
  // A pinned buffer for `records` records, free for the caller to fill (by a copy queued on a
  // stream); a buffer that must grow grows to `room` records if that is more. Waits while every
  // buffer is in flight.
  absl::StatusOr<Records> Buffer(int64_t records, int64_t room = 0);
  // Sends, stamped `stamp`, record k of `buffer` to the server of rows[k] for every k with
  // write_back[k] (the others were extracted but are not this trainer's to write back), once
  // the work queued so far on `stream` (the copy into the buffer) has run. `buffer.index` -1:
  // no records (every server still gets its empty write-back).
  absl::Status Submit(Iteration stamp, const Records& buffer, std::vector<RowId> rows,
                      std::vector<bool> write_back, Stream stream);
  // Blocks until every submitted write-back has been sent.
  absl::Status Drain();

 private:
  struct Slot;
  struct Job {
    Iteration stamp = 0;
    int buffer = -1;
    std::vector<RowId> rows;
    std::vector<bool> write_back;
  };
  WriteBackSender(Transport& transport, JobLayout layout, std::shared_ptr<DeviceContext> context,
                  int record_floats);
  void Loop();
  absl::Status Send(const Job& job);

  Transport& transport_;
  const JobLayout layout_;
  const std::shared_ptr<DeviceContext> context_;
  const int record_floats_;
  std::vector<std::unique_ptr<Slot>> slots_;

  // Guards the queue, the buffers' in-flight flags, the status and stop_.
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int sending_ ABSL_GUARDED_BY(mu_) = 0;  // jobs taken by the thread and not yet sent
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_TRAINER_HOOKS_WRITE_BACK_SENDER_H_
