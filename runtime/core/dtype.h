// Element types of the data plane (fp32, bf16, fp16), the C++ types that hold them (float, bf16,
// f16: a 16-bit value in a struct of its own, so a bf16 buffer and an fp16 buffer are different
// pointer types and a template can tell them apart), and the scalar conversions between them
// (defined once, in lib/common/half.h): to_f32(x) and from_f32<S>(f).
// Deliberately not here: array conversion kernels (runtime/kernels/cpu/convert.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/half.h"

namespace ds::rt {

enum class DType { kF32, kBF16, kF16 };

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
const char* dtype_name(DType t);  // "fp32", "bf16", "fp16"
// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"; invalid_argument otherwise.
DType parse_dtype(std::string_view s);

// The scalar conversions (lib/common/half.h), in this namespace too.
using ds::bf16_to_f32;
using ds::bits_float;
using ds::f16_to_f32;
using ds::f32_to_bf16;
using ds::f32_to_f16;
using ds::float_bits;

// The storage types of the kernels' templates (runtime/kernels/cpu/kernels.h). Trivial, 2 bytes,
// the bit pattern of the value: a buffer of them is exactly the bytes llm.c, PyTorch and CUDA use.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);

inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_f32(x.bits); }
inline float to_f32(f16 x) { return f16_to_f32(x.bits); }

// The nearest S to f (round to nearest even; fp32 is f itself).
template <typename S>
S from_f32(float f);
template <>
inline float from_f32<float>(float f) { return f; }
template <>
inline bf16 from_f32<bf16>(float f) { return bf16{f32_to_bf16(f)}; }
template <>
inline f16 from_f32<f16>(float f) { return f16{f32_to_f16(f)}; }

// The DType of a storage type.
template <typename S>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<bf16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<f16> {
  static constexpr DType value = DType::kF16;
};
template <typename S>
inline constexpr DType dtype_of = DTypeOf<S>::value;

}  // namespace ds::rt
