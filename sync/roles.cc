#include "sync/roles.h"

#include "absl/strings/str_cat.h"

namespace bagpipe {

Role JobLayout::RoleOf(int rank) const {
  if (rank == 0) return Role::kOracle;
  if (rank <= servers) return Role::kServer;
  return Role::kTrainer;
}

int JobLayout::IndexOf(int rank) const {
  switch (RoleOf(rank)) {
    case Role::kOracle:
      return 0;
    case Role::kServer:
      return rank - 1;
    case Role::kTrainer:
      return rank - 1 - servers;
  }
  return 0;
}

std::string JobLayout::Describe(int rank) const {
  switch (RoleOf(rank)) {
    case Role::kOracle:
      return absl::StrCat("rank ", rank, " (oracle)");
    case Role::kServer:
      return absl::StrCat("rank ", rank, " (server ", IndexOf(rank), ")");
    case Role::kTrainer:
      return absl::StrCat("rank ", rank, " (trainer ", IndexOf(rank), ")");
  }
  return absl::StrCat("rank ", rank);
}

absl::Status JobLayout::Validate(int world_size) const {
  if (servers < 1) return absl::InvalidArgumentError("--servers must be at least 1");
  if (trainers < 1) return absl::InvalidArgumentError("--trainers must be at least 1");
  if (trainers > 64) {
    return absl::InvalidArgumentError(
        "--trainers must be at most 64 (the oracle tracks row "
        "holders in a 64-bit mask)");
  }
  if (world_size > 0 && world_size != size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mpirun started ", world_size, " ranks but --servers ", servers,
                     " --trainers ", trainers, " needs 1 + ", servers, " + ", trainers, " = ",
                     size(), " (rank 0 oracle, then the servers, then the trainers)"));
  }
  return absl::OkStatus();
}

int LocalTrainerIndex(const JobLayout& layout, int trainer, const std::vector<int>& node_of_rank) {
  const auto node_of = [&](int rank) {
    return rank < static_cast<int>(node_of_rank.size()) ? node_of_rank[rank] : 0;
  };
  const int node = node_of(layout.trainer_rank(trainer));
  int index = 0;
  for (int t = 0; t < trainer; ++t) index += node_of(layout.trainer_rank(t)) == node ? 1 : 0;
  return index;
}

}  // namespace bagpipe
