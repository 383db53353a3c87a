// dtype names.
#include "core/dtype.h"

#include "common/error.h"

namespace ds::rt {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "float32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "float16") return DType::kF16;
  throw invalid_argument("unknown dtype '{}': expected fp32, bf16 or fp16", s);
}

}  // namespace ds::rt
