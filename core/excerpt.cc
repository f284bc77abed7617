#include "core/excerpt.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace bagpipe {

std::string Excerpt(absl::string_view text, size_t max_bytes) {
  // The bound is on the escaped form, where a byte may take four ("\xff"). The escaped length
  // grows with the prefix, so the longest prefix that fits is found by bisection (escaping a
  // prefix as a whole keeps absl's context: a hex digit after "\xNN" is escaped too).
  size_t fits = 0;
  size_t over = std::min(text.size(), max_bytes) + 1;
  while (over - fits > 1) {
    const size_t mid = fits + (over - fits) / 2;
    if (absl::CHexEscape(text.substr(0, mid)).size() <= max_bytes) {
      fits = mid;
    } else {
      over = mid;
    }
  }
  std::string out = absl::CHexEscape(text.substr(0, fits));
  if (fits < text.size()) absl::StrAppend(&out, "... (", text.size(), " bytes)");
  return out;
}

}  // namespace bagpipe
