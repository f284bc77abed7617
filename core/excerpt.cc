#include "core/excerpt.h"

#include <algorithm>
#include <cstdint>

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

namespace {

// The length of the valid UTF-8 sequence that starts `text` (shortest form, no surrogates, at
// most U+10FFFF) and its code point; 0 if it does not start with one.
size_t Utf8Sequence(absl::string_view text, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(0);
  size_t length;
  uint32_t value;
  uint32_t least;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2, value = lead & 0x1f, least = 0x80;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3, value = lead & 0x0f, least = 0x800;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4, value = lead & 0x07, least = 0x10000;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xc0) != 0x80) return 0;
    value = (value << 6) | (byte(k) & 0x3f);
  }
  if (value < least || value > 0x10ffff || (value >= 0xd800 && value <= 0xdfff)) return 0;
  *code_point = value;
  return length;
}

}  // namespace

std::string Printable(absl::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (size_t k = 0; k < text.size();) {
    const uint8_t c = static_cast<uint8_t>(text[k]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
      ++k;
      continue;
    }
    if (c == '\n' && keep_newlines) {
      out.push_back('\n');
      ++k;
      continue;
    }
    uint32_t code_point = 0;
    const size_t length = c >= 0x80 ? Utf8Sequence(text.substr(k), &code_point) : 0;
    if (length > 0 && code_point >= 0xa0) {  // U+0080..U+009F are the C1 controls
      out.append(text.data() + k, length);
      k += length;
      continue;
    }
    switch (c) {
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
    ++k;
  }
  return out;
}

}  // namespace bagpipe
