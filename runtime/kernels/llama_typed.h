// Llama's kernels over TypedPtr buffers, as kernels/typed.h has the others: each checks its
// buffers' dtypes, switches once on them (DS_TYPED_CALL, kernels/typed_call.h: the storage types
// fp32, bf16, fp16, parameter gradients of the storage type or fp32) and calls the typed kernel
// below, which runs the CPU template (kernels/cpu/llama_kernels.h) or, while the calling thread is
// inside a CUDA kern::DeviceScope, its CUDA twin (kernels/cuda/llama_kernels.h, through the
// module's table kernels/cuda_llama_table.h) on the scope's stream.
//
// Statistics (rstd, lse, scratch) and the RoPE tables are float*, on the scope's device.
// On CUDA: fp32 storage, and bf16 storage with bf16 or fp32 parameter gradients; fp16 storage
// inside a CUDA scope is a ds::Error (invalid usage) naming the kernel (no CUDA fp16 twins yet).
// The CUDA attention needs no scratch (pass what the model's spec sized: 0 floats on CUDA).
// An unsupported dtype combination is a ds::Error (invalid usage) naming the kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/error.h"
#include "core/typed_ptr.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cuda_llama_table.h"
#include "kernels/dispatch.h"
#include "kernels/typed_call.h"

namespace ds::rt::kern::llama {

namespace detail {

[[noreturn]] inline void no_cuda(const char* what, DType s, DType g) {
  throw invalid_usage(
      "{}: no CUDA kernel for {} storage with {} gradients: the Llama kernels run on CUDA at fp32 "
      "or bf16 storage (train in fp32 or bf16 on CUDA, or fp16 on the CPU)",
      what, dtype_name(s), dtype_name(g));
}
template <typename S>
inline constexpr bool kIsF32 = std::is_same_v<S, float>;
template <typename S>
inline constexpr bool kIsBf16 = std::is_same_v<S, bf16>;
// bf16 storage as the module's uint16_t bits.
inline uint16_t* bits(bf16* p) {
  return reinterpret_cast<uint16_t*>(p);
}
inline const uint16_t* bits(const bf16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}
inline const LlamaCudaKernels& cu() {
  return llama_cuda_kernels();
}

}  // namespace detail

// ---- typed kernels: the CPU template, or inside a CUDA scope the module's twin ----------------

template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C,
                     float eps) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().rmsnorm_forward(out, rstd, inp, weight, N, C, eps, cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().rmsnorm_forward_bf16(bits(out), rstd, bits(inp), bits(weight), N, C, eps,
                                       cuda_stream());
    } else {
      no_cuda("rmsnorm_forward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}
template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                      const float* rstd, int64_t N, int C) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S> && kIsF32<G>) {
      return cu().rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, cuda_stream());
    } else if constexpr (kIsBf16<S> && kIsF32<G>) {
      return cu().rmsnorm_backward_bf16(bits(dinp), dweight, bits(dout), bits(inp), bits(weight),
                                        rstd, N, C, cuda_stream());
    } else if constexpr (kIsBf16<S> && kIsBf16<G>) {
      return cu().rmsnorm_backward_bf16_gbf16(bits(dinp), bits(dweight), bits(dout), bits(inp),
                                              bits(weight), rstd, N, C, cuda_stream());
    } else {
      no_cuda("rmsnorm_backward", dtype_of<S>, dtype_of<G>);
    }
  }
  cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}
template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
                  int stride, int offset) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().rope_forward(x, cos, sin, B, T, heads, hd, stride, offset, cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().rope_forward_bf16(bits(x), cos, sin, B, T, heads, hd, stride, offset,
                                    cuda_stream());
    } else {
      no_cuda("rope_forward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::rope_forward(x, cos, sin, B, T, heads, hd, stride, offset);
}
template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                   int stride, int offset) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().rope_backward(dx, cos, sin, B, T, heads, hd, stride, offset, cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().rope_backward_bf16(bits(dx), cos, sin, B, T, heads, hd, stride, offset,
                                     cuda_stream());
    } else {
      no_cuda("rope_backward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::rope_backward(dx, cos, sin, B, T, heads, hd, stride, offset);
}
template <typename S>
void swiglu_forward(S* out, const S* gu, int64_t N, int I) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().swiglu_forward(out, gu, N, I, cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().swiglu_forward_bf16(bits(out), bits(gu), N, I, cuda_stream());
    } else {
      no_cuda("swiglu_forward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::swiglu_forward(out, gu, N, I);
}
template <typename S>
void swiglu_backward(S* dgu, const S* dout, const S* gu, int64_t N, int I) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().swiglu_backward(dgu, dout, gu, N, I, cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().swiglu_backward_bf16(bits(dgu), bits(dout), bits(gu), N, I, cuda_stream());
    } else {
      no_cuda("swiglu_backward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::swiglu_backward(dgu, dout, gu, N, I);
}
template <typename S>
void attention_gqa_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int NH,
                           int KV, int hd) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().attention_gqa_forward(out, lse, qkv, scratch, B, T, NH, KV, hd, cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().attention_gqa_forward_bf16(bits(out), lse, bits(qkv), scratch, B, T, NH, KV, hd,
                                             cuda_stream());
    } else {
      no_cuda("attention_gqa_forward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::attention_gqa_forward(out, lse, qkv, scratch, B, T, NH, KV, hd);
}
template <typename S>
void attention_gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                            float* scratch, int B, int T, int NH, int KV, int hd) {
  using namespace detail;
  if (on_cuda()) {
    if constexpr (kIsF32<S>) {
      return cu().attention_gqa_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KV, hd,
                                         cuda_stream());
    } else if constexpr (kIsBf16<S>) {
      return cu().attention_gqa_backward_bf16(bits(dqkv), bits(dout), bits(qkv), bits(out), lse,
                                              scratch, B, T, NH, KV, hd, cuda_stream());
    } else {
      no_cuda("attention_gqa_backward", dtype_of<S>, dtype_of<S>);
    }
  }
  cpu::attention_gqa_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KV, hd);
}

// ---- TypedPtr buffers ------------------------------------------------------------------------

inline void rmsnorm_forward(TypedPtr out, float* rstd, TypedPtr inp, TypedPtr weight, int64_t N,
                            int C, float eps) {
  DS_TYPED_CALL(
      "rmsnorm_forward", out.dtype, out.dtype,
      llama::rmsnorm_forward(DS_AS(S, out), rstd, DS_AS(S, inp), DS_AS(S, weight), N, C, eps));
}
inline void rmsnorm_backward(TypedPtr dinp, TypedPtr dweight, TypedPtr dout, TypedPtr inp,
                             TypedPtr weight, const float* rstd, int64_t N, int C) {
  DS_TYPED_CALL("rmsnorm_backward", dinp.dtype, dweight.dtype,
                llama::rmsnorm_backward(DS_AS(S, dinp), DS_AS(G, dweight), DS_AS(S, dout),
                                        DS_AS(S, inp), DS_AS(S, weight), rstd, N, C));
}
inline void rope_forward(TypedPtr x, const float* cos, const float* sin, int B, int T, int heads,
                         int hd, int stride, int offset) {
  DS_TYPED_CALL("rope_forward", x.dtype, x.dtype,
                llama::rope_forward(DS_AS(S, x), cos, sin, B, T, heads, hd, stride, offset));
}
inline void rope_backward(TypedPtr dx, const float* cos, const float* sin, int B, int T, int heads,
                          int hd, int stride, int offset) {
  DS_TYPED_CALL("rope_backward", dx.dtype, dx.dtype,
                llama::rope_backward(DS_AS(S, dx), cos, sin, B, T, heads, hd, stride, offset));
}
inline void swiglu_forward(TypedPtr out, TypedPtr gu, int64_t N, int I) {
  DS_TYPED_CALL("swiglu_forward", out.dtype, out.dtype,
                llama::swiglu_forward(DS_AS(S, out), DS_AS(S, gu), N, I));
}
inline void swiglu_backward(TypedPtr dgu, TypedPtr dout, TypedPtr gu, int64_t N, int I) {
  DS_TYPED_CALL("swiglu_backward", dgu.dtype, dgu.dtype,
                llama::swiglu_backward(DS_AS(S, dgu), DS_AS(S, dout), DS_AS(S, gu), N, I));
}
inline void attention_gqa_forward(TypedPtr out, float* lse, TypedPtr qkv, float* scratch, int B,
                                  int T, int NH, int KV, int hd) {
  DS_TYPED_CALL(
      "attention_gqa_forward", out.dtype, out.dtype,
      llama::attention_gqa_forward(DS_AS(S, out), lse, DS_AS(S, qkv), scratch, B, T, NH, KV, hd));
}
inline void attention_gqa_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out,
                                   const float* lse, float* scratch, int B, int T, int NH, int KV,
                                   int hd) {
  DS_TYPED_CALL("attention_gqa_backward", dqkv.dtype, dqkv.dtype,
                llama::attention_gqa_backward(DS_AS(S, dqkv), DS_AS(S, dout), DS_AS(S, qkv),
                                              DS_AS(S, out), lse, scratch, B, T, NH, KV, hd));
}

}  // namespace ds::rt::kern::llama
