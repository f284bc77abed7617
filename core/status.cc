#include "core/status.h"

namespace bagpipe {

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(std::string(context), ": ", status.message()));
}

}  // namespace bagpipe
