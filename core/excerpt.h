// Excerpts of untrusted text for messages: input files and flags may hold megabyte-long fields,
// control characters (CR, NUL), a UTF-8 byte order mark or arbitrary bytes, and an error that
// echoes them must stay short and show every byte visibly.
#ifndef BAGPIPE_CORE_EXCERPT_H_
#define BAGPIPE_CORE_EXCERPT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace bagpipe {

inline constexpr size_t kExcerptBytes = 40;

// The start of `text`, C-escaped (\r, \n, \t, \", \', \\; every other byte outside printable
// ASCII — NUL, other control characters, UTF-8 sequences — as \xNN) and cut to at most
// `max_bytes` escaped bytes, followed by "... (N bytes)" when `text` was cut. The result holds
// printable ASCII only and is at most max_bytes + 30 bytes long, whatever bytes `text` holds.
std::string Excerpt(absl::string_view text, size_t max_bytes = kExcerptBytes);

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_EXCERPT_H_
