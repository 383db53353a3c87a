// Scalar conversions between fp32 and the 16-bit floating-point types, the one definition every
// part of dstrain uses (the kernels' array conversions, core/dtype.h, the collectives' 16-bit
// reductions). Both round to nearest, ties to even (as PyTorch and CUDA do); NaN stays NaN
// (quiet); values beyond fp16's range become +-inf as IEEE says; fp16 subnormals are exact.
// Bit manipulation only: no F16C or AVX512-BF16 needed. Header-only.
#pragma once

#include <cstdint>
#include <cstring>

namespace ds {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal, value = a * 2^24 rounded to an integer.
    // Adding 0.5f (2^-1) aligns the mantissa so the FPU's round-to-nearest-even does the rest.
    const float v = bits_float(a) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(v) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23 to 10 bits.
  uint32_t r = a + 0xc8000fffu + ((a >> 13) & 1u);  // 0xc8000000 = -(112 << 23)
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24.
    const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return bits_float(sign | float_bits(v));
  }
  return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

}  // namespace ds
