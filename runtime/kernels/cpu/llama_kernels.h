// CPU kernels of the Llama model (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention),
// in the conventions of kernels.h: outputs first, then inputs, then shapes; parameter gradients
// ACCUMULATE, input gradients as each function says; OpenMP inside; no allocation.
// Element types as kernels.h says (its "element types" section): S the storage type (float, bf16,
// f16), G the parameter-gradient type (S or float); fp32 arithmetic, each output rounded once;
// statistics (RMSNorm's rstd, attention's lse and scratch) and the RoPE cos/sin tables are fp32
// whatever S. Instantiated for DS_FOR_EACH_STORAGE / DS_FOR_EACH_STORAGE_GRAD; dispatched from
// TypedPtr buffers by kernels/llama_typed.h.
//
// Legend: N = rows (B*T), C = channels, NH = query heads, KV = kv heads (NH % KV == 0), hd = head
// size, I = the SwiGLU width, T = sequence length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace ds::rt::cpu {

// ---- RMSNorm (Hugging Face's LlamaRMSNorm) -------------------------------------------------
// out (N,C) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps), computed in fp32.
template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C, float eps);
// dinp ACCUMULATES (+=, the residual stream's gradient flows through it), dweight accumulates.
template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight, const float* rstd,
                      int64_t N, int C);

// ---- rotary position embeddings (rotate_half convention) -------------------------------------
// Tables for positions [0, T): cos/sin (T, hd/2), angle t * theta^(-2i/hd) (HF's inv_freq); fp32
// whatever the storage type.
void rope_tables(float* cos, float* sin, int T, int hd, double theta);
// In place on `heads` consecutive heads of hd values starting `offset` elements into each row of
// x (rows of `stride` elements; row b*T + t has position t): for i < hd/2,
//   x[i], x[i + hd/2] <- x[i] cos - x[i + hd/2] sin, x[i + hd/2] cos + x[i] sin.
template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride, int offset);
// The transpose rotation, in place on the gradient: d(before) from d(after).
template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                   int offset);

// ---- SwiGLU: silu(gate) * up ---------------------------------------------------------------
// gu (N, 2I): row n holds gate[0, I) then up[0, I) (one matmul with gate_proj and up_proj
// stacked); out (N, I) = silu(gate) * up.
template <typename S>
void swiglu_forward(S* out, const S* gu, int64_t N, int I);
// dgu (N, 2I) overwritten from dout (N, I).
template <typename S>
void swiglu_backward(S* dgu, const S* dout, const S* gu, int64_t N, int I);

// ---- causal grouped-query attention ---------------------------------------------------------
// qkv (B,T,(NH+2KV)hd): each row is q heads [0, NH), then k heads, then v heads; query head h
// reads kv head h / (NH/KV), in place (k and v are never expanded). out (B,T,NH hd);
// lse (B,NH,T). scratch: attention_scratch_floats(T, hd, sizeof(S)) (kernels.h): per thread
// 2 x T x T, and with 16-bit S also 8 x T x hd (the fp32 copies of the heads it works on).
// Forward parallelises over (b, h); backward over (b, kv head), each task walking its group of
// query heads so that dk and dv of a kv head are summed by one thread in a fixed order (in fp32,
// rounded once at 16 bits).
template <typename S>
void attention_gqa_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int NH, int KV, int hd);
// dqkv (B,T,(NH+2KV)hd) overwritten.
template <typename S>
void attention_gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, float* scratch,
                            int B, int T, int NH, int KV, int hd);

}  // namespace ds::rt::cpu
