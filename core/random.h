// Seeded, counter-based randomness.
//
// Everything random in Bagpipe is a pure function of (seed, coordinates): the same seed gives
// the same data, initial rows and model on any machine, thread count or rank layout, and a value
// can be computed without generating the ones before it (a server creates row r of table t
// without creating rows 0..r-1). The mixer is SplitMix64's finaliser, a bijection on 64 bits.
#ifndef BAGPIPE_CORE_RANDOM_H_
#define BAGPIPE_CORE_RANDOM_H_

#include <cstdint>
#include <limits>

namespace bagpipe {

// SplitMix64's output function: a well-mixed bijection of x.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A 64-bit key for coordinates (seed, a, b, c); distinct coordinates give unrelated keys.
constexpr uint64_t HashKey(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return Mix64(Mix64(Mix64(Mix64(seed) ^ a) ^ b) ^ c);
}

// Uniform double in [0, 1) from the top 53 bits.
constexpr double UnitDouble(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }
// Uniform float in [0, 1) from the top 24 bits.
constexpr float UnitFloat(uint64_t bits) { return static_cast<float>(bits >> 40) * 0x1.0p-24f; }

// A UniformRandomBitGenerator over a counter: the n-th draw is Mix64(key + n * golden), so a
// stream is reproducible from (key, position) and cheap to create per coordinate.
class CounterRng {
 public:
  using result_type = uint64_t;
  explicit constexpr CounterRng(uint64_t key, uint64_t counter = 0)
      : key_(key), counter_(counter) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  constexpr result_type operator()() { return Mix64(key_ ^ (counter_++ * 0xd1b54a32d192ed03ULL)); }
  constexpr double NextDouble() { return UnitDouble((*this)()); }
  constexpr float NextFloat() { return UnitFloat((*this)()); }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias < n / 2^64).
  uint64_t NextBelow(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>((*this)()) * n) >> 64);
  }

 private:
  uint64_t key_;
  uint64_t counter_;
};

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_RANDOM_H_
