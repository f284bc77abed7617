#include "sync/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_checks.h"
#include "core/status.h"

namespace bagpipe {
namespace {

// How often a wait on NCCL work looks at the stream and the communicator.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);

// Replies of member 0 during setup.
constexpr uint8_t kSetupUseNccl = 1;   // followed by the ncclUniqueId bytes
constexpr uint8_t kSetupUnusable = 0;  // followed by the reason

std::string GroupName(int members, int me) {
  return absl::StrCat("trainer group of ", members, " (member ", me, ")");
}

// "host/PCI bus id" of `device`: two members with the same identity share a GPU.
absl::StatusOr<std::string> GpuIdentity(int device) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  char bus[64] = {};
  CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device));
  return absl::StrCat(host, "/", bus);
}

absl::Status ShortMessage(const Message& message) {
  return absl::DataLossError(absl::StrCat("NCCL setup message from rank ", message.source,
                                          " is malformed (", message.payload.size(), " bytes)"));
}

// Polls a non-blocking communicator until its last call finished (not ncclInProgress).
// Returns false at `deadline`; `*result` holds the last state.
bool PollComm(ncclComm_t comm, absl::Time deadline, ncclResult_t* result) {
  while (true) {
    const ncclResult_t rc = ncclCommGetAsyncError(comm, result);
    if (rc != ncclSuccess) *result = rc;
    if (*result != ncclInProgress) return true;
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(absl::ToChronoMicroseconds(kPollInterval));
  }
}

// Creates the non-blocking communicator of rank `me` of `members` and waits for it to be ready.
absl::StatusOr<ncclComm_t> InitComm(const ncclUniqueId& id, int members, int me, int device,
                                    absl::Duration timeout, const std::string& name) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const absl::Time deadline = absl::Now() + timeout;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, members, id, me, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return internal::NcclStatus(rc, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  ncclResult_t state = ncclSuccess;
  if (!PollComm(comm, deadline, &state)) {
    ncclCommAbort(comm);
    return absl::DeadlineExceededError(
        absl::StrCat(name, ": NCCL initialisation timed out after ", absl::FormatDuration(timeout),
                     " (a peer is missing or stuck); communicator aborted"));
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm);
    return internal::NcclStatus(state, "ncclCommInitRankConfig (async)", __FILE__, __LINE__);
  }
  return comm;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(Transport& transport,
                                                                           const Group& group,
                                                                           int device,
                                                                           absl::Duration timeout,
                                                                           std::string* unusable) {
  const int n = group.size();
  const int me = group.me;
  if (n < 1 || me < 0 || me >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: bad group (", n, " members, me ", me, ")"));
  }
  if (n == 1) return CreateSingle(device, timeout);
  const std::string name = GroupName(n, me);
  ASSIGN_OR_RETURN(const std::string identity, GpuIdentity(device));
  ncclUniqueId id;
  if (me != 0) {
    RETURN_IF_ERROR(
        transport.Send(group.ranks[0], kTagNcclSetup, Bytes(identity.begin(), identity.end())));
    ASSIGN_OR_RETURN(Message reply, transport.Receive(group.ranks[0], kTagNcclSetup, timeout));
    if (reply.payload.empty()) return ShortMessage(reply);
    if (reply.payload[0] == kSetupUnusable) {
      *unusable = std::string(reply.payload.begin() + 1, reply.payload.end());
      return std::unique_ptr<NcclCommunicator>();
    }
    if (reply.payload.size() != 1 + sizeof(id.internal)) return ShortMessage(reply);
    std::memcpy(id.internal, reply.payload.data() + 1, sizeof(id.internal));
  } else {
    // Member 0 decides for everyone: NCCL needs one GPU per member.
    std::vector<std::string> identities(n);
    identities[0] = identity;
    for (int m = 1; m < n; ++m) {
      ASSIGN_OR_RETURN(Message message, transport.Receive(group.ranks[m], kTagNcclSetup, timeout));
      identities[m] = std::string(message.payload.begin(), message.payload.end());
    }
    std::string why;
    absl::flat_hash_map<std::string, int> owner;
    for (int m = 0; m < n && why.empty(); ++m) {
      auto [it, inserted] = owner.emplace(identities[m], m);
      if (!inserted) {
        why = absl::StrCat("members ", it->second, " and ", m, " share GPU ", identities[m]);
      }
    }
    Bytes reply;
    if (why.empty()) {
      NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
      reply.push_back(kSetupUseNccl);
      reply.insert(reply.end(), id.internal, id.internal + sizeof(id.internal));
    } else {
      reply.push_back(kSetupUnusable);
      reply.insert(reply.end(), why.begin(), why.end());
    }
    for (int m = 1; m < n; ++m) {
      RETURN_IF_ERROR(transport.Send(group.ranks[m], kTagNcclSetup, reply));
    }
    if (!why.empty()) {
      *unusable = why;
      return std::unique_ptr<NcclCommunicator>();
    }
  }
  ASSIGN_OR_RETURN(ncclComm_t comm, InitComm(id, n, me, device, timeout, name));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, device, n, me, timeout, name));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateSingle(
    int device, absl::Duration timeout) {
  const std::string name = GroupName(1, 0);
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  ASSIGN_OR_RETURN(ncclComm_t comm, InitComm(id, 1, 0, device, timeout, name));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, device, 1, 0, timeout, name));
}

NcclCommunicator::~NcclCommunicator() {
  if (cudaSetDevice(device_) != cudaSuccess) return;  // the device is gone: nothing to release
  if (comm_ != nullptr) {
    // Finalise flushes outstanding work (non-blocking: poll, bounded); then destroy. A
    // communicator that does not finalise in time is aborted instead.
    ncclResult_t state = ncclCommFinalize(comm_);
    if (state == ncclInProgress && !PollComm(comm_, absl::Now() + timeout_, &state)) {
      state = ncclInProgress;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
}

absl::Status NcclCommunicator::Fail(absl::Status why) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  failed_ = why;
  return why;
}

absl::Status NcclCommunicator::Wait(CUstream_st* stream, bool stream_too, absl::Time deadline,
                                    const char* what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) state = rc;
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(Annotate(internal::NcclStatus(state, what, __FILE__, __LINE__),
                           absl::StrCat(name_, ": NCCL failed; communicator aborted")));
    }
    if (state == ncclSuccess) {
      const cudaError_t query = stream_too ? cudaStreamQuery(stream) : cudaSuccess;
      if (query == cudaSuccess) return absl::OkStatus();
      if (query != cudaErrorNotReady) {
        return Fail(Annotate(internal::CudaStatus(query, "cudaStreamQuery", __FILE__, __LINE__),
                             absl::StrCat(name_, ": ", what)));
      }
    }
    if (absl::Now() >= deadline) {
      return Fail(
          absl::DeadlineExceededError(absl::StrCat(name_, ": NCCL ", what,
                                                   " timed out (a peer is missing or stuck); "
                                                   "communicator aborted")));
    }
    std::this_thread::sleep_for(absl::ToChronoMicroseconds(kPollInterval));
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* device_data, size_t count, CUstream_st* stream,
                                            bool deterministic, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  RETURN_IF_ERROR(EnqueueAllReduceSum(device_data, count, stream, deterministic, timeout));
  if (count == 0) return absl::OkStatus();
  return Wait(stream, /*stream_too=*/true, deadline, "all-reduce");
}

absl::Status NcclCommunicator::EnqueueAllReduceSum(float* device_data, size_t count,
                                                   CUstream_st* stream, bool deterministic,
                                                   absl::Duration timeout) {
  if (!failed_.ok()) return failed_;
  if (count == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  if (!deterministic) {
    const ncclResult_t rc =
        ncclAllReduce(device_data, device_data, count, ncclFloat, ncclSum, comm_, stream);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      return Fail(internal::NcclStatus(rc, "ncclAllReduce", __FILE__, __LINE__));
    }
    return Wait(stream, /*stream_too=*/false, deadline, "all-reduce");
  }
  if (scratch_count_ < count) {
    // Grows once (the dense gradients keep their size); cudaFree waits for the device, so the
    // old scratch is not in use.
    if (scratch_ != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_count_ = 0;
    }
    CUDA_RETURN_IF_ERROR(
        cudaMalloc(&scratch_, static_cast<size_t>(members_) * count * sizeof(float)));
    scratch_count_ = count;
  }
  // Rank-major: member m's `count` floats land at scratch_ + m * count. The scratch is reused by
  // the next call on the same stream, after this one's sum.
  const ncclResult_t rc = ncclAllGather(device_data, scratch_, count, ncclFloat, comm_, stream);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    return Fail(internal::NcclStatus(rc, "ncclAllGather", __FILE__, __LINE__));
  }
  // Wait until NCCL enqueued the gather (non-blocking communicator) before queuing the sum
  // behind it; the stream orders the two on the device.
  RETURN_IF_ERROR(Wait(stream, /*stream_too=*/false, deadline, "all-gather"));
  return internal::FixedOrderSumOnDevice(scratch_, members_, count, device_data, stream);
}

}  // namespace bagpipe
