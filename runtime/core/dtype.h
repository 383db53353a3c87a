// Element types of the data plane (fp32, bf16, fp16), and the scalar conversions between them
// (defined once, in lib/common/half.h).
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

}  // namespace ds::rt
