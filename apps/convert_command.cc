// bagpipe convert: any data source -> Bagpipe's binary columnar format.
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/command.h"
#include "core/status.h"
#include "data/binary_format.h"

namespace bagpipe {

Subcommand AddConvertCommand(CLI::App& root) {
  struct Flags {
    DataFlags data;
    std::string out;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "convert",
      "Convert a data source to the binary columnar format (checksummed, validated on read)");
  AddDataFlags(app, &flags->data);
  app->add_option("--out,-o", flags->out, "output file (written atomically)")->required();
  app->footer(kDataHelp);
  return {app, [flags]() -> absl::Status {
            // The output replaces a file atomically: naming the input would replace the source
            // with its conversion.
            const std::string& spec = flags->data.data;
            if (const size_t colon = spec.find(':');
                colon != std::string::npos && !absl::StartsWith(spec, "synthetic")) {
              std::error_code error;
              if (std::filesystem::equivalent(spec.substr(colon + 1), flags->out, error)) {
                return absl::InvalidArgumentError(absl::StrCat(
                    "--out '", flags->out, "' is the input file of --data '", spec,
                    "': the conversion would replace its source (write it elsewhere)"));
              }
            }
            ASSIGN_OR_RETURN(auto opened, OpenFromFlags(flags->data));
            auto source = WithProgress(std::move(opened), flags->data, "converting");
            ASSIGN_OR_RETURN(const ConvertStats stats, WriteBinary(*source, flags->out));
            const SourceStats read = source->stats();
            const double rate = stats.seconds > 0 ? 1 / stats.seconds : 0.0;
            const std::string speed =
                read.bytes > 0 ? absl::StrFormat("%.1f MB/s of input", read.bytes / 1e6 * rate)
                               : absl::StrFormat("%.0f samples/s", stats.samples * rate);
            std::printf("%s", absl::StrFormat("wrote %s: %d samples, %.1f MB in %.2f s (%s)\n",
                                              flags->out, stats.samples, stats.bytes_written / 1e6,
                                              stats.seconds, speed)
                                  .c_str());
            if (read.skipped_lines > 0) {
              std::printf("skipped %lld bad lines%s%s\n",
                          static_cast<long long>(read.skipped_lines),
                          read.first_errors.empty() ? "" : "; the first: ",
                          read.first_errors.empty() ? "" : read.first_errors[0].c_str());
            }
            if (stats.samples == 0) {
              std::fprintf(stderr,
                           "warning: %s yields no sample; bagpipe train refuses the empty file "
                           "written\n",
                           source->Describe().c_str());
            }
            return absl::OkStatus();
          }};
}

}  // namespace bagpipe
