// Typed fields of untrusted JSON (file headers, messages from other ranks). nlohmann's
// get<int64_t>() converts a float such as 1e300 with an undefined cast and throws on a missing
// field or a wrong type; these return an error naming the field instead.
#ifndef BAGPIPE_CORE_JSON_FIELDS_H_
#define BAGPIPE_CORE_JSON_FIELDS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace bagpipe {

// Nesting that untrusted JSON may have (the product's own files nest a few levels).
inline constexpr int kMaxJsonDepth = 64;

// Parses untrusted JSON (a file, a message): a discarded value (is_discarded()) when `text` is not
// JSON or nests deeper than kMaxJsonDepth. nlohmann's copies, comparisons and dumps recurse once
// per level: a crafted document nested a hundred thousand levels deep would overflow the stack
// there, so such a document is refused here. *too_deep (may be null) tells the two apart.
nlohmann::json ParseUntrustedJson(std::string_view text, bool* too_deep = nullptr);

// value.dump(indent), except that bytes of strings that are not UTF-8 (a Latin-1 path or column
// name, which Linux and CSV files allow) are written as U+FFFD instead of throwing: nlohmann's
// dump throws type_error 316 there, which would end the process after the work is done.
// `ensure_ascii` escapes every non-ASCII character (\uXXXX).
std::string DumpJson(const nlohmann::json& value, int indent = -1, bool ensure_ascii = false);

// `value` as an int64: it must be a JSON integer within the int64 range. `what` names it in the
// error ("samples").
absl::StatusOr<int64_t> JsonToInt64(const nlohmann::json& value, absl::string_view what);

// Field `key` of `object` as an int64 (see JsonToInt64) or a string. REQUIRES: nothing; a
// non-object `object` or a missing key is an error.
absl::StatusOr<int64_t> JsonInt64(const nlohmann::json& object, absl::string_view key);
absl::StatusOr<std::string> JsonString(const nlohmann::json& object, absl::string_view key);

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_JSON_FIELDS_H_
