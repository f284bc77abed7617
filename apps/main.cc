// bagpipe: one binary for every role and tool. See README.md ("The main job").
#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "apps/command.h"
#include "core/device.h"
#include "core/excerpt.h"
#include "core/logging.h"
#include "core/signals.h"
#include "core/status.h"
#include "core/version.h"

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f, which batch systems pass on) ends a process writing past it
  // with SIGXFSZ and no word; ignored, the write fails with EFBIG and the writer names the file
  // (as for a full disk), keeping the previous checkpoint. Python ignores it the same way.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App root(
      "Bagpipe C++: lookahead embedding cache and prefetch runtime for DLRM training "
      "with embedding tables on embedding servers.",
      "bagpipe");
  root.require_subcommand(1);
  root.set_version_flag("--version", [] {
    return std::string("bagpipe ") + BAGPIPE_VERSION + " (CUDA backend " +
           (bagpipe::CudaCompiledIn() ? "compiled in" : "not compiled in") + ")";
  });
  std::string log_level = "info";
  root.add_option("--log-level", log_level, "debug, info, warning or error")->capture_default_str();

  std::vector<bagpipe::Subcommand> commands = {
      bagpipe::AddTrainCommand(root),     bagpipe::AddCompareCommand(root),
      bagpipe::AddDataStatsCommand(root), bagpipe::AddConvertCommand(root),
      bagpipe::AddSimCommand(root),       bagpipe::AddTunablesCommand(root),
  };
  bagpipe::RequireDecimalNumbers(&root);
  try {
    root.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error (an unknown flag, a bad value) exits 2, as
    // bagpipe.parse_train_args and most tools do, rather than with CLI11's own codes (100+).
    // Its message echoes the value given: control characters are escaped (a terminal would act
    // on them), as in every other error.
    std::ostringstream errors;
    const int status = root.exit(e, std::cout, errors);
    std::fputs(bagpipe::Printable(errors.str(), /*keep_newlines=*/true).c_str(), stderr);
    return status == 0 ? 0 : 2;
  }
  bagpipe::LogLevel level;
  if (!bagpipe::ParseLogLevel(log_level, &level)) {
    std::fprintf(stderr, "bagpipe: error: --log-level '%s' is not debug, info, warning or error\n",
                 bagpipe::Printable(log_level).c_str());
    return 2;
  }
  bagpipe::SetLogLevel(level);
  for (const bagpipe::Subcommand& command : commands) {
    if (!command.app->parsed()) continue;
    // An exception escaping the command (an allocation the up-front estimates did not foresee,
    // a thread the process could not start) is its error, not std::terminate.
    absl::Status status = bagpipe::StatusOfCall([&] { return command.run(); });
    // The command is over: what is left is the process's exit, whose library teardown can
    // hang (OpenBLAS joins its threads, which spin when memory ran out), and the first Ctrl-C
    // or SIGTERM must end it, not be taken for a graceful stop of a job that is over.
    bagpipe::RestoreDefaultStopHandlers();
    if (absl::IsCancelled(status)) {
      // A job stopped on request (SIGINT/SIGTERM) that can be resumed: one line says how.
      std::fprintf(stderr, "bagpipe %s: %s\n", command.app->get_name().c_str(),
                   std::string(status.message()).c_str());
      return bagpipe::kStoppedExitStatus;
    }
    if (!status.ok()) {
      // Messages name paths and values from the command line and the data: their control
      // characters are escaped (a terminal would act on them), their line breaks kept.
      std::fprintf(stderr, "bagpipe %s: error: %s\n", command.app->get_name().c_str(),
                   bagpipe::Printable(status.message(), /*keep_newlines=*/true).c_str());
      return 1;
    }
    return 0;
  }
  return 2;
}
