// Llama's kernels over TypedPtr buffers, as kernels/typed.h has the others: each checks its
// buffers' dtypes and calls the CPU kernel (kernels/cpu/llama_kernels.h). fp32 storage only for
// now; other dtypes, and calls inside a CUDA kern::DeviceScope (no CUDA twins yet), are a
// ds::Error (invalid usage) naming the kernel.
#pragma once

#include <cstdint>

#include "common/error.h"
#include "core/typed_ptr.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/dispatch.h"

namespace ds::rt::kern::llama {

namespace detail {
inline float* f32(TypedPtr p, const char* what) {
  if (on_cuda()) throw invalid_usage("{}: the Llama kernels run on the CPU only (no CUDA twins yet)", what);
  if (p.data != nullptr && p.dtype != DType::kF32) {
    throw invalid_usage("{}: {} storage is not supported yet for the Llama kernels (fp32 only)", what,
                        dtype_name(p.dtype));
  }
  return static_cast<float*>(p.data);
}
}  // namespace detail
#define DS_F32(p) ::ds::rt::kern::llama::detail::f32((p), __func__)

inline void rmsnorm_forward(TypedPtr out, float* rstd, TypedPtr inp, TypedPtr weight, int64_t N, int C, float eps) {
  cpu::rmsnorm_forward(DS_F32(out), rstd, DS_F32(inp), DS_F32(weight), N, C, eps);
}
inline void rmsnorm_backward(TypedPtr dinp, TypedPtr dweight, TypedPtr dout, TypedPtr inp, TypedPtr weight,
                             const float* rstd, int64_t N, int C) {
  cpu::rmsnorm_backward(DS_F32(dinp), DS_F32(dweight), DS_F32(dout), DS_F32(inp), DS_F32(weight), rstd, N, C);
}
inline void rope_forward(TypedPtr x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                         int offset) {
  cpu::rope_forward(DS_F32(x), cos, sin, B, T, heads, hd, stride, offset);
}
inline void rope_backward(TypedPtr dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                          int stride, int offset) {
  cpu::rope_backward(DS_F32(dx), cos, sin, B, T, heads, hd, stride, offset);
}
inline void swiglu_forward(TypedPtr out, TypedPtr gu, int64_t N, int I) {
  cpu::swiglu_forward(DS_F32(out), DS_F32(gu), N, I);
}
inline void swiglu_backward(TypedPtr dgu, TypedPtr dout, TypedPtr gu, int64_t N, int I) {
  cpu::swiglu_backward(DS_F32(dgu), DS_F32(dout), DS_F32(gu), N, I);
}
inline void attention_gqa_forward(TypedPtr out, float* lse, TypedPtr qkv, float* scratch, int B, int T, int NH,
                                  int KV, int hd) {
  cpu::attention_gqa_forward(DS_F32(out), lse, DS_F32(qkv), scratch, B, T, NH, KV, hd);
}
inline void attention_gqa_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out, const float* lse,
                                   float* scratch, int B, int T, int NH, int KV, int hd) {
  cpu::attention_gqa_backward(DS_F32(dqkv), DS_F32(dout), DS_F32(qkv), DS_F32(out), lse, scratch, B, T, NH, KV, hd);
}

#undef DS_F32

}  // namespace ds::rt::kern::llama
