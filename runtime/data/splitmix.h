// SplitMix64 (Steele, Lea, Flood 2014), shared by the loaders' draws: the shuffle's permutations
// (loader.h) and the blend's choice of source (blend.h). Tiny, fast and fully specified, so every
// draw is the same on every platform and can be reproduced outside dstrain.
//
// Not a general random-number library: only the finaliser and the golden-ratio increment.
#pragma once

#include <cstdint>

namespace ds::rt::data {

// 2^64 / phi (the golden ratio), odd: SplitMix64's increment, and the step of the blend's Weyl
// sequence.
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;

// SplitMix64's finaliser: a bijection of uint64 that mixes every input bit into every output bit.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace ds::rt::data
