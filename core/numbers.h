// Numbers people write in flags and specs: decimal only.
#ifndef BAGPIPE_CORE_NUMBERS_H_
#define BAGPIPE_CORE_NUMBERS_H_

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace bagpipe {

// absl::SimpleAtod, but a hexadecimal float ("0x1p3", which strtod reads as 8) is refused, as
// the command line's numeric flags refuse it: a spec's number means what it says in decimal.
inline bool ParseDecimalDouble(absl::string_view text, double* out) {
  absl::string_view body = absl::StripAsciiWhitespace(text);
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body.size() > 1 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X')) return false;
  return absl::SimpleAtod(text, out);
}

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_NUMBERS_H_
