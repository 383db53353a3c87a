// The kernels over TypedPtr buffers (core/typed_ptr.h): what the model and the parallel engines
// call when the storage type is chosen at run time. Each function checks that its buffers'
// dtypes form a supported combination, switches once on them and calls the kern:: template
// (kernels/dispatch.h) with typed pointers; the CPU/CUDA routing is kern::'s.
//
// Storage types (core/dtype.h): parameters, activations and their gradients share the storage
// type S; parameter gradients have the gradient type G, which is S or fp32 (a model built with
// grad_accum_dtype fp32 under bf16). Statistics (LayerNorm mean/rstd, attention lse and scratch,
// losses, the vocab-parallel loss statistics) are always fp32 and passed as float*.
// An unsupported combination is a ds::Error (invalid usage) naming the kernel and the dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/error.h"
#include "core/typed_ptr.h"
#include "kernels/dispatch.h"
#include "kernels/typed_call.h"

namespace ds::rt::kern::typed {

// DS_TYPED_CALL and DS_AS: kernels/typed_call.h.

inline void encoder_forward(TypedPtr out, const int32_t* inp, TypedPtr wte, TypedPtr wpe, int B, int T, int C) {
  DS_TYPED_CALL("encoder_forward", out.dtype, out.dtype,
                kern::encoder_forward(DS_AS(S, out), inp, DS_AS(S, wte), DS_AS(S, wpe), B, T, C));
}
inline void encoder_backward(TypedPtr dwte, TypedPtr dwpe, TypedPtr dout, const int32_t* inp, int B, int T, int C) {
  const DType g = dwpe ? dwpe.dtype : dwte.dtype;
  DS_TYPED_CALL("encoder_backward", dout.dtype, g,
                kern::encoder_backward(DS_AS(G, dwte), DS_AS(G, dwpe), DS_AS(S, dout), inp, B, T, C));
}
inline void encoder_forward_vocab(TypedPtr out, const int32_t* inp, TypedPtr wte, int B, int T, int C, int v0,
                                  int Vl) {
  DS_TYPED_CALL("encoder_forward_vocab", out.dtype, out.dtype,
                kern::encoder_forward_vocab(DS_AS(S, out), inp, DS_AS(S, wte), B, T, C, v0, Vl));
}
inline void encoder_backward_vocab(TypedPtr dwte, TypedPtr dout, const int32_t* inp, int B, int T, int C, int v0,
                                   int Vl) {
  DS_TYPED_CALL("encoder_backward_vocab", dout.dtype, dwte.dtype,
                kern::encoder_backward_vocab(DS_AS(G, dwte), DS_AS(S, dout), inp, B, T, C, v0, Vl));
}
inline void add_position(TypedPtr out, TypedPtr wpe, int B, int T, int C) {
  DS_TYPED_CALL("add_position", out.dtype, out.dtype, kern::add_position(DS_AS(S, out), DS_AS(S, wpe), B, T, C));
}
inline void layernorm_forward(TypedPtr out, float* mean, float* rstd, TypedPtr inp, TypedPtr weight, TypedPtr bias,
                              int B, int T, int C) {
  DS_TYPED_CALL("layernorm_forward", out.dtype, out.dtype,
                kern::layernorm_forward(DS_AS(S, out), mean, rstd, DS_AS(S, inp), DS_AS(S, weight), DS_AS(S, bias),
                                        B, T, C));
}
inline void layernorm_backward(TypedPtr dinp, TypedPtr dweight, TypedPtr dbias, TypedPtr dout, TypedPtr inp,
                               TypedPtr weight, const float* mean, const float* rstd, int B, int T, int C) {
  DS_TYPED_CALL("layernorm_backward", dinp.dtype, dweight.dtype,
                kern::layernorm_backward(DS_AS(S, dinp), DS_AS(G, dweight), DS_AS(G, dbias), DS_AS(S, dout),
                                         DS_AS(S, inp), DS_AS(S, weight), mean, rstd, B, T, C));
}
inline void matmul_forward(TypedPtr out, TypedPtr inp, TypedPtr weight, TypedPtr bias, int B, int T, int C, int OC) {
  DS_TYPED_CALL("matmul_forward", out.dtype, out.dtype,
                kern::matmul_forward(DS_AS(S, out), DS_AS(S, inp), DS_AS(S, weight), DS_AS(S, bias), B, T, C, OC));
}
inline void matmul_backward(TypedPtr dinp, TypedPtr dweight, TypedPtr dbias, TypedPtr dout, TypedPtr inp,
                            TypedPtr weight, int B, int T, int C, int OC) {
  DS_TYPED_CALL("matmul_backward", dout.dtype, dweight.dtype,
                kern::matmul_backward(DS_AS(S, dinp), DS_AS(G, dweight), DS_AS(G, dbias), DS_AS(S, dout),
                                      DS_AS(S, inp), DS_AS(S, weight), B, T, C, OC));
}
inline void add_bias(TypedPtr out, TypedPtr bias, int N, int OC) {
  DS_TYPED_CALL("add_bias", out.dtype, out.dtype, kern::add_bias(DS_AS(S, out), DS_AS(S, bias), N, OC));
}
inline void attention_forward(TypedPtr out, float* lse, TypedPtr qkv, float* scratch, int B, int T, int C, int NH) {
  DS_TYPED_CALL("attention_forward", out.dtype, out.dtype,
                kern::attention_forward(DS_AS(S, out), lse, DS_AS(S, qkv), scratch, B, T, C, NH));
}
inline void attention_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out, const float* lse,
                               float* scratch, int B, int T, int C, int NH) {
  DS_TYPED_CALL("attention_backward", dqkv.dtype, dqkv.dtype,
                kern::attention_backward(DS_AS(S, dqkv), DS_AS(S, dout), DS_AS(S, qkv), DS_AS(S, out), lse, scratch,
                                         B, T, C, NH));
}
inline void gelu_forward(TypedPtr out, TypedPtr inp, int64_t N) {
  DS_TYPED_CALL("gelu_forward", out.dtype, out.dtype, kern::gelu_forward(DS_AS(S, out), DS_AS(S, inp), N));
}
inline void gelu_backward(TypedPtr dinp, TypedPtr inp, TypedPtr dout, int64_t N) {
  DS_TYPED_CALL("gelu_backward", dinp.dtype, dinp.dtype,
                kern::gelu_backward(DS_AS(S, dinp), DS_AS(S, inp), DS_AS(S, dout), N));
}
inline void residual_forward(TypedPtr out, TypedPtr inp1, TypedPtr inp2, int64_t N) {
  DS_TYPED_CALL("residual_forward", out.dtype, out.dtype,
                kern::residual_forward(DS_AS(S, out), DS_AS(S, inp1), DS_AS(S, inp2), N));
}
inline int64_t crossentropy_forward(float* losses, TypedPtr logits, const int32_t* targets, int N, int V, int Vp) {
  int64_t bad = 0;
  [&] {
    DS_TYPED_CALL("crossentropy_forward", logits.dtype, logits.dtype,
                  bad = kern::crossentropy_forward(losses, DS_AS(S, logits), targets, N, V, Vp));
  }();
  return bad;
}
inline int64_t crossentropy_softmax_backward(float* losses, TypedPtr logits_to_dlogits, const int32_t* targets,
                                             float dloss, int N, int V, int Vp) {
  int64_t bad = 0;
  [&] {
    DS_TYPED_CALL("crossentropy_softmax_backward", logits_to_dlogits.dtype, logits_to_dlogits.dtype,
                  bad = kern::crossentropy_softmax_backward(losses, DS_AS(S, logits_to_dlogits), targets, dloss, N,
                                                            V, Vp));
  }();
  return bad;
}
inline void vocab_ce_max(float* mx, TypedPtr logits, int N, int Vl, int v0, int V) {
  DS_TYPED_CALL("vocab_ce_max", logits.dtype, logits.dtype, kern::vocab_ce_max(mx, DS_AS(S, logits), N, Vl, v0, V));
}
inline void vocab_ce_sums(float* sumexp, float* tlogit, TypedPtr logits, const float* mx, const int32_t* targets,
                          int N, int Vl, int v0, int V) {
  DS_TYPED_CALL("vocab_ce_sums", logits.dtype, logits.dtype,
                kern::vocab_ce_sums(sumexp, tlogit, DS_AS(S, logits), mx, targets, N, Vl, v0, V));
}
inline void vocab_ce_finish(float* losses, TypedPtr logits_to_dlogits, const float* mx, const float* sumexp,
                            const float* tlogit, const int32_t* targets, float dloss, int N, int Vl, int v0, int V) {
  const DType t = logits_to_dlogits ? logits_to_dlogits.dtype : DType::kF32;
  DS_TYPED_CALL("vocab_ce_finish", t, t,
                kern::vocab_ce_finish(losses, DS_AS(S, logits_to_dlogits), mx, sumexp, tlogit, targets, dloss, N,
                                      Vl, v0, V));
}
// dst += src, both of dst's type (gradient accumulation of the parallel engines).
inline void add_in_place(TypedPtr dst, TypedPtr src, int64_t N) {
  DS_TYPED_CALL("add_in_place", dst.dtype, dst.dtype, kern::add_in_place(DS_AS(S, dst), DS_AS(S, src), N));
}

// Byte moves of typed buffers (no conversion: both sides have the same dtype).
inline void fill_zero(TypedPtr p, int64_t n) { kern::fill_zero(p.data, p.bytes(n)); }
inline void copy(TypedPtr dst, TypedPtr src, int64_t n) {
  if (dst.dtype != src.dtype) {
    throw invalid_usage("kern::typed::copy of {} into {}: use a conversion", dtype_name(src.dtype),
                        dtype_name(dst.dtype));
  }
  kern::copy(dst.data, src.data, dst.bytes(n));
}

// dst (n elements of `dst`'s type) = src (n elements of `src`'s type) on the scope's device,
// rounded once (a copy when the types agree).
inline void convert(TypedPtr dst, TypedPtr src, int64_t n) {
  auto run = [&]<typename D>(D* d) {
    if (src.dtype == DType::kF32) return kern::convert(d, static_cast<const float*>(src.data), n);
    if (src.dtype == DType::kBF16) return kern::convert(d, static_cast<const bf16*>(src.data), n);
    return kern::convert(d, static_cast<const f16*>(src.data), n);
  };
  if (dst.dtype == DType::kF32) return run(static_cast<float*>(dst.data));
  if (dst.dtype == DType::kBF16) return run(static_cast<bf16*>(dst.data));
  run(static_cast<f16*>(dst.data));
}

// dst (n elements of its type, on the scope's device) from n fp32 values in host memory, rounded to
// the storage type; and the reverse. fp32 is a plain copy; 16-bit converts on the host (through a
// temporary host vector) and copies the 2-byte values.
inline void from_host_f32(TypedPtr dst, const float* host, int64_t n) {
  if (dst.dtype == DType::kF32) return kern::copy_from_host(dst.data, host, static_cast<size_t>(n) * sizeof(float));
  std::vector<uint16_t> tmp(static_cast<size_t>(n));
  if (dst.dtype == DType::kBF16) cpu::convert(reinterpret_cast<bf16*>(tmp.data()), host, n);
  if (dst.dtype == DType::kF16) cpu::convert(reinterpret_cast<f16*>(tmp.data()), host, n);
  kern::copy_from_host(dst.data, tmp.data(), dst.bytes(n));
}
inline void to_host_f32(float* host, TypedPtr src, int64_t n) {
  if (src.dtype == DType::kF32) return kern::copy_to_host(host, src.data, static_cast<size_t>(n) * sizeof(float));
  std::vector<uint16_t> tmp(static_cast<size_t>(n));
  kern::copy_to_host(tmp.data(), src.data, src.bytes(n));
  if (src.dtype == DType::kBF16) cpu::convert(host, reinterpret_cast<const bf16*>(tmp.data()), n);
  if (src.dtype == DType::kF16) cpu::convert(host, reinterpret_cast<const f16*>(tmp.data()), n);
}

// ---- the optimizer's passes (kernels/adamw_step.h) ----------------------------------------------

// Sum of squares of n gradients (double, on the host), read in their type.
inline double sum_of_squares(TypedPtr x, int64_t n) {
  if (x.dtype == DType::kF32) return kern::sum_of_squares(static_cast<const float*>(x.data), n);
  if (x.dtype == DType::kBF16) return kern::sum_of_squares(static_cast<const bf16*>(x.data), n);
  return kern::sum_of_squares(static_cast<const f16*>(x.data), n);
}
// AdamW over the partition [begin, begin + count) of the fp32 `master` weights with the gradients
// `grads` (the gradient type); when `params_out` is not null and not the master itself, the
// updated weights are also written there in its storage type (rounded once, in the same pass).
inline void adamw_update_partition(const AdamWStep& s, float* master, TypedPtr grads, float* exp_avg,
                                   float* exp_avg_sq, int64_t begin, int64_t count,
                                   std::span<const DecayRange> decay, TypedPtr params_out) {
  const TypedPtr out = params_out && params_out.data != master ? params_out : TypedPtr();
  if (grads.dtype == DType::kF32 && (!out || out.dtype == DType::kF32)) {
    kern::adamw_update_partition(s, master, grads.f32(), exp_avg, exp_avg_sq, begin, count, decay);
    if (out) kern::copy(out.data, master, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const DType od = out ? out.dtype : grads.dtype;
  DS_TYPED_CALL("adamw_update_partition", od, grads.dtype,
                kern::adamw_update_partition_mixed(s, master, DS_AS(G, grads), exp_avg, exp_avg_sq, begin, count,
                                                   decay, DS_AS(S, out)));
}
// dst (n elements of its type) = the fp32 values src on the same device, rounded.
inline void from_f32(TypedPtr dst, const float* src, int64_t n) { convert(dst, TypedPtr(src), n); }

// RMSNorm, RoPE, SwiGLU and grouped-query attention (the ops of the RMSNorm/RoPE/SwiGLU families).

inline void rmsnorm_forward(TypedPtr out, float* rstd, TypedPtr inp, TypedPtr weight, int64_t N,
                            int C, float eps) {
  DS_TYPED_CALL(
      "rmsnorm_forward", out.dtype, out.dtype,
      kern::rmsnorm_forward(DS_AS(S, out), rstd, DS_AS(S, inp), DS_AS(S, weight), N, C, eps));
}
inline void rmsnorm_backward(TypedPtr dinp, TypedPtr dweight, TypedPtr dout, TypedPtr inp,
                             TypedPtr weight, const float* rstd, int64_t N, int C) {
  DS_TYPED_CALL("rmsnorm_backward", dinp.dtype, dweight.dtype,
                kern::rmsnorm_backward(DS_AS(S, dinp), DS_AS(G, dweight), DS_AS(S, dout),
                                        DS_AS(S, inp), DS_AS(S, weight), rstd, N, C));
}
inline void rope_forward(TypedPtr x, const float* cos, const float* sin, int B, int T, int heads,
                         int hd, int stride, int offset) {
  DS_TYPED_CALL("rope_forward", x.dtype, x.dtype,
                kern::rope_forward(DS_AS(S, x), cos, sin, B, T, heads, hd, stride, offset));
}
inline void rope_backward(TypedPtr dx, const float* cos, const float* sin, int B, int T, int heads,
                          int hd, int stride, int offset) {
  DS_TYPED_CALL("rope_backward", dx.dtype, dx.dtype,
                kern::rope_backward(DS_AS(S, dx), cos, sin, B, T, heads, hd, stride, offset));
}
inline void swiglu_forward(TypedPtr out, TypedPtr gu, int64_t N, int I) {
  DS_TYPED_CALL("swiglu_forward", out.dtype, out.dtype,
                kern::swiglu_forward(DS_AS(S, out), DS_AS(S, gu), N, I));
}
inline void swiglu_backward(TypedPtr dgu, TypedPtr dout, TypedPtr gu, int64_t N, int I) {
  DS_TYPED_CALL("swiglu_backward", dgu.dtype, dgu.dtype,
                kern::swiglu_backward(DS_AS(S, dgu), DS_AS(S, dout), DS_AS(S, gu), N, I));
}
inline void attention_gqa_forward(TypedPtr out, float* lse, TypedPtr qkv, float* scratch, int B,
                                  int T, int NH, int KV, int hd) {
  DS_TYPED_CALL(
      "attention_gqa_forward", out.dtype, out.dtype,
      kern::attention_gqa_forward(DS_AS(S, out), lse, DS_AS(S, qkv), scratch, B, T, NH, KV, hd));
}
inline void attention_gqa_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out,
                                   const float* lse, float* scratch, int B, int T, int NH, int KV,
                                   int hd) {
  DS_TYPED_CALL("attention_gqa_backward", dqkv.dtype, dqkv.dtype,
                kern::attention_gqa_backward(DS_AS(S, dqkv), DS_AS(S, dout), DS_AS(S, qkv),
                                              DS_AS(S, out), lse, scratch, B, T, NH, KV, hd));
}

}  // namespace ds::rt::kern::typed
