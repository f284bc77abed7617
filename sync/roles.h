// Which rank plays which role (docs/architecture.md): rank 0 is the data loader + oracle, ranks
// 1..S the embedding servers, ranks S+1..S+T the trainers. The same layout is used by mpirun
// jobs (one process per rank) and by the embedded default (one thread per rank).
#ifndef BAGPIPE_SYNC_ROLES_H_
#define BAGPIPE_SYNC_ROLES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bagpipe {

enum class Role { kOracle, kServer, kTrainer };

struct JobLayout {
  int servers = 1;
  int trainers = 1;

  int size() const { return 1 + servers + trainers; }
  static constexpr int oracle_rank() { return 0; }
  int server_rank(int server) const { return 1 + server; }
  int trainer_rank(int trainer) const { return 1 + servers + trainer; }
  Role RoleOf(int rank) const;
  // Index of the server or trainer that `rank` is (0 for the oracle).
  int IndexOf(int rank) const;
  // "rank 3 (trainer 1)".
  std::string Describe(int rank) const;

  // Checks the layout and, when `world_size` > 0, that it matches the number of ranks mpirun
  // started ("mpirun -np 4 with --servers 2 --trainers 2 needs 1 + 2 + 2 = 5 ranks").
  absl::Status Validate(int world_size = 0) const;
};

// The index of trainer `trainer` among the trainers on its machine (`node_of_rank`: the machine
// of every rank, Transport::NodeOfRanks), in rank order: the GPU it takes there. Not the global
// trainer index: with `mpirun --map-by node` or an interleaved hostfile, trainers 0 and 2 may
// share a machine while trainer 1 runs on another.
int LocalTrainerIndex(const JobLayout& layout, int trainer, const std::vector<int>& node_of_rank);

}  // namespace bagpipe

#endif  // BAGPIPE_SYNC_ROLES_H_
