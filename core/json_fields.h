// Typed fields of untrusted JSON (file headers, messages from other ranks). nlohmann's
// get<int64_t>() converts a float such as 1e300 with an undefined cast and throws on a missing
// field or a wrong type; these return an error naming the field instead.
#ifndef BAGPIPE_CORE_JSON_FIELDS_H_
#define BAGPIPE_CORE_JSON_FIELDS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

// `value` as an int64: it must be a JSON integer within the int64 range. `what` names it in the
// error ("samples").
absl::StatusOr<int64_t> JsonToInt64(const nlohmann::json& value, absl::string_view what);

// Field `key` of `object` as an int64 (see JsonToInt64) or a string. REQUIRES: nothing; a
// non-object `object` or a missing key is an error.
absl::StatusOr<int64_t> JsonInt64(const nlohmann::json& object, absl::string_view key);
absl::StatusOr<std::string> JsonString(const nlohmann::json& object, absl::string_view key);

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_JSON_FIELDS_H_
