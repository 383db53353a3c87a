// Vectorisable elementwise math for the CPU kernels: plain arithmetic the compiler turns into
// SIMD (SSE2 baseline, AVX2/AVX-512 in target_clones functions), where libm's expf/tanhf would
// stay scalar without -ffast-math. Internal to runtime/kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

namespace ds::rt::cpu {

// exp(x) with < 2 ulp error for x in [-87, 88] (Cephes' expf polynomial, Cody-Waite reduction);
// inputs beyond are clamped (exp(-inf) gives ~1e-38, not 0: harmless for softmax sums).
inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick (no floor/round call).
  const float kMagic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  return y * scale;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): exact limits at +-inf, absolute error ~1e-7.
inline float vtanh(float x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }

}  // namespace ds::rt::cpu

// Multi-versioned hot loops: the loader picks the widest ISA the CPU has.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define DS_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DS_SIMD_CLONES
#endif
