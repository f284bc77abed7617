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

// `text` (a path, a name) made safe to print whole: valid UTF-8 text and printable ASCII stay as
// they are; tab, CR and LF become \t, \r and \n (LF stays a line break when `keep_newlines`);
// every other control character (C0, DEL, C1: a terminal's escape sequences start with them) and
// every byte that is not part of valid UTF-8 become \xNN. Backslashes stay as they are.
std::string Printable(absl::string_view text, bool keep_newlines = false);

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_EXCERPT_H_
