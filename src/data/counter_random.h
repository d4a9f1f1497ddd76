// Counter-based randomness for the data pipelines: every draw is a hash of
// (seed, stream, epoch, counter), so a loader carries no generator state and
// any batch can be made on its own, on any thread, in any order (and a
// resumed run draws what it would have drawn).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace nabla::data {

// splitmix64's finaliser: a bijection that mixes every input bit into every
// output bit.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

inline uint64_t draw(uint64_t seed, uint64_t stream, int64_t epoch, int64_t counter) {
  uint64_t h = mix64(seed + kGolden);
  h = mix64(h ^ (stream * kGolden));
  h = mix64(h ^ static_cast<uint64_t>(epoch));
  return mix64(h ^ static_cast<uint64_t>(counter));
}

// Uniform in [0, n): the top 64 bits of a 128-bit product (bias below n / 2^64).
inline int64_t below(uint64_t r, int64_t n) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(n)) >> 64);
}

// Fisher-Yates over `order` in place, draw i picking the element that lands
// at i: the same order on every platform (std::shuffle's is the library's).
inline void shuffle(std::vector<int64_t>& order, uint64_t seed, uint64_t stream, int64_t epoch) {
  for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i) {
    std::swap(order[size_t(i)], order[size_t(below(draw(seed, stream, epoch, i), i + 1))]);
  }
}

}  // namespace nabla::data
