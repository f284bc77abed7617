// bagpipe tunables: the engine knobs read from the environment, with their current values.
#include <cstdio>

#include "apps/command.h"
#include "core/tunables.h"

namespace bagpipe {

Subcommand AddTunablesCommand(CLI::App& root) {
  CLI::App* app = root.add_subcommand(
      "tunables", "List the engine tunables (environment variables), defaults and current values");
  return {app, []() -> absl::Status {
            for (const TunableInfo& t : ListTunables()) {
              std::printf("%-32s %12lld (default %lld)  %s\n", t.env.c_str(),
                          static_cast<long long>(t.value), static_cast<long long>(t.default_value),
                          t.doc.c_str());
            }
            return absl::OkStatus();
          }};
}

}  // namespace bagpipe
