#include "model/loop_state.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checked_math.h"
#include "core/json_fields.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

absl::Status CheckDenseLoopStateFinite(const DenseLoopState& state) {
  auto check = [](const std::vector<float>& values, const char* what) -> absl::Status {
    for (size_t k = 0; k < values.size(); ++k) {
      if (!std::isfinite(values[k])) {
        return absl::FailedPreconditionError(
            absl::StrFormat("dense %s %d of %d is %f", what, k, values.size(), values[k]));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check(state.parameters, "parameter"));
  return check(state.optimizer_state, "optimizer value");
}

std::string EncodeDenseLoopState(const DenseLoopState& state) {
  nlohmann::json header = {{"parameters", state.parameters.size()},
                           {"optimizer_state", state.optimizer_state.size()},
                           {"global_samples", state.global_samples}};
  if (state.metrics_first_lines.has_value()) {
    header["metrics_first_lines"] = *state.metrics_first_lines;
  }
  std::string out = header.dump();
  out += '\n';
  out.append(reinterpret_cast<const char*>(state.parameters.data()),
             state.parameters.size() * sizeof(float));
  out.append(reinterpret_cast<const char*>(state.optimizer_state.data()),
             state.optimizer_state.size() * sizeof(float));
  return out;
}

absl::StatusOr<DenseLoopState> DecodeDenseLoopState(std::string_view bytes) {
  auto bad = [](const std::string& why) {
    return absl::DataLossError(absl::StrCat("the checkpoint's loop state ", why));
  };
  const size_t newline = bytes.find('\n');
  if (newline == std::string_view::npos) return bad("has no header line");
  const nlohmann::json header = ParseUntrustedJson(bytes.substr(0, newline));
  if (header.is_discarded() || !header.is_object()) return bad("has no valid header");
  auto field = [&](const char* key) -> absl::StatusOr<int64_t> {
    absl::StatusOr<int64_t> value = JsonInt64(header, key);
    if (!value.ok()) return bad(absl::StrCat("header: ", value.status().message()));
    return value;
  };
  ASSIGN_OR_RETURN(const int64_t parameters, field("parameters"));
  ASSIGN_OR_RETURN(const int64_t optimizer, field("optimizer_state"));
  ASSIGN_OR_RETURN(const int64_t global_samples, field("global_samples"));
  const std::string_view body = bytes.substr(newline + 1);
  const std::optional<int64_t> floats = CheckedAdd(parameters, optimizer);
  const std::optional<int64_t> expected =
      floats.has_value() ? CheckedMul(*floats, sizeof(float)) : std::nullopt;
  if (parameters < 0 || optimizer < 0 || global_samples < 0 || !expected.has_value() ||
      static_cast<uint64_t>(*expected) != body.size()) {
    return bad(absl::StrFormat(
        "has the wrong size: %d bytes after its header for %d parameters and %d optimizer "
        "values (global_samples %d)",
        body.size(), parameters, optimizer, global_samples));
  }
  DenseLoopState state;
  state.global_samples = global_samples;
  if (header.contains("metrics_first_lines")) {
    const nlohmann::json& lines = header["metrics_first_lines"];
    if (!lines.is_array() || lines.size() > 64) {
      return bad("header: metrics_first_lines is not a list of at most 64 CRC32Cs");
    }
    state.metrics_first_lines.emplace();
    for (const nlohmann::json& line : lines) {
      ASSIGN_OR_RETURN(const int64_t crc, JsonToInt64(line, "metrics_first_lines"));
      if (crc < 0 || crc > std::numeric_limits<uint32_t>::max()) {
        return bad(absl::StrCat("header: metrics_first_lines holds ", crc, ", no CRC32C"));
      }
      state.metrics_first_lines->push_back(crc);
    }
  }
  state.parameters.resize(static_cast<size_t>(parameters));
  state.optimizer_state.resize(static_cast<size_t>(optimizer));
  const size_t parameter_bytes = state.parameters.size() * sizeof(float);
  if (parameter_bytes > 0) std::memcpy(state.parameters.data(), body.data(), parameter_bytes);
  if (!state.optimizer_state.empty()) {
    std::memcpy(state.optimizer_state.data(), body.data() + parameter_bytes,
                state.optimizer_state.size() * sizeof(float));
  }
  const absl::Status finite = CheckDenseLoopStateFinite(state);
  if (!finite.ok()) {
    return bad(absl::StrCat("is not finite (", finite.message(),
                            "): it was saved after the training diverged; resume from an earlier "
                            "checkpoint, with a lower learning rate"));
  }
  return state;
}

}  // namespace bagpipe
