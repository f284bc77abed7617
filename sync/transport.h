// The one communication interface every role speaks (docs/architecture.md).
//
// A job is a set of ranks: rank 0 is the data loader + oracle, ranks 1..S the embedding
// servers, ranks S+1..S+T the trainers (sync/roles.h). Ranks exchange tagged byte messages.
// Two implementations: InProcessHub (all ranks are threads of one process: the embedded
// default) and MpiTransport (one rank per MPI process, sync/mpi_transport.h). Everything above
// this interface is identical in both, so the embedded default exercises the distributed
// protocol.
//
// Ordering: messages from one rank to another with the same tag arrive in the order sent.
// Thread-safety: all methods may be called concurrently from any thread.
// Failure: Receive waits at most `timeout` and then returns DeadlineExceeded naming the rank it
// waited for; Abort() makes every pending and future Receive on every rank of the job fail with
// the given status, so a failure anywhere ends the job instead of hanging it.
#ifndef BAGPIPE_SYNC_TRANSPORT_H_
#define BAGPIPE_SYNC_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sync/wire.h"

namespace bagpipe {

inline constexpr int kAnySource = -1;
inline constexpr int kAnyTag = -1;

// Message tags of the Bagpipe protocol.
enum Tag : int {
  kTagPlan = 1,             // oracle -> trainer: a serialised TrainerPlan (or end of stream)
  kTagPlanCredit = 2,       // trainer -> oracle: one more plan may be sent
  kTagFetchRequest = 3,     // trainer -> server
  kTagFetchResponse = 4,    // server -> trainer
  kTagWriteBack = 5,        // trainer -> server (every boundary, possibly empty: a watermark)
  kTagGradients = 6,        // trainer <-> trainer: shared-row gradients needed next iteration
  kTagGradientsLater = 10,  // trainer <-> trainer: shared-row gradients exchanged in background
  kTagDense = 7,            // trainer <-> trainer: dense all-reduce chunks
  kTagControl = 8,          // shutdown, results, parameter dumps
  kTagBarrier = 9,
  kTagNcclSetup = 11,  // trainer <-> trainer: GPU identities and the NCCL unique id
  kTagCheckpoint =
      12,  // oracle <-> trainers: job start / resume state, the loop's checkpoint state
  kTagStopRequest = 13,  // any rank -> oracle: a stop signal arrived here (stop at a boundary)
  kTagHeartbeat = 14,    // any rank <-> rank 0: alive, or goodbye (transport-level, MpiTransport)
  kTagOptions = 15,      // any rank <-> rank 0: the options that must agree, and the verdict
  kTagRollCall = 16,     // any rank -> rank 0: arrived at the transport's set-up (MpiTransport)
  kTagSchema = 17,       // rank 0 -> every rank: the data's schema, or why it could not be read
  kTagTest = 100,        // reserved for tests
};

struct Message {
  int source = -1;
  int tag = 0;
  Bytes payload;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Queues `payload` for `destination`; returns once the transport owns it (not necessarily
  // delivered). Fails only when the job was aborted or the destination is invalid.
  virtual absl::Status Send(int destination, int tag, Bytes payload) = 0;

  // The next message with `tag` (or kAnyTag) from `source` (or kAnySource). Waits at most
  // `timeout`.
  virtual absl::StatusOr<Message> Receive(int source, int tag, absl::Duration timeout) = 0;

  // Fails the whole job with `why` (first call wins). Never blocks for long.
  virtual void Abort(const absl::Status& why) = 0;
  // Distributed transports: from now on every rank tells rank 0 that its process is alive
  // several times per `peer_timeout` / 2, and rank 0 aborts the job, naming the rank
  // (`describe(rank)`), as soon as one that has started stays silent that long: a stopped
  // (SIGSTOP) or hung process is named before its peers' receives time out and blame the rank
  // they were waiting for. A rank stops being watched when its transport is destroyed. A no-op
  // in-process (threads cannot stop alone) and for an infinite timeout.
  virtual void WatchLiveness(absl::Duration peer_timeout,
                             std::function<std::string(int rank)> describe) {}
  // The status the job was aborted with, OK if it was not.
  virtual absl::Status aborted() const = 0;
  // The ranks with a message of `tag` delivered here and not received yet, ascending. For
  // diagnosis: a peer that is waiting in a collective this rank has not joined has sent its
  // part already (e.g. kTagDense).
  virtual std::vector<int> SourcesWithPending(int tag) { return {}; }

  // For every rank, the machine it runs on, as a number shared by the ranks of one machine
  // (ranks that share memory). Default: every rank on one machine (threads of one process).
  virtual std::vector<int> NodeOfRanks() const { return std::vector<int>(size(), 0); }
};

// Messages delivered to one rank, waiting to be received. Shared by both implementations.
// Has internal synchronization.
class Mailbox {
 public:
  explicit Mailbox(int rank) : rank_(rank) {}
  // Makes `message` receivable at `deliver_at` (InfinitePast = now).
  void Deliver(Message message, absl::Time deliver_at = absl::InfinitePast());
  absl::StatusOr<Message> Receive(int source, int tag, absl::Duration timeout);
  void Poison(const absl::Status& why);
  // `source` will send nothing more (it ended its part of the job; `why` says how, e.g. its
  // error): a Receive naming `source` that finds no message from it fails at once, naming it
  // and `why`, instead of waiting for its timeout. Messages delivered before stay receivable.
  void MarkGone(int source, std::string why);
  // Transport::SourcesWithPending.
  std::vector<int> SourcesWithPending(int tag);

 private:
  struct Pending {
    Message message;
    absl::Time deliver_at;
    uint64_t seq;  // arrival order at this mailbox
  };
  const int rank_;
  // Guards the queues and the poison status; cv_ is signalled on every change.
  absl::Mutex mu_;
  absl::CondVar cv_;
  // Keyed by (source, tag); FIFO per key.
  absl::flat_hash_map<std::pair<int, int>, std::deque<Pending>> queues_ ABSL_GUARDED_BY(mu_);
  absl::Status poisoned_ ABSL_GUARDED_BY(mu_);
  // Sources that will send nothing more (MarkGone), with why.
  absl::flat_hash_map<int, std::string> gone_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

// Emulates a network link for messages to or from a set of ranks (the embedding servers), so
// that one machine shows what remote servers cost: each direction of each link delivers
// messages one after another at `bytes_per_second`, each `latency` after it left.
struct LinkModel {
  double bytes_per_second = 0;  // 0 = no emulation
  absl::Duration latency = absl::ZeroDuration();
  bool enabled() const { return bytes_per_second > 0 || latency > absl::ZeroDuration(); }
  // Parses "25Gbit/s,20us", "10GB/s,5us", "100Mbit/s" (latency optional), or "none".
  static absl::StatusOr<LinkModel> Parse(const std::string& text);
  std::string ToString() const;
};

// All ranks of a job as threads of one process. Create the hub, then hand endpoint(r) to the
// thread playing rank r. Endpoints live as long as the hub.
class InProcessHub {
 public:
  // `emulated` ranks (typically the servers) get `link` on every message to or from them.
  InProcessHub(int size, LinkModel link = {}, std::vector<int> emulated = {});
  ~InProcessHub();
  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;

  Transport& endpoint(int rank);
  int size() const { return static_cast<int>(endpoints_.size()); }

 private:
  class Endpoint;
  friend class Endpoint;
  absl::Time DeliveryTime(int source, int destination, size_t bytes);
  void AbortAll(const absl::Status& why);

  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  LinkModel link_;
  std::vector<bool> emulated_;
  // Guards the link schedule and the abort status.
  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<int, int>, absl::Time> link_free_at_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_TRANSPORT_H_
