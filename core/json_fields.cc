#include "core/json_fields.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bagpipe {
namespace {

const nlohmann::json* Field(const nlohmann::json& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

absl::Status Missing(absl::string_view key) {
  return absl::InvalidArgumentError(absl::StrCat("missing field \"", key, "\""));
}

}  // namespace

std::string DumpJson(const nlohmann::json& value, int indent, bool ensure_ascii) {
  return value.dump(indent, ' ', ensure_ascii, nlohmann::json::error_handler_t::replace);
}

nlohmann::json ParseUntrustedJson(std::string_view text, bool* too_deep) {
  bool deep = false;
  // The callback sees every value with its depth; a value too deep is dropped, not built.
  nlohmann::json value = nlohmann::json::parse(
      text,
      [&deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > kMaxJsonDepth) deep = true;
        return !deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep != nullptr) *too_deep = deep;
  if (deep) return nlohmann::json(nlohmann::json::value_t::discarded);
  return value;
}

absl::StatusOr<int64_t> JsonToInt64(const nlohmann::json& value, absl::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", what, "\" is ", u, ", beyond the int64 range"));
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return absl::InvalidArgumentError(
      absl::StrCat("\"", what, "\" is a ", value.type_name(), ", not an integer"));
}

absl::StatusOr<int64_t> JsonInt64(const nlohmann::json& object, absl::string_view key) {
  const nlohmann::json* field = Field(object, key);
  if (field == nullptr) return Missing(key);
  return JsonToInt64(*field, key);
}

absl::StatusOr<std::string> JsonString(const nlohmann::json& object, absl::string_view key) {
  const nlohmann::json* field = Field(object, key);
  if (field == nullptr) return Missing(key);
  if (!field->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" is a ", field->type_name(), ", not a string"));
  }
  return field->get<std::string>();
}

}  // namespace bagpipe
