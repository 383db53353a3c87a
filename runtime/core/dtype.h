// Element types of the data plane (fp32, bf16, fp16) and scalar conversions between them.
// Conversions to the 16-bit types round to nearest, ties to even (as PyTorch and CUDA do); NaN
// stays NaN (quiet), values beyond the range become +-inf (fp16) as IEEE says.
// Deliberately not here: array conversion kernels (runtime/kernels/cpu/convert.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ds::rt {

enum class DType { kF32, kBF16, kF16 };

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
const char* dtype_name(DType t);  // "fp32", "bf16", "fp16"
// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"; invalid_argument otherwise.
DType parse_dtype(std::string_view s);

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

uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace ds::rt
