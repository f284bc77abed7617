// Overflow-checked arithmetic for sizes and offsets read from files or the network: a crafted
// header must not turn `count * width` into a small (or negative) number that passes a bounds
// check and then drives an allocation or a copy.
#ifndef BAGPIPE_CORE_CHECKED_MATH_H_
#define BAGPIPE_CORE_CHECKED_MATH_H_

#include <cstdint>
#include <optional>

namespace bagpipe {

// a * b, or nullopt when it overflows int64.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt when it overflows int64.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// True when [offset, offset + bytes) lies inside [0, limit); every argument may be hostile.
inline bool RangeInside(int64_t offset, int64_t bytes, int64_t limit) {
  if (offset < 0 || bytes < 0 || limit < 0) return false;
  const std::optional<int64_t> end = CheckedAdd(offset, bytes);
  return end.has_value() && *end <= limit;
}

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_CHECKED_MATH_H_
