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
  int64_t min_value;
  int64_t max_value;
  int64_t value;
};

// Every tunable with its current value, in declaration order.
std::vector<TunableInfo> ListTunables();

// The value of environment variable `env` now: `default_value` when it is unset, and (with a
// warning naming the variable and the text) when it is not an integer in [min_value,
// max_value]. Each tunable reads its variable this way once, on first use.
int64_t ReadTunable(const char* env, int64_t default_value, int64_t min_value, int64_t max_value);

// X(function, environment variable, default, min, max, doc)
#define BAGPIPE_TUNABLES(X)                                                             \
  X(ReaderChunkBytes, "BAGPIPE_READER_CHUNK_BYTES", 4 << 20, 4096, int64_t{1} << 30,    \
    "bytes the Criteo reader reads and parses (in parallel) per refill")                \
  X(ProgressIntervalMs, "BAGPIPE_PROGRESS_INTERVAL_MS", 2000, 1, 86400000,              \
    "interval between plain progress lines when stderr is not a terminal")              \
  X(CheckpointTimeoutMs, "BAGPIPE_CHECKPOINT_TIMEOUT_MS", 3600000, 1, int64_t{1} << 40, \
    "time ranks wait while a checkpoint is written or a job resumes (shards, data "     \
    "skipped) before declaring a peer dead")                                            \
  X(TestKillInCheckpoint, "BAGPIPE_TEST_KILL_IN_CHECKPOINT", -1, -1, int64_t{1} << 62,  \
    "testing: rank 0 SIGKILLs itself while writing the checkpoint of this iteration, "  \
    "after every shard and before the manifest (-1: never)")                            \
  X(CpuStreamsMode, "BAGPIPE_CPU_STREAMS", 0, 0, 2,                                     \
    "how CPU device contexts run their streams: 0 synchronously, 1 as asynchronous "    \
    "executor threads (like a GPU), 2 as executors that run work only when waited for")

#define BAGPIPE_DECLARE_TUNABLE_(name, env, def, min, max, doc) int64_t name();
BAGPIPE_TUNABLES(BAGPIPE_DECLARE_TUNABLE_)
#undef BAGPIPE_DECLARE_TUNABLE_

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_TUNABLES_H_
