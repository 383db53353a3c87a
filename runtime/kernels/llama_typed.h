// Llama's kernels over TypedPtr buffers, as kernels/typed.h has the others: each checks its
// buffers' dtypes, switches once on them (DS_TYPED_CALL, kernels/typed_call.h: the storage types
// fp32, bf16, fp16, parameter gradients of the storage type or fp32) and calls the CPU template
// (kernels/cpu/llama_kernels.h). Statistics (rstd, lse, scratch) and the RoPE tables are float*.
// An unsupported dtype combination, and a call inside a CUDA kern::DeviceScope (the Llama kernels
// have no CUDA twins yet), is a ds::Error (invalid usage) naming the kernel.
#pragma once

#include <cstdint>

#include "common/error.h"
#include "core/typed_ptr.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/dispatch.h"
#include "kernels/typed_call.h"

namespace ds::rt::kern::llama {

namespace detail {
inline void cpu_only(const char* what) {
  if (on_cuda()) throw invalid_usage("{}: the Llama kernels run on the CPU only (no CUDA twins yet)", what);
}
}  // namespace detail

inline void rmsnorm_forward(TypedPtr out, float* rstd, TypedPtr inp, TypedPtr weight, int64_t N, int C, float eps) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("rmsnorm_forward", out.dtype, out.dtype,
                cpu::rmsnorm_forward(DS_AS(S, out), rstd, DS_AS(S, inp), DS_AS(S, weight), N, C, eps));
}
inline void rmsnorm_backward(TypedPtr dinp, TypedPtr dweight, TypedPtr dout, TypedPtr inp, TypedPtr weight,
                             const float* rstd, int64_t N, int C) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("rmsnorm_backward", dinp.dtype, dweight.dtype,
                cpu::rmsnorm_backward(DS_AS(S, dinp), DS_AS(G, dweight), DS_AS(S, dout), DS_AS(S, inp),
                                      DS_AS(S, weight), rstd, N, C));
}
inline void rope_forward(TypedPtr x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                         int offset) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("rope_forward", x.dtype, x.dtype,
                cpu::rope_forward(DS_AS(S, x), cos, sin, B, T, heads, hd, stride, offset));
}
inline void rope_backward(TypedPtr dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                          int stride, int offset) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("rope_backward", dx.dtype, dx.dtype,
                cpu::rope_backward(DS_AS(S, dx), cos, sin, B, T, heads, hd, stride, offset));
}
inline void swiglu_forward(TypedPtr out, TypedPtr gu, int64_t N, int I) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("swiglu_forward", out.dtype, out.dtype, cpu::swiglu_forward(DS_AS(S, out), DS_AS(S, gu), N, I));
}
inline void swiglu_backward(TypedPtr dgu, TypedPtr dout, TypedPtr gu, int64_t N, int I) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("swiglu_backward", dgu.dtype, dgu.dtype,
                cpu::swiglu_backward(DS_AS(S, dgu), DS_AS(S, dout), DS_AS(S, gu), N, I));
}
inline void attention_gqa_forward(TypedPtr out, float* lse, TypedPtr qkv, float* scratch, int B, int T, int NH,
                                  int KV, int hd) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("attention_gqa_forward", out.dtype, out.dtype,
                cpu::attention_gqa_forward(DS_AS(S, out), lse, DS_AS(S, qkv), scratch, B, T, NH, KV, hd));
}
inline void attention_gqa_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out, const float* lse,
                                   float* scratch, int B, int T, int NH, int KV, int hd) {
  detail::cpu_only(__func__);
  DS_TYPED_CALL("attention_gqa_backward", dqkv.dtype, dqkv.dtype,
                cpu::attention_gqa_backward(DS_AS(S, dqkv), DS_AS(S, dout), DS_AS(S, qkv), DS_AS(S, out), lse,
                                            scratch, B, T, NH, KV, hd));
}

}  // namespace ds::rt::kern::llama
