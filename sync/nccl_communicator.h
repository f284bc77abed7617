// NCCL among a group of ranks that each own one GPU: the trainers' dense gradients when the
// CUDA backend runs them (sync/collectives.h is the CPU twin and the reference).
//
// Built only with the CUDA backend (BAGPIPE_WITH_CUDA); this header compiles with a plain host
// compiler (CUDA streams appear as the opaque CUstream_st*, which is cudaStream_t).
//
// Setup runs over the job's Transport: every member tells member 0 its host and the PCI bus id
// of its GPU; member 0 checks that no two members share a GPU (NCCL refuses that), creates the
// ncclUniqueId and sends it (or the reason NCCL is unusable) to every member on kTagNcclSetup.
// The communicator is non-blocking (ncclCommInitRankConfig with blocking = 0) and every wait on
// NCCL work polls cudaStreamQuery and ncclCommGetAsyncError against a deadline: a dead or stuck
// peer makes the call abort the communicator (ncclCommAbort) and return DeadlineExceeded, so no
// rank hangs forever. After a failure the communicator is unusable and every call fails.
//
// AllReduceSum has two modes. Non-deterministic: ncclAllReduce(ncclSum) (NCCL picks the order).
// Deterministic: ncclAllGather into a [members x count] device buffer, then a kernel sums every
// element over the members in group order from +0.0f with round-to-nearest adds
// (acc = 0; acc += x_0; acc += x_1; ...), which is bit for bit the result of the CPU
// AllReduceSum on the same inputs.
//
// Thread-safety: a communicator is used by one thread at a time (its owner's training thread).
#ifndef BAGPIPE_SYNC_NCCL_COMMUNICATOR_H_
#define BAGPIPE_SYNC_NCCL_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sync/collectives.h"
#include "sync/transport.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct ncclComm;     // ncclComm_t is ncclComm*

namespace bagpipe {

class NcclCommunicator {
 public:
  // Collective over `group`: every member calls it with the same group, on a thread where it
  // may use CUDA device `device` (its GPU). Waits at most `timeout` for the peers, for the setup
  // messages and again for NCCL's initialisation. Returns nullptr, with the reason in
  // `*unusable`, on every member alike when NCCL cannot serve the group (two members on one
  // GPU); the caller then uses the Transport path (sync/collectives.h).
  // REQUIRES: group.size() >= 1; unusable != nullptr.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(Transport& transport,
                                                                  const Group& group, int device,
                                                                  absl::Duration timeout,
                                                                  std::string* unusable);
  // A communicator whose only member is this process on `device` (no transport needed).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateSingle(int device,
                                                                        absl::Duration timeout);

  // Finalises and destroys the communicator (aborts it if finalising does not finish in time).
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int members() const { return members_; }
  int me() const { return me_; }

  // In-place sum over the members of `count` floats at `device_data` (memory of this member's
  // GPU), ordered after the work already queued on `stream`; returns when the result is in
  // `device_data`. Every member calls it with the same count and mode, in the same order.
  // `deterministic`: see the file comment. Waits at most `timeout`; on timeout or NCCL error
  // the communicator is aborted and the error returned (later calls fail with it too).
  absl::Status AllReduceSum(float* device_data, size_t count, CUstream_st* stream,
                            bool deterministic, absl::Duration timeout);
  // The same, returning once the collective is queued on `stream` (the non-blocking
  // communicator has enqueued it): the result is in `device_data` for work queued on `stream`
  // afterwards, and no host thread waits for it. A peer that never joins leaves the stream
  // stuck: the caller bounds its own waits on the stream (DeviceContext::set_sync_timeout), and
  // destroying the communicator aborts it.
  absl::Status EnqueueAllReduceSum(float* device_data, size_t count, CUstream_st* stream,
                                   bool deterministic, absl::Duration timeout);

 private:
  NcclCommunicator(ncclComm* comm, int device, int members, int me, absl::Duration timeout,
                   std::string name)
      : comm_(comm),
        device_(device),
        members_(members),
        me_(me),
        timeout_(timeout),
        name_(std::move(name)) {}
  // Polls until the NCCL calls issued so far are enqueued and, if `stream_too`, `stream` is
  // idle; aborts the communicator at `deadline`. `what` names the operation in errors.
  absl::Status Wait(CUstream_st* stream, bool stream_too, absl::Time deadline, const char* what);
  // Aborts the communicator and remembers `why` as the status of every later call.
  absl::Status Fail(absl::Status why);

  ncclComm* comm_;
  const int device_;
  const int members_;
  const int me_;
  const absl::Duration timeout_;  // bounds the wait for finalisation in the destructor
  const std::string name_;        // "trainer group of 4 (member 1)", for errors
  absl::Status failed_;           // set once the communicator was aborted
  float* scratch_ = nullptr;      // [members x scratch_count_] device floats (deterministic mode)
  size_t scratch_count_ = 0;
};

namespace internal {

// The deterministic reduction kernel, exposed for tests: out[i] = sum over m in 0..members-1,
// in that order, from +0.0f, of gathered[m * count + i] (round-to-nearest adds). All pointers are
// device memory of the current device; `out` may alias a member's slice (element i is read and
// written by one thread only). Queued on `stream`; does not wait.
absl::Status FixedOrderSumOnDevice(const float* gathered, int members, size_t count, float* out,
                                   CUstream_st* stream);

}  // namespace internal
}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_NCCL_COMMUNICATOR_H_
