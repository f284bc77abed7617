#include "cache/pooling.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/excerpt.h"

namespace bagpipe {

std::string_view PoolingName(PoolingMode mode) {
  return mode == PoolingMode::kMean ? "mean" : "sum";
}

absl::StatusOr<PoolingMode> ParsePoolingMode(std::string_view text) {
  const std::string lower = absl::AsciiStrToLower(std::string(text));
  if (lower == "sum") return PoolingMode::kSum;
  if (lower == "mean") return PoolingMode::kMean;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown pooling '", Excerpt(absl::string_view(text.data(), text.size())),
                   "' (expected sum or mean)"));
}

}  // namespace bagpipe
