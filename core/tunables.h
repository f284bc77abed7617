// Tunables: knobs that users rarely touch, declared once here with their environment variable,
// default and meaning (NCCL's param.h pattern). Each is read from the environment on first use
// and cached; `bagpipe tunables` lists them with their current values.
//
// Command-line flags cover what a user sets per run; tunables cover engine internals.
#ifndef BAGPIPE_CORE_TUNABLES_H_
#define BAGPIPE_CORE_TUNABLES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace bagpipe {

struct TunableInfo {
  std::string env;
  std::string doc;
  int64_t default_value;
  int64_t value;
};

// Every tunable with its current value, in declaration order.
std::vector<TunableInfo> ListTunables();

#define BAGPIPE_TUNABLES(X)                                                            \
  X(ReaderChunkBytes, "BAGPIPE_READER_CHUNK_BYTES", 8 << 20,                           \
    "bytes a text reader parses per parallel chunk")                                   \
  X(PlanQueueDepth, "BAGPIPE_PLAN_QUEUE_DEPTH", 8,                                     \
    "plans the oracle may have in flight per trainer beyond the prefetch distance")    \
  X(StagingSlots, "BAGPIPE_STAGING_SLOTS", 4,                                          \
    "iterations of fetched rows the prefetcher may hold in staging per trainer")       \
  X(PeerTimeoutMs, "BAGPIPE_PEER_TIMEOUT_MS", 120000,                                  \
    "default time a rank waits for a peer before declaring it dead (--peer-timeout)")  \
  X(ProgressIntervalMs, "BAGPIPE_PROGRESS_INTERVAL_MS", 2000,                          \
    "interval between plain progress lines when stderr is not a terminal")             \
  X(CheckpointTimeoutMs, "BAGPIPE_CHECKPOINT_TIMEOUT_MS", 3600000,                     \
    "time ranks wait while a checkpoint is written or a job resumes (shards, data "    \
    "skipped) before declaring a peer dead")                                           \
  X(TestKillInCheckpoint, "BAGPIPE_TEST_KILL_IN_CHECKPOINT", -1,                       \
    "testing: rank 0 SIGKILLs itself while writing the checkpoint of this iteration, " \
    "after every shard and before the manifest (-1: never)")                           \
  X(CpuStreamsMode, "BAGPIPE_CPU_STREAMS", 0,                                          \
    "how CPU device contexts run their streams: 0 synchronously, 1 as asynchronous "   \
    "executor threads (like a GPU), 2 as executors that run work only when waited for")

#define BAGPIPE_DECLARE_TUNABLE_(name, env, def, doc) int64_t name();
BAGPIPE_TUNABLES(BAGPIPE_DECLARE_TUNABLE_)
#undef BAGPIPE_DECLARE_TUNABLE_

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_TUNABLES_H_
