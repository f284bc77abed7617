#include "trainer_hooks/options_agreement.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_fields.h"
#include "core/optimizer.h"
#include "core/status.h"
#include "oracle/planner.h"

namespace bagpipe {
namespace {

// A value as it reads in a message: numbers as %g, strings escaped, everything cut short.
std::string Show(const nlohmann::json& value) {
  std::string text;
  if (value.is_number_float()) {
    text = absl::StrFormat("%g", value.get<double>());
  } else if (value.is_string()) {
    text = absl::StrCat("'", absl::CHexEscape(value.get<std::string>()), "'");
  } else if (value.is_null()) {
    text = "(not set)";
  } else {
    text = DumpJson(value);
  }
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = absl::StrCat(text.substr(0, kMax), "...");
  return text;
}

// Rank 0's verdict on every rank's options: empty when all agree.
std::string Compare(const std::vector<nlohmann::json>& by_rank) {
  const nlohmann::json& mine = by_rank[0];
  // Every option named by any rank, in order.
  std::map<std::string, bool> names;
  for (const nlohmann::json& options : by_rank) {
    for (auto it = options.begin(); it != options.end(); ++it) names[it.key()] = true;
  }
  std::vector<std::string> differences;
  for (const auto& [name, unused] : names) {
    const nlohmann::json reference = mine.contains(name) ? mine[name] : nlohmann::json();
    // Ranks grouped by their differing value.
    std::vector<std::pair<nlohmann::json, std::vector<int>>> groups;
    for (size_t r = 1; r < by_rank.size(); ++r) {
      const nlohmann::json value = by_rank[r].contains(name) ? by_rank[r][name] : nlohmann::json();
      if (value == reference) continue;
      auto group = std::find_if(groups.begin(), groups.end(),
                                [&](const auto& g) { return g.first == value; });
      if (group == groups.end()) {
        groups.push_back({value, {}});
        group = groups.end() - 1;
      }
      group->second.push_back(static_cast<int>(r));
    }
    if (groups.empty()) continue;
    std::vector<std::string> others;
    for (const auto& [value, ranks] : groups) {
      others.push_back(absl::StrCat(Show(value), " on rank", ranks.size() > 1 ? "s " : " ",
                                    absl::StrJoin(ranks, ", ")));
    }
    differences.push_back(absl::StrCat(name, " is ", Show(reference), " on rank 0 but ",
                                       absl::StrJoin(others, ", ")));
  }
  if (differences.empty()) return "";
  constexpr size_t kShown = 8;
  const size_t more = differences.size() > kShown ? differences.size() - kShown : 0;
  if (more > 0) differences.resize(kShown);
  return absl::StrCat(
      "the ranks of this mpirun job were started with different options (every rank must get "
      "the same): ",
      absl::StrJoin(differences, "; "), more > 0 ? absl::StrCat("; and ", more, " more") : "");
}

}  // namespace

nlohmann::json OptionsThatMustAgree(const JobOptions& options) {
  const TrainerOptions& trainer = options.trainer;
  const PlannerOptions& planner = options.oracle.planner;
  nlohmann::json agreed = {
      {"--servers", options.layout.servers},
      {"--trainers (from the world size)", options.layout.trainers},
      {"--dim", trainer.dim},
      {"--optimizer", std::string(OptimizerName(trainer.sparse_optimizer.kind))},
      {"--lr", trainer.sparse_optimizer.learning_rate},
      {"--eps", trainer.sparse_optimizer.eps},
      {"--initial-accumulator", trainer.sparse_optimizer.initial_accumulator},
      {"--cache", std::string(CachePolicyName(trainer.policy))},
      {"--cache-rows", trainer.cache_rows},
      {"--deterministic", trainer.deterministic},
      {"--seed", trainer.initializer.seed()},
      {"--data (table sizes)", planner.schema.table_rows},
      {"--lookahead", planner.lookahead},
      {"--writeback-horizon", planner.writeback_horizon},
      {"--iterations", options.oracle.max_iterations},
  };
  for (auto it = options.checkpoint.identity.begin(); it != options.checkpoint.identity.end();
       ++it) {
    agreed[it.key()] = it.value();
  }
  return agreed;
}

absl::Status CheckOptionsAgree(Transport& transport, const nlohmann::json& agreed,
                               absl::Duration timeout) {
  const std::string text = DumpJson(agreed);
  if (transport.rank() != 0) {
    RETURN_IF_ERROR(transport.Send(0, kTagOptions, Bytes(text.begin(), text.end())));
    ASSIGN_OR_RETURN(Message verdict, transport.Receive(0, kTagOptions, timeout));
    if (verdict.payload.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(std::string(verdict.payload.begin(), verdict.payload.end()));
  }
  std::vector<nlohmann::json> by_rank(transport.size());
  by_rank[0] = agreed;
  for (int r = 1; r < transport.size(); ++r) {
    ASSIGN_OR_RETURN(Message message, transport.Receive(r, kTagOptions, timeout));
    by_rank[r] = nlohmann::json::parse(message.payload.begin(), message.payload.end(), nullptr,
                                       /*allow_exceptions=*/false);
    if (!by_rank[r].is_object()) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent malformed job options"));
    }
  }
  const std::string verdict = Compare(by_rank);
  for (int r = 1; r < transport.size(); ++r) {
    RETURN_IF_ERROR(transport.Send(r, kTagOptions, Bytes(verdict.begin(), verdict.end())));
  }
  if (verdict.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(verdict);
}

}  // namespace bagpipe
